//! The workspace's tasks, run with `cargo xtask <task>` (an alias in
//! `.cargo/config.toml`). One definition of "the tests", used by the README,
//! by developers and by CI (`.ci/run` calls `cargo xtask ci`).
//!
//! * `cargo xtask test [--server redis|redis8|valkey|all] [ARGS]`: installs
//!   what the tests need when it is missing (`redis-server`,
//!   `redis-sentinel`, `redis-cli`, `openssl`, PostgreSQL's `initdb` and
//!   server, from Debian's packages, with `sudo` when not root; a pinned
//!   `valkey-server`, see `valkey.rs`; a pinned Redis 8 built from source,
//!   see `redis8.rs`), then runs `cargo test --workspace --all-features
//!   [ARGS]` on the server `--server` names (`LOCK_TEST_SERVER`, read by
//!   every launcher in `test-support`). `all`, the default and what CI
//!   runs: everything on Redis 7, [`VALKEY_SET`] again on Valkey and
//!   [`REDIS8_SET`] on Redis 8, in two lanes at once (see [`lanes()`];
//!   Redis 8, when not cached, is built there beside the tests, at the
//!   lowest CPU priority, rather than before them). It ends by saying which
//!   tests ran on which server, and which were skipped there.
//! * `cargo xtask lint`: `cargo fmt --check`; clippy with `-D warnings` on the
//!   workspace (every feature) and on `lock-runtime` with no feature and with
//!   each feature alone; rustdoc with `-D warnings` for the same sets.
//! * `cargo xtask ci`: `lint` and `test`; with no arguments the lint runs
//!   beside the tests' two lanes (see [`lanes()`]), and the tests' build
//!   goes through clippy's driver in place of the lint's clippy of the
//!   whole workspace; else the lint runs before the tests.
//! * `cargo xtask deps`: only the installation step (Debian's packages,
//!   Valkey and Redis 8).
//! * `cargo xtask first-run [RUNS]`: seconds from a fresh clone, with an
//!   empty cargo cache, to the example order service listening
//!   (`first_run.rs`).

use std::process::{Command, ExitCode};

mod first_run;
mod lanes;
mod redis8;
mod valkey;

use lanes::{Phase, lanes};

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
    // Building Redis 8 from its source (`redis8.rs`).
    ("make", "make"),
    ("cc", "gcc"),
    ("curl", "curl"),
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
/// commands, and the fault suite's short scenarios (but
/// [`NOT_ON_VALKEY`]). Left to Redis alone: the embedded backend, the
/// macros, HTTP plumbing, input checks and cost counts, which no server
/// behaviour changes.
/// `cargo xtask test --server valkey` runs everything on Valkey instead.
const VALKEY_SET: &[(&str, &str)] = &[
    ("tests", "core_redis"),
    ("tests", "core_waiting"),
    ("tests", "core_fencing"),
    ("tests", "shared_fencing"),
    ("tests", "plain_path"),
    ("tests", "cancelled_release"),
    ("tests", "fifo_expiry"),
    ("tests", "labels_acl"),
    ("tests", "peers_mutex"),
    ("tests", "peers_rw_lock"),
    ("tests", "peers_semaphore"),
    ("tests", "peers_redlock"),
    ("tests", "records"),
    ("tests", "records_settle"),
    ("tests", "records_commit"),
    ("tests", "records_commit_on_lock_server"),
    ("tests", "records_replica_acks"),
    ("tests", "fence_redis"),
    ("tests", "leader"),
    ("tests", "local_handover"),
    ("tests", "scaleout_cluster"),
    ("tests", "scaleout_sentinel"),
    ("tests", "scaleout_redlock"),
    ("tests", "shared_waits"),
    ("tests", "credentials_rotation"),
    ("tests", "shutdown"),
    ("fault", "security"),
    ("fault", "scenarios"),
    ("lockctl", "cli"),
    ("lockctl", "lockctl_cluster"),
];

/// Tests of [`VALKEY_SET`]'s targets (name fragments) not run again on
/// Valkey: the fault suite's controls, which show its checker catching a
/// client without a protection (fencing, `fence_postgres`, a semaphore's
/// limit). The checker and those clients are the same on every server; the
/// Redis lane runs them.
const NOT_ON_VALKEY: &[&str] = &[
    "under_faults::without_fencing",
    "under_faults::without_fence_postgres",
    "under_faults::a_semaphore_of_three_checked",
];

