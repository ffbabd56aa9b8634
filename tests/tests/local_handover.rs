//! Local hand-over on a real `redis-server`: the tasks of one client that want
//! one key form a line, one of them acquires on the server and the others are
//! handed the lease in-process (`lock_runtime`'s `client::local`). Each test
//! starts its own server; hot-key loops run for about a second and assert on
//! counts (grants, script calls, tokens), not on timing.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockError, LockGuard, LockRequest, distributed_lock};
use test_support::RedisServer;
use test_support::helpers::{
    default_redis_client, eventually, fence_name, is_held, lock_name, ms, secs, within,
};
use tokio::task::JoinHandle;

/// A server of the test's own and `N` clients of it with the default
/// settings (local hand-over on).
async fn server_and_clients<const N: usize>() -> (RedisServer, [LockClient; N]) {
    let server = RedisServer::start();
    let mut clients = Vec::with_capacity(N);
    for _ in 0..N {
        clients.push(default_redis_client(&server).await);
    }
    let clients = clients
        .try_into()
        .unwrap_or_else(|_| unreachable!("N clients were built"));
    (server, clients)
}

/// A request for `key` that waits up to 10 s, longer than any test here
/// waits for it: in its line behind the client's other tasks, or as the
/// line's representative on the server.
fn in_line(client: &LockClient, key: &str) -> LockRequest {
    client.lock(key).wait(secs(10))
}

/// The commands these tests count, as the server ran them so far (`INFO
/// commandstats`, scripts' commands included): `EVALSHA` per script call,
/// `INCR` per token taken one at a time (acquire.lua), `INCRBY` per block
/// of tokens (reserve.lua).
#[derive(Debug, Clone, Copy)]
struct Calls {
    evalsha: u64,
    incr: u64,
    incrby: u64,
}

impl Calls {
    fn of(server: &RedisServer) -> Self {
        let stats = server.cli(&["INFO", "commandstats"]);
        // One line a command run at least once: `cmdstat_incr:calls=2,usec=...`.
        let count = |command: &str| -> u64 {
            let fields = stats.lines().find_map(|line| {
                let (name, fields) = line.strip_prefix("cmdstat_")?.split_once(':')?;
                (name == command).then_some(fields)
            });
            fields
                .and_then(|fields| fields.split(',').find_map(|f| f.strip_prefix("calls=")))
                .map_or(0, |calls| calls.parse().expect("a count of calls"))
        };
        Self {
            evalsha: count("evalsha"),
            incr: count("incr"),
            incrby: count("incrby"),
        }
    }
}

/// A number `redis-cli` printed (`LLEN`, `EXISTS`, `GET` of a counter).
fn number(server: &RedisServer, args: &[&str]) -> u64 {
    let answer = server.cli(args);
    answer
        .parse()
        .unwrap_or_else(|_| panic!("{args:?}: not a number: {answer:?}"))
}

/// How many wait in the server's queue of `key`: a line is queued there by
/// its representative alone.
fn queued(server: &RedisServer, key: &str) -> u64 {
    number(server, &["LLEN", &queue_name(key)])
}

/// The waiter queue on the server of `key` (default prefix, no hash tag).
fn queue_name(key: &str) -> String {
    format!("lock:Q{{{key}}}")
}

/// Spawns `acquire` and returns once it has been polled once: an acquire
/// with a wait has then taken its place in its line (or as the line's
/// representative), which happens before its first await point.
async fn spawn_entered<F>(acquire: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let (entered, on_entered) = tokio::sync::oneshot::channel();
    let handle = tokio::spawn(async move {
        let mut acquire = std::pin::pin!(acquire);
        let first = std::future::poll_fn(|cx| Poll::Ready(acquire.as_mut().poll(cx))).await;
        let _ = entered.send(());
        match first {
            Poll::Ready(output) => output,
            Poll::Pending => acquire.await,
        }
    });
    on_entered.await.expect("the task polled its acquire");
    handle
}

