//! Ownership tokens.

use std::fmt;

use crate::error::BackendError;

/// A fresh 128-bit random value, shown as 32 hex digits. One per
/// acquisition: it proves ownership to the scripts.
/// Held inline (no allocation, `Copy`): one is made per acquire.
///
/// The bits come from `rand`'s thread-local generator: ChaCha12, a
/// cryptographically secure generator seeded from the operating system and
/// reseeded from it as it goes, so a token costs no system call. The
/// drawing client's [`Salt`] is folded in, so a process forked after
/// drawing tokens (sharing the generator's state), whose clients are its
/// own, still draws other tokens than its parent; XOR with a value the
/// generator does not know leaves the 128 bits as unguessable as they were.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Token([u8; 32]);

/// 128 bits from the operating system's generator, drawn once per client
/// (a `getrandom` call when it is built) and folded into each of its
/// tokens. Earlier versions folded in the process id, which cost a system
/// call per token.
#[derive(Clone, Copy)]
pub(crate) struct Salt([u8; 16]);

impl Salt {
    pub(crate) fn from_os() -> Result<Self, BackendError> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).map_err(|e| {
            BackendError::new(format!(
                "the operating system's random number generator failed: {e}"
            ))
        })?;
        Ok(Self(bytes))
    }
}

impl fmt::Debug for Salt {
    // A secret of the client's: never printed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Salt(..)")
    }
}

impl Token {
    pub(crate) fn random(salt: &Salt) -> Self {
        let mut bytes = [0u8; 16];
        rand::RngCore::fill_bytes(&mut rand::rng(), &mut bytes);
        Self::salted(bytes, salt)
    }

    /// A token of a client of its own (for unit tests).
    #[cfg(test)]
    pub(crate) fn for_test() -> Self {
        Self::random(&Salt::from_os().expect("the OS generator works"))
    }

    /// `bytes` drawn from the generator, with `salt` folded in.
    fn salted(mut bytes: [u8; 16], salt: &Salt) -> Self {
        for (b, s) in bytes.iter_mut().zip(salt.0) {
            *b ^= s;
        }
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut hex = [0u8; 32];
        for (i, byte) in bytes.iter().enumerate() {
            hex[2 * i] = HEX[usize::from(byte >> 4)];
            hex[2 * i + 1] = HEX[usize::from(byte & 0xf)];
        }
        Self(hex)
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
        let salt = Salt::from_os().unwrap();
        let a = Token::random(&salt);
        let b = Token::random(&salt);
        assert_eq!(a.as_str().len(), 32);
        assert!(a.as_str().bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
        assert!(!format!("{a:?}").contains(a.as_str()));
        // The same digest as Lua's `redis.sha1hex`.
        let known = Token(*b"0123456789abcdef0123456789abcdef");
        // A forked child's client draws the same bits as its parent's
        // (one generator state, copied), with a salt of its own.
        let child = Salt::from_os().unwrap();
        assert_ne!(salt.0, child.0);
        let drawn = [7u8; 16];
        assert_ne!(Token::salted(drawn, &salt), Token::salted(drawn, &child));
        assert_eq!(known.digest(), "b1775a785f09a6ebaf2dc33d6eaeb98974d9cdb8");
    }
}
