//! The measurements. Each function measures one workload once (one
//! repetition) and returns raw figures; `bench.rs` turns them into rows.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use lock_runtime::{LockClient, LockGuard};
use tokio::task::JoinSet;

use super::raw::{Raw, value};
use super::report::{median, percentile};

/// Serial samples are taken in blocks of this many, alternating library and
/// raw blocks, so drifting noise hits both sides alike.
const BLOCK: usize = 100;

/// How long the single waiter gets to enqueue (or subscribe) and fall asleep
/// before the holder releases. Tens of round trips on loopback.
const WAITER_HEAD_START: Duration = Duration::from_millis(3);

/// How much of a 1 ms hold is spun rather than slept (thread sleeps overshoot
/// by the kernel's timer slack, 50 us by default, plus wake-up latency).
const SPIN_MARGIN: Duration = Duration::from_micros(150);

/// How long a contender waits in the hot-key rows before giving up (an error
/// in the benchmark: the runtime should never make anyone wait that long).
const GENEROUS_WAIT: Duration = Duration::from_secs(30);

/// Concurrency used to take and release thousands of locks.
const FAN_OUT: usize = 64;

/// Microseconds, as a float.
pub(crate) fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The start and end of a measuring window of `window`: the start 5 ms from
/// now, so that every task is spawned and waiting when it opens.
fn window_from_now(window: Duration) -> (Instant, Instant) {
    let start = Instant::now() + Duration::from_millis(5);
    (start, start + window)
}

/// Takes the free raw lock `key` with the value `v`; an error naming `what`
/// if it was held.
async fn take_free(raw: &mut Raw, key: &str, v: &str, what: &str) -> Result<(), String> {
    if raw.try_set(key, v).await? {
        Ok(())
    } else {
        Err(format!("{what}: the key was unexpectedly held"))
    }
}

fn sleep_until(t: Instant) -> tokio::time::Sleep {
    tokio::time::sleep_until(tokio::time::Instant::from_std(t))
}

/// One library acquire + release on a free key.
pub(crate) async fn lib_pair(client: &LockClient, key: &str) -> Result<(), String> {
    let guard = client
        .lock(key)
        .acquire()
        .await
        .map_err(|e| format!("acquire {key}: {e}"))?;
    guard
        .release()
        .await
        .map_err(|e| format!("release {key}: {e}"))
}

/// `n` library pairs on `client` and `n` raw pairs, in alternating blocks.
/// Returns the per-pair latencies in microseconds: (library, raw).
pub(crate) async fn serial(
    client: &LockClient,
    lib_key: &str,
    raw: &mut Raw,
    raw_key: &str,
    n: usize,
    rep: usize,
) -> Result<(Vec<f64>, Vec<f64>), String> {
    let mut lib = Vec::with_capacity(n);
    let mut base = Vec::with_capacity(n);
    let mut counter = 0u64;
    for block in 0..n.div_ceil(BLOCK) {
        let lib_first = (block + rep).is_multiple_of(2);
        for side in [lib_first, !lib_first] {
            for _ in 0..BLOCK {
                if side {
                    let t = Instant::now();
                    lib_pair(client, lib_key).await?;
                    lib.push(us(t.elapsed()));
                } else {
                    counter += 1;
                    let t = Instant::now();
                    let v = value(0, counter);
                    raw.pair(raw_key, &v).await?;
                    base.push(us(t.elapsed()));
                }
            }
        }
    }
    Ok((lib, base))
}

/// `tasks` tasks, each doing library pairs on its own key for `window`.
/// Returns pairs per second (only pairs completed inside the window count).
pub(crate) async fn parallel_lib(
    client: &LockClient,
    tasks: usize,
    window: Duration,
) -> Result<f64, String> {
    let (start, end) = window_from_now(window);
    let mut set = JoinSet::new();
    for i in 0..tasks {
        let client = client.clone();
        set.spawn(async move {
            let key = format!("par:{i}");
            sleep_until(start).await;
            let mut done = 0u64;
            loop {
                lib_pair(&client, &key).await?;
                if Instant::now() >= end {
                    return Ok::<u64, String>(done);
                }
                done += 1;
            }
        });
    }
    let total = join_sum(set).await?;
    Ok(total as f64 / window.as_secs_f64())
}

