//! The workspace's tasks, run with `cargo xtask <task>` (an alias in
//! `.cargo/config.toml`). One definition of "the tests", used by the README,
//! by developers and by CI (`.ci/run` calls `cargo xtask ci`).
//!
//! * `cargo xtask test [--server redis|valkey|all] [ARGS]`: installs what
//!   the tests need when it is missing (`redis-server`, `redis-sentinel`,
//!   `redis-cli`, `openssl`, PostgreSQL's `initdb` and server, from Debian's
//!   packages, with `sudo` when not root; a pinned `valkey-server`, see
//!   `valkey.rs`), then runs `cargo test --workspace --all-features [ARGS]`
//!   on the server `--server` names (`LOCK_TEST_SERVER`, read by every
//!   launcher in `test-support`). `all`, the default and what CI runs:
//!   everything on Redis, and [`VALKEY_SET`] again on Valkey, in two lanes
//!   at once (see [`lanes`]). It ends by saying which tests ran on which
//!   server, and which were skipped there.
//! * `cargo xtask lint`: `cargo fmt --check`; clippy with `-D warnings` on the
//!   workspace (every feature) and on `lock-runtime` with no feature and with
//!   each feature alone; rustdoc with `-D warnings` for the same sets.
//! * `cargo xtask ci`: `lint` and `test`; with no arguments the lint runs
//!   beside the tests' two lanes (see [`lanes`]), else before the tests.
//! * `cargo xtask deps`: only the installation step (Debian's packages and
//!   Valkey).
//! * `cargo xtask first-run [RUNS]`: seconds from a fresh clone, with an
//!   empty cargo cache, to the example order service listening
//!   (`first_run.rs`).

use std::process::{Command, ExitCode};

mod first_run;
mod valkey;

/// The feature sets of `lock-runtime` linted and documented on their own
/// (`--no-default-features --features F`), besides `--all-features` on the
/// whole workspace: none, and each feature alone (`macros` alone is the
/// default set). Pairs add nothing: every `cfg` in the crate names one
/// feature (`cfg(feature = "x")` or its `not`), so an item compiled under
/// a pair is compiled under one of its features alone with fewer users, and
/// what a pair leaves unused or broken that one alone does not, all of them
/// together (`--all-features`) shows. `lint` checks that premise first
/// (`single_feature_cfgs`): a `cfg` naming two features fails it, and then
/// the pairs must be listed here.
const FEATURE_SETS: &[&str] = &[
    "",
    "macros",
    "idempotency",
    "axum",
    "tls",
    "metrics",
    "postgres",
];

/// Commands the tests run, and the Debian package that provides each.
const TOOLS: &[(&str, &str)] = &[
    ("redis-server", "redis-server"),
    ("redis-sentinel", "redis-sentinel"),
    ("redis-cli", "redis-tools"),
    ("openssl", "openssl"),
    ("wrk", "wrk"),
    // Debian keeps PostgreSQL's server programs off the PATH, in
    // /usr/lib/postgresql/<version>/bin: see `installed`.
    ("initdb", "postgresql"),
];

/// The tests run a second time on Valkey by `cargo xtask test` (`--server
/// all`, CI's run): those that talk to a server where Redis and Valkey can
/// differ, as `(package, test target)` (the package only documents where
/// the file is; every name is unique in the workspace). What they cover: the scripts and
/// every command the library sends (the core on a server, each primitive's
/// scripts, fencing counters and `fence::redis`, idempotency records), the
/// least-privilege ACL (the command proxy's list of names, `ACL LOG`),
/// pub/sub notices and hand-over, Cluster (slots, `SSUBSCRIBE`, migrations),
/// Sentinel (discovery, `WAIT`, failover), Redlock masters, `lockctl`'s
/// commands, and the fault suite's short scenarios. Left to Redis alone: the
/// embedded backend, the macros, HTTP plumbing, input checks and cost
/// counts, which no server behaviour changes.
/// `cargo xtask test --server valkey` runs everything on Valkey instead.
const VALKEY_SET: &[(&str, &str)] = &[
    ("tests", "core_redis"),
    ("tests", "core_waiting"),
    ("tests", "core_fencing"),
    ("tests", "shared_fencing"),
    ("tests", "plain_path"),
    ("tests", "fifo_expiry"),
    ("tests", "labels_acl"),
    ("tests", "peers_mutex"),
    ("tests", "peers_rw_lock"),
    ("tests", "peers_semaphore"),
    ("tests", "peers_redlock"),
    ("tests", "records"),
    ("tests", "records_settle"),
    ("tests", "fence_redis"),
    ("tests", "leader"),
    ("tests", "local_handover"),
    ("tests", "scaleout_cluster"),
    ("tests", "scaleout_sentinel"),
    ("tests", "scaleout_redlock"),
    ("fault", "security"),
    ("fault", "scenarios"),
    ("lockctl", "cli"),
    ("lockctl", "lockctl_cluster"),
];

