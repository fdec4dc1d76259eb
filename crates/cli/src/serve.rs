//! `sluice serve`: configuration from defaults, a TOML file, `SLUICE_*` environment
//! variables and flags (each overriding the one before), then the broker until SIGTERM or
//! SIGINT, which shut it down cleanly (logs fsynced and sealed).

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use anyhow::Context;
use sluice_broker::Broker;
use sluice_config::BrokerConfig;

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// TOML config file (keys as in BrokerConfig; see README).
    #[arg(long, env = "SLUICE_CONFIG")]
    config: Option<PathBuf>,
    /// Address to listen on, host:port (a host name is resolved) [default: 127.0.0.1:9092].
    #[arg(long, env = "SLUICE_LISTEN", value_parser = resolve_listen)]
    listen: Option<SocketAddr>,
    /// host:port given to clients in metadata [default: the listen address].
    #[arg(long, env = "SLUICE_ADVERTISED_LISTENER")]
    advertised_listener: Option<String>,
    /// Data directory [default: ./sluice-data].
    #[arg(long, env = "SLUICE_DATA_DIR")]
    data_dir: Option<PathBuf>,
    #[arg(long, env = "SLUICE_NODE_ID")]
    node_id: Option<i32>,
    /// Largest request frame accepted, in bytes [default: 104857600].
    #[arg(long, env = "SLUICE_MAX_REQUEST_BYTES")]
    max_request_bytes: Option<usize>,
    #[arg(long, env = "SLUICE_MAX_CONNECTIONS")]
    max_connections: Option<usize>,
    #[arg(long, env = "SLUICE_MAX_INFLIGHT_REQUESTS_PER_CONNECTION")]
    max_inflight_requests_per_connection: Option<usize>,
    /// Request bytes admitted across all connections, charged from when a request's size is
    /// read until it is answered (Kafka's queued.max.request.bytes) [default: 536870912].
    #[arg(long, env = "SLUICE_QUEUED_MAX_REQUEST_BYTES")]
    queued_max_request_bytes: Option<usize>,
    /// Request bytes one connection may have admitted before the broker stops reading from
    /// it (a larger request is served alone) [default: 67108864].
    #[arg(long, env = "SLUICE_QUEUED_MAX_REQUEST_BYTES_PER_CONNECTION")]
    queued_max_request_bytes_per_connection: Option<usize>,
    /// Former name of --queued-max-request-bytes (which wins when both are given).
    #[arg(long, env = "SLUICE_PRODUCE_MEMORY_BYTES", hide = true)]
    produce_memory_bytes: Option<usize>,
    /// Make acknowledged appends durable through one write-ahead log (one fsync per
    /// group-commit round; the default) or, with `false`, one fsync per partition file.
    #[arg(long, env = "SLUICE_LOG_WAL")]
    log_wal: Option<bool>,
    /// Least microseconds between the starts of two WAL rounds after a round that logged
    /// several batches: fewer, fuller rounds for less CPU; 0 = no wait, at most 10000
    /// [default: 1500].
    #[arg(long, env = "SLUICE_LOG_WAL_ROUND_INTERVAL_US")]
    log_wal_round_interval_us: Option<u64>,
    /// Bytes after which a WAL file is closed and checkpointed (its partitions fsynced,
    /// the file recycled): a shorter replay after a crash for more segment fsyncs; at least
    /// 1048576 [default: 67108864].
    #[arg(long, env = "SLUICE_LOG_WAL_FILE_BYTES")]
    log_wal_file_bytes: Option<u64>,
    /// Write the active segments' tails to their files with direct I/O (O_DIRECT) instead
    /// of through the page cache, and read what the page cache lacks the same way: less
    /// CPU per byte, no page cache to fill or reclaim [default: true].
    #[arg(long, env = "SLUICE_LOG_SEGMENT_DIRECT_IO")]
    log_segment_direct_io: Option<bool>,
    /// Threads serving connections and request handlers; 0 = half the cores, at least 1
    /// [default: 0].
    #[arg(long, env = "SLUICE_IO_THREADS")]
    io_threads: Option<usize>,
    /// Create topics on first metadata request (Kafka's auto.create.topics.enable).
    #[arg(long, env = "SLUICE_AUTO_CREATE_TOPICS")]
    auto_create_topics: Option<bool>,
    /// Partitions of auto-created topics (Kafka's num.partitions).
    #[arg(long, env = "SLUICE_NUM_PARTITIONS")]
    num_partitions: Option<i32>,
    /// Default segment.bytes for topics.
    #[arg(long, env = "SLUICE_SEGMENT_BYTES")]
    segment_bytes: Option<i64>,
    /// Default retention.ms for topics.
    #[arg(long, env = "SLUICE_RETENTION_MS")]
    retention_ms: Option<i64>,
    /// Default flush.messages for topics: 1 = fsync before ack (default); N > 1 = page-cache mode.
    #[arg(long, env = "SLUICE_FLUSH_MESSAGES")]
    flush_messages: Option<i64>,
    /// Default `sluice.durability.level` of topics (1-4, see README "Durability levels").
    #[arg(long, env = "SLUICE_DURABILITY_LEVEL")]
    durability_level: Option<i64>,
    /// How often retention is checked.
    #[arg(long, env = "SLUICE_LOG_RETENTION_CHECK_INTERVAL_MS")]
    log_retention_check_interval_ms: Option<u64>,
    /// Initial rebalance delay of a new consumer group (Kafka's group.initial.rebalance.delay.ms).
    #[arg(long, env = "SLUICE_GROUP_INITIAL_REBALANCE_DELAY_MS")]
    group_initial_rebalance_delay_ms: Option<u64>,
    /// Run as a cluster node: the controller quorum as `id@host:port,...` (each voter's
    /// controller address). Absent = a single node.
    #[arg(long, env = "SLUICE_CLUSTER_VOTERS")]
    cluster_voters: Option<String>,
    /// Where this node's controller listens (cluster mode).
    #[arg(long, env = "SLUICE_CONTROLLER_LISTEN")]
    controller_listen: Option<SocketAddr>,
    /// Local IP that connections to other nodes are made from (cluster mode; e.g. so a
    /// fault-injecting proxy can tell nodes apart) [default: chosen by the system].
    #[arg(long, env = "SLUICE_CLUSTER_SOURCE_ADDRESS")]
    cluster_source_address: Option<IpAddr>,
    /// The cluster's id (cluster mode; Kafka's cluster.id) [default: derived from the voters].
    #[arg(long, env = "SLUICE_CLUSTER_ID")]
    cluster_id: Option<String>,
    /// A file holding the secret every node of the cluster shares (cluster mode; required
    /// with more than one voter): controller RPCs are authenticated with it [default: a
    /// single voter generates one in its data dir].
    #[arg(long, env = "SLUICE_CLUSTER_RPC_SECRET_FILE")]
    cluster_rpc_secret_file: Option<PathBuf>,
    /// Heartbeat interval of consumer-protocol groups (Kafka's group.consumer.heartbeat.interval.ms).
    #[arg(long, env = "SLUICE_GROUP_CONSUMER_HEARTBEAT_INTERVAL_MS")]
    group_consumer_heartbeat_interval_ms: Option<u64>,
    /// Session timeout of consumer-protocol groups (Kafka's group.consumer.session.timeout.ms).
    #[arg(long, env = "SLUICE_GROUP_CONSUMER_SESSION_TIMEOUT_MS")]
    group_consumer_session_timeout_ms: Option<u64>,
    /// Partitions of the replicated offsets topic (Kafka's offsets.topic.num.partitions, cluster mode).
    #[arg(long, env = "SLUICE_OFFSETS_TOPIC_NUM_PARTITIONS")]
    offsets_topic_num_partitions: Option<i32>,
    /// Replicas of the offsets topic (Kafka's offsets.topic.replication.factor; 0 = min(3, voters)).
    #[arg(long, env = "SLUICE_OFFSETS_TOPIC_REPLICATION_FACTOR")]
    offsets_topic_replication_factor: Option<i16>,
    /// Segment size of the offsets log (Kafka's offsets.topic.segment.bytes).
    #[arg(long, env = "SLUICE_OFFSETS_TOPIC_SEGMENT_BYTES")]
    offsets_topic_segment_bytes: Option<u64>,
    /// Partitions of the replicated transaction log (Kafka's
    /// transaction.state.log.num.partitions, cluster mode).
    #[arg(long, env = "SLUICE_TRANSACTION_STATE_NUM_PARTITIONS")]
    transaction_state_num_partitions: Option<i32>,
    /// Replicas of the transaction log (Kafka's transaction.state.log.replication.factor;
    /// 0 = min(3, voters)).
    #[arg(long, env = "SLUICE_TRANSACTION_STATE_REPLICATION_FACTOR")]
    transaction_state_replication_factor: Option<i16>,
    /// Kafka's offsets.retention.minutes.
    #[arg(long, env = "SLUICE_OFFSETS_RETENTION_MINUTES")]
    offsets_retention_minutes: Option<u64>,
    /// Offsets retention in ms; overrides --offsets-retention-minutes.
    #[arg(long, env = "SLUICE_OFFSETS_RETENTION_MS")]
    offsets_retention_ms: Option<u64>,
    /// Kafka's offsets.retention.check.interval.ms.
    #[arg(long, env = "SLUICE_OFFSETS_RETENTION_CHECK_INTERVAL_MS")]
    offsets_retention_check_interval_ms: Option<u64>,
    /// Bytes appended to an offsets partition between two compaction snapshots.
    #[arg(long, env = "SLUICE_OFFSETS_SNAPSHOT_INTERVAL_BYTES")]
    offsets_snapshot_interval_bytes: Option<u64>,
    /// Serve Prometheus metrics at http://ADDR/metrics (and /healthz, /readyz) [default: off].
    #[arg(long, env = "SLUICE_METRICS_LISTEN")]
    metrics_listen: Option<SocketAddr>,
    /// Serve the Schema Registry's REST API (Confluent-compatible) at http://ADDR/
    /// (8081 by convention) [default: off].
    #[arg(long, env = "SLUICE_SCHEMA_REGISTRY_LISTEN")]
    schema_registry_listen: Option<SocketAddr>,
    /// Serve the Schema Registry over HTTPS, with the certificate of the SSL listeners
    /// (`ssl.keystore.location`; `ssl.client.auth` applies too).
    #[arg(long, env = "SLUICE_SCHEMA_REGISTRY_TLS")]
    schema_registry_tls: bool,
    /// Serve the web console at http://ADDR/ (8080 by convention) [default: off].
    #[arg(long, env = "SLUICE_CONSOLE_LISTEN")]
    console_listen: Option<SocketAddr>,
    /// Serve the web console over HTTPS with the listeners' certificate
    /// (`ssl.keystore.location`).
    #[arg(long, env = "SLUICE_CONSOLE_TLS")]
    console_tls: bool,
    /// Show the `sluice bench` runs in DIR on the console's benchmarks pages.
    #[arg(long, env = "SLUICE_CONSOLE_BENCH_DIR")]
    console_bench_dir: Option<PathBuf>,
    /// Take AMQP 0-9-1 clients (RabbitMQ's) at ADDR (5672 by convention) [default: off].
    #[arg(long, env = "SLUICE_AMQP_LISTEN")]
    amqp_listen: Option<SocketAddr>,
    /// Any config key as KEY=VALUE, Kafka's names included (e.g. --override
    /// listeners=PLAINTEXT://:9092,SSL://:9093); applied over the TOML file. Repeatable.
    #[arg(long = "override", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
    /// Log format: text or json.
    #[arg(long, env = "SLUICE_LOG_FORMAT", default_value = "text")]
    log_format: String,
}

