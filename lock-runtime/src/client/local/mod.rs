//! Local hand-over: a hot key passed between the tasks of one client without
//! a round trip.
//!
//! The tasks of one client that want the same key (with the same lease
//! settings) form one line here, and the client takes part on the server as
//! one participant: one task of the line, its *representative*, acquires on
//! the server (queueing there like anyone else); the others wait in-process.
//! While a task of the line holds the key, its release hands the lease to the
//! next task in line as it stands on the server (same owner token, same
//! expiry, same watchdog entry), with a fencing token of its own taken from a
//! block the holder reserved (`reserve.lua`: `INCRBY` on the slot's counter,
//! only while nobody is queued behind the key on the server). So fencing
//! tokens keep rising strictly across local hand-overs: every token of a
//! block is above every token issued before it and below every token issued
//! after it.
//!
//! Other processes are not starved: a block holds [`BLOCK`](super::blocks::BLOCK) tokens and is
//! used for at most [`BLOCK_FOR`](super::blocks::BLOCK_FOR) after it was reserved (but for its first
//! token, used however long the reservation took); the next one is only
//! granted while nobody is queued on the server. Otherwise the holder
//! releases to the server's queue, and the first task of the line becomes
//! the representative and queues there (behind those already queued).
//!
//! `lost()` keeps its meaning: each holder has its own signal, and the
//! watchdog entry (the lease) passes from holder to holder. Cancellation: a
//! waiter that gives up leaves the line ([`Ticket`]); a guard sent to a waiter
//! that is gone is handed on to the next one, or released; a representative
//! that gives up, or a waiter gone before it read that it is one, passes the
//! role to the next task in line.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::blocks::Blocks;
use crate::held::Held;
use crate::token::Token;
use keys::Keys;

mod keys;

/// A holder hands on only while this much of its confirmed lease is left.
pub(crate) const MARGIN: Duration = Duration::from_millis(50);

/// The lines of this client, by key.
#[derive(Debug, Default)]
pub(crate) struct Local {
    /// `false`: every acquisition goes to the server (the builder's
    /// `local_handover(false)`, or a backend without local hand-over).
    enabled: bool,
    keys: Mutex<HashMap<String, Line>>,
    /// Whether `keys` has a line, as it was when its lock was last let go
    /// ([`Keys`]): with none, a hold that did not wait, its release and its
    /// end have nothing to find there, and skip the lock and the lookup
    /// (the common, uncontended lock). A line made meanwhile by another
    /// task does not hold their lease: they would find nothing in it.
    any: AtomicBool,
    /// Tickets are unique within the client, not per line: a line can be
    /// replaced (other settings) or end and start again while a ticket of
    /// the old one is still about, which must not name a waiter of the new.
    next_ticket: AtomicU64,
}

#[derive(Debug)]
struct Line {
    /// The lease settings of the line: a task must ask for the same to join.
    ttl: Duration,
    renew: bool,
    /// The task of the line that holds the key, if one does.
    holder: Option<Arc<Held>>,
    /// Tasks of the line acquiring on the server.
    representatives: usize,
    waiters: VecDeque<LocalWaiter>,
    /// Reserved fencing tokens.
    blocks: Blocks,
}

impl Line {
    fn holds(&self, held: &Arc<Held>) -> bool {
        self.holder.as_ref().is_some_and(|h| Arc::ptr_eq(h, held))
    }

    /// With nobody holding and nobody acquiring on the server, the first
    /// waiter becomes the representative. `true` when the line is empty and
    /// idle (the line can go).
    fn promote(&mut self) -> bool {
        if self.holder.is_some() || self.representatives > 0 {
            return false;
        }
        while let Some(waiter) = self.waiters.pop_front() {
            if waiter.send.send(LocalTurn::Represent).is_ok() {
                self.representatives = 1;
                return false;
            }
        }
        true
    }
}

/// A task of this client waiting in a key's line for a lease handed on
/// in-process (the server's waiters, woken by notices, are
/// `backend::waiters::Waiter`).
#[derive(Debug)]
pub(crate) struct LocalWaiter {
    ticket: u64,
    send: oneshot::Sender<LocalTurn>,
    pub(crate) metrics: crate::metrics::Name,
    pub(crate) started: Instant,
}

