//! The results: one [`ScenarioResult`] per row, written as `results.json`, `results.md` and
//! one SVG bar chart per row.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;
use serde_json::{Map, Value};

/// The goal of a reference row (a limit or a cost to compare against, not a target).
pub(crate) const NO_GOAL: &str = "none (reference)";

/// One row of the results: the gateway's figure, the baseline's, their ratio, the goal and
/// whether it was met, plus any detail fields (percentiles, counts, settings).
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioResult {
    /// Row name, e.g. `drain-1p-1KiB` or `scale-rss`.
    pub name: String,
    /// The `--scenario` that produced it.
    pub scenario: String,
    /// Unit of `gateway` and `baseline`.
    pub unit: String,
    /// The gateway's figure.
    pub gateway: f64,
    /// The baseline's figure (measured in the same run, or a documented constant).
    pub baseline: f64,
    /// What the baseline is.
    pub baseline_kind: String,
    /// `gateway / baseline` (or as `ratio_definition` says); `null` where undefined.
    pub ratio: Option<f64>,
    /// How `ratio` is computed.
    pub ratio_definition: String,
    /// The goal, as text (e.g. `">= 0.9"`).
    pub goal: String,
    /// Whether the goal was met (true for a row with [`NO_GOAL`]).
    pub met: bool,
    /// A one-line summary for the Markdown table.
    pub summary: String,
    /// Extra detail fields (flattened into the JSON object).
    #[serde(flatten)]
    pub details: Map<String, Value>,
    /// The chart drawn for this row.
    #[serde(skip)]
    pub chart: Chart,
}

/// A grouped bar chart: groups (e.g. rounds) of bars (e.g. arms), plus horizontal reference
/// lines (goals, limits).
#[derive(Debug, Clone, Default)]
pub struct Chart {
    /// Title on top.
    pub title: String,
    /// Unit on the y axis.
    pub unit: String,
    /// `(group label, [(series, value)])`.
    pub groups: Vec<(String, Vec<(String, f64)>)>,
    /// `(label, value)` dashed horizontal lines.
    pub lines: Vec<(String, f64)>,
}

/// 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    let power = 10_f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * power)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * power)
}

const COLORS: [&str; 6] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#17becf",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A short number: 3 significant digits, thousands kept whole.
pub(crate) fn fmt_num(v: f64) -> String {
    if !v.is_finite() {
        return "n/a".to_string();
    }
    let a = v.abs();
    if a >= 1000.0 {
        format!("{v:.0}")
    } else if a >= 100.0 {
        format!("{v:.1}")
    } else if a >= 10.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

impl Chart {
    /// The chart as a standalone SVG document.
    pub fn to_svg(&self) -> String {
        let (w, h) = (720.0_f64, 400.0_f64);
        let (left, right, top, bottom) = (80.0, 20.0, 50.0, 80.0);
        let plot_w = w - left - right;
        let plot_h = h - top - bottom;
        let mut max = self
            .groups
            .iter()
            .flat_map(|(_, bars)| bars.iter().map(|(_, v)| *v))
            .chain(self.lines.iter().map(|(_, v)| *v))
            .filter(|v| v.is_finite())
            .fold(0.0_f64, f64::max);
        if max <= 0.0 {
            max = 1.0;
        }
        let step = nice_step(max * 1.1 / 5.0);
        let max = step * (max * 1.1 / step).ceil();
        let ticks = (max / step).round() as i32;
        let y = |v: f64| top + plot_h - (v.max(0.0) / max) * plot_h;
        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="25" text-anchor="middle" font-size="15" font-weight="bold">{}</text>"#,
            w / 2.0,
            esc(&self.title)
        );
        for i in 0..=ticks {
            let v = step * f64::from(i);
            let yy = y(v);
            let _ = writeln!(
                s,
                r##"<line x1="{left}" y1="{yy:.1}" x2="{}" y2="{yy:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
                w - right,
                left - 6.0,
                yy + 4.0,
                fmt_num(v)
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="18" y="{}" text-anchor="middle" transform="rotate(-90 18 {})">{}</text>"#,
            top + plot_h / 2.0,
            top + plot_h / 2.0,
            esc(&self.unit)
        );
        let mut series: Vec<String> = Vec::new();
        for (_, bars) in &self.groups {
            for (name, _) in bars {
                if !series.contains(name) {
                    series.push(name.clone());
                }
            }
        }
        let groups = self.groups.len().max(1) as f64;
        let group_w = plot_w / groups;
        for (gi, (label, bars)) in self.groups.iter().enumerate() {
            let x0 = left + group_w * gi as f64;
            let n = bars.len().max(1) as f64;
            let bar_w = (group_w * 0.8 / n).min(60.0);
            let start = x0 + (group_w - bar_w * n) / 2.0;
            for (bi, (name, v)) in bars.iter().enumerate() {
                let color =
                    COLORS[series.iter().position(|x| x == name).unwrap_or(0) % COLORS.len()];
                let x = start + bar_w * bi as f64;
                let v = if v.is_finite() { *v } else { 0.0 };
                let yy = y(v);
                let _ = writeln!(
                    s,
                    r#"<rect x="{x:.1}" y="{yy:.1}" width="{:.1}" height="{:.1}" fill="{color}"><title>{}: {}</title></rect>"#,
                    (bar_w - 2.0).max(1.0),
                    (top + plot_h - yy).max(0.0),
                    esc(name),
                    fmt_num(v)
                );
                if bars.len() * self.groups.len() <= 24 {
                    let _ = writeln!(
                        s,
                        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="10">{}</text>"#,
                        x + bar_w / 2.0,
                        yy - 3.0,
                        fmt_num(v)
                    );
                }
            }
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                x0 + group_w / 2.0,
                top + plot_h + 18.0,
                esc(label)
            );
        }
        for (label, v) in &self.lines {
            if !v.is_finite() {
                continue;
            }
            let yy = y(*v);
            let _ = writeln!(
                s,
                r##"<line x1="{left}" y1="{yy:.1}" x2="{}" y2="{yy:.1}" stroke="#d62728" stroke-dasharray="6,4" stroke-width="1.5"/><text x="{}" y="{:.1}" text-anchor="end" fill="#d62728">{}</text>"##,
                w - right,
                w - right - 4.0,
                yy - 4.0,
                esc(label)
            );
        }
        let _ = writeln!(
            s,
            r##"<line x1="{left}" y1="{}" x2="{}" y2="{}" stroke="#333"/>"##,
            top + plot_h,
            w - right,
            top + plot_h
        );
        for (i, name) in series.iter().enumerate() {
            let x = left + 10.0 + 200.0 * (i % 3) as f64;
            let yy = h - 35.0 + 16.0 * (i / 3) as f64;
            let _ = writeln!(
                s,
                r#"<rect x="{x}" y="{}" width="12" height="12" fill="{}"/><text x="{}" y="{yy}">{}</text>"#,
                yy - 10.0,
                COLORS[i % COLORS.len()],
                x + 16.0,
                esc(name)
            );
        }
        s.push_str("</svg>\n");
        s
    }
}

