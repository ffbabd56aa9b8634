//! The semantic suite every scale-out backend must pass, as the single-node
//! backend does (`core.rs`): mutual exclusion, expiry of a forgotten fixed
//! lease, monotonic fencing, lost detection, wake-up on release.
//!
//! Each check is an `async fn` taking a [`LockClientBuilder`] already pointed
//! at a topology; it builds as many independent clients from it as it needs.
//! `semantic_suite!(setup)` (include this module with `#[macro_use]`)
//! generates one test per check, in a module `semantics`, where `setup()`
//! returns `(topology, builder)`; the topology lives until the test ends.
#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::{Duration, Instant};

use lock_runtime::__private::testing::force_delete;
use lock_runtime::{LockClientBuilder, LockError};
use test_support::helpers::*;

/// Generates the semantic suite for one topology: `$setup` names a
/// `fn() -> (Topology, LockClientBuilder)`.
macro_rules! semantic_suite {
    ($setup:ident) => {
        mod semantics {
            semantic_suite!(@tests $setup;
                tasks_doing_read_modify_write_under_one_lock_end_with_the_exact_count,
                a_try_once_on_a_held_lock_is_busy_with_the_holders_remaining_lease,
                a_forgotten_fixed_lease_frees_the_key_after_its_ttl,
                fencing_tokens_strictly_increase_across_clients_releases_expiry_and_deletes,
                an_external_delete_makes_the_holder_lost_and_cancels_its_with_lock_future,
                a_waiter_wakes_within_milliseconds_of_a_release,
            );
        }
    };
    (@tests $setup:ident; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let started = std::time::Instant::now();
                let (topology, builder) = super::$setup();
                let ready = started.elapsed();
                crate::scaleout_common::$name(builder).await;
                println!(
                    "{}: topology up in {ready:?}, whole test {:?}",
                    stringify!($name),
                    started.elapsed()
                );
                drop(topology);
            }
        )*
    };
}

// ---- the suite -------------------------------------------------------------

pub async fn tasks_doing_read_modify_write_under_one_lock_end_with_the_exact_count(
    builder: LockClientBuilder,
) {
    const TASKS: u64 = 24;
    let key = key("counter");
    let clients = [
        client(&builder).await,
        client(&builder).await,
        client(&builder).await,
    ];
    let run = locked_read_modify_writes(&clients, &key, TASKS, ms(1), secs(30)).await;
    println!("{TASKS} locked increments from 3 clients in {:?}", run.took);
    let mut fences = run.fences;
    fences.dedup();
    assert_eq!(
        fences.len(),
        TASKS as usize,
        "one distinct fencing token per holder"
    );
}

pub async fn a_try_once_on_a_held_lock_is_busy_with_the_holders_remaining_lease(
    builder: LockClientBuilder,
) {
    let key = key("busy");
    let (a, b) = two_clients(&builder).await;
    let guard = a.lock(&key).ttl(secs(5)).acquire().await.unwrap();
    match b.lock(&key).acquire().await {
        Err(LockError::Busy {
            key: busy_key,
            retry_after,
        }) => {
            assert_eq!(busy_key, key);
            assert!(
                retry_after > Duration::ZERO && retry_after <= secs(5),
                "retry_after {retry_after:?} for a 5 s lease"
            );
        }
        other => panic!("expected Busy, got {other:?}"),
    }
    // Waiting does not help while the holder holds.
    let started = Instant::now();
    let busy = b.lock(&key).wait(ms(300)).acquire().await;
    assert!(matches!(busy, Err(LockError::Busy { .. })), "{busy:?}");
    assert!(
        started.elapsed() >= ms(250),
        "gave up early: {:?}",
        started.elapsed()
    );
    guard.release().await.unwrap();
    assert!(!is_held(&b, &key).await, "free after the release");
}

