//! What the harness runs and the injector strikes: the worker processes
//! and the lock servers of a run.

use super::*;

/// A worker process.
pub(super) struct Running {
    pub(super) id: u32,
    pub(super) child: Child,
    pub(super) done: bool,
}

impl Drop for Running {
    /// No worker outlives its run, even when the harness fails mid-way.
    fn drop(&mut self) {
        let _ = signal(self.child.id(), "CONT");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The lock servers of a run.
pub(super) enum LockSide {
    Single(RedisServer),
    Redlock(Vec<RedisServer>),
    Sentinel(Box<SentinelGroup>),
}

impl LockSide {
    pub(super) fn start(scenario: &Scenario) -> Result<Self, String> {
        Ok(match scenario.topology {
            Topology::Single => {
                let args: &[&str] = if scenario.aof {
                    &["--appendonly", "yes", "--appendfsync", "always"]
                } else {
                    &[]
                };
                LockSide::Single(RedisServer::try_start(args)?)
            }
            Topology::Redlock(n) => LockSide::Redlock(
                (0..n)
                    .map(|_| RedisServer::try_start(&[]))
                    .collect::<Result<_, _>>()?,
            ),
            Topology::Sentinel { .. } => LockSide::Sentinel(Box::new(SentinelGroup::start()?)),
        })
    }

    /// The URLs workers get, comma-separated.
    pub(super) fn urls(&self) -> String {
        match self {
            LockSide::Single(s) => s.url(),
            LockSide::Redlock(servers) => servers
                .iter()
                .map(RedisServer::url)
                .collect::<Vec<_>>()
                .join(","),
            LockSide::Sentinel(g) => g.sentinel_urls().join(","),
        }
    }

    pub(super) fn topology(&self) -> String {
        match self {
            LockSide::Single(_) => "single".into(),
            LockSide::Redlock(_) => "redlock".into(),
            LockSide::Sentinel(g) => format!("sentinel:{}", g.master_name()),
        }
    }

    pub(super) fn replica_acks(&self, scenario: &Scenario) -> (u32, u64) {
        match scenario.topology {
            Topology::Sentinel {
                replicas,
                timeout_ms,
            } => (replicas, timeout_ms),
            _ => (0, 0),
        }
    }

    /// The server single-server faults act on (the master).
    pub(super) fn primary(&mut self) -> &mut RedisServer {
        match self {
            LockSide::Single(s) => s,
            LockSide::Redlock(servers) => &mut servers[0],
            LockSide::Sentinel(g) => {
                let i = g.master_index().unwrap_or(0);
                &mut g.servers[i]
            }
        }
    }
}
