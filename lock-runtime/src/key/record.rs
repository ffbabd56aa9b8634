//! An idempotency record's names: the key that holds it and its notice
//! channel, hashed from whatever names it (a key, a caller's scope, a route).

use sha2::{Digest, Sha256};

use super::Role;

/// The Redis names of one record: the record itself and its notice channel,
/// in one hash slot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct RecordNames {
    pub(crate) record: String,
    pub(crate) notice: String,
}

impl RecordNames {
    /// The record named by `parts` (length-prefixed, so no two lists of
    /// parts spell one name) and `tail` under `prefix`. Hashed, so parts of
    /// any length and content make a short name.
    pub(crate) fn hashed(prefix: &str, parts: &[&[u8]], tail: &[u8]) -> Self {
        let hash = digest(parts, tail);
        // `key::name` of a hex digest, which has no hash tag to look for:
        // the digest in braces (the `names_of_a_digest_are_key_names` test
        // holds the two to one spelling).
        let named = |role: Role| {
            let mut name = String::with_capacity(prefix.len() + hash.len() + 4);
            name.push_str(prefix);
            name.push(role.letter());
            name.push('{');
            name.push_str(&hash);
            name.push('}');
            name
        };
        Self {
            record: named(Role::Idempotency),
            notice: named(Role::IdempotencyNotice),
        }
    }
}

/// The SHA-256 of `parts`, each prefixed with its length, then `tail`, in hex.
pub(crate) fn digest(parts: &[&[u8]], tail: &[u8]) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part);
    }
    hasher.update(tail);
    let hash = hasher.finalize();
    let mut hex = [0u8; 64];
    for (pair, byte) in hex.chunks_exact_mut(2).zip(hash) {
        pair[0] = b"0123456789abcdef"[usize::from(byte >> 4)];
        pair[1] = b"0123456789abcdef"[usize::from(byte & 0xf)];
    }
    // Hex digits: ASCII, checked in one pass rather than pushed a char at
    // a time.
    std::str::from_utf8(&hex).unwrap_or_default().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::name;

    #[test]
    fn names_of_a_digest_are_key_names() {
        for (prefix, key) in [("lock:", &b"k-1"[..]), ("", b""), ("p{x}:", b"}{")] {
            let names = RecordNames::hashed(prefix, &[key], b"record");
            let hash = digest(&[key], b"record");
            assert_eq!(hash.len(), 64);
            assert!(hash.bytes().all(|b| b.is_ascii_hexdigit()));
            assert_eq!(names.record, name(prefix, Role::Idempotency, &hash));
            assert_eq!(names.notice, name(prefix, Role::IdempotencyNotice, &hash));
        }
        // SHA-256 of nothing, in lowercase hex, as every version wrote it.
        assert_eq!(
            digest(&[], b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
