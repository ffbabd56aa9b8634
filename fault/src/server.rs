//! The harness's Sentinel group: a master, one replica and three sentinels,
//! kept to itself on a shared loopback (`Isolation`), with the failovers the
//! scenarios inject. The servers and sentinels are `test_support`'s.

use std::path::Path;
use std::time::Duration;

use test_support::topology::{Sentinel, info_field, pairs, try_poll};
use test_support::{RedisServer, Result};

/// What keeps one Sentinel group to itself on a loopback that other runs share
/// (other worktrees' `fault` runs and tests, or the processes of a run that
/// was killed and never cleaned up).
///
/// Sentinels know instances by address only. A sentinel of another group
/// that still knows a port (its old master, down during a failover) talks to
/// whatever server a new run starts there: it publishes its hello on it, and
/// if both groups use one master name, the new group's sentinels adopt the
/// stranger as a peer and, its configuration epoch being higher, switch the
/// master to the stranger's (`+config-update-from`, `+switch-master`) and
/// made both new servers its replicas: the new group's data was replaced by
/// another group's, whose fencing counters were lower, and tokens were
/// issued twice. (Without a shared name, a stranger's sentinel that takes the
/// new server for its own returning replica would still send it `SLAVEOF`.)
/// Hence a master name of its own per group (hellos for other names are
/// ignored) and a `SLAVEOF` that only this group's sentinels can call
/// (`rename-command`).
#[derive(Clone, Debug)]
struct Isolation {
    /// The master name: `fault-<pid>-<random>`.
    name: String,
    /// What `SLAVEOF` is renamed to on this group's servers.
    slaveof: String,
    /// What `REPLICAOF` is renamed to.
    replicaof: String,
}

impl Isolation {
    fn new() -> Result<Self> {
        let mut bytes = [0u8; 12];
        getrandom::fill(&mut bytes).map_err(|e| format!("getrandom: {e}"))?;
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        Ok(Self {
            name: format!("fault-{}-{}", std::process::id(), &hex[..8]),
            slaveof: format!("SLAVEOF-{}", &hex[8..]),
            replicaof: format!("REPLICAOF-{}", &hex[8..]),
        })
    }

    /// `redis-sentinel` config lines: the renamed commands, for the master
    /// name.
    fn sentinel_config(&self) -> String {
        let Self {
            name,
            slaveof,
            replicaof,
        } = self;
        format!(
            "sentinel rename-command {name} SLAVEOF {slaveof}\n\
             sentinel rename-command {name} REPLICAOF {replicaof}\n"
        )
    }

    /// `redis-server` options: the renamed commands.
    fn server_args(&self) -> Vec<String> {
        vec![
            "--rename-command".into(),
            "SLAVEOF".into(),
            self.slaveof.clone(),
            "--rename-command".into(),
            "REPLICAOF".into(),
            self.replicaof.clone(),
        ]
    }
}

/// The ports of the instances `sentinel` lists for `what` (`REPLICAS` or
/// `SENTINELS`) of the master `name`.
fn listed_ports(sentinel: &Sentinel, what: &str, name: &str) -> Result<Vec<u16>> {
    let answer = sentinel.try_cli(&["SENTINEL", what, name])?;
    let lines: Vec<&str> = answer.lines().map(str::trim).collect();
    Ok(lines
        .windows(2)
        .filter(|w| w[0] == "port")
        .filter_map(|w| w[1].parse().ok())
        .collect())
}

/// A master, one replica and three sentinels (quorum 2, down-after 1 s).
#[derive(Debug)]
pub struct SentinelGroup {
    /// The two data servers; which one is master changes with failovers.
    pub servers: [RedisServer; 2],
    sentinels: Vec<Sentinel>,
    iso: Isolation,
}

impl SentinelGroup {
    /// Starts everything and waits until the replica acknowledges writes and
    /// every sentinel knows the replica and the other sentinels.
    pub fn start() -> Result<Self> {
        Self::start_inner(None)
    }

    /// The same, with the replica on `port` (a port that another group's
    /// sentinels may still know: the test of `Isolation`).
    pub fn start_with_replica_on(port: u16) -> Result<Self> {
        Self::start_inner(Some(port))
    }

