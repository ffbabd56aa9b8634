//! Leader elections' records, read without touching them: who leads one
//! name ([`Backend::leader`]), every name ([`Backend::scan_leaders`]), and
//! the notices an observer follows ([`Backend::observe_notices`]).
//!
//! A leader's record is `<term>:<label>` under the name's `A` key, written
//! by the script call that grants or hands over the election's lock, with
//! the lease's expiry (renewed with it), deleted by a release that hands
//! over to nobody (see acquire.lua, release.lua, extend.lua). On the
//! embedded backend the record is the held lock itself.

use std::time::Duration;

use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};

use super::Backend;
use super::conn::Conn;
use super::inspect::Observed;
use super::redis::RedisBackend;
use super::waiters::WaitHandle;
use crate::backoff::Retry;
use crate::error::{BackendError, LockError};
use crate::key::{KeyNames, parse};

/// One leader as a record says: label, term, lease left.
pub(crate) type LeaderEntry = (String, u64, Duration);

/// Reads `<term>:<label>`.
fn parse_record(value: &str, pttl: i64) -> Option<LeaderEntry> {
    let (term, label) = value.split_once(':')?;
    let term = term.parse().ok()?;
    // No expiry (-1) cannot be set by the scripts; read as "now".
    let left = Duration::from_millis(u64::try_from(pttl).unwrap_or(0));
    Some((label.to_owned(), term, left))
}

impl Backend {
    /// The leader of the election `names`, if anybody leads it. A read:
    /// sent again once after a broken connection (one the server closed
    /// while idle is only found broken by the next command).
    pub(crate) async fn leader(&self, names: &KeyNames) -> Result<Option<LeaderEntry>, LockError> {
        match self {
            Backend::Redis(b) => {
                let read = || async { read(&mut b.connection(), &names.record).await };
                Retry::ONCE.start().send("leader: read", None, read).await
            }
            Backend::Memory(b) => Ok(b.leader(names)),
            Backend::Redlock(_) => Err(not_on_redlock()),
        }
    }

    /// The lock behind the election `names`, read as
    /// [`inspect`](Backend::inspect) reads a mutex: the leader's token and
    /// the candidates' in line (nothing on Redlock, which has no elections).
    pub(crate) async fn observe_leader(&self, names: &KeyNames) -> Result<Observed, LockError> {
        match self {
            Backend::Redis(b) => Ok(super::inspect::observe(b, names, None).await?.mutex),
            Backend::Memory(b) => Ok(b.observe(names)),
            Backend::Redlock(_) => Ok(Observed::default()),
        }
    }

    /// Registers an observer (`id`, unique in this client) of `channel`:
    /// woken by every notice there (see [`super::waiters::OBSERVER`]).
    /// Returns once notices reach this process (or subscribing failed:
    /// then the observer wakes at its lease timer).
    pub(crate) async fn observe_notices(
        &self,
        channel: &str,
        id: u64,
    ) -> Result<WaitHandle, LockError> {
        let id = format!("{}{id}", super::waiters::OBSERVER);
        match self {
            Backend::Redis(b) => Ok(b.register_id(channel, &id).await),
            Backend::Redlock(_) => Err(not_on_redlock()),
            Backend::Memory(b) => Ok(b.register_id(channel, &id)),
        }
    }

    /// Up to `limit` leaders under `prefix` whose names start with
    /// `starting_with`, by `SCAN` (never `KEYS`), every master of a cluster
    /// one after the other: (name, label, term, lease left), by name.
    pub(crate) async fn scan_leaders(
        &self,
        prefix: &str,
        starting_with: &str,
        limit: usize,
    ) -> Result<Vec<(String, LeaderEntry)>, LockError> {
        let mut found = match self {
            Backend::Memory(b) => b.leaders(prefix),
            Backend::Redlock(_) => return Err(not_on_redlock()),
            // Sent again once after a broken connection, as `leader`.
            Backend::Redis(b) => {
                let scan = || scan_records(b, prefix, starting_with, limit);
                Retry::ONCE
                    .start()
                    .send("leaders: scan", None, scan)
                    .await?
            }
        };
        found.retain(|(name, _)| name.starts_with(starting_with));
        found.sort_by(|a, b| a.0.cmp(&b.0));
        found.truncate(limit);
        Ok(found)
    }
}

