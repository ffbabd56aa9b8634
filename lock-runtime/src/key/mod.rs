//! Key validation and the Redis names derived from a key.
//!
//! Every name the library touches is `prefix + role + body`:
//!
//! * `role` is one letter naming what the name is for (`L` the lock, `Q` the
//!   waiter queue, `D` its deadlines, `N` the release-notice channel, `I` an
//!   idempotency record, `J` the notice channel of an idempotency record; a
//!   leader election's `E` lock, `G` queue, `K` deadlines, `H` notices, `A`
//!   record and `B` candidates' labels; `F` and `U` a read-write lock's and a
//!   semaphore's queue deadlines; see [`Role`] for the rest, and `S` below);
//! * `body` is one of three forms, chosen from the key alone:
//!   - `:key` when the key carries a Redis Cluster hash tag of its own
//!     (`{tenant:7}:order:1`), so the caller's tag decides the slot;
//!   - `%{escaped}` when the key has no tag and starts with `}` (`}`, `}x`,
//!     `}}{{`), with the key escaped as by [`escape_key_part`]: wrapped as
//!     `{key}` such a key would make an empty tag, which Redis ignores, and
//!     each role's name would hash to a slot of its own;
//!   - `{key}` for every other key (all keys without braces among them).
//!
//! Redis hashes the bytes between the first `{` and the first `}` after it
//! when there are any. The prefix and the role letter contain no braces, so
//! the first `{` of a name is the key's own (`:key`) or the one this module
//! adds, and in each form the tag it opens is non-empty and the same for
//! every role: all names of one key land in one hash slot. In `{key}` the tag
//! ends at the key's first `}` if it has one (`a}b` hashes as `a`), which is
//! never its first byte in this form.
//!
//! The byte after the role letter (`:`, `%` or `{`) tells the three forms
//! apart, and each form can be read back to its key, so the mapping from
//! `(role, key)` to a name is injective: no key can name another key's lock,
//! counter, queue or channel.
//!
//! Fencing counters are not per key: every key of a hash slot shares one,
//! `prefix + S{tag}`, where `tag` is the shortest base-36 string that
//! hashes to that slot ([`slot_tag`]). A key's tokens still strictly increase
//! (the counter only ever goes up), and what stays in Redis after every lock
//! is released is at most 16,384 counters per prefix, however many names
//! were used.

pub(crate) use lock_keys::{Access, LockKind};
use lock_keys::{MAX_KEY_LEN, MAX_PREFIX_LEN};
use std::sync::OnceLock;

use crate::error::LockError;

/// Escapes one value for use inside a key: `%`, `:`, `{` and `}` become
/// `%25`, `%3A`, `%7B` and `%7D`. `#[distributed_lock]` and `LockLayer`
/// templates escape every placeholder value this way, so a value can never
/// spell a separator or a hash tag: with `"{tenant:<t>}:order:<id>"`, tenant
/// `7}:order:1` renders as `{tenant:7%7D%3Aorder%3A1}:order:..`, which no other
/// tenant's key can equal. Use it when building keys from untrusted values by
/// hand.
///
/// ```
/// assert_eq!(lock_runtime::escape_key_part("42"), "42");
/// assert_eq!(lock_runtime::escape_key_part("a:{b}%"), "a%3A%7Bb%7D%25");
/// ```
pub fn escape_key_part(value: &str) -> std::borrow::Cow<'_, str> {
    if !value.contains(['%', ':', '{', '}']) {
        return std::borrow::Cow::Borrowed(value);
    }
    let mut out = String::with_capacity(value.len() + 8);
    push_escaped(&mut out, value);
    std::borrow::Cow::Owned(out)
}

/// Appends `value` to `out`, escaped as by [`escape_key_part`].
pub(crate) fn push_escaped(out: &mut impl std::fmt::Write, value: &str) {
    for c in value.chars() {
        let _ = match c {
            '%' => out.write_str("%25"),
            ':' => out.write_str("%3A"),
            '{' => out.write_str("%7B"),
            '}' => out.write_str("%7D"),
            c => out.write_char(c),
        };
    }
}