/// Which servers `cargo xtask test` runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Servers {
    /// Everything on Redis.
    Redis,
    /// Everything on Valkey.
    Valkey,
    /// Everything on Redis, then [`VALKEY_SET`] on Valkey (CI).
    All,
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (task, rest) = match args.split_first() {
        Some((task, rest)) => (task.as_str(), rest),
        None => ("help", &[][..]),
    };
    let outcome = match task {
        "test" => parse_servers(rest)
            .and_then(|(servers, rest)| deps().and_then(|()| test(servers, &rest, Lint::No))),
        "lint" => lint(),
        "ci" => parse_servers(rest)
            .and_then(|(servers, rest)| deps().and_then(|()| test(servers, &rest, Lint::Too))),
        "deps" => deps(),
        "first-run" => first_run::first_run(rest),
        "help" | "-h" | "--help" => {
            println!("{}", usage());
            Ok(())
        }
        other => Err(format!("unknown task `{other}`\n{}", usage())),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask {task}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn usage() -> &'static str {
    "usage: cargo xtask <task>\n  \
     test [--server redis|valkey|all] [ARGS]\n               \
     install what the tests need, then cargo test --workspace --all-features [ARGS]\n               \
     on Redis (redis), on Valkey (valkey), or on Redis and then the tests where\n               \
     the servers can differ on Valkey (all, the default)\n  \
     lint         fmt --check, clippy -D warnings and rustdoc on each feature set\n  \
     ci [--server ..] [ARGS]  deps, lint and test, the lint beside the tests (what .ci/run runs)\n  \
     deps         only install what the tests need (Debian's packages, Valkey)\n  \
     first-run [RUNS]  seconds from a fresh clone (empty cargo cache) to the order service listening"
}

/// Runs `program args`, echoing it; an error names the command.
fn run(program: &str, args: &[&str], env: &[(&str, &str)]) -> Result<(), String> {
    run_logged(program, args, env, None)
}

/// [`run`], its output (and the echo) to `log` when given.
fn run_logged(
    program: &str,
    args: &[&str],
    env: &[(&str, &str)],
    log: Option<&std::fs::File>,
) -> Result<(), String> {
    run_in(None, program, args, env, log)
}

/// [`run_logged`] in the directory `dir` when given.
fn run_in(
    dir: Option<&std::path::Path>,
    program: &str,
    args: &[&str],
    env: &[(&str, &str)],
    log: Option<&std::fs::File>,
) -> Result<(), String> {
    use std::io::Write;
    let shown = format!("{program} {}", args.join(" "));
    let mut command = Command::new(program);
    command.args(args).envs(env.iter().copied());
    if let Some(dir) = dir {
        command.current_dir(dir);
    }
    match log {
        Some(mut log) => {
            let _ = writeln!(log, "+ {shown}");
            let out = log
                .try_clone()
                .map_err(|e| format!("the lane's log: {e}"))?;
            let err = log
                .try_clone()
                .map_err(|e| format!("the lane's log: {e}"))?;
            command.stdout(out).stderr(err);
        }
        None => eprintln!("+ {shown}"),
    }
    let status = command
        .status()
        .map_err(|e| format!("cannot run `{shown}`: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`{shown}` failed ({status})"))
    }
}

/// `true` when `program` is on the `PATH`.
fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

