//! The `Idempotency-Key` header, record names and request fingerprints.

use std::borrow::Cow;

use http::{HeaderMap, HeaderName};
use sha2::{Digest, Sha256};

use crate::key::RecordNames;
pub(crate) use crate::key::digest;

/// `Idempotency-Key`.
pub(crate) static IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The longest key accepted, in characters.
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 255;

/// What the request says about its key.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum KeyHeader {
    Absent,
    Key(String),
    Invalid(String),
}

/// Reads `Idempotency-Key`: a Structured Field string (RFC 8941,
/// `"8e03978e-40d5-43e8-bc93-6894a57f9324"`), or, leniently, the same text
/// as a bare token. Parameters are not accepted.
pub(crate) fn read_key(headers: &HeaderMap) -> KeyHeader {
    let mut values = headers.get_all(&IDEMPOTENCY_KEY).iter();
    let Some(value) = values.next() else {
        return KeyHeader::Absent;
    };
    if values.next().is_some() {
        return KeyHeader::Invalid("the Idempotency-Key header appears more than once".into());
    }
    match parse_key(value.as_bytes()) {
        Ok(key) => KeyHeader::Key(key),
        Err(why) => KeyHeader::Invalid(format!("invalid Idempotency-Key: {why}")),
    }
}

fn parse_key(raw: &[u8]) -> Result<String, &'static str> {
    // Leading and trailing spaces are allowed around a field value.
    let start = raw.iter().position(|&b| b != b' ').unwrap_or(raw.len());
    let end = raw
        .iter()
        .rposition(|&b| b != b' ')
        .map_or(start, |i| i + 1);
    let raw = &raw[start..end];
    let key = match raw.first() {
        None => return Err("the key is empty"),
        Some(b'"') => {
            let mut key = String::new();
            let mut i = 1;
            loop {
                match raw.get(i) {
                    None => return Err("unterminated string (expected a closing `\"`)"),
                    Some(b'"') => break,
                    Some(b'\\') => match raw.get(i + 1) {
                        Some(&c @ (b'"' | b'\\')) => {
                            key.push(char::from(c));
                            i += 1;
                        }
                        _ => return Err("only `\\\"` and `\\\\` may be escaped in a string"),
                    },
                    Some(&c @ 0x20..=0x7e) => key.push(char::from(c)),
                    Some(_) => return Err("a string holds printable ASCII characters only"),
                }
                i += 1;
            }
            if i + 1 != raw.len() {
                return Err(
                    "unexpected characters after the string (parameters are not supported)",
                );
            }
            key
        }
        Some(_) => {
            if !raw.iter().all(|&c| is_token_char(c)) {
                return Err(
                    "expected a quoted string, as in `Idempotency-Key: \"8e03978e-40d5-43e8\"`",
                );
            }
            // All ASCII: checked above.
            String::from_utf8_lossy(raw).into_owned()
        }
    };
    if key.is_empty() {
        return Err("the key is empty");
    }
    if key.len() > MAX_IDEMPOTENCY_KEY_LEN {
        return Err("the key is longer than 255 characters");
    }
    Ok(key)
}

/// `tchar` (RFC 9110) plus `:` and `/`, as in a Structured Field token.
fn is_token_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(&c)
}

/// The record of `key`, scoped to `scope` (the principal), the method and the
/// matched route, under the client's prefix. Hashed, so scopes and keys of any
/// length and content make a short name in one hash slot.
pub(crate) fn record_names(
    prefix: &str,
    scope: &str,
    method: &str,
    route: &str,
    key: &str,
) -> RecordNames {
    RecordNames::hashed(
        prefix,
        &[
            scope.as_bytes(),
            method.as_bytes(),
            route.as_bytes(),
            key.as_bytes(),
        ],
        b"",
    )
}

