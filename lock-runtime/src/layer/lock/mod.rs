//! [`LockLayer`]: one request at a time per resource, or at most `n` with
//! [`permits(n)`](LockLayer::permits).
//!
//! For each request the layer builds a key (from an extractor's typed value,
//! a template over path parameters, a header or a closure), takes the lock
//! `key` on its [`LockClient`](crate::LockClient) (with `permits(n)`: one of
//! the `n` permits of the semaphore `key`), and runs the inner service under
//! it:
//!
//! | outcome | response |
//! | --- | --- |
//! | lock taken | the inner service's response; the lock is held, renewed by the watchdog, until the body has produced its last frame (released just before that frame is written, so the client's next request finds it free) or is dropped |
//! | busy after the configured wait | `409 Conflict` with `Retry-After` = [`LockError::Busy`](crate::LockError::Busy)'s `retry_after` (what this client's recent holds of the key took, at most the holder's remaining lease), rounded up to whole seconds |
//! | every permit taken after the configured wait ([`permits`](LockLayer::permits)) | `429 Too Many Requests` with `Retry-After` = the same hint, at most the remaining lease of the permit that ends first |
//! | either of the two, with [`busy_status`](LockLayer::busy_status) set | that status instead, with the same `Retry-After` and body |
//! | no key can be built for the request (a header missing, an extractor's rejection) | `400 Bad Request`; with [`key_from`](LockLayer::key_from), the extractor's own rejection |
//! | the [template](LockLayer::key) names a parameter the route lacks | `500 Internal Server Error` (the route and the name logged at `error` level) |
//! | backend unreachable | `503 Service Unavailable` with `Retry-After` (fail closed), or the handler without the lock if [`fail_open`](LockLayer::fail_open) |
//! | lease lost while the handler runs | the handler is cancelled; `503` |
//!
//! A misconfigured layer (a malformed template, `permits(0)`, a lease out of
//! bounds) never gets to answer a request: it is refused when the router is
//! built ([Settings out of range](crate::layer#settings-out-of-range)). Only
//! which route it was added to is known no sooner than a request.
//!
//! Refusals carry an `application/problem+json` body. If the client goes away
//! mid-request, the handler [runs to its end](LockLayer::run_to_completion)
//! and the lock is released then, so the next request for the key gets it
//! only after the handler finished (with `run_to_completion(false)`: the
//! handler is dropped with the connection and the lock released at once).
//!
//! Inside the handler, the [`LockInfo`](crate::LockInfo) extractor (or
//! [`current_lock`](crate::current_lock)) gives the key and the fencing token
//! (of the request's permit, with `permits`), and a `#[distributed_lock]`
//! function locking the same key on the same client re-enters instead of
//! waiting for the request's own lock (with `permits`: a function taking a
//! permit of the same semaphore).

mod body;
mod extract;
mod future;
mod key;
mod layer;
mod service;

pub use self::future::ResponseFuture;
pub use self::layer::LockLayer;
pub use self::service::Lock;
