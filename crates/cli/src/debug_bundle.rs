//! `sluice debug bundle`: one tarball with what support asks for first, gathered over the
//! Kafka protocol from any listener: the cluster's metadata, every topic's configs, the
//! groups and their committed offsets, the broker configs, the API versions of each broker
//! and, when the metrics endpoint is given, a scrape of it. Each part is a file of its own;
//! a part that cannot be had is named in `manifest.json` with its reason instead of failing
//! the bundle (a sick cluster is when a bundle is needed).
//!
//! No secrets: the connection settings (`-X`, passwords) are not written, and config values
//! the broker marks sensitive are left out, as `topic describe` does.

use std::fs::File;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context};
use flate2::write::GzEncoder;
use flate2::Compression;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::{DescribeConfigsRequest, ListGroupsRequest};
use kafka_protocol::protocol::StrBytes;
use serde_json::{json, Value};
use sluice_client::check;

use crate::cluster_queries::{committed_offsets, coordinator};
use crate::cluster_tools::{broker_configs, broker_versions};
use crate::kafka_connection::{Cluster, ConnectionArgs};
use crate::output::rfc3339_millis;
use crate::tools::config_source;

/// The directory every file of the bundle is under.
const BUNDLE_DIR: &str = "sluice-bundle";
/// How long the metrics endpoint may take to answer.
const METRICS_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest metrics page kept (a broker with very many partitions has a long one).
const METRICS_BYTES_MAX: usize = 32 * 1024 * 1024;
const DESCRIBE_CONFIGS_VERSION: i16 = 4;
/// ListGroups v5: every group type (classic, consumer, share) when no filter is given.
const LIST_GROUPS_VERSION: i16 = 5;
/// DescribeConfigs resource type of a topic.
const RESOURCE_TOPIC: i8 = 2;

#[derive(Debug, clap::Args)]
pub struct DebugArgs {
    #[command(subcommand)]
    command: DebugCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum DebugCommand {
    /// Write a tarball for support: metadata, topic and broker configs, groups, versions,
    /// a metrics scrape (with --metrics-url). Connection settings and sensitive values are
    /// left out.
    Bundle {
        /// Where to write it (default sluice-bundle-<UTC time>.tar.gz here).
        #[arg(long, short = 'o')]
        output: Option<PathBuf>,
        /// A metrics endpoint scraped into the bundle, repeatable (one per broker):
        /// http://host:9644/metrics (a broker's --metrics-listen).
        #[arg(long)]
        metrics_url: Vec<String>,
    },
}

/// One file of the bundle, or why it is missing.
struct Part {
    name: String,
    content: anyhow::Result<Vec<u8>>,
}

fn pretty(value: &Value) -> anyhow::Result<Vec<u8>> {
    let mut bytes = serde_json::to_vec_pretty(value)?;
    bytes.push(b'\n');
    Ok(bytes)
}

pub fn debug(connection: &ConnectionArgs, args: DebugArgs) -> anyhow::Result<()> {
    let DebugCommand::Bundle { output, metrics_url } = args.command;
    let created = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH)?.as_millis() as i64;
    let output = output.unwrap_or_else(|| {
        let stamp = rfc3339_millis(created).replace([':', '.'], "-");
        PathBuf::from(format!("sluice-bundle-{stamp}.tar.gz"))
    });
    // A cluster that cannot be reached at all is an error, not an empty bundle.
    let mut cluster = connection.cluster()?;
    let mut parts = vec![
        Part { name: "metadata.json".into(), content: metadata(&mut cluster).and_then(|v| pretty(&v)) },
        Part { name: "versions.json".into(), content: versions(&mut cluster).and_then(|v| pretty(&v)) },
        Part { name: "topic-configs.json".into(), content: topic_configs(&mut cluster).and_then(|v| pretty(&v)) },
        Part { name: "broker-configs.json".into(), content: all_broker_configs(&mut cluster).and_then(|v| pretty(&v)) },
        Part { name: "groups.json".into(), content: groups(&mut cluster).and_then(|v| pretty(&v)) },
    ];
    for (index, url) in metrics_url.iter().enumerate() {
        parts.push(Part { name: format!("metrics-{index}.txt"), content: scrape(url) });
    }
    let manifest = json!({
        "tool_version": env!("CARGO_PKG_VERSION"),
        "created": rfc3339_millis(created),
        "bootstrap": connection.bootstrap_list(),
        "metrics_urls": metrics_url,
        "parts": parts.iter().map(|part| {
            let status = match &part.content {
                Ok(_) => Value::String("ok".into()),
                Err(error) => Value::String(format!("missing: {error:#}")),
            };
            (part.name.clone(), status)
        }).collect::<serde_json::Map<_, _>>(),
    });
    parts.push(Part { name: "manifest.json".into(), content: pretty(&manifest) });

