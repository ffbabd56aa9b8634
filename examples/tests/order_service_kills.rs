//! The `order-service` binary SIGKILLed and restarted at random moments
//! while a client creates orders, each key retried (new connections, random
//! timeouts) until it gets a `2xx`: two instances behind one Redis (and one
//! PostgreSQL), at least 20 kills a run. At the end every key has exactly one
//! order, and every acknowledged response names its key's order.
//!
//! `cargo test -p examples --test order_service_kills` runs a short version
//! (100 keys, one run a store). The figures in FAULTS.md come from
//! `ORDER_KILLS_KEYS=500 ORDER_KILLS_RUNS=10`, with and without the commit
//! (`cargo test ... -- --ignored` runs the service with
//! `IDEMPOTENCY_COMMIT=off` and prints the duplicates it made).

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
#[cfg(feature = "postgres")]
use test_support::PostgresServer;
use test_support::{RedisServer, free_port};

const BIN: &str = env!("CARGO_BIN_EXE_order-service");

/// Concurrent clients, each with its own keys.
const CLIENTS: usize = 16;
/// The kills and restarts come every 30-150 ms (at least 20 a run of 500
/// keys).
const KILL_EVERY_MS: (u64, u64) = (30, 150);
/// A killed instance's keys are free again after this lease.
const LEASE_MS: &str = "1000";

