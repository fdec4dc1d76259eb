//! The checks made on a handler's response: what the request check took out comes back
//! with Kafka's authorization errors, and what a read-only request may not see is masked
//! (topics a client may not describe are left out of "all topics" answers and answered with
//! TOPIC_AUTHORIZATION_FAILED when named).

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
use sluice_security::acl;

use super::{config_access, error_message, requests, Access, Denied};

fn topic_refused() -> i16 {
    ResponseError::TopicAuthorizationFailed.code()
}

fn group_refused() -> i16 {
    ResponseError::GroupAuthorizationFailed.code()
}

fn name(text: &str) -> TopicName {
    TopicName(StrBytes::from_string(text.to_string()))
}

/// The response as the handler made it.
pub(super) fn unchanged(_: &Access<'_>, _: &Denied, _: &mut ResponseKind) {}

pub(super) fn metadata(access: &Access<'_>, denied: &Denied, response: &mut ResponseKind) {
    let ResponseKind::Metadata(response) = response else { return };
    response.topics.retain_mut(|t| {
        let topic = t.name.as_ref().map(|n| n.to_string()).unwrap_or_default();
        if access.topic(acl::OP_DESCRIBE, &topic) {
            return true;
        }
        t.error_code = topic_refused();
        t.partitions.clear();
        t.is_internal = false;
        !denied.all_topics
    });
}

pub(super) fn create_topics(_: &Access<'_>, denied: &Denied, response: &mut ResponseKind) {
    let ResponseKind::CreateTopics(response) = response else { return };
    for (topic, _) in &denied.topics {
        let mut result = CreatableTopicResult::default();
        result.name = name(topic);
        result.error_code = topic_refused();
        result.error_message = error_message(ResponseError::TopicAuthorizationFailed);
        result.num_partitions = -1;
        result.replication_factor = -1;
        response.topics.push(result);
    }
}

pub(super) fn delete_topics(_: &Access<'_>, denied: &Denied, response: &mut ResponseKind) {
    let ResponseKind::DeleteTopics(response) = response else { return };
    for (topic, _) in &denied.topics {
        let mut result = DeletableTopicResult::default();
        result.name = Some(name(topic));
        result.error_code = topic_refused();
        response.responses.push(result);
    }
}

pub(super) fn create_partitions(_: &Access<'_>, denied: &Denied, response: &mut ResponseKind) {
    let ResponseKind::CreatePartitions(response) = response else { return };
    for (topic, _) in &denied.topics {
        let mut result = CreatePartitionsTopicResult::default();
        result.name = name(topic);
        result.error_code = topic_refused();
        result.error_message = error_message(ResponseError::TopicAuthorizationFailed);
        response.results.push(result);
    }
}

/// The topics the request check took out, each with its named partitions, as a response's
/// topic entries: `topic` makes an entry of a name and its partitions, `partition` a
/// partition's refusal.
fn refused_topics<T, P>(
    denied: &Denied,
    topic: impl Fn(TopicName, Vec<P>) -> T,
    partition: impl Fn(i32) -> P,
) -> Vec<T> {
    let entry = |(name_text, indexes): &(String, Vec<i32>)| {
        topic(name(name_text), indexes.iter().map(|&index| partition(index)).collect())
    };
    denied.topics.iter().map(entry).collect()
}

pub(super) fn delete_records(_: &Access<'_>, denied: &Denied, response: &mut ResponseKind) {
    let ResponseKind::DeleteRecords(response) = response else { return };
    response.topics.extend(refused_topics(
        denied,
        |name, partitions| DeleteRecordsTopicResult::default().with_name(name).with_partitions(partitions),
        |index| {
            DeleteRecordsPartitionResult::default()
                .with_partition_index(index)
                .with_low_watermark(-1)
                .with_error_code(topic_refused())
        },
    ));
}

pub(super) fn offset_commit(_: &Access<'_>, denied: &Denied, response: &mut ResponseKind) {
    let ResponseKind::OffsetCommit(response) = response else { return };
    response.topics.extend(refused_topics(
        denied,
        |name, partitions| OffsetCommitResponseTopic::default().with_name(name).with_partitions(partitions),
        |index| OffsetCommitResponsePartition::default().with_partition_index(index).with_error_code(topic_refused()),
    ));
}

pub(super) fn offset_delete(_: &Access<'_>, denied: &Denied, response: &mut ResponseKind) {
    let ResponseKind::OffsetDelete(response) = response else { return };
    response.topics.extend(refused_topics(
        denied,
        |name, partitions| OffsetDeleteResponseTopic::default().with_name(name).with_partitions(partitions),
        |index| OffsetDeleteResponsePartition::default().with_partition_index(index).with_error_code(topic_refused()),
    ));
}

pub(super) fn list_offsets(access: &Access<'_>, _: &Denied, response: &mut ResponseKind) {
    let ResponseKind::ListOffsets(response) = response else { return };
    for t in response.topics.iter_mut().filter(|t| !access.topic(acl::OP_DESCRIBE, &t.name)) {
        for partition in &mut t.partitions {
            partition.error_code = topic_refused();
            partition.offset = -1;
            partition.timestamp = -1;
        }
    }
}

pub(super) fn offset_fetch(access: &Access<'_>, denied: &Denied, response: &mut ResponseKind) {
    let ResponseKind::OffsetFetch(response) = response else { return };
    // v0-7 answer one group at the top level; v8+ answer per group.
    if !response.topics.is_empty() || response.groups.is_empty() {
        response.topics.retain_mut(|t| {
            if access.topic(acl::OP_DESCRIBE, &t.name) {
                return true;
            }
            for partition in &mut t.partitions {
                partition.error_code = topic_refused();
                partition.committed_offset = -1;
            }
            !denied.all_topics
        });
    }
    for g in &mut response.groups {
        if !access.group(acl::OP_DESCRIBE, &g.group_id) {
            g.error_code = group_refused();
            g.topics.clear();
            continue;
        }
        g.topics.retain_mut(|t| {
            if access.topic(acl::OP_DESCRIBE, &t.name) {
                return true;
            }
            for partition in &mut t.partitions {
                partition.error_code = topic_refused();
                partition.committed_offset = -1;
            }
            !denied.all_topics
        });
    }
}

pub(super) fn describe_groups(access: &Access<'_>, _: &Denied, response: &mut ResponseKind) {
    let ResponseKind::DescribeGroups(response) = response else { return };
    for g in response.groups.iter_mut().filter(|g| !access.group(acl::OP_DESCRIBE, &g.group_id)) {
        let group_id = g.group_id.clone();
        *g = describe_groups_response::DescribedGroup::default();
        g.group_id = group_id;
        g.error_code = group_refused();
    }
}

/// The refusal of a described group that uses topics the client may not describe, if it does.
fn group_topics_refused<'t>(access: &Access<'_>, mut topics: impl Iterator<Item = &'t str>) -> bool {
    topics.any(|topic| !access.topic(acl::OP_DESCRIBE, topic))
}

