//! Real Kafka clients (librdkafka through `rdkafka`), one per OMB producer or consumer.
//!
//! Each producer and consumer is its own librdkafka instance, so each has its own
//! connections and threads: OMB forks found that sharing one connection per worker
//! hides broker behaviour. A producer runs on a dedicated thread that paces sends with
//! a [`RateLimiter`]; its acknowledgements arrive on the `ThreadedProducer`'s poll
//! thread, where publish latency is recorded. A consumer runs a poll loop on its own
//! thread and commits offsets asynchronously every few seconds, never per poll.
//!
//! Transactional producers (driver `requestsPerTransaction: N`) keep that pacing: the
//! first send of a transaction begins it, the N-th commits it on the producer's thread.
//! A commit call blocks (librdkafka flushes the transaction's records, then sends EndTxn),
//! so the sends due meanwhile leave late and the wait shows as publish delay, not as a
//! lower offered load. Publish latency stays send-to-acknowledgement per record; the
//! commit call's duration is recorded on its own. A commit librdkafka says cannot succeed
//! is aborted and counted; a fatal error (fenced, broken producer) stops that producer.
//!
//! End-to-end latency: every payload of 16 bytes or more starts with the 8-byte magic
//! [`TIMESTAMP_MAGIC`] and the sender's `CLOCK_MONOTONIC` reading in nanoseconds
//! (little endian). Producers and consumers run in this one process, so they share that
//! clock and the latency has microsecond resolution. Shorter payloads fall back to the
//! record's CreateTime against the wall clock (millisecond resolution).

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions, NewTopic, TopicReplication};
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Message, Timestamp};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};

use crate::rate::RateLimiter;
use crate::stats::ClientStats;
use crate::workload::KeyDistributor;

/// Marks a payload that carries a send timestamp.
pub const TIMESTAMP_MAGIC: [u8; 8] = *b"SLUICEts";
/// Bytes of the magic plus the timestamp.
pub const TIMESTAMP_HEADER_BYTES: usize = 16;
/// What the result says about the end-to-end clock.
pub const END_TO_END_CLOCK: &str = "CLOCK_MONOTONIC nanoseconds embedded in the first 16 payload bytes \
(producers and consumers in one process); CreateTime in ms for payloads under 16 bytes";
/// Keys in the key pool (OMB's distributors use 10,000).
pub const KEY_POOL_SIZE: usize = 10_000;
/// Consumers commit offsets this often (asynchronously).
pub const COMMIT_INTERVAL: Duration = Duration::from_secs(5);
/// Errors printed per client before going quiet.
const CLIENT_ERRORS_PRINTED_MAX: usize = 5;
/// How long `init_transactions`, `commit_transaction` and `abort_transaction` may block.
pub const TRANSACTION_CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Calls of a commit that keeps failing with a retriable error before giving up on it.
const COMMIT_ATTEMPTS_MAX: u32 = 3;
/// How often a producer about to commit checks whether its records are all acknowledged.
const IN_FLIGHT_CHECK_INTERVAL: Duration = Duration::from_micros(100);

/// Monotonic nanoseconds (`CLOCK_MONOTONIC`), shared by every process on the machine.
pub fn monotonic_ns() -> u64 {
    let mut spec = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `spec` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut spec) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC) failed");
    spec.tv_sec as u64 * 1_000_000_000 + spec.tv_nsec as u64
}

fn wall_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// Writes the timestamp header into `payload` if it is long enough.
pub fn stamp_payload(payload: &mut [u8], now_ns: u64) {
    if payload.len() >= TIMESTAMP_HEADER_BYTES {
        payload[..8].copy_from_slice(&TIMESTAMP_MAGIC);
        payload[8..16].copy_from_slice(&now_ns.to_le_bytes());
    }
}

/// The send timestamp of a stamped payload.
pub fn payload_timestamp_ns(payload: &[u8]) -> Option<u64> {
    if payload.len() < TIMESTAMP_HEADER_BYTES || payload[..8] != TIMESTAMP_MAGIC {
        return None;
    }
    Some(u64::from_le_bytes(payload[8..16].try_into().ok()?))
}

/// A small xorshift generator: keys and random payloads need no cryptographic quality.
#[derive(Debug, Clone)]
pub struct XorShift(u64);

