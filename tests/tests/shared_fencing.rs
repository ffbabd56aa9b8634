//! Fencing tokens of read-write locks and semaphores. On Redis a holder that
//! takes such a lock free gets no token at acquire: `fencing_token()` mints
//! it on first use (shared.lua's `mint`), only while the lease is still
//! ours; a waiter granted by a hand-over gets its token with the grant. The
//! embedded backend issues every token at acquire. The checks below run on
//! both (`embedded_backend`, `one_redis`); on Redis they also read the
//! slot's fencing counter, to see when a token was minted. The tests after
//! them make the server forget a holder behind its back (Redis only).

use lock_runtime::{LockClient, LockError, LockGuard, LockRequest};
use test_support::RedisServer;
use test_support::helpers::{fence_name, key, memory_client, ms, secs, two_clients, within};
use tokio::task::JoinHandle;

/// The fencing counter of a key's hash slot, read from the server; `None`
/// on the embedded backend (whose counter a test cannot read).
#[derive(Clone, Copy)]
struct Counter<'a>(Option<&'a RedisServer>);

impl Counter<'_> {
    fn of(self, key: &str) -> Option<u64> {
        self.0.map(|server| {
            let value = server.cli(&["GET", &fence_name(key)]);
            if value.is_empty() {
                0
            } else {
                value
                    .parse()
                    .unwrap_or_else(|_| panic!("counter {value:?}"))
            }
        })
    }
}

/// Takes `request` at once (the lock is free) and checks that on Redis
/// this minted no token: the slot's counter did not move.
async fn take_free(request: LockRequest, counter: Counter<'_>, key: &str) -> LockGuard {
    let before = counter.of(key);
    let guard = request.ttl(secs(20)).acquire().await.unwrap();
    assert_eq!(counter.of(key), before, "taking a free lock minted a token");
    guard
}

/// Asks `guard`'s token, twice: the same both times.
async fn token(guard: &LockGuard) -> u64 {
    let first = guard.fencing_token().await.unwrap();
    assert_eq!(guard.fencing_token().await.unwrap(), first);
    first
}

/// Acquires `request` in a task of its own: a 20 s lease, waiting up to 5 s.
fn spawn_waiter(request: LockRequest) -> JoinHandle<Result<LockGuard, LockError>> {
    tokio::spawn(async move { request.ttl(secs(20)).wait(secs(5)).acquire().await })
}

/// Releases `holders` while `waiter` is queued behind them, and returns the
/// waiter's guard, granted by the hand-over.
async fn hand_over(
    holders: Vec<LockGuard>,
    waiter: JoinHandle<Result<LockGuard, LockError>>,
) -> LockGuard {
    assert!(!waiter.is_finished(), "the waiter got a held lock");
    for holder in holders {
        holder.release().await.unwrap();
    }
    within(secs(5), "the hand-over", waiter)
        .await
        .unwrap()
        .unwrap()
}

/// The token of a guard granted by a hand-over: it came with the grant, so
/// asking it mints nothing (on Redis, the counter stays where the grants
/// left it, at or above this one), and asking again gives the same.
async fn granted_token(guard: &LockGuard, counter: Counter<'_>, key: &str) -> u64 {
    let before = counter.of(key);
    let token = token(guard).await;
    let after = counter.of(key);
    assert_eq!(
        after, before,
        "a handed-over holder's token was minted late"
    );
    if let Some(granted) = after {
        assert!(token <= granted, "{token} was not minted by the grants");
    }
    token
}

/// `earlier` all below `later`: tokens rise in hold order.
fn rising(earlier: &[u64], later: &[u64]) {
    let (top, bottom) = (earlier.iter().max(), later.iter().min());
    assert!(top < bottom, "{earlier:?} then {later:?}");
}

/// Writer, two readers taken free (asking their tokens the other way
/// round), writer: every holder's token above those who held before, the
/// readers' apart.
async fn tokens_rise_from_writer_to_readers_to_writer(
    a: &LockClient,
    b: &LockClient,
    key: &str,
    counter: Counter<'_>,
) {
    let w1 = take_free(a.rw_lock(key).write(), counter, key).await;
    let t_w1 = token(&w1).await;
    w1.release().await.unwrap();
    let r1 = take_free(a.rw_lock(key).read(), counter, key).await;
    let r2 = take_free(b.rw_lock(key).read(), counter, key).await;
    let t_r2 = token(&r2).await;
    let t_r1 = token(&r1).await;
    assert_ne!(t_r1, t_r2, "two readers share a token");
    rising(&[t_w1], &[t_r1, t_r2]);
    r1.release().await.unwrap();
    r2.release().await.unwrap();
    let w2 = take_free(b.rw_lock(key).write(), counter, key).await;
    let t_w2 = token(&w2).await;
    rising(&[t_w1, t_r1, t_r2], &[t_w2]);
    w2.release().await.unwrap();
    // A reader that never asks changes nothing for the next one's token.
    let silent = take_free(a.rw_lock(key).read(), counter, key).await;
    silent.release().await.unwrap();
    let r3 = take_free(b.rw_lock(key).read(), counter, key).await;
    rising(&[t_w2], &[token(&r3).await]);
    r3.release().await.unwrap();
}

