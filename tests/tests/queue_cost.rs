//! What waiting costs the server: a chain of hand-overs costs one script call
//! per grant (the release that hands on), no waiter makes a busy attempt
//! because it was told of a hand-over to someone else, and a waiter sends two
//! scripts before it waits, on a fresh notice connection too.

use std::sync::mpsc;

use lock_runtime::{LockClient, LockGuard};
use test_support::RedisServer;

use test_support::helpers::*;

mod core_redis_common;
use core_redis_common::last_number;

/// Hand-overs in the chain.
const CHAIN: usize = 20;

fn queued(server: &RedisServer) -> i64 {
    last_number(&server.cli(&["LLEN", "lock:Q{chain}"]))
}

/// A waiter is told of every hand-over to another waiter of its client (so
/// that a dead new owner is noticed when its short lease ends). When several
/// such notices reach its client before the waiter's task runs (here: its
/// client's runtime is blocked while the chain runs, as a busy or paused
/// process would be), the news is set once and the wake-up permits pile up;
/// a wake-up with no news must not be taken for "free" (an attempt that can
/// only find the key busy).
#[test]
fn a_chain_of_hand_overs_costs_one_script_call_per_grant_and_no_busy_attempt() {
    let server = RedisServer::start();
    let url = server.url();
    let b = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // The watcher's "process": one worker, which the test blocks below.
    let a = one_worker_runtime();
    let builder = LockClient::builder()
        .redis(url.as_str())
        .local_handover(false);
    let chain = b.block_on(client(&builder));
    let watching = a.block_on(client(&builder));

    let holder = b
        .block_on(chain.lock("chain").ttl(secs(10)).acquire())
        .unwrap();
    // CHAIN waiters that release at once, then one that keeps the lock, all
    // on one client, each queued before the next.
    let mut links = Vec::new();
    for i in 0..=CHAIN {
        let client = chain.clone();
        links.push(b.spawn(async move {
            let guard = client
                .lock("chain")
                .ttl(secs(10))
                .wait(secs(20))
                .acquire()
                .await
                .unwrap();
            if i < CHAIN {
                guard.release().await.unwrap();
                None
            } else {
                Some(guard)
            }
        }));
        let want = i as i64 + 1;
        b.block_on(eventually(secs(5), "the link queued", || {
            queued(&server) == want
        }));
    }
    // Last in line, alone on its client: told of every hand-over above.
    let watcher = a.spawn({
        let client = watching.clone();
        async move {
            let guard = client
                .lock("chain")
                .ttl(secs(10))
                .wait(secs(30))
                .acquire()
                .await
                .unwrap();
            guard.fencing_token().await.unwrap()
        }
    });
    let want = CHAIN as i64 + 2;
    b.block_on(eventually(secs(5), "the watcher queued", || {
        queued(&server) == want
    }));
    // Let its second attempt (right after registering) return and settle.
    std::thread::sleep(std::time::Duration::from_millis(200));

    // Block the watcher's runtime while the chain runs: every notice of the
    // chain reaches its client at once when it wakes.
    let (started, blocked) = mpsc::channel();
    let (unblock, wait_here) = mpsc::channel::<()>();
    a.spawn(async move {
        started.send(()).unwrap();
        let _ = wait_here.recv();
    });
    blocked.recv().unwrap();
    server.cli(&["CONFIG", "RESETSTAT"]);
    b.block_on(holder.release()).unwrap();
    let mut last: Option<LockGuard> = None;
    for link in links {
        if let Some(guard) = b.block_on(within(secs(10), "a link", link)).unwrap() {
            last = Some(guard);
        }
    }
    unblock.send(()).unwrap();
    // The watcher's client reads the CHAIN + 1 notices now; give a busy
    // attempt, if any, the time to happen.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let scripts = server.command_calls("evalsha");
    assert!(!watcher.is_finished(), "the watcher still waits");
    // Told apart by the commands each script sends here, where the key is
    // marked all along (the watcher stands in line behind every link):
    // release.lua pops the head (one LPOP) and reads its deadline (one
    // ZSCORE); acquire.lua's busy path looks its own entry up (one ZSCORE,
    // no LPOP). Counting PTTLs instead would miss a busy attempt: on a
    // marked key it reads one (the line's), as a re-arm does.
    let (lookups, pops) = (server.command_calls("zscore"), server.command_calls("lpop"));
    assert_eq!(lookups - pops, 0, "busy acquire attempts during the chain");
    let grants = CHAIN as u64 + 1;
    // One release per grant; a link whose hand-over came long after its
    // last attempt (a slow machine queues the chain slowly) re-arms its
    // short hand-over lease (extend.lua: a PTTL on a marked key, a PEXPIRE
    // on an unmarked one) before use.
    let extends = server.command_calls("pttl") + server.command_calls("pexpire");
    // The first holder took the key with a plain SET: its release tries the
    // plain compare-and-delete first (the value was marked: it deleted
    // nothing) and then release.lua. Every later link was handed the key,
    // so its release goes to release.lua at once.
    assert!(
        scripts <= grants + extends + 1,
        "{scripts} script calls for {grants} grants ({extends} re-armed)"
    );

    b.block_on(last.unwrap().release()).unwrap();
    let fencing = a
        .block_on(within(secs(10), "the watcher", watcher))
        .unwrap();
    // Each hand-over minted one token (the first holder, which took the key
    // with a plain SET, never asked for one): the watcher's is the last.
    assert_eq!(fencing, CHAIN as u64 + 2, "the watcher came last");
}

/// A waiter sends two scripts before it waits, on a client whose notice
/// connection is not open yet as on any other: the attempt that queues it
/// and the look right after its subscription is confirmed. That
/// connection's first connect wakes every waiter registered (after a
/// reconnect, notices may have been missed); a wake that came before the
/// look is no reason for another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_looks_once_after_registering_on_a_fresh_notice_connection() {
    let server = RedisServer::start();
    let builder = LockClient::builder()
        .redis(server.url().as_str())
        .local_handover(false);
    let (holding, waiting) = two_clients(&builder).await;
    let holder = holding.lock("fresh").ttl(secs(10)).acquire().await.unwrap();
    server.cli(&["CONFIG", "RESETSTAT"]);
    let waiter = tokio::spawn(async move {
        waiting
            .lock("fresh")
            .ttl(secs(10))
            .wait(secs(10))
            .acquire()
            .await
    });
    eventually(secs(5), "the waiter queued and looked again", || {
        server.cli(&["LLEN", "lock:Q{fresh}"]) == "1" && server.command_calls("evalsha") >= 2
    })
    .await;
    // Time for any look that would follow (one did at once, before).
    tokio::time::sleep(ms(300)).await;
    let scripts = server.command_calls("evalsha");
    assert_eq!(scripts, 2, "acquire.lua calls before the waiter waits");
    holder.release().await.unwrap();
    let next = within(secs(3), "the waiter", waiter)
        .await
        .unwrap()
        .unwrap();
    next.release().await.unwrap();
}
