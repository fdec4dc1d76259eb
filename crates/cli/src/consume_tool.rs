//! `sluice consume`: prints records of a topic. The topic, its partitions and the start
//! offsets are checked and resolved through `sluice-client` first (a missing topic or an
//! unreachable broker is said at once, in the broker's words); then librdkafka fetches.
//! Alone it reads the partitions it is given, from where `--offset` says; with `--group` it
//! joins that group, reads what the group assigns it from the group's committed offsets and
//! commits what it printed, as any member would.

use std::collections::BTreeSet;
use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::bail;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

use crate::kafka_connection::ConnectionArgs;
use crate::offset_spec::OffsetSpec;
use crate::output::rfc3339_millis;
use crate::record_format::{ConsumedRecord, RecordFormat};

/// How long one poll of librdkafka waits before the limits (`--num`, idle time) are checked.
const POLL_INTERVAL: Duration = Duration::from_millis(200);
/// The group.id of a consumer that is no group's member (it commits nothing).
const STANDALONE_GROUP_ID: &str = "sluice-cli";

#[derive(Debug, clap::Args)]
pub struct ConsumeArgs {
    topic: String,
    /// Where to start: start, end, an offset, -N (N before the end), +N (N after the start)
    /// or @TIME (ms since the epoch or RFC 3339). Default end. With --group: start or end,
    /// for partitions the group has no committed offset for.
    #[arg(long, short = 'o', allow_hyphen_values = true, value_name = "POSITION")]
    offset: Option<OffsetSpec>,
    /// The same as --offset start.
    #[arg(long, conflicts_with = "offset")]
    from_beginning: bool,
    /// Partitions to read, comma separated (default all).
    #[arg(long, short = 'p', value_delimiter = ',', value_name = "P,P")]
    partitions: Vec<i32>,
    /// Stop after this many records (-c as in kcat).
    #[arg(long, short = 'n', short_alias = 'c', visible_alias = "max-messages")]
    num: Option<u64>,
    /// Read as a member of this consumer group: the group assigns the partitions and the
    /// offsets of the records printed are committed.
    #[arg(long, short = 'g', conflicts_with = "partitions")]
    group: Option<String>,
    /// Stop at the end: once every partition read has reached its log end (kcat's -e).
    #[arg(long, short = 'e')]
    exit_at_end: bool,
    /// Stop when no record arrives for this long (milliseconds).
    #[arg(long)]
    idle_timeout_ms: Option<u64>,
    /// Print partition, offset, timestamp, key and header count before each value.
    #[arg(long)]
    verbose: bool,
}

/// A librdkafka client configured by `-b` and `-X`.
fn rdkafka_config(connection: &ConnectionArgs) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", connection.bootstrap_list());
    // Read-only commands create nothing, whatever they ask librdkafka for.
    config.set("allow.auto.create.topics", "false");
    for setting in connection.raw_settings() {
        if let Some((key, value)) = setting.split_once('=') {
            config.set(key.trim(), value.trim());
        }
    }
    config
}

