//! The targets sluice is held to, computed from one run's rows: each a ratio to a baseline
//! measured in the same run on the same machine (or, for the open-loop tail, an absolute bound),
//! printed with whether it was met. Low load (1 and 4 callers) is where a per-pod sidecar lives,
//! so those rows come first.

use serde::Serialize;

use super::envoy::rlqs::Fleet;
use super::report::Row;

/// One target's figure in one run.
#[derive(Debug, Clone, Serialize)]
pub struct Target {
    /// What is compared, e.g. `1 caller, uds: p50 vs naive sidecar`.
    pub what: String,
    /// `tb`, `sl`, `fw`.
    pub algorithm: String,
    /// `hot key` or `zipf N`.
    pub keys: String,
    /// The ratio (or microseconds, for `bound_us` targets).
    pub value: f64,
    /// Met when `value <= at_most` (or `>= at_least`).
    pub at_most: Option<f64>,
    /// See `at_most`.
    pub at_least: Option<f64>,
    /// Whether it was met.
    pub met: bool,
}

type Figure = fn(&Row) -> Option<f64>;

/// A ratio of `system`'s figure to `baseline`'s, both closed loop at `clients`.
struct Ratio {
    what: &'static str,
    clients: usize,
    system: &'static str,
    baseline: &'static str,
    figure: Figure,
    at_most: Option<f64>,
    at_least: Option<f64>,
}

fn p50(row: &Row) -> Option<f64> {
    Some(row.p50_us as f64)
}

fn redis_cpu(row: &Row) -> Option<f64> {
    Some(row.redis_cpu_us)
}

fn daemon_cpu(row: &Row) -> Option<f64> {
    row.daemon_cpu_us
}

fn rate(row: &Row) -> Option<f64> {
    Some(row.rate)
}

const RATIOS: &[Ratio] = &[
    Ratio {
        what: "1 caller, uds: p50 vs naive sidecar",
        clients: 1,
        system: "sluice uds",
        baseline: "naive sidecar",
        figure: p50,
        at_most: Some(1.0),
        at_least: None,
    },
    Ratio {
        what: "1 caller, uds: Redis CPU per check vs naive sidecar",
        clients: 1,
        system: "sluice uds",
        baseline: "naive sidecar",
        figure: redis_cpu,
        at_most: Some(1.0),
        at_least: None,
    },
    Ratio {
        what: "4 callers, uds: Redis CPU per check vs naive sidecar",
        clients: 4,
        system: "sluice uds",
        baseline: "naive sidecar",
        figure: redis_cpu,
        at_most: Some(0.8),
        at_least: None,
    },
    Ratio {
        what: "64 callers, uds: Redis CPU per check vs raw EVALSHA",
        clients: 64,
        system: "sluice uds",
        baseline: "raw EVALSHA",
        figure: redis_cpu,
        at_most: Some(0.4),
        at_least: None,
    },
    Ratio {
        what: "64 callers, tcp: daemon CPU per check vs naive sidecar",
        clients: 64,
        system: "sluice tcp",
        baseline: "naive sidecar",
        figure: daemon_cpu,
        at_most: Some(1.0),
        at_least: None,
    },
    Ratio {
        what: "64 callers, tcp: daemon CPU per check vs no-op floor",
        clients: 64,
        system: "sluice tcp",
        baseline: "noop floor",
        figure: daemon_cpu,
        at_most: Some(1.4),
        at_least: None,
    },
    Ratio {
        what: "64 callers, tcp: checks/s vs naive sidecar",
        clients: 64,
        system: "sluice tcp",
        baseline: "naive sidecar",
        figure: rate,
        at_most: None,
        at_least: Some(1.2),
    },
    Ratio {
        what: "1 caller: gRPC daemon CPU per check vs HTTP (tcp)",
        clients: 1,
        system: "sluice grpc",
        baseline: "sluice tcp",
        figure: daemon_cpu,
        at_most: Some(1.15),
        at_least: None,
    },
    Ratio {
        what: "4 callers: gRPC daemon CPU per check vs HTTP (tcp)",
        clients: 4,
        system: "sluice grpc",
        baseline: "sluice tcp",
        figure: daemon_cpu,
        at_most: Some(1.15),
        at_least: None,
    },
    Ratio {
        what: "64 callers: gRPC daemon CPU per check vs HTTP (tcp)",
        clients: 64,
        system: "sluice grpc",
        baseline: "sluice tcp",
        figure: daemon_cpu,
        at_most: Some(1.15),
        at_least: None,
    },
];

