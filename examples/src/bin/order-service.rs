//! An order service: idempotent creation, payments locked per order, and
//! as many instances as you like behind one Redis.
//!
//! * `POST /orders` (`IdempotencyLayer`): a retried creation with the same
//!   `Idempotency-Key` gets the stored response, not a second order, from
//!   whichever instance it reaches. With Redis or PostgreSQL the order and
//!   its idempotency record commit together (`layer::idempotency::Commit`,
//!   `order_service/create.rs`): exactly once even when the process is
//!   killed between creating the order and answering.
//! * `POST /orders/{id}/pay` (`LockLayer`, key `order:{id}` built from the
//!   parsed `Path<u64>`, so `/orders/015/pay` and `/orders/+15/pay` are the
//!   same lock as `/orders/15/pay`): one payment per order at a time; a
//!   concurrent one gets `409 Conflict` with `Retry-After`. The charge itself
//!   is a `#[distributed_lock]` function on the same key, which re-enters the
//!   request's lock (and locks on its own when called from elsewhere, e.g. a
//!   job). The store refuses a payment whose fencing token is older than one
//!   it already accepted (`lock_runtime::fence` on Redis and PostgreSQL).
//! * `GET /orders/{id}`.
//! * A sweeper (`order_service/sweeper.rs`) cancels orders left unpaid
//!   longer than `CANCEL_UNPAID_AFTER_MS`, on one instance at a time: the
//!   leader of the election `order-sweeper` (`client.leader(..)`); each sweep
//!   logs its term, and cancels go through the fence with it. `GET /sweeper`
//!   says who leads (`{"label":..,"term":..}`, or `null`), followed by notice.
//!
//! Settings (environment):
//!
//! * `REDIS_URL`: locks, idempotency records and orders on this Redis, shared
//!   by every instance that uses it. Unset: the embedded lock backend and an
//!   in-memory order store, for this process only.
//! * `DATABASE_URL` (`postgres://...`): orders in this PostgreSQL database
//!   instead (tables created at start); payments go through
//!   `lock_runtime::fence::postgres` in the transaction that marks the order
//!   paid. Locks and idempotency records stay where `REDIS_URL` says. Needs
//!   the feature `postgres` (`cargo run -p examples --features postgres
//!   --bin order-service`); without it a set `DATABASE_URL` stops the start.
//! * `NAMESPACE` (default `orders`): every Redis name starts with
//!   `<namespace>:`; instances with the same one share orders, a new one starts
//!   afresh (the demo below picks a new one per session, so it can be run
//!   again against the same Redis with the same answers). `lockctl` reads
//!   them with `--key-prefix <namespace>:` (`lockctl --redis $REDIS_URL
//!   --key-prefix orders: leaders` names the sweeper's leader).
//! * `PORT` (default 3000), on 127.0.0.1. `PAYMENT_DELAY_MS` (default 1000):
//!   how long the fake payment provider takes.
//! * `IDEMPOTENCY_COMMIT` (`on` by default, or `off`): `off` creates the
//!   order, then lets the layer complete its record, two commits a crash can
//!   fall between (kept to measure what the commit prevents).
//! * `IDEMPOTENCY_LEASE_MS` (default 30000): how long a creation's key stays
//!   in flight after the instance running it died.
//! * `CANCEL_UNPAID_AFTER_MS` (default 900000, 15 minutes) and
//!   `SWEEP_EVERY_MS` (default 5000): the sweeper's.
//!
//! SIGTERM or ctrl-c stops it gracefully: no new requests, then it waits (up
//! to 30 s) for the handlers still running, a payment whose client went away
//! included (the layers run handlers to completion), so a rolling deploy does
//! not cut a payment half-way; then the sweeper ends its sweep and resigns,
//! so the next instance sweeps at once, and `client.shutdown()` gives back
//! whatever else the client holds.
//!
//! A startup failure (bad URL, unreachable server, refused password) prints
//! one line with the error and its causes and exits with status 1:
//!
//! ```text
//! $ REDIS_URL=redis://:wrong@127.0.0.1:6379 cargo run -p examples --bin order-service
//! order-service: cannot start: cannot use Redis at redis://:***@127.0.0.1:6379 (REDIS_URL) for locks: cannot connect to Redis at 127.0.0.1:6379: Password authentication failed - AuthenticationFailed
//! $ echo $?
//! 1
//! ```
//!
//! One instance, embedded backend:
//!
//! ```text
//! $ cargo run -p examples --bin order-service
//!
//! $ curl -si localhost:3000/orders -H 'Idempotency-Key: "order-1"' -H 'content-type: application/json' -d '{"item":"book","amount_cents":1250}' -w '\n'
//! HTTP/1.1 201 Created
//! content-type: application/json
//! location: /orders/1
//! content-length: 92
//!
//! {"id":1,"item":"book","amount_cents":1250,"status":"created","paid_with_fencing_token":null}
//!
//! # The client retries (say its first response was lost): replayed, no second order.
//! $ curl -si localhost:3000/orders -H 'Idempotency-Key: "order-1"' -H 'content-type: application/json' -d '{"item":"book","amount_cents":1250}' -w '\n'
//! HTTP/1.1 201 Created
//! content-type: application/json
//! location: /orders/1
//! idempotent-replayed: true
//! content-length: 92
//!
//! {"id":1,"item":"book","amount_cents":1250,"status":"created","paid_with_fencing_token":null}
//!
//! # Two payments of one order at once, spelled two ways: one runs, the other is refused.
//! $ curl -s -X POST localhost:3000/orders/1/pay -w '\n' & sleep 0.2; curl -si -X POST localhost:3000/orders/01/pay -w '\n'; wait
//! HTTP/1.1 409 Conflict
//! content-type: application/problem+json
//! retry-after: 10
//! content-length: 120
//!
//! {"type":"about:blank","title":"Conflict","status":409,"detail":"another request holds this request's lock; retry later"}
//! {"id":1,"item":"book","amount_cents":1250,"status":"paid","paid_with_fencing_token":2}
//!
//! $ curl -s localhost:3000/orders/1 -w '\n'
//! {"id":1,"item":"book","amount_cents":1250,"status":"paid","paid_with_fencing_token":2}
//!
//! # Not an order id: the extractor's own rejection, before any lock is taken.
//! $ curl -si -X POST localhost:3000/orders/one/pay -w '\n'
//! HTTP/1.1 400 Bad Request
//! content-type: text/plain; charset=utf-8
//! content-length: 42
//!
//! Invalid URL: Cannot parse `one` to a `u64`
//!
//! # The same key for another order: refused.
//! $ curl -si localhost:3000/orders -H 'Idempotency-Key: "order-1"' -H 'content-type: application/json' -d '{"item":"pen","amount_cents":990}' -w '\n'
//! HTTP/1.1 422 Unprocessable Entity
//! content-type: application/problem+json
//! content-length: 202
//!
//! {"type":"about:blank","title":"Unprocessable Entity","status":422,"detail":"this Idempotency-Key was already used for a different request (method, path, query or body); use a new key for a new request"}
//! ```
//!
//! Two instances behind one Redis:
//!
//! ```text
//! $ export REDIS_URL=redis://127.0.0.1:6379 NAMESPACE=demo-$(date +%s)
//! $ PORT=3001 cargo run -p examples --bin order-service &   # instance A
//! $ PORT=3002 cargo run -p examples --bin order-service &   # instance B
//!
//! $ curl -si localhost:3001/orders -H 'Idempotency-Key: "order-1"' -H 'content-type: application/json' -d '{"item":"book","amount_cents":1250}' -w '\n'
//! HTTP/1.1 201 Created
//! content-type: application/json
//! location: /orders/1
//! content-length: 92
//!
//! {"id":1,"item":"book","amount_cents":1250,"status":"created","paid_with_fencing_token":null}
//!
//! # The retry reaches instance B: A's stored response.
//! $ curl -si localhost:3002/orders -H 'Idempotency-Key: "order-1"' -H 'content-type: application/json' -d '{"item":"book","amount_cents":1250}' -w '\n'
//! HTTP/1.1 201 Created
//! content-type: application/json
//! location: /orders/1
//! idempotent-replayed: true
//! content-length: 92
//!
//! {"id":1,"item":"book","amount_cents":1250,"status":"created","paid_with_fencing_token":null}
//!
//! $ curl -s localhost:3002/orders/1 -w '\n'
//! {"id":1,"item":"book","amount_cents":1250,"status":"created","paid_with_fencing_token":null}
//!
//! # A pays the order while B pays it too (spelled +1): B is refused.
//! $ curl -s -X POST localhost:3001/orders/1/pay -w '\n' & sleep 0.2; curl -si -X POST localhost:3002/orders/+1/pay -w '\n'; wait
//! HTTP/1.1 409 Conflict
//! content-type: application/problem+json
//! retry-after: 10
//! content-length: 120
//!
//! {"type":"about:blank","title":"Conflict","status":409,"detail":"another request holds this request's lock; retry later"}
//! {"id":1,"item":"book","amount_cents":1250,"status":"paid","paid_with_fencing_token":1}
//!
//! $ curl -s localhost:3002/orders/1 -w '\n'
//! {"id":1,"item":"book","amount_cents":1250,"status":"paid","paid_with_fencing_token":1}
//! ```
//!
//! (`date` headers left out. The embedded backend keeps one fencing counter
//! for every key, and the sweeper's election took 1 from it at start-up, so
//! there the payment's token is 2; on Redis each hash slot has a counter of
//! its own. `retry-after` is a hint, in whole seconds rounded up: the
//! holder's remaining lease while this instance has released no lock yet,
//! then what its recent holds of the key took.)

