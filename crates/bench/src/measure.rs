//! Latencies and throughput of one workload, merged over rounds.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Latencies are recorded in microseconds, 1 µs to 10 minutes, to three
/// significant digits.
fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds")
}

/// What one workload measured: every operation's latency, and the wall time
/// of each round (ops/s is the median over rounds, so one round that met a
/// checkpoint does not decide the figure).
#[derive(Debug, Clone)]
pub struct Sample {
    hist: Histogram<u64>,
    rounds: Vec<Round>,
    /// Client CPU over the timed sections, and the operations it covers
    /// (`None` when some round could not measure it).
    cpu: Option<(Duration, u64)>,
}

#[derive(Debug, Clone, Copy)]
struct Round {
    ops: u64,
    elapsed: Duration,
    /// The round's own median latency, in microseconds.
    p50_micros: u64,
}

/// One round's figures, as reported.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct RoundSummary {
    pub ops: u64,
    pub ops_per_sec: f64,
    pub p50_ms: f64,
}

impl Default for Sample {
    fn default() -> Self {
        Self { hist: new_histogram(), rounds: Vec::new(), cpu: Some((Duration::ZERO, 0)) }
    }
}

impl Sample {
    /// Records one operation's latency.
    pub fn record(&mut self, latency: Duration) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX).max(1);
        self.hist.saturating_record(micros);
    }

    /// Records a latency given in microseconds (pgbench's logs).
    pub fn record_micros(&mut self, micros: u64) {
        self.hist.saturating_record(micros.max(1));
    }

    /// Closes a round of `ops` operations that took `elapsed` of wall time;
    /// the latencies recorded so far are this round's (a sample holds one
    /// round until it is merged into another).
    pub fn end_round(&mut self, ops: u64, elapsed: Duration) {
        let p50_micros = self.hist.value_at_quantile(0.5);
        self.rounds.push(Round { ops, elapsed, p50_micros });
    }

    /// Adds another sample's latencies and rounds to this one.
    pub fn merge(&mut self, other: &Sample) {
        self.hist.add(&other.hist).expect("histograms with the same bounds");
        self.rounds.extend_from_slice(&other.rounds);
        self.cpu = match (self.cpu, other.cpu) {
            (Some((a, n)), Some((b, m))) => Some((a + b, n + m)),
            _ => None,
        };
    }

    /// Sets the client CPU spent on this sample's operations (`None`: not
    /// measurable); call it on a sample of one timed section.
    pub fn set_cpu(&mut self, cpu: Option<Duration>) {
        self.cpu = cpu.map(|c| (c, self.ops()));
    }

    /// Client CPU per operation, in microseconds.
    pub fn cpu_micros_per_op(&self) -> Option<f64> {
        let (cpu, ops) = self.cpu?;
        (ops > 0).then(|| cpu.as_secs_f64() * 1e6 / ops as f64)
    }

    pub fn ops(&self) -> u64 {
        self.rounds.iter().map(|r| r.ops).sum()
    }

    /// The median over rounds of each round's operations per second.
    pub fn ops_per_sec(&self) -> f64 {
        let mut rates: Vec<f64> = self
            .rounds
            .iter()
            .filter(|r| !r.elapsed.is_zero())
            .map(|r| r.ops as f64 / r.elapsed.as_secs_f64())
            .collect();
        median(&mut rates).unwrap_or(0.0)
    }

    /// The latency at `quantile` (0..=1), in milliseconds.
    pub fn millis_at(&self, quantile: f64) -> f64 {
        self.hist.value_at_quantile(quantile) as f64 / 1000.0
    }

    pub fn summary(&self) -> Latency {
        Latency {
            ops: self.ops(),
            rounds: self.rounds.len(),
            ops_per_sec: self.ops_per_sec(),
            p50_ms: self.millis_at(0.50),
            p95_ms: self.millis_at(0.95),
            p99_ms: self.millis_at(0.99),
            max_ms: self.hist.max() as f64 / 1000.0,
            client_cpu_us_per_op: self.cpu_micros_per_op(),
            mean_ms: self.hist.mean() / 1000.0,
            per_round: self
                .rounds
                .iter()
                .map(|r| RoundSummary {
                    ops: r.ops,
                    ops_per_sec: if r.elapsed.is_zero() { 0.0 } else { r.ops as f64 / r.elapsed.as_secs_f64() },
                    p50_ms: r.p50_micros as f64 / 1000.0,
                })
                .collect(),
        }
    }
}

/// The figures of a sample, as reported.
#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    pub ops: u64,
    pub rounds: usize,
    pub ops_per_sec: f64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub mean_ms: f64,
    /// User + system CPU of the client per operation, in microseconds: the
    /// bench process for our drivers and adk-session, pgbench (a child) for
    /// the pgbench rows; `None` when not measured.
    pub client_cpu_us_per_op: Option<f64>,
    /// Each round on its own, in the order run (rounds of all
    /// implementations alternate, so a slow spell shows in all of them).
    pub per_round: Vec<RoundSummary>,
}

impl Latency {
    /// Slowest and fastest round, in ops/s.
    pub fn round_range(&self) -> Option<(f64, f64)> {
        let rates = self.per_round.iter().map(|r| r.ops_per_sec);
        let min = rates.clone().fold(f64::INFINITY, f64::min);
        let max = rates.fold(0.0, f64::max);
        (self.per_round.len() > 1).then_some((min, max))
    }
}

pub fn median(values: &mut [f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    Some(if values.len() % 2 == 1 { values[mid] } else { (values[mid - 1] + values[mid]) / 2.0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_rates() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&mut []), None);
        let mut s = Sample::default();
        for ms in 1..=100 {
            s.record(Duration::from_millis(ms));
        }
        s.end_round(100, Duration::from_secs(2));
        s.end_round(100, Duration::from_secs(1));
        s.end_round(100, Duration::from_secs(4));
        assert!((s.ops_per_sec() - 50.0).abs() < 1e-9);
        assert!((s.millis_at(0.5) - 50.0).abs() < 0.1);
        assert!((s.millis_at(0.99) - 99.0).abs() < 0.1);
    }
}
