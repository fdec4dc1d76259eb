//! What the console changes, each with the protocol's own request as the logged-in user, so
//! the broker validates and authorizes it as it would a client's and its refusal (Kafka's
//! error and message) is what the page shows: creating, growing and deleting topics,
//! setting and removing topic configs, producing one record.

use std::sync::Arc;

use anyhow::{anyhow, bail};
use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
use kafka_protocol::messages::incremental_alter_configs_request::{AlterConfigsResource, AlterableConfig};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    CreatePartitionsRequest, CreateTopicsRequest, DeleteTopicsRequest, IncrementalAlterConfigsRequest, ProduceRequest,
    TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{Compression, RecordBatchEncoder, RecordEncodeOptions};

use crate::cluster::{versions, ClusterClient};
use crate::topics::error_name;

/// How long the broker may take to apply an admin change before it answers.
const ADMIN_TIMEOUT_MS: i32 = 30_000;
/// The config resource type of a topic (IncrementalAlterConfigs).
const TOPIC_RESOURCE: i8 = 2;
/// IncrementalAlterConfigs operations.
const CONFIG_SET: i8 = 0;
const CONFIG_DELETE: i8 = 1;

fn name(topic: &str) -> TopicName {
    TopicName(StrBytes::from_string(topic.to_string()))
}

/// Kafka's refusal as a message: its own text when it sent one, else the error's name.
pub(crate) fn refusal(code: i16, message: Option<StrBytes>) -> anyhow::Error {
    match message.filter(|m| !m.is_empty()) {
        Some(message) => anyhow!("{}: {message}", error_name(code)),
        None => anyhow!("{}", error_name(code)),
    }
}

/// A result's error code as the outcome: success, or Kafka's refusal.
pub(crate) fn checked(code: i16, message: Option<StrBytes>) -> anyhow::Result<()> {
    match code {
        0 => Ok(()),
        code => Err(refusal(code, message)),
    }
}

/// The active controller's address, where topic changes go.
async fn controller_address(client: &Arc<ClusterClient>) -> anyhow::Result<String> {
    let metadata = client.metadata(Some(&[])).await?;
    Ok(metadata.address(metadata.controller)?.to_string())
}

/// Creates `topic`; `replication_factor` -1 is the broker's default. `configs` are
/// `(name, value)` overrides.
pub async fn create_topic(
    client: &Arc<ClusterClient>,
    topic: &str,
    partitions: i32,
    replication_factor: i16,
    configs: Vec<(String, String)>,
) -> anyhow::Result<()> {
    let mut creatable = CreatableTopic::default();
    creatable.name = name(topic);
    creatable.num_partitions = partitions;
    creatable.replication_factor = replication_factor;
    creatable.configs = configs
        .into_iter()
        .map(|(key, value)| {
            let mut config = CreatableTopicConfig::default();
            config.name = StrBytes::from_string(key);
            config.value = Some(StrBytes::from_string(value));
            config
        })
        .collect();
    let mut request = CreateTopicsRequest::default();
    request.topics = vec![creatable];
    request.timeout_ms = ADMIN_TIMEOUT_MS;
    let address = controller_address(client).await?;
    let answer = client.send(&address, versions::CREATE_TOPICS, request).await?;
    let result = answer.topics.into_iter().next().ok_or_else(|| anyhow!("no CreateTopics result"))?;
    checked(result.error_code, result.error_message)
}

/// Grows `topic` to `count` partitions.
pub async fn add_partitions(client: &Arc<ClusterClient>, topic: &str, count: i32) -> anyhow::Result<()> {
    let mut grown = CreatePartitionsTopic::default();
    grown.name = name(topic);
    grown.count = count;
    grown.assignments = None;
    let mut request = CreatePartitionsRequest::default();
    request.topics = vec![grown];
    request.timeout_ms = ADMIN_TIMEOUT_MS;
    let address = controller_address(client).await?;
    let answer = client.send(&address, versions::CREATE_PARTITIONS, request).await?;
    let result = answer.results.into_iter().next().ok_or_else(|| anyhow!("no CreatePartitions result"))?;
    checked(result.error_code, result.error_message)
}