#[path = "../order_service/startup.rs"]
mod startup;
#[path = "../order_service/store.rs"]
mod store;
#[path = "../order_service/sweeper.rs"]
mod sweeper;

use std::net::{Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use lock_runtime::layer::idempotency::Commit;
use lock_runtime::layer::{IdempotencyLayer, LockLayer, TaskTracker};
use lock_runtime::{LockClient, LockError, LockInfo};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use serde::Deserialize;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use startup::{Settings, Startup, redact, report};
use store::{Order, OrderStatus, Orders, Payment, StoreError};

#[derive(Debug, Deserialize)]
struct NewOrder {
    item: String,
    amount_cents: u64,
}

#[derive(Clone)]
struct AppState {
    orders: Orders,
    /// Whether a new order commits with its idempotency record
    /// (`IDEMPOTENCY_COMMIT`, on by default).
    commit_with_record: bool,
    /// The creations' lease (`IDEMPOTENCY_LEASE_MS`), if not the client's TTL.
    idempotency_lease: Option<Duration>,
    payment_delay: Duration,
    /// Who leads the sweeper.
    sweeper: tokio::sync::watch::Receiver<Option<lock_runtime::Leader>>,
}

#[derive(Debug)]
enum AppError {
    NotFound(u64),
    /// The sweeper cancelled it (left unpaid too long).
    Cancelled(u64),
    Invalid(&'static str),
    /// A write carried a fencing token older than one already accepted.
    StaleFence(u64),
    Lock(LockError),
    Store(StoreError),
    /// The charge found no lock around it (cannot happen under the attribute).
    Unlocked,
}

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError::Lock(e)
    }
}

