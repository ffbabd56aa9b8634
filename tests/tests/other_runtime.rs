//! A client used from another tokio runtime than the one it was built in
//! (a global client filled by the first `#[tokio::test]`, a client built in
//! a setup runtime), and a guard that outlives the runtime it was acquired
//! in. Its background tasks (watchdog, notices) died with their runtime:
//!
//! * the client restarts them on the runtime in use, so a lease taken there
//!   is renewed (held for three leases, still ours);
//! * a guard whose watchdog is gone is lost once its lease may have run out:
//!   `is_lost()`, `lost()` and `release()` follow the lease's own deadline,
//!   not only a message from the task.
//!
//! Every scenario runs on the embedded backend, one Redis, Sentinel, Cluster
//! and Redlock (three masters). A Redis Cluster connection cannot move to
//! another runtime (redis-rs drives it from a task of the runtime it was
//! opened in): there, acquire fails with an error that says so, and the lease
//! taken before is lost at its deadline all the same. The tests are plain
//! `#[test]`s: they make and end runtimes themselves.

use std::any::Any;
use std::time::Instant;

use lock_runtime::{LockClient, LockClientBuilder, LockError, distributed_lock};
use test_support::RedisServer;
use test_support::helpers::*;
use test_support::topology::{Cluster, Redlock, SentinelSetup, Topology};

/// Servers kept up for one test (dropped at its end), and a builder for them.
type Setup = (Box<dyn Any>, LockClientBuilder);

fn memory() -> Setup {
    (Box::new(()), LockClient::builder().memory())
}

fn redis() -> Setup {
    let server = RedisServer::start();
    let builder = LockClient::builder().redis(server.url());
    (Box::new(server), builder)
}

fn sentinel() -> Setup {
    let (topology, builder) = SentinelSetup::start().with_builder();
    (Box::new(topology), builder)
}

fn cluster() -> Setup {
    let (topology, builder) = Cluster::start(3).with_builder();
    (Box::new(topology), builder)
}

fn redlock() -> Setup {
    let (topology, builder) = Redlock::start(3).with_builder();
    (Box::new(topology), builder)
}

/// One test per scenario and backend: `<backend>::<scenario>`.
macro_rules! every_backend {
    ($($scenario:ident),* $(,)?) => {
        every_backend!(@backend memory; $($scenario),*);
        every_backend!(@backend redis; $($scenario),*);
        every_backend!(@backend sentinel; $($scenario),*);
        every_backend!(@backend cluster; $($scenario),*);
        every_backend!(@backend redlock; $($scenario),*);
    };
    (@backend $backend:ident; $($scenario:ident),*) => {
        mod $backend {
            $(
                #[test]
                fn $scenario() {
                    let (servers, builder) = super::$backend();
                    super::$scenario(builder, stringify!($backend));
                    drop(servers);
                }
            )*
        }
    };
}