/// Deletes `topic`.
pub async fn delete_topic(client: &Arc<ClusterClient>, topic: &str) -> anyhow::Result<()> {
    let mut deleted = DeleteTopicState::default();
    deleted.name = Some(name(topic));
    let mut request = DeleteTopicsRequest::default();
    request.topics = vec![deleted];
    request.timeout_ms = ADMIN_TIMEOUT_MS;
    let address = controller_address(client).await?;
    let answer = client.send(&address, versions::DELETE_TOPICS, request).await?;
    let result = answer.responses.into_iter().next().ok_or_else(|| anyhow!("no DeleteTopics result"))?;
    checked(result.error_code, result.error_message)
}

/// Sets topic config `key` to `value`, or (`None`) removes the topic's override.
pub async fn alter_config(
    client: &Arc<ClusterClient>,
    topic: &str,
    key: &str,
    value: Option<&str>,
) -> anyhow::Result<()> {
    let mut config = AlterableConfig::default();
    config.name = StrBytes::from_string(key.to_string());
    config.config_operation = if value.is_some() { CONFIG_SET } else { CONFIG_DELETE };
    config.value = value.map(|v| StrBytes::from_string(v.to_string()));
    let mut resource = AlterConfigsResource::default();
    resource.resource_type = TOPIC_RESOURCE;
    resource.resource_name = StrBytes::from_string(topic.to_string());
    resource.configs = vec![config];
    let mut request = IncrementalAlterConfigsRequest::default();
    request.resources = vec![resource];
    let bootstrap = client.bootstrap().to_string();
    let answer = client.send(&bootstrap, versions::INCREMENTAL_ALTER_CONFIGS, request).await?;
    let result = answer.responses.into_iter().next().ok_or_else(|| anyhow!("no IncrementalAlterConfigs result"))?;
    checked(result.error_code, result.error_message)
}

/// One record to produce.
pub struct NewRecord {
    pub partition: i32,
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    pub headers: Vec<(String, Bytes)>,
}

/// Produces `record` (acks=all) to its partition's leader; its offset.
pub async fn produce(client: &Arc<ClusterClient>, topic: &str, record: NewRecord) -> anyhow::Result<i64> {
    let metadata = client.metadata(Some(&[topic.to_string()])).await?;
    let found = metadata.topics.iter().find(|t| t.name.as_ref().is_some_and(|n| n.as_str() == topic));
    let found = found.ok_or_else(|| anyhow!("topic {topic} not found"))?;
    if found.error_code != 0 {
        bail!("topic {topic}: {}", error_name(found.error_code));
    }
    let partition = found.partitions.iter().find(|p| p.partition_index == record.partition);
    let leader = partition.ok_or_else(|| anyhow!("topic {topic} has no partition {}", record.partition))?.leader_id.0;
    let address = metadata.address(leader)?.to_string();
    let mut data = PartitionProduceData::default();
    data.index = record.partition;
    data.records = Some(encode(record)?);
    let mut topic_data = TopicProduceData::default();
    topic_data.name = name(topic);
    topic_data.partition_data = vec![data];
    let mut request = ProduceRequest::default();
    request.acks = -1;
    request.timeout_ms = ADMIN_TIMEOUT_MS;
    request.topic_data = vec![topic_data];
    let answer = client.send(&address, versions::PRODUCE, request).await?;
    let response = answer.responses.into_iter().flat_map(|t| t.partition_responses).next();
    let response = response.ok_or_else(|| anyhow!("no Produce result"))?;
    match response.error_code {
        0 => Ok(response.base_offset),
        code => Err(refusal(code, response.error_message)),
    }
}

/// One record as a batch of its own (uncompressed, created now).
fn encode(record: NewRecord) -> anyhow::Result<Bytes> {
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis() as i64;
    let headers = record.headers.into_iter().map(|(k, v)| (StrBytes::from_string(k), Some(v))).collect();
    let record = sluice_client::new_record(record.key, record.value, headers, now_ms);
    let mut buffer = BytesMut::new();
    let options = RecordEncodeOptions { version: 2, compression: Compression::None };
    RecordBatchEncoder::encode(&mut buffer, &[record], &options).map_err(|error| anyhow!("{error}"))?;
    Ok(buffer.freeze())
}
