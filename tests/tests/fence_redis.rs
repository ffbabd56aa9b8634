//! `fence::redis` on real servers, a single Redis and a Cluster: a holder
//! paused past its lease is refused once the next holder wrote (Kleppmann's
//! scenario), concurrent writers end with the highest token's value, equal
//! tokens pass, a fresh resource takes any token, and bad input is refused
//! before anything is sent.

use std::time::Duration;

use lock_runtime::{LockClient, LockError, fence};
use redis::aio::ConnectionLike;
use test_support::RedisServer;
use test_support::helpers::{default_redis_client, fixed_lease, key, ms, secs};
use test_support::topology::{Cluster, Topology};

/// A lock client and a connection to the data, on one deployment.
struct Env<C> {
    client: LockClient,
    conn: C,
    _servers: Box<dyn std::any::Any>,
}

async fn single() -> Env<redis::aio::MultiplexedConnection> {
    let server = RedisServer::start();
    let client = default_redis_client(&server).await;
    let conn = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    Env {
        client,
        conn,
        _servers: Box::new(server),
    }
}

async fn cluster() -> Env<redis::cluster_async::ClusterConnection> {
    let (cluster, builder) = Cluster::start(3).with_builder();
    let client = builder.build().await.unwrap();
    let conn = redis::cluster::ClusterClient::new(cluster.seed_urls())
        .unwrap()
        .get_async_connection()
        .await
        .unwrap();
    Env {
        client,
        conn,
        _servers: Box::new(cluster),
    }
}

async fn hget<C: ConnectionLike>(conn: &mut C, key: &str, field: &str) -> Option<String> {
    redis::cmd("HGET")
        .arg(key)
        .arg(field)
        .query_async(conn)
        .await
        .unwrap()
}

async fn get<C: ConnectionLike>(conn: &mut C, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query_async(conn).await.unwrap()
}

fn paid_by(key: &str, who: &str) -> redis::Cmd {
    redis::cmd("HSET")
        .arg(key)
        .arg("paid_by")
        .arg(who)
        .to_owned()
}

/// Holder A's lease runs out while it is paused; B takes the lock and pays
/// through the fence; A wakes and pays: refused, and the order stays B's.
async fn a_paused_holder_is_refused_once_the_next_holder_wrote<C>(env: Env<C>)
where
    C: ConnectionLike + Clone + Send,
{
    let order = key("fence-kleppmann");
    let a = fixed_lease(&env.client, &order, ms(300)).await.unwrap();
    let a_token = a.fencing_token().await.unwrap();
    tokio::time::sleep(ms(500)).await; // A's "GC pause", past its lease
    let b = env
        .client
        .lock(&order)
        .wait(secs(5))
        .acquire()
        .await
        .unwrap();
    let b_token = b.fencing_token().await.unwrap();
    assert!(b_token > a_token);
    let mut conn = env.conn.clone();
    fence::redis(&mut conn, &order, b_token)
        .cmd(paid_by(&order, "B"))
        .run()
        .await
        .unwrap();

    // A wakes up, still believing it holds the lock.
    let mut conn = env.conn.clone();
    let refused = fence::redis(&mut conn, &order, a_token)
        .cmd(paid_by(&order, "A"))
        .run()
        .await
        .unwrap_err();
    match refused {
        LockError::Stale {
            resource,
            token,
            highest,
        } => assert_eq!(
            (resource, token, highest),
            (order.clone(), a_token, b_token)
        ),
        other => panic!("expected Stale, got {other:?}"),
    }
    assert_eq!(
        hget(&mut conn, &order, "paid_by").await.as_deref(),
        Some("B")
    );
    b.release().await.unwrap();
    drop(a);
}

