//! The Redis the benchmark talks to: a private `redis-server` started for the
//! run (killed on drop, also when the benchmark panics), or `REDIS_URL` when it
//! names a loopback server.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A `redis-server` on `127.0.0.1:<free port>` with a temporary directory and
/// no persistence. Dropping it kills the process and removes the directory.
pub(crate) struct RedisProcess {
    child: Option<Child>,
    dir: PathBuf,
    port: u16,
}

impl RedisProcess {
    /// Starts `$REDIS_SERVER` (default `redis-server` from `PATH`); retries on
    /// another port if the chosen one was taken in the meantime.
    pub(crate) fn start() -> Result<Self, String> {
        let mut last = String::new();
        for _ in 0..3 {
            match Self::try_start() {
                Ok(server) => return Ok(server),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn try_start() -> Result<Self, String> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free loopback port: {e}"))?
            .port();
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir =
            std::env::temp_dir().join(format!("lock-bench-{}-{port}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {dir:?}: {e}"))?;
        let bin = std::env::var_os("REDIS_SERVER").unwrap_or_else(|| "redis-server".into());
        // From here on, Drop cleans up whatever happens.
        let mut server = Self {
            child: None,
            dir,
            port,
        };
        let child = Command::new(&bin)
            .arg("--port")
            .arg(port.to_string())
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--dir")
            .arg(&server.dir)
            .arg("--save")
            .arg("")
            .arg("--appendonly")
            .arg("no")
            .arg("--daemonize")
            .arg("no")
            .arg("--protected-mode")
            .arg("yes")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!(
                    "cannot start {bin:?} ({e}); install redis-server, set REDIS_SERVER, \
                     or set REDIS_URL to a loopback server"
                )
            })?;
        server.child = Some(child);
        server.wait_ready()?;
        Ok(server)
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(format!("redis-server exited at start ({status})"));
            }
            if ping(self.port) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Err(format!(
            "redis-server on port {} did not come up",
            self.port
        ))
    }

    /// `redis://127.0.0.1:<port>`.
    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

fn ping(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    if s.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 16];
    matches!(s.read(&mut buf), Ok(n) if n > 0 && buf.starts_with(b"+PONG"))
}

impl Drop for RedisProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Accepts `redis://` URLs whose host is loopback (`127.x.x.x`, `localhost`,
/// `[::1]`) and `unix://` / `redis+unix://` sockets; refuses anything else, so
/// the benchmark never loads a shared or remote server.
pub(crate) fn check_loopback(url: &str) -> Result<(), String> {
    if url.starts_with("unix://") || url.starts_with("redis+unix://") {
        return Ok(());
    }
    let Some(rest) = url.strip_prefix("redis://") else {
        return Err("REDIS_URL must start with redis:// (or unix://)".into());
    };
    let authority = rest.split('/').next().unwrap_or("");
    let host_port = authority.rsplit('@').next().unwrap_or("");
    let host = if let Some(v6) = host_port.strip_prefix('[') {
        v6.split(']').next().unwrap_or("")
    } else {
        host_port.split(':').next().unwrap_or("")
    };
    let loopback = host == "localhost"
        || host == "::1"
        || host
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback());
    if loopback {
        Ok(())
    } else {
        Err(format!(
            "REDIS_URL host {host:?} is not loopback; the benchmark only runs against \
             127.0.0.1, localhost or ::1"
        ))
    }
}
