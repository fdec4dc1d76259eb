//! The topics the user may describe: partitions, replication, messages and size, gathered
//! with one Metadata, one ListOffsets per leader (earliest and latest) and one
//! DescribeLogDirs per broker, however many partitions there are.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_response::MetadataResponseTopic;
use kafka_protocol::messages::{
    BrokerId, DescribeConfigsRequest, DescribeLogDirsRequest, ListOffsetsRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::cluster::{versions, ClusterClient, ClusterMetadata};

/// ListOffsets' timestamp for the log start offset.
pub const EARLIEST: i64 = -2;
/// ListOffsets' timestamp for the log end offset (the high watermark).
pub const LATEST: i64 = -1;
/// The config resource type of a topic (DescribeConfigs).
const TOPIC_RESOURCE: i8 = 2;

/// One partition as the topic page shows it.
#[derive(Debug, Clone, Default)]
pub struct PartitionRow {
    pub id: i32,
    pub leader: i32,
    pub replicas: Vec<i32>,
    pub isr: Vec<i32>,
    pub start: i64,
    pub end: i64,
    /// Bytes on the leader's disk (`None`: not reported).
    pub size: Option<i64>,
}

impl PartitionRow {
    pub fn under_replicated(&self) -> bool {
        self.isr.len() < self.replicas.len()
    }

    pub fn messages(&self) -> i64 {
        (self.end - self.start).max(0)
    }
}

/// One topic as the topics list shows it.
#[derive(Debug, Clone, Default)]
pub struct TopicRow {
    pub name: String,
    pub internal: bool,
    pub partitions: Vec<PartitionRow>,
}

impl TopicRow {
    pub fn replication(&self) -> usize {
        self.partitions.iter().map(|p| p.replicas.len()).max().unwrap_or(0)
    }

    pub fn messages(&self) -> i64 {
        self.partitions.iter().map(PartitionRow::messages).sum()
    }

    pub fn size(&self) -> i64 {
        self.partitions.iter().filter_map(|p| p.size).sum()
    }

    pub fn under_replicated(&self) -> usize {
        self.partitions.iter().filter(|p| p.under_replicated()).count()
    }

    pub fn offline(&self) -> usize {
        self.partitions.iter().filter(|p| p.leader < 0).count()
    }
}

/// A topic config as DescribeConfigs answers it.
#[derive(Debug, Clone)]
pub struct ConfigRow {
    pub name: String,
    pub value: String,
    /// Where the value comes from (`topic`, `broker default`, `default`, ...).
    pub source: &'static str,
    pub sensitive: bool,
}

/// The topics of `metadata` the user may see, with their offsets and sizes.
pub async fn topic_rows(client: &Arc<ClusterClient>, metadata: &ClusterMetadata) -> anyhow::Result<Vec<TopicRow>> {
    let mut rows: Vec<TopicRow> = metadata.topics.iter().filter(|t| t.error_code == 0).filter_map(row_of).collect();
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    let (starts, ends, sizes) = tokio::try_join!(
        offsets(client, metadata, EARLIEST),
        offsets(client, metadata, LATEST),
        sizes(client, metadata)
    )?;
    for row in &mut rows {
        for partition in &mut row.partitions {
            let key = (row.name.clone(), partition.id);
            partition.start = starts.get(&key).copied().unwrap_or(0);
            partition.end = ends.get(&key).copied().unwrap_or(0);
            partition.size = sizes.get(&key).copied();
        }
    }
    Ok(rows)
}

fn row_of(topic: &MetadataResponseTopic) -> Option<TopicRow> {
    let name = topic.name.as_ref()?.to_string();
    let mut partitions: Vec<PartitionRow> = topic
        .partitions
        .iter()
        .map(|p| PartitionRow {
            id: p.partition_index,
            leader: p.leader_id.0,
            replicas: p.replica_nodes.iter().map(|b| b.0).collect(),
            isr: p.isr_nodes.iter().map(|b| b.0).collect(),
            ..PartitionRow::default()
        })
        .collect();
    partitions.sort_by_key(|p| p.id);
    Some(TopicRow { name, internal: topic.is_internal, partitions })
}

/// The offset at `timestamp` (or [`EARLIEST`] / [`LATEST`]) of every partition with a
/// leader, asking each leader once for all of its partitions.
pub async fn offsets(
    client: &Arc<ClusterClient>,
    metadata: &ClusterMetadata,
    timestamp: i64,
) -> anyhow::Result<HashMap<(String, i32), i64>> {
    let mut by_leader: BTreeMap<i32, BTreeMap<String, Vec<i32>>> = BTreeMap::new();
    for topic in metadata.topics.iter().filter(|t| t.error_code == 0) {
        let Some(name) = &topic.name else { continue };
        for partition in topic.partitions.iter().filter(|p| p.leader_id.0 >= 0) {
            let partitions = by_leader.entry(partition.leader_id.0).or_default().entry(name.to_string()).or_default();
            partitions.push(partition.partition_index);
        }
    }
    let asks = by_leader.into_iter().map(|(leader, topics)| {
        let client = client.clone();
        let address = metadata.address(leader).map(str::to_string);
        async move {
            let mut request = ListOffsetsRequest::default();
            request.replica_id = BrokerId(-1);
            request.topics = topics
                .into_iter()
                .map(|(name, partitions)| {
                    let mut topic = ListOffsetsTopic::default();
                    topic.name = TopicName(StrBytes::from_string(name));
                    topic.partitions = partitions
                        .into_iter()
                        .map(|index| {
                            let mut partition = ListOffsetsPartition::default();
                            partition.partition_index = index;
                            partition.current_leader_epoch = -1;
                            partition.timestamp = timestamp;
                            partition
                        })
                        .collect();
                    topic
                })
                .collect();
            client.send(&address?, versions::LIST_OFFSETS, request).await
        }
    });
    let mut found = HashMap::new();
    for answer in futures::future::try_join_all(asks).await? {
        for topic in answer.topics {
            for partition in topic.partitions.into_iter().filter(|p| p.error_code == 0 && p.offset >= 0) {
                found.insert((topic.name.to_string(), partition.partition_index), partition.offset);
            }
        }
    }
    Ok(found)
}

/// Each partition's size on its leader's disk, from every broker's DescribeLogDirs.
async fn sizes(client: &Arc<ClusterClient>, metadata: &ClusterMetadata) -> anyhow::Result<HashMap<(String, i32), i64>> {
    let leaders: HashMap<(String, i32), i32> = metadata
        .topics
        .iter()
        .filter_map(|t| Some((t.name.as_ref()?.to_string(), &t.partitions)))
        .flat_map(|(name, partitions)| {
            partitions.iter().map(move |p| ((name.clone(), p.partition_index), p.leader_id.0))
        })
        .collect();
    let asks = metadata.brokers.iter().map(|(id, (address, _))| {
        let client = client.clone();
        let (id, address) = (*id, address.clone());
        async move {
            let request = DescribeLogDirsRequest::default();
            // A broker that cannot answer (down, or the user may not describe it) only
            // leaves its partitions' sizes out.
            (id, client.send(&address, versions::DESCRIBE_LOG_DIRS, request).await.ok())
        }
    });
    let mut found = HashMap::new();
    for (broker, answer) in futures::future::join_all(asks).await {
        for directory in answer.into_iter().flat_map(|a| a.results) {
            for topic in directory.topics {
                for partition in topic.partitions {
                    let key = (topic.name.to_string(), partition.partition_index);
                    if leaders.get(&key) == Some(&broker) {
                        found.insert(key, partition.partition_size);
                    }
                }
            }
        }
    }
    Ok(found)
}

/// The topic's configs, or why they cannot be shown.
pub async fn configs(client: &Arc<ClusterClient>, topic: &str) -> anyhow::Result<Vec<ConfigRow>> {
    let mut resource = DescribeConfigsResource::default();
    resource.resource_type = TOPIC_RESOURCE;
    resource.resource_name = StrBytes::from_string(topic.to_string());
    resource.configuration_keys = None;
    let mut request = DescribeConfigsRequest::default();
    request.resources = vec![resource];
    let bootstrap = client.bootstrap().to_string();
    let answer = client.send(&bootstrap, versions::DESCRIBE_CONFIGS, request).await?;
    let result = answer.results.into_iter().next().ok_or_else(|| anyhow::anyhow!("no DescribeConfigs result"))?;
    if result.error_code != 0 {
        let message = result.error_message.map(|m| m.to_string());
        anyhow::bail!("{}", message.unwrap_or_else(|| error_name(result.error_code)));
    }
    let mut rows: Vec<ConfigRow> = result
        .configs
        .into_iter()
        .map(|config| ConfigRow {
            name: config.name.to_string(),
            value: config.value.map(|v| v.to_string()).unwrap_or_default(),
            source: config_source(config.config_source),
            sensitive: config.is_sensitive,
        })
        .collect();
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(rows)
}

/// DescribeConfigs' `config_source` in words.
fn config_source(source: i8) -> &'static str {
    match source {
        1 => "topic",
        2 => "broker (dynamic)",
        3 => "default broker (dynamic)",
        4 => "broker",
        5 => "default",
        _ => "",
    }
}

/// A Kafka error code's name, for messages.
pub fn error_name(code: i16) -> String {
    match ResponseError::try_from_code(code) {
        Some(error) => format!("{error:?}"),
        None => format!("error {code}"),
    }
}
