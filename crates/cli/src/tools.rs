//! Client subcommands (`topic`, `produce`, `consume`, `group`, `cluster`). They speak the
//! Kafka protocol through `sluice-client`, over any listener (TLS, SASL), so a refused
//! request is reported in the broker's own words and nothing is created by a command that
//! only reads; `consume` fetches through librdkafka (its fetch loop), after the same checks.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::incremental_alter_configs_request::{AlterConfigsResource, AlterableConfig};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::offset_commit_request::{OffsetCommitRequestPartition, OffsetCommitRequestTopic};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestGroup;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, BrokerId, CreateTopicsRequest, DeleteGroupsRequest, DeleteTopicsRequest, DescribeConfigsRequest,
    DescribeGroupsRequest, GroupId, IncrementalAlterConfigsRequest, ListGroupsRequest, ListOffsetsRequest,
    MetadataRequest, OffsetCommitRequest, OffsetFetchRequest, ProduceRequest, RequestKind, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{Compression, Record, RecordBatchEncoder, RecordEncodeOptions};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use serde::Serialize;
use sluice_client::check;

use crate::kafka_connection::{Cluster, ConnectionArgs};
use crate::output::{count, ids, rfc3339_millis, Format, TextTable};

/// How long the broker may take to create or delete a topic, or to store a produced batch.
const BROKER_TIMEOUT_MS: i32 = 30_000;
/// Unhealthy partitions `sluice cluster` names one by one (the rest are only counted).
const CLUSTER_PARTITIONS_LISTED_MAX: usize = 50;
/// Records of `produce` are sent once this many bytes of them are buffered (a longer
/// input is sent as it is read: a pipe of any length is produced in bounded memory).
const PRODUCE_BUFFER_BYTES: usize = 512 * 1024;
/// How long `produce` waits for a topic it created to have leaders.
const PRODUCE_LEADERS_WAIT: Duration = Duration::from_secs(10);

const CREATE_TOPICS_VERSION: i16 = 5;
const DELETE_TOPICS_VERSION: i16 = 5;
const DESCRIBE_CONFIGS_VERSION: i16 = 4;
const ALTER_CONFIGS_VERSION: i16 = 1;
const LIST_OFFSETS_VERSION: i16 = 7;
/// Produce v9: each partition's answer carries the broker's `error_message`.
const PRODUCE_VERSION: i16 = 9;
const METADATA_VERSION: i16 = 12;
/// ListOffsets timestamps: the log start and the high watermark.
const EARLIEST_TIMESTAMP: i64 = -2;
const LATEST_TIMESTAMP: i64 = -1;
/// ListOffsets from a client, not a follower.
const CONSUMER_REPLICA_ID: i32 = -1;
/// DescribeConfigs / IncrementalAlterConfigs resource type of a topic.
const RESOURCE_TOPIC: i8 = 2;
const CONFIG_SET: i8 = 0;
const CONFIG_DELETE: i8 = 1;
/// Metadata error code of a partition whose leader is being elected.
const LEADER_NOT_AVAILABLE: i16 = 5;
const DELETE_GROUPS_VERSION: i16 = 2;
/// ListGroups v5 filters by group type (classic and consumer; `sluice share` lists shares).
const LIST_GROUPS_VERSION: i16 = 5;
const DESCRIBE_GROUPS_VERSION: i16 = 5;
/// OffsetFetch v8: groups in a list, all of a group's topics at once.
const OFFSET_FETCH_VERSION: i16 = 8;
const OFFSET_COMMIT_VERSION: i16 = 8;
/// Metadata error code of a topic the cluster does not have.
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
/// DeleteGroups error codes said in the tool's own words.
const NON_EMPTY_GROUP: i16 = 68;
const GROUP_ID_NOT_FOUND: i16 = 69;

#[derive(Debug, clap::Subcommand)]
pub enum TopicCommand {
    /// Create a topic.
    Create {
        name: String,
        #[arg(long, short = 'p', default_value_t = 1)]
        partitions: i32,
        /// Topic config, repeatable: --config retention.ms=60000
        #[arg(long = "config", short = 'c', value_name = "KEY=VALUE")]
        configs: Vec<String>,
    },
    /// List topics with their partition and replica counts.
    List,
    /// Show partitions (leader, replicas, ISR, offsets) and configs of a topic.
    Describe { name: String },
    /// Set or remove configs of a topic.
    AlterConfig {
        name: String,
        /// Config to set, repeatable: --set retention.ms=60000
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
        /// Config to return to its default, repeatable: --delete retention.ms
        #[arg(long = "delete", value_name = "KEY")]
        delete: Vec<String>,
    },
    /// Delete a topic.
    Delete { name: String },
}

#[derive(Debug, clap::Args)]
pub struct TopicArgs {
    #[command(subcommand)]
    command: TopicCommand,
}

#[derive(Debug, clap::Args)]
pub struct ProduceArgs {
    topic: String,
    /// Split each input line into key and value at the first occurrence of this string.
    #[arg(long)]
    key_separator: Option<String>,
    /// acks: 0, 1 or all.
    #[arg(long, default_value = "all")]
    acks: String,
    /// none, gzip, snappy, lz4 or zstd.
    #[arg(long, default_value = "none")]
    compression: String,
}

#[derive(Debug, clap::Args)]
pub struct ConsumeArgs {
    topic: String,
    /// Start at the earliest offset instead of the end.
    #[arg(long)]
    from_beginning: bool,
    /// Stop after this many records.
    #[arg(long)]
    max_messages: Option<u64>,
    /// Stop when no record arrives for this long (milliseconds).
    #[arg(long)]
    idle_timeout_ms: Option<u64>,
    /// Print partition, offset, timestamp, key and header count before each value.
    #[arg(long)]
    verbose: bool,
}

