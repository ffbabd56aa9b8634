//! Local hand-over (see local_handover.rs) when waiters give up, lease
//! settings differ, guards are dropped, the attribute re-enters, the server
//! is further away than a block lasts, or a holder is forgotten. Each test
//! starts its own server.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockError, distributed_lock};
use test_support::RedisServer;
use test_support::helpers::{eventually, is_held, ms, secs, within};

mod local_handover_common;
use local_handover_common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gives_up_leaves_the_line() {
    let (server, [client, other]) = server_and_clients().await;
    let key = "cancelled";
    let holder = in_line(&client, key).acquire().await.unwrap();
    // Dropped while waiting in line.
    let dropped = tokio::time::timeout(ms(100), in_line(&client, key).acquire()).await;
    assert!(dropped.is_err());
    // Timed out in line: `Busy` after its own wait, not the holder's.
    let started = Instant::now();
    let busy = client.lock(key).wait(ms(300)).acquire().await.unwrap_err();
    let waited = started.elapsed();
    assert!(busy.is_busy(), "{busy:?}");
    assert!(
        waited >= ms(290) && waited < ms(900),
        "busy after {waited:?} (wait 300 ms)"
    );
    // Nobody is left to hand on to: the release goes to the server and the
    // key is free at once.
    holder.release().await.unwrap();
    let reserved = Calls::of(&server).incrby;
    assert_eq!(reserved, 0, "reserved tokens for a gone waiter");
    let next = other.lock(key).acquire().await;
    next.expect("free after the release")
        .release()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_representative_that_gives_up_passes_its_role_to_the_next_in_line() {
    let (server, [client, other]) = server_and_clients().await;
    let key = "represented";
    let outside = other.lock(key).acquire().await.unwrap();
    // The first task queues on the server for the line, the second in line.
    let representative = spawn_entered(in_line(&client, key).acquire()).await;
    eventually(secs(2), "the representative queued", || {
        queued(&server, key) == 1
    })
    .await;
    let first_member = server.cli(&["LINDEX", &queue_name(key), "0"]);
    let next = spawn_entered(in_line(&client, key).acquire()).await;
    assert_eq!(queued(&server, key), 1, "not in line");
    representative.abort();
    assert!(representative.await.unwrap_err().is_cancelled());
    // The next task takes the role: it queues on the server in its place.
    eventually(secs(2), "the next task queued", || {
        let queue = server.cli(&["LRANGE", &queue_name(key), "0", "-1"]);
        queue.lines().count() == 1 && queue != first_member
    })
    .await;
    outside.release().await.unwrap();
    let next = acquired(secs(3), "the next task", next).await;
    next.release().await.unwrap();
    assert!(!is_held(&other, key).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_dropped_together_with_the_representative_does_not_strand_the_line() {
    let (_server, [client, other]) = server_and_clients().await;
    let key = "stranded";
    let outside = other.lock(key).acquire().await.unwrap();
    // One task's representative and waiter, dropped together (as a
    // `select!`, a `join!` under a timeout, or two tasks cancelled at the
    // same moment would): the representative goes first and passes its
    // role on to the waiter, which is dropped right after.
    let both = tokio::time::timeout(
        ms(200),
        futures_util::future::join(in_line(&client, key).acquire(), async {
            tokio::time::sleep(ms(50)).await;
            in_line(&client, key).acquire().await
        }),
    )
    .await;
    assert!(both.is_err());
    outside.release().await.unwrap();
    // The dropped waiters leave the line by background releases: one still
    // in flight as `outside` releases is handed the key, and gives it back
    // when it runs (seen once in CI under load).
    let free = async {
        while is_held(&other, key).await {
            tokio::time::sleep(ms(10)).await;
        }
    };
    // Well within the 2 s hand-over lease: a clean-up that never ran fails.
    within(ms(1500), "the key is free on the server", free).await;
    // Nobody of this client wants the key any more: the next task is the
    // line's representative and takes the free key.
    let next = client.lock(key).wait(secs(2)).acquire().await;
    let next = next.expect("the line is stranded: a role sent to a dropped waiter was lost");
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_that_give_up_at_random_never_stall_the_line() {
    let (_server, [client, other]) = server_and_clients().await;
    let key = "impatient";
    let section = Arc::new(Section::default());
    let until = Instant::now() + secs(1);
    let mut handles = Vec::new();
    for i in 0..16u64 {
        let (client, section) = (client.clone(), section.clone());
        handles.push(tokio::spawn(async move {
            let (mut granted, mut gave_up) = (0u32, 0u32);
            let mut n = i;
            while Instant::now() < until {
                // 0.2 .. 3 ms: often while in line, sometimes as the
                // representative queued behind the other client.
                n = n
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let patience = Duration::from_micros(200 + (n >> 33) % 2800);
                match tokio::time::timeout(patience, in_line(&client, key).acquire()).await {
                    Ok(guard) => {
                        let guard = guard.expect("acquire");
                        let stay = tokio::task::yield_now();
                        section
                            .occupy(0, guard.fencing_token().await.unwrap(), stay)
                            .await;
                        guard.release().await.expect("release");
                        granted += 1;
                    }
                    Err(_) => gave_up += 1,
                }
            }
            (granted, gave_up)
        }));
    }
    // Another client takes the key now and then: the line's representative
    // then waits on the server.
    let outside = {
        let (other, section) = (other.clone(), section.clone());
        tokio::spawn(async move {
            let mut granted = 0u32;
            while Instant::now() < until {
                let guard = in_line(&other, key).acquire().await.unwrap();
                let stay = tokio::time::sleep(ms(2));
                section
                    .occupy(1, guard.fencing_token().await.unwrap(), stay)
                    .await;
                guard.release().await.unwrap();
                granted += 1;
                tokio::time::sleep(ms(10)).await;
            }
            granted
        })
    };
    let (mut granted, mut gave_up) = (0, 0);
    for handle in handles {
        let (g, u) = within(secs(15), "an impatient task", handle).await.unwrap();
        granted += g;
        gave_up += u;
    }
    let outside = within(secs(15), "the other client", outside).await.unwrap();
    println!("{granted} grants, {gave_up} gave up, {outside} grants to the other client");
    assert_rising(&section.log());
    assert!(
        granted > 0 && gave_up > 0,
        "{granted} grants, {gave_up} gave up"
    );
    // Whatever the cancelled waiters left behind, the line still works ...
    let last = client.lock(key).wait(secs(3)).acquire();
    let last = within(secs(5), "an acquire after the storm", last).await;
    last.expect("the line stalled").release().await.unwrap();
    // ... and the key is free (guards sent to dropped waiters were released).
    assert!(
        freed_soon(&other, key).await,
        "the key stayed held after every task gave up or released"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_with_other_lease_settings_queues_on_the_server_and_is_served_first() {
    let (server, [client]) = server_and_clients().await;
    let key = "settings";
    let holder = in_line(&client, key).ttl(secs(10)).acquire().await.unwrap();
    let other_ttl = tokio::spawn(in_line(&client, key).ttl(secs(5)).acquire());
    eventually(secs(2), "the waiter with another ttl queued", || {
        queued(&server, key) == 1
    })
    .await;
    // Same settings: in line, not on the server.
    let same_ttl = spawn_entered(in_line(&client, key).ttl(secs(10)).acquire()).await;
    tokio::time::sleep(ms(100)).await; // time to queue on the server, were it to
    assert_eq!(queued(&server, key), 1);
    // The holder's chain yields to the waiter queued on the server.
    let holder_token = holder.fencing_token().await.unwrap();
    holder.release().await.unwrap();
    let other_ttl = acquired(secs(3), "the waiter on the server", other_ttl).await;
    assert!(other_ttl.fencing_token().await.unwrap() > holder_token);
    assert!(
        !same_ttl.is_finished(),
        "handed on past a waiter on the server"
    );
    let other_token = other_ttl.fencing_token().await.unwrap();
    other_ttl.release().await.unwrap();
    let same_ttl = acquired(secs(3), "the waiter in line", same_ttl).await;
    assert!(same_ttl.fencing_token().await.unwrap() > other_token);
    same_ttl.release().await.unwrap();
    assert_eq!(Calls::of(&server).incrby, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_guards_hand_on_too() {
    let (server, [client]) = server_and_clients().await;
    let key = "dropped";
    let section = Arc::new(Section::default());
    let shared = (client.clone(), section.clone());
    let until = Instant::now() + ms(700);
    let runs = steps_until(8, until, shared, move |_, (client, section)| async move {
        let guard = in_line(&client, key).acquire().await.unwrap();
        let stay = tokio::task::yield_now();
        section
            .occupy(0, guard.fencing_token().await.unwrap(), stay)
            .await;
        drop(guard);
    })
    .await;
    assert_rising(&section.log());
    assert_handed_on_in_process(&server, steps(&runs));
    // The last guard's background release frees the key.
    assert!(
        freed_soon(&client, key).await,
        "the key stayed held after the last guard was dropped"
    );
}

#[distributed_lock(key = "macro:<n>", client = client, wait = "10s")]
async fn locked_step(client: &LockClient, n: u32, section: &Section) -> Result<u64, LockError> {
    let token = lock_runtime::current_lock()
        .expect("inside the lock")
        .fencing_token()
        .await
        .unwrap();
    section.occupy(0, token, tokio::task::yield_now()).await;
    Ok(token)
}

/// The other half of [`run_and_the_attribute_re_enter_and_hand_on_in_a_chain`]:
/// `LockRequest::run` on `macro:1`, re-entered inside.
async fn run_step(client: &LockClient, section: Arc<Section>) {
    let inner = client.clone();
    in_line(client, "macro:1")
        .run(async move {
            let outer = lock_runtime::current_lock()
                .unwrap()
                .fencing_token()
                .await
                .unwrap();
            // Re-entry, not a place in the line (which would wait for
            // ourselves).
            let again = in_line(&inner, "macro:1").acquire();
            let again = within(secs(2), "re-entry", again).await.unwrap();
            assert!(again.is_reentrant());
            assert_eq!(again.fencing_token().await.unwrap(), outer);
            section.occupy(0, outer, tokio::task::yield_now()).await;
            again.release().await.unwrap();
        })
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_and_the_attribute_re_enter_and_hand_on_in_a_chain() {
    let (server, [client]) = server_and_clients().await;
    let section = Arc::new(Section::default());
    let shared = (client.clone(), section.clone());
    let until = Instant::now() + ms(700);
    let runs = steps_until(8, until, shared, |i, (client, section)| async move {
        if i % 2 == 0 {
            locked_step(&client, 1, &section).await.unwrap();
        } else {
            run_step(&client, section).await;
        }
    })
    .await;
    assert_rising(&section.log());
    assert_handed_on_in_process(&server, steps(&runs));
    assert!(!is_held(&client, "macro:1").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_further_away_than_a_block_lasts_still_gets_hand_overs() {
    let server = RedisServer::start();
    // 20 ms round trips: every reserved block is older than 5 ms on arrival.
    let port = slow_proxy(server.port, ms(10)).await;
    let client = test_support::helpers::redis_url_client(format!("redis://127.0.0.1:{port}"))
        .await
        .unwrap();
    let key = "far";
    let holder = in_line(&client, key).acquire().await.unwrap();
    let waiter = spawn_entered(in_line(&client, key).acquire()).await;
    let token = holder.fencing_token().await.unwrap();
    within(secs(3), "the release", holder.release())
        .await
        .unwrap();
    let next = acquired(secs(3), "the hand-over", waiter).await;
    assert!(next.fencing_token().await.unwrap() > token);
    let blocks = Calls::of(&server).incrby;
    assert!(
        blocks <= 2,
        "{blocks} blocks reserved for one hand-over (stale on arrival)"
    );
    next.release().await.unwrap();
    assert!(!is_held(&client, key).await);
    // A chain makes progress at one hand-over per reservation at least.
    let (grants, _) = hammer(&[&client], 4, "far:hot", ms(500)).await;
    assert!(grants[0] > 8, "{} grants in 500 ms", grants[0]);
}

/// A holder that never releases (its guard forgotten) and whose fixed lease
/// runs out leaves nothing to hand on: the task waiting in line goes to the
/// server when the loss is known, instead of waiting out its own wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forgotten_holder_whose_lease_ends_does_not_strand_its_line() {
    let (server, [client]) = server_and_clients().await;
    let key = "forgotten";
    let fixed = || client.lock(key).ttl(ms(300)).renew(false);
    // Timed from before the holder's request: its lease starts when the
    // server runs it, at this instant or later, so the waiter cannot take
    // the key earlier than 300 ms from here. (Timed after the acquire and
    // the fencing token's round trip, a loaded machine put up to 70 ms of
    // the lease before the clock started.)
    let started = Instant::now();
    let holder = fixed().acquire().await.unwrap();
    let first = holder.fencing_token().await.unwrap();
    let waiter = spawn_entered(fixed().wait(secs(10)).acquire()).await;
    std::mem::forget(holder);
    let next = acquired(secs(3), "the waiter in line", waiter).await;
    let took = started.elapsed();
    assert!(took >= ms(250), "taken after {took:?}, inside the lease");
    assert!(
        took < secs(2),
        "the line waited {took:?} for a forgotten holder"
    );
    assert!(next.fencing_token().await.unwrap() > first);
    assert_eq!(Calls::of(&server).incr, 2, "not acquired on the server");
    next.release().await.unwrap();
}

/// A holder that tried once starts no line (no entry per held key for
/// locks that rarely see a waiter of their own client): the first task of
/// the client that waits for it goes through the server, and the line forms
/// from its hold on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_tried_once_hands_over_through_the_server_then_the_line_forms() {
    let (server, [client]) = server_and_clients::<1>().await;
    let key = "tried-once";
    let holder = client.lock(key).acquire().await.unwrap();
    let second = spawn_entered(in_line(&client, key).acquire()).await;
    // The holder never asked for a token, and a busy attempt mints none.
    let before = Calls::of(&server);
    assert_eq!(
        before.incr, 0,
        "a token minted before the release: {before:?}"
    );
    holder.release().await.unwrap();
    let second = acquired(secs(3), "the waiter", second).await;
    let after_server = Calls::of(&server);
    // Handed over by the server: release.lua minted the waiter's token. The
    // waiter's look after registering may run after the hand-over on a busy
    // machine: it finds the key its own and mints once more (acquire.lua
    // cannot tell a hand-over from a plain SET of ours), so two.
    assert!(
        (1..=2).contains(&after_server.incr),
        "handed over by the server: {after_server:?}"
    );
    assert_eq!(after_server.incrby, 0, "{after_server:?}");
    // The waiter held with a wait: a third task now waits in its line.
    let third = spawn_entered(in_line(&client, key).acquire()).await;
    second.release().await.unwrap();
    let third = acquired(secs(3), "the third task", third).await;
    let in_process = Calls::of(&server);
    assert_eq!(
        in_process.incr, after_server.incr,
        "not through the server: {in_process:?}"
    );
    // A block reserved (and maybe the next one ahead, on a slow machine).
    assert!(in_process.incrby >= 1, "no block reserved: {in_process:?}");
    third.release().await.unwrap();
}
