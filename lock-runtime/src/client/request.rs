//! [`LockRequest`]: what a caller configures, then acquires or runs.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use super::LockClient;
use super::acquire::Acquisition;
use super::hold::{Taken, hold};
use super::inner::Inner;
use super::local::{LocalEntry, LocalWait, Owner};
use super::options::{Asked, LockOptions, option_setters};
use crate::client::LockGuard;
use crate::key::{Access, KeyNames, LockKind, validate_key};
use crate::run::{end_run, unless_lost};
use crate::{context, error::ConfigReason, error::LockError};

/// A request for one lock, from [`LockClient::lock`]. Configure, then
/// [`acquire`](LockRequest::acquire) a guard or [`run`](LockRequest::run) a future.
#[derive(Clone, Debug)]
#[must_use = "a lock request does nothing until `.acquire()` or `.run(fut)`"]
pub struct LockRequest {
    client: LockClient,
    key: String,
    options: LockOptions,
    /// A mutex, a read-write lock, a semaphore, or a leadership.
    kind: LockKind,
    /// How it is taken: a read-write lock's side, a semaphore's permits.
    access: Access,
    /// A leadership's label (what observers see); empty for locks.
    label: String,
}

impl LockRequest {
    pub(super) fn new(client: LockClient, key: String) -> Self {
        Self {
            client,
            key,
            options: LockOptions::new(),
            kind: LockKind::Mutex,
            access: Access::Exclusive,
            label: String::new(),
        }
    }

    pub(super) fn of_kind(mut self, kind: LockKind, access: Access) -> Self {
        self.kind = kind;
        self.access = access;
        self
    }

    /// A campaign for the leadership `key` under `label` (see `leader`).
    pub(crate) fn leadership(mut self, label: String) -> Self {
        self.kind = LockKind::Leader;
        self.label = label;
        self
    }

    option_setters! {
        /// The `name` label of this lock's metrics (feature `metrics`; default
        /// `default`): a kind of lock such as `"order"`, never the key itself,
        /// which would make one series per order. `#[distributed_lock]` uses
        /// its key template, `LockLayer` its route. Without the feature it is
        /// ignored.
        metrics_name;

        /// The lease (default: the client's). Renewed every `ttl / 3` while held,
        /// unless [`renew(false)`](LockRequest::renew). From 50 ms to 7 days;
        /// the renewals of a client's leases are one task on its runtime, so a
        /// lease of well under a second is lost whenever that task is not run
        /// for a third of it (a runtime or machine busy with other work: 2,000
        /// leases of 50 ms, on two cores kept busy, were all lost, and none of
        /// 300 ms). Take seconds unless the lease must end that soon after a
        /// crash.
        ttl;

        /// How long to wait for a busy lock (default `Duration::ZERO`: try once).
        /// Waiting sleeps on release notices, not polling. A wait that ends in
        /// [`LockError::Busy`] has left the key's line of waiters by the time it
        /// answers, so a release after that never hands the lock to it. A wait
        /// above [`MAX_WAIT`](crate::MAX_WAIT) (a century; `Duration::MAX`
        /// included) waits that long: without bound, in practice. A server
        /// that does not answer (a restart, a failover) is asked again
        /// within the wait, for 10 s at most, before the acquire fails with
        /// [`LockError::Backend`]; one that tries once is asked twice. A
        /// request sent before the wait ends is waited for, so a stalled
        /// server makes an acquire answer up to one response timeout
        /// ([`LockClientBuilder::response_timeout`](crate::LockClientBuilder::response_timeout))
        /// after its wait.
        wait;

        /// Whether the watchdog renews the lease (default `true`). With `false` the
        /// lease is fixed: the guard is lost when it runs out.
        renew;

        /// Keeps the key taken until at least `min` after it was acquired, even
        /// if the holder releases sooner (default zero: a release frees it at
        /// once). For scheduled jobs on many pods: the first pod's run takes the
        /// key, and the other pods' timers, firing a little later, find it
        /// taken and skip, so the job runs at most once per `min`.
        ///
        /// A release before then sets the key's lease to end at that moment
        /// instead of deleting it (renewals stop; waiters take it when it
        /// ends). Until the release, everything is as without it: renewals,
        /// [`lost()`](LockGuard::lost), the fencing token. At most the longest
        /// lease (7 days), else `acquire` answers `LockError::Config`.
        ///
        /// ```
        /// # use std::time::Duration;
        /// # #[tokio::main(flavor = "current_thread")]
        /// # async fn main() -> Result<(), lock_runtime::LockError> {
        /// # let client = lock_runtime::LockClient::builder().memory().build().await?;
        /// let job = client
        ///     .lock("nightly-report")
        ///     .hold_at_least(Duration::from_secs(300))
        ///     .acquire()
        ///     .await?;
        /// // ... the job, done in a few seconds ...
        /// job.release().await?;
        /// // Another pod's timer, a second later: the key is still taken.
        /// assert!(client.lock("nightly-report").acquire().await.unwrap_err().is_busy());
        /// # Ok(())
        /// # }
        /// ```
        hold_at_least;
    }

