//! Read-write locks and semaphores in the lock model: their configuration,
//! shared.lua's calls, their properties.

use super::*;

impl LockConfig {
    /// Clients of a read-write lock (`limit` 0) or a semaphore of `limit`
    /// permits, one per mode, each waiting `wait` ticks, with the lock
    /// model's defaults otherwise.
    pub fn new_shared(modes: Vec<Mode>, limit: u8, wait: u8, faults: Faults) -> Self {
        let mut cfg = LockConfig::new(modes.len(), wait, faults);
        cfg.shared = Some(SharedConfig {
            modes,
            limit,
            admit_past_queue: false,
        });
        cfg
    }
}

impl SharedGhost {
    /// After every step: since when the head of the queue fits (room freed
    /// by a lease that ran out, or by the waiter ahead leaving the queue,
    /// neither of which promotes).
    pub(crate) fn track(s: &mut State) {
        let fits = s
            .shared
            .queue
            .first()
            .is_some_and(|head| s.shared.fits(head.exclusive, head.limit));
        let since = &mut s.ghost.shared.head_fits_since;
        match (fits, *since) {
            (true, None) => *since = Some(s.now),
            (false, Some(_)) => *since = None,
            _ => {}
        }
    }
}

impl LockModel {
    /// Redis runs client `c`'s `req` through shared.lua (shared.rs
    /// `acquire_shared`, `extend_shared`, `release_shared`, `mint_shared`;
    /// the watchdog's renewal and `confirm` are `extend`).
    pub(crate) fn exec_shared(&self, s: &mut State, c: u8, req: Req) -> (Resp, String) {
        let sh = self.cfg.shared.as_ref().expect("a shared configuration");
        let call = Call {
            now: s.now,
            token: s.clients[c as usize].token,
            lease: self.cfg.ttl,
            exclusive: sh.modes[c as usize] == Mode::Write,
            limit: sh.limit,
            cap: self.cfg.handoff,
        };
        let script = Script {
            skip_ended: self.cfg.skip_ended_waits,
            admit_past_queue: sh.admit_past_queue,
        };
        let before: Vec<u8> = s.queued().collect();
        let entries = s.shared.queue.clone();
        let mut fence = s.server.fence;
        let (resp, taken, mut text) = match req {
            Req::Acquire { wait, .. } => {
                let (r, taken) = s.shared.acquire(&call, wait, &mut fence, script);
                if let AcqReply::Granted(_) = r {
                    // Ghost: a lease of c's starts (or is re-armed) now.
                    s.clients[c as usize].lease_ended = false;
                }
                let text = match r {
                    AcqReply::Granted(0) => "acquire: granted, no fencing token yet".to_string(),
                    AcqReply::Granted(f) => format!("acquire: granted, fencing {f}"),
                    AcqReply::Busy { remaining, fence } if wait != 0 => {
                        let queued = s.shared.queue.iter().position(|e| e.token == c);
                        if let Some(i) = queued {
                            s.clients[c as usize].queued_ever = true;
                            if !call.exclusive && s.shared.queue[..i].iter().any(|e| e.exclusive) {
                                s.ghost.shared.behind_writer = true;
                            }
                        }
                        format!(
                            "acquire: busy for {remaining} more ticks, counter {fence}; {} queued",
                            name(c)
                        )
                    }
                    AcqReply::Busy { remaining, .. } => {
                        format!("acquire: busy for {remaining} more ticks")
                    }
                };
                (Resp::Acquire(r), taken, text)
            }
            Req::Confirm | Req::Renew => {
                let ok = s.shared.extend(&call);
                let text = format!("extend: {}", if ok { "re-armed" } else { "not ours (0)" });
                (Resp::Extended(ok), Taken::new(), text)
            }
            Req::Release { dequeue } => {
                let (ours, taken) = s.shared.release(&call, dequeue, &mut fence, script);
                let (r, text) = if ours {
                    (RelReply::Released, "release: released")
                } else {
                    (RelReply::NotOurs, "release: not ours (0)")
                };
                (Resp::Release(r), taken, text.to_string())
            }
            Req::Mint => {
                let f = s.shared.mint(&call, &mut fence, self.cfg.mint_checks_owner);
                let text = if f == 0 {
                    "mint: 0 (not ours: our lease ended)".to_string()
                } else {
                    format!("mint: minted fencing {f}")
                };
                (Resp::Minted(f), Taken::new(), text)
            }
            // A shared lock takes no plain path; only a mutex's line
            // reserves.
            Req::SetNx { .. } | Req::Unlock | Req::Reserve => {
                unreachable!("a mutex's request")
            }
        };
        if let Resp::Minted(f) = resp {
            if f == 0 {
                s.ghost.mint_refused = true;
            } else {
                self.issued_to(s, c, f);
            }
        }
        s.server.fence = fence;
        // Ghost: FIFO. A taker overtakes whoever was queued ahead of it (or
        // at all, if it was not queued) and still is.
        let after: Vec<u8> = s.queued().collect();
        for &(who, _) in &taken {
            let ahead = match before.iter().position(|&t| t == who) {
                Some(i) => &before[..i],
                None => &before[..],
            };
            if ahead.iter().any(|t| after.contains(t)) {
                s.ghost.shared.overtaken = true;
            }
        }
        // An entry gone without a grant (the caller's own aside) was
        // skipped: its wait must have ended; a grant never goes to an entry
        // whose wait has ended.
        for e in &entries {
            let granted = taken.iter().any(|&(who, _)| who == e.token);
            let waiting = e.waiting_at(s.now);
            if granted && e.token != call.token && !waiting {
                s.ghost.handed_to_ended = true;
            }
            if !granted && e.token != call.token && !after.contains(&e.token) {
                if self.lives(s, e.token, waiting) {
                    s.ghost.shared.overtaken = true;
                }
                s.ghost.skipped_ended = true;
                if s.clients[e.token as usize].phase == Phase::Crashed {
                    s.ghost.skipped_crashed = true;
                }
            }
        }
        for &(who, _) in &taken {
            self.shared_tenure_begins(s, who);
        }
        for (who, f) in taken {
            if who == call.token {
                // A newcomer's lease has no token yet (`0`).
                if f != 0 {
                    self.issued(s, f);
                }
            } else {
                // shared.lua, "pcall: a notice refused by an ACL must not undo the grant.":
                // a notice to each waiter granted.
                self.handed(s, who, f);
                s.ghost.shared.promoted = true;
                let _ = write!(
                    text,
                    ", granted {} (fencing {f}, lease {}), notice published",
                    name(who),
                    self.cfg.ttl.min(self.cfg.handoff)
                );
            }
        }
        (resp, format!("shared.lua {text}"))
    }
}

