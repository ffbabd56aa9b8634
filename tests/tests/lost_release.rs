//! A guard already reported lost answers its release with `Lost`, as
//! documented, whatever the server does with the release: here the server is
//! still frozen (SIGSTOP) past the lease when `release()` is called, so the
//! release gets no answer. A caller that checks the release to flag work
//! that may have overlapped another holder must not be told "outcome
//! unknown, the lease runs out by itself" instead. On one Redis, Redlock
//! (every master frozen) and Cluster (the master of the key's slot frozen).

use std::time::Instant;

use lock_runtime::{LockClient, LockError};
use test_support::RedisServer;
use test_support::helpers::*;
use test_support::topology::{Cluster, Redlock, Topology};

/// Takes `key` for 1 s, freezes the servers with `pause`, waits for `lost()`,
/// then releases while they are still frozen: the answer must be `Lost`.
async fn release_of_a_lost_guard_on_frozen_servers(
    client: &LockClient,
    key: &str,
    pause: impl FnOnce(),
    resume: impl FnOnce(),
) {
    let guard = client.lock(key).ttl(secs(1)).acquire().await.unwrap();
    let paused = Instant::now();
    pause();
    within(secs(3), "lost() while the servers are frozen", guard.lost()).await;
    println!("lost() resolved {:?} after the freeze", paused.elapsed());
    assert!(guard.is_lost());
    let released = guard.release().await;
    resume();
    println!("release of the lost guard: {released:?}");
    assert!(
        matches!(released, Err(LockError::Lost { .. })),
        "a guard reported lost was answered {released:?}, not Lost"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_reported_lost_on_a_frozen_redis_answers_its_release_with_lost() {
    let server = RedisServer::start();
    let client = redis_client(&server).await;
    release_of_a_lost_guard_on_frozen_servers(
        &client,
        "frozen",
        || server.pause().unwrap(),
        || server.resume().unwrap(),
    )
    .await;
    // Once the server is back, the key goes to the next holder as usual.
    let next = client.lock("frozen").wait(secs(3)).acquire().await.unwrap();
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_reported_lost_on_frozen_redlock_masters_answers_its_release_with_lost() {
    let masters = Redlock::start(3);
    let client = short_timeout_client(masters.builder()).await;
    release_of_a_lost_guard_on_frozen_servers(
        &client,
        "frozen",
        || (0..3).for_each(|i| masters.pause(i)),
        || (0..3).for_each(|i| masters.resume(i)),
    )
    .await;
    let next = client.lock("frozen").wait(secs(3)).acquire().await.unwrap();
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_reported_lost_on_a_frozen_cluster_master_answers_its_release_with_lost() {
    let cluster = Cluster::start(3);
    let client = short_timeout_client(cluster.builder()).await;
    let owner = cluster.owner_of(cluster.slot_of(&lock_name("frozen")));
    let node = cluster.node(owner);
    release_of_a_lost_guard_on_frozen_servers(
        &client,
        "frozen",
        || node.pause().unwrap(),
        || node.resume().unwrap(),
    )
    .await;
}
