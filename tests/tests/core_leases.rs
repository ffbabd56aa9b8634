//! The runtime core, leases: mutual exclusion, a lease's end, the
//! watchdog's renewals and `lost()`, and what they trace; written once and run on both backends: every `async fn` below taking an
//! [`Env`] becomes `memory::<name>` and `redis::<name>` (a `redis-server` of its
//! own per test; `tests::core_support`), so the embedded backend and Redis
//! cannot drift apart.

use std::time::{Duration, Instant};

use lock_runtime::__private::testing::force_delete;
use lock_runtime::{LockClient, LockError};

use test_support::helpers::*;
use tests::both_backends;
use tests::core_support;
use tests::core_support::{Env, warnings_for};

// Braces: rustfmt leaves the list (and its attributes) alone.
both_backends! {
    sixty_four_tasks_doing_read_modify_write_under_one_lock_end_with_the_exact_count,
    a_forgotten_fixed_lease_guard_frees_the_key_after_its_ttl,
    a_forgotten_renewing_guard_keeps_the_key_while_its_client_lives,
    an_external_delete_makes_lost_resolve_within_about_a_third_of_the_ttl,
    a_holder_with_a_300ms_lease_keeps_the_lock_for_two_seconds_through_the_watchdog,
    a_fixed_lease_is_lost_at_its_end_and_run_is_cancelled_then,
    a_waiter_falls_back_to_the_holders_ttl_when_the_holder_dies_without_releasing,
    ten_thousand_acquire_release_cycles_leave_no_watchdog_and_no_task,
    dropping_a_guard_outside_a_runtime_stops_its_watchdog_and_the_lease_runs_out,
    acquire_renewal_release_and_loss_are_traced,
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
    // One token per increment, rising in the order of the increments (with
    // gaps: a hot key's in-process hand-overs take tokens in blocks).
    assert_eq!(run.fences.len(), 64, "{:?}", run.fences);
    assert!(
        run.fences.windows(2).all(|w| w[0] < w[1]),
        "{:?}",
        run.fences
    );
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
    // One warning a lost lease: its release, which finds it gone, says
    // nothing more at that level (2,000 lost leases made 4,000 lines).
    let warnings = warnings_for(&key);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
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
    let fixed_token = fixed.fencing_token().await.unwrap();
    let next = client.lock("fixed").wait(secs(60)).acquire().await.unwrap();
    let at = started.elapsed();
    assert!(
        at >= secs(10) && at < secs(11),
        "taken over at {at:?} of virtual time"
    );
    assert!(fixed.is_lost());
    assert!(next.fencing_token().await.unwrap() > fixed_token);
    next.release().await.unwrap();
    kept.release().await.unwrap();
}