    let file = File::create(&output).with_context(|| format!("creating {}", output.display()))?;
    let mut archive = tar::Builder::new(GzEncoder::new(file, Compression::default()));
    let mut missing = 0;
    for part in &parts {
        let bytes = match &part.content {
            Ok(bytes) => bytes,
            Err(error) => {
                missing += 1;
                eprintln!("warning: {} left out: {error:#}", part.name);
                continue;
            }
        };
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(u64::try_from(created / 1000).unwrap_or(0));
        header.set_cksum();
        archive
            .append_data(&mut header, format!("{BUNDLE_DIR}/{}", part.name), bytes.as_slice())
            .with_context(|| format!("writing {}", output.display()))?;
    }
    archive.into_inner()?.finish().with_context(|| format!("writing {}", output.display()))?;
    println!("wrote {} ({} of {} parts)", output.display(), parts.len() - missing, parts.len());
    Ok(())
}

fn metadata(cluster: &mut Cluster) -> anyhow::Result<Value> {
    let metadata = cluster.metadata(None)?;
    let brokers: Vec<Value> = metadata
        .brokers
        .iter()
        .map(|b| json!({"node": b.node_id.0, "host": b.host.as_str(), "port": b.port, "rack": b.rack.as_deref()}))
        .collect();
    let topics: Vec<Value> = metadata
        .topics
        .iter()
        .map(|t| {
            let partitions: Vec<Value> = t
                .partitions
                .iter()
                .map(|p| {
                    json!({
                        "partition": p.partition_index,
                        "leader": p.leader_id.0,
                        "leader_epoch": p.leader_epoch,
                        "replicas": p.replica_nodes.iter().map(|n| n.0).collect::<Vec<_>>(),
                        "isr": p.isr_nodes.iter().map(|n| n.0).collect::<Vec<_>>(),
                        "offline_replicas": p.offline_replicas.iter().map(|n| n.0).collect::<Vec<_>>(),
                        "error_code": p.error_code,
                    })
                })
                .collect();
            json!({
                "name": t.name.as_ref().map(|n| n.as_str()),
                "internal": t.is_internal,
                "error_code": t.error_code,
                "partitions": partitions,
            })
        })
        .collect();
    Ok(json!({
        "cluster_id": metadata.cluster_id.as_deref(),
        "controller": metadata.controller_id.0,
        "brokers": brokers,
        "topics": topics,
    }))
}

fn versions(cluster: &mut Cluster) -> anyhow::Result<Value> {
    Ok(serde_json::to_value(broker_versions(cluster)?)?)
}

/// Every topic's configs, one DescribeConfigs for all of them.
fn topic_configs(cluster: &mut Cluster) -> anyhow::Result<Value> {
    let metadata = cluster.metadata(None)?;
    let names: Vec<String> = metadata.topics.iter().filter_map(|t| t.name.as_ref().map(|n| n.to_string())).collect();
    let mut configs = serde_json::Map::new();
    if names.is_empty() {
        return Ok(Value::Object(configs));
    }
    let mut request = DescribeConfigsRequest::default();
    request.resources = names
        .iter()
        .map(|name| {
            DescribeConfigsResource::default()
                .with_resource_type(RESOURCE_TOPIC)
                .with_resource_name(StrBytes::from_string(name.clone()))
                .with_configuration_keys(None)
        })
        .collect();
    let response = cluster.bootstrap.send(DESCRIBE_CONFIGS_VERSION, request)?;
    for result in response.results {
        let name = result.resource_name.to_string();
        if let Err(error) = check(result.error_code, result.error_message.as_deref(), &format!("configs of {name}")) {
            configs.insert(name, json!({"error": format!("{error:#}")}));
            continue;
        }
        let entries: Vec<Value> = result
            .configs
            .iter()
            .map(|c| {
                let value = if c.is_sensitive { None } else { c.value.as_deref() };
                json!({"name": c.name.as_str(), "value": value, "source": config_source(c.config_source)})
            })
            .collect();
        configs.insert(name, Value::Array(entries));
    }
    Ok(Value::Object(configs))
}