pub async fn a_forgotten_fixed_lease_frees_the_key_after_its_ttl(builder: LockClientBuilder) {
    let key = key("forgotten");
    let (a, b) = two_clients(&builder).await;
    let taken = Instant::now();
    let guard = fixed_lease(&a, &key, ms(400)).await.unwrap();
    let lost = guard.lost();
    // Forgotten: never released, never dropped.
    std::mem::forget(guard);
    let second = within(
        secs(5),
        "the second client gets the lock",
        b.lock(&key).ttl(secs(5)).wait(secs(4)).acquire(),
    )
    .await
    .expect("the lock frees itself when the lease runs out");
    let after = taken.elapsed();
    println!("a forgotten 400 ms lease was taken over after {after:?}");
    assert!(
        after >= ms(350),
        "taken over after {after:?}, before the lease ran out"
    );
    assert!(after < secs(4), "taken over only after {after:?}");
    within(secs(1), "the forgotten guard reports its loss", lost).await;
    second.release().await.unwrap();
}

pub async fn fencing_tokens_strictly_increase_across_clients_releases_expiry_and_deletes(
    builder: LockClientBuilder,
) {
    let key = key("fence");
    let (a, b) = two_clients(&builder).await;
    let mut tokens = Vec::new();
    for round in 0..12 {
        let client = if round % 2 == 0 { &a } else { &b };
        let guard = fixed_lease_waiting(client, &key, ms(300), secs(3))
            .await
            .unwrap();
        tokens.push(guard.fencing_token().await.unwrap());
        match round % 4 {
            // Released.
            0 | 1 => guard.release().await.unwrap(),
            // Deleted by an operator.
            2 => {
                force_delete(&b, &key).await.unwrap();
                drop(guard);
            }
            // Left to expire: the next acquire waits it out.
            _ => std::mem::forget(guard),
        }
    }
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens not strictly increasing: {tokens:?}"
    );
}

pub async fn an_external_delete_makes_the_holder_lost_and_cancels_its_with_lock_future(
    builder: LockClientBuilder,
) {
    let key = key("deleted");
    let (a, b) = two_clients(&builder).await;
    let guard = a.lock(&key).ttl(ms(600)).acquire().await.unwrap();
    let lost = guard.lost();
    assert!(!guard.is_lost());
    let deleted = Instant::now();
    force_delete(&b, &key).await.unwrap();
    within(secs(3), "the holder notices the delete", lost).await;
    println!(
        "lost() resolved {:?} after the delete (600 ms lease)",
        deleted.elapsed()
    );
    assert!(guard.is_lost());
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));

    // The same through with_lock: the body is cancelled, the call says Lost.
    let finished = Arc::new(AtomicUsize::new(0));
    let run = {
        let (a, key, finished) = (a.clone(), key.clone(), finished.clone());
        tokio::spawn(async move {
            // (Waiting: the probe below may hold it for a moment.)
            a.lock(&key)
                .ttl(ms(600))
                .wait(secs(3))
                .run(async move {
                    tokio::time::sleep(secs(10)).await;
                    finished.fetch_add(1, SeqCst);
                })
                .await
        })
    };
    // Wait until the body runs under the lock, then delete it.
    let started = Instant::now();
    while !is_held(&b, &key).await {
        assert!(started.elapsed() < secs(3), "with_lock never took the lock");
        tokio::time::sleep(ms(5)).await;
    }
    force_delete(&b, &key).await.unwrap();
    let result = within(secs(3), "with_lock returns after the delete", run)
        .await
        .unwrap();
    assert!(matches!(result, Err(LockError::Lost { .. })), "{result:?}");
    assert_eq!(finished.load(SeqCst), 0, "the body was cancelled");
}

pub async fn a_waiter_wakes_within_milliseconds_of_a_release(builder: LockClientBuilder) {
    let key = key("handoff");
    let (a, b) = two_clients(&builder).await;
    let mut latencies = Vec::new();
    for round in 0..8 {
        // A long lease: only the release notice can wake the waiter in time.
        let holder = a.lock(&key).ttl(secs(10)).acquire().await.unwrap();
        let waiter = spawn_waiter(&b, &key, secs(8));
        tokio::time::sleep(if round == 0 { ms(150) } else { ms(40) }).await;
        latencies.push(release_to_waiter(holder, waiter, secs(6)).await);
    }
    assert_prompt_handoffs("release -> waiter holds the lock", latencies, ms(200));
}
