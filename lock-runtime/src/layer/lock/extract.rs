//! [`LockInfo`] as an axum extractor.

use std::convert::Infallible;

use axum::extract::{FromRequestParts, OptionalFromRequestParts};
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use http::request::Parts;

use crate::context::LockInfo;
use crate::held::Held;
use crate::layer::problem::problem;

/// The lock [`LockLayer`](super::LockLayer) took for a request, in the
/// request's extensions: what [`LockInfo`] is made of when a handler asks.
#[derive(Clone)]
pub(super) struct RequestLock(pub(super) std::sync::Arc<Held>);

impl RequestLock {
    fn info(parts: &Parts) -> Option<LockInfo> {
        parts
            .extensions
            .get::<RequestLock>()
            .map(|lock| LockInfo::of(&lock.0))
    }
}

/// The lock [`LockLayer`](super::LockLayer) took for this request: its key and
/// fencing token. Rejects with `500` on a route without the layer (or one
/// that [failed open](super::LockLayer::fail_open)); take `Option<LockInfo>`
/// where that is expected.
///
/// The layer keeps the lock in the request's extensions under a private
/// type and makes a `LockInfo` only when asked, so `Extension<LockInfo>`
/// and `extensions().get::<LockInfo>()` find nothing: use this extractor
/// (it works in a `from_fn` middleware inside the layer too, through
/// `Request::extract_parts`), or [`current_lock`](crate::current_lock) in
/// code the handler calls.
///
/// ```
/// use lock_runtime::LockInfo;
///
/// async fn pay(lock: LockInfo) -> Result<String, String> {
///     // Pass the token with every write; storage rejects lower ones.
///     let token = lock.fencing_token().await.map_err(|e| e.to_string())?;
///     Ok(format!("{} paid under fencing token {token}", lock.key))
/// }
/// ```
impl<S: Send + Sync> FromRequestParts<S> for LockInfo {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        RequestLock::info(parts).ok_or_else(|| {
            tracing::error!(
                path = %parts.uri.path(),
                "`LockInfo` extracted on a route without `LockLayer`"
            );
            problem(
                StatusCode::INTERNAL_SERVER_ERROR,
                "this route reads a lock that no LockLayer took",
            )
            .into_response()
        })
    }
}

impl<S: Send + Sync> OptionalFromRequestParts<S> for LockInfo {
    type Rejection = Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        _state: &S,
    ) -> Result<Option<Self>, Self::Rejection> {
        Ok(RequestLock::info(parts))
    }
}
