//! The key's state on the server and the commands and scripts that change
//! it (the plain `SET NX` and compare-and-delete, acquire.lua, extend.lua,
//! mint.lua, reserve.lua, release.lua), as the lock model runs them.
//! Scripts are cited by the comments that open their steps, never by line.

use super::*;

/// The value of the lock key and its expiry: its owner's token while
/// nobody waits; `token+deadline` once somebody queued
/// (acquire.lua, "it is marked: 'token+deadline'"), the deadline being the
/// end of the owner's lease, and the key itself then living until that
/// deadline or the end of the longest wait in line, whichever is later
/// (acquire.lua, "local function pin(").
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Val {
    /// The owner's token (a client index).
    pub owner: u8,
    /// The mark: `Some(deadline)`, the end of the owner's lease, once
    /// somebody queued behind it; `None` while the key's own expiry is the
    /// lease.
    pub ends: Option<u8>,
    /// The key is gone once the clock reaches this.
    pub expires: u8,
}

impl Val {
    /// Marked (somebody may be queued behind the owner).
    pub fn marked(&self) -> bool {
        self.ends.is_some()
    }

    /// The owner's lease has not ended at `now`: unmarked (the key's own
    /// expiry is the lease), or marked with a deadline still ahead (the
    /// scripts' `ends > now`).
    pub fn leased_at(&self, now: u8) -> bool {
        self.ends.is_none_or(|d| now < d)
    }
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

/// Which scripts run: today's, or one of the mistakes the vacuity tests
/// switch on ([`LockConfig::fifo_on_expiry`], [`LockConfig::skip_ended_waits`],
/// [`LockConfig::line_pins_key`], [`LockConfig::mint_checks_owner`]).
#[derive(Clone, Copy, Debug)]
pub struct Scripts {
    /// A key found free, or pinned past its owner's deadline, with a line
    /// behind it goes to the line.
    pub fifo_on_expiry: bool,
    /// Entries whose wait has ended are skipped.
    pub skip_ended_waits: bool,
    /// A marked key lives until the end of the longest wait in line.
    pub line_pins_key: bool,
    /// mint.lua checks that the lock is still the caller's.
    pub mint_checks_owner: bool,
}

/// What the release script answers.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum RelReply {
    /// `0`: absent, another owner's, or ours with a deadline that has passed.
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
    /// Redis's expiry at `now`: the key goes once its expiry is reached,
    /// the queue likewise. The owner whose lease ended at this tick, if
    /// any: the key's own expiry for an unmarked value, the deadline of a
    /// marked one (the key may live on, pinned by its line).
    pub(super) fn expire(&mut self, now: u8) -> Option<u8> {
        let mut ended = None;
        if let Some(v) = self.lock {
            if v.ends == Some(now) || (v.ends.is_none() && v.expires <= now) {
                ended = Some(v.owner);
            }
            if v.expires <= now {
                self.lock = None;
            }
        }
        if !self.queue.is_empty() && self.queue_expires <= now {
            self.queue.clear();
        }
        ended
    }

    /// acquire.lua, "local function pin(": marks the key as `token`'s,
    /// whose lease ends at `deadline`, and keeps it until the end of the
    /// longest wait in line if that is later (`ZRANGE ... -1 -1
    /// WITHSCORES`, `SET ... PXAT`). Without `pins` (a mistake the model
    /// must catch) the key keeps only the owner's lease.
    fn pin(&mut self, token: u8, deadline: u8, pins: bool) {
        let longest = self.queue.iter().map(|e| e.until).max().unwrap_or(0);
        self.lock = Some(Val {
            owner: token,
            ends: Some(deadline),
            expires: if pins {
                deadline.max(longest)
            } else {
                deadline
            },
        });
    }

    /// The hand-over shared by release.lua and acquire.lua's free path:
    /// pops the line's first entry whose wait has not ended (with
    /// `skip_ended_waits`; else the first) and sets the key to it, marked
    /// with a deadline `min(its lease, cap)` from now and pinned, with an
    /// `INCR` of the slot counter; the grant notice. `None` when nobody is
    /// left in line.
    pub(super) fn hand_to_head(&mut self, now: u8, cap: u8, scripts: Scripts) -> Option<Notice> {
        let mut entry = None;
        while !self.queue.is_empty() {
            // `LPOP`, `ZSCORE`, `ZREM`: an entry whose wait has ended is a
            // waiter that gave up (or died) without leaving.
            let e = self.queue.remove(0);
            if !scripts.skip_ended_waits || e.waiting_at(now) {
                entry = Some(e);
                break;
            }
        }
        let entry = entry?;
        self.fence += 1;
        self.pin(
            entry.token,
            now + entry.lease.min(cap),
            scripts.line_pins_key,
        );
        Some(Notice::Grant {
            to: entry.token,
            fence: self.fence,
        })
    }

