//! The idempotency record (`LockClient::record`, `IdempotencyLayer`) on one server: claim, run the
//! handler, renew, complete or release, with lost requests and replies,
//! pauses and crashes. Safety only.
//!
//! Mirrors the claim's plain `SET <record> run:<owner>:<fp> NX PX <lease>`
//! and, when it finds the key taken, idempotency_claim.lua
//! (backend/records/redis.rs `claim_on`), idempotency_renew_many.lua (one
//! record's part of the batch), idempotency_settle.lua (a completion, or a
//! release), `records/mod.rs` (`Claiming`, the claim under `Turns::run`)
//! and `records/guard.rs` (and the layer's `running.rs`). A duplicate's
//! `waited` mark and the notices it asks for are not modelled: they only
//! decide whether a `PUBLISH` is sent, and change nothing else. Every
//! request carries the same key and payload (fingerprint); a completed
//! record is kept for longer than the model runs (retention). A request
//! answered without a result (409 in flight, or a failure) may be sent
//! again by its client ([`RecordsConfig::retries`]).
//!
//! With a commit store ([`RecordsConfig::store`]: `commit_with_redis`,
//! `commit_with_postgres`, the layer's `Commit`), a claimed request first
//! looks for the record's committed copy there (`records/commit.rs`
//! `look`), and a handler that succeeds commits its work with the record in
//! one step (idempotency_commit.lua, or one PostgreSQL transaction) before
//! the record is completed on the server with what committed
//! (`settle_commit`, the layer's `Commit::settle`): `records/commit.rs`.
//! With the lock server as the store (`commit_on_lock_server`), the
//! record is the committed copy: nothing is looked for, and the commit
//! (idempotency_commit_record.lua, on the lock server) completes the record.

use stateright::{Model, Property};

use crate::check::{self, Log, Narrate};
use crate::reply::name;

mod commit;
mod server;

pub use commit::StoreConfig;

/// A configuration of the records model.
#[derive(Clone, Debug)]
pub struct RecordsConfig {
    /// Requests with the same `Idempotency-Key`.
    pub requests: u8,
    /// The in-flight lease, in ticks.
    pub lease: u8,
    /// A handler finishes at most this many ticks after its claim.
    pub run_max: u8,
    /// Faults in one run (lost request, lost reply, pause; at most one pause).
    pub faults: u8,
    /// How long a pause lasts.
    pub pause_len: u8,
    /// How many times a request answered without a result (409 in flight,
    /// or a failure) is sent again by its client, a lease and a tick later
    /// (after the lease of a claimer that crashed or stopped).
    pub retries: u8,
    /// The commit store the work commits to, if any.
    pub store: Option<StoreConfig>,
}

impl RecordsConfig {
    /// Into a model.
    pub fn into_model(self) -> RecordsModel {
        RecordsModel { cfg: self }
    }
}

/// The records model.
#[derive(Clone, Debug)]
pub struct RecordsModel {
    /// Its configuration.
    pub cfg: RecordsConfig,
}

/// The record (its value: `run:..`, `waited:..` or `done:..`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Record {
    /// `done:..` (else `run:..` or `waited:..`).
    pub done: bool,
    /// `owner`.
    pub owner: u8,
    /// Whose work's result a completed record holds (its owner's, or with
    /// a commit store the one that committed).
    pub result: u8,
    /// Expiry (a completed record outlives the model).
    pub expires: u8,
}

/// A command or script call.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Req {
    /// The claim's `SET <record> run:<owner>:<fp> NX PX <lease>`.
    SetNx,
    /// idempotency_claim.lua, sent when the `SET NX` found the key taken.
    Claim,
    /// idempotency_settle.lua with a response: request `.0`'s result.
    Complete(u8),
    /// idempotency_settle.lua without one
    Release,
    /// The look for the record's committed copy in the commit store.
    Look,
    /// The work's writes and the committed record, in the commit store (on
    /// the lock server: idempotency_commit_record.lua, the record completed).
    Commit,
}

/// Where a request is: sent, answered (with the script's code), or lost.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Stage {
    /// On the wire.
    Sent,
    /// Answered with this code.
    Replied(u8),
    /// The connection broke.
    Failed,
}

/// Where a request's handling is.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Phase {
    /// Not arrived.
    Idle,
    /// Claiming (`RecordRequest::answer`, records/mod.rs: `Claiming`
    /// under `Turns::run`).
    Claiming,
    /// Claimed, looking in the commit store before it runs (renewed).
    Looking,
    /// The handler runs (renewed in the background, `RecordGuard::claimed`, records/guard.rs).
    Running,
    /// Committing its work in the commit store, or on the lock server
    /// (renewed).
    Committing,
    /// Completing (`RecordGuard::completing`, and the layer's `complete`).
    Completing,
    /// Releasing after the handler failed (`RecordGuard::release`).
    Releasing,
    /// Answered (replayed, 409, or the handler's response).
    Done,
    /// Answered without a result (409, or a failure), to be sent again by
    /// its client.
    Retrying,
    /// The process died.
    Crashed,
}

