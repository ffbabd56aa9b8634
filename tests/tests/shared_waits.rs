//! Waiters of read-write locks and semaphores, on a Redis server and on the
//! embedded backend:
//!
//! * a semaphore's waiter is granted by its own count, whoever makes room
//!   for it (a release, or a newcomer with a larger count passing through
//!   the line): callers that name different counts for one key each hold a
//!   permit only while fewer than their own count are held;
//! * a waiter that died in line (its entry left behind, nobody to take it
//!   out) is skipped once its wait has ended, as a mutex's is: the next
//!   release or newcomer finds the line empty instead of handing the key to
//!   the dead entry for a hand-over lease.
//!
//! Separate `LockClient` values stand for separate processes on Redis; on
//! the embedded backend (one store per client) they are clones of one.

use std::future::Future;
use std::pin::Pin;
use std::time::Instant;

use lock_runtime::{LockClient, LockError, LockGuard};
use test_support::RedisServer;
use test_support::helpers::{key, memory_client, ms, redis_client, secs};

/// Three clients of one store: Redis clients of their own, or clones of
/// one embedded client.
async fn three(server: Option<&RedisServer>) -> [LockClient; 3] {
    match server {
        Some(server) => [
            redis_client(server).await,
            redis_client(server).await,
            redis_client(server).await,
        ],
        None => {
            let client = memory_client().await;
            [client.clone(), client.clone(), client]
        }
    }
}

async fn holders(client: &LockClient, key: &str) -> usize {
    client.inspect(key).await.unwrap().holders.len()
}

fn is_busy(acquired: &Result<LockGuard, LockError>) -> bool {
    matches!(acquired, Err(e) if e.is_busy())
}

async fn a_waiter_is_granted_by_its_own_count(server: Option<&RedisServer>) {
    let [big, small, third] = three(server).await;

    // Three of four permits held; a caller allowing 2 waits. A release
    // leaves 2 held: still not fewer than its 2.
    let k = key("own-count-release");
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(big.semaphore(&k, 4).acquire().await.unwrap());
    }
    let waiter = {
        let (small, k) = (small.clone(), k.clone());
        tokio::spawn(async move { small.semaphore(&k, 2).wait(secs(2)).acquire().await })
    };
    tokio::time::sleep(ms(200)).await;
    held.pop().unwrap().release().await.unwrap();
    tokio::time::sleep(ms(200)).await;
    assert_eq!(
        holders(&big, &k).await,
        2,
        "the release granted the count-2 waiter a third permit"
    );
    // One more release: 1 held, fewer than 2, so it is granted.
    held.pop().unwrap().release().await.unwrap();
    let granted = waiter
        .await
        .unwrap()
        .expect("granted once fewer than its 2 are held");
    assert_eq!(holders(&big, &k).await, 2);
    drop((granted, held));

    // A one-permit semaphore held, a one-permit waiter in line: a newcomer
    // allowing 5 passes through the line; it must neither grant the waiter
    // a second permit beside the holder nor overtake it.
    let k = key("own-count-newcomer");
    let holder = big.semaphore(&k, 1).acquire().await.unwrap();
    let waiter = {
        let (small, k) = (small.clone(), k.clone());
        tokio::spawn(async move { small.semaphore(&k, 1).wait(secs(3)).acquire().await })
    };
    tokio::time::sleep(ms(200)).await;
    let newcomer = third.semaphore(&k, 5).acquire().await;
    assert!(
        is_busy(&newcomer),
        "a newcomer overtook the line: {newcomer:?}"
    );
    assert_eq!(
        holders(&big, &k).await,
        1,
        "the newcomer's count granted the count-1 waiter a permit beside the holder"
    );
    assert!(
        !waiter.is_finished(),
        "the count-1 waiter holds beside the holder"
    );
    holder.release().await.unwrap();
    let granted = waiter.await.unwrap().expect("granted at the release");
    assert_eq!(holders(&big, &k).await, 1);
    granted.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_waiter_is_granted_by_its_own_count_on_redis() {
    let server = RedisServer::start();
    a_waiter_is_granted_by_its_own_count(Some(&server)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_waiter_is_granted_by_its_own_count_on_the_embedded_backend() {
    a_waiter_is_granted_by_its_own_count(None).await;
}

/// A waiter that dies in line: its acquire is polled until it queued, then
/// leaked, so it neither takes its entry out nor ever asks again (as a
/// process killed while waiting).
async fn die_in_line(acquire: impl Future<Output = Result<LockGuard, LockError>> + Send + 'static) {
    let mut acquire: Pin<Box<dyn Future<Output = _> + Send>> = Box::pin(acquire);
    let polled = tokio::time::timeout(ms(300), &mut acquire).await;
    assert!(
        polled.is_err(),
        "the doomed waiter was not kept waiting: {polled:?}"
    );
    std::mem::forget(acquire);
}

async fn a_dead_waiter_is_skipped_once_its_wait_ended(server: Option<&RedisServer>) {
    let [holder, doomed, newcomer] = three(server).await;
    for rw in [false, true] {
        let k = key(if rw {
            "dead-waiter-rw"
        } else {
            "dead-waiter-semaphore"
        });
        let request = |client: &LockClient| {
            if rw {
                client.rw_lock(&k).write()
            } else {
                client.semaphore(&k, 1)
            }
        };
        let held = request(&holder).acquire().await.unwrap();
        let queued = Instant::now();
        die_in_line(request(&doomed).wait(secs(1)).acquire()).await;
        // Released once the doomed waiter's wait has ended: nobody left in
        // line, so a newcomer that tries once takes the key at once.
        tokio::time::sleep(secs(1).saturating_sub(queued.elapsed()) + ms(300)).await;
        held.release().await.unwrap();
        let once = request(&newcomer).acquire().await;
        assert!(
            once.is_ok(),
            "rw {rw}: a newcomer after the release: {once:?} (the dead waiter's entry was granted)"
        );
        let state = holder.inspect(&k).await.unwrap();
        assert!(
            state.waiting.is_empty(),
            "rw {rw}: the dead waiter is still in line: {state:?}"
        );
        once.unwrap().release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_waiter_of_a_semaphore_or_rw_lock_is_skipped_on_redis() {
    let server = RedisServer::start();
    a_dead_waiter_is_skipped_once_its_wait_ended(Some(&server)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_waiter_of_a_semaphore_or_rw_lock_is_skipped_on_the_embedded_backend() {
    a_dead_waiter_is_skipped_once_its_wait_ended(None).await;
}