impl From<StoreError> for AppError {
    fn from(e: StoreError) -> Self {
        AppError::Store(e)
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let (status, detail) = match &self {
            AppError::NotFound(id) => (StatusCode::NOT_FOUND, format!("no order {id}")),
            AppError::Cancelled(id) => (
                StatusCode::CONFLICT,
                format!("order {id} was cancelled: left unpaid too long"),
            ),
            AppError::Invalid(why) => (StatusCode::UNPROCESSABLE_ENTITY, (*why).to_owned()),
            AppError::StaleFence(id) => (
                StatusCode::CONFLICT,
                format!("order {id} was changed under a newer lock; retry"),
            ),
            AppError::Lock(e) if e.is_busy() => (StatusCode::CONFLICT, e.to_string()),
            AppError::Lock(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
            AppError::Unlocked => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "the payment ran without its lock".to_owned(),
            ),
            AppError::Store(e) => {
                tracing::warn!(error = %e, "order store failed");
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the order store is unavailable; retry later".to_owned(),
                )
            }
        };
        let body = serde_json::json!({
            "type": "about:blank",
            "title": status.canonical_reason(),
            "status": status.as_u16(),
            "detail": detail,
        });
        (
            status,
            [(header::CONTENT_TYPE, "application/problem+json")],
            body.to_string(),
        )
            .into_response()
    }
}

