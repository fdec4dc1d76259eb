//! Topic administration and cluster metadata: Metadata (with auto-creation),
//! CreateTopics, DeleteTopics, CreatePartitions, DescribeCluster and InitProducerId.

use std::collections::BTreeMap;
use std::sync::Arc;

use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::create_topics_response::{CreatableTopicConfigs, CreatableTopicResult};
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::*;
use kafka_protocol::ResponseError;
use uuid::Uuid;

use super::{message, str_bytes};
use crate::config::PARTITIONS_PER_TOPIC_MAX;
use crate::topics::{validate_topic_name, TopicMeta};
use crate::{topic_config, Broker, LEADER_EPOCH};

/// CreateTopics v5 added the created topic's configs to the response.
const CREATE_TOPICS_CONFIGS_VERSION: i16 = 5;
/// DescribeConfigs config_source for a topic override and for a default.
pub(super) const SOURCE_TOPIC: i8 = 1;
pub(super) const SOURCE_DEFAULT: i8 = 5;

pub(super) fn metadata(broker: &Arc<Broker>, request: MetadataRequest) -> MetadataResponse {
    let mut response = MetadataResponse::default();
    let (host, port) = &broker.advertised;
    let mut node = MetadataResponseBroker::default();
    node.node_id = BrokerId(broker.node_id());
    node.host = str_bytes(host);
    node.port = *port;
    response.brokers.push(node);
    response.cluster_id = Some(str_bytes(&broker.topics.cluster_id()));
    response.controller_id = BrokerId(broker.node_id());
    let auto_create = request.allow_auto_topic_creation && broker.config().auto_create_topics;
    match request.topics {
        None => response.topics = broker.topics.all().iter().map(|t| topic_metadata(broker, t)).collect(),
        Some(requested) => {
            for wanted in requested {
                let name = match wanted.name {
                    Some(name) => name.to_string(),
                    None => broker.topics.name_for_id(&wanted.topic_id).unwrap_or_default(),
                };
                response.topics.push(lookup_or_create(broker, &name, wanted.topic_id, auto_create));
            }
        }
    }
    response
}

fn lookup_or_create(broker: &Broker, name: &str, id: Uuid, auto_create: bool) -> MetadataResponseTopic {
    let failed = |error: ResponseError| {
        let mut topic = MetadataResponseTopic::default();
        topic.name = (!name.is_empty()).then(|| TopicName(str_bytes(name)));
        topic.topic_id = id;
        topic.error_code = error.code();
        topic
    };
    if let Some(topic) = broker.topics.get(name) {
        return topic_metadata(broker, &topic);
    }
    if name.is_empty() {
        return failed(ResponseError::UnknownTopicId);
    }
    if validate_topic_name(name).is_err() {
        return failed(ResponseError::InvalidTopicException);
    }
    if !auto_create {
        return failed(ResponseError::UnknownTopicOrPartition);
    }
    let topic = TopicMeta {
        name: name.to_string(),
        id: Uuid::new_v4(),
        partitions: broker.config().num_partitions,
        configs: BTreeMap::new(),
    };
    match broker.create_topic(topic.clone()) {
        Ok(()) => {
            tracing::info!(topic = name, partitions = topic.partitions, "auto-created topic");
            topic_metadata(broker, &topic)
        }
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => broker
            .topics
            .get(name)
            .map_or_else(|| failed(ResponseError::LeaderNotAvailable), |t| topic_metadata(broker, &t)),
        Err(error) => {
            tracing::warn!(topic = name, %error, "auto-create failed");
            failed(ResponseError::KafkaStorageError)
        }
    }
}

fn topic_metadata(broker: &Broker, topic: &TopicMeta) -> MetadataResponseTopic {
    let node = BrokerId(broker.node_id());
    let mut response = MetadataResponseTopic::default();
    response.name = Some(TopicName(str_bytes(&topic.name)));
    response.topic_id = topic.id;
    response.partitions = (0..topic.partitions)
        .map(|index| {
            let mut partition = MetadataResponsePartition::default();
            partition.partition_index = index;
            partition.leader_id = node;
            partition.leader_epoch = LEADER_EPOCH;
            partition.replica_nodes = vec![node];
            partition.isr_nodes = vec![node];
            partition
        })
        .collect();
    response
}

