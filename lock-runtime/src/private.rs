//! Support for `#[distributed_lock]`. Not a stable API: only the attribute's
//! expansion may use it.

use std::future::Future;
use std::time::Duration;

use crate::{LockClient, LockError};

/// Options written in the attribute.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// `ttl = "..."`, in milliseconds; `None`: the client's default.
    pub ttl_ms: Option<u64>,
    /// `wait = "..."`, in milliseconds; 0: try once.
    pub wait_ms: u64,
    /// `renew = ...`.
    pub renew: bool,
}

/// Runs `body` under the lock `key`, like [`crate::LockRequest::run`], mapping
/// lock failures into the function's error type.
pub async fn run<T, E, F>(
    client: Option<LockClient>,
    key: String,
    options: Options,
    body: F,
) -> Result<T, E>
where
    F: Future<Output = Result<T, E>>,
    E: From<LockError>,
{
    let client = match client.or_else(crate::global_client) {
        Some(client) => client,
        None => return Err(E::from(LockError::NoClient)),
    };
    let mut request = client
        .lock(key)
        .wait(Duration::from_millis(options.wait_ms))
        .renew(options.renew);
    if let Some(ttl) = options.ttl_ms {
        request = request.ttl(Duration::from_millis(ttl));
    }
    match request.run(body).await {
        Ok(result) => result,
        Err(e) => Err(E::from(e)),
    }
}
