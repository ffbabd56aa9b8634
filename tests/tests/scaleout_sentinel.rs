//! Redis Sentinel on loopback (one master, one replica, three sentinels):
//! the shared semantic suite through master discovery, a lock acknowledged
//! by the replica surviving a failover, the documented loss window without
//! replica acknowledgements (asserted to exist), and `min_replica_acks`
//! refusing a lock no replica acknowledged, with Sentinel and with one URL,
//! a wait abandoned mid-failover leaving the line on the new master, and a
//! lock or an idempotency record taken on the new master during a manual
//! failover.

use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockClientBuilder, LockError};

use test_support::RedisServer;
use test_support::topology::{self, SentinelSetup, Topology, master_and_replica};

#[macro_use]
mod scaleout_common;
use test_support::helpers::*;

fn sentinel_setup() -> (SentinelSetup, LockClientBuilder) {
    SentinelSetup::start().with_builder()
}

semantic_suite!(sentinel_setup);

/// `EXISTS` of the lock `key` on a server, as a bool.
fn exists(server: &RedisServer, key: &str) -> bool {
    server.cli(&["EXISTS", &lock_name(key)]) == "1"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_acknowledged_by_a_replica_is_still_held_after_a_failover() {
    let (mut setup, builder) = sentinel_setup();
    let a = client(&builder.clone().min_replica_acks(1, ms(500))).await;
    let key = key("acked");
    // A fixed lease longer than the failover: no renewal (and its own
    // `WAIT`) runs in between, so what is tested is the acquire's ack alone.
    let guard = fixed_lease(&a, &key, secs(20))
        .await
        .expect("the replica acknowledges");
    assert!(
        exists(setup.replica(), &key),
        "acknowledged means replicated"
    );

    let killed = Instant::now();
    setup.kill_master();
    let failover = tokio::task::block_in_place(|| setup.wait_for_failover());
    println!(
        "failover: the sentinels named the new master {failover:?} after the kill ({:?} in all)",
        killed.elapsed()
    );
    assert!(exists(setup.replica(), &key), "the new master has the lock");

    // A client that discovers the new master cannot take the lock.
    let b = client(&builder).await;
    assert!(matches!(
        b.lock(&key).acquire().await,
        Err(LockError::Busy { .. })
    ));
    let waited = b.lock(&key).wait(ms(300)).acquire().await;
    assert!(matches!(waited, Err(LockError::Busy { .. })), "{waited:?}");
    // Neither can the first client's other requests.
    assert!(is_held(&a, &key).await);

    // The holder re-discovers the master and releases there.
    within(secs(10), "release after the failover", guard.release())
        .await
        .expect("the holder's release reaches the new master");
    assert!(!exists(setup.replica(), &key));
    lock_and_release(&b, &key).await; // free after the release
}

/// The documented window: without replica acknowledgements, a lock written
/// to the master but not yet to the replica disappears when the replica is
/// promoted, and a second client takes it while the first still holds a
/// valid lease. (Asserted to happen, so the docs stay true.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_replica_acks_a_failover_can_lose_a_lock_to_a_second_holder() {
    let (mut setup, builder) = sentinel_setup();
    let a = client(&builder).await;
    let key = key("unacked");
    // Replication stalls (a partition between master and replica) ...
    setup.cut_replication();
    // ... the acquire succeeds on the master alone ...
    let first = fixed_lease(&a, &key, secs(20))
        .await
        .expect("without acks the master alone decides");
    assert!(exists(setup.master(), &key));
    assert!(
        !exists(setup.replica(), &key),
        "the write did not replicate"
    );
    // ... and the master dies before the write reaches the replica.
    setup.kill_master();
    let failover = tokio::task::block_in_place(|| setup.wait_for_failover());
    println!("failover took {failover:?} after the kill");

    let b = client(&builder).await;
    // The fencing counter's increment was lost with the lock: the tokens
    // need not differ either.
    let why = "the promoted replica never saw the first lock";
    assert_two_holders(first, b.lock(&key), why).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_replica_acks_an_unreplicated_acquire_fails_and_leaves_the_lock_free() {
    let (setup, builder) = sentinel_setup();
    let a = client(&builder.clone().min_replica_acks(1, ms(300))).await;
    let b = client(&builder).await;
    let key = key("unreplicated");

    // With the replica in sync the acquire is acknowledged.
    let guard = a.lock(&key).ttl(secs(5)).acquire().await.unwrap();
    assert!(exists(setup.replica(), &key));
    guard.release().await.unwrap();

    setup.cut_replication();
    let started = Instant::now();
    let refused = a.lock(&key).ttl(secs(5)).acquire().await;
    let took = started.elapsed();
    let message = match refused {
        Err(LockError::Backend(e)) => e.to_string(),
        other => panic!("expected a backend error, got {other:?}"),
    };
    println!("refused after {took:?}: {message}");
    assert!(took >= ms(250), "did not wait for the acks: {took:?}");
    assert!(
        message.contains("0 of 1 required replicas acknowledged"),
        "the error says how many replicas acknowledged: {message}"
    );
    assert!(
        !exists(setup.master(), &key),
        "the unacknowledged lock was released"
    );
    assert!(!is_held(&b, &key).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_replica_acks_also_works_with_a_single_redis_url() {
    let (master, replica) = master_and_replica();
    let builder = LockClient::builder().redis(master.url());
    let a = client(&builder.clone().min_replica_acks(1, ms(300))).await;
    let key = key("single-url");
    let guard = a.lock(&key).ttl(secs(5)).acquire().await.unwrap();
    assert!(exists(&replica, &key), "acknowledged means replicated");
    guard.release().await.unwrap();

    // Two acks from one replica: never.
    let two = client(&builder.clone().min_replica_acks(2, ms(200))).await;
    let message = match two.lock(&key).acquire().await {
        Err(LockError::Backend(e)) => e.to_string(),
        other => panic!("expected a backend error, got {other:?}"),
    };
    assert!(
        message.contains("1 of 2 required replicas acknowledged"),
        "the error says 1 of 2 replicas acknowledged: {message}"
    );
    assert!(!exists(&master, &key));

    // A hung replica acknowledges nothing: on any key, whichever of the
    // client's connections it uses. (`WAIT` must follow the lock's own
    // write: on a fresh client's other connection, which wrote nothing, it
    // would pass at once.)
    replica.pause().unwrap();
    let mut refused = Vec::new();
    for i in 0..8 {
        let k = test_support::helpers::key(&format!("hung-{i}"));
        let fresh = client(&builder.clone().min_replica_acks(1, ms(300))).await;
        refused.push((fresh.lock(&k).ttl(secs(5)).acquire().await, k));
    }
    replica.resume().unwrap();
    let plain = client(&builder).await;
    for (refused, k) in refused {
        assert!(
            matches!(refused, Err(LockError::Backend(_))),
            "{k}: {refused:?}"
        );
        assert!(!exists(&master, &k));
        assert!(!is_held(&plain, &k).await);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_replica_acks_renewals_that_no_replica_confirms_end_in_a_lost_lease() {
    let (master, replica) = master_and_replica();
    let a = client(
        &LockClient::builder()
            .redis(master.url())
            .min_replica_acks(1, ms(100)),
    )
    .await;
    let key = key("unconfirmed-renewals");
    let guard = a.lock(&key).ttl(ms(900)).acquire().await.unwrap();
    let lost = guard.lost();
    // Confirmed renewals keep it for several leases.
    tokio::time::sleep(ms(2000)).await;
    assert!(!guard.is_lost(), "lost while the replica acknowledged");
    let paused = Instant::now();
    replica.pause().unwrap();
    within(secs(5), "unconfirmed renewals end the lease", lost).await;
    let after = paused.elapsed();
    replica.resume().unwrap();
    println!("lost() resolved {after:?} after the replica stopped acknowledging (900 ms lease)");
    assert!(guard.is_lost());
}

/// Polls `LLEN queue` on `server` every 50 ms until it is `want`, for at most
/// `limit`; how long that took.
async fn queue_length_becomes(
    server: &RedisServer,
    queue: &str,
    want: i64,
    limit: std::time::Duration,
) -> std::time::Duration {
    let started = Instant::now();
    loop {
        let len: Option<i64> = server
            .try_cli(&["LLEN", queue])
            .ok()
            .and_then(|n| n.parse().ok());
        if len == Some(want) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < limit,
            "LLEN {queue} is {len:?}, not {want}, after {limit:?}"
        );
        tokio::time::sleep(ms(50)).await;
    }
}

/// A wait abandoned while the master is down leaves the line once the
/// sentinels name the new master. Mid-failover the sentinels name no master
/// that answers as one; the background release that takes an abandoned
/// waiter out of the line gave up at that answer, and the entry left behind
/// was handed the key later, one hand-over lease per such entry (the long
/// waits after scenario 8's failover in FAULTS.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_abandoned_during_a_failover_leaves_the_line_on_the_new_master() {
    let (mut setup, builder) = sentinel_setup();
    let holder = client(&builder).await;
    let waiter = client(&builder).await;
    let key = key("abandoned-in-failover");
    let queue = format!("lock:Q{{{key}}}");
    let _held = fixed_lease(&holder, &key, secs(60))
        .await
        .expect("the key is free");
    let waiting = {
        let key = key.clone();
        tokio::spawn(async move { waiter.lock(&key).wait(secs(60)).acquire().await })
    };
    // The waiter is in line, on the replica too.
    queue_length_becomes(setup.replica(), &queue, 1, secs(5)).await;

    setup.kill_master();
    // Given up while there is no master: its release meets the failover.
    waiting.abort();
    let failover = tokio::task::block_in_place(|| setup.wait_for_failover());
    // Out of line well before the queue's own expiry (wait + lease: 120 s).
    let left = queue_length_becomes(setup.replica(), &queue, 0, secs(20)).await;
    println!("failover {failover:?} after the kill; the entry left {left:?} after that");
}

/// An acquire that waits, sent just after the master died, is not failed in
/// its first second: it re-sends while no master answers (for 10 s at most,
/// within its wait) and takes the lock on the new master. (It once gave up
/// after 8 re-sends, about 0.8 s, where a failover takes seconds.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_that_waits_rides_out_a_failover_within_its_wait() {
    let (mut setup, builder) = sentinel_setup();
    let a = client(&builder).await;
    let key = key("through-failover");
    let killed = Instant::now();
    setup.kill_master();
    let acquiring = {
        let a = a.clone();
        let key = key.clone();
        tokio::spawn(async move { a.lock(&key).wait(secs(20)).acquire().await })
    };
    let failover = tokio::task::block_in_place(|| setup.wait_for_failover());
    let guard = within(secs(20), "the acquire", acquiring)
        .await
        .unwrap()
        .expect("taken on the new master within the wait");
    println!(
        "failover {failover:?} after the kill; the lock taken {:?} after the kill",
        killed.elapsed()
    );
    assert!(
        exists(setup.replica(), &key),
        "held on the promoted replica"
    );
    guard.release().await.unwrap();
}

/// A master with a password, found through a sentinel that knows it
/// (`sentinel auth-pass`): `sentinel_master_auth` logs the client in to the
/// master (and its notice connection: a waiter is woken by the release);
/// without it, `build` fails saying authentication is what is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_with_a_password_is_reached_with_sentinel_master_auth() {
    let master = RedisServer::start_with(&["--requirepass", "master pw"]);
    let name = topology::MASTER_NAME;
    let sentinel = topology::Sentinel::try_start(
        master.port,
        name,
        &format!("sentinel auth-pass {name} \"master pw\"\n"),
    )
    .unwrap();
    let urls = || [sentinel.url()];

    let err = LockClient::builder()
        .sentinel(name, urls())
        .build()
        .await
        .unwrap_err();
    let text = test_support::error_chain(&err).to_lowercase();
    assert!(
        err.is_backend() && (text.contains("auth") || text.contains("password")),
        "{text}"
    );

    let client = || {
        LockClient::builder()
            .sentinel(name, urls())
            .sentinel_master_auth("default", "master pw")
    };
    let debug = format!("{:?}", client());
    assert!(
        !debug.contains("master pw"),
        "the password in Debug: {debug}"
    );
    let (a, b) = (
        client().build().await.unwrap(),
        client().build().await.unwrap(),
    );
    let waited = test_support::helpers::woken_by_release(&a, b, "order:1").await;
    assert!(
        waited < Duration::from_secs(2),
        "the waiter took {waited:?}"
    );

    // Only for Sentinel: another backend's URL carries its credentials.
    let err = LockClient::builder()
        .redis(master.url())
        .sentinel_master_auth("default", "master pw")
        .build()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Config(_)), "{err:?}");
}

