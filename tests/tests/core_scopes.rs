//! The runtime core, scopes: `with_lock` and dropped guards release,
//! whatever the work does (completes, fails, panics, is cancelled, loses its
//! lease); nested locking re-enters and `current_lock` names the innermost; written once and run on both backends: every `async fn` below taking an
//! [`Env`] becomes `memory::<name>` and `redis::<name>` (a `redis-server` of its
//! own per test; `tests::core_support`), so the embedded backend and Redis
//! cannot drift apart.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::time::Instant;

use futures_util::FutureExt;
use lock_runtime::__private::testing::force_delete;
use lock_runtime::{LockError, LockInfo, current_lock};

use test_support::helpers::*;
use tests::both_backends;
use tests::core_support::{Env, warnings_for};

// Braces: rustfmt leaves the list (and its attributes) alone.
both_backends! {
    dropping_a_guard_releases_the_lock_in_the_background,
    with_lock_releases_the_lock_when_the_future_completes,
    work_that_finished_under_a_valid_lease_keeps_its_output_whatever_the_release_answers,
    with_lock_releases_the_lock_when_the_future_returns_an_error,
    with_lock_releases_the_lock_when_the_future_panics_in_a_spawned_task,
    with_lock_releases_the_lock_when_the_future_panics_in_the_caller,
    a_lost_lease_cancels_the_with_lock_future_and_returns_lost,
    nested_locking_of_the_same_key_reenters_and_the_outer_scope_keeps_ownership,
    a_reentered_guard_kept_past_its_outer_scope_is_lost,
    current_lock_gives_the_innermost_key_and_fence,
    cancelling_a_with_lock_future_releases_its_lock,
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

/// Redisson's `testWriteReadReentrancy` keeps a read lock taken inside a
/// write lock after the write lock's release (a downgrade). A re-entered
/// guard here has no lease of its own: kept past the end of the scope it
/// re-entered, it holds nothing, so it says so: lost, its `lost()`
/// resolves, its release answers `Lost`, and another client takes the key.
async fn a_reentered_guard_kept_past_its_outer_scope_is_lost(env: Env) {
    let key = key("escaped-reentry");
    let other = env.other().await;
    let client = &env.client;
    let (inner, lost) = client
        .lock(&key)
        .run(async {
            let inner = client.lock(&key).acquire().await.expect("re-enters");
            assert!(inner.is_reentrant() && !inner.is_lost());
            let lost = inner.lost();
            (inner, lost)
        })
        .await
        .unwrap();
    assert!(
        inner.is_lost(),
        "a re-entered guard outliving its outer scope"
    );
    within(secs(1), "the re-entered guard's lost()", lost).await;
    within(secs(1), "lost() asked after the end", inner.lost()).await;
    let taken = other.lock(&key).acquire().await;
    assert!(taken.is_ok(), "the key is free: {taken:?}");
    assert!(matches!(inner.release().await, Err(LockError::Lost { .. })));
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
            assert_eq!(
                guard.fencing_token().await.unwrap(),
                outer.fencing_token().await.unwrap()
            );
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
                    let fence = guard.fencing_token().await.unwrap();
                    guard.release().await.unwrap();
                    (at, fence)
                })
            };
            tokio::time::sleep(ms(200)).await;
            assert!(!waiter.is_finished(), "another task took the outer lock");
            (Instant::now(), outer.fencing_token().await.unwrap(), waiter)
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
    let plain_token = plain.fencing_token().await.unwrap();
    plain.release().await.unwrap();
    client
        .with_lock(&a, async {
            let outer = current_lock().expect("outer");
            assert_eq!(outer.key, a);
            assert!(outer.fencing_token().await.unwrap() > plain_token);
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