/// The raw counterpart of [`parallel_lib`]: `tasks` tasks sharing one
/// multiplexed connection.
pub(crate) async fn parallel_raw(raw: &Raw, tasks: usize, window: Duration) -> Result<f64, String> {
    let (start, end) = window_from_now(window);
    let mut set = JoinSet::new();
    for i in 0..tasks {
        let mut raw = raw.clone();
        set.spawn(async move {
            let key = raw.key(&format!("par:{i}"));
            sleep_until(start).await;
            let mut done = 0u64;
            loop {
                let v = value(i as u64, done);
                raw.pair(&key, &v).await?;
                if Instant::now() >= end {
                    return Ok::<u64, String>(done);
                }
                done += 1;
            }
        });
    }
    let total = join_sum(set).await?;
    Ok(total as f64 / window.as_secs_f64())
}

async fn join_sum(mut set: JoinSet<Result<u64, String>>) -> Result<u64, String> {
    let mut total = 0;
    while let Some(joined) = set.join_next().await {
        total += joined.map_err(|e| format!("task failed: {e}"))??;
    }
    Ok(total)
}

/// Holds a lock until `end`, without blocking the runtime: a blocking-pool
/// thread sleeps until `SPIN_MARGIN` before `end` and yields in a loop for the
/// rest. `tokio::time::sleep` cannot do this: its timer wheel has 1 ms slots
/// and rounds up, so a 1 ms sleep lasts 1-2 ms. Spinning on a runtime worker
/// would hold up one of the two cores the runtime and Redis share.
pub(crate) async fn hold_until(end: Instant) -> Result<(), String> {
    tokio::task::spawn_blocking(move || {
        if let Some(rest) = end.checked_duration_since(Instant::now())
            && rest > SPIN_MARGIN
        {
            std::thread::sleep(rest - SPIN_MARGIN);
        }
        while Instant::now() < end {
            std::thread::yield_now();
        }
    })
    .await
    .map_err(|e| format!("hold task failed: {e}"))
}

/// What a hot-key run measured.
#[derive(Debug, Default)]
pub(crate) struct Hot {
    /// Grants per task, counting acquisitions inside the window.
    pub(crate) grants: Vec<u64>,
    /// Wait of every acquisition that *started* inside the window, in us
    /// (those still waiting at the end are finished and counted too, so a
    /// starved task shows up in the tail).
    pub(crate) waits: Vec<f64>,
    /// How long each grant was actually held, in us.
    pub(crate) holds: Vec<f64>,
    pub(crate) window: Duration,
}

impl Hot {
    /// Most grants of one task over fewest (infinite if a task got none).
    pub(crate) fn fairness(&self) -> f64 {
        let max = self.grants.iter().copied().max().unwrap_or(0) as f64;
        let min = self.grants.iter().copied().min().unwrap_or(0) as f64;
        if min == 0.0 { f64::INFINITY } else { max / min }
    }

    /// Grants per second over several slices (the windows add up).
    pub(crate) fn rate_of(slices: &[Hot]) -> f64 {
        let grants: u64 = slices.iter().flat_map(|h| &h.grants).sum();
        let secs: f64 = slices.iter().map(|h| h.window.as_secs_f64()).sum();
        grants as f64 / secs
    }

    /// The worst slice's max/min grants per task: fairness is judged within
    /// one contention period, never averaged away across slices.
    pub(crate) fn fairness_of(slices: &[Hot]) -> f64 {
        slices.iter().map(Hot::fairness).fold(0.0, f64::max)
    }

    /// Every slice's waits (or holds), pooled.
    pub(crate) fn pooled(slices: &[Hot], pick: fn(&Hot) -> &Vec<f64>) -> Vec<f64> {
        slices
            .iter()
            .flat_map(|h| pick(h).iter().copied())
            .collect()
    }

    /// Fewest and most grants of one task in one slice.
    pub(crate) fn grant_range(slices: &[Hot]) -> (u64, u64) {
        let all = slices.iter().flat_map(|h| h.grants.iter().copied());
        (all.clone().min().unwrap_or(0), all.max().unwrap_or(0))
    }

    fn merge(&mut self, task: HotTask) {
        self.grants.push(task.grants);
        self.waits.extend(task.waits);
        self.holds.extend(task.holds);
    }
}

#[derive(Default)]
struct HotTask {
    grants: u64,
    waits: Vec<f64>,
    holds: Vec<f64>,
}

