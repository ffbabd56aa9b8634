//! Statistics (by sorting), the result table and its JSON form.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// What a row must reach, as in issues 6 and 14's Targets.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Target {
    /// `value / baseline <= x`.
    RatioAtMost(f64),
    /// `value / baseline >= x`.
    RatioAtLeast(f64),
    /// `value <= x`.
    AtMost(f64),
    /// Reported, no target.
    Info,
}

impl Target {
    fn describe(self, unit: Unit) -> String {
        match self {
            Target::RatioAtMost(x) => format!("ratio <= {x}"),
            Target::RatioAtLeast(x) => format!("ratio >= {x}"),
            Target::AtMost(x) => format!("<= {}", unit.format(x)),
            Target::Info => "-".into(),
        }
    }
}

/// How a value is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unit {
    Micros,
    Millis,
    PerSec,
    /// A dimensionless factor (max/min).
    Factor,
    /// A plain count (commands, locks).
    Count,
    KiB,
    Percent,
}

impl Unit {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Unit::Micros => "us",
            Unit::Millis => "ms",
            Unit::PerSec => "/s",
            Unit::Factor => "x",
            Unit::Count => "",
            Unit::KiB => "KiB",
            Unit::Percent => "%",
        }
    }

    pub(crate) fn format(self, v: f64) -> String {
        if !v.is_finite() {
            return "inf".into();
        }
        match self {
            Unit::Micros | Unit::Millis => format!("{} {}", sig(v), self.name()),
            Unit::PerSec => format!("{}/s", thousands(v)),
            Unit::Factor => format!("{:.2}x", v),
            // Three decimals near the small targets (row 7's 1.0), so a
            // value just above the target does not print as equal to it.
            Unit::Count if v.fract() == 0.0 => format!("{v:.0}"),
            Unit::Count if v.abs() < 10.0 => format!("{v:.3}"),
            Unit::Count => sig(v),
            Unit::KiB => format!("{} KiB", thousands(v)),
            Unit::Percent => format!("{:.1} %", v),
        }
    }
}

