//! `sluice topic` and `sluice group`. They speak the Kafka protocol through
//! `sluice-client`, over any listener (TLS, SASL), so a refused request is reported in the
//! broker's own words and nothing is created by a command that only reads.

use std::collections::BTreeMap;

use anyhow::bail;
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::incremental_alter_configs_request::{AlterConfigsResource, AlterableConfig};
use kafka_protocol::messages::{
    CreateTopicsRequest, DeleteGroupsRequest, DeleteTopicsRequest, DescribeConfigsRequest, GroupId,
    IncrementalAlterConfigsRequest, ListGroupsRequest,
};
use kafka_protocol::protocol::StrBytes;
use serde::Serialize;
use sluice_client::check;

use crate::cluster_queries::{
    committed_offsets, coordinator, described_group, list_offsets, offsets_of_topics, topic_name, EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
};
use crate::group_members::{assignment_cell, classic_group, consumer_protocol_group, MemberView};
use crate::group_offsets::{commit, ensure_without_members};
use crate::kafka_connection::{Cluster, ConnectionArgs};
use crate::offset_spec::OffsetSpec;
use crate::output::{count, ids, Format, TextTable};

/// How long the broker may take to create or delete a topic.
const BROKER_TIMEOUT_MS: i32 = 30_000;

const CREATE_TOPICS_VERSION: i16 = 5;
const DELETE_TOPICS_VERSION: i16 = 5;
const DESCRIBE_CONFIGS_VERSION: i16 = 4;
const ALTER_CONFIGS_VERSION: i16 = 1;
/// DescribeConfigs / IncrementalAlterConfigs resource type of a topic.
const RESOURCE_TOPIC: i8 = 2;
const CONFIG_SET: i8 = 0;
const CONFIG_DELETE: i8 = 1;
const DELETE_GROUPS_VERSION: i16 = 2;
/// ListGroups v5 filters by group type (classic and consumer; `sluice share` lists shares).
const LIST_GROUPS_VERSION: i16 = 5;
/// DeleteGroups error codes said in the tool's own words.
const NON_EMPTY_GROUP: i16 = 68;
const GROUP_ID_NOT_FOUND: i16 = 69;

#[derive(Debug, clap::Subcommand)]
pub enum TopicCommand {
    /// Create a topic.
    Create {
        name: String,
        #[arg(long, short = 'p', default_value_t = 1)]
        partitions: i32,
        /// Topic config, repeatable: --config retention.ms=60000
        #[arg(long = "config", short = 'c', value_name = "KEY=VALUE")]
        configs: Vec<String>,
    },
    /// List topics with their partition and replica counts.
    List,
    /// Show partitions (leader, replicas, ISR, offsets) and configs of a topic.
    Describe { name: String },
    /// Set or remove configs of a topic.
    AlterConfig {
        name: String,
        /// Config to set, repeatable: --set retention.ms=60000
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
        /// Config to return to its default, repeatable: --delete retention.ms
        #[arg(long = "delete", value_name = "KEY")]
        delete: Vec<String>,
    },
    /// Delete a topic.
    Delete { name: String },
    /// Add partitions to topics: --num +N (or N) adds N, --num N --total grows each to N.
    AddPartitions(crate::partition_tools::AddPartitionsArgs),
    /// Delete the records before an offset (DeleteRecords): the log start moves forward.
    Trim(crate::partition_tools::TrimArgs),
}

#[derive(Debug, clap::Args)]
pub struct TopicArgs {
    #[command(subcommand)]
    command: TopicCommand,
}

/// `KEY=VALUE` pairs of a flag.
fn pairs(flag: &str, given: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    given
        .iter()
        .map(|pair| match pair.split_once('=') {
            Some((key, value)) if !key.trim().is_empty() => Ok((key.trim().to_string(), value.trim().to_string())),
            _ => bail!("{flag} {pair:?} is not KEY=VALUE"),
        })
        .collect()
}

