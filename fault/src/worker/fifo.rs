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
//!
//! The watch goes on until the acquire returns (a read every 2 ms once the
//! entry was seen), and each read also takes the key's deadlines (the
//! sorted set beside the list) and the lock key itself, in one `MULTI`, so
//! that it sees (a) when the entry leaves the line (`Left`), and whether the
//! key was then handed to this waiter (the lock key names its token), (b) a
//! hand-over that ran out before the waiter took the key up (`Lapsed`: the
//! key stopped naming it while the acquire was still pending), after which
//! the waiter queues again (a second `Queued`), and (c) a list and sorted
//! set that disagree (`QueueMismatch`). The gap between two reads tells how
//! long the process went unscheduled.
//!
//! `FAULT_STALL_HANDED_MS=N` in the harness's environment (a demonstration,
//! off by default) makes a worker stall, as an unscheduled process would:
//! in one waiting operation in [`STALL_EVERY`], the watcher blocks the
//! process's one runtime thread for N ms once it sees the key handed to
//! it, so that a hand-over lapses when N is more than the lease.

use std::collections::HashSet;
use std::time::Duration;

use lock_runtime::{LockError, LockGuard};
use redis::aio::ConnectionManager;

use super::acquiring::{acquire, attempt, granted, request};
use super::{Worker, WorkerConfig};
use crate::log::Event;

/// The key prefix the workers' clients use (the library's default).
const PREFIX: &str = "lock:";

/// One waiting operation in this many stalls (`FAULT_STALL_HANDED_MS`).
pub(super) const STALL_EVERY: u64 = 20;

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

    /// One atomic read of `key`'s queue (in line order), its deadlines'
    /// members, and the lock key's value.
    async fn read(&mut self, key: &str) -> redis::RedisResult<Snapshot> {
        let (queue, deadlines, owner): (Vec<String>, Vec<String>, Option<String>) = redis::pipe()
            .atomic()
            .cmd("LRANGE")
            .arg(queue_name(key))
            .arg(0)
            .arg(-1)
            .cmd("ZRANGE")
            .arg(name(key, 'D'))
            .arg(0)
            .arg(-1)
            .cmd("GET")
            .arg(name(key, 'L'))
            .query_async(&mut self.conn)
            .await?;
        Ok(Snapshot {
            queue,
            deadlines,
            owner,
        })
    }
}

/// What one read of the probe found.
struct Snapshot {
    /// The queue's entries, in line order.
    queue: Vec<String>,
    /// The deadlines' members (the same entries, if the two agree).
    deadlines: Vec<String>,
    /// The lock key's value: the owner's token, with a '+' when marked.
    owner: Option<String>,
}

/// `key`'s Redis name for `role` (the library's one-letter roles: `L` the
/// lock, `Q` the queue, `D` its deadlines), as `lock-runtime/src/key` names
/// it for a key without braces.
fn name(key: &str, role: char) -> String {
    format!("{PREFIX}{role}{{{key}}}")
}

