//! One function per property the checker checks (the table in the
//! [module docs](super)), each counting its violations in the report; the
//! rules that depend on the synchronizer are in `synchronizers`.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::rebuild::Rebuilt;
use super::{HOLD_SLACK_US, Op, Report, RunData, flag, ms, note, synchronizers};
use crate::kind::{Kind, Side};
use crate::log::{Fault, ReleaseOutcome, WriteOutcome};

/// Every operation drawn from the budget began in its worker's log, but one
/// per task of a killed process whose draw's answer never arrived.
pub(super) fn draws(run: &RunData, rb: &Rebuilt, r: &mut Report, examples: &mut Vec<String>) {
    let (ops, killed) = (&rb.ops, &rb.killed);
    let process = |worker| rb.process(worker);
    let mut began: BTreeMap<u32, u64> = run.drawn.keys().map(|&w| (w, 0)).collect();
    for o in ops.iter().filter(|o| o.part == 0) {
        *began.entry(o.worker).or_default() += 1;
    }
    for (worker, logged) in began {
        let drawn = run.drawn.get(&worker).copied().unwrap_or(0);
        match drawn.checked_sub(logged) {
            Some(0) => {}
            Some(1) if killed.contains_key(&process(worker)) => r.killed_mid_draw += 1,
            _ => flag(
                &mut r.violations.log_mismatches,
                examples,
                format!(
                    "worker {worker} drew {drawn} operations from the budget; its log began {logged}"
                ),
            ),
        }
    }
}

/// The store's logs: overlaps in store order, lower tokens accepted, lost
/// and duplicated updates, and whether they agree with the workers' logs.
pub(super) fn store_writes(
    run: &RunData,
    rb: &Rebuilt,
    r: &mut Report,
    examples: &mut Vec<String>,
) {
    let (ops, killed) = (&rb.ops, &rb.killed);
    let process = |worker| rb.process(worker);
    let mut claimed: HashMap<(String, u64), (u32, u64)> = HashMap::new();
    // Writes whose answer never arrived (an error, say a response timeout
    // right after a SIGCONT): the store may have applied them.
    let mut unanswered: HashSet<(&str, u32, u64)> = HashSet::new();
    for o in ops {
        match o.write {
            Some((WriteOutcome::Accepted, seq, _)) => {
                claimed.insert((o.key.clone(), seq), (o.worker, o.op));
            }
            Some((WriteOutcome::Error, ..)) => {
                unanswered.insert((o.key.as_str(), o.worker, o.op));
            }
            _ => {}
        }
    }
    for (key, record) in &run.records {
        r.writes_accepted += record.writes.len() as u64;
        r.fenced_out += record.rejected;
        let mut seen = HashSet::new();
        for (i, w) in record.writes.iter().enumerate() {
            if w.seq != i as u64 + 1 {
                flag(
                    &mut r.violations.log_mismatches,
                    examples,
                    format!("{key}: store write #{} numbered {}", i + 1, w.seq),
                );
            }
            if w.read_version + 1 != w.seq {
                flag(
                    &mut r.violations.store_overlaps,
                    examples,
                    format!(
                        "{key}: write {} (worker {} op {}, token {}) read version {}: {} other write(s) came between its read and its write",
                        w.seq,
                        w.worker,
                        w.op,
                        w.fence,
                        w.read_version,
                        w.seq.saturating_sub(w.read_version + 1)
                    ),
                );
            }
            if w.fence < w.max_before {
                flag(
                    &mut r.violations.lower_token_accepted,
                    examples,
                    format!(
                        "{key}: write {} accepted with token {} after token {} was seen",
                        w.seq, w.fence, w.max_before
                    ),
                );
            }
            if !seen.insert((w.worker, w.op)) {
                flag(
                    &mut r.violations.duplicated_updates,
                    examples,
                    format!("{key}: worker {} op {} applied twice", w.worker, w.op),
                );
            }
            match claimed.get(&(key.clone(), w.seq)) {
                Some(&(worker, op)) if worker == w.worker && op == w.op => {}
                Some(&(worker, op)) => {
                    flag(
                        &mut r.violations.log_mismatches,
                        examples,
                        format!(
                            "{key}: store write {} is worker {} op {}, but worker {worker} op {op} claims it",
                            w.seq, w.worker, w.op
                        ),
                    );
                }
                // A worker killed before it logged the answer, or one whose
                // answer was lost.
                None if killed.contains_key(&process(w.worker))
                    || unanswered.contains(&(key.as_str(), w.worker, w.op)) => {}
                None => {
                    flag(
                        &mut r.violations.log_mismatches,
                        examples,
                        format!(
                            "{key}: store write {} (worker {} op {}) is in no worker's log",
                            w.seq, w.worker, w.op
                        ),
                    );
                }
            }
        }
        let accepted = record.writes.len() as u64;
        if record.counter < accepted {
            r.violations.lost_updates += accepted - record.counter;
            note(
                examples,
                format!(
                    "{key}: {accepted} accepted writes but the counter is {}",
                    record.counter
                ),
            );
        } else if record.counter > accepted {
            r.violations.duplicated_updates += record.counter - accepted;
        }
    }
    for ((key, seq), (worker, op)) in &claimed {
        let present = run
            .records
            .get(key)
            .and_then(|rec| rec.writes.get((*seq as usize).wrapping_sub(1)))
            .is_some();
        if !present {
            flag(
                &mut r.violations.log_mismatches,
                examples,
                format!(
                    "{key}: worker {worker} op {op} says write {seq} was accepted; the store has no such write"
                ),
            );
        }
    }
}

