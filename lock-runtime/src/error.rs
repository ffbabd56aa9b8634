//! The one error type of the crate.

use std::time::Duration;

/// Everything that can go wrong when taking, holding or releasing a lock.
///
/// The enum is `#[non_exhaustive]`: match the variants you handle and keep a
/// wildcard arm. The `is_*` helpers answer the common questions without a match.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// The lock is held by someone else and did not become free within the wait.
    #[error("lock `{key}` is busy; retry after {}", shown(*retry_after))]
    Busy {
        /// The key as given by the caller (without the client's prefix).
        key: String,
        /// When a retry is likely to find the key free: a hint, not a
        /// promise. It is what this client's recent holds of the key took
        /// (of any lock, when it has not held this one yet), but at least
        /// how long this client has found the key busy in a row (a caller
        /// that obeys it backs off, doubling), never more than
        /// the holder's remaining lease, and the remaining lease when the
        /// client has released no lock yet (records settled meanwhile do not
        /// count: they keep hints of their own). A holder that keeps the key
        /// longer than usual makes a retry at this moment find it busy
        /// again; to be woken when it is released instead, acquire with
        /// [`wait`](crate::LockRequest::wait).
        retry_after: Duration,
    },
    /// The lease (a lock's, or an idempotency record's claim) may have ended
    /// before the work under it finished: it expired, or was deleted or
    /// taken over, while we believed we held it, or `release` found it no
    /// longer ours although nothing we sent could have released it. Never reported for a lease that was still valid when its
    /// release was sent and whose release reply was merely lost (that is
    /// `Ok`, or [`LockError::Backend`] with
    /// [`BackendError::is_outcome_unknown`]).
    #[error("the lease on `{key}` was lost: it expired or is no longer ours")]
    Lost {
        /// The key as given by the caller (without the client's prefix).
        key: String,
    },
    /// The backend failed: connection refused or dropped, response timeout, a
    /// server error. Displayed as the [`BackendError`] it holds, whose
    /// [`source`](std::error::Error::source) is the driver's error.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The client or request configuration is invalid (bad URL, zero TTL, ...).
    /// For the misuse cases callers match on (zero permits, a write inside a
    /// read, a key named twice in `lock_all`), [`LockError::config_reason`]
    /// says which one it is.
    #[error("invalid lock configuration: {0}")]
    Config(String),
    /// `#[distributed_lock]` without `client = ...` ran before a global client was
    /// installed.
    #[error(
        "no lock client installed: call `lock_runtime::set_global_client(client)` at startup, \
         or pass `client = <expr>` to `#[distributed_lock]`"
    )]
    NoClient,
    /// The key is empty, too long or contains control characters.
    #[error("invalid lock key: {0}")]
    InvalidKey(String),
    /// A fenced write was refused, and nothing was written: a holder with a
    /// later fencing token already wrote to `resource` (see
    /// [`fence`](crate::fence)). The lease that `token` came from has ended.
    #[error(
        "write to `{resource}` refused: fencing token {token} is stale, token {highest} already wrote"
    )]
    Stale {
        /// The resource as given to the fence.
        resource: String,
        /// The token of the refused write.
        token: u64,
        /// The highest token recorded for `resource`, greater than `token`.
        highest: u64,
    },
}

impl LockError {
    /// `true` for [`LockError::Busy`].
    pub fn is_busy(&self) -> bool {
        matches!(self, Self::Busy { .. })
    }

    /// `true` for [`LockError::Lost`].
    pub fn is_lost(&self) -> bool {
        matches!(self, Self::Lost { .. })
    }

    /// `true` for [`LockError::Backend`].
    pub fn is_backend(&self) -> bool {
        matches!(self, Self::Backend(_))
    }

    /// `true` for [`LockError::Config`].
    pub fn is_config(&self) -> bool {
        matches!(self, Self::Config(_))
    }

    /// `true` for [`LockError::InvalidKey`].
    pub fn is_invalid_key(&self) -> bool {
        matches!(self, Self::InvalidKey(_))
    }

