//! `sluice bench --rate R1,R2,...`: open loop at fixed offered rates, latency counted from when
//! each call was due (queueing in the generator's callers, the daemon or Redis all count), on
//! each transport (HTTP over TCP and the Unix socket, gRPC over TCP) and, at the same rates in
//! the same run, the naive sidecar; then the answer to "is a check under 2 ms at p99 at this
//! rate?" for each, beside the naive sidecar's p99.

use anyhow::Result;

use super::load::{Factory, KeyMix};
use super::procs::Redis;
use super::report::{Report, Row};
use super::Plan;

/// The design's budget for a check's p99, in microseconds.
pub const BUDGET_US: u64 = 2_000;

/// The systems a fixed-rate run drives, in the order they run at each rate.
pub const SYSTEMS: [&str; 4] = ["sluice uds", "sluice tcp", "sluice grpc", "naive sidecar"];

/// One `--rate` value: checks per second, at least 1 and at most 10,000,000.
pub fn parse_rate(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(rate) if (1.0..=10_000_000.0).contains(&rate) => Ok(rate),
        Ok(_) => Err("a rate is 1 to 10000000 checks/s".into()),
        Err(error) => Err(error.to_string()),
    }
}

/// Runs every `(system, factory, pid)` at every rate (rates outer, so a noisy moment of the
/// host falls on every system alike), `clients` callers each.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    report: &mut Report,
    redis: &Redis,
    systems: &[(&str, &Factory, u32)],
    rates: &[f64],
    clients: usize,
    policy: &str,
    mix: &KeyMix,
    plan: &Plan,
) -> Result<()> {
    for &rate in rates {
        for &(system, factory, pid) in systems {
            let row = super::measure(
                redis,
                Some(pid),
                system,
                policy,
                mix,
                clients,
                Some(rate),
                factory,
                plan,
            )
            .await?;
            report.push(row);
        }
    }
    Ok(())
}

/// Prints the fixed-rate rows: per rate and system, the latencies, whether p99 is under the
/// budget, p99 and CPU per check against the naive sidecar at the same rate, and the share of
/// the run the answering process waited for a CPU.
pub fn print(report: &Report) {
    let rows: Vec<&Row> = report
        .rows
        .iter()
        .filter(|r| r.offered_rate.is_some_and(|o| report.rates.contains(&o)))
        .collect();
    if rows.is_empty() {
        return;
    }
    println!(
        "\nFixed rates ({}, {}; open loop, latency from when each call was due; budget: p99 under {} ms):\n",
        rows[0].algorithm,
        rows[0].keys,
        BUDGET_US / 1_000
    );
    println!("| rate/s | system | callers | checks/s | p50 us | p99 us | p99.9 us | max us | p99 under 2 ms | p99 vs naive | daemon CPU us/check | CPU vs naive | process waited for a CPU | with Redis | errors |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for row in &rows {
        let naive = rows.iter().find(|r| {
            r.system == "naive sidecar"
                && r.offered_rate == row.offered_rate
                && r.algorithm == row.algorithm
                && r.keys == row.keys
                && r.clients == row.clients
        });
        let ratio = |figure: fn(&Row) -> Option<f64>| {
            naive
                .filter(|n| n.system != row.system)
                .and_then(|n| Some(figure(row)? / figure(n)?.max(1e-9)))
                .map_or("-".into(), |r| format!("{r:.2}x"))
        };
        println!(
            "| {:.0} | {} | {} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0}% | {} |",
            row.offered_rate.unwrap_or_default(),
            row.system,
            row.clients,
            row.rate,
            row.p50_us,
            row.p99_us,
            row.p999_us,
            row.max_us,
            if row.p99_us < BUDGET_US { "yes" } else { "no" },
            ratio(|r| Some(r.p99_us as f64)),
            row.daemon_cpu_us.map_or("-".into(), |c| format!("{c:.1}")),
            ratio(|r| r.daemon_cpu_us),
            row.process_wait_percent
                .map_or("-".into(), |w| format!("{w:.1}%")),
            row.cpu_wait_percent,
            row.errors,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_is_a_positive_number_of_checks_per_second() {
        assert_eq!(parse_rate("1000"), Ok(1000.0));
        assert_eq!(parse_rate("2.5"), Ok(2.5));
        for bad in ["0", "-5", "0.5", "NaN", "inf", "1e9", "fast", ""] {
            assert!(parse_rate(bad).is_err(), "{bad:?}");
        }
    }
}
