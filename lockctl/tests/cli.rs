//! `lockctl` against a real `redis-server`: inspect, list, force-release,
//! and one-line errors with a non-zero exit for bad input.

use std::process::Output;
use std::time::Duration;

use lock_runtime::LockClient;
use test_support::RedisServer;

mod common;

use common::text;

fn lockctl(url: &str, args: &[&str], stdin: &str) -> Output {
    common::lockctl(&["--redis", url], args, stdin)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_list_and_force_release_a_held_lock() {
    let server = RedisServer::start();
    let url = server.url();
    let client = LockClient::builder().redis(&url).build().await.unwrap();
    let guard = client
        .lock("order:42")
        .ttl(Duration::from_secs(3))
        .acquire()
        .await
        .unwrap();
    let _other = client.lock("job:nightly").acquire().await.unwrap();
    // Keys as wide as they show, not as long as their bytes.
    let _wide = client.lock("ключ {tag} 🔒").acquire().await.unwrap();
    // Minted on first use: asked for before the counter is read.
    let token = guard.fencing_token().await.unwrap();

    // The options before or after the command.
    let out = common::lockctl(&[], &["inspect", "order:42", "--json", "--redis", &url], "");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = lockctl(&url, &["--json", "inspect", "order:42"], "");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let state: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(state["key"], "order:42");
    assert_eq!(state["held"], true);
    assert!(state["remaining_ms"].as_u64().unwrap() > 2_000, "{state}");
    assert!(state["fencing_counter"].as_u64().unwrap() >= token);

    let out = lockctl(&url, &["inspect", "order:7"], "");
    assert!(out.status.success());
    assert!(text(&out.stdout).contains("order:7") && text(&out.stdout).contains("no"));

    let out = lockctl(&url, &["list"], "");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listed = text(&out.stdout);
    assert!(listed.starts_with("KEY"), "{listed}");
    assert!(
        listed.contains("order:42") && listed.contains("job:nightly"),
        "{listed}"
    );
    // Every row's second column (the kind) starts in the same terminal
    // column, however wide the key before it shows.
    let kind_at = |line: &str| {
        let (key, _) = line.split_once("  ").unwrap();
        key.chars()
            .map(|c| if c == '🔒' { 2 } else { 1 })
            .sum::<usize>()
            + line[key.len()..].len()
            - line[key.len()..].trim_start().len()
    };
    let columns: Vec<usize> = listed.lines().map(kind_at).collect();
    assert!(
        columns.windows(2).all(|w| w[0] == w[1]),
        "{columns:?}\n{listed}"
    );
    let out = lockctl(&url, &["--json", "list", "--prefix", "order:"], "");
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows.as_array().unwrap().len(), 1, "{rows}");

    // Declined at the prompt: nothing happens.
    let out = lockctl(&url, &["force-release", "order:42"], "n\n");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(client.inspect("order:42").await.unwrap().held);
    // Confirmed: released, the operator named, the holder told.
    let out = lockctl(&url, &["force-release", "order:42"], "y\n");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("force-released `order:42`"),
        "{}",
        text(&out.stderr)
    );
    assert!(!client.inspect("order:42").await.unwrap().held);
    tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("the holder learns at its next renewal");
    // --yes does not ask; a key nobody holds is a clear refusal.
    let out = lockctl(&url, &["force-release", "--yes", "order:42"], "");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("not held"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn bad_input_is_one_line_and_a_non_zero_exit() {
    let port = test_support::free_port();
    for (url, args, says) in [
        (
            format!("redis://127.0.0.1:{port}"),
            vec!["inspect", "k"],
            "connect",
        ),
        ("not a url".to_owned(), vec!["inspect", "k"], "invalid"),
        ("redis://127.0.0.1:1".to_owned(), vec!["list"], "connect"),
    ] {
        let out = lockctl(&url, &args, "");
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{url}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{url}: {err}");
        assert!(err.to_lowercase().contains(says), "{url}: {err}");
        // A cause the driver already printed is not printed again.
        assert!(
            err.matches("os error").count() <= 1,
            "{url}: said twice: {err}"
        );
    }
    let server = RedisServer::start();
    // A listing of no locks would say "no locks held" whatever is held.
    let out = lockctl(&server.url(), &["list", "--limit", "0"], "");
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--limit"),
        "{}",
        text(&out.stderr)
    );
    let out = lockctl(&server.url(), &["inspect", ""], "");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("invalid lock key"),
        "{}",
        text(&out.stderr)
    );
}

/// `--help` names the variable `--redis` falls back to, never its value: a
/// `REDIS_URL` with a password must not reach a terminal or a CI log.
#[test]
fn help_never_shows_the_redis_url_it_would_use() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_lockctl"))
        .arg("--help")
        .env("REDIS_URL", "redis://ops:s3cret-pw@127.0.0.1:6379")
        .output()
        .expect("lockctl runs");
    let help = text(&out.stdout);
    assert!(out.status.success(), "{help}");
    assert!(help.contains("REDIS_URL"), "{help}");
    assert!(
        !help.contains("s3cret-pw"),
        "the password in --help: {help}"
    );
}

