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

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::hold::{Taken, hold};
use super::options::{Asked, Deadline};
use super::release::Abandoned;
use super::turns::{Attempted, Claimer, Turns, Woken};
use crate::backend::{AcquireOutcome, Backend, HANDOFF_LEASE, LockRef};
use crate::backoff::{Armed, Retry, Retrying};
use crate::client::LockGuard;
use crate::client::inner::Inner;
use crate::error::LockError;
use crate::key::KeyNames;
use crate::token::Token;

/// One acquire in progress, as [`Turns::run`] runs it.
pub(super) struct Acquisition {
    attempt: Attempt,
    /// Send time of the last attempt that found the lock busy: a hand-over
    /// to us that is not stale (see [`Turns`]) happened after it.
    last_busy: Instant,
    /// Re-sends after broken connections, over the whole acquisition
    /// ([`Retry::ACQUIRE`]).
    retry: Retrying,
    /// Redlock: the brief pauses after split votes ([`Retry::CROSSING`])
    /// since the retry right after registering, or a free notice (boxed:
    /// only Redlock's waits have them, and every acquire holds this).
    crossing: Option<Box<Retrying>>,
}

/// How an acquisition took the lock: the fencing token, the send time of
/// the request that set the lease, and the lease a hand-over granted
/// (`None`: the full one).
pub(super) struct Acquired {
    fencing: u64,
    sent: Instant,
    handed: Option<Duration>,
}

impl Acquisition {
    /// Acquires `key` (named `names`) as `asked`: the steps until the lock
    /// is held or given up. The acquisition is built here, so the future
    /// holds it once, not beside the arguments it is built from. `fresh`:
    /// the request started a moment ago (nothing awaited since), so its
    /// start can stand for the first attempt's send time, which saves a
    /// clock read (a send time may be early, never late: a lease counted
    /// from it ends no later than the server's).
    pub(super) fn acquire(
        inner: Arc<Inner>,
        key: String,
        names: KeyNames,
        asked: Asked,
        fresh: bool,
    ) -> Pin<Box<dyn Future<Output = Result<LockGuard, LockError>> + Send>> {
        let token = inner.token();
        let this = Self::new(inner, key, names, token, asked);
        // Boxed: the steps' state (script futures of every backend) would
        // otherwise sit inline in every caller's future, and nested locked
        // scopes would stack it up. A lock that may take the plain path
        // tries it in a box of its own first, sized for the allocator's
        // per-thread cache (see the test below), and boxes the steps only
        // if it must.
        if this.may_go_plain() {
            Box::pin(this.plain_first(fresh))
        } else {
            Box::pin(this.steps())
        }
    }

    /// The uncontended path, then the steps in a box of their own.
    // Not an `async fn`, which would keep `self` twice in its state.
    #[allow(clippy::manual_async_fn)]
    fn plain_first(
        mut self,
        fresh: bool,
    ) -> impl Future<Output = Result<LockGuard, LockError>> + Send {
        async move {
            if let Some(answer) = self.first_plain(fresh).await {
                return answer.map(|acquired| self.end(acquired));
            }
            Box::pin(self.steps()).await
        }
    }

    /// Every step: attempts, waits, hand-overs, until the lock is held or
    /// given up.
    fn steps(self) -> impl Future<Output = Result<LockGuard, LockError>> + Send {
        Turns::run(self, None)
    }

    /// Whether the first attempt may be a plain `SET NX`.
    fn may_go_plain(&self) -> bool {
        let attempt = &self.attempt;
        matches!(&attempt.inner().backend, Backend::Redis(redis) if redis.is_plain(attempt.names()))
    }

