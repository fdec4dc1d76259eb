//! Groups as the user may see them: classic, consumer-protocol (KIP-848) and share groups
//! (KIP-932) with their own states, members and assignments, and each partition's committed
//! (or, for a share group, start) offset and lag.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use anyhow::{anyhow, bail};
use bytes::Buf;
use kafka_protocol::messages::describe_share_group_offsets_request::DescribeShareGroupOffsetsRequestGroup;
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestGroup;
use kafka_protocol::messages::{
    ConsumerGroupDescribeRequest, ConsumerProtocolAssignment, DescribeGroupsRequest, DescribeShareGroupOffsetsRequest,
    FindCoordinatorRequest, GroupId, ListGroupsRequest, OffsetFetchRequest, ShareGroupDescribeRequest,
};
use kafka_protocol::protocol::{Decodable, StrBytes};

use crate::cluster::{versions, ClusterClient, ClusterMetadata};
use crate::topics::{error_name, offsets, LATEST};

/// FindCoordinator's key type of a group (classic, consumer or share).
const GROUP_KEY: i8 = 0;

/// One group as the groups list shows it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct GroupRow {
    pub id: String,
    /// `classic`, `consumer` or `share`.
    pub kind: String,
    pub state: String,
}

/// One member and what it is assigned.
#[derive(Debug, Clone)]
pub struct MemberRow {
    pub id: String,
    pub client_id: String,
    pub host: String,
    /// `topic: 0, 1; other: 2`.
    pub assignment: String,
}

/// One partition's position and lag.
#[derive(Debug, Clone)]
pub struct OffsetRow {
    pub topic: String,
    pub partition: i32,
    /// The committed offset (a share group's start offset); `None`: none committed.
    pub committed: Option<i64>,
    pub end: Option<i64>,
}

impl OffsetRow {
    pub fn lag(&self) -> Option<i64> {
        Some((self.end? - self.committed?).max(0))
    }
}

/// A group as its page shows it.
#[derive(Debug, Clone)]
pub struct GroupDetail {
    pub row: GroupRow,
    pub coordinator: i32,
    pub members: Vec<MemberRow>,
    pub offsets: Vec<OffsetRow>,
}

impl GroupDetail {
    pub fn lag(&self) -> i64 {
        self.offsets.iter().filter_map(OffsetRow::lag).sum()
    }
}

/// Every group the user may describe, from every broker's ListGroups.
pub async fn group_rows(client: &Arc<ClusterClient>, metadata: &ClusterMetadata) -> anyhow::Result<Vec<GroupRow>> {
    let asks = metadata.brokers.values().map(|(address, _)| {
        let client = client.clone();
        let address = address.clone();
        async move { client.send(&address, versions::LIST_GROUPS, ListGroupsRequest::default()).await }
    });
    let mut rows = BTreeSet::new();
    for answer in futures::future::join_all(asks).await {
        // A broker that is down only leaves out the groups it coordinates.
        let Ok(answer) = answer else { continue };
        for group in answer.groups {
            rows.insert(GroupRow {
                id: group.group_id.to_string(),
                kind: kind_of(&group.group_type, &group.protocol_type),
                state: group.group_state.to_string(),
            });
        }
    }
    Ok(rows.into_iter().collect())
}

/// A group's type in words: ListGroups v5's `group_type`, else what its protocol says.
fn kind_of(group_type: &str, protocol_type: &str) -> String {
    match (group_type, protocol_type) {
        ("", "consumer") | ("", "") => "classic".to_string(),
        ("", other) => format!("classic ({other})"),
        (kind, _) => kind.to_ascii_lowercase(),
    }
}

