use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::BoxError;
use axum::body::Body;
use axum::extract::MatchedPath;
use bytes::Bytes;
use futures_util::FutureExt;
use http::response;
use http::{Method, Request, Response, StatusCode};
use tokio::time::Instant;
use tower_service::Service;

use super::key::{KeyHeader, fingerprint, fingerprinted_body, read_key, record_names};
use super::layer::Config;
use super::stored::{Rebuilt, encode_headers, replay};
use super::{ResponseFuture, StoreResponse};
use crate::backend::records::StoredResponse;
use crate::layer::bounds::{HttpBody, Wrapped};
use crate::layer::completion::Aborted;
use crate::layer::detach::detachable;
use crate::layer::problem::{Refusal, problem, problem_retry};
use crate::metrics::{IdempotencyOutcome, RouteSeries};
use crate::records::{Answer, RecordGuard};

use super::body::{Buffered, buffer, read_body};
use super::commit::{Commit, CommitState};
use super::running::{SettleAtEnd, complete};

wrapped_service! {
    /// The service made by [`IdempotencyLayer`](super::IdempotencyLayer).
    pub struct Idempotency;
    made_by: super::IdempotencyLayer;
    debug: []
}

/// Safe methods have no effects to repeat: they pass through.
fn is_safe(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    )
}

impl<S, B, ResB> Service<Request<B>> for Idempotency<S>
where
    S: Service<Request<Body>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    ResB: http_body::Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        if is_safe(req.method()) {
            return ResponseFuture::passthrough(self.inner.call(req.map(Body::new)));
        }
        let key = match read_key(req.headers()) {
            KeyHeader::Key(key) => key,
            KeyHeader::Absent if self.config.required_on.contains(req.method()) => {
                return ResponseFuture::ready(problem(
                    StatusCode::BAD_REQUEST,
                    &format!(
                        "this {} request needs an Idempotency-Key header, as in \
                         `Idempotency-Key: \"8e03978e-40d5-43e8-bc93-6894a57f9324\"`",
                        req.method()
                    ),
                ));
            }
            KeyHeader::Absent => {
                return ResponseFuture::passthrough(self.inner.call(req.map(Body::new)));
            }
            KeyHeader::Invalid(why) => {
                return ResponseFuture::ready(problem(StatusCode::BAD_REQUEST, &why));
            }
        };
        // The clone takes our place; the instance `poll_ready` prepared serves
        // this request.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::running(Box::pin(idempotent(self.config.clone(), inner, req, key)))
    }
}

fn unavailable() -> Response<Body> {
    problem_retry(
        StatusCode::SERVICE_UNAVAILABLE,
        "the idempotency store is unavailable; retry later with the same Idempotency-Key",
        Duration::from_secs(1),
    )
}

