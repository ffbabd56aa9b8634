//! An operator's force-release: the lock deleted whoever holds it, and the
//! key's fencing counter raised past the evicted holder's token, with the
//! key's fenced-write record (`fence::redis`) on the lock's server.

use std::sync::LazyLock;

use futures_util::future::join_all;
use tokio::time::timeout;

use super::Backend;
use super::redis::RedisBackend;
use crate::error::{BackendError, LockError};
use crate::fence::{DEFAULT_RETENTION, record_key};
use crate::key::KeyNames;

static RECORD_RAISE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../scripts/fence_record_raise.lua")));

impl Backend {
    /// Deletes the lock `names` (for a read-write lock or a semaphore, every
    /// holder's entry), raises its slot's fencing counter and the record of
    /// `fence::redis` for resource `key` on the lock's server to the raised
    /// value, and tells the waiters to try again. Returns the raised
    /// counter: above every token issued before for the key.
    pub(crate) async fn force_release(
        &self,
        names: &KeyNames,
        key: &str,
    ) -> Result<u64, LockError> {
        match self {
            Backend::Redis(b) => {
                let fence = force_on(b, names, key).await?;
                b.announce(names.notice()).await;
                Ok(fence)
            }
            Backend::Redlock(b) => {
                let per_node = b.node_timeout() * 4;
                let raised: Vec<u64> = join_all(
                    b.nodes()
                        .iter()
                        .map(|node| timeout(per_node, force_on(node, names, key))),
                )
                .await
                .into_iter()
                .filter_map(|answer| answer.ok()?.ok())
                .collect();
                if raised.len() < b.quorum() {
                    return Err(BackendError::new(format!(
                        "Redlock: the lock was force-released on {} of {} nodes; a majority \
                         of {} is needed",
                        raised.len(),
                        b.nodes().len(),
                        b.quorum()
                    ))
                    .into());
                }
                b.announce(names.notice()).await;
                Ok(raised.into_iter().max().unwrap_or(0))
            }
            Backend::Memory(b) => Ok(b.force_release(names)),
        }
    }
}

async fn force_on(node: &RedisBackend, names: &KeyNames, key: &str) -> Result<u64, LockError> {
    let mut deleted = redis::cmd("DEL");
    deleted.arg(&names.lock);
    if !names.holders.is_empty() {
        deleted.arg(&names.holders).arg(&names.fences);
    }
    // A leader's record goes with its lock (observers read "no leader" until
    // the next candidate's grant writes its own).
    if !names.record.is_empty() {
        deleted.arg(&names.record);
    }
    let (_, fence): (u64, u64) = redis::pipe()
        .add_command(deleted)
        .cmd("INCR")
        .arg(names.fence())
        .query_async(&mut node.connection())
        .await
        .map_err(|e| BackendError::with_source("cannot force-release the lock", e))?;
    // The record lives in the resource's slot, which is not always the
    // lock's (a key such as `a}b`): a command of its own.
    let mut conn = node.connection();
    RECORD_RAISE
        .key(record_key(key))
        .arg(fence)
        .arg(DEFAULT_RETENTION.as_millis() as u64)
        .invoke_async::<String>(&mut conn)
        .await
        .map_err(|e| {
            let said = format!(
                "the lock was released and its fencing counter raised to {fence}, but the \
                 fence record of resource `{key}` (`fence::redis`) was not raised: a write \
                 there with an earlier token is refused only once a later holder has written"
            );
            BackendError::with_source(said, e)
        })?;
    Ok(fence)
}