    /// The uncontended acquire, `SET key token NX PX ttl` (plain.rs
    /// `acquire_plain`): `true` when it took the key, unmarked and without
    /// a fencing token (minted on first use).
    pub(super) fn set_nx(&mut self, now: u8, token: u8, lease: u8) -> bool {
        if self.lock.is_some() {
            return false;
        }
        self.lock = Some(Val {
            owner: token,
            ends: None,
            expires: now + lease,
        });
        true
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
        let pins = scripts.line_pins_key;
        // "Free: one write takes it": `SET NX PX`, then `EXISTS` of the
        // line; nobody in it: `INCR`.
        let granted = self.set_nx(now, token, lease);
        if granted && self.queue.is_empty() {
            self.fence += 1;
            return (AcqReply::Granted(self.fence), None);
        }
        let v = self.lock.expect("set above or held");
        // "Free, or pinned by a line past the end of its owner's lease".
        if granted || !v.leased_at(now) {
            if !scripts.fifo_on_expiry {
                // The script before commit 7dbf470: the line is not looked
                // at; the caller takes the key, leaving the line if it was
                // in it (the client of then asked so after a waiting
                // attempt), marked if others stay in line.
                self.queue.retain(|e| !e.is(token, lease));
                self.take(now, token, lease, granted, pins);
                self.fence += 1;
                return (AcqReply::Granted(self.fence), None);
            }
            // Entries whose wait is over go, unless the head is the
            // caller's own ("Its wait is over").
            while let Some(head) = self.queue.first()
                && !head.is(token, lease)
                && scripts.skip_ended_waits
                && !head.waiting_at(now)
            {
                self.queue.remove(0);
            }
            if self.queue.first().is_none_or(|head| head.is(token, lease)) {
                // The caller is first in line (or the line emptied): it
                // takes the key, leaving the line; "Marked and pinned" if
                // others remain.
                if !self.queue.is_empty() {
                    self.queue.remove(0);
                }
                self.take(now, token, lease, granted, pins);
                self.fence += 1;
                return (AcqReply::Granted(self.fence), None);
            }
            // "Somebody else is first in line: hand it over, as
            // release.lua does"; the caller goes on as if it found the key
            // held by that entry.
            notice = self.hand_to_head(now, cap, scripts);
        }
        let v = self.lock.expect("set above or held");
        if v.owner == token {
            // "Ours already": an earlier copy of this attempt (or a plain
            // SET) took it and its reply was lost. Re-armed to a full lease
            // (pinned again when marked), and a token minted now, while
            // ours.
            match v.ends {
                Some(_) => self.pin(token, now + lease, pins),
                None => {
                    self.lock = Some(Val {
                        expires: now + lease,
                        ..v
                    });
                }
            }
            self.fence += 1;
            return (AcqReply::Granted(self.fence), notice);
        }
        // Another owner's: its lease's end, the deadline when marked. (A
        // key without an expiry is never set by these scripts.)
        let ends = v.ends.unwrap_or(v.expires);
        let ttl = ends - now;
        if wait == 0 {
            return (
                AcqReply::Busy {
                    remaining: ttl,
                    fence: 0,
                },
                notice,
            );
        }
        // "Queued already?" (`ZSCORE` of the deadlines: an entry is in the
        // list exactly when it is in the sorted set, one `Entry` here);
        // else `RPUSH`, `ZADD` now + wait.
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
        // "The queue outlives the longest wait in it plus one lease".
        let keep = wait + lease;
        if self.queue_expires.saturating_sub(now) < keep {
            self.queue_expires = now + keep;
        }
        // "Marked with the owner's deadline, and pinned past our wait's end".
        self.pin(v.owner, ends, pins);
        // `{-ttl, counter}`: the counter as this attempt saw it.
        (
            AcqReply::Busy {
                remaining: ttl,
                fence: self.fence,
            },
            notice,
        )
    }

