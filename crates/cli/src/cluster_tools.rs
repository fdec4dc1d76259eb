//! `sluice cluster`: the cluster as a whole. Its overview (id, controller, brokers,
//! partition health), its health for scripts (`cluster_health.rs`), its controller quorum
//! (`cluster_quorum.rs`), what each broker speaks (ApiVersions, as kafka-broker-api-versions
//! lists it) and the broker configs (DescribeConfigs and IncrementalAlterConfigs on the
//! broker resource: the cluster-wide default is the resource with an empty name, as Kafka's
//! `kafka-configs --entity-default`, one broker's is its node id).

use anyhow::Context;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::incremental_alter_configs_request::{AlterConfigsResource, AlterableConfig};
use kafka_protocol::messages::{ApiKey, ApiVersionsRequest, DescribeConfigsRequest, IncrementalAlterConfigsRequest};
use kafka_protocol::protocol::StrBytes;
use serde::Serialize;
use sluice_client::check;

use crate::kafka_connection::{Cluster, ConnectionArgs};
use crate::output::{count, Format, TextTable};
use crate::tools::config_source;

/// Unhealthy partitions `sluice cluster` names one by one (the rest are only counted).
const CLUSTER_PARTITIONS_LISTED_MAX: usize = 50;
/// DescribeConfigs / IncrementalAlterConfigs resource type of a broker.
const RESOURCE_BROKER: i8 = 4;
/// The broker resource's name for the cluster-wide default.
const CLUSTER_DEFAULT: &str = "";
const DESCRIBE_CONFIGS_VERSION: i16 = 4;
const ALTER_CONFIGS_VERSION: i16 = 1;
/// ApiVersions v3 (flexible); every broker answers v0 at least with its ranges.
const API_VERSIONS_VERSION: i16 = 3;
const CONFIG_SET: i8 = 0;
const CONFIG_DELETE: i8 = 1;

#[derive(Debug, clap::Args)]
pub struct ClusterArgs {
    #[command(subcommand)]
    command: Option<ClusterCommand>,
}

#[derive(Debug, clap::Subcommand)]
pub enum ClusterCommand {
    /// Exit 0 when every registered broker is unfenced and every partition led and fully
    /// replicated; with --wait, once that holds (for scripts).
    Health(crate::cluster_health::HealthArgs),
    /// The API versions each broker supports, and this tool's version.
    Versions,
    /// The controller quorum: the active controller, and each voter's and observer's
    /// progress through the controller log.
    Quorum,
    /// Get or set broker configs: the cluster-wide default, or one broker's (--broker).
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
}

#[derive(Debug, clap::Subcommand)]
pub enum ConfigCommand {
    /// Show the broker configs (all, or the one named).
    Get {
        name: Option<String>,
        /// One broker's configs (its node id) instead of the cluster-wide default.
        #[arg(long)]
        broker: Option<i32>,
    },
    /// Set a broker config (IncrementalAlterConfigs), or return it to its default with
    /// --delete.
    Set {
        name: String,
        #[arg(required_unless_present = "delete")]
        value: Option<String>,
        /// Remove the setting instead (back to its default).
        #[arg(long, conflicts_with = "value")]
        delete: bool,
        #[arg(long)]
        broker: Option<i32>,
    },
}

pub fn cluster(connection: &ConnectionArgs, format: Format, args: ClusterArgs) -> anyhow::Result<()> {
    // Health may wait for brokers that are not up yet: it connects by itself.
    if let Some(ClusterCommand::Health(health)) = args.command {
        return crate::cluster_health::health(connection, format, health);
    }
    let mut cluster = connection.cluster()?;
    match args.command {
        None => overview(&mut cluster, format),
        Some(ClusterCommand::Health(_)) => unreachable!("answered above"),
        Some(ClusterCommand::Versions) => versions(&mut cluster, format),
        Some(ClusterCommand::Quorum) => crate::cluster_quorum::quorum(&mut cluster, format),
        Some(ClusterCommand::Config { command: ConfigCommand::Get { name, broker } }) => {
            get_configs(&mut cluster, format, name.as_deref(), broker)
        }
        Some(ClusterCommand::Config { command: ConfigCommand::Set { name, value, delete, broker } }) => {
            set_config(&mut cluster, &name, if delete { None } else { value.as_deref() }, broker)
        }
    }
}

#[derive(Serialize)]
struct BrokerView {
    node: i32,
    host: String,
    port: i32,
    rack: Option<String>,
    controller: bool,
}

#[derive(Serialize)]
struct ClusterView {
    cluster_id: Option<String>,
    controller: i32,
    brokers: Vec<BrokerView>,
    topics: usize,
    partitions: usize,
    under_replicated: Vec<String>,
    offline: Vec<String>,
}

