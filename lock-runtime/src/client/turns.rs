//! Waiting for a busy key: the part of an acquisition that a lock and an
//! idempotency record share.
//!
//! An attempt found the key busy. The first time, the claimer registers for
//! the key's notices and tries again at once (a notice sent between the
//! attempt and the registration is seen that way); after that it sleeps
//! until a notice, the holder's lease or the deadline, and tries again. At
//! the deadline it gives up. A lock's waits also take hand-overs from a
//! release ([`Woken::Granted`]); a record has none.
//!
//! [`Turns::run`] runs those steps for any [`Claimer`]: a lock's
//! acquisition (`acquire.rs`) and an idempotency record's claim
//! (`records/`) differ only in what one attempt sends and what it found.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use super::options::Deadline;
use crate::backend::{Backend, HANDOFF_LEASE, WaitHandle};
use crate::backoff::{Retry, Retrying};
use crate::durations::later;
use crate::error::LockError;
use crate::token::Token;

/// A claim that waits its turn for a busy key, as [`Turns::run`] runs it:
/// a lock's acquisition, an idempotency record's claim.
pub(crate) trait Claimer: Sized {
    /// What ends the claim without a wait: the key taken, or an answer
    /// that needs none (a record already done).
    type Found: Send;
    /// What the claim answers.
    type Answer;

    /// Until when the claim waits (it tries once if it does not).
    fn deadline(&self) -> Deadline;

    /// The backend, and the notice channel and token waited on (asked only
    /// of a claim that waits: a lock names its channel on first use).
    fn waits_on(&self) -> (&Backend, (&str, &Token));

    /// One attempt (sent again after a broken connection, as safe to send
    /// twice): what ends the claim, or for how long the key is busy.
    fn attempt(&mut self)
    -> impl Future<Output = Result<Attempted<Self::Found>, LockError>> + Send;

    /// A release handed the key to us with the fencing token `fencing`:
    /// what ends the claim, or `None` if the hand-over ran out before we saw
    /// it. Only locks are handed over.
    fn handed(
        &mut self,
        _fencing: u64,
    ) -> impl Future<Output = Result<Option<Self::Found>, LockError>> + Send {
        std::future::ready(Ok(None))
    }

    /// A wait ended as `woken`, and another attempt follows (Redlock paces
    /// it by that).
    fn woke(&mut self, _woken: &Woken) {}

    /// The answer for `found`.
    fn end(self, found: Self::Found) -> Self::Answer;

    /// The deadline passed with the key busy for `remaining`.
    fn give_up(
        self,
        remaining: Duration,
    ) -> impl Future<Output = Result<Self::Answer, LockError>> + Send;
}

/// What one attempt of a [`Claimer`] found.
pub(crate) enum Attempted<F> {
    /// The claim ends with this.
    Ended(F),
    /// The key is busy for `remaining`; `fence`: its fencing counter as the
    /// attempt saw it (0 where it has none).
    Busy { remaining: Duration, fence: u64 },
}

/// The waits of one claimer, on one notice channel.
pub(crate) struct Turns {
    /// Registered for notices (and hand-overs), once the key was found
    /// busy (or at once where registering costs nothing).
    waiter: Option<WaitHandle>,
    /// The highest fencing counter a busy attempt saw. A hand-over whose
    /// token is at most this was sent before that attempt ran: its lease
    /// has ended and the key is someone else's (a waiter paused past the
    /// hand-over lease, found by the model checker), so it is ignored.
    fence_seen: u64,
    /// Where notices are not confirmed (the subscription refused by an
    /// ACL, the notice connection down), the pauses after which to look
    /// again; `None`: the holder's lease is the only other timer.
    look_again: Option<Retrying>,
}

/// How a wait after a busy attempt ended.
pub(crate) enum Woken {
    /// Just registered for notices: try again at once.
    Registered,
    /// A release handed the lock to us, with this fencing token.
    Granted(u64),
    /// The holder's lease ran out (or our hand-over was stale): try again.
    Retry,
    /// A notice said the key is free: try again.
    Freed,
    /// The deadline passed.
    TimedOut,
}

impl Turns {
    /// Runs `claimer` until its claim ends: the key taken, an answer
    /// without a wait, or the deadline. A claim that tries once is its one
    /// attempt (the key busy: given up), without the waits' state; one
    /// that may wait takes its [turns](Self::claim), boxed, so only a wait
    /// pays for their state. `look_again`: where the notices are not
    /// confirmed (the subscription refused by an ACL, the notice
    /// connection down), the pauses after which to look again (`None`:
    /// wait for the holder's lease).
    // Not an `async fn`, which would keep `claimer` twice in its state.
    pub(crate) fn run<C: Claimer>(
        claimer: C,
        look_again: Option<Retry>,
    ) -> impl Future<Output = Result<C::Answer, LockError>> {
        let mut claimer = claimer;
        async move {
            if !claimer.deadline().tries_once() {
                return Box::pin(Self::take(claimer, look_again)).await;
            }
            match claimer.attempt().await? {
                Attempted::Ended(found) => Ok(claimer.end(found)),
                Attempted::Busy { remaining, .. } => claimer.give_up(remaining).await,
            }
        }
    }

    /// The turns of a claim that may wait, registered for notices at once
    /// where that costs nothing (the embedded backend, or a channel already
    /// subscribed to).
    // Not an `async fn`, which would keep `claimer` twice in its state.
    #[allow(clippy::manual_async_fn)]
    fn take<C: Claimer>(
        claimer: C,
        look_again: Option<Retry>,
    ) -> impl Future<Output = Result<C::Answer, LockError>> {
        async move {
            let (backend, (channel, token)) = claimer.waits_on();
            let waiter = match backend.notices_ready_on(channel) {
                true => Some(backend.register_on(channel, token).await),
                false => None,
            };
            let look_again = look_again.map(Retry::start);
            let turns = Self {
                waiter,
                fence_seen: 0,
                look_again,
            };
            turns.claim(claimer).await
        }
    }