impl XorShift {
    /// A generator seeded from the clock and `salt`.
    pub fn seeded(salt: u64) -> Self {
        Self((monotonic_ns() ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1)
    }

    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A random lowercase alphanumeric string.
    pub fn string(&mut self, len: usize) -> String {
        const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
        (0..len).map(|_| ALPHABET[(self.next_u64() % ALPHABET.len() as u64) as usize] as char).collect()
    }
}

/// Builds a librdkafka config from driver properties, dropping (and reporting) the keys
/// librdkafka does not know, such as Java-only `default.api.timeout.ms`.
pub fn client_config(properties: &[(String, String)], warnings: &mut Vec<String>) -> ClientConfig {
    let mut config = ClientConfig::new();
    for (key, value) in properties {
        let mut single = ClientConfig::new();
        single.set(key, value);
        match single.create_native_config() {
            Ok(_) => {
                config.set(key, value);
            }
            Err(error) => {
                let warning = format!("client setting `{key}={value}` dropped: {error}");
                if !warnings.contains(&warning) {
                    warnings.push(warning);
                }
            }
        }
    }
    config
}

/// The first `host:port` of a bootstrap list.
pub fn first_bootstrap(bootstrap: &str) -> &str {
    bootstrap.split(',').next().unwrap_or(bootstrap).trim()
}

/// The API keys a broker lists in its ApiVersions (v0) response.
pub fn broker_api_keys(bootstrap: &str) -> anyhow::Result<Vec<i16>> {
    let address = first_bootstrap(bootstrap);
    let mut addrs: Vec<_> = address.to_socket_addrs().with_context(|| format!("resolving {address}"))?.collect();
    // librdkafka may prefer ::1 for localhost; brokers here listen on IPv4 loopback.
    addrs.sort_by_key(|a| !a.is_ipv4());
    let addr = addrs.first().ok_or_else(|| anyhow!("no address for {address}"))?;
    let mut stream = TcpStream::connect_timeout(addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let client_id = b"sluice-bench";
    let mut request = Vec::new();
    request.extend_from_slice(&18i16.to_be_bytes()); // ApiVersions
    request.extend_from_slice(&0i16.to_be_bytes()); // version 0
    request.extend_from_slice(&1i32.to_be_bytes()); // correlation id
    request.extend_from_slice(&(client_id.len() as i16).to_be_bytes());
    request.extend_from_slice(client_id);
    let mut frame = (request.len() as i32).to_be_bytes().to_vec();
    frame.extend_from_slice(&request);
    stream.write_all(&frame)?;
    let mut size = [0u8; 4];
    stream.read_exact(&mut size)?;
    let size = i32::from_be_bytes(size);
    if !(10..=1_000_000).contains(&size) {
        bail!("ApiVersions response of {size} bytes");
    }
    let mut body = vec![0u8; size as usize];
    stream.read_exact(&mut body)?;
    let error_code = i16::from_be_bytes([body[4], body[5]]);
    if error_code != 0 {
        bail!("ApiVersions error code {error_code}");
    }
    let count = i32::from_be_bytes([body[6], body[7], body[8], body[9]]).max(0) as usize;
    let mut keys = Vec::with_capacity(count);
    for index in 0..count {
        let at = 10 + index * 6;
        if at + 2 > body.len() {
            break;
        }
        keys.push(i16::from_be_bytes([body[at], body[at + 1]]));
    }
    Ok(keys)
}

/// True when the broker lists the group APIs OMB's consumers need
/// (FindCoordinator 10, JoinGroup 11, SyncGroup 14, OffsetCommit 8).
pub fn broker_has_consumer_groups(bootstrap: &str) -> anyhow::Result<bool> {
    let keys = broker_api_keys(bootstrap)?;
    Ok([8i16, 10, 11, 14].iter().all(|key| keys.contains(key)))
}

/// A client context that prints the first few client errors.
#[derive(Default)]
pub struct BenchContext {
    label: String,
    errors_count: AtomicUsize,
    stats: Option<Arc<ClientStats>>,
}

impl BenchContext {
    fn new(label: String, stats: Option<Arc<ClientStats>>) -> Self {
        Self { label, errors_count: AtomicUsize::new(0), stats }
    }

    /// Prints `what` unless this client already printed its share of errors.
    fn report(&self, what: std::fmt::Arguments<'_>) {
        let seen = self.errors_count.fetch_add(1, Ordering::Relaxed);
        if seen < CLIENT_ERRORS_PRINTED_MAX {
            eprintln!("[{}] {what}", self.label);
        }
    }
}

impl ClientContext for BenchContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        // Warnings and worse (a disconnection, a timed-out request) say why a run failed.
        if level as i32 <= rdkafka::config::RDKafkaLogLevel::Warning as i32 {
            self.report(format_args!("client log {level:?} {fac}: {message}"));
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.report(format_args!("client error: {error}: {reason}"));
    }
}

impl ProducerContext for BenchContext {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, sent_ns: usize) {
        let Some(stats) = &self.stats else { return };
        match result {
            Ok(message) => {
                let latency_us = monotonic_ns().saturating_sub(sent_ns as u64) / 1_000;
                let bytes = message.payload_len() as u64;
                stats.record_sent(bytes, latency_us);
            }
            Err((error, _)) => {
                stats.record_send_error();
                self.report(format_args!("send failed: {error}"));
            }
        }
    }
}

