//! Measurements made in fresh child processes of the benchmark itself
//! (`bench --rss-probe ...`, `bench --hot-probe ...`): row 8's RSS, which
//! earlier rows would blur in the benchmark's own process, and row 9's two
//! processes contending for one key.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdout, Command, ExitCode, Stdio};
use std::time::Duration;

use lock_runtime::LockClient;

use super::held::{release_many, take_many};
use super::report::{percentile, rss_kib};
use super::rows::{self, lib_pair};

/// How many locks the RSS probe holds.
pub(crate) const RSS_LOCKS: usize = 10_000;

/// What the child says once it is connected and warmed up.
const READY: &str = "ready";

/// Runs the child mode named by `args[0]`, if it is one: `--rss-probe` or
/// `--hot-probe`. `None` for an ordinary run.
pub(crate) fn child_main(args: &[String]) -> Option<ExitCode> {
    let (mode, rest) = args.split_first()?;
    let result = match mode.as_str() {
        "--rss-probe" => rss_child(rest),
        "--hot-probe" => hot_child(rest),
        _ => return None,
    };
    Some(match result {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{mode}: {e}");
            ExitCode::FAILURE
        }
    })
}

fn child_runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
}

fn number<T: std::str::FromStr>(what: &str, text: &str) -> Result<T, String> {
    text.parse()
        .map_err(|_| format!("{what} must be a number, not {text:?}"))
}

/// `--rss-probe <memory|redis> <n> <prefix> [url]`: prints
/// `"<rss before KiB> <rss with n held KiB>"`.
fn rss_child(args: &[String]) -> Result<String, String> {
    let [backend, n, prefix, rest @ ..] = args else {
        return Err("usage: bench --rss-probe <memory|redis> <n> <prefix> [url]".into());
    };
    let n: usize = number("n", n)?;
    child_runtime()?.block_on(async {
        let builder = LockClient::builder().key_prefix(prefix.as_str());
        let builder = match (backend.as_str(), rest) {
            ("memory", _) => builder.memory(),
            ("redis", [url]) => builder.redis(url.as_str()),
            _ => return Err(format!("bad probe backend {backend:?}")),
        };
        let client = builder.build().await.map_err(|e| e.to_string())?;
        lib_pair(&client, "rss:warm").await?;
        let before = rss_kib().ok_or("no VmRSS in /proc/self/status")?;
        let guards = take_many(&client, "rss", n, Duration::from_secs(30)).await?;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let with = rss_kib().ok_or("no VmRSS in /proc/self/status")?;
        release_many(guards).await?;
        Ok(format!("{before} {with}"))
    })
}

/// Row 8: (RSS before, RSS with `RSS_LOCKS` held), in KiB, of a fresh process.
pub(crate) fn rss(backend: &str, prefix: &str, url: &str) -> Result<(f64, f64), String> {
    let n = RSS_LOCKS.to_string();
    let mut child = spawn(&["--rss-probe", backend, &n, prefix, url])?;
    let mut out = child.stdout.take().map(BufReader::new).ok_or("no stdout")?;
    let line = answer(&mut child, &mut out, "rss probe")?;
    match parse_floats(&line)[..] {
        [before, with] => Ok((before, with)),
        _ => Err(format!("rss probe ({backend}): unexpected output {line:?}")),
    }
}

/// `--hot-probe <url> <prefix> <tasks> <window ms>`: connects, warms up,
/// says `ready`, waits for a line on stdin, then runs `tasks` tasks on the
/// key `cross` for the window (as row 4 does, zero hold) and prints
/// `"<grants> <fewest per task> <most per task> <wait p99 us>"`.
fn hot_child(args: &[String]) -> Result<String, String> {
    let [url, prefix, tasks, window_ms] = args else {
        return Err("usage: bench --hot-probe <url> <prefix> <tasks> <window ms>".into());
    };
    let tasks: usize = number("tasks", tasks)?;
    let window = Duration::from_millis(number("window", window_ms)?);
    child_runtime()?.block_on(async {
        let side = LockClient::builder()
            .redis(url.as_str())
            .key_prefix(prefix.as_str())
            .build()
            .await
            .map_err(|e| e.to_string())?;
        // A key of its own: the other process warms up at the same time.
        let warm = format!("cross:warm:{}", std::process::id());
        for _ in 0..50 {
            lib_pair(&side, &warm).await?;
        }
        let short = Duration::from_millis(30);
        rows::hot(&side, &warm, 4, Duration::ZERO, short).await?;
        println!("{READY}");
        std::io::stdout().flush().map_err(|e| e.to_string())?;
        let go = tokio::task::spawn_blocking(|| std::io::stdin().lines().next());
        match go.await {
            Ok(Some(Ok(_))) => {}
            _ => return Err("the benchmark did not say go".into()),
        }
        let hot = rows::hot(&side, "cross", tasks, Duration::ZERO, window).await?;
        let (fewest, most) = rows::Hot::grant_range(std::slice::from_ref(&hot));
        let grants: u64 = hot.grants.iter().sum();
        Ok(format!(
            "{grants} {fewest} {most} {}",
            percentile(&hot.waits, 99.0)
        ))
    })
}

