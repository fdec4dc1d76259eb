//! `sluice topic add-partitions` and `sluice topic trim`: the two commands that change a
//! topic's partitions rather than its configs. Adding partitions is CreatePartitions (to a
//! new total, as kafka-topics `--partitions`, or by +N, as rpk `--num`); trimming is
//! DeleteRecords at each partition's leader, which moves the log start forward (rpk's
//! `trim-prefix`), the records before it gone for every reader.

use std::collections::BTreeMap;

use anyhow::{bail, Context};
use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
use kafka_protocol::messages::delete_records_request::{DeleteRecordsPartition, DeleteRecordsTopic};
use kafka_protocol::messages::{CreatePartitionsRequest, DeleteRecordsRequest};
use serde::Serialize;
use sluice_client::check;

use crate::cluster_queries::topic_name;
use crate::kafka_connection::{Cluster, ConnectionArgs};
use crate::offset_spec::OffsetSpec;
use crate::output::{count, Format, TextTable};

/// How long the broker may take to add partitions or to delete records.
const BROKER_TIMEOUT_MS: i32 = 30_000;
const CREATE_PARTITIONS_VERSION: i16 = 3;
const DELETE_RECORDS_VERSION: i16 = 2;

#[derive(Debug, clap::Args)]
pub struct AddPartitionsArgs {
    /// One or more topics, each grown the same way.
    #[arg(required = true)]
    topics: Vec<String>,
    /// Partitions to add (+N or N, as rpk's --num), or with --total the count to reach.
    #[arg(long, short = 'n', value_name = "N")]
    num: String,
    /// --num is the new total (kafka-topics --partitions), not the count to add.
    #[arg(long)]
    total: bool,
}

#[derive(Debug, clap::Args)]
pub struct TrimArgs {
    topic: String,
    /// Partitions to trim, comma separated (default all).
    #[arg(long, short = 'p', value_delimiter = ',', value_name = "P,P")]
    partitions: Vec<i32>,
    /// The new log start: an offset, end (every record), -N (keep the last N) or @TIME
    /// (drop records before this time: ms since the epoch or RFC 3339).
    #[arg(long, short = 'o', allow_hyphen_values = true, value_name = "POSITION")]
    offset: OffsetSpec,
}

pub fn add_partitions(connection: &ConnectionArgs, args: AddPartitionsArgs) -> anyhow::Result<()> {
    let mut cluster = connection.cluster()?;
    let (added, total) = if args.total {
        (None, Some(args.num.parse::<i32>().with_context(|| format!("--num {}: not a count", args.num))?))
    } else {
        let added = args.num.trim_start_matches('+').parse::<i32>();
        (Some(added.with_context(|| format!("--num {}: not a count (+N adds N)", args.num))?), None)
    };
    if let [topic] = args.topics.as_slice() {
        return add_to_topic(&mut cluster, topic, added, total);
    }
    let mut failed = 0;
    for topic in &args.topics {
        if let Err(error) = add_to_topic(&mut cluster, topic, added, total) {
            failed += 1;
            eprintln!("error: {error:#}");
        }
    }
    if failed > 0 {
        bail!("{} not grown", count(failed, "topic"));
    }
    Ok(())
}

/// Grows one topic by `added` partitions or to `total`.
fn add_to_topic(cluster: &mut Cluster, name: &str, added: Option<i32>, total: Option<i32>) -> anyhow::Result<()> {
    let (_, topic) = cluster.topic(name)?;
    let current = i32::try_from(topic.partitions.len())?;
    let total = total.unwrap_or_else(|| current.saturating_add(added.unwrap_or(0)));
    if total <= current {
        bail!("topic {name} has {}: partitions can only be added", count(current as usize, "partition"));
    }
    let mut request = CreatePartitionsRequest::default();
    request.topics =
        vec![CreatePartitionsTopic::default().with_name(topic_name(name)).with_count(total).with_assignments(None)];
    request.timeout_ms = BROKER_TIMEOUT_MS;
    let response = cluster.bootstrap.send(CREATE_PARTITIONS_VERSION, request)?;
    for result in &response.results {
        check(result.error_code, result.error_message.as_deref(), &format!("adding partitions to {name}"))?;
    }
    let added = (total - current) as usize;
    println!("added {} to topic {name}: {} now", count(added, "partition"), count(total as usize, "partition"));
    Ok(())
}

#[derive(Serialize)]
struct TrimmedPartition {
    topic: String,
    partition: i32,
    log_start: i64,
}

pub fn trim(connection: &ConnectionArgs, format: Format, args: TrimArgs) -> anyhow::Result<()> {
    if args.offset == OffsetSpec::Start {
        bail!("--offset start trims nothing: give an offset, end, -N or @TIME");
    }
    let mut cluster = connection.cluster()?;
    let (metadata, topic) = cluster.topic(&args.topic)?;
    let wanted = (!args.partitions.is_empty()).then_some(args.partitions.as_slice());
    let offsets = args.offset.resolve(&mut cluster, &args.topic, wanted)?;
    let addresses = Cluster::addresses(&metadata);
    let mut by_leader: BTreeMap<i32, Vec<DeleteRecordsPartition>> = BTreeMap::new();
    for partition in &topic.partitions {
        let Some(&offset) = offsets.get(&partition.partition_index) else { continue };
        by_leader.entry(partition.leader_id.0).or_default().push(
            DeleteRecordsPartition::default().with_partition_index(partition.partition_index).with_offset(offset),
        );
    }
    let mut trimmed = Vec::new();
    for (leader, partitions) in by_leader {
        let address =
            addresses.get(&leader).with_context(|| format!("topic {} has a partition without a leader", args.topic))?;
        let mut request = DeleteRecordsRequest::default();
        request.topics =
            vec![DeleteRecordsTopic::default().with_name(topic_name(&args.topic)).with_partitions(partitions)];
        request.timeout_ms = BROKER_TIMEOUT_MS;
        let response = cluster.connect(address)?.send(DELETE_RECORDS_VERSION, request)?;
        for answered in response.topics {
            for partition in answered.partitions {
                let what = format!("trimming {}-{}", args.topic, partition.partition_index);
                check(partition.error_code, None, &what)?;
                trimmed.push(TrimmedPartition {
                    topic: args.topic.clone(),
                    partition: partition.partition_index,
                    log_start: partition.low_watermark,
                });
            }
        }
    }
    trimmed.sort_by_key(|t| t.partition);
    if format.document(&trimmed)? {
        return Ok(());
    }
    let mut table = TextTable::new(&["TOPIC", "PARTITION", "LOG-START"]).numeric(&["PARTITION", "LOG-START"]);
    for partition in &trimmed {
        table.row([partition.topic.clone(), partition.partition.to_string(), partition.log_start.to_string()]);
    }
    table.print();
    Ok(())
}
