//! Repeated runs of one scenario, summarised: a fault figure is a rate over
//! runs, with the spread (min / median / max) of violations and of the
//! longest stall, so one lucky run cannot stand for the scenario.

use std::collections::BTreeMap;

use crate::scenario::Outcome;

/// Min, median and max of `values` (the median of an even count is the mean
/// of the two middle values). `None` for no values.
pub fn min_median_max(values: &[u64]) -> Option<(u64, f64, u64)> {
    let mut v = values.to_vec();
    v.sort_unstable();
    let (first, last) = (*v.first()?, *v.last()?);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2] as f64
    } else {
        (v[n / 2 - 1] as f64 + v[n / 2] as f64) / 2.0
    };
    Some((first, median, last))
}

fn fmt_spread(values: &[u64], unit: &str) -> String {
    match min_median_max(values) {
        None => "-".into(),
        Some((lo, med, hi)) => {
            let med = if med.fract() == 0.0 {
                format!("{med:.0}")
            } else {
                format!("{med:.1}")
            };
            format!("{lo} / {med} / {hi}{unit}")
        }
    }
}

/// The runs of each scenario, in the order they were first run.
pub fn group(outcomes: &[Outcome]) -> Vec<(&'static str, Vec<&Outcome>)> {
    let mut order: Vec<&'static str> = Vec::new();
    let mut by: BTreeMap<&'static str, Vec<&Outcome>> = BTreeMap::new();
    for o in outcomes {
        if !by.contains_key(o.scenario.name) {
            order.push(o.scenario.name);
        }
        by.entry(o.scenario.name).or_default().push(o);
    }
    order
        .into_iter()
        .map(|name| (name, by.remove(name).unwrap_or_default()))
        .collect()
}

/// One row per scenario: runs, operations per run, runs that came out as
/// expected, violations and max stall as min / median / max over the runs
/// (harness errors excluded from the spreads), and which violations were seen
/// in which runs.
pub fn table(outcomes: &[Outcome]) -> String {
    let mut s = String::new();
    s.push_str(
        "| scenario | runs | ops/run | as expected | violations min / median / max | max stall min / median / max | max wait min / median / max | notes |\n",
    );
    s.push_str("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n");
    for (_, runs) in group(outcomes) {
        let Some(first) = runs.first() else { continue };
        let ok: Vec<&&Outcome> = runs.iter().filter(|o| o.error.is_none()).collect();
        let violations: Vec<u64> = ok.iter().map(|o| o.report.violations.total()).collect();
        let stalls: Vec<u64> = ok.iter().map(|o| o.report.max_stall_ms).collect();
        let waits: Vec<u64> = ok.iter().map(|o| o.report.max_wait_ms).collect();
        let expected = runs.iter().filter(|o| o.as_expected()).count();
        let mut notes = Vec::new();
        let errors = runs.len() - ok.len();
        if errors > 0 {
            notes.push(format!("{errors} harness error(s)"));
        }
        for (i, o) in runs.iter().enumerate() {
            let kinds = o.report.violations.nonzero();
            if !kinds.is_empty() && !o.scenario.expect_violations {
                let kinds: Vec<String> = kinds.iter().map(|(k, n)| format!("{k} {n}")).collect();
                notes.push(format!("run {}: {}", i + 1, kinds.join(", ")));
            }
        }
        let regressions: Vec<u64> = ok.iter().map(|o| o.report.fence_regressions).collect();
        if regressions.iter().any(|r| *r > 0) {
            notes.push(format!(
                "token repeats/regressions {}",
                fmt_spread(&regressions, "")
            ));
        }
        let local: Vec<u64> = ok.iter().filter_map(|o| o.handed_on_locally()).collect();
        if !local.is_empty() {
            notes.push(format!(
                "handed on in-process at least {}",
                fmt_spread(&local, "")
            ));
        }
        let refused: Vec<u64> = ok.iter().map(|o| o.report.tokens_refused).collect();
        if refused.iter().any(|n| *n > 0) {
            let after: Vec<u64> = ok
                .iter()
                .map(|o| o.report.tokens_refused_after_next_write)
                .collect();
            let strikes: Vec<u64> = ok.iter().map(|o| o.faults as u64).collect();
            notes.push(format!(
                "strikes {}, tokens refused after the lease ended {} ({} once the next holder had written)",
                fmt_spread(&strikes, ""),
                fmt_spread(&refused, ""),
                fmt_spread(&after, "")
            ));
        }
        // Scenario 13: the keys vary from run to run, the kills do not.
        let orders: Vec<&Outcome> = ok
            .iter()
            .copied()
            .copied()
            .filter(|o| o.orders.is_some())
            .collect();
        if !orders.is_empty() {
            let keys: Vec<u64> = orders.iter().map(|o| o.report.operations).collect();
            let kills: Vec<u64> = orders.iter().map(|o| o.faults as u64).collect();
            let duplicates: Vec<String> = orders
                .iter()
                .map(|o| o.report.violations.duplicate_orders.to_string())
                .collect();
            notes.push(format!(
                "keys {}, kills {}, orders beyond one per key in each run: {}",
                fmt_spread(&keys, ""),
                fmt_spread(&kills, ""),
                duplicates.join(" ")
            ));
        }
        let ops = ok.first().map_or(0, |o| o.report.operations);
        s.push_str(&format!(
            "| {} | {} | {} | {} of {} | {} | {} | {} | {} |\n",
            first.scenario.title,
            runs.len(),
            ops,
            expected,
            runs.len(),
            fmt_spread(&violations, ""),
            fmt_spread(&stalls, " ms"),
            fmt_spread(&waits, " ms"),
            notes.join("; ")
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(min_median_max(&[]), None);
        assert_eq!(min_median_max(&[5]), Some((5, 5.0, 5)));
        assert_eq!(min_median_max(&[9, 1, 4]), Some((1, 4.0, 9)));
        assert_eq!(min_median_max(&[0, 0, 658, 0]), Some((0, 0.0, 658)));
        assert_eq!(min_median_max(&[1, 2, 3, 4]), Some((1, 2.5, 4)));
        assert_eq!(fmt_spread(&[1, 2, 3, 4], " ms"), "1 / 2.5 / 4 ms");
    }
}