/// How the request body enters the fingerprint that tells a retry (the same
/// request) from a reuse of its key for another request (`422`); see
/// [`IdempotencyLayer::body_fingerprint`](super::IdempotencyLayer::body_fingerprint).
///
/// ```
/// use lock_runtime::layer::IdempotencyLayer;
/// use lock_runtime::layer::idempotency::BodyFingerprint;
///
/// # async fn demo(client: lock_runtime::LockClient) {
/// // `{"item":"pen","qty":1}` and `{ "qty": 1, "item": "pen" }` are one request.
/// let layer = IdempotencyLayer::new(client).body_fingerprint(BodyFingerprint::Json);
/// # let _ = layer;
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum BodyFingerprint {
    /// The body's bytes (the default): a retry must send the same bytes.
    #[default]
    Bytes,
    /// The body's JSON value: the order of object members and whitespace
    /// do not count; strings compare after unescaping (`"\u0041"` is `"A"`)
    /// and numbers as parsed (integers exactly, others as `f64`, so `1.50`
    /// and `1.5` are equal but `1` and `1.0` are not). A body with an
    /// integer that cannot be kept exactly (beyond the 64-bit range, or
    /// `-0`) or a number beyond `f64`'s range (`1e400`) is compared by its
    /// bytes instead, so two such numbers that round to one `f64` are never
    /// taken for one request. A member name
    /// given twice counts with its last value. An empty body is fingerprinted as
    /// empty; any other body that is not valid JSON is refused with `400 Bad
    /// Request` before anything is claimed (the handler could not have
    /// accepted it either, and a guessed fingerprint could make two different
    /// requests one).
    Json,
}

/// Why a body could not be fingerprinted.
#[derive(Debug)]
pub(crate) struct NotJson(pub(crate) serde_json::Error);

/// The bytes of `body` that the fingerprint covers, under `how`.
/// The body itself for [`BodyFingerprint::Bytes`] (not copied).
pub(crate) fn fingerprinted_body(
    how: BodyFingerprint,
    body: &[u8],
) -> Result<Cow<'_, [u8]>, NotJson> {
    match how {
        BodyFingerprint::Bytes => Ok(Cow::Borrowed(body)),
        BodyFingerprint::Json if body.is_empty() => Ok(Cow::Borrowed(body)),
        BodyFingerprint::Json => {
            let value = match serde_json::from_slice::<serde_json::Value>(body) {
                Ok(value) => value,
                // JSON, with a number no `f64` holds (`1e400`): as an
                // inexact integer, compared by its bytes.
                Err(_) if serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok() => {
                    return Ok(Cow::Borrowed(body));
                }
                Err(e) => return Err(NotJson(e)),
            };
            if has_inexact_integer(body) {
                return Ok(Cow::Borrowed(body));
            }
            let mut out = Vec::with_capacity(body.len());
            canonical_json(&value, &mut out);
            Ok(Cow::Owned(out))
        }
    }
}

/// Whether the JSON text `body` (parsed already: valid) has an integer that
/// `serde_json::Value` does not keep exactly: one beyond the range of `i64`
/// and `u64` (read as the nearest `f64`), or `-0` (read as `-0.0`).
fn has_inexact_integer(body: &[u8]) -> bool {
    let (mut i, mut in_string) = (0, false);
    while let Some(&c) = body.get(i) {
        i += 1;
        match c {
            b'\\' if in_string => i += 1,
            b'"' => in_string = !in_string,
            b'-' | b'0'..=b'9' if !in_string => {
                let start = i - 1;
                while body
                    .get(i)
                    .is_some_and(|b| matches!(b, b'0'..=b'9' | b'.' | b'e' | b'E' | b'+' | b'-'))
                {
                    i += 1;
                }
                let token = std::str::from_utf8(&body[start..i]).unwrap_or_default();
                let integer = !token.contains(['.', 'e', 'E']);
                if integer
                    && (token == "-0"
                        || (token.parse::<i64>().is_err() && token.parse::<u64>().is_err()))
                {
                    return true;
                }
            }
            _ => {}
        }
    }
    false
}