/// `true` when `tool` is on the `PATH`, or, for PostgreSQL's programs, where
/// Debian installs them (the tests look there too: `test_support::postgres_bin_dir`).
fn installed(tool: &str) -> bool {
    on_path(tool)
        || (tool == "initdb"
            && std::fs::read_dir("/usr/lib/postgresql").is_ok_and(|versions| {
                versions
                    .flatten()
                    .any(|v| v.path().join("bin").join(tool).is_file())
            }))
}

/// Installs the Debian packages of the missing tools, then Valkey.
fn deps() -> Result<(), String> {
    debian_packages()?;
    valkey::install()
}

/// Installs the Debian packages of the missing tools.
fn debian_packages() -> Result<(), String> {
    let missing: Vec<&str> = TOOLS
        .iter()
        .filter(|(tool, _)| !installed(tool))
        .map(|&(_, package)| package)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !on_path("apt-get") {
        return Err(format!(
            "the tests need {}; this machine has no apt-get: install them with your package manager",
            missing.join(", ")
        ));
    }
    eprintln!("installing {}", missing.join(" "));
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    let (program, prefix): (&str, &[&str]) = if root {
        ("apt-get", &[])
    } else if on_path("sudo") {
        ("sudo", &["apt-get"])
    } else {
        return Err(format!(
            "the tests need {} and installing them needs root: run `sudo apt-get install {}`",
            missing.join(", "),
            missing.join(" ")
        ));
    };
    let noninteractive = [("DEBIAN_FRONTEND", "noninteractive")];
    let mut update = prefix.to_vec();
    update.extend(["update", "-qq"]);
    run(program, &update, &noninteractive)?;
    let mut install = prefix.to_vec();
    install.extend(["install", "-y", "-qq", "--no-install-recommends"]);
    install.extend(&missing);
    run(program, &install, &noninteractive)?;
    // The packages may start system services; the tests use their own servers.
    run("redis-server", &["--version"], &[])
}

/// Takes `--server NAME` (or `--server=NAME`) off the front of `args`.
fn parse_servers(args: &[String]) -> Result<(Servers, Vec<String>), String> {
    let (value, rest) = match args {
        [flag, value, rest @ ..] if flag == "--server" => (value.as_str(), rest),
        [flag, rest @ ..] if flag.starts_with("--server=") => (&flag["--server=".len()..], rest),
        [flag] if flag == "--server" => {
            return Err("--server needs a value: redis, valkey or all".into());
        }
        rest => ("all", rest),
    };
    let servers = match value {
        "redis" => Servers::Redis,
        "valkey" => Servers::Valkey,
        "all" => Servers::All,
        other => {
            return Err(format!("--server {other}: expected redis, valkey or all"));
        }
    };
    Ok((servers, rest.to_vec()))
}

/// Whether [`test()`] also lints.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Lint {
    No,
    /// [`lint`] too: beside the tests in [`lanes`], else first.
    Too,
}

/// The test suite on the servers asked for; ends with what ran where.
fn test(servers: Servers, extra: &[String], lint_too: Lint) -> Result<(), String> {
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let whole = "every test (cargo test --workspace --all-features)";
    let mut report = Vec::new();
    let in_lanes = servers == Servers::All && extra.is_empty();
    if lint_too == Lint::Too && !in_lanes {
        lint()?;
    }
    let outcome = match servers {
        Servers::Redis => Phase::all("redis", whole).run(&extra, &mut report, None),
        Servers::Valkey => Phase::all("valkey", whole).run(&extra, &mut report, None),
        // With arguments (a filter, a package), one after the other.
        Servers::All if !extra.is_empty() => Phase::all("redis", whole)
            .run(&extra, &mut report, None)
            .and_then(|()| Phase::valkey_set().run(&extra, &mut report, None)),
        Servers::All => lanes(&mut report, lint_too),
    };
    eprintln!("\nxtask test: what ran where");
    for line in &report {
        eprintln!("  {line}");
    }
    outcome
}

/// The name shared by the fault suite's short scenarios
/// (`fault/tests/scenarios.rs`): the longest test target, about three
/// minutes on each server, one scenario at a time.
const SCENARIOS: &str = "under_faults::";

