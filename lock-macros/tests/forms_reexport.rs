//! `crate = <path>` for a crate that re-exports lock_runtime under another
//! name.

// As a platform crate's public module would (unreachable from this test
// binary).
#[allow(unreachable_pub)]
mod my_platform {
    pub mod locks {
        pub use lock_runtime::*;
    }
}

use my_platform::locks::{self, LockClient, LockError};

#[locks::distributed_lock(key = "reexported:<id>", crate = my_platform::locks, client = client)]
async fn job(client: &LockClient, id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[tokio::test]
async fn every_form_runs() {
    let client = LockClient::builder().memory().build().await.unwrap();
    assert_eq!(job(&client, 3).await.unwrap(), 3);
}
