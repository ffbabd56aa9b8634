//! Reading a lock's state without touching it: [`Backend::inspect`].

use std::time::Duration;

use futures_util::future::join_all;
use tokio::time::timeout;

use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};

use super::Backend;
use super::conn::Conn;
use super::redis::RedisBackend;
use super::redlock::RedlockBackend;
use crate::error::{BackendError, LockError};
use crate::key::{Access, KeyNames, LockKind};

/// One holder as the backend keeps it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Holding {
    /// Its token as stored (the lock's value may end with `+`).
    pub(crate) token: String,
    /// The fencing token issued to it, where the backend keeps it per holder
    /// (read-write locks and semaphores; a mutex's is at most the counter).
    pub(crate) fencing: Option<u64>,
    /// Its lease left (`None`: set without expiry by hand).
    pub(crate) remaining: Option<Duration>,
}

/// What the backend holds for one lock (one kind of one key), read in one
/// step.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Observed {
    /// Somebody holds the lock.
    pub(crate) held: bool,
    /// The lease left; `None` when free, or held by a key without expiry
    /// (set by hand). Where several hold, the first holder's.
    pub(crate) remaining: Option<Duration>,
    /// The fencing counter of the key's slot: the highest token issued to
    /// any key there, so at least the holder's.
    pub(crate) fence: u64,
    /// Waiters in the key's queue.
    pub(crate) queued: usize,
    /// Who holds it, in the order they took it (by fencing token).
    pub(crate) holders: Vec<Holding>,
    /// The queued waiters' tokens, in line order (at most [`MAX_LISTED`]).
    pub(crate) waiting: Vec<String>,
}

impl Observed {
    /// A read-write lock's or a semaphore's state: its `holders` (put in
    /// the order they took it) and its `waiting` line.
    pub(crate) fn shared(mut holders: Vec<Holding>, waiting: Vec<String>, fence: u64) -> Self {
        // By fencing token where all have one (the embedded backend), else
        // (Redis: a lock taken free has no token until asked) by the time
        // in their tokens, to the ms, then as given (by lease end, to the us).
        if holders.iter().all(|h| h.fencing.is_some()) {
            holders.sort_by_key(|h| h.fencing);
        } else {
            holders.sort_by_key(|h| crate::token::public_part(&h.token).map(|(_, ms)| ms));
        }
        Self {
            held: !holders.is_empty(),
            remaining: holders.first().and_then(|h| h.remaining),
            fence,
            queued: waiting.len(),
            holders,
            waiting,
        }
    }
}

/// The three locks one key names: `lock(key)`, `rw_lock(key)` and
/// `semaphore(key, n)`.
#[derive(Clone, Debug, Default)]
pub(crate) struct Seen {
    pub(crate) mutex: Observed,
    pub(crate) rw: Observed,
    pub(crate) semaphore: Observed,
}

/// The most waiters (and shared holders) read for one lock.
pub(crate) const MAX_LISTED: usize = 1000;

impl Backend {
    /// The state of the three locks `key` names, read without changing them.
    pub(crate) async fn inspect(&self, prefix: &str, key: &str) -> Result<Seen, LockError> {
        let mutex = KeyNames::new(prefix, key);
        let rw = KeyNames::of_kind(prefix, key, LockKind::RwLock, Access::READ);
        let semaphore = KeyNames::of_kind(prefix, key, LockKind::Semaphore, Access::Shared(1));
        match self {
            Backend::Redis(b) => observe(b, &mutex, Some((&rw, &semaphore))).await,
            Backend::Redlock(b) => Ok(Seen {
                mutex: observe_majority(b, &mutex).await?,
                ..Seen::default()
            }),
            Backend::Memory(b) => Ok(Seen {
                mutex: b.observe(&mutex),
                rw: b.observe(&rw),
                semaphore: b.observe(&semaphore),
            }),
        }
    }
}

