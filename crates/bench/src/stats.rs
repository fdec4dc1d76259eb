//! Counters and latency histograms, per client and merged.
//!
//! Every producer and consumer owns one [`ClientStats`] shared with the collector.
//! Clients record into it from their own threads (counters are atomics, each histogram
//! sits behind its own uncontended mutex); the collector drains the *period* part every
//! sample, merges all clients into a [`PeriodSnapshot`] and adds that to the cumulative
//! [`LatencySet`], which is reset after warm-up. All latencies are recorded in
//! microseconds, so a sub-millisecond end-to-end latency is a real sample, never a 0 ms
//! sample that gets dropped. Transactional producers also count their committed and
//! aborted transactions and record how long each commit call took (OMB has no such
//! figures; they stay empty for plain producers).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use hdrhistogram::Histogram;

/// Largest latency a histogram holds, in microseconds (1 hour); larger values saturate.
pub const LATENCY_US_MAX: u64 = 3_600_000_000;
/// Significant decimal digits kept by each histogram (0.1% value precision).
pub const HISTOGRAM_SIGNIFICANT_DIGITS: u8 = 3;

/// A fresh latency histogram with the bench's bounds.
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_US_MAX, HISTOGRAM_SIGNIFICANT_DIGITS)
        .expect("constant histogram bounds are valid")
}

/// The three latencies OMB reports.
#[derive(Debug, Clone)]
pub struct LatencySet {
    /// Send call to acknowledgement, microseconds.
    pub publish_us: Histogram<u64>,
    /// Actual minus intended send time, microseconds.
    pub publish_delay_us: Histogram<u64>,
    /// Embedded send timestamp to consumption, microseconds.
    pub end_to_end_us: Histogram<u64>,
    /// A transactional producer's commit call (flush of the transaction's records, then
    /// EndTxn) until it returned, microseconds.
    pub commit_us: Histogram<u64>,
}

impl Default for LatencySet {
    fn default() -> Self {
        Self {
            publish_us: latency_histogram(),
            publish_delay_us: latency_histogram(),
            end_to_end_us: latency_histogram(),
            commit_us: latency_histogram(),
        }
    }
}

impl LatencySet {
    /// Adds every sample of `other` into `self`.
    pub fn merge(&mut self, other: &LatencySet) {
        merge_into(&mut self.publish_us, &other.publish_us);
        merge_into(&mut self.publish_delay_us, &other.publish_delay_us);
        merge_into(&mut self.end_to_end_us, &other.end_to_end_us);
        merge_into(&mut self.commit_us, &other.commit_us);
    }

    /// Drops every sample.
    pub fn reset(&mut self) {
        self.publish_us.reset();
        self.publish_delay_us.reset();
        self.end_to_end_us.reset();
        self.commit_us.reset();
    }
}

fn merge_into(into: &mut Histogram<u64>, from: &Histogram<u64>) {
    // Same bounds everywhere, so `add` cannot fail; saturate anyway rather than panic.
    if into.add(from).is_err() {
        for value in from.iter_recorded() {
            into.saturating_record_n(value.value_iterated_to(), value.count_at_value());
        }
    }
}

/// One client's counters and histograms.
#[derive(Debug)]
pub struct ClientStats {
    messages_sent: AtomicU64,
    bytes_sent: AtomicU64,
    send_errors: AtomicU64,
    messages_received: AtomicU64,
    bytes_received: AtomicU64,
    transactions_committed: AtomicU64,
    transactions_aborted: AtomicU64,
    period: Mutex<LatencySet>,
}

impl Default for ClientStats {
    fn default() -> Self {
        Self {
            messages_sent: AtomicU64::new(0),
            bytes_sent: AtomicU64::new(0),
            send_errors: AtomicU64::new(0),
            messages_received: AtomicU64::new(0),
            bytes_received: AtomicU64::new(0),
            transactions_committed: AtomicU64::new(0),
            transactions_aborted: AtomicU64::new(0),
            period: Mutex::new(LatencySet::default()),
        }
    }
}

