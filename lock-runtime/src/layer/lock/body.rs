use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use axum::BoxError;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::client::LockGuard;
use crate::error::LockError;

type ReleaseFuture = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

pin_project! {
    /// A response body that holds the request's lock while it streams.
    ///
    /// The lock is released once the body has produced its last frame, and
    /// *before* that frame is handed on: a client that has read the whole
    /// response and sends its next request at once finds the lock free. If
    /// the body is dropped before its end (the client went away), the guard's
    /// drop releases the lock in the background. If the lease is lost while
    /// the body streams, it ends with an error instead of sending more
    /// without the lock.
    pub(crate) struct LockedBody<B> {
        #[pin]
        inner: Option<B>,
        // A frame read before the body was handed on, sent first.
        first: Option<Frame<Bytes>>,
        state: BodyPhase,
    }
}

enum BodyPhase {
    Streaming(LockGuard),
    /// Releasing; then sending the last frame (if any) and ending.
    Releasing(ReleaseFuture, Option<Frame<Bytes>>),
    Done,
}

fn release(guard: LockGuard) -> ReleaseFuture {
    Box::pin(release_logged(guard, "after the response body"))
}

/// Releases the request's lock; a failure (the lease was lost, the backend
/// did not answer) is logged, `when` saying at which point of the request.
pub(super) async fn release_logged(guard: LockGuard, when: &str) {
    // The key only if it fails: a pointer kept here, no copy of the key.
    let held = guard.held().clone();
    if let Err(e) = guard.release().await {
        tracing::debug!(key = %held.key, error = &e as &dyn std::error::Error, "lock layer: release {when} failed");
    }
}

impl<B> LockedBody<B> {
    /// `inner` (after `first`, if some) under the lock of `guard`.
    pub(crate) fn new(inner: B, guard: LockGuard, first: Option<Frame<Bytes>>) -> Self {
        Self {
            inner: Some(inner),
            first,
            state: BodyPhase::Streaming(guard),
        }
    }

    /// A body of one frame whose lock was already released.
    pub(crate) fn done(frame: Frame<Bytes>) -> Self {
        Self {
            inner: None,
            first: None,
            state: BodyPhase::Releasing(Box::pin(std::future::ready(())), Some(frame)),
        }
    }
}

impl<B> Body for LockedBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        loop {
            match this.state {
                BodyPhase::Streaming(guard) => {
                    if guard.is_lost() {
                        let key = guard.key().to_owned();
                        tracing::warn!(%key, "lock lost while the response body streamed; the body was cut short");
                        *this.state = BodyPhase::Done;
                        return Poll::Ready(Some(Err(Box::new(LockError::Lost { key }))));
                    }
                    let Some(mut inner) = this.inner.as_mut().as_pin_mut() else {
                        *this.state = BodyPhase::Done;
                        continue;
                    };
                    let polled = match this.first.take() {
                        Some(frame) => Some(Ok(frame)),
                        None => ready!(inner.as_mut().poll_frame(cx)),
                    };
                    let frame = match polled {
                        Some(Ok(frame)) if !inner.is_end_stream() => {
                            return Poll::Ready(Some(Ok(frame)));
                        }
                        Some(Ok(frame)) => Some(frame),
                        Some(Err(e)) => {
                            // Dropping the guard releases in the background.
                            *this.state = BodyPhase::Done;
                            return Poll::Ready(Some(Err(e.into())));
                        }
                        None => None,
                    };
                    if let BodyPhase::Streaming(guard) =
                        std::mem::replace(this.state, BodyPhase::Done)
                    {
                        *this.state = BodyPhase::Releasing(release(guard), frame);
                    }
                }
                BodyPhase::Releasing(releasing, last) => {
                    ready!(releasing.as_mut().poll(cx));
                    let last = last.take();
                    *this.state = BodyPhase::Done;
                    return Poll::Ready(last.map(Ok));
                }
                BodyPhase::Done => return Poll::Ready(None),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.state, BodyPhase::Done)
    }

    fn size_hint(&self) -> SizeHint {
        match &self.state {
            BodyPhase::Streaming(_) => {
                let first = self
                    .first
                    .as_ref()
                    .and_then(Frame::data_ref)
                    .map_or(0, |d| d.len() as u64);
                let rest = self
                    .inner
                    .as_ref()
                    .map_or(SizeHint::with_exact(0), B::size_hint);
                let mut hint = SizeHint::new();
                hint.set_lower(rest.lower() + first);
                if let Some(upper) = rest.upper() {
                    hint.set_upper(upper + first);
                }
                hint
            }
            BodyPhase::Releasing(_, Some(frame)) => {
                SizeHint::with_exact(frame.data_ref().map_or(0, |d| d.len() as u64))
            }
            BodyPhase::Releasing(_, None) | BodyPhase::Done => SizeHint::with_exact(0),
        }
    }
}
