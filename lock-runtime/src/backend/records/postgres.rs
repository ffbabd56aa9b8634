//! Committed records in PostgreSQL: a row written in the work's own
//! transaction (`IdempotencyLayer`'s `Commit::postgres`,
//! `RecordGuard::commit_postgres`), its schema and queries, the store that
//! looks records up there before their work runs, and pruning.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sqlx::{PgPool, Postgres, Transaction};

use super::{CommitOutcome, CommittedRecord, StoredResponse};
use crate::error::{BackendError, LockError};

/// The table of committed records, one row per record: run it once (it is
/// idempotent) before the first commit, as
/// [`fence::POSTGRES_SCHEMA`](crate::fence::POSTGRES_SCHEMA) for fences.
///
/// `record` is the record's name (the client's key prefix, then a SHA-256
/// of the key; a layer's also of the scope, method and route); `expires_at`
/// is the commit's time plus the record's retention: an expired row is
/// ignored, and removed by [`prune_postgres`] in batches. The status and
/// headers are a layer's response's (0 and none for a record's result).
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
const INSERT: &str = "\
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

/// A process prunes one batch after this many commits (through any pool).
const PRUNE_EVERY: u64 = 256;
/// Its batch: bounded, so a prune never holds many rows at once.
const PRUNE_BATCH: u32 = 500;

/// Commits in this process, counted for pruning.
static COMMITS: AtomicU64 = AtomicU64::new(0);

/// The committed record named `record`, if one is there and not expired.
pub(crate) async fn lookup(
    conn: impl sqlx::PgExecutor<'_>,
    record: &str,
) -> Result<Option<CommittedRecord>, LockError> {
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
        |(fingerprint, status, headers, body, body_too_large)| CommittedRecord {
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

/// Writes the record `record` (its fingerprint digest `fingerprint`,
/// `stored`, kept `retention`) in `tx`, then commits `tx`: the work's writes
/// in `tx` and the record commit together, or not at all. A live record
/// there already (another claimer committed first) is
/// [`CommitOutcome::Found`], and nothing of `tx` is committed. Every
/// [`PRUNE_EVERY`] commits of the process, a batch of expired rows is
/// removed from `pool` in the background.
pub(crate) async fn commit(
    pool: &PgPool,
    mut tx: Transaction<'_, Postgres>,
    record: &str,
    fingerprint: &str,
    stored: StoredResponse,
    retention: Duration,
) -> Result<CommitOutcome, LockError> {
    let inserted: Result<Option<i32>, _> = sqlx::query_scalar(INSERT)
        .bind(record)
        .bind(fingerprint)
        .bind(i16::try_from(stored.status).unwrap_or(i16::MAX))
        .bind(&stored.headers[..])
        .bind(&stored.body[..])
        .bind(stored.body_too_large)
        .bind(retention.as_secs_f64())
        .fetch_optional(&mut *tx)
        .await;
    match inserted {
        Ok(Some(_)) => match tx.commit().await {
            Ok(()) => {
                prune_now_and_then(pool);
                Ok(CommitOutcome::Committed(stored))
            }
            Err(e) => Err(failed(
                format!("committing the transaction with the record `{record}`"),
                true,
                e,
            )),
        },
        Ok(None) => {
            let _ = tx.rollback().await;
            match lookup(pool, record).await? {
                Some(found) => Ok(CommitOutcome::Found(found)),
                None => Err(LockError::Backend(BackendError::new(format!(
                    "committed record `{record}` was there, then gone"
                )))),
            }
        }
        Err(e) => Err(failed(
            format!("inserting the committed record `{record}`"),
            false,
            e,
        )),
    }
}

/// Counts a commit, and every [`PRUNE_EVERY`] commits removes a batch of
/// expired rows from `pool` in the background.
fn prune_now_and_then(pool: &PgPool) {
    if COMMITS.fetch_add(1, Ordering::Relaxed) % PRUNE_EVERY != PRUNE_EVERY - 1 {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let pool = pool.clone();
    runtime.spawn(async move {
        match prune_postgres(&pool, PRUNE_BATCH).await {
            Ok(n) => tracing::debug!(removed = n, "idempotency: expired committed records pruned"),
            Err(e) => tracing::warn!(
                error = &e as &dyn std::error::Error,
                "idempotency: cannot prune expired committed records"
            ),
        }
    });
}

/// Removes up to `batch` expired committed records (oldest first) and says
/// how many it removed. A store (`IdempotencyLayer::commit_with_postgres`,
/// [`RecordRequest::commit_with_postgres`](crate::RecordRequest::commit_with_postgres))
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

fn failed(doing: String, committing: bool, e: sqlx::Error) -> LockError {
    let no_table = e
        .as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|code| code == "42P01"); // undefined_table
    let hint = if no_table {
        " (create its table with `records::POSTGRES_SCHEMA`)"
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
