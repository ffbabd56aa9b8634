//! A Redis Cluster of masters only.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::topology::{cli_port, info_field, pipeline, poll, sorted_keys};
use crate::{RedisServer, TlsFiles, free_port};

/// A slot on its way from node `from` to node `to` (see
/// [`Cluster::begin_migration`]).
#[derive(Clone, Copy, Debug)]
pub struct Migration {
    /// The slot.
    pub slot: u16,
    /// The node it leaves.
    pub from: usize,
    /// The node it goes to.
    pub to: usize,
}

/// The number of hash slots of Redis Cluster.
pub const SLOTS: u16 = 16384;

/// A Redis Cluster of masters only, on loopback, built with
/// `redis-cli --cluster create ... --cluster-replicas 0`.
pub struct Cluster {
    nodes: Vec<RedisServer>,
    ids: Vec<String>,
}

impl Cluster {
    /// Starts `n` (at least 3) cluster-enabled servers, creates the cluster
    /// and waits until every node reports `cluster_state:ok` and agrees on
    /// the owner of every slot.
    pub fn start(n: usize) -> Self {
        Self::start_with(n, None)
    }

    /// [`Cluster::start`] with TLS only (`--tls-cluster yes`, the bus too),
    /// asking clients for certificates (`--tls-auth-clients yes`): `files`'
    /// server certificate serves as `redis-cli`'s own.
    pub fn start_tls(n: usize, files: &TlsFiles) -> Self {
        Self::start_with(n, Some(files))
    }

    fn start_with(n: usize, tls: Option<&TlsFiles>) -> Self {
        assert!(
            n >= 3,
            "redis-cli --cluster create needs at least 3 masters"
        );
        let nodes: Vec<RedisServer> = (0..n).map(|_| start_node(tls)).collect();
        for (i, node) in nodes.iter().enumerate() {
            assert!(
                node.dir().join("nodes.conf").exists(),
                "node {i} writes its cluster config into its own temp dir"
            );
        }
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let mut cli = Command::new("redis-cli");
        if let Some(files) = tls {
            cli.arg("--tls").arg("--cacert").arg(&files.ca);
            cli.arg("--cert")
                .arg(&files.cert)
                .arg("--key")
                .arg(&files.key);
        }
        let out = cli
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli --cluster create");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("[OK] All 16384 slots covered"),
            "redis-cli --cluster create failed: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let ids = nodes.iter().map(|n| n.cli(&["CLUSTER", "MYID"])).collect();
        let cluster = Self { nodes, ids };
        cluster.wait_consistent(Duration::from_secs(20));
        cluster
    }

    /// Waits until every node says `cluster_state:ok`, knows every other
    /// node as connected, and all nodes agree on every slot's owner.
    pub fn wait_consistent(&self, limit: Duration) {
        poll(
            limit,
            "the cluster is ok and consistent on every node",
            || {
                let mut maps = Vec::new();
                for (i, node) in self.nodes.iter().enumerate() {
                    let info = node.cli(&["CLUSTER", "INFO"]);
                    if info_field(&info, "cluster_state").as_deref() != Some("ok")
                        || info_field(&info, "cluster_slots_ok").as_deref() != Some("16384")
                        || info_field(&info, "cluster_known_nodes")
                            != Some(self.nodes.len().to_string())
                    {
                        return Err(format!("node {i}: {info}"));
                    }
                    let nodes = node.cli(&["CLUSTER", "NODES"]);
                    if nodes.lines().any(|l| !l.contains(" connected")) {
                        return Err(format!("node {i}: {nodes}"));
                    }
                    maps.push(self.slot_map(i));
                }
                if maps.windows(2).all(|w| w[0] == w[1]) {
                    Ok(())
                } else {
                    Err("the nodes disagree on slot owners".into())
                }
            },
        );
    }

