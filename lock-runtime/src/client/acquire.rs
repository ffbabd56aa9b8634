//! The acquire algorithm, as named steps.
//!
//! ```text
//! start ─► attempt ─► acquired ─────────────────────────────► hold
//!            ▲   │
//!            │   └─► busy ─► queue (first time: register for notices)
//!            │                 │
//!            │                 ▼
//!            ├───────────── wait (a notice, the holder's lease, or the deadline ─► give up)
//!            │                 │
//!            │                 ▼ handed over by a release
//!            └── expired ◄─ confirm ─────────────────────────────► hold
//! ```
//!
//! An [`Attempt`] is the clean-up duty: until the lock is held or given up
//! cleanly, dropping it releases with our token in the background (leaving
//! the queue, and handing on a lock that was handed to us).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::handover::release_in_background;
use crate::LockError;
use crate::backend::{AcquireOutcome, Backend, HANDOFF_LEASE, WaitHandle};
use crate::backoff::Backoff;
use crate::guard::LockGuard;
use crate::held::Held;
use crate::inner::Inner;
use crate::key::{KeyNames, Shape};
use crate::token::Token;

/// A wait too long to represent (`Duration::MAX`): "wait forever".
pub(super) const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// How often one acquire re-tries after a broken connection (within its wait;
/// a try-once acquire re-tries once, at once).
const MAX_CONNECTION_RETRIES: u32 = 8;

/// Between those re-tries.
const RETRY_BACKOFF: Backoff = Backoff::new(Duration::from_millis(20), Duration::from_millis(160));

/// One acquire in progress.
pub(super) struct Acquisition {
    attempt: Attempt,
    renew: bool,
    /// `Duration::ZERO`: try once.
    wait: Duration,
    started: Instant,
    deadline: Instant,
    /// Registered for hand-overs and notices, once the key was found busy
    /// (or at once where registering costs nothing).
    waiter: Option<WaitHandle>,
    /// Send time of the last attempt that found the lock busy: a hand-over
    /// to us that is not stale (see `fence_seen`) happened after it.
    last_busy: Instant,
    /// The highest fencing counter a busy attempt saw. A hand-over whose
    /// token is at most this was sent before that attempt ran: its lease
    /// has ended and the key is someone else's (a waiter paused past the
    /// hand-over lease, found by the model checker), so it is ignored.
    fence_seen: u64,
    /// Connection retries so far, over the whole acquisition, and the pause
    /// before the next (the first retry goes at once).
    retries: u32,
    backoff: Backoff,
    /// The `name` label of this lock's metrics.
    metrics: crate::metrics::Name,
    /// `hold_at_least` (zero: none).
    hold_at_least: Duration,
    /// Redlock: since when a split vote is likelier our retry crossing a
    /// release on the masters than a contender's (the retry right after
    /// registering, or a free notice), and the brief pauses taken since.
    crossing: Option<(Instant, u32)>,
}

/// Redlock: within this long of a free notice (or of the retry after
/// registering), the first [`CROSSING_TRIES`] split votes with every master
/// answering pause briefly, [`CROSSING_PAUSE`] doubled each time (4, 8, 16,
/// 32 ms at most): a retry that crossed the release on the masters holds
/// once the release got there. Other splits pause up to a per-node timeout.
const CROSSING_WINDOW: Duration = Duration::from_millis(100);
const CROSSING_TRIES: u32 = 4;
const CROSSING_PAUSE: Duration = Duration::from_millis(4);

/// What one attempt found.
enum Attempted {
    Acquired { fencing: u64, sent: Instant },
    Busy { remaining: Duration },
}

/// How a wait ended.
enum Woken {
    /// A release handed the lock to us, with this fencing token.
    Granted(u64),
    /// The holder's lease ran out (or our hand-over was stale): try again.
    Retry,
    /// A notice said the key is free: try again.
    Freed,
    /// The deadline passed.
    TimedOut,
}

/// What the caller asked for, besides the key.
pub(super) struct Asked {
    pub(super) ttl: Duration,
    /// `Duration::ZERO`: try once.
    pub(super) wait: Duration,
    pub(super) renew: bool,
    pub(super) metrics: crate::metrics::Name,
    /// `hold_at_least` (zero: none).
    pub(super) hold_at_least: Duration,
    /// A mutex, a side of a read-write lock, a semaphore's permit, or a
    /// leadership.
    pub(super) shape: Shape,
    /// A leadership's label, written into its record; empty for locks.
    /// (Boxed: this struct travels in `try_embedded`'s error variant.)
    pub(super) label: Box<str>,
}

