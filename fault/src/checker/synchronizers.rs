//! The rules that depend on the synchronizer ([`Kind`]): who may hold a key
//! together, in the workers' logs and in the store's order, and how far
//! apart `hold_at_least` keeps acquisitions.
//!
//! Every rule counts only *valid* holds ([`Op::valid_hold`]): those whose
//! release said `Ok`, over `[acquire returned, release sent]`. A holder
//! stopped past its lease or killed has none, so its late steps are judged
//! by fencing (the store) and by the stopped-holder checks, not here.

use std::collections::{BTreeMap, HashMap};

use super::{Op, ms};
use crate::kind::{Kind, Side};
use crate::store::{AccessKind, Record};

/// A start or an end of a hold, for a sweep in time (or store) order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Edge {
    t: u64,
    /// Ends (0) before starts (1) at one instant: `[a, b)` and `[b, c)` do
    /// not overlap.
    start: u8,
    worker: u32,
    op: u64,
}

/// Holds (`(start, end, side, worker, op)`) that `kind` does not admit
/// together with the ones already held when they start: one message each.
fn crowded(kind: Kind, key: &str, holds: &[(u64, u64, Side, u32, u64)], unit: &str) -> Vec<String> {
    let sides: HashMap<(u32, u64), Side> = holds.iter().map(|h| ((h.3, h.4), h.2)).collect();
    let mut edges: Vec<Edge> = Vec::new();
    for &(start, end, _, worker, op) in holds {
        edges.push(Edge {
            t: start,
            start: 1,
            worker,
            op,
        });
        edges.push(Edge {
            t: end.max(start),
            start: 0,
            worker,
            op,
        });
    }
    edges.sort_unstable();
    let mut active: BTreeMap<(u32, u64), Side> = BTreeMap::new();
    let mut found = Vec::new();
    for e in edges {
        let id = (e.worker, e.op);
        if e.start == 0 {
            active.remove(&id);
            continue;
        }
        let side = sides[&id];
        let shared = active.values().filter(|s| **s == Side::Read).count() as u64;
        let exclusive = active.len() as u64 - shared;
        if !kind.admits(side, shared, exclusive) {
            let others: Vec<String> = active
                .iter()
                .take(4)
                .map(|((w, o), s)| format!("worker {w} op {o} ({s:?})"))
                .collect();
            found.push(format!(
                "{key}: worker {} op {} ({side:?}) held from {}{unit} with {} valid holder(s) already ({}{}); {kind} admits no more",
                e.worker,
                e.op,
                e.t,
                active.len(),
                others.join(", "),
                if active.len() > 4 { ", ..." } else { "" },
            ));
        }
        active.insert(id, side);
    }
    found
}

/// Valid holds in the workers' logs (µs on the shared clock) that `kind`
/// does not admit together: two of a mutex, a writer with anyone, more
/// than a semaphore's permits.
pub(super) fn crowded_in_logs(kind: Kind, key: &str, ops: &[&Op]) -> Vec<String> {
    let holds: Vec<_> = ops
        .iter()
        .filter_map(|o| {
            let (start, end) = o.valid_hold()?;
            Some((start, end, o.side, o.worker, o.op))
        })
        .collect();
    crowded(kind, key, &holds, " µs")
}

/// The same in the store's serial order of `record`'s accesses, where a
/// hold spans its operation's first and last access (a writer's read and
/// write; a shared holder's entry and exit), for the operations that held
/// validly: no clock at all. Only for the kinds with shared holders (for a
/// mutex the write log's versions say as much).
pub(super) fn crowded_in_store(kind: Kind, key: &str, ops: &[&Op], record: &Record) -> Vec<String> {
    if !matches!(kind, Kind::Rw { .. } | Kind::Semaphore { .. }) {
        return Vec::new();
    }
    let valid: HashMap<(u32, u64), Side> = ops
        .iter()
        .filter(|o| o.valid_hold().is_some())
        .map(|o| ((o.worker, o.op), o.side))
        .collect();
    let mut spans: BTreeMap<(u32, u64), (u64, u64)> = BTreeMap::new();
    for a in &record.accesses {
        if valid.contains_key(&(a.worker, a.op)) {
            let span = spans.entry((a.worker, a.op)).or_insert((a.at, a.at));
            span.1 = a.at;
        }
    }
    let holds: Vec<_> = spans
        .iter()
        .map(|(&(worker, op), &(start, end))| {
            // Half-open: the hold ends just after its last access.
            (start, end + 1, valid[&(worker, op)], worker, op)
        })
        .collect();
    crowded(kind, key, &holds, " (store order)")
}