impl ConsumerContext for BenchContext {}

/// Partitions created or added by one admin request at most.
pub const PARTITIONS_PER_ADMIN_REQUEST: u32 = 5_000;

/// Admin operations the bench needs.
pub struct Admin {
    client: AdminClient<DefaultClientContext>,
}

impl Admin {
    /// Connects with the common config.
    pub fn connect(config: &ClientConfig) -> anyhow::Result<Self> {
        let client = config.create().context("creating admin client")?;
        Ok(Self { client })
    }

    /// Broker count and topic names in the cluster.
    pub fn metadata(&self) -> anyhow::Result<(usize, Vec<String>)> {
        let metadata =
            self.client.inner().fetch_metadata(None, Duration::from_secs(30)).context("fetching metadata")?;
        let topics = metadata.topics().iter().map(|t| t.name().to_string()).collect();
        Ok((metadata.brokers().len(), topics))
    }

    /// Creates `names`, each with `partitions` and `config`. A topic of more than
    /// [`PARTITIONS_PER_ADMIN_REQUEST`] partitions is created with that many and grown in
    /// steps of that size (Kafka's controller refuses one request of 10,000 partitions).
    pub fn create_topics(
        &self,
        names: &[(String, u32)],
        replication_factor: i32,
        config: &[(String, String)],
    ) -> anyhow::Result<()> {
        let topics: Vec<NewTopic<'_>> = names
            .iter()
            .map(|(name, partitions)| {
                let first = (*partitions).min(PARTITIONS_PER_ADMIN_REQUEST);
                let mut topic = NewTopic::new(name, first as i32, TopicReplication::Fixed(replication_factor));
                for (key, value) in config {
                    topic = topic.set(key, value);
                }
                topic
            })
            .collect();
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(60)));
        let results = block_on(self.client.create_topics(topics.iter(), &options))?.context("creating topics")?;
        for result in results {
            if let Err((name, code)) = result {
                if code != RDKafkaErrorCode::TopicAlreadyExists {
                    bail!("creating topic {name}: {code}");
                }
            }
        }
        for (name, partitions) in names {
            let mut count = (*partitions).min(PARTITIONS_PER_ADMIN_REQUEST);
            while count < *partitions {
                count = (count + PARTITIONS_PER_ADMIN_REQUEST).min(*partitions);
                let growth = NewPartitions::new(name, count as usize);
                let results = block_on(self.client.create_partitions([&growth], &options))?
                    .with_context(|| format!("growing topic {name} to {count} partitions"))?;
                for result in results {
                    if let Err((name, code)) = result {
                        bail!("growing topic {name} to {count} partitions: {code}");
                    }
                }
            }
        }
        Ok(())
    }

    /// Deletes `names`; failures are reported, not fatal.
    pub fn delete_topics(&self, names: &[String]) -> Vec<String> {
        if names.is_empty() {
            return Vec::new();
        }
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(60)));
        match block_on(self.client.delete_topics(&refs, &options)) {
            Ok(Ok(results)) => results
                .into_iter()
                .filter_map(|r| r.err().map(|(name, code)| format!("deleting {name}: {code}")))
                .collect(),
            Ok(Err(error)) => vec![format!("deleting topics: {error}")],
            Err(error) => vec![format!("deleting topics: {error}")],
        }
    }
}

