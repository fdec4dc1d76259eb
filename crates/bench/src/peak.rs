//! Peak stable throughput: the highest fixed producer rate a broker sustains.
//!
//! OMB's rate discovery (`producerRate: 0`) oscillates (its controller falls back to what
//! consumers received in the last 3 s, which can be a fraction of the peak). The
//! published reports instead stepped the rate by hand and called "peak stable
//! throughput" the highest rate at which consumers keep up with no growing backlog. This
//! module automates that: short fixed-rate trials, doubling the rate while the trial is
//! [stable](is_stable), then bisecting between the last stable and the first unstable
//! rate. Each trial is a complete run (topics, clients, warm-up, measured phase).

use std::time::Duration;

use crate::driver::LoadedDriver;
use crate::result::TestResult;
use crate::runner::{self, RunOptions};
use crate::workload::LoadedWorkload;

/// Share of the target rate a stable trial must publish and consume.
pub const RATE_SHARE_MIN: f64 = 0.95;
/// Trials while growing the rate.
const GROW_TRIALS_MAX: u32 = 12;
/// Bisection trials after the first unstable rate.
const BISECT_TRIALS: u32 = 3;
/// Lowest rate tried.
const RATE_MIN: f64 = 100.0;

/// One fixed-rate trial.
#[derive(Debug, Clone)]
pub struct Trial {
    /// Target rate, msg/s.
    pub rate: f64,
    /// Whether the broker kept up.
    pub stable: bool,
    /// Mean publish rate achieved.
    pub achieved: f64,
}

/// True when a fixed-rate run kept up: it published and consumed at least
/// [`RATE_SHARE_MIN`] of the target, had no send errors, and ended with at most one
/// second of messages not yet consumed.
pub fn is_stable(result: &TestResult, target_rate: f64, subscriptions: u32) -> bool {
    let published = result.publish_rate_mean();
    let consumed = result.consume_rate_mean();
    let copies = f64::from(subscriptions.max(1));
    let errors: f64 = result.publish_error_rate.iter().sum();
    let backlog_end = result.backlog.last().copied().unwrap_or(0) as f64;
    published >= RATE_SHARE_MIN * target_rate
        && consumed >= RATE_SHARE_MIN * published * copies
        && errors == 0.0
        && backlog_end <= (target_rate * copies).max(1000.0)
}

/// Searches the peak stable rate; returns the best stable trial's result (with the
/// search recorded in its `sluice` extras) or the last trial's when none was stable.
pub fn find_peak(workload: &LoadedWorkload, driver: &LoadedDriver, options: &RunOptions) -> anyhow::Result<TestResult> {
    if options.neighbour.is_some() {
        anyhow::bail!("--find-peak runs many trials: give a noisy neighbour (--neighbour-*) to fixed-rate runs only");
    }
    let mut trial_options = options.clone();
    trial_options.warmup_duration = options.warmup_duration.or(Some(Duration::from_secs(10)));
    trial_options.test_duration = options.test_duration.or(Some(Duration::from_secs(20)));
    trial_options.sample_period = options.sample_period.or(Some(Duration::from_secs(5)));
    let subscriptions = workload.workload.subscriptions_per_topic;
    let mut trials: Vec<Trial> = Vec::new();
    let mut best: Option<TestResult> = None;
    let mut last: Option<TestResult> = None;
    let mut run_trial = |rate: f64, trials: &mut Vec<Trial>| -> anyhow::Result<bool> {
        println!("===== peak search: trial at {rate:.0} msg/s =====");
        trial_options.producer_rate = Some(rate);
        let result = runner::run_workload(workload, driver, &trial_options)?;
        let stable = is_stable(&result, rate, subscriptions);
        let achieved = result.publish_rate_mean();
        println!(
            "===== trial at {rate:.0} msg/s: {} (published {achieved:.0} msg/s) =====",
            if stable { "stable" } else { "NOT stable" }
        );
        trials.push(Trial { rate, stable, achieved });
        if stable {
            best = Some(result);
        } else {
            last = Some(result);
        }
        Ok(stable)
    };

    let mut rate = options.producer_rate.filter(|r| *r > 0.0).unwrap_or(10_000.0);
    let mut stable_rate: Option<f64> = None;
    let mut unstable_rate: Option<f64> = None;
    for _ in 0..GROW_TRIALS_MAX {
        if run_trial(rate, &mut trials)? {
            stable_rate = Some(rate);
            if unstable_rate.is_some() {
                break;
            }
            rate *= 2.0;
        } else {
            unstable_rate = Some(rate);
            if stable_rate.is_some() || rate <= RATE_MIN {
                break;
            }
            rate = (rate / 2.0).max(RATE_MIN);
        }
    }
    if let (Some(mut low), Some(mut high)) = (stable_rate, unstable_rate) {
        for _ in 0..BISECT_TRIALS {
            let middle = (low + high) / 2.0;
            if run_trial(middle, &mut trials)? {
                low = middle;
            } else {
                high = middle;
            }
        }
        stable_rate = Some(low);
    }
    let mut result = best.or(last).expect("at least one trial ran");
    let extras = result.sluice.get_or_insert_with(Default::default);
    extras.peak_stable_rate = stable_rate;
    extras.peak_trials = trials.iter().map(|t| [t.rate, t.achieved, f64::from(u8::from(t.stable))]).collect();
    match stable_rate {
        Some(rate) => println!("Peak stable throughput: {rate:.0} msg/s"),
        None => println!("No stable rate found (lowest tried {RATE_MIN} msg/s)"),
    }
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(publish: f64, consume: f64, backlog_end: i64) -> TestResult {
        TestResult {
            publish_rate: vec![publish],
            consume_rate: vec![consume],
            publish_error_rate: vec![0.0],
            backlog: vec![backlog_end],
            ..TestResult::default()
        }
    }

    #[test]
    fn stability() {
        assert!(is_stable(&result(9_900.0, 9_900.0, 500), 10_000.0, 1));
        assert!(!is_stable(&result(8_000.0, 8_000.0, 0), 10_000.0, 1), "publish fell short");
        assert!(!is_stable(&result(10_000.0, 7_000.0, 0), 10_000.0, 1), "consumers fell short");
        assert!(!is_stable(&result(10_000.0, 10_000.0, 50_000), 10_000.0, 1), "backlog grew");
        assert!(is_stable(&result(10_000.0, 20_000.0, 0), 10_000.0, 2), "two subscriptions");
    }
}
