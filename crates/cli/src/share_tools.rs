//! `sluice share`: list share groups (KIP-932) and describe one: its members, their
//! assignments and, per share-partition, the start offset (every record before it is
//! acknowledged or archived), the log end and the lag between them. librdkafka has no
//! share-group API, so both speak the protocol directly (ListGroups v5 of type "share" to
//! every broker; FindCoordinator, then ShareGroupDescribe and DescribeShareGroupOffsets at
//! the group's coordinator; Metadata and ListOffsets for the log ends), over any listener,
//! as `sluice acl` does (`kafka_connection`). `kafka-share-groups.sh` remains the tool for
//! resetting and deleting.

use std::collections::BTreeMap;

use anyhow::{bail, Context};
use kafka_protocol::messages::describe_share_group_offsets_request::DescribeShareGroupOffsetsRequestGroup;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    ApiKey, BrokerId, DescribeShareGroupOffsetsRequest, FindCoordinatorRequest, GroupId, ListGroupsRequest,
    ListOffsetsRequest, MetadataRequest, MetadataResponse, RequestKind, ResponseKind, ShareGroupDescribeRequest,
    TopicName,
};
use kafka_protocol::protocol::StrBytes;

use serde::Serialize;

use crate::kafka_connection::{ConnectionArgs, Connector};
use crate::output::{count, Format, TextTable};
use crate::security_tools::check;

const METADATA_VERSION: i16 = 12;
/// ListOffsets v7: the timestamp -1 asks for the log end (the high watermark).
const LIST_OFFSETS_VERSION: i16 = 7;
const LATEST_TIMESTAMP: i64 = -1;
/// ListOffsets from a client, not a follower.
const CONSUMER_REPLICA_ID: i32 = -1;
const FIND_COORDINATOR_VERSION: i16 = 4;
const SHARE_GROUP_DESCRIBE_VERSION: i16 = 1;
const DESCRIBE_OFFSETS_VERSION: i16 = 0;
/// ListGroups v5 filters by group type.
const LIST_GROUPS_VERSION: i16 = 5;
/// FindCoordinator's key type of a group (share groups use the group coordinator).
const KEY_TYPE_GROUP: i8 = 0;

#[derive(Debug, clap::Subcommand)]
pub enum ShareCommand {
    /// List share groups with their state.
    List,
    /// Show a share group's members and, per partition, start offset, log end and lag.
    Describe { group: String },
}

#[derive(Debug, clap::Args)]
pub struct ShareArgs {
    #[command(subcommand)]
    command: ShareCommand,
}

pub fn share(connection: &ConnectionArgs, format: Format, args: ShareArgs) -> anyhow::Result<()> {
    let connector = connection.connector()?;
    let bootstrap = connection.bootstrap();
    match args.command {
        ShareCommand::List => list(&connector, bootstrap, format),
        ShareCommand::Describe { group } => describe(&connector, bootstrap, format, &group),
    }
}

/// Each coordinator lists its own groups: ListGroups (share type) to every broker.
fn list(connector: &Connector, bootstrap: &str, format: Format) -> anyhow::Result<()> {
    let metadata = metadata(connector, bootstrap, Some(Vec::new()))?;
    let mut listed = BTreeMap::new();
    for broker in &metadata.brokers {
        let mut request = ListGroupsRequest::default();
        request.types_filter = vec![StrBytes::from_static_str("share")];
        let address = format!("{}:{}", broker.host.as_str(), broker.port);
        let answer =
            connector.call(&address, ApiKey::ListGroups, LIST_GROUPS_VERSION, RequestKind::ListGroups(request))?;
        let ResponseKind::ListGroups(response) = answer else { bail!("ListGroups answered in another kind") };
        check(response.error_code, None, &format!("listing the groups of broker {}", broker.node_id.0))?;
        for group in response.groups {
            listed.insert(group.group_id.to_string(), group.group_state.to_string());
        }
    }
    let listed: Vec<ShareGroupSummary> =
        listed.into_iter().map(|(name, state)| ShareGroupSummary { name, state }).collect();
    if format.document(&listed)? {
        return Ok(());
    }
    let mut table = TextTable::new(&["GROUP", "STATE"]);
    for group in &listed {
        table.row([group.name.as_str(), group.state.as_str()]);
    }
    table.print();
    Ok(())
}

/// Metadata of `topics` (`None`: all; empty: only the brokers).
fn metadata(connector: &Connector, bootstrap: &str, topics: Option<Vec<String>>) -> anyhow::Result<MetadataResponse> {
    let mut request = MetadataRequest::default();
    // Read-only: never creates a topic.
    request.allow_auto_topic_creation = false;
    request.topics = topics.map(|names| {
        names
            .into_iter()
            .map(|name| MetadataRequestTopic::default().with_name(Some(TopicName(StrBytes::from_string(name)))))
            .collect()
    });
    let answer = connector.call(bootstrap, ApiKey::Metadata, METADATA_VERSION, RequestKind::Metadata(request))?;
    let ResponseKind::Metadata(response) = answer else { bail!("Metadata answered in another kind") };
    Ok(response)
}

