//! The least-privilege ACL (`test_support::ACL_LOCKER`, docs/keys.md's
//! list) covers every command the client sends, whatever the server: a
//! proxy records each command name on the wire, so a command this Redis
//! does not know (`CLIENT SETINFO`, which redis-rs sends on connect unless
//! told not to, and which Valkey 8 refused 18 times in the project's ACL
//! test) fails the test here too.

use std::time::Duration;

use lock_runtime::LockClient;
use test_support::{CommandProxy, RedisServer, acl_locker};

/// The commands the ACL allows (`+evalsha`, `+script|load`, ...), and
/// `auth`, which every user may send.
fn documented() -> Vec<String> {
    acl_locker()
        .into_iter()
        .filter_map(|rule| rule.strip_prefix('+'))
        .map(str::to_owned)
        .chain(["auth".to_owned()])
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_sends_nothing_outside_the_documented_acl() {
    let server = RedisServer::start();
    assert_eq!(server.cli(&acl_locker()), "OK");
    let proxy = CommandProxy::start(server.port);
    let url = format!("redis://locker:locker-pw@127.0.0.1:{}", proxy.port);
    let build = |label: &'static str| {
        LockClient::builder()
            .redis(url.clone())
            .label(label)
            .build()
    };
    let (a, b) = (build("pod-a").await.unwrap(), build("pod-b").await.unwrap());

    // A mutex handed over through a notice, renewed, released.
    let held = a
        .lock("k")
        .ttl(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap();
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.lock("k").wait(Duration::from_secs(5)).acquire().await })
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!held.is_lost(), "renewal as the ACL user failed");
    held.release().await.unwrap();
    waiter.await.unwrap().unwrap().release().await.unwrap();
    // A read-write lock, a semaphore, several keys at once.
    let reader = a.rw_lock("rw").read().acquire().await.unwrap();
    reader.release().await.unwrap();
    let permit = b.semaphore("s", 2).acquire().await.unwrap();
    permit.release().await.unwrap();
    let all = a.lock_all(["x", "y"]).acquire().await.unwrap();
    all.release().await.unwrap();
    // A fencing token minted; an idempotency record claimed and completed.
    let fenced = a.lock("f").acquire().await.unwrap();
    fenced.fencing_token().await.unwrap();
    fenced.release().await.unwrap();
    match b.record("r").claim().await.unwrap() {
        lock_runtime::Claimed::Run(guard) => guard.complete(b"done").await.unwrap(),
        other => panic!("{other:?}"),
    }
    // A leader election, observed (its record read) and resigned. Its read
    // was a MULTI before, refused by the ACL (and redis-rs 1.8 panicked).
    let leading = a.leader("l").campaign().await.unwrap();
    let mut observed = b.leader("l").observe().await.unwrap();
    let seen = observed.borrow().as_ref().map(|leader| leader.term);
    assert_eq!(seen, Some(leading.term()), "the observer reads the leader");
    leading.resign().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), observed.wait_for(Option::is_none))
        .await
        .expect("the observer sees the resignation")
        .unwrap();

    let sent = proxy.commands();
    assert!(sent.iter().any(|c| c == "evalsha"), "{sent:?}");
    let allowed = documented();
    let outside: Vec<&String> = sent.iter().filter(|c| !allowed.contains(c)).collect();
    assert!(
        outside.is_empty(),
        "sent outside the documented ACL: {outside:?} (all: {sent:?})"
    );
    // And the server refused nothing.
    assert_eq!(server.cli(&["ACL", "LOG"]), "", "ACL LOG");
}

/// A user refused `EVALSHA` is refused at `build()`, saying what to grant:
/// it could take a free lock with a plain `SET`, but every renewal (a
/// script) would fail and the lock be lost a lease later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_refused_the_scripts_is_told_at_build() {
    let server = RedisServer::start();
    let rules: Vec<&str> = acl_locker()
        .into_iter()
        .filter(|rule| *rule != "+evalsha")
        .collect();
    assert_eq!(server.cli(&rules), "OK");
    let url = format!("redis://locker:locker-pw@127.0.0.1:{}", server.port);
    let built = LockClient::builder().redis(url).build().await;
    let err = built.expect_err("a user without EVALSHA is refused");
    let said = err.to_string();
    assert!(
        said.contains("EVALSHA") && said.contains("keys.md"),
        "{said}"
    );
}
