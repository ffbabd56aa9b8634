//! One options value, one hold step, one release path: a key
//! taken by `lock_all` is held and released by the same steps as one taken
//! by `lock`, so `hold_at_least` keeps every key of the set, whether the
//! guard is released or dropped, and a task of the same client waiting for
//! one of the keys is not handed it before the minimum; on the embedded
//! backend and on Redis.

use std::time::{Duration, Instant};

use lock_runtime::LockClient;
use test_support::RedisServer;
use test_support::helpers::{is_held, memory_client, ms, secs, two_clients, within};

const MIN: Duration = Duration::from_millis(600);

/// `a` takes `keys` with the minimum hold and gives them back at once
/// (released, or the guard dropped); `b` finds each taken until the
/// minimum has passed, and free soon after (long before the 20 s lease).
async fn every_key_stays_taken_until_the_minimum(
    a: &LockClient,
    b: &LockClient,
    keys: [&str; 2],
    dropped: bool,
) {
    let all = a
        .lock_all(keys)
        .ttl(secs(20))
        .hold_at_least(MIN)
        .acquire()
        .await
        .unwrap();
    let acquired = Instant::now();
    if dropped {
        drop(all);
        tokio::time::sleep(ms(100)).await; // the background release
    } else {
        all.release().await.unwrap();
    }
    for key in keys {
        assert!(is_held(b, key).await, "{key} was freed before its minimum");
    }
    tokio::time::sleep((acquired + MIN + ms(300)).saturating_duration_since(Instant::now())).await;
    for key in keys {
        assert!(!is_held(b, key).await, "{key} was kept past its minimum");
    }
}

/// A `lock_all` that waited holds its keys' lines in its client, as a
/// waiting `lock` does; releasing under the minimum hold keeps the key, so
/// the task of the same client waiting for it gets it only afterwards.
async fn a_waiting_task_of_the_client_is_not_handed_a_kept_key(a: &LockClient) {
    let all = a
        .lock_all(["seams:line:1", "seams:line:2"])
        .ttl(secs(20))
        .wait(secs(2))
        .hold_at_least(MIN)
        .acquire()
        .await
        .unwrap();
    let acquired = Instant::now();
    let waiter = {
        let a = a.clone();
        tokio::spawn(async move {
            // The same lease: a line holds tasks that ask for the same.
            let waiting = a.lock("seams:line:1").ttl(secs(20)).wait(secs(10));
            let guard = waiting.acquire().await?;
            let at = Instant::now();
            guard.release().await?;
            Ok::<_, lock_runtime::LockError>(at)
        })
    };
    tokio::time::sleep(ms(50)).await;
    all.release().await.unwrap();
    let at = within(secs(5), "the waiter", waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(
        at - acquired >= MIN,
        "handed the key {:?} after acquisition, before its minimum of {MIN:?}",
        at - acquired
    );
}

async fn all_checks(a: &LockClient, b: &LockClient) {
    every_key_stays_taken_until_the_minimum(a, b, ["seams:r:1", "seams:r:2"], false).await;
    every_key_stays_taken_until_the_minimum(a, b, ["seams:d:1", "seams:d:2"], true).await;
    a_waiting_task_of_the_client_is_not_handed_a_kept_key(a).await;
}

#[tokio::test]
async fn lock_all_keeps_what_lock_keeps_on_the_embedded_backend() {
    let client = memory_client().await;
    all_checks(&client, &client).await;
}

#[tokio::test]
async fn lock_all_keeps_what_lock_keeps_on_one_redis() {
    let server = RedisServer::start();
    let (a, b) = two_clients(&LockClient::builder().redis(server.url())).await;
    all_checks(&a, &b).await;
}