    /// `(first slot, last slot, owner's node index)` ranges as node `i` sees them.
    fn slot_map(&self, i: usize) -> Vec<(u16, u16, usize)> {
        let mut map = Vec::new();
        for line in self.nodes[i].cli(&["CLUSTER", "NODES"]).lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let Some(owner) = self.ids.iter().position(|id| id == fields[0]) else {
                continue;
            };
            for range in fields.iter().skip(8) {
                if range.starts_with('[') {
                    continue; // a migrating / importing marker
                }
                let (first, last) = match range.split_once('-') {
                    Some((a, b)) => (a.parse().unwrap(), b.parse().unwrap()),
                    None => {
                        let s = range.parse().unwrap();
                        (s, s)
                    }
                };
                map.push((first, last, owner));
            }
        }
        map.sort();
        map
    }

    /// `redis://127.0.0.1:<port>` of every node (seed nodes for a client).
    pub fn seed_urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// How many nodes there are.
    pub fn size(&self) -> usize {
        self.nodes.len()
    }

    /// Node `i`.
    pub fn node(&self, i: usize) -> &RedisServer {
        &self.nodes[i]
    }

    /// Runs a command on node `i`.
    pub fn cli(&self, i: usize, args: &[&str]) -> String {
        cli_port(self.nodes[i].port, args)
    }

    /// Runs a command on node `i` after `ASKING` on the same connection: how
    /// the target of a migration in progress answers for keys it is
    /// importing. Arguments may not contain spaces or quotes.
    pub fn cli_asking(&self, i: usize, args: &[&str]) -> String {
        assert!(
            args.iter().all(|a| !a.contains([' ', '"', '\'', '\n'])),
            "plain arguments only: {args:?}"
        );
        let answers = pipeline(self.nodes[i].port, &format!("ASKING\n{}\n", args.join(" ")));
        let mut lines = answers.lines();
        assert_eq!(lines.next(), Some("OK"), "ASKING on node {i}");
        lines.collect::<Vec<_>>().join("\n")
    }

    /// The hash slot of `key` (`CLUSTER KEYSLOT`).
    pub fn slot_of(&self, key: &str) -> u16 {
        let answer = self.cli(0, &["CLUSTER", "KEYSLOT", key]);
        answer
            .parse()
            .unwrap_or_else(|_| panic!("CLUSTER KEYSLOT {key:?}: {answer}"))
    }

    /// The index of the node that owns `slot`, according to node 0.
    pub fn owner_of(&self, slot: u16) -> usize {
        self.slot_map(0)
            .into_iter()
            .find(|&(first, last, _)| first <= slot && slot <= last)
            .map(|(_, _, owner)| owner)
            .unwrap_or_else(|| panic!("no node owns slot {slot}"))
    }

    /// The keys node `i` holds (sorted).
    pub fn keys(&self, i: usize) -> Vec<String> {
        sorted_keys(self.nodes[i].port)
    }

    /// The keys of `slot` stored on node `i`.
    pub fn keys_in_slot(&self, i: usize, slot: u16) -> Vec<String> {
        self.cli(i, &["CLUSTER", "GETKEYSINSLOT", &slot.to_string(), "1000"])
            .lines()
            .map(str::to_owned)
            .filter(|k| !k.is_empty())
            .collect()
    }

    /// Moves `slot` (with its keys) from its owner to node `to`, as
    /// `redis-cli --cluster reshard` does: [`Cluster::begin_migration`],
    /// [`Cluster::move_keys`], [`Cluster::finish_migration`]. Returns the
    /// source node's index.
    pub fn migrate_slot(&self, slot: u16, to: usize) -> usize {
        let migration = self.begin_migration(slot, to);
        self.move_keys(&migration);
        let from = migration.from;
        self.finish_migration(migration);
        from
    }

    /// Starts moving `slot` from its owner to node `to`: `SETSLOT IMPORTING`
    /// on the target, then `SETSLOT MIGRATING` on the source. From now on the
    /// source answers `ASK` for keys of the slot it does not have.
    pub fn begin_migration(&self, slot: u16, to: usize) -> Migration {
        let from = self.owner_of(slot);
        assert_ne!(from, to, "slot {slot} already lives on node {to}");
        let slot_s = slot.to_string();
        self.expect_ok(
            to,
            &["CLUSTER", "SETSLOT", &slot_s, "IMPORTING", &self.ids[from]],
        );
        self.expect_ok(
            from,
            &["CLUSTER", "SETSLOT", &slot_s, "MIGRATING", &self.ids[to]],
        );
        Migration { slot, from, to }
    }

    /// `MIGRATE`s every key of the slot from the source to the target, in
    /// batches, until the source has none left (keys written meanwhile go
    /// too). Returns how many keys moved.
    pub fn move_keys(&self, migration: &Migration) -> usize {
        let Migration { slot, from, to } = *migration;
        let to_port = self.nodes[to].port.to_string();
        let mut moved = 0;
        loop {
            let keys = self.keys_in_slot(from, slot);
            if keys.is_empty() {
                return moved;
            }
            let mut args: Vec<&str> =
                vec!["MIGRATE", "127.0.0.1", &to_port, "", "0", "5000", "KEYS"];
            args.extend(keys.iter().map(String::as_str));
            let answer = self.cli(from, &args);
            // NOKEY: the keys expired between GETKEYSINSLOT and MIGRATE.
            assert!(
                answer == "OK" || answer == "NOKEY",
                "MIGRATE of slot {slot} from node {from} to node {to}: {answer}"
            );
            moved += keys.len();
        }
    }

    /// Ends a migration: moves any keys left, then `SETSLOT NODE` on the
    /// target, the source and every other node, and waits until all agree.
    pub fn finish_migration(&self, migration: Migration) {
        self.move_keys(&migration);
        let Migration { slot, from, to } = migration;
        let slot_s = slot.to_string();
        self.expect_ok(to, &["CLUSTER", "SETSLOT", &slot_s, "NODE", &self.ids[to]]);
        self.expect_ok(
            from,
            &["CLUSTER", "SETSLOT", &slot_s, "NODE", &self.ids[to]],
        );
        for i in (0..self.nodes.len()).filter(|&i| i != from && i != to) {
            self.expect_ok(i, &["CLUSTER", "SETSLOT", &slot_s, "NODE", &self.ids[to]]);
        }
        self.wait_consistent(Duration::from_secs(10));
        assert_eq!(self.owner_of(slot), to, "slot {slot} moved");
    }

    fn expect_ok(&self, i: usize, args: &[&str]) {
        let answer = self.cli(i, args);
        assert_eq!(answer, "OK", "node {i}: {args:?}");
    }

    /// A key `<prefix>-<n>` (the first such `n`) whose hash slot is owned by
    /// node `node`. The slot of a key without braces is also the slot of any
    /// name that hash-tags it (`lock:L{<key>}`).
    pub fn key_on(&self, node: usize, prefix: &str) -> String {
        let map = self.slot_map(0);
        (0..10_000)
            .map(|n| format!("{prefix}-{n}"))
            .find(|k| {
                let slot = self.slot_of(k);
                map.iter()
                    .any(|&(first, last, owner)| first <= slot && slot <= last && owner == node)
            })
            .unwrap_or_else(|| panic!("no key for node {node} in 10000 tries"))
    }
}

/// A client builder for this cluster, seeded with every node.
impl super::Topology for Cluster {
    fn builder(&self) -> lock_runtime::LockClientBuilder {
        lock_runtime::LockClient::builder().cluster(self.seed_urls())
    }
}

/// One cluster-enabled server. The bus port defaults to port + 10000, which
/// may not exist for a high free port, so it is chosen explicitly (Redis 7);
/// a port found free may be taken by a parallel test before the node binds
/// it, so a node that fails to start is started again with a new bus port
/// (and, by `try_start`, a new port of its own).
fn start_node(tls: Option<&TlsFiles>) -> RedisServer {
    let mut last = String::new();
    for _ in 0..5 {
        let bus = free_port().to_string();
        let mut options = vec![
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "2000",
            "--cluster-port",
            &bus,
        ];
        let started = match tls {
            Some(files) => {
                options.extend(["--tls-cluster", "yes", "--tls-auth-clients", "yes"]);
                RedisServer::try_start_tls(files, &options)
            }
            None => RedisServer::try_start(&options),
        };
        match started {
            Ok(node) => return node,
            Err(e) => last = e,
        }
    }
    panic!("cannot start a cluster node: {last}")
}
