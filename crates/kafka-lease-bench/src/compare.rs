//! `kafka-lease-bench compare OLD NEW`: the rows of two runs' `results.json` side by side,
//! flagging every row whose ratio moved the wrong way by more than its noise band, and
//! failing when a row that met its goal in OLD misses it in NEW.
//!
//! Only ratios are compared (each is gateway against a baseline of the same run), so runs of
//! different hosts can be set side by side; each run's machine line (its `run.json`, beside
//! the results) is printed with them.
//!
//! - **The wrong way** is read off the row's goal: `>= x` wants the ratio high, `<= x` low.
//!   A row without a goal (`none (reference)`) or with one bounded on both sides is shown
//!   but never flagged for moving.
//! - **The band** is the row's own noise: the spread between its rounds' ratios (largest
//!   minus smallest, over their median) where its rounds carry a gateway and a baseline
//!   figure of the ratio's kind (records per second, p99 latency, CPU per record), in OLD or
//!   NEW, whichever is wider; and never below [`MIN_BAND`].

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// The narrowest band: a move smaller than this is noise, whatever the rounds say.
pub const MIN_BAND: f64 = 0.10;

/// Pairs of round fields (gateway side, baseline side) whose quotient is a round's ratio, in
/// the order they are tried.
const ROUND_PAIRS: &[(&str, &str)] = &[
    ("gateway_records_per_s", "direct_records_per_s"),
    ("forwarded_records_per_s", "direct_records_per_s"),
    ("subscribe_records_per_s", "direct_records_per_s"),
    ("subscribe_records_per_s", "relay_records_per_s"),
    ("gateway_p99_ms", "raw_p99_ms"),
    ("gateway_p99_ms", "direct_p99_ms"),
    ("queue", "read"),
];

/// Which way a row's ratio should go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Better {
    Higher,
    Lower,
    /// No goal, or a goal bounded on both sides: no way is wrong.
    Neither,
}

impl Better {
    /// Read off a goal as the bench writes it: `>= 0.8`, `<= 1.5`, `gateway p99 <= 50 ms`,
    /// `0.5 <= ratio <= 2 (…)`, `none (reference)`.
    pub fn of_goal(goal: &str) -> Better {
        let (at_least, at_most) = (goal.matches(">=").count(), goal.matches("<=").count());
        match (at_least, at_most) {
            (0, 0) => Better::Neither,
            (_, 0) => Better::Higher,
            (0, 1) => Better::Lower,
            _ => Better::Neither,
        }
    }
}

/// One row as compare reads it.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub name: String,
    pub ratio: f64,
    pub goal: String,
    pub met: Option<bool>,
    /// Each round's ratio, where the rounds carry a pair of [`ROUND_PAIRS`].
    pub round_ratios: Vec<f64>,
}

impl Row {
    fn of(value: &Value) -> Option<Row> {
        let name = value.get("name")?.as_str()?.to_string();
        let ratio = value.get("ratio")?.as_f64()?;
        let goal = value
            .get("goal")
            .and_then(Value::as_str)
            .unwrap_or("none")
            .to_string();
        let met = value.get("met").and_then(Value::as_bool);
        // queue-overhead keeps its rounds as `rounds_cpu_us_per_record`: {queue, read}.
        let rounds = value
            .get("rounds")
            .or_else(|| value.get("rounds_cpu_us_per_record"))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let round_ratios = ROUND_PAIRS
            .iter()
            .map(|(gateway, baseline)| {
                rounds
                    .iter()
                    .filter_map(|round| {
                        let g = round.get(*gateway)?.as_f64()?;
                        let b = round.get(*baseline)?.as_f64()?;
                        (b > 0.0).then_some(g / b)
                    })
                    .collect::<Vec<f64>>()
            })
            .chain(std::iter::once(cpu_per_record_ratios(&rounds)))
            .find(|ratios| ratios.len() >= 2)
            .unwrap_or_default();
        Some(Row {
            name,
            ratio,
            goal,
            met,
            round_ratios,
        })
    }

