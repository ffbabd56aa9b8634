//! The kinds of lock, named once for the client, the backends, the
//! attribute and what `inspect` reports: [`LockKind`], and how one holder
//! takes a lock of that kind, [`Access`].

/// Which lock of the synchronizer family a request takes, or a key names
/// (what `LockClient::inspect` reports as `LockState::kind`).
///
/// A read-write lock's side and a semaphore's permits are not kinds of
/// their own: they are how one holder takes the lock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LockKind {
    /// `client.lock(key)` (and `lock_all`, which takes mutexes).
    #[default]
    Mutex,
    /// `client.rw_lock(key)`: a writer, or readers.
    RwLock,
    /// `client.semaphore(key, n)`: permits.
    Semaphore,
    /// `client.leader(key)`: an election, its leader the holder and its
    /// candidates the waiters (holder named by the leader's own label).
    Leader,
    /// An `IdempotencyLayer` record in flight (listed by
    /// `LockClient::list`; its key is the record's hashed name).
    IdempotencyRecord,
}

impl LockKind {
    /// `"mutex"`, `"rw_lock"`, `"semaphore"`, `"leader"` or
    /// `"idempotency_record"`.
    pub fn as_str(self) -> &'static str {
        match self {
            LockKind::Mutex => "mutex",
            LockKind::RwLock => "rw_lock",
            LockKind::Semaphore => "semaphore",
            LockKind::Leader => "leader",
            LockKind::IdempotencyRecord => "idempotency_record",
        }
    }
}

/// How one holder takes its lock: alone, or beside other shared holders.
/// The mode and limit that the read-write and semaphore scripts take.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// Alone: a mutex, a leader, a read-write lock's writer
    /// (`rw_lock(key).write()`, `rw = "write"`).
    Exclusive,
    /// Beside other shared holders, at most this many at once (0: no
    /// limit): a read-write lock's reader (`rw_lock(key).read()`,
    /// `rw = "read"`: no limit) or a semaphore's permit
    /// (`semaphore(key, n)`, `permits = n`: `n`, which is never 0).
    Shared(u32),
}

impl Access {
    /// A read-write lock's reader: shared, without a limit.
    pub const READ: Access = Access::Shared(0);

    /// `true` beside other shared holders (a reader, a permit).
    pub fn is_shared(self) -> bool {
        matches!(self, Access::Shared(_))
    }
}
