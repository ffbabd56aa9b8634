//! The lock scripts and how they are sent: `EVALSHA`, loading the script
//! again where the server lost it.

use std::sync::LazyLock;
use std::time::Duration;

use super::conn::Conn;
use crate::error::{BackendError, LockError};

pub(crate) static ACQUIRE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../scripts/acquire.lua")));
pub(crate) static EXTEND: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../scripts/extend.lua")));
pub(crate) static RELEASE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../scripts/release.lua")));
pub(crate) static EXTEND_MANY: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../scripts/extend_many.lua")));
pub(crate) static RESERVE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../scripts/reserve.lua")));
pub(crate) static SHARED: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../scripts/shared.lua")));
pub(crate) static ACQUIRE_ALL: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../scripts/acquire_all.lua")));
pub(crate) static MINT: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../scripts/mint.lua")));
pub(crate) static PROBE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../scripts/probe.lua")));
pub(crate) static UNLOCK: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../scripts/unlock.lua")));

/// Loads the scripts once, so the hot path is a plain EVALSHA (which still
/// falls back to loading after a failover or restart).
pub(crate) async fn load_scripts(conn: &mut Conn) -> Result<(), LockError> {
    for script in [
        &*ACQUIRE,
        &*EXTEND,
        &*RELEASE,
        &*EXTEND_MANY,
        &*RESERVE,
        &*SHARED,
        &*ACQUIRE_ALL,
        &*MINT,
        &*UNLOCK,
    ] {
        script
            .prepare_invoke()
            .load_async(conn)
            .await
            .map_err(|e| BackendError::with_source("cannot load the lock scripts", e))?;
    }
    Ok(())
}

/// `EVALSHA` of `script` with `keys` keys; the caller appends the keys, then
/// the arguments: `args` of them in all (keys included), about `bytes` long.
/// Built as one command: the driver's `ScriptInvocation` would copy every
/// argument twice on each call, and these calls are the hot path; sized
/// once, so appending does not grow it step by step.
pub(crate) fn evalsha(
    script: &redis::Script,
    keys: usize,
    args: usize,
    bytes: usize,
) -> redis::Cmd {
    // "EVALSHA", the 40-digit hash, the key count.
    let mut cmd = redis::Cmd::with_capacity(args + 3, bytes + 7 + 40 + 4);
    cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys);
    cmd
}

/// Runs an [`evalsha`] command; if the server lost the script (a restart or a
/// failover), loads it and tries once more.
pub(crate) async fn run_script<T: redis::FromRedisValue>(
    conn: &mut Conn,
    script: &redis::Script,
    cmd: &redis::Cmd,
) -> redis::RedisResult<T> {
    match cmd.query_async(conn).await {
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            // Boxed: a caller's future holds a pointer, not the load's state.
            Box::pin(script.prepare_invoke().load_async(conn)).await?;
            cmd.query_async(conn).await
        }
        answer => answer,
    }
}

/// Milliseconds for a Redis argument: at least 1 (0 often means "forever").
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use crate::backend::HANDOFF_LEASE;

    /// acquire.lua and release.lua hold the hand-over lease cap as a
    /// constant (an argument costs the server on every call): it must be
    /// the client's `HANDOFF_LEASE`, which the waiter's timers assume.
    #[test]
    fn the_scripts_hand_over_cap_is_the_clients_handoff_lease() {
        let line = format!("local HAND_OVER_CAP = {}\n", HANDOFF_LEASE.as_millis());
        for (name, text) in [
            ("acquire.lua", include_str!("../../scripts/acquire.lua")),
            ("release.lua", include_str!("../../scripts/release.lua")),
        ] {
            assert!(text.contains(&line), "{name} lacks `{}`", line.trim());
        }
    }
}
