//! A dropped `LockClient` closes every connection it opened: its commands,
//! its notice subscriber, and (on a cluster) its push routing. Checked on
//! every Redis backend by the servers' own list of connected clients, which
//! must return to where it was before the client was built.

use std::time::Instant;

use lock_runtime::{LockClient, LockClientBuilder};
use test_support::RedisServer;
use test_support::helpers::{ms, secs};
use test_support::topology::{Cluster, Redlock, SentinelSetup, Topology, cli_port};

/// The clients the server on `port` lists (`CLIENT LIST`), without the
/// topology's own links (sentinels name theirs `sentinel-…`; replication
/// links are flagged `S` or `M`) and without the `redis-cli` asking.
fn connected(port: u16) -> u64 {
    let list = cli_port(port, &["CLIENT", "LIST"]);
    let field = |line: &str, name: &str| {
        line.split(' ')
            .find_map(|f| f.strip_prefix(name))
            .unwrap_or("")
            .to_owned()
    };
    list.lines()
        .filter(|l| l.starts_with("id="))
        .filter(|l| !field(l, "name=").starts_with("sentinel-"))
        .filter(|l| !field(l, "flags=").contains(['S', 'M']))
        .filter(|l| field(l, "cmd=") != "client|list")
        .count() as u64
}

fn port_of(url: &str) -> u16 {
    url.rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .unwrap_or_else(|| panic!("no port in {url}"))
}

/// The ports of `urls`.
fn ports_of(urls: &[String]) -> Vec<u16> {
    urls.iter().map(|u| port_of(u)).collect()
}

/// Connected clients per port.
fn census(ports: &[u16]) -> Vec<u64> {
    ports.iter().map(|&p| connected(p)).collect()
}

/// Builds two clients from `builder`, makes them use every kind of
/// connection they have (locks, a renewed lease, a waiter that subscribes to
/// notices and is woken by one), checks they did connect, drops them, and
/// waits until every server in `ports` counts as many clients as before.
async fn every_connection_closes_after_the_clients_are_dropped(
    builder: LockClientBuilder,
    ports: &[u16],
) {
    let before = census(ports);
    {
        let a = builder.clone().build().await.unwrap();
        let b = builder.build().await.unwrap();
        let key = format!("dropped:{}", std::process::id());
        let held = a.lock(&key).acquire().await.unwrap();
        let waiter = {
            let b: LockClient = b.clone();
            let key = key.clone();
            tokio::spawn(async move {
                let guard = b.lock(&key).wait(secs(5)).acquire().await.unwrap();
                guard.release().await.unwrap();
            })
        };
        tokio::time::sleep(ms(200)).await;
        held.release().await.unwrap();
        tokio::time::timeout(secs(5), waiter)
            .await
            .expect("the waiter was woken")
            .unwrap();
        // One guard is still held (its lease renewed) when the clients go.
        let _forgotten = a.lock(format!("{key}:kept")).acquire().await.unwrap();
        let during = census(ports);
        assert!(
            during.iter().sum::<u64>() > before.iter().sum::<u64>(),
            "the clients connected: {before:?} -> {during:?}"
        );
    }
    let started = Instant::now();
    loop {
        let now = census(ports);
        if now == before {
            println!(
                "{ports:?}: back to {before:?} clients {:?} after the drop",
                started.elapsed()
            );
            return;
        }
        assert!(
            started.elapsed() < secs(5),
            "connections outlived their clients: {before:?} before, {now:?} 5 s after the drop"
        );
        tokio::time::sleep(ms(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_single_redis_client_closes_its_connections() {
    let server = RedisServer::start();
    let builder = LockClient::builder().redis(server.url());
    every_connection_closes_after_the_clients_are_dropped(builder, &[server.port]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_redlock_client_closes_its_connections() {
    let masters = Redlock::start(3);
    let ports = ports_of(&masters.urls());
    every_connection_closes_after_the_clients_are_dropped(masters.builder(), &ports).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_sentinel_client_closes_its_connections() {
    let setup = SentinelSetup::start();
    let mut ports = vec![setup.master().port, setup.replica().port];
    ports.extend(ports_of(&setup.sentinel_urls()));
    every_connection_closes_after_the_clients_are_dropped(setup.builder(), &ports).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_cluster_client_closes_its_connections() {
    let cluster = Cluster::start(3);
    let ports = ports_of(&cluster.seed_urls());
    every_connection_closes_after_the_clients_are_dropped(cluster.builder(), &ports).await;
}

/// An observer of an election nobody leads ends with its client: its
/// receiver's `changed()` answers `Err` (updates stop) once the client is
/// dropped. Before, it waited for a notice or a lease that never came, its
/// task living on for as long as the receiver, which could not tell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_of_an_election_nobody_leads_ends_with_its_client() {
    let server = RedisServer::start();
    for builder in [
        LockClient::builder().memory(),
        LockClient::builder().redis(server.url()),
    ] {
        let client = builder.build().await.unwrap();
        let mut observed = client.leader("unled").observe().await.unwrap();
        assert!(observed.borrow().is_none());
        drop(client);
        let ended = tokio::time::timeout(secs(2), observed.changed()).await;
        assert!(
            matches!(ended, Ok(Err(_))),
            "the observer outlived its client: {ended:?}"
        );
    }
}
