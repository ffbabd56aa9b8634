//! The run: connects every side, warms up, then measures each row with its
//! baselines in every repetition and records the figures into the metrics.

use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockClientBuilder};

use super::attr;
use super::chart::{Panel, Series};
use super::defs::*;
use super::held::held_under_watchdog;
use super::http::{self, Side};
use super::load;
use super::probe;
use super::raw::{Raw, value};
use super::report::{Metric, median, percentile};
use super::rows::{self, Hot, p50, p99_ms};
use super::sides::Peer;
use crate::{Options, Plan};
use redis::aio::ConnectionManager;

/// Every key of a run starts with one of these (deleted at the end when the
/// server is not the benchmark's own).
pub(crate) struct Prefixes {
    pub(crate) lib: String,
    pub(crate) raw: String,
    pub(crate) peer: String,
}

impl Prefixes {
    pub(crate) fn new() -> Self {
        let pid = std::process::id();
        Self {
            lib: format!("lockbench{pid}:"),
            raw: format!("rawbench{pid}:"),
            peer: format!("rslbench{pid}:"),
        }
    }

    pub(crate) fn all(&self) -> [&str; 3] {
        [&self.lib, &self.raw, &self.peer]
    }
}

pub(crate) struct RunInfo {
    /// `INFO server`'s `redis_version` (Valkey answers the Redis release it
    /// is compatible with there).
    pub(crate) redis_version: String,
    /// The server measured, by its own name: `redis 7.0.15`, `valkey 9.1.2`.
    pub(crate) server: String,
    /// The hot-key rows' waits, for the chart.
    pub(crate) panels: Vec<Panel>,
}

/// Runs `slices` rounds of `N` sides (`run(side)`, side in `0..N`), every
/// side once per round, the order rotated with the repetition (A B C, then
/// B C A, ...), so slow moments of a shared machine hit every side. Returns
/// each side's results.
async fn interleave<T, const N: usize>(
    rep: usize,
    slices: usize,
    mut run: impl AsyncFnMut(usize) -> Result<T, String>,
) -> Result<[Vec<T>; N], String> {
    let mut out: [Vec<T>; N] = std::array::from_fn(|_| Vec::with_capacity(slices));
    for _ in 0..slices {
        for k in 0..N {
            let side = (k + rep) % N;
            out[side].push(run(side).await?);
        }
    }
    Ok(out)
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// The clients and sides of a run.
struct Bench<'a> {
    plan: &'a Plan,
    url: &'a str,
    prefixes: &'a Prefixes,
    redis: redis::Client,
    lib: LockClient,
    memory: LockClient,
    /// A second client on the same keys, for row 7's check that held locks
    /// really stay held, and row 5's waiter (a hand-over between clients, as
    /// between processes: within one client it would be in-process).
    rival: LockClient,
    raw: Raw,
    /// The raw pair on a `ConnectionManager` configured as the library's
    /// connection (row 2's informational side).
    managed: Raw<ConnectionManager>,
    peer: Peer,
    /// Every wait of rows 3 (library) and 4 (library, raw spin, peer), in us.
    waits3: Vec<f64>,
    waits4: [Vec<f64>; 3],
    /// Row 4's library grants/s in this repetition, row 9's baseline.
    row4_rate: Option<f64>,
}

