//! The checker's verdicts on hand-written histories.

use super::*;
use crate::store::StoredWrite;

fn op(
    w: &mut Vec<Event>,
    op: u64,
    key: &str,
    fence: u64,
    t0: u64,
    seq: u64,
    released: ReleaseOutcome,
) {
    w.extend([
        Event::Attempt {
            op,
            key: key.into(),
            more_keys: vec![],
            side: None,
            t: t0,
        },
        Event::Acquired {
            op,
            fence,
            more_fences: vec![],
            t: t0 + 10,
        },
        Event::Write {
            op,
            key: None,
            outcome: WriteOutcome::Accepted,
            seq,
            lost_before: false,
            sent: t0 + 19,
            t: t0 + 20,
        },
        Event::ReleaseSent { op, t: t0 + 30 },
        Event::Released {
            op,
            outcome: released,
            t: t0 + 40,
        },
    ]);
}

fn write(
    seq: u64,
    fence: u64,
    max_before: u64,
    read_version: u64,
    worker: u32,
    op: u64,
) -> StoredWrite {
    StoredWrite {
        seq,
        fence,
        max_before,
        read_version,
        worker,
        op,
    }
}

/// Operation `op` asks for the key `k` at `t` (also for the other
/// checks' tests).
pub(super) fn attempt(op: u64, t: u64) -> Event {
    Event::Attempt {
        op,
        key: "k".into(),
        more_keys: vec![],
        side: None,
        t,
    }
}

fn acquired(op: u64, fence: u64, t: u64) -> Event {
    Event::Acquired {
        op,
        fence,
        more_fences: vec![],
        t,
    }
}

/// A run with the workers' `logs` (worker `i` wrote `logs[i]`) and the
/// store record of `k`.
fn run(logs: Vec<Vec<Event>>, writes: Vec<StoredWrite>, counter: u64) -> RunData {
    let workers: Vec<WorkerLog> = (0..)
        .zip(logs)
        .map(|(id, events)| WorkerLog {
            id,
            process: id,
            events,
        })
        .collect();
    // Every operation drawn began in the log.
    let drawn = workers
        .iter()
        .map(|w| {
            let began = w
                .events
                .iter()
                .filter(|e| matches!(e, Event::Attempt { .. }));
            (w.id, began.count() as u64)
        })
        .collect();
    let mut records = BTreeMap::new();
    records.insert(
        "k".to_string(),
        Record {
            counter,
            version: writes.len() as u64,
            writes,
            rejected: 0,
            accesses: vec![],
        },
    );
    RunData {
        ttl_ms: 100,
        slack_ms: 100,
        expect_monotonic_fences: true,
        workers,
        records,
        drawn,
        ..RunData::default()
    }
}

#[test]
fn a_clean_history_has_no_violation() {
    let (mut a, mut b) = (Vec::new(), Vec::new());
    op(&mut a, 1, "k", 1, 0, 1, ReleaseOutcome::Ok);
    op(&mut b, 1, "k", 2, 1000, 2, ReleaseOutcome::Ok);
    let data = run(
        vec![a, b],
        vec![write(1, 1, 0, 0, 0, 1), write(2, 2, 1, 1, 1, 1)],
        2,
    );
    let r = check(&data);
    assert_eq!(r.violations, Violations::default(), "{:?}", r.examples);
    assert_eq!((r.operations, r.acquired, r.writes_accepted), (2, 2, 2));
}

#[test]
fn overlaps_stale_tokens_lost_updates_and_repeated_tokens_are_found() {
    let (mut a, mut b) = (Vec::new(), Vec::new());
    // Both "hold" from 0 to 30 µs, both release Ok; same token.
    op(&mut a, 1, "k", 5, 0, 2, ReleaseOutcome::Ok);
    op(&mut b, 1, "k", 5, 5, 1, ReleaseOutcome::Ok);
    let data = run(
        vec![a, b],
        // Write 2 read version 0 (write 1 came between) with a token
        // below the one seen.
        vec![write(1, 5, 0, 0, 1, 1), write(2, 4, 5, 0, 0, 1)],
        1,
    );
    let v = check(&data).violations;
    assert_eq!(v.store_overlaps, 1);
    assert_eq!(v.lower_token_accepted, 1);
    assert_eq!(v.lost_updates, 1);
    assert_eq!(v.duplicate_fences, 1);
    assert_eq!(v.client_overlaps, 1);
}