    /// The uncontended path on one Redis or Valkey server, before the boxed
    /// steps: a plain `SET NX` (see `backend/redis/plain.rs`), for a lock
    /// that [may go plain](Self::may_go_plain). `None`: go on with the steps
    /// (the key taken, or a broken connection to send again after its
    /// pause); else the answer. `fresh`: as [`Acquisition::acquire`] says.
    async fn first_plain(&mut self, fresh: bool) -> Option<Result<Acquired, LockError>> {
        // Only the send time and the request's own future are kept across
        // its wait: this future is in the box every uncontended acquire takes.
        let attempt = &self.attempt;
        let Backend::Redis(redis) = &attempt.inner().backend else {
            return None;
        };
        let names = attempt.names();
        let deadline = attempt.asked.deadline;
        let sent = if fresh {
            deadline.started()
        } else {
            Instant::now()
        };
        let (ttl, wait) = (attempt.asked.ttl, deadline.left(sent));
        let lock = LockRef::new(names, attempt.token(), ttl);
        match redis.acquire_plain(lock, wait).await {
            Ok(Some(AcquireOutcome::Acquired { fencing })) => Some(Ok(Acquired {
                fencing,
                sent,
                handed: None,
            })),
            // Taken: acquire.lua decides, from the first step on (once
            // the key was found busy we may be in its line, which only
            // acquire.lua reads).
            Ok(_) => None,
            Err(e)
                if self
                    .retry
                    .resends(&e, Some(self.attempt.asked.deadline.at())) =>
            {
                tracing::debug!(key = %self.attempt.key(), error = &e as &dyn std::error::Error,
                    "lock acquire: connection failed; retrying");
                self.retry.pause().await;
                None
            }
            // It may have set the key though its reply was lost: the
            // attempt releases with our token on the way out. (Sent again
            // above, as acquire.lua, which finds the key ours if so.)
            Err(e) => Some(Err(e)),
        }
    }

    /// The embedded backend answers at once, so an uncontended acquire there
    /// is taken right here, without the boxed steps (their future is sized
    /// for the server backends' requests): the token, fencing token and send
    /// time of the lease to hold, or `Busy` for a request that tries once.
    /// `None`: go the usual way (another backend, or a busy key to wait for).
    pub(super) fn try_embedded(
        inner: &Inner,
        key: &str,
        names: &KeyNames,
        asked: &Asked,
    ) -> Option<Result<(Token, u64, Instant), LockError>> {
        let Backend::Memory(memory) = &inner.backend else {
            return None;
        };
        let token = inner.token();
        // Try once: a busy answer neither queues nor registers.
        match memory.acquire(names, &token, asked.ttl, Duration::ZERO) {
            AcquireOutcome::Acquired { fencing } => Some(Ok((token, fencing, Instant::now()))),
            AcquireOutcome::Busy { remaining, .. } if asked.deadline.tries_once() => {
                crate::metrics::busy(&asked.metrics, Duration::ZERO);
                Some(Err(LockError::Busy {
                    key: key.to_owned(),
                    retry_after: inner.hints.hint(key, remaining),
                }))
            }
            AcquireOutcome::Busy { .. } => None,
        }
    }

    fn new(inner: Arc<Inner>, key: String, names: KeyNames, token: Token, asked: Asked) -> Self {
        let started = asked.deadline.started();
        let dequeue = !asked.deadline.tries_once();
        let lock = (names, token, asked.ttl);
        let claim = Abandoned {
            inner,
            key,
            lock,
            dequeue,
        };
        Self {
            attempt: Attempt {
                // Armed from the start: the first attempt may take the lock.
                claim: Armed::new(claim, true),
                asked,
            },
            last_busy: started,
            retry: Retry::ACQUIRE.start(),
            crossing: None,
        }
    }
}

impl Claimer for Acquisition {
    type Found = Acquired;
    type Answer = LockGuard;

    fn deadline(&self) -> Deadline {
        self.attempt.asked.deadline
    }

    fn waits_on(&self) -> (&Backend, (&str, &Token)) {
        let attempt = &self.attempt;
        (
            &attempt.inner().backend,
            (attempt.names().notice(), attempt.token()),
        )
    }

