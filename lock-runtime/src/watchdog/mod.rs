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

use std::collections::{BTreeSet, HashMap};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::Notify;
use tokio::time::{Instant, sleep_until, timeout_at};

use crate::LockError;
use crate::backend::{Backend, RENEW_BATCH};
use crate::held::Held;

/// A handle on the scheduler; the task ends when this is dropped.
///
/// Watching and unwatching only touch shared state under a mutex: taking and
/// releasing a lock costs no message and no wake-up of the scheduler, unless
/// the new lease is due before everything it already sleeps on.
#[derive(Debug)]
pub(crate) struct Watchdog {
    shared: Arc<Shared>,
    live: AtomicUsize,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    wake: Notify,
    closed: AtomicBool,
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<u64, Entry>,
    timers: BTreeSet<(Instant, u64)>,
    /// When the scheduler will wake up by itself, if it sleeps.
    sleeping_until: Option<Instant>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Watchdog {
    pub(crate) fn start(backend: Backend) -> Self {
        let shared = Arc::new(Shared::default());
        tokio::spawn(run(backend, shared.clone()));
        Self {
            shared,
            live: AtomicUsize::new(0),
        }
    }

    /// Watches `held`, whose lease of `granted` was set by a request sent at
    /// `sent`; renewals re-arm it to `ttl` (or, with `renew == false`, it is
    /// lost when `granted` runs out). `drift` is held back from every lease.
    pub(crate) fn watch(
        &self,
        held: Arc<Held>,
        ttl: Duration,
        renew: bool,
        sent: Instant,
        granted: Duration,
        drift: Duration,
    ) {
        self.live.fetch_add(1, Ordering::Relaxed);
        let valid_until = sent + granted.saturating_sub(drift);
        held.set_valid_until(valid_until);
        let due = if renew {
            sent + granted / 3
        } else {
            valid_until
        };
        let id = held.id;
        let wake = {
            let mut state = self.shared.state();
            state.timers.insert((due, id));
            state.entries.insert(
                id,
                Entry {
                    held,
                    ttl,
                    drift,
                    renew,
                    valid_until,
                    due,
                    busy: false,
                },
            );
            state.sleeping_until.is_none_or(|at| due < at)
        };
        if wake {
            self.shared.wake.notify_one();
        }
    }

    /// Stops watching lock `id` (released or dropped).
    pub(crate) fn unwatch(&self, id: u64) {
        self.live.fetch_sub(1, Ordering::Relaxed);
        let mut state = self.shared.state();
        if let Some(entry) = state.entries.remove(&id)
            && !entry.busy
        {
            state.timers.remove(&(entry.due, id));
        }
    }

    /// Locks under watch.
    pub(crate) fn live(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
        self.shared.wake.notify_one();
    }
}

#[derive(Debug)]
struct Entry {
    held: Arc<Held>,
    ttl: Duration,
    /// Held back from each lease for clock drift between servers (Redlock).
    drift: Duration,
    renew: bool,
    valid_until: Instant,
    due: Instant,
    /// A renewal call for it is in flight (it has no timer meanwhile).
    busy: bool,
}

type Batch = Vec<(u64, Arc<Held>, Duration, Instant)>;

type Call = Pin<
    Box<
        dyn std::future::Future<Output = (Vec<u64>, Instant, Option<Result<Vec<bool>, LockError>>)>
            + Send,
    >,
>;

async fn run(backend: Backend, shared: Arc<Shared>) {
    let mut calls: FuturesUnordered<Call> = FuturesUnordered::new();
    loop {
        if shared.closed.load(Ordering::Acquire) {
            return;
        }
        let next = {
            let mut state = shared.state();
            let next = state.timers.first().map(|(due, _)| *due);
            state.sleeping_until = next;
            next
        };
        tokio::select! {
            _ = shared.wake.notified() => {}
            _ = sleep_until(next.unwrap_or_else(Instant::now)), if next.is_some() => {
                let batch = take_due(&mut shared.state(), Instant::now());
                for chunk in batch.chunks(RENEW_BATCH) {
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
fn take_due(state: &mut State, now: Instant) -> Batch {
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
        if entry.renew && due <= now + entry.ttl / 6 {
            state.timers.remove(&(due, id));
            if now >= entry.valid_until {
                lose(
                    &entry.held,
                    "no renewal was confirmed before the lease may have run out",
                );
                state.entries.remove(&id);
                continue;
            }
            entry.busy = true;
            batch.push((id, entry.held.clone(), entry.ttl, entry.valid_until));
        } else if !entry.renew && due <= now {
            state.timers.remove(&(due, id));
            lose(&entry.held, "the fixed lease (renew = false) ran out");
            state.entries.remove(&id);
        }
    }
    // Top a partial last call up with leases due soon after (up to one
    // period early), so calls carry full batches.
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
                batch.push((id, entry.held.clone(), entry.ttl, entry.valid_until));
            }
        }
    }
    batch
}

/// Applies the answer of one renewal call.
fn settle(
    state: &mut State,
    ids: Vec<u64>,
    sent: Instant,
    answer: Option<Result<Vec<bool>, LockError>>,
) {
    let now = Instant::now();
    let answers: Vec<Option<bool>> = match &answer {
        Some(Ok(extended)) => extended.iter().map(|e| Some(*e)).collect(),
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
                entry.held.set_valid_until(entry.valid_until);
                entry.due = sent + entry.ttl / 3;
                tracing::trace!(key = %entry.held.key, "lease renewed");
            }
            Some(false) => {
                lose(&entry.held, "the server says the lock is not ours any more");
                state.entries.remove(&id);
                continue;
            }
            None if now >= entry.valid_until => {
                lose(
                    &entry.held,
                    "no renewal was confirmed before the lease may have run out",
                );
                state.entries.remove(&id);
                continue;
            }
            None => {
                let retry = (entry.ttl / 30).max(Duration::from_millis(5));
                entry.due = (now + retry).min(entry.valid_until);
            }
        }
        let due = entry.due;
        state.timers.insert((due, id));
    }
}

/// One batched renewal, bounded by the earliest validity in the batch.
fn renew_call(backend: Backend, batch: Batch) -> Call {
    Box::pin(async move {
        let deadline = batch
            .iter()
            .map(|(_, _, _, valid_until)| *valid_until)
            .min()
            .unwrap_or_else(Instant::now);
        let sent = Instant::now();
        let leases: Vec<_> = batch
            .iter()
            .map(|(_, held, ttl, _)| (&held.names, &held.token, *ttl))
            .collect();
        let answer = timeout_at(deadline, backend.extend_many(&leases))
            .await
            .ok();
        let answer = match answer {
            Some(Ok(extended)) if extended.len() != batch.len() => Some(Err(LockError::Backend(
                crate::BackendError::new("batched extend returned a wrong number of answers"),
            ))),
            other => other,
        };
        (batch.iter().map(|(id, ..)| *id).collect(), sent, answer)
    })
}

fn lose(held: &Held, why: &str) {
    tracing::warn!(key = %held.key, fencing = held.fencing, "lock lost: {why}");
    held.lost.cancel();
}

#[cfg(test)]
mod tests;
