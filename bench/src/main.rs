//! Benchmark of `lock-runtime` against raw redis-rs and rslock (the peer),
//! row by row as in issues 6 and 14's Targets. See BENCHMARKS.md for what
//! each row measures.
//!
//! ```text
//! cargo run --release -p bench -- [--reps N] [--quick] [--json PATH]
//!                                 [--svg PATH] [--only 1,3,7] [--markdown]
//! ```
//!
//! Starts its own `redis-server` on a free loopback port (killed on exit)
//! unless `REDIS_URL` names a loopback server. Every row is measured together
//! with its baselines in each repetition; the table shows medians over
//! the repetitions. The hot-key rows' wait times are also drawn as an SVG.

mod attr;
mod chart;
mod cpu;
mod curves;
mod defs;
mod fcall;
mod held;
mod http;
mod instructions;
mod load;
mod measure;
mod probe;
mod raw;
mod report;
mod rows;
mod serve;
mod server;
mod server_cost;
mod sides;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use defs::{M8_RSS_MEMORY, M8_RSS_REDIS, definitions};
use measure::{Prefixes, measure};
use probe::RSS_LOCKS;
use report::Metric;
use server::check_loopback;

const USAGE: &str = "\
usage: bench [--reps N] [--quick] [--json PATH] [--svg PATH] [--only ROWS] [--markdown]

  --reps N      repetitions (default 5, 1 with --quick); medians are reported
  --quick       short smoke run (< 25 s), for CI
  --json PATH   where to write the results (default target/bench.json)
  --svg PATH    where to draw the hot-key rows' wait times (default beside
                the JSON: target/bench-waits.svg)
  --only ROWS   rows to run, e.g. 1,5,7 (default all: 1-12; 11 and 12, the
                HTTP rows, need `wrk`: apt-get install wrk)
  --markdown    also print the table as Markdown

  bench --curves [--quick] [--svg PATH] [--json PATH]: the cost curves (held
  locks, waiters on one key, distinct keys); bench --fcall [--reps N]: the
  library's acquire and release via FCALL against EVALSHA (BENCHMARKS.md);
  bench --server-instructions [--ops N]: what a pair and a record cost
  Redis in instructions (valgrind), against the raw pair and record;
  bench --instructions [--n N] [--only pair,route]: the client's instructions
  per pair and per request under callgrind, against the hand-rolled side;
  bench --cpu [--runs R] [--n N] [--only pair32]: the same scenarios' CPU
  time per pair and per request, natively (what instructions do not weigh);
  bench --serve lock|idem lib|raw|by-hand: one side of row 11 or 12 (by-hand:
  the library's own commands from a hand-rolled middleware; idem also write,
  commit, commit-here: the layer's handler writing an order, alone, committed
  with its record through a Redis commit store, or in its record on the lock
  server), served until
  Ctrl-C or SIGTERM, for a profiler while `wrk` loads it (it prints the command)

environment: BENCH_REPS, BENCH_QUICK=1, BENCH_JSON, BENCH_SVG, BENCH_ONLY (flags
win); REDIS_URL=redis://127.0.0.1:PORT uses that server (loopback only) instead
of starting one; REDIS_SERVER names the redis-server binary.

  --server redis|valkey|redis8  the server every mode starts (default:
                LOCK_TEST_SERVER, else redis; valkey and redis8 are `cargo xtask
                deps`'s, or VALKEY_SERVER / REDIS8_SERVER); the report names the
                server it measured.";

/// The rows there are, as `--only` names them.
/// Rows 10, 11 and 12 are `x`, `y` and `z` inside.
const ROWS: [char; 12] = ['1', '2', '3', '4', '5', '6', '7', '8', '9', 'x', 'y', 'z'];

/// The name of a row as the table shows it (`x` is "10").
fn row_name(row: char) -> &'static str {
    match row {
        'x' => "10",
        'y' => "11",
        'z' => "12",
        '1' => "1",
        '2' => "2",
        '3' => "3",
        '4' => "4",
        '5' => "5",
        '6' => "6",
        '7' => "7",
        '8' => "8",
        _ => "9",
    }
}

/// The inside name of a row as the table shows it ("10" is `x`).
fn row_id(row: &str) -> char {
    match row {
        "10" => 'x',
        "11" => 'y',
        "12" => 'z',
        _ => row.chars().next().unwrap_or('0'),
    }
}

