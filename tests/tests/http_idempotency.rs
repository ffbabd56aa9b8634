//! `IdempotencyLayer` on an axum app served on a loopback port, driven by a
//! real HTTP client, against a real redis-server and the embedded backend:
//! which requests run the handler once and which get the stored response
//! (replays, 422, 400, what is stored and what is not, JSON fingerprints,
//! records per principal). Failures are in `http_idempotency_failures.rs`,
//! Redlock in `http_idempotency_redlock.rs`, killed connections in
//! `http_idempotency_lost_replies.rs`; what they share in
//! `http_idempotency_common/`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::http::{StatusCode, header};
use axum::routing::post;
use lock_runtime::layer::IdempotencyLayer;
use lock_runtime::layer::idempotency::StoreResponse;
use serde_json::{Value, json};
use test_support::RedisServer;
use test_support::helpers::{memory_client, ms, redis_client, secs};
use test_support::http::send;

mod http_idempotency_common;
use http_idempotency_common::*;

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

/// A response whose body fails after the storage limit could not be
/// produced, as one that fails within it: its record is released, and the
/// retry runs the request (not `410`, "completed", for a day).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_that_fails_past_the_storage_limit_is_not_recorded_as_completed() {
    let server = RedisServer::start();
    for (backend, client) in clients(&server).await {
        let runs = Arc::new(AtomicUsize::new(0));
        let handler = {
            let runs = runs.clone();
            move || {
                let runs = runs.clone();
                async move {
                    let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                    // Three chunks past a limit of 1,000 bytes, then a failure
                    // (on the first run only).
                    let chunks = (0..4).map(move |i| match i {
                        3 if n == 1 => Err(std::io::Error::other("the report broke")),
                        3 => Ok(bytes::Bytes::new()),
                        _ => Ok(bytes::Bytes::from(vec![b'r'; 600])),
                    });
                    axum::body::Body::from_stream(futures_util::stream::iter(chunks))
                }
            }
        };
        let layer = IdempotencyLayer::new(client).max_response_body(1000);
        let app = Router::new().route("/reports", post(handler).route_layer(layer));
        let api = Api::serve(app).await;
        let send = || api.post("/reports", "\"failing\"").send();
        // The connection is cut: before the head reached the client, or
        // within the body.
        if let Ok(first) = send().await {
            let body = first.bytes().await;
            assert!(body.is_err(), "{backend}: the body did not fail");
        }
        // Released in the background: the retry runs it again (sent again
        // on a connection of its own if the failed one was reused).
        let mut again = None;
        for _ in 0..50 {
            match send().await {
                Ok(r) if r.status() != StatusCode::CONFLICT => {
                    again = Some(r);
                    break;
                }
                _ => tokio::time::sleep(ms(20)).await,
            }
        }
        let again = again.expect("the retry was refused for a second");
        assert_eq!(again.status(), StatusCode::OK, "{backend}");
        assert!(!is_replay(again.headers()), "{backend}");
        assert_eq!(again.bytes().await.unwrap().len(), 1800, "{backend}");
        assert_eq!(runs.load(Ordering::SeqCst), 2, "{backend}");
        // That one ended: completed, as too large to replay.
        let last = send().await.unwrap();
        assert_eq!(last.status(), StatusCode::GONE, "{backend}");
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

/// A response that ends with trailers reaches its first client with them
/// (chunked, as without the layer): the buffered body does not claim an
/// exact length, which would make the server send `Content-Length` and
/// drop the trailers. Replays have none (only the status, the kept headers
/// and the body are stored).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trailers_reach_the_first_client() {
    use http_body_util::StreamBody;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = RedisServer::start();
    for (backend, client) in clients(&server).await {
        let handler = || async {
            let mut trailers = axum::http::HeaderMap::new();
            trailers.insert("x-checksum", "abc123".parse().unwrap());
            let frames = [
                Ok::<_, std::io::Error>(http_body::Frame::data(bytes::Bytes::from("hello"))),
                Ok(http_body::Frame::trailers(trailers)),
            ];
            (
                [(header::TRAILER, "x-checksum")],
                axum::body::Body::new(StreamBody::new(futures_util::stream::iter(frames))),
            )
        };
        let layer = IdempotencyLayer::new(client);
        let api = Api::serve(Router::new().route("/t", post(handler).route_layer(layer))).await;
        let addr = api.base.trim_start_matches("http://").to_owned();
        let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let request = "POST /t HTTP/1.1\r\nHost: x\r\nIdempotency-Key: \"t1\"\r\nTE: trailers\r\n\
                       Content-Length: 0\r\nConnection: close\r\n\r\n";
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        let response = response.to_lowercase();
        assert!(
            response.starts_with("http/1.1 200"),
            "{backend}: {response}"
        );
        assert!(response.contains("hello"), "{backend}: {response}");
        assert!(
            response.contains("x-checksum: abc123"),
            "{backend}: no trailers: {response}"
        );
    }
}
