//! The `--svg` memory timeline: one stacked area per tag (MiB over seconds), drawn as steps
//! because bytes change at allocations, not gradually between samples; dashed lines where
//! phases begin; a legend with each tag's peak. Hand-written SVG, no dependencies.

use crate::timeline::Timeline;
use decode::memory::{human_bytes, MemoryTag};
use std::fmt::Write;

const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 480.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 210.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;
const MIB: f64 = (1u64 << 20) as f64;

/// One fixed color per tag (indexed like [`MemoryTag::ALL`]), so a tag keeps its color
/// across plots.
const COLORS: [&str; MemoryTag::COUNT] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#76b7b2", "#9c755f",
];

/// Escapes text for an XML text node or attribute value.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // Control characters other than tab and line breaks are not allowed in XML 1.0.
            c if (c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r') => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// A tick step of 1, 2 or 5 times a power of ten that splits `0..max` into at most about
/// `target` intervals.
pub fn nice_step(max: f64, target: usize) -> f64 {
    if !(max.is_finite() && max > 0.0) {
        return 1.0;
    }
    let raw = max / target.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    // A hair of tolerance so 0.3 / 6 = 0.04999... still takes 0.05.
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * mag)
        .find(|&s| s >= raw * (1.0 - 1e-9))
        .unwrap_or(10.0 * mag)
}

/// A tick label without trailing noise (`0.25`, `2`, `1500`).
fn tick_label(v: f64, step: f64) -> String {
    let decimals = if step >= 1.0 {
        0
    } else {
        (-step.log10() - 1e-9).ceil() as usize
    };
    format!("{v:.decimals$}")
}

