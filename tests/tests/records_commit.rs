//! Idempotency records committed with their work in one step, as a queue
//! consumer paying for a message uses them: in one PostgreSQL transaction
//! (`RecordRequest::commit_with_postgres`, `RecordGuard::commit_postgres`)
//! or one Redis script call (`commit_with_redis`, `commit_redis`), on a data
//! server beside the lock server. Every scenario runs on both stores. A
//! "process" is a runtime of its own, shut down without clean-up like a
//! killed one: killed after its commit (before the record on the lock server
//! was completed), the redelivered message finds the work done; killed
//! before it, the work runs again, once.

use std::time::Duration;

use lock_runtime::records::{COMMITTED_SUFFIX, Committed, POSTGRES_SCHEMA};
use lock_runtime::{Claimed, LockClient, LockError, RecordGuard, RecordRequest};
use redis::aio::ConnectionManager;
use sqlx::PgPool;
use test_support::helpers::{ms, one_worker_runtime, secs};
use test_support::{PostgresServer, RedisServer};
use tokio::sync::oneshot;

/// A short lease: a killed claimer's record is free soon.
const LEASE: Duration = Duration::from_millis(600);

/// Where the work writes, and its records commit.
#[derive(Clone)]
enum Store {
    Postgres(PgPool),
    Redis(ConnectionManager),
}

/// The lock server, and the two data servers.
struct Servers {
    locks: RedisServer,
    _postgres: PostgresServer,
    /// The Redis store's server.
    data: RedisServer,
    stores: [Store; 2],
}

impl Servers {
    async fn start() -> Self {
        let (locks, postgres, data) = (
            RedisServer::start(),
            PostgresServer::start(),
            RedisServer::start(),
        );
        let payments = "CREATE TABLE payments (message text NOT NULL, amount int NOT NULL)";
        let pool = postgres
            .pool(10, &format!("{POSTGRES_SCHEMA}\n{payments}"))
            .await;
        let stores = [Store::Postgres(pool), Store::Redis(manager(&data).await)];
        Servers {
            locks,
            _postgres: postgres,
            data,
            stores,
        }
    }

    async fn client(&self) -> LockClient {
        client(&self.locks).await
    }
}

async fn client(server: &RedisServer) -> LockClient {
    LockClient::builder()
        .redis(server.url())
        .build()
        .await
        .unwrap()
}

async fn manager(server: &RedisServer) -> ConnectionManager {
    redis::Client::open(server.url())
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap()
}

async fn flush(server: &RedisServer) {
    let _: () = redis::cmd("FLUSHALL")
        .query_async(&mut manager(server).await)
        .await
        .unwrap();
}

impl Store {
    fn name(&self) -> &'static str {
        match self {
            Store::Postgres(_) => "postgres",
            Store::Redis(_) => "redis",
        }
    }

    /// The store as a process of its own holds it: a PostgreSQL pool of
    /// its own ([`PostgresServer::own_pool`]).
    async fn own(&self) -> Store {
        match self {
            Store::Postgres(pool) => Store::Postgres(PostgresServer::own_pool(pool).await),
            Store::Redis(conn) => Store::Redis(conn.clone()),
        }
    }

    /// `request`, committed to this store.
    fn claim(&self, request: RecordRequest) -> RecordRequest {
        match self {
            Store::Postgres(pool) => request.commit_with_postgres(pool.clone()),
            Store::Redis(conn) => request.commit_with_redis(conn.clone()),
        }
    }

    /// The consumer's work for `message` (a payment), committed with
    /// `guard`'s record and `result`.
    async fn pay(
        &self,
        guard: RecordGuard,
        message: &str,
        result: &[u8],
    ) -> Result<Committed, LockError> {
        match self {
            Store::Postgres(pool) => {
                let mut tx = pool.begin().await.unwrap();
                sqlx::query("INSERT INTO payments (message, amount) VALUES ($1, 1250)")
                    .bind(message)
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                guard.commit_postgres(tx, result).await
            }
            Store::Redis(_) => guard.commit_redis(&payment(message), result).await,
        }
    }

    /// How many payments `message` got.
    async fn payments(&self, message: &str) -> i64 {
        match self {
            Store::Postgres(pool) => {
                sqlx::query_scalar("SELECT count(*) FROM payments WHERE message = $1")
                    .bind(message)
                    .fetch_one(pool)
                    .await
                    .unwrap()
            }
            Store::Redis(conn) => {
                let paid: Option<i64> = redis::cmd("GET")
                    .arg(format!("paid:{message}"))
                    .query_async(&mut conn.clone())
                    .await
                    .unwrap();
                paid.unwrap_or(0) / 1250
            }
        }
    }
}