/// Permits held one after another, two at a time in the middle (asking
/// their tokens the other way round): the same rise.
async fn tokens_rise_across_permits(
    a: &LockClient,
    b: &LockClient,
    key: &str,
    counter: Counter<'_>,
) {
    let p1 = take_free(a.semaphore(key, 2), counter, key).await;
    let t1 = token(&p1).await;
    p1.release().await.unwrap();
    let p2 = take_free(b.semaphore(key, 2), counter, key).await;
    let p3 = take_free(a.semaphore(key, 2), counter, key).await;
    let t3 = token(&p3).await;
    let t2 = token(&p2).await;
    assert_ne!(t2, t3, "two permits share a token");
    rising(&[t1], &[t2, t3]);
    p2.release().await.unwrap();
    p3.release().await.unwrap();
    let p4 = take_free(b.semaphore(key, 2), counter, key).await;
    rising(&[t1, t2, t3], &[token(&p4).await]);
    p4.release().await.unwrap();
}

/// A writer queued behind two readers is granted by their release: its
/// token (come with the grant) is above both readers', one minted before
/// the writer queued, one while it waited. Then readers queued behind that
/// writer, and a permit queued behind another, the same way.
async fn handed_over_holders_get_higher_tokens(
    a: &LockClient,
    b: &LockClient,
    key: &str,
    counter: Counter<'_>,
) {
    let r1 = take_free(a.rw_lock(key).read(), counter, key).await;
    let r2 = take_free(b.rw_lock(key).read(), counter, key).await;
    let t_r1 = token(&r1).await;
    let writer = spawn_waiter(b.rw_lock(key).write());
    tokio::time::sleep(ms(100)).await;
    let t_r2 = token(&r2).await;
    let w = hand_over(vec![r1, r2], writer).await;
    let t_w = granted_token(&w, counter, key).await;
    rising(&[t_r1, t_r2], &[t_w]);

    let readers = [
        spawn_waiter(a.rw_lock(key).read()),
        spawn_waiter(b.rw_lock(key).read()),
    ];
    tokio::time::sleep(ms(100)).await;
    assert!(
        readers.iter().all(|r| !r.is_finished()),
        "a writer excludes readers"
    );
    w.release().await.unwrap();
    let mut tokens = Vec::new();
    for reader in readers {
        let r = within(secs(5), "a queued reader", reader)
            .await
            .unwrap()
            .unwrap();
        tokens.push(granted_token(&r, counter, key).await);
        r.release().await.unwrap();
    }
    assert_ne!(tokens[0], tokens[1], "two readers share a token");
    rising(&[t_w], &tokens);

    let p = take_free(a.semaphore(key, 1), counter, key).await;
    let t_p = token(&p).await;
    let waiter = spawn_waiter(b.semaphore(key, 1));
    tokio::time::sleep(ms(100)).await;
    let next = hand_over(vec![p], waiter).await;
    rising(&[t_p], &[granted_token(&next, counter, key).await]);
    next.release().await.unwrap();
}

/// Asked twice, at once, and through a re-entered guard: one token.
async fn one_guard_one_token(a: &LockClient, key: &str) {
    for request in [
        a.rw_lock(key).read(),
        a.rw_lock(key).write(),
        a.semaphore(key, 3),
    ] {
        let guard = request.acquire().await.unwrap();
        let (x, y) = tokio::join!(guard.fencing_token(), guard.fencing_token());
        let (x, y) = (x.unwrap(), y.unwrap());
        assert_eq!(x, y, "one guard, two tokens");
        assert_eq!(guard.fencing_token().await.unwrap(), x);
        guard.release().await.unwrap();
    }
    let inner = a.clone();
    let k = key.to_owned();
    a.semaphore(key, 3)
        .run(async move {
            let again = inner.semaphore(&k, 3).acquire().await.unwrap();
            assert!(again.is_reentrant());
            // The inner guard asks first: the outer one gets the same.
            let t = again.fencing_token().await.unwrap();
            let outer = lock_runtime::current_lock().expect("inside the permit");
            assert_eq!(outer.fencing_token().await.unwrap(), t);
            assert_eq!(again.fencing_token().await.unwrap(), t);
        })
        .await
        .unwrap();
}

