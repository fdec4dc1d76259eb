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

#[derive(Debug, clap::Args)]
pub struct Connection {
    /// Broker to bootstrap from.
    #[arg(long, short = 'b', env = "SLUICE_BOOTSTRAP", default_value = "127.0.0.1:9092")]
    bootstrap: String,
}

impl Connection {
    fn config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.bootstrap);
        config
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
            let metadata = admin.inner().fetch_metadata(None, METADATA_TIMEOUT)?;
            for topic in metadata.topics() {
                println!("{}", topic.name());
            }
        }
        TopicCommand::Describe { name } => describe_topic(&admin, &runtime, &options, &name)?,
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
    admin: &AdminClient<DefaultClientContext>,
    runtime: &tokio::runtime::Runtime,
    options: &AdminOptions,
    name: &str,
) -> anyhow::Result<()> {
    let metadata = admin.inner().fetch_metadata(Some(name), METADATA_TIMEOUT)?;
    let Some(topic) = metadata.topics().first() else { bail!("no metadata for {name}") };
    if let Some(error) = topic.error() {
        bail!("{name}: {error:?}");
    }
    println!("topic {name}: {} partitions", topic.partitions().len());
    for partition in topic.partitions() {
        let (low, high) = admin.inner().fetch_watermarks(name, partition.id(), METADATA_TIMEOUT)?;
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

pub fn produce(args: ProduceArgs) -> anyhow::Result<()> {
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
    let metadata = consumer.fetch_metadata(Some(&args.topic), METADATA_TIMEOUT)?;
    let topic = metadata.topics().first().context("no such topic")?;
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
    Ok(())
}