    /// `true` for a [`LockError::Backend`] error where the connection failed
    /// (refused, dropped, timed out) rather than the server answering with an
    /// error: see [`BackendError::is_connection`]. Usually worth a retry.
    pub fn is_connection(&self) -> bool {
        matches!(self, Self::Backend(e) if e.is_connection())
    }

    /// `true` for [`LockError::Stale`].
    pub fn is_stale(&self) -> bool {
        matches!(self, Self::Stale { .. })
    }

    /// `true` for [`LockError::NoClient`].
    pub fn is_no_client(&self) -> bool {
        matches!(self, Self::NoClient)
    }

    /// Which misuse a [`LockError::Config`] reports, for the cases callers
    /// match on; `None` for other errors and other configuration problems.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_runtime::LockError> {
    /// use lock_runtime::{ConfigReason, LockClient};
    ///
    /// let client = LockClient::builder().memory().build().await?;
    /// let e = client.semaphore("exports", 0).acquire().await.unwrap_err();
    /// assert_eq!(e.config_reason(), Some(ConfigReason::ZeroPermits));
    /// # Ok(()) }
    /// ```
    pub fn config_reason(&self) -> Option<ConfigReason> {
        let Self::Config(message) = self else {
            return None;
        };
        ConfigReason::ALL
            .into_iter()
            .find(|reason| message.starts_with(reason.opening()))
    }

    /// A [`LockError::Config`] for `reason`: its message opens with the
    /// reason's fixed text, then `detail`.
    pub(crate) fn misuse(reason: ConfigReason, detail: impl std::fmt::Display) -> Self {
        Self::Config(format!("{}: {detail}", reason.opening()))
    }

    /// How long to wait before retrying, for errors where that is known.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Busy { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }

    pub(crate) fn lost(key: &str) -> Self {
        Self::Lost {
            key: key.to_owned(),
        }
    }
}

/// The misuse behind a [`LockError::Config`], for the cases callers match
/// on: see [`LockError::config_reason`]. Each is a mistake in the calling
/// code, not in the environment, and fails at once, before any server is
/// asked.
///
/// `LockError::Config` keeps its message (a `String`, as before); the reason
/// is read from the fixed text each of these messages opens with, so a
/// message is all a reason needs and the variant stays matchable as
/// `LockError::Config(message)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ConfigReason {
    /// A semaphore asked for with zero permits: nobody could ever hold it.
    ZeroPermits,
    /// A write lock asked for by a task that holds a read lock on the same
    /// key: it would wait for itself.
    WriteInsideRead,
    /// A key named more than once in one `lock_all`.
    KeyNamedTwice,
    /// A campaign for a leadership the task already holds: it has one term
    /// and one label, and a nested `Leadership` could only stand for it.
    NestedCampaign,
}

impl ConfigReason {
    const ALL: [Self; 4] = [
        Self::ZeroPermits,
        Self::WriteInsideRead,
        Self::KeyNamedTwice,
        Self::NestedCampaign,
    ];

    /// The fixed text the reason's message opens with.
    fn opening(self) -> &'static str {
        match self {
            Self::ZeroPermits => "a semaphore with zero permits",
            Self::WriteInsideRead => "a write lock inside a read lock of the same task",
            Self::KeyNamedTwice => "a key named more than once in lock_all",
            Self::NestedCampaign => "a campaign inside a leadership of the same task",
        }
    }
}

/// A failure of the storage backend (Redis or the embedded one).
///
/// The message says what was being done; [`std::error::Error::source`] gives the
/// underlying driver error when there is one (it is not repeated in the
/// message: print the chain, e.g. with `anyhow`'s `{:#}`, to see both).
#[derive(Debug)]
pub struct BackendError {
    context: String,
    timeout: bool,
    outcome_unknown: bool,
    /// See [`BackendError::is_master_suspect`].
    master_suspect: bool,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl std::fmt::Display for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.context)
    }
}

impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        let cause: &(dyn std::error::Error + 'static) = self.source.as_deref()?;
        // A driver's error that says just what its own cause says (redis-rs's
        // I/O errors: "timed out", then "timed out") is left out: a printed
        // chain says it once. `driver_error` still finds it.
        match cause.source() {
            Some(inner) if inner.to_string() == cause.to_string() => Some(inner),
            _ => Some(cause),
        }
    }
}

impl BackendError {
    pub(crate) fn new(context: impl Into<String>) -> Self {
        Self {
            context: context.into(),
            timeout: false,
            outcome_unknown: false,
            master_suspect: false,
            source: None,
        }
    }

    /// A request that may or may not have taken effect on the server: it was
    /// sent, and no answer came back.
    pub(crate) fn outcome_unknown(
        context: impl Into<String>,
        source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        Self {
            context: context.into(),
            timeout: false,
            outcome_unknown: true,
            master_suspect: false,
            source,
        }
    }

    pub(crate) fn with_source(
        context: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self {
            context: context.into(),
            timeout: false,
            outcome_unknown: false,
            master_suspect: false,
            source: Some(Box::new(source)),
        }
    }

    pub(crate) fn timeout(context: impl Into<String>) -> Self {
        Self {
            context: context.into(),
            timeout: true,
            outcome_unknown: false,
            master_suspect: false,
            source: None,
        }
    }

    /// `inner`, as the cause of a failure described by `context`.
    pub(crate) fn wrap(context: impl Into<String>, inner: BackendError) -> Self {
        Self {
            context: context.into(),
            timeout: inner.timeout,
            outcome_unknown: inner.outcome_unknown,
            master_suspect: inner.master_suspect,
            source: Some(Box::new(inner)),
        }
    }

    /// The same failure, of a write too few replicas acknowledged on a
    /// Sentinel master that may no longer be the master: see
    /// [`BackendError::is_master_suspect`].
    pub(crate) fn of_suspect_master(mut self) -> Self {
        self.master_suspect = true;
        self
    }

    /// `true` for a write too few replicas acknowledged on a Sentinel
    /// master: a manual failover leaves the old master up, and a master,
    /// for seconds after the promotion, and only its replicas' silence says
    /// so. The sentinels are asked for the master again, so the write sent
    /// again may reach the new one: an acquire that waits re-sends it
    /// within its wait, as for a master that does not answer.
    pub(crate) fn is_master_suspect(&self) -> bool {
        self.master_suspect
    }

    /// The same failure, said to be of the server at `addr`.
    pub(crate) fn at(mut self, addr: &str) -> Self {
        self.context = format!("{addr}: {}", self.context);
        self
    }

