//! Ownership tokens.

use std::fmt;

use crate::error::BackendError;

/// A fresh 128-bit random value from the operating system's generator, shown as
/// 32 hex digits. One per acquisition: it proves ownership to the scripts.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Token(String);

impl Token {
    pub(crate) fn random() -> Result<Self, BackendError> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes)
            .map_err(|e| BackendError::new(format!("the OS random generator failed: {e}")))?;
        Ok(Self(format!("{:032x}", u128::from_be_bytes(bytes))))
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }

    /// SHA-1 of the token, in hex: how release notices name a new owner, so
    /// that subscribers to a notice channel never learn a token.
    pub(crate) fn digest(&self) -> String {
        sha1_smol::Sha1::from(self.0.as_bytes())
            .digest()
            .to_string()
    }
}

impl fmt::Debug for Token {
    // Never print a token in full: it is a capability.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token({}…)", &self.0[..6])
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
        assert_ne!(a, b);
        assert!(!format!("{a:?}").contains(a.as_str()));
        // The same digest as Lua's `redis.sha1hex`.
        let known = Token("abc".into());
        assert_eq!(known.digest(), "a9993e364706816aba3e25717850c26c9cd0d89d");
    }
}
