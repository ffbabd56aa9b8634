//! A record committed with its work in one step, in PostgreSQL (one
//! transaction) or Redis (one script call): exactly once across crashes for
//! work whose effects live there (`RecordRequest::commit_with_postgres`,
//! `commit_with_redis`; `RecordGuard::commit_postgres`, `commit_redis`).

use std::borrow::Borrow;

use super::{Answer, COMPLETION_WAIT, RecordGuard, RecordRequest};
use crate::backend::records::{CommitOutcome, CommitStore, StoredResponse, committed};
use crate::error::LockError;
use crate::fence::commands::Writes;

/// What `RecordGuard::commit_postgres` or [`RecordGuard::commit_redis`]
/// did with the work's writes.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Committed {
    /// The writes committed with the record: the work is done, once.
    Ours,
    /// Another claimer of the key committed its work first (this one's
    /// lease ran out while it worked, and a duplicate claimed the record):
    /// nothing of these writes was committed. Its result.
    Earlier(Vec<u8>),
    /// Another payload was committed under the key meanwhile: nothing of
    /// these writes was committed.
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
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub fn commit_with_postgres(mut self, pool: sqlx::PgPool) -> Self {
        self.commit_store = Some(CommitStore::Postgres(pool));
        self
    }

    /// Keeps the record's committed copy on the Redis server behind `conn`
    /// (a hash beside the record's name,
    /// [`COMMITTED_SUFFIX`](super::COMMITTED_SUFFIX)), where the work's
    /// writes go: the work sends its write commands and its result in one
    /// script call ([`RecordGuard::commit_redis`]), and a claim looks there
    /// before it answers [`Claimed::Run`](super::Claimed::Run), as
    /// `commit_with_postgres` (feature `postgres`) does for rows.
    /// One server, which may be the lock backend's own.
    pub fn commit_with_redis(mut self, conn: redis::aio::ConnectionManager) -> Self {
        self.commit_store = Some(CommitStore::Redis(conn));
        self
    }

    /// Commits the work's Redis writes in the record itself, on the lock
    /// backend's server, where the work's data lives too: one script call
    /// ([`RecordGuard::commit_redis`]) runs the writes and completes the
    /// record. No copy is written, none is looked for before the work runs,
    /// and no completion follows, so exactly once across crashes costs no
    /// more round trips than a record completed without a store. A process
    /// killed after that call leaves the record completed; killed before
    /// it, nothing of the work is written, and the record expires with its
    /// lease.
    ///
    /// The lock backend must be one Redis server (or a Sentinel's master,
    /// to whose replicas the writes and the record go as one script):
    /// [`claim`](Self::claim) answers [`LockError::Config`] on the embedded
    /// backend, on Redlock and on a Cluster (use
    /// [`commit_with_redis`](Self::commit_with_redis) there).
    pub fn commit_on_lock_server(mut self) -> Self {
        self.commit_store = Some(CommitStore::LockServer);
        self
    }
}

