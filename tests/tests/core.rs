//! The runtime core (issue 2), written once and run on both backends: every
//! `async fn` below taking an [`Env`] becomes `memory::<name>` and
//! `redis::<name>` (a `redis-server` of its own per test), so the embedded
//! backend and Redis cannot drift apart. Builder checks that need no backend
//! are plain tests at the end.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use lock_runtime::__private::testing::force_delete;
use lock_runtime::{
    LockClient, LockClientBuilder, LockError, LockGuard, LockInfo, MAX_KEY_LEN, MAX_TTL, MIN_TTL,
    current_lock,
};

#[macro_use]
#[path = "../src/core_support.rs"]
mod core_support;
use core_support::{Env, warnings_for};
use test_support::helpers::*;

// Braces: rustfmt leaves the list (and its attributes) alone.
both_backends! {
    sixty_four_tasks_doing_read_modify_write_under_one_lock_end_with_the_exact_count,
    a_forgotten_fixed_lease_guard_frees_the_key_after_its_ttl,
    a_forgotten_renewing_guard_keeps_the_key_while_its_client_lives,
    an_external_delete_makes_lost_resolve_within_about_a_third_of_the_ttl,
    a_holder_with_a_300ms_lease_keeps_the_lock_for_two_seconds_through_the_watchdog,
    a_fixed_lease_is_lost_at_its_end_and_run_is_cancelled_then,
    a_waiter_wakes_within_milliseconds_of_a_release,
    a_waiter_falls_back_to_the_holders_ttl_when_the_holder_dies_without_releasing,
    fencing_tokens_strictly_increase_across_releases_expiry_deletes_and_clients,
    concurrent_acquisitions_get_distinct_increasing_fencing_tokens,
    a_stale_guard_cannot_release_the_new_holders_lock,
    a_stale_guard_cannot_extend_the_new_holders_lock,
    wait_zero_tries_once_and_reports_busy_with_the_holders_remaining_lease,
    busy_after_a_wait_respects_the_deadline,
    ten_thousand_acquire_release_cycles_leave_no_watchdog_and_no_task,
    dropping_a_guard_releases_the_lock_in_the_background,
    dropping_a_guard_outside_a_runtime_stops_its_watchdog_and_the_lease_runs_out,
    with_lock_releases_the_lock_when_the_future_completes,
    work_that_finished_under_a_valid_lease_keeps_its_output_whatever_the_release_answers,
    with_lock_releases_the_lock_when_the_future_returns_an_error,
    with_lock_releases_the_lock_when_the_future_panics_in_a_spawned_task,
    with_lock_releases_the_lock_when_the_future_panics_in_the_caller,
    a_lost_lease_cancels_the_with_lock_future_and_returns_lost,
    nested_locking_of_the_same_key_reenters_and_the_outer_scope_keeps_ownership,
    current_lock_gives_the_innermost_key_and_fence,
    a_timed_out_waiting_acquire_leaves_nothing_held,
    a_wait_that_ended_busy_is_out_of_the_line_when_it_answers,
    acquires_dropped_at_any_point_never_leave_a_lock_held,
    an_abandoned_waiting_acquire_is_cleaned_up_under_its_own_key_in_the_logs,
    bad_keys_are_invalid_key_errors_everywhere,
    bad_leases_are_config_errors_and_the_limits_themselves_work,
    cancelling_a_with_lock_future_releases_its_lock,
    waiters_cancelled_around_a_release_never_strand_the_others,
    acquire_renewal_release_and_loss_are_traced,
    a_wait_of_duration_max_waits_without_panicking,
}

async fn sixty_four_tasks_doing_read_modify_write_under_one_lock_end_with_the_exact_count(
    env: Env,
) {
    let key = key("counter");
    let other = env.other().await;
    let clients = [env.client.clone(), other.clone()];
    let run = locked_read_modify_writes(&clients, &key, 64, ms(2), secs(60)).await;
    let (took, unlocked) = (run.took, run.unlocked);
    println!(
        "[{:?}] 64 locked increments in {took:?} ({:?} each incl. the 2 ms hold); unlocked control counted {unlocked}",
        env.kind,
        took / 64
    );
    assert_eq!(run.fences, (1..=64).collect::<Vec<u64>>());
    watchdogs_stop(secs(2), &[&env.client, &other]).await;
}

/// Checks (and prints, as `what`) that a fixed 300 ms lease left behind was
/// taken over `at` its end: not before, and long before a poll would have.
fn assert_taken_over_when_300ms_ran_out(env: &Env, what: &str, at: Duration) {
    println!("[{:?}] {what} after {at:?}", env.kind);
    assert!(at >= ms(290), "{what} after {at:?}, before the lease ended");
    assert!(at < ms(1500), "{what} only after {at:?}");
}

async fn a_forgotten_fixed_lease_guard_frees_the_key_after_its_ttl(env: Env) {
    let key = key("forgotten-fixed");
    let other = env.other().await;
    let taken = Instant::now();
    let guard = fixed_lease(&env.client, &key, ms(300)).await.unwrap();
    std::mem::forget(guard);
    assert!(is_held(&other, &key).await, "held right after the leak");
    let freed = taken_after(taken, &other, &key, secs(2), "the leaked lease runs out").await;
    assert_taken_over_when_300ms_ran_out(&env, "a leaked 300 ms fixed lease was free", freed);
}

async fn a_forgotten_renewing_guard_keeps_the_key_while_its_client_lives(env: Env) {
    let key = key("forgotten-renewing");
    let other = env.other().await;
    let guard = env.client.lock(&key).ttl(ms(150)).acquire().await.unwrap();
    std::mem::forget(guard);
    // Four leases later it is still held: the watchdog of a leaked guard runs
    // as long as its client does (documented on `LockGuard`).
    tokio::time::sleep(ms(600)).await;
    assert!(
        is_held(&other, &key).await,
        "the leaked renewing lease ran out"
    );
    assert_eq!(env.client.renewed_leases(), 1);
    // (`core_redis.rs` checks that dropping every clone of the client frees it.)
}

async fn an_external_delete_makes_lost_resolve_within_about_a_third_of_the_ttl(env: Env) {
    let key = key("deleted");
    let guard = env.client.lock(&key).ttl(ms(300)).acquire().await.unwrap();
    let lost = guard.lost();
    // A few renewals pass without incident.
    tokio::time::sleep(ms(250)).await;
    assert!(!guard.is_lost(), "lost before anything happened");
    let deleted = Instant::now();
    force_delete(&env.client, &key).await.unwrap();
    within(secs(3), "lost() after an external delete", lost).await;
    let took = deleted.elapsed();
    println!(
        "[{:?}] lost() resolved {took:?} after an external DEL (ttl 300 ms, renewal every 100 ms)",
        env.kind
    );
    assert!(took < secs(1), "lost() took {took:?}");
    assert!(guard.is_lost());
    let warnings = warnings_for(&key);
    assert!(
        warnings.iter().any(|w| w.message.contains("lost")),
        "no warning names the lost lock: {warnings:?}"
    );
    match guard.release().await {
        Err(LockError::Lost { key: k }) => assert_eq!(k, key),
        other => panic!("release of a lost lock gave {other:?}"),
    }
    assert!(!is_held(&env.client, &key).await);
}