/// The tests run a third time, on Redis 8, by `cargo xtask test` (`--server
/// all`): those where its own compare-and-delete and compare-and-set
/// (`DELEX`, `SET .. IFEQ`) replace a script: the plain path and the
/// scripts it falls through to, waiting and hand-overs, fencing, records,
/// the least-privilege ACL (`+delex`), the peers' mutex tests and Cluster.
/// `cargo xtask test --server redis8` runs everything on Redis 8 instead.
const REDIS8_SET: &[(&str, &str)] = &[
    ("tests", "core_redis"),
    ("tests", "core_waiting"),
    ("tests", "core_fencing"),
    ("tests", "plain_path"),
    ("tests", "cancelled_release"),
    ("tests", "fifo_expiry"),
    ("tests", "labels_acl"),
    ("tests", "peers_mutex"),
    ("tests", "records"),
    ("tests", "records_settle"),
    ("tests", "records_commit"),
    ("tests", "records_replica_acks"),
    ("tests", "fence_redis"),
    ("tests", "local_handover"),
    ("tests", "scaleout_cluster"),
    ("tests", "credentials_rotation"),
    ("tests", "shutdown"),
    ("fault", "security"),
];

/// Which servers `cargo xtask test` runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Servers {
    /// Everything on Redis.
    Redis,
    /// Everything on Valkey.
    Valkey,
    /// Everything on Redis 8.
    Redis8,
    /// Everything on Redis, then [`VALKEY_SET`] on Valkey and [`REDIS8_SET`]
    /// on Redis 8 (CI).
    All,
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (task, rest) = match args.split_first() {
        Some((task, rest)) => (task.as_str(), rest),
        None => ("help", &[][..]),
    };
    let outcome = match task {
        "test" => parse_servers(rest).and_then(|(servers, rest)| test(servers, &rest, Lint::No)),
        "lint" => lint(),
        "ci" => parse_servers(rest).and_then(|(servers, rest)| test(servers, &rest, Lint::Too)),
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
     test [--server redis|redis8|valkey|all] [ARGS]\n               \
     install what the tests need, then cargo test --workspace --all-features [ARGS]\n               \
     on Redis 7 (redis), on Redis 8 (redis8), on Valkey (valkey), or on Redis 7 and\n               \
     then the tests where the servers can differ on Valkey and Redis 8 (all, the default)\n  \
     lint         fmt --check, clippy -D warnings and rustdoc on each feature set\n  \
     ci [--server ..] [ARGS]  deps, lint and test, the lint beside the tests (what .ci/run runs)\n  \
     deps         only install what the tests need (Debian's packages, Valkey, Redis 8)\n  \
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

/// Installs the Debian packages of the missing tools, then Valkey and
/// Redis 8.
fn deps() -> Result<(), String> {
    deps_but_redis8()?;
    // Not fatal: the Redis 8 set is then skipped, and the report says so.
    if let Err(e) = redis8::install(redis8::How::Shown) {
        eprintln!("xtask: no Redis {} for the tests: {e}", redis8::VERSION);
    }
    Ok(())
}

/// The Debian packages of the missing tools, then Valkey: what every test
/// run needs before it starts (CI's lanes build Redis 8 beside the tests).
fn deps_but_redis8() -> Result<(), String> {
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
            return Err("--server needs a value: redis, redis8, valkey or all".into());
        }
        rest => ("all", rest),
    };
    let servers = match value {
        "redis" => Servers::Redis,
        "valkey" => Servers::Valkey,
        "redis8" => Servers::Redis8,
        "all" => Servers::All,
        other => {
            return Err(format!(
                "--server {other}: expected redis, redis8, valkey or all"
            ));
        }
    };
    Ok((servers, rest.to_vec()))
}

/// Whether [`test()`] also lints.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Lint {
    No,
    /// [`lint`] too: beside the tests in [`lanes()`], else first.
    Too,
}

