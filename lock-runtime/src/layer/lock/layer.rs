use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::FromRequestParts;
use http::request::Parts;
use http::{HeaderName, StatusCode};

use super::key::{KeySource, parse_template};
use crate::client::LockOptions;
use crate::durations::refused_at_build;
use crate::layer::TaskTracker;
use crate::layer::completion::Completion;
use crate::layer::routes::RouteNames;
use crate::{client::LockClient, error::LockError};

layer_with_config! {
    /// Applies a per-resource lock to the routes it wraps: see the [module
    /// docs](super).
    ///
    /// ```
    /// use std::time::Duration;
    /// use axum::extract::Path;
    /// use axum::{routing::post, Router};
    /// use lock_runtime::{layer::LockLayer, LockClient, LockInfo};
    ///
    /// async fn pay(Path(id): Path<u64>, lock: LockInfo) -> Result<String, String> {
    ///     let token = lock.fencing_token().await.map_err(|e| e.to_string())?;
    ///     Ok(format!("order {id} paid under fencing token {token}"))
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_runtime::LockError> {
    /// let client = LockClient::builder().memory().build().await?;
    /// let app: Router = Router::new()
    ///     .route("/orders/{id}/pay", post(pay))
    ///     .route_layer(
    ///         LockLayer::new(client)
    ///             // The id the handler sees: `/orders/015/pay` is `order:15` too.
    ///             .key_from(|Path(id): Path<u64>| format!("order:{id}"))
    ///             .ttl(Duration::from_secs(10))   // renewed while the request runs
    ///             .wait(Duration::from_millis(200)),
    ///     );
    /// # let _ = app;
    /// # Ok(())
    /// # }
    /// ```
    pub struct LockLayer;
}

#[derive(Clone)]
pub(super) struct Config {
    pub(super) client: LockClient,
    pub(super) key: KeySource,
    /// The lease and the wait (each request adds its route as the metrics
    /// name).
    pub(super) options: LockOptions,
    /// `None`: a mutex per key; `Some(n)`: one of `n` permits of the
    /// semaphore per key (never `Some(0)`: refused when set).
    pub(super) permits: Option<u32>,
    /// `None`: the default for the kind of lock (409, or 429 with permits).
    pub(super) busy_status: Option<StatusCode>,
    pub(super) fail_open: bool,
    pub(super) completion: Completion,
    /// The metrics name of each route, made once.
    pub(super) routes: Arc<RouteNames<crate::metrics::Name>>,
}

impl Config {
    /// The status of a request refused because its key is busy: the one set
    /// with [`LockLayer::busy_status`], else `429 Too Many Requests` for a
    /// [`permits`](LockLayer::permits) limit and `409 Conflict` for a mutex.
    pub(super) fn busy_status(&self) -> StatusCode {
        match (self.busy_status, self.permits) {
            (Some(status), _) => status,
            (None, Some(_)) => StatusCode::TOO_MANY_REQUESTS,
            (None, None) => StatusCode::CONFLICT,
        }
    }
}

impl LockLayer {
    /// A layer taking its locks from `client`. The key defaults to the request
    /// path, percent-decoded as the router reads it (`/orders/%31%35/pay` is
    /// `/orders/15/pay`; but `/orders/015/pay` is another text: see
    /// [`key`](Self::key) for when the text is not enough);
    /// set it with [`key_from`](Self::key_from) (an extractor's typed value),
    /// [`key`](Self::key) (a template), [`key_from_header`](Self::key_from_header)
    /// or [`key_fn`](Self::key_fn).
    pub fn new(client: LockClient) -> Self {
        Self {
            config: Arc::new(Config {
                client,
                key: KeySource::Path,
                options: LockOptions::new(),
                permits: None,
                busy_status: None,
                fail_open: false,
                completion: Completion::default(),
                routes: Arc::default(),
            }),
        }
    }

    /// The key as a template over path parameters: `"order:<id>"` locks
    /// `order:42` for `/orders/42/pay` on the route `/orders/{id}/pay`.
    /// `<<` and `>>` write a literal `<` and `>`; braces are literal (Redis
    /// Cluster hash tags). Values are escaped as by
    /// [`escape_key_part`](crate::escape_key_part).
    ///
    /// The grammar is `#[distributed_lock]`'s (one parser serves both), except
    /// that a placeholder names a path parameter: an identifier such as
    /// `<id>`; field paths (`<order.id>`) are refused.
    ///
    /// A route without a parameter the template names (the layer added to
    /// the wrong route) answers `500`, and logs the route and the name at
    /// `error` level: the route's mistake, not the client's. A malformed
    /// template is refused here, when the router is built: this panics with
    /// a message naming the mistake (see [Settings out of
    /// range](crate::layer#settings-out-of-range)).
    ///
    /// # When a template is not enough
    ///
    /// A template renders the parameter's *text*. When the handler parses it
    /// (`Path<u64>`, a UUID, a case-insensitive name), several texts are one
    /// resource: `/orders/15/pay`, `/orders/015/pay` and `/orders/+15/pay`
    /// all pay order 15, but take the locks `order:15`, `order:015` and
    /// `order:+15`, so they run at once. Build the key from the parsed value
    /// with [`key_from`](Self::key_from) instead. A template is enough when
    /// the text is the identity: a parameter the handler uses as a string,
    /// unchanged.
    #[track_caller]
    pub fn key(mut self, template: &str) -> Self {
        let segments = refused_at_build(
            "LockLayer::key",
            parse_template(template).map_err(LockError::Config),
        );
        self.config().key = KeySource::Template(segments);
        self
    }

    /// The key is computed from an axum extractor: the same typed value the
    /// handler sees, so every spelling of one resource takes one lock.
    ///
    /// `E` is any extractor that needs no state: [`Path<T>`](axum::extract::Path),
    /// `Query<T>` (with axum's `query` feature), your own
    /// [`FromRequestParts`](axum::extract::FromRequestParts) types (a header
    /// parsed into a type, say), or a tuple of them. It runs before the lock is
    /// taken and again when the handler extracts it. A request it rejects gets
    /// the extractor's own rejection (for `Path<u64>` and `/orders/abc/pay`:
    /// `400` "Cannot parse `abc` to a `u64`"), and the handler does not run.
    ///
    /// Path parameters are there only for layers added with
    /// [`route_layer`](axum::Router::route_layer) (or on a
    /// [`MethodRouter`](axum::routing::MethodRouter)); under
    /// [`Router::layer`](axum::Router::layer), `Path` rejects with `500`.
    ///
    /// ```
    /// use axum::extract::Path;
    /// use axum::{routing::post, Router};
    /// use lock_runtime::{layer::LockLayer, LockClient, LockInfo};
    ///
    /// async fn pay(Path(id): Path<u64>, lock: LockInfo) -> String {
    ///     format!("order {id} paid under {}", lock.key)
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_runtime::LockError> {
    /// let client = LockClient::builder().memory().build().await?;
    /// let app: Router = Router::new().route(
    ///     "/orders/{id}/pay",
    ///     // `/orders/15/pay`, `/orders/015/pay` and `/orders/+15/pay`: all `order:15`.
    ///     post(pay).route_layer(
    ///         LockLayer::new(client).key_from(|Path(id): Path<u64>| format!("order:{id}")),
    ///     ),
    /// );
    /// # let _ = app;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Escaping
    ///
    /// The closure writes the whole key, separators included, so the layer
    /// cannot escape the values in it. Numbers, UUIDs and other parsed values
    /// whose text has no `%`, `:`, `{` or `}` need no escaping. Text taken
    /// from the request does: pass it through
    /// [`escape_key_part`](crate::escape_key_part), as templates do, so that
    /// one caller's value cannot spell another resource's key or close a hash
    /// tag.
    ///
    /// ```
    /// use axum::extract::Path;
    /// use lock_runtime::{escape_key_part, layer::LockLayer, LockClient};
    ///
    /// # fn f(client: LockClient) -> LockLayer {
    /// // Route `/tenants/{tenant}/orders/{id}/pay`.
    /// LockLayer::new(client).key_from(|Path((tenant, id)): Path<(String, u64)>| {
    ///     format!("{{tenant:{}}}:order:{id}", escape_key_part(&tenant))
    /// })
    /// # }
    /// ```
    pub fn key_from<E, F>(mut self, f: F) -> Self
    where
        E: FromRequestParts<()> + Send + 'static,
        F: Fn(E) -> String + Send + Sync + 'static,
    {
        self.config().key = KeySource::extract(f);
        self
    }

    /// The key is named by the value of the header `name` (trimmed), within
    /// this route: the lock is `header:<route>:<name>:<value>`, the matched
    /// route (`*` under [`Router::layer`](axum::Router::layer)), the header's
    /// name and its value each escaped as a template escapes a path value
    /// ([`escape_key_part`](crate::escape_key_part)). So a client sending
    /// `X-Key: item:42` locks a key of this route only, never the lock
    /// `item:42` that the template `item:<id>` takes for `/items/42`, nor
    /// one of another route keyed by the same header. Two requests to this
    /// route with the same value exclude each other.
    ///
    /// A request without the header, with it twice, or with a value that is
    /// not visible ASCII gets `400`. An invalid header name is refused here,
    /// when the router is built (a panic naming it). For a header set by a
    /// party you trust whose value is the whole key, see
    /// [`key_from_trusted_header`](Self::key_from_trusted_header).
    #[track_caller]
    pub fn key_from_header<N>(mut self, name: N) -> Self
    where
        N: TryInto<HeaderName>,
        N::Error: fmt::Display,
    {
        let name = header_name("LockLayer::key_from_header", name);
        self.config().key = KeySource::Header { name, scoped: true };
        self
    }

    /// The key is the whole value of the header `name` (trimmed), as it is:
    /// whoever sets the header names any lock of this client, another
    /// route's and those taken with [`LockClient::lock`] included. Only for
    /// a header that a party you trust sets and clients cannot (a gateway
    /// that overwrites it); otherwise use
    /// [`key_from_header`](Self::key_from_header), which keeps the key
    /// within the route. The long name is on purpose. Requests without a
    /// usable value get `400`, as there.
    #[track_caller]
    pub fn key_from_trusted_header<N>(mut self, name: N) -> Self
    where
        N: TryInto<HeaderName>,
        N::Error: fmt::Display,
    {
        let name = header_name("LockLayer::key_from_trusted_header", name);
        self.config().key = KeySource::Header {
            name,
            scoped: false,
        };
        self
    }

    /// The key is computed from the request head; `None` answers `400`.
    /// [`key_from`](Self::key_from) is the typed alternative.
    ///
    /// ```
    /// # use lock_runtime::{layer::LockLayer, LockClient};
    /// # fn f(client: LockClient) -> LockLayer {
    /// LockLayer::new(client).key_fn(|req| {
    ///     let tenant = req.headers.get("x-tenant")?.to_str().ok()?;
    ///     Some(format!("tenant:{tenant}:{}", req.uri.path()))
    /// })
    /// # }
    /// ```
    pub fn key_fn<F>(mut self, f: F) -> Self
    where
        F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    {
        self.config().key = KeySource::Fn(Arc::new(f));
        self
    }

    layer_lease_setters! {
        "LockLayer";
        /// The lease (default: the client's). Renewed every `ttl / 3` while the
        /// request runs and its body is sent. A lease outside
        /// [`MIN_TTL`](crate::MIN_TTL)..=[`MAX_TTL`](crate::MAX_TTL) is refused
        /// here, when the router is built: this panics with the bound (see
        /// [Settings out of range](crate::layer#settings-out-of-range)).
        ttl;
        /// How long a request waits for a busy lock before it is refused (default
        /// `Duration::ZERO`: refused at once). A wait above
        /// [`MAX_WAIT`](crate::MAX_WAIT) (`Duration::MAX` included) waits that
        /// long.
        wait;
    }

    config_setters! {
        /// The status of a request refused because its key is busy (default
        /// `409 Conflict`; `423 Locked` is the other common choice; with
        /// [`permits`](Self::permits), `429 Too Many Requests`). A status set
        /// here wins over both defaults, whichever of the two methods is
        /// called first.
        pub fn busy_status(status: StatusCode) => busy_status = Some(status);

        /// At most `n` requests per key at once, instead of one: each request
        /// takes one of `n` permits of the semaphore named by the key
        /// ([`LockClient::semaphore`]), from the same key sources as the mutex
        /// (so a route keyed by tenant runs up to `n` requests per tenant,
        /// across every process that shares the backend).
        ///
        /// A request that finds every permit taken, after the configured
        /// [`wait`](Self::wait), gets `429 Too Many Requests` (unless
        /// [`busy_status`](Self::busy_status) says otherwise) with
        /// `Retry-After` = the `retry_after` hint of
        /// [`LockError::Busy`](crate::LockError::Busy) (recent hold times, at most the remaining
        /// lease of the permit that ends first), rounded up to whole seconds, and an
        /// `application/problem+json` body. Everything else is as with the
        /// mutex: each permit has its own lease, renewed while the request runs
        /// and its body is sent; the handler's [`LockInfo`](crate::LockInfo)
        /// carries the key and the permit's fencing token; a backend that
        /// cannot be reached answers `503` (or runs the handler without a
        /// permit, with [`fail_open`](Self::fail_open)).
        ///
        /// The semaphore `key` is a resource of its own: it does not exclude
        /// the mutex `key` of another `LockLayer` or of
        /// [`LockClient::lock`]. All the layers and callers that share one
        /// key should name the same `n` (see [`LockClient::semaphore`] for
        /// what happens when they do not).
        ///
        /// `permits(0)` would admit no request: it is refused here, when the
        /// router is built (a panic), like a malformed [`key`](Self::key)
        /// template.
        ///
        /// ```
        /// use axum::{body::Body, extract::Path, http::Request, routing::post, Router};
        /// use lock_runtime::{layer::LockLayer, LockClient, LockInfo};
        /// # use tower_service::Service as _;
        ///
        /// async fn export(Path(tenant): Path<String>, permit: LockInfo) -> String {
        ///     format!("exporting for {tenant} under {}", permit.key)
        /// }
        ///
        /// # #[tokio::main(flavor = "current_thread")]
        /// # async fn main() -> Result<(), lock_runtime::LockError> {
        /// let client = LockClient::builder().memory().build().await?;
        /// let mut app: Router = Router::new().route(
        ///     "/tenants/{tenant}/export",
        ///     // Two exports per tenant at once; a third gets `429` with `Retry-After`.
        ///     post(export).route_layer(LockLayer::new(client).key("export:<tenant>").permits(2)),
        /// );
        ///
        /// let request = Request::post("/tenants/acme/export").body(Body::empty()).unwrap();
        /// let response = app.call(request).await.unwrap();
        /// assert_eq!(response.status(), 200);
        /// # Ok(())
        /// # }
        /// ```
        #[track_caller]
        pub fn permits(n: u32) => permits = Some(refused_at_build("LockLayer::permits", at_least_one(n)));

        /// When the backend cannot be reached: `false` (the default) answers `503
        /// Service Unavailable` with `Retry-After` (fail closed); `true` runs the
        /// handler without the lock (fail open), for routes where availability
        /// matters more than exclusion. The handler then finds no [`LockInfo`](crate::LockInfo).
        pub fn fail_open(fail_open: bool) => fail_open;
    }
}

impl LockLayer {
    /// Whether the handler runs to its end when the client goes away
    /// mid-request (default `true`).
    ///
    /// axum drops a request's future when its connection closes, and with it
    /// the handler, wherever it was. With `true`, the layer runs the locked
    /// part of the request (the handler, then the release) as a task of its
    /// own: the handler finishes, the lock is held (and renewed) until it
    /// does, and a second request for the key gets the lock only after
    /// that. A response body still being produced when the client stays
    /// holds the lock until it has been sent, as always; when the client is
    /// gone, the response is dropped once the handler returns it, which
    /// releases the lock. A handler that panics answers `500` and releases.
    ///
    /// With `false`, the handler is dropped with the connection and the lock
    /// released at once (axum's default): for handlers that are safe to cut
    /// off anywhere.
    ///
    /// Requests the layer does not lock run as axum runs them, whatever
    /// this says: those served unlocked with [`fail_open`](Self::fail_open)
    /// while the backend is down.
    pub fn run_to_completion(mut self, run_to_completion: bool) -> Self {
        self.config().completion.enabled = run_to_completion;
        self
    }

    /// Counts the handlers this layer runs to completion in `tracker`, so a
    /// graceful shutdown can wait for those whose client went away (the
    /// server no longer sees them). See [`TaskTracker`](crate::layer::TaskTracker).
    ///
    /// ```
    /// use std::time::Duration;
    /// use axum::{routing::post, Router};
    /// use lock_runtime::layer::{LockLayer, TaskTracker};
    /// # use lock_runtime::LockClient;
    ///
    /// # async fn demo(client: LockClient, server_stopped: impl std::future::Future<Output = ()>) {
    /// let handlers = TaskTracker::new();
    /// let app: Router = Router::new()
    ///     .route("/orders/{id}/pay", post(|| async { "paid" }))
    ///     .route_layer(LockLayer::new(client).key("order:<id>").task_tracker(handlers.clone()));
    /// // Serve `app` with `axum::serve(..).with_graceful_shutdown(..)`; once it returned:
    /// server_stopped.await;
    /// handlers.close();
    /// // Let the handlers still running finish, for at most 30 s.
    /// let _ = tokio::time::timeout(Duration::from_secs(30), handlers.wait()).await;
    /// # }
    /// ```
    pub fn task_tracker(mut self, tracker: TaskTracker) -> Self {
        self.config().completion.tracker = Some(tracker);
        self
    }
}

/// `name` as a header name, or a panic naming `setter` (see
/// [`refused_at_build`]).
#[track_caller]
fn header_name<N>(setter: &str, name: N) -> HeaderName
where
    N: TryInto<HeaderName>,
    N::Error: fmt::Display,
{
    let name = name
        .try_into()
        .map_err(|e| LockError::Config(format!("invalid header name for the lock key: {e}")));
    refused_at_build(setter, name)
}

/// A number of permits: zero would admit no request.
fn at_least_one(n: u32) -> Result<u32, LockError> {
    if n == 0 {
        return Err(LockError::Config(
            "zero permits would admit no request; use at least 1".into(),
        ));
    }
    Ok(n)
}

config_debug!(LockLayer, c => {
    client,
    key,
    ttl = c.options.ttl,
    wait = c.options.wait,
    permits,
    busy_status = c.busy_status(),
    fail_open,
    run_to_completion = c.completion.enabled,
    task_tracker = c.completion.tracker.is_some(),
});
