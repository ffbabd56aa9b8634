//! `LockLayer` on an axum app served on a loopback port, driven by a real HTTP
//! client, against a real redis-server (and the embedded backend where cheap).

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::routing::post;
use futures_util::StreamExt;
use http::StatusCode;
use lock_runtime::__private::testing::force_delete;
use lock_runtime::layer::LockLayer;
use lock_runtime::{LockClient, LockInfo};
use test_support::RedisServer;
use test_support::helpers::{is_held, memory_client, ms, redis_client, secs, taken_after, within};
use test_support::http::{raw_request, send, serve};
use tokio::sync::{Barrier, Notify, mpsc};

mod layers_common;
use layers_common::Gauge;

/// `POST /orders/{id}/pay` that takes `work` and answers with its fencing token.
fn pay_app(layer: LockLayer, gauge: Gauge, work: Duration) -> Router {
    Router::new()
        .route(
            "/orders/{id}/pay",
            post(
                move |State(gauge): State<Gauge>, Path(id): Path<u64>, lock: LockInfo| async move {
                    let _inside = gauge.enter();
                    assert_eq!(lock.key, format!("order:{id}"));
                    tokio::time::sleep(work).await;
                    lock.fencing_token().await.unwrap().to_string()
                },
            ),
        )
        .route_layer(layer)
        .with_state(gauge)
}

