//! One Redis (or Valkey) server: scripts on two multiplexed, self-reconnecting
//! connections, and one shared pub/sub connection for release notices.

use std::sync::Arc;
use std::time::Duration;

use super::conn::Conn;
pub(crate) use super::conn::RedisOptions;
use super::notifier::Notices;
use super::scripts::{
    ACQUIRE, EXTEND, EXTEND_MANY, RELEASE, RESERVE, SHARED, evalsha, millis, run_script,
};
use super::waiters::Registry;
use super::{AcquireOutcome, HANDOFF_LEASE, Released};
use crate::LockError;
use crate::backoff::Retry;
use crate::error::{BackendError, ConnectionFailure, connection_failure};
use crate::key::{KeyNames, Shape};
use crate::token::Token;

/// Command connections to one server (`.redis(..)`). Two multiplexed
/// connections keep the server and the client busy at once: while the server
/// runs one connection's batch of scripts, the client reads the other's
/// replies and writes its next batch. A Redlock node keeps one: Redlock is
/// bound by its slowest majority, not by one server's throughput, and each
/// extra connection is one more to re-establish after a node restarts.
const CONNECTIONS: usize = 2;

mod all;
mod connect;
mod notices;
mod shared;

pub(crate) struct RedisBackend {
    /// One or [`CONNECTIONS`] handles; a key always uses the same one, so
    /// one key's commands stay in order and `WAIT` follows its writes.
    conns: Vec<Conn>,
    waiters: Arc<Registry>,
    notices: Notices,
    /// `PUBLISH`, or `SPUBLISH` on a cluster.
    publish: &'static str,
    /// Announce a release that hands over to nobody (Redlock, whose waiters
    /// do not queue); otherwise only hand-overs are published.
    announce_free: bool,
    replica_acks: Option<(u32, Duration)>,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend").finish_non_exhaustive()
    }
}

impl RedisBackend {
    /// The connection for `names`' commands.
    pub(super) fn conn(&self, names: &KeyNames) -> Conn {
        let i = match self.conns.len() {
            1 => 0,
            n => usize::from(names.slot) % n,
        };
        self.conns[i].clone()
    }

    /// Waits for `n` replicas to acknowledge the writes made through `conn`
    /// (`WAIT` counts per connection). `Ok(())` when they did (or none are
    /// asked for).
    async fn replicated(&self, conn: &mut Conn) -> Result<(), LockError> {
        let Some((wanted, timeout)) = self.replica_acks else {
            return Ok(());
        };
        let acked: i64 = redis::cmd("WAIT")
            .arg(wanted)
            .arg(millis(timeout))
            .query_async(conn)
            .await
            .map_err(|e| {
                BackendError::with_source("WAIT for replica acknowledgements failed", e)
            })?;
        if acked < i64::from(wanted) {
            return Err(BackendError::new(format!(
                "the lock was not replicated: {acked} of {wanted} required replicas acknowledged within {}",
                humantime::format_duration(timeout)
            ))
            .into());
        }
        Ok(())
    }

    /// `true` when hand-overs must be confirmed before use (replica acks).
    pub(crate) fn needs_confirmation(&self) -> bool {
        self.replica_acks.is_some()
    }

