//! One run: the servers, two instances, the killer, the clients, and the
//! orders that are there at the end.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use test_support::{PostgresServer, RedisServer};

use super::service::Instance;
use super::{OrderPlan, OrderStore};
use crate::rng::Rng;

/// How long a client tries one key before it gives up on it.
pub const KEY_DEADLINE: Duration = Duration::from_secs(120);

/// The namespace of the service's Redis names and PostgreSQL rows (each
/// run has servers of its own).
const NAMESPACE: &str = "exactly-once";

/// One key's creation, as its client saw it.
#[derive(Clone, Debug)]
pub struct Key {
    /// The `Idempotency-Key` (and the order's item).
    pub name: String,
    /// When its first request was sent.
    pub first_try: Instant,
    /// The order id its `2xx` named, and when it came; `None`: no `2xx`
    /// within [`KEY_DEADLINE`].
    pub acknowledged: Option<(u64, Instant)>,
}

/// What a run did.
#[derive(Debug)]
pub struct Ran {
    /// When the clients began.
    pub started: Instant,
    /// Every key the clients took, in no particular order.
    pub keys: Vec<Key>,
    /// Instances killed (and restarted).
    pub kills: usize,
    /// Requests sent.
    pub requests: u64,
    /// Requests that got no `2xx`.
    pub failed: u64,
    /// Each order's item (the key it was created for), by id.
    pub orders: HashMap<u64, String>,
}

/// Creates orders through two instances of `bin` while a killer SIGKILLs
/// and restarts one of them `plan.kills` times, at random moments, as
/// `plan` says; the clients take new keys until the last kill, and finish
/// the one they are on. The servers are the run's own; the instances'
/// stderr goes to `dir`.
pub fn drive(bin: &Path, plan: &OrderPlan, dir: &Path) -> Result<Ran, String> {
    let redis = RedisServer::try_start(&[])?;
    let postgres = match plan.store {
        OrderStore::Postgres => Some(PostgresServer::try_start()?),
        OrderStore::Redis => None,
    };
    let mut env = vec![
        ("REDIS_URL".to_owned(), redis.url()),
        ("NAMESPACE".to_owned(), NAMESPACE.to_owned()),
        (
            "IDEMPOTENCY_COMMIT".to_owned(),
            if plan.commit { "on" } else { "off" }.to_owned(),
        ),
        ("IDEMPOTENCY_LEASE_MS".to_owned(), plan.lease_ms.to_string()),
    ];
    if let Some(pg) = &postgres {
        env.push(("DATABASE_URL".to_owned(), pg.url()));
    }
    // Both up before the first kill (a service that cannot start is a
    // harness error, not a run of keys that never get an answer), one
    // after the other: two first starts at once race to create the
    // PostgreSQL tables, and one of them fails.
    let mut instances = Vec::new();
    for i in 0..2 {
        let log = dir.join(format!("order-service-{i}.stderr"));
        let mut instance = Instance::start(bin, &env, log)?;
        instance.listening(Duration::from_secs(30))?;
        instances.push(instance);
    }
    let ports: Vec<u16> = instances.iter().map(Instance::port).collect();
    let instances: Vec<Arc<Mutex<Instance>>> = instances
        .into_iter()
        .map(|i| Arc::new(Mutex::new(i)))
        .collect();

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    let mut seeds = Rng::from_os();
    let started = Instant::now();

    // The killer: one instance at a time, SIGKILLed then restarted at once,
    // `plan.kills` times.
    let killing = Arc::new(AtomicBool::new(true));
    let kills = Arc::new(AtomicUsize::new(0));
    let killer = {
        let (instances, killing, kills) = (instances.clone(), killing.clone(), kills.clone());
        let mut rng = Rng::new(seeds.next_u64());
        let ((lo, hi), total) = (plan.kill_every_ms, plan.kills);
        std::thread::spawn(move || -> Result<(), String> {
            let killed = (0..total).try_for_each(|_| {
                std::thread::sleep(Duration::from_millis(rng.range(lo, hi)));
                let victim = rng.range(0, instances.len() as u64 - 1) as usize;
                let mut instance = instances[victim].lock().unwrap_or_else(|e| e.into_inner());
                instance.restart()?;
                kills.fetch_add(1, Ordering::SeqCst);
                Ok(())
            });
            killing.store(false, Ordering::SeqCst);
            killed
        })
    };

    // The clients: new keys while the killer works, each until a `2xx`, on
    // either instance.
    let counts = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
    let clients: Vec<_> = (0..plan.clients)
        .map(|c| {
            let keys = (c..).step_by(plan.clients).map(|k| format!("key-{k}"));
            let rng = Rng::new(seeds.next_u64());
            runtime.spawn(client(
                keys,
                ports.clone(),
                rng,
                counts.clone(),
                killing.clone(),
            ))
        })
        .collect();
    let keys = runtime.block_on(async {
        let mut keys = Vec::new();
        for client in clients {
            keys.extend(
                client
                    .await
                    .map_err(|e| format!("a client failed: {e}"))??,
            );
        }
        Ok::<_, String>(keys)
    });
    let killed = killer
        .join()
        .map_err(|_| "the killer panicked".to_string())
        .and_then(|r| r);
    drop(instances);
    let keys = keys?;
    killed?;

    let orders = runtime.block_on(async {
        match &postgres {
            Some(pg) => postgres_orders(&pg.url()).await,
            None => redis_orders(&redis.url()).await,
        }
    })?;
    Ok(Ran {
        started,
        keys,
        kills: kills.load(Ordering::SeqCst),
        requests: counts.0.load(Ordering::SeqCst),
        failed: counts.1.load(Ordering::SeqCst),
        orders,
    })
}

