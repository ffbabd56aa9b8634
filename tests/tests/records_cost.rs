//! What an idempotency record costs the server, and records an earlier
//! version left behind. A fresh claim is one plain `SET .. NX PX` (no script,
//! as a hand-written claim), a completion one script call; a duplicate pays
//! the claim script only because the key is taken. Records that an earlier
//! version stored as hashes are still replayed, or reported in flight, and
//! never taken for ours.

use lock_runtime::{Claimed, LockClient, LockError, LockKind, RecordGuard};
use test_support::RedisServer;
use test_support::helpers::{key, ms, redis_client};

/// The commands a record's steps may run, inside scripts or not.
const COMMANDS: &[&str] = &[
    "set", "get", "evalsha", "eval", "hmget", "hset", "pexpire", "pttl", "del", "publish",
];

/// How many times each of [`COMMANDS`] ran so far.
fn calls(server: &RedisServer) -> Vec<(&'static str, u64)> {
    COMMANDS
        .iter()
        .map(|c| (*c, server.command_calls(c)))
        .collect()
}

/// The commands run since `before`, those that ran at all, by name.
fn since(server: &RedisServer, before: &[(&'static str, u64)]) -> Vec<(&'static str, u64)> {
    calls(server)
        .into_iter()
        .zip(before)
        .map(|((name, now), (_, then))| (name, now - then))
        .filter(|(_, n)| *n > 0)
        .collect()
}

fn run(claimed: Claimed) -> RecordGuard {
    match claimed {
        Claimed::Run(guard) => guard,
        other => panic!("expected to run the work, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_claim_is_one_plain_set_and_a_completed_request_four_commands() {
    const REQUESTS: u64 = 10;
    let server = RedisServer::start();
    let client = redis_client(&server).await;
    // Loads the scripts (a NOSCRIPT answer and a load are not what is counted).
    let warm = key("msg");
    run(client.record(&warm).claim().await.unwrap())
        .complete(b"warm")
        .await
        .unwrap();
    assert!(matches!(
        client.record(&warm).claim().await.unwrap(),
        Claimed::Done(_)
    ));

    let before = calls(&server);
    for _ in 0..REQUESTS {
        let claimed = calls(&server);
        let guard = run(client
            .record(key("msg"))
            .fingerprint(b"pay 42")
            .claim()
            .await
            .unwrap());
        assert_eq!(
            since(&server, &claimed),
            [("set", 1)],
            "a fresh key's claim is one SET NX, no script"
        );
        guard.complete(b"receipt").await.unwrap();
    }
    assert_eq!(
        since(&server, &before),
        [
            ("set", 2 * REQUESTS),
            ("get", REQUESTS),
            ("evalsha", REQUESTS)
        ],
        "per request: the claim's SET NX, then the completion script (its GET and SET)"
    );

    // A duplicate of a completed record: the SET NX finds the key, the claim
    // script reads it.
    let before = calls(&server);
    match client.record(&warm).claim().await.unwrap() {
        Claimed::Done(stored) => assert_eq!(stored, b"warm"),
        other => panic!("expected the stored result, got {other:?}"),
    }
    assert_eq!(
        since(&server, &before),
        [("set", 1), ("get", 1), ("evalsha", 1)]
    );
}

/// The one record on `server` (the test's own prefix), by name.
fn the_record(server: &RedisServer) -> String {
    let keys = server.cli(&["--scan", "--pattern", "*"]);
    let records: Vec<&str> = keys
        .lines()
        .filter(|k| server.cli(&["GET", k]).starts_with("run:"))
        .collect();
    assert_eq!(records.len(), 1, "{keys}");
    records[0].to_owned()
}

/// Replaces the record `name` with the hash an earlier version stored: the
/// `fields` given, another owner, `fingerprint`, a lease of 10 s.
fn as_earlier_version(server: &RedisServer, name: &str, fingerprint: &str, fields: &[&str]) {
    server.cli(&["DEL", name]);
    let mut hset = vec![
        "HSET",
        name,
        "owner",
        "an-earlier-client",
        "fp",
        fingerprint,
    ];
    hset.extend_from_slice(fields);
    server.cli(&hset);
    server.cli(&["PEXPIRE", name, "10000"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_an_earlier_version_stored_as_a_hash_is_replayed_or_in_flight_never_ours() {
    let server = RedisServer::start();
    let (a, b): (LockClient, LockClient) =
        (redis_client(&server).await, redis_client(&server).await);
    let id = key("msg");
    let guard = run(a.record(&id).fingerprint(b"pay 42").claim().await.unwrap());
    let name = the_record(&server);
    let value = server.cli(&["GET", &name]);
    let fingerprint = value.rsplit(':').next().unwrap().to_owned();

    // In flight, claimed by an earlier version's client.
    as_earlier_version(&server, &name, &fingerprint, &["state", "run"]);
    match b.record(&id).fingerprint(b"pay 42").claim().await.unwrap() {
        Claimed::InFlight { retry_after } => assert!(retry_after > ms(5000), "{retry_after:?}"),
        other => panic!("expected in flight, got {other:?}"),
    }
    let listed = b.list("", 10).await.unwrap();
    assert!(
        listed
            .iter()
            .any(|s| s.kind == LockKind::IdempotencyRecord && s.held),
        "{listed:?}"
    );
    // A duplicate that waits marks it as that version did, so that its
    // completion is announced.
    let waited = b
        .record(&id)
        .fingerprint(b"pay 42")
        .wait(ms(100))
        .claim()
        .await
        .unwrap();
    assert!(matches!(waited, Claimed::InFlight { .. }), "{waited:?}");
    assert_eq!(server.cli(&["HGET", &name, "waited"]), "1");
    assert!(matches!(
        b.record(&id).fingerprint(b"pay 43").claim().await.unwrap(),
        Claimed::Reused
    ));

    // Completed by that version.
    as_earlier_version(
        &server,
        &name,
        &fingerprint,
        &[
            "state", "done", "status", "0", "headers", "", "body", "a:b:c", "big", "",
        ],
    );
    match b.record(&id).fingerprint(b"pay 42").claim().await.unwrap() {
        Claimed::Done(stored) => assert_eq!(stored, b"a:b:c"),
        other => panic!("expected the stored result, got {other:?}"),
    }
    assert!(matches!(
        b.record(&id).fingerprint(b"pay 43").claim().await.unwrap(),
        Claimed::Reused
    ));
    // Our claim's record was replaced: its completion finds another's.
    assert!(matches!(
        guard.complete(b"ours").await,
        Err(LockError::Lost { .. })
    ));
    assert_eq!(server.cli(&["HGET", &name, "body"]), "a:b:c");
    let listed = b.list("", 10).await.unwrap();
    assert!(
        listed.iter().all(|s| s.kind != LockKind::IdempotencyRecord),
        "completed: not in flight: {listed:?}"
    );
}
