//! Keeps a lease alive and says when it is lost.
//!
//! Validity is measured on the monotonic clock from the *send* time of the last
//! confirmed acquire or extension: the server set its expiry no earlier than
//! that, so `sent + ttl` is a safe lower bound on when the lease ends. If no
//! extension is confirmed by then, or the server answers "not owner", the lease
//! is lost.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::{sleep_until, timeout, Instant};

use crate::client::Inner;
use crate::guard::{Held, Lease};

/// Spawns the watchdog of `held`, acquired with a request sent at `sent`.
pub(crate) fn spawn(inner: &Arc<Inner>, held: &Arc<Held>, lease: Lease, sent: Instant) {
    inner.live_watchdogs.fetch_add(1, Ordering::Relaxed);
    let live = Live(Arc::downgrade(inner));
    let weak = Arc::downgrade(inner);
    let held = held.clone();
    tokio::spawn(async move {
        let _live = live;
        tokio::select! {
            _ = held.stop.cancelled() => {}
            _ = run(weak, &held, lease, sent) => {}
        }
    });
}

/// Decrements the live-watchdog count when the task ends, however it ends.
struct Live(Weak<Inner>);

impl Drop for Live {
    fn drop(&mut self) {
        if let Some(inner) = self.0.upgrade() {
            inner.live_watchdogs.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

async fn run(client: Weak<Inner>, held: &Held, lease: Lease, sent: Instant) {
    let ttl = lease.ttl;
    let mut valid_until = sent + ttl;
    if !lease.renew {
        sleep_until(valid_until).await;
        lose(held, "the fixed lease (renew = false) ran out");
        return;
    }
    let period = ttl / 3;
    // After a failed renewal, retry this often until the lease may have ended.
    let retry = (ttl / 30).max(Duration::from_millis(5));
    let mut next = sent + period;
    loop {
        sleep_until(next).await;
        let Some(inner) = client.upgrade() else {
            return; // the client is gone; the lease runs out by itself
        };
        let sent = Instant::now();
        if sent >= valid_until {
            lose(held, "no renewal was confirmed before the lease may have run out");
            return;
        }
        let answer = timeout(
            valid_until - sent,
            inner.backend.extend(&held.names, &held.token, ttl),
        )
        .await;
        drop(inner);
        match answer {
            Ok(Ok(true)) => {
                valid_until = sent + ttl;
                next = sent + period;
                tracing::trace!(key = %held.key, "lease renewed");
            }
            Ok(Ok(false)) => {
                lose(held, "the server says the lock is not ours any more");
                return;
            }
            Ok(Err(e)) => {
                tracing::debug!(key = %held.key, error = %e, "lease renewal failed; retrying");
                next = Instant::now() + retry;
            }
            Err(_) => {
                lose(held, "no renewal was confirmed before the lease may have run out");
                return;
            }
        }
        if next >= valid_until {
            next = valid_until;
        }
    }
}

fn lose(held: &Held, why: &str) {
    tracing::warn!(key = %held.key, fencing = held.fencing, "lock lost: {why}");
    held.lost.cancel();
}
