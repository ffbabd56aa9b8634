//! The lock protocol on one Redis server, as implemented: the acquire,
//! extend and release scripts (waiter queue, `+` mark, hand-over leases,
//! notices, the slot's fencing counter), the client's acquire steps (with
//! the stale hand-over rule of `fence_seen`), its watchdog and its release,
//! with a model clock and faults.
//!
//! Each transition that mirrors code cites it, by name where it was last
//! touched (`Server::acquire` follows acquire.lua step by step; line
//! numbers go stale), by lines elsewhere (`acquire.rs:157-212`).
//!
//! Time is a small integer clock: a tick is longer than a round trip, so a
//! step that takes one round trip (a script call and its answer, a notice)
//! happens before the next tick unless a fault delays it (a paused client
//! does nothing until it resumes; a lost request, reply or notice never
//! arrives). This is "urgency": [`Action::Tick`] is enabled only when no
//! client has a step to take now. Durations are in ticks: with
//! the defaults a lease is 3 ticks, a hand-over lease 2 and the watchdog
//! renews every tick (`ttl / 3`).
//!
//! One key; each client runs one acquisition (one token), in a process of
//! its own or as a task of a process it shares with other clients
//! ([`LockConfig::process`]). Tokens are the clients' indices: a fresh
//! 128-bit token per acquisition is unique, which is all the scripts rely
//! on.
//!
//! Tasks of one process form its line (local hand-over, client/local.rs):
//! one acquires on the server for the line, the others wait in-process; a
//! holder's release hands its lease (owner token, validity, watchdog entry
//! with any renewal in flight) to the next task in line, with a fencing
//! token from a block it reserved with reserve.lua (`Server::reserve`), or
//! releases to the server when reserve.lua answers 0 or fails, or its lease
//! is not sure. The model leaves out the block reserved ahead (`prefetch`)
//! and `BLOCK_FOR` (a block is used until it runs out: more runs than the
//! client has), and the cancellation paths of a waiter (a dropped
//! `Ticket`); a crash or a pause is the whole process's.
//!
//! The fencing counter ([`Server::fence`]) stands for the counter of the
//! key's hash slot (`prefix S{tag}`, `KEYS[2]`), which every key of the slot
//! shares: other keys' acquisitions and hand-overs raise it too
//! ([`Action::OtherKey`], within [`LockConfig::other_keys`]), so the tokens
//! of this key strictly increase with gaps.
//!
//! Waiting is FIFO also when a lease runs out (a holder that crashed or
//! stopped): acquire.lua's free path gives a key with a line behind it to
//! the first entry whose wait has not ended, as release.lua hands it, and
//! both scripts skip entries whose wait has ended (each entry carries its
//! end, [`Entry::until`], the queue's deadlines set `KEYS[4]`). Ghost state
//! checks every grant of the key by a script (acquire, either hand-over,
//! reserve.lua keeping it for the owner's process) against the queue as it
//! stood: no live waiter that joined before the new owner (or at all, if it
//! never queued) is passed over, and no hand-over goes to an entry whose
//! wait is over (a crashed waiter cannot stall the line past its wait).
//! [`LockConfig::fifo_on_expiry`] and [`LockConfig::skip_ended_waits`]
//! switch back to the scripts before commit 7dbf470, for the tests that
//! show the model finds what they did.

use std::fmt::Write as _;

use stateright::{Model, Property};

use crate::check::never_set;
use crate::check::{self, Log, Narrate};
pub use crate::reply::{AcqReply, name};
use crate::shared::{self, Call, Holders, Mode, SharedConfig, SharedGhost, Taken};

/// Fault budgets: how many of each a run may inject.
#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq)]
pub struct Faults {
    /// A client process dies (its in-flight requests may still run).
    pub crash: u8,
    /// A client process stops for [`LockConfig::pause_len`] ticks (GC,
    /// `SIGSTOP`): nothing of it runs, its replies and notices wait.
    pub pause: u8,
    /// A request is lost before Redis runs it (a killed connection).
    pub lost_request: u8,
    /// A reply is lost after Redis ran the request (a killed connection).
    pub lost_reply: u8,
    /// A release notice never arrives (pub/sub is at most once).
    pub lost_notice: u8,
    /// At most this many faults in one run, of all kinds together.
    pub total: u8,
}

impl Faults {
    /// No faults.
    pub const NONE: Faults = Faults {
        crash: 0,
        pause: 0,
        lost_request: 0,
        lost_reply: 0,
        lost_notice: 0,
        total: 0,
    };

    /// Every kind allowed once, at most `total` in one run.
    pub const fn each_once(total: u8) -> Faults {
        Faults {
            crash: 1,
            pause: 1,
            lost_request: 1,
            lost_reply: 1,
            lost_notice: 1,
            total,
        }
    }
}

/// A configuration of the lock model.
#[derive(Clone, Debug)]
pub struct LockConfig {
    /// One entry per client: how long it waits, in ticks (`0`: try once).
    pub waits: Vec<u8>,
    /// The lease asked for (`ttl`), in ticks.
    pub ttl: u8,
    /// `HANDOFF_LEASE` (`backend/mod.rs:24`), in ticks.
    pub handoff: u8,
    /// A holder releases at most this many ticks after it acquired.
    pub hold_max: u8,
    /// Clients start their acquire at some tick up to this one.
    pub start_by: u8,
    /// How long a pause lasts, in ticks (more than a lease).
    pub pause_len: u8,
    /// Fault budgets.
    pub faults: Faults,
    /// `false`: today's `confirm` (acquire.rs:271-276) trusts a hand-over
    /// without a round trip while a third of it is left, counted from the
    /// last busy attempt. `true`: every hand-over is confirmed with
    /// extend.lua (the other fix of the stale hand-over, FAULTS.md).
    pub confirm_every_handoff: bool,
    /// `true`: today's client (commit 18d4a5a): `wait_for_turn` ignores a
    /// grant whose token is at most the counter a busy attempt saw
    /// (`fence_seen`, acquire.rs:185-188 and 228-235, 246-251). `false`: the
    /// client before that fix, which trusts every grant (the stale hand-over
    /// of FAULTS.md).
    pub check_stale_grants: bool,
    /// How many times other keys of the slot may take a fencing token (an
    /// `INCR` of the shared counter) during a run.
    pub other_keys: u8,
    /// `true`: today's acquire.lua: a key found free with a line behind it
    /// (a lease ran out) goes to the first live entry of the line, and the
    /// caller is busy unless it is that entry. `false`: the script before
    /// commit 7dbf470, a bare `SET NX` that never looks at the queue (then
    /// it removed the caller's own entry, which the client of then asked
    /// for after an attempt with a wait): whoever tries first after an
    /// expiry takes the key. The model must find the overtaking.
    pub fifo_on_expiry: bool,
    /// `true`: today's scripts skip queue entries whose wait has ended
    /// (the queue's deadlines, `KEYS[4]`). `false`: every entry is handed
    /// the key in turn, as before commit 7dbf470: a waiter that crashed in
    /// line holds the line up past its wait, for a hand-over lease.
    pub skip_ended_waits: bool,
    /// The process of each client: clients of one process are tasks of one
    /// `LockClient` that want the key with the same settings, so they form
    /// its in-process line (local hand-over, client/local.rs). Distinct
    /// by default: every client its own process, no line.
    pub process: Vec<u8>,
    /// `BLOCK` (local.rs:46; 8 there): fencing tokens reserve.lua reserves at once.
    pub block: u8,
    /// Test only, a broken client: a local hand-over passes the token just
    /// below the reserved block (the last one issued before it) instead of
    /// the block's first (local.rs:478). The model must find it.
    pub hand_on_below_block: bool,
    /// `Some`: a read-write lock or a semaphore (shared.lua, see
    /// [`crate::shared`]) instead of a mutex.
    pub shared: Option<SharedConfig>,
}

impl LockConfig {
    /// `clients` clients that all wait `wait` ticks, the default lease and
    /// hand-over, and the given faults.
    pub fn new(clients: usize, wait: u8, faults: Faults) -> Self {
        Self {
            waits: vec![wait; clients],
            ttl: 3,
            handoff: 2,
            hold_max: 2,
            start_by: 1,
            pause_len: 4,
            faults,
            confirm_every_handoff: false,
            check_stale_grants: true,
            other_keys: 0,
            fifo_on_expiry: true,
            skip_ended_waits: true,
            process: (0..clients as u8).collect(),
            block: 2,
            hand_on_below_block: false,
            shared: None,
        }
    }

    /// Client `c` shares its process with another: it takes part in a line
    /// (local.rs `Local::enter`). A process of one task has a line of one,
    /// which never hands on: the model leaves it out.
    pub fn in_line(&self, c: u8) -> bool {
        let p = self.process[c as usize];
        self.process.iter().filter(|&&q| q == p).count() > 1
    }

    /// The clients of `c`'s process (`c` among them), lowest first.
    fn tasks_of(&self, c: u8) -> impl Iterator<Item = u8> + '_ {
        let p = self.process[c as usize];
        (0..self.process.len() as u8).filter(move |&t| self.process[t as usize] == p)
    }

    /// Client `c` writes to the fenced store when it holds: a mutex's
    /// owner or a writer (readers and permit holders share the key).
    fn writes(&self, c: u8) -> bool {
        self.shared
            .as_ref()
            .is_none_or(|sh| sh.modes[c as usize] == shared::Mode::Write)
    }

    /// Into a model.
    pub fn into_model(self) -> LockModel {
        LockModel { cfg: self }
    }

    fn granted_on_handoff(&self) -> u8 {
        // acquire.rs:270 `ttl.min(HANDOFF_LEASE)`; release.lua's hand-over caps the same way.
        self.ttl.min(self.handoff)
    }
}

/// The lock model (see the module docs).
#[derive(Clone, Debug)]
pub struct LockModel {
    /// Its configuration.
    pub cfg: LockConfig,
}

/// The value of the lock key: its owner's token, `+` once someone may be
/// queued behind it (acquire.lua's header), and its expiry.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Val {
    /// The owner's token (a client index).
    pub owner: u8,
    /// The `+` mark.
    pub marked: bool,
    /// The key is gone once the clock reaches this.
    pub expires: u8,
}

/// A queue entry `token:lease` (acquire.lua, the busy path's `RPUSH`),
/// with its score in the queue's deadlines.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Entry {
    /// The waiter's token.
    pub token: u8,
    /// The lease it asked for.
    pub lease: u8,
    /// The end of its wait (`ZADD` of server time + `ARGV[3]` when it
    /// joined): from this tick on, the scripts skip it.
    pub until: u8,
}

impl Entry {
    /// The queue's member `token:lease` (the deadline is not part of it).
    fn is(&self, token: u8, lease: u8) -> bool {
        self.token == token && self.lease == lease
    }

    /// Its wait has not ended at `now` (the scripts' `deadline > now`).
    pub fn waiting_at(&self, now: u8) -> bool {
        now < self.until
    }
}

/// The key's names on the server: lock, fencing counter, waiter queue and
/// its deadlines.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub struct Server {
    /// `KEYS[1]`, the lock.
    pub lock: Option<Val>,
    /// `KEYS[2]`, the fencing counter of the key's hash slot, shared by every
    /// key there (never expires; `0`: absent).
    pub fence: u8,
    /// `KEYS[3]`, the waiter queue (a list; gone when empty), with
    /// `KEYS[4]`, the deadlines (a sorted set of the same members, kept in
    /// step by every script and expiring with the list): one entry each.
    pub queue: Vec<Entry>,
    /// The expiry of the queue and its deadlines (meaningless while empty).
    pub queue_expires: u8,
}

/// The scripts before commit 7dbf470 or today's ([`LockConfig::fifo_on_expiry`],
/// [`LockConfig::skip_ended_waits`]).
#[derive(Clone, Copy, Debug)]
pub struct Scripts {
    /// A free key with a line behind it goes to the line.
    pub fifo_on_expiry: bool,
    /// Entries whose wait has ended are skipped.
    pub skip_ended_waits: bool,
}

