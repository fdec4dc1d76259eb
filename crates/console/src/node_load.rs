//! This node's own load over time: bytes produced to it and fetched from it, and how long
//! its Produce and Fetch requests took (the 99th percentile of each sample interval).
//!
//! Why from the broker and not over the protocol: Kafka's protocol says where offsets are,
//! not how long requests take or how many bytes went out, and the console runs inside the
//! broker that counts them. The broker hands the console running totals
//! ([`NodeTotals`], since the process started); the history sampler keeps the byte totals
//! as series (their differences are the rates) and turns the latency histograms'
//! differences between two samples into that interval's percentile.

use std::sync::Arc;

/// The percentile of request latency the charts show.
pub const LATENCY_QUANTILE: f64 = 0.99;

/// One API's latency histogram since the broker started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiLatency {
    /// The API's name (`Produce`, `Fetch`).
    pub api: &'static str,
    /// Upper bound of each bucket in microseconds, ascending; `counts` has one more entry,
    /// the requests above the last bound.
    pub bounds_micros: Vec<u64>,
    /// Requests per bucket (not cumulative).
    pub counts: Vec<u64>,
}

impl ApiLatency {
    fn assert_shape(&self) {
        assert_eq!(self.counts.len(), self.bounds_micros.len() + 1, "{}: one count per bucket and one above", self.api);
        assert!(self.bounds_micros.windows(2).all(|pair| pair[0] < pair[1]), "{}: bounds ascend", self.api);
    }
}

/// What this broker counted since it started, as one sample reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeTotals {
    /// Record batch bytes appended by producers.
    pub produced_bytes: u64,
    /// Record batch bytes sent to consumers and followers.
    pub fetched_bytes: u64,
    pub latency: Vec<ApiLatency>,
}

/// Reads this node's totals; given by the broker.
pub type NodeTotalsSource = Arc<dyn Fn() -> NodeTotals + Send + Sync>;

/// What one sample keeps of this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSample {
    pub produced_bytes: i64,
    pub fetched_bytes: i64,
    /// Each API's latency percentile over the interval, in microseconds.
    pub latency_micros: Vec<(&'static str, i64)>,
}

/// One sample: the byte totals, and each API's latency percentile over the interval since
/// `previous` (left out for an API that served no request in it, and for every API on the
/// first sample).
pub fn sample(previous: Option<&NodeTotals>, now: &NodeTotals) -> NodeSample {
    let mut sample = NodeSample {
        produced_bytes: saturating_i64(now.produced_bytes),
        fetched_bytes: saturating_i64(now.fetched_bytes),
        latency_micros: Vec::new(),
    };
    let Some(previous) = previous else { return sample };
    for api in &now.latency {
        api.assert_shape();
        let Some(before) = previous.latency.iter().find(|b| b.api == api.api && b.bounds_micros == api.bounds_micros)
        else {
            continue;
        };
        let counts: Vec<u64> = api.counts.iter().zip(&before.counts).map(|(n, b)| n.saturating_sub(*b)).collect();
        if let Some(micros) = quantile_micros(&api.bounds_micros, &counts, LATENCY_QUANTILE) {
            sample.latency_micros.push((api.api, saturating_i64(micros)));
        }
    }
    sample
}

fn saturating_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// The `quantile` of requests counted per bucket (`counts`, one more than `bounds_micros`),
/// interpolated linearly inside its bucket as Prometheus' `histogram_quantile` does; a
/// quantile past the last bound reads as the last bound. `None`: no requests.
pub fn quantile_micros(bounds_micros: &[u64], counts: &[u64], quantile: f64) -> Option<u64> {
    assert!((0.0..=1.0).contains(&quantile));
    assert_eq!(counts.len(), bounds_micros.len() + 1);
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = (quantile * total as f64).ceil().max(1.0);
    let mut below = 0u64;
    for (index, count) in counts.iter().enumerate() {
        if *count > 0 && (below + count) as f64 >= rank {
            let Some(upper) = bounds_micros.get(index) else { break };
            let lower = if index == 0 { 0 } else { bounds_micros[index - 1] };
            let within = (rank - below as f64) / *count as f64;
            return Some(lower + ((upper - lower) as f64 * within).round() as u64);
        }
        below += count;
    }
    bounds_micros.last().copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDS: [u64; 3] = [100, 200, 400];

    #[test]
    fn a_quantile_is_interpolated_inside_its_bucket() {
        assert_eq!(quantile_micros(&BOUNDS, &[0, 0, 0, 0], 0.99), None);
        // 100 requests: 98 under 100 us, 2 between 200 and 400: the 99th is the first of those two.
        assert_eq!(quantile_micros(&BOUNDS, &[98, 0, 2, 0], 0.99), Some(300));
        assert_eq!(quantile_micros(&BOUNDS, &[10, 0, 0, 0], 0.5), Some(50));
        // Past the last bound, the last bound.
        assert_eq!(quantile_micros(&BOUNDS, &[1, 0, 0, 99], 0.99), Some(400));
    }

    #[test]
    fn a_sample_keeps_byte_totals_and_the_intervals_percentile() {
        let at = |produced, counts: [u64; 4]| NodeTotals {
            produced_bytes: produced,
            fetched_bytes: 7,
            latency: vec![ApiLatency { api: "Produce", bounds_micros: BOUNDS.to_vec(), counts: counts.to_vec() }],
        };
        let first = at(100, [5, 0, 0, 0]);
        assert_eq!(
            sample(None, &first),
            NodeSample { produced_bytes: 100, fetched_bytes: 7, latency_micros: vec![] },
            "no interval before the first sample"
        );
        // The interval saw 100 requests past the last bound; the 5 fast ones before it do not count.
        let second = at(300, [5, 0, 0, 100]);
        assert_eq!(sample(Some(&first), &second).latency_micros, vec![("Produce", 400)]);
        // An interval without requests adds no point.
        assert!(sample(Some(&second), &second).latency_micros.is_empty());
    }
}
