//! The checker's tests: hand-made histories, one per rule, and generated ones.

#![allow(clippy::unwrap_used)]
use super::faults::nearest_rank;
use super::*;
use crate::history::Event;
use crate::history::Op;
use crate::history::Outcome;
use crate::history::Phase;
use proptest::prelude::*;

fn ev(t_ms: f64, process: &str, op: Op) -> Event {
    Event {
        t_ms,
        process: process.to_string(),
        op,
    }
}

/// The value the producer writes at (partition, offset) in these tests.
fn value(p: i32, o: i64) -> String {
    format!("v{p}-{o}")
}

fn produced(t: f64, p: i32, o: i64) -> Event {
    ev(
        t,
        "producer",
        Op::Produced {
            partition: p,
            offset: o,
            value: value(p, o),
        },
    )
}

fn acquired(t: f64, inv: f64, lease: &str, p: i32, token: u64, offset: i64, gw: &str) -> Event {
    ev(
        t,
        "client-1",
        Op::Acquired {
            invoked_ms: inv,
            lease: lease.to_string(),
            partition: p,
            token,
            offset,
            gateway: gw.to_string(),
            via: gw.to_string(),
        },
    )
}

/// A batch of the records [from, to) with their produced values.
fn batch(t: f64, lease: &str, p: i32, token: u64, from: i64, to: i64) -> Event {
    ev(
        t,
        "client-1",
        Op::Batch {
            lease: lease.to_string(),
            partition: p,
            token,
            offsets: (from..to).collect(),
            values: (from..to).map(|o| value(p, o)).collect(),
        },
    )
}

fn commit(
    t: f64,
    inv: f64,
    lease: &str,
    p: i32,
    token: u64,
    offset: i64,
    outcome: Outcome,
) -> Event {
    ev(
        t,
        "client-1",
        Op::Commit {
            invoked_ms: inv,
            lease: lease.to_string(),
            partition: p,
            token,
            offset,
            outcome,
            error: None,
        },
    )
}

fn seek(t: f64, inv: f64, lease: &str, p: i32, token: u64, to: i64, outcome: Outcome) -> Event {
    ev(
        t,
        "client-1",
        Op::Seek {
            invoked_ms: inv,
            lease: lease.to_string(),
            partition: p,
            token,
            to,
            resolved: (outcome == Outcome::Ok).then_some(to),
            outcome,
            error: None,
        },
    )
}

fn release(t: f64, inv: f64, lease: &str, p: i32, token: u64, outcome: Outcome) -> Event {
    ev(
        t,
        "client-1",
        Op::Release {
            invoked_ms: inv,
            lease: lease.to_string(),
            partition: p,
            token,
            outcome,
            error: None,
        },
    )
}

fn lease_ended(t: f64, lease: &str, p: i32, token: u64) -> Event {
    ev(
        t,
        "client-1",
        Op::LeaseEnded {
            lease: lease.to_string(),
            partition: p,
            token,
            reason: "expired".to_string(),
        },
    )
}

fn observed(t: f64, p: i32, offset: i64, token: Option<u64>) -> Event {
    ev(
        t,
        "observer",
        Op::Committed {
            partition: p,
            offset,
            token,
            metadata: token.map_or_else(String::new, |t| format!("kafka-lease token={t};")),
        },
    )
}

fn nemesis(t: f64, name: &str, phase: Phase, target: &str) -> Event {
    ev(
        t,
        "nemesis",
        Op::Nemesis {
            name: name.to_string(),
            phase,
            target: target.to_string(),
            took_effect: true,
            evidence: "test".to_string(),
        },
    )
}

fn final_(t: f64, p: i32, committed: i64, high_watermark: i64) -> Event {
    ev(
        t,
        "observer",
        Op::Final {
            partition: p,
            committed,
            high_watermark,
        },
    )
}

fn kinds(report: &Report) -> Vec<(AnomalyKind, Option<i32>)> {
    report
        .anomalies
        .iter()
        .map(|a| (a.kind, a.partition))
        .collect()
}