/// A TCP proxy on a loopback port to `target` that delays what it forwards
/// by `delay` each way: a server `2 * delay` away. Runs until the test's
/// runtime ends.
async fn slow_proxy(target: u16, delay: Duration) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await else {
                continue;
            };
            let _ = (client.set_nodelay(true), server.set_nodelay(true));
            let (from_client, to_client) = client.into_split();
            let (from_server, to_server) = server.into_split();
            tokio::spawn(forward_late(from_client, to_server, delay));
            tokio::spawn(forward_late(from_server, to_client, delay));
        }
    });
    port
}

/// Copies `from` to `to`, each chunk `delay` after it was read (in order).
/// (`readable`/`try_read`: the tests package has no `io-util`.)
async fn forward_late(
    from: tokio::net::tcp::OwnedReadHalf,
    to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
) {
    let (send, mut chunks) =
        tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    tokio::spawn(async move {
        while let Some((read_at, chunk)) = chunks.recv().await {
            tokio::time::sleep_until(read_at + delay).await;
            let mut chunk = chunk.as_slice();
            while !chunk.is_empty() {
                if to.writable().await.is_err() {
                    return;
                }
                match to.try_write(chunk) {
                    Ok(n) => chunk = &chunk[n..],
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(_) => return,
                }
            }
        }
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if from.readable().await.is_err() {
            return;
        }
        match from.try_read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                let read_at = tokio::time::Instant::now();
                if send.send((read_at, buf[..n].to_vec())).is_err() {
                    return;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return,
        }
    }
}

/// Awaits `acquiring` (a spawned acquire, at most `limit`) and its guard.
async fn acquired(
    limit: Duration,
    what: &str,
    acquiring: JoinHandle<Result<LockGuard, LockError>>,
) -> LockGuard {
    within(limit, what, acquiring)
        .await
        .expect("the acquiring task panicked")
        .unwrap_or_else(|e| panic!("{what}: {e:?}"))
}

/// Whether `key` is free within 2 s (the last release may run in the
/// background).
async fn freed_soon(client: &LockClient, key: &str) -> bool {
    for _ in 0..100 {
        if !is_held(client, key).await {
            return true;
        }
        tokio::time::sleep(ms(20)).await;
    }
    false
}

/// A client of `server` with local hand-over off.
async fn server_only_client(server: &RedisServer) -> LockClient {
    LockClient::builder()
        .redis(server.url())
        .local_handover(false)
        .build()
        .await
        .expect("a redis client")
}

/// A critical section shared by every task of the process: who is inside,
/// and every grant's fencing token in the order the grants happened.
#[derive(Default)]
struct Section {
    inside: AtomicBool,
    log: Mutex<Vec<(usize, u64)>>,
}

impl Section {
    /// Enters as `who` with fencing token `token`, stays until `stay` ends
    /// and leaves; panics if somebody else is inside meanwhile.
    async fn occupy(&self, who: usize, token: u64, stay: impl Future<Output = ()>) {
        assert!(
            !self.inside.swap(true, Ordering::SeqCst),
            "two holders at once (entering: {who} with token {token})"
        );
        self.log.lock().unwrap().push((who, token));
        stay.await;
        assert!(self.inside.swap(false, Ordering::SeqCst));
    }

    fn log(&self) -> Vec<(usize, u64)> {
        self.log.lock().unwrap().clone()
    }
}

/// Panics unless the tokens in `log` strictly increase.
fn assert_rising(log: &[(usize, u64)]) {
    for pair in log.windows(2) {
        assert!(
            pair[0].1 < pair[1].1,
            "fencing tokens must rise from grant to grant: {:?} then {:?}",
            pair[0],
            pair[1]
        );
    }
}

/// Runs `tasks` tasks until `until`, task `i` awaiting `step(i, shared)`
/// (a clone of `shared` each time) over and over; returns every task's
/// outputs, task by task. Each task must end within 15 s.
async fn steps_until<C, F>(
    tasks: usize,
    until: Instant,
    shared: C,
    step: impl Fn(usize, C) -> F + Copy + Send + 'static,
) -> Vec<Vec<F::Output>>
where
    C: Clone + Send + 'static,
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = (0..tasks)
        .map(|i| {
            let shared = shared.clone();
            tokio::spawn(async move {
                let mut outputs = Vec::new();
                while Instant::now() < until {
                    outputs.push(step(i, shared.clone()).await);
                }
                outputs
            })
        })
        .collect();
    let mut runs = Vec::with_capacity(tasks);
    for handle in handles {
        let run = within(secs(15), "a looping task", handle).await;
        runs.push(run.expect("the task ran to the end"));
    }
    runs
}

