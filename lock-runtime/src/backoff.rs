//! [`Backoff`]: the one exponential back-off of the crate, and [`Retry`]:
//! the one set of rules for sending a step again (or looking again, or
//! reconnecting), with the two pauses that are not back-offs
//! ([`renewal_retry`], [`split_vote_pause`]). Locks and idempotency records send their steps
//! through [`Retrying::send`] and [`Retry::spawn`], and give back what
//! nobody waits for through [`release_in_background`].

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::LockError;

/// Pauses that double from `first` up to `max`: what every [`Retry`]
/// policy pauses by.
#[derive(Clone, Debug)]
pub(crate) struct Backoff {
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub(crate) const fn new(first: Duration, max: Duration) -> Self {
        Self { max, next: first }
    }

    /// The pause the next [`wait`](Self::wait) takes.
    pub(crate) fn peek(&self) -> Duration {
        self.next
    }

    /// Takes the next pause (without sleeping) and doubles the one after.
    pub(crate) fn advance(&mut self) -> Duration {
        let pause = self.next;
        self.next = (self.next * 2).min(self.max);
        pause
    }

    /// Sleeps for the next pause.
    pub(crate) async fn wait(&mut self) {
        tokio::time::sleep(self.advance()).await;
    }
}

/// When a step whose answer did not come back (a broken connection) or
/// that was refused for now (a slot in migration) is sent again: how many
/// times, for how long, after which pauses. One named policy per kind of
/// step, side by side, so that changing one is done here and is seen
/// against the others. Every step retried under one is safe to send twice
/// (the same token: a copy that ran leaves nothing a second copy breaks).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Retry {
    /// Re-sends at most.
    times: u32,
    /// No re-send whose pause would end later than this after the retrying
    /// began (`None`: only the caller's own deadline bounds it).
    within: Option<Duration>,
    /// The first re-send goes at once: the driver reconnects a broken
    /// connection by itself, and the caller is waiting for the answer.
    first_at_once: bool,
    /// The back-off between the others.
    first: Duration,
    max: Duration,
    /// Also re-sends a step the server refused on purpose (an error reply:
    /// out of memory, a script busy, a replica read-only mid-failover), not
    /// only one whose answer did not come back.
    refused: bool,
}

impl Retry {
    /// An acquire's script (and a record's claim): re-sent over the whole
    /// acquisition while the server does not answer, within its wait and
    /// for 10 s at most; the first at once, then 20 ms doubling to 500 ms.
    /// A caller that waits is willing to wait that long for the lock, so a
    /// restart, or a Sentinel failover (seconds: `down-after-milliseconds`,
    /// then the vote), within the wait is ridden out rather than failing in
    /// its first second; the 10 s bound makes an unbounded wait (a
    /// `campaign()`) report a server that stays down. The wait bounds it,
    /// so a short wait is not stretched. (An acquire that tries once gets
    /// its first re-send anyway, unless the failure was a timeout, which
    /// took its time already: see `client/acquire.rs`.)
    pub(crate) const ACQUIRE: Retry = Retry {
        times: u32::MAX,
        within: Some(Duration::from_secs(10)),
        first_at_once: true,
        first: Duration::from_millis(20),
        max: Duration::from_millis(500),
        refused: false,
    };

    /// One re-send, at once: steps whose caller waits for the answer and
    /// that would otherwise leave keys taken for the rest of their lease
    /// (`lock_all`'s atomic step, a `hold_at_least` release) or fail a
    /// holder that still holds (a fencing token's mint). A second failure
    /// is the caller's to see.
    pub(crate) const ONCE: Retry = Retry {
        times: 1,
        within: None,
        first_at_once: true,
        first: Duration::ZERO,
        max: Duration::ZERO,
        refused: false,
    };

    /// A release refused by a node that cannot serve it yet (`TRYAGAIN`,
    /// `ASK`, `MOVED` while its slot migrates; a failover: it did not run):
    /// for 5 s, 20 ms doubling to 250 ms. The driver's own retries last well
    /// under a second; given up, the key would wait out its lease.
    pub(crate) const SLOT_MIGRATION: Retry = Retry {
        times: u32::MAX,
        within: Some(Duration::from_secs(5)),
        first_at_once: false,
        first: Duration::from_millis(20),
        max: Duration::from_millis(250),
        refused: false,
    };

