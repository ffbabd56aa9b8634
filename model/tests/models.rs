//! The model checks CI runs: every property over every reachable state of
//! small configurations (bounded by the fault budgets and the model clock).
//! A failure prints the counterexample as a numbered trace.

use model::check::{Report, Run, check};
use model::configs;

fn checked(name: &str, report: Report) -> Report {
    println!("{report}");
    let _ = name;
    report
}

#[test]
fn lock_two_clients_with_every_fault_kind_keep_every_property() {
    checked(
        "lock 2x2",
        check(
            "lock: 2 clients, every fault kind, <= 2 faults",
            configs::lock_two_clients_two_faults().into_model(),
            Run::default(),
        ),
    )
    .assert_clean();
}

#[test]
fn lock_three_clients_without_faults_keep_every_property() {
    checked(
        "lock 3x0",
        check(
            "lock: 3 clients, no faults",
            configs::lock_three_clients_no_faults().into_model(),
            Run::default(),
        ),
    )
    .assert_clean();
}

#[test]
fn lock_three_clients_with_a_pause_keep_every_property_when_every_hand_over_is_confirmed() {
    let mut cfg = configs::lock_three_clients_one_pause();
    cfg.confirm_every_handoff = true;
    checked(
        "lock 3 pause fixed",
        check(
            "lock: 3 clients, 1 pause, hand-overs always confirmed",
            cfg.into_model(),
            Run::default(),
        ),
    )
    .assert_clean();
}

/// Counterexample on today's protocol (FAULTS.md, "What is model-checked"):
/// a waiter paused after its first attempt queued it is handed the lock
/// while paused; the hand-over lease runs out and another client takes the
/// key. On resuming, its next attempt answers busy (so `last_busy` is now),
/// and `wait_for_turn` then takes the stale grant that arrived meanwhile;
/// `confirm` trusts it without a round trip because "a third of the
/// hand-over lease is left since the last busy answer":
///
/// ```text
///  7. t=0 Redis runs C's acquire: granted, fencing 1
///  8. t=0 Redis runs B's acquire: busy; B queued, holder marked +
/// 14. t=0 B: acquire answered busy; B: registers for notices
/// 17. t=0 FAULT B: the process stops until t=4
/// 23. t=1 Redis runs C's release: handed to B (fencing 2, lease 2), notice published
/// 28. t=2 time passes; B's key expires
/// 31. t=3 Redis runs A's acquire: granted, fencing 3
/// 37. t=4 B: the notice says the lock was handed to it (fencing 2)
/// 39. t=4 Redis runs B's acquire: busy for 3 more ticks
/// 40. t=4 B: a grant is waiting (fencing 2)
/// 41. t=4 B: trusts the hand-over (fencing 2): holds, valid until t=6
///     then: A holds (fencing 3, valid until t=7) and B holds (fencing 2,
///     valid until t=6): two holders believe their leases valid.
/// ```
///
/// Fencing still protects a fenced store (2 < 3). Fix: confirm every
/// hand-over with extend.lua, or drop a grant taken after a busy answer
/// (the test above checks the first).
#[test]
#[ignore = "counterexample: a paused waiter trusts a stale hand-over grant (acquire.rs:252-261); see FAULTS.md"]
fn lock_three_clients_with_a_pause_keep_every_property_with_todays_confirm() {
    checked(
        "lock 3 pause",
        check(
            "lock: 3 clients, 1 pause, today's confirm",
            configs::lock_three_clients_one_pause().into_model(),
            Run::default(),
        ),
    )
    .assert_clean();
}

#[test]
fn redlock_keeps_one_majority_holder_and_increasing_tokens() {
    checked(
        "redlock",
        check(
            "redlock: 3 nodes, 2 clients, <= 2 lost messages, 1 pause",
            configs::redlock_two_clients().into_model(),
            Run::default(),
        ),
    )
    .assert_clean();
}

#[test]
fn idempotency_records_never_run_a_completed_request_again() {
    checked(
        "records",
        check(
            "records: 2 requests, <= 2 faults",
            configs::records_two_requests().into_model(),
            Run::default(),
        ),
    )
    .assert_clean();
}
