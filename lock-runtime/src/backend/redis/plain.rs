//! The uncontended path in plain commands: a lock nobody waits for and
//! nobody asks a token of costs the server exactly what the hand-written
//! pair costs.
//!
//! * Acquire: `SET key token NX PX ttl`. Only when that finds the key taken
//!   does acquire.lua run (re-entry, the line, hand-overs). While a line of
//!   waiters exists the key exists (acquire.lua pins it past its owner's
//!   lease), so a plain `SET NX` never overtakes the line.
//! * Release: the server's own compare-and-delete, `DELIFEQ key token`
//!   (Valkey 9 and later) or `DELEX key IFEQ token` (Redis 8.4 and later),
//!   or the minimal script unlock.lua elsewhere. Only when that deletes
//!   nothing (a marked value: somebody queued; or not ours) does release.lua
//!   run.
//! * Fencing: no `INCR` at acquire; the token is minted on first use by
//!   mint.lua, which checks ownership first.
//!
//! Not for leader elections, Redlock nodes (whose locks are decided by a
//! vote of scripts) or the shared locks: they keep their scripts. Nor for a
//! client built with `coalesce_scripts(true)`, which asked for its calls to
//! go out in batches of scripts (batch.rs).

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use super::super::conn::Conn;
use super::super::scripts::{MINT, PROBE, SHARED, UNLOCK, evalsha, millis, run_script};
use super::super::{AcquireOutcome, LockRef};
use super::RedisBackend;
use crate::error::{BackendError, LockError};
use crate::key::{KeyNames, LockKind};
use crate::token::Token;

/// What the plain path may use on this server.
#[derive(Debug)]
pub(crate) struct Plain {
    /// Plain commands are used at all (not on a Redlock node, nor with
    /// `coalesce_scripts(true)`).
    pub(super) enabled: bool,
    /// One bit per group of hash slots (slot % 256): the last release of a
    /// plain-taken lock there found somebody queued, so the next one goes
    /// to release.lua at once. A hint only: either path releases correctly.
    contended: [AtomicU64; 4],
    /// The server's own compare-and-delete and compare-and-set, a
    /// [`Native`] as a byte (found once when connecting; [`Native::None`]
    /// for good the first time the server or a proxy in front of it refuses
    /// one of them).
    native: AtomicU8,
}

/// Which compare-and-delete and compare-and-set the server has as commands
/// of its own (the plain release, a record's settle): each as one command
/// costs the server a fraction of the script that does the same.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Native {
    /// Neither: the scripts (Redis before 8.4, Valkey before 9).
    None = 0,
    /// `DELIFEQ key value` and `SET key value IFEQ old` (Valkey 9.0 and
    /// later).
    Delifeq = 1,
    /// `DELEX key IFEQ value` and `SET key value IFEQ old` (Redis 8.4 and
    /// later).
    Delex = 2,
}

impl Native {
    fn from_u8(byte: u8) -> Self {
        match byte {
            1 => Self::Delifeq,
            2 => Self::Delex,
            _ => Self::None,
        }
    }

    /// The compare-and-delete of `key` if it holds exactly `value`, with
    /// `bytes` of room for the value (`None` on a server without one).
    pub(crate) fn delete_if_equal(
        self,
        key: &str,
        value: impl redis::ToRedisArgs,
        bytes: usize,
    ) -> Option<redis::Cmd> {
        let mut cmd;
        match self {
            Self::None => return None,
            Self::Delifeq => {
                cmd = redis::Cmd::with_capacity(3, key.len() + bytes + 16);
                cmd.arg("DELIFEQ").arg(key).arg(value);
            }
            Self::Delex => {
                cmd = redis::Cmd::with_capacity(4, key.len() + bytes + 16);
                cmd.arg("DELEX").arg(key).arg("IFEQ").arg(value);
            }
        }
        Some(cmd)
    }
}

impl Plain {
    pub(super) fn new(enabled: bool, native: Native) -> Self {
        Self {
            enabled,
            native: AtomicU8::new(native as u8),
            contended: Default::default(),
        }
    }

    /// Whether the last release of a plain-taken lock in `slot`'s group
    /// found somebody queued behind it.
    pub(super) fn contended(&self, slot: u16) -> bool {
        let bit = usize::from(slot) % 256;
        self.contended[bit / 64].load(Ordering::Relaxed) & (1 << (bit % 64)) != 0
    }

    pub(super) fn set_contended(&self, slot: u16, contended: bool) {
        let bit = usize::from(slot) % 256;
        let mask = 1u64 << (bit % 64);
        if contended {
            self.contended[bit / 64].fetch_or(mask, Ordering::Relaxed);
        } else {
            self.contended[bit / 64].fetch_and(!mask, Ordering::Relaxed);
        }
    }

