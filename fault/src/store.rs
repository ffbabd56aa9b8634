//! The shared record the workers update, on a redis-server of its own (never
//! faulted): a hash per lock key, a list recording every accepted write in
//! the store's own (serial) order, and a list of every accepted access.
//!
//! Exclusive reads and writes go through the library's
//! [`lock_runtime::fence::redis`]: one atomic step checks the token against
//! the highest recorded for the key, records it and applies the record's
//! commands (`HINCRBY version`, `HSET counter`, `RPUSH` to the logs, `HSET`
//! of the strike mark), or refuses with `LockError::Stale` and writes
//! nothing. The harness has no check of its own for them. Both the read and
//! the write of a read-modify-write carry the token, and both raise the
//! record: a holder paused between its read and its write finds its write
//! refused once a newer holder has *read*, so the newer holder's
//! read-modify-write cannot be interleaved. A read takes the version and
//! counter with `HMGET` right after its fenced step (the allow-list has
//! only write commands): a write from a lower token after that step is
//! refused, and one from a higher token refuses ours, so what an accepted
//! write read is what the store held at its read. With the check off
//! (`fencing = false`) the same commands go in a `MULTI`/`EXEC` with no check,
//! which is how the checker is shown to catch overlaps.
//!
//! Shared holders (a read-write lock's readers, a semaphore's holders) read
//! with [`Store::shared_read`] and leave with [`Store::exit`], in
//! `store.lua`: a shared read is refused only below the highest *exclusive*
//! token (kept by the fenced exclusive accesses with `ZADD .. GT`), and
//! raises `fence::redis`'s record ([`lock_runtime::fence::record_key`]), so
//! an older writer is refused once a newer reader has read. Every accepted
//! access goes to the key's access log, in store order, so the checker can
//! tell a reader let in during a writer's read-modify-write without any
//! clock; the highest token before each write comes from the same log
//! ([`crate::record::derive_max_before`]).

use std::sync::LazyLock;

use lock_runtime::{LockError, fence};
use redis::aio::ConnectionManager;

use crate::postgres::{Fenced, PgRecord};
use crate::record::derive_max_before;
pub use crate::record::{Access, AccessKind, ReadResult, Record, StoredWrite, WriteResult};

static SCRIPT: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("store.lua")));

/// The harness's strike mark ends at a write: the record forgets its writer
/// as the key's reader, so the harness strikes (SIGSTOP, SIGKILL) only a
/// worker between its read and its write, never one that has moved on to
/// claim its next operation (a kill there would lose an operation the log
/// never saw begin). Before the write, refused or not; conditional, so a
/// newer reader's mark stays.
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

/// The name of the highest *exclusive* token's sorted set for a lock key
/// (member `max`): the bar of shared reads.
pub fn exclusive_key(key: &str) -> String {
    format!("excl:{{{key}}}")
}

/// The global operation counter the workers draw from.
pub const OPS_KEY: &str = "ops";

/// How many operations within the budget each worker drew (a hash).
pub const DRAWN_KEY: &str = "drawn";