    fn start_inner(replica_port: Option<u16>) -> Result<Self> {
        let iso = Isolation::new()?;
        let renamed = iso.server_args();
        let renamed: Vec<&str> = renamed.iter().map(String::as_str).collect();
        let mut args = vec!["--repl-diskless-sync-delay", "0"];
        args.extend(&renamed);
        let master = RedisServer::try_start(&args)?;
        let port = master.port.to_string();
        args.extend(["--replicaof", "127.0.0.1", &port]);
        let replica = match replica_port {
            Some(p) => RedisServer::try_start_on(p, &args)?,
            None => RedisServer::try_start(&args)?,
        };
        let config = iso.sentinel_config();
        let sentinels = (0..3)
            .map(|_| Sentinel::try_start(master.port, &iso.name, &config))
            .collect::<Result<Vec<_>>>()?;
        let group = Self {
            servers: [master, replica],
            sentinels,
            iso,
        };
        group.wait_replicated()?;
        for (i, s) in group.sentinels.iter().enumerate() {
            try_poll(
                Duration::from_secs(15),
                &format!("sentinel {i} knows the replica and 2 other sentinels"),
                || {
                    let master = s.try_cli(&["SENTINEL", "MASTER", &group.iso.name])?;
                    let fields = pairs(&master);
                    let get = |name: &str| fields.get(name).map(String::as_str);
                    if get("num-slaves") == Some("1") && get("num-other-sentinels") == Some("2") {
                        Ok(())
                    } else {
                        Err(master)
                    }
                },
            )?;
        }
        Ok(group)
    }

    /// The name the sentinels monitor the master under (one per group).
    pub fn master_name(&self) -> &str {
        &self.iso.name
    }

    /// `Err` naming the stranger if any instance outside this group takes
    /// part in it: a master, replica or sentinel that a sentinel lists, or a
    /// server replicating from or to a port not of the group. (A run whose
    /// group was joined measures somebody else's data, not the library.)
    pub fn check_isolated(&self) -> Result<()> {
        let ours: Vec<u16> = self.servers.iter().map(|s| s.port).collect();
        let peers: Vec<u16> = self.sentinels.iter().map(|s| s.port()).collect();
        let name = &self.iso.name;
        for (i, s) in self.sentinels.iter().enumerate() {
            if let Some(p) = s.master_port(name).filter(|p| !ours.contains(p)) {
                return Err(format!(
                    "sentinel {i} names port {p} as master, not a server of the group {ours:?}"
                ));
            }
            for p in listed_ports(s, "REPLICAS", name)? {
                if !ours.contains(&p) {
                    return Err(format!(
                        "sentinel {i} lists a replica on port {p}, not a server of the group {ours:?}"
                    ));
                }
            }
            for p in listed_ports(s, "SENTINELS", name)? {
                if !peers.contains(&p) {
                    return Err(format!(
                        "sentinel {i} lists a sentinel on port {p}, not one of the group {peers:?}"
                    ));
                }
            }
        }
        for (i, s) in self.servers.iter().enumerate() {
            let Ok(info) = s.try_cli(&["INFO", "replication"]) else {
                continue; // down (killed by the fault)
            };
            let master = info_field(&info, "master_port").and_then(|p| p.parse::<u16>().ok());
            if let Some(p) = master.filter(|p| !ours.contains(p)) {
                return Err(format!(
                    "server {i} replicates from port {p}, not a server of the group {ours:?}"
                ));
            }
            for line in info.lines().filter(|l| l.starts_with("slave")) {
                let port = line
                    .split(',')
                    .find_map(|kv| kv.strip_prefix("port="))
                    .and_then(|p| p.parse::<u16>().ok());
                if let Some(p) = port.filter(|p| !ours.contains(p)) {
                    return Err(format!(
                        "server {i} has a replica on port {p}, not a server of the group {ours:?}"
                    ));
                }
            }
        }
        Ok(())
    }

