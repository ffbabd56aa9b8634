//! The shared record the workers update, on a redis-server of its own (never
//! faulted): a hash per lock key, changed only through one Lua script that
//! can reject a fencing token lower than the highest it has seen, and a list
//! recording every accepted write in the store's own (serial) order.
//!
//! Both the read and the write of a read-modify-write carry the token, and
//! both raise the record's highest token: a holder paused between its read and
//! its write finds its write rejected once a newer holder has *read*, so the
//! newer holder's read-modify-write cannot be interleaved. With the check off
//! (`fencing = false`) the same store accepts everything, which is how the
//! checker is shown to catch overlaps.
//!
//! Shared holders (a read-write lock's readers, a semaphore's holders) read
//! with [`Store::shared_read`] and leave with [`Store::exit`]; a shared read
//! is refused only below the highest *exclusive* token. Every accepted
//! access goes to the key's access log, in store order, so the checker can
//! tell a reader let in during a writer's read-modify-write without any
//! clock.

use std::sync::LazyLock;

use redis::aio::ConnectionManager;

use crate::postgres::PgRecord;
pub use crate::record::{Access, AccessKind, ReadResult, Record, StoredWrite, WriteResult};

static SCRIPT: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("store.lua")));

/// With the record in PostgreSQL: the harness's strike mark, kept in Redis
/// as `store.lua` keeps it (the reader of the key until its write).
static UNMARK: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        "if redis.call('HGET', KEYS[1], 'reader') == ARGV[1] then \
           redis.call('HDEL', KEYS[1], 'reader') end return 1",
    )
});

static DRAW: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("draw.lua")));

/// The record's name for a lock key.
pub fn record_key(key: &str) -> String {
    format!("rec:{{{key}}}")
}

/// The write log's name for a lock key.
pub fn log_key(key: &str) -> String {
    format!("wlog:{{{key}}}")
}

/// The access log's name for a lock key: every accepted access (reads,
/// writes, shared holders' entries and exits) in store order.
pub fn access_log_key(key: &str) -> String {
    format!("alog:{{{key}}}")
}

/// The global operation counter the workers draw from.
pub const OPS_KEY: &str = "ops";

/// How many operations within the budget each worker drew (a hash).
pub const DRAWN_KEY: &str = "drawn";

/// A worker's handle on the store.
#[derive(Clone)]
pub struct Store {
    conn: ConnectionManager,
    fencing: bool,
    worker: u32,
    /// The record in PostgreSQL instead (scenario 2 on PostgreSQL): reads
    /// and writes go there; draws and strike marks stay in Redis.
    pg: Option<PgRecord>,
}

impl Store {
    /// Connects to the store at `url` and, with `record_url`, to the
    /// PostgreSQL database that then holds the record.
    pub async fn connect(
        url: &str,
        record_url: Option<&str>,
        fencing: bool,
        worker: u32,
    ) -> redis::RedisResult<Self> {
        let client = redis::Client::open(url)?;
        let conn = ConnectionManager::new(client).await?;
        let pg = match record_url {
            Some(url) => Some(PgRecord::connect(url).await.map_err(pg_error)?),
            None => None,
        };
        Ok(Self {
            conn,
            fencing,
            worker,
            pg,
        })
    }

    /// The same store, for another worker (a task of the same process):
    /// one connection, the worker's own name in the record and its log.
    pub fn for_worker(&self, worker: u32) -> Self {
        Self {
            worker,
            ..self.clone()
        }
    }

    /// Takes the next operation number from the run's `budget`, counting it
    /// as this worker's when it is within the budget.
    pub async fn next_op(&self, budget: u64) -> redis::RedisResult<u64> {
        DRAW.key(OPS_KEY)
            .key(DRAWN_KEY)
            .arg(self.worker)
            .arg(budget)
            .invoke_async(&mut self.conn.clone())
            .await
    }

    /// The fenced read, exclusive (the first half of a read-modify-write).
    pub async fn read(&self, key: &str, fence: u64, op: u64) -> redis::RedisResult<ReadResult> {
        if let Some(pg) = &self.pg {
            let read = pg
                .read(key, fence, self.fencing, self.worker, op)
                .await
                .map_err(pg_error)?;
            if read != ReadResult::Rejected {
                let _: () = redis::cmd("HSET")
                    .arg(record_key(key))
                    .arg("reader")
                    .arg(self.worker)
                    .query_async(&mut self.conn.clone())
                    .await?;
            }
            return Ok(read);
        }
        self.read_as(key, "r", fence, op).await
    }

    /// The fenced shared read: a read-write lock's reader, or a semaphore's
    /// holder entering. Refused only below the highest *exclusive* token
    /// seen (shared holders' tokens come in any order); ended by
    /// [`Store::exit`].
    pub async fn shared_read(
        &self,
        key: &str,
        fence: u64,
        op: u64,
    ) -> redis::RedisResult<ReadResult> {
        if self.pg.is_some() {
            return Err(unsupported());
        }
        self.read_as(key, "s", fence, op).await
    }

