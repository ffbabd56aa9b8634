//! `fence::postgres`: the check and the record as one row lock in the
//! caller's transaction.

use crate::error::BackendError;
use crate::{error::LockError, key};

/// The table [`postgres()`](fn@postgres) records tokens in, one row per
/// resource. Run it once (it is idempotent) before the first fenced write.
///
/// `token` is `bigint`: a lock's tokens come from a Redis counter, which
/// stops at `i64::MAX`. `updated_at` is the time of the last fenced write,
/// for pruning (see the [module docs](super#postgresql)).
pub const POSTGRES_SCHEMA: &str = "\
CREATE TABLE IF NOT EXISTS lock_fence (
    resource   text        PRIMARY KEY,
    token      bigint      NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS lock_fence_updated_at ON lock_fence (updated_at);
";

/// Takes the row of `resource` and raises it to `token`, or refuses a stale
/// one: the whole check, in one statement. Its row lock makes a concurrent
/// writer of the same resource wait, then re-check against what this one
/// committed.
const FENCE: &str = "\
INSERT INTO lock_fence AS f (resource, token, updated_at) VALUES ($1, $2, now())
ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token, updated_at = now()
    WHERE f.token <= EXCLUDED.token
RETURNING f.token";

/// Fences the caller's transaction: call it inside the transaction, before
/// the writes it protects, with the fencing token of the lock held for
/// `resource`. `Ok` means the token is at least the highest recorded for
/// `resource`, which it now is, and the row stays locked until the
/// transaction ends: writers of the same resource wait for it, then are
/// checked against this token. See the [module docs](super#postgresql).
///
/// ```no_run
/// # async fn pay(pool: sqlx::PgPool, token: u64) -> Result<(), Box<dyn std::error::Error>> {
/// use lock_runtime::fence;
///
/// let mut tx = pool.begin().await?;
/// fence::postgres(&mut *tx, "order:42", token).await?; // Err(Stale): dropping tx rolls back
/// sqlx::query("UPDATE orders SET status = 'paid' WHERE id = 42")
///     .execute(&mut *tx)
///     .await?;
/// tx.commit().await?;
/// # Ok(())
/// # }
/// ```
///
/// # Errors
///
/// * [`LockError::Stale`]: a later token already fenced `resource`: roll the
///   transaction back (dropping it does), nothing it wrote may commit.
/// * [`LockError::InvalidKey`]: the resource is empty, too long or has
///   control characters. [`LockError::Config`]: `token` is above `i64::MAX`.
/// * [`LockError::Backend`]: the database failed, the table is missing (run
///   [`POSTGRES_SCHEMA`]), or, under `REPEATABLE READ` or `SERIALIZABLE`, a
///   concurrent writer of the resource committed first (a serialization
///   failure: retry the transaction, which then sees its token).
pub async fn postgres(
    conn: &mut sqlx::PgConnection,
    resource: &str,
    token: u64,
) -> Result<(), LockError> {
    key::validate_key(resource)?;
    let Ok(signed) = i64::try_from(token) else {
        return Err(LockError::Config(format!(
            "fencing token {token} is above i64::MAX: no lock issues it"
        )));
    };
    let failed = |e: sqlx::Error| {
        let no_table = e
            .as_database_error()
            .and_then(|d| d.code())
            .is_some_and(|code| code == "42P01"); // undefined_table
        let hint = if no_table {
            " (create its table with `fence::POSTGRES_SCHEMA`)"
        } else {
            ""
        };
        LockError::Backend(BackendError::with_source(
            format!("the fence of `{resource}` in PostgreSQL failed{hint}"),
            e,
        ))
    };
    let raised: Option<i64> = sqlx::query_scalar(FENCE)
        .bind(resource)
        .bind(signed)
        .fetch_optional(&mut *conn)
        .await
        .map_err(failed)?;
    if raised.is_some() {
        return Ok(());
    }
    // Refused: the row exists and is locked by this transaction now, so it
    // holds the value that refused us.
    let highest: i64 = sqlx::query_scalar("SELECT token FROM lock_fence WHERE resource = $1")
        .bind(resource)
        .fetch_one(&mut *conn)
        .await
        .map_err(failed)?;
    Err(LockError::Stale {
        resource: resource.to_owned(),
        token,
        highest: u64::try_from(highest).unwrap_or(0),
    })
}
