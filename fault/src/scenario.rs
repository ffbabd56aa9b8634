//! The scenarios and the harness that runs one: servers, worker processes,
//! the fault injector, then the checker.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::checker::{self, Report, RunData, WorkerLog};
use crate::kind::Kind;
use crate::log::{self, Clock, Event, Fault, LogWriter};
use crate::server::SentinelGroup;
use crate::store;
use crate::timeline::Sampler;
use crate::worker::{self, WorkerConfig};
use test_support::{PostgresServer, RedisServer, signal};

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
}

impl Scenario {
    fn base(name: &'static str, title: &'static str, ops: u64) -> Self {
        Self {
            name,
            title,
            ops,
            workers: 32,
            tasks: 1,
            keys: 1,
            affinity_per_mille: 0,
            ttl_ms: 2000,
            wait_ms: 60_000,
            think_ms: (0, 2),
            fencing: true,
            postgres: false,
            response_timeout_ms: 500,
            cancel: (0, 0),
            block: (0, 0, 0),
            aof: false,
            fault: FaultPlan::None,
            expect_monotonic_fences: true,
            expect_violations: false,
            slack_ms: 1000,
            topology: Topology::Single,
            kind: Kind::Mutex,
            victim_kind: None,
            check_as: None,
            fifo: None,
        }
    }

    /// Every scenario, with `ops` operations each. `short`: fewer workers and
    /// shorter fault cycles, for CI.
    pub fn all(ops: u64, short: bool) -> Vec<Scenario> {
        let small = |n: u32| if short { n.min(8) } else { n };
        let stop = |name, title, fencing| Scenario {
            workers: small(32),
            ttl_ms: 500,
            fencing,
            fault: FaultPlan::StopHolder {
                stop_ms: 1500,
                victim_think_ms: 300,
                kill_every: 3,
            },
            expect_violations: !fencing,
            ..Scenario::base(name, title, ops)
        };
        // Scenario 2 with the record in PostgreSQL, every 2nd strike a kill
        // (so that CI's short run sees both).
        let postgres = |name, title, fencing| Scenario {
            postgres: true,
            fault: FaultPlan::StopHolder {
                stop_ms: if short { 800 } else { 1500 },
                victim_think_ms: 300,
                kill_every: 2,
            },
            ..stop(name, title, fencing)
        };
        // kill -9 of the lock server every `every_ms` (at most `max_kills`
        // times), restarted after 500 ms.
        let kill = |name, title, every_ms, max_kills| Scenario {
            workers: small(16),
            keys: 4,
            ttl_ms: 1000,
            response_timeout_ms: 300,
            fault: FaultPlan::KillServer {
                down_ms: 500,
                every_ms,
                max_kills,
            },
            ..Scenario::base(name, title, ops)
        };
        vec![
            Scenario {
                workers: 32,
                ..Scenario::base("no-faults-1-key", "1. no faults, 32 clients, 1 key", ops)
            },
            Scenario {
                workers: 32,
                keys: 100,
                ..Scenario::base(
                    "no-faults-100-keys",
                    "1. no faults, 32 clients, 100 keys",
                    ops,
                )
            },
            stop(
                "stop-holder",
                "2. SIGSTOP holder > TTL (every 3rd: kill -9), fencing on",
                true,
            ),
            stop(
                "stop-holder-unfenced",
                "2. same, store WITHOUT fencing (checker must object)",
                false,
            ),
            postgres(
                "stop-holder-postgres",
                "2. same on a PostgreSQL record fenced by fence::postgres (every 2nd: kill -9)",
                true,
            ),
            postgres(
                "stop-holder-postgres-unfenced",
                "2. same PostgreSQL record WITHOUT the fence (checker must object)",
                false,
            ),
            Scenario {
                workers: small(16),
                keys: 4,
                response_timeout_ms: 200,
                fault: FaultPlan::PauseServer {
                    pause_ms: 1000,
                    every_ms: if short { 1500 } else { 3000 },
                },
                ..Scenario::base(
                    "pause-server",
                    "3. SIGSTOP redis-server 1 s (> 200 ms response timeout), TTL 2 s",
                    ops,
                )
            },
            Scenario {
                aof: true,
                ..kill(
                    "kill-server-aof",
                    "4. kill -9 redis-server + restart, AOF appendfsync always",
                    if short { 2000 } else { 3000 },
                    u32::MAX,
                )
            },
            Scenario {
                expect_monotonic_fences: false,
                ..kill(
                    "kill-server-no-persistence",
                    "4. kill -9 redis-server + restart, no persistence (once)",
                    if short { 1000 } else { 3000 },
                    1,
                )
            },
            Scenario {
                workers: small(32),
                ttl_ms: 1000,
                fault: FaultPlan::ClientKill { every_ms: 1000 },
                ..Scenario::base(
                    "client-kill",
                    "5. CLIENT KILL normal / pubsub, alternately every 1 s, TTL 1 s",
                    ops,
                )
            },
            Scenario {
                workers: small(32),
                ttl_ms: 1000,
                cancel: (500, 20),
                ..Scenario::base(
                    "cancel-acquire",
                    "6. half the acquires cancelled at a random point (0-20 ms)",
                    ops,
                )
            },
            Scenario {
                workers: small(16),
                keys: 8,
                ttl_ms: 600,
                block: (if short { 100 } else { 50 }, 300, 900),
                ..Scenario::base(
                    "blocked-runtime",
                    "7. runtime thread blocked 300 ms / 900 ms, TTL 600 ms",
                    ops,
                )
            },
        ]
    }