/// `POST /orders`. The order and its idempotency record commit together
/// through `commit` (PostgreSQL or Redis), so a process killed at any moment
/// leaves either neither (the retry creates the order) or both (the retry
/// gets this response): never two orders for one key.
async fn create_order(
    State(state): State<AppState>,
    commit: Option<Commit>,
    Json(new): Json<NewOrder>,
) -> Result<Response, AppError> {
    if new.amount_cents == 0 {
        return Err(AppError::Invalid("amount_cents must be above zero"));
    }
    let (order, pending) = state.orders.prepare(new.item, new.amount_cents).await?;
    let response = (
        StatusCode::CREATED,
        [(header::LOCATION, format!("/orders/{}", order.id))],
        Json(&order),
    )
        .into_response();
    let commit = commit.filter(|_| state.commit_with_record);
    let response = pending.commit(commit.as_ref(), response).await?;
    tracing::info!(order = order.id, "order created");
    Ok(response)
}

/// `POST /orders/{id}/pay`, under `LockLayer`'s lock on `order:<id>`.
async fn pay(
    State(state): State<AppState>,
    Path(id): Path<u64>,
    lock: LockInfo,
) -> Result<Json<Order>, AppError> {
    // The token is minted when first asked for (the charge below asks);
    // logging the key costs nothing.
    tracing::info!(order = id, key = %lock.key, "payment started");
    let order = charge(&state, id).await?;
    Ok(Json(order))
}

/// Charges an order once. Callable from anywhere: here under the request's
/// lock (the attribute re-enters it), from a job it takes the lock itself.
#[lock_runtime::distributed_lock(key = "order:<order_id>", ttl = "30s", wait = "2s")]
async fn charge(state: &AppState, order_id: u64) -> Result<Order, AppError> {
    let order = state
        .orders
        .get(order_id)
        .await?
        .ok_or(AppError::NotFound(order_id))?;
    if order.status == OrderStatus::Paid {
        return Ok(order); // checked under the lock: never charged twice
    }
    if order.status == OrderStatus::Cancelled {
        // Under the same lock as the sweeper's cancel: never both.
        return Err(AppError::Cancelled(order_id));
    }
    // The payment provider is slow.
    tokio::time::sleep(state.payment_delay).await;
    // Inside the attribute's scope there is always a lock; its token goes
    // with the write, and the store refuses it if a newer holder wrote first.
    let fence = lock_runtime::current_lock()
        .ok_or(AppError::Unlocked)?
        .fencing_token()
        .await?;
    match state.orders.pay(order_id, fence).await? {
        Payment::Recorded(order) => {
            tracing::info!(order = order_id, fence, "order paid");
            Ok(order)
        }
        Payment::NoSuchOrder => Err(AppError::NotFound(order_id)),
        Payment::StaleFence => Err(AppError::StaleFence(order_id)),
    }
}

/// `GET /orders/{id}`.
async fn get_order(
    State(state): State<AppState>,
    Path(id): Path<u64>,
) -> Result<Json<Order>, AppError> {
    state
        .orders
        .get(id)
        .await?
        .map(Json)
        .ok_or(AppError::NotFound(id))
}

