use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use http::Response;

use crate::layer::BoxedResponse;

/// The response future of [`Lock`](super::Lock).
///
/// Dropping it (the client went away) does not stop a handler that runs: it
/// runs to its end, then the lock is released (with `run_to_completion(false)`,
/// dropping it drops the handler and releases the lock). A response it
/// produced keeps the lock in its body until sent or dropped.
#[must_use = "futures do nothing unless polled"]
pub struct ResponseFuture<E> {
    state: ResponsePhase<E>,
}

/// Where the response stands.
enum ResponsePhase<E> {
    /// Answered without the inner service (no key could be built).
    Ready(Option<Response<Body>>),
    /// Locking, then running the inner service.
    Running(BoxedResponse<E>),
}

impl<E> ResponseFuture<E> {
    pub(super) fn ready(response: Response<Body>) -> Self {
        Self {
            state: ResponsePhase::Ready(Some(response)),
        }
    }

    pub(super) fn running(future: BoxedResponse<E>) -> Self {
        Self {
            state: ResponsePhase::Running(future),
        }
    }
}

impl<E> Future for ResponseFuture<E> {
    type Output = Result<Response<Body>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.get_mut().state {
            ResponsePhase::Ready(response) => Poll::Ready(Ok(response
                .take()
                .expect("ResponseFuture polled after completion"))),
            ResponsePhase::Running(future) => future.as_mut().poll(cx),
        }
    }
}

impl<E> fmt::Debug for ResponseFuture<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            ResponsePhase::Ready(_) => "ready",
            ResponsePhase::Running(_) => "running",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}
