//! Committed records in PostgreSQL: a row written in the handler's own
//! transaction.

use sqlx::{Postgres, Transaction};

use super::Commit;
use crate::backend::records::CommitStore;
use crate::backend::records::postgres::commit;
use crate::error::LockError;

impl Commit {
    /// Writes the completed record (built from `response`, as the layer
    /// stores it) in `tx`, then commits `tx`: the handler's writes in `tx`
    /// and the record commit together, or not at all. Returns the response
    /// to send (the same).
    ///
    /// When another claimer of this record committed first (this one was
    /// paused past its claim's lease), nothing of `tx` is committed (it is
    /// rolled back) and its stored response is returned instead, as a
    /// replay. Call it last in the handler, with nothing left to do but
    /// answer.
    ///
    /// # Errors
    ///
    /// [`LockError::Backend`] when the insert or the commit failed (the
    /// table is missing: run [`POSTGRES_SCHEMA`]; the database is down; a
    /// serialization failure): `tx` is rolled back or its outcome is unknown.
    /// Either way the layer releases the claim rather than store the
    /// handler's answer, so the client's retry looks here again. The same
    /// for [`LockError::Config`]: the layer has no PostgreSQL store, or the
    /// response body could not be read.
    ///
    /// [`POSTGRES_SCHEMA`]: super::POSTGRES_SCHEMA
    pub async fn postgres(
        &self,
        tx: Transaction<'_, Postgres>,
        response: impl axum::response::IntoResponse,
    ) -> Result<axum::response::Response, LockError> {
        let CommitStore::Postgres(pool) = &self.0.store else {
            self.set_state(super::CommitState::Failed);
            return Err(LockError::Config(
                "Commit::postgres on a layer without `commit_with_postgres`".into(),
            ));
        };
        let prepared = match self.prepare(response).await {
            Ok(prepared) => prepared,
            Err(e) => return self.settle(Err(e), axum::response::Response::default()),
        };
        let (record, retention) = (&self.0.record, self.0.config.retention);
        let fingerprint = &self.0.fingerprint;
        let outcome = commit(pool, tx, record, fingerprint, prepared.stored, retention).await;
        self.settle(outcome, prepared.response)
    }
}
