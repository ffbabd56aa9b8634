//! Cost curves (`bench --curves`): what holding, waiting for and using
//! locks costs as their number grows, each point one run in a fresh child
//! process against one `redis-server` the benchmark starts (flushed between
//! points). Printed as a table, written as JSON and drawn as an SVG.
//!
//! * held locks on one client (lease 3 s, renewed every second): client RSS
//!   and CPU, script calls per second seen by Redis, Redis CPU and memory;
//! * waiters on one key, spread over 4 clients, every one queued on the
//!   server (`local_handover(false)`), and the same with the default local
//!   lines: grants per second through the hand-over chain, wake latency,
//!   memory on both sides;
//! * distinct keys, each taken and released once: what stays in Redis
//!   (`DBSIZE`, memory) and in the client.

mod chart;
pub(crate) mod info;
mod points;

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

use serde_json::{Value, json};

/// `bench --curves`' own flags.
const USAGE: &str = "\
usage: bench --curves [--quick] [--svg PATH] [--json PATH]

  --quick       smaller points only (held 1k/10k, waiters 10-1k, keys 10k/100k)
  --svg PATH    the chart (default target/bench-curves.svg)
  --json PATH   every point's figures (default target/bench-curves.json)

Always starts its own redis-server (REDIS_SERVER names the binary): the server
is flushed between points.";

/// The points of each curve.
fn plan(quick: bool) -> Vec<(&'static str, usize)> {
    let mut points = Vec::new();
    let held: &[usize] = if quick {
        &[1_000, 10_000]
    } else {
        &[1_000, 10_000, 100_000]
    };
    let waiters: &[usize] = if quick {
        &[10, 100, 1_000]
    } else {
        &[10, 100, 1_000, 10_000]
    };
    let keys: &[usize] = if quick {
        &[10_000, 100_000]
    } else {
        &[10_000, 100_000, 1_000_000]
    };
    points.extend(held.iter().map(|n| ("held", *n)));
    points.extend(waiters.iter().map(|n| ("waiters", *n)));
    points.extend(waiters.iter().map(|n| ("local-waiters", *n)));
    points.extend(keys.iter().map(|n| ("keys", *n)));
    points
}

