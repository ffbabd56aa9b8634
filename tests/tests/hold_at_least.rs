//! `hold_at_least`: a key released early stays taken until its minimum hold
//! ends (at most one run per interval for scheduled jobs), on every backend;
//! fencing, `lost()` and waiting are unchanged.

use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockError, LockGuard};
use test_support::RedisServer;
use test_support::helpers::{
    is_held, memory_client, ms, secs, two_clients, two_clients_on, within,
};
use test_support::topology::{Cluster, Redlock, SentinelSetup};

const MIN: Duration = Duration::from_millis(600);

/// `key` on `a` with a 20 s lease and the minimum hold.
async fn long_job(a: &LockClient, key: &str) -> LockGuard {
    a.lock(key)
        .ttl(secs(20))
        .hold_at_least(MIN)
        .acquire()
        .await
        .unwrap()
}

/// The checks every backend passes: `a` holds with a minimum hold and
/// releases at once; `b` (another client, or `a` itself on the embedded
/// backend) finds the key taken until the minimum hold has passed, and a
/// waiter gets it soon after (woken, not sleeping out the lease it saw).
async fn stays_taken_until_the_minimum_hold(a: &LockClient, b: &LockClient, key: &str) {
    let job = long_job(a, key).await;
    let acquired = Instant::now();
    let fence = job.fencing_token().await.unwrap();
    // A waiter queued while the job runs, with a 20 s lease in view.
    let waiter = {
        let b = b.clone();
        let key = key.to_owned();
        tokio::spawn(async move {
            let guard = b.lock(&key).wait(secs(10)).acquire().await?;
            let at = Instant::now();
            let fencing = guard.fencing_token().await.unwrap();
            guard.release().await?;
            Ok::<_, LockError>((at, fencing))
        })
    };
    tokio::time::sleep(ms(50)).await;
    job.release().await.unwrap();
    // Released long before the minimum: still taken, by nobody's guard.
    let skipped = b.lock(key).acquire().await.unwrap_err();
    assert!(skipped.is_busy(), "{skipped:?}");
    assert!(is_held(b, key).await);
    let (taken_at, fencing) = within(secs(5), "the waiter", waiter)
        .await
        .unwrap()
        .unwrap();
    let after = taken_at - acquired;
    assert!(
        after >= MIN,
        "taken {after:?} after acquisition, before {MIN:?}"
    );
    assert!(
        after < MIN + ms(1500),
        "the waiter slept out the lease it saw: taken only after {after:?}"
    );
    assert!(fencing > fence, "fencing tokens keep rising");
    // A holder that outlives its minimum hold releases as usual.
    let late = a.lock(key).hold_at_least(ms(100)).acquire().await.unwrap();
    tokio::time::sleep(ms(200)).await;
    late.release().await.unwrap();
    assert!(
        !is_held(b, key).await,
        "a release after the minimum frees it"
    );
}

/// Dropping the guard (no `release()`) keeps the minimum too.
async fn a_dropped_guard_keeps_the_minimum(a: &LockClient, b: &LockClient, key: &str) {
    let job = a.lock(key).hold_at_least(MIN).acquire().await.unwrap();
    let acquired = Instant::now();
    drop(job);
    tokio::time::sleep(ms(100)).await;
    assert!(b.lock(key).acquire().await.unwrap_err().is_busy());
    let guard = b.lock(key).wait(secs(5)).acquire().await.unwrap();
    assert!(acquired.elapsed() >= MIN);
    guard.release().await.unwrap();
}

/// A read lock and a semaphore's permit keep theirs too: a writer, or a
/// caller wanting the only permit, waits until the minimum hold has passed.
async fn shared_kinds_keep_the_minimum(a: &LockClient, b: &LockClient) {
    for semaphore in [false, true] {
        let (held, wanted) = if semaphore {
            (a.semaphore("export", 1), b.semaphore("export", 1))
        } else {
            (a.rw_lock("report").read(), b.rw_lock("report").write())
        };
        let job = held.hold_at_least(MIN).acquire().await.unwrap();
        let acquired = Instant::now();
        job.release().await.unwrap();
        assert!(wanted.clone().acquire().await.unwrap_err().is_busy());
        let next = wanted.wait(secs(5)).acquire().await.unwrap();
        let after = acquired.elapsed();
        assert!(after >= MIN, "taken {after:?} after acquisition");
        assert!(after < MIN + ms(1500), "the waiter slept: {after:?}");
        next.release().await.unwrap();
    }
}

