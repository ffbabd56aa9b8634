//! A release whose future is dropped midway (a `timeout` around
//! `release()`, an aborted task, a `select!` that took another branch)
//! leaves the key taken no longer than a dropped guard does: what it had
//! left to send goes out in the background. Before, the key stayed taken
//! for the rest of its lease (the watchdog had let it go, and nobody sent
//! the release again), and a record stayed in flight for its lease.

use std::time::{Duration, Instant};

use futures_util::FutureExt;
use lock_runtime::{Claimed, LockClient, LockRequest};
use test_support::RedisServer;
use test_support::helpers::*;

/// `holder` takes `key` (10 s lease) through `request`; a waiter of
/// `waiter` queues behind it (its line marks the key, so the release needs
/// the script after the plain delete); the server is frozen, and the
/// release given 100 ms, which it cannot finish. Returns how long after the
/// server came back the waiter got the lock.
async fn waiter_after_a_cancelled_release(
    server: &RedisServer,
    request: impl Fn(&LockClient) -> LockRequest,
    holder: &LockClient,
    waiter: &LockClient,
) -> Duration {
    let guard = request(holder).ttl(secs(10)).acquire().await.unwrap();
    let waiting = tokio::spawn(request(waiter).wait(secs(20)).acquire());
    tokio::time::sleep(ms(200)).await; // queued
    server.pause().unwrap();
    let release = tokio::time::timeout(ms(100), guard.release()).await;
    assert!(release.is_err(), "the release finished on a frozen server");
    server.resume().unwrap();
    let resumed = Instant::now();
    let next = within(secs(15), "the waiter gets the lock", waiting).await;
    let took = resumed.elapsed();
    next.unwrap().unwrap().release().await.unwrap();
    took
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_cancelled_midway_frees_the_key_for_the_next_waiter() {
    let server = RedisServer::start();
    let (a, b) = two_clients(&LockClient::builder().redis(server.url())).await;
    let mutex = |c: &LockClient| c.lock("cancelled");
    let read = |c: &LockClient| c.rw_lock("cancelled-rw").write();
    let permit = |c: &LockClient| c.semaphore("cancelled-sem", 1);
    for (what, took) in [
        (
            "a waiter of another client",
            waiter_after_a_cancelled_release(&server, mutex, &a, &b).await,
        ),
        (
            "a waiter of the same client",
            waiter_after_a_cancelled_release(&server, mutex, &a, &a).await,
        ),
        (
            "a write lock's waiter",
            waiter_after_a_cancelled_release(&server, read, &a, &b).await,
        ),
        (
            "a permit's waiter",
            waiter_after_a_cancelled_release(&server, permit, &a, &b).await,
        ),
    ] {
        println!("{what}: the lock {took:?} after the server came back");
        assert!(
            took < secs(3),
            "{what} waited {took:?}, about the 10 s lease"
        );
    }
}

/// A record's release or completion dropped after its first poll: the
/// record is released in the background (a completion that landed is left
/// alone), so another claim runs the work at once, not a lease later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_settle_cancelled_midway_leaves_no_claim_in_flight() {
    let server = RedisServer::start();
    let (a, b) = two_clients(&LockClient::builder().redis(server.url())).await;
    for round in 0..6 {
        let key = format!("order-{round}");
        let Claimed::Run(guard) = a.record(&key).ttl(secs(10)).claim().await.unwrap() else {
            panic!("a fresh key is ours to run");
        };
        if round % 2 == 0 {
            let _ = guard.release().now_or_never();
        } else {
            let _ = guard.complete(b"receipt").now_or_never();
        }
        let started = Instant::now();
        let next = b
            .record(&key)
            .ttl(secs(10))
            .wait(secs(15))
            .claim()
            .await
            .unwrap();
        let took = started.elapsed();
        println!("round {round}: {next:?} after {took:?}");
        assert!(
            took < secs(3),
            "round {round}: the next claim waited {took:?}"
        );
        match next {
            Claimed::Run(guard) => guard.complete(b"again").await.unwrap(),
            Claimed::Done(stored) => assert_eq!(stored, b"receipt", "round {round}"),
            other => panic!("round {round}: {other:?}"),
        }
    }
}