/// How many steps `runs` of [`steps_until`] took in all.
fn steps<T>(runs: &[Vec<T>]) -> u64 {
    runs.iter().map(Vec::len).sum::<usize>() as u64
}

/// `tasks` tasks, task `i` on `clients[i % clients.len()]`, take `key` over
/// and over (wait 10 s, zero hold, one yield inside) for `run_for`. Returns
/// the grants per client and the section's log, whose tokens must rise;
/// every release must succeed.
async fn hammer(
    clients: &[&LockClient],
    tasks: usize,
    key: &str,
    run_for: Duration,
) -> (Vec<u64>, Vec<(usize, u64)>) {
    let (grants, lost, log) = hammer_losing(clients, tasks, key, run_for).await;
    assert_eq!(lost, 0, "releases that found the lease lost");
    (grants, log)
}

/// [`hammer`], counting the releases that answer `Lost` (after a `DEL`).
async fn hammer_losing(
    clients: &[&LockClient],
    tasks: usize,
    key: &str,
    run_for: Duration,
) -> (Vec<u64>, u64, Vec<(usize, u64)>) {
    let section = Arc::new(Section::default());
    let shared = (
        clients.iter().copied().cloned().collect::<Arc<[_]>>(),
        key.to_owned(),
        section.clone(),
    );
    let until = Instant::now() + run_for;
    let runs = steps_until(
        tasks,
        until,
        shared,
        |i, (clients, key, section)| async move {
            let who = i % clients.len();
            let guard = in_line(&clients[who], &key)
                .acquire()
                .await
                .expect("acquire");
            let stay = tokio::task::yield_now();
            section.occupy(who, guard.fencing_token(), stay).await;
            match guard.release().await {
                Ok(()) => false,
                Err(e) if e.is_lost() => true,
                Err(e) => panic!("release: {e:?}"),
            }
        },
    )
    .await;
    let mut grants = vec![0; clients.len()];
    for (i, run) in runs.iter().enumerate() {
        grants[i % clients.len()] += run.len() as u64;
    }
    let lost = runs.iter().flatten().filter(|&&lost| lost).count() as u64;
    let log = section.log();
    assert_eq!(log.len() as u64, grants.iter().sum::<u64>());
    assert_rising(&log);
    (grants, lost, log)
}