/// One client: the next of `keys` while `killing`, each tried on a random
/// instance with a new connection and a random timeout (100-1000 ms) until
/// a `2xx`, 20-100 ms between tries (giving up after [`KEY_DEADLINE`]).
/// Counts requests and failed ones in `counts`.
async fn client(
    keys: impl Iterator<Item = String>,
    ports: Vec<u16>,
    mut rng: Rng,
    counts: Arc<(AtomicU64, AtomicU64)>,
    killing: Arc<AtomicBool>,
) -> Result<Vec<Key>, String> {
    // No connection reuse: each try opens its own.
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .map_err(|e| format!("HTTP client: {e}"))?;
    let mut done = Vec::new();
    for name in keys {
        if !killing.load(Ordering::SeqCst) {
            break;
        }
        let first_try = Instant::now();
        let mut acknowledged = None;
        while acknowledged.is_none() && first_try.elapsed() < KEY_DEADLINE {
            let port = ports[rng.range(0, ports.len() as u64 - 1) as usize];
            counts.0.fetch_add(1, Ordering::Relaxed);
            let sent = http
                .post(format!("http://127.0.0.1:{port}/orders"))
                .header("idempotency-key", format!("\"{name}\""))
                .json(&json!({ "item": name, "amount_cents": 100 }))
                .timeout(Duration::from_millis(rng.range(100, 1000)))
                .send()
                .await;
            if let Ok(r) = sent
                && r.status().is_success()
                && let Ok(body) = r.json::<Value>().await
            {
                // A `2xx` without an id names no order (0 is none).
                acknowledged = Some((body["id"].as_u64().unwrap_or(0), Instant::now()));
                break;
            }
            counts.1.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(rng.range(20, 100))).await;
        }
        done.push(Key {
            name,
            first_try,
            acknowledged,
        });
    }
    Ok(done)
}

/// The orders in Redis: ids 1 to the last one taken, each order's `item`
/// (ids taken by orders that never committed are gaps).
async fn redis_orders(url: &str) -> Result<HashMap<u64, String>, String> {
    let err = |e: redis::RedisError| format!("reading the orders: {e}");
    let client = redis::Client::open(url).map_err(err)?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(err)?;
    let last: Option<u64> = redis::cmd("GET")
        .arg(format!("{NAMESPACE}:order-ids"))
        .query_async(&mut conn)
        .await
        .map_err(err)?;
    let ids: Vec<u64> = (1..=last.unwrap_or(0)).collect();
    let mut pipe = redis::pipe();
    for id in &ids {
        pipe.cmd("HGET")
            .arg(format!("{NAMESPACE}:order:{id}"))
            .arg("item");
    }
    let items: Vec<Option<String>> = pipe.query_async(&mut conn).await.map_err(err)?;
    Ok(ids
        .into_iter()
        .zip(items)
        .filter_map(|(id, item)| Some((id, item?)))
        .collect())
}

/// The orders in PostgreSQL, each one's `item`.
async fn postgres_orders(url: &str) -> Result<HashMap<u64, String>, String> {
    use sqlx::Connection as _;
    let err = |e: sqlx::Error| format!("reading the orders: {e}");
    let mut conn = sqlx::PgConnection::connect(url).await.map_err(err)?;
    let rows: Vec<(i64, String)> =
        sqlx::query_as("SELECT id, item FROM orders WHERE namespace = $1")
            .bind(NAMESPACE)
            .fetch_all(&mut conn)
            .await
            .map_err(err)?;
    Ok(rows
        .into_iter()
        .map(|(id, item)| (id as u64, item))
        .collect())
}
