//! Handing a lease on within the client, and giving leases back in the
//! background: what the guard's release and drop do with the lines of
//! [`local`](super::local).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::blocks::BLOCK;
use super::local::{Local, MARGIN, Owner};
use crate::backend::Released;
use crate::held::Held;
use crate::inner::Inner;
use crate::key::KeyNames;
use crate::token::Token;

/// How long a background release keeps trying after connection failures
/// (a server paused or failing over), and the pauses between its tries.
const BACKGROUND_RETRY_FOR: Duration = Duration::from_secs(30);
const BACKGROUND_BACKOFF: crate::backoff::Backoff =
    crate::backoff::Backoff::new(Duration::from_millis(100), Duration::from_secs(2));

impl Owner for Inner {
    fn lines(&self) -> &Local {
        &self.local
    }

    fn give_back(self: Arc<Self>, held: Arc<Held>) {
        give_back(self, held);
    }
}

/// Before `held` goes back to the server: its line goes there too, the
/// watchdog lets it go, and its hold time is counted.
pub(crate) fn retire(inner: &Inner, held: &Arc<Held>) {
    inner.local.end(held);
    inner.watchdog.unwatch(held.id);
    crate::metrics::released(&held.metrics, held.since.elapsed());
}

/// What dropping an owning guard does: the lease goes to a local waiter
/// (in a task: handing on may take a round trip to reserve fencing
/// tokens), or back to the server, without blocking.
pub(crate) fn give_back(inner: Arc<Inner>, held: Arc<Held>) {
    if !held.is_lost()
        && held.keeps_until(Instant::now()).is_none()
        && inner.local.has_waiters(&held)
        && let Ok(runtime) = tokio::runtime::Handle::try_current()
    {
        runtime.spawn(async move {
            if let Some(last) = hand_on(&inner, held).await {
                release_held_in_background(inner, &last);
            }
        });
        return;
    }
    release_held_in_background(inner, &held);
}

/// Hands the lease of `held` to the next local waiter, as many times as it
/// takes to find one that still waits. `None`: handed on. `Some(held)`:
/// nobody to hand on to (or the lease is no longer sure, or somebody queued
/// on the server): the caller releases `held` (the last holder) to the
/// server, after [`Local::end`].
pub(crate) async fn hand_on(inner: &Arc<Inner>, mut held: Arc<Held>) -> Option<Arc<Held>> {
    let local = &inner.local;
    // The first token of a block just reserved. It is used whatever the
    // round trip took: nobody was queued on the server when the block was
    // reserved, and with a server more than `BLOCK_FOR` away every block
    // would otherwise be stale on arrival and the holder would reserve
    // block after block, never handing on nor releasing.
    let mut fresh = None;
    loop {
        if !local.has_waiters(&held) || !held.valid_at(Instant::now() + MARGIN) {
            return Some(held);
        }
        let taken = match fresh.take() {
            Some(first) => Some(first),
            None => local.take_token(&held).map(|(token, prefetch)| {
                if prefetch {
                    self::prefetch(inner, &held);
                }
                token
            }),
        };
        let Some(fencing) = taken else {
            let sent = Instant::now();
            match inner
                .backend
                .reserve(&held.names, &held.token, held.ttl, BLOCK)
                .await
            {
                Ok(Some(top)) => {
                    fresh = local.set_block(&held, top, sent);
                    continue;
                }
                Ok(None) => return Some(held),
                Err(e) => {
                    tracing::debug!(key = %held.key, error = &e as &dyn std::error::Error,
                        "reserving fencing tokens for a local hand-over failed; releasing");
                    return Some(held);
                }
            }
        };
        let Some((waiter, next)) = local.pass(&held, |waiter| {
            Arc::new(Held {
                id: held.id,
                client_id: held.client_id,
                key: held.key.clone(),
                names: held.names.clone(),
                token: held.token,
                fencing,
                ttl: held.ttl,
                lost: CancellationToken::new(),
                valid_until: std::sync::Mutex::new(held.valid_until()),
                metrics: waiter.metrics.clone(),
                since: Instant::now(),
                hold_until: None,
            })
        }) else {
            return Some(held);
        };
        if !inner.watchdog.hand_on(next.clone()) {
            // Lost meanwhile: the waiter goes to the server.
            local.end(&next);
            return Some(next);
        }
        crate::metrics::released(&held.metrics, held.since.elapsed());
        crate::metrics::acquired(&next.metrics, waiter.started.elapsed(), true);
        tracing::debug!(key = %next.key, fencing, "lock handed on within the client");
        match local.give(waiter, next) {
            Ok(()) => return None,
            // Gone since: the lease is still ours; hand it on again.
            Err(next) => held = next,
        }
    }
}