    /// The server's own commands the plain path uses now.
    pub(crate) fn native(&self) -> Native {
        Native::from_u8(self.native.load(Ordering::Relaxed))
    }
}

impl RedisBackend {
    /// Takes the server for one with `native` (tests: a node that is not
    /// what the probe found).
    pub(crate) fn assume_native(&self, native: Native) {
        self.plain.native.store(native as u8, Ordering::Relaxed);
    }
}

/// Which native compare-and-delete the server has ([`Native`]): asked
/// once, by probe.lua (an `EVALSHA`, which a least-privilege user may send,
/// where `COMMAND INFO` or `INFO` would need more rights). An error counts
/// as none, but a user refused `EVALSHA` is refused the client: its
/// uncontended locks would be taken by a plain `SET`, and every renewal
/// and hand-over, all scripts, would fail.
pub(super) async fn native_commands(conn: &mut Conn) -> Result<Native, LockError> {
    let cmd = evalsha(&PROBE, 0, 0, 0);
    Ok(match run_script::<u8>(conn, &PROBE, &cmd).await {
        Ok(answer) => Native::from_u8(answer),
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm) => {
            return Err(BackendError::with_source(
                "this Redis user may not run the lock scripts (EVALSHA): grant it \
                 `+evalsha` with the other commands in docs/keys.md#acl",
                e,
            )
            .into());
        }
        Err(e) => {
            tracing::debug!(
                error = &e as &dyn std::error::Error,
                "the server probe failed; releases use the compare-and-delete script"
            );
            Native::None
        }
    })
}

/// `true` when `e` says the server (or a proxy, or an ACL) did not run the
/// command at all: unknown, not permitted, or not understood (a server
/// without `SET .. IFEQ` answers that `SET` with a syntax error: a cluster
/// node not yet upgraded, in a rolling upgrade), or refused with a code of
/// a proxy's own (Envoy's `-unsupported command 'DELIFEQ'`). Not the
/// server's passing answers (`BUSY` with a script running, `LOADING`,
/// `READONLY` in a failover, a cluster's redirects), nor `WRONGTYPE`, which
/// is about the key: a script would meet them too.
fn refused(e: &redis::RedisError) -> bool {
    match e.kind() {
        redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm) => true,
        redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError) => {
            e.detail().is_some_and(|d| {
                let d = d.to_ascii_lowercase();
                d.contains("unknown command")
                    || d.starts_with("syntax error")
                    || d.contains("unsupported")
                    || d.contains("not supported")
            })
        }
        redis::ErrorKind::Extension => !matches!(e.code(), Some("BUSY" | "WRONGTYPE" | "OOM")),
        _ => false,
    }
}

impl RedisBackend {
    /// `true` when `e` says the server (or a proxy, or an ACL) did not run
    /// a native command (`DELIFEQ`, `DELEX`, `SET .. IFEQ`): the native
    /// commands are then off for good on this server, said once; the caller
    /// sends the script instead.
    pub(crate) fn refused_native(&self, e: &redis::RedisError) -> bool {
        if !refused(e) {
            return false;
        }
        if self
            .plain
            .native
            .swap(Native::None as u8, Ordering::Relaxed)
            != Native::None as u8
        {
            tracing::warn!(
                error = e as &dyn std::error::Error,
                "the server refused a native compare-and-delete or compare-and-set \
                 (an ACL or a proxy?); using the scripts from now on"
            );
        }
        true
    }

    /// The server's own compare-and-delete and compare-and-set that
    /// releases and records use ([`Native::None`] off the plain path).
    pub(crate) fn native(&self) -> Native {
        if self.plain.enabled {
            self.plain.native()
        } else {
            Native::None
        }
    }

    /// `true` when `names`' locks take the plain path here.
    pub(crate) fn is_plain(&self, names: &KeyNames) -> bool {
        self.plain.enabled && names.kind == LockKind::Mutex && !names.is_leader()
    }

