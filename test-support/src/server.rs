//! The `redis-server` launcher, free ports and signals.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::{Result, ServerKind, TlsFiles};

/// A free loopback TCP port (bound, then released).
pub fn try_free_port() -> Result<u16> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free loopback port: {e}"))
}

/// [`try_free_port`], panicking on failure.
pub fn free_port() -> u16 {
    try_free_port().unwrap_or_else(|e| panic!("{e}"))
}

/// The server binary of the server the tests run on ([`ServerKind::current`]):
/// `redis-server` (or `$REDIS_SERVER`) by default, `valkey-server` with
/// `LOCK_TEST_SERVER=valkey`.
pub fn redis_server_bin() -> PathBuf {
    ServerKind::current().server_bin()
}

/// Sends `sig` (`STOP`, `CONT`, `KILL`, ... without the `SIG`) to `pid` with
/// kill(1).
pub fn signal(pid: u32, sig: &str) -> Result<()> {
    let what = format!("kill -{sig} {pid}");
    match Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .stderr(Stdio::null())
        .status()
    {
        Ok(status) if status.success() => Ok(()),
        Ok(status) => Err(format!("{what}: {status}")),
        Err(e) => Err(format!("{what}: {e}")),
    }
}

/// Spawns `cmd` with no standard input or output; `hint` says what to do
/// when it cannot start (`install redis-server`).
pub(crate) fn spawn_quiet(mut cmd: Command, hint: &str) -> Result<Child> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {cmd:?} ({e}); {hint}"))
}

/// A `redis-server` on `127.0.0.1:<free port>` with its own temporary
/// directory (its log is `redis.log` there), no persistence unless asked.
/// Killed (SIGKILL) and cleaned up on drop. The server is the one
/// `LOCK_TEST_SERVER` chooses (see [`ServerKind`]): `valkey-server` takes the
/// same options.
#[derive(Debug)]
pub struct RedisServer {
    /// The port (the TLS port when started with TLS).
    pub port: u16,
    child: Option<Child>,
    dir: tempfile::TempDir,
    args: Vec<String>,
    /// The certificates when serving TLS.
    tls: Option<TlsFiles>,
    password: Option<String>,
}

