//! How a broker takes part in a cluster: it runs its member of the controller quorum
//! (`sluice-cluster`), follows the replicated metadata (topics, leaders, ISR) into the
//! local topic registry and the partition roles ([`crate::replication`]), and sends
//! topic administration and ISR changes to the controller.
//!
//! Why metadata is applied by one task: every role change happens in metadata order, so
//! a partition never sees an older leader epoch after a newer one.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;
use sluice_cluster::{BrokerInfo, ClusterMetadata, Controller, ControllerConfig, NO_LEADER};
use sluice_storage::{LogManager, TopicPartition};
use tokio::sync::watch;
use uuid::Uuid;

use crate::Broker;
use sluice_config::ClusterConfig;
use sluice_coordinator::placement::IncomingLeaderships;
use sluice_meta::topics::TopicMeta;
use sluice_replication::{Assignment, IsrChanges, ReplicaManager};

/// The controller of this node, once started.
pub struct ClusterLink {
    controller: OnceLock<Arc<Controller>>,
    /// The metadata version this broker has applied (topic registry and replica roles).
    applied_version: watch::Sender<u64>,
    /// The topic id each hosted topic had when last applied: a topic deleted and created
    /// again under the same name between two applies gets fresh, empty logs.
    applied_topic_ids: Mutex<HashMap<String, Uuid>>,
    /// Set once the logs left on disk by partitions deleted or moved away while this node
    /// was down are removed (at the first apply that includes this process's registration).
    strays_removed: AtomicBool,
    /// This node's data directory id (`meta.properties`).
    directory_id: Uuid,
}

impl ClusterLink {
    /// The link of a node whose data directory has `directory_id`.
    pub fn new(directory_id: Uuid) -> ClusterLink {
        ClusterLink {
            controller: OnceLock::new(),
            applied_version: watch::channel(0).0,
            applied_topic_ids: Mutex::new(HashMap::new()),
            strays_removed: AtomicBool::new(false),
            directory_id,
        }
    }

    /// Waits until this broker applied metadata `version` or later (so an admin request
    /// answers only once its change shows here). False on timeout.
    pub async fn wait_applied(&self, version: u64, timeout: Duration) -> bool {
        let mut applied = self.applied_version.subscribe();
        tokio::time::timeout(timeout, applied.wait_for(|&v| v >= version)).await.is_ok_and(|r| r.is_ok())
    }