/// Where the claim of a request with a commit store ends (a record's, a
/// layer's): a record ([`Answer::Run`]) committed in the store by a claimer
/// that died before completing it is [`Answer::Done`] (and completed with
/// that result), one committed for another payload [`Answer::Reused`]
/// (released); a store that does not answer is an error (released).
pub(super) async fn look(answer: Answer, store: CommitStore) -> Result<Answer, LockError> {
    let Answer::Run(mut guard) = answer else {
        return Ok(answer);
    };
    let found = store.lookup(guard.record()).await;
    guard.commit_store = Some(store);
    match found {
        Ok(None) => Ok(Answer::Run(guard)),
        Ok(Some(found)) if found.fingerprint == guard.ours().fingerprint => {
            tracing::debug!(
                key = guard.key(),
                record = guard.record(),
                "idempotency: committed with its work before; its result is the answer"
            );
            // Copied into the record, so later claims are answered there;
            // not waited for longer than COMPLETION_WAIT (the store holds
            // the result either way).
            let mut completing = Box::pin(guard.complete_quietly(found.stored.clone()));
            if tokio::time::timeout(COMPLETION_WAIT, &mut completing)
                .await
                .is_err()
            {
                tokio::spawn(completing);
            }
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
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub async fn commit_postgres(
        self,
        tx: sqlx::Transaction<'_, sqlx::Postgres>,
        result: impl AsRef<[u8]>,
    ) -> Result<Committed, LockError> {
        let Some(CommitStore::Postgres(pool)) = self.commit_store.clone() else {
            return Err(self.without_store("postgres"));
        };
        let ours = self.ours();
        let (record, fingerprint) = (ours.names.record.as_str(), ours.fingerprint.as_str());
        let stored = StoredResponse::result(result.as_ref());
        let commit = crate::backend::records::postgres::commit;
        let outcome = commit(&pool, tx, record, fingerprint, stored, ours.retention).await;
        self.settle_commit(outcome).await
    }

    /// Runs `writes` (Redis write commands, as `redis::cmd(..).arg(..)`
    /// builds them) and writes the record with `result`, in one script call
    /// on the store of [`commit_with_redis`](RecordRequest::commit_with_redis):
    /// the work's writes and the record commit together, or not at all;
    /// then the record is completed as by [`complete`](Self::complete). On
    /// a record claimed with
    /// [`commit_on_lock_server`](RecordRequest::commit_on_lock_server), the
    /// script runs on the lock server and completes the record itself. Call
    /// it last, with the work's writes as its commands.
    ///
    /// ```no_run
    /// use lock_runtime::records::Committed;
    /// use lock_runtime::{Claimed, LockClient, redis};
    ///
    /// # async fn consume(client: LockClient, data: redis::aio::ConnectionManager, id: &str, payload: &[u8]) -> Result<(), lock_runtime::LockError> {
    /// let claim = client.record(id).fingerprint(payload).commit_with_redis(data);
    /// if let Claimed::Run(guard) = claim.claim().await? {
    ///     // The payment and the record commit together.
    ///     let pay = [
    ///         redis::cmd("HSET").arg(format!("payment:{id}")).arg("amount").arg(1250).clone(),
    ///         redis::cmd("INCRBY").arg("paid:total").arg(1250).clone(),
    ///     ];
    ///     match guard.commit_redis(&pay, b"paid 1250").await? {
    ///         Committed::Ours => {}       // paid, once
    ///         Committed::Earlier(_) => {} // paid once, by a claimer before us
    ///         Committed::Reused => {}     // another payload under this id
    ///         other => unreachable!("not handled: {other:?}"),
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// The commands are those of
    /// [`fence::allowed_commands`](crate::fence::allowed_commands), sent as
    /// data (the script declares their keys), all to the one server of the
    /// store's connection.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`]: a command off the allow-list or with the
    /// wrong number of arguments, or a record claimed without
    /// `commit_with_redis` or `commit_on_lock_server` (nothing is sent, and
    /// the record is released).
    /// [`LockError::Backend`]: the server failed or did not answer (the
    /// outcome may be unknown; so too on the lock server when fewer
    /// replicas than `min_replica_acks` asks acknowledged the commit), or a
    /// command failed inside the script (the
    /// commands before it stay applied, with no record, as in any Redis
    /// script): the record is released, so the next claim looks for its
    /// committed copy again and runs the work only if there is none.
    pub async fn commit_redis<C: Borrow<redis::Cmd>>(
        self,
        writes: impl IntoIterator<Item = C>,
        result: impl AsRef<[u8]>,
    ) -> Result<Committed, LockError> {
        let mut commands = Writes::default();
        for cmd in writes {
            commands.push(cmd.borrow());
        }
        if let Some(e) = commands.invalid.take() {
            return Err(e); // the guard, dropped, releases the record
        }
        let ours = self.ours();
        let stored = StoredResponse::result(result.as_ref());
        let outcome = match &self.commit_store {
            Some(CommitStore::Redis(conn)) => {
                let (record, fingerprint) = (&ours.names.record, &ours.fingerprint);
                let retention = ours.retention;
                committed::commit(conn, record, fingerprint, stored, retention, &commands).await
            }
            Some(CommitStore::LockServer) => {
                let backend = self.client().backend();
                backend.commit_record(ours, stored, &commands).await
            }
            _ => return Err(self.without_store("redis")),
        };
        self.settle_commit(outcome).await
    }

    /// The error of a commit to `store` on a record claimed without it
    /// (dropped, the guard releases the record).
    fn without_store(&self, store: &str) -> LockError {
        LockError::Config(format!(
            "RecordGuard::commit_{store} on record `{}`, claimed without \
             `commit_with_{store}`: nothing was committed",
            self.key()
        ))
    }

    /// What a commit's `outcome` makes of the record: completed with what
    /// committed (ours, or an earlier claimer's for this payload), or
    /// released.
    async fn settle_commit(
        self,
        outcome: Result<CommitOutcome, LockError>,
    ) -> Result<Committed, LockError> {
        match outcome {
            Ok(CommitOutcome::Committed(stored)) => {
                self.complete_quietly(stored).await;
                Ok(Committed::Ours)
            }
            Ok(CommitOutcome::Completed) => {
                self.settled();
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
                match self.commit_store {
                    // The record holds it: nothing to complete.
                    Some(CommitStore::LockServer) => self.settled(),
                    _ => self.complete_quietly(found.stored).await,
                }
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
                 the result in the commit store"),
        }
    }
}
