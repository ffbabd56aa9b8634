//! The mutex as its peers' own suites test theirs (Redisson's
//! `RedissonLockTest`, redsync's `mutex_test.go`, node-redlock's
//! `single.test.ts`, DistributedLock's `DistributedLockCoreTestCases` and
//! Redis cases): the behaviours those suites check that no other test here
//! did. `tests/PEERS.md` maps every peer test to ours.
//!
//! Each test starts its own `redis-server` on a loopback port, and uses
//! separate `LockClient` values where the peers use separate processes or
//! client instances.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockError, LockGuard};
use test_support::RedisServer;
use test_support::helpers::{
    fixed_lease, holders_in_a_loop, is_held, key, lock_and_release, lock_name, ms, redis_client,
    secs, within,
};

/// A `redis-server` of the test's own, a client of it, and a fresh key
/// named after `name`.
async fn with_client(name: &str) -> (RedisServer, LockClient, String) {
    let server = RedisServer::start();
    let client = redis_client(&server).await;
    (server, client, key(name))
}

/// Like [`with_client`], with two independent clients (two processes).
async fn with_two_clients(name: &str) -> (RedisServer, LockClient, LockClient, String) {
    let (server, a, key) = with_client(name).await;
    let b = redis_client(&server).await;
    (server, a, b, key)
}

/// Takes `key` with a renewed 300 ms lease, keeps its `lost()` future, ends
/// the hold with `end`, and asserts that the kept future does not resolve
/// within a second: that end (`how` names it in the failure) is no loss.
async fn assert_an_end_is_no_loss<F: Future<Output = ()>>(
    client: &LockClient,
    key: &str,
    end: impl FnOnce(LockGuard) -> F,
    how: &str,
) {
    let guard = client.lock(key).ttl(ms(300)).acquire().await.unwrap();
    let lost = guard.lost();
    end(guard).await;
    assert!(
        tokio::time::timeout(ms(1000), lost).await.is_err(),
        "lost() resolved after {how}"
    );
}

/// redsync `TestMutexUnlockExpired`, Redisson `testExpire` (the last
/// `unlock` throws `IllegalMonitorStateException`): a fixed lease that ran
/// out is no longer the holder's, even when nobody took the key meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_release_of_a_fixed_lease_that_ran_out_unclaimed_is_lost() {
    let (server, client, key) = with_client("unlock-expired").await;
    let guard = fixed_lease(&client, &key, ms(300)).await.unwrap();
    tokio::time::sleep(ms(500)).await;
    assert_eq!(
        server.cli(&["EXISTS", &lock_name(&key)]),
        "0",
        "the lease ran out on the server"
    );
    match guard.release().await {
        Err(LockError::Lost { key: k }) => assert_eq!(k, key),
        other => panic!("the release of an expired lease gave {other:?}"),
    }
}

/// node-redlock "locks fail when redis is unreachable", Redisson
/// `testRedisFailed` (`tryLock` throws `RedisException` once the server is
/// stopped): an acquire against a server that is gone is an error that says
/// so, in bounded time; never `Busy` (nobody holds the key) and never a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_against_a_killed_server_is_a_backend_error_in_bounded_time_never_busy() {
    let (mut server, client, key) = with_client("unreachable").await;
    lock_and_release(&client, &key).await;
    server.kill();
    for wait in [Duration::ZERO, secs(1)] {
        let started = Instant::now();
        let err = within(
            secs(10),
            "an acquire on a dead server",
            client.lock(&key).wait(wait).acquire(),
        )
        .await
        .unwrap_err();
        let took = started.elapsed();
        println!("wait {wait:?}: {err} after {took:?}");
        assert!(err.is_backend(), "wait {wait:?}: {err:?}");
        assert!(!err.is_busy(), "nobody holds the key: {err:?}");
        assert!(took < wait + secs(3), "wait {wait:?}: took {took:?}");
    }
}

/// DistributedLock `TestLockNamesAreCaseSensitive`: names that differ only
/// by case are two locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_that_differ_only_by_case_are_different_locks() {
    let (_server, a, b, lower) = with_two_clients("order-case-a").await;
    let upper = lower.to_uppercase();
    assert_ne!(lower, upper);
    let held = a.lock(&lower).acquire().await.unwrap();
    let other = b.lock(&upper).acquire().await.unwrap();
    assert!(b.lock(&lower).acquire().await.unwrap_err().is_busy());
    other.release().await.unwrap();
    held.release().await.unwrap();
}

