//! Committed records in Redis: the handler's commands and the record in one
//! script call.

use std::borrow::Borrow;
use std::sync::LazyLock;

use redis::Value;

use super::committed::{backend, committed_name, lookup};
use super::{Commit, CommitState, Outcome};
use crate::error::{BackendError, LockError};
use crate::fence::commands::{self, Encoded};

static COMMIT: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(include_str!("../../../../scripts/idempotency_commit.lua"))
});

impl Commit {
    /// Starts the handler's atomic step on the layer's Redis
    /// ([`commit_with_redis`](crate::layer::IdempotencyLayer::commit_with_redis)):
    /// add its write commands with [`RedisCommit::cmd`], then send them with
    /// the response in [`RedisCommit::respond`].
    pub fn redis(&self) -> RedisCommit<'_> {
        RedisCommit {
            commit: self,
            keys: Vec::new(),
            argv: Vec::new(),
            commands: 0,
            invalid: None,
        }
    }
}

/// A handler's writes to Redis, to commit with its record: see
/// [`Commit::redis`].
#[must_use = "nothing is written until `.respond(response).await`"]
pub struct RedisCommit<'a> {
    commit: &'a Commit,
    keys: Vec<Vec<u8>>,
    argv: Vec<Vec<u8>>,
    commands: usize,
    invalid: Option<LockError>,
}

impl std::fmt::Debug for RedisCommit<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Values may be secrets: count them.
        f.debug_struct("RedisCommit")
            .field("record", &self.commit.0.record)
            .field("commands", &self.commands)
            .finish_non_exhaustive()
    }
}

impl RedisCommit<'_> {
    /// Adds a write command, as `redis::cmd(..).arg(..)` builds it: only the
    /// commands of [`fence::allowed_commands`](crate::fence::allowed_commands)
    /// (whose keys the script can declare); any other fails
    /// [`respond`](Self::respond) with [`LockError::Config`] before anything
    /// is sent.
    pub fn cmd(mut self, cmd: impl Borrow<redis::Cmd>) -> Self {
        if self.invalid.is_none() {
            match commands::encode(cmd.borrow()) {
                Ok(Encoded { keys, argv }) => {
                    self.keys.extend(keys);
                    self.argv.extend(argv);
                    self.commands += 1;
                }
                Err(e) => self.invalid = Some(e),
            }
        }
        self
    }

    /// Runs the commands and writes the completed record (built from
    /// `response`, as the layer stores it) in one script call, and returns
    /// the response to send. A single Redis server (or a Sentinel's master);
    /// on a cluster every key must share the record's hash slot.
    ///
    /// When another claimer of this record committed first (this one was
    /// paused past its claim's lease), nothing is written and its stored
    /// response is returned, as a replay.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`]: a command off the allow-list or with the wrong
    /// number of arguments, or a layer without a Redis store (nothing sent).
    /// [`LockError::Backend`]: the server failed or did not answer (the
    /// outcome may be unknown), or a command failed inside the script (the
    /// commands before it stay applied, with no record, as in any Redis
    /// script). Either way the layer releases the claim rather than store the
    /// handler's answer, so the retry looks for the record again.
    pub async fn respond(
        self,
        response: impl axum::response::IntoResponse,
    ) -> Result<axum::response::Response, LockError> {
        let commit = self.commit;
        let Some(conn) = commit.0.store.redis() else {
            commit.set_state(CommitState::Failed);
            return Err(LockError::Config(
                "Commit::redis on a layer without `commit_with_redis`".into(),
            ));
        };
        if let Some(e) = self.invalid {
            commit.set_state(CommitState::Failed);
            return Err(e);
        }
        let prepared = match commit.prepare(response).await {
            Ok(prepared) => prepared,
            Err(e) => return commit.settle(Err(e), axum::response::Response::default()),
        };
        let stored = prepared.stored;
        let record = commit.0.record.as_str();
        let retention_ms = u64::try_from(commit.0.config.retention.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let mut invocation = COMMIT.key(committed_name(record));
        for k in &self.keys {
            invocation.key(k.as_slice());
        }
        invocation
            .arg(commit.0.fingerprint.as_str())
            .arg(stored.status)
            .arg(&stored.headers[..])
            .arg(&stored.body[..])
            .arg(if stored.body_too_large { "1" } else { "0" })
            .arg(retention_ms)
            .arg(self.commands);
        for a in &self.argv {
            invocation.arg(a.as_slice());
        }
        let mut conn = conn.clone();
        let answer = invocation.invoke_async::<Value>(&mut conn).await;
        let outcome = match answer {
            Ok(Value::Array(parts)) => match parts.first() {
                Some(Value::Int(1)) => Ok(Outcome::Committed(stored)),
                Some(Value::Int(0)) => match lookup(&mut conn, record).await {
                    Ok(Some(found)) => Ok(Outcome::Found(found)),
                    Ok(None) => Err(LockError::Backend(BackendError::new(format!(
                        "committed record `{record}` was there, then gone"
                    )))),
                    Err(e) => Err(e),
                },
                _ => Err(unexpected(record, &parts)),
            },
            Ok(other) => Err(unexpected(record, &other)),
            Err(e) => Err(backend(
                "committing the writes and the record of",
                record,
                e,
            )),
        };
        commit.settle(outcome, prepared.response)
    }
}

fn unexpected(record: &str, what: &dyn std::fmt::Debug) -> LockError {
    LockError::Backend(BackendError::new(format!(
        "the commit of `{record}` got an unexpected answer: {what:?}"
    )))
}
