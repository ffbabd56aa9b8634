//! One acquisition's lease, as the guard, the watchdog and the task's
//! reentrancy stack share it: [`Held`].

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::Backend;
use crate::error::LockError;
use crate::key::KeyNames;
use crate::token::Token;

/// What is shared between a guard, its watchdog and the task's reentrancy stack.
pub(crate) struct Held {
    /// Unique within the client: the watchdog's handle on it.
    pub(crate) id: u64,
    pub(crate) client_id: u64,
    pub(crate) key: String,
    pub(crate) names: KeyNames,
    pub(crate) token: Token,
    /// The fencing token; 0 until minted (a lock taken free on Redis gets
    /// its token when somebody first asks: [`Held::fencing_token`]).
    pub(crate) fencing: AtomicU64,
    /// Where a token is minted on first use; `None` when it was issued at
    /// acquire.
    pub(crate) mint: Option<Backend>,
    /// The lease asked for (and renewed to).
    pub(crate) ttl: Duration,
    /// Cancelled when the lease is lost.
    pub(crate) lost: Lost,
    /// Set when its holder releases it (or drops its guard): from then on
    /// the passing of its deadline is no loss (see [`Held::end`]).
    pub(crate) ended: AtomicBool,
    /// Until when the lease is surely ours, on the monotonic clock: the send
    /// time of the last confirmed acquire or renewal plus its lease (less
    /// drift). Kept by the watchdog; read at release and when work ends.
    pub(crate) valid_until: AtomicInstant,
    /// The `name` label of its metrics (empty without the `metrics` feature).
    pub(crate) metrics: crate::metrics::Name,
    /// When it was acquired, for the hold-time metric.
    pub(crate) since: Instant,
    /// `hold_at_least`: a release before this keeps the key taken until
    /// then (its lease is set to end there) instead of deleting it.
    pub(crate) hold_until: Option<Instant>,
}

impl Held {
    /// The fencing token if it is known already (issued at acquire, or
    /// minted): for logs, and for the locks that always have one (leader
    /// terms).
    pub(crate) fn fencing(&self) -> Option<u64> {
        Some(self.fencing.load(Ordering::Acquire)).filter(|&f| f != 0)
    }

    /// The fencing token: the one issued at acquire, or minted now by an
    /// atomic step that checks the lock is still ours. `Lost` (and the
    /// lease marked lost) when it is not: a holder whose lease ended never
    /// gets a token. Asked again after a lost reply, the server mints a
    /// higher one, also while ours; the first token stored here is kept.
    pub(crate) async fn fencing_token(&self) -> Result<u64, LockError> {
        // Lost, or ended (released, or handed on to another task of this
        // client, which shares the server's key and gets the next tokens):
        // `Lost`, even when the token is known (minted before, or given at
        // a hand-over or by Redlock), so a holder that asks before each
        // write stops writing once its lease ended, on every backend alike;
        // and a token minted now would rise above the next holder's.
        if self.is_lost() || self.ended() {
            return Err(LockError::lost(&self.key));
        }
        if let Some(known) = self.fencing() {
            return Ok(known);
        }
        let Some(backend) = &self.mint else {
            return Err(crate::error::BackendError::new("the lock has no fencing token").into());
        };
        // Sent again once if its answer was lost: a copy that ran minted a
        // token while the lock was ours, and the next one only rises above it.
        let minted = crate::backoff::Retry::ONCE
            .start()
            .send("fencing token", None, || {
                backend.mint(&self.names, &self.token)
            })
            .await?;
        let Some(minted) = minted else {
            self.lose("the server says the lock is not ours (asked for its fencing token)");
            return Err(LockError::lost(&self.key));
        };
        if self.ended() {
            return Err(LockError::lost(&self.key));
        }
        Ok(
            match self
                .fencing
                .compare_exchange(0, minted, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => minted,
                // Minted twice at once (re-entered guards): the first kept.
                Err(first) => first,
            },
        )
    }

    /// Marks the lease lost, `why`, unless it is known already.
    pub(crate) fn lose(&self, why: &str) {
        // Told once, by whoever finds it first (the watchdog and a guard
        // reading its deadline may both), and before anyone waiting on
        // `lost()` is woken.
        if self.lost.tell() {
            tracing::warn!(key = %self.key, fencing = self.fencing(), "lock lost: {why}");
            crate::metrics::lost(&self.metrics);
        }
        self.lost.cancel();
    }

    /// `true` while the lease is surely ours: not reported lost, and `at`
    /// before the end of the last confirmed lease.
    pub(crate) fn valid_at(&self, at: Instant) -> bool {
        !self.lost.is_cancelled() && at < self.valid_until()
    }

