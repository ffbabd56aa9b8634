//! Reading a request body, and buffering a response body up to the storage limit.

use std::pin::Pin;

use axum::BoxError;
use axum::body::Body;
use bytes::{Bytes, BytesMut};
use http::request::Parts;
use http::{HeaderMap, Response, StatusCode, header};
use http_body_util::{BodyExt, LengthLimitError, Limited};

use crate::layer::problem::problem;

/// Reads the request body, up to `limit` bytes.
pub(super) async fn read_body<B>(
    parts: &Parts,
    body: B,
    limit: usize,
) -> Result<Bytes, Response<Body>>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let too_large = || {
        problem(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("the request body is larger than {limit} bytes"),
        )
    };
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(too_large());
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(too_large()),
        Err(e) => {
            tracing::debug!(error = %e, "idempotency: cannot read the request body");
            Err(problem(
                StatusCode::BAD_REQUEST,
                "the request body could not be read",
            ))
        }
    }
}

/// A response body as read for storage.
pub(super) enum Buffered<B> {
    /// All of it.
    Complete {
        data: Bytes,
        trailers: Option<HeaderMap>,
    },
    /// More than the limit: what was read, and the rest.
    Partial { data: Bytes, rest: Pin<Box<B>> },
}

pub(super) async fn buffer<B>(body: B, limit: usize) -> Result<Buffered<B>, BoxError>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let mut body = Box::pin(body);
    let mut data = BytesMut::new();
    loop {
        let Some(frame) = body.frame().await else {
            return Ok(Buffered::Complete {
                data: data.freeze(),
                trailers: None,
            });
        };
        match frame.map_err(Into::into)?.into_data() {
            Ok(chunk) => {
                data.extend_from_slice(&chunk);
                if data.len() > limit {
                    return Ok(Buffered::Partial {
                        data: data.freeze(),
                        rest: body,
                    });
                }
            }
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    return Ok(Buffered::Complete {
                        data: data.freeze(),
                        trailers: Some(trailers),
                    });
                }
            }
        }
    }
}
