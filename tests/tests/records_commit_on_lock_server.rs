//! Idempotency records committed in the record itself, on the lock server
//! (`RecordRequest::commit_on_lock_server`): a queue consumer whose data
//! lives on the server of its locks pays for a message and completes its
//! record in one script call. No copy is written, no look precedes the
//! work, no completion follows; the guarantees are those of a commit store:
//! the work commits once, a redelivery gets its result, a claimer paused
//! past its lease cannot commit a second time.

use std::time::Duration;

use lock_runtime::records::{COMMITTED_SUFFIX, Committed};
use lock_runtime::{Claimed, LockClient, LockError};
use redis::aio::ConnectionManager;
use test_support::helpers::{ms, one_worker_runtime, secs};
use test_support::topology::{Redlock, Topology};
use test_support::{RedisServer, signal};
use tokio::sync::oneshot;

/// A short lease: a killed claimer's record is free soon.
const LEASE: Duration = Duration::from_millis(600);

async fn client(server: &RedisServer) -> LockClient {
    LockClient::builder()
        .redis(server.url())
        .build()
        .await
        .unwrap()
}

async fn conn(server: &RedisServer) -> ConnectionManager {
    redis::Client::open(server.url())
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap()
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

async fn payments(server: &RedisServer, message: &str) -> i64 {
    let paid: Option<i64> = redis::cmd("GET")
        .arg(format!("paid:{message}"))
        .query_async(&mut conn(server).await)
        .await
        .unwrap();
    paid.unwrap_or(0) / 1250
}

/// The record's claim, as the consumer sends it.
fn request(client: &LockClient, message: &str) -> lock_runtime::RecordRequest {
    client
        .record(message)
        .fingerprint(b"1250")
        .ttl(LEASE)
        .wait(secs(5))
        .commit_on_lock_server()
}

/// Consumes `message` once: claims its record, pays and commits; the
/// claim's answer and the result.
async fn consume(client: &LockClient, message: &str) -> (&'static str, Vec<u8>) {
    match request(client, message).claim().await.unwrap() {
        Claimed::Run(guard) => match guard.commit_redis(&payment(message), b"paid 1250").await {
            Ok(Committed::Ours) => ("ran", b"paid 1250".to_vec()),
            Ok(Committed::Earlier(result)) => ("ran, another committed", result),
            other => panic!("unexpected commit {other:?}"),
        },
        Claimed::Done(result) => ("done", result),
        other => panic!("unexpected claim {other:?}"),
    }
}

async fn commands(server: &RedisServer) -> String {
    redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn(server).await)
        .await
        .unwrap()
}

