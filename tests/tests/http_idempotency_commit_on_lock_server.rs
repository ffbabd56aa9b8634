//! `IdempotencyLayer::commit_on_lock_server`: an order service whose orders
//! live on the server of its locks commits the order and completes its
//! record in one script call (`Commit::redis`). A "process" is a runtime of
//! its own, shut down without clean-up like a killed one: killed after the
//! commit, the retry is replayed at once; killed before it, the retry runs
//! the work once the claim's lease ran out; a claimer paused past its lease
//! cannot create the order a second time.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use lock_runtime::LockClient;
use lock_runtime::layer::IdempotencyLayer;
use lock_runtime::layer::idempotency::Commit;
use redis::aio::ConnectionManager;
use serde_json::{Value, json};
use test_support::RedisServer;
use test_support::helpers::{ms, one_worker_runtime, secs};
use tokio::sync::{Notify, mpsc};

/// What the handler does after writing its order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Commits,
    /// Commits, says so, then hangs: killed with its work done.
    CommitsThenHangs,
    /// Says so and hangs before committing: killed with nothing written.
    HangsBeforeCommit,
    /// Says so and waits to be told to go on, then commits: a claimer paused
    /// past its lease.
    PausesBeforeCommit,
}

#[derive(Clone)]
struct App {
    orders: ConnectionManager,
    mode: Mode,
    runs: Arc<AtomicUsize>,
    reached: mpsc::UnboundedSender<()>,
    go: Arc<Notify>,
}

async fn create_order(
    State(app): State<App>,
    commit: Commit,
    Json(body): Json<Value>,
) -> Result<Response, StatusCode> {
    app.runs.fetch_add(1, Ordering::SeqCst);
    let item = body["item"].as_str().unwrap_or_default().to_owned();
    let failed = |e: &dyn std::fmt::Display| {
        eprintln!("handler failed: {e}");
        StatusCode::SERVICE_UNAVAILABLE
    };
    let id: i64 = redis::cmd("INCR")
        .arg("order-ids")
        .query_async(&mut app.orders.clone())
        .await
        .map_err(|e| failed(&e))?;
    if app.mode != Mode::Commits && app.mode != Mode::CommitsThenHangs {
        let _ = app.reached.send(());
        if app.mode == Mode::HangsBeforeCommit {
            std::future::pending::<()>().await;
        }
        app.go.notified().await;
    }
    let answer = (
        StatusCode::CREATED,
        [(header::LOCATION, format!("/orders/{id}"))],
        Json(json!({ "id": id, "item": item })),
    );
    let response = commit
        .redis()
        .cmd(
            redis::cmd("HSET")
                .arg(format!("order:{id}"))
                .arg("item")
                .arg(&item),
        )
        .cmd(redis::cmd("RPUSH").arg("orders").arg(id))
        .respond(answer)
        .await
        .map_err(|e| failed(&e))?;
    if app.mode == Mode::CommitsThenHangs {
        let _ = app.reached.send(());
        std::future::pending::<()>().await;
    }
    Ok(response.into_response())
}

async fn orders(server: &RedisServer) -> Vec<i64> {
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    redis::cmd("LRANGE")
        .arg("orders")
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap()
}

/// A "process" serving the app on a runtime of its own: dropping it stops
/// everything at once, with no clean-up, as a kill does.
struct Process {
    runtime: Option<tokio::runtime::Runtime>,
    base: String,
    runs: Arc<AtomicUsize>,
    reached: mpsc::UnboundedReceiver<()>,
    go: Arc<Notify>,
}

impl Process {
    async fn start(server: &RedisServer, mode: Mode) -> Self {
        let runtime = one_worker_runtime();
        let (reached_tx, reached) = mpsc::unbounded_channel();
        let runs = Arc::new(AtomicUsize::new(0));
        let go = Arc::new(Notify::new());
        let (url, runs_, go_) = (server.url(), runs.clone(), go.clone());
        let base = runtime
            .spawn(async move {
                let client = LockClient::builder().redis(url.as_str()).build().await;
                let orders = redis::Client::open(url).unwrap();
                let app = App {
                    orders: ConnectionManager::new(orders).await.unwrap(),
                    mode,
                    runs: runs_,
                    reached: reached_tx,
                    go: go_,
                };
                let layer = IdempotencyLayer::new(client.unwrap())
                    .records_shared_by_all_callers()
                    // A short lease: a killed claimer's key is free soon.
                    .ttl(ms(600))
                    .commit_on_lock_server();
                let router = Router::new()
                    .route("/orders", post(create_order).route_layer(layer))
                    .with_state(app);
                test_support::http::serve(router).await
            })
            .await
            .unwrap();
        Process {
            runtime: Some(runtime),
            base,
            runs,
            reached,
            go,
        }
    }

    fn post(&self, key: &str, item: &str) -> reqwest::RequestBuilder {
        reqwest::Client::new()
            .post(format!("{}/orders", self.base))
            .header("idempotency-key", format!("\"{key}\""))
            .json(&json!({ "item": item }))
            .timeout(secs(5))
    }