#[derive(Debug, clap::Args)]
pub struct ClusterArgs {
    #[command(subcommand)]
    pub command: Option<ClusterCommand>,
}

#[derive(Debug, clap::Subcommand)]
pub enum ClusterCommand {
    /// Exit 0 when every registered broker is unfenced and every partition led and fully
    /// replicated; with --wait, once that holds (for scripts).
    Health(crate::cluster_health::HealthArgs),
}

/// `KEY=VALUE` pairs of a flag.
fn pairs(flag: &str, given: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    given
        .iter()
        .map(|pair| match pair.split_once('=') {
            Some((key, value)) if !key.trim().is_empty() => Ok((key.trim().to_string(), value.trim().to_string())),
            _ => bail!("{flag} {pair:?} is not KEY=VALUE"),
        })
        .collect()
}

fn topic_name(name: &str) -> TopicName {
    TopicName(StrBytes::from_string(name.to_string()))
}

pub fn topic(connection: &ConnectionArgs, format: Format, args: TopicArgs) -> anyhow::Result<()> {
    match args.command {
        TopicCommand::Create { name, partitions, configs } => {
            let configs = pairs("--config", &configs)?;
            let mut cluster = connection.cluster()?;
            let mut topic = CreatableTopic::default();
            topic.name = topic_name(&name);
            topic.num_partitions = partitions;
            topic.replication_factor = -1;
            topic.configs = configs
                .into_iter()
                .map(|(key, value)| {
                    CreatableTopicConfig::default()
                        .with_name(StrBytes::from_string(key))
                        .with_value(Some(StrBytes::from_string(value)))
                })
                .collect();
            let mut request = CreateTopicsRequest::default();
            request.topics = vec![topic];
            request.timeout_ms = BROKER_TIMEOUT_MS;
            let response = cluster.bootstrap.send(CREATE_TOPICS_VERSION, request)?;
            for result in &response.topics {
                check(result.error_code, result.error_message.as_deref(), &format!("creating topic {name}"))?;
            }
            println!("created topic {name} with {}", count(usize::try_from(partitions).unwrap_or(0), "partition"));
        }
        TopicCommand::List => list_topics(&mut connection.cluster()?, format)?,
        TopicCommand::Describe { name } => describe_topic(&mut connection.cluster()?, format, &name)?,
        TopicCommand::AlterConfig { name, set, delete } => {
            let set = pairs("--set", &set)?;
            if set.is_empty() && delete.is_empty() {
                bail!("say what to change: --set KEY=VALUE or --delete KEY");
            }
            let mut cluster = connection.cluster()?;
            cluster.topic(&name)?;
            let mut resource = AlterConfigsResource::default();
            resource.resource_type = RESOURCE_TOPIC;
            resource.resource_name = StrBytes::from_string(name.clone());
            for (key, value) in &set {
                resource.configs.push(
                    AlterableConfig::default()
                        .with_name(StrBytes::from_string(key.clone()))
                        .with_config_operation(CONFIG_SET)
                        .with_value(Some(StrBytes::from_string(value.clone()))),
                );
            }
            for key in &delete {
                resource.configs.push(
                    AlterableConfig::default()
                        .with_name(StrBytes::from_string(key.clone()))
                        .with_config_operation(CONFIG_DELETE),
                );
            }
            let mut request = IncrementalAlterConfigsRequest::default();
            request.resources = vec![resource];
            let response = cluster.bootstrap.send(ALTER_CONFIGS_VERSION, request)?;
            for result in &response.responses {
                check(result.error_code, result.error_message.as_deref(), &format!("altering topic {name}"))?;
            }
            println!("altered {} of topic {name}", count(set.len() + delete.len(), "config"));
        }
        TopicCommand::Delete { name } => {
            let mut cluster = connection.cluster()?;
            let mut request = DeleteTopicsRequest::default();
            request.topic_names = vec![topic_name(&name)];
            request.timeout_ms = BROKER_TIMEOUT_MS;
            let response = cluster.bootstrap.send(DELETE_TOPICS_VERSION, request)?;
            for result in &response.responses {
                if result.error_code == 3 {
                    bail!("topic {name} does not exist");
                }
                check(result.error_code, result.error_message.as_deref(), &format!("deleting topic {name}"))?;
            }
            println!("deleted topic {name}");
        }
    }
    Ok(())
}

#[derive(Serialize)]
struct TopicSummary {
    name: String,
    partitions: usize,
    replicas: usize,
    internal: bool,
}

fn list_topics(cluster: &mut Cluster, format: Format) -> anyhow::Result<()> {
    let metadata = cluster.metadata(None)?;
    let mut topics: Vec<TopicSummary> = metadata
        .topics
        .iter()
        .map(|topic| TopicSummary {
            name: topic.name.as_ref().map_or(String::new(), |n| n.to_string()),
            partitions: topic.partitions.len(),
            replicas: topic.partitions.first().map_or(0, |p| p.replica_nodes.len()),
            internal: topic.is_internal,
        })
        .collect();
    topics.sort_by(|a, b| a.name.cmp(&b.name));
    if format.document(&topics)? {
        return Ok(());
    }
    let mut table = TextTable::new(&["NAME", "PARTITIONS", "REPLICAS"]).numeric(&["PARTITIONS", "REPLICAS"]);
    for topic in &topics {
        table.row([topic.name.clone(), topic.partitions.to_string(), topic.replicas.to_string()]);
    }
    table.print();
    Ok(())
}