    /// `true` once the lease is lost: reported lost (by the watchdog, or a
    /// release that found the key not ours), or past the end of the last
    /// confirmed lease, whatever became of the task that should have renewed
    /// it. The latter marks it lost, so that it stays lost (a renewal
    /// confirmed later changes nothing: work may have gone on meanwhile).
    /// Once the holder ended it ([`Held::end`]), only a release that found
    /// the key not ours makes it lost.
    pub(crate) fn is_lost(&self) -> bool {
        self.is_lost_at(Instant::now())
    }

    /// [`Held::is_lost`] at `now` (a release reads the clock once for
    /// this, its hold times and its lease's validity).
    pub(crate) fn is_lost_at(&self, now: Instant) -> bool {
        if self.lost.is_cancelled() {
            return true;
        }
        if !self.ended() && now >= self.valid_until() {
            self.lose_at_deadline();
            return true;
        }
        false
    }

    /// Resolves once [`Held::is_lost`]: on the watchdog's word, or at the end
    /// of the last confirmed lease (re-armed each time a renewal moves it on),
    /// on the runtime that polls it, so a watchdog that died with its runtime
    /// cannot keep it pending. Once the holder ended the lease, it resolves
    /// only if the release found the key not ours (it was lost before).
    pub(crate) fn lost(self: &Arc<Self>) -> impl Future<Output = ()> + Send + use<> {
        let held = self.clone();
        async move {
            loop {
                if held.is_lost() {
                    return;
                }
                if held.ended() {
                    return held.lost.cancelled().await;
                }
                let deadline = held.valid_until();
                tokio::select! {
                    () = held.lost.cancelled() => return,
                    () = tokio::time::sleep_until(deadline) => {}
                }
            }
        }
    }

    /// The holder lets the lease go (a release, or a dropped guard): the end
    /// of its deadline is no loss any more (no warning, no lost-lease
    /// metric, and a kept `lost()` future does not resolve for it). Called
    /// after the release read [`Held::is_lost`], so a loss before the
    /// release is still reported.
    /// `true` for the call that ended it (a guard's release and
    /// `LockClient::shutdown` each give a lease back once, whichever comes
    /// first).
    pub(crate) fn end(&self) -> bool {
        // Sequentially consistent with `ended_or_lost`'s watch: either it
        // sees the end, or this sees it watching and wakes it.
        let first = !self.ended.swap(true, Ordering::SeqCst);
        self.lost.wake_end_watchers();
        first
    }

    /// The holder let the lease go ([`Held::end`]).
    pub(crate) fn ended(&self) -> bool {
        self.ended.load(Ordering::SeqCst)
    }

    /// Resolves once the lease is lost or its holder let it go: what a
    /// re-entered guard waits for, as it holds nothing once the guard it
    /// re-entered is released.
    pub(crate) fn ended_or_lost(self: &Arc<Self>) -> impl Future<Output = ()> + Send + use<> {
        let held = self.clone();
        async move {
            held.lost.end_watched.store(true, Ordering::SeqCst);
            loop {
                let notified = held.lost.notify.notified();
                let mut notified = std::pin::pin!(notified);
                // Registered before the look, so an end or a loss after it
                // wakes us.
                notified.as_mut().enable();
                if held.ended() || held.is_lost() {
                    return;
                }
                let deadline = held.valid_until();
                tokio::select! {
                    () = notified => {}
                    () = tokio::time::sleep_until(deadline) => {}
                }
            }
        }
    }

    /// Marks the lease lost because its deadline passed unconfirmed.
    fn lose_at_deadline(&self) {
        self.lose("no renewal was confirmed before the lease may have run out");
    }

    /// `hold_at_least`: how much longer the key must stay taken after a
    /// release now (`None`: none; a release may delete it). The clock is
    /// read only for a hold with a `hold_at_least`.
    pub(crate) fn keeps_for(&self) -> Option<Duration> {
        self.hold_until
            .map(|until| until.saturating_duration_since(Instant::now()))
            .filter(|left| !left.is_zero())
    }

    /// How long this hold lasted at a release at `now` (from the request
    /// that set the lease), and how long it kept the key from others: to
    /// `now`, or to the end of `hold_at_least` if later.
    pub(crate) fn hold_times(&self, now: Instant) -> (Duration, Duration) {
        let held = now.saturating_duration_since(self.since);
        let kept = self.hold_until.unwrap_or(now).max(now) - self.since;
        (held, kept)
    }

    pub(crate) fn valid_until(&self) -> Instant {
        self.valid_until.load()
    }

    pub(crate) fn set_valid_until(&self, at: Instant) {
        self.valid_until.store(at);
    }
}

/// An instant kept in one atomic word (no lock to read or set it): the
/// nanoseconds from the first instant any was made from in this process,
/// signed, so that an earlier one (a send time read before that, or a
/// paused test clock's) is kept exactly too (292 years either way).
pub(crate) struct AtomicInstant(AtomicI64);