/// Open-loop p99 (at half the closed-loop maximum) must stay under this, every transport.
const OPEN_LOOP_P99_US: f64 = 1_000.0;

/// Every target the rows allow computing.
pub fn compute(rows: &[Row]) -> Vec<Target> {
    let mut targets = Vec::new();
    let mut mixes: Vec<(&str, &str)> = Vec::new();
    for row in rows {
        let mix = (row.algorithm.as_str(), row.keys.as_str());
        if !mixes.contains(&mix) {
            mixes.push(mix);
        }
    }
    for (algorithm, keys) in mixes {
        let closed = |system: &str, clients: usize| {
            rows.iter().find(|r| {
                r.system == system
                    && r.algorithm == algorithm
                    && r.keys == keys
                    && r.clients == clients
                    && r.offered_rate.is_none()
            })
        };
        let target = |what: String, value: f64, at_most: Option<f64>, at_least: Option<f64>| {
            let met = at_most.is_none_or(|m| value <= m) && at_least.is_none_or(|l| value >= l);
            Target {
                what,
                algorithm: algorithm.into(),
                keys: keys.into(),
                value,
                at_most,
                at_least,
                met,
            }
        };
        for ratio in RATIOS {
            let (Some(row), Some(base)) = (
                closed(ratio.system, ratio.clients),
                closed(ratio.baseline, ratio.clients),
            ) else {
                continue;
            };
            if let (Some(a), Some(b)) = ((ratio.figure)(row), (ratio.figure)(base)) {
                let value = a / b.max(1e-9);
                targets.push(target(
                    ratio.what.into(),
                    value,
                    ratio.at_most,
                    ratio.at_least,
                ));
            }
        }
        for row in rows
            .iter()
            .filter(|r| r.algorithm == algorithm && r.keys == keys && r.offered_rate.is_some())
        {
            targets.push(target(
                format!("open loop, {}: p99 us", row.system),
                row.p99_us as f64,
                Some(OPEN_LOOP_P99_US),
                None,
            ));
        }
    }
    targets
}

/// Through Envoy, RLQS may add at most this share of the p50 latency `ShouldRateLimit` adds
/// (each against Envoy with no filter, same run, same connections and transport).
const RLQS_VS_SHOULD_RATE_LIMIT: f64 = 0.2;

/// The through-Envoy targets: at each connection count and transport, the p50 RLQS adds over
/// the latency `ShouldRateLimit` adds; and that the RLQS fleet admitted no more than the limit.
pub fn envoy(rows: &[Row], fleet: Option<&Fleet>) -> Vec<Target> {
    let find = |system: &str, clients: usize| {
        rows.iter()
            .find(|r| r.system == system && r.clients == clients && r.offered_rate.is_none())
    };
    let mut targets = Vec::new();
    for base in rows.iter().filter(|r| r.system == "envoy") {
        let clients = base.clients;
        for transport in ["tcp", "uds"] {
            let (Some(rlqs), Some(rls)) = (
                find(&format!("envoy + rlqs {transport}"), clients),
                find(&format!("envoy + rls {transport}"), clients),
            ) else {
                continue;
            };
            let added = |row: &Row| row.p50_us as f64 - base.p50_us as f64;
            // No admitted request timed, or nothing added by ShouldRateLimit: no ratio to meet.
            let value = match (rlqs.p50_us, added(rls)) {
                (0, _) => f64::INFINITY,
                (_, by_rls) if by_rls <= 0.0 => f64::INFINITY,
                (_, by_rls) => added(rlqs) / by_rls,
            };
            targets.push(Target {
                what: format!(
                    "through Envoy, {clients} conn., {transport}: p50 RLQS adds vs ShouldRateLimit adds"
                ),
                algorithm: base.algorithm.clone(),
                keys: base.keys.clone(),
                value,
                at_most: Some(RLQS_VS_SHOULD_RATE_LIMIT),
                at_least: None,
                met: value <= RLQS_VS_SHOULD_RATE_LIMIT,
            });
        }
    }
    if let Some(fleet) = fleet {
        let value = fleet.admitted as f64 / fleet.bound.max(1) as f64;
        targets.push(Target {
            what: format!(
                "through Envoy, RLQS fleet of {} Envoys: admitted vs the limit",
                fleet.envoys
            ),
            algorithm: "fw".into(),
            keys: "one bucket".into(),
            value,
            at_most: Some(1.0),
            at_least: None,
            met: fleet.exact(),
        });
    }
    targets
}