pub fn topic(connection: &ConnectionArgs, format: Format, args: TopicArgs) -> anyhow::Result<()> {
    match args.command {
        TopicCommand::Create { name, partitions, configs } => {
            let configs = pairs("--config", &configs)?;
            let mut cluster = connection.cluster()?;
            let mut topic = CreatableTopic::default();
            topic.name = topic_name(&name);
            topic.num_partitions = partitions;
            topic.replication_factor = -1;
            topic.configs = configs
                .into_iter()
                .map(|(key, value)| {
                    CreatableTopicConfig::default()
                        .with_name(StrBytes::from_string(key))
                        .with_value(Some(StrBytes::from_string(value)))
                })
                .collect();
            let mut request = CreateTopicsRequest::default();
            request.topics = vec![topic];
            request.timeout_ms = BROKER_TIMEOUT_MS;
            let response = cluster.bootstrap.send(CREATE_TOPICS_VERSION, request)?;
            for result in &response.topics {
                check(result.error_code, result.error_message.as_deref(), &format!("creating topic {name}"))?;
            }
            println!("created topic {name} with {}", count(usize::try_from(partitions).unwrap_or(0), "partition"));
        }
        TopicCommand::AddPartitions(args) => crate::partition_tools::add_partitions(connection, args)?,
        TopicCommand::Trim(args) => crate::partition_tools::trim(connection, format, args)?,
        TopicCommand::List => list_topics(&mut connection.cluster()?, format)?,
        TopicCommand::Describe { name } => describe_topic(&mut connection.cluster()?, format, &name)?,
        TopicCommand::AlterConfig { name, set, delete } => {
            let set = pairs("--set", &set)?;
            if set.is_empty() && delete.is_empty() {
                bail!("say what to change: --set KEY=VALUE or --delete KEY");
            }
            let mut cluster = connection.cluster()?;
            cluster.topic(&name)?;
            let mut resource = AlterConfigsResource::default();
            resource.resource_type = RESOURCE_TOPIC;
            resource.resource_name = StrBytes::from_string(name.clone());
            for (key, value) in &set {
                resource.configs.push(
                    AlterableConfig::default()
                        .with_name(StrBytes::from_string(key.clone()))
                        .with_config_operation(CONFIG_SET)
                        .with_value(Some(StrBytes::from_string(value.clone()))),
                );
            }
            for key in &delete {
                resource.configs.push(
                    AlterableConfig::default()
                        .with_name(StrBytes::from_string(key.clone()))
                        .with_config_operation(CONFIG_DELETE),
                );
            }
            let mut request = IncrementalAlterConfigsRequest::default();
            request.resources = vec![resource];
            let response = cluster.bootstrap.send(ALTER_CONFIGS_VERSION, request)?;
            for result in &response.responses {
                check(result.error_code, result.error_message.as_deref(), &format!("altering topic {name}"))?;
            }
            println!("altered {} of topic {name}", count(set.len() + delete.len(), "config"));
        }
        TopicCommand::Delete { name } => {
            let mut cluster = connection.cluster()?;
            let mut request = DeleteTopicsRequest::default();
            request.topic_names = vec![topic_name(&name)];
            request.timeout_ms = BROKER_TIMEOUT_MS;
            let response = cluster.bootstrap.send(DELETE_TOPICS_VERSION, request)?;
            for result in &response.responses {
                if result.error_code == 3 {
                    bail!("topic {name} does not exist");
                }
                check(result.error_code, result.error_message.as_deref(), &format!("deleting topic {name}"))?;
            }
            println!("deleted topic {name}");
        }
    }
    Ok(())
}

#[derive(Serialize)]
struct TopicSummary {
    name: String,
    partitions: usize,
    replicas: usize,
    internal: bool,
}

fn list_topics(cluster: &mut Cluster, format: Format) -> anyhow::Result<()> {
    let metadata = cluster.metadata(None)?;
    let mut topics: Vec<TopicSummary> = metadata
        .topics
        .iter()
        .map(|topic| TopicSummary {
            name: topic.name.as_ref().map_or(String::new(), |n| n.to_string()),
            partitions: topic.partitions.len(),
            replicas: topic.partitions.first().map_or(0, |p| p.replica_nodes.len()),
            internal: topic.is_internal,
        })
        .collect();
    topics.sort_by(|a, b| a.name.cmp(&b.name));
    if format.document(&topics)? {
        return Ok(());
    }
    let mut table = TextTable::new(&["NAME", "PARTITIONS", "REPLICAS"]).numeric(&["PARTITIONS", "REPLICAS"]);
    for topic in &topics {
        table.row([topic.name.clone(), topic.partitions.to_string(), topic.replicas.to_string()]);
    }
    table.print();
    Ok(())
}

#[derive(Serialize)]
struct PartitionView {
    partition: i32,
    leader: i32,
    replicas: Vec<i32>,
    isr: Vec<i32>,
    log_start: Option<i64>,
    high_watermark: Option<i64>,
}

#[derive(Serialize)]
struct ConfigView {
    name: String,
    value: Option<String>,
    source: &'static str,
}

