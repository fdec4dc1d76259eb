//! Topic administration and cluster metadata: Metadata (with auto-creation),
//! CreateTopics, DeleteTopics, CreatePartitions, DescribeCluster and InitProducerId.

use std::collections::BTreeMap;
use std::sync::Arc;

use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
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
use sluice_cluster::ClusterMetadata;
use uuid::Uuid;

use super::{message, str_bytes};
use crate::metadata_writes::{Assignment, CreatedTopic, Failure, MetadataWriter, NewTopic};
use crate::{Broker, LEADER_EPOCH};
use sluice_config::PARTITIONS_PER_TOPIC_MAX;
use sluice_meta::topic_config;
use sluice_meta::topics::{validate_topic_name, TopicMeta};

/// CreateTopics v5 added the created topic's configs to the response.
const CREATE_TOPICS_CONFIGS_VERSION: i16 = 5;
/// DescribeConfigs config_source for a topic override and for a default.
pub(super) const SOURCE_TOPIC: i8 = 1;
pub(super) const SOURCE_DEFAULT: i8 = 5;

pub(super) fn metadata(broker: &Arc<Broker>, request: MetadataRequest, listener: usize) -> MetadataResponse {
    // One snapshot of the cluster's metadata for the whole response, so a client never sees
    // a leader from one version beside the brokers of another.
    let snapshot = broker.cluster.as_ref().map(|cluster| cluster.metadata());
    let snapshot = snapshot.as_deref();
    let mut response = MetadataResponse::default();
    response.brokers = live_brokers(broker, snapshot, listener)
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
        None => response.topics = broker.topics.all().iter().map(|t| topic_metadata(broker, snapshot, t)).collect(),
        Some(requested) => {
            for wanted in requested {
                let name = match wanted.name {
                    Some(name) => name.to_string(),
                    None => broker.topics.name_for_id(&wanted.topic_id).unwrap_or_default(),
                };
                response.topics.push(lookup_or_create(broker, snapshot, &name, wanted.topic_id, auto_create));
            }
        }
    }
    response
}

/// (node id, host, port) of every broker clients of `listener` may use: this one on a
/// single node, the unfenced ones that have that listener in a cluster (in `snapshot`).
fn live_brokers(broker: &Broker, snapshot: Option<&ClusterMetadata>, listener: usize) -> Vec<(i32, String, i32)> {
    if let Some(metadata) = snapshot {
        let name = &broker.listeners()[listener].name;
        let live: Vec<_> = metadata
            .brokers
            .values()
            .filter(|b| !b.fenced)
            .filter_map(|b| b.endpoint(name).map(|(host, port)| (b.node_id, host.to_string(), i32::from(port))))
            .collect();
        if !live.is_empty() {
            return live;
        }
    }
    let (host, port) = broker.advertised(listener);
    vec![(broker.node_id(), host, port)]
}

fn controller_id(broker: &Broker) -> i32 {
    match &broker.cluster {
        None => broker.node_id(),
        Some(cluster) => cluster.controller().and_then(|c| c.active_controller()).unwrap_or(-1),
    }
}

/// True when answering `request` may create topics' logs (a single node's auto-creation
/// of a topic it names that does not exist): it is then answered on the blocking pool.
pub(super) fn may_create_logs(broker: &Broker, request: &MetadataRequest) -> bool {
    broker.cluster.is_none()
        && request.allow_auto_topic_creation
        && broker.config().auto_create_topics
        && request.topics.iter().flatten().any(|wanted| match &wanted.name {
            Some(name) => broker.topics.get(name.as_str()).is_none(),
            None => false,
        })
}

