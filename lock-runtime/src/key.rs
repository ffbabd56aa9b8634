//! Key validation and the Redis names derived from a key.
//!
//! Every name the library touches is `prefix + kind + body`:
//!
//! * `kind` is one letter naming what the name is for (`L` the lock, `F` the
//!   fencing counter, `Q` the waiter queue, `N` the release-notice channel, `I`
//!   an idempotency record);
//! * `body` is `{key}` when the key carries no Redis Cluster hash tag of its own,
//!   and `:key` when it does (`{tenant:7}:order:1`), so the caller's tag decides
//!   the slot.
//!
//! The kind letter is followed by `{` or `:`, which tells the two body forms
//! apart, so the mapping from `(kind, key)` to a name is injective: no key can
//! name another key's lock, counter or channel, and every name of one key lands
//! in one hash slot (the prefix may not contain braces).

use crate::LockError;

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

/// The longest key accepted, in bytes (before the prefix is added).
pub const MAX_KEY_LEN: usize = 1024;

/// The longest key prefix accepted, in bytes.
pub const MAX_PREFIX_LEN: usize = 128;

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

/// `true` if Redis Cluster would hash only a part of `key`: a `{` followed later
/// by a `}` with at least one byte between them.
pub(crate) fn has_hash_tag(key: &str) -> bool {
    match key.find('{') {
        Some(open) => key[open + 1..].find('}').is_some_and(|close| close > 0),
        None => false,
    }
}

/// The Redis Cluster slot of a name: CRC16 (XMODEM) of its hash tag, mod 16384.
pub(crate) fn slot(name: &str) -> u16 {
    let bytes = name.as_bytes();
    let tagged = name.find('{').and_then(|open| {
        let rest = &bytes[open + 1..];
        rest.iter()
            .position(|b| *b == b'}')
            .filter(|close| *close > 0)
            .map(|close| &rest[..close])
    });
    crc16(tagged.unwrap_or(bytes)) % 16384
}

fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for byte in bytes {
        crc ^= u16::from(*byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// What a derived name is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Lock,
    Fence,
    Queue,
    Notice,
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    Idempotency,
}

impl Kind {
    fn letter(self) -> char {
        match self {
            Kind::Lock => 'L',
            Kind::Fence => 'F',
            Kind::Queue => 'Q',
            Kind::Notice => 'N',
            Kind::Idempotency => 'I',
        }
    }
}

/// Builds the full Redis name of `kind` for `key` under `prefix`.
pub(crate) fn name(prefix: &str, kind: Kind, key: &str) -> String {
    let mut s = String::with_capacity(prefix.len() + key.len() + 3);
    s.push_str(prefix);
    s.push(kind.letter());
    if has_hash_tag(key) {
        s.push(':');
        s.push_str(key);
    } else {
        s.push('{');
        s.push_str(key);
        s.push('}');
    }
    s
}

/// The names one lock uses, built once per acquisition.
#[derive(Clone, Debug)]
pub(crate) struct KeyNames {
    pub(crate) lock: String,
    pub(crate) fence: String,
    pub(crate) queue: String,
    pub(crate) notice: String,
    /// The Redis Cluster slot all four names share: picks the cluster
    /// node's batch and, on one server, the command connection.
    pub(crate) slot: u16,
}

impl KeyNames {
    pub(crate) fn new(prefix: &str, key: &str) -> Self {
        let lock = name(prefix, Kind::Lock, key);
        Self {
            slot: slot(&lock),
            fence: name(prefix, Kind::Fence, key),
            queue: name(prefix, Kind::Queue, key),
            notice: name(prefix, Kind::Notice, key),
            lock,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn untagged_keys_are_wrapped_in_a_hash_tag() {
        let n = KeyNames::new("lock:", "order:42");
        assert_eq!(n.lock, "lock:L{order:42}");
        assert_eq!(n.fence, "lock:F{order:42}");
        assert_eq!(n.notice, "lock:N{order:42}");
    }

    #[test]
    fn tagged_keys_keep_their_own_tag() {
        let n = KeyNames::new("lock:", "{tenant:7}:order:1");
        assert_eq!(n.lock, "lock:L:{tenant:7}:order:1");
        assert_eq!(n.fence, "lock:F:{tenant:7}:order:1");
    }

    #[test]
    fn a_key_cannot_name_another_keys_counter_or_lock() {
        // Without the body marker these would collide.
        assert_ne!(name("p:", Kind::Lock, "a"), name("p:", Kind::Lock, "{a}"));
        assert_ne!(
            name("p:", Kind::Fence, "{t}:a"),
            name("p:", Kind::Lock, "{t}:a:fence")
        );
    }

    #[test]
    fn hash_tags_follow_redis_rules() {
        assert!(has_hash_tag("{a}"));
        assert!(has_hash_tag("x{a}y{b}"));
        assert!(!has_hash_tag("{}a"));
        assert!(!has_hash_tag("a}b{"));
        assert!(!has_hash_tag("plain"));
        // Redis looks only at the first `}` after the first `{`.
        assert!(!has_hash_tag("{}}"));
    }

    #[test]
    fn slots_match_redis_cluster() {
        // Values from `CLUSTER KEYSLOT`.
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot("{user1000}.following"), slot("{user1000}.followers"));
        assert_eq!(slot("123456789"), 0x31C3); // the CRC16 check value
        let n = KeyNames::new("lock:", "order:42");
        assert_eq!(n.slot, slot(&n.lock));
        assert_eq!(slot(&n.lock), slot(&n.fence));
        assert_eq!(slot(&n.lock), slot(&n.queue));
        assert_eq!(slot(&n.lock), slot(&n.notice));
    }

    #[test]
    fn bad_keys_are_rejected_with_a_reason() {
        assert!(validate_key("").unwrap_err().is_invalid_key());
        assert!(validate_key(&"x".repeat(MAX_KEY_LEN + 1)).is_err());
        assert!(validate_key("a\nb").is_err());
        assert!(validate_key("ok: {tag} ünïcode").is_ok());
        assert!(validate_prefix("lock{").is_err());
    }
}
