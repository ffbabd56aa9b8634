//! `fence::postgres` on a real PostgreSQL (started by the test): a holder
//! paused past its lease is refused once the next holder committed
//! (Kleppmann's scenario), concurrent transactions serialize on the
//! resource's row and end with the highest token's value, equal tokens
//! pass, a fresh resource takes any token, and bad input is a clear error.

use std::time::Instant;

use lock_runtime::{LockClient, LockError, fence};
use sqlx::{Connection, PgPool};
use test_support::helpers::{fixed_lease, key, ms, secs};
use test_support::{PostgresServer, RedisServer};

struct Env {
    pool: PgPool,
    _postgres: PostgresServer,
}

async fn env() -> Env {
    let postgres = PostgresServer::start();
    let orders = "CREATE TABLE orders (id text PRIMARY KEY, paid_by text, token bigint)";
    let pool = postgres
        .pool(25, &format!("{}\n{orders}", fence::POSTGRES_SCHEMA))
        .await;
    Env {
        pool,
        _postgres: postgres,
    }
}

/// One fenced payment: fence, write, commit (or roll back when stale).
async fn pay(pool: &PgPool, order: &str, token: u64, who: &str) -> Result<(), LockError> {
    let mut tx = pool.begin().await.unwrap();
    fence::postgres(&mut tx, order, token).await?;
    sqlx::query(
        "INSERT INTO orders (id, paid_by, token) VALUES ($1, $2, $3)
         ON CONFLICT (id) DO UPDATE SET paid_by = EXCLUDED.paid_by, token = EXCLUDED.token",
    )
    .bind(order)
    .bind(who)
    .bind(token as i64)
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    Ok(())
}

