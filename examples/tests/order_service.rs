//! The `order-service` binary, run as its users run it: startup failures,
//! two instances on two ports behind one Redis, a graceful shutdown
//! mid-payment, and orders in PostgreSQL.

use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
#[cfg(feature = "postgres")]
use test_support::PostgresServer;
use test_support::{RedisServer, free_port, signal};

const BIN: &str = env!("CARGO_BIN_EXE_order-service");

/// How long the fake payment provider takes: long enough that every one of
/// a burst of concurrent pays arrives while the first is still paying.
const PAYMENT_DELAY_MS: &str = "3000";

/// A running `order-service` on a free loopback port, killed on drop.
struct Instance {
    child: Child,
    base: String,
}

impl Instance {
    fn start(env: &[(&str, &str)]) -> Self {
        let port = free_port();
        let child = Command::new(BIN)
            .env_remove("REDIS_URL")
            .env_remove("DATABASE_URL")
            .env_remove("NAMESPACE")
            .env("PORT", port.to_string())
            .env("PAYMENT_DELAY_MS", PAYMENT_DELAY_MS)
            .env("RUST_LOG", "warn")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .spawn()
            .expect("start order-service");
        let mut instance = Instance {
            child,
            base: format!("http://127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = instance.child.try_wait().unwrap() {
                panic!("order-service exited at startup: {status}");
            }
            assert!(Instant::now() < deadline, "order-service did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        instance
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the binary with `REDIS_URL=url` and waits for it to exit (at most 20 s).
fn run_expecting_exit(url: &str) -> (ExitStatus, String) {
    let mut child = Command::new(BIN)
        .env("REDIS_URL", url)
        .env("PORT", free_port().to_string())
        .env_remove("NAMESPACE")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start order-service");
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("order-service kept running with REDIS_URL={url}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().unwrap();
    (
        output.status,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn startup_failures_print_one_readable_paragraph_and_exit_1() {
    let guarded = RedisServer::start_with(&["--requirepass", "s3cret"]);
    let unused = free_port();
    let cases: [(String, Vec<String>); 3] = [
        (
            "redis://127.0.0.1:notaport".into(),
            vec![
                "REDIS_URL=redis://127.0.0.1:notaport is not usable".into(),
                "invalid Redis URL".into(),
            ],
        ),
        (
            format!("redis://127.0.0.1:{unused}"),
            vec![
                format!("cannot use Redis at redis://127.0.0.1:{unused} (REDIS_URL)"),
                "Connection refused".into(),
            ],
        ),
        (
            format!("redis://:wrong-password@127.0.0.1:{}", guarded.port),
            vec![
                // The password is not shown.
                format!("redis://:***@127.0.0.1:{}", guarded.port),
                "Password authentication failed".into(),
            ],
        ),
    ];
    for (url, expected) in cases {
        let (status, stderr) = run_expecting_exit(&url);
        println!("REDIS_URL={url}: {status}\n{stderr}");
        assert_eq!(status.code(), Some(1), "{url}: {stderr}");
        let message = stderr.trim();
        assert!(
            message.starts_with("order-service: cannot start: "),
            "{message}"
        );
        assert!(
            !message.contains("\n\n"),
            "more than one paragraph: {message}"
        );
        for part in &expected {
            assert!(message.contains(part), "{url}: {message:?} lacks {part:?}");
        }
        // Not the `Debug` of an error value, and no password.
        for leak in ["Backend(", "BackendError {", "Config(", "wrong-password"] {
            assert!(!message.contains(leak), "{url}: {message}");
        }
    }
}

async fn create(http: &reqwest::Client, on: &Instance, key: &str, item: &str) -> reqwest::Response {
    http.post(on.url("/orders"))
        .header("idempotency-key", format!("\"{key}\""))
        .json(&json!({ "item": item, "amount_cents": 1250 }))
        .send()
        .await
        .unwrap()
}

/// Sends every `(instance, path)` pay at once; the statuses and bodies (a
/// `Retry-After` header is copied into the body as `"retry-after"`).
async fn pay_all(http: &reqwest::Client, pays: &[(&Instance, &str)]) -> Vec<(StatusCode, Value)> {
    futures_util::future::join_all(pays.iter().map(|(on, path)| {
        let request = http.post(on.url(path)).send();
        async move {
            let r = request.await.unwrap();
            let status = r.status();
            let retry_after = r.headers().get("retry-after").cloned();
            let mut body = r.json::<Value>().await.unwrap();
            if let Some(after) = retry_after {
                body["retry-after"] = after.to_str().unwrap().into();
            }
            (status, body)
        }
    }))
    .await
}

/// Exactly one `200` (the order, paid), and `409`s from the lock layer, with
/// `Retry-After`. The charge's own `#[distributed_lock]` would also refuse an
/// alias that got past the layer, but only after waiting 2 s for it, without
/// `Retry-After`, and only if the payment takes longer than that wait; a
/// shorter one is answered `200` to every alias.
fn assert_one_paid_rest_conflict(replies: &[(StatusCode, Value)]) -> Value {
    let paid: Vec<_> = replies
        .iter()
        .filter(|(s, _)| *s == StatusCode::OK)
        .collect();
    let conflicts: Vec<_> = replies
        .iter()
        .filter(|(s, _)| *s == StatusCode::CONFLICT)
        .collect();
    assert_eq!(paid.len(), 1, "{replies:#?}");
    assert_eq!(conflicts.len(), replies.len() - 1, "{replies:#?}");
    assert_eq!(paid[0].1["status"], "paid");
    for (_, problem) in conflicts {
        assert_eq!(
            problem["detail"], "another request holds this request's lock; retry later",
            "{replies:#?}"
        );
        assert!(problem.get("retry-after").is_some(), "{replies:#?}");
    }
    paid[0].1.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_behind_one_redis_share_orders_locks_and_idempotency_records() {
    let redis = RedisServer::start();
    let url = redis.url();
    let shared = [("REDIS_URL", url.as_str()), ("NAMESPACE", "shop")];
    let (a, b) = (Instance::start(&shared), Instance::start(&shared));
    let http = reqwest::Client::new();

    // Created on A, replayed on B: A's stored response, no second order.
    let first = create(&http, &a, "order-1", "book").await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let location = first.headers()["location"].clone();
    let first: Value = first.json().await.unwrap();
    assert_eq!(first["id"], 1);
    let replay = create(&http, &b, "order-1", "book").await;
    assert_eq!(replay.status(), StatusCode::CREATED);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.headers()["location"], location);
    assert_eq!(replay.json::<Value>().await.unwrap(), first);

    // Visible on B; ids from one sequence whichever instance creates.
    let on_b: Value = get_json(&http, b.url("/orders/1")).await;
    assert_eq!(on_b, first);
    for n in 2..=15 {
        let on = if n % 2 == 0 { &b } else { &a };
        let r = create(&http, on, &format!("order-{n}"), "pen").await;
        assert_eq!(r.status(), StatusCode::CREATED);
        assert_eq!(r.json::<Value>().await.unwrap()["id"], n);
    }

    // Aliases of order 15 on both instances, all at once: one payment. And
    // meanwhile order 1, created on A, is paid on B.
    let aliases = ["/orders/15/pay", "/orders/015/pay", "/orders/+15/pay"];
    let pays: Vec<_> = aliases
        .iter()
        .flat_map(|path| [(&a, *path), (&b, *path)])
        .chain([(&b, "/orders/1/pay")])
        .collect();
    let mut replies = pay_all(&http, &pays).await;
    let order_1 = replies.pop().unwrap();
    assert_eq!(order_1.0, StatusCode::OK, "{order_1:?}");
    assert_eq!(order_1.1["status"], "paid");
    let paid = assert_one_paid_rest_conflict(&replies);
    for on in [&a, &b] {
        let order: Value = get_json(&http, on.url("/orders/15")).await;
        assert_eq!(order, paid);
        let order: Value = get_json(&http, on.url("/orders/1")).await;
        assert_eq!(order, order_1.1);
    }

    // Another namespace on the same Redis starts afresh: the same key makes
    // a new order 1 there, so a demo session can be run again.
    let fresh = Instance::start(&[("REDIS_URL", url.as_str()), ("NAMESPACE", "shop-2")]);
    let r = create(&http, &fresh, "order-1", "book").await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert!(!r.headers().contains_key("idempotent-replayed"));
    assert_eq!(r.json::<Value>().await.unwrap()["id"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_redis_one_instance_pays_aliases_of_one_order_once() {
    let one = Instance::start(&[]);
    let http = reqwest::Client::new();
    for n in 1..=15 {
        let r = create(&http, &one, &format!("order-{n}"), "pen").await;
        assert_eq!(r.status(), StatusCode::CREATED);
    }
    let pays: Vec<_> = ["/orders/15/pay", "/orders/015/pay", "/orders/+15/pay"]
        .iter()
        .map(|path| (&one, *path))
        .collect();
    assert_one_paid_rest_conflict(&pay_all(&http, &pays).await);
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_postgres_two_instances_share_orders_and_pay_each_once() {
    let (redis, postgres) = (RedisServer::start(), PostgresServer::start());
    let (redis_url, database_url) = (redis.url(), postgres.url());
    let shared = [
        ("REDIS_URL", redis_url.as_str()),
        ("DATABASE_URL", database_url.as_str()),
        ("NAMESPACE", "shop"),
    ];
    let (a, b) = (Instance::start(&shared), Instance::start(&shared));
    let http = reqwest::Client::new();
    for n in 1..=15 {
        let on = if n % 2 == 0 { &b } else { &a };
        let r = create(&http, on, &format!("order-{n}"), "pen").await;
        assert_eq!(r.status(), StatusCode::CREATED);
        assert_eq!(r.json::<Value>().await.unwrap()["id"], n);
    }
    let replay = create(&http, &b, "order-1", "pen").await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let pays: Vec<_> = ["/orders/15/pay", "/orders/015/pay", "/orders/+15/pay"]
        .iter()
        .flat_map(|path| [(&a, *path), (&b, *path)])
        .collect();
    let paid = assert_one_paid_rest_conflict(&pay_all(&http, &pays).await);
    assert!(paid["paid_with_fencing_token"].as_u64().is_some(), "{paid}");
    for on in [&a, &b] {
        assert_eq!(get_json(&http, on.url("/orders/15")).await, paid);
    }
    // The orders are in PostgreSQL, not in Redis.
    assert!(!redis.cli(&["KEYS", "shop:order*"]).contains("shop:order"));
    // Without Redis: the embedded lock backend, orders still in PostgreSQL.
    let alone = Instance::start(&[
        ("DATABASE_URL", database_url.as_str()),
        ("NAMESPACE", "shop"),
    ]);
    assert_eq!(get_json(&http, alone.url("/orders/15")).await, paid);
}

/// `GET url`, its body as JSON.
async fn get_json(http: &reqwest::Client, url: String) -> Value {
    http.get(url).send().await.unwrap().json().await.unwrap()
}

/// A rolling deploy sends SIGTERM while a payment runs whose client gave up:
/// its handler runs on, detached from the connection (the server no longer
/// sees it), and the process waits for it before it exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_payment_waits_for_the_payment_whose_client_gave_up() {
    let redis = RedisServer::start();
    let url = redis.url();
    let shared = [("REDIS_URL", url.as_str()), ("NAMESPACE", "deploy")];
    let mut a = Instance::start(&shared);
    let http = reqwest::Client::new();
    let r = create(&http, &a, "order-1", "book").await;
    assert_eq!(r.status(), StatusCode::CREATED);
    // The client gives up long before the 3 s payment ends.
    let gave_up = http
        .post(a.url("/orders/1/pay"))
        .timeout(Duration::from_millis(200))
        .send()
        .await;
    assert!(gave_up.is_err(), "{gave_up:?}");
    let asked = Instant::now();
    signal(a.child.id(), "TERM").unwrap();
    let status = tokio::task::block_in_place(|| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = a.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "order-service did not stop");
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    let stopped_after = asked.elapsed();
    println!("stopped {stopped_after:?} after SIGTERM");
    assert!(status.success(), "{status}");
    // The lone instance's sweeper resigned, and did not campaign again: no
    // leader is left for the next instance to wait out.
    for name in ["deploy:E{order-sweeper}", "deploy:A{order-sweeper}"] {
        assert_eq!(
            redis.cli(&["EXISTS", name]),
            "0",
            "{name} after the shutdown"
        );
    }
    let b = Instance::start(&shared);
    let order = get_json(&http, b.url("/orders/1")).await;
    assert_eq!(order["status"], "paid", "after the shutdown: {order}");
    assert!(
        stopped_after > Duration::from_millis(2000),
        "stopped {stopped_after:?} after SIGTERM: before the payment ended"
    );
}