/// Running totals since the start of the load.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Acknowledged sends.
    pub messages_sent: u64,
    /// Acknowledged bytes.
    pub bytes_sent: u64,
    /// Failed sends.
    pub send_errors: u64,
    /// Messages consumed, every subscription's copy counted.
    pub messages_received: u64,
    /// Bytes consumed.
    pub bytes_received: u64,
    /// Transactions committed by transactional producers.
    pub transactions_committed: u64,
    /// Transactions aborted after a failed send or commit.
    pub transactions_aborted: u64,
}

impl Counters {
    /// `self - earlier`, field by field.
    pub fn since(&self, earlier: &Counters) -> Counters {
        Counters {
            messages_sent: self.messages_sent - earlier.messages_sent,
            bytes_sent: self.bytes_sent - earlier.bytes_sent,
            send_errors: self.send_errors - earlier.send_errors,
            messages_received: self.messages_received - earlier.messages_received,
            bytes_received: self.bytes_received - earlier.bytes_received,
            transactions_committed: self.transactions_committed - earlier.transactions_committed,
            transactions_aborted: self.transactions_aborted - earlier.transactions_aborted,
        }
    }

    /// Messages published but not yet consumed by every subscription.
    pub fn backlog(&self, subscriptions_per_topic: u64) -> i64 {
        (subscriptions_per_topic * self.messages_sent) as i64 - self.messages_received as i64
    }
}

impl ClientStats {
    /// A producer's acknowledged send.
    pub fn record_sent(&self, bytes: u64, publish_us: u64) {
        self.messages_sent.fetch_add(1, Ordering::Relaxed);
        self.bytes_sent.fetch_add(bytes, Ordering::Relaxed);
        let mut period = self.period.lock().expect("stats lock poisoned");
        period.publish_us.saturating_record(publish_us);
    }

    /// A producer's failed send.
    pub fn record_send_error(&self) {
        self.send_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// How late a send left against its intended time.
    pub fn record_publish_delay(&self, delay_us: u64) {
        let mut period = self.period.lock().expect("stats lock poisoned");
        period.publish_delay_us.saturating_record(delay_us);
    }

    /// A consumed message; `end_to_end_us` is `None` when the payload had no timestamp.
    pub fn record_received(&self, bytes: u64, end_to_end_us: Option<u64>) {
        self.messages_received.fetch_add(1, Ordering::Relaxed);
        self.bytes_received.fetch_add(bytes, Ordering::Relaxed);
        if let Some(latency_us) = end_to_end_us {
            let mut period = self.period.lock().expect("stats lock poisoned");
            period.end_to_end_us.saturating_record(latency_us);
        }
    }

    /// A transaction committed; its commit call took `commit_us`.
    pub fn record_commit(&self, commit_us: u64) {
        self.transactions_committed.fetch_add(1, Ordering::Relaxed);
        let mut period = self.period.lock().expect("stats lock poisoned");
        period.commit_us.saturating_record(commit_us);
    }

    /// A transaction aborted.
    pub fn record_abort(&self) {
        self.transactions_aborted.fetch_add(1, Ordering::Relaxed);
    }

    /// Running totals.
    pub fn counters(&self) -> Counters {
        Counters {
            messages_sent: self.messages_sent.load(Ordering::Relaxed),
            bytes_sent: self.bytes_sent.load(Ordering::Relaxed),
            send_errors: self.send_errors.load(Ordering::Relaxed),
            messages_received: self.messages_received.load(Ordering::Relaxed),
            bytes_received: self.bytes_received.load(Ordering::Relaxed),
            transactions_committed: self.transactions_committed.load(Ordering::Relaxed),
            transactions_aborted: self.transactions_aborted.load(Ordering::Relaxed),
        }
    }

    /// Adds this client's period histograms into `into` and clears them.
    pub fn drain_period_into(&self, into: &mut LatencySet) {
        let mut period = self.period.lock().expect("stats lock poisoned");
        into.merge(&period);
        period.reset();
    }
}

/// Sums the totals of all clients.
pub fn total_counters<'a>(clients: impl IntoIterator<Item = &'a ClientStats>) -> Counters {
    let mut total = Counters::default();
    for client in clients {
        let counters = client.counters();
        total.messages_sent += counters.messages_sent;
        total.bytes_sent += counters.bytes_sent;
        total.send_errors += counters.send_errors;
        total.messages_received += counters.messages_received;
        total.bytes_received += counters.bytes_received;
        total.transactions_committed += counters.transactions_committed;
        total.transactions_aborted += counters.transactions_aborted;
    }
    total
}

