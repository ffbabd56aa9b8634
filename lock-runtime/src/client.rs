//! [`LockClient`], its builder, and [`LockRequest`].

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::redlock::RedlockBackend;
use crate::backend::{AcquireOutcome, Backend, HANDOFF_LEASE};
use crate::backend::{memory::MemoryBackend, redis::RedisBackend, redis::RedisOptions};
use crate::guard::{Held, LockGuard, release_in_background};
use crate::key::{KeyNames, validate_key, validate_prefix};
use crate::token::Token;
use crate::watchdog::Watchdog;
use crate::{LockError, context};

/// The shortest lease accepted. Shorter leases cannot be renewed reliably
/// across a network round trip and a busy scheduler.
pub const MIN_TTL: Duration = Duration::from_millis(50);

/// The longest lease accepted (one week).
pub const MAX_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// The lease used when neither the client nor the request sets one.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

static NEXT_CLIENT_ID: AtomicU64 = AtomicU64::new(1);

/// How often one acquire re-tries after a broken connection (within its wait;
/// a try-once acquire re-tries once, at once).
const MAX_CONNECTION_RETRIES: u32 = 8;

/// A handle on a lock backend. Cheap to clone (an `Arc`); clones share the
/// connections, the notice subscriber and the watchdogs.
///
/// ```
/// use std::time::Duration;
/// use lock_runtime::LockClient;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_runtime::LockError> {
/// let client = LockClient::builder()
///     .memory() // or .redis("redis://127.0.0.1:6379")
///     .key_prefix("lock:")
///     .default_ttl(Duration::from_secs(30))
///     .build()
///     .await?;
///
/// let guard = client
///     .lock("order:42")
///     .ttl(Duration::from_secs(10))
///     .wait(Duration::from_secs(2))
///     .acquire()
///     .await?;
/// println!("fencing token {}", guard.fencing_token());
/// guard.release().await?;
///
/// let total = client.with_lock("order:42", async { 40 + 2 }).await?;
/// assert_eq!(total, 42);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct LockClient(pub(crate) Arc<Inner>);

pub(crate) struct Inner {
    pub(crate) id: u64,
    pub(crate) backend: Backend,
    pub(crate) prefix: String,
    pub(crate) default_ttl: Duration,
    pub(crate) watchdog: Watchdog,
    next_lock_id: AtomicU64,
}

impl fmt::Debug for LockClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockClient")
            .field("backend", &self.0.backend.describe())
            .field("prefix", &self.0.prefix)
            .field("default_ttl", &self.0.default_ttl)
            .finish_non_exhaustive()
    }
}

impl LockClient {
    /// Starts configuring a client.
    pub fn builder() -> LockClientBuilder {
        LockClientBuilder::default()
    }

    /// Starts a request for the lock named `key` (without the prefix). Nothing
    /// happens until [`LockRequest::acquire`] or [`LockRequest::run`].
    pub fn lock(&self, key: impl Into<String>) -> LockRequest {
        LockRequest {
            client: self.clone(),
            key: key.into(),
            ttl: None,
            wait: Duration::ZERO,
            renew: true,
        }
    }

    /// Runs `fut` while holding the lock `key` (default lease, trying once).
    ///
    /// The lock is released when `fut` completes, returns an error or panics.
    /// If the lease is lost mid-way, `fut` is dropped (cancelled) and
    /// `Err(LockError::Lost)` is returned: `Lost` means the lease may have
    /// ended before the work finished. Once `fut` has completed while the
    /// lease was valid, its output is returned whatever the release answers
    /// (a failed release is a `tracing` warning naming the key; the lease then
    /// runs out by itself), so a caller is never told "lost" about work that
    /// ran under the lock. Inside `fut`, [`crate::current_lock`]
    /// gives the fencing token, and locking `key` again re-enters instead of
    /// deadlocking. Use [`LockRequest::run`] to set the lease or the wait.
    pub async fn with_lock<F: Future>(
        &self,
        key: impl Into<String>,
        fut: F,
    ) -> Result<F::Output, LockError> {
        self.lock(key).run(fut).await
    }