/// Fencing tokens of one key: none given twice (one of them exclusive), none
/// below one acquired before the attempt began.
pub(super) fn tokens(
    run: &RunData,
    key: &str,
    key_ops: &[&Op],
    r: &mut Report,
    examples: &mut Vec<String>,
) {
    // Per token: acquisitions, and how many of them exclusive. Token 0 is
    // none: a holder that was to ask for its token later, and never got
    // one (refused, or struck before it asked).
    let mut fences: HashMap<u64, (u32, u32)> = HashMap::new();
    for o in key_ops {
        if let Some((fence, _)) = o.acquired.filter(|&(fence, _)| fence != 0) {
            let (n, exclusive) = fences.entry(fence).or_default();
            *n += 1;
            *exclusive += u32::from(o.side == Side::Write);
        }
    }
    for (fence, (n, exclusive)) in fences {
        if n < 2 {
            continue;
        }
        // Every acquisition has a token of its own, shared holders' too
        // (readers granted together were once all told the last one's).
        r.fence_regressions += 1;
        if run.expect_monotonic_fences {
            flag(
                &mut r.violations.duplicate_fences,
                examples,
                format!("{key}: token {fence} given to {n} acquisitions, {exclusive} exclusive"),
            );
        }
    }
    // A token must exceed every token acquired (by anyone) before this
    // attempt began; 1 ms of margin covers cross-process clock error.
    // A token asked for after the grant counts from the grant: it must be
    // above every token acquired before the holder's attempt, and the next
    // holder's must be above it. Two shared holders (readers, a
    // semaphore's) may hold at once, each asking for its token after its
    // grant: between them, order is owed only once the earlier one let go
    // (its token was minted before its release was sent). A shared attempt
    // is therefore held to the exclusive acquisitions before it and to the
    // shared holds that ended before it; an exclusive one to all.
    let tokened = || {
        key_ops
            .iter()
            .filter(|o| o.acquired.is_some_and(|(f, _)| f != 0))
    };
    let sorted = |mut v: Vec<(u64, u64)>| {
        v.sort_unstable();
        v
    };
    let acquired = |side: Option<Side>| {
        sorted(
            tokened()
                .filter(|o| side.is_none_or(|s| o.side == s))
                .filter_map(|o| o.acquired.map(|(fence, t)| (t, fence)))
                .collect(),
        )
    };
    // (when, token), each list by time: every acquisition, the exclusive
    // ones, and the end of each shared hold (its release sent).
    let (all, exclusive) = (acquired(None), acquired(Some(Side::Write)));
    let shared_ends = sorted(
        tokened()
            .filter(|o| o.side == Side::Read)
            .filter_map(|o| {
                let ended = o.release_sent.or(o.released.map(|(_, t)| t))?;
                o.acquired.map(|(fence, _)| (ended, fence))
            })
            .collect(),
    );
    let mut attempts: Vec<(u64, u64, bool)> = tokened()
        .filter_map(|o| {
            let (fence, _) = o.acquired?;
            Some((o.attempt, fence, o.side == Side::Read))
        })
        .collect();
    attempts.sort_unstable();
    // The highest token of `list` at times before `start` (less the
    // margin), `list`'s cursor kept in `at`.
    let advance = |list: &[(u64, u64)], at: &mut usize, highest: &mut u64, start: u64| {
        while *at < list.len() && list[*at].0 + 1000 < start {
            *highest = (*highest).max(list[*at].1);
            *at += 1;
        }
    };
    let (mut cursors, mut highs) = ([0usize; 3], [0u64; 3]);
    for (start, fence, shared) in attempts {
        advance(&all, &mut cursors[0], &mut highs[0], start);
        advance(&exclusive, &mut cursors[1], &mut highs[1], start);
        advance(&shared_ends, &mut cursors[2], &mut highs[2], start);
        let highest = if shared {
            highs[1].max(highs[2])
        } else {
            highs[0]
        };
        if fence < highest {
            r.fence_regressions += 1;
            if run.expect_monotonic_fences {
                flag(
                    &mut r.violations.fence_regressions,
                    examples,
                    format!("{key}: token {fence} issued after token {highest} had been"),
                );
            }
        }
    }
}

