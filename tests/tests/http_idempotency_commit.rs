//! `IdempotencyLayer` with a commit store: the handler's writes and the
//! completed record commit together through `Commit`, on PostgreSQL (a row
//! in the handler's transaction) and on Redis (one script with its
//! commands). A "process" is a runtime of its own, shut down without
//! clean-up like a killed one: a crash after the commit is replayed, a crash
//! before it runs the work again, once; a handler that does not use the
//! `Commit` keeps the layer's record only.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use lock_runtime::LockClient;
use lock_runtime::layer::IdempotencyLayer;
use lock_runtime::layer::idempotency::{Commit, POSTGRES_SCHEMA};
use redis::aio::ConnectionManager;
use serde_json::{Value, json};
use sqlx::PgPool;
use test_support::helpers::{ms, one_worker_runtime, secs};
use test_support::{PostgresServer, RedisServer};
use tokio::sync::mpsc;

/// Where the handler writes its orders, and the layer its committed records.
#[derive(Clone)]
enum Store {
    Redis(ConnectionManager),
    Postgres(PgPool),
}

/// What the handler does with its `Commit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Writes the order and the record together, then answers.
    Commits,
    /// Commits, says so, then hangs: the process is killed before the layer
    /// completes its own record.
    CommitsThenHangs,
    /// Writes the order in its transaction (PostgreSQL) or prepares it
    /// (Redis), says so, then hangs before committing.
    HangsBeforeCommit,
    /// Writes the order without the `Commit` (as a handler written before it).
    Ignores,
    /// As `HangsBeforeCommit`, then commits when told to go on: a claimer
    /// paused past its lease.
    PausesBeforeCommit,
}

#[derive(Clone)]
struct App {
    store: Store,
    mode: Mode,
    runs: Arc<AtomicUsize>,
    /// Told when the handler reached the point where it hangs.
    reached: mpsc::UnboundedSender<()>,
    /// What a paused handler waits for.
    go: Arc<tokio::sync::Notify>,
}

async fn create_order(
    State(app): State<App>,
    commit: Option<Commit>,
    Json(body): Json<Value>,
) -> Result<Response, StatusCode> {
    app.runs.fetch_add(1, Ordering::SeqCst);
    let item = body["item"].as_str().unwrap_or_default().to_owned();
    let failed = |e: &dyn std::fmt::Display| {
        eprintln!("handler failed: {e}");
        StatusCode::SERVICE_UNAVAILABLE
    };
    let answer = |id: i64| {
        (
            StatusCode::CREATED,
            [(header::LOCATION, format!("/orders/{id}"))],
            Json(json!({ "id": id, "item": item })),
        )
    };
    let hang = || async {
        let _ = app.reached.send(());
        std::future::pending::<()>().await;
    };
    let pause = || async {
        let _ = app.reached.send(());
        app.go.notified().await;
    };
    match &app.store {
        Store::Postgres(pool) => {
            let mut tx = pool.begin().await.map_err(|e| failed(&e))?;
            let id: i64 = sqlx::query_scalar("INSERT INTO orders (item) VALUES ($1) RETURNING id")
                .bind(&item)
                .fetch_one(&mut *tx)
                .await
                .map_err(|e| failed(&e))?;
            if app.mode == Mode::Ignores {
                tx.commit().await.map_err(|e| failed(&e))?;
                return Ok(answer(id).into_response());
            }
            if app.mode == Mode::HangsBeforeCommit {
                hang().await;
            }
            if app.mode == Mode::PausesBeforeCommit {
                pause().await;
            }
            let commit = commit.ok_or(StatusCode::INTERNAL_SERVER_ERROR)?;
            let response = commit
                .postgres(tx, answer(id))
                .await
                .map_err(|e| failed(&e))?;
            if app.mode == Mode::CommitsThenHangs {
                hang().await;
            }
            Ok(response)
        }
        Store::Redis(conn) => {
            let id: i64 = redis::cmd("INCR")
                .arg("order-ids")
                .query_async(&mut conn.clone())
                .await
                .map_err(|e| failed(&e))?;
            let write = redis::cmd("HSET")
                .arg(format!("order:{id}"))
                .arg("item")
                .arg(&item)
                .clone();
            let index = redis::cmd("RPUSH").arg("orders").arg(id).clone();
            if app.mode == Mode::Ignores {
                let () = redis::pipe()
                    .add_command(write)
                    .ignore()
                    .add_command(index)
                    .ignore()
                    .query_async(&mut conn.clone())
                    .await
                    .map_err(|e| failed(&e))?;
                return Ok(answer(id).into_response());
            }
            if app.mode == Mode::HangsBeforeCommit {
                hang().await;
            }
            if app.mode == Mode::PausesBeforeCommit {
                pause().await;
            }
            let commit = commit.ok_or(StatusCode::INTERNAL_SERVER_ERROR)?;
            let response = commit
                .redis()
                .cmd(write)
                .cmd(index)
                .respond(answer(id))
                .await
                .map_err(|e| failed(&e))?;
            if app.mode == Mode::CommitsThenHangs {
                hang().await;
            }
            Ok(response)
        }
    }
}

