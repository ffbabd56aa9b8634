//! The table of a run's outcomes.

use super::*;

/// The table: scenario, operations, violations, max stall, and what else
/// each run showed.
pub fn table(outcomes: &[Outcome]) -> String {
    let mut s = String::new();
    s.push_str("| scenario | operations | violations | max stall | notes |\n");
    s.push_str("| --- | ---: | ---: | ---: | --- |\n");
    for o in outcomes {
        let r = &o.report;
        let mut notes = vec![match o.orders {
            // Scenario 13: keys, not lock operations.
            Some(orders) => format!(
                "{} keys acknowledged, {} requests ({} without a 2xx, tried again), {} orders at the end, longest key {} ms",
                r.acquired, orders.requests, orders.failed, orders.orders, r.max_wait_ms
            ),
            None => format!(
                "{} acquired, {} writes accepted, max wait {} ms",
                r.acquired, r.writes_accepted, r.max_wait_ms
            ),
        }];
        if r.fenced_out > 0 {
            notes.push(format!("{} rejected by fencing", r.fenced_out));
        }
        if r.acquire_errors > 0 {
            notes.push(format!("{} acquire errors retried", r.acquire_errors));
        }
        if r.cancelled > 0 {
            notes.push(format!("{} cancelled", r.cancelled));
        }
        if r.killed_mid_draw > 0 {
            notes.push(format!(
                "{} drawn by tasks killed before their attempt",
                r.killed_mid_draw
            ));
        }
        if let (Some(local), Some(tokens)) = (o.handed_on_locally(), o.tokens) {
            notes.push(format!(
                "at least {local} handed on in-process ({} tokens from the server, {} blocks reserved)",
                tokens.single, tokens.blocks
            ));
        }
        if r.stale_writes > 0 || r.stale_release_lost > 0 {
            notes.push(format!(
                "stale writes {} ({} rejected), stale releases \"not owner\" {}",
                r.stale_writes, r.stale_writes_rejected, r.stale_release_lost
            ));
        }
        if r.tokens_refused > 0 {
            notes.push(format!(
                "{} tokens refused after the lease ended ({} after a stop past it, {} once the next holder had written)",
                r.tokens_refused, r.tokens_refused_struck, r.tokens_refused_after_next_write
            ));
        }
        if r.max_takeover_ms > 0 {
            notes.push(format!(
                "max takeover after stop/kill {} ms",
                r.max_takeover_ms
            ));
        }
        if r.fence_regressions > 0 {
            notes.push(format!("{} token repeats/regressions", r.fence_regressions));
        }
        if r.blocked_keep + r.blocked_lose > 0 {
            notes.push(format!(
                "blocked {} x keep, {} x lose",
                r.blocked_keep, r.blocked_lose
            ));
        }
        match (o.faults, o.orders) {
            (0, _) => {}
            (kills, Some(_)) => notes.push(format!("{kills} kills")),
            (faults, None) => notes.push(format!("{faults} faults")),
        }
        if let Some(f) = r.fifo {
            notes.push(format!(
                "{} waiters seen in line, {} grants with an earlier waiter in line, try-once {} granted / {} busy",
                f.queued, f.behind, f.try_once_granted, f.try_once_refused
            ));
            if f.lapsed + f.unseen_lapses + f.passed_lapsed + f.passed_errored + f.mismatches > 0 {
                notes.push(format!(
                    "{} hand-overs lapsed ({} more unseen, the waiter's process unscheduled longer than its lease; {} grants passed such a waiter, {} passed a waiter whose attempt failed), {} queue list/set mismatches",
                    f.lapsed, f.unseen_lapses, f.passed_lapsed, f.passed_errored, f.mismatches
                ));
            }
        }
        if let Some(e) = &o.error {
            let first = e.lines().next().unwrap_or_default();
            s.push_str(&format!(
                "| {} | - | harness error | - | {first} |\n",
                o.scenario.title
            ));
            continue;
        }
        let violations = if r.violations.total() == 0 {
            "0".to_string()
        } else {
            let kinds: Vec<String> = r
                .violations
                .nonzero()
                .iter()
                .map(|(k, n)| format!("{k} {n}"))
                .collect();
            format!(
                "{}{} ({})",
                r.violations.total(),
                if o.scenario.expect_violations {
                    " (expected)"
                } else {
                    ""
                },
                kinds.join(", ")
            )
        };
        s.push_str(&format!(
            "| {} | {} | {} | {} ms | {}; {:.0} s |\n",
            o.scenario.title,
            r.operations,
            violations,
            r.max_stall_ms,
            notes.join("; "),
            o.elapsed.as_secs_f64()
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_calls_are_read_from_info_commandstats() {
        let info = "# Commandstats\r\n\
            cmdstat_evalsha:calls=900,usec=1,usec_per_call=0.00\r\n\
            cmdstat_incrby:calls=5,usec=2,usec_per_call=0.40\r\n\
            cmdstat_incr:calls=486,usec=3,usec_per_call=0.01\r\n";
        assert_eq!(
            TokenCalls::parse(info),
            TokenCalls {
                single: 486,
                blocks: 5
            }
        );
        assert_eq!(TokenCalls::parse(""), TokenCalls::default());
    }

    #[test]
    fn every_scenario_has_its_own_name() {
        let suite = Scenario::suite(500, true);
        let mut names: Vec<&str> = suite.iter().map(|s| s.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), suite.len());
    }
}
