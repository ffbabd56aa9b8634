//! Leader election: [`LockClient::leader`], [`Leadership`], [`Leader`].
//!
//! A leadership is a lock of its own kind (`leader("x")` never meets
//! `lock("x")`), taken, queued for, renewed, handed over and lost exactly
//! as a mutex is: candidates queue in order, a resign is a release (the
//! next candidate is elected in about one round trip), a leader that dies
//! is replaced within its lease plus one round trip, and the watchdog
//! renews the lease every `ttl / 3`. The **term** is the lock's fencing
//! token: strictly increasing across leaders, so it fences the leader's
//! writes ([`crate::fence`]).
//!
//! Observers read a small record beside the lock, `<term>:<label>`,
//! written by the same script call as each grant or hand-over with the
//! lease's expiry, deleted by a resign that hands over to nobody, and
//! announced on the name's notice channel at every change ([`observe`]).
//!
//! `request`: what a candidate configures; `observe`: following who leads.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use crate::backend::labels;
use crate::client::LockGuard;
use crate::client::{LockClient, LockOptions};
use crate::key::{KeyNames, validate_key};
use crate::run::{end_run, unless_lost};
use crate::{context, error::LockError};

mod observe;

/// Who leads an election: what [`LeaderRequest::observe`] and
/// [`LockClient::leaders`] report.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The election's name (as given to [`LockClient::leader`]).
    pub name: String,
    /// The leader's label ([`LeaderRequest::label`]).
    pub label: String,
    /// Its term: the fencing token of its leadership, strictly greater than
    /// every earlier leader's.
    pub term: u64,
}

/// A campaign for the leadership `name`, from [`LockClient::leader`].
/// Configure, then [`campaign`](Self::campaign), [`run`](Self::run) or
/// [`observe`](Self::observe).
#[derive(Clone, Debug)]
#[must_use = "a leader request does nothing until `.campaign()`, `.run(fut)` or `.observe()`"]
pub struct LeaderRequest {
    client: LockClient,
    name: String,
    /// The options every lock request shares, checked as a lock's are when
    /// the campaign starts. A leadership sets the lease and the wait only:
    /// it is always renewed, ends when it resigns (no `hold_at_least`), and
    /// its metrics are named by the election.
    options: LockOptions,
    /// `None`: the client's label.
    label: Option<String>,
    /// The `name` label of its metrics: the election's name unless set.
    metrics_name: String,
}

impl LeaderRequest {
    pub(crate) fn new(client: LockClient, name: String) -> Self {
        // A campaign waits without bound unless told otherwise.
        let options = LockOptions::new()
            .wait(Duration::MAX)
            .metrics_name(name.as_str());
        Self {
            client,
            metrics_name: name.clone(),
            name,
            options,
            label: None,
        }
    }

    /// The `name` label of this election's metrics (feature `metrics`;
    /// default: the election's name, as elections usually have a few
    /// fixed names): one name for many elections (`"tenant-scheduler"` for
    /// `scheduler:<tenant>`), so they share one series instead of one each.
    /// Its `lock_leader` gauge then counts the elections of the name this
    /// process leads. Without the feature it is ignored.
    pub fn metrics_name(mut self, name: impl Into<String>) -> Self {
        self.metrics_name = name.into();
        self.options = self.options.metrics_name(self.metrics_name.as_str());
        self
    }

    crate::client::lease_setters! {
        /// The lease (default: the client's), renewed every `ttl / 3` while
        /// leading. A leader that dies is replaced within it plus one round trip.
        ttl;
        /// How long [`campaign`](Self::campaign) waits to be elected (default:
        /// without bound); then `LockError::Busy`. `Duration::ZERO`: try once;
        /// a wait above [`MAX_WAIT`](crate::MAX_WAIT) waits that long.
        wait;
    }