/// What the release script answers.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum RelReply {
    /// `0`: absent or another owner's.
    NotOurs,
    /// `1`: released, nobody handed over to.
    Released,
    /// `{1, sha1(token), fence}`: released and handed to `to`.
    Handed {
        /// The new owner.
        to: u8,
        /// Its fencing token.
        fence: u8,
    },
}

/// A grant notice on the key's channel (release.lua's header; acquire.lua's
/// free path sends the same).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Notice {
    /// `sha1(token):fence`: the lock was handed to `to`.
    Grant {
        /// The new owner.
        to: u8,
        /// Its fencing token.
        fence: u8,
    },
}

impl Server {
    fn expire(&mut self, now: u8) -> Option<u8> {
        let mut ended = None;
        if let Some(v) = self.lock
            && v.expires <= now
        {
            self.lock = None;
            ended = Some(v.owner);
        }
        if !self.queue.is_empty() && self.queue_expires <= now {
            self.queue.clear();
        }
        ended
    }

    /// The hand-over shared by release.lua and acquire.lua's free path:
    /// pops the line's first entry whose wait has not ended (with
    /// `skip_ended_waits`; else the first) and sets the key to it, marked,
    /// for `min(its lease, cap)`, with an `INCR` of the slot counter; the
    /// grant notice. `None` when nobody is left in line.
    fn hand_to_head(&mut self, now: u8, cap: u8, skip_ended: bool) -> Option<Notice> {
        let mut entry = None;
        while !self.queue.is_empty() {
            // `LPOP`, `ZSCORE`, `ZREM`: an entry whose wait has ended is a
            // waiter that gave up (or died) without leaving.
            let e = self.queue.remove(0);
            if !skip_ended || e.waiting_at(now) {
                entry = Some(e);
                break;
            }
        }
        let entry = entry?;
        self.fence += 1;
        self.lock = Some(Val {
            owner: entry.token,
            marked: true,
            expires: now + entry.lease.min(cap),
        });
        Some(Notice::Grant {
            to: entry.token,
            fence: self.fence,
        })
    }

    /// acquire.lua, step by step. `wait == 0`: try once. The notice of a
    /// hand-over its free path made, if any.
    fn acquire(
        &mut self,
        now: u8,
        token: u8,
        lease: u8,
        wait: u8,
        cap: u8,
        scripts: Scripts,
    ) -> (AcqReply, Option<Notice>) {
        let mut notice = None;
        if self.lock.is_none() {
            // Free: `SET NX PX` takes it.
            self.lock = Some(Val {
                owner: token,
                marked: false,
                expires: now + lease,
            });
            // `EXISTS` of the queue: nobody queues, the uncontended path.
            if self.queue.is_empty() {
                self.fence += 1;
                return (AcqReply::Granted(self.fence), None);
            }
            if !scripts.fifo_on_expiry {
                // The script before 7dbf470: `LREM` of the caller's own entry
                // (the client of then asked after an attempt with a wait),
                // `INCR`. The line is not looked at.
                self.queue.retain(|e| !e.is(token, lease));
                self.fence += 1;
                return (AcqReply::Granted(self.fence), None);
            }
            // A line behind a free key: a lease ran out. Drop ended entries
            // at the head, unless the head is the caller's own.
            while let Some(head) = self.queue.first()
                && !head.is(token, lease)
                && scripts.skip_ended_waits
                && !head.waiting_at(now)
            {
                self.queue.remove(0);
            }
            match self.queue.first() {
                // The caller is first in line (or the line emptied): it
                // takes the key, leaving the line; marked if others remain.
                Some(head) if head.is(token, lease) => {
                    self.queue.remove(0);
                    if let Some(v) = &mut self.lock {
                        v.marked = !self.queue.is_empty();
                    }
                    self.fence += 1;
                    return (AcqReply::Granted(self.fence), None);
                }
                None => {
                    self.fence += 1;
                    return (AcqReply::Granted(self.fence), None);
                }
                // Somebody else is first: handed the key as release.lua
                // does; the caller goes on as if it found it held.
                Some(_) => {
                    notice = self.hand_to_head(now, cap, scripts.skip_ended_waits);
                }
            }
        }
        let v = self.lock.expect("set above or held");
        if v.owner == token {
            // Ours (with or without the mark): re-arm, answer the counter as
            // it is: at least the token issued to us, below any later
            // owner's (other keys may have raised it since).
            self.lock = Some(Val {
                expires: now + lease,
                ..v
            });
            if self.fence == 0 {
                self.fence += 1;
            }
            return (AcqReply::Granted(self.fence), notice);
        }
        // Another owner's. (A key without an expiry is never set by these
        // scripts.)
        let ttl = v.expires - now;
        if wait == 0 {
            return (
                AcqReply::Busy {
                    remaining: ttl,
                    fence: 0,
                },
                notice,
            );
        }
        // Join the queue once (`LPOS`, `RPUSH`, `ZADD` now + wait).
        if !self.queue.iter().any(|e| e.is(token, lease)) {
            if self.queue.is_empty() {
                self.queue_expires = 0;
            }
            self.queue.push(Entry {
                token,
                lease,
                until: now + wait,
            });
        }
        // Mark the holder, keeping its expiry.
        self.lock = Some(Val { marked: true, ..v });
        // The queue (and its deadlines) outlive the longest wait in it plus
        // one lease.
        let keep = wait + lease;
        if self.queue_expires.saturating_sub(now) < keep {
            self.queue_expires = now + keep;
        }
        // `{-ttl, counter}`: the counter as this attempt saw it.
        (
            AcqReply::Busy {
                remaining: ttl,
                fence: self.fence,
            },
            notice,
        )
    }

    /// extend.lua and extend_many.lua (one lease): re-arm if ours.
    fn extend(&mut self, now: u8, token: u8, lease: u8) -> bool {
        match self.lock {
            // extend.lua:5-9, extend_many.lua:7-11
            Some(v) if v.owner == token => {
                self.lock = Some(Val {
                    expires: now + lease,
                    ..v
                });
                true
            }
            // extend.lua:10, extend_many.lua:12-13
            _ => false,
        }
    }

    /// reserve.lua, line by line: keep the lock for a hand-over in the
    /// owner's process and reserve `block` fencing tokens; the highest, or
    /// `0`.
    fn reserve(&mut self, now: u8, token: u8, lease: u8, block: u8) -> u8 {
        match self.lock {
            // reserve.lua:11-12: ours, without the mark.
            Some(v) if v.owner == token && !v.marked => {}
            // reserve.lua:13-16: ours with the mark and nobody queued: the
            // mark goes (`SET ... KEEPTTL`).
            Some(v) if v.owner == token && self.queue.is_empty() => {
                self.lock = Some(Val { marked: false, ..v });
            }
            // reserve.lua:13-14: another owner's, absent, or somebody queued.
            _ => return 0,
        }
        // reserve.lua:18: `PEXPIRE` to a full lease.
        if let Some(v) = &mut self.lock {
            v.expires = now + lease;
        }
        // reserve.lua:19: `INCRBY` the slot counter.
        self.fence += block;
        self.fence
    }

    /// release.lua with `ARGV[6] = '0'` (single Redis: every waiter queues).
    fn release(
        &mut self,
        now: u8,
        token: u8,
        cap: u8,
        dequeue: Option<(u8, u8)>,
        skip_ended: bool,
    ) -> (RelReply, Option<Notice>) {
        // Leave the queue first (`LREM`, `ZREM` of `ARGV[4]`).
        if let Some((token, lease)) = dequeue
            && let Some(i) = self.queue.iter().position(|e| e.is(token, lease))
        {
            self.queue.remove(i);
        }
        // Ours, or ours with the mark.
        let Some(v) = self.lock.filter(|v| v.owner == token) else {
            return (RelReply::NotOurs, None);
        };
        self.lock = None;
        // Marked: hand over to the first entry whose wait has not ended
        // (`hand_to_head`). Unmarked: the queue is not looked at.
        if v.marked
            && let Some(notice) = self.hand_to_head(now, cap, skip_ended)
        {
            let Notice::Grant { to, fence } = notice;
            return (RelReply::Handed { to, fence }, Some(notice));
        }
        // `ARGV[6]` is '0' on single Redis: no notice.
        (RelReply::Released, None)
    }
}

/// A script call and what became of it.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Req {
    /// acquire.lua with this wait (`0`: try once).
    Acquire {
        /// `ARGV[3]`, in ticks.
        wait: u8,
    },
    /// extend.lua, from `confirm` (acquire.rs:267-284).
    Confirm,
    /// release.lua; `dequeue`: leave the queue too.
    Release {
        /// `ARGV[4]` is our entry.
        dequeue: bool,
    },
    /// extend_many.lua, from the watchdog.
    Renew,
    /// reserve.lua, from `hand_on` (local.rs:530-549).
    Reserve,
}

/// The answer of a script call.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Resp {
    /// acquire.lua's answer.
    Acquire(AcqReply),
    /// extend.lua's or extend_many.lua's answer.
    Extended(bool),
    /// release.lua's answer.
    Release(RelReply),
    /// reserve.lua's answer: the top of the block, or `0`.
    Reserved(u8),
}

/// Where a request is.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Stage {
    /// On the wire, not run yet.
    Sent,
    /// Run; the answer is on its way.
    Replied(Resp),
    /// The connection broke: the client sees a connection error.
    Failed,
}

/// One request in flight on a connection.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Net {
    /// What was sent.
    pub req: Req,
    /// Where it is.
    pub stage: Stage,
    /// How often it will still be sent again after a broken connection.
    pub resends: u8,
    /// Sent by a background task (reply only logged).
    pub background: bool,
    /// A copy of it was sent before and its answer lost (redis.rs:328-339).
    pub resent: bool,
}

impl Net {
    fn new(req: Req, resends: u8, background: bool) -> Self {
        Self {
            req,
            stage: Stage::Sent,
            resends,
            background,
            resent: false,
        }
    }
}

/// A client's connection.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Conn {
    /// The acquire / release / confirm connection.
    App,
    /// The watchdog's renewals.
    Watchdog,
}

/// How an operation ended.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum End {
    /// Held and released: `release()` was `Ok`.
    ReleasedOk,
    /// Held; `release()` said `Lost`.
    ReleasedLost,
    /// Held; `release()` failed (outcome unknown).
    ReleaseError,
    /// `Busy`: the wait ran out.
    Busy,
    /// The acquire failed with a backend error.
    AcquireError,
}

/// Where a client's acquisition is (acquire.rs's named steps).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Phase {
    /// Not started.
    Idle,
    /// About to send an attempt (acquire.rs:157-170).
    Attempting,
    /// The attempt sent at `sent` is in flight.
    AcquireSent {
        /// Its send time.
        sent: u8,
    },
    /// `wait_for_turn` (acquire.rs:226-260), until `retry_at`.
    Waiting {
        /// The lease timer.
        retry_at: u8,
    },
    /// `confirm` of a hand-over with this fencing token (acquire.rs:267-284).
    Confirming {
        /// The hand-over's fencing token.
        fence: u8,
        /// The confirming extend was sent at this time (`None`: not yet).
        sent: Option<u8>,
    },
    /// Holding the lock (a guard).
    Hold,
    /// `LockGuard::release` in flight (guard.rs:137-190).
    Releasing {
        /// guard.rs:146
        was_lost: bool,
        /// guard.rs:150
        valid: bool,
    },
    /// `give_up` leaving the queue (acquire.rs:321-343).
    GivingUp,
    /// Waiting in the process's line (local.rs `Local::wait`, 311-363),
    /// until `deadline`.
    InLine,
    /// `release()` handing the lease on in the process (guard.rs:151-155,
    /// local.rs `hand_on`): reserve.lua in flight.
    HandingOn,
    /// Finished.
    Done(End),
    /// The process died.
    Crashed,
}

