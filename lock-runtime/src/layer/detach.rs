//! Running a locked request to its end without a task of its own while its
//! client waits: [`run_to_completion`].
//!
//! The layer must not let a client that goes away cut off a handler that
//! holds the lock (see `layer::completion`). Spawning the handler as a task
//! of its own for every request does that, but costs a task, a join and,
//! on a multi-threaded runtime, a wake-up of another thread per request
//! whose client stays. Here the handler is polled in place, in the request's
//! own future; only if that future is dropped before the handler ended (the
//! client went away) is the handler moved, as it stands, into a task that
//! runs it to its end. Either way it runs to its end exactly once.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio_util::task::TaskTracker;
use tokio_util::task::task_tracker::TaskTrackerToken;

use crate::context::Carried;
use crate::held::Held;
use crate::layer::completion::{Aborted, Completion};

pub(super) type Boxed<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Runs `fut` to its end as `completion` says: in place when run to
/// completion is off; otherwise polled in place and, if the returned future
/// is dropped first, finished by a task of its own (counted by the tracker
/// if one was given, as the request is while it runs in place). A panic of
/// `fut` is `Err(Aborted)`, as it was from a task that panicked.
///
/// `fut` sees the current task's locks wherever it runs, and `holding` (the
/// request's own lock) pushed on them.
pub(super) fn run_to_completion<T, F>(
    completion: &Completion,
    holding: Option<Arc<Held>>,
    fut: F,
) -> Detachable<T>
where
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    // Boxed first: the box is all that moves from here on (a handler's
    // future is large, and each move copies all of it).
    let fut: Boxed<T> = Box::pin(fut);
    let locks = match holding {
        Some(held) => Some(Carried::here(Some(held))),
        // In place, the task's locks are there already.
        None if !completion.enabled => None,
        // The same locks in place as in a task it may move to.
        None => Some(Carried::here(None)),
    };
    if !completion.enabled {
        return Detachable::in_place(fut, locks);
    }
    Detachable::new(completion.tracker.as_ref(), fut).with_locks(locks.unwrap_or_default())
}

/// `fut`, boxed at once (a caller's own future then holds a pointer, not
/// `fut`), polled in place with the current task's locks, and finished by a
/// task of its own (counted by `tracker`, as it is while in place) if
/// dropped before it ended. A panic of `fut` is `Err(Aborted)`.
pub(super) fn detachable<T, F>(tracker: Option<&TaskTracker>, fut: F) -> Detachable<T>
where
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    Detachable::new(tracker, Box::pin(fut)).with_locks(Carried::here(None))
}

/// A handler polled in place until it ends or this is dropped. Boxed as it
/// is made, so that a caller's future holds a pointer, not the handler.
pub(super) struct Detachable<T: Send + 'static> {
    /// `None` once it ended (or panicked).
    fut: Option<Boxed<T>>,
    /// The task's locks the handler sees on each poll, here and in a task
    /// it moves to; `None`: polled as it is (in place, with the caller's).
    locks: Option<Carried>,
    /// Finished by a task if dropped before it ended, a panic caught; else
    /// (run to completion off) dropped with this, a panic not caught.
    detach: bool,
    /// The tracker, and this request's place in its count while in place.
    tracked: Option<(TaskTracker, TaskTrackerToken)>,
    /// What a task it moved to does with its output, still counted by the
    /// tracker (the lock layer releases the lock its output holds).
    finish: Option<fn(T) -> Boxed<()>>,
}

impl<T: Send + 'static> Detachable<T> {
    fn new(tracker: Option<&TaskTracker>, fut: Boxed<T>) -> Self {
        Self {
            fut: Some(fut),
            locks: None,
            detach: true,
            tracked: tracker.map(|t| (t.clone(), t.token())),
            finish: None,
        }
    }

    fn in_place(fut: Boxed<T>, locks: Option<Carried>) -> Self {
        Self {
            fut: Some(fut),
            locks,
            detach: false,
            tracked: None,
            finish: None,
        }
    }

    fn with_locks(mut self, locks: Carried) -> Self {
        self.locks = Some(locks);
        self
    }

    /// Has a task it moves to run `finish` on its output (what the caller
    /// would have done with it had it stayed), within the task.
    pub(super) fn finished_by(mut self, finish: fn(T) -> Boxed<()>) -> Self {
        self.finish = Some(finish);
        self
    }
}

impl<T: Send + 'static> Future for Detachable<T> {
    type Output = Result<T, Aborted>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let Some(fut) = this.fut.as_mut() else {
            return Poll::Ready(Err(Aborted));
        };
        let locks = &this.locks;
        let mut poll = |cx: &mut Context<'_>| match locks {
            Some(locks) => locks.poll(fut.as_mut(), cx),
            None => fut.as_mut().poll(cx),
        };
        if !this.detach {
            return poll(cx).map(Ok);
        }
        let polled = std::panic::catch_unwind(AssertUnwindSafe(|| poll(cx)));
        match polled {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(output)) => {
                this.fut = None;
                Poll::Ready(Ok(output))
            }
            Err(_) => {
                // Dropped here: its guard releases the lock in the background.
                this.fut = None;
                tracing::error!("a request's handler panicked; the request answers 500");
                Poll::Ready(Err(Aborted))
            }
        }
    }
}

