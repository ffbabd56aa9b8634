//! The committed copy of a layer's record in Redis: a hash beside the
//! record, where the layer looks before a claimed request runs.

use redis::aio::ConnectionManager;

use crate::backend::records::{CommittedRecord, StoredResponse};
use crate::error::{BackendError, ConnectionFailure, LockError, connection_failure};

/// What follows the layer's record name in the name of its committed copy
/// (a hash: `f` fingerprint, `s` status, `h` kept headers, `b` body, `t`
/// body too large), which shares the record's hash slot.
pub const COMMITTED_SUFFIX: &str = ":committed";

pub(super) fn committed_name(record: &str) -> String {
    let mut name = String::with_capacity(record.len() + COMMITTED_SUFFIX.len());
    name.push_str(record);
    name.push_str(COMMITTED_SUFFIX);
    name
}

pub(super) async fn lookup(
    conn: &mut ConnectionManager,
    record: &str,
) -> Result<Option<CommittedRecord>, LockError> {
    let fields: Vec<Option<Vec<u8>>> = redis::cmd("HMGET")
        .arg(committed_name(record))
        .arg(&["f", "s", "h", "b", "t"])
        .query_async(conn)
        .await
        .map_err(|e| backend("looking up the committed record of", record, e))?;
    let [Some(f), Some(s), Some(h), Some(b), Some(t)] =
        <[_; 5]>::try_from(fields).map_err(|_| malformed(record))?
    else {
        return Ok(None);
    };
    let status = std::str::from_utf8(&s)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| malformed(record))?;
    Ok(Some(CommittedRecord {
        fingerprint: String::from_utf8(f).map_err(|_| malformed(record))?,
        stored: StoredResponse {
            status,
            headers: h.into(),
            body: b.into(),
            body_too_large: t == b"1",
        },
    }))
}

fn malformed(record: &str) -> LockError {
    LockError::Backend(BackendError::new(format!(
        "the committed record of `{record}` is malformed"
    )))
}

pub(super) fn backend(doing: &str, record: &str, e: redis::RedisError) -> LockError {
    LockError::Backend(match connection_failure(&e) {
        Some(ConnectionFailure::TimedOut | ConnectionFailure::Broken)
            if doing.starts_with("committing") =>
        {
            BackendError::outcome_unknown(
                format!(
                    "the commit of `{record}` was sent and no answer came back: it may or may \
                     not have been applied"
                ),
                Some(Box::new(e)),
            )
        }
        _ => {
            BackendError::with_source(format!("{doing} the committed record `{record}` failed"), e)
        }
    })
}
