//! The checks made before a handler runs: each refuses its request outright (the group,
//! transactional id or cluster may not be used) or takes out the resources the client may
//! not touch, recording them in [`Denied`] for the response check to put back.

use kafka_protocol::messages::offset_commit_response::{OffsetCommitResponsePartition, OffsetCommitResponseTopic};
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::write_txn_markers_response::{
    WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult,
};
use kafka_protocol::messages::*;
use kafka_protocol::ResponseError;
use sluice_security::acl;

use super::{config_access, error_message, Access, Denied};
use sluice_coordinator::share::dead_letter::CONFIG_DEAD_LETTER_TOPIC;

/// FindCoordinator key types.
const KEY_TYPE_GROUP: i8 = 0;
const KEY_TYPE_TRANSACTION: i8 = 1;
/// IncrementalAlterConfigs' SET operation.
const CONFIG_OPERATION_SET: i8 = 0;
/// Where a record batch keeps its attributes, and the attribute of transactional batches.
const BATCH_ATTRIBUTES_OFFSET: usize = 21;
const BATCH_ATTRIBUTE_TRANSACTIONAL: i16 = 0x10;

type Checked = Result<RequestKind, Box<ResponseKind>>;

/// The whole answer to a refused request.
fn refused(answer: ResponseKind) -> Checked {
    Err(Box::new(answer))
}

/// Serves the request as it is (the response check does the work).
pub(super) fn unchanged(_: &Access<'_>, body: RequestKind, _: &mut Denied) -> Checked {
    Ok(body)
}

/// Keeps the items `allowed` admits, recording the others as denied topics.
fn retain_topics<T>(
    items: &mut Vec<T>,
    denied: &mut Denied,
    mut allowed: impl FnMut(&T) -> Result<(), (String, Vec<i32>)>,
) {
    items.retain(|item| match allowed(item) {
        Ok(()) => true,
        Err(topic) => {
            denied.topics.push(topic);
            false
        }
    });
}

/// Whether a partition's records are a transactional batch (Kafka looks at the first).
fn transactional(records: Option<&bytes::Bytes>) -> bool {
    let attributes = records.and_then(|r| r.get(BATCH_ATTRIBUTES_OFFSET..BATCH_ATTRIBUTES_OFFSET + 2));
    attributes.is_some_and(|a| i16::from_be_bytes([a[0], a[1]]) & BATCH_ATTRIBUTE_TRANSACTIONAL != 0)
}

/// Transactional records need WRITE on their transactional id; refused, every partition
/// answers TRANSACTIONAL_ID_AUTHORIZATION_FAILED.
pub(super) fn produce(access: &Access<'_>, body: RequestKind, _: &mut Denied) -> Checked {
    let RequestKind::Produce(request) = body else { return Ok(body) };
    let has_transactional =
        request.topic_data.iter().flat_map(|t| &t.partition_data).any(|p| transactional(p.records.as_ref()));
    let allowed = match &request.transactional_id {
        Some(id) => access.transactional_id(acl::OP_WRITE, id),
        None => !has_transactional,
    };
    if allowed {
        return Ok(RequestKind::Produce(request));
    }
    let mut response = ProduceResponse::default();
    for topic in &request.topic_data {
        let mut answer = TopicProduceResponse::default();
        answer.name = topic.name.clone();
        for partition in &topic.partition_data {
            let mut result = PartitionProduceResponse::default();
            result.index = partition.index;
            result.error_code = ResponseError::TransactionalIdAuthorizationFailed.code();
            result.base_offset = -1;
            result.log_append_time_ms = -1;
            result.log_start_offset = -1;
            answer.partition_responses.push(result);
        }
        response.responses.push(answer);
    }
    refused(ResponseKind::Produce(response))
}

pub(super) fn metadata(access: &Access<'_>, body: RequestKind, denied: &mut Denied) -> Checked {
    let RequestKind::Metadata(mut request) = body else { return Ok(body) };
    denied.all_topics = request.topics.is_none();
    if request.allow_auto_topic_creation && !access.cluster(acl::OP_CREATE) {
        let missing_and_not_creatable = request.topics.iter().flatten().any(|t| {
            t.name
                .as_ref()
                .is_some_and(|name| access.broker.topics.get(name).is_none() && !access.topic(acl::OP_CREATE, name))
        });
        if missing_and_not_creatable {
            request.allow_auto_topic_creation = false;
        }
    }
    Ok(RequestKind::Metadata(request))
}