/// `tasks` tasks take the one lock `key` in a loop (waiting up to
/// `GENEROUS_WAIT`), hold it for `hold` and release it, for `window`.
pub(crate) async fn hot_lib(
    client: &LockClient,
    key: &str,
    tasks: usize,
    hold: Duration,
    window: Duration,
) -> Result<Hot, String> {
    let (start, end) = window_from_now(window);
    let mut set = JoinSet::new();
    for _ in 0..tasks {
        let client = client.clone();
        let key = key.to_string();
        set.spawn(async move {
            sleep_until(start).await;
            let mut me = HotTask::default();
            loop {
                let asked = Instant::now();
                if asked >= end {
                    return Ok::<HotTask, String>(me);
                }
                let guard = client
                    .lock(key.as_str())
                    .wait(GENEROUS_WAIT)
                    .acquire()
                    .await
                    .map_err(|e| format!("hot acquire: {e}"))?;
                let got = Instant::now();
                me.waits.push(us(got - asked));
                if !hold.is_zero() {
                    hold_until(got + hold).await?;
                }
                let held = got.elapsed();
                guard
                    .release()
                    .await
                    .map_err(|e| format!("hot release: {e}"))?;
                if got < end {
                    me.grants += 1;
                    me.holds.push(us(held));
                }
            }
        });
    }
    join_hot(set, window).await
}

/// The raw counterpart of [`hot_lib`] as people write it without a library:
/// `SET NX PX`, and on failure yield and retry at once (spin polling).
pub(crate) async fn hot_raw_spin(
    raw: &Raw,
    name: &str,
    tasks: usize,
    hold: Duration,
    window: Duration,
) -> Result<Hot, String> {
    let (start, end) = window_from_now(window);
    let key = raw.key(name);
    let mut set = JoinSet::new();
    for i in 0..tasks {
        let mut raw = raw.clone();
        let key = key.clone();
        set.spawn(async move {
            sleep_until(start).await;
            let mut me = HotTask::default();
            let mut n = 0u64;
            loop {
                let asked = Instant::now();
                if asked >= end {
                    return Ok::<HotTask, String>(me);
                }
                n += 1;
                let v = value(i as u64, n);
                while !raw.try_set(&key, &v).await? {
                    if asked.elapsed() > GENEROUS_WAIT {
                        return Err("raw spin: waited too long".into());
                    }
                    tokio::task::yield_now().await;
                }
                let got = Instant::now();
                me.waits.push(us(got - asked));
                if !hold.is_zero() {
                    hold_until(got + hold).await?;
                }
                let held = got.elapsed();
                if !raw.release(&key, &v).await? {
                    return Err("raw spin: lock was not ours at release".into());
                }
                if got < end {
                    me.grants += 1;
                    me.holds.push(us(held));
                }
            }
        });
    }
    join_hot(set, window).await
}

async fn join_hot(
    mut set: JoinSet<Result<HotTask, String>>,
    window: Duration,
) -> Result<Hot, String> {
    let mut hot = Hot {
        window,
        ..Hot::default()
    };
    while let Some(joined) = set.join_next().await {
        hot.merge(joined.map_err(|e| format!("task failed: {e}"))??);
    }
    Ok(hot)
}

/// The most grants per second a 1 ms hold allows: one task holding (with
/// [`hold_until`]) back to back, no lock at all. Returns (grants/s, mean hold us).
pub(crate) async fn hold_ceiling(hold: Duration, window: Duration) -> Result<(f64, f64), String> {
    let start = Instant::now();
    let end = start + window;
    let mut grants = 0u64;
    let mut holds = Vec::new();
    loop {
        let got = Instant::now();
        if got >= end {
            break;
        }
        hold_until(got + hold).await?;
        holds.push(us(got.elapsed()));
        grants += 1;
    }
    let mean = holds.iter().sum::<f64>() / holds.len().max(1) as f64;
    Ok((grants as f64 / window.as_secs_f64(), mean))
}

/// Single-waiter handoff with the library: the holder has the lock, one
/// waiter is already waiting; the sample is the time from the start of
/// `release()` to the moment the waiter's `acquire()` returned. In us.
pub(crate) async fn handoff_lib(
    client: &LockClient,
    key: &str,
    samples: usize,
) -> Result<Vec<f64>, String> {
    let mut out = Vec::with_capacity(samples);
    for _ in 0..samples {
        let guard = client
            .lock(key)
            .acquire()
            .await
            .map_err(|e| format!("handoff holder: {e}"))?;
        let waiter_client = client.clone();
        let waiter_key = key.to_string();
        let waiter = tokio::spawn(async move {
            let guard = waiter_client
                .lock(waiter_key)
                .wait(GENEROUS_WAIT)
                .acquire()
                .await
                .map_err(|e| format!("handoff waiter: {e}"))?;
            let at = Instant::now();
            guard
                .release()
                .await
                .map_err(|e| format!("handoff waiter release: {e}"))?;
            Ok::<Instant, String>(at)
        });
        tokio::time::sleep(WAITER_HEAD_START).await;
        let released = Instant::now();
        guard
            .release()
            .await
            .map_err(|e| format!("handoff holder release: {e}"))?;
        let at = waiter
            .await
            .map_err(|e| format!("handoff waiter task: {e}"))??;
        let gap = at.checked_duration_since(released).ok_or(
            "the waiter held the lock before the holder released it: mutual exclusion broken",
        )?;
        out.push(us(gap));
    }
    Ok(out)
}

