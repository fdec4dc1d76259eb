//! One workload against one driver: OMB's run phases.
//!
//! 1. Topics are created with the admin API (earlier `test-topic-*` topics deleted first
//!    when the driver says `reset: true`).
//! 2. Consumers, then producers, each its own client.
//! 3. Readiness: every producer sends one message; the run waits until every
//!    subscription received them.
//! 4. Load: each producer paces its sends with intended times; warm-up samples are
//!    printed and discarded; the latency histograms start empty for the measured phase
//!    (counters keep running, as upstream).
//! 5. With `consumerBacklogSizeGB`, consumers pause until the backlog reaches the size,
//!    then resume; the measured phase lasts until the backlog is drained plus the test
//!    duration. The producers' latency is also kept per backlog phase (build, drain, tail:
//!    `sluice.backlogPhases`), split exactly where the phase changes (the clients'
//!    histograms are drained at that tick, not at the next sample), because the
//!    catch-up criterion compares the producers' p99 during the drain with the p99 before
//!    it, and a whole-run percentile mixes the two. Each phase also records the broker's
//!    disk reads (`/proc/PID/io`), which tell a cold catch-up read from a cached one.
//! 6. With `producerRate: 0`, OMB's [`RateController`] adjusts the rate every 3 s.
//!
//! With a transactional driver (`requestsPerTransaction`) every producer gets its own
//! `transactional.id` (`<prefix>-producer-T-P`) and the collector also reports committed
//! transactions per second and commit latency; end-to-end latency then includes the wait
//! for the commit, as consumers read committed records only (librdkafka's default
//! `isolation.level=read_committed`, which the transactional drivers also spell out).
//!
//! A queue workload (a `queue` section, see [`crate::workload::QueueSpec`]) makes each
//! subscription a share group: `share.auto.offset.reset=earliest` is set on the group
//! (IncrementalAlterConfigs) before its members join, so the readiness probes are
//! delivered whatever the order of joins and probes, and the consumers are
//! [`crate::share`]'s, which work each record and accept it. The result then has the
//! acknowledgement rate, redeliveries and acknowledgement errors (`sluice.queue`).
//!
//! The collector (this thread) drains every client's period histograms once per sample,
//! prints OMB's one-line summary and appends the sample to the [`TestResult`].

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::driver::LoadedDriver;
use crate::kafka::{
    self, monotonic_ns, ConsumerControl, ConsumerMode, ConsumerSpec, ProducerControl, ProducerSpec, TransactionSpec,
    XorShift, KEY_POOL_SIZE,
};
use crate::neighbour::{Neighbour, NeighbourPlan};
use crate::procstat::{self, MachineSampler, ProcessSampler};
use crate::rate::{RateController, RateControllerConfig};
use crate::result::{
    BacklogPhases, PhaseFigures, QueueFigures, SampleRates, SluiceExtras, TestResult, TransactionFigures,
};
use crate::share::{QueueCounters, QueueStats, ShareConsumerSpec};
use crate::stats::{total_counters, ClientStats, Counters, LatencySet, Summary};
use crate::workload::{LoadedWorkload, Workload};

/// How the runner picks the consumer mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ConsumerModeChoice {
    /// Subscribe when the broker lists the group APIs, else assign.
    #[default]
    Auto,
    /// Always consumer groups.
    Subscribe,
    /// Always assign partitions directly.
    Assign,
}

/// Knobs of one run that are not in the OMB files.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Overrides the driver's `bootstrap.servers`.
    pub bootstrap: Option<String>,
    /// Consumer mode.
    pub consumer_mode: ConsumerModeChoice,
    /// Overrides `testDurationMinutes`.
    pub test_duration: Option<Duration>,
    /// Overrides `warmupDurationMinutes`.
    pub warmup_duration: Option<Duration>,
    /// Overrides the sample period.
    pub sample_period: Option<Duration>,
    /// Overrides `producerRate` (msg/s, 0 = discover).
    pub producer_rate: Option<f64>,
    /// Broker processes to measure (CPU seconds, peak RSS; summed over a cluster's nodes).
    pub broker_pids: Vec<u32>,
    /// Broker name for the result (`sluice`, `kafka`).
    pub broker_label: Option<String>,
    /// Caps the replication factor (default: the broker count).
    pub replication_factor_max: Option<i32>,
    /// Client settings added to the driver's common config (e.g. TLS).
    pub client_settings: Vec<(String, String)>,
    /// A noisy neighbour during the run ([`crate::neighbour`]).
    pub neighbour: Option<NeighbourPlan>,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            bootstrap: None,
            consumer_mode: ConsumerModeChoice::Auto,
            test_duration: None,
            warmup_duration: None,
            sample_period: None,
            producer_rate: None,
            broker_pids: Vec::new(),
            broker_label: None,
            replication_factor_max: None,
            client_settings: Vec::new(),
            neighbour: None,
        }
    }
}

/// Prefix of every topic the bench creates (as OMB's Kafka driver).
pub const TOPIC_PREFIX: &str = "test-topic";
/// How long the readiness probe may take.
const READINESS_TIMEOUT: Duration = Duration::from_secs(60);
/// Rate discovery period (OMB's).
const RATE_CONTROL_PERIOD: Duration = Duration::from_secs(3);
/// The collector's tick.
const TICK: Duration = Duration::from_millis(100);
/// Rate discovery starts here (OMB's).
const DISCOVERY_RATE_START: f64 = 10_000.0;
/// When a run ends, the producers stop first and the consumers get up to this long to
/// receive what was sent: the run's last records are read rather than cut off with the
/// producers (what a broker's fetch counters show then matches what it took).
const CONSUMER_CATCH_UP_AT_STOP: Duration = Duration::from_secs(2);
/// Prefix of generated transactional ids when the driver names none.
const TRANSACTIONAL_ID_PREFIX_DEFAULT: &str = "sluice-bench";

/// What transactional producers are asked to do.
#[derive(Debug, Clone)]
struct Transactions {
    /// Each producer's id is `<prefix>-<producer label>`.
    id_prefix: String,
    /// Records per transaction.
    records: u32,
}

