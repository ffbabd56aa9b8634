//! The order service's sweeper, a singleton job on leader election: two
//! instances behind one Redis, one leads and cancels an order left unpaid;
//! killed with SIGKILL, the other takes over within the lease and cancels
//! the next one with a higher term (seen in `GET /sweeper`, in its log, and
//! in the term each cancel was written with).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use test_support::topology::cli_port;
use test_support::{RedisServer, free_port};

const BIN: &str = env!("CARGO_BIN_EXE_order-service");

/// An `order-service` whose log lines are kept; killed on drop.
struct Instance {
    child: Child,
    base: String,
    port: u16,
    log: Arc<Mutex<Vec<String>>>,
}

impl Instance {
    fn start(redis: &str, namespace: &str) -> Self {
        let port = free_port();
        let mut child = Command::new(BIN)
            .env("REDIS_URL", redis)
            .env("NAMESPACE", namespace)
            .env("PORT", port.to_string())
            .env("CANCEL_UNPAID_AFTER_MS", "300")
            .env("SWEEP_EVERY_MS", "100")
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .env_remove("DATABASE_URL")
            .stdout(Stdio::piped())
            .spawn()
            .expect("start order-service");
        let log = Arc::new(Mutex::new(Vec::new()));
        let stdout = child.stdout.take().unwrap();
        let kept = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                kept.lock().unwrap().push(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(child.try_wait().unwrap().is_none(), "order-service exited");
            assert!(Instant::now() < deadline, "order-service did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        Instance {
            child,
            base: format!("http://127.0.0.1:{port}"),
            port,
            log,
        }
    }

    /// The sweeper's leader as this instance sees it.
    async fn sweeper(&self, http: &reqwest::Client) -> Value {
        let reply = http.get(format!("{}/sweeper", self.base)).send().await;
        reply.unwrap().json().await.unwrap()
    }

    /// Waits until this instance sees `leader` lead the sweeper; its term.
    async fn sees_leader(&self, http: &reqwest::Client, leader: &Instance) -> u64 {
        let label = format!("127.0.0.1:{} pid {}", leader.port, leader.child.id());
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let seen = self.sweeper(http).await;
            if seen["label"] == json!(label) {
                return seen["term"].as_u64().unwrap();
            }
            assert!(Instant::now() < deadline, "{label} does not lead: {seen}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn logged(&self, needle: &str) -> bool {
        self.log.lock().unwrap().iter().any(|l| l.contains(needle))
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Creates an order on `on`; its id.
async fn create(http: &reqwest::Client, on: &Instance) -> u64 {
    let reply = http
        .post(format!("{}/orders", on.base))
        .header("Idempotency-Key", format!("\"{}\"", free_port()))
        .json(&json!({"item": "book", "amount_cents": 1250}))
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 201);
    reply.json::<Value>().await.unwrap()["id"].as_u64().unwrap()
}

/// Waits until order `id` is cancelled; the term its cancel was written with.
async fn cancelled(http: &reqwest::Client, on: &Instance, redis: u16, ns: &str, id: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let order: Value = http
            .get(format!("{}/orders/{id}", on.base))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if order["status"] == "cancelled" {
            let key = format!("{ns}:order:{id}");
            let term = cli_port(redis, &["HGET", &key, "cancelled_in_term"]);
            return term.parse().unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "order {id} not cancelled: {order}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_one_sweeps_and_after_a_kill_the_other_sweeps_with_a_higher_term() {
    let redis = RedisServer::start();
    let ns = format!("sweep-{}", free_port());
    let http = reqwest::Client::new();
    let mut a = Instance::start(&redis.url(), &ns);
    let first = a.sees_leader(&http, &a).await;
    let b = Instance::start(&redis.url(), &ns);
    assert_eq!(b.sees_leader(&http, &a).await, first, "B sees A lead");

    let one = create(&http, &b).await;
    assert_eq!(cancelled(&http, &b, redis.port, &ns, one).await, first);
    assert!(
        a.logged(&format!("term={first}")),
        "A logs its sweeps' term"
    );
    assert!(
        !b.logged("sweeper: elected"),
        "B does not sweep while A leads"
    );

    a.child.kill().unwrap(); // SIGKILL
    let killed = Instant::now();
    let second = b.sees_leader(&http, &b).await;
    let took = killed.elapsed();
    println!("B took over {took:?} after A was killed (lease 5 s), term {first} -> {second}");
    assert!(took < Duration::from_secs(7), "{took:?}");
    assert!(second > first);

    let two = create(&http, &b).await;
    assert_eq!(cancelled(&http, &b, redis.port, &ns, two).await, second);
    assert!(
        b.logged(&format!("term={second}")),
        "B logs its sweeps' term"
    );
}
