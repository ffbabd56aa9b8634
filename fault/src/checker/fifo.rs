//! Waiters keep their order (scenario 12): a mutex's waiters are served
//! first come, first served, also when the key is handed on because a
//! holder's lease ran out (it was killed, or stopped past its lease) rather
//! than by a release.
//!
//! The evidence is the workers' logs, on the one `CLOCK_MONOTONIC` time line
//! (see [`crate::log`]):
//!
//! * a waiting acquire's `Queued` line: the answer of a read of the key's
//!   queue that listed it, so at that time it surely stood in line (the
//!   first busy answer came back before; the queue is read, not the
//!   library's internals, so this is a little later than that answer);
//! * every acquisition's `Attempt` line, written before its first request
//!   was sent, and its `Acquired` line, written after the grant came back;
//! * how a wait ended without the lock (`GaveUp`, a try-once's busy answer,
//!   a cancel), and the harness's strikes (`SIGSTOP`, `SIGKILL`) per process.
//!
//! **The rule.** If waiter A was seen in line before B's attempt was sent,
//! and A neither stopped waiting nor was struck before B acquired, then A
//! acquired before B. Otherwise B *overtook* A: one violation per such
//! acquisition B (a try-once newcomer B included: it must never be granted
//! while a live, earlier waiter is in line), with the earliest such A as the
//! example.
//!
//! Acquisitions of a mutex are exclusive, so the order of the `Acquired`
//! lines is the order of the grants for holders that released (B's grant
//! came after A's release, which came after A's `Acquired` line); a holder
//! struck before it logged its grant counts as struck.
//!
//! **A hand-over that lapsed.** A waiter the key was handed to (its entry
//! left the line while the key named its token: a `Left` line with
//! `handed`) owns the key for the hand-over's lease (the waiter's own lease,
//! 401-500 ms here) and must take it up within it. One that did not (its
//! process went unscheduled that long) lost its turn like a holder stopped
//! past its lease: the key went on to the next in line, and the waiter
//! queued again at the back. So a hand-over to A seen before B's grant,
//! with A granted only after B, is such a lapse (a mutex gave B the key
//! only after A's hand-over ran out), and from then A counts as in line
//! only from its next `Queued` line. B passing A because of it is no
//! violation; it is counted ([`Stats::passed_lapsed`]), as are the lapses
//! the watcher saw (the key stopped naming A while A's acquire was pending:
//! [`Stats::lapsed`]). A hand-over can also come and lapse between two
//! reads of A's watcher, when A's whole process (the watcher runs in it)
//! went unscheduled for longer than A's lease: the next read finds A's
//! entry gone and the key someone else's (a `Left` line without `handed`,
//! its `gap_us` at least the shortest lease of the run). Nothing else
//! takes an entry out of the line while its wait lasts (a hand-over names
//! the entry's token in the key; the scripts skip only entries whose wait
//! has ended), so that too is a lapse ([`Stats::unseen_lapses`]); an entry
//! gone after a short gap is not, and a grant passing it is a violation.
//! Likewise an acquire error of A (`AcquireError`: the
//! library dropped that attempt, which leaves the line, and the worker
//! tries again with a new one): A counts as in line again only from its
//! next `Queued` line ([`Stats::passed_errored`]).

use std::collections::{BTreeMap, HashMap};

use super::{RunData, ms};
use crate::log::{Event, Fault};

