//! The write path of topic metadata, one for a single node and a cluster.
//!
//! A single node is a cluster of one: the admin handlers validate a request once and hand
//! the change to a [`MetadataWriter`], which either is this node's own registry (a local
//! implementation of the controller's write path: the same checks a controller makes for a
//! cluster whose only broker is this node, the change fsynced before the answer) or the
//! controller quorum (a committed write, applied here before the answer). The handlers
//! have no second path to drift apart.

use std::collections::BTreeMap;
use std::sync::Arc;

use kafka_protocol::ResponseError;
use sluice_cluster::{ClusterMetadata, Controller, ControllerError};
use sluice_meta::topics::TopicMeta;
use uuid::Uuid;

use crate::Broker;

/// An admin request's refusal: the Kafka error and a message for the client.
pub(crate) type Failure = (ResponseError, String);

/// How long an admin request waits for its committed change to be applied on this broker.
const APPLY_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// A manual replica assignment: the replicas of partition `i` are `assignment[i]`.
pub(crate) type Assignment = Vec<Vec<i32>>;

/// A validated topic to create: its name, id, partition count and config overrides, the
/// requested replication factor (-1: the default) and an optional manual assignment.
pub(crate) struct NewTopic {
    pub(crate) meta: TopicMeta,
    pub(crate) replication_factor: i16,
    pub(crate) assignment: Option<Assignment>,
}

/// What a created (or, for `validate_only`, creatable) topic turned out to be.
pub(crate) struct CreatedTopic {
    pub(crate) id: Uuid,
    pub(crate) partitions: i32,
    pub(crate) replication_factor: i16,
}

/// The configs every internal topic has (the coordinators' and the schema registry's):
/// `min.insync.replicas` 2 from three replicas on, durability level 1 (fsynced at every
/// in-sync replica before an acknowledgement), no time retention.
pub(crate) fn internal_topic_configs(replication_factor: i16) -> BTreeMap<String, String> {
    let min_insync = if replication_factor >= 3 { 2 } else { 1 };
    BTreeMap::from([
        ("min.insync.replicas".to_string(), min_insync.to_string()),
        ("sluice.durability.level".to_string(), "1".to_string()),
        ("retention.ms".to_string(), "-1".to_string()),
    ])
}