/// One request.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Request {
    /// Its step.
    pub phase: Phase,
    /// A script call in flight.
    pub net: Option<(Req, Stage)>,
    /// When its claim succeeded.
    pub claimed_at: u8,
    /// Next renewal.
    pub renew_due: u8,
    /// Paused until.
    pub paused_until: Option<u8>,
    /// Ghost: its record expired while it held it (looking, or its handler ran).
    pub expired: bool,
    /// Ghost: its claim took the record after the key's work had committed.
    pub claimed_after_commit: bool,
    /// Retries its client has left.
    pub retries: u8,
    /// When its client sends it again (in [`Phase::Retrying`]).
    pub retry_at: u8,
}

impl Request {
    /// Answered without a result at `now`: its client sends it again, if
    /// it has retries left, once `back_off` ticks passed.
    fn may_retry(&mut self, now: u8, back_off: u8) {
        if self.retries > 0 {
            self.retries -= 1;
            self.phase = Phase::Retrying;
            self.retry_at = now + back_off;
        }
    }
}

/// The system.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct State {
    /// The clock.
    pub now: u8,
    /// The record.
    pub record: Option<Record>,
    /// The requests.
    pub requests: Vec<Request>,
    /// Faults left.
    pub faults: u8,
    /// Pauses left.
    pub pauses: u8,
    /// Ghost: a handler started while another ran on a live record.
    pub ran_twice: bool,
    /// Ghost: a handler started after the key's response was stored.
    pub ran_after_done: bool,
    /// Ghost: a completed record got another owner.
    pub done_overwritten: bool,
    /// Ghost: a response was stored.
    pub done_ever: bool,
    /// The commit store's committed copy: whose work committed.
    pub committed: Option<u8>,
    /// Ghost: a second piece of work committed.
    pub committed_twice: bool,
    /// Ghost: a handler started though its claim came after the key's work committed.
    pub ran_after_commit: bool,
    /// Ghost: a request answered with a result that is not the committed one.
    pub answered_uncommitted: bool,
    /// Ghost: a claim's look found the work committed.
    pub look_found: bool,
    /// Ghost: a commit found another's work committed first.
    pub commit_found: bool,
    /// Ghost: a commit on the lock server completed a record that was
    /// another claimer's claim, or gone with its lease.
    pub commit_took_over: bool,
}

/// A step.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Action {
    /// Time passes.
    Tick,
    /// Request `r` arrives and sends its claim (the `SET NX`).
    Arrive(u8),
    /// The server runs request `r`'s script.
    Exec(u8),
    /// Request `r` reads the answer.
    Receive(u8),
    /// Request `r`'s renewal runs (its part of idempotency_renew_many.lua,
    /// the watchdog's batch; one round trip).
    Renew(u8),
    /// Request `r`'s handler ends: `true` with a response, `false` failed.
    Finish(u8, bool),
    /// Fault: lost request.
    LoseRequest(u8),
    /// Fault: lost reply.
    LoseReply(u8),
    /// Fault: request `r`'s process stops for a while.
    Pause(u8),
    /// Fault: request `r`'s process dies.
    Crash(u8),
}

impl Model for RecordsModel {
    check::narrated_model!(State, Action, horizon: 30);