async fn all_checks(a: &LockClient, b: &LockClient) {
    stays_taken_until_the_minimum_hold(a, b, "nightly-report").await;
    a_dropped_guard_keeps_the_minimum(a, b, "hourly-sync").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_backend() {
    let client = memory_client().await;
    all_checks(&client, &client).await;
    shared_kinds_keep_the_minimum(&client, &client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_redis() {
    let server = RedisServer::start();
    let (a, b) = two_clients(&LockClient::builder().redis(server.url())).await;
    all_checks(&a, &b).await;
    shared_kinds_keep_the_minimum(&a, &b).await;
    // Within one client too: a task of the same client waits on the
    // server, not in the client's own line, while the key is kept.
    stays_taken_until_the_minimum_hold(&a, &a, "weekly-digest").await;
}

/// A release under `hold_at_least` whose connection was just killed is sent
/// again on a new one: the key is kept for the minimum, not for the rest of
/// its 20 s lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_connection_does_not_keep_the_key_for_its_whole_lease() {
    let server = RedisServer::start();
    let (a, b) = two_clients(&LockClient::builder().redis(server.url())).await;
    for round in 0..3 {
        let key = format!("job-{round}");
        let job = long_job(&a, &key).await;
        let acquired = Instant::now();
        // Every client connection but redis-cli's own.
        server.cli(&["CLIENT", "KILL", "TYPE", "normal"]);
        job.release().await.unwrap();
        let next = b.lock(&key).wait(secs(10)).acquire().await.unwrap();
        let after = acquired.elapsed();
        assert!(after >= MIN, "taken {after:?} after acquisition");
        assert!(
            after < MIN + ms(1500),
            "kept {after:?}: the release was not sent again"
        );
        next.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock() {
    let (_nodes, a, b) = two_clients_on(Redlock::start(3)).await;
    all_checks(&a, &b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_with_replica_acks() {
    let (_setup, a, b) = two_clients_on(SentinelSetup::start()).await;
    all_checks(&a, &b).await;
    shared_kinds_keep_the_minimum(&a, &b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster() {
    let (_cluster, a, b) = two_clients_on(Cluster::start(3)).await;
    all_checks(&a, &b).await;
    shared_kinds_keep_the_minimum(&a, &b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minimum_over_the_longest_lease_is_a_config_error() {
    let client = memory_client().await;
    let err = client
        .lock("k")
        .hold_at_least(Duration::from_secs(8 * 24 * 3600))
        .acquire()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Config(_)), "{err:?}");
    assert!(err.to_string().contains("hold_at_least"), "{err}");
}

/// The attribute's `hold_at_least`: a scheduled job that pods run on their
/// own timers runs once per interval, however fast its body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attribute_keeps_the_key_for_its_minimum() {
    #[lock_runtime::distributed_lock(key = "job:<name>", hold_at_least = "600ms", client = client)]
    async fn run_job(client: &LockClient, name: &str) -> Result<u64, LockError> {
        match lock_runtime::current_lock() {
            Some(lock) => lock.fencing_token().await,
            None => Ok(0),
        }
    }
    let server = RedisServer::start();
    let (pod_a, pod_b) = two_clients(&LockClient::builder().redis(server.url())).await;
    let started = Instant::now();
    let first = run_job(&pod_a, "nightly").await.unwrap();
    assert!(first > 0);
    // The other pod's timer fires a moment later: skipped.
    let skipped = run_job(&pod_b, "nightly").await.unwrap_err();
    assert!(skipped.is_busy(), "{skipped:?}");
    // After the interval it runs again.
    tokio::time::sleep(MIN.saturating_sub(started.elapsed()) + ms(50)).await;
    assert!(run_job(&pod_b, "nightly").await.unwrap() > first);
}
