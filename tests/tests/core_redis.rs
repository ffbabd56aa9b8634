//! The runtime core against a real `redis-server`, for what only Redis has:
//! what the scripts leave on the server, the script cache, passwords and ACL
//! users, the shared pub/sub connection, and a server that is killed, paused
//! or restarted. (The semantics shared with `.memory()` are in `core.rs`.)

use std::time::{Duration, Instant};

use lock_runtime::__private::testing::fence_counter;
use lock_runtime::{LockClient, LockGuard};
use test_support::{ACL_LOCKER, RedisServer};

#[allow(unused_macros)]
#[macro_use]
#[path = "../src/core_support.rs"]
mod core_support;
use core_support::warnings_for;
use test_support::helpers::*;

async fn client(server: &RedisServer) -> LockClient {
    core_support::capture_warnings();
    default_redis_client(server).await
}

/// Two independent clients of `server`.
async fn two_clients(server: &RedisServer) -> (LockClient, LockClient) {
    (client(server).await, client(server).await)
}

/// Holds `key` with a lease of `ttl` for `after`, then does `event` to the
/// server: the guard, and how long after the event its `lost()` resolved
/// (`what` fails the test if not within 3 s).
async fn lost_after(
    server: &mut RedisServer,
    client: &LockClient,
    key: &str,
    ttl: Duration,
    after: Duration,
    what: &str,
    event: impl FnOnce(&mut RedisServer),
) -> (LockGuard, Duration) {
    let guard = client.lock(key).ttl(ttl).acquire().await.unwrap();
    let lost = guard.lost();
    tokio::time::sleep(after).await;
    let at = Instant::now();
    event(server);
    within(secs(3), what, lost).await;
    (guard, at.elapsed())
}

/// The last line of a `redis-cli` answer as a number (`PUBSUB NUMSUB`, `EXISTS`, ...).
fn last_number(answer: &str) -> i64 {
    answer
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("not a number: {answer:?}"))
}

/// How many times the server ran `command` (from `INFO commandstats`).
fn calls(server: &RedisServer, command: &str) -> u64 {
    let stats = server.cli(&["INFO", "commandstats"]);
    let prefix = format!("cmdstat_{command}:calls=");
    stats
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

fn connections_received(server: &RedisServer) -> u64 {
    let stats = server.cli(&["INFO", "stats"]);
    stats
        .lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .map(|n| n.trim().parse().unwrap())
        .expect("INFO stats")
}

/// One handoff: `holder_client` holds `key` with a long lease, a task of
/// `waiter_client` waits for it, the holder releases. Returns release -> acquired.
async fn handoff(holder_client: &LockClient, waiter_client: &LockClient, key: &str) -> Duration {
    let holder = holder_client
        .lock(key)
        .ttl(secs(10))
        .acquire()
        .await
        .unwrap();
    let waiter = spawn_waiter(waiter_client, key, secs(5));
    tokio::time::sleep(ms(100)).await;
    release_to_waiter(holder, waiter, secs(6)).await
}

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
        let mut keys: Vec<String> = server
            .cli(&["KEYS", "*"])
            .lines()
            .filter(|k| !k.starts_with("lock:C{")) // the client's label
            .map(String::from)
            .collect();
        keys.sort();
        // The lock, and its slot's fencing counter.
        assert_eq!(keys, ["lock:L{order:42}", fence.as_str()]);
        let token = server.cli(&["GET", "lock:L{order:42}"]);
        // 128 random bits, then the client's id and the time it was drawn.
        let random = token.split('.').next().unwrap();
        assert_eq!(random.len(), 32, "{token:?}");
        assert!(random.chars().all(|c| c.is_ascii_hexdigit()), "{token:?}");
        tokens.push(token);
        let pttl = last_number(&server.cli(&["PTTL", "lock:L{order:42}"]));
        assert!(pttl > 9_000 && pttl <= 10_000, "PTTL {pttl}");
        assert_eq!(server.cli(&["GET", &fence]), round.to_string());
        assert_eq!(guard.fencing_token(), round);
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
    assert_eq!(guard.fencing_token(), 1);
    assert_eq!(last_number(&server.cli(&["EXISTS", "app:L{order:42}"])), 1);
    guard.release().await.unwrap();
}