/// One server: the mutex of a key and, given their names, its read-write
/// lock and semaphore, in one round trip (one slot).
pub(crate) async fn observe(
    node: &RedisBackend,
    mutex: &KeyNames,
    shared: Option<(&KeyNames, &KeyNames)>,
) -> Result<Seen, LockError> {
    let last = (MAX_LISTED - 1).to_string();
    let mut pipe = redis::pipe();
    pipe.cmd("TIME")
        .cmd("GET")
        .arg(mutex.fence())
        .cmd("PTTL")
        .arg(&mutex.lock)
        .cmd("GET")
        .arg(&mutex.lock);
    line(&mut pipe, mutex, &last);
    if let Some((rw, _)) = shared {
        pipe.cmd("PTTL").arg(&rw.lock).cmd("GET").arg(&rw.lock);
    }
    for shared in shared.iter().flat_map(|(rw, semaphore)| [rw, semaphore]) {
        pipe.cmd("ZRANGE")
            .arg(&shared.holders)
            .arg(0)
            .arg(&last)
            .arg("WITHSCORES")
            .cmd("HGETALL")
            .arg(&shared.fences);
        line(&mut pipe, shared, &last);
    }
    let answers: Vec<redis::Value> = pipe
        .query_async(&mut node.connection())
        .await
        .map_err(|e| BackendError::with_source("cannot read the lock's state", e))?;
    let mut answers = answers.into_iter();
    let mut next = || -> Result<redis::Value, LockError> {
        answers
            .next()
            .ok_or_else(|| BackendError::new("the lock's state came back short").into())
    };
    let (secs, micros): (u64, u64) = parse(next()?)?;
    let now = secs * 1000 + micros / 1000;
    let fence: Option<u64> = parse(next()?)?;
    let fence = fence.unwrap_or(0);
    let mutex = {
        let pttl: i64 = parse(next()?)?;
        let value: Option<String> = parse(next()?)?;
        let entries: Vec<String> = parse(next()?)?;
        let deadlines: Vec<(String, f64)> = parse(next()?)?;
        let waiting = waiting(&entries, &deadlines, now);
        // A marked value, `token+deadline`, is held until the owner's
        // deadline; the key may live on past it, pinned for its line (see
        // acquire.lua).
        let (value, deadline) = match value {
            Some(value) => match value.split_once('+') {
                Some((token, deadline)) => (Some(token.to_owned()), deadline.parse::<u64>().ok()),
                None => (Some(value), None),
            },
            None => (None, None),
        };
        let (value, remaining) = match deadline {
            Some(deadline) if deadline <= now => (None, None),
            Some(deadline) => (value, Some(Duration::from_millis(deadline - now))),
            None => (value, u64::try_from(pttl).ok().map(Duration::from_millis)),
        };
        Observed {
            held: value.is_some(),
            remaining,
            fence,
            queued: waiting.len(),
            holders: value
                .map(|token| Holding {
                    token,
                    fencing: None,
                    remaining,
                })
                .into_iter()
                .collect(),
            waiting,
        }
    };
    if shared.is_none() {
        return Ok(Seen {
            mutex,
            ..Seen::default()
        });
    }
    let writer_pttl: i64 = parse(next()?)?;
    let writer: Option<String> = parse(next()?)?;
    let mut shared = [Observed::default(), Observed::default()];
    for seen in &mut shared {
        let holders: Vec<(String, f64)> = parse(next()?)?;
        let fences: std::collections::HashMap<String, u64> = parse(next()?)?;
        let entries: Vec<String> = parse(next()?)?;
        let deadlines: Vec<(String, f64)> = parse(next()?)?;
        let holders: Vec<Holding> = holders
            .into_iter()
            .filter(|(_, until)| *until > now as f64)
            .map(|(token, until)| Holding {
                fencing: fences.get(&token).copied(),
                remaining: Some(Duration::from_millis((until as u64).saturating_sub(now))),
                token,
            })
            .collect();
        *seen = Observed::shared(holders, waiting(&entries, &deadlines, now), fence);
    }
    let [mut rw, semaphore] = shared;
    if let Some(token) = writer {
        let remaining = u64::try_from(writer_pttl).ok().map(Duration::from_millis);
        rw.held = true;
        rw.remaining = remaining;
        rw.holders.insert(
            0,
            Holding {
                token,
                fencing: None,
                remaining,
            },
        );
    }
    Ok(Seen {
        mutex,
        rw,
        semaphore,
    })
}

/// Asks for a line of waiters: its first entries, and every entry's
/// deadline.
fn line(pipe: &mut redis::Pipeline, names: &KeyNames, last: &str) {
    let (queue, deadlines) = (names.queue(), names.deadlines());
    pipe.cmd("LRANGE").arg(queue).arg(0).arg(last);
    pipe.cmd("ZRANGE")
        .arg(deadlines)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES");
}

/// The tokens of a queue's `entries` still waiting at `now`: entries whose
/// wait ended (a waiter that gave up or died in line) are skipped, as the
/// scripts skip them (an entry with no deadline waits on).
fn waiting(entries: &[String], deadlines: &[(String, f64)], now: u64) -> Vec<String> {
    entries
        .iter()
        .filter(|entry| {
            deadlines
                .iter()
                .find(|(e, _)| e == *entry)
                .is_none_or(|(_, until)| *until > now as f64)
        })
        .map(|entry| entry_token(entry))
        .collect()
}

/// A queue entry's token: what comes before its first `:` (`token:lease`,
/// `token:lease:mode:limit`).
fn entry_token(entry: &str) -> String {
    entry.split(':').next().unwrap_or_default().to_owned()
}

fn parse<T: redis::FromRedisValue>(value: redis::Value) -> Result<T, LockError> {
    redis::from_redis_value(value)
        .map_err(|e| BackendError::with_source("cannot read the lock's state", e).into())
}