/// How many times `INFO commandstats` counts `command` (`cmdstat_<command>`).
fn calls(stats: &str, command: &str) -> u64 {
    let prefix = format!("cmdstat_{command}:calls=");
    stats
        .lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_work_completes_its_record_in_one_call_and_a_redelivery_gets_the_result() {
    let server = RedisServer::start();
    let client = client(&server).await;
    // The script loaded once: not counted below.
    assert_eq!(consume(&client, "m-0").await.0, "ran");
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn(&server).await)
        .await
        .unwrap();
    // A lease the watchdog does not renew within the test (its renewal is a
    // script call too).
    let claim = request(&client, "m-1").ttl(secs(30)).claim().await.unwrap();
    let Claimed::Run(guard) = claim else {
        panic!("not claimed");
    };
    let committed = guard.commit_redis(&payment("m-1"), b"paid 1250").await;
    assert_eq!(committed.unwrap(), Committed::Ours);
    // The claim's `SET NX` and the commit's script (its `GET`, the writes,
    // its `SET`): no look, no copy, no completion after it.
    let stats = commands(&server).await;
    assert_eq!(calls(&stats, "evalsha"), 1, "{stats}");
    assert_eq!(calls(&stats, "set"), 2, "{stats}");
    assert_eq!(
        calls(&stats, "hmget") + calls(&stats, "publish"),
        0,
        "{stats}"
    );
    let again = consume(&client, "m-1").await;
    assert_eq!(again, ("done", b"paid 1250".to_vec()));
    assert_eq!(payments(&server, "m-1").await, 1);
    let mut conn = conn(&server).await;
    let copies: Vec<String> = redis::cmd("KEYS")
        .arg(format!("*{COMMITTED_SUFFIX}"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(copies.is_empty(), "a copy was written: {copies:?}");
}

/// Killed right after its commit: the record is completed already, so the
/// redelivery is answered `Done` at once, without waiting out a lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_killed_after_its_commit_is_not_run_again() {
    let server = RedisServer::start();
    let process = one_worker_runtime();
    let (committed_tx, committed) = oneshot::channel();
    {
        let url = server.url();
        process.spawn(async move {
            let client = LockClient::builder().redis(url).build().await.unwrap();
            let request = client
                .record("m-2")
                .fingerprint(b"1250")
                .ttl(secs(30))
                .commit_on_lock_server();
            let Claimed::Run(guard) = request.claim().await.unwrap() else {
                panic!("not claimed");
            };
            let committed = guard.commit_redis(&payment("m-2"), b"paid 1250").await;
            let _ = committed_tx.send(committed.unwrap());
            std::future::pending::<()>().await;
        });
    }
    assert_eq!(committed.await.unwrap(), Committed::Ours);
    process.shutdown_background();
    let client = client(&server).await;
    let started = tokio::time::Instant::now();
    assert_eq!(
        consume(&client, "m-2").await,
        ("done", b"paid 1250".to_vec())
    );
    assert!(started.elapsed() < secs(2), "{:?}", started.elapsed());
    assert_eq!(payments(&server, "m-2").await, 1);
}

/// Killed before its commit: nothing was written, and the redelivery (once
/// the claim's lease ran out) pays, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_killed_before_its_commit_leaves_nothing_and_the_work_runs_once() {
    let server = RedisServer::start();
    let process = one_worker_runtime();
    let (claimed_tx, claimed) = oneshot::channel();
    {
        let url = server.url();
        process.spawn(async move {
            let client = LockClient::builder().redis(url).build().await.unwrap();
            let Claimed::Run(_guard) = request(&client, "m-3").claim().await.unwrap() else {
                panic!("not claimed");
            };
            let _ = claimed_tx.send(());
            std::future::pending::<()>().await;
        });
    }
    claimed.await.unwrap();
    process.shutdown_background();
    let client = client(&server).await;
    assert_eq!(
        consume(&client, "m-3").await,
        ("ran", b"paid 1250".to_vec())
    );
    assert_eq!(payments(&server, "m-3").await, 1);
}

/// `message` claimed by `client`, whose lease then ran out (the claim
/// deleted: the watchdog renews it), and another process's client.
async fn claimed_then_expired(
    server: &RedisServer,
    client: &LockClient,
    message: &str,
) -> (lock_runtime::RecordGuard, LockClient) {
    let Claimed::Run(paused) = request(client, message).claim().await.unwrap() else {
        panic!("not claimed");
    };
    let _: () = redis::cmd("FLUSHALL")
        .query_async(&mut conn(server).await)
        .await
        .unwrap();
    (paused, self::client(server).await)
}

/// A claimer paused past its lease while a duplicate claimed, paid and
/// committed cannot commit a second time: nothing of its writes is
/// committed, and it is told the other's result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimer_paused_past_its_lease_cannot_commit_a_second_time() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let (paused, other) = claimed_then_expired(&server, &client, "m-4").await;
    assert_eq!(consume(&other, "m-4").await.0, "ran");
    let late = paused
        .commit_redis(&payment("m-4"), b"paid 1250, late")
        .await;
    assert_eq!(late.unwrap(), Committed::Earlier(b"paid 1250".to_vec()));
    assert_eq!(payments(&server, "m-4").await, 1, "paid twice");
}

/// A claimer paused past its lease whose key another claimer took and is
/// still working on commits first: its work is what happened, and the other
/// claimer, committing after, writes nothing and is told that result (as
/// with a copy in a store: the first commit wins, whoever claimed last).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_commit_wins_over_a_later_claim_still_running() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let (paused, other) = claimed_then_expired(&server, &client, "m-5").await;
    let Claimed::Run(running) = request(&other, "m-5").claim().await.unwrap() else {
        panic!("the free key was not claimed");
    };
    let first = paused
        .commit_redis(&payment("m-5"), b"paid 1250, first")
        .await;
    assert_eq!(first.unwrap(), Committed::Ours);
    let writes = payment("m-5");
    let second = running.commit_redis(&writes, b"paid 1250, second");
    assert_eq!(
        second.await.unwrap(),
        Committed::Earlier(b"paid 1250, first".to_vec())
    );
    assert_eq!(payments(&server, "m-5").await, 1, "paid twice");
    assert_eq!(consume(&client, "m-5").await.1, b"paid 1250, first");
}

