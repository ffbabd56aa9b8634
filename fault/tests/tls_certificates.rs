//! `LockClientBuilder::tls_root_certificates` and `tls_client_certificate`
//! against a real TLS server: a private CA trusted without `SSL_CERT_FILE`,
//! mutual TLS (`--tls-auth-clients yes`, Redis's default) for the lock
//! commands and the notice connection alike, and clear errors for
//! certificates that cannot work.

use std::path::Path;
use std::time::Duration;

use lock_runtime::{LockClient, LockError};
use test_support::{RedisServer, TlsFiles};

fn pem(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

/// The key at `path`, encrypted with a passphrase (PKCS#8).
fn encrypted(path: &Path) -> Vec<u8> {
    let out = std::process::Command::new("openssl")
        .args(["pkcs8", "-topk8", "-passout", "pass:secret", "-in"])
        .arg(path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// A TLS server asking clients for certificates (`yes`) or not (`no`),
/// its files, and the dir they are in.
fn tls_server(auth_clients: &str) -> (RedisServer, TlsFiles, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let files = test_support::self_signed_cert(dir.path()).unwrap();
    let server = RedisServer::try_start_tls(&files, &["--tls-auth-clients", auth_clients]).unwrap();
    (server, files, dir)
}

/// Two clients of `builder`: one takes a lock by the plain path and the
/// scripts (its fencing token), and a waiter of the other is woken by the
/// notice over its own connection, long before the 30 s lease would end.
async fn takes_and_wakes(builder: lock_runtime::LockClientBuilder) {
    let a = builder.clone().build().await.unwrap();
    let b = builder.build().await.unwrap();
    let guard = a.lock("order:1").acquire().await.unwrap();
    assert!(guard.fencing_token().await.unwrap() > 0);
    guard.release().await.unwrap();
    let waited = test_support::helpers::woken_by_release(&a, b, "order:2").await;
    assert!(
        waited < Duration::from_secs(2),
        "the waiter took {waited:?}"
    );
}

fn url(server: &RedisServer) -> String {
    format!("rediss://127.0.0.1:{}", server.port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_takes_and_waits_on_one_server_and_on_redlock() {
    if !test_support::tls_available(
        "mutual_tls_takes_waits_and_hands_over_with_a_client_certificate",
    ) {
        return;
    }
    let (server, files, dir) = tls_server("yes");
    let (cert, key) = test_support::client_cert(dir.path(), "locker").unwrap();
    let mtls = || {
        LockClient::builder()
            .redis(url(&server))
            .tls_root_certificates(pem(&files.ca))
            .tls_client_certificate(pem(&cert), pem(&key))
    };
    takes_and_wakes(mtls()).await;

    // Redlock's masters, each over mutual TLS.
    let masters: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::try_start_tls(&files, &["--tls-auth-clients", "yes"]).unwrap())
        .collect();
    let redlock = LockClient::builder()
        .redlock(masters.iter().map(url))
        .tls_root_certificates(pem(&files.ca))
        .tls_client_certificate(pem(&cert), pem(&key))
        .build()
        .await
        .unwrap();
    redlock.with_lock("order:3", async {}).await.unwrap();

    // A client certificate of another CA: refused by the server, and said
    // to be the likely cause.
    let other = tempfile::tempdir().unwrap();
    test_support::self_signed_cert(other.path()).unwrap();
    let (other_cert, other_key) = test_support::client_cert(other.path(), "stranger").unwrap();
    let err = LockClient::builder()
        .redis(url(&server))
        .tls_root_certificates(pem(&files.ca))
        .tls_client_certificate(pem(&other_cert), pem(&other_key))
        .build()
        .await
        .unwrap_err();
    let text = test_support::error_chain(&err);
    assert!(err.is_backend() && text.contains("certificate"), "{text}");
    println!("another CA's client certificate: {text}");

    // Without a client certificate, the server refuses the handshake:
    // `build` says so, as a backend error (it could not connect).
    let err = LockClient::builder()
        .redis(url(&server))
        .tls_root_certificates(pem(&files.ca))
        .build()
        .await
        .unwrap_err();
    let text = test_support::error_chain(&err);
    assert!(
        err.is_backend() && text.contains("tls_client_certificate"),
        "{text}"
    );
    println!("no client certificate: {text}");
}

/// A `rediss://` URL aimed at a plain server: the server waits for a command
/// line that never comes, and the connect timeout says what to look at.
#[tokio::test]
async fn a_tls_url_on_a_plain_port_names_tls_in_its_timeout() {
    let server = RedisServer::start();
    let url = server.url().replacen("redis://", "rediss://", 1);
    let err = LockClient::builder()
        .redis(url)
        .connect_timeout(std::time::Duration::from_millis(300))
        .build()
        .await
        .unwrap_err();
    let text = test_support::error_chain(&err);
    assert!(
        err.is_backend() && text.contains("does the port serve TLS"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn root_certificates_trust_a_private_ca_and_only_it() {
    if !test_support::tls_available("root_certificates_trust_a_private_ca_and_only_it") {
        return;
    }
    // The system's roots (and whatever `SSL_CERT_FILE` adds) do not know
    // the CA made for this test, so a client without it is refused.
    let (server, files, _dir) = tls_server("no");
    let trusted = LockClient::builder()
        .redis(url(&server))
        .tls_root_certificates(pem(&files.ca))
        .build()
        .await
        .unwrap();
    trusted.with_lock("k", async {}).await.unwrap();

    let err = LockClient::builder()
        .redis(url(&server))
        .build()
        .await
        .unwrap_err();
    let text = test_support::error_chain(&err).to_lowercase();
    assert!(err.is_backend() && text.contains("certificate"), "{text}");
    // Another CA's certificate trusts only that CA: the system's roots are
    // not consulted, and the server's certificate is refused.
    let other = tempfile::tempdir().unwrap();
    let other = test_support::self_signed_cert(other.path()).unwrap();
    let err = LockClient::builder()
        .redis(url(&server))
        .tls_root_certificates(pem(&other.ca))
        .build()
        .await
        .unwrap_err();
    let text = test_support::error_chain(&err).to_lowercase();
    assert!(err.is_backend() && text.contains("certificate"), "{text}");
}

#[tokio::test]
async fn certificates_that_cannot_work_are_config_errors_before_any_connection() {
    let dir = tempfile::tempdir().unwrap();
    let files = test_support::self_signed_cert(dir.path()).unwrap();
    let (cert, key) = test_support::client_cert(dir.path(), "locker").unwrap();
    // Nothing listens here: a check that came after connecting would be a
    // backend error, not a configuration one.
    let nowhere = format!("rediss://127.0.0.1:{}", test_support::free_port());
    let base = || LockClient::builder().redis(&nowhere);
    let cases: Vec<(&str, lock_runtime::LockClientBuilder)> = vec![
        (
            "garbage roots",
            base().tls_root_certificates(b"not a certificate".to_vec()),
        ),
        ("a key as roots", base().tls_root_certificates(pem(&key))),
        (
            "garbage client key",
            base().tls_client_certificate(pem(&cert), b"nope".to_vec()),
        ),
        (
            "the CA's key for the client's certificate",
            base().tls_client_certificate(pem(&cert), pem(&dir.path().join("ca.key"))),
        ),
        (
            "no client certificate",
            base().tls_client_certificate(Vec::new(), pem(&key)),
        ),
        (
            "a redis:// URL",
            LockClient::builder()
                .redis(nowhere.replace("rediss://", "redis://"))
                .tls_root_certificates(pem(&files.ca)),
        ),
        (
            "an encrypted client key",
            base().tls_client_certificate(pem(&cert), encrypted(&key)),
        ),
        (
            "#insecure",
            LockClient::builder().redis(format!("{nowhere}/#insecure")),
        ),
        (
            "the embedded backend",
            LockClient::builder()
                .memory()
                .tls_root_certificates(pem(&files.ca)),
        ),
        (
            // The driver would send the second sentinel the first one's
            // password, and fail while the first is down.
            "sentinels with different passwords",
            LockClient::builder()
                .sentinel(
                    "mymaster",
                    [
                        nowhere.replace("rediss://", "rediss://:one@"),
                        nowhere.replace("rediss://", "rediss://:two@"),
                    ],
                )
                .tls_root_certificates(pem(&files.ca)),
        ),
    ];
    // An X.509 v1 client certificate (`openssl x509 -req` without
    // `-extfile`, which redis-cli takes): rustls does not, and the error
    // says so, not that the key is wrong.
    let v1 = std::process::Command::new("openssl")
        .args([
            "x509",
            "-req",
            "-in",
            "locker.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
        ])
        .args(["-CAcreateserial", "-days", "2", "-out", "v1.crt"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(v1.status.success(), "{v1:?}");
    let v1 = base()
        .tls_client_certificate(pem(&dir.path().join("v1.crt")), pem(&key))
        .build()
        .await;
    match v1 {
        Err(LockError::Config(message)) => {
            assert!(
                message.contains("the client certificate") && message.contains("v3"),
                "{message}"
            )
        }
        other => panic!("a v1 certificate: {other:?}"),
    }
    // The scheme in capitals is TLS too: past the checks, to the connection.
    let upper = LockClient::builder()
        .redis(nowhere.replace("rediss://", "REDISS://"))
        .tls_root_certificates(pem(&files.ca))
        .build()
        .await
        .unwrap_err();
    assert!(upper.is_backend(), "{upper:?}");
    for (case, builder) in cases {
        let debug = format!("{builder:?}");
        assert!(
            !debug.contains("BEGIN"),
            "{case}: the builder shows a PEM: {debug}"
        );
        match builder.build().await {
            Err(LockError::Config(message)) => println!("{case}: {message}"),
            other => panic!("{case}: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_takes_and_waits_on_a_cluster() {
    if !test_support::tls_available("mutual_tls_takes_and_waits_on_a_cluster") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let files = test_support::self_signed_cert(dir.path()).unwrap();
    let (cert, key) = test_support::client_cert(dir.path(), "locker").unwrap();
    let cluster = test_support::topology::Cluster::start_tls(3, &files);
    let mtls = || {
        LockClient::builder()
            .cluster(cluster.seed_urls())
            .tls_root_certificates(pem(&files.ca))
            .tls_client_certificate(pem(&cert), pem(&key))
    };
    let (a, b) = (mtls().build().await.unwrap(), mtls().build().await.unwrap());
    // Keys on every node, by their hash slots.
    for i in 0..16 {
        let key = format!("order:{i}");
        let guard = a.lock(&key).acquire().await.unwrap();
        assert!(guard.fencing_token().await.unwrap() > 0, "{key}");
        guard.release().await.unwrap();
    }
    // A waiter is woken by the notice, over the cluster's TLS connections.
    let waited = test_support::helpers::woken_by_release(&a, b, "order:w").await;
    assert!(
        waited < Duration::from_secs(2),
        "the waiter took {waited:?}"
    );
}

/// Sentinels reached over TLS (`rediss://`): the master they name is
/// reached over TLS too, with the same certificates, though it serves TLS
/// only and asks for a client certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_reaches_a_sentinel_groups_master() {
    if !test_support::tls_available("mutual_tls_reaches_a_sentinel_groups_master") {
        return;
    }
    let (master, files, dir) = tls_server("yes");
    let (cert, key) = test_support::client_cert(dir.path(), "locker").unwrap();
    let name = test_support::topology::MASTER_NAME;
    // The sentinel's plain port answers its start-up PING; clients use its
    // TLS port, and it reaches the master over TLS with its certificate. A
    // port found free may be taken before the sentinel binds it: another.
    let (_sentinel, tls_port) = (0..3)
        .find_map(|_| {
            let tls_port = test_support::free_port();
            let config = format!(
                "tls-port {tls_port}\ntls-cert-file {}\ntls-key-file {}\n\
                 tls-ca-cert-file {}\ntls-replication yes\n",
                files.cert.display(),
                files.key.display(),
                files.ca.display(),
            );
            let sentinel = test_support::topology::Sentinel::try_start(master.port, name, &config);
            sentinel.ok().map(|sentinel| (sentinel, tls_port))
        })
        .expect("a TLS sentinel starts");
    let mtls = || {
        LockClient::builder()
            .sentinel(name, [format!("rediss://127.0.0.1:{tls_port}")])
            .tls_root_certificates(pem(&files.ca))
            .tls_client_certificate(pem(&cert), pem(&key))
    };
    takes_and_wakes(mtls()).await;
    // The master's connections (commands, notices) send no `CLIENT SETINFO`,
    // which Redis 7.0 refuses (`ERR`), as a least-privilege user's server
    // would: only the driver's own check of the master's role, once per
    // client built, still sends its two (docs/keys.md). There were ten.
    let errors = master.cli(&["INFO", "errorstats"]);
    let refused = errors
        .lines()
        .find_map(|line| line.strip_prefix("errorstat_ERR:count="))
        .map_or(0, |n| n.trim().parse::<u32>().unwrap());
    assert!(refused <= 4, "{errors}");
}