/// Reserves the next block of `held`'s line in the background, while the
/// chain goes on with the current one: a chain of short holds does not stop
/// for a round trip every [`BLOCK`] hand-overs. The same check as a
/// reservation in line: granted only while nobody is queued on the server.
fn prefetch(inner: &Arc<Inner>, held: &Arc<Held>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let inner = inner.clone();
    let (key, names, token, ttl) = (held.key.clone(), held.names.clone(), held.token, held.ttl);
    runtime.spawn(async move {
        let sent = Instant::now();
        let top = match inner.backend.reserve(&names, &token, ttl, BLOCK).await {
            Ok(top) => top.map(|top| (top, sent)),
            Err(e) => {
                tracing::debug!(key = %key, error = &e as &dyn std::error::Error,
                    "reserving fencing tokens ahead failed");
                None
            }
        };
        inner.local.set_next_block(&key, &token, top);
    });
}

/// Stops watching `held` and releases it on the current runtime without
/// blocking (see [`release_in_background`]).
pub(crate) fn release_held_in_background(inner: Arc<Inner>, held: &Arc<Held>) {
    retire(&inner, held);
    if let Some(left) = held.keeps_until(Instant::now()) {
        keep_in_background(inner, held, left);
        return;
    }
    release_in_background(
        inner,
        held.key.clone(),
        held.names.clone(),
        held.token,
        held.ttl,
        false,
    );
}

/// `hold_at_least` at a release in the background: the key's lease is set to
/// end `left` from now instead of the key being deleted.
fn keep_in_background(inner: Arc<Inner>, held: &Arc<Held>, left: Duration) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return; // the lease runs out by itself, no sooner than asked
    };
    let (key, names, token) = (held.key.clone(), held.names.clone(), held.token);
    runtime.spawn(async move {
        match inner.backend.release_in(&names, &token, left).await {
            Ok(true) => tracing::debug!(key = %key, "lock kept until its hold_at_least"),
            Ok(false) => {
                tracing::debug!(key = %key, "background release: the lock was not ours (any more)")
            }
            Err(e) => tracing::warn!(key = %key, error = &e as &dyn std::error::Error,
                "background release (hold_at_least) failed; the lease runs out by itself"),
        }
    });
}

/// Releases the lock `key` (named `names`, owned by `token`) on the current
/// runtime without blocking; outside a runtime the lease runs out by itself.
/// `dequeue`: also leave the key's waiter queue.
pub(crate) fn release_in_background(
    inner: Arc<Inner>,
    key: String,
    names: KeyNames,
    token: Token,
    ttl: Duration,
    dequeue: bool,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::debug!(key = %key, "lock dropped outside a tokio runtime; the lease will run out");
        return;
    };
    runtime.spawn(async move {
        // A release that could not reach the server is sent again for a
        // while: a queue entry left behind would be handed the key on every
        // release ahead of it (each costing a hand-over lease), and a lock
        // that was ours would wait out its lease.
        let mut backoff = BACKGROUND_BACKOFF;
        let give_up = Instant::now() + BACKGROUND_RETRY_FOR;
        loop {
            match inner.backend.release(&names, &token, ttl, dequeue).await {
                Ok(Released::Yes | Released::Gone) => {
                    tracing::debug!(key = %key, "lock released in the background");
                }
                Ok(Released::NotOurs) => {
                    tracing::debug!(key = %key, "background release: the lock was not ours (any more)");
                }
                Err(crate::LockError::Backend(e))
                    if e.is_connection() && Instant::now() + backoff.peek() < give_up =>
                {
                    tracing::debug!(key = %key, error = &e as &dyn std::error::Error,
                        "background release failed; trying again");
                    backoff.wait().await;
                    continue;
                }
                Err(e) => tracing::warn!(key = %key, error = &e as &dyn std::error::Error,
                    "background release failed; if it did not run, the lease will run out"),
            }
            return;
        }
    });
}
