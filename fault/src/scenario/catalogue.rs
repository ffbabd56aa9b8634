//! The scenarios: `fault all`'s suite, the demonstrations, and each by name.

use super::*;
use crate::orders::OrderStore;

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
            token: TokenTiming::AtGrant,
            orders: None,
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
        // Scenario 2 with the lazy token (Kleppmann's paused holder): the
        // workers ask for their token only after their think, the pause the
        // stop stretches past the victim's lease. The plain path mints a
        // lock's token on first use, so the victim must mostly take its key
        // uncontended: each worker takes a key of its own 9 times in 10 (the
        // victim k0), and the others' tenth operation brings one of them to
        // k0 now and then, which takes the key over while the victim is
        // stopped. Holds of 50-150 ms, so that the budget lasts for strikes.
        let lazy = |name, title, token| Scenario {
            workers: small(16),
            keys: small(16) as usize,
            affinity_per_mille: 900,
            ttl_ms: 500,
            think_ms: (50, 150),
            fault: FaultPlan::StopHolder {
                stop_ms: if short { 800 } else { 1500 },
                victim_think_ms: 300,
                kill_every: 3,
            },
            token,
            expect_violations: token == TokenTiming::Unchecked,
            ..Scenario::base(name, title, ops)
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
            lazy(
                "stop-holder-lazy-token",
                "2. SIGSTOP holder > TTL before it asks for its token (minted on first use), every 3rd: kill -9",
                TokenTiming::AfterThink,
            ),
            lazy(
                "stop-holder-lazy-token-unchecked",
                "2. same, tokens minted without the lease check (checker must object)",
                TokenTiming::Unchecked,
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
                keys: 32,
                ..one_key(
                    "tasks-batched",
                    "9. no faults, 4 processes x 8 tasks, 32 keys (calls coalesced: a process's tasks on distinct keys share batches)",
                )
            },
            Scenario {
                keys: 32,
                ttl_ms: 1000,
                fault: FaultPlan::ClientKill { every_ms: 1000 },
                ..one_key(
                    "tasks-batched-client-kill",
                    "9. 4 processes x 8 tasks, 32 keys, batched calls: CLIENT KILL normal / pubsub, alternately every 1 s, TTL 1 s",
                )
            },
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

    /// What `fault all` runs, in this order: scenarios 1-7, 8, 9-10, 11,
    /// 12, 13.
    pub fn suite(ops: u64, short: bool) -> Vec<Scenario> {
        let mut scenarios = Self::all(ops, short);
        scenarios.extend(Self::scale_out(ops, short));
        scenarios.extend(Self::in_process(ops, short));
        scenarios.extend(Self::synchronizers(ops, short));
        scenarios.extend(Self::fifo(ops, short));
        scenarios.extend(Self::exactly_once(ops));
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

    /// Scenario 13: exactly once across crashes ([`crate::orders`]). The
    /// example order service, two instances behind one Redis (orders in
    /// that Redis, or in a PostgreSQL of the run's own), one of them
    /// SIGKILLed and restarted at once every 30-150 ms, `ops / 30` times
    /// (at least 10), while 16 clients create orders, each key retried
    /// until it gets a `2xx`; and the controls: the same service with the
    /// order and its idempotency record committed apart
    /// (`IDEMPOTENCY_COMMIT=off`), whose second orders the count must find.
    pub fn exactly_once(ops: u64) -> Vec<Scenario> {
        let kills = (ops / 30).max(10) as usize;
        let orders = |name, title, store, commit: bool| Scenario {
            expect_violations: !commit,
            orders: Some(OrderPlan::new(store, commit, kills)),
            ..Scenario::base(name, title, ops)
        };
        vec![
            orders(
                "exactly-once-redis",
                "13. order service: kill -9 + restart every 30-150 ms under retrying clients, orders and records committed together in Redis",
                OrderStore::Redis,
                true,
            ),
            orders(
                "exactly-once-postgres",
                "13. same, orders and records committed together in PostgreSQL",
                OrderStore::Postgres,
                true,
            ),
            orders(
                "exactly-once-redis-no-commit",
                "13. same on Redis, the order committed before its record (checker must object)",
                OrderStore::Redis,
                false,
            ),
            orders(
                "exactly-once-postgres-no-commit",
                "13. same on PostgreSQL, the order committed before its record (checker must object)",
                OrderStore::Postgres,
                false,
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