/// An empty listing says where it looked on stderr (the table or JSON on
/// stdout stays as it is), and that a prefix without its `:` may be the
/// wrong one: `--key-prefix lock` listed nothing, silently, with exit 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_listing_says_where_it_looked() {
    let server = RedisServer::start();
    let client = lock_runtime::LockClient::builder()
        .redis(server.url())
        .build()
        .await
        .unwrap();
    let _held = client.lock("order:1").acquire().await.unwrap();
    let out = lockctl(&server.url(), &["--key-prefix", "lock", "list"], "");
    assert_eq!(out.status.code(), Some(0));
    let err = text(&out.stderr);
    assert!(err.contains("\"lock\"") && err.contains("':'"), "{err}");
    let out = lockctl(
        &server.url(),
        &["--key-prefix", "lock", "--json", "list"],
        "",
    );
    assert_eq!(text(&out.stdout).trim(), "[]");
    let out = lockctl(&server.url(), &["list"], "");
    assert!(
        text(&out.stdout).contains("order:1"),
        "{}",
        text(&out.stdout)
    );
    assert!(text(&out.stderr).is_empty(), "{}", text(&out.stderr));
}

/// A server with a private CA that asks for client certificates (mutual
/// TLS): `--tls-ca`, `--tls-cert` and `--tls-key` reach it; without the
/// certificate, one line says what is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_with_a_private_ca() {
    if !test_support::tls_available("mutual_tls_with_a_private_ca") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let files = test_support::self_signed_cert(dir.path()).unwrap();
    let (cert, key) = test_support::client_cert(dir.path(), "ops").unwrap();
    let server = RedisServer::try_start_tls(&files, &["--tls-auth-clients", "yes"]).unwrap();
    let url = server.url();
    let client = LockClient::builder()
        .redis(&url)
        .tls_root_certificates(std::fs::read(&files.ca).unwrap())
        .tls_client_certificate(std::fs::read(&cert).unwrap(), std::fs::read(&key).unwrap())
        .build()
        .await
        .unwrap();
    let _held = client.lock("order:7").acquire().await.unwrap();
    let (ca, cert, key) = (
        files.ca.to_str().unwrap(),
        cert.to_str().unwrap(),
        key.to_str().unwrap(),
    );

    let target = [
        "--redis",
        &url,
        "--tls-ca",
        ca,
        "--tls-cert",
        cert,
        "--tls-key",
        key,
    ];
    let out = common::lockctl(&target, &["--json", "show", "order:7"], "");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let state: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(state["held"], true, "{state}");

    let out = common::lockctl(&["--redis", &url, "--tls-ca", ca], &["show", "order:7"], "");
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--tls-cert and --tls-key"), "{stderr}");
    // A certificate without its key is refused before connecting.
    let out = common::lockctl(
        &["--redis", &url, "--tls-cert", cert],
        &["show", "order:7"],
        "",
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--tls-key"),
        "{}",
        text(&out.stderr)
    );
}

/// The answer at the prompt is for the holder it showed: a key that changed
/// hands while the operator read it is not released (the new holder keeps
/// it), and the tool says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_that_changed_hands_at_the_prompt_is_not_released() {
    use std::io::{Read, Write};

    let server = RedisServer::start();
    let url = server.url();
    let builder = LockClient::builder().redis(&url);
    let pod_a = builder.clone().label("pod-a").build().await.unwrap();
    let pod_b = builder.label("pod-b").build().await.unwrap();
    let first = pod_a.lock("order:5").acquire().await.unwrap();

    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_lockctl"))
        .args(["--redis", &url, "force-release", "order:5"])
        .env_remove("REDIS_URL")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Waits for the prompt, which names pod-a.
    let mut stderr = child.stderr.take().unwrap();
    let mut prompt = Vec::new();
    let mut byte = [0u8; 1];
    while !prompt.ends_with(b"[y/N] ") {
        assert_eq!(stderr.read(&mut byte).unwrap(), 1, "{}", text(&prompt));
        prompt.push(byte[0]);
    }
    assert!(text(&prompt).contains("pod-a"), "{}", text(&prompt));
    // Meanwhile pod-a is done and pod-b takes the key.
    first.release().await.unwrap();
    let second = pod_b.lock("order:5").acquire().await.unwrap();
    child.stdin.take().unwrap().write_all(b"y\n").unwrap();
    let out = child.wait_with_output().unwrap();
    let mut said = String::new();
    stderr.read_to_string(&mut said).unwrap();
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("changed hands") && said.contains("pod-b"),
        "{said}"
    );
    let state = pod_b.inspect("order:5").await.unwrap();
    assert_eq!(state.holder.as_deref(), Some("pod-b"), "{state:?}");
    assert!(!second.is_lost());
    second.release().await.unwrap();
}