impl ServeArgs {
    fn into_config(self) -> anyhow::Result<(BrokerConfig, String)> {
        let mut table = match &self.config {
            Some(path) => {
                let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
                toml::from_str::<toml::Table>(&text).with_context(|| format!("parsing {}", path.display()))?
            }
            None => toml::Table::new(),
        };
        for entry in &self.overrides {
            apply_override(&mut table, entry)?;
        }
        let mut config: BrokerConfig = table.try_into().map_err(|error: toml::de::Error| {
            let message = error.to_string();
            match sluice_config::explain_unknown_key(&message) {
                Some(explained) => anyhow::anyhow!("invalid configuration: {explained}"),
                None => anyhow::anyhow!("invalid configuration: {}", message.trim_end()),
            }
        })?;
        macro_rules! set {
            ($($field:ident),*) => { $(if let Some(value) = self.$field { config.$field = value; })* };
        }
        set!(listen, data_dir, node_id, max_request_bytes, max_connections, max_inflight_requests_per_connection);
        if let Some(value) = self.produce_memory_bytes {
            config.queued_max_request_bytes = value;
        }
        set!(queued_max_request_bytes, queued_max_request_bytes_per_connection);
        set!(
            log_wal,
            log_wal_round_interval_us,
            log_wal_file_bytes,
            log_segment_direct_io,
            io_threads,
            auto_create_topics,
            num_partitions,
            log_retention_check_interval_ms
        );
        set!(group_initial_rebalance_delay_ms, group_consumer_heartbeat_interval_ms, group_consumer_session_timeout_ms);
        set!(offsets_topic_num_partitions, offsets_topic_replication_factor, offsets_topic_segment_bytes);
        set!(offsets_retention_minutes, offsets_retention_check_interval_ms, offsets_snapshot_interval_bytes);
        set!(transaction_state_num_partitions, transaction_state_replication_factor);
        if self.offsets_retention_ms.is_some() {
            config.offsets_retention_ms = self.offsets_retention_ms;
        }
        if self.metrics_listen.is_some() {
            config.metrics_listen = self.metrics_listen;
        }
        if self.schema_registry_listen.is_some() {
            config.schema_registry_listen = self.schema_registry_listen;
        }
        if self.schema_registry_tls {
            config.schema_registry_tls = true;
        }
        if self.console_listen.is_some() {
            config.console_listen = self.console_listen;
        }
        if self.console_tls {
            config.console_tls = true;
        }
        if self.console_bench_dir.is_some() {
            config.console_bench_dir = self.console_bench_dir.clone();
        }
        if self.amqp_listen.is_some() {
            config.amqp_listen = self.amqp_listen;
        }
        if self.advertised_listener.is_some() {
            config.advertised_listener = self.advertised_listener;
        }
        let defaults = &mut config.topic_defaults;
        if let Some(value) = self.segment_bytes {
            defaults.segment_bytes = value;
        }
        if let Some(value) = self.retention_ms {
            defaults.retention_ms = value;
        }
        if let Some(value) = self.flush_messages {
            defaults.flush_messages = value;
        }
        if let Some(value) = self.durability_level {
            defaults.durability_level = value;
        }
        if self.cluster_voters.is_some()
            || self.controller_listen.is_some()
            || self.cluster_source_address.is_some()
            || self.cluster_id.is_some()
            || self.cluster_rpc_secret_file.is_some()
        {
            let cluster = config.cluster.get_or_insert_with(Default::default);
            if let Some(voters) = self.cluster_voters {
                cluster.voters = voters;
            }
            if let Some(listen) = self.controller_listen {
                cluster.controller_listen = listen;
            }
            if let Some(path) = self.cluster_rpc_secret_file {
                cluster.rpc_secret_file = Some(path);
            }
            if let Some(source) = self.cluster_source_address {
                cluster.source_address = Some(source);
            }
            if let Some(cluster_id) = self.cluster_id {
                cluster.cluster_id = Some(cluster_id);
            }
        }
        config.validate().map_err(|e| anyhow::anyhow!("invalid configuration: {e}"))?;
        Ok((config, self.log_format))
    }
}

