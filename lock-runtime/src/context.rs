//! The locks held by the current task, for reentrancy and [`current_lock`].

use std::future::Future;
use std::sync::Arc;

use crate::error::LockError;
use crate::held::Held;
use crate::key::LockKind;

tokio::task_local! {
    static HELD: Stack;
}

/// The locks the current task holds through `with_lock`: the innermost
/// inline (a task holding one lock, as a locked request's handler does,
/// needs no allocation for it), the ones around it outermost first.
#[derive(Clone, Default)]
struct Stack {
    top: Option<Arc<Held>>,
    /// Empty while `top` is `None`.
    below: Vec<Arc<Held>>,
}

impl Stack {
    fn push(&mut self, held: Arc<Held>) {
        if let Some(outer) = self.top.replace(held) {
            self.below.push(outer);
        }
    }

    /// Innermost first.
    fn iter(&self) -> impl Iterator<Item = &Arc<Held>> {
        self.top.iter().chain(self.below.iter().rev())
    }
}

/// A lock held by the current task, as seen by [`current_lock`] (and by a
/// handler behind `LockLayer`, as an extractor).
#[derive(Clone)]
#[non_exhaustive]
pub struct LockInfo {
    /// The key as given by the caller (without the client's prefix).
    pub key: String,
    held: Arc<Held>,
}

impl LockInfo {
    pub(crate) fn of(held: &Arc<Held>) -> Self {
        Self {
            key: held.key.clone(),
            held: held.clone(),
        }
    }

    /// The fencing token of the acquisition: pass it to storage that rejects
    /// writes carrying a token lower than the last it saw (see
    /// [`LockGuard::fencing_token`](crate::LockGuard::fencing_token): minted
    /// on first use, `Err(LockError::Lost)` once the lease has ended).
    pub async fn fencing_token(&self) -> Result<u64, LockError> {
        self.held.fencing_token().await
    }
}

/// Two `LockInfo`s are equal when they describe the same acquisition.
impl PartialEq for LockInfo {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.held, &other.held)
            || (self.held.client_id == other.held.client_id && self.held.id == other.held.id)
    }
}

impl Eq for LockInfo {}

impl std::fmt::Debug for LockInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockInfo")
            .field("key", &self.key)
            .field("fencing_token", &self.held.fencing())
            .finish_non_exhaustive()
    }
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
///         assert!(info.fencing_token().await? >= 1);
///         Ok::<_, lock_runtime::LockError>(())
///     })
///     .await??;
/// # Ok(())
/// # }
/// ```
pub fn current_lock() -> Option<LockInfo> {
    HELD.try_with(|stack| stack.top.as_ref().map(LockInfo::of))
        .ok()
        .flatten()
}

/// The lock of `kind` this task already holds for `key` on client
/// `client_id`, if any: the same mutex; a read or write lock of the same
/// read-write lock; a permit of the same semaphore (whatever its count).
pub(crate) fn find(client_id: u64, key: &str, kind: LockKind) -> Option<Arc<Held>> {
    HELD.try_with(|stack| {
        stack
            .iter()
            .find(|held| {
                held.client_id == client_id
                    && held.key == key
                    && if held.names.is_leader() {
                        kind == LockKind::Leader
                    } else {
                        held.names.kind == kind
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
    stack.push(held);
    HELD.scope(stack, fut).await
}

/// The current task's locks, to poll a future with them wherever it runs:
/// a handler run to completion by a tower layer sees the same
/// `current_lock()` and re-enters the same locks as its caller, in place
/// or in the task it may move to.
#[cfg(feature = "axum")]
#[derive(Clone, Default)]
pub(crate) struct Carried(Stack);

#[cfg(feature = "axum")]
impl Carried {
    /// The current task's locks, and `holding` pushed on them (the
    /// innermost) if given.
    pub(crate) fn here(holding: Option<Arc<Held>>) -> Self {
        let mut stack = HELD.try_with(Stack::clone).unwrap_or_default();
        if let Some(held) = holding {
            stack.push(held);
        }
        Self(stack)
    }

    /// Polls `fut` with these locks as the task's (what a
    /// `tokio::task::LocalKey::scope` future does on each poll; done here,
    /// the future needs no wrapper to be boxed and moved with it).
    pub(crate) fn poll<F: Future + ?Sized>(
        &self,
        fut: std::pin::Pin<&mut F>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        HELD.sync_scope(self.0.clone(), || fut.poll(cx))
    }

    /// `fut` with these locks, for a task of its own.
    pub(crate) fn scope<F: Future>(self, fut: F) -> impl Future<Output = F::Output> {
        HELD.scope(self.0, fut)
    }
}

/// Runs `fut` with every lock of `held` pushed on the current task's stack,
/// in order (the last is the innermost): nested scopes, one per lock, in one.
pub(crate) async fn scope_all<F: Future>(held: Vec<Arc<Held>>, fut: F) -> F::Output {
    let mut stack = HELD.try_with(Stack::clone).unwrap_or_default();
    for held in held {
        stack.push(held);
    }
    HELD.scope(stack, fut).await
}
