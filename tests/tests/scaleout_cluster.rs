//! Redis Cluster on loopback (three masters, no replicas): the shared
//! semantic suite, locks whose names all live in their key's slot on
//! different nodes (also for keys with braces in odd places), release
//! notices across shards (sharded pub/sub), and a slot migrating while its
//! lock is held (`MOVED` after it, `ASK` during it).

use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockClientBuilder, LockError, LockGuard};
use tokio::task::JoinHandle;

use test_support::topology::{Cluster, Topology};

#[macro_use]
mod scaleout_common;
use test_support::helpers::*;

fn three_masters() -> (Cluster, LockClientBuilder) {
    Cluster::start(3).with_builder()
}

semantic_suite!(three_masters);

/// A cluster of three masters, and two independent clients of it.
async fn three_masters_and_two_clients() -> (Cluster, LockClient, LockClient) {
    let (cluster, builder) = three_masters();
    let (a, b) = two_clients(&builder).await;
    (cluster, a, b)
}

/// A unique prefix for the keys of one test.
fn prefix(name: &str) -> String {
    test_support::helpers::key(name)
}

/// One key on each of the three nodes, under a prefix of its own.
fn one_key_per_node(cluster: &Cluster, name: &str) -> Vec<String> {
    let p = prefix(name);
    (0..3).map(|node| cluster.key_on(node, &p)).collect()
}

/// The remaining lease of `name` on node `i`, in ms (`PTTL`): -2 when the
/// node does not have it (also when it redirects: `MOVED`, `ASK`).
fn pttl(cluster: &Cluster, i: usize, name: &str) -> i64 {
    let answer = cluster.cli(i, &["PTTL", name]);
    if answer.starts_with("MOVED") || answer.starts_with("ASK") {
        return -2;
    }
    answer
        .parse()
        .unwrap_or_else(|_| panic!("PTTL {name} on node {i}: {answer}"))
}

/// How many connections node `i` has subscribed to the shard channel `channel`.
fn shard_subscribers(cluster: &Cluster, i: usize, channel: &str) -> String {
    let answer = cluster.cli(i, &["PUBSUB", "SHARDNUMSUB", channel]);
    answer.lines().last().unwrap_or("?").to_owned()
}

/// Takes `key` with a 10 s lease (failing the test, naming the key, if it cannot).
/// Holds `key` with its fencing token asked for (minted on first use, so
/// the slot's counter exists from here on).
async fn hold(client: &LockClient, key: &str) -> LockGuard {
    let guard = client
        .lock(key)
        .ttl(secs(10))
        .acquire()
        .await
        .unwrap_or_else(|e| panic!("acquire `{key}`: {e}"));
    guard
        .fencing_token()
        .await
        .unwrap_or_else(|e| panic!("the token of `{key}`: {e}"));
    guard
}

/// A waiter's task: when it got the lock, and the lock.
type Waiter = JoinHandle<(Instant, Result<LockGuard, LockError>)>;

/// Spawns a waiter of `client` for `key` (a 10 s lease, waiting up to `wait`).
fn spawn_timed_waiter(client: &LockClient, key: &str, wait: Duration) -> Waiter {
    let (client, key) = (client.clone(), key.to_owned());
    tokio::spawn(async move {
        let guard = client.lock(&key).ttl(secs(10)).wait(wait).acquire().await;
        (Instant::now(), guard)
    })
}

/// Releases `holder` while `waiter` waits for the same lock: how long after
/// the release the waiter got it (within `limit`; it releases it then).
async fn release_and_wake(holder: LockGuard, waiter: Waiter, limit: Duration) -> Duration {
    let released = Instant::now();
    holder.release().await.unwrap();
    let (woke, second) = within(limit, "the waiter wakes", waiter).await.unwrap();
    second
        .expect("the waiter gets the lock")
        .release()
        .await
        .unwrap();
    woke.saturating_duration_since(released)
}

