//! Consumer-group APIs shared by both protocols or classic only: FindCoordinator,
//! JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch, OffsetDelete,
//! ListGroups, DescribeGroups and DeleteGroups (the KIP-848 APIs are in
//! `consumer_groups`). These handlers only translate between the wire messages and the
//! [`GroupCoordinator`]; the rules live in `sluice_coordinator::group`.
//!
//! Long-polls (JoinGroup, SyncGroup) and durable offset writes return futures that wait
//! without holding any coordinator lock, each bounded by a timeout.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::offset_commit_response::{OffsetCommitResponsePartition, OffsetCommitResponseTopic};
use kafka_protocol::messages::offset_delete_response::{OffsetDeleteResponsePartition, OffsetDeleteResponseTopic};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions, OffsetFetchResponseTopic,
    OffsetFetchResponseTopics,
};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::metadata_writes::{MetadataWriter, NewTopic};
use crate::Broker;
use sluice_coordinator::group::error::GroupError;
use sluice_coordinator::group::offsets::CommittedOffset;
use sluice_coordinator::group::state::{JoinRequest, JoinResponse, Protocol, Reply, SyncRequest, SyncResponse};
use sluice_coordinator::group::{
    validate_group_id, Committer, GroupCoordinator, OffsetQuery, LONG_POLL_SLACK_MS, OFFSETS_BATCH_BYTES_MAX,
    OFFSETS_TOPIC, OFFSET_METADATA_BYTES_MAX, REBALANCE_TIMEOUT_MS_MAX,
};
use sluice_coordinator::placement::partition_for;
use sluice_coordinator::txn::log::{TXN_LOG_BATCH_BYTES_MAX, TXN_LOG_SEGMENT_BYTES, TXN_STATE_TOPIC};
use sluice_meta::topics::TopicMeta;

/// Kafka's default `offsets.topic.replication.factor` (3), capped by the voter count.
const OFFSETS_TOPIC_REPLICATION_FACTOR_DEFAULT_MAX: usize = 3;
/// FindCoordinator key types.
const KEY_TYPE_GROUP: i8 = 0;
const KEY_TYPE_TRANSACTION: i8 = 1;
/// FindCoordinator v4 moved to batched `coordinator_keys`.
const FIND_COORDINATOR_BATCHED_VERSION: i16 = 4;
/// JoinGroup v4 requires a known member id (KIP-394); v7 made protocol_name nullable.
const JOIN_REQUIRE_MEMBER_ID_VERSION: i16 = 4;
const JOIN_NULLABLE_PROTOCOL_VERSION: i16 = 7;
const JOIN_SKIP_ASSIGNMENT_VERSION: i16 = 9;
/// LeaveGroup v3 leaves a batch of members.
const LEAVE_BATCH_VERSION: i16 = 3;
/// OffsetFetch v8 asks for several groups at once.
const OFFSET_FETCH_GROUPS_VERSION: i16 = 8;

pub(super) type Pending<T> = std::pin::Pin<Box<dyn Future<Output = T> + Send>>;

pub(super) fn text(value: &str) -> StrBytes {
    StrBytes::from_string(value.to_string())
}

pub(super) fn coordinator(broker: &Arc<Broker>) -> &Arc<GroupCoordinator> {
    broker.groups.start_ticker(broker);
    &broker.groups
}

/// The broker's internal topics, each the log of a coordinator whose keys (group ids,
/// transactional ids) are placed on its partitions by hash; the leader of a key's
/// partition is the key's coordinator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InternalTopic {
    /// `__consumer_offsets`: the group coordinator's.
    Offsets,
    /// `__transaction_state`: the transaction coordinator's.
    TransactionState,
    /// `__share_group_state`: the share-partition state store's.
    ShareState,
}

