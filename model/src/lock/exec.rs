//! Redis runs a client's request: the script calls and the ghost state they update.

use super::*;

impl LockModel {
    pub(super) fn spend(&self, s: &mut State) {
        s.budget.total -= 1;
        s.ghost.faults += 1;
    }

    pub(super) fn net_mut<'a>(&self, s: &'a mut State, c: u8, conn: Conn) -> &'a mut Net {
        let cl = &mut s.clients[c as usize];
        match conn {
            Conn::App => cl.app.as_mut(),
            Conn::Watchdog => cl.wd_net.as_mut(),
        }
        .expect("a request in flight")
    }

    /// Redis runs a request.
    pub(super) fn exec(&self, s: &mut State, c: u8, conn: Conn, log: &mut Log) {
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
            // The plain `SET NX` on a free key takes it; on a taken key it
            // answers nil and changes nothing, and the client sends
            // acquire.lua at once (which starts with the same `SET NX`):
            // one step here, as if acquire.lua alone had been sent (the
            // validity still counts from the first send). Any other step
            // that could fall between the two falls before this one.
            Req::SetNx { .. } if s.server.set_nx(now, token, ttl) => {
                // Ghost: a lease of c's starts now.
                s.clients[c as usize].lease_ended = false;
                (
                    Resp::SetNx,
                    "SET NX: OK, taken without a fencing token".to_string(),
                )
            }
            Req::Mint => {
                let before = s.server.fence;
                let f = s.server.mint(now, token, self.cfg.mint_checks_owner);
                if s.server.fence != before {
                    self.issued_to(s, c, f);
                } else {
                    s.ghost.mint_refused = true;
                }
                let text = if f == 0 {
                    "0 (not ours: our lease ended)".to_string()
                } else {
                    format!("minted fencing {f}")
                };
                (Resp::Minted(f), format!("mint.lua: {text}"))
            }
            // The plain compare-and-delete; when it deletes nothing it
            // changes nothing, and the client sends release.lua at once
            // (told whether a copy may have run before): one step here,
            // as for `SET NX` above.
            Req::Unlock if s.server.unlock(token) => {
                (Resp::Unlocked, "DELIFEQ: deleted".to_string())
            }
            Req::Acquire { wait } | Req::SetNx { wait } => {
                let before = s.server.fence;
                let (r, notice) =
                    s.server
                        .acquire(now, token, ttl, wait, self.cfg.handoff, self.scripts());
                if let AcqReply::Granted(f) = r {
                    if s.server.fence != before {
                        self.issued_to(s, c, f);
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
                            "busy for {remaining} more ticks, counter {fence}; {} queued, holder marked with its deadline, key pinned",
                            name(c)
                        )
                    }
                    AcqReply::Busy { remaining, .. } => {
                        format!("busy for {remaining} more ticks")
                    }
                };
                if matches!(net.req, Req::SetNx { .. }) {
                    text = format!("SET NX: nil; acquire.lua: {text}");
                }
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
            Req::Release { .. } | Req::Unlock => {
                let dequeue = net.req == Req::Release { dequeue: true };
                let (r, notice) = s.server.release(
                    now,
                    token,
                    self.cfg.handoff,
                    dequeue.then_some((token, ttl)),
                    self.scripts(),
                );
                if let Some(Notice::Grant { to, fence }) = notice {
                    self.handed(s, to, fence);
                }
                let mut text = match r {
                    RelReply::NotOurs => "not ours (0)".to_string(),
                    RelReply::Released => "released".to_string(),
                    RelReply::Handed { to, fence } => format!(
                        "released and handed to {} (fencing {fence}, lease {}), notice published",
                        name(to),
                        ttl.min(self.cfg.handoff)
                    ),
                };
                if net.req == Req::Unlock {
                    text = format!("DELIFEQ: 0; release.lua: {text}");
                }
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
            if let Some(new) = owner
                && owner != owner_before
            {
                self.tenure_begins(s, Some(new));
            }
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
    pub(super) fn scripts(&self) -> Scripts {
        Scripts {
            fifo_on_expiry: self.cfg.fifo_on_expiry,
            skip_ended_waits: self.cfg.skip_ended_waits,
            line_pins_key: self.cfg.line_pins_key,
            mint_checks_owner: self.cfg.mint_checks_owner,
        }
    }

    /// Ghost: a holder's tenure begins (the server gave the key to the
    /// acquisition of token `server`; `None`: a task of a process took the
    /// lease handed on in it). Every other client holding a guard is now
    /// superseded: a token issued to it from now on would sit above the
    /// new holder's, although it held the key before.
    pub(super) fn tenure_begins(&self, s: &mut State, server: Option<u8>) {
        for (i, cl) in s.clients.iter_mut().enumerate() {
            if Some(i as u8) == server {
                cl.superseded = false;
            } else if cl.holding() && server.is_none_or(|t| cl.token != t) {
                cl.superseded = true;
            }
        }
    }

    /// A fencing token `f` issued to client `c`'s tenure: strictly above
    /// every earlier one, and never to a holder a later one superseded.
    pub(super) fn issued_to(&self, s: &mut State, c: u8, f: u8) {
        self.issued(s, f);
        if s.clients[c as usize].superseded {
            s.ghost.token_after_later_holder = true;
        }
    }

    /// `c`'s entry `e` in the queue stands for a waiter still waiting: its
    /// wait not over, and its client not crashed, done or giving up.
    pub(super) fn live_waiter(&self, s: &State, e: &Entry) -> bool {
        self.lives(s, e.token, e.waiting_at(s.now))
    }

    /// The waiter of token `token`, whose entry's wait is `waiting`, still
    /// waits: its client not crashed, done or giving up.
    pub(super) fn lives(&self, s: &State, token: u8, waiting: bool) -> bool {
        let cl = &s.clients[token as usize];
        cl.token == token
            && waiting
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
    pub(super) fn line_ghost(
        &self,
        s: &mut State,
        before: &[Entry],
        to: Option<Option<u8>>,
        caller: u8,
    ) {
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

    /// `Acquisition::wait_for_turn`: a grant above the counter a busy attempt saw was
    /// sent after that attempt ran (every grant, for the old client).
    pub(super) fn fresh(&self, cl: &Client, fence: u8) -> bool {
        !self.cfg.check_stale_grants || fence > cl.fence_seen
    }

    /// The script a step sends, for traces: `mutex` (a file), or shared.lua
    /// with `op`.
    pub(super) fn script(&self, mutex: &'static str, op: &'static str) -> String {
        match self.cfg.shared {
            None => mutex.to_string(),
            Some(_) => format!("shared.lua {op}"),
        }
    }

    /// A script handed the lease to `to` with `fence`: a token issued, a
    /// lease of `to`'s starts, and the notice is published to every
    /// subscribed process (release.lua's and acquire.lua's `PUBLISH`, shared.lua `promote`).
    pub(crate) fn handed(&self, s: &mut State, to: u8, fence: u8) {
        self.issued_to(s, to, fence);
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
}