/// `value` as compact JSON with object members sorted by name (whatever
/// order the map keeps: serde_json's `preserve_order` may be on).
fn canonical_json(value: &serde_json::Value, out: &mut Vec<u8>) {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            let mut members: Vec<_> = map.iter().collect();
            members.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (name, value)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                push_json(&Value::String(name.clone()), out);
                out.push(b':');
                canonical_json(value, out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                canonical_json(item, out);
            }
            out.push(b']');
        }
        scalar => push_json(scalar, out),
    }
}

fn push_json(scalar: &serde_json::Value, out: &mut Vec<u8>) {
    // Writing a scalar into a Vec cannot fail.
    let _ = serde_json::to_writer(out, scalar);
}

/// What makes two requests with one key "the same request": the method, the
/// matched route, the concrete path and query (one key on `/orders/1/pay` and
/// `/orders/2/pay` is a mismatch, not a replay) and the SHA-256 of the body
/// (as [`fingerprinted_body`] gives it).
pub(crate) fn fingerprint(method: &str, route: &str, path_and_query: &str, body: &[u8]) -> String {
    let body_hash = Sha256::digest(body);
    digest(
        &[
            method.as_bytes(),
            route.as_bytes(),
            path_and_query.as_bytes(),
        ],
        &body_hash,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(values: &[&str]) -> KeyHeader {
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append(&IDEMPOTENCY_KEY, v.parse().unwrap());
        }
        read_key(&headers)
    }

    #[test]
    fn keys_are_structured_field_strings_or_bare_tokens() {
        assert_eq!(read(&[]), KeyHeader::Absent);
        assert_eq!(read(&[r#""abc-123""#]), KeyHeader::Key("abc-123".into()));
        assert_eq!(read(&[r#"  "a b" "#]), KeyHeader::Key("a b".into()));
        assert_eq!(
            read(&[r#""q\"uote\\""#]),
            KeyHeader::Key(r#"q"uote\"#.into())
        );
        assert_eq!(
            read(&["8e03978e-40d5-43e8-bc93-6894a57f9324"]),
            KeyHeader::Key("8e03978e-40d5-43e8-bc93-6894a57f9324".into())
        );
        assert_eq!(read(&["urn:k/1"]), KeyHeader::Key("urn:k/1".into()));
    }

    #[test]
    fn malformed_keys_are_invalid() {
        let long = format!("\"{}\"", "x".repeat(256));
        let max = format!("\"{}\"", "x".repeat(255));
        assert_eq!(read(&[&max]), KeyHeader::Key("x".repeat(255)));
        for bad in [
            "",
            "\"\"",
            "\"open",
            "\"a\"b",
            "\"a\";p=1",
            "a b",
            "a,b",
            "\"\\n\"",
            &long,
            "\"é\"",
        ] {
            let mut headers = HeaderMap::new();
            headers.insert(
                &IDEMPOTENCY_KEY,
                http::HeaderValue::from_bytes(bad.as_bytes()).unwrap(),
            );
            assert!(
                matches!(read_key(&headers), KeyHeader::Invalid(_)),
                "{bad:?}"
            );
        }
        assert!(matches!(read(&["\"a\"", "\"b\""]), KeyHeader::Invalid(_)));
    }

    #[test]
    fn records_are_scoped_and_fingerprints_cover_the_request() {
        let names = record_names("lock:", "alice", "POST", "/orders", "k1");
        let a = names.record;
        assert!(a.starts_with("lock:I{") && a.ends_with('}') && a.len() == "lock:I{}".len() + 64);
        // The notice channel is named like a lock's, in the record's slot.
        assert_eq!(names.notice, format!("lock:J{}", &a["lock:I".len()..]));
        assert_eq!(crate::key::slot(&names.notice), crate::key::slot(&a));
        let record_name =
            |p: &str, s: &str, m: &str, r: &str, k: &str| record_names(p, s, m, r, k).record;
        assert_ne!(a, record_name("lock:", "bob", "POST", "/orders", "k1"));
        assert_ne!(a, record_name("lock:", "alice", "PUT", "/orders", "k1"));
        assert_ne!(
            a,
            record_name("lock:", "alice", "POST", "/orders/{id}", "k1")
        );
        // Length prefixes: moving a character between parts changes the name.
        assert_ne!(
            record_name("p:", "ab", "POST", "/", "c"),
            record_name("p:", "a", "POST", "/", "bc")
        );
        let f = fingerprint("POST", "/orders", "/orders", b"{}");
        assert_eq!(f, fingerprint("POST", "/orders", "/orders", b"{}"));
        assert_ne!(f, fingerprint("POST", "/orders", "/orders", b"{ }"));
        assert_ne!(f, fingerprint("POST", "/orders", "/orders?x=1", b"{}"));
    }

    fn json(body: &str) -> String {
        String::from_utf8(
            fingerprinted_body(BodyFingerprint::Json, body.as_bytes())
                .unwrap()
                .into_owned(),
        )
        .unwrap()
    }

    #[test]
    fn the_json_fingerprint_ignores_member_order_and_whitespace_only() {
        let a = json(r#"{"item":"pen","qty":1,"tags":["a","b"],"x":{"b":null,"a":true}}"#);
        assert_eq!(
            a,
            r#"{"item":"pen","qty":1,"tags":["a","b"],"x":{"a":true,"b":null}}"#
        );
        assert_eq!(
            a,
            json(
                "\n{ \"x\" : {\"a\":true, \"b\":null},\t\"tags\":[\"a\",\"b\"], \"qty\":1, \"item\":\"p\\u0065n\" }  "
            )
        );
        // Array order, values and number kinds still count.
        assert_ne!(
            a,
            json(r#"{"item":"pen","qty":1,"tags":["b","a"],"x":{"b":null,"a":true}}"#)
        );
        assert_ne!(
            a,
            json(r#"{"item":"pen","qty":1.0,"tags":["a","b"],"x":{"b":null,"a":true}}"#)
        );
        assert_eq!(json("1.50"), json("1.5"));
        assert_eq!(json(""), "");
        // Bytes, the default, are bytes.
        assert_eq!(
            fingerprinted_body(BodyFingerprint::Bytes, b"{ }").unwrap(),
            &b"{ }"[..]
        );
    }

    #[test]
    fn integers_that_cannot_be_kept_exactly_compare_by_bytes() {
        // 2^64 and 2^64 + 1 read as one f64: never one request.
        let big = r#"{"amount":18446744073709551616}"#;
        assert_eq!(json(big), big);
        assert_ne!(json(big), json(r#"{"amount":18446744073709551617}"#));
        assert_ne!(json(big), json(r#"{ "amount": 18446744073709551616 }"#));
        assert_ne!(json(r#"{"a":-0}"#), json(r#"{"a":0}"#));
        // Within range, and in strings or exponents, as parsed.
        let max = r#"{"u":18446744073709551615,"i":-9223372036854775808}"#;
        assert_eq!(
            json(max),
            r#"{"i":-9223372036854775808,"u":18446744073709551615}"#
        );
        assert_eq!(json(r#"{ "b":"-0", "a":1e3 }"#), r#"{"a":1000.0,"b":"-0"}"#);
        assert_eq!(
            json(r#"{"b":"\"99999999999999999999","a":1}"#),
            r#"{"a":1,"b":"\"99999999999999999999"}"#
        );
    }

    #[test]
    fn numbers_beyond_the_range_of_f64_compare_by_bytes() {
        let huge = r#"{"a":1e400}"#;
        assert_eq!(json(huge), huge);
        assert_ne!(json(huge), json(r#"{"a":1e401}"#));
        assert_ne!(json(huge), json(r#"{ "a": 1e400 }"#));
    }

    #[test]
    fn a_body_that_is_not_json_cannot_be_json_fingerprinted() {
        for bad in ["{", "item=pen", "{\"a\":1} trailing", "\u{0}"] {
            assert!(
                fingerprinted_body(BodyFingerprint::Json, bad.as_bytes()).is_err(),
                "{bad:?}"
            );
        }
    }
}
