//! How `cargo xtask test` runs the tests: [`Phase`]s of `cargo test` (or
//! of the test programs one build made), and CI's two [`lanes()`] at once,
//! with the lint beside them.

use std::process::Command;

use super::{
    Lint, NOT_ON_VALKEY, REDIS8_SET, VALKEY_SET, WorkspaceClippy, lint_with, redis8, run_in,
    run_logged, valkey,
};

/// The name shared by the fault suite's short scenarios
/// (`fault/tests/scenarios.rs`): the longest test target, about three
/// minutes on each server, one scenario at a time.
const SCENARIOS: &str = "under_faults::";

/// What CI runs (`--server all`), in two lanes at once, built once before:
///
/// * every test but the fault scenarios, on Redis (about 9 minutes on two
///   cores), its output shown as it goes;
/// * the fault scenarios on Redis, then [`VALKEY_SET`] on Valkey and
///   [`REDIS8_SET`] on Redis 8 (about as long), its output kept in a file
///   and shown when it ends.
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
pub(super) fn lanes(report: &mut Vec<String>, lint_too: Lint) -> Result<(), String> {
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
    let redis8 = Phase::redis8_set();
    // Redis 8 (built from source when not cached) is wanted only by the
    // second lane's last phase: built from now on at the lowest CPU
    // priority, it takes the cores the test build and the lanes leave idle,
    // rather than a minute before them. Built for the tests alone (glibc's
    // allocator, -O1: `redis8::Flavor::Tests`), it costs about 50
    // CPU-seconds where a release build costs 200, and the cores are busy.
    let redis8_build = (!redis8::installed()).then(|| {
        eprintln!("xtask: building Redis {} beside the tests", redis8::VERSION);
        Beside::start("Redis 8 build", |log, _| {
            redis8::install(redis8::How::Beside(log))
        })
    });
    // With the lint, the workspace's crates are built through clippy's
    // driver: the build lints them as `cargo clippy --workspace
    // --all-targets --all-features` does (the same targets and features),
    // and the lint beside skips that pass, a check of every dependency
    // again (about 3.5 CPU-minutes).
    let clippy = lint_too == Lint::Too && super::on_path("clippy-driver");
    let wrapper: &[&str] = if clippy { &CLIPPY_WRAPPER } else { &[] };
    // One build, before both lanes: the second runs the test programs it
    // built (a `cargo test` of a selection of targets would build some
    // crates again, with other features: a minute on two cores).
    let (built, warnings) =
        build_tests(&Phase::all("redis", "").cargo_args(&[&["--no-run"], wrapper].concat()))?;
    let lint = (lint_too == Lint::Too).then(|| {
        Beside::start("lint", move |log, report| {
            let started = std::time::Instant::now();
            let in_build = if clippy && warnings > 0 {
                Err(format!(
                    "clippy in the test build: {warnings} warning(s), shown in its output"
                ))
            } else {
                Ok(())
            };
            let workspace = if clippy {
                WorkspaceClippy::InTheTestBuild
            } else {
                WorkspaceClippy::Here
            };
            let outcome = match (in_build, lint_beside(log, workspace)) {
                (Ok(()), outcome) => outcome,
                (Err(e), Ok(())) => Err(e),
                (Err(e), Err(f)) => Err(format!("{e}; {f}")),
            };
            report.push(took("lint, beside the tests", started, &outcome));
            outcome
        })
    });
    let second = Beside::start("second lane", move |log, report| {
        let how = Run::Built(&built);
        let scenarios = scenarios.run_as(&how, report, Some(log));
        let valkey = valkey.run_as(&how, report, Some(log));
        if let Some(Err(e)) = redis8_build.map(Beside::end_quietly) {
            // Not fatal: the Redis 8 set is skipped, and the report says so.
            report.push(format!("redis8: no Redis {}: {e}", redis8::VERSION));
        }
        let redis8 = redis8.run_as_if_installed(&how, report, Some(log));
        scenarios.and(valkey).and(redis8)
    });
    // Every target run, failed or not: one CI run names every failure.
    // Through the same driver as the build, or cargo would build it again.
    let first = first.run(&[&["--no-fail-fast"], wrapper].concat(), report, None);
    let second = second.end(report);
    let lint = lint.map_or(Ok(()), |lint| lint.end(report));
    first.and(second).and(lint)
}

