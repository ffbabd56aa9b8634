//! Small async helpers for tests of `lock_runtime`: unique keys, deadlines,
//! probes of a lock, clients.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockClientBuilder, LockError, LockGuard, LockRequest};
use tokio::task::JoinHandle;

use crate::RedisServer;

/// `n` milliseconds.
pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// `n` seconds.
pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// A key no other test of this process uses (`<name>:<n>`).
pub fn key(name: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!("{name}:{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// The Redis name of the lock `key` under the default prefix `lock:`
/// (`prefix + 'L' + '{key}'` for a key without a hash tag of its own).
pub fn lock_name(key: &str) -> String {
    format!("lock:L{{{key}}}")
}

/// The Redis name of the fencing counter of `key` under the default prefix
/// (its hash slot's, shared with every key there).
pub fn fence_name(key: &str) -> String {
    lock_runtime::__private::testing::fence_counter("lock:", key)
}

/// Awaits `fut`, failing the test if it takes longer than `limit`.
pub async fn within<F: Future>(limit: Duration, what: &str, fut: F) -> F::Output {
    match tokio::time::timeout(limit, fut).await {
        Ok(output) => output,
        Err(_) => panic!("{what}: did not finish within {limit:?}"),
    }
}

/// Polls `check` every millisecond until it holds; fails after `limit`.
/// Returns how long it took.
pub async fn eventually(limit: Duration, what: &str, mut check: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !check() {
        if started.elapsed() > limit {
            panic!("{what}: still false after {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    started.elapsed()
}

/// Median and maximum of some durations.
pub fn summary(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    (
        samples[samples.len() / 2],
        *samples.last().expect("samples"),
    )
}

/// `true` if the lock `key` is held by someone (a try-once probe that, if it
/// happens to get the lock, gives it back at once).
pub async fn is_held(client: &LockClient, key: &str) -> bool {
    match client.lock(key).acquire().await {
        Ok(guard) => {
            guard.release().await.expect("release the probe");
            false
        }
        Err(LockError::Busy { .. }) => true,
        Err(e) => panic!("probe of `{key}` failed: {e}"),
    }
}

/// The remaining lease of the holder of `key`, as `inspect` reports it.
pub async fn remaining(client: &LockClient, key: &str) -> Duration {
    // `inspect`, not a `Busy`'s `retry_after`: that is a hint from recent
    // hold times, at most the lease left.
    match client.inspect(key).await {
        Ok(state) if state.held => state
            .remaining
            .unwrap_or_else(|| panic!("`{key}` is held without an expiry")),
        Ok(_) => panic!("`{key}` was expected to be held"),
        Err(e) => panic!("probe of `{key}` failed: {e}"),
    }
}

/// The next holder after one whose fencing token was `previous`: acquires
/// `request`, checks that its token is above `previous`, and releases it.
/// `what` names the situation in the failure messages.
pub async fn next_holder(request: LockRequest, previous: u64, what: &str) {
    let next = request
        .acquire()
        .await
        .unwrap_or_else(|e| panic!("{what}: the key is free, but: {e:?}"));
    assert!(
        next.fencing_token().await.unwrap() > previous,
        "{what}: fencing token {} after {previous}",
        next.fencing_token().await.unwrap()
    );
    next.release()
        .await
        .unwrap_or_else(|e| panic!("{what}: release of the next holder: {e:?}"));
}

/// How long a waiter of client `waiter` took to get `key`, which `holder`
/// holds with a 30 s lease and releases 300 ms after the wait began: well
/// under a second when the release's notice reached the waiter over its
/// own notice connection, the lease or a hand-over's otherwise.
pub async fn woken_by_release(holder: &LockClient, waiter: LockClient, key: &str) -> Duration {
    let held = holder.lock(key).ttl(secs(30)).acquire().await.unwrap();
    let key = key.to_owned();
    let waiting = tokio::spawn(async move {
        let started = Instant::now();
        let guard = waiter.lock(&key).wait(secs(20)).acquire().await.unwrap();
        let waited = started.elapsed();
        guard.release().await.unwrap();
        waited
    });
    tokio::time::sleep(ms(300)).await;
    held.release().await.unwrap();
    waiting.await.unwrap()
}

/// Builds an independent client (own connections, own subscriber).
pub async fn client(builder: &LockClientBuilder) -> LockClient {
    builder.clone().build().await.expect("a client")
}

/// Two independent clients of `builder`.
pub async fn two_clients(builder: &LockClientBuilder) -> (LockClient, LockClient) {
    (client(builder).await, client(builder).await)
}

/// Two independent clients of `servers` (a Cluster, Sentinel deployment or
/// Redlock masters), with the servers, which stop when dropped.
pub async fn two_clients_on<T: crate::topology::Topology>(
    servers: T,
) -> (T, LockClient, LockClient) {
    let (a, b) = two_clients(&servers.builder()).await;
    (servers, a, b)
}

/// Builds a client of the Redis at `url` with the builder's default settings.
pub async fn redis_url_client(url: impl Into<String>) -> Result<LockClient, LockError> {
    LockClient::builder().redis(url).build().await
}

/// A client of `server` with the builder's default settings.
pub async fn default_redis_client(server: &RedisServer) -> LockClient {
    redis_url_client(server.url())
        .await
        .expect("a redis client")
}

/// Builds `builder` with 500 ms connect and response timeouts.
pub async fn short_timeout_client(builder: LockClientBuilder) -> LockClient {
    builder
        .connect_timeout(ms(500))
        .response_timeout(ms(500))
        .build()
        .await
        .expect("a client with short timeouts")
}

/// The server's own compare-and-delete `client` releases with (`DELIFEQ`,
/// `DELEX`, or `None`: the script), checked against what the server says it
/// has ([`RedisServer::native_release`]), and the `INFO commandstats` name
/// to count it by (`delifeq` on a server without one: never counted).
pub fn checked_native_release(
    client: &LockClient,
    server: &RedisServer,
) -> (Option<&'static str>, String) {
    let native = lock_runtime::__private::testing::native_release(client);
    assert_eq!(
        native,
        server.native_release(),
        "the probe found the server's own"
    );
    (native, native.unwrap_or("delifeq").to_lowercase())
}

/// A client of `server` with 500 ms connect and response timeouts.
pub async fn redis_client(server: &RedisServer) -> LockClient {
    short_timeout_client(LockClient::builder().redis(server.url())).await
}

/// A client of the embedded backend.
pub async fn memory_client() -> LockClient {
    LockClient::builder()
        .memory()
        .build()
        .await
        .expect("a memory client")
}

/// When a waiter got the lock (`acquired`, the result of its acquire), which
/// it then releases at once: the far end of a handoff.
pub async fn held_at(acquired: Result<LockGuard, LockError>) -> Instant {
    let at = Instant::now();
    acquired
        .expect("the waiter gets the lock")
        .release()
        .await
        .expect("the waiter releases the lock");
    at
}

/// Spawns a waiter for `key` (a 10 s lease, waiting up to `wait`); its task
/// ends with [`held_at`].
pub fn spawn_waiter(client: &LockClient, key: &str, wait: Duration) -> JoinHandle<Instant> {
    let (client, key) = (client.clone(), key.to_owned());
    tokio::spawn(async move {
        held_at(client.lock(&key).ttl(secs(10)).wait(wait).acquire().await).await
    })
}

/// Asserts that waiters woke promptly after the releases (`latencies`, from
/// release to held): the median under `median_limit`, none over 2 s (a
/// waiter that slept that long missed the release notice and waited out a
/// poll). Prints both, labelled `what`.
pub fn assert_prompt_handoffs(what: &str, latencies: Vec<Duration>, median_limit: Duration) {
    let n = latencies.len();
    let (median, max) = summary(latencies);
    println!("{what}: median {median:?}, max {max:?} over {n} handoffs");
    assert!(median < median_limit, "{what}: median handoff {median:?}");
    assert!(
        max < secs(2),
        "{what}: a waiter slept {max:?}: it missed the notice"
    );
}

/// A try-once acquire of `key` with a fixed lease of `ttl` (no renewal): a
/// holder that, forgotten, lets the lease run out.
pub async fn fixed_lease(
    client: &LockClient,
    key: &str,
    ttl: Duration,
) -> Result<LockGuard, LockError> {
    client.lock(key).ttl(ttl).renew(false).acquire().await
}

/// Like [`fixed_lease`], waiting up to `wait` for the lock.
pub async fn fixed_lease_waiting(
    client: &LockClient,
    key: &str,
    ttl: Duration,
    wait: Duration,
) -> Result<LockGuard, LockError> {
    client
        .lock(key)
        .ttl(ttl)
        .renew(false)
        .wait(wait)
        .acquire()
        .await
}

/// Releases `holder` while `waiter` (see [`spawn_waiter`]) still waits for
/// the same lock, and returns how long after the release the waiter held it
/// (failing if it takes more than `limit`, or if the waiter got the lock
/// before the release).
pub async fn release_to_waiter(
    holder: LockGuard,
    waiter: JoinHandle<Instant>,
    limit: Duration,
) -> Duration {
    assert!(!waiter.is_finished(), "the waiter got a held lock");
    let released = Instant::now();
    holder.release().await.expect("the holder releases");
    let woke = within(limit, "the waiter wakes", waiter)
        .await
        .expect("the waiter's task");
    woke.saturating_duration_since(released)
}

/// Checks the end of a scenario in which a second client gets a lock that a
/// first still holds (the documented limits of Redlock and of Sentinel
/// failovers): acquires `second` (failing with `why` it should succeed), and
/// checks that the first holder has not noticed. Prints both fencing tokens,
/// then releases the second lock and drops the first.
pub async fn assert_two_holders(first: LockGuard, second: LockRequest, why: &str) {
    let second = second.acquire().await.expect(why);
    assert!(
        !first.is_lost(),
        "the first holder still believes it holds the lock"
    );
    // The first holder's token is minted on first use: on a server that
    // lost its key, it gets none (the server refuses a lease it does not
    // hold), which is what fencing needs.
    let first_token = match first.fencing_token().await {
        Ok(token) => token.to_string(),
        Err(e) => format!("none ({e})"),
    };
    println!(
        "two holders at once: tokens {first_token} and {}",
        second.fencing_token().await.unwrap()
    );
    second.release().await.expect("the second holder releases");
    drop(first);
}

/// Waits until none of `clients` renews a lease any more (their watchdogs
/// have stopped); fails after `limit`. Returns how long it took.
pub async fn watchdogs_stop(limit: Duration, clients: &[&LockClient]) -> Duration {
    eventually(limit, "watchdogs stop", || {
        clients.iter().all(|c| c.renewed_leases() == 0)
    })
    .await
}

/// Takes `key` with `client`, waiting up to `wait` (failing the test, with
/// `what`, if it stays busy), releases it at once, and returns how long after
/// `since` it was taken.
pub async fn taken_after(
    since: Instant,
    client: &LockClient,
    key: &str,
    wait: Duration,
    what: &str,
) -> Duration {
    let guard = within(wait + secs(1), what, client.lock(key).wait(wait).acquire())
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let at = since.elapsed();
    guard.release().await.expect("release the taken lock");
    at
}

/// What [`locked_read_modify_writes`] saw.
pub struct Increments {
    /// The count of the control run, without the lock.
    pub unlocked: u64,
    /// The fencing tokens of the locked increments, sorted.
    pub fences: Vec<u64>,
    /// How long the locked increments took.
    pub took: Duration,
}

/// A deliberately unprotected read-modify-write with a pause of `pause` in
/// the middle: concurrent callers lose updates unless something serializes
/// them.
async fn read_modify_write(value: &AtomicU64, pause: Duration) {
    let read = value.load(Ordering::SeqCst);
    tokio::task::yield_now().await;
    tokio::time::sleep(pause).await;
    value.store(read + 1, Ordering::SeqCst);
}

/// Runs `tasks` concurrent read-modify-writes of one counter, first without
/// a lock (a control: it must lose updates, so the locked count proves
/// something), then each under the lock `key` (task `i` on `clients[i %
/// clients.len()]`, each within `limit`). Asserts that no update was lost and
/// that never two tasks were inside at once.
pub async fn locked_read_modify_writes(
    clients: &[LockClient],
    key: &str,
    tasks: u64,
    pause: Duration,
    limit: Duration,
) -> Increments {
    let value = Arc::new(AtomicU64::new(0));
    let control: Vec<_> = (0..tasks)
        .map(|_| {
            let value = value.clone();
            tokio::spawn(async move { read_modify_write(&value, pause).await })
        })
        .collect();
    for task in control {
        task.await.unwrap();
    }
    let unlocked = value.load(Ordering::SeqCst);
    assert!(
        unlocked < tasks,
        "the control run without the lock counted {unlocked}"
    );

    let value = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicUsize::new(0));
    let most_inside = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let locked: Vec<_> = (0..tasks as usize)
        .map(|i| {
            let client = clients[i % clients.len()].clone();
            let (key, value, inside, most_inside) = (
                key.to_owned(),
                value.clone(),
                inside.clone(),
                most_inside.clone(),
            );
            tokio::spawn(async move {
                client
                    .lock(&key)
                    .ttl(secs(5))
                    .wait(secs(30))
                    .run(async {
                        let now_inside = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        most_inside.fetch_max(now_inside, Ordering::SeqCst);
                        read_modify_write(&value, pause).await;
                        inside.fetch_sub(1, Ordering::SeqCst);
                        lock_runtime::current_lock()
                            .expect("inside the lock")
                            .fencing_token()
                            .await
                            .unwrap()
                    })
                    .await
                    .expect("every task gets the lock")
            })
        })
        .collect();
    let mut fences = Vec::new();
    for task in locked {
        fences.push(within(limit, "a locked increment", task).await.unwrap());
    }
    let took = started.elapsed();
    assert_eq!(value.load(Ordering::SeqCst), tasks, "no update lost");
    assert_eq!(
        most_inside.load(Ordering::SeqCst),
        1,
        "two tasks were inside at once"
    );
    fences.sort_unstable();
    Increments {
        unlocked,
        fences,
        took,
    }
}

/// Takes `key` (trying once, default lease) and releases it at once: its
/// fencing token.
pub async fn lock_and_release(client: &LockClient, key: &str) -> u64 {
    let guard = client.lock(key).acquire().await.expect("take the lock");
    let fence = guard.fencing_token().await.unwrap();
    guard.release().await.expect("release the lock");
    fence
}

/// A runtime of one worker thread, for a "process" of its own inside a test
/// (its own runtime and clients, shut down without clean-up like a crash).
pub fn one_worker_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a one-worker runtime")
}

/// `clients` independent clients of `server` (as many processes), each in a
/// task of its own, take the lock that `request` asks for `rounds` times in
/// a loop and run `work` inside each time; fails unless every task is done
/// within `limit`. Returns the counts of holders inside at once seen over
/// the run (`{1}` for a mutex; up to the permits for a semaphore).
pub async fn holders_in_a_loop<R, W, F>(
    server: &RedisServer,
    clients: usize,
    rounds: usize,
    limit: Duration,
    request: R,
    work: W,
) -> BTreeSet<usize>
where
    R: Fn(&LockClient) -> LockRequest + Send + Sync + 'static,
    W: Fn() -> F + Send + Sync + 'static,
    F: Future<Output = ()> + Send,
{
    let (request, work) = (Arc::new(request), Arc::new(work));
    let inside = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let client = redis_client(server).await;
        let (request, work, inside, seen) =
            (request.clone(), work.clone(), inside.clone(), seen.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..rounds {
                let guard = request(&client).acquire().await?;
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                seen.lock().expect("the seen counts").insert(now);
                work().await;
                inside.fetch_sub(1, Ordering::SeqCst);
                guard.release().await?;
            }
            Ok::<_, LockError>(())
        }));
    }
    for task in tasks {
        within(limit, "a client's loop", task)
            .await
            .expect("a client's task")
            .unwrap_or_else(|e| panic!("a client's loop: {e:?}"));
    }
    seen.lock().expect("the seen counts").clone()
}
