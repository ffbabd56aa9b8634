//! Read-write locks and semaphores: shared.lua on one Redis server, under
//! the client of [`crate::lock`].
//!
//! The client's steps are the mutex's (client/acquire.rs is one
//! `Acquisition` for every `Kind`: attempt, busy, register, wait for a grant or the lease timer, confirm or
//! trust the hand-over, hold under the watchdog, release; give up leaving
//! the queue), so this module adds the server and the properties, and the
//! lock model runs them when [`LockConfig::shared`](crate::lock::LockConfig::shared) is set:
//!
//! * [`Holders`]: the writer (`KEYS[1]`), the holders' sorted set by lease
//!   end (`KEYS[2]`) and the FIFO queue of `token:lease:mode:limit` entries
//!   (`KEYS[3]`) with the ends of their waits (`KEYS[6]`: an entry whose
//!   wait is over is skipped, as a mutex's); the fencing counter is the
//!   slot's, [`Server::fence`]. Its
//!   methods are shared.lua's `acquire`, `release`, `extend` and `mint`,
//!   line by line; `promote` grants from the head of the queue with the
//!   hand-over lease cap, a token and a notice for each waiter (any of
//!   which may be lost); a newcomer that finds room takes a lease without
//!   a token, minted on first use by `mint`, which checks the lease first.
//! * The properties: no writer with another valid holder (a read-write
//!   lock) or no more valid holders than the limit (a semaphore), counting
//!   the holders that believe their leases valid, as the mutex's mutual
//!   exclusion does; the same on the server; strict FIFO (no grant
//!   overtakes a waiter still queued); without faults, a waiter that fits
//!   at the head of the queue is granted within a lease (room freed by an
//!   expiry or a waiter leaving is promoted only at the next script call);
//!   and the mutex's own properties
//!   (fencing tokens, the fenced store for writers, queue entries, release
//!   answers, termination).
//!
//! What the model leaves out: callers that name different counts for one
//! semaphore (each entry is granted by its own; its clients share one,
//! and tests/tests/shared_waits.rs mixes them), a process of several clients (shared locks
//! form no in-process line, `LockRequest::acquire`, so the grants a script answers
//! wake only waiters of the caller's own process, `wake_granted`, which is
//! nobody here: every client has a process of its own), reentrancy, and
//! replica acks.
//!
//! [`Server::fence`]: crate::lock::Server::fence

use std::fmt::Write as _;

use crate::reply::{AcqReply, name};

/// What a client asks for (`mode` in shared.rs).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Mode {
    /// A reader: shared (`s`), no limit.
    Read,
    /// A writer: exclusive (`x`).
    Write,
    /// A semaphore's permit: shared (`s`), at most [`SharedConfig::limit`].
    Permit,
}

/// A read-write lock or a semaphore ([`LockConfig::shared`](crate::lock::LockConfig::shared)).
#[derive(Clone, Debug)]
pub struct SharedConfig {
    /// One entry per client.
    pub modes: Vec<Mode>,
    /// `ARGV[5]`: the most shared holders (`0`: no limit, a read-write lock).
    pub limit: u8,
    /// Test only, a broken script: a newcomer that fits is admitted even
    /// while somebody is queued (the test that the queue is `empty` left
    /// out of shared.lua, "A newcomer, only when nobody is queued."). The
    /// model must find the waiter it overtakes.
    pub admit_past_queue: bool,
}

/// A lease: a writer's key or a member of the holders' set.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Lease {
    /// The owner's token.
    pub token: u8,
    /// Gone once the clock reaches this (the key's `PX`, the member's score).
    pub expires: u8,
    /// The fencing token it was granted or minted, `0` while it has none
    /// (a shared holder's is kept in the `KEYS[5]` hash, told again to a
    /// holder that asks once more).
    pub fence: u8,
}

/// A queue entry `token:lease_ms:mode:limit` (shared.lua, "'token:lease_ms:mode:limit' entries"),
/// with its score in the queue's deadlines (`KEYS[6]`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Waiting {
    /// The waiter's token.
    pub token: u8,
    /// The lease it asked for.
    pub lease: u8,
    /// Mode `x`.
    pub exclusive: bool,
    /// Its own most shared holders (`ARGV[5]` when it queued): it is
    /// granted by this, not by the count of the caller that makes room.
    pub limit: u8,
    /// The end of its wait (`ZADD` of server time + `ARGV[9]`, at every
    /// attempt that queues): from this tick on, promote skips it.
    pub until: u8,
}

