//! How a mutex's acquire, release and extend reach the group commit of
//! their connection handle ([`super::batch`]): alone when nothing is in
//! flight there, else queued for the next batch.

use redis::ToRedisArgs as _;
use std::sync::Arc;
use std::time::Duration;

use super::super::scripts::{RELEASE, evalsha, millis};
use super::RedisBackend;
use super::batch::{BatchStats, Batcher, Op, OpError, OpKind, Turn};
use crate::error::{BackendError, LockError};
use crate::key::{KeyNames, LockKind};
use crate::token::Token;

/// Where a call goes.
pub(super) enum Dispatch {
    /// Out at once with its own script; the turn (if batched calls share
    /// the handle) is held until its answer.
    Alone(Option<Turn>),
    /// Into the handle's next batch.
    Queued(Arc<Batcher>),
}

impl OpError {
    /// The error the op's own script call would have given, under `context`.
    pub(super) fn into_lock_error(self, context: &str) -> LockError {
        match self {
            OpError::Call(e) => BackendError::with_source(context.to_owned(), e).into(),
            OpError::Script(message) => BackendError::new(format!("{context}: {message}")).into(),
        }
    }
}

impl RedisBackend {
    /// Where a call on `names` goes: only a mutex's (not a leader
    /// election's) calls are batched, and not on a Redlock node.
    pub(super) fn route(&self, names: &KeyNames) -> Dispatch {
        if names.kind != LockKind::Mutex || names.is_leader() {
            return Dispatch::Alone(None);
        }
        let Some(batcher) = &self.batcher else {
            return Dispatch::Alone(None);
        };
        match batcher.try_turn() {
            Some(turn) => Dispatch::Alone(Some(turn)),
            None => Dispatch::Queued(batcher.clone()),
        }
    }

    /// Batched calls and ops so far.
    pub(crate) fn batch_stats(&self) -> BatchStats {
        self.batcher.as_ref().map(|b| b.stats()).unwrap_or_default()
    }

    /// acquire.lua's arguments after its keys (one place writes their
    /// order: a lone call and a batched op both take them from here).
    pub(super) fn acquire_args<'a>(
        &'a self,
        names: &'a KeyNames,
        token: &'a Token,
        ttl: Duration,
        wait_ms: u64,
    ) -> AcquireArgs<'a> {
        AcquireArgs {
            token,
            ttl_ms: millis(ttl),
            notice: self.notice_spec(names),
            wait_ms,
            label: names.is_leader().then_some(names.label.as_str()),
        }
    }

    /// An acquire as a batched op (acquire.lua's keys and arguments).
    pub(super) fn acquire_op(
        &self,
        names: &KeyNames,
        token: &Token,
        ttl: Duration,
        wait_ms: u64,
    ) -> Op {
        Op {
            kind: OpKind::Acquire,
            slot: names.slot,
            keys: mutex_keys(names).to_vec(),
            args: self
                .acquire_args(names, token, ttl, wait_ms)
                .to_redis_args(),
        }
    }

    /// An extend as a batched op (extend.lua's keys and arguments).
    pub(super) fn extend_op(names: &KeyNames, token: &Token, ttl: Duration) -> Op {
        Op {
            kind: OpKind::Extend,
            slot: names.slot,
            keys: vec![names.lock.clone()],
            args: (token, millis(ttl)).to_redis_args(),
        }
    }

    /// release.lua's arguments after its keys (one place writes their
    /// order: a lone call and a batched op both take them from here).
    fn release_args<'a>(
        &'a self,
        names: &'a KeyNames,
        token: &'a Token,
        ttl: Duration,
        dequeue: bool,
    ) -> ReleaseArgs<'a> {
        ReleaseArgs {
            token,
            notice: self.notice_spec(names),
            announce_free: self.announce_free,
            entry_ttl_ms: dequeue.then(|| millis(ttl)),
        }
    }

    /// A release as a batched op (release.lua's keys and arguments).
    pub(super) fn release_op(
        &self,
        names: &KeyNames,
        token: &Token,
        ttl: Duration,
        dequeue: bool,
    ) -> Op {
        Op {
            kind: OpKind::Release,
            slot: names.slot,
            keys: mutex_keys(names).to_vec(),
            args: self
                .release_args(names, token, ttl, dequeue)
                .to_redis_args(),
        }
    }

    /// release.lua as its own call.
    pub(super) fn release_cmd(
        &self,
        names: &KeyNames,
        token: &Token,
        ttl: Duration,
        dequeue: bool,
    ) -> redis::Cmd {
        // Four names of about the lock's length, a token, a queue entry, flags.
        let mut cmd = mutex_script(&RELEASE, names, 10, 7 * names.lock.len() + 96);
        cmd.arg(self.release_args(names, token, ttl, dequeue));
        cmd
    }
}

