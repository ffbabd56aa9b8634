//! Test support: real `redis-server` processes on free loopback ports, started
//! by the tests and stopped on drop.
#![allow(missing_docs)]

pub mod topology;

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` on `127.0.0.1:<free port>` with its own temporary
/// directory. Killed (SIGKILL) and cleaned up on drop.
pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    dir: tempfile::TempDir,
    extra: Vec<String>,
}

/// A free loopback TCP port (bound, then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind a loopback port")
        .local_addr()
        .unwrap()
        .port()
}

/// The `redis-server` binary: `$REDIS_SERVER` or from `PATH`.
pub fn redis_server_bin() -> PathBuf {
    std::env::var_os("REDIS_SERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("redis-server"))
}

impl RedisServer {
    /// Starts a server with no persistence.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server with extra `--option value` arguments
    /// (e.g. `["--requirepass", "secret"]`).
    pub fn start_with(extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut server = Self {
            port: free_port(),
            child: None,
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let mut cmd = Command::new(redis_server_bin());
        cmd.arg("--port")
            .arg(self.port.to_string())
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--save")
            .arg("")
            .arg("--appendonly")
            .arg("no")
            .arg("--daemonize")
            .arg("no")
            .arg("--protected-mode")
            .arg("yes")
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = cmd.spawn().unwrap_or_else(|e| {
            panic!("cannot start redis-server ({e}); install it (apt-get install redis-server) or set REDIS_SERVER")
        });
        self.child = Some(child);
        self.wait_ready();
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.port)) {
                use std::io::Read;
                let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
                if s.write_all(b"PING\r\n").is_ok() {
                    let mut buf = [0u8; 64];
                    if let Ok(n) = s.read(&mut buf) {
                        // +PONG, or -NOAUTH when a password is required: up either way.
                        if n > 0 && (buf.starts_with(b"+PONG") || buf.starts_with(b"-NOAUTH")) {
                            return;
                        }
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("redis-server on port {} did not come up", self.port);
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

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

    /// Starts the server again on the same port and directory.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Sends SIGSTOP / SIGCONT to the server.
    pub fn pause(&self) {
        self.signal("STOP");
    }

    pub fn resume(&self) {
        self.signal("CONT");
    }

    fn signal(&self, sig: &str) {
        if let Some(pid) = self.pid() {
            signal(pid, sig);
        }
    }

    /// Makes the server run what its clients send during the next `window`
    /// but lose the replies: freezes it now (SIGSTOP) and, on a thread, after
    /// `window` queues [`KILL_OTHER_CLIENTS`] behind everything the clients
    /// sent meanwhile and resumes it (SIGCONT). Linux's epoll reports sockets
    /// in the order they became readable, so the server runs the clients'
    /// commands first, then closes their connections before it writes a
    /// single reply (replies go out only after the whole batch). Keep
    /// `window` under the clients' response timeout.
    pub fn lose_replies(&self, window: Duration) -> LostReplies {
        let pid = self.pid().expect("the server is running");
        // Opened (and answered) before the freeze: a connection accepted
        // after it would be read after the clients' commands.
        let mut killer = RawConnection::connect(self.port);
        stop_while_waiting(pid);
        let thread = std::thread::spawn(move || {
            std::thread::sleep(window);
            killer.send(KILL_OTHER_CLIENTS);
            // Loopback delivers at once; a little slack for a loaded machine.
            std::thread::sleep(Duration::from_millis(20));
            signal(pid, "CONT");
            let answer = killer.reply();
            answer
                .strip_prefix(':')
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("{KILL_OTHER_CLIENTS}: {answer}"))
        });
        LostReplies { thread }
    }

    /// Runs a command through `redis-cli` (for setup and inspection).
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .arg("-p")
            .arg(self.port.to_string())
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

/// Closes every normal client connection but the one that sends it (pub/sub
/// and replica links stay).
pub const KILL_OTHER_CLIENTS: &str = "CLIENT KILL TYPE normal SKIPME yes";

/// Sends `SIGSTOP`, `SIGCONT`, ... (without the `SIG`) to a process.
pub fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status();
}

/// SIGSTOPs a server while it sleeps in `epoll_wait`. Level-triggered epoll
/// puts a socket it just reported back on its ready list until the next
/// `epoll_wait` finds it drained: a server stopped between handling a
/// command (the `PING` of [`RawConnection::connect`]) and that next wait
/// would, on resuming, read that socket first, ahead of the sockets that
/// became readable while it was stopped. (Without `/proc/<pid>/wchan`,
/// gives it 20 ms to get there.) Returns once the server is stopped.
fn stop_while_waiting(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let wchan = std::fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_default();
        if wchan.is_empty() || wchan == "0" {
            std::thread::sleep(Duration::from_millis(20));
            break;
        }
        if wchan.contains("epoll") || wchan.contains("ep_poll") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "redis-server {pid} never waited in epoll_wait (wchan {wchan:?})"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    signal(pid, "STOP");
    // `kill` returns when the signal is sent, not when the server stops: a
    // server woken for it but not yet run would still take what arrives
    // meanwhile from epoll_wait (which hands out ready events before it
    // looks at signals) and answer it after SIGCONT, ahead of the kill.
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next());
        if state.is_none_or(|s| s == 'T' || s == 't') {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "redis-server {pid} did not stop (stat {stat:?})"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A window of lost replies opened by [`RedisServer::lose_replies`].
#[must_use = "join it: the server stays frozen until the window ends"]
pub struct LostReplies {
    thread: std::thread::JoinHandle<u64>,
}

impl LostReplies {
    /// Waits for the end of the window (the server resumed, the connections
    /// killed); returns how many connections were closed.
    pub fn join(self) -> u64 {
        self.thread.join().expect("the reply-loss thread")
    }
}

/// A plain connection to a server, outside any client library: inline
/// commands, one-line replies (integers, simple strings, errors). Blocking.
pub struct RawConnection {
    reader: BufReader<TcpStream>,
}

impl RawConnection {
    /// Connects and waits for a `PONG`, so the server has accepted it.
    pub fn connect(port: u16) -> Self {
        let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to redis-server");
        stream.set_nodelay(true).expect("TCP_NODELAY");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("read timeout");
        let mut conn = Self {
            reader: BufReader::new(stream),
        };
        assert_eq!(conn.command("PING"), "+PONG", "PING on port {port}");
        conn
    }

    /// Writes `command` without waiting for its reply.
    pub fn send(&mut self, command: &str) {
        self.reader
            .get_mut()
            .write_all(format!("{command}\r\n").as_bytes())
            .expect("write to redis-server");
    }

    /// Reads one reply line (without its line end).
    pub fn reply(&mut self) -> String {
        let mut line = String::new();
        self.reader
            .read_line(&mut line)
            .expect("read from redis-server");
        line.trim_end().to_owned()
    }

    /// Sends `command` and reads its reply.
    pub fn command(&mut self, command: &str) -> String {
        self.send(command);
        self.reply()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.resume();
        self.kill();
    }
}

/// An error and its causes on one line, as `anyhow` prints them with `{:#}`
/// (a `LockError` names what failed; its source says why).
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut next = err.source();
    while let Some(cause) = next {
        text += &format!(": {cause}");
        next = cause.source();
    }
    text
}
