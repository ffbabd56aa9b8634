//! Idempotency records committed with their work in one PostgreSQL
//! transaction (`RecordRequest::commit_with_postgres`,
//! `RecordGuard::commit_postgres`), as a queue consumer paying for a message
//! uses them. A "process" is a runtime of its own, shut down without
//! clean-up like a killed one: killed after its commit (before the record on
//! Redis was completed), the redelivered message finds the work done; killed
//! before it, the work runs again, once.

use std::time::Duration;

use lock_runtime::records::{Committed, POSTGRES_SCHEMA};
use lock_runtime::{Claimed, LockClient, LockError};
use sqlx::PgPool;
use test_support::helpers::{ms, one_worker_runtime, secs};
use test_support::{PostgresServer, RedisServer};
use tokio::sync::oneshot;

/// A short lease: a killed claimer's record is free soon.
const LEASE: Duration = Duration::from_millis(600);

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

    async fn pool(&self) -> PgPool {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(10)
            .acquire_timeout(secs(20))
            .connect(&self.postgres.url())
            .await
            .unwrap();
        sqlx::raw_sql(POSTGRES_SCHEMA).execute(&pool).await.unwrap();
        sqlx::raw_sql("CREATE TABLE payments (message text NOT NULL, amount int NOT NULL)")
            .execute(&pool)
            .await
            .unwrap();
        pool
    }

    async fn client(&self) -> LockClient {
        LockClient::builder()
            .redis(self.redis.url())
            .build()
            .await
            .unwrap()
    }
}

/// The consumer's work: a payment row for `message`, in `tx`.
async fn pay(tx: &mut sqlx::Transaction<'_, sqlx::Postgres>, message: &str) {
    sqlx::query("INSERT INTO payments (message, amount) VALUES ($1, 1250)")
        .bind(message)
        .execute(&mut **tx)
        .await
        .unwrap();
}

