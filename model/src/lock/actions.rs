//! Which actions are enabled in a state (urgent ones before the clock may tick).

use super::*;

impl LockModel {
    pub(super) fn client_actions(
        &self,
        s: &State,
        c: u8,
        urgent: &mut Vec<Action>,
        lazy: &mut Vec<Action>,
    ) {
        let cl = &s.clients[c as usize];
        let now = s.now;
        // The server runs whatever is on the wire, whatever the client does.
        for (conn, net) in [(Conn::App, &cl.app), (Conn::Watchdog, &cl.wd_net)] {
            if let Some(net) = net
                && net.stage == Stage::Sent
            {
                urgent.push(Action::Exec(c, conn));
            }
        }
        if !cl.active() {
            // Background requests of a finished client: answers are logged.
            if cl.phase != Phase::Crashed
                && let Some(net) = &cl.app
                && net.stage != Stage::Sent
            {
                urgent.push(Action::Receive(c, Conn::App));
            }
            return;
        }
        if cl.paused_until.is_some_and(|t| now < t) {
            return;
        }
        if let Some(net) = &cl.app
            && net.stage != Stage::Sent
        {
            urgent.push(Action::Receive(c, Conn::App));
        }
        if let Some(net) = &cl.wd_net
            && net.stage != Stage::Sent
        {
            urgent.push(Action::Receive(c, Conn::Watchdog));
        }
        if !cl.inbox.is_empty() {
            urgent.push(Action::Deliver(c));
        }
        match cl.phase {
            Phase::Idle => {
                if now >= self.cfg.start_by {
                    urgent.push(Action::Start(c));
                } else {
                    lazy.push(Action::Start(c));
                }
            }
            Phase::Attempting => urgent.push(Action::Attempt(c)),
            Phase::Waiting { retry_at } => {
                if cl.notified {
                    urgent.push(Action::Woken(c));
                }
                if now >= retry_at {
                    urgent.push(Action::Timer(c));
                }
            }
            Phase::Confirming { sent: None, .. } => urgent.push(Action::Attempt(c)),
            Phase::InLine => {
                // `Local::wait` (client/local/mod.rs): the select over the turn, the holder's
                // `lost` and the deadline.
                let line = &s.lines[self.cfg.process[c as usize] as usize];
                if line.holder.is_some_and(|h| s.clients[h as usize].lost) {
                    urgent.push(Action::LineLost(c));
                }
                if now >= cl.deadline {
                    urgent.push(Action::LineTimeout(c));
                }
            }
            Phase::HandingOn | Phase::Minting => self.watchdog_actions(cl, c, now, urgent),
            Phase::Hold => {
                self.watchdog_actions(cl, c, now, urgent);
                // A writer writes with its token; a holder without one
                // may ask for it at any moment while not told lost
                // (`Held::fencing_token`), also just after a pause, before
                // its watchdog runs.
                if !cl.wrote && !cl.lost && self.cfg.writes(c) {
                    if cl.fencing != 0 {
                        lazy.push(Action::Write(c));
                    } else {
                        lazy.push(Action::Mint(c));
                    }
                }
                if now >= cl.acquired_at + self.cfg.hold_max {
                    urgent.push(Action::Release(c));
                } else {
                    lazy.push(Action::Release(c));
                }
            }
            _ => {}
        }
    }

    /// The watchdog's steps for a lease under watch.
    pub(super) fn watchdog_actions(&self, cl: &Client, c: u8, now: u8, urgent: &mut Vec<Action>) {
        if let Some(wd) = &cl.wd {
            if wd.busy.is_none() && wd.due <= now {
                urgent.push(Action::Renew(c));
            }
            if wd.busy.is_some() && now >= cl.valid_until {
                urgent.push(Action::RenewTimeout(c));
            }
        }
    }

    pub(super) fn fault_actions(&self, s: &State, c: u8, out: &mut Vec<Action>) {
        let b = &s.budget;
        if b.total == 0 {
            return;
        }
        let cl = &s.clients[c as usize];
        // A crash or a pause is the process's: offered once, by its first
        // client, while any of its clients is under way.
        let first = self.cfg.tasks_of(c).next() == Some(c);
        let under_way = self.cfg.tasks_of(c).any(|t| {
            let t = &s.clients[t as usize];
            t.active() && t.phase != Phase::Idle
        });
        if first && under_way {
            if b.crash > 0 {
                out.push(Action::Crash(c));
            }
            if b.pause > 0 && cl.paused_until.is_none() {
                out.push(Action::Pause(c));
            }
        }
        for (conn, net) in [(Conn::App, &cl.app), (Conn::Watchdog, &cl.wd_net)] {
            if let Some(net) = net {
                if net.stage == Stage::Sent && b.lost_request > 0 {
                    out.push(Action::LoseRequest(c, conn));
                }
                if matches!(net.stage, Stage::Replied(_)) && b.lost_reply > 0 {
                    out.push(Action::LoseReply(c, conn));
                }
            }
        }
        if !cl.inbox.is_empty() && b.lost_notice > 0 {
            out.push(Action::LoseNotice(c));
        }
    }

    pub(super) fn needs_time(&self, s: &State) -> bool {
        s.clients.iter().any(|c| c.active()) || s.key_exists() || s.queued().next().is_some()
    }
}