/// A payment in Redis: its record and the running total.
fn payment(message: &str) -> [redis::Cmd; 2] {
    [
        redis::cmd("HSET")
            .arg(format!("payment:{message}"))
            .arg("amount")
            .arg(1250)
            .clone(),
        redis::cmd("INCRBY")
            .arg(format!("paid:{message}"))
            .arg(1250)
            .clone(),
    ]
}

/// Consumes `message` once: claims its record (waiting out another claimer's
/// lease), pays and commits; the claim's answer and what the commit did.
async fn consume(client: &LockClient, store: &Store, message: &str) -> (&'static str, Vec<u8>) {
    let request = client
        .record(message)
        .fingerprint(b"1250")
        .ttl(LEASE)
        .wait(secs(5));
    match store.claim(request).claim().await.unwrap() {
        Claimed::Run(guard) => match store.pay(guard, message, b"paid 1250").await {
            Ok(Committed::Ours) => ("ran", b"paid 1250".to_vec()),
            Ok(Committed::Earlier(result)) => ("ran, another committed", result),
            other => panic!("{}: unexpected commit {other:?}", store.name()),
        },
        Claimed::Done(result) => ("done", result),
        other => panic!("{}: unexpected claim {other:?}", store.name()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_work_and_its_record_commit_together_and_a_redelivery_gets_the_result() {
    let servers = Servers::start().await;
    let client = servers.client().await;
    for store in &servers.stores {
        let (name, message) = (store.name(), format!("m-1-{}", store.name()));
        let ran = consume(&client, store, &message).await;
        assert_eq!(ran, ("ran", b"paid 1250".to_vec()), "{name}");
        // Completed on the lock server too: a redelivery is answered there.
        let again = consume(&client, store, &message).await;
        assert_eq!(again, ("done", b"paid 1250".to_vec()), "{name}");
        assert_eq!(store.payments(&message).await, 1, "{name}");
    }
}

/// A Redis store may be the lock server itself; its committed copy sits
/// beside the record and expires with the retention (24 hours by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_store_on_the_lock_server_keeps_its_committed_copy_for_the_retention() {
    let server = RedisServer::start();
    let (client, store) = (client(&server).await, Store::Redis(manager(&server).await));
    assert_eq!(consume(&client, &store, "m-2").await.0, "ran");
    assert_eq!(consume(&client, &store, "m-2").await.0, "done");
    let mut conn = manager(&server).await;
    let copies: Vec<String> = redis::cmd("KEYS")
        .arg(format!("*{COMMITTED_SUFFIX}"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(copies.len(), 1, "{copies:?}");
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&copies[0])
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(ttl > 23 * 3600 * 1000, "{ttl}");
    assert_eq!(store.payments("m-2").await, 1);
}

/// Killed while its commit's completion of the record on the lock server
/// hangs (that server paused), after the store committed: once the record's
/// claim is gone, the redelivery finds the committed result instead of
/// paying again. Without the look before running, it would pay twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_killed_after_its_commit_is_not_run_again() {
    let servers = Servers::start().await;
    for store in &servers.stores {
        let (name, message) = (store.name(), format!("m-3-{}", store.name()));
        let process = one_worker_runtime();
        let (committing_tx, committing) = oneshot::channel();
        {
            let (url, store, message) = (servers.locks.url(), store.clone(), message.clone());
            let locks = servers.locks.pid().unwrap();
            process.spawn(async move {
                let store = store.own().await;
                let client = LockClient::builder().redis(url).build().await.unwrap();
                let request = client.record(&message).fingerprint(b"1250").ttl(LEASE);
                let Claimed::Run(guard) = store.claim(request).claim().await.unwrap() else {
                    panic!("not claimed");
                };
                // The lock server stops answering before the commit: the
                // completion that follows it never gets through.
                test_support::signal(locks, "STOP").unwrap();
                let _ = committing_tx.send(());
                let _ = store.pay(guard, &message, b"paid 1250").await;
                panic!("the completion got through a paused server");
            });
        }
        committing.await.unwrap();
        // The payment committed (the store is not paused), then the kill.
        let deadline = tokio::time::Instant::now() + secs(10);
        while store.payments(&message).await == 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{name}: never committed"
            );
            tokio::time::sleep(ms(20)).await;
        }
        tokio::time::sleep(ms(100)).await;
        process.shutdown_background();
        servers.locks.resume().unwrap();
        // The claim is gone. (Emptied at once rather than waiting out its
        // lease: a completion the killed process had written to its socket
        // may still reach the resumed server, and the record must be in
        // nobody's hands but the store's.)
        tokio::time::sleep(ms(100)).await;
        flush(&servers.locks).await;
        let client = servers.client().await;
        assert_eq!(
            consume(&client, store, &message).await,
            ("done", b"paid 1250".to_vec()),
            "{name}: the redelivered message ran again"
        );
        assert_eq!(store.payments(&message).await, 1, "{name}");
        // The committed result was copied into the record: the next claim
        // is answered there, without the store.
        let again = client.record(&message).fingerprint(b"1250").claim().await;
        assert!(
            matches!(again, Ok(Claimed::Done(r)) if r == b"paid 1250"),
            "{name}"
        );
    }
}