impl Acquisition {
    pub(super) async fn start(
        inner: Arc<Inner>,
        key: String,
        asked: Asked,
    ) -> Result<Self, LockError> {
        let mut names = KeyNames::shaped(&inner.prefix, &key, asked.shape);
        names.label = String::from(&*asked.label);
        let token = inner.token();
        let mut acquisition = Self::new(inner, key, names, token, asked);
        let attempt = &acquisition.attempt;
        let names = attempt.names.as_ref().expect("set until the end");
        if !acquisition.wait.is_zero() && attempt.inner.backend.notices_ready(names) {
            acquisition.waiter = Some(attempt.inner.backend.register(names, &attempt.token).await);
        }
        Ok(acquisition)
    }

    /// The embedded backend answers at once, so an uncontended acquire there
    /// is taken right here, without the boxed steps (their future is sized
    /// for the server backends' requests). `Err(key)`: go the usual way
    /// (another backend, or a busy key to wait for).
    pub(super) fn try_embedded(
        inner: &Arc<Inner>,
        key: String,
        asked: Asked,
    ) -> Result<Result<LockGuard, LockError>, (String, Asked)> {
        let Backend::Memory(memory) = &inner.backend else {
            return Err((key, asked));
        };
        let mut names = KeyNames::shaped(&inner.prefix, &key, asked.shape);
        names.label = String::from(&*asked.label);
        let token = inner.token();
        // Try once: a busy answer neither queues nor registers.
        match memory.acquire(&names, &token, asked.ttl, Duration::ZERO) {
            AcquireOutcome::Acquired { fencing } => {
                let sent = Instant::now();
                let ttl = asked.ttl;
                let acquisition = Self::new(inner.clone(), key, names, token, asked);
                Ok(Ok(acquisition.hold(fencing, sent, ttl, false)))
            }
            AcquireOutcome::Busy { remaining, .. } if asked.wait.is_zero() => {
                crate::metrics::busy(&asked.metrics, Duration::ZERO);
                Ok(Err(LockError::Busy {
                    key,
                    retry_after: remaining,
                }))
            }
            AcquireOutcome::Busy { .. } => Err((key, asked)),
        }
    }

    fn new(inner: Arc<Inner>, key: String, names: KeyNames, token: Token, asked: Asked) -> Self {
        let Asked {
            ttl,
            wait,
            renew,
            metrics,
            hold_at_least,
            shape: _,
            label: _,
        } = asked;
        let started = Instant::now();
        // A wait too long to represent (`Duration::MAX`) means "wait forever".
        let deadline = started
            .checked_add(wait)
            .unwrap_or_else(|| started + FOREVER);
        Self {
            attempt: Attempt {
                inner,
                key,
                names: Some(names),
                token,
                ttl,
                queued: !wait.is_zero(),
            },
            renew,
            wait,
            started,
            deadline,
            waiter: None,
            last_busy: started,
            fence_seen: 0,
            retries: 0,
            backoff: RETRY_BACKOFF,
            metrics,
            hold_at_least,
            crossing: None,
        }
    }

    /// Runs the steps until the lock is held or given up.
    pub(super) async fn finish(mut self) -> Result<LockGuard, LockError> {
        loop {
            let remaining = match self.attempt().await? {
                Attempted::Acquired { fencing, sent } => {
                    let ttl = self.attempt.ttl;
                    return Ok(self.hold(fencing, sent, ttl, false));
                }
                Attempted::Busy { remaining } => remaining,
            };
            if self.waiter.is_none() {
                if Instant::now() >= self.deadline {
                    return Err(self.give_up(remaining).await);
                }
                self.queue().await;
                self.crossing = Some((Instant::now(), 0));
                continue;
            }
            match self.wait_for_turn(remaining).await {
                Woken::Granted(fencing) => {
                    if let Some((sent, granted)) = self.confirm().await? {
                        return Ok(self.hold(fencing, sent, granted, true));
                    }
                }
                Woken::Retry => self.crossing = None,
                Woken::Freed => {
                    if self
                        .crossing
                        .is_none_or(|(at, _)| at.elapsed() >= CROSSING_WINDOW)
                    {
                        self.crossing = Some((Instant::now(), 0));
                    }
                }
                Woken::TimedOut => return Err(self.give_up(remaining).await),
            }
        }
    }

