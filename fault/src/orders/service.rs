//! The `order-service` binary, and its instances: processes on ports of
//! their own, SIGKILLed and started again on the same port.

use std::fs::File;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime};

use test_support::free_port;

/// The environment variable that names an `order-service` binary to use
/// as it is.
pub const BINARY_VAR: &str = "FAULT_ORDER_SERVICE";

/// What the binary is built from, in the workspace: a file or a folder
/// newer than the binary makes it stale.
const INPUTS: &[&str] = &[
    "Cargo.toml",
    "Cargo.lock",
    "examples/Cargo.toml",
    "examples/src",
    "lock-runtime/Cargo.toml",
    "lock-runtime/src",
    "lock-runtime/scripts",
    "lock-macros/Cargo.toml",
    "lock-macros/src",
    "lock-keys/Cargo.toml",
    "lock-keys/src",
];

/// The `order-service` binary: `$FAULT_ORDER_SERVICE` when set, else the
/// one next to `fault_exe` (the `fault` binary: cargo puts a workspace's
/// binaries side by side), built first when it is missing or older than
/// its sources. Asked once per process.
///
/// Cargo cannot make one package's binary a dependency of another's. A
/// workspace test run (`cargo xtask test`, CI) builds `order-service` for
/// the examples' own tests before any test runs, so there it is found up
/// to date; alone (`cargo test -p fault`, `cargo run -p fault`) the harness
/// builds it with `cargo build -p examples --features postgres --bin
/// order-service`, in `fault_exe`'s target directory and profile, cargo's
/// output on stderr.
pub fn binary(fault_exe: &Path) -> Result<PathBuf, String> {
    static BINARY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BINARY
        .get_or_init(|| match std::env::var_os(BINARY_VAR) {
            Some(path) => Ok(PathBuf::from(path)),
            None => up_to_date(fault_exe),
        })
        .clone()
}

/// The binary next to `fault_exe`, built first unless it is newer than
/// every input.
fn up_to_date(fault_exe: &Path) -> Result<PathBuf, String> {
    let bin = fault_exe.with_file_name("order-service");
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .ok_or("the fault crate is not in a workspace")?;
    let built = std::fs::metadata(&bin).and_then(|m| m.modified()).ok();
    let newest_input = INPUTS
        .iter()
        .filter_map(|input| newest(&workspace.join(input)))
        .max();
    if built.is_none() || newest_input > built {
        build(fault_exe, workspace)?;
    }
    Ok(bin)
}

/// When `path` (a file, or a folder and everything in it) last changed.
fn newest(path: &Path) -> Option<SystemTime> {
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_dir() {
        return meta.modified().ok();
    }
    std::fs::read_dir(path)
        .ok()?
        .flatten()
        .filter_map(|entry| newest(&entry.path()))
        .chain(meta.modified().ok())
        .max()
}