pub(super) fn create_topics(access: &Access<'_>, body: RequestKind, denied: &mut Denied) -> Checked {
    let RequestKind::CreateTopics(mut request) = body else { return Ok(body) };
    if !access.cluster(acl::OP_CREATE) {
        retain_topics(&mut request.topics, denied, |t| {
            access.topic(acl::OP_CREATE, &t.name).then_some(()).ok_or((t.name.to_string(), Vec::new()))
        });
    }
    Ok(RequestKind::CreateTopics(request))
}

pub(super) fn delete_topics(access: &Access<'_>, body: RequestKind, denied: &mut Denied) -> Checked {
    let RequestKind::DeleteTopics(mut request) = body else { return Ok(body) };
    retain_topics(&mut request.topic_names, denied, |name| {
        access.topic(acl::OP_DELETE, name).then_some(()).ok_or((name.to_string(), Vec::new()))
    });
    retain_topics(&mut request.topics, denied, |t| {
        let name = match &t.name {
            Some(name) => name.to_string(),
            None => access.broker.topics.name_for_id(&t.topic_id).unwrap_or_default(),
        };
        let allowed = name.is_empty() || access.topic(acl::OP_DELETE, &name);
        allowed.then_some(()).ok_or((name, Vec::new()))
    });
    Ok(RequestKind::DeleteTopics(request))
}

pub(super) fn create_partitions(access: &Access<'_>, body: RequestKind, denied: &mut Denied) -> Checked {
    let RequestKind::CreatePartitions(mut request) = body else { return Ok(body) };
    retain_topics(&mut request.topics, denied, |t| {
        access.topic(acl::OP_ALTER, &t.name).then_some(()).ok_or((t.name.to_string(), Vec::new()))
    });
    Ok(RequestKind::CreatePartitions(request))
}

pub(super) fn delete_records(access: &Access<'_>, body: RequestKind, denied: &mut Denied) -> Checked {
    let RequestKind::DeleteRecords(mut request) = body else { return Ok(body) };
    retain_topics(&mut request.topics, denied, |t| {
        let partitions = t.partitions.iter().map(|p| p.partition_index).collect();
        access.topic(acl::OP_DELETE, &t.name).then_some(()).ok_or((t.name.to_string(), partitions))
    });
    Ok(RequestKind::DeleteRecords(request))
}

pub(super) fn offset_commit(access: &Access<'_>, body: RequestKind, denied: &mut Denied) -> Checked {
    let RequestKind::OffsetCommit(mut request) = body else { return Ok(body) };
    if !access.group(acl::OP_READ, &request.group_id) {
        let mut response = OffsetCommitResponse::default();
        for t in request.topics {
            let mut result = OffsetCommitResponseTopic::default();
            result.name = t.name;
            result.topic_id = t.topic_id;
            for p in t.partitions {
                let mut partition = OffsetCommitResponsePartition::default();
                partition.partition_index = p.partition_index;
                partition.error_code = ResponseError::GroupAuthorizationFailed.code();
                result.partitions.push(partition);
            }
            response.topics.push(result);
        }
        return refused(ResponseKind::OffsetCommit(response));
    }
    retain_topics(&mut request.topics, denied, |t| {
        let partitions = t.partitions.iter().map(|p| p.partition_index).collect();
        access.topic(acl::OP_READ, &t.name).then_some(()).ok_or((t.name.to_string(), partitions))
    });
    Ok(RequestKind::OffsetCommit(request))
}

pub(super) fn offset_delete(access: &Access<'_>, body: RequestKind, denied: &mut Denied) -> Checked {
    let RequestKind::OffsetDelete(mut request) = body else { return Ok(body) };
    if !access.group(acl::OP_DELETE, &request.group_id) {
        let code = ResponseError::GroupAuthorizationFailed.code();
        return refused(ResponseKind::OffsetDelete(OffsetDeleteResponse::default().with_error_code(code)));
    }
    retain_topics(&mut request.topics, denied, |t| {
        let partitions = t.partitions.iter().map(|p| p.partition_index).collect();
        access.topic(acl::OP_READ, &t.name).then_some(()).ok_or((t.name.to_string(), partitions))
    });
    Ok(RequestKind::OffsetDelete(request))
}

