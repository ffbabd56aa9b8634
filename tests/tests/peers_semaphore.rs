//! The semaphore as its peers' own suites test theirs: DistributedLock's
//! `DistributedSemaphoreCoreTestCases` (`TestConcurrencyHandling`,
//! `TestHighTicketCount`) and Redisson's `RedissonSemaphoreTest`
//! (`testConcurrency_MultiInstance_1_permits`). `tests/PEERS.md` maps every
//! peer test to ours.
//!
//! Each test starts its own `redis-server` on a loopback port; separate
//! `LockClient` values stand for separate processes.

use test_support::RedisServer;
use test_support::helpers::{holders_in_a_loop, key, ms, redis_client, secs};

/// DistributedLock `TestConcurrencyHandling`: ten holders (here ten client
/// instances) loop over a three-permit semaphore; the counts of holders
/// inside seen over the run are exactly 1, 2 and 3: every permit gets used,
/// and never a fourth holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_clients_on_three_permits_fill_every_permit_and_never_a_fourth() {
    const PERMITS: u32 = 3;
    let server = RedisServer::start();
    let key = key("ten-on-three");
    let seen = holders_in_a_loop(
        &server,
        10,
        10,
        secs(40),
        move |client| client.semaphore(&key, PERMITS).ttl(secs(5)).wait(secs(30)),
        || tokio::time::sleep(ms(10)),
    )
    .await;
    let seen: Vec<usize> = seen.into_iter().collect();
    assert_eq!(seen, [1, 2, 3], "holders inside at once over the run");
}

/// DistributedLock `TestHighTicketCount` (a semaphore of `int.MaxValue`
/// tickets with a thousand-character name takes a hundred acquires): the
/// largest permit count and a long name take a hundred holders at once,
/// whose releases leave it empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_of_u32_max_permits_with_a_long_name_takes_a_hundred_holders() {
    let server = RedisServer::start();
    let (a, b) = (redis_client(&server).await, redis_client(&server).await);
    let key = key(&format!("s{} many tickets", "o".repeat(900)));
    let mut permits = Vec::new();
    for i in 0..100 {
        let client = if i % 2 == 0 { &a } else { &b };
        permits.push(
            client
                .semaphore(&key, u32::MAX)
                .acquire()
                .await
                .unwrap_or_else(|e| panic!("permit {i}: {e:?}")),
        );
    }
    let state = a.inspect(&key).await.unwrap();
    assert_eq!(state.holders.len(), 100, "{state:?}");
    for p in permits {
        p.release().await.unwrap();
    }
    let state = b.inspect(&key).await.unwrap();
    assert!(!state.held && state.holders.is_empty(), "{state:?}");
    // One permit is then a mutex among these holders again.
    let only = a.semaphore(&key, 1).acquire().await.unwrap();
    assert!(b.semaphore(&key, 1).acquire().await.unwrap_err().is_busy());
    only.release().await.unwrap();
}
