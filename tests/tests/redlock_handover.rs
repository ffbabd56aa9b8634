//! The hand-over latency of a 3-master Redlock client: a waiter of another
//! client, woken by the release notice, holds within milliseconds of the
//! release. Its retry may cross the release on the masters (it reaches a
//! master the release has not reached yet, takes only that one, and gives it
//! back): that is no split vote between contenders, and it must not pay the
//! random pause of one (up to a per-node timeout, a second by default).
//!
//! The crossing needs a releaser whose requests to the masters leave a few
//! milliseconds apart: three threads spin on the test's 2 cores meanwhile.
//! Before the brief pauses after a free notice, 3 runs of this test in 12
//! had a hand-over past 300 ms (up to 913 ms); after, 0 in 12 (max 118 ms).
//! See FAULTS.md, "Redlock hand-over tail".

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

use test_support::helpers::*;
use test_support::topology::{Redlock, Topology};

/// Latencies of `runs` hand-overs between two clients of `masters`, each on
/// a fresh key: from the release to the waiter's acquire returning.
async fn handover_latencies(masters: &Redlock, runs: usize) -> Vec<Duration> {
    let holder = client(&masters.builder()).await;
    let waiter = client(&masters.builder()).await;
    let mut latencies = Vec::with_capacity(runs);
    // The first wait of a client opens its notice connections: not measured.
    for run in 0..=runs {
        let key = key(&format!("handover-{run}"));
        let guard = holder.lock(&key).acquire().await.unwrap();
        // The holder's requests still in flight to the last master (they go
        // on once a majority answered) would race the waiter's first attempt:
        // contention, not a hand-over.
        let name = lock_name(&key);
        eventually(secs(2), "every master holds the lock", || {
            masters.nodes_holding(&name).len() == 3
        })
        .await;
        let waiting = spawn_waiter(&waiter, &key, secs(10));
        // Registered and asleep on its notices by then.
        tokio::time::sleep(ms(30)).await;
        let released = Instant::now();
        guard.release().await.unwrap();
        let held = waiting.await.expect("the waiter task");
        if run > 0 {
            latencies.push(held.duration_since(released));
        }
    }
    latencies
}

/// Threads that spin until dropped: a loaded machine, where a releaser's
/// requests to the masters leave milliseconds apart.
struct Spinners(Arc<AtomicBool>, Vec<std::thread::JoinHandle<()>>);

impl Spinners {
    fn start(n: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..n)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        Self(stop, threads)
    }
}

impl Drop for Spinners {
    fn drop(&mut self) {
        self.0.store(true, Relaxed);
        self.1.drain(..).for_each(|t| t.join().unwrap());
    }
}

fn percentile(sorted: &[Duration], p: usize) -> Duration {
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_woken_redlock_waiter_holds_without_a_split_vote_pause() {
    const RUNS: usize = 40;
    let masters = Redlock::start(3);
    let spinners = Spinners::start(3);
    let mut latencies = handover_latencies(&masters, RUNS).await;
    drop(spinners);
    latencies.sort();
    let (p50, p99, max) = (
        percentile(&latencies, 50),
        percentile(&latencies, 99),
        *latencies.last().unwrap(),
    );
    println!(
        "Redlock (3 masters) hand-over over {RUNS} runs: p50 {p50:?}, p99 {p99:?}, max {max:?}; \
         all: {latencies:?}"
    );
    assert!(max < ms(300), "a hand-over took {max:?}");
}
