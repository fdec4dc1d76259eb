//! Client subcommands (`topic`, `produce`, `consume`, `group`, `cluster`) built on
//! librdkafka through the `rdkafka` crate, so they work against Sluice or any
//! Kafka-protocol broker exactly as other clients do.

use std::io::{BufRead, Write};
use std::time::Duration;

use anyhow::{bail, Context};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};

const METADATA_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a command tries to reach the cluster before it says it cannot.
const REACH_TIMEOUT: Duration = Duration::from_secs(8);
/// Unhealthy partitions `sluice cluster` names one by one (the rest are only counted).
const CLUSTER_PARTITIONS_LISTED_MAX: usize = 50;

/// `-b` and `-X` of the client tools; both may be given before or after the subcommand.
#[derive(Debug, clap::Args)]
pub struct Connection {
    /// Broker to bootstrap from.
    #[arg(long, short = 'b', env = "SLUICE_BOOTSTRAP", default_value = "127.0.0.1:9092", global = true)]
    bootstrap: String,
    /// Client settings, repeatable, librdkafka names: -X security.protocol=SASL_SSL
    /// -X sasl.mechanism=SCRAM-SHA-512 -X sasl.username=alice ...
    #[arg(short = 'X', value_name = "KEY=VALUE", global = true)]
    settings: Vec<String>,
}

impl Connection {
    /// A client that asks the cluster for metadata only, never creating a topic it names
    /// (a Metadata request's `allow_auto_topic_creation` is false): read-only commands
    /// create nothing.
    fn probe(&self) -> anyhow::Result<BaseConsumer> {
        Ok(self.config().set("allow.auto.create.topics", "false").create()?)
    }

    /// The cluster's metadata (of `topic` alone, or of every topic), or an error that names
    /// the bootstrap address when no broker answered within [`REACH_TIMEOUT`].
    fn metadata(&self, probe: &BaseConsumer, topic: Option<&str>) -> anyhow::Result<rdkafka::metadata::Metadata> {
        probe.fetch_metadata(topic, REACH_TIMEOUT).map_err(|error| self.unreachable(error))
    }

    /// `error` as the user should read it: a transport failure or a timeout means that no
    /// broker at the bootstrap address answered.
    fn unreachable(&self, error: rdkafka::error::KafkaError) -> anyhow::Error {
        use rdkafka::types::RDKafkaErrorCode as Code;
        match error.rdkafka_error_code() {
            Some(Code::BrokerTransportFailure | Code::AllBrokersDown | Code::OperationTimedOut | Code::Resolve) => {
                anyhow::anyhow!(
                    "cannot reach {}: no broker answered within {} s",
                    self.bootstrap,
                    REACH_TIMEOUT.as_secs()
                )
            }
            _ => anyhow::Error::new(error),
        }
    }

    fn config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.bootstrap);
        for setting in &self.settings {
            if let Some((key, value)) = setting.split_once('=') {
                config.set(key.trim(), value.trim());
            }
        }
        config
    }

    fn checked(&self) -> anyhow::Result<&Connection> {
        if let Some(bad) = self.settings.iter().find(|s| !s.contains('=')) {
            bail!("-X {bad:?} is not KEY=VALUE");
        }
        Ok(self)
    }
}

#[derive(Debug, clap::Subcommand)]
pub enum TopicCommand {
    /// Create a topic.
    Create {
        name: String,
        #[arg(long, short = 'p', default_value_t = 1)]
        partitions: i32,
        /// Topic config, repeatable: --config retention.ms=60000
        #[arg(long = "config", short = 'c')]
        configs: Vec<String>,
    },
    /// List topics.
    List,
    /// Show partitions, offsets and configs of a topic.
    Describe { name: String },
    /// Delete a topic.
    Delete { name: String },
}

#[derive(Debug, clap::Args)]
pub struct TopicArgs {
    #[command(flatten)]
    connection: Connection,
    #[command(subcommand)]
    command: TopicCommand,
}

#[derive(Debug, clap::Args)]
pub struct ProduceArgs {
    #[command(flatten)]
    connection: Connection,
    topic: String,
    /// Split each input line into key and value at the first occurrence of this string.
    #[arg(long)]
    key_separator: Option<String>,
    /// acks: 0, 1 or all.
    #[arg(long, default_value = "all")]
    acks: String,
    /// none, gzip, snappy, lz4 or zstd.
    #[arg(long, default_value = "none")]
    compression: String,
}