/// `--listen`'s host:port; a host name is resolved (its first address is bound).
fn resolve_listen(value: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    if let Ok(address) = value.parse() {
        return Ok(address);
    }
    let mut resolved =
        value.to_socket_addrs().map_err(|error| format!("{value} is not a host:port that resolves: {error}"))?;
    resolved.next().ok_or_else(|| format!("{value} resolves to no address"))
}

/// `KEY=VALUE` into the config table. A KEY that is not a top-level key but starts with
/// `cluster.`, `topic_defaults.` or `tiered_storage.` sets a key of that table. VALUE is read as a TOML value
/// (number, boolean, quoted string) or else taken as a string.
fn apply_override(table: &mut toml::Table, entry: &str) -> anyhow::Result<()> {
    let (key, value) = entry.split_once('=').with_context(|| format!("--override {entry:?} is not KEY=VALUE"))?;
    let key = key.trim();
    let value = value.trim();
    let parsed = toml::from_str::<toml::Table>(&format!("value = {value}"))
        .ok()
        .and_then(|mut parsed| parsed.remove("value"))
        .unwrap_or_else(|| toml::Value::String(value.to_string()));
    let nested = ["cluster.", "topic_defaults.", "tiered_storage."]
        .iter()
        .find_map(|prefix| key.strip_prefix(prefix).map(|inner| (prefix.trim_end_matches('.'), inner)));
    match nested {
        Some((section, inner)) if !inner.is_empty() => {
            let section = table.entry(section).or_insert_with(|| toml::Value::Table(toml::Table::new()));
            let toml::Value::Table(section) = section else {
                anyhow::bail!("--override {key}: that section is not a table");
            };
            section.insert(inner.to_string(), parsed);
        }
        _ => {
            table.insert(key.to_string(), parsed);
        }
    }
    Ok(())
}

