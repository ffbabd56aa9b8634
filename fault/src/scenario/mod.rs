//! The scenarios and the harness that runs one: servers, worker processes,
//! the fault injector, then the checker.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::checker::{self, Report, RunData, WorkerLog};
use crate::kind::Kind;
use crate::log::{self, Clock, Event, Fault, LogWriter};
use crate::orders::{OrderPlan, OrderStats};
use crate::server::SentinelGroup;
use crate::store;
use crate::timeline::Sampler;
use crate::worker::{self, TokenTiming, WorkerConfig};
use test_support::{PostgresServer, RedisServer, signal};

mod catalogue;
mod harness;
mod inject;
mod sides;
mod table;

pub use self::harness::run;
pub use self::table::table;

/// The fault a scenario injects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FaultPlan {
    /// None (scenario 1; scenarios 6 and 7 are faults inside the workers).
    None,
    /// SIGSTOP worker 0 (which thinks `victim_think_ms` between its read and
    /// its write) while it holds the lock, for `stop_ms`, then SIGCONT; every
    /// `kill_every`-th time SIGKILL it instead and start a new worker.
    StopHolder {
        /// How long it stays stopped.
        stop_ms: u64,
        /// Its think time.
        victim_think_ms: u64,
        /// Kill instead of stop every this many cycles (0: never).
        kill_every: u32,
    },
    /// SIGSTOP the lock server for `pause_ms` every `every_ms`.
    PauseServer {
        /// Pause.
        pause_ms: u64,
        /// Period.
        every_ms: u64,
    },
    /// SIGKILL the lock server every `every_ms`, restart it after `down_ms`;
    /// at most `max_kills` times.
    KillServer {
        /// Down time.
        down_ms: u64,
        /// Period.
        every_ms: u64,
        /// Most kills.
        max_kills: u32,
    },
    /// `CLIENT KILL TYPE normal`, then `TYPE pubsub`, alternately, every
    /// `every_ms`.
    ClientKill {
        /// Period.
        every_ms: u64,
    },
    /// Redlock: every `every_ms`, SIGKILL a minority of the nodes (a
    /// different one each time) and restart them empty after `down_ms` (more
    /// than a lease: the "delayed restart" Redlock needs without
    /// persistence).
    KillMinority {
        /// Period.
        every_ms: u64,
        /// Down time.
        down_ms: u64,
    },
    /// Sentinel: every `every_ms` (at most `max` times), SIGKILL the master, wait for the
    /// sentinels to promote the replica, restart the old master (it becomes
    /// the new replica) and wait for it to acknowledge writes.
    Failover {
        /// Period.
        every_ms: u64,
        /// Most failovers.
        max: u32,
        /// How the old master comes back.
        restart: Restart,
        /// Right after the old master is back, SIGSTOP the new one for this
        /// long (ms; more than `down-after-milliseconds`, as a loaded
        /// machine can): the sentinels try a second failover.
        stall_ms: u64,
    },
}

/// How the harness brings a killed Sentinel master back (an operator's
/// choice; see FAULTS.md, scenario 8). Either way it has no data (no
/// persistence).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Restart {
    /// As a replica of the new master that the sentinels may not promote
    /// (`--replicaof <new master> --replica-priority 0`) until it has synced;
    /// then `replica-priority` goes back to the default.
    SyncedReplica,
    /// As a master, as soon as the sentinels name the new master. Until the
    /// sentinels make it a replica (they look at a returning instance on
    /// their 10 s `INFO` period) it is an electable candidate with no data: a
    /// second failover in that window promotes it, and the new master becomes
    /// its replica and loses every lock and fencing counter.
    EmptyMaster,
}

/// Where the locks live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topology {
    /// One redis-server.
    Single,
    /// Redlock over this many independent redis-servers.
    Redlock(usize),
    /// A master, a replica and three sentinels; clients use
    /// `.sentinel(..)` with `.min_replica_acks(replicas, timeout_ms)`.
    Sentinel {
        /// Replicas that must acknowledge.
        replicas: u32,
        /// `WAIT` timeout, ms.
        timeout_ms: u64,
    },
}