    /// The key prefix every name of this client starts with.
    pub fn key_prefix(&self) -> &str {
        &self.0.prefix
    }

    /// The lease used when a request sets none.
    pub fn default_ttl(&self) -> Duration {
        self.0.default_ttl
    }

    /// How many leases the watchdog keeps alive: one per held guard (re-entered
    /// guards share their owner's). A diagnostic: it returns to zero when every
    /// guard is released or dropped. All leases of a client are renewed by one
    /// background task, in batches.
    pub fn active_watchdogs(&self) -> usize {
        self.0.watchdog.live()
    }

    /// Deletes the lock `key` regardless of its owner, as an operator's `DEL`
    /// would. The holder finds out at its next renewal. For tests and
    /// emergencies; not part of normal operation.
    #[doc(hidden)]
    pub async fn force_delete(&self, key: &str) -> Result<(), LockError> {
        validate_key(key)?;
        self.0
            .backend
            .delete(&KeyNames::new(&self.0.prefix, key))
            .await
    }

    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    pub(crate) fn backend(&self) -> &Backend {
        &self.0.backend
    }
}

/// Configures a [`LockClient`]; finish with [`build`](LockClientBuilder::build).
#[derive(Clone)]
pub struct LockClientBuilder {
    target: Target,
    prefix: String,
    default_ttl: Duration,
    connect_timeout: Duration,
    response_timeout: Duration,
    replica_acks: Option<(u32, Duration)>,
}

#[derive(Clone)]
enum Target {
    Unset,
    Redis(String),
    Redlock(Vec<String>),
    Sentinel(String, Vec<String>),
    Cluster(Vec<String>),
    Memory,
}

impl Default for LockClientBuilder {
    fn default() -> Self {
        Self {
            target: Target::Unset,
            prefix: "lock:".into(),
            default_ttl: DEFAULT_TTL,
            connect_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(1),
            replica_acks: None,
        }
    }
}

impl fmt::Debug for LockClientBuilder {
    // By hand: a Redis URL may carry a password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let target = match &self.target {
            Target::Unset => "unset",
            Target::Redis(_) => "redis",
            Target::Redlock(_) => "redlock",
            Target::Sentinel(..) => "sentinel",
            Target::Cluster(_) => "cluster",
            Target::Memory => "memory",
        };
        f.debug_struct("LockClientBuilder")
            .field("target", &target)
            .field("prefix", &self.prefix)
            .field("default_ttl", &self.default_ttl)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("replica_acks", &self.replica_acks)
            .finish()
    }
}

impl LockClientBuilder {
    /// One Redis or Valkey server: `redis://[user:password@]host:port[/db]`, or
    /// `rediss://` with the `tls` feature. ACL users and passwords come from the
    /// URL.
    pub fn redis(mut self, url: impl Into<String>) -> Self {
        self.target = Target::Redis(url.into());
        self
    }

    /// Redlock over independent masters (an odd number, at least 3): a lock is
    /// held while a majority grants it. See the README's scale-out section for
    /// what it needs from the servers (delayed restarts or `appendfsync always`).
    pub fn redlock<I, S>(mut self, urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.target = Target::Redlock(urls.into_iter().map(Into::into).collect());
        self
    }

    /// The master of a Redis Sentinel group, discovered through the sentinels
    /// (`redis://host:26379` URLs) and re-discovered after a failover. Combine
    /// with [`min_replica_acks`](Self::min_replica_acks) to make a lock
    /// survive the failover.
    pub fn sentinel<I, S>(mut self, master_name: impl Into<String>, sentinel_urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.target = Target::Sentinel(
            master_name.into(),
            sentinel_urls.into_iter().map(Into::into).collect(),
        );
        self
    }

    /// A Redis Cluster, reached through any of `seed_urls`. Keys are
    /// hash-tagged, so a lock, its fencing counter, its waiter queue and its
    /// notice channel live in one slot; notices use sharded pub/sub.
    pub fn cluster<I, S>(mut self, seed_urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.target = Target::Cluster(seed_urls.into_iter().map(Into::into).collect());
        self
    }