async fn payments(pool: &PgPool, message: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM payments WHERE message = $1")
        .bind(message)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Consumes `message` once: claims its record (waiting out another claimer's
/// lease), pays and commits; the claim's answer and what the commit did.
async fn consume(client: &LockClient, pool: &PgPool, message: &str) -> (&'static str, Vec<u8>) {
    let claim = client
        .record(message)
        .fingerprint(b"1250")
        .ttl(LEASE)
        .wait(secs(5))
        .commit_with_postgres(pool.clone());
    match claim.claim().await.unwrap() {
        Claimed::Run(guard) => {
            let mut tx = pool.begin().await.unwrap();
            pay(&mut tx, message).await;
            match guard.commit_postgres(tx, b"paid 1250").await.unwrap() {
                Committed::Ours => ("ran", b"paid 1250".to_vec()),
                Committed::Earlier(result) => ("ran, another committed", result),
                other => panic!("unexpected commit {other:?}"),
            }
        }
        Claimed::Done(result) => ("done", result),
        other => panic!("unexpected claim {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_work_and_its_record_commit_together_and_a_redelivery_gets_the_result() {
    let servers = Servers::start();
    let (pool, client) = (servers.pool().await, servers.client().await);
    assert_eq!(
        consume(&client, &pool, "m-1").await,
        ("ran", b"paid 1250".to_vec())
    );
    // Completed on Redis too: a redelivery is answered there.
    assert_eq!(
        consume(&client, &pool, "m-1").await,
        ("done", b"paid 1250".to_vec())
    );
    assert_eq!(payments(&pool, "m-1").await, 1);
}

/// Killed while its commit's completion of the record on Redis hangs (the
/// server paused), after PostgreSQL committed: once the record's claim is
/// gone, the redelivery finds the committed result instead of paying again.
/// Without the look before running, it would pay twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_killed_after_its_commit_is_not_run_again() {
    let servers = Servers::start();
    let pool = servers.pool().await;
    let process = one_worker_runtime();
    let (committed_tx, committed) = oneshot::channel();
    {
        let (url, pool) = (servers.redis.url(), pool.clone());
        let redis = servers.redis.pid().unwrap();
        process.spawn(async move {
            let client = LockClient::builder().redis(url).build().await.unwrap();
            let claim = client
                .record("m-2")
                .fingerprint(b"1250")
                .ttl(LEASE)
                .commit_with_postgres(pool.clone());
            let Claimed::Run(guard) = claim.claim().await.unwrap() else {
                panic!("not claimed");
            };
            let mut tx = pool.begin().await.unwrap();
            pay(&mut tx, "m-2").await;
            // The lock server stops answering before the commit: the
            // completion that follows it never gets through.
            test_support::signal(redis, "STOP").unwrap();
            let _ = committed_tx.send(());
            let _ = guard.commit_postgres(tx, b"paid 1250").await;
            panic!("the completion got through a paused server");
        });
    }
    committed.await.unwrap();
    // The payment committed (PostgreSQL is not paused), then the kill.
    let deadline = tokio::time::Instant::now() + secs(10);
    while payments(&pool, "m-2").await == 0 {
        assert!(tokio::time::Instant::now() < deadline, "never committed");
        tokio::time::sleep(ms(20)).await;
    }
    tokio::time::sleep(ms(100)).await;
    process.shutdown_background();
    servers.redis.resume().unwrap();
    // The claim's lease runs out with nobody renewing it. (Emptied at once
    // instead: a completion the killed process had written to its socket
    // may still reach the resumed server, and the record must be in
    // nobody's hands but the store's.)
    tokio::time::sleep(ms(100)).await;
    let _: () = redis::cmd("FLUSHALL")
        .query_async(&mut redis_conn(&servers.redis).await)
        .await
        .unwrap();
    let client = servers.client().await;
    assert_eq!(
        consume(&client, &pool, "m-2").await,
        ("done", b"paid 1250".to_vec()),
        "the redelivered message ran again"
    );
    assert_eq!(payments(&pool, "m-2").await, 1);
    // The committed result was copied into the record: the next claim is
    // answered there, without the store (a claim that does not look).
    let again = client.record("m-2").fingerprint(b"1250").claim().await;
    assert!(matches!(again, Ok(Claimed::Done(r)) if r == b"paid 1250"));
}

/// Killed with its transaction open: nothing committed, and the redelivery
/// (once the claim's lease ran out) pays, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_killed_before_its_commit_leaves_nothing_and_the_work_runs_once() {
    let servers = Servers::start();
    let pool = servers.pool().await;
    let process = one_worker_runtime();
    let (paid_tx, paid) = oneshot::channel();
    {
        let (url, pool) = (servers.redis.url(), pool.clone());
        process.spawn(async move {
            let client = LockClient::builder().redis(url).build().await.unwrap();
            let claim = client
                .record("m-3")
                .fingerprint(b"1250")
                .ttl(LEASE)
                .commit_with_postgres(pool.clone());
            let Claimed::Run(_guard) = claim.claim().await.unwrap() else {
                panic!("not claimed");
            };
            let mut tx = pool.begin().await.unwrap();
            pay(&mut tx, "m-3").await;
            let _ = paid_tx.send(());
            std::future::pending::<()>().await;
            drop(tx);
        });
    }
    paid.await.unwrap();
    process.shutdown_background();
    let client = servers.client().await;
    assert_eq!(
        consume(&client, &pool, "m-3").await,
        ("ran", b"paid 1250".to_vec())
    );
    assert_eq!(payments(&pool, "m-3").await, 1);
}

/// A claimer paused past its lease while a duplicate claimed, paid and
/// committed cannot commit a second time: its transaction is rolled back
/// and it is told the other's result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimer_paused_past_its_lease_cannot_commit_a_second_time() {
    let servers = Servers::start();
    let (pool, client) = (servers.pool().await, servers.client().await);
    let claim = client
        .record("m-4")
        .fingerprint(b"1250")
        .ttl(LEASE)
        .commit_with_postgres(pool.clone());
    let Claimed::Run(paused) = claim.claim().await.unwrap() else {
        panic!("not claimed");
    };
    let mut tx = pool.begin().await.unwrap();
    pay(&mut tx, "m-4").await;
    // Its lease ran out (the watchdog renews it: the record is deleted, as
    // it expires when a claimer is paused past its lease).
    let records: Vec<String> = redis_keys(&servers.redis, "*").await;
    let _: () = redis::cmd("DEL")
        .arg(&records)
        .query_async(&mut redis_conn(&servers.redis).await)
        .await
        .unwrap();
    let other = servers.client().await;
    assert_eq!(consume(&other, &pool, "m-4").await.0, "ran");
    assert_eq!(
        paused
            .commit_postgres(tx, b"paid 1250, late")
            .await
            .unwrap(),
        Committed::Earlier(b"paid 1250".to_vec())
    );
    assert_eq!(payments(&pool, "m-4").await, 1, "paid twice");
}

/// A committed record is the payload's: another payload under the key is
/// `Reused`, whether the claim finds it or the commit does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_payload_under_a_committed_key_is_reused() {
    let servers = Servers::start();
    let (pool, client) = (servers.pool().await, servers.client().await);
    assert_eq!(consume(&client, &pool, "m-5").await.0, "ran");
    // The record on Redis is gone (evicted, or its server restarted empty):
    // the committed copy still tells the payloads apart.
    let _: () = redis::cmd("FLUSHALL")
        .query_async(&mut redis_conn(&servers.redis).await)
        .await
        .unwrap();
    let claim = client
        .record("m-5")
        .fingerprint(b"9999")
        .commit_with_postgres(pool.clone());
    assert!(matches!(claim.claim().await, Ok(Claimed::Reused)));
    // The claim released the record: the payload that committed is done.
    assert_eq!(consume(&client, &pool, "m-5").await.0, "done");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_on_a_record_claimed_without_a_store_is_refused_and_commits_nothing() {
    let servers = Servers::start();
    let (pool, client) = (servers.pool().await, servers.client().await);
    let Claimed::Run(guard) = client.record("m-6").claim().await.unwrap() else {
        panic!("not claimed");
    };
    let mut tx = pool.begin().await.unwrap();
    pay(&mut tx, "m-6").await;
    let e = guard.commit_postgres(tx, b"paid").await.unwrap_err();
    assert!(
        matches!(&e, LockError::Config(why) if why.contains("commit_with_postgres")),
        "{e}"
    );
    assert_eq!(payments(&pool, "m-6").await, 0);
}

async fn redis_conn(redis: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

async fn redis_keys(redis: &RedisServer, pattern: &str) -> Vec<String> {
    redis::cmd("KEYS")
        .arg(pattern)
        .query_async(&mut redis_conn(redis).await)
        .await
        .unwrap()
}