const GROUP_TOPICS_REFUSED: &str = "The described group uses topics that the client is not authorized to describe.";

pub(super) fn consumer_group_describe(access: &Access<'_>, _: &Denied, response: &mut ResponseKind) {
    use consumer_group_describe_response::DescribedGroup;
    let ResponseKind::ConsumerGroupDescribe(response) = response else { return };
    for g in &mut response.groups {
        let error = if !access.group(acl::OP_DESCRIBE, &g.group_id) {
            ResponseError::GroupAuthorizationFailed
        } else if group_topics_refused(access, consumer_group_topics(g)) {
            ResponseError::TopicAuthorizationFailed
        } else {
            continue;
        };
        let group_id = g.group_id.clone();
        *g = DescribedGroup::default();
        g.group_id = group_id;
        g.error_code = error.code();
        g.error_message = match error {
            ResponseError::TopicAuthorizationFailed => Some(StrBytes::from_static_str(GROUP_TOPICS_REFUSED)),
            _ => error_message(error),
        };
    }
}

fn consumer_group_topics(g: &consumer_group_describe_response::DescribedGroup) -> impl Iterator<Item = &str> {
    g.members.iter().flat_map(|m| {
        let assigned = m.assignment.topic_partitions.iter().chain(&m.target_assignment.topic_partitions);
        m.subscribed_topic_names.iter().map(|t| t.as_str()).chain(assigned.map(|t| t.topic_name.as_str()))
    })
}

