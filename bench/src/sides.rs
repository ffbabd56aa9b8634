//! The sides a windowed row measures in turn: the library, the raw redis-rs
//! baseline and rslock, the peer. Each knows how to take one key and give it
//! back; the loops that drive them (`rows::pairs_per_sec`, `rows::hot`) are
//! the same for all, so the sides differ only where the code a user would
//! write differs.

use std::future::Future;
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockGuard};

use super::raw::{Raw, RawConn, value};

/// The lease every side asks for: the library's default.
const LEASE: Duration = Duration::from_secs(30);

/// How long a contender waits in the hot-key rows before giving up (an error
/// in the benchmark: nothing should make anyone wait that long).
pub(crate) const GENEROUS_WAIT: Duration = Duration::from_secs(30);

/// One attempt to take a key.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Attempt {
    /// If the key is busy: wait (or retry) until it is free; otherwise fail.
    pub(crate) contended: bool,
    /// Unique per attempt, for sides that make their own lock values.
    pub(crate) task: usize,
    pub(crate) n: u64,
}

/// One way of taking a lock and giving it back.
pub(crate) trait Side: Clone + Send + Sync + 'static {
    /// What the taker holds until it gives the key back.
    type Held: Send;

    /// The key this side uses for `name` (each side has its own prefix).
    fn key(&self, name: &str) -> String;

    /// Takes `key` (see [`Attempt`]).
    fn take(
        &mut self,
        key: &str,
        attempt: Attempt,
    ) -> impl Future<Output = Result<Self::Held, String>> + Send;

    /// Gives `key` back.
    fn give(
        &mut self,
        key: &str,
        held: Self::Held,
    ) -> impl Future<Output = Result<(), String>> + Send;
}

/// The library: `client.lock(key).acquire()`, or `.wait(..).acquire()` on a
/// contended key, then `guard.release()`. The client adds its own prefix.
impl Side for LockClient {
    type Held = LockGuard;

    fn key(&self, name: &str) -> String {
        name.to_string()
    }

    async fn take(&mut self, key: &str, at: Attempt) -> Result<LockGuard, String> {
        let request = self.lock(key);
        let request = if at.contended {
            request.wait(GENEROUS_WAIT)
        } else {
            request
        };
        request
            .acquire()
            .await
            .map_err(|e| format!("acquire {key}: {e}"))
    }

    async fn give(&mut self, key: &str, guard: LockGuard) -> Result<(), String> {
        guard
            .release()
            .await
            .map_err(|e| format!("release {key}: {e}"))
    }
}

/// Raw redis-rs on one shared connection (a multiplexed connection, or a
/// `ConnectionManager` over one): `SET NX PX` (on a contended key: yield and
/// retry at once, spin polling as people write it without a library), then
/// compare-and-delete.
impl<C: RawConn> Side for Raw<C> {
    type Held = String;

    fn key(&self, name: &str) -> String {
        Raw::key(self, name)
    }

    async fn take(&mut self, key: &str, at: Attempt) -> Result<String, String> {
        let v = value(at.task as u64, at.n);
        let asked = Instant::now();
        while !self.try_set(key, &v).await? {
            if !at.contended {
                return Err(format!("raw baseline: {key} was unexpectedly held"));
            }
            if asked.elapsed() > GENEROUS_WAIT {
                return Err("raw spin: waited too long".into());
            }
            tokio::task::yield_now().await;
        }
        Ok(v)
    }

    async fn give(&mut self, key: &str, v: String) -> Result<(), String> {
        if self.release(key, &v).await? {
            Ok(())
        } else {
            Err(format!("raw baseline: {key} was not ours at release"))
        }
    }
}

/// The peer: rslock (Redlock) as its README shows it, one `LockManager` over
/// the one server. A free key: `lock(key, ttl)` (which retries 3 times, 0-200
/// ms apart, before giving up); a contended key: `acquire_no_guard`, which
/// loops on `lock` until it gets the key (rslock has no waiting of its own).
/// Either way `unlock(&lock)` gives it back.
#[derive(Clone)]
pub(crate) struct Peer {
    pub(crate) manager: rslock::LockManager,
    /// Prepended to every key (rslock has no prefix of its own).
    pub(crate) prefix: String,
}

impl Side for Peer {
    type Held = rslock::Lock;

    fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    async fn take(&mut self, key: &str, at: Attempt) -> Result<rslock::Lock, String> {
        if !at.contended {
            return self
                .manager
                .lock(key, LEASE)
                .await
                .map_err(|e| format!("rslock lock {key}: {e}"));
        }
        tokio::time::timeout(GENEROUS_WAIT, self.manager.acquire_no_guard(key, LEASE))
            .await
            .map_err(|_| format!("rslock acquire {key}: waited too long"))?
            .map_err(|e| format!("rslock acquire {key}: {e}"))
    }

    async fn give(&mut self, _: &str, lock: rslock::Lock) -> Result<(), String> {
        // Best effort, like rslock's own release: it reports nothing.
        self.manager.unlock(&lock).await;
        Ok(())
    }
}