/// The watchdog's entry for a held lease (watchdog/mod.rs:138-149).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Watch {
    /// When the next renewal is due.
    pub due: u8,
    /// A renewal sent at this time is in flight.
    pub busy: Option<u8>,
}

/// One acquisition: a client process of its own, or a task of a process
/// shared with other clients ([`LockConfig::process`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Client {
    /// Its step.
    pub phase: Phase,
    /// The owner token of its lease: its own index, or the token of the
    /// lease handed on to it in its process.
    pub token: u8,
    /// acquire.rs:48-49
    pub deadline: u8,
    /// acquire.rs:55
    pub last_busy: u8,
    /// acquire.rs:60, the highest counter a busy attempt saw (kept at 0
    /// without [`LockConfig::check_stale_grants`], as the old client had none).
    pub fence_seen: u8,
    /// acquire.rs:65
    pub retries: u8,
    /// The process is subscribed to the key's channel.
    pub subscribed: bool,
    /// The acquisition's `WaitHandle` is registered (waiters.rs:192-219).
    pub registered: bool,
    /// waiters.rs:22 (`0`: none).
    pub granted: u8,
    /// waiters.rs:24
    pub handoff_seen: bool,
    /// A `Notify` permit (waiters.rs:20).
    pub notified: bool,
    /// Notices on their way to this process.
    pub inbox: Vec<Notice>,
    /// The request on the command connection.
    pub app: Option<Net>,
    /// The watchdog's entry while held.
    pub wd: Option<Watch>,
    /// The watchdog's renewal in flight.
    pub wd_net: Option<Net>,
    /// The held lease's fencing token.
    pub fencing: u8,
    /// held.rs:276-279
    pub valid_until: u8,
    /// held.rs:274-275, `lost()` resolved.
    pub lost: bool,
    /// When it acquired.
    pub acquired_at: u8,
    /// It wrote to the fenced store.
    pub wrote: bool,
    /// Paused until this tick.
    pub paused_until: Option<u8>,
    /// Ghost: its lease ended on the server without its release (expired).
    pub lease_ended: bool,
    /// Ghost: it joined the waiter queue at some point.
    pub queued_ever: bool,
    /// Ghost: its process was paused.
    pub paused_ever: bool,
    /// Ghost: its lease had ended when it called `release()`.
    pub ended_at_release: bool,
}

impl Client {
    fn new(token: u8) -> Self {
        Self {
            phase: Phase::Idle,
            token,
            deadline: 0,
            last_busy: 0,
            fence_seen: 0,
            retries: 0,
            subscribed: false,
            registered: false,
            granted: 0,
            handoff_seen: false,
            notified: false,
            inbox: Vec::new(),
            app: None,
            wd: None,
            wd_net: None,
            fencing: 0,
            valid_until: 0,
            lost: false,
            acquired_at: 0,
            wrote: false,
            paused_until: None,
            lease_ended: false,
            queued_ever: false,
            paused_ever: false,
            ended_at_release: false,
        }
    }

    fn active(&self) -> bool {
        !matches!(self.phase, Phase::Done(_) | Phase::Crashed)
    }

    /// Holds a lease under watch: holding, or in `release()` handing it on
    /// (the watchdog entry stays until the hand-over or the release).
    fn watched(&self) -> bool {
        matches!(self.phase, Phase::Hold | Phase::HandingOn)
    }

    /// Believes it holds a valid lease: held.rs:285-287 `valid_at(now)`.
    pub fn believes_valid(&self, now: u8) -> bool {
        matches!(self.phase, Phase::Hold) && !self.lost && now < self.valid_until
    }
}

/// A violation noted by a transition (ghost state), checked by a property.
#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq)]
pub struct Ghost {
    /// A fencing token was issued that is not above every earlier one.
    pub fence_not_increasing: bool,
    /// The fenced store accepted a token not above the last accepted one.
    pub store_accepted_stale: bool,
    /// `release()` said `Lost` although the lease cannot have ended.
    pub false_lost: bool,
    /// `release()` said `Ok` although the lease had ended before it was called.
    pub false_ok: bool,
    /// A holder acted (wrote) while its lease had ended on the server and
    /// it had not been told.
    pub acted_past_lease: bool,
    /// Highest fencing token issued so far.
    pub issued_max: u8,
    /// A token was issued more than one above the one before (another key
    /// of the slot took the ones between).
    pub gap: bool,
    /// A waiter ignored a stale hand-over grant.
    pub stale_ignored: bool,
    /// The key became free (absent) at this tick and still is.
    pub free_since: Option<u8>,
    /// Faults injected so far.
    pub faults: u8,
    /// A release handed the lease on within its process.
    pub handed_locally: bool,
    /// A task waiting in its process's line went to the server.
    pub line_to_server: bool,
    /// A script gave the key to a later arrival (or dropped an entry)
    /// while a waiter queued ahead of it was still waiting.
    pub overtaken: bool,
    /// A hand-over went to a queue entry whose wait was over.
    pub handed_to_ended: bool,
    /// A script skipped a queue entry whose wait was over.
    pub skipped_ended: bool,
    /// ... the entry of a waiter whose process had died.
    pub skipped_crashed: bool,
    /// acquire.lua found the key free with a line behind it and handed it to
    /// the head of the line.
    pub expiry_handed: bool,
    /// What a read-write lock's or a semaphore's properties need.
    pub shared: SharedGhost,
}

/// A process's line for the key (local.rs `Slot`, 69-90; what it needs of
/// it: no prefetched block, see FAULTS.md).
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub struct Line {
    /// The task that holds the key for the line.
    pub holder: Option<u8>,
    /// A task of the line acquires on the server (`representatives`, 0 or 1).
    pub representative: bool,
    /// Tasks waiting in line, first first.
    pub waiters: Vec<u8>,
    /// Reserved fencing tokens `next..=top`.
    pub block: Option<(u8, u8)>,
}

/// The fenced store: accepts a write whose token is at least the highest seen.
#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq)]
pub struct Store {
    /// The highest token it accepted.
    pub max: u8,
    /// Writes accepted.
    pub accepted: u8,
    /// Writes rejected (stale tokens).
    pub rejected: u8,
}

/// The whole system.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct State {
    /// The model clock.
    pub now: u8,
    /// The Redis server: a mutex's names.
    pub server: Server,
    /// The Redis server: a read-write lock's or a semaphore's names
    /// (shared.lua; empty for a mutex).
    pub shared: Holders,
    /// The clients.
    pub clients: Vec<Client>,
    /// The fenced store.
    pub store: Store,
    /// Fault budgets left.
    pub budget: Faults,
    /// Tokens other keys of the slot may still take.
    pub other_keys: u8,
    /// Each process's line, by process id (used by processes of two or
    /// more clients only).
    pub lines: Vec<Line>,
    /// Ghost variables.
    pub ghost: Ghost,
}

impl State {
    /// Somebody holds the key on the server (a mutex's owner; a writer or a
    /// shared holder).
    pub fn held(&self) -> bool {
        self.server.lock.is_some() || self.shared.held()
    }

    /// `token` holds the key on the server.
    pub fn owns(&self, token: u8) -> bool {
        self.server.lock.is_some_and(|v| v.owner == token) || self.shared.owns(token)
    }

    /// The tokens in the waiter queue, first first.
    pub fn queued(&self) -> impl Iterator<Item = u8> + '_ {
        let mutex = self.server.queue.iter().map(|e| e.token);
        mutex.chain(self.shared.queue.iter().map(|e| e.token))
    }
}

/// A step of the system.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Action {
    /// The model clock advances; keys expire.
    Tick,
    /// Client `c` calls `acquire()`.
    Start(u8),
    /// Client `c` sends an acquire attempt.
    Attempt(u8),
    /// Redis runs the script client `c` sent on a connection.
    Exec(u8, Conn),
    /// Client `c` reads the answer (or the error) on a connection.
    Receive(u8, Conn),
    /// A notice reaches client `c`'s process.
    Deliver(u8),
    /// Client `c`'s `wait_for_turn` wakes on a notice.
    Woken(u8),
    /// Client `c`'s `wait_for_turn` wakes on its lease timer.
    Timer(u8),
    /// Client `c`'s watchdog fires (renews, or finds the lease run out).
    Renew(u8),
    /// Client `c`'s renewal times out at its validity (watchdog/mod.rs:309).
    RenewTimeout(u8),
    /// Client `c`, holding and not told `lost`, writes to the fenced store.
    Write(u8),
    /// Client `c` calls `release()`.
    Release(u8),
    /// Fault: client `c` dies.
    Crash(u8),
    /// Fault: client `c` stops for a while.
    Pause(u8),
    /// Fault: client `c`'s request on a connection is lost.
    LoseRequest(u8, Conn),
    /// Fault: the answer to client `c`'s request on a connection is lost.
    LoseReply(u8, Conn),
    /// Fault: the next notice to client `c` is lost.
    LoseNotice(u8),
    /// Another key of the same hash slot takes a fencing token (its
    /// acquire.lua or release.lua `INCR`s the shared counter).
    OtherKey,
    /// Client `c`'s wait in its process's line reaches its deadline.
    LineTimeout(u8),
    /// Client `c`, waiting in line, sees the line's holder lost.
    LineLost(u8),
}

impl LockModel {
    fn client_actions(&self, s: &State, c: u8, urgent: &mut Vec<Action>, lazy: &mut Vec<Action>) {
        let cl = &s.clients[c as usize];
        let now = s.now;
        // The server runs whatever is on the wire, whatever the client does.
        for (conn, net) in [(Conn::App, &cl.app), (Conn::Watchdog, &cl.wd_net)] {
            if let Some(net) = net
                && net.stage == Stage::Sent
            {
                urgent.push(Action::Exec(c, conn));
            }
        }
        if !cl.active() {
            // Background requests of a finished client: answers are logged.
            if cl.phase != Phase::Crashed
                && let Some(net) = &cl.app
                && net.stage != Stage::Sent
            {
                urgent.push(Action::Receive(c, Conn::App));
            }
            return;
        }
        if cl.paused_until.is_some_and(|t| now < t) {
            return;
        }
        if let Some(net) = &cl.app
            && net.stage != Stage::Sent
        {
            urgent.push(Action::Receive(c, Conn::App));
        }
        if let Some(net) = &cl.wd_net
            && net.stage != Stage::Sent
        {
            urgent.push(Action::Receive(c, Conn::Watchdog));
        }
        if !cl.inbox.is_empty() {
            urgent.push(Action::Deliver(c));
        }
        match cl.phase {
            Phase::Idle => {
                if now >= self.cfg.start_by {
                    urgent.push(Action::Start(c));
                } else {
                    lazy.push(Action::Start(c));
                }
            }
            Phase::Attempting => urgent.push(Action::Attempt(c)),
            Phase::Waiting { retry_at } => {
                if cl.notified {
                    urgent.push(Action::Woken(c));
                }
                if now >= retry_at {
                    urgent.push(Action::Timer(c));
                }
            }
            Phase::Confirming { sent: None, .. } => urgent.push(Action::Attempt(c)),
            Phase::InLine => {
                // local.rs:317-336: the select over the turn, the holder's
                // `lost` and the deadline.
                let line = &s.lines[self.cfg.process[c as usize] as usize];
                if line.holder.is_some_and(|h| s.clients[h as usize].lost) {
                    urgent.push(Action::LineLost(c));
                }
                if now >= cl.deadline {
                    urgent.push(Action::LineTimeout(c));
                }
            }
            Phase::HandingOn => self.watchdog_actions(cl, c, now, urgent),
            Phase::Hold => {
                self.watchdog_actions(cl, c, now, urgent);
                if !cl.wrote && !cl.lost && self.cfg.writes(c) {
                    lazy.push(Action::Write(c));
                }
                if now >= cl.acquired_at + self.cfg.hold_max {
                    urgent.push(Action::Release(c));
                } else {
                    lazy.push(Action::Release(c));
                }
            }
            _ => {}
        }
    }