pub(super) fn offset_fetch(access: &Access<'_>, body: RequestKind, denied: &mut Denied) -> Checked {
    let RequestKind::OffsetFetch(request) = body else { return Ok(body) };
    if request.groups.is_empty() && !access.group(acl::OP_DESCRIBE, &request.group_id) {
        let code = ResponseError::GroupAuthorizationFailed.code();
        return refused(ResponseKind::OffsetFetch(OffsetFetchResponse::default().with_error_code(code)));
    }
    denied.all_topics = request.topics.is_none() && request.groups.iter().all(|g| g.topics.is_none());
    Ok(RequestKind::OffsetFetch(request))
}

/// The error for a coordinator key the client may not describe, if it may not.
pub(super) fn coordinator_key_refused(access: &Access<'_>, key_type: i8, key: &str) -> Option<ResponseError> {
    match key_type {
        KEY_TYPE_GROUP if !access.group(acl::OP_DESCRIBE, key) => Some(ResponseError::GroupAuthorizationFailed),
        KEY_TYPE_TRANSACTION if !access.transactional_id(acl::OP_DESCRIBE, key) => {
            Some(ResponseError::TransactionalIdAuthorizationFailed)
        }
        _ => None,
    }
}

/// v0-3 name one key at the top level, refused here; v4+ keys are answered per key after.
pub(super) fn find_coordinator(access: &Access<'_>, body: RequestKind, denied: &mut Denied) -> Checked {
    let RequestKind::FindCoordinator(request) = body else { return Ok(body) };
    denied.key_type = request.key_type;
    if !request.coordinator_keys.is_empty() {
        return Ok(RequestKind::FindCoordinator(request));
    }
    match coordinator_key_refused(access, request.key_type, &request.key) {
        None => Ok(RequestKind::FindCoordinator(request)),
        Some(error) => refused(ResponseKind::FindCoordinator(
            FindCoordinatorResponse::default()
                .with_error_code(error.code())
                .with_error_message(error_message(error))
                .with_node_id(BrokerId(-1))
                .with_port(-1),
        )),
    }
}

pub(super) fn delete_groups(access: &Access<'_>, body: RequestKind, denied: &mut Denied) -> Checked {
    let RequestKind::DeleteGroups(mut request) = body else { return Ok(body) };
    request.groups_names.retain(|name| {
        let allowed = access.group(acl::OP_DELETE, name);
        if !allowed {
            denied.groups.push(name.to_string());
        }
        allowed
    });
    Ok(RequestKind::DeleteGroups(request))
}

/// ALTER_CONFIGS on the resource, and WRITE on the dead-letter topic a group config names:
/// records a share group's members reject are copied there, so naming a topic is writing it.
fn may_alter_configs<'c>(
    access: &Access<'_>,
    resource_type: i8,
    name: &str,
    mut dead_letter_topics: impl Iterator<Item = &'c str>,
) -> Result<(), ResponseError> {
    config_access(access, acl::OP_ALTER_CONFIGS, resource_type, name)?;
    if resource_type != super::super::configs::RESOURCE_GROUP {
        return Ok(());
    }
    match dead_letter_topics.find(|topic| !access.topic(acl::OP_WRITE, topic)) {
        Some(_) => Err(ResponseError::TopicAuthorizationFailed),
        None => Ok(()),
    }
}

pub(super) fn alter_configs(access: &Access<'_>, body: RequestKind, denied: &mut Denied) -> Checked {
    let RequestKind::AlterConfigs(mut request) = body else { return Ok(body) };
    request.resources.retain(|r| {
        let dead_letter = r.configs.iter().filter(|c| c.name.as_str() == CONFIG_DEAD_LETTER_TOPIC);
        let targets = dead_letter.filter_map(|c| c.value.as_deref()).filter(|v| !v.is_empty());
        kept_if_alterable(access, denied, r.resource_type, &r.resource_name, targets)
    });
    Ok(RequestKind::AlterConfigs(request))
}

pub(super) fn incremental_alter_configs(access: &Access<'_>, body: RequestKind, denied: &mut Denied) -> Checked {
    let RequestKind::IncrementalAlterConfigs(mut request) = body else { return Ok(body) };
    request.resources.retain(|r| {
        let dead_letter = r
            .configs
            .iter()
            .filter(|c| c.name.as_str() == CONFIG_DEAD_LETTER_TOPIC && c.config_operation == CONFIG_OPERATION_SET);
        let targets = dead_letter.filter_map(|c| c.value.as_deref()).filter(|v| !v.is_empty());
        kept_if_alterable(access, denied, r.resource_type, &r.resource_name, targets)
    });
    Ok(RequestKind::IncrementalAlterConfigs(request))
}