/// What a [`LocalWaiter`] in line is sent.
#[derive(Debug)]
enum LocalTurn {
    /// The lease, handed on.
    Held(Arc<Held>),
    /// Acquire on the server for the line (counted as a representative).
    Represent,
}

/// What a line needs of the client it belongs to: its lines, and a way to
/// give back a lease that was handed to a waiter gone since. The client's
/// `Inner` is one (in `handover`); a trait, so that the lines do not depend
/// on the client and its guards.
pub(crate) trait Owner: Send + Sync {
    fn lines(&self) -> &Local;
    /// Hands `held` on to the next in line, or releases it, in the
    /// background (as dropping its guard would).
    fn give_back(self: Arc<Self>, held: Arc<Held>);
}

/// How a task takes part in acquiring a key, as it enters this client's
/// line for it: [`Local::enter`].
pub(crate) enum LocalEntry {
    /// Wait in line: [`Local::wait`].
    Queued(Ticket),
    /// Acquire on the server for the line; the [`Representing`] duty ends
    /// the role however that acquisition ends.
    Represent(Representing),
    /// Acquire on the server on its own (no line for these settings, try
    /// once, or local hand-over off).
    Alone,
}

/// A place in a line: the clean-up duty of a waiting task. Dropped while
/// still waiting (the acquire future cancelled, a `select!` or timeout around
/// it), it leaves the line, and a turn sent to it that it never read is
/// passed on: a guard is dropped (which hands on or releases it), a
/// representative's role ends (so the next in line takes it). Without this
/// a role sent to a waiter dropped before it read it would be lost, and the
/// line would wait for a representative that never comes.
pub(crate) struct Ticket {
    ticket: u64,
    receive: oneshot::Receiver<LocalTurn>,
    owner: Arc<dyn Owner>,
    key: String,
    /// `false` once a turn (or the end of the line) was read.
    waiting: bool,
}

impl Ticket {
    /// Leaves the line: no turn can be sent any more; the one sent before,
    /// if any, is returned.
    fn leave(&mut self) -> Option<LocalTurn> {
        self.waiting = false;
        if let Some(line) = self.owner.lines().keys().get_mut(&self.key) {
            line.waiters.retain(|w| w.ticket != self.ticket);
        }
        // A turn is sent under the lock (`promote`) or after the waiter was
        // taken out of the line (`pass`): once closed, a later send fails
        // and its sender passes the turn on itself.
        self.receive.close();
        self.receive.try_recv().ok()
    }

    fn representing(&mut self) -> Representing {
        Representing {
            owner: self.owner.clone(),
            key: std::mem::take(&mut self.key),
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.waiting {
            return;
        }
        match self.leave() {
            // Handed on, or released.
            Some(LocalTurn::Held(held)) => self.owner.clone().give_back(held),
            // Its drop ends the role: the next in line takes it.
            Some(LocalTurn::Represent) => drop(self.representing()),
            None => {}
        }
    }
}

/// How a wait in line ended.
pub(crate) enum LocalWait {
    /// The lease, handed on: the caller's guard now.
    Granted(Arc<Held>),
    /// Acquire on the server for the line.
    Represent(Representing),
    /// The line went away (another task took the key with other settings):
    /// enter again.
    Closed,
    TimedOut {
        retry_after: Duration,
    },
}

/// The duty of a representative: when its acquisition ends (held, failed or
/// dropped), the line learns it, and if nobody holds the key then, the next
/// task in line takes the role.
pub(crate) struct Representing {
    owner: Arc<dyn Owner>,
    key: String,
}

impl Drop for Representing {
    fn drop(&mut self) {
        let mut keys = self.owner.lines().keys();
        if let Some(line) = keys.get_mut(&self.key) {
            line.representatives = line.representatives.saturating_sub(1);
            if line.promote() {
                keys.remove(&self.key);
            }
        }
    }
}

impl Local {
    pub(crate) fn new(enabled: bool) -> Self {
        Self {
            enabled,
            keys: Mutex::default(),
            any: AtomicBool::new(false),
            next_ticket: AtomicU64::new(0),
        }
    }