    fn init_states(&self) -> Vec<State> {
        vec![State {
            now: 0,
            record: None,
            requests: vec![
                Request {
                    phase: Phase::Idle,
                    net: None,
                    claimed_at: 0,
                    renew_due: 0,
                    paused_until: None,
                    expired: false,
                    claimed_after_commit: false,
                    retries: self.cfg.retries,
                    retry_at: 0,
                };
                self.cfg.requests as usize
            ],
            faults: self.cfg.faults,
            pauses: 1,
            ran_twice: false,
            ran_after_done: false,
            done_overwritten: false,
            done_ever: false,
            committed: None,
            committed_twice: false,
            ran_after_commit: false,
            answered_uncommitted: false,
            look_found: false,
            commit_found: false,
            commit_took_over: false,
        }]
    }

    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        let mut urgent = Vec::new();
        let mut lazy = Vec::new();
        for (i, r) in s.requests.iter().enumerate() {
            let i = i as u8;
            if let Some((_, Stage::Sent)) = r.net {
                urgent.push(Action::Exec(i));
            }
            if r.phase == Phase::Crashed || r.phase == Phase::Done {
                continue;
            }
            if s.faults > 0 {
                match r.net {
                    Some((_, Stage::Sent)) => lazy.push(Action::LoseRequest(i)),
                    Some((_, Stage::Replied(_))) => lazy.push(Action::LoseReply(i)),
                    _ => {}
                }
                if r.phase != Phase::Idle {
                    lazy.push(Action::Crash(i));
                    if s.pauses > 0 && r.paused_until.is_none() {
                        lazy.push(Action::Pause(i));
                    }
                }
            }
            if r.paused_until.is_some() {
                continue;
            }
            if matches!(r.net, Some((_, Stage::Replied(_) | Stage::Failed))) {
                urgent.push(Action::Receive(i));
            }
            match r.phase {
                Phase::Idle => {
                    if s.now >= 1 {
                        urgent.push(Action::Arrive(i));
                    } else {
                        lazy.push(Action::Arrive(i));
                    }
                }
                // A client's retry, once its back-off is over.
                Phase::Retrying if s.now >= r.retry_at => urgent.push(Action::Arrive(i)),
                // Renewed from the claim until the work is settled.
                Phase::Looking | Phase::Committing if r.renew_due <= s.now => {
                    urgent.push(Action::Renew(i));
                }
                Phase::Running => {
                    if r.renew_due <= s.now {
                        urgent.push(Action::Renew(i));
                    }
                    let v = if s.now >= r.claimed_at + self.cfg.run_max {
                        &mut urgent
                    } else {
                        &mut lazy
                    };
                    v.push(Action::Finish(i, true));
                    v.push(Action::Finish(i, false));
                }
                _ => {}
            }
        }
        let busy = s
            .requests
            .iter()
            .any(|r| !matches!(r.phase, Phase::Done | Phase::Crashed) || r.net.is_some());
        check::schedule(out, urgent, lazy, busy, Action::Tick);
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = Vec::from(check::never_set![RecordsModel;
            "a handler never runs while another runs on a live record" => ran_twice,
            "a completed request never runs again" => ran_after_done,
            "a completed record is never overwritten by another owner" => done_overwritten,
        ]);
        if let Some(store) = self.cfg.store {
            properties.extend(commit::properties(store));
        }
        properties.extend([
            Property::sometimes("a response is stored", |_: &RecordsModel, s: &State| {
                s.done_ever
            }),
            Property::sometimes(
                "a handler runs again after a record expired",
                |_: &RecordsModel, s: &State| {
                    s.requests
                        .iter()
                        .filter(|r| r.phase != Phase::Idle && r.claimed_at > 0)
                        .count()
                        >= 2
                },
            ),
        ]);
        properties
    }
}

