//! The rows of the table: their order, what each measures, its baseline and
//! its target. BENCHMARKS.md explains each.

use super::report::{Metric, Target, Unit};

// Indexes into the metric list; the order is the table's.
pub(crate) const M1: usize = 0;
pub(crate) const M1_SCRIPTS: usize = 1;
pub(crate) const M1_FENCE: usize = 2;
pub(crate) const M1_FENCED_PAIR: usize = 3;
pub(crate) const M2: usize = 4;
pub(crate) const M2_PEER: usize = 5;
pub(crate) const M2_MANAGED: usize = 6;
pub(crate) const M3_GRANTS: usize = 7;
pub(crate) const M3_WAIT: usize = 8;
pub(crate) const M4_GRANTS: usize = 9;
pub(crate) const M4_SPIN: usize = 10;
pub(crate) const M4_FAIR: usize = 11;
pub(crate) const M4_WAIT: usize = 12;
pub(crate) const M5: usize = 13;
pub(crate) const M5_FLOOR: usize = 14;
pub(crate) const M6: usize = 15;
pub(crate) const M7: usize = 16;
pub(crate) const M7_CPU: usize = 17;
pub(crate) const M7_SAFE: usize = 18;
pub(crate) const M8: usize = 19;
pub(crate) const M8_RSS_REDIS: usize = 20;
pub(crate) const M8_RSS_MEMORY: usize = 21;
pub(crate) const M9_FAIR: usize = 22;
pub(crate) const M9_RATE: usize = 23;
pub(crate) const M10_SEM: usize = 24;
pub(crate) const M10_READ: usize = 25;
pub(crate) const M11: usize = 26;
pub(crate) const M11_FENCED: usize = 27;
pub(crate) const M11_LIBRARY: usize = 28;
pub(crate) const M12: usize = 29;
pub(crate) const M12_CHECKED: usize = 30;
pub(crate) const M12_LIBRARY: usize = 31;
pub(crate) const M12_COMMIT: usize = 32;
pub(crate) const M12_COMMIT_HERE: usize = 33;

/// The label of rslock's hot-key side, as the table and the chart show it.
pub(crate) const PEER_HOT: &str = "rslock acquire (retry loop)";
/// The label of the raw hot-key side.
pub(crate) const RAW_SPIN: &str = "raw SET NX spin-retry";

