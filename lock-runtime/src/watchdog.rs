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
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep_until, timeout_at};

use crate::LockError;
use crate::backend::{Backend, RENEW_BATCH};
use crate::guard::Held;

/// A handle on the scheduler; the task ends when this is dropped.
#[derive(Debug)]
pub(crate) struct Watchdog {
    tx: mpsc::UnboundedSender<Msg>,
    live: AtomicUsize,
}

enum Msg {
    Watch {
        held: Arc<Held>,
        ttl: Duration,
        renew: bool,
        sent: Instant,
        granted: Duration,
    },
    Unwatch(u64),
}

impl Watchdog {
    pub(crate) fn start(backend: Backend) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(backend, rx));
        Self {
            tx,
            live: AtomicUsize::new(0),
        }
    }

    /// Watches `held`, whose lease of `granted` was set by a request sent at
    /// `sent`; renewals re-arm it to `ttl` (or, with `renew == false`, it is
    /// lost when `granted` runs out).
    pub(crate) fn watch(
        &self,
        held: Arc<Held>,
        ttl: Duration,
        renew: bool,
        sent: Instant,
        granted: Duration,
    ) {
        self.live.fetch_add(1, Ordering::Relaxed);
        let _ = self.tx.send(Msg::Watch {
            held,
            ttl,
            renew,
            sent,
            granted,
        });
    }

    /// Stops watching lock `id` (released or dropped).
    pub(crate) fn unwatch(&self, id: u64) {
        self.live.fetch_sub(1, Ordering::Relaxed);
        let _ = self.tx.send(Msg::Unwatch(id));
    }

    /// Locks under watch.
    pub(crate) fn live(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }
}

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

type Call = Pin<
    Box<
        dyn std::future::Future<Output = (Vec<u64>, Instant, Option<Result<Vec<bool>, LockError>>)>
            + Send,
    >,
>;

async fn run(backend: Backend, mut rx: mpsc::UnboundedReceiver<Msg>) {
    let mut entries: HashMap<u64, Entry> = HashMap::new();
    let mut timers: BTreeSet<(Instant, u64)> = BTreeSet::new();
    let mut calls: FuturesUnordered<Call> = FuturesUnordered::new();
    loop {
        let next = timers.first().map(|(due, _)| *due);
        tokio::select! {
            msg = rx.recv() => match msg {
                // The client is gone, and with it every guard (guards keep
                // their client alive).
                None => return,
                Some(Msg::Watch { held, ttl, renew, sent, granted }) => {
                    let drift = backend.drift(ttl);
                    let valid_until = sent + granted.saturating_sub(drift);
                    let due = if renew { sent + granted / 3 } else { valid_until };
                    timers.insert((due, held.id));
                    entries.insert(held.id, Entry { held, ttl, drift, renew, valid_until, due, busy: false });
                }
                Some(Msg::Unwatch(id)) => {
                    if let Some(entry) = entries.remove(&id)
                        && !entry.busy
                    {
                        timers.remove(&(entry.due, id));
                    }
                }
            },
            _ = sleep_until(next.unwrap_or_else(Instant::now)), if next.is_some() => {
                let now = Instant::now();
                let mut batch: Vec<(u64, Arc<Held>, Duration, Instant)> = Vec::new();
                // Renewing early by up to min(ttl / 6, 1 min) lets calls fill up.
                let horizon = now + Duration::from_secs(60);
                let candidates: Vec<(Instant, u64)> =
                    timers.range(..(horizon, u64::MAX)).copied().collect();
                for (due, id) in candidates {
                    let Some(entry) = entries.get_mut(&id) else {
                        timers.remove(&(due, id));
                        continue;
                    };
                    if entry.renew && due <= now + entry.ttl / 6 {
                        timers.remove(&(due, id));
                        if now >= entry.valid_until {
                            lose(&entry.held, "no renewal was confirmed before the lease may have run out");
                            entries.remove(&id);
                            continue;
                        }
                        entry.busy = true;
                        batch.push((id, entry.held.clone(), entry.ttl, entry.valid_until));
                    } else if !entry.renew && due <= now {
                        timers.remove(&(due, id));
                        lose(&entry.held, "the fixed lease (renew = false) ran out");
                        entries.remove(&id);
                    }
                }
                // Top a partial last call up with leases due soon after (up to
                // one period early), so calls carry full batches.
                if !batch.is_empty() && !batch.len().is_multiple_of(RENEW_BATCH) {
                    let missing = RENEW_BATCH - batch.len() % RENEW_BATCH;
                    let extra: Vec<(Instant, u64)> = timers
                        .iter()
                        .filter(|(due, id)| {
                            entries
                                .get(id)
                                .is_some_and(|e| e.renew && *due <= now + e.ttl / 3 && now < e.valid_until)
                        })
                        .take(missing)
                        .copied()
                        .collect();
                    for (due, id) in extra {
                        timers.remove(&(due, id));
                        if let Some(entry) = entries.get_mut(&id) {
                            entry.busy = true;
                            batch.push((id, entry.held.clone(), entry.ttl, entry.valid_until));
                        }
                    }
                }
                for chunk in batch.chunks(RENEW_BATCH) {
                    calls.push(renew_call(backend.clone(), chunk.to_vec()));
                }
            }
            Some((ids, sent, answer)) = calls.next(), if !calls.is_empty() => {
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
                    let Some(entry) = entries.get_mut(&id) else { continue };
                    entry.busy = false;
                    match extended {
                        Some(true) => {
                            entry.valid_until = sent + entry.ttl.saturating_sub(entry.drift);
                            entry.due = sent + entry.ttl / 3;
                            tracing::trace!(key = %entry.held.key, "lease renewed");
                        }
                        Some(false) => {
                            lose(&entry.held, "the server says the lock is not ours any more");
                            entries.remove(&id);
                            continue;
                        }
                        None if now >= entry.valid_until => {
                            lose(&entry.held, "no renewal was confirmed before the lease may have run out");
                            entries.remove(&id);
                            continue;
                        }
                        None => {
                            let retry = (entry.ttl / 30).max(Duration::from_millis(5));
                            entry.due = (now + retry).min(entry.valid_until);
                        }
                    }
                    timers.insert((entry.due, id));
                }
            }
        }
    }
}

/// One batched renewal, bounded by the earliest validity in the batch.
fn renew_call(backend: Backend, batch: Vec<(u64, Arc<Held>, Duration, Instant)>) -> Call {
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
