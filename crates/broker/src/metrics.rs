//! Prometheus metrics and health checks: `GET /metrics` (Prometheus text format),
//! `/healthz` (the process serves) and `/readyz` (it can take client traffic), on the
//! address from `metrics_listen` (`--metrics-listen`; off when unset).
//!
//! Why this shape: the hot paths touch only pre-created handles (per API: a counter and a
//! latency histogram, indexed by API key; per topic: byte counters found by `&str` without
//! allocating), never a label lookup that allocates. Gauges that describe state (partitions,
//! connections, fetch sessions, under-replicated partitions, controller role) are computed
//! when scraped, so no code path has to keep them up to date.
//!
//! The listener serves at most `METRICS_CONNECTIONS_MAX` connections; one more closes the
//! oldest, and one that sends no request for `METRICS_HEADER_READ_TIMEOUT_MS` is closed: an
//! operator's scrape or a probe gets through however many idle connections others hold.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use parking_lot::RwLock;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
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
    apis: Vec<Option<ApiMetrics>>,
    produce_bytes: Family<TopicLabels, Counter>,
    produce_records: Family<TopicLabels, Counter>,
    fetch_bytes: Family<TopicLabels, Counter>,
    /// Per-topic handles, found without allocating.
    topics: RwLock<HashMap<String, TopicCounters>>,
    fsync_seconds: Histogram,
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

/// Each advertised API's request counter and duration histogram, by API key.
fn api_metrics(registry: &mut Registry) -> Vec<Option<ApiMetrics>> {
    let requests = Family::<ApiLabels, Counter>::default();
    let request_seconds = Family::<ApiLabels, Histogram>::new_with_constructor(|| histogram(REQUEST_SECONDS_BUCKETS));
    registry.register("requests", "Requests handled, by Kafka API", requests.clone());
    registry.register(
        "request_duration_seconds",
        "Time from a request's arrival to its answer, by Kafka API",
        request_seconds.clone(),
    );
    let mut apis = vec![None; API_KEYS_MAX];
    for (api, _, _) in sluice_protocol::ADVERTISED_APIS {
        let labels = ApiLabels { api: format!("{api:?}").trim_end_matches("Key").to_string() };
        let index = *api as i16 as usize;
        assert!(index < API_KEYS_MAX, "API key {api:?} has no metrics slot");
        apis[index] = Some(ApiMetrics {
            requests: requests.get_or_create_owned(&labels),
            seconds: request_seconds.get_or_create_owned(&labels),
        });
    }
    apis
}

impl Metrics {
    pub(crate) fn new() -> Metrics {
        let mut registry = Registry::with_prefix("sluice");
        let apis = api_metrics(&mut registry);
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
        let segment_tail_full_appends = counter(&mut registry, "segment_tail_full_appends", "Batches appended through the page cache on the request path because the tails' memory (TAIL_MEMORY_BYTES_MAX) was full; each also wrote what its segment's tail held");
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
        Metrics {
            registry,
            apis,
            produce_bytes,
            produce_records,
            fetch_bytes,
            topics: RwLock::new(HashMap::new()),
            fsync_seconds,
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

    /// Counts one answered request of API `api_key` that took `elapsed`.
    pub(crate) fn request_done(&self, api_key: i16, elapsed: Duration) {
        if let Some(Some(api)) = self.apis.get(api_key as usize) {
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
            let counters = self.topic(topic);
            counters.produce_bytes.inc_by(bytes);
            counters.produce_records.inc_by(records);
        }
    }

    pub(crate) fn fetched(&self, topic: &str, bytes: u64) {
        if bytes > 0 {
            self.topic(topic).fetch_bytes.inc_by(bytes);
        }
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
        let hosted = broker.logs.partitions();
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
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).expect("writing to a String");
        text
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
