//! Every release of a held lease, decided and sent here: a guard's
//! [`release`], a dropped guard's ([`release_dropped`]), every lease of a
//! client shutting down ([`give_back_all`]), and the clean-up of a lease
//! nobody holds yet ([`release_in_background`]).
//!
//! A release does one of three things with a lease ([`Decision`]): keeps
//! the key taken until `hold_at_least` (its lease is set to end then),
//! hands it to the next task of this client waiting for the key (see
//! `handover`), or deletes it on the server, which hands it to the first
//! waiter queued there.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::handover::hand_on;
use super::local::{Local, Owner};
use crate::backend::{LockRef, Released};
use crate::backoff::{self, Release};
use crate::client::inner::Inner;
use crate::error::LockError;
use crate::held::Held;
use crate::key::KeyNames;
use crate::token::Token;

impl Owner for Inner {
    fn lines(&self) -> &Local {
        &self.local
    }

    fn give_back(self: Arc<Self>, held: Arc<Held>) {
        release_dropped(self, held);
    }
}

/// What a release does with a lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Decision {
    /// `hold_at_least`: the key stays taken this much longer, then expires.
    Keep(Duration),
    /// To the next task of this client waiting for the key, in-process.
    HandOn,
    /// Deleted on the server (handed to its first queued waiter).
    Delete,
}

/// The one rule: a key under `hold_at_least` is kept; a lease not known
/// lost goes to a waiting task of this client if there is one; otherwise
/// it is deleted.
fn decide(inner: &Inner, held: &Arc<Held>, was_lost: bool) -> Decision {
    if let Some(left) = held.keeps_for() {
        return Decision::Keep(left);
    }
    if !was_lost && inner.local.has_waiters(held) {
        return Decision::HandOn;
    }
    Decision::Delete
}

/// Before `held` goes back to the server at `now`: its line goes there
/// too, the watchdog lets it go, and its hold time is counted. Ended here
/// too: the last holder of a hand-on chain was not ended by its caller.
fn retire(inner: &Inner, held: &Arc<Held>, now: Instant) {
    held.end();
    inner.local.end(held);
    inner.watchdog.unwatch(held.id);
    let (held_for, kept) = held.hold_times(now);
    crate::metrics::released(&held.metrics, held_for);
    inner.hints.held(&held.key, kept);
}

/// Sends what `decision` says for `held` to the server (a hand-on that
/// found nobody is a delete).
async fn send(inner: &Inner, held: &Held, decision: Decision) -> Result<Released, LockError> {
    match decision {
        // Boxed (hold_at_least only): a plain release's future does not
        // carry this path's state.
        Decision::Keep(left) => Box::pin(inner.backend.release_in(&held.names, &held.token, left))
            .await
            .map(|ours| {
                if ours {
                    Released::Yes
                } else {
                    Released::NotOurs
                }
            }),
        Decision::HandOn | Decision::Delete => {
            // Taken by a plain SET: it is the one with a token to mint.
            let plain = held.mint.is_some();
            inner
                .backend
                .release_held(LockRef::new(&held.names, &held.token, held.ttl), plain)
                .await
        }
    }
}