    /// What observers see while this candidate leads (default: the client's
    /// [label](crate::LockClientBuilder::label), `hostname:pid` unless set).
    /// At most [`MAX_LABEL_LEN`](crate::MAX_LABEL_LEN) bytes, no control characters; never a secret.
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    fn checked_label(&self) -> Result<String, LockError> {
        let label = self
            .label
            .clone()
            .unwrap_or_else(|| self.client.label().to_owned());
        labels::validate("leader's label", &label)?;
        Ok(label)
    }

    /// Waits until elected (in line behind earlier candidates), then leads
    /// until [`Leadership::resign`], a drop of the [`Leadership`], or a lost
    /// lease ([`Leadership::lost`]).
    ///
    /// Errors: `Busy` when [`wait`](Self::wait) ran out; `InvalidKey` for a
    /// bad name; `Config` for a campaign inside a leadership of the same
    /// name that the task holds ([`ConfigReason::NestedCampaign`](crate::ConfigReason::NestedCampaign)),
    /// a bad lease or label, or on Redlock (a
    /// leader's record is written in the same script call as the grant, and
    /// candidates queue on the server: Redlock's independent masters cannot
    /// do either as one step).
    pub async fn campaign(self) -> Result<Leadership, LockError> {
        validate_key(&self.name)?;
        let label = self.checked_label()?;
        crate::metrics::campaigning(&self.metrics_name);
        let guard = self
            .client
            .lock(self.name.clone())
            .options(self.options)
            .leadership(label.clone())
            .acquire()
            .await?;
        crate::metrics::elected(&self.metrics_name);
        tracing::info!(name = %self.name, term = guard.held().fencing(), label = %label, "elected leader");
        Ok(Leadership::new(guard, label, &self.metrics_name))
    }

    /// Runs `fut` while leading: campaigns (as [`campaign`](Self::campaign)),
    /// runs `fut`, and resigns when it ends. If the leadership is lost
    /// mid-way, `fut` is dropped (cancelled) and `Err(LockError::Lost)` is
    /// returned. Inside `fut`, [`crate::current_lock`] gives the term as its
    /// fencing token.
    // Not an `async fn`: the body is boxed as the call is made (see
    // `crate::run`).
    pub fn run<F: Future>(self, fut: F) -> impl Future<Output = Result<F::Output, LockError>> {
        let fut = Box::pin(fut);
        async move {
            let leadership = self.campaign().await?;
            let held = leadership.guard.held().clone();
            let body = unless_lost(std::slice::from_ref(&held), fut);
            let output = context::scope(held.clone(), body).await;
            end_run(
                std::slice::from_ref(&held),
                output,
                leadership,
                |leadership| async move { [leadership.resign().await] },
            )
            .await
        }
    }

    /// Follows who leads `name`, without campaigning: the receiver holds the
    /// current leader (or `None`) when this returns, and each change after
    /// it (a new term, a resign with nobody waiting, a leader whose lease
    /// ran out), in about one round trip. Changes come by notice on the
    /// name's channel, not by polling; a notice lost (a dropped pub/sub
    /// connection) is made up for at the end of the leader's lease.
    ///
    /// The updates stop when every receiver is dropped, or when the client
    /// (every clone of it) is dropped.
    pub async fn observe(self) -> Result<tokio::sync::watch::Receiver<Option<Leader>>, LockError> {
        validate_key(&self.name)?;
        observe::start(&self.client, self.name).await
    }
}

/// A held leadership, from [`LeaderRequest::campaign`]. Dropping it without
/// [`resign`](Self::resign) resigns in the background.
pub struct Leadership {
    guard: LockGuard,
    label: String,
    #[cfg(feature = "metrics")]
    _gauge: crate::metrics::LeadingGauge,
}

impl Leadership {
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    fn new(guard: LockGuard, label: String, metrics_name: &str) -> Self {
        Self {
            #[cfg(feature = "metrics")]
            _gauge: crate::metrics::LeadingGauge::new(metrics_name, guard.lost()),
            guard,
            label,
        }
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        self.guard.key()
    }

