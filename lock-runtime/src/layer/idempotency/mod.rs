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
//! | duplicate, first still running | `409 Conflict` with `Retry-After: 1`, or the stored response after [waiting](IdempotencyLayer::wait) (woken by a notice, [below](#waiting-duplicates)) |
//! | duplicate, first done | the stored response, byte for byte, with `Idempotent-Replayed: true`; the handler does not run |
//! | duplicate, first done with a response over the [storage limit](IdempotencyLayer::max_response_body) | `410 Gone` with `Idempotent-Replayed: true` ([below](#responses-too-large-to-replay)); the handler does not run |
//! | same key, same method and route, another path, query or body ([bytes or JSON](IdempotencyLayer::body_fingerprint)) | `422 Unprocessable Content` |
//! | same key, another method or route | a request of its own (keys are scoped by caller, method and route: [below](#records)) |
//! | key missing on `POST` ([configurable](IdempotencyLayer::required_on)), malformed, or over 255 characters; a body that is not JSON under [`BodyFingerprint::Json`] | `400 Bad Request` |
//! | body over the [limit](IdempotencyLayer::max_request_body) | `413 Content Too Large` |
//! | store unreachable, or the claim acknowledged by fewer replicas than `min_replica_acks` asks (given back) | `503` with `Retry-After` (fail closed), or [fail open](IdempotencyLayer::fail_open) |
//! | record lost while the handler runs (the store unreachable for longer than the [lease](IdempotencyLayer::ttl), then the record expired or a duplicate claimed it) | the handler is cancelled; `503` with `Retry-After` (nothing stored; the retry gets the duplicate's response, or runs) |
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
//! * A request whose client goes away mid-handler: the handler [runs to its
//!   end](IdempotencyLayer::run_to_completion) and its response is stored as
//!   above, so the client's retry gets it (`409` until then). With
//!   `run_to_completion(false)`, the handler is dropped with the connection
//!   and the record released. A request cut off while its claim was on the
//!   wire releases what the claim may have taken (nothing ran yet).
//! * A refusal by an inner [`LockLayer`](crate::layer::LockLayer) (busy,
//!   backend down, lease lost mid-way; any status): not stored, the record is
//!   released.
//! * A handler whose record is lost while it runs (the watchdog could not
//!   renew it for longer than its lease, and the server then says it is not
//!   ours: it expired, or a duplicate's claim took it) is cancelled at its
//!   next `.await`, as `LockLayer` cancels one whose lock is lost, since a
//!   duplicate may run it now: its client gets `503`, nothing is stored.
//!   What it did before that point stays done; a handler that must not be
//!   cut short, or run twice, commits through a commit store (below).
//!
//! # Responses are buffered
//!
//! The response is stored before it is sent, so the layer reads its body in
//! full first (up to [`max_response_body`](IdempotencyLayer::max_response_body);
//! past that it streams the rest, as below). A streaming response (server-sent
//! events, a progress stream) therefore reaches its client only when it ends,
//! and duplicates get `409` meanwhile: keep streaming routes out of the layer.
//!
//! # Exactly once across crashes
//!
//! The handler's writes and the layer's completion of the record are two
//! commits: a process killed between them (`SIGKILL`, the OOM killer) leaves
//! the effect with no completed record, and after the claim's lease the
//! client's retry runs the handler again. By itself the layer is exactly once
//! while the process lives, at least once across a crash. Given a commit
//! store (`commit_with_postgres`, feature `postgres`;
//! [`commit_with_redis`](IdempotencyLayer::commit_with_redis)), it hands the
//! handler a [`Commit`]: the handler's writes and the completed record then
//! commit together (one PostgreSQL transaction, one Redis script), a claimed
//! request looks there before it runs, and a crash at any moment leaves both
//! or neither. See [`commit`] for the details, and the order service
//! (`examples/src/order_service/create.rs`) for a handler that uses it.
//!
//! # Responses too large to replay
//!
//! A response whose body is over [`max_response_body`](IdempotencyLayer::max_response_body)
//! (1 MiB by default) is sent in full to its own client, and the request is
//! recorded as completed, so it never runs again for its key. A retry does
//! not get a response that only looks like the original (its status with an
//! empty body) but `410 Gone`, with `Idempotent-Replayed: true` and a
//! problem body naming the original status and `Location`:
//!
//! ```text
//! HTTP/1.1 410 Gone
//! content-type: application/problem+json
//! idempotent-replayed: true
//!
//! {"type":"about:blank","title":"Gone","status":410,"detail":"the request with this
//! Idempotency-Key was completed (status 201) and will not run again, but its response
//! was larger than the storage limit and cannot be replayed","original_status":201,
//! "location":"/reports/7"}
//! ```
//!
//! Why `410`: the draft (`draft-ietf-httpapi-idempotency-key-header`) gives
//! `409` to a request still in flight (retry later) and `422` to a key reused
//! for another payload; Stripe replays every stored result and has no such
//! case. Here the outcome is final: the response is gone for good, which is
//! what `410` says (RFC 9110, 15.5.11). As a `4xx` it stops automatic
//! retries, where a `5xx` would invite them forever and count as an outage,
//! and a `2xx` would pass an empty or substitute body for the original.
//!
//! # Lost replies
//!
//! A command whose connection dies (a killed connection, a failover, a
//! timeout) may or may not have run. Every record command is safe to send
//! again, and is sent again while its outcome is unknown: a claim with the
//! same owner token re-arms our own claim; a completion that finds our
//! response already stored is a success (the completed record keeps its
//! owner); renewals and releases find nothing left to do. So:
//!
//! * a handler that succeeded always gets its response to the client; the
//!   response waits at most 2 s for the record to be completed, the
//!   completion goes on in the background (with the lease renewed) for up to
//!   a lease, and a completion that truly fails is logged (`tracing::warn!`,
//!   naming the record);
//! * a completed request does not run again: a completion that reaches a
//!   record whose lease ran out, but that nobody claimed since, still stores
//!   the response;
//! * an unanswered renewal is retried soon and never taken for a lost claim;
//!   on Redlock a renewal or completion counts as refused only when so many
//!   masters refused it that the unanswered ones could not make a majority.
//!
//! # Records
//!
//! One record per (scope, method, matched route, key), named
//! `<prefix>I{<sha-256>}` on the client's backend. The [scope](IdempotencyLayer::scope)
//! is the caller: by default a SHA-256 of its credentials (`Authorization`,
//! cookies, `X-Api-Key`), so requests whose credentials differ never share a
//! record and one caller is never handed another's response; `.scope(..)`
//! names the principal instead (an API that authenticates any other way
//! must), and [`records_shared_by_all_callers`](IdempotencyLayer::records_shared_by_all_callers)
//! opts out. The
//! record also holds the request fingerprint (method, route, path and query,
//! SHA-256 of the body's bytes or, with [`BodyFingerprint::Json`], of its
//! JSON value with members sorted and whitespace dropped). Claim, renew, complete and release are each one
//! atomic step (a claim of a free key one plain `SET .. NX PX`, every other
//! step one script); while the handler runs the record has a lease renewed every
//! `lease / 3`, so a crashed process frees the key after at most one lease.
//! The client's watchdog renews it, with the client's locks: one task, and
//! one batched script call per renewal period for all the records in flight
//! on a server (one per slot on a cluster), not a task and a call per
//! record. [`LockClient::renewed_records`](crate::LockClient::renewed_records)
//! counts them.
//!
//! # Waiting duplicates
//!
//! A duplicate that [waits](IdempotencyLayer::wait) does not poll. As a lock
//! waiter does, it registers on the record's notice channel
//! (`<prefix>J{<sha-256>}`, in the record's hash slot; sharded pub/sub on a
//! cluster, every master's notices on Redlock) over the client's one pub/sub
//! connection, and sleeps until the completion or release of the record is
//! announced, the record's lease runs out, or its wait ends, whichever comes
//! first; then it looks again. A completed record's response reaches a
//! waiting duplicate about one round trip after it is stored, and a released
//! one (the first request failed) is claimed by a duplicate just as soon.
//! Notices are best effort: a lost one (an ACL that refuses the channel to
//! the publisher, a dropped pub/sub connection) costs at most the record's
//! lease, bounded by the wait; where the subscription itself is refused, the
//! duplicate looks again with a back-off of up to 250 ms instead. An ACL user
//! needs the prefix's channels (`&lock:*`) for prompt wake-ups.
//!
//! On [Redlock](crate::LockClientBuilder::redlock) every master keeps a copy
//! and a majority decides, as for a lock: a request runs only when it claimed
//! a majority, and a stored response found on any master is replayed. A
//! master that dies, or comes back empty, therefore neither stops the layer
//! nor lets a completed request run again; without a majority the answer is
//! `503`. Identical requests racing over three or more masters can split the
//! claims so that none has a majority: each then gets `409` and the retry
//! decides (the partial claims are undone at once).

mod body;
pub mod commit;
mod future;
mod key;
mod layer;
mod running;
mod scope;
mod service;
mod stored;
#[cfg(test)]
mod tests;

use std::convert::Infallible;

use axum::response::{IntoResponseParts, ResponseParts};

pub use self::commit::{COMMITTED_SUFFIX, Commit, RedisCommit};
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use self::commit::{POSTGRES_SCHEMA, prune_postgres};
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
