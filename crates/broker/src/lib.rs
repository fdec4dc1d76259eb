//! The single-node Sluice broker: accepts Kafka clients, routes their requests to the
//! handlers, and owns the storage engine and the topic registry.
//!
//! Entry point: [`Broker::open`] (recovers the data dir) then [`server::serve`].

pub(crate) mod amqp_host;
mod amqp_routing;
mod blocking;
pub mod cluster_link;
mod connection;
mod connection_limits;
mod console_host;
mod coordinator_host;
mod fetch_session;
mod handlers;
mod http_auth;
mod load_totals;
mod metadata_writes;
pub mod metrics;
mod open;
mod replica_host;
mod schema_host;
mod security;
pub mod server;
mod tiered_host;

use std::io;
use std::sync::Arc;

use sluice_storage::{LogManager, Partition, TopicPartition};
use tokio::sync::Semaphore;

use sluice_config::BrokerConfig;
use sluice_coordinator::group::GroupCoordinator;
use sluice_coordinator::share;
use sluice_meta::topics::{self as topics, TopicMeta, TopicRegistry};
use sluice_tiered::TieredStorage;

pub use sluice_meta::LEADER_EPOCH;

/// Shared state of a running broker.
pub struct Broker {
    config: BrokerConfig,
    /// The client listeners (config `listeners`), in configured order.
    listeners: Vec<sluice_security::Listener>,
    /// Index in `listeners` of the one other nodes connect to (replica fetches).
    inter_broker_listener: usize,
    /// OAUTHBEARER token validation, when a listener offers it.
    oauth: Option<sluice_security::OauthValidator>,
    /// How nodes authenticate to each other on the inter-broker listener.
    inter_broker: sluice_security::InterBroker,
    /// SCRAM credentials (SASL) and ACLs, local or in the cluster metadata.
    security: sluice_security::SecurityStore,
    /// Client quota rates.
    quotas: sluice_security::quota::QuotaManager,
    /// ACL checks, when `authorizer.class.name` is set.
    authorizer: Option<sluice_security::Authorizer>,
    topics: TopicRegistry,
    logs: LogManager,
    /// Bytes of requests admitted and not yet answered (`queued_max_request_bytes`):
    /// bounds what connections buffer, produce data awaiting durability included.
    request_memory: connection::RequestMemory,
    /// Connections open, in all and per address, and SASL password checks at once.
    connection_limits: Arc<connection_limits::ConnectionLimits>,
    /// Fetch reads that wait for the disk, on the blocking pool (`sluice_config::FETCH_DISK_READS_MAX`).
    fetch_disk_reads: Arc<Semaphore>,
    /// Prometheus metrics (`metrics.rs`).
    metrics: metrics::Metrics,
    /// Fetch sessions (KIP-227) of this broker's clients.
    fetch_sessions: fetch_session::FetchSessions,
    /// Consumer groups and committed offsets (its own locks; never blocks produce/fetch).
    groups: Arc<GroupCoordinator>,
    /// Share groups (`sluice_coordinator::share`).
    shares: Arc<share::ShareCoordinator>,
    /// The transaction coordinator (`sluice_coordinator::txn`).
    transactions: Arc<sluice_coordinator::txn::TransactionCoordinator>,
    /// Partition roles in a cluster; `None` on a single node (every partition led here).
    replicas: Option<Arc<sluice_replication::ReplicaManager>>,
    /// This node's controller, in a cluster.
    cluster: Option<Arc<cluster_link::ClusterLink>>,
    /// The object store of tiered topics (`sluice-tiered`); `None` when `tiered_storage.enabled`
    /// is off, or in a cluster without a `tiered_storage.url` (every node must reach the
    /// same store).
    tiered: Option<Arc<TieredStorage>>,
    /// A single node's topic changes (create, add partitions, delete) one at a time: each
    /// opens or deletes logs, then updates the registry. They run on the blocking pool
    /// (`handlers/mod.rs`), never on a connection thread.
    topic_changes: parking_lot::Mutex<()>,
    /// Held for the broker's life: a second broker on the same data dir fails to start.
    _data_dir_lock: sluice_storage::DirLock,
}

