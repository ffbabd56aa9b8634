//! `fence::redis`: the check, the record and the commands in one script call.

use std::borrow::Borrow;
use std::sync::LazyLock;
use std::time::Duration;

use super::commands::Writes;
use crate::durations::check_retention;
use crate::error::{BackendError, ConnectionFailure, LockError, connection_failure};
use crate::key::{self, slot_of_bytes, slot_tag};

static FENCE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../scripts/fence.lua")));

/// The prefix of every record of a highest token: `lock-fence:{tag}:resource`,
/// where `tag` hashes to the resource's own slot.
pub const RECORD_PREFIX: &str = "lock-fence:";

/// How long a record outlives the last write through it, unless
/// [`RedisFence::retention`] says otherwise: twice the longest lease a lock
/// can have ([`MAX_TTL`](crate::MAX_TTL)).
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(14 * 24 * 3600);

/// The Redis key of `resource`'s record: in `resource`'s slot (the tag is the
/// shortest one hashing there), and distinct for distinct resources (the
/// resource follows the tag verbatim).
pub fn record_key(resource: &str) -> String {
    let tag = slot_tag(key::slot(resource));
    format!("{RECORD_PREFIX}{{{tag}}}:{resource}")
}

/// Starts a fenced write to `resource` with the fencing token `token`: add
/// the commands with [`RedisFence::cmd`], send them with [`RedisFence::run`].
///
/// `conn` is any redis-rs async connection (`MultiplexedConnection`,
/// `ConnectionManager`, a cluster connection), to any server: the lock's own
/// or the one the data lives on.
pub fn redis<'c, C>(conn: &'c mut C, resource: &str, token: u64) -> RedisFence<'c, C>
where
    C: redis::aio::ConnectionLike + Send,
{
    RedisFence {
        conn,
        resource: resource.to_owned(),
        token,
        retention: DEFAULT_RETENTION,
        writes: Writes::default(),
    }
}

/// A fenced write being built: see [`redis()`](fn@redis) and the
/// [module docs](super).
#[must_use = "a fenced write does nothing until `.run().await`"]
pub struct RedisFence<'c, C> {
    conn: &'c mut C,
    resource: String,
    token: u64,
    retention: Duration,
    writes: Writes,
}

impl<C> std::fmt::Debug for RedisFence<'_, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Values may be secrets: count them, do not print them.
        f.debug_struct("RedisFence")
            .field("resource", &self.resource)
            .field("token", &self.token)
            .field("retention", &self.retention)
            .field("commands", &self.writes.commands)
            .finish_non_exhaustive()
    }
}

impl<'c, C> RedisFence<'c, C>
where
    C: redis::aio::ConnectionLike + Send,
{
    /// Adds a command, as `redis::cmd(..).arg(..)` builds it. Only write
    /// commands of [`allowed_commands`](super::allowed_commands) are
    /// accepted; any other fails the write at [`run`](Self::run) with
    /// [`LockError::Config`], before anything is sent.
    pub fn cmd(mut self, cmd: impl Borrow<redis::Cmd>) -> Self {
        self.writes.push(cmd.borrow());
        self
    }

    /// How long the record of the highest token outlives the last write
    /// through it ([`DEFAULT_RETENTION`] unless set). A holder that writes
    /// after its resource's record expired is no longer refused: keep this
    /// longer than any holder can stay paused after its lease ends. From one
    /// millisecond to [`MAX_RETENTION`](crate::MAX_RETENTION) (a year);
    /// anything else fails [`run`](Self::run) with [`LockError::Config`].
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// Checks the token, records it and runs the commands, in one atomic
    /// step. Returns the commands' replies, one per command in order (none
    /// with no command: the token is then only recorded, shutting out
    /// earlier holders before this one writes anything).
    ///
    /// # Errors
    ///
    /// * [`LockError::Stale`]: a later token already wrote; nothing was written.
    /// * [`LockError::InvalidKey`]: the resource is empty, too long or has
    ///   control characters.
    /// * [`LockError::Config`]: a command is not allowed or has the wrong
    ///   number of arguments, a key is not in the resource's hash slot or is
    ///   a fence's record (under [`RECORD_PREFIX`]), the retention is out
    ///   of bounds, or the token is above `i64::MAX` (no lock issues it).
    ///   Nothing was sent.
    /// * [`LockError::Backend`]: the server failed or answered with an error.
    ///   A command's own error (`WRONGTYPE`, a syntax error) comes after the
    ///   check passed: the token is recorded and the commands before the
    ///   failing one stay applied, as in any Redis script (so earlier
    ///   holders stay shut out of what they wrote). When the connection
    ///   dropped after sending, [`BackendError::is_outcome_unknown`] is
    ///   `true`: the write may have happened; it is not resent.
    pub async fn run(mut self) -> Result<Vec<redis::Value>, LockError> {
        key::validate_key(&self.resource)?;
        if let Some(e) = self.writes.invalid.take() {
            return Err(e);
        }
        check_retention("a fence's record", self.retention)?;
        // As `fence::postgres`: a token no lock issues would shut every real
        // one out for the record's retention.
        if i64::try_from(self.token).is_err() {
            return Err(LockError::Config(format!(
                "fencing token {} is above i64::MAX: no lock issues it",
                self.token
            )));
        }
        let slot = key::slot(&self.resource);
        if let Some(stray) = self.writes.keys.iter().find(|k| slot_of_bytes(k) != slot) {
            return Err(LockError::Config(format!(
                "key `{}` is not in the hash slot of resource `{}`: a fenced write runs in one \
                 slot; use the resource as the key, or as its hash tag (`{{{}}}:...`)",
                String::from_utf8_lossy(stray).escape_debug(),
                self.resource.escape_debug(),
                self.resource.escape_debug(),
            )));
        }
        let prefix = RECORD_PREFIX.as_bytes();
        if let Some(record) = self.writes.keys.iter().find(|k| k.starts_with(prefix)) {
            return Err(LockError::Config(format!(
                "key `{}` is a fence's record (`{RECORD_PREFIX}..`): only the fence writes \
                 them; a fenced command that set or deleted one would let a stale token through",
                String::from_utf8_lossy(record).escape_debug(),
            )));
        }
        let mut invocation = FENCE.key(record_key(&self.resource));
        invocation
            .arg(self.token)
            // At most a year: an exact integer for the script.
            .arg(self.retention.as_millis() as u64);
        self.writes.add_to(&mut invocation);
        let answer: redis::Value = invocation
            .invoke_async(self.conn)
            .await
            .map_err(|e| backend(&self.resource, e))?;
        read_answer(&self.resource, self.token, answer)
    }
}

