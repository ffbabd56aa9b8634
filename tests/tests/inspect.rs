//! `LockClient::inspect` on every backend: free, held with its lease and the
//! fencing counter, waiters counted, free again after release.

use std::time::Duration;

use lock_runtime::{LockClient, LockClientBuilder};
use test_support::RedisServer;
use test_support::topology::{Cluster, Redlock, SentinelSetup, Topology};

async fn a_lock_is_seen_free_held_waited_for_and_free_again(
    builder: LockClientBuilder,
    queues: bool,
) {
    let holder = builder.clone().build().await.unwrap();
    let waiter = builder.build().await.unwrap();
    let key = "inspect:order:42";

    let free = holder.inspect(key).await.unwrap();
    assert!(
        !free.held && free.remaining.is_none() && free.waiters == 0,
        "{free:?}"
    );

    let guard = holder
        .lock(key)
        .ttl(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    // Minted on first use: asked for before the inspection.
    let token = guard.fencing_token().await.unwrap();
    let held = holder.inspect(key).await.unwrap();
    assert!(held.held, "{held:?}");
    let left = held.remaining.expect("a lease");
    assert!(
        left > Duration::from_secs(8) && left <= Duration::from_secs(10),
        "{held:?}"
    );
    assert!(held.fencing_counter >= token, "{held:?}");
    assert_eq!(held.key, key);
    assert!(held.held_by_this_client, "{held:?}");
    assert_eq!(held.fencing_token, Some(token));

    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        async move {
            waiter
                .lock(key)
                .wait(Duration::from_secs(5))
                .acquire()
                .await
                .unwrap()
                .release()
                .await
                .unwrap()
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let seen = waiter.inspect(key).await.unwrap();
    assert!(
        seen.held && !seen.held_by_this_client && seen.fencing_token.is_none(),
        "{seen:?}"
    );
    // Redlock's waiters do not queue.
    assert_eq!(seen.waiters, usize::from(queues), "{seen:?}");
    guard.release().await.unwrap();
    waiting.await.unwrap();
    let after = holder.inspect(key).await.unwrap();
    assert!(
        !after.held && after.waiters == 0 && !after.held_by_this_client,
        "{after:?}"
    );
    assert!(after.fencing_counter > held.fencing_counter, "{after:?}");
    assert!(holder.inspect("").await.unwrap_err().is_invalid_key());
}

#[tokio::test]
async fn inspect_on_the_embedded_backend() {
    let builder = LockClient::builder().memory();
    // One backend shared by both clients: the same client, cloned.
    let client = builder.build().await.unwrap();
    let guard = client.lock("k").acquire().await.unwrap();
    let token = guard.fencing_token().await.unwrap();
    let other = client.lock("job").acquire().await.unwrap();
    other.fencing_token().await.unwrap();
    let listed = client.list("", 10).await.unwrap();
    let keys: Vec<&str> = listed.iter().map(|s| s.key.as_str()).collect();
    assert_eq!(keys, ["job", "k"]);
    assert_eq!(client.list("j", 10).await.unwrap().len(), 1);
    assert_eq!(client.list("", 1).await.unwrap().len(), 1);
    let state = client.inspect("k").await.unwrap();
    assert!(
        state.held && state.fencing_token == Some(token) && state.fencing_counter > token,
        "{state:?}"
    );
    guard.release().await.unwrap();
    assert!(!client.inspect("k").await.unwrap().held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_on_one_redis() {
    let server = RedisServer::start();
    a_lock_is_seen_free_held_waited_for_and_free_again(
        LockClient::builder().redis(server.url()),
        true,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_on_redlock() {
    let masters = Redlock::start(3);
    a_lock_is_seen_free_held_waited_for_and_free_again(masters.builder(), false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_on_sentinel() {
    let setup = SentinelSetup::start();
    a_lock_is_seen_free_held_waited_for_and_free_again(setup.builder(), true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_on_a_cluster() {
    let cluster = Cluster::start(3);
    let client = cluster.builder().build().await.unwrap();
    // Listed on every master (lockctl/tests/lockctl_cluster.rs holds locks
    // on each): nothing held yet.
    assert!(client.list("", 10).await.unwrap().is_empty());
    a_lock_is_seen_free_held_waited_for_and_free_again(cluster.builder(), true).await;
}

/// `list` finds the held locks it is asked for however many other names
/// the server has: keys under other prefixes and completed idempotency
/// records do not use up what it reads before the held ones are found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_finds_held_locks_among_many_other_names() {
    let server = RedisServer::start();
    let client = LockClient::builder()
        .redis(server.url())
        .build()
        .await
        .unwrap();
    let mut guards = Vec::new();
    for i in 0..200 {
        guards.push(client.lock(format!("aaa:{i}")).acquire().await.unwrap());
    }
    for i in 0..300 {
        match client.record(format!("msg-{i}")).claim().await.unwrap() {
            lock_runtime::Claimed::Run(record) => record.complete("done").await.unwrap(),
            other => panic!("{other:?}"),
        }
    }
    let _permit = client.semaphore("sem:1", 2).acquire().await.unwrap();
    let _last = client.lock("zzz:held").acquire().await.unwrap();

    let sem = client.list("sem", 10).await.unwrap();
    assert_eq!(sem.len(), 1, "{sem:?}");
    assert_eq!(sem[0].key, "sem:1");
    let zzz = client.list("zzz", 1).await.unwrap();
    assert_eq!(zzz.len(), 1, "{zzz:?}");
    let all = client.list("", 150).await.unwrap();
    assert_eq!(all.len(), 150);
    assert!(all.windows(2).all(|w| w[0].key < w[1].key), "sorted by key");
    assert_eq!(client.list("", 1000).await.unwrap().len(), 202);
}

/// A name under the prefix that no client can have made (written by hand,
/// or by another tool: an empty key, an oversized one, control characters)
/// is passed over by `list`: the locks held are still listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_passes_over_names_no_client_made() {
    let server = RedisServer::start();
    let client = test_support::helpers::redis_client(&server).await;
    let _held = client.lock("order:9").acquire().await.unwrap();
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let long = format!("lock:L{{{}}}", "a".repeat(1100));
    for stray in ["lock:L{}", long.as_str(), "lock:L{bad\u{1b}key}"] {
        let _: () = redis::cmd("SET")
            .arg(stray)
            .arg("x")
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let listed = client.list("", 10).await.unwrap();
    let keys: Vec<_> = listed.iter().map(|s| s.key.as_str()).collect();
    assert_eq!(keys, ["order:9"]);
}

/// An operator allowed the locks but not the `fence::redis` records
/// (`~lock-fence:*`) is told what its force-release did: the lock is
/// released and its counter raised, the record is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_release_that_cannot_raise_the_fence_record_says_the_lock_was_released() {
    let server = RedisServer::start();
    let holder = test_support::helpers::redis_client(&server).await;
    let _held = holder.lock("order:77").acquire().await.unwrap();
    let user = [
        "ACL", "SETUSER", "operator", "on", ">op-pw", "~lock:*", "&lock:*", "+@all",
    ];
    assert_eq!(server.cli(&user), "OK");
    let operator = LockClient::builder()
        .redis(format!("redis://operator:op-pw@127.0.0.1:{}", server.port))
        .build()
        .await
        .unwrap();
    let refused = operator.force_release("order:77").await.unwrap_err();
    let said = test_support::error_chain(&refused);
    assert!(said.contains("the lock was released"), "{said}");
    assert!(!operator.inspect("order:77").await.unwrap().held);
}
