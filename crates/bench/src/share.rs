//! A compact share consumer (KIP-932) for the queue workload, speaking the wire protocol.
//!
//! librdkafka has no share consumer, and the bench measures in one process (end-to-end
//! latency uses this process's `CLOCK_MONOTONIC`, stamped by the librdkafka producers), so
//! this module speaks the share-group APIs itself with the `kafka-protocol` crate over
//! blocking TCP, one thread per consumer like the bench's other clients. It works against
//! any broker that offers ShareGroupHeartbeat, ShareFetch and ShareAcknowledge v1 (Sluice,
//! Apache Kafka 4.1+):
//!
//! - FindCoordinator (key type 0: the group) finds the group coordinator; ShareGroupHeartbeat
//!   v1 joins with epoch 0 and a member id made here (as Kafka 4.x clients do), heartbeats at
//!   the interval the coordinator asks for, rejoins when fenced and leaves (epoch -1) at the
//!   end. Assignments name topics by id; Metadata v12 gives each partition's leader.
//! - ShareFetch v1 to each leader, one share session per leader (epoch 0 opens it, then 1,
//!   2, ...), carrying the acknowledgements of the records worked since the previous fetch,
//!   as `KafkaShareConsumer` does in explicit acknowledgement mode when the application
//!   calls `acknowledge(record)` and then `poll` again.
//! - Each acquired record is "worked" (the thread sleeps the workload's work time), then
//!   accepted. Offsets of an acquired range that hold no record (transaction markers,
//!   compacted records) are acknowledged as gaps, as Kafka's client does.
//! - At the end, ShareAcknowledge with epoch -1 sends the last acceptances, releases what
//!   was acquired and not worked, and closes each session.
//!
//! End-to-end latency is taken when a record's work starts (the record was delivered to
//! the application), so it includes the wait behind the records fetched with it, as
//! RabbitMQ PerfTest's consumer latency includes the wait behind its prefetched messages.
//! Also counted: records delivered, redeliveries (delivery count above 1), acceptances the
//! broker confirmed and acknowledgement errors ([`QueueStats`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use kafka_protocol::messages::api_versions_request::ApiVersionsRequest;
use kafka_protocol::messages::incremental_alter_configs_request::{AlterConfigsResource, AlterableConfig};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::share_acknowledge_request::{self as ack_request, AcknowledgeTopic};
use kafka_protocol::messages::share_fetch_request::{self as fetch_request, FetchTopic, ForgottenTopic};
use kafka_protocol::messages::{
    ApiKey, FindCoordinatorRequest, GroupId, IncrementalAlterConfigsRequest, MetadataRequest, RequestKind,
    ResponseKind, ShareAcknowledgeRequest, ShareFetchRequest, ShareGroupHeartbeatRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::RecordBatchDecoder;
use kafka_protocol::ResponseError;
use uuid::Uuid;

use crate::kafka::{first_bootstrap, monotonic_ns, payload_timestamp_ns, ConsumerControl};
use crate::stats::ClientStats;

/// The version of each share-group API spoken (the first GA one, Kafka 4.1+).
pub const SHARE_API_VERSION: i16 = 1;
const METADATA_VERSION: i16 = 12;
const FIND_COORDINATOR_VERSION: i16 = 4;
const INCREMENTAL_ALTER_CONFIGS_VERSION: i16 = 1;
/// FindCoordinator key type of a group (share groups use the group coordinator).
const COORDINATOR_KEY_TYPE_GROUP: i8 = 0;
/// IncrementalAlterConfigs resource type of a group.
const RESOURCE_TYPE_GROUP: i8 = 32;
/// IncrementalAlterConfigs operation SET.
const CONFIG_OPERATION_SET: i8 = 0;
/// Acknowledge types (KIP-932).
const ACKNOWLEDGE_GAP: i8 = 0;
const ACKNOWLEDGE_ACCEPT: i8 = 1;
const ACKNOWLEDGE_RELEASE: i8 = 2;
/// Member epoch that leaves the group; share session epoch that closes the session.
const EPOCH_LEAVE: i32 = -1;
/// The group config that makes a new share group start from the log start.
pub const CONFIG_AUTO_OFFSET_RESET: &str = "share.auto.offset.reset";

/// Client id on every request.
const CLIENT_ID: &str = "sluice-bench-share";
/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a request may wait for its answer (above any long poll).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest answer read.
const RESPONSE_BYTES_MAX: usize = 64 * 1024 * 1024;
/// ShareFetch long poll: short enough that heartbeats and the stop flag are served.
const FETCH_WAIT_MS: i32 = 200;
/// ShareFetch byte budget.
const FETCH_BYTES_MAX: i32 = 1024 * 1024;
/// Sleep of a member that has no partitions (or is paused) before looking again.
const IDLE_WAIT: Duration = Duration::from_millis(20);
/// Wait before retrying after a coordinator error or a failed round.
const RETRY_BACKOFF: Duration = Duration::from_millis(500);
/// How long a coordinator may stay unavailable before the consumer gives up (and starts over).
const COORDINATOR_WAIT: Duration = Duration::from_secs(30);
/// Errors printed per consumer before going quiet.
const ERRORS_PRINTED_MAX: usize = 5;

const _: () = assert!(FETCH_WAIT_MS > 0 && (FETCH_WAIT_MS as u64) < REQUEST_TIMEOUT.as_millis() as u64);

/// Totals of every share consumer of a run; the collector takes differences.
#[derive(Debug, Default)]
pub struct QueueStats {
    delivered: AtomicU64,
    redelivered: AtomicU64,
    acknowledged: AtomicU64,
    acknowledge_errors: AtomicU64,
    released: AtomicU64,
    fetches: AtomicU64,
    restarts: AtomicU64,
}

/// A snapshot of [`QueueStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueCounters {
    /// Records handed to the work loop (first deliveries and redeliveries).
    pub delivered: u64,
    /// Of those, records whose delivery count was above 1.
    pub redelivered: u64,
    /// Acceptances the broker confirmed.
    pub acknowledged: u64,
    /// Acknowledgements the broker refused or that were lost with a share session.
    pub acknowledge_errors: u64,
    /// Records acquired and released unworked at the end.
    pub released: u64,
    /// ShareFetch requests answered.
    pub fetches: u64,
    /// Consumers that started over after an error.
    pub restarts: u64,
}