/// Whether a resource of an (Incremental)AlterConfigs request stays in it; a refused one is
/// recorded in `denied` with its error.
fn kept_if_alterable<'a>(
    access: &Access<'_>,
    denied: &mut Denied,
    resource_type: i8,
    resource_name: &str,
    dead_letter_targets: impl Iterator<Item = &'a str>,
) -> bool {
    let check = may_alter_configs(access, resource_type, resource_name, dead_letter_targets);
    if let Err(error) = check {
        denied.resources.push((resource_type, resource_name.to_string(), error));
    }
    check.is_ok()
}

/// JoinGroup, SyncGroup, Heartbeat and LeaveGroup: READ on the group.
pub(super) fn classic_group(access: &Access<'_>, body: RequestKind, _: &mut Denied) -> Checked {
    let code = ResponseError::GroupAuthorizationFailed.code();
    match body {
        RequestKind::JoinGroup(r) if !access.group(acl::OP_READ, &r.group_id) => {
            refused(ResponseKind::JoinGroup(JoinGroupResponse::default().with_error_code(code)))
        }
        RequestKind::SyncGroup(r) if !access.group(acl::OP_READ, &r.group_id) => {
            refused(ResponseKind::SyncGroup(SyncGroupResponse::default().with_error_code(code)))
        }
        RequestKind::Heartbeat(r) if !access.group(acl::OP_READ, &r.group_id) => {
            refused(ResponseKind::Heartbeat(HeartbeatResponse::default().with_error_code(code)))
        }
        RequestKind::LeaveGroup(r) if !access.group(acl::OP_READ, &r.group_id) => {
            refused(ResponseKind::LeaveGroup(LeaveGroupResponse::default().with_error_code(code)))
        }
        allowed => Ok(allowed),
    }
}

/// A heartbeat's refusal: READ on the group, then DESCRIBE on every subscribed topic
/// (clients may not learn of topics they may not describe by subscribing to them).
fn heartbeat_refusal(
    access: &Access<'_>,
    group_id: &str,
    subscribed: Option<&Vec<TopicName>>,
) -> Option<(ResponseError, Option<kafka_protocol::protocol::StrBytes>)> {
    if !access.group(acl::OP_READ, group_id) {
        let error = ResponseError::GroupAuthorizationFailed;
        return Some((error, error_message(error)));
    }
    let refused: Vec<&str> =
        subscribed.into_iter().flatten().map(|t| t.as_str()).filter(|t| !access.topic(acl::OP_DESCRIBE, t)).collect();
    if refused.is_empty() {
        return None;
    }
    let text = format!("The group has subscribed topics which are not authorized: {}", refused.join(","));
    Some((ResponseError::TopicAuthorizationFailed, Some(super::super::str_bytes(&text))))
}

pub(super) fn consumer_group_heartbeat(access: &Access<'_>, body: RequestKind, _: &mut Denied) -> Checked {
    let RequestKind::ConsumerGroupHeartbeat(request) = body else { return Ok(body) };
    match heartbeat_refusal(access, &request.group_id, request.subscribed_topic_names.as_ref()) {
        None => Ok(RequestKind::ConsumerGroupHeartbeat(request)),
        Some((error, message)) => refused(ResponseKind::ConsumerGroupHeartbeat(
            ConsumerGroupHeartbeatResponse::default().with_error_code(error.code()).with_error_message(message),
        )),
    }
}

pub(super) fn share_group_heartbeat(access: &Access<'_>, body: RequestKind, _: &mut Denied) -> Checked {
    let RequestKind::ShareGroupHeartbeat(request) = body else { return Ok(body) };
    match heartbeat_refusal(access, &request.group_id, request.subscribed_topic_names.as_ref()) {
        None => Ok(RequestKind::ShareGroupHeartbeat(request)),
        Some((error, message)) => refused(ResponseKind::ShareGroupHeartbeat(
            ShareGroupHeartbeatResponse::default().with_error_code(error.code()).with_error_message(message),
        )),
    }
}

/// Groups the client may not describe are not described (answered GROUP_AUTHORIZATION_FAILED after).
pub(super) fn share_group_describe(access: &Access<'_>, body: RequestKind, denied: &mut Denied) -> Checked {
    let RequestKind::ShareGroupDescribe(mut request) = body else { return Ok(body) };
    request.group_ids.retain(|group_id| {
        let allowed = access.group(acl::OP_DESCRIBE, group_id);
        if !allowed {
            denied.groups.push(group_id.to_string());
        }
        allowed
    });
    Ok(RequestKind::ShareGroupDescribe(request))
}

