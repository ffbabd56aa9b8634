//! A client reads the answer to a request (or its error).

use super::*;

#[derive(Clone, Copy)]
pub(super) enum Released {
    Yes,
    NotOurs,
    Gone,
}

impl LockModel {
    pub(super) fn receive(&self, s: &mut State, c: u8, conn: Conn, log: &mut Log) {
        let now = s.now;
        let ttl = self.cfg.ttl;
        let net = *self.net_mut(s, c, conn);
        let ci = c as usize;
        match conn {
            Conn::App => s.clients[ci].app = None,
            Conn::Watchdog => s.clients[ci].wd_net = None,
        }
        let resp = match net.stage {
            Stage::Replied(r) => Some(r),
            Stage::Failed => None,
            Stage::Sent => unreachable!(),
        };
        // A broken connection: requests that re-send do so (`RedisBackend::send_release`).
        if resp.is_none() && net.resends > 0 && s.clients[ci].phase != Phase::Crashed {
            s.clients[ci].app = Some(Net {
                stage: Stage::Sent,
                resends: net.resends - 1,
                resent: true,
                ..net
            });
            log.say(|| format!("{}: connection error; sends {:?} again", name(c), net.req));
            return;
        }
        if net.background || !s.clients[ci].active() {
            log.say(|| format!("{}: background {:?} ends: {resp:?}", name(c), net.req));
            return;
        }
        match (conn, net.req, s.clients[ci].phase) {
            (Conn::Watchdog, Req::Renew, _) => {
                // `settle` (watchdog/mod.rs)
                let Some(wd) = s.clients[ci].wd else {
                    return;
                };
                let sent = wd.busy.expect("a renewal in flight");
                match resp {
                    Some(Resp::Extended(true)) => {
                        s.clients[ci].valid_until = sent + ttl;
                        s.clients[ci].wd = Some(Watch {
                            due: sent + ttl / 3,
                            busy: None,
                        });
                        log.say(|| {
                            format!(
                                "{}: watchdog: renewed, valid until t={}",
                                name(c),
                                sent + ttl
                            )
                        });
                    }
                    Some(_) => {
                        s.clients[ci].lost = true;
                        s.clients[ci].wd = None;
                        log.say(|| format!("{}: watchdog: not ours any more, lost()", name(c)));
                    }
                    None if now >= s.clients[ci].valid_until => {
                        s.clients[ci].lost = true;
                        s.clients[ci].wd = None;
                        log.say(|| {
                            format!(
                                "{}: watchdog: renewal failed past the validity, lost()",
                                name(c)
                            )
                        });
                    }
                    None => {
                        s.clients[ci].wd = Some(Watch {
                            due: now.min(s.clients[ci].valid_until),
                            busy: None,
                        });
                        log.say(|| format!("{}: watchdog: renewal failed, retries", name(c)));
                    }
                }
            }
            (Conn::App, Req::Mint, Phase::Minting) => {
                // `Held::fencing_token` (held.rs)
                s.clients[ci].phase = Phase::Hold;
                match resp {
                    Some(Resp::Minted(f)) if f != 0 => {
                        s.clients[ci].fencing = f;
                        log.say(|| format!("{}: fencing_token() -> {f}", name(c)));
                        // It asked to write: at once (a token minted early
                        // and used late is what a token issued at acquire
                        // shows, with hand-overs).
                        self.write(s, c, log);
                    }
                    Some(Resp::Minted(_)) => {
                        // `Held::lose`: a holder whose lease ended gets `Lost`.
                        s.clients[ci].lost = true;
                        s.clients[ci].wd = None;
                        log.say(|| format!("{}: fencing_token() -> Lost; lost()", name(c)));
                    }
                    Some(_) => unreachable!(),
                    None => log.say(|| format!("{}: fencing_token() -> a backend error", name(c))),
                }
            }
            (Conn::App, Req::Acquire { .. } | Req::SetNx { .. }, Phase::AcquireSent { sent }) => {
                match resp {
                    // `Acquisition::attempt`: the plain `SET NX` took the key.
                    Some(Resp::SetNx) => {
                        log.say(|| format!("{}: SET NX answered OK", name(c)));
                        self.hold(s, c, 0, sent, ttl, log);
                    }
                    // `Acquisition::attempt`
                    Some(Resp::Acquire(AcqReply::Granted(f))) => {
                        log.say(|| format!("{}: acquire answered granted", name(c)));
                        self.hold(s, c, f, sent, ttl, log);
                    }
                    Some(Resp::Acquire(AcqReply::Busy { remaining, fence })) => {
                        // `Acquisition::attempt`: the counter a busy attempt saw (`fence_seen`)
                        s.clients[ci].last_busy = s.clients[ci].last_busy.max(sent);
                        if self.cfg.check_stale_grants {
                            s.clients[ci].fence_seen = s.clients[ci].fence_seen.max(fence);
                        }
                        log.say(|| {
                            format!("{}: acquire answered busy ({remaining} ticks)", name(c))
                        });
                        if !s.clients[ci].registered {
                            // `Acquisition::finish`
                            if now >= s.clients[ci].deadline {
                                self.give_up(s, c, log);
                            } else {
                                // `Acquisition::queue`: register (subscribe), then try again.
                                s.clients[ci].registered = true;
                                s.clients[ci].subscribed = true;
                                s.clients[ci].phase = Phase::Attempting;
                                log.say(|| format!("{}: registers for notices", name(c)));
                            }
                        } else {
                            // `Acquisition::wait_for_turn`
                            if s.clients[ci].granted != 0 {
                                let fence = std::mem::take(&mut s.clients[ci].granted);
                                if self.fresh(&s.clients[ci], fence) {
                                    s.clients[ci].phase = Phase::Confirming { fence, sent: None };
                                    log.say(|| {
                                        format!("{}: a grant is waiting (fencing {fence})", name(c))
                                    });
                                } else {
                                    // `Acquisition::wait_for_turn`: stale, tries again at once.
                                    s.clients[ci].phase = Phase::Attempting;
                                    s.ghost.stale_ignored = true;
                                    log.say(|| {
                                    format!(
                                        "{}: a grant is waiting (fencing {fence}), stale (counter seen {}): tries again",
                                        name(c),
                                        s.clients[ci].fence_seen
                                    )
                                });
                                }
                            } else if now >= s.clients[ci].deadline {
                                self.give_up(s, c, log);
                            } else {
                                let retry_at = (now + remaining).min(s.clients[ci].deadline);
                                s.clients[ci].phase = Phase::Waiting { retry_at };
                                log.say(|| {
                                    format!("{}: waits until a notice or t={retry_at}", name(c))
                                });
                            }
                        }
                    }
                    Some(_) => unreachable!(),
                    None => self.acquire_failed(s, c, log),
                }
            }
            (
                Conn::App,
                Req::Confirm,
                Phase::Confirming {
                    fence,
                    sent: Some(sent),
                },
            ) => match resp {
                // `Acquisition::confirm`
                Some(Resp::Extended(true)) => self.hold(s, c, fence, sent, ttl, log),
                Some(_) => {
                    s.clients[ci].phase = Phase::Attempting;
                    log.say(|| {
                        format!(
                            "{}: the hand-over ran out before it was confirmed; tries again",
                            name(c)
                        )
                    });
                }
                None => self.fail(s, c, End::AcquireError, log),
            },
            (
                Conn::App,
                Req::Release { .. } | Req::Unlock,
                Phase::Releasing { was_lost, valid },
            ) => {
                // `LockGuard::release` with `RedisBackend::release`
                let released = match resp {
                    Some(Resp::Unlocked) => Some(Released::Yes),
                    Some(Resp::Release(RelReply::NotOurs)) if net.resent => Some(Released::Gone),
                    Some(Resp::Release(RelReply::NotOurs)) => Some(Released::NotOurs),
                    Some(Resp::Release(_)) => Some(Released::Yes),
                    Some(_) => unreachable!(),
                    None => None,
                };
                let end = match released {
                    Some(Released::Yes) if was_lost => End::ReleasedLost,
                    Some(Released::Yes) => End::ReleasedOk,
                    Some(Released::Gone) if valid => End::ReleasedOk,
                    Some(Released::Gone | Released::NotOurs) => {
                        s.clients[ci].lost = true;
                        End::ReleasedLost
                    }
                    None => End::ReleaseError,
                };
                // Ghost checks: `Lost` only if the lease may have ended;
                // `Ok` only if it had not.
                let may_have_ended = s.clients[ci].lease_ended || was_lost || !valid;
                if end == End::ReleasedLost && !may_have_ended {
                    s.ghost.false_lost = true;
                }
                if end == End::ReleasedOk && s.clients[ci].ended_at_release {
                    s.ghost.false_ok = true;
                }
                s.clients[c as usize].phase = Phase::Done(end);
                log.say(|| format!("{}: release() -> {end:?}", name(c)));
            }
            (Conn::App, Req::Reserve, Phase::HandingOn) => match resp {
                // `hand_on`: keep the block, hand on its first token.
                Some(Resp::Reserved(top)) if top != 0 => {
                    let line = &mut s.lines[self.cfg.process[ci] as usize];
                    let first = top + 1 - self.cfg.block;
                    // `Local::set_block` (only while still the holder).
                    let fresh = (line.holder == Some(c)).then(|| {
                        line.block = Some((first + 1, top));
                        if self.cfg.hand_on_below_block {
                            first - 1
                        } else {
                            first
                        }
                    });
                    log.say(|| format!("{}: reserved tokens up to {top}", name(c)));
                    self.hand_on(s, c, fresh, log);
                }
                // `hand_on`: 0 or an error: release to the server.
                Some(Resp::Reserved(_)) | None => {
                    log.say(|| {
                        format!(
                            "{}: reserve {}; releases to the server",
                            name(c),
                            if resp.is_some() {
                                "answered 0"
                            } else {
                                "failed"
                            }
                        )
                    });
                    self.release_to_server(s, c, false, log);
                }
                Some(_) => unreachable!(),
            },
            (Conn::App, Req::Release { .. }, Phase::GivingUp) => {
                // `Acquisition::give_up`: an error leaves the clean-up to the
                // background release.
                if resp.is_some() {
                    s.clients[ci].phase = Phase::Done(End::Busy);
                    log.say(|| format!("{}: left the queue; acquire() -> Busy", name(c)));
                    self.represent_end(s, c, log);
                } else {
                    self.fail(s, c, End::Busy, log);
                }
            }
            (conn, req, phase) => unreachable!("{conn:?} {req:?} in {phase:?}"),
        }
    }

    /// `Acquisition::attempt` after a killed connection (not a timeout;
    /// the back-off is far below a tick): tries again within its wait, or
    /// gives up.
    fn acquire_failed(&self, s: &mut State, c: u8, log: &mut Log) {
        let cl = &mut s.clients[c as usize];
        if cl.retries < 8 && (s.now < cl.deadline || cl.retries == 0) {
            cl.retries += 1;
            cl.phase = Phase::Attempting;
            log.say(|| format!("{}: connection error; tries again", name(c)));
        } else {
            self.fail(s, c, End::AcquireError, log);
        }
    }
}