/// What CI runs (`--server all`), in two lanes at once, built once before:
///
/// * every test but the fault scenarios, on Redis (about 9 minutes on two
///   cores), its output shown as it goes;
/// * the fault scenarios on Redis, then [`VALKEY_SET`] on Valkey (as long),
///   its output kept in a file and shown when it ends.
///
/// Most tests wait on servers, timers and worker processes rather than
/// compute: one lane at a time kept the two cores about 30 % busy, and
/// took 19 of CI's 25 minutes. Each lane's servers are its own, on free
/// ports, so the lanes share nothing but the CPU; the fault scenarios still
/// run one at a time, in one lane.
///
/// With [`Lint::Too`] (CI), the lint runs beside the lanes, at the lowest
/// CPU priority (`nice -n 19`) and in a target directory of its own
/// (`target/lint`): it takes the cores the tests leave idle, and its
/// output is shown at the end.
fn lanes(report: &mut Vec<String>, lint_too: Lint) -> Result<(), String> {
    let first = Phase {
        names: Names::Except(SCENARIOS),
        ..Phase::all("redis", "every test but the fault scenarios")
    };
    let scenarios = Phase {
        server: "redis",
        targets: &[("fault", "scenarios")],
        names: Names::Only(SCENARIOS),
        what: "the fault scenarios",
        ..Phase::valkey_set()
    };
    let valkey = Phase::valkey_set();
    // One build, before both lanes: the second runs the test programs it
    // built (a `cargo test` of a selection of targets would build some
    // crates again, with other features: a minute on two cores).
    let built = build_tests(&Phase::all("redis", "").cargo_args(&["--no-run"]))?;
    let lint = (lint_too == Lint::Too).then(|| {
        Beside::start("lint", |log, report| {
            let started = std::time::Instant::now();
            let outcome = lint_beside(log);
            report.push(took("lint, beside the tests", started, &outcome));
            outcome
        })
    });
    let second = Beside::start("second lane", move |log, report| {
        let how = Run::Built(&built);
        let scenarios = scenarios.run_as(&how, report, Some(log));
        scenarios.and(valkey.run_as(&how, report, Some(log)))
    });
    let first = first.run(&[], report, None);
    let second = second.end(report);
    let lint = lint.map_or(Ok(()), |lint| lint.end(report));
    first.and(second).and(lint)
}

/// `what: passed in 1m02s` (or `FAILED`), timed from `started`.
fn took(what: &str, started: std::time::Instant, outcome: &Result<(), String>) -> String {
    let verdict = if outcome.is_ok() { "passed" } else { "FAILED" };
    let took = started.elapsed().as_secs();
    format!("{what}: {verdict} in {}m{:02}s", took / 60, took % 60)
}

/// A task run in a thread of its own beside the first lane, its output
/// kept in a file and shown when it ends.
struct Beside {
    what: &'static str,
    log_path: std::path::PathBuf,
    thread: std::thread::JoinHandle<(Result<(), String>, Vec<String>)>,
}