struct Clients {
    producer_stats: Vec<Arc<ClientStats>>,
    consumer_stats: Vec<Arc<ClientStats>>,
    producer_control: Arc<ProducerControl>,
    consumer_control: Arc<ConsumerControl>,
    handles: Vec<JoinHandle<()>>,
    producers_count: usize,
    expected_probe_messages: u64,
    /// Subscriptions per topic: how many times each sent message is to be received.
    subscriptions: u64,
    /// The share consumers' totals (queue workloads only).
    queue_stats: Option<Arc<QueueStats>>,
}

impl Clients {
    fn counters(&self) -> Counters {
        total_counters(self.producer_stats.iter().chain(self.consumer_stats.iter()).map(|s| s.as_ref()))
    }

    fn drain_period(&self) -> LatencySet {
        let mut period = LatencySet::default();
        self.drain_period_into(&mut period);
        period
    }

    fn drain_period_into(&self, period: &mut LatencySet) {
        for stats in self.producer_stats.iter().chain(self.consumer_stats.iter()) {
            stats.drain_period_into(period);
        }
    }

    fn queue_counters(&self) -> QueueCounters {
        self.queue_stats.as_ref().map(|stats| stats.counters()).unwrap_or_default()
    }

    fn set_total_rate(&self, total_rate: f64) {
        let per_producer = total_rate / self.producers_count.max(1) as f64;
        self.producer_control.set_rate(per_producer.max(0.001));
    }

    fn stop(self) {
        self.producer_control.stop.store(true, Ordering::Relaxed);
        let catch_up_until = Instant::now() + CONSUMER_CATCH_UP_AT_STOP;
        while self.counters().backlog(self.subscriptions) > 0 && Instant::now() < catch_up_until {
            std::thread::sleep(TICK);
        }
        self.consumer_control.stop.store(true, Ordering::Relaxed);
        for handle in self.handles {
            let _ = handle.join();
        }
    }
}

/// Runs `loaded` against `driver`; returns OMB's result.
pub fn run_workload(
    loaded: &LoadedWorkload,
    driver: &LoadedDriver,
    options: &RunOptions,
) -> anyhow::Result<TestResult> {
    let workload = &loaded.workload;
    for warning in loaded.warnings.iter().chain(driver.warnings.iter()) {
        println!("warning: {warning}");
    }
    if workload.consumer_only {
        bail!("consumerOnly workloads are not supported yet");
    }
    let mut driver_settings = driver.driver.clone();
    if let Some(bootstrap) = &options.bootstrap {
        driver_settings.set_bootstrap(bootstrap);
    }
    for (key, value) in &options.client_settings {
        driver_settings.common_config.retain(|(existing, _)| existing != key);
        driver_settings.common_config.push((key.clone(), value.clone()));
    }
    let bootstrap = driver_settings.common_setting("bootstrap.servers").unwrap_or("127.0.0.1:9092").to_string();
    // The probe speaks plaintext Kafka: over TLS or SASL it could not, so groups it is.
    let secured =
        driver_settings.common_setting("security.protocol").is_some_and(|p| !p.eq_ignore_ascii_case("PLAINTEXT"));
    let choice = if secured && options.consumer_mode == ConsumerModeChoice::Auto {
        ConsumerModeChoice::Subscribe
    } else {
        options.consumer_mode
    };
    let mode = match &workload.queue {
        Some(_) => {
            crate::share::check_share_support(&bootstrap)?;
            ConsumerMode::Share
        }
        None => pick_consumer_mode(choice, &bootstrap),
    };
    println!(
        "Running workload `{}` with driver `{}` against {bootstrap} (consumers: {})",
        workload.name,
        driver_settings.name,
        mode.as_str()
    );

    let mut warnings = Vec::new();
    let common = kafka::client_config(&driver_settings.common_config, &mut warnings);
    let mut producer_props = driver_settings.common_config.clone();
    producer_props.extend(driver_settings.producer_config.iter().cloned());
    let producer_config = kafka::client_config(&producer_props, &mut warnings);
    let mut consumer_props = driver_settings.common_config.clone();
    consumer_props.extend(driver_settings.consumer_config.iter().cloned());
    let consumer_config = kafka::client_config(&consumer_props, &mut warnings);
    for warning in &warnings {
        println!("warning: {warning}");
    }

    let topics = create_topics(workload, &driver_settings, &common, options)?;
    let payloads = Arc::new(load_payloads(loaded)?);
    let mut random = XorShift::seeded(7);
    let keys = Arc::new((0..KEY_POOL_SIZE).map(|_| random.string(7)).collect::<Vec<_>>());
    // A fresh prefix per run unless the driver names one, so that a run never fences, nor
    // is fenced by, the producers of another run against the same broker.
    let transactions = driver_settings.records_per_transaction.map(|records| Transactions {
        id_prefix: driver_settings
            .transactional_id_prefix()
            .map(str::to_string)
            .unwrap_or_else(|| format!("{TRANSACTIONAL_ID_PREFIX_DEFAULT}-{}", random.string(7))),
        records,
    });
    if let Some(transactions) = &transactions {
        println!(
            "Transactions: {} records each, ids {}-producer-*; consumers' isolation.level {}",
            transactions.records,
            transactions.id_prefix,
            driver_settings.isolation_level()
        );
    }

    let mut clients = Clients {
        producer_stats: Vec::new(),
        consumer_stats: Vec::new(),
        producer_control: Arc::new(ProducerControl::default()),
        consumer_control: Arc::new(ConsumerControl::default()),
        handles: Vec::new(),
        producers_count: 0,
        expected_probe_messages: 0,
        subscriptions: u64::from(workload.subscriptions_per_topic),
        queue_stats: workload.queue.as_ref().map(|_| Arc::new(QueueStats::default())),
    };
    let producers = ProducerTemplate { config: &producer_config, payloads, keys, transactions: transactions.as_ref() };
    let consumers = ConsumerTemplate { mode, config: &consumer_config, bootstrap: &bootstrap };
    let started = start_clients(workload, &topics, &consumers, &producers, &mut clients);
    if let Err(error) = started.and_then(|()| wait_ready(&clients)) {
        clients.stop();
        return Err(error);
    }
    let outcome = run_phases(workload, options, &clients, mode, transactions.as_ref().map(|t| t.records));
    clients.stop();
    let mut result = outcome?;
    result.driver = driver_settings.name.clone();
    Ok(result)
}

