//! Storing a claimed request's response without keeping its client waiting.

use std::time::Duration;

use futures_util::FutureExt;

use crate::backend::records::StoredResponse;
use crate::error::LockError;
use crate::layer::completion::Completion;
use crate::layer::detach::detachable;
use crate::records::RecordGuard;

/// How long a response waits for its record to be completed before it is
/// sent anyway (the completion goes on in the background).
const COMPLETION_WAIT: Duration = Duration::from_secs(2);

/// Stores the handler's `response` in `record`, sending the completion
/// again while its outcome is unknown (a lost reply, a timeout, no majority
/// either way) and keeping the lease renewed meanwhile. Returns once it is
/// stored, or after [`COMPLETION_WAIT`]: the client's response never waits
/// longer, and the completion goes on in the background (also if the client
/// goes away) for up to a lease. A completion that truly fails is logged
/// with the record's name.
pub(super) async fn complete(record: RecordGuard, response: StoredResponse, layer: &Completion) {
    let name = record.record().to_owned();
    let status = response.status;
    // Mapped, not awaited in an `async` block, which would keep the
    // completion's future twice in the box it goes to.
    let finishing = record
        .completing(response)
        .map(move |stored| log_completion(&name, status, stored));
    // Polled in place while the response waits for it; moved into a task of
    // its own when the wait ends first (or the request's future is dropped),
    // whether or not the layer runs handlers to completion: the handler ran,
    // so its response is stored.
    if tokio::time::timeout(
        COMPLETION_WAIT,
        detachable(layer.tracker.as_ref(), finishing),
    )
    .await
    .is_err()
    {
        tracing::debug!(
            "idempotency: the response goes out before its record is completed; \
             completing in the background"
        );
    }
}

fn log_completion(record: &str, status: u16, stored: Result<bool, LockError>) {
    match stored {
        Ok(true) => tracing::debug!(%record, status, "idempotency: response stored"),
        Ok(false) => tracing::warn!(%record, status,
            "idempotency: the record's lease ran out and another request claimed it before \
             this response was stored; the response was sent but not stored, and a \
             duplicate may have run"),
        Err(e) => tracing::warn!(%record, status, error = &e as &dyn std::error::Error,
            "idempotency: cannot store the response (it was sent to the client); \
             duplicates get 409 until the lease runs out, then the request may run again"),
    }
}
