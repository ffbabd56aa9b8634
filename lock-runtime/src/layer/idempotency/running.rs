//! A record one request runs: its lease, its completion and its release.

use std::time::Duration;

use std::sync::Arc;

use tokio::time::Instant;

use super::key::RecordNames;
use crate::backend::records::StoredResponse;
use crate::layer::completion::Completion;
use crate::token::Token;
use crate::watchdog::RecordLease;
use crate::{LockClient, LockError};

/// The longest pause between two looks at a record in flight, when waiting
/// (and between two tries of a completion whose outcome is unknown).
pub(super) const MAX_POLL: Duration = Duration::from_millis(250);

/// How long a response waits for its record to be completed before it is
/// sent anyway (the completion goes on in the background).
const COMPLETION_WAIT: Duration = Duration::from_secs(2);

/// A record this request runs: its lease renewed by the client's watchdog
/// until completed or released; released in the background if dropped
/// unsettled (the request future was dropped: the client went away).
pub(super) struct Running {
    client: LockClient,
    pub(super) names: RecordNames,
    token: Token,
    /// The record under the watchdog; `None` once handed to the completion.
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

impl Running {
    /// The record `names` was claimed for `token` with a lease of `lease`
    /// by a claim sent at `sent`: renewed every `lease / 3` from then.
    pub(super) fn start(
        client: LockClient,
        names: RecordNames,
        token: Token,
        lease: Duration,
        sent: Instant,
    ) -> Self {
        let watched = Arc::new(RecordLease {
            record: names.record.clone(),
            token,
        });
        let id = client.watch_record(watched, lease, sent);
        Self {
            renewal: Some(Renewal {
                client: client.clone(),
                id,
            }),
            client,
            names,
            token,
            settled: false,
        }
    }

    /// Stores the handler's `response`, sending the completion again while
    /// its outcome is unknown (a lost reply, a timeout, no majority either
    /// way), and keeping the lease renewed meanwhile. Returns once it is
    /// stored, or after [`COMPLETION_WAIT`]: the client's response never
    /// waits longer, and the completion goes on in the background (also if
    /// the client goes away) for up to a lease. A completion that truly
    /// fails is logged with the record's name.
    pub(super) async fn complete(
        mut self,
        response: StoredResponse,
        fingerprint: String,
        retention: Duration,
        lease: Duration,
        spawner: &Completion,
    ) {
        self.settled = true;
        let finishing = spawner.spawn(finish(
            self.client.clone(),
            self.names.clone(),
            self.token,
            fingerprint,
            response,
            retention,
            lease,
            self.renewal.take(),
        ));
        if tokio::time::timeout(COMPLETION_WAIT, finishing)
            .await
            .is_err()
        {
            tracing::debug!(
                "idempotency: the response goes out before its record is completed; \
                 completing in the background"
            );
        }
    }

    pub(super) async fn release(mut self) {
        self.renewal = None; // stops the renewal
        self.settled = true;
        log_release(release(&self.client, &self.names, &self.token).await);
    }

    /// Releases `record` for `token` on the current runtime without waiting.
    pub(super) fn settle_in_background(
        client: LockClient,
        names: RecordNames,
        token: Token,
        log: bool,
    ) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // the lease runs out by itself
        };
        runtime.spawn(async move {
            let released = release(&client, &names, &token).await;
            if log {
                log_release(released);
            }
        });
    }
}

/// A claim on its way: if the request future is dropped before its answer is
/// read (the client went away), the claim may have run on the server with
/// nobody left to run the handler or release it, which would keep the key
/// `409` for a whole lease. Dropped armed, it releases the record for its
/// token in the background (a no-op where the claim did not take it).
pub(super) struct Claiming {
    client: LockClient,
    names: RecordNames,
    token: Token,
    armed: bool,
}

impl Claiming {
    pub(super) fn new(client: &LockClient, names: &RecordNames, token: Token) -> Self {
        Self {
            client: client.clone(),
            names: names.clone(),
            token,
            armed: true,
        }
    }

    /// The answer was read: whoever holds the record now settles it.
    pub(super) fn answered(mut self) {
        self.armed = false;
    }
}

impl Drop for Claiming {
    fn drop(&mut self) {
        if self.armed {
            tracing::debug!(
                "idempotency: request dropped while claiming; releasing what it may have claimed"
            );
            Running::settle_in_background(
                self.client.clone(),
                self.names.clone(),
                self.token,
                false,
            );
        }
    }
}

/// Releases `record`, once more if no answer came back (a second release of
/// a record already released finds nothing, harmlessly), so a lost reply
/// does not keep the key blocked for a lease.
async fn release(
    client: &LockClient,
    names: &RecordNames,
    token: &Token,
) -> Result<bool, LockError> {
    let (record, notice) = (&names.record, &names.notice);
    match client.backend().release_record(record, notice, token).await {
        Err(e) => {
            tracing::debug!(%record, error = &e as &dyn std::error::Error, "idempotency: release unanswered; sending it again");
            tokio::time::sleep(Duration::from_millis(20)).await;
            client.backend().release_record(record, notice, token).await
        }
        answer => answer,
    }
}

/// The completion of [`Running::complete`]: stops the renewal (drops
/// `renewal`) when done.
#[allow(clippy::too_many_arguments)]
async fn finish(
    client: LockClient,
    names: RecordNames,
    token: Token,
    fingerprint: String,
    response: StoredResponse,
    retention: Duration,
    lease: Duration,
    renewal: Option<Renewal>,
) {
    let _renewal = renewal;
    let (record, notice) = (&names.record, &names.notice);
    let give_up = Instant::now() + lease.max(COMPLETION_WAIT);
    let mut pause = Duration::from_millis(10);
    loop {
        let stored = client
            .backend()
            .complete_record(record, notice, &token, &fingerprint, &response, retention)
            .await;
        match stored {
            Ok(true) => {
                tracing::debug!(%record, status = response.status, "idempotency: response stored");
                return;
            }
            Ok(false) => {
                tracing::warn!(%record, status = response.status,
                    "idempotency: the record's lease ran out and another request claimed it before \
                     this response was stored; the response was sent but not stored, and a \
                     duplicate may have run");
                return;
            }
            Err(e) if Instant::now() + pause < give_up => {
                tracing::debug!(%record, error = &e as &dyn std::error::Error,
                    "idempotency: completion unanswered; sending it again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(MAX_POLL);
            }
            Err(e) => {
                tracing::warn!(%record, status = response.status, error = &e as &dyn std::error::Error,
                    "idempotency: cannot store the response (it was sent to the client); \
                     duplicates get 409 until the lease runs out, then the request may run again");
                return;
            }
        }
    }
}

fn log_release(released: Result<bool, LockError>) {
    match released {
        Ok(true) => tracing::debug!("idempotency: record released"),
        Ok(false) => tracing::debug!("idempotency: record already gone when released"),
        Err(e) => {
            tracing::warn!(
                error = &e as &dyn std::error::Error,
                "idempotency: cannot release the record; it expires with its lease"
            )
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // Settled: released (renewal already stopped) or completing (the
        // completion stops the renewal when it is done).
        if !self.settled {
            self.renewal = None; // stops the renewal
            tracing::debug!("idempotency: request dropped mid-way; releasing its record");
            Running::settle_in_background(
                self.client.clone(),
                self.names.clone(),
                self.token,
                true,
            );
        }
    }
}
