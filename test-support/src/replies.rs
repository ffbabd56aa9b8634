//! Windows of lost replies, and plain connections outside any client library.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::{RedisServer, signal};

impl RedisServer {
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
            let _ = signal(pid, "CONT");
            let answer = killer.reply();
            answer
                .strip_prefix(':')
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("{KILL_OTHER_CLIENTS}: {answer}"))
        });
        LostReplies { thread }
    }
}

/// Closes every normal client connection but the one that sends it (pub/sub
/// and replica links stay).
pub const KILL_OTHER_CLIENTS: &str = "CLIENT KILL TYPE normal SKIPME yes";

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
    signal(pid, "STOP").unwrap_or_else(|e| panic!("{e}"));
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
#[derive(Debug)]
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
#[derive(Debug)]
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