    /// A release nobody waits for (a dropped guard, an abandoned
    /// acquisition): for 30 s, 100 ms doubling to 2 s, long enough for a
    /// paused server or a failover. A queue entry left behind would be
    /// handed the key at every release ahead of it (each costing a
    /// hand-over lease), and a lock that was ours would wait out its lease.
    pub(crate) const RELEASE_IN_BACKGROUND: Retry = Retry {
        times: u32::MAX,
        within: Some(Duration::from_secs(30)),
        first_at_once: false,
        first: Duration::from_millis(100),
        max: Duration::from_secs(2),
        refused: false,
    };

    /// A record's completion whose answer did not come back (a repeated
    /// completion finds our result stored), or that the server refused (a
    /// server out of memory for a moment): 10 ms doubling to 250 ms, until
    /// the caller's deadline (a lease, at least two seconds: a completion
    /// given up leaves the work to run again once the lease ends).
    #[cfg(feature = "idempotency")]
    pub(crate) const COMPLETION: Retry = Retry {
        times: u32::MAX,
        within: None,
        first_at_once: false,
        first: Duration::from_millis(10),
        max: Duration::from_millis(250),
        refused: true,
    };

    /// A waiter whose notices are not confirmed (the subscription refused
    /// by an ACL, the notice connection down) looks again: 10 ms doubling
    /// to 250 ms, within its wait. The lease stays its other timer.
    #[cfg(feature = "idempotency")]
    pub(crate) const LOOK_AGAIN: Retry = Retry {
        times: u32::MAX,
        within: None,
        first_at_once: false,
        first: Duration::from_millis(10),
        max: Duration::from_millis(250),
        refused: false,
    };

    /// Redlock, within 100 ms of a free notice (or of the retry after
    /// registering): the first 4 split votes with every master answering
    /// pause 4, 8, 16, 32 ms. Such a split is likelier our retry crossing a
    /// release on the masters than a contender's, and it holds once the
    /// release got there; other splits pause up to a per-node timeout
    /// ([`split_vote_pause`]).
    pub(crate) const CROSSING: Retry = Retry {
        times: 4,
        within: Some(Duration::from_millis(100)),
        first_at_once: false,
        first: Duration::from_millis(4),
        max: Duration::from_millis(32),
        refused: false,
    };

    /// The notice connection, lost or refused, reconnects for as long as
    /// anybody waits: 20 ms doubling to 1 s, from 20 ms again once it is
    /// back. Waiters do not depend on it meanwhile (their holder's lease,
    /// and `LOOK_AGAIN` for a record's, are their other
    /// timers), so the 1 s cap only bounds how soon notices come back after
    /// a long outage, and keeps a server that stays down from being
    /// dialled more than once a second by each client.
    pub(crate) const RECONNECT_NOTICES: Retry = Retry {
        times: u32::MAX,
        within: None,
        first_at_once: false,
        first: Duration::from_millis(20),
        max: Duration::from_secs(1),
        refused: true,
    };

    /// A leader observer whose read of the election failed (the server
    /// unreachable) reads again: 50 ms doubling to 1 s, for as long as it
    /// is observed, from 50 ms again after a read that worked. Its
    /// receivers keep the last leader they saw meanwhile; a notice wakes it
    /// sooner.
    pub(crate) const REREAD_LEADER: Retry = Retry {
        times: u32::MAX,
        within: None,
        first_at_once: false,
        first: Duration::from_millis(50),
        max: Duration::from_secs(1),
        refused: true,
    };

    /// Starts retrying under this policy (its time bound runs from now).
    pub(crate) fn start(self) -> Retrying {
        Retrying {
            policy: self,
            done: 0,
            backoff: Backoff::new(self.first, self.max),
            give_up: self.within.map(|within| Instant::now() + within),
        }
    }
}

/// One step's retries under a [`Retry`] policy.
#[derive(Debug)]
pub(crate) struct Retrying {
    policy: Retry,
    /// Re-sends so far.
    done: u32,
    backoff: Backoff,
    give_up: Option<Instant>,
}

impl Retrying {
    /// Whether the policy allows another send: re-sends left, and the
    /// pause before it ending before the policy's bound and `deadline`
    /// (the caller's own, if any).
    pub(crate) fn allows(&self, deadline: Option<Instant>) -> bool {
        if self.done >= self.policy.times {
            return false;
        }
        let next = Instant::now() + self.backoff.peek();
        self.give_up.is_none_or(|at| next < at) && deadline.is_none_or(|at| next < at)
    }

