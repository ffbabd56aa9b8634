//! [`LockClient::inspect`]: who holds what, for operators and dashboards.

use std::time::Duration;

use super::LockClient;
use crate::LockError;
use crate::key::{KeyNames, validate_key};

/// A lock's state as [`LockClient::inspect`] read it: a snapshot, stale the
/// moment it is returned. For operators, dashboards and tests; never decide
/// to skip taking a lock from it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockState {
    /// The key, as given (without the client's prefix).
    pub key: String,
    /// Somebody holds the lock (on Redlock: a majority of the masters).
    pub held: bool,
    /// The lease left, when held with one (`None` when free, or when the key
    /// was set without expiry by hand).
    pub remaining: Option<Duration>,
    /// The highest fencing token issued so far for the keys of this key's
    /// hash slot (they share one counter; 0 before any): at least the
    /// current holder's token, and below the next one.
    pub fencing_counter: u64,
    /// How many waiters are queued for the lock (Redlock's waiters do not
    /// queue: 0 there).
    pub waiters: usize,
    /// This client holds the lock: one of its guards for `key` is alive and
    /// not known lost.
    pub held_by_this_client: bool,
    /// The fencing token of this client's guard, when it holds the lock.
    pub fencing_token: Option<u64>,
}

impl LockClient {
    /// Reads the state of the lock `key` without touching it: whether it is
    /// held and for how long, the fencing counter, how many wait, and
    /// whether this client is the holder.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_runtime::LockError> {
    /// let client = lock_runtime::LockClient::builder().memory().build().await?;
    /// let guard = client.lock("order:42").acquire().await?;
    /// let state = client.inspect("order:42").await?;
    /// assert!(state.held && state.held_by_this_client);
    /// assert_eq!(state.fencing_token, Some(guard.fencing_token()));
    /// guard.release().await?;
    /// assert!(!client.inspect("order:42").await?.held);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn inspect(&self, key: &str) -> Result<LockState, LockError> {
        validate_key(key)?;
        let names = KeyNames::new(&self.0.prefix, key);
        let seen = self.0.backend.inspect(&names).await?;
        let mine = self.0.watchdog.holding(&names.lock);
        Ok(LockState {
            held_by_this_client: mine.is_some(),
            fencing_token: mine,
            key: key.to_owned(),
            held: seen.held,
            remaining: seen.remaining,
            fencing_counter: seen.fence,
            waiters: seen.queued,
        })
    }
}

impl LockClient {
    /// The locks held now whose keys start with `starting_with` (`""`: all),
    /// at most `limit` of them, each as [`LockClient::inspect`] sees it,
    /// sorted by key. Found with `SCAN` (bounded by `limit`, never `KEYS`).
    /// On one server, a Sentinel group, Redlock (the union over the masters)
    /// and the embedded backend; on a Redis Cluster it is a `Config` error:
    /// list each master through a client of its own URL.
    pub async fn list(
        &self,
        starting_with: &str,
        limit: usize,
    ) -> Result<Vec<LockState>, LockError> {
        let prefix = &self.0.prefix;
        let names = self
            .0
            .backend
            .scan_locks(prefix, limit.saturating_mul(4).max(limit))
            .await?;
        let mut keys: Vec<String> = names
            .iter()
            .filter_map(|name| match crate::key::parse(prefix, name) {
                Some(('L', key)) if key.starts_with(starting_with) => Some(key),
                _ => None,
            })
            .collect();
        keys.sort();
        keys.dedup();
        let mut held = Vec::new();
        for key in keys {
            if held.len() == limit {
                break;
            }
            let state = self.inspect(&key).await?;
            if state.held {
                held.push(state);
            }
        }
        Ok(held)
    }

    /// Deletes the lock `key` whoever holds it, as an operator's `DEL` would;
    /// `true` if it was held. For emergencies (`lockctl force-release`): the
    /// holder is not asked, and finds out at its next renewal (its `lost()`
    /// resolves), while a new holder may already run. Logged as a `tracing`
    /// warning naming the key.
    pub async fn force_release(&self, key: &str) -> Result<bool, LockError> {
        let held = self.inspect(key).await?.held;
        self.force_delete(key).await?;
        tracing::warn!(%key, was_held = held, "lock force-released by an operator");
        Ok(held)
    }
}