/// A manual `SENTINEL FAILOVER` leaves the old master up, and a master with
/// no replica, for seconds after the promotion (until the sentinels demote
/// it). An acquire that waits, sent in that window, is not refused for
/// want of replica acks: a short `WAIT` sends the client back to the
/// sentinels, and the lock is taken on the promoted replica before the old
/// master is demoted, with a fencing token above every one acknowledged
/// before the failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_that_waits_rides_out_a_manual_failover_on_the_new_master() {
    let setup = SentinelSetup::start_with_spare_replica();
    let a = client(&setup.builder().min_replica_acks(1, ms(300))).await;
    let key = key("manual-failover");
    let mut acknowledged = 0;
    for _ in 0..3 {
        acknowledged = acknowledged.max(lock_and_release(&a, &key).await);
    }
    // On the replica to be promoted too, not only on the spare.
    tokio::task::block_in_place(|| setup.wait_replicas_in_sync());

    let started = Instant::now();
    // Sent to the last sentinel: the first one the client asks learns of
    // the new master from it (within seconds), as after any failover.
    tokio::task::block_in_place(|| setup.manual_failover(2));
    let promoted = started.elapsed();

    let acquired = a.lock(&key).ttl(secs(10)).wait(secs(8)).acquire().await;
    let taken = started.elapsed();
    let guard = acquired.unwrap_or_else(|e| {
        panic!("not taken within the wait ({taken:?} after SENTINEL FAILOVER): {e}")
    });
    let old_role = topology::info_field(&setup.master().cli(&["INFO", "replication"]), "role");
    println!("SENTINEL FAILOVER: promoted after {promoted:?}, the lock taken after {taken:?}");
    assert_eq!(
        old_role.as_deref(),
        Some("master"),
        "taken before the old master was demoted"
    );
    assert!(
        exists(setup.replica(), &key),
        "held on the promoted replica"
    );
    let token = guard.fencing_token().await.unwrap();
    assert!(
        token > acknowledged,
        "token {token} after the failover, {acknowledged} acknowledged before it"
    );
    guard.release().await.unwrap();
}