impl Narrate for RecordsModel {
    fn apply(&self, s: &mut State, a: Action, log: &mut Log) {
        let now = s.now;
        let lease = self.cfg.lease;
        match a {
            Action::Tick => {
                s.now += 1;
                log.say(|| "time passes".into());
                if let Some(r) = s.record
                    && r.expires <= s.now
                {
                    s.record = None;
                    log.say(|| format!("{}'s record expires", name(r.owner)));
                    let o = &mut s.requests[r.owner as usize];
                    // Held by a claim whose reply is still on its way too: a
                    // handler it starts runs on an expired record.
                    if matches!(
                        o.phase,
                        Phase::Claiming | Phase::Looking | Phase::Running | Phase::Committing
                    ) {
                        o.expired = true;
                    }
                }
                for r in &mut s.requests {
                    if r.paused_until.is_some_and(|t| s.now >= t) {
                        r.paused_until = None;
                    }
                }
            }
            Action::Arrive(i) => {
                let r = &mut s.requests[i as usize];
                r.phase = Phase::Claiming;
                r.net = Some((Req::SetNx, Stage::Sent));
                log.say(|| format!("{}: arrives, sends SET NX", name(i)));
            }
            Action::Exec(i) => {
                let (req, _) = s.requests[i as usize].net.expect("in flight");
                let (code, server) = match (req, self.cfg.store) {
                    (Req::Commit, Some(store)) if store.on_lock_server => {
                        (s.commit_record(i, store), "server")
                    }
                    (Req::Look | Req::Commit, Some(store)) => {
                        (s.exec_store(i, req, store), "the commit store")
                    }
                    _ => (s.exec(i, req, now, lease), "server"),
                };
                s.requests[i as usize].net = Some((req, Stage::Replied(code)));
                log.say(|| format!("{server} runs {}'s {req:?} -> {code}", name(i)));
            }
            Action::Receive(i) => {
                let r = &mut s.requests[i as usize];
                let (req, stage) = r.net.take().expect("answered");
                match (req, stage) {
                    // `send`: a claim without an answer is sent again, from
                    // its `SET NX` (`claim_on` is sent whole).
                    (Req::SetNx | Req::Claim, Stage::Failed) => {
                        r.net = Some((Req::SetNx, Stage::Sent));
                        log.say(|| format!("{}: claim unanswered, sent again", name(i)));
                    }
                    (Req::SetNx | Req::Claim, Stage::Replied(0)) => {
                        r.claimed_at = now;
                        r.renew_due = now + 1;
                        if self.cfg.store.is_some_and(|store| store.look) {
                            r.phase = Phase::Looking;
                            r.net = Some((Req::Look, Stage::Sent));
                            log.say(|| format!("{}: claimed, looks in the commit store", name(i)));
                        } else {
                            s.start_handler(i);
                            log.say(|| format!("{}: claimed, runs the handler", name(i)));
                        }
                    }
                    // The key is taken: the claim script reads it.
                    (Req::SetNx, Stage::Replied(_)) => {
                        r.net = Some((Req::Claim, Stage::Sent));
                        log.say(|| format!("{}: key taken, sends idempotency_claim.lua", name(i)));
                    }
                    (Req::Claim, Stage::Replied(code)) => {
                        // 1: in flight elsewhere (409); 2: replayed.
                        r.phase = Phase::Done;
                        if code == 1 {
                            r.may_retry(now, lease + 1);
                        } else if self.cfg.store.is_some() {
                            // (Without a store, no answer is checked.)
                            let result = s.record.expect("a completed record stays").result;
                            s.answer(result);
                        }
                        log.say(|| {
                            format!(
                                "{}: {}",
                                name(i),
                                if code == 1 {
                                    "409 in flight"
                                } else {
                                    "stored response replayed"
                                }
                            )
                        });
                    }
                    // `finish`: sent again while unanswered.
                    (Req::Complete(result), Stage::Failed) => {
                        r.net = Some((Req::Complete(result), Stage::Sent));
                        log.say(|| format!("{}: completion unanswered, sent again", name(i)));
                    }
                    (Req::Complete(_), _) => {
                        r.phase = Phase::Done;
                        log.say(|| format!("{}: completion answered", name(i)));
                    }
                    // The request failed (its handler, or the commit store):
                    // a 5xx, which its client may retry.
                    (Req::Release, _) => {
                        r.phase = Phase::Done;
                        r.may_retry(now, lease + 1);
                        log.say(|| format!("{}: release answered", name(i)));
                    }
                    (Req::Look | Req::Commit, stage) => {
                        let store = self.cfg.store.expect("a call to the commit store");
                        s.receive_from_store(i, req, stage, store, log);
                    }
                    (_, Stage::Sent) => unreachable!(),
                }
            }
            Action::Renew(i) => {
                let ok = s.renew(i, now + lease);
                s.requests[i as usize].renew_due = now + 1;
                log.say(|| format!("{}: renews its record -> {}", name(i), ok as u8));
            }
            Action::Finish(i, ok) => {
                let r = &mut s.requests[i as usize];
                if ok && self.cfg.store.is_some() {
                    r.phase = Phase::Committing;
                    r.net = Some((Req::Commit, Stage::Sent));
                    log.say(|| format!("{}: handler done, commits its work", name(i)));
                } else if ok {
                    r.phase = Phase::Completing;
                    r.net = Some((Req::Complete(i), Stage::Sent));
                    log.say(|| {
                        format!(
                            "{}: handler done, sends idempotency_settle.lua to complete",
                            name(i)
                        )
                    });
                } else {
                    r.phase = Phase::Releasing;
                    r.net = Some((Req::Release, Stage::Sent));
                    log.say(|| {
                        format!(
                            "{}: handler failed, sends idempotency_settle.lua to release",
                            name(i)
                        )
                    });
                }
            }
            Action::LoseRequest(i) | Action::LoseReply(i) => {
                s.faults -= 1;
                let r = &mut s.requests[i as usize];
                let (req, _) = r.net.expect("in flight");
                r.net = Some((req, Stage::Failed));
                log.say(|| format!("FAULT {}: {req:?} or its answer lost", name(i)));
            }
            Action::Pause(i) => {
                s.faults -= 1;
                s.pauses -= 1;
                s.requests[i as usize].paused_until = Some(now + self.cfg.pause_len);
                log.say(|| format!("FAULT {}: process stops", name(i)));
            }
            Action::Crash(i) => {
                s.faults -= 1;
                let r = &mut s.requests[i as usize];
                r.phase = Phase::Crashed;
                if r.net.is_some_and(|(_, st)| st != Stage::Sent) {
                    r.net = None;
                }
                log.say(|| format!("FAULT {}: process dies", name(i)));
            }
        }
    }

    fn now(s: &State) -> u8 {
        s.now
    }

    fn summarize(&self, s: &State) -> String {
        format!(
            "t={} record {:?}; requests {:?}",
            s.now,
            s.record,
            s.requests.iter().map(|r| r.phase).collect::<Vec<_>>()
        )
    }
}