fn block_on<F: std::future::Future>(future: F) -> anyhow::Result<F::Output> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    Ok(runtime.block_on(future))
}

/// Controls shared between the runner and its producers.
#[derive(Debug)]
pub struct ProducerControl {
    /// Per-producer rate in msg/s, as `f64` bits; 0 means "probe sent, not loading yet".
    pub rate_bits: AtomicU64,
    /// Set to end the producer.
    pub stop: AtomicBool,
}

impl ProducerControl {
    /// Sets the per-producer rate.
    pub fn set_rate(&self, rate_per_second: f64) {
        self.rate_bits.store(rate_per_second.to_bits(), Ordering::Relaxed);
    }

    fn rate(&self) -> f64 {
        f64::from_bits(self.rate_bits.load(Ordering::Relaxed))
    }
}

impl Default for ProducerControl {
    fn default() -> Self {
        Self { rate_bits: AtomicU64::new(0f64.to_bits()), stop: AtomicBool::new(false) }
    }
}

/// What one producer sends.
pub struct ProducerSpec {
    /// Client label, also its `client.id`.
    pub label: String,
    /// Topic to send to.
    pub topic: String,
    /// Payload pool (one file payload, or the randomized pool).
    pub payloads: Arc<Vec<Vec<u8>>>,
    /// Key choice.
    pub key_distributor: KeyDistributor,
    /// Key pool shared by producers.
    pub keys: Arc<Vec<String>>,
    /// librdkafka settings (common + producer).
    pub config: ClientConfig,
    /// Transactions, when the driver asks for them.
    pub transaction: Option<TransactionSpec>,
}

/// A transactional producer's settings.
#[derive(Debug, Clone)]
pub struct TransactionSpec {
    /// The producer's own `transactional.id`.
    pub transactional_id: String,
    /// Records per transaction.
    pub records: u32,
}

/// Starts a producer thread: it sends one probe message, waits for a rate, then loads.
/// A transactional producer registers its id (`init_transactions`) before the thread
/// starts, so a broker without transactions fails the run here with the broker's error.
pub fn spawn_producer(
    spec: ProducerSpec,
    stats: Arc<ClientStats>,
    control: Arc<ProducerControl>,
) -> anyhow::Result<JoinHandle<()>> {
    let mut config = spec.config.clone();
    config.set("client.id", &spec.label);
    if let Some(transaction) = &spec.transaction {
        config.set(crate::driver::TRANSACTIONAL_ID_KEY, &transaction.transactional_id);
    }
    let context = BenchContext::new(spec.label.clone(), Some(stats.clone()));
    let producer: ThreadedProducer<BenchContext> =
        config.create_with_context(context).with_context(|| format!("creating producer {}", spec.label))?;
    if let Some(transaction) = &spec.transaction {
        producer.init_transactions(TRANSACTION_CALL_TIMEOUT).with_context(|| {
            format!("initializing transactions of {} ({})", spec.label, transaction.transactional_id)
        })?;
    }
    let handle = std::thread::Builder::new()
        .name(spec.label.clone())
        .spawn(move || producer_loop(&spec, &producer, &stats, &control))?;
    Ok(handle)
}

