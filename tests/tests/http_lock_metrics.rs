//! `LockLayer`'s metrics: named by route (the name made once per route and
//! kept by the layer), reported to whichever recorder is in place when a
//! request runs.

use std::collections::HashMap;

use axum::Router;
use axum::routing::post;
use http::Request;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tower::ServiceExt;

/// `(metric, name label, outcome label)` -> counter value or sample count.
fn seen(recorder: &DebuggingRecorder) -> HashMap<(String, String, String), u64> {
    recorder
        .snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let (_, key) = key.into_parts();
            let label = |k: &str| {
                key.labels()
                    .find(|l| l.key() == k)
                    .map_or(String::new(), |l| l.value().to_owned())
            };
            let n = match value {
                DebugValue::Counter(n) => n,
                DebugValue::Histogram(samples) => samples.len() as u64,
                other => panic!("unexpected {other:?}"),
            };
            ((key.name().to_owned(), label("name"), label("outcome")), n)
        })
        .collect()
}

#[test]
fn a_lock_layer_reports_each_route_under_its_name_to_every_recorder_in_turn() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = rt
        .block_on(lock_runtime::LockClient::builder().memory().build())
        .unwrap();
    // One layer for both routes, and for both recorders below: the names it
    // keeps must not tie it to the recorder of its first requests.
    let app = Router::new()
        .route("/orders/{id}/pay", post(|| async { "paid" }))
        .route("/carts/{id}", post(|| async { "saved" }))
        .layer(lock_runtime::LockLayer::new(client));
    let send = |path: &'static str| {
        let app = app.clone();
        async move {
            let response = app
                .oneshot(Request::post(path).body(axum::body::Body::empty()).unwrap())
                .await
                .unwrap();
            assert_eq!(response.status(), 200, "{path}");
        }
    };
    for requests in [1, 3] {
        let recorder = DebuggingRecorder::new();
        metrics::with_local_recorder(&recorder, || {
            rt.block_on(async {
                for i in 0..requests {
                    send(["/orders/1/pay", "/orders/2/pay"][i % 2]).await;
                }
                send("/carts/9").await;
            })
        });
        let seen = seen(&recorder);
        let get = |metric: &str, name: &str, outcome: &str| {
            seen.get(&(metric.to_owned(), name.to_owned(), outcome.to_owned()))
                .copied()
                .unwrap_or(0)
        };
        let (pay, cart) = ("/orders/{id}/pay", "/carts/{id}");
        let acquired = "lock_acquisitions_total";
        assert_eq!(get(acquired, pay, "acquired"), requests as u64, "{seen:#?}");
        assert_eq!(get(acquired, cart, "acquired"), 1, "{seen:#?}");
        assert_eq!(get("lock_wait_seconds", pay, "acquired"), requests as u64);
        assert_eq!(get("lock_hold_seconds", pay, ""), requests as u64);
        assert_eq!(get("lock_hold_seconds", cart, ""), 1);
        assert_eq!(seen.len(), 6, "one series per metric and route: {seen:#?}");
    }
}