    /// The watchdog's steps for a lease under watch.
    fn watchdog_actions(&self, cl: &Client, c: u8, now: u8, urgent: &mut Vec<Action>) {
        if let Some(wd) = &cl.wd {
            if wd.busy.is_none() && wd.due <= now {
                urgent.push(Action::Renew(c));
            }
            if wd.busy.is_some() && now >= cl.valid_until {
                urgent.push(Action::RenewTimeout(c));
            }
        }
    }

    fn fault_actions(&self, s: &State, c: u8, out: &mut Vec<Action>) {
        let b = &s.budget;
        if b.total == 0 {
            return;
        }
        let cl = &s.clients[c as usize];
        // A crash or a pause is the process's: offered once, by its first
        // client, while any of its clients is under way.
        let first = self.cfg.tasks_of(c).next() == Some(c);
        let under_way = self.cfg.tasks_of(c).any(|t| {
            let t = &s.clients[t as usize];
            t.active() && t.phase != Phase::Idle
        });
        if first && under_way {
            if b.crash > 0 {
                out.push(Action::Crash(c));
            }
            if b.pause > 0 && cl.paused_until.is_none() {
                out.push(Action::Pause(c));
            }
        }
        for (conn, net) in [(Conn::App, &cl.app), (Conn::Watchdog, &cl.wd_net)] {
            if let Some(net) = net {
                if net.stage == Stage::Sent && b.lost_request > 0 {
                    out.push(Action::LoseRequest(c, conn));
                }
                if matches!(net.stage, Stage::Replied(_)) && b.lost_reply > 0 {
                    out.push(Action::LoseReply(c, conn));
                }
            }
        }
        if !cl.inbox.is_empty() && b.lost_notice > 0 {
            out.push(Action::LoseNotice(c));
        }
    }

    fn needs_time(&self, s: &State) -> bool {
        s.clients.iter().any(|c| c.active()) || s.held() || s.queued().next().is_some()
    }

    /// [`Narrate::apply`]: applies `action`; `log` gets the narration when
    /// narrating.
    fn step(&self, s: &mut State, action: Action, log: &mut Log) {
        let now = s.now;
        let ttl = self.cfg.ttl;
        match action {
            Action::Tick => {
                s.now += 1;
                let now = s.now;
                log.say(|| "time passes".into());
                // watchdog/mod.rs:278-285 and 309: the watchdog's timer at
                // `valid_until` fires before Redis expires the key, which it
                // set no earlier than the request was sent (`sent + lease`
                // is a lower bound). A paused process's timer fires only
                // when it resumes.
                for (i, cl) in s.clients.iter_mut().enumerate() {
                    if cl.watched()
                        && cl.wd.is_some()
                        && !cl.lost
                        && cl.paused_until.is_none()
                        && now >= cl.valid_until
                    {
                        cl.lost = true;
                        cl.wd = None;
                        cl.wd_net = None;
                        log.say(|| {
                            format!(
                                "{}: watchdog: no renewal confirmed by t={}, lost()",
                                name(i as u8),
                                cl.valid_until
                            )
                        });
                    }
                }
                let ended = s.server.expire(now).into_iter().chain(s.shared.expire(now));
                for owner in ended.collect::<Vec<_>>() {
                    // Ghost: the lease ended without its owner's release.
                    for cl in s.clients.iter_mut().filter(|cl| cl.token == owner) {
                        cl.lease_ended = true;
                    }
                    log.say(|| format!("{}'s lease expires", name(owner)));
                }
                for c in &mut s.clients {
                    if c.paused_until.is_some_and(|t| now >= t) {
                        c.paused_until = None;
                    }
                }
            }
            Action::Start(c) => {
                let wait = self.cfg.waits[c as usize];
                // request.rs:148-180: a task with a wait enters its line.
                let queued = self.cfg.in_line(c) && wait != 0 && self.enter(s, c);
                let cl = &mut s.clients[c as usize];
                cl.deadline = now + wait;
                if queued {
                    cl.phase = Phase::InLine;
                    log.say(|| {
                        format!(
                            "{}: acquire() with a wait of {wait} ticks: waits in its process's line",
                            name(c)
                        )
                    });
                } else {
                    // acquire.rs:86-124: a deadline, a token; registering first
                    // only where notices already reach us (never, for a process's
                    // first acquisition).
                    cl.last_busy = now;
                    cl.phase = Phase::Attempting;
                    log.say(|| format!("{}: acquire() with a wait of {wait} ticks", name(c)));
                }
            }
            Action::Attempt(c) => {
                let ci = c as usize;
                match s.clients[ci].phase {
                    Phase::Confirming { fence, sent: None } => {
                        // acquire.rs:267-283: trusted as it is while a third is left,
                        // else re-armed to the full lease.
                        let granted = self.cfg.granted_on_handoff();
                        if !self.cfg.confirm_every_handoff
                            && now + granted / 3 < s.clients[ci].last_busy + granted
                        {
                            log.say(|| {
                                format!(
                                    "{}: trusts the hand-over (fencing {fence}) as granted after its last busy answer at t={}",
                                    name(c),
                                    s.clients[ci].last_busy
                                )
                            });
                            let last_busy = s.clients[ci].last_busy;
                            self.hold(s, c, fence, last_busy, granted, log);
                        } else {
                            s.clients[ci].phase = Phase::Confirming {
                                fence,
                                sent: Some(now),
                            };
                            s.clients[ci].app = Some(Net::new(Req::Confirm, 0, false));
                            log.say(|| {
                                format!(
                                    "{}: confirms the hand-over with {}",
                                    name(c),
                                    self.script("extend.lua", "extend")
                                )
                            });
                        }
                    }
                    _ => {
                        // acquire.rs `Acquisition::attempt`: what is left of the
                        // wait (at least 1 ms), or 0 to try once.
                        let wait_arg = if self.cfg.waits[c as usize] == 0 {
                            0
                        } else {
                            s.clients[ci].deadline.saturating_sub(now).max(1)
                        };
                        s.clients[ci].app =
                            Some(Net::new(Req::Acquire { wait: wait_arg }, 0, false));
                        s.clients[ci].phase = Phase::AcquireSent { sent: now };
                        log.say(|| {
                            format!(
                                "{}: sends {} (wait {wait_arg})",
                                name(c),
                                self.script("acquire.lua", "acquire"),
                            )
                        });
                    }
                }
            }
            Action::Exec(c, conn) => self.exec(s, c, conn, log),
            Action::Receive(c, conn) => self.receive(s, c, conn, log),
            Action::Deliver(c) => {
                let cl = &mut s.clients[c as usize];
                let notice = cl.inbox.remove(0);
                let Notice::Grant { to, fence } = notice;
                // waiters.rs:85-115: routed to the named waiter; one other
                // waiter of the process learns of the hand-over.
                if !cl.registered {
                    log.say(|| format!("{}: a notice arrives, nobody waits for it", name(c)));
                } else if to == c {
                    cl.granted = fence;
                    cl.notified = true;
                    log.say(|| {
                        format!(
                            "{}: the notice says the lock was handed to it (fencing {fence})",
                            name(c)
                        )
                    });
                } else {
                    cl.handoff_seen = true;
                    cl.notified = true;
                    log.say(|| {
                        format!(
                            "{}: the notice says the lock was handed to {}",
                            name(c),
                            name(to)
                        )
                    });
                }
            }
            Action::Woken(c) => {
                let handoff = self.cfg.handoff;
                let cl = &mut s.clients[c as usize];
                cl.notified = false;
                let Phase::Waiting { retry_at } = cl.phase else {
                    unreachable!()
                };
                // acquire.rs:246-258
                if cl.granted != 0 {
                    let fence = std::mem::take(&mut cl.granted);
                    if self.fresh(cl, fence) {
                        cl.phase = Phase::Confirming { fence, sent: None };
                        log.say(|| format!("{}: wakes: granted, fencing {fence}", name(c)));
                    } else {
                        // acquire.rs:248-249: stale; the next attempt tells.
                        cl.phase = Phase::Attempting;
                        s.ghost.stale_ignored = true;
                        let seen = cl.fence_seen;
                        log.say(|| {
                            format!(
                                "{}: wakes: granted, fencing {fence}, stale (counter seen {seen}): tries again",
                                name(c)
                            )
                        });
                    }
                } else if std::mem::take(&mut cl.handoff_seen) {
                    let retry_at = retry_at.min(now + handoff);
                    cl.phase = Phase::Waiting { retry_at };
                    log.say(|| {
                        format!(
                            "{}: wakes: handed to another, retries by t={retry_at}",
                            name(c)
                        )
                    });
                } else {
                    cl.phase = Phase::Attempting;
                    log.say(|| format!("{}: wakes: the key is free, tries again", name(c)));
                }
            }
            Action::Timer(c) => {
                // acquire.rs:244: the lease timer won the select (even if a
                // notice is there too: select picks either).
                let cl = &mut s.clients[c as usize];
                cl.phase = Phase::Attempting;
                log.say(|| format!("{}: its lease timer fires, tries again", name(c)));
            }
            Action::Renew(c) => {
                let cl = &mut s.clients[c as usize];
                // watchdog/mod.rs:200-211
                if now >= cl.valid_until {
                    cl.lost = true;
                    cl.wd = None;
                    log.say(|| {
                        format!(
                            "{}: watchdog: no renewal confirmed in time, lost()",
                            name(c)
                        )
                    });
                } else {
                    cl.wd = Some(Watch {
                        due: 0,
                        busy: Some(now),
                    });
                    cl.wd_net = Some(Net::new(Req::Renew, 0, false));
                    log.say(|| {
                        format!(
                            "{}: watchdog sends {}",
                            name(c),
                            self.script("extend_many.lua", "extend")
                        )
                    });
                }
            }
            Action::RenewTimeout(c) => {
                let cl = &mut s.clients[c as usize];
                cl.wd_net = None;
                // watchdog/mod.rs:278-285
                cl.lost = true;
                cl.wd = None;
                log.say(|| {
                    format!(
                        "{}: watchdog: renewal unanswered at its validity, lost()",
                        name(c)
                    )
                });
            }
            Action::Write(c) => {
                let mine = s.owns(s.clients[c as usize].token);
                let cl = &mut s.clients[c as usize];
                cl.wrote = true;
                if !mine && !cl.paused_ever {
                    // Told lost before it could act? It was not.
                    s.ghost.acted_past_lease = true;
                }
                let f = cl.fencing;
                if f >= s.store.max {
                    if s.store.accepted > 0 && f == s.store.max {
                        s.ghost.store_accepted_stale = true;
                    }
                    s.store.max = f;
                    s.store.accepted += 1;
                    log.say(|| format!("{}: writes with fencing {f}: accepted", name(c)));
                } else {
                    s.store.rejected += 1;
                    log.say(|| {
                        format!(
                            "{}: writes with fencing {f}: rejected (store has seen {})",
                            name(c),
                            s.store.max
                        )
                    });
                }
            }
            Action::Release(c) => {
                let cl = &mut s.clients[c as usize];
                // guard.rs:147
                let was_lost = cl.lost;
                cl.ended_at_release = cl.lease_ended;
                log.say(|| format!("{}: release()", name(c)));
                // guard.rs:151-155: a task waits in line: hand on.
                if !was_lost && self.has_waiters(s, c) {
                    self.hand_on(s, c, None, log);
                } else {
                    self.release_to_server(s, c, was_lost, log);
                }
            }
            Action::Crash(c) => {
                s.budget.crash -= 1;
                self.spend(s);
                // Every task of the process dies, and its line with it.
                for t in self.cfg.tasks_of(c) {
                    let cl = &mut s.clients[t as usize];
                    if cl.active() {
                        cl.phase = Phase::Crashed;
                    }
                    cl.wd = None;
                    cl.registered = false;
                    cl.inbox.clear();
                    cl.paused_until = None;
                    // Requests on the wire still reach Redis; nothing is re-sent.
                    if let Some(net) = &mut cl.app {
                        net.resends = 0;
                    }
                }
                s.lines[self.cfg.process[c as usize] as usize] = Line::default();
                log.say(|| format!("FAULT {}: the process dies", self.process_name(c)));
            }
            Action::Pause(c) => {
                s.budget.pause -= 1;
                self.spend(s);
                let until = now + self.cfg.pause_len;
                for t in self.cfg.tasks_of(c) {
                    let cl = &mut s.clients[t as usize];
                    cl.paused_until = Some(until);
                    // A process stopped around its acquire or while it holds can
                    // act past its lease when it resumes, before its watchdog
                    // runs: only fencing stops that (README).
                    cl.paused_ever = true;
                }
                log.say(|| {
                    format!(
                        "FAULT {}: the process stops until t={until}",
                        self.process_name(c)
                    )
                });
            }
            Action::LoseRequest(c, conn) => {
                s.budget.lost_request -= 1;
                self.spend(s);
                let net = self.net_mut(s, c, conn);
                net.stage = Stage::Failed;
                log.say(|| {
                    format!(
                        "FAULT {}: the connection breaks before Redis runs {:?}",
                        name(c),
                        net.req
                    )
                });
            }
            Action::LoseReply(c, conn) => {
                s.budget.lost_reply -= 1;
                self.spend(s);
                let net = self.net_mut(s, c, conn);
                net.stage = Stage::Failed;
                log.say(|| {
                    format!(
                        "FAULT {}: the answer to {:?} is lost (connection killed)",
                        name(c),
                        net.req
                    )
                });
            }
            Action::LoseNotice(c) => {
                s.budget.lost_notice -= 1;
                self.spend(s);
                s.clients[c as usize].inbox.remove(0);
                log.say(|| format!("FAULT {}: a notice is lost", name(c)));
            }
            Action::OtherKey => {
                s.other_keys -= 1;
                // Not this key's token: only the shared counter rises.
                s.server.fence += 1;
                let f = s.server.fence;
                log.say(|| format!("another key of the slot takes fencing token {f}"));
            }
            Action::LineTimeout(c) => {
                // local.rs:343-356: the deadline: leave the line, `Busy`.
                let line = &mut s.lines[self.cfg.process[c as usize] as usize];
                line.waiters.retain(|&w| w != c);
                s.clients[c as usize].phase = Phase::Done(End::Busy);
                log.say(|| format!("{}: its wait in line runs out; acquire() -> Busy", name(c)));
            }
            Action::LineLost(c) => {
                // local.rs:327-331: the holder lost its lease without a
                // release: the line goes back to the server (`end`).
                let line = &s.lines[self.cfg.process[c as usize] as usize];
                let holder = line.holder.expect("a holder");
                log.say(|| {
                    format!(
                        "{}: the line's holder {} is lost; the line goes to the server",
                        name(c),
                        name(holder)
                    )
                });
                self.line_end(s, holder, log);
            }
        }
        let _ = ttl;
        // Ghost: when did the key become free?
        match (s.held(), s.ghost.free_since) {
            (false, None) => s.ghost.free_since = Some(s.now),
            (true, Some(_)) => s.ghost.free_since = None,
            _ => {}
        }
        if let Some(shared) = &self.cfg.shared {
            SharedGhost::track(s, shared.limit);
        }
    }