/// What the waiters' order rests on in one run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Waiting acquires seen in a queue (the waiters the rule protects).
    pub queued: u64,
    /// Grants whose acquire was attempted while an earlier waiter stood in
    /// line, still waiting: those the rule had something to say about.
    pub behind: u64,
    /// Try-once acquires granted ...
    pub try_once_granted: u64,
    /// ... and found busy.
    pub try_once_refused: u64,
    /// Hand-overs to a waiter that ran out before it took the key up
    /// (`Lapsed` lines).
    pub lapsed: u64,
    /// Entries that left the line, the key not theirs, while their
    /// watcher's process went unscheduled for longer than a lease (a
    /// hand-over that came and lapsed unseen).
    pub unseen_lapses: u64,
    /// Grants that passed a waiter in line before them only because that
    /// waiter's hand-over had lapsed in between (no violation).
    pub passed_lapsed: u64,
    /// Grants that passed a waiter in line before them only because that
    /// waiter's attempt had failed in between (`AcquireError`, retried with
    /// a new attempt; no violation).
    pub passed_errored: u64,
    /// Reads that found a key's queue list and its deadlines disagreeing
    /// (`QueueMismatch` lines; at most one per operation).
    pub mismatches: u64,
}

/// The rule's findings: one message per overtaking acquisition.
#[derive(Clone, Debug, Default)]
pub struct Found {
    /// Acquisitions that overtook a live, earlier waiter, described.
    pub overtaken: Vec<String>,
    /// The counts the rule rests on.
    pub stats: Stats,
}

/// One acquire, as far as its order goes.
#[derive(Clone, Debug)]
struct Wait {
    worker: u32,
    process: u32,
    op: u64,
    key: String,
    /// `Attempt` (before the first request was sent).
    attempt: u64,
    /// Seen in the key's queue: the first time, and each time again after
    /// it had left it.
    queued: Vec<u64>,
    /// Left the line with the key handed to it (`Left` with `handed`), or
    /// without it after a gap of its watcher longer than a lease (a
    /// hand-over that lapsed unseen).
    handed: Vec<u64>,
    /// Every `Left` line: time, the key handed to it, the watcher's gap
    /// before that read (µs), for the violation's description.
    left: Vec<(u64, bool, u64)>,
    /// An attempt failed (`AcquireError`) and a new one was made.
    errors: Vec<u64>,
    /// `Acquired` (after the grant came back).
    acquired: Option<u64>,
    /// Stopped waiting without the lock (gave up, busy, cancelled).
    ended: Option<u64>,
    /// A try-once acquire.
    once: bool,
}