fn producer_loop(
    spec: &ProducerSpec,
    producer: &ThreadedProducer<BenchContext>,
    stats: &ClientStats,
    control: &ProducerControl,
) {
    let mut buffer = spec.payloads[0].clone();
    let mut random = XorShift::seeded(spec.label.len() as u64);
    let mut round_robin = 0usize;
    // The readiness probe carries a key when the workload does: a compacted topic refuses
    // keyless records.
    let probe_key = (spec.key_distributor != KeyDistributor::NoKey).then(|| spec.keys[0].as_str());
    // Records in the open transaction (0: none open); a transactional probe is committed
    // at once, so read_committed consumers see it.
    let mut open_records = 0u32;
    let records_per_transaction = spec.transaction.as_ref().map(|t| t.records);
    if records_per_transaction.is_some() && !begin_transaction(producer) {
        return;
    }
    send_one(spec, producer, stats, &mut buffer, 0, probe_key);
    if records_per_transaction.is_some() && !commit_transaction(producer, stats) {
        return;
    }
    let mut limiter: Option<RateLimiter> = None;
    while !control.stop.load(Ordering::Relaxed) {
        let rate = control.rate();
        if rate <= 0.0 {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        }
        let limiter = limiter.get_or_insert_with(|| RateLimiter::new(rate, monotonic_ns()));
        if limiter.rate_per_second() != rate {
            limiter.set_rate(rate, monotonic_ns());
        }
        let intended_ns = limiter.acquire();
        if !sleep_until(intended_ns, control) {
            break;
        }
        let key = match spec.key_distributor {
            KeyDistributor::NoKey => None,
            KeyDistributor::KeyRoundRobin => {
                round_robin = (round_robin + 1) % spec.keys.len();
                Some(spec.keys[round_robin].as_str())
            }
            KeyDistributor::RandomNano => Some(spec.keys[(monotonic_ns() % spec.keys.len() as u64) as usize].as_str()),
        };
        if spec.payloads.len() > 1 {
            let index = (random.next_u64() % spec.payloads.len() as u64) as usize;
            buffer.copy_from_slice(&spec.payloads[index]);
        }
        let Some(records_per_transaction) = records_per_transaction else {
            send_one(spec, producer, stats, &mut buffer, intended_ns, key);
            continue;
        };
        if open_records == 0 && !begin_transaction(producer) {
            return;
        }
        send_one(spec, producer, stats, &mut buffer, intended_ns, key);
        open_records += 1;
        if open_records == records_per_transaction {
            open_records = 0;
            if !commit_transaction(producer, stats) {
                return;
            }
        }
    }
    // A last, shorter transaction is committed, so consumers get every acknowledged record.
    if open_records > 0 {
        commit_transaction(producer, stats);
    }
    let _ = producer.flush(Duration::from_secs(10));
}

/// Begins a transaction; false (after reporting why) when the producer cannot.
fn begin_transaction(producer: &ThreadedProducer<BenchContext>) -> bool {
    match producer.begin_transaction() {
        Ok(()) => true,
        Err(error) => {
            producer.context().report(format_args!("begin transaction failed, producer stops: {error}"));
            false
        }
    }
}

/// Commits the open transaction, recording how long it took from the commit decision
/// (records still unacknowledged included) until EndTxn was answered. A retriable failure
/// is retried; a transaction librdkafka says must abort is aborted and counted. False
/// when the producer cannot go on (fatal error, e.g. fenced by a newer epoch).
fn commit_transaction(producer: &ThreadedProducer<BenchContext>, stats: &ClientStats) -> bool {
    let context = producer.context();
    for attempt in 1..=COMMIT_ATTEMPTS_MAX {
        let started_ns = monotonic_ns();
        wait_acknowledged(producer, started_ns);
        let error = match producer.commit_transaction(TRANSACTION_CALL_TIMEOUT) {
            Ok(()) => {
                stats.record_commit(monotonic_ns().saturating_sub(started_ns) / 1_000);
                return true;
            }
            Err(error) => error,
        };
        let (retriable, must_abort) = match &error {
            KafkaError::Transaction(detail) => (detail.is_retriable(), detail.txn_requires_abort()),
            _ => (false, false),
        };
        if retriable && attempt < COMMIT_ATTEMPTS_MAX {
            context.report(format_args!("commit attempt {attempt} failed, retrying: {error}"));
            continue;
        }
        stats.record_send_error();
        if !must_abort {
            context.report(format_args!("commit failed, producer stops: {error}"));
            return false;
        }
        stats.record_abort();
        context.report(format_args!("commit failed, transaction aborted: {error}"));
        return match producer.abort_transaction(TRANSACTION_CALL_TIMEOUT) {
            Ok(()) => true,
            Err(error) => {
                context.report(format_args!("abort failed, producer stops: {error}"));
                false
            }
        };
    }
    false
}