async fn paid_by(pool: &PgPool, order: &str) -> Option<String> {
    sqlx::query_scalar("SELECT paid_by FROM orders WHERE id = $1")
        .bind(order)
        .fetch_optional(pool)
        .await
        .unwrap()
        .flatten()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holder_is_refused_once_the_next_holder_committed() {
    let env = env().await;
    let redis = RedisServer::start();
    let client = LockClient::builder()
        .redis(redis.url())
        .build()
        .await
        .unwrap();
    let order = key("pg-kleppmann");
    let a = fixed_lease(&client, &order, ms(300)).await.unwrap();
    let a_token = a.fencing_token().await.unwrap();
    tokio::time::sleep(ms(500)).await; // A's pause, past its lease
    let b = client.lock(&order).wait(secs(5)).acquire().await.unwrap();
    let b_token = b.fencing_token().await.unwrap();
    pay(&env.pool, &order, b_token, "B").await.unwrap();

    // A wakes up and pays, inside its own transaction.
    let mut tx = env.pool.begin().await.unwrap();
    match fence::postgres(&mut tx, &order, a_token).await {
        Err(LockError::Stale {
            resource,
            token,
            highest,
        }) => assert_eq!(
            (resource, token, highest),
            (order.clone(), a_token, b_token)
        ),
        other => panic!("expected Stale, got {other:?}"),
    }
    tx.rollback().await.unwrap();
    assert_eq!(paid_by(&env.pool, &order).await.as_deref(), Some("B"));
    b.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_writer_waits_for_the_newer_transaction_and_is_then_refused() {
    let env = env().await;
    let order = key("pg-serialize");
    // B (token 6) fences first and keeps its transaction open.
    let mut b = env.pool.begin().await.unwrap();
    fence::postgres(&mut b, &order, 6).await.unwrap();
    let pool = env.pool.clone();
    let a_order = order.clone();
    let a = tokio::spawn(async move {
        let mut tx = pool.begin().await.unwrap();
        let fenced = fence::postgres(&mut tx, &a_order, 5).await;
        (fenced, Instant::now())
    });
    tokio::time::sleep(ms(300)).await;
    assert!(!a.is_finished(), "A must wait on B's row lock");
    sqlx::query("INSERT INTO orders (id, paid_by) VALUES ($1, 'B')")
        .bind(&order)
        .execute(&mut *b)
        .await
        .unwrap();
    let committed = Instant::now();
    b.commit().await.unwrap();
    let (fenced, at) = a.await.unwrap();
    assert!(at >= committed, "A went on before B committed");
    match fenced {
        Err(LockError::Stale { token, highest, .. }) => assert_eq!((token, highest), (5, 6)),
        other => panic!("expected Stale, got {other:?}"),
    }
    assert_eq!(paid_by(&env.pool, &order).await.as_deref(), Some("B"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_writer_waits_for_the_older_transaction_and_then_wins() {
    let env = env().await;
    let order = key("pg-newer");
    let mut a = env.pool.begin().await.unwrap();
    fence::postgres(&mut a, &order, 5).await.unwrap();
    let pool = env.pool.clone();
    let b_order = order.clone();
    let b = tokio::spawn(async move { pay(&pool, &b_order, 6, "B").await });
    tokio::time::sleep(ms(300)).await;
    assert!(!b.is_finished(), "B must wait on A's row lock");
    sqlx::query("INSERT INTO orders (id, paid_by) VALUES ($1, 'A')")
        .bind(&order)
        .execute(&mut *a)
        .await
        .unwrap();
    a.commit().await.unwrap();
    b.await.unwrap().unwrap();
    assert_eq!(paid_by(&env.pool, &order).await.as_deref(), Some("B"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_transactions_end_with_the_highest_tokens_value() {
    let env = env().await;
    let order = key("pg-concurrent");
    // The highest first: without the fence the last to commit would win.
    let writers: Vec<_> = (1..=20u64)
        .rev()
        .map(|token| {
            let (pool, order) = (env.pool.clone(), order.clone());
            tokio::spawn(async move {
                pay(&pool, &order, token, &token.to_string())
                    .await
                    .map(|()| token)
            })
        })
        .collect();
    for writer in writers {
        match writer.await.unwrap() {
            Ok(_) => {}
            Err(LockError::Stale { token, highest, .. }) => assert!(highest > token),
            Err(other) => panic!("{other:?}"),
        }
    }
    assert_eq!(paid_by(&env.pool, &order).await.as_deref(), Some("20"));
}

#[tokio::test]
async fn equal_tokens_pass_and_a_fresh_resource_takes_any_token() {
    let env = env().await;
    let order = key("pg-equal");
    pay(&env.pool, &order, 7, "first").await.unwrap();
    pay(&env.pool, &order, 7, "second").await.unwrap();
    assert_eq!(paid_by(&env.pool, &order).await.as_deref(), Some("second"));
    let err = pay(&env.pool, &order, 6, "stale").await.unwrap_err();
    assert!(err.is_stale(), "{err:?}");
    assert_eq!(paid_by(&env.pool, &order).await.as_deref(), Some("second"));
    // A fresh resource takes any token, the largest a lock issues included.
    let other = key("pg-fresh");
    pay(&env.pool, &other, i64::MAX as u64, "max")
        .await
        .unwrap();
    let updated: bool = sqlx::query_scalar(
        "SELECT updated_at > now() - interval '1 minute' FROM lock_fence WHERE resource = $1",
    )
    .bind(&other)
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert!(updated);
}

#[tokio::test]
async fn bad_input_is_a_clear_error() {
    let env = env().await;
    let mut conn = env.pool.acquire().await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    let err = fence::postgres(&mut tx, "", 1).await.unwrap_err();
    assert!(err.is_invalid_key(), "{err:?}");
    let err = fence::postgres(&mut tx, "order:1", u64::MAX)
        .await
        .unwrap_err();
    assert!(err.is_config(), "{err:?}");
    tx.rollback().await.unwrap();
    // Without the table: a backend error that says what to run.
    sqlx::raw_sql("DROP TABLE lock_fence")
        .execute(&env.pool)
        .await
        .unwrap();
    let err = fence::postgres(&mut conn, "order:1", 1).await.unwrap_err();
    assert!(err.is_backend(), "{err:?}");
    assert!(err.to_string().contains("POSTGRES_SCHEMA"), "{err}");
}
