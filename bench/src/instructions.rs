//! `bench --instructions`: the client's CPU per pair and per request as
//! instructions counted by `valgrind --tool=callgrind`, which do not depend
//! on the machine's load (wall-clock throughput on a shared machine does).
//!
//! Each scenario runs in a child process of this binary under callgrind, on
//! a `current_thread` runtime, so everything the process does for a pair or
//! a request (the library or the hand-rolled code, redis-rs, axum, tokio's
//! scheduler and I/O driver) runs on one thread inside one function,
//! `measured`, and only that function is counted (`--toggle-collect`):
//! connecting, loading scripts and a warm-up are left out. The figures are
//! the instructions of that function divided by its pairs (or requests),
//! with the calls to the C allocator (`malloc`, `calloc`, `realloc`,
//! `posix_memalign`) counted from the same profile. Time in the kernel
//! (the system calls themselves) is not counted; the calls are, where the
//! two sides differ in how often they sleep.
//!
//! Scenarios, each with the library and its hand-rolled baseline:
//!
//! * `pair`: row 1, serial acquire + release of one key (`client.lock(key)
//!   .acquire()`, `guard.release()`) against `SET NX PX` + compare-and-delete
//!   `EVALSHA`; and the library's two scripts sent by hand (no client code);
//! * `pair32`: row 2, 32 tasks on distinct keys, the same sides;
//! * `route` and `route32`: row 11, `POST /orders/{id}/pay` through the axum
//!   router (called as a tower service, so without hyper's HTTP parsing,
//!   which both sides share), one request at a time and 32 at once, each
//!   with an id of its own: `LockLayer` against `bench/src/http.rs`'s
//!   hand-rolled middleware;
//! * `permit`: row 10, a semaphore's permit (4 permits) acquired and
//!   released, one at a time, against the library's own mutex pair;
//! * `idem` and `idem32`: row 12, the same route and requests, each with an
//!   `Idempotency-Key` of its own: `IdempotencyLayer` (its defaults) against
//!   the hand-rolled claim (`SET NX PX`) + store (`SET PX`) middleware.
//!
//! The report shows each side's instructions and allocations per pair or
//! request and the ratio to the baseline, and the functions where the
//! library's run spends the most instructions more than the baseline's
//! (inclusive: a function with everything it calls), per pair or request.
//!
//! One function is counted as it does not run natively: valgrind hides the
//! CPU's SHA extensions, so sha2 runs its portable SHA-256 under callgrind
//! where natively it uses the SHA
//! instructions; the report says how much of a scenario that is.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicU64, Ordering};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use lock_runtime::LockClient;
use tower::ServiceExt;

use crate::http::{Side as HttpSide, app};
use redis::aio::ConnectionManager;

use crate::raw::{Raw, value};

const USAGE: &str = "\
usage: bench --instructions [--n N] [--only SCENARIOS] [--top K] [--dir PATH]

  --n N           pairs or requests per scenario and side (default 2000)
  --only LIST     comma-separated scenarios: pair, pair32, route, route32,
                  idem, idem32, permit
                  (default all)
  --top K         functions of the difference to show (default 25)
  --dir PATH      where the callgrind profiles go (default
                  target/instructions); `callgrind_annotate` reads them

Needs valgrind (apt-get install valgrind). Always starts its own
redis-server (REDIS_SERVER names the binary).";

/// What the child runs: the scenario, the side, the server, the count.
pub(crate) const CHILD: &str = "--instructions-child";

/// What a scenario drives.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Lock pairs on the client.
    Pair,
    /// The locked route (row 11).
    Route,
    /// The idempotent route (row 12).
    Idem,
    /// A semaphore's permit against the library's mutex (row 10).
    Permit,
}

/// The scenarios: name, concurrent tasks, what they drive.
pub(crate) const SCENARIOS: [(&str, usize, Kind); 7] = [
    ("pair", 1, Kind::Pair),
    ("pair32", 32, Kind::Pair),
    ("route", 1, Kind::Route),
    ("route32", 32, Kind::Route),
    ("idem", 1, Kind::Idem),
    ("idem32", 32, Kind::Idem),
    ("permit", 1, Kind::Permit),
];

