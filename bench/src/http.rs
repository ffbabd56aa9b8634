//! Rows 11 and 12: an axum route under `wrk` load (32 connections, a key of
//! its own per request), behind the library's layer and behind a hand-rolled
//! middleware on raw redis-rs doing the same job, side by side.
//!
//! Row 11: `LockLayer` (keyed by the path) against `SET key token NX PX 30000`,
//! the handler, then a compare-and-delete script by `EVALSHA`; busy -> 409.
//! Beside row 11: the least a lock middleware with fencing tokens can be (one
//! `EVALSHA` of `SET NX PX` + `INCR` of one counter, the handler, the same
//! compare-and-delete) against the same unfenced one: what fencing alone
//! costs a route, whoever writes it. And the library's own acquire.lua and
//! release.lua in a hand-rolled middleware (the names, token and arguments
//! the library sends, no client code around them): what the library's
//! scripts alone cost the route, so that the rest of row 11's gap is the
//! client's.
//! Beside row 12: the same claim + store middleware made safe against a
//! late completion (its claim ran out and another request claimed the key):
//! the claim names its owner, and the store is an owner-checked script
//! (`GET` = owner, then `SET PX`), the least any correct one does; and the
//! library's own record commands (its `SET NX` claim and its settle, with
//! the record it stores: `SET .. IFEQ` where the server has it, as the
//! library sends it there, else idempotency_settle.lua) by hand.
//! Row 12: `IdempotencyLayer` (its defaults) against a claim `SET idem:<key>
//! inflight NX PX 30000`, the handler, then a store `SET idem:<key> <body> PX
//! 86400000`; a duplicate gets the stored body, or 409 while in flight.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use lock_runtime::LockClient;
use lock_runtime::layer::idempotency::Commit;
use lock_runtime::layer::{IdempotencyLayer, LockLayer};
use redis::aio::MultiplexedConnection;

use crate::load::{Load, commandstats, delta, server_cpu, server_reads, wrk};
use crate::raw::{CHECKED_STORE, LIBRARY_SETTLE, RETENTION_MS, library_settle_args};

/// The handler every side serves: a small JSON body after no work.
async fn handler() -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        r#"{"ok":true}"#,
    )
        .into_response()
}

/// The order a handler writes behind `IdempotencyLayer` (row 12's sides
/// with a write): `HSET <prefix>order:<id> paid 1`.
fn order_write(prefix: &str, id: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("HSET");
    cmd.arg(format!("{prefix}order:{id}")).arg("paid").arg(1);
    cmd
}