    /// The version of this node's controller metadata now (what a write just made is in).
    pub fn controller_version(&self) -> u64 {
        self.controller.get().map_or(0, |c| c.metadata().borrow().version)
    }

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
    // Other nodes replicate from the inter-broker listener; clients get the endpoint of
    // the listener they connected to.
    let (host, port) = broker.advertised(broker.inter_broker_listener);
    let mut endpoints: Vec<sluice_cluster::Endpoint> = broker
        .listeners()
        .iter()
        .map(|listener| {
            let port = u16::try_from(listener.advertised.1).expect("advertised ports are validated u16");
            sluice_cluster::Endpoint { name: listener.name.clone(), host: listener.advertised.0.clone(), port }
        })
        .collect();
    // Where other nodes forward schema registry writes when this node leads `_schemas`.
    if let Some(registry) = broker.config().schema_registry_listen {
        let host = if registry.ip().is_unspecified() { host.clone() } else { registry.ip().to_string() };
        let name = sluice_schema_registry::REGISTRY_ENDPOINT.to_string();
        endpoints.push(sluice_cluster::Endpoint { name, host, port: registry.port() });
    }
    let config = ControllerConfig {
        node_id: broker.node_id(),
        listen: cluster.controller_listen,
        voters: cluster.voters().map_err(anyhow::Error::msg)?,
        // Its entry in the voters, else the controller listener (with the advertised host
        // when that listens on every interface).
        advertised_address: None,
        data_dir: broker.config().data_dir.clone(),
        directory_id: link.directory_id,
        kafka_host: host,
        kafka_port: u16::try_from(port)?,
        kafka_endpoints: endpoints,
        rack: None,
        heartbeat_interval_ms: cluster.heartbeat_interval_ms,
        session_timeout_ms: cluster.session_timeout_ms,
        election_timeout_min_ms: cluster.election_timeout_min_ms,
        election_timeout_max_ms: cluster.election_timeout_min_ms * 2,
        auto_leader_rebalance_enable: true,
        leader_rebalance_interval_ms: LEADER_REBALANCE_INTERVAL_MS,
        write_timeout_ms: ADMIN_TIMEOUT.as_millis() as u64,
        snapshot_interval_entries: sluice_cluster::SNAPSHOT_INTERVAL_ENTRIES_DEFAULT,
        source_address: cluster.source_address,
        cluster_id: broker.topics.cluster_id(),
        rpc_secret: cluster
            .rpc_secret()
            .map_err(anyhow::Error::msg)?
            .expect("the rpc secret is resolved when the broker opens (ensure_rpc_secret)"),
        rpc_tls: match cluster.rpc_tls {
            true => Some(sluice_security::tls::rpc_tls(&broker.config().tls_settings()).map_err(anyhow::Error::msg)?),
            false => None,
        },
    };
    // On its own runtime: a stalled data path (busy or blocked I/O threads) must not delay
    // this node's controller heartbeats and get a healthy broker fenced.
    let controller = controller_runtime().spawn(Controller::start(config)).await??;
    let _ = link.controller.set(controller.clone());
    let mut metadata = controller.metadata();
    let weak = Arc::downgrade(broker);
    tokio::spawn(async move {
        loop {
            let current = metadata.borrow_and_update().clone();
            let Some(broker) = weak.upgrade() else { return };
            let version = current.version;
            let link = broker.cluster.clone().expect("cluster mode");
            match tokio::task::spawn_blocking(move || apply_blocking(&broker, &current)).await {
                Ok(Ok(())) => {
                    link.applied_version.send_replace(version);
                }
                Ok(Err(error)) => tracing::error!(%error, "applying cluster metadata failed"),
                Err(error) => tracing::error!(%error, "metadata task panicked"),
            }
            if metadata.changed().await.is_err() {
                return;
            }
        }
    });
    sluice_replication::spawn_supervisor(broker);
    broker.replicas.as_ref().expect("cluster mode").spawn_isr_checker();
    tokio::spawn(stop_on_fsync_failure(broker.logs.fsync_failures()));
    Ok(())
}

/// The file in the data dir holding the controller-RPC secret a single voter generates.
pub const GENERATED_RPC_SECRET_FILE: &str = "controller.secret";
/// Random bytes in a generated secret (written hex-encoded).
const GENERATED_RPC_SECRET_BYTES: usize = 32;

/// Makes sure this node's controller RPCs are authenticated: a configured secret file is
/// checked to be its owner's only (a warning otherwise); without one, a single voter uses
/// the secret it generated at its first start in the data dir (more voters are refused by
/// [`ClusterConfig::validate`]: they must share one).
pub(crate) fn ensure_rpc_secret(cluster: &mut ClusterConfig, data_dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(path) = &cluster.rpc_secret_file {
        let mode = std::fs::metadata(path)?.permissions().mode();
        if mode & 0o077 != 0 {
            tracing::warn!(
                path = %path.display(),
                mode = format!("{:o}", mode & 0o777),
                "cluster.rpc_secret_file is readable by others: whoever reads it can act as a controller (chmod 600)"
            );
        }
        return Ok(());
    }
    assert_eq!(cluster.voters().map(|voters| voters.len()).ok(), Some(1), "validated: one voter");
    let path = data_dir.join(GENERATED_RPC_SECRET_FILE);
    if !path.exists() {
        let secret: [u8; GENERATED_RPC_SECRET_BYTES] = rand::random();
        let hex: String = secret.iter().map(|byte| format!("{byte:02x}")).collect();
        sluice_storage::write_private_file_atomically(&path, hex.as_bytes())?;
        tracing::info!(path = %path.display(), "generated this controller's rpc secret");
    }
    cluster.rpc_secret_file = Some(path);
    Ok(())
}