/// DistributedLock `TestAcquireWithLockPrefix` (a database with key prefix
/// `P` and the name `N` is the lock `PN`). Here the prefix is a namespace,
/// not a string glued to the key: the same key under two prefixes is two
/// locks, the same prefix is one lock, and prefix plus key never collides
/// with another prefix and a longer key that spell the same text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_prefix_is_a_namespace_that_never_collides_with_a_longer_key() {
    let server = RedisServer::start();
    let with_prefix = |prefix: &'static str| {
        let url = server.url();
        async move {
            LockClient::builder()
                .redis(url)
                .key_prefix(prefix)
                .build()
                .await
                .unwrap()
        }
    };
    let p = with_prefix("p").await;
    let p_again = with_prefix("p").await;
    let q = with_prefix("q").await;
    let bare = with_prefix("").await;
    let held = p.lock("n").acquire().await.unwrap();
    assert!(
        p_again.lock("n").acquire().await.unwrap_err().is_busy(),
        "one prefix, one key: one lock"
    );
    lock_and_release(&q, "n").await;
    bare.lock("pn")
        .acquire()
        .await
        .expect("prefix `p` with key `n` is not the key `pn` without a prefix")
        .release()
        .await
        .unwrap();
    held.release().await.unwrap();
}

/// Redisson `testConcurrencyLoop_MultiInstance` and
/// `testConcurrency_MultiInstance`, DistributedLock `TestParallelism`:
/// sixteen client instances (as sixteen processes) lock one key in a loop;
/// no two are ever inside at once, and every iteration runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_clients_locking_one_key_in_a_loop_never_overlap_and_every_iteration_runs() {
    const CLIENTS: usize = 16;
    const ITERATIONS: usize = 10;
    let server = RedisServer::start();
    let key = key("multi-instance");
    // A read-modify-write that loses updates unless the lock serializes it.
    let counter = Arc::new(AtomicUsize::new(0));
    let increment = counter.clone();
    let seen = holders_in_a_loop(
        &server,
        CLIENTS,
        ITERATIONS,
        secs(40),
        move |client| client.lock(&key).ttl(secs(5)).wait(secs(30)),
        move || {
            let counter = increment.clone();
            async move {
                let read = counter.load(Ordering::SeqCst);
                tokio::time::sleep(ms(2)).await;
                counter.store(read + 1, Ordering::SeqCst);
            }
        },
    )
    .await;
    assert_eq!(seen.last(), Some(&1), "two holders at once");
    assert_eq!(counter.load(Ordering::SeqCst), CLIENTS * ITERATIONS);
}

/// Redisson `testConcurrencyTryLockUnLock` (sixteen threads `tryLock` and
/// `unlock` one lock in a tight loop; the renewal task must still know the
/// lock whenever it is held): under try-once churn from many tasks of one
/// client and of another, a holder that keeps the lock past several leases
/// is still renewed, still holds it, and its release succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_once_churn_from_many_tasks_never_stops_the_renewal_of_the_current_holder() {
    let (server, a, b, key) = with_two_clients("churn").await;
    let probe = redis_client(&server).await;
    let long_holds = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..16 {
        let client = if i % 4 == 3 { b.clone() } else { a.clone() };
        let (key, probe, long_holds) = (key.clone(), probe.clone(), long_holds.clone());
        tasks.push(tokio::spawn(async move {
            let mut took = 0;
            for _ in 0..60 {
                let guard = match client.lock(&key).ttl(ms(300)).acquire().await {
                    Ok(guard) => guard,
                    Err(e) if e.is_busy() => {
                        tokio::task::yield_now().await;
                        continue;
                    }
                    Err(e) => panic!("try-once acquire: {e:?}"),
                };
                took += 1;
                if took % 20 == 1 && long_holds.fetch_add(1, Ordering::SeqCst) < 4 {
                    // Past three leases: only renewals keep it.
                    tokio::time::sleep(ms(1000)).await;
                    assert!(!guard.is_lost(), "a held lock was not renewed");
                    assert!(is_held(&probe, &key).await, "the lease ran out");
                }
                guard.release().await.expect("the holder's release");
            }
        }));
    }
    for task in tasks {
        within(secs(30), "a churning task", task).await.unwrap();
    }
    assert!(
        long_holds.load(Ordering::SeqCst) >= 1,
        "no task held the lock long"
    );
    assert!(!is_held(&probe, &key).await, "the key is free at the end");
}

