//! Read-write locks and semaphores (the synchronizer family) on every
//! backend that offers them: the embedded one, one Redis, a cluster and
//! Sentinel with replica acks; Redlock refuses them with a `Config` error.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockError, LockGuard, LockRequest};
use test_support::RedisServer;
use test_support::helpers::{
    default_redis_client, lock_and_release, memory_client, ms, secs, two_clients, two_clients_on,
    within,
};
use test_support::topology::{Cluster, Redlock, SentinelSetup};
use tokio::task::JoinHandle;

/// Acquires `request` in a task of its own, with a 20 s lease and a 10 s
/// wait: the guard, and when it was held.
fn spawn_acquire(request: LockRequest) -> JoinHandle<Result<(LockGuard, Instant), LockError>> {
    tokio::spawn(async move {
        let guard = request.ttl(secs(20)).wait(secs(10)).acquire().await?;
        Ok((guard, Instant::now()))
    })
}

/// Hand-overs must come by notice: far sooner than the 20 s leases the
/// waiters see, after which a timer would wake them.
const PROMPT: Duration = Duration::from_millis(1500);

async fn readers_share_and_exclude_writers(a: &LockClient, b: &LockClient, key: &str) {
    let r1 = a.rw_lock(key).read().ttl(secs(20)).acquire().await.unwrap();
    let r2 = b.rw_lock(key).read().ttl(secs(20)).acquire().await.unwrap();
    let busy = b.rw_lock(key).write().acquire().await.unwrap_err();
    assert!(busy.is_busy(), "{busy:?}");
    // The mutex and the semaphore of the same name are other resources.
    lock_and_release(a, key).await;
    let writer = spawn_acquire(b.rw_lock(key).write());
    tokio::time::sleep(ms(100)).await;
    r1.release().await.unwrap();
    tokio::time::sleep(ms(50)).await;
    assert!(!writer.is_finished(), "one reader still holds");
    let released = Instant::now();
    r2.release().await.unwrap();
    let (w, at) = within(secs(5), "the writer", writer)
        .await
        .unwrap()
        .unwrap();
    assert!(
        at - released < PROMPT,
        "the writer slept: {:?}",
        at - released
    );
    let busy = a.rw_lock(key).read().acquire().await.unwrap_err();
    assert!(busy.is_busy(), "a writer excludes readers: {busy:?}");
    let fence = w.fencing_token().await.unwrap();
    w.release().await.unwrap();
    let w2 = a.rw_lock(key).write().acquire().await.unwrap();
    assert!(
        w2.fencing_token().await.unwrap() > fence,
        "writers' tokens rise"
    );
    w2.release().await.unwrap();
}

/// A queued writer is not starved: readers arriving after it queue behind it.
async fn a_waiting_writer_goes_before_later_readers(a: &LockClient, b: &LockClient, key: &str) {
    let r = a.rw_lock(key).read().ttl(secs(20)).acquire().await.unwrap();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let spawn = |client: &LockClient, write: bool, name: &'static str| {
        let (client, key, order) = (client.clone(), key.to_owned(), order.clone());
        tokio::spawn(async move {
            let side = client.rw_lock(&key);
            let side = if write { side.write() } else { side.read() };
            let g = side.ttl(secs(20)).wait(secs(10)).acquire().await?;
            order.lock().unwrap().push(name);
            tokio::time::sleep(ms(50)).await;
            g.release().await
        })
    };
    let writer = spawn(b, true, "writer");
    tokio::time::sleep(ms(100)).await;
    // A new reader, trying once, is refused while the writer waits.
    let busy = a.rw_lock(key).read().acquire().await.unwrap_err();
    assert!(busy.is_busy(), "{busy:?}");
    let reader = spawn(a, false, "reader");
    tokio::time::sleep(ms(100)).await;
    r.release().await.unwrap();
    within(secs(5), "the writer", writer)
        .await
        .unwrap()
        .unwrap();
    within(secs(5), "the reader", reader)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(*order.lock().unwrap(), ["writer", "reader"]);
}

