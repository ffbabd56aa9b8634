//! Committed records in Redis: the handler's commands and the record in one
//! script call.

use std::borrow::Borrow;

use super::{Commit, CommitState};
use crate::backend::records::{CommitStore, committed};
use crate::error::LockError;
use crate::fence::commands::Writes;

impl Commit {
    /// Starts the handler's atomic step on the layer's Redis
    /// ([`commit_with_redis`](crate::layer::IdempotencyLayer::commit_with_redis),
    /// or the lock server with
    /// [`commit_on_lock_server`](crate::layer::IdempotencyLayer::commit_on_lock_server)):
    /// add its write commands with [`RedisCommit::cmd`], then send them with
    /// the response in [`RedisCommit::respond`].
    pub fn redis(&self) -> RedisCommit<'_> {
        RedisCommit {
            commit: self,
            writes: Writes::default(),
        }
    }
}

/// A handler's writes to Redis, to commit with its record: see
/// [`Commit::redis`].
#[must_use = "nothing is written until `.respond(response).await`"]
pub struct RedisCommit<'a> {
    commit: &'a Commit,
    writes: Writes,
}

impl std::fmt::Debug for RedisCommit<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Values may be secrets: count them.
        f.debug_struct("RedisCommit")
            .field("record", &self.commit.0.record)
            .field("commands", &self.writes.commands)
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
        self.writes.push(cmd.borrow());
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
        mut self,
        response: impl axum::response::IntoResponse,
    ) -> Result<axum::response::Response, LockError> {
        let commit = self.commit;
        if !commit.0.store.runs_redis_writes() {
            commit.set_state(CommitState::Failed);
            return Err(LockError::Config(
                "Commit::redis on a layer without `commit_with_redis` or \
                 `commit_on_lock_server`"
                    .into(),
            ));
        }
        if let Some(e) = self.writes.invalid.take() {
            commit.set_state(CommitState::Failed);
            return Err(e);
        }
        let prepared = match commit.prepare(response).await {
            Ok(prepared) => prepared,
            Err(e) => return commit.settle(Err(e), axum::response::Response::default()),
        };
        let (record, retention) = (&commit.0.record, commit.0.config.retention);
        let fingerprint = &commit.0.fingerprint;
        let (stored, writes) = (prepared.stored, &self.writes);
        let outcome = match (&commit.0.store, &commit.0.claim) {
            (CommitStore::Redis(conn), _) => {
                committed::commit(conn, record, fingerprint, stored, retention, writes).await
            }
            (_, Some((client, ours))) => client.backend().commit_record(ours, stored, writes).await,
            (_, None) => unreachable!("a lock server's commit carries its claim"),
        };
        commit.settle(outcome, prepared.response)
    }
}
