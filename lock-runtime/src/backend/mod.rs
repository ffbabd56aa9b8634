//! Where locks live. One enum, so the hot path is a match, not a virtual call.

use std::sync::Arc;
use std::time::Duration;

use crate::LockError;
use crate::key::KeyNames;
use crate::token::Token;

pub(crate) mod memory;
pub(crate) mod records;
pub(crate) mod redis;
pub(crate) mod waiters;

pub(crate) use waiters::WaitHandle;

/// The lease a waiter gets when a release hands the lock to it (capped by the
/// lease it asked for). Its watchdog renews it to the full lease at once; if
/// the waiter died meanwhile, the key is free again after at most this long.
pub const HANDOFF_LEASE: Duration = Duration::from_secs(2);

/// The most leases one batched renewal call carries.
pub(crate) const RENEW_BATCH: usize = 100;

/// The answer of one acquire attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AcquireOutcome {
    /// Ours, with this fencing token.
    Acquired { fencing: u64 },
    /// Held by someone else for at most `remaining`.
    Busy { remaining: Duration },
}

#[derive(Clone, Debug)]
pub(crate) enum Backend {
    Redis(Arc<redis::RedisBackend>),
    Memory(Arc<memory::MemoryBackend>),
}

impl Backend {
    pub(crate) async fn acquire(
        &self,
        names: &KeyNames,
        token: &Token,
        ttl: Duration,
        wait: Duration,
    ) -> Result<AcquireOutcome, LockError> {
        match self {
            Backend::Redis(b) => b.acquire(names, token, ttl, wait).await,
            Backend::Memory(b) => Ok(b.acquire(names, token, ttl, wait)),
        }
    }

    pub(crate) async fn extend(
        &self,
        names: &KeyNames,
        token: &Token,
        ttl: Duration,
    ) -> Result<bool, LockError> {
        match self {
            Backend::Redis(b) => b.extend(names, token, ttl).await,
            Backend::Memory(b) => Ok(b.extend(names, token, ttl)),
        }
    }

    /// Releases if `token` holds the lock and hands it to the next waiter.
    /// `dequeue`: the caller may have queued (an abandoned wait): leave the line.
    pub(crate) async fn release(
        &self,
        names: &KeyNames,
        token: &Token,
        ttl: Duration,
        dequeue: bool,
    ) -> Result<bool, LockError> {
        match self {
            Backend::Redis(b) => b.release(names, token, ttl, dequeue).await,
            Backend::Memory(b) => Ok(b.release(names, token, dequeue)),
        }
    }

    /// Extends up to [`RENEW_BATCH`] leases in one call; `true` where re-armed.
    pub(crate) async fn extend_many(
        &self,
        leases: &[(&KeyNames, &Token, Duration)],
    ) -> Result<Vec<bool>, LockError> {
        match self {
            Backend::Redis(b) => b.extend_many(leases).await,
            Backend::Memory(b) => Ok(leases
                .iter()
                .map(|(names, token, ttl)| b.extend(names, token, *ttl))
                .collect()),
        }
    }

    /// `true` when registering a waiter for `names` costs no round trip (the
    /// embedded backend, or notices for this key already reach us), so a
    /// waiter registers before its first attempt and needs no second one.
    pub(crate) fn notices_ready(&self, names: &KeyNames) -> bool {
        match self {
            Backend::Redis(b) => b.is_subscribed(names),
            Backend::Memory(_) => true,
        }
    }

    /// Registers a waiter for hand-overs and notices on `names`.
    pub(crate) async fn register(&self, names: &KeyNames, token: &Token) -> WaitHandle {
        match self {
            Backend::Redis(b) => b.register(names, token).await,
            Backend::Memory(b) => b.register(names, token),
        }
    }

    pub(crate) async fn delete(&self, names: &KeyNames) -> Result<(), LockError> {
        match self {
            Backend::Redis(b) => b.delete(names).await,
            Backend::Memory(b) => {
                b.delete(names);
                Ok(())
            }
        }
    }

    pub(crate) fn describe(&self) -> &'static str {
        match self {
            Backend::Redis(_) => "redis",
            Backend::Memory(_) => "memory",
        }
    }
}
