//! Responses to and from records: header encoding, replays, and the body that
//! sends what was buffered while storing it.

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::BoxError;
use axum::body::Body;
use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode, header};
use http_body::{Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::backend::records::StoredResponse;
use crate::layer::problem::PROBLEM_JSON;

/// `Idempotent-Replayed`, set to `true` on a replayed response.
pub(crate) static IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// Encodes the headers of `headers` named in `keep`, one `name:value\n` per
/// value (names hold no `:`, values no `\n`), in the response's order.
///
/// A response has a few headers and `keep` about ten names, most of them
/// standard (compared as such, without hashing): walking the response's
/// headers costs less than looking each kept name up in them.
pub(crate) fn encode_headers(headers: &HeaderMap, keep: &[HeaderName]) -> Bytes {
    let kept = || headers.iter().filter(|(name, _)| keep.contains(name));
    // Sized first: growing from empty reallocated and copied it up to
    // three times a response.
    let len = kept()
        .map(|(name, value)| name.as_str().len() + value.len() + 2)
        .sum();
    let mut out = BytesMut::with_capacity(len);
    for (name, value) in kept() {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b":");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\n");
    }
    out.freeze()
}

/// The inverse of [`encode_headers`]; malformed lines are skipped.
pub(crate) fn decode_headers(encoded: &[u8]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for line in encoded.split(|&b| b == b'\n') {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(&line[..colon]),
            HeaderValue::from_bytes(&line[colon + 1..]),
        ) else {
            continue;
        };
        headers.append(name, value);
    }
    headers
}

/// The stored response, as sent to a duplicate request: byte for byte, or,
/// when its body was too large to store, [`not_replayable`].
pub(crate) fn replay(stored: StoredResponse) -> Response<Body> {
    if stored.body_too_large {
        return not_replayable(&stored);
    }
    let mut response = Response::new(Body::from(stored.body));
    *response.status_mut() = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::OK);
    *response.headers_mut() = decode_headers(&stored.headers);
    response
        .headers_mut()
        .insert(&IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    response
}

/// The answer for a completed request whose response body was over the
/// storage limit: `410 Gone` (the response is permanently unavailable, so
/// neither a retry nor the client's back-off helps, and a `4xx` stops
/// automatic retries; `409` would mean "still running, retry" and `422`
/// "another payload", both wrong here), a problem body with the original
/// status (and `Location`, if it had one, to find what was made), and
/// `Idempotent-Replayed: true`: it answers for the original, which is not run
/// again.
fn not_replayable(stored: &StoredResponse) -> Response<Body> {
    let status = StatusCode::GONE;
    let headers = decode_headers(&stored.headers);
    let mut problem = serde_json::json!({
        "type": "about:blank",
        "title": status.canonical_reason().unwrap_or("Gone"),
        "status": status.as_u16(),
        "detail": format!(
            "the request with this Idempotency-Key was completed (status {}) and will not run \
             again, but its response was larger than the storage limit and cannot be replayed",
            stored.status
        ),
        "original_status": stored.status,
    });
    if let Some(location) = headers.get(header::LOCATION).and_then(|v| v.to_str().ok()) {
        problem["location"] = location.into();
    }
    let mut response = Response::new(Body::from(problem.to_string()));
    *response.status_mut() = status;
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    h.insert(&IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    response
}

pin_project! {
    /// What was read of a response body while storing it (`data`, and
    /// `trailers` if it ended with some), then the unread rest (`rest`, when
    /// the body was larger than the storage limit).
    pub(crate) struct Rebuilt<B> {
        data: Option<Bytes>,
        trailers: Option<HeaderMap>,
        #[pin]
        rest: Option<B>,
    }
}

impl<B> Rebuilt<B> {
    pub(crate) fn new(data: Bytes, trailers: Option<HeaderMap>, rest: Option<B>) -> Self {
        Self {
            data: (!data.is_empty()).then_some(data),
            trailers,
            rest,
        }
    }
}

impl<B> http_body::Body for Rebuilt<B>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        if let Some(data) = this.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if let Some(trailers) = this.trailers.take() {
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        }
        match this.rest.as_pin_mut() {
            Some(rest) => rest
                .poll_frame(cx)
                .map(|f| f.map(|r| r.map_err(Into::into))),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none()
            && self.trailers.is_none()
            && self.rest.as_ref().is_none_or(|r| r.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        let buffered = self.data.as_ref().map_or(0, |d| d.len() as u64);
        match &self.rest {
            // Not exact with trailers to send: an HTTP/1.1 server would
            // answer with `Content-Length`, which cannot carry them.
            None if self.trailers.is_none() => SizeHint::with_exact(buffered),
            None => {
                let mut hint = SizeHint::new();
                hint.set_lower(buffered);
                hint
            }
            Some(rest) => {
                let hint = rest.size_hint();
                let mut sum = SizeHint::new();
                sum.set_lower(hint.lower() + buffered);
                if let Some(upper) = hint.upper() {
                    sum.set_upper(upper + buffered);
                }
                sum
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header;
    use http_body::Body as _;
    use http_body_util::BodyExt;

    #[test]
    fn kept_headers_survive_a_round_trip() {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, "application/json".parse().unwrap());
        h.append(header::LINK, "<a>; rel=x".parse().unwrap());
        h.append(header::LINK, "<b>: rel=y".parse().unwrap());
        h.insert(header::SET_COOKIE, "secret=1".parse().unwrap());
        let custom = HeaderName::from_static("x-order-cost");
        h.insert(&custom, "1250".parse().unwrap());
        let encoded = encode_headers(&h, &[header::CONTENT_TYPE, header::LINK, custom.clone()]);
        let back = decode_headers(&encoded);
        assert_eq!(back.len(), 4);
        assert_eq!(back[&custom], "1250");
        assert_eq!(back[header::CONTENT_TYPE], "application/json");
        let links: Vec<_> = back.get_all(header::LINK).iter().collect();
        assert_eq!(links, ["<a>; rel=x", "<b>: rel=y"]);
        assert!(back.get(header::SET_COOKIE).is_none());
    }

    #[tokio::test]
    async fn a_response_too_large_to_store_is_answered_with_410_not_an_empty_replay() {
        let mut h = HeaderMap::new();
        h.insert(header::LOCATION, "/reports/\"1\"".parse().unwrap());
        h.insert(header::CONTENT_TYPE, "text/csv".parse().unwrap());
        let stored = StoredResponse {
            status: 201,
            headers: encode_headers(&h, &[header::LOCATION, header::CONTENT_TYPE]),
            body: Bytes::new(),
            body_too_large: true,
        };
        let r = replay(stored);
        assert_eq!(r.status(), StatusCode::GONE);
        assert_eq!(r.headers()[header::CONTENT_TYPE], PROBLEM_JSON);
        assert_eq!(r.headers()[&IDEMPOTENT_REPLAYED], "true");
        assert!(r.headers().get(header::LOCATION).is_none());
        let body = r.into_body().collect().await.unwrap().to_bytes();
        let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(problem["status"], 410);
        assert_eq!(problem["original_status"], 201);
        assert_eq!(problem["location"], "/reports/\"1\"");
    }

    #[tokio::test]
    async fn a_rebuilt_body_sends_the_buffer_then_the_rest() {
        let rest = http_body_util::Full::new(Bytes::from_static(b" world"));
        let body = Rebuilt::new(Bytes::from_static(b"hello"), None, Some(rest));
        assert_eq!(body.size_hint().exact(), Some(11));
        let all = body.collect().await.unwrap().to_bytes();
        assert_eq!(&all[..], b"hello world");
    }
}