impl QueueStats {
    /// Running totals.
    pub fn counters(&self) -> QueueCounters {
        QueueCounters {
            delivered: self.delivered.load(Ordering::Relaxed),
            redelivered: self.redelivered.load(Ordering::Relaxed),
            acknowledged: self.acknowledged.load(Ordering::Relaxed),
            acknowledge_errors: self.acknowledge_errors.load(Ordering::Relaxed),
            released: self.released.load(Ordering::Relaxed),
            fetches: self.fetches.load(Ordering::Relaxed),
            restarts: self.restarts.load(Ordering::Relaxed),
        }
    }
}

impl QueueCounters {
    /// What happened since `earlier`.
    pub fn since(&self, earlier: &QueueCounters) -> QueueCounters {
        QueueCounters {
            delivered: self.delivered - earlier.delivered,
            redelivered: self.redelivered - earlier.redelivered,
            acknowledged: self.acknowledged - earlier.acknowledged,
            acknowledge_errors: self.acknowledge_errors - earlier.acknowledge_errors,
            released: self.released - earlier.released,
            fetches: self.fetches - earlier.fetches,
            restarts: self.restarts - earlier.restarts,
        }
    }
}

/// One request/answer connection to a broker.
pub struct Connection {
    stream: TcpStream,
    correlation_id: i32,
    address: String,
}

impl Connection {
    /// Connects to `address` (`host:port`), preferring IPv4 as the brokers here listen on it.
    pub fn connect(address: &str) -> anyhow::Result<Connection> {
        let mut addrs: Vec<_> = address.to_socket_addrs().with_context(|| format!("resolving {address}"))?.collect();
        addrs.sort_by_key(|a| !a.is_ipv4());
        let addr = addrs.first().ok_or_else(|| anyhow!("no address for {address}"))?;
        let stream =
            TcpStream::connect_timeout(addr, CONNECT_TIMEOUT).with_context(|| format!("connecting to {address}"))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
        stream.set_write_timeout(Some(REQUEST_TIMEOUT))?;
        Ok(Connection { stream, correlation_id: 0, address: address.to_string() })
    }

    /// Sends one request and reads its answer.
    pub fn call(&mut self, api_key: ApiKey, version: i16, body: RequestKind) -> anyhow::Result<ResponseKind> {
        self.correlation_id = self.correlation_id.wrapping_add(1);
        let frame = sluice_protocol::encode_request(api_key, version, self.correlation_id, CLIENT_ID, &body)?;
        let what = || format!("{api_key:?} v{version} to {}", self.address);
        self.stream.write_all(&frame).with_context(what)?;
        let mut size = [0u8; 4];
        self.stream.read_exact(&mut size).with_context(what)?;
        let size = usize::try_from(i32::from_be_bytes(size)).context("negative answer size")?;
        if size > RESPONSE_BYTES_MAX {
            bail!("{}: answer of {size} bytes is over {RESPONSE_BYTES_MAX}", what());
        }
        let mut answer = vec![0u8; size];
        self.stream.read_exact(&mut answer).with_context(what)?;
        let (correlation_id, response) = sluice_protocol::decode_response(api_key, version, Bytes::from(answer))
            .with_context(|| format!("decoding the answer to {}", what()))?;
        if correlation_id != self.correlation_id {
            bail!("{}: answer has correlation id {correlation_id}, expected {}", what(), self.correlation_id);
        }
        Ok(response)
    }
}

