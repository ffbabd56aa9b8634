//! `WAIT` for replica acknowledgements after a write (Sentinel, a single
//! server with replicas).

use std::time::Duration;

use super::super::conn::Conn;
use super::super::scripts::millis;
use crate::error::{BackendError, LockError};

/// Waits for `wanted` replicas to acknowledge the writes made through `conn`
/// (`WAIT` counts per connection), at most `timeout`.
pub(super) async fn wait_for_replicas(
    conn: &mut Conn,
    (wanted, timeout): (u32, Duration),
) -> Result<(), LockError> {
    let acked: i64 = redis::cmd("WAIT")
        .arg(wanted)
        .arg(millis(timeout))
        .query_async(conn)
        .await
        .map_err(|e| BackendError::with_source("WAIT for replica acknowledgements failed", e))?;
    if acked < i64::from(wanted) {
        return Err(BackendError::new(format!(
            "the lock was not replicated: {acked} of {wanted} required replicas acknowledged within {}",
            crate::error::shown(timeout)
        ))
        .into());
    }
    Ok(())
}
