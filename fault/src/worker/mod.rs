//! One client process: takes the lock, does a slow fenced read-modify-write of
//! the record in the store, releases, and logs every step (see [`crate::log`]).
//! The lock is the synchronizer `--kind` names ([`Kind`]; a mutex unless
//! said otherwise): `operation` has what each kind does with the record.
//!
//! Run by the harness as `fault worker --id N --lock URL --store URL ...`; see
//! [`WorkerConfig::to_args`] for the flags. It draws operations from the
//! store's global counter until the run's budget is spent, so a paused or
//! killed worker does not make the run shorter or longer.
//!
//! A process runs `tasks` tokio tasks (1 unless a scenario says otherwise)
//! that share its one `LockClient`, so that tasks of one process wanting the
//! same key go through the client's local hand-over. Each task is a logical
//! worker of its own ([`logical_id`]) with its own log file and its own name
//! in the store: the checker treats two tasks of one process as it treats two
//! processes, and learns from [`crate::checker::WorkerLog::process`] which
//! ones a `SIGSTOP` or `SIGKILL` of the process struck together.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use lock_runtime::LockClient;

use crate::kind::Kind;
use crate::log::{Clock, Event, LogWriter};
use crate::rng::Rng;
use crate::store::Store;

mod acquiring;
mod fifo;
mod operation;

/// The logical worker that task `task` of process `process` is, when every
/// process runs `tasks` tasks: unique in the run, and the process number
/// itself for one-task processes.
pub fn logical_id(process: u32, task: u32, tasks: u32) -> u32 {
    process * tasks + task
}

/// The log file of logical worker `id` in the run's directory `dir`.
pub fn log_file(dir: &Path, id: u32) -> PathBuf {
    dir.join(format!("worker-{id}.jsonl"))
}

/// What one worker process does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerConfig {
    /// Process number (unique in the run).
    pub id: u32,
    /// Tasks sharing the process's `LockClient` (each a logical worker).
    pub tasks: u32,
    /// The lock servers' URLs, comma-separated (one for `single`).
    pub lock_url: String,
    /// `single`, `redlock` or `sentinel:<master name>`.
    pub topology: String,
    /// `min_replica_acks`: replicas (0: not set) and timeout, ms.
    pub replica_acks: (u32, u64),
    /// The store's URL.
    pub store_url: String,
    /// The PostgreSQL database holding the record instead of the store
    /// (the operation draws and the strike marks stay in the store).
    pub record_url: Option<String>,
    /// The run's epoch (a `CLOCK_MONOTONIC` reading in µs, see [`crate::log`]).
    pub epoch: u64,
    /// The directory of the logs: one per task, [`log_file`].
    pub log_dir: PathBuf,
    /// The lock keys to choose from (uniformly, but see `affinity`).
    pub keys: Vec<String>,
    /// The synchronizer each operation takes.
    pub kind: Kind,
    /// The process's own key (an index into `keys`) and how many operations
    /// per mille take it rather than a uniform choice (0: always uniform).
    pub affinity: (u64, u64),
    /// The run's operation budget (shared by all workers).
    pub budget: u64,
    /// The lease, ms.
    pub ttl_ms: u64,
    /// How long one operation may wait for the lock, ms.
    pub wait_ms: u64,
    /// Think time between the read and the write, ms (uniform in the range).
    pub think_ms: (u64, u64),
    /// The same for task 0 (a fault's victim thinks long, so that the
    /// harness can strike it while it holds).
    pub first_task_think_ms: (u64, u64),
    /// Whether the store checks fencing tokens.
    pub fencing: bool,
    /// The client's response timeout, ms.
    pub response_timeout_ms: u64,
    /// Scenario 6: cancel this many acquires per mille ...
    pub cancel_per_mille: u64,
    /// ... after a uniform delay up to this, ms.
    pub cancel_max_ms: u64,
    /// Scenario 7: block the runtime thread on this many operations per mille,
    pub block_per_mille: u64,
    /// alternately for this long (less than the TTL, more than a third) ...
    pub block_keep_ms: u64,
    /// ... and this long (more than the TTL).
    pub block_lose_ms: u64,
    /// Seed of the worker's choices.
    pub seed: u64,
    /// Scenario 12 (FIFO): `Some(n)`: fixed leases (`renew(false)`),
    /// waiting acquires watched until they show up in the key's queue, and
    /// `n` per mille of the operations try-once.
    pub try_once_per_mille: Option<u64>,
    /// When an operation asks for its fencing token.
    pub token: TokenTiming,
}