/// The host:port of `group`'s coordinator.
pub(crate) fn coordinator(connector: &Connector, bootstrap: &str, group: &str) -> anyhow::Result<String> {
    let mut request = FindCoordinatorRequest::default();
    request.key_type = KEY_TYPE_GROUP;
    request.coordinator_keys = vec![StrBytes::from_string(group.to_string())];
    let answer = connector.call(
        bootstrap,
        ApiKey::FindCoordinator,
        FIND_COORDINATOR_VERSION,
        RequestKind::FindCoordinator(request),
    )?;
    let ResponseKind::FindCoordinator(response) = answer else { bail!("FindCoordinator answered in another kind") };
    let found = response.coordinators.first().context("FindCoordinator: no answer")?;
    check(found.error_code, found.error_message.as_ref(), "finding the group's coordinator")?;
    Ok(format!("{}:{}", found.host.as_str(), found.port))
}

fn describe(connector: &Connector, bootstrap: &str, format: Format, group: &str) -> anyhow::Result<()> {
    let coordinator_address = coordinator(connector, bootstrap, group)?;
    let mut coordinator = connector.connect(&coordinator_address)?;
    let mut request = ShareGroupDescribeRequest::default();
    request.group_ids = vec![GroupId(StrBytes::from_string(group.to_string()))];
    let answer = coordinator.call(
        ApiKey::ShareGroupDescribe,
        SHARE_GROUP_DESCRIBE_VERSION,
        RequestKind::ShareGroupDescribe(request),
    )?;
    let ResponseKind::ShareGroupDescribe(response) = answer else {
        bail!("ShareGroupDescribe answered in another kind")
    };
    let described = response.groups.first().context("ShareGroupDescribe: no answer")?;
    check(described.error_code, described.error_message.as_ref(), &format!("describing share group {group}"))?;
    let members: Vec<ShareMemberView> = described
        .members
        .iter()
        .map(|member| ShareMemberView {
            member_id: member.member_id.to_string(),
            client_id: member.client_id.to_string(),
            host: member.client_host.to_string(),
            assigned: member
                .assignment
                .topic_partitions
                .iter()
                .flat_map(|tp| tp.partitions.iter().map(move |p| format!("{}-{p}", tp.topic_name.as_str())))
                .collect(),
        })
        .collect();
    let (state, epoch) = (described.group_state.to_string(), described.group_epoch);

    let mut request = DescribeShareGroupOffsetsRequest::default();
    let mut wanted = DescribeShareGroupOffsetsRequestGroup::default();
    wanted.group_id = GroupId(StrBytes::from_string(group.to_string()));
    wanted.topics = None;
    request.groups = vec![wanted];
    let answer = coordinator.call(
        ApiKey::DescribeShareGroupOffsets,
        DESCRIBE_OFFSETS_VERSION,
        RequestKind::DescribeShareGroupOffsets(request),
    )?;
    let ResponseKind::DescribeShareGroupOffsets(response) = answer else {
        bail!("DescribeShareGroupOffsets answered in another kind")
    };
    let offsets = response.groups.first().context("DescribeShareGroupOffsets: no answer")?;
    check(offsets.error_code, offsets.error_message.as_ref(), "describing the share group's offsets")?;
    let mut starts: BTreeMap<(String, i32), i64> = BTreeMap::new();
    for topic in &offsets.topics {
        for partition in &topic.partitions {
            check(partition.error_code, partition.error_message.as_ref(), "a share-partition's offset")?;
            starts.insert((topic.topic_name.to_string(), partition.partition_index), partition.start_offset);
        }
    }
    let ends = log_ends(connector, bootstrap, starts.keys())?;
    let mut offsets = Vec::new();
    for ((topic, partition), start) in starts {
        let end = *ends.get(&(topic.clone(), partition)).context("no log end for a share-partition")?;
        let start = (start >= 0).then_some(start);
        offsets.push(ShareOffsetView {
            topic,
            partition,
            start_offset: start,
            log_end: end,
            lag: start.map(|s| (end - s).max(0)),
        });
    }
    let view = ShareGroupView { group: group.to_string(), state, epoch, members, offsets };
    if format.document(&view)? {
        return Ok(());
    }
    println!(
        "share group {group}: {}, state {}, epoch {}",
        count(view.members.len(), "member"),
        view.state,
        view.epoch
    );
    if !view.members.is_empty() {
        println!();
        let mut table = TextTable::new(&["MEMBER", "CLIENT-ID", "HOST", "ASSIGNED"]);
        for member in &view.members {
            table.row([
                member.member_id.clone(),
                member.client_id.clone(),
                member.host.clone(),
                member.assigned.join(","),
            ]);
        }
        table.print();
    }
    println!();
    let dash = |value: Option<i64>| value.map_or("-".to_string(), |v| v.to_string());
    let mut table = TextTable::new(&["TOPIC", "PARTITION", "START-OFFSET", "LOG-END", "LAG"]).numeric(&[
        "PARTITION",
        "START-OFFSET",
        "LOG-END",
        "LAG",
    ]);
    for offset in &view.offsets {
        table.row([
            offset.topic.clone(),
            offset.partition.to_string(),
            dash(offset.start_offset),
            offset.log_end.to_string(),
            dash(offset.lag),
        ]);
    }
    table.print();
    Ok(())
}

