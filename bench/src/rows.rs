//! The measurements. Each function measures one workload once (one
//! repetition) and returns raw figures; `bench.rs` turns them into rows.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use lock_runtime::{LockClient, LockRequest};
use tokio::task::JoinSet;

use super::raw::{Raw, value};
use super::report::{median, percentile};
use super::sides::{Attempt, GENEROUS_WAIT, Side};

/// Serial samples are taken in blocks of this many, alternating library and
/// raw blocks, so drifting noise hits both sides alike.
const BLOCK: usize = 100;

/// How long the single waiter gets to enqueue (or subscribe) and fall asleep
/// before the holder releases. Tens of round trips on loopback.
const WAITER_HEAD_START: Duration = Duration::from_millis(3);

/// How much of a 1 ms hold is spun rather than slept (thread sleeps overshoot
/// by the kernel's timer slack, 50 us by default, plus wake-up latency).
const SPIN_MARGIN: Duration = Duration::from_micros(150);

/// Microseconds, as a float.
pub(crate) fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The start and end of a measuring window of `window`: the start 5 ms from
/// now, so that every task is spawned and waiting when it opens.
fn window_from_now(window: Duration) -> (Instant, Instant) {
    let start = Instant::now() + Duration::from_millis(5);
    (start, start + window)
}

/// Takes the free raw lock `key` with the value `v`; an error naming `what`
/// if it was held.
async fn take_free(raw: &mut Raw, key: &str, v: &str, what: &str) -> Result<(), String> {
    if raw.try_set(key, v).await? {
        Ok(())
    } else {
        Err(format!("{what}: the key was unexpectedly held"))
    }
}

fn sleep_until(t: Instant) -> tokio::time::Sleep {
    tokio::time::sleep_until(tokio::time::Instant::from_std(t))
}

/// One library acquire + release on a free key.
pub(crate) async fn lib_pair(client: &LockClient, key: &str) -> Result<(), String> {
    request_pair(client.lock(key), key).await
}

/// One acquire + release of `request` (for `key`).
async fn request_pair(request: LockRequest, key: &str) -> Result<(), String> {
    let guard = request
        .acquire()
        .await
        .map_err(|e| format!("acquire {key}: {e}"))?;
    guard
        .release()
        .await
        .map_err(|e| format!("release {key}: {e}"))
}

/// One acquire + release of a semaphore's permit (`Some(permits)`) or of a
/// read lock (`None`) on a free key.
pub(crate) async fn family_pair(
    client: &LockClient,
    key: &str,
    permits: Option<u32>,
) -> Result<(), String> {
    let request = match permits {
        Some(n) => client.semaphore(key, n),
        None => client.rw_lock(key).read(),
    };
    request_pair(request, key).await
}

/// `n` timed calls of `a` and `n` of `b`, in alternating blocks of `BLOCK`
/// (which side opens alternates with the block and the repetition), so
/// drifting noise hits both sides alike. Returns each side's latencies in
/// microseconds.
pub(crate) async fn blocks(
    n: usize,
    rep: usize,
    mut a: impl AsyncFnMut() -> Result<(), String>,
    mut b: impl AsyncFnMut() -> Result<(), String>,
) -> Result<(Vec<f64>, Vec<f64>), String> {
    let mut times = [Vec::with_capacity(n), Vec::with_capacity(n)];
    for block in 0..n.div_ceil(BLOCK) {
        let a_first = (block + rep).is_multiple_of(2);
        for side_a in [a_first, !a_first] {
            for _ in 0..BLOCK {
                let t = Instant::now();
                if side_a {
                    a().await?
                } else {
                    b().await?
                }
                times[usize::from(!side_a)].push(us(t.elapsed()));
            }
        }
    }
    let [a, b] = times;
    Ok((a, b))
}