pub(crate) async fn measure(
    opts: &Options,
    plan: &Plan,
    url: &str,
    prefixes: &Prefixes,
    metrics: &mut [Metric],
) -> Result<RunInfo, String> {
    let redis = redis::Client::open(url).map_err(|e| format!("REDIS_URL: {e}"))?;
    let build = async |builder: LockClientBuilder, what: &str| {
        builder
            .key_prefix(prefixes.lib.as_str())
            .build()
            .await
            .map_err(|e| format!("{what}: {e}"))
    };
    let lib = build(LockClient::builder().redis(url), "lock client").await?;
    let memory = build(LockClient::builder().memory(), "memory client").await?;
    let rival = build(LockClient::builder().redis(url), "second lock client").await?;
    let raw = Raw::connect(&redis, &prefixes.raw).await?;
    let managed = Raw::connect_managed(&redis, &format!("{}managed:", prefixes.raw)).await?;
    attr::set_attr_client(&lib);
    let info = server_info(&redis).await.unwrap_or_default();
    let redis_version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("")
        .trim()
        .to_string();
    let server = test_support::describe_server(&info);
    let peer = Peer {
        manager: rslock::LockManager::new(vec![url]),
        prefix: prefixes.peer.clone(),
    };
    let mut b = Bench {
        plan,
        url,
        prefixes,
        peer,
        redis,
        lib,
        memory,
        rival,
        raw,
        managed,
        waits3: Vec::new(),
        waits4: Default::default(),
        row4_rate: None,
    };
    b.warm_up().await?;

    let attr = if opts.wants('6') {
        attr::attribute_status().await
    } else {
        Ok(())
    };
    if let Err(why) = &attr {
        eprintln!("row 6 NOT YET: {why}");
        metrics[M6].not_measured = Some(why.clone());
    }
    let wrk = load::check_wrk(opts.wants('y') || opts.wants('z'), metrics);
    for rep in 0..opts.reps {
        let t = Instant::now();
        eprint!("rep {}/{}:", rep + 1, opts.reps);
        b.row4_rate = None;
        for row in ['1', '8', 'x', '6', '5', '2', '4', '3', '9', '7', 'y', 'z'] {
            let http = row == 'y' || row == 'z';
            if !opts.wants(row) || (row == '6' && attr.is_err()) || (http && !wrk) {
                continue;
            }
            eprint!(" {}", crate::row_name(row));
            match row {
                '1' | '8' => b.serial(row, rep, metrics).await?,
                'x' => b.family(rep, metrics).await?,
                '6' => {
                    let (a, h) = attr::serial_attr(plan.attr_iters, rep).await?;
                    metrics[M6].record(p50(&a), p50(&h));
                }
                '5' => b.handoff(rep, metrics).await?,
                '2' => b.distinct_keys(rep, metrics).await?,
                '4' => b.hot_zero_hold(rep, metrics).await?,
                '3' => b.hot_hold(rep, metrics).await?,
                '9' => b.two_processes(rep, metrics).await?,
                'y' | 'z' => b.http(row, rep, metrics).await?,
                _ => b.held(rep, metrics).await?,
            }
        }
        eprintln!("  ({:.1} s)", t.elapsed().as_secs_f64());
    }
    let panels = b.panels(opts, metrics);
    Ok(RunInfo {
        redis_version,
        server,
        panels,
    })
}