#[derive(Serialize)]
struct ShareGroupSummary {
    name: String,
    state: String,
}

#[derive(Serialize)]
struct ShareMemberView {
    member_id: String,
    client_id: String,
    host: String,
    /// topic-partition of each assigned partition.
    assigned: Vec<String>,
}

#[derive(Serialize)]
struct ShareOffsetView {
    topic: String,
    partition: i32,
    /// `None` before the group has a start offset in this partition.
    start_offset: Option<i64>,
    log_end: i64,
    lag: Option<i64>,
}

#[derive(Serialize)]
struct ShareGroupView {
    group: String,
    state: String,
    epoch: i32,
    members: Vec<ShareMemberView>,
    offsets: Vec<ShareOffsetView>,
}

/// The log end of each partition, asked of its leader (ListOffsets, latest).
fn log_ends<'a>(
    connector: &Connector,
    bootstrap: &str,
    partitions: impl Iterator<Item = &'a (String, i32)> + Clone,
) -> anyhow::Result<BTreeMap<(String, i32), i64>> {
    let mut topics: Vec<String> = partitions.clone().map(|(topic, _)| topic.clone()).collect();
    topics.dedup();
    let mut ends = BTreeMap::new();
    if topics.is_empty() {
        return Ok(ends);
    }
    let metadata = metadata(connector, bootstrap, Some(topics))?;
    let mut leaders = BTreeMap::new();
    for topic in &metadata.topics {
        let name = topic.name.as_ref().map_or(String::new(), |n| n.to_string());
        check(topic.error_code, None, &format!("metadata of topic {name}"))?;
        for partition in &topic.partitions {
            leaders.insert((name.clone(), partition.partition_index), partition.leader_id.0);
        }
    }
    let mut by_leader: BTreeMap<i32, BTreeMap<String, Vec<i32>>> = BTreeMap::new();
    for (topic, partition) in partitions {
        let leader = *leaders.get(&(topic.clone(), *partition)).context("a share-partition has no leader")?;
        by_leader.entry(leader).or_default().entry(topic.clone()).or_default().push(*partition);
    }
    for (leader, wanted) in by_leader {
        let broker = metadata.brokers.iter().find(|b| b.node_id.0 == leader).context("leader not in metadata")?;
        let address = format!("{}:{}", broker.host.as_str(), broker.port);
        ends.extend(list_latest_offsets(connector, &address, wanted)?);
    }
    Ok(ends)
}

fn list_latest_offsets(
    connector: &Connector,
    address: &str,
    wanted: BTreeMap<String, Vec<i32>>,
) -> anyhow::Result<BTreeMap<(String, i32), i64>> {
    let mut request = ListOffsetsRequest::default();
    request.replica_id = BrokerId(CONSUMER_REPLICA_ID);
    for (topic, partitions) in wanted {
        let partitions = partitions
            .into_iter()
            .map(|index| ListOffsetsPartition::default().with_partition_index(index).with_timestamp(LATEST_TIMESTAMP))
            .collect();
        request.topics.push(
            ListOffsetsTopic::default().with_name(TopicName(StrBytes::from_string(topic))).with_partitions(partitions),
        );
    }
    let answer =
        connector.call(address, ApiKey::ListOffsets, LIST_OFFSETS_VERSION, RequestKind::ListOffsets(request))?;
    let ResponseKind::ListOffsets(response) = answer else { bail!("ListOffsets answered in another kind") };
    let mut ends = BTreeMap::new();
    for topic in response.topics {
        for partition in topic.partitions {
            check(
                partition.error_code,
                None,
                &format!("the log end of {}-{}", topic.name.as_str(), partition.partition_index),
            )?;
            ends.insert((topic.name.to_string(), partition.partition_index), partition.offset);
        }
    }
    Ok(ends)
}