/// Redlock: held when a majority of nodes hold it, for the lease a majority
/// still has, by the token a majority agrees on; the highest counter.
/// Redlock's waiters do not queue.
async fn observe_majority(
    redlock: &RedlockBackend,
    names: &KeyNames,
) -> Result<Observed, LockError> {
    let per_node = redlock.node_timeout();
    let answers: Vec<Observed> = join_all(redlock.nodes().iter().map(|node| {
        timeout(per_node, async {
            observe(node, names, None).await.map(|seen| seen.mutex)
        })
    }))
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
    // The holder: the token a majority of the nodes hold.
    let tokens: Vec<&str> = answers
        .iter()
        .filter_map(|a| a.holders.first())
        .map(|h| h.token.as_str())
        .collect();
    let holder = tokens
        .iter()
        .find(|t| tokens.iter().filter(|u| u == t).count() >= quorum)
        .filter(|_| majority_lease.is_some());
    Ok(Observed {
        held: majority_lease.is_some(),
        remaining: majority_lease.flatten(),
        fence: answers.iter().map(|a| a.fence).max().unwrap_or(0),
        queued: 0,
        holders: holder
            .map(|token| Holding {
                token: (*token).to_owned(),
                fencing: None,
                remaining: majority_lease.flatten(),
            })
            .into_iter()
            .collect(),
        waiting: Vec::new(),
    })
}

impl Backend {
    /// Up to `limit` lock names under `prefix`, by `SCAN` (never `KEYS`):
    /// on a cluster, on each master; on Redlock the union over the nodes
    /// that answer.
    pub(crate) async fn scan_locks(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<String>, LockError> {
        // Mutexes, read-write locks (writer, readers), semaphores (holders),
        // idempotency records.
        let pattern = format!("{}[LWRPI]*", glob_escape(prefix));
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
    let mut conn = node.connection();
    if let Conn::Cluster(cluster) = &mut conn {
        return scan_masters(cluster, pattern, limit).await;
    }
    let mut names = Vec::new();
    let mut cursor = 0u64;
    loop {
        let (next, found): (u64, Vec<String>) = scan_command(cursor, pattern)
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

fn scan_command(cursor: u64, pattern: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("SCAN");
    cmd.arg(cursor)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        .arg(1000);
    cmd
}

/// A cluster: the masters from `CLUSTER NODES`, then `SCAN` on each (a
/// `SCAN` sent to the cluster would see one node's keys).
async fn scan_masters(
    cluster: &mut ClusterConnection,
    pattern: &str,
    limit: usize,
) -> Result<Vec<String>, LockError> {
    let nodes = cluster
        .route_command(
            redis::cmd("CLUSTER").arg("NODES").clone(),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
        )
        .await
        .and_then(|v| Ok(redis::from_redis_value::<String>(v)?))
        .map_err(|e| BackendError::with_source("cannot list the cluster's masters", e))?;
    let mut names = Vec::new();
    for (host, port) in masters(&nodes) {
        let mut cursor = 0u64;
        loop {
            let at = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                host: host.clone(),
                port,
            });
            let (next, found) = cluster
                .route_command(scan_command(cursor, pattern), at)
                .await
                .and_then(|v| Ok(redis::from_redis_value::<(u64, Vec<String>)>(v)?))
                .map_err(|e| {
                    BackendError::with_source(
                        format!("cannot list the locks on {host}:{port} (SCAN)"),
                        e,
                    )
                })?;
            names.extend(found);
            cursor = next;
            if names.len() >= limit {
                names.truncate(limit);
                return Ok(names);
            }
            if cursor == 0 {
                break;
            }
        }
    }
    Ok(names)
}

/// The addresses of the masters that serve slots, from `CLUSTER NODES`
/// (`<id> <host:port@cport[,hostname]> <flags> <master> <ping> <pong>
/// <epoch> <link> <slot> ...`).
fn masters(nodes: &str) -> Vec<(String, u16)> {
    nodes
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let flags = fields.get(2)?;
            let serving = fields.len() > 8;
            if !flags.split(',').any(|f| f == "master")
                || flags.contains("fail")
                || flags.contains("noaddr")
                || !serving
            {
                return None;
            }
            let address = fields.get(1)?.split(['@', ',']).next()?;
            let (host, port) = address.rsplit_once(':')?;
            Some((host.to_owned(), port.parse().ok()?))
        })
        .collect()
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

#[cfg(test)]
mod tests {
    #[test]
    fn the_masters_that_serve_slots_are_read_from_cluster_nodes() {
        let nodes = "\
a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460
b2 127.0.0.1:7001@17001,host-b master - 0 0 2 connected 5461-10922
c3 127.0.0.1:7003@17003 slave b2 0 0 2 connected
d4 127.0.0.1:7002@17002 master,fail - 0 0 3 connected 10923-16383
e5 127.0.0.1:7004@17004 master - 0 0 0 connected
";
        assert_eq!(
            super::masters(nodes),
            [
                ("127.0.0.1".to_owned(), 7000),
                ("127.0.0.1".to_owned(), 7001)
            ]
        );
    }
}