/// DistributedLock `TestHandleLostTriggersCorrectly` ("Token should not be
/// canceled by manual release"): a release by its holder is not a loss, so
/// a `lost()` future kept by a monitor task must not resolve after it (it
/// did, at the released lease's old deadline, with a "lock lost" warning and
/// a lost lease counted, until a release marked the lease ended).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_by_the_holder_does_not_resolve_a_kept_lost_future() {
    let (_server, client, key) = with_client("released-not-lost").await;
    let end = |guard: LockGuard| async move { guard.release().await.unwrap() };
    assert_an_end_is_no_loss(&client, &key, end, "a release by the holder").await;
}

/// The same for a guard dropped without a release (its release goes in the
/// background): its end is no loss either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_guard_does_not_resolve_a_kept_lost_future() {
    let (_server, client, key) = with_client("dropped-not-lost").await;
    let end = |guard: LockGuard| async move { drop(guard) };
    assert_an_end_is_no_loss(&client, &key, end, "the guard was dropped").await;
    // The background release did run: the key is free.
    lock_and_release(&client, &key).await;
}

/// DistributedLock `TestHandleLostReturnsAlreadyCanceledIfHandleAlreadyLost`
/// and `TestHandleLostTriggersCorrectly` (the lost token fires when the
/// connection is lost): a loss resolves `lost()`, and `lost()` asked after
/// the loss resolves at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_asked_after_a_loss_resolves_at_once() {
    let (server, client, key) = with_client("handle-lost").await;
    let guard = client.lock(&key).ttl(ms(300)).acquire().await.unwrap();
    let before = guard.lost();
    assert!(
        tokio::time::timeout(ms(700), guard.lost()).await.is_err(),
        "lost() resolved while the lock was held and renewed"
    );
    server.cli(&["DEL", &lock_name(&key)]);
    within(secs(2), "lost() after a delete", before).await;
    assert!(guard.is_lost());
    within(ms(20), "lost() asked after the loss", guard.lost()).await;
    assert!(guard.release().await.unwrap_err().is_lost());
}

/// Redisson `testForceUnlock` (and `RedissonFairLockTest.testForceUnlock`):
/// an operator's forced release on Redis frees the key for another client at
/// once, the evicted holder learns it lost the lock, and its late release
/// does not free the new holder's lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_frees_the_key_at_once_and_the_evicted_holder_is_told() {
    let (server, a, b, key) = with_two_clients("forced").await;
    let operator = redis_client(&server).await;
    let evicted = a.lock(&key).ttl(ms(600)).acquire().await.unwrap();
    let old_token = evicted.fencing_token().await.unwrap();
    assert!(operator.force_release(&key).await.unwrap());
    let next = b.lock(&key).acquire().await.expect("free after the force");
    assert!(next.fencing_token().await.unwrap() > old_token);
    within(secs(2), "the evicted holder's lost()", evicted.lost()).await;
    assert!(evicted.release().await.unwrap_err().is_lost());
    assert!(
        is_held(&operator, &key).await,
        "the late release freed the new holder's lock"
    );
    next.release().await.unwrap();
    assert!(
        !operator.force_release(&key).await.unwrap(),
        "nothing to force"
    );
}

/// Redisson `RedissonFairLockTest.testConcurrency_MultiInstance_Ordering`
/// (threads that queued in turn get the fair lock in that order) and
/// `testLeaseTimeout`: waiters of six client instances, queued one after
/// another behind a holder, get the mutex by releases in the order they
/// queued, with rising fencing tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_six_clients_get_the_released_mutex_in_the_order_they_queued() {
    let server = RedisServer::start();
    let holder = redis_client(&server).await;
    let key = key("fair-order");
    let first = holder.lock(&key).ttl(secs(10)).acquire().await.unwrap();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..6 {
        let client = redis_client(&server).await;
        let (key, order) = (key.clone(), order.clone());
        waiters.push(tokio::spawn(async move {
            let guard = client
                .lock(&key)
                .ttl(secs(10))
                .wait(secs(10))
                .acquire()
                .await?;
            let token = guard.fencing_token().await.unwrap();
            order.lock().unwrap().push((i, token));
            tokio::time::sleep(ms(30)).await;
            guard.release().await
        }));
        // Each is in line before the next asks.
        tokio::time::sleep(ms(60)).await;
    }
    let first_token = first.fencing_token().await.unwrap();
    first.release().await.unwrap();
    for w in waiters {
        within(secs(10), "a waiter", w).await.unwrap().unwrap();
    }
    let order = order.lock().unwrap().clone();
    let who: Vec<usize> = order.iter().map(|&(i, _)| i).collect();
    assert_eq!(who, [0, 1, 2, 3, 4, 5], "holders in turn: {order:?}");
    assert!(order[0].1 > first_token);
    assert!(order.windows(2).all(|w| w[0].1 < w[1].1), "{order:?}");
}

