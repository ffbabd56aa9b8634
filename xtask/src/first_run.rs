//! `cargo xtask first-run [RUNS]`: how long a new user waits, from `git
//! clone` to the order service listening, with nothing cached.
//!
//! Each run clones the repository's committed `HEAD` into a fresh temporary
//! directory, gives cargo an empty `CARGO_HOME` (so every crate is
//! downloaded again) and an empty target directory, starts the README's
//! first command, `cargo run -p examples --bin order-service`, on a free
//! loopback port, and stops the clock when that port accepts a connection.
//! The service is then stopped and the directory removed. The figures are
//! wall-clock seconds: quote them with the machine's load.

use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A service that has not listened after this long is reported as a failure.
const GIVE_UP: Duration = Duration::from_secs(1200);

/// Runs the measurement `runs` times and prints each figure and the median.
pub(crate) fn first_run(args: &[String]) -> Result<(), String> {
    let runs: usize = match args.first() {
        None => 3,
        Some(n) => n
            .parse()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("RUNS must be a positive number, not `{n}`"))?,
    };
    let repo = repo_root()?;
    let mut seconds = Vec::with_capacity(runs);
    for run in 1..=runs {
        let took = one_run(&repo)?;
        println!(
            "run {run}/{runs}: fresh clone to listening in {:.1} s (load average {})",
            took.as_secs_f64(),
            load_average()
        );
        seconds.push(took.as_secs_f64());
    }
    seconds.sort_by(f64::total_cmp);
    println!(
        "min {:.1} s, median {:.1} s, max {:.1} s over {runs} run(s)",
        seconds[0],
        seconds[seconds.len() / 2],
        seconds[seconds.len() - 1]
    );
    Ok(())
}

/// The workspace root: xtask's manifest directory's parent.
fn repo_root() -> Result<PathBuf, String> {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .ok_or_else(|| "xtask has no parent directory".to_owned())
}

/// One clone, build and start; the time until the port accepts.
fn one_run(repo: &Path) -> Result<Duration, String> {
    let scratch = Scratch::new()?;
    let port = free_port()?;
    let started = Instant::now();
    let src = scratch.0.join("src");
    let cloned = Command::new("git")
        .args(["clone", "--quiet"])
        .arg(repo)
        .arg(&src)
        .status()
        .map_err(|e| format!("cannot run git clone: {e}"))?;
    if !cloned.success() {
        return Err(format!("git clone of {} failed ({cloned})", repo.display()));
    }
    let log = std::fs::File::create(scratch.0.join("cargo.log"))
        .map_err(|e| format!("cannot create the log: {e}"))?;
    let child = Command::new("cargo")
        .args(["run", "--quiet", "-p", "examples", "--bin", "order-service"])
        .current_dir(&src)
        .env("CARGO_HOME", scratch.0.join("cargo-home"))
        .env("CARGO_TARGET_DIR", scratch.0.join("target"))
        .env("PORT", port.to_string())
        .env_remove("REDIS_URL")
        .env_remove("DATABASE_URL")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map_err(|e| format!("cannot start cargo run: {e}"))?;
    let mut service = Service {
        cargo: child,
        program: scratch.0.join("target/debug/order-service"),
    };
    loop {
        if TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_ok() {
            return Ok(started.elapsed());
        }
        if let Some(status) = service.cargo.try_wait().map_err(|e| e.to_string())? {
            let log = std::fs::read_to_string(scratch.0.join("cargo.log")).unwrap_or_default();
            return Err(format!(
                "the order service exited ({status}) before listening:\n{log}"
            ));
        }
        if started.elapsed() > GIVE_UP {
            return Err(format!("not listening after {GIVE_UP:?}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A loopback port nobody listens on now.
fn free_port() -> Result<u16, String> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free loopback port: {e}"))
}

/// The 1-minute load average, or `?` where `/proc/loadavg` is missing.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".to_owned())
}

/// A temporary directory, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Result<Self, String> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir =
            std::env::temp_dir().join(format!("xtask-first-run-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        Ok(Self(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The order service: the `cargo run` and the program it started (found by
/// its path in the scratch target), stopped on drop.
struct Service {
    cargo: Child,
    program: PathBuf,
}

impl Drop for Service {
    fn drop(&mut self) {
        // Killing `cargo run` does not end the program it started.
        let _ = Command::new("pkill").arg("-f").arg(&self.program).status();
        let _ = self.cargo.kill();
        let _ = self.cargo.wait();
    }
}
