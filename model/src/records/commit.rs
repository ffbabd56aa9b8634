//! The commit store of the records model: exactly once across crashes.
//!
//! Mirrors `records/commit.rs` (`look`, `RecordGuard::settle_commit`) and
//! the layer's `Commit` (`layer/idempotency/commit/mod.rs`, `settle`), which
//! decide alike: a claimed request looks for the record's committed copy
//! before its handler runs (found: the record is completed with that result,
//! which is the answer; a look that fails releases the claim), and a handler
//! that succeeds commits its work with the committed copy in one step
//! (idempotency_commit.lua on Redis, one transaction on PostgreSQL: the
//! insert fails on a row already there), which writes nothing when a copy is
//! there already (another claimer's work committed first: its result is
//! the answer). Then the record is completed on the lock server with what
//! committed; a commit that fails (or whose reply is lost) releases the
//! claim, so the next claim looks again.
//!
//! The store is one more server on the model's network: its calls are sent,
//! run atomically, answered or lost as the lock server's are. Its copy is
//! kept for longer than the model runs (retention); every request carries
//! the same payload, so a found copy is always this request's (the
//! fingerprint's `Reused` is not modelled).

use stateright::Property;

use super::{Phase, RecordsModel, Req, Stage, State};
use crate::check::{self, Log};
use crate::reply::name;

/// What the commit store does ([`RecordsConfig::store`](super::RecordsConfig::store)).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct StoreConfig {
    /// A claimed request looks for the committed copy before its handler
    /// runs (`false`: a mistake, for the check that shows the look matters).
    pub look: bool,
    /// A commit writes nothing when a copy is there (the script's first
    /// step, see `State::exec_store`; `false`: a mistake, for the check
    /// that shows it matters).
    pub commit_checks: bool,
}

impl StoreConfig {
    /// The store as the library uses it.
    pub const TODAY: Self = Self {
        look: true,
        commit_checks: true,
    };
}

/// An answer that names the committed copy found (`FOUND + owner`); 0: none
/// there (the look), or ours written (the commit).
const FOUND: u8 = 16;

/// The properties a commit store adds.
pub(super) fn properties() -> Vec<Property<RecordsModel>> {
    let mut properties = Vec::from(check::never_set![RecordsModel;
        "the work commits once per key" => committed_twice,
        "a handler never runs once its key's work committed before its claim" => ran_after_commit,
        "every request answered with a result answers the committed one" => answered_uncommitted,
    ]);
    properties.extend([
        Property::sometimes(
            "a claim finds the work committed by a claimer that did not complete its record",
            |_: &RecordsModel, s: &State| s.look_found,
        ),
        Property::sometimes(
            "a commit finds another claimer's work committed first",
            |_: &RecordsModel, s: &State| s.commit_found,
        ),
    ]);
    properties
}

impl State {
    /// The commit store runs request `i`'s `req` (`Look` or `Commit`): 0, or
    /// `FOUND + owner` of the copy there.
    pub(super) fn exec_store(&mut self, i: u8, req: Req, store: StoreConfig) -> u8 {
        let found = self.committed.map_or(0, |owner| FOUND + owner);
        match req {
            // committed.rs `lookup` (`HGETALL`), postgres.rs `lookup` (a `SELECT`).
            Req::Look => found,
            // idempotency_commit.lua, "if redis.call('EXISTS', KEYS[1]) == 1 then":
            // nothing is written when a copy is there.
            Req::Commit if store.commit_checks && found != 0 => found,
            // idempotency_commit.lua, "redis.call('HSET', KEYS[1], 'f', ARGV[1]":
            // the work's writes and the copy, together.
            Req::Commit => {
                self.committed_twice |= self.committed.is_some();
                self.committed = Some(i);
                0
            }
            _ => unreachable!("not a call to the commit store: {req:?}"),
        }
    }

    /// Request `i` reads the store's answer to `req` (`Look` or `Commit`).
    pub(super) fn receive_from_store(&mut self, i: u8, req: Req, stage: Stage, log: &mut Log) {
        let r = &mut self.requests[i as usize];
        match (req, stage) {
            // records/commit.rs `look` and `settle_commit`: `Err(e)` releases
            // the claim (the request fails: a 503 from the layer).
            (_, Stage::Failed) => {
                r.phase = Phase::Releasing;
                r.net = Some((Req::Release, Stage::Sent));
                log.say(|| format!("{}: {req:?} failed, releases the record", name(i)));
            }
            // `look`: `Ok(None)`, the handler runs.
            (Req::Look, Stage::Replied(0)) => {
                self.start_handler(i);
                log.say(|| format!("{}: nothing committed, runs the handler", name(i)));
            }
            // `settle_commit`: `CommitOutcome::Committed`, the record is
            // completed with our result.
            (Req::Commit, Stage::Replied(0)) => {
                r.phase = Phase::Completing;
                r.net = Some((Req::Complete(i), Stage::Sent));
                self.answer(i);
                log.say(|| format!("{}: committed its work, completes the record", name(i)));
            }
            // `look` (`Ok(Some(found))`) and `settle_commit`
            // (`CommitOutcome::Found`): the record is completed with the
            // result found, which is the answer.
            (_, Stage::Replied(code)) => {
                let owner = code - FOUND;
                r.phase = Phase::Completing;
                r.net = Some((Req::Complete(owner), Stage::Sent));
                if req == Req::Look {
                    self.look_found = true;
                } else {
                    self.commit_found = true;
                }
                self.answer(owner);
                log.say(|| {
                    format!(
                        "{}: {}'s work committed, completes the record with its result",
                        name(i),
                        name(owner)
                    )
                });
            }
            (_, Stage::Sent) => unreachable!("answered"),
        }
    }

    /// Request `i`'s handler starts.
    pub(super) fn start_handler(&mut self, i: u8) {
        let r = &mut self.requests[i as usize];
        r.phase = Phase::Running;
        self.ran_after_commit |= r.claimed_after_commit;
    }

    /// A request answers with `owner`'s result.
    pub(super) fn answer(&mut self, owner: u8) {
        self.answered_uncommitted |= self.committed != Some(owner);
    }
}