impl InternalTopic {
    fn name(self) -> &'static str {
        match self {
            InternalTopic::Offsets => OFFSETS_TOPIC,
            InternalTopic::TransactionState => TXN_STATE_TOPIC,
            InternalTopic::ShareState => sluice_coordinator::share::store::SHARE_STATE_TOPIC,
        }
    }

    fn creating(self, broker: &Broker) -> &std::sync::atomic::AtomicBool {
        match self {
            InternalTopic::Offsets => &broker.groups.creating_offsets_topic,
            InternalTopic::TransactionState => &broker.transactions.creating_topic,
            InternalTopic::ShareState => &broker.shares.store.creating_topic,
        }
    }

    /// `*_replication_factor`, or min(3, voters) when unset.
    fn replication_factor(self, broker: &Broker) -> i16 {
        let config = broker.config();
        let voters = config.cluster.as_ref().and_then(|c| c.voters().ok()).map_or(1, |v| v.len());
        let configured = match self {
            InternalTopic::Offsets => config.offsets_topic_replication_factor,
            InternalTopic::TransactionState | InternalTopic::ShareState => config.transaction_state_replication_factor,
        };
        match configured {
            factor if factor > 0 => factor,
            _ => voters.min(OFFSETS_TOPIC_REPLICATION_FACTOR_DEFAULT_MAX) as i16,
        }
    }

    /// Partition count, segment size and largest batch.
    fn layout(self, broker: &Broker) -> (i32, u64, usize) {
        let config = broker.config();
        match self {
            InternalTopic::Offsets => {
                (config.offsets_topic_num_partitions, config.offsets_topic_segment_bytes, OFFSETS_BATCH_BYTES_MAX)
            }
            InternalTopic::TransactionState => {
                (config.transaction_state_num_partitions, TXN_LOG_SEGMENT_BYTES, TXN_LOG_BATCH_BYTES_MAX)
            }
            InternalTopic::ShareState => (
                sluice_coordinator::share::store::SHARE_STATE_NUM_PARTITIONS,
                TXN_LOG_SEGMENT_BYTES,
                TXN_LOG_BATCH_BYTES_MAX,
            ),
        }
    }
}

/// Where the coordinator of `key` is: this node on a single node; in a cluster the leader
/// of the key's partition of `topic` (created on first use, as Kafka does).
fn coordinator_of(
    broker: &Arc<Broker>,
    topic: InternalTopic,
    key: &str,
    listener: usize,
) -> Result<(i32, String, i32), (ResponseError, String)> {
    let Some(cluster) = &broker.cluster else {
        let (host, port) = broker.advertised(listener);
        return Ok((broker.node_id(), host, port));
    };
    let metadata = cluster.metadata();
    let not_available = |message: String| (ResponseError::CoordinatorNotAvailable, message);
    let Some(partitions) = metadata.topics.get(topic.name()) else {
        create_internal_topic(broker, topic);
        return Err(not_available(format!("{} is being created", topic.name())));
    };
    let count = i32::try_from(partitions.partitions.len()).unwrap_or(0);
    if count == 0 {
        return Err(not_available(format!("{} has no partitions", topic.name())));
    }
    let leader = partitions.partitions[partition_for(key, count) as usize].leader;
    match metadata.brokers.get(&leader) {
        Some(node) if !node.fenced => match node.endpoint(&broker.listeners()[listener].name) {
            Some((host, port)) => Ok((leader, host.to_string(), i32::from(port))),
            None => Err(not_available("the coordinator has no endpoint on this listener".to_string())),
        },
        _ => Err(not_available(format!("the key's {} partition has no leader", topic.name()))),
    }
}

/// Cluster mode, on the active controller's node: creates the internal topics as soon as
/// enough brokers registered to hold their replicas, so they exist before any group or
/// transaction needs them and a node lost later does not stop them (Kafka creates them on
/// first use and then needs every one of its replication factor's brokers up at that moment).
pub(crate) fn create_internal_topics_once_formed(broker: &Arc<Broker>) {
    let Some(cluster) = &broker.cluster else { return };
    let active = cluster.controller().and_then(|c| c.active_controller());
    if active != Some(broker.node_id()) {
        return;
    }
    let metadata = cluster.metadata();
    let unfenced = metadata.brokers.values().filter(|b| !b.fenced).count();
    for topic in [InternalTopic::Offsets, InternalTopic::TransactionState, InternalTopic::ShareState] {
        if !metadata.topics.contains_key(topic.name()) && unfenced >= topic.replication_factor(broker) as usize {
            create_internal_topic(broker, topic);
        }
    }
}