/// Checks a caller's key: not empty, at most [`MAX_KEY_LEN`] bytes, no control
/// characters (they would be invisible in logs and `redis-cli`).
pub(crate) fn validate_key(key: &str) -> Result<(), LockError> {
    if key.is_empty() {
        return Err(LockError::InvalidKey("the key is empty".into()));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(LockError::InvalidKey(format!(
            "the key is {} bytes long; the limit is {MAX_KEY_LEN}",
            key.len()
        )));
    }
    // Printable ASCII has no control character: most keys are told so
    // without decoding a char.
    if key.bytes().all(|b| (b' '..=b'~').contains(&b)) {
        return Ok(());
    }
    if let Some(c) = key.chars().find(|c| c.is_control()) {
        return Err(LockError::InvalidKey(format!(
            "the key contains the control character {c:?}"
        )));
    }
    Ok(())
}

/// Checks a key prefix: at most [`MAX_PREFIX_LEN`] bytes, no braces (the key's
/// hash tag must decide the slot), no control characters.
pub(crate) fn validate_prefix(prefix: &str) -> Result<(), LockError> {
    if prefix.len() > MAX_PREFIX_LEN {
        return Err(LockError::Config(format!(
            "the key prefix is {} bytes long; the limit is {MAX_PREFIX_LEN}",
            prefix.len()
        )));
    }
    if prefix.contains(['{', '}']) || prefix.chars().any(char::is_control) {
        return Err(LockError::Config(format!(
            "the key prefix {prefix:?} may not contain braces or control characters"
        )));
    }
    Ok(())
}

/// What a derived name is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    Lock,
    Queue,
    /// A mutex queue's deadlines: each entry scored by the end of its wait.
    QueueDeadlines,
    Notice,
    #[cfg_attr(not(feature = "idempotency"), allow(dead_code))]
    Idempotency,
    #[cfg_attr(not(feature = "idempotency"), allow(dead_code))]
    IdempotencyNotice,
    /// A read-write lock's writer, its readers (a sorted set of tokens by
    /// lease end), its queue and its notice channel.
    RwWriter,
    RwReaders,
    RwQueue,
    RwNotice,
    RwFences,
    /// The deadlines of a read-write lock's queue (as a mutex's).
    RwDeadlines,
    /// A semaphore's holders (a sorted set, as a read-write lock's
    /// readers), its queue and its notice channel; its "writer" name is
    /// never set.
    SemaphoreHolders,
    SemaphoreQueue,
    SemaphoreNotice,
    SemaphoreWriter,
    SemaphoreFences,
    /// The deadlines of a semaphore's queue (as a mutex's).
    SemaphoreDeadlines,
    /// A leader election's lock, its candidates' queue, the queue's
    /// deadlines and its notice channel (a mutex's, under letters of their
    /// own: `leader("x")` never meets `lock("x")`), the leader's record
    /// (`term:label`, with the lease's expiry) and the candidates' labels
    /// (a hash by token).
    Leader,
    LeaderQueue,
    LeaderDeadlines,
    LeaderNotice,
    LeaderRecord,
    LeaderLabels,
}

impl Role {
    pub(crate) fn letter(self) -> char {
        match self {
            Role::Lock => 'L',
            Role::Queue => 'Q',
            Role::QueueDeadlines => 'D',
            Role::Notice => 'N',
            Role::Idempotency => 'I',
            Role::IdempotencyNotice => 'J',
            Role::RwWriter => 'W',
            Role::RwReaders => 'R',
            Role::RwQueue => 'V',
            Role::RwNotice => 'X',
            Role::SemaphoreHolders => 'P',
            Role::SemaphoreQueue => 'O',
            Role::SemaphoreNotice => 'M',
            Role::SemaphoreWriter => 'T',
            Role::RwFences => 'Y',
            Role::SemaphoreFences => 'Z',
            Role::RwDeadlines => 'F',
            Role::SemaphoreDeadlines => 'U',
            Role::Leader => 'E',
            Role::LeaderQueue => 'G',
            Role::LeaderDeadlines => 'K',
            Role::LeaderNotice => 'H',
            Role::LeaderRecord => 'A',
            Role::LeaderLabels => 'B',
        }
    }
}