impl Beside {
    /// Starts `task`, which writes its output to the file it is given and
    /// its report's lines to the `Vec`.
    fn start<T>(what: &'static str, task: T) -> Self
    where
        T: FnOnce(&std::fs::File, &mut Vec<String>) -> Result<(), String> + Send + 'static,
    {
        let name = what.replace(' ', "-");
        let log_path =
            std::env::temp_dir().join(format!("xtask-{name}-{}.log", std::process::id()));
        let log = std::fs::File::create(&log_path);
        let thread = std::thread::spawn(move || {
            let mut report = Vec::new();
            let outcome = match log {
                Ok(log) => task(&log, &mut report),
                Err(e) => Err(format!("the {what}'s log: {e}")),
            };
            (outcome, report)
        });
        Self {
            what,
            log_path,
            thread,
        }
    }

    /// Waits for the task, shows its output, and adds its report to `report`.
    fn end(self, report: &mut Vec<String>) -> Result<(), String> {
        let what = self.what;
        let (outcome, lines) = self
            .thread
            .join()
            .unwrap_or_else(|_| (Err(format!("the {what} panicked")), Vec::new()));
        let shown = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        let _ = std::fs::remove_file(&self.log_path);
        eprintln!("\nxtask test: the {what}'s output\n{shown}");
        report.extend(lines);
        outcome
    }
}

/// [`lint`] beside the tests: niced, in `target/lint` (under
/// `CARGO_TARGET_DIR` if set), its output to `log`.
fn lint_beside(log: &std::fs::File) -> Result<(), String> {
    let target = std::env::var_os("CARGO_TARGET_DIR").unwrap_or_else(|| "target".into());
    let target = std::path::Path::new(&target).join("lint");
    let target = target.to_str().ok_or("the target directory is not UTF-8")?;
    lint_with(&|args, env| {
        let mut niced = vec!["-n", "19", "cargo"];
        niced.extend(args);
        let mut env = env.to_vec();
        env.push(("CARGO_TARGET_DIR", target));
        run_logged("nice", &niced, &env, Some(log))
    })
}

/// One `cargo test` run of [`test()`].
struct Phase {
    /// `LOCK_TEST_SERVER`.
    server: &'static str,
    /// The test targets, as `(package, target)`; empty: the whole workspace.
    targets: &'static [(&'static str, &'static str)],
    /// Which tests of those targets.
    names: Names,
    /// What the report calls it.
    what: &'static str,
    /// Tells apart the files of two phases running at once.
    lane: &'static str,
}

/// The tests a [`Phase`] runs, by name.
#[derive(Clone, Copy)]
enum Names {
    All,
    /// Those whose names contain this.
    Only(&'static str),
    /// All but those whose names contain this.
    Except(&'static str),
}

impl Phase {
    /// Every test on `server`.
    fn all(server: &'static str, what: &'static str) -> Self {
        Self {
            server,
            targets: &[],
            names: Names::All,
            what,
            lane: "a",
        }
    }

    /// [`VALKEY_SET`] on Valkey.
    fn valkey_set() -> Self {
        Self {
            server: "valkey",
            targets: VALKEY_SET,
            names: Names::All,
            what: "the tests where servers can differ (VALKEY_SET in xtask/src/main.rs)",
            lane: "b",
        }
    }

    /// `cargo test`'s arguments, `extra` among them.
    fn cargo_args<'a>(&self, extra: &[&'a str]) -> Vec<&'a str> {
        // `--workspace` either way: features unified as in the whole run,
        // so a selection of targets rebuilds as little as it can.
        let mut args = vec!["test", "--workspace"];
        for &(_, target) in self.targets {
            args.extend(["--test", target]);
        }
        args.push("--all-features");
        args.extend(extra);
        let (flag, name) = match self.names {
            Names::All => return args,
            Names::Only(name) => (None, name),
            Names::Except(name) => (Some("--skip"), name),
        };
        if !args.contains(&"--") {
            args.push("--");
        }
        args.extend(flag);
        args.push(name);
        args
    }

    /// `cargo test` with `extra`, as [`run_as`](Self::run_as).
    fn run(
        &self,
        extra: &[&str],
        report: &mut Vec<String>,
        log: Option<&std::fs::File>,
    ) -> Result<(), String> {
        self.run_as(&Run::Cargo(extra), report, log)
    }

    /// Runs the phase's tests with `LOCK_TEST_SERVER`, its output to `log`
    /// if given. Appends to `report` what ran, how long it took, its
    /// outcome, and the tests that said they were skipped on this server.
    fn run_as(
        &self,
        how: &Run<'_>,
        report: &mut Vec<String>,
        log: Option<&std::fs::File>,
    ) -> Result<(), String> {
        let Self { server, what, .. } = *self;
        let skips = std::env::temp_dir().join(format!(
            "xtask-skips-{}-{server}-{}.txt",
            std::process::id(),
            self.lane
        ));
        let _ = std::fs::remove_file(&skips);
        let skips_path = skips
            .to_str()
            .ok_or_else(|| format!("{} is not UTF-8", skips.display()))?;
        let started = std::time::Instant::now();
        let valkey_bin;
        let mut env = vec![
            ("LOCK_TEST_SERVER", server),
            ("LOCK_TEST_SKIPS", skips_path),
        ];
        if server == "valkey" {
            valkey_bin = valkey::server();
            let bin = valkey_bin
                .to_str()
                .ok_or_else(|| format!("{} is not UTF-8", valkey_bin.display()))?;
            env.push(("VALKEY_SERVER", bin));
        }
        let outcome = match how {
            Run::Cargo(extra) => run_logged("cargo", &self.cargo_args(extra), &env, log),
            Run::Built(built) => self.run_built(built, &env, log),
        };
        report.push(took(&format!("{server}: {what}"), started, &outcome));
        let skipped = std::fs::read_to_string(&skips).unwrap_or_default();
        let _ = std::fs::remove_file(&skips);
        report.extend(skipped.lines().map(|l| format!("{server}: {l}")));
        outcome
    }
}