fn lookup_or_create(
    broker: &Arc<Broker>,
    snapshot: Option<&ClusterMetadata>,
    name: &str,
    id: Uuid,
    auto_create: bool,
) -> MetadataResponseTopic {
    let failed = |error: ResponseError| {
        let mut topic = MetadataResponseTopic::default();
        topic.name = (!name.is_empty()).then(|| TopicName(str_bytes(name)));
        topic.topic_id = id;
        topic.error_code = error.code();
        topic
    };
    if let Some(topic) = broker.topics.get(name) {
        return topic_metadata(broker, snapshot, &topic);
    }
    if name.is_empty() {
        return failed(ResponseError::UnknownTopicId);
    }
    if validate_topic_name(name).is_err() {
        return failed(ResponseError::InvalidTopicException);
    }
    // Internal topics are created only by their coordinators, with their own configs.
    if !auto_create || sluice_meta::topics::is_internal(name) {
        return failed(ResponseError::UnknownTopicOrPartition);
    }
    if broker.cluster.is_some() {
        // As Kafka does: the topic is being created; the client asks again.
        let creating = broker.clone();
        let topic = name.to_string();
        tokio::spawn(async move {
            let partitions = creating.config().num_partitions;
            let meta = TopicMeta { name: topic.clone(), id: Uuid::new_v4(), partitions, configs: BTreeMap::new() };
            let new_topic = NewTopic { meta, replication_factor: -1, assignment: None };
            let created = match MetadataWriter::of(&creating) {
                Ok(writer) => writer.create_topic(new_topic, false).await.map(|_| ()),
                Err(failure) => Err(failure),
            };
            if let Err((_, error)) = created {
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
            topic_metadata(broker, snapshot, &topic)
        }
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => broker
            .topics
            .get(name)
            .map_or_else(|| failed(ResponseError::LeaderNotAvailable), |t| topic_metadata(broker, snapshot, &t)),
        Err(error) => {
            tracing::warn!(topic = name, %error, "auto-create failed");
            failed(ResponseError::KafkaStorageError)
        }
    }
}

/// A topic's partitions as `snapshot` (a cluster's metadata; `None` on a single node) has them.
fn topic_metadata(broker: &Broker, snapshot: Option<&ClusterMetadata>, topic: &TopicMeta) -> MetadataResponseTopic {
    let node = BrokerId(broker.node_id());
    let mut response = MetadataResponseTopic::default();
    response.name = Some(TopicName(str_bytes(&topic.name)));
    response.topic_id = topic.id;
    // Clients skip internal topics in pattern subscriptions and listings (Kafka's rule).
    response.is_internal = sluice_meta::topics::is_internal(&topic.name);
    if let Some(metadata) = snapshot {
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

/// CreateTopics, on a single node and in a cluster: the request's checks here, then the
/// metadata write path (`metadata_writes`).
pub(super) async fn create_topics(
    broker: Arc<Broker>,
    request: CreateTopicsRequest,
    version: i16,
) -> CreateTopicsResponse {
    let mut response = CreateTopicsResponse::default();
    for topic in request.topics {
        let mut result = CreatableTopicResult::default();
        result.name = topic.name.clone();
        result.num_partitions = -1;
        result.replication_factor = -1;
        match create_one(&broker, &topic, request.validate_only).await {
            Ok((created, configs)) => {
                if !request.validate_only {
                    tracing::info!(topic = %topic.name.as_str(), partitions = created.partitions, replication_factor = created.replication_factor, "created topic");
                }
                result.topic_id = created.id;
                result.num_partitions = created.partitions;
                result.replication_factor = created.replication_factor;
                if version >= CREATE_TOPICS_CONFIGS_VERSION {
                    result.configs = Some(described_configs(&broker, &configs));
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

/// A created topic's configs as CreateTopics v5+ returns them: every topic config, with its
/// source (an override of the request, or the default).
fn described_configs(broker: &Broker, overrides: &BTreeMap<String, String>) -> Vec<CreatableTopicConfigs> {
    broker
        .config()
        .topic_defaults
        .describe(overrides)
        .into_iter()
        .map(|c| {
            let mut config = CreatableTopicConfigs::default();
            config.name = str_bytes(c.name);
            config.value = Some(str_bytes(&c.value));
            config.config_source = if c.is_default { SOURCE_DEFAULT } else { SOURCE_TOPIC };
            config
        })
        .collect()
}

/// Checks a CreatableTopic (name, partitions, configs, the shape of a manual assignment) and
/// resolves its partition count; returns the manual assignment if there is one.
fn validate_creatable(broker: &Broker, topic: &CreatableTopic) -> Result<(TopicMeta, Option<Assignment>), Failure> {
    let name = topic.name.as_str();
    validate_topic_name(name).map_err(|e| (ResponseError::InvalidTopicException, e))?;
    if broker.topics.get(name).is_some() {
        return Err((ResponseError::TopicAlreadyExists, format!("topic {name:?} already exists")));
    }
    let assignment = requested_assignment(topic)?;
    let partitions = if let Some(assignment) = &assignment {
        i32::try_from(assignment.len()).expect("bounded by PARTITIONS_PER_TOPIC_MAX")
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
    topic_config::check_tiering(&broker.config().topic_defaults, None, &configs, broker.tiered.is_some())
        .map_err(|e| (ResponseError::InvalidConfig, e))?;
    Ok((TopicMeta { name: name.to_string(), id: Uuid::new_v4(), partitions, configs }, assignment))
}

/// The manual replica assignment of a CreatableTopic, checked as Kafka checks the request:
/// partition count and replication factor both -1 (the assignment decides them), and the
/// partition indexes exactly `0..n`. `None` when the request has no assignment.
fn requested_assignment(topic: &CreatableTopic) -> Result<Option<Assignment>, Failure> {
    if topic.assignments.is_empty() {
        return Ok(None);
    }
    if topic.num_partitions != -1 || topic.replication_factor != -1 {
        return Err((
            ResponseError::InvalidRequest,
            "both numPartitions or replicationFactor and replicasAssignments were set; both cannot be used at the \
             same time"
                .into(),
        ));
    }
    let count = topic.assignments.len();
    if count > PARTITIONS_PER_TOPIC_MAX as usize {
        return Err((
            ResponseError::InvalidPartitions,
            format!("{count} partitions, at most {PARTITIONS_PER_TOPIC_MAX}"),
        ));
    }
    let mut by_index: Vec<Option<Vec<i32>>> = vec![None; count];
    for assignment in &topic.assignments {
        let index = assignment.partition_index;
        match usize::try_from(index).ok().and_then(|index| by_index.get_mut(index)) {
            Some(slot @ None) => *slot = Some(assignment.broker_ids.iter().map(|id| id.0).collect()),
            _ => {
                return Err((
                    ResponseError::InvalidReplicaAssignment,
                    format!("partition {index}: the assigned partitions must be 0..{count}, each once"),
                ))
            }
        }
    }
    Ok(Some(by_index.into_iter().map(|replicas| replicas.expect("n distinct indexes below n")).collect()))
}

/// One topic of a CreateTopics: returns what was created and its config overrides.
async fn create_one(
    broker: &Arc<Broker>,
    topic: &CreatableTopic,
    validate_only: bool,
) -> Result<(CreatedTopic, BTreeMap<String, String>), Failure> {
    let (meta, assignment) = validate_creatable(broker, topic)?;
    let configs = meta.configs.clone();
    let new_topic = NewTopic { meta, replication_factor: topic.replication_factor, assignment };
    let created = MetadataWriter::of(broker)?.create_topic(new_topic, validate_only).await?;
    Ok((created, configs))
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
        Some(name) if sluice_meta::topics::is_internal(&name) => {
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

/// DeleteTopics: one metadata write per topic; in a cluster every node then stops its
/// replicas of the topic and deletes their logs (`cluster_link`).
pub(super) async fn delete_topics(broker: Arc<Broker>, request: DeleteTopicsRequest) -> DeleteTopicsResponse {
    let mut response = DeleteTopicsResponse::default();
    for (name, id) in wanted_deletions(&request) {
        let (mut result, target) = deletion_target(&broker, name, id);
        let outcome = match target {
            Ok(name) => match MetadataWriter::of(&broker) {
                Ok(writer) => writer.delete_topic(&name).await.map(|()| name),
                Err(failure) => Err(failure),
            },
            Err(failure) => Err(failure),
        };
        match outcome {
            Ok(name) => tracing::info!(topic = %name, "deleted topic"),
            Err((error, text)) => {
                result.error_code = error.code();
                result.error_message = message(text);
            }
        }
        response.responses.push(result);
    }
    response
}

/// CreatePartitions: the controller (or, on a single node, its local write path) places the
/// new partitions' replicas or checks the request's assignment, and every node opens the ones
/// it hosts. `validate_only` makes the same checks and writes nothing.
pub(super) async fn create_partitions(
    broker: Arc<Broker>,
    request: CreatePartitionsRequest,
) -> CreatePartitionsResponse {
    let mut response = CreatePartitionsResponse::default();
    for topic in request.topics {
        let mut result = CreatePartitionsTopicResult::default();
        result.name = topic.name.clone();
        let name = topic.name.as_str();
        let assignment = new_partitions_assignment(&topic);
        let outcome = match (check_growth(&broker, name, topic.count), MetadataWriter::of(&broker)) {
            (Ok(current), Ok(writer)) => {
                writer.add_partitions(current, topic.count, assignment, request.validate_only).await
            }
            (Err(failure), _) | (_, Err(failure)) => Err(failure),
        };
        match outcome {
            Ok(()) if !request.validate_only => {
                tracing::info!(topic = name, partitions = topic.count, "added partitions")
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

/// The replica lists a CreatePartitions names for its new partitions, in partition order.
fn new_partitions_assignment(topic: &CreatePartitionsTopic) -> Option<Assignment> {
    let lists = topic.assignments.as_ref()?;
    Some(lists.iter().map(|list| list.broker_ids.iter().map(|id| id.0).collect()).collect())
}

/// Checks that `name` exists and may grow to `count` partitions.
fn check_growth(broker: &Broker, name: &str, count: i32) -> Result<TopicMeta, Failure> {
    let Some(topic) = broker.topics.get(name) else {
        return Err((ResponseError::UnknownTopicOrPartition, format!("topic {name:?} does not exist")));
    };
    if sluice_meta::topics::is_internal(name) {
        return Err((ResponseError::InvalidRequest, format!("{name} is internal: its partition count is fixed")));
    }
    if count <= topic.partitions || count > PARTITIONS_PER_TOPIC_MAX {
        return Err((
            ResponseError::InvalidPartitions,
            format!("topic has {} partitions; the new count must be larger and at most {PARTITIONS_PER_TOPIC_MAX}, got {count}", topic.partitions),
        ));
    }
    Ok(topic)
}

pub(super) fn describe_cluster(
    broker: &Arc<Broker>,
    request: DescribeClusterRequest,
    listener: usize,
) -> DescribeClusterResponse {
    let mut response = DescribeClusterResponse::default();
    response.cluster_id = str_bytes(&broker.topics.cluster_id());
    response.controller_id = BrokerId(controller_id(broker));
    // Every live broker, as Metadata lists them: Kafka's tools (kafka-reassign-partitions)
    // check the broker ids of a plan against this list.
    let snapshot = broker.cluster.as_ref().map(|cluster| cluster.metadata());
    let node = |id: i32, host: &str, port: i32, fenced: bool| {
        let mut node = DescribeClusterBroker::default();
        node.broker_id = BrokerId(id);
        node.host = str_bytes(host);
        node.port = port;
        node.is_fenced = fenced;
        node
    };
    response.brokers = live_brokers(broker, snapshot.as_deref(), listener)
        .into_iter()
        .map(|(id, host, port)| node(id, &host, port, false))
        .collect();
    // v2 (KIP-1073): the registered but fenced brokers too, when asked, so that a health
    // check can tell a fenced node from one that was never there.
    if let (true, Some(metadata)) = (request.include_fenced_brokers, snapshot.as_deref()) {
        let name = &broker.listeners()[listener].name;
        for fenced in metadata.brokers.values().filter(|b| b.fenced) {
            if let Some((host, port)) = fenced.endpoint(name) {
                response.brokers.push(node(fenced.node_id, host, i32::from(port), true));
            }
        }
        response.brokers.sort_by_key(|b| b.broker_id.0);
    }
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
        if sluice_meta::topics::is_internal(&tp.topic) || !wanted(&tp.topic, tp.partition) {
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

pub(super) fn init_producer_id(broker: &Arc<Broker>, request: InitProducerIdRequest) -> InitProducerIdResponse {
    let mut response = InitProducerIdResponse::default();
    response.producer_id = ProducerId(-1);
    response.producer_epoch = -1;
    assert!(request.transactional_id.is_none(), "transactional producers go to transactions.rs");
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
