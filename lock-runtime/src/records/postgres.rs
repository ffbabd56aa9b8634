//! A record committed with its work in one PostgreSQL transaction
//! ([`RecordRequest::commit_with_postgres`], [`RecordGuard::commit_postgres`]):
//! exactly once across crashes for work whose effects are rows.

use sqlx::{PgPool, Postgres, Transaction};

use super::{Answer, RecordGuard, RecordRequest};
use crate::backend::records::postgres::{commit, lookup};
use crate::backend::records::{CommitOutcome, StoredResponse};
use crate::error::LockError;

/// What [`RecordGuard::commit_postgres`] did with the work's transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Committed {
    /// The transaction committed with the record: the work is done, once.
    Ours,
    /// Another claimer of the key committed its work first (this one's
    /// lease ran out while it worked, and a duplicate claimed the record):
    /// nothing of the transaction was committed. Its result.
    Earlier(Vec<u8>),
    /// Another payload was committed under the key meanwhile: nothing of
    /// the transaction was committed.
    Reused,
}

impl RecordRequest {
    /// Keeps the record's committed copy in `pool`'s table
    /// `lock_idempotency` ([`POSTGRES_SCHEMA`](super::POSTGRES_SCHEMA)):
    /// the work commits its rows and its result in one transaction
    /// ([`RecordGuard::commit_postgres`]), and a claim looks there before
    /// it answers [`Claimed::Run`](super::Claimed::Run). So a process killed
    /// after the commit, before the record was completed, leaves the work
    /// done and its result found: the redelivered message gets
    /// [`Claimed::Done`](super::Claimed::Done), and the work does not run
    /// again. A claim whose look fails releases the record and answers
    /// [`LockError::Backend`].
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub fn commit_with_postgres(mut self, pool: PgPool) -> Self {
        self.commit_store = Some(pool);
        self
    }
}

/// Where the claim of a request with a commit store ends: a record
/// ([`Answer::Run`]) committed in the store by a claimer that died before
/// completing it is [`Answer::Done`] (and completed with that result), one
/// committed for another payload [`Answer::Reused`] (released).
pub(super) async fn look(answer: Answer, pool: PgPool) -> Result<Answer, LockError> {
    let Answer::Run(mut guard) = answer else {
        return Ok(answer);
    };
    let found = lookup(&pool, guard.record()).await;
    guard.commit_store = Some(pool);
    match found {
        Ok(None) => Ok(Answer::Run(guard)),
        Ok(Some(found)) if found.fingerprint == guard.ours().fingerprint => {
            tracing::debug!(
                key = guard.key(),
                record = guard.record(),
                "idempotency: committed with its work before; its result is the answer"
            );
            guard.complete_quietly(found.stored.clone()).await;
            Ok(Answer::Done(found.stored))
        }
        Ok(Some(_)) => {
            let _ = guard.release().await;
            Ok(Answer::Reused)
        }
        Err(e) => {
            let _ = guard.release().await;
            Err(e)
        }
    }
}

impl RecordGuard {
    /// Writes the record with `result` in `tx`, then commits `tx`: the
    /// work's rows in `tx` and the record commit together, or not at all
    /// (a row of `lock_idempotency`, beside the record on the lock
    /// backend, which is then completed as by
    /// [`complete`](Self::complete)). Call it last, with the work's writes
    /// done in `tx`, on a record claimed with
    /// [`commit_with_postgres`](RecordRequest::commit_with_postgres).
    ///
    /// ```no_run
    /// use lock_runtime::records::Committed;
    /// use lock_runtime::sqlx;
    /// use lock_runtime::{Claimed, LockClient};
    ///
    /// # async fn consume(client: LockClient, pool: sqlx::PgPool, id: &str, payload: &[u8]) -> Result<(), Box<dyn std::error::Error>> {
    /// let claim = client.record(id).fingerprint(payload).commit_with_postgres(pool.clone());
    /// match claim.claim().await? {
    ///     Claimed::Run(guard) => {
    ///         let mut tx = pool.begin().await?;
    ///         sqlx::query("INSERT INTO payments (message, amount) VALUES ($1, 1250)")
    ///             .bind(id)
    ///             .execute(&mut *tx)
    ///             .await?;
    ///         // The payment and the record commit together.
    ///         match guard.commit_postgres(tx, b"paid 1250").await? {
    ///             Committed::Ours => {}       // paid, once
    ///             Committed::Earlier(_) => {} // paid once, by a claimer before us
    ///             Committed::Reused => {}     // another payload under this id
    ///             other => return Err(format!("not handled: {other:?}").into()),
    ///         }
    ///     }
    ///     Claimed::Done(_) => {} // paid before (the process may have died since)
    ///     _ => {}                // in flight elsewhere, or another payload
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`LockError::Backend`] when the insert or the commit failed (the
    /// table is missing: run [`POSTGRES_SCHEMA`](super::POSTGRES_SCHEMA);
    /// the database is down; a serialization failure): `tx` is rolled back
    /// or its outcome is unknown, and the record is released, so the next
    /// claim looks in the table again and runs the work only if nothing
    /// committed. [`LockError::Config`] on a record claimed without
    /// `commit_with_postgres` (nothing is committed).
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub async fn commit_postgres(
        self,
        tx: Transaction<'_, Postgres>,
        result: impl AsRef<[u8]>,
    ) -> Result<Committed, LockError> {
        let Some(pool) = self.commit_store.clone() else {
            return Err(LockError::Config(format!(
                "RecordGuard::commit_postgres on record `{}`, claimed without \
                 `commit_with_postgres`: nothing was committed",
                self.key()
            )));
        };
        let stored = StoredResponse {
            status: 0,
            headers: bytes::Bytes::new(),
            body: bytes::Bytes::copy_from_slice(result.as_ref()),
            body_too_large: false,
        };
        let ours = self.ours();
        let (record, fingerprint) = (ours.names.record.as_str(), ours.fingerprint.as_str());
        let outcome = commit(&pool, tx, record, fingerprint, stored, ours.retention).await;
        match outcome {
            Ok(CommitOutcome::Committed(stored)) => {
                self.complete_quietly(stored).await;
                Ok(Committed::Ours)
            }
            Ok(CommitOutcome::Found(found)) if found.fingerprint == self.ours().fingerprint => {
                tracing::warn!(
                    key = self.key(),
                    record = self.record(),
                    "idempotency: another claimer committed this record first; nothing of ours \
                     was committed"
                );
                let earlier = found.stored.body.to_vec();
                self.complete_quietly(found.stored).await;
                Ok(Committed::Earlier(earlier))
            }
            Ok(CommitOutcome::Found(_)) => {
                let _ = self.release().await;
                Ok(Committed::Reused)
            }
            Err(e) => {
                let _ = self.release().await;
                Err(e)
            }
        }
    }

    /// Completes the record with `stored`, which its commit store holds
    /// already: a completion that fails is logged, not returned (a claim
    /// finds the result in the store).
    async fn complete_quietly(self, stored: StoredResponse) {
        let (key, record) = (self.key().to_owned(), self.record().to_owned());
        match self.completing(stored).await {
            Ok(true) => {}
            Ok(false) => tracing::debug!(%key, %record,
                "idempotency: committed; another claimer's record is on the lock backend"),
            Err(e) => tracing::warn!(%key, %record, error = &e as &dyn std::error::Error,
                "idempotency: committed, but the record could not be completed; claims find \
                 the result in PostgreSQL"),
        }
    }
}