/// Twenty writers with tokens 1..=20 start at once, the highest first: the
/// value left is the highest token's, and every refusal names a higher one.
async fn concurrent_writers_end_with_the_highest_tokens_value<C>(env: Env<C>)
where
    C: ConnectionLike + Clone + Send + 'static,
{
    let resource = key("fence-concurrent");
    let value = format!("{{{resource}}}:value");
    let writers: Vec<_> = (1..=20u64)
        .rev()
        .map(|token| {
            let mut conn = env.conn.clone();
            let (resource, value) = (resource.clone(), value.clone());
            tokio::spawn(async move {
                fence::redis(&mut conn, &resource, token)
                    .cmd(redis::cmd("SET").arg(&value).arg(token))
                    .cmd(redis::cmd("RPUSH").arg(format!("{value}:log")).arg(token))
                    .run()
                    .await
                    .map(|_| token)
            })
        })
        .collect();
    let mut accepted = Vec::new();
    for writer in writers {
        match writer.await.unwrap() {
            Ok(token) => accepted.push(token),
            Err(LockError::Stale { token, highest, .. }) => assert!(highest > token),
            Err(other) => panic!("{other:?}"),
        }
    }
    let mut conn = env.conn.clone();
    assert_eq!(get(&mut conn, &value).await.as_deref(), Some("20"));
    // The accepted writes were applied in increasing token order.
    let log: Vec<u64> = redis::cmd("LRANGE")
        .arg(format!("{value}:log"))
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(log.windows(2).all(|w| w[0] <= w[1]), "{log:?}");
    assert_eq!(log.len(), accepted.len());
}

/// A fresh resource takes any token, an equal token passes again, a lower
/// one is refused; replies come back one per command.
async fn equal_tokens_pass_and_a_fresh_resource_takes_any_token<C>(env: Env<C>)
where
    C: ConnectionLike + Clone + Send,
{
    let resource = key("fence-equal");
    let counter = format!("{{{resource}}}:count");
    let mut conn = env.conn.clone();
    for _ in 0..2 {
        let replies = fence::redis(&mut conn, &resource, 7)
            .cmd(redis::cmd("INCRBY").arg(&counter).arg(5))
            .cmd(redis::cmd("EXPIRE").arg(&counter).arg(3600))
            .run()
            .await
            .unwrap();
        assert_eq!(replies.len(), 2);
    }
    assert_eq!(get(&mut conn, &counter).await.as_deref(), Some("10"));
    let err = fence::redis(&mut conn, &resource, 6)
        .cmd(redis::cmd("INCRBY").arg(&counter).arg(5))
        .run()
        .await
        .unwrap_err();
    assert!(err.is_stale(), "{err:?}");
    assert_eq!(get(&mut conn, &counter).await.as_deref(), Some("10"));
    // A resource with no record yet, and a token far above 2^53 (the
    // highest a lock issues: Redis counters stop at i64::MAX).
    let top = i64::MAX as u64;
    let other = key("fence-fresh");
    fence::redis(&mut conn, &other, top - 1)
        .cmd(redis::cmd("SET").arg(&other).arg("x"))
        .run()
        .await
        .unwrap();
    let err = fence::redis(&mut conn, &other, top - 2)
        .run()
        .await
        .unwrap_err();
    assert!(err.is_stale(), "exact past 2^53: {err:?}");
    fence::redis(&mut conn, &other, top).run().await.unwrap();
}

/// Bad input is refused before anything is sent: no record appears.
async fn bad_input_is_a_clear_error_and_sends_nothing<C>(env: Env<C>)
where
    C: ConnectionLike + Clone + Send,
{
    let resource = key("fence-bad");
    let mut conn = env.conn.clone();
    let err = fence::redis(&mut conn, "", 1)
        .cmd(redis::cmd("SET").arg("x").arg(1))
        .run()
        .await
        .unwrap_err();
    assert!(err.is_invalid_key(), "{err:?}");
    for cmd in [
        redis::cmd("EVAL").arg("return 1").arg(0).to_owned(),
        redis::cmd("FLUSHALL").to_owned(),
        redis::cmd("GET").arg(&resource).to_owned(),
        redis::cmd("HSET")
            .arg(&resource)
            .arg("only-a-field")
            .to_owned(),
    ] {
        let err = fence::redis(&mut conn, &resource, 1)
            .cmd(redis::cmd("SET").arg(&resource).arg("first"))
            .cmd(cmd)
            .run()
            .await
            .unwrap_err();
        assert!(err.is_config(), "{err:?}");
    }
    let err = fence::redis(&mut conn, &resource, 1)
        .retention(Duration::ZERO)
        .run()
        .await
        .unwrap_err();
    assert!(err.is_config(), "{err:?}");
    // A key outside the resource's slot (without a shared hash tag).
    let err = fence::redis(&mut conn, &resource, 1)
        .cmd(
            redis::cmd("SET")
                .arg(format!("{resource}:elsewhere"))
                .arg(1),
        )
        .run()
        .await
        .unwrap_err();
    assert!(err.is_config(), "{err:?}");
    assert!(err.to_string().contains("hash slot"), "{err}");
    // The fence's own record (in the resource's slot by construction): a
    // command that lowered or deleted it would let a stale token through.
    let record_key = fence::record_key(&resource);
    for cmd in [
        redis::cmd("SET").arg(&record_key).arg(1).to_owned(),
        redis::cmd("DEL").arg(&record_key).to_owned(),
    ] {
        let err = fence::redis(&mut conn, &resource, 100)
            .cmd(cmd)
            .run()
            .await
            .unwrap_err();
        assert!(err.is_config(), "{err:?}");
        assert!(err.to_string().contains("record"), "{err}");
    }
    // A token no lock issues (fence::postgres refuses it the same way):
    // recorded, it would shut every real token out for the retention.
    let err = fence::redis(&mut conn, &resource, u64::MAX)
        .run()
        .await
        .unwrap_err();
    assert!(err.is_config(), "{err:?}");
    assert!(err.to_string().contains("i64::MAX"), "{err}");
    let record: Option<String> = get(&mut conn, &record_key).await;
    assert_eq!(record, None, "nothing was sent");
    assert_eq!(get(&mut conn, &resource).await, None);
}

