//! What the fenced store answers and logs: the data the workers, the
//! checker and both stores (Redis, `store.rs`; PostgreSQL, `postgres.rs`)
//! share, below both.

/// A read's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadResult {
    /// The record's version and counter.
    Ok {
        /// Version (the number of accepted writes so far).
        version: u64,
        /// Counter.
        counter: u64,
    },
    /// A higher token was seen.
    Rejected,
}

/// A write's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteResult {
    /// Accepted as the `seq`-th write.
    Accepted(u64),
    /// A higher token was seen.
    Rejected,
}

/// One accepted write, as the store logged it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoredWrite {
    /// The store's sequence number (the record's version after it).
    pub seq: u64,
    /// The writer's fencing token.
    pub fence: u64,
    /// The highest token the store had seen before this write.
    pub max_before: u64,
    /// The version the writer had read.
    pub read_version: u64,
    /// Worker.
    pub worker: u32,
    /// The worker's operation.
    pub op: u64,
}

impl StoredWrite {
    /// Parses the Redis store's write log entry (`fence read_version worker
    /// op`), the `seq`-th of its list, with `max_before` left at 0 for
    /// [`derive_max_before`] to fill in.
    pub fn parse(seq: u64, entry: &str) -> Option<Self> {
        let mut it = entry.split(' ').map(str::parse::<u64>);
        let mut next = || it.next()?.ok();
        let write = Self {
            seq,
            fence: next()?,
            max_before: 0,
            read_version: next()?,
            worker: u32::try_from(next()?).ok()?,
            op: next()?,
        };
        it.next().is_none().then_some(write)
    }
}

/// What an accepted access was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessKind {
    /// An exclusive read (`r`).
    Read,
    /// A write (`w`).
    Write,
    /// A shared read (`s`): a reader, or a semaphore holder entering.
    Shared,
    /// A shared holder leaving (`x`).
    Exit,
}

/// One accepted access, as the store logged it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    /// Its place in the store's serial order of this key's accesses (from 1).
    pub at: u64,
    /// What it was.
    pub kind: AccessKind,
    /// The token it carried.
    pub fence: u64,
    /// Worker.
    pub worker: u32,
    /// The worker's operation.
    pub op: u64,
}

impl Access {
    /// Parses the Redis store's access log entry (`kind fence worker op`),
    /// the `at`-th of its list.
    pub fn parse(at: u64, entry: &str) -> Option<Self> {
        let mut it = entry.split(' ');
        let kind = match it.next()? {
            "r" => AccessKind::Read,
            "w" => AccessKind::Write,
            "s" => AccessKind::Shared,
            "x" => AccessKind::Exit,
            _ => return None,
        };
        let mut next = || it.next()?.parse::<u64>().ok();
        let access = Self {
            at,
            kind,
            fence: next()?,
            worker: u32::try_from(next()?).ok()?,
            op: next()?,
        };
        it.next().is_none().then_some(access)
    }
}

/// Fills in each write's `max_before` from the access log: the highest
/// token of the reads, writes and shared reads accepted before it, which is
/// what the store's record of the highest token held when the write came
/// (the Redis store's writes go through `fence::redis`, whose record only
/// ever holds the highest accepted token, and shared reads raise it too).
/// The `k`-th write of the write log is the `k`-th write of the access log:
/// both are appended in one atomic step. An error names a write the two
/// logs disagree on.
pub fn derive_max_before(writes: &mut [StoredWrite], accesses: &[Access]) -> Result<(), String> {
    let mut highest = 0;
    let mut pending = writes.iter_mut();
    for a in accesses {
        match a.kind {
            AccessKind::Exit => continue,
            AccessKind::Write => {
                let Some(w) = pending.next() else {
                    return Err(format!("access log write {a:?} missing from the write log"));
                };
                if (w.worker, w.op, w.fence) != (a.worker, a.op, a.fence) {
                    return Err(format!("write log {w:?} and access log {a:?} disagree"));
                }
                w.max_before = highest;
            }
            AccessKind::Read | AccessKind::Shared => {}
        }
        highest = highest.max(a.fence);
    }
    match pending.next() {
        Some(w) => Err(format!("write {w:?} missing from the access log")),
        None => Ok(()),
    }
}

/// Everything the store holds about one key at the end of a run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Record {
    /// The final counter.
    pub counter: u64,
    /// The final version.
    pub version: u64,
    /// Accepted writes in store order.
    pub writes: Vec<StoredWrite>,
    /// Operations rejected by fencing (reads and writes).
    pub rejected: u64,
    /// Accepted accesses in store order.
    pub accesses: Vec<Access>,
}
