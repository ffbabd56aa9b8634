//! What the layer tests share: every backend a layer runs on, a handler that
//! counts its starts and finishes, and answers read from a response.

#![allow(dead_code)] // each test file uses its own part of it

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use lock_runtime::LockClient;
use serde_json::json;
use test_support::RedisServer;
use test_support::helpers::{memory_client, redis_client, short_timeout_client};
use test_support::topology::{Cluster, Topology};

/// The embedded backend, one redis-server and a 3-master Cluster, started
/// for one test and stopped when it is dropped.
pub struct Backends {
    server: RedisServer,
    cluster: Cluster,
}

impl Backends {
    /// Starts the servers (call on a multi-thread runtime).
    pub fn start() -> Self {
        tokio::task::block_in_place(|| Self {
            server: RedisServer::start(),
            cluster: Cluster::start(3),
        })
    }

    /// The single redis-server.
    pub fn server(&self) -> &RedisServer {
        &self.server
    }

    /// A fresh client of each backend, named.
    pub async fn clients(&self) -> Vec<(&'static str, LockClient)> {
        vec![
            ("memory", memory_client().await),
            ("redis", redis_client(&self.server).await),
            (
                "cluster",
                short_timeout_client(self.cluster.builder()).await,
            ),
        ]
    }
}

/// A handler's starts and finishes, and the most runs ever at once.
#[derive(Clone, Default)]
pub struct Charges {
    pub started: Arc<AtomicUsize>,
    pub finished: Arc<AtomicUsize>,
    running: Arc<AtomicUsize>,
    pub most_at_once: Arc<AtomicUsize>,
    pub work: Duration,
}

impl Charges {
    /// Charges whose handler takes `work`.
    pub fn taking(work: Duration) -> Self {
        Self {
            work,
            ..Self::default()
        }
    }

    pub fn started(&self) -> usize {
        self.started.load(Ordering::SeqCst)
    }

    pub fn finished(&self) -> usize {
        self.finished.load(Ordering::SeqCst)
    }

    pub fn most_at_once(&self) -> usize {
        self.most_at_once.load(Ordering::SeqCst)
    }
}

/// `POST`: the n-th charge (n counted from 1 at its start), `201` with
/// `{"charge": n}` after `work`.
pub async fn charge(State(charges): State<Charges>) -> impl IntoResponse {
    let n = charges.started.fetch_add(1, Ordering::SeqCst) + 1;
    let now = charges.running.fetch_add(1, Ordering::SeqCst) + 1;
    charges.most_at_once.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(charges.work).await;
    charges.running.fetch_sub(1, Ordering::SeqCst);
    charges.finished.fetch_add(1, Ordering::SeqCst);
    (StatusCode::CREATED, Json(json!({ "charge": n })))
}

/// Whether a response says it is a replay.
pub fn is_replay(headers: &HeaderMap) -> bool {
    headers
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true")
}

/// How many handlers run at once, and the most that ever did.
#[derive(Clone, Default)]
pub struct Gauge {
    pub now: Arc<AtomicUsize>,
    pub max: Arc<AtomicUsize>,
    pub runs: Arc<AtomicUsize>,
}

impl Gauge {
    /// A handler starts; it ends when the guard is dropped.
    pub fn enter(&self) -> GaugeGuard {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(now, Ordering::SeqCst);
        self.runs.fetch_add(1, Ordering::SeqCst);
        GaugeGuard(self.now.clone())
    }
}

/// A running handler, counted in its [`Gauge`] until dropped.
pub struct GaugeGuard(Arc<AtomicUsize>);

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
