//! What a Sentinel group looked like during a run: every 100 ms, each data
//! server's role, replication offsets and fencing counters, and the master
//! each sentinel names, as JSON lines (`timeline.jsonl` in the run's
//! directory). The evidence for reading a failover after the fact: which
//! server granted which tokens, when a replica was promoted, and whether its
//! offset covered the acknowledged writes.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::log::Clock;
use test_support::topology::info_field;

/// A background thread that samples the group until dropped.
#[derive(Debug)]
pub struct Sampler {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Sampler {
    /// Starts sampling the servers on `servers` and the sentinels on
    /// `sentinels` (which monitor `master_name`); `fences` are the Redis names of the fencing counters to
    /// read on every server.
    pub fn start(
        servers: Vec<u16>,
        sentinels: Vec<u16>,
        master_name: String,
        fences: Vec<String>,
        clock: Clock,
        path: &Path,
    ) -> std::io::Result<Self> {
        let mut out = std::io::LineWriter::new(std::fs::File::create(path)?);
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let handle = std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                let line = sample(&servers, &sentinels, &master_name, &fences, &clock);
                let _ = writeln!(out, "{line}");
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Ok(Self {
            stop,
            handle: Some(handle),
        })
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn connect(port: u16) -> Option<redis::Connection> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
    let conn = client
        .get_connection_with_timeout(Duration::from_millis(100))
        .ok()?;
    conn.set_read_timeout(Some(Duration::from_millis(300)))
        .ok()?;
    Some(conn)
}

fn sample(
    servers: &[u16],
    sentinels: &[u16],
    master_name: &str,
    fences: &[String],
    clock: &Clock,
) -> String {
    let t = clock.now();
    let mut data = Vec::new();
    for &port in servers {
        let Some(mut c) = connect(port) else {
            data.push(serde_json::json!({ "port": port, "down": true }));
            continue;
        };
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut c)
            .unwrap_or_default();
        let counters: Vec<Option<u64>> = if fences.is_empty() {
            Vec::new()
        } else {
            redis::cmd("MGET")
                .arg(fences)
                .query(&mut c)
                .unwrap_or_default()
        };
        let field = |f: &str| info_field(&info, f);
        data.push(serde_json::json!({
            "port": port,
            "role": field("role"),
            "offset": field("master_repl_offset"),
            "master_port": field("master_port"),
            "link": field("master_link_status"),
            "slave_offset": field("slave_repl_offset"),
            "slaves": field("connected_slaves"),
            "slave0": field("slave0"),
            "replid": field("master_replid"),
            "fences": counters,
        }));
    }
    let named: Vec<Option<u16>> = sentinels
        .iter()
        .map(|&port| {
            let mut c = connect(port)?;
            let addr: Vec<String> = redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(master_name)
                .query(&mut c)
                .ok()?;
            addr.get(1)?.parse().ok()
        })
        .collect();
    serde_json::json!({ "t": t, "servers": data, "sentinels": named }).to_string()
}