impl Waiting {
    /// The same member of the queue (the deadline is not part of it).
    fn is(&self, other: &Waiting) -> bool {
        (self.token, self.lease, self.exclusive, self.limit)
            == (other.token, other.lease, other.exclusive, other.limit)
    }

    /// Its wait has not ended at `now` (the script's `ends > now`).
    pub fn waiting_at(&self, now: u8) -> bool {
        now < self.until
    }
}

/// A read-write lock's or a semaphore's names on the server.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub struct Holders {
    /// `KEYS[1]`, the writer.
    pub writer: Option<Lease>,
    /// `KEYS[2]`, the shared holders, by token (a set).
    pub holders: Vec<Lease>,
    /// `KEYS[3]`, the queue, first first (gone when empty).
    pub queue: Vec<Waiting>,
    /// The queue's expiry (meaningless while it is empty).
    pub queue_expires: u8,
}

/// How the script runs: as shared.lua does, or with one of the mistakes
/// the model must catch.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Script {
    /// Skips the queue's entries whose wait has ended (shared.lua does).
    pub(crate) skip_ended: bool,
    /// Admits a newcomer that fits while somebody is queued (shared.lua
    /// does not).
    pub(crate) admit_past_queue: bool,
}

/// One script call's arguments.
pub(crate) struct Call {
    pub(crate) now: u8,
    /// `ARGV[2]`
    pub(crate) token: u8,
    /// `ARGV[3]`
    pub(crate) lease: u8,
    /// `ARGV[4] == 'x'`
    pub(crate) exclusive: bool,
    /// `ARGV[5]`
    pub(crate) limit: u8,
    /// `ARGV[7]`, the hand-over lease cap.
    pub(crate) cap: u8,
}

impl Call {
    /// The caller's queue entry, waiting `wait` more ticks.
    fn entry(&self, wait: u8) -> Waiting {
        Waiting {
            token: self.token,
            lease: self.lease,
            exclusive: self.exclusive,
            limit: self.limit,
            until: self.now + wait,
        }
    }
}

/// Every lease a call took, in order: token, fencing (`0`: a newcomer's,
/// none minted).
pub(crate) type Taken = Vec<(u8, u8)>;

impl Holders {
    /// The clock reaches `now`: the writer's key, holders' leases and the
    /// queue that ended go (the `PX` and `PEXPIRE`s, and the purge that
    /// every step reading the holders runs first,
    /// shared.lua, "local function purge()", or reads only what no ended
    /// lease can be in: an empty set, or a score compared with the clock,
    /// shared.lua, "A lease that ended is gone all the same"). The owners
    /// whose leases ended.
    pub(crate) fn expire(&mut self, now: u8) -> Vec<u8> {
        let mut ended = Vec::new();
        if let Some(w) = self.writer
            && w.expires <= now
        {
            self.writer = None;
            ended.push(w.token);
        }
        self.holders.retain(|h| {
            let gone = h.expires <= now;
            if gone {
                ended.push(h.token);
            }
            !gone
        });
        if !self.queue.is_empty() && self.queue_expires <= now {
            self.queue.clear();
        }
        ended
    }

    /// Somebody holds it.
    pub fn held(&self) -> bool {
        self.writer.is_some() || !self.holders.is_empty()
    }

    /// `token` holds it, as the writer or a shared holder.
    pub fn owns(&self, token: u8) -> bool {
        self.writer.is_some_and(|w| w.token == token)
            || self.holders.iter().any(|h| h.token == token)
    }

    /// shared.lua, "local function ours()".
    fn ours(&self, token: u8, exclusive: bool) -> bool {
        if exclusive {
            self.writer.is_some_and(|w| w.token == token)
        } else {
            self.holders.iter().any(|h| h.token == token)
        }
    }

    /// shared.lua, "local function room(m, most)" (whether it fits; the script
    /// also answers how many hold, for the set's expiry).
    pub(crate) fn fits(&self, exclusive: bool, limit: u8) -> bool {
        if self.writer.is_some() {
            return false;
        }
        let held = self.holders.len();
        if exclusive {
            held == 0
        } else {
            limit == 0 || held < limit as usize
        }
    }