fn not_on_redlock() -> LockError {
    LockError::Config("leader election is not offered on Redlock (see `LockClient::leader`)".into())
}

/// `GET` and `PTTL` of a record, in one round trip. Not in a `MULTI`,
/// which the least-privilege ACL does not allow (docs/keys.md; refused, it
/// also made redis-rs 1.8 panic): a record written between the two reads
/// is read with the next one's lease left, a moment apart, and its change
/// is announced to observers anyway.
async fn read(conn: &mut Conn, record: &str) -> Result<Option<LeaderEntry>, LockError> {
    let (value, pttl): (Option<String>, i64) = redis::pipe()
        .get(record)
        .pttl(record)
        .query_async(conn)
        .await
        .map_err(|e| BackendError::with_source("cannot read the leader's record", e))?;
    Ok(value.and_then(|v| parse_record(&v, pttl)))
}

/// The records under `prefix` on one server, or on each master of a cluster.
async fn scan_records(
    node: &RedisBackend,
    prefix: &str,
    starting_with: &str,
    limit: usize,
) -> Result<Vec<(String, LeaderEntry)>, LockError> {
    let mut conn = node.connection();
    let pattern = format!("{}A*", super::scan::glob_escape(prefix));
    let masters = match &mut conn {
        Conn::Cluster(cluster) => {
            let slots = cluster
                .route_command(
                    redis::cmd("CLUSTER").arg("SLOTS").clone(),
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
                )
                .await
                .map_err(|e| BackendError::with_source("cannot list the cluster's masters", e))?;
            masters_of(&slots)
        }
        _ => vec![None],
    };
    let mut names = Vec::new();
    for master in masters {
        let mut cursor = 0u64;
        loop {
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000);
            let answer = match (&mut conn, &master) {
                (Conn::Cluster(cluster), Some((host, port))) => {
                    let at = SingleNodeRoutingInfo::ByAddress {
                        host: host.clone(),
                        port: *port,
                    };
                    cluster
                        .route_command(cmd, RoutingInfo::SingleNode(at))
                        .await
                        .and_then(|v| Ok(redis::from_redis_value(v)?))
                }
                _ => cmd.query_async(&mut conn).await,
            };
            let (next, found): (u64, Vec<String>) = answer
                .map_err(|e| BackendError::with_source("cannot list the leaders (SCAN)", e))?;
            names.extend(found.into_iter().filter(|name| {
                parse(prefix, name)
                    .is_some_and(|(kind, key)| kind == 'A' && key.starts_with(starting_with))
            }));
            cursor = next;
            if cursor == 0 || names.len() >= limit {
                break;
            }
        }
        if names.len() >= limit {
            break;
        }
    }
    let mut leaders = Vec::new();
    for name in names {
        let Some((_, key)) = parse(prefix, &name) else {
            continue;
        };
        let names = KeyNames::leader(prefix, &key);
        // Read through the key's own connection (its slot's master).
        if let Some(record) = read(&mut node.connection(), &names.record).await? {
            leaders.push((key, record));
        }
    }
    Ok(leaders)
}

/// The masters' addresses in a `CLUSTER SLOTS` answer.
fn masters_of(slots: &redis::Value) -> Vec<Option<(String, u16)>> {
    let mut masters = Vec::new();
    let redis::Value::Array(ranges) = slots else {
        return masters;
    };
    for range in ranges {
        let redis::Value::Array(fields) = range else {
            continue;
        };
        let Some(redis::Value::Array(master)) = fields.get(2) else {
            continue;
        };
        let (Some(host), Some(port)) = (master.first(), master.get(1)) else {
            continue;
        };
        let (Ok(host), Ok(port)) = (
            redis::from_redis_value_ref::<String>(host),
            redis::from_redis_value_ref::<u16>(port),
        ) else {
            continue;
        };
        if !masters.contains(&Some((host.clone(), port))) {
            masters.push(Some((host, port)));
        }
    }
    masters
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_read_back_with_labels_that_hold_colons() {
        assert_eq!(
            parse_record("7:host:12", 1500),
            Some(("host:12".into(), 7, Duration::from_millis(1500)))
        );
        assert_eq!(parse_record("x:host", 10), None);
        assert_eq!(parse_record("nolabel", 10), None);
    }
}
