//! `lockctl` against a 3-master Redis Cluster: `list` finds the locks of
//! every master in one command, `show` names the holder and the waiters in
//! line, `--json` for scripts, and `force-release` raises the key's fence
//! so the evicted holder's next fenced write is refused.

use std::process::{Command, Output};
use std::time::Duration;

use lock_runtime::fence;
use test_support::topology::{Cluster, Topology};

mod common;

use common::text;

fn lockctl(cluster: &Cluster, args: &[&str], stdin: &str) -> Output {
    let seed = &cluster.seed_urls()[0];
    common::lockctl(&["--cluster", seed], args, stdin)
}

fn json(out: &Output) -> serde_json::Value {
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockctl_lists_every_master_shows_holders_and_fences_out_a_force_released_holder() {
    let cluster = Cluster::start(3);
    let a = cluster.builder().label("pod-a").build().await.unwrap();
    let b = cluster.builder().label("pod-b").build().await.unwrap();
    let keys: Vec<String> = (0..3).map(|node| cluster.key_on(node, "order")).collect();
    let ttl = Duration::from_secs(30);
    let held_0 = a.lock(&keys[0]).ttl(ttl).acquire().await.unwrap();
    // Minted on first use: asked for now, so the counter shows it below.
    held_0.fencing_token().await.unwrap();
    let _held_1 = a.lock(&keys[1]).ttl(ttl).acquire().await.unwrap();
    let _read_2 = b.rw_lock(&keys[2]).read().ttl(ttl).acquire().await.unwrap();
    let waiter = {
        let (b, key) = (b.clone(), keys[0].clone());
        tokio::spawn(async move { b.lock(key).wait(Duration::from_secs(20)).acquire().await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;

    // One command, every master.
    let rows = json(&lockctl(&cluster, &["--json", "list"], ""));
    let rows = rows.as_array().unwrap();
    let listed: Vec<(&str, &str, &str)> = rows
        .iter()
        .map(|r| {
            (
                r["key"].as_str().unwrap(),
                r["kind"].as_str().unwrap(),
                r["holder"].as_str().unwrap(),
            )
        })
        .collect();
    let mut expected = vec![
        (keys[0].as_str(), "mutex", "pod-a"),
        (keys[1].as_str(), "mutex", "pod-a"),
        (keys[2].as_str(), "rw_lock", "pod-b"),
    ];
    expected.sort();
    assert_eq!(listed, expected, "{rows:?}");
    let table = text(&lockctl(&cluster, &["list"], "").stdout);
    assert!(table.starts_with("KEY"), "{table}");
    assert!(keys.iter().all(|k| table.contains(k.as_str())), "{table}");

    // `show`: holder, since, lease, counter, the queue by label.
    let out = lockctl(&cluster, &["show", &keys[0]], "");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    for line in [
        "HOLDER           pod-a",
        "WAITING          1 (pod-b)",
        "SINCE",
        "LEASE LEFT",
    ] {
        assert!(shown.contains(line), "{line}: {shown}");
    }
    let state = json(&lockctl(&cluster, &["--json", "show", &keys[0]], ""));
    assert_eq!(state["holder"], "pod-a");
    assert_eq!(state["waiting"], serde_json::json!(["pod-b"]));
    assert!(state["remaining_ms"].as_u64().unwrap() > 20_000, "{state}");
    assert!(state["since_ms"].as_u64().is_some(), "{state}");
    assert!(state["fencing_counter"].as_u64().unwrap() >= held_0.fencing_token().await.unwrap());

    // The holder writes fenced; an operator force-releases; its next fenced
    // write is refused, though nobody else wrote in between.
    let redis = redis::cluster::ClusterClient::new(cluster.seed_urls()).unwrap();
    let conn = redis.get_async_connection().await.unwrap();
    let resource = keys[0].as_str();
    let token = held_0.fencing_token().await.unwrap();
    let write = |token: u64| {
        let mut conn = conn.clone();
        async move {
            fence::redis(&mut conn, resource, token)
                .cmd(redis::cmd("HSET").arg(resource).arg("status").arg("paid"))
                .run()
                .await
        }
    };
    write(token).await.expect("the holder's write");
    // Declined at the prompt: nothing happens.
    let out = lockctl(&cluster, &["force-release", resource], "n\n");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(a.inspect(resource).await.unwrap().held);
    let out = lockctl(&cluster, &["force-release", "--yes", resource], "");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("force-released"),
        "{}",
        text(&out.stderr)
    );
    let err = write(token).await.unwrap_err();
    assert!(err.is_stale(), "the evicted holder wrote: {err:?}");
    tokio::time::timeout(Duration::from_secs(15), held_0.lost())
        .await
        .expect("the holder learns at its next renewal");
    // The waiter is told at once and gets a token above the evicted one.
    let next = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter is handed the lock")
        .unwrap()
        .unwrap();
    assert!(next.fencing_token().await.unwrap() > token);
    write(next.fencing_token().await.unwrap())
        .await
        .expect("the new holder writes");

    // Nothing to release, an unknown server: one line, exit 1.
    let out = lockctl(&cluster, &["force-release", "--yes", "order:free"], "");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("not held"),
        "{}",
        text(&out.stderr)
    );
    let port = test_support::free_port();
    let out = Command::new(env!("CARGO_BIN_EXE_lockctl"))
        .args(["--cluster", &format!("redis://127.0.0.1:{port}"), "list"])
        .env_remove("REDIS_URL")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr).trim_end().lines().count(),
        1,
        "{}",
        text(&out.stderr)
    );
}