pub fn consume(connection: &ConnectionArgs, format: &str, args: ConsumeArgs) -> anyhow::Result<()> {
    let format = RecordFormat::parse(format)?;
    if args.verbose && format != RecordFormat::Lines {
        bail!("--verbose is a text format: with --format, name the fields (%p %o %T %k %h)");
    }
    let start = if args.from_beginning { Some(OffsetSpec::Start) } else { args.offset };
    // The topic must exist (and the broker answer) before librdkafka is asked to fetch: it
    // would wait in silence for either.
    let mut cluster = connection.cluster()?;
    let (_, topic) = cluster.topic(&args.topic)?;
    let mut config = rdkafka_config(connection);
    config.set("enable.partition.eof", if args.exit_at_end { "true" } else { "false" });
    let consumer: BaseConsumer = match &args.group {
        Some(group) => {
            let reset = match start.unwrap_or(OffsetSpec::End) {
                OffsetSpec::Start => "earliest",
                OffsetSpec::End => "latest",
                _ => bail!(
                    "with --group, --offset is start or end (where the group has no committed offset); \
                     to move its offsets: sluice group seek"
                ),
            };
            let consumer: BaseConsumer = config
                .set("group.id", group)
                .set("auto.offset.reset", reset)
                // The offset of a record is stored once it is printed (not when librdkafka
                // hands it over), committed in the background and once more at the end.
                .set("enable.auto.commit", "true")
                .set("enable.auto.offset.store", "false")
                .create()?;
            consumer.subscribe(&[&args.topic])?;
            consumer
        }
        None => {
            let consumer: BaseConsumer =
                config.set("group.id", STANDALONE_GROUP_ID).set("enable.auto.commit", "false").create()?;
            let wanted = if args.partitions.is_empty() {
                None
            } else {
                for partition in &args.partitions {
                    if !topic.partitions.iter().any(|p| p.partition_index == *partition) {
                        bail!("topic {} has no partition {partition}", args.topic);
                    }
                }
                Some(args.partitions.as_slice())
            };
            let offsets = start.unwrap_or(OffsetSpec::End).resolve(&mut cluster, &args.topic, wanted)?;
            let mut assignment = TopicPartitionList::new();
            for (partition, offset) in offsets {
                assignment.add_partition_offset(&args.topic, partition, Offset::Offset(offset))?;
            }
            consumer.assign(&assignment)?;
            consumer
        }
    };
    let result = print_records(&consumer, &format, &args);
    if let Some(group) = &args.group {
        // What was printed is committed even when the output failed half-way; nothing to
        // commit (all of it committed in the background already) is no failure.
        let assigned = consumer.assignment().map_or(0, |assigned| assigned.count());
        match consumer.commit_consumer_state(CommitMode::Sync) {
            Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) | Ok(()) => {}
            Err(_) if assigned == 0 => {}
            Err(error) => eprintln!("warning: committing the offsets of group {group}: {error}"),
        }
    }
    result
}

fn print_records(consumer: &BaseConsumer, format: &RecordFormat, args: &ConsumeArgs) -> anyhow::Result<()> {
    let idle = args.idle_timeout_ms.map(Duration::from_millis);
    let mut last_record = Instant::now();
    let mut count = 0u64;
    // Partitions whose log end was reached since their last record (with --exit-at-end).
    let mut at_end = BTreeSet::new();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    while args.num.is_none_or(|max| count < max) {
        if idle.is_some_and(|idle| last_record.elapsed() >= idle) {
            break;
        }
        let Some(message) = consumer.poll(POLL_INTERVAL) else { continue };
        let message = match message {
            Err(KafkaError::PartitionEOF(partition)) => {
                at_end.insert(partition);
                let assigned = consumer.assignment()?;
                let partitions: Vec<i32> = assigned.elements().iter().map(|e| e.partition()).collect();
                if !partitions.is_empty() && partitions.iter().all(|p| at_end.contains(p)) {
                    break;
                }
                continue;
            }
            other => other?,
        };
        at_end.remove(&message.partition());
        last_record = Instant::now();
        count += 1;
        let headers: Vec<(&str, Option<&[u8]>)> =
            message.headers().map(|h| h.iter().map(|h| (h.key, h.value)).collect()).unwrap_or_default();
        let record = ConsumedRecord {
            topic: message.topic(),
            partition: message.partition(),
            offset: message.offset(),
            timestamp: message.timestamp().to_millis(),
            key: message.key(),
            value: message.payload(),
            headers,
        };
        match format {
            RecordFormat::Json => record.write_json(&mut out)?,
            RecordFormat::Template(template) => template.write(&mut out, &record)?,
            RecordFormat::Lines if args.verbose => {
                let key = record.key.map_or("-".into(), String::from_utf8_lossy);
                let timestamp = record.timestamp.map_or("-".to_string(), rfc3339_millis);
                writeln!(
                    out,
                    "partition={} offset={} timestamp={timestamp} key={key} headers={}\t{}",
                    record.partition,
                    record.offset,
                    record.headers.len(),
                    String::from_utf8_lossy(record.value.unwrap_or_default()),
                )?;
            }
            RecordFormat::Lines => {
                out.write_all(record.value.unwrap_or_default())?;
                out.write_all(b"\n")?;
            }
        }
        if args.group.is_some() {
            out.flush()?;
            consumer.store_offset_from_message(&message)?;
        }
    }
    out.flush()?;
    Ok(())
}
