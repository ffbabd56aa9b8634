//! The key's state on the server and the scripts that change it (acquire.lua,
//! extend.lua, reserve.lua, release.lua), as the lock model runs them.

use super::*;

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
    /// The end of its wait (`ZADD` of server time + `ARGV[4]` when it
    /// joined): from this tick on, the scripts skip it.
    pub until: u8,
}

impl Entry {
    /// The queue's member `token:lease` (the deadline is not part of it).
    pub(super) fn is(&self, token: u8, lease: u8) -> bool {
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
    pub(super) fn expire(&mut self, now: u8) -> Option<u8> {
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
    pub(super) fn hand_to_head(&mut self, now: u8, cap: u8, skip_ended: bool) -> Option<Notice> {
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
    pub(super) fn acquire(
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
        // Join the queue once (`ZSCORE` of the deadlines: an entry is in the
        // list exactly when it is in the sorted set, one `Entry` here;
        // `RPUSH`, `ZADD` now + wait).
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
    pub(super) fn extend(&mut self, now: u8, token: u8, lease: u8) -> bool {
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
    pub(super) fn reserve(&mut self, now: u8, token: u8, lease: u8, block: u8) -> u8 {
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

    /// release.lua with `ARGV[3]` absent (single Redis: every waiter queues).
    pub(super) fn release(
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
        // `ARGV[3]` is absent on single Redis: no notice.
        (RelReply::Released, None)
    }
}
