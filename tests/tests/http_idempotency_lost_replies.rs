//! `IdempotencyLayer` under killed connections: a lost reply never turns a
//! success into an error nor reruns a request, and a hammering of requests
//! while connections are killed (one server, Redlock, Sentinel, Cluster) never
//! runs a handler twice nor answers 5xx after it succeeded.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use futures_util::StreamExt;
use lock_runtime::LockClient;
use lock_runtime::layer::IdempotencyLayer;
use test_support::helpers::{ms, redis_client, secs, short_timeout_client};
use test_support::http::{send, serve};
use test_support::topology::{Redlock, Topology};
use test_support::{RedisServer, signal};
use tokio::sync::Notify;

mod http_idempotency_common;
use http_idempotency_common::*;

/// A plain connection to `port`, opened before any freeze, that queues
/// `CLIENT KILL TYPE normal` (which spares the connection that sends it).
struct Killer(std::net::TcpStream);

impl Killer {
    fn connect(port: u16) -> Self {
        let stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream.set_read_timeout(Some(secs(5))).unwrap();
        Self(stream)
    }

    /// Queues the command; the server runs it when it can (now, or when it
    /// is resumed).
    fn queue(&mut self) {
        std::io::Write::write_all(&mut self.0, b"CLIENT KILL TYPE normal SKIPME yes\r\n").unwrap();
    }

    /// How many connections the queued command killed.
    fn killed(&mut self) -> u64 {
        let mut line = Vec::new();
        let mut byte = [0u8; 1];
        while !line.ends_with(b"\r\n") {
            std::io::Read::read_exact(&mut self.0, &mut byte).unwrap();
            line.push(byte[0]);
        }
        let line = String::from_utf8(line).unwrap();
        line.trim()
            .strip_prefix(':')
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("unexpected CLIENT KILL reply {line:?}"))
    }
}

/// Where [`a_lost_reply_never_turns_a_success_into_an_error_nor_reruns_a_request`]
/// freezes the server.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Stage {
    /// Before the layer sends its claim (a middleware outside the layer).
    Claim,
    /// When the handler is done, before the layer sends the completion.
    Completion,
}