#[derive(Serialize)]
struct TopicView {
    name: String,
    partitions: Vec<PartitionView>,
    configs: Vec<ConfigView>,
}

/// Kafka's name of a config's source (DescribeConfigs `config_source`).
pub(crate) fn config_source(code: i8) -> &'static str {
    match code {
        1 => "DYNAMIC_TOPIC_CONFIG",
        2 => "DYNAMIC_BROKER_CONFIG",
        3 => "DYNAMIC_DEFAULT_BROKER_CONFIG",
        4 => "STATIC_BROKER_CONFIG",
        5 => "DEFAULT_CONFIG",
        6 => "DYNAMIC_BROKER_LOGGER_CONFIG",
        _ => "UNKNOWN",
    }
}

fn describe_topic(cluster: &mut Cluster, format: Format, name: &str) -> anyhow::Result<()> {
    let (metadata, topic) = cluster.topic(name)?;
    let mut leaders: BTreeMap<i32, Vec<i32>> = BTreeMap::new();
    for partition in &topic.partitions {
        leaders.entry(partition.leader_id.0).or_default().push(partition.partition_index);
    }
    let addresses = Cluster::addresses(&metadata);
    let mut starts = BTreeMap::new();
    let mut ends = BTreeMap::new();
    for (leader, partitions) in &leaders {
        let Some(address) = addresses.get(leader) else { continue };
        let mut connection = cluster.connect(address)?;
        starts.extend(list_offsets(&mut connection, name, partitions, EARLIEST_TIMESTAMP)?);
        ends.extend(list_offsets(&mut connection, name, partitions, LATEST_TIMESTAMP)?);
    }
    let mut partitions: Vec<PartitionView> = topic
        .partitions
        .iter()
        .map(|p| PartitionView {
            partition: p.partition_index,
            leader: p.leader_id.0,
            replicas: p.replica_nodes.iter().map(|id| id.0).collect(),
            isr: p.isr_nodes.iter().map(|id| id.0).collect(),
            log_start: starts.get(&p.partition_index).copied(),
            high_watermark: ends.get(&p.partition_index).copied(),
        })
        .collect();
    partitions.sort_by_key(|p| p.partition);

    let mut request = DescribeConfigsRequest::default();
    request.resources = vec![DescribeConfigsResource::default()
        .with_resource_type(RESOURCE_TOPIC)
        .with_resource_name(StrBytes::from_string(name.to_string()))
        .with_configuration_keys(None)];
    let response = cluster.bootstrap.send(DESCRIBE_CONFIGS_VERSION, request)?;
    let mut configs = Vec::new();
    for result in response.results {
        check(result.error_code, result.error_message.as_deref(), &format!("configs of topic {name}"))?;
        for config in result.configs {
            let value = if config.is_sensitive { None } else { config.value.map(|v| v.to_string()) };
            configs.push(ConfigView {
                name: config.name.to_string(),
                value,
                source: config_source(config.config_source),
            });
        }
    }
    configs.sort_by(|a, b| a.name.cmp(&b.name));
    let view = TopicView { name: name.to_string(), partitions, configs };
    if format.document(&view)? {
        return Ok(());
    }
    println!("topic {name}: {}", count(view.partitions.len(), "partition"));
    println!();
    let offset = |o: Option<i64>| o.map_or("-".to_string(), |o| o.to_string());
    let mut table = TextTable::new(&["PARTITION", "LEADER", "REPLICAS", "ISR", "LOG-START", "HIGH-WATERMARK"])
        .numeric(&["PARTITION", "LEADER", "LOG-START", "HIGH-WATERMARK"]);
    for p in &view.partitions {
        let leader = if p.leader < 0 { "none".to_string() } else { p.leader.to_string() };
        table.row([
            p.partition.to_string(),
            leader,
            ids(&p.replicas),
            ids(&p.isr),
            offset(p.log_start),
            offset(p.high_watermark),
        ]);
    }
    table.print();
    println!();
    let mut table = TextTable::new(&["CONFIG", "VALUE", "SOURCE"]);
    for config in &view.configs {
        table.row([config.name.clone(), config.value.clone().unwrap_or_else(|| "-".into()), config.source.to_string()]);
    }
    table.print();
    Ok(())
}