/// When a worker asks for the fencing token of a lock it took.
///
/// A lock taken uncontended on the plain path (`SET NX PX`) has no token
/// until its holder asks: `LockGuard::fencing_token` then mints one by an
/// atomic step that checks the lease is still ours, and a holder whose
/// lease ended gets `LockError::Lost`, never a token. The plain path is
/// not taken by a client that coalesces its calls into scripts, so the
/// workers of the two later timings build theirs without coalescing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TokenTiming {
    /// At the grant, before the read (every scenario but the lazy token's).
    #[default]
    AtGrant,
    /// After the think, the pause the fault lengthens: the grant is logged
    /// without a token, and the read and the write come after the token.
    AfterThink,
    /// The same, with the token minted by the worker itself: an `INCR` of
    /// the key's fencing counter with no look at the lease (the control:
    /// what a mint that did not check the lease would hand out).
    Unchecked,
}

impl TokenTiming {
    /// Parses `at-grant`, `after-think`, `unchecked` (`--token`).
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "at-grant" => Ok(Self::AtGrant),
            "after-think" => Ok(Self::AfterThink),
            "unchecked" => Ok(Self::Unchecked),
            _ => Err(format!(
                "--token {s:?}: expected one of at-grant, after-think, unchecked"
            )),
        }
    }
}

impl std::fmt::Display for TokenTiming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::AtGrant => "at-grant",
            Self::AfterThink => "after-think",
            Self::Unchecked => "unchecked",
        })
    }
}

impl WorkerConfig {
    /// The command-line flags that [`WorkerConfig::from_args`] reads back.
    pub fn to_args(&self) -> Vec<String> {
        let mut a = vec!["worker".to_string()];
        let mut put = |k: &str, v: String| {
            a.push(format!("--{k}"));
            a.push(v);
        };
        put("id", self.id.to_string());
        put("lock", self.lock_url.clone());
        put("store", self.store_url.clone());
        put("topology", self.topology.clone());
        let (replicas, acks_ms) = self.replica_acks;
        put("replica-acks", format!("{replicas}/{acks_ms}"));
        put("log-dir", self.log_dir.display().to_string());
        put("keys", self.keys.join(","));
        put("kind", self.kind.to_string());
        let (think_lo, think_hi) = self.think_ms;
        put("think-ms", format!("{think_lo}..{think_hi}"));
        let (first_lo, first_hi) = self.first_task_think_ms;
        put("first-task-think-ms", format!("{first_lo}..{first_hi}"));
        put("fencing", self.fencing.to_string());
        for (k, v) in [
            ("tasks", u64::from(self.tasks)),
            ("home-key", self.affinity.0),
            ("affinity-per-mille", self.affinity.1),
            ("epoch", self.epoch),
            ("budget", self.budget),
            ("ttl-ms", self.ttl_ms),
            ("wait-ms", self.wait_ms),
            ("response-timeout-ms", self.response_timeout_ms),
            ("cancel-per-mille", self.cancel_per_mille),
            ("cancel-max-ms", self.cancel_max_ms),
            ("block-per-mille", self.block_per_mille),
            ("block-keep-ms", self.block_keep_ms),
            ("block-lose-ms", self.block_lose_ms),
            ("seed", self.seed),
        ] {
            put(k, v.to_string());
        }
        if let Some(url) = &self.record_url {
            put("record", url.clone());
        }
        if let Some(n) = self.try_once_per_mille {
            put("try-once-per-mille", n.to_string());
        }
        if self.token != TokenTiming::AtGrant {
            put("token", self.token.to_string());
        }
        a
    }

