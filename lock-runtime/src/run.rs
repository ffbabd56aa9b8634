//! Running a future under held leases, as every `run` does
//! (`LockRequest::run`, `LockAllRequest::run`, `LeaderRequest::run`): the
//! body, cancelled when a lease is lost ([`unless_lost`]), and the end, one
//! rule for all three ([`end_run`]).
//!
//! Each `run` boxes its body as it is called. Kept inline, the body sat in
//! the run's state five times over (the argument, and each wrapper that
//! holds it: `unless_lost`, the task-local scope, their awaits), so locked
//! scopes nested in one another (a function under `#[distributed_lock]`
//! that calls another) grew five-fold per level: four levels made a
//! 218 KB future, six overflowed a 2 MiB thread's stack. Boxed, each level
//! adds the run's own size, and the body costs one allocation.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::FutureExt;
use lock_keys::MAX_LOCK_ALL_KEYS;
use pin_project_lite::pin_project;
use tokio::time::Instant;

use crate::error::LockError;
use crate::held::Held;

/// Runs `fut` to its end (`Some`), unless a lease of `held` is lost first
/// (`None`: `fut` is dropped, cancelled), the loss checked before each
/// poll of `fut`: the body of every `run` (a lock's, `lock_all`'s, a
/// leadership's) and of every request behind the `LockLayer`.
///
/// The leases' `lost()` futures (a timer at each lease's deadline and a
/// wait on the watchdog's word) are set up, boxed, only if `fut` does not
/// end at its first poll: until then a look at the leases says the same at
/// once, and a body that ends at once arms no timer.
pub(crate) fn unless_lost<F: Future>(held: &[Arc<Held>], fut: F) -> UnlessLost<'_, F> {
    UnlessLost {
        fut,
        held,
        lost: None,
    }
}

pin_project! {
    /// [`unless_lost`]'s future: `fut` pinned where it is, so a run's
    /// future holds it once (an `async fn` taking it, and `lost()`'s
    /// future, held each twice: the argument and the pinned copy).
    pub(crate) struct UnlessLost<'h, F> {
        #[pin]
        fut: F,
        held: &'h [Arc<Held>],
        lost: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    }
}

impl<F: Future> Future for UnlessLost<'_, F> {
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let lost_now = match this.lost.as_mut() {
            Some(lost) => lost.as_mut().poll(cx).is_ready(),
            None => this.held.iter().any(|held| held.is_lost()),
        };
        if lost_now {
            return Poll::Ready(None);
        }
        if let Poll::Ready(output) = this.fut.poll(cx) {
            return Poll::Ready(Some(output));
        }
        if this.lost.is_none() {
            let mut armed = any_lost(this.held.iter());
            if armed.as_mut().poll(cx).is_ready() {
                return Poll::Ready(None);
            }
            *this.lost = Some(armed);
        }
        Poll::Pending
    }
}

/// Resolves once any lease of `held` is lost (never, for none): a run's
/// body's watch, and `LockAllGuard::lost`.
pub(crate) fn any_lost<'h>(
    mut held: impl ExactSizeIterator<Item = &'h Arc<Held>>,
) -> Pin<Box<dyn Future<Output = ()> + Send>> {
    if held.len() > 1 {
        let each = held.map(|held| Box::pin(held.lost()));
        return Box::pin(futures_util::future::select_all(each).map(drop));
    }
    match held.next() {
        Some(one) => Box::pin(one.lost()),
        None => Box::pin(std::future::pending()),
    }
}