/// The sides of a scenario: the library first, the baseline second, and
/// for the pairs the library's scripts sent by hand and the raw pair on a
/// `ConnectionManager` configured as the library's connection.
pub(crate) fn sides(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::Pair => &["lib", "raw", "scripts", "managed"],
        Kind::Route | Kind::Idem => &["lib", "raw"],
        // The baseline is the library's own mutex pair, as in row 10.
        Kind::Permit => &["permit", "lib"],
    }
}

/// `bench --instructions ...`.
pub(crate) fn main(args: &[String]) -> ExitCode {
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench --instructions: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The child process: `--instructions-child SCENARIO SIDE URL N`.
pub(crate) fn child_main(args: &[String]) -> Option<ExitCode> {
    if args.first().map(String::as_str) != Some(CHILD) {
        return None;
    }
    let [_, scenario, side, url, n] = args else {
        eprintln!("{CHILD}: expected SCENARIO SIDE URL N");
        return Some(ExitCode::from(2));
    };
    let result = n
        .parse::<usize>()
        .map_err(|_| format!("{CHILD}: {n:?} is not a number"))
        .and_then(|n| child(scenario, side, url, n));
    Some(match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{CHILD} {scenario} {side}: {e}");
            ExitCode::FAILURE
        }
    })
}

struct Options {
    n: usize,
    only: Option<Vec<String>>,
    top: usize,
    dir: PathBuf,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut opts = Options {
        n: 2000,
        only: None,
        top: 25,
        dir: PathBuf::from("target/instructions"),
    };
    let mut flags = Flags::new(args, USAGE);
    while let Some(arg) = flags.next() {
        match arg {
            "--n" => opts.n = flags.number(arg)?,
            "--top" => opts.top = flags.number(arg)?,
            "--dir" => opts.dir = PathBuf::from(flags.value(arg)?),
            "--only" => opts.only = Some(flags.scenarios(arg)?),
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(flags.unknown(other)),
        }
    }
    Ok(opts)
}

/// The scenarios `only` names (every one without it), in their order.
pub(crate) fn chosen(
    only: Option<&[String]>,
) -> impl Iterator<Item = &'static (&'static str, usize, Kind)> {
    SCENARIOS
        .iter()
        .filter(move |s| only.is_none_or(|o| o.iter().any(|n| n == s.0)))
}

/// The `--flag value` arguments of `--instructions` and `--cpu`, each
/// error saying the mode's usage.
pub(crate) struct Flags<'a> {
    args: std::slice::Iter<'a, String>,
    usage: &'a str,
}

impl<'a> Flags<'a> {
    pub(crate) fn new(args: &'a [String], usage: &'a str) -> Self {
        let args = args.iter();
        Self { args, usage }
    }

    /// The next flag.
    pub(crate) fn next(&mut self) -> Option<&'a str> {
        self.args.next().map(String::as_str)
    }

    /// The value after `flag`.
    pub(crate) fn value(&mut self, flag: &str) -> Result<String, String> {
        let usage = self.usage;
        self.args
            .next()
            .cloned()
            .ok_or_else(|| format!("{flag} needs a value\n{usage}"))
    }

    /// The positive number after `flag`.
    pub(crate) fn number(&mut self, flag: &str) -> Result<usize, String> {
        let v = self.value(flag)?;
        v.parse::<usize>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or(format!("{flag} {v:?} is not a positive number"))
    }

    /// The scenarios the comma-separated list after `flag` names.
    pub(crate) fn scenarios(&mut self, flag: &str) -> Result<Vec<String>, String> {
        let list: Vec<String> = self
            .value(flag)?
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
        match list.iter().find(|s| !SCENARIOS.iter().any(|c| c.0 == *s)) {
            Some(bad) => Err(format!("{flag}: no scenario {bad:?}\n{}", self.usage)),
            None => Ok(list),
        }
    }

    pub(crate) fn unknown(&self, arg: &str) -> String {
        format!("unknown argument {arg:?}\n{}", self.usage)
    }
}