/// The test suite on the servers asked for; ends with what ran where.
fn test(servers: Servers, extra: &[String], lint_too: Lint) -> Result<(), String> {
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let whole = "every test (cargo test --workspace --all-features)";
    let mut report = Vec::new();
    let in_lanes = servers == Servers::All && extra.is_empty();
    // In lanes, Redis 8 (wanted last) is built beside the tests.
    if in_lanes {
        deps_but_redis8()?;
    } else {
        deps()?;
    }
    if lint_too == Lint::Too && !in_lanes {
        lint()?;
    }
    let outcome = match servers {
        Servers::Redis => Phase::all("redis", whole).run(&extra, &mut report, None),
        Servers::Valkey => Phase::all("valkey", whole).run(&extra, &mut report, None),
        Servers::Redis8 if !redis8::installed() => Err(format!(
            "no redis-server {} in {}: see `cargo xtask deps`'s output",
            redis8::VERSION,
            redis8::dir().display()
        )),
        Servers::Redis8 => Phase::all("redis8", whole).run(&extra, &mut report, None),
        // With arguments (a filter, a package), one after the other.
        Servers::All if !extra.is_empty() => Phase::all("redis", whole)
            .run(&extra, &mut report, None)
            .and_then(|()| Phase::valkey_set().run(&extra, &mut report, None))
            .and_then(|()| Phase::redis8_set().run_if_installed(&extra, &mut report, None)),
        Servers::All => lanes(&mut report, lint_too),
    };
    eprintln!("\nxtask test: what ran where");
    for line in &report {
        eprintln!("  {line}");
    }
    outcome
}

/// Formatting, clippy and rustdoc, warning-free.
fn lint() -> Result<(), String> {
    lint_with(WorkspaceClippy::Here, &|args, env| run("cargo", args, env))
}

/// Where the lint's clippy of the whole workspace (every target, every
/// feature) runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum WorkspaceClippy {
    /// In the lint, as `cargo clippy`.
    Here,
    /// In CI's test build, which goes through clippy's driver: the lint
    /// skips it (`lanes::lanes`).
    InTheTestBuild,
}

/// Runs one `cargo` command: its arguments, and environment variables to add.
type Cargo<'a> = &'a dyn Fn(&[&str], &[(&str, &str)]) -> Result<(), String>;

/// [`lint`], sending each `cargo` command through `cargo`.
fn lint_with(workspace: WorkspaceClippy, cargo: Cargo<'_>) -> Result<(), String> {
    let deny = [("RUSTDOCFLAGS", "-Dwarnings")];
    cargo(&["fmt", "--all", "--check"], &[])?;
    single_feature_cfgs(std::path::Path::new("lock-runtime/src"))?;
    if workspace == WorkspaceClippy::Here {
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
    }
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
    use super::{NOT_ON_VALKEY, REDIS8_SET, Servers, VALKEY_SET, combines_features, parse_servers};

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
        assert!(err.contains("redis, redis8, valkey or all"), "{err}");
        let (servers, _) = parse_servers(&strings(&["--server", "redis8"])).unwrap();
        assert_eq!(servers, Servers::Redis8);
        assert!(parse_servers(&strings(&["--server"])).is_err());
    }

    #[test]
    fn every_test_the_valkey_and_redis8_runs_name_exists_in_its_package() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        for (set, name) in [(VALKEY_SET, "VALKEY_SET"), (REDIS8_SET, "REDIS8_SET")] {
            for (package, target) in set {
                let file = root
                    .join(package)
                    .join("tests")
                    .join(format!("{target}.rs"));
                assert!(file.is_file(), "{} is gone: update {name}", file.display());
            }
        }
    }

    #[test]
    fn every_test_not_run_on_valkey_is_a_fault_suite_control() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let scenarios = std::fs::read_to_string(root.join("fault/tests/scenarios.rs")).unwrap();
        for fragment in NOT_ON_VALKEY {
            let name = fragment.strip_prefix("under_faults::").unwrap();
            let found: Vec<_> = scenarios
                .lines()
                .filter_map(|line| line.trim().strip_prefix("fn "))
                .filter(|f| f.starts_with(name))
                .collect();
            assert!(
                !found.is_empty(),
                "no scenario is named {name}..: update NOT_ON_VALKEY"
            );
            // Controls: a client without a protection, and the checker that
            // says so.
            for f in found {
                assert!(
                    f.starts_with("without_") || f.contains("_checked_as_"),
                    "{f} is not a control"
                );
            }
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
