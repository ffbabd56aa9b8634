use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use http::Response;

type Running<E> = Pin<Box<dyn Future<Output = Result<Response<Body>, E>> + Send + 'static>>;

/// The response future of [`Lock`](super::Lock).
///
/// Dropping it (the client went away) does not stop a handler that runs: it
/// runs to its end, then the lock is released (with `run_to_completion(false)`,
/// dropping it drops the handler and releases the lock). A response it
/// produced keeps the lock in its body until sent or dropped.
#[must_use = "futures do nothing unless polled"]
pub struct ResponseFuture<E> {
    state: State<E>,
}

/// Where the response stands.
enum State<E> {
    /// Answered without the inner service (no key could be built).
    Ready(Option<Response<Body>>),
    /// Locking, then running the inner service.
    Running(Running<E>),
}

impl<E> ResponseFuture<E> {
    pub(super) fn ready(response: Response<Body>) -> Self {
        Self {
            state: State::Ready(Some(response)),
        }
    }

    pub(super) fn running(future: Running<E>) -> Self {
        Self {
            state: State::Running(future),
        }
    }
}

impl<E> Future for ResponseFuture<E> {
    type Output = Result<Response<Body>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.get_mut().state {
            State::Ready(response) => Poll::Ready(Ok(response
                .take()
                .expect("ResponseFuture polled after completion"))),
            State::Running(future) => future.as_mut().poll(cx),
        }
    }
}

impl<E> fmt::Debug for ResponseFuture<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Ready(_) => "ready",
            State::Running(_) => "running",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}