/// The raw counterpart of [`handoff_lib`]: the holder deletes with
/// compare-and-delete + `PUBLISH`; the waiter (subscribed beforehand on its
/// own pub/sub connection) retries `SET NX PX` on each notice.
pub(crate) async fn handoff_raw(
    raw: &Raw,
    client: &redis::Client,
    name: &str,
    samples: usize,
) -> Result<Vec<f64>, String> {
    let key = raw.key(name);
    let channel = raw.key(&format!("{name}:notice"));
    let mut pubsub = client
        .get_async_pubsub()
        .await
        .map_err(|e| format!("raw pubsub: {e}"))?;
    pubsub
        .subscribe(&channel)
        .await
        .map_err(|e| format!("raw SUBSCRIBE: {e}"))?;
    let mut notices = pubsub.into_on_message();
    let (start_tx, mut start_rx) = tokio::sync::mpsc::channel::<()>(1);
    let (done_tx, mut done_rx) = tokio::sync::mpsc::channel::<Result<Instant, String>>(1);
    let mut waiter_raw = raw.clone();
    let waiter_key = key.clone();
    let waiter = tokio::spawn(async move {
        let mut n = 0u64;
        while start_rx.recv().await.is_some() {
            n += 1;
            let v = value(2, n);
            let result = async {
                while !waiter_raw.try_set(&waiter_key, &v).await? {
                    // Any notice is a hint to try again; a stale one costs a retry.
                    notices.next().await.ok_or("raw pubsub closed")?;
                }
                let at = Instant::now();
                waiter_raw.release(&waiter_key, &v).await?;
                Ok::<Instant, String>(at)
            }
            .await;
            if done_tx.send(result).await.is_err() {
                break;
            }
        }
    });
    let mut raw = raw.clone();
    let mut out = Vec::with_capacity(samples);
    for i in 0..samples {
        let v = value(1, i as u64);
        take_free(&mut raw, &key, &v, "raw handoff").await?;
        start_tx.send(()).await.map_err(|_| "raw waiter gone")?;
        tokio::time::sleep(WAITER_HEAD_START).await;
        let released = Instant::now();
        if !raw.release_publish(&key, &v, &channel).await? {
            return Err("raw handoff: not ours at release".into());
        }
        let at = done_rx.recv().await.ok_or("raw waiter gone")??;
        let gap = at
            .checked_duration_since(released)
            .ok_or("raw handoff: waiter held before release")?;
        out.push(us(gap));
    }
    drop(start_tx);
    let _ = waiter.await;
    Ok(out)
}

/// The floor under any hand-over on this machine: one raw compare-and-delete
/// round trip, sent after the same idle pause as a handoff's release (a
/// sleeping core takes a while to wake). In us.
pub(crate) async fn idle_round_trip(
    raw: &Raw,
    name: &str,
    samples: usize,
) -> Result<Vec<f64>, String> {
    let key = raw.key(name);
    let mut raw = raw.clone();
    let mut out = Vec::with_capacity(samples);
    for i in 0..samples {
        let v = value(3, i as u64);
        take_free(&mut raw, &key, &v, "idle round trip").await?;
        tokio::time::sleep(WAITER_HEAD_START).await;
        let started = Instant::now();
        if !raw.release(&key, &v).await? {
            return Err("idle round trip: not ours at release".into());
        }
        out.push(us(started.elapsed()));
    }
    Ok(out)
}