/// Two partitions: on 0 a clean handover (A releases before B acquires), duplicates after
/// it and a seek back that explains the committed offset going back; on 1 a gateway killed
/// under lease C, C's late batch after D took over, and D's first batch 80 ms after the kill.
fn benign_history() -> Vec<Event> {
    let ok = Outcome::Ok;
    let mut h = Vec::new();
    for o in 0..10 {
        h.push(produced(1.0 + o as f64, 0, o));
    }
    for o in 0..4 {
        h.push(produced(1.5 + o as f64, 1, o));
    }
    h.push(ev(
        12.0,
        "producer",
        Op::ProduceUnknown {
            value: "u-1".to_string(),
            error: "timed out".to_string(),
        },
    ));
    h.extend([
        acquired(20.0, 15.0, "A", 0, 100, 0, "gw-1"),
        acquired(20.0, 18.0, "C", 1, 101, 0, "gw-1"),
        batch(24.0, "C", 1, 101, 0, 2),
        batch(25.0, "A", 0, 100, 0, 6),
        commit(32.0, 30.0, "A", 0, 100, 4, ok),
        observed(35.0, 0, 4, Some(100)),
        release(42.0, 40.0, "A", 0, 100, ok),
        acquired(50.0, 45.0, "B", 0, 200, 4, "gw-2"),
        batch(55.0, "B", 0, 200, 4, 10),
        commit(62.0, 60.0, "B", 0, 200, 10, ok),
        observed(65.0, 0, 10, Some(200)),
        seek(72.0, 70.0, "B", 0, 200, 6, ok),
        batch(75.0, "B", 0, 200, 6, 8),
        commit(82.0, 80.0, "B", 0, 200, 8, ok),
        observed(85.0, 0, 8, Some(200)),
        release(92.0, 90.0, "B", 0, 200, ok),
        nemesis(100.0, "kill-gateway", Phase::Start, "gw-1"),
        ev(
            155.0,
            "client-2",
            Op::AcquireFailed {
                invoked_ms: 150.0,
                outcome: Outcome::Unknown,
                error: "deadline".to_string(),
                via: "gw-1".to_string(),
            },
        ),
        acquired(160.0, 150.0, "D", 1, 202, 0, "gw-2"),
        batch(170.0, "C", 1, 101, 2, 3),
        batch(180.0, "D", 1, 202, 0, 4),
        commit(186.0, 185.0, "D", 1, 202, 4, ok),
        observed(190.0, 1, 4, Some(202)),
        nemesis(300.0, "kill-gateway", Phase::Stop, "gw-1"),
        final_(400.0, 0, 8, 10),
        final_(400.0, 1, 4, 4),
    ]);
    h
}

#[test]
fn benign_history_is_valid_with_exact_figures() {
    let report = check(&benign_history());
    assert!(report.valid(), "{}", render_markdown(&report));
    assert_eq!(report.anomaly_count(), 0);

    let c = report.counts;
    let n = |k: OutcomeCounts| (k.ok, k.failed, k.unknown);
    assert_eq!(n(c.acquire), (4, 0, 1));
    assert_eq!(n(c.commit), (4, 0, 0));
    assert_eq!(n(c.seek), (1, 0, 0));
    assert_eq!(n(c.release), (2, 0, 0));
    assert_eq!(n(c.produce), (14, 0, 1));

    let d = &report.delivery;
    assert_eq!(d.produced, 14);
    assert_eq!(d.produce_unknown, 1);
    assert_eq!(d.batches, 6);
    assert_eq!(d.delivered, 14);
    assert_eq!(d.deliveries, 21);
    assert_eq!(d.duplicates, 7);
    assert_eq!(d.lost, 0);
    assert_eq!(d.late_batches, 1);
    let p0 = &d.partitions[0];
    assert_eq!((p0.final_committed, p0.high_watermark), (Some(8), Some(10)));
    assert_eq!((p0.delivered, p0.deliveries, p0.late_batches), (10, 14, 0));
    let p1 = &d.partitions[1];
    assert_eq!((p1.final_committed, p1.high_watermark), (Some(4), Some(4)));
    assert_eq!((p1.late_batches, p1.max_late_ms), (1, Some(10.0)));

    assert_eq!(report.faults.len(), 1);
    let f = &report.faults[0];
    assert_eq!((f.start_ms, f.stop_ms), (100.0, Some(300.0)));
    // Partition 0's lease B (gw-2) was released before the kill: only C moved.
    assert_eq!(f.failover_ms.len(), 1);
    let o = &f.failover_ms[0];
    assert_eq!(
        (o.partition, o.from_lease.as_str(), o.from_token),
        (1, "C", 101)
    );
    assert_eq!(o.ms, Some(80.0));
    assert_eq!((o.to_lease.as_deref(), o.to_token), (Some("D"), Some(202)));
    // Partition 1's batches at 24 and 170 straddle the fault's start.
    assert_eq!(f.gap_ms, Some(146.0));
    assert_eq!(f.gap_partition, Some(1));
    assert_eq!(f.gap_between_ms, Some((24.0, 170.0)));

    let k = &report.fault_kinds[0];
    assert_eq!(k.name, "kill-gateway");
    assert_eq!(
        (k.faults, k.took_effect, k.failovers, k.not_recovered),
        (1, 1, 1, 0)
    );
    assert_eq!(
        (k.failover_p50_ms, k.failover_p99_ms),
        (Some(80.0), Some(80.0))
    );
    assert_eq!((k.max_gap_ms, k.max_gap_partition), (Some(146.0), Some(1)));

    let text = render_markdown(&report);
    assert!(text.starts_with("# Verdict: valid\n"), "{text}");
    assert!(
        text.contains("| kill-gateway | 1 | 1 | 80 | 80 | 146 (p1) | 0 |"),
        "{text}"
    );
    assert!(text.contains("| acquire | 4 | 0 | 1 |"), "{text}");
}