/// `n` library pairs on `client` and `n` raw pairs, in alternating blocks.
/// Returns the per-pair latencies in microseconds: (library, raw).
pub(crate) async fn serial(
    client: &LockClient,
    lib_key: &str,
    raw: &mut Raw,
    raw_key: &str,
    n: usize,
    rep: usize,
) -> Result<(Vec<f64>, Vec<f64>), String> {
    let mut counter = 0u64;
    blocks(
        n,
        rep,
        async || lib_pair(client, lib_key).await,
        async || {
            counter += 1;
            raw.pair(raw_key, &value(0, counter)).await
        },
    )
    .await
}

/// `n` library pairs on `client` whose fencing token is asked for
/// (acquire, mint, release), and `n` least fenced raw pairs, in alternating
/// blocks. Returns the per-pair latencies in microseconds: (library, raw).
pub(crate) async fn fenced_pairs(
    client: &LockClient,
    raw: &mut Raw,
    n: usize,
    rep: usize,
) -> Result<(Vec<f64>, Vec<f64>), String> {
    let (key, raw_key, counter) = (
        "fenced-pair",
        raw.key("fenced-pair"),
        raw.key("fenced-pair:n"),
    );
    let mut sent = 0u64;
    blocks(
        n,
        rep,
        async || {
            let guard = client
                .lock(key)
                .acquire()
                .await
                .map_err(|e| format!("acquire {key}: {e}"))?;
            guard
                .fencing_token()
                .await
                .map_err(|e| format!("token {key}: {e}"))?;
            guard
                .release()
                .await
                .map_err(|e| format!("release {key}: {e}"))
        },
        async || {
            sent += 1;
            raw.fenced_pair(&raw_key, &counter, &value(2, sent)).await
        },
    )
    .await
}

/// `n` pairs of the library's scripts sent by hand and `n` raw pairs, in
/// alternating blocks. Returns the per-pair latencies in microseconds:
/// (scripts, raw).
pub(crate) async fn scripted(
    raw: &mut Raw,
    raw_key: &str,
    n: usize,
    rep: usize,
) -> Result<(Vec<f64>, Vec<f64>), String> {
    let (mut scripted, mut plain) = (0u64, 0u64);
    // Two handles on the one connection: each side borrows its own.
    let mut scripts = raw.clone();
    let names = scripts.library_names("scripted");
    blocks(
        n,
        rep,
        async || {
            scripted += 1;
            scripts.scripted_pair(&names, &value(1, scripted)).await
        },
        async || {
            plain += 1;
            raw.pair(raw_key, &value(0, plain)).await
        },
    )
    .await
}

/// `n` fenced writes (one `HSET` through `fence::redis`, the token rising)
/// and `n` of the same `HSET` unfenced, in alternating blocks. Returns the
/// latencies in microseconds: (fenced, unfenced).
pub(crate) async fn fenced(
    raw: &mut Raw,
    n: usize,
    rep: usize,
) -> Result<(Vec<f64>, Vec<f64>), String> {
    let (fenced_key, plain_key) = (raw.key("fenced"), raw.key("unfenced"));
    let mut other = raw.clone();
    let (mut token, mut plain) = ((rep as u64) << 32, 0u64);
    blocks(
        n,
        rep,
        async || {
            token += 1;
            raw.fenced_hset(&fenced_key, token, token).await
        },
        async || {
            plain += 1;
            other.hset(&plain_key, plain).await
        },
    )
    .await
}

/// `tasks` tasks, each taking and giving back its own key on `side` in a
/// loop for `window`. Returns pairs per second (only pairs completed inside
/// the window count).
pub(crate) async fn pairs_per_sec<S: Side>(
    side: &S,
    tasks: usize,
    window: Duration,
) -> Result<f64, String> {
    let (start, end) = window_from_now(window);
    let mut set = JoinSet::new();
    for i in 0..tasks {
        let mut side = side.clone();
        set.spawn(async move {
            let key = side.key(&format!("par:{i}"));
            sleep_until(start).await;
            let mut done = 0u64;
            loop {
                let attempt = Attempt {
                    contended: false,
                    task: i,
                    n: done,
                };
                let held = side.take(&key, attempt).await?;
                side.give(&key, held).await?;
                if Instant::now() >= end {
                    return Ok::<u64, String>(done);
                }
                done += 1;
            }
        });
    }
    let total = join_sum(set).await?;
    Ok(total as f64 / window.as_secs_f64())
}