fn pick_consumer_mode(choice: ConsumerModeChoice, bootstrap: &str) -> ConsumerMode {
    match choice {
        ConsumerModeChoice::Subscribe => ConsumerMode::Subscribe,
        ConsumerModeChoice::Assign => ConsumerMode::Assign,
        ConsumerModeChoice::Auto => match kafka::broker_has_consumer_groups(bootstrap) {
            Ok(true) => ConsumerMode::Subscribe,
            Ok(false) => {
                println!("broker lists no consumer-group APIs: consumers assign partitions directly");
                ConsumerMode::Assign
            }
            Err(error) => {
                println!("warning: ApiVersions probe failed ({error:#}); using consumer groups");
                ConsumerMode::Subscribe
            }
        },
    }
}

fn create_topics(
    workload: &Workload,
    driver: &crate::driver::Driver,
    common: &rdkafka::ClientConfig,
    options: &RunOptions,
) -> anyhow::Result<Vec<(String, u32)>> {
    let admin = kafka::Admin::connect(common)?;
    let (brokers_count, existing) = admin.metadata()?;
    if driver.reset {
        let old: Vec<String> = existing.into_iter().filter(|name| name.starts_with(TOPIC_PREFIX)).collect();
        for problem in admin.delete_topics(&old) {
            println!("warning: {problem}");
        }
    }
    let cap = options.replication_factor_max.unwrap_or(brokers_count.max(1) as i32);
    let replication_factor = driver.replication_factor.min(cap).max(1);
    if replication_factor != driver.replication_factor {
        println!(
            "warning: replicationFactor {} lowered to {replication_factor} ({brokers_count} broker(s))",
            driver.replication_factor
        );
    }
    let mut random = XorShift::seeded(11);
    let suffix = random.string(7);
    let mut topic_config = driver.topic_config.clone();
    if options.broker_label.as_deref() == Some("kafka") && driver.topic_config.iter().any(|(k, _)| is_tiering(k)) {
        // Apache Kafka ships no RemoteStorageManager: its side of a comparison runs the
        // same topic untiered (all of it on local disk).
        println!("note: Kafka runs the topic without tiered storage (it ships no remote storage plugin)");
        topic_config.retain(|(key, _)| !is_tiering(key));
    }
    for (key, value) in topic_config.iter_mut() {
        let asked: Option<i32> = value.parse().ok();
        if key == "min.insync.replicas" && asked.is_some_and(|n| n > replication_factor) {
            println!("warning: min.insync.replicas {value} lowered to {replication_factor}");
            *value = replication_factor.to_string();
        }
    }
    let topics: Vec<(String, u32)> = (0..workload.topics as usize)
        .map(|index| (format!("{TOPIC_PREFIX}-{index:07}-{suffix}"), workload.partitions_of(index)))
        .collect();
    let started = Instant::now();
    admin.create_topics(&topics, replication_factor, &topic_config)?;
    println!("Created {} topics in {} ms", topics.len(), started.elapsed().as_millis());
    Ok(topics)
}

/// Topic configs of tiered storage (KIP-405).
fn is_tiering(key: &str) -> bool {
    matches!(key, "remote.storage.enable" | "local.retention.ms" | "local.retention.bytes")
}

/// The payload pool: the payload file, a randomized pool, or zeros.
fn load_payloads(loaded: &LoadedWorkload) -> anyhow::Result<Vec<Vec<u8>>> {
    let workload = &loaded.workload;
    let size = workload.message_size as usize;
    if workload.use_randomized_payloads {
        let mut random = XorShift::seeded(3);
        let random_bytes = ((size as f64) * workload.random_bytes_ratio) as usize;
        let pool_size = workload.randomized_payload_pool_size.max(1);
        return Ok((0..pool_size)
            .map(|_| {
                let mut payload = vec![0u8; size];
                for byte in payload.iter_mut().take(random_bytes.min(size)) {
                    *byte = random.next_u64() as u8;
                }
                payload
            })
            .collect());
    }
    let Some(file) = &workload.payload_file else {
        return Ok(vec![vec![0u8; size]]);
    };
    let path = resolve_payload(&loaded.path, file).with_context(|| format!("payload file {file} not found"))?;
    let payload = std::fs::read(&path).with_context(|| format!("reading payload {}", path.display()))?;
    if payload.len() != size {
        bail!("payload {} has {} bytes but messageSize is {size}", path.display(), payload.len());
    }
    Ok(vec![payload])
}

/// Looks for `file` as given, beside the workload, and in the workload folder's
/// ancestors (upstream keeps `workloads/` and `payload/` side by side).
pub fn resolve_payload(workload_path: &Path, file: &str) -> Option<PathBuf> {
    let direct = PathBuf::from(file);
    let folder = workload_path.parent().unwrap_or(Path::new("."));
    if direct.is_file() {
        return Some(direct);
    }
    folder.ancestors().take(4).map(|dir| dir.join(file)).find(|candidate| candidate.is_file())
}

/// What every producer of a run shares.
struct ProducerTemplate<'a> {
    config: &'a rdkafka::ClientConfig,
    payloads: Arc<Vec<Vec<u8>>>,
    keys: Arc<Vec<String>>,
    transactions: Option<&'a Transactions>,
}

/// What every consumer of a run shares.
struct ConsumerTemplate<'a> {
    mode: ConsumerMode,
    config: &'a rdkafka::ClientConfig,
    bootstrap: &'a str,
}

