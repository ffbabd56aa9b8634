//! What every handle on one client shares: [`Inner`].

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use crate::backend::Backend;
use crate::client::local::Local;
use crate::token::{Salt, Token};
use crate::watchdog::Watchdog;

/// One client's backend, watchdog and settings, behind the `Arc` of
/// [`LockClient`](crate::LockClient) and of every guard it gave out.
pub(crate) struct Inner {
    pub(crate) id: u64,
    pub(crate) backend: Backend,
    pub(crate) prefix: String,
    pub(crate) default_ttl: Duration,
    pub(crate) watchdog: Watchdog,
    pub(crate) next_lock_id: AtomicU64,
    /// Held keys that this client's own waiters queue on in-process.
    pub(crate) local: Local,
    /// Folded into every token this client draws; holds the client's id.
    pub(crate) salt: Salt,
    /// The client's name, shown by `inspect` (`LockClientBuilder::label`).
    pub(crate) label: String,
    /// The task that renews the client's registry entry, and how it finds
    /// the client (it stops once the client is gone).
    pub(crate) registration: std::sync::Mutex<Option<Registration>>,
    /// Recent hold times of locks, for the `retry_after` of a busy answer.
    pub(crate) hints: crate::hint::RetryHints,
    /// Recent claim-to-settle times of idempotency records, for the
    /// `retry_after` of a record in flight: apart from the locks', so a
    /// record settled in a millisecond says nothing of how long a lock of
    /// another key is held (nor a long-held lock of how long a record runs).
    #[cfg(feature = "idempotency")]
    pub(crate) record_hints: crate::hint::RetryHints,
    /// Releases sent in the background and not answered yet.
    pub(crate) background_releases: crate::backoff::BackgroundReleases,
    /// Dropped with the client: its observers (`leader/observe.rs`) end
    /// then, and their receivers are told.
    pub(crate) dropped: tokio::sync::watch::Sender<()>,
}

/// The task that renews a client's registry entry, and the client it renews
/// for (see `client/registry.rs`); aborted when dropped.
pub(crate) struct Registration {
    pub(crate) task: tokio::task::JoinHandle<()>,
    pub(crate) client: std::sync::Weak<Inner>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Inner {
    /// A fresh ownership token.
    pub(crate) fn token(&self) -> Token {
        Token::random(&self.salt)
    }
}
