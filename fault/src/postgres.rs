//! The shared record in PostgreSQL (scenario 2 on a PostgreSQL store): one
//! row per lock key in `fault_record` (counter, version, the highest token
//! the record has seen), changed only in transactions that, with fencing on,
//! first call `lock_runtime::fence::postgres(&mut *tx, key, token)`: a stale
//! token is `LockError::Stale`, the transaction rolls back and the access is
//! a refused one, as the Redis store's are.
//!
//! As in the Redis store (`store.rs`), both the read and the write of a
//! read-modify-write are fenced, so a holder paused between its read and its
//! write is refused once a newer holder has read. The fence is the library's
//! (its `lock_fence` table); the harness's own bookkeeping beside it, in the
//! same transaction, is only what the checker needs: the write log
//! (`fault_write`: `seq fence max_before read_version worker op`, where
//! `max_before` is the record's highest token before the write, read under
//! the record's row lock) and the access log (`fault_access`). With fencing
//! off the same transactions run without the fence call: the row lock still
//! orders them, so the logs are a serial order, and the checker must find
//! the stale writes in it.
//!
//! The operation draws and the marks the harness strikes on (`reader`) stay
//! in the Redis store: the harness reads them with one `HMGET` every 5 ms.

use sqlx::PgPool;

use crate::record::{Access, AccessKind, ReadResult, Record, StoredWrite, WriteResult};

/// The harness's tables, beside the library's `fence::POSTGRES_SCHEMA`.
const SCHEMA: &str = "\
CREATE TABLE IF NOT EXISTS fault_record (
    key      text   PRIMARY KEY,
    counter  bigint NOT NULL DEFAULT 0,
    version  bigint NOT NULL DEFAULT 0,
    max_fence bigint NOT NULL DEFAULT 0,
    at       bigint NOT NULL DEFAULT 0,
    rejected bigint NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS fault_write (
    key text, seq bigint, fence bigint, max_before bigint, read_version bigint,
    worker bigint, op bigint, PRIMARY KEY (key, seq)
);
CREATE TABLE IF NOT EXISTS fault_access (
    key text, at bigint, kind text, fence bigint, worker bigint, op bigint,
    PRIMARY KEY (key, at)
);
";

/// One access of the record: which row, under which token, by whom.
#[derive(Clone, Copy, Debug)]
pub struct Fenced<'a> {
    /// The lock key, the record's row.
    pub key: &'a str,
    /// The holder's fencing token.
    pub fence: u64,
    /// Whether the transaction checks `fence` first (off: the row lock
    /// alone orders the accesses).
    pub fencing: bool,
    /// The worker, for the logs.
    pub worker: u32,
    /// The worker's operation number, for the logs.
    pub op: u64,
}

/// A worker's handle on the PostgreSQL record.
#[derive(Clone, Debug)]
pub struct PgRecord {
    pool: PgPool,
}

fn int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn nat(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

impl PgRecord {
    /// Connects to the database at `url` (one connection per worker
    /// process: its tasks take turns).
    pub async fn connect(url: &str) -> Result<Self, sqlx::Error> {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(std::time::Duration::from_secs(60))
            .connect(url)
            .await?;
        Ok(Self { pool })
    }

    /// The fenced read (exclusive): `Rejected` when `fence` is stale.
    pub async fn read(&self, access: Fenced<'_>) -> Result<ReadResult, sqlx::Error> {
        let Fenced { key, fence, .. } = access;
        let Some(mut tx) = self.begin_fenced(access).await? else {
            return Ok(ReadResult::Rejected);
        };
        let (version, counter, at): (i64, i64, i64) = sqlx::query_as(
            "UPDATE fault_record SET max_fence = GREATEST(max_fence, $2), at = at + 1
             WHERE key = $1 RETURNING version, counter, at",
        )
        .bind(key)
        .bind(int(fence))
        .fetch_one(&mut *tx)
        .await?;
        log_access(&mut tx, access, at, "r").await?;
        tx.commit().await?;
        Ok(ReadResult::Ok {
            version: nat(version),
            counter: nat(counter),
        })
    }

    /// The fenced write of `counter` after reading `version`: applied
    /// whatever version was read (no compare-and-set: that would hide the
    /// overlaps the checker looks for), logged with what it read.
    pub async fn write(
        &self,
        access: Fenced<'_>,
        version: u64,
        counter: u64,
    ) -> Result<WriteResult, sqlx::Error> {
        let Fenced {
            key,
            fence,
            worker,
            op,
            ..
        } = access;
        let Some(mut tx) = self.begin_fenced(access).await? else {
            return Ok(WriteResult::Rejected);
        };
        // The row lock orders this write among every other access of the key.
        let (seq, max_before): (i64, i64) = sqlx::query_as(
            "SELECT version + 1, max_fence FROM fault_record WHERE key = $1 FOR UPDATE",
        )
        .bind(key)
        .fetch_one(&mut *tx)
        .await?;
        let at: i64 = sqlx::query_scalar(
            "UPDATE fault_record SET version = $2, counter = $3,
                 max_fence = GREATEST(max_fence, $4), at = at + 1
             WHERE key = $1 RETURNING at",
        )
        .bind(key)
        .bind(seq)
        .bind(int(counter))
        .bind(int(fence))
        .fetch_one(&mut *tx)
        .await?;
        sqlx::query("INSERT INTO fault_write VALUES ($1, $2, $3, $4, $5, $6, $7)")
            .bind(key)
            .bind(seq)
            .bind(int(fence))
            .bind(max_before)
            .bind(int(version))
            .bind(i64::from(worker))
            .bind(int(op))
            .execute(&mut *tx)
            .await?;
        log_access(&mut tx, access, at, "w").await?;
        tx.commit().await?;
        Ok(WriteResult::Accepted(nat(seq)))
    }

    /// A transaction that starts with `fence::postgres` (with fencing on);
    /// `None` when the token is stale: the transaction is rolled back and
    /// the refusal counted.
    async fn begin_fenced(
        &self,
        Fenced {
            key,
            fence,
            fencing,
            ..
        }: Fenced<'_>,
    ) -> Result<Option<sqlx::Transaction<'static, sqlx::Postgres>>, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        if !fencing {
            return Ok(Some(tx));
        }
        match lock_runtime::fence::postgres(&mut tx, key, fence).await {
            Ok(()) => return Ok(Some(tx)),
            Err(lock_runtime::LockError::Stale { .. }) => {}
            Err(e) => {
                return Err(sqlx::Error::Protocol(format!(
                    "fence: {}",
                    test_support::error_chain(&e)
                )));
            }
        }
        tx.rollback().await?;
        sqlx::query("UPDATE fault_record SET rejected = rejected + 1 WHERE key = $1")
            .bind(key)
            .execute(&self.pool)
            .await?;
        Ok(None)
    }
}