/// Ends a `run` whose body ran under the leases `held` (one, or
/// `lock_all`'s, in order) and ended with `output` (`None`: cancelled by
/// [`unless_lost`]). `guard` holds the leases; `release` gives them back
/// (a guard's release, `lock_all`'s releases, a resign) and answers for
/// each lease, in `held`'s order.
///
/// - Cancelled: the answer is `Err(LockError::Lost)` naming the first lease
///   known lost; the leases still ours (`lock_all`'s other keys) are
///   released first, so a retry straight after finds them free; with none,
///   `guard` is dropped (released in the background).
/// - Ended while every lease was valid: the output is the caller's, whatever
///   the releases answer (a lost reply, a server gone, even a key deleted
///   behind our back cannot undo work that finished under a valid lease);
///   a failed release is a `tracing` warning naming its key.
/// - Ended after a lease's deadline passed without a confirmed renewal (a
///   runtime blocked past it): that lease is lost, as `lost()` says,
///   whatever the server still holds, and the answer is
///   `Err(LockError::Lost)` naming the first such key; every lease is still
///   released (which frees a key that is still ours).
pub(crate) async fn end_run<T, G, R>(
    held: &[Arc<Held>],
    output: Option<T>,
    guard: G,
    release: impl FnOnce(G) -> R,
) -> Result<T, LockError>
where
    R: Future<Output: IntoIterator<Item = Result<(), LockError>>>,
{
    let Some(output) = output else {
        let lost = held.iter().find(|h| h.is_lost()).unwrap_or(&held[0]);
        let key = lost.key.clone();
        if held.iter().any(|h| !h.is_lost()) {
            // `lock_all`'s other keys are still ours: free them before
            // answering, so that a retry straight after does not find them
            // taken by this very run (their failures are the release's to
            // log; the loss is the answer).
            let _released = release(guard).await;
        } else {
            drop(guard);
        }
        return Err(LockError::lost(&key));
    };
    // Each lease's validity as the work was seen to end, before any
    // release moves it (a release that finds the key gone marks it lost).
    // A request holds at most `MAX_LOCK_ALL_KEYS` leases.
    debug_assert!(held.len() <= MAX_LOCK_ALL_KEYS);
    let now = Instant::now();
    let mut valid = [false; MAX_LOCK_ALL_KEYS];
    for (valid, held) in valid.iter_mut().zip(held) {
        *valid = held.valid_at(now);
    }
    let lost = held.iter().zip(valid).find(|(_, valid)| !valid);
    let released = release(guard).await;
    for ((held, valid), result) in held.iter().zip(valid).zip(released) {
        let Err(e) = result else { continue };
        if valid {
            tracing::warn!(key = %held.key, error = &e as &dyn std::error::Error,
                "the work finished under a valid lease; releasing the lock afterwards failed");
        } else if !e.is_lost() {
            tracing::warn!(key = %held.key, error = &e as &dyn std::error::Error,
                "the lease may have run out before the work finished, and the release failed");
        }
    }
    match lost {
        Some((held, _)) => Err(LockError::lost(&held.key)),
        None => Ok(output),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::{client::LockClient, error::LockError};

    const LEASE: Duration = Duration::from_millis(100);

    /// Work that keeps the runtime's only thread past its lease: it ends
    /// after the lease's deadline, with nothing renewed and `lost()` not
    /// polled since it started.
    async fn blocks_past_its_lease() -> &'static str {
        std::thread::sleep(LEASE * 3);
        "done"
    }

    fn lost_key(answer: Result<&str, LockError>) -> String {
        match answer {
            Err(LockError::Lost { key }) => key,
            other => panic!("expected Lost, got {other:?}"),
        }
    }

    /// A body of `N` bytes (held across an await, as real work's state is).
    async fn body<const N: usize>() -> usize {
        let state = [1u8; N];
        tokio::task::yield_now().await;
        state.iter().map(|b| usize::from(*b)).sum()
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_runs_future_does_not_grow_with_its_body_nor_with_nesting() {
        use std::mem::size_of_val;
        let client = LockClient::builder().memory().build().await.unwrap();
        let c = &client;
        let small = size_of_val(&c.lock("a").run(body::<1>()));
        let large = size_of_val(&c.lock("a").run(body::<4096>()));
        assert!(
            large < small + 64,
            "run: {small} bytes, {large} with a 4 KiB body"
        );
        let small = size_of_val(&c.lock_all(["a", "b"]).run(body::<1>()));
        let large = size_of_val(&c.lock_all(["a", "b"]).run(body::<4096>()));
        assert!(
            large < small + 64,
            "lock_all: {small} bytes, {large} with a 4 KiB body"
        );
        let small = size_of_val(&c.leader("l").run(body::<1>()));
        let large = size_of_val(&c.leader("l").run(body::<4096>()));
        assert!(
            large < small + 64,
            "leader: {small} bytes, {large} with a 4 KiB body"
        );
        // Locked scopes nested four deep (a locked function calling
        // another): each level adds the run's own size, not a multiple of
        // the levels inside it.
        let one = size_of_val(&c.lock("a").run(body::<1>()));
        let four = c.lock("a").run(async {
            c.lock("b")
                .run(async {
                    c.lock("c")
                        .run(async { c.lock("d").run(body::<1>()).await })
                        .await
                })
                .await
        });
        let four = size_of_val(&four);
        assert!(four < 2 * one, "one run: {one} bytes, four nested: {four}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn work_that_ends_after_its_lease_ran_out_is_lost_for_every_run() {
        let client = LockClient::builder().memory().build().await.unwrap();
        let one = client.lock("a").ttl(LEASE);
        assert_eq!(lost_key(one.run(blocks_past_its_lease()).await), "a");
        // Named: the first in the global order (by hash slot, then key).
        let all = client.lock_all(["c", "b"]).ttl(LEASE);
        assert_eq!(lost_key(all.run(blocks_past_its_lease()).await), "b");
        let leader = client.leader("d").ttl(LEASE);
        assert_eq!(lost_key(leader.run(blocks_past_its_lease()).await), "d");
        // Each run gave its leases back: every key is free.
        let again = client.lock_all(["a", "b", "c"]).acquire().await.unwrap();
        again.release().await.unwrap();
        client
            .leader("d")
            .wait(Duration::ZERO)
            .campaign()
            .await
            .unwrap();
    }

    /// The leases are looked at before each poll of the body: a body
    /// under a lease already lost is never polled, and one that ends at its
    /// first poll ends there (whichever lease the run holds).
    #[tokio::test(flavor = "current_thread")]
    async fn a_body_is_polled_only_while_every_lease_is_valid() {
        use std::sync::Arc;

        use super::unless_lost;

        let client = LockClient::builder().memory().build().await.unwrap();
        let lasting = client.lock("lasting").acquire().await.unwrap();
        let brief = client.lock("brief").ttl(LEASE).renew(false);
        let brief = brief.acquire().await.unwrap();
        let held: [Arc<_>; 2] = [lasting.held().clone(), brief.held().clone()];
        assert_eq!(unless_lost(&held, async { 7 }).await, Some(7));
        tokio::time::sleep(LEASE * 2).await;
        assert_eq!(unless_lost(&held[..1], async { 7 }).await, Some(7));
        let never = async { unreachable!("a body under a lost lease is polled") };
        assert_eq!(unless_lost(&held, never).await, None::<()>);
        let never = async { unreachable!("a body under a lost lease is polled") };
        assert_eq!(unless_lost(&held[1..], never).await, None::<()>);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn work_that_ends_under_valid_leases_keeps_its_output_for_every_run() {
        let client = LockClient::builder().memory().build().await.unwrap();
        let done = async { "done" };
        assert_eq!(client.lock("a").run(done).await.unwrap(), "done");
        let done = async { "done" };
        assert_eq!(client.lock_all(["c", "b"]).run(done).await.unwrap(), "done");
        let done = async { "done" };
        assert_eq!(client.leader("d").run(done).await.unwrap(), "done");
    }
}
