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

use crate::kafka_connection::{ConnectionArgs, Connector};
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
    #[command(flatten)]
    connection: ConnectionArgs,
    #[command(subcommand)]
    command: ShareCommand,
}

pub fn share(args: ShareArgs) -> anyhow::Result<()> {
    let connector = args.connection.connector()?;
    let bootstrap = args.connection.bootstrap();
    match args.command {
        ShareCommand::List => list(&connector, bootstrap),
        ShareCommand::Describe { group } => describe(&connector, bootstrap, &group),
    }
}

/// Each coordinator lists its own groups: ListGroups (share type) to every broker.
fn list(connector: &Connector, bootstrap: &str) -> anyhow::Result<()> {
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
    for (name, state) in listed {
        println!("{name}\t{state}");
    }
    Ok(())
}

/// Metadata of `topics` (`None`: all; empty: only the brokers).
fn metadata(connector: &Connector, bootstrap: &str, topics: Option<Vec<String>>) -> anyhow::Result<MetadataResponse> {
    let mut request = MetadataRequest::default();
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
fn coordinator(connector: &Connector, bootstrap: &str, group: &str) -> anyhow::Result<String> {
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

fn describe(connector: &Connector, bootstrap: &str, group: &str) -> anyhow::Result<()> {
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
    println!("share group {group}  state {}  epoch {}", described.group_state.as_str(), described.group_epoch);
    for member in &described.members {
        let assigned: Vec<String> = member
            .assignment
            .topic_partitions
            .iter()
            .map(|tp| format!("{}{:?}", tp.topic_name.as_str(), tp.partitions))
            .collect();
        println!(
            "  member {}  client {}  host {}  assigned {}",
            member.member_id.as_str(),
            member.client_id.as_str(),
            member.client_host.as_str(),
            assigned.join(" ")
        );
    }

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
    println!("TOPIC\tPARTITION\tSTART-OFFSET\tLOG-END\tLAG");
    for ((topic, partition), start) in starts {
        let end = *ends.get(&(topic.clone(), partition)).context("no log end for a share-partition")?;
        if start < 0 {
            println!("{topic}\t{partition}\t-\t{end}\t-");
        } else {
            println!("{topic}\t{partition}\t{start}\t{end}\t{}", (end - start).max(0));
        }
    }
    Ok(())
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