fn start_clients(
    workload: &Workload,
    topics: &[(String, u32)],
    consumers: &ConsumerTemplate<'_>,
    producers: &ProducerTemplate<'_>,
    clients: &mut Clients,
) -> anyhow::Result<()> {
    let mut random = XorShift::seeded(5);
    let consumers_per_subscription = workload.consumer_per_subscription.max(1);
    for (topic_index, (topic, partitions)) in topics.iter().enumerate() {
        for subscription_index in 0..workload.subscriptions_per_topic {
            let subscription = format!("sub-{subscription_index:03}-{}", random.string(7));
            if let Some(queue) = &workload.queue {
                let group = ShareGroupTemplate { topic_index, subscription_index, topic, group_id: &subscription };
                start_share_group(workload, queue, &group, consumers.bootstrap, clients)?;
                continue;
            }
            for consumer_index in 0..consumers_per_subscription {
                let assigned: Vec<i32> = (0..*partitions as i32)
                    .filter(|p| *p as u32 % consumers_per_subscription == consumer_index)
                    .collect();
                let spec = ConsumerSpec {
                    label: format!("consumer-{topic_index}-{subscription_index}-{consumer_index}"),
                    topic: topic.clone(),
                    subscription: subscription.clone(),
                    partitions: assigned,
                    mode: consumers.mode,
                    config: consumers.config.clone(),
                };
                let stats = Arc::new(ClientStats::default());
                let handle = kafka::spawn_consumer(spec, stats.clone(), clients.consumer_control.clone())?;
                clients.consumer_stats.push(stats);
                clients.handles.push(handle);
            }
        }
    }
    println!("Created {} consumers", clients.consumer_stats.len());
    for (topic_index, (topic, _)) in topics.iter().enumerate() {
        let producers_count = workload.producers_of(topic_index);
        for producer_index in 0..producers_count {
            let label = format!("producer-{topic_index}-{producer_index}");
            let transaction = producers.transactions.map(|transactions| TransactionSpec {
                transactional_id: format!("{}-{label}", transactions.id_prefix),
                records: transactions.records,
            });
            let spec = ProducerSpec {
                label,
                topic: topic.clone(),
                payloads: producers.payloads.clone(),
                key_distributor: workload.key_distributor,
                keys: producers.keys.clone(),
                config: producers.config.clone(),
                transaction,
            };
            let stats = Arc::new(ClientStats::default());
            let handle = kafka::spawn_producer(spec, stats.clone(), clients.producer_control.clone())?;
            clients.producer_stats.push(stats);
            clients.handles.push(handle);
            clients.producers_count += 1;
            clients.expected_probe_messages += u64::from(workload.subscriptions_per_topic);
        }
    }
    println!("Created {} producers", clients.producers_count);
    Ok(())
}

/// One share group of a queue workload.
struct ShareGroupTemplate<'a> {
    topic_index: usize,
    subscription_index: u32,
    topic: &'a str,
    group_id: &'a str,
}

/// Sets the group to read from the log start, then starts its members.
fn start_share_group(
    workload: &Workload,
    queue: &crate::workload::QueueSpec,
    group: &ShareGroupTemplate<'_>,
    bootstrap: &str,
    clients: &mut Clients,
) -> anyhow::Result<()> {
    crate::share::set_group_configs(
        bootstrap,
        group.group_id,
        &[(crate::share::CONFIG_AUTO_OFFSET_RESET, "earliest")],
    )?;
    let queue_stats = clients.queue_stats.clone().expect("queue workloads have queue stats");
    for consumer_index in 0..workload.consumer_per_subscription.max(1) {
        let spec = ShareConsumerSpec {
            label: format!("share-consumer-{}-{}-{consumer_index}", group.topic_index, group.subscription_index),
            bootstrap: bootstrap.to_string(),
            group_id: group.group_id.to_string(),
            topic: group.topic.to_string(),
            work: queue.work(),
            max_records_per_fetch: queue.max_records_per_fetch,
        };
        let stats = Arc::new(ClientStats::default());
        let handle = crate::share::spawn_share_consumer(
            spec,
            stats.clone(),
            queue_stats.clone(),
            clients.consumer_control.clone(),
        )?;
        clients.consumer_stats.push(stats);
        clients.handles.push(handle);
    }
    Ok(())
}

