//! `application/problem+json` responses (RFC 9457) and `Retry-After`.

use std::fmt::Write as _;
use std::time::Duration;

use axum::body::Body;
use http::{HeaderValue, Response, StatusCode, header};

/// The media type of problem details.
pub(crate) const PROBLEM_JSON: &str = "application/problem+json";

/// Marks a response the layers made instead of the handler's (a refusal: the
/// lock was not taken, the key was bad, ...). `IdempotencyLayer` never stores
/// such a response: the request did not run, so its key must stay usable.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Refusal;

/// A problem-details response: `type` is `about:blank`, so `title` is the
/// status's reason phrase; `detail` says what happened to this request.
/// Marked as a [`Refusal`].
pub(crate) fn problem(status: StatusCode, detail: &str) -> Response<Body> {
    let mut json = String::with_capacity(96 + detail.len());
    json.push_str(r#"{"type":"about:blank","title":"#);
    push_json_string(&mut json, status.canonical_reason().unwrap_or("Error"));
    let _ = write!(json, r#","status":{},"detail":"#, status.as_u16());
    push_json_string(&mut json, detail);
    json.push('}');
    let mut response = Response::new(Body::from(json));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    response.extensions_mut().insert(Refusal);
    response
}

/// [`problem`] with a `Retry-After` of `after`, in whole seconds rounded up
/// (at least 1).
pub(crate) fn problem_retry(status: StatusCode, detail: &str, after: Duration) -> Response<Body> {
    let mut response = problem(status, detail);
    response.headers_mut().insert(
        header::RETRY_AFTER,
        HeaderValue::from(retry_after_secs(after)),
    );
    response
}

/// `after` in whole seconds, rounded up, at least 1 (`Retry-After: 0` would
/// invite an immediate retry that fails the same way).
pub(crate) fn retry_after_secs(after: Duration) -> u64 {
    u64::try_from(after.as_millis().div_ceil(1000))
        .unwrap_or(u64::MAX)
        .max(1)
}

/// Appends `s` as a JSON string literal.
fn push_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1000)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
        assert_eq!(
            retry_after_secs(Duration::from_secs(29) + Duration::from_millis(400)),
            30
        );
    }

    #[test]
    fn details_are_escaped_json() {
        let mut s = String::new();
        push_json_string(&mut s, "a \"key\" \\ with\nnewline \u{1}");
        assert_eq!(s, r#""a \"key\" \\ with\nnewline \u0001""#);
    }

    #[test]
    fn problems_carry_the_media_type_and_retry_after() {
        let r = problem_retry(StatusCode::CONFLICT, "busy", Duration::from_millis(2500));
        assert_eq!(r.status(), StatusCode::CONFLICT);
        assert_eq!(r.headers()[header::CONTENT_TYPE], PROBLEM_JSON);
        assert_eq!(r.headers()[header::RETRY_AFTER], "3");
    }
}
