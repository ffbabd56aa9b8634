//! The runtime core, bad input: keys and leases out of bounds are
//! errors on both backends, and the builder refuses what it cannot use without
//! panicking (plain tests at the end: no backend needed); the public types
//! cross tasks and threads. The two tests taking an [`Env`] run on both
//! backends (`memory::<name>` and `redis::<name>`, `tests::core_support`).
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::time::{Duration, Instant};

use lock_runtime::__private::testing::force_delete;
use lock_runtime::{
    LockClient, LockClientBuilder, LockError, LockInfo, MAX_KEY_LEN, MAX_TTL, MIN_TTL,
};

use test_support::helpers::*;
use tests::both_backends;
use tests::core_support::Env;

// Braces: rustfmt leaves the list (and its attributes) alone.
both_backends! {
    bad_keys_are_invalid_key_errors_everywhere,
    bad_leases_are_config_errors_and_the_limits_themselves_work,
}

async fn bad_keys_are_invalid_key_errors_everywhere(env: Env) {
    let client = &env.client;
    let bad = [
        String::new(),
        "k".repeat(MAX_KEY_LEN + 1),
        "é".repeat(MAX_KEY_LEN / 2 + 1), // 1026 bytes, 513 characters
        "a\nb".into(),
        "nul\0".into(),
        "tab\t".into(),
        "del\u{7f}".into(),
        "nel\u{85}".into(),
    ];
    for key in &bad {
        let shown = format!("{:?}", key.chars().take(12).collect::<String>());
        let err = client.lock(key.clone()).acquire().await.unwrap_err();
        assert!(err.is_invalid_key(), "{shown}: acquire gave {err:?}");
        assert!(!err.to_string().is_empty());
        let ran = AtomicBool::new(false);
        let err = client
            .with_lock(key.clone(), async { ran.store(true, SeqCst) })
            .await
            .unwrap_err();
        assert!(err.is_invalid_key(), "{shown}: with_lock gave {err:?}");
        assert!(!ran.load(SeqCst));
        let err = force_delete(client, key).await.unwrap_err();
        assert!(err.is_invalid_key(), "{shown}: force_delete gave {err:?}");
    }
    let err = client.lock("").acquire().await.unwrap_err();
    assert!(err.to_string().contains("empty"), "{err}");
    let err = client
        .lock("k".repeat(MAX_KEY_LEN + 1))
        .acquire()
        .await
        .unwrap_err();
    assert!(err.to_string().contains(&MAX_KEY_LEN.to_string()), "{err}");
    // The limits themselves, and unusual but valid keys, work.
    for key in [
        "k".repeat(MAX_KEY_LEN),
        "é".repeat(MAX_KEY_LEN / 2),
        "ünïcödé key with spaces".into(),
        "{tenant:7}:order:1".into(),
        "{}".into(),
        "}{".into(),
        "*?[]".into(),
    ] {
        let guard = client
            .lock(key.clone())
            .acquire()
            .await
            .unwrap_or_else(|e| panic!("{key}: {e}"));
        assert_eq!(guard.key(), key);
        assert!(is_held(&env.other().await, &key).await);
        guard.release().await.unwrap();
    }
}

async fn bad_leases_are_config_errors_and_the_limits_themselves_work(env: Env) {
    let client = &env.client;
    for ttl in [
        Duration::ZERO,
        Duration::from_nanos(1),
        MIN_TTL - Duration::from_millis(1),
        MAX_TTL + Duration::from_secs(1),
        Duration::MAX,
    ] {
        let err = client
            .lock(key("ttl"))
            .ttl(ttl)
            .acquire()
            .await
            .unwrap_err();
        assert!(err.is_config(), "ttl {ttl:?}: {err:?}");
        let err = client
            .lock(key("ttl"))
            .ttl(ttl)
            .run(async {})
            .await
            .unwrap_err();
        assert!(err.is_config(), "ttl {ttl:?}: {err:?}");
        let err = env.builder().default_ttl(ttl).build().await.unwrap_err();
        assert!(err.is_config(), "default_ttl {ttl:?}: {err:?}");
    }
    let err = client
        .lock(key("ttl"))
        .ttl(Duration::ZERO)
        .acquire()
        .await
        .unwrap_err();
    println!("[{:?}] zero ttl: {err}", env.kind);
    for ttl in [MIN_TTL, MAX_TTL] {
        let key = key("ttl-limit");
        let guard = client.lock(&key).ttl(ttl).acquire().await.unwrap();
        let left = remaining(&env.other().await, &key).await;
        assert!(
            left <= ttl && left >= ttl.saturating_sub(secs(2)),
            "{ttl:?}: {left:?}"
        );
        guard.release().await.unwrap();
    }
}

