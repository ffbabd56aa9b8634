//! The runtime core against a real `redis-server`, for what only Redis has:
//! what the scripts leave on the server, the script cache, passwords and ACL
//! users, the shared pub/sub connection. A server that hangs, is killed, paused
//! or restarted, and processes that die, are in `core_redis_outages.rs`. (The
//! semantics shared with `.memory()` are in the `core_*.rs` suites.)

use std::time::Instant;

use lock_runtime::__private::testing::fence_counter;
use lock_runtime::LockClient;
use test_support::{RedisServer, acl_locker};

use test_support::helpers::*;

mod core_redis_common;
use core_redis_common::{client, connections_received, handoff, last_number, two_clients};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_is_a_key_with_a_lease_and_a_fresh_128_bit_token_beside_its_fencing_counter() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let fence = fence_counter("lock:", "order:42");
    assert!(fence.starts_with("lock:S{"), "{fence}");
    let mut tokens = Vec::new();
    for round in 1..=3 {
        let guard = client
            .lock("order:42")
            .ttl(secs(10))
            .acquire()
            .await
            .unwrap();
        let keys = || {
            let mut keys: Vec<String> = server
                .cli(&["KEYS", "*"])
                .lines()
                .filter(|k| !k.starts_with("lock:C{")) // the client's label
                .map(String::from)
                .collect();
            keys.sort();
            keys
        };
        // The lock; its slot's fencing counter only once a token was asked
        // for (the first round's is minted below).
        if round == 1 {
            assert_eq!(keys(), ["lock:L{order:42}"]);
        } else {
            assert_eq!(keys(), ["lock:L{order:42}", fence.as_str()]);
            assert_eq!(server.cli(&["GET", &fence]), (round - 1).to_string());
        }
        let token = server.cli(&["GET", "lock:L{order:42}"]);
        // 128 random bits, then the client's id and the time it was drawn.
        let random = token.split('.').next().unwrap();
        assert_eq!(random.len(), 32, "{token:?}");
        assert!(random.chars().all(|c| c.is_ascii_hexdigit()), "{token:?}");
        tokens.push(token);
        let pttl = last_number(&server.cli(&["PTTL", "lock:L{order:42}"]));
        assert!(pttl > 9_000 && pttl <= 10_000, "PTTL {pttl}");
        assert_eq!(guard.fencing_token().await.unwrap(), round);
        assert_eq!(keys(), ["lock:L{order:42}", fence.as_str()]);
        assert_eq!(server.cli(&["GET", &fence]), round.to_string());
        guard.release().await.unwrap();
        // Release deletes the lock, never the counter.
        assert_eq!(last_number(&server.cli(&["EXISTS", "lock:L{order:42}"])), 0);
        assert_eq!(last_number(&server.cli(&["EXISTS", &fence])), 1);
    }
    tokens.sort();
    tokens.dedup();
    assert_eq!(tokens.len(), 3, "a token was reused");
    // A key with a hash tag of its own keeps it: all names share its slot.
    let guard = client.lock("{tenant:7}:order:1").acquire().await.unwrap();
    assert_eq!(
        last_number(&server.cli(&["EXISTS", "lock:L:{tenant:7}:order:1"])),
        1
    );
    guard.fencing_token().await.unwrap();
    let tenant_fence = fence_counter("lock:", "{tenant:7}:order:1");
    assert_eq!(last_number(&server.cli(&["EXISTS", &tenant_fence])), 1);
    assert_eq!(
        server.cli(&["CLUSTER", "KEYSLOT", "tenant:7"]).trim(),
        server.cli(&["CLUSTER", "KEYSLOT", &tenant_fence]).trim(),
        "the counter is in the tag's slot"
    );
    guard.release().await.unwrap();
    // Another prefix is another namespace.
    let other = LockClient::builder()
        .redis(server.url())
        .key_prefix("app:")
        .build()
        .await
        .unwrap();
    let guard = other.lock("order:42").acquire().await.unwrap();
    assert_eq!(guard.fencing_token().await.unwrap(), 1);
    assert_eq!(last_number(&server.cli(&["EXISTS", "app:L{order:42}"])), 1);
    guard.release().await.unwrap();
}