async fn join_sum(mut set: JoinSet<Result<u64, String>>) -> Result<u64, String> {
    let mut total = 0;
    while let Some(joined) = set.join_next().await {
        total += joined.map_err(|e| format!("task failed: {e}"))??;
    }
    Ok(total)
}

/// Holds a lock until `end`, without blocking the runtime: a blocking-pool
/// thread sleeps until `SPIN_MARGIN` before `end` and yields in a loop for the
/// rest. `tokio::time::sleep` cannot do this: its timer wheel has 1 ms slots
/// and rounds up, so a 1 ms sleep lasts 1-2 ms. Spinning on a runtime worker
/// would hold up one of the two cores the runtime and Redis share.
pub(crate) async fn hold_until(end: Instant) -> Result<(), String> {
    tokio::task::spawn_blocking(move || {
        if let Some(rest) = end.checked_duration_since(Instant::now())
            && rest > SPIN_MARGIN
        {
            std::thread::sleep(rest - SPIN_MARGIN);
        }
        while Instant::now() < end {
            std::thread::yield_now();
        }
    })
    .await
    .map_err(|e| format!("hold task failed: {e}"))
}

/// What a hot-key run measured.
#[derive(Debug, Default)]
pub(crate) struct Hot {
    /// Grants per task, counting acquisitions inside the window.
    pub(crate) grants: Vec<u64>,
    /// Wait of every acquisition that *started* inside the window, in us
    /// (those still waiting at the end are finished and counted too, so a
    /// starved task shows up in the tail).
    pub(crate) waits: Vec<f64>,
    /// How long each grant was actually held, in us.
    pub(crate) holds: Vec<f64>,
    pub(crate) window: Duration,
}

impl Hot {
    /// Most grants of one task over fewest (infinite if a task got none).
    pub(crate) fn fairness(&self) -> f64 {
        let max = self.grants.iter().copied().max().unwrap_or(0) as f64;
        let min = self.grants.iter().copied().min().unwrap_or(0) as f64;
        if min == 0.0 { f64::INFINITY } else { max / min }
    }

    /// Grants per second over several slices (the windows add up).
    pub(crate) fn rate_of(slices: &[Hot]) -> f64 {
        let grants: u64 = slices.iter().flat_map(|h| &h.grants).sum();
        let secs: f64 = slices.iter().map(|h| h.window.as_secs_f64()).sum();
        grants as f64 / secs
    }

    /// The worst slice's max/min grants per task: fairness is judged within
    /// one contention period, never averaged away across slices.
    pub(crate) fn fairness_of(slices: &[Hot]) -> f64 {
        slices.iter().map(Hot::fairness).fold(0.0, f64::max)
    }

    /// Every slice's waits (or holds), pooled.
    pub(crate) fn pooled(slices: &[Hot], pick: fn(&Hot) -> &Vec<f64>) -> Vec<f64> {
        slices
            .iter()
            .flat_map(|h| pick(h).iter().copied())
            .collect()
    }

    /// Fewest and most grants of one task in one slice.
    pub(crate) fn grant_range(slices: &[Hot]) -> (u64, u64) {
        let all = slices.iter().flat_map(|h| h.grants.iter().copied());
        (all.clone().min().unwrap_or(0), all.max().unwrap_or(0))
    }

    fn merge(&mut self, task: HotTask) {
        self.grants.push(task.grants);
        self.waits.extend(task.waits);
        self.holds.extend(task.holds);
    }
}