/// Waits (at most [`TRANSACTION_CALL_TIMEOUT`] from `since_ns`) until every record sent
/// is acknowledged and its delivery report served by the poll thread. rdkafka's own flush
/// in `commit_transaction` waits in steps of 100 ms when records are in flight (its poll
/// runs to its deadline), which would put a 100 ms floor under every commit: after this
/// wait there is nothing left for it to flush.
fn wait_acknowledged(producer: &ThreadedProducer<BenchContext>, since_ns: u64) {
    let deadline_ns = since_ns + TRANSACTION_CALL_TIMEOUT.as_nanos() as u64;
    while producer.in_flight_count() > 0 && monotonic_ns() < deadline_ns {
        std::thread::sleep(IN_FLIGHT_CHECK_INTERVAL);
    }
}

/// Sleeps until `deadline_ns`, waking to check `stop`; false if stopped.
fn sleep_until(deadline_ns: u64, control: &ProducerControl) -> bool {
    loop {
        if control.stop.load(Ordering::Relaxed) {
            return false;
        }
        let now_ns = monotonic_ns();
        if now_ns >= deadline_ns {
            return true;
        }
        let wait_ns = (deadline_ns - now_ns).min(50_000_000);
        std::thread::sleep(Duration::from_nanos(wait_ns));
    }
}

fn send_one(
    spec: &ProducerSpec,
    producer: &ThreadedProducer<BenchContext>,
    stats: &ClientStats,
    buffer: &mut [u8],
    intended_ns: u64,
    key: Option<&str>,
) {
    let sent_ns = monotonic_ns();
    if intended_ns > 0 {
        stats.record_publish_delay(sent_ns.saturating_sub(intended_ns) / 1_000);
    }
    stamp_payload(buffer, sent_ns);
    let mut record = BaseRecord::<str, [u8], usize>::with_opaque_to(&spec.topic, sent_ns as usize).payload(&*buffer);
    if let Some(key) = key {
        record = record.key(key);
    }
    let started = Instant::now();
    loop {
        match producer.send(record) {
            Ok(()) => return,
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), returned)) => {
                record = returned;
                // The poll thread drains acknowledgements; give it room.
                std::thread::sleep(Duration::from_micros(200));
                if started.elapsed() > Duration::from_secs(60) {
                    stats.record_send_error();
                    return;
                }
            }
            Err((error, _)) => {
                stats.record_send_error();
                eprintln!("[{}] send rejected: {error}", spec.label);
                return;
            }
        }
    }
}

/// How consumers get their partitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsumerMode {
    /// Consumer groups (`subscribe`, group = subscription), as OMB does.
    Subscribe,
    /// The bench splits partitions among a subscription's consumers (`assign`), for
    /// brokers without consumer groups; offsets are not committed.
    Assign,
    /// Share groups (KIP-932), for queue workloads: the consumers are
    /// [`crate::share`]'s, not librdkafka's.
    Share,
}

impl ConsumerMode {
    /// The word used in output.
    pub fn as_str(self) -> &'static str {
        match self {
            ConsumerMode::Subscribe => "subscribe",
            ConsumerMode::Assign => "assign",
            ConsumerMode::Share => "share",
        }
    }
}

/// What one consumer reads.
pub struct ConsumerSpec {
    /// Client label, also its `client.id`.
    pub label: String,
    /// Topic to read.
    pub topic: String,
    /// Subscription (= group id in subscribe mode).
    pub subscription: String,
    /// Partitions of this consumer in assign mode.
    pub partitions: Vec<i32>,
    /// How partitions are obtained.
    pub mode: ConsumerMode,
    /// librdkafka settings (common + consumer).
    pub config: ClientConfig,
}

/// Controls shared between the runner and its consumers.
#[derive(Debug, Default)]
pub struct ConsumerControl {
    /// Consumers pause their partitions while set (backlog build).
    pub paused: AtomicBool,
    /// Set to end the consumer.
    pub stop: AtomicBool,
}

