//! Read-write locks and semaphores in the embedded backend: the semantics
//! of `shared.lua`, on a map kept behind the backend's mutex. Grants to
//! waiters are returned (token, fencing token), for the backend to notify
//! once its mutex is released.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::inspect::{Holding, Observed};
use crate::backend::{AcquireOutcome, HANDOFF_LEASE};
use crate::durations::later;
use crate::key::{Access, KeyNames};
use crate::token::Token;

/// One read-write lock or semaphore.
#[derive(Debug)]
struct SharedLock {
    /// The writer: token, lease end, fencing token.
    writer: Option<(Token, Instant, u64)>,
    /// Readers or permit holders: token, lease end, fencing token.
    holders: Vec<(Token, Instant, u64)>,
    /// Waiters in arrival order.
    queue: VecDeque<InLine>,
    queue_expires: Instant,
}

/// A waiter in line: what it asked for, and until when it waits.
#[derive(Clone, Copy, Debug)]
struct InLine {
    token: Token,
    lease: Duration,
    exclusive: bool,
    /// Its own most shared holders (0: no limit): a waiter is granted by its
    /// own count, not by the caller's that makes room.
    limit: u32,
    /// The end of its wait: past it the entry is skipped (shared.lua's
    /// deadlines).
    until: Instant,
}

/// Exclusive, and the most shared holders (0: no limit).
fn mode(access: Access) -> (bool, u32) {
    match access {
        Access::Exclusive => (true, 0),
        Access::Shared(limit) => (false, limit),
    }
}

impl SharedLock {
    fn new(now: Instant) -> Self {
        Self {
            writer: None,
            holders: Vec::new(),
            queue: VecDeque::new(),
            queue_expires: now,
        }
    }

    /// Drops what ended by `now`.
    fn expire(&mut self, now: Instant) {
        self.writer = self.writer.filter(|(_, until, _)| *until > now);
        self.holders.retain(|(_, until, _)| *until > now);
        if self.queue_expires <= now {
            self.queue.clear();
        }
    }

    fn is_empty(&self) -> bool {
        self.writer.is_none() && self.holders.is_empty() && self.queue.is_empty()
    }

    fn fits(&self, exclusive: bool, limit: u32) -> bool {
        self.writer.is_none()
            && if exclusive {
                self.holders.is_empty()
            } else {
                limit == 0 || self.holders.len() < limit as usize
            }
    }

    /// `token`'s lease end and fencing token, if it holds.
    fn holds(&mut self, token: &Token, exclusive: bool) -> Option<(&mut Instant, u64)> {
        let held = if exclusive {
            self.writer.as_mut().filter(|(t, ..)| t == token)
        } else {
            self.holders.iter_mut().find(|(t, ..)| t == token)
        };
        held.map(|(_, until, fencing)| (until, *fencing))
    }

    fn take(&mut self, token: Token, exclusive: bool, until: Instant, fencing: u64) {
        if exclusive {
            self.writer = Some((token, until, fencing));
        } else {
            self.holders.push((token, until, fencing));
        }
    }

    /// Grants the head of the queue while it fits (FIFO), each waiter by
    /// its own limit, with a hand-over lease, and skips the waiters whose
    /// wait has ended (but `caller`, which is here); returns the grants:
    /// token and fencing token.
    fn promote(&mut self, fence: &mut u64, caller: Option<&Token>, now: Instant) -> Grants {
        let mut granted = Vec::new();
        while let Some(&head) = self.queue.front() {
            if head.until <= now && Some(&head.token) != caller {
                self.queue.pop_front();
                continue;
            }
            if !self.fits(head.exclusive, head.limit) {
                break;
            }
            self.queue.pop_front();
            *fence += 1;
            let until = now + head.lease.min(HANDOFF_LEASE);
            self.take(head.token, head.exclusive, until, *fence);
            granted.push((head.token, *fence));
            if head.exclusive {
                break;
            }
        }
        granted
    }
}

/// Every read-write lock and semaphore, by its writer's name.
#[derive(Debug, Default)]
pub(super) struct SharedLocks(super::Names<SharedLock>);

/// Waiters granted by a call: token and fencing token.
pub(super) type Grants = Vec<(Token, u64)>;

