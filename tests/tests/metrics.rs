//! The `metrics` feature: what a lock's and an idempotent route's life
//! reports, captured by `metrics-util`'s debugging recorder. Labels name a
//! kind of lock (the name given, the attribute's template, the route), never
//! the key.

use std::collections::HashMap;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, Snapshotter};
use metrics_util::{CompositeKey, MetricKind};

/// `(metric name, sorted labels)` -> counter value or histogram sample count.
fn snapshot(snapshotter: &Snapshotter) -> HashMap<(String, Vec<(String, String)>), u64> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value): (CompositeKey, _, _, DebugValue)| {
            let (kind, key) = key.into_parts();
            let mut labels: Vec<(String, String)> = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            let n = match (kind, value) {
                (MetricKind::Counter, DebugValue::Counter(n)) => n,
                (MetricKind::Histogram, DebugValue::Histogram(samples)) => samples.len() as u64,
                (_, other) => panic!("unexpected {other:?}"),
            };
            ((key.name().to_owned(), labels), n)
        })
        .collect()
}

fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    v.sort();
    v
}

/// What `body` reported, run with an embedded-backend client on a runtime of
/// its own, under a recorder of its own.
fn recorded<F: std::future::Future<Output = ()>>(
    body: impl FnOnce(lock_runtime::LockClient) -> F,
) -> HashMap<(String, Vec<(String, String)>), u64> {
    let snapshotter = tests::recorded::on_memory_client(|client, _| body(client));
    snapshot(&snapshotter)
}

#[test]
fn a_locks_life_is_counted_under_its_name_never_its_key() {
    let seen = recorded(|client| async move {
        let order = |id: u32| client.lock(format!("order:{id}")).metrics_name("order");
        // Acquired and released, twice.
        for id in [1, 2] {
            let guard = order(id)
                .ttl(Duration::from_millis(300))
                .acquire()
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(180)).await; // a renewal (due at 100 ms), with room for a loaded machine
            guard.release().await.unwrap();
        }
        // Busy.
        let held = order(3).acquire().await.unwrap();
        assert!(order(3).acquire().await.unwrap_err().is_busy());
        // Handed over to a waiter.
        let waiter = tokio::spawn(order(3).wait(Duration::from_secs(2)).acquire());
        tokio::time::sleep(Duration::from_millis(50)).await;
        held.release().await.unwrap();
        waiter.await.unwrap().unwrap().release().await.unwrap();
        // Lost: deleted behind the holder's back.
        let doomed = order(4)
            .ttl(Duration::from_millis(300))
            .acquire()
            .await
            .unwrap();
        lock_runtime::__private::testing::force_delete(&client, "order:4")
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(2), doomed.lost())
            .await
            .unwrap();
        drop(doomed);
        // No name given.
        client.with_lock("job:7", async {}).await.unwrap();
    });
    let get = |name: &str, l: &[(&str, &str)]| {
        seen.get(&(name.to_owned(), labels(l)))
            .copied()
            .unwrap_or(0)
    };
    let order = [("name", "order")];
    assert_eq!(
        get(
            "lock_acquisitions_total",
            &[("name", "order"), ("outcome", "acquired")]
        ),
        5,
        "{seen:#?}"
    );
    assert_eq!(
        get(
            "lock_acquisitions_total",
            &[("name", "order"), ("outcome", "busy")]
        ),
        1
    );
    assert_eq!(
        get(
            "lock_wait_seconds",
            &[("name", "order"), ("outcome", "acquired")]
        ),
        5
    );
    assert_eq!(get("lock_handovers_total", &order), 1);
    assert_eq!(get("lock_hold_seconds", &order), 5);
    assert_eq!(get("lock_leases_lost_total", &order), 1);
    assert_eq!(
        get(
            "lock_acquisitions_total",
            &[("name", "default"), ("outcome", "acquired")]
        ),
        1
    );
    assert!(get("lock_renewal_calls_total", &[]) >= 2, "{seen:#?}");
    assert!(get("lock_renewed_total", &[]) >= 2, "{seen:#?}");
    for (_, labels) in seen.keys() {
        for (_, value) in labels {
            assert!(
                !value.contains("order:") && !value.contains("job:7"),
                "a key in a label: {labels:?}"
            );
        }
    }
}

#[lock_runtime::distributed_lock(key = "job:<id>", client = client)]
async fn job(client: &lock_runtime::LockClient, id: u32) -> Result<u32, lock_runtime::LockError> {
    Ok(id)
}