    /// shared.lua, "local function hold_shared(who, ms, alone)": `ZADD` (the
    /// set's own `PEXPIRE` keeps it as long as its longest lease: members
    /// end one by one here); a holder already in the set keeps its token.
    fn hold_shared(&mut self, who: u8, until: u8, fence: u8) {
        match self.holders.iter_mut().find(|h| h.token == who) {
            Some(h) => h.expires = until,
            None => {
                self.holders.push(Lease {
                    token: who,
                    expires: until,
                    fence,
                });
                self.holders.sort_by_key(|h| h.token);
            }
        }
    }

    /// shared.lua, "local function take(who, m, ms, held)": a lease without
    /// a token (a writer's key is set anew).
    fn take(&mut self, who: u8, exclusive: bool, until: u8) {
        if exclusive {
            self.writer = Some(Lease {
                token: who,
                expires: until,
                fence: 0,
            });
        } else {
            self.hold_shared(who, until, 0);
        }
    }

    /// shared.lua, "local function minted(who, m)": `INCR`, the token kept
    /// with `who`'s lease.
    fn minted(&mut self, fence: &mut u8, who: u8, exclusive: bool) -> u8 {
        *fence += 1;
        let lease = if exclusive {
            self.writer.as_mut()
        } else {
            self.holders.iter_mut().find(|h| h.token == who)
        };
        if let Some(lease) = lease {
            lease.fence = *fence;
        }
        *fence
    }

    /// shared.lua, "local function promote(granted)": the head of the queue
    /// while it fits, each by its own limit, with a lease capped at the
    /// hand-over cap and its token; a writer alone; an entry whose wait has
    /// ended is skipped (the caller's own waits on). Whether the queue is
    /// empty now, and the token of the caller's own grant (`0`: none).
    /// Without `skip_ended` (a mistake the model must catch) no entry is
    /// skipped.
    fn promote(
        &mut self,
        call: &Call,
        fence: &mut u8,
        taken: &mut Taken,
        skip_ended: bool,
    ) -> (bool, u8) {
        let mut own = 0;
        while let Some(&head) = self.queue.first() {
            if skip_ended && !head.waiting_at(call.now) && head.token != call.token {
                self.queue.remove(0);
                continue;
            }
            let lease = head.lease.min(call.cap);
            if !self.fits(head.exclusive, head.limit) {
                return (false, own);
            }
            self.queue.remove(0);
            self.take(head.token, head.exclusive, call.now + lease);
            let f = self.minted(fence, head.token, head.exclusive);
            taken.push((head.token, f));
            if head.token == call.token {
                own = f;
            }
            if head.exclusive {
                break;
            }
        }
        (self.queue.is_empty(), own)
    }

    /// Re-armed to the full lease: shared.lua, "local function rearm_shared()";
    /// and shared.lua, "Held already (granted just now".
    fn rearm(&mut self, call: &Call) {
        if call.exclusive {
            if let Some(w) = &mut self.writer {
                w.expires = call.now + call.lease;
            }
        } else {
            self.hold_shared(call.token, call.now + call.lease, 0);
        }
    }

    /// shared.lua, "acquire: grant whoever waits at the head first" to the
    /// script's end, with a wait of `wait` (`0`: try once). `Granted(0)`:
    /// held without a token (see [`Holders::mint`]).
    pub(crate) fn acquire(
        &mut self,
        call: &Call,
        wait: u8,
        fence: &mut u8,
        script: Script,
    ) -> (AcqReply, Taken) {
        let mut taken = Taken::new();
        // shared.lua, "acquire: grant whoever waits at the head first".
        let (empty, own) = self.promote(call, fence, &mut taken, script.skip_ended);
        let past_queue = script.admit_past_queue;
        // shared.lua, "A newcomer, only when nobody is queued.": a lease
        // without a token (a re-sent attempt already among the holders is
        // refreshed, its token kept on the server, not told).
        if (empty || past_queue) && self.fits(call.exclusive, call.limit) {
            let until = call.now + call.lease;
            self.take(call.token, call.exclusive, until);
            taken.push((call.token, 0));
            return (AcqReply::Granted(own), taken);
        }
        // shared.lua, "Held already (granted just now": the full lease, and
        // the token issued to it (`0`: none yet).
        if self.ours(call.token, call.exclusive) {
            self.rearm(call);
            let own = match self.holders.iter().find(|h| h.token == call.token) {
                Some(h) if !call.exclusive => h.fence,
                _ => own,
            };
            return (AcqReply::Granted(own), taken);
        }
        // shared.lua, "Busy until the earliest lease that could make room ends."
        let mut remaining = self.writer.map_or(call.lease, |w| w.expires - call.now);
        if let Some(first) = self.holders.iter().map(|h| h.expires).min() {
            remaining = remaining.min((first - call.now).max(1));
        }
        let mut counter = 0;
        if wait != 0 {
            // shared.lua, "if not redis.call('LPOS', KEYS[3], entry) then":
            // queue once, the end of the wait scored anew; the queue
            // outlives the wait plus a lease; the counter as this attempt
            // saw it.
            let entry = call.entry(wait);
            match self.queue.iter_mut().find(|e| e.is(&entry)) {
                Some(queued) => queued.until = entry.until,
                None => {
                    if self.queue.is_empty() {
                        self.queue_expires = 0;
                    }
                    self.queue.push(entry);
                }
            }
            let keep = wait + call.lease;
            if self.queue_expires.saturating_sub(call.now) < keep {
                self.queue_expires = call.now + keep;
            }
            counter = *fence;
        }
        (
            AcqReply::Busy {
                remaining,
                fence: counter,
            },
            taken,
        )
    }

