//! The mutual-exclusion checker: reads every worker's log, the harness's fault
//! log and the store's final state, and counts violations.
//!
//! What it checks, and from which evidence:
//!
//! | check | evidence | violation when |
//! | --- | --- | --- |
//! | overlapping holds as seen by the store | the store's write log (serial order) | an accepted write read a version other than the one just before it: another write was accepted between its read and its write |
//! | writes accepted from a lower token | the store's write log | an accepted write carried a token lower than one the store had already seen |
//! | lost / duplicated updates | final counter vs accepted writes; `(worker, op)` pairs | the counter is below (lost) or above (duplicated) the number of accepted writes, or one operation's write was applied twice |
//! | log and store agree | worker logs vs store log | a worker says "accepted as seq N" and the store's N-th write is another's (a killed worker may miss its last line) |
//! | fencing tokens are unique and increase | worker logs | two acquisitions of a key got one token, one of them exclusive; or (with persistence) a token not above one acquired before the attempt began (a shared attempt: an exclusive one acquired, or a shared one ended, before it) |
//! | overlapping holds as seen by clients | worker logs | holds that ended in a successful release, `[acquired, release sent]` (inside the true hold, so an overlap is real), more at once than the kind admits: two of a mutex, a writer with anyone, more than a semaphore's permits |
//! | the same in store order (read-write locks, semaphores) | the store's access log | the same, each hold from its first to its last access of the record |
//! | readers inside a write | the store's access log | a shared read accepted between another operation's exclusive read and its write |
//! | `hold_at_least` | worker logs | a key acquired again sooner than the minimum (less 10 ms) after an acquisition released `Ok` |
//! | waiters that never got the lock | worker logs | an operation ended without the lock although its wait was long (the scenarios use long waits) |
//! | locks held past their TTL after the holder died | worker logs + faults | after a holder was stopped past its lease or killed, nobody else got the key within TTL + slack, though another process wanted it |
//! | stalls | worker logs + faults | waiters waited with no reported holder for longer than TTL + slack outside server outages (an orphaned lock: a cancelled acquire, a leaked watchdog; or waiters that missed a free lock; a waiter does not count while its own process is stopped, those behind it do) |
//! | cancelled acquires are never held | worker logs | a cancelled acquire left a guard being renewed (`renewed_leases() > 0`) |
//! | blocked runtimes (scenario 7) | worker logs | blocked below the TTL and lost it, or blocked past it and not told (`lost()` not resolved within 2 s, or `release` returned `Ok`) |
//! | stopped holders (scenarios 2, 10) | worker logs + faults | stopped past the lease and `release`, sent after the `SIGCONT`, still said `Ok` |
//! | every operation accounted for | worker logs + the store's draws | a worker drew more operations from the budget than its log began, and it was not killed (a killed process may have drawn one per task whose answer never arrived) |
//! | nothing hangs | the harness | a worker did not finish before the run's deadline |
//! | waiters keep their order (scenario 12) | worker logs + faults | an acquisition was granted while a waiter seen in the key's queue before it was attempted was still waiting, alive ([`fifo`]) |
//!
//! The rules that depend on the synchronizer are in `synchronizers`; a
//! `lock_all` operation is checked as one operation per key.
//!
//! A worker here is a *logical* worker: one task of a worker process (most
//! scenarios run one task per process). Two tasks of one process are checked
//! against each other as two processes are; a `SIGSTOP` or `SIGKILL` of the
//! process strikes all of its tasks at once ([`WorkerLog::process`]).

use std::collections::BTreeMap;
use std::fmt;

use crate::kind::{Kind, Side};
use crate::log::{Event, Fault, ReleaseOutcome, WriteOutcome};
use crate::store::Record;

pub mod fifo;
mod properties;
mod rebuild;
mod synchronizers;

/// One logical worker's log.
#[derive(Clone, Debug, Default)]
pub struct WorkerLog {
    /// Logical worker number (what the store's log names).
    pub id: u32,
    /// The process it ran in (what the harness's faults name).
    pub process: u32,
    /// Its events, in order.
    pub events: Vec<Event>,
}