/// What one side's profile says, per pair or request.
struct Profile {
    instructions: f64,
    allocations: f64,
    /// Inclusive instructions per function (callgrind_annotate's names).
    inclusive: HashMap<String, f64>,
}

fn run(args: &[String]) -> Result<(), String> {
    let opts = parse(args)?;
    Command::new("valgrind")
        .arg("--version")
        .output()
        .map_err(|e| format!("valgrind cannot be run ({e}): apt-get install valgrind"))?;
    std::fs::create_dir_all(&opts.dir).map_err(|e| format!("create {:?}: {e}", opts.dir))?;
    let exe = std::env::current_exe().map_err(|e| format!("this binary's path: {e}"))?;
    let server = test_support::RedisServer::try_start(&[])?;
    let url = server.url();
    let mut lines = Vec::new();
    let mut diffs = Vec::new();
    for (scenario, tasks, kind) in chosen(opts.only.as_deref()) {
        let mut profiles = Vec::new();
        for side in sides(*kind) {
            let out = opts.dir.join(format!("{scenario}-{side}.callgrind"));
            eprintln!(
                "bench --instructions: {scenario} ({tasks} task(s)), {side}: {} ...",
                opts.n
            );
            callgrind(&exe, &out, scenario, side, &url, opts.n)?;
            profiles.push((*side, read_profile(&out, opts.n)?));
        }
        let base = &profiles[1].1;
        for (side, p) in &profiles {
            lines.push(format!(
                "| {scenario} | {side} | {:.0} | {:.1} | {:.2} |",
                p.instructions,
                p.allocations,
                p.instructions / base.instructions
            ));
        }
        let soft_sha = profiles[0].1.inclusive.get(SOFT_SHA).copied();
        diffs.push((
            scenario,
            difference(&profiles[0].1, base, opts.top),
            soft_sha,
        ));
    }
    println!(
        "\ninstructions per pair (pair, pair32) or request (route, idem and their 32s), {} each, \
         callgrind; ratio to the hand-rolled side (raw)\n",
        opts.n
    );
    println!("| scenario | side | instructions | allocations | x raw |");
    println!("|---|---|---:|---:|---:|");
    for l in &lines {
        println!("{l}");
    }
    for (scenario, diff, soft_sha) in diffs {
        println!(
            "\n{scenario}: where the library spends more than raw, inclusive, \
             instructions per pair/request (library, raw, difference)"
        );
        for (name, l, r) in diff {
            println!("  {:>9.0} {:>9.0} {:>+9.0}  {name}", l, r, l - r);
        }
        if let Some(sha) = soft_sha {
            println!(
                "  ({sha:.0} of these are SHA-256 in sha2's portable code: valgrind hides the \
                 CPU's SHA extensions, which sha2 uses natively where the CPU has them; \
                 this one: {})",
                if sha_extensions() {
                    "has them"
                } else {
                    "has not"
                }
            );
        }
    }
    println!(
        "\nprofiles in {} (callgrind_annotate --inclusive=yes FILE)",
        opts.dir.display()
    );
    Ok(())
}

/// sha2's portable SHA-256 block function, which it runs under valgrind
/// (valgrind's CPUID hides the SHA extensions).
const SOFT_SHA: &str = "sha2::sha256::compress256";

/// Whether this CPU has the SHA extensions sha2 uses natively.
fn sha_extensions() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::is_x86_feature_detected!("sha");
    #[cfg(not(target_arch = "x86_64"))]
    return false;
}

/// Runs the child of `scenario`/`side` under callgrind, counting only
/// `measured`.
fn callgrind(
    exe: &Path,
    out: &Path,
    scenario: &str,
    side: &str,
    url: &str,
    n: usize,
) -> Result<(), String> {
    // Under callgrind a busy machine can make a reply outlast the driver's
    // response timeout: such a run is tried again (the counts do not
    // depend on the load).
    let mut failed = None;
    for _ in 0..3 {
        let status = Command::new("valgrind")
            .arg("--tool=callgrind")
            .arg(format!("--callgrind-out-file={}", out.display()))
            .arg("--toggle-collect=*instructions::measured*")
            .arg("--quiet")
            .arg(exe)
            .args([CHILD, scenario, side, url, &n.to_string()])
            .status()
            .map_err(|e| format!("run valgrind: {e}"))?;
        if status.success() {
            return Ok(());
        }
        eprintln!("bench --instructions: {scenario} {side}: the child failed ({status}); again");
        failed = Some(status);
    }
    Err(format!(
        "{scenario} {side}: the child failed three times ({})",
        failed.map_or_else(String::new, |s| s.to_string())
    ))
}