impl SharedLocks {
    /// The state of the read-write lock or semaphore `names` (see
    /// [`crate::backend::inspect`]): holders by fencing token, waiters in line.
    pub(super) fn observe(&self, names: &KeyNames, fence: u64) -> Observed {
        let now = Instant::now();
        let Some(lock) = self.0.get(&names.lock) else {
            return Observed {
                fence,
                ..Observed::default()
            };
        };
        let holders: Vec<Holding> = lock
            .writer
            .iter()
            .chain(&lock.holders)
            .filter(|(_, until, _)| *until > now)
            .map(|(token, until, fencing)| Holding {
                token: token.as_str().to_owned(),
                fencing: Some(*fencing),
                remaining: Some(*until - now),
            })
            .collect();
        let waiting: Vec<String> = if lock.queue_expires > now {
            lock.queue
                .iter()
                .filter(|w| w.until > now)
                .map(|w| w.token.as_str().to_owned())
                .collect()
        } else {
            Vec::new()
        };
        Observed::shared(holders, waiting, fence)
    }

    /// Drops what ended by `now` (a periodic sweep).
    pub(super) fn sweep(&mut self, now: Instant) {
        self.0.retain(|_, lock| {
            lock.expire(now);
            !lock.is_empty()
        });
    }

    pub(super) fn acquire(
        &mut self,
        fence: &mut u64,
        names: &KeyNames,
        token: &Token,
        ttl: Duration,
        wait: Duration,
    ) -> (AcquireOutcome, Grants) {
        let now = Instant::now();
        let (exclusive, limit) = mode(names.access);
        let lock = self
            .0
            .entry(names.lock.clone())
            .or_insert_with(|| SharedLock::new(now));
        lock.expire(now);
        let mut granted = lock.promote(fence, Some(token), now);
        let outcome = if let Some((until, fencing)) = lock.holds(token, exclusive) {
            // Held already (granted just now, or handed over): the full
            // lease, and the token issued to it.
            *until = now + ttl;
            AcquireOutcome::Acquired { fencing }
        } else if lock.queue.is_empty() && lock.fits(exclusive, limit) {
            *fence += 1;
            lock.take(*token, exclusive, now + ttl, *fence);
            AcquireOutcome::Acquired { fencing: *fence }
        } else {
            let remaining = lock
                .writer
                .iter()
                .chain(&lock.holders)
                .map(|(_, until, _)| *until - now)
                .min()
                .unwrap_or(ttl);
            if !wait.is_zero() {
                let until = later(now, wait);
                match lock.queue.iter_mut().find(|w| w.token == *token) {
                    Some(waiter) => waiter.until = until,
                    None => lock.queue.push_back(InLine {
                        token: *token,
                        lease: ttl,
                        exclusive,
                        limit,
                        until,
                    }),
                }
                lock.queue_expires = lock.queue_expires.max(later(until, ttl));
            }
            AcquireOutcome::Busy {
                remaining,
                fence: *fence,
            }
        };
        if lock.is_empty() {
            self.0.remove(&names.lock);
        }
        granted.retain(|(t, _)| t != token);
        (outcome, granted)
    }

    pub(super) fn extend(&mut self, names: &KeyNames, token: &Token, ttl: Duration) -> bool {
        let now = Instant::now();
        let (exclusive, _) = mode(names.access);
        let Some(lock) = self.0.get_mut(&names.lock) else {
            return false;
        };
        lock.expire(now);
        match lock.holds(token, exclusive) {
            Some((until, _)) => {
                *until = now + ttl;
                true
            }
            None => false,
        }
    }

    pub(super) fn release(
        &mut self,
        fence: &mut u64,
        names: &KeyNames,
        token: &Token,
        dequeue: bool,
    ) -> (bool, Grants) {
        let now = Instant::now();
        let (exclusive, _) = mode(names.access);
        let Some(lock) = self.0.get_mut(&names.lock) else {
            return (false, Grants::new());
        };
        lock.expire(now);
        if dequeue {
            lock.queue.retain(|w| w.token != *token);
        }
        let ours = lock.holds(token, exclusive).is_some();
        if ours {
            if exclusive {
                lock.writer = None;
            } else {
                lock.holders.retain(|(t, ..)| t != token);
            }
        }
        // Also when not ours: the entry that left may have made room.
        let mut granted = lock.promote(fence, Some(token), now);
        if lock.is_empty() {
            self.0.remove(&names.lock);
        }
        granted.retain(|(t, _)| t != token);
        (ours, granted)
    }

    /// Drops every holder of `names` (an operator's force-release) and
    /// grants the waiters that now fit.
    pub(super) fn evict(&mut self, names: &KeyNames, fence: &mut u64) -> Grants {
        let now = Instant::now();
        let Some(lock) = self.0.get_mut(&names.lock) else {
            return Grants::new();
        };
        lock.writer = None;
        lock.holders.clear();
        lock.expire(now);
        let granted = lock.promote(fence, None, now);
        if lock.is_empty() {
            self.0.remove(&names.lock);
        }
        granted
    }
}