    fn spend(&self, s: &mut State) {
        s.budget.total -= 1;
        s.ghost.faults += 1;
    }

    fn net_mut<'a>(&self, s: &'a mut State, c: u8, conn: Conn) -> &'a mut Net {
        let cl = &mut s.clients[c as usize];
        match conn {
            Conn::App => cl.app.as_mut(),
            Conn::Watchdog => cl.wd_net.as_mut(),
        }
        .expect("a request in flight")
    }

    /// Redis runs a request.
    fn exec(&self, s: &mut State, c: u8, conn: Conn, log: &mut Log) {
        let now = s.now;
        let ttl = self.cfg.ttl;
        let net = *self.net_mut(s, c, conn);
        // The lease's owner token (`c`'s own while it acquires).
        let token = s.clients[c as usize].token;
        // Ghost: the line and the key's owner before the call.
        let line_before = s.server.queue.clone();
        let owner_before = s.server.lock.map(|v| v.owner);
        let (resp, text) = match net.req {
            _ if self.cfg.shared.is_some() => self.exec_shared(s, c, net.req),
            Req::Acquire { wait } => {
                let before = s.server.fence;
                let (r, notice) =
                    s.server
                        .acquire(now, token, ttl, wait, self.cfg.handoff, self.scripts());
                if let AcqReply::Granted(f) = r {
                    if s.server.fence != before {
                        self.issued(s, f);
                    }
                    // Ghost: a lease of c's starts (or is re-armed) now.
                    s.clients[c as usize].lease_ended = false;
                }
                if wait != 0 && s.server.queue.iter().any(|e| e.token == c) {
                    s.clients[c as usize].queued_ever = true;
                }
                let mut text = String::new();
                if let Some(Notice::Grant { to, fence }) = notice {
                    self.handed(s, to, fence);
                    s.ghost.expiry_handed = true;
                    text = format!(
                        "free with a line behind it: handed to {} (fencing {fence}, lease {}), notice published; ",
                        name(to),
                        ttl.min(self.cfg.handoff)
                    );
                }
                text += &match r {
                    AcqReply::Granted(f) => format!("granted, fencing {f}"),
                    AcqReply::Busy { remaining, fence } if wait != 0 => {
                        format!(
                            "busy for {remaining} more ticks, counter {fence}; {} queued, holder marked +",
                            name(c)
                        )
                    }
                    AcqReply::Busy { remaining, .. } => {
                        format!("busy for {remaining} more ticks")
                    }
                };
                (Resp::Acquire(r), text)
            }
            Req::Confirm | Req::Renew => {
                let ok = s.server.extend(now, token, ttl);
                let script = if net.req == Req::Confirm {
                    "extend.lua"
                } else {
                    "extend_many.lua"
                };
                (
                    Resp::Extended(ok),
                    format!("{script}: {}", if ok { "re-armed" } else { "not ours (0)" }),
                )
            }
            Req::Release { dequeue } => {
                let (r, notice) = s.server.release(
                    now,
                    token,
                    self.cfg.handoff,
                    dequeue.then_some((token, ttl)),
                    self.cfg.skip_ended_waits,
                );
                if let Some(Notice::Grant { to, fence }) = notice {
                    self.handed(s, to, fence);
                }
                let text = match r {
                    RelReply::NotOurs => "not ours (0)".to_string(),
                    RelReply::Released => "released".to_string(),
                    RelReply::Handed { to, fence } => format!(
                        "released and handed to {} (fencing {fence}, lease {}), notice published",
                        name(to),
                        ttl.min(self.cfg.handoff)
                    ),
                };
                (Resp::Release(r), text)
            }
            Req::Reserve => {
                let top = s.server.reserve(now, token, ttl, self.cfg.block);
                let text = if top == 0 {
                    "0 (not ours, or somebody queued)".to_string()
                } else {
                    format!("kept, tokens {}..={top} reserved", top + 1 - self.cfg.block)
                };
                (Resp::Reserved(top), text)
            }
        };
        self.net_mut(s, c, conn).stage = Stage::Replied(resp);
        log.say(|| format!("Redis runs {}'s {:?}: {text}", name(c), net.req));
        if self.cfg.shared.is_none() {
            let owner = s.server.lock.map(|v| v.owner);
            let to = match resp {
                // reserve.lua keeps the key for the owner's process: the
                // next task in line takes it without queueing on the server.
                Resp::Reserved(top) if top != 0 => Some(None),
                _ if owner != owner_before => owner.map(Some),
                _ => None,
            };
            self.line_ghost(s, &line_before, to, token);
        }
    }

    /// Which scripts the configuration runs.
    fn scripts(&self) -> Scripts {
        Scripts {
            fifo_on_expiry: self.cfg.fifo_on_expiry,
            skip_ended_waits: self.cfg.skip_ended_waits,
        }
    }

    /// `c`'s entry `e` in the queue stands for a waiter still waiting: its
    /// wait not over, and its client not crashed, done or giving up.
    fn live_waiter(&self, s: &State, e: &Entry) -> bool {
        let cl = &s.clients[e.token as usize];
        cl.token == e.token
            && e.waiting_at(s.now)
            && matches!(
                cl.phase,
                Phase::Attempting
                    | Phase::AcquireSent { .. }
                    | Phase::Waiting { .. }
                    | Phase::Confirming { .. }
            )
    }

    /// Ghost, after a script call that ran with the queue `before` and gave
    /// the key to `to` (`Some(None)`: kept for the caller's process line;
    /// `None`: no grant): FIFO. The new owner passes over no live waiter
    /// queued ahead of it (every one, if it was not queued); a hand-over
    /// never goes to an entry whose wait is over; entries dropped otherwise
    /// are skipped ones (the caller's own dequeue aside).
    fn line_ghost(&self, s: &mut State, before: &[Entry], to: Option<Option<u8>>, caller: u8) {
        let now = s.now;
        if let Some(to) = to {
            let at = to.and_then(|t| before.iter().position(|e| e.token == t));
            let ahead = &before[..at.unwrap_or(before.len())];
            if ahead.iter().any(|e| self.live_waiter(s, e)) {
                s.ghost.overtaken = true;
            }
            if let Some(i) = at
                && to != Some(caller)
                && !before[i].waiting_at(now)
            {
                s.ghost.handed_to_ended = true;
            }
        }
        for e in before {
            let kept = s.server.queue.iter().any(|q| q.token == e.token);
            if !kept && Some(Some(e.token)) != to && e.token != caller {
                // A live waiter's entry must never be dropped.
                if self.live_waiter(s, e) {
                    s.ghost.overtaken = true;
                }
                s.ghost.skipped_ended = true;
                if s.clients[e.token as usize].phase == Phase::Crashed {
                    s.ghost.skipped_crashed = true;
                }
            }
        }
    }

    /// acquire.rs:230: a grant above the counter a busy attempt saw was
    /// sent after that attempt ran (every grant, for the old client).
    fn fresh(&self, cl: &Client, fence: u8) -> bool {
        !self.cfg.check_stale_grants || fence > cl.fence_seen
    }

    /// The script a step sends, for traces: `mutex` (a file), or shared.lua
    /// with `op`.
    fn script(&self, mutex: &'static str, op: &'static str) -> String {
        match self.cfg.shared {
            None => mutex.to_string(),
            Some(_) => format!("shared.lua {op}"),
        }
    }

    /// A script handed the lease to `to` with `fence`: a token issued, a
    /// lease of `to`'s starts, and the notice is published to every
    /// subscribed process (release.lua's and acquire.lua's `PUBLISH`, shared.lua `promote`).
    pub(crate) fn handed(&self, s: &mut State, to: u8, fence: u8) {
        self.issued(s, fence);
        s.clients[to as usize].lease_ended = false;
        let notice = Notice::Grant { to, fence };
        for other in &mut s.clients {
            if other.subscribed && other.phase != Phase::Crashed {
                other.inbox.push(notice);
            }
        }
    }

    pub(crate) fn issued(&self, s: &mut State, fence: u8) {
        if fence <= s.ghost.issued_max {
            s.ghost.fence_not_increasing = true;
        }
        if fence > s.ghost.issued_max + 1 {
            s.ghost.gap = true;
        }
        s.ghost.issued_max = s.ghost.issued_max.max(fence);
    }

    /// acquire.rs:288-316 and watchdog/mod.rs:74-112.
    fn hold(&self, s: &mut State, c: u8, fence: u8, sent: u8, granted: u8, log: &mut Log) {
        let now = s.now;
        let cl = &mut s.clients[c as usize];
        cl.phase = Phase::Hold;
        cl.fencing = fence;
        cl.valid_until = sent + granted;
        cl.wd = Some(Watch {
            due: sent + granted / 3,
            busy: None,
        });
        cl.acquired_at = now;
        // The wait handle is dropped with the acquisition.
        cl.registered = false;
        cl.notified = false;
        let until = cl.valid_until;
        log.say(|| format!("{}: holds, fencing {fence}, valid until t={until}", name(c)));
        if self.cfg.in_line(c) {
            // acquire.rs:331 `Local::hold` (local.rs:369-398), then the
            // `Representing` duty ends (request.rs:188): nobody to promote.
            let line = &mut s.lines[self.cfg.process[c as usize] as usize];
            line.holder = Some(c);
            line.block = None;
            line.representative = false;
        }
    }

    /// acquire.rs:321-343: give up; leave the queue if we may have joined it.
    fn give_up(&self, s: &mut State, c: u8, log: &mut Log) {
        let queued = self.cfg.waits[c as usize] != 0;
        let cl = &mut s.clients[c as usize];
        cl.registered = false;
        if queued {
            cl.phase = Phase::GivingUp;
            cl.app = Some(Net::new(Req::Release { dequeue: true }, 1, false));
            log.say(|| {
                format!(
                    "{}: deadline passed, leaves the queue ({})",
                    name(c),
                    self.script("release.lua", "release")
                )
            });
        } else {
            cl.phase = Phase::Done(End::Busy);
            log.say(|| format!("{}: busy, gives up", name(c)));
            self.represent_end(s, c, log);
        }
    }

    /// The acquisition fails: the `Attempt` is dropped and releases in the
    /// background (acquire.rs:361-373, guard.rs:214-238).
    fn fail(&self, s: &mut State, c: u8, end: End, log: &mut Log) {
        let queued = self.cfg.waits[c as usize] != 0;
        let cl = &mut s.clients[c as usize];
        cl.phase = Phase::Done(end);
        cl.registered = false;
        cl.app = Some(Net::new(Req::Release { dequeue: queued }, 1, true));
        log.say(|| {
            format!(
                "{}: gives up ({end:?}); releases in the background",
                name(c)
            )
        });
        self.represent_end(s, c, log);
    }

    /// The process of `c` in traces: `A`, or `A+B` for a shared one.
    fn process_name(&self, c: u8) -> String {
        self.cfg
            .tasks_of(c)
            .map(name)
            .map(String::from)
            .collect::<Vec<_>>()
            .join("+")
    }

    /// local.rs:244-309 `Local::enter` for a task with a wait: `true` to
    /// wait in line; `false` to acquire on the server as the line's
    /// representative.
    fn enter(&self, s: &mut State, c: u8) -> bool {
        let line = &mut s.lines[self.cfg.process[c as usize] as usize];
        // local.rs:282-287: a holder lost without a release holds nothing.
        if line.holder.is_some_and(|h| s.clients[h as usize].lost) {
            line.holder = None;
            line.block = None;
        }
        // local.rs:288-291
        if line.holder.is_none() && !line.representative {
            line.representative = true;
            return false;
        }
        // local.rs:292-308
        line.waiters.push(c);
        true
    }

    /// local.rs:99-110 `Slot::promote`: with nobody holding or acquiring on
    /// the server, the first waiter acquires on the server for the line.
    fn promote(&self, s: &mut State, p: u8, log: &mut Log) {
        let now = s.now;
        let line = &mut s.lines[p as usize];
        if line.holder.is_some() || line.representative || line.waiters.is_empty() {
            return;
        }
        let w = line.waiters.remove(0);
        line.representative = true;
        s.ghost.line_to_server = true;
        // request.rs:182-184 then acquire.rs:86-124: what is left of the
        // wait (at least 1 ms: the deadline, at the earliest now).
        let cl = &mut s.clients[w as usize];
        cl.deadline = cl.deadline.max(now);
        cl.last_busy = now;
        cl.phase = Phase::Attempting;
        log.say(|| format!("{}: acquires on the server for its line", name(w)));
    }

    /// local.rs:217-226 `Representing::drop`: `c`'s acquisition on the
    /// server ended without holding.
    fn represent_end(&self, s: &mut State, c: u8, log: &mut Log) {
        if self.cfg.in_line(c) {
            let p = self.cfg.process[c as usize];
            s.lines[p as usize].representative = false;
            self.promote(s, p, log);
        }
    }

    /// local.rs:401-416 `Local::end`: `c`'s lease goes back to the server.
    fn line_end(&self, s: &mut State, c: u8, log: &mut Log) {
        if !self.cfg.in_line(c) {
            return;
        }
        let p = self.cfg.process[c as usize];
        let line = &mut s.lines[p as usize];
        if line.holder == Some(c) {
            line.holder = None;
            line.block = None;
            self.promote(s, p, log);
        }
    }

    /// local.rs:419-426 `Local::has_waiters`.
    fn has_waiters(&self, s: &State, c: u8) -> bool {
        self.cfg.in_line(c) && {
            let line = &s.lines[self.cfg.process[c as usize] as usize];
            line.holder == Some(c) && !line.waiters.is_empty()
        }
    }

    /// local.rs:509-585 `hand_on`, from the top of its loop; `fresh`: the
    /// first token of a block just reserved.
    fn hand_on(&self, s: &mut State, c: u8, fresh: Option<u8>, log: &mut Log) {
        let now = s.now;
        let cl = &s.clients[c as usize];
        // local.rs:518-520: somebody to hand on to, and the lease sure
        // beyond `MARGIN` (less than a tick: sure at `now`).
        if !self.has_waiters(s, c) || cl.lost || now >= cl.valid_until {
            log.say(|| {
                format!(
                    "{}: nobody to hand on to, or the lease is not sure",
                    name(c)
                )
            });
            self.release_to_server(s, c, false, log);
            return;
        }
        let p = self.cfg.process[c as usize] as usize;
        // local.rs:521-529 and 432-470 `take_token` (no prefetch, no
        // `BLOCK_FOR`: a block is used until it runs out).
        let taken = fresh.or_else(|| {
            let (next, top) = s.lines[p].block.as_mut()?;
            (*next <= *top).then(|| {
                *next += 1;
                *next - 1
            })
        });
        let Some(fencing) = taken else {
            // local.rs:530-536: reserve a block.
            let cl = &mut s.clients[c as usize];
            cl.phase = Phase::HandingOn;
            cl.app = Some(Net::new(Req::Reserve, 0, false));
            log.say(|| format!("{}: sends reserve.lua to hand on in its process", name(c)));
            return;
        };
        // local.rs:549-566 `pass`, 567-571 `Watchdog::hand_on` (the same
        // entry: validity and a renewal in flight go along).
        let w = s.lines[p].waiters.remove(0);
        s.lines[p].holder = Some(w);
        let giver = std::mem::replace(
            &mut s.clients[c as usize].phase,
            Phase::Done(End::ReleasedOk),
        );
        debug_assert!(matches!(giver, Phase::Hold | Phase::HandingOn));
        let from = &mut s.clients[c as usize];
        let (token, valid_until, wd, wd_net, lease_ended) = (
            from.token,
            from.valid_until,
            from.wd.take(),
            from.wd_net.take(),
            from.lease_ended,
        );
        // guard.rs:153: `release()` answers `Ok`.
        if from.ended_at_release {
            s.ghost.false_ok = true;
        }
        let to = &mut s.clients[w as usize];
        to.phase = Phase::Hold;
        to.token = token;
        to.fencing = fencing;
        to.valid_until = valid_until;
        to.wd = wd;
        to.wd_net = wd_net;
        to.lost = false;
        to.acquired_at = now;
        to.lease_ended = lease_ended;
        self.issued(s, fencing);
        s.ghost.handed_locally = true;
        log.say(|| {
            format!(
                "{}: hands the lease on to {} (fencing {fencing}, valid until t={valid_until}); release() -> Ok",
                name(c),
                name(w)
            )
        });
    }

    /// guard.rs:157-221: release.lua (after `Local::end`).
    fn release_to_server(&self, s: &mut State, c: u8, was_lost: bool, log: &mut Log) {
        let now = s.now;
        self.line_end(s, c, log);
        let cl = &mut s.clients[c as usize];
        cl.wd = None;
        cl.wd_net = None; // unwatched: a renewal in flight is ignored
        let valid = !cl.lost && now < cl.valid_until;
        cl.phase = Phase::Releasing { was_lost, valid };
        cl.app = Some(Net::new(Req::Release { dequeue: false }, 1, false));
        log.say(|| {
            format!(
                "{}: sends {} (lease valid: {})",
                name(c),
                self.script("release.lua", "release"),
                if valid { "yes" } else { "no" }
            )
        });
    }

    fn receive(&self, s: &mut State, c: u8, conn: Conn, log: &mut Log) {
        let now = s.now;
        let ttl = self.cfg.ttl;
        let net = *self.net_mut(s, c, conn);
        let ci = c as usize;
        match conn {
            Conn::App => s.clients[ci].app = None,
            Conn::Watchdog => s.clients[ci].wd_net = None,
        }
        let resp = match net.stage {
            Stage::Replied(r) => Some(r),
            Stage::Failed => None,
            Stage::Sent => unreachable!(),
        };
        // A broken connection: requests that re-send do so (redis.rs:328-339).
        if resp.is_none() && net.resends > 0 && s.clients[ci].phase != Phase::Crashed {
            s.clients[ci].app = Some(Net {
                stage: Stage::Sent,
                resends: net.resends - 1,
                resent: true,
                ..net
            });
            log.say(|| format!("{}: connection error; sends {:?} again", name(c), net.req));
            return;
        }
        if net.background || !s.clients[ci].active() {
            log.say(|| format!("{}: background {:?} ends: {resp:?}", name(c), net.req));
            return;
        }
        match (conn, net.req, s.clients[ci].phase) {
            (Conn::Watchdog, Req::Renew, _) => {
                // watchdog/mod.rs:246-294
                let Some(wd) = s.clients[ci].wd else {
                    return;
                };
                let sent = wd.busy.expect("a renewal in flight");
                match resp {
                    Some(Resp::Extended(true)) => {
                        s.clients[ci].valid_until = sent + ttl;
                        s.clients[ci].wd = Some(Watch {
                            due: sent + ttl / 3,
                            busy: None,
                        });
                        log.say(|| {
                            format!(
                                "{}: watchdog: renewed, valid until t={}",
                                name(c),
                                sent + ttl
                            )
                        });
                    }
                    Some(_) => {
                        s.clients[ci].lost = true;
                        s.clients[ci].wd = None;
                        log.say(|| format!("{}: watchdog: not ours any more, lost()", name(c)));
                    }
                    None if now >= s.clients[ci].valid_until => {
                        s.clients[ci].lost = true;
                        s.clients[ci].wd = None;
                        log.say(|| {
                            format!(
                                "{}: watchdog: renewal failed past the validity, lost()",
                                name(c)
                            )
                        });
                    }
                    None => {
                        s.clients[ci].wd = Some(Watch {
                            due: now.min(s.clients[ci].valid_until),
                            busy: None,
                        });
                        log.say(|| format!("{}: watchdog: renewal failed, retries", name(c)));
                    }
                }
            }
            (Conn::App, Req::Acquire { .. }, Phase::AcquireSent { sent }) => match resp {
                // acquire.rs:181-184 then 130-132
                Some(Resp::Acquire(AcqReply::Granted(f))) => {
                    log.say(|| format!("{}: acquire answered granted", name(c)));
                    self.hold(s, c, f, sent, ttl, log);
                }
                Some(Resp::Acquire(AcqReply::Busy { remaining, fence })) => {
                    // acquire.rs:185-188
                    s.clients[ci].last_busy = s.clients[ci].last_busy.max(sent);
                    if self.cfg.check_stale_grants {
                        s.clients[ci].fence_seen = s.clients[ci].fence_seen.max(fence);
                    }
                    log.say(|| format!("{}: acquire answered busy ({remaining} ticks)", name(c)));
                    if !s.clients[ci].registered {
                        // acquire.rs:136-142
                        if now >= s.clients[ci].deadline {
                            self.give_up(s, c, log);
                        } else {
                            // acquire.rs:217-221: register (subscribe), then try again.
                            s.clients[ci].registered = true;
                            s.clients[ci].subscribed = true;
                            s.clients[ci].phase = Phase::Attempting;
                            log.say(|| format!("{}: registers for notices", name(c)));
                        }
                    } else {
                        // acquire.rs:226-240
                        if s.clients[ci].granted != 0 {
                            let fence = std::mem::take(&mut s.clients[ci].granted);
                            if self.fresh(&s.clients[ci], fence) {
                                s.clients[ci].phase = Phase::Confirming { fence, sent: None };
                                log.say(|| {
                                    format!("{}: a grant is waiting (fencing {fence})", name(c))
                                });
                            } else {
                                // acquire.rs:233: stale, tries again at once.
                                s.clients[ci].phase = Phase::Attempting;
                                s.ghost.stale_ignored = true;
                                log.say(|| {
                                    format!(
                                        "{}: a grant is waiting (fencing {fence}), stale (counter seen {}): tries again",
                                        name(c),
                                        s.clients[ci].fence_seen
                                    )
                                });
                            }
                        } else if now >= s.clients[ci].deadline {
                            self.give_up(s, c, log);
                        } else {
                            let retry_at = (now + remaining).min(s.clients[ci].deadline);
                            s.clients[ci].phase = Phase::Waiting { retry_at };
                            log.say(|| {
                                format!("{}: waits until a notice or t={retry_at}", name(c))
                            });
                        }
                    }
                }
                Some(_) => unreachable!(),
                None => {
                    // acquire.rs:190-209 (a killed connection: not a timeout;
                    // the back-off is far below a tick).
                    if s.clients[ci].retries < 8
                        && (now < s.clients[ci].deadline || s.clients[ci].retries == 0)
                    {
                        s.clients[ci].retries += 1;
                        s.clients[ci].phase = Phase::Attempting;
                        log.say(|| format!("{}: connection error; tries again", name(c)));
                    } else {
                        self.fail(s, c, End::AcquireError, log);
                    }
                }
            },
            (
                Conn::App,
                Req::Confirm,
                Phase::Confirming {
                    fence,
                    sent: Some(sent),
                },
            ) => match resp {
                // acquire.rs:279-283
                Some(Resp::Extended(true)) => self.hold(s, c, fence, sent, ttl, log),
                Some(_) => {
                    s.clients[ci].phase = Phase::Attempting;
                    log.say(|| {
                        format!(
                            "{}: the hand-over ran out before it was confirmed; tries again",
                            name(c)
                        )
                    });
                }
                None => self.fail(s, c, End::AcquireError, log),
            },
            (Conn::App, Req::Release { .. }, Phase::Releasing { was_lost, valid }) => {
                // guard.rs:156-189 with redis.rs:364-384
                let released = match resp {
                    Some(Resp::Release(RelReply::NotOurs)) if net.resent => Some(Released::Gone),
                    Some(Resp::Release(RelReply::NotOurs)) => Some(Released::NotOurs),
                    Some(Resp::Release(_)) => Some(Released::Yes),
                    Some(_) => unreachable!(),
                    None => None,
                };
                let end = match released {
                    Some(Released::Yes) if was_lost => End::ReleasedLost,
                    Some(Released::Yes) => End::ReleasedOk,
                    Some(Released::Gone) if valid => End::ReleasedOk,
                    Some(Released::Gone | Released::NotOurs) => {
                        s.clients[ci].lost = true;
                        End::ReleasedLost
                    }
                    None => End::ReleaseError,
                };
                // Ghost checks: `Lost` only if the lease may have ended;
                // `Ok` only if it had not.
                let may_have_ended = s.clients[ci].lease_ended || was_lost || !valid;
                if end == End::ReleasedLost && !may_have_ended {
                    s.ghost.false_lost = true;
                }
                if end == End::ReleasedOk && s.clients[ci].ended_at_release {
                    s.ghost.false_ok = true;
                }
                s.clients[c as usize].phase = Phase::Done(end);
                log.say(|| format!("{}: release() -> {end:?}", name(c)));
            }
            (Conn::App, Req::Reserve, Phase::HandingOn) => match resp {
                // local.rs:537-540: keep the block, hand on its first token.
                Some(Resp::Reserved(top)) if top != 0 => {
                    let line = &mut s.lines[self.cfg.process[ci] as usize];
                    let first = top + 1 - self.cfg.block;
                    // local.rs:475-481 `set_block` (only while still the holder).
                    let fresh = (line.holder == Some(c)).then(|| {
                        line.block = Some((first + 1, top));
                        if self.cfg.hand_on_below_block {
                            first - 1
                        } else {
                            first
                        }
                    });
                    log.say(|| format!("{}: reserved tokens up to {top}", name(c)));
                    self.hand_on(s, c, fresh, log);
                }
                // local.rs:541-548: 0 or an error: release to the server.
                Some(Resp::Reserved(_)) | None => {
                    log.say(|| {
                        format!(
                            "{}: reserve {}; releases to the server",
                            name(c),
                            if resp.is_some() {
                                "answered 0"
                            } else {
                                "failed"
                            }
                        )
                    });
                    self.release_to_server(s, c, false, log);
                }
                Some(_) => unreachable!(),
            },
            (Conn::App, Req::Release { .. }, Phase::GivingUp) => {
                // acquire.rs:325-342: an error leaves the clean-up to the
                // background release.
                if resp.is_some() {
                    s.clients[ci].phase = Phase::Done(End::Busy);
                    log.say(|| format!("{}: left the queue; acquire() -> Busy", name(c)));
                    self.represent_end(s, c, log);
                } else {
                    self.fail(s, c, End::Busy, log);
                }
            }
            (conn, req, phase) => unreachable!("{conn:?} {req:?} in {phase:?}"),
        }
    }
}

