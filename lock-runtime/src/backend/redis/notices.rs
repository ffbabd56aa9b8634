//! A server's notices: registering waiters and observers, subscribing,
//! publishing a free notice, and restarting the notices' task.

use super::RedisBackend;
use crate::backend::scripts::{PROBE, evalsha, run_script};
use crate::backend::waiters::WaitHandle;
use crate::error::LockError;
use crate::token::Token;

impl RedisBackend {
    /// Registers a waiter for notices on `channel` (a lock's or a record's).
    /// Returns once the server confirmed the subscription, or once
    /// subscribing failed: then the waiter still wakes at the holder's lease
    /// end (notices are best effort).
    pub(crate) async fn register(&self, channel: &str, token: &Token) -> WaitHandle {
        let (handle, _) = WaitHandle::new(&self.waiters, channel, &token.digest());
        self.subscribe(channel).await;
        handle
    }

    /// Registers an observer `id` of `channel` (see `leaders`), as
    /// [`Self::register`] registers a waiter.
    pub(crate) async fn register_id(&self, channel: &str, id: &str) -> WaitHandle {
        let (handle, _) = WaitHandle::new(&self.waiters, channel, id);
        self.subscribe(channel).await;
        handle
    }

    /// Restarts the notices' task if it ended with the runtime it ran on
    /// (see `Notices::restart_if_ended`), and reconnects the connection,
    /// whose task ended with it too: the first command on it fails and
    /// makes it reconnect on the runtime in use; the server probe (an
    /// `EVALSHA`, which a least-privilege user may send, where a `PING`
    /// would be refused and logged in `ACL LOG`) does that here rather than
    /// a lock's acquire or renewal.
    pub(crate) async fn restart_if_ended(&self) -> Result<(), LockError> {
        self.notices.restart_if_ended(&self.waiters)?;
        let mut conn = self.conn.clone();
        let probe = evalsha(&PROBE, 0, 0, 0);
        for _ in 0..2 {
            if run_script::<u8>(&mut conn, &PROBE, &probe).await.is_ok() {
                break;
            }
        }
        Ok(())
    }

    /// Makes sure notices on `channel` reach this process (see [`Self::register`]).
    pub(crate) async fn subscribe(&self, channel: &str) {
        self.notices.subscribe(&self.waiters, channel).await;
    }

    /// Publishes a free notice (`''`) on `channel`, best effort: waiters
    /// that miss it wake at their lease timers.
    pub(crate) async fn announce(&self, channel: &str) {
        let mut cmd = redis::cmd(self.publish);
        cmd.arg(channel).arg("");
        let mut conn = self.conn.clone();
        if let Err(e) = cmd.query_async::<()>(&mut conn).await {
            tracing::debug!(
                channel,
                error = &e as &dyn std::error::Error,
                "a free notice was not published"
            );
        }
    }
}