    /// Whether a step that failed with `e` is sent again: its answer did
    /// not come back (a broken connection, or too few Redlock nodes
    /// answering to tell), or too few replicas acknowledged it on a
    /// Sentinel master the sentinels are now asked for again, with re-sends
    /// left before `deadline`; a step whose caller tries once (its deadline
    /// is now) still gets its first re-send, unless the failure was a
    /// timeout or a `WAIT`, which took their time already.
    pub(crate) fn resends(&self, e: &LockError, deadline: Option<Instant>) -> bool {
        let LockError::Backend(b) = e else {
            return false;
        };
        let took_its_time = b.is_timeout() || b.is_master_suspect();
        (b.is_connection()
            || b.is_outcome_unknown()
            || b.is_master_suspect()
            || self.policy.refused)
            && (self.allows(deadline) || (self.done == 0 && !took_its_time))
    }

    /// Starts over, after a step that worked: the next pause is the
    /// policy's first, and its time bound runs from now.
    pub(crate) fn reset(&mut self) {
        *self = self.policy.start();
    }

    /// `true` once the policy's time bound has passed.
    pub(crate) fn ended(&self) -> bool {
        self.give_up.is_some_and(|at| Instant::now() >= at)
    }

    /// Takes the next pause without sleeping (for a caller that sleeps on
    /// something else too), and counts it.
    pub(crate) fn next_pause(&mut self) -> Duration {
        self.done = self.done.saturating_add(1);
        self.backoff.advance()
    }

    /// Sends `step` until it is answered, again after each broken
    /// connection that [`resends`](Self::resends) allows before `deadline`
    /// (`what` names the step in the debug log). Only for steps that are
    /// safe to send twice.
    pub(crate) async fn send<T, Fut>(
        &mut self,
        what: &str,
        deadline: Option<Instant>,
        mut step: impl FnMut() -> Fut,
    ) -> Result<T, LockError>
    where
        Fut: Future<Output = Result<T, LockError>>,
    {
        loop {
            match step().await {
                Err(e) if self.resends(&e, deadline) => {
                    tracing::debug!(
                        error = &e as &dyn std::error::Error,
                        "{what}: unanswered; sending it again"
                    );
                    self.pause().await;
                }
                answer => return answer,
            }
        }
    }

    /// Takes the pause before the next send (none before a first re-send
    /// that goes at once), and counts it.
    pub(crate) async fn pause(&mut self) {
        if self.done > 0 || !self.policy.first_at_once {
            self.backoff.wait().await;
        }
        self.done = self.done.saturating_add(1);
    }
}

impl Retry {
    /// [`Retrying::send`] as a task of its own on the current runtime, the
    /// caller not waiting (a release nobody waits for): `report` gets the
    /// answer. `false` outside a runtime: nothing was sent (a lease then
    /// runs out by itself).
    pub(crate) fn spawn<T, Fut>(
        self,
        what: &'static str,
        step: impl FnMut() -> Fut + Send + 'static,
        report: impl FnOnce(Result<T, LockError>) + Send + 'static,
    ) -> bool
    where
        Fut: Future<Output = Result<T, LockError>> + Send,
        T: Send + 'static,
    {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        runtime.spawn(async move { report(self.start().send(what, None, step).await) });
        true
    }
}

/// What our token may hold on a server and nobody waits to give back: a
/// dropped guard's lease, an abandoned acquisition's, an unsettled
/// idempotency record's claim. [`release_in_background`] sends it.
pub(crate) trait Release: Send + Sync + 'static {
    /// What a background release of it is called in the debug log.
    const WHAT: &'static str;
    /// Where its client counts the releases in flight in the background
    /// (`LockClient::shutdown` waits for them).
    fn background_releases(&self) -> &BackgroundReleases;
    /// What one release answers.
    type Released: Send + 'static;
    /// One release with our token. Safe to send twice: a release that
    /// finds nothing of ours changes nothing.
    fn release_once(&self) -> impl Future<Output = Result<Self::Released, LockError>> + Send;
    /// Logs what became of the release.
    fn report(&self, released: &Result<Self::Released, LockError>);
}

