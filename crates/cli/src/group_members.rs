//! Who is in a consumer group and what each member reads, for `sluice group describe`, for
//! both kinds of consumer group: a consumer-protocol group (KIP-848, `group.protocol=
//! consumer`) is asked with ConsumerGroupDescribe, whose members carry their assignment;
//! a classic group with DescribeGroups, whose members' assignments are the opaque bytes of
//! the consumer protocol (`ConsumerProtocolAssignment`), decoded here.

use std::collections::BTreeMap;

use bytes::{Buf, Bytes};
use kafka_protocol::messages::describe_groups_response::DescribedGroup;
use kafka_protocol::messages::{ConsumerGroupDescribeRequest, ConsumerProtocolAssignment, GroupId};
use kafka_protocol::protocol::{Decodable, StrBytes};
use serde::Serialize;

use crate::kafka_connection::Cluster;

const CONSUMER_GROUP_DESCRIBE_VERSION: i16 = 1;
/// The newest ConsumerProtocolAssignment version; newer ones only add fields at the end.
const ASSIGNMENT_VERSION_MAX: i16 = 3;
/// DescribeGroups' protocol type of a group of Kafka consumers (not Connect workers).
const CONSUMER_PROTOCOL_TYPE: &str = "consumer";

/// Partitions of one topic assigned to a member.
#[derive(Serialize)]
pub struct AssignedPartitions {
    pub topic: String,
    pub partitions: Vec<i32>,
}

#[derive(Serialize)]
pub struct MemberView {
    pub member_id: String,
    pub client_id: String,
    pub host: String,
    pub assignment: Vec<AssignedPartitions>,
}

/// A group as its coordinator describes it.
pub struct GroupMembers {
    pub state: String,
    /// The assignor (classic: the protocol the members agreed on).
    pub protocol: String,
    pub members: Vec<MemberView>,
}

/// "orders:0,1 payments:2" (a table cell), "-" for none.
pub fn assignment_cell(assignment: &[AssignedPartitions]) -> String {
    if assignment.is_empty() {
        return "-".to_string();
    }
    assignment
        .iter()
        .map(|a| format!("{}:{}", a.topic, crate::output::ids(&a.partitions)))
        .collect::<Vec<_>>()
        .join(" ")
}

fn sorted(by_topic: BTreeMap<String, Vec<i32>>) -> Vec<AssignedPartitions> {
    by_topic
        .into_iter()
        .map(|(topic, mut partitions)| {
            partitions.sort_unstable();
            AssignedPartitions { topic, partitions }
        })
        .collect()
}

/// The group if it is a consumer-protocol group, else `None` (a classic group, or a broker
/// without ConsumerGroupDescribe): asked on a connection of its own, since a broker that
/// does not know the API may close it.
pub fn consumer_protocol_group(cluster: &Cluster, coordinator: &str, group: &str) -> Option<GroupMembers> {
    let mut request = ConsumerGroupDescribeRequest::default();
    request.group_ids = vec![GroupId(StrBytes::from_string(group.to_string()))];
    let response = cluster.connect(coordinator).ok()?.send(CONSUMER_GROUP_DESCRIBE_VERSION, request).ok()?;
    let described = response.groups.into_iter().next()?;
    if described.error_code != 0 || described.group_state.as_str() == "Dead" {
        return None;
    }
    let members = described
        .members
        .into_iter()
        .map(|member| {
            let mut by_topic: BTreeMap<String, Vec<i32>> = BTreeMap::new();
            for assigned in member.assignment.topic_partitions {
                by_topic.entry(assigned.topic_name.to_string()).or_default().extend(assigned.partitions);
            }
            MemberView {
                member_id: member.member_id.to_string(),
                client_id: member.client_id.to_string(),
                host: member.client_host.to_string(),
                assignment: sorted(by_topic),
            }
        })
        .collect();
    Some(GroupMembers {
        state: described.group_state.to_string(),
        protocol: described.assignor_name.to_string(),
        members,
    })
}

/// The members of a classic group, their assignments decoded when the group is one of
/// consumers (other protocols' assignments are shown as none).
pub fn classic_group(described: &DescribedGroup) -> GroupMembers {
    let consumers = described.protocol_type.as_str() == CONSUMER_PROTOCOL_TYPE;
    let members = described
        .members
        .iter()
        .map(|member| MemberView {
            member_id: member.member_id.to_string(),
            client_id: member.client_id.to_string(),
            host: member.client_host.to_string(),
            assignment: if consumers { decode_assignment(member.member_assignment.clone()) } else { Vec::new() },
        })
        .collect();
    GroupMembers { state: described.group_state.to_string(), protocol: described.protocol_data.to_string(), members }
}

/// A consumer-protocol assignment: a version, then the topics and their partitions. Bytes
/// that do not decode are shown as no assignment rather than failing the description.
fn decode_assignment(mut bytes: Bytes) -> Vec<AssignedPartitions> {
    if bytes.remaining() < 2 {
        return Vec::new();
    }
    let version = bytes.get_i16().clamp(0, ASSIGNMENT_VERSION_MAX);
    let Ok(assignment) = ConsumerProtocolAssignment::decode(&mut bytes, version) else { return Vec::new() };
    let mut by_topic: BTreeMap<String, Vec<i32>> = BTreeMap::new();
    for assigned in assignment.assigned_partitions {
        by_topic.entry(assigned.topic.to_string()).or_default().extend(assigned.partitions);
    }
    sorted(by_topic)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BufMut;
    use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition;
    use kafka_protocol::messages::TopicName;
    use kafka_protocol::protocol::Encodable;

    #[test]
    fn classic_assignments_decode_to_topics_and_partitions() {
        let mut assignment = ConsumerProtocolAssignment::default();
        assignment.assigned_partitions = vec![
            TopicPartition::default().with_topic(TopicName(StrBytes::from_static_str("b"))).with_partitions(vec![2, 0]),
            TopicPartition::default().with_topic(TopicName(StrBytes::from_static_str("a"))).with_partitions(vec![1]),
        ];
        let mut bytes = bytes::BytesMut::new();
        bytes.put_i16(1);
        assignment.encode(&mut bytes, 1).unwrap();
        let decoded = decode_assignment(bytes.freeze());
        assert_eq!(assignment_cell(&decoded), "a:1 b:0,2");
        assert!(decode_assignment(Bytes::from_static(b"\x00")).is_empty());
        assert_eq!(assignment_cell(&[]), "-");
    }
}
