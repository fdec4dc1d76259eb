//! What the console changes in a group, each with the protocol's own request as the
//! logged-in user: moving its offsets (a plan shown first, committed only when confirmed),
//! deleting its offsets of one topic, and deleting the group.
//!
//! Kafka takes offsets from a tool only while the group has no members (a member would
//! overwrite them at its next commit, and the coordinator refuses a commit without a
//! generation while members are in it), so a group with members gets a plan that says so
//! and nothing is committed. Share groups keep start offsets instead of committed ones
//! (AlterShareGroupOffsets, DeleteShareGroupOffsets); the rest is the same.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{anyhow, bail};
use kafka_protocol::messages::alter_share_group_offsets_request::{
    AlterShareGroupOffsetsRequestPartition, AlterShareGroupOffsetsRequestTopic,
};
use kafka_protocol::messages::delete_share_group_offsets_request::DeleteShareGroupOffsetsRequestTopic;
use kafka_protocol::messages::offset_commit_request::{OffsetCommitRequestPartition, OffsetCommitRequestTopic};
use kafka_protocol::messages::offset_delete_request::{OffsetDeleteRequestPartition, OffsetDeleteRequestTopic};
use kafka_protocol::messages::{
    AlterShareGroupOffsetsRequest, DeleteGroupsRequest, DeleteShareGroupOffsetsRequest, GroupId, OffsetCommitRequest,
    OffsetDeleteRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use crate::cluster::{versions, ClusterClient};
use crate::display;
use crate::groups::{coordinator_of, GroupDetail};
use crate::topics::{error_name, offsets, EARLIEST, LATEST};

/// Where a reset moves a group's positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetTarget {
    Earliest,
    Latest,
    /// This offset, kept within each partition's start and end.
    Offset(i64),
    /// The first offset at or after this time (ms since the epoch); the end when none is.
    Time(i64),
    /// The current position moved by this many, kept within start and end.
    ShiftBy(i64),
}

/// One partition's position now and after the reset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedOffset {
    pub topic: String,
    pub partition: i32,
    pub current: Option<i64>,
    pub new: i64,
}

/// The positions a reset of `group` would commit: every partition of `topic`, or of each
/// topic the group has positions in when `topic` is `None`.
pub async fn plan_reset(
    client: &Arc<ClusterClient>,
    group: &GroupDetail,
    topic: Option<&str>,
    target: ResetTarget,
) -> anyhow::Result<Vec<PlannedOffset>> {
    let current: BTreeMap<(String, i32), Option<i64>> =
        group.offsets.iter().map(|row| ((row.topic.clone(), row.partition), row.committed)).collect();
    let topics: Vec<String> = match topic {
        Some(topic) => vec![topic.to_string()],
        None => current
            .keys()
            .map(|(topic, _)| topic.clone())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect(),
    };
    if topics.is_empty() {
        bail!("group {} has no positions yet: choose the topic to reset", group.row.id);
    }
    let metadata = client.metadata(Some(&topics)).await?;
    if let Some(missing) = metadata.topics.iter().find(|t| t.error_code != 0) {
        let name = missing.name.as_ref().map(|n| n.to_string()).unwrap_or_default();
        bail!("topic {name}: {}", error_name(missing.error_code));
    }
    let starts = offsets(client, &metadata, EARLIEST).await?;
    let ends = offsets(client, &metadata, LATEST).await?;
    let at_time = match target {
        ResetTarget::Time(time) => offsets(client, &metadata, time).await?,
        _ => Default::default(),
    };
    let mut plan = Vec::new();
    for (key, end) in &ends {
        let start = starts.get(key).copied().unwrap_or(0);
        let now = current.get(key).copied().flatten();
        let new = match target {
            ResetTarget::Earliest => start,
            ResetTarget::Latest => *end,
            ResetTarget::Offset(offset) => offset.clamp(start, *end),
            ResetTarget::Time(_) => at_time.get(key).copied().unwrap_or(*end),
            ResetTarget::ShiftBy(shift) => match now {
                Some(now) => now.saturating_add(shift).clamp(start, *end),
                // Nothing to shift from: the partition keeps no position.
                None => continue,
            },
        };
        plan.push(PlannedOffset { topic: key.0.clone(), partition: key.1, current: now, new });
    }
    plan.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
    Ok(plan)
}

