//! Waiters keep their place in line when a holder crashes:
//! a key whose lease ran out goes to the head of its line, as a release would
//! hand it; a newcomer never takes a key others queue for; a waiter that died
//! in line stalls it for at most its own wait.
//!
//! Each check runs on the embedded backend, one Redis, Sentinel (a master with
//! a replica, replica acks) and a three-master Cluster. Redlock's waiters do
//! not queue (README, "Scale-out"), so it is not in this file.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockClientBuilder, LockError};
use test_support::RedisServer;
use test_support::helpers::*;
use test_support::topology::{Cluster, SentinelSetup, Topology};

/// Where a check's clients come from: `independent` gives a new client of
/// the same store each call (the embedded backend, which lives inside one
/// client, gives a clone: then only the per-acquisition token differs).
enum Store {
    Memory(LockClient),
    Builder(
        LockClientBuilder,
        #[allow(dead_code)] Box<dyn std::any::Any>,
    ),
}

impl Store {
    async fn memory() -> Self {
        Store::Memory(memory_client().await)
    }

    fn redis() -> Self {
        let server = RedisServer::start();
        let builder = LockClient::builder().redis(server.url());
        Store::Builder(builder, Box::new(server))
    }

    fn sentinel() -> Self {
        let (setup, builder) = SentinelSetup::start().with_builder();
        Store::Builder(builder, Box::new(setup))
    }

    fn cluster() -> Self {
        let (cluster, builder) = Cluster::start(3).with_builder();
        Store::Builder(builder, Box::new(cluster))
    }

    async fn independent(&self) -> LockClient {
        match self {
            Store::Memory(client) => client.clone(),
            Store::Builder(builder, _) => client(builder).await,
        }
    }
}

macro_rules! every_queueing_backend {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                use super::*;

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn memory() {
                    super::$name(Store::memory().await).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn redis() {
                    super::$name(Store::redis()).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn sentinel() {
                    super::$name(Store::sentinel()).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn cluster() {
                    super::$name(Store::cluster()).await;
                }
            }
        )*
    };
}

every_queueing_backend! {
    crashed_holders_hand_the_key_to_waiters_in_the_order_they_queued,
    a_try_once_newcomer_never_takes_a_key_others_queue_for,
    a_waiter_that_died_in_line_stalls_it_for_at_most_its_own_wait,
    a_release_hands_the_key_past_a_waiter_whose_wait_is_over,
    lock_all_never_takes_a_key_others_queue_for,
}

/// A holder that crashed: its fixed lease is never released, only runs out.
fn crash(guard: lock_runtime::LockGuard) {
    std::mem::forget(guard);
}

/// Five clients ask for one key 60 ms apart with a 500 ms fixed lease and
/// never release (each crashes holding it): the key must go 0, 1, 2, 3, 4.
/// (The old scripts gave `[0,2,4,1,3]` and the like: whoever retried first
/// after an expiry won.)
async fn crashed_holders_hand_the_key_to_waiters_in_the_order_they_queued(store: Store) {
    let key = key("fifo-crash");
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..5 {
        let client = store.independent().await;
        let (key, order) = (key.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let guard = client
                .lock(&key)
                .ttl(ms(500))
                .renew(false)
                .wait(secs(10))
                .acquire()
                .await
                .unwrap_or_else(|e| panic!("waiter {i}: {e:?}"));
            let token = guard.fencing_token().await.unwrap();
            order.lock().unwrap().push((i, token));
            crash(guard);
            client
        }));
        tokio::time::sleep(ms(60)).await;
    }
    let mut clients = Vec::new();
    for task in tasks {
        clients.push(
            within(secs(15), "every waiter holds once", task)
                .await
                .unwrap(),
        );
    }
    let order = order.lock().unwrap().clone();
    println!("holders in turn (index, fencing token): {order:?}");
    let who: Vec<usize> = order.iter().map(|&(i, _)| i).collect();
    assert_eq!(who, [0, 1, 2, 3, 4], "the key skipped the line");
    assert!(
        order.windows(2).all(|w| w[0].1 < w[1].1),
        "fencing tokens rise with the line: {order:?}"
    );
}