    /// The spread of its rounds' ratios over their median, if it has two or more.
    fn spread(&self) -> Option<f64> {
        if self.round_ratios.len() < 2 {
            return None;
        }
        let mut sorted = self.round_ratios.clone();
        sorted.sort_by(f64::total_cmp);
        let median = sorted[sorted.len() / 2];
        let (low, high) = (sorted[0], sorted[sorted.len() - 1]);
        (median > 0.0).then(|| (high - low) / median)
    }
}

/// Each round's CPU per record of the gateway over the direct consumer's (the `-cpu`
/// rows' rounds).
fn cpu_per_record_ratios(rounds: &[Value]) -> Vec<f64> {
    rounds
        .iter()
        .filter_map(|round| {
            let field = |key: &str| round.get(key).and_then(Value::as_f64);
            let gateway = field("gateway_cpu_s")? / field("gateway_records")?;
            let direct = field("direct_cpu_s")? / field("direct_records")?;
            (gateway.is_finite() && direct > 0.0).then_some(gateway / direct)
        })
        .collect()
}

/// The rows of a `results.json`, by name.
pub fn rows(text: &str) -> Result<BTreeMap<String, Row>> {
    let value: Value = serde_json::from_str(text).context("not JSON")?;
    let Some(array) = value.as_array() else {
        bail!("not an array of rows (a bench results.json)");
    };
    Ok(array
        .iter()
        .filter_map(Row::of)
        .map(|row| (row.name.clone(), row))
        .collect())
}

/// What became of one row from OLD to NEW.
#[derive(Clone, Debug, PartialEq)]
pub struct Change {
    pub name: String,
    pub old: f64,
    pub new: f64,
    /// NEW against OLD, as a fraction: +0.25 is a quarter higher.
    pub moved: f64,
    pub band: f64,
    /// Where the band came from.
    pub band_from: String,
    pub better: Better,
    /// Moved the wrong way by more than its band.
    pub slipped: bool,
    /// Met its goal in OLD and misses it in NEW.
    pub lost_goal: bool,
}

/// Every row in both runs, compared (rows in one run only are left out).
pub fn compare(old: &BTreeMap<String, Row>, new: &BTreeMap<String, Row>) -> Vec<Change> {
    old.values()
        .filter_map(|o| new.get(&o.name).map(|n| (o, n)))
        .map(|(o, n)| {
            let spread = [o.spread(), n.spread()]
                .into_iter()
                .flatten()
                .reduce(f64::max);
            let (band, band_from) = match spread {
                Some(spread) if spread > MIN_BAND => (spread, "its rounds' spread".to_string()),
                Some(_) => (MIN_BAND, "the minimum (its rounds spread less)".to_string()),
                None => (MIN_BAND, "the minimum (no rounds)".to_string()),
            };
            let better = Better::of_goal(&n.goal);
            let moved = if o.ratio != 0.0 {
                n.ratio / o.ratio - 1.0
            } else {
                0.0
            };
            let slipped = match better {
                Better::Higher => moved < -band,
                Better::Lower => moved > band,
                Better::Neither => false,
            };
            Change {
                name: o.name.clone(),
                old: o.ratio,
                new: n.ratio,
                moved,
                band,
                band_from,
                better,
                slipped,
                lost_goal: o.met == Some(true) && n.met == Some(false),
            }
        })
        .collect()
}

/// The comparison as text: the machines, the rows that slipped or lost their goal, then
/// every row.
pub fn render(changes: &[Change], old_machine: &str, new_machine: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "OLD: {old_machine}\nNEW: {new_machine}");
    let flagged: Vec<&Change> = changes
        .iter()
        .filter(|c| c.slipped || c.lost_goal)
        .collect();
    if flagged.is_empty() {
        let _ = writeln!(out, "no row slipped beyond its band or lost its goal");
    }
    for c in &flagged {
        let what = match (c.slipped, c.lost_goal) {
            (true, true) => "slipped beyond its band and lost its goal",
            (true, false) => "slipped beyond its band",
            _ => "lost its goal, within its band",
        };
        let _ = writeln!(
            out,
            "FLAG {}: {} -> {} ({:+.0}%, band {:.0}% from {}): {what}",
            c.name,
            c.old,
            c.new,
            c.moved * 100.0,
            c.band * 100.0,
            c.band_from
        );
    }
    let _ = writeln!(out, "\nrow  old  new  moved  band  better");
    for c in changes {
        let better = match c.better {
            Better::Higher => "higher",
            Better::Lower => "lower",
            Better::Neither => "-",
        };
        let _ = writeln!(
            out,
            "{}  {}  {}  {:+.0}%  {:.0}%  {better}",
            c.name,
            c.old,
            c.new,
            c.moved * 100.0,
            c.band * 100.0
        );
    }
    out
}

