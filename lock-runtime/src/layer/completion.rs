//! Running a claimed or locked request to its end, whatever the client does.
//!
//! axum drops a request's response future when its connection closes. A
//! handler that was paying an order would stop half-way, and the client's
//! retry (the client that timed out is the one that retries) would pay it
//! again. So the layers run the part of a request that holds a claim or a
//! lock (the handler, storing its response, releasing) as a task of its own,
//! and the response future only awaits that task: dropping the response
//! future detaches the task, it does not abort it.

use std::fmt;
use std::future::Future;

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

/// The task running a request's handler ended without an answer: it
/// panicked (outside the parts that catch a panic), or the runtime shut down.
#[derive(Debug)]
pub(crate) struct Aborted;

impl Completion {
    /// Runs `fut` to its end: as a task of its own (carrying the current
    /// task's locks, and counted by the tracker if one was given) when
    /// enabled, else in place.
    pub(crate) async fn run<T, F>(&self, fut: F) -> Result<T, Aborted>
    where
        F: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        if !self.enabled {
            return Ok(fut.await);
        }
        let fut = crate::context::carried(fut);
        let task = match &self.tracker {
            Some(tracker) => tracker.spawn(fut),
            None => tokio::spawn(fut),
        };
        task.await.map_err(|e| {
            if e.is_panic() {
                tracing::error!("a request's handler panicked; the request answers 500");
            } else {
                tracing::warn!("a request's handler was cancelled (the runtime shut down)");
            }
            Aborted
        })
    }

    /// Spawns `fut` in the background, counted by the tracker if one was
    /// given (work a request leaves behind, such as storing its response).
    pub(crate) fn spawn<F>(&self, fut: F) -> tokio::task::JoinHandle<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        match &self.tracker {
            Some(tracker) => tracker.spawn(fut),
            None => tokio::spawn(fut),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use super::*;

    async fn finishing(done: Arc<AtomicBool>) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        done.store(true, Ordering::SeqCst);
    }

    #[tokio::test]
    async fn a_dropped_caller_does_not_stop_the_work_unless_disabled() {
        for enabled in [true, false] {
            let tracker = TaskTracker::new();
            let completion = Completion {
                enabled,
                tracker: Some(tracker.clone()),
            };
            let done = Arc::new(AtomicBool::new(false));
            let run = completion.run(finishing(done.clone()));
            // The caller gives up after 10 ms (its future is dropped).
            let gave_up = tokio::time::timeout(Duration::from_millis(10), run).await;
            assert!(gave_up.is_err());
            tracker.close();
            tracker.wait().await;
            tokio::time::sleep(Duration::from_millis(80)).await;
            assert_eq!(done.load(Ordering::SeqCst), enabled, "enabled: {enabled}");
        }
    }

    #[tokio::test]
    async fn a_panic_in_the_task_is_an_answer_not_a_panic_of_the_caller() {
        let completion = Completion::default();
        let ran = completion
            .run(async { panic!("expected by the test") })
            .await;
        assert!(matches!(ran, Err::<(), _>(Aborted)));
    }

    #[tokio::test]
    async fn the_task_carries_the_callers_locks() {
        let client = crate::LockClient::builder().memory().build().await.unwrap();
        let completion = Completion::default();
        let seen = client
            .with_lock("order:1", async move {
                completion
                    .run(async { crate::current_lock().map(|l| l.key) })
                    .await
            })
            .await
            .unwrap()
            .unwrap();
        assert_eq!(seen.as_deref(), Some("order:1"));
    }
}