fn init_logging(format: &str) -> anyhow::Result<()> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;

    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    // A RUST_LOG that names openraft asks for all of its events.
    let quiet_raft = !std::env::var("RUST_LOG").is_ok_and(|directives| directives.contains("openraft"));
    let not_noise =
        move || tracing_subscriber::filter::filter_fn(move |meta| !(quiet_raft && is_raft_retry_noise(meta)));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let layer = tracing_subscriber::fmt::layer().with_target(false).with_ansi(ansi);
    let registry = tracing_subscriber::registry().with(filter);
    match format {
        "text" => registry.with(layer.with_filter(not_noise())).init(),
        "json" => registry.with(layer.json().with_filter(not_noise())).init(),
        other => anyhow::bail!("unknown log format {other:?} (text or json)"),
    }
    Ok(())
}

/// openraft's report of each failed replication attempt: while a controller peer is down
/// the leader logs several lines every 100 ms. The controller's RPC client logs the peer's
/// state changes instead, once each ("controller peer unreachable" / "reachable again").
/// openraft's storage errors (ERROR with an `error` field) are kept.
fn is_raft_retry_noise(meta: &tracing::Metadata<'_>) -> bool {
    let target = meta.target();
    let replication = target == "openraft::replication" || target.starts_with("openraft::replication::");
    let progress = target.starts_with("openraft::engine::handler::replication_handler");
    match *meta.level() {
        tracing::Level::WARN => replication || progress,
        tracing::Level::ERROR => replication && meta.fields().field("err").is_some(),
        _ => false,
    }
}