#[derive(Clone, Copy)]
enum Released {
    Yes,
    NotOurs,
    Gone,
}

impl Model for LockModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            now: 0,
            server: Server::default(),
            shared: Holders::default(),
            clients: (0..self.cfg.waits.len() as u8).map(Client::new).collect(),
            store: Store::default(),
            budget: self.cfg.faults,
            other_keys: self.cfg.other_keys,
            lines: vec![
                Line::default();
                self.cfg
                    .process
                    .iter()
                    .map(|&p| p as usize + 1)
                    .max()
                    .unwrap_or(0)
            ],
            ghost: Ghost {
                free_since: Some(0),
                ..Ghost::default()
            },
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        let mut urgent = Vec::new();
        let mut lazy = Vec::new();
        for c in 0..s.clients.len() as u8 {
            self.client_actions(s, c, &mut urgent, &mut lazy);
        }
        let mut faults = Vec::new();
        for c in 0..s.clients.len() as u8 {
            self.fault_actions(s, c, &mut faults);
        }
        let busy = self.needs_time(s);
        // Between this key's round trips (where time may pass): where in a
        // tick another key's token falls does not matter to this key.
        lazy.extend(faults);
        if urgent.is_empty() && busy && s.other_keys > 0 {
            lazy.push(Action::OtherKey);
        }
        check::schedule(actions, urgent, lazy, busy, Action::Tick);
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        check::next_state(self, last, action)
    }

    fn within_boundary(&self, s: &State) -> bool {
        s.now <= 40
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = match &self.cfg.shared {
            None => self.mutex_properties(),
            Some(shared) => shared_properties(shared, self.cfg.faults.total > 0),
        };
        properties.push(Property::always(
            "a holder that believes its lease valid owns the key",
            |_: &LockModel, s: &State| {
                s.clients
                    .iter()
                    .all(|c| !c.believes_valid(s.now) || s.owns(c.token))
            },
        ));
        properties.extend(check::never_set![LockModel;
            "a holder not paused is told lost before it acts past its lease" =>
                ghost.acted_past_lease,
            "fencing tokens issued strictly increase" => ghost.fence_not_increasing,
            "a fenced store accepts strictly increasing tokens" => ghost.store_accepted_stale,
            "release answers Lost only when the lease may have ended" => ghost.false_lost,
            "release answers Ok only when the lease had not ended when it was called" =>
                ghost.false_ok,
        ]);
        properties.extend([
            Property::always(
                "no queue entry outlives the waits that made it",
                |m: &LockModel, s: &State| {
                    s.queued().next().is_none()
                        || s.clients.iter().enumerate().any(|(i, c)| {
                            // acquire.rs:167 sends at least 1 ms of wait: a tick here.
                            c.queued_ever
                                && s.now < c.deadline + m.cfg.ttl + 1
                                && m.cfg.waits[i] != 0
                        })
                },
            ),
            Property::always(
                "a queue entry is in the queue once",
                |_: &LockModel, s: &State| {
                    let queued: Vec<u8> = s.queued().collect();
                    queued
                        .iter()
                        .enumerate()
                        .all(|(i, t)| !queued[..i].contains(t))
                },
            ),
            Property::always(
                "without faults no waiter waits on a free key for more than a lease",
                |m: &LockModel, s: &State| {
                    s.ghost.faults > 0
                        || s.ghost.free_since.is_none_or(|t| {
                            s.now <= t + m.cfg.ttl
                                || !s.clients.iter().any(|c| {
                                    matches!(
                                        c.phase,
                                        Phase::Attempting
                                            | Phase::AcquireSent { .. }
                                            | Phase::Waiting { .. }
                                            | Phase::Confirming { .. }
                                            | Phase::InLine
                                    ) && s.now < c.deadline
                                })
                        })
                },
            ),
            Property::eventually(
                "every acquire ends, and the key, queue and mark go",
                |_: &LockModel, s: &State| {
                    s.clients.iter().all(|c| !c.active())
                        && !s.held()
                        && s.queued().next().is_none()
                },
            ),
            // Sanity: the model reaches the situations the properties are about.
            Property::sometimes(
                "a release hands the lock to a waiter",
                |_: &LockModel, s: &State| {
                    s.clients
                        .iter()
                        .any(|c| matches!(c.phase, Phase::Hold) && c.fencing >= 2)
                },
            ),
            // Without a pause or a lost message no lease is lost (a crash
            // leaves nobody to tell): then this is vacuously true.
            Property::sometimes("a holder is told lost", |m: &LockModel, s: &State| {
                let f = m.cfg.faults;
                f.total == 0
                    || f.pause + f.lost_request + f.lost_reply == 0
                    || s.clients.iter().any(|c| c.lost)
            }),
            Property::sometimes("a waiter gives up", |_: &LockModel, s: &State| {
                s.clients.iter().any(|c| c.phase == Phase::Done(End::Busy))
            }),
        ]);
        if self.cfg.other_keys > 0 {
            properties.push(Property::sometimes(
                "another key's token leaves a gap in this key's",
                |_: &LockModel, s: &State| s.ghost.gap,
            ));
        }
        if self
            .cfg
            .waits
            .iter()
            .enumerate()
            .any(|(c, &w)| w != 0 && self.cfg.in_line(c as u8))
        {
            properties.push(Property::sometimes(
                "a release hands the lease on within its process",
                |_: &LockModel, s: &State| s.ghost.handed_locally,
            ));
            properties.push(Property::sometimes(
                "a task waiting in line goes to the server",
                |_: &LockModel, s: &State| s.ghost.line_to_server,
            ));
        }
        // The stale hand-over needs three clients and a pause (and, for a
        // semaphore, more takers than the three of a limit of two).
        if self.cfg.check_stale_grants
            && self.cfg.waits.len() >= 3
            && self.cfg.faults.pause > 0
            && self.cfg.shared.as_ref().is_none_or(|sh| sh.limit == 0)
        {
            properties.push(Property::sometimes(
                "a waiter ignores a stale hand-over",
                |_: &LockModel, s: &State| s.ghost.stale_ignored,
            ));
        }
        properties
    }
}

