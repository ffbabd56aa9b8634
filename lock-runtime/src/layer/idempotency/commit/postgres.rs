//! Committed records in PostgreSQL: a row written in the handler's own
//! transaction.

use sqlx::{Postgres, Transaction};

use super::store::CommitStore;
use super::table::{INSERT, failed, lookup};
use super::{Commit, Outcome};
use crate::error::{BackendError, LockError};

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
        mut tx: Transaction<'_, Postgres>,
        response: impl axum::response::IntoResponse,
    ) -> Result<axum::response::Response, LockError> {
        let CommitStore::Postgres(store) = &self.0.store else {
            self.set_state(super::CommitState::Failed);
            return Err(LockError::Config(
                "Commit::postgres on a layer without `commit_with_postgres`".into(),
            ));
        };
        let prepared = match self.prepare(response).await {
            Ok(prepared) => prepared,
            Err(e) => return self.settle(Err(e), axum::response::Response::default()),
        };
        let stored = prepared.stored;
        let record = self.0.record.as_str();
        let retention = self.0.config.retention.as_secs_f64();
        let inserted: Result<Option<i32>, _> = sqlx::query_scalar(INSERT)
            .bind(record)
            .bind(&self.0.fingerprint)
            .bind(i16::try_from(stored.status).unwrap_or(i16::MAX))
            .bind(&stored.headers[..])
            .bind(&stored.body[..])
            .bind(stored.body_too_large)
            .bind(retention)
            .fetch_optional(&mut *tx)
            .await;
        let outcome = match inserted {
            Ok(Some(_)) => match tx.commit().await {
                Ok(()) => {
                    store.committed();
                    Ok(Outcome::Committed(stored))
                }
                Err(e) => Err(failed(
                    format!("committing the transaction with the record `{record}`"),
                    true,
                    e,
                )),
            },
            Ok(None) => {
                let _ = tx.rollback().await;
                match lookup(&store.pool, record).await {
                    Ok(Some(found)) => Ok(Outcome::Found(found)),
                    Ok(None) => Err(LockError::Backend(BackendError::new(format!(
                        "committed record `{record}` was there, then gone"
                    )))),
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(failed(
                format!("inserting the committed record `{record}`"),
                false,
                e,
            )),
        };
        self.settle(outcome, prepared.response)
    }
}