#[derive(Debug, clap::Args)]
pub struct ConsumeArgs {
    #[command(flatten)]
    connection: Connection,
    topic: String,
    /// Start at the earliest offset instead of the end.
    #[arg(long)]
    from_beginning: bool,
    /// Stop after this many records.
    #[arg(long)]
    max_messages: Option<u64>,
    /// Stop when no record arrives for this long (milliseconds).
    #[arg(long)]
    idle_timeout_ms: Option<u64>,
    /// Print key, partition, offset and timestamp too.
    #[arg(long)]
    verbose: bool,
}

#[derive(Debug, clap::Args)]
pub struct ClusterArgs {
    #[command(flatten)]
    connection: Connection,
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread().enable_all().build()?)
}

pub fn topic(args: TopicArgs) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = args.connection.config().create()?;
    let options = AdminOptions::new().operation_timeout(Some(METADATA_TIMEOUT));
    let runtime = runtime()?;
    match args.command {
        TopicCommand::Create { name, partitions, configs } => {
            let pairs: Vec<(String, String)> = configs
                .iter()
                .map(|c| c.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
                .collect::<Option<_>>()
                .context("configs are key=value")?;
            let mut topic = NewTopic::new(&name, partitions, TopicReplication::Fixed(-1));
            for (key, value) in &pairs {
                topic = topic.set(key, value);
            }
            for result in runtime.block_on(admin.create_topics([&topic], &options))? {
                result.map_err(|(topic, error)| anyhow::anyhow!("creating {topic}: {error}"))?;
            }
            println!("created topic {name} with {partitions} partitions");
        }
        TopicCommand::List => {
            let metadata = args.connection.metadata(&args.connection.probe()?, None)?;
            for topic in metadata.topics() {
                println!("{}", topic.name());
            }
        }
        TopicCommand::Describe { name } => describe_topic(&args.connection, &admin, &runtime, &options, &name)?,
        TopicCommand::Delete { name } => {
            for result in runtime.block_on(admin.delete_topics(&[&name], &options))? {
                result.map_err(|(topic, error)| anyhow::anyhow!("deleting {topic}: {error}"))?;
            }
            println!("deleted topic {name}");
        }
    }
    Ok(())
}

fn describe_topic(
    connection: &Connection,
    admin: &AdminClient<DefaultClientContext>,
    runtime: &tokio::runtime::Runtime,
    options: &AdminOptions,
    name: &str,
) -> anyhow::Result<()> {
    let probe = connection.probe()?;
    let metadata = connection.metadata(&probe, Some(name))?;
    let topic = existing_topic(&metadata, name)?;
    println!("topic {name}: {} partitions", topic.partitions().len());
    for partition in topic.partitions() {
        let (low, high) = probe.fetch_watermarks(name, partition.id(), METADATA_TIMEOUT)?;
        println!(
            "  partition {:>4}  leader {}  replicas {:?}  isr {:?}  offsets [{low}, {high})",
            partition.id(),
            partition.leader(),
            partition.replicas(),
            partition.isr()
        );
    }
    for result in runtime.block_on(admin.describe_configs([&ResourceSpecifier::Topic(name)], options))? {
        let resource = result?;
        for entry in resource.entries {
            let source = if entry.is_default { "default" } else { "override" };
            println!("  {} = {} ({source})", entry.name, entry.value.unwrap_or_default());
        }
    }
    Ok(())
}

/// `name`'s metadata in `metadata`, or "topic NAME not found".
fn existing_topic<'a>(
    metadata: &'a rdkafka::metadata::Metadata,
    name: &str,
) -> anyhow::Result<&'a rdkafka::metadata::MetadataTopic> {
    use rdkafka::types::RDKafkaRespErr;
    let Some(topic) = metadata.topics().iter().find(|topic| topic.name() == name) else {
        bail!("topic {name} not found")
    };
    match topic.error() {
        None => Ok(topic),
        Some(RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART) => bail!("topic {name} not found"),
        Some(error) => bail!("topic {name}: {}", rdkafka::error::RDKafkaErrorCode::from(error)),
    }
}

pub fn produce(args: ProduceArgs) -> anyhow::Result<()> {
    // Before reading stdin: a cluster that cannot be reached is said at once.
    args.connection.metadata(&args.connection.probe()?, None)?;
    let producer: FutureProducer = args
        .connection
        .config()
        .set("acks", &args.acks)
        .set("compression.type", &args.compression)
        .set("linger.ms", "5")
        .create()?;
    let runtime = runtime()?;
    let mut count = 0u64;
    runtime.block_on(async {
        let mut pending = Vec::new();
        for line in std::io::stdin().lock().lines() {
            let line = line?;
            let (key, value) = match &args.key_separator {
                Some(separator) => match line.split_once(separator.as_str()) {
                    Some((key, value)) => (Some(key.to_string()), value.to_string()),
                    None => (None, line.clone()),
                },
                None => (None, line.clone()),
            };
            let mut record = FutureRecord::<String, String>::to(&args.topic).payload(&value);
            if let Some(key) = &key {
                record = record.key(key);
            }
            let delivery =
                producer.send_result(record).map_err(|(error, _)| anyhow::anyhow!("enqueue failed: {error}"))?;
            pending.push(delivery);
            count += 1;
        }
        for delivery in pending {
            delivery.await?.map_err(|(error, _)| anyhow::anyhow!("delivery failed: {error}"))?;
        }
        anyhow::Ok(())
    })?;
    eprintln!("produced {count} records to {}", args.topic);
    Ok(())
}