/// Worker 0 holds `k` (token 1) and is stopped from 30 µs to 300 ms with
/// its write sent at `sent`; worker 1 takes over at 150 ms (token 2) and
/// reads at 150.01 ms.
fn stopped_writer(sent: u64, outcome: WriteOutcome) -> Report {
    let victim = vec![
        attempt(1, 0),
        acquired(1, 1, 10),
        Event::Read {
            op: 1,
            key: None,
            ok: true,
            version: 0,
            counter: 0,
            t: 15,
        },
        Event::Write {
            op: 1,
            key: None,
            outcome,
            seq: u64::from(outcome == WriteOutcome::Accepted),
            lost_before: false,
            sent,
            t: 300_100,
        },
        Event::ReleaseSent { op: 1, t: 300_200 },
        Event::Released {
            op: 1,
            outcome: ReleaseOutcome::Lost,
            t: 300_300,
        },
    ];
    let mut next = vec![attempt(1, 50)];
    let seq = if outcome == WriteOutcome::Accepted {
        2
    } else {
        1
    };
    next.extend([
        acquired(1, 2, 150_000),
        Event::Read {
            op: 1,
            key: None,
            ok: true,
            version: seq - 1,
            counter: seq - 1,
            t: 150_010,
        },
        Event::Write {
            op: 1,
            key: None,
            outcome: WriteOutcome::Accepted,
            seq,
            lost_before: false,
            sent: 150_020,
            t: 150_030,
        },
        Event::ReleaseSent { op: 1, t: 150_040 },
        Event::Released {
            op: 1,
            outcome: ReleaseOutcome::Ok,
            t: 150_050,
        },
    ]);
    let writes = if outcome == WriteOutcome::Accepted {
        vec![write(1, 1, 0, 0, 0, 1), write(2, 2, 1, 1, 1, 1)]
    } else {
        vec![write(1, 2, 0, 0, 1, 1)]
    };
    let mut data = run(vec![victim, next], writes, seq);
    data.faults = vec![Fault::StopWorker {
        worker: 0,
        start: 30,
        end: 300_000,
    }];
    check(&data)
}

#[test]
fn a_stopped_holders_write_is_stale_only_if_sent_after_the_next_holders_read() {
    // In flight when the stop came: the store took it before any higher
    // token, rightly; its answer arrives after the SIGCONT.
    let r = stopped_writer(20, WriteOutcome::Accepted);
    assert_eq!(r.violations, Violations::default(), "{:?}", r.examples);
    assert_eq!((r.stale_writes, r.stale_writes_rejected), (0, 0));
    assert_eq!(r.stale_release_lost, 1);
    // Sent after the SIGCONT, so after the next holder's read: stale, and
    // fencing refused it.
    let r = stopped_writer(300_050, WriteOutcome::Rejected);
    assert_eq!(r.violations, Violations::default(), "{:?}", r.examples);
    assert_eq!((r.stale_writes, r.stale_writes_rejected), (1, 1));
}

/// Worker 0 takes `k` at 10 µs without a token and is stopped from 30
/// µs to 300 ms (TTL 100 ms); worker 1 takes the key over at 150 ms
/// (token 2) and writes. Worker 0 asks for its token at `sent` µs and
/// has the answer at 300.1 ms: `answer` is what it got (`None`:
/// refused, `Lost`).
fn token_asked_after_a_stop(sent: u64, answer: Option<u64>) -> Report {
    let mut victim = vec![attempt(1, 0), acquired(1, 0, 10)];
    victim.push(match answer {
        Some(fence) => Event::Token {
            op: 1,
            fence,
            sent,
            t: 300_110,
        },
        None => Event::TokenRefused {
            op: 1,
            lost: true,
            error: "lost".into(),
            sent,
            t: 300_101,
        },
    });
    victim.extend([
        Event::ReleaseSent { op: 1, t: 300_200 },
        Event::Released {
            op: 1,
            outcome: ReleaseOutcome::Lost,
            t: 300_300,
        },
    ]);
    let mut next = Vec::new();
    op(&mut next, 1, "k", 2, 149_990, 1, ReleaseOutcome::Ok);
    let mut data = run(vec![victim, next], vec![write(1, 2, 0, 0, 1, 1)], 1);
    data.faults = vec![Fault::StopWorker {
        worker: 0,
        start: 30,
        end: 300_000,
    }];
    check(&data)
}

