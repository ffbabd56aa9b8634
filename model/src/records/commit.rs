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
//!
//! On the lock server (`commit_on_lock_server`,
//! [`StoreConfig::LOCK_SERVER`]) the record is its own committed copy: the
//! commit is a call to the lock server (idempotency_commit_record.lua,
//! `State::commit_record`) that writes nothing when it finds the record
//! completed (anybody's: that result is the answer) and otherwise runs the
//! work's writes and completes the record with our result, whether the
//! record is our claim, another claimer's, or gone with our lease. There is
//! no look before a handler runs (a claim that finds the record completed
//! replays it, as without a store) and no completion after the commit (the
//! commit completed the record); a commit that fails (or whose reply is
//! lost) releases the claim, which leaves a completed record alone.

use stateright::Property;

use super::{Phase, Record, RecordsModel, Req, Stage, State};
use crate::check::{self, Log};
use crate::reply::name;

/// What the commit store does ([`RecordsConfig::store`](super::RecordsConfig::store)).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct StoreConfig {
    /// The store is the lock server itself (`commit_on_lock_server`): the
    /// record is the committed copy, the commit completes it, and nothing
    /// is looked for before a handler runs (`look` is `false`).
    pub on_lock_server: bool,
    /// A claimed request looks for the committed copy before its handler
    /// runs (`false`: on the lock server, where there is no look; else a
    /// mistake, for the check that shows the look matters).
    pub look: bool,
    /// A commit writes nothing when a copy is there (the script's first
    /// step, see `State::exec_store`; on the lock server, when the record is
    /// completed, see `State::commit_record`; `false`: a mistake, for the
    /// check that shows it matters).
    pub commit_checks: bool,
}

impl StoreConfig {
    /// The store as the library uses it (`commit_with_redis`,
    /// `commit_with_postgres`: a store apart from the lock server).
    pub const TODAY: Self = Self {
        on_lock_server: false,
        look: true,
        commit_checks: true,
    };

    /// The lock server as the store (`commit_on_lock_server`), as the
    /// library uses it.
    pub const LOCK_SERVER: Self = Self {
        on_lock_server: true,
        look: false,
        commit_checks: true,
    };
}

/// An answer that names the committed copy found (`FOUND + owner`); 0: none
/// there (the look), or ours written (the commit).
const FOUND: u8 = 16;

/// The properties a commit store adds.
pub(super) fn properties(store: StoreConfig) -> Vec<Property<RecordsModel>> {
    let mut properties = Vec::from(check::never_set![RecordsModel;
        "the work commits once per key" => committed_twice,
        "a handler never runs once its key's work committed before its claim" => ran_after_commit,
        "every request answered with a result answers the committed one" => answered_uncommitted,
    ]);
    // (Without a look, nothing is found before a handler runs.)
    if store.look {
        properties.push(Property::sometimes(
            "a claim finds the work committed by a claimer that did not complete its record",
            |_: &RecordsModel, s: &State| s.look_found,
        ));
    }
    properties.push(Property::sometimes(
        "a commit finds another claimer's work committed first",
        |_: &RecordsModel, s: &State| s.commit_found,
    ));
    if store.on_lock_server {
        properties.push(Property::sometimes(
            "a commit completes a record that was another claimer's claim or gone with its lease",
            |_: &RecordsModel, s: &State| s.commit_took_over,
        ));
    }
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

    /// The lock server runs request `i`'s commit on the record itself
    /// (idempotency_commit_record.lua, the store on the lock server): 0 when
    /// the work's writes ran and the record now holds our result, or
    /// `FOUND + result` of the completed record found there.
    pub(super) fn commit_record(&mut self, i: u8, store: StoreConfig) -> u8 {
        match self.record {
            // idempotency_commit_record.lua, "return {0, v}": a completed
            // record (anybody's) is the committed copy; nothing is written.
            Some(r) if r.done && store.commit_checks => FOUND + r.result,
            // Our claim, another claimer's (ours ran out and was taken), or
            // none (ours ran out): the work's writes, then the record
            // completed with our result,
            //   idempotency_commit_record.lua, "replies[c] = redis.call(unpack(argv))"
            //   idempotency_commit_record.lua, "redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[2])"
            // and announced if marked waited (the mark and its notice are
            // not modelled: they change no state):
            //   idempotency_commit_record.lua, "redis.pcall(string.sub(ARGV[1], 1, space - 1)"
            // (A command that fails leaves the record as it was and answers
            // an error, the model's lost commit, which releases the claim:
            //   idempotency_commit_record.lua, "Last: a command that fails")
            before => {
                self.committed_twice |= self.committed.is_some();
                self.committed = Some(i);
                self.commit_took_over |= before.is_none_or(|r| r.owner != i);
                // (Only the mistake writes over a completed record.)
                self.done_overwritten |= match before {
                    Some(r) => r.done && r.owner != i,
                    None => self.done_ever,
                };
                self.record = Some(Record {
                    done: true,
                    owner: i,
                    result: i,
                    expires: u8::MAX,
                });
                self.done_ever = true;
                0
            }
        }
    }

    /// Request `i` reads the answer to `req` (`Look` or `Commit`) from the
    /// commit `store` (or the lock server, when it is the store).
    pub(super) fn receive_from_store(
        &mut self,
        i: u8,
        req: Req,
        stage: Stage,
        store: StoreConfig,
        log: &mut Log,
    ) {
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
            // On the lock server, `settle_commit`: `CommitOutcome::Completed`,
            // the record holds our result: nothing to complete.
            (Req::Commit, Stage::Replied(0)) if store.on_lock_server => {
                r.phase = Phase::Done;
                self.answer(i);
                log.say(|| format!("{}: committed its work, the record completed", name(i)));
            }
            // `settle_commit`: `CommitOutcome::Committed`, the record is
            // completed with our result.
            (Req::Commit, Stage::Replied(0)) => {
                r.phase = Phase::Completing;
                r.net = Some((Req::Complete(i), Stage::Sent));
                self.answer(i);
                log.say(|| format!("{}: committed its work, completes the record", name(i)));
            }
            // On the lock server, `settle_commit`: `CommitOutcome::Found`
            // (`Completed` when ours): the record holds the result found,
            // which is the answer; nothing to complete.
            (Req::Commit, Stage::Replied(code)) if store.on_lock_server => {
                let owner = code - FOUND;
                r.phase = Phase::Done;
                self.commit_found |= owner != i;
                self.answer(owner);
                log.say(|| {
                    format!(
                        "{}: {}'s work committed, answers its result",
                        name(i),
                        name(owner)
                    )
                });
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
