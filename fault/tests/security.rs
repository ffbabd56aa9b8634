//! Keys, tokens, ACLs, passwords and TLS against real redis-servers.
//!
//! * keys with `:`, braces, spaces and unicode name distinct locks; a 1 MB or
//!   control-character key is a clear `InvalidKey` (also in `bad_input.rs`);
//! * a client with a wrong (stale or forged) token cannot release, extend or
//!   take over a lock;
//! * an ACL user restricted to `~lock:*` and `&lock:*` runs a contended
//!   workload (waits, renewals, cancellations, dropped guards), and `MONITOR`
//!   shows the library issuing no command outside its keys (no `KEYS`,
//!   `SCAN`, `FLUSH*`, `CONFIG`, ...);
//! * password with and without TLS (a self-signed certificate made with
//!   `openssl` for the test): works with the right credentials, a clear error
//!   otherwise.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lock_runtime::__private::testing::force_delete;
use lock_runtime::LockClient;
use test_support::helpers::{fixed_lease, ms, redis_url_client};
use test_support::{RedisServer, acl_locker};

async fn client(url: &str) -> LockClient {
    redis_url_client(url).await.expect("a client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_with_separators_braces_spaces_and_unicode_are_distinct_locks() {
    let server = RedisServer::try_start(&[]).unwrap();
    let c = client(&server.url()).await;
    let keys = [
        "a",
        "{a}",
        "a:b",
        "{a}:b",
        "a:{b}",
        "a b",
        " a",
        "{}",
        "{",
        "}",
        "}{",
        "{{a}}",
        "L{a}",
        "lock:L{a}",
        "ünï:{cöde} 漢字",
        "🔒",
        "a\u{200b}b",
    ];
    // All held at once: no two of them share a lock.
    let mut guards = Vec::new();
    for key in keys {
        let guard = c
            .lock(key)
            .acquire()
            .await
            .unwrap_or_else(|e| panic!("{key:?}: {e}"));
        assert_eq!(guard.key(), key);
        // Minted on first use: asked for, so every slot's counter exists.
        assert!(guard.fencing_token().await.unwrap() >= 1);
        guards.push(guard);
    }
    let names = server.try_cli(&["--scan", "--pattern", "lock:L*"]).unwrap();
    assert_eq!(names.lines().count(), keys.len(), "{names}");
    for key in keys {
        assert!(
            c.lock(key).acquire().await.unwrap_err().is_busy(),
            "{key:?}"
        );
    }
    for guard in guards {
        guard.release().await.unwrap();
    }
    assert_eq!(
        server.try_cli(&["--scan", "--pattern", "lock:L*"]).unwrap(),
        ""
    );
    // What stays: the fencing counters of the keys' hash slots (tokens must
    // keep increasing), at most one per key.
    let left = server.try_cli(&["--scan"]).unwrap();
    // (And each client's registry entry: its label.)
    let left: String = left
        .lines()
        .filter(|n| !n.starts_with("lock:C{"))
        .map(|n| format!("{n}\n"))
        .collect();
    assert!(left.lines().all(|n| n.starts_with("lock:S{")), "{left}");
    let mut counters: Vec<String> = keys
        .iter()
        .map(|k| lock_runtime::__private::testing::fence_counter("lock:", k))
        .collect();
    counters.sort();
    counters.dedup();
    let mut left: Vec<&str> = left.lines().collect();
    left.sort();
    assert_eq!(left, counters);
    for bad in ["", "a\nb", "\u{0}", "tab\there", &"x".repeat(1 << 20)] {
        let err = c.lock(bad).acquire().await.unwrap_err();
        assert!(
            err.is_invalid_key(),
            "{:?}: {err:?}",
            &bad[..bad.len().min(10)]
        );
    }
    // The counters, and one registry entry per client (`a`, `b`, `c`).
    let clients = server
        .try_cli(&["--scan", "--pattern", "lock:C{*"])
        .unwrap()
        .lines()
        .count();
    assert_eq!(
        server.try_cli(&["DBSIZE"]).unwrap(),
        (counters.len() + clients).to_string()
    );
}

/// The scripts, as the library loads them.
fn script(name: &str) -> redis::Script {
    let text = match name {
        "acquire" => include_str!("../../lock-runtime/scripts/acquire.lua"),
        "extend" => include_str!("../../lock-runtime/scripts/extend.lua"),
        "extend_many" => include_str!("../../lock-runtime/scripts/extend_many.lua"),
        "release" => include_str!("../../lock-runtime/scripts/release.lua"),
        _ => unreachable!(),
    };
    redis::Script::new(text)
}

/// Runs the extend script `name` on the lock `k` with `token` and a 600 s lease.
async fn extend_with<T: redis::FromRedisValue>(
    conn: &mut redis::aio::MultiplexedConnection,
    name: &str,
    token: &str,
) -> T {
    script(name)
        .key("lock:L{k}")
        .arg(token)
        .arg(600_000)
        .invoke_async(conn)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_can_neither_release_nor_extend_nor_take_over() {
    let server = RedisServer::try_start(&[]).unwrap();
    let a = client(&server.url()).await;
    let b = client(&server.url()).await;

    // A stale token: A's fixed lease ran out and B took the lock.
    let stale = fixed_lease(&a, "k", ms(100)).await.unwrap();
    tokio::time::sleep(ms(250)).await;
    let fresh = b.lock("k").ttl(ms(5000)).acquire().await.unwrap();
    // The stale holder never asked for a token while it held the lock: it
    // gets none now (a lease that ended is refused a token).
    assert!(stale.fencing_token().await.unwrap_err().is_lost());
    assert!(fresh.fencing_token().await.unwrap() >= 1);
    let err = stale.release().await.unwrap_err();
    assert!(err.is_lost(), "{err:?}");
    assert!(
        a.lock("k").acquire().await.unwrap_err().is_busy(),
        "B lost the lock"
    );

    // A renewing guard whose key was taken over is told, and does not
    // re-arm the new owner's key.
    let held = a.lock("j").ttl(ms(300)).acquire().await.unwrap();
    force_delete(&a, "j").await.unwrap();
    let thief = b.lock("j").ttl(ms(5000)).acquire().await.unwrap();
    tokio::time::timeout(ms(3000), held.lost())
        .await
        .expect("lost() resolves");
    assert!(held.release().await.unwrap_err().is_lost());
    let pttl: i64 = server
        .try_cli(&["PTTL", "lock:L{j}"])
        .unwrap()
        .parse()
        .unwrap();
    assert!(pttl > 3000, "the new owner's lease was touched: {pttl} ms");
    thief.release().await.unwrap();

    // Forged tokens against the scripts themselves.
    let owner = server.try_cli(&["GET", "lock:L{k}"]).unwrap();
    let random = owner.split('.').next().unwrap();
    assert_eq!(random.len(), 32, "a 128-bit hex token: {owner:?}");
    let before: i64 = server
        .try_cli(&["PTTL", "lock:L{k}"])
        .unwrap()
        .parse()
        .unwrap();
    let redis = redis::Client::open(server.url()).unwrap();
    let mut conn = redis.get_multiplexed_async_connection().await.unwrap();
    let forged = "0123456789abcdef0123456789abcdef";
    let extended: i64 = extend_with(&mut conn, "extend", forged).await;
    assert_eq!(extended, 0);
    let many: Vec<i64> = extend_with(&mut conn, "extend_many", forged).await;
    assert_eq!(many, vec![0]);
    let fence = lock_runtime::__private::testing::fence_counter("lock:", "k");
    let released: redis::Value = script("release")
        .key("lock:L{k}")
        .key(&fence)
        .key("lock:Q{k}")
        .arg(forged)
        .arg("PUBLISH lock:N{k}")
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(released, redis::Value::Int(0));
    let taken: i64 = script("acquire")
        .key("lock:L{k}")
        .key(&fence)
        .key("lock:Q{k}")
        .key("lock:F{k}")
        .arg(forged)
        .arg(600_000)
        .arg("PUBLISH lock:N{k}")
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert!(taken <= 0, "a forged token took the lock: {taken}");
    assert_eq!(server.try_cli(&["GET", "lock:L{k}"]).unwrap(), owner);
    let after: i64 = server
        .try_cli(&["PTTL", "lock:L{k}"])
        .unwrap()
        .parse()
        .unwrap();
    assert!(after <= before && after > 0, "{before} -> {after}");
    fresh.release().await.unwrap();
}

/// Commands a client may send that name no key (connection set-up).
const KEYLESS: &[&str] = &[
    "CLIENT",
    "HELLO",
    "PING",
    "SELECT",
    "AUTH",
    "SCRIPT",
    "SUBSCRIBE",
    "UNSUBSCRIBE",
];

/// Splits a `MONITOR` line into its source (`lua` or the client address) and
/// its quoted arguments.
fn parse_monitor(line: &str) -> Option<(String, Vec<String>)> {
    let open = line.find('[')?;
    let close = line[open..].find(']')? + open;
    let source = line[open + 1..close].split(' ').nth(1)?.to_string();
    let mut args = Vec::new();
    let mut rest = &line[close + 1..];
    while let Some(start) = rest.find('"') {
        let mut arg = String::new();
        let mut chars = rest[start + 1..].char_indices();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, n)) = chars.next() {
                        arg.push(n);
                    }
                }
                '"' => {
                    end = Some(start + 1 + i);
                    break;
                }
                c => arg.push(c),
            }
        }
        args.push(arg);
        rest = &rest[end? + 1..];
    }
    Some((source, args))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_limited_to_the_lock_prefix_works_and_the_library_touches_nothing_else() {
    let server = RedisServer::try_start(&[]).unwrap();
    assert_eq!(server.try_cli(&acl_locker()).unwrap(), "OK");
    let monitor_file = tempfile::NamedTempFile::new().unwrap();
    let mut monitor = Command::new("redis-cli")
        .args(["-p", &server.port.to_string(), "monitor"])
        .stdout(monitor_file.reopen().unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    tokio::time::sleep(ms(200)).await;

    let url = format!("redis://locker:locker-pw@127.0.0.1:{}", server.port);
    let clients = [client(&url).await, client(&url).await, client(&url).await];
    let mut tasks = Vec::new();
    for (i, c) in clients.iter().enumerate() {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let mut acquired = 0;
            for n in 0..40u64 {
                let key = format!("k{}", n % 3);
                let request = c.lock(&key).ttl(ms(300)).wait(ms(3000)).acquire();
                // Every 7th acquire is cancelled part-way.
                let guard = if (n + i as u64).is_multiple_of(7) {
                    match tokio::time::timeout(ms(n % 5), request).await {
                        Ok(g) => g,
                        Err(_) => continue,
                    }
                } else {
                    request.await
                };
                let guard = guard.unwrap();
                acquired += 1;
                // Now and then outlive a renewal period; sometimes just drop.
                let hold = if n.is_multiple_of(10) { 220 } else { 1 };
                tokio::time::sleep(ms(hold)).await;
                assert!(!guard.is_lost());
                if n.is_multiple_of(4) {
                    drop(guard);
                } else {
                    guard.release().await.unwrap();
                }
            }
            acquired
        }));
    }
    let mut acquired = 0;
    for t in tasks {
        acquired += t.await.unwrap();
    }
    assert!(acquired > 80, "{acquired}");
    tokio::time::sleep(ms(300)).await; // background releases
    drop(clients);
    let _ = monitor.kill();
    let _ = monitor.wait();

    let denied = server.try_cli(&["ACL", "LOG"]).unwrap();
    assert!(
        denied.is_empty(),
        "the ACL user was refused something:\n{denied}"
    );
    let text = std::fs::read_to_string(monitor_file.path()).unwrap();
    let mut commands: BTreeMap<String, u64> = BTreeMap::new();
    let mut keyed = 0;
    for line in text.lines().filter(|l| l.contains('[')) {
        let (source, args) = parse_monitor(line).unwrap_or_else(|| panic!("{line}"));
        let Some(name) = args.first().map(|c| c.to_uppercase()) else {
            continue;
        };
        *commands
            .entry(format!(
                "{source_kind} {name}",
                source_kind = if source == "lua" { "lua" } else { "client" }
            ))
            .or_default() += 1;
        assert!(
            ![
                "KEYS",
                "SCAN",
                "FLUSHALL",
                "FLUSHDB",
                "CONFIG",
                "DEBUG",
                "SHUTDOWN",
                "MIGRATE",
                "RANDOMKEY"
            ]
            .contains(&name.as_str()),
            "the library issued {line}"
        );
        if source == "lua" && name == "TIME" {
            // The server's clock (a queue entry's deadline): no key.
        } else if source == "lua" {
            // Every key a script touches, and the channel it publishes on.
            let target = args.get(1).expect("a key");
            assert!(target.starts_with("lock:"), "outside the prefix: {line}");
            keyed += 1;
        } else if name == "EVALSHA" {
            let n: usize = args[2].parse().unwrap();
            for key in &args[3..3 + n] {
                assert!(key.starts_with("lock:"), "outside the prefix: {line}");
            }
        } else if name == "SET" || name == "DELIFEQ" || name == "DELEX" {
            // The client's registry entry (its label), or an uncontended
            // lock's plain acquire and release: in the prefix.
            assert!(args[1].starts_with("lock:"), "{line}");
        } else if name == "SUBSCRIBE" || name == "UNSUBSCRIBE" {
            assert!(args[1..].iter().all(|c| c.starts_with("lock:")), "{line}");
        } else {
            assert!(
                KEYLESS.contains(&name.as_str()),
                "unexpected command: {line}"
            );
        }
    }
    println!("commands seen by MONITOR: {commands:#?}");
    assert!(keyed > 100, "MONITOR saw too little to judge: {commands:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_without_tls_works_when_right_and_fails_clearly_when_wrong() {
    let server = RedisServer::try_start(&["--requirepass", "pw 1"]).unwrap();
    let base = format!("127.0.0.1:{}", server.port);
    let c = client(&format!("redis://:pw%201@{base}")).await;
    c.with_lock("k", async {}).await.unwrap();
    for url in [format!("redis://{base}"), format!("redis://:nope@{base}")] {
        let started = Instant::now();
        let err = LockClient::builder().redis(&url).build().await.unwrap_err();
        assert!(err.is_backend(), "{err:?}");
        // The message says what failed; its source (the driver) says why.
        let text = test_support::error_chain(&err).to_lowercase();
        assert!(text.contains("auth") || text.contains("password"), "{text}");
        assert!(!text.contains("nope"), "the password leaked: {text}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}

/// Runs `fault probe --redis URL` with `SSL_CERT_FILE` (rustls-native-certs
/// reads it: that is how a client of the `tls` feature trusts a private CA).
fn probe(url: &str, ca: Option<&std::path::Path>) -> (bool, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fault"));
    cmd.args(["probe", "--redis", url])
        .env_remove("SSL_CERT_FILE");
    let empty = tempfile::tempdir().unwrap();
    cmd.env("SSL_CERT_DIR", empty.path());
    if let Some(ca) = ca {
        cmd.env("SSL_CERT_FILE", ca);
    }
    let started = Instant::now();
    let out = cmd.output().unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{url}: took {:?}",
        started.elapsed()
    );
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    println!("{url} (CA {}): {text}", ca.is_some());
    (out.status.success(), text)
}

#[test]
fn tls_with_a_password_works_when_trusted_and_right_and_fails_clearly_otherwise() {
    // Said by name in the run's output where the server has no TLS.
    if !test_support::tls_available(
        "tls_with_a_password_works_when_trusted_and_right_and_fails_clearly_otherwise",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let files = test_support::self_signed_cert(dir.path()).unwrap();
    let server = RedisServer::try_start_tls(&files, &["--requirepass", "tls-pw"]).unwrap();
    let host = format!("127.0.0.1:{}", server.port);
    let ca = Some(files.ca.as_path());

    let (ok, text) = probe(&format!("rediss://:tls-pw@{host}"), ca);
    assert!(ok && text.starts_with("ok"), "{text}");

    let (ok, text) = probe(&format!("rediss://:wrong@{host}"), ca);
    let lower = text.to_lowercase();
    assert!(
        !ok && (lower.contains("auth") || lower.contains("password")),
        "{text}"
    );
    assert!(!text.contains("wrong"), "the password leaked: {text}");
    let (ok, text) = probe(&format!("rediss://{host}"), ca);
    assert!(!ok && text.to_lowercase().contains("auth"), "{text}");

    // A certificate nobody vouched for is refused, and says why.
    let (ok, text) = probe(&format!("rediss://:tls-pw@{host}"), None);
    assert!(!ok && text.to_lowercase().contains("certificate"), "{text}");
    // `#insecure` is not honoured by the `tls` feature (no
    // `tls-rustls-insecure`): a clear error, not a silent downgrade.
    let (ok, text) = probe(&format!("rediss://:tls-pw@{host}/#insecure"), None);
    assert!(!ok && text.starts_with("error"), "{text}");
    // Plain text against the TLS port fails in bounded time.
    let (ok, text) = probe(&format!("redis://:tls-pw@{host}"), ca);
    assert!(!ok && text.starts_with("error"), "{text}");
}
