//! Multi-server topologies on loopback for the scale-out tests: independent
//! masters for Redlock, a Sentinel deployment (master, replica, three
//! sentinels) and a three-master Redis Cluster. Every process listens on
//! `127.0.0.1` only, keeps its files in a temporary directory, and is killed
//! when its owner is dropped.
//!
//! The helpers are blocking (they run `redis-cli` and poll with short
//! sleeps); from a multi-thread tokio test, wrap the slow ones (start-up,
//! failover) in `tokio::task::block_in_place` so the runtime keeps going.
//! Every wait has a deadline and panics with what it was waiting for.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{RedisServer, free_port};

/// Runs `redis-cli -p <port> <args>` and returns its trimmed standard output
/// (errors are printed there too, as `ERR ...`).
pub fn cli_port(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .arg("-h")
        .arg("127.0.0.1")
        .arg("-p")
        .arg(port.to_string())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("cannot run redis-cli; install redis-tools");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Polls `check` every 20 ms until it returns `Some`, panicking with `what`
/// (and the last observation) after `limit`.
fn poll<T>(limit: Duration, what: &str, mut check: impl FnMut() -> Result<T, String>) -> T {
    let started = Instant::now();
    loop {
        match check() {
            Ok(value) => return value,
            Err(last) => {
                if started.elapsed() > limit {
                    panic!("{what}: not reached within {limit:?}; last seen: {last}");
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `field:value` lines of an `INFO` answer.
pub fn info_field(info: &str, field: &str) -> Option<String> {
    let prefix = format!("{field}:");
    info.lines()
        .find_map(|l| l.trim().strip_prefix(&prefix))
        .map(|v| v.trim().to_owned())
}

/// An answer printed by `redis-cli` as alternating name / value lines
/// (`SENTINEL MASTER`, `CONFIG GET`), as a map.
fn pairs(answer: &str) -> HashMap<String, String> {
    let lines: Vec<&str> = answer.lines().map(str::trim).collect();
    lines
        .chunks(2)
        .filter(|c| c.len() == 2)
        .map(|c| (c[0].to_owned(), c[1].to_owned()))
        .collect()
}

// ---- Redlock ---------------------------------------------------------------

/// `n` independent `redis-server`s (no replication, no persistence), for
/// Redlock. Nodes are numbered `0..n`.
pub struct Redlock {
    servers: Vec<RedisServer>,
    down: Vec<bool>,
}

impl Redlock {
    /// Starts `n` servers.
    pub fn start(n: usize) -> Self {
        let servers: Vec<RedisServer> = (0..n).map(|_| RedisServer::start()).collect();
        Self {
            down: vec![false; servers.len()],
            servers,
        }
    }

    /// `redis://127.0.0.1:<port>` of every node, in node order.
    pub fn urls(&self) -> Vec<String> {
        self.servers.iter().map(RedisServer::url).collect()
    }

    /// How many nodes there are.
    pub fn size(&self) -> usize {
        self.servers.len()
    }

    pub fn server(&self, i: usize) -> &RedisServer {
        &self.servers[i]
    }

    /// SIGKILLs node `i` (its port then refuses connections).
    pub fn kill(&mut self, i: usize) {
        self.servers[i].kill();
        self.down[i] = true;
    }

    /// Starts node `i` again on the same port, empty: the servers keep no
    /// data across restarts (no RDB, no AOF), as a node that lost its disk.
    pub fn restart(&mut self, i: usize) {
        self.servers[i].restart();
        self.down[i] = false;
        let keys = self.servers[i].cli(&["DBSIZE"]);
        assert_eq!(keys, "0", "node {i} restarted with data");
    }

    /// SIGSTOPs / SIGCONTs node `i`: it keeps its data and its connections
    /// but answers nothing while paused.
    pub fn pause(&self, i: usize) {
        self.servers[i].pause();
    }

    pub fn resume(&self, i: usize) {
        self.servers[i].resume();
    }

    /// Makes node `i` refuse every script (`ACL` denies `@scripting` to the
    /// default user, at once on open connections): a node that answers
    /// quickly with an error and keeps its data. [`Redlock::accept`] undoes it.
    pub fn refuse(&self, i: usize) {
        let answer = self.cli(i, &["ACL", "SETUSER", "default", "-@scripting"]);
        assert_eq!(answer, "OK", "ACL SETUSER on node {i}");
    }

    pub fn accept(&self, i: usize) {
        let answer = self.cli(i, &["ACL", "SETUSER", "default", "+@all"]);
        assert_eq!(answer, "OK", "ACL SETUSER on node {i}");
    }

    /// `true` if node `i` is not running (killed and not restarted).
    pub fn is_down(&self, i: usize) -> bool {
        self.down[i]
    }

    /// Runs a command on node `i` through `redis-cli`.
    pub fn cli(&self, i: usize, args: &[&str]) -> String {
        cli_port(self.servers[i].port, args)
    }

    /// The keys of node `i` (`KEYS *`, sorted); empty for a node that is down.
    pub fn keys(&self, i: usize) -> Vec<String> {
        if self.down[i] {
            return Vec::new();
        }
        let mut keys: Vec<String> = self
            .cli(i, &["KEYS", "*"])
            .lines()
            .map(str::to_owned)
            .filter(|k| !k.is_empty())
            .collect();
        keys.sort();
        keys
    }

    /// The nodes (running ones only) on which `name` exists.
    pub fn nodes_holding(&self, name: &str) -> Vec<usize> {
        (0..self.servers.len())
            .filter(|&i| !self.down[i] && self.cli(i, &["EXISTS", name]) == "1")
            .collect()
    }
}

// ---- Sentinel --------------------------------------------------------------

/// Waits (up to 10 s) until `replica` has synced with `master` and really
/// acknowledges writes: a probe write followed by `WAIT 1` on the same
/// connection counts it. (The replica's link is up and the master lists it
/// online a little before its first acknowledgements arrive: a `WAIT` in
/// that gap returns 0.) The probe key is deleted afterwards.
pub fn wait_replica_online(master: &RedisServer, replica: &RedisServer) {
    poll(
        Duration::from_secs(10),
        "the replica is in sync and acknowledges writes",
        || {
            let replica_info = replica.cli(&["INFO", "replication"]);
            if info_field(&replica_info, "master_link_status").as_deref() != Some("up") {
                return Err(format!("replica: {replica_info}"));
            }
            let acked = pipeline(master.port, "SET topology:probe 1\nWAIT 1 200\n");
            if acked.lines().nth(1).map(str::trim) == Some("1") {
                Ok(())
            } else {
                Err(format!("SET + WAIT 1 answered {acked:?}"))
            }
        },
    );
    master.cli(&["DEL", "topology:probe"]);
}

/// Sends `commands` (one per line) to `redis-cli` on one connection, in
/// order, and returns the answers, one per line.
fn pipeline(port: u16, commands: &str) -> String {
    use std::io::Write;
    let mut child = Command::new("redis-cli")
        .arg("-h")
        .arg("127.0.0.1")
        .arg("-p")
        .arg(port.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("cannot run redis-cli; install redis-tools");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(commands.as_bytes())
        .expect("write to redis-cli");
    let out = child.wait_with_output().expect("redis-cli");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The name the sentinels monitor the master under.
pub const MASTER_NAME: &str = "mymaster";

/// One `redis-sentinel` process with its own config file in a temp dir.
struct SentinelProcess {
    port: u16,
    child: Option<Child>,
    _dir: tempfile::TempDir,
}

impl SentinelProcess {
    fn start(master_port: u16) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        let config = format!(
            "port {port}\n\
             bind 127.0.0.1\n\
             protected-mode no\n\
             daemonize no\n\
             dir {dir}\n\
             logfile \"\"\n\
             sentinel resolve-hostnames no\n\
             sentinel announce-ip 127.0.0.1\n\
             sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2\n\
             sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
             sentinel failover-timeout {MASTER_NAME} 3000\n\
             sentinel parallel-syncs {MASTER_NAME} 1\n",
            dir = dir.path().display(),
        );
        let path = dir.path().join("sentinel.conf");
        std::fs::write(&path, config).expect("write sentinel.conf");
        let child = Command::new("redis-sentinel")
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start redis-sentinel ({e}); install it (apt-get install redis-sentinel)"
                )
            });
        let sentinel = Self {
            port,
            child: Some(child),
            _dir: dir,
        };
        poll(Duration::from_secs(10), "a sentinel answers PING", || {
            let answer = cli_port(port, &["PING"]);
            if answer == "PONG" {
                Ok(())
            } else {
                Err(answer)
            }
        });
        sentinel
    }

    fn cli(&self, args: &[&str]) -> String {
        cli_port(self.port, args)
    }
}

impl Drop for SentinelProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A Sentinel deployment on loopback: one master, one replica
/// (`--replicaof`), three sentinels monitoring [`MASTER_NAME`] with quorum 2,
/// `down-after-milliseconds 1000`, `failover-timeout 3000`.
pub struct SentinelSetup {
    master: RedisServer,
    replica: RedisServer,
    sentinels: Vec<SentinelProcess>,
}

impl SentinelSetup {
    /// Starts everything and waits until the replica is in sync and every
    /// sentinel knows the master, the replica and the two other sentinels
    /// (so a failover can be authorized at once).
    pub fn start() -> Self {
        // Diskless full sync waits 5 s by default for more replicas to join.
        let master = RedisServer::start_with(&["--repl-diskless-sync-delay", "0"]);
        let master_port = master.port.to_string();
        let replica = RedisServer::start_with(&[
            "--replicaof",
            "127.0.0.1",
            &master_port,
            "--repl-diskless-sync-delay",
            "0",
        ]);
        let sentinels: Vec<SentinelProcess> = (0..3)
            .map(|_| SentinelProcess::start(master.port))
            .collect();
        let setup = Self {
            master,
            replica,
            sentinels,
        };
        wait_replica_online(&setup.master, &setup.replica);
        for (i, sentinel) in setup.sentinels.iter().enumerate() {
            poll(
                Duration::from_secs(15),
                &format!("sentinel {i} sees the master, the replica and 2 other sentinels"),
                || {
                    let master = pairs(&sentinel.cli(&["SENTINEL", "MASTER", MASTER_NAME]));
                    let ok = master.get("flags").map(String::as_str) == Some("master")
                        && master.get("num-slaves").map(String::as_str) == Some("1")
                        && master.get("num-other-sentinels").map(String::as_str) == Some("2");
                    let replicas = sentinel.cli(&["SENTINEL", "REPLICAS", MASTER_NAME]);
                    let replica_ok = replicas.lines().any(|l| l.trim() == "slave")
                        && !replicas.contains("disconnected")
                        && !replicas.contains("s_down");
                    if ok && replica_ok {
                        Ok(())
                    } else {
                        Err(format!("{master:?} / replicas: {replicas:?}"))
                    }
                },
            );
        }
        setup
    }

    /// `redis://127.0.0.1:<port>` of the three sentinels.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| format!("redis://127.0.0.1:{}", s.port))
            .collect()
    }

    /// The server that was master at start-up.
    pub fn master(&self) -> &RedisServer {
        &self.master
    }

    /// The server that was the replica at start-up (the one a failover
    /// promotes: there is no other).
    pub fn replica(&self) -> &RedisServer {
        &self.replica
    }

    /// The master's port according to sentinel `i`.
    pub fn master_port_seen_by(&self, i: usize) -> Option<u16> {
        let answer = self.sentinels[i].cli(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME]);
        answer.lines().nth(1).and_then(|p| p.trim().parse().ok())
    }

    /// Runs a command on sentinel `i`.
    pub fn sentinel_cli(&self, i: usize, args: &[&str]) -> String {
        self.sentinels[i].cli(args)
    }

    /// Cuts replication from the master to the replica, as a partition
    /// between the two would, while both stay reachable for clients and
    /// sentinels: the master refuses `PSYNC`/`SYNC` to the default user from
    /// now on and drops its replica link; the replica keeps retrying (and
    /// failing), so writes to the master from now on never reach it. Returns
    /// once the replica reports its link down.
    pub fn cut_replication(&self) {
        let answer = self
            .master
            .cli(&["ACL", "SETUSER", "default", "-psync", "-sync"]);
        assert_eq!(answer, "OK", "ACL SETUSER on the master");
        self.master.cli(&["CLIENT", "KILL", "TYPE", "replica"]);
        poll(Duration::from_secs(5), "the replica's link is down", || {
            let info = self.replica.cli(&["INFO", "replication"]);
            if info_field(&info, "master_link_status").as_deref() == Some("down") {
                Ok(())
            } else {
                Err(info)
            }
        });
    }

    /// SIGKILLs the current master (the one of start-up).
    pub fn kill_master(&mut self) {
        self.master.kill();
    }

    /// Waits until every sentinel names the former replica as the master and
    /// the replica itself reports `role:master`; returns how long that took
    /// from the call. Panics after 30 s (a failover takes `down-after` 1 s,
    /// a vote and a promotion: about 2-4 s, or one more `failover-timeout`
    /// if the first vote is split).
    pub fn wait_for_failover(&self) -> Duration {
        let started = Instant::now();
        let old = self.master.port;
        let new = self.replica.port;
        poll(
            Duration::from_secs(30),
            "every sentinel names the promoted replica as master",
            || {
                let seen: Vec<Option<u16>> = (0..self.sentinels.len())
                    .map(|i| self.master_port_seen_by(i))
                    .collect();
                let role = info_field(&self.replica.cli(&["INFO", "replication"]), "role");
                if seen.iter().all(|p| *p == Some(new)) && role.as_deref() == Some("master") {
                    Ok(())
                } else {
                    Err(format!(
                        "sentinels see {seen:?} (old {old}, new {new}), the replica's role is {role:?}"
                    ))
                }
            },
        );
        started.elapsed()
    }
}

// ---- Cluster ---------------------------------------------------------------

/// A slot on its way from node `from` to node `to` (see
/// [`Cluster::begin_migration`]).
#[derive(Clone, Copy, Debug)]
pub struct Migration {
    pub slot: u16,
    pub from: usize,
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
        assert!(
            n >= 3,
            "redis-cli --cluster create needs at least 3 masters"
        );
        let nodes: Vec<RedisServer> = (0..n)
            .map(|_| {
                // The bus port defaults to port + 10000, which may not exist
                // for a high free port: choose it explicitly (Redis 7).
                let bus = free_port().to_string();
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                    "--cluster-port",
                    &bus,
                ])
            })
            .collect();
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
        let out = Command::new("redis-cli")
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
        let mut keys: Vec<String> = self
            .cli(i, &["KEYS", "*"])
            .lines()
            .map(str::to_owned)
            .filter(|k| !k.is_empty())
            .collect();
        keys.sort();
        keys
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
