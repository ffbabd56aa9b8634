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
//! Other processes are not starved: a block holds [`BLOCK`] tokens and is
//! used for at most [`BLOCK_FOR`] after it was reserved (but for its first
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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::guard::LockGuard;
use crate::held::Held;
use crate::inner::Inner;

/// Fencing tokens reserved per round trip: local hand-overs between two
/// checks that nobody waits on the server.
pub(crate) const BLOCK: u64 = 8;

/// How long a reserved block may be used: bounds what a waiter on the server
/// waits for a chain of local hand-overs with long holds.
pub(crate) const BLOCK_FOR: Duration = Duration::from_millis(5);

/// A holder hands on only while this much of its confirmed lease is left.
const MARGIN: Duration = Duration::from_millis(50);

/// The lines of this client, by key.
#[derive(Debug, Default)]
pub(crate) struct Local {
    /// `false`: every acquisition goes to the server (the builder's
    /// `local_handover(false)`, or a backend without local hand-over).
    enabled: bool,
    keys: Mutex<HashMap<String, Slot>>,
    /// Tickets are unique within the client, not per line: a line can be
    /// replaced (other settings) or end and start again while a ticket of
    /// the old one is still about, which must not name a waiter of the new.
    next_ticket: AtomicU64,
}

#[derive(Debug)]
struct Slot {
    /// The lease settings of the line: a task must ask for the same to join.
    ttl: Duration,
    renew: bool,
    /// The task of the line that holds the key, if one does.
    holder: Option<Arc<Held>>,
    /// Tasks of the line acquiring on the server.
    representatives: usize,
    waiters: VecDeque<Waiter>,
    /// Reserved fencing tokens: `next..=top`, usable until `until`.
    block: Option<(u64, u64, Instant)>,
    /// The block after it, reserved ahead (top, send time of its request),
    /// so a chain does not stop for a round trip when a block runs out.
    next_block: Option<(u64, Instant)>,
    /// A reservation ahead is in flight.
    prefetching: bool,
    /// The highest fencing token handed on in this line: a block reserved
    /// ahead is only used if it lies above (one reserved ahead may arrive
    /// after a later block a holder reserved itself, and be lower).
    issued: u64,
}

impl Slot {
    fn holds(&self, held: &Arc<Held>) -> bool {
        self.holder.as_ref().is_some_and(|h| Arc::ptr_eq(h, held))
    }

    /// With nobody holding and nobody acquiring on the server, the first
    /// waiter becomes the representative. `true` when the line is empty and
    /// idle (the slot can go).
    fn promote(&mut self) -> bool {
        if self.holder.is_some() || self.representatives > 0 {
            return false;
        }
        while let Some(waiter) = self.waiters.pop_front() {
            if waiter.send.send(Turn::Represent).is_ok() {
                self.representatives = 1;
                return false;
            }
        }
        true
    }
}

#[derive(Debug)]
struct Waiter {
    ticket: u64,
    send: oneshot::Sender<Turn>,
    metrics: crate::metrics::Name,
    started: Instant,
}

/// What a waiter in line is sent.
#[derive(Debug)]
enum Turn {
    /// The lock, handed on.
    Guard(LockGuard),
    /// Acquire on the server for the line (counted as a representative).
    Represent,
}

/// How a task takes part in acquiring a key: [`Local::enter`].
pub(crate) enum Entry {
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
    receive: oneshot::Receiver<Turn>,
    inner: Arc<Inner>,
    key: String,
    /// `false` once a turn (or the end of the line) was read.
    waiting: bool,
}

impl Ticket {
    /// Leaves the line: no turn can be sent any more; the one sent before,
    /// if any, is returned.
    fn leave(&mut self) -> Option<Turn> {
        self.waiting = false;
        if let Some(slot) = self.inner.local.keys().get_mut(&self.key) {
            slot.waiters.retain(|w| w.ticket != self.ticket);
        }
        // A turn is sent under the lock (`promote`) or after the waiter was
        // taken out of the line (`pass`): once closed, a later send fails
        // and its sender passes the turn on itself.
        self.receive.close();
        self.receive.try_recv().ok()
    }