/// `POST /orders/{id}/pay` under a lock with a lease of `ttl`, whose handler
/// signals `started` (returned), works for `work`, then counts itself in
/// `finished` (returned): it stays at 0 if the handler was cancelled.
fn slow_pay_app(
    client: &LockClient,
    ttl: Duration,
    work: Duration,
    run_to_completion: bool,
) -> (Router, Arc<Notify>, Arc<AtomicUsize>) {
    let started = Arc::new(Notify::new());
    let finished = Arc::new(AtomicUsize::new(0));
    let app = {
        let (started, finished) = (started.clone(), finished.clone());
        Router::new()
            .route(
                "/orders/{id}/pay",
                post(move || async move {
                    started.notify_one();
                    tokio::time::sleep(work).await;
                    finished.fetch_add(1, Ordering::SeqCst);
                }),
            )
            .route_layer(
                LockLayer::new(client.clone())
                    .key("order:<id>")
                    .ttl(ttl)
                    .run_to_completion(run_to_completion),
            )
    };
    (app, started, finished)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_pays_on_one_order_run_one_at_a_time() {
    let server = RedisServer::start();
    let client = redis_client(&server).await;
    let gauge = Gauge::default();
    let layer = LockLayer::new(client.clone())
        .key("order:<id>")
        .wait(secs(20));
    let base = serve(pay_app(layer, gauge.clone(), ms(50))).await;
    let http = reqwest::Client::new();
    let n = 8;
    let replies = futures_util::future::join_all((0..n).map(|_| {
        let http = http.clone();
        let url = format!("{base}/orders/42/pay");
        async move {
            let r = send(http.post(url)).await;
            (r.status(), r.text().await.unwrap())
        }
    }))
    .await;
    let mut tokens: Vec<u64> = replies
        .iter()
        .map(|(status, body)| {
            assert_eq!(*status, StatusCode::OK, "{body}");
            body.parse().unwrap()
        })
        .collect();
    // One fencing token per holder: all different, every one above zero
    // (the requests of one client hand the lock on in-process, with tokens
    // from reserved blocks, so they need not be consecutive).
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(
        tokens.len(),
        n as usize,
        "one fencing token per holder: {tokens:?}"
    );
    assert!(tokens[0] >= 1, "{tokens:?}");
    assert_eq!(gauge.runs.load(Ordering::SeqCst), n as usize);
    assert_eq!(gauge.max.load(Ordering::SeqCst), 1, "two pays ran at once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_order_answers_409_with_retry_after_and_a_problem() {
    let server = RedisServer::start();
    let client = redis_client(&server).await;
    let gauge = Gauge::default();
    let layer = LockLayer::new(client.clone()).key("order:<id>");
    let base = serve(pay_app(layer, gauge.clone(), Duration::ZERO)).await;
    let holder = client.lock("order:7").ttl(secs(6)).acquire().await.unwrap();

    let http = reqwest::Client::new();
    let r = send(http.post(format!("{base}/orders/7/pay"))).await;
    assert_eq!(r.status(), StatusCode::CONFLICT);
    let retry_after: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    // The holder's remaining lease, rounded up: renewed every 2 s, so 4 to 6 s.
    assert!((3..=6).contains(&retry_after), "Retry-After: {retry_after}");
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    let problem: serde_json::Value = r.json().await.unwrap();
    assert_eq!(problem["status"], 409);
    assert_eq!(problem["title"], "Conflict");
    // The key stays with the service (a key function may build it from
    // what only the service should see); the answer says what to do.
    let detail = problem["detail"].as_str().unwrap();
    assert!(
        !detail.contains("order:7") && detail.contains("retry later"),
        "{detail}"
    );
    assert_eq!(
        gauge.runs.load(Ordering::SeqCst),
        0,
        "the handler ran without the lock"
    );

    // Another order is free meanwhile.
    let r = send(http.post(format!("{base}/orders/8/pay"))).await;
    assert_eq!(r.status(), StatusCode::OK);

    // 423 when chosen.
    let locked = LockLayer::new(client.clone())
        .key("order:<id>")
        .busy_status(StatusCode::LOCKED);
    let base423 = serve(pay_app(locked, gauge.clone(), Duration::ZERO)).await;
    let r = send(http.post(format!("{base423}/orders/7/pay"))).await;
    assert_eq!(r.status(), StatusCode::LOCKED);
    assert!(r.headers().contains_key("retry-after"));

    holder.release().await.unwrap();
    let r = send(http.post(format!("{base}/orders/7/pay"))).await;
    assert_eq!(r.status(), StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pays_on_different_orders_run_in_parallel() {
    let server = RedisServer::start();
    for client in [redis_client(&server).await, memory_client().await] {
        let n = 4;
        // Every handler waits for all the others: this only completes if the
        // four pays run at the same time.
        let barrier = Arc::new(Barrier::new(n));
        let app = Router::new()
            .route(
                "/orders/{id}/pay",
                post(move |lock: LockInfo| {
                    let barrier = barrier.clone();
                    async move {
                        tokio::time::timeout(secs(10), barrier.wait())
                            .await
                            .expect("the pays were serialized");
                        lock.key
                    }
                }),
            )
            .route_layer(LockLayer::new(client).key("order:<id>"));
        let base = serve(app).await;
        let http = reqwest::Client::new();
        let replies = futures_util::future::join_all((0..n).map(|i| {
            let http = http.clone();
            let url = format!("{base}/orders/{i}/pay");
            async move { send(http.post(url)).await }
        }))
        .await;
        for (i, r) in replies.into_iter().enumerate() {
            assert_eq!(r.status(), StatusCode::OK);
            assert_eq!(r.text().await.unwrap(), format!("order:{i}"));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_run_to_completion_a_client_disconnect_mid_handler_cancels_it_and_releases_the_lock()
 {
    let server = RedisServer::start();
    let client = redis_client(&server).await;
    // A long lease: getting the lock back soon proves a release, not an expiry.
    let (app, started, finished) = slow_pay_app(&client, secs(30), secs(30), false);
    let base = serve(app).await;

    // A raw connection, so that dropping it is exactly a client going away.
    let conn = raw_request(
        &base,
        "POST /orders/5/pay HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n",
    );
    within(secs(5), "the handler's start", started.notified()).await;
    assert!(is_held(&client, "order:5").await);
    let dropped = Instant::now();
    drop(conn);

    let what = "the lock is released after the client went away";
    let handover = taken_after(dropped, &client, "order:5", secs(10), what).await;
    println!("lock free again {handover:?} after the client disconnected");
    assert!(handover < secs(10), "{handover:?}");
    assert_eq!(
        finished.load(Ordering::SeqCst),
        0,
        "the handler was not cancelled"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_response_holds_the_lock_until_the_body_ends() {
    let server = RedisServer::start();
    let client = redis_client(&server).await;
    let (app, chunks_tx) = report_app(LockLayer::new(client.clone()).key("order:<id>"));
    let base = serve(app).await;
    let http = reqwest::Client::new();

    let mut streaming = send(http.post(format!("{base}/orders/9/report"))).await;
    assert_eq!(streaming.status(), StatusCode::OK);
    chunks_tx
        .send(Bytes::from_static(b"part 1;"))
        .await
        .unwrap();
    assert_eq!(streaming.chunk().await.unwrap().unwrap(), "part 1;");

    // The handler has returned, but its body is still streaming: still locked.
    let r = send(http.post(format!("{base}/orders/9/report"))).await;
    assert_eq!(r.status(), StatusCode::CONFLICT);
    assert!(is_held(&client, "order:9").await);

    chunks_tx
        .send(Bytes::from_static(b"part 2;"))
        .await
        .unwrap();
    assert_eq!(streaming.chunk().await.unwrap().unwrap(), "part 2;");
    drop(chunks_tx); // end of stream
    assert!(streaming.chunk().await.unwrap().is_none());

    // Released before the end of the body reached the client: free at once.
    let guard = client
        .lock("order:9")
        .acquire()
        .await
        .expect("the lock outlived the response body");
    guard.release().await.unwrap();
    let r = send(http.post(format!("{base}/orders/9/report"))).await;
    assert_eq!(r.status(), StatusCode::OK);
    // The third holder; the first two never asked for a token, so this is
    // the first one minted for the key.
    assert_eq!(r.text().await.unwrap(), "token 1");
}

/// `POST /orders/{id}/report` under `layer`: the first request streams what
/// the test sends on the returned channel; later ones answer `token <fence>`.
fn report_app(layer: LockLayer) -> (Router, mpsc::Sender<Bytes>) {
    let (chunks_tx, chunks_rx) = mpsc::channel::<Bytes>(4);
    let app = Router::new()
        .route("/orders/{id}/report", post(report))
        .route_layer(layer)
        .with_state(Arc::new(tokio::sync::Mutex::new(Some(chunks_rx))));
    (app, chunks_tx)
}

/// [`report_app`]'s handler: the channel's stream while the channel is
/// still there to take.
async fn report(
    State(chunks_rx): State<Arc<tokio::sync::Mutex<Option<mpsc::Receiver<Bytes>>>>>,
    lock: LockInfo,
) -> Body {
    match chunks_rx.lock().await.take() {
        Some(rx) => Body::from_stream(tokio_stream_from(rx).map(Ok::<_, Infallible>)),
        None => Body::from(format!("token {}", lock.fencing_token().await.unwrap())),
    }
}

fn tokio_stream_from(mut rx: mpsc::Receiver<Bytes>) -> impl futures_util::Stream<Item = Bytes> {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_answers_503_unless_failing_open() {
    let mut server = RedisServer::start();
    let client = redis_client(&server).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let app = |layer: LockLayer| {
        let runs = runs.clone();
        Router::new()
            .route(
                "/orders/{id}/pay",
                post(move |lock: Option<LockInfo>| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    if lock.is_some() { "locked" } else { "unlocked" }
                }),
            )
            .route_layer(layer)
    };
    let closed = serve(app(LockLayer::new(client.clone()).key("order:<id>"))).await;
    let open = serve(app(LockLayer::new(client.clone())
        .key("order:<id>")
        .fail_open(true)))
    .await;
    let http = reqwest::Client::new();
    let r = send(http.post(format!("{closed}/orders/1/pay"))).await;
    assert_eq!(r.text().await.unwrap(), "locked");

    server.kill();
    let started = Instant::now();
    let r = send(http.post(format!("{closed}/orders/1/pay"))).await;
    println!("503 after {:?}", started.elapsed());
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.headers()["retry-after"], "1");
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "fail closed ran the handler"
    );

    let r = send(http.post(format!("{open}/orders/1/pay"))).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.text().await.unwrap(), "unlocked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_whose_key_cannot_be_built_get_400() {
    let client = memory_client().await;
    let ok = || post(|lock: LockInfo| async move { lock.key });
    // Per-route layers: `Router::route_layer` would wrap the routes above it too.
    let app = Router::new()
        .route(
            "/accounts/debit",
            ok().route_layer(LockLayer::new(client.clone()).key_from_header("x-account")),
        )
        .route(
            "/jobs/{name}",
            ok().route_layer(LockLayer::new(client.clone()).key_fn(|req| {
                let name = req.uri.path().rsplit('/').next()?;
                (name != "forbidden").then(|| format!("job:{name}"))
            })),
        );
    let base = serve(app).await;
    let http = reqwest::Client::new();

    let r = send(
        http.post(format!("{base}/accounts/debit"))
            .header("x-account", "a-1"),
    )
    .await;
    assert_eq!(
        r.text().await.unwrap(),
        "header:/accounts/debit:x-account:a-1"
    );
    let r = send(http.post(format!("{base}/accounts/debit"))).await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    let r = send(
        http.post(format!("{base}/accounts/debit"))
            .header("x-account", "a")
            .header("x-account", "b"),
    )
    .await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);

    // (A template naming a parameter its route lacks is the server's
    // mistake: `500`, in http_lock_keys.rs.)

    let r = send(http.post(format!("{base}/jobs/nightly"))).await;
    assert_eq!(r.text().await.unwrap(), "job:nightly");
    let r = send(http.post(format!("{base}/jobs/forbidden"))).await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handler_sees_its_lock_and_a_nested_lock_of_the_same_key_re_enters() {
    let server = RedisServer::start();
    let client = redis_client(&server).await;
    let inner_client = client.clone();
    let app = Router::new()
        .route(
            "/orders/{id}/pay",
            post(move |Path(id): Path<u64>, lock: LockInfo| {
                let client = inner_client.clone();
                async move {
                    assert_eq!(lock_runtime::current_lock(), Some(lock.clone()));
                    // What a `#[distributed_lock(key = "order:<id>")]` service
                    // function does: lock the same key again, on the same client.
                    let nested = client
                        .lock(format!("order:{id}"))
                        .run(async {
                            lock_runtime::current_lock()
                                .unwrap()
                                .fencing_token()
                                .await
                                .unwrap()
                        })
                        .await
                        .expect("the nested lock did not re-enter");
                    assert_eq!(nested, lock.fencing_token().await.unwrap());
                    lock.fencing_token().await.unwrap().to_string()
                }
            }),
        )
        .route_layer(LockLayer::new(client.clone()).key("order:<id>"));
    let base = serve(app).await;
    let http = reqwest::Client::new();
    let mut last = 0;
    for _ in 0..3 {
        let r = send(http.post(format!("{base}/orders/3/pay"))).await;
        assert_eq!(r.status(), StatusCode::OK);
        let token: u64 = r.text().await.unwrap().parse().unwrap();
        assert!(
            token > last,
            "fencing tokens must increase: {token} after {last}"
        );
        last = token;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_lost_mid_handler_cancels_it_with_503() {
    let client = memory_client().await;
    let (app, started, finished) = slow_pay_app(&client, ms(300), secs(5), true);
    let base = serve(app).await;
    let request = tokio::spawn(async move {
        reqwest::Client::new()
            .post(format!("{base}/orders/1/pay"))
            .send()
            .await
            .unwrap()
    });
    started.notified().await;
    // An operator deletes the lock: the next renewal finds it gone.
    force_delete(&client, "order:1").await.unwrap();
    let r = tokio::time::timeout(secs(3), request)
        .await
        .expect("the handler was not cancelled")
        .unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    // The key stays in the service's log: one made from a request's values
    // may name what only the service should see.
    let body = r.text().await.unwrap();
    assert!(
        !body.contains("order:1"),
        "the key reached the client: {body}"
    );
    assert!(body.contains("lock was lost"), "{body}");
    assert_eq!(finished.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn back_to_back_requests_find_the_lock_free() {
    const N: u32 = 100;
    let server = RedisServer::start();
    let client = redis_client(&server).await;
    // The lock is released before the response completes, so a client's next
    // request never races the release of its previous one.
    let app = Router::new()
        .route(
            "/orders/{id}/pay",
            post(|| async { "paid" }).route_layer(LockLayer::new(client.clone()).key("order:<id>")),
        )
        .route(
            "/orders/{id}/touch",
            post(|| async {}).route_layer(LockLayer::new(client.clone()).key("order:<id>")),
        );
    let base = serve(app).await;
    let http = reqwest::Client::new();
    let started = Instant::now();
    for i in 0..N {
        let action = if i % 2 == 0 { "pay" } else { "touch" };
        let r = send(http.post(format!("{base}/orders/1/{action}"))).await;
        assert_eq!(r.status(), StatusCode::OK, "request {i} ({action})");
        r.bytes().await.unwrap();
    }
    // About 0.5 ms each here. A response split into head and body around
    // the release would stall on Nagle's algorithm and delayed ACKs (40 ms).
    let each = started.elapsed() / N;
    println!("{each:?} per locked request");
    assert!(each < ms(20), "{each:?} per request");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_body_dropped_by_the_client_releases_the_lock() {
    let server = RedisServer::start();
    let client = redis_client(&server).await;
    let layer = LockLayer::new(client.clone())
        .key("order:<id>")
        .ttl(secs(30));
    let (app, chunks_tx) = report_app(layer);
    let base = serve(app).await;
    let mut streaming = send(reqwest::Client::new().post(format!("{base}/orders/2/report"))).await;
    chunks_tx.send(Bytes::from_static(b"part 1")).await.unwrap();
    assert_eq!(streaming.chunk().await.unwrap().unwrap(), "part 1");
    assert!(is_held(&client, "order:2").await);
    drop(streaming);
    let what = "the lock is released with the abandoned body";
    taken_after(Instant::now(), &client, "order:2", secs(10), what).await;
}

/// Both layers' services give their inner service back, and print as what
/// they are.
#[tokio::test]
async fn the_layers_services_give_access_to_the_wrapped_service() {
    use tower::Layer;

    #[derive(Debug)]
    struct Inner(u32);

    // The two services share these accessors but no trait.
    macro_rules! check_accessors {
        ($service:expr, $debug:literal) => {{
            let mut service = $service;
            service.get_mut().0 += 1;
            assert_eq!(service.get_ref().0, 2);
            let shown = format!("{service:?}");
            assert!(shown.starts_with($debug), "{shown}");
            assert_eq!(service.into_inner().0, 2);
        }};
    }
    let client = memory_client().await;
    let lock = LockLayer::new(client.clone()).key("order:{id}");
    check_accessors!(lock.layer(Inner(1)), "Lock { inner: Inner(2)");
    let idempotent = lock_runtime::IdempotencyLayer::new(client);
    check_accessors!(idempotent.layer(Inner(1)), "Idempotency { inner: Inner(2)");
}

/// A service that is no axum `Router` may answer with a body of its own
/// type (here `http_body_util`'s): the layer reads it in a box instead of
/// in place, and the lock is given back the same way. A complete body is
/// answered after the release; a body that may have more to send (a
/// stream, trailers) holds the lock until its end.
#[tokio::test]
async fn a_service_answering_with_a_body_of_its_own_type_is_locked_and_released_the_same() {
    use http_body_util::{BodyExt, Full, StreamBody};
    use tower::{Layer, ServiceExt};

    let client = memory_client().await;
    let layer = LockLayer::new(client.clone()).key_fn(|_| Some("report".to_string()));
    let request = || http::Request::new(Body::empty());

    let full = layer.layer(tower::service_fn(|_req: http::Request<Body>| async {
        Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from_static(b"done"))))
    }));
    let response = full.oneshot(request()).await.unwrap();
    assert!(
        !is_held(&client, "report").await,
        "answered before the release"
    );
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "done");

    let trailers_only = layer.layer(tower::service_fn(|_req: http::Request<Body>| async {
        let mut trailers = http::HeaderMap::new();
        trailers.insert("x-checksum", http::HeaderValue::from_static("0"));
        let body = http_body_util::Empty::<Bytes>::new()
            .with_trailers(std::future::ready(Some(Ok::<_, Infallible>(trailers))));
        Ok::<_, Infallible>(http::Response::new(body))
    }));
    let response = trailers_only.oneshot(request()).await.unwrap();
    let collected = response.into_body().collect().await.unwrap();
    assert_eq!(collected.trailers().unwrap()["x-checksum"], "0");
    assert!(
        !is_held(&client, "report").await,
        "held after the body's end"
    );

    let (tx, rx) = mpsc::channel::<Bytes>(1);
    let rx = Arc::new(std::sync::Mutex::new(Some(rx)));
    let streaming = layer.layer(tower::service_fn(move |_req: http::Request<Body>| {
        let rx = rx.lock().unwrap().take().unwrap();
        async move {
            let frames =
                tokio_stream_from(rx).map(|b| Ok::<_, Infallible>(http_body::Frame::data(b)));
            Ok::<_, Infallible>(http::Response::new(StreamBody::new(frames)))
        }
    }));
    let mut body = streaming.oneshot(request()).await.unwrap().into_body();
    tx.send(Bytes::from_static(b"part 1")).await.unwrap();
    let first = body.frame().await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap(), "part 1");
    assert!(
        is_held(&client, "report").await,
        "released while the body streams"
    );
    drop(tx);
    assert!(body.frame().await.is_none());
    assert!(
        !is_held(&client, "report").await,
        "held after the body's end"
    );
}

/// A graceful shutdown waits for the layer's tracker, then the process
/// exits: a handler whose client went away was finished by a task of its
/// own, and that task released the lock before the tracker let the
/// shutdown go on, so the key is free at once, not after its 30 s lease.
#[test]
fn a_handler_finished_for_a_client_that_went_away_has_released_its_lock_when_the_tracker_is_done() {
    use lock_runtime::layer::TaskTracker;
    use tower::{Layer, ServiceExt};

    let server = RedisServer::start();
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    };
    let serving = runtime();
    serving.block_on(async {
        let client = redis_client(&server).await;
        let handlers = TaskTracker::new();
        let layer = LockLayer::new(client)
            .key_fn(|_| Some("order:shutdown".to_string()))
            .task_tracker(handlers.clone());
        let pay = layer.layer(tower::service_fn(|_req: http::Request<Body>| async {
            tokio::time::sleep(ms(300)).await;
            Ok::<_, Infallible>(http::Response::new(Body::empty()))
        }));
        let call = pay.oneshot(http::Request::new(Body::empty()));
        // The client gives up mid-handler.
        assert!(tokio::time::timeout(ms(100), call).await.is_err());
        handlers.close();
        within(secs(5), "the handler's task ends", handlers.wait()).await;
    });
    // The process exits: whatever was left to the background goes with it.
    drop(serving);
    runtime().block_on(async {
        let client = redis_client(&server).await;
        assert!(
            !is_held(&client, "order:shutdown").await,
            "the lock outlived the shutdown"
        );
    });
}