/// Shared reads that the store accepted between an exclusive read and the
/// write of the same read-modify-write, whatever the holders' leases: a
/// reader saw the record while a writer was changing it. Fencing must
/// prevent it (a reader newer than a stopped writer raises the highest
/// token, and the writer's write is refused); the run without fencing shows
/// that it does not without.
pub(super) fn reads_inside_writes(key: &str, record: &Record) -> Vec<String> {
    let mut read_at: HashMap<(u32, u64), u64> = HashMap::new();
    let mut shared: Vec<(u64, u32, u64, u64)> = Vec::new();
    let mut found = Vec::new();
    for a in &record.accesses {
        match a.kind {
            AccessKind::Read => {
                read_at.insert((a.worker, a.op), a.at);
            }
            AccessKind::Shared => shared.push((a.at, a.worker, a.op, a.fence)),
            AccessKind::Write => {
                let Some(&from) = read_at.get(&(a.worker, a.op)) else {
                    continue;
                };
                // `shared` is in store order: the reads after `from`.
                let first = shared.partition_point(|s| s.0 <= from);
                for &(at, worker, op, fence) in &shared[first..] {
                    found.push(format!(
                        "{key}: worker {worker} op {op} (token {fence}) read at {at} (store order) inside worker {} op {}'s read-modify-write ({from} to {}, token {})",
                        a.worker, a.op, a.at, a.fence
                    ));
                }
            }
            AccessKind::Exit => {}
        }
    }
    found
}

/// `hold_at_least`: a key acquired again sooner than `min_ms` (less
/// `slack_us`) after an acquisition whose holder released it `Ok` (a holder
/// that lost its lease, or died, lets the key go when the lease ends, as it
/// should).
///
/// The client sets the key to be kept until `min_ms` after the acquire's
/// answer arrived, which is before the holder logged `acquired`; the next
/// holder logs after its server took the key. So consecutive logged
/// acquisitions are at least `min_ms` apart, less the time between the
/// answer's arrival and the log line (microseconds, unless the holder's
/// process was preempted just then): `slack_us`.
pub(super) fn held_too_briefly(min_ms: u64, slack_us: u64, key: &str, ops: &[&Op]) -> Vec<String> {
    let mut acquired: Vec<(u64, &Op)> = ops
        .iter()
        .filter_map(|o| Some((o.acquired?.1, *o)))
        .collect();
    acquired.sort_unstable_by_key(|(t, o)| (*t, o.worker, o.op));
    let mut found = Vec::new();
    for pair in acquired.windows(2) {
        let ((t0, first), (t1, next)) = (pair[0], pair[1]);
        if first.valid_hold().is_none() {
            continue;
        }
        if t1 - t0 + slack_us < min_ms * 1000 {
            found.push(format!(
                "{key}: worker {} op {} acquired at {t1} µs, {} ms after worker {} op {} (hold_at_least {min_ms} ms, released Ok)",
                next.worker,
                next.op,
                ms(t1 - t0),
                first.worker,
                first.op
            ));
        }
    }
    found
}