/// Holds of one key: more at once than the kind admits (in the logs and in
/// store order), readers inside a write, `hold_at_least`.
pub(super) fn holds(
    run: &RunData,
    key: &str,
    key_ops: &[&Op],
    r: &mut Report,
    examples: &mut Vec<String>,
) {
    // Holds that released successfully, more at once than the kind
    // admits (two of a mutex, a writer with anyone, more than a
    // semaphore's permits): in the logs, and in the store's order.
    let record = run.records.get(key);
    let crowded =
        synchronizers::crowded_in_logs(run.kind, key, key_ops)
            .into_iter()
            .chain(record.into_iter().flat_map(|record| {
                synchronizers::crowded_in_store(run.kind, key, key_ops, record)
            }));
    for found in crowded {
        let count = match run.kind {
            Kind::Semaphore { .. } => &mut r.violations.too_many_holders,
            _ => &mut r.violations.client_overlaps,
        };
        flag(count, examples, found);
    }
    // A reader let in while a writer changed the record.
    for found in record
        .into_iter()
        .flat_map(|record| synchronizers::reads_inside_writes(key, record))
    {
        flag(&mut r.violations.store_overlaps, examples, found);
    }
    if let Kind::HoldAtLeast { ms: min } = run.kind {
        for found in synchronizers::held_too_briefly(min, HOLD_SLACK_US, key, key_ops) {
            flag(&mut r.violations.held_too_briefly, examples, found);
        }
    }
}

