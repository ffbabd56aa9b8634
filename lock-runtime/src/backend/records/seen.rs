//! Idempotency records in flight, as operators see them (`LockClient::list`).

use std::time::Duration;

use super::super::Backend;
use super::super::redis::RedisBackend;
use crate::LockError;
use crate::error::BackendError;

/// A record in flight: its claimer's token and the lease left.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct InFlight {
    pub(crate) owner: String,
    pub(crate) remaining: Option<Duration>,
}

impl Backend {
    /// The record `name` if a request runs it now (state `run`); `None`
    /// when absent or completed. On Redlock, the first node that has it in
    /// flight; the embedded backend's records are not listed.
    pub(crate) async fn record_in_flight(&self, name: &str) -> Result<Option<InFlight>, LockError> {
        match self {
            Backend::Redis(b) => read(b, name).await,
            Backend::Redlock(b) => {
                for node in b.nodes() {
                    if let Ok(Some(found)) = read(node, name).await {
                        return Ok(Some(found));
                    }
                }
                Ok(None)
            }
            Backend::Memory(_) => Ok(None),
        }
    }
}

async fn read(node: &RedisBackend, name: &str) -> Result<Option<InFlight>, LockError> {
    let ((state, owner), pttl): ((Option<String>, Option<String>), i64) = redis::pipe()
        .cmd("HMGET")
        .arg(name)
        .arg("state")
        .arg("owner")
        .cmd("PTTL")
        .arg(name)
        .query_async(&mut node.connection())
        .await
        .map_err(|e| BackendError::with_source("cannot read the idempotency record", e))?;
    Ok(match (state.as_deref(), owner) {
        (Some("run"), Some(owner)) => Some(InFlight {
            owner,
            remaining: u64::try_from(pttl).ok().map(Duration::from_millis),
        }),
        _ => None,
    })
}