/// Creates an internal topic through the controller once (a concurrent or repeated
/// creation is refused there as TOPIC_ALREADY_EXISTS): its configured partitions and
/// replicas (default min(3, voters)), `min.insync.replicas` 2 from three replicas on,
/// durability level 1, no time retention.
fn create_internal_topic(broker: &Arc<Broker>, topic: InternalTopic) {
    use std::sync::atomic::Ordering;
    if topic.creating(broker).swap(true, Ordering::AcqRel) {
        return;
    }
    let broker = broker.clone();
    tokio::spawn(async move {
        let replication_factor = topic.replication_factor(&broker);
        let (partitions, segment_bytes, max_message_bytes) = topic.layout(&broker);
        let mut configs = crate::metadata_writes::internal_topic_configs(replication_factor);
        configs.extend([
            ("retention.bytes".to_string(), "-1".to_string()),
            ("segment.bytes".to_string(), segment_bytes.to_string()),
            ("max.message.bytes".to_string(), max_message_bytes.to_string()),
        ]);
        let name = topic.name();
        let meta = TopicMeta { name: name.to_string(), id: uuid::Uuid::new_v4(), partitions, configs };
        let new_topic = NewTopic { meta, replication_factor, assignment: None };
        let created = match MetadataWriter::of(&broker) {
            Ok(writer) => writer.create_topic(new_topic, false).await,
            Err(failure) => Err(failure),
        };
        match created {
            Ok(_) => tracing::info!(topic = name, partitions, replication_factor, "created an internal topic"),
            Err((error, message)) => tracing::info!(topic = name, ?error, %message, "internal topic not created (yet)"),
        }
        topic.creating(&broker).store(false, Ordering::Release);
    });
}

pub(super) fn find_coordinator(
    broker: &Arc<Broker>,
    request: FindCoordinatorRequest,
    version: i16,
    listener: usize,
) -> FindCoordinatorResponse {
    coordinator(broker);
    let answer = |key: &StrBytes, key_type: i8| -> Coordinator {
        let mut coordinator = Coordinator::default();
        coordinator.key = key.clone();
        let found = match key_type {
            KEY_TYPE_GROUP => coordinator_of(broker, InternalTopic::Offsets, key.as_str(), listener),
            KEY_TYPE_TRANSACTION => coordinator_of(broker, InternalTopic::TransactionState, key.as_str(), listener),
            _ => Err((ResponseError::InvalidRequest, "unknown coordinator key type".to_string())),
        };
        match found {
            Ok((node_id, host, port)) => {
                coordinator.node_id = BrokerId(node_id);
                coordinator.host = text(&host);
                coordinator.port = port;
            }
            Err((error, message)) => {
                coordinator.node_id = BrokerId(-1);
                coordinator.port = -1;
                coordinator.error_code = error.code();
                coordinator.error_message = Some(text(&message));
            }
        }
        coordinator
    };
    let mut response = FindCoordinatorResponse::default();
    if version >= FIND_COORDINATOR_BATCHED_VERSION {
        response.coordinators = request.coordinator_keys.iter().map(|key| answer(key, request.key_type)).collect();
        return response;
    }
    let single = answer(&request.key, request.key_type);
    response.error_code = single.error_code;
    response.error_message = single.error_message;
    response.node_id = single.node_id;
    response.host = single.host;
    response.port = single.port;
    response
}

pub(super) fn join_group(
    broker: &Arc<Broker>,
    request: JoinGroupRequest,
    version: i16,
    client_id: Option<StrBytes>,
    client_host: String,
) -> Pending<JoinGroupResponse> {
    let coordinator = coordinator(broker);
    let rebalance_timeout_ms = if version == 0 { request.session_timeout_ms } else { request.rebalance_timeout_ms };
    let join = JoinRequest {
        member_id: request.member_id.to_string(),
        group_instance_id: request.group_instance_id.as_ref().map(|s| s.to_string()),
        client_id: client_id.map(|s| s.to_string()).unwrap_or_default(),
        client_host,
        session_timeout_ms: request.session_timeout_ms,
        rebalance_timeout_ms,
        protocol_type: request.protocol_type.to_string(),
        protocols: request
            .protocols
            .into_iter()
            .map(|p| Protocol { name: p.name.to_string(), metadata: p.metadata })
            .collect(),
        require_known_member_id: version >= JOIN_REQUIRE_MEMBER_ID_VERSION,
    };
    let member_id = join.member_id.clone();
    let reply = coordinator.join(request.group_id.as_str(), join);
    let bound = long_poll_bound(rebalance_timeout_ms) + Duration::from_millis(broker_initial_delay(broker));
    Box::pin(async move {
        let response = match reply {
            Err(error) => JoinResponse::failed(error, &member_id),
            Ok(reply) => wait(reply, bound, || JoinResponse::failed(GroupError::RebalanceInProgress, &member_id)).await,
        };
        join_response(response, version)
    })
}

