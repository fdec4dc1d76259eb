//! ACL checks around the handlers, as Kafka's KafkaApis makes them, for every API but
//! Produce and Fetch (checked inside their handlers, per topic, on the hot path) and the
//! ACL APIs themselves.
//!
//! [`before`] refuses a request outright (one group or the cluster is not allowed) or takes
//! the resources the client may not touch out of a request that changes things; [`after`]
//! puts those back into the response with Kafka's authorization errors and masks what a
//! read-only request may not see (topics a client may not describe are left out of "all
//! topics" answers and answered with TOPIC_AUTHORIZATION_FAILED when named).
//! With no authorizer configured both are no-ops.
//!
//! [`fill_operations`] answers KIP-430's `include_*_authorized_operations`: the operations
//! the client may perform on each topic, group or the cluster, as a bit per ACL operation
//! code (all of a resource's operations when no authorizer is configured, as Kafka does).

use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::delete_records_response::{DeleteRecordsPartitionResult, DeleteRecordsTopicResult};
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::offset_commit_response::{OffsetCommitResponsePartition, OffsetCommitResponseTopic};
use kafka_protocol::messages::offset_delete_response::{OffsetDeleteResponsePartition, OffsetDeleteResponseTopic};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use super::Session;
use crate::security::acl::{self, RESOURCE_CLUSTER, RESOURCE_GROUP, RESOURCE_TOPIC};
use crate::Broker;

/// Config resource types (DescribeConfigs, AlterConfigs).
const CONFIG_RESOURCE_TOPIC: i8 = 2;

/// What [`before`] took out of a request, and what [`after`] must mask.
#[derive(Default)]
pub(super) struct Denied {
    /// Topics removed, with the partitions the request named.
    topics: Vec<(String, Vec<i32>)>,
    /// Groups removed.
    groups: Vec<String>,
    /// Config resources removed: (type, name, error).
    resources: Vec<(i8, String, ResponseError)>,
    /// The request asked for all topics (answers leave out what may not be described).
    all_topics: bool,
    /// FindCoordinator asked for group coordinators.
    group_keys: bool,
}

fn topic(broker: &Broker, session: &Session, operation: i8, name: &str) -> bool {
    broker.authorized(session, operation, RESOURCE_TOPIC, name)
}

fn group(broker: &Broker, session: &Session, operation: i8, name: &str) -> bool {
    broker.authorized(session, operation, RESOURCE_GROUP, name)
}

fn error_message(error: ResponseError) -> Option<StrBytes> {
    let text = match error {
        ResponseError::TopicAuthorizationFailed => "Topic authorization failed.",
        ResponseError::GroupAuthorizationFailed => "Group authorization failed.",
        _ => "Cluster authorization failed.",
    };
    Some(StrBytes::from_static_str(text))
}

