//! [`LockClientBuilder`]: checks a configuration, connects, loads the scripts.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::{DEFAULT_TTL, LockClient, validate_ttl};
use crate::backend::Backend;
use crate::backend::labels::{default_label, validate_label};
use crate::backend::open::MasterAuth;
use crate::backend::redlock::RedlockBackend;
use crate::backend::{memory::MemoryBackend, redis::RedisBackend, redis::RedisOptions};
use crate::client::inner::Inner;
use crate::client::local::Local;
use crate::error::LockError;
use crate::key::validate_prefix;
use crate::token::Salt;
use crate::watchdog::Watchdog;

static NEXT_CLIENT_ID: AtomicU64 = AtomicU64::new(1);

/// Configures a [`LockClient`]; finish with [`build`](LockClientBuilder::build).
#[derive(Clone)]
#[must_use = "a builder does nothing until `.build()`"]
pub struct LockClientBuilder {
    target: Target,
    prefix: String,
    default_ttl: Duration,
    connect_timeout: Duration,
    response_timeout: Duration,
    replica_acks: Option<(u32, Duration)>,
    local_handover: bool,
    coalesce_scripts: bool,
    label: Option<String>,
    /// A Sentinel group's master's ACL user and password (boxed: most
    /// builders have none).
    master_auth: Option<Box<MasterAuth>>,
    /// `rediss://` certificates: a CA to trust, a client certificate
    /// (boxed: most builders have none).
    #[cfg(feature = "tls")]
    pub(super) certificates: Option<Box<redis::TlsCertificates>>,
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
            local_handover: true,
            coalesce_scripts: false,
            label: None,
            master_auth: None,
            #[cfg(feature = "tls")]
            certificates: None,
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
        let mut f = f.debug_struct("LockClientBuilder");
        #[cfg(feature = "tls")]
        f.field("certificates", &self.certificates); // shown redacted
        f.field("target", &target)
            .field("prefix", &self.prefix)
            .field("default_ttl", &self.default_ttl)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("replica_acks", &self.replica_acks)
            .field("local_handover", &self.local_handover)
            .field("coalesce_scripts", &self.coalesce_scripts)
            .field("label", &self.label)
            .field("sentinel_master_auth", &self.master_auth) // the user only
            .finish()
    }
}

impl LockClientBuilder {
    /// One Redis or Valkey server: `redis://[user:password@]host:port[/db]`, or
    /// `rediss://` with the `tls` feature (a private CA, a client
    /// certificate: `tls_root_certificates`, `tls_client_certificate`). ACL
    /// users and passwords come from the URL. The database is the path
    /// (`/3`): `?db=3`, `?user=` or `?pass=` on a TCP URL is a
    /// [`LockError::Config`] from [`build`](Self::build), since the driver
    /// reads them on `redis+unix://` URLs only.
    pub fn redis(mut self, url: impl Into<String>) -> Self {
        self.target = Target::Redis(url.into());
        self
    }

    /// Redlock over independent masters (an odd number, at least 3, each
    /// named once): a lock is held while a majority grants it. The repository's `docs/guarantees.md`
    /// (scale-out) says what it needs from the servers (delayed restarts or
    /// `appendfsync always`).
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
    /// survive the failover; a master with a password needs
    /// [`sentinel_master_auth`](Self::sentinel_master_auth).
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

