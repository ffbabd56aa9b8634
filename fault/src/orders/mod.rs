//! Exactly once across crashes (scenario 13): the example order service
//! (`examples/src/bin/order-service.rs`) run as real processes, two
//! instances behind one Redis (and, for the PostgreSQL store, one
//! PostgreSQL), SIGKILLed and restarted at random moments while clients
//! create orders, each key retried until it gets a `2xx`. At the end every
//! key must have exactly one order, and every acknowledged response must
//! name it.
//!
//! The service commits each new order with its idempotency record
//! (`IdempotencyLayer::commit_on_lock_server` / `commit_with_postgres`, the
//! `Commit` extractor: one Redis script on the lock server, which completes
//! the record itself; one PostgreSQL transaction). The
//! controls run it with `IDEMPOTENCY_COMMIT=off` (the order first, the
//! record after: two commits a kill can fall between), and the count must
//! find the second orders that makes.
//!
//! * [`service`]: the `order-service` binary (built by cargo when needed)
//!   and its instances, killed and restarted on their ports.
//! * [`drive`]: the killer, the clients, and the count at the end.
//!
//! The lock workers, the fenced store and the checker of the other
//! scenarios take no part: what is checked is the service's own end state.

use std::time::{Duration, Instant};

use crate::checker::{Report, Violations};

pub mod drive;
pub mod service;

/// Where the order service keeps its orders (its locks and idempotency
/// claims are in Redis either way).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OrderStore {
    /// Orders in the Redis that holds the locks; records completed with
    /// them by one script on that server (`commit_on_lock_server`).
    Redis,
    /// Orders in a PostgreSQL of the run's own; records committed with them
    /// in one transaction (`commit_with_postgres`).
    Postgres,
}

/// What an exactly-once scenario runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OrderPlan {
    /// Where the orders are.
    pub store: OrderStore,
    /// The order commits with its idempotency record
    /// (`IDEMPOTENCY_COMMIT=on`); off in the controls.
    pub commit: bool,
    /// Concurrent clients, each with its own keys.
    pub clients: usize,
    /// Kills in the run: the clients take new keys until the last.
    pub kills: usize,
    /// One instance killed (and restarted at once) every this many ms,
    /// drawn uniformly.
    pub kill_every_ms: (u64, u64),
    /// `IDEMPOTENCY_LEASE_MS`: a killed claimer's key is free again after
    /// this.
    pub lease_ms: u64,
}

impl OrderPlan {
    /// The plan of the scenarios: 16 clients, `kills` kills 30-150 ms
    /// apart, a lease of 1 s.
    pub fn new(store: OrderStore, commit: bool, kills: usize) -> Self {
        Self {
            store,
            commit,
            clients: 16,
            kills,
            kill_every_ms: (30, 150),
            lease_ms: 1000,
        }
    }
}

/// What a run did besides its verdict (the table's notes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OrderStats {
    /// Requests sent: every try of every key.
    pub requests: u64,
    /// Of which got no `2xx` (cut off by a kill, refused while the key was
    /// claimed, timed out) and were tried again.
    pub failed: u64,
    /// Orders found at the end.
    pub orders: u64,
}

/// The verdict on a finished run: every key one order, every
/// acknowledgement naming it.
pub fn judge(ran: &drive::Ran) -> (Report, OrderStats) {
    let mut r = Report {
        operations: ran.keys.len() as u64,
        ..Report::default()
    };
    let mut v = Violations::default();
    let mut examples = Vec::new();
    let note = |examples: &mut Vec<String>, s: String| {
        if examples.len() < 20 {
            examples.push(s);
        }
    };
    let mut per_key: std::collections::HashMap<&str, Vec<u64>> = Default::default();
    for (id, item) in &ran.orders {
        per_key.entry(item.as_str()).or_default().push(*id);
    }
    for ids in per_key.values_mut() {
        ids.sort_unstable();
    }
    for key in &ran.keys {
        let ids = per_key
            .get(key.name.as_str())
            .map_or(&[][..], Vec::as_slice);
        if ids.len() > 1 {
            v.duplicate_orders += ids.len() as u64 - 1;
            note(
                &mut examples,
                format!(
                    "{}: {} orders (ids {ids:?}); acknowledged {:?}",
                    key.name,
                    ids.len(),
                    key.acknowledged.map(|(id, _)| id)
                ),
            );
        }
        match key.acknowledged {
            Some((id, at)) => {
                r.acquired += 1;
                r.max_wait_ms = r
                    .max_wait_ms
                    .max(ms(at.saturating_duration_since(key.first_try)));
                if ran.orders.get(&id) != Some(&key.name) {
                    v.mismatched_acks += 1;
                    note(
                        &mut examples,
                        format!(
                            "{}: acknowledged with order {id}, which is {}",
                            key.name,
                            match ran.orders.get(&id) {
                                Some(item) => format!("{item:?}'s"),
                                None => "not there".into(),
                            }
                        ),
                    );
                }
            }
            None => {
                v.keys_never_acknowledged += 1;
                note(
                    &mut examples,
                    format!(
                        "{}: no 2xx within {} s",
                        key.name,
                        drive::KEY_DEADLINE.as_secs()
                    ),
                );
            }
        }
    }
    // The longest time no request got a `2xx` while keys were left.
    let mut acks: Vec<Instant> = ran
        .keys
        .iter()
        .filter_map(|k| k.acknowledged.map(|(_, at)| at))
        .collect();
    acks.sort_unstable();
    let mut last = ran.started;
    for at in acks {
        let stall = ms(at.saturating_duration_since(last));
        if stall > r.max_stall_ms {
            r.max_stall_ms = stall;
            let since = last.saturating_duration_since(ran.started);
            r.max_stall_at = (since.as_micros() as u64, "the service".into());
        }
        last = at;
    }
    r.violations = v;
    r.examples = examples;
    let stats = OrderStats {
        requests: ran.requests,
        failed: ran.failed,
        orders: ran.orders.len() as u64,
    };
    (r, stats)
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_orders_wrong_acknowledgements_and_silent_keys_are_counted() {
        let started = Instant::now();
        let at = |ms: u64| started + Duration::from_millis(ms);
        let key = |name: &str, acknowledged: Option<(u64, Instant)>| drive::Key {
            name: name.into(),
            first_try: at(10),
            acknowledged,
        };
        let ran = drive::Ran {
            started,
            keys: vec![
                key("key-0", Some((1, at(50)))),
                // Two orders; the retry's answer names the second.
                key("key-1", Some((3, at(400)))),
                // Answered with another key's order.
                key("key-2", Some((1, at(420)))),
                key("key-3", None),
            ],
            kills: 3,
            requests: 9,
            failed: 4,
            orders: [(1, "key-0"), (2, "key-1"), (3, "key-1"), (4, "key-2")]
                .into_iter()
                .map(|(id, item)| (id, item.to_string()))
                .collect(),
        };
        let (r, stats) = judge(&ran);
        let v = &r.violations;
        assert_eq!(
            (
                v.duplicate_orders,
                v.mismatched_acks,
                v.keys_never_acknowledged
            ),
            (1, 1, 1),
            "{:?}",
            r.examples
        );
        assert_eq!((r.operations, r.acquired), (4, 3));
        assert_eq!(r.max_wait_ms, 410);
        assert_eq!(r.max_stall_ms, 350);
        assert_eq!(stats.orders, 4);
        // One order per key, each acknowledged with its own: nothing.
        let mut clean = ran;
        clean.keys.truncate(1);
        clean.orders.retain(|id, _| *id == 1);
        assert_eq!(judge(&clean).0.violations, Violations::default());
    }
}
