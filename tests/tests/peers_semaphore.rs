//! The semaphore as its peers' own suites test theirs: DistributedLock's
//! `DistributedSemaphoreCoreTestCases` (`TestConcurrencyHandling`,
//! `TestHighTicketCount`) and Redisson's `RedissonSemaphoreTest`
//! (`testConcurrency_MultiInstance_1_permits`). `tests/PEERS.md` maps every
//! peer test to ours.
//!
//! Each test starts its own `redis-server` on a loopback port; separate
//! `LockClient` values stand for separate processes.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use lock_runtime::LockError;
use test_support::RedisServer;
use test_support::helpers::{key, ms, redis_client, secs, within};

/// DistributedLock `TestConcurrencyHandling`: ten holders (here ten client
/// instances) loop over a three-permit semaphore; the counts of holders
/// inside seen over the run are exactly 1, 2 and 3: every permit gets used,
/// and never a fourth holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_clients_on_three_permits_fill_every_permit_and_never_a_fourth() {
    const PERMITS: u32 = 3;
    let server = RedisServer::start();
    let key = key("ten-on-three");
    let inside = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    let mut tasks = Vec::new();
    for _ in 0..10 {
        let client = redis_client(&server).await;
        let (key, inside, seen) = (key.clone(), inside.clone(), seen.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..10 {
                let permit = client
                    .semaphore(&key, PERMITS)
                    .ttl(secs(5))
                    .wait(secs(30))
                    .acquire()
                    .await?;
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                seen.lock().unwrap().insert(now);
                tokio::time::sleep(ms(10)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                permit.release().await?;
            }
            Ok::<_, LockError>(())
        }));
    }
    for task in tasks {
        within(secs(40), "a client's loop", task)
            .await
            .unwrap()
            .unwrap();
    }
    let seen: Vec<usize> = seen.lock().unwrap().iter().copied().collect();
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
