//! `LockClient::shutdown`: what a service holds as it exits goes back to
//! the server before the runtime ends. Without it, a guard alive or dropped
//! as `main` returns is released by a task of a runtime that is shutting
//! down, which never runs: the keys stay taken for the rest of their leases
//! (an operator saw 3 of 3 keys left for 30 s in 5 runs of 6, and a
//! leadership taken over only after its 15 s lease).
//!
//! Each test runs the exiting "service" on a runtime of its own, which it
//! drops as `main` returning would, and looks at the keys from another
//! client afterwards.

use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockError};
use test_support::RedisServer;
use test_support::helpers::{key, ms, redis_client, secs, within};

/// Runs `service` on a runtime of its own, then drops the runtime (what
/// returning from `#[tokio::main]` does): its tasks are dropped unrun.
fn exits(kind: &str, service: impl AsyncFnOnce()) {
    let runtime = match kind {
        "current" => tokio::runtime::Builder::new_current_thread(),
        _ => tokio::runtime::Builder::new_multi_thread(),
    }
    .enable_all()
    .build()
    .unwrap();
    runtime.block_on(service());
    drop(runtime);
}

async fn free(client: &LockClient, keys: &[String]) -> usize {
    let mut free = 0;
    for key in keys {
        if client.inspect(key).await.unwrap().holders.is_empty() {
            free += 1;
        }
    }
    free
}

/// Guards dropped just before `main` returns: their releases go on in the
/// background, which `shutdown` waits for (on a current-thread runtime not
/// one of them would run before the runtime is dropped).
#[test]
fn guards_dropped_as_main_returns_are_released_once_shutdown_returns() {
    let server = RedisServer::start();
    let url = server.url();
    let keys: Vec<String> = (0..50)
        .map(|i| key(&format!("dropped-at-exit-{i}")))
        .collect();
    for kind in ["current", "multi"] {
        let (service_url, service_keys) = (url.clone(), keys.clone());
        exits(kind, async move || {
            let (url, keys) = (service_url, service_keys);
            let client = LockClient::builder().redis(url).build().await.unwrap();
            let mut guards = Vec::new();
            for key in &keys {
                guards.push(client.lock(key).ttl(secs(30)).acquire().await.unwrap());
            }
            drop(guards);
            client.shutdown().await;
        });
        let observer = tokio::runtime::Runtime::new().unwrap();
        let free = observer.block_on(async {
            let client = LockClient::builder().redis(&url).build().await.unwrap();
            free(&client, &keys).await
        });
        assert_eq!(free, keys.len(), "{kind} runtime: keys left taken at exit");
    }
}

/// Guards still alive at shutdown: released now, and lost from then on
/// (they hold nothing); a leadership goes to the next candidate at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guards_alive_at_shutdown_are_released_and_lost() {
    let server = RedisServer::start();
    let (service, other) = (redis_client(&server).await, redis_client(&server).await);
    let (mutex, rw, permit, leader) = (
        key("alive-mutex"),
        key("alive-rw"),
        key("alive-permit"),
        key("alive-leader"),
    );
    let mutex_guard = service.lock(&mutex).ttl(secs(30)).acquire().await.unwrap();
    let lost = mutex_guard.lost();
    let read = service
        .rw_lock(&rw)
        .read()
        .ttl(secs(30))
        .acquire()
        .await
        .unwrap();
    let held = service
        .semaphore(&permit, 1)
        .ttl(secs(30))
        .acquire()
        .await
        .unwrap();
    let leading = service
        .leader(&leader)
        .ttl(secs(15))
        .campaign()
        .await
        .unwrap();
    let next = {
        let (other, leader) = (other.clone(), leader.clone());
        tokio::spawn(async move { other.leader(&leader).wait(secs(10)).campaign().await })
    };
    tokio::time::sleep(ms(200)).await;

    let started = Instant::now();
    within(secs(5), "shutdown", service.shutdown()).await;
    let took = started.elapsed();
    let next = within(secs(2), "the next leader", next)
        .await
        .unwrap()
        .unwrap();
    assert!(next.term() > leading.term());
    assert!(mutex_guard.is_lost() && read.is_lost() && held.is_lost() && leading.is_lost());
    within(ms(100), "the released guard's lost()", lost).await;
    let taken = other.lock(&mutex).acquire().await;
    assert!(taken.is_ok(), "{taken:?}");
    let permit_taken = other.semaphore(&permit, 1).acquire().await;
    assert!(permit_taken.is_ok(), "{permit_taken:?}");
    let written = other.rw_lock(&rw).write().acquire().await;
    assert!(written.is_ok(), "{written:?}");
    // Given back already: their own release says they held nothing.
    assert!(matches!(
        mutex_guard.release().await,
        Err(LockError::Lost { .. })
    ));
    assert!(matches!(read.release().await, Err(LockError::Lost { .. })));
    drop((held, leading));
    println!("shutdown gave back 4 leases in {took:?}");
    // The client stays usable.
    let after = service.lock(key("after-shutdown")).acquire().await;
    assert!(after.is_ok(), "{after:?}");
}

/// On the embedded backend too: the guards it gave back are lost, and the
/// keys free.
#[tokio::test]
async fn shutdown_gives_back_the_embedded_backends_locks() {
    let client = LockClient::builder().memory().build().await.unwrap();
    let guard = client
        .lock("k")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let dropped = client.lock("d").acquire().await.unwrap();
    drop(dropped);
    client.shutdown().await;
    assert!(guard.is_lost());
    for k in ["k", "d"] {
        assert!(client.inspect(k).await.unwrap().holders.is_empty(), "{k}");
    }
}