/// The hot path stays cheap: with nobody queued, a release neither looks at
/// the queue nor publishes; a waiter that queues marks the holder's value
/// (`token+`), and only then does the release pop the queue and hand over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_touches_the_queue_and_publishes_only_when_somebody_queued() {
    let server = RedisServer::start();
    let client = client(&server).await;
    server.cli(&["CONFIG", "RESETSTAT"]);
    for _ in 0..20 {
        lock_and_release(&client, "calm").await;
    }
    assert_eq!(calls(&server, "evalsha"), 40);
    for command in ["lpop", "lpos", "rpush", "publish"] {
        assert_eq!(
            calls(&server, command),
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
            let fencing = guard.fencing_token();
            guard.release().await.unwrap();
            fencing
        })
    };
    eventually(secs(5), "the waiter queued", || {
        last_number(&server.cli(&["LLEN", "lock:Q{busy}"])) == 1
    })
    .await;
    assert_eq!(server.cli(&["GET", "lock:L{busy}"]), format!("{token}+"));
    let pttl = last_number(&server.cli(&["PTTL", "lock:L{busy}"]));
    assert!(pttl > 9_000, "marking kept the lease: PTTL {pttl}");
    holder.release().await.unwrap();
    assert_eq!(within(secs(5), "the waiter", waiter).await.unwrap(), 2);
    // The holder's release pops the waiter; a hand-over always marks the new
    // owner (more may stand behind it), so its release looks once more.
    assert_eq!(calls(&server, "lpop"), 2);
    assert_eq!(calls(&server, "publish"), 1, "one notice: the hand-over");
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
    assert!(calls(&server, "evalsha") >= 3);
    // The hot path is EVALSHA; after NOSCRIPT the script is loaded again
    // (SCRIPT LOAD), never sent in full with EVAL.
    assert_eq!(calls(&server, "eval"), 0);
    assert!(
        calls(&server, "script|load") >= 4,
        "{}",
        server.cli(&["INFO", "commandstats"])
    );
}