/// What the checker is given.
#[derive(Clone, Debug, Default)]
pub struct RunData {
    /// The synchronizer the workers took, as the checker is to judge it (a
    /// control may name a stricter one than the workers took).
    pub kind: Kind,
    /// The lease the workers used, ms.
    pub ttl_ms: u64,
    /// Extra time allowed beyond a lease before a takeover or a stall counts as
    /// "held past the TTL", ms.
    pub slack_ms: u64,
    /// Fencing tokens must never repeat or decrease (a persistent or never
    /// restarted lock server).
    pub expect_monotonic_fences: bool,
    /// Worker logs.
    pub workers: Vec<WorkerLog>,
    /// The harness's faults.
    pub faults: Vec<Fault>,
    /// The store's final state per key.
    pub records: BTreeMap<String, Record>,
    /// How many operations within the budget each logical worker drew.
    pub drawn: BTreeMap<u32, u64>,
    /// Worker processes that had not finished at the deadline.
    pub hung: Vec<u32>,
    /// Check that waiters keep their order ([`fifo`]; scenario 12).
    pub fifo: bool,
}

/// Violations by kind; [`Violations::total`] adds them up.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Violations {
    /// Accepted writes interleaved with another holder's read-modify-write.
    pub store_overlaps: u64,
    /// Accepted writes from a token lower than one seen before.
    pub lower_token_accepted: u64,
    /// Accepted writes missing from the counter.
    pub lost_updates: u64,
    /// Writes applied twice, or a counter above the accepted writes.
    pub duplicated_updates: u64,
    /// Worker logs and the store disagree (writes, or operations drawn).
    pub log_mismatches: u64,
    /// One token given to two acquisitions of a key.
    pub duplicate_fences: u64,
    /// Tokens not above an earlier acquisition's (only when monotonic
    /// tokens are expected; see [`Report::fence_regressions`]).
    pub fence_regressions: u64,
    /// Overlapping holds that both released successfully.
    pub client_overlaps: u64,
    /// Operations that never got the lock.
    pub waiters_never_acquired: u64,
    /// Keys taken over later than TTL + slack after their holder was stopped
    /// past its lease or killed.
    pub held_past_ttl: u64,
    /// Waiters waited longer than TTL + slack with no holder reported,
    /// outside server outages: an orphaned lock (a cancelled acquire, a
    /// leaked renewal) or waiters that missed a free lock.
    pub stalled: u64,
    /// Cancelled acquires that left a renewed guard.
    pub leaked_watchdogs: u64,
    /// Scenario 7 expectations not met.
    pub blocked_wrong: u64,
    /// Holders stopped past their lease whose release said `Ok`.
    pub stale_release_ok: u64,
    /// A semaphore's holders with valid leases, more at once than its
    /// permits (in the workers' logs or in the store's order).
    pub too_many_holders: u64,
    /// `hold_at_least`: a key acquired again sooner than that after an
    /// acquisition whose holder released it `Ok`.
    pub held_too_briefly: u64,
    /// Workers that did not finish.
    pub hung_workers: u64,
    /// Acquisitions granted while an earlier waiter, alive and still
    /// waiting, stood in line for the key ([`fifo`]).
    pub overtaken: u64,
    /// A token asked for after the grant (minted on first use) that a
    /// holder got although another holder had taken the key since its
    /// grant: the token of a lease that had ended.
    pub late_tokens: u64,
    /// Scenario 13: orders beyond one per key.
    pub duplicate_orders: u64,
    /// Scenario 13: `2xx` answers that named an order other than the key's
    /// own (or none).
    pub mismatched_acks: u64,
    /// Scenario 13: keys that got no `2xx` before their client gave up.
    pub keys_never_acknowledged: u64,
}

impl Violations {
    /// All violations.
    pub fn total(&self) -> u64 {
        self.store_overlaps
            + self.lower_token_accepted
            + self.lost_updates
            + self.duplicated_updates
            + self.log_mismatches
            + self.duplicate_fences
            + self.fence_regressions
            + self.client_overlaps
            + self.waiters_never_acquired
            + self.held_past_ttl
            + self.stalled
            + self.leaked_watchdogs
            + self.blocked_wrong
            + self.stale_release_ok
            + self.too_many_holders
            + self.held_too_briefly
            + self.hung_workers
            + self.overtaken
            + self.late_tokens
            + self.duplicate_orders
            + self.mismatched_acks
            + self.keys_never_acknowledged
    }