    /// Runs `claimer`'s attempts and waits until its claim ends.
    ///
    /// Not an `async fn`: one copies its arguments into its state beside
    /// themselves, and this future is moved into a box.
    fn claim<C: Claimer>(self, claimer: C) -> impl Future<Output = Result<C::Answer, LockError>> {
        let (mut turns, mut claimer) = (self, claimer);
        async move {
            loop {
                let remaining = match claimer.attempt().await? {
                    Attempted::Ended(found) => return Ok(claimer.end(found)),
                    Attempted::Busy { remaining, fence } => {
                        turns.fence_seen = turns.fence_seen.max(fence);
                        remaining
                    }
                };
                let (deadline, (backend, on)) = (claimer.deadline(), claimer.waits_on());
                let woken = turns.after_busy(backend, on, deadline, remaining).await;
                match woken {
                    // Boxed: the claim that gives up (a busy key at its
                    // deadline) pays for its state, not every claim.
                    Woken::TimedOut => return Box::pin(claimer.give_up(remaining)).await,
                    Woken::Granted(fencing) => {
                        if let Some(found) = claimer.handed(fencing).await? {
                            return Ok(claimer.end(found));
                        }
                    }
                    Woken::Registered | Woken::Retry | Woken::Freed => claimer.woke(&woken),
                }
            }
        }
    }

    /// After an attempt found the key busy for `remaining`: registers (the
    /// first time), or sleeps until a release hands the lock to us, a
    /// notice says it is free, the holder's lease runs out, or `deadline`
    /// passes. Notices are at most once, hence the lease timer.
    async fn after_busy(
        &mut self,
        backend: &Backend,
        (channel, token): (&str, &Token),
        deadline: Deadline,
        remaining: Duration,
    ) -> Woken {
        let Some(handle) = &self.waiter else {
            if deadline.passed() {
                return Woken::TimedOut;
            }
            let handle = backend.register_on(channel, token).await;
            // The attempt that follows sees whatever a wake so far announced
            // (the notice connection's first connect wakes every waiter
            // registered, before it confirms their subscriptions): not a
            // reason for one more attempt after it.
            handle.waiter.take_freed();
            self.waiter = Some(handle);
            return Woken::Registered;
        };
        let fence_seen = self.fence_seen;
        // A hand-over sent before our last busy attempt ran is stale.
        let fresh = |fencing: u64| fencing > fence_seen;
        match handle.waiter.take_grant() {
            Some(fencing) if fresh(fencing) => return Woken::Granted(fencing),
            Some(_) => return Woken::Retry,
            None => {}
        }
        let (now, deadline) = (Instant::now(), deadline.at());
        if now >= deadline {
            return Woken::TimedOut;
        }
        let mut retry_at =
            later(now, remaining.saturating_add(Duration::from_millis(1))).min(deadline);
        if let Some(look_again) = &mut self.look_again
            && !backend.notices_ready_on(channel)
        {
            retry_at = retry_at.min(now + look_again.next_pause());
        }
        loop {
            if !handle.notice_or(retry_at).await {
                return Woken::Retry;
            }
            match handle.waiter.take_grant() {
                Some(fencing) if fresh(fencing) => return Woken::Granted(fencing),
                // Stale: the attempt that follows tells what holds now.
                Some(_) => return Woken::Retry,
                None => {}
            }
            let handed_on = handle.waiter.take_handoff_seen();
            if handle.waiter.take_freed() {
                return Woken::Freed; // act now
            }
            if handed_on {
                // The lock went to another waiter with a short lease: if that
                // waiter is dead, the key is free when it runs out.
                let free_by = Instant::now() + HANDOFF_LEASE + Duration::from_millis(5);
                retry_at = retry_at.min(free_by);
            }
            // Else the permit of a notice whose news (a hand-over to another
            // waiter) an earlier wake-up took: two notices arriving before
            // this task ran set the news once and leave a permit. Not a
            // reason to try (the key is someone else's): wait on.
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A claim whose every attempt finds the key busy, and that must not be
    /// asked what it waits on (a lock would name its notice channel then).
    struct AlwaysBusy {
        deadline: Deadline,
        attempts: u32,
    }

    impl Claimer for AlwaysBusy {
        type Found = ();
        type Answer = u32;

        fn deadline(&self) -> Deadline {
            self.deadline
        }

        fn waits_on(&self) -> (&Backend, (&str, &Token)) {
            panic!("a claim that tries once was asked what it waits on")
        }

        async fn attempt(&mut self) -> Result<Attempted<()>, LockError> {
            self.attempts += 1;
            let remaining = Duration::from_secs(1);
            Ok(Attempted::Busy {
                remaining,
                fence: 0,
            })
        }

        fn end(self, _: ()) -> u32 {
            unreachable!("never taken")
        }

        async fn give_up(self, _: Duration) -> Result<u32, LockError> {
            Ok(self.attempts)
        }
    }

    #[tokio::test]
    async fn a_claim_that_tries_once_sends_one_attempt_and_names_no_channel() {
        let claimer = AlwaysBusy {
            deadline: Deadline::after(Duration::ZERO),
            attempts: 0,
        };
        let attempts = Turns::run(claimer, None).await.unwrap();
        assert_eq!(attempts, 1, "one attempt, then given up");
    }
}