    /// One script call (re-sent after a broken connection, with the same
    /// token, so a re-send is safe even if the first one took the lock).
    async fn attempt(&mut self) -> Result<Attempted, LockError> {
        let inner = self.attempt.inner.clone();
        let names = self.attempt.names.as_ref().expect("set until the end");
        loop {
            let sent = Instant::now();
            let wait = if self.wait.is_zero() {
                Duration::ZERO
            } else {
                self.deadline
                    .saturating_duration_since(sent)
                    .max(Duration::from_millis(1))
            };
            let (token, ttl) = (&self.attempt.token, self.attempt.ttl);
            let answer = match &inner.backend {
                Backend::Redlock(redlock) => {
                    let pause = brief_split_pause(&mut self.crossing);
                    redlock.acquire_paced(names, token, ttl, pause).await
                }
                backend => backend.acquire(names, token, ttl, wait).await,
            };
            match answer {
                Ok(AcquireOutcome::Acquired { fencing }) => {
                    return Ok(Attempted::Acquired { fencing, sent });
                }
                Ok(AcquireOutcome::Busy { remaining, fence }) => {
                    self.last_busy = self.last_busy.max(sent);
                    self.fence_seen = self.fence_seen.max(fence);
                    return Ok(Attempted::Busy { remaining });
                }
                Err(LockError::Backend(e))
                    if e.is_connection()
                        && self.retries < MAX_CONNECTION_RETRIES
                        && (Instant::now() + self.backoff.peek() < self.deadline
                            || (self.retries == 0 && !e.is_timeout())) =>
                {
                    // The driver re-establishes a broken connection.
                    tracing::debug!(key = %self.attempt.key, error = &e as &dyn std::error::Error,
                        "lock acquire: connection failed; retrying");
                    if self.retries > 0 {
                        self.backoff.wait().await;
                    }
                    self.retries += 1;
                }
                Err(e) => {
                    // The script may have run even if the reply was lost: the
                    // attempt releases with our token on the way out.
                    tracing::debug!(key = %self.attempt.key, error = &e as &dyn std::error::Error, "lock acquire failed");
                    return Err(e);
                }
            }
        }
    }

    /// Registers for notices after the key was found busy; the caller tries
    /// again at once, so a hand-over between the attempt and the
    /// registration is seen that way.
    async fn queue(&mut self) {
        let names = self.attempt.names.as_ref().expect("set until the end");
        let inner = &self.attempt.inner;
        self.waiter = Some(inner.backend.register(names, &self.attempt.token).await);
    }

    /// Sleeps until a release hands the lock to us, a notice says it is free,
    /// the holder's lease (`remaining`) runs out, or the deadline passes.
    /// Notices are at most once, hence the lease timer.
    async fn wait_for_turn(&mut self, remaining: Duration) -> Woken {
        let handle = self.waiter.as_ref().expect("registered before waiting");
        let fence_seen = self.fence_seen;
        // A hand-over sent before our last busy attempt ran is stale.
        let fresh = |fencing: u64| fencing > fence_seen;
        match handle.waiter.take_grant() {
            Some(fencing) if fresh(fencing) => return Woken::Granted(fencing),
            Some(_) => return Woken::Retry,
            None => {}
        }
        let now = Instant::now();
        if now >= self.deadline {
            return Woken::TimedOut;
        }
        let mut retry_at = (now + remaining + Duration::from_millis(1)).min(self.deadline);
        loop {
            tokio::select! {
                _ = handle.waiter.notify.notified() => {}
                _ = tokio::time::sleep_until(retry_at) => return Woken::Retry,
            }
            match handle.waiter.take_grant() {
                Some(fencing) if fresh(fencing) => return Woken::Granted(fencing),
                // Stale: the attempt that follows tells what holds now.
                Some(_) => return Woken::Retry,
                None => {}
            }
            if !handle.waiter.take_handoff_seen() {
                return Woken::Freed; // act now
            }
            // The lock went to another waiter with a short lease: if that
            // waiter is dead, the key is free when it runs out.
            let free_by = Instant::now() + HANDOFF_LEASE + Duration::from_millis(5);
            retry_at = retry_at.min(free_by);
        }
    }

