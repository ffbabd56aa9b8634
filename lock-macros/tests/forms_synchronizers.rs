//! The synchronizer family: `rw`, `permits` and `keys`, alone and with the
//! other options.

use std::sync::Arc;

use lock_runtime::{LockClient, LockError, distributed_lock};

struct Catalog {
    locks: Arc<LockClient>,
}

impl Catalog {
    #[distributed_lock(key = "catalog:<id>", rw = "read", client = self.locks, wait = "1s")]
    async fn get(&self, id: u64) -> Result<u64, LockError> {
        Ok(id)
    }

    #[distributed_lock(key = "catalog:<id>", rw = "write", client = self.locks, ttl = "10s")]
    async fn put(&self, id: u64, value: String) -> Result<usize, LockError> {
        // A read inside a write of the same key re-enters.
        self.get(id).await?;
        Ok(value.len())
    }
}

#[distributed_lock(
    key = "exports:<tenant>",
    permits = 4,
    wait = "2s",
    hold_at_least = "10ms"
)]
async fn export(tenant: &str) -> Result<String, LockError> {
    Ok(lock_runtime::current_lock().unwrap().key)
}

#[distributed_lock(key = "big", permits = 4_294_967_295u32, renew = false, ttl = "1s")]
async fn many_permits() -> Result<(), LockError> {
    Ok(())
}

struct Account {
    id: u64,
}

#[distributed_lock(
    keys = ["account:<from.id>", "account:<to.id>"],
    ttl = "30s",
    wait = "2s",
    renew = true,
    client = client,
)]
async fn transfer(
    client: &LockClient,
    from: &Account,
    to: &Account,
    amount: u64,
) -> Result<u64, LockError> {
    Ok(amount)
}

/// Several keys kept taken for a while after the body, as one would be.
#[distributed_lock(keys = ["report:<day>", "export:<day>"], hold_at_least = "5m")]
async fn nightly(day: u32) -> Result<u32, LockError> {
    Ok(day)
}

/// One key in a list, and a trailing comma.
#[distributed_lock(keys = ["ledger",],)]
async fn ledger() -> Result<(), LockError> {
    Ok(())
}

fn assert_send<T: Send>(_: &T) {}

#[tokio::test]
async fn every_form_runs() {
    let client = LockClient::builder().memory().build().await.unwrap();
    lock_runtime::set_global_client(client.clone());
    let catalog = Catalog {
        locks: Arc::new(client.clone()),
    };
    assert_eq!(catalog.get(3).await.unwrap(), 3);
    assert_eq!(catalog.put(3, "abc".into()).await.unwrap(), 3);
    assert_eq!(export("acme").await.unwrap(), "exports:acme");
    many_permits().await.unwrap();

    let (a, b) = (Account { id: 1 }, Account { id: 2 });
    let fut = transfer(&client, &a, &b, 5);
    assert_send(&fut);
    // Whether it runs is the runtime's business (tests/tests/macros_runtime.rs);
    // here: it builds, is `Send`, and returns the function's own type.
    let _: Result<u64, LockError> = fut.await;
    let _: Result<(), LockError> = ledger().await;

    // Both keys stay taken after the body, until five minutes after it began.
    assert_eq!(nightly(7).await.unwrap(), 7);
    for key in ["report:7", "export:7"] {
        let busy = client.lock(key).acquire().await.unwrap_err();
        assert!(busy.is_busy(), "{key}: {busy}");
    }
    assert!(
        nightly(7).await.unwrap_err().is_busy(),
        "a second run in the interval"
    );
}
