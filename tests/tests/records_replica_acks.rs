//! Idempotency records under `min_replica_acks`, on a master with one
//! replica: a claim, a completion and a commit on the lock server are
//! answered once the replica acknowledged them, as a lock's acquire is. A
//! record that lived only on the master would be lost in a failover, and
//! the request it stands for run again.
//!
//! Each test hangs the replica (`SIGSTOP`) so that it acknowledges nothing;
//! the last one does it under `IdempotencyLayer`.

use lock_runtime::records::Committed;
use lock_runtime::{Claimed, LockClient, LockError, RecordGuard};
use test_support::RedisServer;
use test_support::helpers::{ms, secs};
use test_support::topology::master_and_replica;

/// A client that waits at most 300 ms for one replica's acknowledgement.
async fn acked(master: &RedisServer) -> LockClient {
    LockClient::builder()
        .redis(master.url())
        .min_replica_acks(1, ms(300))
        .build()
        .await
        .unwrap()
}

async fn plain(master: &RedisServer) -> LockClient {
    LockClient::builder()
        .redis(master.url())
        .build()
        .await
        .unwrap()
}

/// The server's keys, sorted.
fn keys(server: &RedisServer) -> String {
    let mut keys: Vec<_> = server
        .cli(&["KEYS", "*"])
        .lines()
        .map(str::to_owned)
        .collect();
    keys.sort();
    keys.join(" ")
}

async fn claimed(client: &LockClient, message: &str) -> RecordGuard {
    match client.record(message).ttl(secs(5)).claim().await.unwrap() {
        Claimed::Run(guard) => guard,
        other => panic!("{message}: not claimed: {other:?}"),
    }
}

fn unreplicated(what: &str, answer: Result<impl std::fmt::Debug, LockError>) {
    match answer {
        Err(LockError::Backend(e)) => assert!(
            e.to_string()
                .contains("0 of 1 required replicas acknowledged"),
            "{what}: the error says how many acknowledged: {e}"
        ),
        other => panic!("{what}: expected a backend error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_no_replica_acknowledges_is_refused_and_given_back() {
    let (master, replica) = master_and_replica();
    let client = acked(&master).await;
    // Acknowledged: the replica holds the completed record when
    // `complete` answers.
    claimed(&client, "m-1")
        .await
        .complete(b"paid")
        .await
        .unwrap();
    let before = keys(&master);
    assert_eq!(
        keys(&replica),
        before,
        "a completion is answered once replicated"
    );

    replica.pause().unwrap();
    let refused = client.record("m-2").ttl(secs(5)).claim().await;
    replica.resume().unwrap();
    unreplicated("the claim", refused);
    assert_eq!(
        keys(&master),
        before,
        "the unacknowledged claim was given back"
    );
    // So the message is free for the next delivery at once, not after a lease.
    let next = plain(&master).await;
    assert!(matches!(
        next.record("m-2").claim().await.unwrap(),
        Claimed::Run(_)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_no_replica_acknowledges_is_an_unknown_outcome() {
    let (master, replica) = master_and_replica();
    let client = acked(&master).await;
    let guard = claimed(&client, "m-1").await;
    replica.pause().unwrap();
    let completed = guard.complete(b"paid").await;
    replica.resume().unwrap();
    // The master stored it, but a failover then could lose it: the caller
    // is told the outcome is unknown, not that the result is kept.
    unreplicated("the completion", completed);
    let next = plain(&master).await;
    match next.record("m-1").claim().await.unwrap() {
        Claimed::Done(result) => assert_eq!(result, b"paid"),
        other => panic!("the master kept the completion: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_on_the_lock_server_no_replica_acknowledges_is_an_unknown_outcome() {
    let (master, replica) = master_and_replica();
    let client = acked(&master).await;
    let request = || {
        client
            .record("m-1")
            .ttl(secs(5))
            .commit_on_lock_server()
            .claim()
    };
    let Claimed::Run(guard) = request().await.unwrap() else {
        panic!("not claimed");
    };
    let pay = [redis::cmd("INCRBY").arg("paid:m-1").arg(1250).clone()];
    replica.pause().unwrap();
    let committed = guard.commit_redis(&pay, b"paid").await;
    replica.resume().unwrap();
    unreplicated(
        "the commit",
        committed.map(|c| matches!(c, Committed::Ours)),
    );
    // The master ran it once; the next delivery gets its result (with the
    // replica back, acknowledged) and does not pay again.
    match request().await.unwrap() {
        Claimed::Done(result) => assert_eq!(result, b"paid"),
        other => panic!("the master kept the commit: {other:?}"),
    }
    assert_eq!(master.cli(&["GET", "paid:m-1"]).trim(), "1250");
}

/// Over HTTP (`IdempotencyLayer`): a request whose claim no replica
/// acknowledged is answered 503 without running its handler, so a retry
/// runs it once the replica is back, and the retry after that is replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_claim_no_replica_acknowledges_is_unavailable_and_runs_on_retry() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use axum::routing::post;
    use lock_runtime::layer::IdempotencyLayer;
    use tower::ServiceExt;

    let (master, replica) = master_and_replica();
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let app = axum::Router::new()
        .route(
            "/orders",
            post(move || async move {
                counted.fetch_add(1, Ordering::SeqCst);
                (StatusCode::CREATED, "order 1")
            }),
        )
        .route_layer(IdempotencyLayer::new(acked(&master).await));
    let order = || {
        let request = Request::post("/orders")
            .header("idempotency-key", "k-1")
            .body(Body::from("{\"item\":\"book\"}"))
            .unwrap();
        app.clone().oneshot(request)
    };
    replica.pause().unwrap();
    let refused = order().await.unwrap();
    replica.resume().unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(refused.headers().contains_key("retry-after"));
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the handler did not run");
    assert_eq!(order().await.unwrap().status(), StatusCode::CREATED);
    let replayed = order().await.unwrap();
    assert_eq!(replayed.status(), StatusCode::CREATED);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the retry was replayed");
}
