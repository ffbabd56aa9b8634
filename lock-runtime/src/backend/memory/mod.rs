//! The embedded backend: the same semantics as Redis, inside one client (and
//! its clones): each client built with `.memory()` has a store of its own.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::waiters::{Registry, WaitHandle};
use super::{AcquireOutcome, HANDOFF_LEASE};
use crate::key::{KeyNames, LockKind};
use crate::token::Token;
use shared::{Grants, SharedLocks};

mod observe;
mod shared;

/// A mutex (or a leader election's lock) held in the embedded backend:
/// what Redis keeps under the lock's name.
#[derive(Debug)]
struct MemoryHold {
    token: Token,
    fencing: u64,
    expires: Instant,
    /// A leader's label (empty for other locks): its record.
    label: String,
}

/// A place in a mutex's line (what Redis keeps in the queue list).
#[derive(Clone, Debug)]
struct QueueEntry {
    token: Token,
    /// The lease it asked for (a hand-over gives at most `HANDOFF_LEASE`).
    lease: Duration,
    /// When its wait ends: past it, the entry is skipped (its waiter gave
    /// up, or died in line).
    until: Instant,
    /// A candidate's label (empty for other locks).
    label: String,
}

#[derive(Debug)]
struct Queue {
    /// Waiters in arrival order.
    entries: VecDeque<QueueEntry>,
    expires: Instant,
}

/// A map by key name, hashed with foldhash (seeded at random per map)
/// rather than SipHash: an embedded acquire + release hashes names several
/// times, and SipHash was a visible share of its instructions.
pub(super) type Names<V> = HashMap<String, V, foldhash::fast::RandomState>;

#[derive(Debug, Default)]
pub(super) struct MemoryState {
    locks: Names<MemoryHold>,
    /// Read-write locks and semaphores.
    shared: SharedLocks,
    /// One fencing counter for every key (as Redis keeps one per hash
    /// slot): tokens strictly increase per key, and nothing is kept per name
    /// once its lock and queue are gone.
    fence: u64,
    queues: Names<Queue>,
    ops: u64,
}

impl MemoryState {
    /// The first entry of a mutex's line whose wait has not ended, the
    /// others before it dropped (as acquire.lua and release.lua do); the
    /// line goes with its last entry.
    fn first_in_line(&mut self, queue: &str, now: Instant) -> Option<QueueEntry> {
        let line = self.queues.get_mut(queue)?;
        if line.expires <= now {
            line.entries.clear();
        }
        while line.entries.front().is_some_and(|e| e.until <= now) {
            line.entries.pop_front();
        }
        let head = line.entries.front().cloned();
        if head.is_none() {
            self.queues.remove(queue);
        }
        head
    }

    /// Takes the head of a line off (after [`first_in_line`](Self::first_in_line)).
    fn pop_line(&mut self, queue: &str) {
        if let Some(line) = self.queues.get_mut(queue) {
            line.entries.pop_front();
            if line.entries.is_empty() {
                self.queues.remove(queue);
            }
        }
    }

    /// The answer to a mutex acquire once nobody else is first in line for
    /// a free key: ours if free (or ours already), else busy for the rest of
    /// the owner's lease, in line (once) when `wait` is not zero.
    fn busy(
        &mut self,
        names: &KeyNames,
        token: &Token,
        ttl: Duration,
        wait: Duration,
        now: Instant,
    ) -> AcquireOutcome {
        let Some(held) = self
            .locks
            .get_mut(&names.lock)
            .filter(|held| held.expires > now)
        else {
            let fencing = grant(self, names, *token, ttl, now, &names.label);
            return AcquireOutcome::Acquired { fencing };
        };
        if held.token == *token {
            held.expires = now + ttl;
            return AcquireOutcome::Acquired {
                fencing: held.fencing,
            };
        }
        let remaining = held.expires - now;
        if !wait.is_zero() {
            let queue = self
                .queues
                .entry(names.queue().to_owned())
                .or_insert(Queue {
                    entries: VecDeque::new(),
                    expires: now,
                });
            if queue.expires <= now {
                queue.entries.clear();
            }
            if !queue.entries.iter().any(|e| e.token == *token) {
                queue.entries.push_back(QueueEntry {
                    token: *token,
                    lease: ttl,
                    until: now + wait,
                    label: names.label.clone(),
                });
            }
            queue.expires = queue.expires.max(now + wait + ttl);
        }
        AcquireOutcome::Busy {
            remaining,
            fence: self.fence,
        }
    }

    /// Counts an acquire; every 4096th drops what ended, so what is kept
    /// does not grow with names whose leases ran out untouched.
    fn tick(&mut self, now: Instant) {
        self.ops += 1;
        if self.ops.is_multiple_of(4096) {
            self.locks.retain(|_, held| held.expires > now);
            self.queues.retain(|_, queue| queue.expires > now);
            self.shared.sweep(now);
        }
    }
}

