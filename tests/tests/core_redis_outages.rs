//! The runtime core against a real `redis-server` that hangs, is killed,
//! paused or restarted, and client processes that die: what holders and
//! waiters are told, and that no lock is left behind. (The rest of what only
//! Redis has is in `core_redis.rs`.)

use std::time::{Duration, Instant};

use lock_runtime::LockClient;
use test_support::RedisServer;

use test_support::helpers::*;
use tests::core_support::warnings_for;

mod core_redis_common;
use core_redis_common::{client, handoff, lost_after, two_clients};

#[tokio::test(flavor = "current_thread")]
async fn dropping_a_guard_never_blocks_even_when_the_server_hangs() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let guard = client.lock("k").ttl(ms(500)).acquire().await.unwrap();
    server.pause().unwrap();
    let started = Instant::now();
    drop(guard);
    let took = started.elapsed();
    server.resume().unwrap();
    assert!(took < ms(20), "drop took {took:?} on a paused server");
    // The background release still happens once the server answers.
    let next = client.lock("k").wait(secs(2)).acquire().await.unwrap();
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forgotten_renewing_guard_is_renewed_until_its_process_dies_then_the_key_frees_within_its_ttl()
 {
    let server = RedisServer::start();
    let observer = client(&server).await;
    // Another "process": its own runtime and client. It leaks a renewing guard,
    // drops every handle on the client, lives on for a while, then dies.
    let url = server.url();
    let (locked_tx, locked_rx) = tokio::sync::oneshot::channel();
    let process = std::thread::spawn(move || {
        let runtime = one_worker_runtime();
        runtime.block_on(async move {
            let client = redis_url_client(url).await.unwrap();
            let clone = client.clone();
            let guard = client.lock("leaked").ttl(ms(300)).acquire().await.unwrap();
            std::mem::forget(guard);
            drop((client, clone));
            let _ = locked_tx.send(());
            tokio::time::sleep(ms(800)).await;
        });
        runtime.shutdown_background();
        Instant::now()
    });
    locked_rx.await.unwrap();
    // Documented: a leaked guard keeps its client, and its renewals, alive.
    tokio::time::sleep(ms(600)).await;
    assert!(
        is_held(&observer, "leaked").await,
        "the leaked lease was not renewed"
    );
    let died = tokio::task::spawn_blocking(move || process.join().unwrap())
        .await
        .unwrap();
    let guard = within(
        secs(4),
        "the leaked lease runs out",
        observer.lock("leaked").wait(secs(3)).acquire(),
    )
    .await
    .expect("free once its process is gone");
    let at = died.elapsed();
    println!("a leaked renewing 300 ms lease was free {at:?} after its process died");
    assert!(at < ms(1500), "free only after {at:?}");
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_makes_lost_resolve_within_about_the_ttl() {
    let mut server = RedisServer::start();
    let client = client(&server).await;
    let key = key("killed");
    let what = "lost() after the server died";
    let (guard, took) = lost_after(&mut server, &client, &key, ms(300), ms(150), what, |s| {
        s.kill()
    })
    .await;
    println!("lost() resolved {took:?} after redis-server was killed (ttl 300 ms)");
    // At most one lease after the last confirmed renewal.
    assert!(took < ms(1500), "lost after {took:?}");
    assert!(
        !warnings_for(&key).is_empty(),
        "no warning for the lost lock"
    );
    let err = guard.release().await.unwrap_err();
    assert!(err.is_backend() || err.is_lost(), "{err:?}");
    // With the server gone, acquiring is an error, not a hang or a panic.
    let started = Instant::now();
    let err = client.lock(&key).acquire().await.unwrap_err();
    assert!(err.is_backend(), "{err:?}");
    assert!(
        err.is_connection(),
        "a dead server is a connection error: {err:?}"
    );
    assert!(started.elapsed() < secs(3), "{:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_is_usable_again_by_old_and_new_clients() {
    let mut server = RedisServer::start();
    let old = client(&server).await;
    lock_and_release(&old, "k").await;
    // Subscribe the old client's notifier before the restart.
    let _ = handoff(&old, &old, "warm").await;
    server.restart().unwrap(); // no persistence: keys and scripts are gone
    let restarted = Instant::now();
    let guard = loop {
        match old.lock("k").acquire().await {
            Ok(guard) => break guard,
            Err(e) => {
                assert!(e.is_backend(), "{e:?}");
                assert!(restarted.elapsed() < secs(10), "still failing: {e}");
                tokio::time::sleep(ms(20)).await;
            }
        }
    };
    println!(
        "the old client locked again {:?} after the restart (fencing token {}: the counter did not survive, no persistence)",
        restarted.elapsed(),
        guard.fencing_token().await.unwrap()
    );
    guard.release().await.unwrap();
    let new = client(&server).await;
    let latency = handoff(&new, &old, "k").await;
    println!("after the restart, the old client's waiter woke {latency:?} after the release");
    assert!(latency < ms(500), "woke after {latency:?}");
    let latency = handoff(&old, &new, "k").await;
    assert!(latency < ms(500), "woke after {latency:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_server_makes_lost_resolve_within_about_the_ttl_and_the_stale_release_is_lost() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let guard = client.lock("paused").ttl(ms(300)).acquire().await.unwrap();
    // Asked while held: a token is minted only for a live lease.
    assert_eq!(guard.fencing_token().await.unwrap(), 1);
    let lost = guard.lost();
    tokio::time::sleep(ms(150)).await;
    let paused = Instant::now();
    server.pause().unwrap();
    within(secs(3), "lost() while the server is paused", lost).await;
    let took = paused.elapsed();
    // Let the lease run out on the server's clock too, then resume.
    tokio::time::sleep(ms(200)).await;
    server.resume().unwrap();
    println!("lost() resolved {took:?} after redis-server was paused (ttl 300 ms)");
    assert!(took < ms(1500), "lost after {took:?}");
    let err = guard.release().await.unwrap_err();
    assert!(err.is_lost(), "{err:?}");
    let next = client.lock("paused").wait(secs(2)).acquire().await.unwrap();
    assert!(next.fencing_token().await.unwrap() == 2);
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_that_timed_out_on_a_paused_server_leaves_no_lock_once_it_resumes() {
    let server = RedisServer::start();
    let observer = client(&server).await;
    let client = LockClient::builder()
        .redis(server.url())
        .response_timeout(ms(200))
        .build()
        .await
        .unwrap();
    server.pause().unwrap();
    let started = Instant::now();
    let err = client
        .lock("ghost")
        .ttl(secs(30))
        .acquire()
        .await
        .unwrap_err();
    println!(
        "acquire on a paused server: {err} after {:?}",
        started.elapsed()
    );
    assert!(err.is_backend(), "{err:?}");
    tokio::time::sleep(ms(300)).await;
    server.resume().unwrap();
    // The request sat in the server's socket buffer and ran on resume; the
    // clean-up release must follow it, or the key stays locked for 30 s.
    let started = Instant::now();
    let guard = observer.lock("ghost").wait(secs(3)).acquire().await;
    println!(
        "after resume the key was {} after {:?}",
        if guard.is_ok() { "free" } else { "still held" },
        started.elapsed()
    );
    guard
        .expect("no ghost lock is left behind")
        .release()
        .await
        .unwrap();
}

/// Takes a lock with a client of its own and returns only the guard: the
/// client (every clone of it) is gone when this returns.
async fn lock_with_a_temporary_client(
    url: &str,
    key: &str,
    ttl: Duration,
) -> lock_runtime::LockGuard {
    let client = redis_url_client(url).await.unwrap();
    client.lock(key).ttl(ttl).acquire().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_that_outlives_its_client_says_when_its_lease_is_gone() {
    let server = RedisServer::start();
    let observer = client(&server).await;
    let guard = lock_with_a_temporary_client(&server.url(), "orphan", ms(300)).await;
    let lost = guard.lost();
    // Either the lease is kept (the guard keeps what it needs alive) ...
    let taken =
        tokio::time::timeout(secs(5), observer.lock("orphan").wait(secs(2)).acquire()).await;
    match taken {
        Ok(Ok(next)) => {
            // ... or, once another holder has it, the guard must know.
            println!(
                "the orphaned guard's lease ran out; is_lost() = {}",
                guard.is_lost()
            );
            assert!(
                tokio::time::timeout(ms(100), lost).await.is_ok(),
                "another client holds the lock while the orphaned guard's lost() is pending"
            );
            let err = guard.release().await.unwrap_err();
            assert!(err.is_lost(), "{err:?}");
            next.release().await.unwrap();
        }
        Ok(Err(e)) => {
            assert!(e.is_busy(), "{e:?}");
            assert!(!guard.is_lost());
            guard.release().await.expect("the guard still owns it");
        }
        Err(_) => panic!("the probe hung"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_of_a_crashed_process_does_not_keep_a_live_waiter_from_the_lock() {
    let server = RedisServer::start();
    let (holder_client, live_client) = two_clients(&server).await;
    let holder = holder_client
        .lock("k")
        .ttl(secs(30))
        .acquire()
        .await
        .unwrap();
    // Another "process": its own runtime and client, with one waiter. The
    // runtime is then shut down without running any clean-up, like a crash.
    let url = server.url();
    std::thread::spawn(move || {
        let runtime = one_worker_runtime();
        runtime.block_on(async move {
            let client = redis_url_client(url).await.unwrap();
            tokio::spawn(async move {
                client
                    .lock("k")
                    .ttl(secs(30))
                    .wait(secs(60))
                    .acquire()
                    .await
            });
            tokio::time::sleep(ms(300)).await;
        });
        runtime.shutdown_background();
    })
    .join()
    .unwrap();
    // A live waiter arrives after it.
    let waiter = {
        let client = live_client.clone();
        tokio::spawn(async move {
            let guard = client.lock("k").ttl(secs(30)).wait(secs(8)).acquire().await;
            let at = Instant::now();
            guard.map(|_| at)
        })
    };
    tokio::time::sleep(ms(200)).await;
    let released = Instant::now();
    holder.release().await.unwrap();
    let outcome = within(secs(10), "the live waiter", waiter).await.unwrap();
    let took = outcome
        .as_ref()
        .map(|at| at.saturating_duration_since(released))
        .unwrap_or_else(|_| released.elapsed());
    println!(
        "with a crashed process's waiter queued first, the live waiter ended {took:?} after the release: {:?}",
        outcome.as_ref().map(|_| "got the lock")
    );
    assert!(outcome.is_ok(), "the live waiter gave up: {outcome:?}");
    assert!(
        took < secs(3),
        "the crashed waiter kept the lock for {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_that_loses_the_lock_tells_the_holder() {
    let mut server = RedisServer::start();
    let client = client(&server).await;
    let key = key("restart");
    // As after a failover to a replica that never saw the lock.
    let what = "the holder learns its lock is gone";
    let (guard, told) = lost_after(&mut server, &client, &key, ms(600), ms(100), what, |s| {
        s.restart().unwrap()
    })
    .await;
    println!("after a restart the holder knew its lock was gone {told:?} later");
    assert!(told < ms(1500), "the holder learned it only after {told:?}");
    assert!(guard.release().await.unwrap_err().is_lost());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_keeps_waiting_through_a_restart_and_gets_the_lock() {
    let mut server = RedisServer::start();
    let (holder_client, waiter_client) = two_clients(&server).await;
    let holder = holder_client
        .lock("k")
        .ttl(secs(10))
        .acquire()
        .await
        .unwrap();
    let waiter = tokio::spawn(async move {
        let guard = waiter_client
            .lock("k")
            .ttl(secs(10))
            .wait(secs(8))
            .acquire()
            .await;
        (Instant::now(), guard)
    });
    tokio::time::sleep(ms(200)).await;
    server.restart().unwrap(); // the holder's lock is gone with it
    let restarted = Instant::now();
    let (at, taken) = within(secs(9), "the waiter", waiter).await.unwrap();
    let taken = taken.expect("the waiter gets the lock after the restart");
    let took = at.saturating_duration_since(restarted);
    println!("after a restart the waiter held the lock {took:?} later");
    assert!(
        took < secs(3),
        "the waiter got the lock only after {took:?}"
    );
    taken.release().await.unwrap();
    drop(holder);
}
