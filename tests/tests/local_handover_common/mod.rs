//! What the `local_handover*` suites share: a server with clients, counters
//! of the server's script calls, waiters entered in order, a slow proxy,
//! and hot-key loops.

#![allow(dead_code)] // each test file uses its own part of it

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockError, LockGuard, LockRequest};
use test_support::RedisServer;
use test_support::helpers::{default_redis_client, is_held, ms, secs, within};
use tokio::task::JoinHandle;

/// A server of the test's own and `N` clients of it with the default
/// settings (local hand-over on).
pub(crate) async fn server_and_clients<const N: usize>() -> (RedisServer, [LockClient; N]) {
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
pub(crate) fn in_line(client: &LockClient, key: &str) -> LockRequest {
    client.lock(key).wait(secs(10))
}

/// The commands these tests count, as the server ran them so far (`INFO
/// commandstats`, scripts' commands included): `EVALSHA` per script call,
/// `INCR` per token taken one at a time (acquire.lua), `INCRBY` per block
/// of tokens (reserve.lua).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Calls {
    /// Plain `SET`s: an acquisition on the server starts with one (see
    /// `backend/redis/plain.rs`).
    pub(crate) set: u64,
    pub(crate) evalsha: u64,
    pub(crate) incr: u64,
    pub(crate) incrby: u64,
}

impl Calls {
    pub(crate) fn of(server: &RedisServer) -> Self {
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
            set: count("set"),
            evalsha: count("evalsha"),
            incr: count("incr"),
            incrby: count("incrby"),
        }
    }
}

/// A number `redis-cli` printed (`LLEN`, `EXISTS`, `GET` of a counter).
pub(crate) fn number(server: &RedisServer, args: &[&str]) -> u64 {
    let answer = server.cli(args);
    answer
        .parse()
        .unwrap_or_else(|_| panic!("{args:?}: not a number: {answer:?}"))
}

/// How many wait in the server's queue of `key`: a line is queued there by
/// its representative alone.
pub(crate) fn queued(server: &RedisServer, key: &str) -> u64 {
    number(server, &["LLEN", &queue_name(key)])
}

/// The waiter queue on the server of `key` (default prefix, no hash tag).
pub(crate) fn queue_name(key: &str) -> String {
    format!("lock:Q{{{key}}}")
}

/// Spawns `acquire` and returns once it has been polled once: an acquire
/// with a wait has then taken its place in its line (or as the line's
/// representative), which happens before its first await point.
pub(crate) async fn spawn_entered<F>(acquire: F) -> JoinHandle<F::Output>
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
pub(crate) async fn slow_proxy(target: u16, delay: Duration) -> u16 {
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
pub(crate) async fn forward_late(
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
pub(crate) async fn acquired(
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
pub(crate) async fn freed_soon(client: &LockClient, key: &str) -> bool {
    for _ in 0..100 {
        if !is_held(client, key).await {
            return true;
        }
        tokio::time::sleep(ms(20)).await;
    }
    false
}

/// A client of `server` with local hand-over off.
pub(crate) async fn server_only_client(server: &RedisServer) -> LockClient {
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
pub(crate) struct Section {
    inside: AtomicBool,
    log: Mutex<Vec<(usize, u64)>>,
}

impl Section {
    /// Enters as `who` with fencing token `token`, stays until `stay` ends
    /// and leaves; panics if somebody else is inside meanwhile.
    pub(crate) async fn occupy(&self, who: usize, token: u64, stay: impl Future<Output = ()>) {
        assert!(
            !self.inside.swap(true, Ordering::SeqCst),
            "two holders at once (entering: {who} with token {token})"
        );
        self.log.lock().unwrap().push((who, token));
        stay.await;
        assert!(self.inside.swap(false, Ordering::SeqCst));
    }

    pub(crate) fn log(&self) -> Vec<(usize, u64)> {
        self.log.lock().unwrap().clone()
    }
}

/// Panics unless the tokens in `log` strictly increase.
pub(crate) fn assert_rising(log: &[(usize, u64)]) {
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
pub(crate) async fn steps_until<C, F>(
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
pub(crate) fn steps<T>(runs: &[Vec<T>]) -> u64 {
    runs.iter().map(Vec::len).sum::<usize>() as u64
}

/// `tasks` tasks, task `i` on `clients[i % clients.len()]`, take `key` over
/// and over (wait 10 s, zero hold, one yield inside) for `run_for`. Returns
/// the grants per client and the section's log, whose tokens must rise;
/// every release must succeed.
pub(crate) async fn hammer(
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
pub(crate) async fn hammer_losing(
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
            // `None`: the lease was lost (the key deleted) before its token
            // was asked for, so it got none (and wrote nothing).
            let token = match guard.fencing_token().await {
                Ok(token) => token,
                Err(e) if e.is_lost() => return None,
                Err(e) => panic!("fencing token: {e:?}"),
            };
            section.occupy(who, token, stay).await;
            match guard.release().await {
                Ok(()) => Some(false),
                Err(e) if e.is_lost() => Some(true),
                Err(e) => panic!("release: {e:?}"),
            }
        },
    )
    .await;
    let mut grants = vec![0; clients.len()];
    for (i, run) in runs.iter().enumerate() {
        grants[i % clients.len()] += run.len() as u64;
    }
    let lost = runs
        .iter()
        .flatten()
        .filter(|lost| lost.is_none_or(|lost| lost))
        .count() as u64;
    let tokened = runs.iter().flatten().filter(|lost| lost.is_some()).count();
    let log = section.log();
    assert_eq!(log.len(), tokened);
    assert_rising(&log);
    (grants, lost, log)
}

/// Panics unless the `grants` counted went mostly from task to task
/// in-process: blocks of tokens were reserved, and there were far fewer
/// script calls than grants (a round trip per grant would be at least one
/// `EVALSHA` each). Returns the server's counts.
pub(crate) fn assert_handed_on_in_process(server: &RedisServer, grants: u64) -> Calls {
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