/// How a [`Phase`] runs its tests.
enum Run<'a> {
    /// `cargo test` with these arguments.
    Cargo(&'a [&'a str]),
    /// The test programs [`build_tests`] built.
    Built(&'a [Built]),
}

/// A test program `cargo test --no-run` built.
struct Built {
    /// The test target's name (`--test NAME`).
    target: String,
    /// The program.
    exe: std::path::PathBuf,
    /// Its package's directory: where `cargo test` runs it.
    dir: std::path::PathBuf,
}

impl Phase {
    /// Runs the phase's targets from `built` as `cargo test` would (in
    /// their package's directory), each with the phase's name filter; runs
    /// them all, and fails if one failed.
    fn run_built(
        &self,
        built: &[Built],
        env: &[(&str, &str)],
        log: Option<&std::fs::File>,
    ) -> Result<(), String> {
        let args: Vec<&str> = match self.names {
            Names::All => vec![],
            Names::Only(name) => vec![name],
            Names::Except(name) => vec!["--skip", name],
        };
        let mut failed = Vec::new();
        for &(_, target) in self.targets {
            let Some(test) = built.iter().find(|b| b.target == target) else {
                return Err(format!("the build made no test program `{target}`"));
            };
            let exe = test
                .exe
                .to_str()
                .ok_or("a test program's path is not UTF-8")?;
            if let Err(e) = run_in(Some(&test.dir), exe, &args, env, log) {
                failed.push(e);
            }
        }
        if failed.is_empty() {
            Ok(())
        } else {
            Err(failed.join("; "))
        }
    }
}

/// `cargo ARGS --message-format=json-render-diagnostics` (ARGS: a `cargo
/// test --no-run`, with no `--`), its diagnostics shown as usual: the
/// integration test programs it built.
fn build_tests(args: &[&str]) -> Result<Vec<Built>, String> {
    let shown = format!("cargo {}", args.join(" "));
    eprintln!("+ {shown}");
    let output = Command::new("cargo")
        .args(args)
        .arg("--message-format=json-render-diagnostics")
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run `{shown}`: {e}"))?;
    if !output.status.success() {
        return Err(format!("`{shown}` failed ({})", output.status));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    Ok(stdout.lines().filter_map(built_test).collect())
}

/// The integration test program one line of cargo's JSON messages reports
/// built, if it does.
fn built_test(line: &str) -> Option<Built> {
    let message: serde_json::Value = serde_json::from_str(line).ok()?;
    let target = &message["target"];
    let is_test = target["kind"].as_array()?.iter().any(|k| k == "test");
    if message["reason"] != "compiler-artifact" || !is_test {
        return None;
    }
    let manifest = std::path::Path::new(message["manifest_path"].as_str()?);
    Some(Built {
        target: target["name"].as_str()?.to_owned(),
        exe: message["executable"].as_str()?.into(),
        dir: manifest.parent()?.to_owned(),
    })
}

/// Formatting, clippy and rustdoc, warning-free.
fn lint() -> Result<(), String> {
    lint_with(&|args, env| run("cargo", args, env))
}

/// Runs one `cargo` command: its arguments, and environment variables to add.
type Cargo<'a> = &'a dyn Fn(&[&str], &[(&str, &str)]) -> Result<(), String>;

/// [`lint`], sending each `cargo` command through `cargo`.
fn lint_with(cargo: Cargo<'_>) -> Result<(), String> {
    let deny = [("RUSTDOCFLAGS", "-Dwarnings")];
    cargo(&["fmt", "--all", "--check"], &[])?;
    single_feature_cfgs(std::path::Path::new("lock-runtime/src"))?;
    cargo(
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--all-features",
            "--",
            "-D",
            "warnings",
        ],
        &[],
    )?;
    for features in FEATURE_SETS {
        let common = [
            "-p",
            "lock-runtime",
            "--no-default-features",
            "--features",
            features,
        ];
        let mut clippy = vec!["clippy", "--all-targets"];
        clippy.extend(common);
        clippy.extend(["--", "-D", "warnings"]);
        cargo(&clippy, &[])?;
        let mut doc = vec!["doc", "--no-deps", "--quiet"];
        doc.extend(common);
        cargo(&doc, &deny)?;
    }
    cargo(
        &[
            "doc",
            "--workspace",
            "--no-deps",
            "--all-features",
            "--quiet",
        ],
        &deny,
    )
}