    /// After every acquire and renewal, `WAIT` until `replicas` replicas
    /// acknowledged the write, at most `timeout`. With fewer, an acquire
    /// releases the lock and fails with `LockError::Backend` (saying how many
    /// acknowledged), and a renewal counts as unconfirmed. For `.redis(..)`
    /// and `.sentinel(..)`.
    ///
    /// This narrows the failover window; it does not close it: `WAIT` makes a
    /// write reach replicas, not a promoted replica be one of them, and it
    /// does not make writes durable on disk.
    pub fn min_replica_acks(mut self, replicas: u32, timeout: Duration) -> Self {
        self.replica_acks = Some((replicas, timeout));
        self
    }

    /// The embedded in-process backend: the same semantics, but only within
    /// this process (not distributed). For examples and unit tests.
    pub fn memory(mut self) -> Self {
        self.target = Target::Memory;
        self
    }

    /// The namespace every name of this client starts with (default `"lock:"`).
    /// At most 128 bytes; no braces (the key's own hash tag decides the slot).
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The lease of requests that set none (default 30 s).
    pub fn default_ttl(mut self, ttl: Duration) -> Self {
        self.default_ttl = ttl;
        self
    }

    /// How long `build` and reconnects wait for a connection (default 2 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long one command may take before it fails with a timeout (default 1 s).
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Checks the configuration, connects and loads the scripts.
    ///
    /// `LockError::Config` for a missing backend, a malformed URL or a bad
    /// prefix or TTL; `LockError::Backend` when the server cannot be reached or
    /// refuses the credentials.
    pub async fn build(self) -> Result<LockClient, LockError> {
        validate_prefix(&self.prefix)?;
        validate_ttl(self.default_ttl)?;
        for (name, t) in [
            ("connect_timeout", self.connect_timeout),
            ("response_timeout", self.response_timeout),
        ] {
            if t.is_zero() || t > Duration::from_secs(3600) {
                return Err(LockError::Config(format!(
                    "{name} must be above zero and at most one hour"
                )));
            }
        }
        if let Some((_, timeout)) = self.replica_acks
            && (timeout.is_zero() || timeout > Duration::from_secs(3600))
        {
            return Err(LockError::Config(
                "the replica acknowledgement timeout must be above zero and at most one hour"
                    .into(),
            ));
        }
        let options = RedisOptions {
            connect_timeout: self.connect_timeout,
            response_timeout: self.response_timeout,
            replica_acks: self.replica_acks,
        };
        let backend = match self.target {
            Target::Unset => {
                return Err(LockError::Config(
                    "no backend chosen: call `.redis(url)` or `.memory()` on the builder".into(),
                ));
            }
            Target::Memory => Backend::Memory(Arc::new(MemoryBackend::default())),
            Target::Redis(url) => {
                Backend::Redis(Arc::new(RedisBackend::connect(&url, &options).await?))
            }
            Target::Sentinel(master, sentinels) => Backend::Redis(Arc::new(
                RedisBackend::sentinel(&master, &sentinels, &options).await?,
            )),
            Target::Cluster(seeds) => {
                only_single_or_sentinel(self.replica_acks)?;
                Backend::Redis(Arc::new(RedisBackend::cluster(&seeds, &options).await?))
            }
            Target::Redlock(urls) => {
                only_single_or_sentinel(self.replica_acks)?;
                Backend::Redlock(Arc::new(RedlockBackend::connect(&urls, &options).await?))
            }
        };
        tracing::debug!(backend = backend.describe(), prefix = %self.prefix, "lock client ready");
        Ok(LockClient(Arc::new(Inner {
            id: NEXT_CLIENT_ID.fetch_add(1, Ordering::Relaxed),
            watchdog: Watchdog::start(backend.clone()),
            backend,
            prefix: self.prefix,
            default_ttl: self.default_ttl,
            next_lock_id: AtomicU64::new(1),
        })))
    }
}