/// What holding many locks under the watchdog cost.
#[derive(Debug)]
pub(crate) struct HeldRun {
    /// Commands clients sent to Redis per 100 held locks per renewal period
    /// (seen with `MONITOR`; a script call is one command, the commands it
    /// runs inside Redis are not counted).
    pub(crate) per_100_per_period: f64,
    /// The same, counting only `EVALSHA`/`EVAL`/`FCALL` calls.
    pub(crate) scripts_per_100_per_period: f64,
    /// Pub/sub housekeeping seen in the window (`UNSUBSCRIBE` of channels
    /// nobody waits on any more), not counted above.
    pub(crate) pubsub: u64,
    /// How many keys those script calls carried: (min, median, max).
    pub(crate) keys_per_script: (f64, f64, f64),
    /// `total_commands_processed` per 100 locks per period: includes every
    /// command run inside scripts (GET + PEXPIRE per lock for a renewal).
    pub(crate) server_per_100_per_period: f64,
    /// Client CPU during the window, in percent of one core.
    pub(crate) cpu_percent: f64,
    /// Guards found lost at the end of the window (should be 0).
    pub(crate) lost: usize,
    /// Locks another client could take at the end of the window although
    /// their guards were held (should be 0: the renewals kept them alive).
    pub(crate) takeable: usize,
    /// How long taking the locks took, in ms.
    pub(crate) acquire_ms: f64,
}

const WINDOW_START: &str = "bench:window:start";
const WINDOW_END: &str = "bench:window:end";

/// Takes `n` locks with lease `ttl` (renewed every ttl/3), then counts the
/// commands sent to Redis during `periods` renewal periods.
///
/// Counting uses `MONITOR` between two `ECHO` markers: it tells commands sent
/// by clients from the commands scripts run inside Redis (`[0 lua]`), which
/// `INFO`'s counters mix.
pub(crate) async fn held_under_watchdog(
    client: &LockClient,
    rival: &LockClient,
    redis: &redis::Client,
    n: usize,
    ttl: Duration,
    periods: u32,
) -> Result<HeldRun, String> {
    let mut info_conn = redis
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("INFO connection: {e}"))?;
    let monitor = redis
        .get_async_monitor()
        .await
        .map_err(|e| format!("MONITOR: {e}"))?;
    let counter = tokio::spawn(count_commands(monitor));
    let t = Instant::now();
    let guards = take_many(client, "held", n, ttl).await?;
    let acquire_ms = t.elapsed().as_secs_f64() * 1e3;
    let period = ttl / 3;
    let total_a = total_commands(&mut info_conn).await?;
    echo(&mut info_conn, WINDOW_START).await?;
    let cpu_a = super::report::cpu_seconds();
    let t_a = Instant::now();
    tokio::time::sleep(period * periods).await;
    let elapsed = t_a.elapsed();
    let cpu_b = super::report::cpu_seconds();
    echo(&mut info_conn, WINDOW_END).await?;
    let total_b = total_commands(&mut info_conn).await?;
    let seen = tokio::time::timeout(Duration::from_secs(10), counter)
        .await
        .map_err(|_| "MONITOR: the end marker never arrived")?
        .map_err(|e| format!("MONITOR task: {e}"))??;
    let lost = guards.iter().filter(|g| g.is_lost()).count();
    let takeable = try_take_all(rival, "held", n).await?;
    release_many(guards).await?;
    let measured_periods = elapsed.as_secs_f64() / period.as_secs_f64();
    let hundreds = n as f64 / 100.0;
    let per = |count: u64| count as f64 / hundreds / measured_periods;
    // Between the two INFOs: the first INFO itself, the two ECHOs.
    let server = total_b.saturating_sub(total_a).saturating_sub(3);
    let cpu_percent = match (cpu_a, cpu_b) {
        (Some(a), Some(b)) => (b - a) / elapsed.as_secs_f64() * 100.0,
        _ => f64::NAN,
    };
    Ok(HeldRun {
        per_100_per_period: per(seen.client),
        scripts_per_100_per_period: per(seen.scripts),
        pubsub: seen.pubsub,
        keys_per_script: (
            percentile(&seen.keys_per_script, 0.0),
            median(&seen.keys_per_script),
            percentile(&seen.keys_per_script, 100.0),
        ),
        server_per_100_per_period: per(server),
        cpu_percent,
        lost,
        takeable,
        acquire_ms,
    })
}

