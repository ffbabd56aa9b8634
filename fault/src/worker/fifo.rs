//! Scenario 12's acquire: a mutex with a fixed lease (`renew(false)`),
//! either waiting (and then found in the key's queue of waiters, logged as
//! `Queued`) or trying once (`TryOnce`), for the checker's FIFO rule
//! ([`crate::checker::fifo`]).
//!
//! The library does not tell its caller when an attempt found the key busy
//! and queued it, so a waiting acquire is watched from outside: while it is
//! pending, a connection of its own reads the key's queue (`LRANGE`, every
//! millisecond) until the worker's entry shows up. Entries are
//! `token:lease_ms`, and each worker of the scenario has a lease of its own
//! (the harness gives worker `n` the scenario's lease less `n`), so the
//! suffix names the worker; entries with that suffix already in the queue
//! before the attempt (none, unless an earlier wait of this worker left one)
//! are not taken for this one. The answer of the first read that lists the
//! entry is a time at which the worker surely stood in line: a little later
//! than the attempt's busy answer, never earlier, which makes the rule's
//! premise ("A was in line before B was attempted") hold less often, never
//! wrongly.

use std::collections::HashSet;
use std::time::Duration;

use lock_runtime::{LockError, LockGuard};
use redis::aio::ConnectionManager;

use super::acquiring::{acquire, attempt, granted, request};
use super::{Worker, WorkerConfig};
use crate::log::Event;

/// The key prefix the workers' clients use (the library's default).
const PREFIX: &str = "lock:";

/// A connection to the lock server for reading queues.
pub(super) struct Probe {
    conn: ConnectionManager,
}

impl Probe {
    /// Connects to the lock server of `config` (on Sentinel: the master the
    /// first sentinel names; scenario 12 has no failover).
    pub(super) async fn connect(config: &WorkerConfig) -> Result<Self, String> {
        let first = config.lock_url.split(',').next().unwrap_or_default();
        let url = match config.topology.strip_prefix("sentinel:") {
            Some(master) => {
                let client = redis::Client::open(first).map_err(|e| e.to_string())?;
                let mut conn = client
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(|e| e.to_string())?;
                let (host, port): (String, u16) = redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(master)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| format!("the sentinel names no master: {e}"))?;
                format!("redis://{host}:{port}")
            }
            None => first.to_owned(),
        };
        let client = redis::Client::open(url).map_err(|e| e.to_string())?;
        let conn = ConnectionManager::new(client)
            .await
            .map_err(|e| e.to_string())?;
        Ok(Self { conn })
    }

    /// The entries of `queue`, in line order.
    async fn members(&mut self, queue: &str) -> redis::RedisResult<Vec<String>> {
        redis::cmd("LRANGE")
            .arg(queue)
            .arg(0)
            .arg(-1)
            .query_async(&mut self.conn)
            .await
    }
}

/// The queue of waiters of `key` (a key without braces, as the scenario's
/// `k0` ...: `prefix + 'Q' + '{' + key + '}'`, see `lock-runtime/src/key`).
pub(super) fn queue_name(key: &str) -> String {
    format!("{PREFIX}Q{{{key}}}")
}

/// Logs the attempt on `key`, then tries once (a share of the operations)
/// or waits, watching the queue; logs the grant. `None`: not acquired
/// (logged).
pub(super) async fn acquire_one(w: &mut Worker, op: u64, key: &str) -> Option<(LockGuard, u64)> {
    let once = w.rng.chance(w.config.try_once_per_mille.unwrap_or(0));
    let guard = if once {
        try_once(w, op, key).await?
    } else {
        waiting(w, op, key).await?
    };
    Some(granted(w, op, guard))
}

/// A try-once acquire (wait 0): never queued.
async fn try_once(w: &mut Worker, op: u64, key: &str) -> Option<LockGuard> {
    attempt(w, op, &[key.to_owned()], None);
    let answer = request(w, key, None).wait(Duration::ZERO).acquire().await;
    let t = w.clock.now();
    let guard = match answer {
        Ok(guard) => Some(guard),
        Err(LockError::Busy { .. }) => None,
        Err(e) => {
            w.log(Event::AcquireError {
                op,
                error: e.to_string(),
                t,
            });
            None
        }
    };
    let granted = guard.is_some();
    w.log(Event::TryOnce { op, granted, t });
    guard
}

/// A waiting acquire, watched until it shows up in the key's queue.
async fn waiting(w: &mut Worker, op: u64, key: &str) -> Option<LockGuard> {
    let queue = queue_name(key);
    let mine = format!(":{}", w.config.ttl_ms);
    let Some(mut probe) = w.probe.take() else {
        // No probe (it could not connect): wait unwatched.
        let started = attempt(w, op, &[key.to_owned()], None);
        return acquire(w, op, started, |w, left| {
            request(w, key, None).wait(left).acquire()
        })
        .await;
    };
    // Entries of ours from before this attempt are not this one's.
    let before: HashSet<String> = probe
        .members(&queue)
        .await
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.ends_with(&mine))
        .collect();
    let clock = w.clock;
    let started = attempt(w, op, &[key.to_owned()], None);
    let (guard, seen) = {
        let acquiring = acquire(w, op, started, |w, left| {
            request(w, key, None).wait(left).acquire()
        });
        let watching = async {
            loop {
                match probe.members(&queue).await {
                    Ok(members)
                        if members
                            .iter()
                            .any(|e| e.ends_with(&mine) && !before.contains(e)) =>
                    {
                        return Some(clock.now());
                    }
                    Ok(_) => tokio::time::sleep(Duration::from_millis(1)).await,
                    Err(_) => return None,
                }
            }
        };
        tokio::pin!(acquiring, watching);
        let mut seen = None;
        let mut watched = false;
        let guard = loop {
            tokio::select! {
                biased;
                guard = &mut acquiring => break guard,
                t = &mut watching, if !watched => {
                    watched = true;
                    seen = t;
                }
            }
        };
        (guard, seen)
    };
    w.probe = Some(probe);
    if let Some(t) = seen {
        w.log(Event::Queued { op, t });
    }
    guard
}

#[cfg(test)]
mod tests {
    use super::*;
    use lock_runtime::LockClient;
    use test_support::RedisServer;

    #[test]
    fn a_waiter_is_found_in_the_queue_by_its_lease() {
        let server = RedisServer::try_start(&[]).expect("redis-server");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let client = LockClient::builder()
                .redis(server.url())
                .build()
                .await
                .unwrap();
            let holder = client
                .lock("k0")
                .ttl(Duration::from_secs(5))
                .acquire()
                .await
                .unwrap();
            let waiter = client
                .clone()
                .lock("k0")
                .ttl(Duration::from_millis(477))
                .wait(Duration::from_secs(5));
            let waiting =
                tokio::spawn(async move { waiter.acquire().await.map(|g| g.fencing_token()) });
            let conn = redis::Client::open(server.url()).unwrap();
            let mut conn = conn.get_multiplexed_async_connection().await.unwrap();
            let mut found: Vec<String> = Vec::new();
            for _ in 0..200 {
                found = redis::cmd("LRANGE")
                    .arg(queue_name("k0"))
                    .arg(0)
                    .arg(-1)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                if !found.is_empty() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            assert_eq!(found.len(), 1, "{found:?}");
            assert!(found[0].ends_with(":477"), "{found:?}");
            holder.release().await.unwrap();
            assert!(waiting.await.unwrap().is_ok());
        });
    }
}
