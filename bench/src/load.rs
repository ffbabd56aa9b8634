//! The load of rows 11 and 12 and what it cost: `wrk` (32 connections,
//! a request key of its own each) and its output, and the server's own
//! counters read around a window (`INFO commandstats`, `cpu`, `stats`).

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Connections `wrk` keeps open.
pub(crate) const CONNECTIONS: usize = 32;

/// Whether rows 11 and 12 can run (always, when not `wanted`): if `wrk`
/// cannot be run, both rows are marked not measured, saying why.
pub(crate) fn check_wrk(wanted: bool, metrics: &mut [crate::report::Metric]) -> bool {
    use crate::defs::{
        M11, M11_FENCED, M11_LIBRARY, M12, M12_CHECKED, M12_COMMIT, M12_COMMIT_HERE, M12_LIBRARY,
    };
    let Err(why) = wanted.then(wrk_available).unwrap_or(Ok(())) else {
        return true;
    };
    eprintln!("rows 11 and 12 NOT YET: {why}");
    for metric in [
        M11,
        M11_FENCED,
        M11_LIBRARY,
        M12,
        M12_CHECKED,
        M12_LIBRARY,
        M12_COMMIT,
        M12_COMMIT_HERE,
    ] {
        metrics[metric].not_measured = Some(why.clone());
    }
    false
}

/// Whether `wrk` can be run; `Err` says how to get it.
fn wrk_available() -> Result<(), String> {
    match Command::new("wrk").arg("--version").output() {
        Ok(_) => Ok(()),
        Err(e) => Err(format!(
            "`wrk` cannot be run ({e}): apt-get install wrk (`cargo xtask test` installs it)"
        )),
    }
}

/// A `wrk` script posting to `/orders/<id>/pay` with a distinct id and a
/// distinct `Idempotency-Key` per request: `<run>-<thread>-<n>`, `run` new
/// for every invocation, so no request repeats an earlier one's key.
fn script(run: &str) -> String {
    format!(
        r#"
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("id", threads)
end
n = 0
function request()
  n = n + 1
  local key = string.format("{run}-%d-%d", id, n)
  return wrk.format("POST", "/orders/" .. key .. "/pay",
    {{ ["Idempotency-Key"] = '"' .. key .. '"', ["Content-Length"] = "0" }}, "")
end
"#
    )
}

/// What one `wrk` run measured.
#[derive(Debug, Default)]
pub(crate) struct Load {
    pub(crate) per_sec: f64,
    /// Answers that were not `2xx`/`3xx` (each request has its own key, so
    /// every one should have been served).
    pub(crate) non_2xx: u64,
    /// Socket errors (connect, read, write, timeout), summed.
    pub(crate) errors: u64,
    /// Requests answered in the window.
    pub(crate) requests: u64,
    /// Redis commands run in the window (`INFO commandstats`): name, calls,
    /// and microseconds of Redis CPU.
    pub(crate) commands: Vec<(String, u64, u64)>,
    /// CPU seconds the app's process (this one: axum, the layer, the
    /// client) used in the window.
    pub(crate) app_cpu: Option<f64>,
    /// CPU seconds the server used in the window ([`server_cpu`]): its
    /// commands and everything around them (reading, parsing, answering,
    /// its event loop).
    pub(crate) server_cpu: Option<f64>,
    /// Reads the server did from its clients in the window
    /// ([`server_reads`]): the requests a read carried tell how well the
    /// app's connection batched their commands.
    pub(crate) server_reads: Option<u64>,
}