async fn a_holder_with_a_300ms_lease_keeps_the_lock_for_two_seconds_through_the_watchdog(env: Env) {
    let key = key("watchdog");
    let other = env.other().await;
    let guard = env.client.lock(&key).ttl(ms(300)).acquire().await.unwrap();
    let held_since = Instant::now();
    let mut lowest = Duration::MAX;
    let mut probes = 0;
    while held_since.elapsed() < secs(2) {
        let left = remaining(&other, &key).await;
        assert!(!guard.is_lost(), "lost after {:?}", held_since.elapsed());
        assert!(left <= ms(300), "remaining lease {left:?} above the ttl");
        lowest = lowest.min(left);
        probes += 1;
        tokio::time::sleep(ms(20)).await;
    }
    println!(
        "[{:?}] held a 300 ms lease for 2 s; {probes} probes, lowest remaining lease seen {lowest:?}",
        env.kind
    );
    assert!(probes >= 10);
    guard.release().await.expect("still ours after 2 s");
    assert!(warnings_for(&key).is_empty(), "{:?}", warnings_for(&key));
    watchdogs_stop(secs(1), &[&env.client]).await;
}

async fn a_fixed_lease_is_lost_at_its_end_and_run_is_cancelled_then(env: Env) {
    let key = key("fixed");
    let started = Instant::now();
    let guard = fixed_lease(&env.client, &key, ms(200)).await.unwrap();
    within(secs(2), "a fixed lease ends", guard.lost()).await;
    let at = started.elapsed();
    assert!(
        at >= ms(190) && at < secs(2),
        "fixed lease lost after {at:?}"
    );
    assert!(guard.release().await.unwrap_err().is_lost());

    let started = Instant::now();
    let result = env
        .client
        .lock(&key)
        .ttl(ms(200))
        .renew(false)
        .run(std::future::pending::<()>())
        .await;
    let at = started.elapsed();
    println!(
        "[{:?}] fixed 200 ms leases: lost() after ~{:?}, run cancelled after {at:?}",
        env.kind, at
    );
    assert!(matches!(result, Err(LockError::Lost { .. })), "{result:?}");
    assert!(at >= ms(190) && at < secs(2), "run cancelled after {at:?}");
}

async fn a_waiter_wakes_within_milliseconds_of_a_release(env: Env) {
    let key = key("handoff");
    let other = env.other().await;
    let mut latencies = Vec::new();
    for round in 0..15 {
        // A long lease: only the release notice can wake the waiter in time.
        let holder = env.client.lock(&key).ttl(secs(10)).acquire().await.unwrap();
        let waiter = spawn_waiter(&other, &key, secs(5));
        tokio::time::sleep(if round == 0 { ms(100) } else { ms(30) }).await;
        latencies.push(release_to_waiter(holder, waiter, secs(4)).await);
    }
    assert_prompt_handoffs(
        &format!(
            "[{:?}] release -> waiter holds the lock (incl. the release round trip)",
            env.kind
        ),
        latencies,
        ms(100),
    );
}

async fn a_waiter_falls_back_to_the_holders_ttl_when_the_holder_dies_without_releasing(env: Env) {
    let key = key("dead-holder");
    let other = env.other().await;
    let taken = Instant::now();
    let holder = fixed_lease(&env.client, &key, ms(300)).await.unwrap();
    std::mem::forget(holder); // dies: no release, no notice
    let what = "the waiter gets the lock when the lease ends";
    let at = taken_after(taken, &other, &key, secs(3), what).await;
    let what = "waiter took over a dead holder's 300 ms lease";
    assert_taken_over_when_300ms_ran_out(&env, what, at);
}

async fn fencing_tokens_strictly_increase_across_releases_expiry_deletes_and_clients(env: Env) {
    let key = key("fence");
    let other = env.other().await;
    let mut seen = Vec::new();

    // Released by its holder, then another client.
    for client in [&env.client, &other, &env.client] {
        let guard = client.lock(&key).acquire().await.unwrap();
        seen.push(guard.fencing_token());
        guard.release().await.unwrap();
    }
    // Expired (fixed lease), then taken by the other client.
    let expired = fixed_lease(&env.client, &key, ms(100)).await.unwrap();
    seen.push(expired.fencing_token());
    within(secs(2), "the fixed lease ends", expired.lost()).await;
    let next = other.lock(&key).wait(secs(1)).acquire().await.unwrap();
    seen.push(next.fencing_token());
    next.release().await.unwrap();
    drop(expired);
    // Deleted by an operator while held.
    let deleted = env.client.lock(&key).acquire().await.unwrap();
    seen.push(deleted.fencing_token());
    force_delete(&env.client, &key).await.unwrap();
    let next = other.lock(&key).acquire().await.unwrap();
    seen.push(next.fencing_token());
    assert!(deleted.release().await.unwrap_err().is_lost());
    next.release().await.unwrap();
    // Dropped.
    let dropped = other.lock(&key).acquire().await.unwrap();
    seen.push(dropped.fencing_token());
    drop(dropped);
    let next = env.client.lock(&key).wait(secs(1)).acquire().await.unwrap();
    seen.push(next.fencing_token());
    next.release().await.unwrap();

    println!("[{:?}] fencing tokens: {seen:?}", env.kind);
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "not strictly increasing: {seen:?}"
    );
    // Other keys draw from their hash slot's counter (one counter in the
    // embedded backend): their tokens increase too, with gaps.
    let unrelated = key.clone() + ":other";
    let first = env.client.lock(&unrelated).acquire().await.unwrap();
    let (t1, _) = (first.fencing_token(), first.release().await.unwrap());
    let second = env.client.lock(&unrelated).acquire().await.unwrap();
    assert!(
        second.fencing_token() > t1,
        "{t1} then {}",
        second.fencing_token()
    );
}

async fn concurrent_acquisitions_get_distinct_increasing_fencing_tokens(env: Env) {
    let key = key("fence-race");
    let other = env.other().await;
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let client = if i % 2 == 0 {
                env.client.clone()
            } else {
                other.clone()
            };
            let key = key.clone();
            tokio::spawn(async move {
                let mut mine = Vec::new();
                for _ in 0..10 {
                    let guard = client.lock(&key).wait(secs(20)).acquire().await.unwrap();
                    mine.push(guard.fencing_token());
                    guard.release().await.unwrap();
                }
                mine
            })
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        let mine = within(secs(30), "80 acquisitions", task).await.unwrap();
        assert!(
            mine.windows(2).all(|w| w[0] < w[1]),
            "one task saw {mine:?}"
        );
        all.extend(mine);
    }
    // Distinct, and increasing in the order they were granted (each task's
    // own sequence, above); gaps are allowed (the counter is shared with the
    // other keys of the hash slot).
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), 80, "a token was given twice: {all:?}");
}