    /// The uncontended acquire: `SET key token NX PX ttl`. `Ok(Some(..))`:
    /// ours, with no fencing token yet (0: minted on first use); `Ok(None)`:
    /// the key is taken, acquire.lua decides. With replica acks, ours only
    /// once they came (else given back, as acquire.lua's grants are).
    pub(crate) async fn acquire_plain(
        &self,
        lock: LockRef<'_>,
        wait: Duration,
    ) -> Result<Option<AcquireOutcome>, LockError> {
        let LockRef { names, token, ttl } = lock;
        // "SET", the key, the token, "NX", "PX", the lease.
        let mut cmd = redis::Cmd::with_capacity(6, names.lock.len() + 96);
        cmd.arg("SET")
            .arg(&names.lock)
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(millis(ttl));
        let mut conn = self.connection();
        let answer: redis::Value = cmd
            .query_async(&mut conn)
            .await
            .map_err(|e| BackendError::with_source("acquire failed", e))?;
        if matches!(answer, redis::Value::Nil) {
            return Ok(None);
        }
        if self.replica_acks.is_some() {
            Box::pin(self.durable_or_given_back(lock, wait, &mut conn, None)).await?;
        }
        Ok(Some(AcquireOutcome::Acquired { fencing: 0 }))
    }

    /// The plain release: `DELIFEQ` or `DELEX`, else unlock.lua. `Ok((true, _))` when it
    /// deleted our key; `Ok((false, resent))` when it deleted nothing
    /// (release.lua decides; `resent`: a copy may have run before, so a
    /// "not ours" may be its doing).
    pub(super) async fn unlock(
        &self,
        names: &KeyNames,
        token: &Token,
    ) -> Result<(bool, bool), LockError> {
        if let Some(cmd) = self.plain.native().delete_if_equal(&names.lock, token, 64) {
            match self.send_release(&UNLOCK, &cmd, false, None).await {
                Ok((answer, resent)) => return Ok((answer == redis::Value::Int(1), resent)),
                Err(LockError::Backend(e))
                    if e.driver_error().is_some_and(|e| self.refused_native(e)) => {}
                Err(e) => return Err(e),
            }
        }
        // "EVALSHA", the hash, the key count, the key, the token.
        let mut cmd = evalsha(&UNLOCK, 1, 2, names.lock.len() + 64);
        cmd.arg(&names.lock).arg(token);
        let (answer, resent) = self.send_release(&UNLOCK, &cmd, false, None).await?;
        Ok((answer == redis::Value::Int(1), resent))
    }

    /// Mints the fencing token of the lock `token` holds (mint.lua; a read-
    /// write lock's or a semaphore's: shared.lua's `mint`): the token, or
    /// `None` when the lock is not ours. With replica acks, only once they
    /// came (a token lost in a failover could be issued again).
    pub(crate) async fn mint(
        &self,
        names: &KeyNames,
        token: &Token,
    ) -> Result<Option<u64>, LockError> {
        let (script, cmd) = if names.kind == LockKind::Mutex {
            let mut cmd = evalsha(&MINT, 2, 3, 2 * names.lock.len() + 64);
            cmd.arg(&names.lock).arg(names.fence()).arg(token);
            (&*MINT, cmd)
        } else {
            (&*SHARED, self.mint_shared_cmd(names, token))
        };
        let mut conn = self.connection();
        let minted: u64 = run_script(&mut conn, script, &cmd)
            .await
            .map_err(|e| BackendError::with_source("minting the fencing token failed", e))?;
        if minted == 0 {
            return Ok(None);
        }
        self.replicated(&mut conn).await?;
        Ok(Some(minted))
    }
}

#[cfg(test)]
mod tests {
    use super::refused;

    #[test]
    fn a_native_command_refused_by_an_acl_a_proxy_or_an_older_server_is_told_apart() {
        let ext = |code: &str, detail: &str| {
            redis::make_extension_error(code.to_owned(), Some(detail.to_owned()))
        };
        let err =
            |kind, detail: &'static str| redis::RedisError::from((kind, "", detail.to_owned()));
        let response = redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError);
        let refusals = [
            // Envoy's redis_proxy, which has no such command.
            ext("unsupported", "command 'DELIFEQ'"),
            err(
                response,
                "unknown command 'DELEX', with args beginning with: ",
            ),
            err(response, "syntax error"),
            err(
                redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm),
                "no permissions",
            ),
        ];
        for e in &refusals {
            assert!(refused(e), "{e:?}");
        }
        let passing = [
            ext("BUSY", "Redis is busy running a script"),
            ext(
                "WRONGTYPE",
                "Operation against a key holding the wrong kind of value",
            ),
            err(
                redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly),
                "replica",
            ),
            err(
                redis::ErrorKind::Server(redis::ServerErrorKind::BusyLoading),
                "loading",
            ),
            err(
                redis::ErrorKind::Server(redis::ServerErrorKind::TryAgain),
                "slot",
            ),
            err(redis::ErrorKind::Io, "broken pipe"),
        ];
        for e in &passing {
            assert!(!refused(e), "{e:?}");
        }
    }
}