fn only_single_or_sentinel(replica_acks: Option<(u32, Duration)>) -> Result<(), LockError> {
    match replica_acks {
        Some(_) => Err(LockError::Config(
            "min_replica_acks is for `.redis(..)` and `.sentinel(..)`".into(),
        )),
        None => Ok(()),
    }
}

pub(crate) fn validate_ttl(ttl: Duration) -> Result<(), LockError> {
    if ttl < MIN_TTL {
        return Err(LockError::Config(format!(
            "the lease {} is below the minimum of {}",
            humantime::format_duration(ttl),
            humantime::format_duration(MIN_TTL)
        )));
    }
    if ttl > MAX_TTL {
        return Err(LockError::Config(format!(
            "the lease {} is above the maximum of {}",
            humantime::format_duration(ttl),
            humantime::format_duration(MAX_TTL)
        )));
    }
    Ok(())
}

/// A request for one lock, from [`LockClient::lock`]. Configure, then
/// [`acquire`](LockRequest::acquire) a guard or [`run`](LockRequest::run) a future.
#[derive(Clone, Debug)]
#[must_use = "a lock request does nothing until `.acquire()` or `.run(fut)`"]
pub struct LockRequest {
    client: LockClient,
    key: String,
    ttl: Option<Duration>,
    wait: Duration,
    renew: bool,
}

impl LockRequest {
    /// The lease (default: the client's). Renewed every `ttl / 3` while held,
    /// unless [`renew(false)`](LockRequest::renew).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// How long to wait for a busy lock (default `Duration::ZERO`: try once).
    /// Waiting sleeps on release notices, not polling. A wait that ends in
    /// [`LockError::Busy`] has left the key's line of waiters by the time it
    /// answers, so a release after that never hands the lock to it.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Whether the watchdog renews the lease (default `true`). With `false` the
    /// lease is fixed: the guard is lost when it runs out.
    pub fn renew(mut self, renew: bool) -> Self {
        self.renew = renew;
        self
    }