/// Groups taken out by the request check come back refused; described groups that use
/// topics the client may not describe are refused with TOPIC_AUTHORIZATION_FAILED.
pub(super) fn share_group_describe(access: &Access<'_>, denied: &Denied, response: &mut ResponseKind) {
    use share_group_describe_response::DescribedGroup;
    let ResponseKind::ShareGroupDescribe(response) = response else { return };
    for g in &mut response.groups {
        let topics = g.members.iter().flat_map(|m| {
            let assigned = m.assignment.topic_partitions.iter().map(|t| t.topic_name.as_str());
            m.subscribed_topic_names.iter().map(|t| t.as_str()).chain(assigned)
        });
        if group_topics_refused(access, topics) {
            let group_id = g.group_id.clone();
            *g = DescribedGroup::default();
            g.group_id = group_id;
            g.error_code = topic_refused();
            g.error_message = Some(StrBytes::from_static_str(GROUP_TOPICS_REFUSED));
            g.authorized_operations = i32::MIN;
        }
    }
    for group_id in &denied.groups {
        let mut refused = DescribedGroup::default();
        refused.group_id = GroupId(StrBytes::from_string(group_id.clone()));
        refused.error_code = group_refused();
        refused.error_message = error_message(ResponseError::GroupAuthorizationFailed);
        refused.authorized_operations = i32::MIN;
        response.groups.push(refused);
    }
}

pub(super) fn delete_groups(_: &Access<'_>, denied: &Denied, response: &mut ResponseKind) {
    let ResponseKind::DeleteGroups(response) = response else { return };
    for group_id in &denied.groups {
        let mut result = DeletableGroupResult::default();
        result.group_id = GroupId(StrBytes::from_string(group_id.clone()));
        result.error_code = group_refused();
        response.results.push(result);
    }
}

pub(super) fn list_groups(access: &Access<'_>, _: &Denied, response: &mut ResponseKind) {
    let ResponseKind::ListGroups(response) = response else { return };
    if !access.cluster(acl::OP_DESCRIBE) {
        response.groups.retain(|g| access.group(acl::OP_DESCRIBE, &g.group_id));
    }
}

/// v0-3 (one key at the top level) are refused by the request check; v4+ per key here.
pub(super) fn find_coordinator(access: &Access<'_>, denied: &Denied, response: &mut ResponseKind) {
    let ResponseKind::FindCoordinator(response) = response else { return };
    for c in &mut response.coordinators {
        if let Some(error) = requests::coordinator_key_refused(access, denied.key_type, &c.key) {
            c.error_code = error.code();
            c.error_message = error_message(error);
            c.node_id = BrokerId(-1);
            c.host = StrBytes::default();
            c.port = -1;
        }
    }
}

pub(super) fn describe_configs(access: &Access<'_>, _: &Denied, response: &mut ResponseKind) {
    let ResponseKind::DescribeConfigs(response) = response else { return };
    for r in &mut response.results {
        if let Err(error) = config_access(access, acl::OP_DESCRIBE_CONFIGS, r.resource_type, &r.resource_name) {
            r.error_code = error.code();
            r.error_message = error_message(error);
            r.configs.clear();
        }
    }
}

