//! The README's two programs that need a server, run: the axum app with
//! both layers (`tests/src/bin/readme_axum.rs`) and leader election with a
//! fenced write (`tests/src/bin/readme_leader.rs`). Each file is the
//! README's block word for word (the first tests fail when they drift
//! apart); the others run them against a redis-server of their own, as a
//! user would with `REDIS_URL`. The README's other blocks run as doctests.

use std::time::{Duration, Instant};

use http::StatusCode;
use test_support::RedisServer;

const README: &str = include_str!("../../README.md");
const LEADER: &str = include_str!("../src/bin/readme_leader.rs");
const AXUM: &str = include_str!("../src/bin/readme_axum.rs");

fn assert_in_readme(program: &str, file: &str) {
    assert!(
        README.contains(&format!("```rust,no_run\n{program}```\n")),
        "README.md has no block identical to {file}"
    );
}

#[test]
fn the_readme_shows_the_leader_program_word_for_word() {
    assert_in_readme(LEADER, "tests/src/bin/readme_leader.rs");
}

#[test]
fn the_readme_shows_the_axum_program_word_for_word() {
    assert_in_readme(AXUM, "tests/src/bin/readme_axum.rs");
}

/// The order service's transcript (its docs, which the README sends a
/// newcomer to) says each response's `content-length` as its body has it.
#[test]
fn the_order_services_transcript_gives_each_body_its_length() {
    let service = include_str!("../../examples/src/bin/order-service.rs");
    let lines: Vec<&str> = service
        .lines()
        .filter_map(|l| l.strip_prefix("//!"))
        .collect();
    let mut checked = 0;
    for (at, line) in lines.iter().enumerate() {
        let Some(length) = line.trim().strip_prefix("content-length: ") else {
            continue;
        };
        // The headers end with an empty line; the body follows.
        let body = lines[at + 1..]
            .iter()
            .skip_while(|l| !l.trim().is_empty())
            .nth(1)
            .expect("a body after the headers");
        let body = body.strip_prefix(' ').unwrap_or(body);
        assert_eq!(length.parse::<usize>().unwrap(), body.len(), "{body}");
        checked += 1;
    }
    assert!(checked >= 5, "{checked} responses in the transcript");
}

/// The README's axum program, serving on a free loopback port; killed on drop.
struct App {
    child: tokio::process::Child,
    base: String,
}

impl App {
    async fn start(server: &RedisServer) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free loopback port")
            .port();
        let addr = format!("127.0.0.1:{port}");
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_readme_axum"))
            .env("REDIS_URL", server.url())
            .env("ADDR", &addr)
            .kill_on_drop(true)
            .spawn()
            .expect("start the README's axum program");
        let started = Instant::now();
        while tokio::net::TcpStream::connect(&addr).await.is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "{addr} never listened"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Self {
            child,
            base: format!("http://{addr}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_axum_program_pays_under_the_lock_and_replays_orders() {
    let server = RedisServer::start();
    let mut app = App::start(&server).await;
    let http = reqwest::Client::new();
    let base = &app.base;

    let paid = http
        .post(format!("{base}/orders/015/pay"))
        .send()
        .await
        .unwrap();
    assert_eq!(paid.status(), StatusCode::OK);
    assert_eq!(paid.text().await.unwrap(), "order 15 paid");

    let create = || {
        http.post(format!("{base}/orders"))
            .header("idempotency-key", "\"order-1\"")
            .body("book")
    };
    let first = create().send().await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let again = create().send().await.unwrap();
    assert_eq!(again.status(), StatusCode::CREATED);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.text().await.unwrap(), "book");

    let keyless = http
        .post(format!("{base}/orders"))
        .body("pen")
        .send()
        .await
        .unwrap();
    assert_eq!(keyless.status(), StatusCode::BAD_REQUEST);
    app.child.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_leader_program_is_elected_and_its_fenced_write_lands() {
    let server = RedisServer::start();
    for run in 1..=2 {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_readme_leader"))
            .env("REDIS_URL", server.url())
            .output()
            .await
            .expect("start the README's program");
        assert!(
            out.status.success(),
            "run {run}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let status: Option<String> = redis::cmd("HGET")
        .arg("{orders}:42")
        .arg("status")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(status.as_deref(), Some("cancelled"));
    // The second leader's term fenced the resource: above the first's.
    let highest: u64 = redis::cmd("GET")
        .arg(lock_runtime::fence::record_key("{orders}:sweeper"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(highest >= 2, "the fence record holds term {highest}");
}