    /// Scenario 8: the scale-out backends.
    pub fn scale_out(ops: u64, short: bool) -> Vec<Scenario> {
        let small = |n: u32| if short { n.min(8) } else { n };
        vec![
            Scenario {
                workers: small(16),
                keys: 4,
                ttl_ms: 1000,
                response_timeout_ms: 300,
                topology: Topology::Redlock(5),
                fault: FaultPlan::KillMinority {
                    every_ms: if short { 1500 } else { 4000 },
                    down_ms: 2500,
                },
                ..Scenario::base(
                    "redlock-minority",
                    "8. Redlock, 5 masters: 2 killed, restarted empty after 2.5 s, in turn",
                    ops,
                )
            },
            Self::sentinel(
                "sentinel-failover",
                "8. Sentinel failover (kill -9 master), min_replica_acks(1, 500 ms); old master back as an unelectable replica, new master stalls 3 s",
                Restart::SyncedReplica,
                ops,
                short,
            ),
        ]
    }

    /// Scenarios 9 and 10: every worker process runs 8 tasks on its one
    /// `LockClient`, so that tasks of a process wanting one key wait in its
    /// in-process line, and a `SIGSTOP` or `SIGKILL` strikes a holder
    /// together with the tasks waiting in its line. On one key the four
    /// processes contend all the time, so a holder almost never gets a block
    /// of tokens (`reserve.lua` refuses while another process is queued) and
    /// hands on to the server's queue: the processes take turns, one task
    /// each. With a key of its own that each process takes 9 times in 10,
    /// most acquisitions are local hand-overs with tokens from reserved
    /// blocks, and the other processes' tenth operation breaks the chains.
    pub fn in_process(ops: u64, short: bool) -> Vec<Scenario> {
        let one_key = |name, title| Scenario {
            workers: 4,
            tasks: 8,
            ..Scenario::base(name, title, ops)
        };
        let own_keys = |scenario: Scenario| Scenario {
            keys: 4,
            affinity_per_mille: 900,
            ..scenario
        };
        // Scenario 2's fault: the victim process's first task thinks 300 ms,
        // and is stopped past its 500 ms lease, or killed, while it holds
        // the first key; kills every 2nd time. For CI the stop is 800 ms, so
        // that a 500-operation run has a stop and a kill with room to spare.
        let stop = |name, title, fencing| Scenario {
            ttl_ms: 500,
            fencing,
            fault: FaultPlan::StopHolder {
                stop_ms: if short { 800 } else { 1500 },
                victim_think_ms: 300,
                kill_every: 2,
            },
            expect_violations: !fencing,
            ..one_key(name, title)
        };
        vec![
            one_key(
                "tasks-1-key",
                "9. no faults, 4 processes x 8 tasks, 1 key (processes take turns)",
            ),
            own_keys(one_key(
                "tasks-own-keys",
                "9. no faults, 4 processes x 8 tasks, 4 keys, 9 in 10 on the process's own (local hand-over)",
            )),
            stop(
                "tasks-stop-holder",
                "10. 4 processes x 8 tasks, 1 key: SIGSTOP holder > TTL (every 2nd: kill -9), fencing on",
                true,
            ),
            stop(
                "tasks-stop-holder-unfenced",
                "10. same, store WITHOUT fencing (checker must object)",
                false,
            ),
            Scenario {
                // Longer holds than the others' 0-2 ms, so that the other
                // processes do not spend the budget before a stop and a
                // kill have struck (kept at 85 % local hand-overs).
                think_ms: (0, 20),
                ..own_keys(stop(
                    "tasks-stop-holder-own-keys",
                    "10. same with fencing, 4 keys, 9 in 10 on the process's own (local hand-over), think 0-20 ms",
                    true,
                ))
            },
        ]
    }

