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
    /// First seen in the key's queue.
    queued: Option<u64>,
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
                            queued: None,
                            acquired: None,
                            ended: None,
                            once: false,
                        },
                    );
                }
                Event::Queued { op, t } => {
                    if let Some(wait) = current.get_mut(op) {
                        wait.queued.get_or_insert(*t);
                    }
                }
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
            found.stats.queued += u64::from(wait.queued.is_some());
            by_key.entry(wait.key.clone()).or_default().push(wait);
        }
    }
    for (key, waits) in &by_key {
        let mut queued: Vec<&Wait> = waits.iter().filter(|w| w.queued.is_some()).collect();
        queued.sort_unstable_by_key(|w| w.queued);
        let mut granted: Vec<&Wait> = waits.iter().filter(|w| w.acquired.is_some()).collect();
        granted.sort_unstable_by_key(|w| w.acquired);
        for b in granted {
            let Some(b_acquired) = b.acquired else {
                continue;
            };
            let waited_on = |a: &&&Wait| {
                let end = a.acquired.or(a.ended).unwrap_or(u64::MAX);
                (a.worker, a.op) != (b.worker, b.op) && end > b.attempt
            };
            let mut earlier = queued
                .iter()
                .take_while(|a| a.queued.is_some_and(|q| q < b.attempt));
            if earlier.any(|a| waited_on(&a)) {
                found.stats.behind += 1;
            }
            // The earliest waiter in line before B was attempted that was
            // still waiting, alive, when B got the key.
            let passed = queued
                .iter()
                .take_while(|a| a.queued.is_some_and(|q| q < b.attempt))
                .find(|a| {
                    (a.worker, a.op) != (b.worker, b.op)
                        && a.acquired.is_none_or(|t| t > b_acquired)
                        && a.ended.is_none_or(|t| t > b_acquired)
                        && !struck(a.process, a.attempt, b_acquired)
                });
            if let Some(a) = passed {
                found.overtaken.push(format!(
                    "{key}: worker {} op {} ({}, attempt sent at {} µs) was granted at {} µs while worker {} op {}, in line since {} µs, still waited ({})",
                    b.worker,
                    b.op,
                    if b.once { "try-once" } else { "waiting" },
                    b.attempt,
                    b_acquired,
                    a.worker,
                    a.op,
                    a.queued.unwrap_or_default(),
                    match a.acquired {
                        Some(t) => format!("it got the key {} ms later", ms(t - b_acquired)),
                        None => "it never got the key".to_string(),
                    }
                ));
            }
        }
    }
    found
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
            })
        );
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
