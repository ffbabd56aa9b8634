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
}

impl fmt::Debug for CommitStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            #[cfg(feature = "postgres")]
            CommitStore::Postgres(_) => f.write_str("Postgres"),
            CommitStore::Redis(_) => f.write_str("Redis"),
        }
    }
}

impl CommitStore {
    /// The Redis connection, where the store is Redis.
    pub(crate) fn redis(&self) -> Option<&::redis::aio::ConnectionManager> {
        match self {
            #[cfg(feature = "postgres")]
            CommitStore::Postgres(_) => None,
            CommitStore::Redis(conn) => Some(conn),
        }
    }

    /// The committed record named `record`, if one is there and not expired.
    pub(crate) async fn lookup(&self, record: &str) -> Result<Option<CommittedRecord>, LockError> {
        match self {
            #[cfg(feature = "postgres")]
            CommitStore::Postgres(pool) => super::postgres::lookup(pool, record).await,
            CommitStore::Redis(conn) => super::committed::lookup(&mut conn.clone(), record).await,
        }
    }
}
