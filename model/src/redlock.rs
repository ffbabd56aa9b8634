//! Redlock over three masters, majority two (backend/redlock/mod.rs): acquire on
//! every node with lost requests and replies, the fencing token as the
//! quorum's highest counter raised back on the quorum (fence_raise.lua), a
//! failed attempt released everywhere, renewals and releases needing a
//! majority. Safety only; clock drift ignored (every node and client share
//! the model clock), nodes keep their data.

use stateright::{Model, Property};

use crate::check::{self, Log, Narrate};
use crate::reply::name;

/// Nodes.
pub const NODES: usize = 3;
/// A majority of them (`RedlockBackend::quorum`).
pub const QUORUM: usize = 2;

/// A configuration of the Redlock model.
#[derive(Clone, Debug)]
pub struct RedlockConfig {
    /// Clients, one acquisition each (try once).
    pub clients: u8,
    /// The lease, in ticks.
    pub ttl: u8,
    /// Lost requests or replies in one run.
    pub faults: u8,
    /// Pauses in one run (a client stops for `pause_len` ticks).
    pub pauses: u8,
    /// How long a pause lasts.
    pub pause_len: u8,
}

impl RedlockConfig {
    /// Into a model.
    pub fn into_model(self) -> RedlockModel {
        RedlockModel { cfg: self }
    }
}

/// The Redlock model.
#[derive(Clone, Debug)]
pub struct RedlockModel {
    /// Its configuration.
    pub cfg: RedlockConfig,
}

/// One master's state for the key.
#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq)]
pub struct Node {
    /// `(owner, expires)`.
    pub lock: Option<(u8, u8)>,
    /// The node's fencing counter (of the key's hash slot; no other key
    /// here: see `lock/`).
    pub fence: u8,
}

impl Node {
    /// acquire.lua with no `ARGV[4]` (Redlock tries once and never
    /// queues, so no queue exists): `Ok(fence)` or `Err(())` busy (a plain
    /// `-ttl`, no counter).
    fn acquire(&mut self, now: u8, token: u8, ttl: u8) -> Result<u8, ()> {
        match self.lock {
            // Free: `SET NX PX`, no queue (`EXISTS` is 0), `INCR`.
            None => {
                self.lock = Some((token, now + ttl));
                self.fence += 1;
                Ok(self.fence)
            }
            // "Ours already" (a re-sent attempt): `PEXPIRE`, and a token
            // minted now, while ours (`INCR`).
            Some((o, _)) if o == token => {
                self.lock = Some((o, now + ttl));
                self.fence += 1;
                Ok(self.fence)
            }
            // Another owner's, try once: `-ttl`.
            Some(_) => Err(()),
        }
    }

    /// fence_raise.lua: the counter raised to at least `fence`.
    fn fence_raise(&mut self, fence: u8) {
        self.fence = self.fence.max(fence);
    }

    /// extend_many.lua for one key: re-armed if ours (a Redlock node's
    /// value is never marked: nobody queues there).
    fn extend(&mut self, now: u8, token: u8, ttl: u8) -> bool {
        match self.lock {
            Some((o, _)) if o == token => {
                self.lock = Some((o, now + ttl));
                true
            }
            _ => false,
        }
    }

    /// release.lua's compare-and-delete (no queue on Redlock, so no mark
    /// and no hand-over).
    fn release(&mut self, token: u8) -> bool {
        if self.lock.is_some_and(|(o, _)| o == token) {
            self.lock = None;
            true
        } else {
            false
        }
    }
}

/// A node's answer to an acquire.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Stage {
    /// On the wire.
    Sent,
    /// `Ok(fence)` or busy.
    Replied(Result<u8, ()>),
    /// Lost (counted as failed by `RedlockBackend::acquire_paced`).
    Failed,
    /// The client stopped waiting for it (`RedlockBackend::acquire_paced`); it may still run.
    Dropped,
}

/// A client's step.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Phase {
    /// Not started.
    Idle,
    /// Acquire requests out to every node, started at this tick.
    Acquiring(u8),
    /// Holds with a majority until `valid_until`.
    Hold {
        /// Fencing token.
        fence: u8,
        /// Validity end.
        valid_until: u8,
        /// Told lost.
        lost: bool,
    },
    /// Finished.
    Done,
}

/// One client.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Client {
    /// Its step.
    pub phase: Phase,
    /// Per node: its acquire request.
    pub nodes: [Option<Stage>; NODES],
    /// Paused until.
    pub paused_until: Option<u8>,
}

/// The system.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct State {
    /// The clock.
    pub now: u8,
    /// The masters.
    pub nodes: [Node; NODES],
    /// The clients.
    pub clients: Vec<Client>,
    /// Lost messages left.
    pub faults: u8,
    /// Pauses left.
    pub pauses: u8,
    /// Ghost: highest fencing token a client held.
    pub fence_max: u8,
    /// Ghost: a client held a token not above an earlier holder's.
    pub fence_repeated: bool,
}

