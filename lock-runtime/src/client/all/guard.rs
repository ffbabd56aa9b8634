//! [`LockAllGuard`]: the locks [`LockAllRequest`](super::LockAllRequest) took.

use std::future::Future;

use futures_util::future::join_all;

use crate::client::LockGuard;
use crate::error::LockError;

/// Several held locks, from [`LockAllRequest::acquire`](super::LockAllRequest::acquire): one [`LockGuard`]
/// per key. Dropping it releases every lock (in the background, as
/// dropping each guard would).
#[derive(Debug)]
#[must_use = "the locks are released when the guard is dropped"]
pub struct LockAllGuard {
    pub(super) guards: Vec<LockGuard>,
}

impl LockAllGuard {
    /// The keys, in the global order they are taken in: by hash slot,
    /// then key.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.guards.iter().map(LockGuard::key)
    }

    /// The guard of each key, in the order of [`LockAllGuard::keys`].
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// The highest fencing token of the set.
    ///
    /// Keys of one hash slot taken in one atomic step got one token from
    /// one counter, strictly greater than every token issued before for
    /// each of them: when all keys share a slot (`{acct}:1`, `{acct}:2`,
    /// or any keys on the embedded backend), this one token is valid for
    /// each key. Across slots each key's token comes from its own slot's
    /// counter, and on Redlock (which takes the keys one at a time) each
    /// key has its own token: storage that checks tokens per key must use
    /// [`LockAllGuard::fencing_token_of`]. The highest token, sent with a
    /// write to a key whose own token is lower, would let a stale write
    /// land: a later holder of that key can be issued the same number from
    /// its own counter, and equal tokens pass the fence.
    ///
    /// Keys the set took one at a time (after waiting) may get their tokens
    /// on first use, as [`LockGuard::fencing_token`] says; the errors are
    /// its errors.
    pub async fn fencing_token(&self) -> Result<u64, LockError> {
        let mut highest = 0;
        for guard in &self.guards {
            highest = highest.max(guard.fencing_token().await?);
        }
        Ok(highest)
    }

    /// The fencing token of `key`; `Ok(None)` when `key` is not one of the
    /// set (see [`LockGuard::fencing_token`] for the errors).
    pub async fn fencing_token_of(&self, key: &str) -> Result<Option<u64>, LockError> {
        match self.guards.iter().find(|g| g.key() == key) {
            Some(guard) => guard.fencing_token().await.map(Some),
            None => Ok(None),
        }
    }

    /// Resolves when any key's lease is lost (see [`LockGuard::lost`]);
    /// resolves at once if one already is. Owns what it needs, so it can
    /// be raced against the work.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + use<> {
        crate::run::any_lost(self.guards.iter().map(LockGuard::held))
    }

    /// `true` once any key's lease is known to be lost.
    pub fn is_lost(&self) -> bool {
        self.guards.iter().any(LockGuard::is_lost)
    }

    /// Releases every lock (all are tried); the first error, if any (see
    /// [`LockGuard::release`]).
    pub async fn release(self) -> Result<(), LockError> {
        join_all(self.guards.into_iter().map(LockGuard::release))
            .await
            .into_iter()
            .collect()
    }
}
