//! Holders you can name: `inspect` from another client names the holder,
//! every holder and the waiters in line by their clients' labels, for the
//! mutex, `lock_all`, the read-write lock and the semaphore, on every
//! backend.

use std::time::{Duration, SystemTime};

use lock_runtime::{LockClient, LockClientBuilder, LockGuard, LockKind, LockState};
use test_support::RedisServer;
use test_support::topology::{Cluster, Redlock, SentinelSetup, Topology};

const WAIT: Duration = Duration::from_secs(10);

/// Starts `acquire` in a task and gives it time to queue.
async fn queue_behind<F>(acquire: F) -> tokio::task::JoinHandle<LockGuard>
where
    F: std::future::Future<Output = Result<LockGuard, lock_runtime::LockError>> + Send + 'static,
{
    let task = tokio::spawn(async move { acquire.await.expect("acquired after waiting") });
    tokio::time::sleep(Duration::from_millis(300)).await;
    task
}

/// A client labelled `pod-a` on `server`, and another one (default label)
/// that looks at what it holds.
async fn pod_a_and_an_observer(server: &RedisServer) -> (LockClient, LockClient) {
    let builder = LockClient::builder().redis(server.url());
    let pod_a = builder.clone().label("pod-a").build().await.unwrap();
    (pod_a, builder.build().await.unwrap())
}

/// A client of an embedded backend of its own, labelled `solo`.
async fn solo() -> LockClient {
    LockClient::builder()
        .memory()
        .label("solo")
        .build()
        .await
        .unwrap()
}

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

fn recent(state: &LockState) {
    let since = state.since.expect("since when");
    let ago = SystemTime::now().duration_since(since).unwrap_or_default();
    assert!(ago < Duration::from_secs(10), "{state:?}");
}

