//! How a broker takes part in a cluster: it runs its member of the controller quorum
//! (`sluice-cluster`), follows the replicated metadata (topics, leaders, ISR) into the
//! local topic registry and the partition roles ([`crate::replication`]), and sends
//! topic administration and ISR changes to the controller.
//!
//! Why metadata is applied by one task: every role change happens in metadata order, so
//! a partition never sees an older leader epoch after a newer one.

use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sluice_cluster::{ClusterMetadata, Controller, ControllerConfig};
use sluice_storage::TopicPartition;

use crate::config::ClusterConfig;
use crate::replication::{Assignment, IsrChanges, ReplicaManager};
use crate::topics::TopicMeta;
use crate::Broker;

/// The controller of this node, once started.
#[derive(Default)]
pub struct ClusterLink {
    controller: OnceLock<Arc<Controller>>,
}

impl ClusterLink {
    pub fn controller(&self) -> Option<&Arc<Controller>> {
        self.controller.get()
    }

    /// The metadata this node has applied (empty before the controller started).
    pub fn metadata(&self) -> Arc<ClusterMetadata> {
        match self.controller.get() {
            Some(controller) => controller.metadata().borrow().clone(),
            None => Arc::new(ClusterMetadata::default()),
        }
    }
}

impl IsrChanges for ClusterLink {
    fn alter_isr(
        &self,
        topic: String,
        partition: i32,
        leader_epoch: i32,
        partition_epoch: i32,
        isr: Vec<i32>,
    ) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> {
        let controller = self.controller.get().cloned();
        Box::pin(async move {
            let controller = controller.ok_or("controller not started")?;
            controller
                .alter_partition(&topic, partition, leader_epoch, partition_epoch, isr)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
    }
}

/// Starts this node's controller and the tasks that apply metadata, fetch as a follower
/// and check ISRs. Returns once the controller runs (not once a leader is elected).
pub async fn join(broker: &Arc<Broker>, cluster: &ClusterConfig) -> anyhow::Result<()> {
    let link = broker.cluster.clone().expect("cluster mode");
    let (host, port) = broker.advertised.clone();
    let config = ControllerConfig {
        node_id: broker.node_id(),
        listen: cluster.controller_listen,
        voters: cluster.voters().map_err(anyhow::Error::msg)?,
        data_dir: broker.config().data_dir.clone(),
        kafka_host: host,
        kafka_port: u16::try_from(port)?,
        rack: None,
        heartbeat_interval_ms: cluster.heartbeat_interval_ms,
        session_timeout_ms: cluster.session_timeout_ms,
        election_timeout_min_ms: cluster.election_timeout_min_ms,
        election_timeout_max_ms: cluster.election_timeout_min_ms * 2,
        auto_leader_rebalance_enable: true,
        leader_rebalance_interval_ms: LEADER_REBALANCE_INTERVAL_MS,
        write_timeout_ms: ADMIN_TIMEOUT.as_millis() as u64,
        snapshot_interval_entries: sluice_cluster::SNAPSHOT_INTERVAL_ENTRIES_DEFAULT,
    };
    let controller = Controller::start(config).await?;
    let _ = link.controller.set(controller.clone());
    let mut metadata = controller.metadata();
    let weak = Arc::downgrade(broker);
    tokio::spawn(async move {
        loop {
            let current = metadata.borrow_and_update().clone();
            let Some(broker) = weak.upgrade() else { return };
            match tokio::task::spawn_blocking(move || apply_blocking(&broker, &current)).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => tracing::error!(%error, "applying cluster metadata failed"),
                Err(error) => tracing::error!(%error, "metadata task panicked"),
            }
            if metadata.changed().await.is_err() {
                return;
            }
        }
    });
    crate::replication::fetcher::spawn_supervisor(broker);
    broker.replicas.as_ref().expect("cluster mode").spawn_isr_checker();
    Ok(())
}

/// Applies one metadata version: topic registry, broker addresses, partition roles.
fn apply_blocking(broker: &Arc<Broker>, metadata: &ClusterMetadata) -> std::io::Result<()> {
    let replicas: &Arc<ReplicaManager> = broker.replicas.as_ref().expect("cluster mode");
    let me = broker.node_id();
    replicas.set_brokers(
        metadata.brokers.values().map(|b| (b.node_id, format!("{}:{}", b.host, b.port))).collect::<BTreeMap<_, _>>(),
    );
    broker.topics.replace_all(
        metadata
            .topics
            .iter()
            .map(|(name, t)| TopicMeta {
                name: name.clone(),
                id: t.topic_id,
                partitions: t.partitions.len() as i32,
                configs: t.configs.clone(),
            })
            .collect(),
    );
    let defaults = &broker.config().topic_defaults;
    let mut hosted = HashSet::new();
    for (name, topic) in &metadata.topics {
        let config = defaults.replication_config(&topic.configs);
        for (index, partition) in topic.partitions.iter().enumerate() {
            if !partition.replicas.contains(&me) {
                continue;
            }
            let assignment = Assignment {
                replicas: partition.replicas.clone(),
                leader: partition.leader,
                leader_epoch: partition.leader_epoch,
                isr: partition.isr.clone(),
                partition_epoch: partition.partition_epoch,
            };
            replicas.apply(&broker.logs, name, index as i32, &assignment, &config)?;
            hosted.insert(TopicPartition::new(name.clone(), index as i32));
        }
    }
    follow_offsets_leadership(broker, replicas, metadata);
    for (tp, _) in replicas.hosted() {
        if !hosted.contains(&tp) {
            tracing::info!(topic = %tp.topic, partition = tp.partition, "partition no longer hosted here; deleting");
            replicas.remove(&broker.logs, &tp.topic, tp.partition)?;
        }
    }
    Ok(())
}

/// The hook of the group coordinator: which `__consumer_offsets` partitions this node
/// leads now, and at which epoch (it loads those and drops the others).
fn follow_offsets_leadership(broker: &Arc<Broker>, replicas: &ReplicaManager, metadata: &ClusterMetadata) {
    let count = metadata.topics.get(crate::group::OFFSETS_TOPIC).map_or(0, |topic| topic.partitions.len() as i32);
    let leaders = (0..count)
        .map(|p| replicas.get(crate::group::OFFSETS_TOPIC, p).and_then(|r| r.leader_epoch().map(|e| (r, e))))
        .collect();
    broker.groups.start_ticker(broker);
    broker.groups.follow_leadership(leaders);
}

/// How often the active controller moves leadership back to preferred replicas.
pub const LEADER_REBALANCE_INTERVAL_MS: u64 = 10_000;
/// How long an admin request waits for the controller.
pub const ADMIN_TIMEOUT: Duration = Duration::from_secs(30);

/// What admin requests not yet routed through the controller answer in cluster mode.
pub const NOT_YET_IN_CLUSTER: &str =
    "not supported in cluster mode yet: DeleteTopics, CreatePartitions and config changes need the controller path";