/// Worker threads of the controller's runtime (raft, heartbeats, liveness: light work).
pub const CONTROLLER_THREADS: usize = 2;

/// The runtime the controller runs on, apart from the one serving clients; it lives as
/// long as the process.
fn controller_runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(CONTROLLER_THREADS)
            .thread_name("sluice-controller")
            .enable_all()
            .build()
            .expect("the controller runtime starts")
    })
}

/// The exit status of a node that stopped because an fsync failed.
pub const FSYNC_FAILURE_EXIT_CODE: i32 = 3;

/// A failed fsync leaves data of unknown durability in the page cache (a retry may report
/// success without writing it), so the partition went offline; in a cluster the whole node
/// stops, as Kafka halts a broker whose (last) log directory failed: its leaderships move to
/// in-sync replicas and it leaves the ISRs, instead of holding partitions it cannot serve.
/// A restart recovers from what is on disk and catches up from the leaders.
async fn stop_on_fsync_failure(mut failures: tokio::sync::watch::Receiver<u64>) {
    if failures.wait_for(|&failed| failed > 0).await.is_ok() {
        tracing::error!(
            exit_code = FSYNC_FAILURE_EXIT_CODE,
            "an fsync failed: stopping this node so its partitions fail over to in-sync replicas; \
             restart it once the disk is healthy"
        );
        std::process::exit(FSYNC_FAILURE_EXIT_CODE);
    }
}

/// Exit code of a node whose binary is older than the cluster's metadata.version.
pub const METADATA_VERSION_EXIT_CODE: i32 = 78;

/// Applies one metadata version: topic registry, broker addresses, partition roles.
fn apply_blocking(broker: &Arc<Broker>, metadata: &ClusterMetadata) -> std::io::Result<()> {
    // A binary older than the cluster's finalized metadata.version would misread it.
    if metadata.metadata_version() > sluice_cluster::METADATA_VERSION_LATEST {
        tracing::error!(
            cluster = metadata.metadata_version(),
            supported = sluice_cluster::METADATA_VERSION_LATEST,
            "the cluster's metadata.version is newer than this binary understands: run the newer binary \
             (downgrades past a finalized metadata.version are not supported)"
        );
        std::process::exit(METADATA_VERSION_EXIT_CODE);
    }
    let replicas: &Arc<ReplicaManager> = broker.replicas.as_ref().expect("cluster mode");
    let me = broker.node_id();
    broker.quotas.set_configured(&metadata.client_quotas);
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
    remove_recreated_topics(broker, metadata)?;
    // Partition roles wait for this process's own registration: only metadata that
    // includes it is known to be current (what is replayed from disk at start may lag what
    // the node applied before it stopped), so only then does "not assigned here" mean
    // deleted or moved away rather than "not applied yet".
    let Some(registration) = own_registration(broker, metadata) else { return Ok(()) };
    let registered = !registration.fenced;
    if registered {
        expect_coordinator_leaderships(broker, metadata);
    }
    let defaults = &broker.config().topic_defaults;
    let mut hosted = HashSet::new();
    for (name, topic) in &metadata.topics {
        let config = defaults.replication_config(&topic.configs);
        for (index, partition) in topic.partitions.iter().enumerate() {
            if !partition.replicas.contains(&me) {
                continue;
            }
            let tp = TopicPartition::new(name.clone(), index as i32);
            let unmarked = replicas.get(name, tp.partition).is_none() && claim_dir(&broker.logs, &tp, topic.topic_id)?;
            // A leadership naming this node while it is fenced belongs to a previous
            // incarnation or is being taken away; leading at that epoch would serve the
            // previous process's unreplicated tail as committed (its high watermark after
            // recovery is its log end).
            let leader = if partition.leader == me && !registered { NO_LEADER } else { partition.leader };
            let assignment = Assignment {
                replicas: partition.replicas.clone(),
                leader,
                leader_epoch: partition.leader_epoch,
                isr: partition.isr.clone(),
                partition_epoch: partition.partition_epoch,
            };
            replicas.apply(&broker.logs, name, tp.partition, &assignment, &config)?;
            if config.log.remote_storage {
                // Leaders and followers alike: local retention keeps what is not yet remote,
                // and a new leader serves the remote part from its first fetch.
                if let Some(replica) = replicas.get(name, tp.partition) {
                    let remote = metadata.remote_log(&topic.topic_id, tp.partition);
                    replica.log.set_remote_tier(remote.and_then(|r| r.range()));
                }
            }
            if unmarked {
                mark_dir(&broker.logs, &tp, topic.topic_id)?;
            }
            hosted.insert(tp);
        }
    }
    follow_offsets_leadership(broker, replicas, metadata);
    for (tp, _) in replicas.hosted() {
        if !hosted.contains(&tp) {
            tracing::info!(topic = %tp.topic, partition = tp.partition, "partition no longer hosted here; deleting");
            replicas.remove(&broker.logs, &tp.topic, tp.partition)?;
        }
    }
    let link = broker.cluster.as_ref().expect("cluster mode");
    if !link.strays_removed.swap(true, Ordering::AcqRel) {
        // Only directories a replica marked: anything else (a single-node data dir started
        // in cluster mode) is not known to be garbage.
        for dir in broker.logs.unopened_dirs()? {
            if dir.join(TOPIC_ID_FILE).exists() {
                tracing::info!(dir = %dir.display(), "deleting the log of a partition deleted or moved away while down");
                std::fs::remove_dir_all(&dir)?;
            } else {
                tracing::warn!(dir = %dir.display(), "keeping a directory no replica claims (not created in cluster mode)");
            }
        }
    }
    Ok(())
}