/// A step.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Action {
    /// Time passes; keys expire.
    Tick,
    /// Client `c` sends acquire.lua to every node.
    Start(u8),
    /// Node `n` runs client `c`'s acquire.
    Exec(u8, u8),
    /// Client `c` decides from the answers so far (`RedlockBackend::acquire_paced`).
    Decide(u8),
    /// Client `c`'s watchdog renews on every node (majority needed).
    Renew(u8),
    /// Client `c` releases on every node.
    Release(u8),
    /// Fault: the request to or the answer from node `n` for client `c` is lost.
    Lose(u8, u8),
    /// Fault: client `c` stops.
    Pause(u8),
}

impl RedlockModel {
    fn decided(c: &Client) -> bool {
        let acquired = c
            .nodes
            .iter()
            .filter(|s| matches!(s, Some(Stage::Replied(Ok(_)))))
            .count();
        let busy = c
            .nodes
            .iter()
            .filter(|s| matches!(s, Some(Stage::Replied(Err(())))))
            .count();
        let failed = c
            .nodes
            .iter()
            .filter(|s| matches!(s, Some(Stage::Failed)))
            .count();
        let minority = NODES - QUORUM;
        // `RedlockBackend::acquire_paced`
        acquired >= QUORUM
            || busy > minority
            || failed > minority
            || acquired + busy + failed == NODES
    }
}

impl Model for RedlockModel {
    check::narrated_model!(State, Action, horizon: 8);

    fn init_states(&self) -> Vec<State> {
        vec![State {
            now: 0,
            nodes: [Node::default(); NODES],
            clients: vec![
                Client {
                    phase: Phase::Idle,
                    nodes: [None; NODES],
                    paused_until: None,
                };
                self.cfg.clients as usize
            ],
            faults: self.cfg.faults,
            pauses: self.cfg.pauses,
            fence_max: 0,
            fence_repeated: false,
        }]
    }

    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        let mut urgent = Vec::new();
        let mut lazy = Vec::new();
        for (ci, c) in s.clients.iter().enumerate() {
            let ci = ci as u8;
            for (n, st) in c.nodes.iter().enumerate() {
                if matches!(st, Some(Stage::Sent | Stage::Dropped)) {
                    urgent.push(Action::Exec(ci, n as u8));
                }
                if s.faults > 0 && matches!(st, Some(Stage::Sent | Stage::Replied(_))) {
                    lazy.push(Action::Lose(ci, n as u8));
                }
            }
            if c.phase == Phase::Done {
                continue;
            }
            if s.pauses > 0 && c.paused_until.is_none() && c.phase != Phase::Idle {
                lazy.push(Action::Pause(ci));
            }
            if c.paused_until.is_some() {
                continue;
            }
            match c.phase {
                Phase::Idle => {
                    if s.now >= 1 {
                        urgent.push(Action::Start(ci));
                    } else {
                        lazy.push(Action::Start(ci));
                    }
                }
                Phase::Acquiring(_) if Self::decided(c) => urgent.push(Action::Decide(ci)),
                Phase::Hold { lost, .. } => {
                    if !lost {
                        lazy.push(Action::Renew(ci));
                    }
                    lazy.push(Action::Release(ci));
                }
                _ => {}
            }
        }
        let busy = s.clients.iter().any(|c| c.phase != Phase::Done)
            || s.nodes.iter().any(|n| n.lock.is_some());
        check::schedule(out, urgent, lazy, busy, Action::Tick);
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "at most one client believes it holds a majority-valid lease",
                |_: &RedlockModel, s: &State| {
                    s.clients
                        .iter()
                        .filter(|c| {
                            matches!(c.phase, Phase::Hold { lost: false, valid_until, .. } if s.now < valid_until)
                        })
                        .count()
                        <= 1
                },
            ),
            Property::always(
                "a client that believes its lease valid owns a majority",
                |_: &RedlockModel, s: &State| {
                    s.clients.iter().enumerate().all(|(i, c)| {
                        !matches!(c.phase, Phase::Hold { lost: false, valid_until, .. } if s.now < valid_until)
                            || s.nodes.iter().filter(|n| n.lock.is_some_and(|(o, _)| o as usize == i)).count() >= QUORUM
                    })
                },
            ),
            Property::always(
                "Redlock fencing tokens strictly increase",
                |_: &RedlockModel, s: &State| !s.fence_repeated,
            ),
            Property::sometimes(
                "two clients hold one after the other",
                |_: &RedlockModel, s: &State| s.fence_max >= 2,
            ),
        ]
    }
}