/// The results as a Markdown table, with a link to each chart.
pub(crate) fn markdown(results: &[ScenarioResult], chart_prefix: &str) -> String {
    let mut s = String::new();
    s.push_str("| scenario | unit | gateway | baseline | ratio | goal | met | detail |\n");
    s.push_str("| --- | --- | ---: | ---: | ---: | --- | :---: | --- |\n");
    for r in results {
        let _ = writeln!(
            s,
            "| [{}]({chart_prefix}{}.svg) | {} | {} | {} | {} | {} | {} | {} |",
            r.name,
            r.name,
            r.unit,
            fmt_num(r.gateway),
            fmt_num(r.baseline),
            r.ratio.map_or("n/a".to_string(), |x| format!("{x:.3}")),
            r.goal.replace('|', "\\|"),
            if r.goal == NO_GOAL {
                "-"
            } else if r.met {
                "yes"
            } else {
                "**no**"
            },
            r.summary.replace('|', "\\|"),
        );
    }
    s
}

/// Writes `results.json`, `results.md` and `<name>.svg` for every row into `dir`.
pub(crate) fn write_all(
    dir: &Path,
    results: &[ScenarioResult],
    header: &Map<String, Value>,
) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let json = serde_json::to_string_pretty(results)?;
    std::fs::write(dir.join("results.json"), json + "\n")?;
    let mut md = String::from("# kafka-lease benchmark results\n\n");
    for (k, v) in header {
        let v = match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let _ = writeln!(md, "- {k}: {v}");
    }
    md.push('\n');
    md.push_str(&markdown(results, ""));
    std::fs::write(dir.join("results.md"), md)?;
    for r in results {
        std::fs::write(dir.join(format!("{}.svg", r.name)), r.chart.to_svg())?;
    }
    std::fs::write(
        dir.join("run.json"),
        serde_json::to_string_pretty(header)? + "\n",
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn svg_is_a_document_with_every_bar() {
        let chart = Chart {
            title: "t <1>".into(),
            unit: "records/s".into(),
            groups: vec![
                (
                    "round 1".into(),
                    vec![("gateway".into(), 10.0), ("direct".into(), 12.0)],
                ),
                (
                    "round 2".into(),
                    vec![("gateway".into(), 11.0), ("direct".into(), f64::NAN)],
                ),
            ],
            lines: vec![("goal".into(), 9.0)],
        };
        let svg = chart.to_svg();
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<rect x=").count(), 4 + 2);
        assert!(svg.contains("t &lt;1&gt;"));
    }

    #[test]
    fn steps_are_round() {
        assert_eq!(nice_step(0.3), 0.5);
        assert_eq!(nice_step(37.0), 50.0);
        assert_eq!(nice_step(120_000.0), 200_000.0);
        assert_eq!(nice_step(1.0), 1.0);
    }

    #[test]
    fn numbers_are_short() {
        assert_eq!(fmt_num(123456.7), "123457");
        assert_eq!(fmt_num(12.345), "12.35");
        assert_eq!(fmt_num(0.5), "0.500");
        assert_eq!(fmt_num(f64::NAN), "n/a");
    }
}
