//! The hot-key rows' wait times drawn as an SVG chart (plotters, SVG backend
//! only): one panel per row, each side's waits as a cumulative distribution
//! on a logarithmic time axis, with the row's target as a dashed line.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use super::report::{Unit, percentile};

/// One side's waits.
pub(crate) struct Series {
    pub(crate) label: String,
    pub(crate) waits_us: Vec<f64>,
}

/// One row's panel.
pub(crate) struct Panel {
    pub(crate) title: String,
    pub(crate) series: Vec<Series>,
    /// A dashed vertical line: its label and where, in ms.
    pub(crate) target: Option<(String, f64)>,
}

/// Library, peer, raw: the same colour for a side in every panel.
const COLORS: [RGBColor; 3] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
];

/// Points of a cumulative distribution, at most this many per side.
const POINTS: usize = 400;

/// Draws `panels` (those with any samples) one under the other into `path`.
/// Returns how many were drawn.
pub(crate) fn write(path: &Path, panels: &[Panel]) -> Result<usize, String> {
    let panels: Vec<&Panel> = panels
        .iter()
        .filter(|p| p.series.iter().any(|s| !s.waits_us.is_empty()))
        .collect();
    if panels.is_empty() {
        return Ok(0);
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {dir:?}: {e}"))?;
    }
    let height = 420 * panels.len() as u32;
    let root = SVGBackend::new(path, (960, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    for (area, panel) in root.split_evenly((panels.len(), 1)).iter().zip(&panels) {
        draw(area, panel).map_err(|e| format!("chart: {e}"))?;
    }
    root.present()
        .map_err(|e| format!("cannot write {path:?}: {e}"))?;
    Ok(panels.len())
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
type DrawResult<T> = Result<T, DrawingAreaErrorKind<std::io::Error>>;

fn draw(area: &Area<'_>, panel: &Panel) -> DrawResult<()> {
    let ms = panel
        .series
        .iter()
        .flat_map(|s| &s.waits_us)
        .map(|us| us / 1e3)
        .chain(panel.target.iter().map(|t| t.1));
    let (lo, hi) = ms.fold((f64::INFINITY, 0.0f64), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    // Whole decades, from 10 us at most: the axis labels fall on 1, 10, 100.
    let decade = |v: f64, round: fn(f64) -> f64| 10f64.powf(round(v.log10()));
    let lo = decade(lo.clamp(0.001, 0.01), f64::floor);
    let hi = decade(hi.max(lo * 10.0), f64::ceil);
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, ("sans-serif", 18))
        .margin(12)
        .margin_right(60)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d((lo..hi).log_scale(), 0.0..100.0)?;
    chart
        .configure_mesh()
        .x_desc("wait from acquire() to holding, ms (log scale)")
        .y_desc("% of acquisitions waiting at most x")
        .x_label_formatter(&|v| format!("{} ms", (v * 1e3).round() / 1e3))
        .draw()?;
    for (series, color) in panel.series.iter().zip(COLORS) {
        if series.waits_us.is_empty() {
            continue;
        }
        let style = color.stroke_width(2);
        chart
            .draw_series(LineSeries::new(cdf(&series.waits_us, lo), style))?
            .label(format!(
                "{} (n = {}, p50 {}, p99 {})",
                series.label,
                series.waits_us.len(),
                format_ms(percentile_ms(&series.waits_us, 50.0)),
                format_ms(percentile_ms(&series.waits_us, 99.0)),
            ))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
    }
    if let Some((label, at)) = &panel.target {
        let style = ShapeStyle::from(&BLACK).stroke_width(1);
        chart
            .draw_series(DashedLineSeries::new(
                [(*at, 0.0), (*at, 100.0)],
                6,
                4,
                style,
            ))?
            .label(label.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
}

/// The cumulative distribution of `waits_us` as (ms, % at most), at most
/// `POINTS` points, none left of `lo`.
fn cdf(waits_us: &[f64], lo: f64) -> Vec<(f64, f64)> {
    let mut v = waits_us.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let steps = POINTS.min(n);
    (0..=steps)
        .map(|k| {
            let i = (k * (n - 1)) / steps.max(1);
            ((v[i] / 1e3).max(lo), (i + 1) as f64 * 100.0 / n as f64)
        })
        .collect()
}

fn percentile_ms(waits_us: &[f64], p: f64) -> f64 {
    percentile(waits_us, p) / 1e3
}

fn format_ms(ms: f64) -> String {
    Unit::Millis.format(ms)
}
