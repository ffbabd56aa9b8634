//! Where locks live. One enum, so the hot path is a match, not a virtual call.

use std::sync::Arc;
use std::time::Duration;

use crate::error::LockError;
use crate::key::{KeyNames, LockKind};
use crate::token::Token;

mod all;
#[cfg(feature = "tls")]
pub(crate) mod certificates;
pub(crate) mod conn;
mod force;
pub(crate) mod inspect;
pub(crate) mod labels;
mod leaders;
pub(crate) mod memory;

mod notifier;
pub(crate) mod open;
pub(crate) mod records;
pub(crate) mod redis;
pub(crate) mod redlock;
pub(crate) mod scan;
mod scripts;
pub(crate) mod waiters;

pub(crate) use all::{AllOutcome, AtomicSteps};
pub(crate) use leaders::LeaderEntry;
pub(crate) use waiters::WaitHandle;

/// The lease a waiter gets when a release hands the lock to it (capped by the
/// lease it asked for). Its watchdog renews it to the full lease at once; if
/// the waiter died meanwhile, the key is free again after at most this long.
pub(crate) const HANDOFF_LEASE: Duration = Duration::from_secs(2);

/// The most leases one batched renewal call carries.
pub(crate) const RENEW_BATCH: usize = 100;

/// A lock as the backends' operations name it: its keys, its owner and its
/// lease.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LockRef<'a> {
    pub(crate) names: &'a KeyNames,
    pub(crate) token: &'a Token,
    pub(crate) ttl: Duration,
}

impl<'a> LockRef<'a> {
    pub(crate) fn new(names: &'a KeyNames, token: &'a Token, ttl: Duration) -> Self {
        Self { names, token, ttl }
    }
}

/// The answer of one acquire attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AcquireOutcome {
    /// Ours, with this fencing token.
    Acquired { fencing: u64 },
    /// Held by someone else for at most `remaining`. `fence`: the fencing
    /// counter the attempt saw (0 where not reported). A hand-over granted
    /// after this attempt carries a higher token; one with a token at most
    /// this was sent before the attempt, and is stale (its lease ran out
    /// and someone else took the key).
    Busy { remaining: Duration, fence: u64 },
}

/// The answer of one release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Released {
    /// It was ours; it is released (and handed to the next waiter).
    Yes,
    /// It was not ours when the release ran, and no earlier copy of this
    /// release can have run: someone else deleted or took the key.
    NotOurs,
    /// It was not ours when the release ran, but an earlier copy of it was
    /// sent and its answer lost (a dropped connection, or a driver that
    /// re-sends by itself), so that copy may have released it. If the lease
    /// was still valid when the release was sent, nobody else can have taken
    /// the key: the release is what removed it.
    Gone,
}