fn overview(cluster: &mut Cluster, format: Format) -> anyhow::Result<()> {
    let metadata = cluster.metadata(None)?;
    let controller = metadata.controller_id.0;
    let mut brokers: Vec<BrokerView> = metadata
        .brokers
        .iter()
        .map(|b| BrokerView {
            node: b.node_id.0,
            host: b.host.to_string(),
            port: b.port,
            rack: b.rack.as_ref().map(|r| r.to_string()),
            controller: b.node_id.0 == controller,
        })
        .collect();
    brokers.sort_by_key(|b| b.node);
    // ISR health, as `kafka-topics --describe --under-replicated-partitions` reports it.
    let (mut partitions, mut under_replicated, mut offline) = (0, Vec::new(), Vec::new());
    for topic in &metadata.topics {
        let topic_name = topic.name.as_ref().map_or(String::new(), |n| n.to_string());
        for partition in &topic.partitions {
            partitions += 1;
            let name = format!("{topic_name}-{}", partition.partition_index);
            if partition.leader_id.0 < 0 {
                offline.push(name);
            } else if partition.isr_nodes.len() < partition.replica_nodes.len() {
                under_replicated.push(name);
            }
        }
    }
    under_replicated.sort();
    offline.sort();
    let view = ClusterView {
        cluster_id: metadata.cluster_id.as_ref().map(|id| id.to_string()),
        controller,
        brokers,
        topics: metadata.topics.len(),
        partitions,
        under_replicated,
        offline,
    };
    if format.document(&view)? {
        return Ok(());
    }
    println!("cluster {}  controller {}", view.cluster_id.as_deref().unwrap_or("-"), view.controller);
    println!();
    let mut table = TextTable::new(&["NODE", "HOST", "PORT", "RACK"]).numeric(&["NODE", "PORT"]);
    for broker in &view.brokers {
        let node = if broker.controller { format!("{}*", broker.node) } else { broker.node.to_string() };
        table.row([
            node,
            broker.host.clone(),
            broker.port.to_string(),
            broker.rack.clone().unwrap_or_else(|| "-".into()),
        ]);
    }
    table.print();
    println!();
    println!(
        "{}, {}: {} under-replicated, {} offline (no leader)",
        count(view.topics, "topic"),
        count(view.partitions, "partition"),
        view.under_replicated.len(),
        view.offline.len()
    );
    for name in view
        .under_replicated
        .iter()
        .map(|n| format!("{n} (under-replicated)"))
        .chain(view.offline.iter().map(|n| format!("{n} (offline)")))
        .take(CLUSTER_PARTITIONS_LISTED_MAX)
    {
        println!("  {name}");
    }
    Ok(())
}

#[derive(Serialize)]
struct ApiRange {
    api: String,
    min: i16,
    max: i16,
}

#[derive(Serialize)]
struct BrokerApis {
    node: i32,
    address: String,
    apis: Vec<ApiRange>,
}

#[derive(Serialize)]
pub(crate) struct VersionsView {
    tool_version: &'static str,
    cluster_id: Option<String>,
    brokers: Vec<BrokerApis>,
}

/// Kafka's name of an API key, or its number for one this tool does not know.
fn api_name(key: i16) -> String {
    ApiKey::try_from(key).map_or_else(|_| format!("api-{key}"), |api| format!("{api:?}"))
}

/// The API ranges each broker answers ApiVersions with.
pub(crate) fn broker_versions(cluster: &mut Cluster) -> anyhow::Result<VersionsView> {
    let metadata = cluster.metadata(Some(&[]))?;
    let mut brokers = Vec::new();
    for (node, address) in Cluster::addresses(&metadata) {
        let mut request = ApiVersionsRequest::default();
        request.client_software_name = StrBytes::from_static_str("sluice-cli");
        request.client_software_version = StrBytes::from_static_str(env!("CARGO_PKG_VERSION"));
        let response = cluster.connect(&address)?.send(API_VERSIONS_VERSION, request)?;
        check(response.error_code, None, &format!("API versions of broker {node}"))?;
        let mut apis: Vec<ApiRange> = response
            .api_keys
            .iter()
            .map(|api| ApiRange { api: api_name(api.api_key), min: api.min_version, max: api.max_version })
            .collect();
        apis.sort_by(|a, b| a.api.cmp(&b.api));
        brokers.push(BrokerApis { node, address, apis });
    }
    Ok(VersionsView {
        tool_version: env!("CARGO_PKG_VERSION"),
        cluster_id: metadata.cluster_id.as_ref().map(|id| id.to_string()),
        brokers,
    })
}

