//! The report as Markdown.
use std::fmt;
use std::fmt::Write as _;

use super::{ms, Report};

/// A short human summary of a report, in Markdown.
pub fn render_markdown(report: &Report) -> String {
    let mut out = String::new();
    // Writing to a String does not fail.
    let _ = render(report, &mut out);
    out
}

pub(super) fn opt_ms(t: Option<f64>) -> String {
    t.map_or_else(|| "-".to_string(), ms)
}

pub(super) fn render(report: &Report, out: &mut String) -> fmt::Result {
    let n = report.anomaly_count();
    if report.valid() {
        writeln!(out, "# Verdict: valid")?;
    } else {
        let noun = if n == 1 { "anomaly" } else { "anomalies" };
        let kinds: Vec<String> = report
            .anomaly_totals
            .iter()
            .map(|t| format!("{} {}", t.count, t.kind))
            .collect();
        writeln!(out, "# Verdict: INVALID: {n} {noun} ({})", kinds.join(", "))?;
    }
    writeln!(out, "\n{} events.\n", report.events)?;

    writeln!(out, "## Calls\n")?;
    writeln!(out, "| call | ok | failed | unknown |")?;
    writeln!(out, "|---|---:|---:|---:|")?;
    let c = &report.counts;
    for (name, k) in [
        ("acquire", c.acquire),
        ("commit", c.commit),
        ("seek", c.seek),
        ("release", c.release),
        ("ack", c.ack),
        ("produce", c.produce),
    ] {
        writeln!(out, "| {name} | {} | {} | {} |", k.ok, k.failed, k.unknown)?;
    }

    writeln!(out, "\n## Faults\n")?;
    if report.fault_kinds.is_empty() {
        writeln!(out, "No faults.")?;
    } else {
        writeln!(
            out,
            "| fault | faults | took effect | failover p50 ms | failover p99 ms | max gap ms | \
             kept | let go | not recovered |"
        )?;
        writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|")?;
        for k in &report.fault_kinds {
            let gap = match (k.max_gap_ms, k.max_gap_partition) {
                (Some(g), Some(p)) => format!("{} (p{p})", ms(g)),
                (g, _) => opt_ms(g),
            };
            writeln!(
                out,
                "| {} | {} | {} | {} | {} | {gap} | {} | {} | {} |",
                k.name,
                k.faults,
                k.took_effect,
                opt_ms(k.failover_p50_ms),
                opt_ms(k.failover_p99_ms),
                k.kept,
                k.let_go,
                k.not_recovered
            )?;
        }
        writeln!(out)?;
        writeln!(
            out,
            "| fault | target | start ms | stop ms | took effect | failover ms (partition) | gap \
             ms (partition) | calls ok / failed / unknown | delivered (again) |"
        )?;
        writeln!(out, "|---|---|---:|---:|---|---|---:|---:|---:|")?;
        for f in &report.faults {
            let failover: Vec<String> = f
                .failover_ms
                .iter()
                .map(|o| match o.ms {
                    Some(t) => format!("{} (p{})", ms(t), o.partition),
                    None if o.kept => format!("kept (p{})", o.partition),
                    None if o.let_go => format!("let go (p{})", o.partition),
                    None => format!("not recovered (p{})", o.partition),
                })
                .collect();
            let gap = match (f.gap_ms, f.gap_partition) {
                (Some(g), Some(p)) => format!("{} (p{p})", ms(g)),
                (g, _) => opt_ms(g),
            };
            writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {gap} | {} / {} / {} | {} ({}) |",
                f.name,
                f.target,
                ms(f.start_ms),
                opt_ms(f.stop_ms),
                if f.took_effect { "yes" } else { "no" },
                if failover.is_empty() {
                    "-".to_string()
                } else {
                    failover.join(", ")
                },
                f.calls.ok,
                f.calls.failed,
                f.calls.unknown,
                f.delivered,
                f.duplicated
            )?;
        }
    }

    let d = &report.delivery;
    writeln!(out, "\n## Delivery\n")?;
    writeln!(
        out,
        "- produced: {} acknowledged, {} unknown",
        d.produced, d.produce_unknown
    )?;
    writeln!(
        out,
        "- delivered: {} records in {} deliveries over {} batches ({} duplicates)",
        d.delivered, d.deliveries, d.batches, d.duplicates
    )?;
    writeln!(out, "- lost: {}", d.lost)?;
    writeln!(out, "- late batches: {}", d.late_batches)?;
    let explaining = report
        .late_commits
        .iter()
        .filter(|c| !c.explains.is_empty())
        .count();
    writeln!(
        out,
        "- late commits (answered past their lease's fence deadline, reported by their \
         gateway): {}, {explaining} of them seen to set the committed offset back",
        report.late_commits.len()
    )?;
    if !d.partitions.is_empty() {
        writeln!(
            out,
            "\n| partition | produced | delivered | deliveries | lost | final committed | high \
             watermark | late batches | max late ms |"
        )?;
        writeln!(out, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|")?;
        let num = |v: Option<i64>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
        for p in &d.partitions {
            writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                p.partition,
                p.produced,
                p.delivered,
                p.deliveries,
                p.lost,
                num(p.final_committed),
                num(p.high_watermark),
                p.late_batches,
                opt_ms(p.max_late_ms)
            )?;
        }
    }

    if !report.late_commits.is_empty() {
        writeln!(out, "\n## Late commits\n")?;
        writeln!(
            out,
            "Each was answered after its lease's fence deadline, so it may have landed after a \
             successor's commits: the limit of the commit gate (docs/ARCHITECTURE.md), which \
             the gateway cannot prevent and reports. The regressions it explains are not \
             counted as anomalies."
        )?;
        for (n, c) in report.late_commits.iter().enumerate() {
            writeln!(
                out,
                "\n### {}. partition {}, token {}, offset {} (reported by {})\n",
                n + 1,
                c.partition,
                c.token,
                c.offset,
                c.gateway
            )?;
            if c.explains.is_empty() {
                writeln!(out, "The observer saw no regression from it.\n")?;
            }
            for e in &c.explains {
                writeln!(out, "- {e}")?;
            }
            writeln!(out, "\n```json")?;
            for e in &c.excerpt {
                let line = serde_json::to_string(e).unwrap_or_else(|e| format!("({e})"));
                writeln!(out, "{line}")?;
            }
            writeln!(out, "```")?;
        }
    }

    if !report.anomalies.is_empty() {
        writeln!(out, "\n## Anomalies")?;
        for (n, a) in report.anomalies.iter().enumerate() {
            let on = a
                .partition
                .map_or_else(String::new, |p| format!(", partition {p}"));
            writeln!(out, "\n### {}. {}{on}\n", n + 1, a.kind)?;
            writeln!(out, "{}\n", a.description)?;
            writeln!(out, "```json")?;
            for e in &a.excerpt {
                let line = serde_json::to_string(e).unwrap_or_else(|e| format!("({e})"));
                writeln!(out, "{line}")?;
            }
            writeln!(out, "```")?;
        }
    }
    Ok(())
}
