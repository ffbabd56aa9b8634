//! Benchmark of `lock-runtime` against raw redis-rs, row by row as in issue 6's
//! Targets table. See BENCHMARKS.md for what each row measures.
//!
//! ```text
//! cargo run --release -p examples --bin bench -- [--reps N] [--quick] [--json PATH]
//!                                                [--only 1,3,7] [--markdown]
//! ```
//!
//! Starts its own `redis-server` on a free loopback port (killed on exit)
//! unless `REDIS_URL` names a loopback server. Every row is measured together
//! with its raw baseline in each repetition; the table shows medians over
//! the repetitions.

#[path = "../bench/mod.rs"]
mod bench;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bench::raw::Raw;
use bench::report::{self, Metric, Target, Unit, median};
use bench::rows::{self, Hot, p50, p99_ms, us};
use bench::server::check_loopback;
use lock_runtime::{LockClient, LockClientBuilder, LockError, LockInfo};

const USAGE: &str = "\
usage: bench [--reps N] [--quick] [--json PATH] [--only ROWS] [--markdown]

  --reps N      repetitions (default 5, 1 with --quick); medians are reported
  --quick       short smoke run (< 20 s), for CI
  --json PATH   where to write the results (default target/bench.json)
  --only ROWS   rows to run, e.g. 1,5,7 (default all: 1-8)
  --markdown    also print the table as Markdown

environment: BENCH_REPS, BENCH_QUICK=1, BENCH_JSON, BENCH_ONLY (flags win);
REDIS_URL=redis://127.0.0.1:PORT uses that server (loopback only) instead of
starting one; REDIS_SERVER names the redis-server binary.";

/// The key of the attribute row (row 6), as the template renders it.
const ATTR_ID: u32 = 7;

struct Options {
    reps: usize,
    quick: bool,
    json: PathBuf,
    only: Option<Vec<char>>,
    markdown: bool,
}

impl Options {
    fn wants(&self, row: char) -> bool {
        self.only.as_ref().is_none_or(|rows| rows.contains(&row))
    }
}

