//! [`LockClient`], its [builder](LockClientBuilder), and [`LockRequest`].
//!
//! `builder` checks a configuration and connects; `request` is what a caller
//! configures and runs, with the [`LockOptions`] every kind of request
//! shares (`options`: checked once when it starts, the wait turned into one
//! deadline); `acquire` is the acquire algorithm as named steps (attempt,
//! queue, wait, confirm, then hold or give up), `hold` its last step for
//! every acquisition; `release` decides and sends every release (keep,
//! hand on within the client through `handover`, or delete).

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use lock_keys::{DEFAULT_TTL, MAX_TTL, MIN_TTL};

use crate::backend::Backend;
use crate::client::inner::Inner;
use crate::error::LockError;
use crate::key::{Access, KeyNames, LockKind, validate_key};

mod acquire;
mod all;
mod blocks;
mod builder;
mod guard;
mod handover;
pub(crate) mod hold;
pub(crate) mod inner;
mod inspect;
pub(crate) mod local;
pub(crate) mod options;
mod registry;
pub(crate) mod release;
mod request;
mod rw_lock;
#[cfg(feature = "tls")]
mod tls;
pub(crate) mod turns;

pub(crate) use options::{lease_setters, option_setter};

pub use all::{LockAllGuard, LockAllRequest, MAX_LOCK_ALL_KEYS};
pub use builder::LockClientBuilder;
pub use guard::LockGuard;
pub use inspect::LockState;
pub use options::LockOptions;
pub use request::LockRequest;
pub use rw_lock::RwLockRequest;

/// Restarts the client's background tasks (the watchdog, the notices) on
/// the runtime in use if they ended with the runtime they ran on: a client
/// built in one tokio runtime and used in another after the first ended (a
/// global client filled by a first `#[tokio::test]`). Without it, a lease
/// taken now would go unrenewed. An error naming the cause where they cannot
/// be restarted (a cluster connection cannot move; no runtime).
/// `Ok(true)`: they were running, and nothing was awaited.
pub(crate) async fn keep_tasks_running(inner: &Inner) -> Result<bool, LockError> {
    if !inner.watchdog.has_ended() {
        return Ok(true);
    }
    inner.backend.restart_if_ended().await?;
    inner.watchdog.restart_if_ended()?;
    registry::restart_if_ended(inner);
    Ok(false)
}

pub(crate) fn validate_ttl(ttl: Duration) -> Result<(), LockError> {
    if ttl < MIN_TTL {
        return Err(LockError::Config(format!(
            "the lease {} is below the minimum of {}",
            crate::error::shown(ttl),
            crate::error::shown(MIN_TTL)
        )));
    }
    if ttl > MAX_TTL {
        return Err(LockError::Config(format!(
            "the lease {} is above the maximum of {}",
            crate::error::shown(ttl),
            crate::error::shown(MAX_TTL)
        )));
    }
    Ok(())
}

/// A handle on a lock backend. Cheap to clone (an `Arc`); clones share the
/// connections, the notice subscriber and the watchdogs.
///
/// ```
/// use std::time::Duration;
/// use lock_runtime::LockClient;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_runtime::LockError> {
/// let client = LockClient::builder()
///     .memory() // or .redis("redis://127.0.0.1:6379")
///     .key_prefix("lock:")
///     .default_ttl(Duration::from_secs(30))
///     .build()
///     .await?;
///
/// let guard = client
///     .lock("order:42")
///     .ttl(Duration::from_secs(10))
///     .wait(Duration::from_secs(2))
///     .acquire()
///     .await?;
/// println!("fencing token {}", guard.fencing_token().await?);
/// guard.release().await?;
///
/// let total = client.with_lock("order:42", async { 40 + 2 }).await?;
/// assert_eq!(total, 42);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct LockClient(pub(crate) Arc<Inner>);

impl fmt::Debug for LockClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockClient")
            .field("backend", &self.0.backend.describe())
            .field("prefix", &self.0.prefix)
            .field("default_ttl", &self.0.default_ttl)
            .finish_non_exhaustive()
    }
}

impl LockClient {
    /// Starts configuring a client.
    pub fn builder() -> LockClientBuilder {
        LockClientBuilder::default()
    }

    /// This client's label ([`LockClientBuilder::label`]): how `inspect`
    /// names it as a holder or waiter.
    pub fn label(&self) -> &str {
        &self.0.label
    }

    /// Starts a request for the lock named `key` (without the prefix). Nothing
    /// happens until [`LockRequest::acquire`] or [`LockRequest::run`].
    pub fn lock(&self, key: impl Into<String>) -> LockRequest {
        LockRequest::new(self.clone(), key.into())
    }

    /// Starts a request for the read-write lock named `key`: choose
    /// [`read`](RwLockRequest::read) or [`write`](RwLockRequest::write), then
    /// configure and acquire as with [`LockClient::lock`].
    pub fn rw_lock(&self, key: impl Into<String>) -> RwLockRequest {
        RwLockRequest::new(self.clone(), key.into())
    }

