//! Ownership tokens.

use std::fmt;

use crate::error::BackendError;

/// A fresh 128-bit random value, shown as 32 hex digits, followed by the
/// drawing client's id and the time it was drawn:
/// `<32 hex>.<12 hex client id>.<11 hex ms since the Unix epoch>`. One per
/// acquisition: it proves ownership to the scripts (the 128 random bits do;
/// the id and the time are public, so `inspect` can name the holder through
/// the client's registry entry, and say since when it asked, at no cost per
/// acquire beyond reading the clock). Held inline (no allocation, `Copy`).
///
/// The bits come from `rand`'s thread-local generator: ChaCha12, a
/// cryptographically secure generator seeded from the operating system and
/// reseeded from it as it goes, so a token costs no system call. The
/// drawing client's [`Salt`] is folded in, so a process forked after
/// drawing tokens (sharing the generator's state), whose clients are its
/// own, still draws other tokens than its parent; XOR with a value the
/// generator does not know leaves the 128 bits as unguessable as they were.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Token([u8; TOKEN_LEN]);

/// Hex digits of the random part.
const RANDOM_LEN: usize = 32;
/// Hex digits of a client id (48 random bits per client).
pub(crate) const CLIENT_ID_LEN: usize = 12;
/// Hex digits of the draw time in ms (enough until the year 2527).
const TIME_LEN: usize = 11;
const TOKEN_LEN: usize = RANDOM_LEN + 1 + CLIENT_ID_LEN + 1 + TIME_LEN;
const HEX: &[u8; 16] = b"0123456789abcdef";

/// 128 bits from the operating system's generator, drawn once per client
/// (a `getrandom` call when it is built) and folded into each of its
/// tokens. Earlier versions folded in the process id, which cost a system
/// call per token.
///
/// It also holds the client's id: 48 more random bits, in hex, public (it
/// names the client's registry entry, which maps it to the client's label).
#[derive(Clone, Copy)]
pub(crate) struct Salt([u8; 16], [u8; CLIENT_ID_LEN]);

impl Salt {
    pub(crate) fn from_os() -> Result<Self, BackendError> {
        let mut bytes = [0u8; 16 + CLIENT_ID_LEN / 2];
        getrandom::fill(&mut bytes).map_err(|e| {
            BackendError::new(format!(
                "the operating system's random number generator failed: {e}"
            ))
        })?;
        let mut salt = [0u8; 16];
        salt.copy_from_slice(&bytes[..16]);
        let mut id = [0u8; CLIENT_ID_LEN];
        hex_into(&bytes[16..], &mut id);
        Ok(Self(salt, id))
    }

    /// The client's id: 12 hex digits.
    pub(crate) fn client_id(&self) -> &str {
        std::str::from_utf8(&self.1).unwrap_or_default()
    }
}

/// Writes `bytes` as lowercase hex into `out` (twice as long).
fn hex_into(bytes: &[u8], out: &mut [u8]) {
    for (i, byte) in bytes.iter().enumerate() {
        out[2 * i] = HEX[usize::from(byte >> 4)];
        out[2 * i + 1] = HEX[usize::from(byte & 0xf)];
    }
}

/// What a token tells anybody who reads it (a lock's value, a queue entry):
/// the id of the client that drew it, and when (ms since the Unix epoch).
/// `None` for a value that is no token of this version (set by hand, or by
/// an older client).
pub(crate) fn public_part(value: &str) -> Option<(&str, u64)> {
    // A marked lock value is `token+deadline` (see acquire.lua).
    let value = value.split_once('+').map_or(value, |(token, _)| token);
    let b = value.as_bytes();
    if b.len() != TOKEN_LEN || b[RANDOM_LEN] != b'.' || b[RANDOM_LEN + 1 + CLIENT_ID_LEN] != b'.' {
        return None;
    }
    let id = &value[RANDOM_LEN + 1..RANDOM_LEN + 1 + CLIENT_ID_LEN];
    let ms = u64::from_str_radix(&value[TOKEN_LEN - TIME_LEN..], 16).ok()?;
    id.bytes()
        .all(|c| c.is_ascii_hexdigit())
        .then_some((id, ms))
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
        let mut hex = [0u8; TOKEN_LEN];
        hex_into(&bytes, &mut hex[..RANDOM_LEN]);
        hex[RANDOM_LEN] = b'.';
        hex[RANDOM_LEN + 1..RANDOM_LEN + 1 + CLIENT_ID_LEN].copy_from_slice(&salt.1);
        hex[RANDOM_LEN + 1 + CLIENT_ID_LEN] = b'.';
        let mut ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        for digit in hex[TOKEN_LEN - TIME_LEN..].iter_mut().rev() {
            *digit = HEX[(ms & 0xf) as usize];
            ms >>= 4;
        }
        Self(hex)
    }

    /// The token as text. Checks its bytes (ASCII, always) on each call:
    /// commands take the token as it is ([`redis::ToRedisArgs`]), without.
    pub(crate) fn as_str(&self) -> &str {
        // Only ever ASCII hex digits.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }

    /// The token's bytes (ASCII), as they go into a command.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// SHA-1 of the token, in hex: how release notices name a new owner, so
    /// that subscribers to a notice channel never learn a token.
    pub(crate) fn digest(&self) -> String {
        sha1_smol::Sha1::from(&self.0[..]).digest().to_string()
    }
}

/// The token as one argument of a command: its bytes, the same as
/// [`Token::as_str`]'s, written without the UTF-8 check.
impl redis::ToRedisArgs for Token {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + redis::RedisWrite,
    {
        out.write_arg(&self.0);
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
        assert_eq!(a.as_str().len(), TOKEN_LEN);
        assert!(
            a.as_str()[..RANDOM_LEN]
                .bytes()
                .all(|c| c.is_ascii_hexdigit())
        );
        assert_ne!(a.as_str()[..RANDOM_LEN], b.as_str()[..RANDOM_LEN]);
        // The public part: the client's id and about now.
        let (id, ms) = public_part(a.as_str()).unwrap();
        assert_eq!(id, salt.client_id());
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        assert!(now.abs_diff(ms) < 5_000, "{ms} vs {now}");
        assert_eq!(public_part(&format!("{}+", a.as_str())), Some((id, ms)));
        assert_eq!(public_part("0123456789abcdef0123456789abcdef"), None);
        assert_ne!(a, b);
        assert!(!format!("{a:?}").contains(a.as_str()));
        // The same digest as Lua's `redis.sha1hex`.
        let known = Token(*b"0123456789abcdef0123456789abcdef.0123456789ab.0123456789a");
        // A forked child's client draws the same bits as its parent's
        // (one generator state, copied), with a salt of its own.
        let child = Salt::from_os().unwrap();
        assert_ne!(salt.0, child.0);
        let drawn = [7u8; 16];
        assert_ne!(Token::salted(drawn, &salt), Token::salted(drawn, &child));
        assert_eq!(known.digest(), "f1c535d30a9422bba09bf70b77eb55fd35225caa");
    }

    #[test]
    fn a_token_goes_into_a_command_as_its_text() {
        let token = Token::for_test();
        assert_eq!(
            redis::ToRedisArgs::to_redis_args(&token),
            redis::ToRedisArgs::to_redis_args(&token.as_str())
        );
        assert_eq!(token.as_bytes(), token.as_str().as_bytes());
    }
}