#[test]
fn the_public_types_can_cross_tasks_and_threads() {
    fn send_sync<T: Send + Sync + 'static>() {}
    fn send_static<T: Send + 'static>(_: &T) {}
    send_sync::<LockClient>();
    send_sync::<lock_runtime::LockRequest>();
    send_sync::<lock_runtime::LockGuard>();
    send_sync::<LockError>();
    send_sync::<LockInfo>();
    fn error<E: std::error::Error + Send + Sync + 'static>() {}
    error::<LockError>();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let client = LockClient::builder().memory().build().await.unwrap();
        let guard = client.lock("k").acquire().await.unwrap();
        send_static(&guard.lost());
        send_static(&client.lock("k").acquire());
        send_static(&client.lock("k").run(async {}));
        guard.release().await.unwrap();
    });
}

// ---- The builder: no backend needed ---------------------------------------

#[tokio::test]
async fn a_builder_without_a_backend_is_a_config_error() {
    let err = LockClient::builder().build().await.unwrap_err();
    assert!(err.is_config(), "{err:?}");
    assert!(
        err.to_string().contains("memory") && err.to_string().contains("redis"),
        "{err}"
    );
}

#[tokio::test]
async fn a_prefix_with_braces_or_control_characters_or_too_long_is_a_config_error() {
    for prefix in [
        "lock{".to_string(),
        "}lock".into(),
        "{x}:".into(),
        "a\nb".into(),
        "p".repeat(129),
    ] {
        let err = LockClient::builder()
            .memory()
            .key_prefix(prefix.clone())
            .build()
            .await
            .unwrap_err();
        assert!(err.is_config(), "prefix {prefix:?}: {err:?}");
    }
    for prefix in ["", "app:locks:", "p".repeat(128).as_str()] {
        let client = LockClient::builder()
            .memory()
            .key_prefix(prefix)
            .build()
            .await
            .unwrap();
        assert_eq!(client.key_prefix(), prefix);
        lock_and_release(&client, "k").await;
    }
}

#[tokio::test]
async fn malformed_urls_are_config_errors() {
    for url in [
        "",
        "not a url",
        "http://127.0.0.1:6379",
        "redis://127.0.0.1:notaport",
        "redis://127.0.0.1:99999",
        "redis://127.0.0.1:6379/notadb",
        "unix",
    ] {
        let started = Instant::now();
        let result = LockClient::builder().redis(url).build().await;
        match result {
            Err(e) => {
                assert!(e.is_config(), "{url:?}: {e:?}");
                assert!(
                    started.elapsed() < ms(500),
                    "{url:?}: a parse error took {:?}",
                    started.elapsed()
                );
            }
            Ok(_) => panic!("{url:?} was accepted"),
        }
    }
}

#[tokio::test]
async fn a_password_in_a_url_is_never_echoed_in_errors_or_debug_output() {
    let port = test_support::free_port();
    let url = format!("redis://user:s3cr3t-pw@127.0.0.1:{port}/notadb");
    let err = LockClient::builder().redis(&url).build().await.unwrap_err();
    assert!(!format!("{err} {err:?}").contains("s3cr3t-pw"), "{err:?}");
    let url = format!("redis://user:s3cr3t-pw@127.0.0.1:{port}");
    let builder = LockClient::builder().redis(&url);
    assert!(!format!("{builder:?}").contains("s3cr3t-pw"));
    let err = builder.connect_timeout(ms(500)).build().await.unwrap_err();
    assert!(!format!("{err} {err:?}").contains("s3cr3t-pw"), "{err:?}");
}

#[tokio::test]
async fn an_unreachable_server_at_build_is_a_backend_error() {
    // A port with nothing listening on it.
    let port = test_support::free_port();
    let started = Instant::now();
    let err = redis_url_client(format!("redis://127.0.0.1:{port}"))
        .await
        .unwrap_err();
    let took = started.elapsed();
    println!(
        "unreachable server: {} (after {took:?})",
        test_support::error_chain(&err)
    );
    assert!(err.is_backend(), "{err:?}");
    assert!(err.is_connection(), "{err:?}");
    assert!(
        !err.to_string().contains("refused"),
        "the source is not repeated: {err}"
    );
    assert!(took < secs(5), "took {took:?}");
    assert!(
        err.to_string().contains(&format!("127.0.0.1:{port}")),
        "the server is named: {err}"
    );
}

/// A URL pointing at something that is not Redis (here an HTTP server's
/// answer) says so, naming the server, rather than reporting a parse error
/// of the scripts' loading; a server that accepts and never answers is a
/// timeout naming it.
#[tokio::test]
async fn a_server_that_does_not_speak_redis_is_named_as_such() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let _ = conn.read(&mut buf).await;
                let answer = "HTTP/1.1 400 Bad Request\r\n\r\n<html></html>";
                let _ = conn.write_all(answer.as_bytes()).await;
            });
        }
    });
    let err = redis_url_client(format!("redis://{addr}"))
        .await
        .unwrap_err();
    let said = err.to_string();
    assert!(err.is_backend(), "{err:?}");
    assert!(
        said.contains(&addr.to_string()) && said.contains("did not answer as a Redis server"),
        "{}",
        test_support::error_chain(&err)
    );

    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap();
    tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((conn, _)) = silent.accept().await {
            open.push(conn);
        }
    });
    let err = LockClient::builder()
        .redis(format!("redis://{addr}"))
        .response_timeout(ms(300))
        .build()
        .await
        .unwrap_err();
    assert!(err.to_string().contains(&addr.to_string()), "{err}");
    assert!(err.is_connection(), "a timeout: {err:?}");
}

