//! What `#[distributed_lock]` does at run time, on a real `redis-server` and on
//! the embedded backend: every scenario runs on both.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lock_runtime::__private::testing::force_delete;
use lock_runtime::{LockClient, LockError, distributed_lock};
use test_support::RedisServer;
use tokio::sync::Barrier;

#[derive(Debug)]
enum AppError {
    Lock(LockError),
    Declined,
    Timeout,
}

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError::Lock(e)
    }
}

impl AppError {
    fn into_lock(self) -> LockError {
        match self {
            AppError::Lock(e) => e,
            other => panic!("expected a lock error, got {other:?}"),
        }
    }
}

/// The fencing token of the innermost lock this task holds.
async fn fence() -> u64 {
    lock_runtime::current_lock()
        .expect("the body runs inside the lock")
        .fencing_token()
        .await
        .unwrap()
}

/// A service whose methods are locked per order, counting who is inside.
struct Orders {
    locks: LockClient,
    tenant: &'static str,
    inside: AtomicUsize,
    max_inside: AtomicUsize,
    entered: AtomicUsize,
    finished: AtomicUsize,
}

impl Orders {
    fn new(locks: LockClient) -> Arc<Self> {
        Arc::new(Self {
            locks,
            tenant: "acme",
            inside: AtomicUsize::new(0),
            max_inside: AtomicUsize::new(0),
            entered: AtomicUsize::new(0),
            finished: AtomicUsize::new(0),
        })
    }

    fn enter(&self) {
        let now = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_inside.fetch_max(now, Ordering::SeqCst);
        self.entered.fetch_add(1, Ordering::SeqCst);
    }

    fn leave(&self) {
        self.inside.fetch_sub(1, Ordering::SeqCst);
        self.finished.fetch_add(1, Ordering::SeqCst);
    }

    async fn hold(&self, hold: Duration) -> u64 {
        self.enter();
        tokio::time::sleep(hold).await;
        self.leave();
        fence().await
    }

    /// Waits up to 5 s for the order's lock.
    #[distributed_lock(key = "{<self.tenant>}:order:<order_id>", client = self.locks, wait = "5s")]
    async fn pay(&self, order_id: u64, hold: Duration) -> Result<u64, AppError> {
        Ok(self.hold(hold).await)
    }

    /// Tries the order's lock once.
    #[distributed_lock(key = "{<self.tenant>}:order:<order_id>", client = self.locks)]
    async fn try_pay(&self, order_id: u64, hold: Duration) -> Result<u64, AppError> {
        Ok(self.hold(hold).await)
    }

    /// Meets another call at `barrier` while holding the order's lock: two
    /// calls only meet if they hold their locks at the same time.
    #[distributed_lock(key = "{<self.tenant>}:order:<order_id>", client = self.locks, wait = "5s")]
    async fn meet(&self, order_id: u64, barrier: Arc<Barrier>) -> Result<(), AppError> {
        tokio::time::timeout(Duration::from_secs(5), barrier.wait())
            .await
            .map_err(|_| AppError::Timeout)?;
        Ok(())
    }

    /// Calls two locked methods for the same order while holding its lock.
    #[distributed_lock(key = "{<self.tenant>}:order:<order_id>", client = self.locks)]
    async fn pay_twice(&self, order_id: u64) -> Result<[u64; 3], AppError> {
        let outer = fence().await;
        let tried = self.try_pay(order_id, Duration::ZERO).await?;
        let waited = self.pay(order_id, Duration::ZERO).await?;
        Ok([outer, tried, waited])
    }

    /// A renewed 300 ms lease around 10 s of work.
    #[distributed_lock(key = "{<self.tenant>}:job:<name>", client = self.locks, ttl = "300ms")]
    async fn long_job(&self, name: &str) -> Result<(), AppError> {
        self.hold(Duration::from_secs(10)).await;
        Ok(())
    }