fn broker_initial_delay(broker: &Broker) -> u64 {
    broker.config().group_initial_rebalance_delay_ms
}

fn long_poll_bound(timeout_ms: i32) -> Duration {
    Duration::from_millis(timeout_ms.clamp(0, REBALANCE_TIMEOUT_MS_MAX) as u64 + LONG_POLL_SLACK_MS)
}

/// Resolves a reply, waiting at most `bound` (a dropped or late answer becomes `lost()`).
async fn wait<T>(reply: Reply<T>, bound: Duration, lost: impl FnOnce() -> T) -> T {
    match reply {
        Reply::Ready(value) => value,
        Reply::Wait(receiver) => match tokio::time::timeout(bound, receiver).await {
            Ok(Ok(value)) => value,
            Ok(Err(_)) | Err(_) => lost(),
        },
    }
}

fn join_response(response: JoinResponse, version: i16) -> JoinGroupResponse {
    let mut out = JoinGroupResponse::default();
    out.error_code = response.error.map_or(0, GroupError::code);
    out.generation_id = response.generation_id;
    out.protocol_type = response.protocol_type.as_deref().map(text);
    out.protocol_name = match response.protocol_name.as_deref() {
        Some(name) => Some(text(name)),
        None if version < JOIN_NULLABLE_PROTOCOL_VERSION => Some(StrBytes::default()),
        None => None,
    };
    out.leader = text(&response.leader_id);
    // Only v9 can say so; older leaders see the old leader id and do not assign anyway.
    out.skip_assignment = response.skip_assignment && version >= JOIN_SKIP_ASSIGNMENT_VERSION;
    out.member_id = text(&response.member_id);
    out.members = response
        .members
        .into_iter()
        .map(|m| {
            let mut member = JoinGroupResponseMember::default();
            member.member_id = text(&m.member_id);
            member.group_instance_id = m.group_instance_id.as_deref().map(text);
            member.metadata = m.metadata;
            member
        })
        .collect();
    out
}

pub(super) fn sync_group(broker: &Arc<Broker>, request: SyncGroupRequest) -> Pending<SyncGroupResponse> {
    let coordinator = coordinator(broker);
    let sync = SyncRequest {
        member_id: request.member_id.to_string(),
        group_instance_id: request.group_instance_id.as_ref().map(|s| s.to_string()),
        generation_id: request.generation_id,
        protocol_type: request.protocol_type.as_ref().map(|s| s.to_string()),
        protocol_name: request.protocol_name.as_ref().map(|s| s.to_string()),
        assignments: request.assignments.into_iter().map(|a| (a.member_id.to_string(), a.assignment)).collect(),
    };
    let reply = coordinator.sync(request.group_id.as_str(), sync);
    let bound = long_poll_bound(REBALANCE_TIMEOUT_MS_MAX);
    Box::pin(async move {
        let response: SyncResponse = wait(reply, bound, || SyncResponse::failed(GroupError::RebalanceInProgress)).await;
        let mut out = SyncGroupResponse::default();
        out.error_code = response.error.map_or(0, GroupError::code);
        out.protocol_type = response.protocol_type.as_deref().map(text);
        out.protocol_name = response.protocol_name.as_deref().map(text);
        out.assignment = response.assignment;
        out
    })
}

pub(super) fn heartbeat(broker: &Arc<Broker>, request: HeartbeatRequest) -> HeartbeatResponse {
    let result = coordinator(broker).heartbeat(
        request.group_id.as_str(),
        request.member_id.as_str(),
        request.group_instance_id.as_deref(),
        request.generation_id,
    );
    let mut response = HeartbeatResponse::default();
    response.error_code = result.err().map_or(0, GroupError::code);
    response
}