/// Killed before its commit (in PostgreSQL, with its transaction open):
/// nothing committed, and the redelivery (once the claim's lease ran out)
/// pays, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_killed_before_its_commit_leaves_nothing_and_the_work_runs_once() {
    let servers = Servers::start().await;
    for store in &servers.stores {
        let (name, message) = (store.name(), format!("m-4-{}", store.name()));
        let process = one_worker_runtime();
        let (paying_tx, paying) = oneshot::channel();
        {
            let (url, store, message) = (servers.locks.url(), store.clone(), message.clone());
            process.spawn(async move {
                let store = store.own().await;
                let client = LockClient::builder().redis(url).build().await.unwrap();
                let request = client.record(&message).fingerprint(b"1250").ttl(LEASE);
                let Claimed::Run(_guard) = store.claim(request).claim().await.unwrap() else {
                    panic!("not claimed");
                };
                let _tx = match &store {
                    Store::Postgres(pool) => {
                        let mut tx = pool.begin().await.unwrap();
                        sqlx::query("INSERT INTO payments (message, amount) VALUES ($1, 1250)")
                            .bind(&message)
                            .execute(&mut *tx)
                            .await
                            .unwrap();
                        Some(tx)
                    }
                    Store::Redis(_) => None,
                };
                let _ = paying_tx.send(());
                std::future::pending::<()>().await;
            });
        }
        paying.await.unwrap();
        process.shutdown_background();
        let client = servers.client().await;
        let ran = consume(&client, store, &message).await;
        assert_eq!(ran, ("ran", b"paid 1250".to_vec()), "{name}");
        assert_eq!(store.payments(&message).await, 1, "{name}");
    }
}

/// A claimer paused past its lease while a duplicate claimed, paid and
/// committed cannot commit a second time: nothing of its writes is
/// committed, and it is told the other's result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimer_paused_past_its_lease_cannot_commit_a_second_time() {
    let servers = Servers::start().await;
    let client = servers.client().await;
    for store in &servers.stores {
        let (name, message) = (store.name(), format!("m-5-{}", store.name()));
        let request = client.record(&message).fingerprint(b"1250").ttl(LEASE);
        let Claimed::Run(paused) = store.claim(request).claim().await.unwrap() else {
            panic!("{name}: not claimed");
        };
        // Its lease ran out (deleted here: the watchdog renews it).
        flush(&servers.locks).await;
        let other = servers.client().await;
        assert_eq!(consume(&other, store, &message).await.0, "ran", "{name}");
        let late = store.pay(paused, &message, b"paid 1250, late").await;
        assert_eq!(
            late.unwrap(),
            Committed::Earlier(b"paid 1250".to_vec()),
            "{name}"
        );
        assert_eq!(store.payments(&message).await, 1, "{name}: paid twice");
    }
}

