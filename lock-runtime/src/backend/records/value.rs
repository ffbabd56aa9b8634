//! A record's value on Redis: one string in every state, so a claim of a
//! fresh key is one plain `SET .. NX PX` and every script reads one type.
//!
//! * in flight: `run:<owner>:<fingerprint>`, or `waited:<owner>:<fingerprint>`
//!   once a duplicate waits on it (its completion or release is announced);
//! * completed: `done:<owner>:<fingerprint>:<status>:<big>:<headers length>:`
//!   followed by the encoded headers and the body (`big` is `1` when the body
//!   was over the storage limit and is not stored, else `0`).
//!
//! Owners (tokens) and fingerprints (hex) hold no `:`; the headers are
//! length-prefixed and the body runs to the end, so either may hold anything.

use std::io::Write as _;

use bytes::Bytes;
use redis::{RedisWrite, ToRedisArgs};

use super::StoredResponse;
use crate::token::Token;

/// A record's value in either state, written straight into the command by
/// one writer: in flight (`response` is `None`, the value a claim sets) or
/// completed with `response` (the value a completion stores). The two share
/// their head, `<state>:<owner>:<fingerprint>`.
#[derive(Clone, Copy)]
pub(super) struct Value<'a> {
    pub(super) owner: &'a Token,
    pub(super) fingerprint: &'a str,
    pub(super) response: Option<&'a StoredResponse>,
}

impl<'a> Value<'a> {
    /// The value `ours`'s claim sets (and a settle compares with).
    pub(super) fn claim(ours: &'a super::Ours) -> Self {
        let (owner, fingerprint) = (&ours.token, ours.fingerprint.as_str());
        Value {
            owner,
            fingerprint,
            response: None,
        }
    }

    /// About how long the value is (at least as long), to size the
    /// command it goes into once.
    pub(super) fn len_hint(&self) -> usize {
        let head = 5 + self.owner.as_bytes().len() + 1 + self.fingerprint.len();
        head + self
            .response
            .map_or(0, |r| 4 * 21 + r.headers.len() + r.body.len())
    }
}

impl ToRedisArgs for Value<'_> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + RedisWrite,
    {
        let state: &[u8] = if self.response.is_some() {
            b"done"
        } else {
            b"run"
        };
        let mut arg = out.writer_for_next_arg();
        // Into the command's buffer, which cannot fail.
        let _ = [
            state,
            b":",
            self.owner.as_bytes(),
            b":",
            self.fingerprint.as_bytes(),
        ]
        .iter()
        .try_for_each(|piece| arg.write_all(piece))
        .and_then(|()| match self.response {
            None => Ok(()),
            Some(r) => {
                let mut tail = [0; 3 * 21];
                let mut at = 0;
                for n in [
                    u64::from(r.status),
                    u64::from(r.body_too_large),
                    r.headers.len() as u64,
                ] {
                    tail[at] = b':';
                    at += 1 + decimal(n, &mut tail[at + 1..]);
                }
                tail[at] = b':';
                arg.write_all(&tail[..=at])
                    .and_then(|()| arg.write_all(&r.headers))
                    .and_then(|()| arg.write_all(&r.body))
            }
        });
    }
}

/// Writes `n` in decimal at the start of `out` (20 bytes hold any `u64`),
/// without the formatting machinery; returns the digits written.
fn decimal(mut n: u64, out: &mut [u8]) -> usize {
    let mut digits = [0; 20];
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let len = digits.len() - start;
    out[..len].copy_from_slice(&digits[start..]);
    len
}

/// The response in a completed record's value (as the claim script returns
/// it); `None` when the value is no completed record. The headers and the
/// body share the value's buffer.
pub(super) fn completed(value: Bytes) -> Option<StoredResponse> {
    // done, owner, fingerprint, status, big, headers length, then the rest.
    let mut at = 0;
    let mut fields = [(0, 0); 6];
    for field in &mut fields {
        let end = at + value[at..].iter().position(|b| *b == b':')?;
        *field = (at, end);
        at = end + 1;
    }
    let text = |(start, end): (usize, usize)| std::str::from_utf8(&value[start..end]).ok();
    if text(fields[0])? != "done" {
        return None;
    }
    let status = text(fields[3])?.parse().ok()?;
    let body_too_large = text(fields[4])? == "1";
    let headers_len: usize = text(fields[5])?.parse().ok()?;
    let body_at = at.checked_add(headers_len).filter(|e| *e <= value.len())?;
    Some(StoredResponse {
        status,
        headers: value.slice(at..body_at),
        body: value.slice(body_at..),
        body_too_large,
    })
}

/// The owner and the fingerprint a record's value names (`<state>:<owner>:
/// <fingerprint>`, then more in a completed one); `None` when the value is
/// no record.
pub(super) fn owner_and_fingerprint(value: &[u8]) -> Option<(&[u8], &[u8])> {
    let mut fields = value.splitn(4, |b| *b == b':').skip(1);
    Some((fields.next()?, fields.next()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(arg: impl ToRedisArgs) -> Vec<u8> {
        let mut args = arg.to_redis_args();
        assert_eq!(args.len(), 1, "one argument");
        args.remove(0)
    }

    #[test]
    fn a_completed_value_reads_back_as_it_was_written_whatever_its_bytes() {
        let owner = Token::for_test();
        for (headers, body, big) in [
            (&b""[..], &b""[..], false),
            (b"content-type:a:b\n", b"{\"ok\":true}", false),
            (b"x", b"", true),
            (b"::", b"12:34:", false),
        ] {
            let response = StoredResponse {
                status: 201,
                headers: Bytes::copy_from_slice(headers),
                body: Bytes::copy_from_slice(body),
                body_too_large: big,
            };
            let value = written(Value {
                owner: &owner,
                fingerprint: "ab12",
                response: Some(&response),
            });
            assert!(value.starts_with(format!("done:{}:ab12:", owner.as_str()).as_bytes()));
            assert_eq!(completed(value.into()), Some(response));
        }
    }

    #[test]
    fn the_owner_and_fingerprint_are_read_from_either_state() {
        for value in [
            &b"run:o1:ab12"[..],
            b"waited:o1:ab12",
            b"done:o1:ab12:201:0:0:",
        ] {
            assert_eq!(
                owner_and_fingerprint(value),
                Some((&b"o1"[..], &b"ab12"[..]))
            );
        }
        assert_eq!(owner_and_fingerprint(b"done"), None);
        assert_eq!(owner_and_fingerprint(b"done:o1"), None);
    }

    #[test]
    fn numbers_are_written_in_decimal_whatever_their_size() {
        for n in [0, 7, 10, 201, 65_535, u64::MAX] {
            let mut out = [0; 20];
            let len = decimal(n, &mut out);
            assert_eq!(&out[..len], n.to_string().as_bytes());
        }
    }

    #[test]
    fn an_in_flight_value_names_its_owner_and_fingerprint() {
        let owner = Token::for_test();
        let value = written(Value {
            owner: &owner,
            fingerprint: "ab12",
            response: None,
        });
        assert_eq!(value, format!("run:{}:ab12", owner.as_str()).into_bytes());
        assert_eq!(completed(value.into()), None);
    }

    #[test]
    fn a_value_that_is_no_completed_record_is_refused_without_panicking() {
        for bad in [
            &b""[..],
            b"done",
            b"done:o:f:201:0:",
            b"done:o:f:201:0:5:abc",
            b"done:o:f:x:0:0:",
            b"done:o:f:201:0:99999999999999999999999:",
        ] {
            assert_eq!(completed(Bytes::copy_from_slice(bad)), None, "{bad:?}");
        }
    }
}
