//! [`IdempotencyLayer`]: the `Idempotency-Key` header
//! (draft-ietf-httpapi-idempotency-key-header), with Stripe's semantics.
//!
//! A client that retries a `POST` (after a timeout, a dropped connection, a
//! crash) sends the same `Idempotency-Key` each time; the handler runs once and
//! every retry gets its response:
//!
//! | request | response |
//! | --- | --- |
//! | first with this key | the handler's; the response (status, [selected headers](IdempotencyLayer::store_header), body) is stored for the [retention period](IdempotencyLayer::retention) (24 h) |
//! | duplicate, first still running | `409 Conflict` with `Retry-After: 1`, or the stored response after [waiting](IdempotencyLayer::wait) |
//! | duplicate, first done | the stored response with `Idempotent-Replayed: true`; the handler does not run |
//! | same key, another method/path/query/body | `422 Unprocessable Content` |
//! | key missing on `POST` ([configurable](IdempotencyLayer::required_on)), malformed, or over 255 characters | `400 Bad Request` |
//! | body over the [limit](IdempotencyLayer::max_request_body) | `413 Content Too Large` |
//! | store unreachable | `503` with `Retry-After` (fail closed), or [fail open](IdempotencyLayer::fail_open) |
//!
//! The key is a Structured Field string (`Idempotency-Key: "8e03978e-40d5"`);
//! the same text as a bare token is accepted too.
//!
//! # What is stored
//!
//! * `2xx` and `3xx`: always.
//! * `5xx`: by default (the handler may have done part of its work);
//!   see [`store_server_errors`](IdempotencyLayer::store_server_errors).
//! * `4xx`: not stored. Such a response means the request was refused before
//!   the handler did anything (a rejected extractor, validation,
//!   authorisation), so the key is released and the corrected request can be
//!   sent with the same key. A handler whose `4xx` *is* its outcome (a
//!   declined payment, say) marks it with [`StoreResponse`].
//! * A handler that panics, or whose response body fails: nothing is stored,
//!   the record is released and the client gets `500`.
//! * A request whose client goes away mid-handler: the record is released.
//! * A refusal by an inner [`LockLayer`](crate::layer::LockLayer) (busy,
//!   backend down, lease lost mid-way; any status): not stored, the record is
//!   released.
//!
//! # Records
//!
//! One record per (scope, method, matched route, key), named
//! `<prefix>I{<sha-256>}` on the client's backend; the [scope](IdempotencyLayer::scope)
//! is the principal, so clients cannot see each other's responses. The
//! record also holds the request fingerprint (method, route, path and query,
//! SHA-256 of the body). Claim, renew, complete and release are each one
//! atomic script; while the handler runs the record has a lease renewed every
//! `lease / 3`, so a crashed process frees the key after at most one lease.
//!
//! On [Redlock](crate::LockClientBuilder::redlock) every master keeps a copy
//! and a majority decides, as for a lock: a request runs only when it claimed
//! a majority, and a stored response found on any master is replayed. A
//! master that dies, or comes back empty, therefore neither stops the layer
//! nor lets a completed request run again; without a majority the answer is
//! `503`. Identical requests racing over three or more masters can split the
//! claims so that none has a majority: each then gets `409` and the retry
//! decides (the partial claims are undone at once).

mod future;
mod key;
mod layer;
mod service;
mod stored;

use std::convert::Infallible;

use axum::response::{IntoResponseParts, ResponseParts};

pub use self::future::ResponseFuture;
pub use self::key::{BodyFingerprint, MAX_IDEMPOTENCY_KEY_LEN};
pub use self::layer::{DEFAULT_MAX_BODY, DEFAULT_RETENTION, IdempotencyLayer};
pub use self::service::Idempotency;

/// Marks a `4xx` response as the handler's outcome, to be stored and replayed
/// like a `2xx` (by default a `4xx` is taken as a refusal and not stored).
///
/// ```
/// use axum::http::StatusCode;
/// use lock_runtime::layer::idempotency::StoreResponse;
///
/// async fn charge() -> (StatusCode, StoreResponse, &'static str) {
///     // The card was declined: a retry must see the same answer.
///     (StatusCode::PAYMENT_REQUIRED, StoreResponse, "card declined")
/// }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreResponse;

impl IntoResponseParts for StoreResponse {
    type Error = Infallible;

    fn into_response_parts(self, mut res: ResponseParts) -> Result<ResponseParts, Self::Error> {
        res.extensions_mut().insert(self);
        Ok(res)
    }
}