    /// The non-zero kinds, as `name=count` pairs.
    pub fn nonzero(&self) -> Vec<(&'static str, u64)> {
        [
            ("store_overlaps", self.store_overlaps),
            ("lower_token_accepted", self.lower_token_accepted),
            ("lost_updates", self.lost_updates),
            ("duplicated_updates", self.duplicated_updates),
            ("log_mismatches", self.log_mismatches),
            ("duplicate_fences", self.duplicate_fences),
            ("fence_regressions", self.fence_regressions),
            ("client_overlaps", self.client_overlaps),
            ("waiters_never_acquired", self.waiters_never_acquired),
            ("held_past_ttl", self.held_past_ttl),
            ("stalled", self.stalled),
            ("leaked_watchdogs", self.leaked_watchdogs),
            ("blocked_wrong", self.blocked_wrong),
            ("stale_release_ok", self.stale_release_ok),
            ("too_many_holders", self.too_many_holders),
            ("held_too_briefly", self.held_too_briefly),
            ("hung_workers", self.hung_workers),
            ("overtaken", self.overtaken),
            ("late_tokens", self.late_tokens),
            ("duplicate_orders", self.duplicate_orders),
            ("mismatched_acks", self.mismatched_acks),
            ("keys_never_acknowledged", self.keys_never_acknowledged),
        ]
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .collect()
    }
}

/// The checker's findings for one run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Lock operations (attempts to take a lock).
    pub operations: u64,
    /// Operations drawn from the budget by a task of a killed process that
    /// never logged their attempt (the draw's answer was on its way): with
    /// [`Report::operations`], the budget.
    pub killed_mid_draw: u64,
    /// Operations that got the lock.
    pub acquired: u64,
    /// Acquire calls that failed with a backend error (retried).
    pub acquire_errors: u64,
    /// Acquires cancelled by a timeout.
    pub cancelled: u64,
    /// Writes the store accepted.
    pub writes_accepted: u64,
    /// Reads and writes the store rejected by fencing.
    pub fenced_out: u64,
    /// Tokens that repeated or went down (counted as violations only when
    /// monotonic tokens are expected).
    pub fence_regressions: u64,
    /// Stopped holders whose write came after the stop, once another worker
    /// had taken the key ...
    pub stale_writes: u64,
    /// ... of which the store rejected.
    pub stale_writes_rejected: u64,
    /// Stopped holders whose release said "not owner".
    pub stale_release_lost: u64,
    /// Holders whose token, asked for after the grant, was refused with
    /// `LockError::Lost` (their lease had ended) ...
    pub tokens_refused: u64,
    /// ... of which had been stopped past their lease while they held
    /// (between their attempt and the answer) ...
    pub tokens_refused_struck: u64,
    /// ... and of which once another holder of the key had written
    /// (Kleppmann's paused holder).
    pub tokens_refused_after_next_write: u64,
    /// Blocked below the TTL (scenario 7) ...
    pub blocked_keep: u64,
    /// ... and past it.
    pub blocked_lose: u64,
    /// Longest wait for a lock that was acquired, ms.
    pub max_wait_ms: u64,
    /// Longest time some operation waited while no holder was reported, ms
    /// (fault windows included).
    pub max_stall_ms: u64,
    /// When that stall began, µs since the epoch, and on which key.
    pub max_stall_at: (u64, String),
    /// Longest time from stopping or killing a holder to another client
    /// holding its key, ms.
    pub max_takeover_ms: u64,
    /// Violations.
    pub violations: Violations,
    /// What the waiters' order rests on, when checked ([`RunData::fifo`]).
    pub fifo: Option<fifo::Stats>,
    /// Up to 20 human-readable examples of violations.
    pub examples: Vec<String>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} operations, {} acquired, {} violations {:?}; max stall {} ms (at {} µs on {}), max wait {} ms",
            self.operations,
            self.acquired,
            self.violations.total(),
            self.violations.nonzero(),
            self.max_stall_ms,
            self.max_stall_at.0,
            self.max_stall_at.1,
            self.max_wait_ms
        )
    }
}

/// One lock operation on one key, rebuilt from a worker's log (a
/// `lock_all` operation is one per key, its `part`s).
#[derive(Clone, Debug)]
struct Op {
    worker: u32,
    process: u32,
    op: u64,
    key: String,
    /// Which of the operation's keys (0: the first; only `lock_all` has more).
    part: usize,
    /// Shared (a reader, a semaphore's holder) or exclusive.
    side: Side,
    attempt: u64,
    acquired: Option<(u64, u64)>,
    /// When it stopped waiting without the lock.
    gave_up: Option<u64>,
    cancelled: Option<usize>,
    cancelled_at: Option<u64>,
    /// When a read the store accepted returned.
    read: Option<u64>,
    /// (outcome, sequence number, sent).
    write: Option<(WriteOutcome, u64, u64)>,
    /// When the answer of a write the store accepted came.
    written: Option<u64>,
    /// When the token was asked for, if after the grant (the grant was
    /// logged with token 0).
    token_sent: Option<u64>,
    /// That token refused: whether with `Lost`, and when the answer came.
    token_refused: Option<(bool, u64)>,
    blocked: Option<(u64, u64, Option<u64>)>,
    release_sent: Option<u64>,
    released: Option<(ReleaseOutcome, u64)>,
}

