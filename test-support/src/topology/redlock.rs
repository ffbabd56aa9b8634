//! Independent masters for Redlock.

use crate::RedisServer;
use crate::topology::{cli_port, sorted_keys};

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

    /// Node `i`.
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
        self.servers[i].restart().unwrap_or_else(|e| panic!("{e}"));
        self.down[i] = false;
        // Not `DBSIZE`: clients retrying meanwhile may already have written
        // to the new server. What it loaded at start is what must be nothing.
        let persistence = self.servers[i].cli(&["INFO", "persistence"]);
        let loaded = persistence
            .lines()
            .find_map(|line| line.strip_prefix("rdb_last_load_keys_loaded:"))
            .map(str::trim);
        assert!(
            matches!(loaded, Some("0") | None),
            "node {i} restarted with data: {loaded:?} keys loaded"
        );
        let aof = persistence
            .lines()
            .any(|line| line.trim() == "aof_enabled:1");
        assert!(!aof, "node {i} restarted with an append-only file");
    }

    /// SIGSTOPs / SIGCONTs node `i`: it keeps its data and its connections
    /// but answers nothing while paused.
    pub fn pause(&self, i: usize) {
        self.servers[i].pause().unwrap_or_else(|e| panic!("{e}"));
    }

    /// Undoes [`Redlock::pause`].
    pub fn resume(&self, i: usize) {
        self.servers[i].resume().unwrap_or_else(|e| panic!("{e}"));
    }

    /// Makes node `i` refuse every script (`ACL` denies `@scripting` to the
    /// default user, at once on open connections): a node that answers
    /// quickly with an error and keeps its data. [`Redlock::accept`] undoes it.
    pub fn refuse(&self, i: usize) {
        let answer = self.cli(i, &["ACL", "SETUSER", "default", "-@scripting"]);
        assert_eq!(answer, "OK", "ACL SETUSER on node {i}");
    }

    /// Undoes [`Redlock::refuse`].
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
        sorted_keys(self.servers[i].port)
    }

    /// The nodes (running ones only) on which `name` exists.
    pub fn nodes_holding(&self, name: &str) -> Vec<usize> {
        (0..self.servers.len())
            .filter(|&i| !self.down[i] && self.cli(i, &["EXISTS", name]) == "1")
            .collect()
    }
}

/// A client builder for Redlock over every node.
impl super::Topology for Redlock {
    fn builder(&self) -> lock_runtime::LockClientBuilder {
        lock_runtime::LockClient::builder().redlock(self.urls())
    }
}