/// A duplicate waiting on the record in flight is woken by the commit (its
/// notice), not by the lease's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_duplicate_is_woken_by_the_commit() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let long = || {
        client
            .record("m-6")
            .fingerprint(b"1250")
            .ttl(secs(30))
            .wait(secs(20))
            .commit_on_lock_server()
    };
    let Claimed::Run(guard) = long().claim().await.unwrap() else {
        panic!("not claimed");
    };
    let duplicate = tokio::spawn(long().claim());
    // The duplicate marks the record waited on.
    tokio::time::sleep(ms(300)).await;
    let started = tokio::time::Instant::now();
    let committed = guard.commit_redis(&payment("m-6"), b"paid 1250").await;
    assert_eq!(committed.unwrap(), Committed::Ours);
    let woken = tokio::time::timeout(secs(5), duplicate).await;
    let answer = woken.expect("not woken by the commit").unwrap();
    assert!(
        matches!(&answer, Ok(Claimed::Done(r)) if r == b"paid 1250"),
        "{answer:?}"
    );
    assert!(started.elapsed() < secs(5));
    assert_eq!(payments(&server, "m-6").await, 1);
}

/// Another payload under a committed key is `Reused`; a command off the
/// allow-list is refused before anything is sent, and the record released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_payload_is_reused_and_a_command_off_the_allow_list_writes_nothing() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let Claimed::Run(guard) = request(&client, "m-7").claim().await.unwrap() else {
        panic!("not claimed");
    };
    let [pay, _] = payment("m-7");
    let writes = [pay, redis::cmd("FLUSHALL").clone()];
    let e = guard.commit_redis(&writes, b"paid").await.unwrap_err();
    assert!(
        matches!(&e, LockError::Config(why) if why.contains("FLUSHALL")),
        "{e}"
    );
    assert_eq!(payments(&server, "m-7").await, 0);
    // Released, not left in flight for its lease.
    assert_eq!(consume(&client, "m-7").await.0, "ran");
    let other_payload = client
        .record("m-7")
        .fingerprint(b"9999")
        .commit_on_lock_server();
    let claimed = other_payload.claim().await;
    assert!(matches!(claimed, Ok(Claimed::Reused)), "{claimed:?}");
    assert_eq!(payments(&server, "m-7").await, 1);
}

/// Where the records are not on one Redis server, the claim is refused with
/// `Config`, naming the setter, before anything runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_without_one_lock_server_are_refused_at_the_claim() {
    let masters = Redlock::start(3);
    let memory = LockClient::builder().memory().build().await.unwrap();
    let redlock = masters.builder().build().await.unwrap();
    for (name, client) in [("embedded", memory), ("Redlock", redlock)] {
        let claimed = request(&client, "m-8").claim().await;
        let Err(LockError::Config(why)) = claimed else {
            panic!("{name}: {claimed:?}");
        };
        assert!(why.contains("commit_on_lock_server"), "{name}: {why}");
        // Nothing was claimed: the key is free without the store.
        let plain = client.record("m-8").fingerprint(b"1250").claim().await;
        assert!(matches!(plain, Ok(Claimed::Run(_))), "{name}: {plain:?}");
    }
}

/// The lock server paused during the commit: the outcome is unknown and the
/// claim answers an error; once the server is back, the redelivery finds the
/// work done or runs it, and it is paid once either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_whose_reply_never_came_is_paid_once_after_all() {
    let server = RedisServer::start();
    let client = LockClient::builder()
        .redis(server.url())
        .response_timeout(ms(300))
        .build()
        .await
        .unwrap();
    let Claimed::Run(guard) = request(&client, "m-9").claim().await.unwrap() else {
        panic!("not claimed");
    };
    let pid = server.pid().unwrap();
    signal(pid, "STOP").unwrap();
    let committing = tokio::spawn(guard.commit_redis(payment("m-9"), b"paid 1250"));
    tokio::time::sleep(ms(500)).await;
    server.resume().unwrap();
    let committed = committing.await.unwrap();
    let fresh = self::client(&server).await;
    let again = consume(&fresh, "m-9").await;
    match committed {
        Ok(Committed::Ours) => assert_eq!(again.0, "done"),
        Ok(other) => panic!("{other:?}"),
        // Unknown: the commit may have run when the server woke.
        Err(LockError::Backend(_)) => assert!(again.0 == "done" || again.0 == "ran"),
        Err(e) => panic!("{e}"),
    }
    assert_eq!(payments(&server, "m-9").await, 1, "paid twice or never");
}
