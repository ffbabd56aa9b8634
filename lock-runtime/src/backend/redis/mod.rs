//! One Redis (or Valkey) server: scripts and commands on one multiplexed,
//! self-reconnecting connection, and one shared pub/sub connection for release notices.

use std::sync::Arc;
use std::time::Duration;

use super::conn::Conn;
use super::notifier::Notices;
pub(crate) use super::open::RedisOptions;
use super::scripts::{ACQUIRE, EXTEND, RELEASE, RESERVE, SHARED, evalsha, millis, run_script};
use super::waiters::Registry;
use super::{AcquireOutcome, LockRef, Released};
use crate::backoff::Retry;
use crate::error::{BackendError, ConnectionFailure, LockError, connection_failure};
use crate::key::{KeyNames, LockKind};

/// The error a release that got no answer gives.
fn release_failed(e: redis::RedisError) -> LockError {
    match connection_failure(&e) {
        // Nothing was sent: the outcome is known (it did not run).
        Some(ConnectionFailure::Unreachable) | None => {
            BackendError::with_source("release failed", e).into()
        }
        Some(ConnectionFailure::TimedOut | ConnectionFailure::Broken) => {
            BackendError::outcome_unknown(
                "the release was sent and no answer came back: its outcome is unknown \
                 (if it did not run, the lease runs out by itself)",
                Some(Box::new(e)),
            )
            .into()
        }
    }
}

/// `true` when a batched release that failed with `e` is sent again alone,
/// as `send_release` re-sends its own: after a broken connection, and while
/// no node serves the slot (the batch did not run).
fn resend_release(e: &redis::RedisError) -> bool {
    connection_failure(e) == Some(ConnectionFailure::Broken) || refused_for_now(e)
}

/// `true` for a command refused, past the cluster driver's own retries, by
/// a node that cannot serve it yet: a slot being migrated (`TRYAGAIN`: its
/// keys are split between the two nodes, or the `ASK` that led there), or
/// moved and not yet known everywhere (`MOVED`), a failover. It did not run.
fn refused_for_now(e: &redis::RedisError) -> bool {
    connection_failure(e) == Some(ConnectionFailure::Unreachable)
}

mod all;
mod batch;
mod batched;
mod connect;
mod extend_many;
mod notices;
mod plain;
mod replicas;
mod shared;

pub(crate) use plain::{Native, Plain};

use batch::Turn;
use batch::{Batcher, OpError};
use batched::{Dispatch, Joined, mutex_script};
use replicas::Unreplicated;

pub(crate) struct RedisBackend {
    /// The one multiplexed command connection (a cluster's: one per node),
    /// so one key's commands stay in order and `WAIT` follows its writes.
    /// One, not several: the commands of concurrent tasks then share its
    /// writes and reads (a second connection halved how many each write
    /// carried, and the uncontended path's `SET`s and compare-and-deletes
    /// cost the server more per call: BENCHMARKS.md, row 11).
    conn: Conn,
    /// The group commit of `conn` (see `batch.rs`); `None` where calls are
    /// not batched (a Redlock node).
    batcher: Option<Arc<Batcher>>,
    waiters: Arc<Registry>,
    notices: Notices,
    /// `PUBLISH`, or `SPUBLISH` on a cluster.
    publish: &'static str,
    /// Announce a release that hands over to nobody (Redlock, whose waiters
    /// do not queue); otherwise only hand-overs are published.
    announce_free: bool,
    replica_acks: Option<(u32, Duration)>,
    /// What the uncontended path may use here (see `plain.rs`).
    plain: Plain,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend").finish_non_exhaustive()
    }
}

impl RedisBackend {
    /// `true` when hand-overs must be confirmed before use (replica acks).
    pub(crate) fn needs_confirmation(&self) -> bool {
        self.replica_acks.is_some()
    }