impl AtomicInstant {
    pub(crate) fn new(at: Instant) -> Self {
        Self(AtomicI64::new(Self::nanos(at)))
    }

    pub(crate) fn load(&self) -> Instant {
        let nanos = self.0.load(Ordering::Acquire);
        let from_base = Duration::from_nanos(nanos.unsigned_abs());
        if nanos >= 0 {
            Self::base() + from_base
        } else {
            Self::base() - from_base
        }
    }

    pub(crate) fn store(&self, at: Instant) {
        self.0.store(Self::nanos(at), Ordering::Release);
    }

    fn base() -> Instant {
        static BASE: OnceLock<Instant> = OnceLock::new();
        *BASE.get_or_init(Instant::now)
    }

    fn nanos(at: Instant) -> i64 {
        let base = Self::base();
        let nanos = |d: Duration| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
        match at.checked_duration_since(base) {
            Some(after) => nanos(after),
            None => -nanos(base - at),
        }
    }
}

impl fmt::Debug for AtomicInstant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.load().fmt(f)
    }
}

impl fmt::Debug for Held {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Held")
            .field("key", &self.key)
            .field("fencing", &self.fencing())
            .field("lost", &self.lost.is_cancelled())
            .finish_non_exhaustive()
    }
}

/// Set once, when a lease is lost, and waited on by its `lost()` futures:
/// what a `CancellationToken` would do here, inline in [`Held`] (no
/// allocation and no lock per lease, which every lock pays).
#[derive(Debug, Default)]
pub(crate) struct Lost {
    set: AtomicBool,
    notify: tokio::sync::Notify,
    /// Somebody waits for the lease's end too ([`Held::ended_or_lost`]):
    /// only then does an end wake the waiters (most leases have none).
    end_watched: AtomicBool,
    /// The loss was told (logged and counted) already.
    told: AtomicBool,
}

impl Lost {
    pub(crate) fn is_cancelled(&self) -> bool {
        self.set.load(Ordering::Acquire)
    }

    /// Sets it, and wakes every future waiting in [`Lost::cancelled`].
    pub(crate) fn cancel(&self) {
        if !self.set.swap(true, Ordering::AcqRel) {
            self.notify.notify_waiters();
        }
    }

    /// `true` for the first caller: the one that tells of the loss.
    fn tell(&self) -> bool {
        !self.told.swap(true, Ordering::AcqRel)
    }

    /// Wakes the futures of [`Held::ended_or_lost`], if any watch.
    fn wake_end_watchers(&self) {
        if self.end_watched.load(Ordering::SeqCst) {
            self.notify.notify_waiters();
        }
    }

    /// Resolves once it is set.
    pub(crate) async fn cancelled(&self) {
        loop {
            let notified = self.notify.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the look, so a `cancel` after it wakes us.
            notified.as_mut().enable();
            if self.is_cancelled() {
                return;
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::time::Instant;

    use super::{AtomicInstant, Lost};

    #[test]
    fn an_atomic_instant_reads_back_what_was_stored() {
        let kept = AtomicInstant::new(Instant::now()); // the process's first, maybe
        let now = Instant::now();
        kept.store(now);
        assert_eq!(kept.load(), now);
        for at in [
            now + Duration::from_nanos(1),
            now + Duration::from_secs(7 * 86_400),
        ] {
            kept.store(at);
            assert_eq!(kept.load(), at);
        }
        // Before the first instant stored in the process: kept exactly too.
        for ago in [Duration::from_nanos(1), Duration::from_secs(3600)] {
            if let Some(earlier) = now.checked_sub(ago) {
                kept.store(earlier);
                assert_eq!(kept.load(), earlier);
            }
        }
    }

    #[tokio::test]
    async fn every_wait_on_a_lost_flag_ends_once_it_is_set_and_later_ones_at_once() {
        let lost = Arc::new(Lost::default());
        let waits: Vec<_> = (0..3)
            .map(|_| {
                let lost = lost.clone();
                tokio::spawn(async move { lost.cancelled().await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!lost.is_cancelled());
        assert!(
            waits.iter().all(|w| !w.is_finished()),
            "ended before the loss"
        );
        lost.cancel();
        for wait in waits {
            tokio::time::timeout(Duration::from_secs(5), wait)
                .await
                .expect("a wait outlived the loss")
                .unwrap();
        }
        assert!(lost.is_cancelled());
        // Set twice: still set; a wait that starts now ends at once.
        lost.cancel();
        tokio::time::timeout(Duration::from_secs(5), lost.cancelled())
            .await
            .expect("a wait after the loss did not end");
    }
}
