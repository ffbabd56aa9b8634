//! Redlock as its peers' own suites test theirs: redsync's
//! `TestMutexQuorum` (every subset of masters taken by someone else),
//! node-redlock's `multi.test.ts` ("succeeds when a minority of clients
//! fail", "fails when a majority of clients fail", the same value on every
//! server) and DistributedLock's `RedisSynchronizationCoreTestCases`
//! (hanging majorities, "failed acquire releases what has already been
//! acquired"). `tests/PEERS.md` maps every peer test to ours.
//!
//! Five independent `redis-server`s on loopback ports (test-support's
//! `Redlock` launcher).

use std::time::{Duration, Instant};

use lock_runtime::LockError;
use test_support::helpers::{eventually, key, lock_name, ms, secs, short_timeout_client, within};
use test_support::topology::{Redlock, Topology};

/// What another holder's lock looks like on a master: a value that is not
/// ours, with a lease.
fn take_by_hand(masters: &Redlock, i: usize, name: &str) {
    masters
        .server(i)
        .cli(&["SET", name, "someone-else", "PX", "60000"]);
}

/// redsync `TestMutexQuorum` (for every mask of "clogged" pools, `Lock`
/// succeeds exactly when a quorum is free), node-redlock "succeeds when a
/// minority of clients fail" / "fails when a majority of clients fail" (the
/// free server is left without the lock), DistributedLock
/// `TestFailedAcquireReleasesWhatHasAlreadyBeenAcquired`: over all 32
/// subsets of five masters held by someone else, a try-once acquire wins
/// exactly when at least three are free; a win writes one value with the
/// asked lease on every free master and its release clears them all; a
/// refusal leaves nothing of ours on the free ones; the foreign values are
/// never touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_wins_exactly_when_a_majority_of_masters_are_free_of_another_holder() {
    let masters = Redlock::start(5);
    let client = short_timeout_client(masters.builder()).await;
    let mut wins = 0;
    for mask in 0u32..32 {
        let key = key(&format!("quorum-{mask:05b}"));
        let name = lock_name(&key);
        let taken: Vec<usize> = (0..5).filter(|i| mask & (1 << i) != 0).collect();
        let free: Vec<usize> = (0..5).filter(|i| mask & (1 << i) == 0).collect();
        for &i in &taken {
            take_by_hand(&masters, i, &name);
        }
        let result = client.lock(&key).ttl(secs(10)).acquire().await;
        if free.len() >= 3 {
            wins += 1;
            let guard =
                result.unwrap_or_else(|e| panic!("{} of 5 free ({mask:05b}): {e:?}", free.len()));
            // The acquire answers once a majority took the key; a slower
            // free node's request finishes in its own task just after.
            let one_value_on_every_free_node = || {
                let values: Vec<String> = free
                    .iter()
                    .map(|&i| masters.server(i).cli(&["GET", &name]))
                    .collect();
                values
                    .iter()
                    .all(|v| v == &values[0] && !v.is_empty() && v != "someone-else")
            };
            let what = format!("{mask:05b}: one lock, one value on every free master");
            eventually(secs(2), &what, one_value_on_every_free_node).await;
            for &i in &free {
                let pttl: u64 = masters.server(i).cli(&["PTTL", &name]).parse().unwrap();
                assert!(
                    (9_000..=10_000).contains(&pttl),
                    "{mask:05b}: node {i} PTTL {pttl}"
                );
            }
            guard.release().await.unwrap();
        } else {
            match result {
                Err(LockError::Busy { .. }) => {}
                other => panic!("{} of 5 free ({mask:05b}): {other:?}", free.len()),
            }
        }
        // A release answers once a majority deleted the key; the other
        // nodes' deletes finish in their own tasks just after.
        if free.len() >= 3 {
            let gone = || {
                free.iter()
                    .all(|&i| masters.server(i).cli(&["EXISTS", &name]) == "0")
            };
            eventually(secs(2), "the released key gone from every free node", gone).await;
        }
        for &i in &free {
            assert_eq!(
                masters.server(i).cli(&["EXISTS", &name]),
                "0",
                "{mask:05b}: node {i} kept our lock after the {}",
                if free.len() >= 3 {
                    "release"
                } else {
                    "refusal"
                }
            );
        }
        for &i in &taken {
            assert_eq!(masters.server(i).cli(&["GET", &name]), "someone-else");
        }
    }
    assert_eq!(wins, 16, "subsets with at least three free masters");
}

/// DistributedLock `TestMajorityHangingDatabasesCauseAcquireToFail` (with
/// two of three databases hanging, `TryAcquireAsync` returns null in time):
/// with three of five masters paused (SIGSTOP), an acquire fails within its
/// wait and the response timeout instead of hanging; once they resume, its
/// unanswered commands leave nothing behind (each refused attempt's
/// release goes after its requests, on the same connections), so another
/// client gets the key at once, not when the 10 s lease would have run
/// out, and after that client's release (which waits for its own requests
/// still in flight on the slower, just resumed masters) no master holds
/// the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_majority_of_masters_hung_an_acquire_fails_in_time_and_leaves_no_lock_once_they_resume()
 {
    let masters = Redlock::start(5);
    let a = short_timeout_client(masters.builder()).await;
    let b = short_timeout_client(masters.builder()).await;
    let key = key("hung-majority");
    let name = lock_name(&key);
    for i in 0..3 {
        masters.pause(i);
    }
    for wait in [Duration::ZERO, ms(700)] {
        let started = Instant::now();
        let result = within(
            secs(10),
            "an acquire with a hung majority",
            a.lock(&key).ttl(secs(10)).wait(wait).acquire(),
        )
        .await;
        let took = started.elapsed();
        println!("wait {wait:?}: {result:?} after {took:?}");
        let err = result.expect_err("no majority answers: no lock");
        assert!(
            matches!(err, LockError::Busy { .. } | LockError::Backend(_)),
            "{err:?}"
        );
        assert!(took < wait + secs(3), "wait {wait:?}: took {took:?}");
    }
    for i in 3..5 {
        assert_eq!(
            masters.server(i).cli(&["EXISTS", &name]),
            "0",
            "answering master {i} kept the lock"
        );
    }
    for i in 0..3 {
        masters.resume(i);
    }
    let started = Instant::now();
    let guard = within(
        secs(15),
        "an acquire after the masters resumed",
        b.lock(&key).ttl(secs(10)).wait(secs(8)).acquire(),
    )
    .await
    .expect("the key is free once the masters resume");
    let took = started.elapsed();
    println!("taken {took:?} after the masters resumed");
    assert!(
        took < secs(3),
        "the refused acquires' locks stayed {took:?} on the resumed masters"
    );
    within(secs(5), "the release", guard.release())
        .await
        .unwrap();
    // The release answers once a majority deleted the key; a slower
    // master's delete finishes in its own task.
    eventually(secs(2), "every master deleted the key", || {
        masters.nodes_holding(&name).is_empty()
    })
    .await;
}
