//! [`LockAllRequest`]: several locks, all or none.
//!
//! The keys are taken in one global order, the same for every caller:
//! by hash slot, then by key. Keys that one atomic step may take together
//! (every key on one server or the embedded backend; the keys of one hash
//! slot on a cluster) are first tried in that step (`acquire_all.lua`, or
//! under the embedded backend's mutex). When it finds a key busy and the
//! wait allows, that group's keys are taken one at a time through the
//! ordinary mutex path (queued, notified, FIFO), still in the global order.
//! A caller holds keys only in that order and waits for a key only while
//! holding keys before it, so two callers never wait for each other in a
//! cycle. Anything that cannot be had within the wait is a `Busy`, after
//! every key taken so far was released.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::join_all;
use tokio::time::Instant;

use super::LockClient;
use super::hold::{Taken, hold};
use super::options::{Asked, LockOptions, option_setters};
use super::release::Abandoned;
use crate::backend::{AllOutcome, AtomicSteps};
use crate::backoff::{Armed, Retry};
use crate::client::LockGuard;
use crate::client::inner::Inner;
use crate::held::Held;
use crate::key::{KeyNames, validate_key};
use crate::run::{end_run, unless_lost};
use crate::{context, error::ConfigReason, error::LockError};

mod guard;

pub use guard::LockAllGuard;

/// The most keys one [`LockClient::lock_all`] may name. More is a
/// `LockError::Config`: one atomic step carries three names per key, and a
/// set this large is better split by the caller (or locked by a coarser key).
pub use lock_keys::MAX_LOCK_ALL_KEYS;

/// A request for several locks at once, from [`LockClient::lock_all`]: all
/// of them or none, whatever order callers name them in, without deadlock.
///
/// Each key is the same lock [`LockClient::lock`] takes: holding
/// `lock_all(["a", "b"])` excludes `lock("a")` and `lock("b")` holders, and
/// the other way round. Each key gets its own lease, renewed by the
/// watchdog, and its own [`LockGuard`].
///
/// How the keys are taken:
///
/// * **Embedded backend, one server, Sentinel**: every key in one atomic
///   step (under the embedded backend's mutex, or one Lua script); with a
///   wait and a busy key, one at a time in the global order (by hash slot,
///   then key), each through the ordinary waiting path.
/// * **Redis Cluster**: a script runs on one hash slot, so the keys are
///   grouped by slot, groups in the global order; each group is one atomic
///   step (falling back to one at a time as above). Keys sharing a hash tag
///   (`{acct}:1`, `{acct}:2`) are taken together.
/// * **Redlock**: no atomic step across nodes: one key at a time, in the
///   global order.
///
/// If a key cannot be had within the wait, every key already taken is
/// released before [`LockError::Busy`] (naming that key) is returned.
///
/// Bad input is an error, not a panic: no keys, a key named twice or more
/// than [`MAX_LOCK_ALL_KEYS`] keys are `LockError::Config`; a key that
/// [`LockClient::lock`] would refuse is `LockError::InvalidKey`.
///
/// Reentrancy: keys the current task already holds (inside
/// [`LockRequest::run`](crate::LockRequest::run), [`LockAllRequest::run`] or
/// the attribute) are re-entered, and only the others are taken. Those are
/// then taken while the re-entered ones are held, out of the global order;
/// two tasks that each hold a key the other names wait for each other until
/// one's wait runs out, as with nested [`LockClient::lock`] calls.
///
/// ```
/// # use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_runtime::LockError> {
/// # let client = lock_runtime::LockClient::builder().memory().build().await?;
/// let both = client
///     .lock_all(["account:1", "account:2"])
///     .wait(Duration::from_secs(2))
///     .acquire()
///     .await?;
/// // Each key is the lock `client.lock(key)` takes.
/// assert!(client.lock("account:2").acquire().await.unwrap_err().is_busy());
/// // Each key's own token, for the storage that fences that key's writes
/// // (`fence::redis(&mut conn, "account:1", t1)`).
/// let t1 = both.fencing_token_of("account:1").await?.expect("a key of the set");
/// let t2 = both.fencing_token_of("account:2").await?.expect("a key of the set");
/// # let _ = (t1, t2);
/// both.release().await?;
///
/// // Any order names the same set; `run` holds it while a future runs.
/// let moved = client
///     .lock_all(["account:2", "account:1"])
///     .run(async { 100 })
///     .await?;
/// assert_eq!(moved, 100);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
#[must_use = "a lock request does nothing until `.acquire()` or `.run(fut)`"]
pub struct LockAllRequest {
    client: LockClient,
    keys: Vec<String>,
    options: LockOptions,
}

/// One key of the request, with its names.
struct Wanted {
    key: String,
    names: KeyNames,
}

