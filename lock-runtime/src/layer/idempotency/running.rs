//! Storing a claimed request's response without keeping its client waiting.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use axum::BoxError;
use bytes::Bytes;
use futures_util::FutureExt;

use super::layer::Config;

use crate::backend::records::StoredResponse;
use crate::error::LockError;
use crate::layer::completion::Completion;
use crate::layer::detach::detachable;
use crate::records::{COMPLETION_WAIT, RecordGuard};

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

/// The rest of a response larger than the storage limit, streamed after
/// the part that was read: its record (stored as too large to replay) is
/// completed when the rest ends, the end of the body waiting for that as a
/// response within the limit waits for its own (so a retry sent once the
/// body was read finds the request completed), or in a task of its own
/// when the client goes away first (the handler's work is done); it is
/// released if the rest fails (the response could not be produced: a retry
/// runs the request, as for a body that fails within the limit).
pub(super) struct SettleAtEnd<B> {
    rest: Pin<Box<B>>,
    /// Until settled: the record, what to store, the layer's completion.
    settle: Option<(RecordGuard, StoredResponse, Arc<Config>)>,
    /// The completion under way once the rest ended.
    completing: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl<B> SettleAtEnd<B> {
    pub(super) fn new(
        rest: Pin<Box<B>>,
        record: RecordGuard,
        stored: StoredResponse,
        config: Arc<Config>,
    ) -> Self {
        let settle = Some((record, stored, config));
        let completing = None;
        Self {
            rest,
            settle,
            completing,
        }
    }

    /// The completion, once (`None` when settled already).
    fn completion(&mut self) -> Option<Pin<Box<dyn Future<Output = ()> + Send>>> {
        let (record, stored, config) = self.settle.take()?;
        Some(Box::pin(async move {
            complete(record, stored, &config.completion).await;
        }))
    }
}

impl<B> http_body::Body for SettleAtEnd<B>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.completing.is_none() {
            match ready!(this.rest.as_mut().poll_frame(cx)) {
                Some(Ok(frame)) => return Poll::Ready(Some(Ok(frame))),
                Some(Err(e)) => {
                    if let Some((record, ..)) = this.settle.take() {
                        tracing::error!(
                            record = record.record(),
                            "idempotency: the response \
                            body failed after the storage limit; record released"
                        );
                    } // dropped: released in the background
                    return Poll::Ready(Some(Err(e.into())));
                }
                None => this.completing = this.completion(),
            }
        }
        if let Some(completing) = &mut this.completing {
            ready!(completing.as_mut().poll(cx));
            this.completing = None;
        }
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        // Polled to its end, where the record is completed.
        self.settle.is_none() && self.completing.is_none() && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.rest.size_hint()
    }
}

impl<B> Drop for SettleAtEnd<B> {
    /// The client went away before the end: the handler's work is done, so
    /// its record is completed in a task of its own (a completion under way
    /// goes on in one already: `complete` detaches when dropped).
    fn drop(&mut self) {
        let Some(completion) = self.completion() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(completion)),
            // No runtime (it is shutting down): the record expires with its
            // lease, and a retry runs the request.
            Err(_) => tracing::warn!("idempotency: no runtime to store a response on"),
        }
    }
}