    /// One attempt (acquire.lua): `wait` zero tries once, else the caller
    /// queues (once) for that long.
    pub(crate) async fn acquire(
        &self,
        names: &KeyNames,
        token: &Token,
        ttl: Duration,
        wait: Duration,
    ) -> Result<AcquireOutcome, LockError> {
        if names.shape != Shape::Mutex {
            return self.acquire_shared(names, token, ttl, wait).await;
        }
        let wait_ms = if wait.is_zero() { 0 } else { millis(wait) };
        // > 0: ours, with this fencing token; <= 0: busy for -answer ms.
        // Five names of about the lock's length, a token, four numbers.
        let leader = names.is_leader();
        let mut cmd = evalsha(
            &ACQUIRE,
            if leader { 6 } else { 4 },
            13,
            7 * names.lock.len() + 80 + names.label.len(),
        );
        cmd.arg(&names.lock)
            .arg(names.fence())
            .arg(&names.queue)
            .arg(names.deadlines());
        if leader {
            cmd.arg(&names.record).arg(&names.labels);
        }
        cmd.arg(token.as_str())
            .arg(millis(ttl))
            .arg(wait_ms)
            .arg(&names.notice)
            .arg(millis(HANDOFF_LEASE))
            .arg(self.publish);
        if leader {
            cmd.arg(&names.label);
        }
        let mut conn = self.conn(names);
        let answer: redis::Value = run_script(&mut conn, &ACQUIRE, &cmd)
            .await
            .map_err(|e| BackendError::with_source("acquire failed", e))?;
        let answer = match answer {
            redis::Value::Int(n) if n > 0 => n,
            redis::Value::Int(n) => {
                return Ok(AcquireOutcome::Busy {
                    remaining: Duration::from_millis(n.unsigned_abs()),
                    fence: 0,
                });
            }
            redis::Value::Array(busy) => match busy[..] {
                [redis::Value::Int(n), redis::Value::Int(fence)] => {
                    return Ok(AcquireOutcome::Busy {
                        remaining: Duration::from_millis(n.unsigned_abs()),
                        fence: fence.unsigned_abs(),
                    });
                }
                _ => return Err(BackendError::new("acquire: unexpected busy answer").into()),
            },
            _ => return Err(BackendError::new("acquire: unexpected answer").into()),
        };
        if self.replica_acks.is_some()
            && let Err(e) = self.replicated(&mut conn).await
        {
            // Not durable enough: give it back before saying no.
            let _ = self.release(names, token, ttl, !wait.is_zero()).await;
            return Err(e);
        }
        Ok(AcquireOutcome::Acquired {
            fencing: answer.unsigned_abs(),
        })
    }

    pub(crate) async fn extend(
        &self,
        names: &KeyNames,
        token: &Token,
        ttl: Duration,
    ) -> Result<bool, LockError> {
        let (script, cmd) = if names.shape == Shape::Mutex {
            let leader = names.is_leader();
            let mut cmd = evalsha(
                &EXTEND,
                1 + usize::from(leader),
                4,
                2 * names.lock.len() + 48,
            );
            cmd.arg(&names.lock);
            if leader {
                cmd.arg(&names.record);
            }
            cmd.arg(token.as_str()).arg(millis(ttl));
            (&*EXTEND, cmd)
        } else {
            (&*SHARED, self.extend_shared_cmd(names, token, ttl))
        };
        let mut conn = self.conn(names);
        let extended: i64 = run_script(&mut conn, script, &cmd)
            .await
            .map_err(|e| BackendError::with_source("extend failed", e))?;
        if extended == 1 {
            self.replicated(&mut conn).await?;
        }
        Ok(extended == 1)
    }

    /// Keeps the lock `token` holds, unless somebody queued behind it, and
    /// reserves `count` fencing tokens: the highest, or `None` (see
    /// reserve.lua). With replica acks, only once they came.
    pub(crate) async fn reserve(
        &self,
        names: &KeyNames,
        token: &Token,
        ttl: Duration,
        count: u64,
    ) -> Result<Option<u64>, LockError> {
        let mut cmd = evalsha(&RESERVE, 3, 6, 3 * names.lock.len() + 64);
        cmd.arg(&names.lock)
            .arg(names.fence())
            .arg(&names.queue)
            .arg(token.as_str())
            .arg(millis(ttl))
            .arg(count);
        let mut conn = self.conn(names);
        let top: u64 = run_script(&mut conn, &RESERVE, &cmd)
            .await
            .map_err(|e| BackendError::with_source("reserving fencing tokens failed", e))?;
        if top == 0 {
            return Ok(None);
        }
        self.replicated(&mut conn).await?;
        Ok(Some(top))
    }