impl Narrate for RedlockModel {
    fn apply(&self, s: &mut State, a: Action, log: &mut Log) {
        let now = s.now;
        let ttl = self.cfg.ttl;
        match a {
            Action::Tick => {
                s.now += 1;
                log.say(|| "time passes".into());
                for (i, n) in s.nodes.iter_mut().enumerate() {
                    if n.lock.is_some_and(|(_, e)| e <= s.now) {
                        log.say(|| format!("node {i}: {}'s key expires", name(n.lock.unwrap().0)));
                        n.lock = None;
                    }
                }
                for c in &mut s.clients {
                    if c.paused_until.is_some_and(|t| s.now >= t) {
                        c.paused_until = None;
                    }
                    // The watchdog's timer at the validity (`settle`, watchdog/mod.rs).
                    if c.paused_until.is_none()
                        && let Phase::Hold {
                            valid_until, lost, ..
                        } = &mut c.phase
                        && s.now >= *valid_until
                    {
                        *lost = true;
                    }
                }
            }
            Action::Start(c) => {
                let cl = &mut s.clients[c as usize];
                cl.phase = Phase::Acquiring(now);
                cl.nodes = [Some(Stage::Sent); NODES];
                log.say(|| format!("{}: sends acquire.lua to every node", name(c)));
            }
            Action::Exec(c, n) => {
                let r = s.nodes[n as usize].acquire(now, c, ttl);
                let st = &mut s.clients[c as usize].nodes[n as usize];
                if *st == Some(Stage::Sent) {
                    *st = Some(Stage::Replied(r));
                } else {
                    *st = None; // dropped by the client: runs, nobody reads it
                }
                log.say(|| format!("node {n} runs {}'s acquire -> {r:?}", name(c)));
            }
            Action::Lose(c, n) => {
                s.faults -= 1;
                s.clients[c as usize].nodes[n as usize] = Some(Stage::Failed);
                log.say(|| {
                    format!(
                        "FAULT: {}'s acquire on node {n} or its answer is lost",
                        name(c)
                    )
                });
            }
            Action::Pause(c) => {
                s.pauses -= 1;
                s.clients[c as usize].paused_until = Some(now + self.cfg.pause_len);
                log.say(|| format!("FAULT {}: the process stops", name(c)));
            }
            Action::Decide(c) => {
                let cl = &mut s.clients[c as usize];
                let Phase::Acquiring(started) = cl.phase else {
                    unreachable!()
                };
                let acquired: Vec<(usize, u8)> = cl
                    .nodes
                    .iter()
                    .enumerate()
                    .filter_map(|(i, st)| match st {
                        Some(Stage::Replied(Ok(f))) => Some((i, *f)),
                        _ => None,
                    })
                    .collect();
                // Requests still out are dropped (they may still run).
                for st in &mut cl.nodes {
                    *st = match st {
                        Some(Stage::Sent) => Some(Stage::Dropped),
                        _ => None,
                    };
                }
                // `RedlockBackend::acquire_paced`: validity = ttl - elapsed - drift (drift 0 here).
                let valid = |t: u8| ttl > t - started;
                if acquired.len() >= QUORUM && valid(now) {
                    // `RedlockBackend::acquire_paced`: the quorum's highest counter, raised back
                    // (the raise is one round trip within this tick).
                    let fence = acquired.iter().map(|(_, f)| *f).max().unwrap_or(0);
                    for (i, _) in &acquired {
                        s.nodes[*i].fence_raise(fence);
                    }
                    if fence <= s.fence_max {
                        s.fence_repeated = true;
                    }
                    s.fence_max = s.fence_max.max(fence);
                    s.clients[c as usize].phase = Phase::Hold {
                        fence,
                        valid_until: started + ttl,
                        lost: false,
                    };
                    log.say(|| {
                        format!(
                            "{}: a majority granted it: holds with fencing {fence}",
                            name(c)
                        )
                    });
                } else {
                    // `RedlockBackend::acquire_paced`: undo everywhere before answering.
                    for n in &mut s.nodes {
                        n.release(c);
                    }
                    s.clients[c as usize].phase = Phase::Done;
                    log.say(|| format!("{}: no majority; releases everywhere, gives up", name(c)));
                }
            }
            Action::Renew(c) => {
                // `RedlockBackend::extend_many`: a lease is extended when a majority confirms.
                let extended = s
                    .nodes
                    .iter_mut()
                    .map(|n| n.extend(now, c, ttl))
                    .filter(|x| *x)
                    .count();
                let Phase::Hold {
                    valid_until, lost, ..
                } = &mut s.clients[c as usize].phase
                else {
                    unreachable!()
                };
                if extended >= QUORUM {
                    *valid_until = now + ttl;
                } else {
                    *lost = true;
                }
                log.say(|| format!("{}: renews on {extended} nodes", name(c)));
            }
            Action::Release(c) => {
                let released = s
                    .nodes
                    .iter_mut()
                    .map(|n| n.release(c))
                    .filter(|x| *x)
                    .count();
                s.clients[c as usize].phase = Phase::Done;
                log.say(|| format!("{}: releases on every node ({released} were its)", name(c)));
            }
        }
    }

    fn now(s: &State) -> u8 {
        s.now
    }

    fn summarize(&self, s: &State) -> String {
        format!(
            "t={} nodes {:?}; clients {:?}",
            s.now,
            s.nodes,
            s.clients.iter().map(|c| c.phase).collect::<Vec<_>>()
        )
    }
}