/// One hand-over across a migration: `a` holds `key` (10 s lease, so only a
/// notice wakes the waiter quickly), a waiter of `b` starts before or after
/// the slot moves to node `to`, `a` releases. Returns release -> woken, and
/// the subscriber counts of the notice channel on the new owner before the
/// release.
async fn handoff_across_a_migration(
    cluster: &Cluster,
    a: &LockClient,
    b: &LockClient,
    key: &str,
    to: usize,
    waiter_first: bool,
) -> (Duration, String) {
    let slot = cluster.slot_of(key);
    let holder = a.lock(key).ttl(secs(10)).acquire().await.unwrap();
    let start_waiter = || spawn_timed_waiter(b, key, secs(9));
    let mut waiter = None;
    if waiter_first {
        waiter = Some(start_waiter());
        tokio::time::sleep(ms(200)).await;
    }
    tokio::task::block_in_place(|| cluster.migrate_slot(slot, to));
    let waiter = match waiter {
        Some(w) => w,
        None => start_waiter(),
    };
    // Time for a client to hear of the move and subscribe again.
    tokio::time::sleep(ms(500)).await;
    let subscribers = shard_subscribers(cluster, to, &format!("lock:N{{{key}}}"));
    assert!(!waiter.is_finished(), "the waiter got a held lock");
    let latency = release_and_wake(holder, waiter, secs(9)).await;
    (latency, subscribers)
}

