//! Multi-server topologies on loopback for the scale-out tests: independent
//! masters for Redlock, a Sentinel deployment (master, replica, three
//! sentinels) and a three-master Redis Cluster. Every process listens on
//! `127.0.0.1` only, keeps its files in a temporary directory, and is killed
//! when its owner is dropped.
//!
//! The helpers are blocking (they run `redis-cli` and poll with short
//! sleeps); from a multi-thread tokio test, wrap the slow ones (start-up,
//! failover) in `tokio::task::block_in_place` so the runtime keeps going.
//! Every wait has a deadline and panics with what it was waiting for (the
//! `try_` helpers return it as an error instead).

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::Result;

/// A running set of servers a client can be built for.
pub trait Topology {
    /// A client builder for these servers.
    fn builder(&self) -> lock_runtime::LockClientBuilder;

    /// The servers, and a client builder for them.
    fn with_builder(self) -> (Self, lock_runtime::LockClientBuilder)
    where
        Self: Sized,
    {
        let builder = self.builder();
        (self, builder)
    }
}

mod cluster;
mod redlock;
mod sentinel;

pub use cluster::{Cluster, Migration, SLOTS};
pub use redlock::Redlock;
pub use sentinel::{MASTER_NAME, Sentinel, SentinelSetup, master_and_replica, wait_replica_online};

/// Runs `redis-cli -h 127.0.0.1 -p <port> <args>` and returns its trimmed
/// standard output (errors are printed there too, as `ERR ...`); `Err` only
/// if `redis-cli` cannot run.
pub fn try_cli_port(port: u16, args: &[&str]) -> Result<String> {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run redis-cli ({e}); install redis-tools"))?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// [`try_cli_port`], panicking if `redis-cli` cannot run.
pub fn cli_port(port: u16, args: &[&str]) -> String {
    try_cli_port(port, args).unwrap_or_else(|e| panic!("{e}"))
}

/// The keys of the server on `port` (`KEYS *`, sorted).
pub fn sorted_keys(port: u16) -> Vec<String> {
    let mut keys: Vec<String> = cli_port(port, &["KEYS", "*"])
        .lines()
        .filter(|k| !k.is_empty())
        .map(str::to_owned)
        .collect();
    keys.sort();
    keys
}

/// Polls `check` every 20 ms until it returns `Ok`; after `limit`, `Err`
/// with `what` and the last observation.
pub fn try_poll<T>(limit: Duration, what: &str, mut check: impl FnMut() -> Result<T>) -> Result<T> {
    let started = Instant::now();
    loop {
        match check() {
            Ok(value) => return Ok(value),
            Err(last) if started.elapsed() > limit => {
                return Err(format!(
                    "{what}: not reached within {limit:?}; last seen: {last}"
                ));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// [`try_poll`], panicking after `limit`.
pub fn poll<T>(limit: Duration, what: &str, check: impl FnMut() -> Result<T>) -> T {
    try_poll(limit, what, check).unwrap_or_else(|e| panic!("{e}"))
}

/// `field:value` lines of an `INFO` answer.
pub fn info_field(info: &str, field: &str) -> Option<String> {
    let prefix = format!("{field}:");
    info.lines()
        .find_map(|l| l.trim().strip_prefix(&prefix))
        .map(|v| v.trim().to_owned())
}

/// An answer printed by `redis-cli` as alternating name / value lines
/// (`SENTINEL MASTER`, `CONFIG GET`), as a map.
pub fn pairs(answer: &str) -> HashMap<String, String> {
    let lines: Vec<&str> = answer.lines().map(str::trim).collect();
    lines
        .chunks(2)
        .filter(|c| c.len() == 2)
        .map(|c| (c[0].to_owned(), c[1].to_owned()))
        .collect()
}

/// Sends `commands` (one per line) to `redis-cli` on one connection, in
/// order, and returns the answers, one per line.
pub(crate) fn pipeline(port: u16, commands: &str) -> String {
    let out = crate::output_with_input(
        Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .stderr(Stdio::null()),
        commands,
    )
    .expect("cannot run redis-cli (install redis-tools), or write to it");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}