    /// acquire.lua's free path giving the key to the caller: marked and
    /// pinned when a line is left behind it; else its own `SET NX` stands
    /// (`granted`), or a plain `SET ... PX` replaces a pinned value.
    fn take(&mut self, now: u8, token: u8, lease: u8, granted: bool, pins: bool) {
        if !self.queue.is_empty() {
            self.pin(token, now + lease, pins);
        } else if !granted {
            self.lock = Some(Val {
                owner: token,
                ends: None,
                expires: now + lease,
            });
        }
    }

    /// extend.lua and extend_many.lua (one lease): re-armed if ours. A
    /// marked value whose deadline has passed is no longer ours (0); else
    /// it gets the new deadline and the key keeps its pin (its expiry only
    /// moves later, never before the new deadline).
    pub(super) fn extend(&mut self, now: u8, token: u8, lease: u8) -> bool {
        let Some(v) = self.lock.filter(|v| v.owner == token && v.leased_at(now)) else {
            return false;
        };
        self.lock = Some(match v.ends {
            None => Val {
                expires: now + lease,
                ..v
            },
            Some(_) => Val {
                owner: token,
                ends: Some(now + lease),
                expires: v.expires.max(now + lease),
            },
        });
        true
    }

    /// mint.lua: the fencing token of the lock `token` holds, minted on
    /// first use (`INCR` of the slot counter), or `0` when the lock is not
    /// ours (absent, another owner's, or marked with a deadline that has
    /// passed). Without `checks_owner` (a mistake the model must catch)
    /// every call mints.
    pub(super) fn mint(&mut self, now: u8, token: u8, checks_owner: bool) -> u8 {
        let ours = self
            .lock
            .is_some_and(|v| v.owner == token && v.leased_at(now));
        if !ours && checks_owner {
            return 0;
        }
        self.fence += 1;
        self.fence
    }

    /// reserve.lua: keep the lock for a hand-over in the owner's process
    /// and reserve `block` fencing tokens; the highest, or `0` (another
    /// owner's, absent, somebody queued behind us, or our deadline passed).
    /// The mark goes (`SET key token PX lease`; an unmarked value keeps
    /// its value and gets the lease by `PEXPIRE`: the same state).
    pub(super) fn reserve(&mut self, now: u8, token: u8, lease: u8, block: u8) -> u8 {
        match self.lock {
            Some(v) if v.owner == token && !v.marked() => {}
            Some(v) if v.owner == token && self.queue.is_empty() && v.leased_at(now) => {}
            _ => return 0,
        }
        self.lock = Some(Val {
            owner: token,
            ends: None,
            expires: now + lease,
        });
        // `INCRBY` the slot counter.
        self.fence += block;
        self.fence
    }

    /// The plain release: `DELIFEQ key token` (Valkey 9), `DELEX key IFEQ
    /// token` (Redis 8.4) or unlock.lua,
    /// which delete the key only when its value is exactly our token
    /// (plain.rs `unlock`): `true` when deleted. A marked value (somebody
    /// queued) or another owner's is left to release.lua.
    pub(super) fn unlock(&mut self, token: u8) -> bool {
        if self.lock.is_some_and(|v| v.owner == token && !v.marked()) {
            self.lock = None;
            return true;
        }
        false
    }

    /// release.lua with `ARGV[3]` absent (single Redis: every waiter queues).
    pub(super) fn release(
        &mut self,
        now: u8,
        token: u8,
        cap: u8,
        dequeue: Option<(u8, u8)>,
        scripts: Scripts,
    ) -> (RelReply, Option<Notice>) {
        // Leave the queue first (`LREM`, `ZREM` of `ARGV[4]`).
        if let Some((token, lease)) = dequeue
            && let Some(i) = self.queue.iter().position(|e| e.is(token, lease))
        {
            self.queue.remove(i);
        }
        // Ours, or ours with the mark and a deadline still ahead.
        let Some(v) = self.lock.filter(|v| v.owner == token && v.leased_at(now)) else {
            return (RelReply::NotOurs, None);
        };
        self.lock = None;
        // Marked: hand over to the first entry whose wait has not ended
        // (`hand_to_head`; release.lua's `SET` replaces our value without
        // a `DEL` first, the same state). Unmarked ("The plain release"):
        // the queue is not looked at.
        if v.marked()
            && let Some(notice) = self.hand_to_head(now, cap, scripts)
        {
            let Notice::Grant { to, fence } = notice;
            return (RelReply::Handed { to, fence }, Some(notice));
        }
        // `ARGV[3]` is absent on single Redis: no notice.
        (RelReply::Released, None)
    }
}