    /// Takes the lock, waiting up to the configured wait.
    ///
    /// `Err(LockError::Busy)` when still held by another owner at the deadline,
    /// with a hint of when a retry may succeed as `retry_after` (what this
    /// client's recent holds took, bounded by the holder's remaining lease:
    /// see [`LockError::Busy`]). If the current task
    /// already holds this key through [`LockRequest::run`] or
    /// [`LockClient::with_lock`], returns a re-entered guard at once.
    ///
    /// Cancel-safe: dropping the future never leaves the lock held for longer
    /// than one lease, and a lock it may have taken is released in the
    /// background.
    // Not an `async fn` awaiting `acquire_as`: that would nest one state
    // machine in another and copy the request into the inner one on the
    // first poll (the embedded backend's pair measured ~70 ns slower so).
    pub fn acquire(self) -> impl Future<Output = Result<LockGuard, LockError>> + Send + 'static {
        self.acquire_as(None)
    }

    /// [`acquire`](Self::acquire); `asked`: the options already checked and
    /// the deadline set (`lock_all` takes keys one at a time within its
    /// own), or `None` to check the key and the options here.
    // Not an `async fn`, which would keep the request twice in its state
    // (its argument, and the copy it works on).
    pub(super) fn acquire_as(
        self,
        asked: Option<Asked>,
    ) -> impl Future<Output = Result<LockGuard, LockError>> + Send + 'static {
        let this = self;
        async move {
            // Resolved here: its start is a moment ago (a lower bound of
            // the first attempt's send time, close enough to stand for it).
            let resolved_here = asked.is_none();
            let asked = match asked {
                Some(asked) => asked,
                None => {
                    validate_key(&this.key)?;
                    this.options.resolve(&this.client.0)?
                }
            };
            let inner = &this.client.0;
            this.check_kind()?;
            if let Some(held) = context::find(inner.id, &this.key, this.kind) {
                if held.names.access.is_shared() && !this.access.is_shared() {
                    return Err(LockError::misuse(
                        ConfigReason::WriteInsideRead,
                        format_args!(
                            "this task holds a read lock on {:?} and would wait for itself \
                             (release the read lock first)",
                            this.key
                        ),
                    ));
                }
                if this.kind == LockKind::Leader {
                    return Err(LockError::misuse(
                        ConfigReason::NestedCampaign,
                        format_args!(
                            "this task leads {:?} already (one term, one label); use that \
                             leadership instead of campaigning again",
                            this.key
                        ),
                    ));
                }
                tracing::trace!(key = %this.key, "lock re-entered by the holding task");
                return Ok(LockGuard::reentered(held, inner.clone()));
            }
            let at_once = super::keep_tasks_running(inner).await?;
            let mut names = KeyNames::of_kind(&inner.prefix, &this.key, this.kind, this.access);
            names.label = this.label;
            if let Some(answer) = Acquisition::try_embedded(inner, &this.key, &names, &asked) {
                return answer.map(|(token, fencing, sent)| {
                    let taken = Taken {
                        key: this.key,
                        names,
                        token,
                        fencing,
                        sent,
                        granted: asked.ttl,
                        handover: false,
                    };
                    hold(inner.clone(), taken, &asked)
                });
            }
            let key = this.key;
            let metrics = asked.metrics.clone();
            let inner = inner.clone();
            // Only mutexes that wait form lines: the other kinds are
            // shared, or few, and a request that keeps the key after its
            // release waits on the server, not in a line whose hand-overs it
            // would hold up.
            let lines = !asked.deadline.tries_once()
                && asked.hold_at_least.is_zero()
                && names.kind == LockKind::Mutex;
            let steps: Pin<Box<dyn Future<Output = _> + Send>> = if lines {
                // Boxed, as the steps are (see `Acquisition::acquire`): a
                // line's state would otherwise sit inline in every caller's
                // future.
                Box::pin(in_line(inner, key, names, asked))
            } else {
                Acquisition::acquire(inner, key, names, asked, resolved_here && at_once)
            };
            let acquired = steps.await;
            if let Err(e) = &acquired
                && !e.is_busy()
            {
                crate::metrics::failed(&metrics);
            }
            acquired
        }
    }

    /// Whether the backend offers this kind of lock, with valid settings.
    fn check_kind(&self) -> Result<(), LockError> {
        match self.kind {
            LockKind::Mutex => Ok(()),
            LockKind::Leader
                if matches!(self.client.0.backend, crate::backend::Backend::Redlock(_)) =>
            {
                Err(LockError::Config(
                    "leader election is not offered on Redlock: a leader's record (its label and \
                     term) is written in the same script call as the grant, and candidates queue \
                     on the server, which Redlock's independent masters cannot do as one step; \
                     use one Redis, Sentinel or a Cluster"
                        .into(),
                ))
            }
            LockKind::Leader => Ok(()),
            LockKind::Semaphore if self.access == Access::Shared(0) => Err(LockError::misuse(
                ConfigReason::ZeroPermits,
                format_args!("nobody could ever hold {:?}", self.key),
            )),
            kind if !self.client.0.backend.offers(kind) => Err(LockError::Config(format!(
                "{} are not offered on the {} backend (Redlock offers the mutex, \
                 lock_all and hold_at_least)",
                match kind {
                    LockKind::Semaphore => "semaphores",
                    _ => "read-write locks",
                },
                self.client.0.backend.describe()
            ))),
            _ => Ok(()),
        }
    }

    /// Runs `fut` while holding the lock; see [`LockClient::with_lock`].
    ///
    /// ```
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_runtime::LockError> {
    /// # let client = lock_runtime::LockClient::builder().memory().build().await?;
    /// let receipt = client
    ///     .lock("order:42")
    ///     .ttl(Duration::from_secs(10))
    ///     .wait(Duration::from_secs(2))
    ///     .run(async { "paid" })
    ///     .await?;
    /// assert_eq!(receipt, "paid");
    /// # Ok(())
    /// # }
    /// ```
    // Not an `async fn`: the body is boxed as the call is made (see
    // `crate::run`).
    pub fn run<F: Future>(self, fut: F) -> impl Future<Output = Result<F::Output, LockError>> {
        let fut = Box::pin(fut);
        async move {
            let guard = self.acquire().await?;
            let held = guard.held().clone();
            let body = unless_lost(std::slice::from_ref(&held), fut);
            let output = context::scope(held.clone(), body).await;
            end_run(
                std::slice::from_ref(&held),
                output,
                guard,
                |guard| async move { [guard.release().await] },
            )
            .await
        }
    }
}