/// The commands are data: a value that reads as Lua is stored as written.
async fn values_are_stored_verbatim_never_run<C>(env: Env<C>)
where
    C: ConnectionLike + Clone + Send,
{
    let resource = key("fence-data");
    let nasty = "x') redis.call('FLUSHALL') --\"]]";
    let mut conn = env.conn.clone();
    fence::redis(&mut conn, &resource, 1)
        .cmd(redis::cmd("SET").arg(&resource).arg(nasty))
        .cmd(
            redis::cmd("SET")
                .arg(format!("{{{resource}}}:k"))
                .arg(nasty),
        )
        .run()
        .await
        .unwrap();
    assert_eq!(get(&mut conn, &resource).await.as_deref(), Some(nasty));
}

macro_rules! on_both {
    ($($scenario:ident),* $(,)?) => {
        mod single_redis {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario(single().await).await;
                }
            )*
        }
        mod redis_cluster {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario(cluster().await).await;
                }
            )*
        }
    };
}

on_both!(
    a_paused_holder_is_refused_once_the_next_holder_wrote,
    concurrent_writers_end_with_the_highest_tokens_value,
    equal_tokens_pass_and_a_fresh_resource_takes_any_token,
    bad_input_is_a_clear_error_and_sends_nothing,
    values_are_stored_verbatim_never_run,
);

#[tokio::test]
async fn the_record_expires_after_its_retention_and_is_refreshed_by_each_write() {
    let env = single().await;
    let resource = key("fence-retention");
    let mut conn = env.conn.clone();
    fence::redis(&mut conn, &resource, 5)
        .retention(ms(300))
        .run()
        .await
        .unwrap();
    let pttl: i64 = redis::cmd("PTTL")
        .arg(fence::record_key(&resource))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!((1..=300).contains(&pttl), "{pttl}");
    assert!(
        fence::redis(&mut conn, &resource, 4)
            .run()
            .await
            .unwrap_err()
            .is_stale()
    );
    tokio::time::sleep(ms(400)).await;
    // Gone: the bound on what stays in Redis, and why the default is long.
    fence::redis(&mut conn, &resource, 4).run().await.unwrap();
    let pttl: i64 = redis::cmd("PTTL")
        .arg(fence::record_key(&resource))
        .query_async(&mut conn)
        .await
        .unwrap();
    let default = fence::DEFAULT_RETENTION.as_millis() as i64;
    assert!(pttl > default - 60_000 && pttl <= default, "{pttl}");
}

#[tokio::test]
async fn a_failing_command_leaves_the_record_raised() {
    let env = single().await;
    let resource = key("fence-wrongtype");
    let mut conn = env.conn.clone();
    redis::cmd("SET")
        .arg(&resource)
        .arg("a string")
        .exec_async(&mut conn)
        .await
        .unwrap();
    let err = fence::redis(&mut conn, &resource, 9)
        .cmd(redis::cmd("HSET").arg(&resource).arg("f").arg("v"))
        .run()
        .await
        .unwrap_err();
    assert!(err.is_backend(), "{err:?}");
    // The record went first: a stale holder is still refused.
    assert!(
        fence::redis(&mut conn, &resource, 8)
            .run()
            .await
            .unwrap_err()
            .is_stale()
    );
}
