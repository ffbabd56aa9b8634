//! `IdempotencyLayer` when things fail: a handler that panics, a client that
//! disconnects, a handler that outlives its lease, a process that crashes,
//! Redis down and bodies too large. Served on a loopback port, driven by a
//! real HTTP client.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use lock_runtime::layer::IdempotencyLayer;
use serde_json::json;
use test_support::RedisServer;
use test_support::helpers::{ms, one_worker_runtime, redis_client, redis_url_client, secs, within};
use test_support::http::{raw_request, serve};
use tokio::sync::Notify;

mod http_idempotency_common;
use http_idempotency_common::*;

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

/// The store paused for longer than the record's lease: once it answers
/// again the record is not ours (expired, or taken by the duplicate sent
/// then), and the first handler, which a duplicate may run now, is
/// cancelled (`503`) instead of finishing beside it: the work is done once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_whose_record_is_lost_is_cancelled() {
    let server = RedisServer::start();
    let client = redis_client(&server).await;
    let (started, finished) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let handler = {
        let (started, finished) = (started.clone(), finished.clone());
        move || {
            let (started, finished) = (started.clone(), finished.clone());
            async move {
                let n = started.fetch_add(1, Ordering::SeqCst) + 1;
                tokio::time::sleep(ms(2_500)).await;
                finished.fetch_add(1, Ordering::SeqCst);
                (StatusCode::CREATED, format!("run {n}"))
            }
        }
    };
    let layer = IdempotencyLayer::new(client).ttl(ms(600));
    let api = Api::route("/orders", post(handler), layer).await;
    let send = || api.post("/orders", "\"lost\"").send();
    let first = tokio::spawn(send());
    tokio::time::sleep(ms(200)).await;
    server.pause().unwrap();
    tokio::time::sleep(ms(1_500)).await;
    server.resume().unwrap();
    let first = first.await.unwrap().unwrap();
    assert_eq!(first.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(first.headers().contains_key("retry-after"));
    let again = until_created(
        send,
        StatusCode::CONFLICT,
        (secs(10), ms(50)),
        "the retry runs",
    )
    .await;
    assert_eq!(again.text().await.unwrap(), "run 2");
    assert_eq!(started.load(Ordering::SeqCst), 2);
    assert_eq!(
        finished.load(Ordering::SeqCst),
        1,
        "the lost run finished too"
    );
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
