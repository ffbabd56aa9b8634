//! The operations, rebuilt from the workers' logs: one per key of each
//! operation, with what its worker logged of it, and who died when.

use std::collections::HashMap;

use super::{Op, Report, RunData, flag};
use crate::kind::{Kind, Side};
use crate::log::{Event, Fault, WriteOutcome};

/// The operations rebuilt from the workers' logs (one per key of each
/// operation), and who died when.
pub(super) struct Rebuilt {
    pub(super) ops: Vec<Op>,
    /// Each logical worker's last event.
    pub(super) end_of_log: HashMap<u32, u64>,
    /// Each logical worker's process (faults name processes).
    pub(super) process_of: HashMap<u32, u32>,
    /// Killed processes, and when.
    pub(super) killed: HashMap<u32, u64>,
}

impl Rebuilt {
    pub(super) fn process(&self, worker: u32) -> u32 {
        self.process_of.get(&worker).copied().unwrap_or(worker)
    }
}

/// Rebuilds the operations; counts what the logs say of each (acquired,
/// errors, cancellations) and flags waiters that never got the lock and
/// cancelled acquires that left a lease renewed.
pub(super) fn rebuild(run: &RunData, r: &mut Report, examples: &mut Vec<String>) -> Rebuilt {
    // Rebuild operations. Faults name processes, logs logical workers.
    let process_of: HashMap<u32, u32> = run.workers.iter().map(|w| (w.id, w.process)).collect();
    let killed: HashMap<u32, u64> = run
        .faults
        .iter()
        .filter_map(|f| match f {
            Fault::KillWorker { worker, t } => Some((*worker, *t)),
            _ => None,
        })
        .collect();
    let mut ops: Vec<Op> = Vec::new();
    let mut end_of_log: HashMap<u32, u64> = HashMap::new();
    // A semaphore's holders share; a read-write lock's say which side.
    let default_side = match run.kind {
        Kind::Semaphore { .. } => Side::Read,
        _ => Side::Write,
    };
    for w in &run.workers {
        // Each operation's parts (one per key) in `ops`.
        let mut current: HashMap<u64, Vec<usize>> = HashMap::new();
        for e in &w.events {
            end_of_log.insert(w.id, e.t());
            let parts = |op: &u64| current.get(op).cloned().unwrap_or_default();
            // The part of `op` on `key` (none: its first).
            let part = |op: &u64, key: &Option<String>| {
                let parts = current.get(op)?;
                match key {
                    None => parts.first().copied(),
                    Some(k) => parts.iter().copied().find(|&i| ops[i].key == *k),
                }
            };
            match e {
                Event::Attempt {
                    op,
                    key,
                    more_keys,
                    side,
                    t,
                } => {
                    r.operations += 1;
                    let keys = std::iter::once(key).chain(more_keys);
                    let first = ops.len();
                    for (part, key) in keys.enumerate() {
                        ops.push(Op {
                            worker: w.id,
                            process: w.process,
                            op: *op,
                            key: key.clone(),
                            part,
                            side: side.unwrap_or(default_side),
                            attempt: *t,
                            ..Op::default()
                        });
                    }
                    current.insert(*op, (first..ops.len()).collect());
                }
                Event::AcquireError { .. } => r.acquire_errors += 1,
                Event::Acquired {
                    op,
                    fence,
                    more_fences,
                    t,
                } => {
                    let fences = std::iter::once(fence).chain(more_fences);
                    let parts = parts(op);
                    for (&i, fence) in parts.iter().zip(fences) {
                        ops[i].acquired = Some((*fence, *t));
                    }
                    if !parts.is_empty() {
                        r.acquired += 1;
                    }
                }
                // A token asked for after the grant: the hold began at
                // the grant, with this token.
                Event::Token {
                    op, fence, sent, ..
                } => {
                    if let Some(i) = part(op, &None) {
                        if let Some((f, _)) = &mut ops[i].acquired {
                            *f = *fence;
                        }
                        ops[i].token_sent = Some(*sent);
                    }
                }
                Event::TokenRefused {
                    op, lost, sent, t, ..
                } => {
                    if let Some(i) = part(op, &None) {
                        ops[i].token_sent = Some(*sent);
                        ops[i].token_refused = Some((*lost, *t));
                    }
                }
                Event::GaveUp { op, error, t } => {
                    let parts = parts(op);
                    for &i in &parts {
                        ops[i].gave_up = Some(*t);
                    }
                    if !parts.is_empty() {
                        flag(
                            &mut r.violations.waiters_never_acquired,
                            examples,
                            format!("worker {} op {op} never got the lock: {error}", w.id),
                        );
                    }
                }
                Event::Cancelled { op, watched, t } => {
                    let parts = parts(op);
                    for &i in &parts {
                        ops[i].cancelled = Some(*watched);
                        ops[i].cancelled_at = Some(*t);
                    }
                    if !parts.is_empty() {
                        r.cancelled += 1;
                        if *watched > 0 {
                            flag(
                                &mut r.violations.leaked_watchdogs,
                                examples,
                                format!(
                                    "worker {} op {op}: a cancelled acquire left {watched} lease(s) renewed",
                                    w.id
                                ),
                            );
                        }
                    }
                }
                Event::Read {
                    op,
                    key,
                    ok: true,
                    t,
                    ..
                } => {
                    if let Some(i) = part(op, key) {
                        ops[i].read = Some(*t);
                    }
                }
                Event::Write {
                    op,
                    key,
                    outcome,
                    seq,
                    sent,
                    t,
                    ..
                } => {
                    if let Some(i) = part(op, key) {
                        ops[i].write = Some((*outcome, *seq, *sent));
                        if *outcome == WriteOutcome::Accepted {
                            ops[i].written = Some(*t);
                        }
                    }
                }
                Event::Blocked {
                    op,
                    ms,
                    lost_after_ms,
                    t,
                    ..
                } => {
                    if let Some(i) = part(op, &None) {
                        ops[i].blocked = Some((*ms, *t, *lost_after_ms));
                    }
                }
                Event::ReleaseSent { op, t } => {
                    for i in parts(op) {
                        ops[i].release_sent = Some(*t);
                    }
                }
                Event::Released { op, outcome, t } => {
                    for i in parts(op) {
                        ops[i].released = Some((*outcome, *t));
                    }
                }
                // A try-once acquire found the key busy: its wait is over.
                Event::TryOnce {
                    op,
                    granted: false,
                    t,
                } => {
                    for i in parts(op) {
                        ops[i].gave_up = Some(*t);
                    }
                }
                Event::Start { .. }
                | Event::Read { ok: false, .. }
                | Event::Queued { .. }
                | Event::Left { .. }
                | Event::Lapsed { .. }
                | Event::QueueMismatch { .. }
                | Event::TryOnce { granted: true, .. }
                | Event::Done { .. } => {}
            }
        }
    }
    Rebuilt {
        ops,
        end_of_log,
        process_of,
        killed,
    }
}