pub(super) fn leave_group(broker: &Arc<Broker>, request: LeaveGroupRequest, version: i16) -> LeaveGroupResponse {
    let members: Vec<(String, Option<String>)> = if version >= LEAVE_BATCH_VERSION {
        request
            .members
            .iter()
            .map(|m| (m.member_id.to_string(), m.group_instance_id.as_ref().map(|s| s.to_string())))
            .collect()
    } else {
        vec![(request.member_id.to_string(), None)]
    };
    let mut response = LeaveGroupResponse::default();
    let results = match coordinator(broker).leave(request.group_id.as_str(), &members) {
        Ok(results) => results,
        Err(error) => {
            response.error_code = error.code();
            return response;
        }
    };
    if version < LEAVE_BATCH_VERSION {
        response.error_code = results[0].err().map_or(0, GroupError::code);
        return response;
    }
    response.members = members
        .into_iter()
        .zip(results)
        .map(|((member_id, instance_id), result)| {
            let mut member = MemberResponse::default();
            member.member_id = text(&member_id);
            member.group_instance_id = instance_id.as_deref().map(text);
            member.error_code = result.err().map_or(0, GroupError::code);
            member
        })
        .collect();
    response
}

/// Per-partition validation of a commit: the topic partition must exist and the metadata
/// must fit.
fn check_commit(broker: &Broker, topic: &str, partition: i32, metadata: Option<&str>) -> Result<(), i16> {
    if broker.topics.get(topic).is_none_or(|t| partition < 0 || partition >= t.partitions) {
        return Err(ResponseError::UnknownTopicOrPartition.code());
    }
    if metadata.is_some_and(|m| m.len() > OFFSET_METADATA_BYTES_MAX) {
        return Err(ResponseError::OffsetMetadataTooLarge.code());
    }
    Ok(())
}

pub(super) fn offset_commit(
    broker: &Arc<Broker>,
    request: OffsetCommitRequest,
    version: i16,
) -> Pending<OffsetCommitResponse> {
    let coordinator = coordinator(broker);
    let now_ms = sluice_storage::now_ms();
    let mut response = OffsetCommitResponse::default();
    let mut commits = Vec::new();
    // (topic index, partition index) of each accepted commit, to fill in its result.
    let mut accepted = Vec::new();
    for (topic_index, topic) in request.topics.iter().enumerate() {
        let mut topic_response = OffsetCommitResponseTopic::default();
        topic_response.name = topic.name.clone();
        for (partition_index, partition) in topic.partitions.iter().enumerate() {
            let mut partition_response = OffsetCommitResponsePartition::default();
            partition_response.partition_index = partition.partition_index;
            let metadata = partition.committed_metadata.as_deref();
            match check_commit(broker, topic.name.as_str(), partition.partition_index, metadata) {
                Err(code) => partition_response.error_code = code,
                Ok(()) => {
                    let value = CommittedOffset {
                        offset: partition.committed_offset,
                        leader_epoch: partition.committed_leader_epoch,
                        metadata: metadata.map(str::to_string),
                        commit_timestamp_ms: now_ms,
                    };
                    commits.push((topic.name.to_string(), partition.partition_index, value));
                    accepted.push((topic_index, partition_index));
                }
            }
            topic_response.partitions.push(partition_response);
        }
        response.topics.push(topic_response);
    }
    let committer = Committer {
        member_id: request.member_id.as_str(),
        group_instance_id: request.group_instance_id.as_deref(),
        generation_id: request.generation_id_or_member_epoch,
        version,
    };
    let write = coordinator.commit_offsets(request.group_id.as_str(), committer, commits, broker.logs.syncer());
    Box::pin(async move {
        let result = match write {
            Ok(write) => write.await,
            Err(error) => Err(error),
        };
        if let Err(error) = result {
            for (topic_index, partition_index) in accepted {
                response.topics[topic_index].partitions[partition_index].error_code = error.code();
            }
        }
        response
    })
}

fn fetch_partition_default(partition: i32, value: Option<CommittedOffset>) -> (i32, i64, i32, Option<StrBytes>) {
    match value {
        Some(v) => (partition, v.offset, v.leader_epoch, Some(text(v.metadata.as_deref().unwrap_or_default()))),
        None => (partition, -1, -1, Some(StrBytes::default())),
    }
}

