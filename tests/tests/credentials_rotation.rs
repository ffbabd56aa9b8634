//! A password rotation that fails for a while: a client whose connections
//! were dropped while its password was refused says so on every request
//! while it lasts, logs in again by itself once its credentials work again
//! (redis-rs's `ConnectionManager` keeps a failed login and answers it
//! forever), and its waiters are woken by release notices again after the
//! recovery.

use lock_runtime::{LockClient, LockError};
use test_support::helpers::*;
use test_support::{RedisServer, acl_locker, error_chain};

/// The ACL user's password changed on the server (the client still has
/// `locker-pw`), and set back.
const ROTATED: &[&str] = &["ACL", "SETUSER", "locker", "resetpass", ">rotated-pw"];
const RESTORED: &[&str] = &["ACL", "SETUSER", "locker", "resetpass", ">locker-pw"];

/// A client of `server` logged in as the least-privilege ACL user.
async fn locker_client(server: &RedisServer) -> LockClient {
    assert_eq!(server.cli(&acl_locker()), "OK");
    LockClient::builder()
        .redis(format!(
            "redis://locker:locker-pw@127.0.0.1:{}",
            server.port
        ))
        .build()
        .await
        .expect("a client of the ACL user")
}

fn is_failed_login(e: &LockError) -> bool {
    error_chain(e)
        .to_lowercase()
        .contains("authentication failed")
}

/// Tries `key` until an attempt fails to log in (the first after the kill
/// may see its connection dropped instead); returns that error.
async fn refused_login(client: &LockClient, key: &str) -> String {
    within(secs(10), "an acquire fails to log in", async {
        loop {
            match client.lock(key).acquire().await {
                Ok(_) => panic!("acquired {key} while the password was refused"),
                Err(e) if is_failed_login(&e) => return error_chain(&e),
                Err(e) => assert!(
                    e.is_connection(),
                    "neither a failed login nor a dropped connection: {}",
                    error_chain(&e)
                ),
            }
            tokio::time::sleep(ms(50)).await;
        }
    })
    .await
}

/// Waits until the ACL user's pub/sub connection is subscribed to a channel.
async fn locker_subscribed(server: &RedisServer) {
    within(secs(10), "the notice connection subscribes", async {
        loop {
            let clients = server.cli(&["CLIENT", "LIST", "TYPE", "pubsub"]);
            let subscribed = clients.lines().any(|line| {
                let fields: Vec<&str> = line.split(' ').collect();
                fields.contains(&"user=locker")
                    && fields.iter().any(|f| {
                        f.strip_prefix("sub=")
                            .and_then(|n| n.parse::<u32>().ok())
                            .is_some_and(|n| n > 0)
                    })
            });
            if subscribed {
                return;
            }
            tokio::time::sleep(ms(20)).await;
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_refused_its_login_for_a_while_logs_in_again_once_its_password_works() {
    let server = RedisServer::start();
    let client = locker_client(&server).await;
    lock_and_release(&client, "k").await;

    assert_eq!(server.cli(ROTATED), "OK");
    server.cli(&["CLIENT", "KILL", "TYPE", "normal"]);
    let refused = refused_login(&client, "k").await;
    println!("while the password was refused: {refused}");
    // Said on every request while it lasts (each one tries to log in again).
    for _ in 0..3 {
        let e = client
            .lock("k")
            .acquire()
            .await
            .expect_err("acquired while the password was refused");
        assert!(is_failed_login(&e), "{}", error_chain(&e));
    }

    assert_eq!(server.cli(RESTORED), "OK");
    // The next request logs in with the password that works again.
    let guard = client
        .lock("k")
        .acquire()
        .await
        .unwrap_or_else(|e| panic!("still refused once restored: {}", error_chain(&e)));
    guard.release().await.unwrap();
    // And the client goes on working, script and plain paths alike.
    lock_and_release(&client, "k").await;
    let permit = client.semaphore("s", 2).acquire().await.unwrap();
    permit.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_by_the_release_notice_after_its_connections_logged_in_again() {
    let server = RedisServer::start();
    let waiting = locker_client(&server).await;
    // The holder logs in as the default user, whose password does not change.
    let holder = default_redis_client(&server).await;
    let held = holder.lock("k").ttl(secs(30)).acquire().await.unwrap();
    let waiter = {
        let waiting = waiting.clone();
        tokio::spawn(async move { waiting.lock("k").wait(secs(25)).acquire().await })
    };
    locker_subscribed(&server).await;

    assert_eq!(server.cli(ROTATED), "OK");
    // Both of the waiting client's connections: commands and notices.
    server.cli(&["CLIENT", "KILL", "USER", "locker"]);
    refused_login(&waiting, "other").await;

    assert_eq!(server.cli(RESTORED), "OK");
    // The notice connection logs in again and subscribes what is waited on,
    // waking the waiter, which finds the key still held and waits again.
    locker_subscribed(&server).await;
    let released = std::time::Instant::now();
    held.release().await.unwrap();
    let guard = within(secs(5), "the waiter wakes", waiter)
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("the waiter gave up: {}", error_chain(&e)));
    let woke = released.elapsed();
    println!("the waiter held the key {woke:?} after its release");
    // The holder's lease had 30 s left: a notice woke it.
    assert!(woke < secs(2), "woken only after {woke:?}");
    guard.release().await.unwrap();
}
