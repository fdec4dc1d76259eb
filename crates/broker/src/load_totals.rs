//! This node's running totals for the console's load charts: bytes produced and fetched,
//! and a latency histogram of Produce and of Fetch requests.
//!
//! Why beside the Prometheus metrics and not read from them: a Prometheus histogram shows
//! its buckets only to its encoder, and the console needs each sample's bucket counts to
//! tell one interval's percentile. These are a few relaxed atomic additions per request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sluice_console::{ApiLatency, NodeTotals};

/// Buckets of the latency histograms: the first bound, and each next one twice the last
/// (100 us to about 52 s, as the `request_seconds` metric).
const FIRST_BOUND_MICROS: u64 = 100;
const BOUNDS: usize = 20;
/// Kafka's API keys of the requests timed.
const PRODUCE: i16 = 0;
const FETCH: i16 = 1;

/// The upper bound of each bucket, in microseconds.
fn bounds_micros() -> Vec<u64> {
    (0..BOUNDS as u32).map(|doublings| FIRST_BOUND_MICROS << doublings).collect()
}

/// One API's requests by bucket; the last counts those above every bound.
struct LatencyTally {
    counts: [AtomicU64; BOUNDS + 1],
}

impl LatencyTally {
    fn new() -> LatencyTally {
        LatencyTally { counts: std::array::from_fn(|_| AtomicU64::new(0)) }
    }

    fn observe(&self, elapsed: Duration) {
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        // The bucket whose bound is the first at or above `micros`.
        let bucket = match micros.div_ceil(FIRST_BOUND_MICROS) {
            0 | 1 => 0,
            multiple => (u64::BITS - (multiple - 1).leading_zeros()) as usize,
        };
        self.counts[bucket.min(BOUNDS)].fetch_add(1, Ordering::Relaxed);
    }

    fn read(&self, api: &'static str) -> ApiLatency {
        ApiLatency {
            api,
            bounds_micros: bounds_micros(),
            counts: self.counts.iter().map(|count| count.load(Ordering::Relaxed)).collect(),
        }
    }
}

/// The totals since the broker started.
pub(crate) struct LoadTotals {
    produced_bytes: AtomicU64,
    fetched_bytes: AtomicU64,
    produce: LatencyTally,
    fetch: LatencyTally,
}

impl LoadTotals {
    pub(crate) fn new() -> LoadTotals {
        LoadTotals {
            produced_bytes: AtomicU64::new(0),
            fetched_bytes: AtomicU64::new(0),
            produce: LatencyTally::new(),
            fetch: LatencyTally::new(),
        }
    }

    pub(crate) fn request_done(&self, api_key: i16, elapsed: Duration) {
        match api_key {
            PRODUCE => self.produce.observe(elapsed),
            FETCH => self.fetch.observe(elapsed),
            _ => {}
        }
    }

    pub(crate) fn produced(&self, bytes: u64) {
        self.produced_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(crate) fn fetched(&self, bytes: u64) {
        self.fetched_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(crate) fn read(&self) -> NodeTotals {
        NodeTotals {
            produced_bytes: self.produced_bytes.load(Ordering::Relaxed),
            fetched_bytes: self.fetched_bytes.load(Ordering::Relaxed),
            latency: vec![self.produce.read("Produce"), self.fetch.read("Fetch")],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_counts_in_the_first_bucket_whose_bound_it_does_not_exceed() {
        let tally = LatencyTally::new();
        let bucket_of = |micros: u64| {
            let before = tally.read("Produce").counts;
            tally.observe(Duration::from_micros(micros));
            let after = tally.read("Produce").counts;
            after.iter().zip(&before).position(|(a, b)| a != b).unwrap()
        };
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(100), 0);
        assert_eq!(bucket_of(101), 1);
        assert_eq!(bucket_of(200), 1);
        assert_eq!(bucket_of(201), 2);
        assert_eq!(bucket_of(FIRST_BOUND_MICROS << (BOUNDS - 1)), BOUNDS - 1);
        assert_eq!(bucket_of(u64::MAX / 2), BOUNDS, "past every bound");
        let bounds = bounds_micros();
        for micros in [1, 150, 777, 5_000, 1_000_000] {
            let bucket = bucket_of(micros);
            assert!(micros <= bounds[bucket] && (bucket == 0 || micros > bounds[bucket - 1]), "{micros} in {bucket}");
        }
    }
}