    /// Scenario 11: the synchronizer family on one Redis (Redlock refuses
    /// read-write locks and semaphores). For each of a read-write lock (70 %
    /// reads), a semaphore of 3 permits, `hold_at_least` 50 ms and
    /// `lock_all` of 2 keys out of 4, holds of 0-20 ms: scenario 2's fault (the victim thinks
    /// 300 ms holding, and is stopped past its 500 ms lease or, every 2nd
    /// time, killed), scenario 5's (`CLIENT KILL` of the normal and the
    /// pub/sub connections, alternately, so waiters lose their line and
    /// their notices), and a control whose checker must object: the store
    /// without fencing (the read-write lock's victim then always writes),
    /// or the checker told a stricter kind than the workers took (a
    /// semaphore of 2, a `hold_at_least` of twice the real one).
    pub fn synchronizers(ops: u64, short: bool) -> Vec<Scenario> {
        let small = |n: u32| if short { n.min(8) } else { n };
        let rw = Kind::Rw {
            reads_per_mille: 700,
        };
        let semaphore = Kind::Semaphore { permits: 3 };
        let hold = Kind::HoldAtLeast { ms: 50 };
        let all = Kind::All { keys: 2 };
        // `keys`: 4 where one key would make the run slow (`hold_at_least`
        // takes a key at most every 50 ms) or trivial (`lock_all`).
        let keys = |kind: Kind| match kind {
            Kind::HoldAtLeast { .. } | Kind::All { .. } => 4,
            _ => 1,
        };
        // Holds of 0-20 ms: a run long enough for a few strikes (in CI,
        // 0-4 ms: 500 operations are enough for one, the victim thinking
        // 300 ms).
        let think_ms = if short { (0, 4) } else { (0, 20) };
        let stop = |name, title, kind: Kind| Scenario {
            workers: small(16),
            keys: keys(kind),
            kind,
            think_ms,
            ttl_ms: 500,
            fault: FaultPlan::StopHolder {
                stop_ms: if short { 800 } else { 1500 },
                victim_think_ms: 300,
                kill_every: 2,
            },
            ..Scenario::base(name, title, ops)
        };
        let client_kill = |name, title, kind: Kind| Scenario {
            workers: small(16),
            keys: keys(kind),
            kind,
            think_ms,
            ttl_ms: 1000,
            fault: FaultPlan::ClientKill {
                every_ms: if short { 500 } else { 1000 },
            },
            ..Scenario::base(name, title, ops)
        };
        let unfenced = |s: Scenario| Scenario {
            fencing: false,
            expect_violations: true,
            ..s
        };
        let checked_as = |kind: Kind, s: Scenario| Scenario {
            check_as: Some(kind),
            expect_violations: true,
            ..s
        };
        vec![
            Scenario {
                // The victim reads or writes, half and half.
                victim_kind: Some(Kind::Rw {
                    reads_per_mille: 500,
                }),
                ..stop(
                    "rw-stop-holder",
                    "11. rw lock (70 % reads): SIGSTOP holder > TTL (every 2nd: kill -9), fencing on",
                    rw,
                )
            },
            unfenced(Scenario {
                victim_kind: Some(Kind::Rw { reads_per_mille: 0 }),
                ..stop(
                    "rw-stop-writer-unfenced",
                    "11. same, the victim always writes, store WITHOUT fencing (checker must object)",
                    rw,
                )
            }),
            client_kill(
                "rw-client-kill",
                "11. rw lock (70 % reads): CLIENT KILL normal / pubsub, alternately every 1 s, TTL 1 s",
                rw,
            ),
            stop(
                "semaphore-stop-holder",
                "11. semaphore, 3 permits: SIGSTOP holder > TTL (every 2nd: kill -9)",
                semaphore,
            ),
            checked_as(
                Kind::Semaphore { permits: 2 },
                stop(
                    "semaphore-checked-as-2",
                    "11. same, checked as a semaphore of 2 (checker must object)",
                    semaphore,
                ),
            ),
            client_kill(
                "semaphore-client-kill",
                "11. semaphore, 3 permits: CLIENT KILL normal / pubsub, alternately every 1 s, TTL 1 s",
                semaphore,
            ),
            stop(
                "hold-at-least-stop-holder",
                "11. hold_at_least 50 ms, 4 keys: SIGSTOP holder > TTL (every 2nd: kill -9), fencing on",
                hold,
            ),
            checked_as(
                Kind::HoldAtLeast { ms: 100 },
                stop(
                    "hold-at-least-checked-as-100",
                    "11. same, checked as hold_at_least 100 ms (checker must object)",
                    hold,
                ),
            ),
            client_kill(
                "hold-at-least-client-kill",
                "11. hold_at_least 50 ms, 4 keys: CLIENT KILL normal / pubsub, alternately every 1 s, TTL 1 s",
                hold,
            ),
            stop(
                "lock-all-stop-holder",
                "11. lock_all, 2 of 4 keys: SIGSTOP holder > TTL (every 2nd: kill -9), fencing on",
                all,
            ),
            unfenced(stop(
                "lock-all-stop-holder-unfenced",
                "11. same, store WITHOUT fencing (checker must object)",
                all,
            )),
            client_kill(
                "lock-all-client-kill",
                "11. lock_all, 2 of 4 keys: CLIENT KILL normal / pubsub, alternately every 1 s, TTL 1 s",
                all,
            ),
        ]
    }

    /// What `fault all` runs, in this order: scenarios 1-7, 8, 9-10, 11.
    pub fn suite(ops: u64, short: bool) -> Vec<Scenario> {
        let mut scenarios = Self::all(ops, short);
        scenarios.extend(Self::scale_out(ops, short));
        scenarios.extend(Self::in_process(ops, short));
        scenarios.extend(Self::synchronizers(ops, short));
        scenarios.extend(Self::fifo(ops, short));
        scenarios
    }

    /// Scenario 12: waiters keep their order when holders crash. Workers
    /// take one key with a 10 s wait and fixed leases (`renew(false)`) of
    /// 401-500 ms (each worker its own, 500 less its number: see
    /// [`Scenario::fifo`]); one operation in five tries once (wait 0).
    /// Scenario 2's fault strikes the holder: stopped past its lease or,
    /// every 2nd time, killed, so the key goes on by expiry, not by a
    /// release, every cycle; releases in between. On one Redis and on a
    /// Sentinel group (`min_replica_acks(1, 500 ms)`, no failover); not on
    /// Redlock, whose waiters do not queue.
    pub fn fifo(ops: u64, short: bool) -> Vec<Scenario> {
        let crash = |name, title, topology| Scenario {
            workers: if short { 8 } else { 16 },
            ttl_ms: 500,
            wait_ms: 10_000,
            // Holds long enough for a dozen strikes in 3,000 operations
            // (and two or more in CI's 500).
            think_ms: if short { (2, 10) } else { (0, 10) },
            fault: FaultPlan::StopHolder {
                stop_ms: 800,
                victim_think_ms: 300,
                kill_every: 2,
            },
            topology,
            fifo: Some(200),
            ..Scenario::base(name, title, ops)
        };
        vec![
            crash(
                "fifo-crashed-holders",
                "12. FIFO: 16 clients, 1 key, fixed leases 401-500 ms, 1 in 5 try-once; holder SIGSTOPped past its lease or (every 2nd) killed",
                Topology::Single,
            ),
            crash(
                "fifo-crashed-holders-sentinel",
                "12. same on Sentinel, min_replica_acks(1, 500 ms), no failover",
                Topology::Sentinel {
                    replicas: 1,
                    timeout_ms: 500,
                },
            ),
        ]
    }