/// Checks a request before it is served: `Err` is the whole answer.
pub(super) fn before(
    broker: &Broker,
    session: &Session,
    body: RequestKind,
) -> Result<(RequestKind, Denied), Box<ResponseKind>> {
    if broker.authorizer.is_none() {
        return Ok((body, Denied::default()));
    }
    let mut denied = Denied::default();
    let cluster = |operation| broker.authorized_on_cluster(session, operation);
    let refused_cluster = ResponseError::ClusterAuthorizationFailed.code();
    let refused_group = ResponseError::GroupAuthorizationFailed.code();
    let body = match body {
        RequestKind::Metadata(mut request) => {
            denied.all_topics = request.topics.is_none();
            if request.allow_auto_topic_creation && !cluster(acl::OP_CREATE) {
                let missing_and_not_creatable = request.topics.iter().flatten().any(|t| {
                    t.name.as_ref().is_some_and(|name| {
                        broker.topics.get(name).is_none() && !topic(broker, session, acl::OP_CREATE, name)
                    })
                });
                if missing_and_not_creatable {
                    request.allow_auto_topic_creation = false;
                }
            }
            RequestKind::Metadata(request)
        }
        RequestKind::CreateTopics(mut request) if !cluster(acl::OP_CREATE) => {
            request.topics.retain(|t| {
                let allowed = topic(broker, session, acl::OP_CREATE, &t.name);
                if !allowed {
                    denied.topics.push((t.name.to_string(), Vec::new()));
                }
                allowed
            });
            RequestKind::CreateTopics(request)
        }
        RequestKind::DeleteTopics(mut request) => {
            request.topic_names.retain(|name| {
                let allowed = topic(broker, session, acl::OP_DELETE, name);
                if !allowed {
                    denied.topics.push((name.to_string(), Vec::new()));
                }
                allowed
            });
            request.topics.retain(|t| {
                let name = match &t.name {
                    Some(name) => name.to_string(),
                    None => broker.topics.name_for_id(&t.topic_id).unwrap_or_default(),
                };
                let allowed = name.is_empty() || topic(broker, session, acl::OP_DELETE, &name);
                if !allowed {
                    denied.topics.push((name, Vec::new()));
                }
                allowed
            });
            RequestKind::DeleteTopics(request)
        }
        RequestKind::CreatePartitions(mut request) => {
            request.topics.retain(|t| {
                let allowed = topic(broker, session, acl::OP_ALTER, &t.name);
                if !allowed {
                    denied.topics.push((t.name.to_string(), Vec::new()));
                }
                allowed
            });
            RequestKind::CreatePartitions(request)
        }
        RequestKind::DeleteRecords(mut request) => {
            request.topics.retain(|t| {
                let allowed = topic(broker, session, acl::OP_DELETE, &t.name);
                if !allowed {
                    denied.topics.push((t.name.to_string(), t.partitions.iter().map(|p| p.partition_index).collect()));
                }
                allowed
            });
            RequestKind::DeleteRecords(request)
        }
        RequestKind::OffsetCommit(request) if !group(broker, session, acl::OP_READ, &request.group_id) => {
            let mut response = OffsetCommitResponse::default();
            for t in request.topics {
                let mut result = OffsetCommitResponseTopic::default();
                result.name = t.name;
                result.topic_id = t.topic_id;
                for p in t.partitions {
                    let mut partition = OffsetCommitResponsePartition::default();
                    partition.partition_index = p.partition_index;
                    partition.error_code = refused_group;
                    result.partitions.push(partition);
                }
                response.topics.push(result);
            }
            return Err(Box::new(ResponseKind::OffsetCommit(response)));
        }
        RequestKind::OffsetCommit(mut request) => {
            request.topics.retain(|t| {
                let allowed = topic(broker, session, acl::OP_READ, &t.name);
                if !allowed {
                    denied.topics.push((t.name.to_string(), t.partitions.iter().map(|p| p.partition_index).collect()));
                }
                allowed
            });
            RequestKind::OffsetCommit(request)
        }
        RequestKind::OffsetDelete(request) if !group(broker, session, acl::OP_DELETE, &request.group_id) => {
            return Err(Box::new(ResponseKind::OffsetDelete(
                OffsetDeleteResponse::default().with_error_code(refused_group),
            )));
        }
        RequestKind::OffsetDelete(mut request) => {
            request.topics.retain(|t| {
                let allowed = topic(broker, session, acl::OP_READ, &t.name);
                if !allowed {
                    denied.topics.push((t.name.to_string(), t.partitions.iter().map(|p| p.partition_index).collect()));
                }
                allowed
            });
            RequestKind::OffsetDelete(request)
        }
        RequestKind::OffsetFetch(request)
            if request.groups.is_empty() && !group(broker, session, acl::OP_DESCRIBE, &request.group_id) =>
        {
            return Err(Box::new(ResponseKind::OffsetFetch(
                OffsetFetchResponse::default().with_error_code(refused_group),
            )));
        }
        RequestKind::FindCoordinator(request)
            if request.key_type == 0
                && request.coordinator_keys.is_empty()
                && !group(broker, session, acl::OP_DESCRIBE, &request.key) =>
        {
            let response = FindCoordinatorResponse::default()
                .with_error_code(refused_group)
                .with_error_message(error_message(ResponseError::GroupAuthorizationFailed))
                .with_node_id(BrokerId(-1))
                .with_port(-1);
            return Err(Box::new(ResponseKind::FindCoordinator(response)));
        }
        RequestKind::FindCoordinator(request) => {
            denied.group_keys = request.key_type == 0;
            RequestKind::FindCoordinator(request)
        }
        RequestKind::OffsetFetch(request) => {
            denied.all_topics = request.topics.is_none() && request.groups.iter().all(|g| g.topics.is_none());
            RequestKind::OffsetFetch(request)
        }
        RequestKind::DeleteGroups(mut request) => {
            request.groups_names.retain(|name| {
                let allowed = group(broker, session, acl::OP_DELETE, name);
                if !allowed {
                    denied.groups.push(name.to_string());
                }
                allowed
            });
            RequestKind::DeleteGroups(request)
        }
        RequestKind::AlterConfigs(mut request) => {
            request.resources.retain(|r| {
                let check = config_access(broker, session, acl::OP_ALTER_CONFIGS, r.resource_type, &r.resource_name);
                if let Err(error) = check {
                    denied.resources.push((r.resource_type, r.resource_name.to_string(), error));
                }
                check.is_ok()
            });
            RequestKind::AlterConfigs(request)
        }
        RequestKind::IncrementalAlterConfigs(mut request) => {
            request.resources.retain(|r| {
                let check = config_access(broker, session, acl::OP_ALTER_CONFIGS, r.resource_type, &r.resource_name);
                if let Err(error) = check {
                    denied.resources.push((r.resource_type, r.resource_name.to_string(), error));
                }
                check.is_ok()
            });
            RequestKind::IncrementalAlterConfigs(request)
        }
        RequestKind::JoinGroup(request) if !group(broker, session, acl::OP_READ, &request.group_id) => {
            return Err(Box::new(ResponseKind::JoinGroup(JoinGroupResponse::default().with_error_code(refused_group))));
        }
        RequestKind::SyncGroup(request) if !group(broker, session, acl::OP_READ, &request.group_id) => {
            return Err(Box::new(ResponseKind::SyncGroup(SyncGroupResponse::default().with_error_code(refused_group))));
        }
        RequestKind::Heartbeat(request) if !group(broker, session, acl::OP_READ, &request.group_id) => {
            return Err(Box::new(ResponseKind::Heartbeat(HeartbeatResponse::default().with_error_code(refused_group))));
        }
        RequestKind::LeaveGroup(request) if !group(broker, session, acl::OP_READ, &request.group_id) => {
            return Err(Box::new(ResponseKind::LeaveGroup(
                LeaveGroupResponse::default().with_error_code(refused_group),
            )));
        }
        RequestKind::ConsumerGroupHeartbeat(request) if !group(broker, session, acl::OP_READ, &request.group_id) => {
            let response = ConsumerGroupHeartbeatResponse::default()
                .with_error_code(refused_group)
                .with_error_message(error_message(ResponseError::GroupAuthorizationFailed));
            return Err(Box::new(ResponseKind::ConsumerGroupHeartbeat(response)));
        }
        RequestKind::ShareGroupHeartbeat(request) if !group(broker, session, acl::OP_READ, &request.group_id) => {
            let response = ShareGroupHeartbeatResponse::default()
                .with_error_code(refused_group)
                .with_error_message(error_message(ResponseError::GroupAuthorizationFailed));
            return Err(Box::new(ResponseKind::ShareGroupHeartbeat(response)));
        }
        RequestKind::ShareFetch(request)
            if !request.group_id.as_ref().is_some_and(|g| group(broker, session, acl::OP_READ, g)) =>
        {
            return Err(Box::new(ResponseKind::ShareFetch(
                ShareFetchResponse::default().with_error_code(refused_group),
            )));
        }
        RequestKind::ShareAcknowledge(request)
            if !request.group_id.as_ref().is_some_and(|g| group(broker, session, acl::OP_READ, g)) =>
        {
            let response = ShareAcknowledgeResponse::default().with_error_code(refused_group);
            return Err(Box::new(ResponseKind::ShareAcknowledge(response)));
        }
        RequestKind::AlterShareGroupOffsets(request) if !group(broker, session, acl::OP_READ, &request.group_id) => {
            let response = kafka_protocol::messages::AlterShareGroupOffsetsResponse::default()
                .with_error_code(refused_group)
                .with_error_message(error_message(ResponseError::GroupAuthorizationFailed));
            return Err(Box::new(ResponseKind::AlterShareGroupOffsets(response)));
        }
        RequestKind::DeleteShareGroupOffsets(request) if !group(broker, session, acl::OP_DELETE, &request.group_id) => {
            let response = kafka_protocol::messages::DeleteShareGroupOffsetsResponse::default()
                .with_error_code(refused_group)
                .with_error_message(error_message(ResponseError::GroupAuthorizationFailed));
            return Err(Box::new(ResponseKind::DeleteShareGroupOffsets(response)));
        }
        RequestKind::DescribeShareGroupOffsets(request) => {
            let refused = request.groups.iter().any(|g| !group(broker, session, acl::OP_DESCRIBE, &g.group_id));
            if refused {
                let mut response = DescribeShareGroupOffsetsResponse::default();
                for g in &request.groups {
                    let mut answer =
                        kafka_protocol::messages::describe_share_group_offsets_response::DescribeShareGroupOffsetsResponseGroup::default();
                    answer.group_id = g.group_id.clone();
                    answer.error_code = refused_group;
                    response.groups.push(answer);
                }
                return Err(Box::new(ResponseKind::DescribeShareGroupOffsets(response)));
            }
            RequestKind::DescribeShareGroupOffsets(request)
        }
        RequestKind::DescribeLogDirs(_) if !cluster(acl::OP_DESCRIBE) => {
            return Err(Box::new(ResponseKind::DescribeLogDirs(
                DescribeLogDirsResponse::default().with_error_code(refused_cluster),
            )));
        }
        RequestKind::ListPartitionReassignments(_) if !cluster(acl::OP_DESCRIBE) => {
            let response = ListPartitionReassignmentsResponse::default()
                .with_error_code(refused_cluster)
                .with_error_message(error_message(ResponseError::ClusterAuthorizationFailed));
            return Err(Box::new(ResponseKind::ListPartitionReassignments(response)));
        }
        RequestKind::AlterPartitionReassignments(_) if !cluster(acl::OP_ALTER) => {
            let response = AlterPartitionReassignmentsResponse::default()
                .with_error_code(refused_cluster)
                .with_error_message(error_message(ResponseError::ClusterAuthorizationFailed));
            return Err(Box::new(ResponseKind::AlterPartitionReassignments(response)));
        }
        RequestKind::DescribeUserScramCredentials(_) if !cluster(acl::OP_DESCRIBE) => {
            let response = DescribeUserScramCredentialsResponse::default()
                .with_error_code(refused_cluster)
                .with_error_message(error_message(ResponseError::ClusterAuthorizationFailed));
            return Err(Box::new(ResponseKind::DescribeUserScramCredentials(response)));
        }
        RequestKind::AlterUserScramCredentials(request) if !cluster(acl::OP_ALTER) => {
            let mut response = AlterUserScramCredentialsResponse::default();
            let users = request.deletions.iter().map(|d| &d.name).chain(request.upsertions.iter().map(|u| &u.name));
            let mut seen = std::collections::BTreeSet::new();
            for user in users.filter(|user| seen.insert(user.to_string())) {
                let mut result = alter_user_scram_credentials_response::AlterUserScramCredentialsResult::default();
                result.user = user.clone();
                result.error_code = refused_cluster;
                result.error_message = error_message(ResponseError::ClusterAuthorizationFailed);
                response.results.push(result);
            }
            return Err(Box::new(ResponseKind::AlterUserScramCredentials(response)));
        }
        RequestKind::InitProducerId(request)
            if request.transactional_id.is_none()
                && !cluster(acl::OP_IDEMPOTENT_WRITE)
                && !broker.may_write_some_topic(session) =>
        {
            return Err(Box::new(ResponseKind::InitProducerId(
                InitProducerIdResponse::default().with_error_code(refused_cluster),
            )));
        }
        other => other,
    };
    Ok((body, denied))
}

