//! A line chart of named series of (x, y) points as hand-written SVG: linear x, logarithmic y
//! (decode speeds under a budget span more than a decade, and a ratio reads the same at
//! either end), markers at every point, a legend. Used for the offload sweep's tok/s against
//! GPU MiB.

use crate::svg::escape;
use std::fmt::Write;

const WIDTH: f64 = 900.0;
const HEIGHT: f64 = 520.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 250.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 55.0;

/// One line of the chart.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub name: String,
    /// Stroke color, e.g. `#4e79a7`.
    pub color: String,
    /// Dashed (for reference series measured elsewhere).
    pub dashed: bool,
    /// Points, drawn in x order.
    pub points: Vec<(f64, f64)>,
}

/// Axis labels and title.
#[derive(Clone, Debug, PartialEq)]
pub struct Labels {
    pub title: String,
    pub x: String,
    pub y: String,
}

/// Powers of ten times 1, 2 and 5 between `lo` and `hi` (the log axis's ticks).
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let mut out = Vec::new();
    let mut decade = 10f64.powf(lo.log10().floor());
    while decade <= hi {
        for m in [1.0, 2.0, 5.0] {
            let v = decade * m;
            if v >= lo && v <= hi {
                out.push(v);
            }
        }
        decade *= 10.0;
    }
    out
}

/// A round step giving about `n` ticks over `span`.
fn linear_step(span: f64, n: f64) -> f64 {
    let raw = (span / n).max(f64::MIN_POSITIVE);
    let p = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * p)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * p)
}

/// The chart. Points with a y of zero or less (nothing measured) are left out, since a log
/// axis cannot place them.
pub fn render(series: &[Series], labels: &Labels) -> String {
    let pts = || {
        series
            .iter()
            .flat_map(|s| s.points.iter().copied())
            .filter(|&(x, y)| x.is_finite() && y.is_finite() && y > 0.0)
    };
    let x_max = pts().map(|p| p.0).fold(0.0, f64::max).max(1.0);
    let y_lo = pts().map(|p| p.1).fold(f64::INFINITY, f64::min);
    let y_hi = pts().map(|p| p.1).fold(0.0, f64::max);
    let (y_lo, y_hi) = if y_lo.is_finite() && y_hi > 0.0 {
        (
            10f64.powf(y_lo.log10().floor()),
            10f64.powf(y_hi.log10().ceil()),
        )
    } else {
        (1.0, 10.0)
    };
    let y_hi = if y_hi <= y_lo { y_lo * 10.0 } else { y_hi };
    let x_step = linear_step(x_max, 8.0);
    let x_max = (x_max / x_step).ceil() * x_step;
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let sx = |x: f64| LEFT + x / x_max * plot_w;
    let sy = |y: f64| TOP + plot_h - (y.log10() - y_lo.log10()) / (y_hi / y_lo).log10() * plot_h;

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" font-size="15" text-anchor="middle">{}</text>"#,
        LEFT + plot_w / 2.0,
        escape(&labels.title)
    );
    let mut x = 0.0;
    while x <= x_max + x_step / 2.0 {
        let px = sx(x);
        let _ = writeln!(
            s,
            r##"<line x1="{px:.1}" y1="{TOP}" x2="{px:.1}" y2="{:.1}" stroke="#e5e5e5"/><text x="{px:.1}" y="{:.1}" text-anchor="middle">{x}</text>"##,
            TOP + plot_h,
            TOP + plot_h + 16.0
        );
        x += x_step;
    }
    for y in log_ticks(y_lo, y_hi) {
        let py = sy(y);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}" stroke="#e5e5e5"/><text x="{:.1}" y="{:.1}" text-anchor="end">{y}</text>"##,
            LEFT + plot_w,
            LEFT - 6.0,
            py + 4.0
        );
    }
    let _ = writeln!(
        s,
        r#"<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="black"/>"#
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        LEFT + plot_w / 2.0,
        HEIGHT - 12.0,
        escape(&labels.x)
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate(18,{:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
        TOP + plot_h / 2.0,
        escape(&labels.y)
    );
    for (i, ser) in series.iter().enumerate() {
        let mut points: Vec<(f64, f64)> = ser
            .points
            .iter()
            .copied()
            .filter(|&(x, y)| x.is_finite() && y.is_finite() && y > 0.0)
            .collect();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        let path: Vec<String> = points
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
            .collect();
        let dash = if ser.dashed {
            r#" stroke-dasharray="6,4""#
        } else {
            ""
        };
        let color = escape(&ser.color);
        let _ = writeln!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"{dash}/>"#,
            path.join(" ")
        );
        for &(x, y) in &points {
            let _ = writeln!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{color}"/>"#,
                sx(x),
                sy(y)
            );
        }
        let ly = TOP + 10.0 + 20.0 * i as f64;
        let lx = LEFT + plot_w + 15.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" y1="{ly}" x2="{:.1}" y2="{ly}" stroke="{color}" stroke-width="2"{dash}/><text x="{:.1}" y="{:.1}">{}</text>"#,
            lx + 24.0,
            lx + 30.0,
            ly + 4.0,
            escape(&ser.name)
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_ticks_are_one_two_five_per_decade() {
        assert_eq!(
            log_ticks(10.0, 1000.0),
            vec![10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0]
        );
        assert_eq!(linear_step(18231.0, 8.0), 5000.0);
        assert_eq!(linear_step(5113.0, 8.0), 1000.0);
    }

    #[test]
    fn every_point_is_drawn_and_names_are_escaped() {
        let series = [
            Series {
                name: "ours <moe>".into(),
                color: "#4e79a7".into(),
                dashed: false,
                points: vec![(1589.0, 41.7), (18231.0, 285.0), (9959.0, 70.7)],
            },
            Series {
                name: "llama.cpp".into(),
                color: "#e15759".into(),
                dashed: true,
                points: vec![(1000.0, 14.4), (5113.0, 0.0)],
            },
        ];
        let svg = render(
            &series,
            &Labels {
                title: "t".into(),
                x: "GPU MiB".into(),
                y: "tok/s".into(),
            },
        );
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        // Three markers for the first series, one for the second (its zero is left out).
        assert_eq!(svg.matches("<circle").count(), 4, "{svg}");
        assert!(svg.contains("ours &lt;moe&gt;"));
        assert!(svg.contains("stroke-dasharray"));
        // Drawn in x order: the 9959 point comes before the 18231 one.
        let line = svg.lines().find(|l| l.starts_with("<polyline")).unwrap();
        let xs: Vec<f64> = line
            .split('"')
            .nth(1)
            .unwrap()
            .split(' ')
            .map(|p| p.split(',').next().unwrap().parse().unwrap())
            .collect();
        assert!(xs.windows(2).all(|w| w[0] < w[1]), "{line}");
    }
}