impl LockModel {
    /// Ghost: `who` takes a lease. A writer's tenure supersedes every other
    /// holder, a shared holder's only the writers: a token issued to them
    /// from now on would sit above the new holder's, although they held
    /// the lock before (shared holders beside each other are not ordered).
    fn shared_tenure_begins(&self, s: &mut State, who: u8) {
        let modes = &self
            .cfg
            .shared
            .as_ref()
            .expect("a shared configuration")
            .modes;
        let exclusive = modes[who as usize] == Mode::Write;
        for (i, cl) in s.clients.iter_mut().enumerate() {
            if i == who as usize {
                cl.superseded = false;
            } else if cl.holding() && (exclusive || modes[i] == Mode::Write) {
                cl.superseded = true;
            }
        }
    }
}

/// The properties of a read-write lock or a semaphore (`cfg.shared`),
/// besides those of every configuration (see `LockModel::properties`).
pub(crate) fn shared_properties(lock: &LockConfig) -> Vec<Property<LockModel>> {
    let cfg = lock.shared.as_ref().expect("a shared configuration");
    let faults = lock.faults.total > 0;
    let mut properties = Vec::new();
    let readers = cfg.modes.iter().filter(|&&m| m == Mode::Read).count();
    if cfg.limit == 0 {
        properties.push(Property::always(
            "no writer believes its lease valid while another holder does",
            |m: &LockModel, s: &State| {
                let (writers, readers) = valid_holders(m, s);
                writers == 0 || (writers == 1 && readers == 0)
            },
        ));
        if readers >= 2 {
            properties.push(Property::sometimes(
                "two readers hold at once",
                |m: &LockModel, s: &State| valid_holders(m, s).1 >= 2,
            ));
        }
    } else {
        properties.extend([
            Property::always(
                "no more holders believe their leases valid than the limit",
                |m: &LockModel, s: &State| valid_holders(m, s).1 <= limit(m),
            ),
            Property::sometimes(
                "as many holders as the limit hold at once",
                |m: &LockModel, s: &State| valid_holders(m, s).1 == limit(m),
            ),
        ]);
    }
    properties.push(Property::always(
        "the server never keeps a writer with a holder, or holders past the limit",
        |m: &LockModel, s: &State| {
            let held = s.shared.holders.len();
            (s.shared.writer.is_none() || held == 0) && (limit(m) == 0 || held <= limit(m))
        },
    ));
    properties.extend(never_set![LockModel;
        "no grant overtakes a waiter still queued (FIFO)" => ghost.shared.overtaken,
        "no hand-over goes to a waiter whose wait is over" => ghost.handed_to_ended,
        "fencing tokens rise in the order holders held the lock" =>
            ghost.token_after_later_holder,
    ]);
    // A waiter dies in line and room frees up after its wait.
    let short = lock.waits.iter().any(|&w| w != 0 && w <= lock.hold_max);
    if lock.skip_ended_waits && lock.faults.crash > 0 && cfg.modes.len() >= 3 && short {
        properties.push(Property::sometimes(
            "a script skips the entry of a waiter that died in line",
            |_: &LockModel, s: &State| s.ghost.skipped_crashed,
        ));
    }
    // A writer paused past its lease asks for its token on resuming (the
    // Kleppmann case): shared.lua's `mint` refuses it.
    if lock.mint_checks_owner && lock.faults.pause > 0 && cfg.modes.contains(&Mode::Write) {
        properties.push(Property::sometimes(
            "shared.lua's mint refuses a holder whose lease ended",
            |_: &LockModel, s: &State| s.ghost.mint_refused,
        ));
    }
    properties.push(Property::always(
        "without faults a waiter that fits at the head of the queue is granted within a lease",
        |m: &LockModel, s: &State| {
            s.ghost.faults > 0
                || s.ghost
                    .shared
                    .head_fits_since
                    .is_none_or(|t| s.now <= t + m.cfg.ttl)
        },
    ));
    if faults && cfg.limit == 0 {
        // A lease that runs out (a pause or a crash) frees room unannounced.
        properties.push(Property::sometimes(
            "the head of the queue fits, ungranted (room freed without a promote)",
            |_: &LockModel, s: &State| s.ghost.shared.head_fits_since.is_some(),
        ));
    }
    properties.push(Property::sometimes(
        "a script grants a queued waiter",
        |_: &LockModel, s: &State| s.ghost.shared.promoted,
    ));
    if readers >= 2 && cfg.modes.contains(&Mode::Write) && cfg.limit == 0 {
        properties.push(Property::sometimes(
            "a reader queues behind a queued writer",
            |_: &LockModel, s: &State| s.ghost.shared.behind_writer,
        ));
    }
    properties
}

pub(super) fn limit(m: &LockModel) -> usize {
    m.cfg.shared.as_ref().map_or(0, |sh| sh.limit as usize)
}

/// Holders that believe their leases valid: `(writers, shared holders)`.
pub(super) fn valid_holders(m: &LockModel, s: &State) -> (usize, usize) {
    let modes = &m.cfg.shared.as_ref().expect("a shared configuration").modes;
    let mut counts = (0, 0);
    for (c, mode) in s.clients.iter().zip(modes) {
        if c.believes_valid(s.now) {
            match mode {
                Mode::Write => counts.0 += 1,
                Mode::Read | Mode::Permit => counts.1 += 1,
            }
        }
    }
    counts
}