/// What one process of row 9 got.
#[derive(Debug)]
pub(crate) struct CrossRun {
    pub(crate) grants: f64,
    /// Fewest and most grants of one of its tasks.
    pub(crate) per_task: (f64, f64),
    pub(crate) wait_p99_us: f64,
}

/// Row 9: two fresh processes of `tasks` tasks each on one key. Both connect
/// and warm up first; their windows then open together (each 5 ms after the
/// same "go").
pub(crate) fn two_processes(
    url: &str,
    prefix: &str,
    tasks: usize,
    window: Duration,
) -> Result<[CrossRun; 2], String> {
    let (tasks, ms) = (tasks.to_string(), window.as_millis().to_string());
    let args = ["--hot-probe", url, prefix, &tasks, &ms];
    let mut children = [spawn(&args)?, spawn(&args)?];
    let mut outs = Vec::new();
    for child in &mut children {
        let mut out = child.stdout.take().map(BufReader::new).ok_or("no stdout")?;
        let said = read_line(&mut out);
        if said.as_deref() != Ok(READY) {
            return Err(format!("hot probe: {}", failure(child, said)));
        }
        outs.push(out);
    }
    for child in &mut children {
        let stdin = child.stdin.as_mut().ok_or("hot probe: no stdin")?;
        writeln!(stdin, "go").map_err(|e| format!("hot probe: {e}"))?;
        stdin.flush().map_err(|e| format!("hot probe: {e}"))?;
    }
    let mut runs = Vec::new();
    for (child, out) in children.iter_mut().zip(&mut outs) {
        let line = answer(child, out, "hot probe")?;
        match parse_floats(&line)[..] {
            [grants, fewest, most, p99] => runs.push(CrossRun {
                grants,
                per_task: (fewest, most),
                wait_p99_us: p99,
            }),
            _ => return Err(format!("hot probe: unexpected output {line:?}")),
        }
    }
    runs.try_into()
        .map_err(|_| "hot probe: two runs expected".to_string())
}

fn spawn(args: &[&str]) -> Result<Child, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    Command::new(exe)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{}: {e}", args[0]))
}

fn read_line(out: &mut BufReader<ChildStdout>) -> Result<String, String> {
    let mut line = String::new();
    match out.read_line(&mut line) {
        Ok(0) => Err("no output".into()),
        Ok(_) => Ok(line.trim().to_string()),
        Err(e) => Err(e.to_string()),
    }
}

/// The child's one line of result, once it has exited successfully.
fn answer(
    child: &mut Child,
    out: &mut BufReader<ChildStdout>,
    what: &str,
) -> Result<String, String> {
    let line = read_line(out);
    match child.wait() {
        Ok(status) if status.success() => line.map_err(|e| format!("{what}: {e}")),
        _ => Err(format!("{what}: {}", failure(child, line))),
    }
}

/// Why a child failed: its stderr, or what it printed instead.
fn failure(child: &mut Child, said: Result<String, String>) -> String {
    let _ = child.kill();
    let _ = child.wait();
    let mut err = String::new();
    if let Some(stderr) = child.stderr.as_mut() {
        let _ = std::io::Read::read_to_string(stderr, &mut err);
    }
    match said {
        _ if !err.trim().is_empty() => err.trim().to_string(),
        Ok(line) => format!("unexpected output {line:?}"),
        Err(e) => e,
    }
}

fn parse_floats(line: &str) -> Vec<f64> {
    line.split_whitespace()
        .map_while(|v| v.parse().ok())
        .collect()
}