/// Whether the client may do `operation` on a config resource; the error if not.
fn config_access(
    broker: &Broker,
    session: &Session,
    operation: i8,
    resource_type: i8,
    name: &str,
) -> Result<(), ResponseError> {
    if resource_type == CONFIG_RESOURCE_TOPIC {
        topic(broker, session, operation, name).then_some(()).ok_or(ResponseError::TopicAuthorizationFailed)
    } else if resource_type == super::configs::RESOURCE_GROUP {
        group(broker, session, operation, name).then_some(()).ok_or(ResponseError::GroupAuthorizationFailed)
    } else {
        broker.authorized_on_cluster(session, operation).then_some(()).ok_or(ResponseError::ClusterAuthorizationFailed)
    }
}

/// Completes a response: adds the refused resources back and masks what may not be seen.
pub(super) fn after(broker: &Broker, session: &Session, denied: Denied, response: &mut ResponseKind) {
    if broker.authorizer.is_none() {
        return;
    }
    let topic_refused = ResponseError::TopicAuthorizationFailed.code();
    let group_refused = ResponseError::GroupAuthorizationFailed.code();
    match response {
        ResponseKind::Metadata(response) => {
            response.topics.retain_mut(|t| {
                let name = t.name.as_ref().map(|n| n.to_string()).unwrap_or_default();
                if topic(broker, session, acl::OP_DESCRIBE, &name) {
                    return true;
                }
                t.error_code = topic_refused;
                t.partitions.clear();
                t.is_internal = false;
                !denied.all_topics
            });
        }
        ResponseKind::CreateTopics(response) => {
            for (name, _) in denied.topics {
                let mut result = CreatableTopicResult::default();
                result.name = TopicName(StrBytes::from_string(name));
                result.error_code = topic_refused;
                result.error_message = error_message(ResponseError::TopicAuthorizationFailed);
                result.num_partitions = -1;
                result.replication_factor = -1;
                response.topics.push(result);
            }
        }
        ResponseKind::DeleteTopics(response) => {
            for (name, _) in denied.topics {
                let mut result = DeletableTopicResult::default();
                result.name = Some(TopicName(StrBytes::from_string(name)));
                result.error_code = topic_refused;
                response.responses.push(result);
            }
        }
        ResponseKind::CreatePartitions(response) => {
            for (name, _) in denied.topics {
                let mut result = CreatePartitionsTopicResult::default();
                result.name = TopicName(StrBytes::from_string(name));
                result.error_code = topic_refused;
                result.error_message = error_message(ResponseError::TopicAuthorizationFailed);
                response.results.push(result);
            }
        }
        ResponseKind::DeleteRecords(response) => {
            for (name, partitions) in denied.topics {
                let mut result = DeleteRecordsTopicResult::default();
                result.name = TopicName(StrBytes::from_string(name));
                for index in partitions {
                    let mut partition = DeleteRecordsPartitionResult::default();
                    partition.partition_index = index;
                    partition.low_watermark = -1;
                    partition.error_code = topic_refused;
                    result.partitions.push(partition);
                }
                response.topics.push(result);
            }
        }
        ResponseKind::OffsetCommit(response) => {
            for (name, partitions) in denied.topics {
                let mut result = OffsetCommitResponseTopic::default();
                result.name = TopicName(StrBytes::from_string(name));
                for index in partitions {
                    let mut partition = OffsetCommitResponsePartition::default();
                    partition.partition_index = index;
                    partition.error_code = topic_refused;
                    result.partitions.push(partition);
                }
                response.topics.push(result);
            }
        }
        ResponseKind::OffsetDelete(response) => {
            for (name, partitions) in denied.topics {
                let mut result = OffsetDeleteResponseTopic::default();
                result.name = TopicName(StrBytes::from_string(name));
                for index in partitions {
                    let mut partition = OffsetDeleteResponsePartition::default();
                    partition.partition_index = index;
                    partition.error_code = topic_refused;
                    result.partitions.push(partition);
                }
                response.topics.push(result);
            }
        }
        ResponseKind::ListOffsets(response) => {
            for t in &mut response.topics {
                if !topic(broker, session, acl::OP_DESCRIBE, &t.name) {
                    for partition in &mut t.partitions {
                        partition.error_code = topic_refused;
                        partition.offset = -1;
                        partition.timestamp = -1;
                    }
                }
            }
        }
        ResponseKind::OffsetFetch(response) => {
            // v0-7 answer one group at the top level; v8+ answer per group.
            if !response.topics.is_empty() || response.groups.is_empty() {
                mask_offset_fetch_topics(broker, session, &mut response.topics, denied.all_topics);
            }
            for g in &mut response.groups {
                if !group(broker, session, acl::OP_DESCRIBE, &g.group_id) {
                    g.error_code = group_refused;
                    g.topics.clear();
                    continue;
                }
                g.topics.retain_mut(|t| {
                    if topic(broker, session, acl::OP_DESCRIBE, &t.name) {
                        return true;
                    }
                    for partition in &mut t.partitions {
                        partition.error_code = topic_refused;
                        partition.committed_offset = -1;
                    }
                    !denied.all_topics
                });
            }
        }
        ResponseKind::DescribeGroups(response) => {
            for g in &mut response.groups {
                if !group(broker, session, acl::OP_DESCRIBE, &g.group_id) {
                    let group_id = g.group_id.clone();
                    *g = describe_groups_response::DescribedGroup::default();
                    g.group_id = group_id;
                    g.error_code = group_refused;
                }
            }
        }
        ResponseKind::ConsumerGroupDescribe(response) => {
            for g in &mut response.groups {
                if !group(broker, session, acl::OP_DESCRIBE, &g.group_id) {
                    let group_id = g.group_id.clone();
                    *g = consumer_group_describe_response::DescribedGroup::default();
                    g.group_id = group_id;
                    g.error_code = group_refused;
                    g.error_message = error_message(ResponseError::GroupAuthorizationFailed);
                }
            }
        }
        ResponseKind::DeleteGroups(response) => {
            for name in denied.groups {
                let mut result = DeletableGroupResult::default();
                result.group_id = GroupId(StrBytes::from_string(name));
                result.error_code = group_refused;
                response.results.push(result);
            }
        }
        ResponseKind::ListGroups(response) if !broker.authorized_on_cluster(session, acl::OP_DESCRIBE) => {
            response.groups.retain(|g| group(broker, session, acl::OP_DESCRIBE, &g.group_id));
        }
        ResponseKind::FindCoordinator(response) => {
            // v0-3 (one key at the top level) are refused in `before`; v4+ per key here.
            for c in response.coordinators.iter_mut().filter(|_| denied.group_keys) {
                if !group(broker, session, acl::OP_DESCRIBE, &c.key) {
                    c.error_code = group_refused;
                    c.error_message = error_message(ResponseError::GroupAuthorizationFailed);
                    c.node_id = BrokerId(-1);
                    c.host = StrBytes::default();
                    c.port = -1;
                }
            }
        }
        ResponseKind::DescribeConfigs(response) => {
            for r in &mut response.results {
                if let Err(error) =
                    config_access(broker, session, acl::OP_DESCRIBE_CONFIGS, r.resource_type, &r.resource_name)
                {
                    r.error_code = error.code();
                    r.error_message = error_message(error);
                    r.configs.clear();
                }
            }
        }
        ResponseKind::AlterConfigs(response) => {
            for (resource_type, name, error) in denied.resources {
                let mut result = alter_configs_response::AlterConfigsResourceResponse::default();
                result.resource_type = resource_type;
                result.resource_name = StrBytes::from_string(name);
                result.error_code = error.code();
                result.error_message = error_message(error);
                response.responses.push(result);
            }
        }
        ResponseKind::IncrementalAlterConfigs(response) => {
            for (resource_type, name, error) in denied.resources {
                let mut result = incremental_alter_configs_response::AlterConfigsResourceResponse::default();
                result.resource_type = resource_type;
                result.resource_name = StrBytes::from_string(name);
                result.error_code = error.code();
                result.error_message = error_message(error);
                response.responses.push(result);
            }
        }
        _ => {}
    }
}

