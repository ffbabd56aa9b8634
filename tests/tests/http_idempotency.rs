//! `IdempotencyLayer` on an axum app served on a loopback port, driven by a
//! real HTTP client, against a real redis-server and the embedded backend.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::{MethodRouter, post};
use axum::{Json, Router};
use futures_util::StreamExt;
use lock_runtime::LockClient;
use lock_runtime::layer::IdempotencyLayer;
use lock_runtime::layer::idempotency::StoreResponse;
use serde_json::{Value, json};
use test_support::helpers::{
    memory_client, ms, one_worker_runtime, redis_client, redis_url_client, secs,
    short_timeout_client, within,
};
use test_support::http::{raw_request, send, serve};
use test_support::topology::{Redlock, Topology};
use test_support::{RedisServer, signal};
use tokio::sync::Notify;

/// Both backends: the same semantics are expected of each.
async fn clients(server: &RedisServer) -> [(&'static str, LockClient); 2] {
    [
        ("redis", redis_client(server).await),
        ("memory", memory_client().await),
    ]
}

#[derive(Clone, Default)]
struct Orders {
    runs: Arc<AtomicUsize>,
    work: Duration,
}

impl Orders {
    /// Orders whose handler takes `work`.
    fn taking(work: Duration) -> Self {
        Self {
            work,
            ..Self::default()
        }
    }
}

/// `POST /orders`: creates order N (N = how many times the handler ran).
async fn create_order(State(orders): State<Orders>, Json(body): Json<Value>) -> impl IntoResponse {
    let id = orders.runs.fetch_add(1, Ordering::SeqCst) + 1;
    tokio::time::sleep(orders.work).await;
    (
        StatusCode::CREATED,
        [
            (header::LOCATION, format!("/orders/{id}")),
            (header::SET_COOKIE, "session=secret".to_owned()),
        ],
        Json(json!({ "id": id, "item": body["item"] })),
    )
}

/// An app served on a loopback port, and an HTTP client for it.
struct Api {
    http: reqwest::Client,
    base: String,
}

impl Api {
    async fn serve(app: Router) -> Self {
        let base = serve(app).await;
        Self {
            http: reqwest::Client::new(),
            base,
        }
    }

    /// Serves `route` at `path` under `layer`.
    async fn route(path: &str, route: MethodRouter, layer: IdempotencyLayer) -> Self {
        Self::serve(Router::new().route(path, route.route_layer(layer))).await
    }

    /// Serves `POST /orders` ([`create_order`] on `orders`) under `layer`.
    async fn orders(layer: IdempotencyLayer, orders: &Orders) -> Self {
        let route = post(create_order).with_state(orders.clone());
        Self::route("/orders", route, layer).await
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// `POST {path}` with the idempotency key `key` (the header's value,
    /// quotes included).
    fn post(&self, path: &str, key: &str) -> reqwest::RequestBuilder {
        self.http
            .post(self.url(path))
            .header("idempotency-key", key)
    }

    /// `POST /orders` with the idempotency key `key` and `{"item": item}`.
    fn order(&self, key: &str, item: &str) -> reqwest::RequestBuilder {
        self.post("/orders", key).json(&json!({ "item": item }))
    }

    /// `POST /orders` with the idempotency key `key` and the JSON `body`.
    async fn post_order(&self, key: &str, body: &Value) -> reqwest::Response {
        send(self.post("/orders", key).json(body)).await
    }
}

fn is_replay(headers: &HeaderMap) -> bool {
    headers
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true")
}

/// A response's status and whether it is a replay.
fn answer(r: &reqwest::Response) -> (StatusCode, bool) {
    (r.status(), is_replay(r.headers()))
}

/// A handler counting its runs in `runs`: its n-th run (from 1) answers
/// `reply(n)`.
fn counting<Fut>(
    runs: &Arc<AtomicUsize>,
    reply: impl Fn(usize) -> Fut + Clone + Send + Sync + 'static,
) -> impl Fn() -> Fut + Clone + Send + Sync + 'static {
    let runs = runs.clone();
    move || reply(runs.fetch_add(1, Ordering::SeqCst) + 1)
}

/// Sends `request()` every `every` until it answers `201` (returned), each
/// answer before being `refusal` and none a replay; fails after `limit`
/// saying `what` did not happen.
async fn until_created<F>(
    mut request: impl FnMut() -> F,
    refusal: StatusCode,
    (limit, every): (Duration, Duration),
    what: &str,
) -> reqwest::Response
where
    F: Future<Output = reqwest::Result<reqwest::Response>>,
{
    let deadline = Instant::now() + limit;
    loop {
        let r = request().await.unwrap();
        assert!(
            !is_replay(r.headers()),
            "{what}: a refusal was stored and replayed"
        );
        if r.status() == StatusCode::CREATED {
            return r;
        }
        assert_eq!(r.status(), refusal, "{what}");
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        tokio::time::sleep(every).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_identical_posts_run_the_handler_once() {
    let server = RedisServer::start();
    for (backend, client) in clients(&server).await {
        let orders = Orders::taking(ms(200));
        let api = Api::orders(IdempotencyLayer::new(client), &orders).await;
        let n = 10;
        let replies = futures_util::future::join_all((0..n).map(|_| {
            let request = api.order("\"order-abc\"", "book");
            async move {
                let r = send(request).await;
                let (status, replayed) = answer(&r);
                let retry_after = r.headers().get("retry-after").cloned();
                (
                    status,
                    replayed,
                    retry_after,
                    r.json::<Value>().await.unwrap(),
                )
            }
        }))
        .await;
        assert_eq!(
            orders.runs.load(Ordering::SeqCst),
            1,
            "{backend}: the handler ran twice"
        );
        let mut fresh = 0;
        for (status, replayed, retry_after, body) in &replies {
            match *status {
                StatusCode::CREATED => {
                    assert_eq!(body, &json!({ "id": 1, "item": "book" }), "{backend}");
                    if !replayed {
                        fresh += 1;
                    }
                }
                StatusCode::CONFLICT => {
                    assert_eq!(retry_after.as_ref().unwrap(), "1", "{backend}");
                    assert_eq!(body["status"], 409, "{backend}");
                }
                other => panic!("{backend}: unexpected {other}: {body}"),
            }
        }
        assert_eq!(fresh, 1, "{backend}: exactly one response is the original");

        // After completion every retry is a replay.
        let r = api
            .post_order("\"order-abc\"", &json!({ "item": "book" }))
            .await;
        assert_eq!(r.status(), StatusCode::CREATED, "{backend}");
        assert!(is_replay(r.headers()), "{backend}");
        assert_eq!(orders.runs.load(Ordering::SeqCst), 1, "{backend}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completed_request_is_replayed_with_its_status_headers_and_body() {
    let server = RedisServer::start();
    for (backend, client) in clients(&server).await {
        let orders = Orders::default();
        let api = Api::orders(IdempotencyLayer::new(client), &orders).await;
        let send = |key: &'static str| api.order(key, "pen").send();
        let first = send("\"k-1\"").await.unwrap();
        assert_eq!(first.status(), StatusCode::CREATED);
        assert!(!is_replay(first.headers()));
        assert_eq!(first.headers()["location"], "/orders/1");
        let first_body = first.text().await.unwrap();

        // A bare token is the same key as the quoted string.
        let again = send("k-1").await.unwrap();
        assert_eq!(again.status(), StatusCode::CREATED, "{backend}");
        assert!(is_replay(again.headers()), "{backend}");
        assert_eq!(again.headers()["location"], "/orders/1");
        assert_eq!(again.headers()["content-type"], "application/json");
        assert!(
            again.headers().get("set-cookie").is_none(),
            "{backend}: a header outside the stored list was replayed"
        );
        assert_eq!(again.text().await.unwrap(), first_body);
        assert_eq!(orders.runs.load(Ordering::SeqCst), 1);

        // Another key is another request.
        let other = send("\"k-2\"").await.unwrap();
        assert!(!is_replay(other.headers()));
        assert_eq!(other.headers()["location"], "/orders/2");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_key_with_another_payload_gets_422() {
    let server = RedisServer::start();
    for (backend, client) in clients(&server).await {
        let orders = Orders::default();
        let api = Api::orders(IdempotencyLayer::new(client), &orders).await;
        let send = |item: &'static str, query: &'static str| {
            api.post(&format!("/orders{query}"), "\"k\"")
                .json(&json!({ "item": item }))
                .send()
        };
        assert_eq!(send("pen", "").await.unwrap().status(), StatusCode::CREATED);
        let r = send("ink", "").await.unwrap();
        assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY, "{backend}");
        assert_eq!(r.headers()["content-type"], "application/problem+json");
        assert_eq!(r.json::<Value>().await.unwrap()["status"], 422);
        let r = send("pen", "?express=1").await.unwrap();
        assert_eq!(
            r.status(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "{backend}: the query is part of the request"
        );
        assert_eq!(orders.runs.load(Ordering::SeqCst), 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_or_missing_keys_get_400_and_optional_ones_pass_through() {
    let client = memory_client().await;
    let orders = Orders::default();
    let app = Router::new()
        .route(
            "/orders",
            post(create_order)
                .put(create_order)
                .get(|| async { "list" }),
        )
        .route_layer(IdempotencyLayer::new(client))
        .with_state(orders.clone());
    let api = Api::serve(app).await;
    let body = json!({ "item": "cup" });

    let r = send(api.http.post(api.url("/orders")).json(&body)).await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    let long = format!("\"{}\"", "x".repeat(256));
    for bad in [
        "\"unterminated",
        "\"a\"b",
        "two words",
        "\"\"",
        long.as_str(),
    ] {
        let r = api.post_order(bad, &body).await;
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{bad:?}");
    }
    let r = send(
        api.post("/orders", "\"a\"")
            .header("idempotency-key", "\"b\"")
            .json(&body),
    )
    .await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(orders.runs.load(Ordering::SeqCst), 0);

    // 255 characters is fine.
    let max = format!("\"{}\"", "x".repeat(255));
    let r = api.post_order(&max, &body).await;
    assert_eq!(r.status(), StatusCode::CREATED);

    // Not required on PUT: without a key it passes through (twice: two runs).
    for _ in 0..2 {
        let r = send(api.http.put(api.url("/orders")).json(&body)).await;
        assert_eq!(r.status(), StatusCode::CREATED);
        assert!(!is_replay(r.headers()));
    }
    assert_eq!(orders.runs.load(Ordering::SeqCst), 3);
    // Safe methods are never touched.
    let r = send(api.http.get(api.url("/orders"))).await;
    assert_eq!(r.text().await.unwrap(), "list");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_refused_before_the_handler_leaves_the_key_usable() {
    let server = RedisServer::start();
    for (backend, client) in clients(&server).await {
        let orders = Orders::default();
        let api = Api::orders(IdempotencyLayer::new(client), &orders).await;
        // Malformed JSON: the extractor rejects it, the handler never runs.
        let r = send(
            api.post("/orders", "\"k\"")
                .header("content-type", "application/json")
                .body("{ not json"),
        )
        .await;
        assert!(r.status().is_client_error(), "{backend}: {}", r.status());
        assert!(!is_replay(r.headers()));
        // The corrected request, same key: runs (not 422, not a replay of the 400).
        let r = api.post_order("\"k\"", &json!({ "item": "mug" })).await;
        assert_eq!(r.status(), StatusCode::CREATED, "{backend}");
        assert!(!is_replay(r.headers()));
        assert_eq!(orders.runs.load(Ordering::SeqCst), 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_are_replayed_unless_configured_and_marked_4xx_are_stored() {
    let server = RedisServer::start();
    let client = redis_client(&server).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let failing = counting(&runs, |_| async {
        (StatusCode::BAD_GATEWAY, "upstream down")
    });
    let declined = counting(&runs, |_| async {
        (StatusCode::PAYMENT_REQUIRED, StoreResponse, "declined")
    });
    let app = Router::new()
        .route(
            "/stored",
            post(failing.clone()).route_layer(IdempotencyLayer::new(client.clone())),
        )
        .route(
            "/released",
            post(failing)
                .route_layer(IdempotencyLayer::new(client.clone()).store_server_errors(false)),
        )
        .route(
            "/declined",
            post(declined).route_layer(IdempotencyLayer::new(client.clone())),
        );
    let api = Api::serve(app).await;
    let send = |path: &str| api.post(path, "k").send();

    let r = send("/stored").await.unwrap();
    assert_eq!(answer(&r), (StatusCode::BAD_GATEWAY, false));
    let r = send("/stored").await.unwrap();
    assert_eq!(answer(&r), (StatusCode::BAD_GATEWAY, true));
    assert_eq!(r.text().await.unwrap(), "upstream down");
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    for _ in 0..2 {
        let r = send("/released").await.unwrap();
        assert_eq!(answer(&r), (StatusCode::BAD_GATEWAY, false));
    }
    assert_eq!(runs.load(Ordering::SeqCst), 3);

    let r = send("/declined").await.unwrap();
    assert_eq!(answer(&r), (StatusCode::PAYMENT_REQUIRED, false));
    let r = send("/declined").await.unwrap();
    assert_eq!(answer(&r), (StatusCode::PAYMENT_REQUIRED, true));
    assert_eq!(runs.load(Ordering::SeqCst), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_releases_the_record_and_answers_500() {
    let server = RedisServer::start();
    let client = redis_client(&server).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let handler = counting(&runs, |n| async move {
        if n == 1 {
            panic!("first attempt blows up (expected by the test)");
        }
        (StatusCode::CREATED, "made it")
    });
    let api = Api::route("/orders", post(handler), IdempotencyLayer::new(client)).await;
    let send = || api.post("/orders", "\"p\"").send();
    let r = send().await.unwrap();
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    // Not left in flight (no 409) and not stored (no replayed 500): runs again.
    let r = send().await.unwrap();
    assert_eq!(answer(&r), (StatusCode::CREATED, false));
    let r = send().await.unwrap();
    assert_eq!(answer(&r), (StatusCode::CREATED, true));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_run_to_completion_a_client_disconnect_mid_handler_releases_the_record() {
    let server = RedisServer::start();
    let client = redis_client(&server).await;
    let started = Arc::new(Notify::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let handler = {
        let started = started.clone();
        counting(&runs, move |n| {
            let started = started.clone();
            async move {
                if n == 1 {
                    started.notify_one();
                    tokio::time::sleep(secs(30)).await;
                }
                (StatusCode::CREATED, "second try")
            }
        })
    };
    // A long lease: being able to retry soon proves a release, not an expiry.
    let layer = IdempotencyLayer::new(client)
        .ttl(secs(30))
        .run_to_completion(false);
    let api = Api::route("/orders", post(handler), layer).await;
    let conn = raw_request(
        &api.base,
        "POST /orders HTTP/1.1\r\nhost: x\r\nidempotency-key: \"d\"\r\ncontent-length: 0\r\n\r\n",
    );
    within(secs(5), "the handler's start", started.notified()).await;
    let send = || api.post("/orders", "\"d\"").send();
    assert_eq!(send().await.unwrap().status(), StatusCode::CONFLICT);
    let dropped = Instant::now();
    drop(conn);
    let what = "the record released";
    until_created(send, StatusCode::CONFLICT, (secs(10), ms(20)), what).await;
    println!(
        "key usable again {:?} after the client disconnected",
        dropped.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_are_scoped_to_the_principal() {
    let server = RedisServer::start();
    let client = redis_client(&server).await;
    let orders = Orders::default();
    let layer = IdempotencyLayer::new(client).scope(|req| {
        req.headers
            .get("x-user")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    });
    let api = Api::orders(layer, &orders).await;
    let send = |user: &'static str, item: &'static str| {
        api.post("/orders", "\"shared\"")
            .header("x-user", user)
            .json(&json!({ "item": item }))
            .send()
    };
    let alice = send("alice", "a").await.unwrap();
    assert_eq!(alice.headers()["location"], "/orders/1");
    // Bob guesses Alice's key: he gets his own run, not her response (nor 422).
    let bob = send("bob", "b").await.unwrap();
    assert_eq!(bob.status(), StatusCode::CREATED);
    assert!(!is_replay(bob.headers()));
    assert_eq!(bob.headers()["location"], "/orders/2");
    let alice = send("alice", "a").await.unwrap();
    assert!(is_replay(alice.headers()));
    assert_eq!(alice.headers()["location"], "/orders/1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_can_wait_for_the_first_and_get_its_response() {
    let server = RedisServer::start();
    let client = redis_client(&server).await;
    let orders = Orders::taking(ms(300));
    let layer = IdempotencyLayer::new(client).wait(secs(10));
    let api = Api::orders(layer, &orders).await;
    let send = || api.order("\"w\"", "lamp").send();
    let (a, b) = tokio::join!(send(), async {
        tokio::time::sleep(ms(50)).await;
        send().await
    });
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.status(), StatusCode::CREATED);
    assert_eq!(b.status(), StatusCode::CREATED);
    assert!(!is_replay(a.headers()) && is_replay(b.headers()));
    assert_eq!(orders.runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_outliving_its_lease_keeps_the_record_in_flight() {
    let server = RedisServer::start();
    let client = redis_client(&server).await;
    // Three leases long: only the watchdog's renewals keep the record claimed.
    let orders = Orders::taking(ms(900));
    let layer = IdempotencyLayer::new(client).ttl(ms(300));
    let api = Api::orders(layer, &orders).await;
    let send = || api.order("\"slow\"", "desk").send();
    let first = tokio::spawn(send());
    for _ in 0..6 {
        tokio::time::sleep(ms(100)).await;
        let r = send().await.unwrap();
        assert_eq!(
            r.status(),
            StatusCode::CONFLICT,
            "the record left flight early"
        );
    }
    let first = first.await.unwrap().unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    assert_eq!(orders.runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_process_frees_its_key_after_one_lease() {
    let server = RedisServer::start();
    let url = server.url();
    let lease = ms(600);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (crash_tx, crash_rx) = std::sync::mpsc::channel::<()>();
    // "Process" A: its own runtime, client and server; its handler never ends.
    let a = std::thread::spawn(move || {
        let runtime = one_worker_runtime();
        runtime.block_on(async {
            let client = redis_url_client(url).await.unwrap();
            let started = Arc::new(Notify::new());
            let handler = {
                let started = started.clone();
                move || {
                    let started = started.clone();
                    async move {
                        started.notify_one();
                        std::future::pending::<()>().await;
                    }
                }
            };
            let app = Router::new().route(
                "/orders",
                post(handler).route_layer(IdempotencyLayer::new(client).ttl(lease)),
            );
            let base = serve(app).await;
            let request = tokio::spawn(async move {
                let _ = reqwest::Client::new()
                    .post(format!("{base}/orders"))
                    .header("idempotency-key", "\"crash\"")
                    .send()
                    .await;
            });
            started.notified().await;
            ready_tx.send(()).unwrap();
            drop(request);
        });
        crash_rx.recv().unwrap();
        // A crash: every task is dropped without running, no release is sent
        // and renewals stop.
        runtime.shutdown_background();
    });
    ready_rx.recv_timeout(secs(10)).unwrap();

    // "Process" B, same Redis, same route.
    let client = redis_client(&server).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let handler = counting(&runs, |_| async { StatusCode::CREATED });
    let layer = IdempotencyLayer::new(client).ttl(lease);
    let api = Api::route("/orders", post(handler), layer).await;
    let send = || api.post("/orders", "\"crash\"").send();
    assert_eq!(
        send().await.unwrap().status(),
        StatusCode::CONFLICT,
        "A's claim is in flight"
    );
    crash_tx.send(()).unwrap();
    let crashed = Instant::now();
    a.join().unwrap();
    let what = "the crashed claim expired";
    until_created(send, StatusCode::CONFLICT, (secs(10), ms(50)), what).await;
    let freed = crashed.elapsed();
    println!("key usable again {freed:?} after the crash (lease {lease:?})");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_answers_503_and_large_bodies_413() {
    let mut server = RedisServer::start();
    let client = redis_client(&server).await;
    let orders = Orders::default();
    let layer = IdempotencyLayer::new(client).max_request_body(64);
    let api = Api::orders(layer, &orders).await;
    let r = api
        .post_order("\"big\"", &json!({ "item": "x".repeat(100) }))
        .await;
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);

    server.kill();
    let r = api.post_order("\"down\"", &json!({ "item": "y" })).await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.headers()["retry-after"], "1");
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    assert_eq!(orders.runs.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_by_an_inner_lock_layer_is_not_stored() {
    let mut server = RedisServer::start();
    let locks = redis_client(&server).await;
    let records = memory_client().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let handler = counting(&runs, |_| async { (StatusCode::CREATED, "paid") });
    // Idempotency outside, the lock inside (on a Redis that will go down).
    let app = Router::new().route(
        "/orders/{id}/pay",
        post(handler)
            .route_layer(lock_runtime::layer::LockLayer::new(locks).key("order:<id>"))
            .route_layer(IdempotencyLayer::new(records)),
    );
    let api = Api::serve(app).await;
    let send = || api.post("/orders/1/pay", "\"pay-1\"").send();
    server.kill();
    let r = send().await.unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    server.restart().unwrap();
    // Not a replayed 503: once the lock backend is back, the payment runs.
    let what = "the lock backend back";
    until_created(
        send,
        StatusCode::SERVICE_UNAVAILABLE,
        (secs(10), ms(50)),
        what,
    )
    .await;
    let r = send().await.unwrap();
    assert_eq!(answer(&r), (StatusCode::CREATED, true));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_over_the_storage_limit_is_sent_whole_and_retries_get_410_not_an_empty_body() {
    let server = RedisServer::start();
    for (backend, client) in clients(&server).await {
        let runs = Arc::new(AtomicUsize::new(0));
        let handler = {
            let runs = runs.clone();
            move |body: String| {
                let runs = runs.clone();
                async move {
                    let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                    let size: usize = body.parse().unwrap();
                    (
                        StatusCode::CREATED,
                        [(header::LOCATION, format!("/reports/{n}"))],
                        "r".repeat(size),
                    )
                }
            }
        };
        let layer = IdempotencyLayer::new(client).max_response_body(1000);
        let app = Router::new().route("/reports", post(handler).route_layer(layer));
        let api = Api::serve(app).await;
        let send = |key: &'static str, size: usize| {
            api.post("/reports", key).body(size.to_string()).send()
        };
        let first = send("\"big\"", 5000).await.unwrap();
        assert_eq!(first.status(), StatusCode::CREATED, "{backend}");
        assert_eq!(first.text().await.unwrap(), "r".repeat(5000), "{backend}");
        // Not a `201` with an empty body: an explicit answer that the request
        // completed and cannot be replayed.
        let again = send("\"big\"", 5000).await.unwrap();
        assert_eq!(again.status(), StatusCode::GONE, "{backend}");
        assert!(is_replay(again.headers()), "{backend}");
        assert_eq!(again.headers()["content-type"], "application/problem+json");
        let problem: Value = again.json().await.unwrap();
        assert_eq!(problem["status"], 410, "{backend}");
        assert_eq!(problem["original_status"], 201, "{backend}");
        assert_eq!(problem["location"], "/reports/1", "{backend}");
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "{backend}: the handler ran twice"
        );

        // At the limit: replayed byte for byte.
        let first = send("\"fits\"", 1000).await.unwrap();
        let first_body = first.bytes().await.unwrap();
        let again = send("\"fits\"", 1000).await.unwrap();
        assert_eq!(again.status(), StatusCode::CREATED, "{backend}");
        assert!(is_replay(again.headers()), "{backend}");
        assert_eq!(again.headers()["location"], "/reports/2", "{backend}");
        assert_eq!(again.bytes().await.unwrap(), first_body, "{backend}");
        assert_eq!(runs.load(Ordering::SeqCst), 2, "{backend}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_json_fingerprint_reordered_members_and_whitespace_are_the_same_request() {
    use lock_runtime::layer::idempotency::BodyFingerprint;
    let server = RedisServer::start();
    for (backend, client) in clients(&server).await {
        let orders = Orders::default();
        let app = Router::new()
            .route(
                "/json",
                post(create_order).route_layer(
                    IdempotencyLayer::new(client.clone()).body_fingerprint(BodyFingerprint::Json),
                ),
            )
            .route(
                "/bytes",
                post(create_order).route_layer(IdempotencyLayer::new(client)),
            )
            .with_state(orders.clone());
        let api = Api::serve(app).await;
        let send = |path: &'static str, key: &'static str, body: &'static str| {
            api.post(path, key)
                .header("content-type", "application/json")
                .body(body)
                .send()
        };
        let first = send("/json", "\"j\"", r#"{"item":"pen","qty":1}"#)
            .await
            .unwrap();
        assert_eq!(first.status(), StatusCode::CREATED, "{backend}");
        let first_body = first.text().await.unwrap();
        let again = send("/json", "\"j\"", "{ \"qty\": 1,\n  \"item\": \"pen\" }\n")
            .await
            .unwrap();
        assert_eq!(again.status(), StatusCode::CREATED, "{backend}");
        assert!(is_replay(again.headers()), "{backend}");
        assert_eq!(again.text().await.unwrap(), first_body, "{backend}");
        let other = send("/json", "\"j\"", r#"{"qty":2,"item":"pen"}"#)
            .await
            .unwrap();
        assert_eq!(
            other.status(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "{backend}"
        );
        assert_eq!(orders.runs.load(Ordering::SeqCst), 1, "{backend}");

        // Not JSON under the JSON fingerprint: a clear 400, nothing claimed,
        // so the corrected request runs with the same key.
        let bad = send("/json", "\"bad\"", "{ not json").await.unwrap();
        assert_eq!(bad.status(), StatusCode::BAD_REQUEST, "{backend}");
        assert_eq!(bad.headers()["content-type"], "application/problem+json");
        let problem: Value = bad.json().await.unwrap();
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .contains("not valid JSON"),
            "{backend}: {problem}"
        );
        assert_eq!(orders.runs.load(Ordering::SeqCst), 1, "{backend}");
        let fixed = send("/json", "\"bad\"", r#"{"item":"cup"}"#).await.unwrap();
        assert_eq!(fixed.status(), StatusCode::CREATED, "{backend}");
        assert!(!is_replay(fixed.headers()), "{backend}");

        // Bytes stay the default: the reordered body is another request.
        let first = send("/bytes", "\"b\"", r#"{"item":"pen","qty":1}"#)
            .await
            .unwrap();
        assert_eq!(first.status(), StatusCode::CREATED, "{backend}");
        let reordered = send("/bytes", "\"b\"", r#"{"qty":1,"item":"pen"}"#)
            .await
            .unwrap();
        assert_eq!(
            reordered.status(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "{backend}"
        );
        assert_eq!(orders.runs.load(Ordering::SeqCst), 3, "{backend}");
    }
}

async fn redlock_client(masters: &Redlock) -> LockClient {
    short_timeout_client(masters.builder()).await
}

/// On Redlock the records live on every master and a majority decides: a
/// master that dies, or one that comes back empty, neither stops the layer
/// nor lets a completed order run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redlock_a_dead_or_emptied_master_neither_stops_the_layer_nor_reruns_an_order() {
    let mut masters = Redlock::start(3);
    let orders = Orders::default();
    let layer = IdempotencyLayer::new(redlock_client(&masters).await);
    let api = Api::orders(layer, &orders).await;
    let send = |key: &'static str| api.order(key, "kettle").send();
    let first = send("\"r-1\"").await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let first_body = first.text().await.unwrap();
    for node in 0..masters.size() {
        // The record, beside the client's registry entry (its label).
        let mut names = masters.keys(node);
        names.retain(|n| !n.starts_with("lock:C{"));
        assert_eq!(names.len(), 1, "node {node}'s records: {names:?}");
    }

    masters.kill(0);
    let again = send("\"r-1\"").await.unwrap();
    assert_eq!(again.status(), StatusCode::CREATED, "with node 0 down");
    assert!(is_replay(again.headers()));
    assert_eq!(again.text().await.unwrap(), first_body);
    let second = send("\"r-2\"").await.unwrap();
    assert_eq!(second.status(), StatusCode::CREATED);
    assert!(!is_replay(second.headers()));

    // Node 1 loses its data (a restart without persistence): node 2 alone
    // still holds both responses, and a lone copy of a response is replayed,
    // never run again.
    assert_eq!(masters.cli(1, &["FLUSHALL"]), "OK");
    for key in ["\"r-1\"", "\"r-2\""] {
        let r = send(key).await.unwrap();
        assert_eq!(r.status(), StatusCode::CREATED, "{key}");
        assert!(is_replay(r.headers()), "{key} ran again");
    }
    assert_eq!(orders.runs.load(Ordering::SeqCst), 2);
    // The replays left no claim behind on the emptied node.
    assert_eq!(masters.cli(1, &["DBSIZE"]), "0");

    // With a single master left there is no majority: 503, not a guess.
    masters.kill(1);
    let alone = send("\"r-3\"").await.unwrap();
    assert_eq!(alone.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(orders.runs.load(Ordering::SeqCst), 2);
}

/// Claims racing over three masters: at most one wins a majority (a
/// three-way split leaves nobody with one, and every racer gets 409), and
/// the losers undo their partial claims, so the next retry is decided.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redlock_concurrent_identical_posts_run_the_handler_at_most_once() {
    let masters = Redlock::start(3);
    let orders = Orders::taking(ms(200));
    let layer = IdempotencyLayer::new(redlock_client(&masters).await);
    let api = Api::orders(layer, &orders).await;
    let send = || api.order("\"race\"", "chair").send();
    for _ in 0..3 {
        let statuses = futures_util::future::join_all((0..10).map(|_| send()))
            .await
            .into_iter()
            .map(|r| r.unwrap().status())
            .collect::<Vec<_>>();
        let runs = orders.runs.load(Ordering::SeqCst);
        let created = statuses.iter().filter(|s| s.is_success()).count();
        let conflicts = statuses
            .iter()
            .filter(|s| **s == StatusCode::CONFLICT)
            .count();
        assert!(runs <= 1, "the handler ran {runs} times: {statuses:?}");
        assert_eq!(created + conflicts, 10, "{statuses:?}");
        if runs == 1 {
            break;
        }
        assert_eq!(created, 0, "{statuses:?}");
    }
    assert_eq!(orders.runs.load(Ordering::SeqCst), 1);
    // Nothing is left in flight: every retry now gets the stored response.
    let r = send().await.unwrap();
    assert!(is_replay(r.headers()));
    assert_eq!(orders.runs.load(Ordering::SeqCst), 1);
}

// ---- Lost replies ------------------------------------------------------------

/// A plain connection to `port`, opened before any freeze, that queues
/// `CLIENT KILL TYPE normal` (which spares the connection that sends it).
struct Killer(std::net::TcpStream);

impl Killer {
    fn connect(port: u16) -> Self {
        let stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream.set_read_timeout(Some(secs(5))).unwrap();
        Self(stream)
    }

    /// Queues the command; the server runs it when it can (now, or when it
    /// is resumed).
    fn queue(&mut self) {
        std::io::Write::write_all(&mut self.0, b"CLIENT KILL TYPE normal SKIPME yes\r\n").unwrap();
    }

    /// How many connections the queued command killed.
    fn killed(&mut self) -> u64 {
        let mut line = Vec::new();
        let mut byte = [0u8; 1];
        while !line.ends_with(b"\r\n") {
            std::io::Read::read_exact(&mut self.0, &mut byte).unwrap();
            line.push(byte[0]);
        }
        let line = String::from_utf8(line).unwrap();
        line.trim()
            .strip_prefix(':')
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("unexpected CLIENT KILL reply {line:?}"))
    }
}

/// Where [`a_lost_reply_never_turns_a_success_into_an_error_nor_reruns_a_request`]
/// freezes the server.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Stage {
    /// Before the layer sends its claim (a middleware outside the layer).
    Claim,
    /// When the handler is done, before the layer sends the completion.
    Completion,
}

/// The command connection dies while a claim or a completion is in flight:
/// with `CLIENT KILL` queued before the command (it never runs) or after it
/// (it runs and its reply is lost). Each time the client gets the handler's
/// response (not 409/503), and a retry gets it replayed: the handler ran
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_never_turns_a_success_into_an_error_nor_reruns_a_request() {
    use std::sync::Mutex;
    let server = RedisServer::start();
    let pid = server.pid().unwrap();
    let client = redis_client(&server).await;
    // The plan of the next request: where to freeze, and whether the kill is
    // queued before the command (else after it).
    let plan: Arc<Mutex<Option<(Stage, bool)>>> = Arc::default();
    let killer = Arc::new(Mutex::new(Killer::connect(server.port)));
    let frozen = Arc::new(Notify::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let freeze = {
        let (plan, killer, frozen) = (plan.clone(), killer.clone(), frozen.clone());
        move |stage: Stage| {
            let mut plan = plan.lock().unwrap();
            if let Some((at, kill_first)) = *plan
                && at == stage
            {
                *plan = None;
                signal(pid, "STOP").unwrap();
                if kill_first {
                    killer.lock().unwrap().queue();
                }
                frozen.notify_one();
            }
        }
    };
    let handler = {
        let (freeze, runs) = (freeze.clone(), runs.clone());
        move || {
            let (freeze, runs) = (freeze.clone(), runs.clone());
            async move {
                let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                // The handler's work is done: the completion comes next.
                freeze(Stage::Completion);
                (StatusCode::CREATED, format!("order {n}"))
            }
        }
    };
    let before_claim = move |req: axum::extract::Request, next: axum::middleware::Next| {
        freeze(Stage::Claim);
        next.run(req)
    };
    let app = Router::new()
        .route(
            "/orders",
            post(handler).route_layer(IdempotencyLayer::new(client)),
        )
        .layer(axum::middleware::from_fn(before_claim));
    let api = Api::serve(app).await;
    let send = |key: &str| api.post("/orders", &format!("\"{key}\"")).send();
    // Loads the scripts, so a frozen command is the script itself and not a
    // NOSCRIPT answer followed by a load.
    assert_eq!(send("warm-up").await.unwrap().status(), StatusCode::CREATED);

    for (stage, kill_first, case) in [
        (
            Stage::Completion,
            true,
            "connection killed before the server read the completion",
        ),
        (Stage::Completion, false, "completion ran, its reply lost"),
        (
            Stage::Claim,
            true,
            "connection killed before the server read the claim",
        ),
        (Stage::Claim, false, "claim ran, its reply lost"),
    ] {
        let key = format!("{stage:?}-{kill_first}");
        let runs_before = runs.load(Ordering::SeqCst);
        *plan.lock().unwrap() = Some((stage, kill_first));
        let first = tokio::spawn(send(&key));
        tokio::time::timeout(secs(5), frozen.notified())
            .await
            .unwrap_or_else(|_| panic!("{case}: the server was not frozen"));
        // The command reaches the frozen server within this pause; the whole
        // freeze stays under the client's 500 ms response timeout.
        tokio::time::sleep(ms(150)).await;
        if !kill_first {
            killer.lock().unwrap().queue();
        }
        tokio::time::sleep(ms(50)).await;
        signal(pid, "CONT").unwrap();
        let killed = tokio::task::block_in_place(|| killer.lock().unwrap().killed());
        assert!(killed >= 1, "{case}: CLIENT KILL killed nothing");

        let first = first.await.unwrap().unwrap();
        assert_eq!(first.status(), StatusCode::CREATED, "{case}");
        assert!(!is_replay(first.headers()), "{case}");
        let body = first.text().await.unwrap();
        let again = send(&key).await.unwrap();
        assert_eq!(
            answer(&again),
            (StatusCode::CREATED, true),
            "{case}: the retry was not a replay"
        );
        assert_eq!(again.text().await.unwrap(), body, "{case}");
        assert_eq!(
            runs.load(Ordering::SeqCst),
            runs_before + 1,
            "{case}: the handler ran twice"
        );
    }
}

/// What one key saw in [`hammer_while_killing_connections`].
#[derive(Debug, Default)]
struct KeyLog {
    /// (request id, status) of every attempt.
    answers: Vec<(usize, StatusCode)>,
    replayed: bool,
}

/// For `run_for`, sends new keys (8 at a time), each until it gets a `2xx`
/// and then until a retry is a replay, while `CLIENT KILL TYPE normal` runs
/// on every server in `ports` every 300 ms. Returns, per key, the handler's
/// runs (request ids) and what the client saw, and how many connections
/// were killed.
async fn hammer_while_killing_connections(
    client: LockClient,
    ports: Vec<u16>,
    run_for: Duration,
) -> (Vec<Vec<usize>>, Vec<KeyLog>, u64) {
    use std::sync::Mutex;
    const MAX_KEYS: usize = 100_000;
    let ran: Arc<Mutex<Vec<Vec<usize>>>> = Arc::new(Mutex::new(vec![Vec::new(); MAX_KEYS]));
    let handler = {
        let ran = ran.clone();
        move |headers: HeaderMap| {
            let ran = ran.clone();
            async move {
                let key: usize = headers["x-key"].to_str().unwrap().parse().unwrap();
                let id: usize = headers["x-request"].to_str().unwrap().parse().unwrap();
                tokio::time::sleep(ms(20)).await;
                ran.lock().unwrap()[key].push(id);
                (StatusCode::CREATED, format!("key {key} by request {id}"))
            }
        }
    };
    let layer = IdempotencyLayer::new(client).ttl(secs(1));
    let base = serve(Router::new().route("/orders", post(handler).route_layer(layer))).await;

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let killer = {
        let stop = stop.clone();
        tokio::task::spawn_blocking(move || {
            let mut killers: Vec<Killer> = ports.iter().map(|p| Killer::connect(*p)).collect();
            let mut killed = 0;
            while !stop.load(Ordering::SeqCst) {
                std::thread::sleep(ms(300));
                for k in &mut killers {
                    k.queue();
                    killed += k.killed();
                }
            }
            killed
        })
    };

    let next_id = Arc::new(AtomicUsize::new(0));
    let http = reqwest::Client::new();
    let started = Instant::now();
    let logs = futures_util::stream::iter(0..MAX_KEYS)
        .take_while(|_| std::future::ready(started.elapsed() < run_for))
        .map(|key| {
            let (http, base, next_id) = (http.clone(), base.clone(), next_id.clone());
            async move {
                let mut log = KeyLog::default();
                let deadline = Instant::now() + secs(20);
                let mut done = false;
                while Instant::now() < deadline {
                    let id = next_id.fetch_add(1, Ordering::SeqCst);
                    let r = send(
                        http.post(format!("{base}/orders"))
                            .header("idempotency-key", format!("\"key-{key}\""))
                            .header("x-key", key.to_string())
                            .header("x-request", id.to_string()),
                    )
                    .await;
                    let (status, replayed) = answer(&r);
                    log.answers.push((id, status));
                    if status.is_success() {
                        if done && replayed {
                            log.replayed = true;
                            break;
                        }
                        done = true;
                    }
                    // A refusal (409 in flight, 503 store unreachable) or the
                    // first answer: ask again.
                    tokio::time::sleep(ms(30)).await;
                }
                log
            }
        })
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await;
    stop.store(true, Ordering::SeqCst);
    let killed = killer.await.unwrap();
    let mut ran = ran.lock().unwrap().clone();
    ran.truncate(logs.len());
    (ran, logs, killed)
}

/// Checks [`hammer_while_killing_connections`]' outcome: no key ran twice,
/// no request whose handler ran got a `5xx`, every key ended replayed.
fn check_no_double_runs_and_no_5xx_after_success(
    backend: &str,
    ran: &[Vec<usize>],
    logs: &[KeyLog],
    killed: u64,
) {
    let runs_twice: Vec<_> = ran
        .iter()
        .enumerate()
        .filter(|(_, r)| r.len() > 1)
        .collect();
    let ran_ids: std::collections::HashSet<usize> = ran.iter().flatten().copied().collect();
    let errors_after_success: Vec<_> = logs
        .iter()
        .flat_map(|l| &l.answers)
        .filter(|(id, status)| ran_ids.contains(id) && !status.is_success())
        .collect();
    let refusals = logs
        .iter()
        .flat_map(|l| &l.answers)
        .filter(|(_, s)| !s.is_success())
        .count();
    println!(
        "{backend}: {} keys, {killed} connections killed, {refusals} refusals (409/503) \
         of requests whose handler did not run",
        logs.len()
    );
    assert!(killed > 0, "{backend}: no connection was killed");
    assert!(
        runs_twice.is_empty(),
        "{backend}: keys whose handler ran more than once (key, request ids): {runs_twice:?}"
    );
    assert!(
        errors_after_success.is_empty(),
        "{backend}: requests whose handler ran but got an error: {errors_after_success:?}"
    );
    let unfinished: Vec<_> = logs
        .iter()
        .enumerate()
        .filter(|(_, l)| !l.replayed)
        .collect();
    assert!(
        unfinished.is_empty(),
        "{backend}: keys never replayed: {unfinished:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_connections_neither_run_a_handler_twice_nor_answer_5xx_after_it_succeeded() {
    let server = RedisServer::start();
    let client = redis_client(&server).await;
    let (ran, logs, killed) =
        hammer_while_killing_connections(client, vec![server.port], secs(8)).await;
    check_no_double_runs_and_no_5xx_after_success("redis", &ran, &logs, killed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redlock_killed_connections_neither_run_a_handler_twice_nor_answer_5xx_after_it_succeeded()
 {
    let masters = Redlock::start(3);
    let ports = (0..masters.size())
        .map(|i| masters.server(i).port)
        .collect();
    let client = redlock_client(&masters).await;
    let (ran, logs, killed) = hammer_while_killing_connections(client, ports, secs(8)).await;
    check_no_double_runs_and_no_5xx_after_success("redlock", &ran, &logs, killed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sentinel_killed_connections_neither_run_a_handler_twice_nor_answer_5xx_after_it_succeeded()
 {
    use test_support::topology::SentinelSetup;
    let setup = tokio::task::block_in_place(SentinelSetup::start);
    let client = short_timeout_client(setup.builder()).await;
    let ports = vec![setup.master().port];
    let (ran, logs, killed) = hammer_while_killing_connections(client, ports, secs(8)).await;
    check_no_double_runs_and_no_5xx_after_success("sentinel", &ran, &logs, killed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_cluster_killed_connections_neither_run_a_handler_twice_nor_answer_5xx_after_it_succeeded()
 {
    use test_support::topology::Cluster;
    let cluster = tokio::task::block_in_place(|| Cluster::start(3));
    let client = short_timeout_client(cluster.builder()).await;
    let ports = (0..cluster.size()).map(|i| cluster.node(i).port).collect();
    let (ran, logs, killed) = hammer_while_killing_connections(client, ports, secs(8)).await;
    check_no_double_runs_and_no_5xx_after_success("cluster", &ran, &logs, killed);
}
