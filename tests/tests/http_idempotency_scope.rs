//! Idempotency records belong to their caller: by default, requests whose
//! credentials (`Authorization`, cookies) differ never share a record, on the
//! embedded backend, one Redis and a Cluster. And to their method and route:
//! a key reused on another route or with another method is a record of its
//! own, while on its own route another path, query or body is a reuse
//! (`422`).

mod layers_common;

use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use layers_common::{Backends, Charges, charge, is_replay};
use lock_runtime::layer::IdempotencyLayer;
use serde_json::{Value, json};
use test_support::helpers::memory_client;
use test_support::http::serve;

/// `POST /charges` ([`charge`] on `charges`) under `layer`; the URL.
async fn charges_url(layer: IdempotencyLayer, charges: &Charges) -> String {
    let route = post(charge).with_state(charges.clone()).route_layer(layer);
    format!(
        "{}/charges",
        serve(Router::new().route("/charges", route)).await
    )
}

/// `POST url` with the key `"shared"`, the same body for everyone, and
/// `header: value`: the response's status, whether it is a replay, and
/// the charge it names.
async fn charge_as(url: &str, header: &str, value: &str) -> (StatusCode, bool, u64) {
    let r = reqwest::Client::new()
        .post(url)
        .header("idempotency-key", "\"shared\"")
        .header(header, value)
        .json(&json!({ "amount_cents": 1250 }))
        .send()
        .await
        .unwrap();
    let (status, replay) = (r.status(), is_replay(r.headers()));
    let body: Value = r.json().await.unwrap();
    (status, replay, body["charge"].as_u64().unwrap())
}

const CREATED: StatusCode = StatusCode::CREATED;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_bearer_tokens_never_share_a_record_and_each_replays_only_its_own() {
    let backends = Backends::start();
    let (alice, bob) = ("Bearer alice-secret-token", "Bearer bob-secret-token");
    for (name, client) in backends.clients().await {
        let charges = Charges::taking(Duration::ZERO);
        let url = charges_url(IdempotencyLayer::new(client), &charges).await;
        let auth = "authorization";
        assert_eq!(
            charge_as(&url, auth, alice).await,
            (CREATED, false, 1),
            "{name}: Alice's charge runs"
        );
        assert_eq!(
            charge_as(&url, auth, bob).await,
            (CREATED, false, 2),
            "{name}: Bob's runs too, not a replay of Alice's"
        );
        assert_eq!(
            charge_as(&url, auth, alice).await,
            (CREATED, true, 1),
            "{name}: Alice gets her own"
        );
        assert_eq!(
            charge_as(&url, auth, bob).await,
            (CREATED, true, 2),
            "{name}: Bob gets his own"
        );
        assert_eq!(charges.started(), 2, "{name}");
    }
    // Neither token is anywhere in Redis (the scope is a hash, inside the
    // record's name, itself a hash).
    let server = backends.server();
    let keys = server.cli(&["--scan"]);
    assert!(!keys.trim().is_empty(), "the records are on this server");
    for key in keys.lines() {
        let contents = match server.cli(&["TYPE", key]).trim() {
            "hash" => server.cli(&["HGETALL", key]),
            "string" => server.cli(&["GET", key]),
            _ => String::new(),
        };
        for secret in ["alice-secret", "bob-secret"] {
            assert!(
                !key.contains(secret) && !contents.contains(secret),
                "{key}: {contents}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_cookies_scope_records_too_and_a_set_scope_overrides_the_default() {
    let client = memory_client().await;
    let charges = Charges::default();
    let url = charges_url(IdempotencyLayer::new(client.clone()), &charges).await;
    let (a, b) = ("session=a1; theme=dark", "session=b2; theme=dark");
    assert_eq!(charge_as(&url, "cookie", a).await, (CREATED, false, 1));
    assert_eq!(charge_as(&url, "cookie", b).await, (CREATED, false, 2));
    // The same cookies in another order are the same caller.
    assert_eq!(
        charge_as(&url, "cookie", "theme=dark; session=a1").await,
        (CREATED, true, 1)
    );

    // A scope set by the application wins: here the user, whatever token.
    let charges = Charges::default();
    let layer = IdempotencyLayer::new(client).scope(|req| {
        let user = req.headers.get("x-user").and_then(|v| v.to_str().ok());
        user.unwrap_or("").to_owned()
    });
    let url = charges_url(layer, &charges).await;
    let r = reqwest::Client::new()
        .post(&url)
        .header("idempotency-key", "\"shared\"")
        .header("x-user", "carol")
        .header("authorization", "Bearer old-token")
        .json(&json!({ "amount_cents": 1250 }))
        .send()
        .await
        .unwrap();
    assert_eq!((r.status(), is_replay(r.headers())), (CREATED, false));
    let r = reqwest::Client::new()
        .post(&url)
        .header("idempotency-key", "\"shared\"")
        .header("x-user", "carol")
        .header("authorization", "Bearer refreshed-token")
        .json(&json!({ "amount_cents": 1250 }))
        .send()
        .await
        .unwrap();
    assert_eq!((r.status(), is_replay(r.headers())), (CREATED, true));
    assert_eq!(charges.started(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_shared_by_all_callers_hands_one_callers_response_to_another() {
    let client = memory_client().await;
    let charges = Charges::default();
    let layer = IdempotencyLayer::new(client).records_shared_by_all_callers();
    let url = charges_url(layer, &charges).await;
    let auth = "authorization";
    assert_eq!(
        charge_as(&url, auth, "Bearer alice").await,
        (CREATED, false, 1)
    );
    assert_eq!(
        charge_as(&url, auth, "Bearer bob").await,
        (CREATED, true, 1)
    );
    assert_eq!(charges.started(), 1);
}

/// `PUT`/`POST` on one route and `POST` on another with one key: three
/// records, each run once; on the first route another path or query with
/// that key is `422`, as is another body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_is_scoped_by_method_and_route_and_reused_within_one_gets_422() {
    let client = memory_client().await;
    let charges = Charges::default();
    let layer = IdempotencyLayer::new(client);
    let app = Router::new()
        .route(
            "/charges/{id}",
            post(charge).put(charge).route_layer(layer.clone()),
        )
        .route("/refunds", post(charge).route_layer(layer))
        .with_state(charges.clone());
    let base = serve(app).await;
    let send = async |method: reqwest::Method, path: &str, amount: u64| {
        let r = reqwest::Client::new()
            .request(method, format!("{base}{path}"))
            .header("idempotency-key", "\"reused\"")
            .json(&json!({ "amount_cents": amount }))
            .send()
            .await
            .unwrap();
        (r.status(), is_replay(r.headers()))
    };
    use reqwest::Method;
    let created = (CREATED, false);
    assert_eq!(send(Method::POST, "/charges/1", 100).await, created);
    assert_eq!(
        send(Method::PUT, "/charges/1", 100).await,
        created,
        "another method"
    );
    assert_eq!(
        send(Method::POST, "/refunds", 100).await,
        created,
        "another route"
    );
    assert_eq!(charges.started(), 3);

    let reused = (StatusCode::UNPROCESSABLE_ENTITY, false);
    assert_eq!(
        send(Method::POST, "/charges/2", 100).await,
        reused,
        "another path"
    );
    assert_eq!(
        send(Method::POST, "/charges/1?x=1", 100).await,
        reused,
        "another query"
    );
    assert_eq!(
        send(Method::POST, "/charges/1", 200).await,
        reused,
        "another body"
    );
    assert_eq!(send(Method::POST, "/charges/1", 100).await, (CREATED, true));
    assert_eq!(charges.started(), 3, "nothing ran again");
}