/// Renders the timeline as a complete SVG document.
pub fn render(timeline: &Timeline, title: &str) -> String {
    let pw = WIDTH - LEFT - RIGHT;
    let ph = HEIGHT - TOP - BOTTOM;
    let t_end = timeline.end().max(1e-3);
    let x_step = nice_step(t_end, 8);
    let t_max = (t_end / x_step).ceil() * x_step;
    let mib_top = (timeline.max_total() as f64 / MIB).max(1e-3);
    let y_step = nice_step(mib_top, 6);
    let mib_max = (mib_top / y_step).ceil() * y_step;
    let x = |t: f64| LEFT + pw * (t / t_max);
    let y = |mib: f64| TOP + ph * (1.0 - mib / mib_max);

    let mut s = String::new();
    // `write!` into a String cannot fail; the results are ignored for that reason.
    let _ = writeln!(
        s,
        r#"<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">
<title>{}</title>
<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="white"/>
<text x="{LEFT}" y="24" font-size="15">{}</text>"#,
        escape(title),
        escape(title)
    );

    // Grid and axes.
    let _ = writeln!(s, r##"<g class="axes" stroke="#ccc" stroke-width="1">"##);
    let mut v = 0.0;
    while v <= mib_max + y_step * 1e-6 {
        let _ = writeln!(
            s,
            r#"<line x1="{LEFT:.1}" y1="{yy:.1}" x2="{x2:.1}" y2="{yy:.1}"/>"#,
            yy = y(v),
            x2 = LEFT + pw
        );
        v += y_step;
    }
    let _ = writeln!(s, "</g>");
    let _ = writeln!(s, r##"<g class="ticks" fill="#333">"##);
    let mut v = 0.0;
    while v <= mib_max + y_step * 1e-6 {
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            LEFT - 6.0,
            y(v) + 4.0,
            tick_label(v, y_step)
        );
        v += y_step;
    }
    let mut t = 0.0;
    while t <= t_max + x_step * 1e-6 {
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            x(t),
            TOP + ph + 18.0,
            tick_label(t, x_step)
        );
        t += x_step;
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">time (s)</text>"#,
        LEFT + pw / 2.0,
        HEIGHT - 8.0
    );
    let _ = writeln!(
        s,
        r#"<text x="16" y="{:.1}" text-anchor="middle" transform="rotate(-90 16 {:.1})">MiB</text>"#,
        TOP + ph / 2.0,
        TOP + ph / 2.0
    );
    let _ = writeln!(s, "</g>");

    // Stacked step areas, bottom tag first.
    let tags = timeline.tags_used();
    let samples = &timeline.samples;
    let mut lower = vec![0.0f64; samples.len()];
    let _ = writeln!(s, r#"<g class="areas" stroke="none" fill-opacity="0.85">"#);
    for &tag in &tags {
        let upper: Vec<f64> = samples
            .iter()
            .zip(&lower)
            .map(|(smp, lo)| lo + smp.bytes[tag.index()] as f64 / MIB)
            .collect();
        let mut d = String::new();
        // Along the top left to right, holding each value until the next sample...
        for (i, smp) in samples.iter().enumerate() {
            if i == 0 {
                let _ = write!(d, "M{:.2},{:.2}", x(smp.t), y(upper[0]));
            } else {
                let _ = write!(
                    d,
                    " L{:.2},{:.2} L{:.2},{:.2}",
                    x(smp.t),
                    y(upper[i - 1]),
                    x(smp.t),
                    y(upper[i])
                );
            }
        }
        // ...and back along the bottom right to left.
        for i in (0..samples.len()).rev() {
            let _ = write!(d, " L{:.2},{:.2}", x(samples[i].t), y(lower[i]));
            if i > 0 {
                let _ = write!(d, " L{:.2},{:.2}", x(samples[i].t), y(lower[i - 1]));
            }
        }
        d.push_str(" Z");
        let _ = writeln!(
            s,
            r#"<path class="area" data-tag="{}" fill="{}" d="{d}"/>"#,
            tag.name(),
            COLORS[tag.index()]
        );
        lower = upper;
    }
    let _ = writeln!(s, "</g>");

    // Phase markers.
    let _ = writeln!(s, r##"<g class="phases" fill="#555" font-size="10">"##);
    // Labels run down beside their line; one closer than a label's height to the previous one
    // (a phase that began right after the last) moves over so the two stay readable.
    let mut last_label_x = f64::NEG_INFINITY;
    for m in &timeline.markers {
        let mx = x(m.t);
        let _ = writeln!(
            s,
            r##"<line x1="{mx:.1}" y1="{TOP:.1}" x2="{mx:.1}" y2="{:.1}" stroke="#555" stroke-dasharray="4 3"/>"##,
            TOP + ph
        );
        let lx = (mx + 10.0).max(last_label_x + 12.0);
        last_label_x = lx;
        let _ = writeln!(
            s,
            r#"<text x="{lx:.1}" y="{:.1}" transform="rotate(-90 {lx:.1} {:.1})" text-anchor="end">{}</text>"#,
            TOP + 4.0,
            TOP + 4.0,
            escape(&m.label)
        );
    }
    let _ = writeln!(s, "</g>");

    // Plot frame and legend (top tag of the stack first, as the areas read).
    let _ = writeln!(
        s,
        r##"<rect x="{LEFT:.1}" y="{TOP:.1}" width="{pw:.1}" height="{ph:.1}" fill="none" stroke="#333"/>"##
    );
    let _ = writeln!(s, r#"<g class="legend">"#);
    let lx = LEFT + pw + 16.0;
    for (row, &tag) in tags.iter().rev().enumerate() {
        let ly = TOP + 8.0 + 22.0 * row as f64;
        let peak = samples
            .iter()
            .map(|smp| smp.bytes[tag.index()])
            .max()
            .unwrap_or(0);
        let _ = writeln!(
            s,
            r#"<rect x="{lx:.1}" y="{ly:.1}" width="14" height="14" fill="{}"/>"#,
            COLORS[tag.index()]
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}">{} (peak {})</text>"#,
            lx + 20.0,
            ly + 11.0,
            tag.name(),
            escape(&human_bytes(peak))
        );
    }
    if tags.is_empty() {
        let _ = writeln!(
            s,
            r#"<text x="{lx:.1}" y="{:.1}">no bytes recorded</text>"#,
            TOP + 19.0
        );
    }
    let _ = writeln!(s, "</g>");
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal XML check: every tag closes in order, one root `<svg>`, no stray `<` or `&`
    /// in text, attribute values quoted.
    fn well_formed(doc: &str) -> Result<usize, String> {
        let body = doc
            .strip_prefix(r#"<?xml version="1.0" encoding="UTF-8"?>"#)
            .ok_or("no XML declaration")?;
        let mut stack: Vec<String> = Vec::new();
        let mut roots = 0;
        let mut elements = 0;
        let mut rest = body;
        while let Some(open) = rest.find('<') {
            check_text(&rest[..open])?;
            let close = rest[open..].find('>').ok_or("unclosed tag")? + open;
            let inner = &rest[open + 1..close];
            rest = &rest[close + 1..];
            if let Some(name) = inner.strip_prefix('/') {
                let top = stack.pop().ok_or(format!("</{name}> with nothing open"))?;
                if top != name {
                    return Err(format!("</{name}> closes <{top}>"));
                }
                continue;
            }
            elements += 1;
            let self_closing = inner.ends_with('/');
            let inner = inner.trim_end_matches('/');
            let name = inner.split_whitespace().next().ok_or("empty tag")?;
            if inner.contains('<') || inner.matches('"').count() % 2 != 0 {
                return Err(format!("bad attributes in <{inner}>"));
            }
            if stack.is_empty() {
                roots += 1;
            }
            if !self_closing {
                stack.push(name.to_string());
            }
        }
        check_text(rest)?;
        if !stack.is_empty() {
            return Err(format!("unclosed {stack:?}"));
        }
        if roots != 1 {
            return Err(format!("{roots} root elements"));
        }
        Ok(elements)
    }

    fn check_text(text: &str) -> Result<(), String> {
        for (i, _) in text.match_indices('&') {
            let ok = ["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"]
                .iter()
                .any(|e| text[i..].starts_with(e));
            if !ok {
                return Err(format!("bare & in {text:?}"));
            }
        }
        Ok(())
    }

    fn timeline() -> Timeline {
        let mut tl = Timeline::new();
        tl.markers.push(crate::timeline::Marker {
            t: 0.0,
            label: "a&b <model> load".into(),
        });
        let mut b = [0u64; MemoryTag::COUNT];
        tl.push(0.0, b);
        b[MemoryTag::Weights.index()] = 300 << 20;
        b[MemoryTag::KvCache.index()] = 20 << 20;
        b[MemoryTag::Activations.index()] = 5 << 20;
        tl.push(0.8, b);
        tl.markers.push(crate::timeline::Marker {
            t: 0.9,
            label: "decode".into(),
        });
        b[MemoryTag::Workspace.index()] = 1 << 20;
        tl.push(1.7, b);
        tl
    }

    #[test]
    fn renders_well_formed_svg_with_one_area_and_legend_entry_per_tag() {
        let doc = render(&timeline(), "memory of \"tiny\" & co");
        well_formed(&doc).unwrap_or_else(|e| panic!("{e}\n{doc}"));
        assert_eq!(doc.matches(r#"<path class="area""#).count(), 4, "{doc}");
        for tag in ["weights", "kv_cache", "activations", "workspace"] {
            assert!(doc.contains(&format!(r#"data-tag="{tag}""#)), "{tag}");
            assert!(doc.contains(&format!(">{tag} (peak ")), "{tag}");
        }
        assert!(!doc.contains("data-tag=\"graph\""));
        assert!(doc.contains("a&amp;b &lt;model&gt; load"));
        assert!(doc.contains(">time (s)<") && doc.contains(">MiB<"));
        // Two dashed phase lines, no NaN coordinates.
        assert_eq!(doc.matches("stroke-dasharray").count(), 2);
        assert!(!doc.contains("NaN") && !doc.contains("inf"));
    }

    #[test]
    fn an_empty_timeline_is_still_a_valid_document() {
        let doc = render(&Timeline::new(), "empty");
        well_formed(&doc).unwrap_or_else(|e| panic!("{e}\n{doc}"));
        assert_eq!(doc.matches("<path").count(), 0);
        assert!(doc.contains("no bytes recorded"));
    }

    #[test]
    fn the_checker_catches_broken_documents() {
        let decl = r#"<?xml version="1.0" encoding="UTF-8"?>"#;
        assert!(well_formed(&format!("{decl}<svg><g></svg>")).is_err());
        assert!(well_formed(&format!("{decl}<svg></svg><svg></svg>")).is_err());
        assert!(well_formed(&format!("{decl}<svg>a & b</svg>")).is_err());
        assert_eq!(well_formed(&format!("{decl}<svg><g/></svg>")), Ok(2));
    }

    #[test]
    fn tick_steps_are_one_two_five() {
        assert_eq!(nice_step(10.0, 5), 2.0);
        assert_eq!(nice_step(7.0, 8), 1.0);
        assert!((nice_step(0.3, 6) - 0.05).abs() < 1e-12);
        assert_eq!(nice_step(1300.0, 6), 500.0);
        assert_eq!(nice_step(0.0, 6), 1.0);
        assert_eq!(nice_step(f64::NAN, 6), 1.0);
        assert_eq!(tick_label(0.25, 0.05), "0.25");
        assert_eq!(tick_label(1500.0, 500.0), "1500");
    }
}