    /// A release handed the lock over with a lease of `min(ttl, HANDOFF_LEASE)`
    /// that started after `last_busy`. Trusted as it is while a third of it
    /// is left; otherwise (or for a fixed lease, or where hand-overs must be
    /// replicated first) re-armed to the full lease before use. `None`: the
    /// hand-over ran out before we saw it.
    async fn confirm(&mut self) -> Result<Option<(Instant, Duration)>, LockError> {
        let inner = self.attempt.inner.clone();
        let ttl = self.attempt.ttl;
        let granted = ttl.min(HANDOFF_LEASE);
        if self.renew
            && !inner.backend.needs_confirmation()
            && Instant::now() + granted / 3 < self.last_busy + granted
        {
            return Ok(Some((self.last_busy, granted)));
        }
        let names = self.attempt.names.as_ref().expect("set until the end");
        let sent = Instant::now();
        match inner.backend.extend(names, &self.attempt.token, ttl).await {
            Ok(true) => Ok(Some((sent, ttl))),
            Ok(false) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Turns the acquisition into a watched guard: a lease of `granted` set
    /// by a request sent at `sent`.
    fn hold(mut self, fencing: u64, sent: Instant, granted: Duration, handover: bool) -> LockGuard {
        let attempt = &mut self.attempt;
        let inner = attempt.inner.clone();
        let names = attempt.names.take().expect("set until the end");
        let ttl = attempt.ttl;
        let held = Arc::new(Held {
            id: inner.next_lock_id.fetch_add(1, Ordering::Relaxed),
            client_id: inner.id,
            key: std::mem::take(&mut attempt.key),
            names,
            token: attempt.token,
            fencing,
            ttl,
            lost: CancellationToken::new(),
            // Set by the watchdog as it takes the lease under watch.
            valid_until: std::sync::Mutex::new(sent),
            metrics: self.metrics.clone(),
            since: sent,
            // From now, when the answer is in: the server set the key before
            // that, so it stays taken at least this long after it did.
            hold_until: (!self.hold_at_least.is_zero())
                .then(|| Instant::now() + self.hold_at_least),
        });
        crate::metrics::acquired(&self.metrics, self.started.elapsed(), handover);
        inner.watchdog.watch(
            held.clone(),
            ttl,
            self.renew,
            sent,
            granted,
            inner.backend.drift(ttl),
        );
        if held.names.shape == Shape::Mutex && !held.names.is_leader() {
            inner.local.hold(&held, self.renew, !self.wait.is_zero());
        }
        tracing::debug!(key = %held.key, fencing,
            waited_us = self.started.elapsed().as_micros() as u64, "lock acquired");
        LockGuard::owner(held, inner)
    }

    /// Gives up. A wait that may have queued leaves the line before `Busy` is
    /// answered (in the background only if that fails), so a release right
    /// after our `Busy` cannot hand the lock to us.
    async fn give_up(mut self, remaining: Duration) -> LockError {
        let attempt = &mut self.attempt;
        tracing::debug!(key = %attempt.key,
            waited_us = self.started.elapsed().as_micros() as u64, "lock busy");
        crate::metrics::busy(&self.metrics, self.started.elapsed());
        if let Some(names) = attempt.names.as_ref().filter(|_| attempt.queued) {
            // A release that finds the lock ours (it had just been handed to
            // us) hands it on.
            let left = attempt
                .inner
                .backend
                .release(names, &attempt.token, attempt.ttl, true)
                .await;
            if left.is_ok() {
                attempt.names = None;
            }
        } else {
            attempt.names = None; // never ours, never queued: nothing to clean up
        }
        LockError::Busy {
            key: attempt.key.clone(),
            retry_after: remaining,
        }
    }
}

/// The clean-up duty of an acquisition: if it is abandoned (busy after a
/// wait, error, cancellation) after a script may have queued us or taken the
/// lock, leave the queue and release with our token in the background (which
/// hands the lock on if it had been handed to us).
struct Attempt {
    inner: Arc<Inner>,
    /// The key as the caller gave it.
    key: String,
    /// `None` once nothing is left to clean up.
    names: Option<KeyNames>,
    token: Token,
    ttl: Duration,
    queued: bool,
}

impl Drop for Attempt {
    fn drop(&mut self) {
        if let Some(names) = self.names.take() {
            release_in_background(
                self.inner.clone(),
                std::mem::take(&mut self.key),
                names,
                self.token,
                self.ttl,
                self.queued,
            );
        }
    }
}

/// Redlock: the pause after a split vote of the next attempt, when it is a
/// brief one (see [`CROSSING_WINDOW`]); `None`: the usual one.
fn brief_split_pause(crossing: &mut Option<(Instant, u32)>) -> Option<Duration> {
    let (since, tries) = crossing.as_mut()?;
    if since.elapsed() >= CROSSING_WINDOW || *tries >= CROSSING_TRIES {
        return None;
    }
    *tries += 1;
    Some(CROSSING_PAUSE * (1 << (*tries - 1)))
}