async fn log_access(
    tx: &mut sqlx::Transaction<'static, sqlx::Postgres>,
    Fenced {
        key,
        fence,
        worker,
        op,
        ..
    }: Fenced<'_>,
    at: i64,
    kind: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO fault_access VALUES ($1, $2, $3, $4, $5, $6)")
        .bind(key)
        .bind(at)
        .bind(kind)
        .bind(int(fence))
        .bind(i64::from(worker))
        .bind(int(op))
        .execute(&mut **tx)
        .await?;
    Ok(())
}

fn blocking<T>(
    work: impl std::future::Future<Output = Result<T, sqlx::Error>>,
) -> Result<T, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?
        .block_on(work)
        .map_err(|e| format!("postgres: {e}"))
}

/// Creates the library's fence table and the harness's tables, and a record
/// row per key (the harness, before the workers start).
pub fn setup(url: &str, keys: &[String]) -> Result<(), String> {
    blocking(async {
        let pool = PgPool::connect(url).await?;
        sqlx::raw_sql(lock_runtime::fence::POSTGRES_SCHEMA)
            .execute(&pool)
            .await?;
        sqlx::raw_sql(SCHEMA).execute(&pool).await?;
        for key in keys {
            sqlx::query("INSERT INTO fault_record (key) VALUES ($1) ON CONFLICT DO NOTHING")
                .bind(key)
                .execute(&pool)
                .await?;
        }
        pool.close().await;
        Ok(())
    })
}

/// Reads the final state of every key (the run is over).
pub fn fetch_records(
    url: &str,
    keys: &[String],
) -> Result<std::collections::BTreeMap<String, Record>, String> {
    blocking(async {
        let pool = PgPool::connect(url).await?;
        let mut records = std::collections::BTreeMap::new();
        for key in keys {
            let (counter, version, rejected): (i64, i64, i64) = sqlx::query_as(
                "SELECT counter, version, rejected FROM fault_record WHERE key = $1",
            )
            .bind(key)
            .fetch_one(&pool)
            .await?;
            let writes: Vec<(i64, i64, i64, i64, i64, i64)> = sqlx::query_as(
                "SELECT seq, fence, max_before, read_version, worker, op FROM fault_write
                 WHERE key = $1 ORDER BY seq",
            )
            .bind(key)
            .fetch_all(&pool)
            .await?;
            let accesses: Vec<(i64, String, i64, i64, i64)> = sqlx::query_as(
                "SELECT at, kind, fence, worker, op FROM fault_access WHERE key = $1 ORDER BY at",
            )
            .bind(key)
            .fetch_all(&pool)
            .await?;
            let worker = |w: i64| u32::try_from(w).unwrap_or(u32::MAX);
            records.insert(
                key.clone(),
                Record {
                    counter: nat(counter),
                    version: nat(version),
                    rejected: nat(rejected),
                    writes: writes
                        .into_iter()
                        .map(|(seq, fence, max, read, w, op)| StoredWrite {
                            seq: nat(seq),
                            fence: nat(fence),
                            max_before: nat(max),
                            read_version: nat(read),
                            worker: worker(w),
                            op: nat(op),
                        })
                        .collect(),
                    accesses: accesses
                        .into_iter()
                        .map(|(at, kind, fence, w, op)| Access {
                            at: nat(at),
                            kind: if kind == "w" {
                                AccessKind::Write
                            } else {
                                AccessKind::Read
                            },
                            fence: nat(fence),
                            worker: worker(w),
                            op: nat(op),
                        })
                        .collect(),
                },
            );
        }
        pool.close().await;
        Ok(records)
    })
}
