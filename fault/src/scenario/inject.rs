//! The fault injector: what each fault plan does, step by step, while the
//! workers run.

use rustix::process::{Pid, Signal};

use super::sides::{LockSide, Running};
use super::*;

/// Sends `signal` to worker process `pid` with one `kill(2)`, so that it
/// lands within microseconds of the call (a `kill` command's fork and exec
/// took milliseconds, tens under load, between the time a strike was
/// logged at and the time it struck).
fn strike(pid: u32, signal: Signal) -> Result<(), String> {
    let raw = i32::try_from(pid).map_err(|e| e.to_string())?;
    let pid = Pid::from_raw(raw).ok_or_else(|| format!("no process {raw}"))?;
    rustix::process::kill_process(pid, signal).map_err(|e| format!("kill -{signal:?} {raw}: {e}"))
}

pub(super) enum Step {
    Fault(Fault),
    KilledVictim(Fault),
}

pub(super) struct InjectCtx<'a> {
    pub(super) scenario: &'a Scenario,
    pub(super) clock: &'a Clock,
    pub(super) lock: &'a mut LockSide,
    pub(super) store: &'a mut redis::Connection,
    pub(super) keys: &'a [String],
    pub(super) running: &'a [Running],
}

enum Phase {
    Idle {
        next: Instant,
    },
    /// A worker (index into `running`) stopped since `t` (clock), until `until`.
    Stopped {
        index: usize,
        t: u64,
        until: Instant,
    },
    /// The server is paused or dead since `t`, until `until`.
    Down {
        t: u64,
        until: Instant,
        killed: bool,
    },
    /// Redlock nodes dead since `t`, until `until`.
    NodesDown {
        nodes: Vec<usize>,
        t: u64,
        until: Instant,
    },
}

pub(super) struct Injector {
    plan: FaultPlan,
    phase: Phase,
    cycles: u32,
    kills: u32,
    pubsub_next: bool,
}

impl Injector {
    pub(super) fn new(plan: &FaultPlan) -> Self {
        Self {
            plan: plan.clone(),
            phase: Phase::Idle {
                next: Instant::now() + Duration::from_millis(300),
            },
            cycles: 0,
            kills: 0,
            pubsub_next: false,
        }
    }