/// The machine line of the run whose results are at `results` (its `run.json` beside it).
fn machine_line(results: &Path) -> String {
    let run = results.with_file_name("run.json");
    let Ok(text) = std::fs::read_to_string(&run) else {
        return format!("{} (no run.json beside it)", results.display());
    };
    let Ok(value) = serde_json::from_str::<Value>(&text) else {
        return format!("{} (run.json unreadable)", results.display());
    };
    let field = |path: &[&str]| {
        path.iter()
            .try_fold(&value, |v, key| v.get(key))
            .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
            .unwrap_or_else(|| "?".into())
    };
    format!(
        "{}: {}, {} cores, {}, {} mode",
        results.display(),
        field(&["gateway_version"]),
        field(&["machine", "cores"]),
        field(&["machine", "cpu"]),
        field(&["mode"])
    )
}

/// Reads both files, prints the comparison, and says whether a row lost its goal.
pub fn run(old: &Path, new: &Path) -> Result<bool> {
    let read = |path: &Path| -> Result<BTreeMap<String, Row>> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        rows(&text).with_context(|| format!("{}", path.display()))
    };
    let changes = compare(&read(old)?, &read(new)?);
    print!(
        "{}",
        render(&changes, &machine_line(old), &machine_line(new))
    );
    Ok(changes.iter().any(|c| c.lost_goal))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row as a test writes it: name, ratio, goal, met, and its rounds' (gateway, direct).
    type TestRow<'a> = (&'a str, f64, &'a str, bool, &'a [(f64, f64)]);

    fn results(rows: &[TestRow<'_>]) -> BTreeMap<String, Row> {
        let array: Vec<Value> = rows
            .iter()
            .map(|(name, ratio, goal, met, rounds)| {
                let rounds: Vec<Value> = rounds
                    .iter()
                    .map(|(g, d)| {
                        serde_json::json!({"gateway_records_per_s": g, "direct_records_per_s": d})
                    })
                    .collect();
                serde_json::json!({
                    "name": name, "ratio": ratio, "goal": goal, "met": met, "rounds": rounds,
                })
            })
            .collect();
        rows_of(&Value::Array(array))
    }

    fn rows_of(value: &Value) -> BTreeMap<String, Row> {
        rows(&value.to_string()).expect("rows")
    }

    #[test]
    fn the_wrong_way_is_read_off_the_goal() {
        assert_eq!(Better::of_goal(">= 0.8"), Better::Higher);
        assert_eq!(
            Better::of_goal(">= 0.8 and slowest/fastest partition >= 0.8"),
            Better::Higher
        );
        assert_eq!(Better::of_goal("<= 2"), Better::Lower);
        assert_eq!(Better::of_goal("gateway p99 <= 50 ms"), Better::Lower);
        assert_eq!(
            Better::of_goal("0.5 <= ratio <= 2 (1000 vs 100 leases)"),
            Better::Neither
        );
        assert_eq!(Better::of_goal("none (reference)"), Better::Neither);
    }

    #[test]
    fn a_move_the_wrong_way_beyond_the_band_is_flagged_and_a_lost_goal_fails() {
        let old = results(&[
            ("cpu", 1.86, "<= 2", true, &[]),
            ("rate", 0.9, ">= 0.8", true, &[]),
            ("ref", 0.7, "none (reference)", false, &[]),
        ]);
        let new = results(&[
            ("cpu", 3.0, "<= 2", false, &[]),
            ("rate", 0.95, ">= 0.8", true, &[]),
            ("ref", 0.3, "none (reference)", false, &[]),
        ]);
        let changes = compare(&old, &new);
        let by: BTreeMap<&str, &Change> = changes.iter().map(|c| (c.name.as_str(), c)).collect();
        assert!(by["cpu"].slipped && by["cpu"].lost_goal, "{:?}", by["cpu"]);
        assert!(
            !by["rate"].slipped && !by["rate"].lost_goal,
            "up is the right way"
        );
        assert!(!by["ref"].slipped, "a reference row has no wrong way");
        let text = render(&changes, "a", "b");
        assert!(text.contains("FLAG cpu: 1.86 -> 3 (+61%, band 10% from the minimum (no rounds)): slipped beyond its band and lost its goal"), "{text}");
        assert!(!text.contains("FLAG rate"), "{text}");
    }

    #[test]
    fn the_band_is_the_rounds_spread_when_wider_than_the_minimum() {
        // Rounds of 0.6, 0.8 and 1.0: a spread of 0.4 over a median of 0.8, 50%.
        let noisy: &[(f64, f64)] = &[(60.0, 100.0), (80.0, 100.0), (100.0, 100.0)];
        let old = results(&[("drain", 0.8, ">= 0.8", true, noisy)]);
        let new = results(&[("drain", 0.6, ">= 0.8", false, &[])]);
        let change = &compare(&old, &new)[0];
        assert!((change.band - 0.5).abs() < 1e-9, "{change:?}");
        assert!(!change.slipped, "-25% is within a 50% band");
        assert!(
            change.lost_goal,
            "but the goal is lost: that alone fails the run"
        );
        // Quiet rounds: the minimum stands.
        let quiet: &[(f64, f64)] = &[(80.0, 100.0), (81.0, 100.0)];
        let old = results(&[("drain", 0.8, ">= 0.8", true, quiet)]);
        let new = results(&[("drain", 0.7, ">= 0.8", false, quiet)]);
        let change = &compare(&old, &new)[0];
        assert_eq!(change.band, MIN_BAND);
        assert!(change.slipped, "-12.5% is beyond 10%");
    }

    #[test]
    fn a_cpu_rows_band_comes_from_its_rounds_cpu_per_record() {
        let round = |gateway_cpu: f64, direct_cpu: f64| {
            serde_json::json!({
                "gateway_cpu_s": gateway_cpu, "gateway_records": 1000.0,
                "direct_cpu_s": direct_cpu, "direct_records": 1000.0,
            })
        };
        let row = serde_json::json!([{
            "name": "drain-cpu", "ratio": 1.0, "goal": "<= 1.5", "met": true,
            "rounds": [round(1.0, 1.0), round(1.3, 1.0), round(0.9, 1.0)],
        }]);
        let rows = rows_of(&row);
        let spread = rows["drain-cpu"].spread().expect("a spread");
        assert!((spread - 0.4).abs() < 1e-9, "0.9 to 1.3 over 1.0: {spread}");
    }

    #[test]
    fn queue_overheads_rounds_give_its_band() {
        let row = serde_json::json!([{
            "name": "queue-overhead", "ratio": 3.0, "goal": "<= 2", "met": false,
            "rounds_cpu_us_per_record": [
                {"queue": 5.6, "read": 1.833}, {"queue": 5.333, "read": 1.767},
                {"queue": 4.7, "read": 1.7},
            ],
        }]);
        let spread = rows_of(&row)["queue-overhead"].spread().expect("a spread");
        assert!(
            (0.08..0.10).contains(&spread),
            "2.76 to 3.06 over 3.02: {spread}"
        );
    }

    #[test]
    fn rows_in_one_run_only_are_left_out_and_bad_files_are_refused() {
        let old = results(&[("a", 1.0, "<= 2", true, &[])]);
        let new = results(&[("b", 1.0, "<= 2", true, &[])]);
        assert!(compare(&old, &new).is_empty());
        assert!(rows("{}").is_err());
        assert!(rows("not json").is_err());
    }
}
