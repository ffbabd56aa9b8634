//! The README's leader-election program, run: `tests/src/bin/readme_leader.rs`
//! is the README's block word for word (the first test fails when the two
//! drift apart), and the second runs it against a redis-server of its own,
//! as a user would with `REDIS_URL`, and looks at what it wrote.

use test_support::RedisServer;

const README: &str = include_str!("../../README.md");
const LEADER: &str = include_str!("../src/bin/readme_leader.rs");

#[test]
fn the_readme_shows_the_leader_program_word_for_word() {
    assert!(
        README.contains(&format!("```rust,no_run\n{LEADER}```\n")),
        "README.md's leader-election block and tests/src/bin/readme_leader.rs differ"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_leader_program_is_elected_and_its_fenced_write_lands() {
    let server = RedisServer::start();
    for run in 1..=2 {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_readme_leader"))
            .env("REDIS_URL", server.url())
            .output()
            .await
            .expect("start the README's program");
        assert!(
            out.status.success(),
            "run {run}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let status: Option<String> = redis::cmd("HGET")
        .arg("{orders}:42")
        .arg("status")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(status.as_deref(), Some("cancelled"));
    // The second leader's term fenced the resource: above the first's.
    let highest: u64 = redis::cmd("GET")
        .arg(lock_runtime::fence::record_key("{orders}:sweeper"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(highest >= 2, "the fence record holds term {highest}");
}
