//! The workspace's tasks, run with `cargo xtask <task>` (an alias in
//! `.cargo/config.toml`). One definition of "the tests", used by the README,
//! by developers and by CI (`.ci/run` calls `cargo xtask ci`).
//!
//! * `cargo xtask test [ARGS]`: installs what the tests need when it is
//!   missing (`redis-server`, `redis-sentinel`, `redis-cli`, `openssl`,
//!   PostgreSQL's `initdb` and server, from Debian's packages, with `sudo`
//!   when not root), then runs
//!   `cargo test --workspace --all-features [ARGS]`.
//! * `cargo xtask lint`: `cargo fmt --check`; clippy with `-D warnings` on the
//!   workspace (every feature) and on `lock-runtime` with no feature and with
//!   each feature alone; rustdoc with `-D warnings` for the same sets.
//! * `cargo xtask ci`: `lint`, then `test`.
//! * `cargo xtask deps`: only the installation step.
//! * `cargo xtask first-run [RUNS]`: seconds from a fresh clone, with an
//!   empty cargo cache, to the example order service listening
//!   (`first_run.rs`).

use std::process::{Command, ExitCode};

mod first_run;

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

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (task, rest) = match args.split_first() {
        Some((task, rest)) => (task.as_str(), rest),
        None => ("help", &[][..]),
    };
    let outcome = match task {
        "test" => deps().and_then(|()| test(rest)),
        "lint" => lint(),
        "ci" => deps().and_then(|()| lint()).and_then(|()| test(rest)),
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
     test [ARGS]  install what the tests need, then cargo test --workspace --all-features [ARGS]\n  \
     lint         fmt --check, clippy -D warnings and rustdoc on each feature set\n  \
     ci           deps, lint, then test (what .ci/run runs)\n  \
     deps         only install what the tests need\n  \
     first-run [RUNS]  seconds from a fresh clone (empty cargo cache) to the order service listening"
}

/// Runs `program args`, echoing it; an error names the command.
fn run(program: &str, args: &[&str], env: &[(&str, &str)]) -> Result<(), String> {
    let shown = format!("{program} {}", args.join(" "));
    eprintln!("+ {shown}");
    let status = Command::new(program)
        .args(args)
        .envs(env.iter().copied())
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

/// Installs the Debian packages of the missing tools.
fn deps() -> Result<(), String> {
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

/// The test suite: every package, every feature.
fn test(extra: &[String]) -> Result<(), String> {
    let mut args = vec!["test", "--workspace", "--all-features"];
    args.extend(extra.iter().map(String::as_str));
    run("cargo", &args, &[])
}

/// Formatting, clippy and rustdoc, warning-free.
fn lint() -> Result<(), String> {
    let deny = [("RUSTDOCFLAGS", "-Dwarnings")];
    run("cargo", &["fmt", "--all", "--check"], &[])?;
    single_feature_cfgs(std::path::Path::new("lock-runtime/src"))?;
    run(
        "cargo",
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
        run("cargo", &clippy, &[])?;
        let mut doc = vec!["doc", "--no-deps", "--quiet"];
        doc.extend(common);
        run("cargo", &doc, &deny)?;
    }
    run(
        "cargo",
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
    use super::combines_features;

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