/// Every segment holds a file descriptor: raise the soft limit to the hard one so a broker
/// with thousands of partitions does not run out.
fn raise_open_files_limit() {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max {
            let wanted = libc::rlimit { rlim_cur: limit.rlim_max, rlim_max: limit.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &wanted) != 0 {
                tracing::warn!(soft = limit.rlim_cur, "could not raise the open files limit");
            }
        }
    }
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let (config, log_format) = args.into_config()?;
    init_logging(&log_format)?;
    sluice_broker::server::stop_on_panic();
    raise_open_files_limit();
    let io_threads = match config.io_threads {
        0 => sluice_config::io_threads_auto(),
        threads => threads,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(io_threads)
        .enable_all()
        .thread_name("sluice-io")
        .build()?;
    runtime.block_on(async move {
        let listeners = config.listeners().map_err(anyhow::Error::msg)?;
        let metrics_listen = config.metrics_listen;
        let schema_registry_listen = config.schema_registry_listen;
        let console_listen = config.console_listen;
        let amqp_listeners = config.amqp_listeners().map_err(anyhow::Error::msg)?;
        let data_dir = config.data_dir.clone();
        // A start that fails leaves no data dir it created behind (a mistyped port must not
        // leave an empty broker's files where the next attempt, or an operator, finds them).
        let fresh = !data_dir.exists();
        let started = async {
            let broker = tokio::task::spawn_blocking(move || Broker::open(config))
                .await?
                .with_context(|| format!("opening data dir {}", data_dir.display()))?;
            // The HTTP ports first: a start that fails on one never accepted a client.
            let http = sluice_broker::server::HttpListeners {
                metrics: bind_http(metrics_listen, "metrics").await?,
                schema_registry: bind_http(schema_registry_listen, "schema registry").await?,
                console: bind_http(console_listen, "console").await?,
                amqp: bind_amqp(&amqp_listeners).await?,
            };
            let mut sockets = Vec::with_capacity(listeners.len());
            for listener in &listeners {
                let socket = tokio::net::TcpListener::bind(listener.bind)
                    .await
                    .with_context(|| format!("listener {} on {}", listener.name, listener.bind))?;
                sockets.push(socket);
            }
            broker.join_cluster().await.context("joining the cluster")?;
            anyhow::Ok((broker, sockets, http))
        }
        .await;
        let (broker, sockets, http) = match started {
            Ok(started) => started,
            Err(error) => {
                if fresh {
                    let _ = std::fs::remove_dir_all(&data_dir);
                }
                return Err(error);
            }
        };
        sluice_broker::server::serve(broker, sockets, http, shutdown_signal()).await?;
        Ok(())
    })
}