impl Broker {
    /// Opens the data dir: loads the topic registry and recovers every partition log.
    pub fn open(mut config: BrokerConfig) -> io::Result<Arc<Broker>> {
        config.validate().map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let started = std::time::Instant::now();
        if sluice_storage::durable::fsync_skipped() {
            tracing::warn!(
                env = sluice_storage::durable::SKIP_FSYNC_ENV,
                "TEST MODE: fsync is switched off; acknowledged writes are NOT durable"
            );
        }
        let data_dir_lock = sluice_storage::DirLock::acquire(&config.data_dir)?;
        sluice_storage::durable::check_data_dir(&config.data_dir)?;
        if let Some(cluster) = &mut config.cluster {
            cluster_link::ensure_rpc_secret(cluster, &config.data_dir)?;
        }
        let topics = TopicRegistry::open(&config.data_dir)?;
        let logs = open::log_manager(&config)?;
        let metrics = metrics::Metrics::new();
        logs.syncer().observe(metrics.fsync_observer());
        let (replicas, cluster) = open::cluster_role(&config, &topics)?;
        let partition_count = open::recover_logs(&config, &topics, &logs)?;
        let tiered = open::tiered_storage(&config, &topics, &logs, cluster.as_ref(), &metrics)?;
        logs.start_cleaner(config.cleaner_settings())?;
        tracing::info!(
            partitions = partition_count,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "recovered partition logs"
        );
        let open::Security { listeners, inter_broker_listener, inter_broker, oauth, security, authorizer, quotas } =
            open::security(&config)?;
        let open::Coordinators { groups, shares, transactions } = open::coordinators(&config, &topics, &logs)?;
        Ok(Arc::new(Broker {
            listeners,
            inter_broker_listener,
            inter_broker,
            oauth,
            security,
            authorizer,
            quotas,
            topics,
            logs,
            request_memory: connection::RequestMemory::new(config.queued_max_request_bytes),
            connection_limits: Arc::new(connection_limits::ConnectionLimits::new(&config)),
            fetch_disk_reads: Arc::new(Semaphore::new(sluice_config::FETCH_DISK_READS_MAX)),
            fetch_sessions: fetch_session::FetchSessions::default(),
            metrics,
            groups,
            transactions,
            shares,
            replicas,
            cluster,
            tiered,
            topic_changes: parking_lot::Mutex::new(()),
            config,
            _data_dir_lock: data_dir_lock,
        }))
    }

    /// Cluster mode: starts this node's controller and replication (see [`cluster_link`]).
    pub async fn join_cluster(self: &Arc<Self>) -> anyhow::Result<()> {
        match &self.config.cluster {
            Some(cluster) => cluster_link::join(self, &cluster.clone()).await,
            None => Ok(()),
        }
    }

    pub fn config(&self) -> &BrokerConfig {
        &self.config
    }

    pub fn listeners(&self) -> &[sluice_security::Listener] {
        &self.listeners
    }

    /// (host, port) that clients of listener `index` are given for this broker.
    pub(crate) fn advertised(&self, listener: usize) -> (String, i32) {
        self.listeners[listener].advertised.clone()
    }

    pub fn node_id(&self) -> i32 {
        self.config.node_id
    }

    /// Cluster mode: the replica of a partition hosted here. A partition of a known topic
    /// hosted elsewhere is NOT_LEADER_OR_FOLLOWER (the client's metadata is stale);
    /// anything else is `unknown`.
    pub(crate) fn hosted_replica(
        &self,
        topic: &str,
        partition: i32,
        unknown: kafka_protocol::ResponseError,
    ) -> Result<Arc<sluice_replication::Replica>, kafka_protocol::ResponseError> {
        let replicas = self.replicas.as_ref().expect("cluster mode");
        replicas.get(topic, partition).ok_or_else(|| {
            if self.topics.get(topic).is_some_and(|t| (0..t.partitions).contains(&partition)) {
                kafka_protocol::ResponseError::NotLeaderOrFollower
            } else {
                unknown
            }
        })
    }