#[test]
fn order_written_does_not_matter() {
    let mut h = benign_history();
    h.reverse();
    let report = check(&h);
    assert!(report.valid());
    assert_eq!(report.delivery.duplicates, 7);
    assert_eq!(report.faults[0].failover_ms[0].ms, Some(80.0));
}

#[test]
fn stale_holder_is_detected_and_late_batch_is_not() {
    let ok = Outcome::Ok;
    let h = vec![
        produced(1.0, 0, 0),
        acquired(10.0, 5.0, "A", 0, 1, 0, "gw-1"),
        // Before B was granted: fine.
        commit(16.0, 15.0, "A", 0, 1, 0, ok),
        acquired(20.0, 12.0, "B", 0, 2, 0, "gw-2"),
        // Invoked after B's grant, answered ok: the anomaly.
        commit(27.0, 25.0, "A", 0, 1, 3, ok),
        // Fenced as it should be: fine.
        seek(31.0, 30.0, "A", 0, 1, 0, Outcome::Failed),
        // In flight before the grant: fine.
        release(22.0, 19.0, "A", 0, 1, ok),
        // A batch received after the grant: late, not an anomaly.
        batch(23.5, "A", 0, 1, 0, 1),
    ];
    let report = check(&h);
    assert_eq!(kinds(&report), vec![(AnomalyKind::StaleHolder, Some(0))]);
    let a = &report.anomalies[0];
    assert!(
        a.description.contains("Lease A (token 1)"),
        "{}",
        a.description
    );
    assert!(
        a.description
            .contains("lease B (token 2) was granted at 20 ms"),
        "{}",
        a.description
    );
    let times: Vec<f64> = a.excerpt.iter().map(|e| e.t_ms).collect();
    assert_eq!(times, vec![10.0, 20.0, 27.0]);
    assert_eq!(report.delivery.late_batches, 1);
    assert_eq!(report.delivery.partitions[0].max_late_ms, Some(3.5));
    assert_eq!(report.counts.commit.ok, 2);
    assert_eq!(report.counts.seek.failed, 1);
    assert!(render_markdown(&report).starts_with("# Verdict: INVALID: 1 anomaly (1 stale-holder)"));
}

#[test]
fn stale_holder_against_a_lease_seen_only_in_batches() {
    // A Subscribe member's lease has no Acquired: its first batch shows it held.
    let h = vec![
        produced(1.0, 0, 0),
        batch(10.0, "M", 0, 7, 0, 1),
        commit(13.0, 12.0, "L", 0, 6, 1, Outcome::Ok),
    ];
    let report = check(&h);
    assert_eq!(kinds(&report), vec![(AnomalyKind::StaleHolder, Some(0))]);
    assert!(report.anomalies[0]
        .description
        .contains("was seen holding the partition at 10 ms"));
}

#[test]
fn overlapping_grants_are_detected() {
    let h = vec![
        // One token, two leases.
        acquired(10.0, 5.0, "A", 0, 5, 0, "gw-1"),
        acquired(20.0, 15.0, "B", 0, 5, 0, "gw-2"),
        // A smaller token granted after C's grant completed.
        acquired(10.0, 5.0, "C", 1, 9, 0, "gw-1"),
        acquired(20.0, 15.0, "D", 1, 7, 0, "gw-1"),
        // Concurrent with C's acquire (asked for before C's grant completed): fine.
        acquired(25.0, 5.0, "E", 1, 3, 0, "gw-1"),
    ];
    let report = check(&h);
    assert_eq!(
        kinds(&report),
        vec![
            (AnomalyKind::OverlappingGrant, Some(0)),
            (AnomalyKind::OverlappingGrant, Some(1))
        ]
    );
    assert!(report.anomalies[0]
        .description
        .contains("token 5 to 2 leases (A, B)"));
    assert!(report.anomalies[1]
        .description
        .contains("Lease D of partition 1 was granted token 7"));
    assert!(report.anomalies[1]
        .description
        .contains("token 9 of lease C"));
    assert_eq!(report.anomalies[1].excerpt.len(), 2);
    assert_eq!(
        report.anomaly_totals,
        vec![AnomalyTotal {
            kind: AnomalyKind::OverlappingGrant,
            count: 2
        }]
    );
}