/// An owning guard's [`release`](crate::LockGuard::release): what it
/// answers is documented there.
pub(crate) async fn release(inner: &Arc<Inner>, mut held: Arc<Held>) -> Result<(), LockError> {
    // The clock read once: whether the lease ran out, the hold time, and
    // whether the lease was valid as the release went out.
    let mut started = Instant::now();
    let was_lost = held.is_lost_at(started);
    if !held.end() {
        // Given back already, by `LockClient::shutdown`.
        return Err(LockError::lost(&held.key));
    }
    let mut decision = decide(inner, &held, was_lost);
    let mut unfinished = Unfinished {
        inner,
        left: Some((held.clone(), decision, false)),
    };
    if decision == Decision::HandOn {
        // Boxed: only a key with waiters in this process comes here.
        match Box::pin(hand_on(inner, held)).await {
            None => {
                unfinished.left = None;
                return Ok(());
            }
            Some(last) => {
                (held, decision) = (last, Decision::Delete);
                started = Instant::now(); // after the hand-on's round trip
            }
        }
    }
    retire(inner, &held, started);
    unfinished.left = Some((held.clone(), decision, true));
    let valid = held.valid_at(started);
    let result = send(inner, &held, decision).await;
    unfinished.left = None;
    let key = &held.key;
    match result {
        // Released, but the lease had been given up for lost before: the
        // work done under it may have overlapped with another holder.
        Ok(Released::Yes) if was_lost => Err(LockError::lost(key)),
        // Our token was still on the key: it never ran out, even if the
        // watchdog's last confirmation is older than a lease.
        Ok(Released::Yes) => {
            tracing::debug!(key = %key, fencing = held.fencing(),
                elapsed_us = started.elapsed().as_micros() as u64, "lock released");
            Ok(())
        }
        Ok(Released::Gone) if valid => {
            tracing::debug!(key = %key, fencing = held.fencing(),
                "lock released (the first answer was lost; a re-sent release found the key gone)");
            Ok(())
        }
        Ok(Released::Gone | Released::NotOurs) => {
            if !was_lost {
                crate::metrics::lost(&held.metrics);
            }
            held.lost.cancel();
            if valid {
                tracing::warn!(key = %key, fencing = held.fencing(),
                    "lock release: the key is not ours although the lease was valid \
                     (deleted by someone else, or lost in a failover)");
            } else if was_lost {
                // Its loss was told when it was found (one warning a lease).
                tracing::debug!(key = %key, fencing = held.fencing(),
                    "lock release: not the owner any more (the lease was lost before)");
            } else {
                tracing::warn!(key = %key, fencing = held.fencing(),
                    "lock release: not the owner any more (no renewal was confirmed in time)");
            }
            Err(LockError::lost(key))
        }
        // Reported lost before: whatever became of the release, the work
        // done under the lease may have overlapped another holder, which
        // is what `Lost` tells the caller.
        Err(e) if was_lost => {
            tracing::warn!(key = %key, error = &e as &dyn std::error::Error,
                "lock release failed, after the lease had been given up for lost");
            Err(LockError::lost(key))
        }
        Err(e) => {
            tracing::warn!(key = %key, error = &e as &dyn std::error::Error,
                "lock release failed; if it did not run, the lease will run out by itself");
            Err(e)
        }
    }
}

/// [`LockClient::shutdown`](crate::LockClient::shutdown): every lease
/// under this client's watchdog goes back to the server now, deleted (or
/// kept until its `hold_at_least`), its guard lost from here on (it holds
/// nothing); then the background releases in flight are waited for.
pub(crate) async fn give_back_all(inner: &Arc<Inner>) {
    for held in inner.watchdog.locks() {
        if held.end() {
            held.lost.cancel();
            retire(inner, &held, Instant::now());
            let decision = match held.keeps_for() {
                Some(left) => Decision::Keep(left),
                None => Decision::Delete,
            };
            // Sent as a dropped guard's release is: counted in flight.
            send_in_background(inner.clone(), &held, decision);
        }
    }
    inner.background_releases.idle().await;
}

/// What dropping an owning guard does, without blocking: the same
/// decision as [`release`], carried out on the current runtime (a
/// hand-on in a task: it may take a round trip to reserve fencing
/// tokens). Outside a runtime the lease runs out by itself.
pub(crate) fn release_dropped(inner: Arc<Inner>, held: Arc<Held>) {
    let now = Instant::now();
    let was_lost = held.is_lost_at(now);
    if !held.end() {
        return; // given back already, by `LockClient::shutdown`
    }
    let decision = decide(&inner, &held, was_lost);
    finish_in_background(inner, held, decision, now);
}

/// What is left of a release (or a dropped guard's) once `held` has ended
/// and `decision` is made, carried out on the current runtime without
/// blocking.
fn finish_in_background(inner: Arc<Inner>, held: Arc<Held>, decision: Decision, now: Instant) {
    if decision == Decision::HandOn
        && let Ok(runtime) = tokio::runtime::Handle::try_current()
    {
        let entered = inner.background_releases.enter();
        runtime.spawn(async move {
            if let Some(last) = hand_on(&inner, held).await {
                retire(&inner, &last, Instant::now());
                send_in_background(inner, &last, Decision::Delete);
            }
            drop(entered);
        });
        return;
    }
    retire(&inner, &held, now);
    send_in_background(inner, &held, decision);
}