#[derive(Default)]
struct HotTask {
    grants: u64,
    waits: Vec<f64>,
    holds: Vec<f64>,
}

/// `tasks` tasks take the one key `name` on `side` in a loop (a contended
/// side: waiting or retrying until it gets it), hold it for `hold` and give
/// it back, for `window`.
pub(crate) async fn hot<S: Side>(
    side: &S,
    name: &str,
    tasks: usize,
    hold: Duration,
    window: Duration,
) -> Result<Hot, String> {
    let (start, end) = window_from_now(window);
    let key = side.key(name);
    let mut set = JoinSet::new();
    for i in 0..tasks {
        let mut side = side.clone();
        let key = key.clone();
        set.spawn(async move {
            sleep_until(start).await;
            let mut me = HotTask::default();
            let mut n = 0u64;
            loop {
                let asked = Instant::now();
                if asked >= end {
                    return Ok::<HotTask, String>(me);
                }
                n += 1;
                let attempt = Attempt {
                    contended: true,
                    task: i,
                    n,
                };
                let held = side.take(&key, attempt).await?;
                let got = Instant::now();
                me.waits.push(us(got - asked));
                if !hold.is_zero() {
                    hold_until(got + hold).await?;
                }
                let held_for = got.elapsed();
                side.give(&key, held).await?;
                if got < end {
                    me.grants += 1;
                    me.holds.push(us(held_for));
                }
            }
        });
    }
    join_hot(set, window).await
}

async fn join_hot(
    mut set: JoinSet<Result<HotTask, String>>,
    window: Duration,
) -> Result<Hot, String> {
    let mut hot = Hot {
        window,
        ..Hot::default()
    };
    while let Some(joined) = set.join_next().await {
        hot.merge(joined.map_err(|e| format!("task failed: {e}"))??);
    }
    Ok(hot)
}

/// The most grants per second a 1 ms hold allows: one task holding (with
/// [`hold_until`]) back to back, no lock at all. Its `Hot` has one task and
/// no waits.
pub(crate) async fn hold_ceiling(hold: Duration, window: Duration) -> Result<Hot, String> {
    let end = Instant::now() + window;
    let mut me = HotTask::default();
    loop {
        let got = Instant::now();
        if got >= end {
            break;
        }
        hold_until(got + hold).await?;
        me.holds.push(us(got.elapsed()));
        me.grants += 1;
    }
    let mut hot = Hot {
        window,
        ..Hot::default()
    };
    hot.merge(me);
    Ok(hot)
}

/// Single-waiter handoff with the library: the holder has the lock, one
/// waiter is already waiting; the sample is the time from the start of
/// `release()` to the moment the waiter's `acquire()` returned. In us.
pub(crate) async fn handoff_lib(
    client: &LockClient,
    waiter_client: &LockClient,
    key: &str,
    samples: usize,
) -> Result<Vec<f64>, String> {
    let mut out = Vec::with_capacity(samples);
    for _ in 0..samples {
        let guard = client
            .lock(key)
            .acquire()
            .await
            .map_err(|e| format!("handoff holder: {e}"))?;
        let waiter_client = waiter_client.clone();
        let waiter_key = key.to_string();
        let waiter = tokio::spawn(async move {
            let guard = waiter_client
                .lock(waiter_key)
                .wait(GENEROUS_WAIT)
                .acquire()
                .await
                .map_err(|e| format!("handoff waiter: {e}"))?;
            let at = Instant::now();
            guard
                .release()
                .await
                .map_err(|e| format!("handoff waiter release: {e}"))?;
            Ok::<Instant, String>(at)
        });
        tokio::time::sleep(WAITER_HEAD_START).await;
        let released = Instant::now();
        guard
            .release()
            .await
            .map_err(|e| format!("handoff holder release: {e}"))?;
        let at = waiter
            .await
            .map_err(|e| format!("handoff waiter task: {e}"))??;
        let gap = at.checked_duration_since(released).ok_or(
            "the waiter held the lock before the holder released it: mutual exclusion broken",
        )?;
        out.push(us(gap));
    }
    Ok(out)
}

