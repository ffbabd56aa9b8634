//! Coalesced script calls (group commit) on Redis: while a call is in flight
//! on a connection, the mutex calls that arrive queue and go out as one
//! batch call. On a single server, through Sentinel and on a Cluster: batches
//! form under concurrency, each op keeps its own outcome (a busy key fails
//! only itself, a waiting acquire in a batch is granted by a later release),
//! a caller dropped while queued leaves no lock, and a connection killed
//! with a batch in flight leaves no lock without a guard.
//!
//! `CLIENT PAUSE <ms> WRITE` holds every script call the server receives
//! (scripts count as writes) for a while: the first call on each connection
//! is then in flight long enough for what the test sends next to queue
//! behind it, so the batches these tests need form every time.

use std::time::Duration;

use lock_runtime::__private::testing::batched_calls;
use lock_runtime::{LockClient, LockClientBuilder, LockError, LockGuard};
use test_support::RedisServer;
use test_support::helpers::*;
use test_support::topology::{Cluster, SentinelSetup, Topology};

/// The servers under test.
enum Setup {
    Single(RedisServer),
    Sentinel(Box<SentinelSetup>),
    Cluster(Cluster),
}

impl Setup {
    fn single() -> (Self, LockClientBuilder) {
        let server = RedisServer::start();
        let builder = LockClient::builder()
            .redis(server.url())
            .coalesce_scripts(true);
        (Setup::Single(server), builder)
    }

    fn sentinel() -> (Self, LockClientBuilder) {
        let (setup, builder) = SentinelSetup::start().with_builder();
        (
            Setup::Sentinel(Box::new(setup)),
            builder.coalesce_scripts(true),
        )
    }

    fn cluster() -> (Self, LockClientBuilder) {
        let (cluster, builder) = Cluster::start(3).with_builder();
        (Setup::Cluster(cluster), builder.coalesce_scripts(true))
    }

    /// Every server that holds locks, for `redis-cli`.
    fn masters(&self) -> Vec<&RedisServer> {
        match self {
            Setup::Single(server) => vec![server],
            Setup::Sentinel(setup) => vec![setup.master()],
            Setup::Cluster(cluster) => (0..cluster.size()).map(|i| cluster.node(i)).collect(),
        }
    }

    /// `GET key` on the master that holds it.
    fn get(&self, key: &str) -> String {
        match self {
            Setup::Single(server) => server.cli(&["GET", key]),
            Setup::Sentinel(setup) => setup.master().cli(&["GET", key]),
            Setup::Cluster(cluster) => {
                cluster.cli(cluster.owner_of(cluster.slot_of(key)), &["GET", key])
            }
        }
    }

    /// Holds every script call for `pause` on every master.
    fn pause_scripts(&self, pause: Duration) {
        let ms = pause.as_millis().to_string();
        for server in self.masters() {
            server.cli(&["CLIENT", "PAUSE", &ms, "WRITE"]);
        }
    }

