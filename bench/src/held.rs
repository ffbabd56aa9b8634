//! Row 7: thousands of locks held under the watchdog, and what renewing them
//! sends to Redis (counted with `MONITOR`). Also the fan-out helpers that take
//! and release many locks (row 7 and the RSS probe of row 8).

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use lock_runtime::{LockClient, LockGuard};

use super::report::{median, percentile};

/// Concurrency used to take and release thousands of locks.
const FAN_OUT: usize = 64;

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