struct Options {
    reps: usize,
    quick: bool,
    json: PathBuf,
    svg: PathBuf,
    only: Option<Vec<char>>,
    markdown: bool,
}

impl Options {
    fn wants(&self, row: char) -> bool {
        self.only.as_ref().is_none_or(|rows| rows.contains(&row))
    }
}

fn parse_options(args: &[String]) -> Result<Options, String> {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let mut reps: Option<usize> = None;
    let mut quick = env("BENCH_QUICK").is_some_and(|v| v != "0");
    let mut json = env("BENCH_JSON").map(PathBuf::from);
    let mut svg = env("BENCH_SVG").map(PathBuf::from);
    let mut only = env("BENCH_ONLY");
    let mut markdown = false;
    if let Some(r) = env("BENCH_REPS") {
        reps = Some(
            r.parse()
                .map_err(|_| format!("BENCH_REPS={r:?} is not a number"))?,
        );
    }
    let mut args = args.iter().cloned();
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
            "--svg" => svg = Some(PathBuf::from(value("--svg")?)),
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
                .map(|s| {
                    let mut chars = s.chars();
                    match (chars.next(), chars.next()) {
                        _ if ["10", "11", "12"].contains(&s) => Ok(row_id(s)),
                        (Some(row), None) if row.is_ascii_digit() && ROWS.contains(&row) => Ok(row),
                        _ => Err(format!("--only: no row {s:?} (rows are 1-12)")),
                    }
                })
                .collect::<Result<_, _>>()?;
            Some(rows)
        }
    };
    let json = json.unwrap_or_else(|| PathBuf::from("target/bench.json"));
    // Beside the JSON: target/bench.json -> target/bench-waits.svg.
    let svg = svg.unwrap_or_else(|| {
        let stem = json.file_stem().unwrap_or_default().to_string_lossy();
        json.with_file_name(format!("{stem}-waits.svg"))
    });
    Ok(Options {
        reps,
        quick,
        json,
        svg,
        only,
        markdown,
    })
}

/// Sizes of the workloads, per repetition.
#[derive(Debug)]
struct Plan {
    /// Rows 1 and 8: pairs per side; row 6: calls per side.
    serial_iters: usize,
    attr_iters: usize,
    /// Row 2: tasks on distinct keys, and the window of a slice.
    par_tasks: usize,
    par_window: Duration,
    /// Row 3: tasks on one key, their hold, the window of a slice, and the
    /// window of a ceiling slice.
    hot_hold_tasks: usize,
    hold: Duration,
    hot_hold_window: Duration,
    ceiling_window: Duration,
    /// Row 4: tasks on one key (zero hold), and the window of a slice.
    hot_zero_tasks: usize,
    hot_zero_window: Duration,
    /// Row 9: tasks in each of the two processes, and their one window.
    cross_tasks: usize,
    cross_window: Duration,
    /// Windowed rows (2, 3, 4) run this many slices of each side per
    /// repetition, interleaved (A B C A B C ...), each of the window above.
    slices: usize,
    /// Row 5: samples per slice, and slices per side (interleaved).
    handoff_samples: usize,
    handoff_slices: usize,
    /// Row 7: locks held, their lease, and the renewal periods counted.
    held_locks: usize,
    held_ttl: Duration,
    held_periods: u32,
    /// Rows 11 and 12: `wrk`'s warm-up, then its measured window, per side.
    http_warm: Duration,
    http_window: Duration,
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
            cross_tasks: 16,
            cross_window: Duration::from_millis(500),
            slices: 2,
            handoff_samples: 25,
            handoff_slices: 4,
            held_locks: 10_000,
            held_ttl: Duration::from_secs(3),
            held_periods: 3,
            http_warm: Duration::from_secs(1),
            http_window: Duration::from_secs(3),
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
            cross_window: Duration::from_millis(300),
            slices: 1,
            handoff_samples: 20,
            handoff_slices: 1,
            held_ttl: Duration::from_millis(1500),
            held_periods: 2,
            http_window: Duration::from_secs(1),
            ..full
        }
    }
}