fn versions(cluster: &mut Cluster, format: Format) -> anyhow::Result<()> {
    let view = broker_versions(cluster)?;
    if format.document(&view)? {
        return Ok(());
    }
    println!("sluice {}, cluster {}", view.tool_version, view.cluster_id.as_deref().unwrap_or("-"));
    for broker in &view.brokers {
        println!();
        println!("broker {} ({}): {}", broker.node, broker.address, count(broker.apis.len(), "API"));
        let mut table = TextTable::new(&["API", "MIN", "MAX"]).numeric(&["MIN", "MAX"]);
        for api in &broker.apis {
            table.row([api.api.clone(), api.min.to_string(), api.max.to_string()]);
        }
        table.print();
    }
    Ok(())
}

#[derive(Serialize)]
pub(crate) struct BrokerConfig {
    name: String,
    value: Option<String>,
    source: &'static str,
    read_only: bool,
}

/// The broker resource's name and the broker to ask: a broker's own configs are asked of
/// it, the cluster-wide default of any broker.
fn broker_resource(cluster: &mut Cluster, broker: Option<i32>) -> anyhow::Result<(String, Option<String>)> {
    let Some(node) = broker else { return Ok((CLUSTER_DEFAULT.to_string(), None)) };
    let metadata = cluster.metadata(Some(&[]))?;
    let address = Cluster::addresses(&metadata).remove(&node).with_context(|| format!("no broker {node}"))?;
    Ok((node.to_string(), Some(address)))
}

/// The configs of a broker resource (`""`: the cluster-wide default); sensitive values are
/// never shown.
pub(crate) fn broker_configs(
    cluster: &mut Cluster,
    resource: &str,
    address: Option<&str>,
    name: Option<&str>,
) -> anyhow::Result<Vec<BrokerConfig>> {
    let mut request = DescribeConfigsRequest::default();
    request.resources = vec![DescribeConfigsResource::default()
        .with_resource_type(RESOURCE_BROKER)
        .with_resource_name(StrBytes::from_string(resource.to_string()))
        .with_configuration_keys(name.map(|n| vec![StrBytes::from_string(n.to_string())]))];
    let response = match address {
        Some(address) => cluster.connect(address)?.send(DESCRIBE_CONFIGS_VERSION, request)?,
        None => cluster.bootstrap.send(DESCRIBE_CONFIGS_VERSION, request)?,
    };
    let mut configs = Vec::new();
    for result in response.results {
        check(result.error_code, result.error_message.as_deref(), "broker configs")?;
        for config in result.configs {
            configs.push(BrokerConfig {
                name: config.name.to_string(),
                value: if config.is_sensitive { None } else { config.value.map(|v| v.to_string()) },
                source: config_source(config.config_source),
                read_only: config.read_only,
            });
        }
    }
    configs.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(configs)
}

fn get_configs(cluster: &mut Cluster, format: Format, name: Option<&str>, broker: Option<i32>) -> anyhow::Result<()> {
    let (resource, address) = broker_resource(cluster, broker)?;
    let configs = broker_configs(cluster, &resource, address.as_deref(), name)?;
    if let Some(name) = name {
        if configs.is_empty() {
            anyhow::bail!("the brokers have no config {name}");
        }
    }
    if format.document(&configs)? {
        return Ok(());
    }
    let mut table = TextTable::new(&["CONFIG", "VALUE", "SOURCE", "READ-ONLY"]);
    for config in &configs {
        table.row([
            config.name.clone(),
            config.value.clone().unwrap_or_else(|| "-".into()),
            config.source.to_string(),
            config.read_only.to_string(),
        ]);
    }
    table.print();
    Ok(())
}

fn set_config(cluster: &mut Cluster, name: &str, value: Option<&str>, broker: Option<i32>) -> anyhow::Result<()> {
    let (resource, address) = broker_resource(cluster, broker)?;
    let mut change = AlterableConfig::default().with_name(StrBytes::from_string(name.to_string()));
    change = match value {
        Some(value) => change.with_config_operation(CONFIG_SET).with_value(Some(StrBytes::from_string(value.into()))),
        None => change.with_config_operation(CONFIG_DELETE),
    };
    let mut request = IncrementalAlterConfigsRequest::default();
    request.resources = vec![AlterConfigsResource::default()
        .with_resource_type(RESOURCE_BROKER)
        .with_resource_name(StrBytes::from_string(resource.clone()))
        .with_configs(vec![change])];
    let response = match address.as_deref() {
        Some(address) => cluster.connect(address)?.send(ALTER_CONFIGS_VERSION, request)?,
        None => cluster.bootstrap.send(ALTER_CONFIGS_VERSION, request)?,
    };
    let whose = broker.map_or("the cluster-wide default".to_string(), |node| format!("broker {node}"));
    for result in &response.responses {
        check(result.error_code, result.error_message.as_deref(), &format!("setting {name} of {whose}"))?;
    }
    match value {
        Some(value) => println!("set {name}={value} for {whose}"),
        None => println!("removed {name} from {whose}"),
    }
    Ok(())
}