/// The keys of a mutex script (acquire.lua, release.lua): the lock, its
/// fencing counter, its queue and the queue's deadlines.
fn mutex_keys(names: &KeyNames) -> [String; 4] {
    [
        names.lock.clone(),
        names.fence(),
        names.queue().to_owned(),
        names.deadlines(),
    ]
}

/// An EVALSHA of a mutex script (acquire.lua, release.lua) with its keys:
/// [`mutex_keys`], then a leader's record and labels. `args` and `bytes`
/// size the command for the arguments the caller adds next.
pub(super) fn mutex_script(
    script: &redis::Script,
    names: &KeyNames,
    args: usize,
    bytes: usize,
) -> redis::Cmd {
    let leader = names.is_leader();
    let mut cmd = evalsha(script, if leader { 6 } else { 4 }, args, bytes);
    cmd.arg(&names.lock)
        .arg(Joined(names.fence_parts()))
        .arg(names.queue())
        .arg(Joined(names.deadlines_parts()));
    if leader {
        cmd.arg(&names.record).arg(&names.labels);
    }
    cmd
}

/// One argument written from its pieces, without building it as a string
/// first (the fencing counter's and the deadlines' names on every call).
pub(crate) struct Joined<'a, const N: usize>(pub(super) [&'a str; N]);

impl<const N: usize> redis::ToRedisArgs for Joined<'_, N> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + redis::RedisWrite,
    {
        use std::io::Write as _;
        let mut arg = out.writer_for_next_arg();
        for piece in self.0 {
            // Writing into the command's buffer cannot fail.
            let _ = arg.write_all(piece.as_bytes());
        }
    }
}

/// acquire.lua's arguments after its keys: the token, the lease, how
/// notices go, then the wait (left out for a try-once acquire: the script
/// reads '0') and a leader's label (a leader always sends its wait).
pub(super) struct AcquireArgs<'a> {
    token: &'a Token,
    ttl_ms: u64,
    notice: Joined<'a, 3>,
    wait_ms: u64,
    label: Option<&'a str>,
}

impl redis::ToRedisArgs for AcquireArgs<'_> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + redis::RedisWrite,
    {
        self.token.write_redis_args(out);
        self.ttl_ms.write_redis_args(out);
        self.notice.write_redis_args(out);
        if self.wait_ms > 0 || self.label.is_some() {
            self.wait_ms.write_redis_args(out);
        }
        if let Some(label) = self.label {
            label.write_redis_args(out);
        }
    }
}

/// release.lua's arguments after its keys: the token and how notices go
/// (all a plain release sends), then the announce flag and our own queue
/// entry `token:ttl`, only when there is one to send (the script reads
/// absent ones as '0' and none).
struct ReleaseArgs<'a> {
    token: &'a Token,
    notice: Joined<'a, 3>,
    announce_free: bool,
    /// `Some(ttl)`: leaving the queue, whose entry names this lease.
    entry_ttl_ms: Option<u64>,
}

impl redis::ToRedisArgs for ReleaseArgs<'_> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + redis::RedisWrite,
    {
        self.token.write_redis_args(out);
        self.notice.write_redis_args(out);
        if self.announce_free || self.entry_ttl_ms.is_some() {
            (if self.announce_free { "1" } else { "0" }).write_redis_args(out);
        }
        if let Some(ttl_ms) = self.entry_ttl_ms {
            use std::io::Write as _;
            let mut arg = out.writer_for_next_arg();
            // Writing into the command's buffer cannot fail.
            let _ = arg.write_all(self.token.as_bytes());
            let _ = write!(arg, ":{ttl_ms}");
        }
    }
}