/// Panics unless the `grants` counted went mostly from task to task
/// in-process: blocks of tokens were reserved, and there were far fewer
/// script calls than grants (a round trip per grant would be at least one
/// `EVALSHA` each). Returns the server's counts.
fn assert_handed_on_in_process(server: &RedisServer, grants: u64) -> Calls {
    let calls = Calls::of(server);
    println!("{grants} grants: {calls:?}");
    assert!(calls.incrby > 0, "no block of tokens was ever reserved");
    assert!(
        calls.evalsha * 2 < grants,
        "{} EVALSHA for {grants} grants: not handed on in-process",
        calls.evalsha
    );
    calls
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_of_one_client_hand_a_hot_key_on_in_process_one_at_a_time_with_rising_fences() {
    let (server, [client]) = server_and_clients().await;
    let (grants, log) = hammer(&[&client], 32, "hot", secs(1)).await;
    let grants = grants[0];
    assert!(grants > 100, "only {grants} grants in a second");
    let Calls { incr, incrby, .. } = assert_handed_on_in_process(&server, grants);
    // Every token came from the slot's counter: one INCR (acquire.lua) or
    // a block of 8 (reserve.lua's INCRBY) each.
    let counter = number(&server, &["GET", &fence_name("hot")]);
    assert!(log.last().unwrap().1 <= counter);
    assert!(
        grants <= incr + 8 * incrby,
        "{grants} grants, but only {incr} single tokens and {incrby} blocks"
    );
    // The last holder gave the key back to the server.
    assert!(!is_held(&client, "hot").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_local_handover_off_every_grant_goes_through_the_server() {
    let server = RedisServer::start();
    let client = server_only_client(&server).await;
    let (grants, _) = hammer(&[&client], 32, "hot", ms(500)).await;
    let grants = grants[0];
    let calls = Calls::of(&server);
    println!("{grants} grants: {calls:?}");
    assert!(grants > 20, "only {grants} grants");
    assert!(
        calls.evalsha >= grants,
        "{} EVALSHA for {grants} grants with local hand-over off",
        calls.evalsha
    );
    assert_eq!(calls.incrby, 0, "a block was reserved");
    assert!(!is_held(&client, "hot").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_chains_never_overlap_and_take_turns() {
    let (server, [a, b]) = server_and_clients().await;
    let (grants, log) = hammer(&[&a, &b], 32, "shared", secs(1)).await;
    let turns = log.windows(2).filter(|p| p[0].0 != p[1].0).count();
    let calls = Calls::of(&server);
    println!("grants per client {grants:?}, {turns} turns, {calls:?}");
    let (most, least) = (grants.iter().max().unwrap(), grants.iter().min().unwrap());
    assert!(*least > 0, "a client never got the key: {grants:?}");
    assert!(
        *most <= 2 * *least,
        "one client's chain starved the other: {grants:?}"
    );
    // Each turn is one chain: the lock went to the server between them.
    // (With the other client always queued, most chains are one grant
    // long: a run may reserve no block at all.)
    assert!(turns > 10, "only {turns} turns between the clients");
    assert!(!is_held(&a, "shared").await);
}

/// Acquires `key` as the line's representative (nobody else in line) and
/// spawns a task of the same client that waits in line behind it; returns
/// the guard and the waiter.
async fn holder_and_waiter(
    client: &LockClient,
    key: &str,
    ttl: Duration,
) -> (LockGuard, JoinHandle<Result<LockGuard, LockError>>) {
    let holder = in_line(client, key).ttl(ttl).acquire().await.unwrap();
    let waiter = spawn_entered(in_line(client, key).ttl(ttl).acquire()).await;
    (holder, waiter)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_on_lease_is_renewed_and_its_loss_reaches_the_holder_at_that_time() {
    let (server, [client, other]) = server_and_clients().await;
    let key = "renewed";
    let (first, second) = holder_and_waiter(&client, key, ms(600)).await;
    let first_token = first.fencing_token();
    first.release().await.unwrap();
    let second = acquired(secs(2), "the hand-over", second).await;
    assert!(second.fencing_token() > first_token);
    // In-process: no second acquisition on the server, one block reserved.
    let calls = Calls::of(&server);
    assert_eq!((calls.incr, calls.incrby), (1, 1), "{calls:?}");
    // The watchdog renews the lease for the new holder: held well past a ttl.
    tokio::time::sleep(ms(1500)).await;
    assert!(!second.is_lost());
    assert!(is_held(&other, key).await, "the handed-on lease ran out");
    // A third task waits in line; the key is deleted behind the holder's back.
    let third = spawn_entered(in_line(&client, key).ttl(ms(600)).acquire()).await;
    server.cli(&["DEL", &lock_name(key)]);
    within(secs(3), "the holder's lost()", second.lost()).await;
    // The next in line went back to the server: a token from the counter's
    // INCR, above the lost one, and the key held there in its name.
    let third = next_after_loss(&server, second, third).await;
    assert!(!third.is_lost());
    assert!(
        is_held(&other, key).await,
        "the next holder's lease is not on the server"
    );
    third.release().await.unwrap();
    assert!(!is_held(&other, key).await);
}

/// Releases the `lost` guard (it must say `Lost`) and takes the next holder
/// from `next`: a lease from the server (the counter's second `INCR`), never
/// the lost one handed on, with a token above it.
async fn next_after_loss(
    server: &RedisServer,
    lost: LockGuard,
    next: JoinHandle<Result<LockGuard, LockError>>,
) -> LockGuard {
    let lost_token = lost.fencing_token();
    let released = lost.release().await;
    assert!(
        matches!(released, Err(ref e) if e.is_lost()),
        "release of a lost lease: {released:?}"
    );
    let next = acquired(secs(5), "the next holder", next).await;
    assert!(next.fencing_token() > lost_token);
    assert_eq!(Calls::of(server).incr, 2, "not acquired on the server");
    next
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_runs_out_in_a_chain_is_not_handed_on() {
    let (server, [client, other]) = server_and_clients().await;
    let key = "expires";
    let (first, second) = holder_and_waiter(&client, key, ms(300)).await;
    first.release().await.unwrap();
    let second = acquired(secs(2), "the hand-over", second).await;
    let third = spawn_entered(in_line(&client, key).ttl(ms(300)).acquire()).await;
    // No renewal can be confirmed: the lease runs out on the server.
    server.pause().unwrap();
    let paused = Instant::now();
    within(secs(3), "the holder's lost()", second.lost()).await;
    let lost_after = paused.elapsed();
    tokio::time::sleep(ms(700).saturating_sub(paused.elapsed())).await;
    server.resume().unwrap();
    assert!(lost_after < ms(900), "lost() only after {lost_after:?}");
    // `third` may be done by now, but only from the server (asserted below:
    // its token comes from a second INCR): a lost lease is never handed on.
    let lost_token = second.fencing_token();
    // The line went back to the server as soon as the lease was lost: the
    // next in line acquired there (its request may have sat on the paused
    // server for longer than its own 300 ms lease, and then it is reported
    // lost on arrival, rightly: nothing confirmed it in time).
    let third = next_after_loss(&server, second, third).await;
    let _ = third.release().await;
    // Free for another client afterwards.
    let taken = other.lock(key).wait(secs(2)).acquire().await.unwrap();
    assert!(taken.fencing_token() > lost_token);
    taken.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_whose_key_is_deleted_goes_back_to_the_server_within_a_block() {
    let (server, [client]) = server_and_clients().await;
    let key = "deleted";
    let run = tokio::spawn(async move { hammer_losing(&[&client], 8, key, ms(1500)).await });
    eventually(secs(5), "a chain running", || Calls::of(&server).incrby > 0).await;
    // The default lease (30 s) is not renewed within this test: only the
    // next reservation can tell the chain the key is gone.
    server.cli(&["DEL", &lock_name(key)]);
    eventually(secs(1), "the key held on the server again", || {
        number(&server, &["EXISTS", &lock_name(key)]) == 1
    })
    .await;
    // The holder when the chain found out may see `Lost`, as any holder of
    // a deleted key may. (The tokens rose: `hammer_losing` checks.)
    let (_, lost, _) = run.await.unwrap();
    assert!(lost <= 1, "{lost} releases found the lease lost");
    assert!(Calls::of(&server).incr >= 2, "never acquired again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gives_up_leaves_the_line() {
    let (server, [client, other]) = server_and_clients().await;
    let key = "cancelled";
    let holder = in_line(&client, key).acquire().await.unwrap();
    // Dropped while waiting in line.
    let dropped = tokio::time::timeout(ms(100), in_line(&client, key).acquire()).await;
    assert!(dropped.is_err());
    // Timed out in line: `Busy` after its own wait, not the holder's.
    let started = Instant::now();
    let busy = client.lock(key).wait(ms(300)).acquire().await.unwrap_err();
    let waited = started.elapsed();
    assert!(busy.is_busy(), "{busy:?}");
    assert!(
        waited >= ms(290) && waited < ms(900),
        "busy after {waited:?} (wait 300 ms)"
    );
    // Nobody is left to hand on to: the release goes to the server and the
    // key is free at once.
    holder.release().await.unwrap();
    let reserved = Calls::of(&server).incrby;
    assert_eq!(reserved, 0, "reserved tokens for a gone waiter");
    let next = other.lock(key).acquire().await;
    next.expect("free after the release")
        .release()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_representative_that_gives_up_passes_its_role_to_the_next_in_line() {
    let (server, [client, other]) = server_and_clients().await;
    let key = "represented";
    let outside = other.lock(key).acquire().await.unwrap();
    // The first task queues on the server for the line, the second in line.
    let representative = spawn_entered(in_line(&client, key).acquire()).await;
    eventually(secs(2), "the representative queued", || {
        queued(&server, key) == 1
    })
    .await;
    let first_member = server.cli(&["LINDEX", &queue_name(key), "0"]);
    let next = spawn_entered(in_line(&client, key).acquire()).await;
    assert_eq!(queued(&server, key), 1, "not in line");
    representative.abort();
    assert!(representative.await.unwrap_err().is_cancelled());
    // The next task takes the role: it queues on the server in its place.
    eventually(secs(2), "the next task queued", || {
        let queue = server.cli(&["LRANGE", &queue_name(key), "0", "-1"]);
        queue.lines().count() == 1 && queue != first_member
    })
    .await;
    outside.release().await.unwrap();
    let next = acquired(secs(3), "the next task", next).await;
    next.release().await.unwrap();
    assert!(!is_held(&other, key).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_dropped_together_with_the_representative_does_not_strand_the_line() {
    let (_server, [client, other]) = server_and_clients().await;
    let key = "stranded";
    let outside = other.lock(key).acquire().await.unwrap();
    // One task's representative and waiter, dropped together (as a
    // `select!`, a `join!` under a timeout, or two tasks cancelled at the
    // same moment would): the representative goes first and passes its
    // role on to the waiter, which is dropped right after.
    let both = tokio::time::timeout(
        ms(200),
        futures_util::future::join(in_line(&client, key).acquire(), async {
            tokio::time::sleep(ms(50)).await;
            in_line(&client, key).acquire().await
        }),
    )
    .await;
    assert!(both.is_err());
    outside.release().await.unwrap();
    assert!(!is_held(&other, key).await, "the key is free on the server");
    // Nobody of this client wants the key any more: the next task is the
    // line's representative and takes the free key.
    let next = client.lock(key).wait(secs(2)).acquire().await;
    let next = next.expect("the line is stranded: a role sent to a dropped waiter was lost");
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_that_give_up_at_random_never_stall_the_line() {
    let (_server, [client, other]) = server_and_clients().await;
    let key = "impatient";
    let section = Arc::new(Section::default());
    let until = Instant::now() + secs(1);
    let mut handles = Vec::new();
    for i in 0..16u64 {
        let (client, section) = (client.clone(), section.clone());
        handles.push(tokio::spawn(async move {
            let (mut granted, mut gave_up) = (0u32, 0u32);
            let mut n = i;
            while Instant::now() < until {
                // 0.2 .. 3 ms: often while in line, sometimes as the
                // representative queued behind the other client.
                n = n
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let patience = Duration::from_micros(200 + (n >> 33) % 2800);
                match tokio::time::timeout(patience, in_line(&client, key).acquire()).await {
                    Ok(guard) => {
                        let guard = guard.expect("acquire");
                        let stay = tokio::task::yield_now();
                        section.occupy(0, guard.fencing_token(), stay).await;
                        guard.release().await.expect("release");
                        granted += 1;
                    }
                    Err(_) => gave_up += 1,
                }
            }
            (granted, gave_up)
        }));
    }
    // Another client takes the key now and then: the line's representative
    // then waits on the server.
    let outside = {
        let (other, section) = (other.clone(), section.clone());
        tokio::spawn(async move {
            let mut granted = 0u32;
            while Instant::now() < until {
                let guard = in_line(&other, key).acquire().await.unwrap();
                let stay = tokio::time::sleep(ms(2));
                section.occupy(1, guard.fencing_token(), stay).await;
                guard.release().await.unwrap();
                granted += 1;
                tokio::time::sleep(ms(10)).await;
            }
            granted
        })
    };
    let (mut granted, mut gave_up) = (0, 0);
    for handle in handles {
        let (g, u) = within(secs(15), "an impatient task", handle).await.unwrap();
        granted += g;
        gave_up += u;
    }
    let outside = within(secs(15), "the other client", outside).await.unwrap();
    println!("{granted} grants, {gave_up} gave up, {outside} grants to the other client");
    assert_rising(&section.log());
    assert!(
        granted > 0 && gave_up > 0,
        "{granted} grants, {gave_up} gave up"
    );
    // Whatever the cancelled waiters left behind, the line still works ...
    let last = client.lock(key).wait(secs(3)).acquire();
    let last = within(secs(5), "an acquire after the storm", last).await;
    last.expect("the line stalled").release().await.unwrap();
    // ... and the key is free (guards sent to dropped waiters were released).
    assert!(
        freed_soon(&other, key).await,
        "the key stayed held after every task gave up or released"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_with_other_lease_settings_queues_on_the_server_and_is_served_first() {
    let (server, [client]) = server_and_clients().await;
    let key = "settings";
    let holder = in_line(&client, key).ttl(secs(10)).acquire().await.unwrap();
    let other_ttl = tokio::spawn(in_line(&client, key).ttl(secs(5)).acquire());
    eventually(secs(2), "the waiter with another ttl queued", || {
        queued(&server, key) == 1
    })
    .await;
    // Same settings: in line, not on the server.
    let same_ttl = spawn_entered(in_line(&client, key).ttl(secs(10)).acquire()).await;
    tokio::time::sleep(ms(100)).await; // time to queue on the server, were it to
    assert_eq!(queued(&server, key), 1);
    // The holder's chain yields to the waiter queued on the server.
    let holder_token = holder.fencing_token();
    holder.release().await.unwrap();
    let other_ttl = acquired(secs(3), "the waiter on the server", other_ttl).await;
    assert!(other_ttl.fencing_token() > holder_token);
    assert!(
        !same_ttl.is_finished(),
        "handed on past a waiter on the server"
    );
    let other_token = other_ttl.fencing_token();
    other_ttl.release().await.unwrap();
    let same_ttl = acquired(secs(3), "the waiter in line", same_ttl).await;
    assert!(same_ttl.fencing_token() > other_token);
    same_ttl.release().await.unwrap();
    assert_eq!(Calls::of(&server).incrby, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_guards_hand_on_too() {
    let (server, [client]) = server_and_clients().await;
    let key = "dropped";
    let section = Arc::new(Section::default());
    let shared = (client.clone(), section.clone());
    let until = Instant::now() + ms(700);
    let runs = steps_until(8, until, shared, move |_, (client, section)| async move {
        let guard = in_line(&client, key).acquire().await.unwrap();
        let stay = tokio::task::yield_now();
        section.occupy(0, guard.fencing_token(), stay).await;
        drop(guard);
    })
    .await;
    assert_rising(&section.log());
    assert_handed_on_in_process(&server, steps(&runs));
    // The last guard's background release frees the key.
    assert!(
        freed_soon(&client, key).await,
        "the key stayed held after the last guard was dropped"
    );
}

#[distributed_lock(key = "macro:<n>", client = client, wait = "10s")]
async fn locked_step(client: &LockClient, n: u32, section: &Section) -> Result<u64, LockError> {
    let token = lock_runtime::current_lock()
        .expect("inside the lock")
        .fencing_token;
    section.occupy(0, token, tokio::task::yield_now()).await;
    Ok(token)
}

/// The other half of [`run_and_the_attribute_re_enter_and_hand_on_in_a_chain`]:
/// `LockRequest::run` on `macro:1`, re-entered inside.
async fn run_step(client: &LockClient, section: Arc<Section>) {
    let inner = client.clone();
    in_line(client, "macro:1")
        .run(async move {
            let outer = lock_runtime::current_lock().unwrap().fencing_token;
            // Re-entry, not a place in the line (which would wait for
            // ourselves).
            let again = in_line(&inner, "macro:1").acquire();
            let again = within(secs(2), "re-entry", again).await.unwrap();
            assert!(again.is_reentrant());
            assert_eq!(again.fencing_token(), outer);
            section.occupy(0, outer, tokio::task::yield_now()).await;
            again.release().await.unwrap();
        })
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_and_the_attribute_re_enter_and_hand_on_in_a_chain() {
    let (server, [client]) = server_and_clients().await;
    let section = Arc::new(Section::default());
    let shared = (client.clone(), section.clone());
    let until = Instant::now() + ms(700);
    let runs = steps_until(8, until, shared, |i, (client, section)| async move {
        if i % 2 == 0 {
            locked_step(&client, 1, &section).await.unwrap();
        } else {
            run_step(&client, section).await;
        }
    })
    .await;
    assert_rising(&section.log());
    assert_handed_on_in_process(&server, steps(&runs));
    assert!(!is_held(&client, "macro:1").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_further_away_than_a_block_lasts_still_gets_hand_overs() {
    let server = RedisServer::start();
    // 20 ms round trips: every reserved block is older than 5 ms on arrival.
    let port = slow_proxy(server.port, ms(10)).await;
    let client = test_support::helpers::redis_url_client(format!("redis://127.0.0.1:{port}"))
        .await
        .unwrap();
    let key = "far";
    let holder = in_line(&client, key).acquire().await.unwrap();
    let waiter = spawn_entered(in_line(&client, key).acquire()).await;
    let token = holder.fencing_token();
    within(secs(3), "the release", holder.release())
        .await
        .unwrap();
    let next = acquired(secs(3), "the hand-over", waiter).await;
    assert!(next.fencing_token() > token);
    let blocks = Calls::of(&server).incrby;
    assert!(
        blocks <= 2,
        "{blocks} blocks reserved for one hand-over (stale on arrival)"
    );
    next.release().await.unwrap();
    assert!(!is_held(&client, key).await);
    // A chain makes progress at one hand-over per reservation at least.
    let (grants, _) = hammer(&[&client], 4, "far:hot", ms(500)).await;
    assert!(grants[0] > 8, "{} grants in 500 ms", grants[0]);
}

/// A holder that never releases (its guard forgotten) and whose fixed lease
/// runs out leaves nothing to hand on: the task waiting in line goes to the
/// server when the loss is known, instead of waiting out its own wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forgotten_holder_whose_lease_ends_does_not_strand_its_line() {
    let (server, [client]) = server_and_clients().await;
    let key = "forgotten";
    let fixed = || client.lock(key).ttl(ms(300)).renew(false);
    let holder = fixed().acquire().await.unwrap();
    let first = holder.fencing_token();
    let started = Instant::now();
    let waiter = spawn_entered(fixed().wait(secs(10)).acquire()).await;
    std::mem::forget(holder);
    let next = acquired(secs(3), "the waiter in line", waiter).await;
    let took = started.elapsed();
    assert!(took >= ms(250), "taken after {took:?}, inside the lease");
    assert!(
        took < secs(2),
        "the line waited {took:?} for a forgotten holder"
    );
    assert!(next.fencing_token() > first);
    assert_eq!(Calls::of(&server).incr, 2, "not acquired on the server");
    next.release().await.unwrap();
}

/// A holder that tried once starts no line (no entry per held key for
/// locks that rarely see a waiter of their own client): the first task of
/// the client that waits for it goes through the server, and the line forms
/// from its hold on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_tried_once_hands_over_through_the_server_then_the_line_forms() {
    let (server, [client]) = server_and_clients::<1>().await;
    let key = "tried-once";
    let holder = client.lock(key).acquire().await.unwrap();
    let second = spawn_entered(in_line(&client, key).acquire()).await;
    holder.release().await.unwrap();
    let second = acquired(secs(3), "the waiter", second).await;
    let after_server = Calls::of(&server);
    assert_eq!(
        after_server.incr, 2,
        "handed over by the server: {after_server:?}"
    );
    assert_eq!(after_server.incrby, 0, "{after_server:?}");
    // The waiter held with a wait: a third task now waits in its line.
    let third = spawn_entered(in_line(&client, key).acquire()).await;
    second.release().await.unwrap();
    let third = acquired(secs(3), "the third task", third).await;
    let in_process = Calls::of(&server);
    assert_eq!(in_process.incr, 2, "not through the server: {in_process:?}");
    // A block reserved (and maybe the next one ahead, on a slow machine).
    assert!(in_process.incrby >= 1, "no block reserved: {in_process:?}");
    third.release().await.unwrap();
}