    pub(crate) async fn release(
        &self,
        names: &KeyNames,
        token: &Token,
        ttl: Duration,
        dequeue: bool,
    ) -> Result<Released, LockError> {
        if names.shape != Shape::Mutex {
            return self.release_shared(names, token, ttl, dequeue).await;
        }
        let member = if dequeue {
            format!("{}:{}", token.as_str(), millis(ttl))
        } else {
            String::new()
        };
        // Four names of about the lock's length, a token, a queue entry, flags.
        let leader = names.is_leader();
        let mut cmd = evalsha(
            &RELEASE,
            if leader { 6 } else { 4 },
            12,
            7 * names.lock.len() + 96,
        );
        cmd.arg(&names.lock)
            .arg(names.fence())
            .arg(&names.queue)
            .arg(names.deadlines());
        if leader {
            cmd.arg(&names.record).arg(&names.labels);
        }
        cmd.arg(token.as_str())
            .arg(&names.notice)
            .arg(millis(HANDOFF_LEASE))
            .arg(member)
            .arg(self.publish)
            .arg(if self.announce_free { "1" } else { "0" });
        let (answer, resent) = self.send_release(names, &RELEASE, &cmd).await?;
        match answer {
            redis::Value::Int(1) => Ok(Released::Yes),
            redis::Value::Array(items) if !items.is_empty() => {
                // Handed over: if the new owner waits in this process, wake it
                // now instead of after the notice's trip through pub/sub.
                if let [
                    _,
                    redis::Value::BulkString(next),
                    redis::Value::Int(fencing),
                ] = &items[..]
                    && let (Ok(next), Ok(fencing)) =
                        (std::str::from_utf8(next), u64::try_from(*fencing))
                {
                    self.waiters.grant(&names.notice, next, fencing);
                }
                Ok(Released::Yes)
            }
            _ if resent => Ok(Released::Gone),
            _ => Ok(Released::NotOurs),
        }
    }

