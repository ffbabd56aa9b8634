//! Local hand-over on a real `redis-server`: the tasks of one client that want
//! one key form a line, one of them acquires on the server and the others are
//! handed the lease in-process (`lock_runtime`'s `client::local`). Each test
//! starts its own server; hot-key loops run for about a second and assert on
//! counts (grants, script calls, tokens), not on timing.

use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockError, LockGuard};
use test_support::RedisServer;
use test_support::helpers::{eventually, fence_name, is_held, lock_name, ms, secs, within};
use tokio::task::JoinHandle;

mod local_handover_common;
use local_handover_common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_of_one_client_hand_a_hot_key_on_in_process_one_at_a_time_with_rising_fences() {
    let (server, [client]) = server_and_clients().await;
    let (grants, log) = hammer(&[&client], 32, "hot", secs(1)).await;
    let grants = grants[0];
    assert!(grants > 100, "only {grants} grants in a second");
    let Calls { incr, incrby, .. } = assert_handed_on_in_process(&server, grants);
    // Every token came from the slot's counter: one INCR (acquire.lua) or
    // a block of 8 (reserve.lua's INCRBY) each.
    let counter = number(&server, &["GET", &fence_name("hot")]);
    assert!(log.last().unwrap().1 <= counter);
    assert!(
        grants <= incr + 8 * incrby,
        "{grants} grants, but only {incr} single tokens and {incrby} blocks"
    );
    // The last holder gave the key back to the server.
    assert!(!is_held(&client, "hot").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_local_handover_off_every_grant_goes_through_the_server() {
    let server = RedisServer::start();
    let client = server_only_client(&server).await;
    let (grants, _) = hammer(&[&client], 32, "hot", ms(500)).await;
    let grants = grants[0];
    let calls = Calls::of(&server);
    println!("{grants} grants: {calls:?}");
    assert!(grants > 20, "only {grants} grants");
    assert!(
        calls.evalsha >= grants,
        "{} EVALSHA for {grants} grants with local hand-over off",
        calls.evalsha
    );
    assert_eq!(calls.incrby, 0, "a block was reserved");
    assert!(!is_held(&client, "hot").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_chains_never_overlap_and_take_turns() {
    let (server, [a, b]) = server_and_clients().await;
    let (grants, log) = hammer(&[&a, &b], 32, "shared", secs(1)).await;
    let turns = log.windows(2).filter(|p| p[0].0 != p[1].0).count();
    let calls = Calls::of(&server);
    println!("grants per client {grants:?}, {turns} turns, {calls:?}");
    let (most, least) = (grants.iter().max().unwrap(), grants.iter().min().unwrap());
    assert!(*least > 0, "a client never got the key: {grants:?}");
    assert!(
        *most <= 2 * *least,
        "one client's chain starved the other: {grants:?}"
    );
    // Each turn is one chain: the lock went to the server between them.
    // (With the other client always queued, most chains are one grant
    // long: a run may reserve no block at all.)
    assert!(turns > 10, "only {turns} turns between the clients");
    assert!(!is_held(&a, "shared").await);
}

/// Acquires `key` as the line's representative (nobody else in line) and
/// spawns a task of the same client that waits in line behind it; returns
/// the guard and the waiter.
async fn holder_and_waiter(
    client: &LockClient,
    key: &str,
    ttl: Duration,
) -> (LockGuard, JoinHandle<Result<LockGuard, LockError>>) {
    let holder = in_line(client, key).ttl(ttl).acquire().await.unwrap();
    let waiter = spawn_entered(in_line(client, key).ttl(ttl).acquire()).await;
    (holder, waiter)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_on_lease_is_renewed_and_its_loss_reaches_the_holder_at_that_time() {
    let (server, [client, other]) = server_and_clients().await;
    let key = "renewed";
    let (first, second) = holder_and_waiter(&client, key, ms(600)).await;
    let first_token = first.fencing_token().await.unwrap();
    first.release().await.unwrap();
    let second = acquired(secs(2), "the hand-over", second).await;
    let second_token = second.fencing_token().await.unwrap();
    assert!(second_token > first_token);
    // In-process: no second acquisition on the server, one block reserved.
    let calls = Calls::of(&server);
    assert_eq!((calls.incr, calls.incrby), (1, 1), "{calls:?}");
    // The watchdog renews the lease for the new holder: held well past a ttl.
    tokio::time::sleep(ms(1500)).await;
    assert!(!second.is_lost());
    assert!(is_held(&other, key).await, "the handed-on lease ran out");
    // A third task waits in line; the key is deleted behind the holder's back.
    let third = spawn_entered(in_line(&client, key).ttl(ms(600)).acquire()).await;
    server.cli(&["DEL", &lock_name(key)]);
    within(secs(3), "the holder's lost()", second.lost()).await;
    // The next in line went back to the server: a token from the counter's
    // INCR, above the lost one, and the key held there in its name.
    let third = next_after_loss(&server, (second, second_token), third).await;
    assert!(!third.is_lost());
    assert!(
        is_held(&other, key).await,
        "the next holder's lease is not on the server"
    );
    third.release().await.unwrap();
    assert!(!is_held(&other, key).await);
}

/// Releases the `lost` guard, whose token was `lost_token` (it must say
/// `Lost`, and so must its token now) and takes the next holder from
/// `next`: a lease from the server (a plain `SET` goes out for it), never
/// the lost one handed on, with a token above it (unless its own lease
/// ended on arrival: then it gets no token at all).
async fn next_after_loss(
    server: &RedisServer,
    (lost, lost_token): (LockGuard, u64),
    next: JoinHandle<Result<LockGuard, LockError>>,
) -> LockGuard {
    let asked = lost.fencing_token().await;
    assert!(
        matches!(asked, Err(ref e) if e.is_lost()),
        "the token of a lost lease: {asked:?}"
    );
    let released = lost.release().await;
    assert!(
        matches!(released, Err(ref e) if e.is_lost()),
        "release of a lost lease: {released:?}"
    );
    let next = acquired(secs(5), "the next holder", next).await;
    match next.fencing_token().await {
        Ok(token) => assert!(token > lost_token, "{token} after {lost_token}"),
        Err(e) => assert!(e.is_lost() && next.is_lost(), "{e:?}"),
    }
    // The first holder's plain SET, then the next one's acquisition on
    // the server (a plain SET, or acquire.lua's SET NX); a hand-on within
    // the client sends none.
    let calls = Calls::of(server);
    assert!(calls.set >= 2, "not acquired on the server: {calls:?}");
    next
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_runs_out_in_a_chain_is_not_handed_on() {
    let (server, [client, other]) = server_and_clients().await;
    let key = "expires";
    let (first, second) = holder_and_waiter(&client, key, ms(300)).await;
    first.release().await.unwrap();
    let second = acquired(secs(2), "the hand-over", second).await;
    let lost_token = second.fencing_token().await.unwrap();
    let third = spawn_entered(in_line(&client, key).ttl(ms(300)).acquire()).await;
    // No renewal can be confirmed: the lease runs out on the server.
    server.pause().unwrap();
    let paused = Instant::now();
    within(secs(3), "the holder's lost()", second.lost()).await;
    let lost_after = paused.elapsed();
    tokio::time::sleep(ms(700).saturating_sub(paused.elapsed())).await;
    server.resume().unwrap();
    assert!(lost_after < ms(900), "lost() only after {lost_after:?}");
    // `third` may be done by now, but only from the server (asserted below:
    // its token comes from a second INCR): a lost lease is never handed on.
    // The line went back to the server as soon as the lease was lost: the
    // next in line acquired there (its request may have sat on the paused
    // server for longer than its own 300 ms lease, and then it is reported
    // lost on arrival, rightly: nothing confirmed it in time).
    let third = next_after_loss(&server, (second, lost_token), third).await;
    let _ = third.release().await;
    // Free for another client afterwards.
    let taken = other.lock(key).wait(secs(2)).acquire().await.unwrap();
    assert!(taken.fencing_token().await.unwrap() > lost_token);
    taken.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_whose_key_is_deleted_goes_back_to_the_server_within_a_block() {
    let (server, [client]) = server_and_clients().await;
    let key = "deleted";
    let run = tokio::spawn(async move { hammer_losing(&[&client], 8, key, ms(1500)).await });
    eventually(secs(5), "a chain running", || Calls::of(&server).incrby > 0).await;
    // The default lease (30 s) is not renewed within this test: only the
    // next reservation can tell the chain the key is gone.
    server.cli(&["DEL", &lock_name(key)]);
    eventually(secs(1), "the key held on the server again", || {
        number(&server, &["EXISTS", &lock_name(key)]) == 1
    })
    .await;
    // The holder when the chain found out may see `Lost`, as any holder of
    // a deleted key may. (The tokens rose: `hammer_losing` checks.)
    let (_, lost, _) = run.await.unwrap();
    assert!(lost <= 1, "{lost} releases found the lease lost");
    let calls = Calls::of(&server);
    assert!(calls.set >= 2, "never acquired again: {calls:?}");
}
