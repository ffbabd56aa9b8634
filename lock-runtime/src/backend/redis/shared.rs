//! Read-write locks and semaphores on one server or a cluster: the
//! `shared.lua` script (see it for the layout of the names it keeps).

use std::time::Duration;

use super::RedisBackend;
use crate::backend::scripts::{SHARED, evalsha, millis, run_script};
use crate::backend::{AcquireOutcome, HANDOFF_LEASE, LockRef, Released};
use crate::error::{BackendError, LockError};
use crate::key::{Access, KeyNames};
use crate::token::Token;

/// The script's mode and limit for an access: shared (`s`) with at most
/// `limit` holders (0: no limit), or exclusive (`x`).
fn mode(access: Access) -> (&'static str, u32) {
    match access {
        Access::Exclusive => ("x", 0),
        Access::Shared(limit) => ("s", limit),
    }
}

impl RedisBackend {
    /// `shared.lua` with the arguments every operation takes.
    fn shared_cmd(&self, op: &str, names: &KeyNames, token: &Token, ttl: Duration) -> redis::Cmd {
        let (mode, limit) = mode(names.access);
        let mut cmd = evalsha(&SHARED, 6, 15, 7 * names.lock.len() + 96);
        cmd.arg(&names.lock)
            .arg(&names.holders)
            .arg(names.queue())
            .arg(names.fence())
            .arg(&names.fences)
            .arg(names.deadlines())
            .arg(op)
            .arg(token)
            .arg(millis(ttl))
            .arg(mode)
            .arg(limit)
            .arg(names.notice())
            .arg(millis(HANDOFF_LEASE))
            .arg(self.publish);
        cmd
    }

    /// Wakes the waiters of this process that a script handed over to
    /// (`sha1hex(token), fencing` pairs), before their notices arrive.
    fn wake_granted(&self, names: &KeyNames, grants: &[redis::Value]) {
        for pair in grants.chunks_exact(2) {
            if let [redis::Value::BulkString(next), redis::Value::Int(fencing)] = pair
                && let (Ok(next), Ok(fencing)) =
                    (std::str::from_utf8(next), u64::try_from(*fencing))
            {
                self.waiters.grant(names.notice(), next, fencing);
            }
        }
    }

    /// One attempt at a reader's, writer's or permit's lease.
    pub(super) async fn acquire_shared(
        &self,
        lock: LockRef<'_>,
        wait: Duration,
    ) -> Result<AcquireOutcome, LockError> {
        let LockRef { names, token, ttl } = lock;
        let mut cmd = self.shared_cmd("acquire", names, token, ttl);
        cmd.arg(if wait.is_zero() { 0 } else { millis(wait) });
        let mut conn = self.connection();
        let answer: redis::Value = run_script(&mut conn, &SHARED, &cmd)
            .await
            .map_err(|e| BackendError::with_source("acquire failed", e))?;
        // {1, fencing (0: none minted yet)} when held, {-remaining,
        // counter} when busy, the grants it made following; 1 alone: held,
        // no token, no grants.
        let (first, fence) = match &answer {
            redis::Value::Int(1) => (1, 0),
            redis::Value::Array(answer) => match answer.get(..2) {
                Some([redis::Value::Int(first), redis::Value::Int(fence)]) => {
                    self.wake_granted(names, &answer[2..]);
                    (*first, *fence)
                }
                _ => return Err(unexpected(&answer)),
            },
            other => return Err(unexpected(other)),
        };
        if first <= 0 {
            return Ok(AcquireOutcome::Busy {
                remaining: Duration::from_millis(first.unsigned_abs()),
                fence: fence.unsigned_abs(),
            });
        }
        if self.replica_acks.is_some()
            && let Err(e) = self.replicated_or(&mut conn, None).await
        {
            let _ = self.release_shared(lock, !wait.is_zero()).await;
            self.suspect_master(&e);
            return Err(e);
        }
        Ok(AcquireOutcome::Acquired {
            fencing: fence.unsigned_abs(),
        })
    }

    /// The `mint` call of a reader's, writer's or permit's lease: its
    /// fencing token on first use (a newcomer that found the lock free took
    /// it without one), or 0 when the lease is not ours (absent, or ended).
    pub(super) fn mint_shared_cmd(&self, names: &KeyNames, token: &Token) -> redis::Cmd {
        // The lease argument is not read by `mint`.
        let mut cmd = self.shared_cmd("mint", names, token, Duration::ZERO);
        cmd.arg(0);
        cmd
    }

    /// The `extend` call of a reader's, writer's or permit's lease.
    pub(super) fn extend_shared_cmd(
        &self,
        names: &KeyNames,
        token: &Token,
        ttl: Duration,
    ) -> redis::Cmd {
        let mut cmd = self.shared_cmd("extend", names, token, ttl);
        cmd.arg(0);
        cmd
    }

    pub(super) async fn release_shared(
        &self,
        lock: LockRef<'_>,
        dequeue: bool,
    ) -> Result<Released, LockError> {
        let LockRef { names, token, ttl } = lock;
        let mut cmd = self.shared_cmd("release", names, token, ttl);
        cmd.arg(if dequeue { "1" } else { "0" });
        let (answer, resent) = self.send_release(&SHARED, &cmd, false, None).await?;
        // 1 or 0 alone, or {1 or 0, grants...}.
        let released = match answer {
            redis::Value::Array(items) => {
                self.wake_granted(names, items.get(1..).unwrap_or_default());
                items.first() == Some(&redis::Value::Int(1))
            }
            answer => answer == redis::Value::Int(1),
        };
        match released {
            true => Ok(Released::Yes),
            false if resent => Ok(Released::Gone),
            false => Ok(Released::NotOurs),
        }
    }
}

/// The error of an acquire answered with `answer`, which no script sends.
fn unexpected(answer: &impl std::fmt::Debug) -> LockError {
    BackendError::new(format!("acquire: unexpected answer {answer:?}")).into()
}
