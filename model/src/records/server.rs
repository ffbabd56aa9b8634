//! The server's side of the records model: what the claim's `SET NX` and
//! each script do to the record, one atomic step each.

use super::{Phase, Record, Req, State};

impl State {
    /// The server runs request `i`'s `req` at `now`: its answer (for the
    /// `SET NX`, 0 when it set the key and 1 when it found it taken; for a
    /// script, the code it returns).
    pub(super) fn exec(&mut self, i: u8, req: Req, now: u8, lease: u8) -> u8 {
        match req {
            // `SET .. NX PX`: 0 for OK (set), 1 for nil (taken).
            Req::SetNx => match self.record {
                None => {
                    self.claim_for(i, now + lease);
                    0
                }
                Some(_) => 1,
            },
            Req::Claim => match self.record {
                // idempotency_claim.lua, "Gone since the SET found it"
                None => {
                    self.claim_for(i, now + lease);
                    0
                }
                // idempotency_claim.lua, "Our own earlier claim whose reply was lost"
                Some(r) if !r.done && r.owner == i => {
                    self.record = Some(Record {
                        expires: now + lease,
                        ..r
                    });
                    0
                }
                // Another's claim, busy:
                // idempotency_claim.lua, "return {1, ttl, ''}" (the waiter's
                // mark before it, idempotency_claim.lua, "'KEEPTTL'", is not
                // modelled)
                Some(r) if !r.done => 1,
                // idempotency_claim.lua, "return {2, 0, v}"
                Some(_) => 2,
            },
            Req::Complete(result) => match self.record {
                // Our response already stored by an earlier try:
                // idempotency_settle.lua, "== 'done' .. tail .. ':'"
                Some(r) if r.done && r.owner == i => 1,
                // Ours, as written or marked waited on:
                //   idempotency_settle.lua, "Our claim as written"
                //   idempotency_settle.lua, "waited = v == 'waited' .. tail"
                // stored:
                //   idempotency_settle.lua, "'SET', KEYS[1], ARGV[4], 'PX', ARGV[3]"
                // and announced if marked (it wakes marked waiting duplicates;
                // they are not modelled, and the notice changes no state):
                //   idempotency_settle.lua, "pcall: a notice refused by an ACL"
                Some(Record {
                    done: false, owner, ..
                }) if owner == i => {
                    self.record = Some(Record {
                        done: true,
                        owner: i,
                        result,
                        expires: u8::MAX,
                    });
                    self.done_ever = true;
                    1
                }
                // Nothing there: idempotency_settle.lua, "storing and not v"
                None => {
                    if self.done_ever {
                        // Only retention could have removed it.
                        self.done_overwritten = true;
                    }
                    self.record = Some(Record {
                        done: true,
                        owner: i,
                        result,
                        expires: u8::MAX,
                    });
                    self.done_ever = true;
                    1
                }
                // Another request's: idempotency_settle.lua, "return 0"
                Some(_) => 0,
            },
            Req::Release => match self.record {
                // Ours, as for a completion, then deleted (and announced
                // if marked, as for completions):
                //   idempotency_settle.lua, "redis.call('DEL', KEYS[1])"
                Some(r) if !r.done && r.owner == i => {
                    self.record = None;
                    1
                }
                _ => 0,
            },
            // (A commit on the lock server is `State::commit_record`.)
            Req::Look | Req::Commit => unreachable!("a call to the commit store: {req:?}"),
        }
    }

    /// Request `i`'s part of idempotency_renew_many.lua, "for i = 1, #KEYS do",
    /// re-arming until `expires`: whether the record is still its own.
    pub(super) fn renew(&mut self, i: u8, expires: u8) -> bool {
        let ok = matches!(self.record, Some(r) if r.owner == i);
        if let Some(r) = &mut self.record
            && ok
            && !r.done
        {
            r.expires = expires;
        }
        ok
    }

    /// Request `i` takes the absent record until `expires` (the `SET NX`, or
    /// the claim script's absent path), with the ghosts' checks.
    fn claim_for(&mut self, i: u8, expires: u8) {
        self.record = Some(Record {
            done: false,
            owner: i,
            result: i,
            expires,
        });
        let r = &mut self.requests[i as usize];
        r.claimed_after_commit = self.committed.is_some();
        r.expired = false; // a live record again
        let others_live = self
            .requests
            .iter()
            .enumerate()
            .any(|(j, o)| j != i as usize && o.phase == Phase::Running && !o.expired);
        // (`claimed_after_commit` is read when the handler starts: a claim
        // whose look finds the work never starts it.)
        self.ran_twice |= others_live;
        self.ran_after_done |= self.done_ever;
    }
}
