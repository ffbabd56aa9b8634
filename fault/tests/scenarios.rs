//! Short versions of the fault scenarios 1-10 (2 also on a PostgreSQL record, and with the token
//! asked for after the pause), of scenario 11's stopped holders and controls, of scenario 12
//! (waiters' order) (500 lock operations each, a few seconds) and of scenario 13 (exactly once
//! across crashes: 16 kills of the order service on each store): the `fault` binary re-executed
//! as worker processes (the example `order-service` in 13), real redis-servers, real faults, and
//! the verdict.
//!
//! The long run is `cargo run --release -p fault -- all --ops 10000` (FAULTS.md).
//! These tests run one at a time (they share two cores with everything else),
//! and each asserts both "no violation" and that the fault really happened
//! (for a control: that the checker objected). A run whose strikes all fell
//! where they show nothing is inconclusive, not a failure: such a scenario
//! runs again, three times at most (`struck`, `objects`). A violation is
//! never run again.

/// Every scenario, under one name (`cargo test -- under_faults::`): CI runs
/// them beside the other tests, not among them (`cargo xtask test`).
mod under_faults {
    use std::path::Path;
    use std::sync::Mutex;

    use fault::scenario::{self, Outcome, Scenario};

    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

    const OPS: u64 = 500;

    /// Runs `name` (its CI size, `OPS`) alone and prints its row of the table.
    fn run_alone(name: &str) -> Outcome {
        let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let scenario = Scenario::by_name(name, OPS, true).expect("a scenario");
        let exe = Path::new(env!("CARGO_BIN_EXE_fault"));
        let outcome = scenario::run(&scenario, exe, None).expect("the run");
        println!("{}", scenario::table(std::slice::from_ref(&outcome)));
        for example in &outcome.report.examples {
            println!("  {example}");
        }
        outcome
    }

    fn run(name: &str) -> Outcome {
        let outcome = run_alone(name);
        // Every operation drawn from the budget began in a log, but those a
        // task of a killed process drew just before it died.
        let r = &outcome.report;
        assert_eq!(r.operations + r.killed_mid_draw, OPS, "{r}");
        outcome
    }

    fn assert_clean(o: &Outcome) {
        assert_eq!(
            o.report.violations.total(),
            0,
            "{}\n{:#?}",
            o.report,
            o.report.examples
        );
        assert!(o.as_expected());
    }

    /// [`run`], and checks that nothing was violated (and none was expected).
    fn run_clean(name: &str) -> Outcome {
        let o = run(name);
        assert_clean(&o);
        o
    }

    /// Runs `name` and checks that its fault struck (`faults` times at least,
    /// else `never`), that nothing was violated and every operation got its
    /// lock.
    fn survives(name: &str, faults: usize, never: &str) -> Outcome {
        let o = run_clean(name);
        assert!(o.faults >= faults, "{never}");
        assert_eq!(o.report.acquired, OPS);
        o
    }

    #[test]
    fn thirty_two_clients_on_one_key_never_overlap() {
        let o = run_clean("no-faults-1-key");
        assert_eq!(o.report.acquired, OPS);
        assert_eq!(o.report.writes_accepted, OPS);
    }

    #[test]
    fn thirty_two_clients_on_a_hundred_keys_never_overlap() {
        let o = run_clean("no-faults-100-keys");
        assert_eq!(o.report.writes_accepted, OPS);
    }

    #[test]
    fn a_holder_stopped_past_its_lease_is_fenced_out_and_told_it_lost() {
        struck("stop-holder", "no stop hit a holder mid-write", fenced_out);
    }

    /// The stopped holders' late writes were refused (every run checks
    /// that), at least one came, their releases said "not owner", and (a
    /// holder was killed) another client took the key over.
    fn fenced_out(o: &Outcome) -> bool {
        let r = &o.report;
        r.stale_writes >= 1 && r.stale_release_lost >= 1 && r.max_takeover_ms > 0
    }

    /// Runs `name` until a strike fell where `hit` looks, at most three
    /// times; every run must be clean (no violation, no stale write
    /// accepted), and a violation fails at once, never retried. A short run
    /// (500 operations, a few strikes) may have no strike there, more often
    /// with other tests on the same two cores (in CI, the other lane's): it
    /// shows nothing either way.
    fn struck(name: &str, missed: &str, hit: impl Fn(&Outcome) -> bool) -> Outcome {
        let mut reports = Vec::new();
        for _ in 0..3 {
            let o = run_clean(name);
            let r = &o.report;
            assert_eq!(
                r.stale_writes_rejected, r.stale_writes,
                "a stale write was accepted: {r:?}"
            );
            if hit(&o) {
                return o;
            }
            reports.push(format!("{} strikes; {r:?}", o.faults));
        }
        panic!("{missed}, in 3 runs:\n{}", reports.join("\n"));
    }

