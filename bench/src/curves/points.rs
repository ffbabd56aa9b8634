//! One point of a cost curve, measured in a fresh child process of the
//! benchmark (`bench --curve-point <held|waiters|local-waiters|keys> <n>
//! <url>`), so its memory and CPU figures are its own and no earlier point's.
//! The child prints one JSON object.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::{StreamExt, TryStreamExt};
use lock_runtime::LockClient;
use redis::aio::MultiplexedConnection;
use serde_json::{Value, json};

use super::info;
use crate::held::take_many;
use crate::report::{cpu_seconds, percentile, rss_kib};
use crate::rows::lib_pair;

/// Every curve's keys: one prefix, the server is flushed between points.
pub(crate) const PREFIX: &str = "curve:";

/// Held locks: their lease (renewed every third of it).
const HELD_TTL: Duration = Duration::from_secs(3);
/// Held locks: from the last lock taken to the window (renewals settle into
/// their rhythm), and the window.
const HELD_SETTLE: Duration = Duration::from_millis(1500);
const HELD_WINDOW: Duration = Duration::from_secs(3);

/// Waiters: clients they are spread over (round robin), and how long each
/// is willing to wait.
const WAITER_CLIENTS: usize = 4;
const WAITER_WAIT: Duration = Duration::from_secs(600);
/// The longest the waiters may take to queue.
const QUEUE_WITHIN: Duration = Duration::from_secs(180);

/// Longer than the default (1 s), for bursts of queueing waiters.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);

/// Distinct keys: acquire + release pairs in flight at once.
const KEY_TASKS: usize = 256;

/// Runs one point; the JSON it measured.
pub(crate) fn run(kind: &str, n: usize, url: &str) -> Result<Value, String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async {
        match kind {
            "held" => held(n, url).await,
            "waiters" => waiters(n, url, false).await,
            "local-waiters" => waiters(n, url, true).await,
            "keys" => keys(n, url).await,
            _ => Err(format!("no curve {kind:?}")),
        }
    })
}

async fn client(url: &str, local_handover: bool) -> Result<LockClient, String> {
    let client = LockClient::builder()
        .redis(url)
        .key_prefix(PREFIX)
        .local_handover(local_handover)
        // 10,000 waiters arriving at once queue one script call each: on a
        // loaded machine the last replies can come later than the default
        // 1 s.
        .response_timeout(RESPONSE_TIMEOUT)
        .build()
        .await
        .map_err(|e| format!("client: {e}"))?;
    // Connections opened and scripts loaded before anything is counted.
    lib_pair(&client, "warm").await?;
    Ok(client)
}

/// The benchmark's own connection (`INFO`, `LLEN`): as patient as the
/// clients, since it asks while thousands of waiters queue.
async fn conn(url: &str) -> Result<MultiplexedConnection, String> {
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(Some(RESPONSE_TIMEOUT));
    redis::Client::open(url)
        .map_err(|e| e.to_string())?
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(|e| format!("INFO connection: {e}"))
}

fn rss() -> Result<f64, String> {
    rss_kib().ok_or_else(|| "no VmRSS in /proc/self/status".into())
}

fn cpu() -> Result<f64, String> {
    cpu_seconds().ok_or_else(|| "no CPU times in /proc/self/stat".into())
}

/// `n` locks held on one client under the watchdog: memory on both sides,
/// and what renewing them costs per second.
async fn held(n: usize, url: &str) -> Result<Value, String> {
    let client = client(url, true).await?;
    let mut conn = conn(url).await?;
    let (rss_0, mem_0) = (rss()?, info::used_memory(&mut conn).await?);
    let t = Instant::now();
    let guards = take_many(&client, "held", n, HELD_TTL).await?;
    let take_s = t.elapsed().as_secs_f64();
    tokio::time::sleep(HELD_SETTLE).await;
    let calls_0 = info::script_calls(&mut conn).await?;
    let redis_cpu_0 = info::cpu_seconds(&mut conn).await?;
    let cpu_0 = cpu()?;
    let t = Instant::now();
    tokio::time::sleep(HELD_WINDOW).await;
    let window = t.elapsed().as_secs_f64();
    let cpu_1 = cpu()?;
    let redis_cpu_1 = info::cpu_seconds(&mut conn).await?;
    let calls_1 = info::script_calls(&mut conn).await?;
    let (rss_1, mem_1) = (rss()?, info::used_memory(&mut conn).await?);
    let lost = guards.iter().filter(|g| g.is_lost()).count();
    // A stall of the machine longer than what is left of a lease loses
    // the locks: counted and reported, not fatal to the run.
    let released = release_all(guards).await;
    if let Some(e) = &released.first_error {
        eprintln!(
            "held {n}: {} releases failed ({lost} guards lost before), the first: {e}",
            released.failed
        );
    }
    Ok(json!({
        "n": n,
        "take_s": take_s,
        "client_rss_kib": rss_1,
        "client_rss_delta_kib": rss_1 - rss_0,
        "client_cpu_percent": (cpu_1 - cpu_0) / window * 100.0,
        "renew_calls_per_s": (calls_1 - calls_0) / window,
        "redis_cpu_percent": (redis_cpu_1 - redis_cpu_0) / window * 100.0,
        "redis_memory_delta_kib": (mem_1 - mem_0) / 1024.0,
        "lost": lost,
        "releases_failed": released.failed,
    }))
}