// Not an `async fn`, which would keep its arguments twice in its state.
#[allow(clippy::manual_async_fn)]
fn idempotent<S, B, ResB>(
    config: Arc<Config>,
    mut inner: S,
    req: Request<B>,
    key: String,
) -> impl Future<Output = Result<Response<Body>, S::Error>>
where
    S: Wrapped<Request<Body>, ResB>,
    B: HttpBody,
    ResB: HttpBody,
{
    async move {
        let (mut parts, body) = req.into_parts();
        let body = match read_body(&parts, body, config.max_request_body).await {
            Ok(body) => body,
            Err(response) => return Ok(response),
        };
        let client = &config.client;
        let method = parts.method.as_str();
        let matched = parts.extensions.get::<MatchedPath>();
        // Outside a matched route (a fallback, a layer on the whole
        // router), the path names the record, but the metrics' series is
        // one for all such requests: never a series per path.
        let route = matched.map_or(parts.uri.path(), MatchedPath::as_str);
        let series = matched.map_or("unrouted", MatchedPath::as_str);
        let metrics_route = config.routes.get(series, RouteSeries::new);
        let scope = config.scope.of(&parts);
        let names = record_names(client.key_prefix(), &scope, method, route, &key);
        let path_and_query = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let fingerprint = match fingerprinted_body(config.body_fingerprint, &body) {
            Ok(fingerprinted) => fingerprint(method, route, path_and_query, &fingerprinted),
            Err(not_json) => {
                tracing::debug!(%key, error = %not_json.0, "idempotency: the body is not JSON");
                return Ok(problem(
                    StatusCode::BAD_REQUEST,
                    &format!(
                        "the request body is not valid JSON ({}); this route compares \
                         requests with one Idempotency-Key by their JSON body",
                        not_json.0
                    ),
                ));
            }
        };
        let started = Instant::now();
        let commit_fingerprint = config.commit.is_some().then(|| fingerprint.clone());
        let options = config.options.clone();
        let claim =
            client
                .record(key.clone())
                .named(names, fingerprint, options, config.commit.clone());
        let claim = claim.retention(config.retention);
        // Made and awaited in one statement: kept until the end of the match
        // below, the claim's state would stay in this future's beside the
        // fail-open call's.
        let answered = claim.answer().await;
        let record = match answered {
            // Counted once the commit store (if any) has been looked at.
            Ok(Answer::Run(record)) => record,
            Ok(Answer::Done(stored)) => {
                crate::metrics::idempotency(&metrics_route, IdempotencyOutcome::Replayed);
                tracing::debug!(%key, status = stored.status,
                    waited_us = started.elapsed().as_micros() as u64,
                    "idempotency: replaying the stored response");
                return Ok(replay(stored));
            }
            Ok(Answer::Reused) => {
                tracing::debug!(%key, "idempotency: key reused for another request");
                crate::metrics::idempotency(&metrics_route, IdempotencyOutcome::PayloadMismatch);
                return Ok(problem(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "this Idempotency-Key was already used for a different request (method, \
                     path, query or body); use a new key for a new request",
                ));
            }
            Ok(Answer::InFlight { .. }) => {
                tracing::debug!(%key, "idempotency: duplicate while the first request runs");
                crate::metrics::idempotency(&metrics_route, IdempotencyOutcome::InFlight);
                // The lease only bounds a crashed holder; a live one is usually
                // done much sooner.
                return Ok(problem_retry(
                    StatusCode::CONFLICT,
                    "a request with this Idempotency-Key is still being processed; retry \
                     later with the same key to get its response",
                    Duration::from_secs(1),
                ));
            }
            Err(e) => {
                crate::metrics::idempotency(&metrics_route, IdempotencyOutcome::StoreUnavailable);
                if config.fail_open {
                    tracing::warn!(%key, error = &e as &dyn std::error::Error, "idempotency store unreachable; serving unprotected (fail open)");
                    let req = Request::from_parts(parts, Body::from(body));
                    return inner.call(req).await.map(|r| r.map(Body::new));
                }
                tracing::warn!(%key, error = &e as &dyn std::error::Error, "idempotency store unreachable; request refused (fail closed)");
                return Ok(unavailable());
            }
        };

        // With a commit store, the store decided whether the work happened
        // (the claim looked there: a record committed by a claimer that died
        // before completing ours is `Done`); the handler commits through a
        // `Commit`.
        let mut commit = None;
        if let (Some(store), Some(fingerprint)) = (&config.commit, commit_fingerprint) {
            let handle = Commit::new(config.clone(), store.clone(), &record, fingerprint);
            parts.extensions.insert(handle.clone());
            commit = Some(handle);
        }
        crate::metrics::idempotency(&metrics_route, IdempotencyOutcome::Claimed);
        let req = Request::from_parts(parts, Body::from(body));
        // Claimed: from here on the request runs to its end (unless configured
        // otherwise), whether or not its client is still there, so a retry finds
        // its stored response instead of running the handler again.
        // It runs in place while the client waits, and moves into a task of its
        // own only if the client goes away first (`layer::detach`). Boxed either
        // way: this future holds a pointer, not the handler's and the storing's
        // state, and is smaller to move.
        let run = run_claimed(config.clone(), inner, req, key, record, commit);
        let ran = if config.completion.enabled {
            detachable(config.completion.tracker.as_ref(), run).await
        } else {
            Ok(Box::pin(run).await)
        };
        match ran {
            Ok(answer) => answer,
            // The record was dropped with the handler: released in the background.
            Err(Aborted) => Ok(failed("the request failed")),
        }
    }
}

/// Releases `running` (its failure is logged by the release), so a retry
/// runs the request. Boxed: these are the rare paths, whose state the
/// response future need not carry (it is moved into its box once a request).
async fn give_back(running: RecordGuard) {
    let _ = Box::pin(running.release()).await;
}

/// The `500` answer to a request that failed before its response could be
/// stored (the record is released).
fn failed(why: &str) -> Response<Body> {
    problem(
        StatusCode::INTERNAL_SERVER_ERROR,
        &format!("{why}; the request may be retried with the same Idempotency-Key"),
    )
}

