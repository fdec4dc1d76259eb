//! The lookups several tools share: offsets by time (ListOffsets at each leader), a group's
//! coordinator, its description and its committed offsets. A module of its own below the
//! tools, so that they import it and it imports none of them.

use std::collections::BTreeMap;

use anyhow::{bail, Context};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestGroup;
use kafka_protocol::messages::{
    BrokerId, DescribeGroupsRequest, GroupId, ListOffsetsRequest, OffsetFetchRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use sluice_client::check;

use crate::kafka_connection::Cluster;

/// ListOffsets timestamps: the log start and the high watermark.
pub(crate) const EARLIEST_TIMESTAMP: i64 = -2;
pub(crate) const LATEST_TIMESTAMP: i64 = -1;
const LIST_OFFSETS_VERSION: i16 = 7;
/// ListOffsets from a client, not a follower.
const CONSUMER_REPLICA_ID: i32 = -1;
const DESCRIBE_GROUPS_VERSION: i16 = 5;
/// OffsetFetch v8: groups in a list, all of a group's topics at once.
const OFFSET_FETCH_VERSION: i16 = 8;
/// Error codes said in the tools' own words.
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
const GROUP_ID_NOT_FOUND: i16 = 69;

pub(crate) fn topic_name(name: &str) -> TopicName {
    TopicName(StrBytes::from_string(name.to_string()))
}

/// The offsets at `timestamp` (earliest or latest) of `partitions` of `topic`, asked of
/// their leader.
pub(crate) fn list_offsets(
    leader: &mut sluice_client::KafkaConnection,
    topic: &str,
    partitions: &[i32],
    timestamp: i64,
) -> anyhow::Result<BTreeMap<i32, i64>> {
    let mut request = ListOffsetsRequest::default();
    request.replica_id = BrokerId(CONSUMER_REPLICA_ID);
    request.topics = vec![ListOffsetsTopic::default().with_name(topic_name(topic)).with_partitions(
        partitions
            .iter()
            .map(|&index| ListOffsetsPartition::default().with_partition_index(index).with_timestamp(timestamp))
            .collect(),
    )];
    let response = leader.send(LIST_OFFSETS_VERSION, request)?;
    let mut offsets = BTreeMap::new();
    for answered in response.topics {
        for partition in answered.partitions {
            check(partition.error_code, None, &format!("offsets of {topic}-{}", partition.partition_index))?;
            offsets.insert(partition.partition_index, partition.offset);
        }
    }
    Ok(offsets)
}

/// A connection to `group`'s coordinator.
pub(crate) fn coordinator(cluster: &Cluster, group: &str) -> anyhow::Result<sluice_client::KafkaConnection> {
    let address = crate::share_tools::coordinator(&cluster.connector, cluster.bootstrap.address(), group)?;
    cluster.connect(&address)
}

/// The group as DescribeGroups answers it, or "group NAME does not exist".
pub(crate) fn described_group(
    coordinator: &mut sluice_client::KafkaConnection,
    group: &str,
) -> anyhow::Result<kafka_protocol::messages::describe_groups_response::DescribedGroup> {
    let mut request = DescribeGroupsRequest::default();
    request.groups = vec![GroupId(StrBytes::from_string(group.to_string()))];
    let response = coordinator.send(DESCRIBE_GROUPS_VERSION, request)?;
    let described = response.groups.into_iter().next().context("DescribeGroups: no answer")?;
    if described.error_code == GROUP_ID_NOT_FOUND || described.group_state.as_str() == "Dead" {
        bail!("group {group} does not exist");
    }
    check(described.error_code, described.error_message.as_deref(), &format!("describing group {group}"))?;
    Ok(described)
}

/// (topic, partition) -> committed offset of every partition the group committed.
pub(crate) fn committed_offsets(
    coordinator: &mut sluice_client::KafkaConnection,
    group: &str,
) -> anyhow::Result<BTreeMap<(String, i32), i64>> {
    let mut wanted = OffsetFetchRequestGroup::default();
    wanted.group_id = GroupId(StrBytes::from_string(group.to_string()));
    wanted.topics = None;
    let mut request = OffsetFetchRequest::default();
    request.groups = vec![wanted];
    let response = coordinator.send(OFFSET_FETCH_VERSION, request)?;
    let answered = response.groups.into_iter().next().context("OffsetFetch: no answer")?;
    check(answered.error_code, None, &format!("committed offsets of group {group}"))?;
    let mut committed = BTreeMap::new();
    for topic in answered.topics {
        for partition in topic.partitions {
            check(
                partition.error_code,
                None,
                &format!("committed offset of {}-{}", topic.name.as_str(), partition.partition_index),
            )?;
            if partition.committed_offset >= 0 {
                committed.insert((topic.name.to_string(), partition.partition_index), partition.committed_offset);
            }
        }
    }
    Ok(committed)
}

/// The offsets at `timestamp` (earliest or latest) of every partition of `topics`, asked of
/// their leaders.
pub(crate) fn offsets_of_topics(
    cluster: &mut Cluster,
    topics: &[&str],
    timestamp: i64,
) -> anyhow::Result<BTreeMap<(String, i32), i64>> {
    let mut offsets = BTreeMap::new();
    if topics.is_empty() {
        return Ok(offsets);
    }
    let metadata = cluster.metadata(Some(topics))?;
    let addresses = Cluster::addresses(&metadata);
    for topic in &metadata.topics {
        let Some(name) = topic.name.as_ref().map(|n| n.to_string()) else { continue };
        if topic.error_code == UNKNOWN_TOPIC_OR_PARTITION {
            continue;
        }
        check(topic.error_code, None, &format!("topic {name}"))?;
        let mut by_leader: BTreeMap<i32, Vec<i32>> = BTreeMap::new();
        for partition in &topic.partitions {
            by_leader.entry(partition.leader_id.0).or_default().push(partition.partition_index);
        }
        for (leader, partitions) in by_leader {
            let Some(address) = addresses.get(&leader) else { continue };
            let found = list_offsets(&mut cluster.connect(address)?, &name, &partitions, timestamp)?;
            offsets.extend(found.into_iter().map(|(partition, offset)| ((name.clone(), partition), offset)));
        }
    }
    Ok(offsets)
}
