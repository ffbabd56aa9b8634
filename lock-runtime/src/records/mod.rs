//! Idempotency records: run a piece of work once per key, and give its
//! stored result to every duplicate.
//!
//! A queue consumer that must not charge a card twice when a message is
//! delivered twice, a job runner that must not send one invoice twice: each
//! claims a record named by the message's or job's id, with a fingerprint of
//! its payload, and gets one of four answers ([`Claimed`]):
//!
//! * **run it** ([`Claimed::Run`]): the record is ours; do the work and
//!   [`complete`](RecordGuard::complete) it with its result, or drop (or
//!   [`release`](RecordGuard::release)) the guard to let a retry run it;
//! * **already done** ([`Claimed::Done`]): the result stored by the claimer
//!   that ran it, kept for the [retention](RecordRequest::retention) period;
//! * **in flight** ([`Claimed::InFlight`]): another claimer runs it now and
//!   did not finish within our [wait](RecordRequest::wait);
//! * **reused** ([`Claimed::Reused`]): the key was claimed with another
//!   fingerprint, a different piece of work under the same id.
//!
//! ```
//! use std::time::Duration;
//! use lock_runtime::{Claimed, LockClient};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lock_runtime::LockError> {
//! let client = LockClient::builder().memory().build().await?;
//! let (id, payload) = ("msg-7", br#"{"order":42,"amount":1250}"#);
//! let receipt = match client.record(id).fingerprint(payload).wait(Duration::from_secs(5)).claim().await? {
//!     Claimed::Run(guard) => {
//!         let receipt = b"charged 1250".to_vec(); // the work, done once
//!         guard.complete(&receipt).await?;
//!         receipt
//!     }
//!     Claimed::Done(stored) => stored, // delivered twice: the first result
//!     Claimed::InFlight { retry_after } => {
//!         # let _ = retry_after;
//!         return Ok(()); // still running elsewhere: redeliver later
//!     }
//!     Claimed::Reused => return Ok(()), // another payload under this id: reject it
//!     _ => return Ok(()),
//! };
//! assert_eq!(receipt, b"charged 1250");
//! # Ok(())
//! # }
//! ```
//!
//! # Guarantees
//!
//! The claim, the renewal, the completion and the release are each one
//! atomic step on the server (a claim of a free key is one `SET .. NX PX`,
//! as a hand-written claim would be, and every other step one script; a
//! critical section on the embedded backend), and each may be sent again
//! when its reply was lost: a repeated claim finds and re-arms our own
//! claim, a repeated completion finds our result
//! already stored. A claimer that crashes (or is paused past its lease)
//! stops renewing, and the record expires: a later claim runs the work. As
//! for a lock, that is the one way to run it twice; the lease is renewed by
//! the watchdog every `lease / 3` while the guard lives. On Redlock every
//! node keeps a copy and a majority decides, as for a lock.
//!
//! `IdempotencyLayer` (feature `axum`) is these
//! records for HTTP: the `Idempotency-Key` header names the record, the
//! request's method, route, query and body are its fingerprint, and the
//! response is the stored result. Its handlers can also commit their writes
//! with the completed record in one PostgreSQL transaction or Redis script
//! (`layer::idempotency::Commit`), which closes the crash window above: a
//! process killed after the work committed leaves its record committed too.

use std::time::Duration;

pub(crate) mod claim;
mod guard;
pub(crate) mod names;

pub use guard::RecordGuard;

use self::claim::{Ask, Outcome};
use self::names::{RecordNames, digest};
use crate::client::validate_ttl;
use crate::durations::check_retention;
use crate::key::validate_key;
use crate::{LockClient, LockError};

/// How long a completed record is kept when a request sets no
/// [retention](RecordRequest::retention): 24 hours.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// A claim of the record of one key, built by [`LockClient::record`].
#[derive(Clone, Debug)]
#[must_use = "a record request does nothing until `.claim()` is awaited"]
pub struct RecordRequest {
    client: LockClient,
    key: String,
    fingerprint: String,
    lease: Option<Duration>,
    wait: Duration,
    retention: Duration,
}

/// The answer of [`RecordRequest::claim`].
#[derive(Debug)]
#[non_exhaustive]
#[must_use = "a claimed record must be completed or released"]
pub enum Claimed {
    /// The record is ours: run the work, then
    /// [`complete`](RecordGuard::complete) the guard with its result (or
    /// drop it to let a retry run the work).
    Run(RecordGuard),
    /// The work ran: the result its claimer stored.
    Done(Vec<u8>),
    /// Another claimer runs the work, and did not finish within the wait.
    InFlight {
        /// When its lease ends at the latest (if it crashed, a claim then
        /// runs the work).
        retry_after: Duration,
    },
    /// The key was claimed with another fingerprint: a different piece of
    /// work under the same key. Nothing runs.
    Reused,
}

impl LockClient {
    /// The idempotency record of `key`: claim it to run a piece of work once
    /// per key (see [`records`](crate::records)). Keys share nothing with
    /// lock keys of the same text.
    pub fn record(&self, key: impl Into<String>) -> RecordRequest {
        RecordRequest {
            client: self.clone(),
            key: key.into(),
            fingerprint: digest(&[], b""),
            lease: None,
            wait: Duration::ZERO,
            retention: DEFAULT_RETENTION,
        }
    }
}

impl RecordRequest {
    /// The payload the work is for (its bytes are hashed): a claim with
    /// another fingerprint than the record's gets [`Claimed::Reused`]. None
    /// set: every claim of the key matches.
    pub fn fingerprint(mut self, payload: impl AsRef<[u8]>) -> Self {
        self.fingerprint = digest(&[payload.as_ref()], b"");
        self
    }

    /// The lease of a claimed record, renewed while its guard lives: how
    /// long the key stays in flight after its claimer crashed. The client's
    /// default TTL when not set.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// How long to wait for a record another claimer runs (woken by its
    /// completion or release); `Duration::ZERO` (the default): answer
    /// [`Claimed::InFlight`] at once. A wait above
    /// [`MAX_WAIT`](crate::MAX_WAIT) (`Duration::MAX` included) waits that
    /// long, as a lock's does.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// How long a completed record (its stored result) is kept; 24 hours by
    /// default. After that, the key can run again. From one millisecond to
    /// [`MAX_RETENTION`](crate::MAX_RETENTION) (a year); anything else is
    /// refused by [`claim`](Self::claim).
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// Claims the record. Errors: [`LockError::InvalidKey`],
    /// [`LockError::Config`] (a lease or a retention out of bounds),
    /// [`LockError::Backend`] when the store did not answer (whatever the
    /// claim may have taken is released in the background).
    pub async fn claim(self) -> Result<Claimed, LockError> {
        validate_key(&self.key)?;
        let lease = self.lease.unwrap_or_else(|| self.client.default_ttl());
        validate_ttl(lease)?;
        check_retention("a record", self.retention)?;
        let names =
            RecordNames::hashed(self.client.key_prefix(), &[self.key.as_bytes()], b"record");
        let ask = Ask {
            key: self.key,
            names,
            fingerprint: self.fingerprint,
            lease,
            wait: self.wait,
            retention: self.retention,
        };
        Ok(match ask.claim(&self.client).await? {
            Outcome::Run(guard) => Claimed::Run(guard),
            Outcome::Done(stored) => Claimed::Done(stored.body.to_vec()),
            Outcome::InFlight { remaining } => Claimed::InFlight {
                retry_after: remaining,
            },
            Outcome::Reused => Claimed::Reused,
        })
    }
}