    fn keys(&self) -> Keys<'_> {
        Keys {
            map: self.keys.lock().unwrap_or_else(|e| e.into_inner()),
            any: &self.any,
        }
    }

    /// Whether a lease can be in a line: lines are on and one exists.
    fn lines_exist(&self) -> bool {
        self.enabled && self.any.load(Ordering::Acquire)
    }

    /// How the task asking for `key` (with a wait) takes part: in line, as
    /// the line's representative, or alone.
    pub(crate) fn enter(
        &self,
        owner: &Arc<dyn Owner>,
        key: &str,
        ttl: Duration,
        renew: bool,
        metrics: &crate::metrics::Name,
    ) -> LocalEntry {
        if !self.enabled {
            return LocalEntry::Alone;
        }
        let mut keys = self.keys();
        let represent = || {
            LocalEntry::Represent(Representing {
                owner: owner.clone(),
                key: key.to_owned(),
            })
        };
        let Some(line) = keys.get_mut(key) else {
            keys.insert(
                key.to_owned(),
                Line {
                    ttl,
                    renew,
                    holder: None,
                    representatives: 1,
                    waiters: VecDeque::new(),
                    blocks: Blocks::default(),
                },
            );
            return represent();
        };
        if line.ttl != ttl || line.renew != renew {
            return LocalEntry::Alone;
        }
        if line.holder.as_ref().is_some_and(|h| h.is_lost()) {
            // Lost without a release: nobody of the line holds the key.
            line.holder = None;
            line.blocks.clear();
        }
        if line.holder.is_none() && line.representatives == 0 {
            line.representatives = 1;
            return represent();
        }
        let (send, receive) = oneshot::channel();
        let ticket = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        line.waiters.push_back(LocalWaiter {
            ticket,
            send,
            metrics: metrics.clone(),
            started: Instant::now(),
        });
        LocalEntry::Queued(Ticket {
            ticket,
            receive,
            owner: owner.clone(),
            key: key.to_owned(),
            waiting: true,
        })
    }

