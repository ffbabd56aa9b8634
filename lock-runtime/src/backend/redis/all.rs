//! `acquire_all.lua`: several locks in one script, for `lock_all`.

use std::time::Duration;

use super::RedisBackend;
use crate::backend::scripts::{ACQUIRE_ALL, evalsha, millis, run_script};
use crate::backend::{AllOutcome, HANDOFF_LEASE, LockRef};
use crate::error::{BackendError, LockError};
use crate::key::KeyNames;
use crate::token::Token;

impl RedisBackend {
    /// Takes every lock of `names` for `token` in one script, all or none,
    /// trying once. On a cluster `names` share one hash slot: the script
    /// runs on that slot's node (routed by the first key). With replica
    /// acks, the locks count as taken only once the replicas have them;
    /// otherwise they are given back before the error is returned.
    pub(crate) async fn acquire_all(
        &self,
        names: &[&KeyNames],
        token: &Token,
        ttl: Duration,
    ) -> Result<AllOutcome, LockError> {
        let Some(first) = names.first() else {
            return Ok(AllOutcome::Acquired(Vec::new()));
        };
        // Per lock four names and a channel, of about the lock's length.
        let mut cmd = evalsha(
            &ACQUIRE_ALL,
            4 * names.len(),
            5 * names.len() + 4,
            names.len() * 5 * first.lock.len() + 64,
        );
        for n in names {
            cmd.arg(&n.lock)
                .arg(n.fence())
                .arg(n.queue())
                .arg(n.deadlines());
        }
        cmd.arg(token)
            .arg(millis(ttl))
            .arg(millis(HANDOFF_LEASE))
            .arg(self.publish);
        for n in names {
            cmd.arg(n.notice());
        }
        let mut conn = self.connection();
        let answer: Vec<i64> = run_script(&mut conn, &ACQUIRE_ALL, &cmd)
            .await
            .map_err(|e| BackendError::with_source("acquiring several locks failed", e))?;
        let fences = match answer[..] {
            [0, index, remaining] => {
                return Ok(AllOutcome::Busy {
                    index: usize::try_from(index - 1).unwrap_or_default(),
                    remaining: Duration::from_millis(remaining.unsigned_abs()),
                });
            }
            [1, ref fences @ ..] if fences.len() == names.len() => {
                fences.iter().map(|f| f.unsigned_abs()).collect()
            }
            _ => return Err(BackendError::new("acquire_all: unexpected answer").into()),
        };
        if self.replica_acks.is_some()
            && let Err(e) = self.replicated_or(&mut conn, None).await
        {
            // Not durable enough: give them back before saying no.
            for n in names {
                let _ = self
                    .release(LockRef::new(n, token, ttl), false, false)
                    .await;
            }
            self.suspect_master(&e);
            return Err(e);
        }
        Ok(AllOutcome::Acquired(fences))
    }
}
