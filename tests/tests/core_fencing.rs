//! The runtime core, fencing tokens: they only increase, and a stale
//! guard cannot touch the new holder's lock; written once and run on both backends: every `async fn` below taking an
//! [`Env`] becomes `memory::<name>` and `redis::<name>` (a `redis-server` of its
//! own per test; `tests::core_support`), so the embedded backend and Redis
//! cannot drift apart.

use lock_runtime::__private::testing::force_delete;
use lock_runtime::{LockError, LockGuard};

use test_support::helpers::*;
use tests::both_backends;
use tests::core_support::Env;

// Braces: rustfmt leaves the list (and its attributes) alone.
both_backends! {
    fencing_tokens_strictly_increase_across_releases_expiry_deletes_and_clients,
    concurrent_acquisitions_get_distinct_increasing_fencing_tokens,
    a_stale_guard_cannot_release_the_new_holders_lock,
    a_stale_guard_cannot_extend_the_new_holders_lock,
}

async fn fencing_tokens_strictly_increase_across_releases_expiry_deletes_and_clients(env: Env) {
    let key = key("fence");
    let other = env.other().await;
    let mut seen = Vec::new();

    // Released by its holder, then another client.
    for client in [&env.client, &other, &env.client] {
        let guard = client.lock(&key).acquire().await.unwrap();
        seen.push(guard.fencing_token().await.unwrap());
        guard.release().await.unwrap();
    }
    // Expired (fixed lease), then taken by the other client.
    let expired = fixed_lease(&env.client, &key, ms(100)).await.unwrap();
    seen.push(expired.fencing_token().await.unwrap());
    within(secs(2), "the fixed lease ends", expired.lost()).await;
    let next = other.lock(&key).wait(secs(1)).acquire().await.unwrap();
    seen.push(next.fencing_token().await.unwrap());
    next.release().await.unwrap();
    drop(expired);
    // Deleted by an operator while held.
    let deleted = env.client.lock(&key).acquire().await.unwrap();
    seen.push(deleted.fencing_token().await.unwrap());
    force_delete(&env.client, &key).await.unwrap();
    let next = other.lock(&key).acquire().await.unwrap();
    seen.push(next.fencing_token().await.unwrap());
    assert!(deleted.release().await.unwrap_err().is_lost());
    next.release().await.unwrap();
    // Dropped.
    let dropped = other.lock(&key).acquire().await.unwrap();
    seen.push(dropped.fencing_token().await.unwrap());
    drop(dropped);
    let next = env.client.lock(&key).wait(secs(1)).acquire().await.unwrap();
    seen.push(next.fencing_token().await.unwrap());
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
    let (t1, _) = (
        first.fencing_token().await.unwrap(),
        first.release().await.unwrap(),
    );
    let second = env.client.lock(&unrelated).acquire().await.unwrap();
    assert!(
        second.fencing_token().await.unwrap() > t1,
        "{t1} then {}",
        second.fencing_token().await.unwrap()
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
                    mine.push(guard.fencing_token().await.unwrap());
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
    // Asked while it held the lock: a token is minted only for a live lease.
    let stale_token = stale.fencing_token().await.unwrap();
    within(secs(2), "the stale lease ends", stale.lost()).await;
    // Once the lease ended the guard answers `Lost`, also for a token it
    // had: the same answer on every backend (whether its token was minted
    // at acquire or on first use), so a holder that asks before each write
    // stops writing.
    let asked = stale.fencing_token().await;
    assert!(
        matches!(asked, Err(ref e) if e.is_lost()),
        "the token of an ended lease: {asked:?}"
    );
    let holder = fixed_lease_waiting(&other, &key, secs(10), secs(1))
        .await
        .unwrap();
    assert!(holder.fencing_token().await.unwrap() > stale_token);
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
