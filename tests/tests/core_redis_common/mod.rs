//! What the `core_redis*` suites share: clients that capture the library's
//! warnings, a hand-over, and readers of `redis-cli` and `INFO` answers.

#![allow(dead_code)] // each test file uses its own part of it

use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockGuard};
use test_support::RedisServer;

use test_support::helpers::*;
use tests::core_support;

pub async fn client(server: &RedisServer) -> LockClient {
    core_support::capture_warnings();
    default_redis_client(server).await
}

/// Two independent clients of `server`.
pub async fn two_clients(server: &RedisServer) -> (LockClient, LockClient) {
    (client(server).await, client(server).await)
}

/// Holds `key` with a lease of `ttl` for `after`, then does `event` to the
/// server: the guard, and how long after the event its `lost()` resolved
/// (`what` fails the test if not within 3 s).
pub async fn lost_after(
    server: &mut RedisServer,
    client: &LockClient,
    key: &str,
    ttl: Duration,
    after: Duration,
    what: &str,
    event: impl FnOnce(&mut RedisServer),
) -> (LockGuard, Duration) {
    let guard = client.lock(key).ttl(ttl).acquire().await.unwrap();
    let lost = guard.lost();
    tokio::time::sleep(after).await;
    let at = Instant::now();
    event(server);
    within(secs(3), what, lost).await;
    (guard, at.elapsed())
}

/// The last line of a `redis-cli` answer as a number (`PUBSUB NUMSUB`, `EXISTS`, ...).
pub fn last_number(answer: &str) -> i64 {
    answer
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("not a number: {answer:?}"))
}

pub fn connections_received(server: &RedisServer) -> u64 {
    let stats = server.cli(&["INFO", "stats"]);
    stats
        .lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .map(|n| n.trim().parse().unwrap())
        .expect("INFO stats")
}

/// One handoff: `holder_client` holds `key` with a long lease, a task of
/// `waiter_client` waits for it, the holder releases. Returns release -> acquired.
pub async fn handoff(
    holder_client: &LockClient,
    waiter_client: &LockClient,
    key: &str,
) -> Duration {
    let holder = holder_client
        .lock(key)
        .ttl(secs(10))
        .acquire()
        .await
        .unwrap();
    let waiter = spawn_waiter(waiter_client, key, secs(5));
    tokio::time::sleep(ms(100)).await;
    release_to_waiter(holder, waiter, secs(6)).await
}