fn var(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A small xorshift generator (the timings need no more).
struct Rng(u64);

impl Rng {
    fn seeded(salt: u64) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        Rng((nanos ^ salt.wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }

    fn between(&mut self, (low, high): (u64, u64)) -> u64 {
        low + self.below(high - low + 1)
    }
}

/// One instance's process and port; restarted on the same port.
struct Slot {
    port: u16,
    env: Vec<(String, String)>,
    child: Option<Child>,
}

impl Slot {
    fn start(&mut self) {
        let child = Command::new(BIN)
            .env_remove("REDIS_URL")
            .env_remove("DATABASE_URL")
            .env("PORT", self.port.to_string())
            .env("RUST_LOG", "error")
            .env("IDEMPOTENCY_LEASE_MS", LEASE_MS)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start order-service");
        self.child = Some(child);
    }

    /// SIGKILL: no graceful shutdown, no clean-up.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What one run saw.
#[derive(Debug)]
struct Outcome {
    keys: usize,
    kills: usize,
    /// Orders beyond one per key.
    duplicates: usize,
    /// Keys with no order, or whose acknowledged response names another order.
    mismatches: Vec<String>,
    elapsed: Duration,
}

/// Where the orders are: read back at the end.
enum Orders {
    Redis(String),
    #[cfg(feature = "postgres")]
    Postgres(String),
}

impl Orders {
    /// Each order's item (the key it was created for), by id.
    async fn items(&self, namespace: &str) -> HashMap<u64, String> {
        match self {
            Orders::Redis(url) => {
                let client = redis::Client::open(url.as_str()).unwrap();
                let mut conn = client.get_multiplexed_async_connection().await.unwrap();
                let last: Option<u64> = redis::cmd("GET")
                    .arg(format!("{namespace}:order-ids"))
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                let mut items = HashMap::new();
                for id in 1..=last.unwrap_or(0) {
                    let item: Option<String> = redis::cmd("HGET")
                        .arg(format!("{namespace}:order:{id}"))
                        .arg("item")
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                    if let Some(item) = item {
                        items.insert(id, item);
                    }
                }
                items
            }
            #[cfg(feature = "postgres")]
            Orders::Postgres(url) => {
                use sqlx::Connection as _;
                let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
                let rows: Vec<(i64, String)> =
                    sqlx::query_as("SELECT id, item FROM orders WHERE namespace = $1")
                        .bind(namespace)
                        .fetch_all(&mut conn)
                        .await
                        .unwrap();
                rows.into_iter()
                    .map(|(id, item)| (id as u64, item))
                    .collect()
            }
        }
    }
}

/// Creates `keys` orders through two instances killed and restarted at
/// random while the clients retry.
async fn run(redis_url: &str, orders: Orders, commit: bool, keys: usize, run: usize) -> Outcome {
    let store = match orders {
        Orders::Redis(_) => "redis",
        #[cfg(feature = "postgres")]
        Orders::Postgres(_) => "postgres",
    };
    let namespace = format!("kills-{store}-{run}-{commit}-{}", std::process::id());
    let mut env = vec![
        ("REDIS_URL".to_owned(), redis_url.to_owned()),
        ("NAMESPACE".to_owned(), namespace.clone()),
        (
            "IDEMPOTENCY_COMMIT".to_owned(),
            if commit { "on" } else { "off" }.to_owned(),
        ),
    ];
    #[cfg(feature = "postgres")]
    if let Orders::Postgres(url) = &orders {
        env.push(("DATABASE_URL".to_owned(), url.clone()));
    }
    let slots: Vec<Arc<Mutex<Slot>>> = (0..2)
        .map(|_| {
            let mut slot = Slot {
                port: free_port(),
                env: env.clone(),
                child: None,
            };
            slot.start();
            Arc::new(Mutex::new(slot))
        })
        .collect();
    let ports: Vec<u16> = slots.iter().map(|s| s.lock().unwrap().port).collect();
    let started = Instant::now();

    // The killer: one instance at a time, SIGKILLed then restarted at once.
    let done = Arc::new(AtomicBool::new(false));
    let kills = Arc::new(AtomicUsize::new(0));
    let killer = {
        let (slots, done, kills) = (slots.clone(), done.clone(), kills.clone());
        std::thread::spawn(move || {
            let mut rng = Rng::seeded(run as u64);
            while !done.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(rng.between(KILL_EVERY_MS)));
                let mut slot = slots[rng.below(2) as usize].lock().unwrap();
                slot.kill();
                slot.start();
                kills.fetch_add(1, Ordering::SeqCst);
            }
        })
    };

    // The clients: each key until a 2xx, on either instance.
    let acknowledged = Arc::new(Mutex::new(HashMap::<String, u64>::new()));
    let workers = (0..CLIENTS).map(|w| {
        let (ports, acknowledged) = (ports.clone(), acknowledged.clone());
        tokio::spawn(async move {
            let mut rng = Rng::seeded((run * CLIENTS + w) as u64 + 1);
            // No connection reuse: each try opens its own.
            let http = reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .build()
                .unwrap();
            for k in (w..keys).step_by(CLIENTS) {
                let key = format!("key-{k}");
                let deadline = Instant::now() + Duration::from_secs(120);
                loop {
                    assert!(Instant::now() < deadline, "{key}: no 2xx in 120 s");
                    let port = ports[rng.below(2) as usize];
                    let sent = http
                        .post(format!("http://127.0.0.1:{port}/orders"))
                        .header("idempotency-key", format!("\"{key}\""))
                        .json(&json!({ "item": key, "amount_cents": 100 }))
                        .timeout(Duration::from_millis(rng.between((100, 1000))))
                        .send()
                        .await;
                    if let Ok(r) = sent
                        && r.status().is_success()
                        && let Ok(body) = r.json::<Value>().await
                    {
                        let id = body["id"].as_u64().expect("an order id");
                        acknowledged.lock().unwrap().insert(key, id);
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(rng.between((20, 100)))).await;
                }
            }
        })
    });
    for worker in futures_util::future::join_all(workers).await {
        worker.unwrap();
    }
    done.store(true, Ordering::SeqCst);
    killer.join().unwrap();
    let elapsed = started.elapsed();
    drop(slots);

    let items = orders.items(&namespace).await;
    let mut per_key: HashMap<&str, Vec<u64>> = HashMap::new();
    for (id, item) in &items {
        per_key.entry(item).or_default().push(*id);
    }
    let duplicates = per_key.values().map(|ids| ids.len() - 1).sum();
    let acknowledged = acknowledged.lock().unwrap();
    let mismatches = (0..keys)
        .map(|k| format!("key-{k}"))
        .filter(
            |key| match (acknowledged.get(key), items.get(&acknowledged[key])) {
                (Some(_), Some(item)) => item != key,
                _ => true,
            },
        )
        .collect();
    Outcome {
        keys,
        kills: kills.load(Ordering::SeqCst),
        duplicates,
        mismatches,
        elapsed,
    }
}

/// Runs `ORDER_KILLS_RUNS` (default 1) runs of `ORDER_KILLS_KEYS` (default
/// 100) keys and prints each.
async fn runs(what: &str, commit: bool, start: impl Fn() -> (String, Orders)) -> Vec<Outcome> {
    let (keys, n) = (var("ORDER_KILLS_KEYS", 100), var("ORDER_KILLS_RUNS", 1));
    let mut outcomes = Vec::new();
    for i in 0..n {
        let (url, orders) = start();
        let outcome = run(&url, orders, commit, keys, i).await;
        println!(
            "{what}, commit {}: run {}/{n}: {} keys, {} kills, {} duplicates, {} mismatches, {:.1} s",
            if commit { "on" } else { "off" },
            i + 1,
            outcome.keys,
            outcome.kills,
            outcome.duplicates,
            outcome.mismatches.len(),
            outcome.elapsed.as_secs_f64()
        );
        outcomes.push(outcome);
    }
    outcomes
}

fn assert_exactly_once(outcomes: &[Outcome]) {
    for o in outcomes {
        assert!(o.kills >= 20 || o.keys < 500, "only {} kills", o.kills);
        assert_eq!(o.duplicates, 0, "{o:?}");
        assert!(o.mismatches.is_empty(), "{o:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_instances_on_redis_never_create_a_second_order_for_a_key() {
    let redis = RedisServer::start();
    let outcomes = runs("redis", true, || (redis.url(), Orders::Redis(redis.url()))).await;
    assert_exactly_once(&outcomes);
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_instances_on_postgres_never_create_a_second_order_for_a_key() {
    let redis = RedisServer::start();
    let postgres = PostgresServer::start();
    let outcomes = runs("postgres", true, || {
        (redis.url(), Orders::Postgres(postgres.url()))
    })
    .await;
    assert_exactly_once(&outcomes);
}

/// The same loop with `IDEMPOTENCY_COMMIT=off` (the order, then the record):
/// a measurement of what the commit prevents, not a pass/fail test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: prints the duplicates made without the commit"]
async fn without_the_commit_killed_instances_create_second_orders() {
    let redis = RedisServer::start();
    let outcomes = runs("redis", false, || (redis.url(), Orders::Redis(redis.url()))).await;
    #[cfg(feature = "postgres")]
    let outcomes = {
        let postgres = PostgresServer::start();
        let mut all = outcomes;
        all.extend(
            runs("postgres", false, || {
                (redis.url(), Orders::Postgres(postgres.url()))
            })
            .await,
        );
        all
    };
    let duplicates: usize = outcomes.iter().map(|o| o.duplicates).sum();
    let keys: usize = outcomes.iter().map(|o| o.keys).sum();
    println!("without the commit: {duplicates} duplicates over {keys} keys");
}
