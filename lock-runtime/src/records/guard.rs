//! A record this process runs: its lease, its completion and its release.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::names::RecordNames;
use crate::backend::records::StoredResponse;
use crate::token::Token;
use crate::watchdog::RecordLease;
use crate::{LockClient, LockError};

/// The longest pause between two tries of a completion whose outcome is
/// unknown (and between two looks at a record in flight whose notices are
/// not confirmed).
pub(super) const MAX_POLL: Duration = Duration::from_millis(250);

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
    client: LockClient,
    key: String,
    names: RecordNames,
    token: Token,
    fingerprint: String,
    lease: Duration,
    retention: Duration,
    /// The record under the watchdog; `None` once settled.
    renewal: Option<Renewal>,
    settled: bool,
}

/// A record's entry in the watchdog: dropping it stops the renewal.
struct Renewal {
    client: LockClient,
    id: u64,
}

impl Drop for Renewal {
    fn drop(&mut self) {
        self.client.unwatch_record(self.id);
    }
}

impl fmt::Debug for RecordGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordGuard")
            .field("key", &self.key)
            .field("record", &self.names.record)
            .field("lease", &self.lease)
            .field("retention", &self.retention)
            .finish_non_exhaustive()
    }
}

/// What a claim that took the record fixed: the record, its claimer and the
/// request's fingerprint, lease and retention.
pub(super) struct Taken {
    pub(super) key: String,
    pub(super) names: RecordNames,
    pub(super) token: Token,
    pub(super) fingerprint: String,
    pub(super) lease: Duration,
    pub(super) retention: Duration,
}

impl RecordGuard {
    /// The record `taken` was claimed by a claim sent at `sent`: renewed
    /// every `lease / 3` from then.
    pub(super) fn start(client: LockClient, taken: Taken, sent: Instant) -> Self {
        let watched = Arc::new(RecordLease {
            record: taken.names.record.clone(),
            token: taken.token,
        });
        let id = client.watch_record(watched, taken.lease, sent);
        Self {
            renewal: Some(Renewal {
                client: client.clone(),
                id,
            }),
            client,
            key: taken.key,
            names: taken.names,
            token: taken.token,
            fingerprint: taken.fingerprint,
            lease: taken.lease,
            retention: taken.retention,
            settled: false,
        }
    }

    /// The key as given to [`LockClient::record`].
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The record's Redis name (under the client's prefix).
    pub(crate) fn record(&self) -> &str {
        &self.names.record
    }

    /// Stores `result` for the retention period, so every later claim of
    /// the key gets [`Claimed::Done`](super::Claimed::Done) with these bytes,
    /// and wakes the duplicates waiting on the record.
    ///
    /// A completion whose reply is lost is sent again (the record remembers
    /// who completed it), for up to a lease. Errors: [`LockError::Lost`]
    /// when the lease ran out and another claimer took the record first (the
    /// work may have run twice; nothing was stored); [`LockError::Backend`]
    /// when the store did not answer (the outcome is unknown: the record may
    /// hold the result, or expire with its lease).
    pub async fn complete(self, result: impl AsRef<[u8]>) -> Result<(), LockError> {
        let key = self.key.clone();
        let stored = StoredResponse {
            status: 0,
            headers: bytes::Bytes::new(),
            body: bytes::Bytes::copy_from_slice(result.as_ref()),
            body_too_large: false,
        };
        match self.completing(stored).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(LockError::Lost { key }),
            Err(e) => Err(e),
        }
    }

    /// Stores `stored`, as [`RecordGuard::complete`]; the future owns what it
    /// needs (a layer may run it as a task of its own and stop waiting for
    /// it). `Ok(false)`: another claimer's record is there. The lease stays
    /// renewed until the future ends.
    pub(crate) fn completing(
        mut self,
        stored: StoredResponse,
    ) -> impl Future<Output = Result<bool, LockError>> + Send + 'static {
        self.settled = true;
        let renewal = self.renewal.take();
        let client = self.client.clone();
        // Settled: the guard's drop no longer needs them.
        let names = std::mem::take(&mut self.names);
        let (token, fingerprint) = (self.token, std::mem::take(&mut self.fingerprint));
        let (lease, retention) = (self.lease, self.retention);
        async move {
            // Stops the renewal when done, whichever way.
            let _renewal = renewal;
            let (record, notice) = (&names.record, &names.notice);
            let give_up = crate::durations::later(Instant::now(), lease.max(MIN_COMPLETION_TRIES));
            let mut pause = Duration::from_millis(10);
            loop {
                let stored = client
                    .backend()
                    .complete_record(record, notice, &token, &fingerprint, &stored, retention)
                    .await;
                match stored {
                    Err(e) if Instant::now() + pause < give_up => {
                        tracing::debug!(%record, error = &e as &dyn std::error::Error,
                            "idempotency: completion unanswered; sending it again");
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(MAX_POLL);
                    }
                    answer => return answer,
                }
            }
        }
    }

    /// Gives the key back without storing anything, so the next claim runs
    /// the work (the work failed, or should be retried), and wakes a
    /// duplicate waiting on the record. `Ok` also when the record was no
    /// longer ours (its lease ran out); an error when the store did not
    /// answer (the record then expires with its lease).
    pub async fn release(mut self) -> Result<(), LockError> {
        self.renewal = None; // stops the renewal
        self.settled = true;
        let released = release(&self.client, &self.names, &self.token, &self.fingerprint).await;
        log_release(&released);
        released.map(|_| ())
    }
}

/// Releases `names`' record for `token` (claimed for a request of
/// `fingerprint`), once more if no answer came back (a second release of a
/// record already released finds nothing, harmlessly), so a lost reply does
/// not keep the key blocked for a lease.
async fn release(
    client: &LockClient,
    names: &RecordNames,
    token: &Token,
    fingerprint: &str,
) -> Result<bool, LockError> {
    let (record, notice) = (&names.record, &names.notice);
    let backend = client.backend();
    match backend
        .release_record(record, notice, token, fingerprint)
        .await
    {
        Err(e) => {
            tracing::debug!(%record, error = &e as &dyn std::error::Error, "idempotency: release unanswered; sending it again");
            tokio::time::sleep(Duration::from_millis(20)).await;
            backend
                .release_record(record, notice, token, fingerprint)
                .await
        }
        answer => answer,
    }
}

/// Releases `names`' record for `token` (claimed for a request of
/// `fingerprint`) on the current runtime without waiting (with no runtime,
/// the lease runs out by itself).
pub(super) fn release_in_background(
    client: LockClient,
    names: RecordNames,
    token: Token,
    fingerprint: String,
    log: bool,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        let released = release(&client, &names, &token, &fingerprint).await;
        if log {
            log_release(&released);
        }
    });
}

fn log_release(released: &Result<bool, LockError>) {
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

impl Drop for RecordGuard {
    fn drop(&mut self) {
        // Settled: released (renewal already stopped) or completing (the
        // completion stops the renewal when it is done).
        if !self.settled {
            self.renewal = None; // stops the renewal
            tracing::debug!(record = %self.record(), "idempotency: record guard dropped unsettled; releasing the record");
            let fingerprint = std::mem::take(&mut self.fingerprint);
            release_in_background(
                self.client.clone(),
                self.names.clone(),
                self.token,
                fingerprint,
                true,
            );
        }
    }
}
