//! `client.lock_all(keys)`: several keys, all or none, without deadlock
//! whatever order callers name them in; each key is the lock
//! `client.lock(key)` takes. Every check runs on the embedded backend, one
//! Redis, Redlock and a cluster.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use lock_runtime::{LockClient, LockError, MAX_LOCK_ALL_KEYS};
use test_support::RedisServer;
use test_support::helpers::{
    is_held, key, lock_name, memory_client, ms, secs, two_clients, within,
};
use test_support::topology::{self, Cluster, Redlock, SentinelSetup, Topology};

/// One key busy: `Busy` naming it, and none of the others held afterwards.
async fn one_busy_key_means_none_are_taken(a: &LockClient, b: &LockClient) {
    let [k1, k2, k3] = [key("all-none"), key("all-none"), key("all-none")];
    let holder = b.lock(&k2).acquire().await.unwrap();
    let err = a
        .lock_all([&k1, &k2, &k3])
        .acquire()
        .await
        .expect_err("one key is busy");
    match &err {
        LockError::Busy { key, retry_after } => {
            assert_eq!(key, &k2, "the busy key is named");
            assert!(!retry_after.is_zero());
        }
        other => panic!("expected Busy, got {other:?}"),
    }
    assert!(!is_held(b, &k1).await, "{k1} was given back");
    assert!(!is_held(b, &k3).await, "{k3} was given back");
    // A short wait that runs out: the same.
    let err = a
        .lock_all([&k3, &k2, &k1])
        .wait(ms(200))
        .acquire()
        .await
        .expect_err("still busy");
    assert!(err.is_busy(), "{err:?}");
    assert!(!is_held(b, &k1).await && !is_held(b, &k3).await);
    holder.release().await.unwrap();
    let all = a.lock_all([&k1, &k2, &k3]).acquire().await.unwrap();
    assert_eq!(all.guards().len(), 3);
    let mut keys: Vec<&str> = all.keys().collect();
    keys.sort_unstable();
    let mut expected = [k1.as_str(), k2.as_str(), k3.as_str()];
    expected.sort_unstable();
    assert_eq!(keys, expected);
    all.release().await.unwrap();
}

/// Held through `lock_all`, each key excludes `lock(key)`, and the other
/// way round; dropping the guard frees them all.
async fn each_key_is_the_mutex_of_its_name(a: &LockClient, b: &LockClient) {
    let [k1, k2] = [key("same-lock"), key("same-lock")];
    let all = a.lock_all([&k1, &k2]).acquire().await.unwrap();
    assert!(b.lock(&k1).acquire().await.unwrap_err().is_busy());
    assert!(b.lock(&k2).acquire().await.unwrap_err().is_busy());
    assert!(!all.is_lost());
    drop(all);
    let g1 = within(
        secs(5),
        "k1 after the drop",
        b.lock(&k1).wait(secs(5)).acquire(),
    )
    .await
    .unwrap();
    let g2 = within(
        secs(5),
        "k2 after the drop",
        b.lock(&k2).wait(secs(5)).acquire(),
    )
    .await
    .unwrap();
    g1.release().await.unwrap();
    g2.release().await.unwrap();
}