/// The hot path stays cheap: with nobody queued, a pair is a plain `SET NX
/// PX` and a compare-and-delete (`DELIFEQ`, `DELEX`, or a minimal script), which
/// neither looks at the queue nor publishes; a waiter that queues marks the
/// holder's value (`token+deadline`), and only then does the release pop the
/// queue and hand over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_touches_the_queue_and_publishes_only_when_somebody_queued() {
    let server = RedisServer::start();
    let client = client(&server).await;
    server.cli(&["CONFIG", "RESETSTAT"]);
    for _ in 0..20 {
        let guard = client.lock("calm").acquire().await.unwrap();
        guard.release().await.unwrap();
    }
    assert_eq!(server.command_calls("set"), 20);
    assert_eq!(
        server.command_calls("incr"),
        0,
        "no token asked, none minted"
    );
    let (native, deletes) = test_support::helpers::checked_native_release(&client, &server);
    match native {
        Some(_) => assert_eq!(server.command_calls(&deletes), 20),
        None => assert_eq!(server.command_calls("evalsha"), 20),
    }
    for command in ["lpop", "lpos", "rpush", "publish"] {
        assert_eq!(
            server.command_calls(command),
            0,
            "{command} on an uncontended key"
        );
    }

    let holder = client.lock("busy").ttl(secs(10)).acquire().await.unwrap();
    let token = server.cli(&["GET", "lock:L{busy}"]);
    let waiter = {
        let client = client.clone();
        tokio::spawn(async move {
            let guard = client.lock("busy").wait(secs(5)).acquire().await.unwrap();
            let fencing = guard.fencing_token().await.unwrap();
            guard.release().await.unwrap();
            fencing
        })
    };
    eventually(secs(5), "the waiter queued", || {
        last_number(&server.cli(&["LLEN", "lock:Q{busy}"])) == 1
    })
    .await;
    let marked = server.cli(&["GET", "lock:L{busy}"]);
    let deadline = marked
        .strip_prefix(&format!("{token}+"))
        .unwrap_or_else(|| panic!("not marked: {marked}"));
    assert!(
        deadline.parse::<u64>().is_ok(),
        "marked with the holder's deadline: {marked}"
    );
    let pttl = last_number(&server.cli(&["PTTL", "lock:L{busy}"]));
    assert!(pttl > 9_000, "marking kept the lease: PTTL {pttl}");
    holder.release().await.unwrap();
    // The holder never asked for its token; the hand-over mints the waiter's.
    assert_eq!(within(secs(5), "the waiter", waiter).await.unwrap(), 1);
    // The holder's release pops the waiter; a hand-over always marks the new
    // owner (more may stand behind it), so its release looks once more.
    assert_eq!(server.command_calls("lpop"), 2);
    assert_eq!(
        server.command_calls("publish"),
        1,
        "one notice: the hand-over"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_are_loaded_again_when_the_server_forgets_them() {
    let server = RedisServer::start();
    let client = client(&server).await;
    // Acquire, renew and release, each right after a SCRIPT FLUSH.
    assert_eq!(server.cli(&["SCRIPT", "FLUSH"]), "OK");
    let guard = client.lock("k").ttl(ms(150)).acquire().await.unwrap();
    assert_eq!(server.cli(&["SCRIPT", "FLUSH"]), "OK");
    tokio::time::sleep(ms(400)).await;
    assert!(!guard.is_lost(), "renewal failed after SCRIPT FLUSH");
    assert_eq!(server.cli(&["SCRIPT", "FLUSH"]), "OK");
    guard.release().await.expect("release after SCRIPT FLUSH");
    assert!(server.command_calls("evalsha") >= 3);
    // The hot path is EVALSHA; after NOSCRIPT the script is loaded again
    // (SCRIPT LOAD), never sent in full with EVAL.
    assert_eq!(server.command_calls("eval"), 0);
    assert!(
        server.command_calls("script|load") >= 4,
        "{}",
        server.cli(&["INFO", "commandstats"])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_one_client_share_one_subscriber_connection() {
    let server = RedisServer::start();
    let (holder_client, waiter_client) = two_clients(&server).await;
    let keys: Vec<String> = (0..4).map(|i| format!("shared:{i}")).collect();
    let mut holders = Vec::new();
    for k in &keys {
        holders.push(holder_client.lock(k).ttl(secs(10)).acquire().await.unwrap());
    }
    let waiters: Vec<_> = (0..20)
        .map(|i| {
            let (client, key) = (waiter_client.clone(), keys[i % 4].clone());
            tokio::spawn(async move {
                let guard = client.lock(&key).wait(secs(10)).acquire().await.unwrap();
                guard.release().await.unwrap();
            })
        })
        .collect();
    eventually(secs(3), "every key's channel is subscribed", || {
        keys.iter().all(|k| {
            last_number(&server.cli(&["PUBSUB", "NUMSUB", &format!("lock:N{{{k}}}")])) == 1
        })
    })
    .await;
    let pubsub = server.cli(&["CLIENT", "LIST", "TYPE", "pubsub"]);
    assert_eq!(pubsub.lines().count(), 1, "{pubsub}");
    for holder in holders {
        holder.release().await.unwrap();
    }
    for waiter in waiters {
        within(secs(5), "the waiters", waiter).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentrancy_is_per_client_and_task_so_another_client_in_the_same_task_waits() {
    let server = RedisServer::start();
    let (first, second) = two_clients(&server).await;
    first
        .with_lock("shared", async {
            let err = second.lock("shared").acquire().await.unwrap_err();
            assert!(err.is_busy(), "{err:?}");
        })
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_protected_server_works_with_the_right_password_only() {
    let server = RedisServer::start_with(&["--requirepass", "s3cret pw"]);
    let base = format!("127.0.0.1:{}", server.port);

    let right = redis_url_client(format!("redis://:s3cret%20pw@{base}"))
        .await
        .expect("the right password");
    let other = redis_url_client(format!("redis://default:s3cret%20pw@{base}"))
        .await
        .expect("the right password with the default user");
    // Scripts, renewals and the notice subscriber all authenticate.
    let guard = right.lock("k").ttl(ms(150)).acquire().await.unwrap();
    tokio::time::sleep(ms(400)).await;
    assert!(!guard.is_lost());
    guard.release().await.unwrap();
    let latency = handoff(&right, &other, "k").await;
    println!("handoff with a password: {latency:?}");
    assert!(latency < ms(500), "the waiter woke only after {latency:?}");

    let started = Instant::now();
    let without = redis_url_client(format!("redis://{base}"))
        .await
        .unwrap_err();
    let without_text = test_support::error_chain(&without);
    println!("without a password: {without_text}");
    assert!(without.is_backend(), "{without:?}");
    assert!(
        without_text.to_lowercase().contains("auth"),
        "{without_text}"
    );
    let wrong = redis_url_client(format!("redis://:wrong@{base}"))
        .await
        .unwrap_err();
    assert!(wrong.is_backend(), "{wrong:?}");
    let text = test_support::error_chain(&wrong).to_lowercase();
    println!("with a wrong password: {text}");
    assert!(text.contains("auth") || text.contains("password"), "{text}");
    assert!(
        !format!("{wrong:?} {text}").contains("wrong@"),
        "the URL leaked into {wrong:?}"
    );
    assert!(started.elapsed() < secs(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_limited_to_the_lock_keys_channels_and_commands_works() {
    let server = RedisServer::start();
    assert_eq!(server.cli(&acl_locker()), "OK");
    let url = format!("redis://locker:locker-pw@127.0.0.1:{}", server.port);
    let a = redis_url_client(&url).await.expect("ACL user");
    let b = redis_url_client(&url).await.expect("ACL user");

    let guard = a.lock("k").ttl(ms(150)).acquire().await.unwrap();
    assert_eq!(server.cli(&["SCRIPT", "FLUSH"]), "OK"); // reload as the ACL user
    tokio::time::sleep(ms(400)).await;
    assert!(!guard.is_lost(), "renewal as the ACL user failed");
    assert!(b.lock("k").acquire().await.unwrap_err().is_busy());
    guard.release().await.unwrap();
    let mut latencies = Vec::new();
    for _ in 0..5 {
        latencies.push(handoff(&a, &b, "k").await);
    }
    let (median, max) = summary(latencies);
    println!("handoffs as an ACL user: median {median:?}, max {max:?}");
    assert!(
        median < ms(100),
        "waiters woke after {median:?}: notices do not arrive"
    );
    // A local hand-over between two tasks of one client (reserve.lua).
    let first = a.lock("chain").wait(secs(5)).acquire().await.unwrap();
    let second = {
        let a = a.clone();
        tokio::spawn(async move { a.lock("chain").wait(secs(5)).acquire().await })
    };
    tokio::time::sleep(ms(50)).await;
    first.release().await.unwrap();
    within(secs(5), "the hand-over", second)
        .await
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
    assert!(
        server.command_calls("incrby") >= 1,
        "no block reserved as the ACL user"
    );
    // A read-write lock and a semaphore, with a hand-over each (shared.lua).
    let reader = a.rw_lock("rw").read().acquire().await.unwrap();
    let writer = {
        let b = b.clone();
        tokio::spawn(async move { b.rw_lock("rw").write().wait(secs(5)).acquire().await })
    };
    tokio::time::sleep(ms(50)).await;
    reader.release().await.unwrap();
    let writer = within(secs(1), "the writer", writer)
        .await
        .unwrap()
        .unwrap();
    let permit = a.semaphore("sem", 1).ttl(ms(150)).acquire().await.unwrap();
    tokio::time::sleep(ms(400)).await;
    assert!(
        !permit.is_lost(),
        "a permit's renewal as the ACL user failed"
    );
    let next = {
        let b = b.clone();
        tokio::spawn(async move { b.semaphore("sem", 1).wait(secs(5)).acquire().await })
    };
    tokio::time::sleep(ms(50)).await;
    permit.release().await.unwrap();
    let next = within(secs(1), "the next permit", next)
        .await
        .unwrap()
        .unwrap();
    writer.release().await.unwrap();
    next.release().await.unwrap();
    let denied = server.cli(&["ACL", "LOG"]);
    assert!(
        denied.is_empty(),
        "the ACL user was refused something:\n{denied}"
    );

    // Outside its keys the same user gets a clear error, not a hang or a panic.
    let elsewhere = LockClient::builder()
        .redis(&url)
        .key_prefix("other:")
        .build()
        .await
        .unwrap();
    let err = elsewhere.lock("k").acquire().await.unwrap_err();
    println!("ACL user outside its keys: {err}");
    assert!(err.is_backend(), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_without_channel_permission_gets_busy_in_time_without_flooding_the_server() {
    let server = RedisServer::start();
    let mut setuser: Vec<&str> = acl_locker();
    let at = setuser.iter().position(|a| *a == "&lock:*").unwrap();
    setuser.remove(at); // Redis 7's default for new users: no channels
    assert_eq!(server.cli(&setuser), "OK");
    let url = format!("redis://locker:locker-pw@127.0.0.1:{}", server.port);
    let client = LockClient::builder().redis(&url).build().await.unwrap();
    let holder = client.lock("k").ttl(secs(10)).acquire().await.unwrap();
    let connections = connections_received(&server);
    let started = Instant::now();
    let waited = tokio::time::timeout(secs(3), client.lock("k").wait(ms(500)).acquire()).await;
    let took = started.elapsed();
    let opened = connections_received(&server) - connections;
    println!("waiting without channel permission: {took:?}, {opened} connections opened");
    match waited {
        Ok(Err(e)) => assert!(e.is_busy() || e.is_backend(), "{e:?}"),
        Ok(Ok(_)) => panic!("got a held lock"),
        Err(_) => panic!("wait(500ms) had not returned after 3 s"),
    }
    assert!(took < ms(1500), "wait(500ms) returned after {took:?}");
    // Connections counted while the notifier may still be retrying.
    tokio::time::sleep(ms(500)).await;
    let opened = connections_received(&server) - connections;
    assert!(opened < 20, "{opened} connections in one second");
    holder.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_resubscribe_after_the_pubsub_connection_is_killed_and_still_wake_promptly() {
    let server = RedisServer::start();
    let (holder_client, waiter_client) = two_clients(&server).await;
    let numsub =
        |k: &str| last_number(&server.cli(&["PUBSUB", "NUMSUB", &format!("lock:N{{{k}}}")]));

    // A waiter is waiting when the subscriber connection is killed.
    let holder = holder_client
        .lock("a")
        .ttl(secs(10))
        .acquire()
        .await
        .unwrap();
    let waiter = spawn_waiter(&waiter_client, "a", secs(8));
    eventually(secs(3), "subscribed", || numsub("a") == 1).await;
    let killed = Instant::now();
    assert_eq!(server.cli(&["CLIENT", "KILL", "TYPE", "pubsub"]), "1");
    let back = eventually(secs(3), "subscribed again", || numsub("a") == 1).await;
    println!("re-subscribed {back:?} after CLIENT KILL TYPE pubsub");
    tokio::time::sleep(ms(50)).await;
    let latency = release_to_waiter(holder, waiter, secs(8)).await;
    println!(
        "a waiter woke {latency:?} after a release that followed the kill ({:?} in all)",
        killed.elapsed()
    );
    // The holder's lease was 10 s: only the notice can explain a prompt wake-up.
    assert!(latency < ms(500), "woke after {latency:?}");

    // Killed while nobody waits: a later waiter subscribes again.
    assert_eq!(server.cli(&["CLIENT", "KILL", "TYPE", "pubsub"]), "1");
    tokio::time::sleep(ms(100)).await;
    let latency = handoff(&holder_client, &waiter_client, "b").await;
    println!("a new waiter after a second kill woke {latency:?} after the release");
    assert!(latency < ms(500), "woke after {latency:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_on_a_foreign_key_without_expiry_does_not_spin() {
    let server = RedisServer::start();
    let client = client(&server).await;
    // Someone wrote the lock key without a TTL (by hand, or an old tool).
    assert_eq!(server.cli(&["SET", "lock:L{foreign}", "not-a-token"]), "OK");
    let before = server.command_calls("evalsha");
    let err = client
        .lock("foreign")
        .wait(ms(500))
        .acquire()
        .await
        .unwrap_err();
    let tries = server.command_calls("evalsha") - before;
    println!("a 500 ms wait on a key without expiry made {tries} attempts: {err}");
    assert!(err.is_busy(), "{err:?}");
    assert!(tries < 100, "{tries} attempts in 500 ms: the waiter polls");
}

/// What stays in Redis does not grow with the number of lock names: after
/// 20,000 distinct names were locked and released (some by dropping their
/// guard), only fencing counters remain, at most one per hash slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_thousand_names_leave_at_most_one_counter_per_hash_slot() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let names = 20_000u32;
    let tasks: Vec<_> = (0..16u32)
        .map(|t| {
            let client = client.clone();
            tokio::spawn(async move {
                let mut last = std::collections::HashMap::new();
                for i in (t..names).step_by(16) {
                    let key = format!("order:{i}");
                    let guard = client.lock(&key).acquire().await.unwrap();
                    last.insert(key.clone(), guard.fencing_token().await.unwrap());
                    if i % 1000 == 0 {
                        // Dropped: released in the background.
                        drop(guard);
                    } else {
                        guard.release().await.unwrap();
                    }
                }
                last.len()
            })
        })
        .collect();
    let mut locked = 0;
    for task in tasks {
        locked += task.await.unwrap();
    }
    assert_eq!(locked, names as usize);
    // The dropped guards' releases run in the background.
    let only_counters = || {
        server
            .cli(&["KEYS", "lock:*"])
            .lines()
            .all(|k| k.starts_with("lock:S{") || k.starts_with("lock:C{"))
    };
    eventually(secs(5), "only slot counters left", only_counters).await;
    let left: Vec<String> = server
        .cli(&["KEYS", "lock:*"])
        .lines()
        .filter(|k| !k.starts_with("lock:C{")) // the client's label
        .map(String::from)
        .collect();
    println!(
        "{names} names locked and released: {} keys left, all slot counters",
        left.len()
    );
    assert!(left.len() <= 16_384, "{} keys left", left.len());
    // Tokens keep increasing per key, on the shared counters.
    let key = "order:7";
    let before = client.lock(key).acquire().await.unwrap();
    let t = before.fencing_token().await.unwrap();
    before.release().await.unwrap();
    assert!(
        client
            .lock(key)
            .acquire()
            .await
            .unwrap()
            .fencing_token()
            .await
            .unwrap()
            > t
    );
}