/// The cluster-wide default and each broker's own configs.
fn all_broker_configs(cluster: &mut Cluster) -> anyhow::Result<Value> {
    let mut all = serde_json::Map::new();
    all.insert("cluster_default".into(), serde_json::to_value(broker_configs(cluster, "", None, None)?)?);
    let metadata = cluster.metadata(Some(&[]))?;
    for (node, address) in Cluster::addresses(&metadata) {
        let configs = match broker_configs(cluster, &node.to_string(), Some(&address), None) {
            Ok(configs) => serde_json::to_value(configs)?,
            Err(error) => json!({"error": format!("{error:#}")}),
        };
        all.insert(format!("broker-{node}"), configs);
    }
    Ok(Value::Object(all))
}

/// Every group of every type with its state, and the committed offsets of the consumer
/// groups (share groups keep theirs elsewhere: `sluice share describe`).
fn groups(cluster: &mut Cluster) -> anyhow::Result<Value> {
    let metadata = cluster.metadata(Some(&[]))?;
    let mut listed = Vec::new();
    for (node, address) in Cluster::addresses(&metadata) {
        let response = cluster.connect(&address)?.send(LIST_GROUPS_VERSION, ListGroupsRequest::default())?;
        check(response.error_code, None, &format!("listing the groups of broker {node}"))?;
        for group in response.groups {
            listed.push((group.group_id.to_string(), group.group_type.to_string(), group.group_state.to_string()));
        }
    }
    listed.sort();
    let mut groups = Vec::new();
    for (group, group_type, state) in listed {
        let committed = if group_type == "share" {
            Value::Null
        } else {
            match coordinator(cluster, &group).and_then(|mut c| committed_offsets(&mut c, &group)) {
                Ok(offsets) => Value::Array(
                    offsets
                        .into_iter()
                        .map(|((topic, partition), offset)| {
                            json!({"topic": topic, "partition": partition, "offset": offset})
                        })
                        .collect(),
                ),
                Err(error) => json!({"error": format!("{error:#}")}),
            }
        };
        groups.push(json!({"group": group, "type": group_type, "state": state, "committed": committed}));
    }
    Ok(Value::Array(groups))
}

/// GET `url` (a Prometheus text page).
fn scrape(url: &str) -> anyhow::Result<Vec<u8>> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder().timeout(METRICS_TIMEOUT).build().context("HTTP client")?;
        let answer = match client.get(url).send().await {
            Ok(answer) => answer,
            Err(error) => bail!("cannot reach {url}: {}", http_reason(&error)),
        };
        let status = answer.status();
        if !status.is_success() {
            bail!("{url} answered HTTP {status}");
        }
        let bytes = answer.bytes().await.with_context(|| format!("reading {url}"))?;
        if bytes.len() > METRICS_BYTES_MAX {
            bail!("{url} answered {} bytes, more than {METRICS_BYTES_MAX}", bytes.len());
        }
        Ok(bytes.to_vec())
    })
}

/// Why an HTTP request failed, in words ("connection refused"), not reqwest's whole chain.
fn http_reason(error: &reqwest::Error) -> String {
    if error.is_timeout() {
        return format!("no answer within {} ms", METRICS_TIMEOUT.as_millis());
    }
    let root = std::iter::successors(Some(error as &dyn std::error::Error), |e| e.source()).last();
    match root.and_then(|e| e.downcast_ref::<std::io::Error>()) {
        Some(io) => sluice_client::connection::io_reason(io, METRICS_TIMEOUT),
        None => root.map_or_else(|| error.to_string(), ToString::to_string),
    }
}