    /// Sends a release script (`script`, as `cmd`) on `names`' connection,
    /// re-sending it once after a broken connection and while its slot is
    /// being migrated. `resent`: a copy may have run before this answer (so
    /// a "not ours" may be its doing).
    pub(super) async fn send_release(
        &self,
        names: &KeyNames,
        script: &redis::Script,
        cmd: &redis::Cmd,
    ) -> Result<(redis::Value, bool), LockError> {
        let mut conn = self.conn(names);
        // The cluster driver re-sends a request whose connection broke by
        // itself, so there a "not ours" may always follow a lost copy.
        let mut resent = matches!(conn, Conn::Cluster(_));
        let mut answer = run_script(&mut conn, script, cmd).await;
        if let Err(e) = &answer
            && connection_failure(e) == Some(ConnectionFailure::Broken)
        {
            // The connection broke: before the script was sent (a killed
            // connection fails its next command), or after it ran and before
            // its answer came back. The driver reconnects; one more try keeps
            // the key from waiting out its lease, and its "not ours" may be
            // the first copy's doing.
            resent = true;
            answer = run_script(&mut conn, script, cmd).await;
        }
        // A slot in mid-migration refuses multi-key scripts with TRYAGAIN
        // (the script did not run) until the migration ends; the cluster
        // driver's own retries last well under a second, a migration may take
        // longer. Keep trying for a while, or the key waits out its lease.
        let mut retry = Retry::SLOT_MIGRATION.start();
        while let Err(e) = &answer
            && e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::TryAgain)
            && retry.allows(None)
        {
            retry.pause().await;
            answer = run_script(&mut conn, script, cmd).await;
        }
        let answer: redis::Value = answer.map_err(|e| match connection_failure(&e) {
            // Nothing was sent: the outcome is known (it did not run).
            Some(ConnectionFailure::Unreachable) | None => {
                BackendError::with_source("release failed", e)
            }
            Some(ConnectionFailure::TimedOut | ConnectionFailure::Broken) => {
                BackendError::outcome_unknown(
                    "the release was sent and no answer came back: its outcome is unknown \
                     (if it did not run, the lease runs out by itself)",
                    Some(Box::new(e)),
                )
            }
        })?;
        Ok((answer, resent))
    }

    pub(crate) async fn extend_many(
        &self,
        leases: &[(&KeyNames, &Token, Duration)],
    ) -> Result<Vec<bool>, LockError> {
        if !matches!(self.conns[0], Conn::Cluster(_)) {
            return self.extend_batch(leases).await;
        }
        // A cluster runs a script only on keys of one slot: one call per slot.
        let mut by_slot: std::collections::BTreeMap<u16, Vec<usize>> = Default::default();
        for (i, (names, ..)) in leases.iter().enumerate() {
            by_slot.entry(names.slot).or_default().push(i);
        }
        let answers = futures_util::future::join_all(by_slot.values().map(|indices| {
            let group: Vec<_> = indices.iter().map(|i| leases[*i]).collect();
            async move { self.extend_batch(&group).await }
        }))
        .await;
        let mut extended = vec![false; leases.len()];
        for (indices, answer) in by_slot.values().zip(answers) {
            for (i, e) in indices.iter().zip(answer?) {
                extended[*i] = e;
            }
        }
        Ok(extended)
    }

    async fn extend_batch(
        &self,
        leases: &[(&KeyNames, &Token, Duration)],
    ) -> Result<Vec<bool>, LockError> {
        let batched = |names: &KeyNames| names.shape == Shape::Mutex && !names.is_leader();
        if leases.iter().any(|(names, ..)| !batched(names)) {
            // Readers', permits' and leaders' leases: one call each (their
            // sets are renewed by `shared.lua`, a leader's record with its
            // lease by `extend.lua`), the mutexes' in one batch.
            let (mutexes, others): (Vec<usize>, Vec<usize>) =
                (0..leases.len()).partition(|i| batched(leases[*i].0));
            let batch: Vec<_> = mutexes.iter().map(|i| leases[*i]).collect();
            let (batched, singles) = futures_util::future::join(
                Box::pin(self.extend_batch(&batch)),
                futures_util::future::join_all(others.iter().map(|i| {
                    let (names, token, ttl) = leases[*i];
                    self.extend(names, token, ttl)
                })),
            )
            .await;
            let mut extended = vec![false; leases.len()];
            for (i, e) in mutexes.iter().zip(batched?) {
                extended[*i] = e;
            }
            for (i, e) in others.iter().zip(singles) {
                extended[*i] = e?;
            }
            return Ok(extended);
        }
        let Some((first, ..)) = leases.first() else {
            return Ok(Vec::new());
        };
        let mut cmd = evalsha(
            &EXTEND_MANY,
            leases.len(),
            3 * leases.len(),
            leases.len() * (first.lock.len() + 48),
        );
        for (names, ..) in leases {
            cmd.arg(&names.lock);
        }
        for (_, token, ttl) in leases {
            cmd.arg(token.as_str()).arg(millis(*ttl));
        }
        let mut conn = self.conn(first);
        let extended: Vec<i64> = run_script(&mut conn, &EXTEND_MANY, &cmd)
            .await
            .map_err(|e| BackendError::with_source("batched extend failed", e))?;
        if extended.len() != leases.len() {
            return Err(BackendError::new("batched extend: wrong number of answers").into());
        }
        if extended.contains(&1) {
            // Unconfirmed by replicas: the watchdog retries until the lease ends.
            self.replicated(&mut conn).await?;
        }
        Ok(extended.into_iter().map(|e| e == 1).collect())
    }

    /// Deletes a key as an operator would (`DEL`), for tests.
    pub(crate) async fn delete(&self, names: &KeyNames) -> Result<(), LockError> {
        redis::cmd("DEL")
            .arg(&names.lock)
            .exec_async(&mut self.conn(names))
            .await
            .map_err(|e| BackendError::with_source("cannot delete the lock", e))?;
        Ok(())
    }

    /// `true` when notices for `names` already reach this process, so a
    /// waiter can register before its first attempt at no cost.
    pub(crate) fn is_subscribed(&self, channel: &str) -> bool {
        self.waiters.is_subscribed(channel)
    }

    /// A plain connection handle, for the other modules' scripts.
    pub(crate) fn connection(&self) -> Conn {
        self.conns[0].clone()
    }

    /// The command a script publishes notices with: `PUBLISH`, or `SPUBLISH`
    /// on a cluster (the channel then lives in its key's slot).
    #[cfg_attr(not(feature = "idempotency"), allow(dead_code))]
    pub(crate) fn publish_command(&self) -> &'static str {
        self.publish
    }

    /// `true` on a Redis Cluster, where a script may touch one slot only.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.conns[0], Conn::Cluster(_))
    }
}
