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

    /// Starts a server with `extra` options on `port` (which must be free).
    pub fn start_on(port: u16, extra: &[&str]) -> Result<Self> {
        Self::start_port(Some(port), extra, None)
    }

    fn start_inner(extra: &[&str], tls: Option<&TlsFiles>) -> Result<Self> {
        Self::start_port(None, extra, tls)
    }

    fn start_port(port: Option<u16>, extra: &[&str], tls: Option<&TlsFiles>) -> Result<Self> {
        let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
        let port = match port {
            Some(p) => p,
            None => free_port()?,
        };
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
            .arg("--logfile")
            .arg(self.dir.path().join("redis.log"))
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

/// What keeps one Sentinel group to itself on a loopback that other runs share
/// (other worktrees' `fault` runs and tests, or the processes of a run that
/// was killed and never cleaned up).
///
/// Sentinels know instances by address only. A sentinel of another group
/// that still knows a port (its old master, down during a failover) talks to
/// whatever server a new run starts there: it publishes its hello on it, and
/// if both groups use one master name, the new group's sentinels adopt the
/// stranger as a peer and, its configuration epoch being higher, switch the
/// master to the stranger's (`+config-update-from`, `+switch-master`) and
/// made both new servers its replicas: the new group's data was replaced by
/// another group's, whose fencing counters were lower, and tokens were
/// issued twice. (Without a shared name, a stranger's sentinel that takes the
/// new server for its own returning replica would still send it `SLAVEOF`.)
/// Hence a master name of its own per group (hellos for other names are
/// ignored) and a `SLAVEOF` that only this group's sentinels can call
/// (`rename-command`).
#[derive(Clone, Debug)]
struct Isolation {
    /// The master name: `fault-<pid>-<random>`.
    name: String,
    /// What `SLAVEOF` is renamed to on this group's servers.
    slaveof: String,
    /// What `REPLICAOF` is renamed to.
    replicaof: String,
}

impl Isolation {
    fn new() -> Result<Self> {
        let mut bytes = [0u8; 12];
        getrandom::fill(&mut bytes).map_err(|e| format!("getrandom: {e}"))?;
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        Ok(Self {
            name: format!("fault-{}-{}", std::process::id(), &hex[..8]),
            slaveof: format!("SLAVEOF-{}", &hex[8..]),
            replicaof: format!("REPLICAOF-{}", &hex[8..]),
        })
    }

    /// `redis-server` options: the renamed commands.
    fn server_args(&self) -> Vec<String> {
        vec![
            "--rename-command".into(),
            "SLAVEOF".into(),
            self.slaveof.clone(),
            "--rename-command".into(),
            "REPLICAOF".into(),
            self.replicaof.clone(),
        ]
    }
}

/// One `redis-sentinel` with its own config file.
#[derive(Debug)]
struct Sentinel {
    port: u16,
    child: Child,
    dir: tempfile::TempDir,
}

impl Sentinel {
    fn start(master_port: u16, iso: &Isolation) -> Result<Self> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let port = free_port()?;
        let name = &iso.name;
        let config = format!(
            "port {port}\nbind 127.0.0.1\nprotected-mode no\ndaemonize no\ndir {dir}\nlogfile {dir}/sentinel.log\n\
             sentinel resolve-hostnames no\nsentinel announce-ip 127.0.0.1\n\
             sentinel monitor {name} 127.0.0.1 {master_port} 2\n\
             sentinel down-after-milliseconds {name} 1000\n\
             sentinel failover-timeout {name} 3000\n\
             sentinel parallel-syncs {name} 1\n\
             sentinel rename-command {name} SLAVEOF {slaveof}\n\
             sentinel rename-command {name} REPLICAOF {replicaof}\n",
            dir = dir.path().display(),
            slaveof = iso.slaveof,
            replicaof = iso.replicaof,
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
        let sentinel = Self { port, child, dir };
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
    fn master_port(&self, name: &str) -> Option<u16> {
        let answer = self
            .cli(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", name])
            .ok()?;
        answer.lines().nth(1).and_then(|p| p.trim().parse().ok())
    }

    /// The ports of the instances this sentinel lists for `what`
    /// (`REPLICAS` or `SENTINELS`).
    fn listed_ports(&self, what: &str, name: &str) -> Result<Vec<u16>> {
        let answer = self.cli(&["SENTINEL", what, name])?;
        let lines: Vec<&str> = answer.lines().map(str::trim).collect();
        Ok(lines
            .windows(2)
            .filter(|w| w[0] == "port")
            .filter_map(|w| w[1].parse().ok())
            .collect())
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
    iso: Isolation,
}

impl SentinelGroup {
    /// Starts everything and waits until the replica acknowledges writes and
    /// every sentinel knows the replica and the other sentinels.
    pub fn start() -> Result<Self> {
        Self::start_inner(None)
    }

    /// The same, with the replica on `port` (a port that another group's
    /// sentinels may still know: the test of `Isolation`).
    pub fn start_with_replica_on(port: u16) -> Result<Self> {
        Self::start_inner(Some(port))
    }

    fn start_inner(replica_port: Option<u16>) -> Result<Self> {
        let iso = Isolation::new()?;
        let renamed = iso.server_args();
        let renamed: Vec<&str> = renamed.iter().map(String::as_str).collect();
        let mut args = vec!["--repl-diskless-sync-delay", "0"];
        args.extend(&renamed);
        let master = Server::start(&args)?;
        let port = master.port.to_string();
        args.extend(["--replicaof", "127.0.0.1", &port]);
        let replica = match replica_port {
            Some(p) => Server::start_on(p, &args)?,
            None => Server::start(&args)?,
        };
        let sentinels = (0..3)
            .map(|_| Sentinel::start(master.port, &iso))
            .collect::<Result<Vec<_>>>()?;
        let group = Self {
            servers: [master, replica],
            sentinels,
            iso,
        };
        group.wait_replicated()?;
        for (i, s) in group.sentinels.iter().enumerate() {
            poll(
                Duration::from_secs(15),
                &format!("sentinel {i} knows the replica and 2 other sentinels"),
                || {
                    let master = s.cli(&["SENTINEL", "MASTER", &group.iso.name])?;
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

    /// The name the sentinels monitor the master under (one per group).
    pub fn master_name(&self) -> &str {
        &self.iso.name
    }

    /// `Err` naming the stranger if any instance outside this group takes
    /// part in it: a master, replica or sentinel that a sentinel lists, or a
    /// server replicating from or to a port not of the group. (A run whose
    /// group was joined measures somebody else's data, not the library.)
    pub fn check_isolated(&self) -> Result<()> {
        let ours: Vec<u16> = self.servers.iter().map(|s| s.port).collect();
        let peers: Vec<u16> = self.sentinels.iter().map(|s| s.port).collect();
        let name = &self.iso.name;
        for (i, s) in self.sentinels.iter().enumerate() {
            if let Some(p) = s.master_port(name).filter(|p| !ours.contains(p)) {
                return Err(format!(
                    "sentinel {i} names port {p} as master, not a server of the group {ours:?}"
                ));
            }
            for p in s.listed_ports("REPLICAS", name)? {
                if !ours.contains(&p) {
                    return Err(format!(
                        "sentinel {i} lists a replica on port {p}, not a server of the group {ours:?}"
                    ));
                }
            }
            for p in s.listed_ports("SENTINELS", name)? {
                if !peers.contains(&p) {
                    return Err(format!(
                        "sentinel {i} lists a sentinel on port {p}, not one of the group {peers:?}"
                    ));
                }
            }
        }
        for (i, s) in self.servers.iter().enumerate() {
            let Ok(info) = s.cli(&["INFO", "replication"]) else {
                continue; // down (killed by the fault)
            };
            let master = info_field(&info, "master_port").and_then(|p| p.parse::<u16>().ok());
            if let Some(p) = master.filter(|p| !ours.contains(p)) {
                return Err(format!(
                    "server {i} replicates from port {p}, not a server of the group {ours:?}"
                ));
            }
            for line in info.lines().filter(|l| l.starts_with("slave")) {
                let port = line
                    .split(',')
                    .find_map(|kv| kv.strip_prefix("port="))
                    .and_then(|p| p.parse::<u16>().ok());
                if let Some(p) = port.filter(|p| !ours.contains(p)) {
                    return Err(format!(
                        "server {i} has a replica on port {p}, not a server of the group {ours:?}"
                    ));
                }
            }
        }
        Ok(())
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
        let port = self.sentinels[0].master_port(&self.iso.name)?;
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

    /// The ports of the data servers and of the sentinels (for a
    /// `Sampler`).
    pub fn ports(&self) -> (Vec<u16>, Vec<u16>) {
        (
            self.servers.iter().map(|s| s.port).collect(),
            self.sentinels.iter().map(|s| s.port).collect(),
        )
    }

    /// Copies every server's and sentinel's log (and the sentinels' rewritten
    /// configs, which list the replicas and sentinels they know) into `to`.
    pub fn copy_logs(&self, to: &Path) {
        for (i, s) in self.servers.iter().enumerate() {
            let _ = std::fs::copy(
                s.dir().join("redis.log"),
                to.join(format!("server-{i}.log")),
            );
        }
        for (i, s) in self.sentinels.iter().enumerate() {
            let _ = std::fs::copy(
                s.dir.path().join("sentinel.log"),
                to.join(format!("sentinel-{i}.log")),
            );
            let _ = std::fs::copy(
                s.dir.path().join("sentinel.conf"),
                to.join(format!("sentinel-{i}.conf")),
            );
        }
    }

    /// SIGKILLs the master, waits until every sentinel names the other
    /// server, restarts the old master (empty: no persistence), SIGSTOPs the
    /// new master for `stall` (none when zero), and waits until the group is
    /// whole again: a master with a replica that acknowledges writes.
    ///
    /// `unelectable`: the old master comes back as a replica of the new one
    /// that the sentinels may not promote (`replica-priority 0`) until it
    /// has synced. Otherwise it comes back as a master, and until the
    /// sentinels notice it and make it a replica (they look at a returning
    /// instance on their 10 s `INFO` period) it is an electable candidate
    /// with no data: a stall of the new master longer than
    /// `down-after-milliseconds` in that window makes the sentinels promote
    /// it and turn the new master into its replica, which wipes every lock
    /// and fencing counter.
    pub fn failover(&mut self, unelectable: bool, stall: Duration) -> Result<()> {
        let (old, new) = self.kill_master_and_wait()?;
        let new_port = self.servers[new].port.to_string();
        if unelectable {
            self.servers[old].restart_with(&[
                "--replicaof",
                "127.0.0.1",
                &new_port,
                "--replica-priority",
                "0",
            ])?;
        } else {
            self.servers[old].restart()?;
        }
        if !stall.is_zero() {
            self.servers[new].pause()?;
            std::thread::sleep(stall);
            self.servers[new].resume()?;
        }
        self.wait_replicated()?;
        if unelectable {
            self.servers[old].cli(&["CONFIG", "SET", "replica-priority", "100"])?;
        }
        Ok(())
    }

    /// SIGKILLs the master and waits until every sentinel names the other
    /// server and it says it is master: `(old, new)`.
    fn kill_master_and_wait(&mut self) -> Result<(usize, usize)> {
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
                let seen: Vec<Option<u16>> = self
                    .sentinels
                    .iter()
                    .map(|s| s.master_port(&self.iso.name))
                    .collect();
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
        Ok((old, new))
    }
}