/// Each worker's last draw, so that a draw sent again gets its first answer
/// (a hash).
const LAST_DRAW_KEY: &str = "lastdraw";

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

    /// An access of the PostgreSQL record by this worker.
    fn pg_access<'a>(&self, key: &'a str, fence: u64, op: u64) -> Fenced<'a> {
        Fenced {
            key,
            fence,
            fencing: self.fencing,
            worker: self.worker,
            op,
        }
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
    /// as this worker's when it is within the budget. `seq` numbers the
    /// worker's draws from 1: the same `seq` sent again (its reply was
    /// lost) answers the same number.
    pub async fn next_op(&self, budget: u64, seq: u64) -> redis::RedisResult<u64> {
        DRAW.key(OPS_KEY)
            .key(DRAWN_KEY)
            .key(LAST_DRAW_KEY)
            .arg(self.worker)
            .arg(budget)
            .arg(seq)
            .invoke_async(&mut self.conn.clone())
            .await
    }

    /// The fenced read, exclusive (the first half of a read-modify-write).
    pub async fn read(&self, key: &str, fence: u64, op: u64) -> redis::RedisResult<ReadResult> {
        if let Some(pg) = &self.pg {
            let read = pg
                .read(self.pg_access(key, fence, op))
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
        let mut mark = redis::cmd("HSET");
        mark.arg(record_key(key)).arg("reader").arg(self.worker);
        let commands = [
            self.logged(key, "r", fence, op),
            mark,
            exclusive(key, fence),
        ];
        let mut values = redis::cmd("HMGET");
        values.arg(record_key(key)).arg("version").arg("counter");
        let read: Option<(Option<u64>, Option<u64>)> = if self.fencing {
            match self.fenced(key, fence, &commands).await? {
                None => None,
                Some(_) => Some(values.query_async(&mut self.conn.clone()).await?),
            }
        } else {
            let mut pipe = redis::pipe();
            pipe.atomic();
            for c in commands {
                pipe.add_command(c).ignore();
            }
            let (record,): ((Option<u64>, Option<u64>),) = pipe
                .add_command(values)
                .query_async(&mut self.conn.clone())
                .await?;
            Some(record)
        };
        Ok(match read {
            Some((version, counter)) => ReadResult::Ok {
                version: version.unwrap_or(0),
                counter: counter.unwrap_or(0),
            },
            None => ReadResult::Rejected,
        })
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
        let answer = self.invoke(key, "s", fence, op).await?;
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
        self.invoke(key, "x", fence, op).await?;
        Ok(())
    }

    /// The fenced write of `counter` after reading `version`. Applied
    /// whatever version it read (no compare-and-set: that would hide the
    /// overlaps the checker looks for); the write log keeps what it read.
    pub async fn write(
        &self,
        key: &str,
        fence: u64,
        op: u64,
        version: u64,
        counter: u64,
    ) -> redis::RedisResult<WriteResult> {
        self.unmark(key).await?;
        if let Some(pg) = &self.pg {
            return pg
                .write(self.pg_access(key, fence, op), version, counter)
                .await
                .map_err(pg_error);
        }
        let record = record_key(key);
        let mut seq = redis::cmd("HINCRBY");
        seq.arg(&record).arg("version").arg(1);
        let mut set = redis::cmd("HSET");
        set.arg(&record).arg("counter").arg(counter);
        let mut accepted = redis::cmd("HINCRBY");
        accepted.arg(&record).arg("accepted").arg(1);
        let mut log = redis::cmd("RPUSH");
        log.arg(log_key(key))
            .arg(format!("{fence} {version} {} {op}", self.worker));
        // The new version comes first: it is the write's place in the log.
        let commands = [
            seq,
            set,
            accepted,
            log,
            self.logged(key, "w", fence, op),
            exclusive(key, fence),
        ];
        let replies = if self.fencing {
            match self.fenced(key, fence, &commands).await? {
                Some(replies) => replies,
                None => return Ok(WriteResult::Rejected),
            }
        } else {
            let mut pipe = redis::pipe();
            pipe.atomic();
            for c in commands {
                pipe.add_command(c);
            }
            pipe.query_async(&mut self.conn.clone()).await?
        };
        let seq = match replies.first() {
            Some(v) => redis::from_redis_value::<u64>(v.clone())?,
            None => return Err(unexpected(&replies)),
        };
        Ok(WriteResult::Accepted(seq))
    }

    /// Marks this worker as `key`'s holder, for the harness to strike, with
    /// no access of the record: a holder that asks for its token only after
    /// its think (the lazy token's scenario) has none to read with yet. A
    /// fenced read marks as well; [`Store::write`] and [`Store::unmark`]
    /// clear the mark.
    pub async fn mark(&self, key: &str) -> redis::RedisResult<()> {
        redis::cmd("HSET")
            .arg(record_key(key))
            .arg("reader")
            .arg(self.worker)
            .query_async(&mut self.conn.clone())
            .await
    }

    /// Clears this worker's strike mark on `key` (a newer holder's stays):
    /// before a write, or when an operation ends without one.
    pub async fn unmark(&self, key: &str) -> redis::RedisResult<()> {
        let _: i64 = UNMARK
            .key(record_key(key))
            .arg(self.worker)
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// The access log's entry for this access.
    fn logged(&self, key: &str, kind: &str, fence: u64, op: u64) -> redis::Cmd {
        let mut log = redis::cmd("RPUSH");
        log.arg(access_log_key(key))
            .arg(format!("{kind} {fence} {} {op}", self.worker));
        log
    }

    /// `commands` through `fence::redis`: their replies, or `None` when the
    /// token is stale (counted in the record; nothing else written).
    async fn fenced(
        &self,
        key: &str,
        fence: u64,
        commands: &[redis::Cmd],
    ) -> redis::RedisResult<Option<Vec<redis::Value>>> {
        let mut conn = self.conn.clone();
        let mut write = fence::redis(&mut conn, key, fence);
        for c in commands {
            write = write.cmd(c);
        }
        match write.run().await {
            Ok(replies) => Ok(Some(replies)),
            Err(LockError::Stale { .. }) => {
                let _: i64 = redis::cmd("HINCRBY")
                    .arg(record_key(key))
                    .arg("rejected")
                    .arg(1)
                    .query_async(&mut self.conn.clone())
                    .await?;
                Ok(None)
            }
            Err(e) => Err(redis::RedisError::from((
                redis::ErrorKind::Io,
                "fence::redis",
                e.to_string(),
            ))),
        }
    }

    async fn invoke(
        &self,
        key: &str,
        kind: &str,
        fence: u64,
        op: u64,
    ) -> redis::RedisResult<Vec<u64>> {
        SCRIPT
            .key(record_key(key))
            .key(access_log_key(key))
            .key(exclusive_key(key))
            .key(fence::record_key(key))
            .arg(kind)
            .arg(fence)
            .arg(if self.fencing { "1" } else { "0" })
            .arg(self.worker)
            .arg(op)
            .arg(fence::DEFAULT_RETENTION.as_millis().to_string())
            .invoke_async(&mut self.conn.clone())
            .await
    }
}

/// Raises the key's highest exclusive token to `fence` (`ZADD .. GT`).
fn exclusive(key: &str, fence: u64) -> redis::Cmd {
    let mut zadd = redis::cmd("ZADD");
    zadd.arg(exclusive_key(key)).arg("GT").arg(fence).arg("max");
    zadd
}

fn unexpected(replies: &[redis::Value]) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::Client,
        "the store's write",
        format!("no new version in {replies:?}"),
    ))
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
    let mut writes = (1..)
        .zip(&entries)
        .map(|(seq, e)| {
            StoredWrite::parse(seq, e).ok_or_else(|| format!("malformed store log entry {e:?}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let entries: Vec<String> = redis::cmd("LRANGE")
        .arg(access_log_key(key))
        .arg(0)
        .arg(-1)
        .query(conn)
        .map_err(|e| e.to_string())?;
    let accesses: Vec<Access> = (1..)
        .zip(&entries)
        .map(|(at, e)| {
            Access::parse(at, e).ok_or_else(|| format!("malformed access log entry {e:?}"))
        })
        .collect::<Result<_, _>>()?;
    derive_max_before(&mut writes, &accesses)?;
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
    use crate::record::derive_max_before;

    #[test]
    fn log_entries_parse_and_garbage_does_not() {
        assert_eq!(
            StoredWrite::parse(3, "7 2 11 40"),
            Some(StoredWrite {
                seq: 3,
                fence: 7,
                max_before: 0,
                read_version: 2,
                worker: 11,
                op: 40
            })
        );
        assert_eq!(StoredWrite::parse(3, "7 2"), None);
        assert_eq!(StoredWrite::parse(3, "7 2 11 40 1"), None);
        assert_eq!(StoredWrite::parse(3, "a b c d"), None);
        assert_eq!(
            Access::parse(9, "s 12 3 40"),
            Some(Access {
                at: 9,
                kind: AccessKind::Shared,
                fence: 12,
                worker: 3,
                op: 40
            })
        );
        assert_eq!(Access::parse(9, "q 12 3 40"), None);
        assert_eq!(Access::parse(9, "s 12"), None);
    }

    #[test]
    fn a_writes_highest_token_before_it_comes_from_the_accesses_before_it() {
        let access = |at, entry| Access::parse(at, entry).unwrap();
        // A reads with 5, a reader with 9 enters and leaves, A writes: 9
        // was seen before A's write; an exit's token raises nothing.
        let accesses = [
            access(1, "r 5 1 10"),
            access(2, "s 9 2 20"),
            access(3, "x 12 2 20"),
            access(4, "w 5 1 10"),
            access(5, "r 10 3 30"),
            access(6, "w 10 3 30"),
        ];
        let mut writes = vec![
            StoredWrite::parse(1, "5 0 1 10").unwrap(),
            StoredWrite::parse(2, "10 1 3 30").unwrap(),
        ];
        derive_max_before(&mut writes, &accesses).unwrap();
        assert_eq!(
            writes.iter().map(|w| w.max_before).collect::<Vec<_>>(),
            [9, 10]
        );
        // Logs that disagree are an error, not a guess.
        let mut swapped = vec![writes[1], writes[0]];
        assert!(derive_max_before(&mut swapped, &accesses).is_err());
        assert!(derive_max_before(&mut writes[..1], &accesses).is_err());
        assert!(derive_max_before(&mut writes, &accesses[..4]).is_err());
    }
}
