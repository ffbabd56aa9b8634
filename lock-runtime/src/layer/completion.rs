//! Running a claimed or locked request to its end, whatever the client does.
//!
//! axum drops a request's response future when its connection closes. A
//! handler that was paying an order would stop half-way, and the client's
//! retry (the client that timed out is the one that retries) would pay it
//! again. So the layers run the part of a request that holds a claim or a
//! lock (the handler, storing its response, releasing) to its end: in place
//! while the client waits, and in a task of its own, as it stands, once the
//! response future is dropped (`layer::detach`). [`Completion`] is how a
//! layer was configured to do that.

use std::fmt;

use tokio_util::task::TaskTracker;

/// How a layer runs the part of a request that must not be cut off.
#[derive(Clone)]
pub(crate) struct Completion {
    /// `false`: axum's default, the handler is dropped with the connection.
    pub(crate) enabled: bool,
    /// Where the tasks are counted, for a graceful shutdown to wait on.
    pub(crate) tracker: Option<TaskTracker>,
}

impl Default for Completion {
    fn default() -> Self {
        Self {
            enabled: true,
            tracker: None,
        }
    }
}

impl fmt::Debug for Completion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Completion")
            .field("run_to_completion", &self.enabled)
            .field("task_tracker", &self.tracker.is_some())
            .finish()
    }
}

/// A request's handler ended without an answer: it panicked (outside the
/// parts that catch a panic).
#[derive(Debug)]
pub(crate) struct Aborted;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::detach::run_to_completion;

    #[tokio::test]
    async fn a_handler_run_to_completion_carries_the_callers_locks() {
        let client = crate::LockClient::builder().memory().build().await.unwrap();
        let completion = Completion::default();
        let seen = client
            .with_lock("order:1", async move {
                run_to_completion(&completion, None, async {
                    crate::current_lock().map(|l| l.key)
                })
                .await
            })
            .await
            .unwrap()
            .unwrap();
        assert_eq!(seen.as_deref(), Some("order:1"));
    }
}