#[test]
fn token_regression_is_detected_once_per_drop() {
    let h = vec![
        commit(8.0, 7.0, "B", 0, 2, 5, Outcome::Ok),
        observed(10.0, 0, 5, Some(2)),
        // An old lease's commit that was answered unknown but landed.
        commit(19.0, 4.0, "A", 0, 1, 6, Outcome::Unknown),
        observed(20.0, 0, 6, Some(1)),
        observed(30.0, 0, 6, Some(1)),
    ];
    let report = check(&h);
    assert_eq!(
        kinds(&report),
        vec![(AnomalyKind::TokenRegression, Some(0))]
    );
    let a = &report.anomalies[0];
    let times: Vec<f64> = a.excerpt.iter().map(|e| e.t_ms).collect();
    assert_eq!(times, vec![8.0, 10.0, 19.0, 20.0]);
    assert!(
        a.description.contains("offset 6 with token 1 at 20 ms"),
        "{}",
        a.description
    );
    assert!(
        a.description
            .contains("offset 5 with the greater token 2 at 10 ms"),
        "{}",
        a.description
    );
}

/// The regression a late commit causes (the lease with token 29's commit, paused in its
/// gateway, lands after the successor's) is that commit's when its gateway reported it,
/// and an anomaly when nothing did; a report of another offset explains nothing.
#[test]
fn a_regression_to_a_commit_its_gateway_reported_late_is_not_an_anomaly() {
    let history = |reported: Option<(i64, u64)>| {
        let mut h = vec![
            commit(30.0, 29.0, "A", 5, 29, 520, Outcome::Ok),
            observed(31.0, 5, 520, Some(29)),
            commit(40.0, 39.0, "B", 5, 78, 673, Outcome::Ok),
            observed(41.0, 5, 673, Some(78)),
            // A's commit of 528, sent before its gateway stopped, lands when it goes on.
            observed(50.0, 5, 528, Some(29)),
            commit(60.0, 59.0, "B", 5, 78, 700, Outcome::Ok),
            observed(61.0, 5, 700, Some(78)),
        ];
        if let Some((offset, token)) = reported {
            h.push(ev(
                90.0,
                "g3",
                Op::LateCommit {
                    partition: 5,
                    token,
                    offset,
                },
            ));
        }
        h
    };
    let unreported = check(&history(None));
    assert_eq!(
        kinds(&unreported),
        vec![
            (AnomalyKind::TokenRegression, Some(5)),
            (AnomalyKind::CommitRegression, Some(5))
        ]
    );
    assert!(unreported.late_commits.is_empty());

    let reported = check(&history(Some((528, 29))));
    assert!(reported.valid(), "{:?}", kinds(&reported));
    assert_eq!(reported.late_commits.len(), 1);
    let late = &reported.late_commits[0];
    assert_eq!((late.partition, late.token, late.offset), (5, 29, 528));
    assert_eq!(late.gateway, "g3");
    assert_eq!(late.explains.len(), 2, "{:?}", late.explains);
    assert!(late.explains[0].starts_with("token-regression"));
    assert!(late.explains[1].starts_with("commit-regression"));
    let markdown = render_markdown(&reported);
    assert!(markdown.contains("## Late commits"), "{markdown}");
    assert!(markdown.contains("1, 1 of them seen to set the committed offset back"));

    // A report of another offset of the same lease explains nothing.
    let other = check(&history(Some((527, 29))));
    assert_eq!(other.anomaly_count(), 2);
    assert!(other.late_commits[0].explains.is_empty());
}

#[test]
fn commit_regression_is_detected_unless_a_seek_explains_it() {
    let ok = Outcome::Ok;
    let h = vec![
        // 0: no seek.
        observed(10.0, 0, 100, Some(1)),
        observed(20.0, 0, 50, Some(1)),
        // 1: the lease sought to 40 before the reading.
        observed(10.0, 1, 100, Some(1)),
        seek(13.0, 12.0, "L1", 1, 1, 40, ok),
        observed(20.0, 1, 50, Some(1)),
        // 2: no token and no seek.
        observed(10.0, 2, 100, None),
        observed(20.0, 2, 50, None),
        // 3: no token, a seek between the readings.
        observed(10.0, 3, 100, None),
        seek(15.0, 14.0, "L3", 3, 1, 50, ok),
        observed(20.0, 3, 50, None),
        // 4: a seek, but to above the offset read.
        observed(10.0, 4, 100, Some(1)),
        seek(13.0, 12.0, "L4", 4, 1, 60, ok),
        observed(20.0, 4, 50, Some(1)),
        // 5: a seek of another token does not explain it.
        observed(10.0, 5, 100, Some(2)),
        seek(13.0, 12.0, "L5", 5, 1, 10, ok),
        observed(20.0, 5, 50, Some(2)),
    ];
    let report = check(&h);
    let partitions: Vec<Option<i32>> = report.anomalies.iter().map(|a| a.partition).collect();
    assert_eq!(partitions, vec![Some(0), Some(2), Some(4), Some(5)]);
    assert!(report
        .anomalies
        .iter()
        .all(|a| a.kind == AnomalyKind::CommitRegression));
    assert!(report.anomalies[0]
        .description
        .contains("went back from 100 (token 1) at 10 ms to 50 (token 1) at 20 ms"));
}

