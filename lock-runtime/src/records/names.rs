//! A record's names: the hash that holds it and its notice channel.

use sha2::{Digest, Sha256};

use crate::key::{Role, name};

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
        Self {
            record: name(prefix, Role::Idempotency, &hash),
            notice: name(prefix, Role::IdempotencyNotice, &hash),
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
    let mut hex = String::with_capacity(64);
    for byte in hash {
        hex.push(char::from(b"0123456789abcdef"[usize::from(byte >> 4)]));
        hex.push(char::from(b"0123456789abcdef"[usize::from(byte & 0xf)]));
    }
    hex
}