    fn representing(&mut self) -> Representing {
        Representing {
            inner: self.inner.clone(),
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
            // Its drop hands the lease on, or releases it.
            Some(Turn::Guard(guard)) => drop(guard),
            // Its drop ends the role: the next in line takes it.
            Some(Turn::Represent) => drop(self.representing()),
            None => {}
        }
    }
}

/// How a wait in line ended.
pub(crate) enum LocalWait {
    Granted(LockGuard),
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
    inner: Arc<Inner>,
    key: String,
}

impl Drop for Representing {
    fn drop(&mut self) {
        let mut keys = self.inner.local.keys();
        if let Some(slot) = keys.get_mut(&self.key) {
            slot.representatives = slot.representatives.saturating_sub(1);
            if slot.promote() {
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
            next_ticket: AtomicU64::new(0),
        }
    }

    fn keys(&self) -> MutexGuard<'_, HashMap<String, Slot>> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How the task asking for `key` (with a wait) takes part: in line, as
    /// the line's representative, or alone.
    pub(crate) fn enter(
        &self,
        inner: &Arc<Inner>,
        key: &str,
        ttl: Duration,
        renew: bool,
        metrics: &crate::metrics::Name,
    ) -> Entry {
        if !self.enabled {
            return Entry::Alone;
        }
        let mut keys = self.keys();
        let represent = || {
            Entry::Represent(Representing {
                inner: inner.clone(),
                key: key.to_owned(),
            })
        };
        let Some(slot) = keys.get_mut(key) else {
            keys.insert(
                key.to_owned(),
                Slot {
                    ttl,
                    renew,
                    holder: None,
                    representatives: 1,
                    waiters: VecDeque::new(),
                    block: None,
                    next_block: None,
                    prefetching: false,
                    issued: 0,
                },
            );
            return represent();
        };
        if slot.ttl != ttl || slot.renew != renew {
            return Entry::Alone;
        }
        if slot.holder.as_ref().is_some_and(|h| h.lost.is_cancelled()) {
            // Lost without a release: nobody of the line holds the key.
            slot.holder = None;
            slot.block = None;
            slot.next_block = None;
        }
        if slot.holder.is_none() && slot.representatives == 0 {
            slot.representatives = 1;
            return represent();
        }
        let (send, receive) = oneshot::channel();
        let ticket = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        slot.waiters.push_back(Waiter {
            ticket,
            send,
            metrics: metrics.clone(),
            started: Instant::now(),
        });
        Entry::Queued(Ticket {
            ticket,
            receive,
            inner: inner.clone(),
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
                .and_then(|slot| slot.holder.clone());
            let holder_lost = async {
                match &holder {
                    Some(held) => held.lost.cancelled().await,
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
                    let retry_after = self.keys().get(&ticket.key).and_then(|slot| {
                        slot.holder
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
            Turn::Guard(guard) => LocalWait::Granted(guard),
            Turn::Represent => LocalWait::Represent(ticket.representing()),
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
        if !self.enabled {
            return;
        }
        let mut keys = self.keys();
        match keys.get_mut(&held.key) {
            Some(slot) if slot.ttl == held.ttl && slot.renew == renew => {
                slot.holder = Some(held.clone());
                slot.block = None;
                slot.next_block = None;
            }
            Some(_) if !waited => {}
            None if !waited => {}
            _ => {
                keys.insert(
                    held.key.clone(),
                    Slot {
                        ttl: held.ttl,
                        renew,
                        holder: Some(held.clone()),
                        representatives: 0,
                        waiters: VecDeque::new(),
                        block: None,
                        next_block: None,
                        prefetching: false,
                        issued: 0,
                    },
                );
            }
        }
    }

    /// `held` goes back to the server: if tasks wait in its line, the first
    /// becomes its representative (and queues there).
    pub(crate) fn end(&self, held: &Arc<Held>) {
        if !self.enabled {
            return;
        }
        let mut keys = self.keys();
        if let Some(slot) = keys.get_mut(&held.key)
            && slot.holds(held)
        {
            slot.holder = None;
            slot.block = None;
            slot.next_block = None;
            if slot.promote() {
                keys.remove(&held.key);
            }
        }
    }

    /// Whether `held` has a task in line (that has not given up).
    pub(crate) fn has_waiters(&self, held: &Arc<Held>) -> bool {
        self.enabled
            && self.keys().get(&held.key).is_some_and(|slot| {
                slot.holds(held) && slot.waiters.iter().any(|w| !w.send.is_closed())
            })
    }

    /// The next reserved fencing token of `held`'s key, if a block is left
    /// and still fresh.
    ///
    /// `prefetch`: the block is running out (half of its tokens or of its
    /// time used) and no reservation ahead is kept or in flight: the caller
    /// reserves the next one in the background ([`prefetch`]).
    fn take_token(&self, held: &Arc<Held>) -> Option<(u64, bool)> {
        let mut keys = self.keys();
        let slot = keys.get_mut(&held.key).filter(|slot| slot.holds(held))?;
        let now = Instant::now();
        let usable = |b: &(u64, u64, Instant)| b.0 <= b.1 && now < b.2;
        if !slot.block.as_ref().is_some_and(usable) {
            // The block reserved ahead, if it is still fresh and above
            // every token handed on so far.
            let issued = slot.issued;
            slot.block = slot
                .next_block
                .take()
                .map(|(top, reserved)| (top + 1 - BLOCK, top, reserved + BLOCK_FOR))
                .filter(|b| usable(b) && b.0 > issued);
        }
        let (next, top, until) = slot.block.as_mut()?;
        let token = *next;
        *next += 1;
        let running_out = *top + 1 - *next <= BLOCK / 2 || *until <= now + BLOCK_FOR / 2;
        slot.issued = token;
        let prefetch = running_out && slot.next_block.is_none() && !slot.prefetching;
        if prefetch {
            slot.prefetching = true;
        }
        Some((token, prefetch))
    }

    /// Keeps a block reserved ahead for the line of `key`, if the line
    /// still holds the lease `token` reserved it under.
    fn set_next_block(&self, key: &str, token: &crate::token::Token, top: Option<(u64, Instant)>) {
        let mut keys = self.keys();
        let Some(slot) = keys.get_mut(key) else {
            return;
        };
        slot.prefetching = false;
        if slot.holder.as_ref().is_some_and(|h| h.token == *token) {
            slot.next_block = top;
        }
    }

    /// Keeps the block of tokens up to `top`, reserved by a request sent at
    /// `reserved`, for `held`'s line, and returns its first token: that one
    /// is used however long the reservation took (see [`hand_on`]).
    fn set_block(&self, held: &Arc<Held>, top: u64, reserved: Instant) -> Option<u64> {
        let mut keys = self.keys();
        let slot = keys.get_mut(&held.key).filter(|slot| slot.holds(held))?;
        let first = top + 1 - BLOCK;
        slot.block = Some((first + 1, top, reserved + BLOCK_FOR));
        slot.issued = first;
        Some(first)
    }

    /// Takes the first waiter still waiting, and makes `next` the holder.
    fn pass(
        &self,
        held: &Arc<Held>,
        next: impl FnOnce(&Waiter) -> Arc<Held>,
    ) -> Option<(Waiter, Arc<Held>)> {
        let mut keys = self.keys();
        let slot = keys.get_mut(&held.key).filter(|slot| slot.holds(held))?;
        while let Some(waiter) = slot.waiters.pop_front() {
            if waiter.send.is_closed() {
                continue;
            }
            let next = next(&waiter);
            slot.holder = Some(next.clone());
            return Some((waiter, next));
        }
        None
    }
}

/// Hands the lease of `held` to the next local waiter, as many times as it
/// takes to find one that still waits. `None`: handed on. `Some(held)`:
/// nobody to hand on to (or the lease is no longer sure, or somebody queued
/// on the server): the caller releases `held` (the last holder) to the
/// server, after [`Local::end`].
pub(crate) async fn hand_on(inner: &Arc<Inner>, mut held: Arc<Held>) -> Option<Arc<Held>> {
    let local = &inner.local;
    // The first token of a block just reserved. It is used whatever the
    // round trip took: nobody was queued on the server when the block was
    // reserved, and with a server more than `BLOCK_FOR` away every block
    // would otherwise be stale on arrival and the holder would reserve
    // block after block, never handing on nor releasing.
    let mut fresh = None;
    loop {
        if !local.has_waiters(&held) || !held.valid_at(Instant::now() + MARGIN) {
            return Some(held);
        }
        let taken = match fresh.take() {
            Some(first) => Some(first),
            None => local.take_token(&held).map(|(token, prefetch)| {
                if prefetch {
                    self::prefetch(inner, &held);
                }
                token
            }),
        };
        let Some(fencing) = taken else {
            let sent = Instant::now();
            match inner
                .backend
                .reserve(&held.names, &held.token, held.ttl, BLOCK)
                .await
            {
                Ok(Some(top)) => {
                    fresh = local.set_block(&held, top, sent);
                    continue;
                }
                Ok(None) => return Some(held),
                Err(e) => {
                    tracing::debug!(key = %held.key, error = &e as &dyn std::error::Error,
                        "reserving fencing tokens for a local hand-over failed; releasing");
                    return Some(held);
                }
            }
        };
        let Some((waiter, next)) = local.pass(&held, |waiter| {
            Arc::new(Held {
                id: held.id,
                client_id: held.client_id,
                key: held.key.clone(),
                names: held.names.clone(),
                token: held.token,
                fencing,
                ttl: held.ttl,
                lost: CancellationToken::new(),
                valid_until: std::sync::Mutex::new(held.valid_until()),
                metrics: waiter.metrics.clone(),
                since: Instant::now(),
                hold_until: None,
            })
        }) else {
            return Some(held);
        };
        if !inner.watchdog.hand_on(next.clone()) {
            // Lost meanwhile: the waiter goes to the server.
            local.end(&next);
            return Some(next);
        }
        crate::metrics::released(&held.metrics, held.since.elapsed());
        crate::metrics::acquired(&next.metrics, waiter.started.elapsed(), true);
        tracing::debug!(key = %next.key, fencing, "lock handed on within the client");
        match waiter
            .send
            .send(Turn::Guard(LockGuard::owner(next, inner.clone())))
        {
            Ok(()) => return None,
            // Gone since: the lease is the new guard's; hand it on again.
            Err(Turn::Guard(guard)) => held = guard.disarm(),
            Err(Turn::Represent) => unreachable!("sent a guard"),
        }
    }
}

/// Reserves the next block of `held`'s line in the background, while the
/// chain goes on with the current one: a chain of short holds does not stop
/// for a round trip every [`BLOCK`] hand-overs. The same check as a
/// reservation in line: granted only while nobody is queued on the server.
fn prefetch(inner: &Arc<Inner>, held: &Arc<Held>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let inner = inner.clone();
    let (key, names, token, ttl) = (held.key.clone(), held.names.clone(), held.token, held.ttl);
    runtime.spawn(async move {
        let sent = Instant::now();
        let top = match inner.backend.reserve(&names, &token, ttl, BLOCK).await {
            Ok(top) => top.map(|top| (top, sent)),
            Err(e) => {
                tracing::debug!(key = %key, error = &e as &dyn std::error::Error,
                    "reserving fencing tokens ahead failed");
                None
            }
        };
        inner.local.set_next_block(&key, &token, top);
    });
}