#[test]
fn a_token_asked_for_after_the_lease_ended_is_refused_or_is_a_violation() {
    // Refused: counted, after a stop, once the next holder had written;
    // asked after the stop, or before it landed and answered after.
    for sent in [300_100, 20] {
        let r = token_asked_after_a_stop(sent, None);
        assert_eq!(r.violations, Violations::default(), "{:?}", r.examples);
        assert_eq!(
            (
                r.tokens_refused,
                r.tokens_refused_struck,
                r.tokens_refused_after_next_write
            ),
            (1, 1, 1)
        );
    }
    // The token it had from its grant (taken on the contended path):
    // below the next holder's, no violation.
    let r = token_asked_after_a_stop(300_100, Some(1));
    assert_eq!(r.violations, Violations::default(), "{:?}", r.examples);
    assert_eq!(r.tokens_refused, 0);
    // A token minted now, above the next holder's: the token of a lease
    // that had ended.
    let r = token_asked_after_a_stop(300_100, Some(3));
    assert_eq!(r.violations.late_tokens, 1, "{:?}", r.examples);
}

#[test]
fn a_release_sent_before_the_stop_landed_may_say_ok_and_one_sent_after_may_not() {
    // The harness reads the stop's start (30 µs), then signals; the
    // victim writes and sends its release at 40 µs before the stop lands.
    let released = |sent: u64| {
        let mut a = Vec::new();
        op(&mut a, 1, "k", 1, 0, 1, ReleaseOutcome::Ok);
        if let Some(Event::ReleaseSent { t, .. }) = a.get_mut(3) {
            *t = sent;
        }
        if let Some(Event::Released { t, .. }) = a.get_mut(4) {
            *t = 300_100;
        }
        let mut data = run(vec![a], vec![write(1, 1, 0, 0, 0, 1)], 1);
        data.faults = vec![Fault::StopWorker {
            worker: 0,
            start: 30,
            end: 300_000,
        }];
        check(&data).violations.stale_release_ok
    };
    assert_eq!(released(40), 0);
    assert_eq!(released(300_050), 1);
}

#[test]
fn a_waiter_left_without_a_holder_for_longer_than_a_lease_is_a_stall() {
    let mut a = Vec::new();
    op(&mut a, 1, "k", 1, 0, 1, ReleaseOutcome::Ok);
    // Waits from 100 µs to 400 ms with nobody holding: TTL 100 ms + 100 ms slack.
    a.extend([
        attempt(2, 100),
        Event::GaveUp {
            op: 2,
            error: "busy".into(),
            t: 400_000,
        },
    ]);
    let data = run(vec![a], vec![write(1, 1, 0, 0, 0, 1)], 1);
    let r = check(&data);
    assert_eq!(r.violations.stalled, 1, "{:?}", r.examples);
    assert_eq!(r.violations.waiters_never_acquired, 1);
    assert!(r.max_stall_ms >= 399);
}

#[test]
fn a_waiter_is_not_stalled_while_its_own_process_is_stopped_but_those_behind_it_are() {
    // Process 0 takes and releases `k`, then waits for it from 100 µs to
    // 400 ms, stopped from 150 µs to 399 ms: its wait while stopped is the
    // fault (it cannot take a free lock, nor report one handed to it).
    let waits = |others_wait: bool| {
        let mut a = Vec::new();
        op(&mut a, 1, "k", 1, 0, 1, ReleaseOutcome::Ok);
        let gave_up = |op, t| Event::GaveUp {
            op,
            error: "busy".into(),
            t,
        };
        a.extend([attempt(2, 100), gave_up(2, 400_000)]);
        let mut logs = vec![a];
        if others_wait {
            // Process 1 waits the same 400 ms, running.
            logs.push(vec![attempt(1, 120), gave_up(1, 400_000)]);
        }
        let mut data = run(logs, vec![write(1, 1, 0, 0, 0, 1)], 1);
        data.faults = vec![Fault::StopWorker {
            worker: 0,
            start: 150,
            end: 399_000,
        }];
        check(&data)
    };
    let alone = waits(false);
    assert_eq!(alone.violations.stalled, 0, "{:?}", alone.examples);
    assert!(alone.max_stall_ms <= 1, "{}", alone.max_stall_ms);
    let behind = waits(true);
    assert_eq!(behind.violations.stalled, 1, "{:?}", behind.examples);
    assert!(behind.max_stall_ms >= 399);
}