#[tokio::test(flavor = "current_thread")]
async fn dropping_a_guard_never_blocks_even_when_the_server_hangs() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let guard = client.lock("k").ttl(ms(500)).acquire().await.unwrap();
    server.pause().unwrap();
    let started = Instant::now();
    drop(guard);
    let took = started.elapsed();
    server.resume().unwrap();
    assert!(took < ms(20), "drop took {took:?} on a paused server");
    // The background release still happens once the server answers.
    let next = client.lock("k").wait(secs(2)).acquire().await.unwrap();
    next.release().await.unwrap();
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
async fn a_forgotten_renewing_guard_is_renewed_until_its_process_dies_then_the_key_frees_within_its_ttl()
 {
    let server = RedisServer::start();
    let observer = client(&server).await;
    // Another "process": its own runtime and client. It leaks a renewing guard,
    // drops every handle on the client, lives on for a while, then dies.
    let url = server.url();
    let (locked_tx, locked_rx) = tokio::sync::oneshot::channel();
    let process = std::thread::spawn(move || {
        let runtime = one_worker_runtime();
        runtime.block_on(async move {
            let client = redis_url_client(url).await.unwrap();
            let clone = client.clone();
            let guard = client.lock("leaked").ttl(ms(300)).acquire().await.unwrap();
            std::mem::forget(guard);
            drop((client, clone));
            let _ = locked_tx.send(());
            tokio::time::sleep(ms(800)).await;
        });
        runtime.shutdown_background();
        Instant::now()
    });
    locked_rx.await.unwrap();
    // Documented: a leaked guard keeps its client, and its renewals, alive.
    tokio::time::sleep(ms(600)).await;
    assert!(
        is_held(&observer, "leaked").await,
        "the leaked lease was not renewed"
    );
    let died = tokio::task::spawn_blocking(move || process.join().unwrap())
        .await
        .unwrap();
    let guard = within(
        secs(4),
        "the leaked lease runs out",
        observer.lock("leaked").wait(secs(3)).acquire(),
    )
    .await
    .expect("free once its process is gone");
    let at = died.elapsed();
    println!("a leaked renewing 300 ms lease was free {at:?} after its process died");
    assert!(at < ms(1500), "free only after {at:?}");
    guard.release().await.unwrap();
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
    assert_eq!(server.cli(ACL_LOCKER), "OK");
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
        calls(&server, "incrby") >= 1,
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
    let mut setuser: Vec<&str> = ACL_LOCKER.to_vec();
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
async fn a_killed_server_makes_lost_resolve_within_about_the_ttl() {
    let mut server = RedisServer::start();
    let client = client(&server).await;
    let key = key("killed");
    let what = "lost() after the server died";
    let (guard, took) = lost_after(&mut server, &client, &key, ms(300), ms(150), what, |s| {
        s.kill()
    })
    .await;
    println!("lost() resolved {took:?} after redis-server was killed (ttl 300 ms)");
    // At most one lease after the last confirmed renewal.
    assert!(took < ms(1500), "lost after {took:?}");
    assert!(
        !warnings_for(&key).is_empty(),
        "no warning for the lost lock"
    );
    let err = guard.release().await.unwrap_err();
    assert!(err.is_backend() || err.is_lost(), "{err:?}");
    // With the server gone, acquiring is an error, not a hang or a panic.
    let started = Instant::now();
    let err = client.lock(&key).acquire().await.unwrap_err();
    assert!(err.is_backend(), "{err:?}");
    assert!(
        err.is_connection(),
        "a dead server is a connection error: {err:?}"
    );
    assert!(started.elapsed() < secs(3), "{:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_is_usable_again_by_old_and_new_clients() {
    let mut server = RedisServer::start();
    let old = client(&server).await;
    lock_and_release(&old, "k").await;
    // Subscribe the old client's notifier before the restart.
    let _ = handoff(&old, &old, "warm").await;
    server.restart().unwrap(); // no persistence: keys and scripts are gone
    let restarted = Instant::now();
    let guard = loop {
        match old.lock("k").acquire().await {
            Ok(guard) => break guard,
            Err(e) => {
                assert!(e.is_backend(), "{e:?}");
                assert!(restarted.elapsed() < secs(10), "still failing: {e}");
                tokio::time::sleep(ms(20)).await;
            }
        }
    };
    println!(
        "the old client locked again {:?} after the restart (fencing token {}: the counter did not survive, no persistence)",
        restarted.elapsed(),
        guard.fencing_token()
    );
    guard.release().await.unwrap();
    let new = client(&server).await;
    let latency = handoff(&new, &old, "k").await;
    println!("after the restart, the old client's waiter woke {latency:?} after the release");
    assert!(latency < ms(500), "woke after {latency:?}");
    let latency = handoff(&old, &new, "k").await;
    assert!(latency < ms(500), "woke after {latency:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_server_makes_lost_resolve_within_about_the_ttl_and_the_stale_release_is_lost() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let guard = client.lock("paused").ttl(ms(300)).acquire().await.unwrap();
    let lost = guard.lost();
    tokio::time::sleep(ms(150)).await;
    let paused = Instant::now();
    server.pause().unwrap();
    within(secs(3), "lost() while the server is paused", lost).await;
    let took = paused.elapsed();
    // Let the lease run out on the server's clock too, then resume.
    tokio::time::sleep(ms(200)).await;
    server.resume().unwrap();
    println!("lost() resolved {took:?} after redis-server was paused (ttl 300 ms)");
    assert!(took < ms(1500), "lost after {took:?}");
    let err = guard.release().await.unwrap_err();
    assert!(err.is_lost(), "{err:?}");
    let next = client.lock("paused").wait(secs(2)).acquire().await.unwrap();
    assert!(next.fencing_token() == 2);
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_that_timed_out_on_a_paused_server_leaves_no_lock_once_it_resumes() {
    let server = RedisServer::start();
    let observer = client(&server).await;
    let client = LockClient::builder()
        .redis(server.url())
        .response_timeout(ms(200))
        .build()
        .await
        .unwrap();
    server.pause().unwrap();
    let started = Instant::now();
    let err = client
        .lock("ghost")
        .ttl(secs(30))
        .acquire()
        .await
        .unwrap_err();
    println!(
        "acquire on a paused server: {err} after {:?}",
        started.elapsed()
    );
    assert!(err.is_backend(), "{err:?}");
    tokio::time::sleep(ms(300)).await;
    server.resume().unwrap();
    // The request sat in the server's socket buffer and ran on resume; the
    // clean-up release must follow it, or the key stays locked for 30 s.
    let started = Instant::now();
    let guard = observer.lock("ghost").wait(secs(3)).acquire().await;
    println!(
        "after resume the key was {} after {:?}",
        if guard.is_ok() { "free" } else { "still held" },
        started.elapsed()
    );
    guard
        .expect("no ghost lock is left behind")
        .release()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_on_a_foreign_key_without_expiry_does_not_spin() {
    let server = RedisServer::start();
    let client = client(&server).await;
    // Someone wrote the lock key without a TTL (by hand, or an old tool).
    assert_eq!(server.cli(&["SET", "lock:L{foreign}", "not-a-token"]), "OK");
    let before = calls(&server, "evalsha");
    let err = client
        .lock("foreign")
        .wait(ms(500))
        .acquire()
        .await
        .unwrap_err();
    let tries = calls(&server, "evalsha") - before;
    println!("a 500 ms wait on a key without expiry made {tries} attempts: {err}");
    assert!(err.is_busy(), "{err:?}");
    assert!(tries < 100, "{tries} attempts in 500 ms: the waiter polls");
}

/// Takes a lock with a client of its own and returns only the guard: the
/// client (every clone of it) is gone when this returns.
async fn lock_with_a_temporary_client(
    url: &str,
    key: &str,
    ttl: Duration,
) -> lock_runtime::LockGuard {
    let client = redis_url_client(url).await.unwrap();
    client.lock(key).ttl(ttl).acquire().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_that_outlives_its_client_says_when_its_lease_is_gone() {
    let server = RedisServer::start();
    let observer = client(&server).await;
    let guard = lock_with_a_temporary_client(&server.url(), "orphan", ms(300)).await;
    let lost = guard.lost();
    // Either the lease is kept (the guard keeps what it needs alive) ...
    let taken =
        tokio::time::timeout(secs(5), observer.lock("orphan").wait(secs(2)).acquire()).await;
    match taken {
        Ok(Ok(next)) => {
            // ... or, once another holder has it, the guard must know.
            println!(
                "the orphaned guard's lease ran out; is_lost() = {}",
                guard.is_lost()
            );
            assert!(
                tokio::time::timeout(ms(100), lost).await.is_ok(),
                "another client holds the lock while the orphaned guard's lost() is pending"
            );
            let err = guard.release().await.unwrap_err();
            assert!(err.is_lost(), "{err:?}");
            next.release().await.unwrap();
        }
        Ok(Err(e)) => {
            assert!(e.is_busy(), "{e:?}");
            assert!(!guard.is_lost());
            guard.release().await.expect("the guard still owns it");
        }
        Err(_) => panic!("the probe hung"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_of_a_crashed_process_does_not_keep_a_live_waiter_from_the_lock() {
    let server = RedisServer::start();
    let (holder_client, live_client) = two_clients(&server).await;
    let holder = holder_client
        .lock("k")
        .ttl(secs(30))
        .acquire()
        .await
        .unwrap();
    // Another "process": its own runtime and client, with one waiter. The
    // runtime is then shut down without running any clean-up, like a crash.
    let url = server.url();
    std::thread::spawn(move || {
        let runtime = one_worker_runtime();
        runtime.block_on(async move {
            let client = redis_url_client(url).await.unwrap();
            tokio::spawn(async move {
                client
                    .lock("k")
                    .ttl(secs(30))
                    .wait(secs(60))
                    .acquire()
                    .await
            });
            tokio::time::sleep(ms(300)).await;
        });
        runtime.shutdown_background();
    })
    .join()
    .unwrap();
    // A live waiter arrives after it.
    let waiter = {
        let client = live_client.clone();
        tokio::spawn(async move {
            let guard = client.lock("k").ttl(secs(30)).wait(secs(8)).acquire().await;
            let at = Instant::now();
            guard.map(|_| at)
        })
    };
    tokio::time::sleep(ms(200)).await;
    let released = Instant::now();
    holder.release().await.unwrap();
    let outcome = within(secs(10), "the live waiter", waiter).await.unwrap();
    let took = outcome
        .as_ref()
        .map(|at| at.saturating_duration_since(released))
        .unwrap_or_else(|_| released.elapsed());
    println!(
        "with a crashed process's waiter queued first, the live waiter ended {took:?} after the release: {:?}",
        outcome.as_ref().map(|_| "got the lock")
    );
    assert!(outcome.is_ok(), "the live waiter gave up: {outcome:?}");
    assert!(
        took < secs(3),
        "the crashed waiter kept the lock for {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_that_loses_the_lock_tells_the_holder() {
    let mut server = RedisServer::start();
    let client = client(&server).await;
    let key = key("restart");
    // As after a failover to a replica that never saw the lock.
    let what = "the holder learns its lock is gone";
    let (guard, told) = lost_after(&mut server, &client, &key, ms(600), ms(100), what, |s| {
        s.restart().unwrap()
    })
    .await;
    println!("after a restart the holder knew its lock was gone {told:?} later");
    assert!(told < ms(1500), "the holder learned it only after {told:?}");
    assert!(guard.release().await.unwrap_err().is_lost());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_keeps_waiting_through_a_restart_and_gets_the_lock() {
    let mut server = RedisServer::start();
    let (holder_client, waiter_client) = two_clients(&server).await;
    let holder = holder_client
        .lock("k")
        .ttl(secs(10))
        .acquire()
        .await
        .unwrap();
    let waiter = tokio::spawn(async move {
        let guard = waiter_client
            .lock("k")
            .ttl(secs(10))
            .wait(secs(8))
            .acquire()
            .await;
        (Instant::now(), guard)
    });
    tokio::time::sleep(ms(200)).await;
    server.restart().unwrap(); // the holder's lock is gone with it
    let restarted = Instant::now();
    let (at, taken) = within(secs(9), "the waiter", waiter).await.unwrap();
    let taken = taken.expect("the waiter gets the lock after the restart");
    let took = at.saturating_duration_since(restarted);
    println!("after a restart the waiter held the lock {took:?} later");
    assert!(
        took < secs(3),
        "the waiter got the lock only after {took:?}"
    );
    taken.release().await.unwrap();
    drop(holder);
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
                    last.insert(key.clone(), guard.fencing_token());
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
    let t = before.fencing_token();
    before.release().await.unwrap();
    assert!(client.lock(key).acquire().await.unwrap().fencing_token() > t);
}