fn backend(resource: &str, e: redis::RedisError) -> LockError {
    LockError::Backend(match connection_failure(&e) {
        Some(ConnectionFailure::TimedOut | ConnectionFailure::Broken) => {
            BackendError::outcome_unknown(
                format!(
                    "the fenced write to `{resource}` was sent and no answer came back: \
                     it may or may not have been applied"
                ),
                Some(Box::new(e)),
            )
        }
        Some(ConnectionFailure::Unreachable) | None => {
            BackendError::with_source(format!("the fenced write to `{resource}` failed"), e)
        }
    })
}

/// `{1, replies}` or `{0, highest}`.
fn read_answer(
    resource: &str,
    token: u64,
    answer: redis::Value,
) -> Result<Vec<redis::Value>, LockError> {
    let unexpected = |what: &dyn std::fmt::Debug| {
        LockError::Backend(BackendError::new(format!(
            "the fenced write to `{resource}` got an unexpected answer: {what:?}"
        )))
    };
    let redis::Value::Array(mut parts) = answer else {
        return Err(unexpected(&answer));
    };
    match (parts.first(), parts.len()) {
        (Some(redis::Value::Int(1)), 2) => match parts.pop() {
            Some(redis::Value::Array(replies)) => Ok(replies),
            // An empty Lua table may come back as nil on some servers.
            Some(redis::Value::Nil) => Ok(Vec::new()),
            other => Err(unexpected(&other)),
        },
        (Some(redis::Value::Int(0)), 2) => {
            let highest = match &parts[1] {
                redis::Value::BulkString(b) => std::str::from_utf8(b).ok(),
                redis::Value::SimpleString(s) => Some(s.as_str()),
                _ => None,
            }
            .and_then(|s| s.parse::<u64>().ok());
            match highest {
                Some(highest) => Err(LockError::Stale {
                    resource: resource.to_owned(),
                    token,
                    highest,
                }),
                None => Err(unexpected(&parts)),
            }
        }
        _ => Err(unexpected(&parts)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_lives_in_its_resources_slot_and_names_it() {
        for resource in ["order:42", "{tenant:7}:order:1", "}x", "a}b{c", "é"] {
            let name = record_key(resource);
            assert_eq!(key::slot(&name), key::slot(resource), "{resource}");
            assert!(name.starts_with(RECORD_PREFIX) && name.ends_with(resource));
        }
        assert_ne!(record_key("a"), record_key("b"));
    }

    #[test]
    fn a_refusal_names_the_highest_token() {
        let answer = redis::Value::Array(vec![
            redis::Value::Int(0),
            redis::Value::BulkString(b"18446744073709551615".to_vec()),
        ]);
        match read_answer("r", 3, answer) {
            Err(LockError::Stale {
                resource,
                token,
                highest,
            }) => assert_eq!((resource.as_str(), token, highest), ("r", 3, u64::MAX)),
            other => panic!("{other:?}"),
        }
        let applied = redis::Value::Array(vec![
            redis::Value::Int(1),
            redis::Value::Array(vec![redis::Value::Okay]),
        ]);
        assert_eq!(read_answer("r", 3, applied).unwrap(), [redis::Value::Okay]);
        assert!(
            read_answer("r", 3, redis::Value::Nil)
                .unwrap_err()
                .is_backend()
        );
    }
}