#[derive(Debug, clap::Subcommand)]
pub enum GroupCommand {
    /// List consumer groups with their state.
    List,
    /// Show a group's members and, per partition, committed offset, log end and lag.
    Describe { group: String },
    /// Move a group's committed offsets (the group must have no members). Prints the plan;
    /// commits it only with --execute, as kafka-consumer-groups does.
    ResetOffsets {
        group: String,
        /// Topic whose partitions are reset (all of its partitions).
        #[arg(long)]
        topic: String,
        #[arg(long, conflicts_with_all = ["to_latest", "to_offset"])]
        to_earliest: bool,
        #[arg(long, conflicts_with_all = ["to_earliest", "to_offset"])]
        to_latest: bool,
        #[arg(long, conflicts_with_all = ["to_earliest", "to_latest"])]
        to_offset: Option<i64>,
        #[arg(long)]
        execute: bool,
    },
    /// Move a group's committed offsets, rpk-style: --to start|end|TIME, --to-offset N or
    /// --shift-by N. Prints the plan; commits it only with --execute.
    Seek(crate::group_offsets::SeekArgs),
    /// Delete a group's committed offsets for a topic (OffsetDelete).
    DeleteOffsets(crate::group_offsets::DeleteOffsetsArgs),
    /// Delete groups without members (and their committed offsets).
    Delete { groups: Vec<String> },
}

#[derive(Debug, clap::Args)]
pub struct GroupArgs {
    #[command(subcommand)]
    command: GroupCommand,
}

#[derive(Serialize)]
struct GroupSummary {
    name: String,
    state: String,
}

pub fn group(connection: &ConnectionArgs, format: Format, args: GroupArgs) -> anyhow::Result<()> {
    let mut cluster = connection.cluster()?;
    match args.command {
        GroupCommand::List => {
            let metadata = cluster.metadata(Some(&[]))?;
            let mut listed = Vec::new();
            for address in Cluster::addresses(&metadata).values() {
                let mut request = ListGroupsRequest::default();
                request.types_filter =
                    vec![StrBytes::from_static_str("classic"), StrBytes::from_static_str("consumer")];
                let response = cluster.connect(address)?.send(LIST_GROUPS_VERSION, request)?;
                check(response.error_code, None, &format!("listing the groups of {address}"))?;
                listed.extend(
                    response
                        .groups
                        .into_iter()
                        .map(|g| GroupSummary { name: g.group_id.to_string(), state: g.group_state.to_string() }),
                );
            }
            listed.sort_by(|a, b| a.name.cmp(&b.name));
            if format.document(&listed)? {
                return Ok(());
            }
            let mut table = TextTable::new(&["GROUP", "STATE"]);
            for group in &listed {
                table.row([group.name.clone(), group.state.clone()]);
            }
            table.print();
        }
        GroupCommand::Describe { group } => describe_group(&mut cluster, format, &group)?,
        GroupCommand::Seek(args) => crate::group_offsets::seek(&mut cluster, format, args)?,
        GroupCommand::DeleteOffsets(args) => crate::group_offsets::delete_offsets(&mut cluster, args)?,
        GroupCommand::ResetOffsets { group, topic, to_earliest, to_latest, to_offset, execute } => {
            let target = match (to_earliest, to_latest, to_offset) {
                (true, _, _) => OffsetSpec::Start,
                (_, true, _) => OffsetSpec::End,
                (_, _, Some(offset)) if offset >= 0 => OffsetSpec::At(offset),
                _ => bail!("say where to: --to-earliest, --to-latest or --to-offset N (N >= 0)"),
            };
            reset_offsets(&mut cluster, &group, &topic, target, execute)?;
        }
        GroupCommand::Delete { groups } => {
            if groups.is_empty() {
                bail!("name at least one group");
            }
            let mut failed = 0;
            for group in &groups {
                match delete_group(&cluster, group) {
                    Ok(()) => println!("deleted group {group}"),
                    Err(error) => {
                        failed += 1;
                        eprintln!("error: {error:#}");
                    }
                }
            }
            if failed > 0 {
                bail!("{} not deleted", count(failed, "group"));
            }
        }
    }
    Ok(())
}

/// DeleteGroups at the group's coordinator.
fn delete_group(cluster: &Cluster, group: &str) -> anyhow::Result<()> {
    let mut request = DeleteGroupsRequest::default();
    request.groups_names = vec![GroupId(StrBytes::from_string(group.to_string()))];
    let response = coordinator(cluster, group)?.send(DELETE_GROUPS_VERSION, request)?;
    for result in &response.results {
        match result.error_code {
            GROUP_ID_NOT_FOUND => bail!("group {group} does not exist"),
            NON_EMPTY_GROUP => bail!("group {group} has active members: stop them first"),
            code => check(code, None, &format!("deleting group {group}"))?,
        }
    }
    Ok(())
}