/// A writer that gives up lets the readers queued behind it in at once
/// (not when the readers' lease timers fire).
async fn readers_behind_a_writer_that_gives_up_go_in(a: &LockClient, b: &LockClient, key: &str) {
    let r1 = a.rw_lock(key).read().ttl(secs(20)).acquire().await.unwrap();
    let writer = {
        let b = b.clone();
        let key = key.to_owned();
        tokio::spawn(async move { b.rw_lock(&key).write().wait(ms(300)).acquire().await })
    };
    tokio::time::sleep(ms(100)).await;
    let reader = spawn_acquire(a.rw_lock(key).read());
    let busy = within(secs(2), "the writer", writer)
        .await
        .unwrap()
        .unwrap_err();
    assert!(busy.is_busy(), "{busy:?}");
    let gave_up = Instant::now();
    let (r, at) = within(secs(5), "the reader", reader)
        .await
        .unwrap()
        .unwrap();
    r.release().await.unwrap();
    assert!(
        at.saturating_duration_since(gave_up) < PROMPT,
        "{:?}",
        at - gave_up
    );
    r1.release().await.unwrap();
}

/// Readers let in together (here when a dead writer's lease ends, which
/// sends no notice: the first reader to look grants every queued one) each
/// get a fencing token of their own.
async fn shared_holders_get_tokens_of_their_own(a: &LockClient, b: &LockClient, key: &str) {
    let dead = a
        .rw_lock(key)
        .write()
        .ttl(ms(600))
        .renew(false)
        .acquire()
        .await
        .unwrap();
    let writer_token = dead.fencing_token().await.unwrap();
    std::mem::forget(dead);
    let readers: Vec<_> = (0..4)
        .map(|i| {
            let client = if i % 2 == 0 { a.clone() } else { b.clone() };
            let key = key.to_owned();
            tokio::spawn(async move {
                let r = client
                    .rw_lock(&key)
                    .read()
                    .ttl(secs(20))
                    .wait(secs(10))
                    .acquire()
                    .await?;
                tokio::time::sleep(ms(200)).await;
                let token = r.fencing_token().await.unwrap();
                r.release().await?;
                Ok::<_, LockError>(token)
            })
        })
        .collect();
    let mut tokens = Vec::new();
    for r in readers {
        tokens.push(within(secs(5), "a reader", r).await.unwrap().unwrap());
    }
    tokens.sort();
    tokens.dedup();
    assert_eq!(tokens.len(), 4, "readers shared tokens: {tokens:?}");
    assert!(tokens[0] > writer_token);
}

/// A reader that died (its lease not renewed) holds writers off only until
/// its lease ends; so does a permit.
async fn dead_holders_expire(a: &LockClient, b: &LockClient, key: &str) {
    let dead = a
        .rw_lock(key)
        .read()
        .ttl(ms(600))
        .renew(false)
        .acquire()
        .await
        .unwrap();
    std::mem::forget(dead);
    let started = Instant::now();
    let w = b
        .rw_lock(key)
        .write()
        .wait(secs(5))
        .acquire()
        .await
        .unwrap();
    assert!(started.elapsed() < secs(2), "{:?}", started.elapsed());
    w.release().await.unwrap();
    let dead = a
        .semaphore(key, 1)
        .ttl(ms(600))
        .renew(false)
        .acquire()
        .await
        .unwrap();
    let lost = dead.lost();
    std::mem::forget(dead);
    within(secs(3), "the lease ends", lost).await;
    // `lost()` resolves at the holder's own, conservative deadline (from
    // the acquire's send time), a moment before the server's lease ends:
    // the permit comes back within a few ms of it.
    let p = b.semaphore(key, 1).wait(ms(500)).acquire().await.unwrap();
    p.release().await.unwrap();
}

async fn permits_limit_holders(a: &LockClient, b: &LockClient, key: &str) {
    let p1 = a.semaphore(key, 2).ttl(ms(600)).acquire().await.unwrap();
    let p2 = b.semaphore(key, 2).ttl(ms(600)).acquire().await.unwrap();
    // Renewed: still held after two leases.
    tokio::time::sleep(ms(1300)).await;
    assert!(!p1.is_lost() && !p2.is_lost());
    let busy = a.semaphore(key, 2).acquire().await.unwrap_err();
    assert!(busy.is_busy(), "{busy:?}");
    // A caller that allows more takes a third permit; one that allows
    // fewer is refused.
    let p3 = b.semaphore(key, 3).acquire().await.unwrap();
    assert!(a.semaphore(key, 1).acquire().await.unwrap_err().is_busy());
    p3.release().await.unwrap();
    let waiter = spawn_acquire(b.semaphore(key, 2));
    tokio::time::sleep(ms(100)).await;
    let released = Instant::now();
    p1.release().await.unwrap();
    let (p, at) = within(secs(5), "the waiter", waiter)
        .await
        .unwrap()
        .unwrap();
    p.release().await.unwrap();
    assert!(
        at - released < PROMPT,
        "the waiter slept: {:?}",
        at - released
    );
    p2.release().await.unwrap();
    // All released: the full count is free again.
    let all: Vec<_> =
        futures_util::future::try_join_all((0..2).map(|_| a.semaphore(key, 2).acquire()))
            .await
            .unwrap();
    for p in all {
        p.release().await.unwrap();
    }
}

