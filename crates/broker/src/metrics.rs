//! Prometheus metrics and health checks: `GET /metrics` (Prometheus text format),
//! `/healthz` (the process serves) and `/readyz` (it can take client traffic), on the
//! address from `metrics_listen` (`--metrics-listen`; off when unset).
//!
//! Why this shape: the hot paths touch only handles found without allocating (per API: a
//! counter and a latency histogram, indexed by API key and created at the API's first
//! request; per topic: byte counters found by `&str`), never a label lookup that allocates.
//! An API's series appear once it has been called: a broker serves some sixty APIs and a
//! client uses a handful, so the page carries the histograms someone can read rather than
//! dozens of empty ones. Gauges that describe state (partitions, their sizes, connections,
//! fetch sessions, under-replicated partitions, controller role, the data dir's disk) are
//! computed when scraped, so no code path has to keep them up to date; so are the process's
//! CPU time, memory and file descriptors, under the names every Prometheus client library
//! exports (`process_*`), which dashboards and alerts built for any service already read.
//!
//! Series labelled by partition are bounded: at most `PARTITION_SIZE_SERIES_MAX` partitions'
//! sizes, the largest, are exported, and how many were left out is a gauge of its own.
//!
//! The listener serves at most `METRICS_CONNECTIONS_MAX` connections; one more closes the
//! oldest, and one that sends no request for `METRICS_HEADER_READ_TIMEOUT_MS` is closed: an
//! operator's scrape or a probe gets through however many idle connections others hold.

use std::collections::HashMap;
use std::convert::Infallible;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use parking_lot::RwLock;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use crate::load_totals::LoadTotals;
use sluice_tiered::TieredMetrics;
use tokio::net::TcpListener;

use crate::Broker;

