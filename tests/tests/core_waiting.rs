//! The runtime core, waiting: wakes on a release, `Busy` at the
//! deadline, and waits that end or are dropped leave nothing behind; written once and run on both backends: every `async fn` below taking an
//! [`Env`] becomes `memory::<name>` and `redis::<name>` (a `redis-server` of its
//! own per test; `tests::core_support`), so the embedded backend and Redis
//! cannot drift apart.

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use lock_runtime::{LockClient, LockError, LockGuard};

use test_support::helpers::*;
use tests::both_backends;
use tests::core_support;
use tests::core_support::Env;

// Braces: rustfmt leaves the list (and its attributes) alone.
both_backends! {
    a_waiter_wakes_within_milliseconds_of_a_release,
    wait_zero_tries_once_and_reports_busy_with_the_holders_remaining_lease,
    busy_after_a_wait_respects_the_deadline,
    a_timed_out_waiting_acquire_leaves_nothing_held,
    a_wait_that_ended_busy_is_out_of_the_line_when_it_answers,
    acquires_dropped_at_any_point_never_leave_a_lock_held,
    an_abandoned_waiting_acquire_is_cleaned_up_under_its_own_key_in_the_logs,
    waiters_cancelled_around_a_release_never_strand_the_others,
    a_wait_of_duration_max_waits_without_panicking,
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

async fn a_wait_of_duration_max_waits_without_panicking(env: Env) {
    let key = key("wait-forever");
    let client = env.client.clone();
    let k = key.clone();
    // "Wait as long as it takes" is a natural thing to write.
    let outcome = tokio::spawn(async move {
        let guard = client.lock(&k).wait(Duration::MAX).acquire().await?;
        guard.fencing_token().await
    })
    .await;
    match outcome {
        Ok(Ok(fence)) => assert_eq!(fence, 1),
        Ok(Err(e)) => panic!("wait(Duration::MAX) on a free key failed: {e}"),
        Err(e) => panic!("wait(Duration::MAX) panicked: {e}"),
    }
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
        assert!(free.fencing_token().await.unwrap() > 0);
        free.release().await.unwrap();
    }
    println!(
        "[{:?}] 20 rounds of 3 live and 3 abandoned waiters: slowest round {slowest:?} from release to the last live waiter done",
        env.kind
    );
}