/// The totals and the allocator calls of a callgrind profile, and its
/// inclusive costs per function (through `callgrind_annotate`), per unit.
fn read_profile(path: &Path, n: usize) -> Result<Profile, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("read {path:?}: {e}"))?;
    let n = n as f64;
    let total: u64 = text
        .lines()
        .find_map(|l| {
            l.strip_prefix("totals:")
                .or_else(|| l.strip_prefix("summary:"))
        })
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .ok_or(format!("{path:?}: no totals"))?;
    let annotated = Command::new("callgrind_annotate")
        .args(["--inclusive=yes", "--threshold=100", "--auto=no"])
        .arg(path)
        .output()
        .map_err(|e| format!("callgrind_annotate: {e}"))?;
    let mut inclusive = HashMap::new();
    for line in String::from_utf8_lossy(&annotated.stdout).lines() {
        let line = line.trim();
        let Some((count, rest)) = line.split_once(' ') else {
            continue;
        };
        let Ok(count) = count.replace(',', "").parse::<u64>() else {
            continue;
        };
        // "(12.34%)  file:function [object]"
        let rest = rest.trim_start();
        let rest = rest
            .strip_prefix('(')
            .and_then(|r| r.split_once(')'))
            .map_or(rest, |(_, r)| r)
            .trim();
        let name = rest.split_once(':').map_or(rest, |(_, f)| f);
        let name = name.rsplit_once(" [").map_or(name, |(f, _)| f);
        // "name (990x)": a recursion's repeated entry, counted already.
        if name.ends_with("x)") && name.contains(" (") {
            continue;
        }
        // A function's code inlined from other files has entries of its
        // own under the same name; the one of its own file is the largest
        // and includes what it calls.
        let per_unit = count as f64 / n;
        let entry = inclusive.entry(name.to_string()).or_insert(0.0);
        *entry = f64::max(*entry, per_unit);
    }
    Ok(Profile {
        instructions: total as f64 / n,
        allocations: allocator_calls(&text) as f64 / n,
        inclusive,
    })
}

/// Calls to the C allocator's entry points in a callgrind profile: the
/// `calls=` lines under a `cfn=` naming one of them (names are compressed:
/// `(id) name` the first time, `(id)` after).
fn allocator_calls(text: &str) -> u64 {
    const ALLOCATORS: [&str; 5] = [
        "malloc",
        "calloc",
        "realloc",
        "posix_memalign",
        "aligned_alloc",
    ];
    let mut names: HashMap<String, String> = HashMap::new();
    let mut current_is_alloc = false;
    let mut calls = 0;
    for line in text.lines() {
        let named = line
            .strip_prefix("cfn=")
            .map(|v| (true, v))
            .or_else(|| line.strip_prefix("fn=").map(|v| (false, v)));
        if let Some((is_call, v)) = named {
            let name = match v.split_once(") ") {
                Some((id, name)) if v.starts_with('(') => {
                    names.insert(id.to_string(), name.to_string());
                    name.to_string()
                }
                _ => names
                    .get(v.trim_end_matches(')'))
                    .cloned()
                    .unwrap_or_else(|| v.to_string()),
            };
            if is_call {
                current_is_alloc = ALLOCATORS.contains(&name.as_str());
            }
            continue;
        }
        if let Some(v) = line.strip_prefix("calls=") {
            if current_is_alloc {
                calls += v
                    .split_whitespace()
                    .next()
                    .and_then(|c| c.parse::<u64>().ok())
                    .unwrap_or(0);
            }
            current_is_alloc = false;
        }
    }
    calls
}

