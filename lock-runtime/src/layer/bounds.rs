//! The bounds the layers' helpers put on the service they wrap and on the
//! bodies they pass on, named once. The public `Service` impls spell them
//! out, so that their documentation shows them.

use axum::BoxError;
use bytes::Bytes;
use http::Response;
use tower_service::Service;

/// A body a layer reads or passes on: bytes, an error that boxes, movable
/// into a task.
pub(super) trait HttpBody:
    http_body::Body<Data = Bytes, Error: Into<BoxError>> + Send + 'static
{
}

impl<T> HttpBody for T where T: http_body::Body<Data = Bytes, Error: Into<BoxError>> + Send + 'static
{}

/// The service a layer wraps: it answers a `Req` with a response whose body
/// is `ResB`, and it, its future and its error move into a task.
pub(super) trait Wrapped<Req, ResB>:
    Service<Req, Response = Response<ResB>, Future: Send + 'static, Error: Send + 'static>
    + Send
    + 'static
{
}

impl<S, Req, ResB> Wrapped<Req, ResB> for S where
    S: Service<Req, Response = Response<ResB>, Future: Send + 'static, Error: Send + 'static>
        + Send
        + 'static
{
}