/// The group `id`: its coordinator's view of members, assignments and offsets.
pub async fn group_detail(client: &Arc<ClusterClient>, id: &str) -> anyhow::Result<GroupDetail> {
    let (coordinator, address) = coordinator_of(client, id).await?;
    let listed = client.send(&address, versions::LIST_GROUPS, ListGroupsRequest::default()).await?;
    let row = listed
        .groups
        .iter()
        .find(|g| g.group_id.as_str() == id)
        .map(|g| GroupRow {
            id: id.to_string(),
            kind: kind_of(&g.group_type, &g.protocol_type),
            state: g.group_state.to_string(),
        })
        .ok_or_else(|| anyhow!("group {id} not found"))?;
    let members = match row.kind.as_str() {
        "share" => share_members(client, &address, id).await?,
        "consumer" => consumer_members(client, &address, id).await?,
        _ => classic_members(client, &address, id).await?,
    };
    let committed = match row.kind.as_str() {
        "share" => share_start_offsets(client, &address, id).await?,
        _ => committed_offsets(client, &address, id).await?,
    };
    let topics: Vec<String> =
        committed.keys().map(|(topic, _)| topic.clone()).collect::<BTreeSet<_>>().into_iter().collect();
    let ends = match topics.is_empty() {
        true => Default::default(),
        false => offsets(client, &client.metadata(Some(&topics)).await?, LATEST).await?,
    };
    let offsets = committed
        .into_iter()
        .map(|((topic, partition), committed)| OffsetRow {
            end: ends.get(&(topic.clone(), partition)).copied(),
            topic,
            partition,
            committed,
        })
        .collect();
    Ok(GroupDetail { row, coordinator, members, offsets })
}

pub async fn coordinator_of(client: &Arc<ClusterClient>, id: &str) -> anyhow::Result<(i32, String)> {
    let mut request = FindCoordinatorRequest::default();
    request.key_type = GROUP_KEY;
    request.coordinator_keys = vec![StrBytes::from_string(id.to_string())];
    let bootstrap = client.bootstrap().to_string();
    let answer = client.send(&bootstrap, versions::FIND_COORDINATOR, request).await?;
    let found = answer.coordinators.into_iter().next().ok_or_else(|| anyhow!("no coordinator answer"))?;
    if found.error_code != 0 {
        bail!("group {id}: {}", error_name(found.error_code));
    }
    Ok((found.node_id.0, format!("{}:{}", found.host, found.port)))
}

fn group_id(id: &str) -> GroupId {
    GroupId(StrBytes::from_string(id.to_string()))
}

fn group_ids(id: &str) -> Vec<GroupId> {
    vec![group_id(id)]
}

/// A group's answer as the outcome: described, or why not.
fn answered(id: &str, error_code: i16) -> anyhow::Result<()> {
    match error_code {
        0 => Ok(()),
        code => bail!("group {id}: {}", error_name(code)),
    }
}

/// A stored position (-1: none).
fn position(offset: i64) -> Option<i64> {
    (offset >= 0).then_some(offset)
}

/// `topic: 0, 1; other: 2` of (topic, partitions) pairs.
fn assignment_text<'a>(pairs: impl Iterator<Item = (&'a str, &'a [i32])>) -> String {
    let mut by_topic: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
    for (topic, partitions) in pairs {
        by_topic.entry(topic).or_default().extend_from_slice(partitions);
    }
    let parts: Vec<String> = by_topic
        .into_iter()
        .map(|(topic, mut partitions)| {
            partitions.sort_unstable();
            let list: Vec<String> = partitions.iter().map(i32::to_string).collect();
            format!("{topic}: {}", list.join(", "))
        })
        .collect();
    parts.join("; ")
}

async fn classic_members(client: &Arc<ClusterClient>, address: &str, id: &str) -> anyhow::Result<Vec<MemberRow>> {
    let mut request = DescribeGroupsRequest::default();
    request.groups = group_ids(id);
    let answer = client.send(address, versions::DESCRIBE_GROUPS, request).await?;
    let group = answer.groups.into_iter().next().ok_or_else(|| anyhow!("no DescribeGroups answer"))?;
    answered(id, group.error_code)?;
    let consumer = group.protocol_type.as_str() == "consumer";
    Ok(group
        .members
        .into_iter()
        .map(|member| MemberRow {
            id: member.member_id.to_string(),
            client_id: member.client_id.to_string(),
            host: member.client_host.to_string(),
            assignment: if consumer { consumer_assignment(member.member_assignment) } else { String::new() },
        })
        .collect())
}

/// A classic consumer's assignment bytes (the consumer protocol's), as text.
fn consumer_assignment(mut bytes: bytes::Bytes) -> String {
    if bytes.remaining() < 2 {
        return String::new();
    }
    let version = bytes.get_i16();
    match ConsumerProtocolAssignment::decode(&mut bytes, version) {
        Ok(assignment) => assignment_text(
            assignment.assigned_partitions.iter().map(|tp| (tp.topic.as_str(), tp.partitions.as_slice())),
        ),
        Err(_) => "(unreadable assignment)".to_string(),
    }
}

