//! How a mutex's acquire, release and extend reach the group commit of
//! their connection handle ([`super::batch`]): alone when nothing is in
//! flight there, else queued for the next batch.

use std::sync::Arc;
use std::time::Duration;

use super::super::scripts::{RELEASE, evalsha, millis};
use super::RedisBackend;
use super::batch::{BatchStats, Batcher, Op, OpError, OpKind, Turn};
use crate::LockError;
use crate::error::BackendError;
use crate::key::{KeyNames, Kind};
use crate::token::Token;

/// Where a call goes.
pub(super) enum Route {
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
    pub(super) fn route(&self, names: &KeyNames) -> Route {
        if names.kind != Kind::Mutex || names.is_leader() {
            return Route::Alone(None);
        }
        let Some(batcher) = self.batchers.get(self.handle(names)) else {
            return Route::Alone(None);
        };
        match batcher.try_turn() {
            Some(turn) => Route::Alone(Some(turn)),
            None => Route::Queued(batcher.clone()),
        }
    }

    /// Batched calls and ops so far, over every handle.
    pub(crate) fn batch_stats(&self) -> BatchStats {
        self.batchers
            .iter()
            .map(|b| b.stats())
            .fold(BatchStats::default(), |a, b| BatchStats {
                calls: a.calls + b.calls,
                ops: a.ops + b.ops,
                largest: a.largest.max(b.largest),
            })
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
            args: if wait_ms > 0 {
                vec![
                    token.as_str().to_owned(),
                    millis(ttl).to_string(),
                    self.notice_spec(names).concat(),
                    wait_ms.to_string(),
                ]
            } else {
                // A try-once acquire leaves its wait out (the script reads '0').
                vec![
                    token.as_str().to_owned(),
                    millis(ttl).to_string(),
                    self.notice_spec(names).concat(),
                ]
            },
        }
    }

    /// An extend as a batched op (extend.lua's keys and arguments).
    pub(super) fn extend_op(names: &KeyNames, token: &Token, ttl: Duration) -> Op {
        Op {
            kind: OpKind::Extend,
            slot: names.slot,
            keys: vec![names.lock.clone()],
            args: vec![token.as_str().to_owned(), millis(ttl).to_string()],
        }
    }

    /// release.lua's arguments after the keys, written into `cmd` (the
    /// queue entry `token:ttl` only when leaving the queue, else empty).
    fn write_release_args(
        &self,
        cmd: &mut redis::Cmd,
        names: &KeyNames,
        token: &Token,
        ttl: Duration,
        dequeue: bool,
    ) {
        cmd.arg(token.as_str()).arg(self.notice_spec(names));
        // The plain release sends these two; the flag and our own queue
        // entry only when there is one to send (the script reads absent
        // ones as '0' and none).
        if self.announce_free || dequeue {
            cmd.arg(if self.announce_free { "1" } else { "0" });
        }
        if dequeue {
            let ttl_ms = millis(ttl).to_string();
            cmd.arg(Joined([token.as_str(), ":", &ttl_ms]));
        }
    }

    /// release.lua's arguments after the keys, for a batched op (as
    /// [`Self::write_release_args`] writes them into a command).
    fn release_args(
        &self,
        names: &KeyNames,
        token: &Token,
        ttl: Duration,
        dequeue: bool,
    ) -> Vec<String> {
        let mut args = Vec::with_capacity(4);
        args.push(token.as_str().to_owned());
        args.push(self.notice_spec(names).concat());
        if self.announce_free || dequeue {
            args.push(if self.announce_free { "1" } else { "0" }.to_owned());
        }
        if dequeue {
            args.push(format!("{}:{}", token.as_str(), millis(ttl)));
        }
        args
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
            args: self.release_args(names, token, ttl, dequeue),
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
        self.write_release_args(&mut cmd, names, token, ttl, dequeue);
        cmd
    }
}

/// The keys of a mutex script (acquire.lua, release.lua): the lock, its
/// fencing counter, its queue and the queue's deadlines.
fn mutex_keys(names: &KeyNames) -> [String; 4] {
    [
        names.lock.clone(),
        names.fence(),
        names.queue.clone(),
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
        .arg(&names.queue)
        .arg(Joined(names.deadlines_parts()));
    if leader {
        cmd.arg(&names.record).arg(&names.labels);
    }
    cmd
}

/// One argument written from its pieces, without building it as a string
/// first (the fencing counter's and the deadlines' names on every call).
pub(super) struct Joined<'a, const N: usize>(pub(super) [&'a str; N]);

impl<const N: usize> Joined<'_, N> {
    /// The pieces as one string (for a batched op's arguments).
    pub(super) fn concat(&self) -> String {
        self.0.concat()
    }
}

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