/// The summary OMB keeps of one histogram.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Summary {
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: u64,
    /// 75th percentile.
    pub p75: u64,
    /// 95th percentile.
    pub p95: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// 99.99th percentile.
    pub p9999: u64,
    /// Largest sample.
    pub max: u64,
}

impl Summary {
    /// Summarizes `histogram` (all zeros when empty).
    pub fn of(histogram: &Histogram<u64>) -> Summary {
        if histogram.is_empty() {
            return Summary::default();
        }
        Summary {
            mean: histogram.mean(),
            p50: histogram.value_at_quantile(0.50),
            p75: histogram.value_at_quantile(0.75),
            p95: histogram.value_at_quantile(0.95),
            p99: histogram.value_at_quantile(0.99),
            p999: histogram.value_at_quantile(0.999),
            p9999: histogram.value_at_quantile(0.9999),
            max: histogram.max(),
        }
    }
}

/// The latency-by-quantile curve OMB writes: (percentile 0..100, value) pairs from
/// HdrHistogram's percentile iteration with 100 ticks per half distance.
pub fn quantile_curve(histogram: &Histogram<u64>) -> Vec<(f64, u64)> {
    let mut curve: Vec<(f64, u64)> = Vec::new();
    if histogram.is_empty() {
        return curve;
    }
    for step in histogram.iter_quantiles(100) {
        let percentile = step.quantile() * 100.0;
        let value = step.value_iterated_to();
        // OMB keeps these in a sorted map keyed by percentile: a repeated key keeps the last value.
        match curve.last_mut() {
            Some(last) if last.0 == percentile => last.1 = value,
            _ => curve.push((percentile, value)),
        }
    }
    curve
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_adds_counts_and_keeps_percentiles() {
        let a = ClientStats::default();
        let b = ClientStats::default();
        for value in 1..=100 {
            a.record_sent(10, value);
        }
        for value in 101..=200 {
            b.record_sent(10, value);
        }
        b.record_received(10, Some(0));
        let mut period = LatencySet::default();
        a.drain_period_into(&mut period);
        b.drain_period_into(&mut period);
        assert_eq!(period.publish_us.len(), 200);
        assert_eq!(period.publish_us.max(), 200);
        assert_eq!(period.publish_us.value_at_quantile(0.5), 100);
        // A 0 us end-to-end sample is kept, not dropped.
        assert_eq!(period.end_to_end_us.len(), 1);

        // Draining clears the clients' period histograms but not the counters.
        let mut again = LatencySet::default();
        a.drain_period_into(&mut again);
        assert!(again.publish_us.is_empty());
        assert_eq!(total_counters([&a, &b]).messages_sent, 200);

        let mut cumulative = LatencySet::default();
        cumulative.merge(&period);
        cumulative.merge(&period);
        assert_eq!(cumulative.publish_us.len(), 400);
        cumulative.reset();
        assert!(cumulative.publish_us.is_empty());
    }

    #[test]
    fn summary_is_ordered() {
        let mut histogram = latency_histogram();
        for value in 0..10_000u64 {
            histogram.record(value * 7 % 5_003).unwrap();
        }
        let summary = Summary::of(&histogram);
        let ordered = [summary.p50, summary.p75, summary.p95, summary.p99, summary.p999, summary.p9999, summary.max];
        assert!(ordered.windows(2).all(|pair| pair[0] <= pair[1]), "{summary:?}");
        let curve = quantile_curve(&histogram);
        assert!(curve.windows(2).all(|pair| pair[0].0 < pair[1].0 && pair[0].1 <= pair[1].1));
        assert_eq!(curve.last().unwrap().0, 100.0);
    }

    #[test]
    fn backlog_counts_every_subscription() {
        let counters = Counters { messages_sent: 100, messages_received: 150, ..Counters::default() };
        assert_eq!(counters.backlog(2), 50);
    }
}