/// The command connection dies while a claim or a completion is in flight:
/// with `CLIENT KILL` queued before the command (it never runs) or after it
/// (it runs and its reply is lost). Each time the client gets the handler's
/// response (not 409/503), and a retry gets it replayed: the handler ran
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_never_turns_a_success_into_an_error_nor_reruns_a_request() {
    use std::sync::Mutex;
    let server = RedisServer::start();
    let pid = server.pid().unwrap();
    let client = redis_client(&server).await;
    // The plan of the next request: where to freeze, and whether the kill is
    // queued before the command (else after it).
    let plan: Arc<Mutex<Option<(Stage, bool)>>> = Arc::default();
    let killer = Arc::new(Mutex::new(Killer::connect(server.port)));
    let frozen = Arc::new(Notify::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let freeze = {
        let (plan, killer, frozen) = (plan.clone(), killer.clone(), frozen.clone());
        move |stage: Stage| {
            let mut plan = plan.lock().unwrap();
            if let Some((at, kill_first)) = *plan
                && at == stage
            {
                *plan = None;
                signal(pid, "STOP").unwrap();
                if kill_first {
                    killer.lock().unwrap().queue();
                }
                frozen.notify_one();
            }
        }
    };
    let handler = {
        let (freeze, runs) = (freeze.clone(), runs.clone());
        move || {
            let (freeze, runs) = (freeze.clone(), runs.clone());
            async move {
                let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                // The handler's work is done: the completion comes next.
                freeze(Stage::Completion);
                (StatusCode::CREATED, format!("order {n}"))
            }
        }
    };
    let before_claim = move |req: axum::extract::Request, next: axum::middleware::Next| {
        freeze(Stage::Claim);
        next.run(req)
    };
    let app = Router::new()
        .route(
            "/orders",
            post(handler).route_layer(IdempotencyLayer::new(client)),
        )
        .layer(axum::middleware::from_fn(before_claim));
    let api = Api::serve(app).await;
    let send = |key: &str| api.post("/orders", &format!("\"{key}\"")).send();
    // Loads the scripts, so a frozen command is the script itself and not a
    // NOSCRIPT answer followed by a load.
    assert_eq!(send("warm-up").await.unwrap().status(), StatusCode::CREATED);

    for (stage, kill_first, case) in [
        (
            Stage::Completion,
            true,
            "connection killed before the server read the completion",
        ),
        (Stage::Completion, false, "completion ran, its reply lost"),
        (
            Stage::Claim,
            true,
            "connection killed before the server read the claim",
        ),
        (Stage::Claim, false, "claim ran, its reply lost"),
    ] {
        let key = format!("{stage:?}-{kill_first}");
        let runs_before = runs.load(Ordering::SeqCst);
        *plan.lock().unwrap() = Some((stage, kill_first));
        let first = tokio::spawn(send(&key));
        tokio::time::timeout(secs(5), frozen.notified())
            .await
            .unwrap_or_else(|_| panic!("{case}: the server was not frozen"));
        // The command reaches the frozen server within this pause; the whole
        // freeze stays under the client's 500 ms response timeout.
        tokio::time::sleep(ms(150)).await;
        if !kill_first {
            killer.lock().unwrap().queue();
        }
        tokio::time::sleep(ms(50)).await;
        signal(pid, "CONT").unwrap();
        let killed = tokio::task::block_in_place(|| killer.lock().unwrap().killed());
        assert!(killed >= 1, "{case}: CLIENT KILL killed nothing");

        let first = first.await.unwrap().unwrap();
        assert_eq!(first.status(), StatusCode::CREATED, "{case}");
        assert!(!is_replay(first.headers()), "{case}");
        let body = first.text().await.unwrap();
        let again = send(&key).await.unwrap();
        assert_eq!(
            answer(&again),
            (StatusCode::CREATED, true),
            "{case}: the retry was not a replay"
        );
        assert_eq!(again.text().await.unwrap(), body, "{case}");
        assert_eq!(
            runs.load(Ordering::SeqCst),
            runs_before + 1,
            "{case}: the handler ran twice"
        );
    }
}

/// What one key saw in [`hammer_while_killing_connections`].
#[derive(Debug, Default)]
struct KeyLog {
    /// (request id, status) of every attempt.
    answers: Vec<(usize, StatusCode)>,
    replayed: bool,
}

/// For `run_for`, sends new keys (8 at a time), each until it gets a `2xx`
/// and then until a retry is a replay, while `CLIENT KILL TYPE normal` runs
/// on every server in `ports` every 300 ms. Returns, per key, the handler's
/// runs (request ids) and what the client saw, and how many connections
/// were killed.
async fn hammer_while_killing_connections(
    client: LockClient,
    ports: Vec<u16>,
    run_for: Duration,
) -> (Vec<Vec<usize>>, Vec<KeyLog>, u64) {
    use std::sync::Mutex;
    const MAX_KEYS: usize = 100_000;
    let ran: Arc<Mutex<Vec<Vec<usize>>>> = Arc::new(Mutex::new(vec![Vec::new(); MAX_KEYS]));
    let handler = {
        let ran = ran.clone();
        move |headers: HeaderMap| {
            let ran = ran.clone();
            async move {
                let key: usize = headers["x-key"].to_str().unwrap().parse().unwrap();
                let id: usize = headers["x-request"].to_str().unwrap().parse().unwrap();
                tokio::time::sleep(ms(20)).await;
                ran.lock().unwrap()[key].push(id);
                (StatusCode::CREATED, format!("key {key} by request {id}"))
            }
        }
    };
    let layer = IdempotencyLayer::new(client).ttl(secs(1));
    let base = serve(Router::new().route("/orders", post(handler).route_layer(layer))).await;

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let killer = {
        let stop = stop.clone();
        tokio::task::spawn_blocking(move || {
            let mut killers: Vec<Killer> = ports.iter().map(|p| Killer::connect(*p)).collect();
            let mut killed = 0;
            while !stop.load(Ordering::SeqCst) {
                std::thread::sleep(ms(300));
                for k in &mut killers {
                    k.queue();
                    killed += k.killed();
                }
            }
            killed
        })
    };

    let next_id = Arc::new(AtomicUsize::new(0));
    let http = reqwest::Client::new();
    let started = Instant::now();
    let logs = futures_util::stream::iter(0..MAX_KEYS)
        .take_while(|_| std::future::ready(started.elapsed() < run_for))
        .map(|key| {
            let (http, base, next_id) = (http.clone(), base.clone(), next_id.clone());
            async move {
                let mut log = KeyLog::default();
                let deadline = Instant::now() + secs(20);
                let mut done = false;
                while Instant::now() < deadline {
                    let id = next_id.fetch_add(1, Ordering::SeqCst);
                    let r = send(
                        http.post(format!("{base}/orders"))
                            .header("idempotency-key", format!("\"key-{key}\""))
                            .header("x-key", key.to_string())
                            .header("x-request", id.to_string()),
                    )
                    .await;
                    let (status, replayed) = answer(&r);
                    log.answers.push((id, status));
                    if status.is_success() {
                        if done && replayed {
                            log.replayed = true;
                            break;
                        }
                        done = true;
                    }
                    // A refusal (409 in flight, 503 store unreachable) or the
                    // first answer: ask again.
                    tokio::time::sleep(ms(30)).await;
                }
                log
            }
        })
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await;
    stop.store(true, Ordering::SeqCst);
    let killed = killer.await.unwrap();
    let mut ran = ran.lock().unwrap().clone();
    ran.truncate(logs.len());
    (ran, logs, killed)
}

/// Checks [`hammer_while_killing_connections`]' outcome: no key ran twice,
/// no request whose handler ran got a `5xx`, every key ended replayed.
fn check_no_double_runs_and_no_5xx_after_success(
    backend: &str,
    ran: &[Vec<usize>],
    logs: &[KeyLog],
    killed: u64,
) {
    let runs_twice: Vec<_> = ran
        .iter()
        .enumerate()
        .filter(|(_, r)| r.len() > 1)
        .collect();
    let ran_ids: std::collections::HashSet<usize> = ran.iter().flatten().copied().collect();
    let errors_after_success: Vec<_> = logs
        .iter()
        .flat_map(|l| &l.answers)
        .filter(|(id, status)| ran_ids.contains(id) && !status.is_success())
        .collect();
    let refusals = logs
        .iter()
        .flat_map(|l| &l.answers)
        .filter(|(_, s)| !s.is_success())
        .count();
    println!(
        "{backend}: {} keys, {killed} connections killed, {refusals} refusals (409/503) \
         of requests whose handler did not run",
        logs.len()
    );
    assert!(killed > 0, "{backend}: no connection was killed");
    assert!(
        runs_twice.is_empty(),
        "{backend}: keys whose handler ran more than once (key, request ids): {runs_twice:?}"
    );
    assert!(
        errors_after_success.is_empty(),
        "{backend}: requests whose handler ran but got an error: {errors_after_success:?}"
    );
    let unfinished: Vec<_> = logs
        .iter()
        .enumerate()
        .filter(|(_, l)| !l.replayed)
        .collect();
    assert!(
        unfinished.is_empty(),
        "{backend}: keys never replayed: {unfinished:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_connections_neither_run_a_handler_twice_nor_answer_5xx_after_it_succeeded() {
    let server = RedisServer::start();
    let client = redis_client(&server).await;
    let (ran, logs, killed) =
        hammer_while_killing_connections(client, vec![server.port], secs(8)).await;
    check_no_double_runs_and_no_5xx_after_success("redis", &ran, &logs, killed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redlock_killed_connections_neither_run_a_handler_twice_nor_answer_5xx_after_it_succeeded()
 {
    let masters = Redlock::start(3);
    let ports = (0..masters.size())
        .map(|i| masters.server(i).port)
        .collect();
    let client = redlock_client(&masters).await;
    let (ran, logs, killed) = hammer_while_killing_connections(client, ports, secs(8)).await;
    check_no_double_runs_and_no_5xx_after_success("redlock", &ran, &logs, killed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sentinel_killed_connections_neither_run_a_handler_twice_nor_answer_5xx_after_it_succeeded()
 {
    use test_support::topology::SentinelSetup;
    let setup = tokio::task::block_in_place(SentinelSetup::start);
    let client = short_timeout_client(setup.builder()).await;
    let ports = vec![setup.master().port];
    let (ran, logs, killed) = hammer_while_killing_connections(client, ports, secs(8)).await;
    check_no_double_runs_and_no_5xx_after_success("sentinel", &ran, &logs, killed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_cluster_killed_connections_neither_run_a_handler_twice_nor_answer_5xx_after_it_succeeded()
 {
    use test_support::topology::Cluster;
    let cluster = tokio::task::block_in_place(|| Cluster::start(3));
    let client = short_timeout_client(cluster.builder()).await;
    let ports = (0..cluster.size()).map(|i| cluster.node(i).port).collect();
    let (ran, logs, killed) = hammer_while_killing_connections(client, ports, secs(8)).await;
    check_no_double_runs_and_no_5xx_after_success("cluster", &ran, &logs, killed);
}
