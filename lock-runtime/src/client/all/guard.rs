//! [`LockAllGuard`]: the locks [`LockAllRequest`](super::LockAllRequest) took.

use std::future::Future;

use futures_util::future::join_all;

use crate::LockError;
use crate::guard::LockGuard;

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
    /// key has its own token: storage that checks tokens per key should use
    /// [`LockAllGuard::fencing_token_of`].
    pub fn fencing_token(&self) -> u64 {
        self.guards
            .iter()
            .map(LockGuard::fencing_token)
            .max()
            .unwrap_or_default()
    }

    /// The fencing token of `key`, if it is one of the set.
    pub fn fencing_token_of(&self, key: &str) -> Option<u64> {
        self.guards
            .iter()
            .find(|g| g.key() == key)
            .map(LockGuard::fencing_token)
    }

    /// Resolves when any key's lease is lost (see [`LockGuard::lost`]);
    /// resolves at once if one already is. Owns what it needs, so it can
    /// be raced against the work.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let lost: Vec<_> = self.guards.iter().map(|g| Box::pin(g.lost())).collect();
        async move {
            if lost.is_empty() {
                return std::future::pending().await;
            }
            futures_util::future::select_all(lost).await;
        }
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