    /// The term: the leadership's fencing token, strictly greater than
    /// every earlier leader's of this name. Pass it with every write the
    /// leader makes ([`crate::fence::redis`], `fence::postgres`), so a
    /// leader that was paused past its lease cannot overwrite its
    /// successor's work.
    pub fn term(&self) -> u64 {
        // A leader's grant is a script's: its term is issued with it.
        self.guard.held().fencing().unwrap_or_default()
    }

    /// The label observers see.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Resolves when the leadership is lost (as [`LockGuard::lost`]).
    pub fn lost(&self) -> impl Future<Output = ()> + Send + use<> {
        self.guard.lost()
    }

    /// `true` once the leadership is lost.
    pub fn is_lost(&self) -> bool {
        self.guard.is_lost()
    }

    /// Steps down: the next candidate in line is elected at once (or
    /// observers see `None` when nobody waits). `Err(LockError::Lost)` if
    /// the leadership had been lost already.
    pub async fn resign(self) -> Result<(), LockError> {
        let name = self.guard.key().to_owned();
        let resigned = self.guard.release().await;
        tracing::info!(name = %name, "resigned leadership");
        resigned
    }
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("name", &self.name())
            .field("term", &self.term())
            .field("label", &self.label)
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl LockClient {
    /// Starts a campaign for (or a look at) the leadership `name`: at most
    /// one leader per name at a time, elected in line, with a term that is
    /// a fencing token. See [`LeaderRequest`].
    ///
    /// ```
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_runtime::LockError> {
    /// # let client = lock_runtime::LockClient::builder().memory().build().await?;
    /// let mut who = client.leader("report-scheduler").observe().await?;
    /// let leadership = client
    ///     .leader("report-scheduler")
    ///     .ttl(Duration::from_secs(10))
    ///     .label("pod-a")
    ///     .campaign()
    ///     .await?;
    /// who.changed().await.unwrap();
    /// assert_eq!(who.borrow().as_ref().unwrap().term, leadership.term());
    /// leadership.resign().await?;
    /// who.changed().await.unwrap();
    /// assert!(who.borrow().is_none());
    /// # Ok(())
    /// # }
    /// ```
    pub fn leader(&self, name: impl Into<String>) -> LeaderRequest {
        LeaderRequest::new(self.clone(), name.into())
    }

    /// Up to `limit` elected leaders whose names start with `starting_with`
    /// (`""`: all), by name. Found by `SCAN` (never `KEYS`), on a cluster
    /// master after master; `Config` on Redlock.
    pub async fn leaders(
        &self,
        starting_with: &str,
        limit: usize,
    ) -> Result<Vec<Leader>, LockError> {
        let found = self
            .0
            .backend
            .scan_leaders(&self.0.prefix, starting_with, limit)
            .await?;
        Ok(found
            .into_iter()
            .map(|(name, (label, term, _))| Leader { name, label, term })
            .collect())
    }

    /// The names of the leadership `name` (for the observer).
    pub(crate) fn leader_names(&self, name: &str) -> KeyNames {
        KeyNames::leader(&self.0.prefix, name)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::client::LockClient;

    #[tokio::test]
    async fn a_campaign_answers_every_lease_and_wait_as_a_lock_does() {
        let client = LockClient::builder().memory().build().await.unwrap();
        for d in [
            Duration::ZERO,
            Duration::from_millis(1),
            Duration::from_millis(u64::MAX),
            Duration::MAX,
        ] {
            let lock = client.lock("k").ttl(d).acquire().await.map(drop);
            let leader = client.leader("k").ttl(d).campaign().await.map(drop);
            assert!(lock.as_ref().is_err_and(|e| e.is_config()), "ttl {d:?}");
            assert_eq!(format!("{leader:?}"), format!("{lock:?}"), "ttl {d:?}");
        }
        // A huge wait is a wait without bound in practice; a free name is
        // had at once whatever the wait.
        for d in [
            Duration::ZERO,
            Duration::from_millis(u64::MAX),
            Duration::MAX,
        ] {
            let leadership = client.leader("k").wait(d).campaign().await.unwrap();
            leadership.resign().await.unwrap();
        }
    }
}
