//! [`LockInfo`] as an axum extractor.

use std::convert::Infallible;

use axum::extract::{FromRequestParts, OptionalFromRequestParts};
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use http::request::Parts;

use crate::LockInfo;
use crate::layer::problem::problem;

/// The lock [`LockLayer`](super::LockLayer) took for this request: its key and
/// fencing token. Rejects with `500` on a route without the layer (or one
/// that [failed open](super::LockLayer::fail_open)); take `Option<LockInfo>`
/// where that is expected.
///
/// ```
/// use lock_runtime::LockInfo;
///
/// async fn pay(lock: LockInfo) -> String {
///     // Pass the token with every write; storage rejects lower ones.
///     format!("{} paid under fencing token {}", lock.key, lock.fencing_token)
/// }
/// ```
impl<S: Send + Sync> FromRequestParts<S> for LockInfo {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts.extensions.get::<LockInfo>().cloned().ok_or_else(|| {
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
        Ok(parts.extensions.get::<LockInfo>().cloned())
    }
}