/// A reader and a permit whose leases ran out (not renewed) get `Lost`,
/// never a token, after the next holder took the lock and asked its own
/// (also on the embedded backend, where a token was issued at acquire);
/// the next holder's token is unaffected and the next ones rise above it.
/// (The guard's own deadline has passed too, so the guard says `Lost`
/// without asking the server; `a_holder_the_server_forgot_gets_no_token`
/// has the server refuse.)
async fn a_lapsed_shared_holder_gets_no_token(a: &LockClient, b: &LockClient, key: &str) {
    for reader in [true, false] {
        let request = |client: &LockClient, exclusive: bool| match (reader, exclusive) {
            (true, false) => client.rw_lock(key).read(),
            (true, true) => client.rw_lock(key).write(),
            (false, _) => client.semaphore(key, 1),
        };
        let dead = request(a, false)
            .ttl(ms(300))
            .renew(false)
            .acquire()
            .await
            .unwrap();
        within(secs(2), "the lease ends", dead.lost()).await;
        let next = request(b, true).wait(secs(2)).acquire().await.unwrap();
        let t = token(&next).await;
        match dead.fencing_token().await {
            Err(LockError::Lost { key: k }) => assert_eq!(k, key),
            other => panic!("a lapsed holder's token: {other:?}"),
        }
        assert_eq!(next.fencing_token().await.unwrap(), t);
        next.release().await.unwrap();
        drop(dead);
        let after = request(b, false).acquire().await.unwrap();
        rising(&[t], &[token(&after).await]);
        after.release().await.unwrap();
    }
}