/// The file in a partition's directory naming the topic id its log belongs to (Kafka's
/// `partition.metadata`).
const TOPIC_ID_FILE: &str = "topic-id";

/// Before a replica's log is opened: a directory left by another topic of the same name
/// (deleted and created again while this node was down) is deleted, never read as this one.
/// Returns whether the directory still needs its marker. A marker that does not parse (a
/// crash right after it was created) proves nothing and is written again.
fn claim_dir(logs: &LogManager, tp: &TopicPartition, topic_id: Uuid) -> std::io::Result<bool> {
    let dir = logs.dir_of(tp);
    let owner = match std::fs::read_to_string(dir.join(TOPIC_ID_FILE)) {
        Ok(text) => Uuid::parse_str(text.trim()).ok(),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
        Err(error) => return Err(error),
    };
    match owner {
        Some(owner) if owner == topic_id => Ok(false),
        Some(_) => {
            tracing::info!(topic = %tp.topic, partition = tp.partition, "log belongs to a deleted topic of the same name; deleting");
            std::fs::remove_dir_all(&dir)?;
            Ok(true)
        }
        None => Ok(true),
    }
}

/// After a replica's log is opened: records which topic it belongs to, durably (a marker
/// lost to a power loss would let a recreated topic reuse the old log).
fn mark_dir(logs: &LogManager, tp: &TopicPartition, topic_id: Uuid) -> std::io::Result<()> {
    sluice_storage::write_file_atomically(&logs.dir_of(tp).join(TOPIC_ID_FILE), topic_id.to_string().as_bytes())
}

