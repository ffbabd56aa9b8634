//! `IdempotencyLayer` on Redlock masters: a dead or emptied master neither
//! stops the layer nor reruns an order, and concurrent identical requests run
//! the handler at most once.

use std::sync::atomic::Ordering;

use axum::http::StatusCode;
use lock_runtime::layer::IdempotencyLayer;
use test_support::helpers::ms;
use test_support::topology::Redlock;

mod http_idempotency_common;
use http_idempotency_common::*;

/// On Redlock the records live on every master and a majority decides: a
/// master that dies, or one that comes back empty, neither stops the layer
/// nor lets a completed order run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redlock_a_dead_or_emptied_master_neither_stops_the_layer_nor_reruns_an_order() {
    let mut masters = Redlock::start(3);
    let orders = Orders::default();
    let layer = IdempotencyLayer::new(redlock_client(&masters).await);
    let api = Api::orders(layer, &orders).await;
    let send = |key: &'static str| api.order(key, "kettle").send();
    let first = send("\"r-1\"").await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let first_body = first.text().await.unwrap();
    for node in 0..masters.size() {
        // The record, beside the client's registry entry (its label).
        let mut names = masters.keys(node);
        names.retain(|n| !n.starts_with("lock:C{"));
        assert_eq!(names.len(), 1, "node {node}'s records: {names:?}");
    }

    masters.kill(0);
    let again = send("\"r-1\"").await.unwrap();
    assert_eq!(again.status(), StatusCode::CREATED, "with node 0 down");
    assert!(is_replay(again.headers()));
    assert_eq!(again.text().await.unwrap(), first_body);
    let second = send("\"r-2\"").await.unwrap();
    assert_eq!(second.status(), StatusCode::CREATED);
    assert!(!is_replay(second.headers()));

    // Node 1 loses its data (a restart without persistence): node 2 alone
    // still holds both responses, and a lone copy of a response is replayed,
    // never run again.
    assert_eq!(masters.cli(1, &["FLUSHALL"]), "OK");
    for key in ["\"r-1\"", "\"r-2\""] {
        let r = send(key).await.unwrap();
        assert_eq!(r.status(), StatusCode::CREATED, "{key}");
        assert!(is_replay(r.headers()), "{key} ran again");
    }
    assert_eq!(orders.runs.load(Ordering::SeqCst), 2);
    // The replays left no claim behind on the emptied node.
    assert_eq!(masters.cli(1, &["DBSIZE"]), "0");

    // With a single master left there is no majority: 503, not a guess.
    masters.kill(1);
    let alone = send("\"r-3\"").await.unwrap();
    assert_eq!(alone.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(orders.runs.load(Ordering::SeqCst), 2);
}

/// Claims racing over three masters: at most one wins a majority (a
/// three-way split leaves nobody with one, and every racer gets 409), and
/// the losers undo their partial claims, so the next retry is decided.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redlock_concurrent_identical_posts_run_the_handler_at_most_once() {
    let masters = Redlock::start(3);
    let orders = Orders::taking(ms(200));
    let layer = IdempotencyLayer::new(redlock_client(&masters).await);
    let api = Api::orders(layer, &orders).await;
    let send = || api.order("\"race\"", "chair").send();
    for _ in 0..3 {
        let statuses = futures_util::future::join_all((0..10).map(|_| send()))
            .await
            .into_iter()
            .map(|r| r.unwrap().status())
            .collect::<Vec<_>>();
        let runs = orders.runs.load(Ordering::SeqCst);
        let created = statuses.iter().filter(|s| s.is_success()).count();
        let conflicts = statuses
            .iter()
            .filter(|s| **s == StatusCode::CONFLICT)
            .count();
        assert!(runs <= 1, "the handler ran {runs} times: {statuses:?}");
        assert_eq!(created + conflicts, 10, "{statuses:?}");
        if runs == 1 {
            break;
        }
        assert_eq!(created, 0, "{statuses:?}");
    }
    assert_eq!(orders.runs.load(Ordering::SeqCst), 1);
    // Nothing is left in flight: every retry now gets the stored response.
    let r = send().await.unwrap();
    assert!(is_replay(r.headers()));
    assert_eq!(orders.runs.load(Ordering::SeqCst), 1);
}