/// What our token may hold on a server while a claim is under way or
/// unsettled (a lock's acquisition, a record's claim, a record taken and
/// not completed): dropped while armed, it is released in the background
/// ([`release_in_background`]).
pub(crate) struct Armed<R: Release> {
    /// `None` once settled.
    held: Option<R>,
    armed: bool,
}

impl<R: Release> Armed<R> {
    /// `held`, armed or not yet (nothing of it sent).
    pub(crate) fn new(held: R, armed: bool) -> Self {
        let held = Some(held);
        Self { held, armed }
    }

    /// Whether dropping it now releases what it holds.
    pub(crate) fn arm(&mut self, armed: bool) {
        self.armed = armed;
    }

    pub(crate) fn get(&self) -> &R {
        self.held.as_ref().expect("taken only when settled")
    }

    /// Disarms it and takes what it holds, for the caller to settle.
    pub(crate) fn settle(&mut self) -> R {
        self.armed = false;
        self.held.take().expect("settled once")
    }
}

impl<R: Release> Drop for Armed<R> {
    fn drop(&mut self) {
        if let Some(held) = self.held.take().filter(|_| self.armed) {
            release_in_background(held);
        }
    }
}

/// Releases `held` on the current runtime without blocking, sent again
/// under [`Retry::RELEASE_IN_BACKGROUND`] ([`Release::WHAT`] names it in
/// the debug log). `false` outside a runtime: nothing was sent, and the
/// lease runs out by itself.
pub(crate) fn release_in_background<R: Release>(held: R) -> bool {
    let held = std::sync::Arc::new(held);
    let sender = held.clone();
    let step = move || {
        let held = sender.clone();
        async move { held.release_once().await }
    };
    let entered = held.background_releases().enter();
    Retry::RELEASE_IN_BACKGROUND.spawn(R::WHAT, step, move |released| {
        held.report(&released);
        drop(entered);
    })
}

/// A client's background releases in flight (a dropped guard's, an
/// abandoned acquisition's, an unsettled record's), counted so that
/// `LockClient::shutdown` can wait for them: a task of a runtime that shuts
/// down is dropped, and its release never sent.
#[derive(Debug, Default)]
pub(crate) struct BackgroundReleases(std::sync::Arc<Counted>);

#[derive(Debug, Default)]
struct Counted {
    count: std::sync::atomic::AtomicUsize,
    idle: tokio::sync::Notify,
}

/// One release in flight, counted until dropped.
#[derive(Debug)]
pub(crate) struct Entered(std::sync::Arc<Counted>);

impl BackgroundReleases {
    /// Counts one more release in flight, until the answer is dropped.
    pub(crate) fn enter(&self) -> Entered {
        self.0
            .count
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Entered(self.0.clone())
    }

    /// Resolves once no release is in flight.
    pub(crate) async fn idle(&self) {
        loop {
            let notified = self.0.idle.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if self.0.count.load(std::sync::atomic::Ordering::Acquire) == 0 {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        if self
            .0
            .count
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel)
            == 1
        {
            self.0.idle.notify_waiters();
        }
    }
}

/// When the watchdog tries a renewal again after one that got no answer:
/// after a thirtieth of the lease (5 ms at least), capped by the lease's
/// validity, so about ten tries fit in the third of a lease left when a
/// renewal is due, and a server back within that keeps the lease.
pub(crate) fn renewal_retry(ttl: Duration) -> Duration {
    (ttl / 30).max(Duration::from_millis(5))
}

/// Redlock: the pause after a split vote (contenders each took some masters
/// and nobody a majority). Woken by the same notices, they would all try
/// again at once and split again: a random pause lets one win (Redlock's
/// advice). `brief`: within [`Retry::CROSSING`] with every master answering,
/// half of it to all of it; otherwise up to `per_node`, the longest an
/// attempt waits for a dead master (at most a tenth of the lease), so
/// contenders are staggered by up to a whole attempt.
pub(crate) fn split_vote_pause(brief: Option<Duration>, per_node: Duration) -> Duration {
    match brief {
        Some(cap) => cap / 2 + random_below(cap / 2),
        None => random_below(per_node),
    }
}

/// A random pause in `[0, cap)`.
fn random_below(cap: Duration) -> Duration {
    let cap = cap.as_micros().max(1) as u64;
    let draw = getrandom::u64().unwrap_or(0);
    Duration::from_micros(draw % cap)
}

#[cfg(test)]
mod tests;