/// Before the replicas are applied (opening their logs takes a while): tells each
/// coordinator which partitions of its internal topic this metadata has this node lead, so
/// that a client sent here by a node further along is told to retry, not to look again.
fn expect_coordinator_leaderships(broker: &Arc<Broker>, metadata: &ClusterMetadata) {
    let me = broker.node_id();
    let led_here = |topic: &str| {
        let Some(topic) = metadata.topics.get(topic) else { return IncomingLeaderships::default() };
        let led = topic.partitions.iter().enumerate().filter(|(_, p)| p.leader == me).map(|(index, _)| index as i32);
        IncomingLeaderships::new(topic.partitions.len() as i32, led.collect())
    };
    broker.groups.expect_leadership(led_here(sluice_coordinator::group::OFFSETS_TOPIC));
    broker.transactions.expect_leadership(led_here(sluice_coordinator::txn::log::TXN_STATE_TOPIC));
    broker.shares.store.expect_leadership(led_here(sluice_coordinator::share::store::SHARE_STATE_TOPIC));
}

/// The hook of the group coordinator: which `__consumer_offsets` partitions this node
/// leads now, and at which epoch (it loads those and drops the others).
fn follow_offsets_leadership(broker: &Arc<Broker>, replicas: &ReplicaManager, metadata: &ClusterMetadata) {
    let count =
        metadata.topics.get(sluice_coordinator::group::OFFSETS_TOPIC).map_or(0, |topic| topic.partitions.len() as i32);
    let leaders = (0..count)
        .map(|p| {
            replicas.get(sluice_coordinator::group::OFFSETS_TOPIC, p).and_then(|r| r.leader_epoch().map(|e| (r, e)))
        })
        .collect();
    broker.groups.start_ticker(broker);
    broker.groups.follow_leadership(leaders);
    let topic = sluice_coordinator::txn::log::TXN_STATE_TOPIC;
    let count = metadata.topics.get(topic).map_or(0, |t| t.partitions.len() as i32);
    let leaders = (0..count).map(|p| replicas.get(topic, p).and_then(|r| r.leader_epoch().map(|e| (r, e)))).collect();
    broker.transactions.follow_leadership(leaders);
    let topic = sluice_coordinator::share::store::SHARE_STATE_TOPIC;
    let count = metadata.topics.get(topic).map_or(0, |t| t.partitions.len() as i32);
    let leaders = (0..count).map(|p| replicas.get(topic, p).and_then(|r| r.leader_epoch().map(|e| (r, e)))).collect();
    broker.shares.store.follow_leadership(leaders);
    broker.shares.follow_group_configs(&metadata.group_configs);
}

/// Deletes the logs of a topic whose id changed since the last apply (deleted and created
/// again in between): its old data must not show under the new topic.
fn remove_recreated_topics(broker: &Arc<Broker>, metadata: &ClusterMetadata) -> std::io::Result<()> {
    let replicas: &Arc<ReplicaManager> = broker.replicas.as_ref().expect("cluster mode");
    let link = broker.cluster.as_ref().expect("cluster mode");
    let mut known = link.applied_topic_ids.lock();
    for (tp, _) in replicas.hosted() {
        let current = metadata.topics.get(&tp.topic).map(|t| t.topic_id);
        if current.is_some() && known.get(&tp.topic).is_some_and(|id| Some(*id) != current) {
            tracing::info!(topic = %tp.topic, partition = tp.partition, "topic was recreated; deleting the old log");
            replicas.remove(&broker.logs, &tp.topic, tp.partition)?;
        }
    }
    *known = metadata.topics.iter().map(|(name, t)| (name.clone(), t.topic_id)).collect();
    Ok(())
}

/// This process's own registration (its incarnation), fenced or not, once applied.
pub(crate) fn own_registration<'a>(broker: &Broker, metadata: &'a ClusterMetadata) -> Option<&'a BrokerInfo> {
    let controller = broker.cluster.as_ref()?.controller()?;
    metadata.brokers.get(&broker.node_id()).filter(|info| info.incarnation == controller.incarnation())
}

/// How often the active controller moves leadership back to preferred replicas.
pub const LEADER_REBALANCE_INTERVAL_MS: u64 = 10_000;
/// How long an admin request waits for the controller.
pub const ADMIN_TIMEOUT: Duration = Duration::from_secs(30);