/// While two waiters queue behind a crashed holder, a try-once newcomer
/// that arrives right after the lease ran out is told busy, and the head of
/// the line holds.
async fn a_try_once_newcomer_never_takes_a_key_others_queue_for(store: Store) {
    let key = key("fifo-newcomer");
    let holder = store.independent().await;
    let guard = holder
        .lock(&key)
        .ttl(ms(400))
        .renew(false)
        .acquire()
        .await
        .unwrap();
    let ends = Instant::now() + ms(400);
    crash(guard);
    let mut waiters = Vec::new();
    for i in 0..2 {
        let client = store.independent().await;
        let key = key.clone();
        waiters.push(tokio::spawn(async move {
            let guard = client
                .lock(&key)
                .ttl(ms(600))
                .renew(false)
                .wait(secs(10))
                .acquire()
                .await
                .unwrap_or_else(|e| panic!("waiter {i}: {e:?}"));
            (i, Instant::now(), guard, client)
        }));
        tokio::time::sleep(ms(40)).await;
    }
    // Try once, many times, from the moment the lease ended until the first
    // waiter holds: never granted.
    let newcomer = store.independent().await;
    tokio::time::sleep_until(ends.into()).await;
    let mut tries = 0;
    let first = loop {
        match newcomer.lock(&key).ttl(ms(600)).acquire().await {
            Err(LockError::Busy { .. }) => tries += 1,
            Ok(_) => panic!(
                "a try-once newcomer took the key ({} after the lease ended) while two waited",
                humantime(ends.elapsed())
            ),
            Err(e) => panic!("try once: {e:?}"),
        }
        if waiters[0].is_finished() {
            break within(secs(1), "the head", &mut waiters[0]).await.unwrap();
        }
        assert!(ends.elapsed() < secs(5), "the head of the line never held");
        tokio::time::sleep(ms(2)).await;
    };
    println!(
        "the head held {} after the lease ended; {tries} try-once attempts meanwhile were busy",
        humantime(first.1.saturating_duration_since(ends))
    );
    assert_eq!(first.0, 0);
    assert!(
        !waiters[1].is_finished(),
        "the second waiter held alongside the first"
    );
    drop(first.2);
    let second = within(secs(5), "the second waiter", &mut waiters[1])
        .await
        .unwrap();
    assert_eq!(second.0, 1);
}

/// `lock_all` tries its keys once, in one step: it must not take a key
/// whose crashed holder's lease ran out while a waiter queues for it.
async fn lock_all_never_takes_a_key_others_queue_for(store: Store) {
    let key = key("fifo-all");
    let other = format!("{key}-b");
    let holder = store.independent().await;
    let guard = holder
        .lock(&key)
        .ttl(ms(300))
        .renew(false)
        .acquire()
        .await
        .unwrap();
    let ends = Instant::now() + ms(300);
    crash(guard);
    let waiter = {
        let client = store.independent().await;
        let key = key.clone();
        tokio::spawn(async move {
            let guard = client
                .lock(&key)
                .ttl(ms(800))
                .renew(false)
                .wait(secs(10))
                .acquire()
                .await
                .unwrap();
            (Instant::now(), guard, client)
        })
    };
    let all = store.independent().await;
    tokio::time::sleep_until((ends - ms(20)).into()).await;
    let mut tries = 0;
    while !waiter.is_finished() {
        match all
            .lock_all([key.as_str(), other.as_str()])
            .ttl(ms(800))
            .acquire()
            .await
        {
            Err(LockError::Busy { .. }) => tries += 1,
            Ok(_) => panic!(
                "lock_all took a key a waiter queued for ({} after the lease ended)",
                humantime(ends.elapsed())
            ),
            Err(e) => panic!("lock_all: {e:?}"),
        }
        assert!(ends.elapsed() < secs(5), "the waiter never held");
        tokio::time::sleep(ms(2)).await;
    }
    let (held, _guard, _client) = waiter.await.unwrap();
    println!(
        "the waiter held {} after the lease ended; {tries} lock_all tries were busy",
        humantime(held.saturating_duration_since(ends))
    );
    assert!(held < ends + ms(500), "the waiter held late");
}

