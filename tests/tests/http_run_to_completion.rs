//! Handlers run to completion: a client that gives up mid-request (a
//! timeout, a dropped connection) neither cuts its handler off nor gets it run
//! twice by its retry, under `IdempotencyLayer` and `LockLayer`, on the
//! embedded backend, one Redis and a Cluster.

mod layers_common;

use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use layers_common::{Backends, Charges, charge, is_replay};
use lock_runtime::LockClient;
use lock_runtime::layer::{IdempotencyLayer, LockLayer};
use serde_json::{Value, json};
use test_support::RedisServer;
use test_support::helpers::{eventually, memory_client, ms, redis_client, secs};
use test_support::http::{raw_request, serve};

/// How long the charge takes, and how long a retry waits for its answer.
const WORK: Duration = Duration::from_millis(400);
const PATIENCE: Duration = Duration::from_millis(100);

/// Sends `request` and gives up on it, as a client that times out does, once
/// the handler has started (`charges` counts `started` starts): a fixed
/// client timeout may run out before the handler starts on a loaded machine,
/// and then nothing is cut off mid-handler.
async fn give_up_mid_handler(request: reqwest::RequestBuilder, charges: &Charges, started: usize) {
    let sent = tokio::spawn(request.send());
    eventually(secs(5), "the handler's start", || {
        charges.started() == started
    })
    .await;
    sent.abort();
    let outcome = sent.await;
    assert!(
        outcome
            .as_ref()
            .is_err_and(tokio::task::JoinError::is_cancelled),
        "the client gives up before the handler ends: {outcome:?}"
    );
}

/// `POST /charges` ([`charge`] on `charges`) under `layer`; the base URL.
async fn charges_app(layer: IdempotencyLayer, charges: &Charges) -> String {
    let route = post(charge).with_state(charges.clone()).route_layer(layer);
    serve(Router::new().route("/charges", route)).await
}

/// `POST /orders/{id}/pay` ([`charge`] on `charges`) under `layer`, locking
/// `order:<id>`; the base URL.
async fn pay_app(layer: LockLayer, charges: &Charges) -> String {
    let route = post(charge)
        .with_state(charges.clone())
        .route_layer(layer.key("order:<id>"));
    serve(Router::new().route("/orders/{id}/pay", route)).await
}

/// A `POST` to `url` with the idempotency key `key`, given up after `patience`.
async fn post_with_key(
    url: &str,
    key: &str,
    patience: Duration,
) -> reqwest::Result<reqwest::Response> {
    reqwest::Client::new()
        .post(url)
        .header("idempotency-key", key)
        .timeout(patience)
        .send()
        .await
}

/// [`post_with_key`] again every 20 ms while it answers 409 (in flight),
/// for up to `for_up_to`: a client's retry of a request that still runs, is
/// being stored, or whose record is being released in the background.
async fn post_while_in_flight(url: &str, key: &str, for_up_to: Duration) -> reqwest::Response {
    let started = std::time::Instant::now();
    loop {
        let r = post_with_key(url, key, secs(5)).await.unwrap();
        if r.status() != StatusCode::CONFLICT || started.elapsed() > for_up_to {
            return r;
        }
        tokio::time::sleep(ms(20)).await;
    }
}