/// [`handler`] after writing the order itself, on its own connection
/// (behind the layer with no commit store).
async fn writing_handler(
    State((conn, prefix)): State<(redis::aio::ConnectionManager, String)>,
    Path(id): Path<String>,
) -> Response {
    let written: redis::RedisResult<i64> = order_write(&prefix, &id)
        .query_async(&mut conn.clone())
        .await;
    match written {
        Ok(_) => handler().await,
        Err(_) => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}

/// [`handler`]'s response, committed with the order's write through the
/// layer's Redis commit store (`Commit::redis`): one script call.
async fn committing_handler(
    State(prefix): State<String>,
    Path(id): Path<String>,
    commit: Commit,
) -> Response {
    let committed = commit
        .redis()
        .cmd(order_write(&prefix, &id))
        .respond(handler().await);
    committed
        .await
        .unwrap_or_else(|_| StatusCode::SERVICE_UNAVAILABLE.into_response())
}

/// What the hand-rolled middlewares share: a connection and their key prefix.
#[derive(Clone)]
struct Raw {
    conn: MultiplexedConnection,
    prefix: String,
    script: std::sync::Arc<redis::Script>,
    fenced_take: std::sync::Arc<redis::Script>,
    checked_store: std::sync::Arc<redis::Script>,
    library_acquire: std::sync::Arc<redis::Script>,
    library_release: std::sync::Arc<redis::Script>,
    library_settle: std::sync::Arc<redis::Script>,
    /// The server has `SET .. IFEQ` (Valkey 9, Redis 8.4), so the library
    /// settles a record with it, not with its script (row 12's by-hand side
    /// does as the library does).
    native_settle: bool,
    tokens: std::sync::Arc<AtomicU64>,
}

/// The fenced take: the key if free, and a fencing token from one counter
/// in the same atomic step (0: busy).
const FENCED_TAKE: &str = r#"
if redis.call("SET", KEYS[1], ARGV[1], "NX", "PX", ARGV[2]) then return redis.call("INCR", KEYS[2]) end
return 0"#;

/// The fencing token a fenced middleware hands its handler.
#[derive(Clone, Copy)]
struct Fence(#[allow(dead_code)] i64);

const COMPARE_AND_DELETE: &str = r#"
if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) end
return 0"#;

/// What a hand-rolled lock middleware sends ([`raw_lock`]'s `MODE`): `SET NX
/// PX`, then compare-and-delete.
const UNFENCED: u8 = 0;
/// [`FENCED_TAKE`] instead of the `SET`, its fencing token handed to the
/// handler: the least fenced lock.
const FENCED: u8 = 1;
/// The library's own acquire.lua and release.lua, with the names, token and
/// arguments the library sends for a try-once lock, and no client code
/// around them: what the library's scripts cost a route.
const LIBRARY: u8 = 2;

/// The hand-rolled lock: take the key (as `MODE` says), the handler, give
/// it back; busy -> 409.
async fn raw_lock<const MODE: u8>(
    State(raw): State<Raw>,
    mut req: Request,
    next: Next,
) -> Response {
    let path = req.uri().path();
    let names = (MODE == LIBRARY).then(|| crate::raw::library_names(&raw.prefix, path));
    let key = match &names {
        Some(names) => names[0].clone(),
        None => format!("{}{path}", raw.prefix),
    };
    let token = raw.tokens.fetch_add(1, Ordering::Relaxed);
    // A hand-rolled lock's token is 128 bits (32 hex digits, as the raw
    // pair's values): a counter's few digits would be no owner at all
    // across processes.
    let token = if MODE == LIBRARY {
        crate::raw::library_token(token)
    } else {
        format!("{token:032x}")
    };
    let mut conn = raw.conn.clone();
    let taken: redis::RedisResult<Option<i64>> = match (MODE, &names) {
        (LIBRARY, Some(names)) => {
            let mut call = raw.library_acquire.prepare_invoke();
            call.key(&names[..4]).arg(&token).arg(30_000).arg(&names[4]);
            let fence: redis::RedisResult<i64> = call.invoke_async(&mut conn).await;
            fence.map(|fence| (fence > 0).then_some(fence))
        }
        (FENCED, _) => {
            let fence: redis::RedisResult<i64> = raw
                .fenced_take
                .key(&key)
                .key(format!("{}fence", raw.prefix))
                .arg(&token)
                .arg(30_000)
                .invoke_async(&mut conn)
                .await;
            fence.map(|fence| (fence != 0).then_some(fence))
        }
        _ => {
            let set: redis::RedisResult<Option<String>> = redis::cmd("SET")
                .arg(&key)
                .arg(&token)
                .arg("NX")
                .arg("PX")
                .arg(30_000)
                .query_async(&mut conn)
                .await;
            set.map(|set| set.map(|_| 0))
        }
    };
    match taken {
        Ok(Some(fence)) => {
            if MODE != UNFENCED {
                req.extensions_mut().insert(Fence(fence));
            }
        }
        Ok(None) => return StatusCode::CONFLICT.into_response(),
        Err(_) => return StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
    let response = next.run(req).await;
    let released: redis::RedisResult<redis::Value> = match &names {
        Some(names) => {
            let mut call = raw.library_release.prepare_invoke();
            call.key(&names[..4]).arg(&token).arg(&names[4]);
            call.invoke_async(&mut conn).await
        }
        None => {
            raw.script
                .key(&key)
                .arg(&token)
                .invoke_async(&mut conn)
                .await
        }
    };
    match released {
        Ok(_) => response,
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// What a hand-rolled idempotency middleware writes ([`raw_idempotency`]'s
/// `MODE`): a claim `SET idem:<key> inflight NX PX`, then a plain `SET` of
/// the body.
const UNCHECKED: u8 = 0;
/// The claim names its owner (`run:<owner>`) and the store is
/// [`CHECKED_STORE`].
const CHECKED: u8 = 1;
// `LIBRARY` (above), for a record: the library's claim (`SET <record>
// run:<owner>:<fingerprint> NX PX`, with its 57-character owner and
// 64-digit fingerprint) and its settle (`SET <record> <completed> IFEQ <claim> PX`
// where the server has it, else idempotency_settle.lua) with the arguments
// and the completed record it sends, and no client code around them (no hashing:
// the record's name and the fingerprint are made up to their lengths).

/// The hand-rolled idempotency: claim with `SET NX`, the handler, store the
/// response (as `MODE` says); a duplicate gets the stored body, or 409 while
/// the first runs.
async fn raw_idempotency<const MODE: u8>(
    State(raw): State<Raw>,
    req: Request,
    next: Next,
) -> Response {
    let Some(key) = req.headers().get("idempotency-key") else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let key = String::from_utf8_lossy(key.as_bytes());
    let (key, notice) = if MODE == LIBRARY {
        crate::raw::library_record_names(&raw.prefix, &key)
    } else {
        (format!("{}idem:{key}", raw.prefix), String::new())
    };
    let mut conn = raw.conn.clone();
    let owner = match MODE {
        LIBRARY => crate::raw::library_token(raw.tokens.fetch_add(1, Ordering::Relaxed)),
        CHECKED => format!("run:{:032x}", raw.tokens.fetch_add(1, Ordering::Relaxed)),
        _ => String::new(),
    };
    let claimed = match MODE {
        LIBRARY => crate::raw::library_claim(&owner),
        CHECKED => owner.clone(),
        _ => "inflight".to_string(),
    };
    let claim: redis::RedisResult<Option<String>> = redis::cmd("SET")
        .arg(&key)
        .arg(&claimed)
        .arg("NX")
        .arg("PX")
        .arg(30_000)
        .query_async(&mut conn)
        .await;
    match claim {
        Ok(Some(_)) => {}
        Ok(None) => {
            let stored: redis::RedisResult<Option<Vec<u8>>> =
                redis::cmd("GET").arg(&key).query_async(&mut conn).await;
            let in_flight: &[u8] = match MODE {
                UNCHECKED => b"inflight",
                _ => b"run:",
            };
            return match stored {
                Ok(Some(body)) if !body.starts_with(in_flight) => {
                    (StatusCode::OK, body).into_response()
                }
                Ok(_) => StatusCode::CONFLICT.into_response(),
                Err(_) => StatusCode::SERVICE_UNAVAILABLE.into_response(),
            };
        }
        Err(_) => return StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
    let (parts, body) = next.run(req).await.into_parts();
    let Ok(body) = axum::body::to_bytes(body, 1 << 20).await else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let stored: redis::RedisResult<()> = match MODE {
        LIBRARY if raw.native_settle => {
            let (claim, _, retention, record) =
                library_settle_args(&owner, &notice, parts.status.as_u16(), &body);
            let done: redis::RedisResult<Option<String>> = redis::cmd("SET")
                .arg(&key)
                .arg(record)
                .arg("IFEQ")
                .arg(claim)
                .arg("PX")
                .arg(retention)
                .query_async(&mut conn)
                .await;
            done.map(drop)
        }
        LIBRARY => {
            let mut call = raw.library_settle.prepare_invoke();
            let args = library_settle_args(&owner, &notice, parts.status.as_u16(), &body);
            call.key(&key).arg(args);
            let done: redis::RedisResult<i64> = call.invoke_async(&mut conn).await;
            done.map(drop)
        }
        CHECKED => {
            raw.checked_store
                .key(&key)
                .arg(&owner)
                .arg(body.as_ref())
                .arg(RETENTION_MS)
                .invoke_async(&mut conn)
                .await
        }
        _ => {
            redis::cmd("SET")
                .arg(&key)
                .arg(body.as_ref())
                .arg("PX")
                .arg(RETENTION_MS)
                .query_async(&mut conn)
                .await
        }
    };
    match stored {
        Ok(()) => Response::from_parts(parts, Body::from(body)),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// Which middleware a side puts in front of the handler.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Side {
    /// `LockLayer::new(client)`: the key is the path.
    LockLayer,
    /// The hand-rolled lock middleware.
    RawLock,
    /// The least fenced lock middleware.
    RawFencedLock,
    /// A hand-rolled middleware sending the library's own lock scripts.
    RawLibraryLock,
    /// `IdempotencyLayer::new(client)`: its defaults.
    Idempotency,
    /// The same, its handler writing an order (`HSET`) on a connection of
    /// its own.
    IdempotencyWrite,
    /// The same with `commit_with_redis`, the handler's write committed
    /// with its record (`Commit::redis`).
    IdempotencyCommit,
    /// The same with `commit_on_lock_server`, the handler's write committed
    /// in its record on the lock server (`Commit::redis`).
    IdempotencyCommitHere,
    /// The hand-rolled claim + store middleware.
    RawIdempotency,
    /// The same with an owner-checked store.
    RawCheckedIdempotency,
    /// A hand-rolled middleware sending the library's own record commands.
    RawLibraryIdempotency,
}

/// The app of `side`, on the route `POST /orders/{id}/pay`.
pub(crate) async fn app(
    side: Side,
    lib: &LockClient,
    redis: &redis::Client,
    raw_prefix: &str,
) -> Result<Router, String> {
    let route = post(handler);
    let orders = || async {
        redis::aio::ConnectionManager::new(redis.clone())
            .await
            .map_err(|e| format!("the orders' connection: {e}"))
    };
    let route = match side {
        Side::LockLayer => route.route_layer(LockLayer::new(lib.clone())),
        Side::Idempotency => route.route_layer(IdempotencyLayer::new(lib.clone())),
        Side::IdempotencyWrite => post(writing_handler)
            .with_state((orders().await?, raw_prefix.to_string()))
            .route_layer(IdempotencyLayer::new(lib.clone())),
        Side::IdempotencyCommit => post(committing_handler)
            .with_state(raw_prefix.to_string())
            .route_layer(IdempotencyLayer::new(lib.clone()).commit_with_redis(orders().await?)),
        Side::IdempotencyCommitHere => post(committing_handler)
            .with_state(raw_prefix.to_string())
            .route_layer(IdempotencyLayer::new(lib.clone()).commit_on_lock_server()),
        Side::RawLock
        | Side::RawFencedLock
        | Side::RawLibraryLock
        | Side::RawIdempotency
        | Side::RawCheckedIdempotency
        | Side::RawLibraryIdempotency => {
            let raw = Raw {
                conn: redis
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(|e| format!("raw connection: {e}"))?,
                prefix: raw_prefix.to_string(),
                script: std::sync::Arc::new(redis::Script::new(COMPARE_AND_DELETE)),
                fenced_take: std::sync::Arc::new(redis::Script::new(FENCED_TAKE)),
                checked_store: std::sync::Arc::new(redis::Script::new(CHECKED_STORE)),
                library_acquire: std::sync::Arc::new(redis::Script::new(
                    crate::raw::LIBRARY_ACQUIRE,
                )),
                library_release: std::sync::Arc::new(redis::Script::new(
                    crate::raw::LIBRARY_RELEASE,
                )),
                library_settle: std::sync::Arc::new(redis::Script::new(LIBRARY_SETTLE)),
                native_settle: lock_runtime::__private::testing::native_release(lib).is_some(),
                tokens: std::sync::Arc::default(),
            };
            if matches!(side, Side::RawLock) {
                route.route_layer(middleware::from_fn_with_state(raw, raw_lock::<UNFENCED>))
            } else if matches!(side, Side::RawFencedLock) {
                route.route_layer(middleware::from_fn_with_state(raw, raw_lock::<FENCED>))
            } else if matches!(side, Side::RawLibraryLock) {
                route.route_layer(middleware::from_fn_with_state(raw, raw_lock::<LIBRARY>))
            } else if matches!(side, Side::RawCheckedIdempotency) {
                route.route_layer(middleware::from_fn_with_state(
                    raw,
                    raw_idempotency::<CHECKED>,
                ))
            } else if matches!(side, Side::RawLibraryIdempotency) {
                route.route_layer(middleware::from_fn_with_state(
                    raw,
                    raw_idempotency::<LIBRARY>,
                ))
            } else {
                route.route_layer(middleware::from_fn_with_state(
                    raw,
                    raw_idempotency::<UNCHECKED>,
                ))
            }
        }
    };
    Ok(Router::new().route("/orders/{id}/pay", route))
}

/// Serves `app` on a free loopback port until the returned handle is aborted.
pub(crate) async fn serve(app: Router) -> Result<(String, tokio::task::JoinHandle<()>), String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("bind a loopback port: {e}"))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("the listener's address: {e}"))?;
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            eprintln!("bench: the HTTP app stopped: {e}");
        }
    });
    Ok((format!("http://{addr}"), task))
}

