//! The misuse cases callers match on are told apart by
//! `LockError::config_reason`, while the error stays a `LockError::Config`.

use std::time::Duration;

use lock_runtime::{ConfigReason, LockError};
use test_support::helpers::memory_client;

/// `e` is a `Config` error, matchable as before, for `reason`.
fn assert_reason(e: &LockError, reason: ConfigReason) {
    assert!(matches!(e, LockError::Config(_)), "{e:?}");
    assert_eq!(e.config_reason(), Some(reason), "{e}");
}

#[tokio::test]
async fn a_semaphore_with_zero_permits_says_zero_permits() {
    let client = memory_client().await;
    let e = client.semaphore("exports", 0).acquire().await.unwrap_err();
    assert_reason(&e, ConfigReason::ZeroPermits);
    assert!(e.to_string().contains("\"exports\""), "{e}");
}

#[tokio::test]
async fn a_write_inside_a_read_of_the_same_task_says_write_inside_read() {
    let client = memory_client().await;
    let inner = client.clone();
    let e = client
        .rw_lock("catalog:7")
        .read()
        .run(async move { inner.rw_lock("catalog:7").write().acquire().await })
        .await
        .expect("the read lock")
        .unwrap_err();
    assert_reason(&e, ConfigReason::WriteInsideRead);
    assert!(e.to_string().contains("\"catalog:7\""), "{e}");
}

#[tokio::test]
async fn a_key_named_twice_in_lock_all_says_key_named_twice() {
    let client = memory_client().await;
    let e = client
        .lock_all(["account:1", "account:2", "account:1"])
        .acquire()
        .await
        .unwrap_err();
    assert_reason(&e, ConfigReason::KeyNamedTwice);
    assert!(e.to_string().contains("\"account:1\""), "{e}");
}

#[tokio::test]
async fn other_configuration_errors_and_other_errors_have_no_reason() {
    let client = memory_client().await;
    let zero_ttl = client.lock("k").ttl(Duration::ZERO).acquire().await;
    let zero_ttl = zero_ttl.unwrap_err();
    assert!(zero_ttl.is_config(), "{zero_ttl:?}");
    assert_eq!(zero_ttl.config_reason(), None, "{zero_ttl}");
    let held = client.semaphore("exports", 1).acquire().await.unwrap();
    let busy = client.semaphore("exports", 1).acquire().await.unwrap_err();
    assert!(busy.is_busy(), "{busy:?}");
    assert_eq!(busy.config_reason(), None);
    held.release().await.unwrap();
}