    #[test]
    fn without_fencing_the_checker_reports_the_stopped_holders_writes() {
        reports_stale_writes("stop-holder-unfenced");
    }

    /// The unfenced control: the stopped holders' writes were accepted, and the
    /// checker reported them (overlaps in the store, lower tokens, lost updates).
    fn reports_stale_writes(name: &str) {
        objects(name, "the checker missed the stale writes", |v| {
            v.store_overlaps > 0 && v.lower_token_accepted > 0 && v.lost_updates > 0
        });
    }

    /// A control: `name` breaks the property on purpose, and the checker
    /// must say so (`shown`: its report names what was broken).
    ///
    /// Only when a strike fell where it breaks it: a short run (500
    /// operations, a few strikes) may have none that did, more often with
    /// other tests on the same two cores (in CI, the other lane's). Such a
    /// run shows nothing either way, so up to three are run; the long runs
    /// (FAULTS.md) break it in every run.
    fn objects(name: &str, missed: &str, shown: impl Fn(&fault::checker::Violations) -> bool) {
        let mut reports = Vec::new();
        for _ in 0..3 {
            let o = run(name);
            if shown(&o.report.violations) {
                assert!(o.as_expected(), "{}", o.report);
                return;
            }
            reports.push(o.report.to_string());
        }
        panic!("{missed}, in 3 runs:\n{}", reports.join("\n"));
    }

    #[test]
    fn a_holder_stopped_past_its_lease_is_fenced_out_of_a_postgresql_record_by_fence_postgres() {
        struck(
            "stop-holder-postgres",
            "no stop and kill hit a holder mid-write",
            |o| o.faults >= 2 && fenced_out(o),
        );
    }

    #[test]
    fn without_fence_postgres_the_checker_reports_the_stopped_holders_writes_to_postgresql() {
        reports_stale_writes("stop-holder-postgres-unfenced");
    }

    /// The lazy token (Kleppmann's paused holder): the workers ask for their
    /// token after their think, and the victim is stopped past its lease
    /// before it asks. No violation (no token handed out once another holder
    /// had the key, no stale write accepted), and a stopped holder asked for
    /// its token and was refused: the lease had ended.
    #[test]
    fn a_holder_stopped_past_its_lease_before_it_asks_for_its_token_never_gets_one() {
        struck(
            "stop-holder-lazy-token",
            "no holder stopped past its lease was refused its token",
            |o| {
                let r = &o.report;
                o.faults >= 2 && r.tokens_refused_struck >= 1 && r.stale_release_lost >= 1
            },
        );
    }

    /// The control: the same run with tokens minted without a look at the
    /// lease. A stopped holder gets a token above the next holder's, and the
    /// checker must say so: when another worker took the stopped holder's
    /// key, and asked for its token, before the holder woke (in one CI run
    /// of 7 stops, beside the other lane's tests, none did).
    #[test]
    fn tokens_minted_without_the_lease_check_are_reported() {
        objects(
            "stop-holder-lazy-token-unchecked",
            "no stopped holder got a token after the next holder had taken its key",
            |v| v.late_tokens > 0,
        );
    }

    #[test]
    fn a_paused_server_loses_no_exclusion_and_progress_resumes() {
        survives("pause-server", 1, "the server was never paused");
    }

    #[test]
    fn a_killed_server_with_aof_keeps_tokens_increasing() {
        let o = survives("kill-server-aof", 1, "the server was never killed");
        assert_eq!(o.report.fence_regressions, 0);
    }

    /// Documents the case without persistence: the counter restarts, tokens
    /// repeat, and a fenced store rejects the new holders until the counter
    /// passes the highest token it saw. Safe (no violation), not available.
    #[test]
    fn a_killed_server_without_persistence_repeats_tokens_and_the_store_refuses_them() {
        let o = run_clean("kill-server-no-persistence");
        assert_eq!(o.faults, 1);
        assert!(o.report.fence_regressions > 0, "{}", o.report);
        assert!(o.report.fenced_out > 0, "{}", o.report);
    }

    #[test]
    fn killed_connections_never_strand_a_waiter() {
        survives(
            "client-kill",
            2,
            "both kinds of connection were to be killed",
        );
    }

    #[test]
    fn cancelled_acquires_leave_no_lock_behind() {
        let o = run_clean("cancel-acquire");
        assert!(o.report.cancelled >= 50, "{}", o.report);
        assert_eq!(o.report.acquired + o.report.cancelled, OPS);
    }

    #[test]
    fn a_blocked_runtime_keeps_its_lock_below_the_ttl_and_is_told_above() {
        let o = run_clean("blocked-runtime");
        assert!(
            o.report.blocked_keep >= 1 && o.report.blocked_lose >= 1,
            "{}",
            o.report
        );
    }

