//! A held lock: [`LockGuard`].

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use crate::client::inner::Inner;
use crate::client::release;
use crate::error::LockError;
use crate::held::Held;

/// A held lock. Renewed in the background (unless acquired with
/// `.renew(false)`) until [`release`](LockGuard::release)d or dropped.
///
/// Dropping a guard without `release` releases the lock in the background on
/// the current tokio runtime (outside a runtime the lease simply runs out; a
/// runtime shutting down drops that release: call
/// [`LockClient::shutdown`](crate::LockClient::shutdown) before `main` returns).
/// A guard keeps its [`LockClient`](crate::LockClient) alive, so it may outlive
/// every other handle on the client. A guard leaked with `std::mem::forget`
/// stops nothing: its lease is renewed for as long as the process lives (use
/// `.renew(false)` for a lease that must end on its own); when the process
/// dies, the lease runs out after at most one TTL.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_runtime::LockError> {
/// # let client = lock_runtime::LockClient::builder().memory().build().await?;
/// let guard = client.lock("order:42").acquire().await?;
/// assert_eq!(guard.key(), "order:42");
/// let fence = guard.fencing_token().await?; // send it along with every write
/// # let _ = fence;
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
#[must_use = "the lock is released when the guard is dropped"]
pub struct LockGuard {
    held: Arc<Held>,
    /// Guards keep their client alive: dropping every other handle on it
    /// does not stop the renewals of a held lock.
    inner: Arc<Inner>,
    /// `false` for a re-entered guard: the outer scope keeps ownership.
    owner: bool,
    done: bool,
}

impl LockGuard {
    pub(crate) fn owner(held: Arc<Held>, inner: Arc<Inner>) -> Self {
        Self {
            held,
            inner,
            owner: true,
            done: false,
        }
    }

    pub(crate) fn reentered(held: Arc<Held>, inner: Arc<Inner>) -> Self {
        Self {
            held,
            inner,
            owner: false,
            done: false,
        }
    }

    pub(crate) fn held(&self) -> &Arc<Held> {
        &self.held
    }

    /// The key as given to [`LockClient::lock`](crate::LockClient::lock) (without the prefix).
    pub fn key(&self) -> &str {
        &self.held.key
    }

    /// The fencing token of this acquisition: strictly greater than every token
    /// issued before for this key, by any client. Storage that remembers the
    /// highest token it has seen and rejects lower ones is safe even against a
    /// holder whose lease ran out while it was paused.
    ///
    /// A mutex, read lock, write lock or permit taken free on Redis or
    /// Valkey gets its token when it is first asked for, not at acquire (a
    /// mutex nobody asks a token of costs the server a plain `SET NX PX`
    /// and a compare-and-delete; a permit or read lock, one lighter script
    /// call each way): the first call mints it with one atomic step that
    /// checks the lease is still ours, and later calls answer at once.
    /// Locks handed over by a release, leader terms, `lock_all`'s keys,
    /// Redlock and the embedded backend have it from the start.
    ///
    /// `Err(LockError::Lost)` when the lease has ended (a holder whose lease
    /// ran out never gets a token, so tokens rise in the order holders held
    /// the key), or after the guard was released: also when the token was
    /// known before (asked for earlier, or given at acquire), so asking
    /// before each write stops a holder whose lease ended on every backend; `Err(LockError::Backend)`
    /// when the server could not be asked.
    pub async fn fencing_token(&self) -> Result<u64, LockError> {
        self.held.fencing_token().await
    }

    /// `true` if this guard re-entered a lock its task already held; releasing
    /// it leaves the lock with the outer scope.
    pub fn is_reentrant(&self) -> bool {
        !self.owner
    }