    /// Parses the flags after `worker`.
    pub fn from_args(args: &[String]) -> Result<Self, String> {
        let mut map = std::collections::HashMap::new();
        let mut it = args.iter();
        while let Some(flag) = it.next() {
            let name = flag
                .strip_prefix("--")
                .ok_or_else(|| format!("unexpected argument {flag:?}"))?;
            let value = it.next().ok_or_else(|| format!("--{name} needs a value"))?;
            map.insert(name.to_string(), value.clone());
        }
        let get = |k: &str| -> Result<&String, String> {
            map.get(k).ok_or_else(|| format!("missing --{k}"))
        };
        let num =
            |k: &str| -> Result<u64, String> { get(k)?.parse().map_err(|e| format!("--{k}: {e}")) };
        let range = |k: &str| -> Result<(u64, u64), String> {
            let v = get(k)?;
            let (lo, hi) = v
                .split_once("..")
                .ok_or_else(|| format!("--{k} {v:?}: expected LO..HI"))?;
            let end = |s: &str| s.parse::<u64>().map_err(|e| format!("--{k}: {e}"));
            Ok((end(lo)?, end(hi)?))
        };
        let id = |k: &str| u32::try_from(num(k)?).map_err(|e| format!("--{k}: {e}"));
        let acks = get("replica-acks")?;
        let (replicas, acks_ms) = acks
            .split_once('/')
            .ok_or_else(|| format!("--replica-acks {acks:?}: expected N/MS"))?;
        Ok(Self {
            id: id("id")?,
            tasks: id("tasks")?.max(1),
            lock_url: get("lock")?.clone(),
            topology: get("topology")?.clone(),
            replica_acks: (
                replicas
                    .parse()
                    .map_err(|e| format!("--replica-acks: {e}"))?,
                acks_ms
                    .parse()
                    .map_err(|e| format!("--replica-acks: {e}"))?,
            ),
            store_url: get("store")?.clone(),
            // Absent: the record is in the store.
            record_url: map.get("record").cloned(),
            epoch: num("epoch")?,
            log_dir: PathBuf::from(get("log-dir")?),
            keys: get("keys")?.split(',').map(str::to_string).collect(),
            // Absent: a mutex (the flag came with scenario 11).
            kind: map
                .get("kind")
                .map_or(Ok(Kind::Mutex), |k| Kind::parse(k))?,
            budget: num("budget")?,
            ttl_ms: num("ttl-ms")?,
            wait_ms: num("wait-ms")?,
            think_ms: range("think-ms")?,
            first_task_think_ms: range("first-task-think-ms")?,
            affinity: (num("home-key")?, num("affinity-per-mille")?),
            fencing: get("fencing")? == "true",
            response_timeout_ms: num("response-timeout-ms")?,
            cancel_per_mille: num("cancel-per-mille")?,
            cancel_max_ms: num("cancel-max-ms")?,
            block_per_mille: num("block-per-mille")?,
            block_keep_ms: num("block-keep-ms")?,
            block_lose_ms: num("block-lose-ms")?,
            seed: num("seed")?,
            // Absent: not scenario 12.
            try_once_per_mille: match map.contains_key("try-once-per-mille") {
                true => Some(num("try-once-per-mille")?),
                false => None,
            },
            // Absent: at the grant.
            token: map
                .get("token")
                .map_or(Ok(TokenTiming::AtGrant), |t| TokenTiming::parse(t))?,
        })
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A client builder for the configured topology.
fn builder(config: &WorkerConfig) -> lock_runtime::LockClientBuilder {
    let urls: Vec<String> = config.lock_url.split(',').map(str::to_string).collect();
    let mut b = LockClient::builder();
    b = match config.topology.as_str() {
        "redlock" => b.redlock(urls),
        t => match t.strip_prefix("sentinel:") {
            Some(master) => b.sentinel(master, urls),
            None => b.redis(&urls[0]),
        },
    };
    if config.replica_acks.0 > 0 {
        b = b.min_replica_acks(config.replica_acks.0, ms(config.replica_acks.1));
    }
    // Group commit on (off by default): calls of one process's tasks are
    // coalesced under every fault (the `tasks-batched` scenarios make them
    // meet); a process of one task sends each call alone as before.
    // `FAULT_NO_COALESCE` (any value) in the harness's environment turns it
    // off in every worker, for paired runs. Off for a token asked after the
    // think: a coalescing client takes every lock by a script, which issues
    // its token at once, and the lazy token's scenario needs the plain path.
    b.coalesce_scripts(
        config.token == TokenTiming::AtGrant && std::env::var_os("FAULT_NO_COALESCE").is_none(),
    )
}

/// Runs the worker process to the end of the budget on a current-thread
/// runtime (so that blocking it in scenario 7 blocks its watchdog too, and
/// every task of the process).
pub fn run(config: WorkerConfig) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    runtime.block_on(run_async(config))
}

/// One task of a worker process: a logical worker.
struct Worker {
    /// Its logical worker number ([`logical_id`]).
    id: u32,
    config: Arc<WorkerConfig>,
    client: LockClient,
    store: Store,
    clock: Clock,
    log: LogWriter,
    rng: Rng,
    think_ms: (u64, u64),
    blocks: u64,
    /// Scenario 12: reads the lock server's queues (`None` elsewhere).
    probe: Option<fifo::Probe>,
    /// The lock server, for tokens minted without the lease check
    /// ([`TokenTiming::Unchecked`]; `None` elsewhere).
    counters: Option<redis::aio::MultiplexedConnection>,
}

impl Worker {
    fn log(&mut self, event: Event) {
        if let Err(e) = self.log.write(&event) {
            eprintln!("worker {}: cannot write the log: {e}", self.id);
        }
    }

