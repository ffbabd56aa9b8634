use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::BoxError;
use axum::body::Body;
use bytes::Bytes;
use http::Response;

use crate::layer::BoxedResponse;
use pin_project_lite::pin_project;

pin_project! {
    /// The response future of [`Idempotency`](super::Idempotency).
    ///
    /// Dropping it (the client went away) does not stop a handler that
    /// runs: it runs to its end and its response is stored, unless the layer
    /// was built with `run_to_completion(false)`, where dropping it releases
    /// the record so that the key can be retried.
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<F, E> {
        #[pin]
        kind: Kind<F, E>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, E> {
        /// Answered without the inner service (a bad or missing key).
        Ready { response: Option<Response<Body>> },
        /// Not subject to idempotency: the inner service's future as is.
        Passthrough { #[pin] future: F },
        /// Claiming, running, storing or replaying.
        Running { future: BoxedResponse<E> },
    }
}

impl<F, E> ResponseFuture<F, E> {
    pub(super) fn ready(response: Response<Body>) -> Self {
        Self {
            kind: Kind::Ready {
                response: Some(response),
            },
        }
    }

    pub(super) fn passthrough(future: F) -> Self {
        Self {
            kind: Kind::Passthrough { future },
        }
    }

    pub(super) fn running(future: BoxedResponse<E>) -> Self {
        Self {
            kind: Kind::Running { future },
        }
    }
}

impl<F, ResB, E> Future for ResponseFuture<F, E>
where
    F: Future<Output = Result<Response<ResB>, E>>,
    ResB: http_body::Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    type Output = Result<Response<Body>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Ready { response } => Poll::Ready(Ok(response
                .take()
                .expect("ResponseFuture polled after completion"))),
            KindProj::Passthrough { future } => future
                .poll(cx)
                .map(|result| result.map(|response| response.map(Body::new))),
            KindProj::Running { future } => future.as_mut().poll(cx),
        }
    }
}

impl<F, E> fmt::Debug for ResponseFuture<F, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.kind {
            Kind::Ready { .. } => "ready",
            Kind::Passthrough { .. } => "passthrough",
            Kind::Running { .. } => "running",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}
