//! The PostgreSQL launcher: `initdb` and `postgres` in a temporary directory.

use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{Result, signal, try_free_port};

/// The directory of PostgreSQL's server programs: `$PG_BIN_DIR`, else the
/// newest `/usr/lib/postgresql/*/bin` (where Debian's `postgresql` package
/// puts them, off the `PATH`), else the directory of `initdb` on the `PATH`.
pub fn postgres_bin_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("PG_BIN_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let debian = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version: u32 = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .max();
    if let Some((_, bin)) = debian {
        return Ok(bin);
    }
    std::env::var_os("PATH")
        .and_then(|paths| std::env::split_paths(&paths).find(|dir| dir.join("initdb").is_file()))
        .ok_or_else(|| {
            "no initdb in /usr/lib/postgresql/*/bin nor on the PATH: install postgresql \
             (`cargo xtask deps` does), or set PG_BIN_DIR"
                .to_string()
        })
}

/// A PostgreSQL server on `127.0.0.1:<free port>` (no other address), with
/// its data, log (`postgres.log`) and unix socket in its own temporary
/// directory; trust authentication for the user `postgres`; durability off
/// (`fsync=off`), for speed. Stopped and removed on drop.
///
/// PostgreSQL refuses to run as root: when the tests run as root, `initdb`
/// and `postgres` run as the `postgres` user (which Debian's package
/// creates), and the directory is handed to it.
#[derive(Debug)]
pub struct PostgresServer {
    /// The TCP port.
    pub port: u16,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl PostgresServer {
    /// Starts a server; panics if it cannot.
    pub fn start() -> Self {
        Self::try_start().unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts a server. Tries another port if the chosen one was taken in
    /// the meantime.
    pub fn try_start() -> Result<Self> {
        let bin = postgres_bin_dir()?;
        let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
        let user = run_as()?;
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))
                .map_err(|e| format!("chown {} to postgres: {e}", dir.path().display()))?;
        }
        let data = dir.path().join("data");
        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-locale"])
            .arg("--no-sync");
        let out = as_user(&mut initdb, user, dir.path())
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run {initdb:?} ({e}); install postgresql"))?;
        if !out.status.success() {
            return Err(format!(
                "initdb failed ({}): {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let mut server = Self {
            port: 0,
            child: None,
            dir,
        };
        let mut last = String::new();
        for _ in 0..3 {
            server.port = try_free_port()?;
            match server.spawn(&bin, user) {
                Ok(()) => return Ok(server),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn spawn(&mut self, bin: &Path, user: Option<(u32, u32)>) -> Result<()> {
        let log = std::fs::File::create(self.dir.path().join("postgres.log"))
            .map_err(|e| format!("postgres.log: {e}"))?;
        let mut cmd = Command::new(bin.join("postgres"));
        cmd.arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-p", &self.port.to_string()])
            .arg("-k")
            .arg(self.dir.path())
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", "fsync=off", "-c", "synchronous_commit=off"])
            .args(["-c", "full_page_writes=off"]);
        let stderr = log.try_clone().map_err(|e| format!("postgres.log: {e}"))?;
        let child = as_user(&mut cmd, user, self.dir.path())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(stderr)
            .spawn()
            .map_err(|e| format!("cannot start {cmd:?} ({e}); install postgresql"))?;
        self.child = Some(child);
        let ready = bin.join("pg_isready");
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                return Err(format!(
                    "postgres on port {} exited at start ({status}): {}",
                    self.port,
                    self.log()
                ));
            }
            let up = Command::new(&ready)
                .args(["-q", "-h", "127.0.0.1", "-p", &self.port.to_string()])
                .args(["-U", "postgres", "-t", "1"])
                .stdin(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if up {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.stop();
        Err(format!(
            "postgres on port {} did not come up: {}",
            self.port,
            self.log()
        ))
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// A pool of up to `connections` connections to the server (a
    /// connection waited for up to 20 s), with `schema` (SQL statements)
    /// run once.
    #[cfg(feature = "postgres")]
    pub async fn pool(&self, connections: u32, schema: &str) -> lock_runtime::sqlx::PgPool {
        use lock_runtime::sqlx;
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(connections)
            .acquire_timeout(std::time::Duration::from_secs(20))
            .connect(&self.url())
            .await
            .expect("a pool of connections to the test's PostgreSQL");
        sqlx::raw_sql(schema)
            .execute(&pool)
            .await
            .expect("the test's schema");
        pool
    }

    /// A pool to the same server as `pool`, for a "process" of a test (a
    /// runtime of its own, killed by dropping it): its connections end with
    /// it, where a pool shared with the test would hand the test a
    /// connection whose runtime was killed.
    #[cfg(feature = "postgres")]
    pub async fn own_pool(pool: &lock_runtime::sqlx::PgPool) -> lock_runtime::sqlx::PgPool {
        let options = (*pool.connect_options()).clone();
        lock_runtime::sqlx::postgres::PgPoolOptions::new()
            .max_connections(5)
            .connect_with(options)
            .await
            .expect("a pool of a test's process")
    }

    /// The temporary directory (data in `data/`, log in `postgres.log`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The postmaster's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The server's log, for error messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("postgres.log")).unwrap_or_default()
    }

    /// Stops the server: a fast shutdown (SIGINT: sessions are ended, no
    /// waiting for clients), SIGKILL if it has not ended in 10 s.
    fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = signal(child.id(), "INT");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `Some((uid, gid))` of the `postgres` user when this process runs as root
/// (PostgreSQL refuses to), `None` otherwise.
fn run_as() -> Result<Option<(u32, u32)>> {
    // `/proc/self` belongs to the process's effective user.
    let euid = std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .map_err(|e| format!("/proc/self: {e}"))?;
    if euid != 0 {
        return Ok(None);
    }
    let passwd = std::fs::read_to_string("/etc/passwd").map_err(|e| format!("/etc/passwd: {e}"))?;
    passwd
        .lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            match fields.as_slice() {
                ["postgres", _, uid, gid, ..] => Some((uid.parse().ok()?, gid.parse().ok()?)),
                _ => None,
            }
        })
        .map(Some)
        .ok_or_else(|| {
            "running as root, and there is no `postgres` user to run PostgreSQL as: \
             install postgresql (`cargo xtask deps` does), which creates it"
                .to_string()
        })
}

/// `cmd`, run as `user` when given, from `dir` (the user may not be allowed
/// into the current one).
fn as_user<'a>(cmd: &'a mut Command, user: Option<(u32, u32)>, dir: &Path) -> &'a mut Command {
    cmd.current_dir(dir);
    if let Some((uid, gid)) = user {
        cmd.uid(uid).gid(gid).env("HOME", dir).env_remove("PGDATA");
    }
    cmd
}