/// A waiter that died in line (its process gone, its queue entry left
/// behind) delays those behind it by at most its own wait: once that has
/// passed, a lease that runs out goes straight past it.
async fn a_waiter_that_died_in_line_stalls_it_for_at_most_its_own_wait(store: Store) {
    let key = key("fifo-dead-waiter");
    let holder = store.independent().await;
    let guard = holder
        .lock(&key)
        .ttl(ms(1200))
        .renew(false)
        .acquire()
        .await
        .unwrap();
    let ends = Instant::now() + ms(1200);
    crash(guard);
    // The dead waiter: queued with a 300 ms wait, then gone without leaving
    // the line (a crash: its attempt is dropped and its client never
    // releases, so nothing takes its entry out).
    let dead = store.independent().await;
    dead_waiter(&dead, &key, ms(300)).await;
    let live = store.independent().await;
    let started = Instant::now();
    let guard = live
        .lock(&key)
        .ttl(ms(1000))
        .renew(false)
        .wait(secs(10))
        .acquire()
        .await
        .unwrap();
    let held = Instant::now();
    println!(
        "the live waiter held {} after the crashed lease ended (waited {})",
        humantime(held.saturating_duration_since(ends)),
        humantime(held - started)
    );
    assert!(
        held < ends + ms(500),
        "the dead waiter's entry stalled the line for {} after the lease ended",
        humantime(held.saturating_duration_since(ends))
    );
    drop(guard);
}

/// The same through a release: the holder lets go after the dead waiter's
/// wait ended, and the live waiter behind it is handed the key at once
/// (not a hand-over lease later).
async fn a_release_hands_the_key_past_a_waiter_whose_wait_is_over(store: Store) {
    let key = key("fifo-dead-waiter-release");
    let holder = store.independent().await;
    let guard = holder.lock(&key).ttl(secs(5)).acquire().await.unwrap();
    let dead = store.independent().await;
    dead_waiter(&dead, &key, ms(200)).await;
    let live = store.independent().await;
    let waiter = {
        let key = key.clone();
        tokio::spawn(async move {
            let guard = live.lock(&key).wait(secs(10)).acquire().await;
            (Instant::now(), guard, live)
        })
    };
    tokio::time::sleep(ms(400)).await;
    let released = Instant::now();
    guard.release().await.unwrap();
    let (held, guard, _live) = within(secs(5), "the live waiter", waiter).await.unwrap();
    guard.unwrap().release().await.unwrap();
    let after = held.saturating_duration_since(released);
    println!(
        "the live waiter held {} after the release",
        humantime(after)
    );
    assert!(
        after < ms(300),
        "the dead waiter's entry was handed the key: the live one held {} after the release",
        humantime(after)
    );
}

/// Queues `client` for `key` for `wait` and leaves its entry behind, as a
/// process that died while waiting would: the entry is put there by a
/// waiting acquire whose client is then forgotten (no background release
/// ever runs for it).
async fn dead_waiter(client: &LockClient, key: &str, wait: Duration) {
    let attempt = client
        .lock(key)
        .ttl(ms(1000))
        .renew(false)
        .wait(wait)
        .acquire();
    // Long enough to have queued; then the attempt is forgotten, not
    // dropped, so its clean-up never runs.
    let mut attempt = Box::pin(attempt);
    let _ = tokio::time::timeout(ms(100), &mut attempt).await;
    std::mem::forget(attempt);
    std::mem::forget(client.clone());
}

fn humantime(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}