pub(super) fn create_topics(broker: &Arc<Broker>, request: CreateTopicsRequest, version: i16) -> CreateTopicsResponse {
    let mut response = CreateTopicsResponse::default();
    for topic in request.topics {
        let mut result = CreatableTopicResult::default();
        result.name = topic.name.clone();
        result.num_partitions = -1;
        result.replication_factor = -1;
        match create_one(broker, &topic, request.validate_only) {
            Ok(created) => {
                result.topic_id = created.id;
                result.num_partitions = created.partitions;
                result.replication_factor = 1;
                if version >= CREATE_TOPICS_CONFIGS_VERSION {
                    result.configs = Some(
                        broker
                            .config()
                            .topic_defaults
                            .describe(&created.configs)
                            .into_iter()
                            .map(|c| {
                                let mut config = CreatableTopicConfigs::default();
                                config.name = str_bytes(c.name);
                                config.value = Some(str_bytes(&c.value));
                                config.config_source = if c.is_default { SOURCE_DEFAULT } else { SOURCE_TOPIC };
                                config
                            })
                            .collect(),
                    );
                }
            }
            Err((error, text)) => {
                tracing::info!(topic = %topic.name.as_str(), %text, "create topic refused");
                result.error_code = error.code();
                result.error_message = message(text);
            }
        }
        response.topics.push(result);
    }
    response
}

fn create_one(
    broker: &Broker,
    topic: &CreatableTopic,
    validate_only: bool,
) -> Result<TopicMeta, (ResponseError, String)> {
    let name = topic.name.as_str();
    validate_topic_name(name).map_err(|e| (ResponseError::InvalidTopicException, e))?;
    if broker.topics.get(name).is_some() {
        return Err((ResponseError::TopicAlreadyExists, format!("topic {name:?} already exists")));
    }
    let partitions = if !topic.assignments.is_empty() {
        topic.assignments.len() as i32
    } else if topic.num_partitions == -1 {
        broker.config().num_partitions
    } else {
        topic.num_partitions
    };
    if !(1..=PARTITIONS_PER_TOPIC_MAX).contains(&partitions) {
        return Err((
            ResponseError::InvalidPartitions,
            format!("number of partitions must be in [1, {PARTITIONS_PER_TOPIC_MAX}], got {partitions}"),
        ));
    }
    let node = broker.node_id();
    if topic.assignments.iter().any(|a| a.broker_ids.iter().any(|b| b.0 != node) || a.broker_ids.len() != 1) {
        return Err((
            ResponseError::InvalidReplicaAssignment,
            "this single-node cluster only has node ".to_string() + &node.to_string(),
        ));
    }
    if !(topic.replication_factor == -1 || topic.replication_factor == 1) {
        return Err((
            ResponseError::InvalidReplicationFactor,
            format!("replication factor {} is larger than the 1 available broker", topic.replication_factor),
        ));
    }
    let mut configs = BTreeMap::new();
    for config in &topic.configs {
        topic_config::validate(config.name.as_str(), config.value.as_deref())
            .map_err(|e| (ResponseError::InvalidConfig, e))?;
        if let Some(value) = &config.value {
            configs.insert(config.name.to_string(), value.to_string());
        }
    }
    let meta = TopicMeta { name: name.to_string(), id: Uuid::new_v4(), partitions, configs };
    if validate_only {
        return Ok(meta);
    }
    match broker.create_topic(meta.clone()) {
        Ok(()) => {
            tracing::info!(topic = name, partitions, "created topic");
            Ok(meta)
        }
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {
            Err((ResponseError::TopicAlreadyExists, format!("topic {name:?} already exists")))
        }
        Err(error) => Err((ResponseError::KafkaStorageError, format!("could not create topic: {error}"))),
    }
}