/// What a [`release`] has left to do while its future may be dropped (a
/// `timeout` around `release()`, an aborted task): `(held, decision,
/// retired)`, carried out in the background then, so a release cancelled
/// midway leaves the key taken no longer than a dropped guard does (it
/// stayed taken for the rest of its lease).
struct Unfinished<'a> {
    inner: &'a Arc<Inner>,
    left: Option<(Arc<Held>, Decision, bool)>,
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        match self.left.take() {
            Some((held, decision, true)) => send_in_background(self.inner.clone(), &held, decision),
            Some((held, decision, false)) => {
                finish_in_background(self.inner.clone(), held, decision, Instant::now());
            }
            None => {}
        }
    }
}

/// [`send`] on the current runtime, without blocking: a delete is sent
/// again after connection failures (see [`release_in_background`]); a
/// keep goes once (re-sent once by `release_in` itself): sent later, it
/// would keep the key longer than asked.
fn send_in_background(inner: Arc<Inner>, held: &Arc<Held>, decision: Decision) {
    let Decision::Keep(_) = decision else {
        let (key, names) = (held.key.clone(), held.names.clone());
        release_in_background(inner, key, names, held.token, held.ttl, false);
        return;
    };
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return; // the lease runs out by itself, no sooner than asked
    };
    let held = held.clone();
    let entered = inner.background_releases.enter();
    runtime.spawn(async move {
        let _entered = entered;
        let key = &held.key;
        match send(&inner, &held, decision).await {
            Ok(Released::NotOurs) => {
                tracing::debug!(key = %key, "background release: the lock was not ours (any more)")
            }
            Ok(_) => tracing::debug!(key = %key, "lock kept until its hold_at_least"),
            Err(e) => tracing::warn!(key = %key, error = &e as &dyn std::error::Error,
                "background release (hold_at_least) failed; the lease runs out by itself"),
        }
    });
}

/// Releases the lock `key` (named `names`, owned by `token`) on the current
/// runtime without blocking, sent again under
/// [`Retry::RELEASE_IN_BACKGROUND`](crate::backoff::Retry::RELEASE_IN_BACKGROUND);
/// outside a runtime the lease runs out by itself. `dequeue`: also leave the key's
/// waiter queue. For leases no guard holds (an abandoned acquisition) and
/// dropped guards.
pub(crate) fn release_in_background(
    inner: Arc<Inner>,
    key: String,
    names: KeyNames,
    token: Token,
    ttl: Duration,
    dequeue: bool,
) {
    let lock = Abandoned {
        inner,
        key,
        lock: (names, token, ttl),
        dequeue,
    };
    if !backoff::release_in_background(lock) {
        tracing::debug!("lock dropped outside a tokio runtime; the lease will run out");
    }
}

/// A lease (or a place in the key's queue) that an acquisition may have
/// taken, or that nobody holds any more.
pub(super) struct Abandoned {
    pub(super) inner: Arc<Inner>,
    /// The key as the caller gave it.
    pub(super) key: String,
    /// Its names, its owner's token and its lease.
    pub(super) lock: (KeyNames, Token, Duration),
    /// Also leave the key's waiter queue.
    pub(super) dequeue: bool,
}

impl Release for Abandoned {
    const WHAT: &'static str = "background release";
    type Released = Released;

    fn background_releases(&self) -> &crate::backoff::BackgroundReleases {
        &self.inner.background_releases
    }

    fn release_once(&self) -> impl Future<Output = Result<Released, LockError>> + Send {
        let (names, token, ttl) = &self.lock;
        let lock = LockRef::new(names, token, *ttl);
        self.inner.backend.release(lock, self.dequeue)
    }

    fn report(&self, released: &Result<Released, LockError>) {
        let key = &self.key;
        match released {
            Ok(Released::Yes | Released::Gone) => {
                tracing::debug!(key = %key, "lock released in the background");
            }
            Ok(Released::NotOurs) => {
                tracing::debug!(key = %key, "background release: the lock was not ours (any more)");
            }
            Err(e) => tracing::warn!(key = %key, error = e as &dyn std::error::Error,
                "background release failed; if it did not run, the lease will run out"),
        }
    }
}
