//! AlterPartitionReassignments and ListPartitionReassignments (KIP-455), what
//! `kafka-reassign-partitions` and `Admin::alterPartitionReassignments` use.
//!
//! The controller does the bookkeeping (`Controller::reassign`): while a partition moves
//! its replicas are the target plus the original ones; the new replicas are followers that
//! copy the log from the leader and join the ISR once caught up; when every target replica
//! is in the ISR the controller makes the target the replica set (moving leadership off a
//! removed replica), and the removed nodes stop their replicas and delete their logs.
//! On a single node (a cluster of one) the only possible target is the node itself, so
//! nothing ever moves.

use std::collections::BTreeSet;
use std::sync::Arc;

use kafka_protocol::messages::alter_partition_reassignments_request::ReassignablePartition;
use kafka_protocol::messages::alter_partition_reassignments_response::{
    ReassignablePartitionResponse, ReassignableTopicResponse,
};
use kafka_protocol::messages::list_partition_reassignments_response::{
    OngoingPartitionReassignment, OngoingTopicReassignment,
};
use kafka_protocol::messages::*;
use kafka_protocol::ResponseError;
use sluice_cluster::ClusterMetadata;

use super::message;
use super::Failure;
use crate::metadata_writes::MetadataWriter;
use crate::Broker;

pub(super) async fn alter(
    broker: Arc<Broker>,
    request: AlterPartitionReassignmentsRequest,
) -> AlterPartitionReassignmentsResponse {
    let mut response = AlterPartitionReassignmentsResponse::default();
    response.allow_replication_factor_change = request.allow_replication_factor_change;
    for topic in request.topics {
        let mut topic_result = ReassignableTopicResponse::default();
        topic_result.name = topic.name.clone();
        for partition in topic.partitions {
            let mut result = ReassignablePartitionResponse::default();
            result.partition_index = partition.partition_index;
            let outcome =
                reassign(&broker, topic.name.as_str(), &partition, request.allow_replication_factor_change).await;
            if let Err((error, text)) = outcome {
                tracing::info!(topic = %topic.name.as_str(), partition = partition.partition_index, %text, "reassignment refused");
                result.error_code = error.code();
                result.error_message = message(text);
            }
            topic_result.partitions.push(result);
        }
        response.responses.push(topic_result);
    }
    response
}

async fn reassign(
    broker: &Arc<Broker>,
    topic: &str,
    partition: &ReassignablePartition,
    allow_replication_factor_change: bool,
) -> Result<(), Failure> {
    let index = partition.partition_index;
    let target: Option<Vec<i32>> = partition.replicas.as_ref().map(|r| r.iter().map(|b| b.0).collect());
    let Some(original) = original_replicas(broker, topic, index) else {
        return Err((ResponseError::UnknownTopicOrPartition, format!("unknown partition {topic}-{index}")));
    };
    if let Some(target) = &target {
        check_target(target, original.len(), allow_replication_factor_change)?;
    }
    MetadataWriter::of(broker)?.reassign(topic, index, target.clone()).await?;
    match target {
        Some(target) => tracing::info!(topic, partition = index, ?target, "reassignment started"),
        None => tracing::info!(topic, partition = index, "reassignment cancelled"),
    }
    Ok(())
}

/// A partition's replicas before any move in progress; `None` if it does not exist.
fn original_replicas(broker: &Broker, topic: &str, index: i32) -> Option<Vec<i32>> {
    let Some(cluster) = &broker.cluster else {
        let exists = broker.topics.get(topic).is_some_and(|t| (0..t.partitions).contains(&index));
        return exists.then(|| vec![broker.node_id()]);
    };
    let metadata = cluster.metadata();
    let current = metadata.partition(topic, index)?;
    let pending = metadata.reassignments.get(topic).and_then(|by_partition| by_partition.get(&index));
    Some(pending.map_or(&current.replicas, |pending| &pending.original).clone())
}

/// The request-level checks Kafka makes before the controller sees a target.
fn check_target(target: &[i32], factor: usize, allow_replication_factor_change: bool) -> Result<(), Failure> {
    let unique: BTreeSet<i32> = target.iter().copied().collect();
    if target.is_empty() || unique.len() != target.len() || target.iter().any(|&b| b < 0) {
        return Err((
            ResponseError::InvalidReplicaAssignment,
            format!("target replicas {target:?} must be distinct broker ids, at least one"),
        ));
    }
    if !allow_replication_factor_change && target.len() != factor {
        return Err((
            ResponseError::InvalidReplicationFactor,
            format!("target replicas {target:?} change the replication factor {factor}"),
        ));
    }
    Ok(())
}

pub(super) fn list(
    broker: &Arc<Broker>,
    request: ListPartitionReassignmentsRequest,
) -> ListPartitionReassignmentsResponse {
    let mut response = ListPartitionReassignmentsResponse::default();
    let Some(cluster) = &broker.cluster else { return response };
    let metadata = cluster.metadata();
    let wanted = |topic: &str, index: i32| match &request.topics {
        None => true,
        Some(topics) => topics.iter().any(|t| t.name.as_str() == topic && t.partition_indexes.contains(&index)),
    };
    for (topic, by_partition) in &metadata.reassignments {
        let mut ongoing = OngoingTopicReassignment::default();
        ongoing.name = TopicName(super::str_bytes(topic));
        for (&index, reassignment) in by_partition.iter().filter(|(&index, _)| wanted(topic, index)) {
            ongoing.partitions.push(ongoing_partition(&metadata, topic, index, reassignment));
        }
        if !ongoing.partitions.is_empty() {
            response.topics.push(ongoing);
        }
    }
    response
}

/// One partition in motion: its replicas now, and which are being added and removed.
fn ongoing_partition(
    metadata: &ClusterMetadata,
    topic: &str,
    index: i32,
    reassignment: &sluice_cluster::Reassignment,
) -> OngoingPartitionReassignment {
    let ids = |nodes: Vec<i32>| nodes.into_iter().map(BrokerId).collect::<Vec<_>>();
    let (target, original) = (&reassignment.target, &reassignment.original);
    let mut ongoing = OngoingPartitionReassignment::default();
    ongoing.partition_index = index;
    ongoing.replicas = ids(metadata.partition(topic, index).map_or_else(Vec::new, |p| p.replicas.clone()));
    ongoing.adding_replicas = ids(target.iter().copied().filter(|r| !original.contains(r)).collect());
    ongoing.removing_replicas = ids(original.iter().copied().filter(|r| !target.contains(r)).collect());
    ongoing
}
