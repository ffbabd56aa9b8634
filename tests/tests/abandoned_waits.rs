//! A wait abandoned while the server cannot be reached still leaves the
//! key's line once the server is back: the background release that takes
//! its entry out is sent again, so later releases are not handed to an entry
//! nobody waits on (each such hand-over would keep the key for a hand-over
//! lease; after a failover stall the fault suite saw waits of 27-41 s).

use std::time::Instant;

use lock_runtime::LockClient;
use test_support::RedisServer;
use test_support::helpers::{ms, secs, short_timeout_client};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_wait_leaves_the_line_once_the_server_is_back() {
    // Every write on disk before it is answered: the restarted server has
    // the queue entry back, as a failed-over replica would.
    let mut server = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let holder = LockClient::builder()
        .redis(server.url())
        .build()
        .await
        .unwrap();
    let waiters = short_timeout_client(LockClient::builder().redis(server.url())).await;
    for (i, shared) in [false, true].into_iter().enumerate() {
        let key = format!("k{i}");
        let (request, queue) = if shared {
            (holder.semaphore(&key, 1), format!("lock:O{{{key}}}"))
        } else {
            (holder.lock(&key), format!("lock:Q{{{key}}}"))
        };
        let held = request.ttl(secs(30)).acquire().await.unwrap();
        let waiter = {
            let (waiters, key) = (waiters.clone(), key.clone());
            tokio::spawn(async move {
                let request = if shared {
                    waiters.semaphore(&key, 1)
                } else {
                    waiters.lock(&key)
                };
                request.wait(secs(60)).acquire().await
            })
        };
        tokio::time::sleep(ms(300)).await;
        assert_eq!(server.cli(&["LLEN", &queue]), "1", "the waiter queued");
        server.kill();
        waiter.abort();
        let _ = waiter.await;
        // The release that takes the entry out fails while the server is down.
        tokio::time::sleep(ms(1500)).await;
        server.restart().unwrap();
        // The entry is back (the AOF has it), unless the re-sent release,
        // which reconnects as soon as the server listens, took it out
        // already: either way it is gone within a few seconds, and without
        // the re-send it would stay (asserting that it is back raced the
        // re-send: a CI run saw "0" here).
        let back = Instant::now();
        while server.cli(&["LLEN", &queue]) != "0" {
            assert!(
                back.elapsed() < secs(10),
                "the abandoned entry is still queued {:?} after the server came back",
                back.elapsed()
            );
            tokio::time::sleep(ms(50)).await;
        }
        // The next release frees the key (nobody to hand it to).
        held.release().await.unwrap();
        let next = if shared {
            waiters.semaphore(&key, 1)
        } else {
            waiters.lock(&key)
        };
        next.acquire().await.unwrap().release().await.unwrap();
    }
}