#[test]
fn lost_records_are_listed_up_to_the_cap_with_the_exact_total() {
    let mut h = Vec::new();
    for o in 0..30 {
        h.push(produced(1.0, 0, o));
    }
    h.push(batch(40.0, "A", 0, 1, 0, 5));
    h.push(final_(100.0, 0, 30, 30));
    // Partition 1: no Final, the largest committed offset observed is 2.
    for o in 0..3 {
        h.push(produced(1.0, 1, o));
    }
    h.push(batch(40.0, "B", 1, 1, 0, 1));
    h.push(observed(50.0, 1, 2, Some(1)));
    // Partition 2: nothing says how far it was read; skipped.
    h.push(produced(1.0, 2, 0));
    let report = check(&h);
    let lost0: Vec<&Anomaly> = report
        .anomalies
        .iter()
        .filter(|a| a.partition == Some(0))
        .collect();
    let lost1: Vec<&Anomaly> = report
        .anomalies
        .iter()
        .filter(|a| a.partition == Some(1))
        .collect();
    assert_eq!(lost0.len(), 20);
    assert_eq!(lost1.len(), 1);
    assert!(lost0[0].description.starts_with("Record 5 of partition 0"));
    assert!(lost0[19]
        .description
        .contains("has 25 lost-record anomalies in all, the first 20 listed"));
    assert!(lost1[0].description.contains("Record 1 of partition 1"));
    assert!(lost1[0]
        .description
        .contains("largest committed offset observed 2"));
    assert_eq!(report.delivery.lost, 26);
    assert_eq!(report.delivery.partitions[0].lost, 25);
    assert_eq!(report.delivery.partitions[2].lost, 0);
    assert_eq!(report.anomaly_count(), 26);
    // The record, the batch before it and the Final.
    assert_eq!(lost0[0].excerpt.len(), 3);
}

#[test]
fn wrong_and_phantom_values_are_detected() {
    let h = vec![
        produced(1.0, 0, 0),
        produced(2.0, 0, 1),
        ev(
            3.0,
            "producer",
            Op::ProduceUnknown {
                value: "maybe".to_string(),
                error: "timed out".to_string(),
            },
        ),
        ev(
            10.0,
            "client-1",
            Op::Batch {
                lease: "A".to_string(),
                partition: 0,
                token: 1,
                offsets: vec![0, 1, 2],
                // A value written elsewhere; one never written; an unknown write that landed.
                values: vec![value(0, 1), "ghost".to_string(), "maybe".to_string()],
            },
        ),
        ev(
            20.0,
            "client-1",
            Op::Batch {
                lease: "A".to_string(),
                partition: 0,
                token: 1,
                offsets: vec![0, 1],
                values: vec![value(0, 1), "ghost".to_string()],
            },
        ),
    ];
    let report = check(&h);
    assert_eq!(
        kinds(&report),
        vec![
            (AnomalyKind::WrongValue, Some(0)),
            (AnomalyKind::PhantomRecord, Some(0))
        ]
    );
    assert!(report.anomalies[0]
        .description
        .contains("\"v0-1\" at offset 0"));
    assert!(report.anomalies[1]
        .description
        .contains("\"ghost\" at offset 1"));
    assert_eq!(report.delivery.deliveries, 5);
    assert_eq!(report.delivery.duplicates, 2);
}

#[test]
fn a_lease_its_client_lets_go_during_a_fault_is_not_a_failover() {
    let mut h: Vec<Event> = (0..12).map(|o| produced(1.0, 0, o)).collect();
    h.extend([
        acquired(10.0, 5.0, "A", 0, 1, 0, "g1"),
        batch(20.0, "A", 0, 1, 0, 4),
        nemesis(100.0, "skew-gateway-clock", Phase::Start, "g1"),
        // The client's own choice, in the middle of the fault.
        ev(
            2000.0,
            "client-1",
            Op::LeaseEnded {
                lease: "A".to_string(),
                partition: 0,
                token: 1,
                reason: crate::history::ABANDONED.to_string(),
            },
        ),
        nemesis(3000.0, "skew-gateway-clock", Phase::Stop, "g1"),
        acquired(9000.0, 8990.0, "B", 0, 2, 4, "g2"),
        batch(9010.0, "B", 0, 2, 4, 12),
    ]);
    let report = check(&h);
    assert!(report.valid(), "{:?}", report.anomalies);
    let f = &report.faults[0].failover_ms;
    assert_eq!(f.len(), 1);
    assert!(f[0].let_go && !f[0].kept);
    assert_eq!(f[0].ms, None);
    let k = &report.fault_kinds[0];
    assert_eq!(
        (k.let_go, k.kept, k.not_recovered, k.failovers),
        (1, 0, 0, 0)
    );
    assert!(render_markdown(&report).contains("let go (p0)"));
    // The same lease lost to the fault (it ends with another reason) is a failover.
    for e in &mut h {
        if let Op::LeaseEnded { reason, .. } = &mut e.op {
            *reason = "read ended: lease lost".to_string();
        }
    }
    let report = check(&h);
    let f = &report.faults[0].failover_ms;
    assert!(!f[0].let_go);
    assert_eq!(f[0].ms, Some(8910.0));
}

