//! The read-write lock as its peers' own suites test theirs: Redisson's
//! `RedissonReadWriteLockTest` (`testReadLockExpiration`,
//! `testReadLockLeaseTimeoutDiffThreadsRRW`, `testWriteRead`,
//! `testExpireWrite`, `testMultiInstanceReadLockZombieCleanup`) and
//! DistributedLock's `RedisDistributedReaderWriterLockTest`
//! (`TestCanExtendReadLock`). `tests/PEERS.md` maps every peer test to ours.
//!
//! Each test starts its own `redis-server` on a loopback port; separate
//! `LockClient` values stand for separate processes.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockError, LockGuard, LockRequest};
use test_support::RedisServer;
use test_support::helpers::{key, ms, redis_client, secs, within};

/// Three independent clients of `server` (three processes).
async fn three_clients(server: &RedisServer) -> (LockClient, LockClient, LockClient) {
    (
        redis_client(server).await,
        redis_client(server).await,
        redis_client(server).await,
    )
}

/// Takes `request` at once with a fixed lease of `ttl` (no renewal): a
/// holder whose process may die without a release.
async fn fixed_lease_of(request: LockRequest, ttl: Duration) -> LockGuard {
    request.ttl(ttl).renew(false).acquire().await.unwrap()
}

/// Takes the write lock `key` with `client`, waiting up to `wait`.
async fn write_waiting(client: &LockClient, key: &str, wait: Duration) -> LockGuard {
    client
        .rw_lock(key)
        .write()
        .wait(wait)
        .acquire()
        .await
        .unwrap()
}

/// Redisson `testReadLockExpiration` and
/// `testReadLockLeaseTimeoutDiffThreadsRRW` (readers with leases of 10 s
/// and 3 s that never unlock: the writer gets in between 8 and 10 s): every
/// reader's lease is its own, so a writer waits for the longest one, not the
/// shortest nor the last taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_waits_for_the_longest_of_the_dead_readers_leases() {
    let server = RedisServer::start();
    let (a, b, c) = three_clients(&server).await;
    let key = key("longest-reader");
    let started = Instant::now();
    let long = fixed_lease_of(a.rw_lock(&key).read(), ms(1500)).await;
    std::mem::forget(long);
    let short = fixed_lease_of(b.rw_lock(&key).read(), ms(400)).await;
    std::mem::forget(short);
    let writer = write_waiting(&c, &key, secs(5)).await;
    let at = started.elapsed();
    println!("the writer got in {at:?} after the 1.5 s reader");
    assert!(at >= ms(1400), "in before the longer lease ended: {at:?}");
    assert!(at < ms(2500), "{at:?}");
    writer.release().await.unwrap();
}

/// Redisson `testWriteRead` (twenty readers queue behind a writer; all are
/// through within a second of its unlock, each holding 800 ms): readers
/// queued behind a writer all go in together when it releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_reader_queued_behind_a_writer_goes_in_together_when_it_releases() {
    const READERS: usize = 20;
    let server = RedisServer::start();
    let (a, b) = (redis_client(&server).await, redis_client(&server).await);
    let writer_client = redis_client(&server).await;
    let key = key("write-read");
    let writer = writer_client
        .rw_lock(&key)
        .write()
        .ttl(secs(10))
        .acquire()
        .await
        .unwrap();
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut readers = Vec::new();
    for i in 0..READERS {
        let client = if i % 2 == 0 { a.clone() } else { b.clone() };
        let (key, inside, most) = (key.clone(), inside.clone(), most.clone());
        readers.push(tokio::spawn(async move {
            let r = client
                .rw_lock(&key)
                .read()
                .ttl(secs(10))
                .wait(secs(10))
                .acquire()
                .await?;
            let at = Instant::now();
            let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(ms(800)).await;
            inside.fetch_sub(1, Ordering::SeqCst);
            r.release().await?;
            Ok::<_, LockError>(at)
        }));
        tokio::time::sleep(ms(10)).await;
    }
    tokio::time::sleep(ms(200)).await;
    assert_eq!(
        inside.load(Ordering::SeqCst),
        0,
        "a reader passed the writer"
    );
    let released = Instant::now();
    writer.release().await.unwrap();
    for r in readers {
        let at = within(secs(5), "a reader", r).await.unwrap().unwrap();
        assert!(
            at - released < ms(500),
            "a reader went in {:?} after the writer left",
            at - released
        );
    }
    assert_eq!(
        most.load(Ordering::SeqCst),
        READERS,
        "readers went in apart"
    );
}

