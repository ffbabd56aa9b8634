//! [`CommitStore`]: where committed records live (a layer's, a record
//! request's), and the lookup a claim makes there before its work runs.

use std::fmt;

use super::CommittedRecord;
use crate::error::LockError;

/// Where records are committed with their work's writes.
#[derive(Clone)]
pub(crate) enum CommitStore {
    #[cfg(feature = "postgres")]
    Postgres(sqlx::PgPool),
    Redis(::redis::aio::ConnectionManager),
    /// The record itself, on the lock server (`commit_on_lock_server`):
    /// nothing to look up, no copy.
    LockServer,
}

impl fmt::Debug for CommitStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            #[cfg(feature = "postgres")]
            CommitStore::Postgres(_) => f.write_str("Postgres"),
            CommitStore::Redis(_) => f.write_str("Redis"),
            CommitStore::LockServer => f.write_str("LockServer"),
        }
    }
}

impl CommitStore {
    /// Whether a commit sends Redis write commands (not PostgreSQL's rows).
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    pub(crate) fn runs_redis_writes(&self) -> bool {
        match self {
            #[cfg(feature = "postgres")]
            CommitStore::Postgres(_) => false,
            CommitStore::Redis(_) | CommitStore::LockServer => true,
        }
    }

    /// `Ok` unless the records of `backend` cannot be committed here (the
    /// lock server's, where the backend is no one Redis server).
    pub(crate) fn usable_with(&self, backend: &crate::backend::Backend) -> Result<(), LockError> {
        match self {
            CommitStore::LockServer => backend.commits_records(),
            _ => Ok(()),
        }
    }

    /// The committed record named `record`, if one is there and not expired
    /// (on the lock server, the record is its own copy: its claim found
    /// none, and does not look).
    pub(crate) async fn lookup(&self, record: &str) -> Result<Option<CommittedRecord>, LockError> {
        match self {
            CommitStore::LockServer => Ok(None),
            #[cfg(feature = "postgres")]
            CommitStore::Postgres(pool) => super::postgres::lookup(pool, record).await,
            CommitStore::Redis(conn) => super::committed::lookup(&mut conn.clone(), record).await,
        }
    }
}