/// Calls `$key` and unwraps the answer of the same kind.
macro_rules! call_api {
    ($connection:expr, $key:ident, $version:expr, $request:expr) => {
        match $connection.call(ApiKey::$key, $version, RequestKind::$key($request))? {
            ResponseKind::$key(response) => response,
            other => return Err(anyhow!("{} answered with {other:?}", stringify!($key)).into()),
        }
    };
}

fn str_bytes(text: &str) -> StrBytes {
    StrBytes::from_string(text.to_string())
}

fn error_of(code: i16) -> Option<ResponseError> {
    ResponseError::try_from_code(code)
}

/// Fails unless the broker at `bootstrap` offers the share-group APIs this client speaks.
pub fn check_share_support(bootstrap: &str) -> anyhow::Result<()> {
    let mut connection = Connection::connect(first_bootstrap(bootstrap))?;
    let response = call_api!(connection, ApiVersions, 0, ApiVersionsRequest::default());
    if let Some(error) = error_of(response.error_code) {
        bail!("ApiVersions: {error}");
    }
    for key in [ApiKey::ShareGroupHeartbeat, ApiKey::ShareFetch, ApiKey::ShareAcknowledge] {
        let offered = response.api_keys.iter().find(|api| api.api_key == key as i16);
        let supported =
            offered.is_some_and(|api| api.min_version <= SHARE_API_VERSION && SHARE_API_VERSION <= api.max_version);
        if !supported {
            bail!(
                "the broker does not offer {key:?} v{SHARE_API_VERSION} (share groups, KIP-932); \
                 Kafka needs 4.1 or later with the share.version feature at 1"
            );
        }
    }
    Ok(())
}

/// Sets group configs (IncrementalAlterConfigs on a GROUP resource), e.g.
/// `share.auto.offset.reset=earliest`, so a share group reads its topics from the start.
pub fn set_group_configs(bootstrap: &str, group_id: &str, configs: &[(&str, &str)]) -> anyhow::Result<()> {
    let mut connection = Connection::connect(first_bootstrap(bootstrap))?;
    let mut resource = AlterConfigsResource::default();
    resource.resource_type = RESOURCE_TYPE_GROUP;
    resource.resource_name = str_bytes(group_id);
    resource.configs = configs
        .iter()
        .map(|(name, value)| {
            let mut config = AlterableConfig::default();
            config.name = str_bytes(name);
            config.config_operation = CONFIG_OPERATION_SET;
            config.value = Some(str_bytes(value));
            config
        })
        .collect();
    let mut request = IncrementalAlterConfigsRequest::default();
    request.resources = vec![resource];
    let response = call_api!(connection, IncrementalAlterConfigs, INCREMENTAL_ALTER_CONFIGS_VERSION, request);
    for result in response.responses {
        if let Some(error) = error_of(result.error_code) {
            let message = result.error_message.map(|m| m.to_string()).unwrap_or_default();
            bail!("setting configs of group {group_id}: {error} {message}");
        }
    }
    Ok(())
}

/// Brokers and partition leaders of the topics a consumer reads.
#[derive(Debug, Default)]
struct ClusterView {
    /// node id -> `host:port`
    brokers: HashMap<i32, String>,
    /// (topic id, partition) -> leader node id
    leaders: HashMap<(Uuid, i32), i32>,
}

fn cluster_view(connection: &mut Connection, topic: &str) -> anyhow::Result<ClusterView> {
    let mut wanted = MetadataRequestTopic::default();
    wanted.name = Some(TopicName(str_bytes(topic)));
    let mut request = MetadataRequest::default();
    request.topics = Some(vec![wanted]);
    let response = call_api!(connection, Metadata, METADATA_VERSION, request);
    let mut view = ClusterView::default();
    for broker in response.brokers {
        view.brokers.insert(broker.node_id.0, format!("{}:{}", broker.host, broker.port));
    }
    for topic in response.topics {
        if let Some(error) = error_of(topic.error_code) {
            bail!("metadata of topic {:?}: {error}", topic.name.map(|n| n.0.to_string()));
        }
        for partition in topic.partitions {
            view.leaders.insert((topic.topic_id, partition.partition_index), partition.leader_id.0);
        }
    }
    Ok(view)
}

/// What one share consumer does.
#[derive(Debug, Clone)]
pub struct ShareConsumerSpec {
    /// Label in messages and the thread name.
    pub label: String,
    /// Where to bootstrap from.
    pub bootstrap: String,
    /// The share group.
    pub group_id: String,
    /// The topic subscribed to.
    pub topic: String,
    /// How long each record is "worked" before it is accepted.
    pub work: Duration,
    /// ShareFetch `MaxRecords` (and `BatchSize`).
    pub max_records_per_fetch: u32,
}