/// Applies the rule to every key of `run` (the first key of each attempt:
/// scenario 12 takes single mutexes).
pub fn check(run: &RunData) -> Found {
    let mut found = Found::default();
    // Strikes per process: a stop's start, a kill.
    let mut strikes: HashMap<u32, Vec<u64>> = HashMap::new();
    for f in &run.faults {
        match f {
            Fault::StopWorker { worker, start, .. } => {
                strikes.entry(*worker).or_default().push(*start)
            }
            Fault::KillWorker { worker, t } => strikes.entry(*worker).or_default().push(*t),
            _ => {}
        }
    }
    // The shortest lease of the run: worker `n`'s is the scenario's less
    // `n` ms (see `worker::fifo`); a watcher's gap at least this long may
    // hide a whole hand-over.
    let max_id = run
        .workers
        .iter()
        .map(|w| u64::from(w.id))
        .max()
        .unwrap_or(0);
    let shortest_lease_us = run.ttl_ms.saturating_sub(max_id).max(1) * 1_000;
    let struck = |process: u32, from: u64, to: u64| {
        strikes
            .get(&process)
            .is_some_and(|ts| ts.iter().any(|&t| t >= from && t <= to))
    };
    let mut by_key: BTreeMap<String, Vec<Wait>> = BTreeMap::new();
    for w in &run.workers {
        let mut current: HashMap<u64, Wait> = HashMap::new();
        for e in &w.events {
            match e {
                Event::Attempt { op, key, t, .. } => {
                    current.insert(
                        *op,
                        Wait {
                            worker: w.id,
                            process: w.process,
                            op: *op,
                            key: key.clone(),
                            attempt: *t,
                            queued: Vec::new(),
                            handed: Vec::new(),
                            left: Vec::new(),
                            errors: Vec::new(),
                            acquired: None,
                            ended: None,
                            once: false,
                        },
                    );
                }
                Event::Queued { op, t } => {
                    if let Some(wait) = current.get_mut(op) {
                        wait.queued.push(*t);
                    }
                }
                Event::Left {
                    op,
                    t,
                    handed,
                    gap_us,
                } => {
                    if let Some(wait) = current.get_mut(op) {
                        wait.left.push((*t, *handed, *gap_us));
                        if *handed {
                            wait.handed.push(*t);
                        } else if *gap_us >= shortest_lease_us {
                            found.stats.unseen_lapses += 1;
                            wait.handed.push(*t);
                        }
                    }
                }
                Event::AcquireError { op, t, .. } => {
                    if let Some(wait) = current.get_mut(op) {
                        wait.errors.push(*t);
                    }
                }
                Event::Lapsed { .. } => found.stats.lapsed += 1,
                Event::QueueMismatch { .. } => found.stats.mismatches += 1,
                Event::TryOnce { op, granted, t } => {
                    if let Some(wait) = current.get_mut(op) {
                        wait.once = true;
                        if !granted {
                            wait.ended = Some(*t);
                        }
                    }
                }
                Event::Acquired { op, t, .. } => {
                    if let Some(wait) = current.get_mut(op) {
                        wait.acquired = Some(*t);
                    }
                }
                Event::GaveUp { op, t, .. } | Event::Cancelled { op, t, .. } => {
                    if let Some(wait) = current.get_mut(op) {
                        wait.ended.get_or_insert(*t);
                    }
                }
                _ => {}
            }
        }
        for wait in current.into_values() {
            if wait.once {
                if wait.acquired.is_some() {
                    found.stats.try_once_granted += 1;
                } else {
                    found.stats.try_once_refused += 1;
                }
            }
            found.stats.queued += u64::from(!wait.queued.is_empty());
            by_key.entry(wait.key.clone()).or_default().push(wait);
        }
    }
    for (key, waits) in &by_key {
        let mut queued: Vec<&Wait> = waits.iter().filter(|w| !w.queued.is_empty()).collect();
        queued.sort_unstable_by_key(|w| w.queued[0]);
        let mut granted: Vec<&Wait> = waits.iter().filter(|w| w.acquired.is_some()).collect();
        granted.sort_unstable_by_key(|w| w.acquired);
        for b in granted {
            let Some(b_acquired) = b.acquired else {
                continue;
            };
            let other = |a: &&&Wait| (a.worker, a.op) != (b.worker, b.op);
            let first_in_line = |a: &&&Wait| a.queued[0] < b.attempt;
            let waited_on = |a: &&&Wait| a.acquired.or(a.ended).unwrap_or(u64::MAX) > b.attempt;
            if queued
                .iter()
                .any(|a| other(&a) && first_in_line(&a) && waited_on(&a))
            {
                found.stats.behind += 1;
            }
            // Still waiting, alive, when B got the key.
            let live = |a: &&&Wait| {
                a.acquired.is_none_or(|t| t > b_acquired)
                    && a.ended.is_none_or(|t| t > b_acquired)
                    && !struck(a.process, a.attempt, b_acquired)
            };
            // The earliest waiter in line (since its last lapsed hand-over)
            // before B was attempted that was still waiting, alive, when B
            // got the key.
            let passed = queued.iter().find(|a| {
                other(a) && live(a) && in_line_since(a, b_acquired).is_some_and(|q| q < b.attempt)
            });
            let Some(a) = passed else {
                let restarted = queued
                    .iter()
                    .find(|a| other(a) && first_in_line(a) && live(a));
                if let Some(a) = restarted {
                    let last = |ts: &[u64]| ts.iter().rev().copied().find(|&t| t < b_acquired);
                    if last(&a.handed) >= last(&a.errors) {
                        found.stats.passed_lapsed += 1;
                    } else {
                        found.stats.passed_errored += 1;
                    }
                }
                continue;
            };
            found.overtaken.push(format!(
                "{key}: worker {} op {} ({}, attempt sent at {} µs) was granted at {} µs while worker {} op {}, in line since {} µs, still waited ({}){}",
                b.worker,
                b.op,
                if b.once { "try-once" } else { "waiting" },
                b.attempt,
                b_acquired,
                a.worker,
                a.op,
                in_line_since(a, b_acquired).unwrap_or_default(),
                match a.acquired {
                    Some(t) => format!("it got the key {} ms later", ms(t - b_acquired)),
                    None => "it never got the key".to_string(),
                },
                describe_left(&a.left),
            ));
        }
    }
    found
}