    /// Resolves when the lease is lost: the server says it is not ours any more,
    /// or no renewal was confirmed before it may have run out. Never resolves
    /// while the lock is held; resolves at once if it is already lost.
    ///
    /// The deadline is the lease's own: the send time of the acquire, moved
    /// on by each confirmed renewal to that renewal's send time plus the TTL
    /// (less the clock drift allowance on Redlock). It is kept by this future
    /// and by [`is_lost`](LockGuard::is_lost) themselves, not only by a message
    /// from the watchdog: a guard whose renewals stopped for any reason (its
    /// client's runtime ended, the process was paused) is lost at that
    /// deadline, before anyone else can have taken the key.
    ///
    /// A release ends the lease (so does dropping the guard): a `lost()`
    /// future kept past it resolves only if the release found the key no
    /// longer ours, never because the released lease's deadline passed. A
    /// re-entered guard's resolves also when the guard it re-entered is
    /// released (see [`is_lost`](LockGuard::is_lost)).
    ///
    /// The future owns what it needs, so it can be raced against the work:
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_runtime::LockError> {
    /// # let client = lock_runtime::LockClient::builder().memory().build().await?;
    /// # async fn work() {}
    /// let guard = client.lock("job:nightly").acquire().await?;
    /// tokio::select! {
    ///     _ = guard.lost() => eprintln!("lease lost, stopping"),
    ///     _ = work() => guard.release().await?,
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn lost(&self) -> impl Future<Output = ()> + Send + use<> {
        if self.owner {
            futures_util::future::Either::Left(self.held.lost())
        } else {
            futures_util::future::Either::Right(self.held.ended_or_lost())
        }
    }

    /// `true` once the lease is lost: the server said it is not ours any
    /// more, or its deadline passed without a confirmed renewal (see
    /// [`lost`](LockGuard::lost)). Once `true`, it stays `true`.
    ///
    /// A guard that re-entered a lock its task holds holds nothing of its
    /// own: once the guard it re-entered is released (say it was kept past
    /// the end of that guard's [`run`](crate::LockRequest::run)), it is
    /// lost, and its [`release`](LockGuard::release) answers `Lost`.
    pub fn is_lost(&self) -> bool {
        self.held.is_lost() || (!self.owner && self.held.ended())
    }

    /// Releases the lock and wakes its waiters.
    ///
    /// * `Ok(())`: released. Also when the server's answer was lost and a
    ///   re-sent release found the key gone while the lease was still valid:
    ///   nobody else can take a key during our lease, so the first release
    ///   removed it.
    /// * `Err(LockError::Lost)`: the lease may have ended before the release:
    ///   the guard had been reported lost, or its lease ran out before the
    ///   release was sent and the key was no longer ours, or the server says
    ///   the key is not ours although nothing we sent could have released it
    ///   (an operator's `DEL`, data lost in a failover). Never for a valid
    ///   lease whose release reply was lost.
    ///   A guard already lost when `release` is called (its deadline passed
    ///   without a confirmed renewal, or the watchdog was told the key is not
    ///   ours) always gets `Lost`, also when the server cannot be reached.
    /// * `Err(LockError::Backend)`: the server could not be reached or did not
    ///   answer, for a guard not known lost; when the release was sent and its answer lost,
    ///   [`BackendError::is_outcome_unknown`](crate::BackendError::is_outcome_unknown)
    ///   is `true`: it either ran or the lease runs out by itself.
    ///
    /// Dropped before it answered (a `timeout` around it, an aborted task),
    /// the release goes on in the background, as a dropped guard's does.
    pub async fn release(mut self) -> Result<(), LockError> {
        self.done = true;
        if !self.owner {
            return if self.is_lost() {
                Err(LockError::lost(&self.held.key))
            } else {
                Ok(())
            };
        }
        release::release(&self.inner, self.held.clone()).await
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.done || !self.owner {
            return;
        }
        release::release_dropped(self.inner.clone(), self.held.clone());
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.held.key)
            .field("fencing_token", &self.held.fencing())
            .field("reentrant", &!self.owner)
            .field("lost", &self.is_lost())
            .finish()
    }
}