    async fn read_as(
        &self,
        key: &str,
        kind: &str,
        fence: u64,
        op: u64,
    ) -> redis::RedisResult<ReadResult> {
        let answer: Vec<u64> = self.invoke(key, kind, fence, op, 0, 0).await?;
        Ok(match answer[..] {
            [1, version, counter] => ReadResult::Ok { version, counter },
            _ => ReadResult::Rejected,
        })
    }

    /// A shared holder leaves (logged in store order; never refused).
    pub async fn exit(&self, key: &str, fence: u64, op: u64) -> redis::RedisResult<()> {
        if self.pg.is_some() {
            return Err(unsupported());
        }
        let _: Vec<u64> = self.invoke(key, "x", fence, op, 0, 0).await?;
        Ok(())
    }

    /// The fenced write of `counter` after reading `version`.
    pub async fn write(
        &self,
        key: &str,
        fence: u64,
        op: u64,
        version: u64,
        counter: u64,
    ) -> redis::RedisResult<WriteResult> {
        if let Some(pg) = &self.pg {
            let _: i64 = UNMARK
                .key(record_key(key))
                .arg(self.worker)
                .invoke_async(&mut self.conn.clone())
                .await?;
            return pg
                .write(key, fence, self.fencing, self.worker, op, version, counter)
                .await
                .map_err(pg_error);
        }
        let answer: Vec<u64> = self.invoke(key, "w", fence, op, version, counter).await?;
        Ok(match answer[..] {
            [1, seq] => WriteResult::Accepted(seq),
            _ => WriteResult::Rejected,
        })
    }

    async fn invoke(
        &self,
        key: &str,
        kind: &str,
        fence: u64,
        op: u64,
        version: u64,
        counter: u64,
    ) -> redis::RedisResult<Vec<u64>> {
        SCRIPT
            .key(record_key(key))
            .key(log_key(key))
            .key(access_log_key(key))
            .arg(kind)
            .arg(fence)
            .arg(if self.fencing { "1" } else { "0" })
            .arg(self.worker)
            .arg(op)
            .arg(version)
            .arg(counter)
            .invoke_async(&mut self.conn.clone())
            .await
    }
}

fn pg_error(e: sqlx::Error) -> redis::RedisError {
    redis::RedisError::from((redis::ErrorKind::Io, "postgres", e.to_string()))
}

fn unsupported() -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::Client,
        "the PostgreSQL record",
        "shared holders are not supported there (mutexes only)".to_string(),
    ))
}

/// Reads the final state of `key` (a plain connection: the run is over).
pub fn fetch_record(conn: &mut redis::Connection, key: &str) -> Result<Record, String> {
    let fields: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
        .arg(record_key(key))
        .query(conn)
        .map_err(|e| e.to_string())?;
    let num = |f: &str| fields.get(f).and_then(|v| v.parse().ok()).unwrap_or(0);
    let entries: Vec<String> = redis::cmd("LRANGE")
        .arg(log_key(key))
        .arg(0)
        .arg(-1)
        .query(conn)
        .map_err(|e| e.to_string())?;
    let writes = entries
        .iter()
        .map(|e| StoredWrite::parse(e).ok_or_else(|| format!("malformed store log entry {e:?}")))
        .collect::<Result<_, _>>()?;
    let entries: Vec<String> = redis::cmd("LRANGE")
        .arg(access_log_key(key))
        .arg(0)
        .arg(-1)
        .query(conn)
        .map_err(|e| e.to_string())?;
    let accesses = entries
        .iter()
        .map(|e| Access::parse(e).ok_or_else(|| format!("malformed access log entry {e:?}")))
        .collect::<Result<_, _>>()?;
    Ok(Record {
        counter: num("counter"),
        version: num("version"),
        writes,
        rejected: num("rejected"),
        accesses,
    })
}

/// How many operations within the budget each worker drew (the run is over).
pub fn fetch_drawn(
    conn: &mut redis::Connection,
) -> Result<std::collections::BTreeMap<u32, u64>, String> {
    redis::cmd("HGETALL")
        .arg(DRAWN_KEY)
        .query(conn)
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_entries_parse_and_garbage_does_not() {
        assert_eq!(
            StoredWrite::parse("3 7 6 2 11 40"),
            Some(StoredWrite {
                seq: 3,
                fence: 7,
                max_before: 6,
                read_version: 2,
                worker: 11,
                op: 40
            })
        );
        assert_eq!(StoredWrite::parse("3 7"), None);
        assert_eq!(StoredWrite::parse("a b c d e f"), None);
        assert_eq!(
            Access::parse("9 s 12 3 40"),
            Some(Access {
                at: 9,
                kind: AccessKind::Shared,
                fence: 12,
                worker: 3,
                op: 40
            })
        );
        assert_eq!(Access::parse("9 q 12 3 40"), None);
        assert_eq!(Access::parse("9 s 12"), None);
    }
}