/// Runs the claimed request `req` on `inner`, then stores its response in
/// the record `running` (or releases it) and answers.
// Not an `async fn`, which would keep its arguments twice in its state.
#[allow(clippy::manual_async_fn)]
fn run_claimed<S, ResB>(
    config: Arc<Config>,
    mut inner: S,
    req: Request<Body>,
    key: String,
    running: RecordGuard,
    commit: Option<Commit>,
) -> impl Future<Output = Result<Response<Body>, S::Error>>
where
    S: Service<Request<Body>, Response = Response<ResB>>,
    ResB: HttpBody,
{
    async move {
        // Cancelled if the record is lost meanwhile (the store unreachable
        // for longer than its lease): a duplicate's claim may run it now.
        let called = AssertUnwindSafe(inner.call(req)).catch_unwind();
        let called = tokio::select! {
            biased;
            called = called => called,
            () = running.lost() => {
                tracing::warn!(%key, record = running.record(), "idempotency: the record was lost while the handler ran; the handler was cancelled");
                return Ok(lost_while_running());
            }
        };
        let response = match called {
            Ok(Ok(response)) => response,
            Ok(Err(e)) => {
                give_back(running).await;
                return Err(e);
            }
            Err(_panic) => {
                tracing::error!(%key, record = running.record(), "idempotency: the handler panicked; record released");
                give_back(running).await;
                return Ok(failed("the request failed"));
            }
        };
        let with_store = commit.is_some();
        match commit.map(|c| c.take_state()) {
            // The handler committed its writes with the record: ours gets the
            // committed response, whatever the handler answered after.
            Some(CommitState::Committed(stored)) => {
                complete(running, stored, &config.completion).await;
                return Ok(response.map(Body::new));
            }
            // Committed in the record itself, on the lock server.
            Some(CommitState::Completed) => {
                running.settled();
                return Ok(response.map(Body::new));
            }
            // Its commit failed or may have happened: not stored here, so the
            // retry looks in the store again.
            Some(CommitState::Failed) => {
                tracing::debug!(%key, "idempotency: the handler's commit failed; record released");
                give_back(running).await;
                return Ok(response.map(Body::new));
            }
            Some(CommitState::Unused) | None => {}
        }
        let (head, body) = response.into_parts();
        if !should_store(&config, &head, with_store) {
            tracing::debug!(%key, status = %head.status, "idempotency: response not stored; the key may be retried");
            give_back(running).await;
            return Ok(Response::from_parts(head, Body::new(body)));
        }

        let max_response_body = config.max_response_body;
        let buffered = match AssertUnwindSafe(buffer(body, max_response_body))
            .catch_unwind()
            .await
        {
            Ok(Ok(buffered)) => buffered,
            Ok(Err(e)) => {
                tracing::error!(%key, record = running.record(), error = %e, "idempotency: the response body failed; record released");
                give_back(running).await;
                return Ok(failed("the response could not be produced"));
            }
            Err(_panic) => {
                tracing::error!(%key, record = running.record(), "idempotency: the response body panicked; record released");
                give_back(running).await;
                return Ok(failed("the response could not be produced"));
            }
        };
        let (stored_body, body_too_large) = match &buffered {
            Buffered::Complete { data, .. } => (data.clone(), false),
            Buffered::Partial { .. } => {
                tracing::warn!(%key, record = running.record(), limit = max_response_body,
                    "idempotency: response larger than the storage limit; a retry gets 410 Gone \
                     (the request is completed and does not run again)");
                (Bytes::new(), true)
            }
        };
        let stored = StoredResponse {
            status: head.status.as_u16(),
            headers: encode_headers(&head.headers, &config.stored_headers),
            body: stored_body,
            body_too_large,
        };
        // The handler succeeded: whatever happens to the record now, its
        // response goes to the client. One larger than the limit is stored
        // (as too large) once the rest of it has gone out.
        let body = match buffered {
            Buffered::Complete { data, trailers } => {
                complete(running, stored, &config.completion).await;
                Body::new(Rebuilt::<SettleAtEnd<ResB>>::new(data, trailers, None))
            }
            Buffered::Partial { data, rest } => {
                let rest = SettleAtEnd::new(rest, running, stored, config.clone());
                Body::new(Rebuilt::new(data, None, Some(rest)))
            }
        };
        Ok(Response::from_parts(head, body))
    }
}

/// The `503` answer to a request whose record was lost while its handler
/// ran (the handler was cancelled; a retry gets the stored response of the
/// claimer that took the record, or runs it).
fn lost_while_running() -> Response<Body> {
    problem_retry(
        StatusCode::SERVICE_UNAVAILABLE,
        "the idempotency store could not be reached for longer than this request's lease, \
         and its record was lost: the request was cancelled and may have partly run; retry \
         with the same Idempotency-Key",
        Duration::from_secs(1),
    )
}

/// Whether a response is the handler's outcome, to be replayed. A response
/// from an inner layer of this crate refusing the request is not. A `4xx` means
/// the request was refused before doing anything (extraction, validation,
/// authorisation), so the key stays usable, unless the handler marked the
/// response with [`StoreResponse`]. So does a `5xx` on a layer with a commit
/// store (`with_store`) whose handler committed nothing: the store says the
/// work did not happen, and a retry runs it.
fn should_store(config: &Config, head: &response::Parts, with_store: bool) -> bool {
    if head.extensions.get::<Refusal>().is_some() {
        // An inner layer refused the request (e.g. `LockLayer`: busy, backend
        // down, lease lost mid-way): the handler did not run, or not to its end.
        return false;
    }
    let marked = head.extensions.get::<StoreResponse>().is_some();
    if head.status.is_client_error() {
        marked
    } else if head.status.is_server_error() {
        (config.store_server_errors && !with_store) || marked
    } else {
        true
    }
}
