//! The client's own steps: holding, giving up, failing, its process's line and
//! its local hand-over, the release to the server.

use super::*;

impl LockModel {
    /// `Acquisition::hold` (client/acquire.rs) and `Watchdog::watch`
    /// (watchdog/mod.rs).
    pub(super) fn hold(
        &self,
        s: &mut State,
        c: u8,
        fence: u8,
        sent: u8,
        granted: u8,
        log: &mut Log,
    ) {
        let now = s.now;
        let cl = &mut s.clients[c as usize];
        cl.phase = Phase::Hold;
        cl.fencing = fence;
        cl.valid_until = sent + granted;
        cl.wd = Some(Watch {
            due: sent + granted / 3,
            busy: None,
        });
        cl.acquired_at = now;
        // The wait handle is dropped with the acquisition.
        cl.registered = false;
        cl.notified = false;
        let until = cl.valid_until;
        log.say(|| format!("{}: holds, fencing {fence}, valid until t={until}", name(c)));
        if self.cfg.in_line(c) {
            // `Acquisition::hold` calls `Local::hold` (client/local/mod.rs), then the
            // `Representing` duty ends (`LockRequest::acquire`): nobody to promote.
            let line = &mut s.lines[self.cfg.process[c as usize] as usize];
            line.holder = Some(c);
            line.block = None;
            line.representative = false;
        }
    }

    /// `Acquisition::give_up` (client/acquire.rs): give up; leave the queue if we may have joined it.
    pub(super) fn give_up(&self, s: &mut State, c: u8, log: &mut Log) {
        let queued = self.cfg.waits[c as usize] != 0;
        let cl = &mut s.clients[c as usize];
        cl.registered = false;
        if queued {
            cl.phase = Phase::GivingUp;
            cl.app = Some(Net::new(Req::Release { dequeue: true }, 1, false));
            log.say(|| {
                format!(
                    "{}: deadline passed, leaves the queue ({})",
                    name(c),
                    self.script("release.lua", "release")
                )
            });
        } else {
            cl.phase = Phase::Done(End::Busy);
            log.say(|| format!("{}: busy, gives up", name(c)));
            self.represent_end(s, c, log);
        }
    }

    /// The acquisition fails: the `Attempt` is dropped and releases in the
    /// background (`Attempt::drop` in client/acquire.rs, `release_in_background`
    /// in client/release.rs).
    pub(super) fn fail(&self, s: &mut State, c: u8, end: End, log: &mut Log) {
        let queued = self.cfg.waits[c as usize] != 0;
        let cl = &mut s.clients[c as usize];
        cl.phase = Phase::Done(end);
        cl.registered = false;
        cl.app = Some(Net::new(self.release_req(queued), 1, true));
        log.say(|| {
            format!(
                "{}: gives up ({end:?}); releases in the background",
                name(c)
            )
        });
        self.represent_end(s, c, log);
    }

    /// The process of `c` in traces: `A`, or `A+B` for a shared one.
    pub(super) fn process_name(&self, c: u8) -> String {
        self.cfg
            .tasks_of(c)
            .map(name)
            .map(String::from)
            .collect::<Vec<_>>()
            .join("+")
    }

    /// `Local::enter` (client/local/mod.rs) for a task with a wait: `true` to
    /// wait in line; `false` to acquire on the server as the line's
    /// representative.
    pub(super) fn enter(&self, s: &mut State, c: u8) -> bool {
        let line = &mut s.lines[self.cfg.process[c as usize] as usize];
        // `Local::enter`: a holder lost without a release holds nothing.
        if line.holder.is_some_and(|h| s.clients[h as usize].lost) {
            line.holder = None;
            line.block = None;
        }
        // `Local::enter`: nobody holds or acquires for the line: acquire on the server.
        if line.holder.is_none() && !line.representative {
            line.representative = true;
            return false;
        }
        // `Local::enter`: otherwise wait in line.
        line.waiters.push(c);
        true
    }

    /// `Slot::promote` (client/local/mod.rs): with nobody holding or acquiring on
    /// the server, the first waiter acquires on the server for the line.
    pub(super) fn promote(&self, s: &mut State, p: u8, log: &mut Log) {
        let now = s.now;
        let line = &mut s.lines[p as usize];
        if line.holder.is_some() || line.representative || line.waiters.is_empty() {
            return;
        }
        let w = line.waiters.remove(0);
        line.representative = true;
        s.ghost.line_to_server = true;
        // `LockRequest::acquire` then `Acquisition::start`: what is left of the
        // wait (at least 1 ms: the deadline, at the earliest now).
        let cl = &mut s.clients[w as usize];
        cl.deadline = cl.deadline.max(now);
        cl.last_busy = now;
        cl.phase = Phase::Attempting;
        log.say(|| format!("{}: acquires on the server for its line", name(w)));
    }

    /// `Representing::drop` (client/local/mod.rs): `c`'s acquisition on the
    /// server ended without holding.
    pub(super) fn represent_end(&self, s: &mut State, c: u8, log: &mut Log) {
        if self.cfg.in_line(c) {
            let p = self.cfg.process[c as usize];
            s.lines[p as usize].representative = false;
            self.promote(s, p, log);
        }
    }

