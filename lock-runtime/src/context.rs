//! The locks held by the current task, for reentrancy and [`current_lock`].

use std::future::Future;
use std::sync::Arc;

use crate::held::Held;
use crate::key::Kind;

tokio::task_local! {
    static HELD: Stack;
}

/// The locks the current task holds through `with_lock`, innermost last.
#[derive(Clone, Default)]
struct Stack(Vec<Arc<Held>>);

/// A lock held by the current task, as seen by [`current_lock`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// The key as given by the caller (without the client's prefix).
    pub key: String,
    /// The fencing token of the acquisition: pass it to storage that rejects
    /// writes carrying a token lower than the last it saw.
    pub fencing_token: u64,
}

/// The innermost lock held by the current task through
/// [`LockClient::with_lock`](crate::LockClient::with_lock), [`LockRequest::run`](crate::LockRequest::run)
/// or `#[distributed_lock]`; `None` outside any locked scope.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_runtime::LockError> {
/// let client = lock_runtime::LockClient::builder().memory().build().await?;
/// assert!(lock_runtime::current_lock().is_none());
/// client
///     .with_lock("order:42", async {
///         let info = lock_runtime::current_lock().expect("inside the lock");
///         assert_eq!(info.key, "order:42");
///         assert!(info.fencing_token >= 1);
///     })
///     .await?;
/// # Ok(())
/// # }
/// ```
pub fn current_lock() -> Option<LockInfo> {
    HELD.try_with(|stack| {
        stack.0.last().map(|held| LockInfo {
            key: held.key.clone(),
            fencing_token: held.fencing,
        })
    })
    .ok()
    .flatten()
}

/// The lock of `kind`'s kind this task already holds for `key` on client
/// `client_id`, if any: the same mutex; a read or write lock of the same
/// read-write lock; a permit of the same semaphore (whatever its count).
pub(crate) fn find(client_id: u64, key: &str, kind: Kind) -> Option<Arc<Held>> {
    let family = |kind: Kind| match kind {
        Kind::Mutex => 0,
        Kind::Read | Kind::Write => 1,
        Kind::Permits(_) => 2,
        Kind::Leader => 3,
    };
    HELD.try_with(|stack| {
        stack
            .0
            .iter()
            .rev()
            .find(|held| {
                held.client_id == client_id
                    && held.key == key
                    && if held.names.is_leader() {
                        kind == Kind::Leader
                    } else {
                        family(held.names.kind) == family(kind)
                    }
            })
            .cloned()
    })
    .ok()
    .flatten()
}

/// Runs `fut` with `held` pushed on the current task's stack.
pub(crate) async fn scope<F: Future>(held: Arc<Held>, fut: F) -> F::Output {
    let mut stack = HELD.try_with(Stack::clone).unwrap_or_default();
    stack.0.push(held);
    HELD.scope(stack, fut).await
}

/// `fut`, carrying the current task's locks with it: a future spawned as a
/// task of its own (a handler run to completion by a tower layer) sees the
/// same `current_lock()` and re-enters the same locks as its spawner.
#[cfg(feature = "axum")]
pub(crate) fn carried<F: Future>(fut: F) -> impl Future<Output = F::Output> {
    let stack = HELD.try_with(Stack::clone).unwrap_or_default();
    HELD.scope(stack, fut)
}

/// `fut`, carrying the current task's locks and `held` pushed on them (the
/// innermost): [`scope`] inside [`carried`], in one task-local scope.
#[cfg(feature = "axum")]
pub(crate) fn carried_holding<F: Future>(
    held: Arc<Held>,
    fut: F,
) -> impl Future<Output = F::Output> {
    let mut stack = HELD.try_with(Stack::clone).unwrap_or_default();
    stack.0.push(held);
    HELD.scope(stack, fut)
}

/// Runs `fut` with every lock of `held` pushed on the current task's stack,
/// in order (the last is the innermost): nested scopes, one per lock, in one.
pub(crate) async fn scope_all<F: Future>(held: Vec<Arc<Held>>, fut: F) -> F::Output {
    let mut stack = HELD.try_with(Stack::clone).unwrap_or_default();
    stack.0.extend(held);
    HELD.scope(stack, fut).await
}

/// Runs `fut` to its end (`Some`), unless `lost` resolves first (`None`:
/// `fut` is dropped, cancelled): the body of every `run` (a lock's,
/// `lock_all`'s, a leadership's).
pub(crate) async fn unless_lost<F: Future>(
    lost: impl Future<Output = ()>,
    fut: F,
) -> Option<F::Output> {
    tokio::select! {
        biased;
        _ = lost => None,
        output = fut => Some(output),
    }
}