/// Starts a share consumer thread; it runs until `control.stop`, starting over (as a new
/// member) after an error.
pub fn spawn_share_consumer(
    spec: ShareConsumerSpec,
    stats: Arc<ClientStats>,
    queue: Arc<QueueStats>,
    control: Arc<ConsumerControl>,
) -> anyhow::Result<JoinHandle<()>> {
    assert!(spec.max_records_per_fetch >= 1 && spec.max_records_per_fetch <= crate::workload::RECORDS_PER_FETCH_MAX);
    let handle = std::thread::Builder::new().name(spec.label.clone()).spawn(move || {
        let mut errors_count = 0usize;
        while !control.stop.load(Ordering::Relaxed) {
            let Err(error) = run_member(&spec, &stats, &queue, &control) else { break };
            errors_count += 1;
            if errors_count <= ERRORS_PRINTED_MAX {
                eprintln!("[{}] share consumer error, starting over: {error:#}", spec.label);
            }
            queue.restarts.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(RETRY_BACKOFF);
        }
    })?;
    Ok(handle)
}

/// One membership: join, fetch and work until stopped, then close the sessions and leave.
fn run_member(
    spec: &ShareConsumerSpec,
    stats: &ClientStats,
    queue: &QueueStats,
    control: &ConsumerControl,
) -> anyhow::Result<()> {
    let mut member = Member::join(spec)?;
    let mut fetcher = Fetcher::new(spec, queue);
    while !control.stop.load(Ordering::Relaxed) {
        member.heartbeat_if_due()?;
        if control.paused.load(Ordering::Relaxed) || member.assignment.is_empty() {
            std::thread::sleep(IDLE_WAIT);
            continue;
        }
        let leaders = fetcher.leaders_of(&member.assignment)?;
        for leader in leaders {
            let deliveries = match fetcher.fetch(leader, &member) {
                Ok(deliveries) => deliveries,
                Err(FetchError::Rejoin) => {
                    member.rejoin();
                    break;
                }
                Err(FetchError::Other(error)) => return Err(error),
            };
            fetcher.work(leader, deliveries, stats, control);
        }
    }
    fetcher.close(&member);
    member.leave();
    Ok(())
}

/// Group membership through the coordinator.
struct Member<'a> {
    spec: &'a ShareConsumerSpec,
    member_id: String,
    coordinator: Connection,
    epoch: i32,
    heartbeat_interval: Duration,
    next_heartbeat: Instant,
    assignment: BTreeSet<(Uuid, i32)>,
}

/// Finds the group coordinator and connects to it. A broker whose offsets topic is still
/// being created answers COORDINATOR_NOT_AVAILABLE for a while (Kafka right after start):
/// retried until [`COORDINATOR_WAIT`].
fn find_coordinator(bootstrap: &str, group_id: &str) -> anyhow::Result<Connection> {
    let mut connection = Connection::connect(first_bootstrap(bootstrap))?;
    let started = Instant::now();
    loop {
        let mut request = FindCoordinatorRequest::default();
        request.key_type = COORDINATOR_KEY_TYPE_GROUP;
        request.coordinator_keys = vec![str_bytes(group_id)];
        let response = call_api!(connection, FindCoordinator, FIND_COORDINATOR_VERSION, request);
        let coordinator = response.coordinators.first().ok_or_else(|| anyhow!("FindCoordinator: no answer"))?;
        match error_of(coordinator.error_code) {
            None => return Connection::connect(&format!("{}:{}", coordinator.host, coordinator.port)),
            Some(error) if error.is_retriable() && started.elapsed() < COORDINATOR_WAIT => {
                std::thread::sleep(RETRY_BACKOFF);
            }
            Some(error) => bail!("FindCoordinator for group {group_id}: {error}"),
        }
    }
}