#[derive(Serialize)]
struct LagView {
    topic: String,
    partition: i32,
    /// None: assigned to a member, nothing committed yet.
    committed: Option<i64>,
    log_end: Option<i64>,
    lag: Option<i64>,
}

#[derive(Serialize)]
struct GroupView {
    group: String,
    state: String,
    protocol: String,
    members: Vec<MemberView>,
    offsets: Vec<LagView>,
}

fn describe_group(cluster: &mut Cluster, format: Format, group: &str) -> anyhow::Result<()> {
    let mut coordinator = coordinator(cluster, group)?;
    let found = match consumer_protocol_group(cluster, coordinator.address(), group) {
        Some(found) => found,
        None => classic_group(&described_group(&mut coordinator, group)?),
    };
    // Every committed partition, and those assigned to a member that has committed nothing.
    let mut rows: BTreeMap<(String, i32), Option<i64>> =
        committed_offsets(&mut coordinator, group)?.into_iter().map(|(key, offset)| (key, Some(offset))).collect();
    for assigned in found.members.iter().flat_map(|m| &m.assignment) {
        for &partition in &assigned.partitions {
            rows.entry((assigned.topic.clone(), partition)).or_insert(None);
        }
    }
    let mut topics: Vec<&str> = rows.keys().map(|(topic, _)| topic.as_str()).collect();
    topics.dedup();
    let ends = offsets_of_topics(cluster, &topics, LATEST_TIMESTAMP)?;
    let offsets = rows
        .iter()
        .map(|((topic, partition), &committed)| {
            let log_end = ends.get(&(topic.clone(), *partition)).copied();
            LagView {
                topic: topic.clone(),
                partition: *partition,
                committed,
                log_end,
                lag: committed.zip(log_end).map(|(committed, end)| (end - committed).max(0)),
            }
        })
        .collect();
    let view = GroupView {
        group: group.to_string(),
        state: found.state,
        protocol: found.protocol,
        members: found.members,
        offsets,
    };
    if format.document(&view)? {
        return Ok(());
    }
    let protocol = if view.protocol.is_empty() { "-" } else { view.protocol.as_str() };
    println!("group {group}: {}, state {}, protocol {protocol}", count(view.members.len(), "member"), view.state);
    if !view.members.is_empty() {
        println!();
        let mut table = TextTable::new(&["MEMBER", "CLIENT-ID", "HOST", "ASSIGNED"]);
        for member in &view.members {
            table.row([
                member.member_id.clone(),
                member.client_id.clone(),
                member.host.clone(),
                assignment_cell(&member.assignment),
            ]);
        }
        table.print();
    }
    println!();
    let dash = |value: Option<i64>| value.map_or("-".to_string(), |v| v.to_string());
    let mut table = TextTable::new(&["TOPIC", "PARTITION", "COMMITTED", "LOG-END", "LAG"]).numeric(&[
        "PARTITION",
        "COMMITTED",
        "LOG-END",
        "LAG",
    ]);
    for lag in &view.offsets {
        table.row([
            lag.topic.clone(),
            lag.partition.to_string(),
            dash(lag.committed),
            dash(lag.log_end),
            dash(lag.lag),
        ]);
    }
    table.print();
    Ok(())
}

fn reset_offsets(
    cluster: &mut Cluster,
    group: &str,
    topic: &str,
    target: OffsetSpec,
    execute: bool,
) -> anyhow::Result<()> {
    let mut coordinator = coordinator(cluster, group)?;
    ensure_without_members(&mut coordinator, group)?;
    cluster.topic(topic)?;
    let offsets = target.resolve(cluster, topic, None)?;
    let mut table = TextTable::new(&["TOPIC", "PARTITION", "NEW-OFFSET"]).numeric(&["PARTITION", "NEW-OFFSET"]);
    for (partition, offset) in &offsets {
        table.row([topic.to_string(), partition.to_string(), offset.to_string()]);
    }
    table.print();
    if !execute {
        println!();
        println!("(dry run: add --execute to commit these offsets)");
        return Ok(());
    }
    let plan: Vec<(&str, i32, i64)> =
        offsets.into_iter().map(|(partition, offset)| (topic, partition, offset)).collect();
    commit(&mut coordinator, group, &plan)?;
    println!("committed new offsets for group {group}");
    Ok(())
}
