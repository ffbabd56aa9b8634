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
                // idempotency_claim.lua:37-41: gone since the SET
                None => {
                    self.claim_for(i, now + lease);
                    0
                }
                // idempotency_claim.lua:59-63: our own claim again
                Some(r) if !r.done && r.owner == i => {
                    self.record = Some(Record {
                        expires: now + lease,
                        ..r
                    });
                    0
                }
                // idempotency_claim.lua:64-69 (64-66: a waiter's mark)
                Some(r) if !r.done => 1,
                // idempotency_claim.lua:53-55
                Some(_) => 2,
            },
            Req::Complete => match self.record {
                // idempotency_settle.lua:27-32
                Some(r) if r.done && r.owner == i => 1,
                // idempotency_settle.lua:25 (the claim as written)
                // or 33-34 (marked waited on), then 36-38 (and 42-47:
                // the completion's notice, which wakes marked waiting
                // duplicates; they are not modelled, and the notice
                // changes no state)
                Some(Record {
                    done: false, owner, ..
                }) if owner == i => {
                    self.record = Some(Record {
                        done: true,
                        owner: i,
                        expires: u8::MAX,
                    });
                    self.done_ever = true;
                    1
                }
                // idempotency_settle.lua:36-38 (nothing there)
                None => {
                    if self.done_ever {
                        // Only retention could have removed it.
                        self.done_overwritten = true;
                    }
                    self.record = Some(Record {
                        done: true,
                        owner: i,
                        expires: u8::MAX,
                    });
                    self.done_ever = true;
                    1
                }
                // idempotency_settle.lua:50
                Some(_) => 0,
            },
            Req::Release => match self.record {
                // idempotency_settle.lua:25 or 33-34, then 36-40
                // (42-47: the notice, as for completions)
                Some(r) if !r.done && r.owner == i => {
                    self.record = None;
                    1
                }
                _ => 0,
            },
        }
    }

    /// Request `i`'s part of idempotency_renew_many.lua:16-24,
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
            expires,
        });
        let others_live = self
            .requests
            .iter()
            .enumerate()
            .any(|(j, o)| j != i as usize && o.phase == Phase::Running && !o.expired);
        self.ran_twice |= others_live;
        self.ran_after_done |= self.done_ever;
    }
}
