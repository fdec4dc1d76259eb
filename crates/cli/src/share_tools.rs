//! `sluice share`: list share groups (KIP-932) and describe one: its members, their
//! assignments and, per share-partition, the start offset (every record before it is
//! acknowledged or archived), the log end and the lag between them. librdkafka has no
//! share-group API, so both speak the protocol directly (ListGroups v5 of type "share" to
//! every broker; FindCoordinator, then ShareGroupDescribe and DescribeShareGroupOffsets at
//! the group's coordinator), over PLAINTEXT listeners, as `sluice acl` does. `kafka-share-groups.sh` remains the tool for
//! resetting and deleting.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Context};
use kafka_protocol::messages::describe_share_group_offsets_request::DescribeShareGroupOffsetsRequestGroup;
use kafka_protocol::messages::{
    ApiKey, DescribeShareGroupOffsetsRequest, FindCoordinatorRequest, GroupId, ListGroupsRequest, RequestKind,
    ResponseKind, ShareGroupDescribeRequest,
};
use kafka_protocol::protocol::StrBytes;
use rdkafka::consumer::{BaseConsumer, Consumer};

use crate::security_tools::{call, check};

const METADATA_TIMEOUT: Duration = Duration::from_secs(10);
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
    /// Broker to bootstrap from (a PLAINTEXT listener).
    #[arg(long, short = 'b', env = "SLUICE_BOOTSTRAP", default_value = "127.0.0.1:9092")]
    bootstrap: String,
    #[command(subcommand)]
    command: ShareCommand,
}

pub fn share(args: ShareArgs) -> anyhow::Result<()> {
    match args.command {
        ShareCommand::List => {
            // Each coordinator lists its own groups: ListGroups (share type) to every broker.
            let consumer: BaseConsumer =
                rdkafka::config::ClientConfig::new().set("bootstrap.servers", &args.bootstrap).create()?;
            let metadata = consumer.fetch_metadata(None, METADATA_TIMEOUT)?;
            let mut listed = BTreeMap::new();
            for broker in metadata.brokers() {
                let mut request = ListGroupsRequest::default();
                request.types_filter = vec![StrBytes::from_static_str("share")];
                let address = format!("{}:{}", broker.host(), broker.port());
                let answer = call(&address, ApiKey::ListGroups, LIST_GROUPS_VERSION, RequestKind::ListGroups(request))?;
                let ResponseKind::ListGroups(response) = answer else { bail!("ListGroups answered in another kind") };
                check(response.error_code, None, &format!("listing the groups of broker {}", broker.id()))?;
                for group in response.groups {
                    listed.insert(group.group_id.to_string(), group.group_state.to_string());
                }
            }
            for (name, state) in listed {
                println!("{name}\t{state}");
            }
            Ok(())
        }
        ShareCommand::Describe { group } => describe(&args.bootstrap, &group),
    }
}

/// The host:port of `group`'s coordinator.
fn coordinator(bootstrap: &str, group: &str) -> anyhow::Result<String> {
    let mut request = FindCoordinatorRequest::default();
    request.key_type = KEY_TYPE_GROUP;
    request.coordinator_keys = vec![StrBytes::from_string(group.to_string())];
    let answer =
        call(bootstrap, ApiKey::FindCoordinator, FIND_COORDINATOR_VERSION, RequestKind::FindCoordinator(request))?;
    let ResponseKind::FindCoordinator(response) = answer else { bail!("FindCoordinator answered in another kind") };
    let found = response.coordinators.first().context("FindCoordinator: no answer")?;
    check(found.error_code, found.error_message.as_ref(), "finding the group's coordinator")?;
    Ok(format!("{}:{}", found.host.as_str(), found.port))
}

fn describe(bootstrap: &str, group: &str) -> anyhow::Result<()> {
    let coordinator = coordinator(bootstrap, group)?;
    let mut request = ShareGroupDescribeRequest::default();
    request.group_ids = vec![GroupId(StrBytes::from_string(group.to_string()))];
    let answer = call(
        &coordinator,
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
    let answer = call(
        &coordinator,
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
    let consumer: BaseConsumer = rdkafka::config::ClientConfig::new().set("bootstrap.servers", bootstrap).create()?;
    println!("TOPIC\tPARTITION\tSTART-OFFSET\tLOG-END\tLAG");
    for ((topic, partition), start) in starts {
        let (_, end) = consumer.fetch_watermarks(&topic, partition, METADATA_TIMEOUT)?;
        if start < 0 {
            println!("{topic}\t{partition}\t-\t{end}\t-");
        } else {
            println!("{topic}\t{partition}\t{start}\t{end}\t{}", (end - start).max(0));
        }
    }
    Ok(())
}