    /// shared.lua, "released = 0" to "local out = {released}": leave the
    /// queue if asked, free our place if ours, and promote either way (the
    /// entry that left may have made room; with nobody queued there is
    /// nothing to promote, and the script answers at once). `(ours,
    /// grants)`.
    pub(crate) fn release(
        &mut self,
        call: &Call,
        dequeue: bool,
        fence: &mut u8,
        script: Script,
    ) -> (bool, Taken) {
        let mut taken = Taken::new();
        let entry = call.entry(0);
        if dequeue && let Some(i) = self.queue.iter().position(|e| e.is(&entry)) {
            self.queue.remove(i);
        }
        let ours = self.ours(call.token, call.exclusive);
        if ours {
            if call.exclusive {
                self.writer = None;
            } else {
                self.holders.retain(|h| h.token != call.token);
            }
        }
        // Also when not ours: the entry that left may have made room.
        self.promote(call, fence, &mut taken, script.skip_ended);
        (ours, taken)
    }

    /// shared.lua, "if op == 'mint' then": the caller's token, minted now
    /// while its lease is live, else `0`. Without `checks_owner` (a mistake
    /// the model must catch) every call mints.
    pub(crate) fn mint(&mut self, call: &Call, fence: &mut u8, checks_owner: bool) -> u8 {
        if !self.ours(call.token, call.exclusive) && checks_owner {
            return 0;
        }
        self.minted(fence, call.token, call.exclusive)
    }

    /// shared.lua, "if op == 'extend' or op == 'mint' then".
    pub(crate) fn extend(&mut self, call: &Call) -> bool {
        if !self.ours(call.token, call.exclusive) {
            return false;
        }
        self.rearm(call);
        true
    }

    /// For traces: `writer B until t=5, holders [A until t=4], queue [C(s)]`.
    pub(crate) fn summary(&self) -> String {
        let mut out = match self.writer {
            Some(w) => format!("writer {} until t={}", name(w.token), w.expires),
            None => "no writer".to_string(),
        };
        let holders: Vec<String> = self
            .holders
            .iter()
            .map(|h| format!("{} until t={}", name(h.token), h.expires))
            .collect();
        let _ = write!(out, ", holders [{}]", holders.join(", "));
        if !self.queue.is_empty() {
            let q: Vec<String> = self
                .queue
                .iter()
                .map(|e| format!("{}({})", name(e.token), if e.exclusive { "x" } else { "s" }))
                .collect();
            let _ = write!(
                out,
                ", queue [{}] until t={}",
                q.join(", "),
                self.queue_expires
            );
        }
        out
    }
}

/// Ghost variables of a read-write lock's or a semaphore's properties.
#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq)]
pub struct SharedGhost {
    /// A lease was taken while a waiter queued ahead of its taker (or
    /// queued at all, for a taker that was not) stayed queued.
    pub overtaken: bool,
    /// A script granted a queued waiter other than its caller.
    pub promoted: bool,
    /// A shared entry queued behind a writer's.
    pub behind_writer: bool,
    /// The head of the queue has fitted since this tick, ungranted.
    pub head_fits_since: Option<u8>,
}
