//! A record this process runs: its lease, its completion and its release.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::records::{CommitStore, Ours, StoredResponse};
use crate::backoff::{Armed, Release, Retry};
use crate::client::hold::Watched;
use crate::durations::later;
use crate::{client::LockClient, error::LockError};

/// The shortest time a completion is tried for, however short the lease.
const MIN_COMPLETION_TRIES: Duration = Duration::from_secs(2);

/// A claimed record: the work it stands for is ours to run.
///
/// Its lease is renewed by the client's watchdog (with the locks' leases, in
/// batches) until [`complete`](RecordGuard::complete) stores the result or
/// [`release`](RecordGuard::release) gives the key back. Dropped unsettled
/// (the task was cancelled, or the work failed), it is released in the
/// background, so a retry may run the work; if the process dies instead, the
/// record expires with its lease and a later claim runs.
#[must_use = "a record guard dropped at once releases the record"]
pub struct RecordGuard {
    key: String,
    /// The record under the watchdog (`None` once settled); dropped first
    /// (field order): the renewal stops before `record` releases it.
    renewal: Option<Watched>,
    /// What settling the record needs; armed (released in the background
    /// if the guard is dropped) until the record is settled.
    record: Armed<Record>,
    /// Where the record is committed with its work (set once the claim
    /// looked there).
    pub(super) commit_store: Option<CommitStore>,
}

/// Our record and the client that settles it, owned (a completion or a
/// background release runs as a task of its own).
pub(super) struct Record {
    pub(super) client: LockClient,
    pub(super) ours: Ours,
}

impl fmt::Debug for RecordGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ours = &self.record.get().ours;
        f.debug_struct("RecordGuard")
            .field("key", &self.key)
            .field("record", &ours.names.record)
            .field("ttl", &ours.ttl)
            .field("retention", &ours.retention)
            .finish_non_exhaustive()
    }
}

impl RecordGuard {
    /// Our `record` of `key`, taken by a claim sent at `sent`: renewed
    /// every `ttl / 3` from then.
    pub(super) fn claimed(key: String, record: Armed<Record>, sent: Instant) -> Self {
        let Record { client, ours: o } = record.get();
        let watched = Watched::record(&client.0, &o.names.record, o.token, o.ttl, sent);
        Self {
            key,
            renewal: Some(watched),
            record,
            commit_store: None,
        }
    }

    /// The key as given to [`LockClient::record`].
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Resolves when the record's lease is lost: the server says the record
    /// is not ours any more (it expired, because the store could not be
    /// reached for longer than the lease, or another claimer took it). The
    /// work may then run elsewhere, so stop it: `IdempotencyLayer` cancels
    /// the handler. A completion after that stores the result only if no
    /// other claimer took the record ([`LockError::Lost`] otherwise).
    pub async fn lost(&self) {
        match &self.renewal {
            Some(renewal) => renewal.lost().await,
            None => std::future::pending().await,
        }
    }

    /// `true` once [`lost`](Self::lost) resolved.
    pub fn is_lost(&self) -> bool {
        self.renewal.as_ref().is_some_and(Watched::is_lost)
    }

    /// The record's Redis name (under the client's prefix).
    pub(crate) fn record(&self) -> &str {
        &self.record.get().ours.names.record
    }

    /// The client that claimed the record.
    pub(super) fn client(&self) -> &LockClient {
        &self.record.get().client
    }

    /// The client and what the claim sent, for a commit of the record on
    /// the lock server made away from the guard (a layer's handler's).
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    pub(crate) fn claim(&self) -> (LockClient, Ours) {
        let Record { client, ours } = self.record.get();
        (client.clone(), ours.clone())
    }

    /// What the claim sent: the names, the token, the fingerprint's digest.
    pub(super) fn ours(&self) -> &Ours {
        &self.record.get().ours
    }

