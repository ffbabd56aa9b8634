//! Ownership tokens.

use std::fmt;

use crate::error::BackendError;

/// A fresh 128-bit random value, shown as 32 hex digits. One per
/// acquisition: it proves ownership to the scripts.
/// Held inline (no allocation, `Copy`): one is made per acquire.
///
/// The bits come from `rand`'s thread-local generator: ChaCha12, a
/// cryptographically secure generator seeded from the operating system and
/// reseeded from it as it goes, so a token costs no system call. The process
/// id is folded in, so a process forked after drawing tokens (sharing the
/// generator's state) still draws other ones than its parent; XOR with a
/// known value leaves the 128 bits as unguessable as they were.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Token([u8; 32]);

impl Token {
    pub(crate) fn random() -> Result<Self, BackendError> {
        let mut bytes = [0u8; 16];
        rand::RngCore::fill_bytes(&mut rand::rng(), &mut bytes);
        for (b, p) in bytes[12..].iter_mut().zip(std::process::id().to_le_bytes()) {
            *b ^= p;
        }
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut hex = [0u8; 32];
        for (i, byte) in bytes.iter().enumerate() {
            hex[2 * i] = HEX[usize::from(byte >> 4)];
            hex[2 * i + 1] = HEX[usize::from(byte & 0xf)];
        }
        Ok(Self(hex))
    }

    pub(crate) fn as_str(&self) -> &str {
        // Only ever ASCII hex digits.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }

    /// SHA-1 of the token, in hex: how release notices name a new owner, so
    /// that subscribers to a notice channel never learn a token.
    pub(crate) fn digest(&self) -> String {
        sha1_smol::Sha1::from(&self.0[..]).digest().to_string()
    }
}

impl fmt::Debug for Token {
    // Never print a token in full: it is a capability.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token({}…)", &self.as_str()[..6])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_128_bit_and_fresh() {
        let a = Token::random().unwrap();
        let b = Token::random().unwrap();
        assert_eq!(a.as_str().len(), 32);
        assert!(a.as_str().bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
        assert!(!format!("{a:?}").contains(a.as_str()));
        // The same digest as Lua's `redis.sha1hex`.
        let known = Token(*b"0123456789abcdef0123456789abcdef");
        assert_eq!(known.digest(), "b1775a785f09a6ebaf2dc33d6eaeb98974d9cdb8");
    }
}