/// The rows of a consumer or share group's members: their types differ, their fields agree.
macro_rules! assigned_members {
    ($members:expr) => {
        $members
            .into_iter()
            .map(|member| MemberRow {
                id: member.member_id.to_string(),
                client_id: member.client_id.to_string(),
                host: member.client_host.to_string(),
                assignment: assignment_text(
                    member
                        .assignment
                        .topic_partitions
                        .iter()
                        .map(|tp| (tp.topic_name.as_str(), tp.partitions.as_slice())),
                ),
            })
            .collect()
    };
}

async fn consumer_members(client: &Arc<ClusterClient>, address: &str, id: &str) -> anyhow::Result<Vec<MemberRow>> {
    let mut request = ConsumerGroupDescribeRequest::default();
    request.group_ids = group_ids(id);
    let answer = client.send(address, versions::CONSUMER_GROUP_DESCRIBE, request).await?;
    let group = answer.groups.into_iter().next().ok_or_else(|| anyhow!("no ConsumerGroupDescribe answer"))?;
    answered(id, group.error_code)?;
    Ok(assigned_members!(group.members))
}

async fn share_members(client: &Arc<ClusterClient>, address: &str, id: &str) -> anyhow::Result<Vec<MemberRow>> {
    let mut request = ShareGroupDescribeRequest::default();
    request.group_ids = group_ids(id);
    let answer = client.send(address, versions::SHARE_GROUP_DESCRIBE, request).await?;
    let group = answer.groups.into_iter().next().ok_or_else(|| anyhow!("no ShareGroupDescribe answer"))?;
    answered(id, group.error_code)?;
    Ok(assigned_members!(group.members))
}

type Positions = BTreeMap<(String, i32), Option<i64>>;

async fn committed_offsets(client: &Arc<ClusterClient>, address: &str, id: &str) -> anyhow::Result<Positions> {
    let mut group = OffsetFetchRequestGroup::default();
    group.group_id = group_id(id);
    group.topics = None;
    group.member_epoch = -1;
    let mut request = OffsetFetchRequest::default();
    request.groups = vec![group];
    let answer = client.send(address, versions::OFFSET_FETCH, request).await?;
    let group = answer.groups.into_iter().next().ok_or_else(|| anyhow!("no OffsetFetch answer"))?;
    answered(id, group.error_code)?;
    Ok(group
        .topics
        .into_iter()
        .flat_map(|topic| {
            let name = topic.name.to_string();
            topic.partitions.into_iter().map(move |p| ((name.clone(), p.partition_index), position(p.committed_offset)))
        })
        .collect())
}

async fn share_start_offsets(client: &Arc<ClusterClient>, address: &str, id: &str) -> anyhow::Result<Positions> {
    let mut group = DescribeShareGroupOffsetsRequestGroup::default();
    group.group_id = group_id(id);
    group.topics = None;
    let mut request = DescribeShareGroupOffsetsRequest::default();
    request.groups = vec![group];
    let answer = client.send(address, versions::DESCRIBE_SHARE_GROUP_OFFSETS, request).await?;
    let group = answer.groups.into_iter().next().ok_or_else(|| anyhow!("no DescribeShareGroupOffsets answer"))?;
    answered(id, group.error_code)?;
    Ok(group
        .topics
        .into_iter()
        .flat_map(|topic| {
            let name = topic.topic_name.to_string();
            topic.partitions.into_iter().map(move |p| ((name.clone(), p.partition_index), position(p.start_offset)))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assignments_read_by_topic_with_sorted_partitions() {
        let pairs = [("b", &[3, 1][..]), ("a", &[0][..]), ("b", &[2][..])];
        assert_eq!(assignment_text(pairs.into_iter()), "a: 0; b: 1, 2, 3");
        assert_eq!(kind_of("", "consumer"), "classic");
        assert_eq!(kind_of("Share", ""), "share");
        assert_eq!(kind_of("consumer", "consumer"), "consumer");
    }
}