/// Waiters are served in arrival order, one permit each.
async fn waiters_are_served_in_order(a: &LockClient, b: &LockClient, key: &str) {
    let p = a.semaphore(key, 1).acquire().await.unwrap();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..4 {
        let client = if i % 2 == 0 { a.clone() } else { b.clone() };
        let (key, order) = (key.to_owned(), order.clone());
        tasks.push(tokio::spawn(async move {
            let p = client.semaphore(&key, 1).wait(secs(10)).acquire().await?;
            order.lock().unwrap().push(i);
            p.release().await
        }));
        tokio::time::sleep(ms(60)).await;
    }
    p.release().await.unwrap();
    for t in tasks {
        within(secs(5), "a waiter", t).await.unwrap().unwrap();
    }
    assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3]);
}

/// At most `permits` holders at any moment, under contention.
async fn never_more_than_the_permits(a: &LockClient, b: &LockClient, key: &str) {
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..12)
        .map(|i| {
            let client = if i % 2 == 0 { a.clone() } else { b.clone() };
            let (key, inside, most) = (key.to_owned(), inside.clone(), most.clone());
            tokio::spawn(async move {
                for _ in 0..5 {
                    client
                        .semaphore(&key, 3)
                        .wait(secs(20))
                        .run(async {
                            let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                            most.fetch_max(now, Ordering::SeqCst);
                            tokio::time::sleep(ms(5)).await;
                            inside.fetch_sub(1, Ordering::SeqCst);
                        })
                        .await?;
                }
                Ok::<_, LockError>(())
            })
        })
        .collect();
    for t in tasks {
        within(secs(30), "a worker", t).await.unwrap().unwrap();
    }
    assert_eq!(most.load(Ordering::SeqCst), 3);
}

async fn reentrancy(a: &LockClient, key: &str) {
    let inner = a.clone();
    let k = key.to_owned();
    a.rw_lock(key)
        .read()
        .run(async move {
            let again = inner.rw_lock(&k).read().acquire().await.unwrap();
            assert!(again.is_reentrant());
            let err = inner.rw_lock(&k).write().acquire().await.unwrap_err();
            assert!(matches!(err, LockError::Config(_)), "{err:?}");
        })
        .await
        .unwrap();
    let inner = a.clone();
    let k = key.to_owned();
    a.rw_lock(key)
        .write()
        .run(async move {
            assert!(
                inner
                    .rw_lock(&k)
                    .read()
                    .acquire()
                    .await
                    .unwrap()
                    .is_reentrant()
            );
            assert!(
                inner
                    .rw_lock(&k)
                    .write()
                    .acquire()
                    .await
                    .unwrap()
                    .is_reentrant()
            );
            // The mutex of the same name is another lock: taken, not re-entered.
            assert!(!inner.lock(&k).acquire().await.unwrap().is_reentrant());
        })
        .await
        .unwrap();
    let inner = a.clone();
    let k = key.to_owned();
    a.semaphore(key, 1)
        .run(async move {
            let again = inner.semaphore(&k, 1).acquire().await.unwrap();
            assert!(again.is_reentrant(), "a permit inside a permit re-enters");
        })
        .await
        .unwrap();
}

/// A waiter whose future is dropped leaves the queue: the next release is
/// not handed to it (which would keep the key for a hand-over lease).
async fn cancelled_waiters_leave_the_line(a: &LockClient, b: &LockClient, key: &str) {
    for write in [false, true] {
        let holder = if write {
            a.rw_lock(key).read().acquire().await.unwrap()
        } else {
            a.semaphore(key, 1).acquire().await.unwrap()
        };
        let waiter = {
            let b = b.clone();
            let key = key.to_owned();
            tokio::spawn(async move {
                let request = if write {
                    b.rw_lock(&key).write()
                } else {
                    b.semaphore(&key, 1)
                };
                request.wait(secs(10)).acquire().await
            })
        };
        tokio::time::sleep(ms(100)).await;
        waiter.abort();
        let _ = waiter.await;
        // The clean-up runs in the background.
        tokio::time::sleep(ms(100)).await;
        holder.release().await.unwrap();
        let next = if write {
            b.rw_lock(key).write().acquire().await
        } else {
            b.semaphore(key, 1).acquire().await
        };
        next.unwrap().release().await.unwrap();
    }
}