async fn a_stale_guard_cannot_release_the_new_holders_lock(env: Env) {
    let key = key("stale-release");
    let other = env.other().await;
    let stale = fixed_lease(&env.client, &key, ms(100)).await.unwrap();
    within(secs(2), "the stale lease ends", stale.lost()).await;
    let holder = fixed_lease_waiting(&other, &key, secs(10), secs(1))
        .await
        .unwrap();
    assert!(holder.fencing_token() > stale.fencing_token());
    match stale.release().await {
        Err(LockError::Lost { key: k }) => assert_eq!(k, key),
        other => panic!("a stale release gave {other:?}"),
    }
    assert_the_new_holder_keeps_its_10s_lease(&env, &key, holder).await;
}

/// The end of a stale-guard scenario: the new holder of `key` is not lost,
/// still has most of its 10 s lease, and releases it.
async fn assert_the_new_holder_keeps_its_10s_lease(env: &Env, key: &str, holder: LockGuard) {
    let left = remaining(&env.client, key).await;
    // A renewal with a stale 300 ms guard's token would have re-armed it.
    assert!(left > secs(8), "the new holder's lease is down to {left:?}");
    assert!(!holder.is_lost());
    holder
        .release()
        .await
        .expect("the new holder still owns it");
}

async fn a_stale_guard_cannot_extend_the_new_holders_lock(env: Env) {
    let key = key("stale-extend");
    let other = env.other().await;
    let stale = env.client.lock(&key).ttl(ms(300)).acquire().await.unwrap();
    force_delete(&env.client, &key).await.unwrap();
    let holder = fixed_lease(&other, &key, secs(10)).await.unwrap();
    // The stale guard's watchdog tries to renew with its own token: refused.
    within(secs(2), "the stale guard notices", stale.lost()).await;
    tokio::time::sleep(ms(150)).await;
    assert!(stale.release().await.unwrap_err().is_lost());
    assert_the_new_holder_keeps_its_10s_lease(&env, &key, holder).await;
}

async fn wait_zero_tries_once_and_reports_busy_with_the_holders_remaining_lease(env: Env) {
    let key = key("busy");
    let other = env.other().await;
    let holder = fixed_lease(&env.client, &key, secs(2)).await.unwrap();
    for request in [other.lock(&key), other.lock(&key).wait(Duration::ZERO)] {
        let started = Instant::now();
        let err = request.acquire().await.unwrap_err();
        let took = started.elapsed();
        match &err {
            LockError::Busy {
                key: k,
                retry_after,
            } => {
                assert_eq!(k, &key);
                assert!(
                    *retry_after > secs(1) && *retry_after <= secs(2),
                    "retry_after {retry_after:?} for a 2 s lease"
                );
            }
            e => panic!("expected Busy, got {e:?}"),
        }
        assert!(err.is_busy() && !err.is_lost());
        assert_eq!(
            err.retry_after(),
            Some(match &err {
                LockError::Busy { retry_after, .. } => *retry_after,
                _ => unreachable!(),
            })
        );
        assert!(err.to_string().contains(&key), "{err}");
        println!(
            "[{:?}] try-once on a held lock answered Busy in {took:?}: {err}",
            env.kind
        );
        assert!(took < ms(500), "trying once took {took:?}");
    }
    let ran = AtomicBool::new(false);
    let result = other
        .with_lock(&key, async {
            ran.store(true, SeqCst);
        })
        .await;
    assert!(result.unwrap_err().is_busy());
    assert!(!ran.load(SeqCst), "the future ran without the lock");
    holder.release().await.unwrap();
}

/// `env.client` takes `key` with a lease of `ttl`, then `other` waits up to
/// `wait` for it and gives up: the holder, the waiter's error and how long it
/// waited.
async fn busy_after_waiting(
    env: &Env,
    other: &LockClient,
    key: &str,
    ttl: Duration,
    wait: Duration,
) -> (LockGuard, LockError, Duration) {
    let holder = env.client.lock(key).ttl(ttl).acquire().await.unwrap();
    let started = Instant::now();
    let err = other.lock(key).wait(wait).acquire().await.unwrap_err();
    (holder, err, started.elapsed())
}

async fn busy_after_a_wait_respects_the_deadline(env: Env) {
    let other = env.other().await;
    // A long lease: the waiter sleeps on the notice until its deadline.
    let key_a = key("deadline-long");
    let (holder, err, took) = busy_after_waiting(&env, &other, &key_a, secs(5), ms(300)).await;
    let retry = err.retry_after().expect("Busy");
    println!(
        "[{:?}] wait(300ms) on a 5 s holder gave up after {took:?} (retry_after {retry:?})",
        env.kind
    );
    assert!(took >= ms(300) && took < ms(1300), "gave up after {took:?}");
    assert!(retry > secs(3) && retry <= secs(5), "retry_after {retry:?}");

    // A short renewing lease: the waiter's lease-end timer fires several times
    // and each retry finds it renewed; the deadline still holds.
    let key_b = key("deadline-short");
    let (renewing, err, took) = busy_after_waiting(&env, &other, &key_b, ms(150), ms(500)).await;
    println!(
        "[{:?}] wait(500ms) on a renewing 150 ms holder gave up after {took:?}",
        env.kind
    );
    assert!(err.is_busy());
    assert!(took >= ms(500) && took < ms(1500), "gave up after {took:?}");
    assert!(err.retry_after().unwrap() <= ms(150));
    // The waiters that gave up are gone for good: a release does not hand
    // their lock to them (10 s leases would keep it from everyone).
    holder.release().await.unwrap();
    renewing.release().await.unwrap();
    for key in [&key_a, &key_b] {
        let what = "free after the holder released";
        let took = taken_after(Instant::now(), &env.client, key, secs(3), what).await;
        assert!(took < secs(1), "free only after {took:?}");
    }
}