/// Where this node's topic changes are decided and made durable.
pub(crate) enum MetadataWriter<'a> {
    /// A node without a controller quorum: its own topic registry and logs.
    Local(&'a Arc<Broker>),
    /// The controller quorum of a cluster.
    Controller(&'a Arc<Broker>, Arc<Controller>),
}

impl<'a> MetadataWriter<'a> {
    /// This node's writer; refused while a cluster node's controller is not started.
    pub(crate) fn of(broker: &'a Arc<Broker>) -> Result<MetadataWriter<'a>, Failure> {
        match &broker.cluster {
            None => Ok(MetadataWriter::Local(broker)),
            Some(_) => Ok(MetadataWriter::Controller(broker, controller(broker)?)),
        }
    }

    /// Creates a topic (or, for `validate_only`, makes every check a creation would make).
    pub(crate) async fn create_topic(&self, topic: NewTopic, validate_only: bool) -> Result<CreatedTopic, Failure> {
        match self {
            MetadataWriter::Local(broker) => create_local(broker, topic, validate_only).await,
            MetadataWriter::Controller(broker, controller) => {
                create_through_controller(broker, controller, topic, validate_only).await
            }
        }
    }

    /// Deletes a topic: its logs, and in a cluster every node's replicas of it.
    pub(crate) async fn delete_topic(&self, name: &str) -> Result<(), Failure> {
        match self {
            MetadataWriter::Local(broker) => {
                let (broker, owned) = (Arc::clone(broker), name.to_string());
                match blocking(move || broker.delete_topic(&owned)).await? {
                    Ok(Some(_)) => Ok(()),
                    Ok(None) => Err((ResponseError::UnknownTopicOrPartition, format!("topic {name:?} does not exist"))),
                    Err(error) => Err((ResponseError::KafkaStorageError, error.to_string())),
                }
            }
            MetadataWriter::Controller(broker, controller) => {
                // A tiered topic's objects are deleted by the node that deleted it, once committed.
                let tiered = broker.topics.get(name).filter(sluice_tiered::is_tiered);
                controller_write(broker, controller.delete_topic(name)).await?;
                if let (Some(store), Some(topic)) = (&broker.tiered, tiered) {
                    store.forget_topic(topic);
                }
                Ok(())
            }
        }
    }

    /// Grows `topic` to `count` partitions (checked: the topic exists and grows).
    pub(crate) async fn add_partitions(
        &self,
        topic: TopicMeta,
        count: i32,
        assignment: Option<Assignment>,
        validate_only: bool,
    ) -> Result<(), Failure> {
        match self {
            MetadataWriter::Local(broker) => {
                check_local_assignment(broker, assignment.as_deref())?;
                let added = count - topic.partitions;
                if let Some(lists) = assignment.filter(|lists| lists.len() != added as usize) {
                    return Err((
                        ResponseError::InvalidReplicaAssignment,
                        format!("{added} partitions are added but {} replica lists were given", lists.len()),
                    ));
                }
                if validate_only {
                    return Ok(());
                }
                let broker = Arc::clone(broker);
                blocking(move || broker.add_partitions(&topic, count)).await?.map_err(|e| match e.kind() {
                    std::io::ErrorKind::NotFound => (ResponseError::UnknownTopicOrPartition, e.to_string()),
                    _ => (ResponseError::KafkaStorageError, e.to_string()),
                })
            }
            MetadataWriter::Controller(broker, _) if validate_only => cluster_metadata(broker)
                .check_create_partitions(&topic.name, count, assignment.as_deref())
                .map_err(|e| refused(e.kafka_error_code(), e.to_string())),
            MetadataWriter::Controller(broker, controller) => {
                controller_write(broker, controller.create_partitions(&topic.name, count, assignment)).await
            }
        }
    }

    /// Replaces a topic's config overrides. `expected`: the overrides they were computed
    /// from, for a compare-and-set (`None`: replace whatever is there). A concurrent change
    /// is refused with `InvalidUpdateVersion`, for the caller to compute again.
    pub(crate) async fn set_topic_configs(
        &self,
        name: &str,
        configs: BTreeMap<String, String>,
        expected: Option<BTreeMap<String, String>>,
    ) -> Result<(), Failure> {
        match self {
            MetadataWriter::Local(broker) => set_local_configs(broker, name, configs, expected),
            MetadataWriter::Controller(broker, controller) => {
                controller_write(broker, controller.alter_topic_configs(name, configs, expected)).await
            }
        }
    }

    /// Replaces a share group's config overrides, durable before the answer. In a cluster
    /// every broker leading a partition the group consumes needs them: the cluster metadata
    /// carries them.
    pub(crate) async fn set_group_configs(
        &self,
        group_id: &str,
        configs: BTreeMap<String, String>,
    ) -> Result<(), Failure> {
        match self {
            MetadataWriter::Local(broker) => broker
                .shares
                .set_group_configs(&***broker, group_id, configs)
                .await
                .map_err(|error| (error, "could not store the group configs".to_string())),
            MetadataWriter::Controller(broker, controller) => {
                controller_write(broker, controller.alter_group_configs(group_id, configs)).await
            }
        }
    }

    /// Starts (`Some`) or cancels (`None`) the move of a partition to `target` replicas.
    pub(crate) async fn reassign(&self, topic: &str, partition: i32, target: Option<Vec<i32>>) -> Result<(), Failure> {
        match self {
            MetadataWriter::Local(broker) => {
                let exists = broker.topics.get(topic).is_some_and(|t| (0..t.partitions).contains(&partition));
                if !exists {
                    return Err((
                        ResponseError::UnknownTopicOrPartition,
                        format!("unknown partition {topic}-{partition}"),
                    ));
                }
                match target {
                    None => Err((
                        ResponseError::NoReassignmentInProgress,
                        format!("no reassignment of {topic}-{partition}"),
                    )),
                    // Already the replica set: nothing moves.
                    Some(target) if target == [broker.node_id()] => Ok(()),
                    Some(target) => Err((
                        ResponseError::InvalidReplicaAssignment,
                        format!("{target:?}: this single node only has broker {}", broker.node_id()),
                    )),
                }
            }
            MetadataWriter::Controller(broker, controller) => {
                controller_write(broker, controller.reassign(topic, partition, target)).await
            }
        }
    }
}

/// A single node creates the topic's logs and registry entry, fsynced, on the blocking
/// pool. Its checks are the controller's for a cluster whose only broker is this node.
async fn create_local(broker: &Arc<Broker>, topic: NewTopic, validate_only: bool) -> Result<CreatedTopic, Failure> {
    check_local_assignment(broker, topic.assignment.as_deref())?;
    if !(topic.replication_factor == -1 || topic.replication_factor == 1) {
        return Err((
            ResponseError::InvalidReplicationFactor,
            format!("replication factor {} is larger than the 1 available broker", topic.replication_factor),
        ));
    }
    let meta = topic.meta;
    let created = CreatedTopic { id: meta.id, partitions: meta.partitions, replication_factor: 1 };
    if validate_only {
        return Ok(created);
    }
    let name = meta.name.clone();
    let creating = Arc::clone(broker);
    match blocking(move || creating.create_topic(meta)).await? {
        Ok(()) => Ok(created),
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {
            Err((ResponseError::TopicAlreadyExists, format!("topic {name:?} already exists")))
        }
        Err(error) => Err((ResponseError::KafkaStorageError, format!("could not create topic: {error}"))),
    }
}

/// On a single node, a manual assignment may only name this node, once per partition.
fn check_local_assignment(broker: &Broker, assignment: Option<&[Vec<i32>]>) -> Result<(), Failure> {
    let node = broker.node_id();
    if assignment.unwrap_or_default().iter().any(|replicas| replicas[..] != [node]) {
        return Err((
            ResponseError::InvalidReplicaAssignment,
            format!("this single-node cluster only has node {node}"),
        ));
    }
    Ok(())
}

/// A single node stores the overrides and applies them to the live logs at once.
fn set_local_configs(
    broker: &Broker,
    name: &str,
    configs: BTreeMap<String, String>,
    expected: Option<BTreeMap<String, String>>,
) -> Result<(), Failure> {
    let mut conflict = false;
    let updated = broker
        .topics
        .update(name, |t| match &expected {
            Some(expected) if *expected != t.configs => conflict = true,
            _ => t.configs = configs,
        })
        .map_err(|e| (ResponseError::KafkaStorageError, e.to_string()))?
        .ok_or_else(|| (ResponseError::UnknownTopicOrPartition, format!("topic {name:?} does not exist")))?;
    if conflict {
        return Err((ResponseError::InvalidUpdateVersion, format!("the configs of {name:?} changed meanwhile")));
    }
    let log_config = broker.config().topic_defaults.log_config(&updated.configs);
    for p in 0..updated.partitions {
        if let Some(log) = broker.partition(name, p) {
            log.set_config(log_config.clone());
        }
    }
    Ok(())
}

/// A cluster: the request's checks on this node's copy of the metadata for `validate_only`,
/// else a controller write, answered once this node lists the topic.
async fn create_through_controller(
    broker: &Arc<Broker>,
    controller: &Controller,
    topic: NewTopic,
    validate_only: bool,
) -> Result<CreatedTopic, Failure> {
    let NewTopic { meta, replication_factor, assignment } = topic;
    let name = meta.name.as_str();
    if validate_only {
        let (partitions, factor) = match &assignment {
            Some(_) => (-1, -1),
            None => (meta.partitions, resolved_replication_factor(broker, replication_factor)),
        };
        cluster_metadata(broker)
            .check_create_topic(name, partitions, factor, &meta.configs, assignment.as_deref())
            .map_err(|e| refused(e.kafka_error_code(), e.to_string()))?;
        let factor = assignment.map_or(factor, |lists| lists[0].len() as i16);
        return Ok(CreatedTopic { id: meta.id, partitions: meta.partitions, replication_factor: factor });
    }
    let configs = meta.configs.clone();
    let created = match assignment {
        Some(assignment) => {
            controller_write(broker, controller.create_topic_with_assignment(name, assignment, configs)).await?
        }
        None => {
            let factor = resolved_replication_factor(broker, replication_factor);
            controller_write(broker, controller.create_topic(name, meta.partitions, factor, configs)).await?
        }
    };
    wait_until_listed(broker, name).await;
    Ok(CreatedTopic {
        id: created.topic_id,
        partitions: i32::try_from(created.partitions.len()).expect("bounded by PARTITIONS_PER_TOPIC_MAX"),
        replication_factor: i16::try_from(created.partitions[0].replicas.len())
            .expect("bounded by REPLICATION_FACTOR_MAX"),
    })
}

/// A requested replication factor, with -1 resolved to the configured default (at most the
/// number of unfenced brokers).
fn resolved_replication_factor(broker: &Broker, requested: i16) -> i16 {
    if requested != -1 {
        return requested;
    }
    let default_rf = broker.config().cluster.as_ref().map_or(1, |c| c.default_replication_factor);
    let unfenced = cluster_metadata(broker).brokers.values().filter(|b| !b.fenced).count().max(1);
    default_rf.min(i16::try_from(unfenced).unwrap_or(i16::MAX))
}

/// Waits (a bounded time) until this node's topic registry lists a topic the controller created.
async fn wait_until_listed(broker: &Broker, name: &str) {
    let deadline = tokio::time::Instant::now() + APPLY_WAIT;
    while broker.topics.get(name).is_none() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// Runs a change that opens, writes or deletes files on the blocking pool, never on a
/// connection thread.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Result<T, Failure> {
    crate::blocking::on_blocking_pool(work)
        .await
        .ok_or_else(|| (ResponseError::UnknownServerError, "the broker is shutting down".to_string()))
}

/// This node's controller, for an admin request in cluster mode.
pub(crate) fn controller(broker: &Broker) -> Result<Arc<Controller>, Failure> {
    let cluster = broker.cluster.as_ref().expect("cluster mode");
    cluster.controller().cloned().ok_or((ResponseError::NotController, "controller not started".into()))
}

/// Runs one controller write of an admin request (bounded by `ADMIN_TIMEOUT`), maps a
/// refusal to its Kafka error, and returns once this broker applied the change, so that
/// the client's next request here already sees it.
pub(crate) async fn controller_write<T>(
    broker: &Broker,
    write: impl std::future::Future<Output = Result<T, ControllerError>>,
) -> Result<T, Failure> {
    let cluster = broker.cluster.as_ref().expect("cluster mode");
    let written = tokio::time::timeout(crate::cluster_link::ADMIN_TIMEOUT, write)
        .await
        .map_err(|_| (ResponseError::RequestTimedOut, "controller did not answer in time".to_string()))?
        .map_err(|e| refused(e.kafka_error_code(), e.to_string()))?;
    if !cluster.wait_applied(cluster.controller_version(), APPLY_WAIT).await {
        tracing::warn!("admin change committed but not yet applied on this broker");
    }
    Ok(written)
}

/// A refusal of the controller (or of its state machine's checks), as the client sees it.
fn refused(kafka_error_code: i16, text: String) -> Failure {
    (ResponseError::try_from_code(kafka_error_code).unwrap_or(ResponseError::UnknownServerError), text)
}

/// The cluster metadata this node has applied, for admin checks that write nothing.
fn cluster_metadata(broker: &Broker) -> Arc<ClusterMetadata> {
    broker.cluster.as_ref().expect("cluster mode").metadata()
}
