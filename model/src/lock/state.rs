//! The clients' and the system's state, and the actions that step it.

use super::*;

/// A script call and what became of it.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Req {
    /// The uncontended acquire, a plain `SET key token NX PX ttl`
    /// (plain.rs `acquire_plain`), then acquire.lua with this wait if the
    /// key is taken.
    SetNx {
        /// The wait of the acquire.lua call that follows a taken key.
        wait: u8,
    },
    /// acquire.lua with this wait (`0`: try once).
    Acquire {
        /// `ARGV[4]`, in ticks.
        wait: u8,
    },
    /// extend.lua, from `Acquisition::confirm`.
    Confirm,
    /// release.lua; `dequeue`: leave the queue too.
    Release {
        /// `ARGV[4]` is our entry.
        dequeue: bool,
    },
    /// extend_many.lua, from the watchdog.
    Renew,
    /// reserve.lua, from `hand_on` (client/handover.rs).
    Reserve,
    /// mint.lua, from `Held::fencing_token` (held.rs).
    Mint,
    /// The plain release, `DELIFEQ`, `DELEX .. IFEQ` or unlock.lua (plain.rs `unlock`),
    /// then release.lua (not leaving the queue) if it deleted nothing.
    Unlock,
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
    /// The plain `SET NX`'s answer `OK` (a nil is followed by acquire.lua
    /// in the same step, whose answer comes back).
    SetNx,
    /// mint.lua's answer: the token, or `0`.
    Minted(u8),
    /// The plain release's answer `1`, deleted (a `0` is followed by
    /// release.lua in the same step, whose answer comes back).
    Unlocked,
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
    /// A copy of it was sent before and its answer lost (`RedisBackend::send_release`).
    pub resent: bool,
}

impl Net {
    pub(super) fn new(req: Req, resends: u8, background: bool) -> Self {
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
    /// About to send an attempt (`Acquisition::attempt`).
    Attempting,
    /// The attempt sent at `sent` is in flight.
    AcquireSent {
        /// Its send time.
        sent: u8,
    },
    /// `Acquisition::wait_for_turn`, until `retry_at`.
    Waiting {
        /// The lease timer.
        retry_at: u8,
    },
    /// `confirm` of a hand-over with this fencing token (`Acquisition::confirm`).
    Confirming {
        /// The hand-over's fencing token.
        fence: u8,
        /// The confirming extend was sent at this time (`None`: not yet).
        sent: Option<u8>,
    },
    /// Holding the lock (a guard).
    Hold,
    /// Holding, and asking for the fencing token (`Held::fencing_token`,
    /// held.rs): mint.lua in flight. The holder waits for the answer before
    /// it writes or releases.
    Minting,
    /// `LockGuard::release` in flight.
    Releasing {
        /// `LockGuard::release`'s `was_lost`: lost before the release.
        was_lost: bool,
        /// `LockGuard::release`'s `valid`: still valid when it started.
        valid: bool,
    },
    /// `give_up` leaving the queue (`Acquisition::give_up`).
    GivingUp,
    /// Waiting in the process's line (`Local::wait`, client/local/mod.rs),
    /// until `deadline`.
    InLine,
    /// `release()` handing the lease on in the process (`LockGuard::release`,
    /// `hand_on` in client/handover.rs): reserve.lua in flight.
    HandingOn,
    /// Finished.
    Done(End),
    /// The process died.
    Crashed,
}

/// The watchdog's entry for a held lease (`Watchdog::watch`).
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
    /// `Acquisition::deadline`.
    pub deadline: u8,
    /// `Acquisition::last_busy`.
    pub last_busy: u8,
    /// `Acquisition::fence_seen`, the highest counter a busy attempt saw (kept at 0
    /// without [`LockConfig::check_stale_grants`], as the old client had none).
    pub fence_seen: u8,
    /// `Acquisition::retries`.
    pub retries: u8,
    /// The process is subscribed to the key's channel.
    pub subscribed: bool,
    /// The acquisition's `WaitHandle` is registered (`WaitHandle`, backend/waiters.rs).
    pub registered: bool,
    /// `Waiter::granted` (`0`: none).
    pub granted: u8,
    /// `Waiter::handoff_seen`.
    pub handoff_seen: bool,
    /// A `Notify` permit (`Waiter::notify`).
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
    /// `Held::valid_until`.
    pub valid_until: u8,
    /// `Held::lost` cancelled: `lost()` resolved.
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
    /// Ghost: while it held, the server gave the key to another owner (or
    /// its process handed the lease on): a later holder's tenure began.
    pub superseded: bool,
    /// Ghost: its lease had ended when it called `release()`.
    pub ended_at_release: bool,
}

impl Client {
    pub(super) fn new(token: u8) -> Self {
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
            superseded: false,
            ended_at_release: false,
        }
    }

    pub(super) fn active(&self) -> bool {
        !matches!(self.phase, Phase::Done(_) | Phase::Crashed)
    }

    /// Holds a lease under watch: holding, or in `release()` handing it on
    /// (the watchdog entry stays until the hand-over or the release).
    pub(super) fn watched(&self) -> bool {
        matches!(self.phase, Phase::Hold | Phase::Minting | Phase::HandingOn)
    }

    /// Holds a guard it may use: holding, or asking for its token.
    pub fn holding(&self) -> bool {
        matches!(self.phase, Phase::Hold | Phase::Minting)
    }

    /// Believes it holds a valid lease: `Held::valid_at(now)`.
    pub fn believes_valid(&self, now: u8) -> bool {
        self.holding() && !self.lost && now < self.valid_until
    }
}

/// A violation noted by a transition (ghost state), checked by a property.
#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq)]
pub struct Ghost {
    /// A fencing token was issued that is not above every earlier one.
    pub fence_not_increasing: bool,
    /// A fencing token was issued to a holder after a later holder's
    /// tenure began (the tokens would not rise in the order holders held
    /// the key).
    pub token_after_later_holder: bool,
    /// mint.lua refused a holder (its lease had ended on the server).
    pub mint_refused: bool,
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

/// A process's line for the key (`Slot`, client/local/mod.rs; what it needs of
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
    /// Somebody holds the key on the server (a mutex's owner whose lease
    /// has not ended; a writer or a shared holder).
    pub fn held(&self) -> bool {
        self.server.lock.is_some_and(|v| v.leased_at(self.now)) || self.shared.held()
    }

    /// The key exists on the server: held, or pinned by its line past its
    /// owner's lease.
    pub fn key_exists(&self) -> bool {
        self.server.lock.is_some() || self.shared.held()
    }

    /// `token` holds the key on the server (its lease has not ended).
    pub fn owns(&self, token: u8) -> bool {
        self.server
            .lock
            .is_some_and(|v| v.owner == token && v.leased_at(self.now))
            || self.shared.owns(token)
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
    /// Client `c`'s renewal times out at its validity (`renew_call`, watchdog/mod.rs).
    RenewTimeout(u8),
    /// Client `c`, holding and not told `lost`, writes to the fenced store.
    Write(u8),
    /// Client `c`, holding without a fencing token and not told `lost`,
    /// asks for it (mint.lua).
    Mint(u8),
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
