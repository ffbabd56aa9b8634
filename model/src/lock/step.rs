//! `step`: one function per action, and the ghost state every step updates.

use super::*;

impl LockModel {
    /// [`Narrate::apply`]: applies `action`; `log` gets the narration when
    /// narrating.
    pub(super) fn step(&self, s: &mut State, action: Action, log: &mut Log) {
        match action {
            Action::Tick => self.tick(s, log),
            Action::Start(c) => self.start(s, c, log),
            Action::Attempt(c) => self.attempt(s, c, log),
            Action::Exec(c, conn) => self.exec(s, c, conn, log),
            Action::Receive(c, conn) => self.receive(s, c, conn, log),
            Action::Deliver(c) => self.deliver(s, c, log),
            Action::Woken(c) => self.woken(s, c, log),
            Action::Timer(c) => self.timer(s, c, log),
            Action::Renew(c) => self.renew(s, c, log),
            Action::RenewTimeout(c) => self.renew_timeout(s, c, log),
            Action::Write(c) => self.write(s, c, log),
            Action::Mint(c) => self.mint(s, c, log),
            Action::Release(c) => self.release(s, c, log),
            Action::Crash(c) => self.crash(s, c, log),
            Action::Pause(c) => self.pause(s, c, log),
            Action::LoseRequest(c, conn) => self.lose_request(s, c, conn, log),
            Action::LoseReply(c, conn) => self.lose_reply(s, c, conn, log),
            Action::LoseNotice(c) => self.lose_notice(s, c, log),
            Action::OtherKey => self.other_key(s, log),
            Action::LineTimeout(c) => self.line_timeout(s, c, log),
            Action::LineLost(c) => self.line_lost(s, c, log),
        }
        // Ghost: when did the key become free?
        match (s.held(), s.ghost.free_since) {
            (false, None) => s.ghost.free_since = Some(s.now),
            (true, Some(_)) => s.ghost.free_since = None,
            _ => {}
        }
        if self.cfg.shared.is_some() {
            SharedGhost::track(s);
        }
    }

    /// [`Action::Tick`].
    fn tick(&self, s: &mut State, log: &mut Log) {
        s.now += 1;
        let now = s.now;
        log.say(|| "time passes".into());
        // `settle` and `renew_call` (watchdog/mod.rs): the watchdog's timer at
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

    /// [`Action::Start`].
    fn start(&self, s: &mut State, c: u8, log: &mut Log) {
        let now = s.now;
        let wait = self.cfg.waits[c as usize];
        // `LockRequest::acquire`: a task with a wait enters its line.
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
            // `Acquisition::start`: a deadline, a token; registering first
            // only where notices already reach us (never, for a process's
            // first acquisition).
            cl.last_busy = now;
            cl.phase = Phase::Attempting;
            log.say(|| format!("{}: acquire() with a wait of {wait} ticks", name(c)));
        }
    }

    /// [`Action::Attempt`].
    fn attempt(&self, s: &mut State, c: u8, log: &mut Log) {
        let now = s.now;
        let ci = c as usize;
        match s.clients[ci].phase {
            Phase::Confirming { fence, sent: None } => {
                // `Acquisition::confirm`: trusted as it is while a third is left,
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
                // The first attempt of a mutex is a plain `SET NX` (only a
                // taken key goes on to acquire.lua); later ones, after a
                // busy answer, go to the script (`Acquisition::plain`,
                // cleared by the busy answer that also registers the
                // acquisition for notices, or ends it).
                let plain = !s.clients[ci].registered && self.cfg.shared.is_none();
                let req = if plain {
                    Req::SetNx { wait: wait_arg }
                } else {
                    Req::Acquire { wait: wait_arg }
                };
                s.clients[ci].app = Some(Net::new(req, 0, false));
                s.clients[ci].phase = Phase::AcquireSent { sent: now };
                log.say(|| {
                    format!(
                        "{}: sends {} (wait {wait_arg})",
                        name(c),
                        if plain {
                            "SET NX".to_string()
                        } else {
                            self.script("acquire.lua", "acquire")
                        },
                    )
                });
            }
        }
    }

