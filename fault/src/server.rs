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

/// Polls `check` every 20 ms for up to `limit`; the last observation on
/// failure.
pub fn poll<T>(limit: Duration, what: &str, mut check: impl FnMut() -> Result<T>) -> Result<T> {
    let started = Instant::now();
    loop {
        match check() {
            Ok(value) => return Ok(value),
            Err(last) if started.elapsed() > limit => {
                return Err(format!("{what}: not within {limit:?}; last seen: {last}"));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// A `field:value` line of an `INFO` answer.
pub fn info_field(info: &str, field: &str) -> Option<String> {
    let prefix = format!("{field}:");
    info.lines()
        .find_map(|l| l.trim().strip_prefix(&prefix))
        .map(|v| v.trim().to_owned())
}

/// The name the sentinels monitor the master under.
pub const MASTER_NAME: &str = "faultmaster";

/// One `redis-sentinel` with its own config file.
#[derive(Debug)]
struct Sentinel {
    port: u16,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Sentinel {
    fn start(master_port: u16) -> Result<Self> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let port = free_port()?;
        let config = format!(
            "port {port}\nbind 127.0.0.1\nprotected-mode no\ndaemonize no\ndir {dir}\nlogfile \"\"\n\
             sentinel resolve-hostnames no\nsentinel announce-ip 127.0.0.1\n\
             sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2\n\
             sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
             sentinel failover-timeout {MASTER_NAME} 3000\n\
             sentinel parallel-syncs {MASTER_NAME} 1\n",
            dir = dir.path().display(),
        );
        let path = dir.path().join("sentinel.conf");
        std::fs::write(&path, config).map_err(|e| e.to_string())?;
        let child = Command::new("redis-sentinel")
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!("cannot start redis-sentinel ({e}); apt-get install redis-sentinel")
            })?;
        let sentinel = Self {
            port,
            child,
            _dir: dir,
        };
        poll(
            Duration::from_secs(10),
            "a sentinel answers PING",
            || match sentinel.cli(&["PING"]) {
                Ok(a) if a == "PONG" => Ok(()),
                other => Err(format!("{other:?}")),
            },
        )?;
        Ok(sentinel)
    }

    fn cli(&self, args: &[&str]) -> Result<String> {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("redis-cli: {e}"))?;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// The master's port according to this sentinel.
    fn master_port(&self) -> Option<u16> {
        let answer = self
            .cli(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME])
            .ok()?;
        answer.lines().nth(1).and_then(|p| p.trim().parse().ok())
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A master, one replica and three sentinels (quorum 2, down-after 1 s).
#[derive(Debug)]
pub struct SentinelGroup {
    /// The two data servers; which one is master changes with failovers.
    pub servers: [Server; 2],
    sentinels: Vec<Sentinel>,
}

impl SentinelGroup {
    /// Starts everything and waits until the replica acknowledges writes and
    /// every sentinel knows the replica and the other sentinels.
    pub fn start() -> Result<Self> {
        let master = Server::start(&["--repl-diskless-sync-delay", "0"])?;
        let port = master.port.to_string();
        let replica = Server::start(&[
            "--replicaof",
            "127.0.0.1",
            &port,
            "--repl-diskless-sync-delay",
            "0",
        ])?;
        let sentinels = (0..3)
            .map(|_| Sentinel::start(master.port))
            .collect::<Result<Vec<_>>>()?;
        let group = Self {
            servers: [master, replica],
            sentinels,
        };
        group.wait_replicated()?;
        for (i, s) in group.sentinels.iter().enumerate() {
            poll(
                Duration::from_secs(15),
                &format!("sentinel {i} knows the replica and 2 other sentinels"),
                || {
                    let master = s.cli(&["SENTINEL", "MASTER", MASTER_NAME])?;
                    let fields: Vec<&str> = master.lines().map(str::trim).collect();
                    let get = |name: &str| {
                        fields
                            .chunks(2)
                            .find(|c| c.len() == 2 && c[0] == name)
                            .map(|c| c[1])
                    };
                    if get("num-slaves") == Some("1") && get("num-other-sentinels") == Some("2") {
                        Ok(())
                    } else {
                        Err(master)
                    }
                },
            )?;
        }
        Ok(group)
    }

    /// The sentinels' URLs.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| format!("redis://127.0.0.1:{}", s.port))
            .collect()
    }

    /// Which of [`Self::servers`] the sentinels name as master.
    pub fn master_index(&self) -> Option<usize> {
        let port = self.sentinels[0].master_port()?;
        self.servers.iter().position(|s| s.port == port)
    }

    /// Waits until the server the sentinels name as master has a replica that
    /// acknowledges writes. The name is read again on every try: on a loaded
    /// machine the sentinels may fail over once more (a master that answers
    /// nothing for `down-after-milliseconds`), and then the group is whole
    /// again the other way round.
    pub fn wait_replicated(&self) -> Result<()> {
        poll(
            Duration::from_secs(30),
            "the master the sentinels name has a replica that acknowledges writes",
            || {
                let master = self
                    .master_index()
                    .ok_or_else(|| "the sentinels name no master of the group".to_owned())?;
                let m = &self.servers[master];
                let info = m.cli(&["INFO", "replication"])?;
                if info_field(&info, "role").as_deref() != Some("master")
                    || info_field(&info, "connected_slaves").as_deref() != Some("1")
                {
                    return Err(format!("server {master}: {info}"));
                }
                match m.cli(&["WAIT", "1", "200"])?.as_str() {
                    "1" => Ok(()),
                    other => Err(format!("server {master}: WAIT 1 answered {other}")),
                }
            },
        )
    }

    /// SIGKILLs the master, waits until every sentinel names the other
    /// server, restarts the old master empty (the sentinels make it a
    /// replica of the new one) and waits until it acknowledges writes.
    /// Returns when the group is whole again.
    pub fn failover(&mut self) -> Result<()> {
        let old = self
            .master_index()
            .ok_or("no master known to the sentinels")?;
        let new = 1 - old;
        self.servers[old].kill();
        let new_port = self.servers[new].port;
        poll(
            Duration::from_secs(30),
            "every sentinel names the new master",
            || {
                let seen: Vec<Option<u16>> =
                    self.sentinels.iter().map(Sentinel::master_port).collect();
                let role = self.servers[new]
                    .cli(&["INFO", "replication"])
                    .ok()
                    .and_then(|i| info_field(&i, "role"));
                if seen.iter().all(|p| *p == Some(new_port)) && role.as_deref() == Some("master") {
                    Ok(())
                } else {
                    Err(format!("{seen:?}, role {role:?}"))
                }
            },
        )?;
        self.servers[old].restart()?;
        self.wait_replicated()
    }
}