impl<'a> Member<'a> {
    fn join(spec: &'a ShareConsumerSpec) -> anyhow::Result<Member<'a>> {
        let coordinator = find_coordinator(&spec.bootstrap, &spec.group_id)?;
        let mut member = Member {
            spec,
            // Kafka 4.x clients make their member id (a UUID); 32 hex digits fit the
            // brokers' 36-character limit.
            member_id: Uuid::new_v4().simple().to_string(),
            coordinator,
            epoch: 0,
            heartbeat_interval: Duration::from_secs(1),
            next_heartbeat: Instant::now(),
            assignment: BTreeSet::new(),
        };
        member.heartbeat(false)?;
        Ok(member)
    }

    fn heartbeat_if_due(&mut self) -> anyhow::Result<()> {
        if Instant::now() >= self.next_heartbeat {
            self.heartbeat(false)?;
        }
        Ok(())
    }

    /// Forgets the membership; the next heartbeat joins again (epoch 0).
    fn rejoin(&mut self) {
        self.epoch = 0;
        self.assignment.clear();
        self.next_heartbeat = Instant::now();
    }

    fn heartbeat(&mut self, leaving: bool) -> anyhow::Result<()> {
        let mut request = ShareGroupHeartbeatRequest::default();
        request.group_id = GroupId(str_bytes(&self.spec.group_id));
        request.member_id = str_bytes(&self.member_id);
        request.member_epoch = if leaving { EPOCH_LEAVE } else { self.epoch };
        // The subscription goes with the join; later heartbeats leave it unchanged (null).
        if self.epoch == 0 && !leaving {
            request.subscribed_topic_names = Some(vec![TopicName(str_bytes(&self.spec.topic))]);
        }
        let response = call_api!(self.coordinator, ShareGroupHeartbeat, SHARE_API_VERSION, request);
        match error_of(response.error_code) {
            None => {}
            Some(ResponseError::UnknownMemberId | ResponseError::FencedMemberEpoch) if !leaving => {
                self.rejoin();
                return Ok(());
            }
            Some(
                ResponseError::NotCoordinator
                | ResponseError::CoordinatorNotAvailable
                | ResponseError::CoordinatorLoadInProgress,
            ) if !leaving => {
                self.coordinator = find_coordinator(&self.spec.bootstrap, &self.spec.group_id)?;
                self.next_heartbeat = Instant::now() + RETRY_BACKOFF;
                return Ok(());
            }
            Some(error) => {
                let message = response.error_message.map(|m| m.to_string()).unwrap_or_default();
                bail!("ShareGroupHeartbeat (epoch {}): {error} {message}", self.epoch);
            }
        }
        if leaving {
            return Ok(());
        }
        self.epoch = response.member_epoch;
        let interval_ms = u64::try_from(response.heartbeat_interval_ms).unwrap_or(0).max(100);
        self.heartbeat_interval = Duration::from_millis(interval_ms);
        self.next_heartbeat = Instant::now() + self.heartbeat_interval;
        if let Some(assignment) = response.assignment {
            self.assignment = assignment
                .topic_partitions
                .iter()
                .flat_map(|t| t.partitions.iter().map(move |p| (t.topic_id, *p)))
                .collect();
        }
        Ok(())
    }

    fn leave(&mut self) {
        if self.epoch != 0 {
            let _ = self.heartbeat(true);
        }
    }
}

/// A record (or a gap) acquired for this member.
#[derive(Debug, Clone, PartialEq)]
struct Delivery {
    partition: (Uuid, i32),
    offset: i64,
    delivery_count: i16,
    /// The record's value; `None` for an offset without a record (a gap).
    value: Option<Bytes>,
}

/// The share session with one partition leader.
struct LeaderSession {
    connection: Connection,
    /// 0 = no session yet (the next ShareFetch opens one).
    epoch: i32,
    in_session: BTreeSet<(Uuid, i32)>,
    /// Acknowledgements not sent yet: partition -> (offset, type).
    acks: BTreeMap<(Uuid, i32), Vec<(i64, i8)>>,
}

impl LeaderSession {
    fn next_epoch(&mut self) {
        self.epoch = if self.epoch == i32::MAX { 1 } else { self.epoch + 1 };
    }

    /// Drops the session (the broker lost or refused it); unsent acknowledgements are lost
    /// with it and their records come back after the acquisition lock.
    fn reset(&mut self, queue: &QueueStats) {
        let lost: usize = self.acks.values().map(Vec::len).sum();
        queue.acknowledge_errors.fetch_add(lost as u64, Ordering::Relaxed);
        self.acks.clear();
        self.in_session.clear();
        self.epoch = 0;
    }
}

enum FetchError {
    /// The member is unknown or fenced: join again.
    Rejoin,
    Other(anyhow::Error),
}

impl From<anyhow::Error> for FetchError {
    fn from(error: anyhow::Error) -> Self {
        FetchError::Other(error)
    }
}

/// Share sessions with the leaders of a member's partitions.
struct Fetcher<'a> {
    spec: &'a ShareConsumerSpec,
    queue: &'a QueueStats,
    view: ClusterView,
    sessions: BTreeMap<i32, LeaderSession>,
}

/// Coalesces (offset, type) pairs into acknowledgement batches of one type each.
fn ack_batches(acks: &mut [(i64, i8)]) -> Vec<(i64, i64, i8)> {
    acks.sort_unstable();
    let mut batches: Vec<(i64, i64, i8)> = Vec::new();
    for &(offset, kind) in acks.iter() {
        match batches.last_mut() {
            Some(last) if last.1 + 1 == offset && last.2 == kind => last.1 = offset,
            _ => batches.push((offset, offset, kind)),
        }
    }
    batches
}

fn fetch_partition(partition: i32, acks: Option<&mut Vec<(i64, i8)>>) -> fetch_request::FetchPartition {
    let mut wire = fetch_request::FetchPartition::default();
    wire.partition_index = partition;
    if let Some(acks) = acks {
        wire.acknowledgement_batches = ack_batches(acks)
            .into_iter()
            .map(|(first, last, kind)| {
                let mut batch = fetch_request::AcknowledgementBatch::default();
                batch.first_offset = first;
                batch.last_offset = last;
                batch.acknowledge_types = vec![kind];
                batch
            })
            .collect();
    }
    wire
}