    #[test]
    fn redlock_keeps_exclusion_and_increasing_tokens_with_a_minority_of_masters_killed() {
        let o = run("redlock-minority");
        // Safety here; liveness (no stall past a lease) in the test below.
        let mut v = o.report.violations.clone();
        v.stalled = 0;
        assert_eq!(v.total(), 0, "{}\n{:#?}", o.report, o.report.examples);
        assert!(o.faults >= 1, "no minority was killed");
        assert_eq!(o.report.fence_regressions, 0);
        assert_eq!(o.report.acquired, OPS);
    }

    #[test]
    fn a_sentinel_failover_with_replica_acks_keeps_exclusion_and_tokens() {
        // The old master comes back as a replica the sentinels may not promote
        // until it has synced, and the new master then stalls past
        // down-after-milliseconds: no second failover, nothing lost.
        let o = survives("sentinel-failover", 1, "no failover happened");
        assert_eq!(o.report.fence_regressions, 0);
    }

    #[test]
    #[ignore = "a demonstration, timing-dependent on a loaded machine: `cargo test -p fault -- --ignored`, or `fault run sentinel-empty-restart --runs N`"]
    fn an_old_master_back_empty_as_a_master_is_promoted_by_a_second_failover_and_tokens_repeat() {
        // The same fault with the old master restarted empty as a master: the
        // sentinels promote it while the new master stalls, the new master
        // becomes its replica, and the fencing counters start again from zero.
        // The checker must see it (this is what `fault all` once reported as
        // 658 violations, when the new master stalled on a loaded machine).
        let o = run("sentinel-empty-restart");
        assert!(o.as_expected(), "{}", o.report);
        assert!(o.report.violations.duplicate_fences > 0, "{}", o.report);
        assert!(o.report.fenced_out > 0, "the store refused no stale token");
    }

    /// A Redlock master killed under load leaves, now and then, a stall a little
    /// past a lease (waiters that found the key free only at their lease timer):
    /// 7 of 10 long runs saw one or two (FAULTS.md), and a single run of this
    /// test once stalled 2.1 s on a 1 s lease. That tail is a known liveness gap,
    /// not a safety one: here it must stay rare and short. Three runs; at most
    /// one may stall past a lease, none past three leases, and none may break
    /// mutual exclusion or fencing.
    #[test]
    fn redlock_with_a_minority_of_masters_killed_rarely_and_briefly_stalls_past_a_lease() {
        let mut stalled_runs = 0;
        for _ in 0..3 {
            let o = run("redlock-minority");
            let v = &o.report.violations;
            assert_eq!(v.total(), v.stalled, "{}", o.report);
            assert!(o.report.max_stall_ms < 3_000, "{}", o.report);
            stalled_runs += usize::from(v.stalled > 0);
        }
        assert!(
            stalled_runs <= 1,
            "{stalled_runs} of 3 runs stalled past a lease"
        );
    }

    /// Asserts that tasks of one process handed keys on in-process (local
    /// hand-over): `at_least` acquisitions took no token of the server's.
    fn handed_on_locally(o: &Outcome, at_least: u64) {
        let local = o
            .handed_on_locally()
            .expect("the server's tokens were counted");
        assert!(
            local >= at_least,
            "only {local} of {} acquisitions handed on in-process: {:?}",
            o.report.acquired,
            o.tokens
        );
    }

    #[test]
    fn eight_tasks_in_each_of_four_processes_take_turns_on_one_key_without_overlap() {
        let o = survives("tasks-1-key", 0, "");
        assert_eq!(o.report.writes_accepted, OPS);
    }

    #[test]
    fn tasks_hand_their_processs_own_key_on_in_process_without_overlap() {
        let o = survives("tasks-own-keys", 0, "");
        assert_eq!(o.report.writes_accepted, OPS);
        handed_on_locally(&o, OPS / 2);
    }

    #[test]
    fn tasks_on_distinct_keys_with_coalesced_calls_never_overlap() {
        let o = survives("tasks-batched", 0, "");
        assert_eq!(o.report.writes_accepted, OPS);
    }

    /// Runs `name` (scenario 10): no violation, a stop and a kill struck (every
    /// 2nd strike is a kill), the stopped holders' late writes were refused and
    /// their releases said "not owner", and another process took the key over.
    fn struck_and_fenced_out(name: &str) -> Outcome {
        struck(name, "no stop and kill hit a holder mid-write", |o| {
            o.faults >= 2 && fenced_out(o)
        })
    }

    #[test]
    fn a_process_stopped_or_killed_while_its_task_holds_is_fenced_out_with_the_tasks_in_its_line() {
        struck_and_fenced_out("tasks-stop-holder");
    }

