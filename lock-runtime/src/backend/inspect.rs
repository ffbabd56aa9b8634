//! Reading a lock's state without touching it: [`Backend::inspect`].

use std::time::Duration;

use futures_util::future::join_all;
use tokio::time::timeout;

use super::Backend;
use super::redis::RedisBackend;
use super::redlock::RedlockBackend;
use crate::LockError;
use crate::error::BackendError;
use crate::key::KeyNames;

/// What the backend holds for one key, read in one step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Observed {
    /// Somebody holds the lock.
    pub(crate) held: bool,
    /// The lease left; `None` when free, or held by a key without expiry
    /// (set by hand).
    pub(crate) remaining: Option<Duration>,
    /// The fencing counter of the key's slot: the highest token issued to
    /// any key there, so at least the holder's.
    pub(crate) fence: u64,
    /// Waiters in the key's queue.
    pub(crate) queued: usize,
}

impl Backend {
    /// The lock's state, read without changing it.
    pub(crate) async fn inspect(&self, names: &KeyNames) -> Result<Observed, LockError> {
        match self {
            Backend::Redis(b) => observe(b, names).await,
            Backend::Redlock(b) => observe_majority(b, names).await,
            Backend::Memory(b) => Ok(b.observe(names)),
        }
    }
}

/// One server: `PTTL`, `GET` and `LLEN` in one round trip (one slot).
async fn observe(node: &RedisBackend, names: &KeyNames) -> Result<Observed, LockError> {
    let (pttl, fence, queued): (i64, Option<u64>, u64) = redis::pipe()
        .cmd("PTTL")
        .arg(&names.lock)
        .cmd("GET")
        .arg(names.fence())
        .cmd("LLEN")
        .arg(&names.queue)
        .query_async(&mut node.conn(names))
        .await
        .map_err(|e| BackendError::with_source("cannot read the lock's state", e))?;
    Ok(Observed {
        held: pttl != -2,
        remaining: u64::try_from(pttl).ok().map(Duration::from_millis),
        fence: fence.unwrap_or(0),
        queued: usize::try_from(queued).unwrap_or(usize::MAX),
    })
}

/// Redlock: held when a majority of nodes hold it, for the lease a majority
/// still has; the highest counter and the longest queue.
async fn observe_majority(
    redlock: &RedlockBackend,
    names: &KeyNames,
) -> Result<Observed, LockError> {
    let per_node = redlock.node_timeout();
    let answers: Vec<Observed> = join_all(
        redlock
            .nodes()
            .iter()
            .map(|node| timeout(per_node, observe(node, names))),
    )
    .await
    .into_iter()
    .filter_map(|answer| answer.ok()?.ok())
    .collect();
    let quorum = redlock.quorum();
    if answers.len() < quorum {
        return Err(BackendError::new(format!(
            "Redlock: only {} of {} nodes answered; a majority of {quorum} is needed",
            answers.len(),
            redlock.nodes().len()
        ))
        .into());
    }
    let mut held: Vec<Option<Duration>> = answers
        .iter()
        .filter(|a| a.held)
        .map(|a| a.remaining)
        .collect();
    // Longest first, no expiry counting as longest: a majority holds the
    // lease for at least the quorum-th one.
    held.sort_by(|a, b| b.unwrap_or(Duration::MAX).cmp(&a.unwrap_or(Duration::MAX)));
    let majority_lease = held.get(quorum - 1).copied();
    Ok(Observed {
        held: majority_lease.is_some(),
        remaining: majority_lease.flatten(),
        fence: answers.iter().map(|a| a.fence).max().unwrap_or(0),
        queued: answers.iter().map(|a| a.queued).max().unwrap_or(0),
    })
}

impl Backend {
    /// Up to `limit` lock names under `prefix`, by `SCAN` (never `KEYS`);
    /// on Redlock the union over the nodes that answer.
    pub(crate) async fn scan_locks(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<String>, LockError> {
        let pattern = format!("{}L*", glob_escape(prefix));
        match self {
            Backend::Redis(b) => scan(b, &pattern, limit).await,
            Backend::Redlock(b) => {
                let mut names = Vec::new();
                for node in b.nodes() {
                    if let Ok(Ok(found)) =
                        timeout(b.node_timeout() * 10, scan(node, &pattern, limit)).await
                    {
                        names.extend(found);
                    }
                }
                names.sort();
                names.dedup();
                names.truncate(limit);
                Ok(names)
            }
            Backend::Memory(b) => Ok(b.lock_names(prefix, limit)),
        }
    }
}

async fn scan(node: &RedisBackend, pattern: &str, limit: usize) -> Result<Vec<String>, LockError> {
    if node.is_cluster() {
        return Err(LockError::Config(
            "listing locks needs one server (or a Sentinel group): on a cluster, list each \
             master by its own URL"
                .into(),
        ));
    }
    let mut conn = node.connection();
    let mut cursor = 0u64;
    let mut names = Vec::new();
    loop {
        let (next, found): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
            .map_err(|e| BackendError::with_source("cannot list the locks (SCAN)", e))?;
        names.extend(found);
        cursor = next;
        if cursor == 0 || names.len() >= limit {
            names.truncate(limit);
            return Ok(names);
        }
    }
}

/// `s` with the glob characters of `SCAN MATCH` escaped.
pub(super) fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}
