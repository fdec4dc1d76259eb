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
    response.brokers = live_brokers(broker)
        .into_iter()
        .map(|(id, host, port)| {
            let mut node = MetadataResponseBroker::default();
            node.node_id = BrokerId(id);
            node.host = str_bytes(&host);
            node.port = port;
            node
        })
        .collect();
    response.cluster_id = Some(str_bytes(&broker.topics.cluster_id()));
    response.controller_id = BrokerId(controller_id(broker));
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

/// (node id, host, port) of every broker clients may use: this one on a single node, the
/// unfenced ones in a cluster.
fn live_brokers(broker: &Broker) -> Vec<(i32, String, i32)> {
    if let Some(cluster) = &broker.cluster {
        let metadata = cluster.metadata();
        let live: Vec<_> = metadata
            .brokers
            .values()
            .filter(|b| !b.fenced)
            .map(|b| (b.node_id, b.host.clone(), i32::from(b.port)))
            .collect();
        if !live.is_empty() {
            return live;
        }
    }
    vec![(broker.node_id(), broker.advertised.0.clone(), broker.advertised.1)]
}

fn controller_id(broker: &Broker) -> i32 {
    match &broker.cluster {
        None => broker.node_id(),
        Some(cluster) => cluster.controller().and_then(|c| c.active_controller()).unwrap_or(-1),
    }
}