/// Tries once to take each of the `n` locks `"{name}:{i}"` with `rival` (a
/// second client: no reentrancy); returns how many it got (and releases them).
async fn try_take_all(rival: &LockClient, name: &str, n: usize) -> Result<usize, String> {
    let results: Vec<_> = futures_util::stream::iter(0..n)
        .map(|i| {
            let request = rival.lock(format!("{name}:{i}"));
            async move { request.acquire().await }
        })
        .buffer_unordered(FAN_OUT)
        .collect()
        .await;
    let mut taken = Vec::new();
    for result in results {
        match result {
            Ok(guard) => taken.push(guard),
            Err(e) if e.is_busy() => {}
            Err(e) => return Err(format!("rival acquire: {e}")),
        }
    }
    let count = taken.len();
    release_many(taken).await?;
    Ok(count)
}

#[derive(Debug, Default)]
struct Seen {
    client: u64,
    pubsub: u64,
    scripts: u64,
    keys_per_script: Vec<f64>,
}

/// Counts the commands `MONITOR` shows between the start and end markers.
async fn count_commands(monitor: redis::aio::Monitor) -> Result<Seen, String> {
    let mut lines = monitor.into_on_message::<String>();
    let mut counting = false;
    let mut seen = Seen::default();
    while let Some(line) = lines.next().await {
        // `1700000000.123456 [0 127.0.0.1:5000] "EVALSHA" "..."`; scripts' own
        // commands show as `[0 lua]`.
        let Some(open) = line.find('[') else { continue };
        let Some(close) = line[open..].find(']').map(|c| open + c) else {
            continue;
        };
        let source = &line[open + 1..close];
        let command = line[close + 1..].trim_start();
        if command.starts_with("\"ECHO\"") {
            if command.contains(WINDOW_START) {
                counting = true;
                continue;
            }
            if command.contains(WINDOW_END) {
                return Ok(seen);
            }
        }
        if !counting || source.ends_with(" lua") {
            continue;
        }
        // `"EVALSHA" "<sha>" "<numkeys>" ...`: quoted tokens at 1, 3, 5.
        let mut tokens = command.split('"').skip(1).step_by(2);
        let name = tokens.next().unwrap_or("").to_ascii_uppercase();
        if name.ends_with("SUBSCRIBE") {
            // The notice connection dropping channels that earlier rows'
            // waiters used (a sweep every 5 s): about waiting, not held locks.
            seen.pubsub += 1;
            continue;
        }
        seen.client += 1;
        if name.starts_with("EVAL") || name.starts_with("FCALL") {
            seen.scripts += 1;
            if let Some(keys) = tokens.nth(1).and_then(|n| n.parse::<f64>().ok()) {
                seen.keys_per_script.push(keys);
            }
        }
    }
    Err("MONITOR connection closed".into())
}

async fn echo(conn: &mut redis::aio::MultiplexedConnection, text: &str) -> Result<(), String> {
    let _: String = redis::cmd("ECHO")
        .arg(text)
        .query_async(conn)
        .await
        .map_err(|e| format!("ECHO: {e}"))?;
    Ok(())
}

async fn total_commands(conn: &mut redis::aio::MultiplexedConnection) -> Result<u64, String> {
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(conn)
        .await
        .map_err(|e| format!("INFO: {e}"))?;
    info.lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| "INFO stats has no total_commands_processed".to_string())
}

/// Takes `n` locks `"{name}:{i}"` with lease `ttl`, `FAN_OUT` at a time.
pub(crate) async fn take_many(
    client: &LockClient,
    name: &str,
    n: usize,
    ttl: Duration,
) -> Result<Vec<LockGuard>, String> {
    let results: Vec<_> = futures_util::stream::iter(0..n)
        .map(|i| {
            let request = client.lock(format!("{name}:{i}")).ttl(ttl);
            async move { request.acquire().await }
        })
        .buffer_unordered(FAN_OUT)
        .collect()
        .await;
    results
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("taking {n} locks: {e}"))
}

/// Releases every guard, `FAN_OUT` at a time.
pub(crate) async fn release_many(guards: Vec<LockGuard>) -> Result<(), String> {
    let results: Vec<_> = futures_util::stream::iter(guards)
        .map(LockGuard::release)
        .buffer_unordered(FAN_OUT)
        .collect()
        .await;
    let failed = results.iter().filter(|r| r.is_err()).count();
    if failed > 0 {
        return Err(format!("{failed} of {} releases failed", results.len()));
    }
    Ok(())
}

/// Summary helpers shared by the rows.
pub(crate) fn p50(samples: &[f64]) -> f64 {
    median(samples)
}

/// The 99th percentile, in milliseconds, of microsecond samples.
pub(crate) fn p99_ms(samples_us: &[f64]) -> f64 {
    percentile(samples_us, 99.0) / 1e3
}
