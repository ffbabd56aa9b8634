//! Committed records in Redis: the work's write commands and the completed
//! record (a hash beside the record, in its hash slot) in one script call
//! (`IdempotencyLayer`'s `Commit::redis`, `RecordGuard::commit_redis`), and
//! the lookup a claim makes there before its work runs.

use std::sync::LazyLock;
use std::time::Duration;

use redis::Value;
use redis::aio::ConnectionManager;

use super::value::{Value as RecordValue, completed as completed_response, owner_and_fingerprint};
use super::{CommitOutcome, CommittedRecord, Ours, StoredResponse};
use crate::backend::conn::Conn;
use crate::backend::redis::RedisBackend;
use crate::backend::scripts::millis;
use crate::error::{BackendError, ConnectionFailure, LockError, connection_failure};
use crate::fence::commands::Writes;

static COMMIT: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../../scripts/idempotency_commit.lua")));
static COMMIT_RECORD: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(include_str!(
        "../../../scripts/idempotency_commit_record.lua"
    ))
});

/// What follows a record's name in the name of its committed copy in Redis
/// (a hash: `f` fingerprint, `s` status, `h` kept headers, `b` body, `t`
/// body too large), which shares the record's hash slot.
pub const COMMITTED_SUFFIX: &str = ":committed";

fn committed_name(record: &str) -> String {
    let mut name = String::with_capacity(record.len() + COMMITTED_SUFFIX.len());
    name.push_str(record);
    name.push_str(COMMITTED_SUFFIX);
    name
}

