//! What an idempotency record costs the server. A fresh claim is one plain
//! `SET .. NX PX` (no script, as a hand-written claim), a completion one
//! call (the server's own `SET .. IFEQ` on Valkey 9 and Redis 8.4, a script
//! elsewhere); a duplicate pays the claim script only because the key is
//! taken.

use lock_runtime::{Claimed, RecordGuard};
use test_support::RedisServer;
use test_support::helpers::{key, redis_client};

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
async fn a_fresh_claim_is_one_plain_set_and_its_completion_one_call() {
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
    if server.native_release().is_some() {
        // Valkey 9, Redis 8.4: the completion is the server's own `SET ..
        // IFEQ` over the claim as written.
        assert_eq!(
            since(&server, &before),
            [("set", 2 * REQUESTS)],
            "per request: the claim's SET NX, then the completion's SET IFEQ"
        );
    } else {
        assert_eq!(
            since(&server, &before),
            [
                ("set", 2 * REQUESTS),
                ("get", REQUESTS),
                ("evalsha", REQUESTS)
            ],
            "per request: the claim's SET NX, then the completion script (its GET and SET)"
        );
    }

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