fn mask_offset_fetch_topics(
    broker: &Broker,
    session: &Session,
    topics: &mut Vec<offset_fetch_response::OffsetFetchResponseTopic>,
    all_topics: bool,
) {
    topics.retain_mut(|t| {
        if topic(broker, session, acl::OP_DESCRIBE, &t.name) {
            return true;
        }
        for partition in &mut t.partitions {
            partition.error_code = ResponseError::TopicAuthorizationFailed.code();
            partition.committed_offset = -1;
        }
        !all_topics
    });
}

/// Operations Kafka reports per resource type (AclEntry.supportedOperations), without the
/// delegation-token ones Sluice does not issue.
const TOPIC_OPERATIONS: [i8; 8] = [
    acl::OP_READ,
    acl::OP_WRITE,
    acl::OP_CREATE,
    acl::OP_DELETE,
    acl::OP_ALTER,
    acl::OP_DESCRIBE,
    acl::OP_DESCRIBE_CONFIGS,
    acl::OP_ALTER_CONFIGS,
];
const GROUP_OPERATIONS: [i8; 3] = [acl::OP_READ, acl::OP_DELETE, acl::OP_DESCRIBE];
const CLUSTER_OPERATIONS: [i8; 7] = [
    acl::OP_CREATE,
    acl::OP_ALTER,
    acl::OP_DESCRIBE,
    acl::OP_CLUSTER_ACTION,
    acl::OP_DESCRIBE_CONFIGS,
    acl::OP_ALTER_CONFIGS,
    acl::OP_IDEMPOTENT_WRITE,
];