fn parse_options() -> Result<Options, String> {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let mut reps: Option<usize> = None;
    let mut quick = env("BENCH_QUICK").is_some_and(|v| v != "0");
    let mut json = env("BENCH_JSON").map(PathBuf::from);
    let mut only = env("BENCH_ONLY");
    let mut markdown = false;
    if let Some(r) = env("BENCH_REPS") {
        reps = Some(
            r.parse()
                .map_err(|_| format!("BENCH_REPS={r:?} is not a number"))?,
        );
    }
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |flag: &str| args.next().ok_or(format!("{flag} needs a value\n{USAGE}"));
        match arg.as_str() {
            "--reps" => {
                let v = value("--reps")?;
                reps = Some(
                    v.parse()
                        .map_err(|_| format!("--reps {v:?} is not a number"))?,
                );
            }
            "--quick" => quick = true,
            "--json" => json = Some(PathBuf::from(value("--json")?)),
            "--only" => only = Some(value("--only")?),
            "--markdown" => markdown = true,
            "-h" | "--help" => return Err(USAGE.to_string()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    let reps = reps.unwrap_or(if quick { 1 } else { 5 });
    if reps == 0 {
        return Err("--reps must be at least 1".into());
    }
    let only = match only {
        None => None,
        Some(list) => {
            let rows: Vec<char> = list
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| match s {
                    "1" | "2" | "3" | "4" | "5" | "6" | "7" | "8" => {
                        Ok(s.chars().next().unwrap_or('0'))
                    }
                    _ => Err(format!("--only: no row {s:?} (rows are 1-8)")),
                })
                .collect::<Result<_, _>>()?;
            Some(rows)
        }
    };
    Ok(Options {
        reps,
        quick,
        json: json.unwrap_or_else(|| PathBuf::from("target/bench.json")),
        only,
        markdown,
    })
}

/// Sizes of the workloads, per repetition.
#[derive(Debug)]
struct Plan {
    serial_iters: usize,
    attr_iters: usize,
    par_tasks: usize,
    par_window: Duration,
    hot_hold_tasks: usize,
    hold: Duration,
    hot_hold_window: Duration,
    ceiling_window: Duration,
    hot_zero_tasks: usize,
    hot_zero_window: Duration,
    /// Windowed rows (2, 3, 4) alternate this many library and baseline
    /// slices per repetition (A B A B ...), each of the window above.
    slices: usize,
    /// Handoff samples per slice, and slices per side (alternating).
    handoff_samples: usize,
    handoff_slices: usize,
    held_locks: usize,
    held_ttl: Duration,
    held_periods: u32,
}

impl Plan {
    fn new(quick: bool) -> Self {
        let full = Self {
            serial_iters: 2000,
            attr_iters: 1000,
            par_tasks: 32,
            par_window: Duration::from_millis(300),
            hot_hold_tasks: 16,
            hold: Duration::from_millis(1),
            hot_hold_window: Duration::from_millis(500),
            ceiling_window: Duration::from_millis(150),
            hot_zero_tasks: 32,
            hot_zero_window: Duration::from_millis(300),
            slices: 2,
            handoff_samples: 25,
            handoff_slices: 4,
            held_locks: 10_000,
            held_ttl: Duration::from_secs(3),
            held_periods: 3,
        };
        if !quick {
            return full;
        }
        Self {
            serial_iters: 400,
            attr_iters: 200,
            par_window: Duration::from_millis(200),
            hot_hold_window: Duration::from_millis(400),
            ceiling_window: Duration::from_millis(150),
            hot_zero_window: Duration::from_millis(250),
            slices: 1,
            handoff_samples: 20,
            handoff_slices: 1,
            held_ttl: Duration::from_millis(1500),
            held_periods: 2,
            ..full
        }
    }
}

// Indexes into the metric list; the order is the table's.
const M1: usize = 0;
const M2: usize = 1;
const M3_GRANTS: usize = 2;
const M3_WAIT: usize = 3;
const M4_GRANTS: usize = 4;
const M4_FAIR: usize = 5;
const M5: usize = 6;
const M5_FLOOR: usize = 7;
const M6: usize = 8;
const M7: usize = 9;
const M7_CPU: usize = 10;
const M7_SAFE: usize = 11;
const M8: usize = 12;
const M8_RSS_REDIS: usize = 13;
const M8_RSS_MEMORY: usize = 14;

fn definitions(plan: &Plan) -> Vec<Metric> {
    let _ = plan;
    vec![
        Metric::new(
            "1",
            "serial acquire+release, one key: p50",
            Unit::Micros,
            "raw SET NX PX + EVALSHA del",
            Target::RatioAtMost(1.25),
        ),
        Metric::new(
            "2",
            "32 tasks, distinct keys: pairs/s",
            Unit::PerSec,
            "raw, 32 tasks, 1 conn",
            Target::RatioAtLeast(0.8),
        ),
        Metric::new(
            "3",
            "hot key, 16 tasks, hold 1 ms: grants/s",
            Unit::PerSec,
            "ceiling: hold loop, no lock",
            Target::AtLeast(900.0),
        ),
        Metric::new(
            "3",
            "hot key, 16 tasks, hold 1 ms: wait p99",
            Unit::Millis,
            "ideal FIFO: 15 x measured hold",
            Target::AtMost(32.0),
        ),
        Metric::new(
            "4",
            "hot key, 32 waiters, zero hold: grants/s",
            Unit::PerSec,
            "raw SET NX spin-retry",
            Target::AtLeast(15_000.0),
        ),
        Metric::new(
            "4",
            "hot key, 32 waiters: max/min grants per task",
            Unit::Factor,
            "raw SET NX spin-retry",
            Target::AtMost(1.5),
        ),
        Metric::new(
            "5",
            "single waiter handoff, release -> waiter holds: p50",
            Unit::Micros,
            "raw DEL+PUBLISH -> SET NX",
            Target::AtMost(150.0),
        ),
        Metric::new(
            "5",
            "floor: one raw round trip after the same 3 ms idle: p50",
            Unit::Micros,
            "",
            Target::Info,
        ),
        Metric::new(
            "6",
            "#[distributed_lock] fn, serial: p50",
            Unit::Micros,
            "hand-written with_lock",
            Target::RatioAtMost(1.05),
        ),
        Metric::new(
            "7",
            "10,000 held locks: commands per 100 locks per renewal period",
            Unit::Count,
            "naive: 1 script per lock, computed",
            Target::AtMost(1.0),
        ),
        Metric::new(
            "7",
            "10,000 held locks: client CPU while renewing (one core = 100)",
            Unit::Percent,
            "",
            Target::Info,
        ),
        Metric::new(
            "7",
            "10,000 held locks: lost, or taken by a second client, at the end",
            Unit::Count,
            "",
            Target::AtMost(0.0),
        ),
        Metric::new(
            "8",
            "memory backend, uncontended pair: p50",
            Unit::Micros,
            "raw redis pair",
            Target::RatioAtMost(0.1),
        ),
        Metric::new(
            "8",
            "RSS with 10,000 held locks, redis backend",
            Unit::KiB,
            "RSS before",
            Target::Info,
        ),
        Metric::new(
            "8",
            "RSS with 10,000 held locks, memory backend",
            Unit::KiB,
            "RSS before",
            Target::Info,
        ),
    ]
}

// ---- Row 6: the attribute against the same code written by hand. ----

static ATTR_CLIENT: OnceLock<LockClient> = OnceLock::new();

/// The client of the attributed function (set once the client is built).
fn attr_client() -> LockClient {
    ATTR_CLIENT
        .get()
        .cloned()
        .expect("the benchmark sets ATTR_CLIENT before calling the attributed function")
}

#[lock_runtime::distributed_lock(key = "bench:<id>", client = attr_client())]
async fn attributed(id: u32) -> Result<Option<LockInfo>, LockError> {
    let _ = id;
    Ok(lock_runtime::current_lock())
}

async fn hand_written(client: &LockClient, id: u32) -> Result<Option<LockInfo>, LockError> {
    client
        .with_lock(format!("bench:{id}"), async {
            lock_runtime::current_lock()
        })
        .await
}

/// `Ok` when the attribute really locks (the body sees its lock); otherwise
/// why not, e.g. while `#[distributed_lock]` is still a pass-through.
async fn attribute_status() -> Result<(), String> {
    let expected = format!("bench:{ATTR_ID}");
    match hand_written(&attr_client(), ATTR_ID).await {
        Ok(Some(info)) if info.key == expected => {}
        other => {
            return Err(format!(
                "the hand-written with_lock does not see its lock through current_lock() \
                 (got {other:?}): a runtime bug, not the attribute's"
            ));
        }
    }
    match attributed(ATTR_ID).await {
        Ok(Some(info)) if info.key == expected => Ok(()),
        Ok(Some(info)) => Err(format!(
            "the body ran under {:?}, expected {expected:?}",
            info.key
        )),
        Ok(None) => Err(
            "the attributed body ran without a lock (current_lock() is None): \
             #[distributed_lock] does not lock yet"
                .into(),
        ),
        Err(e) => Err(format!("the attributed function failed: {e}")),
    }
}

/// `n` attributed calls and `n` hand-written ones, alternating blocks of 100.
async fn serial_attr(
    client: &LockClient,
    n: usize,
    rep: usize,
) -> Result<(Vec<f64>, Vec<f64>), String> {
    let mut attr = Vec::with_capacity(n);
    let mut hand = Vec::with_capacity(n);
    for block in 0..n.div_ceil(100) {
        let attr_first = (block + rep).is_multiple_of(2);
        for side in [attr_first, !attr_first] {
            for _ in 0..100 {
                let t = Instant::now();
                let held = if side {
                    attributed(ATTR_ID).await
                } else {
                    hand_written(client, ATTR_ID).await
                }
                .map_err(|e| format!("row 6: {e}"))?;
                let elapsed = us(t.elapsed());
                if held.is_none() {
                    return Err("row 6: a body ran without its lock".into());
                }
                if side {
                    attr.push(elapsed)
                } else {
                    hand.push(elapsed)
                }
            }
        }
    }
    Ok((attr, hand))
}

// ---- The run. ----

/// Runs `slices` rounds of `a` and `b`, alternating (A B A B ..., or B A B A
/// ... when `a_first` is false), so slow moments of a shared machine hit
/// both sides. Returns every round's results.
async fn alternate<A, B>(
    a_first: bool,
    slices: usize,
    mut a: impl AsyncFnMut() -> Result<A, String>,
    mut b: impl AsyncFnMut() -> Result<B, String>,
) -> Result<(Vec<A>, Vec<B>), String> {
    let (mut xs, mut ys) = (Vec::with_capacity(slices), Vec::with_capacity(slices));
    for _ in 0..slices {
        if a_first {
            xs.push(a().await?);
            ys.push(b().await?);
        } else {
            ys.push(b().await?);
            xs.push(a().await?);
        }
    }
    Ok((xs, ys))
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

struct Prefixes {
    lib: String,
    raw: String,
}

struct RunInfo {
    redis_version: String,
}

async fn measure(
    opts: &Options,
    plan: &Plan,
    url: &str,
    prefixes: &Prefixes,
    metrics: &mut [Metric],
) -> Result<RunInfo, String> {
    let redis_client = redis::Client::open(url).map_err(|e| format!("REDIS_URL: {e}"))?;
    let build = async |builder: LockClientBuilder, what: &str| {
        builder
            .key_prefix(prefixes.lib.as_str())
            .build()
            .await
            .map_err(|e| format!("{what}: {e}"))
    };
    let lib = build(LockClient::builder().redis(url), "lock client").await?;
    let memory = build(LockClient::builder().memory(), "memory client").await?;
    // A second client on the same keys, for row 7's check that held locks
    // really stay held.
    let rival = build(LockClient::builder().redis(url), "second lock client").await?;
    let mut raw = Raw::connect(&redis_client, &prefixes.raw).await?;
    let _ = ATTR_CLIENT.set(lib.clone());
    let redis_version = redis_version(&redis_client).await.unwrap_or_default();

    // Warm-up: connections, scripts, the notice subscription, allocator.
    let warm = Instant::now();
    let raw_serial = raw.key("serial");
    for i in 0..200 {
        rows::lib_pair(&lib, "serial").await?;
        rows::lib_pair(&memory, "serial").await?;
        raw.pair(&raw_serial, &bench::raw::value(9, i)).await?;
    }
    rows::hot_lib(&lib, "hot", 4, Duration::ZERO, Duration::from_millis(50)).await?;
    rows::handoff_lib(&lib, "handoff", 3).await?;
    rows::handoff_raw(&raw, &redis_client, "handoff", 3).await?;
    eprintln!("warm-up done in {:.1} s", warm.elapsed().as_secs_f64());

    let attr = if opts.wants('6') {
        attribute_status().await
    } else {
        Ok(())
    };
    if let Err(why) = &attr {
        eprintln!("row 6 NOT YET: {why}");
        metrics[M6].not_measured = Some(why.clone());
    }

    for rep in 0..opts.reps {
        let t = Instant::now();
        let lib_first = rep.is_multiple_of(2);
        eprint!("rep {}/{}:", rep + 1, opts.reps);
        // Serial acquire-release: on Redis (row 1), then embedded (row 8).
        for (row, metric, client) in [('1', M1, &lib), ('8', M8, &memory)] {
            if !opts.wants(row) {
                continue;
            }
            eprint!(" {row}");
            let iters = plan.serial_iters;
            let (l, r) = rows::serial(client, "serial", &mut raw, &raw_serial, iters, rep).await?;
            metrics[metric].record(p50(&l), p50(&r));
        }
        if opts.wants('6') && attr.is_ok() {
            eprint!(" 6");
            // The same client as the attribute's, through the same accessor.
            let (a, h) = serial_attr(&attr_client(), plan.attr_iters, rep).await?;
            metrics[M6].record(p50(&a), p50(&h));
        }
        if opts.wants('5') {
            eprint!(" 5");
            let n = plan.handoff_samples;
            let (l, r) = alternate(
                lib_first,
                plan.handoff_slices,
                async || rows::handoff_lib(&lib, "handoff", n).await,
                async || rows::handoff_raw(&raw, &redis_client, "handoff", n).await,
            )
            .await?;
            metrics[M5].record(p50(&l.concat()), p50(&r.concat()));
            // Any hand-over needs the release's round trip, started from idle.
            let floor = rows::idle_round_trip(&raw, "floor", n).await?;
            metrics[M5_FLOOR].values.push(p50(&floor));
        }
        if opts.wants('2') {
            eprint!(" 2");
            let (tasks, window) = (plan.par_tasks, plan.par_window);
            let (l, r) = alternate(
                lib_first,
                plan.slices,
                async || rows::parallel_lib(&lib, tasks, window).await,
                async || rows::parallel_raw(&raw, tasks, window).await,
            )
            .await?;
            metrics[M2].record(mean(&l), mean(&r));
        }
        if opts.wants('4') {
            eprint!(" 4");
            let (tasks, window) = (plan.hot_zero_tasks, plan.hot_zero_window);
            let (l, r) = alternate(
                lib_first,
                plan.slices,
                async || rows::hot_lib(&lib, "hot0", tasks, Duration::ZERO, window).await,
                async || rows::hot_raw_spin(&raw, "hot0", tasks, Duration::ZERO, window).await,
            )
            .await?;
            metrics[M4_GRANTS].record(Hot::rate_of(&l), Hot::rate_of(&r));
            metrics[M4_FAIR].record(Hot::fairness_of(&l), Hot::fairness_of(&r));
            let (l_min, l_max) = Hot::grant_range(&l);
            let (r_min, r_max) = Hot::grant_range(&r);
            metrics[M4_FAIR].notes.push(format!(
                "rep {}: grants per task in a {} ms slice: library {l_min}-{l_max}, raw spin \
                 {r_min}-{r_max}; wait p99: library {:.2} ms, raw spin {:.2} ms",
                rep + 1,
                window.as_millis(),
                p99_ms(&Hot::pooled(&l, |h| &h.waits)),
                p99_ms(&Hot::pooled(&r, |h| &h.waits)),
            ));
        }
        if opts.wants('3') {
            eprint!(" 3");
            let (tasks, hold, window) = (plan.hot_hold_tasks, plan.hold, plan.hot_hold_window);
            let ceiling_window = plan.ceiling_window;
            let (l, ceilings) = alternate(
                lib_first,
                plan.slices,
                async || rows::hot_lib(&lib, "hot1", tasks, hold, window).await,
                async || rows::hold_ceiling(hold, ceiling_window).await,
            )
            .await?;
            let waits = Hot::pooled(&l, |h| &h.waits);
            let mean_hold = mean(&Hot::pooled(&l, |h| &h.holds));
            let ceiling = mean(&ceilings.iter().map(|c| c.0).collect::<Vec<_>>());
            let ceiling_hold = mean(&ceilings.iter().map(|c| c.1).collect::<Vec<_>>());
            metrics[M3_GRANTS].record(Hot::rate_of(&l), ceiling);
            let queue_wait_ms = (tasks - 1) as f64 * mean_hold / 1e3;
            metrics[M3_WAIT].record(p99_ms(&waits), queue_wait_ms);
            let (min, max) = Hot::grant_range(&l);
            metrics[M3_GRANTS].notes.push(format!(
                "rep {}: mean hold {:.0} us under the lock, {:.0} us in the ceiling loop; \
                 grants per task in a {} ms slice {min}-{max}; wait p50 {:.2} ms, max {:.2} ms",
                rep + 1,
                mean_hold,
                ceiling_hold,
                window.as_millis(),
                median(&waits) / 1e3,
                report::percentile(&waits, 100.0) / 1e3,
            ));
        }
        if opts.wants('7') {
            eprint!(" 7");
            let run = rows::held_under_watchdog(
                &lib,
                &rival,
                &redis_client,
                plan.held_locks,
                plan.held_ttl,
                plan.held_periods,
            )
            .await?;
            metrics[M7].record(run.per_100_per_period, 100.0);
            metrics[M7_CPU].values.push(run.cpu_percent);
            metrics[M7].notes.push(format!(
                "rep {}: {} locks, ttl {} ms, taken in {:.0} ms; per 100 locks per period: \
                 {:.2} script calls, {:.1} server-side commands (INFO total_commands_processed, \
                 counts the GET/PEXPIRE inside scripts); keys per script call min {} median {} \
                 max {}; lost at the end: {}; pub/sub (UN)SUBSCRIBE not counted: {}",
                rep + 1,
                plan.held_locks,
                plan.held_ttl.as_millis(),
                run.acquire_ms,
                run.scripts_per_100_per_period,
                run.server_per_100_per_period,
                run.keys_per_script.0,
                run.keys_per_script.1,
                run.keys_per_script.2,
                run.lost,
                run.pubsub,
            ));
            metrics[M7_SAFE]
                .values
                .push((run.lost + run.takeable) as f64);
            if run.lost + run.takeable > 0 {
                metrics[M7_SAFE].notes.push(format!(
                    "rep {}: {} guards reported lost, {} locks taken by a second client while \
                     their guards were held",
                    rep + 1,
                    run.lost,
                    run.takeable
                ));
            }
        }
        eprintln!("  ({:.1} s)", t.elapsed().as_secs_f64());
    }
    Ok(RunInfo { redis_version })
}

async fn redis_version(client: &redis::Client) -> Result<String, String> {
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    Ok(info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("")
        .trim()
        .to_string())
}

/// Deletes this run's keys from a server the benchmark did not start.
async fn cleanup(url: &str, prefixes: &Prefixes) -> Result<usize, String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    let mut deleted = 0;
    for prefix in [&prefixes.lib, &prefixes.raw] {
        let mut cursor = 0u64;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(format!("{prefix}*"))
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
            if !keys.is_empty() {
                let n: usize = redis::cmd("DEL")
                    .arg(&keys)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| e.to_string())?;
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

// ---- RSS, measured in a fresh process so earlier rows do not blur it. ----

const RSS_LOCKS: usize = 10_000;

/// Child mode: `bench --rss-probe <memory|redis> <n> <prefix> [url]`. Prints
/// `"<rss before KiB> <rss with n held KiB>"`.
fn rss_probe_main(args: &[String]) -> ExitCode {
    let result = (|| -> Result<(f64, f64), String> {
        let [backend, n, prefix, rest @ ..] = args else {
            return Err("usage: bench --rss-probe <memory|redis> <n> <prefix> [url]".into());
        };
        let n: usize = n.parse().map_err(|_| "n must be a number")?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        runtime.block_on(async {
            let builder = LockClient::builder().key_prefix(prefix.as_str());
            let builder = match (backend.as_str(), rest) {
                ("memory", _) => builder.memory(),
                ("redis", [url]) => builder.redis(url.as_str()),
                _ => return Err(format!("bad probe backend {backend:?}")),
            };
            let client = builder.build().await.map_err(|e| e.to_string())?;
            rows::lib_pair(&client, "rss:warm").await?;
            let before = report::rss_kib().ok_or("no VmRSS in /proc/self/status")?;
            let guards = rows::take_many(&client, "rss", n, Duration::from_secs(30)).await?;
            tokio::time::sleep(Duration::from_millis(50)).await;
            let with = report::rss_kib().ok_or("no VmRSS in /proc/self/status")?;
            rows::release_many(guards).await?;
            Ok((before, with))
        })
    })();
    match result {
        Ok((before, with)) => {
            println!("{before} {with}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rss probe: {e}");
            ExitCode::FAILURE
        }
    }
}

fn rss_probe(backend: &str, prefix: &str, url: &str) -> Result<(f64, f64), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let output = std::process::Command::new(exe)
        .args(["--rss-probe", backend, &RSS_LOCKS.to_string(), prefix, url])
        .output()
        .map_err(|e| format!("rss probe: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "rss probe ({backend}) failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let mut it = text.split_whitespace().map(str::parse::<f64>);
    match (it.next(), it.next()) {
        (Some(Ok(before)), Some(Ok(with))) => Ok((before, with)),
        _ => Err(format!("rss probe ({backend}): unexpected output {text:?}")),
    }
}

/// Resolves on SIGINT or SIGTERM, naming it.
async fn interrupted() -> &'static str {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return "SIGINT";
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => "SIGINT",
        _ = term.recv() => "SIGTERM",
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--rss-probe") {
        return rss_probe_main(&args[1..]);
    }
    let opts = match parse_options() {
        Ok(opts) => opts,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    match run(&opts) {
        Ok(true) => ExitCode::SUCCESS,
        // Targets missed: still a successful measurement.
        Ok(false) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(opts: &Options) -> Result<bool, String> {
    let started = Instant::now();
    let load_before = report::load_average();
    // Our own server unless REDIS_URL names a loopback one. `_server` kills
    // it when dropped: on return, on error and when a panic unwinds.
    let (_server, url, own) = match std::env::var("REDIS_URL").ok().filter(|u| !u.is_empty()) {
        Some(url) => {
            check_loopback(&url)?;
            (None, url, false)
        }
        None => {
            let server = test_support::RedisServer::try_start(&[])?;
            let url = server.url();
            (Some(server), url, true)
        }
    };
    let pid = std::process::id();
    let prefixes = Prefixes {
        lib: format!("lockbench{pid}:"),
        raw: format!("rawbench{pid}:"),
    };
    let plan = Plan::new(opts.quick);
    eprintln!(
        "bench: redis {} ({}), {} repetition(s){}",
        url,
        if own {
            "started for this run"
        } else {
            "REDIS_URL"
        },
        opts.reps,
        if opts.quick { ", quick" } else { "" }
    );
    let mut metrics = definitions(&plan);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    // Ctrl-C or SIGTERM ends the run through the normal return path, so the
    // server is still stopped by `_server`'s Drop.
    let info = runtime.block_on(async {
        tokio::select! {
            result = measure(opts, &plan, &url, &prefixes, &mut metrics) => result,
            signal = interrupted() => Err(format!("interrupted by {signal}")),
        }
    })?;

    if opts.wants('8') {
        for (index, backend) in [(M8_RSS_REDIS, "redis"), (M8_RSS_MEMORY, "memory")] {
            let (before, with) = rss_probe(backend, &prefixes.lib, &url)?;
            let m = &mut metrics[index];
            m.record(with, before);
            m.notes.push(format!(
                "+{:.0} KiB for {RSS_LOCKS} locks = {:.0} bytes per held lock \
                 (fresh process, {backend} backend, measured once)",
                with - before,
                (with - before) * 1024.0 / RSS_LOCKS as f64
            ));
        }
    }
    if !own {
        match runtime.block_on(cleanup(&url, &prefixes)) {
            Ok(n) => eprintln!("removed {n} benchmark keys from {url}"),
            Err(e) => eprintln!("could not remove the benchmark keys: {e}"),
        }
    }
    drop(runtime);

    let metrics: Vec<Metric> = metrics
        .into_iter()
        .filter(|m| opts.wants(m.row.chars().next().unwrap_or('0')))
        .collect();
    let (date, time) = report::utc_now();
    let machine = report::machine();
    let cores = machine.get("cores").cloned().unwrap_or_default();
    let load_after = report::load_average();
    let load = |l: Option<f64>| l.map_or("?".to_string(), |l| format!("{l:.2}"));
    println!(
        "\nlock-runtime benchmark, {date} {time}, {cores} cores, redis {}; medians of {} \
         repetition(s); load average {} before, {} after\n",
        info.redis_version,
        opts.reps,
        load(load_before),
        load(load_after)
    );
    print!("{}", report::table(&metrics));
    let notes: Vec<String> = metrics
        .iter()
        .flat_map(|m| {
            let head = m
                .not_measured
                .iter()
                .map(move |why| format!("row {}: not yet: {why}", m.row));
            head.chain(m.notes.iter().map(move |n| format!("row {}: {n}", m.row)))
        })
        .collect();
    if !notes.is_empty() {
        println!();
        for n in &notes {
            println!("  {n}");
        }
    }
    if opts.markdown {
        println!("\n{}", report::markdown(&metrics));
    }
    let all_pass = metrics.iter().all(|m| m.pass() != Some(false));
    let json = serde_json::json!({
        "date": date,
        "time": time,
        "machine": machine,
        "redis_version": info.redis_version,
        "redis": if own { "started by the benchmark" } else { "REDIS_URL" },
        "load_average": { "before": load_before, "after": load_after },
        "repetitions": opts.reps,
        "quick": opts.quick,
        "plan": format!("{plan:?}"),
        "rows": report::json_rows(&metrics),
        "all_targets_met": all_pass,
    });
    if let Some(dir) = opts.json.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {dir:?}: {e}"))?;
    }
    let text = serde_json::to_string_pretty(&json).map_err(|e| e.to_string())?;
    std::fs::write(&opts.json, text).map_err(|e| format!("cannot write {:?}: {e}", opts.json))?;
    println!(
        "\nwrote {} ({:.0} s in all)",
        opts.json.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(all_pass)
}
