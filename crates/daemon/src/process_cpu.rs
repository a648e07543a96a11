//! `sluice_process_cpu_seconds_total`: the daemon's CPU time with sub-second resolution. The
//! standard `process_cpu_seconds_total` (prometheus crate) is an integer counter of whole
//! seconds, which never moves for a 50m sidecar within a scrape interval; this one reads the
//! clock ticks of `/proc/self/stat` (every thread's user and system time, in 1/100 s: Linux's
//! `USER_HZ`) without rounding them to seconds.

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{Counter, Opts};

/// The collector; registered once on the daemon's registry.
pub struct ProcessCpu {
    counter: Counter,
}

impl ProcessCpu {
    /// A collector reading this process's CPU time at each scrape.
    pub fn new() -> Result<Self, prometheus::Error> {
        let counter = Counter::with_opts(Opts::new(
            "sluice_process_cpu_seconds_total",
            "CPU time (user and system) of the daemon, in seconds, sub-second resolution.",
        ))?;
        Ok(Self { counter })
    }
}

/// Clock ticks per second in `/proc/self/stat` (`USER_HZ`, 100 on every Linux architecture).
const TICKS_PER_SEC: f64 = 100.0;

/// This process's CPU time in seconds (all threads), if the platform says.
pub fn cpu_seconds() -> Option<f64> {
    // Fields after the `(comm)`: state is 3rd, utime 14th and stime 15th of the whole line.
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime + stime) as f64 / TICKS_PER_SEC)
}

impl Collector for ProcessCpu {
    fn desc(&self) -> Vec<&Desc> {
        self.counter.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        if let Some(now) = cpu_seconds() {
            let past = self.counter.get();
            if now > past {
                self.counter.inc_by(now - past);
            }
        }
        self.counter.collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_moves_in_fractions_of_a_second() {
        let cpu = ProcessCpu::new().expect("metric");
        let value = |cpu: &ProcessCpu| cpu.collect()[0].get_metric()[0].get_counter().get_value();
        let before = value(&cpu);
        // Work until the process has spent about 50 ms of CPU (bounded in wall time).
        let started = std::time::Instant::now();
        let mut x = 0u64;
        while value(&cpu) - before < 0.05 {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(10),
                "no CPU time seen"
            );
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
        }
        let delta = value(&cpu) - before;
        assert!(delta < 1.0, "moved by {delta} s: whole seconds only?");
    }
}