/// The `authorized_operations` a request asked for.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct OperationsWanted {
    topics: bool,
    groups: bool,
    cluster: bool,
}

impl OperationsWanted {
    pub(super) fn of(request: &RequestKind) -> OperationsWanted {
        match request {
            RequestKind::Metadata(r) => OperationsWanted {
                topics: r.include_topic_authorized_operations,
                cluster: r.include_cluster_authorized_operations,
                ..Default::default()
            },
            RequestKind::DescribeCluster(r) => {
                OperationsWanted { cluster: r.include_cluster_authorized_operations, ..Default::default() }
            }
            RequestKind::DescribeGroups(r) => {
                OperationsWanted { groups: r.include_authorized_operations, ..Default::default() }
            }
            RequestKind::ConsumerGroupDescribe(r) => {
                OperationsWanted { groups: r.include_authorized_operations, ..Default::default() }
            }
            _ => OperationsWanted::default(),
        }
    }
}

/// The operations of `supported` the client may perform on the resource, one bit each.
fn operations(broker: &Broker, session: &Session, resource_type: i8, name: &str, supported: &[i8]) -> i32 {
    supported
        .iter()
        .filter(|&&operation| broker.authorized(session, operation, resource_type, name))
        .fold(0, |bits, &operation| bits | (1 << operation))
}

