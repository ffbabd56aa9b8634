//! Fault scenario: clients that give up mid-request, under load, on single
//! Redis, Redlock, Sentinel and Cluster (FAULTS.md, "Clients that give up").
//!
//! Keys are posted 8 at a time. Each attempt's client waits a drawn time
//! (1-80 ms: cut off while the claim is on the wire, mid-handler, or not at
//! all), or every 5th attempt writes the request on a raw connection and
//! drops it after a drawn time; then it tries again at once with the same
//! `Idempotency-Key`, until an answer is a `2xx`, and then once more, which
//! must be a replay. The handler takes 20-60 ms and counts its starts and
//! finishes per key. The checks: no key's handler started twice; every
//! handler that started finished (none cut off with its client); every key
//! ended with its stored response replayed, naming the one run.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use futures_util::StreamExt;
use lock_runtime::LockClient;
use lock_runtime::layer::IdempotencyLayer;
use test_support::RedisServer;
use test_support::helpers::{ms, redis_client, secs, short_timeout_client};
use test_support::http::{raw_request, serve};
use test_support::topology::{Cluster, Redlock, SentinelSetup, Topology};

/// A number drawn from `seed` and `parts` (splitmix64), below `bound`.
fn draw(seed: u64, parts: &[u64], bound: u64) -> u64 {
    let mut x = seed;
    for p in parts {
        x = x.wrapping_add(*p).wrapping_add(0x9e37_79b9_7f4a_7c15);
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^= x >> 31;
    }
    x % bound
}

/// Per key: the handler's starts and finishes.
#[derive(Clone, Copy, Debug, Default)]
struct Runs {
    started: u32,
    finished: u32,
}

/// What one key's client saw.
#[derive(Debug, Default)]
struct Seen {
    attempts: u32,
    given_up: u32,
    conflicts: u32,
    /// The body of the first `2xx`, and of the replay after it.
    first: Option<String>,
    replay: Option<String>,
}

