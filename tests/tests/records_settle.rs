//! idempotency_settle.lua on a real redis-server, each of its outcomes: the
//! script every request that ran ends with (its completion, or its release).
//! Its common path compares the record with the claim as written, whole, so
//! these pin that nothing else passes for ours: another owner, an owner that
//! starts like ours, a record completed by another, one marked waited on.

use redis::aio::MultiplexedConnection;
use test_support::RedisServer;

const SETTLE: &str = include_str!("../../lock-runtime/scripts/idempotency_settle.lua");
const FP: &str = "5f1e0c2a9b3d4e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7";
const CHANNEL: &str = "t:N{r}";

struct Redis {
    conn: MultiplexedConnection,
    script: redis::Script,
}

impl Redis {
    async fn connect(server: &RedisServer) -> Self {
        let client = redis::Client::open(server.url()).unwrap();
        Self {
            conn: client.get_multiplexed_async_connection().await.unwrap(),
            script: redis::Script::new(SETTLE),
        }
    }

    async fn set(&mut self, record: &str, value: &str) {
        let () = redis::cmd("SET")
            .arg(record)
            .arg(value)
            .query_async(&mut self.conn)
            .await
            .unwrap();
    }

    async fn get(&mut self, record: &str) -> Option<String> {
        redis::cmd("GET")
            .arg(record)
            .query_async(&mut self.conn)
            .await
            .unwrap()
    }

    /// The completion of `owner` (with the response `status`), as the
    /// library sends it.
    async fn complete(&mut self, record: &str, owner: &str, status: u16) -> i64 {
        self.settle(record, owner, Some(status)).await
    }

    /// The release of `owner`, as the library sends it.
    async fn release(&mut self, record: &str, owner: &str) -> i64 {
        self.settle(record, owner, None).await
    }

    /// The settle script for `owner`'s claim: a completion with the
    /// response `status`, or without one a release.
    async fn settle(&mut self, record: &str, owner: &str, status: Option<u16>) -> i64 {
        let mut call = self.script.key(record);
        call.arg(format!("run:{owner}:{FP}"))
            .arg(format!("PUBLISH {CHANNEL}"));
        if let Some(status) = status {
            call.arg(60_000).arg(done(owner, status));
        }
        call.invoke_async(&mut self.conn).await.unwrap()
    }
}

/// The completed record of `owner` for a response of `status`.
fn done(owner: &str, status: u16) -> String {
    let headers = "content-type:text/plain\n";
    format!(
        "done:{owner}:{FP}:{status}:0:{}:{headers}hello",
        headers.len()
    )
}

#[tokio::test]
async fn a_completion_stores_over_its_own_claim_only() {
    let server = RedisServer::start();
    let mut redis = Redis::connect(&server).await;
    let (a, b) = ("a".repeat(32), "b".repeat(32));

    // Our claim: stored.
    redis.set("r1", &format!("run:{a}:{FP}")).await;
    assert_eq!(redis.complete("r1", &a, 201).await, 1);
    assert_eq!(redis.get("r1").await, Some(done(&a, 201)));
    // Sent again (the first reply was lost): still ours, and the stored
    // response is not replaced.
    assert_eq!(redis.complete("r1", &a, 500).await, 1);
    assert_eq!(redis.get("r1").await, Some(done(&a, 201)));
    // Completed by another: not ours, untouched.
    assert_eq!(redis.complete("r1", &b, 201).await, 0);
    assert_eq!(redis.get("r1").await, Some(done(&a, 201)));

    // Another's claim, and a claim whose owner starts like ours: untouched.
    let theirs = format!("run:{b}:{FP}");
    redis.set("r2", &theirs).await;
    assert_eq!(redis.complete("r2", &a, 201).await, 0);
    assert_eq!(redis.get("r2").await, Some(theirs));
    let longer = format!("run:{a}0:{FP}");
    redis.set("r3", &longer).await;
    assert_eq!(redis.complete("r3", &a, 201).await, 0);
    assert_eq!(redis.get("r3").await, Some(longer));

    // Nothing there (our lease ran out, nobody claimed since): the handler
    // ran, so its response is kept.
    assert_eq!(redis.complete("r4", &a, 201).await, 1);
    assert_eq!(redis.get("r4").await, Some(done(&a, 201)));

    // Not a record at all: untouched.
    redis.set("r5", "hand-written").await;
    assert_eq!(redis.complete("r5", &a, 201).await, 0);
    assert_eq!(redis.release("r5", &a).await, 0);
    assert_eq!(redis.get("r5").await.as_deref(), Some("hand-written"));
}

#[tokio::test]
async fn a_release_deletes_its_own_claim_only() {
    let server = RedisServer::start();
    let mut redis = Redis::connect(&server).await;
    let (a, b) = ("a".repeat(32), "b".repeat(32));

    redis.set("r1", &format!("run:{a}:{FP}")).await;
    assert_eq!(redis.release("r1", &a).await, 1);
    assert_eq!(redis.get("r1").await, None);
    // Gone already: nothing to release.
    assert_eq!(redis.release("r1", &a).await, 0);

    // Completed (even by us), or another's: kept.
    redis.set("r2", &done(&a, 201)).await;
    assert_eq!(redis.release("r2", &a).await, 0);
    assert_eq!(redis.get("r2").await, Some(done(&a, 201)));
    let theirs = format!("run:{b}:{FP}");
    redis.set("r3", &theirs).await;
    assert_eq!(redis.release("r3", &a).await, 0);
    assert_eq!(redis.get("r3").await, Some(theirs));
}

#[tokio::test]
async fn a_record_waited_on_is_settled_and_announced() {
    let server = RedisServer::start();
    let mut redis = Redis::connect(&server).await;
    let a = "a".repeat(32);
    let published = || server.command_calls("publish");

    // Neither step of a record nobody waits on is announced.
    redis.set("r1", &format!("run:{a}:{FP}")).await;
    assert_eq!(redis.complete("r1", &a, 201).await, 1);
    redis.set("r2", &format!("run:{a}:{FP}")).await;
    assert_eq!(redis.release("r2", &a).await, 1);
    assert_eq!(published(), 0, "nobody waited: no notice");

    // Marked by a waiting duplicate: still ours, and announced.
    redis.set("r3", &format!("waited:{a}:{FP}")).await;
    assert_eq!(redis.complete("r3", &a, 201).await, 1);
    assert_eq!(redis.get("r3").await, Some(done(&a, 201)));
    assert_eq!(published(), 1);
    redis.set("r4", &format!("waited:{a}:{FP}")).await;
    assert_eq!(redis.release("r4", &a).await, 1);
    assert_eq!(redis.get("r4").await, None);
    assert_eq!(published(), 2);
}