pub(crate) fn definitions() -> Vec<Metric> {
    let m = Metric::new;
    use Target::{AtMost, Info, RatioAtLeast, RatioAtMost};
    vec![
        m(
            "1",
            "serial acquire+release, one key: p50",
            Unit::Micros,
            "raw SET NX PX + EVALSHA del",
            RatioAtMost(1.05),
        ),
        m(
            "1",
            "the library's two scripts sent by hand (no client code): p50",
            Unit::Micros,
            "raw SET NX PX + EVALSHA del",
            Info,
        ),
        m(
            "1",
            "a fenced write (fence::redis, one HSET): p50",
            Unit::Micros,
            "the same HSET, unfenced",
            Info,
        ),
        m(
            "1",
            "serial acquire + fencing_token + release, one key: p50",
            Unit::Micros,
            "the least fenced pair: EVALSHA (SET NX PX, INCR) + EVALSHA del",
            Info,
        ),
        m(
            "2",
            "32 tasks, distinct keys: pairs/s",
            Unit::PerSec,
            "raw, 32 tasks, 1 conn",
            RatioAtLeast(0.95),
        ),
        m(
            "2",
            "32 tasks, distinct keys: pairs/s, against the peer",
            Unit::PerSec,
            "rslock lock+unlock, 32 tasks",
            RatioAtLeast(1.05),
        ),
        m(
            "2",
            "32 tasks, distinct keys: pairs/s, against raw on the library's kind of connection",
            Unit::PerSec,
            "raw, 32 tasks, 1 ConnectionManager",
            Info,
        ),
        m(
            "3",
            "hot key, 16 tasks, hold 1 ms: grants/s",
            Unit::PerSec,
            "ceiling: hold loop, no lock",
            RatioAtLeast(0.95),
        ),
        m(
            "3",
            "hot key, 16 tasks, hold 1 ms: wait p99",
            Unit::Millis,
            "ideal FIFO: 15 x measured hold",
            RatioAtMost(1.2),
        ),
        m(
            "4",
            "hot key, 32 tasks, zero hold: grants/s",
            Unit::PerSec,
            PEER_HOT,
            RatioAtLeast(3.0),
        ),
        m(
            "4",
            "hot key, 32 tasks, zero hold: grants/s, against spinning",
            Unit::PerSec,
            RAW_SPIN,
            Info,
        ),
        m(
            "4",
            "hot key, 32 tasks: max/min grants per task",
            Unit::Factor,
            PEER_HOT,
            AtMost(1.5),
        ),
        m(
            "4",
            "hot key, 32 tasks: wait p99",
            Unit::Millis,
            PEER_HOT,
            AtMost(20.0),
        ),
        m(
            "5",
            "single waiter handoff, release -> waiter holds: p50",
            Unit::Micros,
            "raw DEL+PUBLISH -> SET NX",
            RatioAtMost(1.0),
        ),
        m(
            "5",
            "floor: one raw round trip after the same 3 ms idle: p50",
            Unit::Micros,
            "",
            Info,
        ),
        m(
            "6",
            "#[distributed_lock] fn, serial: p50",
            Unit::Micros,
            "hand-written with_lock",
            RatioAtMost(1.05),
        ),
        m(
            "7",
            "10,000 held locks: commands per 100 locks per renewal period",
            Unit::Count,
            "naive: 1 script per lock, computed",
            AtMost(1.0),
        ),
        m(
            "7",
            "10,000 held locks: client CPU while renewing (one core = 100)",
            Unit::Percent,
            "",
            Info,
        ),
        m(
            "7",
            "10,000 held locks: lost, or taken by a second client, at the end",
            Unit::Count,
            "",
            AtMost(0.0),
        ),
        m(
            "8",
            "memory backend, uncontended pair: p50",
            Unit::Micros,
            "raw redis pair",
            RatioAtMost(0.1),
        ),
        m(
            "8",
            "RSS with 10,000 held locks, redis backend",
            Unit::KiB,
            "RSS before",
            Info,
        ),
        m(
            "8",
            "RSS with 10,000 held locks, memory backend",
            Unit::KiB,
            "RSS before",
            Info,
        ),
        m(
            "9",
            "2 processes x 16 tasks, one key, zero hold: max/min grants per process",
            Unit::Factor,
            "",
            AtMost(2.0),
        ),
        m(
            "9",
            "2 processes x 16 tasks, one key, zero hold: grants/s",
            Unit::PerSec,
            "1 process x 32 tasks (row 4)",
            Info,
        ),
        m(
            "10",
            "semaphore (4 permits) acquire+release, serial: p50",
            Unit::Micros,
            "mutex acquire+release (library)",
            RatioAtMost(1.5),
        ),
        m(
            "10",
            "read lock acquire+release, serial: p50",
            Unit::Micros,
            "mutex acquire+release (library)",
            RatioAtMost(1.5),
        ),
        m(
            "11",
            "axum route behind LockLayer, wrk 32 conns, distinct ids: req/s",
            Unit::PerSec,
            "hand-rolled SET NX PX + EVALSHA del middleware",
            RatioAtLeast(0.95),
        ),
        m(
            "11",
            "the least a fenced lock middleware can be (EVALSHA of SET NX PX + INCR, then EVALSHA del): req/s",
            Unit::PerSec,
            "hand-rolled SET NX PX + EVALSHA del middleware",
            Info,
        ),
        m(
            "11",
            "the library's acquire.lua + release.lua in a hand-rolled middleware (no client code): req/s",
            Unit::PerSec,
            "hand-rolled SET NX PX + EVALSHA del middleware",
            Info,
        ),
        m(
            "12",
            "axum route behind IdempotencyLayer, wrk 32 conns, unique keys: req/s",
            Unit::PerSec,
            "hand-rolled SET NX claim + SET store middleware",
            RatioAtLeast(0.9),
        ),
        m(
            "12",
            "the same claim + store with an owner-checked store (EVALSHA of GET + SET PX): req/s",
            Unit::PerSec,
            "hand-rolled SET NX claim + SET store middleware",
            Info,
        ),
        m(
            "12",
            "the library's record commands (its SET NX claim, its settle: SET IFEQ where the server has it, else idempotency_settle.lua) in a hand-rolled middleware (no client code): req/s",
            Unit::PerSec,
            "hand-rolled SET NX claim + SET store middleware",
            Info,
        ),
        m(
            "12",
            "the handler's write (HSET) committed with its record through a Redis commit store (commit_with_redis, Commit::redis): exactly once across crashes: req/s",
            Unit::PerSec,
            "IdempotencyLayer, the handler sending the same HSET itself",
            Info,
        ),
        m(
            "12",
            "the same write committed in the record itself, on the lock server (commit_on_lock_server, Commit::redis): exactly once across crashes: req/s",
            Unit::PerSec,
            "IdempotencyLayer, the handler sending the same HSET itself",
            Info,
        ),
    ]
}
