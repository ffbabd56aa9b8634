//! What `LockError::Busy`'s `retry_after` (and so `LockLayer`'s `Retry-After`)
//! is worth to a client that obeys it: a hint from the client's recent hold
//! times, bounded by the holder's remaining lease, so a retry at that moment
//! comes soon after a short holder released, not a whole lease later. Every
//! `async fn` taking an [`Env`] runs on the embedded backend and on Redis.

use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockError};

use test_support::helpers::*;
use tests::both_backends;
use tests::core_support::Env;

both_backends! {
    a_client_that_obeys_retry_after_gets_the_lock_within_a_small_multiple_of_the_hold_time,
    a_key_this_client_never_held_hints_what_its_other_holds_took,
    a_client_that_released_nothing_yet_hints_the_remaining_lease,
    records_settled_in_a_moment_say_nothing_of_how_long_a_lock_is_held,
}

/// How long the holders below keep the key: far below their lease.
const HOLD: Duration = Duration::from_millis(300);
/// Their lease: what `retry_after` used to be.
const LEASE: Duration = Duration::from_secs(30);

/// Holds `key` on `client` for [`HOLD`], `times` times in a row.
async fn hold_briefly(client: &LockClient, key: &str, times: usize) {
    for _ in 0..times {
        let guard = client.lock(key).ttl(LEASE).acquire().await.unwrap();
        tokio::time::sleep(HOLD).await;
        guard.release().await.unwrap();
    }
}

/// Tries `key` once on `client`: the `retry_after` of its `Busy`.
async fn busy_hint(client: &LockClient, key: &str) -> Duration {
    match client.lock(key).ttl(LEASE).acquire().await {
        Err(LockError::Busy { retry_after, .. }) => retry_after,
        other => panic!("expected Busy, got {other:?}"),
    }
}

async fn a_client_that_obeys_retry_after_gets_the_lock_within_a_small_multiple_of_the_hold_time(
    env: Env,
) {
    let key = key("obeys");
    hold_briefly(&env.client, &key, 3).await;

    // A holder that keeps the key HOLD under a 30 s lease, and a caller that
    // tries once and sleeps what each `Busy` says before trying again.
    let holder = env.client.lock(&key).ttl(LEASE).acquire().await.unwrap();
    let started = Instant::now();
    let release = tokio::spawn(async move {
        tokio::time::sleep(HOLD).await;
        holder.release().await.unwrap();
    });
    let mut hints = Vec::new();
    let guard = loop {
        match env.client.lock(&key).ttl(LEASE).acquire().await {
            Ok(guard) => break guard,
            Err(LockError::Busy { retry_after, .. }) => {
                assert!(
                    retry_after <= 2 * HOLD,
                    "[{:?}] retry_after {retry_after:?} for a holder that keeps the key {HOLD:?}",
                    env.kind
                );
                hints.push(retry_after);
                tokio::time::sleep(retry_after).await;
            }
            Err(e) => panic!("unexpected {e}"),
        }
        assert!(
            started.elapsed() < 10 * HOLD,
            "[{:?}] still busy after {:?}, hints {hints:?}",
            env.kind,
            started.elapsed()
        );
    };
    let took = started.elapsed();
    println!(
        "[{:?}] obeying retry_after ({hints:?}) got a key held {HOLD:?} after {took:?}",
        env.kind
    );
    assert!(!hints.is_empty(), "the first try found the key free");
    assert!(
        took <= 3 * HOLD,
        "[{:?}] took {took:?} for a hold of {HOLD:?} (hints {hints:?})",
        env.kind
    );
    guard.release().await.unwrap();
    release.await.unwrap();
}

async fn a_key_this_client_never_held_hints_what_its_other_holds_took(env: Env) {
    let (held_before, busy) = (key("held-before"), key("never-held"));
    let other = env.other().await;
    hold_briefly(&other, &held_before, 2).await;
    let holder = env.client.lock(&busy).ttl(LEASE).acquire().await.unwrap();
    let hint = busy_hint(&other, &busy).await;
    assert!(
        hint >= HOLD / 2 && hint <= 2 * HOLD,
        "[{:?}] retry_after {hint:?}: expected about {HOLD:?}, what this client's holds took",
        env.kind
    );
    holder.release().await.unwrap();
}

async fn a_client_that_released_nothing_yet_hints_the_remaining_lease(env: Env) {
    let key = key("fresh");
    let holder = env.client.lock(&key).ttl(LEASE).acquire().await.unwrap();
    let hint = busy_hint(&env.client, &key).await;
    assert!(
        hint > LEASE - Duration::from_secs(2) && hint <= LEASE,
        "[{:?}] retry_after {hint:?}: with no hold to go by, the remaining lease",
        env.kind
    );
    holder.release().await.unwrap();
}

/// A record claimed and completed at once (an idempotent request that took
/// a millisecond) is not a hold of a lock: a busy lock of a client that
/// released no lock yet still hints the holder's remaining lease, not the
/// record's millisecond (which sent a `LockLayer`'s clients back after one
/// second to a handler that runs for thirty).
async fn records_settled_in_a_moment_say_nothing_of_how_long_a_lock_is_held(env: Env) {
    use lock_runtime::Claimed;
    for i in 0..3 {
        let Claimed::Run(record) = env
            .client
            .record(key(&format!("quick-{i}")))
            .claim()
            .await
            .unwrap()
        else {
            panic!("a fresh record is ours to run");
        };
        record.complete(b"done").await.unwrap();
    }
    let key = key("held-long");
    let holder = env.client.lock(&key).ttl(LEASE).acquire().await.unwrap();
    let hint = busy_hint(&env.client, &key).await;
    assert!(
        hint > LEASE - Duration::from_secs(2) && hint <= LEASE,
        "[{:?}] retry_after {hint:?}: no lock released yet, so the remaining lease",
        env.kind
    );
    holder.release().await.unwrap();
}

/// `POST /orders/{id}/pay` behind `LockLayer` (the client's 30 s default
/// lease), whose handler keeps the lock [`HOLD`].
fn slow_pay_app(client: LockClient) -> axum::Router {
    use axum::routing::post;
    axum::Router::new().route(
        "/orders/{id}/pay",
        post(|| async {
            tokio::time::sleep(HOLD).await;
            "paid"
        })
        .route_layer(lock_runtime::LockLayer::new(client).key("order:<id>")),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_route_answers_the_retry_after_of_its_handlers_hold_time_not_of_the_lease() {
    use http::StatusCode;
    use test_support::http::{send, serve};

    let base = serve(slow_pay_app(memory_client().await)).await;
    let http = reqwest::Client::new();
    let pay = format!("{base}/orders/7/pay");
    for _ in 0..2 {
        assert_eq!(send(http.post(&pay)).await.status(), StatusCode::OK);
    }

    let first = tokio::spawn(send(http.post(&pay)));
    tokio::time::sleep(HOLD / 4).await;
    let busy = send(http.post(&pay)).await;
    assert_eq!(busy.status(), StatusCode::CONFLICT);
    let retry_after: u64 = busy.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    // A 0.3 s hold rounds up to 1 s; the lease would say 30.
    assert_eq!(retry_after, 1, "Retry-After: {retry_after}");
    assert_eq!(first.await.unwrap().status(), StatusCode::OK);

    tokio::time::sleep(Duration::from_secs(retry_after)).await;
    assert_eq!(send(http.post(&pay)).await.status(), StatusCode::OK);
}