impl LockModel {
    /// The properties of a mutex, besides those of every configuration.
    fn mutex_properties(&self) -> Vec<Property<LockModel>> {
        let mut properties = vec![Property::always(
            "at most one holder believes its lease valid",
            |_: &LockModel, s: &State| {
                s.clients.iter().filter(|c| c.believes_valid(s.now)).count() <= 1
            },
        )];
        properties.extend(check::never_set![LockModel;
            "no waiter is overtaken by a later arrival" => ghost.overtaken,
            "no hand-over goes to a waiter whose wait is over" => ghost.handed_to_ended,
        ]);
        let cfg = &self.cfg;
        let processes = |min_wait: u8| {
            let mut ps: Vec<u8> = (0..cfg.waits.len())
                .filter(|&c| cfg.waits[c] >= min_wait)
                .map(|c| cfg.process[c])
                .collect();
            ps.sort_unstable();
            ps.dedup();
            ps.len()
        };
        // A holder's lease runs out (a crash or a pause) with two other
        // processes queued for longer than a lease.
        let expiries = cfg.faults.crash > 0 || cfg.faults.pause > 0;
        if cfg.fifo_on_expiry && expiries && processes(0) >= 3 && processes(cfg.ttl + 1) >= 2 {
            properties.push(Property::sometimes(
                "a key whose lease ran out goes to the head of its line",
                |_: &LockModel, s: &State| s.ghost.expiry_handed,
            ));
        }
        // A waiter dies in line and a holder releases after its wait.
        let short = cfg.waits.iter().any(|&w| w != 0 && w <= cfg.hold_max);
        if cfg.skip_ended_waits && cfg.faults.crash > 0 && processes(0) >= 3 && short {
            properties.push(Property::sometimes(
                "a script skips the entry of a waiter that died in line",
                |_: &LockModel, s: &State| s.ghost.skipped_crashed,
            ));
        }
        properties
    }
}

