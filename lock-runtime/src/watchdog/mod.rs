//! Keeps leases alive and says when one is lost: one scheduler task per client.
//!
//! Every held lock (per guard, not per task) is an entry with a due time; the
//! scheduler wakes at the earliest one, takes every entry due within a sixth of
//! its lease (renewing a little early is harmless), and renews them up to
//! [`RENEW_BATCH`] per script call. So 10,000 locks taken together cost about
//! 100 calls per renewal period, not 10,000 timers and calls.
//!
//! Validity is measured on the monotonic clock from the *send* time of the last
//! confirmed acquire or extension: the server set its expiry no earlier than
//! that, so `sent + lease` is a safe lower bound on when the lease ends. If no
//! extension is confirmed by then, or the server answers "not owner", the lease
//! is lost: the guard's `lost()` resolves and a warning is logged.
//!
//! The leases of in-flight idempotency records (`IdempotencyLayer`) ride the
//! same schedule, renewed by a batched records script (one call per server,
//! per slot on a cluster). They keep one difference: nothing may act on a
//! record's lease that could have run out (no guard reads it), so an
//! unconfirmed renewal of a record is retried until the server answers
//! (a renewal whose reply was lost may have re-armed it), and only the
//! server's "not ours" ends it early; the record's request stops it when
//! its record is completed or released, or when the request is dropped.

use std::collections::{BTreeSet, HashMap};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::Notify;
use tokio::time::{Instant, sleep_until, timeout_at};

use crate::backend::{Backend, RENEW_BATCH};
use crate::error::LockError;
use crate::held::Held;

mod lease;
mod restart;

#[cfg(feature = "idempotency")]
pub(crate) use lease::RecordLease;
use lease::{Lease, renew};

/// How long the scheduler sleeps with nothing under watch.
const IDLE_LOOK: Duration = Duration::from_secs(1);

/// A handle on the scheduler; the task ends when this is dropped.
///
/// Watching and unwatching only touch shared state under a mutex: taking and
/// releasing a lock costs no message and no wake-up of the scheduler, unless
/// the new lease is due before everything it already sleeps on.
#[derive(Debug)]
pub(crate) struct Watchdog {
    shared: Arc<Scheduler>,
    /// To restart the scheduler with, if its task ends with its runtime.
    backend: Backend,
}

#[derive(Debug, Default)]
struct Scheduler {
    state: Mutex<Leases>,
    wake: Notify,
    closed: AtomicBool,
    /// `true` while the scheduler task exists: its future clears it when
    /// dropped, which is how a task that ended with its runtime is noticed.
    running: AtomicBool,
}

#[derive(Debug, Default)]
struct Leases {
    /// By the lease's id: a number the client counts up, never a caller's
    /// input, so a fast hash serves (no crafted collisions to fear).
    entries: HashMap<u64, WatchedLease, foldhash::fast::RandomState>,
    timers: BTreeSet<(Instant, u64)>,
    /// When the scheduler will wake up by itself, if it sleeps.
    sleeping_until: Option<Instant>,
    /// Locks and idempotency records watched and not yet unwatched (also
    /// those given up for lost): counted here, under the lock their
    /// entries take anyway.
    locks: usize,
    records: usize,
}

impl Scheduler {
    fn state(&self) -> MutexGuard<'_, Leases> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Watchdog {
    pub(crate) fn start(backend: Backend) -> Self {
        let shared = Arc::new(Scheduler::default());
        shared.running.store(true, Ordering::Release);
        tokio::spawn(run(
            backend.clone(),
            restart::SchedulerAlive(shared.clone()),
        ));
        Self { shared, backend }
    }

    /// Watches `held`, whose lease of `granted` was set by a request sent at
    /// `sent`; renewals re-arm it to its lease, `held.ttl` (or, with
    /// `renew == false`, it is lost when `granted` runs out). The backend's
    /// clock drift allowance is held back from every lease.
    pub(crate) fn watch(&self, held: Arc<Held>, renew: bool, sent: Instant, granted: Duration) {
        let (id, ttl) = (held.id, held.ttl);
        self.watch_lease(id, Lease::Lock(held), ttl, renew, sent, granted);
    }

