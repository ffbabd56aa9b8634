//! `lockctl leaders` against a real `redis-server`: the elected leaders as
//! a table and as JSON, filtered by prefix.

use std::process::Output;

use lock_runtime::LockClient;
use test_support::RedisServer;

mod common;

use common::text;

fn lockctl(url: &str, args: &[&str]) -> Output {
    common::lockctl(&["--redis", url], args, "")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaders_lists_each_elected_leader_with_its_label_and_term() {
    let server = RedisServer::start();
    let url = server.url();
    let client = LockClient::builder().redis(&url).build().await.unwrap();
    let sweeper = client
        .leader("order-sweeper")
        .label("pod-a")
        .campaign()
        .await
        .unwrap();
    let relay = client
        .leader("outbox-relay")
        .label("pod-b")
        .campaign()
        .await
        .unwrap();
    // A lock of the same name is no leader.
    let _lock = client.lock("job:nightly").acquire().await.unwrap();

    let out = lockctl(&url, &["leaders"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    let lines: Vec<_> = table.lines().collect();
    assert!(lines[0].starts_with("NAME"), "{table}");
    assert_eq!(lines.len(), 3, "{table}");
    assert!(lines[1].starts_with("order-sweeper") && lines[1].contains("pod-a"));
    assert!(lines[1].ends_with(&sweeper.term().to_string()), "{table}");
    assert!(lines[2].starts_with("outbox-relay") && lines[2].contains("pod-b"));

    let out = lockctl(&url, &["--json", "leaders", "--prefix", "outbox"]);
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        rows,
        serde_json::json!([{ "name": "outbox-relay", "label": "pod-b", "term": relay.term() }])
    );

    relay.resign().await.unwrap();
    let out = lockctl(&url, &["--json", "leaders"]);
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows.as_array().unwrap().len(), 1, "{rows}");
    sweeper.resign().await.unwrap();
}