    async fn reached(&mut self) {
        tokio::time::timeout(secs(10), self.reached.recv())
            .await
            .expect("the handler reached its point")
            .unwrap();
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Sends the request until it gets a `2xx` (a `409` while another claim's
/// lease runs); returns it, whether it was replayed, and how many tries.
async fn until_answered(request: impl Fn() -> reqwest::RequestBuilder) -> (Value, bool, usize) {
    for tries in 1..=100 {
        match request().send().await {
            Ok(r) if r.status().is_success() => {
                let replayed = r.headers().get("idempotent-replayed").is_some();
                return (r.json().await.unwrap(), replayed, tries);
            }
            Ok(r) if r.status() == StatusCode::CONFLICT => {}
            Ok(r) => panic!("unexpected answer {}", r.status()),
            Err(_) => {}
        }
        tokio::time::sleep(ms(100)).await;
    }
    panic!("no answer after 100 tries");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_order_completes_its_record_and_a_retry_is_replayed() {
    let server = RedisServer::start();
    let process = Process::start(&server, Mode::Commits).await;
    let (first, replayed, _) = until_answered(|| process.post("k-1", "book")).await;
    assert!(!replayed);
    let (again, replayed, tries) = until_answered(|| process.post("k-1", "book")).await;
    assert!(replayed && tries == 1, "{replayed} after {tries} tries");
    assert_eq!(again, first);
    assert_eq!(process.runs(), 1);
    assert_eq!(orders(&server).await, [1]);
    // The record is the only copy.
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let copies: Vec<String> = redis::cmd("KEYS")
        .arg("*:committed")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(copies.is_empty(), "{copies:?}");
}

/// Killed after its commit, before its response went out: the retry, sent
/// at once to another process, is replayed (no lease to wait out: the
/// commit completed the record).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_killed_after_its_commit_is_replayed_at_once() {
    let server = RedisServer::start();
    let mut killed = Process::start(&server, Mode::CommitsThenHangs).await;
    let request = tokio::spawn(killed.post("k-2", "lamp").send());
    killed.reached().await;
    drop(killed);
    let _ = request.await;
    let other = Process::start(&server, Mode::Commits).await;
    let (answer, replayed, tries) = until_answered(|| other.post("k-2", "lamp")).await;
    assert!(replayed && tries == 1, "{replayed} after {tries} tries");
    assert_eq!(answer["id"], 1);
    assert_eq!(other.runs(), 0);
    assert_eq!(orders(&server).await, [1]);
}

/// Killed before its commit: no order, and the retry (once the lease ran
/// out) creates it, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_killed_before_its_commit_leaves_nothing_and_the_retry_runs_once() {
    let server = RedisServer::start();
    let mut killed = Process::start(&server, Mode::HangsBeforeCommit).await;
    let request = tokio::spawn(killed.post("k-3", "cup").send());
    killed.reached().await;
    drop(killed);
    let _ = request.await;
    let other = Process::start(&server, Mode::Commits).await;
    let (answer, replayed, _) = until_answered(|| other.post("k-3", "cup")).await;
    assert!(!replayed);
    assert_eq!(other.runs(), 1);
    assert_eq!(orders(&server).await, [answer["id"].as_i64().unwrap()]);
}

/// A handler paused past its lease while another process claimed, ran and
/// committed the request: when it wakes, its commit writes nothing and it
/// answers with the other's response, replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_paused_past_its_lease_cannot_create_the_order_twice() {
    let server = RedisServer::start();
    let mut a = Process::start(&server, Mode::PausesBeforeCommit).await;
    let first = tokio::spawn(a.post("k-4", "bowl").timeout(secs(30)).send());
    a.reached().await;
    // A's lease runs out while it is paused (its claim deleted: the watchdog
    // renews it); B claims, runs, commits.
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let claims: Vec<String> = redis::cmd("KEYS")
        .arg("*I{*}")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(claims.len(), 1, "{claims:?}");
    let _: () = redis::cmd("DEL")
        .arg(&claims)
        .query_async(&mut conn)
        .await
        .unwrap();
    let b = Process::start(&server, Mode::Commits).await;
    let (answer, replayed, _) = until_answered(|| b.post("k-4", "bowl")).await;
    assert!(!replayed);
    a.go.notify_one();
    let late = first.await.unwrap().unwrap();
    assert!(late.status().is_success(), "{}", late.status());
    assert!(late.headers().get("idempotent-replayed").is_some());
    assert_eq!(late.json::<Value>().await.unwrap(), answer);
    assert_eq!(orders(&server).await.len(), 1, "created twice");
}

/// A layer whose client has no one lock server (here the embedded backend)
/// is refused as the router is built, naming the setter.
#[tokio::test]
async fn a_layer_without_one_lock_server_is_refused_when_built() {
    let client = LockClient::builder().memory().build().await.unwrap();
    let build = || IdempotencyLayer::new(client).commit_on_lock_server();
    let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(build));
    let panic = built.expect_err("built");
    let why = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        why.contains("IdempotencyLayer::commit_on_lock_server") && why.contains("embedded"),
        "{why}"
    );
}
