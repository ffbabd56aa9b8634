//! The layer's own unit tests (its behaviour end to end is in `tests/tests/http_idempotency*.rs`).

use std::future::poll_fn;

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use tower_service::Service;

use super::IdempotencyLayer;
use crate::client::LockClient;

fn tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

/// Posts to `/orders` with `key`; the status and the body.
async fn post_with(app: &Router, key: &str) -> (StatusCode, String) {
    let mut app = app.clone();
    poll_fn(|cx| Service::<Request<Body>>::poll_ready(&mut app, cx))
        .await
        .unwrap();
    let request = Request::post("/orders")
        .header("idempotency-key", format!("\"{key}\""))
        .body(Body::empty())
        .unwrap();
    let response = app.call(request).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn a_claimed_request_whose_client_waits_runs_its_handler_without_a_task() {
    let client = LockClient::builder().memory().build().await.unwrap();
    // The handler answers with the number of tasks alive while it runs.
    let app = Router::new()
        .route("/orders", post(|| async { tasks().to_string() }))
        .route_layer(IdempotencyLayer::new(client));
    // The first request starts what lives as long as the client (the watchdog).
    post_with(&app, "warm-up").await;
    let before = tasks();
    let (status, during) = post_with(&app, "order-1").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        during,
        before.to_string(),
        "the handler ran in a task of its own"
    );
    // Its response was stored: a retry gets it, and nothing runs again.
    assert_eq!(post_with(&app, "order-1").await, (StatusCode::OK, during));
    assert_eq!(tasks(), before, "a task outlived the request");
}