/// Stalls: some operation waits while no holder is reported. A waiter
/// does not count while its own process is stopped: it cannot take a free
/// lock then (nor report one handed to it), and that is the fault, not the
/// lock leaving it behind; the waiters behind it still count.
pub(super) fn stalls(
    run: &RunData,
    rb: &Rebuilt,
    by_key: &BTreeMap<&str, Vec<&Op>>,
    r: &mut Report,
    examples: &mut Vec<String>,
) {
    let (end_of_log, killed) = (&rb.end_of_log, &rb.killed);
    let slack_us = run.slack_ms * 1000;
    let ttl_us = run.ttl_ms * 1000;
    let server_faults: Vec<(u64, u64)> = run
        .faults
        .iter()
        .filter_map(|f| match f {
            Fault::Server { start, end, .. } => Some((*start, *end)),
            _ => None,
        })
        .collect();
    let mut stops: Vec<(u32, u64, u64)> = run
        .faults
        .iter()
        .filter_map(|f| match f {
            Fault::StopWorker { worker, start, end } => Some((*worker, *start, *end)),
            _ => None,
        })
        .collect();
    stops.sort_unstable_by_key(|&(_, start, _)| start);
    for (key, key_ops) in by_key {
        let mut edges: Vec<(u64, i32, i32)> = Vec::new(); // (t, waiting delta, holding delta)
        for o in key_ops {
            let eol = end_of_log.get(&o.worker).copied().unwrap_or(0);
            let death = killed.get(&o.process).copied();
            let wait_end = o.wait_end().unwrap_or_else(|| death.unwrap_or(eol));
            // The wait, less its own process's stops.
            let mut from = o.attempt;
            let own_stops = stops.iter().filter(|&&(p, _, _)| p == o.process);
            for &(_, start, end) in own_stops {
                if start < wait_end && end > from {
                    if start > from {
                        edges.push((from, 1, 0));
                        edges.push((start, -1, 0));
                    }
                    from = from.max(end);
                }
            }
            if from == o.attempt || from < wait_end {
                edges.push((from, 1, 0));
                edges.push((wait_end.max(from), -1, 0));
            }
            if let Some((_, t)) = o.acquired {
                edges.push((t, 0, 1));
                edges.push((o.hold_end(death, eol).max(t), 0, -1));
            }
        }
        // At one instant, starts of holds before ends of waits.
        edges.sort_unstable_by_key(|&(t, w, h)| (t, -h, w));
        let (mut waiting, mut holding) = (0i32, 0i32);
        let mut since: Option<u64> = None;
        for (t, dw, dh) in edges {
            waiting += dw;
            holding += dh;
            let stalled = waiting > 0 && holding == 0;
            match (since, stalled) {
                (None, true) => since = Some(t),
                (Some(s), false) => {
                    since = None;
                    let stall = t - s;
                    if ms(stall) > r.max_stall_ms {
                        r.max_stall_ms = ms(stall);
                        r.max_stall_at = (s, key.to_string());
                    }
                    // Server faults (and one lease after) explain stalls.
                    let explained = server_faults
                        .iter()
                        .any(|&(fs, fe)| s <= fe + ttl_us + slack_us && t >= fs);
                    if stall > ttl_us + slack_us && !explained {
                        flag(
                            &mut r.violations.stalled,
                            examples,
                            format!(
                                "{key}: waiters waited {} ms with no holder reported (from {s} µs; TTL {} ms)",
                                ms(stall),
                                run.ttl_ms
                            ),
                        );
                    }
                }
                _ => {}
            }
        }
    }
}