    /// A fixed (not renewed) 200 ms lease around 10 s of work.
    #[distributed_lock(
        key = "{<self.tenant>}:fixed:<name>",
        client = self.locks,
        ttl = "200ms",
        renew = false
    )]
    async fn fixed_lease_job(&self, name: &str) -> Result<(), AppError> {
        self.hold(Duration::from_secs(10)).await;
        Ok(())
    }

    /// Fails with its own error, or panics.
    #[distributed_lock(key = "{<self.tenant>}:order:<order_id>", client = self.locks)]
    async fn fail(&self, order_id: u64, panic: bool) -> Result<(), AppError> {
        assert!(!panic, "the body panics");
        Err(AppError::Declined)
    }

    /// The key the body runs under.
    #[distributed_lock(key = "{<self.tenant>}:order:<order.id>:<order.lines.0>", client = &self.locks)]
    async fn key_of(&self, order: &Order) -> Result<String, AppError> {
        Ok(lock_runtime::current_lock().expect("inside").key)
    }

    /// A key rendered from an arbitrary string.
    #[distributed_lock(key = "note:<text>", client = self.locks)]
    async fn note(&self, text: &str) -> Result<(), AppError> {
        self.enter();
        self.leave();
        Ok(())
    }

    /// `self` by value: the client and key are taken before the body moves it.
    #[distributed_lock(key = "{<self.tenant>}:close", client = self.locks)]
    async fn close(self: Arc<Self>) -> Result<usize, AppError> {
        Ok(Arc::strong_count(&self))
    }
}

struct Order {
    id: u64,
    lines: (u32, u32),
}

