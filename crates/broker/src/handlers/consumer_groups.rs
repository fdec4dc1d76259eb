//! The KIP-848 consumer-group APIs: ConsumerGroupHeartbeat (the whole membership
//! protocol of `group.protocol=consumer` clients) and ConsumerGroupDescribe. Like the
//! classic handlers they only translate between wire messages and the coordinator; both
//! answer at once (no long-poll), with the coordinator lock held only inside the call.

use std::collections::BTreeSet;
use std::sync::Arc;

use kafka_protocol::messages::consumer_group_describe_response::{self as describe_response, DescribedGroup};
use kafka_protocol::messages::consumer_group_heartbeat_response::{self as heartbeat_response};
use kafka_protocol::messages::{
    ConsumerGroupDescribeRequest, ConsumerGroupDescribeResponse, ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use crate::handlers::groups::{coordinator, text};
use crate::Broker;
use sluice_coordinator::group::assignor::Assignment;
use sluice_coordinator::group::consumer::{
    validate_heartbeat, Heartbeat, MemberDescription, CLIENT_MEMBER_ID_VERSION, JOIN_GROUP_MEMBER_EPOCH,
};
use sluice_coordinator::group::error::GroupRefusal;
use sluice_meta::topics::TopicCatalog;

/// ConsumerGroupDescribe v1 reports each member's protocol: 1 = consumer.
const MEMBER_TYPE_CONSUMER: i8 = 1;
/// Kafka's `authorized_operations` when they were not asked for.
const AUTHORIZED_OPERATIONS_OMITTED: i32 = i32::MIN;

fn decode(request: ConsumerGroupHeartbeatRequest, client_id: Option<StrBytes>, client_host: String) -> Heartbeat {
    let owned = request.topic_partitions.map(|topics| {
        let mut owned = Assignment::new();
        for topic in topics {
            let partitions: BTreeSet<i32> = topic.partitions.into_iter().collect();
            if !partitions.is_empty() {
                owned.entry(topic.topic_id).or_default().extend(partitions);
            }
        }
        owned
    });
    Heartbeat {
        member_id: request.member_id.to_string(),
        member_epoch: request.member_epoch,
        instance_id: request.instance_id.map(|s| s.to_string()),
        rack_id: request.rack_id.map(|s| s.to_string()),
        rebalance_timeout_ms: request.rebalance_timeout_ms,
        subscribed_topic_names: request
            .subscribed_topic_names
            .map(|names| names.iter().map(|n| n.to_string()).collect()),
        subscribed_topic_regex: request.subscribed_topic_regex.map(|s| s.to_string()),
        server_assignor: request.server_assignor.map(|s| s.to_string()),
        owned,
        client_id: client_id.map(|s| s.to_string()).unwrap_or_default(),
        client_host,
    }
}

pub(super) fn heartbeat(
    broker: &Arc<Broker>,
    request: ConsumerGroupHeartbeatRequest,
    version: i16,
    client_id: Option<StrBytes>,
    client_host: String,
) -> ConsumerGroupHeartbeatResponse {
    let coordinator = coordinator(broker);
    let group_id = request.group_id.to_string();
    let mut heartbeat = decode(request, client_id, client_host);
    // v0: the coordinator names a joining member; from v1 the client does.
    if version < CLIENT_MEMBER_ID_VERSION
        && heartbeat.member_epoch == JOIN_GROUP_MEMBER_EPOCH
        && heartbeat.member_id.is_empty()
    {
        heartbeat.member_id = uuid::Uuid::new_v4().to_string();
    }
    let catalog = broker.topics.catalog();
    let answer = validate_heartbeat(&heartbeat, version)
        .and_then(|()| coordinator.consumer_heartbeat(&group_id, heartbeat, &catalog));
    let mut response = ConsumerGroupHeartbeatResponse::default();
    match answer {
        Ok(answer) => {
            response.member_id = Some(text(&answer.member_id));
            response.member_epoch = answer.member_epoch;
            response.heartbeat_interval_ms = answer.heartbeat_interval_ms;
            response.assignment = answer.assignment.map(|assignment| {
                let mut out = heartbeat_response::Assignment::default();
                out.topic_partitions = assignment
                    .into_iter()
                    .map(|(topic_id, partitions)| {
                        let mut topic = heartbeat_response::TopicPartitions::default();
                        topic.topic_id = topic_id;
                        topic.partitions = partitions.into_iter().collect();
                        topic
                    })
                    .collect();
                out
            });
        }
        Err(GroupRefusal { error, message }) => {
            tracing::debug!(group = %group_id, %error, %message, "consumer group heartbeat refused");
            response.error_code = error.code();
            response.error_message = Some(text(&message));
        }
    }
    response
}

fn described_assignment(assignment: &Assignment, catalog: &TopicCatalog) -> describe_response::Assignment {
    let mut out = describe_response::Assignment::default();
    out.topic_partitions = assignment
        .iter()
        .map(|(topic_id, partitions)| {
            let mut topic = describe_response::TopicPartitions::default();
            topic.topic_id = *topic_id;
            topic.topic_name = TopicName(text(catalog.name_for_id(topic_id).unwrap_or_default()));
            topic.partitions = partitions.iter().copied().collect();
            topic
        })
        .collect();
    out
}

fn described_member(member: MemberDescription, catalog: &TopicCatalog, version: i16) -> describe_response::Member {
    let mut out = describe_response::Member::default();
    out.member_id = text(&member.member_id);
    out.instance_id = member.instance_id.as_deref().map(text);
    out.rack_id = member.rack_id.as_deref().map(text);
    out.member_epoch = member.member_epoch;
    out.client_id = text(&member.client_id);
    out.client_host = text(&member.client_host);
    out.subscribed_topic_names = member.subscribed_topic_names.iter().map(|n| TopicName(text(n))).collect();
    out.subscribed_topic_regex = member.subscribed_topic_regex.as_deref().map(text);
    out.assignment = described_assignment(&member.assignment, catalog);
    out.target_assignment = described_assignment(&member.target_assignment, catalog);
    if version >= 1 {
        out.member_type = MEMBER_TYPE_CONSUMER;
    }
    out
}

pub(super) fn describe(
    broker: &Arc<Broker>,
    request: ConsumerGroupDescribeRequest,
    version: i16,
) -> ConsumerGroupDescribeResponse {
    let coordinator = coordinator(broker);
    let catalog = broker.topics.catalog();
    let mut response = ConsumerGroupDescribeResponse::default();
    for group_id in request.group_ids {
        let mut described = DescribedGroup::default();
        described.authorized_operations = AUTHORIZED_OPERATIONS_OMITTED;
        match coordinator.describe_consumer_group(group_id.as_str()) {
            Ok(description) => {
                described.group_state = text(description.state.name());
                described.group_epoch = description.group_epoch;
                described.assignment_epoch = description.assignment_epoch;
                described.assignor_name = text(description.assignor);
                described.members =
                    description.members.into_iter().map(|m| described_member(m, &catalog, version)).collect();
            }
            Err(GroupRefusal { error, message }) => {
                described.error_code = error.code();
                described.error_message = Some(text(&message));
            }
        }
        described.group_id = group_id;
        response.groups.push(described);
    }
    response
}