/// One scenario.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// Short name (`fault run NAME`).
    pub name: &'static str,
    /// What the table calls it.
    pub title: &'static str,
    /// Lock operations (the budget shared by the workers).
    pub ops: u64,
    /// Worker processes.
    pub workers: u32,
    /// Tasks per worker process, sharing its `LockClient` (so its tasks hand
    /// a key on in-process); each is a logical worker of its own.
    pub tasks: u32,
    /// Keys, chosen uniformly (but see `affinity_per_mille`).
    pub keys: usize,
    /// Per mille of the operations that take their process's own key (the
    /// process number modulo `keys`; a fault victim's replacement takes the
    /// victim's) instead of a uniform choice.
    pub affinity_per_mille: u64,
    /// Lease, ms.
    pub ttl_ms: u64,
    /// Wait per operation, ms.
    pub wait_ms: u64,
    /// Think time, ms.
    pub think_ms: (u64, u64),
    /// The store checks fencing tokens.
    pub fencing: bool,
    /// The record lives in a PostgreSQL server of the run's own, written in
    /// transactions fenced by `lock_runtime::fence::postgres` (when
    /// `fencing`), instead of the Redis store ([`crate::postgres`]).
    pub postgres: bool,
    /// Client response timeout, ms.
    pub response_timeout_ms: u64,
    /// Scenario 6: cancel rate per mille and the latest cancel point, ms.
    pub cancel: (u64, u64),
    /// Scenario 7: block rate per mille, keep-length and lose-length, ms.
    pub block: (u64, u64, u64),
    /// The lock server persists with `appendfsync always`.
    pub aof: bool,
    /// The fault.
    pub fault: FaultPlan,
    /// Fencing tokens must never repeat or go down.
    pub expect_monotonic_fences: bool,
    /// The checker must find violations (the run without fencing).
    pub expect_violations: bool,
    /// Slack beyond a lease, ms.
    pub slack_ms: u64,
    /// Where the locks live.
    pub topology: Topology,
    /// The synchronizer the workers take.
    pub kind: Kind,
    /// The one the fault's victim takes instead (a read-write lock's victim
    /// that always writes, say), if any.
    pub victim_kind: Option<Kind>,
    /// The one the checker is told the workers took, if not `kind`: a
    /// control whose checker must object (a semaphore of 3 checked as one
    /// of 2).
    pub check_as: Option<Kind>,
    /// Scenario 12: waiters must keep their order. `Some(n)`: fixed leases
    /// (`renew(false)`), a lease of its own per worker so that a worker can
    /// find itself in the key's queue, `n` per mille of the operations
    /// try-once, and the checker's FIFO rule.
    pub fifo: Option<u64>,
    /// When the workers ask for their fencing token: at the grant, or (the
    /// lazy token's scenario) after their think, the pause the fault
    /// lengthens.
    pub token: TokenTiming,
    /// Scenario 13, exactly once across crashes: no lock workers, the
    /// order service killed under its clients instead ([`crate::orders`]).
    pub orders: Option<OrderPlan>,
}

/// A finished run.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The scenario that ran.
    pub scenario: Scenario,
    /// The checker's report.
    pub report: Report,
    /// Wall time of the run.
    pub elapsed: Duration,
    /// Faults injected.
    pub faults: usize,
    /// How the lock server issued fencing tokens, for the scenarios with
    /// several tasks per process on one server.
    pub tokens: Option<TokenCalls>,
    /// What the order service's clients did (scenario 13).
    pub orders: Option<OrderStats>,
    /// The harness itself failed (a server did not come back, ...): the
    /// report is empty.
    pub error: Option<String>,
}

impl Outcome {
    /// `true` when the run came out as it should: no violation, or (the run
    /// without fencing) at least one.
    pub fn as_expected(&self) -> bool {
        (self.report.violations.total() > 0) == self.scenario.expect_violations
            && self.report.operations > 0
            && self.error.is_none()
    }

    /// At least how many acquisitions were handed on in-process (local
    /// hand-over), when the run counted the server's tokens: every one that
    /// came from the server took an `INCR` there.
    pub fn handed_on_locally(&self) -> Option<u64> {
        let tokens = self.tokens?;
        Some(self.report.acquired.saturating_sub(tokens.single))
    }
}

/// Fencing tokens a lock server issued, from its `INFO commandstats`: the
/// scripts' `INCR` (acquire.lua taking a key, release.lua handing it to the
/// next in the server's queue) and `INCRBY` (reserve.lua: a block for local
/// hand-over).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TokenCalls {
    /// `INCR` calls: one token each.
    pub single: u64,
    /// `INCRBY` calls: one block each.
    pub blocks: u64,
}

impl TokenCalls {
    fn of(server: &RedisServer) -> Result<Self, String> {
        let client = redis::Client::open(server.url()).map_err(|e| e.to_string())?;
        let mut conn = client.get_connection().map_err(|e| e.to_string())?;
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut conn)
            .map_err(|e| e.to_string())?;
        Ok(Self::parse(&info))
    }

    /// Reads the `calls` of `incr` and `incrby` out of `INFO commandstats`.
    fn parse(info: &str) -> Self {
        let calls = |command: &str| {
            let prefix = format!("cmdstat_{command}:calls=");
            info.lines()
                .find_map(|line| line.strip_prefix(prefix.as_str()))
                .and_then(|rest| rest.split(',').next()?.parse().ok())
                .unwrap_or(0)
        };
        Self {
            single: calls("incr"),
            blocks: calls("incrby"),
        }
    }
}