pub fn consume(args: ConsumeArgs) -> anyhow::Result<()> {
    let consumer: BaseConsumer = args
        .connection
        .config()
        .set("group.id", "sluice-cli")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .create()?;
    let metadata = args.connection.metadata(&args.connection.probe()?, Some(&args.topic))?;
    let topic = existing_topic(&metadata, &args.topic)?;
    let mut assignment = TopicPartitionList::new();
    let start = if args.from_beginning { Offset::Beginning } else { Offset::End };
    for partition in topic.partitions() {
        assignment.add_partition_offset(&args.topic, partition.id(), start)?;
    }
    consumer.assign(&assignment)?;
    let idle = args.idle_timeout_ms.map(Duration::from_millis);
    let mut last_record = std::time::Instant::now();
    let mut count = 0u64;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    while args.max_messages.is_none_or(|max| count < max) {
        if idle.is_some_and(|idle| last_record.elapsed() >= idle) {
            break;
        }
        let Some(message) = consumer.poll(Duration::from_millis(200)) else { continue };
        let message = message?;
        last_record = std::time::Instant::now();
        count += 1;
        let value = String::from_utf8_lossy(message.payload().unwrap_or_default());
        if args.verbose {
            let key = message.key().map(String::from_utf8_lossy).unwrap_or_default();
            let headers = message.headers().map_or(0, |h| h.count());
            writeln!(
                out,
                "p{} @{} ts={:?} key={key} headers={headers}\t{value}",
                message.partition(),
                message.offset(),
                message.timestamp().to_millis()
            )?;
        } else {
            writeln!(out, "{value}")?;
        }
    }
    Ok(())
}

pub fn cluster(args: ClusterArgs) -> anyhow::Result<()> {
    let consumer: BaseConsumer = args.connection.config().create()?;
    let metadata = consumer.fetch_metadata(None, METADATA_TIMEOUT)?;
    println!("controller/origin broker: {} ({})", metadata.orig_broker_id(), metadata.orig_broker_name());
    for broker in metadata.brokers() {
        println!("  node {}  {}:{}", broker.id(), broker.host(), broker.port());
    }
    println!("{} topics", metadata.topics().len());
    // ISR health, as `kafka-topics --describe --under-replicated-partitions` reports it.
    let (mut total, mut under_replicated, mut offline) = (0, Vec::new(), Vec::new());
    for topic in metadata.topics() {
        for partition in topic.partitions() {
            total += 1;
            let name = format!("{}-{}", topic.name(), partition.id());
            if partition.leader() < 0 {
                offline.push(name);
            } else if partition.isr().len() < partition.replicas().len() {
                under_replicated.push(format!("{name} (isr {:?} of {:?})", partition.isr(), partition.replicas()));
            }
        }
    }
    println!("{total} partitions: {} under-replicated, {} offline (no leader)", under_replicated.len(), offline.len());
    for name in under_replicated.iter().chain(&offline).take(CLUSTER_PARTITIONS_LISTED_MAX) {
        println!("  {name}");
    }
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
    /// Delete groups without members (and their committed offsets).
    Delete { groups: Vec<String> },
}

#[derive(Debug, clap::Args)]
pub struct GroupArgs {
    #[command(flatten)]
    connection: Connection,
    #[command(subcommand)]
    command: GroupCommand,
}

