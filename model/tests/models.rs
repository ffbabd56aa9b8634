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
fn lock_two_clients_with_a_fault_and_another_key_of_the_slot_keep_every_property() {
    checked(
        "lock 2x1 other key",
        check(
            "lock: 2 clients, every fault kind, <= 1 fault, 1 other key's token",
            configs::lock_two_clients_one_fault_other_key().into_model(),
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

/// The counterexample the model found (FAULTS.md, "What is model-checked"),
/// fixed in commit 18d4a5a: a waiter paused after its first attempt queued
/// it is handed the lock while paused; the hand-over lease runs out and
/// another client takes the key. On resuming, its next attempt answers busy
/// (so `last_busy` is now), and `wait_for_turn` finds the stale grant that
/// arrived meanwhile. Today that busy answer carries the counter (3), the
/// grant's token (2) is not above it, and the grant is ignored.
#[test]
fn lock_three_clients_with_a_pause_keep_every_property() {
    checked(
        "lock 3 pause",
        check(
            "lock: 3 clients, 1 pause",
            configs::lock_three_clients_one_pause().into_model(),
            Run::default(),
        ),
    )
    .assert_clean();
}

/// Without the stale-grant check (the client before commit 18d4a5a) the
/// model finds the counterexample:
///
/// ```text
/// 16. t=0 FAULT B: the process stops until t=4
/// 19. t=1 Redis runs A's release: handed to B (fencing 2, lease 2), notice published
/// 24. t=2 time passes; B's key expires
/// 27. t=3 Redis runs C's acquire: granted, fencing 3
/// 30. t=4 B: the notice says the lock was handed to it (fencing 2)
/// 32. t=4 Redis runs B's acquire: busy for 2 more ticks, counter 3
/// 33. t=4 B: a grant is waiting (fencing 2)
/// 34. t=4 B: trusts the hand-over (fencing 2): holds, valid until t=6
///     then: C holds (fencing 3, valid until t=6) and B holds (fencing 2,
///     valid until t=6): two holders believe their leases valid.
/// ```
#[test]
fn lock_three_clients_with_a_pause_find_the_stale_hand_over_without_the_check() {
    let mut cfg = configs::lock_three_clients_one_pause();
    cfg.check_stale_grants = false;
    finds(
        "lock: 3 clients, 1 pause, no stale-grant check (the client before 18d4a5a)",
        cfg,
        "at most one holder believes its lease valid",
        &["a grant is waiting", "trusts the hand-over"],
    );
}

/// A holder that dies with two clients queued behind it, or a waiter that
/// dies in line: the key whose lease ran out goes to the head of
/// the line, and a dead waiter's entry is skipped once its wait is over.
#[test]
fn lock_three_clients_with_a_crash_keep_every_property() {
    checked(
        "lock 3 crash",
        check(
            "lock: 3 clients, 1 crash, one waiting a tick",
            configs::lock_three_clients_one_crash().into_model(),
            Run::default(),
        ),
    )
    .assert_clean();
}

/// The FIFO property is not vacuous: with acquire.lua before commit
/// 7dbf470 (a bare `SET NX` on a free key) the waiter that retries first
/// after a dead holder's lease runs out takes the key, past the one queued
/// ahead of it:
///
/// ```text
///  5. t=0 Redis runs B's SetNx { wait: 1 }: SET NX: OK, taken without a fencing token
///  9. t=0 Redis runs A's Acquire { wait: 4 }: busy for 3 more ticks, counter 0; A queued, ...
/// 16. t=0 Redis runs C's Acquire { wait: 4 }: busy for 3 more ticks, counter 0; C queued, ...
/// 18. t=0 FAULT B: the process dies
/// 21. t=2 time passes; B's lease expires
/// 22. t=3 C: its lease timer fires, tries again
/// 24. t=3 Redis runs C's Acquire { wait: 1 }: granted, fencing 1
///     then: t=3 key held by C (marked, lease to t=6) until t=6, ..., queue [A]; A: Waiting { retry_at: 3 } ...
/// ```
///
/// Today's acquire.lua finds B's deadline passed at step 24 (the key is
/// still there, pinned by the line), hands the key to A and answers C busy.
#[test]
fn lock_three_clients_with_a_crash_find_the_old_acquire_script_overtaking_a_waiter() {
    let mut cfg = configs::lock_three_clients_one_crash();
    cfg.fifo_on_expiry = false;
    finds(
        "lock: 3 clients, 1 crash, the acquire.lua before 7dbf470 (counterexample expected)",
        cfg,
        "no waiter is overtaken by a later arrival",
        &["FAULT", "lease expires", "granted"],
    );
}

/// The same with a holder that stops (a pause past its lease) instead of
/// dying: the old acquire.lua lets the second waiter overtake the first.
#[test]
fn lock_three_clients_with_a_pause_find_the_old_acquire_script_overtaking_a_waiter() {
    let mut cfg = configs::lock_three_clients_one_pause();
    cfg.fifo_on_expiry = false;
    finds(
        "lock: 3 clients, 1 pause, the acquire.lua before 7dbf470 (counterexample expected)",
        cfg,
        "no waiter is overtaken by a later arrival",
        &["FAULT", "lease expires", "granted"],
    );
}

/// A waiter that dies in line cannot stall it past its wait: without the
/// skipping of entries whose wait has ended (the scripts before commit
/// 7dbf470) a release hands the key to a waiter whose wait is over:
///
/// ```text
///  3. t=0 Redis runs A's SetNx { wait: 4 }: SET NX: OK, taken without a fencing token
/// 10. t=0 Redis runs B's Acquire { wait: 1 }: busy for 3 more ticks, counter 0; B queued, ...
/// 13. t=0 FAULT C: the process dies
/// 15. t=1 A: release(); A: sends DELIFEQ (lease valid: yes)
/// 16. t=1 Redis runs A's Unlock: DELIFEQ: 0; release.lua: released and handed to B (fencing 1, lease 2), ...
/// ```
///
/// B's wait ended at t=1: alive, it gives up; dead, the line waits out the
/// hand-over lease for nobody. Today's release.lua skips B's entry and hands
/// the key to C; the configuration's `sometimes` property shows the model
/// reaches a dead waiter's entry skipped.
#[test]
fn lock_three_clients_with_a_crash_find_a_waiter_handed_the_key_past_its_wait_without_skipping() {
    let mut cfg = configs::lock_three_clients_one_crash();
    cfg.skip_ended_waits = false;
    finds(
        "lock: 3 clients, 1 crash, no skipping of ended waits (counterexample expected)",
        cfg,
        "no hand-over goes to a waiter whose wait is over",
        &["B queued", "handed to B"],
    );
}

/// Checks `cfg` up to the first failure, which must break `property` with a
/// trace that shows every one of `steps` (the mistake switched on, not
/// another).
fn finds(title: &str, cfg: model::lock::LockConfig, property: &str, steps: &[&str]) {
    let report = check(
        title,
        cfg.into_model(),
        Run {
            stop_at_first_failure: true,
            ..Run::default()
        },
    );
    println!("{report}");
    let found = report
        .counterexample(property)
        .unwrap_or_else(|| panic!("{title}: no counterexample to {property:?}"));
    assert_shows(&found.trace, steps);
}

/// Fails unless `trace` shows every one of `steps`, in this order. Clients
/// A and B are symmetric in the configurations that name them: the same
/// counterexample may come with their roles swapped, depending on which the
/// (multi-threaded) search reaches first.
fn assert_shows(trace: &str, steps: &[&str]) {
    let in_order = |steps: &[String]| {
        let mut rest = trace;
        steps.iter().all(|step| match rest.find(step.as_str()) {
            Some(at) => {
                rest = &rest[at + step.len()..];
                true
            }
            None => false,
        })
    };
    let named: Vec<String> = steps.iter().map(|s| s.to_string()).collect();
    let swapped: Vec<String> = steps.iter().map(|s| swap_clients(s)).collect();
    assert!(
        in_order(&named) || in_order(&swapped),
        "not the expected counterexample ({steps:?}):\n{trace}"
    );
}

/// `step` with clients A and B swapped: every standalone letter `A` or `B`
/// ("FAULT A", "A's", "A queued") becomes the other.
fn swap_clients(step: &str) -> String {
    let chars: Vec<char> = step.chars().collect();
    let standalone = |i: usize| {
        let before = i.checked_sub(1).map(|j| chars[j]);
        let after = chars.get(i + 1).copied();
        ![before, after]
            .into_iter()
            .flatten()
            .any(|c| c.is_alphanumeric() || c == '_')
    };
    chars
        .iter()
        .enumerate()
        .map(|(i, &c)| match c {
            'A' if standalone(i) => 'B',
            'B' if standalone(i) => 'A',
            other => other,
        })
        .collect()
}

#[test]
fn swapping_clients_swaps_every_mention_and_nothing_else() {
    assert_eq!(
        swap_clients("FAULT B; A queued; B's SET NX: OK; A's Mint"),
        "FAULT A; B queued; A's SET NX: OK; B's Mint"
    );
}

/// Like [`finds`], but explores until `property` itself breaks (another
/// property the mistake breaks first does not stop the check).
fn finds_broken<M>(title: &str, model: M, property: &'static str, steps: &[&str])
where
    M: model::check::Narrate + Send + Sync + 'static,
    M::State: std::fmt::Debug + std::hash::Hash + Send + Sync + Clone + PartialEq + 'static,
    M::Action: std::fmt::Debug + Clone + PartialEq,
{
    let report = check(
        title,
        model,
        Run {
            stop_at: Some(property),
            ..Run::default()
        },
    );
    println!("{report}");
    let found = report
        .counterexample(property)
        .unwrap_or_else(|| panic!("{title}: no counterexample to {property:?}"));
    assert_shows(&found.trace, steps);
}

/// A holder paused past its lease (the Kleppmann case) asks for its fencing
/// token when it resumes, before its watchdog runs: mint.lua refuses it (the
/// configuration's `sometimes` property shows the model reaches that), so
/// it never holds a token above the next holder's.
#[test]
fn lock_two_clients_with_a_pause_keep_every_property_with_tokens_minted_on_first_use() {
    checked(
        "lock 2 pause",
        check(
            "lock: 2 clients, 1 pause",
            configs::lock_two_clients_one_pause().into_model(),
            Run::default(),
        ),
    )
    .assert_clean();
}

/// The order of tokens is not vacuous: mint.lua without its ownership check
/// (the comparison of the value with our token, and of the deadline with
/// the clock) mints for a holder whose lease ran out while it was paused,
/// after the next holder got its token:
///
/// ```text
///  3. t=0 Redis runs A's SetNx { wait: 4 }: SET NX: OK, taken without a fencing token
///  5. t=0 FAULT A: the process stops until t=4
///  9. t=1 Redis runs B's SetNx { wait: 4 }: SET NX: nil; acquire.lua: busy for 2 more ticks, ...
/// 15. t=2 time passes; A's lease expires
/// 18. t=3 Redis runs B's Acquire { wait: 2 }: granted, fencing 1
/// 21. t=4 A: fencing_token(): sends mint.lua
/// 22. t=4 Redis runs A's Mint: mint.lua: minted fencing 2
/// ```
///
/// Today's mint.lua answers 0 at step 22: A is told `Lost`.
#[test]
fn lock_a_mint_without_the_ownership_check_is_found() {
    let mut cfg = configs::lock_two_clients_one_pause();
    cfg.mint_checks_owner = false;
    finds_broken(
        "lock: 2 clients, 1 pause, mint.lua without the ownership check (counterexample expected)",
        cfg.into_model(),
        "fencing tokens rise in the order holders held the key",
        &["FAULT A", "A's lease expires", "A's Mint: mint.lua: minted"],
    );
}

/// A read-write lock's writers mint their tokens on first use too
/// (shared.lua, "if op == 'extend' or op == 'mint' then"), and two writers
/// keep every property with one pause
/// ([`rw_two_writers_one_pause`](model::configs::rw_two_writers_one_pause)),
/// shared.lua's mint refusing the paused one.
#[test]
fn rw_lock_two_writers_with_a_pause_keep_every_property() {
    checked(
        "rw 2 writers pause",
        check(
            "rw: two writers, 1 pause",
            configs::rw_two_writers_one_pause().into_model(),
            Run::default(),
        ),
    )
    .assert_clean();
}

/// The order of a shared lock's tokens is not vacuous either: shared.lua's
/// mint without its test that the lease is ours mints for a writer whose
/// lease ran out while it was paused, after the next writer took the lock.
#[test]
fn rw_lock_a_mint_without_the_ownership_check_is_found() {
    let mut cfg = configs::rw_two_writers_one_pause();
    cfg.mint_checks_owner = false;
    finds_broken(
        "rw: two writers, 1 pause, mint without the ownership check (counterexample expected)",
        cfg.into_model(),
        "fencing tokens rise in the order holders held the lock",
        &[
            "FAULT A",
            "A's lease expires",
            "A's Mint: shared.lua mint: minted",
        ],
    );
}

/// "While a line exists, the lock key exists" is what keeps a newcomer's
/// plain `SET NX` behind the line, and the model shows it: a key that keeps
/// only its owner's lease while waiters are queued
/// (acquire.lua, "local function pin(" without the longest wait) expires
/// bare when its holder dies, and a newcomer's plain `SET NX` (the try-once
/// client's, or a later waiter's first attempt) takes it past the waiter at
/// the head of the line:
///
/// ```text
///  5. t=0 Redis runs B's SetNx { wait: 4 }: SET NX: OK, taken without a fencing token
///  9. t=0 Redis runs A's Acquire { wait: 4 }: busy for 3 more ticks, counter 0; A queued, ...
/// 11. t=0 FAULT B: the process dies
/// 14. t=2 time passes; B's lease expires
/// 17. t=3 Redis runs C's SetNx { wait: 0 }: SET NX: OK, taken without a fencing token
///     then: t=3 key held by C until t=6, fence counter 0, queue [A]; A: Waiting { retry_at: 3 } ...
/// ```
///
/// With the pin the key lives until A's wait ends: C's `SET NX` finds it
/// taken, and acquire.lua hands it to A.
#[test]
fn lock_a_line_that_lets_the_key_expire_bare_is_overtaken() {
    let mut cfg = configs::lock_two_waiters_and_a_try_once_newcomer_one_crash();
    cfg.line_pins_key = false;
    finds_broken(
        "lock: 2 waiters and a try-once newcomer, 1 crash, no pin (counterexample expected)",
        cfg.into_model(),
        "no waiter is overtaken by a later arrival",
        // Whoever held first (and died: a lease ends unrenewed only so), and
        // whoever comes last: a plain `SET NX` takes the key after a waiter
        // queued and the holder's lease expired.
        &[" queued", "lease expires", "SetNx", ": SET NX: OK"],
    );
}

/// Local hand-over (client/local.rs): two tasks of one process form a line;
/// a crash or a pause hits both.
#[test]
fn lock_two_tasks_of_one_process_with_every_fault_kind_keep_every_property() {
    checked(
        "lock line of 2",
        check(
            "lock: 2 tasks of one process, every fault kind, <= 2 faults",
            configs::lock_line_of_two(2).into_model(),
            Run::default(),
        ),
    )
    .assert_clean();
}

/// A line of two tasks and a client of another process: reserve.lua
/// answers 0 once that client queued, and the line goes to the server.
#[test]
fn lock_a_line_of_two_tasks_and_another_process_keep_every_property() {
    checked(
        "lock line of 2 + 1",
        check(
            "lock: 2 tasks of one process and another process, start together, no faults",
            configs::lock_line_of_two_and_another_process_starting_together().into_model(),
            Run::default(),
        ),
    )
    .assert_clean();
}

/// The model is not vacuous about local hand-overs: a client that hands on
/// the token just below its reserved block (the holder's own, when no other
/// key took one) is caught at the first hand-over:
///
/// ```text
/// 15. t=3 A: release(); A: sends reserve.lua to hand on in its process
/// 16. t=3 Redis runs A's Reserve: kept, tokens 2..=3 reserved
/// 17. t=3 A: reserved tokens up to 3; A: hands the lease on to B (fencing 1, ...)
/// 19. t=3 B: writes with fencing 1: accepted
/// ```
#[test]
fn lock_a_line_handing_on_a_token_below_its_block_is_found() {
    let mut cfg = configs::lock_line_of_two(0);
    cfg.hand_on_below_block = true;
    finds(
        "lock: 2 tasks of one process, hand-over below the block (counterexample expected)",
        cfg,
        "fencing tokens issued strictly increase",
        &["sends reserve.lua", "hands the lease on"],
    );
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

/// Records committed with their work in a commit store
/// (`commit_with_redis`, `commit_with_postgres`, the layer's `Commit`), two
/// requests each retried once by its client after a 409 or a failure, with
/// crashes, a pause and lost replies: the work commits once, a request
/// claimed after its key's work committed never runs its handler (its
/// claim's look finds the work, and completes the record with that result),
/// and every answer with a result is the committed one. Both ways a second
/// claimer meets committed work are reached: its look finds the work of a
/// claimer that did not complete the record, and its commit finds the work
/// of a claimer paused past its lease that committed first.
#[test]
fn idempotency_records_with_a_commit_store_commit_once_and_answer_what_committed() {
    checked(
        "records commit store",
        check(
            "records with a commit store: 2 requests, <= 2 faults",
            configs::records_two_requests_commit_store().into_model(),
            Run::default(),
        ),
    )
    .assert_clean();
}

/// The look is not vacuous: without it, the retry of a request whose
/// commit's reply was lost (the work committed; the claim released, a 5xx)
/// runs the handler again:
///
/// ```text
///  5. t=0 the commit store runs B's Commit -> 0
///  6. t=0 FAULT B: Commit or its answer lost
///  7. t=0 B: Commit failed, releases the record
/// 10. t=0 server runs A's SetNx -> 0
/// 11. t=0 A: claimed, runs the handler
/// ```
///
/// With the look, A finds B's work and answers its result.
#[test]
fn idempotency_records_without_the_look_run_a_committed_request_again() {
    let mut cfg = configs::records_two_requests_commit_store();
    if let Some(store) = &mut cfg.store {
        store.look = false;
    }
    finds_broken(
        "records with a commit store that nobody looks in before running (counterexample expected)",
        cfg.into_model(),
        "a handler never runs once its key's work committed before its claim",
        // (a lost reply here; a crash after the commit, then the lease's
        // end, is the same counterexample a few ticks later)
        &["Commit -> 0", "FAULT", "claimed, runs the handler"],
    );
}

/// The commit's check for a committed copy is not vacuous: without it, a
/// claimer paused past its lease commits its work after the next claimer
/// committed its own:
///
/// ```text
/// 11. t=0 FAULT A: process stops
/// 13. t=1 time passes; A's record expires
/// 17. t=3 server runs B's SetNx -> 0
/// 22. t=3 the commit store runs B's Commit -> 0
/// 23. t=3 the commit store runs A's Commit -> 0
/// ```
///
/// With the check (idempotency_commit.lua's `EXISTS`, PostgreSQL's
/// primary key), A's commit writes nothing and A answers B's result.
#[test]
fn idempotency_records_with_a_commit_that_does_not_check_commit_twice() {
    let mut cfg = configs::records_two_requests_commit_store();
    if let Some(store) = &mut cfg.store {
        store.commit_checks = false;
    }
    finds_broken(
        "records with a commit that does not check for a committed copy (counterexample expected)",
        cfg.into_model(),
        "the work commits once per key",
        // Either claimer's commit may run first, and A's may run before B
        // reads the reply of its claim (or B may claim by its SET or by the
        // claim script): only these steps, in this order, are in every
        // shortest counterexample.
        &[
            "FAULT A: process stops",
            "A's record expires",
            "Commit -> 0",
            "Commit -> 0",
        ],
    );
}

/// Records committed with their work on the lock server itself
/// (`commit_on_lock_server`, idempotency_commit_record.lua: the record is
/// the committed copy), with the faults and retries of the commit store's
/// check above: the work commits once, a request claimed after its key's
/// work committed never runs its handler (its claim finds the record
/// completed, and replays it: there is no look), and every answer with a
/// result is the committed one. There is no completion after the commit;
/// a commit finds the record completed by another claimer (and answers its
/// result), and a commit completes a record that was another claimer's
/// claim, or gone with its lease (a claimer paused past its lease whose
/// work still commits first; each case is reached).
#[test]
fn idempotency_records_committed_on_the_lock_server_commit_once_and_answer_what_committed() {
    checked(
        "records committed on the lock server",
        check(
            "records committed on the lock server: 2 requests, <= 2 faults",
            configs::records_two_requests_commit_on_lock_server().into_model(),
            Run::default(),
        ),
    )
    .assert_clean();
}

/// The lock server's commit's check for a completed record is not
/// vacuous: without it, a claimer paused past its lease commits its work
/// over the record the next claimer's commit completed (or the next
/// claimer commits over the one it completed):
///
/// ```text
///  4. t=0 FAULT A: process stops
/// 11. t=1 time passes; A's record expires
/// 15. t=3 server runs B's SetNx -> 0
/// 18. t=3 server runs B's Commit -> 0
/// 19. t=3 server runs A's Commit -> 0
/// ```
///
/// With the check (idempotency_commit_record.lua, "return {0, v}"), A's
/// commit writes nothing and A answers B's result.
#[test]
fn idempotency_records_committed_on_the_lock_server_without_the_check_commit_twice() {
    let mut cfg = configs::records_two_requests_commit_on_lock_server();
    if let Some(store) = &mut cfg.store {
        store.commit_checks = false;
    }
    finds_broken(
        "records committed on the lock server without the check for a completed record (counterexample expected)",
        cfg.into_model(),
        "the work commits once per key",
        // (either claimer's commit may run first)
        &[
            "FAULT A: process stops",
            "A's record expires",
            "B: claimed",
            "Commit -> 0",
            "Commit -> 0",
        ],
    );
}

/// A read-write lock (shared.lua): two readers and a writer starting
/// together, one pause. Readers share, the writer waits for them, a reader
/// that comes while the writer waits queues behind it, and a paused
/// waiter's stale grant is ignored.
#[test]
fn rw_lock_readers_and_a_writer_with_a_pause_keep_every_property() {
    checked(
        "rw pause",
        check(
            "rw: reader, writer, reader, 1 pause",
            configs::rw_reader_writer_reader_one_pause().into_model(),
            Run::default(),
        ),
    )
    .assert_clean();
}

#[test]
fn rw_lock_writer_and_reader_with_every_fault_kind_keep_every_property() {
    checked(
        "rw 2x2",
        check(
            "rw: writer and reader, every fault kind, <= 2 faults",
            configs::rw_writer_and_reader(2).into_model(),
            Run::default(),
        ),
    )
    .assert_clean();
}

#[test]
fn semaphore_takers_with_every_fault_kind_never_pass_the_limit() {
    checked(
        "semaphore",
        check(
            "semaphore: 3 takers of 2 permits, every fault kind, <= 1 fault",
            configs::semaphore_three_takers_of_two(1).into_model(),
            Run::default(),
        ),
    )
    .assert_clean();
}

/// A semaphore's waiter that dies in line is skipped once its wait is
/// over (the model shows a script skipping it), and the line keeps every
/// property.
#[test]
fn semaphore_with_a_crash_keeps_every_property() {
    checked(
        "semaphore crash",
        check(
            "semaphore: 3 takers of 1 permit, 1 crash, one waiting a tick",
            configs::semaphore_one_permit_one_crash().into_model(),
            Run::default(),
        ),
    )
    .assert_clean();
}

/// ... and without the skip, a permit goes to the dead waiter's entry.
#[test]
fn semaphore_with_a_crash_finds_a_permit_handed_past_its_wait_without_skipping() {
    let mut cfg = configs::semaphore_one_permit_one_crash();
    cfg.skip_ended_waits = false;
    finds(
        "semaphore: 3 takers of 1 permit, 1 crash, no skipping of ended waits (counterexample expected)",
        cfg,
        "no hand-over goes to a waiter whose wait is over",
        &["B queued", "granted B"],
    );
}

/// The FIFO property is not vacuous: a script that admits a newcomer that
/// fits while a writer is queued (the test that the queue is `empty` left
/// out of shared.lua, "A newcomer, only when nobody is queued.") lets
/// readers overtake it:
///
/// ```text
///  3. t=0 Redis runs A's Acquire ...: shared.lua acquire: granted, fencing 1
///  6. t=0 Redis runs B's Acquire ...: shared.lua acquire: busy for 3 more ticks, counter 1; B queued
/// 10. t=0 Redis runs C's Acquire ...: shared.lua acquire: granted, fencing 2
///     then: no writer, holders [A until t=3], queue [B(x)] ...
/// ```
#[test]
fn rw_lock_admitting_readers_past_a_queued_writer_is_found() {
    let mut cfg = configs::rw_reader_writer_reader();
    if let Some(shared) = &mut cfg.shared {
        shared.admit_past_queue = true;
    }
    finds(
        "rw: reader, writer, reader, newcomers admitted past the queue (counterexample expected)",
        cfg,
        "no grant overtakes a waiter still queued (FIFO)",
        &[
            "B queued",
            "C's Acquire { wait: 4 }: shared.lua acquire: granted",
        ],
    );
}

/// The exclusion property is not vacuous: without the stale-grant check
/// (the client before 18d4a5a) a writer paused while queued is handed the
/// lock, its hand-over lease runs out, a reader takes it, and on resuming
/// the writer trusts the stale grant:
///
/// ```text
/// 16. t=0 FAULT B: the process stops until t=4
/// 19. t=1 Redis runs A's Release ...: shared.lua release: released, granted B (fencing 2, lease 2), notice published
/// 24. t=2 time passes; B's lease expires
/// 27. t=3 Redis runs C's Acquire ...: shared.lua acquire: granted, fencing 3
/// 33. t=4 B: acquire answered busy (2 ticks); B: a grant is waiting (fencing 2)
/// 34. t=4 B: trusts the hand-over (fencing 2) ...; B: holds, fencing 2, valid until t=6
///     then: holders [C until t=6] ...; B: Hold (fencing 2, valid until t=6); C: Hold (fencing 3, valid until t=6)
/// ```
#[test]
fn rw_lock_without_the_stale_grant_check_finds_a_writer_with_a_reader() {
    let mut cfg = configs::rw_reader_writer_reader_one_pause();
    cfg.check_stale_grants = false;
    finds(
        "rw: reader, writer, reader, 1 pause, no stale-grant check (counterexample expected)",
        cfg,
        "no writer believes its lease valid while another holder does",
        &["FAULT B", "a grant is waiting", "trusts the hand-over"],
    );
}