    /// One attempt (acquire.lua): `wait` zero tries once, else the caller
    /// queues (once) for that long.
    pub(crate) async fn acquire(
        &self,
        lock: LockRef<'_>,
        wait: Duration,
    ) -> Result<AcquireOutcome, LockError> {
        let LockRef { names, token, ttl } = lock;
        if names.kind != LockKind::Mutex {
            // Boxed: a mutex's future does not carry a shared lock's state.
            return Box::pin(self.acquire_shared(lock, wait)).await;
        }
        let wait_ms = if wait.is_zero() { 0 } else { millis(wait) };
        let mut conn = self.connection();
        let turn = match self.route(names) {
            Dispatch::Alone(turn) => turn,
            Dispatch::Queued(batcher) => {
                // Boxed, as every path a plain call does not take: the
                // caller's future then holds a pointer, not this state.
                let reply =
                    Box::pin(batcher.submit(self.acquire_op(names, token, ttl, wait_ms))).await;
                let answer = reply
                    .answer
                    .map_err(|e| e.into_lock_error("acquire failed"))?;
                return self
                    .acquired(lock, wait, &mut conn, answer, Some(reply.replicated))
                    .await;
            }
        };
        // > 0: ours, with this fencing token; <= 0: busy for -answer ms.
        // Five names of about the lock's length, a token, two numbers.
        let mut cmd = mutex_script(
            &ACQUIRE,
            names,
            11,
            7 * names.lock.len() + 80 + names.label.len(),
        );
        cmd.arg(self.acquire_args(names, token, ttl, wait_ms));
        let answer = run_script(&mut conn, &ACQUIRE, &cmd).await;
        drop(turn);
        let answer = answer.map_err(|e| BackendError::with_source("acquire failed", e))?;
        self.acquired(lock, wait, &mut conn, answer, None).await
    }

