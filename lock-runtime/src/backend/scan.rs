//! Finding lock names without `KEYS`: `SCAN` on one server, on every
//! master of a cluster, or on each Redlock node ([`Backend::scan_locks`]).

use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use tokio::time::timeout;

use super::Backend;
use super::conn::Conn;
use super::redis::RedisBackend;
use crate::error::{BackendError, LockError};

/// Which of the names found count (those of the keys asked for).
pub(crate) type Keep<'a> = &'a (dyn Fn(&str) -> bool + Sync);

impl Backend {
    /// Up to `limit` lock names under `prefix` that `keep` keeps, by `SCAN`
    /// (never `KEYS`; names it does not keep do not count toward `limit`):
    /// on a cluster, on each master; on Redlock the union over the nodes
    /// that answer.
    pub(crate) async fn scan_locks(
        &self,
        prefix: &str,
        limit: usize,
        keep: Keep<'_>,
    ) -> Result<Vec<String>, LockError> {
        // Mutexes, read-write locks (writer, readers), semaphores (holders),
        // idempotency records.
        let pattern = format!("{}[LWRPI]*", glob_escape(prefix));
        match self {
            Backend::Redis(b) => scan(b, &pattern, limit, keep).await,
            Backend::Redlock(b) => {
                let mut names = Vec::new();
                for node in b.nodes() {
                    if let Ok(Ok(found)) =
                        timeout(b.node_timeout() * 10, scan(node, &pattern, limit, keep)).await
                    {
                        names.extend(found);
                    }
                }
                names.sort();
                names.dedup();
                names.truncate(limit);
                Ok(names)
            }
            Backend::Memory(b) => Ok(b.lock_names(prefix, limit, keep)),
        }
    }
}

async fn scan(
    node: &RedisBackend,
    pattern: &str,
    limit: usize,
    keep: Keep<'_>,
) -> Result<Vec<String>, LockError> {
    let mut conn = node.connection();
    if let Conn::Cluster(cluster) = &mut conn {
        return scan_masters(cluster, pattern, limit, keep).await;
    }
    let mut names = Vec::new();
    let mut cursor = 0u64;
    loop {
        let (next, found): (u64, Vec<String>) = scan_command(cursor, pattern)
            .query_async(&mut conn)
            .await
            .map_err(|e| BackendError::with_source("cannot list the locks (SCAN)", e))?;
        names.extend(found.into_iter().filter(|name| keep(name)));
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
    keep: Keep<'_>,
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
            names.extend(found.into_iter().filter(|name| keep(name)));
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
pub(crate) fn glob_escape(s: &str) -> String {
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