impl LockAllRequest {
    pub(super) fn new(client: LockClient, keys: Vec<String>) -> Self {
        Self {
            client,
            keys,
            options: LockOptions::new(),
        }
    }

    option_setters! {
        /// The `name` label of these locks' metrics (see [`crate::LockRequest::metrics_name`]).
        metrics_name;

        /// The lease of each lock (default: the client's).
        ttl;

        /// How long to wait for all of them together (default
        /// `Duration::ZERO`: try once; at most [`MAX_WAIT`](crate::MAX_WAIT),
        /// longer waits are that long).
        wait;

        /// Whether the watchdog renews the leases (default `true`).
        renew;

        /// Keeps every key taken until at least `min` after it was acquired,
        /// even if released sooner (default zero), as
        /// [`LockRequest::hold_at_least`](crate::LockRequest::hold_at_least)
        /// does for one key: a release before then sets each key's lease to end
        /// at that moment instead of deleting it. At most the longest lease (7
        /// days), else `acquire` answers `LockError::Config`.
        ///
        /// ```
        /// # use std::time::Duration;
        /// # #[tokio::main(flavor = "current_thread")]
        /// # async fn main() -> Result<(), lock_runtime::LockError> {
        /// # let client = lock_runtime::LockClient::builder().memory().build().await?;
        /// let batch = client
        ///     .lock_all(["export:eu", "export:us"])
        ///     .hold_at_least(Duration::from_secs(60))
        ///     .acquire()
        ///     .await?;
        /// batch.release().await?;
        /// // Both keys stay taken for the rest of the minute.
        /// assert!(client.lock("export:us").acquire().await.unwrap_err().is_busy());
        /// # Ok(())
        /// # }
        /// ```
        hold_at_least;
    }

    /// Checks the keys; returns them in the global order.
    fn checked(&self) -> Result<Vec<Wanted>, LockError> {
        if self.keys.is_empty() {
            return Err(LockError::Config("lock_all needs at least one key".into()));
        }
        if self.keys.len() > MAX_LOCK_ALL_KEYS {
            return Err(LockError::Config(format!(
                "lock_all takes at most {MAX_LOCK_ALL_KEYS} keys; {} were given",
                self.keys.len()
            )));
        }
        let mut seen = HashSet::with_capacity(self.keys.len());
        for key in &self.keys {
            validate_key(key)?;
            if !seen.insert(key.as_str()) {
                return Err(LockError::misuse(
                    ConfigReason::KeyNamedTwice,
                    format_args!("{key:?}"),
                ));
            }
        }
        let prefix = &self.client.0.prefix;
        let mut wanted: Vec<Wanted> = self
            .keys
            .iter()
            .map(|key| Wanted {
                key: key.clone(),
                names: KeyNames::new(prefix, key),
            })
            .collect();
        wanted.sort_by(|a, b| (a.names.slot, &a.key).cmp(&(b.names.slot, &b.key)));
        Ok(wanted)
    }

    /// Takes every lock, or none, waiting up to the configured wait.
    ///
    /// `Err(LockError::Busy)` names a key still held by another owner at the
    /// deadline; every key taken before it has been released by then.
    ///
    /// Cancel-safe: dropping the future releases every key it took, in the
    /// background.
    pub async fn acquire(self) -> Result<LockAllGuard, LockError> {
        let wanted = self.checked()?;
        let inner = self.client.0.clone();
        let asked = self.options.resolve(&inner)?;
        super::keep_tasks_running(&inner).await?;
        let mut taken = Vec::with_capacity(wanted.len());
        let mut todo = Vec::with_capacity(wanted.len());
        for w in wanted {
            match context::find(inner.id, &w.key, crate::key::LockKind::Mutex) {
                Some(held) => {
                    tracing::trace!(key = %w.key, "lock re-entered by the holding task (lock_all)");
                    taken.push(LockGuard::reentered(held, inner.clone()));
                }
                None => todo.push(w),
            }
        }
        let steps = inner.backend.atomic_steps();
        let mut outcome = Ok(());
        for group in groups(todo, steps) {
            let atomic = steps != AtomicSteps::Never;
            outcome = self
                .take_group(&inner, &asked, group, atomic, &mut taken)
                .await;
            if outcome.is_err() {
                break;
            }
        }
        if let Err(e) = outcome {
            // All or none: give back what was taken.
            join_all(taken.into_iter().map(LockGuard::release)).await;
            if !e.is_busy() {
                crate::metrics::failed(&asked.metrics);
            }
            return Err(e);
        }
        taken.sort_by(|a, b| (a.held().names.slot, a.key()).cmp(&(b.held().names.slot, b.key())));
        Ok(LockAllGuard { guards: taken })
    }