    /// One script call (re-sent after a broken connection, with the same
    /// token, so a re-send is safe even if the first one took the lock).
    async fn attempt(&mut self) -> Result<Attempted<Acquired>, LockError> {
        let inner = self.attempt.inner().clone();
        let names = self.attempt.names();
        loop {
            let sent = Instant::now();
            let deadline = self.attempt.asked.deadline;
            let (token, ttl) = (self.attempt.token(), self.attempt.asked.ttl);
            let answer = match &inner.backend {
                Backend::Redlock(redlock) => {
                    let pause = brief_split_pause(&mut self.crossing);
                    // Boxed: a single server's attempt does not carry a vote's state.
                    Box::pin(redlock.acquire_paced(names, token, ttl, pause)).await
                }
                // The one place the deadline becomes a wait again: the
                // script's.
                backend => {
                    backend
                        .acquire(LockRef::new(names, token, ttl), deadline.left(sent))
                        .await
                }
            };
            match answer {
                Ok(AcquireOutcome::Acquired { fencing }) => {
                    let handed = None;
                    return Ok(Attempted::Ended(Acquired {
                        fencing,
                        sent,
                        handed,
                    }));
                }
                Ok(AcquireOutcome::Busy { remaining, fence }) => {
                    self.last_busy = self.last_busy.max(sent);
                    return Ok(Attempted::Busy { remaining, fence });
                }
                // Within the wait; an acquire that tries once still gets its
                // first re-send, unless the failure took its time already.
                Err(e) if self.retry.resends(&e, Some(deadline.at())) => {
                    // The driver re-establishes a broken connection.
                    tracing::debug!(key = %self.attempt.key(), error = &e as &dyn std::error::Error,
                        "lock acquire: connection failed; retrying");
                    self.retry.pause().await;
                }
                Err(e) => {
                    // The script may have run even if the reply was lost: the
                    // attempt releases with our token on the way out.
                    tracing::debug!(key = %self.attempt.key(), error = &e as &dyn std::error::Error, "lock acquire failed");
                    return Err(e);
                }
            }
        }
    }

    /// A release handed the lock over with a lease of `min(ttl, HANDOFF_LEASE)`
    /// that started after `last_busy`. Trusted as it is while a third of it
    /// is left; otherwise (or for a fixed lease, or where hand-overs must be
    /// replicated first) re-armed to the full lease before use. `None`: the
    /// hand-over ran out before we saw it.
    async fn handed(&mut self, fencing: u64) -> Result<Option<Acquired>, LockError> {
        let inner = self.attempt.inner().clone();
        let ttl = self.attempt.asked.ttl;
        let granted = ttl.min(HANDOFF_LEASE);
        if self.attempt.asked.renew
            && !inner.backend.needs_confirmation()
            && Instant::now() + granted / 3 < self.last_busy + granted
        {
            let (sent, handed) = (self.last_busy, Some(granted));
            return Ok(Some(Acquired {
                fencing,
                sent,
                handed,
            }));
        }
        let (names, token) = (self.attempt.names(), self.attempt.token());
        let sent = Instant::now();
        let extended = inner
            .backend
            .extend(LockRef::new(names, token, ttl))
            .await?;
        // Re-armed to the full lease, though handed over (for the metric).
        let handed = Some(ttl);
        Ok(extended.then_some(Acquired {
            fencing,
            sent,
            handed,
        }))
    }

    /// Redlock: tried again at once after registering, so a hand-over
    /// between the attempt and the registration is seen; brief pauses
    /// after split votes from then, or from a free notice.
    fn woke(&mut self, woken: &Woken) {
        match woken {
            Woken::Registered => self.crossing = Some(Box::new(Retry::CROSSING.start())),
            Woken::Freed if self.crossing.as_ref().is_none_or(|c| c.ended()) => {
                self.crossing = Some(Box::new(Retry::CROSSING.start()));
            }
            Woken::Freed => {}
            _ => self.crossing = None,
        }
    }