/// Request latency buckets: 100 us to ~52 s, doubling.
const REQUEST_SECONDS_BUCKETS: (f64, f64, u16) = (0.000_1, 2.0, 20);
/// Fsync latency buckets: 10 us to ~5 s, doubling.
const FSYNC_SECONDS_BUCKETS: (f64, f64, u16) = (0.000_01, 2.0, 20);
/// Highest API key with its own handles (Kafka's keys stay below this).
const API_KEYS_MAX: usize = 128;
/// Connections to the metrics listener served at once. When all are taken a new one
/// closes the oldest, so idle or slow clients cannot lock scrapes and probes out.
const METRICS_CONNECTIONS_MAX: usize = 64;
/// A metrics connection whose request headers have not arrived this long after it
/// opened (or after its previous answer) is closed.
const METRICS_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Partitions whose log size is exported, the largest first: one series per partition
/// would let a broker with a hundred thousand partitions write a page no Prometheus
/// should ingest every few seconds. Those left out are counted in
/// `sluice_partition_size_series_omitted`.
pub const PARTITION_SIZE_SERIES_MAX: usize = 10_000;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ApiLabels {
    api: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TopicLabels {
    topic: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WriteModeLabels {
    mode: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PartitionLabels {
    topic: String,
    partition: i32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabels {
    version: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GroupTopicLabels {
    group: String,
    topic: String,
}

/// Committed offsets looked at per scrape for the consumer-group lag gauges.
pub const GROUP_LAG_OFFSETS_MAX: usize = 100_000;

/// The handles of one API.
#[derive(Clone)]
struct ApiMetrics {
    requests: Counter,
    seconds: Histogram,
}

/// Request latency histograms by API, each with the buckets of `REQUEST_SECONDS_BUCKETS`.
type RequestHistograms = Family<ApiLabels, Histogram, fn() -> Histogram>;

/// One advertised API: its label, and its handles once it has been called.
struct ApiSlot {
    labels: ApiLabels,
    handles: OnceLock<ApiMetrics>,
}

/// One topic's counters.
#[derive(Clone)]
struct TopicCounters {
    produce_bytes: Counter,
    produce_records: Counter,
    fetch_bytes: Counter,
}

/// Every metric of the broker.
pub(crate) struct Metrics {
    registry: Registry,
    /// The `process_*` series, named without the `sluice_` prefix as Prometheus' client
    /// libraries name them.
    process: Registry,
    /// One scrape at a time: a scrape clears and refills the families of state gauges.
    scraping: parking_lot::Mutex<()>,
    apis: Vec<Option<ApiSlot>>,
    requests: Family<ApiLabels, Counter>,
    request_seconds: RequestHistograms,
    produce_bytes: Family<TopicLabels, Counter>,
    produce_records: Family<TopicLabels, Counter>,
    fetch_bytes: Family<TopicLabels, Counter>,
    /// Per-topic handles, found without allocating.
    topics: RwLock<HashMap<String, TopicCounters>>,
    fsync_seconds: Histogram,
    /// This node's totals for the console's load charts.
    load: LoadTotals,
    connections: Gauge,
    /// Connections refused at accept, by the limit that refused them.
    connections_refused: Family<ReasonLabels, Counter>,
    /// Connections the broker closed to protect itself, by why.
    connections_closed: Family<ReasonLabels, Counter>,
    /// Produce and fetch answers that carried a quota throttle.
    throttled_produce: Counter,
    throttled_fetch: Counter,
    throttled_request_time: Counter,
    isr_shrinks: Counter,
    isr_expands: Counter,
    /// What `isr_shrinks`/`isr_expands` last took from the replication counters.
    isr_seen: parking_lot::Mutex<(u64, u64)>,
    group_lag: Family<GroupTopicLabels, Gauge>,
    partition_size: Family<PartitionLabels, Gauge>,
    partition_size_omitted: Gauge,
    data_dir_free_bytes: Gauge,
    data_dir_total_bytes: Gauge,
    partitions: Gauge,
    offline_partitions: Gauge,
    leader_partitions: Gauge,
    under_replicated_partitions: Gauge,
    fetch_sessions: Gauge,
    produce_memory_bytes: Gauge,
    queued_request_bytes: Gauge,
    segment_tail_memory_bytes: Gauge,
    segment_tail_written_bytes: Family<WriteModeLabels, Counter>,
    segment_tail_full_appends: Counter,
    segment_files_open: Gauge,
    active_controller: Gauge,
    /// Tiered storage's counters (`sluice-tiered`), handed to it at startup.
    pub(crate) tiered: TieredMetrics,
    remote_log_size_bytes: Gauge,
    /// Record bytes of fetch responses sent from the page cache with `sendfile`.
    pub(crate) sendfile_bytes: Counter,
    /// Fetches read again on the blocking pool because some of their data was not cached.
    pub(crate) fetch_disk_reads: Counter,
}

/// A gauge registered as `name`.
fn gauge(registry: &mut Registry, name: &str, help: &str) -> Gauge {
    let gauge = Gauge::default();
    registry.register(name, help, gauge.clone());
    gauge
}

/// A counter registered as `name`.
fn counter(registry: &mut Registry, name: &str, help: &str) -> Counter {
    let counter = Counter::default();
    registry.register(name, help, counter.clone());
    counter
}

/// A family of counters registered as `name`, one per label set.
fn counters<L>(registry: &mut Registry, name: &str, help: &str) -> Family<L, Counter>
where
    L: Clone
        + std::hash::Hash
        + Eq
        + prometheus_client::encoding::EncodeLabelSet
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let family = Family::<L, Counter>::default();
    registry.register(name, help, family.clone());
    family
}

fn histogram((start, factor, count): (f64, f64, u16)) -> Histogram {
    Histogram::new(exponential_buckets(start, factor, count))
}

/// Registers the tiered-storage counters (`sluice-tiered` counts into them).
fn register_tiered(registry: &mut Registry, tiered: &TieredMetrics) {
    for (name, help, counter) in [
        ("remote_copy_bytes", "Segment bytes copied to the object store (tiered topics)", &tiered.copied_bytes),
        ("remote_copy_segments", "Segments copied to the object store and committed", &tiered.copied_segments),
        (
            "remote_copy_failures",
            "Copies to the object store that failed (retried after a backoff)",
            &tiered.copy_failures,
        ),
        ("remote_fetch_bytes", "Record bytes read from the object store for fetches", &tiered.fetched_bytes),
        (
            "remote_fetch_failures",
            "Reads from the object store that failed (answered with a retriable error)",
            &tiered.fetch_failures,
        ),
        ("remote_expired_segments", "Remote segments deleted by retention or DeleteRecords", &tiered.expired_segments),
    ] {
        registry.register(name, help, counter.clone());
    }
}

fn request_histogram() -> Histogram {
    histogram(REQUEST_SECONDS_BUCKETS)
}

/// Each advertised API's slot, by API key; its request counter and duration histogram
/// join `requests` and `request_seconds` at its first request.
fn api_slots() -> Vec<Option<ApiSlot>> {
    let mut apis: Vec<Option<ApiSlot>> = (0..API_KEYS_MAX).map(|_| None).collect();
    for (api, _, _) in sluice_protocol::ADVERTISED_APIS {
        let labels = ApiLabels { api: format!("{api:?}").trim_end_matches("Key").to_string() };
        let index = *api as i16 as usize;
        assert!(index < API_KEYS_MAX, "API key {api:?} has no metrics slot");
        apis[index] = Some(ApiSlot { labels, handles: OnceLock::new() });
    }
    apis
}

impl Metrics {
    pub(crate) fn new() -> Metrics {
        let mut registry = Registry::with_prefix("sluice");
        registry.register(
            "build",
            "The broker's version",
            Info::new(VersionLabels { version: env!("CARGO_PKG_VERSION") }),
        );
        let apis = api_slots();
        let requests = Family::<ApiLabels, Counter>::default();
        let request_seconds: RequestHistograms = Family::new_with_constructor(request_histogram as fn() -> Histogram);
        registry.register("requests", "Requests handled, by Kafka API", requests.clone());
        registry.register(
            "request_duration_seconds",
            "Time from a request's arrival to its answer, by Kafka API",
            request_seconds.clone(),
        );
        let produce_bytes =
            counters(&mut registry, "produce_bytes", "Record batch bytes appended by producers, by topic");
        let produce_records = counters(&mut registry, "produce_records", "Records appended by producers, by topic");
        let fetch_bytes =
            counters(&mut registry, "fetch_bytes", "Record batch bytes sent to consumers and followers, by topic");
        let fsync_seconds = histogram(FSYNC_SECONDS_BUCKETS);
        registry.register("fsync_duration_seconds", "Duration of each group-commit fdatasync", fsync_seconds.clone());
        let connections = gauge(&mut registry, "connections", "Open client connections");
        let connections_refused = counters::<ReasonLabels>(
            &mut registry,
            "connections_refused",
            "Connections closed at accept, by the limit: max_connections or max_connections_per_ip",
        );
        let connections_closed = counters::<ReasonLabels>(
            &mut registry,
            "connections_closed",
            "Connections the broker closed: idle (connections.max.idle.ms), request_read_timeout \
             (request_read_timeout_ms), unauthenticated_frame_too_large (sasl.server.max.receive.size), \
             failed_authentication",
        );
        let throttled = counters::<ApiLabels>(
            &mut registry,
            "quota_throttled_responses",
            "Answers throttled for exceeding a client quota (api=\"any\": request_percentage)",
        );
        let throttled_produce = throttled.get_or_create_owned(&ApiLabels { api: "Produce".into() });
        let throttled_fetch = throttled.get_or_create_owned(&ApiLabels { api: "Fetch".into() });
        // Request-time (request_percentage) throttles, whatever the API.
        let throttled_request_time = throttled.get_or_create_owned(&ApiLabels { api: "any".into() });
        let isr_shrinks = counter(&mut registry, "isr_shrinks", "ISR shrinks committed for partitions led here");
        let isr_expands = counter(&mut registry, "isr_expands", "ISR expansions committed for partitions led here");
        let group_lag = Family::<GroupTopicLabels, Gauge>::default();
        registry.register(
            "consumer_group_lag",
            "Messages between a group's committed offsets and the high watermark, summed over the topic's \
             partitions hosted on this node (groups coordinated here)",
            group_lag.clone(),
        );
        let partition_size = Family::<PartitionLabels, Gauge>::default();
        registry.register(
            "partition_size_bytes",
            "Bytes of a partition's log on this node (its segments; the largest PARTITION_SIZE_SERIES_MAX partitions)",
            partition_size.clone(),
        );
        let partition_size_omitted = gauge(
            &mut registry,
            "partition_size_series_omitted",
            "Hosted partitions whose size is not exported: beyond the largest PARTITION_SIZE_SERIES_MAX",
        );
        let data_dir_free_bytes = gauge(
            &mut registry,
            "data_dir_free_bytes",
            "Bytes the broker can still write on the data directory's filesystem (df's Avail)",
        );
        let data_dir_total_bytes =
            gauge(&mut registry, "data_dir_total_bytes", "Size in bytes of the data directory's filesystem");
        let partitions = gauge(&mut registry, "partitions", "Partition logs hosted on this node");
        let offline_partitions =
            gauge(&mut registry, "offline_partitions", "Hosted partitions offline after a storage error");
        let leader_partitions = gauge(&mut registry, "leader_partitions", "Partitions this node leads");
        let under_replicated_partitions = gauge(
            &mut registry,
            "under_replicated_partitions",
            "Partitions led here whose ISR is smaller than their replica set",
        );
        let fetch_sessions = gauge(&mut registry, "fetch_sessions", "Fetch sessions (KIP-227) cached");
        let produce_memory_bytes =
            gauge(&mut registry, "produce_memory_bytes", "Produce request bytes held while awaiting durability");
        let queued_request_bytes = gauge(
            &mut registry,
            "queued_request_bytes",
            "Request bytes admitted and not yet answered, of queued_max_request_bytes (produce included)",
        );
        let segment_tail_memory_bytes = gauge(
            &mut registry,
            "segment_tail_memory_bytes",
            "Memory of the active segments' tails: their newest bytes, read by tailing consumers and written to the segment files with direct I/O",
        );
        let segment_tail_written_bytes = counters::<WriteModeLabels>(&mut registry, "segment_tail_written_bytes", "Bytes the segments' tails wrote to their files, by how: direct (direct I/O) or page_cache (log_segment_direct_io off, a filesystem without O_DIRECT, or a batch that found the tails' memory full)");
        let segment_tail_full_appends = counter(&mut registry, "segment_tail_full_appends", "Batches appended through the page cache on the request path because the tails' memory (tail_memory_bytes_max) was full; each also wrote what its segment's tail held");
        let segment_files_open = gauge(
            &mut registry,
            "segment_files_open",
            "Segment files held open under the budget of SEALED_SEGMENT_FILES_OPEN_MAX (sealed segments, idle partitions' active ones; active segments taking writes are not counted)",
        );
        let active_controller =
            gauge(&mut registry, "active_controller", "1 when this node is the active controller (a single node is)");
        let tiered = TieredMetrics::default();
        register_tiered(&mut registry, &tiered);
        let remote_log_size_bytes = gauge(
            &mut registry,
            "remote_log_size_bytes",
            "Bytes in the object store of the tiered partitions this node leads",
        );
        let sendfile_bytes = counter(
            &mut registry,
            "fetch_sendfile_bytes",
            "Record bytes of fetch responses sent from the page cache without a copy (sendfile, plaintext listeners)",
        );
        let fetch_disk_reads = counter(&mut registry, "fetch_disk_reads", "Fetches read on the blocking pool because some of their data was not in the page cache or the tails' memory");
        let mut process = Registry::default();
        process.register_collector(Box::new(ProcessCollector));
        Metrics {
            registry,
            process,
            scraping: parking_lot::Mutex::new(()),
            apis,
            requests,
            request_seconds,
            produce_bytes,
            produce_records,
            fetch_bytes,
            topics: RwLock::new(HashMap::new()),
            fsync_seconds,
            load: LoadTotals::new(),
            connections,
            connections_refused,
            connections_closed,
            throttled_produce,
            throttled_fetch,
            throttled_request_time,
            isr_shrinks,
            isr_expands,
            isr_seen: parking_lot::Mutex::new((0, 0)),
            group_lag,
            partition_size,
            partition_size_omitted,
            data_dir_free_bytes,
            data_dir_total_bytes,
            partitions,
            offline_partitions,
            leader_partitions,
            under_replicated_partitions,
            fetch_sessions,
            produce_memory_bytes,
            queued_request_bytes,
            segment_tail_memory_bytes,
            segment_tail_written_bytes,
            segment_tail_full_appends,
            segment_files_open,
            active_controller,
            tiered,
            remote_log_size_bytes,
            sendfile_bytes,
            fetch_disk_reads,
        }
    }

    /// Counts one answered request of API `api_key` that took `elapsed`; the API's first
    /// request creates its series.
    pub(crate) fn request_done(&self, api_key: i16, elapsed: Duration) {
        self.load.request_done(api_key, elapsed);
        if let Some(Some(slot)) = self.apis.get(api_key as usize) {
            let api = slot.handles.get_or_init(|| ApiMetrics {
                requests: self.requests.get_or_create_owned(&slot.labels),
                seconds: self.request_seconds.get_or_create_owned(&slot.labels),
            });
            api.requests.inc();
            api.seconds.observe(elapsed.as_secs_f64());
        }
    }

    fn topic(&self, topic: &str) -> TopicCounters {
        if let Some(handles) = self.topics.read().get(topic) {
            return handles.clone();
        }
        let labels = TopicLabels { topic: topic.to_string() };
        let handles = TopicCounters {
            produce_bytes: self.produce_bytes.get_or_create_owned(&labels),
            produce_records: self.produce_records.get_or_create_owned(&labels),
            fetch_bytes: self.fetch_bytes.get_or_create_owned(&labels),
        };
        self.topics.write().entry(topic.to_string()).or_insert(handles).clone()
    }

    pub(crate) fn produced(&self, topic: &str, bytes: u64, records: u64) {
        if bytes > 0 {
            self.load.produced(bytes);
            let counters = self.topic(topic);
            counters.produce_bytes.inc_by(bytes);
            counters.produce_records.inc_by(records);
        }
    }

    pub(crate) fn fetched(&self, topic: &str, bytes: u64) {
        if bytes > 0 {
            self.load.fetched(bytes);
            self.topic(topic).fetch_bytes.inc_by(bytes);
        }
    }

    /// This node's byte and latency totals since it started (the console's load charts).
    pub(crate) fn load_totals(&self) -> sluice_console::NodeTotals {
        self.load.read()
    }

    /// What the syncer reports after each fsync.
    pub(crate) fn fsync_observer(&self) -> sluice_storage::FsyncObserver {
        let fsync_seconds = self.fsync_seconds.clone();
        Box::new(move |elapsed| fsync_seconds.observe(elapsed.as_secs_f64()))
    }

    pub(crate) fn connection_opened(&self) {
        self.connections.inc();
    }

    pub(crate) fn throttled(&self, kind: sluice_security::quota::QuotaKind) {
        match kind {
            sluice_security::quota::QuotaKind::Produce => self.throttled_produce.inc(),
            sluice_security::quota::QuotaKind::Fetch => self.throttled_fetch.inc(),
            sluice_security::quota::QuotaKind::Request => self.throttled_request_time.inc(),
        };
    }

    pub(crate) fn connection_closed(&self) {
        self.connections.dec();
    }

    /// Counts a connection refused at accept (`reason`: the limit).
    pub(crate) fn connection_refused(&self, reason: &'static str) {
        self.connections_refused.get_or_create(&ReasonLabels { reason }).inc();
    }

    /// Counts a connection the broker closed to protect itself, for `reason`.
    pub(crate) fn connection_closed_for(&self, reason: &'static str) {
        self.connections_closed.get_or_create(&ReasonLabels { reason }).inc();
    }

    /// The scrape: state gauges computed now, then everything in Prometheus' text format.
    fn render(&self, broker: &Broker) -> String {
        let _scraping = self.scraping.lock();
        let hosted = broker.logs.partitions();
        self.partition_sizes(hosted.iter().map(|(tp, log)| (tp.topic.as_str(), tp.partition, log.size_bytes())));
        match disk_space(&broker.config.data_dir) {
            Ok((free, total)) => {
                self.data_dir_free_bytes.set(free as i64);
                self.data_dir_total_bytes.set(total as i64);
            }
            Err(error) => tracing::debug!(%error, "statvfs of the data dir failed"),
        }
        self.partitions.set(hosted.len() as i64);
        self.offline_partitions.set(hosted.iter().filter(|(_, log)| log.is_offline()).count() as i64);
        let (leading, under_replicated) = match &broker.replicas {
            None => (hosted.len(), 0),
            Some(replicas) => replicas.hosted().iter().fold((0, 0), |(leading, under), (_, replica)| {
                match replica.under_replicated() {
                    Some(short) => (leading + 1, under + usize::from(short)),
                    None => (leading, under),
                }
            }),
        };
        self.leader_partitions.set(leading as i64);
        self.under_replicated_partitions.set(under_replicated as i64);
        self.fetch_sessions.set(broker.fetch_sessions.len() as i64);
        if let Some(tiered) = &broker.tiered {
            self.remote_log_size_bytes.set(tiered.led_remote_bytes(broker) as i64);
        }
        let (queued, produce_memory) = broker.request_memory.held();
        self.produce_memory_bytes.set(produce_memory as i64);
        self.queued_request_bytes.set(queued as i64);
        self.segment_tail_memory_bytes.set(sluice_storage::tail_memory_bytes() as i64);
        let (direct, page_cache) = sluice_storage::tail_written_bytes();
        for (mode, total) in [("direct", direct), ("page_cache", page_cache)] {
            let counter = self.segment_tail_written_bytes.get_or_create(&WriteModeLabels { mode });
            // The storage's totals only grow: the counter follows them.
            counter.inc_by(total.saturating_sub(counter.get()));
        }
        let full_appends = sluice_storage::tail_full_appends();
        self.segment_tail_full_appends.inc_by(full_appends.saturating_sub(self.segment_tail_full_appends.get()));
        self.segment_files_open.set(sluice_storage::sealed_files_open() as i64);
        let active = match &broker.cluster {
            None => true,
            Some(cluster) => {
                cluster.controller().and_then(|c| c.active_controller()).is_some_and(|id| id == broker.node_id())
            }
        };
        self.active_controller.set(i64::from(active));
        {
            use std::sync::atomic::Ordering::Relaxed;
            let mut seen = self.isr_seen.lock();
            let now = (sluice_replication::ISR_SHRINKS.load(Relaxed), sluice_replication::ISR_EXPANDS.load(Relaxed));
            self.isr_shrinks.inc_by(now.0 - seen.0);
            self.isr_expands.inc_by(now.1 - seen.1);
            *seen = now;
        }
        let mut lags: std::collections::HashMap<GroupTopicLabels, i64> = std::collections::HashMap::new();
        for (group, topic, partition, committed) in broker.groups.committed_offsets(GROUP_LAG_OFFSETS_MAX) {
            let Some(log) = broker.partition(&topic, partition) else { continue };
            let lag = (log.offsets().high_watermark - committed).max(0);
            *lags.entry(GroupTopicLabels { group, topic }).or_default() += lag;
        }
        self.group_lag.clear();
        for (labels, lag) in lags {
            self.group_lag.get_or_create(&labels).set(lag);
        }
        self.encode()
    }

    /// Both registries in Prometheus' text format, then its end marker.
    fn encode(&self) -> String {
        use prometheus_client::encoding::text::{encode_eof, encode_registry};
        let mut text = String::new();
        encode_registry(&mut text, &self.registry).expect("writing to a String");
        encode_registry(&mut text, &self.process).expect("writing to a String");
        encode_eof(&mut text).expect("writing to a String");
        text
    }

    /// Sets the partition size gauges from `(topic, partition, bytes)`: the largest
    /// `PARTITION_SIZE_SERIES_MAX`, and how many others were left out.
    fn partition_sizes<'a>(&self, sizes: impl Iterator<Item = (&'a str, i32, u64)>) {
        let mut sizes: Vec<_> = sizes.collect();
        let omitted = sizes.len().saturating_sub(PARTITION_SIZE_SERIES_MAX);
        if omitted > 0 {
            sizes.select_nth_unstable_by(PARTITION_SIZE_SERIES_MAX - 1, |a, b| b.2.cmp(&a.2));
            sizes.truncate(PARTITION_SIZE_SERIES_MAX);
        }
        self.partition_size.clear();
        for (topic, partition, bytes) in sizes {
            self.partition_size
                .get_or_create(&PartitionLabels { topic: topic.to_string(), partition })
                .set(bytes as i64);
        }
        self.partition_size_omitted.set(omitted as i64);
    }
}

/// Bytes available to the broker and in all on `dir`'s filesystem.
fn disk_space(dir: &Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    // SAFETY: statvfs writes into the zeroed struct we own; `path` is a valid C string.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut stat) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let block = stat.f_frsize as u64;
    Ok((stat.f_bavail as u64 * block, stat.f_blocks as u64 * block))
}

/// The `process_*` series of Prometheus' client libraries, read from `/proc` at each
/// scrape. Where `/proc` cannot be read a series is left out rather than reported as 0.
#[derive(Debug)]
struct ProcessCollector;

/// What `/proc` says of this process.
#[derive(Debug, Default, PartialEq)]
struct ProcessFigures {
    cpu_seconds: Option<f64>,
    start_time_seconds: Option<f64>,
    resident_memory_bytes: Option<u64>,
    virtual_memory_bytes: Option<u64>,
    open_fds: Option<u64>,
    max_fds: Option<u64>,
}

impl ProcessFigures {
    fn read() -> ProcessFigures {
        // SAFETY: sysconf only reads process-wide settings.
        let (ticks, page) = unsafe { (libc::sysconf(libc::_SC_CLK_TCK), libc::sysconf(libc::_SC_PAGESIZE)) };
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit writes into the struct we own.
        let max_fds = (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0).then_some(limit.rlim_cur);
        let boot_time = std::fs::read_to_string("/proc/stat").ok().and_then(|stat| boot_time_seconds(&stat));
        let mut figures = ProcessFigures {
            open_fds: std::fs::read_dir("/proc/self/fd").ok().map(|dir| dir.count() as u64),
            max_fds,
            ..ProcessFigures::default()
        };
        if let (Ok(stat), Ok(statm)) =
            (std::fs::read_to_string("/proc/self/stat"), std::fs::read_to_string("/proc/self/statm"))
        {
            figures.read_stat(&stat, &statm, ticks, page, boot_time);
        }
        figures
    }

    /// Takes the figures of `/proc/self/stat` and `/proc/self/statm` (proc(5)), with the
    /// clock ticks per second, the page size and the boot time in Unix seconds.
    fn read_stat(&mut self, stat: &str, statm: &str, ticks: i64, page: i64, boot_time: Option<u64>) {
        // The command name, in parentheses, may hold spaces and parentheses itself: the
        // fields after its last ')' start at the third of proc(5), the state.
        let fields: Vec<&str> =
            stat.rfind(')').map(|end| stat[end + 1..].split_whitespace().collect()).unwrap_or_default();
        let field = |number: usize| fields.get(number - 3).and_then(|f| f.parse::<u64>().ok());
        if ticks > 0 {
            let ticks = ticks as f64;
            if let (Some(user), Some(system)) = (field(14), field(15)) {
                self.cpu_seconds = Some((user + system) as f64 / ticks);
            }
            if let (Some(started), Some(boot)) = (field(22), boot_time) {
                self.start_time_seconds = Some(boot as f64 + started as f64 / ticks);
            }
        }
        let pages: Vec<u64> = statm.split_whitespace().map_while(|f| f.parse().ok()).collect();
        if page > 0 && pages.len() >= 2 {
            self.virtual_memory_bytes = Some(pages[0] * page as u64);
            self.resident_memory_bytes = Some(pages[1] * page as u64);
        }
    }
}

/// The `btime` line of `/proc/stat`: when the system booted, in Unix seconds.
fn boot_time_seconds(stat: &str) -> Option<u64> {
    stat.lines().find_map(|line| line.strip_prefix("btime ")).and_then(|t| t.trim().parse().ok())
}

/// Writes one series named `name` (no prefix) holding `metric`.
fn encode_one(encoder: &mut DescriptorEncoder, name: &str, help: &str, metric: impl EncodeMetric) -> std::fmt::Result {
    let metric_encoder = encoder.encode_descriptor(name, help, None, metric.metric_type())?;
    metric.encode(metric_encoder)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let figures = ProcessFigures::read();
        if let Some(seconds) = figures.cpu_seconds {
            encode_one(
                &mut encoder,
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                ConstCounter::new(seconds),
            )?;
        }
        let gauges = [
            ("process_resident_memory_bytes", "Resident memory size in bytes", figures.resident_memory_bytes),
            ("process_virtual_memory_bytes", "Virtual memory size in bytes", figures.virtual_memory_bytes),
            ("process_open_fds", "Number of open file descriptors", figures.open_fds),
            ("process_max_fds", "Maximum number of open file descriptors", figures.max_fds),
        ];
        for (name, help, value) in gauges {
            if let Some(value) = value {
                encode_one(&mut encoder, name, help, ConstGauge::new(value))?;
            }
        }
        if let Some(seconds) = figures.start_time_seconds {
            encode_one(
                &mut encoder,
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
                ConstGauge::new(seconds),
            )?;
        }
        Ok(())
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `listener` until the process ends.
pub(crate) async fn serve(broker: Arc<Broker>, listener: TcpListener) {
    let limits = sluice_http::HttpLimits {
        connections_max: METRICS_CONNECTIONS_MAX,
        header_read_timeout: METRICS_HEADER_READ_TIMEOUT,
        // The metrics port serves plain HTTP only.
        tls_handshake_timeout: METRICS_HEADER_READ_TIMEOUT,
    };
    let service = tower::service_fn(move |request: Request<Incoming>| {
        let broker = broker.clone();
        async move { Ok::<_, Infallible>(answer(&broker, &request)) }
    });
    sluice_http::serve(listener, service, None, limits, "metrics").await
}

fn answer(broker: &Broker, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, content_type: &str, body: String| {
        Response::builder()
            .status(status)
            .header("content-type", content_type)
            .body(Full::new(Bytes::from(body)))
            .expect("a valid response")
    };
    if request.method() != Method::GET {
        return reply(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "GET only\n".into());
    }
    match request.uri().path() {
        "/metrics" => reply(
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            broker.metrics.render(broker),
        ),
        "/healthz" => reply(StatusCode::OK, "text/plain", "ok\n".into()),
        "/readyz" => match broker.not_ready() {
            None => reply(StatusCode::OK, "text/plain", "ready\n".into()),
            Some(why) => reply(StatusCode::SERVICE_UNAVAILABLE, "text/plain", format!("{why}\n")),
        },
        _ => reply(StatusCode::NOT_FOUND, "text/plain", "not found: try /metrics, /healthz or /readyz\n".into()),
    }
}

/// Counts live connections for the `connections` gauge without holding the metrics.
pub(crate) struct ConnectionGuard(pub(crate) Arc<Broker>);

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        self.0.metrics.connection_closed();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_api_has_series_once_it_has_been_called() {
        let metrics = Metrics::new();
        let page = metrics.encode();
        assert!(!page.contains("sluice_requests_total"), "{page}");
        assert!(!page.contains("sluice_request_duration_seconds"), "{page}");
        metrics.request_done(3, Duration::from_millis(2));
        metrics.request_done(3, Duration::from_millis(4));
        let page = metrics.encode();
        assert!(page.contains("sluice_requests_total{api=\"Metadata\"} 2\n"), "{page}");
        assert!(page.contains("sluice_request_duration_seconds_count{api=\"Metadata\"} 2\n"), "{page}");
        assert!(!page.contains("sluice_requests_total{api=\"Produce\"}"), "{page}");
        assert!(!page.contains("sluice_request_duration_seconds_count{api=\"Produce\"}"), "{page}");
        assert!(page.contains(&format!("sluice_build_info{{version=\"{}\"}} 1\n", env!("CARGO_PKG_VERSION"))));
        assert!(page.ends_with("# EOF\n"));
    }

    #[test]
    fn the_largest_partitions_sizes_are_exported_and_the_others_counted() {
        let metrics = Metrics::new();
        let names: Vec<String> = (0..PARTITION_SIZE_SERIES_MAX + 2).map(|i| format!("t{i}")).collect();
        metrics.partition_sizes(names.iter().enumerate().map(|(i, name)| (name.as_str(), 0, i as u64)));
        let page = metrics.encode();
        assert!(page.contains("sluice_partition_size_series_omitted 2\n"));
        assert!(!page.contains("topic=\"t0\"") && !page.contains("topic=\"t1\""));
        let largest = PARTITION_SIZE_SERIES_MAX + 1;
        assert!(
            page.contains(&format!("sluice_partition_size_bytes{{topic=\"t{largest}\",partition=\"0\"}} {largest}\n"))
        );
        assert_eq!(page.matches("sluice_partition_size_bytes{").count(), PARTITION_SIZE_SERIES_MAX);
    }

    #[test]
    fn process_figures_come_from_proc() {
        let stat = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 500 0 0 0 250 150 0 0 20 0 8 0 1000 \
                    123456789 3000 18446744073709551615";
        let mut figures = ProcessFigures::default();
        figures.read_stat(stat, "30141 3000 1200 100 0 2000 0\n", 100, 4096, Some(1_700_000_000));
        assert_eq!(figures.cpu_seconds, Some(4.0));
        assert_eq!(figures.start_time_seconds, Some(1_700_000_010.0));
        assert_eq!(figures.virtual_memory_bytes, Some(30141 * 4096));
        assert_eq!(figures.resident_memory_bytes, Some(3000 * 4096));
        assert_eq!(boot_time_seconds("cpu  1 2 3\nbtime 1700000000\nprocesses 9\n"), Some(1_700_000_000));
        let live = ProcessFigures::read();
        assert!(live.resident_memory_bytes.is_some_and(|bytes| bytes > 0), "{live:?}");
        assert!(live.open_fds.is_some_and(|fds| fds > 0), "{live:?}");
    }
}