    /// Watches the idempotency record `lease` (under id `id`, unique among
    /// this client's leases), claimed for `ttl` by a request sent at `sent`,
    /// as [`Watchdog::watch`] a lock renewed to `ttl`, until
    /// [`Watchdog::unwatch_record`].
    #[cfg(feature = "idempotency")]
    pub(crate) fn watch_record(
        &self,
        id: u64,
        lease: Arc<RecordLease>,
        ttl: Duration,
        sent: Instant,
    ) {
        // A record's claim does not go through an acquire, which restarts the
        // scheduler if its runtime ended: do that here (a cheap check).
        if let Err(e) = self.restart_if_ended() {
            tracing::warn!(
                error = &e as &dyn std::error::Error,
                "idempotency record not renewed"
            );
        }
        self.watch_lease(id, Lease::Record(lease), ttl, true, sent, ttl);
    }

    /// What [`Watchdog::watch`] says, for a lease of either kind.
    fn watch_lease(
        &self,
        id: u64,
        lease: Lease,
        ttl: Duration,
        renew: bool,
        sent: Instant,
        granted: Duration,
    ) {
        let drift = self.backend.drift(ttl);
        let valid_until = sent + granted.saturating_sub(drift);
        lease.set_valid_until(valid_until);
        let due = if renew {
            sent + granted / 3
        } else {
            valid_until
        };
        self.insert(
            id,
            WatchedLease {
                lease,
                ttl,
                drift,
                renew,
                valid_until,
                due,
                busy: false,
            },
        );
    }

    fn insert(&self, id: u64, entry: WatchedLease) {
        let due = entry.due;
        let wake = {
            let mut state = self.shared.state();
            match entry.lease {
                Lease::Lock(_) => state.locks += 1,
                #[cfg(feature = "idempotency")]
                Lease::Record(_) => state.records += 1,
            }
            state.timers.insert((due, id));
            state.entries.insert(id, entry);
            state.sleeping_until.is_none_or(|at| due < at)
        };
        if wake {
            self.shared.wake.notify_one();
        }
    }

    /// Puts `next` in the place of the lock under watch as `next.id` (the
    /// same lease, handed to another holder of this client): renewals and
    /// their answers, even one in flight, now speak of `next`, which starts
    /// with the validity already confirmed. `false` when that lease is no
    /// longer under watch (lost).
    pub(crate) fn hand_on(&self, next: Arc<Held>) -> bool {
        let mut state = self.shared.state();
        let Some(entry) = state.entries.get_mut(&next.id) else {
            return false;
        };
        next.set_valid_until(entry.valid_until);
        entry.lease = Lease::Lock(next);
        true
    }

    /// Stops watching lock `id` (released or dropped).
    pub(crate) fn unwatch(&self, id: u64) {
        let mut state = self.remove(id);
        debug_assert!(state.locks > 0, "a lock unwatched more often than watched");
        state.locks = state.locks.saturating_sub(1);
    }

    /// Stops watching record `id` (completed, released, or its request
    /// dropped).
    #[cfg(feature = "idempotency")]
    pub(crate) fn unwatch_record(&self, id: u64) {
        let mut state = self.remove(id);
        debug_assert!(
            state.records > 0,
            "a record unwatched more often than watched"
        );
        state.records = state.records.saturating_sub(1);
    }

    /// Removes `id`'s entry and timer (if the scheduler has not already);
    /// the state, still locked.
    fn remove(&self, id: u64) -> MutexGuard<'_, Leases> {
        let mut state = self.shared.state();
        if let Some(entry) = state.entries.remove(&id)
            && !entry.busy
        {
            state.timers.remove(&(entry.due, id));
        }
        state
    }

    /// Every lock under watch (a client shutting down gives them back).
    pub(crate) fn locks(&self) -> Vec<Arc<Held>> {
        let state = self.shared.state();
        let locks = state
            .entries
            .values()
            .filter_map(|entry| entry.lease.lock());
        locks.cloned().collect()
    }

    /// Locks under watch.
    pub(crate) fn live(&self) -> usize {
        self.shared.state().locks
    }

    /// The fencing token of a guard of this client on the lock named
    /// `lock`, while it is not known lost (every guard is under watch,
    /// renewed or not): `Some(None)` for a guard whose token is not minted
    /// yet. A scan: for inspection, not the hot path.
    pub(crate) fn holding(&self, lock: &str) -> Option<Option<u64>> {
        let state = self.shared.state();
        state.entries.values().find_map(|entry| match &entry.lease {
            Lease::Lock(held) if held.names.lock == lock && !held.lost.is_cancelled() => {
                Some(held.fencing())
            }
            _ => None,
        })
    }

    /// Idempotency records under watch.
    #[cfg_attr(not(feature = "idempotency"), allow(dead_code))]
    pub(crate) fn live_records(&self) -> usize {
        self.shared.state().records
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
        self.shared.wake.notify_one();
    }
}