impl Narrate for LockModel {
    fn apply(&self, s: &mut State, action: Action, log: &mut Log) {
        self.step(s, action, log);
    }

    fn now(s: &State) -> u8 {
        s.now
    }

    fn summarize(&self, s: &State) -> String {
        let mut out = format!("t={} key ", s.now);
        match s.server.lock {
            Some(v) => {
                let _ = write!(
                    out,
                    "held by {}{} until t={}",
                    name(v.owner),
                    if v.marked { "+" } else { "" },
                    v.expires
                );
            }
            None => out.push_str("free"),
        }
        if self.cfg.shared.is_some() {
            out = format!("t={} {}", s.now, s.shared.summary());
        }
        let _ = write!(out, ", fence counter {}", s.server.fence);
        if !s.server.queue.is_empty() {
            let q: Vec<String> = s
                .server
                .queue
                .iter()
                .map(|e| name(e.token).to_string())
                .collect();
            let _ = write!(out, ", queue [{}]", q.join(", "));
        }
        for (i, c) in s.clients.iter().enumerate() {
            let _ = write!(out, "; {}: {:?}", name(i as u8), c.phase);
            if matches!(c.phase, Phase::Hold) {
                let _ = write!(
                    out,
                    " (token {}, fencing {}, valid until t={}, lost {})",
                    name(c.token),
                    c.fencing,
                    c.valid_until,
                    c.lost
                );
            }
        }
        for (p, line) in s.lines.iter().enumerate() {
            if line.holder.is_some() || !line.waiters.is_empty() || line.representative {
                let _ = write!(out, "; line of process {p}: {line:?}");
            }
        }
        out
    }
}

// The read-write lock and semaphore server (shared.rs) run by this
// model's clients: its configuration, its requests, its properties.

impl LockConfig {
    /// Clients of a read-write lock (`limit` 0) or a semaphore of `limit`
    /// permits, one per mode, each waiting `wait` ticks, with the lock
    /// model's defaults otherwise.
    pub fn new_shared(modes: Vec<Mode>, limit: u8, wait: u8, faults: Faults) -> Self {
        let mut cfg = LockConfig::new(modes.len(), wait, faults);
        cfg.shared = Some(SharedConfig {
            modes,
            limit,
            admit_past_queue: false,
        });
        cfg
    }
}

impl SharedGhost {
    /// After every step: since when the head of the queue fits (room freed
    /// by a lease that ran out, or by the waiter ahead leaving the queue,
    /// neither of which promotes).
    pub(crate) fn track(s: &mut State, limit: u8) {
        let fits = s
            .shared
            .queue
            .first()
            .is_some_and(|head| s.shared.fits(head.exclusive, limit));
        let since = &mut s.ghost.shared.head_fits_since;
        match (fits, *since) {
            (true, None) => *since = Some(s.now),
            (false, Some(_)) => *since = None,
            _ => {}
        }
    }
}

impl LockModel {
    /// Redis runs client `c`'s `req` through shared.lua (shared.rs
    /// `acquire_shared`, `extend_shared`, `release_shared`; the watchdog's
    /// renewal and `confirm` are `extend`).
    pub(crate) fn exec_shared(&self, s: &mut State, c: u8, req: Req) -> (Resp, String) {
        let sh = self.cfg.shared.as_ref().expect("a shared configuration");
        let call = Call {
            now: s.now,
            token: s.clients[c as usize].token,
            lease: self.cfg.ttl,
            exclusive: sh.modes[c as usize] == Mode::Write,
            limit: sh.limit,
            cap: self.cfg.handoff,
        };
        let before: Vec<u8> = s.queued().collect();
        let mut fence = s.server.fence;
        let (resp, taken, mut text) = match req {
            Req::Acquire { wait, .. } => {
                let (r, taken) = s
                    .shared
                    .acquire(&call, wait, &mut fence, sh.admit_past_queue);
                if let AcqReply::Granted(_) = r {
                    // Ghost: a lease of c's starts (or is re-armed) now.
                    s.clients[c as usize].lease_ended = false;
                }
                let text = match r {
                    AcqReply::Granted(f) => format!("acquire: granted, fencing {f}"),
                    AcqReply::Busy { remaining, fence } if wait != 0 => {
                        let queued = s.shared.queue.iter().position(|e| e.token == c);
                        if let Some(i) = queued {
                            s.clients[c as usize].queued_ever = true;
                            if !call.exclusive && s.shared.queue[..i].iter().any(|e| e.exclusive) {
                                s.ghost.shared.behind_writer = true;
                            }
                        }
                        format!(
                            "acquire: busy for {remaining} more ticks, counter {fence}; {} queued",
                            name(c)
                        )
                    }
                    AcqReply::Busy { remaining, .. } => {
                        format!("acquire: busy for {remaining} more ticks")
                    }
                };
                (Resp::Acquire(r), taken, text)
            }
            Req::Confirm | Req::Renew => {
                let ok = s.shared.extend(&call);
                let text = format!("extend: {}", if ok { "re-armed" } else { "not ours (0)" });
                (Resp::Extended(ok), Taken::new(), text)
            }
            Req::Release { dequeue } => {
                let (ours, taken) = s.shared.release(&call, dequeue, &mut fence);
                let (r, text) = if ours {
                    (RelReply::Released, "release: released")
                } else {
                    (RelReply::NotOurs, "release: not ours (0)")
                };
                (Resp::Release(r), taken, text.to_string())
            }
            Req::Reserve => unreachable!("only a mutex's line reserves"),
        };
        s.server.fence = fence;
        // Ghost: FIFO. A taker overtakes whoever was queued ahead of it (or
        // at all, if it was not queued) and still is.
        let after: Vec<u8> = s.queued().collect();
        for &(who, _) in &taken {
            let ahead = match before.iter().position(|&t| t == who) {
                Some(i) => &before[..i],
                None => &before[..],
            };
            if ahead.iter().any(|t| after.contains(t)) {
                s.ghost.shared.overtaken = true;
            }
        }
        for (who, f) in taken {
            if who == call.token {
                self.issued(s, f);
            } else {
                // shared.lua:91-97: a notice to each waiter granted.
                self.handed(s, who, f);
                s.ghost.shared.promoted = true;
                let _ = write!(
                    text,
                    ", granted {} (fencing {f}, lease {}), notice published",
                    name(who),
                    self.cfg.ttl.min(self.cfg.handoff)
                );
            }
        }
        (resp, format!("shared.lua {text}"))
    }
}

/// The properties of a read-write lock or a semaphore, besides those of
/// every configuration (see `LockModel::properties`).
/// `faults`: the configuration has some.
pub(crate) fn shared_properties(cfg: &SharedConfig, faults: bool) -> Vec<Property<LockModel>> {
    let mut properties = Vec::new();
    let readers = cfg.modes.iter().filter(|&&m| m == Mode::Read).count();
    if cfg.limit == 0 {
        properties.push(Property::always(
            "no writer believes its lease valid while another holder does",
            |m: &LockModel, s: &State| {
                let (writers, readers) = valid_holders(m, s);
                writers == 0 || (writers == 1 && readers == 0)
            },
        ));
        if readers >= 2 {
            properties.push(Property::sometimes(
                "two readers hold at once",
                |m: &LockModel, s: &State| valid_holders(m, s).1 >= 2,
            ));
        }
    } else {
        properties.extend([
            Property::always(
                "no more holders believe their leases valid than the limit",
                |m: &LockModel, s: &State| valid_holders(m, s).1 <= limit(m),
            ),
            Property::sometimes(
                "as many holders as the limit hold at once",
                |m: &LockModel, s: &State| valid_holders(m, s).1 == limit(m),
            ),
        ]);
    }
    properties.push(Property::always(
        "the server never keeps a writer with a holder, or holders past the limit",
        |m: &LockModel, s: &State| {
            let held = s.shared.holders.len();
            (s.shared.writer.is_none() || held == 0) && (limit(m) == 0 || held <= limit(m))
        },
    ));
    properties.extend(never_set![LockModel;
        "no grant overtakes a waiter still queued (FIFO)" => ghost.shared.overtaken,
    ]);
    properties.push(Property::always(
        "without faults a waiter that fits at the head of the queue is granted within a lease",
        |m: &LockModel, s: &State| {
            s.ghost.faults > 0
                || s.ghost
                    .shared
                    .head_fits_since
                    .is_none_or(|t| s.now <= t + m.cfg.ttl)
        },
    ));
    if faults && cfg.limit == 0 {
        // A lease that runs out (a pause or a crash) frees room unannounced.
        properties.push(Property::sometimes(
            "the head of the queue fits, ungranted (room freed without a promote)",
            |_: &LockModel, s: &State| s.ghost.shared.head_fits_since.is_some(),
        ));
    }
    properties.push(Property::sometimes(
        "a script grants a queued waiter",
        |_: &LockModel, s: &State| s.ghost.shared.promoted,
    ));
    if readers >= 2 && cfg.modes.contains(&Mode::Write) && cfg.limit == 0 {
        properties.push(Property::sometimes(
            "a reader queues behind a queued writer",
            |_: &LockModel, s: &State| s.ghost.shared.behind_writer,
        ));
    }
    properties
}

fn limit(m: &LockModel) -> usize {
    m.cfg.shared.as_ref().map_or(0, |sh| sh.limit as usize)
}

/// Holders that believe their leases valid: `(writers, shared holders)`.
fn valid_holders(m: &LockModel, s: &State) -> (usize, usize) {
    let modes = &m.cfg.shared.as_ref().expect("a shared configuration").modes;
    let mut counts = (0, 0);
    for (c, mode) in s.clients.iter().zip(modes) {
        if c.believes_valid(s.now) {
            match mode {
                Mode::Write => counts.0 += 1,
                Mode::Read | Mode::Permit => counts.1 += 1,
            }
        }
    }
    counts
}
