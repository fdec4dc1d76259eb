//! What tiered storage counts. The counters live here, where they are incremented; the
//! broker registers them with its Prometheus registry (names and help beside its other
//! metrics) and hands this handle to [`crate::TieredStorage::open`].

use prometheus_client::metrics::counter::Counter;

/// Tiered storage's counters; clones share the same counts.
#[derive(Clone, Default)]
pub struct TieredMetrics {
    /// Segment bytes copied to the object store.
    pub copied_bytes: Counter,
    /// Segments copied and committed.
    pub copied_segments: Counter,
    /// Copies that failed (each is retried after a backoff).
    pub copy_failures: Counter,
    /// Record bytes read from the object store for fetches.
    pub fetched_bytes: Counter,
    /// Remote reads that failed (answered with a retriable error).
    pub fetch_failures: Counter,
    /// Remote segments deleted by retention or DeleteRecords.
    pub expired_segments: Counter,
}
