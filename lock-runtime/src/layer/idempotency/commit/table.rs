//! The table of committed records in PostgreSQL: its schema and queries,
//! the layer's store, which looks records up there, and pruning.

use std::sync::atomic::{AtomicU64, Ordering};

use sqlx::PgPool;

use super::committed::Committed;
use crate::backend::records::StoredResponse;
use crate::error::{BackendError, LockError};

/// The table of committed records, one row per record: run it once (it is
/// idempotent) before the first request, as
/// [`fence::POSTGRES_SCHEMA`](crate::fence::POSTGRES_SCHEMA) for fences.
///
/// `record` is the layer's record name (its key prefix, then a SHA-256 of
/// the scope, method, route and key); `expires_at` is the commit's time plus
/// the layer's [retention](crate::layer::IdempotencyLayer::retention): an
/// expired row is ignored, and removed by [`prune_postgres`] in batches.
pub const POSTGRES_SCHEMA: &str = "\
CREATE TABLE IF NOT EXISTS lock_idempotency (
    record         text        PRIMARY KEY,
    fingerprint    text        NOT NULL,
    status         smallint    NOT NULL,
    headers        bytea       NOT NULL,
    body           bytea       NOT NULL,
    body_too_large boolean     NOT NULL,
    committed_at   timestamptz NOT NULL DEFAULT now(),
    expires_at     timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS lock_idempotency_expires_at ON lock_idempotency (expires_at);
";

/// Inserts the record, or takes the place of an expired one; no row back
/// when a live record is there (another claimer committed first). A
/// concurrent insert of the same record waits for the other transaction,
/// then re-checks: two cannot both commit.
pub(super) const INSERT: &str = "\
INSERT INTO lock_idempotency AS r
    (record, fingerprint, status, headers, body, body_too_large, committed_at, expires_at)
VALUES ($1, $2, $3, $4, $5, $6, now(), now() + make_interval(secs => $7))
ON CONFLICT (record) DO UPDATE SET
    fingerprint = EXCLUDED.fingerprint, status = EXCLUDED.status,
    headers = EXCLUDED.headers, body = EXCLUDED.body,
    body_too_large = EXCLUDED.body_too_large,
    committed_at = EXCLUDED.committed_at, expires_at = EXCLUDED.expires_at
    WHERE r.expires_at <= now()
RETURNING 1";

const LOOKUP: &str = "\
SELECT fingerprint, status, headers, body, body_too_large FROM lock_idempotency
WHERE record = $1 AND expires_at > now()";

/// Deletes up to `$1` expired rows, oldest first, skipping rows another
/// transaction holds.
const PRUNE: &str = "\
DELETE FROM lock_idempotency WHERE record IN (
    SELECT record FROM lock_idempotency WHERE expires_at <= now()
    ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED)";

/// A layer prunes one batch after this many commits.
const PRUNE_EVERY: u64 = 256;
/// The layer's batch: bounded, so a prune never holds many rows at once.
const PRUNE_BATCH: u32 = 500;

/// The layer's PostgreSQL store.
pub(in crate::layer::idempotency) struct PostgresStore {
    pub(in crate::layer::idempotency) pool: PgPool,
    commits: AtomicU64,
}

impl PostgresStore {
    pub(in crate::layer::idempotency) fn new(pool: PgPool) -> Self {
        Self {
            pool,
            commits: AtomicU64::new(0),
        }
    }

    pub(super) async fn lookup(&self, record: &str) -> Result<Option<Committed>, LockError> {
        lookup(&self.pool, record).await
    }

    /// Counts a commit, and every [`PRUNE_EVERY`] commits removes a batch of
    /// expired rows in the background.
    pub(super) fn committed(&self) {
        if self.commits.fetch_add(1, Ordering::Relaxed) % PRUNE_EVERY != PRUNE_EVERY - 1 {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let pool = self.pool.clone();
        runtime.spawn(async move {
            match prune_postgres(&pool, PRUNE_BATCH).await {
                Ok(n) => {
                    tracing::debug!(removed = n, "idempotency: expired committed records pruned")
                }
                Err(e) => tracing::warn!(
                    error = &e as &dyn std::error::Error,
                    "idempotency: cannot prune expired committed records"
                ),
            }
        });
    }
}

pub(super) async fn lookup(
    conn: impl sqlx::PgExecutor<'_>,
    record: &str,
) -> Result<Option<Committed>, LockError> {
    type Row = (String, i16, Vec<u8>, Vec<u8>, bool);
    let row: Option<Row> = sqlx::query_as(LOOKUP)
        .bind(record)
        .fetch_optional(conn)
        .await
        .map_err(|e| {
            failed(
                format!("looking up the committed record `{record}`"),
                false,
                e,
            )
        })?;
    Ok(row.map(
        |(fingerprint, status, headers, body, body_too_large)| Committed {
            fingerprint,
            stored: StoredResponse {
                status: u16::try_from(status).unwrap_or(500),
                headers: headers.into(),
                body: body.into(),
                body_too_large,
            },
        },
    ))
}

/// Removes up to `batch` expired committed records (oldest first) and says
/// how many it removed. A layer with
/// [`commit_with_postgres`](crate::layer::IdempotencyLayer::commit_with_postgres)
/// calls it by itself now and then; call it from a job to keep the table
/// small between busy periods (a loop until it returns less than `batch`).
/// Expired rows are never replayed, pruned or not.
pub async fn prune_postgres(pool: &PgPool, batch: u32) -> Result<u64, LockError> {
    let batch = i64::from(batch.max(1));
    let done = sqlx::query(PRUNE)
        .bind(batch)
        .execute(pool)
        .await
        .map_err(|e| failed("pruning expired committed records".into(), false, e))?;
    Ok(done.rows_affected())
}

pub(super) fn failed(doing: String, committing: bool, e: sqlx::Error) -> LockError {
    let no_table = e
        .as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|code| code == "42P01"); // undefined_table
    let hint = if no_table {
        " (create its table with `layer::idempotency::POSTGRES_SCHEMA`)"
    } else {
        ""
    };
    let context = format!("{doing} in PostgreSQL failed{hint}");
    // A COMMIT that got no answer (the connection dropped) may have committed.
    let unknown = committing && e.as_database_error().is_none();
    LockError::Backend(if unknown {
        BackendError::outcome_unknown(context, Some(Box::new(e)))
    } else {
        BackendError::with_source(context, e)
    })
}