/// Locks in a `HashMap` behind a mutex; expiry is checked on access with
/// tokio's clock, so `tokio::time::pause()` works in users' tests. Waiter
/// queues and hand-over work as in the Redis scripts.
#[derive(Debug, Default)]
pub(crate) struct MemoryBackend {
    state: Mutex<MemoryState>,
    waiters: Arc<Registry>,
    /// Idempotency records (`IdempotencyLayer`).
    #[cfg(feature = "idempotency")]
    pub(crate) records: super::records::MemoryRecords,
}

impl MemoryBackend {
    fn state(&self) -> std::sync::MutexGuard<'_, MemoryState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn acquire(
        &self,
        names: &KeyNames,
        token: &Token,
        ttl: Duration,
        wait: Duration,
    ) -> AcquireOutcome {
        if names.kind != LockKind::Mutex {
            let (outcome, granted) = {
                let state = &mut *self.state();
                state.tick(Instant::now());
                state
                    .shared
                    .acquire(&mut state.fence, names, token, ttl, wait)
            };
            self.notify(names, granted);
            return outcome;
        }
        let now = Instant::now();
        let mut state = self.state();
        state.tick(now);
        let mut handed = None;
        let free = match state.locks.get(&names.lock) {
            Some(held) => held.expires <= now,
            None => true,
        };
        if free {
            // Free: ours unless somebody lives in line for it (a holder's
            // lease ran out): then the head of the line gets it, as a
            // release would hand it.
            let mine = match state.first_in_line(names.queue(), now) {
                None => true,
                Some(head) if head.token == *token => {
                    state.pop_line(names.queue());
                    true
                }
                Some(head) => {
                    state.pop_line(names.queue());
                    let lease = head.lease.min(HANDOFF_LEASE);
                    let fencing = grant(&mut state, names, head.token, lease, now, &head.label);
                    handed = Some((head.token, fencing));
                    false
                }
            };
            if mine {
                let fencing = grant(&mut state, names, *token, ttl, now, &names.label);
                drop(state);
                if names.is_leader() {
                    // Observers follow every new leader (as acquire.lua publishes).
                    self.waiters.grant(names.notice(), &token.digest(), fencing);
                }
                return AcquireOutcome::Acquired { fencing };
            }
        }
        let outcome = state.busy(names, token, ttl, wait, now);
        drop(state);
        if let Some((next, fencing)) = handed {
            self.waiters.grant(names.notice(), &next.digest(), fencing);
        }
        outcome
    }

    pub(crate) fn extend(&self, names: &KeyNames, token: &Token, ttl: Duration) -> bool {
        if names.kind != LockKind::Mutex {
            return self.state().shared.extend(names, token, ttl);
        }
        let now = Instant::now();
        let mut state = self.state();
        match state.locks.get_mut(&names.lock) {
            Some(held) if held.expires > now && held.token == *token => {
                held.expires = now + ttl;
                true
            }
            _ => false,
        }
    }

    /// Releases if `token` holds the lock, then hands it to the first waiter.
    /// `dequeue`: also drop `token`'s own queue entry (an abandoned wait).
    pub(crate) fn release(&self, names: &KeyNames, token: &Token, dequeue: bool) -> bool {
        if names.kind != LockKind::Mutex {
            let (ours, granted) = {
                let state = &mut *self.state();
                state
                    .shared
                    .release(&mut state.fence, names, token, dequeue)
            };
            self.notify(names, granted);
            return ours;
        }
        let now = Instant::now();
        let mut state = self.state();
        if dequeue && let Some(queue) = state.queues.get_mut(names.queue()) {
            queue.entries.retain(|entry| entry.token != *token);
        }
        match state.locks.get(&names.lock) {
            Some(held) if held.token == *token && held.expires > now => {}
            Some(held) if held.token == *token => {
                state.locks.remove(&names.lock);
                return false;
            }
            _ => return false,
        }
        state.locks.remove(&names.lock);
        // Nobody queued (the common case): one failed lookup.
        let next = state.first_in_line(names.queue(), now);
        if next.is_some() {
            state.pop_line(names.queue());
        }
        match next {
            Some(next) => {
                let lease = next.lease.min(HANDOFF_LEASE);
                let fencing = grant(&mut state, names, next.token, lease, now, &next.label);
                drop(state);
                self.waiters
                    .grant(names.notice(), &next.token.digest(), fencing);
            }
            None => {
                drop(state);
                self.waiters.deliver(names.notice(), b"");
            }
        }
        true
    }

    /// Tells the waiters a read-write lock or a semaphore was granted to.
    fn notify(&self, names: &KeyNames, granted: Grants) {
        for (token, fencing) in granted {
            self.waiters.grant(names.notice(), &token.digest(), fencing);
        }
    }

    /// A leader's record: its label, term and the lease left; `None` when
    /// nobody leads `names`.
    pub(crate) fn leader(&self, names: &KeyNames) -> Option<(String, u64, Duration)> {
        let now = Instant::now();
        let state = self.state();
        let held = state.locks.get(&names.lock).filter(|h| h.expires > now)?;
        Some((held.label.clone(), held.fencing, held.expires - now))
    }

    /// Up to `limit` names of live locks under `prefix`.
    pub(crate) fn lock_names(
        &self,
        prefix: &str,
        limit: usize,
        keep: super::scan::Keep<'_>,
    ) -> Vec<String> {
        let now = Instant::now();
        let lock_prefix = format!("{prefix}L");
        let mut names: Vec<String> = self
            .state()
            .locks
            .iter()
            .filter(|(name, held)| {
                held.expires > now && name.starts_with(&lock_prefix) && keep(name)
            })
            .map(|(name, _)| name.clone())
            .collect();
        names.sort();
        names.truncate(limit);
        names
    }

    /// Deletes a key as an operator would (`DEL`), for tests.
    pub(crate) fn delete(&self, names: &KeyNames) {
        self.state().locks.remove(&names.lock);
    }

    pub(crate) fn register(&self, channel: &str, token: &Token) -> WaitHandle {
        WaitHandle::new(&self.waiters, channel, &token.digest()).0
    }

    /// Registers an observer `id` of `channel` (see `leaders`).
    pub(crate) fn register_id(&self, channel: &str, id: &str) -> WaitHandle {
        WaitHandle::new(&self.waiters, channel, id).0
    }

    /// Every leader under `prefix`: (name, record).
    pub(crate) fn leaders(&self, prefix: &str) -> Vec<(String, super::LeaderEntry)> {
        let now = Instant::now();
        let leaders = format!("{prefix}E");
        self.state()
            .locks
            .iter()
            .filter(|(name, held)| held.expires > now && name.starts_with(&leaders))
            .filter_map(|(name, held)| {
                let (_, key) = crate::key::parse(prefix, name)?;
                Some((key, (held.label.clone(), held.fencing, held.expires - now)))
            })
            .collect()
    }

    /// Wakes every waiter of `channel` (a record's notice: completed or
    /// released; a lock kept by `hold_at_least`), as a `''` notice through
    /// pub/sub would.
    pub(crate) fn announce(&self, channel: &str) {
        self.waiters.deliver(channel, b"");
    }

    /// Takes every lock of `names` for `token`, all or none, trying once
    /// (`lock_all`): `Ok(fencing)`, one token for all of them (one counter
    /// serves every key here), or `Err((i, remaining))` when lock `i` is
    /// held by another owner for `remaining` (then nothing was taken), or
    /// was free with waiters in line (then it went to the first of them).
    pub(crate) fn acquire_all(
        &self,
        names: &[&KeyNames],
        token: &Token,
        ttl: Duration,
    ) -> Result<u64, (usize, Duration)> {
        let now = Instant::now();
        let mut state = self.state();
        for (i, n) in names.iter().enumerate() {
            match state.locks.get(&n.lock) {
                Some(held) if held.expires > now && held.token != *token => {
                    return Err((i, held.expires - now));
                }
                Some(held) if held.expires > now => {}
                // Free: not while somebody lives in line for it (as
                // acquire_all.lua: the head gets it).
                _ => {
                    if let Some(head) = state.first_in_line(n.queue(), now) {
                        state.pop_line(n.queue());
                        let lease = head.lease.min(HANDOFF_LEASE);
                        let fencing = grant(&mut state, n, head.token, lease, now, "");
                        drop(state);
                        self.waiters
                            .grant(n.notice(), &head.token.digest(), fencing);
                        return Err((i, lease));
                    }
                }
            }
        }
        state.fence += 1;
        let fencing = state.fence;
        for n in names {
            let held = MemoryHold {
                token: *token,
                fencing,
                expires: now + ttl,
                label: String::new(),
            };
            state.locks.insert(n.lock.clone(), held);
        }
        Ok(fencing)
    }
}

/// Takes the lock for `token` (a leader's: labelled `label`) and returns
/// its new fencing token.
fn grant(
    state: &mut MemoryState,
    names: &KeyNames,
    token: Token,
    lease: Duration,
    now: Instant,
    label: &str,
) -> u64 {
    state.fence += 1;
    let fencing = state.fence;
    state.locks.insert(
        names.lock.clone(),
        MemoryHold {
            token,
            fencing,
            expires: now + lease,
            label: label.to_owned(),
        },
    );
    fencing
}

#[cfg(test)]
mod tests;