    /// Closes every normal (command) connection of every master: the
    /// clients' command connections, not their pub/sub ones.
    fn kill_command_connections(&self) {
        for server in self.masters() {
            let killed = server.cli(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
            println!("CLIENT KILL: {killed}");
        }
    }
}

/// `(calls, ops)` of batches `client` sent since `before`.
fn batched_since(client: &LockClient, before: (u64, u64, u64)) -> (u64, u64) {
    let now = batched_calls(client);
    (now.0 - before.0, now.1 - before.1)
}

/// `n` keys sharing the hash tag `tag` (one slot: on a cluster a batch
/// carries one slot's ops).
fn tagged(tag: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{{{tag}}}:{i}")).collect()
}

/// Acquire tasks.
type Acquires = Vec<tokio::task::JoinHandle<Result<LockGuard, LockError>>>;

/// Spawns try-once acquires of `keys` on `client` (renewed leases).
fn spawn_acquires(client: &LockClient, keys: &[String]) -> Acquires {
    keys.iter()
        .map(|key| {
            let client = client.clone();
            let key = key.clone();
            tokio::spawn(async move { client.lock(key).ttl(secs(10)).acquire().await })
        })
        .collect()
}

/// Lets the tasks spawned so far reach their connection (and queue).
async fn settle() {
    tokio::time::sleep(ms(100)).await;
}

/// Holds every script call for 400 ms and spawns acquires of the free keys
/// `free` on `a`, which queue behind the calls in flight. Returns `a`'s
/// batch counters from before and the tasks.
async fn queue_free_acquires(
    servers: &Setup,
    a: &LockClient,
    free: &[String],
) -> ((u64, u64, u64), Acquires) {
    let before = batched_calls(a);
    servers.pause_scripts(ms(400));
    let frees = spawn_acquires(a, free);
    settle().await;
    (before, frees)
}

/// Releases the guards of `frees` (each a free key, so acquired) and checks
/// that `a` sent its attempts since `before` in batches.
async fn release_and_check_batched(a: &LockClient, frees: Acquires, before: (u64, u64, u64)) {
    for task in frees {
        task.await
            .expect("task")
            .expect("a free key is acquired")
            .release()
            .await
            .expect("released");
    }
    let (calls, ops) = batched_since(a, before);
    assert!(
        ops > calls,
        "the attempts went out in batches ({ops} ops, {calls} calls)"
    );
}

async fn batches_form_under_concurrency(setup: fn() -> (Setup, LockClientBuilder)) {
    let (_servers, builder) = setup();
    let client = client(&builder).await;
    let before = batched_calls(&client);
    let mut tasks = Vec::new();
    for t in 0..32 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let mut tokens = Vec::new();
            for i in 0..25 {
                // Four hash tags: on a cluster a batch is one slot's ops.
                let key = format!("{{batch-many-{}}}:{t}:{i}", t % 4);
                let guard = client
                    .lock(key)
                    .acquire()
                    .await
                    .expect("a free key is acquired");
                tokens.push(guard.fencing_token().await.unwrap());
                guard.release().await.expect("released");
            }
            tokens
        }));
    }
    let mut pairs = 0;
    for task in tasks {
        pairs += task.await.expect("task").len();
    }
    assert_eq!(pairs, 32 * 25);
    let (calls, ops) = batched_since(&client, before);
    println!("{pairs} pairs: {ops} ops in {calls} batch calls");
    assert!(calls > 0, "no batch call was made");
    assert!(
        ops > calls,
        "batches carried one op each ({ops} ops in {calls} calls): nothing was coalesced"
    );
    for t in [0, 31] {
        assert!(
            !is_held(&client, &format!("{{batch-many-{}}}:{t}:24", t % 4)).await,
            "a released key is free"
        );
    }
}

async fn a_busy_key_fails_only_itself(setup: fn() -> (Setup, LockClientBuilder)) {
    let (servers, builder) = setup();
    let (a, b) = two_clients(&builder).await;
    let tag = key("batch-busy");
    let busy = format!("{{{tag}}}:busy");
    let held = b
        .lock(&busy)
        .ttl(secs(30))
        .acquire()
        .await
        .expect("b holds it");
    let free = tagged(&tag, 30);
    let (before, frees) = queue_free_acquires(&servers, &a, &free).await;
    // Queued behind the calls in flight: sent in a batch with others.
    let busy_attempt = spawn_acquires(&a, std::slice::from_ref(&busy));
    let mut guards = Vec::new();
    for task in frees {
        guards.push(
            task.await
                .expect("task")
                .expect("a free key in a batch is acquired"),
        );
    }
    match busy_attempt
        .into_iter()
        .next()
        .expect("one")
        .await
        .expect("task")
    {
        Err(LockError::Busy { .. }) => {}
        other => panic!("the busy key should be busy, got {other:?}"),
    }
    let (calls, ops) = batched_since(&a, before);
    println!("{ops} ops in {calls} batch calls");
    assert!(
        ops >= 2 && ops > calls,
        "the attempts went out in batches ({ops} ops, {calls} calls)"
    );
    for guard in &guards {
        assert!(guard.fencing_token().await.unwrap() > 0);
    }
    for guard in guards {
        guard.release().await.expect("released");
    }
    held.release().await.expect("b still held it");
}

async fn a_waiting_acquire_in_a_batch_is_granted_by_a_release(
    setup: fn() -> (Setup, LockClientBuilder),
) {
    let (servers, builder) = setup();
    let (a, b) = two_clients(&builder).await;
    let tag = key("batch-wanted");
    let wanted = format!("{{{tag}}}:wanted");
    // A long fixed lease: a grant that came from the lease running out would
    // take 30 s, the hand-over takes a round trip.
    let held = fixed_lease(&b, &wanted, secs(30))
        .await
        .expect("b holds it");
    let free = tagged(&tag, 20);
    let (before, frees) = queue_free_acquires(&servers, &a, &free).await;
    let waiter = {
        let a = a.clone();
        let wanted = wanted.clone();
        tokio::spawn(async move { a.lock(wanted).ttl(secs(10)).wait(secs(20)).acquire().await })
    };
    release_and_check_batched(&a, frees, before).await;
    tokio::time::sleep(ms(200)).await;
    assert!(
        !waiter.is_finished(),
        "the waiter waits while b holds the key"
    );
    let released = std::time::Instant::now();
    held.release().await.expect("b held it");
    let guard = within(secs(5), "the hand-over to the batched waiter", waiter)
        .await
        .expect("task")
        .expect("the waiter is granted the key");
    println!("granted {:?} after the release", released.elapsed());
    assert!(
        released.elapsed() < secs(3),
        "granted by the hand-over, not the lease"
    );
    guard.release().await.expect("released");
}