/// Three significant digits, at least.
fn sig(v: f64) -> String {
    let a = v.abs();
    if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

fn thousands(v: f64) -> String {
    let n = v.round() as i64;
    let digits = n.abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 { format!("-{out}") } else { out }
}

/// The nearest-rank percentile `p` (0..=100) of `samples`, sorting a copy.
pub(crate) fn percentile(samples: &[f64], p: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

/// The median (mean of the two middle values for an even count).
pub(crate) fn median(samples: &[f64]) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// A row of the table: its definition and what each repetition measured.
#[derive(Debug)]
pub(crate) struct Metric {
    pub(crate) row: &'static str,
    pub(crate) measure: &'static str,
    pub(crate) unit: Unit,
    pub(crate) baseline_label: &'static str,
    pub(crate) target: Target,
    /// One value per repetition.
    pub(crate) values: Vec<f64>,
    /// The baseline of the same repetition, if the row has one.
    pub(crate) baselines: Vec<f64>,
    /// Set when the row could not be measured (e.g. the attribute is not there yet).
    pub(crate) not_measured: Option<String>,
    /// Remarks printed under the table.
    pub(crate) notes: Vec<String>,
}

impl Metric {
    /// Records one repetition: the value and its baseline.
    pub(crate) fn record(&mut self, value: f64, baseline: f64) {
        self.values.push(value);
        self.baselines.push(baseline);
    }

    pub(crate) fn new(
        row: &'static str,
        measure: &'static str,
        unit: Unit,
        baseline_label: &'static str,
        target: Target,
    ) -> Self {
        Self {
            row,
            measure,
            unit,
            baseline_label,
            target,
            values: Vec::new(),
            baselines: Vec::new(),
            not_measured: None,
            notes: Vec::new(),
        }
    }

    pub(crate) fn value(&self) -> Option<f64> {
        (!self.values.is_empty()).then(|| median(&self.values))
    }

    pub(crate) fn baseline(&self) -> Option<f64> {
        (!self.baselines.is_empty()).then(|| median(&self.baselines))
    }

    /// The median of the per-repetition ratios: each repetition's value and
    /// baseline were measured side by side, so their ratio cancels the noise
    /// both saw.
    pub(crate) fn ratio(&self) -> Option<f64> {
        if self.baselines.len() != self.values.len() || self.values.is_empty() {
            return None;
        }
        let ratios: Vec<f64> = self
            .values
            .iter()
            .zip(&self.baselines)
            .map(|(v, b)| v / b)
            .collect();
        Some(median(&ratios))
    }

    /// `Some(true/false)` for rows with a target; `None` for info rows and rows
    /// not measured.
    pub(crate) fn pass(&self) -> Option<bool> {
        if self.not_measured.is_some() {
            return None;
        }
        let value = self.value()?;
        match self.target {
            Target::RatioAtMost(x) => self.ratio().map(|r| r <= x),
            Target::RatioAtLeast(x) => self.ratio().map(|r| r >= x),
            Target::AtMost(x) => Some(value <= x),
            Target::Info => None,
        }
    }

    fn verdict(&self) -> String {
        if self.not_measured.is_some() {
            return "NOT YET".into();
        }
        match (self.pass(), self.target) {
            (_, Target::Info) => "info".into(),
            (Some(true), _) => "pass".into(),
            (Some(false), _) => "FAIL".into(),
            (None, _) => "-".into(),
        }
    }
}

/// One metric's cells, as the text table and the Markdown table show them:
/// row, measure, value, baseline, ratio, target, verdict.
fn cells(m: &Metric) -> [String; 7] {
    let value = match (&m.not_measured, m.value()) {
        (Some(_), _) => "not yet".into(),
        (None, Some(v)) => m.unit.format(v),
        (None, None) => "-".into(),
    };
    let baseline = match m.baseline() {
        Some(b) => format!("{} ({})", m.unit.format(b), m.baseline_label),
        None if !m.baseline_label.is_empty() => m.baseline_label.to_string(),
        None => "-".into(),
    };
    let ratio = m
        .ratio()
        .filter(|_| m.not_measured.is_none())
        .map(|r| {
            if r.is_finite() {
                format!("{r:.2}")
            } else {
                "inf".into()
            }
        })
        .unwrap_or_else(|| "-".into());
    [
        m.row.to_string(),
        m.measure.to_string(),
        value,
        baseline,
        ratio,
        m.target.describe(m.unit),
        m.verdict(),
    ]
}

/// Renders the metrics as an aligned text table (medians over repetitions).
pub(crate) fn table(metrics: &[Metric]) -> String {
    let header = [
        "row", "measure", "value", "baseline", "ratio", "target", "verdict",
    ];
    let rows: Vec<[String; 7]> = metrics.iter().map(cells).collect();
    let mut widths = header.map(str::len);
    for r in &rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, cells: &[String]| {
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            let pad = w - cell.chars().count();
            // Numbers right-aligned, text left-aligned.
            if i == 2 || i == 4 {
                let _ = write!(out, "{}{}", " ".repeat(pad), cell);
            } else {
                let _ = write!(out, "{}{}", cell, " ".repeat(pad));
            }
            out.push_str(if i + 1 < cells.len() { " | " } else { "\n" });
        }
    };
    line(&mut out, &header.map(String::from));
    let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
    line(&mut out, &rule);
    for r in &rows {
        line(&mut out, r);
    }
    out
}

/// The same table in Markdown, for BENCHMARKS.md.
pub(crate) fn markdown(metrics: &[Metric]) -> String {
    let mut out = String::from(
        "| row | measure | value | baseline | ratio | target | verdict |\n|---|---|---:|---|---:|---|---|\n",
    );
    for m in metrics {
        let [row, measure, value, baseline, ratio, target, verdict] = cells(m);
        let _ = writeln!(
            out,
            "| {row} | {measure} | {value} | {baseline} | {ratio} | {target} | {verdict} |"
        );
    }
    out
}

fn num(v: f64) -> serde_json::Value {
    // JSON has no infinity: null, with the verdict telling the story.
    serde_json::Number::from_f64(v)
        .map(serde_json::Value::Number)
        .unwrap_or(serde_json::Value::Null)
}

/// The metrics as JSON rows: median value, baseline, ratio, target, pass, and
/// the per-repetition figures.
pub(crate) fn json_rows(metrics: &[Metric]) -> Vec<serde_json::Value> {
    metrics
        .iter()
        .map(|m| {
            let (target_kind, target_value) = match m.target {
                Target::RatioAtMost(x) => ("ratio_at_most", num(x)),
                Target::RatioAtLeast(x) => ("ratio_at_least", num(x)),
                Target::AtMost(x) => ("at_most", num(x)),
                Target::Info => ("info", serde_json::Value::Null),
            };
            serde_json::json!({
                "row": m.row,
                "measure": m.measure,
                "unit": m.unit.name(),
                "value": m.value().map(num),
                "baseline": m.baseline().map(num),
                "baseline_label": m.baseline_label,
                "ratio": m.ratio().map(num),
                "target": { "kind": target_kind, "value": target_value,
                            "text": m.target.describe(m.unit) },
                "pass": m.pass(),
                "not_measured": m.not_measured,
                "values": m.values.iter().map(|v| num(*v)).collect::<Vec<_>>(),
                "baselines": m.baselines.iter().map(|v| num(*v)).collect::<Vec<_>>(),
                "notes": m.notes,
            })
        })
        .collect()
}

/// Facts about the machine, for the record.
pub(crate) fn machine() -> BTreeMap<&'static str, serde_json::Value> {
    let mut m = BTreeMap::new();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    m.insert("cores", serde_json::json!(cores));
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_default();
    m.insert("cpu", serde_json::json!(cpu));
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    m.insert("kernel", serde_json::json!(kernel));
    m
}

/// Today's date (UTC) as `YYYY-MM-DD`, and the time as `HH:MM:SSZ`.
pub(crate) fn utc_now() -> (String, String) {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (
        format!("{y:04}-{m:02}-{d:02}"),
        format!(
            "{:02}:{:02}:{:02}Z",
            rem / 3600,
            (rem % 3600) / 60,
            rem % 60
        ),
    )
}

/// The 1-minute load average (/proc/loadavg): how busy the shared machine was.
pub(crate) fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Resident set size of this process, in KiB (`VmRSS` of /proc/self/status).
pub(crate) fn rss_kib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// CPU time used by this process so far (user + system), in seconds, from
/// /proc/self/stat (USER_HZ is 100 on Linux).
pub(crate) fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