/// `cargo` options that build the workspace's crates through clippy's
/// driver (`cargo clippy` does the same through `RUSTC_WORKSPACE_WRAPPER`;
/// an option rather than the variable, which the test programs would
/// inherit: the macro crate's UI tests run cargo, and their expected
/// output has no clippy lints).
const CLIPPY_WRAPPER: [&str; 2] = [
    "--config",
    "build.rustc-workspace-wrapper=\"clippy-driver\"",
];

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

    /// Waits for the task; its output is kept only when it failed (the
    /// error then says where).
    fn end_quietly(self) -> Result<(), String> {
        let what = self.what;
        let (outcome, _) = self
            .thread
            .join()
            .unwrap_or_else(|_| (Err(format!("the {what} panicked")), Vec::new()));
        match outcome {
            Ok(()) => {
                let _ = std::fs::remove_file(&self.log_path);
                Ok(())
            }
            Err(e) => Err(format!("{e} (its output: {})", self.log_path.display())),
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

/// [`lint`](super::lint) beside the tests: niced, in `target/lint` (under
/// `CARGO_TARGET_DIR` if set), its output to `log`; its clippy of the whole
/// workspace only if `workspace` says so.
fn lint_beside(log: &std::fs::File, workspace: WorkspaceClippy) -> Result<(), String> {
    let target = std::env::var_os("CARGO_TARGET_DIR").unwrap_or_else(|| "target".into());
    let target = std::path::Path::new(&target).join("lint");
    let target = target.to_str().ok_or("the target directory is not UTF-8")?;
    lint_with(workspace, &|args, env| {
        let mut niced = vec!["-n", "19", "cargo"];
        niced.extend(args);
        let mut env = env.to_vec();
        env.push(("CARGO_TARGET_DIR", target));
        run_logged("nice", &niced, &env, Some(log))
    })
}

/// One `cargo test` run of [`test()`](super::test()).
pub(super) struct Phase {
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
    /// All but those whose names contain one of these.
    ExceptAny(&'static [&'static str]),
}

impl Names {
    /// The test harness's arguments that select these names.
    fn args(self) -> Vec<&'static str> {
        match self {
            Names::All => vec![],
            Names::Only(name) => vec![name],
            Names::Except(name) => vec!["--skip", name],
            Names::ExceptAny(names) => names.iter().flat_map(|name| ["--skip", name]).collect(),
        }
    }
}

impl Phase {
    /// Every test on `server`.
    pub(super) fn all(server: &'static str, what: &'static str) -> Self {
        Self {
            server,
            targets: &[],
            names: Names::All,
            what,
            lane: "a",
        }
    }

    /// [`VALKEY_SET`] on Valkey, but [`NOT_ON_VALKEY`].
    pub(super) fn valkey_set() -> Self {
        Self {
            server: "valkey",
            targets: VALKEY_SET,
            names: Names::ExceptAny(NOT_ON_VALKEY),
            what: "the tests where servers can differ (VALKEY_SET but NOT_ON_VALKEY, xtask/src/main.rs)",
            lane: "b",
        }
    }

    /// [`REDIS8_SET`] on Redis 8.
    pub(super) fn redis8_set() -> Self {
        Self {
            server: "redis8",
            targets: REDIS8_SET,
            names: Names::All,
            what: "the tests where Redis 8's own commands replace scripts (REDIS8_SET)",
            ..Self::valkey_set()
        }
    }

    /// [`run`](Self::run) when Redis 8 is installed; else a line in
    /// `report` that says it was skipped, and why.
    pub(super) fn run_if_installed(
        &self,
        extra: &[&str],
        report: &mut Vec<String>,
        log: Option<&std::fs::File>,
    ) -> Result<(), String> {
        self.run_as_if_installed(&Run::Cargo(extra), report, log)
    }

    fn run_as_if_installed(
        &self,
        how: &Run<'_>,
        report: &mut Vec<String>,
        log: Option<&std::fs::File>,
    ) -> Result<(), String> {
        if self.server == "redis8" && !redis8::installed() {
            report.push(format!(
                "redis8: SKIPPED {}: no redis-server {} in {} (see `cargo xtask deps`'s output)",
                self.what,
                redis8::VERSION,
                redis8::dir().display()
            ));
            return Ok(());
        }
        self.run_as(how, report, log)
    }