impl Store {
    /// The store as a process of its own holds it: a PostgreSQL pool of
    /// its own ([`PostgresServer::own_pool`]).
    async fn own(&self) -> Store {
        match self {
            Store::Postgres(pool) => Store::Postgres(PostgresServer::own_pool(pool).await),
            Store::Redis(conn) => Store::Redis(conn.clone()),
        }
    }
}

/// One test's servers: Redis (locks, and the Redis store) and PostgreSQL.
struct Servers {
    redis: RedisServer,
    postgres: PostgresServer,
}

impl Servers {
    fn start() -> Self {
        Servers {
            redis: RedisServer::start(),
            postgres: PostgresServer::start(),
        }
    }

    /// Both stores, freshly set up.
    async fn stores(&self) -> [(&'static str, Store); 2] {
        let client = redis::Client::open(self.redis.url()).unwrap();
        let conn = ConnectionManager::new(client).await.unwrap();
        let orders = "CREATE TABLE orders (id bigserial PRIMARY KEY, item text NOT NULL)";
        let pool = self
            .postgres
            .pool(10, &format!("{POSTGRES_SCHEMA}\n{orders}"))
            .await;
        [
            ("redis", Store::Redis(conn)),
            ("postgres", Store::Postgres(pool)),
        ]
    }
}

/// A "process" serving the app: its own runtime and lock client, so that
/// dropping it stops everything at once, with no clean-up (no release, no
/// completion, no renewal), as a kill does.
struct Process {
    runtime: Option<tokio::runtime::Runtime>,
    base: String,
    runs: Arc<AtomicUsize>,
    reached: mpsc::UnboundedReceiver<()>,
    go: Arc<tokio::sync::Notify>,
}

impl Process {
    async fn start(redis: &RedisServer, store: &Store, mode: Mode, prefix: &str) -> Self {
        Self::start_failing(redis, store, mode, prefix, false).await
    }

    /// [`Process::start`], with the layer's `fail_open(fail_open)`.
    async fn start_failing(
        redis: &RedisServer,
        store: &Store,
        mode: Mode,
        prefix: &str,
        fail_open: bool,
    ) -> Self {
        let runtime = one_worker_runtime();
        let (reached_tx, reached) = mpsc::unbounded_channel();
        let runs = Arc::new(AtomicUsize::new(0));
        let go = Arc::new(tokio::sync::Notify::new());
        let app = App {
            go: go.clone(),
            store: store.clone(),
            mode,
            runs: runs.clone(),
            reached: reached_tx,
        };
        // Each store's records under a prefix of their own on the one Redis.
        let kind = match store {
            Store::Redis(_) => "redis",
            Store::Postgres(_) => "postgres",
        };
        let (url, prefix) = (redis.url(), format!("{prefix}{kind}:"));
        let base = runtime
            .spawn(async move {
                let mut app = app;
                app.store = app.store.own().await;
                let client = LockClient::builder()
                    .redis(url)
                    .key_prefix(prefix)
                    .build()
                    .await
                    .unwrap();
                let layer = IdempotencyLayer::new(client)
                    .records_shared_by_all_callers()
                    // A short lease: a killed claimer's key is free soon.
                    .ttl(ms(600))
                    .fail_open(fail_open);
                let layer = match &app.store {
                    Store::Redis(conn) => layer.commit_with_redis(conn.clone()),
                    Store::Postgres(pool) => layer.commit_with_postgres(pool.clone()),
                };
                let router = Router::new()
                    .route("/orders", post(create_order).route_layer(layer))
                    .with_state(app);
                test_support::http::serve(router).await
            })
            .await
            .unwrap();
        Process {
            runtime: Some(runtime),
            base,
            runs,
            reached,
            go,
        }
    }

