//! `sluice group seek` and `sluice group delete-offsets`: moving and forgetting a consumer
//! group's committed offsets. Seeking follows kafka-consumer-groups' `--reset-offsets`: it
//! shows the plan (current and new offset per partition) and commits it only with
//! `--execute`, and only while the group has no members (a member would overwrite it at its
//! next commit). Deleting is OffsetDelete at the group's coordinator, which the broker
//! refuses for a topic the group's members are still subscribed to.

use std::collections::BTreeMap;

use anyhow::bail;
use kafka_protocol::messages::offset_commit_request::{OffsetCommitRequestPartition, OffsetCommitRequestTopic};
use kafka_protocol::messages::offset_delete_request::{OffsetDeleteRequestPartition, OffsetDeleteRequestTopic};
use kafka_protocol::messages::{GroupId, OffsetCommitRequest, OffsetDeleteRequest};
use kafka_protocol::protocol::StrBytes;
use serde::Serialize;
use sluice_client::check;

use crate::cluster_queries::{committed_offsets, coordinator, described_group, offsets_of_topics, topic_name};
use crate::cluster_queries::{EARLIEST_TIMESTAMP, LATEST_TIMESTAMP};
use crate::kafka_connection::Cluster;
use crate::offset_spec::{parse_time, OffsetSpec};
use crate::output::{count, Format, TextTable};

const OFFSET_COMMIT_VERSION: i16 = 8;
const OFFSET_DELETE_VERSION: i16 = 0;

#[derive(Debug, clap::Args)]
pub struct SeekArgs {
    group: String,
    /// Where to: start, end, or a time (ms since the epoch or RFC 3339, optionally after
    /// an @): the first offset at or after it.
    #[arg(long, conflicts_with_all = ["shift_by", "to_offset"])]
    to: Option<String>,
    /// This offset (kept within each log's start and end).
    #[arg(long, conflicts_with = "shift_by")]
    to_offset: Option<i64>,
    /// Move each committed offset by N (negative: back).
    #[arg(long, allow_hyphen_values = true, value_name = "N")]
    shift_by: Option<i64>,
    /// Only this topic (default: every topic the group has committed offsets for).
    #[arg(long, short = 't')]
    topic: Option<String>,
    /// Commit the plan (without it: a dry run).
    #[arg(long)]
    execute: bool,
}

#[derive(Debug, clap::Args)]
pub struct DeleteOffsetsArgs {
    group: String,
    /// The topic whose committed offsets are deleted.
    #[arg(long, short = 't')]
    topic: String,
    /// Only these partitions, comma separated (default all of the topic's).
    #[arg(long, short = 'p', value_delimiter = ',', value_name = "P,P")]
    partitions: Vec<i32>,
}

/// Where `seek` moves each partition.
#[derive(Debug, Clone, Copy)]
enum SeekTo {
    Position(OffsetSpec),
    ShiftBy(i64),
}

#[derive(Serialize)]
struct PlannedOffset {
    topic: String,
    partition: i32,
    current: Option<i64>,
    new: i64,
}

pub fn seek(cluster: &mut Cluster, format: Format, args: SeekArgs) -> anyhow::Result<()> {
    let target = match (&args.to, args.to_offset, args.shift_by) {
        (Some(to), _, _) => SeekTo::Position(match to.as_str() {
            "start" | "earliest" => OffsetSpec::Start,
            "end" | "latest" => OffsetSpec::End,
            time => OffsetSpec::Time(parse_time(time.trim_start_matches('@'))?),
        }),
        (_, Some(offset), _) => SeekTo::Position(OffsetSpec::At(offset)),
        (_, _, Some(shift)) => SeekTo::ShiftBy(shift),
        _ => bail!("say where to: --to start|end|TIME, --to-offset N or --shift-by N"),
    };
    let group = args.group.as_str();
    let mut coordinator = coordinator(cluster, group)?;
    ensure_without_members(&mut coordinator, group)?;
    let committed = committed_offsets(&mut coordinator, group)?;
    let topics: Vec<String> = match &args.topic {
        Some(topic) => {
            cluster.topic(topic)?;
            vec![topic.clone()]
        }
        None => {
            let mut topics: Vec<String> = committed.keys().map(|(topic, _)| topic.clone()).collect();
            topics.dedup();
            if topics.is_empty() {
                bail!("group {group} has no committed offsets: name the topic (--topic)");
            }
            topics
        }
    };
    let mut plan = Vec::new();
    for topic in &topics {
        let new_offsets: BTreeMap<i32, i64> = match target {
            SeekTo::Position(position) => position.resolve(cluster, topic, None)?,
            SeekTo::ShiftBy(shift) => {
                let starts = offsets_of_topics(cluster, &[topic], EARLIEST_TIMESTAMP)?;
                let ends = offsets_of_topics(cluster, &[topic], LATEST_TIMESTAMP)?;
                committed
                    .iter()
                    .filter(|((t, _), _)| t == topic)
                    .filter_map(|(key, &offset)| {
                        let (start, end) = (*starts.get(key)?, *ends.get(key)?);
                        Some((key.1, offset.saturating_add(shift).clamp(start, end.max(start))))
                    })
                    .collect()
            }
        };
        for (partition, new) in new_offsets {
            let current = committed.get(&(topic.clone(), partition)).copied();
            plan.push(PlannedOffset { topic: topic.clone(), partition, current, new });
        }
    }
    if plan.is_empty() {
        bail!("nothing to move: group {group} has no committed offsets there");
    }
    if !format.document(&plan)? {
        let mut table =
            TextTable::new(&["TOPIC", "PARTITION", "CURRENT", "NEW"]).numeric(&["PARTITION", "CURRENT", "NEW"]);
        for planned in &plan {
            let current = planned.current.map_or("-".to_string(), |c| c.to_string());
            table.row([planned.topic.clone(), planned.partition.to_string(), current, planned.new.to_string()]);
        }
        table.print();
    }
    if !args.execute {
        eprintln!("(dry run: add --execute to commit these offsets)");
        return Ok(());
    }
    let offsets: Vec<(&str, i32, i64)> = plan.iter().map(|p| (p.topic.as_str(), p.partition, p.new)).collect();
    commit(&mut coordinator, group, &offsets)?;
    eprintln!("committed {} for group {group}", count(plan.len(), "offset"));
    Ok(())
}