/// A holder of one key releases: a `lock_all` waiting for it gets all.
async fn a_waiting_request_gets_all_when_the_holder_releases(a: &LockClient, b: &LockClient) {
    let [k1, k2, k3] = [key("wait-all"), key("wait-all"), key("wait-all")];
    let holder = b.lock(&k3).acquire().await.unwrap();
    let waiter = {
        let a = a.clone();
        let keys = [k1.clone(), k2.clone(), k3.clone()];
        tokio::spawn(async move {
            let all = a.lock_all(keys).wait(secs(10)).acquire().await?;
            let at = Instant::now();
            all.release().await?;
            Ok::<_, LockError>(at)
        })
    };
    tokio::time::sleep(ms(300)).await;
    assert!(!waiter.is_finished(), "waits while {k3} is held");
    let released = Instant::now();
    holder.release().await.unwrap();
    let at = within(secs(5), "the waiting lock_all", waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(
        at - released < secs(2),
        "woken by the release, not a lease: {:?}",
        at - released
    );
}

/// Two tasks name the same keys in opposite orders, over and over, with
/// waits, next to a plain `lock(k)` holder: nobody deadlocks and no two
/// ever hold a key at once.
async fn opposite_orders_never_deadlock(a: &LockClient, b: &LockClient, rounds: usize) {
    let keys = [key("order"), key("order"), key("order")];
    let inside: Arc<[AtomicBool; 3]> = Arc::new(Default::default());
    let done = Arc::new(AtomicUsize::new(0));
    let enter = |inside: &[AtomicBool; 3], which: &[usize]| {
        for i in which {
            assert!(
                !inside[*i].swap(true, Ordering::SeqCst),
                "two holders of key {i}"
            );
        }
    };
    let leave = |inside: &[AtomicBool; 3], which: &[usize]| {
        for i in which {
            inside[*i].store(false, Ordering::SeqCst);
        }
    };
    let mut tasks = Vec::new();
    for (client, reversed) in [(a.clone(), false), (b.clone(), true)] {
        let (keys, inside, done) = (keys.clone(), inside.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..rounds {
                let mut named = keys.to_vec();
                if reversed {
                    named.reverse();
                }
                let all = client
                    .lock_all(named)
                    .wait(secs(20))
                    .acquire()
                    .await
                    .expect("no deadlock: every round gets all keys");
                enter(&inside, &[0, 1, 2]);
                tokio::task::yield_now().await;
                leave(&inside, &[0, 1, 2]);
                all.release().await.unwrap();
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    {
        let (client, keys, inside) = (b.clone(), keys.clone(), inside.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..rounds / 2 {
                let guard = client
                    .lock(&keys[1])
                    .wait(secs(20))
                    .acquire()
                    .await
                    .unwrap();
                enter(&inside, &[1]);
                tokio::task::yield_now().await;
                leave(&inside, &[1]);
                guard.release().await.unwrap();
            }
        }));
    }
    within(secs(60), "the opposite-order rounds", async {
        for task in tasks {
            task.await.unwrap();
        }
    })
    .await;
    assert_eq!(done.load(Ordering::Relaxed), 2 * rounds);
}

/// Keys of one hash slot get one fencing token (`shared`: taken in one
/// atomic step; Redlock takes them one at a time), above every earlier
/// token of each of them.
async fn one_slot_shares_one_fencing_token(a: &LockClient, shared: bool) {
    let tag = key("acct").replace(':', "-");
    let (k1, k2) = (format!("{{{tag}}}:1"), format!("{{{tag}}}:2"));
    let g1 = a.lock(&k1).acquire().await.unwrap();
    let t1 = g1.fencing_token().await.unwrap();
    g1.release().await.unwrap();
    let g2 = a.lock(&k2).acquire().await.unwrap();
    let t2 = g2.fencing_token().await.unwrap();
    g2.release().await.unwrap();
    let all = a.lock_all([&k2, &k1]).acquire().await.unwrap();
    let (f1, f2) = (
        all.fencing_token_of(&k1).await.unwrap().unwrap(),
        all.fencing_token_of(&k2).await.unwrap().unwrap(),
    );
    if shared {
        assert_eq!(f1, f2, "one slot, one token");
    }
    assert_eq!(all.fencing_token().await.unwrap(), f1.max(f2));
    assert!(f1 > t1 && f1 > t2, "{f1} after {t1} and {t2}");
    assert!(f2 > t1 && f2 > t2, "{f2} after {t1} and {t2}");
    assert_eq!(all.fencing_token_of("not-in-the-set").await.unwrap(), None);
    all.release().await.unwrap();
    let next = a.lock(&k1).acquire().await.unwrap();
    assert!(next.fencing_token().await.unwrap() > f1.max(f2));
    next.release().await.unwrap();
}

/// `run` holds every key while the future runs, re-enters them inside,
/// and ends with `Lost` when one key's lease is lost.
async fn run_holds_reenters_and_reports_loss(a: &LockClient, b: &LockClient) {
    let [k1, k2] = [key("run-all"), key("run-all")];
    let inner = a.clone();
    let (c1, c2) = (k1.clone(), k2.clone());
    let value = a
        .lock_all([&k1, &k2])
        .run(async move {
            // Nested locks of the same keys re-enter.
            let again = inner.lock(&c1).acquire().await.unwrap();
            assert!(again.is_reentrant());
            again.release().await.unwrap();
            let nested = inner
                .lock_all([c2.clone(), c1.clone()])
                .acquire()
                .await
                .unwrap();
            assert!(nested.guards().iter().all(|g| g.is_reentrant()));
            nested.release().await.unwrap();
            assert!(lock_runtime::current_lock().is_some());
            7
        })
        .await
        .unwrap();
    assert_eq!(value, 7);
    assert!(!is_held(b, &k1).await && !is_held(b, &k2).await);

    // Reentrancy into lock_all: a key the task holds re-enters, the rest
    // is taken, and nothing deadlocks.
    let [k3, k4] = [key("reenter-all"), key("reenter-all")];
    let inner = a.clone();
    let (c3, c4) = (k3.clone(), k4.clone());
    a.lock(&k3)
        .run(async move {
            let all = inner
                .lock_all([c4.clone(), c3.clone()])
                .wait(secs(2))
                .acquire()
                .await
                .unwrap();
            let reentered: Vec<bool> = all.guards().iter().map(|g| g.is_reentrant()).collect();
            assert_eq!(reentered.iter().filter(|r| **r).count(), 1);
            let g3 = all.guards().iter().find(|g| g.key() == c3).unwrap();
            assert!(g3.is_reentrant());
            all.release().await.unwrap();
        })
        .await
        .unwrap();
    assert!(!is_held(b, &k3).await && !is_held(b, &k4).await);

    // Lost: one key deleted behind the holder's back, round after round.
    // The run is cancelled at the loss and answers `Lost` naming that key,
    // having freed the other one first: a retry straight after (trying
    // once) finds it free.
    let [k5, k6] = [key("lost-all"), key("lost-all")];
    for round in 0..10 {
        let (deleter, victim) = (a.clone(), k6.clone());
        let started = Instant::now();
        let err = a
            .lock_all([&k5, &k6])
            .ttl(ms(300))
            .run(async move {
                lock_runtime::__private::testing::force_delete(&deleter, &victim)
                    .await
                    .unwrap();
                tokio::time::sleep(secs(30)).await;
            })
            .await
            .unwrap_err();
        assert!(
            matches!(&err, LockError::Lost { key } if *key == k6),
            "round {round}: {err:?}"
        );
        assert!(started.elapsed() < secs(10), "cancelled at the loss");
        let retry = a.lock_all([&k5, &k6]).acquire().await;
        let retry = retry.unwrap_or_else(|e| panic!("round {round}: the retry found {e:?}"));
        retry.release().await.unwrap();
    }

    // lost() on a guard.
    let all = a.lock_all([&k5, &k6]).ttl(secs(1)).acquire().await.unwrap();
    let lost = all.lost();
    lock_runtime::__private::testing::force_delete(a, &k5)
        .await
        .unwrap();
    within(secs(5), "lost() resolves", lost).await;
    assert!(all.is_lost());
    let err = all.release().await.unwrap_err();
    assert!(err.is_lost(), "{err:?}");
    assert!(!is_held(b, &k6).await, "the other key was released too");
}

/// A waiting request dropped (cancelled) gives back the keys it took.
async fn a_cancelled_request_gives_back_what_it_took(a: &LockClient, b: &LockClient) {
    let keys: Vec<String> = (0..4).map(|_| key("cancel-all")).collect();
    let busy = keys[2].clone();
    let holder = b.lock(&busy).acquire().await.unwrap();
    let request = a.lock_all(&keys).wait(secs(30)).acquire();
    assert!(
        tokio::time::timeout(ms(300), request).await.is_err(),
        "still waiting"
    );
    holder.release().await.unwrap();
    within(secs(5), "every key free after the cancel", async {
        loop {
            let mut free = true;
            for k in &keys {
                free &= !is_held(b, k).await;
            }
            if free {
                break;
            }
            tokio::time::sleep(ms(20)).await;
        }
    })
    .await;
    let all = a.lock_all(&keys).acquire().await.unwrap();
    all.release().await.unwrap();
}

/// `hold_at_least`: released at once, every key stays taken for the rest
/// of the minimum (another client is busy on each), then is free.
async fn a_release_keeps_every_key_until_hold_at_least(a: &LockClient, b: &LockClient) {
    let keys = ["{held}:x", "{held}:y", "held:z"];
    let min = ms(700);
    let taken = Instant::now();
    let all = a.lock_all(keys).hold_at_least(min).acquire().await.unwrap();
    all.release().await.unwrap();
    for key in keys {
        let err = b.lock(key).acquire().await.unwrap_err();
        assert!(
            err.is_busy(),
            "{key} free {:?} after acquire: {err:?}",
            taken.elapsed()
        );
    }
    let busy_all = b.lock_all(keys).acquire().await.unwrap_err();
    assert!(busy_all.is_busy(), "{busy_all:?}");
    // Free once the minimum has passed (waiting covers the lease's end).
    let again = b.lock_all(keys).wait(secs(5)).acquire().await.unwrap();
    assert!(
        taken.elapsed() >= min - ms(50),
        "free after {:?}",
        taken.elapsed()
    );
    again.release().await.unwrap();
}

async fn all_checks(a: &LockClient, b: &LockClient, rounds: usize, atomic: bool) {
    one_busy_key_means_none_are_taken(a, b).await;
    each_key_is_the_mutex_of_its_name(a, b).await;
    a_waiting_request_gets_all_when_the_holder_releases(a, b).await;
    opposite_orders_never_deadlock(a, b, rounds).await;
    one_slot_shares_one_fencing_token(a, atomic).await;
    run_holds_reenters_and_reports_loss(a, b).await;
    a_cancelled_request_gives_back_what_it_took(a, b).await;
    a_release_keeps_every_key_until_hold_at_least(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_backend() {
    let client = memory_client().await;
    all_checks(&client, &client, 200, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_redis() {
    let server = RedisServer::start();
    let (a, b) = two_clients(&LockClient::builder().redis(server.url())).await;
    all_checks(&a, &b, 60, true).await;
    // Tasks of one client too (its in-process lines).
    opposite_orders_never_deadlock(&a, &a, 40).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock() {
    let nodes = Redlock::start(3);
    let (a, b) = two_clients(&LockClient::builder().redlock(nodes.urls())).await;
    all_checks(&a, &b, 30, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_with_replica_acks() {
    let (_setup, builder) = SentinelSetup::start().with_builder();
    let (a, b) = two_clients(&builder).await;
    all_checks(&a, &b, 30, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster() {
    let cluster = Cluster::start(3);
    let (a, b) = two_clients(&LockClient::builder().cluster(cluster.seed_urls())).await;
    all_checks(&a, &b, 40, true).await;
    across_slots_rolls_back(&cluster, &a, &b).await;
}

/// On a cluster, keys of several slots (on several nodes): one group is
/// taken, the next is busy, and the first is given back.
async fn across_slots_rolls_back(cluster: &Cluster, a: &LockClient, b: &LockClient) {
    // Two keys whose slots are on different nodes, in slot order.
    let mut keys: Vec<String> = (0..64).map(|_| key("slots")).collect();
    keys.sort_by_key(|k| cluster.slot_of(k));
    let first = keys[0].clone();
    let node = cluster.owner_of(cluster.slot_of(&first));
    let last = keys
        .iter()
        .rev()
        .find(|k| cluster.owner_of(cluster.slot_of(k)) != node)
        .expect("keys on another node")
        .clone();
    assert!(cluster.slot_of(&first) < cluster.slot_of(&last));
    // The later group is busy: the earlier one, taken first, goes back.
    let holder = b.lock(&last).acquire().await.unwrap();
    let err = a
        .lock_all([&last, &first])
        .wait(ms(300))
        .acquire()
        .await
        .unwrap_err();
    assert!(
        matches!(&err, LockError::Busy { key, .. } if *key == last),
        "{err:?}"
    );
    assert!(!is_held(b, &first).await, "rolled back");
    // The holder releases: a waiting request gets both.
    let waiter = {
        let a = a.clone();
        let keys = [first.clone(), last.clone()];
        tokio::spawn(async move { a.lock_all(keys).wait(secs(10)).acquire().await })
    };
    tokio::time::sleep(ms(200)).await;
    holder.release().await.unwrap();
    let all = within(secs(5), "the waiting lock_all", waiter)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        all.keys().collect::<Vec<_>>(),
        [first.as_str(), last.as_str()]
    );
    assert!(
        all.fencing_token().await.unwrap() >= all.fencing_token_of(&first).await.unwrap().unwrap()
    );
    assert!(is_held(b, &first).await && is_held(b, &last).await);
    all.release().await.unwrap();
    // Many keys over every node at once.
    let all = a.lock_all(keys.iter().take(20)).acquire().await.unwrap();
    assert_eq!(all.guards().len(), 20);
    all.release().await.unwrap();
}

/// With replica acks, an atomic step counts only once a replica has it;
/// unacknowledged, every key is given back and the error says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_replica_acks_an_unreplicated_set_is_given_back() {
    let master = RedisServer::start_with(&["--repl-diskless-sync-delay", "0"]);
    let port = master.port.to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
    topology::wait_replica_online(&master, &replica);
    let builder = LockClient::builder().redis(master.url());
    let a = builder
        .clone()
        .min_replica_acks(1, ms(300))
        .build()
        .await
        .unwrap();
    let plain = builder.build().await.unwrap();
    let exists = |server: &RedisServer, k: &str| server.cli(&["EXISTS", &lock_name(k)]) == "1";
    let [k1, k2] = [key("acked"), key("acked")];
    let all = a.lock_all([&k1, &k2]).acquire().await.unwrap();
    assert!(
        exists(&replica, &k1) && exists(&replica, &k2),
        "acknowledged means replicated"
    );
    all.release().await.unwrap();

    replica.pause().unwrap();
    let refused = a.lock_all([&k1, &k2]).acquire().await;
    replica.resume().unwrap();
    assert!(matches!(refused, Err(LockError::Backend(_))), "{refused:?}");
    assert!(!exists(&master, &k1) && !exists(&master, &k2));
    assert!(!is_held(&plain, &k1).await && !is_held(&plain, &k2).await);
}

/// Bad input is an error at once, never a panic or a hang.
#[tokio::test]
async fn bad_input_is_an_error() {
    let client = memory_client().await;
    let empty = client
        .lock_all(Vec::<String>::new())
        .acquire()
        .await
        .unwrap_err();
    assert!(empty.is_config(), "{empty:?}");
    let twice = client
        .lock_all(["a", "b", "a"])
        .acquire()
        .await
        .unwrap_err();
    assert!(twice.is_config(), "{twice:?}");
    assert!(twice.to_string().contains("\"a\""), "{twice}");
    let many: Vec<String> = (0..=MAX_LOCK_ALL_KEYS).map(|i| format!("k{i}")).collect();
    let too_many = client.lock_all(&many).acquire().await.unwrap_err();
    assert!(too_many.is_config(), "{too_many:?}");
    let most = client
        .lock_all(&many[..MAX_LOCK_ALL_KEYS])
        .acquire()
        .await
        .unwrap();
    assert_eq!(most.guards().len(), MAX_LOCK_ALL_KEYS);
    most.release().await.unwrap();
    for bad in ["", "a\nb"] {
        let err = client.lock_all(["ok", bad]).acquire().await.unwrap_err();
        assert!(err.is_invalid_key(), "{bad:?}: {err:?}");
    }
    let short = client
        .lock_all(["a", "b"])
        .ttl(ms(1))
        .acquire()
        .await
        .unwrap_err();
    assert!(short.is_config(), "{short:?}");
    let forever = client
        .lock_all(["a", "b"])
        .hold_at_least(secs(8 * 24 * 3600))
        .acquire()
        .await
        .unwrap_err();
    assert!(forever.is_config(), "{forever:?}");
    let run = client.lock_all(["a", "a"]).run(async {}).await.unwrap_err();
    assert!(run.is_config(), "{run:?}");
    assert!(!is_held(&client, "a").await && !is_held(&client, "ok").await);
}

/// The future `acquire()` returns is moved wherever it is awaited: it
/// holds each group's atomic step once (2,224 bytes). A step awaited in an
/// `async` block that had captured it was held twice (3,400 bytes).
#[tokio::test]
async fn the_acquires_future_holds_its_step_once() {
    let client = memory_client().await;
    let size = std::mem::size_of_val(&client.lock_all(["a", "b"]).acquire());
    assert!(size < 3072, "lock_all's acquire: {size} bytes");
}
