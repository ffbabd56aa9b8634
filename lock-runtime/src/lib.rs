//! Distributed locks for async Rust services, on Redis.
//!
//! Services that run as several processes must not pay an order twice, create
//! the same order from a retried request, or run one job on three pods at once.
//! `lock_runtime` gives them a lock that is correct under retries, crashes,
//! pauses and Redis failover:
//!
//! * **Atomic steps**: acquire, extend and release are each one atomic step
//!   on the server; ownership is a fresh 128-bit random token per acquisition.
//! * **Leases and a watchdog**: every lock has a TTL, renewed every `ttl / 3`
//!   while held; when renewal fails the guard's [`LockGuard::lost`] resolves and
//!   [`LockClient::with_lock`] cancels the work.
//! * **Fencing tokens**: strictly increasing per key, so storage can reject
//!   writes from a holder whose lease ran out.
//! * **Waiting without polling**: waiters sleep on release notices.
//! * **Reentrancy per task**, and an **embedded backend** ([`LockClientBuilder::memory`])
//!   with the same semantics for examples and unit tests.
//! * **A family of synchronizers** on the same client, with the same request
//!   builder, guard, leases and notified FIFO waiting:
//!   [read-write locks](LockClient::rw_lock), [semaphores](LockClient::semaphore),
//!   [several keys at once](LockClient::lock_all), and
//!   [`hold_at_least`](LockRequest::hold_at_least) for scheduled jobs.
//! * **Leader election** ([`LockClient::leader`]): one leader per name, elected
//!   in line, replaced within its lease when it dies, with a term that is a
//!   fencing token, and observers that follow every change by notice.
//!
//! # Quick start
//!
//! ```
//! use std::time::Duration;
//! use lock_runtime::{LockClient, LockError};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), LockError> {
//! let client = LockClient::builder()
//!     .memory() // .redis("redis://127.0.0.1:6379") to share locks between processes
//!     .key_prefix("lock:")
//!     .build()
//!     .await?;
//!
//! // Run a critical section; the lock is released however it ends.
//! let paid = client
//!     .lock("order:42")
//!     .ttl(Duration::from_secs(10))
//!     .wait(Duration::from_secs(2))
//!     .run(async { "paid" })
//!     .await?;
//! assert_eq!(paid, "paid");
//!
//! // Or hold a guard yourself; meanwhile another taker is told `Busy`.
//! let guard = client.lock("order:42").acquire().await?;
//! assert!(client.lock("order:42").acquire().await.unwrap_err().is_busy());
//! guard.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! With Redis (`no_run`: needs a server):
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lock_runtime::LockError> {
//! let client = lock_runtime::LockClient::builder()
//!     .redis("redis://127.0.0.1:6379")
//!     .build()
//!     .await?;
//! client.with_lock("job:nightly", async { /* ... */ }).await?;
//! # Ok(())
//! # }
//! ```
//!
//! # A tour
//!
//! Each example runs on the embedded backend; swap `.memory()` for
//! `.redis(url)` and nothing else changes.
//!
//! ## The attribute
//!
//! `#[distributed_lock]` (feature `macros`, on by default) runs an `async fn`
//! under a lock whose key is built from its arguments; its error type needs
//! `From<LockError>`.
//!
//! ```
//! # #[cfg(feature = "macros")]
//! # mod attribute {
//! use lock_runtime::{LockError, distributed_lock};
//!
//! #[distributed_lock(key = "order:<order_id>", ttl = "30s", wait = "2s")]
//! pub async fn pay(order_id: u64) -> Result<u64, LockError> {
//!     Ok(order_id) // one caller at a time per order, in every process
//! }
//! # }
//! # #[cfg(feature = "macros")]
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lock_runtime::LockError> {
//! # use attribute::pay;
//! lock_runtime::set_global_client(lock_runtime::LockClient::builder().memory().build().await?);
//! assert_eq!(pay(42).await?, 42);
//! # Ok(())
//! # }
//! # #[cfg(not(feature = "macros"))]
//! # fn main() {}
//! ```
//!
//! ## The layers (feature `axum`)
//!
//! `LockLayer` serializes requests per resource (busy: `409` with
//! `Retry-After`); `IdempotencyLayer` runs a request once per
//! `Idempotency-Key` and replays its response to retries.
//!
//! ```
//! # #[cfg(feature = "axum")]
//! # mod app {
//! use axum::{Router, extract::Path, routing::post};
//! use lock_runtime::{IdempotencyLayer, LockClient, LockLayer};
//!
//! async fn pay(Path(id): Path<u64>) -> String {
//!     format!("order {id} paid")
//! }
//!
//! pub fn app(client: LockClient) -> Router {
//!     Router::new()
//!         .route("/orders/{id}/pay", post(pay).route_layer(
//!             LockLayer::new(client.clone()).key_from(|Path(id): Path<u64>| format!("order:{id}")),
//!         ))
//!         .route("/orders", post(|| async { "created" }).route_layer(IdempotencyLayer::new(client)))
//! }
//! # }
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lock_runtime::LockError> {
//! # #[cfg(feature = "axum")]
//! # let _app = app::app(lock_runtime::LockClient::builder().memory().build().await?);
//! # Ok(())
//! # }
//! ```
//!
//! ## Idempotency records (feature `idempotency`)
//!
//! The same for work that is not an HTTP request: a message delivered twice
//! is processed once, and the duplicate gets the stored result.
//!
//! ```
//! # #[cfg(feature = "idempotency")]
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lock_runtime::LockError> {
//! use lock_runtime::{Claimed, LockClient};
//!
//! let client = LockClient::builder().memory().build().await?;
//! for _delivery in 0..2 {
//!     match client.record("msg-7").fingerprint("charge 1250").claim().await? {
//!         Claimed::Run(guard) => guard.complete("receipt-1").await?, // runs once
//!         Claimed::Done(stored) => assert_eq!(stored, b"receipt-1"),
//!         _ => unreachable!("nothing else claims msg-7 here"),
//!     }
//! }
//! # Ok(())
//! # }
//! # #[cfg(not(feature = "idempotency"))]
//! # fn main() {}
//! ```
//!
//! ## Leader election and fenced writes
//!
//! One leader per name; the term is a fencing token, which [`fence`] checks
//! in the store the leader writes to.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lock_runtime::LockError> {
//! use std::time::Duration;
//! use lock_runtime::LockClient;
//!
//! let client = LockClient::builder().memory().build().await?;
//! let leadership = client.leader("order-sweeper").ttl(Duration::from_secs(10)).campaign().await?;
//! let first_term = leadership.term();
//! leadership.resign().await?;
//! let next = client.leader("order-sweeper").campaign().await?;
//! assert!(next.term() > first_term); // a fencing token: older terms are refused
//! # Ok(())
//! # }
//! ```
//!
//! The fenced write itself goes to the store (`no_run`: needs a Redis), over a
//! connection of the re-exported [`redis`] crate:
//!
//! ```no_run
//! # async fn sweep(term: u64) -> Result<(), Box<dyn std::error::Error>> {
//! use lock_runtime::{fence, redis};
//!
//! let mut conn = redis::Client::open("redis://127.0.0.1:6379")?
//!     .get_multiplexed_async_connection()
//!     .await?;
//! // Resource and keys in one hash slot: `{orders}` is their hash tag.
//! fence::redis(&mut conn, "{orders}:sweeper", term)
//!     .cmd(redis::cmd("HSET").arg("{orders}:42").arg("status").arg("cancelled"))
//!     .run()
//!     .await?; // Err(LockError::Stale { .. }) once a later term wrote
//! # Ok(())
//! # }
//! ```
//!
//! # What surprises people
//!
//! * **Fencing tokens are not consecutive.** The counter is shared by every
//!   key of a hash slot, and a client that hands a hot key on between its own
//!   tasks reserves tokens in blocks of 8: a key's tokens strictly increase,
//!   in steps that may be 8 or more.
//! * **A token is minted when first asked for.** An uncontended lock on
//!   Redis or Valkey is a plain `SET NX PX` and a compare-and-delete (a
//!   read lock or a permit: one script call each way, which mints nothing);
//!   its fencing token comes from [`LockGuard::fencing_token`]`.await` (or
//!   [`LockInfo::fencing_token`]), which checks the lock is still ours. Ask
//!   while you hold it: once the lease has ended you get `Lost`, never a
//!   token.
//! * **Equal tokens pass a fence.** One holder may write many times; a
//!   resource with no record yet accepts any token. A stale holder is
//!   refused once a later holder has written through the same fence.
//! * **`fence::redis` wants one hash slot**: the keys its commands touch must
//!   share the resource's slot (the resource as key, or as their hash tag),
//!   else [`LockError::Config`], before anything is sent.
//! * **`retry_after` is a hint** ([`LockError::Busy`]): this client's recent
//!   hold times, bounded by the holder's remaining lease.
//! * **Idempotency keys**: `"order-1"` (a structured-field string) and
//!   `order-1` (a bare token) are one key; a `POST` without the header gets
//!   `400` (`IdempotencyLayer::required_on` chooses the methods), and other
//!   methods without it pass through unprotected.
//! * **Reentrancy is per task**, not per process: another task of the same
//!   process waits like another process.
//!
//! # Guarantees and their limits
//!
//! A lease-based lock cannot by itself stop a holder that was paused (GC, VM
//! migration, `SIGSTOP`) past its lease from acting on stale beliefs: by the time
//! it resumes, another holder may have the lock. The watchdog tells the holder as
//! soon as it can ([`LockGuard::lost`]), but only the **fencing token** makes such
//! writes harmless: pass it with every write, and have the storage reject tokens
//! lower than the highest it has seen; [`fence`] does that for Redis and
//! PostgreSQL.
//!
//! With a single Redis and asynchronous replication, a failover can lose a
//! just-acquired lock (the replica never saw it), so two holders may coexist
//! until the first lease ends. Fencing tokens still order them as long as the
//! counter survived; `docs/guarantees.md` in the repository has the full
//! list and the scale-out options.
//!
//! # Scale-out
//!
//! The same API runs on Redis Sentinel ([`LockClientBuilder::sentinel`], with
//! [`LockClientBuilder::min_replica_acks`] for `WAIT`), Redis Cluster
//! ([`LockClientBuilder::cluster`]) and Redlock over independent masters
//! ([`LockClientBuilder::redlock`]); `docs/guarantees.md` in the repository
//! says what each guarantees.
//!
//! # Features
//!
//! * `macros` (default): re-exports `#[distributed_lock]`.
//! * `idempotency`: idempotency records (`LockClient::record`, module
//!   `records`): run a piece of work once per key, replay its stored result.
//! * `axum`: tower layers for axum, `LockLayer` and `IdempotencyLayer` (module
//!   `layer`); turns on `idempotency`.
//! * `tls`: `rediss://` URLs, with a private CA and client certificates
//!   (mutual TLS) if need be.
//! * `metrics`: counters and histograms on the [`metrics`](https://docs.rs/metrics)
//!   facade (acquisitions by outcome, wait and hold times, hand-overs, lost
//!   leases, renewals, idempotency outcomes), labelled by
//!   [`LockRequest::metrics_name`], never by key.
//! * `postgres`: `fence::postgres`, fenced writes to PostgreSQL (sqlx, tokio,
//!   rustls), and with `idempotency` or `axum` the commit stores: a record
//!   and its work's rows in one transaction (`RecordGuard::commit_postgres`,
//!   `IdempotencyLayer::commit_with_postgres`); [`fence::redis`] and the
//!   Redis commit stores (`RecordGuard::commit_redis`,
//!   `IdempotencyLayer::commit_with_redis`) need no feature.

#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_debug_implementations, clippy::return_self_not_must_use)]

mod backend;
mod backoff;
mod client;
mod context;
mod durations;
mod error;
pub mod fence;
mod global;
mod held;
mod hint;
mod key;
mod leader;
mod metrics;
mod run;
mod token;
mod watchdog;

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub mod layer;

#[cfg(feature = "idempotency")]
#[cfg_attr(docsrs, doc(cfg(feature = "idempotency")))]
pub mod records;

#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;

pub use backend::labels::MAX_LABEL_LEN;
pub use client::LockGuard;
pub use client::{
    LockAllGuard, LockAllRequest, LockClient, LockClientBuilder, LockRequest, LockState,
    MAX_LOCK_ALL_KEYS, RwLockRequest,
};
pub use context::{LockInfo, current_lock};
pub use error::{BackendError, ConfigReason, LockError};
pub use global::{global_client, set_global_client};
pub use key::escape_key_part;
pub use leader::{Leader, LeaderRequest, Leadership};
// Defined in the internal `lock-keys` crate, which the attribute reads too.
#[doc(inline)]
pub use lock_keys::{
    DEFAULT_TTL, LockKind, MAX_KEY_LEN, MAX_PREFIX_LEN, MAX_RETENTION, MAX_TTL, MAX_WAIT, MIN_TTL,
};

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
#[doc(inline)]
pub use layer::{IdempotencyLayer, LockLayer};

#[cfg(feature = "idempotency")]
#[cfg_attr(docsrs, doc(cfg(feature = "idempotency")))]
#[doc(inline)]
pub use records::{Claimed, RecordGuard, RecordRequest};

#[cfg(feature = "macros")]
#[doc(inline)]
pub use lock_macros::distributed_lock;

/// The README's code blocks, compiled (and run, unless `no_run`) as doctests,
/// so the user's guide cannot drift from the API.
#[cfg(doctest)]
#[cfg(feature = "axum")]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

/// The [`redis`](https://docs.rs/redis) crate this library is built on.
///
/// [`fence::redis`] takes a connection of this crate's types, and its
/// `.cmd(..)` what `redis::cmd(..)` of this crate returns. Use it through this
/// re-export (`lock_runtime::redis::Client::open(..)`) rather than a
/// `redis` dependency of your own: two versions of `redis` in one build are
/// two different crates, and the compiler refuses one's connection where the
/// other's is expected.
pub use redis;

/// The [`sqlx`](https://docs.rs/sqlx) crate (feature `postgres`) that
/// `fence::postgres` takes its connection from: open the pool and the
/// transaction with `lock_runtime::sqlx`, so the types are the library's.
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use sqlx;