async fn ten_thousand_acquire_release_cycles_leave_no_watchdog_and_no_task(env: Env) {
    let key = key("cycles");
    let metrics = tokio::runtime::Handle::current().metrics();
    // Warm up (connections, and the notice subscriber: make one waiter wait
    // on the server; with other lease settings than the holder's, it does
    // not wait in the client's own line), then count the runtime's tasks.
    let holder = env.client.lock(&key).acquire().await.unwrap();
    let busy = env
        .client
        .lock(&key)
        .ttl(secs(20))
        .wait(ms(50))
        .acquire()
        .await;
    assert!(busy.unwrap_err().is_busy());
    holder.release().await.unwrap();
    watchdogs_stop(secs(2), &[&env.client]).await;
    let tasks_before = metrics.num_alive_tasks();
    let started = Instant::now();
    // 8 tasks x 1,250 cycles, each task on a key of its own: mostly
    // release(), every tenth cycle a dropped guard, every tenth a run().
    let workers: Vec<_> = (0..8)
        .map(|w| {
            let (client, key) = (env.client.clone(), format!("{key}:{w}"));
            tokio::spawn(async move {
                for i in 0..1_250u32 {
                    let request = client.lock(&key).wait(secs(2));
                    match i % 10 {
                        8 => drop(request.acquire().await.unwrap()), // released in the background
                        9 => request.run(async {}).await.unwrap(),
                        _ => request.acquire().await.unwrap().release().await.unwrap(),
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        within(secs(60), "1,250 cycles", worker).await.unwrap();
    }
    let took = started.elapsed();
    let settled = watchdogs_stop(secs(3), &[&env.client]).await;
    let deadline = Instant::now() + secs(3);
    while metrics.num_alive_tasks() > tasks_before && Instant::now() < deadline {
        tokio::time::sleep(ms(5)).await;
    }
    assert!(
        metrics.num_alive_tasks() <= tasks_before,
        "tasks alive: {} before the cycles, {} after",
        tasks_before,
        metrics.num_alive_tasks()
    );
    println!(
        "[{:?}] 10,000 cycles in {took:?} ({:?} per cycle); watchdogs at 0 {settled:?} later; tasks {} -> {}",
        env.kind,
        took / 10_000,
        tasks_before,
        metrics.num_alive_tasks()
    );
    for w in 0..8 {
        assert!(!is_held(&env.client, &format!("{key}:{w}")).await);
    }
}

async fn dropping_a_guard_releases_the_lock_in_the_background(env: Env) {
    let key = key("dropped");
    let other = env.other().await;
    let guard = env.client.lock(&key).ttl(secs(30)).acquire().await.unwrap();
    drop(guard);
    let took = taken_after(
        Instant::now(),
        &other,
        &key,
        secs(3),
        "a dropped guard releases",
    )
    .await;
    println!(
        "[{:?}] a dropped guard's 30 s lock was free after {took:?}",
        env.kind
    );
    // A 30 s lease: only a release can free it this fast.
    assert!(took < secs(1), "free only after {took:?}");
}

async fn dropping_a_guard_outside_a_runtime_stops_its_watchdog_and_the_lease_runs_out(env: Env) {
    let key = key("dropped-outside");
    let other = env.other().await;
    let taken = Instant::now();
    let guard = env.client.lock(&key).ttl(ms(300)).acquire().await.unwrap();
    let dropped = std::thread::spawn(move || {
        let started = Instant::now();
        drop(guard);
        started.elapsed()
    })
    .join()
    .unwrap();
    assert!(dropped < ms(50), "drop blocked for {dropped:?}");
    let what = "the lease runs out when nobody renews it";
    let at = taken_after(taken, &other, &key, secs(2), what).await;
    println!(
        "[{:?}] a guard dropped outside any runtime freed its 300 ms lock after {at:?}",
        env.kind
    );
    assert!(
        at < ms(1500),
        "the watchdog kept renewing: free only after {at:?}"
    );
    watchdogs_stop(secs(1), &[&env.client]).await;
}

async fn with_lock_releases_the_lock_when_the_future_completes(env: Env) {
    let key = key("run-ok");
    let other = env.other().await;
    let answer = env
        .client
        .lock(&key)
        .ttl(secs(30))
        .run(async {
            assert_eq!(current_lock().map(|l| l.key), Some(key.clone()));
            42
        })
        .await
        .unwrap();
    assert_eq!(answer, 42);
    assert!(
        !is_held(&other, &key).await,
        "still held after run returned"
    );
    let answer = env.client.with_lock(&key, async { "done" }).await.unwrap();
    assert_eq!(answer, "done");
    assert!(
        !is_held(&other, &key).await,
        "still held after with_lock returned"
    );
    watchdogs_stop(secs(1), &[&env.client]).await;
}

/// `Lost` from `run` means the lease may have ended before the work finished.
/// Here the work finishes under a valid lease, and only then does the key
/// vanish (an operator's `DEL`, standing in for any release that goes wrong):
/// the output is the caller's, and the failed release is a warning naming
/// the key. (It used to be `Err(Lost)`, inviting a retry of work that ran.)
async fn work_that_finished_under_a_valid_lease_keeps_its_output_whatever_the_release_answers(
    env: Env,
) {
    let key = key("run-then-vanish");
    let answer = env
        .client
        .lock(&key)
        .ttl(secs(30))
        .run(async {
            let paid = "paid";
            force_delete(&env.client, &key).await.unwrap();
            paid
        })
        .await;
    assert_eq!(answer.unwrap(), "paid");
    let warnings = warnings_for(&key);
    assert!(
        warnings.iter().any(|w| w.message.contains("valid lease")),
        "no warning names the key of the failed release: {warnings:?}"
    );
    // A guard released by hand still says what the server says: the key was
    // not ours (someone else deleted it), so the lease did end early.
    let guard = env.client.lock(&key).ttl(secs(30)).acquire().await.unwrap();
    force_delete(&env.client, &key).await.unwrap();
    assert!(guard.release().await.unwrap_err().is_lost());
}

async fn with_lock_releases_the_lock_when_the_future_returns_an_error(env: Env) {
    let key = key("run-err");
    let other = env.other().await;
    let result: Result<Result<(), &str>, LockError> = env
        .client
        .with_lock(&key, async { Err("payment declined") })
        .await;
    assert!(matches!(result, Ok(Err("payment declined"))), "{result:?}");
    assert!(!is_held(&other, &key).await, "still held after the error");
}

async fn with_lock_releases_the_lock_when_the_future_panics_in_a_spawned_task(env: Env) {
    let key = key("run-panic");
    let other = env.other().await;
    let task = {
        let (client, key) = (env.client.clone(), key.clone());
        tokio::spawn(async move {
            client
                .lock(&key)
                .ttl(secs(30))
                .run(async {
                    tokio::task::yield_now().await;
                    panic!("boom inside the lock");
                })
                .await
        })
    };
    let err = task.await.unwrap_err();
    assert!(err.is_panic());
    let what = "the lock is freed after the panic";
    let took = taken_after(Instant::now(), &other, &key, secs(3), what).await;
    println!(
        "[{:?}] the lock of a panicked task (30 s lease) was free after {took:?}",
        env.kind
    );
    assert!(took < secs(1));
    watchdogs_stop(secs(1), &[&env.client]).await;
}

async fn with_lock_releases_the_lock_when_the_future_panics_in_the_caller(env: Env) {
    let key = key("run-panic-here");
    let other = env.other().await;
    let outcome = AssertUnwindSafe(env.client.lock(&key).ttl(secs(30)).run(async {
        tokio::task::yield_now().await;
        panic!("boom inside the lock");
    }))
    .catch_unwind()
    .await;
    assert!(outcome.is_err(), "the panic propagates");
    let what = "the lock is freed after the panic";
    assert!(current_lock().is_none(), "the scope ended with the panic");
    taken_after(Instant::now(), &other, &key, secs(3), what).await;
}

struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, SeqCst);
    }
}

async fn a_lost_lease_cancels_the_with_lock_future_and_returns_lost(env: Env) {
    let key = key("run-lost");
    let dropped = Arc::new(AtomicBool::new(false));
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let task = {
        let (client, key, dropped) = (env.client.clone(), key.clone(), dropped.clone());
        tokio::spawn(async move {
            client
                .lock(&key)
                .ttl(ms(300))
                .run(async move {
                    let _flag = SetOnDrop(dropped);
                    let _ = started_tx.send(());
                    std::future::pending::<()>().await;
                    "finished"
                })
                .await
        })
    };
    started_rx.await.unwrap();
    let deleted = Instant::now();
    force_delete(&env.client, &key).await.unwrap();
    let result = within(secs(3), "the lost scope returns", task)
        .await
        .unwrap();
    let took = deleted.elapsed();
    println!(
        "[{:?}] with_lock cancelled {took:?} after the lease was deleted",
        env.kind
    );
    match result {
        Err(LockError::Lost { key: k }) => assert_eq!(k, key),
        other => panic!("expected Lost, got {other:?}"),
    }
    assert!(dropped.load(SeqCst), "the future was not dropped");
    assert!(took < secs(1), "cancelled after {took:?}");
    watchdogs_stop(secs(1), &[&env.client]).await;
}

async fn nested_locking_of_the_same_key_reenters_and_the_outer_scope_keeps_ownership(env: Env) {
    let key = key("reenter");
    let other = env.other().await;
    let client = &env.client;
    let (done, outer_fence, waiter) = client
        .lock(&key)
        .ttl(secs(10))
        .run(async {
            let outer = current_lock().expect("outer scope");
            // with_lock tries once: going to the backend would be Busy.
            let inner = within(
                secs(2),
                "nested with_lock",
                client.with_lock(&key, async { current_lock().expect("inner scope") }),
            )
            .await
            .expect("nested with_lock re-enters");
            assert_eq!(inner, outer);
            let twice = within(
                secs(2),
                "doubly nested",
                client.with_lock(&key, async {
                    client.lock(&key).run(async { current_lock() }).await
                }),
            )
            .await
            .expect("re-enters")
            .expect("re-enters again");
            assert_eq!(twice, Some(outer.clone()));

            let guard = client
                .lock(&key)
                .acquire()
                .await
                .expect("acquire re-enters");
            assert!(guard.is_reentrant());
            assert_eq!(guard.key(), key);
            assert_eq!(guard.fencing_token(), outer.fencing_token);
            guard.release().await.expect("releasing a re-entered guard");
            let guard = client.lock(&key).acquire().await.unwrap();
            drop(guard);
            assert_eq!(current_lock(), Some(outer.clone()));

            // The inner scopes are over: the lock is still ours. Another task
            // cannot take it (a spawned task does not inherit the scope) ...
            tokio::time::sleep(ms(50)).await; // room for a wrong background release
            let probe = {
                let (other, key) = (other.clone(), key.clone());
                tokio::spawn(async move { is_held(&other, &key).await })
            };
            assert!(
                probe.await.unwrap(),
                "an inner scope released the outer lock"
            );
            // ... and a waiting task waits until the outer scope ends.
            let waiter = {
                let (other, key) = (other.clone(), key.clone());
                tokio::spawn(async move {
                    let guard = other.lock(&key).wait(secs(5)).acquire().await.unwrap();
                    let at = Instant::now();
                    let fence = guard.fencing_token();
                    guard.release().await.unwrap();
                    (at, fence)
                })
            };
            tokio::time::sleep(ms(200)).await;
            assert!(!waiter.is_finished(), "another task took the outer lock");
            (Instant::now(), outer.fencing_token, waiter)
        })
        .await
        .unwrap();
    let (taken_at, waiter_fence) = within(secs(3), "the waiter", waiter).await.unwrap();
    assert!(
        taken_at >= done,
        "the waiter got the lock before the outer scope ended"
    );
    assert!(waiter_fence > outer_fence);
}

async fn current_lock_gives_the_innermost_key_and_fence(env: Env) {
    let client = &env.client;
    let (a, b) = (key("outer"), key("inner"));
    // Give `b` a different fence from `a`'s.
    for _ in 0..3 {
        lock_and_release(client, &b).await;
    }
    assert_eq!(current_lock(), None);
    let plain = client.lock(&a).acquire().await.unwrap();
    assert_eq!(current_lock(), None, "a plain guard opens no scope");
    let plain_token = plain.fencing_token();
    plain.release().await.unwrap();
    client
        .with_lock(&a, async {
            let outer = current_lock().expect("outer");
            assert_eq!(outer.key, a);
            assert!(outer.fencing_token > plain_token);
            client
                .with_lock(&b, async {
                    let inner = current_lock().expect("inner");
                    assert_eq!(inner.key, b);
                    client
                        .with_lock(&a, async {
                            assert_eq!(
                                current_lock(),
                                Some(outer.clone()),
                                "re-entered `a` is innermost"
                            );
                        })
                        .await
                        .unwrap();
                    assert_eq!(current_lock(), Some(inner));
                })
                .await
                .unwrap();
            assert_eq!(current_lock(), Some(outer.clone()));
            let elsewhere = tokio::spawn(async { current_lock() }).await.unwrap();
            assert_eq!(elsewhere, None::<LockInfo>, "another task sees no scope");
        })
        .await
        .unwrap();
    assert_eq!(current_lock(), None);
}

async fn a_timed_out_waiting_acquire_leaves_nothing_held(env: Env) {
    let key = key("timed-out");
    let other = env.other().await;
    let holder = env.client.lock(&key).ttl(secs(10)).acquire().await.unwrap();
    let cancelled = tokio::time::timeout(
        ms(200),
        other.lock(&key).ttl(secs(30)).wait(secs(5)).acquire(),
    )
    .await;
    assert!(cancelled.is_err(), "the wait ended early: {cancelled:?}");
    holder.release().await.unwrap();
    tokio::time::sleep(ms(50)).await;
    assert!(
        !is_held(&env.client, &key).await,
        "the cancelled waiter holds the lock"
    );
    watchdogs_stop(secs(1), &[&env.client, &other]).await;
}

/// A wait that ends `Busy` has left the line by the time it answers: the
/// holder's release right after it frees the key instead of handing it to
/// the waiter that gave up.
async fn a_wait_that_ended_busy_is_out_of_the_line_when_it_answers(env: Env) {
    let key = key("gave-up");
    let other = env.other().await;
    for round in 0..20 {
        let holder = env.client.lock(&key).ttl(secs(10)).acquire().await.unwrap();
        let busy = other.lock(&key).ttl(secs(30)).wait(ms(20)).acquire().await;
        assert!(busy.unwrap_err().is_busy(), "round {round}");
        holder.release().await.unwrap();
        assert!(
            !is_held(&env.client, &key).await,
            "round {round}: the waiter that gave up got the lock"
        );
    }
}

/// A waiting acquire that is dropped leaves the line in the background; what
/// that clean-up logs names the key (it used to log `key=`).
async fn an_abandoned_waiting_acquire_is_cleaned_up_under_its_own_key_in_the_logs(env: Env) {
    let key = key("abandoned");
    core_support::watch_events(&key);
    let other = env.other().await;
    let holder = env.client.lock(&key).ttl(secs(30)).acquire().await.unwrap();
    let waiting = other.lock(&key).ttl(secs(30)).wait(secs(10)).acquire();
    // Long enough to queue behind the holder, far shorter than the wait.
    assert!(tokio::time::timeout(ms(300), waiting).await.is_err());
    eventually(secs(2), "the background clean-up is logged", || {
        core_support::events_for(&key)
            .iter()
            .any(|e| e.message.contains("background"))
    })
    .await;
    holder.release().await.unwrap();
}

async fn acquires_dropped_at_any_point_never_leave_a_lock_held(env: Env) {
    let key = key("cancelled");
    let other = env.other().await;
    let (mut completed, mut cancelled) = (0, 0);
    for i in 0..300u64 {
        // From "dropped before the first poll finished" to "just completed".
        let limit = Duration::from_micros((i * 37) % 500);
        let acquire = other.lock(&key).ttl(secs(30)).wait(secs(2)).acquire();
        // Timers fire at millisecond granularity, so on a fast loopback every
        // timed attempt may complete first; every tenth round is dropped
        // right after its first poll instead, whatever the clock does.
        let attempt = if i % 10 == 0 {
            acquire.now_or_never().ok_or(())
        } else {
            tokio::time::timeout(limit, acquire).await.map_err(|_| ())
        };
        match attempt {
            Ok(Ok(guard)) => {
                completed += 1;
                if i % 2 == 0 {
                    guard.release().await.unwrap();
                } else {
                    drop(guard);
                }
            }
            Ok(Err(e)) => panic!("round {i}: {e}"),
            Err(_) => cancelled += 1,
        }
        // A 30 s lease left behind would make this fail.
        let guard = within(
            secs(4),
            "the key is free again",
            env.client.lock(&key).ttl(secs(30)).wait(secs(2)).acquire(),
        )
        .await
        .unwrap_or_else(|e| panic!("round {i} (limit {limit:?}) left the lock held: {e}"));
        guard.release().await.unwrap();
    }
    println!(
        "[{:?}] 300 acquires under a timeout: {completed} completed, {cancelled} cancelled",
        env.kind
    );
    if env.is_redis() {
        assert!(cancelled > 0, "no acquire was cancelled mid-flight");
    }
    watchdogs_stop(secs(2), &[&env.client, &other]).await;
}

async fn bad_keys_are_invalid_key_errors_everywhere(env: Env) {
    let client = &env.client;
    let bad = [
        String::new(),
        "k".repeat(MAX_KEY_LEN + 1),
        "é".repeat(MAX_KEY_LEN / 2 + 1), // 1026 bytes, 513 characters
        "a\nb".into(),
        "nul\0".into(),
        "tab\t".into(),
        "del\u{7f}".into(),
        "nel\u{85}".into(),
    ];
    for key in &bad {
        let shown = format!("{:?}", key.chars().take(12).collect::<String>());
        let err = client.lock(key.clone()).acquire().await.unwrap_err();
        assert!(err.is_invalid_key(), "{shown}: acquire gave {err:?}");
        assert!(!err.to_string().is_empty());
        let ran = AtomicBool::new(false);
        let err = client
            .with_lock(key.clone(), async { ran.store(true, SeqCst) })
            .await
            .unwrap_err();
        assert!(err.is_invalid_key(), "{shown}: with_lock gave {err:?}");
        assert!(!ran.load(SeqCst));
        let err = force_delete(client, key).await.unwrap_err();
        assert!(err.is_invalid_key(), "{shown}: force_delete gave {err:?}");
    }
    let err = client.lock("").acquire().await.unwrap_err();
    assert!(err.to_string().contains("empty"), "{err}");
    let err = client
        .lock("k".repeat(MAX_KEY_LEN + 1))
        .acquire()
        .await
        .unwrap_err();
    assert!(err.to_string().contains(&MAX_KEY_LEN.to_string()), "{err}");
    // The limits themselves, and unusual but valid keys, work.
    for key in [
        "k".repeat(MAX_KEY_LEN),
        "é".repeat(MAX_KEY_LEN / 2),
        "ünïcödé key with spaces".into(),
        "{tenant:7}:order:1".into(),
        "{}".into(),
        "}{".into(),
        "*?[]".into(),
    ] {
        let guard = client
            .lock(key.clone())
            .acquire()
            .await
            .unwrap_or_else(|e| panic!("{key}: {e}"));
        assert_eq!(guard.key(), key);
        assert!(is_held(&env.other().await, &key).await);
        guard.release().await.unwrap();
    }
}

async fn bad_leases_are_config_errors_and_the_limits_themselves_work(env: Env) {
    let client = &env.client;
    for ttl in [
        Duration::ZERO,
        Duration::from_nanos(1),
        MIN_TTL - Duration::from_millis(1),
        MAX_TTL + Duration::from_secs(1),
        Duration::MAX,
    ] {
        let err = client
            .lock(key("ttl"))
            .ttl(ttl)
            .acquire()
            .await
            .unwrap_err();
        assert!(err.is_config(), "ttl {ttl:?}: {err:?}");
        let err = client
            .lock(key("ttl"))
            .ttl(ttl)
            .run(async {})
            .await
            .unwrap_err();
        assert!(err.is_config(), "ttl {ttl:?}: {err:?}");
        let err = env.builder().default_ttl(ttl).build().await.unwrap_err();
        assert!(err.is_config(), "default_ttl {ttl:?}: {err:?}");
    }
    let err = client
        .lock(key("ttl"))
        .ttl(Duration::ZERO)
        .acquire()
        .await
        .unwrap_err();
    println!("[{:?}] zero ttl: {err}", env.kind);
    for ttl in [MIN_TTL, MAX_TTL] {
        let key = key("ttl-limit");
        let guard = client.lock(&key).ttl(ttl).acquire().await.unwrap();
        let left = remaining(&env.other().await, &key).await;
        assert!(
            left <= ttl && left >= ttl.saturating_sub(secs(2)),
            "{ttl:?}: {left:?}"
        );
        guard.release().await.unwrap();
    }
}

async fn a_wait_of_duration_max_waits_without_panicking(env: Env) {
    let key = key("wait-forever");
    let client = env.client.clone();
    let k = key.clone();
    // "Wait as long as it takes" is a natural thing to write.
    let outcome = tokio::spawn(async move {
        client
            .lock(&k)
            .wait(Duration::MAX)
            .acquire()
            .await
            .map(|g| g.fencing_token())
    })
    .await;
    match outcome {
        Ok(Ok(fence)) => assert_eq!(fence, 1),
        Ok(Err(e)) => panic!("wait(Duration::MAX) on a free key failed: {e}"),
        Err(e) => panic!("wait(Duration::MAX) panicked: {e}"),
    }
}

async fn cancelling_a_with_lock_future_releases_its_lock(env: Env) {
    let key = key("run-cancelled");
    let other = env.other().await;
    let entered = Arc::new(AtomicBool::new(false));
    let work = {
        let entered = entered.clone();
        env.client.lock(&key).ttl(secs(30)).run(async move {
            entered.store(true, SeqCst);
            std::future::pending::<()>().await
        })
    };
    assert!(tokio::time::timeout(ms(100), work).await.is_err());
    assert!(entered.load(SeqCst), "the future never ran");
    let what = "the cancelled scope's lock is released";
    let took = taken_after(Instant::now(), &other, &key, secs(3), what).await;
    assert!(took < secs(1), "free after {took:?}");
    watchdogs_stop(secs(1), &[&env.client]).await;
}

async fn waiters_cancelled_around_a_release_never_strand_the_others(env: Env) {
    let key = key("cancel-storm");
    let other = env.other().await;
    let mut slowest = Duration::ZERO;
    for round in 0..20u64 {
        // Long leases: only hand-overs and releases can make the waiters fast.
        let holder = env.client.lock(&key).ttl(secs(10)).acquire().await.unwrap();
        let mut live = Vec::new();
        for i in 0..6u64 {
            let client = if i % 2 == 0 {
                other.clone()
            } else {
                env.client.clone()
            };
            let request = client.lock(&key).ttl(secs(10)).wait(secs(5));
            if i % 2 == 1 {
                // Abandoned around the moment of the release.
                let limit = ms(40 + (round * 7 + i * 3) % 20);
                tokio::spawn(async move {
                    if let Ok(Ok(guard)) = tokio::time::timeout(limit, request.acquire()).await {
                        guard.release().await.unwrap();
                    }
                });
            } else {
                live.push(tokio::spawn(async move {
                    let guard = request
                        .acquire()
                        .await
                        .expect("a live waiter gets the lock");
                    tokio::time::sleep(ms(1)).await;
                    guard.release().await.unwrap();
                }));
            }
        }
        tokio::time::sleep(ms(50)).await;
        let released = Instant::now();
        holder.release().await.unwrap();
        for waiter in live {
            within(secs(3), "a live waiter behind abandoned ones", waiter)
                .await
                .unwrap();
        }
        slowest = slowest.max(released.elapsed());
        let free = within(
            secs(3),
            "the key is free",
            env.client.lock(&key).wait(secs(2)).acquire(),
        )
        .await
        .unwrap_or_else(|e| panic!("round {round}: an abandoned waiter left the lock held: {e}"));
        assert!(free.fencing_token() > 0);
        free.release().await.unwrap();
    }
    println!(
        "[{:?}] 20 rounds of 3 live and 3 abandoned waiters: slowest round {slowest:?} from release to the last live waiter done",
        env.kind
    );
}

async fn acquire_renewal_release_and_loss_are_traced(env: Env) {
    let key = key("traced");
    core_support::watch_events(&key);
    let other = env.other().await;
    let holder = env.client.lock(&key).ttl(secs(10)).acquire().await.unwrap();
    let waiter = {
        let (other, key) = (other.clone(), key.clone());
        tokio::spawn(async move { other.lock(&key).wait(secs(5)).acquire().await })
    };
    tokio::time::sleep(ms(50)).await;
    holder.release().await.unwrap();
    let guard = within(secs(5), "the waiter", waiter)
        .await
        .unwrap()
        .unwrap();
    guard.release().await.unwrap();
    assert!(warnings_for(&key).is_empty(), "{:?}", warnings_for(&key));
    let guard = env.client.lock(&key).ttl(ms(300)).acquire().await.unwrap();
    tokio::time::sleep(ms(200)).await; // at least one renewal
    force_delete(&env.client, &key).await.unwrap();
    within(secs(2), "the loss", guard.lost()).await;
    drop(guard);
    tokio::time::sleep(ms(20)).await;

    let events = core_support::events_for(&key);
    for e in &events {
        println!(
            "[{:?}] {:>5} {} {:?}",
            env.kind, e.level, e.message, e.fields
        );
    }
    let with_wait_time = events
        .iter()
        .filter(|e| e.message.contains("acquired") && e.fields.iter().any(|f| f.contains("wait")))
        .count();
    assert!(
        with_wait_time >= 3,
        "3 acquisitions, {with_wait_time} traced with their wait time"
    );
    assert!(
        events.iter().any(|e| e.message.contains("renew")),
        "no renewal event"
    );
    assert!(
        events.iter().any(|e| e.message.contains("released")),
        "no release event"
    );
    assert!(
        events
            .iter()
            .any(|e| e.level == tracing::Level::WARN && e.message.contains("lost")),
        "no warning for the loss"
    );
}

// ---- The embedded backend on tokio's paused clock --------------------------

#[tokio::test(start_paused = true)]
async fn the_embedded_backend_follows_tokios_paused_clock() {
    let client = LockClient::builder().memory().build().await.unwrap();
    // A renewed lease survives an hour of (auto-advanced) virtual time.
    let kept = client.lock("kept").ttl(secs(10)).acquire().await.unwrap();
    tokio::time::sleep(secs(3600)).await;
    assert!(!kept.is_lost());
    assert!(is_held(&client, "kept").await);
    // A fixed lease ends at its TTL in virtual time, and a waiter takes over.
    let started = tokio::time::Instant::now();
    let fixed = fixed_lease(&client, "fixed", secs(10)).await.unwrap();
    let next = client.lock("fixed").wait(secs(60)).acquire().await.unwrap();
    let at = started.elapsed();
    assert!(
        at >= secs(10) && at < secs(11),
        "taken over at {at:?} of virtual time"
    );
    assert!(fixed.is_lost());
    assert!(next.fencing_token() > fixed.fencing_token());
    next.release().await.unwrap();
    kept.release().await.unwrap();
}

#[test]
fn the_public_types_can_cross_tasks_and_threads() {
    fn send_sync<T: Send + Sync + 'static>() {}
    fn send_static<T: Send + 'static>(_: &T) {}
    send_sync::<LockClient>();
    send_sync::<lock_runtime::LockRequest>();
    send_sync::<lock_runtime::LockGuard>();
    send_sync::<LockError>();
    send_sync::<LockInfo>();
    fn error<E: std::error::Error + Send + Sync + 'static>() {}
    error::<LockError>();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let client = LockClient::builder().memory().build().await.unwrap();
        let guard = client.lock("k").acquire().await.unwrap();
        send_static(&guard.lost());
        send_static(&client.lock("k").acquire());
        send_static(&client.lock("k").run(async {}));
        guard.release().await.unwrap();
    });
}

