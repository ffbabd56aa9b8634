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