/// Offsets are moved only while nobody reads: a member would overwrite them at its next
/// commit. A group that does not exist yet gets its first offsets.
pub(crate) fn ensure_without_members(
    coordinator: &mut sluice_client::KafkaConnection,
    group: &str,
) -> anyhow::Result<()> {
    if let Ok(described) = described_group(coordinator, group) {
        if !described.members.is_empty() {
            bail!("group {group} has {}: stop them first", count(described.members.len(), "active member"));
        }
    }
    Ok(())
}

/// Commits (topic, partition, offset) as a tool does: no generation and no member, accepted
/// while the group is empty.
pub(crate) fn commit(
    coordinator: &mut sluice_client::KafkaConnection,
    group: &str,
    offsets: &[(&str, i32, i64)],
) -> anyhow::Result<()> {
    let mut by_topic: BTreeMap<&str, Vec<OffsetCommitRequestPartition>> = BTreeMap::new();
    for &(topic, partition, offset) in offsets {
        by_topic.entry(topic).or_default().push(
            OffsetCommitRequestPartition::default()
                .with_partition_index(partition)
                .with_committed_offset(offset)
                .with_committed_leader_epoch(-1)
                .with_committed_metadata(Some(StrBytes::from_static_str(""))),
        );
    }
    let mut request = OffsetCommitRequest::default();
    request.group_id = GroupId(StrBytes::from_string(group.to_string()));
    request.generation_id_or_member_epoch = -1;
    request.member_id = StrBytes::from_static_str("");
    request.topics = by_topic
        .into_iter()
        .map(|(topic, partitions)| {
            OffsetCommitRequestTopic::default().with_name(topic_name(topic)).with_partitions(partitions)
        })
        .collect();
    let response = coordinator.send(OFFSET_COMMIT_VERSION, request)?;
    for answered in &response.topics {
        for partition in &answered.partitions {
            let what = format!("committing the offset of {}-{}", answered.name.as_str(), partition.partition_index);
            check(partition.error_code, None, &what)?;
        }
    }
    Ok(())
}

pub fn delete_offsets(cluster: &mut Cluster, args: DeleteOffsetsArgs) -> anyhow::Result<()> {
    let (group, topic) = (args.group.as_str(), args.topic.as_str());
    let (_, described) = cluster.topic(topic)?;
    let partitions: Vec<i32> = if args.partitions.is_empty() {
        described.partitions.iter().map(|p| p.partition_index).collect()
    } else {
        args.partitions.clone()
    };
    let mut coordinator = coordinator(cluster, group)?;
    described_group(&mut coordinator, group)?;
    let mut request = OffsetDeleteRequest::default();
    request.group_id = GroupId(StrBytes::from_string(group.to_string()));
    request.topics = vec![OffsetDeleteRequestTopic::default().with_name(topic_name(topic)).with_partitions(
        partitions.iter().map(|&p| OffsetDeleteRequestPartition::default().with_partition_index(p)).collect(),
    )];
    let response = coordinator.send(OFFSET_DELETE_VERSION, request)?;
    check(response.error_code, None, &format!("deleting the offsets of group {group}"))?;
    let answered = response.topics.iter().flat_map(|t| t.partitions.iter());
    let mut deleted = 0;
    for partition in answered {
        let what = format!("deleting the offset of group {group} for {topic}-{}", partition.partition_index);
        check(partition.error_code, None, &what)?;
        deleted += 1;
    }
    println!("deleted the committed offsets of group {group} for {topic} ({})", count(deleted, "partition"));
    Ok(())
}
