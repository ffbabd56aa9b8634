//! [`CommitStore`]: where a layer's committed records live, and the lookup
//! the layer makes there before a claimed request runs.

use std::fmt;

use crate::backend::records::CommittedRecord;
use crate::error::LockError;

/// Where a layer's committed records live, beside the handler's writes.
#[derive(Clone)]
pub(in crate::layer::idempotency) enum CommitStore {
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
    pub(super) fn redis(&self) -> Option<&::redis::aio::ConnectionManager> {
        match self {
            #[cfg(feature = "postgres")]
            CommitStore::Postgres(_) => None,
            CommitStore::Redis(conn) => Some(conn),
        }
    }

    /// The committed record named `record`, if one is there and not expired.
    pub(super) async fn lookup(&self, record: &str) -> Result<Option<CommittedRecord>, LockError> {
        match self {
            #[cfg(feature = "postgres")]
            CommitStore::Postgres(pool) => {
                crate::backend::records::postgres::lookup(pool, record).await
            }
            CommitStore::Redis(conn) => super::committed::lookup(&mut conn.clone(), record).await,
        }
    }
}