impl Load {
    /// Redis commands per request, by name, the server's CPU microseconds
    /// per request in them and in all, and the app's: `"2.00 commands (set
    /// 1.00, evalsha 1.00), 4.1 us of the server's CPU in them and 6.0 us
    /// in all, 20.3 us of the app's CPU, 3.1 requests a server read"`.
    pub(crate) fn profile(&self) -> String {
        let n = self.requests.max(1) as f64;
        let calls: u64 = self.commands.iter().map(|c| c.1).sum();
        let usec: u64 = self.commands.iter().map(|c| c.2).sum();
        let by_name: Vec<String> = self
            .commands
            .iter()
            .filter(|c| c.1 as f64 / n >= 0.01)
            .map(|(name, c, _)| format!("{name} {:.2}", *c as f64 / n))
            .collect();
        let per_request =
            |cpu: Option<f64>| cpu.map_or("?".into(), |s| format!("{:.1}", s * 1e6 / n));
        let per_read = self.server_reads.map_or("?".into(), |reads| {
            format!("{:.1}", n / reads.max(1) as f64)
        });
        format!(
            "{:.2} commands ({}), {:.1} us of the server's CPU in them and {} us in all, {} us of \
             the app's CPU, {per_read} requests a server read",
            calls as f64 / n,
            by_name.join(", "),
            usec as f64 / n,
            per_request(self.server_cpu),
            per_request(self.app_cpu),
        )
    }
}

/// The server's CPU seconds so far (`INFO cpu`: `used_cpu_sys` +
/// `used_cpu_user`): everything it spent, reading, parsing and answering
/// included, which `INFO commandstats` leaves out.
pub(crate) async fn server_cpu(redis: &redis::Client) -> Result<f64, String> {
    let text = info(redis, "cpu").await?;
    let field = |name| info_field(&text, name).unwrap_or(0.0);
    Ok(field("used_cpu_sys") + field("used_cpu_user"))
}

/// The reads the server has done from its clients so far (`INFO stats`:
/// `total_reads_processed`): fewer per command means more commands to a
/// read (a client's pipelining).
pub(crate) async fn server_reads(redis: &redis::Client) -> Result<u64, String> {
    let text = info(redis, "stats").await?;
    Ok(info_field(&text, "total_reads_processed").unwrap_or(0))
}

/// The server's `INFO` of `section`.
async fn info(redis: &redis::Client, section: &str) -> Result<String, String> {
    let mut conn = redis
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("INFO connection: {e}"))?;
    redis::cmd("INFO")
        .arg(section)
        .query_async(&mut conn)
        .await
        .map_err(|e| format!("INFO {section}: {e}"))
}

/// The value of the field `name` in `INFO`'s text.
fn info_field<T: std::str::FromStr>(text: &str, name: &str) -> Option<T> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
}

/// Deletes the keys matching `patterns` (`SCAN` + `UNLINK`): what a side of
/// row 12 stored (records kept 24 h, about 100,000 a side), which would
/// otherwise pile up over the repetitions and slow every later side's
/// lookups in a growing keyspace. Returns how many were deleted.
pub(crate) async fn forget(redis: &redis::Client, patterns: &[String]) -> Result<u64, String> {
    let mut deleted = 0;
    if patterns.is_empty() {
        return Ok(deleted);
    }
    let mut conn = redis
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("SCAN connection: {e}"))?;
    for pattern in patterns {
        let mut cursor = 0u64;
        loop {
            let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(10_000)
                .query_async(&mut conn)
                .await
                .map_err(|e| format!("SCAN {pattern}: {e}"))?;
            if !keys.is_empty() {
                let n: u64 = redis::cmd("UNLINK")
                    .arg(&keys)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| format!("UNLINK: {e}"))?;
                deleted += n;
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
    }
    Ok(deleted)
}

/// `INFO commandstats`: (command, calls, usec), `info` itself left out.
pub(crate) async fn commandstats(redis: &redis::Client) -> Result<Vec<(String, u64, u64)>, String> {
    let mut conn = redis
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("INFO connection: {e}"))?;
    let text: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .map_err(|e| format!("INFO commandstats: {e}"))?;
    let field = |fields: &str, name: &str| -> u64 {
        fields
            .split(',')
            .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Ok(text
        .lines()
        .filter_map(|l| l.strip_prefix("cmdstat_")?.split_once(':'))
        .filter(|(name, _)| !name.starts_with("info"))
        .map(|(name, f)| (name.to_string(), field(f, "calls"), field(f, "usec")))
        .collect())
}

