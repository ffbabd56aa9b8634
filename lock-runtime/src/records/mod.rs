//! Idempotency records: run a piece of work once per key, and give its
//! stored result to every duplicate.
//!
//! A queue consumer that must not charge a card twice when a message is
//! delivered twice claims a record named by the message's id, with a
//! fingerprint of its payload, and is answered ([`Claimed`]): run the work
//! and [complete](RecordGuard::complete) the record with its result; the
//! result stored by the claimer that ran it; in flight elsewhere; or reused,
//! another payload under the same id.
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
//!     Claimed::InFlight { .. } => return Ok(()), // running elsewhere: redeliver later
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
//! The claim, the renewal (every `ttl / 3`, by the watchdog), the completion
//! and the release are each one atomic step on the server (a claim of a free
//! key is one `SET .. NX PX`, every other step one script; a critical
//! section on the embedded backend), safe to send again when its reply was
//! lost. A claimer that crashes, or is paused past its lease, stops
//! renewing, and the record expires: a later claim runs the work. As for a
//! lock, that is the one way to run it twice: work that ran before the
//! crash, but whose record was not completed, runs again, so make it
//! idempotent at its target too (the message id under a unique constraint,
//! written in the work's own transaction). On Redlock a majority of nodes
//! decides.
//!
//! Work whose effects are PostgreSQL rows or Redis keys closes that gap: a
//! request with `commit_with_postgres(pool)` (feature `postgres`) or
//! [`commit_with_redis(conn)`](RecordRequest::commit_with_redis) looks for
//! its record committed there before it answers [`Claimed::Run`], and the
//! work commits its writes with its result in one step (one transaction,
//! `RecordGuard::commit_postgres`; one script call,
//! [`RecordGuard::commit_redis`]). A process killed after that commit,
//! before the record was completed, leaves the work done and its result
//! found: the redelivered message gets [`Claimed::Done`]; killed before it,
//! nothing of the work is left, and it runs again. Exactly once across
//! crashes, for the work written through that commit. Work whose keys are on
//! the lock server itself commits in the record
//! ([`commit_on_lock_server`](RecordRequest::commit_on_lock_server)): no
//! look, no copy, no completion after.
//!
//! `IdempotencyLayer` (feature `axum`) is these records for HTTP, and
//! commits a handler's writes with its completed record in one PostgreSQL
//! transaction or Redis script the same way (`layer::idempotency::Commit`).

use std::future::Future;
use std::time::Duration;

use futures_util::FutureExt;
use tokio::time::Instant;

mod commit;
mod guard;

pub use crate::backend::records::committed::COMMITTED_SUFFIX;
#[cfg(feature = "postgres")]
pub use crate::backend::records::postgres::{POSTGRES_SCHEMA, prune_postgres};
pub use commit::Committed;
use guard::Record;
pub use guard::RecordGuard;

use crate::backend::Backend;
use crate::backend::records::{Claim, CommitStore, Ours, StoredResponse};
use crate::backoff::{Armed, Retry, Retrying};
use crate::client::LockOptions;
use crate::client::options::Deadline;
use crate::client::turns::{Attempted, Claimer, Turns};
use crate::durations::check_retention;
use crate::key::{RecordNames, digest, validate_key};
use crate::token::Token;
use crate::{client::LockClient, error::LockError};

/// How long a completed record is kept when a request sets no
/// [retention](RecordRequest::retention): 24 hours.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// How long an answer waits for a record's completion before it goes out
/// anyway, the completion going on in the background: a layer's response
/// (its handler's, stored), a claim's `Done` (a result found in a commit
/// store, copied into the record).
pub(crate) const COMPLETION_WAIT: Duration = Duration::from_secs(2);

/// A claim of the record of one key, built by [`LockClient::record`].
#[derive(Clone, Debug)]
#[must_use = "a record request does nothing until `.claim()` is awaited"]
pub struct RecordRequest {
    client: LockClient,
    key: String,
    /// `None`: named by the key alone (a layer names it by route and scope).
    names: Option<RecordNames>,
    /// The fingerprint's digest; `None`: none set (the digest of nothing,
    /// computed at the claim: a layer always names its own).
    fingerprint: Option<String>,
    /// The lease and the wait, as a lock's.
    options: LockOptions,
    retention: Duration,
    /// Where the record is committed with its work, looked at before it runs.
    commit_store: Option<CommitStore>,
}