    pub(super) fn tick(&mut self, cx: InjectCtx<'_>) -> Result<Option<Step>, String> {
        let now = Instant::now();
        match (&self.plan, &self.phase) {
            (FaultPlan::None, _) => Ok(None),
            (
                FaultPlan::StopHolder {
                    stop_ms,
                    kill_every,
                    ..
                },
                Phase::Idle { next },
            ) => {
                if now < *next {
                    return Ok(None);
                }
                // The current victim: the newest live worker in the role.
                let Some(index) = cx
                    .running
                    .iter()
                    .rposition(|r| (r.id == 0 || r.id >= cx.scenario.workers) && !r.done)
                else {
                    return Ok(None);
                };
                let victim = &cx.running[index];
                // Its first task, the one that thinks long: the exclusive
                // reader of the first key, or one of its shared holders.
                let first = worker::logical_id(victim.id, 0, cx.scenario.tasks);
                let shared_mark = format!("in:{first}");
                let (reader, shared): (Option<String>, Option<String>) = redis::cmd("HMGET")
                    .arg(store::record_key(&cx.keys[0]))
                    .arg("reader")
                    .arg(&shared_mark)
                    .query(cx.store)
                    .map_err(|e| e.to_string())?;
                if reader.as_deref() != Some(first.to_string().as_str()) && shared.is_none() {
                    return Ok(None);
                }
                // It read and now thinks, holding the lock: strike. The
                // strike's time is read once the signal is sent: the victim
                // runs until then, and may even have ended its operation
                // and queued for the next (the checker must see it struck
                // while it waited).
                self.cycles += 1;
                if *kill_every > 0 && self.cycles.is_multiple_of(*kill_every) {
                    strike(victim.child.id(), Signal::KILL)?;
                    let t = cx.clock.now();
                    self.phase = Phase::Idle {
                        next: now + Duration::from_millis(300),
                    };
                    // Forget the dead victim's read so the new one is awaited.
                    let _: () = redis::cmd("HDEL")
                        .arg(store::record_key(&cx.keys[0]))
                        .arg("reader")
                        .arg(&shared_mark)
                        .query(cx.store)
                        .map_err(|e| e.to_string())?;
                    return Ok(Some(Step::KilledVictim(Fault::KillWorker {
                        worker: victim.id,
                        t,
                    })));
                }
                strike(victim.child.id(), Signal::STOP)?;
                let t = cx.clock.now();
                self.phase = Phase::Stopped {
                    index,
                    t,
                    until: now + Duration::from_millis(*stop_ms),
                };
                Ok(None)
            }
            (FaultPlan::StopHolder { .. }, Phase::Stopped { index, t, until }) => {
                if now < *until {
                    return Ok(None);
                }
                let victim = &cx.running[*index];
                // Read the clock before the signal: the victim may run, and
                // even finish its write, before this thread runs again.
                let end = cx.clock.now();
                if let Err(e) = signal(victim.child.id(), "CONT") {
                    // A victim that ended its run as it was struck was
                    // already a zombie: `STOP` found it, `CONT` finds it
                    // reaped. Nothing was stopped, nothing to continue.
                    if std::path::Path::new(&format!("/proc/{}", victim.child.id())).exists() {
                        return Err(e);
                    }
                    self.phase = Phase::Idle {
                        next: now + Duration::from_millis(300),
                    };
                    return Ok(None);
                }
                let fault = Fault::StopWorker {
                    worker: victim.id,
                    start: *t,
                    end,
                };
                self.phase = Phase::Idle {
                    next: now + Duration::from_millis(300),
                };
                Ok(Some(Step::Fault(fault)))
            }
            (FaultPlan::PauseServer { pause_ms, every_ms }, Phase::Idle { next }) => {
                if now < *next {
                    return Ok(None);
                }
                let _ = every_ms;
                cx.lock.primary().pause()?;
                self.phase = Phase::Down {
                    t: cx.clock.now(),
                    until: now + Duration::from_millis(*pause_ms),
                    killed: false,
                };
                Ok(None)
            }
            (
                FaultPlan::KillServer {
                    down_ms, max_kills, ..
                },
                Phase::Idle { next },
            ) => {
                if now < *next || self.kills >= *max_kills {
                    return Ok(None);
                }
                // A single kill (no persistence: the counters restart) waits
                // until a quarter of the run is drawn, as the failover does:
                // at 300 ms on a loaded machine the workers may not have
                // begun, and a kill before any token leaves none to repeat.
                if *max_kills != u32::MAX {
                    let drawn: Option<u64> = redis::cmd("GET")
                        .arg(store::OPS_KEY)
                        .query(cx.store)
                        .map_err(|e| e.to_string())?;
                    if drawn.unwrap_or(0) < cx.scenario.ops / 4 {
                        return Ok(None);
                    }
                }
                self.kills += 1;
                let t = cx.clock.now();
                cx.lock.primary().kill();
                self.phase = Phase::Down {
                    t,
                    until: now + Duration::from_millis(*down_ms),
                    killed: true,
                };
                Ok(None)
            }
            (
                FaultPlan::PauseServer { every_ms, .. } | FaultPlan::KillServer { every_ms, .. },
                Phase::Down { t, until, killed },
            ) => {
                if now < *until {
                    return Ok(None);
                }
                let (t, killed) = (*t, *killed);
                if killed {
                    cx.lock.primary().restart()?;
                } else {
                    cx.lock.primary().resume()?;
                }
                self.phase = Phase::Idle {
                    next: Instant::now() + Duration::from_millis(*every_ms),
                };
                Ok(Some(Step::Fault(Fault::Server {
                    kind: if killed { "kill" } else { "pause" }.into(),
                    start: t,
                    end: cx.clock.now(),
                })))
            }
            (FaultPlan::ClientKill { every_ms }, Phase::Idle { next }) => {
                if now < *next {
                    return Ok(None);
                }
                let kind = if self.pubsub_next { "pubsub" } else { "normal" };
                self.pubsub_next = !self.pubsub_next;
                let url = cx.lock.primary().url();
                let client = redis::Client::open(url).map_err(|e| e.to_string())?;
                let mut conn = client.get_connection().map_err(|e| e.to_string())?;
                let killed: u64 = redis::cmd("CLIENT")
                    .arg("KILL")
                    .arg("TYPE")
                    .arg(kind)
                    .query(&mut conn)
                    .map_err(|e| e.to_string())?;
                self.phase = Phase::Idle {
                    next: now + Duration::from_millis(*every_ms),
                };
                Ok(Some(Step::Fault(Fault::ClientKill {
                    kind: kind.into(),
                    killed,
                    t: cx.clock.now(),
                })))
            }
            (FaultPlan::KillMinority { down_ms, .. }, Phase::Idle { next }) => {
                if now < *next {
                    return Ok(None);
                }
                let LockSide::Redlock(servers) = &mut *cx.lock else {
                    return Err("KillMinority needs Redlock".into());
                };
                let n = servers.len();
                let minority = (n - 1) / 2;
                let nodes: Vec<usize> = (0..minority)
                    .map(|i| (self.cycles as usize * minority + i) % n)
                    .collect();
                self.cycles += 1;
                let t = cx.clock.now();
                for &i in &nodes {
                    servers[i].kill();
                }
                self.phase = Phase::NodesDown {
                    nodes,
                    t,
                    until: now + Duration::from_millis(*down_ms),
                };
                Ok(None)
            }
            (FaultPlan::KillMinority { every_ms, .. }, Phase::NodesDown { nodes, t, until }) => {
                if now < *until {
                    return Ok(None);
                }
                let LockSide::Redlock(servers) = &mut *cx.lock else {
                    return Err("KillMinority needs Redlock".into());
                };
                for &i in nodes {
                    servers[i].restart()?;
                }
                let fault = Fault::Nodes {
                    nodes: nodes.iter().map(|&i| i as u32).collect(),
                    start: *t,
                    end: cx.clock.now(),
                };
                self.phase = Phase::Idle {
                    next: Instant::now() + Duration::from_millis(*every_ms),
                };
                Ok(Some(Step::Fault(fault)))
            }
            (
                FaultPlan::Failover {
                    every_ms,
                    max,
                    restart,
                    stall_ms,
                },
                Phase::Idle { next },
            ) => {
                if now < *next || self.kills >= *max {
                    return Ok(None);
                }
                // The first kill once a quarter of the run is done: counters
                // well above what the first attempts after a loss burn.
                let drawn: Option<u64> = redis::cmd("GET")
                    .arg(store::OPS_KEY)
                    .query(cx.store)
                    .map_err(|e| e.to_string())?;
                if self.kills == 0 && drawn.unwrap_or(0) < cx.scenario.ops / 4 {
                    return Ok(None);
                }
                self.kills += 1;
                let LockSide::Sentinel(group) = &mut *cx.lock else {
                    return Err("Failover needs Sentinel".into());
                };
                let t = cx.clock.now();
                group.failover(
                    *restart == Restart::SyncedReplica,
                    Duration::from_millis(*stall_ms),
                )?;
                self.phase = Phase::Idle {
                    next: Instant::now() + Duration::from_millis(*every_ms),
                };
                Ok(Some(Step::Fault(Fault::Server {
                    kind: "failover".into(),
                    start: t,
                    end: cx.clock.now(),
                })))
            }
            _ => Ok(None),
        }
    }