async fn all_checks(a: &LockClient, b: &LockClient, counter: Counter<'_>) {
    tokens_rise_from_writer_to_readers_to_writer(a, b, &key("catalog"), counter).await;
    tokens_rise_across_permits(a, b, &key("exports"), counter).await;
    handed_over_holders_get_higher_tokens(a, b, &key("catalog"), counter).await;
    one_guard_one_token(a, &key("catalog")).await;
    a_lapsed_shared_holder_gets_no_token(a, b, &key("catalog")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_backend() {
    let client = memory_client().await;
    all_checks(&client, &client, Counter(None)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_redis() {
    let server = RedisServer::start();
    let (a, b) = two_clients(&LockClient::builder().redis(server.url())).await;
    all_checks(&a, &b, Counter(Some(&server))).await;
}

// ---- the server forgets a holder (Redis only) ----------------------------

/// Ends, on the server, the lease of the only member of the holders' set
/// `holders` (its score is the end of its lease, server time in ms): what a
/// holder whose renewals stopped sees, as far as the server is concerned,
/// while its own guard has not noticed yet.
fn end_the_lease_of_the_holder(server: &RedisServer, holders: &str) {
    let member = server.cli(&["ZRANGE", holders, "0", "-1"]);
    assert!(
        !member.is_empty() && !member.contains('\n'),
        "one holder: {member:?}"
    );
    assert_eq!(
        server.cli(&["ZADD", holders, "XX", "CH", "1", &member]),
        "1"
    );
}

/// Asks `stale`'s token after the server forgot it: `Lost`, from the
/// server (the guard thought it held), and nothing minted.
async fn refused(stale: &LockGuard, counter: Counter<'_>, key: &str) {
    assert!(!stale.is_lost(), "the guard should not know yet");
    let before = counter.of(key);
    match stale.fencing_token().await {
        Err(LockError::Lost { key: k }) => assert_eq!(k, key),
        other => panic!("a forgotten holder's token: {other:?}"),
    }
    assert!(stale.is_lost(), "the server's answer marks it lost");
    assert_eq!(counter.of(key), before, "a token was minted for it");
    // And stays refused.
    assert!(stale.fencing_token().await.unwrap_err().is_lost());
}

/// A reader and a permit whose lease ended on the server (and a writer
/// whose key expired there) while their guards, not renewing, still think
/// they hold: the next holder takes the lock and mints its token; then the
/// stale holder asks and the server refuses (shared.lua's `mint` checks the
/// lease), minting nothing; the next holder's token is unaffected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_the_server_forgot_gets_no_token() {
    let server = RedisServer::start();
    let counter = Counter(Some(&server));
    let (a, b) = two_clients(&LockClient::builder().redis(server.url())).await;
    // No watchdog: nothing but the `mint` call can tell the guard.
    let stale_lease = |request: LockRequest| request.ttl(secs(20)).renew(false).acquire();

    let k = key("catalog");
    let stale = stale_lease(a.rw_lock(&k).read()).await.unwrap();
    end_the_lease_of_the_holder(&server, &format!("lock:R{{{k}}}"));
    // Try once: a writer gets in only if the reader's lease is over.
    let next = b.rw_lock(&k).write().acquire().await.unwrap();
    let t = token(&next).await;
    refused(&stale, counter, &k).await;
    assert_eq!(next.fencing_token().await.unwrap(), t);
    next.release().await.unwrap();
    let after = take_free(a.rw_lock(&k).read(), counter, &k).await;
    rising(&[t], &[token(&after).await]);
    after.release().await.unwrap();

    let k = key("exports");
    let stale = stale_lease(a.semaphore(&k, 1)).await.unwrap();
    end_the_lease_of_the_holder(&server, &format!("lock:P{{{k}}}"));
    let next = b.semaphore(&k, 1).acquire().await.unwrap();
    let t = token(&next).await;
    refused(&stale, counter, &k).await;
    assert_eq!(next.fencing_token().await.unwrap(), t);
    next.release().await.unwrap();

    // A writer asks before anyone else took the lock: refused all the same.
    let k = key("catalog");
    let stale = stale_lease(a.rw_lock(&k).write()).await.unwrap();
    assert_eq!(
        server.cli(&["PEXPIRE", &format!("lock:W{{{k}}}"), "1"]),
        "1"
    );
    tokio::time::sleep(ms(20)).await;
    refused(&stale, counter, &k).await;
    let next = take_free(b.rw_lock(&k).read(), counter, &k).await;
    token(&next).await;
    next.release().await.unwrap();
}

/// An operator's `DEL` of the holders' set (or of the writer's key) while
/// shared holders and a writer hold: their guards, asked for a token before
/// any renewal, get `Lost` from the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_holders_get_no_token() {
    let server = RedisServer::start();
    let counter = Counter(Some(&server));
    let (a, b) = two_clients(&LockClient::builder().redis(server.url())).await;
    let (kr, kp, kw) = (key("catalog"), key("exports"), key("catalog"));
    let readers = [
        take_free(a.rw_lock(&kr).read(), counter, &kr).await,
        take_free(b.rw_lock(&kr).read(), counter, &kr).await,
    ];
    let permit = take_free(a.semaphore(&kp, 2), counter, &kp).await;
    let writer = take_free(b.rw_lock(&kw).write(), counter, &kw).await;
    let deleted = server.cli(&[
        "DEL",
        &format!("lock:R{{{kr}}}"),
        &format!("lock:P{{{kp}}}"),
        &format!("lock:W{{{kw}}}"),
    ]);
    assert_eq!(deleted, "3");
    for reader in &readers {
        refused(reader, counter, &kr).await;
    }
    refused(&permit, counter, &kp).await;
    refused(&writer, counter, &kw).await;
    for guard in readers.into_iter().chain([permit, writer]) {
        assert!(guard.release().await.unwrap_err().is_lost());
    }
}

/// Lazily minted tokens and tokens minted with a hand-over's grant draw
/// from the same counter: a reader taken free while a writer's hand-over
/// token is the counter's last gets one above it, and so on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_mint_rises_above_the_tokens_given_since() {
    let server = RedisServer::start();
    let counter = Counter(Some(&server));
    let (a, b) = two_clients(&LockClient::builder().redis(server.url())).await;
    let k = key("catalog");
    // r1 takes the lock free and asks its token only after a writer was
    // granted (and released), with readers in between that did ask.
    let r1 = take_free(a.rw_lock(&k).read(), counter, &k).await;
    let r2 = take_free(b.rw_lock(&k).read(), counter, &k).await;
    let t_r2 = token(&r2).await;
    let writer = spawn_waiter(b.rw_lock(&k).write());
    tokio::time::sleep(ms(100)).await;
    // r1 mints while the writer waits: below the writer's grant.
    let t_r1 = token(&r1).await;
    let w = hand_over(vec![r2, r1], writer).await;
    let t_w = granted_token(&w, counter, &k).await;
    assert_eq!(counter.of(&k), Some(t_w), "the grant's INCR is the last");
    rising(&[t_r1, t_r2], &[t_w]);
    w.release().await.unwrap();
    let r3 = take_free(a.rw_lock(&k).read(), counter, &k).await;
    let t_r3 = token(&r3).await;
    assert_eq!(counter.of(&k), Some(t_r3), "one INCR, at the first ask");
    assert_eq!(t_r3, t_w + 1, "nothing else was minted since the grant");
    r3.release().await.unwrap();
}