pub(crate) fn delta(
    before: &[(String, u64, u64)],
    after: &[(String, u64, u64)],
) -> Vec<(String, u64, u64)> {
    after
        .iter()
        .map(|(name, calls, usec)| {
            let (c0, u0) = before
                .iter()
                .find(|b| &b.0 == name)
                .map_or((0, 0), |b| (b.1, b.2));
            (name.clone(), calls - c0.min(*calls), usec - u0.min(*usec))
        })
        .filter(|c| c.1 > 0)
        .collect()
}

/// Writes a `wrk` script ([`script`]) with keys no earlier run used, to a
/// temporary file; its path.
pub(crate) fn write_script() -> Result<std::path::PathBuf, String> {
    static RUNS: AtomicU64 = AtomicU64::new(0);
    let run = format!(
        "r{}x{}",
        std::process::id(),
        RUNS.fetch_add(1, Ordering::Relaxed)
    );
    let path = std::env::temp_dir().join(format!("bench-http-{run}.lua"));
    std::fs::write(&path, script(&run)).map_err(|e| format!("write {path:?}: {e}"))?;
    Ok(path)
}

/// Runs `wrk` against `base` for `duration` (whole seconds, at least one) with
/// `CONNECTIONS` connections on two threads; blocks, so call it from
/// `spawn_blocking`.
pub(crate) fn wrk(base: &str, duration: Duration) -> Result<Load, String> {
    let path = write_script()?;
    let secs = duration.as_secs().max(1);
    let out = Command::new("wrk")
        .args(["-t2", &format!("-c{CONNECTIONS}"), &format!("-d{secs}s")])
        .args(["--timeout", "5s", "-s"])
        .arg(&path)
        .arg(base)
        .output();
    let _ = std::fs::remove_file(&path);
    let out = out.map_err(|e| format!("run wrk: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "wrk failed: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    parse(&text).ok_or_else(|| format!("no Requests/sec in wrk's output: {text}"))
}

/// Reads `Requests/sec`, `Non-2xx or 3xx responses` and `Socket errors`.
fn parse(text: &str) -> Option<Load> {
    let mut load = Load::default();
    let mut rate = None;
    for line in text.lines().map(str::trim) {
        if line.contains(" requests in ") {
            load.requests = line.split_whitespace().next()?.parse().ok()?;
        } else if let Some(v) = line.strip_prefix("Requests/sec:") {
            rate = v.trim().parse().ok();
        } else if let Some(v) = line.strip_prefix("Non-2xx or 3xx responses:") {
            load.non_2xx = v.trim().parse().unwrap_or(0);
        } else if let Some(v) = line.strip_prefix("Socket errors:") {
            // "connect 0, read 0, write 0, timeout 0"
            load.errors = v
                .split(',')
                .filter_map(|f| f.split_whitespace().nth(1)?.parse::<u64>().ok())
                .sum();
        }
    }
    load.per_sec = rate?;
    Some(load)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrk_output_is_read_for_its_rate_and_its_failures() {
        let text = "Running 3s test @ http://127.0.0.1:1\n  2 threads and 32 connections\n\
                    \x20 93308 requests in 3.00s, 11.21MB read\n\
                    \x20 Socket errors: connect 0, read 2, write 0, timeout 3\n\
                    \x20 Non-2xx or 3xx responses: 7\nRequests/sec:  31102.55\n";
        let load = parse(text).unwrap();
        assert_eq!(load.per_sec, 31102.55);
        assert_eq!((load.non_2xx, load.errors, load.requests), (7, 5, 93308));
        assert!(parse("Transfer/sec: 1MB\n").is_none());
    }
}