#[derive(Serialize)]
struct PartitionView {
    partition: i32,
    leader: i32,
    replicas: Vec<i32>,
    isr: Vec<i32>,
    log_start: Option<i64>,
    high_watermark: Option<i64>,
}

#[derive(Serialize)]
struct ConfigView {
    name: String,
    value: Option<String>,
    source: &'static str,
}

#[derive(Serialize)]
struct TopicView {
    name: String,
    partitions: Vec<PartitionView>,
    configs: Vec<ConfigView>,
}

/// Kafka's name of a config's source (DescribeConfigs `config_source`).
fn config_source(code: i8) -> &'static str {
    match code {
        1 => "DYNAMIC_TOPIC_CONFIG",
        2 => "DYNAMIC_BROKER_CONFIG",
        3 => "DYNAMIC_DEFAULT_BROKER_CONFIG",
        4 => "STATIC_BROKER_CONFIG",
        5 => "DEFAULT_CONFIG",
        6 => "DYNAMIC_BROKER_LOGGER_CONFIG",
        _ => "UNKNOWN",
    }
}

fn describe_topic(cluster: &mut Cluster, format: Format, name: &str) -> anyhow::Result<()> {
    let (metadata, topic) = cluster.topic(name)?;
    let mut leaders: BTreeMap<i32, Vec<i32>> = BTreeMap::new();
    for partition in &topic.partitions {
        leaders.entry(partition.leader_id.0).or_default().push(partition.partition_index);
    }
    let addresses = Cluster::addresses(&metadata);
    let mut starts = BTreeMap::new();
    let mut ends = BTreeMap::new();
    for (leader, partitions) in &leaders {
        let Some(address) = addresses.get(leader) else { continue };
        let mut connection = cluster.connect(address)?;
        starts.extend(list_offsets(&mut connection, name, partitions, EARLIEST_TIMESTAMP)?);
        ends.extend(list_offsets(&mut connection, name, partitions, LATEST_TIMESTAMP)?);
    }
    let mut partitions: Vec<PartitionView> = topic
        .partitions
        .iter()
        .map(|p| PartitionView {
            partition: p.partition_index,
            leader: p.leader_id.0,
            replicas: p.replica_nodes.iter().map(|id| id.0).collect(),
            isr: p.isr_nodes.iter().map(|id| id.0).collect(),
            log_start: starts.get(&p.partition_index).copied(),
            high_watermark: ends.get(&p.partition_index).copied(),
        })
        .collect();
    partitions.sort_by_key(|p| p.partition);

    let mut request = DescribeConfigsRequest::default();
    request.resources = vec![DescribeConfigsResource::default()
        .with_resource_type(RESOURCE_TOPIC)
        .with_resource_name(StrBytes::from_string(name.to_string()))
        .with_configuration_keys(None)];
    let response = cluster.bootstrap.send(DESCRIBE_CONFIGS_VERSION, request)?;
    let mut configs = Vec::new();
    for result in response.results {
        check(result.error_code, result.error_message.as_deref(), &format!("configs of topic {name}"))?;
        for config in result.configs {
            let value = if config.is_sensitive { None } else { config.value.map(|v| v.to_string()) };
            configs.push(ConfigView {
                name: config.name.to_string(),
                value,
                source: config_source(config.config_source),
            });
        }
    }
    configs.sort_by(|a, b| a.name.cmp(&b.name));
    let view = TopicView { name: name.to_string(), partitions, configs };
    if format.document(&view)? {
        return Ok(());
    }
    println!("topic {name}: {}", count(view.partitions.len(), "partition"));
    println!();
    let offset = |o: Option<i64>| o.map_or("-".to_string(), |o| o.to_string());
    let mut table = TextTable::new(&["PARTITION", "LEADER", "REPLICAS", "ISR", "LOG-START", "HIGH-WATERMARK"])
        .numeric(&["PARTITION", "LEADER", "LOG-START", "HIGH-WATERMARK"]);
    for p in &view.partitions {
        let leader = if p.leader < 0 { "none".to_string() } else { p.leader.to_string() };
        table.row([
            p.partition.to_string(),
            leader,
            ids(&p.replicas),
            ids(&p.isr),
            offset(p.log_start),
            offset(p.high_watermark),
        ]);
    }
    table.print();
    println!();
    let mut table = TextTable::new(&["CONFIG", "VALUE", "SOURCE"]);
    for config in &view.configs {
        table.row([config.name.clone(), config.value.clone().unwrap_or_else(|| "-".into()), config.source.to_string()]);
    }
    table.print();
    Ok(())
}

/// The offsets at `timestamp` (earliest or latest) of `partitions` of `topic`, asked of
/// their leader.
fn list_offsets(
    leader: &mut sluice_client::KafkaConnection,
    topic: &str,
    partitions: &[i32],
    timestamp: i64,
) -> anyhow::Result<BTreeMap<i32, i64>> {
    let mut request = ListOffsetsRequest::default();
    request.replica_id = BrokerId(CONSUMER_REPLICA_ID);
    request.topics = vec![ListOffsetsTopic::default().with_name(topic_name(topic)).with_partitions(
        partitions
            .iter()
            .map(|&index| ListOffsetsPartition::default().with_partition_index(index).with_timestamp(timestamp))
            .collect(),
    )];
    let response = leader.send(LIST_OFFSETS_VERSION, request)?;
    let mut offsets = BTreeMap::new();
    for answered in response.topics {
        for partition in answered.partitions {
            check(partition.error_code, None, &format!("offsets of {topic}-{}", partition.partition_index))?;
            offsets.insert(partition.partition_index, partition.offset);
        }
    }
    Ok(offsets)
}