pub(super) fn share_fetch(access: &Access<'_>, body: RequestKind, _: &mut Denied) -> Checked {
    let RequestKind::ShareFetch(request) = body else { return Ok(body) };
    if request.group_id.as_ref().is_some_and(|g| access.group(acl::OP_READ, g)) {
        return Ok(RequestKind::ShareFetch(request));
    }
    let code = ResponseError::GroupAuthorizationFailed.code();
    refused(ResponseKind::ShareFetch(ShareFetchResponse::default().with_error_code(code)))
}

pub(super) fn share_acknowledge(access: &Access<'_>, body: RequestKind, _: &mut Denied) -> Checked {
    let RequestKind::ShareAcknowledge(request) = body else { return Ok(body) };
    if request.group_id.as_ref().is_some_and(|g| access.group(acl::OP_READ, g)) {
        return Ok(RequestKind::ShareAcknowledge(request));
    }
    let code = ResponseError::GroupAuthorizationFailed.code();
    refused(ResponseKind::ShareAcknowledge(ShareAcknowledgeResponse::default().with_error_code(code)))
}

/// Groups the client may not describe are taken out; the response check answers them, and
/// the topics of each group it may not describe.
pub(super) fn describe_share_group_offsets(access: &Access<'_>, body: RequestKind, denied: &mut Denied) -> Checked {
    let RequestKind::DescribeShareGroupOffsets(mut request) = body else { return Ok(body) };
    request.groups.retain(|g| {
        if g.topics.is_none() {
            denied.all_topics_groups.push(g.group_id.to_string());
        }
        let allowed = access.group(acl::OP_DESCRIBE, &g.group_id);
        if !allowed {
            denied.groups.push(g.group_id.to_string());
        }
        allowed
    });
    Ok(RequestKind::DescribeShareGroupOffsets(request))
}

pub(super) fn alter_share_group_offsets(access: &Access<'_>, body: RequestKind, denied: &mut Denied) -> Checked {
    let RequestKind::AlterShareGroupOffsets(mut request) = body else { return Ok(body) };
    if !access.group(acl::OP_READ, &request.group_id) {
        let error = ResponseError::GroupAuthorizationFailed;
        let response = AlterShareGroupOffsetsResponse::default()
            .with_error_code(error.code())
            .with_error_message(error_message(error));
        return refused(ResponseKind::AlterShareGroupOffsets(response));
    }
    retain_topics(&mut request.topics, denied, |t| {
        let partitions = t.partitions.iter().map(|p| p.partition_index).collect();
        access.topic(acl::OP_READ, &t.topic_name).then_some(()).ok_or((t.topic_name.to_string(), partitions))
    });
    Ok(RequestKind::AlterShareGroupOffsets(request))
}

pub(super) fn delete_share_group_offsets(access: &Access<'_>, body: RequestKind, denied: &mut Denied) -> Checked {
    let RequestKind::DeleteShareGroupOffsets(mut request) = body else { return Ok(body) };
    if !access.group(acl::OP_DELETE, &request.group_id) {
        let error = ResponseError::GroupAuthorizationFailed;
        let response = DeleteShareGroupOffsetsResponse::default()
            .with_error_code(error.code())
            .with_error_message(error_message(error));
        return refused(ResponseKind::DeleteShareGroupOffsets(response));
    }
    retain_topics(&mut request.topics, denied, |t| {
        access.topic(acl::OP_READ, &t.topic_name).then_some(()).ok_or((t.topic_name.to_string(), Vec::new()))
    });
    Ok(RequestKind::DeleteShareGroupOffsets(request))
}

/// Without a transactional id: IDEMPOTENT_WRITE on the cluster or WRITE on some topic
/// (Kafka 3.0+); with one, the handler checks WRITE on it.
pub(super) fn init_producer_id(access: &Access<'_>, body: RequestKind, _: &mut Denied) -> Checked {
    let RequestKind::InitProducerId(request) = body else { return Ok(body) };
    let idempotent = request.transactional_id.is_none();
    if !idempotent || access.cluster(acl::OP_IDEMPOTENT_WRITE) || access.broker.may_write_some_topic(access.session) {
        return Ok(RequestKind::InitProducerId(request));
    }
    let code = ResponseError::ClusterAuthorizationFailed.code();
    refused(ResponseKind::InitProducerId(InitProducerIdResponse::default().with_error_code(code)))
}

