//! Durations out of range given to every public duration setter of every
//! request, layer and builder: `Duration::MAX`, `Duration::from_millis(u64::MAX)`
//! (finite, but far beyond anything a server stores) and `Duration::ZERO`.
//! Each is answered with a clear error (`LockError::Config`), refused when a
//! layer is built (a panic naming the setter, as axum refuses a bad route),
//! or clamped as documented (a wait above `MAX_WAIT` is `MAX_WAIT`): never a
//! panic while serving, a `Backend` error or a `500` per request.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use http::StatusCode;
use lock_runtime::layer::{IdempotencyLayer, LockLayer};
use lock_runtime::{Claimed, LockClient, LockError, fence};
use test_support::RedisServer;
use test_support::helpers::{key, memory_client, ms, redis_client, secs, within};
use test_support::http::{send, serve};
use tokio::sync::Notify;

/// The three values every setter is fed.
const BAD: [Duration; 3] = [
    Duration::MAX,
    Duration::from_millis(u64::MAX),
    Duration::ZERO,
];

/// Waits that mean "longer than anything": clamped, never refused.
const HUGE_WAITS: [Duration; 2] = [Duration::MAX, Duration::from_millis(u64::MAX)];

fn assert_config(what: &str, d: Duration, outcome: Result<impl std::fmt::Debug, LockError>) {
    match outcome {
        Err(e) if e.is_config() => assert!(!e.to_string().is_empty()),
        other => panic!("{what}({d:?}): expected a Config error, got {other:?}"),
    }
}

/// The panic message of `build`, which must refuse its configuration.
fn refused_at_build<T>(what: &str, build: impl FnOnce() -> T) -> String {
    match std::panic::catch_unwind(AssertUnwindSafe(build)) {
        Ok(_) => panic!("{what} was accepted when the layer was built"),
        Err(payload) => payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_default(),
    }
}

#[tokio::test]
async fn the_builder_refuses_every_bad_duration_with_a_config_error() {
    for d in BAD {
        let built = LockClient::builder().memory().default_ttl(d).build().await;
        assert_config("default_ttl", d, built);
        let built = LockClient::builder()
            .memory()
            .connect_timeout(d)
            .build()
            .await;
        assert_config("connect_timeout", d, built);
        let built = LockClient::builder()
            .memory()
            .response_timeout(d)
            .build()
            .await;
        assert_config("response_timeout", d, built);
        let built = LockClient::builder()
            .redis("redis://127.0.0.1:1")
            .min_replica_acks(1, d)
            .build()
            .await;
        assert_config("min_replica_acks", d, built);
    }
}

#[tokio::test]
async fn every_lock_request_refuses_bad_leases_and_clamps_huge_waits() {
    let client = memory_client().await;
    for d in BAD {
        let k = key("ttl");
        assert_config("lock.ttl", d, client.lock(&k).ttl(d).acquire().await);
        let read = client.rw_lock(&k).read().ttl(d).acquire().await;
        assert_config("rw_lock.read.ttl", d, read);
        let write = client.rw_lock(&k).write().ttl(d).acquire().await;
        assert_config("rw_lock.write.ttl", d, write);
        let permit = client.semaphore(&k, 2).ttl(d).acquire().await;
        assert_config("semaphore.ttl", d, permit);
        let all = client
            .lock_all([k.clone(), key("ttl-2")])
            .ttl(d)
            .acquire()
            .await;
        assert_config("lock_all.ttl", d, all);
        let leader = client.leader(&k).ttl(d).campaign().await;
        assert_config("leader.ttl", d, leader);
    }
    for d in HUGE_WAITS {
        let k = key("hold");
        let held = client.lock(&k).hold_at_least(d).acquire().await;
        assert_config("lock.hold_at_least", d, held);
    }
    // A zero `hold_at_least` is none, and a zero or huge wait on a free key
    // takes it at once.
    for d in BAD {
        let k = key("wait");
        let g = client.lock(&k).wait(d).hold_at_least(Duration::ZERO);
        g.acquire().await.unwrap().release().await.unwrap();
        let g = client.rw_lock(&k).read().wait(d).acquire().await.unwrap();
        g.release().await.unwrap();
        let g = client.rw_lock(&k).write().wait(d).acquire().await.unwrap();
        g.release().await.unwrap();
        let g = client.semaphore(&k, 2).wait(d).acquire().await.unwrap();
        g.release().await.unwrap();
        let g = client.lock_all([k.clone(), key("wait-2")]).wait(d);
        g.acquire().await.unwrap().release().await.unwrap();
        let l = client.leader(&k).wait(d).campaign().await.unwrap();
        l.resign().await.unwrap();
    }
}