    /// `cargo test`'s arguments, `extra` among them.
    pub(super) fn cargo_args<'a>(&self, extra: &[&'a str]) -> Vec<&'a str> {
        // `--workspace` either way: features unified as in the whole run,
        // so a selection of targets rebuilds as little as it can.
        let mut args = vec!["test", "--workspace"];
        for &(_, target) in self.targets {
            args.extend(["--test", target]);
        }
        args.push("--all-features");
        args.extend(extra);
        let names = self.names.args();
        if names.is_empty() {
            return args;
        }
        if !args.contains(&"--") {
            args.push("--");
        }
        args.extend(names);
        args
    }

    /// `cargo test` with `extra`, as [`run_as`](Self::run_as).
    pub(super) fn run(
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
        let mut env = vec![
            ("LOCK_TEST_SERVER", server),
            ("LOCK_TEST_SKIPS", skips_path),
        ];
        let bin = match server {
            "valkey" => Some(("VALKEY_SERVER", valkey::server())),
            "redis8" => Some(("REDIS8_SERVER", redis8::server())),
            _ => None,
        };
        if let Some((name, bin)) = &bin {
            let bin = bin
                .to_str()
                .ok_or_else(|| format!("{} is not UTF-8", bin.display()))?;
            env.push((name, bin));
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
        let args = self.names.args();
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

/// `cargo ARGS --message-format=json` (ARGS: a `cargo test --no-run`, with
/// no `--`), its diagnostics shown as cargo shows them: the integration
/// test programs it built, and how many distinct warnings the workspace's
/// crates had (dependencies' are capped by cargo).
fn build_tests(args: &[&str]) -> Result<(Vec<Built>, usize), String> {
    let shown = format!("cargo {}", args.join(" "));
    eprintln!("+ {shown}");
    let output = Command::new("cargo")
        .args(args)
        .arg("--message-format=json")
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run `{shown}`: {e}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let messages: Vec<serde_json::Value> = stdout
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    // A lib's warnings come twice, from it and from its test harness.
    let mut warnings = std::collections::BTreeSet::new();
    for message in &messages {
        if let Some((level, rendered)) = diagnostic(message) {
            eprint!("{rendered}");
            if level == "warning" {
                warnings.insert(rendered);
            }
        }
    }
    if !output.status.success() {
        return Err(format!("`{shown}` failed ({})", output.status));
    }
    let built = messages.iter().filter_map(built_test).collect();
    Ok((built, warnings.len()))
}

/// A compiler's diagnostic about a line of code, among cargo's JSON
/// messages: its level and its text as the compiler renders it (the
/// summaries, "N warnings emitted", point at no code and are left out).
fn diagnostic(message: &serde_json::Value) -> Option<(&str, &str)> {
    if message["reason"] != "compiler-message" {
        return None;
    }
    let diagnostic = &message["message"];
    if diagnostic["spans"].as_array().is_none_or(Vec::is_empty) {
        return None;
    }
    Some((
        diagnostic["level"].as_str()?,
        diagnostic["rendered"].as_str()?,
    ))
}

/// The integration test program one of cargo's JSON messages reports
/// built, if it does.
fn built_test(message: &serde_json::Value) -> Option<Built> {
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

#[cfg(test)]
mod tests {
    use super::diagnostic;

    #[test]
    fn a_lint_pointing_at_code_is_a_warning_and_a_summary_is_nothing() {
        // Shortened from a `cargo test --message-format=json` through
        // clippy's driver.
        let lint = serde_json::json!({
            "reason": "compiler-message",
            "package_id": "path+file:///w/t#0.1.0",
            "message": {
                "level": "warning",
                "spans": [{"file_name": "src/lib.rs", "line_start": 1}],
                "rendered": "warning: writing `&Vec` instead of `&[_]`\n --> src/lib.rs:1:13\n",
            },
        });
        assert_eq!(
            diagnostic(&lint),
            Some((
                "warning",
                "warning: writing `&Vec` instead of `&[_]`\n --> src/lib.rs:1:13\n"
            ))
        );
        let summary = serde_json::json!({
            "reason": "compiler-message",
            "message": {"level": "warning", "spans": [], "rendered": "warning: 1 warning emitted\n"},
        });
        assert_eq!(diagnostic(&summary), None);
        let artifact = serde_json::json!({"reason": "compiler-artifact"});
        assert_eq!(diagnostic(&artifact), None);
    }
}