    /// Stores `result` for the retention period, so every later claim of
    /// the key gets [`Claimed::Done`](super::Claimed::Done) with these bytes,
    /// and wakes the duplicates waiting on the record.
    ///
    /// A completion whose reply is lost is sent again (the record remembers
    /// who completed it), for up to a lease. Errors: [`LockError::Lost`]
    /// when the lease ran out and another claimer took the record first (the
    /// work may have run twice; nothing was stored); [`LockError::Backend`]
    /// when the store did not answer, or fewer replicas than
    /// `min_replica_acks` asks acknowledged the result (the outcome is
    /// unknown: the record may hold the result, or expire with its lease;
    /// a failover may lose what no replica acknowledged). Dropped before it
    /// answered, the record is released in the background unless the result
    /// was stored, so a later claim runs the work again.
    pub async fn complete(self, result: impl AsRef<[u8]>) -> Result<(), LockError> {
        let key = self.key.clone();
        let completed = self
            .completing(StoredResponse::result(result.as_ref()))
            .await?;
        completed.then_some(()).ok_or(LockError::Lost { key })
    }

    /// Stores `stored`, as [`RecordGuard::complete`], sent again under
    /// [`Retry::COMPLETION`] for a lease (two seconds at least) and renewed
    /// until then; the future owns what it needs (a layer may run it as a
    /// task of its own). `Ok(false)`: another claimer's record is there.
    pub(crate) fn completing(
        mut self,
        stored: StoredResponse,
    ) -> impl Future<Output = Result<bool, LockError>> + Send + 'static {
        let mut renewal = self.renewal.take();
        if let Some(renewal) = &mut renewal {
            renewal.settled(); // its hold time ends here, as a lock's at its release
        }
        // Armed until answered: a completion whose future is dropped midway
        // releases the record in the background (which leaves a completed
        // one alone), so a retry runs the work, not after a lease.
        let mut record = self.record;
        async move {
            // Stops the renewal when done, whichever way.
            let _renewal = renewal;
            let Record { client, ours } = record.get();
            let give_up = later(Instant::now(), ours.ttl.max(MIN_COMPLETION_TRIES));
            let complete = || client.backend().complete_record(ours, &stored);
            let mut retry = Retry::COMPLETION.start();
            let completed = retry
                .send("idempotency: completion", Some(give_up), complete)
                .await;
            record.arm(false);
            completed
        }
    }

    /// Ends the guard over a record that holds its result already (its
    /// work committed in it on the lock server): the renewal stops, and
    /// nothing is sent.
    pub(crate) fn settled(mut self) {
        if let Some(renewal) = &mut self.renewal {
            renewal.settled(); // its hold time ends here, as at a completion
        }
        self.record.arm(false);
    }

    /// Gives the key back without storing anything, so the next claim runs
    /// the work (the work failed, or should be retried), and wakes a
    /// duplicate waiting on the record. `Ok` also when the record was no
    /// longer ours (its lease ran out); an error when the store did not
    /// answer (the record then expires with its lease).
    pub async fn release(mut self) -> Result<(), LockError> {
        self.renewal = None; // stops the renewal
        // Sent again once if the reply was lost, so that does not keep the
        // key blocked for a lease. Armed until answered: a release whose
        // future is dropped midway goes on in the background.
        let release = || self.record.get().release_once();
        let released = Retry::ONCE
            .start()
            .send("idempotency: release", None, release)
            .await;
        self.record.settle().report(&released);
        released.map(|_| ())
    }
}

impl Release for Record {
    const WHAT: &'static str = "idempotency: background release";
    type Released = bool;

    fn background_releases(&self) -> &crate::backoff::BackgroundReleases {
        &self.client.0.background_releases
    }

    /// Releases the record for our token (sent again, a release of a
    /// record already released finds nothing, harmlessly).
    fn release_once(&self) -> impl Future<Output = Result<bool, LockError>> + Send {
        self.client.backend().release_record(&self.ours)
    }

    fn report(&self, released: &Result<bool, LockError>) {
        match released {
            Ok(true) => tracing::debug!("idempotency: record released"),
            Ok(false) => tracing::debug!("idempotency: record already gone when released"),
            Err(e) => {
                tracing::warn!(
                    error = e as &dyn std::error::Error,
                    "idempotency: cannot release the record; it expires with its lease"
                )
            }
        }
    }
}
