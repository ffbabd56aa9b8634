//! Where locks live. One enum, so the hot path is a match, not a virtual call.

use std::sync::Arc;
use std::time::Duration;

use crate::key::KeyNames;
use crate::token::Token;
use crate::LockError;

pub(crate) mod memory;
pub(crate) mod records;
pub(crate) mod redis;
pub(crate) mod waiters;

pub(crate) use waiters::Subscription;

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
    ) -> Result<AcquireOutcome, LockError> {
        match self {
            Backend::Redis(b) => b.acquire(names, token, ttl).await,
            Backend::Memory(b) => Ok(b.acquire(names, token, ttl)),
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

    pub(crate) async fn release(&self, names: &KeyNames, token: &Token) -> Result<bool, LockError> {
        match self {
            Backend::Redis(b) => b.release(names, token).await,
            Backend::Memory(b) => Ok(b.release(names, token)),
        }
    }

    pub(crate) async fn subscribe(&self, names: &KeyNames) -> Subscription {
        match self {
            Backend::Redis(b) => b.subscribe(names).await,
            Backend::Memory(b) => b.subscribe(names),
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