    /// Starts a request for one of `permits` permits of the semaphore named
    /// `key`: at most `permits` holders at once. Configure and acquire as
    /// with [`LockClient::lock`]; the guard holds one permit.
    ///
    /// Each permit has its own lease, renewed by the watchdog: a crashed
    /// holder's permit returns when its lease ends. Waiting is notified and
    /// FIFO; a release hands its permit to the first waiter (by that
    /// waiter's own count, below), and a waiter that died in line is skipped
    /// once its wait has ended.
    ///
    /// `permits` is each caller's own limit: callers that name different
    /// counts for one key each take a permit only while fewer than their
    /// own count are held (a caller asking for 2 waits while 2 are held,
    /// even if another caller allows 4), also when a release or a newcomer
    /// with a larger count makes room for it in line; nobody's permit is
    /// taken back when a caller names fewer. Zero permits:
    /// `LockError::Config`.
    ///
    /// The semaphore `"k"` is a resource of its own: it does not exclude
    /// [`LockClient::lock`]`("k")` or a read-write lock named `"k"`. A task
    /// that already holds a permit of `key` (inside [`LockRequest::run`] or
    /// the attribute) re-enters it instead of taking a second one.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_runtime::LockError> {
    /// # let client = lock_runtime::LockClient::builder().memory().build().await?;
    /// let a = client.semaphore("exports:tenant-9", 2).acquire().await?;
    /// let b = client.semaphore("exports:tenant-9", 2).acquire().await?;
    /// assert!(client.semaphore("exports:tenant-9", 2).acquire().await.unwrap_err().is_busy());
    /// a.release().await?;
    /// b.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn semaphore(&self, key: impl Into<String>, permits: u32) -> LockRequest {
        LockRequest::new(self.clone(), key.into())
            .of_kind(LockKind::Semaphore, Access::Shared(permits))
    }

    /// Starts a request for every lock in `keys` at once: all or none. See
    /// [`LockAllRequest`].
    pub fn lock_all<I>(&self, keys: I) -> LockAllRequest
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        LockAllRequest::new(self.clone(), keys.into_iter().map(Into::into).collect())
    }

    /// Runs `fut` while holding the lock `key` (default lease, trying once).
    ///
    /// The lock is released when `fut` completes, returns an error or panics.
    /// If the lease is lost mid-way, `fut` is dropped (cancelled) and
    /// `Err(LockError::Lost)` is returned: `Lost` means the lease may have
    /// ended before the work finished. Lost is lost as
    /// [`LockGuard::lost`](crate::LockGuard::lost) says: the server said so,
    /// or the lease's own deadline passed without a confirmed renewal (even
    /// if the task that renews it is gone). Once `fut` has completed while the
    /// lease was valid, its output is returned whatever the release answers
    /// (a failed release is a `tracing` warning naming the key; the lease then
    /// runs out by itself), so a caller is never told "lost" about work that
    /// ran under the lock. Inside `fut`, [`crate::current_lock`]
    /// gives the fencing token, and locking `key` again re-enters instead of
    /// deadlocking. Use [`LockRequest::run`] to set the lease or the wait.
    pub async fn with_lock<F: Future>(
        &self,
        key: impl Into<String>,
        fut: F,
    ) -> Result<F::Output, LockError> {
        self.lock(key).run(fut).await
    }

    /// Gives back what this client holds, before the process exits: every
    /// lock, read or write lock, permit and leadership a guard of this
    /// client (or of a clone) still holds is released now, and the releases
    /// of guards dropped earlier, which go on in the background, are waited
    /// for.
    ///
    /// Without it, a guard alive or dropped as `main` returns is released by
    /// a task of a runtime that is shutting down, which never runs: the key
    /// stays taken for the rest of its lease, and the other processes wait
    /// that long (a leadership is taken over only when its lease ends).
    ///
    /// The guards it gave back hold nothing from then on: they are lost
    /// ([`LockGuard::is_lost`](crate::LockGuard::is_lost), `lost()`), and
    /// their `release` answers `Lost`. A lease kept by `hold_at_least` stays
    /// taken until then. Idempotency records still claimed are left to their
    /// lease (their work may still be running; a dropped `RecordGuard`'s
    /// release is waited for). The client stays usable: a lock taken
    /// afterwards is held as usual. While the server cannot be reached,
    /// releases are sent again for up to 30 s; bound the wait with
    /// `tokio::time::timeout` if the process must exit sooner.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_runtime::LockError> {
    /// # let client = lock_runtime::LockClient::builder().memory().build().await?;
    /// let job = client.lock("job:nightly").acquire().await?;
    /// // ... the service runs until it is told to stop, then:
    /// drop(job); // released in the background ...
    /// client.shutdown().await; // ... and that release waited for
    /// assert!(client.inspect("job:nightly").await?.holders.is_empty());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn shutdown(&self) {
        release::give_back_all(&self.0).await;
    }

    /// The key prefix every name of this client starts with.
    pub fn key_prefix(&self) -> &str {
        &self.0.prefix
    }

    /// The lease used when a request sets none.
    pub fn default_ttl(&self) -> Duration {
        self.0.default_ttl
    }

    /// How many leases the watchdog keeps alive: one per held guard (re-entered
    /// guards share their owner's). A diagnostic: it returns to zero when every
    /// guard is released or dropped. All leases of a client are renewed by one
    /// background task, in batches.
    pub fn renewed_leases(&self) -> usize {
        self.0.watchdog.live()
    }

    /// How many in-flight idempotency records (claimed
    /// [`RecordGuard`](crate::RecordGuard)s, and requests that
    /// `IdempotencyLayer` runs) the watchdog keeps alive, with the locks'
    /// leases and on the same schedule. A diagnostic: it returns to zero when
    /// every such record has been completed, released or dropped.
    #[cfg(feature = "idempotency")]
    pub fn renewed_records(&self) -> usize {
        self.0.watchdog.live_records()
    }

    /// Deletes the lock `key` regardless of its owner, as an operator's `DEL`
    /// would. The holder finds out at its next renewal.
    pub(crate) async fn force_delete(&self, key: &str) -> Result<(), LockError> {
        validate_key(key)?;
        self.0
            .backend
            .delete(&KeyNames::new(&self.0.prefix, key))
            .await
    }

    #[cfg_attr(not(feature = "idempotency"), allow(dead_code))]
    pub(crate) fn backend(&self) -> &Backend {
        &self.0.backend
    }
}