/// Builds the full Redis name of `role` for `key` under `prefix` (see the
/// module docs for the three body forms).
pub(crate) fn name(prefix: &str, role: Role, key: &str) -> String {
    let mut s = String::with_capacity(prefix.len() + key.len() + 4);
    s.push_str(prefix);
    s.push(role.letter());
    if has_hash_tag(key) {
        s.push(':');
        s.push_str(key);
    } else if key.starts_with('}') {
        // `{key}` would be an empty tag: hash the escaped key instead, which
        // has no `}` to end the tag early and is never empty.
        s.push_str("%{");
        push_escaped(&mut s, key);
        s.push('}');
    } else {
        s.push('{');
        s.push_str(key);
        s.push('}');
    }
    s
}

/// Reads a name back to its role letter and key: every name has exactly
/// one reading, which is what makes the mapping injective.
pub(crate) fn parse(prefix: &str, name: &str) -> Option<(char, String)> {
    let rest = name.strip_prefix(prefix)?;
    let letter = rest.chars().next()?;
    let body = &rest[1..];
    let key = if let Some(key) = body.strip_prefix(':') {
        has_hash_tag(key).then(|| key.to_owned())?
    } else if let Some(escaped) = body.strip_prefix("%{") {
        let key = unescape(escaped.strip_suffix('}')?)?;
        (!has_hash_tag(&key) && key.starts_with('}')).then_some(key)?
    } else {
        let key = body.strip_prefix('{')?.strip_suffix('}')?;
        (!has_hash_tag(key) && !key.starts_with('}')).then(|| key.to_owned())?
    };
    Some((letter, key))
}

fn unescape(s: &str) -> Option<String> {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        out.push(match rest.get(i + 1..i + 3)? {
            "25" => '%',
            "3A" => ':',
            "7B" => '{',
            "7D" => '}',
            _ => return None,
        });
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    // Escaping has one output per input: anything else is not a name.
    (escape_key_part(&out) == s).then_some(out)
}

/// `lock` (a name whose role letter stands at `kind_at`) with the letter of
/// `role` instead: every name of a key is its lock's with another letter.
fn renamed(lock: &str, kind_at: usize, role: Role) -> String {
    // The lock's length: the same allocation size class.
    let mut name = String::with_capacity(lock.len());
    name.push_str(&lock[..kind_at]);
    name.push(role.letter());
    name.push_str(&lock[kind_at + 1..]);
    name
}

/// The names one lock uses, built once per acquisition.
#[derive(Clone, Debug)]
pub(crate) struct KeyNames {
    /// The lock (a mutex, a read-write lock's writer; a semaphore's
    /// writer name, which is never set).
    pub(crate) lock: String,
    /// A read-write lock's readers or a semaphore's holders (a sorted set
    /// of tokens scored by the end of their leases); empty for a mutex.
    pub(crate) holders: String,
    /// Their fencing tokens (a hash by token); empty for a mutex.
    pub(crate) fences: String,
    /// What kind of lock these names are for, as the backends take it: a
    /// leader election's say `Mutex` (the backends take and hand it over
    /// as one; see [`KeyNames::is_leader`]).
    pub(crate) kind: LockKind,
    /// How this holder takes the lock (a read-write lock's side, a
    /// semaphore's permits): the shared scripts' mode and limit.
    pub(crate) access: Access,
    /// The line of waiters and the channel of notices, each built on first
    /// use (a lock taken and given back by plain commands never names
    /// them): their role letters, and the names once built.
    later: [Role; 2],
    queue: OnceLock<String>,
    notice: OnceLock<String>,
    /// The Redis Cluster slot all four names share (`CLUSTER KEYSLOT` of
    /// each): picks the cluster node's batch and, on one server, the
    /// command connection.
    pub(crate) slot: u16,
    /// A leader election's record (`term:label`, expiring with the lease)
    /// and its candidates' labels; both empty for every other lock.
    pub(crate) record: String,
    pub(crate) labels: String,
    /// The label a leader's acquire writes into the record (empty for
    /// other locks).
    pub(crate) label: String,
    /// Where the role letter stands in every name (the prefix's length).
    kind_at: usize,
}

impl KeyNames {
    pub(crate) fn new(prefix: &str, key: &str) -> Self {
        Self::mutex_like(prefix, key, [Role::Lock, Role::Queue, Role::Notice])
    }

