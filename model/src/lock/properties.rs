//! The model's properties, its initial states and its narration.

use super::shared_lock::shared_properties;
use super::*;

impl Model for LockModel {
    check::narrated_model!(State, Action, horizon: 40);

    fn init_states(&self) -> Vec<State> {
        vec![State {
            now: 0,
            server: Server::default(),
            shared: Holders::default(),
            clients: (0..self.cfg.waits.len() as u8).map(Client::new).collect(),
            store: Store::default(),
            budget: self.cfg.faults,
            other_keys: self.cfg.other_keys,
            lines: vec![
                Line::default();
                self.cfg
                    .process
                    .iter()
                    .map(|&p| p as usize + 1)
                    .max()
                    .unwrap_or(0)
            ],
            ghost: Ghost {
                free_since: Some(0),
                ..Ghost::default()
            },
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        let mut urgent = Vec::new();
        let mut lazy = Vec::new();
        for c in 0..s.clients.len() as u8 {
            self.client_actions(s, c, &mut urgent, &mut lazy);
        }
        let mut faults = Vec::new();
        for c in 0..s.clients.len() as u8 {
            self.fault_actions(s, c, &mut faults);
        }
        let busy = self.needs_time(s);
        // Between this key's round trips (where time may pass): where in a
        // tick another key's token falls does not matter to this key.
        lazy.extend(faults);
        if urgent.is_empty() && busy && s.other_keys > 0 {
            lazy.push(Action::OtherKey);
        }
        check::schedule(actions, urgent, lazy, busy, Action::Tick);
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = match &self.cfg.shared {
            None => self.mutex_properties(),
            Some(_) => shared_properties(&self.cfg),
        };
        properties.push(Property::always(
            "a holder that believes its lease valid owns the key",
            |_: &LockModel, s: &State| {
                s.clients
                    .iter()
                    .all(|c| !c.believes_valid(s.now) || s.owns(c.token))
            },
        ));
        properties.extend(check::never_set![LockModel;
            "a holder not paused is told lost before it acts past its lease" =>
                ghost.acted_past_lease,
            "fencing tokens issued strictly increase" => ghost.fence_not_increasing,
            "a fenced store accepts strictly increasing tokens" => ghost.store_accepted_stale,
            "release answers Lost only when the lease may have ended" => ghost.false_lost,
            "release answers Ok only when the lease had not ended when it was called" =>
                ghost.false_ok,
        ]);
        properties.extend([
            Property::always(
                "no queue entry outlives the waits that made it",
                |m: &LockModel, s: &State| {
                    s.queued().next().is_none()
                        || s.clients.iter().enumerate().any(|(i, c)| {
                            // `Acquisition::attempt` sends at least 1 ms of wait: a tick here.
                            c.queued_ever
                                && s.now < c.deadline + m.cfg.ttl + 1
                                && m.cfg.waits[i] != 0
                        })
                },
            ),
            Property::always(
                "a queue entry is in the queue once",
                |_: &LockModel, s: &State| {
                    let queued: Vec<u8> = s.queued().collect();
                    queued
                        .iter()
                        .enumerate()
                        .all(|(i, t)| !queued[..i].contains(t))
                },
            ),
            Property::always(
                "without faults no waiter waits on a free key for more than a lease",
                |m: &LockModel, s: &State| {
                    s.ghost.faults > 0
                        || s.ghost.free_since.is_none_or(|t| {
                            s.now <= t + m.cfg.ttl
                                || !s.clients.iter().any(|c| {
                                    matches!(
                                        c.phase,
                                        Phase::Attempting
                                            | Phase::AcquireSent { .. }
                                            | Phase::Waiting { .. }
                                            | Phase::Confirming { .. }
                                            | Phase::InLine
                                    ) && s.now < c.deadline
                                })
                        })
                },
            ),
            Property::eventually(
                "every acquire ends, and the key, queue and mark go",
                |_: &LockModel, s: &State| {
                    s.clients.iter().all(|c| !c.active())
                        && !s.key_exists()
                        && s.queued().next().is_none()
                },
            ),
            // Sanity: the model reaches the situations the properties are about.
            // Without a pause or a lost message no lease is lost (a crash
            // leaves nobody to tell): then this is vacuously true.
            Property::sometimes("a holder is told lost", |m: &LockModel, s: &State| {
                let f = m.cfg.faults;
                f.total == 0
                    || f.pause + f.lost_request + f.lost_reply == 0
                    || s.clients.iter().any(|c| c.lost)
            }),
            Property::sometimes("a waiter gives up", |_: &LockModel, s: &State| {
                s.clients.iter().any(|c| c.phase == Phase::Done(End::Busy))
            }),
        ]);
        if self.cfg.other_keys > 0 {
            properties.push(Property::sometimes(
                "another key's token leaves a gap in this key's",
                |_: &LockModel, s: &State| s.ghost.gap,
            ));
        }
        if self
            .cfg
            .waits
            .iter()
            .enumerate()
            .any(|(c, &w)| w != 0 && self.cfg.in_line(c as u8))
        {
            properties.push(Property::sometimes(
                "a release hands the lease on within its process",
                |_: &LockModel, s: &State| s.ghost.handed_locally,
            ));
            properties.push(Property::sometimes(
                "a task waiting in line goes to the server",
                |_: &LockModel, s: &State| s.ghost.line_to_server,
            ));
        }
        // The stale hand-over needs three clients and a pause (and, for a
        // semaphore, more takers than the three of a limit of two).
        if self.cfg.check_stale_grants
            && self.cfg.waits.len() >= 3
            && self.cfg.faults.pause > 0
            && self.cfg.shared.as_ref().is_none_or(|sh| sh.limit == 0)
        {
            properties.push(Property::sometimes(
                "a waiter ignores a stale hand-over",
                |_: &LockModel, s: &State| s.ghost.stale_ignored,
            ));
        }
        properties
    }
}

impl LockModel {
    /// The properties of a mutex, besides those of every configuration.
    fn mutex_properties(&self) -> Vec<Property<LockModel>> {
        let mut properties = vec![
            // Sanity: the second token goes to a holder, which a release
            // handing the key to a waiter reaches. (A shared lock's
            // newcomers take no token; its sanity is "a script grants a
            // queued waiter".)
            Property::sometimes(
                "a release hands the lock to a waiter",
                |_: &LockModel, s: &State| {
                    s.clients
                        .iter()
                        .any(|c| matches!(c.phase, Phase::Hold) && c.fencing >= 2)
                },
            ),
            Property::always(
                "at most one holder believes its lease valid",
                |_: &LockModel, s: &State| {
                    s.clients.iter().filter(|c| c.believes_valid(s.now)).count() <= 1
                },
            ),
            // The invariant the plain `SET NX` relies on: a live waiter in
            // line means the key exists (the overtaking it prevents is
            // checked below, this says why).
            Property::always(
                "while a waiter is in line the key exists",
                |m: &LockModel, s: &State| {
                    s.server.lock.is_some() || !s.server.queue.iter().any(|e| m.live_waiter(s, e))
                },
            ),
        ];
        properties.extend(check::never_set![LockModel;
            "no waiter is overtaken by a later arrival" => ghost.overtaken,
            "no hand-over goes to a waiter whose wait is over" => ghost.handed_to_ended,
            "fencing tokens rise in the order holders held the key" =>
                ghost.token_after_later_holder,
        ]);
        let cfg = &self.cfg;
        // A holder paused past its lease asks for its token on resuming
        // (the Kleppmann case): mint.lua refuses it.
        if cfg.mint_checks_owner && cfg.faults.pause > 0 {
            properties.push(Property::sometimes(
                "mint.lua refuses a holder whose lease ended",
                |_: &LockModel, s: &State| s.ghost.mint_refused,
            ));
        }
        let processes = |min_wait: u8| {
            let mut ps: Vec<u8> = (0..cfg.waits.len())
                .filter(|&c| cfg.waits[c] >= min_wait)
                .map(|c| cfg.process[c])
                .collect();
            ps.sort_unstable();
            ps.dedup();
            ps.len()
        };
        // A holder's lease runs out (a crash or a pause) with two other
        // processes queued for longer than a lease.
        let expiries = cfg.faults.crash > 0 || cfg.faults.pause > 0;
        if cfg.fifo_on_expiry && expiries && processes(0) >= 3 && processes(cfg.ttl + 1) >= 2 {
            properties.push(Property::sometimes(
                "a key whose lease ran out goes to the head of its line",
                |_: &LockModel, s: &State| s.ghost.expiry_handed,
            ));
        }
        // A waiter dies in line and a holder releases after its wait.
        let short = cfg.waits.iter().any(|&w| w != 0 && w <= cfg.hold_max);
        if cfg.skip_ended_waits && cfg.faults.crash > 0 && processes(0) >= 3 && short {
            properties.push(Property::sometimes(
                "a script skips the entry of a waiter that died in line",
                |_: &LockModel, s: &State| s.ghost.skipped_crashed,
            ));
        }
        properties
    }
}

impl Narrate for LockModel {
    fn apply(&self, s: &mut State, action: Action, log: &mut Log) {
        self.step(s, action, log);
    }

    fn now(s: &State) -> u8 {
        s.now
    }

    fn summarize(&self, s: &State) -> String {
        let mut out = format!("t={} key ", s.now);
        match s.server.lock {
            Some(v) => {
                let _ = write!(out, "held by {}", name(v.owner));
                if let Some(d) = v.ends {
                    let _ = write!(out, " (marked, lease to t={d})");
                }
                let _ = write!(out, " until t={}", v.expires);
            }
            None => out.push_str("free"),
        }
        if self.cfg.shared.is_some() {
            out = format!("t={} {}", s.now, s.shared.summary());
        }
        let _ = write!(out, ", fence counter {}", s.server.fence);
        if !s.server.queue.is_empty() {
            let q: Vec<String> = s
                .server
                .queue
                .iter()
                .map(|e| name(e.token).to_string())
                .collect();
            let _ = write!(out, ", queue [{}]", q.join(", "));
        }
        for (i, c) in s.clients.iter().enumerate() {
            let _ = write!(out, "; {}: {:?}", name(i as u8), c.phase);
            if c.holding() {
                let _ = write!(
                    out,
                    " (token {}, fencing {}, valid until t={}, lost {})",
                    name(c.token),
                    c.fencing,
                    c.valid_until,
                    c.lost
                );
            }
        }
        for (p, line) in s.lines.iter().enumerate() {
            if line.holder.is_some() || !line.waiters.is_empty() || line.representative {
                let _ = write!(out, "; line of process {p}: {line:?}");
            }
        }
        out
    }
}

// The read-write lock and semaphore server (shared.rs) run by this
// model's clients: its configuration, its requests, its properties.