/// The answer of [`RecordRequest::claim`].
#[derive(Debug)]
#[non_exhaustive]
#[must_use = "a claimed record must be completed or released"]
// Answered once per claim and moved once or twice: the guard inline costs
// less than a box's allocation.
#[allow(clippy::large_enum_variant)]
pub enum Claimed {
    /// The record is ours: run the work, then
    /// [`complete`](RecordGuard::complete) the guard with its result (or
    /// drop it to let a retry run the work).
    Run(RecordGuard),
    /// The work ran: the result its claimer stored.
    Done(Vec<u8>),
    /// Another claimer runs the work, and did not finish within the wait.
    InFlight {
        /// When to try again: about how long this key's work usually takes
        /// (as a lock's `Busy` says), at most until the claimer's lease
        /// ends (if it crashed, a claim then runs the work).
        retry_after: Duration,
    },
    /// The key was claimed with another fingerprint: a different piece of
    /// work under the same key. Nothing runs.
    Reused,
}

/// [`Claimed`] with the whole stored response (a layer's status and headers).
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // as `Claimed`
pub(crate) enum Answer {
    Run(RecordGuard),
    Done(StoredResponse),
    InFlight { retry_after: Duration },
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
            names: None,
            fingerprint: None,
            options: LockOptions::new(),
            retention: DEFAULT_RETENTION,
            commit_store: None,
        }
    }
}

impl RecordRequest {
    /// The payload the work is for (its bytes are hashed): a claim with
    /// another fingerprint than the record's gets [`Claimed::Reused`]. A
    /// claim that sets none matches a record claimed without one (so a key
    /// whose claims never set one always matches), and is `Reused` against
    /// a record claimed with one, even an empty payload's: set one on every
    /// claim of a key, or on none.
    pub fn fingerprint(mut self, payload: impl AsRef<[u8]>) -> Self {
        self.fingerprint = Some(digest(&[payload.as_ref()], b""));
        self
    }

    crate::client::lease_setters! {
        /// The lease of a claimed record (default: the client's), renewed
        /// every `ttl / 3` while its guard lives: how long the key stays in
        /// flight after its claimer crashed. The limits of
        /// [`LockRequest::ttl`](crate::LockRequest::ttl).
        ttl;
        /// How long to wait for a record another claimer runs (woken by its
        /// completion or release), as [`LockRequest::wait`](crate::LockRequest::wait)
        /// for a busy lock; the default, zero, answers [`Claimed::InFlight`] at once.
        wait;
    }

    /// How long a completed record (its stored result) is kept; 24 hours by
    /// default. After that, the key can run again. From one millisecond to
    /// [`MAX_RETENTION`](crate::MAX_RETENTION) (a year); anything else is
    /// refused by [`claim`](Self::claim).
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// The record named `names` (a layer's: by route and caller), claimed
    /// with the fingerprint digest `fingerprint`, the lease and the wait
    /// `options` (checked by [`claim`](Self::claim) as the setters' are),
    /// committed to `commit_store` if any.
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    pub(crate) fn named(
        self,
        names: RecordNames,
        fingerprint: String,
        options: LockOptions,
        commit_store: Option<CommitStore>,
    ) -> Self {
        let (names, fingerprint) = (Some(names), Some(fingerprint));
        Self {
            names,
            fingerprint,
            options,
            commit_store,
            ..self
        }
    }

