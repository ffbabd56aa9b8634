//! The lock protocol on one Redis server, as implemented: the uncontended
//! path in plain commands (a `SET NX PX` to acquire, the server's
//! compare-and-delete to release), the acquire, extend, mint and release
//! scripts (waiter queue, the `token+deadline` mark and the pin that keeps
//! the key while a line exists, hand-over leases, notices, the slot's
//! fencing counter), the client's acquire steps (with the stale hand-over
//! rule of `fence_seen`), its watchdog, its fencing token minted on first
//! use, and its release, with a model clock and faults.
//!
//! Each transition that mirrors Rust code cites the function it follows by
//! name (`Acquisition::attempt`, with its file where the name alone is
//! ambiguous), never by line: line numbers go stale. The scripts are cited
//! by anchor, as the crate docs say (acquire.lua, "local function pin(");
//! they are pinned by hash in [`crate::scripts`], so a changed script fails
//! its test first.
//!
//! The uncontended path: an acquisition's first attempt is a plain `SET
//! NX` ([`Req::SetNx`]); only a key found taken sends acquire.lua, and
//! every attempt after a busy one goes to the script. A lock taken so has
//! no fencing token: its holder may ask for one at any moment while it
//! believes it holds, also after a pause ([`Action::Mint`], mint.lua,
//! which refuses a holder whose lease ended), and writes to the fenced
//! store only with a token. A release first sends the plain
//! compare-and-delete ([`Req::Unlock`]), and release.lua only when that
//! deleted nothing. Once somebody queues, the key is marked with its
//! owner's deadline and pinned until the longest wait in line ends, so a
//! newcomer's plain `SET NX` finds it taken and cannot pass the line; a
//! script that finds the deadline passed hands the key to the line.
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
//! Tasks of one process form its line (local hand-over, client/local/mod.rs):
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
//! switch back to the scripts before commit 7dbf470,
//! [`LockConfig::line_pins_key`] and [`LockConfig::mint_checks_owner`]
//! off break the pin and mint.lua's ownership check, for the tests that
//! show the model finds what they do.

use std::fmt::Write as _;

use stateright::{Model, Property};

use crate::check::never_set;
use crate::check::{self, Log, Narrate};
pub use crate::reply::{AcqReply, name};
use crate::shared::{self, Call, Holders, Mode, Script, SharedConfig, SharedGhost, Taken};

mod actions;
mod client;
mod exec;
mod properties;
mod receive;
mod server;
mod shared_lock;
mod state;
mod step;

pub use server::*;
pub use state::*;

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

    /// One crash in a run, nothing else.
    pub const ONE_CRASH: Faults = Faults {
        crash: 1,
        total: 1,
        ..Faults::NONE
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
    /// `HANDOFF_LEASE` (backend/mod.rs), in ticks.
    pub handoff: u8,
    /// A holder releases at most this many ticks after it acquired.
    pub hold_max: u8,
    /// Clients start their acquire at some tick up to this one.
    pub start_by: u8,
    /// How long a pause lasts, in ticks (more than a lease).
    pub pause_len: u8,
    /// Fault budgets.
    pub faults: Faults,
    /// `false`: today's `Acquisition::confirm` trusts a hand-over
    /// without a round trip while a third of it is left, counted from the
    /// last busy attempt. `true`: every hand-over is confirmed with
    /// extend.lua (the other fix of the stale hand-over, FAULTS.md).
    pub confirm_every_handoff: bool,
    /// `true`: today's client (commit 18d4a5a): `wait_for_turn` ignores a
    /// grant whose token is at most the counter a busy attempt saw
    /// (`fence_seen`, set by `Acquisition::attempt`, read by
    /// `Acquisition::wait_for_turn`). `false`: the
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
    /// its in-process line (local hand-over, client/local/mod.rs). Distinct
    /// by default: every client its own process, no line.
    pub process: Vec<u8>,
    /// `BLOCK` (client/blocks.rs; 8 there): fencing tokens reserve.lua reserves at once.
    pub block: u8,
    /// Test only, a broken client: a local hand-over passes the token just
    /// below the reserved block (the last one issued before it) instead of
    /// the block's first (`hand_on`, client/handover.rs). The model must find it.
    pub hand_on_below_block: bool,
    /// `true`: today's scripts: a marked key lives until the end of the
    /// longest wait in its line (acquire.lua, "local function pin(").
    /// `false`, a mistake the model must catch: the key keeps only its
    /// owner's lease while waiters are queued, so it can expire bare and a
    /// newcomer's plain `SET NX` takes it past the line.
    pub line_pins_key: bool,
    /// `true`: today's mint.lua, which mints only while the lock is the
    /// caller's (its value, with a deadline still ahead if marked).
    /// `false`, a mistake the model must catch: a mint without that check,
    /// so a holder whose lease ended (paused past it) gets a token above
    /// the next holder's.
    pub mint_checks_owner: bool,
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
            line_pins_key: true,
            mint_checks_owner: true,
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
        // `Acquisition::confirm`: `ttl.min(HANDOFF_LEASE)`; release.lua's hand-over caps the same way.
        self.ttl.min(self.handoff)
    }
}

/// The lock model (see the module docs).
#[derive(Clone, Debug)]
pub struct LockModel {
    /// Its configuration.
    pub cfg: LockConfig,
}
