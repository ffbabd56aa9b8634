//! The last step of every acquisition: a lease taken on the server becomes
//! a watched [`LockGuard`] ([`hold`]), whether one key's acquisition took it
//! or `lock_all`'s atomic step; an idempotency record's claim puts its
//! lease under the same watchdog ([`Watched`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::options::Asked;
use crate::client::LockGuard;
use crate::client::inner::Inner;
use crate::held::{AtomicInstant, Held};
use crate::key::{KeyNames, LockKind};
use crate::token::Token;

/// A lease just taken on the server.
pub(super) struct Taken {
    /// The key as the caller gave it.
    pub(super) key: String,
    pub(super) names: KeyNames,
    pub(super) token: Token,
    pub(super) fencing: u64,
    /// The send time of the request that set the lease, and the lease it
    /// set (shorter than the asked one after a hand-over).
    pub(super) sent: Instant,
    pub(super) granted: Duration,
    /// Handed over by a release (for the hand-over metric).
    pub(super) handover: bool,
}

/// Holds `taken`, as `asked`: its [`Held`], under the watchdog, and (a
/// mutex) holding its key's line of this client's waiters, which a wait
/// starts (see `Local::hold`).
pub(super) fn hold(inner: Arc<Inner>, taken: Taken, asked: &Asked) -> LockGuard {
    let Taken {
        key,
        names,
        token,
        fencing,
        sent,
        granted,
        handover,
    } = taken;
    let held = Arc::new(Held {
        id: inner.next_lock_id.fetch_add(1, Ordering::Relaxed),
        client_id: inner.id,
        key,
        names,
        token,
        fencing: fencing.into(),
        mint: (fencing == 0).then(|| inner.backend.clone()),
        ttl: asked.ttl,
        lost: Default::default(),
        ended: Default::default(),
        // Set by the watchdog as it takes the lease under watch.
        valid_until: AtomicInstant::new(sent),
        metrics: asked.metrics.clone(),
        since: sent,
        // From now, when the answer is in: the server set the key before
        // that, so it stays taken at least this long after it did.
        hold_until: (!asked.hold_at_least.is_zero()).then(|| Instant::now() + asked.hold_at_least),
    });
    crate::metrics::acquired(&asked.metrics, asked.deadline.started(), handover);
    inner
        .watchdog
        .watch(held.clone(), asked.renew, sent, granted);
    if held.names.kind == LockKind::Mutex && !held.names.is_leader() {
        inner
            .local
            .hold(&held, asked.renew, !asked.deadline.tries_once());
    }
    // The wait read from the clock only if this is logged.
    tracing::debug!(key = %held.key, fencing,
        waited_us = asked.deadline.started().elapsed().as_micros() as u64, "lock acquired");
    LockGuard::owner(held, inner)
}

/// An idempotency record's lease under the watchdog, put there as [`hold`]
/// puts a lock's: dropped, the watchdog lets it go and its hold time is
/// counted for the records' retry hints, as a lock's release counts a lock's
/// for the locks'.
#[cfg(feature = "idempotency")]
pub(crate) struct Watched {
    inner: Arc<Inner>,
    lease: Arc<crate::watchdog::RecordLease>,
    id: u64,
    /// The send time of the claim that set the lease; `None` once its
    /// hold time is counted.
    since: Option<Instant>,
}

#[cfg(feature = "idempotency")]
impl Watched {
    /// Watches the record `record` that `token` claimed for `ttl`, by a
    /// claim sent at `sent`: renewed every `ttl / 3` until dropped.
    pub(crate) fn record(
        inner: &Arc<Inner>,
        record: &str,
        token: Token,
        ttl: Duration,
        sent: Instant,
    ) -> Self {
        let id = inner.next_lock_id.fetch_add(1, Ordering::Relaxed);
        let record = record.to_owned();
        let lost = crate::held::Lost::default();
        let lease = Arc::new(crate::watchdog::RecordLease {
            record,
            token,
            lost,
        });
        inner.watchdog.watch_record(id, lease.clone(), ttl, sent);
        let (inner, since) = (inner.clone(), Some(sent));
        Self {
            inner,
            lease,
            id,
            since,
        }
    }

    /// Resolves once the server said the record is not ours any more.
    pub(crate) async fn lost(&self) {
        self.lease.lost.cancelled().await
    }

    /// `true` once the server said the record is not ours any more.
    pub(crate) fn is_lost(&self) -> bool {
        self.lease.lost.is_cancelled()
    }

    /// Counts the hold time now, if not yet: the record is settled, though
    /// its renewal may run on until the answer (a completion's).
    pub(crate) fn settled(&mut self) {
        if let Some(since) = self.since.take() {
            self.inner
                .record_hints
                .held(&self.lease.record, since.elapsed());
        }
    }
}

#[cfg(feature = "idempotency")]
impl Drop for Watched {
    fn drop(&mut self) {
        self.inner.watchdog.unwatch_record(self.id);
        self.settled();
    }
}