/// A lease under the watchdog: what it renews, how, and when next.
#[derive(Debug)]
struct WatchedLease {
    lease: Lease,
    ttl: Duration,
    /// Held back from each lease for clock drift between servers (Redlock).
    drift: Duration,
    renew: bool,
    valid_until: Instant,
    due: Instant,
    /// A renewal call for it is in flight (it has no timer meanwhile).
    busy: bool,
}

type Batch = Vec<(u64, Lease, Duration, Instant)>;

/// Per lease of a call: re-armed, not ours, or unknown (`None`); the whole
/// call: an error, or no answer in time (`None`).
type CallAnswer = Option<Result<Vec<Option<bool>>, LockError>>;

type Call = Pin<Box<dyn std::future::Future<Output = (Vec<u64>, Instant, CallAnswer)> + Send>>;

/// The scheduler. `running` is an argument, not a local: a task dropped
/// with its runtime before its first poll drops its arguments, not its
/// locals, and must clear the flag too.
async fn run(backend: Backend, running: restart::SchedulerAlive) {
    let shared = running.0.clone();
    let mut calls: FuturesUnordered<Call> = FuturesUnordered::new();
    loop {
        if shared.closed.load(Ordering::Acquire) {
            return;
        }
        let next = {
            let mut state = shared.state();
            // With nothing due, a look now and then: a lock taken meanwhile
            // whose first renewal is due later than that needs no wake-up
            // (with locks taken and released one after another, that was a
            // task switch per lock).
            let next = state
                .timers
                .first()
                .map_or_else(|| Instant::now() + IDLE_LOOK, |(due, _)| *due);
            state.sleeping_until = Some(next);
            next
        };
        tokio::select! {
            _ = shared.wake.notified() => {}
            _ = sleep_until(next) => {
                let batch = take_due(&mut shared.state(), Instant::now());
                // One kind per call: locks and records have scripts of their own.
                let (locks, records): (Batch, Batch) =
                    batch.into_iter().partition(|(_, lease, ..)| matches!(lease, Lease::Lock(_)));
                for chunk in locks.chunks(RENEW_BATCH).chain(records.chunks(RENEW_BATCH)) {
                    calls.push(renew_call(backend.clone(), chunk.to_vec()));
                }
            }
            Some((ids, sent, answer)) = calls.next(), if !calls.is_empty() => {
                settle(&mut shared.state(), ids, sent, answer);
            }
        }
    }
}