/// Waits (up to 5 s) until `client`'s try-once on `key` is refused:
/// the lock is held by someone.
async fn wait_held(client: &LockClient, key: &str) {
    let started = Instant::now();
    while !is_held(client, key).await {
        assert!(started.elapsed() < secs(5), "`{key}` never got held");
        tokio::time::sleep(ms(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_on_keys_of_different_nodes_keep_all_their_names_in_their_own_slot() {
    let (cluster, a, b) = three_masters_and_two_clients().await;
    let keys = one_key_per_node(&cluster, "spread");
    let mut guards = Vec::new();
    for key in &keys {
        guards.push(hold(&a, key).await);
    }
    // One waiter per key, all from one client: its queue entries exist too.
    let waiters: Vec<_> = keys
        .iter()
        .map(|key| spawn_timed_waiter(&b, key, secs(8)))
        .collect();
    tokio::time::sleep(ms(200)).await;

    for (node, key) in keys.iter().enumerate() {
        let names: Vec<String> = cluster
            .keys(node)
            .into_iter()
            // Not the clients' registry entries (their labels).
            .filter(|n| n.starts_with("lock:") && !n.starts_with("lock:C{"))
            .collect();
        let tag = format!("{{{key}}}");
        assert!(names.contains(&fence_name(key)), "{names:?}");
        assert!(
            names.contains(&lock_name(key)),
            "node {node} holds the lock of `{key}`: {names:?}"
        );
        assert!(
            names.len() >= 3,
            "lock, fencing counter and waiter queue of `{key}` on node {node}: {names:?}"
        );
        let slot = cluster.slot_of(key);
        for name in &names {
            assert!(
                name.contains(&tag) || *name == fence_name(key),
                "node {node} holds a name of another key: {name}"
            );
            assert_eq!(
                cluster.slot_of(name),
                slot,
                "{name} is in the slot of `{key}`"
            );
        }
    }

    for (guard, waiter) in guards.into_iter().zip(waiters) {
        let latency = release_and_wake(guard, waiter, secs(6)).await;
        assert!(
            latency < secs(2),
            "a waiter slept {latency:?} on a 10 s lease"
        );
    }
    for node in 0..3 {
        assert!(
            !cluster.keys(node).iter().any(|n| n.starts_with("lock:L")),
            "node {node} still holds a lock"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_holding_a_lock_on_one_shard_is_woken_by_a_release_on_another() {
    let (cluster, a, b) = three_masters_and_two_clients().await;
    let keys = one_key_per_node(&cluster, "cross");
    let mut latencies = Vec::new();
    for mine in 0..3 {
        for theirs in (0..3).filter(|&n| n != mine) {
            let holder = a.lock(&keys[theirs]).ttl(secs(10)).acquire().await.unwrap();
            let waiter = {
                let (b, mine, theirs) = (b.clone(), keys[mine].clone(), keys[theirs].clone());
                tokio::spawn(async move {
                    // (Waiting: the probe below may hold it for a moment.)
                    b.lock(&mine)
                        .ttl(secs(10))
                        .wait(secs(5))
                        .run(async {
                            held_at(b.lock(&theirs).ttl(secs(10)).wait(secs(8)).acquire().await)
                                .await
                        })
                        .await
                        .expect("the waiter's own lock")
                })
            };
            wait_held(&a, &keys[mine]).await;
            tokio::time::sleep(ms(30)).await;
            latencies.push(release_to_waiter(holder, waiter, secs(6)).await);
        }
    }
    assert_prompt_handoffs("cross-shard release -> waiter holds", latencies, ms(200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_migration_while_a_lock_is_held_keeps_extend_and_release_working() {
    let (cluster, a, b) = three_masters_and_two_clients().await;
    let key = cluster.key_on(0, &prefix("migrated"));
    let name = lock_name(&key);
    let slot = cluster.slot_of(&key);
    let ttl = ms(900);
    let guard = a.lock(&key).ttl(ttl).acquire().await.unwrap();
    let token = guard.fencing_token().await.unwrap();

    let started = Instant::now();
    let from = tokio::task::block_in_place(|| cluster.migrate_slot(slot, 1));
    println!(
        "slot {slot} moved from node {from} to node 1 in {:?}",
        started.elapsed()
    );
    assert_eq!(pttl(&cluster, 0, &name), -2);
    assert!(pttl(&cluster, 1, &name) > 0, "the lock moved with its slot");

    // Several leases later the lock is still there: renewed on node 1.
    tokio::time::sleep(ttl * 3).await;
    assert!(!guard.is_lost(), "lost after the migration");
    let left = pttl(&cluster, 1, &name);
    assert!(
        left > 0,
        "the lock was not renewed on its new node (PTTL {left})"
    );
    assert!(matches!(
        b.lock(&key).acquire().await,
        Err(LockError::Busy { .. })
    ));

    // Release on the new node; the other client gets the lock, fenced higher.
    guard.release().await.expect("release after the migration");
    assert_eq!(pttl(&cluster, 1, &name), -2);
    let second = b.lock(&key).ttl(ttl).acquire().await.unwrap();
    assert!(
        second.fencing_token().await.unwrap() > token,
        "the counter moved with the slot"
    );

    // And once more, to a third node, with the other client holding.
    tokio::task::block_in_place(|| cluster.migrate_slot(slot, 2));
    tokio::time::sleep(ttl * 2).await;
    assert!(!second.is_lost(), "lost after the second migration");
    assert!(pttl(&cluster, 2, &name) > 0);
    second.release().await.unwrap();
    assert!(!is_held(&a, &key).await);
}

/// Holds `key` with a 900 ms lease from `a` while its slot is half migrated
/// from node 0 to node 2 (keys moved, slot still owned by node 0, which
/// answers ASK) for three leases, checking that the renewals reach node 2.
/// Returns the guard and the migration, still in progress.
async fn hold_through_a_half_migration(
    cluster: &Cluster,
    a: &LockClient,
    key: &str,
) -> (lock_runtime::LockGuard, test_support::topology::Migration) {
    let name = lock_name(key);
    let slot = cluster.slot_of(key);
    let ttl = ms(900);
    let guard = a.lock(key).ttl(ttl).acquire().await.unwrap();
    guard.fencing_token().await.unwrap(); // the counter exists, to move too
    let migration = cluster.begin_migration(slot, 2);
    let moved = cluster.move_keys(&migration);
    assert!(moved >= 2, "lock and counter moved: {moved}");
    assert_eq!(pttl(cluster, 0, &name), -2);
    assert!(pttl_importing(cluster, 2, &name) > 0);
    tokio::time::sleep(ttl * 3).await;
    assert!(!guard.is_lost(), "lost while the slot was half migrated");
    assert!(
        pttl_importing(cluster, 2, &name) > 0,
        "renewed through ASK on node 2"
    );
    (guard, migration)
}

/// `PTTL` on a node importing the slot (after `ASKING`).
fn pttl_importing(cluster: &Cluster, i: usize, name: &str) -> i64 {
    let answer = cluster.cli_asking(i, &["PTTL", name]);
    answer
        .parse()
        .unwrap_or_else(|_| panic!("PTTL {name} on node {i}: {answer}"))
}

/// After a migration of `key`'s slot to node 2: the lock is gone from node
/// 2, and `client` can take it.
async fn assert_released_on_node_2(cluster: &Cluster, client: &LockClient, key: &str) {
    assert_eq!(pttl(cluster, 2, &lock_name(key)), -2, "released on node 2");
    lock_and_release(client, key).await; // free after the release
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_follow_ask_redirects_while_a_slot_is_half_migrated() {
    let (cluster, a, b) = three_masters_and_two_clients().await;
    let key = cluster.key_on(0, &prefix("asked"));
    let (guard, migration) = hold_through_a_half_migration(&cluster, &a, &key).await;

    // Scripts that also name keys that do not exist (the waiter queue) get
    // TRYAGAIN from the importing node until the migration ends: another
    // client cannot take the lock meanwhile, whatever it is told.
    let other = b.lock(&key).acquire().await;
    println!("a try-once of another client while the slot is half migrated: {other:?}");
    assert!(other.is_err(), "a second holder during the migration");

    tokio::task::block_in_place(|| cluster.finish_migration(migration));
    assert!(!guard.is_lost());
    guard.release().await.expect("release after the migration");
    assert_released_on_node_2(&cluster, &b, &key).await;
}

/// A release (or acquire) that meets TRYAGAIN while the slot's keys are in
/// transit should go through once the migration ends (here 0.1-0.3 s later),
/// within the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_started_during_a_slot_migration_completes_once_the_migration_ends() {
    let (cluster, a, b) = three_masters_and_two_clients().await;
    let key = cluster.key_on(0, &prefix("tryagain"));
    let (guard, migration) = hold_through_a_half_migration(&cluster, &a, &key).await;
    let release = tokio::spawn(guard.release());
    tokio::time::sleep(ms(100)).await;
    let started = Instant::now();
    tokio::task::block_in_place(|| cluster.finish_migration(migration));
    within(secs(3), "release across the end of the migration", release)
        .await
        .unwrap()
        .expect("release through TRYAGAIN, then MOVED");
    println!("released {:?} after the migration ended", started.elapsed());
    assert_released_on_node_2(&cluster, &b, &key).await;
}

/// The request of one kind of lock on `key`: a mutex, a semaphore of one
/// permit, a write lock.
fn request(client: &LockClient, kind: &str, key: &str) -> lock_runtime::LockRequest {
    match kind {
        "semaphore" => client.semaphore(key, 1),
        "write lock" => client.rw_lock(key).write(),
        _ => client.lock(key),
    }
}

/// A waiting acquire of every kind while its key's slot is half migrated
/// for a second: the scripts of a waiter name keys split between the two
/// nodes, refused with `TRYAGAIN` (past the driver's own retries) until the
/// migration ends. The wait rides that out, as it does a failover, and
/// takes the lock at the holder's release after the migration; it failed
/// in about 0.2 s with "acquire failed: TryAgain" before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_acquires_ride_out_a_half_migrated_slot() {
    let (cluster, a, b) = three_masters_and_two_clients().await;
    for kind in ["mutex", "semaphore", "write lock"] {
        let key = cluster.key_on(0, &prefix(&format!("ride-{}", kind.len())));
        let holder = request(&a, kind, &key)
            .ttl(secs(10))
            .acquire()
            .await
            .unwrap();
        holder.fencing_token().await.unwrap(); // the counter moves too
        let migration = cluster.begin_migration(cluster.slot_of(&key), 2);
        cluster.move_keys(&migration);
        let waiter = tokio::spawn(request(&b, kind, &key).wait(secs(10)).acquire());
        tokio::time::sleep(secs(1)).await;
        assert!(
            !waiter.is_finished(),
            "{kind}: the waiter gave up while the slot was half migrated: {:?}",
            waiter.await.unwrap().map(|_| ())
        );
        tokio::task::block_in_place(|| cluster.finish_migration(migration));
        holder.release().await.unwrap();
        let taken = within(secs(5), "the waiter takes the lock", waiter).await;
        let guard = taken.unwrap().unwrap_or_else(|e| panic!("{kind}: {e}"));
        guard.release().await.unwrap();
    }
}

/// Four tasks taking and releasing locks of one slot (waits of 10 s, leases
/// of 5 s) while that slot moves between nodes four times, as `redis-cli
/// --cluster reshard` moves it (each move takes about 0.1 s): no acquire
/// fails and none waits out a lease. Before, some releases failed with
/// `ASK` (the driver's retries used up during the move), leaving their key
/// taken for its whole lease, and some acquires failed at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_of_a_slot_being_resharded_are_taken_and_released_without_errors() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let (cluster, a, _) = three_masters_and_two_clients().await;
    let cluster = Arc::new(cluster);
    let tag = prefix("resharded");
    let slot = cluster.slot_of(&tag);
    let (stop, errors) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(Mutex::new(vec![])),
    );
    let tasks: Vec<_> = (0..4)
        .map(|t| {
            let (a, stop, errors) = (a.clone(), stop.clone(), errors.clone());
            let key = format!("{{{tag}}}:{t}");
            tokio::spawn(async move {
                let mut taken = 0;
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    let lock = a.lock(&key).ttl(secs(5)).wait(secs(10)).acquire().await;
                    let failed = match lock {
                        // A key left taken by a failed release: its lease.
                        Ok(_) if started.elapsed() > secs(4) => {
                            Some(format!("{key} waited {:?}", started.elapsed()))
                        }
                        Ok(guard) => guard
                            .release()
                            .await
                            .err()
                            .map(|e| format!("release: {e:?}")),
                        Err(e) => Some(format!("acquire: {e:?}")),
                    };
                    errors.lock().unwrap().extend(failed);
                    taken += 1;
                }
                taken
            })
        })
        .collect();
    for _ in 0..4 {
        tokio::time::sleep(ms(200)).await;
        let moved = cluster.clone();
        let to = (moved.owner_of(slot) + 1) % 3;
        tokio::task::spawn_blocking(move || moved.migrate_slot(slot, to))
            .await
            .unwrap();
    }
    tokio::time::sleep(ms(300)).await;
    stop.store(true, Ordering::Relaxed);
    let mut taken = 0;
    for task in tasks {
        taken += task.await.unwrap();
    }
    let errors = errors.lock().unwrap();
    println!("{taken} locks taken across 4 moves of their slot");
    assert!(errors.is_empty(), "{errors:#?}");
    assert!(taken > 40, "only {taken} locks taken");
}

/// A hand-over across a migration of a key of node 0 to node 1 (see
/// [`handoff_across_a_migration`]): the waiter wakes promptly after the
/// release, not after the 10 s lease.
async fn waiter_woken_promptly_across_a_migration(name: &str, waiter_first: bool) {
    let (cluster, a, b) = three_masters_and_two_clients().await;
    let key = cluster.key_on(0, &prefix(name));
    let (latency, subscribers) =
        handoff_across_a_migration(&cluster, &a, &b, &key, 1, waiter_first).await;
    let which = if waiter_first {
        "subscribed before"
    } else {
        "that started after"
    };
    println!("release -> waiter {which} the slot moved: {latency:?}");
    assert!(
        latency < secs(2),
        "the waiter slept {latency:?} on a 10 s lease ({subscribers} subscriber(s) on the new owner)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_starts_after_a_slot_migration_is_woken_by_the_release() {
    waiter_woken_promptly_across_a_migration("after-move", false).await;
}

/// Redis sends `sunsubscribe` to the shard subscribers of a slot that moves
/// away; a waiter's client must subscribe again on the new owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_subscribed_before_a_slot_migration_is_woken_by_the_release_after_it() {
    waiter_woken_promptly_across_a_migration("before-move", true).await;
}

/// Keys with braces in odd places, which a key without a hash tag of its own
/// must survive (`}` first made an empty tag once): fixed shapes, then
/// `random` more from a seeded generator over an alphabet heavy in braces.
fn keys_with_odd_braces(random: usize) -> Vec<String> {
    let mut keys: Vec<String> = [
        "}", "}x", "}{", "{}", "{}}", "x{}y", "{", "}}{{", "a}b{c}", "}{a}", "{a}}", "%7D", "}%",
    ]
    .map(String::from)
    .into();
    let alphabet = ['{', '}', '{', '}', 'a', 'b', ':', '%', 'é'];
    // xorshift64: the same keys every run, so a failure can be replayed.
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    while keys.len() < 13 + random {
        let len = 1 + next() % 8;
        let key: String = (0..len)
            .map(|_| alphabet[(next() % alphabet.len() as u64) as usize])
            .collect();
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    keys
}

/// Every name on every node, with the node that holds it (not the
/// clients' registry entries: their labels).
fn all_names(cluster: &Cluster) -> Vec<(usize, String)> {
    on_every_node(cluster, |node| {
        let mut names = cluster.keys(node);
        names.retain(|n| !n.starts_with("lock:C{"));
        names
    })
}

/// Every shard channel someone subscribes to, with the node that serves it.
fn all_shard_channels(cluster: &Cluster) -> Vec<(usize, String)> {
    on_every_node(cluster, |node| {
        cluster
            .cli(node, &["PUBSUB", "SHARDCHANNELS"])
            .lines()
            .filter(|c| !c.is_empty())
            .map(str::to_owned)
            .collect()
    })
}

fn on_every_node(cluster: &Cluster, list: impl Fn(usize) -> Vec<String>) -> Vec<(usize, String)> {
    (0..cluster.size())
        .flat_map(|node| list(node).into_iter().map(move |n| (node, n)))
        .collect()
}

/// How many names a first lock of `key` adds: the lock, and its slot's
/// fencing counter unless another key of the slot made it already.
fn new_names_of_a_first_lock(before: &[(usize, String)], key: &str) -> usize {
    let counter = fence_name(key);
    if before.iter().any(|(_, name)| *name == counter) {
        1
    } else {
        2
    }
}

/// The entries of `now` not in `before`, checked to be `expected` many, on
/// one node and in one slot (by `CLUSTER KEYSLOT`); returns that slot.
fn new_ones_share_one_slot(
    cluster: &Cluster,
    before: &[(usize, String)],
    now: Vec<(usize, String)>,
    expected: usize,
    what: &str,
) -> u16 {
    let new: Vec<(usize, String)> = now.into_iter().filter(|n| !before.contains(n)).collect();
    assert_eq!(new.len(), expected, "{what}: {new:?}");
    let (node, first) = &new[0];
    let slot = cluster.slot_of(first);
    for (n, name) in &new {
        assert_eq!(n, node, "{what}: {new:?} on one node");
        assert_eq!(cluster.slot_of(name), slot, "{what}: {new:?} in one slot");
    }
    slot
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_with_braces_in_any_place_lock_exclude_release_and_fence_on_a_cluster() {
    let (cluster, a, b) = three_masters_and_two_clients().await;
    let keys = keys_with_odd_braces(24);
    let mut slots = Vec::new();
    for key in &keys {
        let before = all_names(&cluster);
        let first = hold(&a, key).await;
        match b.lock(key).acquire().await {
            Err(LockError::Busy { .. }) => {}
            other => panic!("a second client on `{key}` held by another: {other:?}"),
        }
        let what = format!("lock and fencing counter of `{key}`");
        slots.push(new_ones_share_one_slot(
            &cluster,
            &before,
            all_names(&cluster),
            new_names_of_a_first_lock(&before, key),
            &what,
        ));
        let token = first.fencing_token().await.unwrap();
        first
            .release()
            .await
            .unwrap_or_else(|e| panic!("release `{key}`: {e}"));
        next_holder(b.lock(key), token, &format!("`{key}` after its release")).await;
    }
    slots.sort_unstable();
    slots.dedup();
    assert!(
        slots.len() > keys.len() / 2,
        "keys spread over slots: {slots:?}"
    );

    // All held at once with short leases: the watchdog's per-slot renewal
    // batches must group names by the slot Redis gives them.
    let ttl = ms(450);
    let mut guards = Vec::new();
    for key in &keys {
        guards.push(a.lock(key).ttl(ttl).acquire().await.unwrap());
    }
    tokio::time::sleep(ttl * 3).await;
    for (key, guard) in keys.iter().zip(guards) {
        assert!(!guard.is_lost(), "`{key}` lost while held through renewals");
        assert!(is_held(&b, key).await, "`{key}` still held");
        guard.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_on_a_key_with_odd_braces_is_woken_by_the_release() {
    let (cluster, a, b) = three_masters_and_two_clients().await;
    // Some fixed shapes and the two random keys.
    let mut keys: Vec<String> = ["}", "}{", "{}", "}}{{", "a}b{c}"].map(String::from).into();
    keys.extend(keys_with_odd_braces(2).split_off(13));
    assert_eq!(keys.len(), 7);
    for key in &keys {
        let before = all_names(&cluster);
        let holder = hold(&a, key).await;
        let what = format!("lock and fencing counter of `{key}`");
        let expected = new_names_of_a_first_lock(&before, key);
        let slot = new_ones_share_one_slot(&cluster, &before, all_names(&cluster), expected, &what);
        let (held, channels) = (all_names(&cluster), all_shard_channels(&cluster));
        let waiter = spawn_timed_waiter(&b, key, secs(8));
        tokio::time::sleep(ms(200)).await;
        assert!(!waiter.is_finished(), "the waiter got `{key}` while held");
        let what = format!("waiter queue of `{key}` and its deadlines");
        let queue = new_ones_share_one_slot(&cluster, &held, all_names(&cluster), 2, &what);
        assert_eq!(queue, slot, "{what}");
        let what = format!("release-notice channel of `{key}`");
        let now = all_shard_channels(&cluster);
        let notice = new_ones_share_one_slot(&cluster, &channels, now, 1, &what);
        assert_eq!(notice, slot, "{what}");
        let token = holder.fencing_token().await.unwrap();
        let released = Instant::now();
        holder.release().await.unwrap();
        let (woke, second) = within(secs(9), "the waiter wakes", waiter).await.unwrap();
        let second = second.unwrap_or_else(|e| panic!("the waiter gets `{key}`: {e}"));
        assert!(
            second.fencing_token().await.unwrap() > token,
            "`{key}` fenced higher"
        );
        second.release().await.unwrap();
        let latency = woke.saturating_duration_since(released);
        assert!(
            latency < secs(2),
            "a waiter on `{key}` slept {latency:?} on a 10 s lease: it missed the notice"
        );
    }
}

/// A shard that dies takes its own leases with it, and only those: the
/// watchdog renews each slot's leases in a call of their own, and a failed
/// call leaves only its leases unconfirmed. (The renewal's answers were
/// once joined: the dead shard's error made every lease of the client
/// unconfirmed, and all were lost at the end of their validity.) The
/// cluster serves the slots it still covers: with Redis's default
/// `cluster-require-full-coverage yes` every node answers `CLUSTERDOWN`
/// once the dead master is marked failed, and then every lease is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_going_down_loses_its_own_leases_and_no_others() {
    let (cluster, builder) = three_masters();
    for node in 0..cluster.size() {
        let set = ["CONFIG", "SET", "cluster-require-full-coverage", "no"];
        assert_eq!(cluster.cli(node, &set).trim(), "OK");
    }
    let client = builder.build().await.unwrap();
    let keys = one_key_per_node(&cluster, "shard-down");
    let ttl = secs(3);
    let mut guards = Vec::new();
    for key in &keys {
        let guard = client.lock(key).ttl(ttl).acquire().await.unwrap();
        guards.push(guard);
    }
    let pid = cluster.node(2).pid().expect("node 2 runs");
    test_support::signal(pid, "KILL").unwrap();
    // Two whole leases: renewals every second, each past the dead shard.
    tokio::time::sleep(2 * ttl).await;
    let dead = guards.pop().unwrap();
    assert!(
        dead.is_lost(),
        "the lease on the dead shard cannot be renewed"
    );
    // A lock there now: an error worth a retry (the slot has no server).
    let e = client.lock(&keys[2]).acquire().await.unwrap_err();
    assert!(e.is_connection(), "{e:?}");
    for (key, guard) in keys.iter().zip(guards) {
        assert!(!guard.is_lost(), "`{key}` lives on a shard that is up");
        guard.release().await.unwrap();
    }
}

/// A waiter's subscription (`SSUBSCRIBE`) is never on a connection that
/// sends commands: on one connection, a slot that moved under the
/// subscription had the re-subscription's confirmation taken for the
/// answer of a command sent beside it, and the answers after it shifted
/// one command down (an acquire answered with another's `OK`: two holders
/// at once, about once in 5,000 acquires while slots kept moving).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiters_subscription_is_on_a_connection_that_sends_no_commands() {
    let (cluster, a, b) = three_masters_and_two_clients().await;
    let key = cluster.key_on(0, &prefix("own-connection"));
    let holder = hold(&a, &key).await;
    let waiter = spawn_timed_waiter(&b, &key, secs(10));
    let channel = format!("lock:N{{{key}}}");
    eventually(secs(5), "the waiter subscribed", || {
        shard_subscribers(&cluster, 0, &channel) == "1"
    })
    .await;
    // The waiter's look right after its subscription went out on its
    // command connection by now.
    tokio::time::sleep(ms(300)).await;
    let mut subscribed = 0;
    for node in 0..3 {
        for client in cluster.cli(node, &["CLIENT", "LIST"]).lines() {
            let field = |name: &str| {
                client
                    .split(' ')
                    .find_map(|f| f.strip_prefix(name).and_then(|f| f.strip_prefix('=')))
                    .unwrap_or("")
            };
            if field("ssub").parse::<u32>().unwrap_or(0) == 0 {
                continue;
            }
            subscribed += 1;
            let last = field("cmd");
            assert!(
                !["evalsha", "eval", "set", "get", "incr", "del"].contains(&last),
                "a subscribed connection sent `{last}`: {client}"
            );
        }
    }
    assert_eq!(subscribed, 1, "subscribed connections");
    release_and_wake(holder, waiter, secs(3)).await;
}