/// Deletes this run's keys from a server the benchmark did not start.
async fn cleanup(url: &str, prefixes: &Prefixes) -> Result<usize, String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    let mut deleted = 0;
    for prefix in prefixes.all() {
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
    // Row 1's fenced writes leave their record under the fence's own
    // namespace, outside the prefixes.
    let record = lock_runtime::fence::record_key(&format!("{}fenced", prefixes.raw));
    let n: usize = redis::cmd("DEL")
        .arg(record)
        .query_async(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    Ok(deleted + n)
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

/// Takes `--server redis|valkey|redis8` out of `args` and makes it the server every
/// mode starts ([`test_support::ServerKind::choose`]); without it,
/// `LOCK_TEST_SERVER` chooses, Redis by default. Says which on stderr.
fn take_server(mut args: Vec<String>) -> Result<Vec<String>, String> {
    if let Some(at) = args.iter().position(|a| a == "--server") {
        let name = args
            .get(at + 1)
            .cloned()
            .ok_or("--server needs redis, valkey or redis8")?;
        test_support::ServerKind::parse(&name)
            .map_err(|_| format!("--server {name:?}: expected redis, valkey or redis8"))?
            .choose()?;
        args.drain(at..at + 2);
    }
    let kind = test_support::ServerKind::try_current()?;
    if kind == test_support::ServerKind::Redis8
        && test_support::redis8_flavor().as_deref() == Some("tests")
    {
        return Err(format!(
            "the Redis 8 in {} is the build CI makes for the tests (glibc's allocator, \
             -O1), not Redis as it ships: run `cargo xtask deps`, which builds that \
             (or set REDIS8_SERVER)",
            test_support::redis8_dir().display()
        ));
    }
    if std::env::var_os("REDIS_URL").is_none_or(|u| u.is_empty()) {
        eprintln!("bench: server {} (started for this run)", kind.version()?);
    }
    Ok(args)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(code) = probe::child_main(&args) {
        return code;
    }
    if let Some(code) = curves::child_main(&args) {
        return code;
    }
    if let Some(code) = instructions::child_main(&args) {
        return code;
    }
    let args = match take_server(args) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("bench: {e}");
            return ExitCode::from(2);
        }
    };
    match args.first().map(String::as_str) {
        Some("--curves") => return curves::main(&args[1..]),
        Some("--fcall") => return fcall::main(&args[1..]),
        Some("--server-instructions") => return server_cost::main(&args[1..]),
        Some("--instructions") => return instructions::main(&args[1..]),
        Some("--cpu") => return cpu::main(&args[1..]),
        Some("--serve") => return serve::main(&args[1..]),
        _ => {}
    }
    let opts = match parse_options(&args) {
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
    let prefixes = Prefixes::new();
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
    let mut metrics = definitions();
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
            let (before, with) = probe::rss(backend, &prefixes.lib, &url)?;
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
        .filter(|m| opts.wants(row_id(m.row)))
        .collect();
    let (date, time) = report::utc_now();
    let machine = report::machine();
    let cores = machine.get("cores").cloned().unwrap_or_default();
    let load_after = report::load_average();
    let load = |l: Option<f64>| l.map_or("?".to_string(), |l| format!("{l:.2}"));
    println!(
        "\nlock-runtime benchmark, {date} {time}, {cores} cores, {}; medians of {} \
         repetition(s); load average {} before, {} after\n",
        info.server,
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
        "server": info.server,
        "redis_version": info.redis_version,
        "redis": if own { "started by the benchmark" } else { "REDIS_URL" },
        "load_average": { "before": load_before, "after": load_after },
        "repetitions": opts.reps,
        "quick": opts.quick,
        "plan": format!("{plan:?}"),
        "rows": report::json_rows(&metrics),
        "all_targets_met": all_pass,
        "chart": opts.svg,
    });
    if let Some(dir) = opts.json.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {dir:?}: {e}"))?;
    }
    let text = serde_json::to_string_pretty(&json).map_err(|e| e.to_string())?;
    std::fs::write(&opts.json, text).map_err(|e| format!("cannot write {:?}: {e}", opts.json))?;
    let panels = chart::write(&opts.svg, &info.panels)?;
    println!(
        "\nwrote {}{} ({:.0} s in all)",
        opts.json.display(),
        if panels > 0 {
            format!(" and {}", opts.svg.display())
        } else {
            String::new()
        },
        started.elapsed().as_secs_f64()
    );
    Ok(all_pass)
}