/// Fails when a `cfg` under `dir` combines features (`all(..)`/`any(..)`
/// around `feature = ..`): `FEATURE_SETS` lints each feature alone on the
/// premise that none does.
fn single_feature_cfgs(dir: &std::path::Path) -> Result<(), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries {
        let path = entry.map_err(|e| format!("{}: {e}", dir.display()))?.path();
        if path.is_dir() {
            single_feature_cfgs(&path)?;
            continue;
        }
        if path.extension().is_none_or(|ext| ext != "rs") {
            continue;
        }
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        for (n, line) in text.lines().enumerate() {
            if combines_features(line) {
                return Err(format!(
                    "{}:{}: a cfg combines features; lint that combination in FEATURE_SETS \
                     (xtask/src/main.rs) and update its doc",
                    path.display(),
                    n + 1
                ));
            }
        }
    }
    Ok(())
}

/// `true` for a line whose `cfg` names a feature inside `all(`/`any(`.
fn combines_features(line: &str) -> bool {
    line.contains("cfg")
        && line.contains("feature")
        && (line.contains("all(") || line.contains("any("))
}

#[cfg(test)]
mod tests {
    use super::{Servers, VALKEY_SET, combines_features, parse_servers};

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_server_option_is_taken_off_the_front_and_the_rest_goes_to_cargo() {
        let (servers, rest) =
            parse_servers(&strings(&["--server", "valkey", "-p", "tests"])).unwrap();
        assert_eq!(
            (servers, rest),
            (Servers::Valkey, strings(&["-p", "tests"]))
        );
        let (servers, rest) = parse_servers(&strings(&["--server=redis"])).unwrap();
        assert_eq!((servers, rest), (Servers::Redis, vec![]));
        let (servers, rest) = parse_servers(&strings(&["--no-fail-fast"])).unwrap();
        assert_eq!(
            (servers, rest),
            (Servers::All, strings(&["--no-fail-fast"]))
        );
        let err = parse_servers(&strings(&["--server", "valky"])).unwrap_err();
        assert!(err.contains("redis, valkey or all"), "{err}");
        assert!(parse_servers(&strings(&["--server"])).is_err());
    }

    #[test]
    fn every_test_the_valkey_run_names_exists_in_its_package() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        for (package, target) in VALKEY_SET {
            let file = root
                .join(package)
                .join("tests")
                .join(format!("{target}.rs"));
            assert!(
                file.is_file(),
                "{} is gone: update VALKEY_SET",
                file.display()
            );
        }
    }

    #[test]
    fn a_cfg_over_two_features_is_caught_and_one_feature_is_not() {
        assert!(combines_features(
            r#"#[cfg(all(feature = "axum", feature = "metrics"))]"#
        ));
        assert!(combines_features(
            r#"#[cfg_attr(any(feature = "a", test), allow(dead_code))]"#
        ));
        assert!(!combines_features(r#"#[cfg(feature = "axum")]"#));
        assert!(!combines_features(
            r#"#[cfg_attr(not(feature = "idempotency"), allow(dead_code))]"#
        ));
    }
}