// ---- The builder: no backend needed ---------------------------------------

#[tokio::test]
async fn a_builder_without_a_backend_is_a_config_error() {
    let err = LockClient::builder().build().await.unwrap_err();
    assert!(err.is_config(), "{err:?}");
    assert!(
        err.to_string().contains("memory") && err.to_string().contains("redis"),
        "{err}"
    );
}

#[tokio::test]
async fn a_prefix_with_braces_or_control_characters_or_too_long_is_a_config_error() {
    for prefix in [
        "lock{".to_string(),
        "}lock".into(),
        "{x}:".into(),
        "a\nb".into(),
        "p".repeat(129),
    ] {
        let err = LockClient::builder()
            .memory()
            .key_prefix(prefix.clone())
            .build()
            .await
            .unwrap_err();
        assert!(err.is_config(), "prefix {prefix:?}: {err:?}");
    }
    for prefix in ["", "app:locks:", "p".repeat(128).as_str()] {
        let client = LockClient::builder()
            .memory()
            .key_prefix(prefix)
            .build()
            .await
            .unwrap();
        assert_eq!(client.key_prefix(), prefix);
        lock_and_release(&client, "k").await;
    }
}

#[tokio::test]
async fn malformed_urls_are_config_errors() {
    for url in [
        "",
        "not a url",
        "http://127.0.0.1:6379",
        "redis://127.0.0.1:notaport",
        "redis://127.0.0.1:99999",
        "redis://127.0.0.1:6379/notadb",
        "unix",
    ] {
        let started = Instant::now();
        let result = LockClient::builder().redis(url).build().await;
        match result {
            Err(e) => {
                assert!(e.is_config(), "{url:?}: {e:?}");
                assert!(
                    started.elapsed() < ms(500),
                    "{url:?}: a parse error took {:?}",
                    started.elapsed()
                );
            }
            Ok(_) => panic!("{url:?} was accepted"),
        }
    }
}