/// DistributedLock `TestCanExtendReadLock` (a 0.3 s read lease keeps a
/// writer out for more than 0.5 s) and Redisson
/// `testReadLockExpirationRenewal`: a read lease shorter than the hold is
/// renewed and keeps writers out; its release hands the lock to the writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_read_lease_is_renewed_and_keeps_a_writer_out_until_released() {
    let server = RedisServer::start();
    let (a, b) = (redis_client(&server).await, redis_client(&server).await);
    let key = key("renewed-read");
    let read = a.rw_lock(&key).read().ttl(ms(300)).acquire().await.unwrap();
    let refused = b
        .rw_lock(&key)
        .write()
        .wait(ms(1200))
        .acquire()
        .await
        .unwrap_err();
    assert!(refused.is_busy(), "{refused:?}");
    assert!(!read.is_lost());
    let writer = {
        let (b, key) = (b.clone(), key.clone());
        tokio::spawn(async move { b.rw_lock(&key).write().wait(secs(5)).acquire().await })
    };
    tokio::time::sleep(ms(300)).await;
    assert!(!writer.is_finished(), "the writer got in past a held read");
    let released = Instant::now();
    read.release().await.unwrap();
    // The release hands the lock to the queued writer in the same step: it
    // is held, and nobody waits, as soon as the release has answered (a
    // release that only freed it would leave the writer to wake on a notice
    // or at the lease it last saw; timing that cannot tell the two apart).
    let state = a.inspect(&key).await.unwrap();
    assert!(
        state.held && state.waiters == 0,
        "not handed to the writer: {state:?}"
    );
    let w = within(secs(5), "the writer", writer)
        .await
        .unwrap()
        .unwrap();
    assert!(released.elapsed() < ms(500), "{:?}", released.elapsed());
    w.release().await.unwrap();
}

/// Redisson `testMultiInstanceReadLockZombieCleanup` (instance A dies
/// holding a read lock; B reads past A's lease, unlocks, and a writer must
/// then get in): a live reader's renewals do not keep a dead reader's lease
/// alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_readers_renewals_do_not_keep_a_dead_readers_lease_alive() {
    let server = RedisServer::start();
    let (a, b, c) = three_clients(&server).await;
    let key = key("zombie-reader");
    // A's process dies while reading: its 400 ms lease is never renewed.
    let dead = fixed_lease_of(a.rw_lock(&key).read(), ms(400)).await;
    std::mem::forget(dead);
    drop(a);
    let live = b.rw_lock(&key).read().ttl(ms(400)).acquire().await.unwrap();
    // Several of B's renewals, past A's lease.
    tokio::time::sleep(ms(1200)).await;
    assert!(!live.is_lost());
    live.release().await.unwrap();
    let w = c
        .rw_lock(&key)
        .write()
        .wait(ms(100))
        .acquire()
        .await
        .expect("the dead reader's lease ended long ago");
    w.release().await.unwrap();
}

/// Redisson `testExpireWrite` (a 2 s write lease ends, another thread's
/// write lock gets in within about 2 s, and the first one's `unlock` then
/// throws): a fixed write lease that ran out lets a waiting writer in
/// about then, and its late release is lost and leaves the new writer's
/// lock alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_write_lease_lets_the_next_writer_in_and_its_late_release_is_lost() {
    let server = RedisServer::start();
    let (a, b, c) = three_clients(&server).await;
    let key = key("expire-write");
    let started = Instant::now();
    let first = fixed_lease_of(a.rw_lock(&key).write(), ms(500)).await;
    // Asked while held: a token is minted only for a live lease.
    let first_token = first.fencing_token().await.unwrap();
    let second = write_waiting(&b, &key, secs(3)).await;
    let at = started.elapsed();
    assert!(at >= ms(450) && at < ms(1500), "{at:?}");
    assert!(second.fencing_token().await.unwrap() > first_token);
    assert!(first.release().await.unwrap_err().is_lost());
    assert!(
        c.rw_lock(&key)
            .read()
            .acquire()
            .await
            .unwrap_err()
            .is_busy(),
        "the late release freed the new writer's lock"
    );
    second.release().await.unwrap();
}