    /// Ends a fault still in progress (the run is over).
    pub(super) fn finish(
        &mut self,
        lock: &mut LockSide,
        running: &[Running],
        clock: &Clock,
        faults: &mut Vec<Fault>,
    ) -> Result<(), String> {
        match std::mem::replace(
            &mut self.phase,
            Phase::Idle {
                next: Instant::now(),
            },
        ) {
            Phase::Idle { .. } => {}
            Phase::Stopped { index, t, .. } => {
                let victim = &running[index];
                let _ = signal(victim.child.id(), "CONT");
                faults.push(Fault::StopWorker {
                    worker: victim.id,
                    start: t,
                    end: clock.now(),
                });
            }
            Phase::NodesDown { nodes, t, .. } => {
                if let LockSide::Redlock(servers) = lock {
                    for &i in &nodes {
                        servers[i].restart()?;
                    }
                }
                faults.push(Fault::Nodes {
                    nodes: nodes.iter().map(|&i| i as u32).collect(),
                    start: t,
                    end: clock.now(),
                });
            }
            Phase::Down { t, killed, .. } => {
                if killed {
                    lock.primary().restart()?;
                } else {
                    lock.primary().resume()?;
                }
                faults.push(Fault::Server {
                    kind: if killed { "kill" } else { "pause" }.into(),
                    start: t,
                    end: clock.now(),
                });
            }
        }
        Ok(())
    }
}