    /// Draws the worker's `seq`th operation number, sent again for up to
    /// [`DRAW_TRIES`] while the store does not answer (a reply lost to a
    /// timeout: the same `seq` gets the same number, so the checker's count
    /// of draws still matches the log).
    async fn draw(&self, seq: u64) -> Result<u64, String> {
        let mut tries = 1;
        loop {
            match self.store.next_op(self.config.budget, seq).await {
                Ok(n) => return Ok(n),
                Err(e) if tries < DRAW_TRIES => {
                    eprintln!(
                        "worker {}: draw {seq} failed ({e}); sending it again",
                        self.id
                    );
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(format!("store: {e}")),
            }
        }
    }

    /// Draws operations until the budget is spent.
    async fn run(mut self) -> Result<(), String> {
        self.log(Event::Start {
            worker: self.id,
            pid: std::process::id(),
            t: self.clock.now(),
        });
        let mut op = 0;
        loop {
            let n = self.draw(op + 1).await?;
            if n > self.config.budget {
                break;
            }
            op += 1;
            operation::one_operation(&mut self, op).await;
        }
        let t = self.clock.now();
        self.log(Event::Done { t });
        Ok(())
    }
}

/// How many times a draw is sent before the worker gives up: 5 s of a
/// store that does not answer.
const DRAW_TRIES: u32 = 50;

async fn run_async(config: WorkerConfig) -> Result<(), String> {
    let clock = Clock::new(config.epoch);
    let logs = (0..config.tasks)
        .map(|task| {
            let id = logical_id(config.id, task, config.tasks);
            let log = LogWriter::create(&log_file(&config.log_dir, id))
                .map_err(|e| format!("log file: {e}"))?;
            Ok((task, id, log))
        })
        .collect::<Result<Vec<_>, String>>()?;
    let store = Store::connect(
        &config.store_url,
        config.record_url.as_deref(),
        config.fencing,
        config.id,
    )
    .await
    .map_err(|e| format!("store: {e}"))?;
    // The lock server may be down (scenario 4): retry for a while.
    let mut tries = 0;
    let client = loop {
        let built = builder(&config)
            .response_timeout(ms(config.response_timeout_ms))
            .connect_timeout(ms(config.response_timeout_ms.max(500)))
            .build()
            .await;
        match built {
            Ok(client) => break client,
            Err(e) if tries < 100 => {
                tries += 1;
                eprintln!("worker {}: lock client: {e}; retrying", config.id);
                tokio::time::sleep(ms(100)).await;
            }
            Err(e) => return Err(format!("lock client: {e}")),
        }
    };
    let config = Arc::new(config);
    let mut probes = Vec::new();
    for _ in 0..config.tasks {
        probes.push(match config.try_once_per_mille {
            Some(_) => Some(fifo::Probe::connect(&config).await?),
            None => None,
        });
    }
    let counters = match config.token {
        TokenTiming::Unchecked => {
            // One server (the scenario's topology is `single`).
            let url = config.lock_url.split(',').next().unwrap_or_default();
            let err = |e: redis::RedisError| format!("lock server: {e}");
            let client = redis::Client::open(url).map_err(err)?;
            Some(
                client
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(err)?,
            )
        }
        _ => None,
    };
    let mut tasks = tokio::task::JoinSet::new();
    for ((task, id, log), probe) in logs.into_iter().zip(probes) {
        tasks.spawn(
            Worker {
                id,
                config: config.clone(),
                client: client.clone(),
                store: store.for_worker(id),
                clock,
                log,
                rng: Rng::new(config.seed.wrapping_add(u64::from(task) * 104_729)),
                think_ms: if task == 0 {
                    config.first_task_think_ms
                } else {
                    config.think_ms
                },
                blocks: 0,
                probe,
                counters: counters.clone(),
            }
            .run(),
        );
    }
    let mut result = Ok(());
    while let Some(ended) = tasks.join_next().await {
        let ended = ended
            .map_err(|e| format!("a task failed: {e}"))
            .and_then(|r| r);
        if result.is_ok() {
            result = ended;
        }
    }
    // The group commit's figures (Redis: a process's tasks' calls coalesced).
    let (calls, ops, largest) = lock_runtime::__private::testing::batched_calls(&client);
    if calls > 0 {
        eprintln!(
            "worker {}: batches: {ops} ops in {calls} calls ({:.2} per call, largest {largest})",
            config.id,
            ops as f64 / calls as f64
        );
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_flags_round_trip() {
        let c = WorkerConfig {
            id: 3,
            tasks: 8,
            lock_url: "redis://127.0.0.1:1".into(),
            store_url: "redis://127.0.0.1:2".into(),
            record_url: Some("postgres://postgres@127.0.0.1:3/postgres".into()),
            topology: "sentinel:m".into(),
            replica_acks: (1, 300),
            epoch: 99,
            log_dir: "/tmp/run".into(),
            keys: vec!["a".into(), "b:c".into()],
            kind: Kind::Semaphore { permits: 3 },
            budget: 500,
            ttl_ms: 1000,
            wait_ms: 5000,
            think_ms: (0, 2),
            first_task_think_ms: (300, 300),
            affinity: (1, 900),
            fencing: true,
            response_timeout_ms: 250,
            cancel_per_mille: 500,
            cancel_max_ms: 20,
            block_per_mille: 0,
            block_keep_ms: 0,
            block_lose_ms: 0,
            seed: 42,
            try_once_per_mille: Some(200),
            token: TokenTiming::AfterThink,
        };
        let args = c.to_args();
        assert_eq!(args[0], "worker");
        assert_eq!(WorkerConfig::from_args(&args[1..]).unwrap(), c);
        assert!(WorkerConfig::from_args(&["--id".into()]).is_err());
        // Without the scenario-12 flag, the PostgreSQL record and the lazy
        // token (every other scenario): none.
        let plain = WorkerConfig {
            try_once_per_mille: None,
            record_url: None,
            token: TokenTiming::AtGrant,
            ..c
        };
        let args = plain.to_args();
        assert!(
            !args
                .iter()
                .any(|a| a.contains("try-once") || a == "--record" || a == "--token")
        );
        assert_eq!(WorkerConfig::from_args(&args[1..]).unwrap(), plain);
    }

    #[test]
    fn token_timings_round_trip_through_their_flag() {
        for t in [
            TokenTiming::AtGrant,
            TokenTiming::AfterThink,
            TokenTiming::Unchecked,
        ] {
            assert_eq!(TokenTiming::parse(&t.to_string()), Ok(t));
        }
        assert!(TokenTiming::parse("lazy").is_err());
    }

    #[test]
    fn tasks_are_logical_workers_and_one_task_keeps_the_process_number() {
        assert_eq!(logical_id(5, 0, 1), 5);
        let ids: Vec<u32> = (0..3)
            .flat_map(|p| (0..8).map(move |t| logical_id(p, t, 8)))
            .collect();
        assert_eq!(ids, (0..24).collect::<Vec<_>>());
    }
}