async fn a_caller_dropped_while_queued_leaves_no_lock(setup: fn() -> (Setup, LockClientBuilder)) {
    let (servers, builder) = setup();
    let a = client(&builder).await;
    // One slot (one connection): the dropped attempt queues behind the others.
    let tag = key("batch-dropped");
    let free = tagged(&tag, 20);
    let dropped = format!("{{{tag}}}:dropped");
    let (before, frees) = queue_free_acquires(&servers, &a, &free).await;
    // Queued behind the calls in flight, then given up before it is sent.
    let gave_up = tokio::time::timeout(ms(50), a.lock(&dropped).ttl(secs(30)).acquire()).await;
    assert!(gave_up.is_err(), "the acquire was still queued");
    release_and_check_batched(&a, frees, before).await;
    // Left out of the batch: it never ran, so it never drew a fencing token
    // from the slot's counter, where each of the 20 others drew one.
    assert_eq!(
        servers.get(&fence_name(&dropped)),
        "20",
        "the dropped attempt was sent after all"
    );
    assert!(!is_held(&a, &dropped).await, "no lock without a guard");
}

async fn a_connection_killed_mid_batch_leaves_no_lock_without_a_guard(
    setup: fn() -> (Setup, LockClientBuilder),
) {
    let (servers, builder) = setup();
    let a = short_timeout_client(builder.clone()).await;
    let probe = client(&builder).await;
    let keys = tagged(&key("batch-killed"), 30);
    let before = batched_calls(&a);
    // Longer than `a`'s 500 ms response timeout: whatever the driver
    // re-sends after the kill times out too, and runs once the pause ends.
    servers.pause_scripts(ms(1200));
    let first = spawn_acquires(&a, &keys[..10]);
    settle().await;
    let queued = spawn_acquires(&a, &keys[10..]);
    tokio::time::sleep(ms(50)).await;
    servers.kill_command_connections();
    let mut held = Vec::new();
    let mut failed = Vec::new();
    for (key, task) in keys.iter().zip(first.into_iter().chain(queued)) {
        match task.await.expect("task") {
            Ok(guard) => held.push(guard),
            Err(e) => failed.push((key.clone(), e)),
        }
    }
    let (calls, ops) = batched_since(&a, before);
    println!(
        "{} held, {} failed; {ops} ops in {calls} batch calls",
        held.len(),
        failed.len()
    );
    assert!(
        ops > calls,
        "the attempts went out in batches ({ops} ops, {calls} calls)"
    );
    for (_, e) in &failed {
        assert!(
            matches!(e, LockError::Backend(_)),
            "a connection error, got {e:?}"
        );
    }
    tokio::time::sleep(ms(1200)).await;
    // An attempt that failed may have run before the connection went: its
    // clean-up gives the key back (no guard holds it).
    for (key, _) in &failed {
        let mut free = false;
        for _ in 0..50 {
            if !is_held(&probe, key).await {
                free = true;
                break;
            }
            tokio::time::sleep(ms(100)).await;
        }
        assert!(free, "`{key}` is held without a guard");
    }
    for guard in held {
        guard
            .release()
            .await
            .expect("a guard's lock is still its own");
    }
}

macro_rules! on_every_deployment {
    ($($name:ident => $scenario:ident;)*) => {
        mod single {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    $scenario(Setup::single).await;
                }
            )*
        }
        mod sentinel {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    $scenario(Setup::sentinel).await;
                }
            )*
        }
        mod cluster {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    $scenario(Setup::cluster).await;
                }
            )*
        }
    };
}

on_every_deployment! {
    concurrent_acquires_of_distinct_keys_go_out_in_batches => batches_form_under_concurrency;
    a_busy_key_in_a_batch_fails_only_itself => a_busy_key_fails_only_itself;
    a_waiting_acquire_in_a_batch_is_granted_by_a_later_release => a_waiting_acquire_in_a_batch_is_granted_by_a_release;
    a_future_dropped_while_queued_leaves_no_lock => a_caller_dropped_while_queued_leaves_no_lock;
    a_connection_killed_with_a_batch_in_flight_leaves_no_lock_without_a_guard => a_connection_killed_mid_batch_leaves_no_lock_without_a_guard;
}