/// Stopped and killed holders (`victim` is a process: all of its tasks):
/// taken over within a lease, stale writes, releases after the stop.
pub(super) fn struck_holders(
    run: &RunData,
    rb: &Rebuilt,
    by_key: &BTreeMap<&str, Vec<&Op>>,
    r: &mut Report,
    examples: &mut Vec<String>,
) {
    let (ops, killed) = (&rb.ops, &rb.killed);
    let slack_us = run.slack_ms * 1000;
    let ttl_us = run.ttl_ms * 1000;
    for f in &run.faults {
        let (victim, start, end) = match f {
            Fault::StopWorker { worker, start, end } => (*worker, *start, Some(*end)),
            Fault::KillWorker { worker, t } => (*worker, *t, None),
            _ => continue,
        };
        if end.is_some_and(|e| e - start <= ttl_us) {
            continue; // a short stop: the lease may survive it
        }
        // Every task of the process that held a key when it was struck (a
        // one-task process holds one at most).
        let held_ops = ops.iter().filter(|o| {
            o.process == victim
                && o.acquired.is_some_and(|(_, t)| t <= start)
                && o.release_sent.is_none_or(|t| t >= start)
        });
        for held in held_ops {
            let key_ops = &by_key[held.key.as_str()];
            // The next holder that the stopped one kept out (a reader keeps
            // out writers only; a semaphore's holder, the last permit).
            let next = synchronizers::taken_over(run.kind, key_ops, victim, held.side, start);
            // Another process wanted the key when the fault struck, or
            // within a lease after (one that had got it, or given up, or
            // died, before the fault does not count). A semaphore's other
            // permits may serve every later wish without the struck one's:
            // only a wish still waiting once the lease had ended shows the
            // struck permit kept (the run may end with nobody needing it).
            let wanted_until = match run.kind {
                Kind::Semaphore { .. } => start + ttl_us + slack_us,
                _ => start,
            };
            let pending = ops.iter().any(|o| {
                let death = killed.get(&o.process).copied();
                o.key == held.key
                    && o.process != victim
                    && run.kind.conflicts(held.side, o.side)
                    && o.attempt <= start + ttl_us
                    && o.wait_end().or(death).is_none_or(|t| t >= wanted_until)
            });
            match next {
                // Only a holder kept out says how long the key stayed
                // taken: when nobody wanted it until later (keys of their
                // own), the next holder came when it came.
                Some(t) if pending => {
                    let takeover = t - start;
                    r.max_takeover_ms = r.max_takeover_ms.max(ms(takeover));
                    if takeover > ttl_us + slack_us {
                        flag(
                            &mut r.violations.held_past_ttl,
                            examples,
                            format!(
                                "{}: worker {} {} at {start} µs holding it; the next holder got it {} ms later (TTL {} ms)",
                                held.key,
                                held.worker,
                                if end.is_some() { "stopped" } else { "killed" },
                                ms(takeover),
                                run.ttl_ms
                            ),
                        );
                    }
                }
                None if pending => {
                    flag(
                        &mut r.violations.held_past_ttl,
                        examples,
                        format!(
                            "{}: nobody got the key after worker {}'s fault at {start} µs",
                            held.key, held.worker
                        ),
                    );
                }
                _ => {}
            }
            if let Some(end) = end {
                // Stale: sent once the store had seen the next holder's token
                // (its read had returned). Only then must fencing refuse it: a
                // write in flight when the stop came, or one that reaches the
                // store before any higher token, is rightly taken.
                let next_read = ops
                    .iter()
                    .filter(|o| o.key == held.key && o.process != victim)
                    .filter(|o| o.acquired.is_some_and(|(_, t)| t >= start))
                    .filter_map(|o| o.read)
                    .min();
                if let Some((outcome, _, sent)) = held.write
                    && sent >= end
                    && next_read.is_some_and(|read| read <= sent)
                {
                    r.stale_writes += 1;
                    if outcome == WriteOutcome::Rejected {
                        r.stale_writes_rejected += 1;
                    }
                }
                // A release sent before `end` (read before the SIGCONT) was
                // sent before the stop landed (a stopped process sends
                // nothing): it ran while the lease was valid, and `Ok` is
                // right. The stop's `start` is read before the SIGSTOP, which
                // a victim at the end of its think can outrun.
                let sent_after_stop = held.release_sent.is_some_and(|t| t >= end);
                // One release per operation, however many keys it held.
                let released = held.released.filter(|_| held.part == 0);
                match released {
                    Some((ReleaseOutcome::Lost, _)) => r.stale_release_lost += 1,
                    Some((ReleaseOutcome::Ok, _)) if sent_after_stop => {
                        flag(
                            &mut r.violations.stale_release_ok,
                            examples,
                            format!(
                                "{}: worker {} op {} was stopped {} ms (TTL {} ms) and its release still said Ok",
                                held.key,
                                held.worker,
                                held.op,
                                ms(end - start),
                                run.ttl_ms
                            ),
                        );
                    }
                    _ => {}
                }
            }
        }
    }
}