    /// [`Action::Deliver`].
    fn deliver(&self, s: &mut State, c: u8, log: &mut Log) {
        let cl = &mut s.clients[c as usize];
        let notice = cl.inbox.remove(0);
        let Notice::Grant { to, fence } = notice;
        // `Registry::deliver` and `Registry::grant` (backend/waiters.rs): routed to the named waiter; one other
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

    /// [`Action::Woken`].
    fn woken(&self, s: &mut State, c: u8, log: &mut Log) {
        let now = s.now;
        let handoff = self.cfg.handoff;
        let cl = &mut s.clients[c as usize];
        cl.notified = false;
        let Phase::Waiting { retry_at } = cl.phase else {
            unreachable!()
        };
        // `Acquisition::wait_for_turn`
        if cl.granted != 0 {
            let fence = std::mem::take(&mut cl.granted);
            if self.fresh(cl, fence) {
                cl.phase = Phase::Confirming { fence, sent: None };
                log.say(|| format!("{}: wakes: granted, fencing {fence}", name(c)));
            } else {
                // `Acquisition::wait_for_turn`: stale; the next attempt tells.
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

    /// [`Action::Timer`].
    fn timer(&self, s: &mut State, c: u8, log: &mut Log) {
        // `Acquisition::wait_for_turn`: the lease timer won the select (even if a
        // notice is there too: select picks either).
        let cl = &mut s.clients[c as usize];
        cl.phase = Phase::Attempting;
        log.say(|| format!("{}: its lease timer fires, tries again", name(c)));
    }

    /// [`Action::Renew`].
    fn renew(&self, s: &mut State, c: u8, log: &mut Log) {
        let now = s.now;
        let cl = &mut s.clients[c as usize];
        // `take_due` (watchdog/mod.rs)
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

    /// [`Action::RenewTimeout`].
    fn renew_timeout(&self, s: &mut State, c: u8, log: &mut Log) {
        let cl = &mut s.clients[c as usize];
        cl.wd_net = None;
        // `settle` (watchdog/mod.rs)
        cl.lost = true;
        cl.wd = None;
        log.say(|| {
            format!(
                "{}: watchdog: renewal unanswered at its validity, lost()",
                name(c)
            )
        });
    }

    /// [`Action::Write`].
    pub(super) fn write(&self, s: &mut State, c: u8, log: &mut Log) {
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

    /// [`Action::Mint`]: `Held::fencing_token` (held.rs) asks mint.lua (a
    /// shared lock: shared.lua's `mint`); the holder waits for the answer.
    fn mint(&self, s: &mut State, c: u8, log: &mut Log) {
        let cl = &mut s.clients[c as usize];
        cl.phase = Phase::Minting;
        cl.app = Some(Net::new(Req::Mint, 1, false));
        let script = if self.cfg.shared.is_some() {
            "shared.lua mint"
        } else {
            "mint.lua"
        };
        log.say(|| format!("{}: fencing_token(): sends {script}", name(c)));
    }

    /// [`Action::Release`].
    fn release(&self, s: &mut State, c: u8, log: &mut Log) {
        let cl = &mut s.clients[c as usize];
        // `LockGuard::release`: `was_lost` is read first.
        let was_lost = cl.lost;
        cl.ended_at_release = cl.lease_ended;
        // Ghost: no token is asked for any more.
        cl.superseded = false;
        log.say(|| format!("{}: release()", name(c)));
        // `LockGuard::release`: a task waits in line: hand on.
        if !was_lost && self.has_waiters(s, c) {
            self.hand_on(s, c, None, log);
        } else {
            self.release_to_server(s, c, was_lost, log);
        }
    }

    /// [`Action::Crash`].
    fn crash(&self, s: &mut State, c: u8, log: &mut Log) {
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
            cl.superseded = false;
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

    /// [`Action::Pause`].
    fn pause(&self, s: &mut State, c: u8, log: &mut Log) {
        let now = s.now;
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

    /// [`Action::LoseRequest`].
    fn lose_request(&self, s: &mut State, c: u8, conn: Conn, log: &mut Log) {
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

    /// [`Action::LoseReply`].
    fn lose_reply(&self, s: &mut State, c: u8, conn: Conn, log: &mut Log) {
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

    /// [`Action::LoseNotice`].
    fn lose_notice(&self, s: &mut State, c: u8, log: &mut Log) {
        s.budget.lost_notice -= 1;
        self.spend(s);
        s.clients[c as usize].inbox.remove(0);
        log.say(|| format!("FAULT {}: a notice is lost", name(c)));
    }

    /// [`Action::OtherKey`].
    fn other_key(&self, s: &mut State, log: &mut Log) {
        s.other_keys -= 1;
        // Not this key's token: only the shared counter rises.
        s.server.fence += 1;
        let f = s.server.fence;
        log.say(|| format!("another key of the slot takes fencing token {f}"));
    }

    /// [`Action::LineTimeout`].
    fn line_timeout(&self, s: &mut State, c: u8, log: &mut Log) {
        // `Local::wait`: the deadline: leave the line, `Busy`.
        let line = &mut s.lines[self.cfg.process[c as usize] as usize];
        line.waiters.retain(|&w| w != c);
        s.clients[c as usize].phase = Phase::Done(End::Busy);
        log.say(|| format!("{}: its wait in line runs out; acquire() -> Busy", name(c)));
    }

    /// [`Action::LineLost`].
    fn line_lost(&self, s: &mut State, c: u8, log: &mut Log) {
        // `Local::wait`: the holder lost its lease without a
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
