//! Reading a lock's state without touching it: [`Backend::inspect`].

use std::time::Duration;

use futures_util::future::join_all;
use tokio::time::timeout;

use super::Backend;
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