#[test]
fn the_attribute_names_by_template_and_idempotency_by_route() {
    use axum::Router;
    use axum::routing::post;
    use http::Request;
    use tower::ServiceExt;

    let seen = recorded(|client| async move {
        assert_eq!(job(&client, 7).await.unwrap(), 7);
        let app = Router::new()
            .route("/orders/{tenant}", post(|| async { "created" }))
            .route_layer(lock_runtime::IdempotencyLayer::new(client.clone()));
        let send = |body: &'static str| {
            app.clone().oneshot(
                Request::post("/orders/acme")
                    .header("idempotency-key", "\"k-1\"")
                    .body(axum::body::Body::from(body))
                    .unwrap(),
            )
        };
        assert_eq!(send("a").await.unwrap().status(), 200);
        assert_eq!(send("a").await.unwrap().status(), 200); // replayed
        assert_eq!(send("b").await.unwrap().status(), 422);
    });
    let get = |name: &str, l: &[(&str, &str)]| {
        seen.get(&(name.to_owned(), labels(l)))
            .copied()
            .unwrap_or(0)
    };
    assert_eq!(
        get(
            "lock_acquisitions_total",
            &[("name", "job:<id>"), ("outcome", "acquired")]
        ),
        1,
        "{seen:#?}"
    );
    let route = ("route", "/orders/{tenant}");
    assert_eq!(
        get(
            "idempotency_requests_total",
            &[route, ("outcome", "claimed")]
        ),
        1,
        "{seen:#?}"
    );
    assert_eq!(
        get(
            "idempotency_requests_total",
            &[route, ("outcome", "replayed")]
        ),
        1
    );
    assert_eq!(
        get(
            "idempotency_requests_total",
            &[route, ("outcome", "payload_mismatch")]
        ),
        1
    );
}

/// Outside a matched route (the layer on a router's fallback) requests are
/// counted under one series, `unrouted`, as `LockLayer` names them: never a
/// series per path (ten paths made ten series).
#[test]
fn idempotency_outside_a_matched_route_is_one_unrouted_series() {
    use axum::Router;
    use http::Request;
    use tower::ServiceExt;

    let seen = recorded(|client| async move {
        let app = Router::new()
            .fallback(|| async { "created" })
            .layer(lock_runtime::IdempotencyLayer::new(client.clone()));
        for i in 0..10 {
            let response = app
                .clone()
                .oneshot(
                    Request::post(format!("/x/{i}"))
                        .header("idempotency-key", format!("\"k-{i}\""))
                        .body(axum::body::Body::empty())
                        .unwrap(),
                )
                .await
                .unwrap();
            assert_eq!(response.status(), 200);
        }
    });
    let series: Vec<_> = seen
        .keys()
        .filter(|(name, _)| name == "idempotency_requests_total")
        .collect();
    assert_eq!(series.len(), 1, "{seen:#?}");
    let claimed = labels(&[("route", "unrouted"), ("outcome", "claimed")]);
    assert_eq!(
        seen.get(&("idempotency_requests_total".to_owned(), claimed)),
        Some(&10),
        "{seen:#?}"
    );
}

/// A committed copy in the commit store, replayed to a process that never
/// saw the request (the one that ran it died before completing its own
/// record), counts as replayed, not as claimed.
#[test]
fn a_copy_replayed_from_the_commit_store_counts_as_replayed() {
    use axum::Router;
    use axum::routing::post;
    use http::Request;
    use lock_runtime::layer::idempotency::Commit;
    use lock_runtime::{IdempotencyLayer, LockClient};
    use tower::ServiceExt;

    let server = test_support::RedisServer::start();
    let url = server.url();
    let seen = recorded(|first| async move {
        let conn = redis::Client::open(url.as_str()).unwrap();
        let conn = redis::aio::ConnectionManager::new(conn).await.unwrap();
        // Two processes sharing the commit store, each its own records.
        let second = LockClient::builder().memory().build().await.unwrap();
        let app = |client: &LockClient| {
            let handler = |commit: Commit| async move {
                let write = redis::cmd("SET").arg("order:1").arg("paid").clone();
                commit.redis().cmd(write).respond("created").await.unwrap()
            };
            Router::new()
                .route("/orders", post(handler))
                .route_layer(IdempotencyLayer::new(client.clone()).commit_with_redis(conn.clone()))
        };
        let send = |app: Router| {
            app.oneshot(
                Request::post("/orders")
                    .header("idempotency-key", "\"k-1\"")
                    .body(axum::body::Body::from("a"))
                    .unwrap(),
            )
        };
        assert_eq!(send(app(&first)).await.unwrap().status(), 200);
        assert_eq!(send(app(&second)).await.unwrap().status(), 200); // from the store
    });
    let route = ("route", "/orders");
    for (outcome, n) in [("claimed", 1), ("replayed", 1)] {
        let key = (
            "idempotency_requests_total".to_owned(),
            labels(&[route, ("outcome", outcome)]),
        );
        assert_eq!(
            seen.get(&key).copied().unwrap_or(0),
            n,
            "{outcome}: {seen:#?}"
        );
    }
}
