use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::BoxError;
use axum::body::Body;
use bytes::Bytes;
use futures_util::FutureExt;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use tower_service::Service;

use super::ResponseFuture;
use super::body::{LockedBody, release_logged};
use super::extract::RequestLock;
use super::key::{KeyError, KeySource};
use super::layer::Config;
use crate::client::LockGuard;
use crate::error::LockError;
use crate::layer::bounds::{HttpBody, Wrapped};
use crate::layer::completion::Aborted;
use crate::layer::problem::{Refusal, problem, problem_retry};
use crate::run::unless_lost;

wrapped_service! {
    /// The service made by [`LockLayer`](super::LockLayer): takes the request's
    /// lock, runs the inner service under it, and keeps it until the response
    /// body has been sent or dropped.
    pub struct Lock;
    made_by: super::LockLayer;
    debug: [key, permits]
}

impl<S, B, ResB> Service<Request<B>> for Lock<S>
where
    S: Service<Request<B>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
    ResB: http_body::Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let (mut parts, body) = req.into_parts();
        if let KeySource::Extract { extract, .. } = &self.config.key {
            // An extractor may await: it runs inside the response future.
            let extract = extract.clone();
            let config = self.config.clone();
            let inner = self.take_ready_inner();
            return ResponseFuture::running(Box::pin(async move {
                match extract(&mut parts).await {
                    Ok(key) => locked(config, inner, Request::from_parts(parts, body), key).await,
                    Err(mut rejection) => {
                        tracing::debug!(
                            path = %parts.uri.path(),
                            status = %rejection.status(),
                            "lock layer: the key extractor rejected the request"
                        );
                        // The request did not run: an outer IdempotencyLayer
                        // must not store this answer.
                        rejection.extensions_mut().insert(Refusal);
                        Ok(rejection)
                    }
                }
            }));
        }
        let key = match self.config.key.build(&mut parts) {
            Ok(key) => key,
            Err(KeyError::Request(why)) => {
                tracing::debug!(path = %parts.uri.path(), "lock layer: no key: {why}");
                return ResponseFuture::ready(problem(StatusCode::BAD_REQUEST, &why));
            }
            Err(KeyError::Config(why)) => {
                tracing::error!("lock layer misconfigured: {why}");
                return ResponseFuture::ready(misconfigured(
                    "the lock layer of this route is misconfigured",
                ));
            }
        };
        let req = Request::from_parts(parts, body);
        let inner = self.take_ready_inner();
        ResponseFuture::running(Box::pin(locked(self.config.clone(), inner, req, key)))
    }
}

impl<S: Clone> Lock<S> {
    /// The instance `poll_ready` prepared, to serve this request; a clone
    /// takes its place.
    fn take_ready_inner(&mut self) -> S {
        let clone = self.inner.clone();
        std::mem::replace(&mut self.inner, clone)
    }
}

