//! Tower layers for axum (feature `axum`): per-resource locks for routes and
//! the `Idempotency-Key` header.
//!
//! * [`LockLayer`]: one request at a time per resource. The key comes from the
//!   typed value of an axum extractor (`Path<u64>`: `/orders/015` and
//!   `/orders/15` are one order, one lock), a template over the raw path text
//!   (`"order:<id>"`), a header or a closure;
//!   a busy resource answers `409 Conflict` with `Retry-After`. With
//!   [`permits(n)`](LockLayer::permits) it is a distributed concurrency limit
//!   instead: up to `n` requests per key at once, the next one answered
//!   `429 Too Many Requests` with `Retry-After`. The lock is held
//!   until the response body has been sent (or dropped), and the handler can
//!   read the fencing token through the [`LockInfo`](crate::LockInfo) extractor.
//! * [`IdempotencyLayer`]: a retried `POST` with the same `Idempotency-Key` gets
//!   the stored response (`Idempotent-Replayed: true`) instead of running the
//!   handler again; a duplicate while the first still runs gets `409`, the same
//!   key with another payload `422`.
//!
//! Both run the wrapped handler to its end even when the client goes away
//! mid-request (axum drops the request's future with its connection, and the
//! client that timed out is the very one that retries): the response is
//! stored and the lock released when the handler ends. `run_to_completion(false)`
//! keeps axum's default; a [`TaskTracker`] given to the layers lets a
//! graceful shutdown wait for the handlers still running.
//!
//! Both work with `Router::route_layer` (where path parameters and the matched
//! route are known) and keep the inner service's error type: lock and
//! idempotency outcomes are responses, with an `application/problem+json` body
//! (RFC 9457).
//!
//! # Settings out of range
//!
//! Both layers answer a bad setting the same way: when the router is built,
//! never on each request. A setting no request could be served with (a
//! lease outside [`MIN_TTL`](crate::MIN_TTL)..=[`MAX_TTL`](crate::MAX_TTL),
//! a retention outside one millisecond..=[`MAX_RETENTION`](crate::MAX_RETENTION),
//! `permits(0)`, a malformed key template, an invalid header name) panics in
//! its setter with a message naming the setter and the bound, as axum
//! panics on a bad route. A wait is never refused: one above
//! [`MAX_WAIT`](crate::MAX_WAIT) (`Duration::MAX` included) waits that long,
//! as every request of the client does.
//!
//! ```
//! use axum::{extract::Path, routing::post, Router};
//! use lock_runtime::layer::{IdempotencyLayer, LockLayer};
//! use lock_runtime::{LockClient, LockInfo};
//!
//! async fn pay(lock: LockInfo) -> Result<String, String> {
//!     let token = lock.fencing_token().await.map_err(|e| e.to_string())?;
//!     Ok(format!("paid under fencing token {token}"))
//! }
//! async fn create_order() -> &'static str {
//!     "created"
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lock_runtime::LockError> {
//! let client = LockClient::builder().memory().build().await?;
//! let app: Router = Router::new()
//!     .route(
//!         "/orders/{id}/pay",
//!         post(pay).route_layer(
//!             LockLayer::new(client.clone()).key_from(|Path(id): Path<u64>| format!("order:{id}")),
//!         ),
//!     )
//!     .route(
//!         "/orders",
//!         post(create_order).route_layer(IdempotencyLayer::new(client.clone())),
//!     );
//! # let _ = app;
//! # Ok(())
//! # }
//! ```

/// A layer's service: the `inner` service and the layer's shared `config`,
/// with `get_ref`, `get_mut` and `into_inner` as tower's own services have
/// them, a `Debug` showing `inner` and the named `config` fields, and the
/// layer (`made_by`) that wraps a service in it. `Config` and `Arc` are the
/// caller's.
macro_rules! wrapped_service {
    (
        $(#[$meta:meta])* pub struct $service:ident;
        made_by: $layer:ty;
        debug: [$($field:ident),*]
    ) => {
        impl<S> tower_layer::Layer<S> for $layer {
            type Service = $service<S>;

            fn layer(&self, inner: S) -> Self::Service {
                $service::new(inner, self.config.clone())
            }
        }

        $(#[$meta])*
        #[derive(Clone)]
        pub struct $service<S> {
            inner: S,
            config: Arc<Config>,
        }

        impl<S> $service<S> {
            pub(super) fn new(inner: S, config: Arc<Config>) -> Self {
                Self { inner, config }
            }

            /// The wrapped service.
            pub fn get_ref(&self) -> &S {
                &self.inner
            }

            /// The wrapped service, mutably.
            pub fn get_mut(&mut self) -> &mut S {
                &mut self.inner
            }

            /// Unwraps the inner service.
            pub fn into_inner(self) -> S {
                self.inner
            }
        }

        impl<S: fmt::Debug> fmt::Debug for $service<S> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($service))
                    .field("inner", &self.inner)
                    $(.field(stringify!($field), &self.config.$field))*
                    .finish_non_exhaustive()
            }
        }
    };
}