    /// `Local::end` (client/local/mod.rs): `c`'s lease goes back to the server.
    pub(super) fn line_end(&self, s: &mut State, c: u8, log: &mut Log) {
        if !self.cfg.in_line(c) {
            return;
        }
        let p = self.cfg.process[c as usize];
        let line = &mut s.lines[p as usize];
        if line.holder == Some(c) {
            line.holder = None;
            line.block = None;
            self.promote(s, p, log);
        }
    }

    /// `Local::has_waiters` (client/local/mod.rs).
    pub(super) fn has_waiters(&self, s: &State, c: u8) -> bool {
        self.cfg.in_line(c) && {
            let line = &s.lines[self.cfg.process[c as usize] as usize];
            line.holder == Some(c) && !line.waiters.is_empty()
        }
    }

    /// `hand_on` (client/handover.rs), from the top of its loop; `fresh`: the
    /// first token of a block just reserved.
    pub(super) fn hand_on(&self, s: &mut State, c: u8, fresh: Option<u8>, log: &mut Log) {
        let now = s.now;
        let cl = &s.clients[c as usize];
        // `hand_on`: somebody to hand on to, and the lease sure
        // beyond `MARGIN` (less than a tick: sure at `now`).
        if !self.has_waiters(s, c) || cl.lost || now >= cl.valid_until {
            log.say(|| {
                format!(
                    "{}: nobody to hand on to, or the lease is not sure",
                    name(c)
                )
            });
            self.release_to_server(s, c, false, log);
            return;
        }
        let p = self.cfg.process[c as usize] as usize;
        // `hand_on` and `Local::take_token` (no prefetch, no
        // `BLOCK_FOR`: a block is used until it runs out).
        let taken = fresh.or_else(|| {
            let (next, top) = s.lines[p].block.as_mut()?;
            (*next <= *top).then(|| {
                *next += 1;
                *next - 1
            })
        });
        let Some(fencing) = taken else {
            // `hand_on`: reserve a block.
            let cl = &mut s.clients[c as usize];
            cl.phase = Phase::HandingOn;
            cl.app = Some(Net::new(Req::Reserve, 0, false));
            log.say(|| format!("{}: sends reserve.lua to hand on in its process", name(c)));
            return;
        };
        // `Local::pass`, then `Watchdog::hand_on` (the same
        // entry: validity and a renewal in flight go along).
        let w = s.lines[p].waiters.remove(0);
        s.lines[p].holder = Some(w);
        let giver = std::mem::replace(
            &mut s.clients[c as usize].phase,
            Phase::Done(End::ReleasedOk),
        );
        debug_assert!(matches!(giver, Phase::Hold | Phase::HandingOn));
        // Ghost: the next task's tenure begins.
        self.tenure_begins(s, None);
        let from = &mut s.clients[c as usize];
        let (token, valid_until, wd, wd_net, lease_ended) = (
            from.token,
            from.valid_until,
            from.wd.take(),
            from.wd_net.take(),
            from.lease_ended,
        );
        // `LockGuard::release`: `release()` answers `Ok`.
        if from.ended_at_release {
            s.ghost.false_ok = true;
        }
        let to = &mut s.clients[w as usize];
        to.phase = Phase::Hold;
        to.token = token;
        to.fencing = fencing;
        to.valid_until = valid_until;
        to.wd = wd;
        to.wd_net = wd_net;
        to.lost = false;
        to.acquired_at = now;
        to.lease_ended = lease_ended;
        to.superseded = false;
        self.issued_to(s, w, fencing);
        s.ghost.handed_locally = true;
        log.say(|| {
            format!(
                "{}: hands the lease on to {} (fencing {fencing}, valid until t={valid_until}); release() -> Ok",
                name(c),
                name(w)
            )
        });
    }

    /// `LockGuard::release` (client/guard.rs): release.lua (after `Local::end`).
    pub(super) fn release_to_server(&self, s: &mut State, c: u8, was_lost: bool, log: &mut Log) {
        let now = s.now;
        self.line_end(s, c, log);
        let cl = &mut s.clients[c as usize];
        cl.wd = None;
        cl.wd_net = None; // unwatched: a renewal in flight is ignored
        let valid = !cl.lost && now < cl.valid_until;
        cl.phase = Phase::Releasing { was_lost, valid };
        let req = self.release_req(false);
        cl.app = Some(Net::new(req, 1, false));
        log.say(|| {
            format!(
                "{}: sends {} (lease valid: {})",
                name(c),
                match req {
                    Req::Unlock => "DELIFEQ".to_string(),
                    _ => self.script("release.lua", "release"),
                },
                if valid { "yes" } else { "no" }
            )
        });
    }

    /// The first request of a release (`RedisBackend::release`): a mutex's
    /// release that leaves no queue entry goes to the plain
    /// compare-and-delete first (release.lua only if that deleted
    /// nothing); leaving the queue (`dequeue`), or a shared lock's, goes to
    /// the script at once. Re-sent once after a broken connection
    /// (`RedisBackend::send_release`).
    pub(super) fn release_req(&self, dequeue: bool) -> Req {
        if dequeue || self.cfg.shared.is_some() {
            Req::Release { dequeue }
        } else {
            Req::Unlock
        }
    }
}