/// `run` ends with `Lost` when a permit's or a reader's lease is lost.
async fn run_is_cancelled_when_the_lease_is_lost(a: &LockClient, key: &str) {
    for read in [false, true] {
        let request = if read {
            a.rw_lock(key).read()
        } else {
            a.semaphore(key, 2)
        };
        let started = Instant::now();
        let err = request
            .ttl(ms(300))
            .renew(false)
            .run(tokio::time::sleep(secs(10)))
            .await
            .unwrap_err();
        assert!(err.is_lost(), "{err:?}");
        assert!(started.elapsed() < secs(2), "{:?}", started.elapsed());
    }
}

async fn all_checks(a: &LockClient, b: &LockClient) {
    cancelled_waiters_leave_the_line(a, b, "catalog:13").await;
    run_is_cancelled_when_the_lease_is_lost(a, "catalog:14").await;
    readers_share_and_exclude_writers(a, b, "catalog:7").await;
    a_waiting_writer_goes_before_later_readers(a, b, "catalog:8").await;
    readers_behind_a_writer_that_gives_up_go_in(a, b, "catalog:15").await;
    dead_holders_expire(a, b, "catalog:9").await;
    shared_holders_get_tokens_of_their_own(a, b, "catalog:16").await;
    permits_limit_holders(a, b, "exports:tenant-9").await;
    waiters_are_served_in_order(a, b, "exports:tenant-10").await;
    never_more_than_the_permits(a, b, "exports:tenant-11").await;
    reentrancy(a, "catalog:12").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_backend() {
    let client = memory_client().await;
    all_checks(&client, &client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_redis() {
    let server = RedisServer::start();
    let (a, b) = two_clients(&LockClient::builder().redis(server.url())).await;
    all_checks(&a, &b).await;
}

/// An operator deleting a semaphore's holders: the holder learns it at its
/// next renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_permit_is_reported_lost() {
    let server = RedisServer::start();
    let client = default_redis_client(&server).await;
    let permit = client
        .semaphore("exports", 2)
        .ttl(ms(300))
        .acquire()
        .await
        .unwrap();
    let reader = client
        .rw_lock("catalog")
        .read()
        .ttl(ms(300))
        .acquire()
        .await
        .unwrap();
    assert_eq!(
        server.cli(&["DEL", "lock:P{exports}", "lock:R{catalog}"]),
        "2"
    );
    within(secs(2), "the permit is lost", permit.lost()).await;
    within(secs(2), "the read lock is lost", reader.lost()).await;
    assert!(permit.release().await.unwrap_err().is_lost());
    assert!(reader.release().await.unwrap_err().is_lost());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster() {
    let (_cluster, a, b) = two_clients_on(Cluster::start(3)).await;
    all_checks(&a, &b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_with_replica_acks() {
    let (_setup, a, b) = two_clients_on(SentinelSetup::start()).await;
    all_checks(&a, &b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_refuses_them_clearly() {
    let nodes = Redlock::start(3);
    let client = LockClient::builder()
        .redlock(nodes.urls())
        .build()
        .await
        .unwrap();
    for err in [
        client.rw_lock("k").read().acquire().await.unwrap_err(),
        client.rw_lock("k").write().acquire().await.unwrap_err(),
        client.semaphore("k", 2).acquire().await.unwrap_err(),
    ] {
        assert!(matches!(err, LockError::Config(_)), "{err:?}");
        assert!(err.to_string().contains("redlock"), "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_an_error() {
    let client = memory_client().await;
    let err = client.semaphore("k", 0).acquire().await.unwrap_err();
    assert!(matches!(err, LockError::Config(_)), "{err:?}");
    let err = client.rw_lock("").read().acquire().await.unwrap_err();
    assert!(matches!(err, LockError::InvalidKey(_)), "{err:?}");
    let err = client
        .semaphore("k", 2)
        .ttl(Duration::ZERO)
        .acquire()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Config(_)), "{err:?}");
}