/// A mutex request that waits: first in this client's line for its key
/// (tasks of this client that want the same key form a line: one acquires
/// on the server, the others are handed the lock in-process; see `local`),
/// then, as the line's representative or alone, the steps.
// Not an `async fn`, as `acquire_as`.
#[allow(clippy::manual_async_fn)]
fn in_line(
    inner: Arc<Inner>,
    key: String,
    names: KeyNames,
    asked: Asked,
) -> impl Future<Output = Result<LockGuard, LockError>> + Send {
    async move {
        let owner: Arc<dyn Owner> = inner.clone();
        let representing = loop {
            let entry = inner
                .local
                .enter(&owner, &key, asked.ttl, asked.renew, &asked.metrics);
            let ticket = match entry {
                LocalEntry::Queued(ticket) => ticket,
                LocalEntry::Represent(duty) => break Some(duty),
                LocalEntry::Alone => break None,
            };
            match inner.local.wait(ticket, asked.deadline.at()).await {
                LocalWait::Granted(held) => return Ok(LockGuard::owner(held, inner.clone())),
                LocalWait::TimedOut { retry_after } => {
                    let waited = asked.deadline.started().elapsed();
                    crate::metrics::busy(&asked.metrics, waited);
                    let retry_after = inner.hints.hint(&key, retry_after);
                    return Err(LockError::Busy { key, retry_after });
                }
                LocalWait::Represent(duty) => break Some(duty),
                LocalWait::Closed => {}
            }
        };
        // Ends the role (the line learns whether the key is held) however
        // the acquisition ends.
        let _representing = representing;
        // Its start may lie a wait in the line ago.
        Acquisition::acquire(inner, key, names, asked, false).await
    }
}