impl Bench<'_> {
    /// Connections, scripts, the notice subscription, the allocator.
    async fn warm_up(&mut self) -> Result<(), String> {
        let warm = Instant::now();
        let mut conn = (self.redis.get_multiplexed_async_connection().await)
            .map_err(|e| format!("token check connection: {e}"))?;
        crate::raw::check_library_token(&self.lib, &self.prefixes.lib, &mut conn).await?;
        let raw_serial = self.raw.key("serial");
        for i in 0..200 {
            rows::lib_pair(&self.lib, "serial").await?;
            rows::lib_pair(&self.memory, "serial").await?;
            self.raw.pair(&raw_serial, &value(9, i)).await?;
            self.managed.pair(&raw_serial, &value(10, i)).await?;
        }
        let (lib, raw, peer) = (&self.lib, &self.raw, &self.peer);
        let short = Duration::from_millis(50);
        rows::hot(lib, "hot", 4, Duration::ZERO, short).await?;
        rows::hot(raw, "hot", 4, Duration::ZERO, short).await?;
        rows::hot(peer, "hot", 4, Duration::ZERO, short).await?;
        rows::handoff_lib(&self.lib, &self.rival, "handoff", 3).await?;
        rows::handoff_raw(&self.raw, &self.redis, "handoff", 3).await?;
        eprintln!("warm-up done in {:.1} s", warm.elapsed().as_secs_f64());
        Ok(())
    }

    /// Rows 1 and 8: serial acquire-release on Redis or embedded, against
    /// the raw Redis pair.
    async fn serial(
        &mut self,
        row: char,
        rep: usize,
        metrics: &mut [Metric],
    ) -> Result<(), String> {
        let (metric, client) = if row == '1' {
            (M1, &self.lib)
        } else {
            (M8, &self.memory)
        };
        let raw_key = self.raw.key("serial");
        let n = self.plan.serial_iters;
        let batches = lock_runtime::__private::testing::batched_calls(client);
        let (l, r) = rows::serial(client, "serial", &mut self.raw, &raw_key, n, rep).await?;
        metrics[metric].record(p50(&l), p50(&r));
        if row == '1' {
            // A lone request goes out alone: no batch call is expected here.
            let now = lock_runtime::__private::testing::batched_calls(client);
            metrics[M1].notes.push(format!(
                "rep {}: batch calls during the serial pairs: {} ({} ops)",
                rep + 1,
                now.0 - batches.0,
                now.1 - batches.1
            ));
            // Where the library's extra time goes: its two scripts alone,
            // against the same raw pair.
            let (s, r) = rows::scripted(&mut self.raw, &raw_key, n, rep).await?;
            metrics[M1_SCRIPTS].record(p50(&s), p50(&r));
            // What fencing a write costs: one script call against the bare
            // command.
            let (f, u) = rows::fenced(&mut self.raw, n, rep).await?;
            metrics[M1_FENCE].record(p50(&f), p50(&u));
            // The price of a token, paid only by the locks that ask for it.
            let lib = &self.lib;
            let (l, r) = rows::fenced_pairs(lib, &mut self.raw, n, rep).await?;
            metrics[M1_FENCED_PAIR].record(p50(&l), p50(&r));
        }
        Ok(())
    }

    /// Row 10: a semaphore's permit and a read lock, serial, against the
    /// mutex pair on the same client, in alternating blocks.
    async fn family(&mut self, rep: usize, metrics: &mut [Metric]) -> Result<(), String> {
        let n = self.plan.serial_iters;
        let lib = &self.lib;
        for (metric, permits) in [(M10_SEM, Some(4)), (M10_READ, None)] {
            let (f, m) = rows::blocks(
                n,
                rep,
                async || rows::family_pair(lib, "family", permits).await,
                async || rows::lib_pair(lib, "serial").await,
            )
            .await?;
            metrics[metric].record(p50(&f), p50(&m));
        }
        Ok(())
    }

    /// Row 5: one waiter's hand-over, against the raw pub/sub hand-over; and
    /// the floor, one raw round trip after the same idle.
    async fn handoff(&mut self, rep: usize, metrics: &mut [Metric]) -> Result<(), String> {
        let n = self.plan.handoff_samples;
        let [l, r] = interleave(rep, self.plan.handoff_slices, async |side| {
            if side == 0 {
                rows::handoff_lib(&self.lib, &self.rival, "handoff", n).await
            } else {
                rows::handoff_raw(&self.raw, &self.redis, "handoff", n).await
            }
        })
        .await?;
        metrics[M5].record(p50(&l.concat()), p50(&r.concat()));
        let floor = rows::idle_round_trip(&self.raw, "floor", n).await?;
        metrics[M5_FLOOR].values.push(p50(&floor));
        Ok(())
    }

    /// Row 2: 32 tasks on distinct keys, library, raw and peer, and raw
    /// again on a `ConnectionManager`.
    async fn distinct_keys(&mut self, rep: usize, metrics: &mut [Metric]) -> Result<(), String> {
        let (tasks, window) = (self.plan.par_tasks, self.plan.par_window);
        let (lib, raw, peer, redis) = (&self.lib, &self.raw, &self.peer, &self.redis);
        let managed = &self.managed;
        // Per side: Redis commands (`INFO commandstats`, a script's inner
        // commands counted apart from its `EVALSHA`) and Redis CPU (`INFO
        // cpu`) over its slices, and the pairs done in them.
        let mut cost = [(0u64, 0f64, 0f64); 4];
        // Per side: this process's CPU seconds and the server's reads.
        let mut client = [(0f64, 0u64); 4];
        let batches = lock_runtime::__private::testing::batched_calls(lib);
        let [l, r, p, m] = interleave(rep, self.plan.slices, async |side| {
            let before = load::commandstats(redis).await?;
            let cpu = load::server_cpu(redis).await?;
            let reads = load::server_reads(redis).await?;
            let own = crate::report::cpu_seconds().unwrap_or(0.0);
            let rate = match side {
                0 => rows::pairs_per_sec(lib, tasks, window).await,
                1 => rows::pairs_per_sec(raw, tasks, window).await,
                2 => rows::pairs_per_sec(peer, tasks, window).await,
                _ => rows::pairs_per_sec(managed, tasks, window).await,
            }?;
            client[side].0 += crate::report::cpu_seconds().unwrap_or(0.0) - own;
            let cpu = load::server_cpu(redis).await? - cpu;
            client[side].1 += load::server_reads(redis).await? - reads;
            let spent = load::delta(&before, &load::commandstats(redis).await?);
            cost[side].0 += spent.iter().map(|c| c.1).sum::<u64>();
            cost[side].1 += cpu;
            cost[side].2 += rate * window.as_secs_f64();
            Ok(rate)
        })
        .await?;
        metrics[M2].record(mean(&l), mean(&r));
        metrics[M2_PEER].record(mean(&l), mean(&p));
        metrics[M2_MANAGED].record(mean(&l), mean(&m));
        let per_pair = |(calls, cpu, pairs): (u64, f64, f64)| {
            (calls as f64 / pairs.max(1.0), cpu * 1e6 / pairs.max(1.0))
        };
        let [lc, rc, pc, mc] = cost.map(per_pair);
        // Client CPU per pair, and the pairs a server read carried.
        let [ld, rd, pd, md] = [0, 1, 2, 3].map(|i| {
            let pairs = cost[i].2.max(1.0);
            (client[i].0 * 1e6 / pairs, pairs / client[i].1.max(1) as f64)
        });
        let now = lock_runtime::__private::testing::batched_calls(lib);
        let (calls, ops) = (now.0 - batches.0, now.1 - batches.1);
        metrics[M2].notes.push(format!(
            "rep {}: per pair, library: {:.2} commands, {:.1} us of Redis CPU (INFO cpu); raw: \
             {:.2} commands, {:.1} us; rslock: {:.2} commands, {:.1} us; raw on a \
             ConnectionManager: {:.2} commands, {:.1} us; library / raw Redis CPU {:.2}; client \
             CPU per pair (this process, us) / pairs per server read: library {:.1} / {:.2}, \
             raw {:.1} / {:.2}, rslock {:.1} / {:.2}, raw on a ConnectionManager {:.1} / {:.2}; \
             batches: {ops} ops in {calls} calls ({:.1} per call, largest so far {})",
            rep + 1,
            lc.0,
            lc.1,
            rc.0,
            rc.1,
            pc.0,
            pc.1,
            mc.0,
            mc.1,
            lc.1 / rc.1.max(0.001),
            ld.0,
            ld.1,
            rd.0,
            rd.1,
            pd.0,
            pd.1,
            md.0,
            md.1,
            ops as f64 / calls.max(1) as f64,
            now.2,
        ));
        Ok(())
    }

    /// Rows 11 and 12: an axum route under `wrk`, behind the library's layer
    /// and behind the hand-rolled middleware doing the same job.
    async fn http(&mut self, row: char, rep: usize, metrics: &mut [Metric]) -> Result<(), String> {
        let (metric, sides) = if row == 'y' {
            (M11, [Side::LockLayer, Side::RawLock])
        } else {
            (M12, [Side::Idempotency, Side::RawIdempotency])
        };
        let windows = (self.plan.http_warm, self.plan.http_window);
        let raw_prefix = self.prefixes.raw.as_str();
        // Row 12's records (the library's, the hand-rolled ones), deleted
        // after each side; row 11's keys are deleted at release.
        let records = if row == 'y' {
            Vec::new()
        } else {
            vec![
                format!("{}I*", self.prefixes.lib),
                format!("{raw_prefix}idem:*"),
                format!("{raw_prefix}I*"),
                format!("{raw_prefix}order:*"),
            ]
        };
        let prefix = (raw_prefix, records.as_slice());
        let batches = lock_runtime::__private::testing::batched_calls(&self.lib);
        let [l, r] = http::row(sides, &self.lib, &self.redis, prefix, windows, rep).await?;
        http::record(
            &mut metrics[metric],
            rep,
            (&l, &r),
            ["library", "hand-rolled"],
        );
        if row == 'y' {
            // What fencing alone costs the route, hand-rolled on both sides.
            let sides = [Side::RawFencedLock, Side::RawLock];
            let [f, r] = http::row(sides, &self.lib, &self.redis, prefix, windows, rep).await?;
            let names = ["fenced hand-rolled", "unfenced"];
            http::record(&mut metrics[M11_FENCED], rep, (&f, &r), names);
            // What the library's scripts cost the route, with no client code.
            let sides = [Side::RawLibraryLock, Side::RawLock];
            let [s, r] = http::row(sides, &self.lib, &self.redis, prefix, windows, rep).await?;
            let names = ["library's scripts by hand", "unfenced"];
            http::record(&mut metrics[M11_LIBRARY], rep, (&s, &r), names);
        } else {
            // What a store safe against a late completion costs, hand-rolled.
            let sides = [Side::RawCheckedIdempotency, Side::RawIdempotency];
            let [c, r] = http::row(sides, &self.lib, &self.redis, prefix, windows, rep).await?;
            let names = ["owner-checked hand-rolled", "unchecked"];
            http::record(&mut metrics[M12_CHECKED], rep, (&c, &r), names);
            // What the library's record commands cost the route, alone.
            let sides = [Side::RawLibraryIdempotency, Side::RawIdempotency];
            let [s, r] = http::row(sides, &self.lib, &self.redis, prefix, windows, rep).await?;
            let names = ["library's record commands by hand", "unchecked"];
            http::record(&mut metrics[M12_LIBRARY], rep, (&s, &r), names);
            // What exactly once across crashes costs: the handler's write
            // committed with its record, against the same write sent alone.
            let sides = [Side::IdempotencyCommit, Side::IdempotencyWrite];
            let [c, w] = http::row(sides, &self.lib, &self.redis, prefix, windows, rep).await?;
            let names = ["committed with its record", "written alone"];
            http::record(&mut metrics[M12_COMMIT], rep, (&c, &w), names);
            // The same, committed in the record itself on the lock server.
            let sides = [Side::IdempotencyCommitHere, Side::IdempotencyWrite];
            let [c, w] = http::row(sides, &self.lib, &self.redis, prefix, windows, rep).await?;
            let names = ["committed in its record", "written alone"];
            http::record(&mut metrics[M12_COMMIT_HERE], rep, (&c, &w), names);
        }
        let now = lock_runtime::__private::testing::batched_calls(&self.lib);
        let (calls, ops) = (now.0 - batches.0, now.1 - batches.1);
        metrics[metric].notes.push(format!(
            "rep {}: batches of the library's client: {ops} ops in {calls} calls ({:.1} per call)",
            rep + 1,
            ops as f64 / calls.max(1) as f64
        ));
        Ok(())
    }

    /// Row 4: 32 tasks on one key, zero hold: library, raw spin and peer.
    async fn hot_zero_hold(&mut self, rep: usize, metrics: &mut [Metric]) -> Result<(), String> {
        let (tasks, window) = (self.plan.hot_zero_tasks, self.plan.hot_zero_window);
        let (lib, raw, peer) = (&self.lib, &self.raw, &self.peer);
        let zero = Duration::ZERO;
        let [l, r, p] = interleave(rep, self.plan.slices, async |side| match side {
            0 => rows::hot(lib, "hot0", tasks, zero, window).await,
            1 => rows::hot(raw, "hot0", tasks, zero, window).await,
            _ => rows::hot(peer, "hot0", tasks, zero, window).await,
        })
        .await?;
        let rate = Hot::rate_of(&l);
        self.row4_rate = Some(rate);
        metrics[M4_GRANTS].record(rate, Hot::rate_of(&p));
        metrics[M4_SPIN].record(rate, Hot::rate_of(&r));
        metrics[M4_FAIR].record(Hot::fairness_of(&l), Hot::fairness_of(&p));
        let waits = [&l, &r, &p].map(|slices| Hot::pooled(slices, |h| &h.waits));
        metrics[M4_WAIT].record(p99_ms(&waits[0]), p99_ms(&waits[2]));
        let range = |slices: &[Hot]| {
            let (min, max) = Hot::grant_range(slices);
            format!("{min}-{max}")
        };
        metrics[M4_FAIR].notes.push(format!(
            "rep {}: grants per task in a {} ms slice: library {}, rslock {}, raw spin {} \
             (max/min {:.2}); wait p99: raw spin {:.2} ms",
            rep + 1,
            window.as_millis(),
            range(&l),
            range(&p),
            range(&r),
            Hot::fairness_of(&r),
            p99_ms(&waits[1]),
        ));
        for (all, w) in self.waits4.iter_mut().zip(waits) {
            all.extend(w);
        }
        Ok(())
    }

    /// Row 3: 16 tasks on one key, 1 ms hold, against the ceiling (the same
    /// hold back to back with no lock).
    async fn hot_hold(&mut self, rep: usize, metrics: &mut [Metric]) -> Result<(), String> {
        let plan = self.plan;
        let (tasks, hold, window) = (plan.hot_hold_tasks, plan.hold, plan.hot_hold_window);
        let lib = &self.lib;
        let [l, c] = interleave(rep, plan.slices, async |side| {
            if side == 0 {
                rows::hot(lib, "hot1", tasks, hold, window).await
            } else {
                rows::hold_ceiling(hold, plan.ceiling_window).await
            }
        })
        .await?;
        let waits = Hot::pooled(&l, |h| &h.waits);
        let mean_hold = mean(&Hot::pooled(&l, |h| &h.holds));
        let ceiling_hold = mean(&Hot::pooled(&c, |h| &h.holds));
        metrics[M3_GRANTS].record(Hot::rate_of(&l), Hot::rate_of(&c));
        let queue_wait_ms = (tasks - 1) as f64 * mean_hold / 1e3;
        metrics[M3_WAIT].record(p99_ms(&waits), queue_wait_ms);
        let (min, max) = Hot::grant_range(&l);
        metrics[M3_GRANTS].notes.push(format!(
            "rep {}: mean hold {:.0} us under the lock, {:.0} us in the ceiling loop; \
             grants per task in a {} ms slice {min}-{max}; wait p50 {:.2} ms, max {:.2} ms",
            rep + 1,
            mean_hold,
            ceiling_hold,
            window.as_millis(),
            median(&waits) / 1e3,
            percentile(&waits, 100.0) / 1e3,
        ));
        self.waits3.extend(waits);
        Ok(())
    }

    /// Row 9: two child processes of 16 tasks each on one key.
    async fn two_processes(&mut self, rep: usize, metrics: &mut [Metric]) -> Result<(), String> {
        let (url, prefix) = (self.url.to_string(), self.prefixes.lib.clone());
        let (tasks, window) = (self.plan.cross_tasks, self.plan.cross_window);
        let runs =
            tokio::task::spawn_blocking(move || probe::two_processes(&url, &prefix, tasks, window))
                .await
                .map_err(|e| format!("row 9: {e}"))??;
        let grants = runs.each_ref().map(|r| r.grants);
        let (fewest, most) = (grants[0].min(grants[1]), grants[0].max(grants[1]));
        let fairness = if fewest == 0.0 {
            f64::INFINITY
        } else {
            most / fewest
        };
        metrics[M9_FAIR].values.push(fairness);
        let rate = (grants[0] + grants[1]) / window.as_secs_f64();
        match self.row4_rate {
            Some(one_process) => metrics[M9_RATE].record(rate, one_process),
            None => metrics[M9_RATE].values.push(rate),
        }
        let each = |r: &probe::CrossRun| {
            format!(
                "{} (per task {}-{}, wait p99 {:.2} ms)",
                r.grants,
                r.per_task.0,
                r.per_task.1,
                r.wait_p99_us / 1e3
            )
        };
        metrics[M9_FAIR].notes.push(format!(
            "rep {}: grants in {} ms: process A {}, process B {}",
            rep + 1,
            window.as_millis(),
            each(&runs[0]),
            each(&runs[1]),
        ));
        Ok(())
    }

    /// Row 7: thousands of locks held under the watchdog.
    async fn held(&mut self, rep: usize, metrics: &mut [Metric]) -> Result<(), String> {
        let plan = self.plan;
        let run = held_under_watchdog(
            &self.lib,
            &self.rival,
            &self.redis,
            plan.held_locks,
            plan.held_ttl,
            plan.held_periods,
        )
        .await?;
        metrics[M7].record(run.per_100_per_period, 100.0);
        metrics[M7_CPU].values.push(run.cpu_percent);
        metrics[M7].notes.push(format!(
            "rep {}: {} locks, ttl {} ms, taken in {:.0} ms; per 100 locks per period: \
             {:.2} script calls, {:.1} server-side commands (INFO total_commands_processed, \
             counts the GET/PEXPIRE inside scripts); keys per script call min {} median {} \
             max {}; lost at the end: {}; pub/sub (UN)SUBSCRIBE not counted: {}",
            rep + 1,
            plan.held_locks,
            plan.held_ttl.as_millis(),
            run.acquire_ms,
            run.scripts_per_100_per_period,
            run.server_per_100_per_period,
            run.keys_per_script.0,
            run.keys_per_script.1,
            run.keys_per_script.2,
            run.lost,
            run.pubsub,
        ));
        metrics[M7_SAFE]
            .values
            .push((run.lost + run.takeable) as f64);
        if run.lost + run.takeable > 0 {
            metrics[M7_SAFE].notes.push(format!(
                "rep {}: {} guards reported lost, {} locks taken by a second client while \
                 their guards were held",
                rep + 1,
                run.lost,
                run.takeable
            ));
        }
        Ok(())
    }

    /// The chart's panels: rows 3 and 4, every repetition's waits pooled.
    fn panels(&mut self, opts: &Options, metrics: &[Metric]) -> Vec<Panel> {
        let reps = format!("{} repetition(s)", opts.reps);
        let series = |label: &str, waits: &mut Vec<f64>| Series {
            label: label.to_string(),
            waits_us: std::mem::take(waits),
        };
        let ideal = metrics[M3_WAIT].baseline();
        let [lib4, raw4, peer4] = &mut self.waits4;
        vec![
            Panel {
                title: format!("Row 3: one key, 16 tasks, 1 ms hold ({reps})"),
                series: vec![series("library", &mut self.waits3)],
                target: ideal.map(|ideal| {
                    let at = 1.2 * ideal;
                    (format!("target p99: 1.2 x ideal FIFO = {at:.1} ms"), at)
                }),
            },
            Panel {
                title: format!("Row 4: one key, 32 tasks, zero hold ({reps})"),
                series: vec![
                    series("library", lib4),
                    series(PEER_HOT, peer4),
                    series(RAW_SPIN, raw4),
                ],
                target: Some(("target p99: 20 ms".to_string(), 20.0)),
            },
        ]
    }
}

/// The server's `INFO server` answer.
async fn server_info(client: &redis::Client) -> Result<String, String> {
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    Ok(info)
}