pub(super) fn offset_fetch(broker: &Arc<Broker>, request: OffsetFetchRequest, version: i16) -> OffsetFetchResponse {
    let coordinator = coordinator(broker);
    let mut response = OffsetFetchResponse::default();
    // KIP-447: a client that asks for stable offsets (read_committed consumers) is told to
    // retry while a transaction holds offsets for the partition that are not yet committed,
    // so it never resumes from an offset the transaction is about to move.
    let unstable = |group: &str, topic: &str, partition: i32| {
        request.require_stable && broker.groups.has_pending_txn_offsets(group, topic, partition)
    };
    if version < OFFSET_FETCH_GROUPS_VERSION {
        let query: OffsetQuery =
            request.topics.map(|ts| ts.into_iter().map(|t| (t.name.to_string(), t.partition_indexes)).collect());
        let fetched = validate_group_id(request.group_id.as_str())
            .and_then(|()| coordinator.fetch_offsets(request.group_id.as_str(), query));
        let fetched = match fetched {
            Ok(fetched) => fetched,
            Err(error) => {
                response.error_code = error.code();
                return response;
            }
        };
        for (topic, partitions) in fetched {
            let mut topic_response = OffsetFetchResponseTopic::default();
            topic_response.name = TopicName(text(&topic));
            for (partition, value) in partitions {
                let (index, offset, epoch, metadata) = fetch_partition_default(partition, value);
                let mut p = OffsetFetchResponsePartition::default();
                if unstable(request.group_id.as_str(), &topic, partition) {
                    p.error_code = ResponseError::UnstableOffsetCommit.code();
                }
                p.partition_index = index;
                p.committed_offset = offset;
                p.committed_leader_epoch = epoch;
                p.metadata = metadata;
                topic_response.partitions.push(p);
            }
            response.topics.push(topic_response);
        }
        return response;
    }
    for group in request.groups {
        let mut group_response = OffsetFetchResponseGroup::default();
        group_response.group_id = group.group_id.clone();
        let member_id = group.member_id.as_deref();
        let query: OffsetQuery =
            group.topics.map(|ts| ts.into_iter().map(|t| (t.name.to_string(), t.partition_indexes)).collect());
        let fetched = validate_group_id(group.group_id.as_str())
            .and_then(|()| coordinator.validate_offset_fetch(group.group_id.as_str(), member_id, group.member_epoch))
            .and_then(|()| coordinator.fetch_offsets(group.group_id.as_str(), query));
        let fetched = match fetched {
            Ok(fetched) => fetched,
            Err(error) => {
                group_response.error_code = error.code();
                response.groups.push(group_response);
                continue;
            }
        };
        for (topic, partitions) in fetched {
            let mut topic_response = OffsetFetchResponseTopics::default();
            topic_response.name = TopicName(text(&topic));
            for (partition, value) in partitions {
                let (index, offset, epoch, metadata) = fetch_partition_default(partition, value);
                let mut p = OffsetFetchResponsePartitions::default();
                if unstable(group.group_id.as_str(), &topic, partition) {
                    p.error_code = ResponseError::UnstableOffsetCommit.code();
                }
                p.partition_index = index;
                p.committed_offset = offset;
                p.committed_leader_epoch = epoch;
                p.metadata = metadata;
                topic_response.partitions.push(p);
            }
            group_response.topics.push(topic_response);
        }
        response.groups.push(group_response);
    }
    response
}

pub(super) fn offset_delete(broker: &Arc<Broker>, request: OffsetDeleteRequest) -> Pending<OffsetDeleteResponse> {
    let coordinator = coordinator(broker);
    let topics: Vec<(String, Vec<i32>)> = request
        .topics
        .iter()
        .map(|t| (t.name.to_string(), t.partitions.iter().map(|p| p.partition_index).collect()))
        .collect();
    let outcome = coordinator.delete_offsets(request.group_id.as_str(), topics, broker.logs.syncer());
    let mut response = OffsetDeleteResponse::default();
    let (results, write) = match outcome {
        Ok(pair) => pair,
        Err(error) => {
            response.error_code = error.code();
            return Box::pin(std::future::ready(response));
        }
    };
    Box::pin(async move {
        if let Err(error) = write.await {
            response.error_code = error.code();
            return response;
        }
        response.topics = results
            .into_iter()
            .map(|(topic, partitions)| {
                let mut topic_response = OffsetDeleteResponseTopic::default();
                topic_response.name = TopicName(text(&topic));
                topic_response.partitions = partitions
                    .into_iter()
                    .map(|(index, result)| {
                        let mut p = OffsetDeleteResponsePartition::default();
                        p.partition_index = index;
                        p.error_code = result.err().map_or(0, GroupError::code);
                        p
                    })
                    .collect();
                topic_response
            })
            .collect();
        response
    })
}