pub(super) fn refuse_envelope(_body: RequestKind, error: ResponseError) -> ResponseKind {
    ResponseKind::Envelope(kafka_protocol::messages::EnvelopeResponse::default().with_error_code(error.code()))
}

pub(super) fn refuse_write_txn_markers(body: RequestKind, error: ResponseError) -> ResponseKind {
    let mut response = WriteTxnMarkersResponse::default();
    let RequestKind::WriteTxnMarkers(request) = body else { return ResponseKind::WriteTxnMarkers(response) };
    for marker in request.markers {
        let mut result = WritableTxnMarkerResult::default();
        result.producer_id = marker.producer_id;
        for topic in marker.topics {
            let mut answer = WritableTxnMarkerTopicResult::default();
            answer.name = topic.name;
            answer.partitions = topic
                .partition_indexes
                .into_iter()
                .map(|index| {
                    WritableTxnMarkerPartitionResult::default()
                        .with_partition_index(index)
                        .with_error_code(error.code())
                })
                .collect();
            result.topics.push(answer);
        }
        response.markers.push(result);
    }
    ResponseKind::WriteTxnMarkers(response)
}

pub(super) fn refuse_describe_log_dirs(_: RequestKind, error: ResponseError) -> ResponseKind {
    ResponseKind::DescribeLogDirs(DescribeLogDirsResponse::default().with_error_code(error.code()))
}

pub(super) fn refuse_alter_reassignments(_: RequestKind, error: ResponseError) -> ResponseKind {
    let response = AlterPartitionReassignmentsResponse::default()
        .with_error_code(error.code())
        .with_error_message(error_message(error));
    ResponseKind::AlterPartitionReassignments(response)
}

pub(super) fn refuse_describe_quorum(_: RequestKind, error: ResponseError) -> ResponseKind {
    let response =
        DescribeQuorumResponse::default().with_error_code(error.code()).with_error_message(error_message(error));
    ResponseKind::DescribeQuorum(response)
}

pub(super) fn refuse_add_raft_voter(_: RequestKind, error: ResponseError) -> ResponseKind {
    let response =
        AddRaftVoterResponse::default().with_error_code(error.code()).with_error_message(error_message(error));
    ResponseKind::AddRaftVoter(response)
}

pub(super) fn refuse_remove_raft_voter(_: RequestKind, error: ResponseError) -> ResponseKind {
    let response =
        RemoveRaftVoterResponse::default().with_error_code(error.code()).with_error_message(error_message(error));
    ResponseKind::RemoveRaftVoter(response)
}

pub(super) fn refuse_list_reassignments(_: RequestKind, error: ResponseError) -> ResponseKind {
    let response = ListPartitionReassignmentsResponse::default()
        .with_error_code(error.code())
        .with_error_message(error_message(error));
    ResponseKind::ListPartitionReassignments(response)
}

pub(super) fn refuse_describe_scram(_: RequestKind, error: ResponseError) -> ResponseKind {
    let response = DescribeUserScramCredentialsResponse::default()
        .with_error_code(error.code())
        .with_error_message(error_message(error));
    ResponseKind::DescribeUserScramCredentials(response)
}

/// One result per user the request names.
pub(super) fn refuse_alter_scram(body: RequestKind, error: ResponseError) -> ResponseKind {
    use kafka_protocol::messages::alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
    let mut response = AlterUserScramCredentialsResponse::default();
    let RequestKind::AlterUserScramCredentials(request) = body else {
        return ResponseKind::AlterUserScramCredentials(response);
    };
    let users = request.deletions.iter().map(|d| &d.name).chain(request.upsertions.iter().map(|u| &u.name));
    let mut seen = std::collections::BTreeSet::new();
    for user in users.filter(|user| seen.insert(user.to_string())) {
        let mut result = AlterUserScramCredentialsResult::default();
        result.user = user.clone();
        result.error_code = error.code();
        result.error_message = error_message(error);
        response.results.push(result);
    }
    ResponseKind::AlterUserScramCredentials(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transactional_batches_are_recognised_by_their_attributes() {
        let mut batch = vec![0u8; 61];
        assert!(!transactional(Some(&bytes::Bytes::from(batch.clone()))));
        batch[BATCH_ATTRIBUTES_OFFSET + 1] = BATCH_ATTRIBUTE_TRANSACTIONAL as u8;
        assert!(transactional(Some(&bytes::Bytes::from(batch))));
        assert!(!transactional(None));
        assert!(!transactional(Some(&bytes::Bytes::from_static(b"short"))));
    }
}