/// Starts a consumer thread.
pub fn spawn_consumer(
    spec: ConsumerSpec,
    stats: Arc<ClientStats>,
    control: Arc<ConsumerControl>,
) -> anyhow::Result<JoinHandle<()>> {
    if spec.mode == ConsumerMode::Share {
        bail!("librdkafka has no share consumer: {} runs on the share-group driver", spec.label);
    }
    let mut config = spec.config.clone();
    config.set("client.id", &spec.label);
    // librdkafka wants a group id even for assign(); in assign mode it is never joined
    // and nothing is committed, so the broker needs no group support.
    config.set("group.id", &spec.subscription);
    if spec.mode == ConsumerMode::Assign {
        config.set("enable.auto.commit", "false");
        config.set("enable.auto.offset.store", "false");
    }
    let context = BenchContext::new(spec.label.clone(), None);
    let consumer: BaseConsumer<BenchContext> =
        config.create_with_context(context).with_context(|| format!("creating consumer {}", spec.label))?;
    match spec.mode {
        ConsumerMode::Subscribe => consumer.subscribe(&[&spec.topic])?,
        ConsumerMode::Assign => {
            let mut list = TopicPartitionList::new();
            for partition in &spec.partitions {
                list.add_partition_offset(&spec.topic, *partition, Offset::Beginning)?;
            }
            consumer.assign(&list)?;
        }
        ConsumerMode::Share => unreachable!("refused above"),
    }
    let handle = std::thread::Builder::new()
        .name(spec.label.clone())
        .spawn(move || consumer_loop(&spec, &consumer, &stats, &control))?;
    Ok(handle)
}

fn consumer_loop(
    spec: &ConsumerSpec,
    consumer: &BaseConsumer<BenchContext>,
    stats: &ClientStats,
    control: &ConsumerControl,
) {
    let mut paused = false;
    let mut last_commit = Instant::now();
    let mut errors_count = 0usize;
    while !control.stop.load(Ordering::Relaxed) {
        let want_paused = control.paused.load(Ordering::Relaxed);
        if want_paused != paused {
            if let Ok(assignment) = consumer.assignment() {
                let outcome = if want_paused { consumer.pause(&assignment) } else { consumer.resume(&assignment) };
                if let Err(error) = outcome {
                    eprintln!("[{}] pause/resume failed: {error}", spec.label);
                }
            }
            paused = want_paused;
        }
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(message)) => {
                let payload = message.payload().unwrap_or(&[]);
                let latency_us = end_to_end_us(payload, message.timestamp());
                stats.record_received(payload.len() as u64, latency_us);
            }
            Some(Err(error)) => {
                errors_count += 1;
                if errors_count <= CLIENT_ERRORS_PRINTED_MAX {
                    eprintln!("[{}] consume error: {error}", spec.label);
                }
            }
            None => {}
        }
        if spec.mode == ConsumerMode::Subscribe && last_commit.elapsed() >= COMMIT_INTERVAL {
            // Asynchronous, and only every few seconds: a synchronous commit per poll was
            // one of the harness bugs the OMB forks fixed.
            let _ = consumer.commit_consumer_state(CommitMode::Async);
            last_commit = Instant::now();
        }
    }
}

fn end_to_end_us(payload: &[u8], timestamp: Timestamp) -> Option<u64> {
    if let Some(sent_ns) = payload_timestamp_ns(payload) {
        return Some(monotonic_ns().saturating_sub(sent_ns) / 1_000);
    }
    match timestamp {
        Timestamp::CreateTime(ms) | Timestamp::LogAppendTime(ms) => Some((wall_ms() - ms).max(0) as u64 * 1_000),
        Timestamp::NotAvailable => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_timestamp_round_trip() {
        let mut payload = vec![7u8; 32];
        stamp_payload(&mut payload, 123_456_789);
        assert_eq!(payload_timestamp_ns(&payload), Some(123_456_789));
        assert_eq!(payload[16..], [7u8; 16]);
        let mut short = vec![0u8; 10];
        stamp_payload(&mut short, 5);
        assert_eq!(short, vec![0u8; 10]);
        assert_eq!(payload_timestamp_ns(&short), None);
    }

    #[test]
    fn java_only_settings_are_dropped() {
        let mut warnings = Vec::new();
        let props =
            vec![("acks".to_string(), "all".to_string()), ("default.api.timeout.ms".to_string(), "600000".to_string())];
        let config = client_config(&props, &mut warnings);
        assert_eq!(config.get("acks"), Some("all"));
        assert_eq!(config.get("default.api.timeout.ms"), None);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
    }
}
