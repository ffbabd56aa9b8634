//! [`CommandProxy`]: a loopback TCP proxy in front of a server that records
//! the name of every command clients send through it, whatever the server
//! knows (Redis 7.0 has no `CLIENT SETINFO`, so neither `ACL LOG` nor
//! `MONITOR` can show a client sending it; the proxy sees the bytes).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;

/// Commands whose first argument names a subcommand (`client|setinfo`).
const CONTAINERS: &[&str] = &[
    "acl", "client", "cluster", "command", "config", "function", "latency", "memory", "module",
    "object", "pubsub", "script", "slowlog", "xinfo", "xgroup",
];

/// A proxy on a free loopback port that forwards to `127.0.0.1:target`
/// and records each command's name, lowercase (`evalsha`,
/// `script|load`, `client|setinfo`), in the order sent. Runs until the
/// process ends.
#[derive(Debug, Clone)]
pub struct CommandProxy {
    /// The port to connect to instead of the server's.
    pub port: u16,
    seen: Arc<Mutex<Vec<String>>>,
}

impl CommandProxy {
    /// Starts the proxy; panics if it cannot listen.
    pub fn start(target: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let port = listener.local_addr().expect("an address").port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let recorded = seen.clone();
        thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
                    continue;
                };
                let recorded = recorded.clone();
                let (client_r, server_w) = (client.try_clone(), server.try_clone());
                let (Ok(client_r), Ok(server_w)) = (client_r, server_w) else {
                    continue;
                };
                thread::spawn(move || forward_commands(client_r, server_w, &recorded));
                thread::spawn(move || {
                    let (mut from, mut to) = (server, client);
                    let _ = std::io::copy(&mut from, &mut to);
                    let _ = to.shutdown(Shutdown::Both);
                });
            }
        });
        Self { port, seen }
    }

    /// The commands sent so far, in order.
    pub fn commands(&self) -> Vec<String> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Copies RESP commands from `client` to `server`, recording each name.
fn forward_commands(client: TcpStream, mut server: TcpStream, seen: &Mutex<Vec<String>>) {
    let mut reader = BufReader::new(client);
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        if server.write_all(&line).is_err() {
            break;
        }
        let Some(count) = header(&line, b'*') else {
            // An inline command: its first word.
            let text = String::from_utf8_lossy(&line).to_lowercase();
            if let Some(word) = text.split_whitespace().next() {
                seen.lock().unwrap().push(word.to_owned());
            }
            continue;
        };
        let mut args = Vec::new();
        for _ in 0..count {
            line.clear();
            if reader.read_until(b'\n', &mut line).unwrap_or(0) == 0 {
                return;
            }
            let _ = server.write_all(&line);
            let Some(len) = header(&line, b'$') else {
                return;
            };
            let mut bulk = vec![0u8; len + 2];
            if reader.read_exact(&mut bulk).is_err() {
                return;
            }
            let _ = server.write_all(&bulk);
            if args.len() < 2 {
                args.push(String::from_utf8_lossy(&bulk[..len]).to_lowercase());
            }
        }
        let name = match args.as_slice() {
            [name, sub, ..] if CONTAINERS.contains(&name.as_str()) => format!("{name}|{sub}"),
            [name, ..] => name.clone(),
            [] => continue,
        };
        seen.lock().unwrap().push(name);
    }
    let _ = server.shutdown(Shutdown::Write);
}

/// The number after `kind` in a RESP header line (`*3\r\n`, `$5\r\n`).
fn header(line: &[u8], kind: u8) -> Option<usize> {
    let rest = line.strip_prefix(&[kind])?;
    std::str::from_utf8(rest).ok()?.trim_end().parse().ok()
}
