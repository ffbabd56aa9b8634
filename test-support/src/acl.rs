//! The least-privilege ACL user of the library.

/// The least an ACL user needs: the commands the client sends (`EVALSHA`,
/// `SCRIPT LOAD` at start and after `NOSCRIPT`, `SUBSCRIBE`, `UNSUBSCRIBE`) and
/// those the scripts run (the waiter queue's list commands included, and
/// reserve.lua's `INCRBY` and `LLEN` for local hand-overs), on the
/// prefix's keys and channels. No `EVAL`, `PING`, `CLIENT` or `HELLO` is
/// needed; `SELECT` only with a `/db` in the URL. Found by taking each one
/// away: the `ACL LOG` names what is missing.
pub const ACL_LOCKER: &[&str] = &[
    "ACL",
    "SETUSER",
    "locker",
    "on",
    ">locker-pw",
    "resetkeys",
    "~lock:*",
    "resetchannels",
    "&lock:*",
    "-@all",
    "+evalsha",
    "+script|load",
    "+subscribe",
    "+unsubscribe",
    "+get",
    "+set",
    "+incr",
    "+pexpire",
    "+pttl",
    "+del",
    "+publish",
    "+rpush",
    "+lpop",
    "+lrem",
    "+lpos",
    "+llen",
    "+incrby",
    // Waiting on any lock (its queue's deadlines), leader elections (the
    // candidates' labels), read-write locks and semaphores (shared.lua).
    "+time",
    "+exists",
    "+lindex",
    "+zadd",
    "+zrem",
    "+zscore",
    "+zcard",
    "+zrange",
    "+zremrangebyscore",
    "+zrangebyscore",
    "+hset",
    "+hget",
    "+hdel",
];

/// [`ACL_LOCKER`] for the server the tests run on ([`crate::ServerKind`]):
/// on Valkey 9, whose `DELIFEQ` the library releases with, `+delifeq` too;
/// on Redis 8, `+delex` (Redis 7 refuses an ACL rule that names a command
/// it does not know).
pub fn acl_locker() -> Vec<&'static str> {
    let mut rules = ACL_LOCKER.to_vec();
    match crate::ServerKind::current() {
        crate::ServerKind::Valkey => rules.push("+delifeq"),
        crate::ServerKind::Redis8 => rules.push("+delex"),
        crate::ServerKind::Redis => {}
    }
    rules
}