    /// Claims the record. Errors: [`LockError::InvalidKey`],
    /// [`LockError::Config`] (a lease or a retention out of bounds),
    /// [`LockError::Backend`] when the store did not answer (whatever the
    /// claim may have taken is released in the background), or fewer
    /// replicas than `min_replica_acks` asks acknowledged the claim (it was
    /// given back; on Sentinel a claim that waits is first sent again to
    /// the master the sentinels name, within its wait).
    // Not an `async` block awaiting `answer()`, which would keep that
    // future twice in its state (the captured one and the one awaited).
    pub fn claim(self) -> impl Future<Output = Result<Claimed, LockError>> + Send + 'static {
        self.answer().map(|answer| {
            Ok(match answer? {
                Answer::Run(guard) => Claimed::Run(guard),
                Answer::Done(stored) => Claimed::Done(stored.body.to_vec()),
                Answer::InFlight { retry_after } => Claimed::InFlight { retry_after },
                Answer::Reused => Claimed::Reused,
            })
        })
    }

    /// [`claim`](Self::claim), answered with the whole stored response:
    /// sent as a lock's acquire is ([`Retry::ACQUIRE`]: a repeated claim
    /// finds and re-arms our own), and waited as a busy lock is
    /// ([`Turns::run`], with [`Retry::LOOK_AGAIN`] as a timer too).
    // Not an `async fn`, as `claim`.
    pub(crate) fn answer(self) -> impl Future<Output = Result<Answer, LockError>> + Send + 'static {
        let this = self;
        async move {
            validate_key(&this.key)?;
            check_retention("a record", this.retention)?;
            if let Some(store) = &this.commit_store {
                store.usable_with(this.client.backend())?;
            }
            let asked = this.options.resolve(&this.client.0)?;
            let names = this.names.unwrap_or_else(|| {
                RecordNames::hashed(this.client.key_prefix(), &[this.key.as_bytes()], b"record")
            });
            let ours = Ours {
                token: this.client.0.token(),
                names,
                fingerprint: this.fingerprint.unwrap_or_else(|| digest(&[], b"")),
                ttl: asked.ttl,
                retention: this.retention,
            };
            let record = Record {
                client: this.client,
                ours,
            };
            let claiming = Claiming {
                key: this.key,
                record: Armed::new(record, false),
                deadline: asked.deadline,
                resend: Retry::ACQUIRE.start(),
                sent: Instant::now(),
            };
            let answer = Turns::run(claiming, Some(Retry::LOOK_AGAIN)).await;
            match this.commit_store {
                None => answer,
                // The record is its own committed copy: nothing to look up.
                Some(CommitStore::LockServer) => answer.map(|answer| match answer {
                    Answer::Run(mut guard) => {
                        guard.commit_store = Some(CommitStore::LockServer);
                        Answer::Run(guard)
                    }
                    answer => answer,
                }),
                // Boxed: only claims with a store elsewhere look, and the
                // look's state need not sit in every claim's.
                Some(store) => Box::pin(commit::look(answer?, store)).await,
            }
        }
    }
}

/// A record's claim, as [`Turns::run`] runs it.
struct Claiming {
    key: String,
    /// Armed while a claim is on the wire: dropped then, or with an error,
    /// it releases whatever the claim may have taken.
    record: Armed<Record>,
    deadline: Deadline,
    resend: Retrying,
    /// The last claim's send time: a lease it set starts no earlier.
    sent: Instant,
}

impl Claimer for Claiming {
    type Found = Claim;
    type Answer = Answer;

    fn deadline(&self) -> Deadline {
        self.deadline
    }

    fn waits_on(&self) -> (&Backend, (&str, &Token)) {
        let Record { client, ours } = self.record.get();
        (client.backend(), (ours.names.notice.as_str(), &ours.token))
    }

    /// A claim that waits marks a record in flight, so that its completion
    /// or release is announced.
    async fn attempt(&mut self) -> Result<Attempted<Claim>, LockError> {
        self.sent = Instant::now();
        self.record.arm(true);
        let (Record { client, ours }, waits) = (self.record.get(), !self.deadline.tries_once());
        let claim = || client.backend().claim_record(ours, waits);
        let at = Some(self.deadline.at());
        let found = self.resend.send("idempotency: claim", at, claim).await?;
        // Not claimed: nothing on the server is ours.
        self.record.arm(matches!(found, Claim::Claimed));
        let Claim::InFlight { remaining } = found else {
            return Ok(Attempted::Ended(found));
        };
        Ok(Attempted::Busy {
            remaining,
            fence: 0,
        })
    }

    fn end(self, found: Claim) -> Answer {
        match found {
            Claim::Claimed => Answer::Run(RecordGuard::claimed(self.key, self.record, self.sent)),
            Claim::Done(stored) => Answer::Done(stored),
            Claim::Mismatch => Answer::Reused,
            Claim::InFlight { remaining } => {
                let Record { client, ours } = self.record.get();
                let retry_after = client.0.record_hints.hint(&ours.names.record, remaining);
                Answer::InFlight { retry_after }
            }
        }
    }

    async fn give_up(self, remaining: Duration) -> Result<Answer, LockError> {
        Ok(self.end(Claim::InFlight { remaining }))
    }
}