#[tokio::test]
async fn rediss_without_the_tls_feature_is_a_config_error() {
    // This package does not enable lock-runtime's `tls` feature. (If a workspace
    // build unifies it in, the URL is accepted and the TLS handshake with this
    // port fails instead: a Backend error. Never Ok, never a panic.)
    let server = test_support::RedisServer::start();
    let url = format!("rediss://127.0.0.1:{}", server.port);
    let err = LockClient::builder()
        .redis(url)
        .connect_timeout(secs(1))
        .build()
        .await
        .unwrap_err();
    println!("rediss:// without tls: {err}");
    match &err {
        // Names the feature to turn on (the driver's own text named none).
        LockError::Config(message) => {
            assert!(message.contains("`tls` feature"), "{message}")
        }
        LockError::Backend(_) => println!("(the tls feature is enabled in this build)"),
        other => panic!("unexpected {other:?}"),
    }
}

/// The driver reads `?db=`, `?user=` and `?pass=` on Unix socket URLs and
/// passes over them on TCP ones: a service given `redis://host/?db=3` would
/// lock in database 0, beside another that wrote `redis://host/3` and locks
/// in database 3, and the two would not exclude each other.
#[tokio::test]
async fn a_database_or_login_in_the_query_of_a_tcp_url_is_a_config_error() {
    let server = test_support::RedisServer::start();
    for query in ["?db=3", "?user=app&pass=secret", "?protocol=resp2&db=3"] {
        let url = format!("redis://127.0.0.1:{}/{query}", server.port);
        let err = LockClient::builder().redis(url).build().await.unwrap_err();
        let said = err.to_string();
        assert!(err.is_config(), "{query}: {err:?}");
        assert!(said.contains("redis://user:password@host:6379/3"), "{said}");
        assert!(!said.contains("secret"), "the password echoed: {said}");
    }
    // The path names the database.
    let url = format!("redis://127.0.0.1:{}/3", server.port);
    let client = LockClient::builder().redis(url).build().await.unwrap();
    let guard = client.lock("in-db-3").acquire().await.unwrap();
    assert_eq!(server.cli(&["-n", "3", "EXISTS", "lock:L{in-db-3}"]), "1");
    assert_eq!(server.cli(&["EXISTS", "lock:L{in-db-3}"]), "0");
    guard.release().await.unwrap();
}

/// A URL the driver cannot take says which forms it takes, and names the
/// scheme it was given, never the rest of the URL (it may hold a password).
#[tokio::test]
async fn a_url_that_is_not_a_redis_url_says_what_is_expected() {
    let cases = [
        (
            "http://user:secret@127.0.0.1:6379",
            Some("`http://` is not a Redis scheme"),
        ),
        ("user:secret@127.0.0.1:6379", Some("no scheme")),
        ("", Some("no scheme")),
        ("redis://user:secret@127.0.0.1:notaport", None),
    ];
    for (url, says) in cases {
        let err = LockClient::builder().redis(url).build().await.unwrap_err();
        let said = err.to_string();
        assert!(err.is_config(), "{url}: {err:?}");
        assert!(
            said.contains("expected `redis://[user:password@]host[:port][/db]`"),
            "{said}"
        );
        assert!(says.is_none_or(|says| said.contains(says)), "{url}: {said}");
        assert!(!said.contains("secret"), "the password echoed: {said}");
    }
}

#[tokio::test]
async fn zero_timeouts_are_config_errors() {
    type Configure = fn(LockClientBuilder) -> LockClientBuilder;
    let zero: [(&str, Configure); 2] = [
        ("connect", |b| b.connect_timeout(Duration::ZERO)),
        ("response", |b| b.response_timeout(Duration::ZERO)),
    ];
    for (which, configure) in zero {
        let err = configure(LockClient::builder().memory()).build().await;
        let err = err.unwrap_err();
        assert!(err.is_config(), "{which} timeout: {err:?}");
    }
}

/// Builds a Redis client with `configure` applied, then takes and releases a
/// lock; a configuration error is fine, a panic is not.
async fn build_and_lock_without_panicking(
    what: &str,
    configure: impl FnOnce(lock_runtime::LockClientBuilder) -> lock_runtime::LockClientBuilder,
) {
    let server = test_support::RedisServer::start();
    let builder = configure(LockClient::builder().redis(server.url()));
    let outcome = tokio::spawn(async move {
        let client = builder.build().await?;
        client.lock("k").acquire().await?.release().await
    })
    .await;
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(e)) => assert!(e.is_config(), "{what}: {e:?}"),
        Err(e) => panic!("{what} panicked: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_timeout_of_duration_max_never_panics() {
    build_and_lock_without_panicking("connect_timeout(Duration::MAX)", |b| {
        b.connect_timeout(Duration::MAX)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_timeout_of_duration_max_never_panics() {
    build_and_lock_without_panicking("response_timeout(Duration::MAX)", |b| {
        b.response_timeout(Duration::MAX)
    })
    .await;
}