#[test]
fn a_lease_that_reads_on_after_the_fault_is_kept_not_failed_over() {
    let mut h: Vec<Event> = (0..12).map(|o| produced(1.0, 0, o)).collect();
    h.extend([
        acquired(10.0, 5.0, "A", 0, 1, 0, "g1"),
        batch(20.0, "A", 0, 1, 0, 4),
        nemesis(100.0, "kill-consul-leader", Phase::Start, "g1"),
        nemesis(3000.0, "kill-consul-leader", Phase::Stop, "g1"),
        // Suspended during the fault, the same lease reads on after it.
        batch(3100.0, "A", 0, 1, 5, 9),
        acquired(9000.0, 8990.0, "B", 0, 2, 10, "g2"),
        batch(9010.0, "B", 0, 2, 10, 12),
    ]);
    let report = check(&h);
    assert!(report.valid(), "{:?}", report.anomalies);
    let f = &report.faults[0].failover_ms;
    assert_eq!(f.len(), 1);
    assert!(f[0].kept);
    assert_eq!(f[0].ms, None);
    let k = &report.fault_kinds[0];
    assert_eq!((k.kept, k.not_recovered, k.failovers), (1, 0, 0));
    // The window runs from the fault's start to the end: B's grant, and the batches
    // of offsets 5..=8 and 10..=11, none delivered before.
    let w = &report.faults[0];
    assert_eq!((w.calls.ok, w.calls.failed, w.calls.unknown), (1, 0, 0));
    assert_eq!((w.delivered, w.duplicated), (6, 0));
    assert!(render_markdown(&report).contains("kept (p0)"));
}

#[test]
fn failover_percentiles_and_recovery() {
    let mut h = vec![
        // Fault 1 on gw-1: partition 0 moves after 80 ms.
        acquired(10.0, 5.0, "A", 0, 1, 0, "gw-1"),
        nemesis(100.0, "kill-gateway", Phase::Start, "gw-1"),
        acquired(170.0, 150.0, "A2", 0, 2, 0, "gw-2"),
        batch(180.0, "A2", 0, 2, 0, 1),
        nemesis(200.0, "kill-gateway", Phase::Stop, "gw-1"),
    ];
    // Fault 2 on gw-2 at 1000: partitions 0, 1, 2 move after 100, 300, 500 ms; 3 never.
    for (p, (lease, moved)) in [("A2", 100.0), ("B", 300.0), ("C", 500.0), ("E", 0.0)]
        .into_iter()
        .enumerate()
    {
        let p = p as i32;
        let token = if p == 0 { 2 } else { 1 };
        if p != 0 {
            h.push(acquired(500.0, 490.0, lease, p, token, 0, "gw-2"));
        }
        if moved > 0.0 {
            h.push(acquired(
                1000.0 + moved - 10.0,
                1000.0,
                "N",
                p,
                10,
                0,
                "gw-3",
            ));
            h.push(batch(1000.0 + moved, "N", p, 10, 0, 1));
        }
    }
    h.push(nemesis(1000.0, "kill-gateway", Phase::Start, "gw-2"));
    // Partition 4's lease on gw-2 ended before the fault: not counted.
    h.push(acquired(500.0, 490.0, "F", 4, 1, 0, "gw-2"));
    h.push(lease_ended(900.0, "F", 4, 1));
    // A fault on a Consul server moves nothing; its gap is measured.
    h.push(nemesis(
        2000.0,
        "partition-consul",
        Phase::Start,
        "consul-1",
    ));
    h.push(batch(1950.0, "N", 0, 10, 1, 2));
    h.push(batch(2100.0, "N", 0, 10, 2, 3));
    h.push(batch(2400.0, "N", 0, 10, 3, 4));
    for p in 0..4 {
        h.push(produced(1.0, p, 0));
    }
    for o in 1..4 {
        h.push(produced(1.0, 0, o));
    }
    h.push(nemesis(2200.0, "partition-consul", Phase::Stop, "consul-1"));
    let report = check(&h);
    assert!(report.valid(), "{}", render_markdown(&report));

    assert_eq!(report.faults.len(), 3);
    let f2 = &report.faults[1];
    assert_eq!(f2.stop_ms, None);
    let moved: Vec<(i32, Option<f64>)> =
        f2.failover_ms.iter().map(|o| (o.partition, o.ms)).collect();
    assert_eq!(
        moved,
        vec![
            (0, Some(100.0)),
            (1, Some(300.0)),
            (2, Some(500.0)),
            (3, None)
        ]
    );
    let consul = &report.faults[2];
    assert!(consul.failover_ms.is_empty());
    assert_eq!(
        (consul.gap_ms, consul.gap_partition),
        (Some(300.0), Some(0))
    );

    let k = &report.fault_kinds[0];
    assert_eq!(k.name, "kill-gateway");
    // Failovers 80, 100, 300, 500: nearest rank 2 of 4 and 4 of 4.
    assert_eq!((k.faults, k.failovers, k.not_recovered), (2, 4, 1));
    assert_eq!(
        (k.failover_p50_ms, k.failover_p99_ms),
        (Some(100.0), Some(500.0))
    );
    let c = &report.fault_kinds[1];
    assert_eq!(c.name, "partition-consul");
    assert_eq!((c.faults, c.failovers, c.failover_p50_ms), (1, 0, None));
    assert_eq!(c.max_gap_ms, Some(300.0));
}