/// `GET /sweeper`: who leads the sweeper, as the observer last heard.
async fn sweeper_leader(State(state): State<AppState>) -> Json<serde_json::Value> {
    let leader = state.sweeper.borrow().clone();
    Json(match leader {
        Some(l) => serde_json::json!({ "label": l.label, "term": l.term }),
        None => serde_json::Value::Null,
    })
}

/// `GET /metrics`: the library's metrics (feature `metrics` of
/// `lock-runtime`) in Prometheus' text format.
async fn metrics(State(prometheus): State<PrometheusHandle>) -> String {
    prometheus.render()
}

/// How long a shutdown waits for handlers still running (a payment whose
/// client went away, or still reading its response) before the process exits.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// The app; `handlers` counts the handlers the layers run to completion.
fn app(
    client: &LockClient,
    state: AppState,
    prometheus: PrometheusHandle,
    handlers: &TaskTracker,
) -> Router {
    let mut idempotency = IdempotencyLayer::new(client.clone());
    if let Some(lease) = state.idempotency_lease {
        idempotency = idempotency.ttl(lease);
    }
    let scrape = Router::new()
        .route("/metrics", get(metrics))
        .with_state(prometheus);
    Router::new()
        .route(
            "/orders",
            post(create_order).route_layer(
                // Records belong to the caller's credentials (Authorization,
                // cookies); handlers run to completion (the default), counted
                // for the graceful shutdown; records commit with the orders
                // (in PostgreSQL or Redis, where the orders are).
                state
                    .orders
                    .idempotency_layer(idempotency)
                    .task_tracker(handlers.clone()),
            ),
        )
        .route(
            "/orders/{id}/pay",
            post(pay).route_layer(
                LockLayer::new(client.clone())
                    // The id the handler parses, not the path text:
                    // `/orders/015/pay` and `/orders/+15/pay` lock `order:15`.
                    .key_from(|Path(id): Path<u64>| format!("order:{id}"))
                    .ttl(Duration::from_secs(10))
                    // A payment whose client gave up still finishes (then the
                    // lock is released); a shutdown waits for it.
                    .task_tracker(handlers.clone()),
            ),
        )
        .route("/orders/{id}", get(get_order))
        .route("/sweeper", get(sweeper_leader))
        .with_state(state)
        .merge(scrape)
}