async fn giving_up(what: &str, client: LockClient, run_for: Duration) {
    const MAX_KEYS: usize = 100_000;
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let runs = Arc::new(Mutex::new(vec![Runs::default(); MAX_KEYS]));
    let handler = {
        let runs = runs.clone();
        move |headers: HeaderMap| {
            let runs = runs.clone();
            async move {
                let key: usize = headers["x-key"].to_str().unwrap().parse().unwrap();
                runs.lock().unwrap()[key].started += 1;
                tokio::time::sleep(ms(20 + draw(seed, &[key as u64, 7], 41))).await;
                runs.lock().unwrap()[key].finished += 1;
                (StatusCode::CREATED, format!("key {key} charged"))
            }
        }
    };
    let layer = IdempotencyLayer::new(client).ttl(secs(2));
    let base = serve(Router::new().route("/charges", post(handler).route_layer(layer))).await;
    let http = reqwest::Client::new();
    let started = Instant::now();
    let attempts = Arc::new(AtomicUsize::new(0));
    let mut seen: Vec<(usize, Seen)> = futures_util::stream::iter(0..MAX_KEYS)
        .take_while(|_| std::future::ready(started.elapsed() < run_for))
        .map(|key| {
            let (http, base, attempts) = (http.clone(), base.clone(), attempts.clone());
            async move {
                let mut seen = Seen::default();
                let deadline = Instant::now() + secs(20);
                let url = format!("{base}/charges");
                let post = |patience: Duration| {
                    http.post(&url)
                        .header("idempotency-key", format!("\"key-{key}\""))
                        .header("x-key", key.to_string())
                        .timeout(patience)
                        .send()
                };
                while seen.first.is_none() && Instant::now() < deadline {
                    let n = u64::from(seen.attempts);
                    seen.attempts += 1;
                    attempts.fetch_add(1, Ordering::Relaxed);
                    let patience = ms(1 + draw(seed, &[key as u64, n], 80));
                    if draw(seed, &[key as u64, n, 1], 5) == 0 {
                        let conn = raw_request(
                            &base,
                            &format!(
                                "POST /charges HTTP/1.1\r\nhost: x\r\nidempotency-key: \"key-{key}\"\r\n\
                                 x-key: {key}\r\ncontent-length: 0\r\n\r\n"
                            ),
                        );
                        tokio::time::sleep(patience).await;
                        drop(conn);
                        seen.given_up += 1;
                        continue;
                    }
                    match post(patience).await {
                        Err(e) if e.is_timeout() => seen.given_up += 1,
                        Err(e) => panic!("key {key}: {e}"),
                        Ok(r) if r.status() == StatusCode::CONFLICT => seen.conflicts += 1,
                        Ok(r) if r.status().is_success() => match r.text().await {
                            Ok(body) => seen.first = Some(body),
                            // Gave up while the body came in.
                            Err(_) => seen.given_up += 1,
                        },
                        Ok(r) => panic!("key {key}: unexpected {}", r.status()),
                    }
                }
                let r = post(secs(5)).await.unwrap();
                let replayed = r
                    .headers()
                    .get("idempotent-replayed")
                    .is_some_and(|v| v == "true");
                if r.status().is_success() && replayed {
                    seen.replay = Some(r.text().await.unwrap());
                }
                (key, seen)
            }
        })
        .buffer_unordered(8)
        .collect()
        .await;
    seen.sort_by_key(|(key, _)| *key);
    let seen: Vec<Seen> = seen.into_iter().map(|(_, seen)| seen).collect();
    // Handlers whose client went away may still be running.
    tokio::time::sleep(ms(200)).await;
    let runs = runs.lock().unwrap()[..seen.len()].to_vec();
    let given_up: u32 = seen.iter().map(|s| s.given_up).sum();
    let conflicts: u32 = seen.iter().map(|s| s.conflicts).sum();
    println!(
        "{what}: {} keys, {} attempts, {given_up} given up mid-request, {conflicts} answered 409 \
         (seed {seed})",
        seen.len(),
        attempts.load(Ordering::Relaxed),
    );
    assert!(
        given_up > 100,
        "{what}: too few clients gave up to test anything"
    );
    let twice: Vec<_> = runs
        .iter()
        .enumerate()
        .filter(|(_, r)| r.started > 1)
        .collect();
    assert!(
        twice.is_empty(),
        "{what}: the handlers of {} of {} keys started more than once: {twice:?}",
        twice.len(),
        seen.len()
    );
    let cut: Vec<_> = runs
        .iter()
        .enumerate()
        .filter(|(_, r)| r.finished != r.started)
        .collect();
    assert!(cut.is_empty(), "{what}: handlers cut off: {cut:?}");
    for (key, (seen, runs)) in seen.iter().zip(&runs).enumerate() {
        let charged = format!("key {key} charged");
        assert_eq!(
            seen.first.as_deref(),
            Some(charged.as_str()),
            "{what}: key {key}: {seen:?}"
        );
        assert_eq!(
            seen.replay.as_deref(),
            Some(charged.as_str()),
            "{what}: key {key}: {seen:?}"
        );
        assert_eq!(runs.started, 1, "{what}: key {key} ran once");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_clients_giving_up_never_run_a_handler_twice_nor_cut_one_off() {
    let server = tokio::task::block_in_place(RedisServer::start);
    giving_up("redis", redis_client(&server).await, secs(6)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redlock_clients_giving_up_never_run_a_handler_twice_nor_cut_one_off() {
    let masters = tokio::task::block_in_place(|| Redlock::start(3));
    let client = short_timeout_client(masters.builder()).await;
    giving_up("redlock", client, secs(6)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sentinel_clients_giving_up_never_run_a_handler_twice_nor_cut_one_off() {
    let setup = tokio::task::block_in_place(SentinelSetup::start);
    let client = short_timeout_client(setup.builder()).await;
    giving_up("sentinel", client, secs(6)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_cluster_clients_giving_up_never_run_a_handler_twice_nor_cut_one_off() {
    let cluster = tokio::task::block_in_place(|| Cluster::start(3));
    let client = short_timeout_client(cluster.builder()).await;
    giving_up("cluster", client, secs(6)).await;
}