/// Prints the targets as a table.
pub fn print(targets: &[Target]) {
    if targets.is_empty() {
        return;
    }
    println!("\n| target | alg | keys | figure | goal | met |");
    println!("|---|---|---|---|---|---|");
    for t in targets {
        let goal = match (t.at_most, t.at_least) {
            (Some(m), _) => format!("<= {m}"),
            (_, Some(l)) => format!(">= {l}"),
            _ => "-".into(),
        };
        let figure = if t.what.ends_with(" us") {
            format!("{:.0}", t.value)
        } else {
            format!("{:.2}x", t.value)
        };
        let met = if t.met { "yes" } else { "NO" };
        println!(
            "| {} | {} | {} | {figure} | {goal} | {met} |",
            t.what, t.algorithm, t.keys
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(system: &str, clients: usize, open: bool, p50: u64, redis: f64) -> Row {
        Row {
            system: system.into(),
            algorithm: "tb".into(),
            keys: "hot key".into(),
            clients,
            offered_rate: open.then_some(1000.0),
            rate: 100.0,
            p50_us: p50,
            p99_us: 2 * p50,
            p999_us: 3 * p50,
            max_us: 4 * p50,
            errors: 0,
            daemon_cpu_us: Some(10.0),
            redis_cpu_us: redis,
            redis_usec_per_call: 1.0,
            checks_per_call: 1.0,
            cpu_wait_percent: 0.0,
            process_wait_percent: None,
            sluice_cpu_us: None,
            denied_percent: None,
        }
    }

    #[test]
    fn ratios_come_from_rows_of_the_same_run_and_say_whether_they_are_met() {
        let rows = [
            row("sluice uds", 1, false, 120, 12.0),
            row("naive sidecar", 1, false, 150, 10.0),
            row("sluice uds", 64, true, 600, 1.0),
        ];
        let targets = compute(&rows);
        let p50 = &targets[0];
        assert_eq!(p50.what, "1 caller, uds: p50 vs naive sidecar");
        assert!((p50.value - 0.8).abs() < 1e-9 && p50.met);
        let redis = &targets[1];
        assert!((redis.value - 1.2).abs() < 1e-9 && !redis.met);
        let open = &targets[2];
        assert_eq!(open.what, "open loop, sluice uds: p99 us");
        assert!(!open.met, "p99 1200 us is over 1 ms: {open:?}");
        assert_eq!(targets.len(), 3, "no row, no target");
    }

    #[test]
    fn rlqs_is_held_to_a_fifth_of_what_should_rate_limit_adds_and_the_fleet_to_its_limit() {
        let rows = [
            row("envoy", 1, false, 200, 0.0),
            row("envoy + rls uds", 1, false, 600, 0.0),
            row("envoy + rlqs uds", 1, false, 260, 0.0),
            row("envoy", 16, false, 1000, 0.0),
            row("envoy + rls uds", 16, false, 2000, 0.0),
            row("envoy + rlqs uds", 16, false, 1400, 0.0),
            row("envoy + rlqs tcp", 16, false, 1100, 0.0),
        ];
        let fleet = Fleet {
            envoys: 3,
            limit: 100,
            bound: 100,
            requests: 500,
            admitted: 101,
            denied: 399,
            failed: 0,
            reached_s: Some(5.0),
            seconds: 8.0,
        };
        let targets = envoy(&rows, Some(&fleet));
        assert_eq!(
            targets.len(),
            3,
            "no rls tcp row, no tcp target: {targets:?}"
        );
        assert!((targets[0].value - 0.15).abs() < 1e-9 && targets[0].met);
        assert!((targets[1].value - 0.4).abs() < 1e-9 && !targets[1].met);
        assert!(targets[1].what.starts_with("through Envoy, 16 conn., uds"));
        assert!(!targets[2].met, "101 admitted of a limit of 100");
    }
}
