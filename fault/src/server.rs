//! `redis-server` processes on free loopback ports, and signals.
//!
//! The harness's own copy of the test support in the `tests` package (which
//! panics on failure; here failures are errors the program reports): options
//! for persistence and TLS, restart on the same port and directory, and
//! SIGSTOP/SIGCONT/SIGKILL by process id for servers and workers alike.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A fallible result with a message.
pub type Result<T> = std::result::Result<T, String>;

/// A free loopback TCP port (bound, then released).
pub fn free_port() -> Result<u16> {
    let listener =
        TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind a loopback port: {e}"))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| e.to_string())
}

/// Sends `sig` (`STOP`, `CONT`, `KILL`, ...) to `pid` with kill(1).
pub fn signal(pid: u32, sig: &str) -> Result<()> {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("kill -{sig} {pid}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("kill -{sig} {pid}: {status}"))
    }
}

/// TLS files for `redis-server --tls-port`.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// The self-signed CA certificate clients must trust.
    pub ca: PathBuf,
    /// The server's certificate (for `127.0.0.1`, signed by the CA).
    pub cert: PathBuf,
    /// Its key.
    pub key: PathBuf,
}

fn openssl(args: &[&str], dir: &Path) -> Result<()> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .map_err(|e| format!("openssl: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "openssl {} failed: {}",
            args.first().copied().unwrap_or_default(),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Generates with `openssl`, in `dir`, a self-signed CA (`openssl req -x509`)
/// and a server certificate for `127.0.0.1` signed by it. (rustls refuses a
/// self-signed CA certificate presented as the server's own:
/// `CaUsedAsEndEntity`; so the server gets a leaf.)
pub fn self_signed_cert(dir: &Path) -> Result<TlsFiles> {
    openssl(
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=fault test CA",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
        ],
        dir,
    )?;
    openssl(
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            "redis.key",
            "-out",
            "redis.csr",
        ],
        dir,
    )?;
    std::fs::write(
        dir.join("leaf.ext"),
        "basicConstraints=critical,CA:FALSE\nsubjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    )
    .map_err(|e| e.to_string())?;
    openssl(
        &[
            "x509",
            "-req",
            "-in",
            "redis.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "leaf.ext",
            "-out",
            "redis.crt",
        ],
        dir,
    )?;
    Ok(TlsFiles {
        ca: dir.join("ca.crt"),
        cert: dir.join("redis.crt"),
        key: dir.join("redis.key"),
    })
}

/// A `redis-server` on `127.0.0.1:<free port>` with its own directory; killed
/// on drop.
#[derive(Debug)]
pub struct Server {
    /// The port (the TLS port when started with TLS).
    pub port: u16,
    child: Option<Child>,
    dir: tempfile::TempDir,
    args: Vec<String>,
    /// The CA file when serving TLS.
    tls: Option<PathBuf>,
    password: Option<String>,
}

impl Server {
    /// Starts a server with no persistence and `extra` options
    /// (`["--appendonly", "yes"]`).
    pub fn start(extra: &[&str]) -> Result<Self> {
        Self::start_inner(extra, None)
    }

    /// Starts a TLS-only server (`--port 0 --tls-port P`) with `files`, not
    /// asking clients for certificates.
    pub fn start_tls(files: &TlsFiles, extra: &[&str]) -> Result<Self> {
        Self::start_inner(extra, Some(files))
    }

    fn start_inner(extra: &[&str], tls: Option<&TlsFiles>) -> Result<Self> {
        let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
        let port = free_port()?;
        let mut args: Vec<String> = vec![
            "--bind".into(),
            "127.0.0.1".into(),
            "--save".into(),
            String::new(),
            "--appendonly".into(),
            "no".into(),
            "--daemonize".into(),
            "no".into(),
        ];
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
        let mut server = Self {
            port,
            child: None,
            dir,
            args,
            tls: tls.map(|f| f.ca.clone()),
            password,
        };
        server.spawn()?;
        Ok(server)
    }

    fn spawn(&mut self) -> Result<()> {
        let child = Command::new("redis-server")
            .args(&self.args)
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!(
                    "cannot start redis-server ({e}); install it (apt-get install redis-server)"
                )
            })?;
        self.child = Some(child);
        self.wait_ready()
    }

    fn wait_ready(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if self.cli(&["PING"]).is_ok_and(|a| a == "PONG") {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(format!(
            "redis-server on port {} did not come up",
            self.port
        ))
    }

    /// `redis://127.0.0.1:<port>` (or `rediss://`).
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// The server's directory (AOF files live there).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL: no shutdown, no save.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port and directory (AOF is reloaded).
    pub fn restart(&mut self) -> Result<()> {
        self.kill();
        self.spawn()
    }

    /// SIGSTOP.
    pub fn pause(&self) -> Result<()> {
        self.pid().map_or(Ok(()), |pid| signal(pid, "STOP"))
    }

    /// SIGCONT.
    pub fn resume(&self) -> Result<()> {
        self.pid().map_or(Ok(()), |pid| signal(pid, "CONT"))
    }

    /// Runs a command through `redis-cli`; the answer's text.
    pub fn cli(&self, args: &[&str]) -> Result<String> {
        let mut cmd = Command::new("redis-cli");
        cmd.arg("-p").arg(self.port.to_string());
        if let Some(ca) = &self.tls {
            cmd.arg("--tls").arg("--cacert").arg(ca);
        }
        if let Some(pw) = &self.password {
            cmd.arg("--no-auth-warning").arg("-a").arg(pw);
        }
        let out = cmd
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("redis-cli: {e}"))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.resume();
        self.kill();
    }
}
