//! DescribeQuorum, AddRaftVoter and RemoveRaftVoter (KIP-595, KIP-853): what
//! `kafka-metadata-quorum.sh` and `Admin.describeMetadataQuorum` / `addRaftVoter` /
//! `removeRaftVoter` use. Sent to any broker, as Kafka's brokers forward them to the
//! controller: the node's controller asks the active one (`Controller::describe_quorum`,
//! `Controller::change_voters`).
//!
//! The quorum's log is Sluice's controller log, shown under Kafka's name for it
//! (`__cluster_metadata`, partition 0): offsets are raft log indexes, the leader epoch is the
//! raft term. A node run without `cluster.voters` has no quorum to change and describes
//! itself as its only voter.

use std::sync::Arc;

use kafka_protocol::messages::describe_quorum_response::{Listener, Node, PartitionData, ReplicaState, TopicData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use sluice_cluster::{QuorumDescription, QuorumReplica, VoterChange};

use super::message;
use crate::Broker;

/// The name Kafka gives the controller quorum's log.
const METADATA_TOPIC: &str = "__cluster_metadata";
/// The name under which voters' controller addresses are listed.
const CONTROLLER_LISTENER: &str = "CONTROLLER";

pub(super) async fn describe(broker: Arc<Broker>, request: DescribeQuorumRequest) -> DescribeQuorumResponse {
    let asks_metadata_log = request.topics.len() == 1
        && request.topics[0].topic_name.as_str() == METADATA_TOPIC
        && request.topics[0].partitions.len() == 1
        && request.topics[0].partitions[0].partition_index == 0;
    if !asks_metadata_log {
        return refused(ResponseError::UnknownTopicOrPartition, "only __cluster_metadata-0 has a quorum");
    }
    let controller = broker.cluster.as_ref().and_then(|cluster| cluster.controller().cloned());
    let description = match controller {
        Some(controller) => match controller.describe_quorum().await {
            Ok(description) => description,
            Err(error) => return refused(ResponseError::NotController, &error.to_string()),
        },
        None => quorum_of_one(broker.node_id()),
    };
    described(&description)
}

pub(super) async fn add_voter(broker: Arc<Broker>, request: AddRaftVoterRequest) -> AddRaftVoterResponse {
    let change = VoterChange::Add { node_id: request.voter_id, directory_id: request.voter_directory_id };
    let (error_code, error_message) = change_voters(&broker, request.cluster_id.as_ref(), change).await;
    AddRaftVoterResponse::default().with_error_code(error_code).with_error_message(error_message)
}

pub(super) async fn remove_voter(broker: Arc<Broker>, request: RemoveRaftVoterRequest) -> RemoveRaftVoterResponse {
    let change = VoterChange::Remove { node_id: request.voter_id, directory_id: request.voter_directory_id };
    let (error_code, error_message) = change_voters(&broker, request.cluster_id.as_ref(), change).await;
    RemoveRaftVoterResponse::default().with_error_code(error_code).with_error_message(error_message)
}

/// Makes `change` through the active controller: (error code, message).
async fn change_voters(broker: &Broker, cluster_id: Option<&StrBytes>, change: VoterChange) -> (i16, Option<StrBytes>) {
    let ours = broker.topics.cluster_id();
    if cluster_id.is_some_and(|named| named.as_str() != ours) {
        let text = format!("this is cluster {ours}, not {}", cluster_id.map_or("", |id| id.as_str()));
        return (ResponseError::InconsistentClusterId.code(), message(text));
    }
    let Some(controller) = broker.cluster.as_ref().and_then(|cluster| cluster.controller().cloned()) else {
        let text = "this node runs without a controller quorum (no cluster.voters): there are no voters to change";
        return (ResponseError::InvalidRequest.code(), message(text));
    };
    match controller.change_voters(change.clone()).await {
        Ok(Ok(())) => {
            tracing::info!(?change, "controller voters changed");
            (0, None)
        }
        Ok(Err(refused)) => (refused.kafka_error_code(), message(refused.to_string())),
        Err(error) => (error.kafka_error_code(), message(error.to_string())),
    }
}

fn refused(error: ResponseError, text: &str) -> DescribeQuorumResponse {
    let partition = PartitionData::default()
        .with_partition_index(0)
        .with_error_code(error.code())
        .with_error_message(message(text));
    let topic = TopicData::default()
        .with_topic_name(TopicName(StrBytes::from_static_str(METADATA_TOPIC)))
        .with_partitions(vec![partition]);
    DescribeQuorumResponse::default().with_topics(vec![topic])
}

fn described(description: &QuorumDescription) -> DescribeQuorumResponse {
    let replica_state = |replica: &QuorumReplica| {
        ReplicaState::default()
            .with_replica_id(BrokerId(replica.node_id))
            .with_replica_directory_id(replica.directory_id)
            .with_log_end_offset(replica.log_end_offset)
            .with_last_fetch_timestamp(replica.last_fetch_timestamp_ms)
            .with_last_caught_up_timestamp(replica.last_caught_up_timestamp_ms)
    };
    let partition = PartitionData::default()
        .with_partition_index(0)
        .with_leader_id(BrokerId(description.leader_id))
        .with_leader_epoch(description.leader_epoch)
        .with_high_watermark(description.high_watermark)
        .with_current_voters(description.voters.iter().map(replica_state).collect())
        .with_observers(description.observers.iter().map(replica_state).collect());
    let topic = TopicData::default()
        .with_topic_name(TopicName(StrBytes::from_static_str(METADATA_TOPIC)))
        .with_partitions(vec![partition]);
    let nodes = description.voters.iter().filter_map(node).collect();
    DescribeQuorumResponse::default().with_topics(vec![topic]).with_nodes(nodes)
}

/// A voter's controller address as DescribeQuorum v2 lists it.
fn node(replica: &QuorumReplica) -> Option<Node> {
    let (host, port) = replica.controller_address.as_deref()?.rsplit_once(':')?;
    let listener = Listener::default()
        .with_name(StrBytes::from_static_str(CONTROLLER_LISTENER))
        .with_host(StrBytes::from_string(host.trim_start_matches('[').trim_end_matches(']').to_string()))
        .with_port(port.parse().ok()?);
    Some(Node::default().with_node_id(BrokerId(replica.node_id)).with_listeners(vec![listener]))
}

/// A node without a controller quorum: itself, the only voter, always caught up.
fn quorum_of_one(node_id: i32) -> QuorumDescription {
    let now_ms =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(-1, |since| since.as_millis() as i64);
    let myself = QuorumReplica {
        node_id,
        directory_id: uuid::Uuid::nil(),
        log_end_offset: 0,
        last_fetch_timestamp_ms: now_ms,
        last_caught_up_timestamp_ms: now_ms,
        controller_address: None,
    };
    QuorumDescription {
        leader_id: node_id,
        leader_epoch: 0,
        high_watermark: 0,
        voters: vec![myself],
        observers: vec![],
    }
}
