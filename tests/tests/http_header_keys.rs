//! `LockLayer::key_from_header`: a key a client sends names only its own
//! route's locks (namespaced and escaped like a path value), so it cannot
//! take the lock another route's template uses; `key_from_trusted_header`
//! is the explicit opt-out. And a misconfigured `LockLayer` is refused when
//! the router is built, never answered with a `500` per request.

use std::panic::AssertUnwindSafe;

use axum::Router;
use axum::routing::post;
use http::StatusCode;
use lock_runtime::LockInfo;
use lock_runtime::layer::LockLayer;
use test_support::helpers::memory_client;
use test_support::http::{send, serve};

/// Answers with the key of the lock the request ran under.
fn lock_key() -> axum::routing::MethodRouter {
    post(|lock: LockInfo| async move { lock.key })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_key_cannot_take_the_lock_a_path_template_uses() {
    let client = memory_client().await;
    let app = Router::new()
        .route(
            "/items/{id}",
            lock_key().route_layer(LockLayer::new(client.clone()).key("item:<id>")),
        )
        .route(
            "/by-header",
            lock_key().route_layer(LockLayer::new(client.clone()).key_from_header("x-key")),
        )
        .route(
            "/other-by-header",
            lock_key().route_layer(LockLayer::new(client.clone()).key_from_header("x-key")),
        );
    let base = serve(app).await;
    let http = reqwest::Client::new();

    // While `/items/42` is locked, the header `item:42` names another lock.
    let held = client.lock("item:42").acquire().await.unwrap();
    let r = send(http.post(format!("{base}/items/42"))).await;
    assert_eq!(
        r.status(),
        StatusCode::CONFLICT,
        "the template's lock is held"
    );
    let r = send(
        http.post(format!("{base}/by-header"))
            .header("x-key", "item:42"),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    let key = r.text().await.unwrap();
    assert_eq!(key, "header:/by-header:x-key:item%3A42");
    assert!(
        client.inspect("item:42").await.unwrap().held,
        "still held by us"
    );

    // A request to the header's route cannot hold the template's lock
    // either: the header's value stays inside its own route's namespace.
    let own = client.lock(&key).acquire().await.unwrap();
    let r = send(
        http.post(format!("{base}/by-header"))
            .header("x-key", "item:42"),
    )
    .await;
    assert_eq!(
        r.status(),
        StatusCode::CONFLICT,
        "same route, same value: one lock"
    );
    let r = send(
        http.post(format!("{base}/other-by-header"))
            .header("x-key", "item:42"),
    )
    .await;
    assert_eq!(
        r.status(),
        StatusCode::OK,
        "another route's keys are its own"
    );
    assert_eq!(
        r.text().await.unwrap(),
        "header:/other-by-header:x-key:item%3A42"
    );
    own.release().await.unwrap();
    held.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_header_names_the_whole_key_as_it_is() {
    let client = memory_client().await;
    let app = Router::new().route(
        "/by-gateway",
        lock_key().route_layer(LockLayer::new(client.clone()).key_from_trusted_header("x-key")),
    );
    let base = serve(app).await;
    let http = reqwest::Client::new();
    let r = send(
        http.post(format!("{base}/by-gateway"))
            .header("x-key", " item:42 "),
    )
    .await;
    assert_eq!(r.text().await.unwrap(), "item:42");

    let held = client.lock("item:42").acquire().await.unwrap();
    let r = send(
        http.post(format!("{base}/by-gateway"))
            .header("x-key", "item:42"),
    )
    .await;
    assert_eq!(r.status(), StatusCode::CONFLICT);
    held.release().await.unwrap();
}

#[tokio::test]
async fn a_misconfigured_lock_layer_is_refused_when_the_router_is_built() {
    let client = memory_client().await;
    type Configure = fn(LockLayer) -> LockLayer;
    let mistakes: [(&str, &str, Configure); 5] = [
        ("LockLayer::key", "<id", |l| l.key("order:<id")),
        ("LockLayer::key", "field path", |l| l.key("order:<o.id>")),
        ("LockLayer::permits", "zero permits", |l| l.permits(0)),
        ("LockLayer::key_from_header", "header name", |l| {
            l.key_from_header("bad header")
        }),
        ("LockLayer::key_from_trusted_header", "header name", |l| {
            l.key_from_trusted_header("bad:header")
        }),
    ];
    for (setter, why, configure) in mistakes {
        let layer = LockLayer::new(client.clone());
        let refused = std::panic::catch_unwind(AssertUnwindSafe(|| configure(layer)));
        let payload = refused.expect_err(setter);
        let message = payload
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_default();
        assert!(message.starts_with(setter), "{setter}: {message}");
        assert!(message.contains(why), "{setter}: {message}");
    }
}
