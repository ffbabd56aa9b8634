//! Methods taking `&self`, `&mut self` and `self`, with clients given every
//! supported way.

use std::sync::Arc;

use lock_runtime::{LockClient, LockError, distributed_lock};

/// An order to create.
pub struct NewOrder {
    /// Its id.
    pub id: u64,
}

/// A service whose methods lock. `pub` items documented: the attribute
/// keeps a method's docs (`missing_docs` would say so otherwise).
pub struct OrderService {
    tenant: String,
    locks: Arc<LockClient>,
    plain: LockClient,
    created: Vec<u64>,
}

impl OrderService {
    /// `&self`, the client a field.
    #[distributed_lock(key = "{tenant:<self.tenant>}:order:<order.id>", client = self.locks)]
    pub async fn create(&self, order: &NewOrder) -> Result<String, LockError> {
        Ok(lock_runtime::current_lock().unwrap().key)
    }

    #[distributed_lock(key = "{tenant:<self.tenant>}:order:<order.id>", client = &self.plain, wait = "1s")]
    pub(crate) async fn record(&mut self, order: NewOrder) -> Result<usize, LockError> {
        self.created.push(order.id);
        Ok(self.created.len())
    }

    /// `self` by value: the client and the key are taken before the body
    /// moves `self`.
    #[distributed_lock(key = "close:<self.tenant>", client = self.locks)]
    pub async fn close(self) -> Result<Vec<u64>, LockError> {
        let OrderService { created, .. } = self;
        Ok(created)
    }

    /// `Self` and associated items inside the body and in `client = ...`.
    #[distributed_lock(key = "static:<n>", client = Self::shared(&locks))]
    async fn associated(locks: Arc<LockClient>, n: u32) -> Result<u32, LockError> {
        Ok(Self::double(n))
    }

    fn shared(locks: &Arc<LockClient>) -> &LockClient {
        locks
    }

    fn double(n: u32) -> u32 {
        n * 2
    }
}

/// A trait whose default method locks.
pub trait Job {
    /// The client its locks use.
    fn client(&self) -> LockClient;

    /// A trait's default method body.
    #[allow(async_fn_in_trait)]
    #[distributed_lock(key = "job:<name>", client = self.client())]
    async fn run(&self, name: &str) -> Result<String, LockError> {
        Ok(name.to_uppercase())
    }
}

struct Nightly(LockClient);

impl Job for Nightly {
    fn client(&self) -> LockClient {
        self.0.clone()
    }
}

#[tokio::test]
async fn every_form_runs() {
    let client = LockClient::builder().memory().build().await.unwrap();
    let mut service = OrderService {
        tenant: "acme".into(),
        locks: Arc::new(client.clone()),
        plain: client.clone(),
        created: Vec::new(),
    };
    let key = service.create(&NewOrder { id: 7 }).await.unwrap();
    assert_eq!(key, "{tenant:acme}:order:7");
    assert_eq!(service.record(NewOrder { id: 7 }).await.unwrap(), 1);
    assert_eq!(service.record(NewOrder { id: 8 }).await.unwrap(), 2);
    assert_eq!(service.close().await.unwrap(), vec![7, 8]);
    let locks = Arc::new(client.clone());
    assert_eq!(OrderService::associated(locks, 21).await.unwrap(), 42);
    assert_eq!(Nightly(client).run("backup").await.unwrap(), "BACKUP");
}