/// The store behind idempotency records.
#[cfg_attr(not(feature = "idempotency"), allow(dead_code))]
pub(crate) enum RecordsAt<'a> {
    Redis(&'a redis::RedisBackend),
    Redlock(&'a redlock::RedlockBackend),
    Memory(&'a memory::MemoryBackend),
}

#[derive(Clone, Debug)]
pub(crate) enum Backend {
    Redis(Arc<redis::RedisBackend>),
    Memory(Arc<memory::MemoryBackend>),
    Redlock(Arc<redlock::RedlockBackend>),
}

impl Backend {
    /// One attempt; `wait` (zero: try once) is how long the caller will
    /// wait from now, the length of its place in line.
    pub(crate) async fn acquire(
        &self,
        lock: LockRef<'_>,
        wait: Duration,
    ) -> Result<AcquireOutcome, LockError> {
        match self {
            Backend::Redis(b) => b.acquire(lock, wait).await,
            // Boxed here and below: the other backends' futures do not
            // carry the state of a vote over several servers.
            Backend::Redlock(b) => Box::pin(b.acquire(lock)).await,
            Backend::Memory(b) => Ok(b.acquire(lock.names, lock.token, lock.ttl, wait)),
        }
    }

    pub(crate) async fn extend(&self, lock: LockRef<'_>) -> Result<bool, LockError> {
        let LockRef { names, token, ttl } = lock;
        match self {
            Backend::Redis(b) => b.extend(lock).await,
            // One lease through the batched call (a majority decides).
            Backend::Redlock(b) => {
                match Box::pin(b.extend_many(&[(names, token, ttl)])).await?[0] {
                    Some(extended) => Ok(extended),
                    None => Err(crate::error::BackendError::outcome_unknown(
                        "Redlock: the renewal found no majority either way",
                        None,
                    )
                    .into()),
                }
            }
            Backend::Memory(b) => Ok(b.extend(names, token, ttl)),
        }
    }

    /// Releases if `token` holds the lock and hands it to the next waiter.
    /// `dequeue`: the caller may have queued (an abandoned wait): leave the line.
    /// An error whose outcome is unknown (the request went out, no answer came
    /// back) is [`crate::BackendError::is_outcome_unknown`].
    pub(crate) async fn release(
        &self,
        lock: LockRef<'_>,
        dequeue: bool,
    ) -> Result<Released, LockError> {
        match self {
            Backend::Redis(b) => b.release(lock, dequeue, false).await,
            Backend::Redlock(b) => Box::pin(b.release(lock)).await,
            Backend::Memory(b) => Ok(if b.release(lock.names, lock.token, dequeue) {
                Released::Yes
            } else {
                Released::NotOurs
            }),
        }
    }

    /// The release of a held lock: as [`Backend::release`] (without leaving
    /// a line), where a lock taken by a plain `SET` (`plain`) is first
    /// released by the plain compare-and-delete (`redis/plain.rs`).
    pub(crate) async fn release_held(
        &self,
        lock: LockRef<'_>,
        plain: bool,
    ) -> Result<Released, LockError> {
        match self {
            Backend::Redis(b) => b.release(lock, false, plain).await,
            _ => self.release(lock, false).await,
        }
    }

    /// A release under `hold_at_least`, `left` from now: the lease of `token` is set to end
    /// `left` from now instead of the key being deleted, and the key's
    /// waiters are told (a free notice: they try again and learn the
    /// shorter lease, instead of sleeping out the one they last saw).
    /// `false`: not ours.
    pub(crate) async fn release_in(
        &self,
        names: &KeyNames,
        token: &Token,
        left: Duration,
    ) -> Result<bool, LockError> {
        // Sent again after a connection failure (it only sets the end of
        // our own lease, so a copy that ran does no harm): otherwise the key
        // would stay taken for the rest of its full lease.
        let ours = crate::backoff::Retry::ONCE
            .start()
            .send("release (hold_at_least)", None, || {
                self.extend(LockRef::new(names, token, left))
            })
            .await?;
        if ours {
            match self {
                Backend::Redis(b) => b.announce(names.notice()).await,
                Backend::Redlock(b) => b.announce(names.notice()).await,
                Backend::Memory(b) => b.announce(names.notice()),
            }
        }
        Ok(ours)
    }

    /// Mints the fencing token of the lock `token` holds as `names`, on
    /// first use (see `redis/plain.rs`): the token, or `None` when the lock
    /// is not ours. On Redis a newcomer that finds a lock free takes it
    /// without a token (a mutex by the plain `SET`, a read-write lock or a
    /// semaphore by shared.lua); Redlock and the embedded backend issue
    /// theirs at acquire.
    pub(crate) async fn mint(
        &self,
        names: &KeyNames,
        token: &Token,
    ) -> Result<Option<u64>, LockError> {
        match self {
            Backend::Redis(b) => b.mint(names, token).await,
            Backend::Redlock(_) | Backend::Memory(_) => Err(crate::error::BackendError::new(
                "this backend issues fencing tokens at acquire; none was issued",
            )
            .into()),
        }
    }

    /// Whether locks of `kind` are offered here: everywhere but on
    /// Redlock, which offers the mutex only (its quorum of independent
    /// servers would have to agree on sets of holders and queues).
    pub(crate) fn offers(&self, kind: LockKind) -> bool {
        kind == LockKind::Mutex || !matches!(self, Backend::Redlock(_))
    }

    /// Where a holder may hand its lease to a waiter of its own client
    /// without a round trip (see `client::local`): one server, Sentinel or a
    /// cluster. Not Redlock (its waiters do not queue on the servers, so a
    /// chain of local hand-overs could starve other processes), and not the
    /// embedded backend (every hand-over there is local already).
    pub(crate) fn hands_on_locally(&self) -> bool {
        matches!(self, Backend::Redis(_))
    }

    /// Keeps the lock `token` holds unless somebody queued behind it, and
    /// reserves `count` fencing tokens for local hand-overs: the highest, or
    /// `None` (queued behind, lost, or not offered by this backend).
    pub(crate) async fn reserve(
        &self,
        lock: LockRef<'_>,
        count: u64,
    ) -> Result<Option<u64>, LockError> {
        match self {
            Backend::Redis(b) => b.reserve(lock, count).await,
            Backend::Redlock(_) | Backend::Memory(_) => Ok(None),
        }
    }

    /// Extends up to [`RENEW_BATCH`] leases in one call: per lease
    /// `Some(true)` where re-armed, `Some(false)` where not ours any more,
    /// `None` where unknown (its part of the call failed). An error when
    /// nothing answered.
    pub(crate) async fn extend_many(
        &self,
        leases: &[(&KeyNames, &Token, Duration)],
    ) -> Result<Vec<Option<bool>>, LockError> {
        match self {
            Backend::Redis(b) => b.extend_many(leases).await,
            Backend::Redlock(b) => b.extend_many(leases).await,
            Backend::Memory(b) => Ok(leases
                .iter()
                .map(|(names, token, ttl)| Some(b.extend(names, token, *ttl)))
                .collect()),
        }
    }

    /// Restarts the backend's own tasks (the notices') on the runtime in use
    /// if they ended with the runtime they ran on; an error that names the
    /// cause where that cannot be done (a cluster connection).
    pub(crate) async fn restart_if_ended(&self) -> Result<(), LockError> {
        match self {
            Backend::Redis(b) => b.restart_if_ended().await,
            Backend::Redlock(b) => b.restart_if_ended().await,
            Backend::Memory(_) => Ok(()),
        }
    }

    /// `true` when registering a waiter on `channel` (a lock's or an
    /// idempotency record's) costs no round trip (the embedded backend, or
    /// notices on it already reach us), so a waiter registers before its
    /// first attempt and needs no second one.
    pub(crate) fn notices_ready_on(&self, channel: &str) -> bool {
        match self {
            Backend::Redis(b) => b.is_subscribed(channel),
            Backend::Redlock(b) => b.is_subscribed(channel),
            Backend::Memory(_) => true,
        }
    }

    /// How much of a lease of `ttl` to hold back for clock drift between the
    /// servers (Redlock); a lease is trusted for `ttl - drift` after its
    /// request was sent.
    pub(crate) fn drift(&self, ttl: Duration) -> Duration {
        match self {
            Backend::Redlock(_) => redlock::drift(ttl),
            _ => Duration::ZERO,
        }
    }

    /// `true` when a hand-over must be confirmed (and replicated) before the
    /// new owner may use it.
    pub(crate) fn needs_confirmation(&self) -> bool {
        match self {
            Backend::Redis(b) => b.needs_confirmation(),
            _ => false,
        }
    }

    /// Registers a waiter for notices on `channel` (a lock's or an
    /// idempotency record's): on every node of Redlock, on the channel's
    /// shard on a cluster. Notices are best effort: a waiter also needs a
    /// timer.
    pub(crate) async fn register_on(&self, channel: &str, token: &Token) -> WaitHandle {
        match self {
            Backend::Redis(b) => b.register(channel, token).await,
            Backend::Redlock(b) => b.register(channel, token).await,
            Backend::Memory(b) => b.register(channel, token),
        }
    }

    pub(crate) async fn delete(&self, names: &KeyNames) -> Result<(), LockError> {
        match self {
            Backend::Redis(b) => b.delete(names).await,
            Backend::Redlock(b) => b.delete(names).await,
            Backend::Memory(b) => {
                b.delete(names);
                Ok(())
            }
        }
    }

    /// Where idempotency records live: on the server, or (Redlock) on every
    /// node, decided by a majority like a lock.
    #[cfg_attr(not(feature = "idempotency"), allow(dead_code))]
    pub(crate) fn records_at(&self) -> RecordsAt<'_> {
        match self {
            Backend::Redis(b) => RecordsAt::Redis(b),
            Backend::Redlock(b) => RecordsAt::Redlock(b),
            Backend::Memory(b) => RecordsAt::Memory(b),
        }
    }

    pub(crate) fn describe(&self) -> &'static str {
        match self {
            Backend::Redis(_) => "redis",
            Backend::Memory(_) => "memory",
            Backend::Redlock(_) => "redlock",
        }
    }
}