/// Tokens asked for after the grant (the lazy token's scenario). A refusal
/// (`Lost`) is counted, with whether the holder had been stopped past its
/// lease while it held, and whether another holder of the key had written
/// by then (Kleppmann's paused holder). A token handed to a holder
/// although another had taken the key since its grant, above that one's
/// token, is a violation: the token of a lease that had ended, which a
/// fenced store would take over the next holder's.
pub(super) fn tokens_after_the_grant(
    run: &RunData,
    rb: &Rebuilt,
    by_key: &BTreeMap<&str, Vec<&Op>>,
    r: &mut Report,
    examples: &mut Vec<String>,
) {
    let ttl_us = run.ttl_ms * 1000;
    for o in &rb.ops {
        let (Some(sent), Some((fence, granted))) = (o.token_sent, o.acquired) else {
            continue;
        };
        // Holders that took the key after this grant, their grant logged
        // before the token was asked for (1 ms of margin for the clocks).
        let later = || {
            by_key[o.key.as_str()].iter().filter(move |b| {
                b.worker != o.worker
                    && run.kind.conflicts(o.side, b.side)
                    && b.acquired
                        .is_some_and(|(_, t)| t > granted && t + 1000 < sent)
            })
        };
        match o.token_refused {
            Some((true, answered)) => {
                r.tokens_refused += 1;
                // A stop past the lease between the attempt and the answer:
                // before the ask, or with the ask on its way (the harness
                // strikes on a mark that stays until the operation ends).
                let struck = run.faults.iter().any(|f| {
                    matches!(f, Fault::StopWorker { worker, start, end }
                        if *worker == o.process
                            && *start < answered
                            && *end > o.attempt
                            && end - start > ttl_us)
                });
                r.tokens_refused_struck += u64::from(struck);
                let next_wrote = by_key[o.key.as_str()].iter().any(|b| {
                    b.worker != o.worker
                        && run.kind.conflicts(o.side, b.side)
                        && b.acquired.is_some_and(|(_, t)| t > granted)
                        && b.written.is_some_and(|t| t < answered)
                });
                r.tokens_refused_after_next_write += u64::from(next_wrote);
            }
            // Not asked (the server could not be reached): no token either.
            Some((false, _)) => {}
            None => {
                let overtaken = later().find_map(|b| {
                    let (next, t) = b.acquired?;
                    (next != 0 && next < fence).then_some((b, next, t))
                });
                if let Some((b, next, t)) = overtaken {
                    flag(
                        &mut r.violations.late_tokens,
                        examples,
                        format!(
                            "{}: worker {} op {}, granted at {granted} µs, asked for its token at {sent} µs and got {fence}, though worker {} op {} had taken the key at {t} µs (token {next})",
                            o.key, o.worker, o.op, b.worker, b.op
                        ),
                    );
                }
            }
        }
    }
}

/// Blocked runtimes (scenario 7): told the lease was lost exactly when the
/// block outlived it.
pub(super) fn blocked_runtimes(
    run: &RunData,
    ops: &[Op],
    r: &mut Report,
    examples: &mut Vec<String>,
) {
    for o in ops {
        let Some((block, _, lost_after)) = o.blocked else {
            continue;
        };
        let released = o.released.map(|(outcome, _)| outcome);
        let wrong = if block < run.ttl_ms {
            r.blocked_keep += 1;
            lost_after.is_some() || released != Some(ReleaseOutcome::Ok)
        } else {
            r.blocked_lose += 1;
            lost_after.is_none() || released == Some(ReleaseOutcome::Ok)
        };
        if wrong {
            flag(
                &mut r.violations.blocked_wrong,
                examples,
                format!(
                    "{}: worker {} op {} blocked {block} ms with a {} ms lease: lost after {:?} ms, release {:?}",
                    o.key, o.worker, o.op, run.ttl_ms, lost_after, released
                ),
            );
        }
    }
}
