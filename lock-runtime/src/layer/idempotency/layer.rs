use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use http::{HeaderName, Method, header};

use super::BodyFingerprint;
use super::scope::Scope;
use crate::backend::records::CommitStore;
use crate::client::{LockClient, LockOptions};
use crate::durations::{check_retention, refused_at_build};
use crate::layer::TaskTracker;
use crate::layer::completion::Completion;
use crate::layer::routes::RouteNames;
use crate::metrics::RouteSeries;

layer_with_config! {
    /// Makes retried requests with the same `Idempotency-Key` safe: see the
    /// [module docs](super).
    ///
    /// ```
    /// use std::time::Duration;
    /// use axum::{routing::post, Router};
    /// use lock_runtime::{layer::IdempotencyLayer, LockClient};
    ///
    /// async fn create_order() -> &'static str {
    ///     "created"
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_runtime::LockError> {
    /// let client = LockClient::builder().memory().build().await?;
    /// let app: Router = Router::new()
    ///     .route("/orders", post(create_order))
    ///     .route_layer(
    ///         IdempotencyLayer::new(client)
    ///             // Records are per principal: one client never sees another's.
    ///             .scope(|req| {
    ///                 req.headers
    ///                     .get("x-api-key")
    ///                     .and_then(|v| v.to_str().ok())
    ///                     .unwrap_or("anonymous")
    ///                     .to_owned()
    ///             })
    ///             .retention(Duration::from_secs(24 * 3600)),
    ///     );
    /// # let _ = app;
    /// # Ok(())
    /// # }
    /// ```
    pub struct IdempotencyLayer;
}

#[derive(Clone)]
pub(super) struct Config {
    pub(super) client: LockClient,
    pub(super) scope: Scope,
    pub(super) required_on: Vec<Method>,
    /// The in-flight lease and the duplicates' wait, as a lock layer's.
    pub(super) options: LockOptions,
    pub(super) retention: Duration,
    pub(super) max_request_body: usize,
    pub(super) max_response_body: usize,
    pub(super) body_fingerprint: BodyFingerprint,
    pub(super) store_server_errors: bool,
    pub(super) stored_headers: Vec<HeaderName>,
    pub(super) fail_open: bool,
    pub(super) completion: Completion,
    /// The metrics series of each route, made once.
    pub(super) routes: Arc<RouteNames<RouteSeries>>,
    /// Where handlers commit their writes with the record (see [`Commit`](super::Commit)).
    pub(super) commit: Option<CommitStore>,
}

pub use crate::records::DEFAULT_RETENTION;

/// The default limit on request and stored response bodies: 1 MiB.
pub const DEFAULT_MAX_BODY: usize = 1024 * 1024;

impl IdempotencyLayer {
    /// A layer keeping its records on `client`'s backend, under its key prefix.
    ///
    /// Defaults: a key is required on `POST` (optional elsewhere; requests
    /// with safe methods pass through untouched); records belong to the
    /// caller's credentials (`Authorization`, cookies, `X-Api-Key`: see
    /// [`scope`](Self::scope)); handlers [run to
    /// completion](Self::run_to_completion); the
    /// in-flight lease is the client's default TTL; completed records are kept
    /// 24 hours; request and stored response bodies up to 1 MiB
    /// ([`DEFAULT_MAX_BODY`]); the body is fingerprinted byte for byte; `5xx`
    /// responses are stored; a duplicate in flight is refused at once.
    pub fn new(client: LockClient) -> Self {
        Self {
            config: Arc::new(Config {
                client,
                scope: Scope::Credentials,
                required_on: vec![Method::POST],
                options: LockOptions::new(),
                retention: DEFAULT_RETENTION,
                max_request_body: DEFAULT_MAX_BODY,
                max_response_body: DEFAULT_MAX_BODY,
                body_fingerprint: BodyFingerprint::Bytes,
                store_server_errors: true,
                stored_headers: vec![
                    header::CONTENT_TYPE,
                    header::CONTENT_LANGUAGE,
                    header::CONTENT_ENCODING,
                    header::CONTENT_LOCATION,
                    header::LOCATION,
                    header::ETAG,
                    header::LAST_MODIFIED,
                    header::CACHE_CONTROL,
                    header::LINK,
                    header::RETRY_AFTER,
                    header::VARY,
                ],
                fail_open: false,
                completion: Completion::default(),
                routes: Arc::default(),
                commit: None,
            }),
        }
    }

    /// Names whose records a request may see, typically the authenticated
    /// principal (from a header, or an extension an auth layer inserted).
    /// Two requests share a record only if the scope, the method, the matched
    /// route and the key are all equal, so one client cannot replay another's
    /// response by guessing its key, nor have its own request dropped as a
    /// "replay" of another's.
    ///
    /// Without this call the scope is the request's credentials: the
    /// SHA-256 of its `Authorization` header values, of its cookies (every
    /// `Cookie` header, as `name=value` pairs in any order) and of its
    /// `X-Api-Key` values. Requests whose credentials differ in any way never
    /// share a record, and the credentials are never stored (only a hash of
    /// the hash, in the record's name). Requests with none of these headers
    /// share one anonymous scope: an API that authenticates otherwise (a
    /// header of another name, a client certificate, a token in the query)
    /// must name its principal here, or one caller may be handed another's
    /// stored response under a reused key. Every cookie
    /// counts, since the layer cannot tell which one identifies the caller: a
    /// client whose cookies change between a request and its retry (another
    /// response set one meanwhile) makes a new record, and the retry runs.
    /// Where that matters, name the principal here (the session cookie alone,
    /// the user an auth layer found).
    ///
    /// For an API without principals, where every caller may see every
    /// response, see [`records_shared_by_all_callers`](Self::records_shared_by_all_callers).
    pub fn scope<F>(mut self, f: F) -> Self
    where
        F: Fn(&Parts) -> String + Send + Sync + 'static,
    {
        self.config().scope = Scope::Custom(Arc::new(f));
        self
    }

    /// Opts out of scoping: every caller that sends a key shares one record
    /// for it, so a caller that guesses or reuses another's key is handed
    /// that caller's stored response (and its own request does not run).
    /// Only for APIs without principals, where every response may be seen by
    /// every caller; the default scopes records by credentials
    /// ([`scope`](Self::scope)). The long name is on purpose.
    pub fn records_shared_by_all_callers(mut self) -> Self {
        self.config().scope = Scope::SharedByAllCallers;
        self
    }

    /// Whether the handler runs to its end when the client goes away
    /// mid-request (default `true`).
    ///
    /// axum drops a request's future when its connection closes, and with it
    /// the handler, wherever it was. The client that timed out is the very
    /// one that retries, so with `true` the layer runs the claimed part of the
    /// request (the handler, then storing its response or releasing the
    /// record) as a task of its own: the handler finishes, the record's lease
    /// is renewed until it does, a retry meanwhile gets `409` (or
    /// [waits](Self::wait)), and once the response is stored the retry gets it
    /// with `Idempotent-Replayed: true`. The handler never runs twice for
    /// one key. A handler that panics releases the record (`500`).
    ///
    /// With `false`, the handler is dropped with the connection and the record
    /// released, so the retry runs the handler again from the start (axum's
    /// default): only for handlers that are safe to cut off anywhere.
    ///
    /// Requests the layer does not protect run as axum runs them, whatever
    /// this says: those served unprotected with [`fail_open`](Self::fail_open)
    /// while the backend is down, and requests with a safe method or without
    /// a key where none is required.
    pub fn run_to_completion(mut self, run_to_completion: bool) -> Self {
        self.config().completion.enabled = run_to_completion;
        self
    }

    /// Counts the handlers this layer runs to completion (and the storing
    /// of their responses) in `tracker`, so a graceful shutdown can wait for
    /// those whose client went away; see
    /// [`LockLayer::task_tracker`](crate::LockLayer::task_tracker).
    pub fn task_tracker(mut self, tracker: TaskTracker) -> Self {
        self.config().completion.tracker = Some(tracker);
        self
    }

    /// The methods on which a request without `Idempotency-Key` gets `400`
    /// (default: `POST`). On other unsafe methods a key is optional; requests
    /// with safe methods (`GET`, `HEAD`, `OPTIONS`, `TRACE`) always pass
    /// through. Pass an empty list to make the key optional everywhere.
    pub fn required_on<I: IntoIterator<Item = Method>>(mut self, methods: I) -> Self {
        self.config().required_on = methods.into_iter().collect();
        self
    }

    layer_lease_setters! {
        "IdempotencyLayer";
        /// The lease of an in-flight record (default: the client's default
        /// TTL), renewed every `ttl / 3` while
        /// the handler runs, by the client's watchdog together with its locks.
        /// If the process dies, the key is usable again after at most this long. Named like [`LockRequest::ttl`](crate::LockRequest::ttl).
        /// A lease outside [`MIN_TTL`](crate::MIN_TTL)..=[`MAX_TTL`](crate::MAX_TTL)
        /// is refused here, when the router is built: this panics with the
        /// bound (see [Settings out of range](crate::layer#settings-out-of-range)).
        ttl;
        /// How long a duplicate waits for the request in flight to finish, then
        /// gets its stored response (default `Duration::ZERO`: `409 Conflict` at
        /// once, with `Retry-After: 1`). `409` too when the wait ends first.
        ///
        /// The duplicate sleeps on the record's notice, as a lock waiter does:
        /// it gets the stored response about one round trip after the first
        /// request's completion, or runs about as soon after a release (the
        /// first request failed and its response is not stored). A lost notice
        /// costs at most the record's lease, within this wait (see [Waiting
        /// duplicates](super#waiting-duplicates)). A wait above
        /// [`MAX_WAIT`](crate::MAX_WAIT) (`Duration::MAX` included) waits that
        /// long, as a record request's does.
        wait;
    }

    config_setters! {
        /// How long a completed record (the stored response) is kept (default
        /// 24 hours). A retention outside one millisecond..=[`MAX_RETENTION`](crate::MAX_RETENTION)
        /// is refused here, when the router is built: this panics with the
        /// bound, as [`RecordRequest::claim`](crate::RecordRequest::claim)
        /// refuses it with `LockError::Config`.
        #[track_caller]
        pub fn retention(retention: Duration) => retention = refused_at_build(
            "IdempotencyLayer::retention",
            check_retention("a record", retention).map(|()| retention),
        );

        /// The largest request body accepted, in bytes (default 1 MiB); larger
        /// ones get `413 Payload Too Large`. The body is read in full to
        /// fingerprint it.
        pub fn max_request_body(bytes: usize) => max_request_body;

        /// The largest response body stored, in bytes (default 1 MiB,
        /// [`DEFAULT_MAX_BODY`]). A replay is always the stored response byte for
        /// byte; a larger response is still sent in full to its own client, and
        /// once its body has ended, or its client went away before (the
        /// handler ran; the rest of its response is gone either way), the
        /// request counts as completed (the handler
        /// never runs again for its key; a body that fails on the way releases
        /// the key, as one within the limit does), but a retry gets `410 Gone` with `Idempotent-Replayed:
        /// true` and a problem body naming the original status instead of a
        /// replay: see [the module docs](super#responses-too-large-to-replay).
        ///
        /// ```
        /// use lock_runtime::layer::IdempotencyLayer;
        ///
        /// # async fn demo(client: lock_runtime::LockClient) {
        /// // Reports can be large: keep up to 8 MiB of each for replays.
        /// let layer = IdempotencyLayer::new(client).max_response_body(8 << 20);
        /// # let _ = layer;
        /// # }
        /// ```
        pub fn max_response_body(bytes: usize) => max_response_body;

        /// How the request body counts in the fingerprint that tells a retry
        /// from a reuse of its key for another request (default
        /// [`BodyFingerprint::Bytes`]: the same bytes). With
        /// [`BodyFingerprint::Json`], the same JSON value with members in another
        /// order or other whitespace is the same request, and a body that is not
        /// JSON gets `400 Bad Request`.
        ///
        /// ```
        /// use lock_runtime::layer::IdempotencyLayer;
        /// use lock_runtime::layer::idempotency::BodyFingerprint;
        ///
        /// # async fn demo(client: lock_runtime::LockClient) {
        /// let layer = IdempotencyLayer::new(client).body_fingerprint(BodyFingerprint::Json);
        /// # let _ = layer;
        /// # }
        /// ```
        pub fn body_fingerprint(how: BodyFingerprint) => body_fingerprint;

        /// Whether `5xx` responses are stored and replayed (default `true`, as
        /// the handler may have done part of its work). With `false` the record
        /// is released and the key can be retried. With a commit store
        /// (`commit_with_postgres`, `commit_with_redis`) a `5xx` is stored
        /// only when the handler committed (its committed response is) or
        /// marked it with [`StoreResponse`](super::StoreResponse): the store
        /// says whether the work happened, and a handler that failed before
        /// its commit did nothing a retry would repeat.
        pub fn store_server_errors(store: bool) => store_server_errors;
    }

    /// Also store and replay the response header `name` (by default:
    /// `Content-Type`, `Content-Language`, `Content-Encoding`,
    /// `Content-Location`, `Location`, `ETag`, `Last-Modified`,
    /// `Cache-Control`, `Link`, `Retry-After`, `Vary`).
    pub fn store_header(mut self, name: HeaderName) -> Self {
        let headers = &mut self.config().stored_headers;
        if !headers.contains(&name) {
            headers.push(name);
        }
        self
    }

    config_setters! {
        /// When the backend (or the layer's commit store) cannot be reached:
        /// `false` (the default) answers `503 Service Unavailable` with
        /// `Retry-After` (fail closed); `true` runs the handler unprotected
        /// (fail open), without a `Commit`.
        pub fn fail_open(fail_open: bool) => fail_open;
    }
}

impl IdempotencyLayer {
    /// Lets handlers commit their PostgreSQL writes and the completed record
    /// in one transaction ([`Commit::postgres`](super::Commit::postgres)),
    /// records kept in `pool`'s table `lock_idempotency`
    /// ([`POSTGRES_SCHEMA`](super::POSTGRES_SCHEMA)). Before a claimed
    /// request runs, the layer looks there: a committed record is replayed.
    /// Exactly once across crashes for the handlers that commit through it;
    /// see the [`commit` docs](super::commit).
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub fn commit_with_postgres(mut self, pool: sqlx::PgPool) -> Self {
        self.config().commit = Some(CommitStore::Postgres(pool));
        self
    }

    /// Lets handlers send their Redis writes and the completed record as one
    /// atomic step ([`Commit::redis`](super::Commit::redis)) on `conn`'s
    /// server (a single server or a Sentinel's master: the data's, which may
    /// be another than the locks'). Before a claimed request runs, the layer
    /// looks there: a committed record is replayed. Exactly once across
    /// crashes for the handlers that commit through it; see the
    /// [`commit` docs](super::commit).
    pub fn commit_with_redis(mut self, conn: redis::aio::ConnectionManager) -> Self {
        self.config().commit = Some(CommitStore::Redis(conn));
        self
    }

    /// Lets handlers send their Redis writes to the lock backend's own
    /// server, where they and the completed record are one script call
    /// ([`Commit::redis`](super::Commit::redis)): the record is its own
    /// committed copy. No copy is written, no look precedes the handler, no
    /// completion follows: exactly once across crashes for the price of a
    /// record without a store. For services whose data lives on the server
    /// of their locks; see the [`commit` docs](super::commit).
    ///
    /// # Panics
    ///
    /// When the client's backend is not one Redis server (or a Sentinel's
    /// master): the embedded backend, Redlock and a Cluster are refused as
    /// the router is built. Use
    /// [`commit_with_redis`](Self::commit_with_redis) there.
    #[track_caller]
    pub fn commit_on_lock_server(mut self) -> Self {
        let usable = self.config.client.backend().commits_records();
        refused_at_build("IdempotencyLayer::commit_on_lock_server", usable);
        self.config().commit = Some(CommitStore::LockServer);
        self
    }
}

config_debug!(IdempotencyLayer, c => {
    client,
    scope,
    required_on,
    ttl = c.options.ttl,
    retention,
    wait = c.options.wait,
    max_request_body,
    max_response_body,
    body_fingerprint,
    store_server_errors,
    stored_headers,
    fail_open,
    commit,
    run_to_completion = c.completion.enabled,
    task_tracker = c.completion.tracker.is_some(),
});
