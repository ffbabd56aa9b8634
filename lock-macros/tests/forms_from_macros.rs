//! The attribute inside `macro_rules!`: options passed as fragments
//! (`$key:literal`, `$ttl:expr`), parameters named by the caller, and a body
//! with inner attributes.

use lock_runtime::{LockClient, LockError, distributed_lock};

/// A handler per call, as a service defines its routes' handlers.
macro_rules! handler {
    ($name:ident, $param:ident, $key:literal, $ttl:expr, $rw:literal, $permits:expr) => {
        #[distributed_lock(key = $key, ttl = $ttl, client = client)]
        async fn $name(client: &LockClient, $param: u64) -> Result<String, LockError> {
            assert!($param > 0);
            Ok(lock_runtime::current_lock().unwrap().key)
        }

        mod $name {
            use super::*;

            #[distributed_lock(key = $key, rw = $rw, client = client)]
            pub(super) async fn read(client: &LockClient, $param: u64) -> Result<u64, LockError> {
                Ok($param)
            }

            #[distributed_lock(key = $key, permits = $permits, client = client)]
            pub(super) async fn permit(client: &LockClient, $param: u64) -> Result<u64, LockError> {
                Ok($param)
            }
        }
    };
}

handler!(pay, id, "order:<id>", "30s", "read", 2);

/// Inner attributes of the body apply to the function as made.
#[distributed_lock(key = "inner:<id>", client = client)]
async fn inner_attributes(client: &LockClient, id: u64) -> Result<u64, LockError> {
    #![allow(unused_variables)]
    let unused = 1;
    Ok(id)
}

#[tokio::test]
async fn every_form_runs() {
    let client = LockClient::builder().memory().build().await.unwrap();
    assert_eq!(pay(&client, 7).await.unwrap(), "order:7");
    assert_eq!(pay::read(&client, 8).await.unwrap(), 8);
    assert_eq!(pay::permit(&client, 9).await.unwrap(), 9);
    assert_eq!(inner_attributes(&client, 3).await.unwrap(), 3);
}