fn lookup_or_create(broker: &Arc<Broker>, name: &str, id: Uuid, auto_create: bool) -> MetadataResponseTopic {
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
    // `__consumer_offsets` is created only by the group coordinator, with its own configs.
    if !auto_create || name == crate::group::OFFSETS_TOPIC {
        return failed(ResponseError::UnknownTopicOrPartition);
    }
    if broker.cluster.is_some() {
        // As Kafka does: the topic is being created; the client asks again.
        let creating = broker.clone();
        let topic = name.to_string();
        tokio::spawn(async move {
            let partitions = creating.config().num_partitions;
            if let Err((_, error)) = create_in_cluster(&creating, &topic, partitions, -1, BTreeMap::new()).await {
                tracing::info!(%topic, %error, "auto-create in cluster failed");
            }
        });
        return failed(ResponseError::LeaderNotAvailable);
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
    // Clients skip internal topics in pattern subscriptions and listings (Kafka's rule).
    response.is_internal = topic.name == crate::group::OFFSETS_TOPIC;
    if let Some(cluster) = &broker.cluster {
        let metadata = cluster.metadata();
        let Some(info) = metadata.topics.get(&topic.name) else {
            response.error_code = ResponseError::LeaderNotAvailable.code();
            return response;
        };
        let fenced = |id: &i32| metadata.brokers.get(id).is_none_or(|b| b.fenced);
        response.partitions = info
            .partitions
            .iter()
            .enumerate()
            .map(|(index, p)| {
                let mut partition = MetadataResponsePartition::default();
                partition.partition_index = index as i32;
                partition.leader_id = BrokerId(p.leader);
                partition.leader_epoch = p.leader_epoch;
                if p.leader < 0 {
                    partition.error_code = ResponseError::LeaderNotAvailable.code();
                }
                partition.replica_nodes = p.replicas.iter().map(|&r| BrokerId(r)).collect();
                partition.isr_nodes = p.isr.iter().map(|&r| BrokerId(r)).collect();
                partition.offline_replicas = p.replicas.iter().filter(|r| fenced(r)).map(|&r| BrokerId(r)).collect();
                partition
            })
            .collect();
        return response;
    }
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

/// Checks a CreatableTopic (name, partitions, configs) and resolves its partition count.
fn validate_creatable(broker: &Broker, topic: &CreatableTopic) -> Result<TopicMeta, (ResponseError, String)> {
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
    let mut configs = BTreeMap::new();
    for config in &topic.configs {
        topic_config::validate(config.name.as_str(), config.value.as_deref())
            .map_err(|e| (ResponseError::InvalidConfig, e))?;
        if let Some(value) = &config.value {
            configs.insert(config.name.to_string(), value.to_string());
        }
    }
    if broker.cluster.is_some() && !topic.assignments.is_empty() {
        return Err((ResponseError::InvalidReplicaAssignment, "manual replica assignment is not supported yet".into()));
    }
    Ok(TopicMeta { name: name.to_string(), id: Uuid::new_v4(), partitions, configs })
}

fn create_one(
    broker: &Broker,
    topic: &CreatableTopic,
    validate_only: bool,
) -> Result<TopicMeta, (ResponseError, String)> {
    let meta = validate_creatable(broker, topic)?;
    let (name, partitions) = (meta.name.as_str(), meta.partitions);
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

/// The topics a DeleteTopics names: (name if given, id), by name (v0-5) or by id (v6).
fn wanted_deletions(request: &DeleteTopicsRequest) -> Vec<(Option<String>, Uuid)> {
    let mut wanted: Vec<(Option<String>, Uuid)> =
        request.topic_names.iter().map(|n| (Some(n.to_string()), Uuid::nil())).collect();
    wanted.extend(request.topics.iter().map(|t| (t.name.as_ref().map(|n| n.to_string()), t.topic_id)));
    wanted
}

/// Starts a DeleteTopics result: resolves the name; `Err` when the topic cannot be deleted.
fn deletion_target(broker: &Broker, name: Option<String>, id: Uuid) -> (DeletableTopicResult, Result<String, Failure>) {
    let mut result = DeletableTopicResult::default();
    result.topic_id = id;
    let resolved = name.clone().or_else(|| broker.topics.name_for_id(&id));
    result.name = resolved.as_deref().map(|n| TopicName(str_bytes(n)));
    let unknown = if name.is_none() { ResponseError::UnknownTopicId } else { ResponseError::UnknownTopicOrPartition };
    let target = match resolved {
        Some(name) if name == crate::group::OFFSETS_TOPIC => {
            Err((ResponseError::InvalidTopicException, format!("{name} is an internal topic and cannot be deleted")))
        }
        Some(name) => match broker.topics.get(&name) {
            Some(topic) => {
                result.topic_id = topic.id;
                Ok(name)
            }
            None => Err((unknown, format!("topic {name:?} does not exist"))),
        },
        None => Err((unknown, format!("topic id {id} does not exist"))),
    };
    (result, target)
}

/// DeleteTopics in a cluster: one controller write per topic; every node then stops its
/// replicas of the topic and deletes their logs (`cluster_link`).
pub(super) async fn delete_topics_in_cluster(
    broker: Arc<Broker>,
    request: DeleteTopicsRequest,
) -> DeleteTopicsResponse {
    let mut response = DeleteTopicsResponse::default();
    for (name, id) in wanted_deletions(&request) {
        let (mut result, target) = deletion_target(&broker, name, id);
        let outcome = match target {
            Ok(name) => match controller(&broker) {
                Ok(controller) => controller_write(&broker, controller.delete_topic(&name)).await.map(|()| name),
                Err(failure) => Err(failure),
            },
            Err(failure) => Err(failure),
        };
        match outcome {
            Ok(name) => tracing::info!(topic = %name, "deleted topic in cluster"),
            Err((error, text)) => {
                result.error_code = error.code();
                result.error_message = message(text);
            }
        }
        response.responses.push(result);
    }
    response
}

pub(super) fn delete_topics(broker: &Arc<Broker>, request: DeleteTopicsRequest) -> DeleteTopicsResponse {
    let mut response = DeleteTopicsResponse::default();
    for (name, id) in wanted_deletions(&request) {
        let (mut result, target) = deletion_target(broker, name, id);
        let name = match target {
            Ok(name) => name,
            Err((error, text)) => {
                result.error_code = error.code();
                result.error_message = message(text);
                response.responses.push(result);
                continue;
            }
        };
        match broker.delete_topic(&name) {
            Ok(None) => result.error_code = ResponseError::UnknownTopicOrPartition.code(),
            Ok(Some(deleted)) => {
                tracing::info!(topic = %deleted.name, "deleted topic");
                result.topic_id = deleted.id;
            }
            Err(error) => {
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

/// CreatePartitions in a cluster: the controller places the new partitions' replicas and
/// every node opens the ones it hosts (`cluster_link`).
pub(super) async fn create_partitions_in_cluster(
    broker: Arc<Broker>,
    request: CreatePartitionsRequest,
) -> CreatePartitionsResponse {
    let mut response = CreatePartitionsResponse::default();
    for topic in request.topics {
        let mut result = CreatePartitionsTopicResult::default();
        result.name = topic.name.clone();
        let name = topic.name.as_str();
        let mut outcome = check_growth(&broker, name, topic.count).map(drop);
        if outcome.is_ok() && topic.assignments.is_some() {
            outcome =
                Err((ResponseError::InvalidReplicaAssignment, "manual replica assignment is not supported".into()));
        }
        if outcome.is_ok() && !request.validate_only {
            outcome = match controller(&broker) {
                Ok(controller) => controller_write(&broker, controller.create_partitions(name, topic.count)).await,
                Err(failure) => Err(failure),
            };
        }
        match outcome {
            Ok(()) if !request.validate_only => {
                tracing::info!(topic = name, partitions = topic.count, "added partitions in cluster")
            }
            Ok(()) => {}
            Err((error, text)) => {
                result.error_code = error.code();
                result.error_message = message(text);
            }
        }
        response.results.push(result);
    }
    response
}

/// Checks that `name` exists and may grow to `count` partitions.
fn check_growth(broker: &Broker, name: &str, count: i32) -> Result<TopicMeta, Failure> {
    let Some(topic) = broker.topics.get(name) else {
        return Err((ResponseError::UnknownTopicOrPartition, format!("topic {name:?} does not exist")));
    };
    if count <= topic.partitions || count > PARTITIONS_PER_TOPIC_MAX {
        return Err((
            ResponseError::InvalidPartitions,
            format!("topic has {} partitions; the new count must be larger and at most {PARTITIONS_PER_TOPIC_MAX}, got {count}", topic.partitions),
        ));
    }
    Ok(topic)
}

fn grow_topic(broker: &Broker, name: &str, count: i32, validate_only: bool) -> Result<(), (ResponseError, String)> {
    let topic = check_growth(broker, name, count)?;
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
    response.controller_id = BrokerId(controller_id(broker));
    // Every live broker, as Metadata lists them: Kafka's tools (kafka-reassign-partitions)
    // check the broker ids of a plan against this list.
    response.brokers = live_brokers(broker)
        .into_iter()
        .map(|(id, host, port)| {
            let mut node = DescribeClusterBroker::default();
            node.broker_id = BrokerId(id);
            node.host = str_bytes(&host);
            node.port = port;
            node
        })
        .collect();
    response
}

/// DescribeLogDirs: the one log directory of this node and the partitions it holds
/// (`kafka-reassign-partitions` reads it to show the current assignment).
pub(super) fn describe_log_dirs(broker: &Arc<Broker>, request: DescribeLogDirsRequest) -> DescribeLogDirsResponse {
    use kafka_protocol::messages::describe_log_dirs_response::{
        DescribeLogDirsPartition, DescribeLogDirsResult, DescribeLogDirsTopic,
    };
    let wanted = |topic: &str, partition: i32| match &request.topics {
        None => true,
        Some(topics) => topics.iter().any(|t| t.topic.as_str() == topic && t.partitions.contains(&partition)),
    };
    let mut by_topic: BTreeMap<String, Vec<DescribeLogDirsPartition>> = BTreeMap::new();
    for (tp, log) in broker.logs.partitions() {
        if tp.topic == crate::group::OFFSETS_TOPIC || !wanted(&tp.topic, tp.partition) {
            continue;
        }
        let mut partition = DescribeLogDirsPartition::default();
        partition.partition_index = tp.partition;
        partition.partition_size = log.size_bytes() as i64;
        by_topic.entry(tp.topic.clone()).or_default().push(partition);
    }
    let mut result = DescribeLogDirsResult::default();
    result.log_dir = str_bytes(&broker.config().data_dir.join("logs").display().to_string());
    result.total_bytes = -1;
    result.usable_bytes = -1;
    result.topics = by_topic
        .into_iter()
        .map(|(name, mut partitions)| {
            partitions.sort_by_key(|p| p.partition_index);
            let mut topic = DescribeLogDirsTopic::default();
            topic.name = TopicName(str_bytes(&name));
            topic.partitions = partitions;
            topic
        })
        .collect();
    let mut response = DescribeLogDirsResponse::default();
    response.results.push(result);
    response
}

/// An admin request's refusal: the Kafka error and a message for the client.
pub(super) type Failure = (ResponseError, String);

/// This node's controller, for an admin request in cluster mode.
pub(super) fn controller(broker: &Broker) -> Result<Arc<sluice_cluster::Controller>, Failure> {
    let cluster = broker.cluster.as_ref().expect("cluster mode");
    cluster.controller().cloned().ok_or((ResponseError::NotController, "controller not started".into()))
}

/// Runs one controller write of an admin request (bounded by `ADMIN_TIMEOUT`), maps a
/// refusal to its Kafka error, and returns once this broker applied the change, so that
/// the client's next request here already sees it.
pub(super) async fn controller_write<T>(
    broker: &Broker,
    write: impl std::future::Future<Output = Result<T, sluice_cluster::ControllerError>>,
) -> Result<T, Failure> {
    let cluster = broker.cluster.as_ref().expect("cluster mode");
    let written = tokio::time::timeout(crate::cluster_link::ADMIN_TIMEOUT, write)
        .await
        .map_err(|_| (ResponseError::RequestTimedOut, "controller did not answer in time".to_string()))?
        .map_err(|e| {
            let error = ResponseError::try_from_code(e.kafka_error_code()).unwrap_or(ResponseError::UnknownServerError);
            (error, e.to_string())
        })?;
    if !cluster.wait_applied(cluster.controller_version(), APPLY_WAIT).await {
        tracing::warn!("admin change committed but not yet applied on this broker");
    }
    Ok(written)
}

/// How long an admin request waits for its committed change to be applied on this broker.
const APPLY_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

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

/// Creates a topic through the controller and waits until this node has applied it.
pub(super) async fn create_in_cluster(
    broker: &Arc<Broker>,
    name: &str,
    partitions: i32,
    replication_factor: i16,
    configs: BTreeMap<String, String>,
) -> Result<TopicMeta, (ResponseError, String)> {
    let cluster = broker.cluster.as_ref().expect("cluster mode");
    let controller = cluster.controller().ok_or((ResponseError::NotController, "controller not started".into()))?;
    let default_rf = broker.config().cluster.as_ref().map_or(1, |c| c.default_replication_factor);
    let replication_factor = if replication_factor == -1 {
        let brokers = cluster.metadata().brokers.values().filter(|b| !b.fenced).count().max(1);
        default_rf.min(brokers as i16)
    } else {
        replication_factor
    };
    let created = tokio::time::timeout(
        crate::cluster_link::ADMIN_TIMEOUT,
        controller.create_topic(name, partitions, replication_factor, configs.clone()),
    )
    .await
    .map_err(|_| (ResponseError::RequestTimedOut, "controller did not answer in time".to_string()))?
    .map_err(|e| {
        (ResponseError::try_from_code(e.kafka_error_code()).unwrap_or(ResponseError::UnknownServerError), e.to_string())
    })?;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    while broker.topics.get(name).is_none() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    tracing::info!(topic = name, partitions, replication_factor, "created topic in cluster");
    Ok(TopicMeta { name: name.to_string(), id: created.topic_id, partitions, configs })
}

/// CreateTopics in a cluster: the same checks as on a single node, then the controller.
pub(super) async fn create_topics_in_cluster(
    broker: Arc<Broker>,
    request: CreateTopicsRequest,
) -> CreateTopicsResponse {
    let mut response = CreateTopicsResponse::default();
    for topic in request.topics {
        let mut result = CreatableTopicResult::default();
        result.name = topic.name.clone();
        result.num_partitions = -1;
        result.replication_factor = -1;
        let outcome = match validate_creatable(&broker, &topic) {
            Err(refused) => Err(refused),
            Ok(meta) if request.validate_only => Ok(meta),
            Ok(meta) => {
                create_in_cluster(&broker, &meta.name, meta.partitions, topic.replication_factor, meta.configs).await
            }
        };
        match outcome {
            Ok(created) => {
                result.topic_id = created.id;
                result.num_partitions = created.partitions;
                result.replication_factor = topic.replication_factor;
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