#[test]
fn nearest_rank_percentiles() {
    let v: Vec<f64> = (1..=100).map(f64::from).collect();
    assert_eq!(nearest_rank(&v, 50), Some(50.0));
    assert_eq!(nearest_rank(&v, 99), Some(99.0));
    assert_eq!(nearest_rank(&[7.0], 99), Some(7.0));
    assert_eq!(nearest_rank(&[], 50), None);
}

#[test]
fn report_serializes_with_kebab_case_kinds() {
    let h = vec![
        acquired(10.0, 5.0, "A", 0, 5, 0, "gw-1"),
        acquired(20.0, 15.0, "B", 0, 5, 0, "gw-2"),
    ];
    let report = check(&h);
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["anomalies"][0]["kind"], "overlapping-grant");
    assert_eq!(json["anomaly_totals"][0]["count"], 1);
    assert_eq!(json["anomalies"][0]["excerpt"][1]["lease"], "B");
    let text = render_markdown(&report);
    assert!(
        text.contains("### 1. overlapping-grant, partition 0"),
        "{text}"
    );
    assert!(text.contains("```json\n{\"t_ms\":10.0"), "{text}");
}

/// One lease's turn in a generated history: records to read, whether it seeks back by
/// some records and reads them again, whether it releases (else its lease ends), and
/// whether a batch of it arrives late, after the next lease's grant.
type Turn = (i64, i64, bool, bool);

/// A correct sequential history: leases of one partition one after another, each reading
/// on from the committed offset, committing, and letting go.
fn sequential(records: i64, turns: &[Turn]) -> Vec<Event> {
    let ok = Outcome::Ok;
    let mut h: Vec<Event> = (0..records).map(|o| produced(o as f64, 0, o)).collect();
    let mut t = records as f64 + 10.0;
    let mut next = || {
        t += 10.0;
        t
    };
    let mut pos = 0;
    let mut late: Option<(String, u64, i64)> = None;
    for (n, &(read, back, releases, late_batch)) in turns.iter().enumerate() {
        let lease = format!("L{n}");
        let token = 10 * (n as u64 + 1);
        let inv = next();
        h.push(acquired(next(), inv, &lease, 0, token, pos, "gw-1"));
        if let Some((old, old_token, at)) = late.take() {
            h.push(batch(next(), &old, 0, old_token, at, at + 1));
        }
        let end = (pos + read).min(records);
        if end > pos {
            h.push(batch(next(), &lease, 0, token, pos, end));
            let inv = next();
            h.push(commit(next(), inv, &lease, 0, token, end, ok));
            h.push(observed(next(), 0, end, Some(token)));
            if back > 0 && end - back >= 0 {
                let inv = next();
                h.push(seek(next(), inv, &lease, 0, token, end - back, ok));
                h.push(batch(next(), &lease, 0, token, end - back, end));
                let inv = next();
                h.push(commit(next(), inv, &lease, 0, token, end - back, ok));
                h.push(observed(next(), 0, end - back, Some(token)));
                let inv = next();
                h.push(commit(next(), inv, &lease, 0, token, end, ok));
                h.push(observed(next(), 0, end, Some(token)));
            }
            if late_batch {
                late = Some((lease.clone(), token, end - 1));
            }
        }
        pos = end;
        if releases {
            let inv = next();
            h.push(release(next(), inv, &lease, 0, token, ok));
        } else {
            h.push(lease_ended(next(), &lease, 0, token));
        }
    }
    h.push(final_(next(), 0, pos, records));
    h
}