async fn locked<S, B, ResB>(
    config: Arc<Config>,
    mut inner: S,
    mut req: Request<B>,
    key: String,
) -> Result<Response<Body>, S::Error>
where
    S: Wrapped<Request<B>, ResB>,
    B: Send + 'static,
    ResB: HttpBody,
{
    // The key goes into the request (it names the lock from then on); the
    // refusals below take it back from the error, or name the path.
    let request = match config.permits {
        None => config.client.lock(key),
        Some(permits) => config.client.semaphore(key, permits),
    };
    let mut options = config.options.clone();
    if cfg!(feature = "metrics") {
        // The route, never the key, names the lock's metrics.
        let route = req
            .extensions()
            .get::<axum::extract::MatchedPath>()
            .map_or("unrouted", axum::extract::MatchedPath::as_str);
        options = options.metrics(
            config
                .routes
                .get(route, |route| crate::metrics::Name::new(Arc::from(route))),
        );
    }
    // Each future awaited below is made in the statement that awaits it:
    // a future kept in a local until the end of the scope would stay in
    // this one's state after it ended, and this state is copied (into its
    // box) once a request.
    let acquired = request.options(options).acquire().await;
    let guard = match acquired {
        Ok(guard) => guard,
        Err(e) if e.is_backend() && config.fail_open => {
            tracing::warn!(path = %req.uri().path(), error = &e as &dyn std::error::Error, "lock backend unreachable; serving without the lock (fail open)");
            // Boxed: the handler's future is not kept inline in this one
            // for the rare request served without the lock.
            return Box::pin(inner.call(req)).await.map(|r| r.map(Body::new));
        }
        Err(e) => return Ok(refusal(&config, req.uri().path(), e)),
    };
    // The handler's `LockInfo` is made from this if it asks (most handlers
    // never do): one pointer here, no copy of the key per request.
    let held = guard.held().clone();
    req.extensions_mut().insert(RequestLock(held.clone()));
    // Locked: from here on the request runs to its end (unless configured
    // otherwise), whether or not its client is still there. Inside, the
    // handler sees `current_lock()`, and a nested lock of the same key (a
    // `#[distributed_lock]` function) re-enters.
    let completion = &config.completion;
    let ran = crate::layer::detach::run_to_completion(
        completion,
        Some(held.clone()),
        run_locked(inner, req, guard),
    )
    .finished_by(release_unanswered::<S::Error, ResB>)
    .await;
    match ran {
        // The handler ended: the lock goes back (or on to the body) outside
        // the run, which then ends at the handler's first poll if it can.
        Ok(Ok((Some(response), guard))) => Ok(hand_over(response, guard).await),
        Ok(Ok((None, guard))) => {
            tracing::warn!(key = %guard.key(), "lock lost while the request ran (its lease \
                was not renewed in time, or it was released by force); the request was cancelled");
            // The key stays in the log, as for `Busy` (`refusal`).
            Ok(problem_retry(
                StatusCode::SERVICE_UNAVAILABLE,
                "this request's lock was lost while it ran; the request was cancelled",
                Duration::from_secs(1),
            ))
        }
        Ok(Err(e)) => Err(e),
        Err(Aborted) => {
            // The guard was dropped with the task: released in the background.
            // Logged by `Completion::run` (a panic, or the runtime shutting down).
            tracing::debug!(key = %held.key, "lock layer: the handler did not end; lock released");
            let mut response = problem(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the request failed; it may be retried",
            );
            // Not the handler's outcome: an outer IdempotencyLayer must not
            // store it.
            response.extensions_mut().insert(Refusal);
            Ok(response)
        }
    }
}

/// What a handler whose client went away ends with, in the task that ran
/// it to its end: the lock is released there (counted by the layer's
/// tracker until it is), not left to the guard's background release.
fn release_unanswered<E: Send + 'static, ResB: Send + 'static>(
    ran: Result<(Option<Response<ResB>>, LockGuard), E>,
) -> crate::layer::detach::Boxed<()> {
    Box::pin(async move {
        if let Ok((_, guard)) = ran {
            release_logged(guard, "after a handler whose client went away").await;
        }
    })
}

/// Runs `req` on `inner` under the lock of `guard` (inside the lock's
/// task-local scope), cancelled if the lease is lost (`None`), and gives
/// the lock back with the response.
async fn run_locked<S, B, ResB>(
    mut inner: S,
    req: Request<B>,
    guard: LockGuard,
) -> Result<(Option<Response<ResB>>, LockGuard), S::Error>
where
    S: Service<Request<B>, Response = Response<ResB>>,
{
    match unless_lost(std::slice::from_ref(guard.held()), inner.call(req)).await {
        Some(Ok(response)) => Ok((Some(response), guard)),
        Some(Err(e)) => Err(e),
        None => Ok((None, guard)),
    }
}

/// Attaches the lock to the response body, or releases it first if the body
/// is already complete.
///
/// Most handlers return a body that is fully produced (`Json`, `String`,
/// `Bytes`, empty): its first frame is ready at once and is its last. The lock
/// is then released *before* the response is handed on, so the response goes
/// out in one write (no head-then-body split to stall on Nagle's algorithm
/// and delayed ACKs) and a client's next request finds the lock free. Only
/// a body still being produced keeps the lock while it streams.
async fn hand_over<ResB>(response: Response<ResB>, guard: LockGuard) -> Response<Body>
where
    ResB: HttpBody,
{
    let (head, body) = response.into_parts();
    // axum's own body (what a `Router` answers) is read as it is; any other
    // is pinned in a box first.
    match try_downcast::<Body, ResB>(body) {
        Ok(body) => hand_over_body(head, body, guard).await,
        Err(body) => hand_over_body(head, Box::pin(body), guard).await,
    }
}

