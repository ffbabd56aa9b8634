//! `lockctl` as an operator meets it on a real deployment: locks on a
//! Redlock of three masters, and labels written by any client with access
//! to the keys.

use std::time::Duration;

use lock_runtime::LockClient;
use test_support::RedisServer;
use test_support::topology::Redlock;

mod common;

use common::text;

/// `--redlock` names every master: `show` sees the majority's holder, and
/// `force-release` releases the lock on every master, so another client
/// takes it and the evicted holder learns it lost it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_on_a_redlock_frees_the_lock_on_its_masters() {
    let redlock = Redlock::start(3);
    let urls = redlock.urls();
    let client = || LockClient::builder().redlock(urls.iter().cloned()).build();
    let holder_client = client().await.unwrap();
    let holder = holder_client
        .lock("rl")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let target: Vec<&str> = urls
        .iter()
        .flat_map(|u| ["--redlock", u.as_str()])
        .collect();

    let out = common::lockctl(&target, &["--json", "show", "rl"], "");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let state: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(state["held"], true, "{state}");

    let out = common::lockctl(&target, &["force-release", "rl", "--yes"], "");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let other = client().await.unwrap();
    let taken = other.lock("rl").acquire().await;
    assert!(taken.is_ok(), "after the force-release: {taken:?}");
    tokio::time::timeout(Duration::from_secs(15), holder.lost())
        .await
        .expect("the evicted holder learns it lost the lock");

    // Both a server and a Redlock: one or the other.
    let mut both = target.clone();
    both.extend(["--cluster", urls[0].as_str()]);
    let out = common::lockctl(&both, &["show", "rl"], "");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
}

/// A label is any text a client wrote: control characters in it (a
/// carriage return, escape sequences that erase the line or set the
/// window's title) are written out, never sent to the terminal, in the
/// table and in the force-release prompt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_characters_in_a_label_never_reach_the_terminal() {
    let server = RedisServer::start();
    let url = server.url();
    let label = "evil-pod\r\x1b[2Kpod-a\x1b]0;pwned\x07";
    let client = LockClient::builder()
        .redis(&url)
        .label("pod-b")
        .build()
        .await
        .unwrap();
    let _held = client.lock("order:9").acquire().await.unwrap();
    // The builder refuses such a label: it is written by hand, as any
    // client with access to the keys could.
    let mut conn = connection(&url).await;
    let names: Vec<String> = redis::cmd("KEYS")
        .arg("lock:C{*")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(names.len(), 1, "{names:?}");
    let _: () = redis::cmd("SET")
        .arg(&names[0])
        .arg(label)
        .query_async(&mut conn)
        .await
        .unwrap();
    for args in [
        &["show", "order:9"][..],
        &["list"],
        &["force-release", "order:9"],
    ] {
        let out = common::lockctl(&["--redis", &url], args, "n\n");
        let shown = text(&out.stdout) + &text(&out.stderr);
        assert!(
            !shown.contains(['\r', '\x1b', '\x07']),
            "{args:?} sent a control character: {shown:?}"
        );
        assert!(shown.contains("\\u{1b}"), "{args:?}: {shown:?}");
    }
}

async fn connection(url: &str) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(url).unwrap();
    client.get_multiplexed_async_connection().await.unwrap()
}