    /// Turns the acquisition into a watched guard.
    fn end(mut self, acquired: Acquired) -> LockGuard {
        let Acquired {
            fencing,
            sent,
            handed,
        } = acquired;
        let Attempt { claim, asked } = &mut self.attempt;
        let Abandoned {
            inner,
            key,
            lock: (names, token, _),
            ..
        } = claim.settle();
        let taken = Taken {
            key,
            names,
            token,
            fencing,
            sent,
            granted: handed.unwrap_or(asked.ttl),
            handover: handed.is_some(),
        };
        hold(inner, taken, asked)
    }

    /// Gives up. A wait that may have queued leaves the line before `Busy` is
    /// answered (in the background only if that fails), so a release right
    /// after our `Busy` cannot hand the lock to us.
    async fn give_up(mut self, remaining: Duration) -> Result<LockGuard, LockError> {
        let attempt = &mut self.attempt;
        let waited = attempt.asked.deadline.started().elapsed();
        let key = attempt.key();
        tracing::debug!(key = %key, waited_us = waited.as_micros() as u64, "lock busy");
        crate::metrics::busy(&attempt.asked.metrics, waited);
        let backend = &attempt.inner().backend;
        // Never ours, never queued (tried once): nothing to clean up. Else
        // a release that finds the lock ours (it had just been handed to
        // us) hands it on.
        let left = !attempt.queued()
            || (backend
                .release(
                    LockRef::new(attempt.names(), attempt.token(), attempt.asked.ttl),
                    true,
                )
                .await)
                .is_ok();
        let busy = LockError::Busy {
            key: key.to_owned(),
            retry_after: attempt.inner().hints.hint(key, remaining),
        };
        attempt.claim.arm(!left);
        Err(busy)
    }
}

/// The clean-up duty of an acquisition: if it is abandoned (busy after a
/// wait, error, cancellation) after a script may have queued us or taken the
/// lock, `claim` leaves the queue and releases with our token in the
/// background (which hands the lock on if it had been handed to us).
struct Attempt {
    claim: Armed<Abandoned>,
    asked: Asked,
}

impl Attempt {
    /// Whether a script may have queued us (we wait).
    fn queued(&self) -> bool {
        !self.asked.deadline.tries_once()
    }

    fn inner(&self) -> &Arc<Inner> {
        &self.claim.get().inner
    }

    /// The key as the caller gave it.
    fn key(&self) -> &str {
        &self.claim.get().key
    }

    fn names(&self) -> &KeyNames {
        &self.claim.get().lock.0
    }

    fn token(&self) -> &Token {
        &self.claim.get().lock.1
    }
}

/// Redlock: the pause after a split vote of the next attempt, when it is a
/// brief one ([`Retry::CROSSING`]); `None`: the usual one.
fn brief_split_pause(crossing: &mut Option<Box<Retrying>>) -> Option<Duration> {
    let crossing = crossing.as_mut()?;
    crossing.allows(None).then(|| crossing.next_pause())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{LockClient, LockOptions};

    /// The most an uncontended acquire's box may take: glibc's malloc keeps
    /// freed blocks of up to 1,032 bytes in per-thread caches, and serves
    /// larger ones from its bins (a lock, and a consolidation of its small
    /// free blocks, first). With the whole acquisition in one box of 2.6 KB,
    /// that cost the 32-task pair 6% more instructions in the client.
    const FIRST_BOX: usize = 1024;

    #[tokio::test]
    async fn the_uncontended_acquire_fits_in_the_allocators_thread_cache() {
        let client = LockClient::builder().memory().build().await.unwrap();
        let inner = &client.0;
        let names = KeyNames::new(&inner.prefix, "size");
        let asked = LockOptions::new().resolve(inner).unwrap();
        let mut this = Acquisition::new(inner.clone(), "size".into(), names, inner.token(), asked);
        this.attempt.claim.arm(false); // never sent: nothing to release
        let size = std::mem::size_of_val(&this.plain_first(true));
        assert!(
            size <= FIRST_BOX,
            "an uncontended acquire boxes {size} bytes, over {FIRST_BOX}"
        );
    }
}