impl<T: Send + 'static> Drop for Detachable<T> {
    fn drop(&mut self) {
        let Some(fut) = self.fut.take() else {
            return;
        };
        if !self.detach {
            return;
        }
        // The client went away while the handler runs: it goes on in a task.
        // Without a runtime (it is shutting down) it is dropped, as a task
        // of a runtime that shuts down is.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!("a request's handler was cancelled (the runtime shut down)");
            return;
        };
        let locks = self.locks.take().unwrap_or_default();
        let then = self.finish;
        let finish = async move {
            let output = locks.scope(fut).await;
            if let Some(then) = then {
                then(output).await;
            }
        };
        match self.tracked.take() {
            Some((tracker, _token)) => {
                runtime.spawn(tracker.track_future(finish));
            }
            None => {
                runtime.spawn(finish);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use super::*;

    fn completion(tracker: Option<TaskTracker>) -> Completion {
        Completion {
            enabled: true,
            tracker,
        }
    }

    async fn finishing(done: Arc<AtomicBool>, after: Duration) {
        tokio::time::sleep(after).await;
        done.store(true, Ordering::SeqCst);
    }

    // Paused time: the timings are the test's own, whatever the load.
    #[tokio::test(start_paused = true)]
    async fn a_handler_whose_caller_goes_away_is_finished_by_a_task() {
        let tracker = TaskTracker::new();
        let done = Arc::new(AtomicBool::new(false));
        let with_tracker = completion(Some(tracker.clone()));
        let run = run_to_completion(
            &with_tracker,
            None,
            finishing(done.clone(), Duration::from_millis(500)),
        );
        let gave_up = tokio::time::timeout(Duration::from_millis(10), run).await;
        assert!(gave_up.is_err());
        assert!(!done.load(Ordering::SeqCst));
        tracker.close();
        tracker.wait().await;
        assert!(done.load(Ordering::SeqCst), "the handler was cut off");
    }

    #[tokio::test]
    async fn a_handler_moved_into_a_task_still_sees_its_callers_locks() {
        let client = crate::LockClient::builder().memory().build().await.unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let tracker = TaskTracker::new();
        let with_tracker = completion(Some(tracker.clone()));
        client
            .with_lock("order:7", async {
                let run = run_to_completion(&with_tracker, None, async move {
                    let in_place = crate::current_lock().map(|l| l.key);
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    // By now in a task of its own: its caller gave up.
                    let _ = tx.send((in_place, crate::current_lock().map(|l| l.key)));
                });
                let gave_up = tokio::time::timeout(Duration::from_millis(5), run).await;
                assert!(gave_up.is_err());
            })
            .await
            .unwrap();
        tracker.close();
        tracker.wait().await;
        let seen = rx.await.unwrap();
        let key = Some("order:7".to_owned());
        assert_eq!(seen, (key.clone(), key));
    }

    // Paused time: the timings are the test's own, whatever the load.
    #[tokio::test(start_paused = true)]
    async fn a_handler_running_in_place_is_counted_by_the_tracker() {
        let tracker = TaskTracker::new();
        let done = Arc::new(AtomicBool::new(false));
        let caller = {
            let (completion, done) = (completion(Some(tracker.clone())), done.clone());
            // The caller stays: the handler runs in its future, not in a task.
            tokio::spawn(async move {
                run_to_completion(
                    &completion,
                    None,
                    finishing(done, Duration::from_millis(80)),
                )
                .await
            })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        tracker.close();
        assert!(
            tokio::time::timeout(Duration::from_millis(20), tracker.wait())
                .await
                .is_err(),
            "a graceful shutdown would not wait for the running handler"
        );
        tracker.wait().await;
        assert!(done.load(Ordering::SeqCst));
        assert!(caller.await.unwrap().is_ok());
    }

    #[tokio::test]
    async fn a_handler_that_ends_at_once_runs_in_place_without_a_task() {
        fn tasks() -> usize {
            tokio::runtime::Handle::current()
                .metrics()
                .num_alive_tasks()
        }
        let before = tasks();
        let ran = run_to_completion(&completion(None), None, async { tasks() }).await;
        assert_eq!(ran.ok(), Some(before));
    }

    #[tokio::test]
    async fn a_panicking_handler_is_an_answer_not_a_panic_of_the_caller() {
        let ran = run_to_completion(&completion(None), None, async {
            panic!("expected by the test");
        })
        .await;
        assert!(matches!(ran, Err::<(), _>(Aborted)));
    }

    // Paused time: the timings are the test's own, whatever the load.
    #[tokio::test(start_paused = true)]
    async fn without_run_to_completion_a_caller_that_goes_away_cuts_the_handler_off() {
        let done = Arc::new(AtomicBool::new(false));
        let off = Completion {
            enabled: false,
            tracker: None,
        };
        let run = run_to_completion(
            &off,
            None,
            finishing(done.clone(), Duration::from_millis(500)),
        );
        assert!(
            tokio::time::timeout(Duration::from_millis(5), run)
                .await
                .is_err()
        );
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert!(!done.load(Ordering::SeqCst));
    }
}