    /// [`Broker::partition`], or the error a client gets when it is not led here: a
    /// partition of a known topic led elsewhere (or not yet taken over after a failover) is
    /// NOT_LEADER_OR_FOLLOWER, which clients retry after refreshing their metadata, as Kafka
    /// answers; anything else is UNKNOWN_TOPIC_OR_PARTITION.
    pub(crate) fn led_partition(
        &self,
        topic: &str,
        partition: i32,
    ) -> Result<Arc<Partition>, kafka_protocol::ResponseError> {
        self.partition(topic, partition).ok_or_else(|| {
            let known = self.topics.get(topic).is_some_and(|t| (0..t.partitions).contains(&partition));
            if known && self.replicas.is_some() {
                kafka_protocol::ResponseError::NotLeaderOrFollower
            } else {
                kafka_protocol::ResponseError::UnknownTopicOrPartition
            }
        })
    }

    /// The log of a partition this node leads (on a single node: every partition).
    pub(crate) fn partition(&self, topic: &str, partition: i32) -> Option<Arc<Partition>> {
        match &self.replicas {
            None if topics::is_internal(topic) => self.groups.offsets_partition(partition),
            None => self.logs.get_in(topic, partition),
            Some(replicas) => {
                let replica = replicas.get(topic, partition)?;
                replica.leader_epoch().map(|_| replica.log.clone())
            }
        }
    }

    /// Creates a topic: logs first (several at a time), then the registry entry, so a
    /// registered topic always has its logs. Disk work: call it off the connection threads.
    pub(crate) fn create_topic(&self, topic: TopicMeta) -> io::Result<()> {
        let _one_at_a_time = self.topic_changes.lock();
        if self.topics.get(&topic.name).is_some() {
            return Err(io::Error::new(io::ErrorKind::AlreadyExists, format!("topic {:?} exists", topic.name)));
        }
        self.open_partitions(&topic, 0..topic.partitions)?;
        self.topics.insert(topic)
    }

    /// Adds partitions to a topic so it has `count`: their logs first, then the registry.
    pub(crate) fn add_partitions(&self, topic: &TopicMeta, count: i32) -> io::Result<()> {
        let _one_at_a_time = self.topic_changes.lock();
        let Some(current) = self.topics.get(&topic.name).filter(|current| current.id == topic.id) else {
            return Err(io::Error::new(io::ErrorKind::NotFound, format!("topic {:?} was deleted", topic.name)));
        };
        self.open_partitions(&current, current.partitions..count)?;
        self.topics.update(&topic.name, |t| t.partitions = t.partitions.max(count)).map(|_| ())
    }

    /// Opens (creating) the logs of `topic`'s partitions in `range`, in parallel: each new
    /// log fsyncs its directory, and concurrent fsyncs share the filesystem's journal
    /// commits (10,000 partitions one at a time took 6.8 s here).
    fn open_partitions(&self, topic: &TopicMeta, range: std::ops::Range<i32>) -> io::Result<()> {
        let log_config = self.config.topic_defaults.log_config(&topic.configs);
        self.logs.open_all(range.map(|p| (TopicPartition::new(topic.name.clone(), p), log_config.clone())).collect())
    }