pub(super) fn delete_topics(broker: &Arc<Broker>, request: DeleteTopicsRequest) -> DeleteTopicsResponse {
    let mut wanted: Vec<(Option<String>, Uuid)> =
        request.topic_names.iter().map(|n| (Some(n.to_string()), Uuid::nil())).collect();
    wanted.extend(request.topics.iter().map(|t| (t.name.as_ref().map(|n| n.to_string()), t.topic_id)));
    let mut response = DeleteTopicsResponse::default();
    for (name, id) in wanted {
        let mut result = DeletableTopicResult::default();
        result.topic_id = id;
        let resolved = name.clone().or_else(|| broker.topics.name_for_id(&id));
        result.name = resolved.as_deref().map(|n| TopicName(str_bytes(n)));
        let unknown =
            if name.is_none() { ResponseError::UnknownTopicId } else { ResponseError::UnknownTopicOrPartition };
        match resolved.map(|n| broker.delete_topic(&n)) {
            None | Some(Ok(None)) => result.error_code = unknown.code(),
            Some(Ok(Some(deleted))) => {
                tracing::info!(topic = %deleted.name, "deleted topic");
                result.topic_id = deleted.id;
            }
            Some(Err(error)) => {
                result.error_code = ResponseError::KafkaStorageError.code();
                result.error_message = message(error.to_string());
            }
        }
        response.responses.push(result);
    }
    response
}

pub(super) fn create_partitions(broker: &Arc<Broker>, request: CreatePartitionsRequest) -> CreatePartitionsResponse {
    let mut response = CreatePartitionsResponse::default();
    for topic in request.topics {
        let mut result = CreatePartitionsTopicResult::default();
        result.name = topic.name.clone();
        if let Err((error, text)) = grow_topic(broker, topic.name.as_str(), topic.count, request.validate_only) {
            result.error_code = error.code();
            result.error_message = message(text);
        }
        response.results.push(result);
    }
    response
}

fn grow_topic(broker: &Broker, name: &str, count: i32, validate_only: bool) -> Result<(), (ResponseError, String)> {
    let Some(topic) = broker.topics.get(name) else {
        return Err((ResponseError::UnknownTopicOrPartition, format!("topic {name:?} does not exist")));
    };
    if count <= topic.partitions || count > PARTITIONS_PER_TOPIC_MAX {
        return Err((
            ResponseError::InvalidPartitions,
            format!("topic has {} partitions; the new count must be larger and at most {PARTITIONS_PER_TOPIC_MAX}, got {count}", topic.partitions),
        ));
    }
    if validate_only {
        return Ok(());
    }
    let log_config = broker.config().topic_defaults.log_config(&topic.configs);
    for p in topic.partitions..count {
        broker
            .logs
            .open(&sluice_storage::TopicPartition::new(name, p), log_config.clone())
            .map_err(|e| (ResponseError::KafkaStorageError, e.to_string()))?;
    }
    broker
        .topics
        .update(name, |t| t.partitions = count)
        .map_err(|e| (ResponseError::KafkaStorageError, e.to_string()))?;
    tracing::info!(topic = name, partitions = count, "added partitions");
    Ok(())
}

pub(super) fn describe_cluster(broker: &Arc<Broker>, _request: DescribeClusterRequest) -> DescribeClusterResponse {
    let mut response = DescribeClusterResponse::default();
    response.cluster_id = str_bytes(&broker.topics.cluster_id());
    response.controller_id = BrokerId(broker.node_id());
    let mut node = DescribeClusterBroker::default();
    node.broker_id = BrokerId(broker.node_id());
    node.host = str_bytes(&broker.advertised.0);
    node.port = broker.advertised.1;
    response.brokers.push(node);
    response
}

pub(super) fn init_producer_id(broker: &Arc<Broker>, request: InitProducerIdRequest) -> InitProducerIdResponse {
    let mut response = InitProducerIdResponse::default();
    response.producer_id = ProducerId(-1);
    response.producer_epoch = -1;
    if request.transactional_id.is_some() {
        // Transactions need a transaction coordinator, which Sluice does not have yet.
        response.error_code = ResponseError::TransactionalIdAuthorizationFailed.code();
        return response;
    }
    // KIP-360: an idempotent producer may ask to bump its epoch after a sequence error.
    if request.producer_id.0 >= 0 && request.producer_epoch >= 0 && request.producer_epoch < i16::MAX - 1 {
        response.producer_id = request.producer_id;
        response.producer_epoch = request.producer_epoch + 1;
        return response;
    }
    match broker.topics.allocate_producer_id() {
        Ok(id) => {
            response.producer_id = ProducerId(id);
            response.producer_epoch = 0;
        }
        Err(error) => {
            tracing::warn!(%error, "could not persist producer id block");
            response.error_code = ResponseError::KafkaStorageError.code();
        }
    }
    response
}
