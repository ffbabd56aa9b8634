//! `IdempotencyLayer` under `wrk` load, as the issue ran it: 32 connections
//! posting unique keys, then the same keys again. Every request of the second
//! round must be answered `2xx` (a replay, or a first run for a key the first
//! round never got to), and no handler may run twice for one key.
//!
//! The first round ends with up to 32 requests cut off mid-way (wrk closes its
//! connections). Those were the non-`2xx` answers of the second round seen
//! before (the issue counted 9; 13, 5 and 11 in three runs of this test on
//! the old code): a request cut off while its claim was on the wire left the
//! record claimed with nobody to run the handler or release it, so its key
//! answered `409` for a whole lease. Run to completion alone leaves them (1
//! and 12 in two runs); the release of a claim cut off on the wire alone gets
//! them to 0 but lets handlers cut off mid-way run again in the second round
//! (this test's second assertion); both together: 0 and 0. Skipped, saying
//! so, without `wrk` (`cargo xtask test` installs it).

use std::collections::HashMap;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use lock_runtime::layer::IdempotencyLayer;
use test_support::RedisServer;
use test_support::helpers::redis_client;
use test_support::http::serve;

/// Unique keys per thread (`"k-<thread>-<n>"`, the same sequence each
/// round), and the answers counted by kind.
const SCRIPT: &str = r#"
local threads = {}
function setup(thread)
  table.insert(threads, thread)
  thread:set("id", #threads)
end
-- Globals: `thread:get` reads a thread's globals.
n, fresh, replayed, other = 0, 0, 0, 0
function request()
  n = n + 1
  local key = string.format('"k-%d-%d"', id, n)
  return wrk.format("POST", "/charges", { ["Idempotency-Key"] = key, ["Content-Length"] = "0" }, "")
end
function response(status, headers, body)
  if status >= 200 and status < 300 then
    if headers["idempotent-replayed"] == "true" then replayed = replayed + 1 else fresh = fresh + 1 end
  else
    other = other + 1
  end
end
function done(summary, latency, requests)
  local f, r, o = 0, 0, 0
  for _, t in ipairs(threads) do
    f = f + t:get("fresh"); r = r + t:get("replayed"); o = o + t:get("other")
  end
  io.write(string.format("COUNTS fresh=%d replayed=%d other=%d\n", f, r, o))
end
"#;

/// How often the handler ran for each key.
type Runs = Arc<Mutex<HashMap<String, u32>>>;

async fn charge(State(runs): State<Runs>, headers: HeaderMap) -> StatusCode {
    let key = headers["idempotency-key"].to_str().unwrap().to_owned();
    *runs.lock().unwrap().entry(key).or_default() += 1;
    tokio::time::sleep(Duration::from_millis(2)).await;
    StatusCode::CREATED
}

/// One round of `wrk` against `url`: (fresh, replayed, other) answers.
fn round(url: &str, script: &std::path::Path) -> (u64, u64, u64) {
    let out = Command::new("wrk")
        .args(["-t2", "-c32", "-d2s", "--timeout", "5s", "-s"])
        .arg(script)
        .arg(url)
        .output()
        .expect("run wrk");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "wrk failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let counts = text
        .lines()
        .find_map(|l| l.strip_prefix("COUNTS "))
        .unwrap_or_else(|| panic!("no counts in wrk's output: {text}"));
    let field = |name: &str| -> u64 {
        let prefix = format!("{name}=");
        counts
            .split(' ')
            .find_map(|f| f.strip_prefix(prefix.as_str()))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {counts}"))
    };
    (field("fresh"), field("replayed"), field("other"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_wrk_the_same_keys_again_are_all_answered_2xx_and_no_handler_runs_twice() {
    if Command::new("wrk").arg("--version").output().is_err() {
        eprintln!("SKIPPED: `wrk` is not installed (apt-get install wrk, or `cargo xtask test`)");
        return;
    }
    let server = tokio::task::block_in_place(RedisServer::start);
    let client = redis_client(&server).await;
    let runs = Runs::default();
    let route = post(charge)
        .with_state(runs.clone())
        .route_layer(IdempotencyLayer::new(client));
    let base = serve(Router::new().route("/charges", route)).await;
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("keys.lua");
    std::fs::write(&script, SCRIPT).unwrap();
    let url = format!("{base}/charges");

    let first = tokio::task::block_in_place(|| round(&url, &script));
    let second = tokio::task::block_in_place(|| round(&url, &script));
    println!("first round (fresh, replayed, other): {first:?}; second: {second:?}");
    assert_eq!(
        first.1, 0,
        "unique keys: nothing to replay in the first round"
    );
    assert!(
        second.1 > 100,
        "the second round replays the first: {second:?}"
    );
    assert_eq!(
        second.2, 0,
        "non-2xx answers to the same keys again: {second:?}"
    );
    let runs = runs.lock().unwrap();
    let twice: Vec<_> = runs.iter().filter(|&(_, &n)| n > 1).collect();
    assert!(twice.is_empty(), "handlers run more than once: {twice:?}");
}