pub(super) fn list_groups(broker: &Arc<Broker>, request: ListGroupsRequest) -> ListGroupsResponse {
    let states: Vec<String> = request.states_filter.iter().map(|s| s.to_lowercase()).collect();
    let types: Vec<String> = request.types_filter.iter().map(|s| s.to_lowercase()).collect();
    let mut response = ListGroupsResponse::default();
    response.groups = coordinator(broker)
        .list_groups()
        .into_iter()
        .filter(|g| states.is_empty() || states.contains(&g.state.to_lowercase()))
        .filter(|g| types.is_empty() || types.iter().any(|t| t == g.group_type))
        .map(|g| {
            let mut listed = ListedGroup::default();
            listed.group_id = GroupId(text(&g.group_id));
            listed.protocol_type = text(&g.protocol_type);
            listed.group_state = text(g.state);
            listed.group_type = text(g.group_type);
            listed
        })
        .collect();
    // Share groups (KIP-932): Kafka lists them as type "Share", protocol type "share".
    // In a cluster each coordinator lists the groups it coordinates.
    let shares = broker.shares.list().into_iter().filter(|(group_id, _)| broker.groups.serving(group_id).is_ok());
    for (group_id, members) in shares {
        let state = if members == 0 { "Empty" } else { "Stable" };
        if (states.is_empty() || states.contains(&state.to_lowercase()))
            && (types.is_empty() || types.iter().any(|t| t == "share"))
        {
            let mut listed = ListedGroup::default();
            listed.group_id = GroupId(text(&group_id));
            listed.protocol_type = text("share");
            listed.group_state = text(state);
            listed.group_type = text("Share");
            response.groups.push(listed);
        }
    }
    response
}

pub(super) fn describe_groups(broker: &Arc<Broker>, request: DescribeGroupsRequest) -> DescribeGroupsResponse {
    let coordinator = coordinator(broker);
    let catalog = broker.topics.catalog();
    let mut response = DescribeGroupsResponse::default();
    for group_id in request.groups {
        let mut described = DescribedGroup::default();
        if let Err(error) = validate_group_id(group_id.as_str()).and_then(|()| coordinator.serving(group_id.as_str())) {
            described.group_id = group_id;
            described.error_code = error.code();
            response.groups.push(described);
            continue;
        }
        let description = coordinator.describe_group(group_id.as_str(), &catalog);
        described.group_id = group_id;
        described.group_state = text(description.state);
        described.protocol_type = text(&description.protocol_type);
        described.protocol_data = text(&description.protocol_name);
        described.members = description
            .members
            .into_iter()
            .map(|m| {
                let mut member = DescribedGroupMember::default();
                member.member_id = text(&m.member_id);
                member.group_instance_id = m.group_instance_id.as_deref().map(text);
                member.client_id = text(&m.client_id);
                member.client_host = text(&m.client_host);
                member.member_metadata = m.metadata;
                member.member_assignment = m.assignment;
                member
            })
            .collect();
        response.groups.push(described);
    }
    response
}

pub(super) fn delete_groups(broker: &Arc<Broker>, request: DeleteGroupsRequest) -> Pending<DeleteGroupsResponse> {
    let coordinator = coordinator(broker);
    // A share group is deleted by the share coordinator (its share-partitions' state).
    let writes: Vec<_> = request
        .groups_names
        .into_iter()
        .map(|group_id| match broker.shares.describe(group_id.as_str()) {
            Some(_) => (group_id, None),
            None => {
                let write = coordinator.delete_group(group_id.as_str(), broker.logs.syncer());
                (group_id, Some(write))
            }
        })
        .collect();
    let broker = broker.clone();
    Box::pin(async move {
        let mut response = DeleteGroupsResponse::default();
        for (group_id, write) in writes {
            let code = match write {
                None => super::share::delete_group(&broker, group_id.as_str()).await.err().map_or(0, |e| e.code()),
                Some(Ok(write)) => write.await.err().map_or(0, GroupError::code),
                Some(Err(error)) => error.code(),
            };
            let mut deleted = DeletableGroupResult::default();
            deleted.group_id = group_id;
            deleted.error_code = code;
            response.results.push(deleted);
        }
        response
    })
}