/// `--curve-point <kind> <n> <url>`: one point, in this (child) process.
pub(crate) fn child_main(args: &[String]) -> Option<ExitCode> {
    let (mode, rest) = args.split_first()?;
    if mode != "--curve-point" {
        return None;
    }
    let result = match rest {
        [kind, n, url] => n
            .parse()
            .map_err(|_| format!("n must be a number, not {n:?}"))
            .and_then(|n| points::run(kind, n, url)),
        _ => Err("usage: bench --curve-point <held|waiters|local-waiters|keys> <n> <url>".into()),
    };
    Some(match result {
        Ok(value) => {
            println!("{value}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("--curve-point: {e}");
            ExitCode::FAILURE
        }
    })
}

/// `bench --curves ...`.
pub(crate) fn main(args: &[String]) -> ExitCode {
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench --curves: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &[String]) -> Result<(), String> {
    let (mut quick, mut svg, mut json_path) = (false, None, None);
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut value = |flag: &str| {
            args.next()
                .map(PathBuf::from)
                .ok_or(format!("{flag} needs a value\n{USAGE}"))
        };
        match arg.as_str() {
            "--quick" => quick = true,
            "--svg" => svg = Some(value("--svg")?),
            "--json" => json_path = Some(value("--json")?),
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    let svg = svg.unwrap_or_else(|| PathBuf::from("target/bench-curves.svg"));
    let json_path = json_path.unwrap_or_else(|| PathBuf::from("target/bench-curves.json"));
    let started = Instant::now();
    let server = test_support::RedisServer::try_start(&[])?;
    let url = server.url();
    let flush = redis::Client::open(url.as_str()).map_err(|e| e.to_string())?;
    let mut flush = flush
        .get_connection()
        .map_err(|e| format!("connection: {e}"))?;
    let load_before = crate::report::load_average();
    let mut results: Vec<(&str, Value)> = Vec::new();
    for (kind, n) in plan(quick) {
        redis::cmd("FLUSHALL")
            .exec(&mut flush)
            .map_err(|e| format!("FLUSHALL: {e}"))?;
        let t = Instant::now();
        eprint!("curves: {kind} {n} ... ");
        let value = point(kind, n, &url)?;
        eprintln!("{:.1} s", t.elapsed().as_secs_f64());
        results.push((kind, value));
    }
    drop(server);
    let (date, time) = crate::report::utc_now();
    let machine = crate::report::machine();
    let load = |l: Option<f64>| l.map_or("?".to_string(), |l| format!("{l:.2}"));
    println!(
        "\nlock-runtime cost curves, {date} {time}, {} cores; one run per point; load \
         average {} before, {} after\n",
        machine.get("cores").cloned().unwrap_or_default(),
        load(load_before),
        load(crate::report::load_average()),
    );
    print!("{}", table(&results));
    let json = json!({
        "date": date,
        "time": time,
        "machine": machine,
        "load_average": { "before": load_before, "after": crate::report::load_average() },
        "points": results.iter().map(|(kind, v)| json!({ "curve": kind, "figures": v })).collect::<Vec<_>>(),
        "chart": svg,
    });
    for path in [&json_path, &svg] {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {dir:?}: {e}"))?;
        }
    }
    let text = serde_json::to_string_pretty(&json).map_err(|e| e.to_string())?;
    std::fs::write(&json_path, text).map_err(|e| format!("cannot write {json_path:?}: {e}"))?;
    chart::write(&svg, &results)?;
    println!(
        "\nwrote {} and {} ({:.0} s in all)",
        json_path.display(),
        svg.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Runs one point in a child process; its figures.
fn point(kind: &str, n: usize, url: &str) -> Result<Value, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut child = Command::new(exe)
        .args(["--curve-point", kind, &n.to_string(), url])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("--curve-point: {e}"))?;
    let mut out = String::new();
    if let Some(stdout) = child.stdout.as_mut() {
        stdout
            .read_to_string(&mut out)
            .map_err(|e| format!("{kind} {n}: {e}"))?;
    }
    let status = child.wait().map_err(|e| format!("{kind} {n}: {e}"))?;
    if !status.success() {
        return Err(format!("{kind} {n}: the child failed ({status})"));
    }
    serde_json::from_str(out.trim()).map_err(|e| format!("{kind} {n}: {e}: {out:?}"))
}

/// A figure of a point, NaN when absent.
pub(crate) fn get(v: &Value, name: &str) -> f64 {
    v.get(name).and_then(Value::as_f64).unwrap_or(f64::NAN)
}

fn table(results: &[(&str, Value)]) -> String {
    let mut out = String::new();
    let mut section = |title: &str, kind: &str, columns: &[(&str, &str, f64)]| {
        out.push_str(&format!("{title}\n"));
        let head: Vec<String> = columns.iter().map(|(h, _, _)| format!("{h:>14}")).collect();
        out.push_str(&format!("{:>9} {}\n", "n", head.join(" ")));
        for (_, v) in results.iter().filter(|(k, _)| *k == kind) {
            let cells: Vec<String> = columns
                .iter()
                .map(|(_, field, scale)| format!("{:>14.1}", get(v, field) * scale))
                .collect();
            out.push_str(&format!("{:>9} {}\n", get(v, "n"), cells.join(" ")));
        }
        out.push('\n');
    };
    section(
        "held locks, one client, lease 3 s (renewed every 1 s)",
        "held",
        &[
            ("client RSS MiB", "client_rss_kib", 1.0 / 1024.0),
            ("Δ RSS MiB", "client_rss_delta_kib", 1.0 / 1024.0),
            ("client CPU %", "client_cpu_percent", 1.0),
            ("renew calls/s", "renew_calls_per_s", 1.0),
            ("Redis CPU %", "redis_cpu_percent", 1.0),
            ("Δ Redis MiB", "redis_memory_delta_kib", 1.0 / 1024.0),
            ("lost", "lost", 1.0),
            ("release failed", "releases_failed", 1.0),
            ("take s", "take_s", 1.0),
        ],
    );
    let waiters = [
        ("grants/s", "grants_per_s", 1.0),
        ("wake p50 ms", "wake_p50_us", 1e-3),
        ("wake p99 ms", "wake_p99_us", 1e-3),
        ("Δ RSS KiB", "client_rss_delta_kib", 1.0),
        ("Δ Redis KiB", "redis_memory_delta_kib", 1.0),
        ("queue KiB", "redis_queue_kib", 1.0),
        ("client us/grant", "client_cpu_us_per_grant", 1.0),
        ("Redis us/grant", "redis_cpu_us_per_grant", 1.0),
        ("script us/grant", "script_us_per_grant", 1.0),
        ("calls/grant", "script_calls_per_grant", 1.0),
        ("queue s", "queue_s", 1.0),
    ];
    section(
        "waiters on one key over 4 clients, every one queued on the server (local_handover(false))",
        "waiters",
        &waiters,
    );
    section(
        "waiters on one key over 4 clients, local lines (the default)",
        "local-waiters",
        &waiters,
    );
    section(
        "distinct keys, each taken and released once (256 at a time)",
        "keys",
        &[
            ("Redis keys", "redis_keys", 1.0),
            ("slots expected", "expected_slots", 1.0),
            ("lock keys left", "lock_keys_left", 1.0),
            ("Δ Redis KiB", "redis_memory_delta_kib", 1.0),
            ("Δ RSS KiB", "client_rss_delta_kib", 1.0),
            ("pairs/s", "pairs_per_s", 1.0),
            ("seconds", "seconds", 1.0),
        ],
    );
    out
}
