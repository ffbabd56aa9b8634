//! Row 6: a `#[distributed_lock]` function against the same code written by
//! hand with `with_lock`.

use std::sync::OnceLock;

use lock_runtime::{LockClient, LockError, LockInfo};

use super::rows::blocks;

/// The key of the attribute row, as the template renders it.
const ATTR_ID: u32 = 7;

static ATTR_CLIENT: OnceLock<LockClient> = OnceLock::new();

/// The client of the attributed function (set once the client is built).
fn attr_client() -> LockClient {
    ATTR_CLIENT
        .get()
        .cloned()
        .expect("the benchmark sets ATTR_CLIENT before calling the attributed function")
}

#[lock_runtime::distributed_lock(key = "bench:<id>", client = attr_client())]
async fn attributed(id: u32) -> Result<Option<LockInfo>, LockError> {
    let _ = id;
    Ok(lock_runtime::current_lock())
}

async fn hand_written(client: &LockClient, id: u32) -> Result<Option<LockInfo>, LockError> {
    client
        .with_lock(format!("bench:{id}"), async {
            lock_runtime::current_lock()
        })
        .await
}

/// `Ok` when the attribute really locks (the body sees its lock); otherwise
/// why not, e.g. while `#[distributed_lock]` is still a pass-through.
pub(crate) async fn attribute_status() -> Result<(), String> {
    let expected = format!("bench:{ATTR_ID}");
    match hand_written(&attr_client(), ATTR_ID).await {
        Ok(Some(info)) if info.key == expected => {}
        other => {
            return Err(format!(
                "the hand-written with_lock does not see its lock through current_lock() \
                 (got {other:?}): a runtime bug, not the attribute's"
            ));
        }
    }
    match attributed(ATTR_ID).await {
        Ok(Some(info)) if info.key == expected => Ok(()),
        Ok(Some(info)) => Err(format!(
            "the body ran under {:?}, expected {expected:?}",
            info.key
        )),
        Ok(None) => Err(
            "the attributed body ran without a lock (current_lock() is None): \
             #[distributed_lock] does not lock yet"
                .into(),
        ),
        Err(e) => Err(format!("the attributed function failed: {e}")),
    }
}

/// Sets the client the attributed function uses (once; later calls are ignored).
pub(crate) fn set_attr_client(client: &LockClient) {
    let _ = ATTR_CLIENT.set(client.clone());
}

/// `n` attributed calls and `n` hand-written ones, alternating blocks, on the
/// attribute's client (through the same accessor).
pub(crate) async fn serial_attr(n: usize, rep: usize) -> Result<(Vec<f64>, Vec<f64>), String> {
    let client = attr_client();
    let check = |held: Result<Option<LockInfo>, LockError>| match held {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err("row 6: a body ran without its lock".to_string()),
        Err(e) => Err(format!("row 6: {e}")),
    };
    blocks(
        n,
        rep,
        async || check(attributed(ATTR_ID).await),
        async || check(hand_written(&client, ATTR_ID).await),
    )
    .await
}