    /// Deletes a topic: its logs (renamed away durably), then the registry entry. In that
    /// order a crash in between leaves a registered topic with empty logs, never an
    /// unregistered name whose old logs a new topic of the same name would open. Disk work:
    /// call it off the connection threads.
    pub(crate) fn delete_topic(&self, name: &str) -> io::Result<Option<TopicMeta>> {
        let _one_at_a_time = self.topic_changes.lock();
        let Some(topic) = self.topics.get(name) else { return Ok(None) };
        let partitions: Vec<TopicPartition> = (0..topic.partitions).map(|p| TopicPartition::new(name, p)).collect();
        self.logs.delete_all(&partitions)?;
        self.topics.remove(name)?;
        if let Some(tiered) = self.tiered.as_ref().filter(|_| sluice_tiered::is_tiered(&topic)) {
            tiered.forget_topic(topic.clone());
        }
        Ok(Some(topic))
    }

    /// Why this node cannot take client traffic yet; `None` when it can. The one notion of
    /// readiness: `/readyz` answers it, and the client listeners accept nothing before it
    /// first says ready ([`Broker::wait_ready`]). A single node is ready once it serves; a
    /// cluster node once a controller is active and this process (its incarnation, not a
    /// registration left by a previous start) is registered and unfenced, as a Kafka broker
    /// enables its listeners only once unfenced: before that, a CreateTopics with one
    /// replica per node would be refused for want of unfenced brokers.
    pub fn not_ready(&self) -> Option<&'static str> {
        let cluster = self.cluster.as_ref()?;
        let Some(controller) = cluster.controller() else { return Some("controller not started") };
        if controller.active_controller().is_none() {
            return Some("no active controller");
        }
        let metadata = cluster.metadata();
        match cluster_link::own_registration(self, &metadata) {
            None => Some("not registered with the controller"),
            Some(registration) if registration.fenced => Some("fenced by the controller"),
            Some(_) => None,
        }
    }

    /// Resolves once [`Broker::not_ready`] says ready (at once on a single node). Wakes on
    /// each metadata change, and polls every [`READY_POLL_INTERVAL`] for what the metadata
    /// does not carry (which controller is active).
    pub async fn wait_ready(&self) {
        let mut metadata: Option<tokio::sync::watch::Receiver<Arc<sluice_cluster::ClusterMetadata>>> = None;
        loop {
            // Marked seen before the check, so that a change published after it wakes the
            // wait below, and only such a change: a receiver cloned from one that never
            // looked starts out "changed", and its `changed()` would return at once, forever.
            if let Some(receiver) = metadata.as_mut() {
                drop(receiver.borrow_and_update());
            }
            if self.not_ready().is_none() {
                return;
            }
            if metadata.is_none() {
                metadata = self.cluster.as_ref().and_then(|cluster| cluster.controller()).map(|c| c.metadata());
                if let Some(receiver) = metadata.as_mut() {
                    drop(receiver.borrow_and_update());
                }
            }
            match metadata.as_mut() {
                Some(receiver) => match tokio::time::timeout(READY_POLL_INTERVAL, receiver.changed()).await {
                    Ok(Ok(())) | Err(_) => {}
                    // The controller stopped: no change will come; look again after a pause.
                    Ok(Err(_)) => tokio::time::sleep(READY_POLL_INTERVAL).await,
                },
                None => tokio::time::sleep(READY_POLL_INTERVAL).await,
            }
        }
    }

    /// Periodic upkeep (retention, page-cache flushes); runs on a blocking thread.
    pub fn tick(&self) {
        self.logs.tick(sluice_storage::now_ms());
    }

    /// Clean shutdown: fsync and seal every partition.
    pub fn close(&self) {
        self.logs.close();
        self.groups.close();
        self.transactions.close();
        self.shares.close();
    }
}

/// How often [`Broker::wait_ready`] looks again when no metadata change woke it.
pub const READY_POLL_INTERVAL: std::time::Duration = std::time::Duration::from_millis(50);

/// Every node of a cluster reports the same cluster id: derived from the voter list.
fn cluster_id_for(voters: &str) -> String {
    let digest = sluice_storage::checksum::crc32c(voters.as_bytes());
    let id = uuid::Uuid::from_u64_pair(u64::from(digest) << 32 | 0x5_1ce, u64::from(digest));
    topics::base64_cluster_id(id)
}
