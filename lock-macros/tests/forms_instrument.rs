//! `#[tracing::instrument]` stacked before and after the attribute.

use lock_runtime::{LockClient, LockError, distributed_lock};

#[tracing::instrument(skip(client), err)]
#[distributed_lock(key = "before:<id>", client = client)]
async fn instrument_first(client: &LockClient, id: u64) -> Result<u64, LockError> {
    tracing::info!("inside");
    Ok(lock_runtime::current_lock()
        .unwrap()
        .fencing_token()
        .await
        .unwrap()
        + id)
}

#[distributed_lock(key = "after:<id>", client = client)]
#[tracing::instrument(skip(client), err)]
async fn instrument_second(client: &LockClient, id: u64) -> Result<u64, LockError> {
    tracing::info!("inside");
    Ok(lock_runtime::current_lock()
        .unwrap()
        .fencing_token()
        .await
        .unwrap()
        + id)
}

struct Service {
    locks: LockClient,
    name: String,
}

impl Service {
    #[tracing::instrument(skip(self), fields(name = %self.name))]
    #[distributed_lock(key = "svc:<self.name>:<id>", client = self.locks)]
    async fn before(&self, id: u64) -> Result<u64, LockError> {
        Ok(id)
    }

    #[distributed_lock(key = "svc:<self.name>:<id>", client = self.locks)]
    #[tracing::instrument(skip(self), fields(name = %self.name))]
    async fn after(&self, id: u64) -> Result<u64, LockError> {
        Ok(id)
    }
}

fn assert_send<T: Send>(_: &T) {}

#[tokio::test(flavor = "multi_thread")]
async fn every_form_runs() {
    let client = LockClient::builder().memory().build().await.unwrap();
    // Fencing tokens come from one counter (the embedded backend's): the
    // first lock gets 1, the second 2.
    let fut = instrument_first(&client, 10);
    assert_send(&fut);
    assert_eq!(fut.await.unwrap(), 11);
    let fut = instrument_second(&client, 10);
    assert_send(&fut);
    assert_eq!(fut.await.unwrap(), 12);
    let service = Service {
        locks: client,
        name: "s".into(),
    };
    assert_eq!(service.before(1).await.unwrap(), 1);
    assert_eq!(service.after(2).await.unwrap(), 2);
}
