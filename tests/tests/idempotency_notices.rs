//! `IdempotencyLayer` duplicates wait on the record's notice, and in-flight
//! records ride the client's watchdog: against real redis-servers (one
//! server, a Cluster, Redlock) and the embedded backend.
//!
//! A duplicate that finds its record in flight registers on the record's
//! notice channel and sleeps until the completion (or release) is announced,
//! the record's lease runs out, or its `wait` ends. Before, it polled with a
//! back-off of up to 250 ms; the latency tests here fail with polling.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use lock_runtime::LockClient;
use lock_runtime::layer::IdempotencyLayer;
use test_support::RedisServer;
use test_support::topology::{Cluster, Redlock, Topology};

/// Timing tests run one at a time: two cores are shared by the whole binary.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

async fn build(builder: lock_runtime::LockClientBuilder) -> LockClient {
    builder
        .connect_timeout(ms(500))
        .response_timeout(ms(500))
        .build()
        .await
        .unwrap()
}

async fn redis_client(url: &str) -> LockClient {
    build(LockClient::builder().redis(url)).await
}

/// The handler: each run takes `x-work-ms` milliseconds (or `work`), then
/// answers `201 run N`, or `500` for the first run when `fail_first`.
#[derive(Clone, Default)]
struct Work {
    runs: Arc<AtomicUsize>,
    work: Duration,
    fail_first: bool,
    /// When the last run ended (its response is then being stored).
    ended: Arc<Mutex<Option<Instant>>>,
}

impl Work {
    fn ended(&self) -> Instant {
        self.ended.lock().unwrap().expect("a run ended")
    }
}

async fn handle(State(w): State<Work>, headers: HeaderMap) -> Response {
    let run = w.runs.fetch_add(1, Ordering::SeqCst) + 1;
    let work = headers
        .get("x-work-ms")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .map_or(w.work, ms);
    tokio::time::sleep(work).await;
    *w.ended.lock().unwrap() = Some(Instant::now());
    if w.fail_first && run == 1 {
        return (StatusCode::INTERNAL_SERVER_ERROR, "failed").into_response();
    }
    (StatusCode::CREATED, format!("run {run}")).into_response()
}

fn app(layer: IdempotencyLayer, work: Work) -> Router {
    Router::new()
        .route("/jobs", post(handle))
        .route_layer(layer)
        .with_state(work)
}

/// One answer, with the time it arrived.
struct Reply {
    status: StatusCode,
    replayed: bool,
    body: String,
    at: Instant,
}

async fn send(http: &reqwest::Client, base: &str, key: &str, work: Duration) -> Reply {
    let r = http
        .post(format!("{base}/jobs"))
        .header("idempotency-key", format!("\"{key}\""))
        .header("x-work-ms", work.as_millis().to_string())
        .body("{}")
        .send()
        .await
        .unwrap();
    let status = r.status();
    let replayed = r
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true");
    let body = r.text().await.unwrap();
    Reply {
        status,
        replayed,
        body,
        at: Instant::now(),
    }
}