#[tokio::main]
async fn main() -> ExitCode {
    // `RUST_LOG` as `target=level` pairs and a default level
    // (`info,lock_runtime=debug`); info when unset or unreadable.
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|v| v.parse::<Targets>().ok())
        .unwrap_or_else(|| Targets::new().with_default(tracing::Level::INFO));
    // Colours only on a terminal, not in a log file.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    tracing_subscriber::fmt()
        .with_ansi(ansi)
        .finish()
        .with(filter)
        .init();
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("order-service: {}", report(&e));
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), Startup> {
    let settings = Settings::from_env()?;
    let builder = LockClient::builder().key_prefix(format!("{}:", settings.namespace));
    let client = match &settings.redis_url {
        Some(url) => {
            let shown = redact(url);
            builder.redis(url).build().await.map_err(|e| {
                let doing = match e {
                    LockError::Config(_) => {
                        format!("cannot start: REDIS_URL={shown} is not usable")
                    }
                    _ => format!("cannot start: cannot use Redis at {shown} (REDIS_URL) for locks"),
                };
                Startup::because(doing, e)
            })?
        }
        None => {
            builder.memory().build().await.map_err(|e| {
                Startup::because("cannot start: the embedded lock backend failed", e)
            })?
        }
    };
    let orders = match (&settings.database_url, &settings.redis_url) {
        #[cfg(not(feature = "postgres"))]
        (Some(_), _) => {
            return Err(Startup::new(
                "cannot start: DATABASE_URL is set and this build has no PostgreSQL; \
                 run `cargo run -p examples --features postgres --bin order-service`",
            ));
        }
        #[cfg(feature = "postgres")]
        (Some(url), _) => {
            let shown = redact(url);
            Orders::postgres(url, &settings.namespace)
                .await
                .map_err(|e| {
                    Startup::because(
                        format!("cannot start: cannot use PostgreSQL at {shown} (DATABASE_URL)"),
                        e,
                    )
                })?
        }
        (None, Some(url)) => Orders::redis(url, &settings.namespace).await.map_err(|e| {
            Startup::because(
                format!(
                    "cannot start: cannot use Redis at {} (REDIS_URL) for orders",
                    redact(url)
                ),
                e,
            )
        })?,
        (None, None) => Orders::memory(),
    };
    tracing::info!(
        namespace = %settings.namespace,
        locks = %settings.redis_url.as_deref().map_or("in this process".into(), redact),
        orders = %match (&settings.database_url, &settings.redis_url) {
            (Some(url), _) => redact(url),
            (None, Some(url)) => redact(url),
            (None, None) => "in this process".into(),
        },
        "locks and idempotency records, orders"
    );
    // What `#[distributed_lock]` uses; the same client as the layers, so the
    // charge re-enters the request's lock.
    lock_runtime::set_global_client(client.clone());

    let sweeping = sweeper::Sweep {
        unpaid_for: settings.cancel_unpaid_after,
        every: settings.sweep_every,
        label: format!("127.0.0.1:{} pid {}", settings.port, std::process::id()),
    };
    let observed = sweeper::observe(&client)
        .await
        .map_err(|e| Startup::because("cannot start: cannot observe the sweeper's leader", e))?;
    let (stop_sweeping, stop) = tokio::sync::watch::channel(false);
    let sweeper = tokio::spawn(sweeper::run(client.clone(), orders.clone(), sweeping, stop));
    let state = AppState {
        orders,
        commit_with_record: settings.idempotency_commit,
        idempotency_lease: settings.idempotency_lease,
        payment_delay: settings.payment_delay,
        sweeper: observed,
    };
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, settings.port));
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        Startup::because(format!("cannot start: cannot listen on {addr} (PORT)"), e)
    })?;
    tracing::info!("order service on http://{addr}");
    let prometheus = PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| Startup::because("cannot install the metrics recorder", e))?;
    let handlers = TaskTracker::new();
    axum::serve(listener, app(&client, state, prometheus, &handlers))
        .with_graceful_shutdown(shutdown_requested())
        .await
        .map_err(|e| Startup::because("the server failed", e))?;
    // No new requests, and every connection is closed; handlers whose client
    // went away may still run (a payment half-way): let them finish, bounded.
    handlers.close();
    if !handlers.is_empty() {
        tracing::info!(
            running = handlers.len(),
            "shutting down: waiting for handlers still running"
        );
    }
    if tokio::time::timeout(SHUTDOWN_GRACE, handlers.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            running = handlers.len(),
            "shutting down with handlers still running after {SHUTDOWN_GRACE:?}; their locks \
             and records expire with their leases"
        );
    }
    // The sweeper finishes its sweep and resigns: the next instance takes
    // over at once, not when the lease runs out. (Left running, it would
    // campaign again once the client's shutdown gave its leadership back.)
    let _ = stop_sweeping.send(true);
    if tokio::time::timeout(SHUTDOWN_GRACE, sweeper).await.is_err() {
        tracing::warn!("shutting down mid-sweep after {SHUTDOWN_GRACE:?}");
    }
    // What the client still holds (a lock of a handler cut short) goes back
    // now.
    if tokio::time::timeout(SHUTDOWN_GRACE, client.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("shutting down before every lease was given back; they expire");
    }
    tracing::info!("stopped");
    Ok(())
}

/// Resolves on ctrl-c (SIGINT) or SIGTERM (what a rolling deploy sends).
async fn shutdown_requested() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                term.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM; ctrl-c only");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
    tracing::info!("shutting down: no new requests");
}