/// The queue of waiters of `key` (a key without braces, as the scenario's
/// `k0` ...: `prefix + 'Q' + '{' + key + '}'`, see `lock-runtime/src/key`).
pub(super) fn queue_name(key: &str) -> String {
    name(key, 'Q')
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
    granted(w, op, guard).await
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

/// A waiting acquire, watched until it returns (see the module's text).
async fn waiting(w: &mut Worker, op: u64, key: &str) -> Option<LockGuard> {
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
        .read(key)
        .await
        .map(|s| s.queue)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.ends_with(&mine))
        .collect();
    let clock = w.clock;
    let started = attempt(w, op, &[key.to_owned()], None);
    let mut watch = Watch::new(op, mine, before);
    watch.stall = std::env::var("FAULT_STALL_HANDED_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|_| op % STALL_EVERY == STALL_EVERY - 1)
        .map(Duration::from_millis);
    let guard = {
        let acquiring = acquire(w, op, started, |w, left| {
            request(w, key, None).wait(left).acquire()
        });
        let watching = async {
            let mut last = clock.now();
            loop {
                let Ok(snapshot) = probe.read(key).await else {
                    // The probe failed: stop watching.
                    break;
                };
                let t = clock.now();
                watch.saw(&snapshot, t, t.saturating_sub(last));
                last = t;
                let pause = if watch.seen { 2 } else { 1 };
                tokio::time::sleep(Duration::from_millis(pause)).await;
            }
        };
        tokio::pin!(acquiring, watching);
        tokio::select! {
            biased;
            guard = &mut acquiring => guard,
            () = &mut watching => acquiring.await,
        }
    };
    w.probe = Some(probe);
    for event in watch.events {
        w.log(event);
    }
    guard
}

/// Where a watched waiter stands, as the probe's reads show it.
enum Stand {
    /// Not (or no longer) in line.
    Out,
    /// In line as this entry (`token:lease_ms`).
    InLine(String),
    /// Left the line with the key handed to it (its token), not taken up
    /// yet; the longest gap between reads since.
    Handed { token: String, max_gap: u64 },
}

/// The watcher of one waiting acquire: what it saw, as log lines to write
/// once the acquire returns.
struct Watch {
    op: u64,
    /// The suffix of this worker's entries (`:lease_ms`).
    mine: String,
    /// Entries of ours that were there before the attempt.
    before: HashSet<String>,
    stand: Stand,
    /// Seen in line at least once.
    seen: bool,
    /// A `QueueMismatch` was logged already.
    mismatched: bool,
    /// Block the process this long once the key is seen handed to it
    /// (`FAULT_STALL_HANDED_MS`; taken when used).
    stall: Option<Duration>,
    events: Vec<Event>,
}

impl Watch {
    fn new(op: u64, mine: String, before: HashSet<String>) -> Self {
        Self {
            op,
            mine,
            before,
            stand: Stand::Out,
            seen: false,
            mismatched: false,
            stall: None,
            events: Vec::new(),
        }
    }

    /// One read's findings, answered at `t`, `gap` µs after the previous.
    fn saw(&mut self, s: &Snapshot, t: u64, gap: u64) {
        let op = self.op;
        if !self.mismatched {
            let list: HashSet<&String> = s.queue.iter().collect();
            let set: HashSet<&String> = s.deadlines.iter().collect();
            if list != set || list.len() != s.queue.len() {
                self.mismatched = true;
                self.events.push(Event::QueueMismatch {
                    op,
                    t,
                    // A duplicate in the list shows up here too.
                    list_only: (0..s.queue.len())
                        .filter(|&i| {
                            !set.contains(&s.queue[i]) || s.queue[..i].contains(&s.queue[i])
                        })
                        .map(|i| s.queue[i].clone())
                        .collect(),
                    set_only: set.difference(&list).map(|e| (*e).clone()).collect(),
                });
            }
        }
        let ours = s
            .queue
            .iter()
            .find(|e| e.ends_with(&self.mine) && !self.before.contains(*e));
        let owner = s.owner.as_deref().unwrap_or_default();
        if let Stand::Handed { token, max_gap } = &mut self.stand {
            *max_gap = (*max_gap).max(gap);
            if owner.split('+').next().unwrap_or_default() != token.as_str() {
                self.events.push(Event::Lapsed {
                    op,
                    t,
                    max_gap_us: *max_gap,
                });
                self.stand = Stand::Out;
            }
        }
        match (&self.stand, ours) {
            (Stand::Out, Some(entry)) => {
                self.seen = true;
                self.events.push(Event::Queued { op, t });
                self.stand = Stand::InLine(entry.clone());
            }
            (Stand::InLine(entry), None) => {
                let token = entry.split(':').next().unwrap_or_default().to_owned();
                let handed = owner.split('+').next().unwrap_or_default() == token;
                self.events.push(Event::Left {
                    op,
                    t,
                    handed,
                    gap_us: gap,
                });
                self.stand = if handed {
                    Stand::Handed { token, max_gap: 0 }
                } else {
                    Stand::Out
                };
                if let Some(stall) = self.stall.take().filter(|_| handed) {
                    // The whole process stops (one runtime thread), the
                    // library's confirmation of the hand-over included.
                    std::thread::sleep(stall);
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lock_runtime::LockClient;
    use test_support::RedisServer;

    fn snapshot(queue: &[&str], deadlines: &[&str], owner: Option<&str>) -> Snapshot {
        let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
        Snapshot {
            queue: strings(queue),
            deadlines: strings(deadlines),
            owner: owner.map(str::to_owned),
        }
    }

    #[test]
    fn the_watch_sees_a_hand_over_lapse_and_the_waiter_queue_again() {
        let mut watch = Watch::new(7, ":477".into(), HashSet::new());
        let line = ["b:490", "a:477"];
        // Not in line yet; then in line behind b; then b got the key.
        watch.saw(&snapshot(&["b:490"], &["b:490"], Some("h+")), 10, 1);
        watch.saw(&snapshot(&line, &line, Some("h+")), 11, 1);
        watch.saw(&snapshot(&["a:477"], &["a:477"], Some("b+")), 13, 2);
        // Handed to a; the process goes unscheduled; the key goes on to c.
        watch.saw(&snapshot(&[], &[], Some("a")), 15, 2);
        watch.saw(&snapshot(&[], &[], Some("a")), 17, 2);
        watch.saw(&snapshot(&[], &[], Some("c")), 500, 483);
        // a queues again.
        watch.saw(&snapshot(&["a:477"], &["a:477"], Some("c")), 502, 2);
        assert_eq!(
            watch.events,
            vec![
                Event::Queued { op: 7, t: 11 },
                Event::Left {
                    op: 7,
                    t: 15,
                    handed: true,
                    gap_us: 2
                },
                Event::Lapsed {
                    op: 7,
                    t: 500,
                    max_gap_us: 483
                },
                Event::Queued { op: 7, t: 502 },
            ]
        );
        // Left the line while the key names someone else (a wait given
        // up): not handed, and nothing lapses.
        let mut watch = Watch::new(1, ":477".into(), HashSet::new());
        watch.saw(&snapshot(&["a:477"], &["a:477"], Some("h+")), 1, 1);
        watch.saw(&snapshot(&[], &[], Some("h")), 3, 2);
        watch.saw(&snapshot(&[], &[], Some("x")), 5, 2);
        assert_eq!(
            watch.events[1],
            Event::Left {
                op: 1,
                t: 3,
                handed: false,
                gap_us: 2
            }
        );
        assert_eq!(watch.events.len(), 2, "{:?}", watch.events);
    }

    #[test]
    fn the_watch_reports_a_queue_whose_list_and_deadlines_disagree_once() {
        let mut watch = Watch::new(1, ":477".into(), HashSet::new());
        watch.saw(&snapshot(&["a:477"], &["a:477"], Some("h+")), 1, 1);
        assert!(!watch.mismatched);
        // A duplicate in the list, and an entry only in the set.
        watch.saw(
            &snapshot(
                &["a:477", "b:490", "a:477"],
                &["a:477", "c:480"],
                Some("h+"),
            ),
            3,
            2,
        );
        watch.saw(&snapshot(&["z:1"], &[], Some("h+")), 5, 2);
        let mismatches: Vec<&Event> = watch
            .events
            .iter()
            .filter(|e| matches!(e, Event::QueueMismatch { .. }))
            .collect();
        assert_eq!(
            mismatches,
            vec![&Event::QueueMismatch {
                op: 1,
                t: 3,
                list_only: vec!["b:490".into(), "a:477".into()],
                set_only: vec!["c:480".into()],
            }]
        );
    }

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
            let waiting = tokio::spawn(async move {
                let guard = waiter.acquire().await?;
                guard.fencing_token().await
            });
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
