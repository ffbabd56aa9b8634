//! A Sentinel deployment: master, replica, three sentinels.

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::server::spawn_quiet;
use crate::topology::{cli_port, info_field, pairs, pipeline, poll, try_cli_port, try_poll};
use crate::{RedisServer, Result, ServerKind, try_free_port};

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

/// A master and its replica, in sync, without sentinels (clients use the
/// master's URL): for `min_replica_acks` on one server.
pub fn master_and_replica() -> (RedisServer, RedisServer) {
    let master = RedisServer::start_with(&["--repl-diskless-sync-delay", "0"]);
    let port = master.port.to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
    wait_replica_online(&master, &replica);
    (master, replica)
}

/// The name the sentinels monitor the master under.
pub const MASTER_NAME: &str = "mymaster";

/// One sentinel process (the server binary of [`ServerKind::current`] run
/// with `--sentinel`) with its own config file (`sentinel.conf`)
/// and log (`sentinel.log`) in a temporary directory; killed on drop.
#[derive(Debug)]
pub struct Sentinel {
    port: u16,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl Sentinel {
    /// Starts a sentinel on a free port monitoring the master on
    /// `master_port` under `name` (quorum 2, `down-after-milliseconds 1000`,
    /// `failover-timeout 3000`), with `extra` config lines appended, and
    /// waits until it answers `PING`.
    pub fn try_start(master_port: u16, name: &str, extra: &str) -> Result<Self> {
        let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
        let port = try_free_port()?;
        let config = format!(
            "port {port}\n\
             bind 127.0.0.1\n\
             protected-mode no\n\
             daemonize no\n\
             dir {dir}\n\
             logfile {dir}/sentinel.log\n\
             sentinel resolve-hostnames no\n\
             sentinel announce-ip 127.0.0.1\n\
             sentinel monitor {name} 127.0.0.1 {master_port} 2\n\
             sentinel down-after-milliseconds {name} 1000\n\
             sentinel failover-timeout {name} 3000\n\
             sentinel parallel-syncs {name} 1\n\
             {extra}",
            dir = dir.path().display(),
        );
        let path = dir.path().join("sentinel.conf");
        std::fs::write(&path, config).map_err(|e| format!("write sentinel.conf: {e}"))?;
        // `--sentinel` makes the server binary a sentinel, on Redis and
        // Valkey alike (as a `*-sentinel` name would).
        let kind = ServerKind::current();
        let mut cmd = Command::new(kind.server_bin());
        cmd.arg(&path).arg("--sentinel");
        let child = spawn_quiet(cmd, kind.install_hint())?;
        let sentinel = Self {
            port,
            child: Some(child),
            dir,
        };
        try_poll(
            Duration::from_secs(10),
            "a sentinel answers PING",
            || match sentinel.try_cli(&["PING"]) {
                Ok(answer) if answer == "PONG" => Ok(()),
                other => Err(format!("{other:?}")),
            },
        )?;
        Ok(sentinel)
    }

    /// The sentinel's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its directory (`sentinel.conf`, rewritten by the sentinel with what
    /// it learns, and `sentinel.log`).
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Runs a command on the sentinel (see [`cli_port`]).
    pub fn cli(&self, args: &[&str]) -> String {
        cli_port(self.port, args)
    }

    /// Runs a command on the sentinel (see [`try_cli_port`]).
    pub fn try_cli(&self, args: &[&str]) -> Result<String> {
        try_cli_port(self.port, args)
    }

    /// The port of the master `name` according to this sentinel.
    pub fn master_port(&self, name: &str) -> Option<u16> {
        let answer = self
            .try_cli(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", name])
            .ok()?;
        answer.lines().nth(1).and_then(|p| p.trim().parse().ok())
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A Sentinel deployment on loopback: one master, one replica
/// (`--replicaof`), three sentinels monitoring [`MASTER_NAME`] with quorum 2,
/// `down-after-milliseconds 1000`, `failover-timeout 3000`; and, with
/// [`start_with_spare_replica`](Self::start_with_spare_replica), a second
/// replica that is never promoted.
pub struct SentinelSetup {
    master: RedisServer,
    replica: RedisServer,
    spare: Option<RedisServer>,
    sentinels: Vec<Sentinel>,
}

impl SentinelSetup {
    /// Starts everything and waits until the replica is in sync and every
    /// sentinel knows the master, the replica and the two other sentinels
    /// (so a failover can be authorized at once).
    pub fn start() -> Self {
        Self::start_replicas(false)
    }

    /// [`start`](Self::start) with a second replica, `replica-priority 0`
    /// (never promoted: a failover still promotes [`replica`](Self::replica)).
    /// After a failover the sentinels make it replicate from the new master,
    /// which so has a replica to acknowledge writes at once; with one
    /// replica, the only other server is the old master, a replica again
    /// only once it is demoted (and synced).
    pub fn start_with_spare_replica() -> Self {
        Self::start_replicas(true)
    }

    fn start_replicas(spare: bool) -> Self {
        // Diskless full sync waits 5 s by default for more replicas to join.
        let master = RedisServer::start_with(&["--repl-diskless-sync-delay", "0"]);
        let master_port = master.port.to_string();
        let replica_of = |priority: &str| {
            RedisServer::start_with(&[
                "--replicaof",
                "127.0.0.1",
                &master_port,
                "--repl-diskless-sync-delay",
                "0",
                "--replica-priority",
                priority,
            ])
        };
        let replica = replica_of("100");
        let spare = spare.then(|| replica_of("0"));
        let sentinels: Vec<Sentinel> = (0..3)
            .map(|_| Sentinel::try_start(master.port, MASTER_NAME, ""))
            .collect::<Result<_>>()
            .unwrap_or_else(|e| panic!("{e}"));
        let setup = Self {
            master,
            replica,
            spare,
            sentinels,
        };
        wait_replica_online(&setup.master, &setup.replica);
        if let Some(spare) = &setup.spare {
            wait_replica_online(&setup.master, spare);
        }
        let replicas = (1 + usize::from(setup.spare.is_some())).to_string();
        for (i, sentinel) in setup.sentinels.iter().enumerate() {
            poll(
                Duration::from_secs(15),
                &format!(
                    "sentinel {i} sees the master, {replicas} replica(s) and 2 other sentinels"
                ),
                || {
                    let master = pairs(&sentinel.cli(&["SENTINEL", "MASTER", MASTER_NAME]));
                    let ok = master.get("flags").map(String::as_str) == Some("master")
                        && master.get("num-slaves") == Some(&replicas)
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
        self.sentinels.iter().map(Sentinel::url).collect()
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

    /// The second replica of [`start_with_spare_replica`](Self::start_with_spare_replica).
    pub fn spare_replica(&self) -> Option<&RedisServer> {
        self.spare.as_ref()
    }

    /// Waits (up to 10 s) until every replica has acknowledged everything
    /// written to the master so far (a probe write and `WAIT <replicas>`):
    /// a `WAIT 1` a client saw answered may have been the spare's alone.
    pub fn wait_replicas_in_sync(&self) {
        let replicas = 1 + usize::from(self.spare.is_some());
        let script = format!("SET topology:probe 1\nWAIT {replicas} 200\n");
        poll(
            Duration::from_secs(10),
            "every replica acknowledges the master's writes",
            || {
                let acked = pipeline(self.master.port, &script);
                match acked.lines().nth(1).map(str::trim) {
                    Some(n) if n == replicas.to_string() => Ok(()),
                    _ => Err(format!("SET + WAIT {replicas} answered {acked:?}")),
                }
            },
        );
        self.master.cli(&["DEL", "topology:probe"]);
    }

    /// A manual failover (`SENTINEL FAILOVER`, sent to sentinel `i`) of the
    /// master of start-up, which stays up; returns once the replica is
    /// promoted (`role:master`) and the spare, if any, replicates from it,
    /// while the old master is, until the sentinels demote it (seconds
    /// later), still a master with no replica. Panics after 10 s.
    pub fn manual_failover(&self, i: usize) {
        let answer = self.sentinel_cli(i, &["SENTINEL", "FAILOVER", MASTER_NAME]);
        assert_eq!(answer, "OK", "SENTINEL FAILOVER on sentinel {i}");
        let new = self.replica.port.to_string();
        poll(
            Duration::from_secs(10),
            "the replica is promoted and the spare follows it",
            || {
                let role = info_field(&self.replica.cli(&["INFO", "replication"]), "role");
                let spare = self
                    .spare
                    .as_ref()
                    .map(|s| info_field(&s.cli(&["INFO", "replication"]), "master_port"));
                if role.as_deref() == Some("master")
                    && spare
                        .as_ref()
                        .is_none_or(|port| port.as_deref() == Some(&new))
                {
                    Ok(())
                } else {
                    Err(format!(
                        "the replica's role is {role:?}, the spare follows {spare:?}"
                    ))
                }
            },
        );
    }

    /// The master's port according to sentinel `i`.
    pub fn master_port_seen_by(&self, i: usize) -> Option<u16> {
        self.sentinels[i].master_port(MASTER_NAME)
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

/// A client builder for the master named [`MASTER_NAME`](super::MASTER_NAME),
/// through the three sentinels.
impl super::Topology for SentinelSetup {
    fn builder(&self) -> lock_runtime::LockClientBuilder {
        lock_runtime::LockClient::builder().sentinel(super::MASTER_NAME, self.sentinel_urls())
    }
}