#[tokio::test]
async fn a_password_in_a_url_is_never_echoed_in_errors_or_debug_output() {
    let port = test_support::free_port();
    let url = format!("redis://user:s3cr3t-pw@127.0.0.1:{port}/notadb");
    let err = LockClient::builder().redis(&url).build().await.unwrap_err();
    assert!(!format!("{err} {err:?}").contains("s3cr3t-pw"), "{err:?}");
    let url = format!("redis://user:s3cr3t-pw@127.0.0.1:{port}");
    let builder = LockClient::builder().redis(&url);
    assert!(!format!("{builder:?}").contains("s3cr3t-pw"));
    let err = builder.connect_timeout(ms(500)).build().await.unwrap_err();
    assert!(!format!("{err} {err:?}").contains("s3cr3t-pw"), "{err:?}");
}

#[tokio::test]
async fn an_unreachable_server_at_build_is_a_backend_error() {
    // A port with nothing listening on it.
    let port = test_support::free_port();
    let started = Instant::now();
    let err = redis_url_client(format!("redis://127.0.0.1:{port}"))
        .await
        .unwrap_err();
    let took = started.elapsed();
    println!(
        "unreachable server: {} (after {took:?})",
        test_support::error_chain(&err)
    );
    assert!(err.is_backend(), "{err:?}");
    assert!(err.is_connection(), "{err:?}");
    assert!(
        !err.to_string().contains("refused"),
        "the source is not repeated: {err}"
    );
    assert!(took < secs(5), "took {took:?}");
}