fn percentile(sorted: &[Duration], p: usize) -> Duration {
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

/// `tries` times: a request whose handler takes 190..330 ms, and 30 ms later
/// a duplicate that waits (up to 2 s). Returns how long after the handler
/// ended each duplicate got its replay, sorted. The work varies so that no
/// polling schedule can be lucky on every try.
async fn replay_latencies(client: LockClient, tries: u64) -> Vec<Duration> {
    let work = Work::default();
    let layer = IdempotencyLayer::new(client).wait(Duration::from_secs(2));
    let base = serve(app(layer, work.clone())).await;
    let http = reqwest::Client::new();
    let mut latencies = Vec::new();
    for i in 0..tries {
        let key = format!("latency-{i}-{}", std::process::id());
        let took = ms(190 + (i * 47) % 140);
        let (first, duplicate) = tokio::join!(send(&http, &base, &key, took), async {
            tokio::time::sleep(ms(30)).await;
            send(&http, &base, &key, took).await
        });
        assert_eq!(first.status, StatusCode::CREATED);
        assert!(!first.replayed);
        assert_eq!(duplicate.status, StatusCode::CREATED, "{}", duplicate.body);
        assert!(duplicate.replayed, "the duplicate ran the handler again");
        assert_eq!(duplicate.body, first.body);
        latencies.push(duplicate.at.saturating_duration_since(work.ended()));
    }
    assert_eq!(work.runs.load(Ordering::SeqCst), tries as usize);
    latencies.sort();
    latencies
}

/// The replay reaches a waiting duplicate about one round trip after the
/// first request's response is stored: median under 50 ms, and p90 far
/// below the 250 ms polling cap (polling gives a p90 of about 140 ms here).
fn assert_prompt(backend: &str, latencies: &[Duration]) {
    let (median, p90) = (percentile(latencies, 50), percentile(latencies, 90));
    println!(
        "{backend}: replay to a waiting duplicate after the handler ended: median {median:?}, \
         p90 {p90:?}, max {:?}, all {latencies:?}",
        latencies.last().unwrap()
    );
    assert!(
        median < ms(50),
        "{backend}: median {median:?}: duplicates poll"
    );
    assert!(p90 < ms(100), "{backend}: p90 {p90:?}: duplicates poll");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_duplicate_gets_the_replay_within_milliseconds_on_one_server_and_embedded() {
    let _serial = SERIAL.lock().await;
    let server = RedisServer::start();
    let latencies = replay_latencies(redis_client(&server.url()).await, 10).await;
    assert_prompt("redis", &latencies);
    let memory = build(LockClient::builder().memory()).await;
    assert_prompt("memory", &replay_latencies(memory, 10).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_duplicate_gets_the_replay_within_milliseconds_on_a_cluster() {
    let cluster = tokio::task::block_in_place(|| Cluster::start(3));
    let _serial = SERIAL.lock().await;
    let client = build(cluster.builder()).await;
    assert_prompt("cluster", &replay_latencies(client, 10).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_duplicate_gets_the_replay_within_milliseconds_on_redlock() {
    let masters = Redlock::start(3);
    let _serial = SERIAL.lock().await;
    let client = build(masters.builder()).await;
    assert_prompt("redlock", &replay_latencies(client, 10).await);
}

/// The first request fails (500, not stored): its record is released, which
/// wakes the waiting duplicate at once, and the duplicate runs the handler.
async fn a_release_wakes_the_duplicate_which_runs(backend: &str, client: LockClient) {
    let work = Work {
        fail_first: true,
        ..Work::default()
    };
    let layer = IdempotencyLayer::new(client)
        .wait(Duration::from_secs(2))
        .store_server_errors(false);
    let base = serve(app(layer, work.clone())).await;
    let http = reqwest::Client::new();
    let key = format!("released-{}", std::process::id());
    // 400 ms: polling (10 ms doubling to 250 ms) would look 190 ms late.
    let (first, duplicate) = tokio::join!(send(&http, &base, &key, ms(400)), async {
        tokio::time::sleep(ms(30)).await;
        send(&http, &base, &key, ms(0)).await
    });
    assert_eq!(first.status, StatusCode::INTERNAL_SERVER_ERROR, "{backend}");
    assert_eq!(duplicate.status, StatusCode::CREATED, "{backend}");
    assert!(!duplicate.replayed, "{backend}: the duplicate ran");
    assert_eq!(duplicate.body, "run 2", "{backend}");
    let after = duplicate.at.saturating_duration_since(first.at);
    println!("{backend}: a released record's duplicate answered {after:?} after the failure");
    assert!(
        after < ms(50),
        "{backend}: the duplicate woke {after:?} after the release: no notice"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_record_wakes_a_waiting_duplicate_which_then_runs() {
    let server = RedisServer::start();
    let cluster = tokio::task::block_in_place(|| Cluster::start(3));
    let _serial = SERIAL.lock().await;
    a_release_wakes_the_duplicate_which_runs("redis", redis_client(&server.url()).await).await;
    let memory = build(LockClient::builder().memory()).await;
    a_release_wakes_the_duplicate_which_runs("memory", memory).await;
    let client = build(cluster.builder()).await;
    a_release_wakes_the_duplicate_which_runs("cluster", client).await;
}

/// An ACL user for the layer: the commands the client and the records
/// scripts send, on the prefix's keys, with or without its channels.
fn acl_user(server: &RedisServer, name: &str, channels: bool) {
    let mut setuser = vec![
        "ACL",
        "SETUSER",
        name,
        "on",
        ">pw",
        "resetkeys",
        "~lock:*",
        "resetchannels",
    ];
    if channels {
        setuser.push("&lock:*");
    }
    setuser.extend([
        "-@all",
        "+evalsha",
        "+eval",
        "+script|load",
        "+subscribe",
        "+unsubscribe",
        "+publish",
        "+hmget",
        "+hset",
        "+del",
        "+pexpire",
        "+pttl",
        "+get",
        "+set",
        "+incr",
        "+rpush",
        "+lpop",
        "+lrem",
        "+lpos",
    ]);
    assert_eq!(server.cli(&setuser), "OK");
}

/// Notices that never come: the instance that runs the request may not
/// publish (its ACL has no channels; the script's `pcall` keeps the
/// completion). A duplicate whose subscription was confirmed wakes at the
/// record's lease timer; one whose subscription was refused looks again with
/// the capped back-off. Neither hangs, and neither waits out its `wait`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notice_that_never_comes_ends_the_wait_within_the_lease() {
    let server = RedisServer::start();
    acl_user(&server, "mute", false);
    acl_user(&server, "listener", true);
    let url = |user: &str| format!("redis://{user}:pw@127.0.0.1:{}", server.port);
    let _serial = SERIAL.lock().await;
    let lease = ms(1000);
    let wait = Duration::from_secs(5);
    let work = Work::default();
    let mute = redis_client(&url("mute")).await;
    let listener = redis_client(&url("listener")).await;
    let layer = |client: &LockClient| IdempotencyLayer::new(client.clone()).ttl(lease).wait(wait);
    let runs_it = serve(app(layer(&mute), work.clone())).await;
    let subscribed = serve(app(layer(&listener), work.clone())).await;
    let unsubscribed = serve(app(layer(&mute), work.clone())).await;
    let http = reqwest::Client::new();

    for (duplicate_at, what, bound) in [
        // Wakes when the lease it last saw runs out (renewed every lease/3).
        (&subscribed, "subscribed, notice lost", lease + ms(300)),
        // Looks again at most every 250 ms.
        (&unsubscribed, "subscription refused", ms(250) + ms(150)),
    ] {
        let key = format!("mute-{what}");
        let started = Instant::now();
        let (first, duplicate) = tokio::join!(send(&http, &runs_it, &key, ms(300)), async {
            tokio::time::sleep(ms(50)).await;
            send(&http, duplicate_at, &key, ms(300)).await
        });
        assert_eq!(first.status, StatusCode::CREATED, "{what}");
        assert_eq!(duplicate.status, StatusCode::CREATED, "{what}");
        assert!(duplicate.replayed, "{what}: the duplicate ran again");
        let after = duplicate.at.saturating_duration_since(work.ended());
        let total = duplicate.at - started;
        println!("{what}: the duplicate got its replay {after:?} after the handler ended");
        assert!(after < bound, "{what}: {after:?} after the handler ended");
        assert!(total < wait, "{what}: waited out its deadline ({total:?})");
    }
    assert_eq!(work.runs.load(Ordering::SeqCst), 2);
    let denied = server.cli(&["ACL", "LOG"]);
    assert!(
        denied.contains("channel"),
        "the notices were not refused:\n{denied}"
    );
}

/// Ten slow requests at once (each over six leases long): the watchdog keeps
/// their records in flight, renewing them together in one script call per
/// renewal period (per server), and forgets them once they complete.
async fn slow_requests_are_renewed_in_batches(
    backend: &str,
    client: LockClient,
    nodes: &[&RedisServer],
) {
    let lease = ms(300);
    // Long enough for the window below to start once every record is
    // claimed (later under load) and end before the first completes.
    let work = Work {
        work: ms(2000),
        ..Work::default()
    };
    let layer = IdempotencyLayer::new(client.clone()).ttl(lease);
    let base = serve(app(layer, work.clone())).await;
    let http = reqwest::Client::new();
    let n = 10;
    let requests: Vec<_> = (0..n)
        .map(|i| {
            let (http, base) = (http.clone(), base.clone());
            tokio::spawn(async move { send(&http, &base, &format!("slow-{i}"), ms(2000)).await })
        })
        .collect();
    let sent = Instant::now();
    while client.renewed_records() != n {
        assert!(
            sent.elapsed() < ms(800),
            "{backend}: {} of {n} records under watch",
            client.renewed_records()
        );
        tokio::time::sleep(ms(5)).await;
    }
    let before: Vec<(u64, u64)> = nodes
        .iter()
        .map(|s| (s.command_calls("evalsha"), s.command_calls("pexpire")))
        .collect();
    let window = ms(900);
    tokio::time::sleep(window).await;
    // Only renewals run in the window: every claim went before it.
    for (i, (node, (evalsha, pexpire))) in nodes.iter().zip(before).enumerate() {
        let script_calls = node.command_calls("evalsha") - evalsha;
        let renewed = node.command_calls("pexpire") - pexpire;
        println!(
            "{backend} node {i}: {n} records over {window:?} (lease {lease:?}): \
             {script_calls} renewal calls re-armed {renewed} leases"
        );
        assert!(
            renewed >= 5 * n as u64,
            "{backend}: only {renewed} renewals in {window:?}"
        );
        assert!(
            script_calls * 5 <= renewed,
            "{backend}: {script_calls} calls for {renewed} renewals: not batched"
        );
    }
    // Still in flight after five leases: a duplicate is refused.
    let duplicate = send(&http, &base, "slow-0", ms(0)).await;
    assert_eq!(duplicate.status, StatusCode::CONFLICT, "{backend}");
    for request in requests {
        let reply = request.await.unwrap();
        assert_eq!(
            reply.status,
            StatusCode::CREATED,
            "{backend}: {}",
            reply.body
        );
    }
    assert_eq!(work.runs.load(Ordering::SeqCst), n, "{backend}");
    let stopped = Instant::now();
    while client.renewed_records() != 0 {
        assert!(
            stopped.elapsed() < Duration::from_secs(3),
            "{backend}: {} records still renewed",
            client.renewed_records()
        );
        tokio::time::sleep(ms(5)).await;
    }
    assert_eq!(client.renewed_leases(), 0, "{backend}: no lock was taken");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_requests_records_are_renewed_by_the_watchdog_in_batches_on_one_server() {
    let server = RedisServer::start();
    let _serial = SERIAL.lock().await;
    let client = redis_client(&server.url()).await;
    slow_requests_are_renewed_in_batches("redis", client, &[&server]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_requests_records_are_renewed_by_the_watchdog_in_batches_on_redlock() {
    let masters = Redlock::start(3);
    let _serial = SERIAL.lock().await;
    let client = build(masters.builder()).await;
    let nodes: Vec<&RedisServer> = (0..masters.size()).map(|i| masters.server(i)).collect();
    slow_requests_are_renewed_in_batches("redlock", client, &nodes).await;
}
