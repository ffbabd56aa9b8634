//! Handing a lease on within the client: what a release (see
//! [`release`](super::release)) does with the lines of
//! [`local`](super::local) when a task of this client waits for the key.

use std::sync::Arc;

use tokio::time::Instant;

use super::blocks::BLOCK;
use super::local::MARGIN;
use crate::backend::LockRef;
use crate::client::inner::Inner;
use crate::held::{AtomicInstant, Held};

/// Hands the lease of `held` to the next local waiter, as many times as it
/// takes to find one that still waits. `None`: handed on. `Some(held)`:
/// nobody to hand on to (or the lease is no longer sure, or somebody queued
/// on the server): the caller releases `held` (the last holder) to the
/// server, after [`Local::end`](super::local::Local::end).
pub(super) async fn hand_on(inner: &Arc<Inner>, mut held: Arc<Held>) -> Option<Arc<Held>> {
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
                .reserve(LockRef::new(&held.names, &held.token, held.ttl), BLOCK)
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
                fencing: fencing.into(),
                mint: None,
                ttl: held.ttl,
                lost: Default::default(),
                ended: Default::default(),
                valid_until: AtomicInstant::new(held.valid_until()),
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
        let (held_for, kept) = held.hold_times(Instant::now());
        crate::metrics::released(&held.metrics, held_for);
        inner.hints.held(&held.key, kept);
        crate::metrics::acquired(&next.metrics, waiter.started, true);
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
        let top = match inner
            .backend
            .reserve(LockRef::new(&names, &token, ttl), BLOCK)
            .await
        {
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