    /// The sentinels' URLs.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(Sentinel::url).collect()
    }

    /// Which of [`Self::servers`] the sentinels name as master.
    pub fn master_index(&self) -> Option<usize> {
        let port = self.sentinels[0].master_port(&self.iso.name)?;
        self.servers.iter().position(|s| s.port == port)
    }

    /// Waits until the server the sentinels name as master has a replica that
    /// acknowledges writes. The name is read again on every try: on a loaded
    /// machine the sentinels may fail over once more (a master that answers
    /// nothing for `down-after-milliseconds`), and then the group is whole
    /// again the other way round.
    pub fn wait_replicated(&self) -> Result<()> {
        try_poll(
            Duration::from_secs(30),
            "the master the sentinels name has a replica that acknowledges writes",
            || {
                let master = self
                    .master_index()
                    .ok_or_else(|| "the sentinels name no master of the group".to_owned())?;
                let m = &self.servers[master];
                let info = m.try_cli(&["INFO", "replication"])?;
                if info_field(&info, "role").as_deref() != Some("master")
                    || info_field(&info, "connected_slaves").as_deref() != Some("1")
                {
                    return Err(format!("server {master}: {info}"));
                }
                match m.try_cli(&["WAIT", "1", "200"])?.as_str() {
                    "1" => Ok(()),
                    other => Err(format!("server {master}: WAIT 1 answered {other}")),
                }
            },
        )
    }

    /// The ports of the data servers and of the sentinels (for a
    /// `Sampler`).
    pub fn ports(&self) -> (Vec<u16>, Vec<u16>) {
        (
            self.servers.iter().map(|s| s.port).collect(),
            self.sentinels.iter().map(Sentinel::port).collect(),
        )
    }

    /// Copies every server's and sentinel's log (and the sentinels' rewritten
    /// configs, which list the replicas and sentinels they know) into `to`.
    pub fn copy_logs(&self, to: &Path) {
        for (i, s) in self.servers.iter().enumerate() {
            let _ = std::fs::copy(
                s.dir().join("redis.log"),
                to.join(format!("server-{i}.log")),
            );
        }
        for (i, s) in self.sentinels.iter().enumerate() {
            let _ = std::fs::copy(
                s.dir().join("sentinel.log"),
                to.join(format!("sentinel-{i}.log")),
            );
            let _ = std::fs::copy(
                s.dir().join("sentinel.conf"),
                to.join(format!("sentinel-{i}.conf")),
            );
        }
    }

    /// SIGKILLs the master, waits until every sentinel names the other
    /// server, restarts the old master (empty: no persistence), SIGSTOPs the
    /// new master for `stall` (none when zero), and waits until the group is
    /// whole again: a master with a replica that acknowledges writes.
    ///
    /// `unelectable`: the old master comes back as a replica of the new one
    /// that the sentinels may not promote (`replica-priority 0`) until it
    /// has synced. Otherwise it comes back as a master, and until the
    /// sentinels notice it and make it a replica (they look at a returning
    /// instance on their 10 s `INFO` period) it is an electable candidate
    /// with no data: a stall of the new master longer than
    /// `down-after-milliseconds` in that window makes the sentinels promote
    /// it and turn the new master into its replica, which wipes every lock
    /// and fencing counter.
    pub fn failover(&mut self, unelectable: bool, stall: Duration) -> Result<()> {
        let (old, new) = self.kill_master_and_wait()?;
        let new_port = self.servers[new].port.to_string();
        if unelectable {
            self.servers[old].restart_with(&[
                "--replicaof",
                "127.0.0.1",
                &new_port,
                "--replica-priority",
                "0",
            ])?;
        } else {
            self.servers[old].restart()?;
        }
        if !stall.is_zero() {
            self.servers[new].pause()?;
            std::thread::sleep(stall);
            self.servers[new].resume()?;
        }
        self.wait_replicated()?;
        if unelectable {
            self.servers[old].try_cli(&["CONFIG", "SET", "replica-priority", "100"])?;
        }
        Ok(())
    }

    /// SIGKILLs the master and waits until every sentinel names the other
    /// server and it says it is master: `(old, new)`.
    fn kill_master_and_wait(&mut self) -> Result<(usize, usize)> {
        let old = self
            .master_index()
            .ok_or("no master known to the sentinels")?;
        let new = 1 - old;
        self.servers[old].kill();
        let new_port = self.servers[new].port;
        try_poll(
            Duration::from_secs(30),
            "every sentinel names the new master",
            || {
                let seen: Vec<Option<u16>> = self
                    .sentinels
                    .iter()
                    .map(|s| s.master_port(&self.iso.name))
                    .collect();
                let role = self.servers[new]
                    .try_cli(&["INFO", "replication"])
                    .ok()
                    .and_then(|i| info_field(&i, "role"));
                if seen.iter().all(|p| *p == Some(new_port)) && role.as_deref() == Some("master") {
                    Ok(())
                } else {
                    Err(format!("{seen:?}, role {role:?}"))
                }
            },
        )?;
        Ok((old, new))
    }
}
