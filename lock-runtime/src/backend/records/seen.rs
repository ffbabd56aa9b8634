//! Idempotency records in flight, as operators see them (`LockClient::list`).

use std::time::Duration;

use super::super::Backend;
use super::super::redis::RedisBackend;
use crate::error::{BackendError, LockError};

/// A record in flight: its claimer's token and the lease left.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct InFlight {
    pub(crate) owner: String,
    pub(crate) remaining: Option<Duration>,
}

impl Backend {
    /// The record `name` if a request runs it now (in flight); `None`
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

/// How much of a record's value is read: its tag and owner, never a stored
/// body (`waited:` and a token are 64 bytes).
const HEAD: i64 = 127;

async fn read(node: &RedisBackend, name: &str) -> Result<Option<InFlight>, LockError> {
    let (head, pttl): (redis::RedisResult<Vec<u8>>, redis::RedisResult<i64>) = redis::pipe()
        .cmd("GETRANGE")
        .arg(name)
        .arg(0)
        .arg(HEAD)
        .cmd("PTTL")
        .arg(name)
        .ignore_errors()
        .query_async(&mut node.connection())
        .await
        .map_err(|e| BackendError::with_source("cannot read the idempotency record", e))?;
    let failed = |e| BackendError::with_source("cannot read the idempotency record", e);
    let pttl = pttl.map_err(failed)?;
    let owner = in_flight_owner(&head.map_err(failed)?);
    Ok(owner.map(|owner| InFlight {
        owner,
        remaining: u64::try_from(pttl).ok().map(Duration::from_millis),
    }))
}

/// The owner in the head of a record's value when it is in flight
/// (`run:<owner>:..` or `waited:<owner>:..`).
fn in_flight_owner(head: &[u8]) -> Option<String> {
    let head = std::str::from_utf8(head).ok()?;
    let rest = head
        .strip_prefix("run:")
        .or_else(|| head.strip_prefix("waited:"))?;
    let (owner, _) = rest.split_once(':')?;
    Some(owner.to_owned())
}

#[cfg(test)]
mod tests {
    use super::in_flight_owner;

    #[test]
    fn the_owner_is_read_from_a_record_in_flight_only() {
        assert_eq!(in_flight_owner(b"run:abc:f00").as_deref(), Some("abc"));
        assert_eq!(in_flight_owner(b"waited:abc:f00").as_deref(), Some("abc"));
        assert_eq!(in_flight_owner(b"done:abc:f00:200:0:0:"), None);
        assert_eq!(in_flight_owner(b"run:abc"), None);
        assert_eq!(in_flight_owner(b""), None);
    }
}