/// Fills the `authorized_operations` fields the request asked for (fields not asked for
/// keep Kafka's "omitted", i32::MIN).
pub(super) fn fill_operations(
    broker: &Broker,
    session: &Session,
    wanted: OperationsWanted,
    response: &mut ResponseKind,
) {
    let cluster = || operations(broker, session, RESOURCE_CLUSTER, acl::CLUSTER_RESOURCE_NAME, &CLUSTER_OPERATIONS);
    match response {
        ResponseKind::Metadata(response) => {
            if wanted.topics {
                for t in response.topics.iter_mut().filter(|t| t.error_code == 0) {
                    let name = t.name.as_ref().map(|n| n.to_string()).unwrap_or_default();
                    t.topic_authorized_operations =
                        operations(broker, session, RESOURCE_TOPIC, &name, &TOPIC_OPERATIONS);
                }
            }
            if wanted.cluster {
                response.cluster_authorized_operations = cluster();
            }
        }
        ResponseKind::DescribeCluster(response) if wanted.cluster && response.error_code == 0 => {
            response.cluster_authorized_operations = cluster();
        }
        ResponseKind::DescribeGroups(response) if wanted.groups => {
            for g in response.groups.iter_mut().filter(|g| g.error_code == 0) {
                g.authorized_operations = operations(broker, session, RESOURCE_GROUP, &g.group_id, &GROUP_OPERATIONS);
            }
        }
        ResponseKind::ConsumerGroupDescribe(response) if wanted.groups => {
            for g in response.groups.iter_mut().filter(|g| g.error_code == 0) {
                g.authorized_operations = operations(broker, session, RESOURCE_GROUP, &g.group_id, &GROUP_OPERATIONS);
            }
        }
        _ => {}
    }
}