/// Polls `cond` until it holds, for at most 5 s.
async fn until(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Checks that `key` is free now or very soon (a background release may be in
/// flight): every guard was released, none leaked.
async fn assert_released(client: &LockClient, key: &str) {
    let guard = client
        .lock(key)
        .wait(Duration::from_secs(2))
        .acquire()
        .await
        .unwrap_or_else(|e| panic!("`{key}` should have been released: {e}"));
    guard.release().await.unwrap();
    until("every watchdog stopped", || client.renewed_leases() == 0).await;
}

/// Runs `scenario` against a fresh `redis-server` and against the embedded
/// backend, as two tests.
macro_rules! on_both_backends {
    ($(#[$doc:meta])* async fn $name:ident($client:ident: LockClient) $body:block) => {
        mod $name {
            use super::*;

            $(#[$doc])*
            async fn scenario($client: LockClient) $body

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn on_redis() {
                let server = RedisServer::start();
                let client = LockClient::builder().redis(server.url()).build().await.unwrap();
                scenario(client).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn on_memory() {
                let client = LockClient::builder().memory().build().await.unwrap();
                scenario(client).await;
            }
        }
    };
}

on_both_backends! {
    /// Two concurrent calls for one order: the second waits for the first
    /// (`wait = "5s"`), and they never overlap.
    async fn same_key_calls_are_serialized(client: LockClient) {
        let orders = Orders::new(client.clone());
        let hold = Duration::from_millis(150);
        let started = Instant::now();
        let calls: Vec<_> = (0..2)
            .map(|_| {
                let orders = orders.clone();
                tokio::spawn(async move { orders.pay(1, hold).await })
            })
            .collect();
        let mut fences = Vec::new();
        for call in calls {
            fences.push(call.await.unwrap().unwrap());
        }
        fences.sort();
        assert_eq!(fences, [1, 2]);
        assert_eq!(orders.max_inside.load(Ordering::SeqCst), 1, "the calls overlapped");
        assert!(started.elapsed() >= hold * 2);
        assert_released(&client, "{acme}:order:1").await;
    }
}

on_both_backends! {
    /// Without `wait`, a call for an order that is being paid fails at once
    /// with `Busy`, converted into the function's error type.
    async fn same_key_without_wait_is_busy(client: LockClient) {
        let orders = Orders::new(client.clone());
        let first = tokio::spawn({
            let orders = orders.clone();
            async move { orders.pay(1, Duration::from_millis(500)).await }
        });
        until("the first call is inside", || orders.entered.load(Ordering::SeqCst) == 1).await;
        let tried = Instant::now();
        let e = orders.try_pay(1, Duration::ZERO).await.unwrap_err().into_lock();
        assert!(tried.elapsed() < Duration::from_millis(400), "try-once waited");
        match &e {
            LockError::Busy { key, retry_after } => {
                assert_eq!(key, "{acme}:order:1");
                assert!(*retry_after > Duration::ZERO && *retry_after <= Duration::from_secs(30));
            }
            other => panic!("expected Busy, got {other:?}"),
        }
        assert_eq!(orders.entered.load(Ordering::SeqCst), 1, "the busy call ran its body");
        first.await.unwrap().unwrap();
        // Free again: trying once now succeeds.
        orders.try_pay(1, Duration::ZERO).await.unwrap();
        assert_released(&client, "{acme}:order:1").await;
    }
}

on_both_backends! {
    /// Calls for two orders hold their locks at the same time (they meet at a
    /// barrier inside, which two serialized calls never could).
    async fn different_keys_run_in_parallel(client: LockClient) {
        let orders = Orders::new(client.clone());
        let barrier = Arc::new(Barrier::new(2));
        let a = tokio::spawn({
            let (orders, barrier) = (orders.clone(), barrier.clone());
            async move { orders.meet(1, barrier).await }
        });
        let b = tokio::spawn({
            let (orders, barrier) = (orders.clone(), barrier.clone());
            async move { orders.meet(2, barrier).await }
        });
        a.await.unwrap().unwrap();
        b.await.unwrap().unwrap();
        assert_released(&client, "{acme}:order:1").await;
        assert_released(&client, "{acme}:order:2").await;
    }
}

on_both_backends! {
    /// A locked method calling locked methods with the same key re-enters
    /// (the inner `try_pay` would be `Busy` otherwise, and `pay` would wait
    /// for itself), under the same fencing token.
    async fn nested_same_key_calls_reenter(client: LockClient) {
        let orders = Orders::new(client.clone());
        let started = Instant::now();
        let [outer, tried, waited] = orders.pay_twice(9).await.unwrap();
        assert_eq!(outer, 1);
        assert_eq!((tried, waited), (outer, outer));
        assert!(started.elapsed() < Duration::from_secs(4), "the inner call waited");
        assert_eq!(orders.finished.load(Ordering::SeqCst), 2);
        // The outer call released it; the inner ones did not release early.
        assert_released(&client, "{acme}:order:9").await;
        // Another task is not the holder: it does not re-enter.
        let holder = client.lock("{acme}:order:9").acquire().await.unwrap();
        let e = tokio::spawn({
            let orders = orders.clone();
            async move { orders.try_pay(9, Duration::ZERO).await }
        })
        .await
        .unwrap()
        .unwrap_err()
        .into_lock();
        assert!(e.is_busy(), "{e:?}");
        holder.release().await.unwrap();
    }
}

on_both_backends! {
    /// When the lease is lost mid-way (an operator deletes the lock), the body
    /// is cancelled and the call returns `Lost` within about ttl/3.
    async fn lost_lease_cancels_the_body(client: LockClient) {
        let orders = Orders::new(client.clone());
        let job = tokio::spawn({
            let orders = orders.clone();
            async move { orders.long_job("nightly").await }
        });
        until("the job is inside", || orders.entered.load(Ordering::SeqCst) == 1).await;
        let deleted = Instant::now();
        force_delete(&client, "{acme}:job:nightly").await.unwrap();
        let result = tokio::time::timeout(Duration::from_secs(5), job)
            .await
            .expect("the lost lease ends the call long before the 10 s body")
            .unwrap();
        let noticed = deleted.elapsed();
        println!("lease loss noticed after {noticed:?} (ttl 300ms)");
        match result.unwrap_err().into_lock() {
            LockError::Lost { key } => assert_eq!(key, "{acme}:job:nightly"),
            other => panic!("expected Lost, got {other:?}"),
        }
        assert_eq!(orders.finished.load(Ordering::SeqCst), 0, "the body ran to its end");
        assert_eq!(orders.inside.load(Ordering::SeqCst), 1, "the body was not cancelled mid-way");
        until("every watchdog stopped", || client.renewed_leases() == 0).await;
    }
}

on_both_backends! {
    /// `renew = false`: the body is cancelled when the fixed lease runs out.
    async fn a_fixed_lease_ends_the_body_when_it_runs_out(client: LockClient) {
        let orders = Orders::new(client.clone());
        let started = Instant::now();
        let e = tokio::time::timeout(Duration::from_secs(5), orders.fixed_lease_job("report"))
            .await
            .expect("the fixed lease ends the call long before the 10 s body")
            .unwrap_err()
            .into_lock();
        assert!(e.is_lost(), "{e:?}");
        assert!(started.elapsed() >= Duration::from_millis(150), "lost before the lease ran out");
        assert_eq!(orders.finished.load(Ordering::SeqCst), 0);
        assert_released(&client, "{acme}:fixed:report").await;
    }
}

on_both_backends! {
    /// Every call gets a fencing token above the previous one, also after a
    /// failed call.
    async fn fencing_tokens_increase_across_calls(client: LockClient) {
        let orders = Orders::new(client.clone());
        let mut last = 0;
        for i in 0..5 {
            if i == 2 {
                // A failed call between them (which asked for no token).
                orders.fail(3, false).await.unwrap_err();
            }
            let fence = orders.pay(3, Duration::ZERO).await.unwrap();
            assert!(fence > last, "token {fence} after {last}");
            last = fence;
        }
        let other = client.lock("{acme}:order:3").acquire().await.unwrap();
        assert!(other.fencing_token().await.unwrap() > last);
        other.release().await.unwrap();
    }
}

on_both_backends! {
    /// The lock is released when the body returns its own error, panics, or
    /// when the caller drops the call half-way.
    async fn the_lock_is_released_on_error_panic_and_cancellation(client: LockClient) {
        let orders = Orders::new(client.clone());
        assert!(matches!(orders.fail(5, false).await, Err(AppError::Declined)));
        assert_released(&client, "{acme}:order:5").await;

        let panicked = tokio::spawn({
            let orders = orders.clone();
            async move { orders.fail(5, true).await }
        })
        .await
        .unwrap_err();
        assert!(panicked.is_panic());
        assert_released(&client, "{acme}:order:5").await;

        let cancelled = tokio::time::timeout(
            Duration::from_millis(100),
            orders.pay(5, Duration::from_secs(10)),
        )
        .await;
        assert!(cancelled.is_err());
        assert_released(&client, "{acme}:order:5").await;
    }
}

on_both_backends! {
    /// Keys come from parameters, fields, tuple fields and `self`, braces kept
    /// (a hash tag); `self` by value works; a rendered key the runtime refuses
    /// is an `InvalidKey` error and the body does not run.
    async fn the_key_is_rendered_from_the_arguments(client: LockClient) {
        let orders = Orders::new(client.clone());
        let order = Order { id: 7, lines: (3, 4) };
        assert_eq!(orders.key_of(&order).await.unwrap(), "{acme}:order:7:3");
        assert_eq!(orders.clone().close().await.unwrap(), 2);
        orders.note("fine").await.unwrap();
        let e = orders.note("line\nbreak").await.unwrap_err().into_lock();
        assert!(e.is_invalid_key(), "{e:?}");
        let e = orders.note(&"x".repeat(2000)).await.unwrap_err().into_lock();
        assert!(e.is_invalid_key(), "{e:?}");
        assert_eq!(orders.entered.load(Ordering::SeqCst), 1, "a refused key ran the body");
    }
}

// The synchronizer options (`rw`, `permits`, `keys`), on the embedded backend:
// what the attribute adds is which request it builds; the family's own tests
// run each primitive on every backend.

/// A service whose methods take each kind of lock. Two calls "meet" when
/// both are inside at once, which they can only be if the lock admits both.
struct Shop {
    locks: LockClient,
}

/// Where the calls that hold a lock wait: `inside` until every holder and the
/// test are in, `leave` until the test lets them go.
#[derive(Clone)]
struct Meeting {
    inside: Arc<Barrier>,
    leave: Arc<Barrier>,
}

impl Meeting {
    /// For `holders` calls and the test.
    fn new(holders: usize) -> Self {
        Self {
            inside: Arc::new(Barrier::new(holders + 1)),
            leave: Arc::new(Barrier::new(holders + 1)),
        }
    }

    /// In a holder: wait for the others, then for the test.
    async fn attend(&self) -> Result<(), AppError> {
        for barrier in [&self.inside, &self.leave] {
            tokio::time::timeout(Duration::from_secs(5), barrier.wait())
                .await
                .map_err(|_| AppError::Timeout)?;
        }
        Ok(())
    }

    /// In the test: every holder is inside at once (or panics saying `what`).
    async fn all_inside(&self, what: &str) {
        tokio::time::timeout(Duration::from_secs(5), self.inside.wait())
            .await
            .unwrap_or_else(|_| panic!("{what}"));
    }

    /// In the test: let every holder go.
    async fn dismiss(&self) {
        self.leave.wait().await;
    }
}

impl Shop {
    fn new(locks: LockClient) -> Arc<Self> {
        Arc::new(Self { locks })
    }

    #[distributed_lock(key = "catalog:<id>", rw = "read", client = self.locks, wait = "5s")]
    async fn read(&self, id: u64, meeting: Meeting) -> Result<(), AppError> {
        meeting.attend().await
    }

    /// The key the body runs under.
    #[distributed_lock(key = "catalog:<id>", rw = "read", client = self.locks)]
    async fn try_read(&self, id: u64) -> Result<String, AppError> {
        Ok(lock_runtime::current_lock().expect("inside").key)
    }

    #[distributed_lock(key = "catalog:<id>", rw = "write", client = self.locks)]
    async fn try_write(&self, id: u64) -> Result<String, AppError> {
        Ok(lock_runtime::current_lock().expect("inside").key)
    }

    #[distributed_lock(key = "exports:<tenant>", permits = 2, client = self.locks, wait = "5s")]
    async fn export(&self, tenant: &str, meeting: Meeting) -> Result<(), AppError> {
        meeting.attend().await
    }

    #[distributed_lock(key = "exports:<tenant>", permits = 2, client = self.locks)]
    async fn try_export(&self, tenant: &str) -> Result<String, AppError> {
        Ok(lock_runtime::current_lock().expect("inside").key)
    }

    /// Holds both accounts; says, from another task, whether each one's
    /// plain lock is busy meanwhile.
    #[distributed_lock(keys = ["account:<from>", "account:<to>"], client = self.locks)]
    async fn transfer(&self, from: u64, to: u64) -> Result<[bool; 2], AppError> {
        let mut busy = [false; 2];
        for (i, account) in [from, to].into_iter().enumerate() {
            busy[i] = try_elsewhere(&self.locks, format!("account:{account}"))
                .await
                .is_err_and(|e| e.is_busy());
        }
        Ok(busy)
    }
}

/// Tries the plain lock `key` once from another task (not the holder's, so
/// nothing re-enters), releasing it if taken.
async fn try_elsewhere(client: &LockClient, key: String) -> Result<(), LockError> {
    let client = client.clone();
    tokio::spawn(async move { client.lock(key).acquire().await?.release().await })
        .await
        .unwrap()
}

/// A call made from another task, as a concurrent caller would.
async fn elsewhere<T: Send + 'static>(
    call: impl Future<Output = Result<T, AppError>> + Send + 'static,
) -> Result<T, AppError> {
    tokio::spawn(call).await.unwrap()
}

async fn memory() -> LockClient {
    LockClient::builder().memory().build().await.unwrap()
}

/// `rw = "read"`: two readers hold one entry together; a writer trying
/// meanwhile is `Busy`, another reader is let in, and once the readers are
/// out the writer gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_the_lock_and_a_writer_is_kept_out() {
    let shop = Shop::new(memory().await);
    let meeting = Meeting::new(2);
    let readers: Vec<_> = (0..2)
        .map(|_| {
            tokio::spawn({
                let (shop, meeting) = (shop.clone(), meeting.clone());
                async move { shop.read(7, meeting).await }
            })
        })
        .collect();
    meeting
        .all_inside("two readers did not hold `catalog:7` at once")
        .await;
    let e = elsewhere({
        let shop = shop.clone();
        async move { shop.try_write(7).await }
    })
    .await
    .unwrap_err()
    .into_lock();
    assert!(e.is_busy(), "a writer got in beside readers: {e:?}");
    let third = elsewhere({
        let shop = shop.clone();
        async move { shop.try_read(7).await }
    })
    .await;
    assert_eq!(third.unwrap(), "catalog:7", "a third reader was kept out");
    meeting.dismiss().await;
    for reader in readers {
        reader.await.unwrap().unwrap();
    }
    assert_eq!(shop.try_write(7).await.unwrap(), "catalog:7");
}

/// `rw = "write"`: while a writer holds the entry, a reader is `Busy`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_keeps_readers_out() {
    let client = memory().await;
    let shop = Shop::new(client.clone());
    let writer = client.rw_lock("catalog:8").write().acquire().await.unwrap();
    let e = elsewhere({
        let shop = shop.clone();
        async move { shop.try_read(8).await }
    })
    .await
    .unwrap_err()
    .into_lock();
    assert!(e.is_busy(), "{e:?}");
    writer.release().await.unwrap();
    assert_eq!(shop.try_read(8).await.unwrap(), "catalog:8");
}

/// `permits = 2`: two calls hold the semaphore at once, a third is `Busy`,
/// and once one leaves there is room again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_admit_that_many_holders_and_no_more() {
    let shop = Shop::new(memory().await);
    let meeting = Meeting::new(2);
    let exports: Vec<_> = (0..2)
        .map(|_| {
            tokio::spawn({
                let (shop, meeting) = (shop.clone(), meeting.clone());
                async move { shop.export("acme", meeting).await }
            })
        })
        .collect();
    meeting
        .all_inside("two holders of `permits = 2` were not inside at once")
        .await;
    let e = elsewhere({
        let shop = shop.clone();
        async move { shop.try_export("acme").await }
    })
    .await
    .unwrap_err()
    .into_lock();
    assert!(e.is_busy(), "a third holder got one of 2 permits: {e:?}");
    meeting.dismiss().await;
    for export in exports {
        export.await.unwrap().unwrap();
    }
    assert_eq!(shop.try_export("acme").await.unwrap(), "exports:acme");
}

/// `keys = [...]`: the body runs holding every key's plain lock, and they
/// are all free again after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_hold_every_lock_while_the_body_runs() {
    let client = memory().await;
    let shop = Shop::new(client.clone());
    assert_eq!(shop.transfer(1, 2).await.unwrap(), [true, true]);
    // Named the other way round: the same two locks.
    assert_eq!(shop.transfer(2, 1).await.unwrap(), [true, true]);
    assert_released(&client, "account:1").await;
    assert_released(&client, "account:2").await;
}

/// `keys = [...]` whose templates render one key (a transfer from an
/// account to itself): that lock, taken once, not a `Config` error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_that_render_the_same_key_take_it_once() {
    let client = memory().await;
    let shop = Shop::new(client.clone());
    assert_eq!(shop.transfer(5, 5).await.unwrap(), [true, true]);
    assert_released(&client, "account:5").await;
}

/// `keys = [...]`: when one key is taken, trying once is `Busy`, the body
/// does not run, and the other key is not left held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_take_none_when_one_is_busy() {
    let client = memory().await;
    let shop = Shop::new(client.clone());
    let held = client.lock("account:4").acquire().await.unwrap();
    let e = elsewhere({
        let shop = shop.clone();
        async move { shop.transfer(3, 4).await }
    })
    .await
    .unwrap_err()
    .into_lock();
    assert!(e.is_busy(), "{e:?}");
    try_elsewhere(&client, "account:3".into())
        .await
        .expect("`account:3` was left held after a failed `keys` acquire");
    held.release().await.unwrap();
    assert_eq!(shop.transfer(3, 4).await.unwrap(), [true, true]);
}