#[tokio::test]
async fn rediss_without_the_tls_feature_is_a_config_error() {
    // This package does not enable lock-runtime's `tls` feature. (If a workspace
    // build unifies it in, the URL is accepted and the TLS handshake with this
    // port fails instead: a Backend error. Never Ok, never a panic.)
    let server = test_support::RedisServer::start();
    let url = format!("rediss://127.0.0.1:{}", server.port);
    let err = LockClient::builder()
        .redis(url)
        .connect_timeout(secs(1))
        .build()
        .await
        .unwrap_err();
    println!("rediss:// without tls: {err}");
    match &err {
        LockError::Config(message) => {
            assert!(message.to_lowercase().contains("tls"), "{message}")
        }
        LockError::Backend(_) => println!("(the tls feature is enabled in this build)"),
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test]
async fn zero_timeouts_are_config_errors() {
    type Configure = fn(LockClientBuilder) -> LockClientBuilder;
    let zero: [(&str, Configure); 2] = [
        ("connect", |b| b.connect_timeout(Duration::ZERO)),
        ("response", |b| b.response_timeout(Duration::ZERO)),
    ];
    for (which, configure) in zero {
        let err = configure(LockClient::builder().memory()).build().await;
        let err = err.unwrap_err();
        assert!(err.is_config(), "{which} timeout: {err:?}");
    }
}

/// Builds a Redis client with `configure` applied, then takes and releases a
/// lock; a configuration error is fine, a panic is not.
async fn build_and_lock_without_panicking(
    what: &str,
    configure: impl FnOnce(lock_runtime::LockClientBuilder) -> lock_runtime::LockClientBuilder,
) {
    let server = test_support::RedisServer::start();
    let builder = configure(LockClient::builder().redis(server.url()));
    let outcome = tokio::spawn(async move {
        let client = builder.build().await?;
        client.lock("k").acquire().await?.release().await
    })
    .await;
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(e)) => assert!(e.is_config(), "{what}: {e:?}"),
        Err(e) => panic!("{what} panicked: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_timeout_of_duration_max_never_panics() {
    build_and_lock_without_panicking("connect_timeout(Duration::MAX)", |b| {
        b.connect_timeout(Duration::MAX)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_timeout_of_duration_max_never_panics() {
    build_and_lock_without_panicking("response_timeout(Duration::MAX)", |b| {
        b.response_timeout(Duration::MAX)
    })
    .await;
}