fn wait_ready(clients: &Clients) -> anyhow::Result<()> {
    println!("Waiting for consumers to be ready");
    let started = Instant::now();
    loop {
        let counters = clients.counters();
        if counters.messages_received >= clients.expected_probe_messages {
            println!(
                "All consumers are ready ({} ms) -- Sent: {}, Received: {}",
                started.elapsed().as_millis(),
                counters.messages_sent,
                counters.messages_received
            );
            return Ok(());
        }
        if started.elapsed() > READINESS_TIMEOUT {
            bail!(
                "timed out waiting for consumers to be ready -- Sent: {}, Received: {} of {}",
                counters.messages_sent,
                counters.messages_received,
                clients.expected_probe_messages
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn minutes(value: f64) -> Duration {
    Duration::from_secs_f64((value * 60.0).max(0.0))
}

/// Backlog build and drain (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
enum BacklogState {
    None,
    Building { since_ns: u64 },
    Draining { since_ns: u64, received_at_start: u64 },
    Tail { until_ns: u64 },
    Done,
}

/// The phases of a backlog run that get their own figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BacklogPhase {
    Build,
    Drain,
    Tail,
}

impl BacklogState {
    fn phase(&self) -> Option<BacklogPhase> {
        match self {
            BacklogState::Building { .. } => Some(BacklogPhase::Build),
            BacklogState::Draining { .. } => Some(BacklogPhase::Drain),
            BacklogState::Tail { .. } => Some(BacklogPhase::Tail),
            BacklogState::None | BacklogState::Done => None,
        }
    }
}

/// The backlog phase in progress: where it started and its latency so far.
struct PhaseTracker {
    phase: BacklogPhase,
    started_ns: u64,
    counters: Counters,
    disk_read_bytes: Option<u64>,
    latency: LatencySet,
}

impl PhaseTracker {
    fn finish(self, now_ns: u64, counters: Counters, disk_read_bytes: Option<u64>) -> PhaseFigures {
        let seconds = (now_ns - self.started_ns) as f64 / 1e9;
        let delta = counters.since(&self.counters);
        let mut figures = PhaseFigures {
            seconds,
            messages_sent: delta.messages_sent,
            messages_received: delta.messages_received,
            publish_rate: delta.messages_sent as f64 / seconds.max(1e-9),
            consume_mb_per_second: delta.bytes_received as f64 / seconds.max(1e-9) / (1024.0 * 1024.0),
            broker_disk_read_bytes: disk_read_bytes.zip(self.disk_read_bytes).map(|(end, start)| end - start),
            ..PhaseFigures::default()
        };
        figures.set_latency(&self.latency);
        figures
    }
}

struct Phase<'a> {
    workload: &'a Workload,
    clients: &'a Clients,
    sample_period: Duration,
    load_start_ns: u64,
    target_rate: f64,
    discovery: Option<RateController>,
    last_control_ns: u64,
    counters_at_sample: Counters,
    queue_at_sample: QueueCounters,
    extras: SluiceExtras,
    is_terminal: bool,
    /// Broker processes, for disk reads per backlog phase.
    broker_pids: Vec<u32>,
    /// The backlog phase in progress.
    backlog_phase: Option<PhaseTracker>,
    /// Latency drained at a phase change, added to the sample in progress.
    pending: LatencySet,
}

fn run_phases(
    workload: &Workload,
    options: &RunOptions,
    clients: &Clients,
    mode: ConsumerMode,
    records_per_transaction: Option<u32>,
) -> anyhow::Result<TestResult> {
    let rate = options.producer_rate.or(workload.rate_at(0.0));
    let discovery = match rate {
        Some(rate) if rate > 0.0 => None,
        _ => Some(RateController::new(RateControllerConfig::default())),
    };
    let target_rate = rate.filter(|r| *r > 0.0).unwrap_or(DISCOVERY_RATE_START);
    let sample_period = options.sample_period.unwrap_or(Duration::from_millis(workload.sample_period_ms()));
    // The probe's latency (first metadata round trips) is not part of any phase.
    clients.drain_period();
    let now_ns = monotonic_ns();
    let mut phase = Phase {
        workload,
        clients,
        sample_period,
        load_start_ns: now_ns,
        target_rate,
        discovery,
        last_control_ns: now_ns,
        counters_at_sample: clients.counters(),
        queue_at_sample: clients.queue_counters(),
        extras: SluiceExtras {
            end_to_end_clock: kafka::END_TO_END_CLOCK.to_string(),
            consumer_mode: mode.as_str().to_string(),
            sample_period_seconds: sample_period.as_secs_f64(),
            broker: options.broker_label.clone(),
            transactions: records_per_transaction.map(|records| TransactionFigures {
                records_per_transaction: records,
                ..TransactionFigures::default()
            }),
            queue: workload.queue.as_ref().map(|queue| QueueFigures {
                work_millis: queue.work_millis,
                max_records_per_fetch: queue.max_records_per_fetch,
                share_groups: workload.topics * workload.subscriptions_per_topic,
                consumers: clients.consumer_stats.len() as u32,
                ..QueueFigures::default()
            }),
            ..SluiceExtras::default()
        },
        is_terminal: std::io::stderr().is_terminal(),
        broker_pids: options.broker_pids.clone(),
        backlog_phase: None,
        pending: LatencySet::default(),
    };
    clients.set_total_rate(target_rate);
    println!("End-to-end latency clock: {}", kafka::END_TO_END_CLOCK);

    // The neighbour's page-cache fill comes before the warm-up, so the run starts on a full cache.
    let mut neighbour = options.neighbour.clone().map(Neighbour::prepare).transpose()?;
    let warmup = options.warmup_duration.unwrap_or_else(|| minutes(workload.warmup_duration_minutes));
    if !warmup.is_zero() {
        println!("----- Starting warm-up traffic ({:.1}s) ------", warmup.as_secs_f64());
        phase.collect(warmup, BacklogState::None, None, None)?;
    }
    let backlog = if workload.consumer_backlog_size_gb > 0.0 {
        BacklogState::Building { since_ns: 0 }
    } else {
        BacklogState::None
    };
    let test = options.test_duration.unwrap_or_else(|| minutes(workload.test_duration_minutes));
    println!("----- Starting benchmark traffic ({:.1}s) ------", test.as_secs_f64());
    let sampler = (!options.broker_pids.is_empty()).then(|| ProcessSampler::start(&options.broker_pids));
    let machine = MachineSampler::start();
    let mut result = phase.collect(test, backlog, sampler.as_ref(), neighbour.as_mut())?;
    phase.extras.neighbour = neighbour.as_ref().map(Neighbour::figures);
    drop(neighbour);
    let machine = machine.finish();
    phase.extras.client_cpu_seconds = machine.own_cpu_seconds;
    phase.extras.machine_busy_cores = machine.busy_cores;
    phase.extras.machine_steal_cores = machine.steal_cores;
    phase.extras.machine_cores = machine.cores;
    if let Some(phases) = &phase.extras.backlog_phases {
        print_backlog_phases(phases, phase.extras.backlog_drain_mb_per_second);
    }
    if let Some(sampler) = sampler {
        let usage = sampler.finish();
        let gib_sent = phase.extras.measured_bytes_sent as f64 / (1024.0 * 1024.0 * 1024.0);
        phase.extras.broker_cpu_seconds = usage.cpu_seconds;
        phase.extras.broker_peak_rss_bytes = usage.peak_rss_bytes;
        let per_gib = |seconds: Option<f64>| seconds.filter(|_| gib_sent > 0.0).map(|cpu| cpu / gib_sent);
        phase.extras.broker_cpu_seconds_per_gb = per_gib(usage.cpu_seconds);
        phase.extras.broker_kernel_cpu_seconds_per_gb = per_gib(usage.kernel_cpu_seconds);
    }
    result.sluice = Some(phase.extras);
    Ok(result)
}

impl Phase<'_> {
    /// Runs one phase for `duration` (longer while a backlog is being built or drained).
    fn collect(
        &mut self,
        duration: Duration,
        mut backlog: BacklogState,
        sampler: Option<&ProcessSampler>,
        mut neighbour: Option<&mut Neighbour>,
    ) -> anyhow::Result<TestResult> {
        let workload = self.workload;
        let mut result = TestResult {
            workload: workload.name.clone(),
            message_size: u64::from(workload.message_size),
            topics: workload.topics,
            partitions: workload.partitions_of(0),
            producers_per_topic: workload.producers_of(0),
            consumers_per_topic: workload.consumer_per_subscription,
            ..TestResult::default()
        };
        let mut cumulative = LatencySet::default();
        // Per-sample extras belong to this phase only, like the result's arrays.
        self.extras.publish_throughput_mb.clear();
        self.extras.consume_throughput_mb.clear();
        self.extras.target_rate.clear();
        if let Some(transactions) = self.extras.transactions.as_mut() {
            transactions.transaction_rate.clear();
        }
        if let Some(queue) = self.extras.queue.as_mut() {
            queue.acknowledge_rate.clear();
        }
        let start_ns = monotonic_ns();
        let end_ns = start_ns + duration.as_nanos() as u64;
        let phase_counters_start = self.clients.counters();
        let mut sample_start_ns = start_ns;
        let mut last_progress_ns = start_ns;
        self.counters_at_sample = phase_counters_start;
        let phase_queue_start = self.clients.queue_counters();
        self.queue_at_sample = phase_queue_start;
        self.pending.reset();
        self.backlog_phase = None;
        if let BacklogState::Building { .. } = backlog {
            println!("Stopping all consumers to build backlog");
            self.clients.consumer_control.paused.store(true, Ordering::Relaxed);
            backlog = BacklogState::Building { since_ns: start_ns };
            self.extras.backlog_phases = Some(BacklogPhases::default());
            self.clients.drain_period_into(&mut self.pending);
            self.switch_backlog_phase(Some(BacklogPhase::Build), start_ns);
        }
        loop {
            std::thread::sleep(TICK);
            let now_ns = monotonic_ns();
            self.steer_rate(now_ns);
            let before = backlog.phase();
            backlog = self.step_backlog(backlog, now_ns, duration);
            if backlog.phase() != before {
                self.switch_backlog_phase(backlog.phase(), now_ns);
            }
            if let Some(sampler) = sampler {
                sampler.tick();
            }
            if let Some(neighbour) = neighbour.as_deref_mut() {
                neighbour.tick(Duration::from_nanos(now_ns - start_ns))?;
            }
            if self.is_terminal && now_ns - last_progress_ns >= 1_000_000_000 {
                self.progress(now_ns - start_ns, duration);
                last_progress_ns = now_ns;
            }
            if now_ns - sample_start_ns < self.sample_period.as_nanos() as u64 {
                continue;
            }
            let elapsed_s = (now_ns - sample_start_ns) as f64 / 1e9;
            sample_start_ns = now_ns;
            let mut period = self.clients.drain_period();
            if let Some(tracker) = self.backlog_phase.as_mut() {
                tracker.latency.merge(&period);
            }
            period.merge(&self.pending);
            self.pending.reset();
            self.sample(&mut result, &period, elapsed_s);
            cumulative.merge(&period);
            let backlog_done = matches!(backlog, BacklogState::None | BacklogState::Done);
            if now_ns >= end_ns && backlog_done {
                break;
            }
        }
        if self.backlog_phase.is_some() {
            self.switch_backlog_phase(None, monotonic_ns());
        }
        let counters = self.clients.counters().since(&phase_counters_start);
        self.extras.measured_messages_sent = counters.messages_sent;
        self.extras.measured_bytes_sent = counters.bytes_sent;
        self.extras.measured_seconds = (monotonic_ns() - start_ns) as f64 / 1e9;
        if let Some(transactions) = self.extras.transactions.as_mut() {
            transactions.measured_transactions = counters.transactions_committed;
            transactions.measured_aborts = counters.transactions_aborted;
            transactions.aggregated_transaction_rate =
                counters.transactions_committed as f64 / self.extras.measured_seconds.max(1e-9);
            transactions.set_commit_latency(&cumulative.commit_us);
        }
        if let Some(queue) = self.extras.queue.as_mut() {
            let measured = self.clients.queue_counters().since(&phase_queue_start);
            set_queue_figures(queue, &measured, self.extras.measured_seconds);
        }
        result.set_aggregated(&cumulative);
        print_aggregated(&cumulative, self.extras.transactions.as_ref());
        if let Some(queue) = &self.extras.queue {
            println!(
                "----- Aggregated Queue: acknowledged {:.1} msg/s ({} records) | delivered {} | redelivered {} | ack errors {} | share fetches {} | restarts {}",
                queue.aggregated_acknowledge_rate,
                queue.measured_acknowledged,
                queue.measured_delivered,
                queue.measured_redelivered,
                queue.measured_acknowledge_errors,
                queue.measured_fetches,
                queue.measured_restarts,
            );
        }
        Ok(result)
    }

    /// Ends the backlog phase in progress (its latency up to this tick: the clients'
    /// histograms are drained now, and what is drained also goes to the sample in
    /// progress) and starts `next`.
    fn switch_backlog_phase(&mut self, next: Option<BacklogPhase>, now_ns: u64) {
        let counters = self.clients.counters();
        let disk_read_bytes = procstat::io_read_bytes(&self.broker_pids).filter(|_| !self.broker_pids.is_empty());
        if let Some(mut tracker) = self.backlog_phase.take() {
            let chunk = self.clients.drain_period();
            tracker.latency.merge(&chunk);
            self.pending.merge(&chunk);
            let phase = tracker.phase;
            let figures = tracker.finish(now_ns, counters, disk_read_bytes);
            let phases = self.extras.backlog_phases.get_or_insert_with(BacklogPhases::default);
            match phase {
                BacklogPhase::Build => phases.build = Some(figures),
                BacklogPhase::Drain => phases.drain = Some(figures),
                BacklogPhase::Tail => phases.tail = Some(figures),
            }
            phases.set_ratio();
        }
        self.backlog_phase = next.map(|phase| PhaseTracker {
            phase,
            started_ns: now_ns,
            counters,
            disk_read_bytes,
            latency: LatencySet::default(),
        });
    }

    fn sample(&mut self, result: &mut TestResult, period: &LatencySet, elapsed_s: f64) {
        let counters = self.clients.counters();
        let delta = counters.since(&self.counters_at_sample);
        self.counters_at_sample = counters;
        let rates = SampleRates {
            publish_rate: delta.messages_sent as f64 / elapsed_s,
            publish_error_rate: delta.send_errors as f64 / elapsed_s,
            consume_rate: delta.messages_received as f64 / elapsed_s,
            backlog: counters.backlog(u64::from(self.workload.subscriptions_per_topic)),
        };
        let mib = 1024.0 * 1024.0;
        let publish_mb = delta.bytes_sent as f64 / elapsed_s / mib;
        let consume_mb = delta.bytes_received as f64 / elapsed_s / mib;
        result.push_sample(rates, period);
        self.extras.publish_throughput_mb.push(publish_mb);
        self.extras.consume_throughput_mb.push(consume_mb);
        self.extras.target_rate.push(self.target_rate);
        let transaction_rate = delta.transactions_committed as f64 / elapsed_s;
        if let Some(transactions) = self.extras.transactions.as_mut() {
            transactions.transaction_rate.push(transaction_rate);
        }
        if self.is_terminal {
            eprint!("\r\x1b[2K");
        }
        let publish = Summary::of(&period.publish_us);
        let delay = Summary::of(&period.publish_delay_us);
        let e2e = Summary::of(&period.end_to_end_us);
        let ms = |us: u64| us as f64 / 1000.0;
        println!(
            "Pub rate {:7.1} msg/s / {:4.1} MB/s | Pub err {:7.1} err/s | Cons rate {:7.1} msg/s / {:4.1} MB/s | Backlog: {:4.1} K | Pub Latency (ms) avg: {:4.1} - 50%: {:4.1} - 99%: {:4.1} - 99.9%: {:4.1} - Max: {:4.1} | Pub Delay Latency (us) avg: {:4.1} - 50%: {} - 99%: {} - 99.9%: {} - Max: {} | E2E Latency (ms) avg: {:4.2} - 50%: {:4.2} - 99%: {:4.2} - 99.9%: {:4.2} - Max: {:4.1}",
            rates.publish_rate,
            publish_mb,
            rates.publish_error_rate,
            rates.consume_rate,
            consume_mb,
            rates.backlog.max(0) as f64 / 1000.0,
            publish.mean / 1000.0,
            ms(publish.p50),
            ms(publish.p99),
            ms(publish.p999),
            ms(publish.max),
            delay.mean,
            delay.p50,
            delay.p99,
            delay.p999,
            delay.max,
            e2e.mean / 1000.0,
            ms(e2e.p50),
            ms(e2e.p99),
            ms(e2e.p999),
            ms(e2e.max),
        );
        let queue_counters = self.clients.queue_counters();
        let queue_delta = queue_counters.since(&self.queue_at_sample);
        self.queue_at_sample = queue_counters;
        if let Some(queue) = self.extras.queue.as_mut() {
            let acknowledge_rate = queue_delta.acknowledged as f64 / elapsed_s;
            queue.acknowledge_rate.push(acknowledge_rate);
            println!(
                "    Queue: acknowledged {acknowledge_rate:7.1} msg/s | redelivered {} | ack errors {} | share fetches {:.1}/s",
                queue_delta.redelivered,
                queue_delta.acknowledge_errors,
                queue_delta.fetches as f64 / elapsed_s,
            );
        }
        if self.extras.transactions.is_some() {
            let commit = Summary::of(&period.commit_us);
            println!(
                "    Txn rate {transaction_rate:7.1} tx/s | Aborted {} | Commit Latency (ms) avg: {:4.1} - 50%: {:4.1} - 99%: {:4.1} - Max: {:4.1}",
                delta.transactions_aborted,
                commit.mean / 1000.0,
                ms(commit.p50),
                ms(commit.p99),
                ms(commit.max),
            );
        }
    }

    fn progress(&self, elapsed_ns: u64, duration: Duration) {
        let counters = self.clients.counters();
        eprint!(
            "\r\x1b[2K  {:5.0}s / {:.0}s  sent {}  received {}  backlog {}  target {:.0} msg/s",
            elapsed_ns as f64 / 1e9,
            duration.as_secs_f64(),
            counters.messages_sent,
            counters.messages_received,
            counters.backlog(u64::from(self.workload.subscriptions_per_topic)),
            self.target_rate
        );
    }

    /// Applies `producerRateList` and rate discovery.
    fn steer_rate(&mut self, now_ns: u64) {
        if self.workload.producer_rate_list.is_some() {
            let minutes = (now_ns - self.load_start_ns) as f64 / 60e9;
            if let Some(rate) = self.workload.rate_at(minutes) {
                if (rate - self.target_rate).abs() >= 1.0 {
                    self.target_rate = rate;
                    self.clients.set_total_rate(rate);
                }
            }
            return;
        }
        let Some(controller) = self.discovery.as_mut() else {
            return;
        };
        let period_ns = now_ns - self.last_control_ns;
        if period_ns < RATE_CONTROL_PERIOD.as_nanos() as u64 {
            return;
        }
        self.last_control_ns = now_ns;
        let counters = self.clients.counters();
        let next = controller.next_rate(
            self.target_rate,
            period_ns,
            counters.messages_sent as i64,
            counters.messages_received as i64,
            i64::from(self.workload.subscriptions_per_topic),
        );
        self.target_rate = next;
        self.clients.set_total_rate(next);
    }

    fn step_backlog(&mut self, state: BacklogState, now_ns: u64, tail: Duration) -> BacklogState {
        let workload = self.workload;
        let subscriptions = u64::from(workload.subscriptions_per_topic);
        let counters = self.clients.counters();
        let backlog_messages = counters.backlog(subscriptions).max(0) as u64;
        let requested_bytes = workload.backlog_bytes();
        match state {
            BacklogState::Building { since_ns } => {
                if backlog_messages * u64::from(workload.message_size) < requested_bytes {
                    return state;
                }
                let seconds = (now_ns - since_ns) as f64 / 1e9;
                println!("--- Completed backlog build in {seconds:.1} s ---");
                println!("--- Start draining backlog ---");
                self.extras.backlog_build_seconds = Some(seconds);
                self.clients.consumer_control.paused.store(false, Ordering::Relaxed);
                BacklogState::Draining { since_ns: now_ns, received_at_start: counters.bytes_received }
            }
            BacklogState::Draining { since_ns, received_at_start } => {
                let capacity = requested_bytes / u64::from(workload.message_size);
                let empty_level = ((1.0 - workload.backlog_drain_ratio) * capacity as f64) as u64;
                if backlog_messages > empty_level.max(1000) {
                    return state;
                }
                let seconds = (now_ns - since_ns) as f64 / 1e9;
                let mib = (counters.bytes_received - received_at_start) as f64 / (1024.0 * 1024.0);
                println!("--- Completed backlog draining in {seconds:.1} s ({:.1} MB/s) ---", mib / seconds.max(1e-9));
                self.extras.backlog_drain_seconds = Some(seconds);
                self.extras.backlog_drain_mb_per_second = Some(mib / seconds.max(1e-9));
                // As OMB: after draining, the measured phase runs one more test duration.
                BacklogState::Tail { until_ns: now_ns + tail.as_nanos() as u64 }
            }
            BacklogState::Tail { until_ns } if now_ns >= until_ns => BacklogState::Done,
            other => other,
        }
    }
}

/// Fills the measured-phase totals of a queue workload.
fn set_queue_figures(queue: &mut QueueFigures, measured: &QueueCounters, seconds: f64) {
    queue.measured_delivered = measured.delivered;
    queue.measured_redelivered = measured.redelivered;
    queue.measured_acknowledged = measured.acknowledged;
    queue.measured_acknowledge_errors = measured.acknowledge_errors;
    queue.measured_fetches = measured.fetches;
    queue.measured_restarts = measured.restarts;
    queue.aggregated_acknowledge_rate = measured.acknowledged as f64 / seconds.max(1e-9);
}

fn print_backlog_phases(phases: &BacklogPhases, catch_up_mb_per_second: Option<f64>) {
    let line = |name: &str, figures: &Option<PhaseFigures>| match figures {
        Some(f) => format!(
            "{name} {:.1} s: publish p50 {:.2} / p99 {:.2} / p99.9 {:.2} ms, consume {:.1} MB/s, broker disk reads {}",
            f.seconds,
            f.publish_latency_50pct,
            f.publish_latency_99pct,
            f.publish_latency_999pct,
            f.consume_mb_per_second,
            f.broker_disk_read_bytes.map(|b| format!("{:.1} MB", b as f64 / (1024.0 * 1024.0))).unwrap_or("-".into()),
        ),
        None => format!("{name}: -"),
    };
    println!("----- Backlog {}", line("build (consumers paused)", &phases.build));
    println!("----- Backlog {}", line("drain", &phases.drain));
    println!("----- Backlog {}", line("tail", &phases.tail));
    println!(
        "----- Catch-up: {} MB/s; publish p99 during drain / before: {}",
        catch_up_mb_per_second.map(|v| format!("{v:.1}")).unwrap_or("-".into()),
        phases.drain_to_build_publish_p99.map(|v| format!("{v:.2}")).unwrap_or("-".into()),
    );
}

fn print_aggregated(cumulative: &LatencySet, transactions: Option<&TransactionFigures>) {
    let publish = Summary::of(&cumulative.publish_us);
    let delay = Summary::of(&cumulative.publish_delay_us);
    let e2e = Summary::of(&cumulative.end_to_end_us);
    let ms = |us: u64| us as f64 / 1000.0;
    println!(
        "----- Aggregated Pub Latency (ms) avg: {:4.1} - 50%: {:4.1} - 95%: {:4.1} - 99%: {:4.1} - 99.9%: {:4.1} - 99.99%: {:4.1} - Max: {:4.1} | Pub Delay (us)  avg: {:4.1} - 50%: {} - 95%: {} - 99%: {} - 99.9%: {} - 99.99%: {} - Max: {}",
        publish.mean / 1000.0,
        ms(publish.p50),
        ms(publish.p95),
        ms(publish.p99),
        ms(publish.p999),
        ms(publish.p9999),
        ms(publish.max),
        delay.mean,
        delay.p50,
        delay.p95,
        delay.p99,
        delay.p999,
        delay.p9999,
        delay.max
    );
    println!(
        "----- Aggregated E2E Latency (ms) avg: {:4.2} - 50%: {:4.2} - 95%: {:4.2} - 99%: {:4.2} - 99.9%: {:4.2} - 99.99%: {:4.2} - Max: {:4.1}",
        e2e.mean / 1000.0,
        ms(e2e.p50),
        ms(e2e.p95),
        ms(e2e.p99),
        ms(e2e.p999),
        ms(e2e.p9999),
        ms(e2e.max)
    );
    if let Some(tx) = transactions {
        println!(
            "----- Aggregated Txn rate {:.1} tx/s ({} records each, {} committed, {} aborted) | Commit Latency (ms) avg: {:4.1} - 50%: {:4.1} - 99%: {:4.1} - 99.9%: {:4.1} - Max: {:4.1}",
            tx.aggregated_transaction_rate,
            tx.records_per_transaction,
            tx.measured_transactions,
            tx.measured_aborts,
            tx.aggregated_commit_latency_avg,
            tx.aggregated_commit_latency_50pct,
            tx.aggregated_commit_latency_99pct,
            tx.aggregated_commit_latency_999pct,
            tx.aggregated_commit_latency_max,
        );
    }
}