/// `k` as a `T` if it is one (the way axum's `Body::new` finds a body that
/// is a `Body` already), else `k` back.
fn try_downcast<T: 'static, K: 'static>(k: K) -> Result<T, K> {
    let mut k = Some(k);
    if let Some(t) = <dyn std::any::Any>::downcast_mut::<Option<T>>(&mut k) {
        Ok(t.take().expect("set just above"))
    } else {
        Err(k.expect("set just above"))
    }
}

/// [`hand_over`] of `body`, which polls in place.
async fn hand_over_body<B>(
    head: http::response::Parts,
    mut body: B,
    guard: LockGuard,
) -> Response<Body>
where
    B: HttpBody + Unpin,
{
    let release = |guard| release_logged(guard, "after the response");
    let first = if body.is_end_stream() {
        Some(None)
    } else {
        body.frame()
            .now_or_never()
            .map(|frame| frame.map(|r| r.map_err(Into::<BoxError>::into)))
    };
    match first {
        // Complete: release, then answer.
        Some(None) => {
            release(guard).await;
            Response::from_parts(head, Body::empty())
        }
        Some(Some(Ok(frame))) if body.is_end_stream() => {
            release(guard).await;
            drop(body);
            let body = match frame.into_data() {
                Ok(data) => Body::from(data),
                // A body of trailers alone.
                Err(frame) => Body::new(LockedBody::<B>::done(frame)),
            };
            Response::from_parts(head, body)
        }
        // More to come: the body holds the lock.
        Some(Some(Ok(frame))) => {
            Response::from_parts(head, Body::new(LockedBody::new(body, guard, Some(frame))))
        }
        None => Response::from_parts(head, Body::new(LockedBody::new(body, guard, None))),
        Some(Some(Err(e))) => {
            tracing::error!(key = %guard.key(), error = %e, "lock layer: the response body failed at once");
            release(guard).await;
            problem(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the response could not be produced",
            )
        }
    }
}

/// The response to a request (to `path`) whose lock was not taken.
fn refusal(config: &Config, path: &str, e: LockError) -> Response<Body> {
    match e {
        LockError::Busy { key, retry_after } => {
            tracing::debug!(%key, ?retry_after, "lock busy; request refused");
            // The key stays in the log: a key made by `key_fn` may name
            // what only the service should see (a tenant, a user).
            let detail = match config.permits {
                None => "another request holds this request's lock; retry later".to_owned(),
                Some(1) => {
                    "the only permit for this request is taken by another request; retry later"
                        .to_owned()
                }
                Some(n) => {
                    format!(
                        "all {n} permits for this request are taken by other requests; retry later"
                    )
                }
            };
            problem_retry(config.busy_status(), &detail, retry_after)
        }
        LockError::InvalidKey(why) => {
            tracing::debug!(%path, "invalid lock key: {why}");
            problem(StatusCode::BAD_REQUEST, &format!("invalid lock key: {why}"))
        }
        LockError::Backend(e) => {
            tracing::warn!(%path, error = &e as &dyn std::error::Error, "lock backend unreachable; request refused (fail closed)");
            problem_retry(
                StatusCode::SERVICE_UNAVAILABLE,
                "the lock service is unavailable; retry later",
                Duration::from_secs(1),
            )
        }
        e => {
            tracing::error!(%path, error = &e as &dyn std::error::Error, "lock layer: cannot lock");
            misconfigured("the lock layer of this route is misconfigured")
        }
    }
}

/// The `500` answer of a layer whose configuration is wrong (the log says how).
fn misconfigured(detail: &str) -> Response<Body> {
    problem(StatusCode::INTERNAL_SERVER_ERROR, detail)
}