    /// The names of the leader election `name`: a mutex's under letters of
    /// their own, plus the record and the candidates' labels.
    pub(crate) fn leader(prefix: &str, key: &str) -> Self {
        Self {
            record: name(prefix, Role::LeaderRecord, key),
            labels: name(prefix, Role::LeaderLabels, key),
            ..Self::mutex_like(
                prefix,
                key,
                [Role::Leader, Role::LeaderQueue, Role::LeaderNotice],
            )
        }
    }

    /// A mutex's names (lock, queue, notice) under the letters `kinds`.
    fn mutex_like(prefix: &str, key: &str, kinds: [Role; 3]) -> Self {
        Self::with_kinds(prefix, key, LockKind::Mutex, Access::Exclusive, kinds, None)
    }

    /// The names under the letters `[lock, queue, notice]`, and `shared`'s
    /// `[holders, fences]` for a read-write lock or a semaphore.
    fn with_kinds(
        prefix: &str,
        key: &str,
        kind: LockKind,
        access: Access,
        [lock, queue, notice]: [Role; 3],
        shared: Option<[Role; 2]>,
    ) -> Self {
        let lock = name(prefix, lock, key);
        let kind_at = prefix.len();
        let [holders, fences] = shared.map_or_else(Default::default, |kinds| {
            kinds.map(|k| renamed(&lock, kind_at, k))
        });
        Self {
            slot: slot(&lock),
            kind_at,
            later: [queue, notice],
            queue: OnceLock::new(),
            notice: OnceLock::new(),
            lock,
            holders,
            fences,
            kind,
            access,
            record: String::new(),
            labels: String::new(),
            label: String::new(),
        }
    }

    /// The line of waiters (a mutex's, or a shared lock's writers' and
    /// readers'): built on first use.
    pub(crate) fn queue(&self) -> &str {
        self.queue
            .get_or_init(|| renamed(&self.lock, self.kind_at, self.later[0]))
    }

    /// The channel of the lock's notices (releases, hand-overs): built on
    /// first use.
    pub(crate) fn notice(&self) -> &str {
        self.notice
            .get_or_init(|| renamed(&self.lock, self.kind_at, self.later[1]))
    }

    /// `true` for a leader election's names.
    pub(crate) fn is_leader(&self) -> bool {
        !self.record.is_empty()
    }

    /// The names of a lock of `kind`, taken with `access`: a mutex's, or
    /// those of a read-write lock or a semaphore (other names, so
    /// `rw_lock("k")`, `semaphore("k", n)` and `lock("k")` are three
    /// resources). A mutex, a leader election and an idempotency record are
    /// taken alone: their `access` is not read.
    pub(crate) fn of_kind(prefix: &str, key: &str, kind: LockKind, access: Access) -> Self {
        let [lock, holders, fences, queue, notice] = match kind {
            LockKind::Leader => return Self::leader(prefix, key),
            LockKind::RwLock => [
                Role::RwWriter,
                Role::RwReaders,
                Role::RwFences,
                Role::RwQueue,
                Role::RwNotice,
            ],
            LockKind::Semaphore => [
                Role::SemaphoreWriter,
                Role::SemaphoreHolders,
                Role::SemaphoreFences,
                Role::SemaphoreQueue,
                Role::SemaphoreNotice,
            ],
            _ => return Self::new(prefix, key),
        };
        Self::with_kinds(
            prefix,
            key,
            kind,
            access,
            [lock, queue, notice],
            Some([holders, fences]),
        )
    }

    /// The fencing counter of the key's slot (shared with every key there).
    /// Built when a script needs it: the embedded backend never does.
    pub(crate) fn fence(&self) -> String {
        slot_counter(&self.lock[..self.kind_at], self.slot)
    }

    /// The deadlines of the mutex queue's entries (a sorted set beside
    /// the queue, in its slot). Built when a script needs it.
    pub(crate) fn deadlines(&self) -> String {
        self.deadlines_parts().concat()
    }
}

mod parts;
#[cfg(feature = "idempotency")]
mod record;
mod slot;

#[cfg(feature = "idempotency")]
pub(crate) use record::{RecordNames, digest};

use slot::slot_counter;
pub(crate) use slot::{has_hash_tag, slot, slot_of_bytes, slot_tag};

#[cfg(test)]
mod tests;