#[tokio::test]
async fn a_record_refuses_bad_leases_and_retentions_and_clamps_huge_waits() {
    let client = memory_client().await;
    for d in BAD {
        assert_config(
            "record.lease",
            d,
            client.record(key("r")).ttl(d).claim().await,
        );
        let claimed = client.record(key("r")).retention(d).claim().await;
        assert_config("record.retention", d, claimed);
        let Claimed::Run(guard) = client.record(key("r")).wait(d).claim().await.unwrap() else {
            panic!("a free record is ours to run");
        };
        guard.complete(b"done").await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_wait_for_a_record_in_flight_waits_for_its_result() {
    let client = memory_client().await;
    for d in HUGE_WAITS {
        let k = key("in-flight");
        let Claimed::Run(first) = client.record(&k).claim().await.unwrap() else {
            panic!("a free record is ours to run");
        };
        let duplicate = tokio::spawn(client.record(&k).wait(d).claim());
        tokio::time::sleep(ms(50)).await;
        first.complete(b"done").await.unwrap();
        let answer = within(secs(5), "the duplicate", duplicate).await;
        match answer.expect("the duplicate's wait panicked") {
            Ok(Claimed::Done(stored)) => assert_eq!(stored, b"done"),
            other => panic!("wait({d:?}): {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_lock_layer_refuses_a_bad_ttl_when_built_and_clamps_a_huge_wait() {
    let client = memory_client().await;
    for d in BAD {
        let message = refused_at_build("LockLayer::ttl", || LockLayer::new(client.clone()).ttl(d));
        assert!(message.contains("LockLayer::ttl"), "{message}");
        assert!(message.contains("lease"), "{message}");
    }
    for d in BAD {
        let app = Router::new().route(
            "/items/{id}",
            post(|| async { "ok" })
                .route_layer(LockLayer::new(client.clone()).key("item:<id>").wait(d)),
        );
        let base = serve(app).await;
        let r = send(reqwest::Client::new().post(format!("{base}/items/1"))).await;
        assert_eq!(r.status(), StatusCode::OK, "wait({d:?})");
    }
}

#[tokio::test]
async fn an_idempotency_layer_refuses_a_bad_ttl_or_retention_when_built() {
    let client = memory_client().await;
    for d in BAD {
        let message = refused_at_build("IdempotencyLayer::ttl", || {
            IdempotencyLayer::new(client.clone()).ttl(d)
        });
        assert!(message.contains("IdempotencyLayer::ttl"), "{message}");
        let message = refused_at_build("IdempotencyLayer::retention", || {
            IdempotencyLayer::new(client.clone()).retention(d)
        });
        assert!(message.contains("IdempotencyLayer::retention"), "{message}");
        assert!(message.contains("retention"), "{message}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_waiting_with_a_huge_wait_gets_the_stored_response() {
    let client = memory_client().await;
    for d in BAD {
        let go = Arc::new(Notify::new());
        let handler_go = go.clone();
        let app = Router::new().route(
            "/orders",
            post(move || {
                let go = handler_go.clone();
                async move {
                    go.notified().await;
                    "created"
                }
            })
            .route_layer(IdempotencyLayer::new(client.clone()).wait(d)),
        );
        let base = serve(app).await;
        let http = reqwest::Client::new();
        let idempotency_key = key("order");
        let request = || {
            http.post(format!("{base}/orders"))
                .header("idempotency-key", &idempotency_key)
                .send()
        };
        let first = tokio::spawn(request());
        tokio::time::sleep(ms(100)).await;
        let duplicate = tokio::spawn(request());
        tokio::time::sleep(ms(100)).await;
        go.notify_one();
        let first = within(secs(5), "the first request", first).await;
        assert_eq!(first.unwrap().unwrap().status(), StatusCode::OK);
        let duplicate = within(secs(5), "the duplicate", duplicate).await;
        let duplicate = duplicate.unwrap().expect("the duplicate got an answer");
        if d.is_zero() {
            assert_eq!(duplicate.status(), StatusCode::CONFLICT);
        } else {
            assert_eq!(duplicate.status(), StatusCode::OK, "wait({d:?})");
            assert_eq!(duplicate.headers()["idempotent-replayed"], "true");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_finite_wait_on_a_busy_redis_key_waits_for_the_holder() {
    let server = RedisServer::start();
    let client = redis_client(&server).await;
    let other = redis_client(&server).await;
    for d in HUGE_WAITS {
        let k = key("busy");
        let holder = client.lock(&k).acquire().await.unwrap();
        let waiter = tokio::spawn(other.lock(&k).wait(d).acquire());
        tokio::time::sleep(ms(100)).await;
        assert!(
            !waiter.is_finished(),
            "wait({d:?}) ended before the release"
        );
        holder.release().await.unwrap();
        let waited = within(secs(5), "the waiter", waiter).await.unwrap();
        let guard = waited.unwrap_or_else(|e| panic!("wait({d:?}): {e:?}"));
        guard.release().await.unwrap();

        let leader = client.leader(&k).campaign().await.unwrap();
        let candidate = tokio::spawn(other.leader(&k).wait(d).campaign());
        tokio::time::sleep(ms(100)).await;
        assert!(!candidate.is_finished(), "campaign wait({d:?}) ended early");
        leader.resign().await.unwrap();
        let elected = within(secs(5), "the candidate", candidate).await.unwrap();
        let leadership = elected.unwrap_or_else(|e| panic!("campaign wait({d:?}): {e:?}"));
        leadership.resign().await.unwrap();

        // The other kinds queue through their own scripts.
        let reader = client.rw_lock(&k).read().acquire().await.unwrap();
        let writer = tokio::spawn(other.rw_lock(&k).write().wait(d).acquire());
        tokio::time::sleep(ms(100)).await;
        assert!(!writer.is_finished(), "write wait({d:?}) ended early");
        reader.release().await.unwrap();
        let written = within(secs(5), "the writer", writer).await.unwrap();
        let guard = written.unwrap_or_else(|e| panic!("write wait({d:?}): {e:?}"));
        guard.release().await.unwrap();

        let permit = client.semaphore(&k, 1).acquire().await.unwrap();
        let next = tokio::spawn(other.semaphore(&k, 1).wait(d).acquire());
        tokio::time::sleep(ms(100)).await;
        assert!(!next.is_finished(), "permit wait({d:?}) ended early");
        permit.release().await.unwrap();
        let permitted = within(secs(5), "the next permit", next).await.unwrap();
        let guard = permitted.unwrap_or_else(|e| panic!("permit wait({d:?}): {e:?}"));
        guard.release().await.unwrap();

        let both = [k.clone(), format!("{k}-2")];
        let held = client.lock(&both[1]).acquire().await.unwrap();
        let all = tokio::spawn(other.lock_all(both).wait(d).acquire());
        tokio::time::sleep(ms(100)).await;
        assert!(!all.is_finished(), "lock_all wait({d:?}) ended early");
        held.release().await.unwrap();
        let taken = within(secs(5), "lock_all", all).await.unwrap();
        let guard = taken.unwrap_or_else(|e| panic!("lock_all wait({d:?}): {e:?}"));
        guard.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_record_refuses_a_huge_retention_and_waits_out_a_huge_wait() {
    let server = RedisServer::start();
    let client = redis_client(&server).await;
    let other = redis_client(&server).await;
    for d in HUGE_WAITS {
        let claimed = client.record(key("kept")).retention(d).claim().await;
        assert_config("record.retention", d, claimed);

        let k = key("in-flight");
        let Claimed::Run(first) = client.record(&k).claim().await.unwrap() else {
            panic!("a free record is ours to run");
        };
        let duplicate = tokio::spawn(other.record(&k).wait(d).claim());
        tokio::time::sleep(ms(100)).await;
        assert!(!duplicate.is_finished(), "wait({d:?}) ended early");
        first.complete(b"done").await.unwrap();
        let answer = within(secs(5), "the duplicate", duplicate).await;
        match answer.expect("the duplicate's wait panicked") {
            Ok(Claimed::Done(stored)) => assert_eq!(stored, b"done"),
            other => panic!("wait({d:?}): {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_layer_with_a_huge_wait_serves_the_request_once_the_key_is_free() {
    let server = RedisServer::start();
    let client = redis_client(&server).await;
    let layer = LockLayer::new(client.clone())
        .key("item:<id>")
        .wait(Duration::from_millis(u64::MAX));
    let app = Router::new().route("/items/{id}", post(|| async { "ok" }).route_layer(layer));
    let base = serve(app).await;
    let holder = client.lock("item:7").acquire().await.unwrap();
    let request = tokio::spawn(send(reqwest::Client::new().post(format!("{base}/items/7"))));
    tokio::time::sleep(ms(100)).await;
    assert!(!request.is_finished(), "the request did not wait");
    holder.release().await.unwrap();
    let r = within(secs(5), "the request", request).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_fence_refuses_a_retention_out_of_range_with_a_config_error() {
    let server = RedisServer::start();
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    for d in BAD {
        let ran = fence::redis(&mut conn, "order:42", 1)
            .retention(d)
            .cmd(redis::cmd("SET").arg("order:42").arg("paid"))
            .run()
            .await;
        assert_config("fence.retention", d, ran);
    }
    let value: Option<String> = redis::cmd("GET")
        .arg("order:42")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(value, None, "nothing was written");
}