/// Commits `plan` as `group`'s positions: refused while the group has members.
pub async fn apply_reset(
    client: &Arc<ClusterClient>,
    group: &GroupDetail,
    plan: &[PlannedOffset],
) -> anyhow::Result<()> {
    ensure_without_members(group)?;
    let (_, address) = coordinator_of(client, &group.row.id).await?;
    let mut by_topic: BTreeMap<&str, Vec<(i32, i64)>> = BTreeMap::new();
    for planned in plan {
        by_topic.entry(&planned.topic).or_default().push((planned.partition, planned.new));
    }
    match group.row.kind.as_str() {
        "share" => alter_share_offsets(client, &address, &group.row.id, by_topic).await,
        _ => commit_offsets(client, &address, &group.row.id, by_topic).await,
    }
}

/// Positions are moved only while nobody reads.
pub fn ensure_without_members(group: &GroupDetail) -> anyhow::Result<()> {
    match group.members.len() {
        0 => Ok(()),
        1 => bail!("group {} has an active member: stop it first", group.row.id),
        n => bail!("group {} has {n} active members: stop them first", group.row.id),
    }
}

async fn commit_offsets(
    client: &Arc<ClusterClient>,
    address: &str,
    id: &str,
    by_topic: BTreeMap<&str, Vec<(i32, i64)>>,
) -> anyhow::Result<()> {
    let mut request = OffsetCommitRequest::default();
    request.group_id = group_id(id);
    // No generation and no member: a tool's commit, accepted while the group is empty.
    request.generation_id_or_member_epoch = -1;
    request.member_id = StrBytes::from_static_str("");
    request.topics = by_topic
        .into_iter()
        .map(|(topic, partitions)| {
            let mut entry = OffsetCommitRequestTopic::default();
            entry.name = topic_name(topic);
            entry.partitions = partitions
                .into_iter()
                .map(|(partition, offset)| {
                    let mut entry = OffsetCommitRequestPartition::default();
                    entry.partition_index = partition;
                    entry.committed_offset = offset;
                    entry.committed_leader_epoch = -1;
                    entry.committed_metadata = Some(StrBytes::from_static_str(""));
                    entry
                })
                .collect();
            entry
        })
        .collect();
    let answer = client.send(address, versions::OFFSET_COMMIT, request).await?;
    for topic in &answer.topics {
        for partition in &topic.partitions {
            if partition.error_code != 0 {
                bail!("{}-{}: {}", topic.name.as_str(), partition.partition_index, error_name(partition.error_code));
            }
        }
    }
    Ok(())
}

async fn alter_share_offsets(
    client: &Arc<ClusterClient>,
    address: &str,
    id: &str,
    by_topic: BTreeMap<&str, Vec<(i32, i64)>>,
) -> anyhow::Result<()> {
    let mut request = AlterShareGroupOffsetsRequest::default();
    request.group_id = group_id(id);
    request.topics = by_topic
        .into_iter()
        .map(|(topic, partitions)| {
            let mut entry = AlterShareGroupOffsetsRequestTopic::default();
            entry.topic_name = topic_name(topic);
            entry.partitions = partitions
                .into_iter()
                .map(|(partition, offset)| {
                    let mut entry = AlterShareGroupOffsetsRequestPartition::default();
                    entry.partition_index = partition;
                    entry.start_offset = offset;
                    entry
                })
                .collect();
            entry
        })
        .collect();
    let answer = client.send(address, versions::ALTER_SHARE_GROUP_OFFSETS, request).await?;
    refused(answer.error_code, answer.error_message)?;
    for topic in &answer.responses {
        for partition in &topic.partitions {
            refused(partition.error_code, partition.error_message.clone())
                .map_err(|e| anyhow!("{}-{}: {e}", topic.topic_name.as_str(), partition.partition_index))?;
        }
    }
    Ok(())
}