/// A committed record is the payload's: another payload under the key is
/// `Reused`, even once the record on the lock server is gone (evicted, or
/// its server restarted empty).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_payload_under_a_committed_key_is_reused() {
    let servers = Servers::start().await;
    let client = servers.client().await;
    for store in &servers.stores {
        let (name, message) = (store.name(), format!("m-6-{}", store.name()));
        assert_eq!(consume(&client, store, &message).await.0, "ran", "{name}");
        flush(&servers.locks).await;
        let other_payload = client.record(&message).fingerprint(b"9999");
        let claimed = store.claim(other_payload).claim().await;
        assert!(
            matches!(claimed, Ok(Claimed::Reused)),
            "{name}: {claimed:?}"
        );
        // The claim released the record: the payload that committed is done.
        assert_eq!(consume(&client, store, &message).await.0, "done", "{name}");
        assert_eq!(store.payments(&message).await, 1, "{name}");
    }
}

/// A commit on a record claimed without a store is refused and writes
/// nothing; so is a Redis command off the allow-list. Either way the record
/// is released, not left in flight for its lease: the next claim runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_that_cannot_be_sent_is_refused_writes_nothing_and_releases_the_record() {
    let servers = Servers::start().await;
    let client = servers.client().await;
    for store in &servers.stores {
        let (name, message) = (store.name(), format!("m-7-{}", store.name()));
        let request = || {
            client
                .record(&message)
                .fingerprint(b"1250")
                .ttl(secs(30))
                .wait(secs(5))
        };
        let Claimed::Run(guard) = request().claim().await.unwrap() else {
            panic!("{name}: not claimed");
        };
        let e = store.pay(guard, &message, b"paid").await.unwrap_err();
        let setter = format!("commit_with_{name}");
        assert!(
            matches!(&e, LockError::Config(why) if why.contains(&setter)),
            "{name}: {e}"
        );
        if let Store::Redis(_) = store {
            let Claimed::Run(guard) = store.claim(request()).claim().await.unwrap() else {
                panic!("{name}: the record was left in flight");
            };
            let [pay, _] = payment(&message);
            let writes = [pay, redis::cmd("FLUSHALL").clone()];
            let e = guard.commit_redis(&writes, b"paid").await.unwrap_err();
            assert!(
                matches!(&e, LockError::Config(why) if why.contains("FLUSHALL")),
                "{e}"
            );
        }
        assert_eq!(store.payments(&message).await, 0, "{name}");
        let ran = consume(&client, store, &message).await;
        assert_eq!(ran, ("ran", b"paid 1250".to_vec()), "{name}");
    }
}

/// The embedded backend's records commit the same way: a new process (a new
/// embedded store) finds the work done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_of_the_embedded_backend_commit_too() {
    let servers = Servers::start().await;
    for store in &servers.stores {
        let (name, message) = (store.name(), format!("m-8-{}", store.name()));
        let client = LockClient::builder().memory().build().await.unwrap();
        assert_eq!(consume(&client, store, &message).await.0, "ran", "{name}");
        let fresh = LockClient::builder().memory().build().await.unwrap();
        let again = consume(&fresh, store, &message).await;
        assert_eq!(again, ("done", b"paid 1250".to_vec()), "{name}");
        assert_eq!(store.payments(&message).await, 1, "{name}");
    }
}

/// A store that cannot be read when the record is claimed (PostgreSQL: its
/// table gone; Redis: its server down): the claim fails with `Backend`, the
/// work does not run, and the record is released, not left in flight for
/// its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_store_cannot_be_read_fails_and_releases_the_record() {
    let mut servers = Servers::start().await;
    let client = servers.client().await;
    if let Store::Postgres(pool) = &servers.stores[0] {
        sqlx::raw_sql("ALTER TABLE lock_idempotency RENAME TO elsewhere")
            .execute(pool)
            .await
            .unwrap();
    }
    servers.data.kill();
    for store in &servers.stores {
        let (name, message) = (store.name(), format!("m-9-{}", store.name()));
        let request = client.record(&message).fingerprint(b"1250").ttl(secs(30));
        let claimed = store.claim(request).claim().await;
        assert!(
            matches!(&claimed, Err(LockError::Backend(_))),
            "{name}: {claimed:?}"
        );
        // Released: claimed again at once, without a wait.
        let again = client.record(&message).fingerprint(b"1250").claim().await;
        assert!(matches!(again, Ok(Claimed::Run(_))), "{name}: {again:?}");
    }
}