/// The `top` functions with the largest inclusive difference, library
/// minus baseline: (name, library, baseline).
fn difference(lib: &Profile, base: &Profile, top: usize) -> Vec<(String, f64, f64)> {
    let mut rows: Vec<(String, f64, f64)> = lib
        .inclusive
        .iter()
        .map(|(name, l)| {
            (
                name.clone(),
                *l,
                base.inclusive.get(name).copied().unwrap_or(0.0),
            )
        })
        // The frames every side shares (the runtime's, the driver's) are
        // no function of the difference.
        .filter(|(_, l, _)| *l < 0.9 * lib.instructions)
        .collect();
    rows.sort_by(|a, b| (b.1 - b.2).total_cmp(&(a.1 - a.2)));
    rows.truncate(top);
    rows.iter_mut().for_each(|r| {
        if r.0.len() > 140 {
            let mut end = 140;
            while !r.0.is_char_boundary(end) {
                end -= 1;
            }
            r.0.truncate(end);
        }
    });
    rows
}

/// What a child drives: one side of one scenario.
enum Driver {
    Lib(LockClient),
    /// A semaphore of 4 permits, one permit at a time.
    Permit(LockClient),
    Raw(Raw),
    /// The raw pair on a `ConnectionManager`.
    Managed(Raw<ConnectionManager>),
    Scripts(Raw, [String; 5]),
    /// The router, and whether each request carries an `Idempotency-Key`.
    Route(axum::Router, bool),
}

/// Set in a child's environment (by `bench --cpu`): print the counted
/// part's CPU seconds.
pub(crate) const CPU_REPORT: &str = "BENCH_CHILD_CPU";

/// This thread's CPU time so far (user and kernel, from
/// `/proc/thread-self/schedstat`), in seconds; `None` where the system
/// does not say.
fn thread_cpu() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: f64 = stat.split_whitespace().next()?.parse().ok()?;
    Some(ns / 1e9)
}

/// Sequence numbers of routes' ids and raw values, unique in the process.
static NEXT: AtomicU64 = AtomicU64::new(0);

fn child(scenario: &str, side: &str, url: &str, n: usize) -> Result<(), String> {
    let (_, tasks, kind) = SCENARIOS
        .iter()
        .find(|s| s.0 == scenario)
        .copied()
        .ok_or(format!("no scenario {scenario:?}"))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    let prefix = format!("ins{}:", std::process::id());
    let driver = runtime.block_on(async {
        let redis = redis::Client::open(url).map_err(|e| format!("redis client: {e}"))?;
        let lib = LockClient::builder()
            .redis(url)
            .key_prefix(prefix.clone())
            .build()
            .await
            .map_err(|e| format!("lock client: {e}"))?;
        let raw = || Raw::connect(&redis, &prefix);
        let route = |side| app(side, &lib, &redis, &prefix);
        Ok::<_, String>(match (kind, side) {
            (Kind::Route, "lib") => Driver::Route(route(HttpSide::LockLayer).await?, false),
            (Kind::Route, "raw") => Driver::Route(route(HttpSide::RawLock).await?, false),
            (Kind::Idem, "lib") => Driver::Route(route(HttpSide::Idempotency).await?, true),
            (Kind::Idem, "raw") => Driver::Route(route(HttpSide::RawIdempotency).await?, true),
            (Kind::Pair | Kind::Permit, "lib") => Driver::Lib(lib.clone()),
            (Kind::Permit, "permit") => Driver::Permit(lib.clone()),
            (Kind::Pair, "raw") => Driver::Raw(raw().await?),
            (Kind::Pair, "managed") => {
                Driver::Managed(Raw::connect_managed(&redis, &prefix).await?)
            }
            (Kind::Pair, "scripts") => {
                let raw = raw().await?;
                let names = raw.library_names("scripted");
                Driver::Scripts(raw, names)
            }
            _ => return Err(format!("no side {side:?} in {scenario}")),
        })
    })?;
    // Warm-up: connections, script loading, lazily built state.
    runtime.block_on(drive(&driver, tasks, (n / 10).max(tasks)))?;
    let before = thread_cpu();
    measured(&runtime, &driver, tasks, n)?;
    // For `bench --cpu`: the CPU time of the counted part, natively.
    if std::env::var_os(CPU_REPORT).is_some() {
        let spent = thread_cpu().zip(before).map(|(a, b)| a - b);
        println!(
            "{}",
            spent.ok_or("this system reports no CPU time per thread")?
        );
    }
    Ok(())
}

