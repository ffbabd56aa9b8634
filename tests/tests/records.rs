//! Idempotency records (`LockClient::record`) on their own, as a queue
//! consumer uses them: the outcomes of a claim, a duplicate that waits for
//! the first claimer's result, a key reused with another payload, and a
//! claimer that crashes. Against a real redis-server (two independent
//! clients: two consumers) and the embedded backend (one client).

use std::time::{Duration, Instant};

use lock_runtime::__private::testing::{assume_native_release, native_release};
use lock_runtime::{Claimed, LockClient, LockError, RecordGuard};
use test_support::RedisServer;
use test_support::helpers::{checked_native_release, key, memory_client, ms, redis_client, secs};

/// Two consumers of one store: independent clients on Redis, one client on
/// the embedded backend (its records live in the client).
async fn consumers(server: &RedisServer) -> [(&'static str, LockClient, LockClient); 2] {
    let memory = memory_client().await;
    [
        (
            "redis",
            redis_client(server).await,
            redis_client(server).await,
        ),
        ("memory", memory.clone(), memory),
    ]
}

fn run(claimed: Claimed, backend: &str) -> RecordGuard {
    match claimed {
        Claimed::Run(guard) => guard,
        other => panic!("{backend}: expected to run the work, got {other:?}"),
    }
}

/// `client` claims a fresh record for the payload `pay 42`, to run it:
/// the record's key and guard.
async fn claim_pay_42(client: &LockClient, backend: &str) -> (String, RecordGuard) {
    let id = key("msg");
    let claimed = client.record(&id).fingerprint(b"pay 42").claim().await;
    (id, run(claimed.unwrap(), backend))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_runs_once_then_every_claim_gets_the_stored_result() {
    let server = RedisServer::start();
    for (backend, a, b) in consumers(&server).await {
        let (id, guard) = claim_pay_42(&a, backend).await;
        assert_eq!(guard.key(), id);
        // In flight: a duplicate that does not wait is told so, with the lease left.
        match b.record(&id).fingerprint(b"pay 42").claim().await.unwrap() {
            Claimed::InFlight { retry_after } => {
                assert!(
                    retry_after > Duration::ZERO && retry_after <= a.default_ttl(),
                    "{backend}: {retry_after:?}"
                )
            }
            other => panic!("{backend}: expected in flight, got {other:?}"),
        }
        guard.complete(b"receipt 1").await.unwrap();
        for client in [&a, &b] {
            match client
                .record(&id)
                .fingerprint(b"pay 42")
                .claim()
                .await
                .unwrap()
            {
                Claimed::Done(stored) => assert_eq!(stored, b"receipt 1", "{backend}"),
                other => panic!("{backend}: expected the stored result, got {other:?}"),
            }
        }
        assert_eq!(
            a.renewed_records(),
            0,
            "{backend}: the completed record is not renewed"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_reused_with_another_payload_is_refused_in_flight_and_done() {
    let server = RedisServer::start();
    for (backend, a, b) in consumers(&server).await {
        let (id, guard) = claim_pay_42(&a, backend).await;
        let reused = b
            .record(&id)
            .fingerprint(b"pay 43")
            .wait(ms(300))
            .claim()
            .await
            .unwrap();
        assert!(
            matches!(reused, Claimed::Reused),
            "{backend}: in flight: {reused:?}"
        );
        guard.complete(b"receipt").await.unwrap();
        let reused = b.record(&id).fingerprint(b"pay 43").claim().await.unwrap();
        assert!(
            matches!(reused, Claimed::Reused),
            "{backend}: done: {reused:?}"
        );
        // A record without a fingerprint is one with the empty payload's.
        let other = key("msg");
        run(b.record(&other).claim().await.unwrap(), backend)
            .complete(b"")
            .await
            .unwrap();
        let reused = a.record(&other).fingerprint(b"x").claim().await.unwrap();
        assert!(matches!(reused, Claimed::Reused), "{backend}: {reused:?}");
    }
}

/// `a` claims a fresh record with a lease far longer than the work (a
/// duplicate woken only by the lease would wait 10 s) and ends the claim
/// with `end` 200 ms later, while `b` claims the same record, waiting up to
/// 5 s. Returns `b`'s answer and how long it waited.
async fn claim_while_the_first_ends<F>(
    a: &LockClient,
    b: &LockClient,
    backend: &str,
    end: impl FnOnce(RecordGuard) -> F + Send + 'static,
) -> (Claimed, Duration)
where
    F: Future<Output = ()> + Send,
{
    let id = key("msg");
    let guard = run(a.record(&id).ttl(secs(10)).claim().await.unwrap(), backend);
    let first = tokio::spawn(async move {
        tokio::time::sleep(ms(200)).await;
        end(guard).await;
    });
    let started = Instant::now();
    let answer = b.record(&id).wait(secs(5)).claim().await.unwrap();
    let waited = started.elapsed();
    first.await.unwrap();
    (answer, waited)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_waits_for_the_first_result_woken_by_its_completion() {
    let server = RedisServer::start();
    for (backend, a, b) in consumers(&server).await {
        let (duplicate, waited) = claim_while_the_first_ends(&a, &b, backend, |guard| async move {
            guard.complete(b"the first result").await.unwrap();
        })
        .await;
        match duplicate {
            Claimed::Done(stored) => assert_eq!(stored, b"the first result", "{backend}"),
            other => panic!("{backend}: expected the stored result, got {other:?}"),
        }
        assert!(
            waited >= ms(150) && waited < secs(2),
            "{backend}: waited {waited:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_guard_releases_the_record_and_wakes_a_waiting_duplicate() {
    let server = RedisServer::start();
    for (backend, a, b) in consumers(&server).await {
        // The work failed: a retry may run it.
        let (retry, waited) =
            claim_while_the_first_ends(&a, &b, backend, |guard| async move { drop(guard) }).await;
        let retry = run(retry, backend);
        assert!(waited < secs(2), "{backend}: waited {waited:?}");
        retry.complete(b"second try").await.unwrap();
        assert_eq!(a.renewed_records(), 0, "{backend}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_claimer_lets_a_later_claim_run_once_its_lease_ends() {
    let server = RedisServer::start();
    let url = server.url();
    let id = key("msg");
    // The claimer's process: its own runtime, shut down with the guard
    // leaked, so nothing renews or releases the record.
    let claimer = {
        let (url, id) = (url.clone(), id.clone());
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Runtime::new().unwrap();
            runtime.block_on(async {
                let client = LockClient::builder().redis(url).build().await.unwrap();
                let guard = run(
                    client.record(&id).ttl(ms(800)).claim().await.unwrap(),
                    "redis",
                );
                std::mem::forget(guard);
            });
            runtime.shutdown_background();
        })
    };
    claimer.join().unwrap();
    let survivor = redis_client(&server).await;
    let started = Instant::now();
    match survivor.record(&id).claim().await.unwrap() {
        Claimed::InFlight { retry_after } => assert!(retry_after <= ms(800), "{retry_after:?}"),
        other => panic!("expected the crashed claim in flight, got {other:?}"),
    }
    // Waiting: no notice comes from a dead claimer; the lease is the timer.
    let guard = run(
        survivor.record(&id).wait(secs(5)).claim().await.unwrap(),
        "redis",
    );
    let waited = started.elapsed();
    assert!(waited < secs(3), "waited {waited:?}");
    guard.complete(b"ran after the crash").await.unwrap();
    match survivor.record(&id).claim().await.unwrap() {
        Claimed::Done(stored) => assert_eq!(stored, b"ran after the crash"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_keys_and_settings_are_refused_before_anything_is_sent() {
    let client = memory_client().await;
    assert!(matches!(
        client.record("").claim().await,
        Err(LockError::InvalidKey(_))
    ));
    assert!(matches!(
        client.record("k").retention(Duration::ZERO).claim().await,
        Err(LockError::Config(_))
    ));
    assert!(matches!(
        client.record("k").ttl(Duration::ZERO).claim().await,
        Err(LockError::Config(_))
    ));
    // Nothing was claimed by the refused requests.
    run(client.record("k").claim().await.unwrap(), "memory")
        .release()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_nobody_waits_on_is_completed_and_released_without_a_notice() {
    let server = RedisServer::start();
    let (a, b) = (redis_client(&server).await, redis_client(&server).await);
    let before = server.command_calls("publish");
    // Completed, with a duplicate that looked without waiting meanwhile.
    let id = key("msg");
    let guard = run(a.record(&id).claim().await.unwrap(), "redis");
    let looked = b.record(&id).claim().await.unwrap();
    assert!(matches!(looked, Claimed::InFlight { .. }), "{looked:?}");
    guard.complete(b"done").await.unwrap();
    // Released.
    run(a.record(key("msg")).claim().await.unwrap(), "redis")
        .release()
        .await
        .unwrap();
    assert_eq!(
        server.command_calls("publish"),
        before,
        "nobody waited: no PUBLISH"
    );

    // A duplicate that waits marks the record: one notice, and it is woken.
    let id = key("msg");
    let guard = run(a.record(&id).ttl(secs(10)).claim().await.unwrap(), "redis");
    let waiting = tokio::spawn({
        let (b, id) = (b.clone(), id.clone());
        async move { b.record(&id).wait(secs(5)).claim().await }
    });
    tokio::time::sleep(ms(200)).await;
    guard.complete(b"done").await.unwrap();
    assert!(matches!(waiting.await.unwrap().unwrap(), Claimed::Done(_)));
    assert_eq!(
        server.command_calls("publish"),
        before + 1,
        "one notice for the waiter"
    );
}

/// A record nobody waits on settles in one command: where the server
/// compares for itself (Valkey 9, Redis 8.4), `SET .. IFEQ` stores the
/// result over our claim and `DELIFEQ` (`DELEX .. IFEQ`) releases it;
/// elsewhere the settle script does. Either
/// way a later claim gets the stored result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_nobody_waits_on_settles_in_one_command() {
    let server = RedisServer::start();
    let client = redis_client(&server).await;
    // Warm up: the connection's own set-up is not counted below.
    run(client.record(key("warm")).claim().await.unwrap(), "redis")
        .release()
        .await
        .unwrap();
    let (native, deletes) = checked_native_release(&client, &server);
    let calls = |command: &str| server.command_calls(command);
    let before = (calls("set"), calls("evalsha"), calls(&deletes));
    const N: u64 = 10;
    let mut ids = Vec::new();
    for _ in 0..N {
        let id = key("msg");
        let guard = run(client.record(&id).claim().await.unwrap(), "redis");
        guard.complete(b"done").await.unwrap();
        let guard = run(client.record(key("msg")).claim().await.unwrap(), "redis");
        guard.release().await.unwrap();
        ids.push(id);
    }
    let sent = (
        calls("set") - before.0,
        calls("evalsha") - before.1,
        calls(&deletes) - before.2,
    );
    println!("native: {native:?}; (SET, EVALSHA, {deletes}) = {sent:?}");
    if native.is_some() {
        assert_eq!(
            sent,
            (3 * N, 0, N),
            "claims, completions and releases in plain commands"
        );
    } else {
        // The script's own `SET` of a result counts as a `SET` too.
        assert_eq!(
            sent,
            (3 * N, 2 * N, 0),
            "plain claims, settled by the script"
        );
    }
    for id in ids {
        let again = client.record(&id).claim().await.unwrap();
        assert!(
            matches!(&again, Claimed::Done(d) if d == b"done"),
            "{again:?}"
        );
    }
}

/// A cluster in a rolling upgrade: the client found `DELEX` and `SET ..
/// IFEQ` on one node (Redis 8.4) and meets a node without them. The node
/// answers `SET .. IFEQ` with a syntax error and `DELEX` as an unknown
/// command: neither ran, so the record is settled by the script instead,
/// the native commands are off for good, and the result is stored.
#[tokio::test]
async fn a_node_without_the_native_commands_settles_records_by_script() {
    let server = RedisServer::start();
    if server.native_release().is_some() {
        println!(
            "SKIPPED on this server (it has the native commands): \
             a_node_without_the_native_commands_settles_records_by_script"
        );
        return;
    }
    let client = redis_client(&server).await;
    assume_native_release(&client, "DELEX");
    let id = key("upgrade");
    let guard = run(client.record(&id).claim().await.unwrap(), "redis");
    guard
        .complete(b"done")
        .await
        .expect("completed by the script once SET .. IFEQ was not understood");
    assert_eq!(native_release(&client), None, "turned off for good");
    let again = client.record(&id).claim().await.unwrap();
    assert!(
        matches!(&again, Claimed::Done(d) if d == b"done"),
        "{again:?}"
    );

    // The release of a record, and of a lock, from a fresh client that
    // takes the node for an upgraded one: `DELEX` is an unknown command.
    let client = redis_client(&server).await;
    assume_native_release(&client, "DELEX");
    let guard = run(
        client.record(key("upgrade")).claim().await.unwrap(),
        "redis",
    );
    guard.release().await.expect("released by the script");
    assert_eq!(native_release(&client), None);
    let client = redis_client(&server).await;
    assume_native_release(&client, "DELEX");
    let lock = key("upgrade-lock");
    client
        .lock(&lock)
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    assert_eq!(native_release(&client), None);
    let relocked = client.lock(&lock).acquire().await;
    assert!(relocked.is_ok(), "the lock was released: {relocked:?}");
}

/// A claim's future is moved wherever it is awaited (a consumer's loop, a
/// task): it holds the one attempt a claim that tries once sends, and the
/// waits' state only behind a box, taken by a claim that may wait. Built
/// as an `async` block awaiting the inner claim, it held that claim twice
/// (3,640 bytes; now about 1,500).
#[tokio::test]
async fn a_claims_future_holds_one_attempt_and_no_waits() {
    let client = memory_client().await;
    let once = std::mem::size_of_val(&client.record("k").claim());
    let waits = std::mem::size_of_val(&client.record("k").wait(secs(1)).claim());
    assert_eq!(once, waits, "the waits' state is boxed");
    assert!(once < 2048, "a claim's future: {once} bytes");
}

/// A completion the server refuses for a moment (out of memory, under
/// `maxmemory-policy noeviction`) is sent again until it is stored, within
/// the lease: given up, the work would run a second time once the lease
/// ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_refused_for_a_moment_is_sent_again_until_stored() {
    let server = RedisServer::start();
    let client = redis_client(&server).await;
    let guard = match client.record("msg-oom").claim().await.unwrap() {
        Claimed::Run(guard) => guard,
        other => panic!("{other:?}"),
    };
    assert_eq!(server.cli(&["CONFIG", "SET", "maxmemory", "1"]), "OK");
    let completing = tokio::spawn(guard.complete("charged"));
    tokio::time::sleep(ms(500)).await;
    assert!(!completing.is_finished(), "the refusal was not sent again");
    assert_eq!(server.cli(&["CONFIG", "SET", "maxmemory", "0"]), "OK");
    completing
        .await
        .unwrap()
        .expect("stored once the server took writes again");
    match client.record("msg-oom").claim().await.unwrap() {
        Claimed::Done(stored) => assert_eq!(stored, b"charged"),
        other => panic!("{other:?}"),
    }
}

/// A record the store could not renew for longer than its lease is lost
/// once the store answers again (it expired there): `lost()` resolves, so
/// the work can stop, since a duplicate may run it now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_expired_while_the_store_was_paused_is_reported_lost() {
    let server = RedisServer::start();
    let client = redis_client(&server).await;
    let guard = match client
        .record("msg-lost")
        .ttl(ms(300))
        .claim()
        .await
        .unwrap()
    {
        Claimed::Run(guard) => guard,
        other => panic!("{other:?}"),
    };
    assert!(!guard.is_lost());
    server.pause().unwrap();
    tokio::time::sleep(ms(800)).await;
    assert!(!guard.is_lost(), "lost before the server said so");
    server.resume().unwrap();
    tokio::time::timeout(secs(5), guard.lost())
        .await
        .expect("the loss is reported once the server answers");
    assert!(guard.is_lost());
}