/// Binds the AMQP ports, each with whether it takes TLS.
async fn bind_amqp(
    listeners: &[sluice_security::AmqpListener],
) -> anyhow::Result<Vec<(tokio::net::TcpListener, bool)>> {
    let mut bound = Vec::with_capacity(listeners.len());
    for listener in listeners {
        let socket = tokio::net::TcpListener::bind(listener.bind)
            .await
            .with_context(|| format!("AMQP listener {} on {}", listener.name, listener.bind))?;
        bound.push((socket, listener.tls));
    }
    Ok(bound)
}

/// Binds an HTTP service's listener, when it has an address.
async fn bind_http(address: Option<SocketAddr>, service: &str) -> anyhow::Result<Option<tokio::net::TcpListener>> {
    match address {
        None => Ok(None),
        Some(address) => Ok(Some(
            tokio::net::TcpListener::bind(address).await.with_context(|| format!("{service} listener on {address}"))?,
        )),
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = signal(SignalKind::terminate()).expect("install SIGTERM handler");
    tokio::select! {
        _ = terminate.recv() => tracing::info!("SIGTERM received"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// The example config shipped at the root (and, with its own data dir, in the .deb).
    const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../sluice.example.toml");
    /// Second names of keys, each documented beside its first name in a comment.
    const ALIASES: &[&str] =
        &["max.connections", "queued.max.request.bytes", "produce_memory_bytes", "ssl.keystore.password"];

    #[derive(Parser)]
    struct Serve {
        #[command(flatten)]
        args: ServeArgs,
    }

    fn load(arguments: &[&str]) -> anyhow::Result<BrokerConfig> {
        let serve = Serve::try_parse_from(std::iter::once("serve").chain(arguments.iter().copied()))?;
        Ok(serve.args.into_config()?.0)
    }

    /// The keys a table takes, as its loader names them when it meets an unknown one.
    fn known_keys(section: &str) -> Vec<String> {
        let probe = format!("{section}\nno_such_key_at_all = 1\n");
        let Err(error) = toml::from_str::<BrokerConfig>(&probe) else { panic!("an unknown key was accepted") };
        let message = error.to_string();
        let list = message.split_once("expected one of ").expect("the error lists the known keys").1;
        let keys: Vec<String> = list.split(", ").filter_map(|key| key.split('`').nth(1)).map(str::to_string).collect();
        assert!(keys.len() >= 8, "too few keys read from {message:?}");
        keys
    }

    /// The lines of `text` under `[section]` (commented or not; "" is the top level).
    fn section_text(text: &str, section: &str) -> String {
        let mut current = String::new();
        let mut lines = String::new();
        for line in text.lines() {
            let header = line.trim_start_matches(['#', ' ']);
            if header.starts_with('[') && header.ends_with(']') {
                current = header.trim_matches(['[', ']']).to_string();
                continue;
            }
            if current == section {
                lines.push_str(line);
                lines.push('\n');
            }
        }
        lines
    }

    /// `key = value` or `"dotted.key" = value`, not prose with an `=` in it.
    fn is_setting(line: &str) -> bool {
        let key = line.split_once(" = ").map_or("", |(key, _)| key.trim_matches('"'));
        !key.is_empty() && key.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "_.".contains(c))
    }

    #[test]
    fn the_example_config_loads_as_the_defaults() {
        let loaded = load(&["--config", EXAMPLE]).expect("the example loads");
        assert_eq!(format!("{loaded:#?}"), format!("{:#?}", BrokerConfig::default()));
    }

    #[test]
    fn the_example_config_documents_every_key() {
        let text = std::fs::read_to_string(EXAMPLE).unwrap();
        for (section, header) in [
            ("", ""),
            ("topic_defaults", "[topic_defaults]"),
            ("tiered_storage", "[tiered_storage]"),
            ("cluster", "[cluster]"),
        ] {
            let lines = section_text(&text, section);
            for key in known_keys(header) {
                if ["topic_defaults", "tiered_storage", "cluster"].contains(&key.as_str()) {
                    assert!(text.contains(&format!("[{key}]\n")), "table [{key}] is not in the example");
                    continue;
                }
                if ALIASES.contains(&key.as_str()) {
                    assert!(text.contains(&format!("\"{key}\"")), "alias {key} is not mentioned");
                    continue;
                }
                let documented = lines.lines().any(|line| {
                    let setting = line.trim_start_matches(['#', ' ']);
                    setting.starts_with(&format!("{key} =")) || setting.starts_with(&format!("\"{key}\" ="))
                });
                assert!(documented, "key {key} of [{section}] is not in {EXAMPLE}");
            }
        }
    }

    #[test]
    fn the_example_configs_commented_settings_load_too() {
        // Uncommented, every example value must be one the loader takes.
        let text = std::fs::read_to_string(EXAMPLE).unwrap();
        let uncommented: String = text
            .lines()
            .map(|line| match line.strip_prefix("# ") {
                Some(setting) if is_setting(setting) || setting.starts_with('[') => setting,
                _ => line,
            })
            .map(|line| format!("{line}\n"))
            .collect();
        let table: toml::Table = toml::from_str(&uncommented).expect("the uncommented example is TOML");
        let config: Result<BrokerConfig, _> = table.try_into();
        config.expect("the uncommented example has only known keys and values of their types");
    }
}
