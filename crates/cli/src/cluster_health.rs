//! `sluice cluster health`: whether the cluster can take what clients ask of it, for
//! scripts and orchestration. Healthy means every registered broker is unfenced (DescribeCluster
//! v2 lists the fenced ones too) and every partition has a leader and its whole replica set
//! in sync (Metadata). With `--wait` it asks again until that holds or `--timeout` passes, so a
//! script can start a cluster and go on once it is whole; the exit status says which.
//!
//! A node's client listener answers only once the node is registered and unfenced, so a
//! node still starting is seen as one not answering yet: each attempt is bounded by
//! [`ATTEMPT_TIMEOUT_MAX`] and the next bootstrap address is tried.

use std::time::{Duration, Instant};

use anyhow::bail;
use kafka_protocol::messages::{DescribeClusterRequest, DescribeClusterResponse, MetadataRequest, MetadataResponse};
use serde::Serialize;
use sluice_client::{check, Connector};

use crate::kafka_connection::ConnectionArgs;
use crate::output::{count, Format};

/// DescribeCluster v2: `include_fenced_brokers` (KIP-1073).
const DESCRIBE_CLUSTER_VERSION: i16 = 2;
/// Metadata v12, as the other tools ask.
const METADATA_VERSION: i16 = 12;
/// How long one attempt may wait for a broker to connect or answer (a node not ready yet
/// holds connections unanswered).
const ATTEMPT_TIMEOUT_MAX: Duration = Duration::from_secs(5);
/// Pause between two attempts of `--wait`.
const RETRY_INTERVAL: Duration = Duration::from_millis(250);
/// Unhealthy partitions named in a report (the rest are counted).
const PARTITIONS_NAMED_MAX: usize = 10;

#[derive(Debug, clap::Args)]
pub struct HealthArgs {
    /// Ask again until the cluster is healthy or --timeout passes (exit status 0 once
    /// healthy, 1 on timeout), instead of answering once.
    #[arg(long)]
    wait: bool,
    /// How long --wait keeps asking: 30s, 2m, 500ms...
    #[arg(long, value_parser = humantime::parse_duration, default_value = "60s", value_name = "DURATION")]
    timeout: Duration,
    /// Also require at least this many registered brokers (a node that has not registered
    /// yet is otherwise unknown to the cluster).
    #[arg(long, default_value_t = 1, value_name = "N")]
    min_brokers: usize,
}

/// What one look at the cluster found.
#[derive(Debug, Serialize)]
struct Health {
    healthy: bool,
    brokers: Vec<i32>,
    fenced_brokers: Vec<i32>,
    partitions: usize,
    under_replicated: Vec<String>,
    offline: Vec<String>,
}

impl Health {
    fn problems(&self, min_brokers: usize) -> Vec<String> {
        let mut problems = Vec::new();
        if self.brokers.len() < min_brokers {
            problems.push(format!("{} registered, fewer than {min_brokers}", count(self.brokers.len(), "broker")));
        }
        if !self.fenced_brokers.is_empty() {
            problems.push(format!("fenced brokers: {}", list(&self.fenced_brokers)));
        }
        for (names, what) in [(&self.offline, "offline (no leader)"), (&self.under_replicated, "under-replicated")] {
            if !names.is_empty() {
                let mut named = names.iter().take(PARTITIONS_NAMED_MAX).cloned().collect::<Vec<_>>().join(", ");
                if names.len() > PARTITIONS_NAMED_MAX {
                    named.push_str(&format!(" and {} more", names.len() - PARTITIONS_NAMED_MAX));
                }
                problems.push(format!("{} {what}: {named}", count(names.len(), "partition")));
            }
        }
        problems
    }
}

fn list(ids: &[i32]) -> String {
    ids.iter().map(i32::to_string).collect::<Vec<_>>().join(", ")
}

pub fn health(connection: &ConnectionArgs, format: Format, args: HealthArgs) -> anyhow::Result<()> {
    let deadline = Instant::now() + args.timeout;
    let mut connector = connection.connector()?;
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        connector.limit_timeouts(remaining.clamp(Duration::from_millis(100), ATTEMPT_TIMEOUT_MAX));
        let problems = match look(connection, &connector) {
            Ok(mut health) => {
                let problems = health.problems(args.min_brokers);
                if problems.is_empty() {
                    health.healthy = true;
                    if !format.document(&health)? {
                        println!(
                            "healthy: {} unfenced ({}), {} led and fully replicated",
                            count(health.brokers.len(), "broker"),
                            list(&health.brokers),
                            count(health.partitions, "partition")
                        );
                    }
                    return Ok(());
                }
                if !args.wait {
                    format.document(&health)?;
                }
                problems.join("; ")
            }
            Err(error) => format!("{error:#}"),
        };
        if !args.wait {
            bail!("cluster not healthy: {problems}");
        }
        if Instant::now() + RETRY_INTERVAL >= deadline {
            bail!("cluster not healthy after {}: {problems}", humantime::format_duration(args.timeout));
        }
        std::thread::sleep(RETRY_INTERVAL);
    }
}

/// One look: the brokers (fenced ones too) and every partition's leader and ISR, from the
/// first bootstrap broker that answers.
fn look(connection: &ConnectionArgs, connector: &Connector) -> anyhow::Result<Health> {
    let mut first_error = None;
    for address in connection.bootstrap_list().split(',').map(str::trim).filter(|a| !a.is_empty()) {
        match ask(connector, address) {
            Ok(answers) => return Ok(judge(answers)),
            Err(error) => {
                first_error.get_or_insert(error);
            }
        }
    }
    Err(first_error.unwrap_or_else(|| anyhow::anyhow!("-b names no broker")))
}

fn ask(connector: &Connector, address: &str) -> anyhow::Result<(DescribeClusterResponse, MetadataResponse)> {
    let mut broker = connector.connect(address)?;
    let described: DescribeClusterResponse =
        broker.send(DESCRIBE_CLUSTER_VERSION, DescribeClusterRequest::default().with_include_fenced_brokers(true))?;
    check(described.error_code, described.error_message.as_deref(), "DescribeCluster")?;
    let mut request = MetadataRequest::default();
    request.allow_auto_topic_creation = false;
    request.topics = None;
    let metadata: MetadataResponse = broker.send(METADATA_VERSION, request)?;
    Ok((described, metadata))
}

fn judge((described, metadata): (DescribeClusterResponse, MetadataResponse)) -> Health {
    let mut brokers: Vec<i32> = described.brokers.iter().map(|b| b.broker_id.0).collect();
    let mut fenced_brokers: Vec<i32> =
        described.brokers.iter().filter(|b| b.is_fenced).map(|b| b.broker_id.0).collect();
    brokers.sort_unstable();
    fenced_brokers.sort_unstable();
    let (mut partitions, mut under_replicated, mut offline) = (0, Vec::new(), Vec::new());
    for topic in &metadata.topics {
        let name = topic.name.as_ref().map_or(String::new(), |n| n.to_string());
        for partition in &topic.partitions {
            partitions += 1;
            let named = format!("{name}-{}", partition.partition_index);
            if partition.leader_id.0 < 0 {
                offline.push(named);
            } else if partition.isr_nodes.len() < partition.replica_nodes.len() {
                under_replicated.push(named);
            }
        }
    }
    under_replicated.sort();
    offline.sort();
    Health { healthy: false, brokers, fenced_brokers, partitions, under_replicated, offline }
}