/// The raw counterpart of [`handoff_lib`]: the holder deletes with
/// compare-and-delete + `PUBLISH`; the waiter (subscribed beforehand on its
/// own pub/sub connection) retries `SET NX PX` on each notice.
pub(crate) async fn handoff_raw(
    raw: &Raw,
    client: &redis::Client,
    name: &str,
    samples: usize,
) -> Result<Vec<f64>, String> {
    let key = raw.key(name);
    let channel = raw.key(&format!("{name}:notice"));
    let mut pubsub = client
        .get_async_pubsub()
        .await
        .map_err(|e| format!("raw pubsub: {e}"))?;
    pubsub
        .subscribe(&channel)
        .await
        .map_err(|e| format!("raw SUBSCRIBE: {e}"))?;
    let mut notices = pubsub.into_on_message();
    let (start_tx, mut start_rx) = tokio::sync::mpsc::channel::<()>(1);
    let (done_tx, mut done_rx) = tokio::sync::mpsc::channel::<Result<Instant, String>>(1);
    let mut waiter_raw = raw.clone();
    let waiter_key = key.clone();
    let waiter = tokio::spawn(async move {
        let mut n = 0u64;
        while start_rx.recv().await.is_some() {
            n += 1;
            let v = value(2, n);
            let result = async {
                while !waiter_raw.try_set(&waiter_key, &v).await? {
                    // Any notice is a hint to try again; a stale one costs a retry.
                    notices.next().await.ok_or("raw pubsub closed")?;
                }
                let at = Instant::now();
                waiter_raw.release(&waiter_key, &v).await?;
                Ok::<Instant, String>(at)
            }
            .await;
            if done_tx.send(result).await.is_err() {
                break;
            }
        }
    });
    let mut raw = raw.clone();
    let mut out = Vec::with_capacity(samples);
    for i in 0..samples {
        let v = value(1, i as u64);
        take_free(&mut raw, &key, &v, "raw handoff").await?;
        start_tx.send(()).await.map_err(|_| "raw waiter gone")?;
        tokio::time::sleep(WAITER_HEAD_START).await;
        let released = Instant::now();
        if !raw.release_publish(&key, &v, &channel).await? {
            return Err("raw handoff: not ours at release".into());
        }
        let at = done_rx.recv().await.ok_or("raw waiter gone")??;
        let gap = at
            .checked_duration_since(released)
            .ok_or("raw handoff: waiter held before release")?;
        out.push(us(gap));
    }
    drop(start_tx);
    let _ = waiter.await;
    Ok(out)
}

/// The floor under any hand-over on this machine: one raw compare-and-delete
/// round trip, sent after the same idle pause as a handoff's release (a
/// sleeping core takes a while to wake). In us.
pub(crate) async fn idle_round_trip(
    raw: &Raw,
    name: &str,
    samples: usize,
) -> Result<Vec<f64>, String> {
    let key = raw.key(name);
    let mut raw = raw.clone();
    let mut out = Vec::with_capacity(samples);
    for i in 0..samples {
        let v = value(3, i as u64);
        take_free(&mut raw, &key, &v, "idle round trip").await?;
        tokio::time::sleep(WAITER_HEAD_START).await;
        let started = Instant::now();
        if !raw.release(&key, &v).await? {
            return Err("idle round trip: not ours at release".into());
        }
        out.push(us(started.elapsed()));
    }
    Ok(out)
}

/// Summary helpers shared by the rows.
pub(crate) fn p50(samples: &[f64]) -> f64 {
    median(samples)
}

/// The 99th percentile, in milliseconds, of microsecond samples.
pub(crate) fn p99_ms(samples_us: &[f64]) -> f64 {
    percentile(samples_us, 99.0) / 1e3
}
