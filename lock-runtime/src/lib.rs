//! Distributed locks for async Rust services, on Redis.
//!
//! Services that run as several processes must not pay an order twice, create
//! the same order from a retried request, or run one job on three pods at once.
//! `lock_runtime` gives them a lock that is correct under retries, crashes,
//! pauses and Redis failover:
//!
//! * **Atomic scripts**: acquire, extend and release are each one Lua script;
//!   ownership is a fresh 128-bit random token per acquisition.
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
//!     .memory() // .redis("redis://127.0.0.1:6379") in production
//!     .key_prefix("lock:")
//!     .build()
//!     .await?;
//!
//! // Run a critical section; the lock is released however it ends.
//! let paid = client
//!     .lock("order:42")
//!     .ttl(Duration::from_secs(10))
//!     .wait(Duration::from_secs(2))
//!     .run(async {
//!         let fence = lock_runtime::current_lock().unwrap().fencing_token;
//!         // write to storage with `fence`, which rejects older tokens
//!         fence
//!     })
//!     .await?;
//! assert_eq!(paid, 1);
//!
//! // Or hold a guard yourself.
//! let guard = client.lock("order:42").acquire().await?;
//! assert_eq!(guard.fencing_token(), 2);
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
//! counter survived; see the README for the scale-out options.
//!
//! # Scale-out
//!
//! The same API runs on Redis Sentinel ([`LockClientBuilder::sentinel`], with
//! [`LockClientBuilder::min_replica_acks`] for `WAIT`), Redis Cluster
//! ([`LockClientBuilder::cluster`]) and Redlock over independent masters
//! ([`LockClientBuilder::redlock`]); the README says what each guarantees.
//!
//! # Features
//!
//! * `macros` (default): re-exports `#[distributed_lock]`.
//! * `idempotency`: idempotency records (`LockClient::record`, module
//!   `records`): run a piece of work once per key, replay its stored result.
//! * `axum`: tower layers for axum, `LockLayer` and `IdempotencyLayer` (module
//!   `layer`); turns on `idempotency`.
//! * `tls`: `rediss://` URLs.
//! * `metrics`: counters and histograms on the [`metrics`](https://docs.rs/metrics)
//!   facade (acquisitions by outcome, wait and hold times, hand-overs, lost
//!   leases, renewals, idempotency outcomes), labelled by
//!   [`LockRequest::metrics_name`], never by key.
//! * `postgres`: `fence::postgres`, fenced writes to PostgreSQL (sqlx, tokio,
//!   rustls); [`fence::redis`] needs no feature.

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
mod guard;
mod held;
mod inner;
mod key;
mod leader;
mod metrics;
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
pub use client::{
    LockAllGuard, LockAllRequest, LockClient, LockClientBuilder, LockKind, LockRequest, LockState,
    MAX_LOCK_ALL_KEYS, RwLockRequest,
};
pub use context::{LockInfo, current_lock};
pub use error::{BackendError, ConfigReason, LockError};
pub use global::{global_client, set_global_client};
pub use guard::LockGuard;
pub use key::escape_key_part;
pub use leader::{Leader, LeaderRequest, Leadership};
// Defined in the internal `lock-keys` crate, which the attribute reads too.
#[doc(inline)]
pub use lock_keys::{
    DEFAULT_TTL, MAX_KEY_LEN, MAX_PREFIX_LEN, MAX_RETENTION, MAX_TTL, MAX_WAIT, MIN_TTL,
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