    /// The driver's error among the causes, if any (through the causes as
    /// kept, not as `source()` shows them: that leaves out a driver's error
    /// that only repeats its cause).
    pub(crate) fn driver_error(&self) -> Option<&redis::RedisError> {
        fn kept(b: &BackendError) -> Option<&(dyn std::error::Error + 'static)> {
            b.source
                .as_deref()
                .map(|e| e as &(dyn std::error::Error + 'static))
        }
        let mut next = kept(self);
        while let Some(e) = next {
            if let Some(driver) = e.downcast_ref::<redis::RedisError>() {
                return Some(driver);
            }
            next = match e.downcast_ref::<BackendError>() {
                Some(inner) => kept(inner),
                None => e.source(),
            };
        }
        None
    }

    /// `true` if the backend did not answer in time.
    pub fn is_timeout(&self) -> bool {
        self.timeout || self.driver_error().is_some_and(|e| e.is_timeout())
    }

    /// `true` when the request may or may not have taken effect: it was sent,
    /// and its answer was lost (a dropped connection, a timeout). A release
    /// with an unknown outcome either released the lock or leaves it to run
    /// out with its lease; either way no other holder can have had it while
    /// the lease was valid.
    pub fn is_outcome_unknown(&self) -> bool {
        self.outcome_unknown
    }

    /// `true` if the connection failed (dropped, refused, timed out) or no
    /// node could serve the key yet (a failover; a Cluster slot being
    /// migrated: `TRYAGAIN`, `ASK`), rather than the server answering with an
    /// error (a script error, an ACL refusal, a refused login, too few
    /// replica acks): usually worth a retry.
    pub fn is_connection(&self) -> bool {
        self.timeout
            || self
                .driver_error()
                .is_some_and(|e| connection_failure(e).is_some())
    }
}

/// How a driver error bears on its connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ConnectionFailure {
    /// No answer in time; the request may still run.
    TimedOut,
    /// Refused, dropped or otherwise unusable: the connection must be (and
    /// is, by the driver) re-established.
    Broken,
    /// No server to send to: the sentinels name no master that answers as
    /// one (mid-failover: the old master is down, the new one not yet
    /// promoted), or no cluster node serves the key's slot for now. Nothing
    /// ran; asking again once one does is safe.
    Unreachable,
}

/// The one place that decides whether a driver error is the connection's
/// fault (`Some`) or an answer the server sent on purpose (`None`: a script
/// error, an ACL refusal, `READONLY`, ...).
pub(crate) fn connection_failure(e: &redis::RedisError) -> Option<ConnectionFailure> {
    if failed_login(e) {
        // redis-rs asks for a reconnect, but the server answered on purpose:
        // the credentials are refused (a wrong password, one being rotated).
        None
    } else if e.is_timeout() {
        Some(ConnectionFailure::TimedOut)
    } else if e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_unrecoverable_error()
    {
        Some(ConnectionFailure::Broken)
    } else if matches!(
        e.kind(),
        redis::ErrorKind::MasterNameNotFoundBySentinel
            | redis::ErrorKind::NoValidReplicasFoundBySentinel
            // A cluster mid-failover, a slot whose master is gone, or one
            // being migrated (past the driver's own retries): the command was
            // refused (not run) by a node that cannot serve it yet, or its
            // redirect led nowhere the driver could reach. Or a server
            // still loading its data after a restart (`LOADING`).
            | redis::ErrorKind::Server(
                redis::ServerErrorKind::ClusterDown
                    | redis::ServerErrorKind::BusyLoading
                    | redis::ServerErrorKind::MasterDown
                    | redis::ServerErrorKind::Moved
                    | redis::ServerErrorKind::TryAgain
                    | redis::ServerErrorKind::Ask
            )
    ) {
        Some(ConnectionFailure::Unreachable)
    } else {
        None
    }
}

/// `true` when `e` says the server refused the login: redis-rs's
/// `AuthenticationFailed` (`AUTH` refused), or `WRONGPASS` (`HELLO ... AUTH`
/// refused, with RESP3). Nothing else the library sends gets either answer.
pub(crate) fn failed_login(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::AuthenticationFailed || e.code() == Some("WRONGPASS")
}

/// `d` as a person reads it, in every message that names a duration:
/// `Duration::MAX` as such (humantime would print 584 billion years), whole
/// days as days (humantime's months are 30.44 days: a year would read
/// `11months 30days 3h 50m 24s`), and anything from a millisecond up to
/// the millisecond (a hint computed from the clock would otherwise read
/// `29s 999ms 970us 226ns`).
pub(crate) fn shown(d: Duration) -> String {
    const DAY: u64 = 24 * 3600;
    if d == Duration::MAX {
        return "Duration::MAX".into();
    }
    let secs = d.as_secs();
    if secs >= DAY && secs.is_multiple_of(DAY) && d.subsec_nanos() == 0 {
        let days = secs / DAY;
        return format!("{days} day{}", if days == 1 { "" } else { "s" });
    }
    let d = if d >= Duration::from_millis(1) {
        Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    } else {
        d
    };
    humantime::format_duration(d).to_string()
}

#[cfg(test)]
mod tests;