    /// The ACL user and password of the Sentinel group's master (and of
    /// the replica promoted after a failover), for a master with
    /// `requirepass` (user `"default"`) or ACL users: the sentinels' URLs
    /// carry only the sentinels' own credentials, as in Redisson's
    /// `setPassword` beside `setSentinelPassword` (with
    /// `tls_root_certificates` or `tls_client_certificate` (feature `tls`),
    /// one user and
    /// password for every sentinel: URLs that carry different ones are a
    /// `LockError::Config` at `build`). Without it the master is reached
    /// without credentials.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), lock_runtime::LockError> {
    /// let client = lock_runtime::LockClient::builder()
    ///     .sentinel("mymaster", ["redis://10.0.0.5:26379", "redis://10.0.0.6:26379"])
    ///     .sentinel_master_auth("locker", std::env::var("LOCKER_PASSWORD").unwrap_or_default())
    ///     .build()
    ///     .await?;
    /// # drop(client); Ok(()) }
    /// ```
    pub fn sentinel_master_auth(
        mut self,
        username: impl Into<String>,
        password: impl Into<String>,
    ) -> Self {
        self.master_auth = Some(Box::new(MasterAuth {
            username: username.into(),
            password: password.into(),
        }));
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
    /// and `.sentinel(..)`. On Sentinel too few acknowledgements may mean
    /// the master changed (a manual failover leaves the old one up, without
    /// replicas): the sentinels are asked for the master again, and an
    /// acquire that waits sends it again within its wait.
    ///
    /// Idempotency records (feature `idempotency`) are held to it too: a
    /// claim is answered once acknowledged (else given back and refused, and
    /// on Sentinel sent again within its wait, as an acquire), and so are a
    /// completion and a commit on the lock server
    /// (`RecordRequest::commit_on_lock_server`): with too few, they fail with `LockError::Backend`, their outcome
    /// unknown (the master holds the result, which a failover may lose). A
    /// record's renewal is not waited for: an in-flight record is not given
    /// up at the end of its lease, as a lock is.
    ///
    /// This narrows the failover window; it does not close it: `WAIT` makes a
    /// write reach replicas, not a promoted replica be one of them, and it
    /// does not make writes durable on disk.
    pub fn min_replica_acks(mut self, replicas: u32, timeout: Duration) -> Self {
        self.replica_acks = Some((replicas, timeout));
        self
    }

    /// The embedded in-process backend: the same semantics, among the clones
    /// of the client it builds (not distributed). Each client built with it
    /// is a store of its own: two built clients share no lock, no record and
    /// no fencing counter (so tests running side by side in one process stay
    /// apart); clone the client to share it. For examples and unit tests.
    pub fn memory(mut self) -> Self {
        self.target = Target::Memory;
        self
    }

    /// The namespace every name of this client starts with (default `"lock:"`).
    /// At most 128 bytes; no braces (the key's own hash tag decides the slot).
    ///
    /// Clients with different prefixes share nothing, as long as neither
    /// prefix starts with the other: under `"app:"` the lock of key
    /// `L{x}` is named `app:L:L{x}`, which is also the lock of key `x`
    /// under `"app:L:"` (as a Redis ACL's `~app:*` covers `app:L:*` keys
    /// too). Give services side by side prefixes such as `"billing:"` and
    /// `"shipping:"`, not `"app:"` and `"app:billing:"`.
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

    /// Group commit of script calls (default `false`; one server, Sentinel
    /// or a cluster): while a mutex's acquire, release or extend is in
    /// flight on a connection, the ones that arrive queue and go out
    /// together as one script call when it returns (one per hash slot on a
    /// cluster). A lone call still goes out at once; each caller gets its
    /// own key's outcome. Every mutex call then goes through the scripts:
    /// the plain `SET NX PX` acquire and compare-and-delete release that an
    /// uncontended lock uses by default are not batched.
    ///
    /// Off by default because it did not pay on the machine we measure on:
    /// with Redis on loopback, 32 tasks on distinct keys made 0.48-0.51 x
    /// the raw commands' pairs per second batched against 0.62-0.64 x sent
    /// alone (paired runs), since one call in flight per connection gives
    /// up the pipelining that many single calls get, and the batch loop
    /// costs Redis about what the script entries it saves do (BENCHMARKS.md,
    /// "Why"). Measure with your own
    /// network and load before turning it on.
    ///
    /// ```
    /// # async fn f() -> Result<(), lock_runtime::LockError> {
    /// let client = lock_runtime::LockClient::builder()
    ///     .memory()
    ///     .coalesce_scripts(true) // no effect on the embedded backend
    ///     .build()
    ///     .await?;
    /// # drop(client); Ok(()) }
    /// ```
    pub fn coalesce_scripts(mut self, on: bool) -> Self {
        self.coalesce_scripts = on;
        self
    }

    /// Whether a task of this client that waits for a key another of its
    /// tasks holds is handed the lock in-process, without a round trip
    /// (default `true`; one server, Sentinel or a cluster).
    ///
    /// The lease stays on the server as it is; the new holder gets a
    /// fencing token of its own, still strictly above every earlier one
    /// (reserved a few at a time while nobody queued on the server), and
    /// its own [`lost`](crate::LockGuard::lost). Waiters of other processes
    /// are not starved: after 8 local hand-overs or 5 ms, whichever comes
    /// first, the lock goes to the server's queue if anybody queued there.
    /// Waiters that ask for other lease settings (`ttl`, `renew`) than the
    /// holder's go to the server. The client's waiting tasks take one
    /// place in the server's line together, so [`inspect`](crate::LockClient::inspect)
    /// and `lockctl` show the client once among the waiters. `false`: every
    /// waiter queues on the server, strictly first come, first served
    /// across processes.
    pub fn local_handover(mut self, enabled: bool) -> Self {
        self.local_handover = enabled;
        self
    }

    /// The client's name, shown to operators as the holder or a waiter of
    /// its locks (`inspect`, `lockctl show`); default `hostname:pid`. Say
    /// which pod or process this is (`"pod-a"`, `"billing-7f9c:4121"`): it
    /// is stored readable by anybody who can read the lock keys, so never a
    /// secret. 1 to 128 bytes, no control characters (else `build` fails
    /// with `LockError::Config`).
    ///
    /// Kept at no cost per acquire: each token carries the client's id, and
    /// one registry entry per client (renewed by the client while it lives,
    /// gone a minute after it ends) maps the id to the label.
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// Checks the configuration, connects and loads the scripts.
    ///
    /// `LockError::Config` for a missing backend, a malformed URL or a bad
    /// prefix or TTL (or a Redlock master named twice); `LockError::Backend`
    /// when the server cannot be reached, refuses the credentials, or refuses
    /// this user the scripts (`EVALSHA`: see the ACL section of the
    /// repository's `docs/keys.md`).
    pub async fn build(self) -> Result<LockClient, LockError> {
        validate_prefix(&self.prefix)?;
        validate_ttl(self.default_ttl)?;
        let label = match self.label {
            Some(label) => label,
            None => default_label(),
        };
        validate_label(&label)?;
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
            coalesce: self.coalesce_scripts,
            #[cfg(feature = "tls")]
            certificates: crate::backend::certificates::checked_certificates(
                self.certificates,
                matches!(self.target, Target::Memory),
            )?,
            master_auth: match (&self.target, self.master_auth) {
                (Target::Sentinel(..), auth) => auth.map(|auth| *auth),
                (_, None) => None,
                (_, Some(_)) => {
                    return Err(LockError::Config(
                        "sentinel_master_auth is for `.sentinel(..)`: other URLs carry \
                         their credentials"
                            .into(),
                    ));
                }
            },
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
        let salt = Salt::from_os()?;
        tracing::debug!(backend = backend.describe(), prefix = %self.prefix, "lock client ready");
        let inner = Arc::new(Inner {
            id: NEXT_CLIENT_ID.fetch_add(1, Ordering::Relaxed),
            local: Local::new(self.local_handover && backend.hands_on_locally()),
            watchdog: Watchdog::start(backend.clone()),
            backend,
            prefix: self.prefix,
            default_ttl: self.default_ttl,
            next_lock_id: AtomicU64::new(1),
            salt,
            label,
            registration: Default::default(),
            hints: Default::default(),
            #[cfg(feature = "idempotency")]
            record_hints: Default::default(),
            background_releases: Default::default(),
            dropped: tokio::sync::watch::Sender::new(()),
        });
        super::registry::register(&inner).await;
        Ok(LockClient(inner))
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
