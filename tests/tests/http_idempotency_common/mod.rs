//! What the `http_idempotency*` suites share: both backends, an order handler
//! that counts its runs, an app served on a loopback port with its HTTP
//! client, and readers of its answers.

#![allow(dead_code)] // each test file uses its own part of it

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::{MethodRouter, post};
use axum::{Json, Router};
use lock_runtime::LockClient;
use lock_runtime::layer::IdempotencyLayer;
use serde_json::{Value, json};
use test_support::RedisServer;
use test_support::helpers::{memory_client, redis_client, short_timeout_client};
use test_support::http::{send, serve};
use test_support::topology::{Redlock, Topology};

/// Both backends: the same semantics are expected of each.
pub async fn clients(server: &RedisServer) -> [(&'static str, LockClient); 2] {
    [
        ("redis", redis_client(server).await),
        ("memory", memory_client().await),
    ]
}

#[derive(Clone, Default)]
pub struct Orders {
    pub runs: Arc<AtomicUsize>,
    pub work: Duration,
}

impl Orders {
    /// Orders whose handler takes `work`.
    pub fn taking(work: Duration) -> Self {
        Self {
            work,
            ..Self::default()
        }
    }
}

/// `POST /orders`: creates order N (N = how many times the handler ran).
pub async fn create_order(
    State(orders): State<Orders>,
    Json(body): Json<Value>,
) -> impl IntoResponse {
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
pub struct Api {
    pub http: reqwest::Client,
    pub base: String,
}

impl Api {
    pub async fn serve(app: Router) -> Self {
        let base = serve(app).await;
        Self {
            http: reqwest::Client::new(),
            base,
        }
    }

    /// Serves `route` at `path` under `layer`.
    pub async fn route(path: &str, route: MethodRouter, layer: IdempotencyLayer) -> Self {
        Self::serve(Router::new().route(path, route.route_layer(layer))).await
    }

    /// Serves `POST /orders` ([`create_order`] on `orders`) under `layer`.
    pub async fn orders(layer: IdempotencyLayer, orders: &Orders) -> Self {
        let route = post(create_order).with_state(orders.clone());
        Self::route("/orders", route, layer).await
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// `POST {path}` with the idempotency key `key` (the header's value,
    /// quotes included).
    pub fn post(&self, path: &str, key: &str) -> reqwest::RequestBuilder {
        self.http
            .post(self.url(path))
            .header("idempotency-key", key)
    }

    /// `POST /orders` with the idempotency key `key` and `{"item": item}`.
    pub fn order(&self, key: &str, item: &str) -> reqwest::RequestBuilder {
        self.post("/orders", key).json(&json!({ "item": item }))
    }

    /// `POST /orders` with the idempotency key `key` and the JSON `body`.
    pub async fn post_order(&self, key: &str, body: &Value) -> reqwest::Response {
        send(self.post("/orders", key).json(body)).await
    }
}

pub fn is_replay(headers: &HeaderMap) -> bool {
    headers
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true")
}

/// A response's status and whether it is a replay.
pub fn answer(r: &reqwest::Response) -> (StatusCode, bool) {
    (r.status(), is_replay(r.headers()))
}

/// A handler counting its runs in `runs`: its n-th run (from 1) answers
/// `reply(n)`.
pub fn counting<Fut>(
    runs: &Arc<AtomicUsize>,
    reply: impl Fn(usize) -> Fut + Clone + Send + Sync + 'static,
) -> impl Fn() -> Fut + Clone + Send + Sync + 'static {
    let runs = runs.clone();
    move || reply(runs.fetch_add(1, Ordering::SeqCst) + 1)
}

/// Sends `request()` every `every` until it answers `201` (returned), each
/// answer before being `refusal` and none a replay; fails after `limit`
/// saying `what` did not happen.
pub async fn until_created<F>(
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

pub async fn redlock_client(masters: &Redlock) -> LockClient {
    short_timeout_client(masters.builder()).await
}