/// Two tasks of process 0 (logical workers 0 and 1) and process 1
/// (logical worker 2) on `k`.
fn two_tasks_and_another_process(logs: [Vec<Event>; 3], writes: Vec<StoredWrite>) -> RunData {
    let counter = writes.len() as u64;
    let mut data = run(logs.into(), writes, counter);
    for (w, process) in data.workers.iter_mut().zip([0, 0, 1]) {
        w.process = process;
    }
    data
}

#[test]
fn tasks_of_one_process_are_checked_against_each_other_like_processes() {
    let (mut a, mut b) = (Vec::new(), Vec::new());
    op(&mut a, 1, "k", 1, 0, 1, ReleaseOutcome::Ok);
    op(&mut b, 1, "k", 1, 5, 2, ReleaseOutcome::Ok);
    let data = two_tasks_and_another_process(
        [a, b, vec![]],
        vec![write(1, 1, 0, 0, 0, 1), write(2, 1, 1, 0, 1, 1)],
    );
    let v = check(&data).violations;
    assert_eq!(v.client_overlaps, 1);
    assert_eq!(v.duplicate_fences, 1);
    assert_eq!(v.store_overlaps, 1);
}

#[test]
fn a_kill_ends_every_task_of_the_process_and_accounts_for_a_draw_in_flight() {
    // Task 0 holds from 10 µs, task 1 waits in its line; process 0 is
    // killed at 50 µs, while task 1 also had a draw on its way (one more
    // drawn than its log began). Process 1 takes over at 150 ms.
    let a = vec![attempt(1, 0), acquired(1, 1, 10)];
    let b = vec![attempt(1, 5)];
    let c = vec![attempt(1, 20), acquired(1, 2, 150_000)];
    let mut data = two_tasks_and_another_process([a, b, c], vec![]);
    data.faults = vec![Fault::KillWorker { worker: 0, t: 50 }];
    data.drawn.insert(1, 2);
    let r = check(&data);
    assert_eq!(r.violations, Violations::default(), "{:?}", r.examples);
    assert_eq!((r.operations, r.killed_mid_draw), (3, 1));
    assert_eq!(r.max_takeover_ms, 149);
    // Not killed: an operation drawn that no log began is a mismatch.
    data.faults.clear();
    let r = check(&data);
    assert_eq!(r.violations.log_mismatches, 1, "{:?}", r.examples);
    assert_eq!(r.killed_mid_draw, 0);
}

#[test]
fn a_killed_holders_key_that_no_live_worker_wants_any_more_is_not_held_past_its_ttl() {
    // Worker 1 had its turn before the kill and wants the key no more.
    let a = vec![attempt(1, 0), acquired(1, 2, 300)];
    let mut b = Vec::new();
    op(&mut b, 1, "k", 1, 0, 1, ReleaseOutcome::Ok);
    let mut data = run(vec![a, b], vec![write(1, 1, 0, 0, 1, 1)], 1);
    data.faults = vec![Fault::KillWorker { worker: 0, t: 500 }];
    let r = check(&data);
    assert_eq!(r.violations, Violations::default(), "{:?}", r.examples);
    // Nor one that died waiting before the kill.
    data.workers[1].events.push(attempt(2, 400));
    data.drawn.insert(1, 2);
    data.faults
        .insert(0, Fault::KillWorker { worker: 1, t: 450 });
    let r = check(&data);
    assert_eq!(r.violations, Violations::default(), "{:?}", r.examples);
    // One that waits at the kill and never gets the key is.
    data.faults.remove(0);
    let r = check(&data);
    assert_eq!(r.violations.held_past_ttl, 1, "{:?}", r.examples);
}