/// `cargo build -p examples --features postgres --bin order-service` in
/// `fault_exe`'s target directory and profile.
fn build(fault_exe: &Path, workspace: &Path) -> Result<(), String> {
    // target/<profile>/fault
    let profile_dir = fault_exe
        .parent()
        .ok_or_else(|| format!("{} has no directory", fault_exe.display()))?;
    let target_dir = profile_dir
        .parent()
        .ok_or_else(|| format!("{} is not in a target directory", profile_dir.display()))?;
    let profile = profile_dir
        .file_name()
        .and_then(|p| p.to_str())
        .ok_or_else(|| format!("{}: no profile", profile_dir.display()))?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(&cargo);
    command
        .current_dir(workspace)
        .args(["build", "-p", "examples", "--features", "postgres"])
        .args(["--bin", "order-service", "--target-dir"])
        .arg(target_dir);
    match profile {
        "debug" => {}
        "release" => {
            command.arg("--release");
        }
        other => {
            command.args(["--profile", other]);
        }
    }
    // What cargo sets for the program it runs (this test, `cargo run`): a
    // build script that watches one of them (ring watches the package's
    // name) would run again, and everything above it be rebuilt, for a
    // value that says nothing about the build.
    for (name, _) in std::env::vars_os() {
        let set_by_cargo = name.to_str().is_some_and(|n| {
            n.starts_with("CARGO_PKG_")
                || n.starts_with("CARGO_MANIFEST_")
                || matches!(
                    n,
                    "CARGO_CRATE_NAME"
                        | "CARGO_BIN_NAME"
                        | "CARGO_PRIMARY_PACKAGE"
                        | "CARGO_TARGET_TMPDIR"
                        | "CARGO_RUSTC_CURRENT_DIR"
                        | "OUT_DIR"
                )
        });
        if set_by_cargo {
            command.env_remove(name);
        }
    }
    eprintln!("fault: building the order service: {command:?}");
    let status = command.stdin(Stdio::null()).status().map_err(|e| {
        format!(
            "cannot run cargo ({}): {e}; or set {BINARY_VAR}",
            cargo.display()
        )
    })?;
    if !status.success() {
        return Err(format!(
            "building the order service failed ({status}); or set {BINARY_VAR}"
        ));
    }
    Ok(())
}

/// One instance of the service: its port stays, its process is killed and
/// started again.
pub struct Instance {
    bin: PathBuf,
    port: u16,
    env: Vec<(String, String)>,
    /// Every process's stderr, appended.
    log: PathBuf,
    child: Option<Child>,
}

impl Instance {
    /// Starts `bin` on a free port with `env` (besides `PORT` and
    /// `RUST_LOG`; `REDIS_URL`, `DATABASE_URL` and `NAMESPACE` come from
    /// `env` only), its stderr appended to `log`.
    pub fn start(bin: &Path, env: &[(String, String)], log: PathBuf) -> Result<Self, String> {
        let mut instance = Self {
            bin: bin.to_path_buf(),
            port: free_port(),
            env: env.to_vec(),
            log,
            child: None,
        };
        instance.spawn()?;
        Ok(instance)
    }

    fn spawn(&mut self) -> Result<(), String> {
        let stderr = File::options()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| format!("{}: {e}", self.log.display()))?;
        let child = Command::new(&self.bin)
            .env_remove("REDIS_URL")
            .env_remove("DATABASE_URL")
            .env_remove("NAMESPACE")
            .env("PORT", self.port.to_string())
            .env("RUST_LOG", "error")
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", self.bin.display()))?;
        self.child = Some(child);
        Ok(())
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Waits until it accepts connections; an error if it exits first or
    /// takes longer than `within` (its stderr in the message).
    pub fn listening(&mut self, within: Duration) -> Result<(), String> {
        let deadline = Instant::now() + within;
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            let exited = match &mut self.child {
                Some(child) => child.try_wait().map_err(|e| e.to_string())?,
                None => return Err("the order service is not running".into()),
            };
            if let Some(status) = exited {
                return Err(format!(
                    "the order service exited at start ({status}): {}",
                    self.stderr()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the order service did not listen on {} within {within:?}: {}",
                    self.port,
                    self.stderr()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// SIGKILL, and a new process on the same port at once.
    pub fn restart(&mut self) -> Result<(), String> {
        self.kill();
        self.spawn()
    }

    /// SIGKILL: no graceful shutdown, no clean-up.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The end of what its processes wrote to stderr.
    fn stderr(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(5).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_is_as_new_as_the_newest_file_in_it() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        std::fs::create_dir(&src).unwrap();
        let file = src.join("lib.rs");
        std::fs::write(&file, "").unwrap();
        let later = SystemTime::now() + Duration::from_secs(3600);
        File::options()
            .write(true)
            .open(&file)
            .unwrap()
            .set_modified(later)
            .unwrap();
        assert_eq!(newest(&file), Some(later));
        assert_eq!(newest(dir.path()), Some(later));
        assert_eq!(newest(&dir.path().join("gone")), None);
    }
}
