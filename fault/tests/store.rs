//! The fault suite's Redis store on a real redis-server: exclusive reads and
//! writes refused by `fence::redis`, shared reads by `store.lua`, and what
//! the checker reads back (the highest token before each write, derived
//! from the access log). The fault scenarios show the same at scale; these
//! pin each rule down with no timing involved.

use fault::store::{self, AccessKind, ReadResult, Store, WriteResult};
use lock_runtime::fence;
use test_support::RedisServer;

const KEY: &str = "k0";

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

/// Two workers' handles on one store.
async fn stores(server: &RedisServer, fencing: bool) -> (Store, Store) {
    let a = Store::connect(&server.url(), None, fencing, 1)
        .await
        .expect("the store");
    let b = a.for_worker(2);
    (a, b)
}

/// Worker 1 reads with token 5, worker 2 reads with 6 and writes (accepted),
/// then worker 1 writes with its older token: its store, and what its
/// write got.
async fn older_writes_after_newer(server: &RedisServer, fencing: bool) -> (Store, WriteResult) {
    let (a, b) = stores(server, fencing).await;
    assert_eq!(a.read(KEY, 5, 10).await.unwrap(), ok(0, 0));
    assert_eq!(b.read(KEY, 6, 20).await.unwrap(), ok(0, 0));
    assert_eq!(
        b.write(KEY, 6, 20, 0, 1).await.unwrap(),
        WriteResult::Accepted(1)
    );
    let stale = a.write(KEY, 5, 10, 0, 1).await.unwrap();
    (a, stale)
}

fn record(server: &RedisServer) -> store::Record {
    let client = redis::Client::open(server.url()).expect("a client");
    let mut conn = client.get_connection().expect("a connection");
    store::fetch_record(&mut conn, KEY).expect("the record")
}

fn ok(version: u64, counter: u64) -> ReadResult {
    ReadResult::Ok { version, counter }
}

#[test]
fn a_holders_write_after_a_newer_holders_read_is_refused_by_fence_redis_and_nothing_of_it_is_stored()
 {
    let server = RedisServer::start();
    runtime().block_on(async {
        let (_, stale) = older_writes_after_newer(&server, true).await;
        assert_eq!(stale, WriteResult::Rejected);
        // The record the library keeps is the one that refused it.
        let mut conn = redis::Client::open(server.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let highest: u64 = redis::cmd("GET")
            .arg(fence::record_key(KEY))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(highest, 6);
    });
    let r = record(&server);
    assert_eq!((r.version, r.counter, r.rejected), (1, 1, 1));
    assert_eq!(r.writes.len(), 1);
    let w = r.writes[0];
    assert_eq!((w.seq, w.fence, w.max_before, w.worker), (1, 6, 6, 2));
    let kinds: Vec<_> = r.accesses.iter().map(|a| (a.kind, a.fence)).collect();
    assert_eq!(
        kinds,
        [
            (AccessKind::Read, 5),
            (AccessKind::Read, 6),
            (AccessKind::Write, 6)
        ]
    );
}

#[test]
fn a_writer_is_refused_once_a_newer_reader_has_read_and_older_readers_once_a_newer_writer_has() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let (writer, reader) = stores(&server, true).await;
        assert_eq!(writer.read(KEY, 5, 10).await.unwrap(), ok(0, 0));
        // Readers below the highest exclusive token are refused; above it,
        // in any order, they are not.
        assert_eq!(
            reader.shared_read(KEY, 4, 20).await.unwrap(),
            ReadResult::Rejected
        );
        assert_eq!(reader.shared_read(KEY, 9, 21).await.unwrap(), ok(0, 0));
        assert_eq!(reader.shared_read(KEY, 7, 22).await.unwrap(), ok(0, 0));
        reader.exit(KEY, 9, 21).await.unwrap();
        // The reader with 9 raised fence::redis's record: the writer with
        // 5, stopped between its read and its write, is refused.
        assert_eq!(
            writer.write(KEY, 5, 10, 0, 1).await.unwrap(),
            WriteResult::Rejected
        );
    });
    let r = record(&server);
    assert_eq!((r.version, r.rejected), (0, 2));
    assert!(r.writes.is_empty());
}

#[test]
fn without_fencing_the_same_store_takes_the_stale_write_and_the_checker_sees_its_lower_token() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let (a, stale) = older_writes_after_newer(&server, false).await;
        assert_eq!(stale, WriteResult::Accepted(2));
        assert_eq!(a.read(KEY, 4, 11).await.unwrap(), ok(2, 1));
    });
    let r = record(&server);
    assert_eq!((r.version, r.counter, r.rejected), (2, 1, 0));
    let stale = r.writes[1];
    // What the checker reports as a lower token accepted and an overlap.
    assert_eq!(
        (stale.fence, stale.max_before, stale.read_version),
        (5, 6, 0)
    );
}