#[test]
fn a_killed_semaphore_holders_permit_nobody_needed_is_not_held_past_its_ttl() {
    // Two permits: worker 1 takes the other one at once after the kill,
    // and the run ends with nobody needing the struck one.
    let a = vec![attempt(1, 0), acquired(1, 1, 10)];
    let b = vec![attempt(1, 1_000), acquired(1, 2, 1_010)];
    let mut data = run(vec![a, b], vec![], 0);
    data.kind = Kind::Semaphore { permits: 2 };
    data.faults = vec![Fault::KillWorker { worker: 0, t: 500 }];
    let r = check(&data);
    assert_eq!(r.violations, Violations::default(), "{:?}", r.examples);
    // Still waiting when the lease had ended: the permit was kept.
    data.workers[1].events.truncate(1);
    let r = check(&data);
    assert_eq!(r.violations.held_past_ttl, 1, "{:?}", r.examples);
}

#[test]
fn a_killed_holders_key_first_wanted_after_its_lease_is_not_held_past_its_ttl() {
    // Worker 1 wants the key only 300 ms after the kill (a key of the
    // victim's own): it was not kept out.
    let a = vec![attempt(1, 0), acquired(1, 1, 10)];
    let b = vec![attempt(1, 300_000), acquired(1, 2, 300_010)];
    let mut data = run(vec![a, b], vec![], 0);
    data.faults = vec![Fault::KillWorker { worker: 0, t: 50 }];
    let r = check(&data);
    assert_eq!(r.violations, Violations::default(), "{:?}", r.examples);
    assert_eq!(r.max_takeover_ms, 0);
}

#[test]
fn a_killed_holders_key_taken_over_late_is_held_past_its_ttl() {
    let a = vec![attempt(1, 0), acquired(1, 1, 10)];
    let b = vec![attempt(1, 20), acquired(1, 2, 500_000)];
    let mut data = run(vec![a, b], vec![], 0);
    data.faults = vec![Fault::KillWorker { worker: 0, t: 50 }];
    let r = check(&data);
    assert_eq!(r.violations.held_past_ttl, 1, "{:?}", r.examples);
    assert_eq!(r.max_takeover_ms, 499);
}

/// Operation 1 of one worker on `k` as `side`: asks at `t0`, is granted at
/// `t0 + 10` with `fence` (asked for after the grant, so minted later),
/// and sends its release at `end`.
fn shared_or_not(side: Side, fence: u64, t0: u64, end: u64) -> Vec<Event> {
    vec![
        Event::Attempt {
            op: 1,
            key: "k".into(),
            more_keys: vec![],
            side: Some(side),
            t: t0,
        },
        acquired(1, fence, t0 + 10),
        Event::ReleaseSent { op: 1, t: end },
        Event::Released {
            op: 1,
            outcome: ReleaseOutcome::Ok,
            t: end + 10,
        },
    ]
}

#[test]
fn readers_holding_at_once_may_get_their_tokens_in_any_order_but_not_after_one_let_go() {
    // Reader 0 is granted first and gets its token last (its mint was
    // slow): readers 1 and 2 asked after its grant, while it held, and got
    // lower tokens. Nothing is owed between shared holders at once.
    let readers = vec![
        shared_or_not(Side::Read, 9, 0, 5_000),
        shared_or_not(Side::Read, 7, 2_000, 3_000),
        shared_or_not(Side::Read, 8, 2_100, 3_100),
    ];
    let mut data = run(readers.clone(), vec![], 0);
    data.kind = Kind::Rw {
        reads_per_mille: 700,
    };
    let r = check(&data);
    assert_eq!(r.violations, Violations::default(), "{:?}", r.examples);

    // Once reader 0 let go, a reader or a writer that asks later owes it a
    // higher token.
    for (side, fence) in [(Side::Read, 4), (Side::Write, 5)] {
        let mut logs = readers.clone();
        logs.push(shared_or_not(side, fence, 6_500, 7_000));
        let mut data = run(logs, vec![], 0);
        data.kind = Kind::Rw {
            reads_per_mille: 700,
        };
        let r = check(&data);
        assert_eq!(
            r.violations.fence_regressions, 1,
            "{side:?}: {:?}",
            r.examples
        );
    }
    // A writer that asked while reader 0 held (it waits for it) owes it a
    // higher token too: exclusive attempts are held to every earlier grant.
    let mut logs = readers;
    logs.push(shared_or_not(Side::Write, 6, 2_500, 8_000));
    let mut data = run(logs, vec![], 0);
    data.kind = Kind::Rw {
        reads_per_mille: 700,
    };
    let r = check(&data);
    assert_eq!(r.violations.fence_regressions, 1, "{:?}", r.examples);
}