/// The counted part: `n` pairs or requests over `tasks` tasks.
#[inline(never)]
fn measured(
    runtime: &tokio::runtime::Runtime,
    driver: &Driver,
    tasks: usize,
    n: usize,
) -> Result<(), String> {
    runtime.block_on(drive(driver, tasks, n))
}

async fn drive(driver: &Driver, tasks: usize, n: usize) -> Result<(), String> {
    if tasks == 1 {
        return one_task(driver, 0, n).await;
    }
    let mut set = tokio::task::JoinSet::new();
    for t in 0..tasks {
        let driver = match driver {
            Driver::Lib(c) => Driver::Lib(c.clone()),
            Driver::Permit(c) => Driver::Permit(c.clone()),
            Driver::Raw(r) => Driver::Raw(r.clone()),
            Driver::Managed(r) => Driver::Managed(r.clone()),
            Driver::Scripts(r, _) => Driver::Scripts(r.clone(), r.library_names(&format!("s{t}"))),
            Driver::Route(r, keyed) => Driver::Route(r.clone(), *keyed),
        };
        let share = n / tasks + usize::from(t < n % tasks);
        set.spawn(async move { one_task(&driver, t, share).await });
    }
    while let Some(joined) = set.join_next().await {
        joined.map_err(|e| format!("task: {e}"))??;
    }
    Ok(())
}

/// `n` pairs or requests, one after the other, as task `t`.
async fn one_task(driver: &Driver, t: usize, n: usize) -> Result<(), String> {
    let key = format!("pair:{t}");
    match driver {
        Driver::Lib(client) => {
            for _ in 0..n {
                crate::rows::lib_pair(client, &key).await?;
            }
        }
        Driver::Permit(client) => {
            for _ in 0..n {
                crate::rows::family_pair(client, &key, Some(4)).await?;
            }
        }
        // The two raw sides written out alike (a shared `async fn` changes
        // the baseline's own instruction count under callgrind).
        Driver::Raw(raw) => {
            let mut raw = raw.clone();
            let key = raw.key(&key);
            for _ in 0..n {
                let v = value(t as u64, NEXT.fetch_add(1, Ordering::Relaxed));
                raw.pair(&key, &v).await?;
            }
        }
        Driver::Managed(raw) => {
            let mut raw = raw.clone();
            let key = raw.key(&key);
            for _ in 0..n {
                let v = value(t as u64, NEXT.fetch_add(1, Ordering::Relaxed));
                raw.pair(&key, &v).await?;
            }
        }
        Driver::Scripts(raw, names) => {
            let mut raw = raw.clone();
            for _ in 0..n {
                let v = value(t as u64, NEXT.fetch_add(1, Ordering::Relaxed));
                raw.scripted_pair(names, &v).await?;
            }
        }
        Driver::Route(router, keyed) => {
            for _ in 0..n {
                let id = NEXT.fetch_add(1, Ordering::Relaxed);
                let mut request =
                    Request::post(format!("/orders/{t}-{id}/pay")).header("content-length", "0");
                if *keyed {
                    request = request.header("idempotency-key", format!("\"{t}-{id}\""));
                }
                let request = request
                    .body(Body::empty())
                    .map_err(|e| format!("request: {e}"))?;
                let response = router
                    .clone()
                    .oneshot(request)
                    .await
                    .map_err(|e| format!("route: {e}"))?;
                let status = response.status();
                let body = axum::body::to_bytes(response.into_body(), 1 << 16)
                    .await
                    .map_err(|e| format!("body: {e}"))?;
                if status != StatusCode::OK {
                    return Err(format!(
                        "route answered {status}: {}",
                        String::from_utf8_lossy(&body)
                    ));
                }
            }
        }
    }
    Ok(())
}