    /// Waits in line until handed the lock, made the line's representative,
    /// or `deadline`. Dropped before it answers, the ticket leaves the line.
    pub(crate) async fn wait(&self, mut ticket: Ticket, deadline: Instant) -> LocalWait {
        let answer = loop {
            // A holder that loses its lease without releasing (a guard
            // forgotten, or kept past its loss) hands on nothing: the line
            // then goes back to the server.
            let holder = self
                .keys()
                .get(&ticket.key)
                .and_then(|line| line.holder.clone());
            let holder_lost = async {
                match &holder {
                    Some(held) => held.lost().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                answer = &mut ticket.receive => break Ok(answer),
                () = holder_lost => {
                    if let Some(held) = &holder {
                        self.end(held);
                    }
                }
                () = tokio::time::sleep_until(deadline) => break Err(()),
            }
        };
        let turn = match answer {
            Ok(Ok(turn)) => turn,
            Ok(Err(_)) => {
                ticket.waiting = false;
                return LocalWait::Closed;
            }
            Err(_) => match ticket.leave() {
                // Sent meanwhile: ours after all.
                Some(turn) => turn,
                None => {
                    let retry_after = self.keys().get(&ticket.key).and_then(|line| {
                        line.holder
                            .as_ref()
                            .map(|h| h.valid_until().saturating_duration_since(Instant::now()))
                    });
                    return LocalWait::TimedOut {
                        retry_after: retry_after
                            .unwrap_or_default()
                            .max(Duration::from_millis(1)),
                    };
                }
            },
        };
        ticket.waiting = false;
        match turn {
            LocalTurn::Held(held) => LocalWait::Granted(held),
            LocalTurn::Represent => LocalWait::Represent(ticket.representing()),
        }
    }

    /// `held` is now held by this client (acquired on the server): it holds
    /// for the line of its key, or starts one. A line with other settings
    /// is closed (its tasks enter again).
    ///
    /// `waited`: the acquisition asked for a wait. One that tried once
    /// starts no line: most such locks (a scheduled job, a lock per order)
    /// never see a task of their own client wait for them, and an entry per
    /// held key would cost a map insert and about 300 bytes each (10,000
    /// held locks: 18.5 MiB of RSS instead of 15.5). A task of this client
    /// that then waits for the key goes through the server once, and the
    /// line forms from there.
    pub(crate) fn hold(&self, held: &Arc<Held>, renew: bool, waited: bool) {
        // A hold that did not wait only joins a line that exists.
        if !self.enabled || (!waited && !self.lines_exist()) {
            return;
        }
        let mut keys = self.keys();
        match keys.get_mut(&held.key) {
            Some(line) if line.ttl == held.ttl && line.renew == renew => {
                line.holder = Some(held.clone());
                line.blocks.clear();
            }
            Some(_) if !waited => {}
            None if !waited => {}
            _ => {
                keys.insert(
                    held.key.clone(),
                    Line {
                        ttl: held.ttl,
                        renew,
                        holder: Some(held.clone()),
                        representatives: 0,
                        waiters: VecDeque::new(),
                        blocks: Blocks::default(),
                    },
                );
            }
        }
    }

    /// `held` goes back to the server: if tasks wait in its line, the first
    /// becomes its representative (and queues there).
    pub(crate) fn end(&self, held: &Arc<Held>) {
        if !self.lines_exist() {
            return;
        }
        let mut keys = self.keys();
        if let Some(line) = keys.get_mut(&held.key)
            && line.holds(held)
        {
            line.holder = None;
            line.blocks.clear();
            if line.promote() {
                keys.remove(&held.key);
            }
        }
    }

    /// Whether `held` has a task in line (that has not given up).
    pub(crate) fn has_waiters(&self, held: &Arc<Held>) -> bool {
        self.lines_exist()
            && self.keys().get(&held.key).is_some_and(|line| {
                line.holds(held) && line.waiters.iter().any(|w| !w.send.is_closed())
            })
    }

    /// The next reserved fencing token of `held`'s line, and whether to
    /// reserve the next block in the background ([`Blocks::take`]).
    pub(crate) fn take_token(&self, held: &Arc<Held>) -> Option<(u64, bool)> {
        let mut keys = self.keys();
        let line = keys.get_mut(&held.key).filter(|line| line.holds(held))?;
        line.blocks.take()
    }

    /// A block reserved ahead came back for the line of `key`: kept if the
    /// line still holds the lease `token` reserved it under.
    pub(crate) fn set_next_block(&self, key: &str, token: &Token, top: Option<(u64, Instant)>) {
        if let Some(line) = self.keys().get_mut(key) {
            let same = line.holder.as_ref().is_some_and(|h| h.token == *token);
            line.blocks.set_ahead(top, same);
        }
    }

    /// Uses the block up to `top` for `held`'s line ([`Blocks::set`]).
    pub(crate) fn set_block(&self, held: &Arc<Held>, top: u64, reserved: Instant) -> Option<u64> {
        let mut keys = self.keys();
        let line = keys.get_mut(&held.key).filter(|line| line.holds(held))?;
        Some(line.blocks.set(top, reserved))
    }

    /// Takes the first waiter still waiting, and makes `next` the holder.
    pub(crate) fn pass(
        &self,
        held: &Arc<Held>,
        next: impl FnOnce(&LocalWaiter) -> Arc<Held>,
    ) -> Option<(LocalWaiter, Arc<Held>)> {
        let mut keys = self.keys();
        let line = keys.get_mut(&held.key).filter(|line| line.holds(held))?;
        while let Some(waiter) = line.waiters.pop_front() {
            if waiter.send.is_closed() {
                continue;
            }
            let next = next(&waiter);
            line.holder = Some(next.clone());
            return Some((waiter, next));
        }
        None
    }
}

impl Local {
    /// Sends `next` (taken from [`Local::pass`]) to `waiter`; `Err(next)`
    /// when the waiter is gone since: the lease is still the giver's.
    pub(crate) fn give(&self, waiter: LocalWaiter, next: Arc<Held>) -> Result<(), Arc<Held>> {
        match waiter.send.send(LocalTurn::Held(next)) {
            Ok(()) => Ok(()),
            Err(LocalTurn::Held(next)) => Err(next),
            Err(LocalTurn::Represent) => unreachable!("sent a lease"),
        }
    }
}
