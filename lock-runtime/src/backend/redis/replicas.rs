//! `WAIT` for replica acknowledgements after a write (Sentinel, a single
//! server with replicas), and what too few do to a Sentinel client: its
//! master is suspect, and asked of the sentinels again.

use std::time::Duration;

use super::super::conn::Conn;
use super::super::scripts::millis;
use super::RedisBackend;
use crate::error::{BackendError, LockError};

/// Waits for `wanted` replicas to acknowledge the writes made through `conn`
/// (`WAIT` counts per connection), at most `timeout`. Too few on a Sentinel
/// master make the error [master-suspect](BackendError::is_master_suspect):
/// after a manual failover the old master answers as one, with no replica,
/// until the sentinels demote it, and a short `WAIT` is how that shows.
/// (A single server's shortfall stays a refusal: sending again would reach
/// the same server.)
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
        let short = BackendError::new(format!(
            "the lock was not replicated: {acked} of {wanted} required replicas acknowledged within {}",
            crate::error::shown(timeout)
        ));
        return Err(match conn {
            Conn::Sentinel(_) => short.of_suspect_master(),
            Conn::Single(_) | Conn::Cluster(_) => short,
        }
        .into());
    }
    Ok(())
}

/// A `WAIT`'s failure as each op of a batch gets it (a `LockError` is not
/// `Clone`): its message, and whether it makes the master suspect.
#[derive(Clone, Debug)]
pub(super) struct Unreplicated {
    message: String,
    master_suspect: bool,
}

impl From<LockError> for Unreplicated {
    fn from(e: LockError) -> Self {
        let master_suspect = matches!(&e, LockError::Backend(b) if b.is_master_suspect());
        Self {
            message: e.to_string(),
            master_suspect,
        }
    }
}

impl From<Unreplicated> for LockError {
    fn from(e: Unreplicated) -> Self {
        let error = BackendError::new(e.message);
        match e.master_suspect {
            true => error.of_suspect_master(),
            false => error,
        }
        .into()
    }
}

impl RedisBackend {
    /// Waits for `n` replicas to acknowledge the writes made through `conn`
    /// (`WAIT` counts per connection). `Ok(())` when they did (or none are
    /// asked for). Too few forget a Sentinel master ([`Self::suspect_master`]):
    /// for writes that have nothing to give back.
    pub(crate) async fn replicated(&self, conn: &mut Conn) -> Result<(), LockError> {
        let acked = self.replicated_or(conn, None).await;
        if let Err(e) = &acked {
            self.suspect_master(e);
        }
        acked
    }

    /// The replica acks of the writes made through `conn`, or the answer a
    /// batch's one `WAIT` already gave (`done`); the master is kept: a caller
    /// that gives back what the write took forgets it after that.
    pub(super) async fn replicated_or(
        &self,
        conn: &mut Conn,
        done: Option<Result<(), Unreplicated>>,
    ) -> Result<(), LockError> {
        match (done, self.replica_acks) {
            (Some(acked), _) => acked.map_err(LockError::from),
            (None, Some(acks)) => wait_for_replicas(conn, acks).await,
            (None, None) => Ok(()),
        }
    }

    /// The replica acks of the writes made through `conn` (`Ok` at once
    /// when none are asked for), the master kept: for a caller that gives
    /// back what the write took, then forgets it ([`Self::suspect_master`]).
    #[cfg(feature = "idempotency")]
    pub(crate) async fn acknowledged(&self, conn: &mut Conn) -> Result<(), LockError> {
        self.replicated_or(conn, None).await
    }

    /// After a write failed with `e`: a Sentinel master that acknowledged it
    /// with too few replicas is forgotten, so the next request asks the
    /// sentinels again (see `BackendError::is_master_suspect`). Called once
    /// what the write took is given back, so that goes to the master that
    /// took it.
    pub(crate) fn suspect_master(&self, e: &LockError) {
        if let LockError::Backend(b) = e
            && b.is_master_suspect()
        {
            self.conn.forget_master();
        }
    }
}