impl Default for Op {
    fn default() -> Self {
        Self {
            worker: 0,
            process: 0,
            op: 0,
            key: String::new(),
            part: 0,
            side: Side::Write,
            attempt: 0,
            acquired: None,
            gave_up: None,
            cancelled: None,
            cancelled_at: None,
            read: None,
            write: None,
            written: None,
            token_sent: None,
            token_refused: None,
            blocked: None,
            release_sent: None,
            released: None,
        }
    }
}

impl Op {
    /// The interval in which the holder's lease was surely valid, if it
    /// released `Ok`: `[acquire returned, release sent]` (an `Ok` release
    /// says the lease had not ended when it was sent, and leases only
    /// grow). A holder stopped past its lease, killed, or told "not owner"
    /// has none, whatever it did meanwhile.
    fn valid_hold(&self) -> Option<(u64, u64)> {
        match self.released {
            Some((ReleaseOutcome::Ok, _)) => Some((self.acquired?.1, self.release_sent?)),
            _ => None,
        }
    }

    /// The end of the hold as far as logs tell (release returned, or the
    /// last thing the worker did).
    fn hold_end(&self, death: Option<u64>, end_of_log: u64) -> u64 {
        if let Some((_, t)) = self.released {
            return t;
        }
        death.unwrap_or(end_of_log)
    }

    fn wait_end(&self) -> Option<u64> {
        self.acquired
            .map(|(_, t)| t)
            .or(self.gave_up)
            .or(self.cancelled_at)
    }
}

fn ms(us: u64) -> u64 {
    us / 1000
}

/// `hold_at_least`: how much sooner than the minimum two logged
/// acquisitions may be (see [`synchronizers::held_too_briefly`]).
const HOLD_SLACK_US: u64 = 10_000;

/// Checks one run: each property in a function of its own
/// (in `checker/properties.rs`).
pub fn check(run: &RunData) -> Report {
    use properties::{
        blocked_runtimes, draws, holds, stalls, store_writes, struck_holders, tokens,
        tokens_after_the_grant,
    };
    let mut r = Report::default();
    let mut examples = Vec::new();
    let rb = rebuild::rebuild(run, &mut r, &mut examples);
    draws(run, &rb, &mut r, &mut examples);
    r.max_wait_ms = ms(rb
        .ops
        .iter()
        .filter(|o| o.part == 0)
        .filter_map(|o| o.acquired.map(|(_, t)| t.saturating_sub(o.attempt)))
        .max()
        .unwrap_or(0));
    store_writes(run, &rb, &mut r, &mut examples);
    let mut by_key: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for o in &rb.ops {
        by_key.entry(o.key.as_str()).or_default().push(o);
    }
    for (key, key_ops) in &by_key {
        tokens(run, key, key_ops, &mut r, &mut examples);
        holds(run, key, key_ops, &mut r, &mut examples);
    }
    stalls(run, &rb, &by_key, &mut r, &mut examples);
    struck_holders(run, &rb, &by_key, &mut r, &mut examples);
    tokens_after_the_grant(run, &rb, &by_key, &mut r, &mut examples);
    blocked_runtimes(run, &rb.ops, &mut r, &mut examples);

    if run.fifo {
        let found = fifo::check(run);
        for example in found.overtaken {
            flag(&mut r.violations.overtaken, &mut examples, example);
        }
        r.fifo = Some(found.stats);
    }

    r.violations.hung_workers = run.hung.len() as u64;
    for w in &run.hung {
        note(
            &mut examples,
            format!("worker {w} did not finish before the deadline"),
        );
    }
    r.examples = examples;
    r
}

/// Notes an example (the first 20).
fn note(examples: &mut Vec<String>, s: String) {
    if examples.len() < 20 {
        examples.push(s);
    }
}

/// A violation: counted, and noted as an example.
fn flag(count: &mut u64, examples: &mut Vec<String>, s: String) {
    *count += 1;
    note(examples, s);
}

#[cfg(test)]
mod tests;