/// The same manual failover for an idempotency record: a claim that waits,
/// sent while the old master is still up, is taken on the promoted replica
/// (the old master's short `WAIT` gave it back and sent the client to the
/// sentinels), so the record survives the old master's demotion, which
/// wipes what it held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_claimed_during_a_manual_failover_lives_on_the_new_master() {
    let setup = SentinelSetup::start_with_spare_replica();
    let a = client(&setup.builder().min_replica_acks(1, ms(300))).await;
    for i in 0..3 {
        let message = format!("before-{i}");
        match a.record(&message).claim().await.unwrap() {
            lock_runtime::Claimed::Run(guard) => guard.complete(b"done").await.unwrap(),
            other => panic!("{message}: not claimed: {other:?}"),
        }
    }
    tokio::task::block_in_place(|| setup.wait_replicas_in_sync());
    let keys = |server: &RedisServer| -> u64 { server.cli(&["DBSIZE"]).trim().parse().unwrap() };
    let before = keys(setup.replica());

    let started = Instant::now();
    tokio::task::block_in_place(|| setup.manual_failover(2));
    let claimed = a.record("during").ttl(secs(10)).wait(secs(8)).claim().await;
    let taken = started.elapsed();
    let guard = match claimed {
        Ok(lock_runtime::Claimed::Run(guard)) => guard,
        other => {
            panic!("not claimed within the wait ({taken:?} after SENTINEL FAILOVER): {other:?}")
        }
    };
    let old_role = topology::info_field(&setup.master().cli(&["INFO", "replication"]), "role");
    println!(
        "SENTINEL FAILOVER: the record claimed after {taken:?}; keys on the promoted replica: {before}, then {}",
        keys(setup.replica())
    );
    assert_eq!(
        old_role.as_deref(),
        Some("master"),
        "claimed before the old master was demoted"
    );
    assert_eq!(
        keys(setup.replica()),
        before + 1,
        "the claim is on the promoted replica"
    );
    guard.complete(b"done").await.unwrap();
}