proptest! {
    #[test]
    fn sequential_correct_histories_are_valid(
        records in 1_i64..40,
        turns in proptest::collection::vec(
            (0_i64..12, 0_i64..4, any::<bool>(), any::<bool>()),
            1..10,
        ),
    ) {
        let h = sequential(records, &turns);
        let report = check(&h);
        prop_assert!(report.valid(), "{}", render_markdown(&report));
        let final_committed = report.delivery.partitions[0].final_committed.unwrap();
        prop_assert_eq!(report.delivery.lost, 0);
        prop_assert_eq!(report.delivery.produced, records as u64);
        prop_assert_eq!(report.delivery.delivered, final_committed as u64);
        prop_assert_eq!(report.counts.acquire.ok, turns.len() as u64);
    }
}

fn ack(
    t: f64,
    lease: &str,
    p: i32,
    token: u64,
    offset: i64,
    answer: &str,
    terminal: bool,
) -> Event {
    ev(
        t,
        "queue-1",
        Op::Ack {
            invoked_ms: t - 1.0,
            lease: lease.to_string(),
            partition: p,
            token,
            offset,
            attempt: 1,
            answer: answer.to_string(),
            terminal,
            outcome: Outcome::Ok,
            error: None,
        },
    )
}

fn dead_letter(t: f64, p: i32, offset: i64) -> Event {
    ev(
        t,
        "observer",
        Op::DeadLetter {
            partition: p,
            offset,
            token: Some(7),
            attempts: Some(1),
            reason: "chaos: rejected".to_string(),
        },
    )
}

/// A queue lease Q (token 7) starting at 0: 0 accepted, 1 retried then accepted, 2
/// rejected (in the dead letter topic), 3 accepted; the gateway commits 4.
fn queue_history() -> Vec<Event> {
    let mut h: Vec<Event> = (0..5).map(|o| produced(1.0 + o as f64, 0, o)).collect();
    h.extend([
        acquired(10.0, 9.0, "Q", 0, 7, 0, "gw-1"),
        batch(11.0, "Q", 0, 7, 0, 1),
        ack(12.0, "Q", 0, 7, 0, "accept", true),
        batch(13.0, "Q", 0, 7, 1, 2),
        ack(14.0, "Q", 0, 7, 1, "retry", false),
        batch(15.0, "Q", 0, 7, 1, 2),
        ack(16.0, "Q", 0, 7, 1, "accept", true),
        batch(17.0, "Q", 0, 7, 2, 3),
        ack(18.0, "Q", 0, 7, 2, "reject", true),
        batch(19.0, "Q", 0, 7, 3, 4),
        ack(20.0, "Q", 0, 7, 3, "accept", true),
        observed(30.0, 0, 4, Some(7)),
        final_(40.0, 0, 4, 5),
        dead_letter(41.0, 0, 2),
    ]);
    h
}

#[test]
fn a_queue_that_commits_only_what_was_answered_is_valid() {
    let report = check(&queue_history());
    assert!(report.valid(), "{:?}", report.anomalies);
    assert_eq!(report.counts.ack.ok, 5);
}

#[test]
fn a_queue_commit_past_a_record_answered_only_with_a_retry_is_caught() {
    let mut h = queue_history();
    // Record 1's second answer never came: only the retry, which is not the last
    // delivery, answered it.
    h.retain(|e| !(matches!(&e.op, Op::Ack { offset: 1, answer, .. } if answer == "accept")));
    let report = check(&h);
    assert_eq!(
        kinds(&report),
        vec![(AnomalyKind::UnansweredCommit, Some(0))]
    );
    assert!(report.anomalies[0]
        .description
        .contains("record 1 was never answered"));
}

#[test]
fn a_rejected_record_passed_but_missing_from_the_dead_letter_topic_is_caught() {
    let mut h = queue_history();
    h.retain(|e| !matches!(e.op, Op::DeadLetter { .. }));
    let report = check(&h);
    // Record 2 is both: rejected (so counted as answered) and not dead-lettered.
    assert_eq!(kinds(&report), vec![(AnomalyKind::DeadLetterLost, Some(0))]);
}

#[test]
fn a_record_the_gateway_dead_lettered_by_itself_may_be_passed_unanswered() {
    let mut h = queue_history();
    // Record 3's deliveries all timed out: the gateway dead-lettered it; no answer.
    h.retain(|e| !(matches!(&e.op, Op::Ack { offset: 3, .. })));
    h.push(dead_letter(42.0, 0, 3));
    let report = check(&h);
    assert!(report.valid(), "{:?}", report.anomalies);
}