/// One repetition of a row: `sides[0]` (the library's layer) and `sides[1]`
/// (its hand-rolled baseline), each served alone on a fresh port, loaded for
/// `warm` and then measured for `window`; the order alternates with `rep`.
/// After each side the keys matching `forget` are deleted ([`forget`](crate::load::forget)), so
/// that every side starts from the same keyspace.
pub(crate) async fn row(
    sides: [Side; 2],
    lib: &LockClient,
    redis: &redis::Client,
    (raw_prefix, forget): (&str, &[String]),
    (warm, window): (Duration, Duration),
    rep: usize,
) -> Result<[Load; 2], String> {
    let mut out: [Load; 2] = Default::default();
    for k in 0..2 {
        let index = (k + rep) % 2;
        let (base, task) = serve(app(sides[index], lib, redis, raw_prefix).await?).await?;
        let run = |d: Duration| {
            let base = base.clone();
            async move {
                tokio::task::spawn_blocking(move || wrk(&base, d))
                    .await
                    .map_err(|e| format!("wrk's thread: {e}"))?
            }
        };
        let measured = async {
            run(warm).await?;
            let before = commandstats(redis).await?;
            let server = server_cpu(redis).await.ok();
            let reads = server_reads(redis).await.ok();
            let cpu = crate::report::cpu_seconds();
            let mut load = run(window).await?;
            load.app_cpu = cpu.zip(crate::report::cpu_seconds()).map(|(a, b)| b - a);
            let server_after = server_cpu(redis).await.ok();
            load.server_cpu = server.zip(server_after).map(|(a, b)| b - a);
            let reads_after = server_reads(redis).await.ok();
            load.server_reads = reads.zip(reads_after).map(|(a, b)| b - a);
            let after = commandstats(redis).await?;
            load.commands = delta(&before, &after);
            Ok::<_, String>(load)
        }
        .await;
        task.abort();
        out[index] = measured?;
        crate::load::forget(redis, forget).await?;
    }
    Ok(out)
}

/// Records a repetition of a row into `metric`: the rates, and notes with
/// each side's per-request profile (under `names`) and any failed answers.
pub(crate) fn record(
    metric: &mut crate::report::Metric,
    rep: usize,
    (l, r): (&Load, &Load),
    names: [&str; 2],
) {
    metric.record(l.per_sec, r.per_sec);
    metric.notes.push(format!(
        "rep {}: per request, {}: {}; {}: {}",
        rep + 1,
        names[0],
        l.profile(),
        names[1],
        r.profile()
    ));
    for (load, side) in [(l, names[0]), (r, names[1])] {
        if load.non_2xx + load.errors > 0 {
            metric.notes.push(format!(
                "rep {}: {side}: {} non-2xx answers, {} socket errors",
                rep + 1,
                load.non_2xx,
                load.errors
            ));
        }
    }
}