    fn post(&self, key: &str, item: &str) -> reqwest::RequestBuilder {
        reqwest::Client::new()
            .post(format!("{}/orders", self.base))
            .header("idempotency-key", format!("\"{key}\""))
            .json(&json!({ "item": item }))
            .timeout(secs(5))
    }

    /// Waits until the handler hangs at its point, then kills the process.
    async fn killed_when_hanging(mut self) {
        tokio::time::timeout(secs(10), self.reached.recv())
            .await
            .expect("the handler reached its hang")
            .unwrap();
        self.kill();
    }

    fn kill(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Sends the request until it gets a `2xx` (a `409` while the first claim's
/// lease runs); returns it and whether it was replayed.
async fn until_answered(request: impl Fn() -> reqwest::RequestBuilder) -> (Value, bool) {
    for _ in 0..100 {
        match request().send().await {
            Ok(r) if r.status().is_success() => {
                let replayed = r.headers().get("idempotent-replayed").is_some();
                return (r.json().await.unwrap(), replayed);
            }
            Ok(r) if r.status() == StatusCode::CONFLICT => {}
            Ok(r) => panic!("unexpected answer {}", r.status()),
            Err(_) => {}
        }
        tokio::time::sleep(ms(100)).await;
    }
    panic!("no answer after 100 tries");
}

/// Deletes every idempotency claim under `prefix` on the lock server: the
/// leases of claimers paused past them ran out.
async fn claims_expire(redis: &RedisServer, prefix: &str) {
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let claims: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}I{{*}}"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(!claims.is_empty(), "no claim under {prefix}");
    let _: () = redis::cmd("DEL")
        .arg(&claims)
        .query_async(&mut conn)
        .await
        .unwrap();
}

/// The orders in `store`, as `(id, item)`.
async fn orders(store: &Store) -> Vec<(i64, String)> {
    match store {
        Store::Postgres(pool) => sqlx::query_as("SELECT id, item FROM orders ORDER BY id")
            .fetch_all(pool)
            .await
            .unwrap(),
        Store::Redis(conn) => {
            let mut conn = conn.clone();
            let ids: Vec<i64> = redis::cmd("LRANGE")
                .arg("orders")
                .arg(0)
                .arg(-1)
                .query_async(&mut conn)
                .await
                .unwrap();
            let mut out = Vec::new();
            for id in ids {
                let item: String = redis::cmd("HGET")
                    .arg(format!("order:{id}"))
                    .arg("item")
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                out.push((id, item));
            }
            out
        }
    }
}

/// How many committed records `store` holds.
async fn committed_records(store: &Store) -> usize {
    match store {
        Store::Postgres(pool) => {
            let n: i64 = sqlx::query_scalar("SELECT count(*) FROM lock_idempotency")
                .fetch_one(pool)
                .await
                .unwrap();
            n as usize
        }
        Store::Redis(conn) => {
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg("*:committed")
                .query_async(&mut conn.clone())
                .await
                .unwrap();
            keys.len()
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_order_and_its_record_commit_together_and_a_retry_is_replayed() {
    let servers = Servers::start();
    for (name, store) in servers.stores().await {
        let process = Process::start(&servers.redis, &store, Mode::Commits, "a:").await;
        let (first, replayed) = until_answered(|| process.post("k-1", "book")).await;
        assert!(!replayed, "{name}");
        assert_eq!(
            committed_records(&store).await,
            1,
            "{name}: the record committed"
        );
        let (again, replayed) = until_answered(|| process.post("k-1", "book")).await;
        assert!(replayed, "{name}");
        assert_eq!(again, first, "{name}");
        assert_eq!(process.runs(), 1, "{name}");
        assert_eq!(orders(&store).await, [(1, "book".to_owned())], "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_killed_after_its_commit_is_replayed_not_run_again() {
    let servers = Servers::start();
    for (name, store) in servers.stores().await {
        let a = Process::start(&servers.redis, &store, Mode::CommitsThenHangs, "b:").await;
        let cut_off = a.post("k-2", "lamp").timeout(secs(30)).send();
        let cut_off = tokio::spawn(cut_off);
        a.killed_when_hanging().await;
        let _ = cut_off.await;
        // The layer's record was never completed: only the committed one
        // says the work happened.
        let b = Process::start(&servers.redis, &store, Mode::Commits, "b:").await;
        let (answer, replayed) = until_answered(|| b.post("k-2", "lamp")).await;
        assert!(replayed, "{name}: the retry ran the handler again");
        assert_eq!(b.runs(), 0, "{name}");
        assert_eq!(answer, json!({ "id": 1, "item": "lamp" }), "{name}");
        assert_eq!(orders(&store).await, [(1, "lamp".to_owned())], "{name}");
        // The replay was copied into the layer's record: the next retry gets
        // it from there too.
        let (again, replayed) = until_answered(|| b.post("k-2", "lamp")).await;
        assert!(replayed && again == answer, "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_killed_before_its_commit_leaves_nothing_and_the_retry_runs_once() {
    let servers = Servers::start();
    for (name, store) in servers.stores().await {
        let a = Process::start(&servers.redis, &store, Mode::HangsBeforeCommit, "c:").await;
        let cut_off = tokio::spawn(a.post("k-3", "desk").timeout(secs(30)).send());
        a.killed_when_hanging().await;
        let _ = cut_off.await;
        let b = Process::start(&servers.redis, &store, Mode::Commits, "c:").await;
        let (answer, replayed) = until_answered(|| b.post("k-3", "desk")).await;
        assert!(!replayed, "{name}: nothing committed, so the work runs");
        assert_eq!(b.runs(), 1, "{name}");
        let made = orders(&store).await;
        assert_eq!(made.len(), 1, "{name}: {made:?}");
        assert_eq!(answer["id"], made[0].0, "{name}");
        assert_eq!(committed_records(&store).await, 1, "{name}");
        let (again, replayed) = until_answered(|| b.post("k-3", "desk")).await;
        assert!(replayed && again == answer, "{name}");
        assert_eq!(b.runs(), 1, "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_does_not_commit_keeps_the_layers_record_only() {
    let servers = Servers::start();
    for (name, store) in servers.stores().await {
        let process = Process::start(&servers.redis, &store, Mode::Ignores, "d:").await;
        let (first, replayed) = until_answered(|| process.post("k-4", "pen")).await;
        assert!(!replayed, "{name}");
        let (again, replayed) = until_answered(|| process.post("k-4", "pen")).await;
        assert!(
            replayed && again == first,
            "{name}: replayed from the layer's record"
        );
        assert_eq!(process.runs(), 1, "{name}");
        assert_eq!(
            committed_records(&store).await,
            0,
            "{name}: nothing committed with it"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_commit_releases_the_claim_so_the_retry_runs() {
    let servers = Servers::start();
    for (name, store) in servers.stores().await {
        // The commit fails: a key of the wrong type (Redis), a constraint
        // refusing the record (PostgreSQL). Nothing committed, and the 503
        // is not stored.
        match &store {
            Store::Redis(conn) => {
                let () = redis::cmd("SET")
                    .arg("orders")
                    .arg("not a list")
                    .query_async(&mut conn.clone())
                    .await
                    .unwrap();
            }
            Store::Postgres(pool) => {
                sqlx::raw_sql(
                    "ALTER TABLE lock_idempotency ADD CONSTRAINT refused CHECK (status <> 201)",
                )
                .execute(pool)
                .await
                .unwrap();
            }
        }
        let process = Process::start(&servers.redis, &store, Mode::Commits, "e:").await;
        let r = process.post("k-5", "cup").send().await.unwrap();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE, "{name}");
        assert!(r.headers().get("idempotent-replayed").is_none(), "{name}");
        match &store {
            Store::Redis(conn) => {
                let () = redis::cmd("DEL")
                    .arg("orders")
                    .query_async(&mut conn.clone())
                    .await
                    .unwrap();
            }
            Store::Postgres(pool) => {
                sqlx::raw_sql("ALTER TABLE lock_idempotency DROP CONSTRAINT refused")
                    .execute(pool)
                    .await
                    .unwrap();
            }
        }
        let (answer, replayed) = until_answered(|| process.post("k-5", "cup")).await;
        assert!(!replayed, "{name}: the failed attempt was stored");
        assert_eq!(process.runs(), 2, "{name}");
        assert_eq!(committed_records(&store).await, 1, "{name}");
        assert_eq!(answer["item"], "cup", "{name}");
    }
}

/// The handler's own write fails before its commit (a table being
/// migrated, a counter of the wrong type): its `503` is not stored, though
/// the layer stores `5xx` by default, and the retry runs the work. It was
/// replayed for the record's retention before (and no order was ever made).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_fails_before_its_commit_is_run_again_not_replayed() {
    let servers = Servers::start();
    for (name, store) in servers.stores().await {
        let (broken, fixed) = match &store {
            Store::Redis(_) => ("SET order-ids not-a-number", "DEL order-ids"),
            Store::Postgres(_) => (
                "ALTER TABLE orders RENAME TO orders_moved",
                "ALTER TABLE orders_moved RENAME TO orders",
            ),
        };
        let run = |sql: &'static str| {
            let store = store.clone();
            async move {
                match store {
                    Store::Redis(conn) => {
                        let words: Vec<&str> = sql.split(' ').collect();
                        let () = redis::cmd(words[0])
                            .arg(&words[1..])
                            .query_async(&mut conn.clone())
                            .await
                            .unwrap();
                    }
                    Store::Postgres(pool) => {
                        sqlx::raw_sql(sql).execute(&pool).await.unwrap();
                    }
                }
            }
        };
        run(broken).await;
        let process = Process::start(&servers.redis, &store, Mode::Commits, "f:").await;
        let r = process.post("k-8", "lamp").send().await.unwrap();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE, "{name}");
        run(fixed).await;
        let (answer, replayed) = until_answered(|| process.post("k-8", "lamp")).await;
        assert!(!replayed, "{name}: the 503 was stored");
        assert_eq!(process.runs(), 2, "{name}");
        assert_eq!(answer["item"], "lamp", "{name}");
        assert_eq!(orders(&store).await.len(), 1, "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_committed_records_are_ignored_and_pruned_in_batches() {
    let servers = Servers::start();
    let [_, (_, store)] = servers.stores().await;
    let Store::Postgres(pool) = &store else {
        unreachable!()
    };
    sqlx::raw_sql(
        "INSERT INTO lock_idempotency
             (record, fingerprint, status, headers, body, body_too_large, expires_at)
         SELECT 'old-' || n, 'f', 201, '', '', false, now() - interval '1 hour'
         FROM generate_series(1, 7) n",
    )
    .execute(pool)
    .await
    .unwrap();
    let pruned = lock_runtime::layer::idempotency::prune_postgres(pool, 5)
        .await
        .unwrap();
    assert_eq!(pruned, 5);
    assert_eq!(committed_records(&store).await, 2);
    let pruned = lock_runtime::layer::idempotency::prune_postgres(pool, 5)
        .await
        .unwrap();
    assert_eq!(pruned, 2);
    assert_eq!(committed_records(&store).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimer_paused_past_its_lease_cannot_commit_a_second_time() {
    let servers = Servers::start();
    for (name, store) in servers.stores().await {
        let mut a = Process::start(&servers.redis, &store, Mode::PausesBeforeCommit, "f:").await;
        let first = tokio::spawn(a.post("k-6", "bowl").timeout(secs(30)).send());
        if tokio::time::timeout(secs(10), a.reached.recv())
            .await
            .is_err()
        {
            let r = first.await.unwrap();
            let r = match r {
                Ok(r) => format!("{} {:?}", r.status(), r.text().await),
                Err(e) => format!("{e:?}"),
            };
            panic!("{name}: the handler did not pause: {r}");
        }
        // A's lease runs out while it is paused; B claims, runs, commits.
        claims_expire(&servers.redis, &format!("f:{name}:")).await;
        let b = Process::start(&servers.redis, &store, Mode::Commits, "f:").await;
        let (answer, replayed) = until_answered(|| b.post("k-6", "bowl")).await;
        assert!(!replayed, "{name}");
        // A wakes up and commits: it finds B's record, writes nothing, and
        // answers with B's response.
        a.go.notify_one();
        let late = first.await.unwrap().unwrap();
        assert!(late.status().is_success(), "{name}: {}", late.status());
        assert!(
            late.headers().get("idempotent-replayed").is_some(),
            "{name}"
        );
        assert_eq!(late.json::<Value>().await.unwrap(), answer, "{name}");
        let made = orders(&store).await;
        assert_eq!(made.len(), 1, "{name}: {made:?}");
        assert_eq!(committed_records(&store).await, 1, "{name}");
    }
}

/// A commit store that cannot be read when a request is claimed (its table
/// renamed away): `503` with `Retry-After`, the handler does not run, and
/// the claim is released, so the retry once the store is back runs it, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_store_that_cannot_be_read_refuses_the_request_and_releases_the_claim() {
    let servers = Servers::start();
    let [_, (_, store)] = servers.stores().await;
    let process = Process::start(&servers.redis, &store, Mode::Commits, "g:").await;
    rename_table(&store, "lock_idempotency", "elsewhere").await;
    let r = process.post("k-8", "mug").send().await.unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.headers().get(header::RETRY_AFTER).is_some());
    assert_eq!(process.runs(), 0);
    rename_table(&store, "elsewhere", "lock_idempotency").await;
    // Released at once: answered now, not after the claim's lease.
    let r = process.post("k-8", "mug").send().await.unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(process.runs(), 1);
    assert_eq!(orders(&store).await, [(1, "mug".to_owned())]);
}

/// The same store, unreadable, behind a layer that fails open: the handler
/// runs unprotected (no `Commit`, as when the lock backend cannot be
/// reached), and each try runs it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layer_that_fails_open_runs_the_handler_unprotected_when_its_store_cannot_be_read() {
    let servers = Servers::start();
    let [_, (_, store)] = servers.stores().await;
    let process = Process::start_failing(&servers.redis, &store, Mode::Ignores, "h:", true).await;
    rename_table(&store, "lock_idempotency", "elsewhere").await;
    for runs in 1..=2 {
        let r = process.post("k-9", "jar").send().await.unwrap();
        assert_eq!(r.status(), StatusCode::CREATED);
        assert!(r.headers().get("idempotent-replayed").is_none());
        assert_eq!(process.runs(), runs);
    }
}

/// Renames a table of the PostgreSQL `store` (the commit store's, to make it
/// unreadable, and back).
async fn rename_table(store: &Store, from: &str, to: &str) {
    let Store::Postgres(pool) = store else {
        unreachable!("a table of the PostgreSQL store");
    };
    sqlx::raw_sql(&format!("ALTER TABLE {from} RENAME TO {to}"))
        .execute(pool)
        .await
        .unwrap();
}