    #[test]
    fn a_process_stopped_or_killed_amid_local_hand_overs_is_fenced_out() {
        let o = struck_and_fenced_out("tasks-stop-holder-own-keys");
        handed_on_locally(&o, OPS / 2);
    }

    #[test]
    fn without_fencing_the_checker_reports_a_stopped_processs_stale_writes() {
        reports_stale_writes("tasks-stop-holder-unfenced");
    }

    /// Scenario 11, a stopped or killed holder of `name`'s synchronizer: no
    /// violation, and the strike really came (a stopped holder told "not
    /// owner" when it came back, the key taken over after it).
    fn a_struck_holder_of(name: &str) -> Outcome {
        struck(name, "the holder was never struck", |o| {
            o.faults >= 1 && o.report.stale_release_lost + o.report.max_takeover_ms > 0
        })
    }

    #[test]
    fn a_read_write_locks_stopped_or_killed_holder_lets_readers_and_writers_on_and_is_fenced_out() {
        a_struck_holder_of("rw-stop-holder");
    }

    #[test]
    fn without_fencing_a_stopped_writers_write_lands_among_readers_and_the_checker_says_so() {
        objects(
            "rw-stop-writer-unfenced",
            "no stopped writer's write landed among readers",
            |v| v.store_overlaps > 0,
        );
    }

    #[test]
    fn a_semaphores_stopped_or_killed_holder_gives_its_permit_back_when_its_lease_ends() {
        a_struck_holder_of("semaphore-stop-holder");
    }

    #[test]
    fn a_semaphore_of_three_checked_as_one_of_two_is_reported() {
        let o = run("semaphore-checked-as-2");
        assert!(o.as_expected(), "{}", o.report);
        assert!(o.report.violations.too_many_holders > 0, "{}", o.report);
    }

    #[test]
    fn hold_at_least_keeps_acquisitions_apart_through_stopped_and_killed_holders() {
        a_struck_holder_of("hold-at-least-stop-holder");
    }

    #[test]
    fn lock_all_holders_stopped_or_killed_are_fenced_out_on_every_key() {
        a_struck_holder_of("lock-all-stop-holder");
    }

    /// Scenario 12 on `name`'s topology: waiters keep their order while the
    /// holder is stopped past its fixed lease or killed (the key goes on by
    /// expiry) and others release. No violation (no waiter overtaken, nothing
    /// else either), a stop and a kill struck, every waiting operation got the
    /// key, and the rule had something to check: waiters seen in line, grants
    /// with an earlier waiter in line, try-once newcomers turned away; and the
    /// queue's list and its deadlines never disagreed in a watcher's read.
    fn waiters_keep_their_order(name: &str) {
        let o = run_clean(name);
        let r = &o.report;
        assert!(o.faults >= 2, "the holder was struck {} times", o.faults);
        assert!(r.max_takeover_ms > 0, "no key went on after a strike: {r}");
        let fifo = r.fifo.expect("the FIFO rule ran");
        assert_eq!(r.acquired, OPS - fifo.try_once_refused, "{r}");
        assert!(fifo.queued >= OPS / 2, "{fifo:?}");
        assert!(fifo.behind >= OPS / 4, "{fifo:?}");
        assert!(fifo.try_once_refused > 0, "{fifo:?}");
        assert_eq!(fifo.mismatches, 0, "a queue's list and deadlines disagreed");
    }

    #[test]
    fn waiters_keep_their_order_when_holders_are_stopped_or_killed_on_one_redis() {
        waiters_keep_their_order("fifo-crashed-holders");
    }

    #[test]
    fn waiters_keep_their_order_when_holders_are_stopped_or_killed_on_sentinel() {
        waiters_keep_their_order("fifo-crashed-holders-sentinel");
    }

    /// Scenario 13 on `name`'s store: one of the order service's two instances
    /// killed and restarted 16 times, 30-150 ms apart, while 16 clients create
    /// orders, each key retried until a `2xx`. Every key has exactly one
    /// order, every acknowledged response names it, and the kills came.
    fn exactly_once(name: &str) {
        let o = run_alone(name);
        assert_clean(&o);
        let r = &o.report;
        assert_eq!(r.violations.duplicate_orders, 0, "{:#?}", r.examples);
        assert_eq!(r.acquired, r.operations, "keys never acknowledged: {r}");
        assert!(r.operations >= 16, "only {} keys", r.operations);
        assert_eq!(o.faults, 16, "the kills did not all come");
    }

    #[test]
    fn killed_order_service_instances_never_create_a_second_order_in_redis() {
        exactly_once("exactly-once-redis");
    }

    #[test]
    fn killed_order_service_instances_never_create_a_second_order_in_postgresql() {
        exactly_once("exactly-once-postgres");
    }
}
