//! The cost curves drawn as one SVG (plotters, SVG backend only): a grid of
//! panels, each a log-log plot of some figures against the curve's size.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;
use serde_json::Value;

use super::get;

/// One line of a panel: its label, the curve it reads, the figure and a
/// scale applied to it.
struct Line {
    label: &'static str,
    curve: &'static str,
    field: &'static str,
    scale: f64,
}

struct Panel {
    title: &'static str,
    x: &'static str,
    y: &'static str,
    lines: Vec<Line>,
}

const fn line(label: &'static str, curve: &'static str, field: &'static str, scale: f64) -> Line {
    Line {
        label,
        curve,
        field,
        scale,
    }
}

fn panels() -> Vec<Panel> {
    vec![
        Panel {
            title: "Held locks: memory",
            x: "locks held on one client",
            y: "MiB",
            lines: vec![
                line(
                    "client RSS (whole process)",
                    "held",
                    "client_rss_kib",
                    1.0 / 1024.0,
                ),
                line(
                    "Redis used_memory growth",
                    "held",
                    "redis_memory_delta_kib",
                    1.0 / 1024.0,
                ),
            ],
        },
        Panel {
            title: "Held locks: renewing them",
            x: "locks held on one client",
            y: "per second / % of one core",
            lines: vec![
                line(
                    "script calls/s seen by Redis",
                    "held",
                    "renew_calls_per_s",
                    1.0,
                ),
                line("client CPU, %", "held", "client_cpu_percent", 1.0),
                line("Redis CPU, %", "held", "redis_cpu_percent", 1.0),
            ],
        },
        Panel {
            title: "Waiters on one key: hand-overs",
            x: "waiters (4 clients)",
            y: "grants per second",
            lines: vec![
                line("all queued on the server", "waiters", "grants_per_s", 1.0),
                line(
                    "local lines (default)",
                    "local-waiters",
                    "grants_per_s",
                    1.0,
                ),
            ],
        },
        Panel {
            title: "Waiters on one key: wake latency p99",
            x: "waiters (4 clients)",
            y: "ms, release to next grant",
            lines: vec![
                line("all queued on the server", "waiters", "wake_p99_us", 1e-3),
                line(
                    "local lines (default)",
                    "local-waiters",
                    "wake_p99_us",
                    1e-3,
                ),
            ],
        },
        Panel {
            title: "Waiters on one key: memory while they wait",
            x: "waiters (4 clients)",
            y: "KiB",
            lines: vec![
                line(
                    "Redis queue + deadlines, all queued",
                    "waiters",
                    "redis_queue_kib",
                    1.0,
                ),
                line(
                    "client RSS growth, all queued",
                    "waiters",
                    "client_rss_delta_kib",
                    1.0,
                ),
                line(
                    "Redis queue + deadlines, local lines",
                    "local-waiters",
                    "redis_queue_kib",
                    1.0,
                ),
                line(
                    "client RSS growth, local lines",
                    "local-waiters",
                    "client_rss_delta_kib",
                    1.0,
                ),
            ],
        },
        Panel {
            title: "Distinct keys used once: what stays",
            x: "distinct keys taken and released",
            y: "keys / KiB",
            lines: vec![
                line("Redis keys (DBSIZE)", "keys", "redis_keys", 1.0),
                line(
                    "Redis used_memory growth, KiB",
                    "keys",
                    "redis_memory_delta_kib",
                    1.0,
                ),
                line(
                    "client RSS growth, KiB",
                    "keys",
                    "client_rss_delta_kib",
                    1.0,
                ),
            ],
        },
    ]
}

const COLORS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
];

/// Draws the panels, two per row, into `path`.
pub(crate) fn write(path: &Path, results: &[(&str, Value)]) -> Result<(), String> {
    let panels = panels();
    let rows = panels.len().div_ceil(2);
    let root = SVGBackend::new(path, (1200, 380 * rows as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    for (area, panel) in root.split_evenly((rows, 2)).iter().zip(&panels) {
        draw(area, panel, results).map_err(|e| format!("chart: {e}"))?;
    }
    root.present()
        .map_err(|e| format!("cannot write {path:?}: {e}"))
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
type DrawResult<T> = Result<T, DrawingAreaErrorKind<std::io::Error>>;

/// The points of `line`: (n, figure), those a log axis can show.
fn points(line: &Line, results: &[(&str, Value)]) -> Vec<(f64, f64)> {
    results
        .iter()
        .filter(|(curve, _)| *curve == line.curve)
        .map(|(_, v)| (get(v, "n"), get(v, line.field) * line.scale))
        .filter(|(x, y)| *x > 0.0 && *y > 0.0 && y.is_finite())
        .collect()
}

/// The whole decades around `lo..hi`.
fn decades(lo: f64, hi: f64) -> (f64, f64) {
    let lo = 10f64.powf(lo.log10().floor());
    let hi = 10f64.powf(hi.log10().ceil());
    (lo, if hi > lo { hi } else { lo * 10.0 })
}

fn draw(area: &Area<'_>, panel: &Panel, results: &[(&str, Value)]) -> DrawResult<()> {
    let all: Vec<Vec<(f64, f64)>> = panel.lines.iter().map(|l| points(l, results)).collect();
    let flat = all.iter().flatten();
    let (x_lo, x_hi, y_lo, y_hi) = flat.fold(
        (f64::INFINITY, 0.0f64, f64::INFINITY, 0.0f64),
        |(a, b, c, d), (x, y)| (a.min(*x), b.max(*x), c.min(*y), d.max(*y)),
    );
    if !x_lo.is_finite() || !y_lo.is_finite() {
        return Ok(());
    }
    let (x_lo, x_hi) = decades(x_lo, x_hi);
    let (y_lo, y_hi) = decades(y_lo, y_hi);
    let mut chart = ChartBuilder::on(area)
        .caption(panel.title, ("sans-serif", 17))
        .margin(10)
        .margin_right(24)
        .x_label_area_size(38)
        .y_label_area_size(56)
        .build_cartesian_2d((x_lo..x_hi).log_scale(), (y_lo..y_hi).log_scale())?;
    chart
        .configure_mesh()
        .x_desc(panel.x)
        .y_desc(panel.y)
        .x_label_formatter(&|v| compact(*v))
        .y_label_formatter(&|v| compact(*v))
        .draw()?;
    for ((line, points), color) in panel.lines.iter().zip(&all).zip(COLORS) {
        let style = color.stroke_width(2);
        chart
            .draw_series(LineSeries::new(points.iter().copied(), style))?
            .label(line.label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        chart.draw_series(points.iter().map(|p| Circle::new(*p, 3, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
}

/// 1000 as "1k", 0.5 as "0.5".
fn compact(v: f64) -> String {
    let r = |v: f64| (v * 100.0).round() / 100.0;
    match v {
        v if v >= 1e6 => format!("{}M", r(v / 1e6)),
        v if v >= 1e3 => format!("{}k", r(v / 1e3)),
        v => format!("{}", r(v)),
    }
}
