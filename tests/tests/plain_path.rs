//! The uncontended lock in plain commands, on a real server: a `SET NX PX`
//! to acquire, the server's compare-and-delete (`DELIFEQ` or `DELEX` where
//! it has one, a minimal script where not) to release, and a fencing token minted only
//! when asked for, by a step that checks the lock is still ours. And what
//! keeps that safe: while a line of waiters exists, the lock key exists
//! (pinned past its owner's lease), so a plain `SET NX` never overtakes it.
//!
//! Runs on the server `test_support` starts (`LOCK_TEST_SERVER`: Redis 7,
//! Redis 8 or Valkey 9); the release's command depends on which.

use lock_runtime::__private::testing::{lock_names, native_release};
use lock_runtime::{LockClient, LockError};
use test_support::RedisServer;
use test_support::helpers::*;

/// `INFO commandstats` call counts of `command` (lowercase), 0 if never called.
fn calls(server: &RedisServer, command: &str) -> u64 {
    let stats = server.cli(&["INFO", "commandstats"]);
    let prefix = format!("cmdstat_{command}:calls=");
    stats
        .lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn counter(server: &RedisServer, key: &str) -> u64 {
    server.cli(&["GET", &fence_name(key)]).parse().unwrap_or(0)
}

#[tokio::test]
async fn an_uncontended_pair_sends_one_set_and_one_compare_and_delete() {
    let server = RedisServer::start();
    let client = redis_client(&server).await;
    let key = key("plain-pair");
    // Warm up: the connection's own set-up commands are not counted below.
    client
        .lock(&key)
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let (native, deletes) = checked_native_release(&client, &server);
    let (set, evalsha, deleted, incr) = (
        calls(&server, "set"),
        calls(&server, "evalsha"),
        calls(&server, &deletes),
        calls(&server, "incr"),
    );
    const PAIRS: u64 = 50;
    for _ in 0..PAIRS {
        let guard = client.lock(&key).acquire().await.unwrap();
        guard.release().await.unwrap();
    }
    let sets = calls(&server, "set") - set;
    let scripts = calls(&server, "evalsha") - evalsha;
    let native_releases = calls(&server, &deletes) - deleted;
    println!("native: {native:?}; {sets} SET, {scripts} EVALSHA, {native_releases} {deletes}");
    assert_eq!(sets, PAIRS, "one plain SET per acquire");
    if native.is_some() {
        assert_eq!((scripts, native_releases), (0, PAIRS), "native releases");
    } else {
        assert_eq!(scripts, PAIRS, "one compare-and-delete script per release");
    }
    assert_eq!(calls(&server, "incr"), incr, "no token was asked for");
    assert_eq!(counter(&server, &key), 0, "the counter never moved");
}

#[tokio::test]
async fn a_token_is_minted_on_first_use_and_answered_from_then_on() {
    let server = RedisServer::start();
    let client = redis_client(&server).await;
    let key = key("plain-mint");
    let guard = client.lock(&key).acquire().await.unwrap();
    assert_eq!(counter(&server, &key), 0, "nothing minted at acquire");
    let token = guard.fencing_token().await.unwrap();
    assert_eq!(
        counter(&server, &key),
        token,
        "minted by the slot's counter"
    );
    assert_eq!(guard.fencing_token().await.unwrap(), token, "asked again");
    assert_eq!(counter(&server, &key), token, "the second ask sent nothing");
    guard.release().await.unwrap();
    let next = client.lock(&key).acquire().await.unwrap();
    assert!(next.fencing_token().await.unwrap() > token);
    next.release().await.unwrap();
}

#[tokio::test]
async fn a_holder_whose_lease_ended_gets_lost_and_never_a_token() {
    let server = RedisServer::start();
    let (a, b) = two_clients(&LockClient::builder().redis(server.url())).await;
    let key = key("plain-late-ask");
    // Paused past its lease before it asked for its token.
    let paused = a
        .lock(&key)
        .ttl(ms(150))
        .renew(false)
        .acquire()
        .await
        .unwrap();
    within(secs(2), "the lease ends", paused.lost()).await;
    let before = counter(&server, &key);
    let asked = paused.fencing_token().await;
    assert!(matches!(asked, Err(LockError::Lost { .. })), "{asked:?}");
    assert_eq!(
        counter(&server, &key),
        before,
        "no token for an ended lease"
    );
    // And once another holder took the key, still none: tokens rise in the
    // order holders held it.
    let next = b.lock(&key).acquire().await.unwrap();
    let token = next.fencing_token().await.unwrap();
    assert!(paused.fencing_token().await.unwrap_err().is_lost());
    assert_eq!(next.fencing_token().await.unwrap(), token);
    next.release().await.unwrap();
}

#[tokio::test]
async fn the_server_refuses_a_token_to_a_lease_it_no_longer_holds() {
    // The client's own deadline has not passed (long lease), but the key is
    // another owner's: an operator deleted it and someone else took it.
    let server = RedisServer::start();
    let (a, b) = two_clients(&LockClient::builder().redis(server.url())).await;
    let key = key("plain-stolen");
    let first = a.lock(&key).ttl(secs(30)).acquire().await.unwrap();
    lock_runtime::__private::testing::force_delete(&a, &key)
        .await
        .unwrap();
    let thief = b.lock(&key).acquire().await.unwrap();
    let asked = first.fencing_token().await;
    assert!(matches!(asked, Err(LockError::Lost { .. })), "{asked:?}");
    assert!(first.is_lost(), "a refused mint marks the guard lost");
    assert!(thief.fencing_token().await.unwrap() >= 1);
    thief.release().await.unwrap();
}

#[tokio::test]
async fn a_line_pins_the_key_past_its_owners_lease() {
    let server = RedisServer::start();
    let (holder, waiter) = two_clients(&LockClient::builder().redis(server.url())).await;
    let key = key("plain-pin");
    let (lock, queue) = lock_names("lock:", &key);
    let held = holder
        .lock(&key)
        .ttl(ms(800))
        .renew(false)
        .acquire()
        .await
        .unwrap();
    let waiting = {
        let (waiter, key) = (waiter.clone(), key.clone());
        tokio::spawn(async move { waiter.lock(&key).wait(secs(10)).acquire().await })
    };
    eventually(secs(5), "the waiter queues", || {
        server.cli(&["LLEN", &queue]) == "1"
    })
    .await;
    // Marked with the owner's deadline, and living until the waiter's wait
    // ends (about 10 s), far past the owner's 800 ms lease.
    let value = server.cli(&["GET", &lock]);
    assert!(value.contains('+'), "marked: {value}");
    let pttl: i64 = server.cli(&["PTTL", &lock]).parse().unwrap();
    assert!(pttl > 5_000, "pinned past the owner's lease: {pttl} ms");
    // The owner crashes: nobody releases. A newcomer's plain SET NX finds
    // the key taken, even after the owner's lease ended, and the line's
    // head gets the key.
    std::mem::forget(held);
    tokio::time::sleep(ms(900)).await;
    let newcomer = holder.lock(&key).acquire().await;
    let first = within(secs(5), "the waiter takes over", waiting)
        .await
        .unwrap()
        .expect("the waiter holds the key");
    assert!(
        matches!(newcomer, Err(LockError::Busy { .. })),
        "the newcomer passed the line: {newcomer:?}"
    );
    assert!(first.fencing_token().await.unwrap() >= 1);
    first.release().await.unwrap();
}

#[tokio::test]
async fn a_renewal_keeps_the_pin_and_moves_the_owners_deadline() {
    let server = RedisServer::start();
    let (holder, waiter) = two_clients(&LockClient::builder().redis(server.url())).await;
    let key = key("plain-renew");
    let (lock, queue) = lock_names("lock:", &key);
    let held = holder.lock(&key).ttl(ms(600)).acquire().await.unwrap();
    let waiting = {
        let (waiter, key) = (waiter.clone(), key.clone());
        tokio::spawn(async move { waiter.lock(&key).wait(secs(8)).acquire().await })
    };
    eventually(secs(5), "the waiter queues", || {
        server.cli(&["LLEN", &queue]) == "1"
    })
    .await;
    // Three leases' worth of renewals: the owner stays the owner.
    tokio::time::sleep(ms(1_800)).await;
    assert!(!held.is_lost(), "renewed while a line waits");
    let value = server.cli(&["GET", &lock]);
    assert!(value.contains('+'), "still marked: {value}");
    held.release().await.unwrap();
    let next = within(secs(3), "handed over", waiting)
        .await
        .unwrap()
        .unwrap();
    next.release().await.unwrap();
}

#[tokio::test]
async fn a_lock_waited_for_is_fenced_and_released_through_the_scripts() {
    let server = RedisServer::start();
    let (a, b) = two_clients(&LockClient::builder().redis(server.url())).await;
    let key = key("plain-contended");
    let first = a.lock(&key).acquire().await.unwrap();
    let first_token = first.fencing_token().await.unwrap();
    let waiting = {
        let (b, key) = (b.clone(), key.clone());
        tokio::spawn(async move {
            let guard = b.lock(&key).wait(secs(5)).acquire().await?;
            let token = guard.fencing_token().await?;
            guard.release().await.map(|()| token)
        })
    };
    tokio::time::sleep(ms(200)).await;
    // A marked value: the plain compare-and-delete deletes nothing, the
    // release script hands the key over.
    first.release().await.unwrap();
    let handed = within(secs(3), "the hand-over", waiting)
        .await
        .unwrap()
        .unwrap();
    assert!(handed > first_token, "{handed} after {first_token}");
    assert_eq!(server.cli(&["EXISTS", &lock_names("lock:", &key).0]), "0");
}

/// A server with a compare-and-delete of its own (`DELIFEQ`, `DELEX`)
/// behind an ACL (or a proxy) that refuses it: the first release falls back
/// to the compare-and-delete script, says so once, and no later release
/// sends the native command again.
#[tokio::test]
async fn a_refused_native_release_falls_back_to_the_script_once() {
    let server = RedisServer::start();
    let Some(native) = server.native_release() else {
        println!(
            "SKIPPED on this server (it has no DELIFEQ or DELEX): \
             a_refused_native_release_falls_back_to_the_script_once"
        );
        return;
    };
    let command = native.to_lowercase();
    let refuse = format!("-{command}");
    let created = server.cli(&[
        "ACL",
        "SETUSER",
        "nodel",
        "on",
        ">nodel-pw",
        "~lock:*",
        "&lock:*",
        "+@all",
        &refuse,
    ]);
    assert_eq!(created, "OK");
    let url = format!("redis://nodel:nodel-pw@127.0.0.1:{}", server.port);
    let client = redis_url_client(&url).await.expect("the ACL user connects");
    assert_eq!(native_release(&client), Some(native), "the probe found it");
    let key = key("plain-refused");
    for _ in 0..3 {
        let guard = client.lock(&key).acquire().await.unwrap();
        guard
            .release()
            .await
            .expect("released by the script after the refusal");
        assert_eq!(server.cli(&["EXISTS", &lock_names("lock:", &key).0]), "0");
    }
    assert_eq!(native_release(&client), None, "turned off for good");
    // One entry, counted once: one refusal.
    let denied = server.cli(&["ACL", "LOG"]);
    let lines: Vec<&str> = denied.lines().collect();
    assert_eq!(
        denied.matches(&format!("cmd={command}")).count(),
        1,
        "{denied}"
    );
    assert_eq!(lines.get(1), Some(&"1"), "one refusal only:\n{denied}");
}

/// A waiter wakes at the end of each of its holder's leases and sends its
/// attempt again. When that attempt reaches the server just after a release
/// handed the key to it, acquire.lua finds the key its own: it keeps it,
/// re-arms it to a full lease (not the hand-over's short one), and answers
/// a token minted then, above the hand-over's. It must mint: the same path
/// answers an owner whose plain `SET` took the key and whose reply was
/// lost, which has no token yet. Sent here by hand, in that order, so the
/// race the client meets now and then runs every time.
#[tokio::test]
async fn a_waiters_attempt_sent_after_its_hand_over_keeps_the_key_and_mints_above_it() {
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let acquire = redis::Script::new(include_str!("../../lock-runtime/scripts/acquire.lua"));
    let release = redis::Script::new(include_str!("../../lock-runtime/scripts/release.lua"));
    let ([lock, fence, queue, deadlines], notice) =
        lock_runtime::__private::testing::script_names("lock:", &key("plain-resent"));
    let (holder, waiter) = ("a".repeat(32), "b".repeat(32));
    let publish = format!("PUBLISH {notice}");
    let attempt = || {
        let mut call = acquire.prepare_invoke();
        call.key(&lock).key(&fence).key(&queue).key(&deadlines);
        call.arg(&waiter).arg(30_000).arg(&publish).arg(5_000);
        call
    };

    // The holder's plain acquire; the waiter queues behind it.
    let taken: Option<String> = redis::cmd("SET")
        .arg(&lock)
        .arg(&holder)
        .arg("NX")
        .arg("PX")
        .arg(30_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(taken.is_some());
    let (busy, _counter): (i64, u64) = attempt().invoke_async(&mut conn).await.unwrap();
    assert!(busy < 0, "the waiter queued: {busy}");

    // The release hands the key to the waiter, with a token.
    let (released, _next, handed): (i64, String, u64) = release
        .key(&lock)
        .key(&fence)
        .key(&queue)
        .key(&deadlines)
        .arg(&holder)
        .arg(&publish)
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(released, 1);
    assert!(
        server.cli(&["PTTL", &lock]).parse::<i64>().unwrap() <= 2_000,
        "a hand-over's lease is short until its new owner confirms"
    );

    // The waiter's timer round, just after: the key stays the waiter's,
    // at a full lease, and the token it answers is above the hand-over's.
    let resent: u64 = attempt().invoke_async(&mut conn).await.unwrap();
    assert!(resent > handed, "{resent} after the hand-over's {handed}");
    let value = server.cli(&["GET", &lock]);
    assert!(value.starts_with(&waiter), "still the waiter's: {value}");
    let pttl: i64 = server.cli(&["PTTL", &lock]).parse().unwrap();
    assert!(pttl > 25_000, "re-armed to a full lease: {pttl} ms");
    assert_eq!(server.cli(&["LLEN", &queue]), "0", "nobody left in line");
}

/// A plain release (the lock taken by a plain `SET`, so its release starts
/// with the compare-and-delete) sent while the server is stalled past the
/// response timeout, with a waiter of another client queued (its mark on
/// the key): the compare-and-delete runs when the server answers again and
/// deletes nothing (the key is marked), and release.lua, sent behind it on
/// the same connection, hands the key to the waiter then, not at the end
/// of the 30 s lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_stalled_past_its_timeout_hands_the_key_to_the_waiter_when_the_server_answers() {
    let server = RedisServer::start();
    let builder = LockClient::builder()
        .redis(server.url())
        .response_timeout(ms(300));
    let (holder, waiter) = (
        builder.clone().build().await.unwrap(),
        builder.build().await.unwrap(),
    );
    let key = key("stalled-release");
    // The scripts loaded and the connections open before the server stalls.
    lock_and_release(&holder, &key).await;
    let guard = holder.lock(&key).ttl(secs(30)).acquire().await.unwrap();
    let waiting = tokio::spawn({
        let key = key.clone();
        async move {
            let taken = waiter
                .lock(&key)
                .ttl(secs(30))
                .wait(secs(20))
                .acquire()
                .await;
            (std::time::Instant::now(), taken)
        }
    });
    within(secs(5), "the waiter queues", async {
        while holder.inspect(&key).await.unwrap().waiters == 0 {
            tokio::time::sleep(ms(10)).await;
        }
    })
    .await;
    server.pause().unwrap();
    let released = tokio::spawn(guard.release());
    tokio::time::sleep(ms(800)).await;
    let resumed = std::time::Instant::now();
    server.resume().unwrap();
    let (taken_at, taken) = within(secs(10), "the waiter is handed the key", waiting)
        .await
        .unwrap();
    let _taken = taken.expect("the waiter takes the key");
    let after = taken_at.duration_since(resumed);
    assert!(
        after < secs(2),
        "handed over {after:?} after the server answered"
    );
    // Unknown to the releaser: its answers never came.
    let released = released.await.unwrap();
    assert!(
        released.as_ref().is_err_and(|e| match e {
            LockError::Backend(b) => b.is_outcome_unknown(),
            _ => false,
        }),
        "{released:?}"
    );
}