/// Kafka's default partitioner for keyed records: murmur2 of the key, made positive.
fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let length = data.len() as u32;
    let mut h: u32 = SEED ^ length;
    let chunks = data.chunks_exact(4);
    let tail = chunks.remainder();
    for chunk in chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    match tail.len() {
        3 => {
            h ^= u32::from(tail[2]) << 16;
            h ^= u32::from(tail[1]) << 8;
            h ^= u32::from(tail[0]);
            h = h.wrapping_mul(M);
        }
        2 => {
            h ^= u32::from(tail[1]) << 8;
            h ^= u32::from(tail[0]);
            h = h.wrapping_mul(M);
        }
        1 => {
            h ^= u32::from(tail[0]);
            h = h.wrapping_mul(M);
        }
        _ => {}
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    (h & 0x7fff_ffff) as i32
}

/// Where `produce` sends its records: each partition's leader.
struct ProduceTarget {
    topic: String,
    /// Leader node of each partition, by partition index (in index order).
    leaders: Vec<(i32, i32)>,
    addresses: BTreeMap<i32, String>,
    acks: i16,
    compression: Compression,
}

/// The topic's partitions and leaders; the topic is created if the broker creates topics
/// on first use (producing is a write: as with any producer).
fn produce_target(
    cluster: &mut Cluster,
    topic: &str,
    acks: i16,
    compression: Compression,
) -> anyhow::Result<ProduceTarget> {
    let deadline = Instant::now() + PRODUCE_LEADERS_WAIT;
    loop {
        let mut request = MetadataRequest::default();
        request.allow_auto_topic_creation = true;
        request.topics = Some(vec![kafka_protocol::messages::metadata_request::MetadataRequestTopic::default()
            .with_name(Some(topic_name(topic)))]);
        let metadata = cluster.bootstrap.send(METADATA_VERSION, request)?;
        let found = metadata.topics.iter().find(|t| t.name.as_ref().is_some_and(|n| n.as_str() == topic));
        let ready = found.filter(|t| {
            t.error_code == 0 && !t.partitions.is_empty() && t.partitions.iter().all(|p| p.leader_id.0 >= 0)
        });
        if let Some(found) = ready {
            let mut leaders: Vec<(i32, i32)> =
                found.partitions.iter().map(|p| (p.partition_index, p.leader_id.0)).collect();
            leaders.sort_unstable();
            return Ok(ProduceTarget {
                topic: topic.to_string(),
                leaders,
                addresses: Cluster::addresses(&metadata),
                acks,
                compression,
            });
        }
        let code = found.map_or(3, |t| t.error_code);
        if code == 3 {
            bail!("topic {topic} does not exist (and the broker does not create topics on first use)");
        }
        if code != LEADER_NOT_AVAILABLE {
            check(code, None, &format!("topic {topic}"))?;
        }
        if Instant::now() >= deadline {
            bail!("topic {topic} has partitions without a leader");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

impl ProduceTarget {
    /// Sends the buffered records of each partition, one request per leader, and says what
    /// the broker said of any it refused.
    fn send(
        &self,
        cluster: &Cluster,
        leaders: &mut BTreeMap<i32, sluice_client::KafkaConnection>,
        buffered: &mut BTreeMap<i32, Vec<Record>>,
    ) -> anyhow::Result<()> {
        let mut by_leader: BTreeMap<i32, Vec<PartitionProduceData>> = BTreeMap::new();
        for (partition, records) in std::mem::take(buffered) {
            if records.is_empty() {
                continue;
            }
            let leader = self.leaders.iter().find(|(p, _)| *p == partition).map_or(-1, |(_, l)| *l);
            by_leader
                .entry(leader)
                .or_default()
                .push(PartitionProduceData::default().with_index(partition).with_records(Some(self.batch(records)?)));
        }
        for (leader, partitions) in by_leader {
            let connection = match leaders.entry(leader) {
                std::collections::btree_map::Entry::Occupied(open) => open.into_mut(),
                std::collections::btree_map::Entry::Vacant(entry) => {
                    let address =
                        self.addresses.get(&leader).context("a partition's leader is not among the brokers")?;
                    entry.insert(cluster.connect(address)?)
                }
            };
            let mut request = ProduceRequest::default();
            request.acks = self.acks;
            request.timeout_ms = BROKER_TIMEOUT_MS;
            request.topic_data =
                vec![TopicProduceData::default().with_name(topic_name(&self.topic)).with_partition_data(partitions)];
            if self.acks == 0 {
                connection.send_only(ApiKey::Produce, PRODUCE_VERSION, RequestKind::Produce(request))?;
                continue;
            }
            let response = connection.send(PRODUCE_VERSION, request)?;
            for topic in &response.responses {
                for partition in &topic.partition_responses {
                    let what = format!("producing to {}-{}", self.topic, partition.index);
                    let record_error =
                        partition.record_errors.iter().find_map(|e| e.batch_index_error_message.as_deref());
                    check(partition.error_code, partition.error_message.as_deref().or(record_error), &what)?;
                }
            }
        }
        Ok(())
    }

    /// `records` as one batch: offsets as rising deltas, and offset minus sequence constant
    /// so that the encoder keeps them in one batch (no producer id: base sequence -1).
    fn batch(&self, mut records: Vec<Record>) -> anyhow::Result<Bytes> {
        for (index, record) in records.iter_mut().enumerate() {
            record.offset = index as i64;
            record.sequence = index as i32 - 1;
        }
        let mut buffer = BytesMut::new();
        let options = RecordEncodeOptions { version: 2, compression: self.compression };
        RecordBatchEncoder::encode(&mut buffer, &records, &options).context("encoding records")?;
        Ok(buffer.freeze())
    }
}

fn acks_of(acks: &str) -> anyhow::Result<i16> {
    match acks {
        "all" | "-1" => Ok(-1),
        "1" => Ok(1),
        "0" => Ok(0),
        other => bail!("--acks {other}: must be 0, 1 or all"),
    }
}

fn compression_of(name: &str) -> anyhow::Result<Compression> {
    match name {
        "none" => Ok(Compression::None),
        "gzip" => Ok(Compression::Gzip),
        "snappy" => Ok(Compression::Snappy),
        "lz4" => Ok(Compression::Lz4),
        "zstd" => Ok(Compression::Zstd),
        other => bail!("--compression {other}: must be none, gzip, snappy, lz4 or zstd"),
    }
}

pub fn produce(connection: &ConnectionArgs, args: ProduceArgs) -> anyhow::Result<()> {
    let (acks, compression) = (acks_of(&args.acks)?, compression_of(&args.compression)?);
    // Before reading stdin: a cluster that cannot be reached is said at once.
    let mut cluster = connection.cluster()?;
    let target = produce_target(&mut cluster, &args.topic, acks, compression)?;
    let partitions = target.leaders.len().max(1);
    let mut buffered: BTreeMap<i32, Vec<Record>> = BTreeMap::new();
    // One connection per leader, opened at its first batch.
    let mut leaders = BTreeMap::new();
    let (mut buffered_bytes, mut count_produced, mut next_partition) = (0usize, 0u64, 0usize);
    for line in std::io::stdin().lock().lines() {
        let line = line.context("reading standard input")?;
        let (key, value) = match args.key_separator.as_deref().and_then(|separator| line.split_once(separator)) {
            Some((key, value)) => (Some(Bytes::copy_from_slice(key.as_bytes())), value.to_string()),
            None => (None, line),
        };
        let slot = match &key {
            Some(key) => murmur2(key) as usize % partitions,
            None => {
                next_partition = (next_partition + 1) % partitions;
                next_partition
            }
        };
        let partition = target.leaders.get(slot).map_or(0, |(p, _)| *p);
        buffered_bytes += value.len() + key.as_ref().map_or(0, Bytes::len);
        buffered.entry(partition).or_default().push(sluice_protocol::new_record(
            key,
            Some(Bytes::from(value)),
            Default::default(),
            now_millis(),
        ));
        count_produced += 1;
        if buffered_bytes >= PRODUCE_BUFFER_BYTES {
            target.send(&cluster, &mut leaders, &mut buffered)?;
            buffered_bytes = 0;
        }
    }
    target.send(&cluster, &mut leaders, &mut buffered)?;
    eprintln!("produced {} to {}", count(count_produced as usize, "record"), args.topic);
    Ok(())
}

fn now_millis() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A librdkafka client configured by `-b` and `-X`.
fn rdkafka_config(connection: &ConnectionArgs) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", connection.bootstrap_list());
    // Read-only commands create nothing, whatever they ask librdkafka for.
    config.set("allow.auto.create.topics", "false");
    for setting in connection.raw_settings() {
        if let Some((key, value)) = setting.split_once('=') {
            config.set(key.trim(), value.trim());
        }
    }
    config
}

pub fn consume(connection: &ConnectionArgs, args: ConsumeArgs) -> anyhow::Result<()> {
    // The topic must exist (and the broker answer) before librdkafka is asked to fetch: it
    // would wait in silence for either.
    let (_, topic) = connection.cluster()?.topic(&args.topic)?;
    let consumer: BaseConsumer = rdkafka_config(connection)
        .set("group.id", "sluice-cli")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .create()?;
    let mut assignment = TopicPartitionList::new();
    let start = if args.from_beginning { Offset::Beginning } else { Offset::End };
    for partition in &topic.partitions {
        assignment.add_partition_offset(&args.topic, partition.partition_index, start)?;
    }
    consumer.assign(&assignment)?;
    let idle = args.idle_timeout_ms.map(Duration::from_millis);
    let mut last_record = Instant::now();
    let mut count = 0u64;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    while args.max_messages.is_none_or(|max| count < max) {
        if idle.is_some_and(|idle| last_record.elapsed() >= idle) {
            break;
        }
        let Some(message) = consumer.poll(Duration::from_millis(200)) else { continue };
        let message = message?;
        last_record = Instant::now();
        count += 1;
        let value = String::from_utf8_lossy(message.payload().unwrap_or_default());
        if args.verbose {
            let key = message.key().map_or("-".into(), String::from_utf8_lossy);
            let headers = message.headers().map_or(0, |h| h.count());
            let timestamp = message.timestamp().to_millis().map_or("-".to_string(), rfc3339_millis);
            writeln!(
                out,
                "partition={} offset={} timestamp={timestamp} key={key} headers={headers}\t{value}",
                message.partition(),
                message.offset(),
            )?;
        } else {
            writeln!(out, "{value}")?;
        }
    }
    Ok(())
}

#[derive(Serialize)]
struct BrokerView {
    node: i32,
    host: String,
    port: i32,
    rack: Option<String>,
    controller: bool,
}

#[derive(Serialize)]
struct ClusterView {
    cluster_id: Option<String>,
    controller: i32,
    brokers: Vec<BrokerView>,
    topics: usize,
    partitions: usize,
    under_replicated: Vec<String>,
    offline: Vec<String>,
}

pub fn cluster(connection: &ConnectionArgs, format: Format) -> anyhow::Result<()> {
    let metadata = connection.cluster()?.metadata(None)?;
    let controller = metadata.controller_id.0;
    let mut brokers: Vec<BrokerView> = metadata
        .brokers
        .iter()
        .map(|b| BrokerView {
            node: b.node_id.0,
            host: b.host.to_string(),
            port: b.port,
            rack: b.rack.as_ref().map(|r| r.to_string()),
            controller: b.node_id.0 == controller,
        })
        .collect();
    brokers.sort_by_key(|b| b.node);
    // ISR health, as `kafka-topics --describe --under-replicated-partitions` reports it.
    let (mut partitions, mut under_replicated, mut offline) = (0, Vec::new(), Vec::new());
    for topic in &metadata.topics {
        let topic_name = topic.name.as_ref().map_or(String::new(), |n| n.to_string());
        for partition in &topic.partitions {
            partitions += 1;
            let name = format!("{topic_name}-{}", partition.partition_index);
            if partition.leader_id.0 < 0 {
                offline.push(name);
            } else if partition.isr_nodes.len() < partition.replica_nodes.len() {
                under_replicated.push(name);
            }
        }
    }
    under_replicated.sort();
    offline.sort();
    let view = ClusterView {
        cluster_id: metadata.cluster_id.as_ref().map(|id| id.to_string()),
        controller,
        brokers,
        topics: metadata.topics.len(),
        partitions,
        under_replicated,
        offline,
    };
    if format.document(&view)? {
        return Ok(());
    }
    println!("cluster {}  controller {}", view.cluster_id.as_deref().unwrap_or("-"), view.controller);
    println!();
    let mut table = TextTable::new(&["NODE", "HOST", "PORT", "RACK"]).numeric(&["NODE", "PORT"]);
    for broker in &view.brokers {
        let node = if broker.controller { format!("{}*", broker.node) } else { broker.node.to_string() };
        table.row([
            node,
            broker.host.clone(),
            broker.port.to_string(),
            broker.rack.clone().unwrap_or_else(|| "-".into()),
        ]);
    }
    table.print();
    println!();
    println!(
        "{}, {}: {} under-replicated, {} offline (no leader)",
        count(view.topics, "topic"),
        count(view.partitions, "partition"),
        view.under_replicated.len(),
        view.offline.len()
    );
    for name in view
        .under_replicated
        .iter()
        .map(|n| format!("{n} (under-replicated)"))
        .chain(view.offline.iter().map(|n| format!("{n} (offline)")))
        .take(CLUSTER_PARTITIONS_LISTED_MAX)
    {
        println!("  {name}");
    }
    Ok(())
}

#[derive(Debug, clap::Subcommand)]
pub enum GroupCommand {
    /// List consumer groups with their state.
    List,
    /// Show a group's members and, per partition, committed offset, log end and lag.
    Describe { group: String },
    /// Move a group's committed offsets (the group must have no members). Prints the plan;
    /// commits it only with --execute, as kafka-consumer-groups does.
    ResetOffsets {
        group: String,
        /// Topic whose partitions are reset (all of its partitions).
        #[arg(long)]
        topic: String,
        #[arg(long, conflicts_with_all = ["to_latest", "to_offset"])]
        to_earliest: bool,
        #[arg(long, conflicts_with_all = ["to_earliest", "to_offset"])]
        to_latest: bool,
        #[arg(long, conflicts_with_all = ["to_earliest", "to_latest"])]
        to_offset: Option<i64>,
        #[arg(long)]
        execute: bool,
    },
    /// Delete groups without members (and their committed offsets).
    Delete { groups: Vec<String> },
}

#[derive(Debug, clap::Args)]
pub struct GroupArgs {
    #[command(subcommand)]
    command: GroupCommand,
}

#[derive(Serialize)]
struct GroupSummary {
    name: String,
    state: String,
}

pub fn group(connection: &ConnectionArgs, format: Format, args: GroupArgs) -> anyhow::Result<()> {
    let mut cluster = connection.cluster()?;
    match args.command {
        GroupCommand::List => {
            let metadata = cluster.metadata(Some(&[]))?;
            let mut listed = Vec::new();
            for address in Cluster::addresses(&metadata).values() {
                let mut request = ListGroupsRequest::default();
                request.types_filter =
                    vec![StrBytes::from_static_str("classic"), StrBytes::from_static_str("consumer")];
                let response = cluster.connect(address)?.send(LIST_GROUPS_VERSION, request)?;
                check(response.error_code, None, &format!("listing the groups of {address}"))?;
                listed.extend(
                    response
                        .groups
                        .into_iter()
                        .map(|g| GroupSummary { name: g.group_id.to_string(), state: g.group_state.to_string() }),
                );
            }
            listed.sort_by(|a, b| a.name.cmp(&b.name));
            if format.document(&listed)? {
                return Ok(());
            }
            let mut table = TextTable::new(&["GROUP", "STATE"]);
            for group in &listed {
                table.row([group.name.clone(), group.state.clone()]);
            }
            table.print();
        }
        GroupCommand::Describe { group } => describe_group(&mut cluster, format, &group)?,
        GroupCommand::ResetOffsets { group, topic, to_earliest, to_latest, to_offset, execute } => {
            let target = match (to_earliest, to_latest, to_offset) {
                (true, _, _) => ResetTo::Earliest,
                (_, true, _) => ResetTo::Latest,
                (_, _, Some(offset)) if offset >= 0 => ResetTo::Offset(offset),
                _ => bail!("say where to: --to-earliest, --to-latest or --to-offset N (N >= 0)"),
            };
            reset_offsets(&mut cluster, &group, &topic, target, execute)?;
        }
        GroupCommand::Delete { groups } => {
            if groups.is_empty() {
                bail!("name at least one group");
            }
            let mut failed = 0;
            for group in &groups {
                match delete_group(&cluster, group) {
                    Ok(()) => println!("deleted group {group}"),
                    Err(error) => {
                        failed += 1;
                        eprintln!("error: {error:#}");
                    }
                }
            }
            if failed > 0 {
                bail!("{} not deleted", count(failed, "group"));
            }
        }
    }
    Ok(())
}

/// A connection to `group`'s coordinator.
fn coordinator(cluster: &Cluster, group: &str) -> anyhow::Result<sluice_client::KafkaConnection> {
    let address = crate::share_tools::coordinator(&cluster.connector, cluster.bootstrap.address(), group)?;
    cluster.connect(&address)
}

/// DeleteGroups at the group's coordinator.
fn delete_group(cluster: &Cluster, group: &str) -> anyhow::Result<()> {
    let mut request = DeleteGroupsRequest::default();
    request.groups_names = vec![GroupId(StrBytes::from_string(group.to_string()))];
    let response = coordinator(cluster, group)?.send(DELETE_GROUPS_VERSION, request)?;
    for result in &response.results {
        match result.error_code {
            GROUP_ID_NOT_FOUND => bail!("group {group} does not exist"),
            NON_EMPTY_GROUP => bail!("group {group} has active members: stop them first"),
            code => check(code, None, &format!("deleting group {group}"))?,
        }
    }
    Ok(())
}

/// The group as DescribeGroups answers it, or "group NAME does not exist".
fn described_group(
    coordinator: &mut sluice_client::KafkaConnection,
    group: &str,
) -> anyhow::Result<kafka_protocol::messages::describe_groups_response::DescribedGroup> {
    let mut request = DescribeGroupsRequest::default();
    request.groups = vec![GroupId(StrBytes::from_string(group.to_string()))];
    let response = coordinator.send(DESCRIBE_GROUPS_VERSION, request)?;
    let described = response.groups.into_iter().next().context("DescribeGroups: no answer")?;
    if described.error_code == GROUP_ID_NOT_FOUND || described.group_state.as_str() == "Dead" {
        bail!("group {group} does not exist");
    }
    check(described.error_code, described.error_message.as_deref(), &format!("describing group {group}"))?;
    Ok(described)
}

/// (topic, partition) -> committed offset of every partition the group committed.
fn committed_offsets(
    coordinator: &mut sluice_client::KafkaConnection,
    group: &str,
) -> anyhow::Result<BTreeMap<(String, i32), i64>> {
    let mut wanted = OffsetFetchRequestGroup::default();
    wanted.group_id = GroupId(StrBytes::from_string(group.to_string()));
    wanted.topics = None;
    let mut request = OffsetFetchRequest::default();
    request.groups = vec![wanted];
    let response = coordinator.send(OFFSET_FETCH_VERSION, request)?;
    let answered = response.groups.into_iter().next().context("OffsetFetch: no answer")?;
    check(answered.error_code, None, &format!("committed offsets of group {group}"))?;
    let mut committed = BTreeMap::new();
    for topic in answered.topics {
        for partition in topic.partitions {
            check(
                partition.error_code,
                None,
                &format!("committed offset of {}-{}", topic.name.as_str(), partition.partition_index),
            )?;
            if partition.committed_offset >= 0 {
                committed.insert((topic.name.to_string(), partition.partition_index), partition.committed_offset);
            }
        }
    }
    Ok(committed)
}

/// The offsets at `timestamp` (earliest or latest) of every partition of `topics`, asked of
/// their leaders.
fn offsets_of_topics(
    cluster: &mut Cluster,
    topics: &[&str],
    timestamp: i64,
) -> anyhow::Result<BTreeMap<(String, i32), i64>> {
    let mut offsets = BTreeMap::new();
    if topics.is_empty() {
        return Ok(offsets);
    }
    let metadata = cluster.metadata(Some(topics))?;
    let addresses = Cluster::addresses(&metadata);
    for topic in &metadata.topics {
        let Some(name) = topic.name.as_ref().map(|n| n.to_string()) else { continue };
        if topic.error_code == UNKNOWN_TOPIC_OR_PARTITION {
            continue;
        }
        check(topic.error_code, None, &format!("topic {name}"))?;
        let mut by_leader: BTreeMap<i32, Vec<i32>> = BTreeMap::new();
        for partition in &topic.partitions {
            by_leader.entry(partition.leader_id.0).or_default().push(partition.partition_index);
        }
        for (leader, partitions) in by_leader {
            let Some(address) = addresses.get(&leader) else { continue };
            let found = list_offsets(&mut cluster.connect(address)?, &name, &partitions, timestamp)?;
            offsets.extend(found.into_iter().map(|(partition, offset)| ((name.clone(), partition), offset)));
        }
    }
    Ok(offsets)
}

#[derive(Serialize)]
struct MemberView {
    member_id: String,
    client_id: String,
    host: String,
}

#[derive(Serialize)]
struct LagView {
    topic: String,
    partition: i32,
    committed: i64,
    log_end: Option<i64>,
    lag: Option<i64>,
}

#[derive(Serialize)]
struct GroupView {
    group: String,
    state: String,
    protocol: String,
    members: Vec<MemberView>,
    offsets: Vec<LagView>,
}

fn describe_group(cluster: &mut Cluster, format: Format, group: &str) -> anyhow::Result<()> {
    let mut coordinator = coordinator(cluster, group)?;
    let described = described_group(&mut coordinator, group)?;
    let committed = committed_offsets(&mut coordinator, group)?;
    let mut topics: Vec<&str> = committed.keys().map(|(topic, _)| topic.as_str()).collect();
    topics.dedup();
    let ends = offsets_of_topics(cluster, &topics, LATEST_TIMESTAMP)?;
    let offsets = committed
        .iter()
        .map(|((topic, partition), &committed)| {
            let log_end = ends.get(&(topic.clone(), *partition)).copied();
            LagView {
                topic: topic.clone(),
                partition: *partition,
                committed,
                log_end,
                lag: log_end.map(|end| (end - committed).max(0)),
            }
        })
        .collect();
    let members = described
        .members
        .iter()
        .map(|m| MemberView {
            member_id: m.member_id.to_string(),
            client_id: m.client_id.to_string(),
            host: m.client_host.to_string(),
        })
        .collect();
    let view = GroupView {
        group: group.to_string(),
        state: described.group_state.to_string(),
        protocol: described.protocol_data.to_string(),
        members,
        offsets,
    };
    if format.document(&view)? {
        return Ok(());
    }
    let protocol = if view.protocol.is_empty() { "-" } else { view.protocol.as_str() };
    println!("group {group}: {}, state {}, protocol {protocol}", count(view.members.len(), "member"), view.state);
    if !view.members.is_empty() {
        println!();
        let mut table = TextTable::new(&["MEMBER", "CLIENT-ID", "HOST"]);
        for member in &view.members {
            table.row([member.member_id.clone(), member.client_id.clone(), member.host.clone()]);
        }
        table.print();
    }
    println!();
    let dash = |value: Option<i64>| value.map_or("-".to_string(), |v| v.to_string());
    let mut table = TextTable::new(&["TOPIC", "PARTITION", "COMMITTED", "LOG-END", "LAG"]).numeric(&[
        "PARTITION",
        "COMMITTED",
        "LOG-END",
        "LAG",
    ]);
    for lag in &view.offsets {
        table.row([
            lag.topic.clone(),
            lag.partition.to_string(),
            lag.committed.to_string(),
            dash(lag.log_end),
            dash(lag.lag),
        ]);
    }
    table.print();
    Ok(())
}

/// Where `group reset-offsets` moves a group's offsets.
#[derive(Debug, Clone, Copy)]
enum ResetTo {
    Earliest,
    Latest,
    /// This offset, kept within the partition's log start and end.
    Offset(i64),
}

fn reset_offsets(
    cluster: &mut Cluster,
    group: &str,
    topic: &str,
    target: ResetTo,
    execute: bool,
) -> anyhow::Result<()> {
    let mut coordinator = coordinator(cluster, group)?;
    // A group that does not exist yet gets its first offsets.
    if let Ok(described) = described_group(&mut coordinator, group) {
        if !described.members.is_empty() {
            bail!("group {group} has {}: stop them first", count(described.members.len(), "active member"));
        }
    }
    cluster.topic(topic)?;
    let starts = offsets_of_topics(cluster, &[topic], EARLIEST_TIMESTAMP)?;
    let ends = offsets_of_topics(cluster, &[topic], LATEST_TIMESTAMP)?;
    let mut plan = Vec::new();
    let mut table = TextTable::new(&["TOPIC", "PARTITION", "NEW-OFFSET"]).numeric(&["PARTITION", "NEW-OFFSET"]);
    for ((_, partition), &high) in &ends {
        let low = starts.get(&(topic.to_string(), *partition)).copied().unwrap_or(0);
        let offset = match target {
            ResetTo::Earliest => low,
            ResetTo::Latest => high,
            ResetTo::Offset(offset) => offset.clamp(low, high),
        };
        table.row([topic.to_string(), partition.to_string(), offset.to_string()]);
        plan.push(
            OffsetCommitRequestPartition::default()
                .with_partition_index(*partition)
                .with_committed_offset(offset)
                .with_committed_leader_epoch(-1)
                .with_committed_metadata(Some(StrBytes::from_static_str(""))),
        );
    }
    table.print();
    if !execute {
        println!();
        println!("(dry run: add --execute to commit these offsets)");
        return Ok(());
    }
    let mut request = OffsetCommitRequest::default();
    request.group_id = GroupId(StrBytes::from_string(group.to_string()));
    // No generation and no member: the commit of a tool, accepted while the group is empty.
    request.generation_id_or_member_epoch = -1;
    request.member_id = StrBytes::from_static_str("");
    request.topics = vec![OffsetCommitRequestTopic::default().with_name(topic_name(topic)).with_partitions(plan)];
    let response = coordinator.send(OFFSET_COMMIT_VERSION, request)?;
    for answered in &response.topics {
        for partition in &answered.partitions {
            check(
                partition.error_code,
                None,
                &format!("committing the offset of {topic}-{}", partition.partition_index),
            )?;
        }
    }
    println!("committed new offsets for group {group}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kafka's own test vectors (`Utils.murmur2`), made positive as its partitioner does.
    #[test]
    fn keyed_records_go_where_kafka_clients_send_them() {
        let vectors: [(&str, i32); 5] = [
            ("21", -973_932_308),
            ("foobar", -790_332_482),
            ("a-little-bit-long-string", -985_981_536),
            ("a-little-bit-longer-string", -1_486_304_829),
            ("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58_897_971),
        ];
        for (key, kafka) in vectors {
            assert_eq!(murmur2(key.as_bytes()), kafka & 0x7fff_ffff, "{key}");
        }
    }
}