/// The first moment from `from` at which `kind`'s holders other than the
/// process `victim` fill what the victim's hold kept out: for a semaphore,
/// every permit held by others at once (so the victim's came back); else the
/// first acquisition by another process that conflicts with `side` (a
/// reader stopped: the next writer). `None`: never.
pub(super) fn taken_over(
    kind: Kind,
    ops: &[&Op],
    victim: u32,
    side: Side,
    from: u64,
) -> Option<u64> {
    let others = ops
        .iter()
        .filter(|o| o.process != victim && kind.conflicts(side, o.side));
    let Kind::Semaphore { permits } = kind else {
        return others
            .filter_map(|o| o.acquired.map(|(_, t)| t))
            .filter(|&t| t >= from)
            .min();
    };
    // Holds of others as their holders knew them (to the release sent;
    // never ended if not), as edges; the first start at or after `from`
    // that makes `permits`.
    let mut edges: Vec<(u64, i64)> = Vec::new();
    for o in others {
        let Some((_, start)) = o.acquired else {
            continue;
        };
        let end = o.release_sent.unwrap_or(u64::MAX);
        edges.push((start, 1));
        edges.push((end.max(start), -1));
    }
    edges.sort_unstable();
    let mut held = 0i64;
    for (t, delta) in edges {
        held += delta;
        if delta > 0 && t >= from && held >= i64::from(permits) {
            return Some(t);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::ReleaseOutcome;
    use crate::store::Access;

    /// Worker `worker`'s operation on `k`, held (as its holder knew) from
    /// `from` to `to` ms, released as `outcome`.
    fn hold(worker: u32, side: Side, from: u64, to: u64, outcome: ReleaseOutcome) -> Op {
        Op {
            worker,
            process: worker,
            op: 1,
            key: "k".into(),
            side,
            attempt: from * 1000,
            acquired: Some((u64::from(worker) + 1, from * 1000)),
            release_sent: Some(to * 1000),
            released: Some((outcome, to * 1000 + 1)),
            ..Op::default()
        }
    }

    fn ok(worker: u32, side: Side, from: u64, to: u64) -> Op {
        hold(worker, side, from, to, ReleaseOutcome::Ok)
    }

    fn crowded_holds(kind: Kind, ops: &[Op]) -> usize {
        let ops: Vec<&Op> = ops.iter().collect();
        crowded_in_logs(kind, "k", &ops).len()
    }

    #[test]
    fn readers_share_and_a_writer_holds_alone() {
        let rw = Kind::Rw {
            reads_per_mille: 700,
        };
        let readers = [ok(0, Side::Read, 0, 10), ok(1, Side::Read, 5, 15)];
        assert_eq!(crowded_holds(rw, &readers), 0);
        let mut with_writer = readers.to_vec();
        with_writer.push(ok(2, Side::Write, 12, 20));
        assert_eq!(crowded_holds(rw, &with_writer), 1);
        // One that starts as another ends does not overlap it.
        with_writer[2] = ok(2, Side::Write, 15, 20);
        assert_eq!(crowded_holds(rw, &with_writer), 0);
        // A writer stopped past its lease ("not owner") holds nothing valid.
        with_writer[2] = hold(2, Side::Write, 0, 20, ReleaseOutcome::Lost);
        assert_eq!(crowded_holds(rw, &with_writer), 0);
        // As a mutex, the two readers are one too many.
        assert_eq!(crowded_holds(Kind::Mutex, &readers), 1);
    }

    #[test]
    fn a_semaphore_admits_its_permits_and_no_more() {
        let three = |n: u64| Kind::Semaphore { permits: n as u32 };
        let holds: Vec<Op> = (0..4)
            .map(|w| ok(w, Side::Read, u64::from(w), 50))
            .collect();
        assert_eq!(crowded_holds(three(3), &holds[..3]), 0);
        assert_eq!(crowded_holds(three(3), &holds), 1);
        assert_eq!(crowded_holds(three(2), &holds[..3]), 1);
        // The fourth came in once the first's lease was gone (not owner).
        let mut late = holds.clone();
        late[0] = hold(0, Side::Read, 0, 50, ReleaseOutcome::Lost);
        assert_eq!(crowded_holds(three(3), &late), 0);
    }

    fn access(at: u64, kind: AccessKind, worker: u32) -> Access {
        Access {
            at,
            kind,
            fence: u64::from(worker),
            worker,
            op: 1,
        }
    }

    #[test]
    fn in_store_order_a_read_inside_a_read_modify_write_is_found() {
        use AccessKind::{Exit, Read, Shared, Write};
        let record = |accesses| Record {
            accesses,
            ..Record::default()
        };
        let inside = record(vec![
            access(1, Read, 0),
            access(2, Shared, 1),
            access(3, Write, 0),
            access(4, Exit, 1),
        ]);
        assert_eq!(reads_inside_writes("k", &inside).len(), 1);
        let before = record(vec![
            access(1, Shared, 1),
            access(2, Exit, 1),
            access(3, Read, 0),
            access(4, Write, 0),
            access(5, Shared, 2),
        ]);
        assert_eq!(reads_inside_writes("k", &before).len(), 0);
        // The same histories as holds in store order, both released Ok.
        let ops = [ok(0, Side::Write, 0, 10), ok(1, Side::Read, 0, 10)];
        let ops: Vec<&Op> = ops.iter().collect();
        let rw = Kind::Rw {
            reads_per_mille: 700,
        };
        assert_eq!(crowded_in_store(rw, "k", &ops, &inside).len(), 1);
        assert_eq!(crowded_in_store(rw, "k", &ops, &before).len(), 0);
    }

    #[test]
    fn hold_at_least_spaces_acquisitions_after_an_ok_release_only() {
        let a = ok(0, Side::Write, 0, 5);
        let spaced = [a.clone(), ok(1, Side::Write, 50, 55)];
        let close = [a.clone(), ok(1, Side::Write, 30, 35)];
        let brief = |ops: &[Op]| {
            let ops: Vec<&Op> = ops.iter().collect();
            held_too_briefly(50, 1000, "k", &ops).len()
        };
        assert_eq!(brief(&spaced), 0);
        assert_eq!(brief(&close), 1);
        // Within the slack.
        assert_eq!(brief(&[a, ok(1, Side::Write, 49, 55)]), 0);
        // A holder that lost its lease lets the key go when it ends.
        let lost = [
            hold(0, Side::Write, 0, 5, ReleaseOutcome::Lost),
            ok(1, Side::Write, 30, 35),
        ];
        assert_eq!(brief(&lost), 0);
    }

    #[test]
    fn a_stopped_permit_holder_is_taken_over_when_every_permit_is_held_by_others() {
        let sem = Kind::Semaphore { permits: 2 };
        // The victim (0) is struck at 10 ms; 1 holds from 5 ms, 2 from 30.
        let ops = [
            hold(0, Side::Read, 0, 900, ReleaseOutcome::Lost),
            ok(1, Side::Read, 5, 100),
            ok(2, Side::Read, 30, 100),
        ];
        let ops: Vec<&Op> = ops.iter().collect();
        assert_eq!(taken_over(sem, &ops, 0, Side::Read, 10_000), Some(30_000));
        // A stopped reader is taken over by the next writer only.
        let rw = Kind::Rw {
            reads_per_mille: 700,
        };
        let ops = [ok(1, Side::Read, 5, 100), ok(2, Side::Write, 600, 700)];
        let ops: Vec<&Op> = ops.iter().collect();
        assert_eq!(taken_over(rw, &ops, 0, Side::Read, 10_000), Some(600_000));
    }
}
