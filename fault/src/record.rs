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
    /// Parses a log entry (`seq fence max read_version worker op`).
    pub fn parse(entry: &str) -> Option<Self> {
        let mut it = entry.split(' ').map(str::parse::<u64>);
        let mut next = || it.next()?.ok();
        Some(Self {
            seq: next()?,
            fence: next()?,
            max_before: next()?,
            read_version: next()?,
            worker: u32::try_from(next()?).ok()?,
            op: next()?,
        })
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
    /// Parses an access log entry (`at kind fence worker op`).
    pub fn parse(entry: &str) -> Option<Self> {
        let mut it = entry.split(' ');
        let at = it.next()?.parse().ok()?;
        let kind = match it.next()? {
            "r" => AccessKind::Read,
            "w" => AccessKind::Write,
            "s" => AccessKind::Shared,
            "x" => AccessKind::Exit,
            _ => return None,
        };
        let mut next = || it.next()?.parse::<u64>().ok();
        Some(Self {
            at,
            kind,
            fence: next()?,
            worker: u32::try_from(next()?).ok()?,
            op: next()?,
        })
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