    /// Takes the lock, waiting up to the configured wait.
    ///
    /// `Err(LockError::Busy)` when still held by another owner at the deadline,
    /// with the holder's remaining lease as `retry_after`. If the current task
    /// already holds this key through [`LockRequest::run`] or
    /// [`LockClient::with_lock`], returns a re-entered guard at once.
    ///
    /// Cancel-safe: dropping the future never leaves the lock held for longer
    /// than one lease, and a lock it may have taken is released in the
    /// background.
    pub async fn acquire(self) -> Result<LockGuard, LockError> {
        let inner = &self.client.0;
        validate_key(&self.key)?;
        let ttl = self.ttl.unwrap_or(inner.default_ttl);
        validate_ttl(ttl)?;
        if let Some(held) = context::find(inner.id, &self.key) {
            tracing::trace!(key = %self.key, "lock re-entered by the holding task");
            return Ok(LockGuard::reentered(held));
        }
        let started = Instant::now();
        // A wait too long to represent (`Duration::MAX`) means "wait forever".
        let deadline = started
            .checked_add(self.wait)
            .unwrap_or_else(|| started + Duration::from_secs(100 * 365 * 24 * 3600));
        let names = KeyNames::new(&inner.prefix, &self.key);
        let token = Token::random()?;
        let attempt = Attempt {
            inner: inner.clone(),
            key: self.key.clone(),
            names: Some(names),
            token,
            ttl,
            queued: !self.wait.is_zero(),
        };
        let mut waiter = None;
        if !self.wait.is_zero() {
            let names = attempt.names.as_ref().expect("set until the end");
            if inner.backend.notices_ready(names) {
                waiter = Some(inner.backend.register(names, &attempt.token).await);
            }
        }
        // Send time of the last attempt that found the lock busy: a hand-over
        // to us happened after it.
        let mut last_busy = started;
        let mut retries = 0u32;
        // Only an attempt after the first can find itself already queued.
        let mut maybe_queued = false;
        loop {
            let names = attempt.names.as_ref().expect("set until the end");
            let sent = Instant::now();
            let wait = if self.wait.is_zero() {
                Duration::ZERO
            } else {
                deadline
                    .saturating_duration_since(sent)
                    .max(Duration::from_millis(1))
            };
            let queued_before = std::mem::replace(&mut maybe_queued, !wait.is_zero());
            let remaining = match inner
                .backend
                .acquire(names, &attempt.token, ttl, wait, queued_before)
                .await
            {
                Ok(AcquireOutcome::Acquired { fencing }) => {
                    return Ok(self.hold(attempt, fencing, sent, ttl, started));
                }
                Ok(AcquireOutcome::Busy { remaining }) => remaining,
                Err(LockError::Backend(e))
                    if e.is_connection() && retries < MAX_CONNECTION_RETRIES && {
                        let pause = Duration::from_millis(10 << retries.min(4));
                        Instant::now() + pause < deadline || (retries == 0 && !e.is_timeout())
                    } =>
                {
                    // A broken connection is re-established by the driver;
                    // the same token makes a retry safe even if the first
                    // attempt took the lock.
                    tracing::debug!(key = %self.key, error = %e, "lock acquire: connection failed; retrying");
                    if retries > 0 {
                        tokio::time::sleep(Duration::from_millis(10 << retries.min(4))).await;
                    }
                    retries += 1;
                    continue;
                }
                Err(e) => {
                    // The script may have run even if the reply was lost:
                    // `attempt` releases with our token on the way out.
                    tracing::debug!(key = %self.key, error = %e, "lock acquire failed");
                    return Err(e);
                }
            };
            last_busy = last_busy.max(sent);
            let Some(handle) = waiter.as_ref() else {
                if Instant::now() >= deadline {
                    return Err(self.busy(attempt, remaining, started).await);
                }
                // Register for notices, then try again at once: a hand-over
                // between the attempt and the registration is seen that way.
                waiter = Some(inner.backend.register(names, &attempt.token).await);
                continue;
            };
            let mut fencing = handle.waiter.take_grant();
            if fencing.is_none() {
                let now = Instant::now();
                if now >= deadline {
                    return Err(self.busy(attempt, remaining, started).await);
                }
                // Notices are at most once: also re-try when the holder's
                // lease ends.
                let mut retry_at = (now + remaining + Duration::from_millis(1)).min(deadline);
                loop {
                    tokio::select! {
                        _ = handle.waiter.notify.notified() => {}
                        _ = tokio::time::sleep_until(retry_at) => break,
                    }
                    fencing = handle.waiter.take_grant();
                    if fencing.is_some() || !handle.waiter.take_handoff_seen() {
                        break; // ours, or the key was freed: act now
                    }
                    // The lock went to another waiter with a short lease: if
                    // that waiter is dead, the key is free when it runs out.
                    let free_by = Instant::now() + HANDOFF_LEASE + Duration::from_millis(5);
                    retry_at = retry_at.min(free_by);
                }
            }
            let Some(fencing) = fencing else {
                continue;
            };
            // Handed over by a release, with a lease of `granted` that started
            // after `last_busy`. Trust it while a third of it is left;
            // otherwise (or for a fixed lease) confirm and re-arm it first.
            let granted = ttl.min(HANDOFF_LEASE);
            if self.renew
                && !inner.backend.needs_confirmation()
                && Instant::now() + granted / 3 < last_busy + granted
            {
                return Ok(self.hold(attempt, fencing, last_busy, granted, started));
            }
            let sent = Instant::now();
            match inner.backend.extend(names, &attempt.token, ttl).await {
                Ok(true) => return Ok(self.hold(attempt, fencing, sent, ttl, started)),
                Ok(false) => continue, // the hand-over ran out before we saw it
                Err(e) => return Err(e),
            }
        }
    }