/// Takes every lease due now or soon (renewing a little early lets calls fill
/// up), and loses those that ran out.
fn take_due(state: &mut Leases, now: Instant) -> Batch {
    let mut batch: Batch = Vec::new();
    // Renewing early by up to min(ttl / 6, 1 min).
    let horizon = now + Duration::from_secs(60);
    let candidates: Vec<(Instant, u64)> =
        state.timers.range(..(horizon, u64::MAX)).copied().collect();
    for (due, id) in candidates {
        let Some(entry) = state.entries.get_mut(&id) else {
            state.timers.remove(&(due, id));
            continue;
        };
        if entry
            .lease
            .as_lock()
            .is_some_and(|held| held.lost.is_cancelled())
        {
            // Lost by its own deadline (or a release's answer) meanwhile.
            state.timers.remove(&(due, id));
            state.entries.remove(&id);
            continue;
        }
        if entry.renew && due <= now + entry.ttl / 6 {
            state.timers.remove(&(due, id));
            if now >= entry.valid_until && entry.lease.lost_at_validity_end() {
                entry
                    .lease
                    .lose("no renewal was confirmed before the lease may have run out");
                state.entries.remove(&id);
                continue;
            }
            entry.busy = true;
            batch.push((id, entry.lease.clone(), entry.ttl, entry.valid_until));
        } else if !entry.renew && due <= now {
            state.timers.remove(&(due, id));
            entry.lease.lose("the fixed lease (renew = false) ran out");
            state.entries.remove(&id);
        }
    }
    // Top a partial last call up with leases due soon after (up to one
    // period early), so calls carry full batches (counted over both kinds:
    // at worst a few leases are renewed a little earlier than needed).
    if !batch.is_empty() && !batch.len().is_multiple_of(RENEW_BATCH) {
        let missing = RENEW_BATCH - batch.len() % RENEW_BATCH;
        let extra: Vec<(Instant, u64)> = state
            .timers
            .iter()
            .filter(|(due, id)| {
                state
                    .entries
                    .get(id)
                    .is_some_and(|e| e.renew && *due <= now + e.ttl / 3 && now < e.valid_until)
            })
            .take(missing)
            .copied()
            .collect();
        for (due, id) in extra {
            state.timers.remove(&(due, id));
            if let Some(entry) = state.entries.get_mut(&id) {
                entry.busy = true;
                batch.push((id, entry.lease.clone(), entry.ttl, entry.valid_until));
            }
        }
    }
    batch
}

/// Applies the answer of one renewal call.
fn settle(state: &mut Leases, ids: Vec<u64>, sent: Instant, answer: CallAnswer) {
    let now = Instant::now();
    let answers: Vec<Option<bool>> = match answer {
        Some(Ok(extended)) => extended,
        Some(Err(e)) => {
            tracing::debug!(error = %e, locks = ids.len(), "lease renewal failed; retrying");
            vec![None; ids.len()]
        }
        None => vec![None; ids.len()],
    };
    for (id, extended) in ids.into_iter().zip(answers) {
        let Some(entry) = state.entries.get_mut(&id) else {
            continue; // released meanwhile
        };
        entry.busy = false;
        match extended {
            Some(true) => {
                entry.valid_until = sent + entry.ttl.saturating_sub(entry.drift);
                entry.lease.set_valid_until(entry.valid_until);
                entry.due = sent + entry.ttl / 3;
                match &entry.lease {
                    Lease::Lock(held) => tracing::trace!(key = %held.key, "lease renewed"),
                    #[cfg(feature = "idempotency")]
                    Lease::Record(r) => tracing::trace!(record = %r.record, "lease renewed"),
                }
            }
            Some(false) => {
                entry
                    .lease
                    .lose("the server says the lease is not ours any more");
                state.entries.remove(&id);
                continue;
            }
            None if now >= entry.valid_until && entry.lease.lost_at_validity_end() => {
                entry
                    .lease
                    .lose("no renewal was confirmed before the lease may have run out");
                state.entries.remove(&id);
                continue;
            }
            None => {
                let retry = now + crate::backoff::renewal_retry(entry.ttl);
                // Never past the validity while there is some left.
                entry.due = if now < entry.valid_until {
                    retry.min(entry.valid_until)
                } else {
                    retry
                };
            }
        }
        let due = entry.due;
        state.timers.insert((due, id));
    }
}

/// One batched renewal of one kind of lease, bounded by the earliest
/// validity in the batch (for records, which outlive their validity, by a
/// third of a lease at least).
fn renew_call(backend: Backend, batch: Batch) -> Call {
    Box::pin(async move {
        let sent = Instant::now();
        let deadline = batch
            .iter()
            .map(|(_, lease, ttl, valid_until)| {
                if lease.lost_at_validity_end() {
                    *valid_until
                } else {
                    (*valid_until).max(sent + *ttl / 3)
                }
            })
            .min()
            .unwrap_or(sent);
        let answer = timeout_at(deadline, renew(&backend, &batch)).await.ok();
        let answer = match answer {
            Some(Ok(extended)) if extended.len() != batch.len() => {
                Some(Err(LockError::Backend(crate::error::BackendError::new(
                    "batched renewal returned a wrong number of answers",
                ))))
            }
            other => other,
        };
        (batch.iter().map(|(id, ..)| *id).collect(), sent, answer)
    })
}

#[cfg(test)]
mod tests;