/// The records of `records` (stored batches) at the offsets of `ranges`, in offset order;
/// offsets without a record become gaps. Control records are not the application's.
fn deliveries_of(
    partition: (Uuid, i32),
    records: Option<Bytes>,
    ranges: &[(i64, i64, i16)],
) -> anyhow::Result<Vec<Delivery>> {
    let mut values: BTreeMap<i64, Option<Bytes>> = BTreeMap::new();
    if let Some(mut bytes) = records.filter(|b| !b.is_empty()) {
        let sets = RecordBatchDecoder::decode_all(&mut bytes).context("decoding share-fetched records")?;
        for record in sets.into_iter().flat_map(|set| set.records) {
            if !record.control {
                values.insert(record.offset, record.value);
            }
        }
    }
    let mut deliveries = Vec::new();
    for &(first, last, delivery_count) in ranges {
        assert!(first <= last, "acquired range {first}..={last}");
        for offset in first..=last {
            // A record with a null value is still a record: deliver it with no bytes.
            let value = values.get(&offset).map(|v| v.clone().unwrap_or_default());
            deliveries.push(Delivery { partition, offset, delivery_count, value });
        }
    }
    deliveries.sort_by_key(|d| (d.partition, d.offset));
    Ok(deliveries)
}

impl<'a> Fetcher<'a> {
    fn new(spec: &'a ShareConsumerSpec, queue: &'a QueueStats) -> Fetcher<'a> {
        Fetcher { spec, queue, view: ClusterView::default(), sessions: BTreeMap::new() }
    }

    /// The leaders of `assignment`, refreshing metadata when a partition's is unknown.
    fn leaders_of(&mut self, assignment: &BTreeSet<(Uuid, i32)>) -> anyhow::Result<BTreeSet<i32>> {
        if assignment.iter().any(|key| !self.view.leaders.contains_key(key)) {
            let mut connection = Connection::connect(first_bootstrap(&self.spec.bootstrap))?;
            self.view = cluster_view(&mut connection, &self.spec.topic)?;
        }
        let leaders: BTreeSet<i32> = assignment.iter().filter_map(|key| self.view.leaders.get(key).copied()).collect();
        // Leaders that lead nothing assigned any more still get a fetch: it forgets their
        // partitions and sends their last acknowledgements.
        Ok(leaders.into_iter().chain(self.sessions.keys().copied()).collect())
    }

    fn session(&mut self, leader: i32) -> anyhow::Result<&mut LeaderSession> {
        if !self.sessions.contains_key(&leader) {
            let address = self.view.brokers.get(&leader).ok_or_else(|| anyhow!("no address for broker {leader}"))?;
            let connection = Connection::connect(address)?;
            let session = LeaderSession { connection, epoch: 0, in_session: BTreeSet::new(), acks: BTreeMap::new() };
            self.sessions.insert(leader, session);
        }
        Ok(self.sessions.get_mut(&leader).expect("inserted above"))
    }

    /// One ShareFetch to `leader`: sends the pending acknowledgements, acquires records.
    fn fetch(&mut self, leader: i32, member: &Member<'_>) -> Result<Vec<Delivery>, FetchError> {
        let wanted: BTreeSet<(Uuid, i32)> =
            member.assignment.iter().filter(|key| self.view.leaders.get(key) == Some(&leader)).copied().collect();
        let (max_records, group_id, member_id) =
            (self.spec.max_records_per_fetch as i32, &self.spec.group_id, &member.member_id);
        let queue = self.queue;
        let session = self.session(leader)?;
        if session.epoch == 0 && wanted.is_empty() {
            return Ok(Vec::new());
        }
        if session.epoch == 0 && !session.acks.is_empty() {
            // A new session cannot carry acknowledgements (INVALID_REQUEST).
            session.reset(queue);
        }
        let opening = session.epoch == 0;
        let forgotten: Vec<(Uuid, i32)> = session.in_session.difference(&wanted).copied().collect();
        let mut listed: BTreeSet<(Uuid, i32)> = wanted.difference(&session.in_session).copied().collect();
        listed.extend(session.acks.keys().copied());
        let mut acks = std::mem::take(&mut session.acks);
        let mut by_topic: BTreeMap<Uuid, Vec<fetch_request::FetchPartition>> = BTreeMap::new();
        for key in &listed {
            by_topic.entry(key.0).or_default().push(fetch_partition(key.1, acks.get_mut(key)));
        }
        let mut request = ShareFetchRequest::default();
        request.group_id = Some(GroupId(str_bytes(group_id)));
        request.member_id = Some(str_bytes(member_id));
        request.share_session_epoch = session.epoch;
        request.max_wait_ms = FETCH_WAIT_MS;
        request.min_bytes = 1;
        request.max_bytes = FETCH_BYTES_MAX;
        request.max_records = max_records;
        request.batch_size = max_records;
        request.topics = by_topic
            .into_iter()
            .map(|(topic_id, partitions)| {
                let mut topic = FetchTopic::default();
                topic.topic_id = topic_id;
                topic.partitions = partitions;
                topic
            })
            .collect();
        let mut forgotten_by_topic: BTreeMap<Uuid, Vec<i32>> = BTreeMap::new();
        for (topic_id, partition) in &forgotten {
            forgotten_by_topic.entry(*topic_id).or_default().push(*partition);
        }
        request.forgotten_topics_data = forgotten_by_topic
            .into_iter()
            .map(|(topic_id, partitions)| {
                let mut topic = ForgottenTopic::default();
                topic.topic_id = topic_id;
                topic.partitions = partitions;
                topic
            })
            .collect();
        let response = call_api!(session.connection, ShareFetch, SHARE_API_VERSION, request);
        queue.fetches.fetch_add(1, Ordering::Relaxed);
        let sent_acks: BTreeMap<(Uuid, i32), u64> = acks.iter().map(|(key, list)| (*key, list.len() as u64)).collect();
        match error_of(response.error_code) {
            None => {}
            Some(ResponseError::ShareSessionNotFound | ResponseError::InvalidShareSessionEpoch) => {
                session.acks = acks;
                session.reset(queue);
                return Ok(Vec::new());
            }
            Some(ResponseError::UnknownMemberId | ResponseError::FencedMemberEpoch) => {
                session.acks = acks;
                session.reset(queue);
                return Err(FetchError::Rejoin);
            }
            Some(error) => {
                let message = response.error_message.map(|m| m.to_string()).unwrap_or_default();
                return Err(anyhow!("ShareFetch (session epoch {}): {error} {message}", session.epoch).into());
            }
        }
        session.next_epoch();
        if opening {
            session.in_session = wanted;
        } else {
            session.in_session.extend(listed.iter().filter(|key| member.assignment.contains(key)));
            for key in &forgotten {
                session.in_session.remove(key);
            }
        }
        let mut acks_answered: BTreeMap<(Uuid, i32), i16> = BTreeMap::new();
        let mut deliveries = Vec::new();
        let mut stale_leaders = false;
        for topic in response.responses {
            for partition in topic.partitions {
                let key = (topic.topic_id, partition.partition_index);
                acks_answered.insert(key, partition.acknowledge_error_code);
                match error_of(partition.error_code) {
                    None => {}
                    Some(ResponseError::NotLeaderOrFollower | ResponseError::UnknownTopicOrPartition) => {
                        stale_leaders = true;
                        continue;
                    }
                    Some(error) => return Err(anyhow!("ShareFetch of {key:?}: {error}").into()),
                }
                let ranges: Vec<(i64, i64, i16)> = partition
                    .acquired_records
                    .iter()
                    .map(|r| (r.first_offset, r.last_offset, r.delivery_count))
                    .collect();
                deliveries.extend(deliveries_of(key, partition.records, &ranges)?);
            }
        }
        // A partition whose acknowledgements drew no error code is taken as accepted: the
        // request as a whole succeeded.
        for (key, count) in sent_acks {
            let counter = match acks_answered.get(&key) {
                Some(code) if *code != 0 => &queue.acknowledge_errors,
                _ => &queue.acknowledged,
            };
            counter.fetch_add(count, Ordering::Relaxed);
        }
        if stale_leaders {
            self.view.leaders.clear();
        }
        Ok(deliveries)
    }

    /// Works through `deliveries` in order: each record is worked, then accepted; gaps are
    /// acknowledged as such; once stopped, the rest are released.
    fn work(&mut self, leader: i32, deliveries: Vec<Delivery>, stats: &ClientStats, control: &ConsumerControl) {
        let Some(session) = self.sessions.get_mut(&leader) else {
            assert!(deliveries.is_empty(), "deliveries from a leader without a session");
            return;
        };
        for delivery in deliveries {
            let acks = session.acks.entry(delivery.partition).or_default();
            let Some(value) = delivery.value else {
                acks.push((delivery.offset, ACKNOWLEDGE_GAP));
                continue;
            };
            if control.stop.load(Ordering::Relaxed) {
                self.queue.released.fetch_add(1, Ordering::Relaxed);
                acks.push((delivery.offset, ACKNOWLEDGE_RELEASE));
                continue;
            }
            let latency_us = payload_timestamp_ns(&value).map(|sent_ns| monotonic_ns().saturating_sub(sent_ns) / 1_000);
            stats.record_received(value.len() as u64, latency_us);
            self.queue.delivered.fetch_add(1, Ordering::Relaxed);
            if delivery.delivery_count > 1 {
                self.queue.redelivered.fetch_add(1, Ordering::Relaxed);
            }
            if !self.spec.work.is_zero() {
                std::thread::sleep(self.spec.work);
            }
            acks.push((delivery.offset, ACKNOWLEDGE_ACCEPT));
        }
    }

    /// Sends the last acknowledgements and closes every session (ShareAcknowledge, epoch -1).
    fn close(&mut self, member: &Member<'_>) {
        let (group_id, member_id) = (&self.spec.group_id, &member.member_id);
        for session in self.sessions.values_mut() {
            if session.epoch == 0 {
                continue;
            }
            let mut acks = std::mem::take(&mut session.acks);
            let sent: u64 = acks.values().map(|list| list.len() as u64).sum();
            let mut by_topic: BTreeMap<Uuid, Vec<ack_request::AcknowledgePartition>> = BTreeMap::new();
            for ((topic_id, partition), list) in acks.iter_mut() {
                let mut wire = ack_request::AcknowledgePartition::default();
                wire.partition_index = *partition;
                wire.acknowledgement_batches = ack_batches(list)
                    .into_iter()
                    .map(|(first, last, kind)| {
                        let mut batch = ack_request::AcknowledgementBatch::default();
                        batch.first_offset = first;
                        batch.last_offset = last;
                        batch.acknowledge_types = vec![kind];
                        batch
                    })
                    .collect();
                by_topic.entry(*topic_id).or_default().push(wire);
            }
            let mut request = ShareAcknowledgeRequest::default();
            request.group_id = Some(GroupId(str_bytes(group_id)));
            request.member_id = Some(str_bytes(member_id));
            request.share_session_epoch = EPOCH_LEAVE;
            request.topics = by_topic
                .into_iter()
                .map(|(topic_id, partitions)| {
                    let mut topic = AcknowledgeTopic::default();
                    topic.topic_id = topic_id;
                    topic.partitions = partitions;
                    topic
                })
                .collect();
            let answered = session.connection.call(
                ApiKey::ShareAcknowledge,
                SHARE_API_VERSION,
                RequestKind::ShareAcknowledge(request),
            );
            let failed = match answered {
                Ok(ResponseKind::ShareAcknowledge(response)) => {
                    response.error_code != 0
                        || response.responses.iter().flat_map(|t| t.partitions.iter()).any(|p| p.error_code != 0)
                }
                _ => true,
            };
            let counter = if failed { &self.queue.acknowledge_errors } else { &self.queue.acknowledged };
            counter.fetch_add(sent, Ordering::Relaxed);
            session.epoch = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acknowledgements_coalesce_by_type_and_contiguity() {
        let mut acks = vec![(7, ACKNOWLEDGE_ACCEPT), (5, ACKNOWLEDGE_ACCEPT), (6, ACKNOWLEDGE_ACCEPT)];
        acks.extend([(8, ACKNOWLEDGE_GAP), (9, ACKNOWLEDGE_ACCEPT), (11, ACKNOWLEDGE_ACCEPT)]);
        assert_eq!(
            ack_batches(&mut acks),
            vec![
                (5, 7, ACKNOWLEDGE_ACCEPT),
                (8, 8, ACKNOWLEDGE_GAP),
                (9, 9, ACKNOWLEDGE_ACCEPT),
                (11, 11, ACKNOWLEDGE_ACCEPT)
            ]
        );
        assert!(ack_batches(&mut []).is_empty());
    }

    fn batch_of(offsets: std::ops::Range<i64>) -> Bytes {
        use kafka_protocol::records::{Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};
        let records: Vec<Record> = offsets
            .clone()
            .map(|offset| Record {
                transactional: false,
                control: false,
                partition_leader_epoch: 0,
                producer_id: -1,
                producer_epoch: -1,
                timestamp_type: TimestampType::Creation,
                offset,
                sequence: (offset - offsets.start) as i32,
                timestamp: 0,
                key: None,
                value: Some(Bytes::from(format!("v{offset}"))),
                headers: Default::default(),
                delete_horizon: false,
            })
            .collect();
        let mut out = bytes::BytesMut::new();
        let options = RecordEncodeOptions { version: 2, compression: Compression::None };
        RecordBatchEncoder::encode(&mut out, &records, &options).unwrap();
        out.freeze()
    }

    #[test]
    fn deliveries_are_the_acquired_offsets_with_gaps_for_missing_records() {
        let partition = (Uuid::nil(), 0);
        // Records 10..15 stored; 10-11 acquired by someone else, 12-16 by us (16 has no record).
        let deliveries = deliveries_of(partition, Some(batch_of(10..16)), &[(12, 13, 1), (14, 16, 2)]).unwrap();
        let offsets: Vec<(i64, i16, bool)> =
            deliveries.iter().map(|d| (d.offset, d.delivery_count, d.value.is_some())).collect();
        assert_eq!(offsets, vec![(12, 1, true), (13, 1, true), (14, 2, true), (15, 2, true), (16, 2, false)]);
        assert_eq!(deliveries[0].value.as_deref(), Some(&b"v12"[..]));
        assert!(deliveries_of(partition, None, &[]).unwrap().is_empty());
    }

    #[test]
    fn counters_subtract() {
        let stats = QueueStats::default();
        stats.delivered.fetch_add(5, Ordering::Relaxed);
        let before = stats.counters();
        stats.delivered.fetch_add(3, Ordering::Relaxed);
        stats.redelivered.fetch_add(1, Ordering::Relaxed);
        let delta = stats.counters().since(&before);
        assert_eq!((delta.delivered, delta.redelivered, delta.acknowledged), (3, 1, 0));
    }
}