/// A layer: its `Config` behind an `Arc`, so that the layer clones cheaply
/// into every service it makes, and `config()`, through which the builder
/// methods change it (copied on write: a clone taken before keeps its own).
/// `Config` and `Arc` are the caller's.
macro_rules! layer_with_config {
    ($(#[$meta:meta])* pub struct $layer:ident;) => {
        $(#[$meta])*
        #[derive(Clone)]
        #[must_use]
        pub struct $layer {
            pub(super) config: Arc<Config>,
        }

        impl $layer {
            fn config(&mut self) -> &mut Config {
                Arc::make_mut(&mut self.config)
            }
        }
    };
}

/// Builder methods of a layer that each set one field of its `Config`
/// (copied on write by the layer's `config()`): `pub fn name(arg: Type) =>
/// field;`, or `=> field = value;` where the field holds a value made from
/// `arg`.
macro_rules! config_setters {
    (@value $arg:ident) => { $arg };
    (@value $arg:ident $value:expr) => { $value };
    ($($(#[$meta:meta])* pub fn $name:ident($arg:ident: $ty:ty) => $field:ident $(= $value:expr)?;)*) => {
        $(
            $(#[$meta])*
            pub fn $name(mut self, $arg: $ty) -> Self {
                self.config().$field = config_setters!(@value $arg $($value)?);
                self
            }
        )*
    };
}

/// A layer's lease and wait, each with its own docs, set on its
/// `Config::options` (a `LockOptions`, as a request's setters set theirs):
/// a lease out of bounds is refused when the router is built, naming
/// `$layer::ttl`; a wait is taken as a request takes it.
macro_rules! layer_lease_setters {
    ($layer:literal; $(#[$ttl:meta])* ttl; $(#[$wait:meta])* wait;) => {
        $(#[$ttl])*
        #[track_caller]
        pub fn ttl(mut self, ttl: Duration) -> Self {
            let valid = $crate::client::validate_ttl(ttl);
            $crate::durations::refused_at_build(concat!($layer, "::ttl"), valid);
            let options = &mut self.config().options;
            *options = std::mem::take(options).ttl(ttl);
            self
        }

        $(#[$wait])*
        pub fn wait(mut self, wait: Duration) -> Self {
            let options = &mut self.config().options;
            *options = std::mem::take(options).wait(wait);
            self
        }
    };
}

/// A layer's `Debug`: its name, then each field of its `Config` (bound to
/// `$c`) by name, or `name = expression` for what is shown another way.
macro_rules! config_debug {
    (@value $c:ident $name:ident) => { &$c.$name };
    (@value $c:ident $name:ident $value:expr) => { &$value };
    ($layer:ident, $c:ident => { $($name:ident $(= $value:expr)?),* $(,)? }) => {
        impl fmt::Debug for $layer {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let $c = &self.config;
                f.debug_struct(stringify!($layer))
                    $(.field(stringify!($name), config_debug!(@value $c $name $($value)?)))*
                    .finish()
            }
        }
    };
}

/// A route's handler, with the lock or record around it, boxed: what the
/// layers' response futures poll.
type BoxedResponse<E> = std::pin::Pin<
    Box<dyn Future<Output = Result<http::Response<axum::body::Body>, E>> + Send + 'static>,
>;

mod bounds;
mod completion;
mod detach;
pub mod idempotency;
pub mod lock;
mod problem;
mod routes;

/// Counts the handlers the layers run to completion, so a graceful shutdown
/// can wait for them: give one to [`LockLayer::task_tracker`] and
/// [`IdempotencyLayer::task_tracker`], then `close()` and `wait()` it after
/// the server stopped accepting requests (tokio-util's type, re-exported so
/// its version matches this crate's).
pub use tokio_util::task::TaskTracker;

#[doc(inline)]
pub use idempotency::IdempotencyLayer;
#[doc(inline)]
pub use lock::LockLayer;