pub fn group(args: GroupArgs) -> anyhow::Result<()> {
    let connection = args.connection.checked()?;
    match args.command {
        GroupCommand::List => {
            let consumer: BaseConsumer = connection.config().create()?;
            let groups = consumer.fetch_group_list(None, METADATA_TIMEOUT)?;
            let mut listed: Vec<_> =
                groups.groups().iter().map(|g| (g.name().to_string(), g.state().to_string())).collect();
            listed.sort();
            for (name, state) in listed {
                println!("{name}\t{state}");
            }
        }
        GroupCommand::Describe { group } => describe_group(connection, &group)?,
        GroupCommand::ResetOffsets { group, topic, to_earliest, to_latest, to_offset, execute } => {
            let target = match (to_earliest, to_latest, to_offset) {
                (true, _, _) => Offset::Beginning,
                (_, true, _) => Offset::End,
                (_, _, Some(offset)) if offset >= 0 => Offset::Offset(offset),
                _ => bail!("say where to: --to-earliest, --to-latest or --to-offset N (N >= 0)"),
            };
            reset_offsets(connection, &group, &topic, target, execute)?;
        }
        GroupCommand::Delete { groups } => {
            if groups.is_empty() {
                bail!("name at least one group");
            }
            let admin: AdminClient<DefaultClientContext> = connection.config().create()?;
            let names: Vec<&str> = groups.iter().map(String::as_str).collect();
            let results = runtime()?.block_on(admin.delete_groups(&names, &AdminOptions::new()))?;
            let mut failed = false;
            for result in results {
                match result {
                    Ok(name) => println!("deleted group {name}"),
                    Err((name, error)) => {
                        failed = true;
                        eprintln!("group {name}: {error}");
                    }
                }
            }
            if failed {
                bail!("some groups were not deleted");
            }
        }
    }
    Ok(())
}

/// (topic, partition, committed offset if any) of a group.
fn committed_offsets(connection: &Connection, group: &str) -> anyhow::Result<Vec<(String, i32, Option<i64>)>> {
    let consumer: BaseConsumer = connection.config().set("group.id", group).create()?;
    let metadata = consumer.fetch_metadata(None, METADATA_TIMEOUT)?;
    let mut all = TopicPartitionList::new();
    for topic in metadata.topics().iter().filter(|t| !t.name().starts_with("__")) {
        for partition in topic.partitions() {
            all.add_partition(topic.name(), partition.id());
        }
    }
    let committed = consumer.committed_offsets(all, METADATA_TIMEOUT)?;
    Ok(committed
        .elements()
        .iter()
        .map(|e| {
            let offset = match e.offset() {
                Offset::Offset(offset) => Some(offset),
                _ => None,
            };
            (e.topic().to_string(), e.partition(), offset)
        })
        .collect())
}

fn describe_group(connection: &Connection, group: &str) -> anyhow::Result<()> {
    let consumer: BaseConsumer = connection.config().create()?;
    let groups = consumer.fetch_group_list(Some(group), METADATA_TIMEOUT)?;
    let Some(info) = groups.groups().iter().find(|g| g.name() == group) else {
        bail!("group {group} not found");
    };
    println!("group {group}  state {}  protocol {}", info.state(), info.protocol());
    for member in info.members() {
        println!("  member {}  client {}  host {}", member.id(), member.client_id(), member.client_host());
    }
    println!("TOPIC\tPARTITION\tCOMMITTED\tLOG-END\tLAG");
    for (topic, partition, committed) in committed_offsets(connection, group)? {
        let Some(committed) = committed else { continue };
        let (_, end) = consumer.fetch_watermarks(&topic, partition, METADATA_TIMEOUT)?;
        println!("{topic}\t{partition}\t{committed}\t{end}\t{}", (end - committed).max(0));
    }
    Ok(())
}

fn reset_offsets(
    connection: &Connection,
    group: &str,
    topic: &str,
    target: Offset,
    execute: bool,
) -> anyhow::Result<()> {
    let probe: BaseConsumer = connection.config().create()?;
    let groups = probe.fetch_group_list(Some(group), METADATA_TIMEOUT)?;
    if let Some(info) = groups.groups().iter().find(|g| g.name() == group) {
        if !info.members().is_empty() {
            bail!("group {group} has {} active members: stop them first", info.members().len());
        }
    }
    let metadata = probe.fetch_metadata(Some(topic), METADATA_TIMEOUT)?;
    let Some(found) = metadata.topics().iter().find(|t| t.name() == topic && t.error().is_none()) else {
        bail!("topic {topic} not found");
    };
    let mut plan = TopicPartitionList::new();
    println!("TOPIC\tPARTITION\tNEW-OFFSET");
    for partition in found.partitions() {
        let (low, high) = probe.fetch_watermarks(topic, partition.id(), METADATA_TIMEOUT)?;
        let offset = match target {
            Offset::Beginning => low,
            Offset::End => high,
            Offset::Offset(offset) => offset.clamp(low, high),
            _ => unreachable!("only the targets above are built"),
        };
        println!("{topic}\t{}\t{offset}", partition.id());
        plan.add_partition_offset(topic, partition.id(), Offset::Offset(offset))?;
    }
    if !execute {
        println!("(dry run: add --execute to commit these offsets)");
        return Ok(());
    }
    let consumer: BaseConsumer =
        connection.config().set("group.id", group).set("enable.auto.commit", "false").create()?;
    consumer.commit(&plan, rdkafka::consumer::CommitMode::Sync)?;
    println!("committed new offsets for group {group}");
    Ok(())
}