every_backend! {
    a_client_built_in_an_ended_runtime_renews_its_leases_in_the_runtime_in_use,
    a_guard_that_outlived_its_runtime_is_lost_once_its_lease_may_have_run_out,
    lost_resolves_at_the_end_of_a_lease_nothing_renews,
    run_is_cancelled_at_the_lease_deadline_when_the_runtime_of_the_clients_tasks_ends,
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// A client built in a runtime that has ended by the time it is returned.
fn built_in_an_ended_runtime(builder: &LockClientBuilder) -> LockClient {
    let setup = runtime();
    let client = setup.block_on(client(builder));
    drop(setup);
    client
}

/// Whether another task of `client` finds `key` taken (a try-once acquire is
/// busy; one that succeeds is released at once).
async fn taken_for_another_task(client: &LockClient, key: &str) -> bool {
    let (client, key) = (client.clone(), key.to_owned());
    let tried = tokio::spawn(async move { client.lock(&key).acquire().await })
        .await
        .expect("the probe task");
    match tried {
        Err(LockError::Busy { .. }) => true,
        Ok(guard) => {
            guard.release().await.expect("release the probe");
            false
        }
        Err(e) => panic!("the probe failed: {e}"),
    }
}

/// Whether a client of `backend` cannot move to another runtime.
fn stays_on_its_runtime(backend: &str) -> bool {
    backend == "cluster"
}

fn a_client_built_in_an_ended_runtime_renews_its_leases_in_the_runtime_in_use(
    builder: LockClientBuilder,
    backend: &str,
) {
    let client = built_in_an_ended_runtime(&builder);
    runtime().block_on(async {
        let key = key("other-runtime-renewed");
        let acquired = client.lock(&key).ttl(secs(1)).acquire().await;
        if stays_on_its_runtime(backend) {
            let e = acquired.expect_err("a cluster client acquired from another runtime");
            println!("[{backend}] {e}");
            assert!(
                matches!(&e, LockError::Backend(_)) && e.to_string().contains("runtime"),
                "the error does not name the cause: {e}"
            );
            // Again, not only the first time.
            let again = client.lock(&key).acquire().await;
            assert!(again.is_err_and(|e| e.to_string().contains("runtime")));
            return;
        }
        let guard = acquired.unwrap();
        tokio::time::sleep(ms(1500)).await;
        assert!(
            !guard.is_lost(),
            "lost after 1.5 s of a 1 s lease: nothing renewed it"
        );
        tokio::time::sleep(ms(1500)).await;
        assert!(!guard.is_lost(), "lost after three leases");
        assert!(
            taken_for_another_task(&client, &key).await,
            "the key was free after three renewed leases"
        );
        guard
            .release()
            .await
            .expect("the key was still ours after three leases");
        // The notices work as well: a waiter of this client wakes at a release.
        let guard = client.lock(&key).acquire().await.unwrap();
        let waiter = spawn_waiter(&client, &key, secs(10));
        tokio::time::sleep(ms(200)).await;
        let released = Instant::now();
        guard.release().await.unwrap();
        let woke = waiter.await.unwrap().duration_since(released);
        println!("a waiter held {woke:?} after the release");
        // Without notices it would sleep to the holder's 30 s lease, past its
        // 10 s wait; woken, it takes well under a second (Redlock's retry
        // may pause after a split vote, and CI runs this beside other tests:
        // 680 ms seen there).
        assert!(
            woke < secs(3),
            "woken {woke:?} after a release (no notice?)"
        );
    });
}

fn a_guard_that_outlived_its_runtime_is_lost_once_its_lease_may_have_run_out(
    builder: LockClientBuilder,
    backend: &str,
) {
    let key = key("outlived");
    let first = runtime();
    let (client, guard) = first.block_on(async {
        let client = client(&builder).await;
        let guard = client.lock(&key).ttl(secs(1)).acquire().await.unwrap();
        (client, guard)
    });
    drop(first);
    std::thread::sleep(ms(1500));
    assert!(
        guard.is_lost(),
        "1.5 s into a 1 s lease nothing renewed, is_lost() still says false"
    );
    runtime().block_on(async {
        within(ms(100), "lost() of a guard past its lease", guard.lost()).await;
        // Anyone may hold the key by now: this client's other task does (a
        // cluster client built here, where the first cannot move).
        let next = if stays_on_its_runtime(backend) {
            test_support::helpers::client(&builder).await
        } else {
            client.clone()
        };
        let other = next.lock(&key).wait(secs(2)).acquire().await;
        let other = other.expect("the key is free once the lease ran out");
        let released = guard.release().await;
        assert!(
            matches!(released, Err(LockError::Lost { .. })),
            "release of a guard past its lease: {released:?}"
        );
        other.release().await.expect("release the next holder");
    });
}

fn lost_resolves_at_the_end_of_a_lease_nothing_renews(builder: LockClientBuilder, _: &str) {
    let key = key("lost-at-the-end");
    let first = runtime();
    let (client, guard, acquired) = first.block_on(async {
        let client = client(&builder).await;
        let acquired = Instant::now();
        let guard = client.lock(&key).ttl(secs(1)).acquire().await.unwrap();
        (client, guard, acquired)
    });
    drop(first);
    runtime().block_on(async {
        assert!(!guard.is_lost(), "lost within its lease");
        within(secs(3), "lost() of a lease nothing renews", guard.lost()).await;
        let at = acquired.elapsed();
        println!("lost() resolved {at:?} after the acquire of a 1 s lease");
        assert!(at >= ms(900), "lost() resolved at {at:?}, within the lease");
        assert!(at < ms(1400), "lost() resolved only at {at:?}");
        drop(guard);
        drop(client);
    });
}

fn run_is_cancelled_at_the_lease_deadline_when_the_runtime_of_the_clients_tasks_ends(
    builder: LockClientBuilder,
    _: &str,
) {
    // The client lives in one runtime (its watchdog runs there), the work in
    // another; the first ends while the work holds the lock.
    let tasks = runtime();
    let client = tasks.block_on(client(&builder));
    let work = runtime();
    let key = key("run-cancelled");
    let started = Instant::now();
    let running = work.spawn(async move {
        let work = async {
            tokio::time::sleep(secs(4)).await;
            "finished"
        };
        client.lock(&key).ttl(secs(1)).run(work).await
    });
    std::thread::sleep(ms(200));
    drop(tasks);
    let outcome = work.block_on(running).expect("the work task");
    let at = started.elapsed();
    println!("run answered {outcome:?} after {at:?} (1 s lease, 4 s of work)");
    assert!(
        matches!(outcome, Err(LockError::Lost { .. })),
        "run answered {outcome:?} after its lease ended unrenewed"
    );
    assert!(at >= ms(900), "cancelled at {at:?}, within the lease");
    assert!(at < ms(1500), "cancelled only at {at:?}");
}

/// Holds `job`'s lock (1 s lease) for 3 s through the global client, and
/// answers whether its lease was still good at the end.
#[distributed_lock(key = "global-job:<job>", ttl = "1s")]
async fn hold_three_leases(job: u64) -> Result<bool, LockError> {
    tokio::time::sleep(secs(3)).await;
    Ok(lock_runtime::current_lock().is_some())
}

/// The global client as the first `#[tokio::test]` of a binary leaves it:
/// filled in a runtime that has ended, then used by the attribute in another.
/// The only test of this binary that sets the global client.
#[test]
fn the_attribute_renews_its_lease_on_a_global_client_filled_in_an_ended_runtime() {
    let server = RedisServer::start();
    let builder = LockClient::builder().redis(server.url());
    lock_runtime::set_global_client(built_in_an_ended_runtime(&builder));
    runtime().block_on(async {
        let observer = client(&builder).await;
        let job = std::process::id().into();
        let held = tokio::spawn(hold_three_leases(job));
        tokio::time::sleep(ms(2000)).await;
        assert!(
            is_held(&observer, &format!("global-job:{job}")).await,
            "the key was free 2 s into a 1 s lease the watchdog should renew"
        );
        let outcome = held.await.expect("the locked task");
        assert!(
            matches!(outcome, Ok(true)),
            "the attribute's work answered {outcome:?} (lost?)"
        );
    });
}
