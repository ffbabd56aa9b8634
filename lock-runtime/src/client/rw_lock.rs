//! The synchronizer family's entry points besides the mutex: the
//! read-write lock's two sides. (Semaphores are a [`LockRequest`] with
//! permits; several keys at once are [`super::LockAllRequest`].)

use super::{LockClient, LockRequest};
use crate::key::{Access, LockKind};

/// A read-write lock, from [`LockClient::rw_lock`]: choose a side, then
/// configure and acquire it like any [`LockRequest`].
///
/// Many readers may hold it at once, or one writer. Waiting is FIFO: a
/// reader that arrives while a writer waits queues behind that writer, so
/// a stream of readers never starves it. Each reader's lease is its own
/// (renewed by the watchdog, like a mutex's): a dead reader holds writers
/// off until its lease ends, no longer. Writers' fencing tokens strictly
/// increase (readers get tokens from the same counter).
///
/// The read-write lock `"k"` is a resource of its own: it does not exclude
/// [`LockClient::lock`]`("k")` or a semaphore named `"k"`.
///
/// Reentrancy, per task (inside [`LockRequest::run`] or the attribute):
/// a read inside a read or a write, and a write inside a write, re-enter
/// (the outer scope keeps the lease); a write inside a read of the same
/// key would wait for itself, so it fails at once with `LockError::Config`.
///
/// ```
/// # use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_runtime::LockError> {
/// # let client = lock_runtime::LockClient::builder().memory().build().await?;
/// let a = client.rw_lock("catalog:7").read().acquire().await?;
/// let b = client.rw_lock("catalog:7").read().acquire().await?; // readers share
/// assert!(client.rw_lock("catalog:7").write().acquire().await.unwrap_err().is_busy());
/// a.release().await?;
/// b.release().await?;
/// let w = client.rw_lock("catalog:7").write().wait(Duration::from_secs(1)).acquire().await?;
/// w.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
#[must_use = "choose a side: `.read()` or `.write()`"]
pub struct RwLockRequest {
    client: LockClient,
    key: String,
}

impl RwLockRequest {
    pub(super) fn new(client: LockClient, key: String) -> Self {
        Self { client, key }
    }

    /// The shared side: held with other readers, never with a writer.
    pub fn read(self) -> LockRequest {
        LockRequest::new(self.client, self.key).of_kind(LockKind::RwLock, Access::READ)
    }

    /// The exclusive side: held alone, with no reader.
    pub fn write(self) -> LockRequest {
        LockRequest::new(self.client, self.key).of_kind(LockKind::RwLock, Access::Exclusive)
    }
}