/// How releasing many guards went.
struct Released {
    failed: usize,
    first_error: Option<String>,
}

/// Releases every guard, 64 at a time.
async fn release_all(guards: Vec<lock_runtime::LockGuard>) -> Released {
    let results: Vec<_> = futures_util::stream::iter(guards)
        .map(lock_runtime::LockGuard::release)
        .buffer_unordered(64)
        .collect()
        .await;
    let mut errors = results.into_iter().filter_map(Result::err);
    let first_error = errors.next().map(|e| test_support::error_chain(&e));
    Released {
        failed: errors.count() + usize::from(first_error.is_some()),
        first_error,
    }
}

/// The hand-over chain: when the current holder called `release()`, and
/// every wake latency (release to the next holder's grant) so far.
#[derive(Debug)]
struct Chain {
    released_at: Instant,
    latencies_us: Vec<f64>,
    last_grant: Instant,
}

/// `n` tasks wait for one key another client holds, spread over
/// `WAITER_CLIENTS` clients; then the holder lets go and each waiter,
/// once granted, releases at once. With `local_handover == false` every
/// waiter queues on the server; with `true` (the default) the tasks of a
/// client form a line in-process and one of them queues there.
async fn waiters(n: usize, url: &str, local_handover: bool) -> Result<Value, String> {
    let holder = client(url, true).await?;
    let mut clients = Vec::with_capacity(WAITER_CLIENTS);
    for _ in 0..WAITER_CLIENTS {
        clients.push(client(url, local_handover).await?);
    }
    let mut conn = conn(url).await?;
    let (rss_0, mem_0) = (rss()?, info::used_memory(&mut conn).await?);
    let key = "hot";
    let queue = format!("{PREFIX}Q{{{key}}}");
    let guard = holder
        .lock(key)
        .ttl(Duration::from_secs(60))
        .acquire()
        .await
        .map_err(|e| format!("holder: {e}"))?;
    let chain = Arc::new(Mutex::new(Chain {
        released_at: Instant::now(),
        latencies_us: Vec::with_capacity(n),
        last_grant: Instant::now(),
    }));
    let started = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let request = clients[i % WAITER_CLIENTS]
            .lock(key)
            .ttl(Duration::from_secs(30))
            .wait(WAITER_WAIT);
        let (chain, started) = (chain.clone(), started.clone());
        tasks.spawn(async move {
            started.fetch_add(1, Ordering::Relaxed);
            let guard = request
                .acquire()
                .await
                .map_err(|e| format!("waiter: {}", test_support::error_chain(&e)))?;
            let now = Instant::now();
            {
                let mut chain = chain.lock().unwrap_or_else(|e| e.into_inner());
                let latency = now.duration_since(chain.released_at);
                chain.latencies_us.push(latency.as_secs_f64() * 1e6);
                chain.last_grant = now;
                chain.released_at = Instant::now();
            }
            guard.release().await.map_err(|e| format!("release: {e}"))
        });
    }
    // Everybody in line: on the server, or (local lines) one per client
    // there and the rest in-process.
    let queued_on_server = if local_handover {
        WAITER_CLIENTS.min(n)
    } else {
        n
    };
    let deadline = Instant::now() + QUEUE_WITHIN;
    let queue_t = Instant::now();
    loop {
        let len: usize = redis::cmd("LLEN")
            .arg(&queue)
            .query_async(&mut conn)
            .await
            .map_err(|e| format!("LLEN: {e}"))?;
        if len >= queued_on_server && started.load(Ordering::Relaxed) == n {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{len} of {queued_on_server} waiters queued on the server"
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if local_handover {
        // The tasks of a line wait in-process: let the last ones join it.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // A waiter that queued tries once more right after registering for
    // notices: the chain starts once those calls are over too (no script
    // call for 100 ms), so they are not counted as the chain's.
    let mut calls = info::script_calls(&mut conn).await?;
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = info::script_calls(&mut conn).await?;
        if now == calls {
            break;
        }
        if Instant::now() > deadline {
            return Err("the waiters' script calls never settled".into());
        }
        calls = now;
    }
    let queue_s = queue_t.elapsed().as_secs_f64();
    let (rss_1, mem_1) = (rss()?, info::used_memory(&mut conn).await?);
    // What the line itself takes on the server: the queue and its
    // deadlines (exact: every element sampled).
    let mut queue_bytes = 0.0;
    for name in [queue.clone(), format!("{PREFIX}D{{{key}}}")] {
        let bytes: Option<u64> = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(&name)
            .arg("SAMPLES")
            .arg(0)
            .query_async(&mut conn)
            .await
            .map_err(|e| format!("MEMORY USAGE: {e}"))?;
        queue_bytes += bytes.unwrap_or(0) as f64;
    }
    let redis_cpu_0 = info::cpu_seconds(&mut conn).await?;
    let script_0 = info::script_usec(&mut conn).await?;
    let calls_0 = info::script_calls(&mut conn).await?;
    let cpu_0 = cpu()?;
    let start = Instant::now();
    chain.lock().unwrap_or_else(|e| e.into_inner()).released_at = start;
    guard
        .release()
        .await
        .map_err(|e| format!("holder release: {e}"))?;
    while let Some(joined) = tasks.join_next().await {
        joined.map_err(|e| format!("waiter task: {e}"))??;
    }
    let cpu_1 = cpu()?;
    let redis_cpu_1 = info::cpu_seconds(&mut conn).await?;
    let script_1 = info::script_usec(&mut conn).await?;
    let calls_1 = info::script_calls(&mut conn).await?;
    let chain = chain.lock().unwrap_or_else(|e| e.into_inner());
    let span = chain.last_grant.duration_since(start).as_secs_f64();
    let lat = &chain.latencies_us;
    Ok(json!({
        "n": n,
        "local_handover": local_handover,
        "queue_s": queue_s,
        "grants_per_s": lat.len() as f64 / span,
        "wake_p50_us": percentile(lat, 50.0),
        "wake_p99_us": percentile(lat, 99.0),
        "wake_max_us": percentile(lat, 100.0),
        "client_rss_delta_kib": rss_1 - rss_0,
        "redis_memory_delta_kib": (mem_1 - mem_0) / 1024.0,
        "redis_queue_kib": queue_bytes / 1024.0,
        "client_cpu_us_per_grant": (cpu_1 - cpu_0) * 1e6 / n as f64,
        "redis_cpu_us_per_grant": (redis_cpu_1 - redis_cpu_0) * 1e6 / n as f64,
        "script_us_per_grant": (script_1 - script_0) / n as f64,
        "script_calls_per_grant": (calls_1 - calls_0) / n as f64,
    }))
}

/// `n` distinct keys, each taken and released once, `KEY_TASKS` at a time:
/// what stays behind in Redis and in the client.
async fn keys(n: usize, url: &str) -> Result<Value, String> {
    let client = client(url, true).await?;
    let mut conn = conn(url).await?;
    let (rss_0, mem_0) = (rss()?, info::used_memory(&mut conn).await?);
    let keys_0 = info::dbsize(&mut conn).await?;
    let t = Instant::now();
    futures_util::stream::iter(0..n)
        .map(Ok)
        .try_for_each_concurrent(KEY_TASKS, |i| {
            let client = &client;
            async move { lib_pair(client, &format!("k:{i}")).await }
        })
        .await?;
    let elapsed = t.elapsed().as_secs_f64();
    let (rss_1, mem_1) = (rss()?, info::used_memory(&mut conn).await?);
    let keys_1 = info::dbsize(&mut conn).await?;
    // Lock keys left behind (none: every one was released).
    let mut locks = 0usize;
    let mut cursor = 0u64;
    loop {
        let (next, found): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{PREFIX}L*"))
            .arg("COUNT")
            .arg(10_000)
            .query_async(&mut conn)
            .await
            .map_err(|e| format!("SCAN: {e}"))?;
        locks += found.len();
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    // A key's slot counter is one of 16,384: how many distinct slots n
    // random-looking keys are expected to touch.
    let slots = 16384.0 * (1.0 - (-(n as f64) / 16384.0).exp());
    Ok(json!({
        "n": n,
        "seconds": elapsed,
        "pairs_per_s": n as f64 / elapsed,
        "redis_keys": keys_1,
        "redis_keys_before": keys_0,
        "lock_keys_left": locks,
        "expected_slots": slots,
        "redis_memory_delta_kib": (mem_1 - mem_0) / 1024.0,
        "client_rss_delta_kib": rss_1 - rss_0,
    }))
}
