//! The limits every lock request is checked against, at run time by the
//! client and, where a value is known at compile time, by the attribute.

use std::time::Duration;

/// The longest key accepted, in bytes (before the prefix is added).
pub const MAX_KEY_LEN: usize = 1024;

/// The longest key prefix accepted, in bytes.
pub const MAX_PREFIX_LEN: usize = 128;

/// The shortest lease accepted. Shorter leases cannot be renewed reliably
/// across a network round trip and a busy scheduler.
pub const MIN_TTL: Duration = Duration::from_millis(50);

/// The longest lease accepted (one week).
pub const MAX_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// The longest wait: a longer one (`Duration::MAX` included) waits this
/// long, about a century, which is "without bound" for any process. The
/// cap keeps every deadline representable as an `Instant` and every wait
/// sent to a script an exact integer number of milliseconds (Redis reads
/// script numbers as doubles: past 2^53 ms they are no longer integers).
pub const MAX_WAIT: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// The longest retention accepted for a completed idempotency record or a
/// fence's record of the highest token (one year). Longer is refused
/// rather than shortened: a retention is a promise that a duplicate is
/// recognised for that long.
pub const MAX_RETENTION: Duration = Duration::from_secs(365 * 24 * 3600);

/// The most keys one `lock_all` request (or `keys = [...]` in the
/// attribute) may name. Every key is a lock of its own, taken and renewed
/// one by one; more than this many is a design smell, not a lock.
pub const MAX_LOCK_ALL_KEYS: usize = 64;

/// The lease used when neither the client nor the request sets one.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

// The default must itself be a lease the client accepts.
const _: () = assert!(
    MIN_TTL.as_nanos() <= DEFAULT_TTL.as_nanos() && DEFAULT_TTL.as_nanos() <= MAX_TTL.as_nanos()
);