/// A waiter's `Left` lines, for a violation's description: where its
/// entry went, as its watcher saw it.
fn describe_left(left: &[(u64, bool, u64)]) -> String {
    let seen: Vec<String> = left
        .iter()
        .map(|&(t, handed, gap)| {
            format!(
                "{} at {t} µs, {} ms after the read before",
                if handed {
                    "handed the key"
                } else {
                    "left the line"
                },
                ms(gap)
            )
        })
        .collect();
    if seen.is_empty() {
        String::new()
    } else {
        format!("; its watcher saw it {}", seen.join(", "))
    }
}

/// Since when waiter `a`, not granted before `granted`, stood in line as far
/// as a grant at `granted` goes: its first `Queued` time, or, when the key
/// was handed to it before `granted` (that hand-over lapsed: the key went
/// on without it) or an attempt of it failed before `granted`, its first
/// `Queued` time after the last such event (`None`: not seen in line again).
fn in_line_since(a: &Wait, granted: u64) -> Option<u64> {
    let restart = a
        .handed
        .iter()
        .chain(&a.errors)
        .copied()
        .filter(|&t| t < granted)
        .max();
    match restart {
        Some(r) => a.queued.iter().copied().find(|&q| q > r),
        None => a.queued.first().copied(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checker::tests::attempt;
    use crate::checker::{self, WorkerLog};

    fn acquired(op: u64, t: u64) -> Event {
        Event::Acquired {
            op,
            fence: t,
            more_fences: vec![],
            t,
        }
    }

    /// A waiter: attempt at `at`, seen in line at `queued`, granted at
    /// `granted` (µs).
    fn waiter(at: u64, queued: u64, granted: Option<u64>) -> Vec<Event> {
        let mut events = vec![attempt(1, at), Event::Queued { op: 1, t: queued }];
        events.extend(granted.map(|t| acquired(1, t)));
        events
    }

    /// A try-once acquire at `at`, granted at `granted`.
    fn try_once(at: u64, granted: Option<u64>) -> Vec<Event> {
        let mut events = vec![attempt(1, at)];
        match granted {
            Some(t) => events.extend([
                Event::TryOnce {
                    op: 1,
                    granted: true,
                    t,
                },
                acquired(1, t),
            ]),
            None => events.push(Event::TryOnce {
                op: 1,
                granted: false,
                t: at + 100,
            }),
        }
        events
    }

    fn run(logs: Vec<Vec<Event>>, faults: Vec<Fault>) -> RunData {
        // Every worker drew one operation.
        let drawn = (0..logs.len() as u32).map(|id| (id, 1)).collect();
        RunData {
            drawn,
            ttl_ms: 500,
            slack_ms: 1000,
            workers: (0..)
                .zip(logs)
                .map(|(id, events)| WorkerLog {
                    id,
                    process: id,
                    events,
                })
                .collect(),
            faults,
            fifo: true,
            ..RunData::default()
        }
    }

    #[test]
    fn a_later_arrival_granted_before_a_live_waiter_in_line_overtook_it() {
        // Worker 0 is in line at 2 ms; worker 1 arrives at 5 ms and gets
        // the key at 10 ms; worker 0 only at 20 ms.
        let overtaking = run(
            vec![
                waiter(1_000, 2_000, Some(20_000)),
                waiter(5_000, 6_000, Some(10_000)),
            ],
            vec![],
        );
        let found = check(&overtaking);
        assert_eq!(found.overtaken.len(), 1, "{:?}", found.overtaken);
        assert!(found.overtaken[0].contains("worker 1 op 1 (waiting"));
        assert!(found.overtaken[0].contains("worker 0 op 1, in line since 2000"));
        // Through the checker: a violation, with the example.
        let report = checker::check(&overtaking);
        assert_eq!(report.violations.overtaken, 1);
        assert_eq!(report.violations.total(), 1, "{report}");
        assert!(
            report.examples[0].contains("still waited"),
            "{:?}",
            report.examples
        );

        // Served in order: none.
        let in_order = run(
            vec![
                waiter(1_000, 2_000, Some(10_000)),
                waiter(5_000, 6_000, Some(20_000)),
            ],
            vec![],
        );
        assert!(check(&in_order).overtaken.is_empty());
        assert_eq!(checker::check(&in_order).violations.total(), 0);
        assert_eq!(checker::check(&in_order).fifo.map(|s| s.queued), Some(2));
    }

    #[test]
    fn a_waiter_seen_in_line_only_after_the_other_was_attempted_may_be_passed() {
        // Worker 1's attempt (5 ms) was sent before worker 0 was seen in
        // line (6 ms): who came first is not known.
        let unknown = run(
            vec![
                waiter(1_000, 6_000, Some(20_000)),
                waiter(5_000, 7_000, Some(10_000)),
            ],
            vec![],
        );
        assert!(check(&unknown).overtaken.is_empty());
    }

    #[test]
    fn a_waiter_that_gave_up_or_was_struck_before_the_grant_may_be_passed() {
        let mut gave_up = waiter(1_000, 2_000, None);
        gave_up.push(Event::GaveUp {
            op: 1,
            error: "busy".into(),
            t: 8_000,
        });
        let later = waiter(5_000, 6_000, Some(10_000));
        assert!(
            check(&run(vec![gave_up.clone(), later.clone()], vec![]))
                .overtaken
                .is_empty()
        );
        // It gave up only after the other's grant: overtaken.
        let mut late_give_up = waiter(1_000, 2_000, None);
        late_give_up.push(Event::GaveUp {
            op: 1,
            error: "busy".into(),
            t: 12_000,
        });
        assert_eq!(
            check(&run(vec![late_give_up, later.clone()], vec![]))
                .overtaken
                .len(),
            1
        );
        // Killed, or stopped, in line before the grant.
        let still = waiter(1_000, 2_000, None);
        for fault in [
            Fault::KillWorker {
                worker: 0,
                t: 9_000,
            },
            Fault::StopWorker {
                worker: 0,
                start: 9_000,
                end: 900_000,
            },
        ] {
            let data = run(vec![still.clone(), later.clone()], vec![fault]);
            assert!(check(&data).overtaken.is_empty());
        }
        // Struck after the grant: it was alive and waiting, so overtaken.
        let data = run(
            vec![still, later],
            vec![Fault::KillWorker {
                worker: 0,
                t: 11_000,
            }],
        );
        assert_eq!(check(&data).overtaken.len(), 1);
    }

    #[test]
    fn a_try_once_newcomer_granted_while_a_waiter_is_in_line_overtook_it() {
        let overtaking = run(
            vec![
                waiter(1_000, 2_000, Some(20_000)),
                try_once(5_000, Some(5_500)),
            ],
            vec![],
        );
        let found = check(&overtaking);
        assert_eq!(found.overtaken.len(), 1);
        assert!(found.overtaken[0].contains("(try-once"));
        assert_eq!(
            found.stats,
            Stats {
                queued: 1,
                behind: 1,
                try_once_granted: 1,
                try_once_refused: 0,
                ..Stats::default()
            }
        );
        // Refused, or granted once the line was served: fine, and a
        // refusal is no "waiter never acquired".
        let served = run(
            vec![
                waiter(1_000, 2_000, Some(4_000)),
                try_once(5_000, Some(5_500)),
                try_once(3_000, None),
            ],
            vec![],
        );
        assert!(check(&served).overtaken.is_empty());
        let report = checker::check(&served);
        assert_eq!(
            report.violations.total(),
            0,
            "{report} {:?}",
            report.examples
        );
        assert_eq!(
            report.fifo,
            Some(Stats {
                queued: 1,
                behind: 0,
                try_once_granted: 1,
                try_once_refused: 1,
                ..Stats::default()
            })
        );
    }

    /// The key handed to waiter op 1 at `t` (its entry left the line).
    fn handed(t: u64) -> Event {
        Event::Left {
            op: 1,
            t,
            handed: true,
            gap_us: 2_000,
        }
    }

    #[test]
    fn a_waiter_whose_hand_over_lapsed_before_the_grant_may_be_passed_and_is_counted() {
        // Worker 0 is in line at 2 ms and handed the key at 8 ms; its
        // process does not take it up within the lease, the key goes on to
        // worker 1 (in line since 6 ms) at 10 ms, and worker 0, queued again
        // at 12 ms, gets the key at 20 ms.
        let mut lapsed = waiter(1_000, 2_000, None);
        lapsed.extend([
            handed(8_000),
            Event::Lapsed {
                op: 1,
                t: 9_500,
                max_gap_us: 480_000,
            },
            Event::Queued { op: 1, t: 12_000 },
            acquired(1, 20_000),
        ]);
        let later = waiter(5_000, 6_000, Some(10_000));
        let data = run(vec![lapsed.clone(), later.clone()], vec![]);
        let found = check(&data);
        assert!(found.overtaken.is_empty(), "{:?}", found.overtaken);
        assert_eq!((found.stats.lapsed, found.stats.passed_lapsed), (1, 1));
        let report = checker::check(&data);
        assert_eq!(report.violations.total(), 0, "{report}");

        // The same grants without the hand-over seen: overtaken.
        let unseen: Vec<Event> = lapsed
            .iter()
            .filter(|e| !matches!(e, Event::Left { .. } | Event::Lapsed { .. }))
            .cloned()
            .collect();
        let found = check(&run(vec![unseen, later.clone()], vec![]));
        assert_eq!(found.overtaken.len(), 1, "{:?}", found.overtaken);
        assert_eq!(found.stats.passed_lapsed, 0);

        // A hand-over that was not to it (its entry left the line, the key
        // named someone else) excuses nothing.
        let not_handed: Vec<Event> = lapsed
            .iter()
            .map(|e| match e {
                Event::Left { op, t, gap_us, .. } => Event::Left {
                    op: *op,
                    t: *t,
                    handed: false,
                    gap_us: *gap_us,
                },
                e => e.clone(),
            })
            .collect();
        let found = check(&run(vec![not_handed.clone(), later.clone()], vec![]));
        assert_eq!(found.overtaken.len(), 1, "{:?}", found.overtaken);
        assert!(
            found.overtaken[0].contains("left the line at 8000 µs, 2 ms after"),
            "{:?}",
            found.overtaken
        );

        // The same entry gone after its watcher went unscheduled for longer
        // than the shortest lease: a hand-over may have come and lapsed
        // between the two reads. Counted, no violation.
        let gap = |gap_us| {
            not_handed
                .iter()
                .filter(|e| !matches!(e, Event::Lapsed { .. }))
                .map(|e| match e {
                    Event::Left { op, t, handed, .. } => Event::Left {
                        op: *op,
                        t: *t,
                        handed: *handed,
                        gap_us,
                    },
                    e => e.clone(),
                })
                .collect::<Vec<_>>()
        };
        let data = run(vec![gap(500_000), later.clone()], vec![]);
        assert_eq!(data.ttl_ms, 500);
        let found = check(&data);
        assert!(found.overtaken.is_empty(), "{:?}", found.overtaken);
        assert_eq!(
            (found.stats.unseen_lapses, found.stats.passed_lapsed),
            (1, 1)
        );
        // A gap just short of the shortest lease (500 ms less the highest
        // worker id, 1) excuses nothing.
        let found = check(&run(vec![gap(498_999), later], vec![]));
        assert_eq!(found.overtaken.len(), 1, "{:?}", found.overtaken);
        assert_eq!(found.stats.unseen_lapses, 0);
    }

    #[test]
    fn a_waiter_whose_attempt_failed_before_the_grant_may_be_passed_and_is_counted() {
        // Worker 0's attempt failed at 7 ms (the library left the line with
        // it); its next one stood in line at 12 ms, after worker 1's attempt.
        let mut errored = waiter(1_000, 2_000, None);
        errored.extend([
            Event::AcquireError {
                op: 1,
                error: "response timed out".into(),
                t: 7_000,
            },
            Event::Queued { op: 1, t: 12_000 },
            acquired(1, 20_000),
        ]);
        let later = waiter(5_000, 6_000, Some(10_000));
        let found = check(&run(vec![errored.clone(), later.clone()], vec![]));
        assert!(found.overtaken.is_empty(), "{:?}", found.overtaken);
        assert_eq!(
            (found.stats.passed_errored, found.stats.passed_lapsed),
            (1, 0)
        );
        // The error came after worker 1's grant: overtaken.
        let late: Vec<Event> = errored
            .into_iter()
            .map(|e| match e {
                Event::AcquireError { op, error, .. } => Event::AcquireError {
                    op,
                    error,
                    t: 11_000,
                },
                e => e,
            })
            .collect();
        let found = check(&run(vec![late, later], vec![]));
        assert_eq!(found.overtaken.len(), 1, "{:?}", found.overtaken);
    }

    #[test]
    fn a_waiter_queued_again_after_its_hand_over_lapsed_is_in_line_again() {
        // Worker 0's hand-over (at 3 ms) lapsed; it stood in line again at
        // 4 ms, before worker 1's attempt (5 ms): worker 1's grant at 10 ms,
        // before worker 0's at 20 ms, overtook it.
        let mut again = waiter(1_000, 2_000, None);
        again.extend([
            handed(3_000),
            Event::Queued { op: 1, t: 4_000 },
            acquired(1, 20_000),
        ]);
        let later = waiter(5_000, 6_000, Some(10_000));
        let found = check(&run(vec![again, later.clone()], vec![]));
        assert_eq!(found.overtaken.len(), 1, "{:?}", found.overtaken);
        assert!(
            found.overtaken[0].contains("in line since 4000"),
            "{:?}",
            found.overtaken
        );
        assert_eq!(found.stats.passed_lapsed, 0);

        // A hand-over it took up (granted at 9 ms, before worker 1): in
        // order, nothing passed.
        let mut took = waiter(1_000, 2_000, None);
        took.extend([handed(8_000), acquired(1, 9_000)]);
        let found = check(&run(vec![took, later], vec![]));
        assert!(found.overtaken.is_empty(), "{:?}", found.overtaken);
        assert_eq!(found.stats.passed_lapsed, 0);
    }

    #[test]
    fn without_the_fifo_flag_the_rule_is_not_applied() {
        let overtaking = RunData {
            fifo: false,
            ..run(
                vec![
                    waiter(1_000, 2_000, Some(20_000)),
                    waiter(5_000, 6_000, Some(10_000)),
                ],
                vec![],
            )
        };
        let report = checker::check(&overtaking);
        assert_eq!(report.violations.overtaken, 0);
        assert_eq!(report.fifo, None);
    }
}