impl RedisServer {
    /// Starts a server with no persistence; panics if it cannot.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server with extra `--option value` arguments
    /// (e.g. `["--requirepass", "secret"]`); panics if it cannot.
    pub fn start_with(extra: &[&str]) -> Self {
        Self::try_start(extra).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts a server with no persistence and `extra` options
    /// (`["--appendonly", "yes"]`). Tries another port if the chosen one was
    /// taken in the meantime.
    pub fn try_start(extra: &[&str]) -> Result<Self> {
        Self::start_retrying(extra, None)
    }

    /// Starts a TLS-only server (`--port 0 --tls-port P`) with `files`, not
    /// asking clients for certificates.
    /// An error on a server without TLS (see [`ServerKind::has_tls`]; tests
    /// ask [`crate::tls_available`] first).
    pub fn try_start_tls(files: &TlsFiles, extra: &[&str]) -> Result<Self> {
        let kind = ServerKind::current();
        if !kind.has_tls() {
            return Err(format!("the {kind} server the tests use has no TLS"));
        }
        Self::start_retrying(extra, Some(files))
    }

    /// Starts a server with `extra` options on `port` (which must be free).
    pub fn try_start_on(port: u16, extra: &[&str]) -> Result<Self> {
        Self::start_port(port, extra, None)
    }

    fn start_retrying(extra: &[&str], tls: Option<&TlsFiles>) -> Result<Self> {
        let mut last = String::new();
        for _ in 0..3 {
            match Self::start_port(try_free_port()?, extra, tls) {
                Ok(server) => return Ok(server),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn start_port(port: u16, extra: &[&str], tls: Option<&TlsFiles>) -> Result<Self> {
        let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
        let mut args: Vec<String> = [
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--protected-mode",
            "yes",
        ]
        .map(String::from)
        .into();
        if let Some(files) = tls {
            args.extend([
                "--port".into(),
                "0".into(),
                "--tls-port".into(),
                port.to_string(),
                "--tls-cert-file".into(),
                files.cert.display().to_string(),
                "--tls-key-file".into(),
                files.key.display().to_string(),
                "--tls-ca-cert-file".into(),
                files.ca.display().to_string(),
                "--tls-auth-clients".into(),
                "no".into(),
            ]);
        } else {
            args.extend(["--port".into(), port.to_string()]);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let password = extra
            .iter()
            .position(|a| *a == "--requirepass")
            .and_then(|i| extra.get(i + 1))
            .map(|s| s.to_string());
        // From here on, Drop cleans up whatever happens.
        let mut server = Self {
            port,
            child: None,
            dir,
            args,
            tls: tls.cloned(),
            password,
        };
        server.spawn()?;
        Ok(server)
    }

    fn spawn(&mut self) -> Result<()> {
        let kind = ServerKind::current();
        let mut cmd = Command::new(kind.server_bin());
        cmd.args(&self.args)
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(self.dir.path().join("redis.log"));
        self.child = Some(spawn_quiet(cmd, kind.install_hint())?);
        self.wait_ready()
    }

    fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                return Err(format!(
                    "{} on port {} exited at start ({status}); its log: {}",
                    ServerKind::current(),
                    self.port,
                    self.dir.path().join("redis.log").display()
                ));
            }
            let up = if self.tls.is_some() {
                self.try_cli(&["PING"]).is_ok_and(|a| a == "PONG")
            } else {
                ping(self.port)
            };
            if up {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Err(format!(
            "redis-server on port {} did not come up",
            self.port
        ))
    }

    /// `redis://127.0.0.1:<port>` (or `rediss://` with TLS).
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// The server's directory (its log, AOF and cluster files live there).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILLs the server (no shutdown, no save).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port and directory (an AOF is
    /// reloaded; without persistence it comes back empty).
    pub fn restart(&mut self) -> Result<()> {
        self.restart_with(&[])
    }

    /// The same with `extra` options for this start only (later options
    /// override earlier ones).
    pub fn restart_with(&mut self, extra: &[&str]) -> Result<()> {
        self.kill();
        let base = self.args.len();
        self.args.extend(extra.iter().map(|s| s.to_string()));
        let started = self.spawn();
        self.args.truncate(base);
        started
    }

    /// SIGSTOPs the server: it keeps its data and connections but answers
    /// nothing until [`RedisServer::resume`].
    pub fn pause(&self) -> Result<()> {
        self.pid().map_or(Ok(()), |pid| signal(pid, "STOP"))
    }

    /// SIGCONTs the server.
    pub fn resume(&self) -> Result<()> {
        self.pid().map_or(Ok(()), |pid| signal(pid, "CONT"))
    }

    fn run_cli(&self, args: &[&str]) -> std::io::Result<Output> {
        let mut cmd = Command::new("redis-cli");
        cmd.args(["-h", "127.0.0.1", "-p", &self.port.to_string()]);
        if let Some(files) = &self.tls {
            // The server's certificate serves as redis-cli's own too, where
            // the server asks clients for one (`--tls-auth-clients yes`).
            cmd.arg("--tls").arg("--cacert").arg(&files.ca);
            cmd.arg("--cert")
                .arg(&files.cert)
                .arg("--key")
                .arg(&files.key);
        }
        if let Some(pw) = &self.password {
            cmd.arg("--no-auth-warning").arg("-a").arg(pw);
        }
        cmd.args(args).stdin(Stdio::null()).output()
    }

    /// Runs a command through `redis-cli` (for setup and inspection) and
    /// returns its trimmed standard output, where error replies are printed
    /// too. Panics if `redis-cli` cannot run.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = self
            .run_cli(args)
            .unwrap_or_else(|e| panic!("cannot run redis-cli ({e}); install redis-tools"));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Runs a command through `redis-cli`; the answer's text, or `Err` with
    /// what `redis-cli` printed on its error output when it fails (the
    /// server is down, say).
    pub fn try_cli(&self, args: &[&str]) -> Result<String> {
        let out = self.run_cli(args).map_err(|e| format!("redis-cli: {e}"))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// The compare-and-delete command of its own this server has
    /// ([`native_release`](crate::native_release): `DELIFEQ`, `DELEX`), as its
    /// `INFO server` says, or `None`.
    pub fn native_release(&self) -> Option<&'static str> {
        crate::native_release(&self.cli(&["INFO", "server"]))
    }

    /// How many times the server ran `command` (lowercase, `script|load` for
    /// a subcommand), from `INFO commandstats`; 0 when it never ran.
    pub fn command_calls(&self, command: &str) -> u64 {
        let stats = self.cli(&["INFO", "commandstats"]);
        crate::topology::info_field(&stats, &format!("cmdstat_{command}"))
            .and_then(|v| {
                v.split(',')
                    .find_map(|kv| kv.strip_prefix("calls="))
                    .and_then(|n| n.parse().ok())
            })
            .unwrap_or(0)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.resume();
        self.kill();
    }
}

/// `true` once a server on `port` answers `PING` (`+PONG`, or `-NOAUTH` when
/// a password is required: up either way).
fn ping(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    if s.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 64];
    matches!(s.read(&mut buf), Ok(n) if n > 0 && (buf.starts_with(b"+PONG") || buf.starts_with(b"-NOAUTH")))
}