    /// Demonstrations of an operator action that loses data: not part of
    /// `all` (the checker must object; `fault run NAME`).
    pub fn demonstrations(ops: u64, short: bool) -> Vec<Scenario> {
        vec![Scenario {
            expect_violations: true,
            ..Self::sentinel(
                "sentinel-empty-restart",
                "8. same, old master back empty as a master (checker must object)",
                Restart::EmptyMaster,
                ops,
                short,
            )
        }]
    }

    /// A Sentinel group whose master is killed once, brought back as
    /// `restart` says, while the new master stalls 3 s.
    fn sentinel(
        name: &'static str,
        title: &'static str,
        restart: Restart,
        ops: u64,
        short: bool,
    ) -> Scenario {
        Scenario {
            workers: if short { 8 } else { 16 },
            keys: 4,
            ttl_ms: 2000,
            response_timeout_ms: 500,
            topology: Topology::Sentinel {
                replicas: 1,
                timeout_ms: 500,
            },
            fault: FaultPlan::Failover {
                every_ms: if short { 1000 } else { 5000 },
                max: 1,
                restart,
                stall_ms: 3000,
            },
            ..Scenario::base(name, title, ops)
        }
    }

    /// The scenario called `name`.
    pub fn by_name(name: &str, ops: u64, short: bool) -> Option<Scenario> {
        Self::suite(ops, short)
            .into_iter()
            .chain(Self::demonstrations(ops, short))
            .find(|s| s.name == name)
    }
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

/// A worker process.
struct Running {
    id: u32,
    child: Child,
    done: bool,
}

impl Drop for Running {
    /// No worker outlives its run, even when the harness fails mid-way.
    fn drop(&mut self) {
        let _ = signal(self.child.id(), "CONT");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `scenario`, re-executing `exe` (the `fault` binary) as the workers;
/// logs and server files go to a temporary directory, kept when `keep` is set.
pub fn run(scenario: &Scenario, exe: &Path, keep: Option<&Path>) -> Result<Outcome, String> {
    let started = Instant::now();
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let dir: PathBuf = match keep {
        Some(d) => {
            let d = d.join(scenario.name);
            std::fs::create_dir_all(&d).map_err(|e| e.to_string())?;
            d
        }
        None => tmp.path().to_path_buf(),
    };
    let mut lock = LockSide::start(scenario)?;
    let store_server = RedisServer::try_start(&[])?;
    let store_client = redis::Client::open(store_server.url()).map_err(|e| e.to_string())?;
    let mut store_conn = store_client.get_connection().map_err(|e| e.to_string())?;
    let keys: Vec<String> = (0..scenario.keys).map(|i| format!("k{i}")).collect();
    let pg_server = match scenario.postgres {
        true => {
            let server = PostgresServer::try_start()?;
            crate::postgres::setup(&server.url(), &keys)?;
            Some(server)
        }
        false => None,
    };
    let record_url = pg_server.as_ref().map(PostgresServer::url);

    let epoch = log::monotonic_micros();
    let clock = Clock::new(epoch);
    let sampler = match &lock {
        LockSide::Sentinel(group) => {
            let (servers, sentinels) = group.ports();
            // The workers' clients use the default prefix `lock:`.
            let fences = keys
                .iter()
                .map(|k| lock_runtime::__private::testing::fence_counter("lock:", k))
                .collect();
            Some(
                Sampler::start(
                    servers,
                    sentinels,
                    group.master_name().to_owned(),
                    fences,
                    clock,
                    &dir.join("timeline.jsonl"),
                )
                .map_err(|e| e.to_string())?,
            )
        }
        _ => None,
    };
    let (lock_url, store_url) = (lock.urls(), store_server.url());
    let (topology, replica_acks) = (lock.topology(), lock.replica_acks(scenario));
    // The fault's victim: worker 0 and its replacements.
    let victim = |id: u32| {
        (id == 0 || id >= scenario.workers)
            && matches!(scenario.fault, FaultPlan::StopHolder { .. })
    };
    let worker = |id: u32| WorkerConfig {
        id,
        kind: match scenario.victim_kind {
            Some(kind) if victim(id) => kind,
            _ => scenario.kind,
        },
        tasks: scenario.tasks,
        lock_url: lock_url.clone(),
        store_url: store_url.clone(),
        record_url: record_url.clone(),
        topology: topology.clone(),
        replica_acks,
        epoch,
        log_dir: dir.clone(),
        keys: keys.clone(),
        // Replacements (numbered from `workers` on) stand in for worker 0.
        affinity: (
            if id >= scenario.workers {
                0
            } else {
                u64::from(id) % keys.len() as u64
            },
            scenario.affinity_per_mille,
        ),
        budget: scenario.ops,
        // Scenario 12: a lease of its own per worker (its queue entry
        // names it), at most the scenario's.
        ttl_ms: match scenario.fifo {
            Some(_) => scenario.ttl_ms - (u64::from(id) % 100).min(scenario.ttl_ms / 2),
            None => scenario.ttl_ms,
        },
        try_once_per_mille: scenario.fifo,
        wait_ms: scenario.wait_ms,
        think_ms: scenario.think_ms,
        // The victim's first task thinks long: the harness strikes while it
        // holds (its other tasks, if any, wait in its line or go on).
        first_task_think_ms: match scenario.fault {
            FaultPlan::StopHolder {
                victim_think_ms, ..
            } if victim(id) => (victim_think_ms, victim_think_ms),
            _ => scenario.think_ms,
        },
        fencing: scenario.fencing,
        response_timeout_ms: scenario.response_timeout_ms,
        cancel_per_mille: scenario.cancel.0,
        cancel_max_ms: scenario.cancel.1,
        block_per_mille: scenario.block.0,
        block_keep_ms: scenario.block.1,
        block_lose_ms: scenario.block.2,
        seed: u64::from(id) * 7919 + epoch,
    };
    let spawn = |config: &WorkerConfig| -> Result<Running, String> {
        let stderr = std::fs::File::create(dir.join(format!("worker-{}.stderr", config.id)))
            .map_err(|e| e.to_string())?;
        let child = Command::new(exe)
            .args(config.to_args())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .map_err(|e| format!("cannot start a worker ({}): {e}", exe.display()))?;
        Ok(Running {
            id: config.id,
            child,
            done: false,
        })
    };
    let mut running = Vec::new();
    for id in 0..scenario.workers {
        running.push(spawn(&worker(id))?);
    }

    let mut faults: Vec<Fault> = Vec::new();
    let mut fault_log = LogWriter::create(&dir.join("faults.jsonl")).map_err(|e| e.to_string())?;
    let deadline = started + Duration::from_secs(60) + Duration::from_millis(scenario.ops * 30);
    let mut injector = Injector::new(&scenario.fault);
    let mut next_victim = scenario.workers;
    loop {
        let mut all_done = true;
        for r in running.iter_mut().filter(|r| !r.done) {
            match r.child.try_wait() {
                Ok(Some(_)) => r.done = true,
                _ => all_done = false,
            }
        }
        if all_done || Instant::now() > deadline {
            break;
        }
        let step = injector.tick(InjectCtx {
            scenario,
            clock: &clock,
            lock: &mut lock,
            store: &mut store_conn,
            keys: &keys,
            running: &running,
        })?;
        match step {
            Some(Step::Fault(f)) => {
                let _ = fault_log.write(&f);
                faults.push(f);
            }
            Some(Step::KilledVictim(f)) => {
                let _ = fault_log.write(&f);
                faults.push(f);
                // A new victim takes over its role.
                let config = worker(next_victim);
                next_victim += 1;
                running.push(spawn(&config)?);
            }
            None => {}
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    injector.finish(&mut lock, &running, &clock, &mut faults)?;
    let mut hung = Vec::new();
    for r in running.iter_mut() {
        if !r.done {
            // Not finished by the deadline, or a victim stopped at the end.
            match r.child.try_wait() {
                Ok(Some(_)) => {}
                _ => {
                    hung.push(r.id);
                    let _ = r.child.kill();
                    let _ = r.child.wait();
                }
            }
        }
    }

    let mut workers = Vec::new();
    for r in &running {
        for task in 0..scenario.tasks {
            let id = worker::logical_id(r.id, task, scenario.tasks);
            let events: Vec<Event> = match log::read_lines(&worker::log_file(&dir, id)) {
                Ok(events) => events,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
                Err(e) => return Err(e.to_string()),
            };
            workers.push(WorkerLog {
                id,
                process: r.id,
                events,
            });
        }
    }
    let records = match &record_url {
        Some(url) => crate::postgres::fetch_records(url, &keys)?,
        None => {
            let mut records = BTreeMap::new();
            for key in &keys {
                records.insert(key.clone(), store::fetch_record(&mut store_conn, key)?);
            }
            records
        }
    };
    let drawn = store::fetch_drawn(&mut store_conn)?;
    let tokens = match &mut lock {
        LockSide::Single(server) if scenario.tasks > 1 => Some(TokenCalls::of(server)?),
        _ => None,
    };
    let data = RunData {
        kind: scenario.check_as.unwrap_or(scenario.kind),
        ttl_ms: scenario.ttl_ms,
        slack_ms: scenario.slack_ms,
        expect_monotonic_fences: scenario.expect_monotonic_fences,
        workers,
        faults: faults.clone(),
        records,
        drawn,
        hung,
        fifo: scenario.fifo.is_some(),
    };
    let report = checker::check(&data);
    drop(sampler);
    // A group that a stranger joined measured someone else's data: say so
    // instead of charging its violations to the library.
    let mut error = None;
    if let LockSide::Sentinel(group) = &lock {
        group.copy_logs(&dir);
        error = group
            .check_isolated()
            .err()
            .map(|e| format!("the Sentinel group was not isolated: {e}"));
    }
    drop(lock);
    drop(store_server);
    drop(pg_server);
    Ok(Outcome {
        scenario: scenario.clone(),
        report,
        elapsed: started.elapsed(),
        faults: faults.len(),
        tokens,
        error,
    })
}

/// The lock servers of a run.
enum LockSide {
    Single(RedisServer),
    Redlock(Vec<RedisServer>),
    Sentinel(Box<SentinelGroup>),
}

impl LockSide {
    fn start(scenario: &Scenario) -> Result<Self, String> {
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
    fn urls(&self) -> String {
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

    fn topology(&self) -> String {
        match self {
            LockSide::Single(_) => "single".into(),
            LockSide::Redlock(_) => "redlock".into(),
            LockSide::Sentinel(g) => format!("sentinel:{}", g.master_name()),
        }
    }

    fn replica_acks(&self, scenario: &Scenario) -> (u32, u64) {
        match scenario.topology {
            Topology::Sentinel {
                replicas,
                timeout_ms,
            } => (replicas, timeout_ms),
            _ => (0, 0),
        }
    }

    /// The server single-server faults act on (the master).
    fn primary(&mut self) -> &mut RedisServer {
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

enum Step {
    Fault(Fault),
    KilledVictim(Fault),
}

struct InjectCtx<'a> {
    scenario: &'a Scenario,
    clock: &'a Clock,
    lock: &'a mut LockSide,
    store: &'a mut redis::Connection,
    keys: &'a [String],
    running: &'a [Running],
}

enum Phase {
    Idle {
        next: Instant,
    },
    /// A worker (index into `running`) stopped since `t` (clock), until `until`.
    Stopped {
        index: usize,
        t: u64,
        until: Instant,
    },
    /// The server is paused or dead since `t`, until `until`.
    Down {
        t: u64,
        until: Instant,
        killed: bool,
    },
    /// Redlock nodes dead since `t`, until `until`.
    NodesDown {
        nodes: Vec<usize>,
        t: u64,
        until: Instant,
    },
}

struct Injector {
    plan: FaultPlan,
    phase: Phase,
    cycles: u32,
    kills: u32,
    pubsub_next: bool,
}

impl Injector {
    fn new(plan: &FaultPlan) -> Self {
        Self {
            plan: plan.clone(),
            phase: Phase::Idle {
                next: Instant::now() + Duration::from_millis(300),
            },
            cycles: 0,
            kills: 0,
            pubsub_next: false,
        }
    }

    fn tick(&mut self, cx: InjectCtx<'_>) -> Result<Option<Step>, String> {
        let now = Instant::now();
        match (&self.plan, &self.phase) {
            (FaultPlan::None, _) => Ok(None),
            (
                FaultPlan::StopHolder {
                    stop_ms,
                    kill_every,
                    ..
                },
                Phase::Idle { next },
            ) => {
                if now < *next {
                    return Ok(None);
                }
                // The current victim: the newest live worker in the role.
                let Some(index) = cx
                    .running
                    .iter()
                    .rposition(|r| (r.id == 0 || r.id >= cx.scenario.workers) && !r.done)
                else {
                    return Ok(None);
                };
                let victim = &cx.running[index];
                // Its first task, the one that thinks long: the exclusive
                // reader of the first key, or one of its shared holders.
                let first = worker::logical_id(victim.id, 0, cx.scenario.tasks);
                let shared_mark = format!("in:{first}");
                let (reader, shared): (Option<String>, Option<String>) = redis::cmd("HMGET")
                    .arg(store::record_key(&cx.keys[0]))
                    .arg("reader")
                    .arg(&shared_mark)
                    .query(cx.store)
                    .map_err(|e| e.to_string())?;
                if reader.as_deref() != Some(first.to_string().as_str()) && shared.is_none() {
                    return Ok(None);
                }
                // It read and now thinks, holding the lock: strike.
                self.cycles += 1;
                let t = cx.clock.now();
                if *kill_every > 0 && self.cycles.is_multiple_of(*kill_every) {
                    signal(victim.child.id(), "KILL")?;
                    self.phase = Phase::Idle {
                        next: now + Duration::from_millis(300),
                    };
                    // Forget the dead victim's read so the new one is awaited.
                    let _: () = redis::cmd("HDEL")
                        .arg(store::record_key(&cx.keys[0]))
                        .arg("reader")
                        .arg(&shared_mark)
                        .query(cx.store)
                        .map_err(|e| e.to_string())?;
                    return Ok(Some(Step::KilledVictim(Fault::KillWorker {
                        worker: victim.id,
                        t,
                    })));
                }
                signal(victim.child.id(), "STOP")?;
                self.phase = Phase::Stopped {
                    index,
                    t,
                    until: now + Duration::from_millis(*stop_ms),
                };
                Ok(None)
            }
            (FaultPlan::StopHolder { .. }, Phase::Stopped { index, t, until }) => {
                if now < *until {
                    return Ok(None);
                }
                let victim = &cx.running[*index];
                // Read the clock before the signal: the victim may run, and
                // even finish its write, before this thread runs again.
                let end = cx.clock.now();
                signal(victim.child.id(), "CONT")?;
                let fault = Fault::StopWorker {
                    worker: victim.id,
                    start: *t,
                    end,
                };
                self.phase = Phase::Idle {
                    next: now + Duration::from_millis(300),
                };
                Ok(Some(Step::Fault(fault)))
            }
            (FaultPlan::PauseServer { pause_ms, every_ms }, Phase::Idle { next }) => {
                if now < *next {
                    return Ok(None);
                }
                let _ = every_ms;
                cx.lock.primary().pause()?;
                self.phase = Phase::Down {
                    t: cx.clock.now(),
                    until: now + Duration::from_millis(*pause_ms),
                    killed: false,
                };
                Ok(None)
            }
            (
                FaultPlan::KillServer {
                    down_ms, max_kills, ..
                },
                Phase::Idle { next },
            ) => {
                if now < *next || self.kills >= *max_kills {
                    return Ok(None);
                }
                self.kills += 1;
                let t = cx.clock.now();
                cx.lock.primary().kill();
                self.phase = Phase::Down {
                    t,
                    until: now + Duration::from_millis(*down_ms),
                    killed: true,
                };
                Ok(None)
            }
            (
                FaultPlan::PauseServer { every_ms, .. } | FaultPlan::KillServer { every_ms, .. },
                Phase::Down { t, until, killed },
            ) => {
                if now < *until {
                    return Ok(None);
                }
                let (t, killed) = (*t, *killed);
                if killed {
                    cx.lock.primary().restart()?;
                } else {
                    cx.lock.primary().resume()?;
                }
                self.phase = Phase::Idle {
                    next: Instant::now() + Duration::from_millis(*every_ms),
                };
                Ok(Some(Step::Fault(Fault::Server {
                    kind: if killed { "kill" } else { "pause" }.into(),
                    start: t,
                    end: cx.clock.now(),
                })))
            }
            (FaultPlan::ClientKill { every_ms }, Phase::Idle { next }) => {
                if now < *next {
                    return Ok(None);
                }
                let kind = if self.pubsub_next { "pubsub" } else { "normal" };
                self.pubsub_next = !self.pubsub_next;
                let url = cx.lock.primary().url();
                let client = redis::Client::open(url).map_err(|e| e.to_string())?;
                let mut conn = client.get_connection().map_err(|e| e.to_string())?;
                let killed: u64 = redis::cmd("CLIENT")
                    .arg("KILL")
                    .arg("TYPE")
                    .arg(kind)
                    .query(&mut conn)
                    .map_err(|e| e.to_string())?;
                self.phase = Phase::Idle {
                    next: now + Duration::from_millis(*every_ms),
                };
                Ok(Some(Step::Fault(Fault::ClientKill {
                    kind: kind.into(),
                    killed,
                    t: cx.clock.now(),
                })))
            }
            (FaultPlan::KillMinority { down_ms, .. }, Phase::Idle { next }) => {
                if now < *next {
                    return Ok(None);
                }
                let LockSide::Redlock(servers) = &mut *cx.lock else {
                    return Err("KillMinority needs Redlock".into());
                };
                let n = servers.len();
                let minority = (n - 1) / 2;
                let nodes: Vec<usize> = (0..minority)
                    .map(|i| (self.cycles as usize * minority + i) % n)
                    .collect();
                self.cycles += 1;
                let t = cx.clock.now();
                for &i in &nodes {
                    servers[i].kill();
                }
                self.phase = Phase::NodesDown {
                    nodes,
                    t,
                    until: now + Duration::from_millis(*down_ms),
                };
                Ok(None)
            }
            (FaultPlan::KillMinority { every_ms, .. }, Phase::NodesDown { nodes, t, until }) => {
                if now < *until {
                    return Ok(None);
                }
                let LockSide::Redlock(servers) = &mut *cx.lock else {
                    return Err("KillMinority needs Redlock".into());
                };
                for &i in nodes {
                    servers[i].restart()?;
                }
                let fault = Fault::Nodes {
                    nodes: nodes.iter().map(|&i| i as u32).collect(),
                    start: *t,
                    end: cx.clock.now(),
                };
                self.phase = Phase::Idle {
                    next: Instant::now() + Duration::from_millis(*every_ms),
                };
                Ok(Some(Step::Fault(fault)))
            }
            (
                FaultPlan::Failover {
                    every_ms,
                    max,
                    restart,
                    stall_ms,
                },
                Phase::Idle { next },
            ) => {
                if now < *next || self.kills >= *max {
                    return Ok(None);
                }
                // The first kill once a quarter of the run is done: counters
                // well above what the first attempts after a loss burn.
                let drawn: Option<u64> = redis::cmd("GET")
                    .arg(store::OPS_KEY)
                    .query(cx.store)
                    .map_err(|e| e.to_string())?;
                if self.kills == 0 && drawn.unwrap_or(0) < cx.scenario.ops / 4 {
                    return Ok(None);
                }
                self.kills += 1;
                let LockSide::Sentinel(group) = &mut *cx.lock else {
                    return Err("Failover needs Sentinel".into());
                };
                let t = cx.clock.now();
                group.failover(
                    *restart == Restart::SyncedReplica,
                    Duration::from_millis(*stall_ms),
                )?;
                self.phase = Phase::Idle {
                    next: Instant::now() + Duration::from_millis(*every_ms),
                };
                Ok(Some(Step::Fault(Fault::Server {
                    kind: "failover".into(),
                    start: t,
                    end: cx.clock.now(),
                })))
            }
            _ => Ok(None),
        }
    }

    /// Ends a fault still in progress (the run is over).
    fn finish(
        &mut self,
        lock: &mut LockSide,
        running: &[Running],
        clock: &Clock,
        faults: &mut Vec<Fault>,
    ) -> Result<(), String> {
        match std::mem::replace(
            &mut self.phase,
            Phase::Idle {
                next: Instant::now(),
            },
        ) {
            Phase::Idle { .. } => {}
            Phase::Stopped { index, t, .. } => {
                let victim = &running[index];
                let _ = signal(victim.child.id(), "CONT");
                faults.push(Fault::StopWorker {
                    worker: victim.id,
                    start: t,
                    end: clock.now(),
                });
            }
            Phase::NodesDown { nodes, t, .. } => {
                if let LockSide::Redlock(servers) = lock {
                    for &i in &nodes {
                        servers[i].restart()?;
                    }
                }
                faults.push(Fault::Nodes {
                    nodes: nodes.iter().map(|&i| i as u32).collect(),
                    start: t,
                    end: clock.now(),
                });
            }
            Phase::Down { t, killed, .. } => {
                if killed {
                    lock.primary().restart()?;
                } else {
                    lock.primary().resume()?;
                }
                faults.push(Fault::Server {
                    kind: if killed { "kill" } else { "pause" }.into(),
                    start: t,
                    end: clock.now(),
                });
            }
        }
        Ok(())
    }
}

/// The table: scenario, operations, violations, max stall, and what else
/// each run showed.
pub fn table(outcomes: &[Outcome]) -> String {
    let mut s = String::new();
    s.push_str("| scenario | operations | violations | max stall | notes |\n");
    s.push_str("| --- | ---: | ---: | ---: | --- |\n");
    for o in outcomes {
        let r = &o.report;
        let mut notes = vec![format!(
            "{} acquired, {} writes accepted, max wait {} ms",
            r.acquired, r.writes_accepted, r.max_wait_ms
        )];
        if r.fenced_out > 0 {
            notes.push(format!("{} rejected by fencing", r.fenced_out));
        }
        if r.acquire_errors > 0 {
            notes.push(format!("{} acquire errors retried", r.acquire_errors));
        }
        if r.cancelled > 0 {
            notes.push(format!("{} cancelled", r.cancelled));
        }
        if r.killed_mid_draw > 0 {
            notes.push(format!(
                "{} drawn by tasks killed before their attempt",
                r.killed_mid_draw
            ));
        }
        if let (Some(local), Some(tokens)) = (o.handed_on_locally(), o.tokens) {
            notes.push(format!(
                "at least {local} handed on in-process ({} tokens from the server, {} blocks reserved)",
                tokens.single, tokens.blocks
            ));
        }
        if r.stale_writes > 0 || r.stale_release_lost > 0 {
            notes.push(format!(
                "stale writes {} ({} rejected), stale releases \"not owner\" {}",
                r.stale_writes, r.stale_writes_rejected, r.stale_release_lost
            ));
        }
        if r.max_takeover_ms > 0 {
            notes.push(format!(
                "max takeover after stop/kill {} ms",
                r.max_takeover_ms
            ));
        }
        if r.fence_regressions > 0 {
            notes.push(format!("{} token repeats/regressions", r.fence_regressions));
        }
        if r.blocked_keep + r.blocked_lose > 0 {
            notes.push(format!(
                "blocked {} x keep, {} x lose",
                r.blocked_keep, r.blocked_lose
            ));
        }
        if o.faults > 0 {
            notes.push(format!("{} faults", o.faults));
        }
        if let Some(f) = r.fifo {
            notes.push(format!(
                "{} waiters seen in line, {} grants with an earlier waiter in line, try-once {} granted / {} busy",
                f.queued, f.behind, f.try_once_granted, f.try_once_refused
            ));
        }
        if let Some(e) = &o.error {
            let first = e.lines().next().unwrap_or_default();
            s.push_str(&format!(
                "| {} | - | harness error | - | {first} |\n",
                o.scenario.title
            ));
            continue;
        }
        let violations = if r.violations.total() == 0 {
            "0".to_string()
        } else {
            let kinds: Vec<String> = r
                .violations
                .nonzero()
                .iter()
                .map(|(k, n)| format!("{k} {n}"))
                .collect();
            format!(
                "{}{} ({})",
                r.violations.total(),
                if o.scenario.expect_violations {
                    " (expected)"
                } else {
                    ""
                },
                kinds.join(", ")
            )
        };
        s.push_str(&format!(
            "| {} | {} | {} | {} ms | {}; {:.0} s |\n",
            o.scenario.title,
            r.operations,
            violations,
            r.max_stall_ms,
            notes.join("; "),
            o.elapsed.as_secs_f64()
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_calls_are_read_from_info_commandstats() {
        let info = "# Commandstats\r\n\
            cmdstat_evalsha:calls=900,usec=1,usec_per_call=0.00\r\n\
            cmdstat_incrby:calls=5,usec=2,usec_per_call=0.40\r\n\
            cmdstat_incr:calls=486,usec=3,usec_per_call=0.01\r\n";
        assert_eq!(
            TokenCalls::parse(info),
            TokenCalls {
                single: 486,
                blocks: 5
            }
        );
        assert_eq!(TokenCalls::parse(""), TokenCalls::default());
    }

    #[test]
    fn every_scenario_has_its_own_name() {
        let suite = Scenario::suite(500, true);
        let mut names: Vec<&str> = suite.iter().map(|s| s.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), suite.len());
    }
}