    /// Takes the keys of one group: in one atomic step if `atomic`, else (or
    /// when that step finds a key busy and the wait allows) one at a time.
    async fn take_group(
        &self,
        inner: &Arc<Inner>,
        asked: &Asked,
        group: Vec<Wanted>,
        atomic: bool,
        taken: &mut Vec<LockGuard>,
    ) -> Result<(), LockError> {
        let ttl = asked.ttl;
        let keys = if atomic {
            let token = inner.token();
            // Armed while the step is in flight: dropped then (an error, or
            // the request cancelled mid-step), each releases its key with
            // the step's token in the background, in case the step ran.
            let mut step: Vec<Armed<Abandoned>> = group
                .into_iter()
                .map(|w| {
                    let abandoned = Abandoned {
                        inner: inner.clone(),
                        key: w.key,
                        lock: (w.names, token, ttl),
                        dequeue: false,
                    };
                    Armed::new(abandoned, true)
                })
                .collect();
            let names: Vec<&KeyNames> = step.iter().map(|a| &a.get().lock.0).collect();
            // Re-sent with the same token: a copy that ran leaves the keys
            // ours, which the script accepts. The leases start no earlier
            // than the send that took them.
            let (names, token_ref) = (&names, &token);
            let answer = Retry::ONCE
                .start()
                .send("lock_all: atomic step", None, move || {
                    let sent = Instant::now();
                    // Mapped: an `async` block awaiting it would hold it twice.
                    let step = inner.backend.acquire_all(names, token_ref, ttl);
                    step.map(move |answer| answer.map(|answer| (answer, sent)))
                })
                .await;
            // An error leaves the step armed: dropped, it releases the keys.
            let (answer, sent) = answer?;
            match answer {
                AllOutcome::Acquired(fences) => {
                    for (mut armed, fencing) in step.into_iter().zip(fences) {
                        let Abandoned { key, lock, .. } = armed.settle();
                        let lease = Taken {
                            key,
                            names: lock.0,
                            token,
                            fencing,
                            sent,
                            granted: ttl,
                            handover: false,
                        };
                        taken.push(hold(inner.clone(), lease, asked));
                    }
                    return Ok(());
                }
                AllOutcome::Busy { index, remaining } => {
                    let keys: Vec<String> = step.iter_mut().map(|a| a.settle().key).collect();
                    if asked.deadline.passed() {
                        let waited = asked.deadline.started().elapsed();
                        crate::metrics::busy(&asked.metrics, waited);
                        let key = keys.get(index).unwrap_or(&keys[0]).clone();
                        return Err(LockError::Busy {
                            retry_after: inner.hints.hint(&key, remaining),
                            key,
                        });
                    }
                    keys
                }
            }
        } else {
            group.into_iter().map(|w| w.key).collect()
        };
        for key in keys {
            // Within the request's own deadline, and as it asked.
            let request = self.client.lock(key);
            taken.push(request.acquire_as(Some(asked.clone())).await?);
        }
        Ok(())
    }

    /// Runs `fut` while holding every lock.
    ///
    /// As [`LockRequest::run`](crate::LockRequest::run): if any lease is
    /// lost mid-way, `fut` is dropped (cancelled), every lock is released
    /// and `Err(LockError::Lost)` names the lost key. Inside `fut`, locking
    /// one of the keys again (with [`LockClient::lock`] or the attribute)
    /// re-enters instead of deadlocking, and [`crate::current_lock`] gives
    /// the last key in the global order. Once `fut` has completed while
    /// every lease was valid, its output is returned whatever the releases
    /// answer.
    // Not an `async fn`: the body is boxed as the call is made (see
    // `crate::run`).
    pub fn run<F: Future>(self, fut: F) -> impl Future<Output = Result<F::Output, LockError>> {
        let fut = Box::pin(fut);
        async move {
            let guard = self.acquire().await?;
            let held: Vec<Arc<Held>> = guard.guards.iter().map(|g| g.held().clone()).collect();
            let output = context::scope_all(held.clone(), unless_lost(&held, fut)).await;
            end_run(&held, output, guard, |guard: LockAllGuard| {
                join_all(guard.guards.into_iter().map(LockGuard::release))
            })
            .await
        }
    }
}

/// Splits the keys (in the global order) into the groups one atomic step
/// may take.
fn groups(todo: Vec<Wanted>, steps: AtomicSteps) -> Vec<Vec<Wanted>> {
    let mut groups: Vec<Vec<Wanted>> = Vec::new();
    for w in todo {
        let joins = match (steps, groups.last().and_then(|g| g.last())) {
            (AtomicSteps::Any, Some(_)) => true,
            (AtomicSteps::PerSlot, Some(last)) => last.names.slot == w.names.slot,
            _ => false,
        };
        match groups.last_mut() {
            Some(group) if joins => group.push(w),
            _ => groups.push(vec![w]),
        }
    }
    groups
}