/// Deletes `group`'s positions in `topic` (the group must not be reading it).
pub async fn delete_topic_offsets(client: &Arc<ClusterClient>, group: &GroupDetail, topic: &str) -> anyhow::Result<()> {
    let id = group.row.id.as_str();
    let (_, address) = coordinator_of(client, id).await?;
    if group.row.kind == "share" {
        let mut entry = DeleteShareGroupOffsetsRequestTopic::default();
        entry.topic_name = topic_name(topic);
        let mut request = DeleteShareGroupOffsetsRequest::default();
        request.group_id = group_id(id);
        request.topics = vec![entry];
        let answer = client.send(&address, versions::DELETE_SHARE_GROUP_OFFSETS, request).await?;
        refused(answer.error_code, answer.error_message)?;
        for topic in answer.responses {
            refused(topic.error_code, topic.error_message)?;
        }
        return Ok(());
    }
    let partitions: Vec<i32> = group.offsets.iter().filter(|row| row.topic == topic).map(|row| row.partition).collect();
    if partitions.is_empty() {
        bail!("group {id} has no offsets in {topic}");
    }
    let mut entry = OffsetDeleteRequestTopic::default();
    entry.name = topic_name(topic);
    entry.partitions = partitions
        .into_iter()
        .map(|partition| {
            let mut entry = OffsetDeleteRequestPartition::default();
            entry.partition_index = partition;
            entry
        })
        .collect();
    let mut request = OffsetDeleteRequest::default();
    request.group_id = group_id(id);
    request.topics = vec![entry];
    let answer = client.send(&address, versions::OFFSET_DELETE, request).await?;
    refused(answer.error_code, None)?;
    for topic in &answer.topics {
        for partition in &topic.partitions {
            if partition.error_code != 0 {
                bail!("{}-{}: {}", topic.name.as_str(), partition.partition_index, error_name(partition.error_code));
            }
        }
    }
    Ok(())
}

/// Deletes the group and its positions (refused by Kafka while it has members).
pub async fn delete_group(client: &Arc<ClusterClient>, id: &str) -> anyhow::Result<()> {
    let (_, address) = coordinator_of(client, id).await?;
    let mut request = DeleteGroupsRequest::default();
    request.groups_names = vec![group_id(id)];
    let answer = client.send(&address, versions::DELETE_GROUPS, request).await?;
    let result = answer.results.into_iter().next().ok_or_else(|| anyhow!("no DeleteGroups answer"))?;
    refused(result.error_code, None)
}

/// An error code as the outcome: success, or Kafka's refusal with its message when it sent one.
fn refused(code: i16, message: Option<StrBytes>) -> anyhow::Result<()> {
    match (code, message.filter(|m| !m.is_empty())) {
        (0, _) => Ok(()),
        (code, Some(message)) => bail!("{}: {message}", error_name(code)),
        (code, None) => bail!("{}", error_name(code)),
    }
}

fn group_id(id: &str) -> GroupId {
    GroupId(StrBytes::from_string(id.to_string()))
}

fn topic_name(topic: &str) -> TopicName {
    TopicName(StrBytes::from_string(topic.to_string()))
}

/// A reset target from the form's `to` and `value` fields.
pub fn parse_target(to: &str, value: &str) -> Result<ResetTarget, String> {
    let value = value.trim();
    let number = |what: &str| value.parse::<i64>().map_err(|_| format!("{what} must be a whole number"));
    match to {
        "earliest" => Ok(ResetTarget::Earliest),
        "latest" => Ok(ResetTarget::Latest),
        "offset" => {
            let offset = number("the offset")?;
            if offset < 0 {
                return Err("the offset must be 0 or more".to_string());
            }
            Ok(ResetTarget::Offset(offset))
        }
        "shift" => Ok(ResetTarget::ShiftBy(number("the shift")?)),
        "time" => display::parse_time(value).map(ResetTarget::Time).ok_or_else(|| display::TIME_FORMS.to_string()),
        other => Err(format!("unknown reset target {other:?}: earliest, latest, offset, time or shift")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_targets_parse_and_bad_ones_say_why() {
        assert_eq!(parse_target("earliest", ""), Ok(ResetTarget::Earliest));
        assert_eq!(parse_target("offset", " 42 "), Ok(ResetTarget::Offset(42)));
        assert_eq!(parse_target("shift", "-5"), Ok(ResetTarget::ShiftBy(-5)));
        assert!(parse_target("offset", "-1").unwrap_err().contains("0 or more"));
        assert!(parse_target("shift", "x").unwrap_err().contains("whole number"));
        assert!(parse_target("sideways", "").unwrap_err().contains("unknown reset target"));
    }
}