/// The committed record named `record`, if one is there (Redis expires it).
pub(crate) async fn lookup(
    conn: &mut ConnectionManager,
    record: &str,
) -> Result<Option<CommittedRecord>, LockError> {
    let fields: Vec<Option<Vec<u8>>> = redis::cmd("HMGET")
        .arg(committed_name(record))
        .arg(&["f", "s", "h", "b", "t"])
        .query_async(conn)
        .await
        .map_err(|e| backend(false, record, e))?;
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

/// A failed lookup of `record`'s committed copy, or (`committing`) a failed
/// commit, whose outcome is unknown when the connection dropped after the
/// script was sent.
fn backend(committing: bool, record: &str, e: redis::RedisError) -> LockError {
    let dropped = matches!(
        connection_failure(&e),
        Some(ConnectionFailure::TimedOut | ConnectionFailure::Broken)
    );
    LockError::Backend(match (committing, dropped) {
        (true, true) => BackendError::outcome_unknown(
            format!(
                "the commit of `{record}` was sent and no answer came back: it may or may \
                 not have been applied"
            ),
            Some(Box::new(e)),
        ),
        (true, false) => BackendError::with_source(
            format!("committing the writes with the record `{record}` failed"),
            e,
        ),
        (false, _) => BackendError::with_source(
            format!("looking up the committed copy of the record `{record}` failed"),
            e,
        ),
    })
}

/// Runs `writes` and writes the record `record` (its fingerprint digest
/// `fingerprint`, `stored`, kept `retention`) in one script call: both or,
/// when a committed record is there already (another claimer committed
/// first), neither ([`CommitOutcome::Found`]).
pub(crate) async fn commit(
    conn: &ConnectionManager,
    record: &str,
    fingerprint: &str,
    stored: StoredResponse,
    retention: Duration,
    writes: &Writes,
) -> Result<CommitOutcome, LockError> {
    // At most a year (checked at the claim): an exact integer for the script.
    let retention_ms = u64::try_from(retention.as_millis())
        .unwrap_or(u64::MAX)
        .max(1);
    let mut invocation = COMMIT.key(committed_name(record));
    invocation
        .arg(fingerprint)
        .arg(stored.status)
        .arg(&stored.headers[..])
        .arg(&stored.body[..])
        .arg(if stored.body_too_large { "1" } else { "0" })
        .arg(retention_ms);
    writes.add_to(&mut invocation);
    let mut conn = conn.clone();
    let answer = invocation.invoke_async::<Value>(&mut conn).await;
    match answer {
        Ok(Value::Array(parts)) => match parts.first() {
            Some(Value::Int(1)) => Ok(CommitOutcome::Committed(stored)),
            Some(Value::Int(0)) => match lookup(&mut conn, record).await? {
                Some(found) => Ok(CommitOutcome::Found(found)),
                None => Err(LockError::Backend(BackendError::new(format!(
                    "committed record `{record}` was there, then gone"
                )))),
            },
            _ => Err(unexpected(record, &parts)),
        },
        Ok(other) => Err(unexpected(record, &other)),
        Err(e) => Err(backend(true, record, e)),
    }
}

/// Runs `writes` and completes the record `ours` claimed with `stored`, in
/// one script call on `node`, the lock server itself
/// (idempotency_commit_record.lua): the record is its own committed copy.
/// A completed record there already (another claimer's, or ours from a try
/// whose reply was lost) is [`CommitOutcome::Found`] (`Completed` when
/// ours) and nothing is written.
pub(crate) async fn commit_on_server(
    node: &RedisBackend,
    ours: &Ours,
    stored: StoredResponse,
    writes: &Writes,
) -> Result<CommitOutcome, LockError> {
    let record = ours.names.record.as_str();
    let completed = RecordValue {
        response: Some(&stored),
        ..RecordValue::claim(ours)
    };
    let mut invocation = COMMIT_RECORD.key(record);
    invocation
        .arg(node.notice_arg(&ours.names.notice))
        .arg(millis(ours.retention))
        .arg(completed);
    writes.add_to(&mut invocation);
    let mut conn = node.connection();
    let answer = invocation.invoke_async::<Value>(&mut conn).await;
    let parts = match answer {
        Ok(Value::Array(parts)) => parts,
        Ok(other) => return Err(unexpected(record, &other)),
        Err(e) => return Err(backend(true, record, e)),
    };
    match parts.as_slice() {
        [Value::Int(1), ..] => replicated(node, &mut conn).await,
        [Value::Int(0), Value::BulkString(found)] => {
            let (owner, fingerprint) =
                owner_and_fingerprint(found).ok_or_else(|| malformed(record))?;
            if owner == ours.token.as_bytes() {
                // Ours, from a try whose reply was lost.
                return replicated(node, &mut conn).await;
            }
            let fingerprint =
                String::from_utf8(fingerprint.to_vec()).map_err(|_| malformed(record))?;
            let stored = completed_response(bytes::Bytes::copy_from_slice(found));
            let stored = stored.ok_or_else(|| malformed(record))?;
            Ok(CommitOutcome::Found(CommittedRecord {
                fingerprint,
                stored,
            }))
        }
        [Value::Int(2)] => Err(LockError::Config(format!(
            "the key of record `{record}` holds something else than a record (set by \
             hand?): nothing was committed"
        ))),
        _ => Err(unexpected(record, &parts)),
    }
}

/// A commit on the lock server, answered: with replica acks
/// (`min_replica_acks`) once enough replicas hold the work and its record,
/// as a lock's acquire; too few make the outcome unknown (an error: the
/// writes may be lost in a failover, or kept).
async fn replicated(node: &RedisBackend, conn: &mut Conn) -> Result<CommitOutcome, LockError> {
    if node.needs_confirmation() {
        node.replicated(conn).await?;
    }
    Ok(CommitOutcome::Completed)
}

fn unexpected(record: &str, what: &dyn std::fmt::Debug) -> LockError {
    LockError::Backend(BackendError::new(format!(
        "the commit of `{record}` got an unexpected answer: {what:?}"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_lookup_or_commit_says_what_failed_once() {
        let refused = redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError);
        let bad = || redis::RedisError::from((refused, "WRONGTYPE"));
        let lookup = backend(false, "app:r", bad()).to_string();
        assert!(
            lookup.contains("looking up the committed copy of the record `app:r` failed"),
            "{lookup}"
        );
        let commit = backend(true, "app:r", bad()).to_string();
        assert!(
            commit.contains("committing the writes with the record `app:r` failed"),
            "{commit}"
        );
        let dropped = redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        let LockError::Backend(unknown) = backend(true, "app:r", dropped) else {
            panic!("not a backend error");
        };
        assert!(unknown.is_outcome_unknown(), "{unknown}");
    }
}