/// `pod-a` holds, `pod-b` and `pod-c` queue (`queues`: the backend keeps
/// a line, which Redlock does not), an observer names them all;
/// `shared`: also the read-write lock and the semaphore.
async fn every_kind_is_named_from_another_client(
    builder: LockClientBuilder,
    queues: bool,
    shared: bool,
) {
    let [a, b, c, observer] = ["pod-a", "pod-b", "pod-c", "observer"];
    let build = |label: &str| builder.clone().label(label).build();
    let (a, b, c, observer) = (
        build(a).await.unwrap(),
        build(b).await.unwrap(),
        build(c).await.unwrap(),
        build(observer).await.unwrap(),
    );
    assert_eq!(a.label(), "pod-a");

    // A mutex, two waiters in line.
    let key = "labels:order:42";
    let held = a.lock(key).acquire().await.unwrap();
    let (b2, c2) = (b.clone(), c.clone());
    let second = queue_behind(async move { b2.lock(key).wait(WAIT).acquire().await }).await;
    // Redlock's waiters do not queue, so a second one could pass the first.
    let third = if queues {
        Some(queue_behind(async move { c2.lock(key).wait(WAIT).acquire().await }).await)
    } else {
        None
    };
    let seen = observer.inspect(key).await.unwrap();
    assert_eq!(seen.kind, LockKind::Mutex);
    assert_eq!(seen.holder.as_deref(), Some("pod-a"), "{seen:?}");
    assert_eq!(seen.holders, names(&["pod-a"]));
    if queues {
        assert_eq!(seen.waiting, names(&["pod-b", "pod-c"]), "{seen:?}");
        assert_eq!(seen.waiters, 2);
    } else {
        assert!(seen.waiting.is_empty(), "{seen:?}");
    }
    recent(&seen);
    held.release().await.unwrap();
    let held = second.await.unwrap();
    assert_eq!(
        observer.inspect(key).await.unwrap().holder.as_deref(),
        Some("pod-b")
    );
    held.release().await.unwrap();
    if let Some(third) = third {
        third.await.unwrap().release().await.unwrap();
    }
    let free = observer.inspect(key).await.unwrap();
    assert!(free.holder.is_none() && free.holders.is_empty() && free.waiting.is_empty());
    assert!(free.since.is_none(), "{free:?}");

    // `lock_all`: each of its keys names the holder.
    let all = a
        .lock_all(["labels:{all}:x", "labels:{all}:y"])
        .acquire()
        .await
        .unwrap();
    for key in ["labels:{all}:x", "labels:{all}:y"] {
        let seen = observer.inspect(key).await.unwrap();
        assert_eq!(seen.holder.as_deref(), Some("pod-a"), "{key}: {seen:?}");
    }
    all.release().await.unwrap();

    if !shared {
        return;
    }
    // A read-write lock: two readers hold, a writer waits.
    let key = "labels:report";
    // Holders are listed in the order they asked, to the millisecond (on
    // Redis a holder that took the lock free has no token to order by):
    // each asks a few milliseconds after the one before.
    let reader_a = a.rw_lock(key).read().acquire().await.unwrap();
    tokio::time::sleep(Duration::from_millis(3)).await;
    let reader_b = b.rw_lock(key).read().acquire().await.unwrap();
    let c2 = c.clone();
    let writer =
        queue_behind(async move { c2.rw_lock(key).write().wait(WAIT).acquire().await }).await;
    let seen = observer.inspect(key).await.unwrap();
    assert_eq!(seen.kind, LockKind::RwLock, "{seen:?}");
    assert_eq!(seen.holder.as_deref(), Some("pod-a"), "{seen:?}");
    assert_eq!(seen.holders, names(&["pod-a", "pod-b"]), "{seen:?}");
    assert_eq!(seen.waiting, names(&["pod-c"]), "{seen:?}");
    recent(&seen);
    reader_a.release().await.unwrap();
    reader_b.release().await.unwrap();
    let writer = writer.await.unwrap();
    let seen = observer.inspect(key).await.unwrap();
    assert_eq!(seen.holders, names(&["pod-c"]), "{seen:?}");
    writer.release().await.unwrap();

    // A semaphore of two permits: each permit's holder, one waiter.
    let key = "labels:exports";
    let permit_b = b.semaphore(key, 2).acquire().await.unwrap();
    tokio::time::sleep(Duration::from_millis(3)).await;
    let permit_a = a.semaphore(key, 2).acquire().await.unwrap();
    tokio::time::sleep(Duration::from_millis(3)).await;
    let c2 = c.clone();
    let third = queue_behind(async move { c2.semaphore(key, 2).wait(WAIT).acquire().await }).await;
    let seen = observer.inspect(key).await.unwrap();
    assert_eq!(seen.kind, LockKind::Semaphore, "{seen:?}");
    assert_eq!(seen.holder.as_deref(), Some("pod-b"), "{seen:?}");
    assert_eq!(seen.holders, names(&["pod-b", "pod-a"]), "{seen:?}");
    assert_eq!(seen.waiting, names(&["pod-c"]), "{seen:?}");
    permit_b.release().await.unwrap();
    let permit_c = third.await.unwrap();
    let seen = observer.inspect(key).await.unwrap();
    assert_eq!(seen.holders, names(&["pod-a", "pod-c"]), "{seen:?}");
    permit_a.release().await.unwrap();
    permit_c.release().await.unwrap();

    // A leader election: the leader by the label it campaigned under, the
    // candidates in line by their clients' labels.
    let name = "labels:sweeper";
    let leading = a.leader(name).label("sweeper-a").campaign().await.unwrap();
    let b2 = b.clone();
    let candidate = tokio::spawn(async move { b2.leader(name).wait(WAIT).campaign().await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let seen = observer.inspect(name).await.unwrap();
    assert_eq!(seen.kind, LockKind::Leader, "{seen:?}");
    assert_eq!(seen.holder.as_deref(), Some("sweeper-a"), "{seen:?}");
    assert_eq!(seen.waiting, names(&["pod-b"]), "{seen:?}");
    assert!(seen.fencing_counter >= leading.term(), "{seen:?}");
    recent(&seen);
    leading.resign().await.unwrap();
    let next = candidate.await.unwrap().unwrap();
    let seen = observer.inspect(name).await.unwrap();
    assert_eq!(seen.holder.as_deref(), Some("pod-b"), "{seen:?}");
    next.resign().await.unwrap();
    assert!(!observer.inspect(name).await.unwrap().held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labels_are_seen_from_another_client_on_one_redis() {
    let server = RedisServer::start();
    every_kind_is_named_from_another_client(LockClient::builder().redis(server.url()), true, true)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labels_are_seen_from_another_client_on_sentinel() {
    let setup = SentinelSetup::start();
    every_kind_is_named_from_another_client(setup.builder(), true, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labels_are_seen_from_another_client_on_a_cluster() {
    let cluster = Cluster::start(3);
    every_kind_is_named_from_another_client(cluster.builder(), true, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labels_are_seen_from_another_client_on_redlock() {
    let masters = Redlock::start(3);
    // Redlock offers the mutex (and `lock_all`) only, and keeps no line.
    every_kind_is_named_from_another_client(masters.builder(), false, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_backend_names_one_entry_per_waiting_task() {
    // One client per embedded backend: its tasks hold and wait.
    let client = solo().await;
    let held = client.lock("k").acquire().await.unwrap();
    let mut waiting = Vec::new();
    for _ in 0..2 {
        let client = client.clone();
        waiting
            .push(queue_behind(async move { client.lock("k").wait(WAIT).acquire().await }).await);
    }
    let seen = client.inspect("k").await.unwrap();
    assert_eq!(seen.holder.as_deref(), Some("solo"));
    assert_eq!(seen.waiting, names(&["solo", "solo"]), "{seen:?}");
    recent(&seen);
    held.release().await.unwrap();
    for task in waiting {
        task.await.unwrap().release().await.unwrap();
    }
    let permits = [
        client.semaphore("s", 3).acquire().await.unwrap(),
        client.semaphore("s", 3).acquire().await.unwrap(),
    ];
    let seen = client.inspect("s").await.unwrap();
    assert_eq!(seen.kind, LockKind::Semaphore);
    assert_eq!(seen.holders, names(&["solo", "solo"]), "{seen:?}");
    for permit in permits {
        permit.release().await.unwrap();
    }
    let reader = client.rw_lock("rw").read().acquire().await.unwrap();
    let seen = client.inspect("rw").await.unwrap();
    assert_eq!(
        (seen.kind, seen.holder.as_deref()),
        (LockKind::RwLock, Some("solo"))
    );
    reader.release().await.unwrap();
}

#[tokio::test]
async fn a_label_is_checked_when_the_client_is_built() {
    for bad in ["", "pod\n-a", &"x".repeat(129)] {
        let err = LockClient::builder()
            .memory()
            .label(bad)
            .build()
            .await
            .unwrap_err();
        assert!(
            err.is_config() && err.to_string().contains("label"),
            "{err}"
        );
    }
    let client = LockClient::builder().memory().build().await.unwrap();
    let pid = format!(":{}", std::process::id());
    assert!(client.label().ends_with(&pid), "{}", client.label());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_past_its_registry_lease_shows_by_its_id() {
    let server = RedisServer::start();
    let (holder, observer) = pod_a_and_an_observer(&server).await;
    let _held = holder.lock("k").acquire().await.unwrap();
    assert_eq!(
        observer.inspect("k").await.unwrap().holder.as_deref(),
        Some("pod-a")
    );
    // The registry entry ends as it would a minute after its client.
    let entries = server.cli(&["--scan", "--pattern", "lock:C{*"]);
    assert_eq!(
        entries.lines().count(),
        2,
        "one entry per client: {entries}"
    );
    for entry in entries.lines() {
        server.cli(&["DEL", entry]);
    }
    let holder = observer.inspect("k").await.unwrap().holder.unwrap();
    assert!(holder.starts_with("unknown client "), "{holder}");
    // A value set by hand is no token.
    server.cli(&["SET", "lock:L{by-hand}", "x", "PX", "10000"]);
    let seen = observer.inspect("by-hand").await.unwrap();
    assert_eq!(seen.holder.as_deref(), Some("unknown"), "{seen:?}");
    assert!(seen.since.is_none());
}

#[tokio::test]
async fn a_force_release_evicts_every_holder_and_raises_the_counter_on_the_embedded_backend() {
    let client = solo().await;
    let readers = [
        client.rw_lock("rw").read().acquire().await.unwrap(),
        client.rw_lock("rw").read().acquire().await.unwrap(),
    ];
    let before = client.inspect("rw").await.unwrap();
    assert_eq!(before.holders.len(), 2, "{before:?}");
    let last = readers[1].fencing_token().await.unwrap();
    assert!(client.force_release("rw").await.unwrap());
    let after = client.inspect("rw").await.unwrap();
    assert!(!after.held && after.holders.is_empty(), "{after:?}");
    assert!(after.fencing_counter > before.fencing_counter, "{after:?}");
    // The evicted holders are told at once, as on a server (there a token
    // not minted yet is refused): no token for them any more.
    for reader in &readers {
        assert!(reader.is_lost());
        assert!(reader.fencing_token().await.unwrap_err().is_lost());
    }
    let writer = client.rw_lock("rw").write().acquire().await.unwrap();
    assert!(writer.fencing_token().await.unwrap() > last);
    writer.release().await.unwrap();
}

/// A client's own holder of a lock it force-releases is lost at once, on a
/// server too (a holder in another process finds out at its renewal).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_release_tells_the_clients_own_holder_at_once() {
    let server = RedisServer::start();
    let client = LockClient::builder()
        .redis(server.url())
        .build()
        .await
        .unwrap();
    let held = client
        .lock("evicted")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    held.fencing_token().await.unwrap();
    assert!(client.force_release("evicted").await.unwrap());
    assert!(held.is_lost(), "told only at the next renewal, 10 s later");
    assert!(held.fencing_token().await.unwrap_err().is_lost());
    let next = client.lock("evicted").acquire().await.unwrap();
    next.release().await.unwrap();
}

/// A force-released leader with no candidate in line is no leader any more:
/// not listed, and an observer is told so at once (not when the deposed
/// leader's lease would have ended).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_released_leader_is_listed_and_observed_as_none() {
    let server = RedisServer::start();
    let (pod_a, operator) = pod_a_and_an_observer(&server).await;
    let leading = pod_a
        .leader("sweeper")
        .ttl(Duration::from_secs(3))
        .campaign()
        .await
        .unwrap();
    let mut observed = operator.leader("sweeper").observe().await.unwrap();
    assert_eq!(
        observed
            .borrow()
            .as_ref()
            .map(|l| l.label.clone())
            .as_deref(),
        Some("pod-a")
    );
    assert!(operator.force_release("sweeper").await.unwrap());
    assert!(operator.leaders("", 10).await.unwrap().is_empty());
    tokio::time::timeout(Duration::from_secs(5), observed.wait_for(Option::is_none))
        .await
        .expect("the observer still sees the deposed leader")
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), leading.lost())
        .await
        .expect("the deposed leader was not told");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_record_in_flight_is_listed_with_its_claimers_label() {
    use axum::Router;
    use axum::routing::post;
    use tower::ServiceExt;

    let server = RedisServer::start();
    let (client, observer) = pod_a_and_an_observer(&server).await;
    let app = Router::new()
        .route(
            "/orders",
            post(|| async {
                tokio::time::sleep(Duration::from_secs(2)).await;
                "created"
            }),
        )
        .route_layer(lock_runtime::IdempotencyLayer::new(client));
    let request = http::Request::post("/orders")
        .header("Idempotency-Key", "\"order-1\"")
        .body(axum::body::Body::empty())
        .unwrap();
    let running = tokio::spawn(app.oneshot(request));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let listed = observer.list("", 10).await.unwrap();
    let records: Vec<&LockState> = listed
        .iter()
        .filter(|s| s.kind == LockKind::IdempotencyRecord)
        .collect();
    assert_eq!(records.len(), 1, "{listed:?}");
    assert_eq!(records[0].holder.as_deref(), Some("pod-a"), "{listed:?}");
    recent(records[0]);
    let done = running.await.unwrap().unwrap();
    assert_eq!(done.status(), http::StatusCode::OK);
    // Completed: no longer in flight.
    let listed = observer.list("", 10).await.unwrap();
    assert!(
        listed.iter().all(|s| s.kind != LockKind::IdempotencyRecord),
        "{listed:?}"
    );
}