/// Redisson `testSubscriptionsPerConnection` (5,000 lock/unlock operations
/// on five keys from 32 threads with one subscription per connection: no
/// error, and `PUBSUB CHANNELS` is empty afterwards): heavy waiting on a few
/// keys from two clients ends with every operation done, subscriptions
/// bounded by the keys (one channel per key on the server, whichever client
/// waits), and no channel or pattern left subscribed once the notifier's
/// sweeps found them idle (unused for a whole 5 s period: 5 to 10 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heavy_waiting_on_five_keys_leaves_no_subscription_behind() {
    let server = RedisServer::start();
    let (a, b) = (redis_client(&server).await, redis_client(&server).await);
    let keys: Vec<String> = (0..5).map(|i| key(&format!("subs-{i}"))).collect();
    let done = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for t in 0..32usize {
        let client = if t % 2 == 0 { a.clone() } else { b.clone() };
        let (keys, done) = (keys.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..15usize {
                let key = &keys[(t * 7 + i * 3) % keys.len()];
                let guard = client
                    .lock(key)
                    .ttl(secs(5))
                    .wait(secs(30))
                    .acquire()
                    .await?;
                tokio::time::sleep(ms(((t + i) % 4) as u64)).await;
                guard.release().await?;
                done.fetch_add(1, Ordering::SeqCst);
            }
            Ok::<_, LockError>(())
        }));
    }
    for task in tasks {
        within(secs(40), "a worker", task).await.unwrap().unwrap();
    }
    assert_eq!(done.load(Ordering::SeqCst), 32 * 15);
    let channels = server.cli(&["PUBSUB", "CHANNELS"]);
    assert!(channels.lines().count() <= keys.len(), "{channels}");
    let started = Instant::now();
    loop {
        let channels = server.cli(&["PUBSUB", "CHANNELS"]);
        let patterns = server.cli(&["PUBSUB", "NUMPAT"]);
        if channels.is_empty() && patterns == "0" {
            break;
        }
        assert!(
            started.elapsed() < secs(12),
            "still subscribed after the work ended: channels {channels:?}, patterns {patterns}"
        );
        tokio::time::sleep(ms(50)).await;
    }
}

/// Redisson `testRemainTimeToLive2` (a lock taken three times with a 10 s
/// lease and unlocked twice still has 9 to 10 s left) and `testReentrancy`:
/// re-entries with a shorter lease, and their releases, neither shorten nor
/// end the outer holder's lease, and another client stays out meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentries_with_a_shorter_lease_and_their_releases_leave_the_outer_lease_whole() {
    let (_server, client, other, key) = with_two_clients("remain-ttl").await;
    let inner_client = client.clone();
    let inner_key = key.clone();
    let left = client
        .lock(&key)
        .ttl(secs(10))
        .run(async move {
            for _ in 0..3 {
                let again = inner_client
                    .lock(&inner_key)
                    .ttl(ms(300))
                    .acquire()
                    .await
                    .expect("re-enters");
                assert!(again.is_reentrant());
                again.release().await.expect("the inner release");
            }
            tokio::time::sleep(ms(600)).await;
            match other.lock(&inner_key).acquire().await {
                Err(LockError::Busy { retry_after, .. }) => retry_after,
                res => panic!("another client during the outer hold: {res:?}"),
            }
        })
        .await
        .unwrap();
    println!("the outer lease had {left:?} left after three inner 300 ms re-entries");
    assert!(left > secs(6), "the outer 10 s lease was cut to {left:?}");
}