pub(super) fn alter_configs(_: &Access<'_>, denied: &Denied, response: &mut ResponseKind) {
    let ResponseKind::AlterConfigs(response) = response else { return };
    for (resource_type, resource_name, error) in &denied.resources {
        let mut result = alter_configs_response::AlterConfigsResourceResponse::default();
        result.resource_type = *resource_type;
        result.resource_name = StrBytes::from_string(resource_name.clone());
        result.error_code = error.code();
        result.error_message = error_message(*error);
        response.responses.push(result);
    }
}

pub(super) fn incremental_alter_configs(_: &Access<'_>, denied: &Denied, response: &mut ResponseKind) {
    let ResponseKind::IncrementalAlterConfigs(response) = response else { return };
    for (resource_type, resource_name, error) in &denied.resources {
        let mut result = incremental_alter_configs_response::AlterConfigsResourceResponse::default();
        result.resource_type = *resource_type;
        result.resource_name = StrBytes::from_string(resource_name.clone());
        result.error_code = error.code();
        result.error_message = error_message(*error);
        response.responses.push(result);
    }
}

/// Refused groups come back refused; topics the client may not describe are answered
/// TOPIC_AUTHORIZATION_FAILED when named and left out when the group's topics were not.
pub(super) fn describe_share_group_offsets(access: &Access<'_>, denied: &Denied, response: &mut ResponseKind) {
    use describe_share_group_offsets_response::DescribeShareGroupOffsetsResponseGroup;
    let ResponseKind::DescribeShareGroupOffsets(response) = response else { return };
    for g in &mut response.groups {
        let all_topics = denied.all_topics_groups.iter().any(|id| id.as_str() == g.group_id.as_str());
        g.topics.retain_mut(|t| {
            if access.topic(acl::OP_DESCRIBE, &t.topic_name) {
                return true;
            }
            for partition in &mut t.partitions {
                partition.error_code = topic_refused();
                partition.error_message = error_message(ResponseError::TopicAuthorizationFailed);
                partition.start_offset = -1;
            }
            !all_topics
        });
    }
    for group_id in &denied.groups {
        let mut refused = DescribeShareGroupOffsetsResponseGroup::default();
        refused.group_id = GroupId(StrBytes::from_string(group_id.clone()));
        refused.error_code = group_refused();
        refused.error_message = error_message(ResponseError::GroupAuthorizationFailed);
        response.groups.push(refused);
    }
}

pub(super) fn alter_share_group_offsets(_: &Access<'_>, denied: &Denied, response: &mut ResponseKind) {
    use alter_share_group_offsets_response::{
        AlterShareGroupOffsetsResponsePartition, AlterShareGroupOffsetsResponseTopic,
    };
    let ResponseKind::AlterShareGroupOffsets(response) = response else { return };
    for (topic, partitions) in &denied.topics {
        let mut result = AlterShareGroupOffsetsResponseTopic::default();
        result.topic_name = name(topic);
        for &index in partitions {
            let mut partition = AlterShareGroupOffsetsResponsePartition::default();
            partition.partition_index = index;
            partition.error_code = topic_refused();
            partition.error_message = error_message(ResponseError::TopicAuthorizationFailed);
            result.partitions.push(partition);
        }
        response.responses.push(result);
    }
}

pub(super) fn delete_share_group_offsets(_: &Access<'_>, denied: &Denied, response: &mut ResponseKind) {
    use delete_share_group_offsets_response::DeleteShareGroupOffsetsResponseTopic;
    let ResponseKind::DeleteShareGroupOffsets(response) = response else { return };
    for (topic, _) in &denied.topics {
        let mut result = DeleteShareGroupOffsetsResponseTopic::default();
        result.topic_name = name(topic);
        result.error_code = topic_refused();
        result.error_message = error_message(ResponseError::TopicAuthorizationFailed);
        response.responses.push(result);
    }
}