    /// Turns a successful attempt into a watched guard.
    fn hold(
        &self,
        mut attempt: Attempt,
        fencing: u64,
        sent: Instant,
        granted: Duration,
        started: Instant,
    ) -> LockGuard {
        let inner = &self.client.0;
        let names = attempt.names.take().expect("set until the end");
        let held = Arc::new(Held {
            id: inner.next_lock_id.fetch_add(1, Ordering::Relaxed),
            client_id: inner.id,
            key: std::mem::take(&mut attempt.key),
            names,
            token: attempt.token,
            fencing,
            ttl: attempt.ttl,
            lost: CancellationToken::new(),
            // Set by the watchdog as it takes the lease under watch.
            valid_until: std::sync::Mutex::new(sent),
            client: inner.clone(),
        });
        inner.watchdog.watch(
            held.clone(),
            attempt.ttl,
            self.renew,
            sent,
            granted,
            inner.backend.drift(attempt.ttl),
        );
        tracing::debug!(key = %held.key, fencing,
            waited_us = started.elapsed().as_micros() as u64, "lock acquired");
        LockGuard::owner(held)
    }

    /// Gives up. A wait that may have queued leaves the line before `Busy` is
    /// answered (in the background only if that fails), so a release right
    /// after our `Busy` cannot hand the lock to us.
    async fn busy(&self, mut attempt: Attempt, remaining: Duration, started: Instant) -> LockError {
        tracing::debug!(key = %self.key,
            waited_us = started.elapsed().as_micros() as u64, "lock busy");
        if let Some(names) = attempt.names.as_ref().filter(|_| attempt.queued) {
            // `Ok(true)`: the lock had just been handed to us; releasing it
            // hands it on.
            let left = attempt
                .inner
                .backend
                .release(names, &attempt.token, attempt.ttl, true)
                .await;
            if left.is_ok() {
                attempt.names = None;
            }
        } else {
            attempt.names = None; // never ours, never queued: nothing to clean up
        }
        LockError::Busy {
            key: self.key.clone(),
            retry_after: remaining,
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
    pub async fn run<F: Future>(self, fut: F) -> Result<F::Output, LockError> {
        let guard = self.acquire().await?;
        let held = guard.held().clone();
        let lost = guard.lost();
        let outcome = context::scope(held, async move {
            tokio::select! {
                biased;
                _ = lost => None,
                output = fut => Some(output),
            }
        })
        .await;
        let Some(output) = outcome else {
            let key = guard.key().to_owned();
            drop(guard);
            return Err(LockError::Lost { key });
        };
        // The work is done. If the lease was valid at this moment, the output
        // is the caller's whatever the release answers: a lost reply, a
        // server that went away, even a key deleted behind our back cannot
        // undo work that finished under a valid lease.
        let key = guard.key().to_owned();
        if guard.held().valid_at(Instant::now()) {
            if let Err(e) = guard.release().await {
                tracing::warn!(key = %key, error = %e,
                    "the work finished under a valid lease; releasing the lock afterwards failed");
            }
            return Ok(output);
        }
        // The last confirmed lease ran out before the work ended. Only the
        // server can still prove it never did: our token still on the key.
        match guard.release().await {
            Ok(()) => Ok(output),
            Err(e) => {
                if !e.is_lost() {
                    tracing::warn!(key = %key, error = %e,
                        "the lease may have run out before the work finished, and the release failed");
                }
                Err(LockError::Lost { key })
            }
        }
    }
}

/// An acquisition in progress: if it is abandoned (busy after a wait, error,
/// cancellation) after a script may have queued us or taken the lock, leave
/// the queue and release with our token in the background (which hands the
/// lock on if it had been handed to us).
struct Attempt {
    inner: Arc<Inner>,
    /// The key as the caller gave it, for the logs.
    key: String,
    names: Option<KeyNames>,
    token: Token,
    ttl: Duration,
    queued: bool,
}

impl Drop for Attempt {
    fn drop(&mut self) {
        if let Some(names) = self.names.take() {
            release_in_background(
                self.inner.clone(),
                std::mem::take(&mut self.key),
                names,
                self.token,
                self.ttl,
                self.queued,
            );
        }
    }
}