/// Retries `url` with `key` while it answers `409` (the first request still
/// runs or is being stored); the first other answer, which must be the stored
/// response of charge 1.
async fn assert_replay_of_the_first(what: &str, url: &str, key: &str) {
    let r = post_while_in_flight(url, key, secs(3)).await;
    assert_eq!(
        r.status(),
        StatusCode::CREATED,
        "{what}: the retry after the handler ended"
    );
    assert!(is_replay(r.headers()), "{what}: the retry is a replay");
    let body: Value = r.json().await.unwrap();
    assert_eq!(
        body,
        json!({ "charge": 1 }),
        "{what}: the first run's response"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_times_out_and_retries_gets_its_first_run_not_a_second_one() {
    let backends = Backends::start();
    for (name, client) in backends.clients().await {
        let charges = Charges::taking(WORK);
        let base = charges_app(IdempotencyLayer::new(client), &charges).await;
        let url = format!("{base}/charges");
        let first = reqwest::Client::new()
            .post(&url)
            .header("idempotency-key", "\"pay-1\"");
        give_up_mid_handler(first, &charges, 1).await;
        // Retried at once, three times over, while the first still runs.
        for retry in 1..=3 {
            let r = post_with_key(&url, "\"pay-1\"", PATIENCE)
                .await
                .unwrap_or_else(|e| {
                    panic!("{name}: retry {retry} got no answer ({e}): the handler ran again")
                });
            assert_eq!(r.status(), StatusCode::CONFLICT, "{name}: retry {retry}");
            assert!(!is_replay(r.headers()));
        }
        eventually(secs(5), "the first charge's end", || {
            charges.finished() == 1
        })
        .await;
        assert_replay_of_the_first(name, &url, "\"pay-1\"").await;
        assert_eq!(
            (charges.started(), charges.finished()),
            (1, 1),
            "{name}: started and finished once"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_connection_does_not_cut_the_handler_off_and_its_retry_is_a_replay() {
    let backends = Backends::start();
    for (name, client) in backends.clients().await {
        let charges = Charges::taking(WORK);
        let base = charges_app(IdempotencyLayer::new(client), &charges).await;
        let url = format!("{base}/charges");
        let conn = raw_request(
            &base,
            "POST /charges HTTP/1.1\r\nhost: x\r\nidempotency-key: \"pay-2\"\r\ncontent-length: 0\r\n\r\n",
        );
        eventually(secs(5), "the handler's start", || charges.started() == 1).await;
        drop(conn);
        tokio::time::sleep(ms(50)).await;
        let r = post_with_key(&url, "\"pay-2\"", secs(5)).await.unwrap();
        assert_eq!(
            r.status(),
            StatusCode::CONFLICT,
            "{name}: a retry while it runs"
        );
        eventually(secs(5), "the charge's end", || charges.finished() == 1).await;
        assert_replay_of_the_first(name, &url, "\"pay-2\"").await;
        assert_eq!((charges.started(), charges.finished()), (1, 1), "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_handler_whose_client_gave_up_finishes_before_the_next_one_gets_the_lock() {
    let backends = Backends::start();
    for (name, client) in backends.clients().await {
        // A client that times out; the next request waits for the lock.
        let charges = Charges::taking(WORK);
        let base = pay_app(LockLayer::new(client.clone()).wait(secs(5)), &charges).await;
        let url = format!("{base}/orders/7/pay");
        let http = reqwest::Client::new();
        give_up_mid_handler(http.post(&url), &charges, 1).await;
        let second = http.post(&url).send().await.unwrap();
        assert_eq!(second.status(), StatusCode::CREATED, "{name}");
        assert_eq!(
            (
                charges.started(),
                charges.finished(),
                charges.most_at_once()
            ),
            (2, 2, 1),
            "{name}: both ran to their end, one at a time"
        );

        // A dropped connection; the next request is refused until the
        // handler ended, then gets the lock.
        let charges = Charges::taking(WORK);
        let base = pay_app(LockLayer::new(client), &charges).await;
        let url = format!("{base}/orders/8/pay");
        let conn = raw_request(
            &base,
            "POST /orders/8/pay HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n",
        );
        eventually(secs(5), "the handler's start", || charges.started() == 1).await;
        drop(conn);
        tokio::time::sleep(ms(50)).await;
        let r = http.post(&url).send().await.unwrap();
        assert_eq!(
            r.status(),
            StatusCode::CONFLICT,
            "{name}: still locked by the first"
        );
        eventually(secs(5), "the first handler's end", || {
            charges.finished() == 1
        })
        .await;
        let mut tries = 0;
        let r = loop {
            let r = http.post(&url).send().await.unwrap();
            if r.status() != StatusCode::CONFLICT || tries == 100 {
                break r;
            }
            tries += 1;
            tokio::time::sleep(ms(10)).await;
        };
        assert_eq!(
            r.status(),
            StatusCode::CREATED,
            "{name}: the lock after the first"
        );
        assert_eq!(
            (
                charges.started(),
                charges.finished(),
                charges.most_at_once()
            ),
            (2, 2, 1),
            "{name}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_locked_handler_answers_500_and_releases_the_lock() {
    let client = memory_client().await;
    let route = post(|| async {
        if true {
            panic!("the handler blows up (expected by the test)");
        }
    });
    let app = Router::new()
        .route("/orders/{id}/pay", route)
        .route("/orders/{id}/ok", post(|| async { "ok" }))
        .route_layer(LockLayer::new(client.clone()).key("order:<id>"));
    let base = serve(app).await;
    let http = reqwest::Client::new();
    let r = http
        .post(format!("{base}/orders/1/pay"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    // Released (in the background, as a dropped guard is): the key is free soon.
    let mut tries = 0;
    loop {
        let r = http
            .post(format!("{base}/orders/1/ok"))
            .send()
            .await
            .unwrap();
        if r.status() == StatusCode::OK {
            break;
        }
        assert_eq!(r.status(), StatusCode::CONFLICT);
        tries += 1;
        assert!(tries < 100, "the lock was not released");
        tokio::time::sleep(ms(10)).await;
    }
}

/// `run_to_completion(false)`: the handler is dropped with the connection,
/// so the retry runs it again (what the default prevents).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_run_to_completion_a_client_that_gives_up_cuts_its_handler_off() {
    let client: LockClient = memory_client().await;
    let charges = Charges::taking(WORK);
    let layer = IdempotencyLayer::new(client.clone()).run_to_completion(false);
    let base = charges_app(layer, &charges).await;
    let url = format!("{base}/charges");
    let first = reqwest::Client::new()
        .post(&url)
        .header("idempotency-key", "\"k\"");
    give_up_mid_handler(first, &charges, 1).await;
    // The server drops the handler, and its guard releases the record in
    // the background, once it sees the connection closed: a retry that
    // lands before that finds the record in flight (409), as it should.
    // Within a second it must run the handler again.
    let r = post_while_in_flight(&url, "\"k\"", secs(1)).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert!(!is_replay(r.headers()), "the retry ran the handler again");
    assert_eq!((charges.started(), charges.finished()), (2, 1));

    let charges = Charges::taking(WORK);
    let layer = LockLayer::new(client)
        .wait(secs(5))
        .run_to_completion(false);
    let base = pay_app(layer, &charges).await;
    let http = reqwest::Client::new();
    let url = format!("{base}/orders/1/pay");
    give_up_mid_handler(http.post(&url), &charges, 1).await;
    let r = http.post(&url).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(
        (charges.started(), charges.finished()),
        (2, 1),
        "the first was cut off"
    );
}

/// The likeliest cause of the non-2xx replays seen under `wrk`: a request cut
/// off while its claim was on the wire. The claim ran on Redis, nobody was
/// left to run the handler or release the record, and the key answered `409`
/// for a whole lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_dropped_while_claiming_does_not_leave_its_key_in_flight() {
    let server = RedisServer::start();
    let client = redis_client(&server).await;
    let charges = Charges::taking(Duration::ZERO);
    let layer = IdempotencyLayer::new(client).ttl(secs(30));
    let base = charges_app(layer, &charges).await;
    let url = format!("{base}/charges");
    // Once, so that the claim is one EVALSHA (the script is loaded).
    let r = post_with_key(&url, "\"warm-up\"", secs(5)).await.unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    // Redis holds the claim until the client has gone away.
    server.pause().unwrap();
    let conn = raw_request(
        &base,
        "POST /charges HTTP/1.1\r\nhost: x\r\nidempotency-key: \"cut\"\r\ncontent-length: 0\r\n\r\n",
    );
    tokio::time::sleep(ms(150)).await;
    drop(conn);
    tokio::time::sleep(ms(100)).await;
    server.resume().unwrap();
    // The claim runs once Redis resumes, and the dropped request's guard
    // releases it in the background right after: a retry that lands in
    // between still finds it in flight. Within a second it must run (the
    // old code answered 409 for the whole 30 s lease).
    let r = post_while_in_flight(&url, "\"cut\"", secs(1)).await;
    assert_eq!(
        (r.status(), is_replay(r.headers())),
        (StatusCode::CREATED, false),
        "the retry runs (the first never did), not 409 for the 30 s lease"
    );
    assert_eq!(charges.started(), 2);
}
