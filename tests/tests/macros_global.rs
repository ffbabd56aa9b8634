//! `#[distributed_lock]` without `client = ...` uses the global client. A file
//! of its own: the global client is process-wide state.

use lock_runtime::{LockError, distributed_lock};
use test_support::RedisServer;
use test_support::helpers::{default_redis_client, memory_client};

#[distributed_lock(key = "report:<day>", wait = "1s")]
async fn report(day: u32) -> Result<u64, LockError> {
    Ok(lock_runtime::current_lock()
        .expect("inside")
        .fencing_token()
        .await
        .unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_global_client_is_used_and_its_absence_is_an_error() {
    // Before installation: NoClient, with a message that says what to do.
    let e = report(1).await.unwrap_err();
    assert!(e.is_no_client(), "{e:?}");
    let message = e.to_string();
    assert!(
        message.contains("lock_runtime::set_global_client"),
        "{message}"
    );
    assert!(message.contains("client = "), "{message}");

    let server = RedisServer::start();
    let client = default_redis_client(&server).await;
    lock_runtime::set_global_client(client.clone());
    assert_eq!(report(1).await.unwrap(), 1);
    assert_eq!(report(1).await.unwrap(), 2);
    // The global client is the one that took the lock.
    let held = client.lock("report:2").acquire().await.unwrap();
    assert!(report(2).await.unwrap_err().is_busy());
    held.release().await.unwrap();
    // A later installation replaces it.
    lock_runtime::set_global_client(memory_client().await);
    assert_eq!(
        report(1).await.unwrap(),
        1,
        "the memory backend has its own counters"
    );
}