    /// What acquire.lua's `answer` means; with replica acks, waits for them
    /// (unless a batch did: `replicated`) and gives the lock back if too few
    /// came (boxed: without replica acks the caller's future holds none of
    /// that state).
    async fn acquired(
        &self,
        lock: LockRef<'_>,
        wait: Duration,
        conn: &mut Conn,
        answer: redis::Value,
        replicated: Option<Result<(), Unreplicated>>,
    ) -> Result<AcquireOutcome, LockError> {
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
            other => {
                let what = format!("acquire: unexpected answer {other:?}");
                return Err(BackendError::new(what).into());
            }
        };
        if self.replica_acks.is_some() {
            Box::pin(self.durable_or_given_back(lock, wait, conn, replicated)).await?;
        }
        Ok(AcquireOutcome::Acquired {
            fencing: answer.unsigned_abs(),
        })
    }

    /// With replica acks: waits for them (unless a batch did: `replicated`),
    /// and if too few came gives the lock back before saying no.
    async fn durable_or_given_back(
        &self,
        lock: LockRef<'_>,
        wait: Duration,
        conn: &mut Conn,
        replicated: Option<Result<(), Unreplicated>>,
    ) -> Result<(), LockError> {
        if let Err(e) = self.replicated_or(conn, replicated).await {
            let _ = self.release(lock, !wait.is_zero(), true).await;
            self.suspect_master(&e);
            return Err(e);
        }
        Ok(())
    }

    pub(crate) async fn extend(&self, lock: LockRef<'_>) -> Result<bool, LockError> {
        let LockRef { names, token, ttl } = lock;
        let mut conn = self.connection();
        let turn = match self.route(names) {
            Dispatch::Alone(turn) => turn,
            Dispatch::Queued(batcher) => {
                let reply = batcher.submit(Self::extend_op(names, token, ttl)).await;
                let extended = reply
                    .answer
                    .map_err(|e| e.into_lock_error("extend failed"))?;
                let extended = matches!(extended, redis::Value::Int(1));
                if extended
                    && let Err(e) = self.replicated_or(&mut conn, Some(reply.replicated)).await
                {
                    self.suspect_master(&e);
                    return Err(e);
                }
                return Ok(extended);
            }
        };
        let (script, cmd) = if names.kind == LockKind::Mutex {
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
            cmd.arg(token).arg(millis(ttl));
            (&*EXTEND, cmd)
        } else {
            (&*SHARED, self.extend_shared_cmd(names, token, ttl))
        };
        let extended = run_script(&mut conn, script, &cmd).await;
        drop(turn);
        let extended: i64 = extended.map_err(|e| BackendError::with_source("extend failed", e))?;
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
        lock: LockRef<'_>,
        count: u64,
    ) -> Result<Option<u64>, LockError> {
        let LockRef { names, token, ttl } = lock;
        let mut cmd = evalsha(&RESERVE, 3, 6, 3 * names.lock.len() + 64);
        cmd.arg(&names.lock)
            .arg(names.fence())
            .arg(names.queue())
            .arg(token)
            .arg(millis(ttl))
            .arg(count);
        let mut conn = self.connection();
        let top: u64 = run_script(&mut conn, &RESERVE, &cmd)
            .await
            .map_err(|e| BackendError::with_source("reserving fencing tokens failed", e))?;
        if top == 0 {
            return Ok(None);
        }
        self.replicated(&mut conn).await?;
        Ok(Some(top))
    }

    /// Releases (release.lua). `plain_first`: the lock was taken by a plain
    /// `SET` (see `plain.rs`), so nobody may have queued behind it: the
    /// plain compare-and-delete goes first, and is the whole release unless
    /// the value was marked meanwhile. A lock handed over (always marked)
    /// or taken by a script goes to release.lua at once.
    pub(crate) async fn release(
        &self,
        lock: LockRef<'_>,
        dequeue: bool,
        plain_first: bool,
    ) -> Result<Released, LockError> {
        let LockRef { names, token, ttl } = lock;
        if names.kind != LockKind::Mutex {
            return Box::pin(self.release_shared(lock, dequeue)).await;
        }
        // Nobody queued behind us (an unmarked value): the plain
        // compare-and-delete is the whole release. Otherwise release.lua,
        // at once where this slot's last releases found somebody queued
        // (`Plain::contended`): a hot key's release then costs one round
        // trip, not a refused plain one first.
        let mut plain_resent = false;
        let plain = plain_first && !dequeue && self.is_plain(names);
        if plain && !self.plain.contended(names.slot) {
            match self.unlock(names, token).await {
                Ok((true, _)) => return Ok(Released::Yes),
                Ok((false, resent)) => {
                    plain_resent = resent;
                    self.plain.set_contended(names.slot, true);
                }
                // No answer (a stalled server): the compare-and-delete may
                // still run, and delete nothing if a waiter marked the key.
                // release.lua goes after it, on the same connection, so the
                // waiter is handed the key when the server answers again,
                // not when the lease ends.
                Err(LockError::Backend(e)) if e.is_outcome_unknown() => plain_resent = true,
                Err(e) => return Err(e),
            }
        }
        let (answer, resent) = match self.route(names) {
            Dispatch::Alone(turn) => {
                let cmd = self.release_cmd(names, token, ttl, dequeue);
                self.send_release(&RELEASE, &cmd, plain_resent, turn)
                    .await?
            }
            Dispatch::Queued(batcher) => {
                let reply = batcher
                    .submit(self.release_op(names, token, ttl, dequeue))
                    .await;
                match reply.answer {
                    Ok(answer) => (answer, plain_resent || self.is_cluster()),
                    // As a release sent alone: once more after a broken
                    // connection (the batch may have run: a "not ours" may
                    // be its doing), and while the slot is being migrated.
                    Err(OpError::Call(e)) if resend_release(&e) => {
                        let broken = connection_failure(&e) == Some(ConnectionFailure::Broken);
                        let cmd = self.release_cmd(names, token, ttl, dequeue);
                        self.send_release(&RELEASE, &cmd, broken || plain_resent, None)
                            .await?
                    }
                    Err(OpError::Call(e)) => return Err(release_failed(e)),
                    Err(e) => return Err(e.into_lock_error("release failed")),
                }
            }
        };
        match answer {
            redis::Value::Int(1) => {
                if plain {
                    // Nobody was queued after all: plain releases again.
                    self.plain.set_contended(names.slot, false);
                }
                Ok(Released::Yes)
            }
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
                    self.waiters.grant(names.notice(), next, fencing);
                }
                Ok(Released::Yes)
            }
            _ if resent => Ok(Released::Gone),
            _ => Ok(Released::NotOurs),
        }
    }

    /// Sends a release script (`script`, as `cmd`),
    /// re-sending it once after a broken connection and while its slot is
    /// being migrated. `resent`: a copy may have run before this answer (so
    /// a "not ours" may be its doing). `turn`: the connection's turn of a
    /// lone call (see `batch.rs`), given up once the first copy answered.
    pub(super) async fn send_release(
        &self,
        script: &redis::Script,
        cmd: &redis::Cmd,
        resent: bool,
        turn: Option<Turn>,
    ) -> Result<(redis::Value, bool), LockError> {
        let mut conn = self.connection();
        // The cluster driver re-sends a request whose connection broke by
        // itself, so there a "not ours" may always follow a lost copy.
        let resent = resent || matches!(conn, Conn::Cluster(_));
        let answer = run_script(&mut conn, script, cmd).await;
        // The connection's batch may go now: the re-sends may take seconds
        // (a slot in migration) and need not hold it up.
        drop(turn);
        match answer {
            Ok(answer) => Ok((answer, resent)),
            // Boxed: the caller's future holds a pointer, not the re-sends.
            Err(e) => Box::pin(Self::resend_release(conn, script, cmd, resent, e)).await,
        }
    }

    /// [`Self::send_release`] after its first copy failed with `error`.
    async fn resend_release(
        mut conn: Conn,
        script: &redis::Script,
        cmd: &redis::Cmd,
        mut resent: bool,
        error: redis::RedisError,
    ) -> Result<(redis::Value, bool), LockError> {
        let mut answer = Err(error);
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
        // (or ASK, or a MOVED the driver could not follow: the script did
        // not run) until the migration ends; the cluster driver's own
        // retries last well under a second, a migration may take longer.
        // Keep trying for a while, or the key waits out its lease.
        let mut retry = Retry::SLOT_MIGRATION.start();
        while let Err(e) = &answer
            && refused_for_now(e)
            && retry.allows(None)
        {
            retry.pause().await;
            answer = run_script(&mut conn, script, cmd).await;
        }
        Ok((answer.map_err(release_failed)?, resent))
    }

    /// Deletes a key as an operator would (`DEL`), for tests.
    pub(crate) async fn delete(&self, names: &KeyNames) -> Result<(), LockError> {
        redis::cmd("DEL")
            .arg(&names.lock)
            .exec_async(&mut self.connection())
            .await
            .map_err(|e| BackendError::with_source("cannot delete the lock", e))?;
        Ok(())
    }

    /// `true` when notices for `names` already reach this process, so a
    /// waiter can register before its first attempt at no cost.
    pub(crate) fn is_subscribed(&self, channel: &str) -> bool {
        self.waiters.is_subscribed(channel)
    }

    /// The command connection (a handle: cheap to clone).
    pub(crate) fn connection(&self) -> Conn {
        self.conn.clone()
    }

    /// How the scripts send notices on `channel`, packed in one argument:
    /// `PUBLISH <channel>` (`SPUBLISH` on a cluster, where the channel lives
    /// in its key's slot).
    pub(crate) fn notice_arg<'a>(&'a self, channel: &'a str) -> Joined<'a, 3> {
        Joined([self.publish, " ", channel])
    }

    /// How acquire.lua and release.lua send the key's notices.
    fn notice_spec<'a>(&'a self, names: &'a KeyNames) -> Joined<'a, 3> {
        self.notice_arg(names.notice())
    }

    /// `true` on a Redis Cluster, where a script may touch one slot only.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.conn, Conn::Cluster(_))
    }
}
