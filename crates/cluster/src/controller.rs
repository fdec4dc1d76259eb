//! [`Controller`]: one node's member of the controller quorum, and the API the broker uses.
//!
//! Every node runs one. It owns the openraft instance (log and state machine under
//! `<data_dir>/controller/`), serves the controller RPC, sends this node's heartbeat to
//! every voter, and, while it is the raft leader, acts as the active controller:
//! - liveness is kept **in memory** (heartbeats are not logged); it proposes `FenceBroker`
//!   for a broker silent for `session_timeout_ms`, and `RegisterBroker` / `UnfenceBroker`
//!   when one appears, comes back, or restarts with a new incarnation;
//! - every voter records the heartbeats it receives, leader or not, so a newly elected
//!   leader already knows who went silent: when the old leader's node died, it is fenced
//!   one session timeout after its last heartbeat, not one session timeout after the
//!   election. The new leader only waits [`FENCE_GRACE_HEARTBEATS`] heartbeat periods (so
//!   that a leader whose own view is stale, e.g. just healed from a partition, hears from
//!   every live broker again) before fencing anyone;
//! - every `leader_rebalance_interval_ms` it runs a preferred leader election (Kafka's
//!   `auto.leader.rebalance.enable`), only when some partition is off its preferred leader.
//!
//! Writes ([`Controller::create_topic`] and the rest) may be called on any node: a follower
//! forwards the command to the leader over the RPC, retrying across leader changes until the
//! write deadline. A write returns only once the entry is committed **and** applied on the
//! calling node, so the caller's [`Controller::metadata`] already shows it.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openraft::error::{ClientWriteError, InitializeError, RaftError};
use openraft::{BasicNode, Raft, ServerState, SnapshotPolicy};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use uuid::Uuid;

use crate::error::ControllerError;
use crate::log_store::LogStore;
use crate::metadata::{BrokerInfo, ClusterMetadata, Command, CommandOutput, PartitionInfo, TopicInfo};
use crate::network::{NetworkFactory, Peers};
use crate::rpc::{self, Handler, Heartbeat, Redirect, Request, Response, RpcError, WriteReply};
use crate::state_machine::StateMachine;
use crate::types::{node_id, raft_id, Proposal, TypeConfig};

/// Default heartbeat period of each node to the active controller.
pub const HEARTBEAT_INTERVAL_MS_DEFAULT: u64 = 250;
/// Default silence after which the active controller fences a broker.
pub const SESSION_TIMEOUT_MS_DEFAULT: u64 = 1_500;
/// Default raft election timeout range.
pub const ELECTION_TIMEOUT_MIN_MS_DEFAULT: u64 = 300;
/// Default raft election timeout range.
pub const ELECTION_TIMEOUT_MAX_MS_DEFAULT: u64 = 600;
/// How many maximal election timeouts a voter waits per lower-ranked voter before it
/// bootstraps an empty cluster itself.
const BOOTSTRAP_STAGGER_ELECTION_TIMEOUTS: u64 = 2;
/// Default period of the automatic preferred leader election.
pub const LEADER_REBALANCE_INTERVAL_MS_DEFAULT: u64 = 30_000;
/// Default deadline of a write, forwarding and retries included.
pub const WRITE_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// Most voters of a quorum.
pub const VOTERS_MAX: usize = 7;
/// Heartbeat periods a newly elected leader waits before fencing anyone (every live
/// broker heartbeats every voter, so this many periods refresh a stale view).
const FENCE_GRACE_HEARTBEATS: u32 = 2;
/// Bound on one forwarded write or heartbeat exchange.
const FORWARD_TIMEOUT_MS_MAX: u64 = 5_000;
/// Pause between write retries while there is no leader.
const WRITE_RETRY_BACKOFF_MS: u64 = 50;
/// Period of the active controller's liveness check.
const LIVENESS_TICK_MS_MAX: u64 = 100;
/// Default number of raft entries between snapshots (and so the log kept, roughly).
pub const SNAPSHOT_INTERVAL_ENTRIES_DEFAULT: u64 = 1_000;
/// Entries kept behind a snapshot, as a fraction of the interval, so that slightly lagging
/// followers catch up from the log instead of a whole snapshot.
const LOGS_KEPT_AFTER_SNAPSHOT_DIVISOR: u64 = 5;

/// Configuration of one node's controller.
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// This node's id (also its broker id). Must be one of `voters`.
    pub node_id: i32,
    /// Address the controller RPC listens on.
    pub listen: SocketAddr,
    /// Every voter's controller RPC `host:port`, by node id.
    pub voters: BTreeMap<i32, String>,
    /// The node's data directory; the controller uses `<data_dir>/controller/`.
    pub data_dir: PathBuf,
    /// Host of this node's Kafka listener (registered for clients).
    pub kafka_host: String,
    /// Port of this node's Kafka listener.
    pub kafka_port: u16,
    /// Every client listener of this node (registered for clients; may be empty).
    pub kafka_endpoints: Vec<crate::metadata::Endpoint>,
    /// Rack of this node.
    pub rack: Option<String>,
    /// How often this node heartbeats the active controller.
    pub heartbeat_interval_ms: u64,
    /// Silence after which a broker is fenced.
    pub session_timeout_ms: u64,
    /// Raft election timeout, lower bound.
    pub election_timeout_min_ms: u64,
    /// Raft election timeout, upper bound.
    pub election_timeout_max_ms: u64,
    /// Kafka's `auto.leader.rebalance.enable`.
    pub auto_leader_rebalance_enable: bool,
    /// Kafka's `leader.imbalance.check.interval.seconds`, in ms.
    pub leader_rebalance_interval_ms: u64,
    /// Deadline of one write, forwarding and retries included.
    pub write_timeout_ms: u64,
    /// Raft entries between two snapshots of the state machine; older entries are purged.
    pub snapshot_interval_entries: u64,
    /// Local address every outgoing controller RPC connection binds to (any port), so the
    /// other side can tell nodes apart by peer IP; `None` = chosen by the system.
    pub source_address: Option<IpAddr>,
    /// The cluster this node belongs to (`meta.properties`): every RPC carries it and one
    /// from another cluster is refused, so a node started on an address that an old cluster
    /// still lists as a voter never joins that cluster.
    pub cluster_id: String,
    /// A secret every node shares: every controller RPC is authenticated with it (see
    /// rpc.rs). There is no unauthenticated mode: whoever reaches a controller port could
    /// otherwise vote, replicate, fence brokers and propose any write.
    pub rpc_secret: Vec<u8>,
    /// TLS for controller RPC (see rpc.rs); `None`: plain TCP.
    pub rpc_tls: Option<crate::rpc::RpcTls>,
}

/// The cluster id of a config made by [`ControllerConfig::new`] (tests).
pub(crate) const DEV_CLUSTER_ID: &str = "sluice-dev-cluster";

impl ControllerConfig {
    /// A config with the default timings.
    pub fn new(
        node_id: i32,
        listen: SocketAddr,
        voters: BTreeMap<i32, String>,
        data_dir: PathBuf,
        kafka_host: String,
        kafka_port: u16,
        rpc_secret: Vec<u8>,
    ) -> ControllerConfig {
        ControllerConfig {
            node_id,
            listen,
            voters,
            data_dir,
            kafka_host,
            kafka_port,
            kafka_endpoints: Vec::new(),
            rack: None,
            heartbeat_interval_ms: HEARTBEAT_INTERVAL_MS_DEFAULT,
            session_timeout_ms: SESSION_TIMEOUT_MS_DEFAULT,
            election_timeout_min_ms: ELECTION_TIMEOUT_MIN_MS_DEFAULT,
            election_timeout_max_ms: ELECTION_TIMEOUT_MAX_MS_DEFAULT,
            auto_leader_rebalance_enable: true,
            leader_rebalance_interval_ms: LEADER_REBALANCE_INTERVAL_MS_DEFAULT,
            write_timeout_ms: WRITE_TIMEOUT_MS_DEFAULT,
            snapshot_interval_entries: SNAPSHOT_INTERVAL_ENTRIES_DEFAULT,
            source_address: None,
            cluster_id: DEV_CLUSTER_ID.to_string(),
            rpc_secret,
            rpc_tls: None,
        }
    }

    fn validate(&self) -> Result<(), ControllerError> {
        let fail = |why: String| Err(ControllerError::Config(why));
        if self.voters.is_empty() || self.voters.len() > VOTERS_MAX {
            return fail(format!("{} voters, must be 1..={VOTERS_MAX}", self.voters.len()));
        }
        if self.voters.keys().any(|&id| id < 0) {
            return fail("voter ids must be non-negative".to_string());
        }
        if !self.voters.contains_key(&self.node_id) {
            return fail(format!("node {} is not a voter (learners are not supported yet)", self.node_id));
        }
        if self.rpc_secret.len() < crate::rpc::RPC_SECRET_BYTES_MIN {
            return fail(format!("the rpc secret must be at least {} bytes", crate::rpc::RPC_SECRET_BYTES_MIN));
        }
        if self.heartbeat_interval_ms == 0 || self.heartbeat_interval_ms >= self.session_timeout_ms {
            return fail("heartbeat_interval_ms must be positive and below session_timeout_ms".to_string());
        }
        if self.election_timeout_min_ms < 10 || self.election_timeout_min_ms >= self.election_timeout_max_ms {
            return fail("election timeouts: need 10 <= min < max".to_string());
        }
        if self.leader_rebalance_interval_ms == 0 || self.write_timeout_ms == 0 || self.snapshot_interval_entries == 0 {
            return fail(
                "leader_rebalance_interval_ms, write_timeout_ms and snapshot_interval_entries must be positive"
                    .to_string(),
            );
        }
        if self.source_address.is_some_and(|ip| ip.is_unspecified() || ip.is_multicast()) {
            return fail("source_address must be a concrete unicast address".to_string());
        }
        Ok(())
    }

    fn raft_config(&self) -> Result<openraft::Config, ControllerError> {
        let config = openraft::Config {
            cluster_name: "sluice-controller".to_string(),
            election_timeout_min: self.election_timeout_min_ms,
            election_timeout_max: self.election_timeout_max_ms,
            heartbeat_interval: (self.election_timeout_min_ms / 3).max(5),
            install_snapshot_timeout: self.election_timeout_max_ms.max(1_000),
            snapshot_policy: SnapshotPolicy::LogsSinceLast(self.snapshot_interval_entries),
            max_in_snapshot_log_to_keep: self.snapshot_interval_entries / LOGS_KEPT_AFTER_SNAPSHOT_DIVISOR,
            ..Default::default()
        };
        config.validate().map_err(|error| ControllerError::Config(error.to_string()))
    }
}

/// One node's controller. See the module documentation.
pub struct Controller {
    shared: Arc<Shared>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

/// What the background tasks and the RPC handler share.
struct Shared {
    config: ControllerConfig,
    incarnation: u64,
    raft: Raft<TypeConfig>,
    peers: Peers,
    metadata: watch::Receiver<Arc<ClusterMetadata>>,
    liveness: Mutex<Liveness>,
    heartbeats_paused: AtomicBool,
    shut_down: AtomicBool,
}

/// This node's view of broker liveness (memory only): the heartbeats it received, kept
/// across terms, and when it last became leader.
struct Liveness {
    /// The raft term `leader_since` belongs to.
    term: u64,
    /// When this node became leader in `term`: the fencing grace period starts here.
    leader_since: Instant,
    /// When this controller started: a broker never heard from counts as seen then.
    started: Instant,
    last_seen: HashMap<i32, (Instant, Heartbeat)>,
}

impl Liveness {
    fn new(now: Instant) -> Liveness {
        Liveness { term: 0, leader_since: now, started: now, last_seen: HashMap::new() }
    }

    fn for_term(&mut self, term: u64, now: Instant) -> &mut Liveness {
        if self.term != term {
            self.term = term;
            self.leader_since = now;
        }
        self
    }
}

impl Controller {
    /// Opens `<data_dir>/controller/`, starts raft and the RPC server, and bootstraps the
    /// cluster with all voters when the log is empty (see [`Controller::bootstrap`]).
    pub async fn start(config: ControllerConfig) -> Result<Arc<Controller>, ControllerError> {
        config.validate()?;
        let dir = config.data_dir.join("controller");
        crate::log_store::create_dir_durably(&dir)?;
        let log_store = LogStore::open(&dir)?;
        let (state_machine, metadata) = StateMachine::open(&dir)?;
        let listener = TcpListener::bind(config.listen).await?;
        let identity = rpc::Identity {
            cluster_id: config.cluster_id.clone().into(),
            secret: Arc::from(config.rpc_secret.as_slice()),
            tls: config.rpc_tls.clone(),
        };
        let peers = Peers::new(config.source_address, identity.clone());
        let network = NetworkFactory { peers: peers.clone() };
        let raft_config = Arc::new(config.raft_config()?);
        let raft = Raft::new(raft_id(config.node_id), raft_config, network, log_store, state_machine)
            .await
            .map_err(|error| ControllerError::Raft(error.to_string()))?;
        let shared = Arc::new(Shared {
            incarnation: rand::random(),
            raft,
            peers,
            metadata,
            liveness: Mutex::new(Liveness::new(Instant::now())),
            heartbeats_paused: AtomicBool::new(false),
            shut_down: AtomicBool::new(false),
            config,
        });
        let handler_shared = shared.clone();
        let handler: Handler = Arc::new(move |request| {
            let shared = handler_shared.clone();
            Box::pin(async move { shared.handle(request).await })
        });
        let tasks = vec![
            tokio::spawn(rpc::serve(listener, handler, identity)),
            tokio::spawn(shared.clone().send_heartbeats()),
            tokio::spawn(shared.clone().lead()),
            tokio::spawn(shared.clone().bootstrap()),
        ];
        let controller = Arc::new(Controller { shared, tasks: Mutex::new(tasks) });
        tracing::info!(node_id = controller.shared.config.node_id, "controller started");
        Ok(controller)
    }

    /// This node's applied metadata; a new value is published after every applied batch.
    pub fn metadata(&self) -> watch::Receiver<Arc<ClusterMetadata>> {
        self.shared.metadata.clone()
    }

    /// The node id of the raft leader as this node knows it.
    pub fn active_controller(&self) -> Option<i32> {
        self.shared.active_controller()
    }

    /// This process's incarnation (random per start), as registered for this broker.
    pub fn incarnation(&self) -> u64 {
        self.shared.incarnation
    }

    /// Waits until a leader exists and this node is registered and unfenced.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<(), ControllerError> {
        let deadline = Instant::now() + timeout;
        let mut metadata = self.metadata();
        loop {
            let registered = metadata
                .borrow_and_update()
                .brokers
                .get(&self.shared.config.node_id)
                .is_some_and(|broker| !broker.fenced && broker.incarnation == self.shared.incarnation);
            if registered && self.active_controller().is_some() {
                return Ok(());
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(ControllerError::Timeout("controller not ready".to_string()));
            }
            // Wake on new metadata, or poll for the leader now and then.
            let _ = tokio::time::timeout(remaining.min(Duration::from_millis(50)), metadata.changed()).await;
        }
    }

    /// Creates a topic; the replicas are placed over the unfenced brokers when it is applied.
    pub async fn create_topic(
        &self,
        name: &str,
        partitions: i32,
        replication_factor: i16,
        configs: BTreeMap<String, String>,
    ) -> Result<TopicInfo, ControllerError> {
        let command = Command::CreateTopic {
            name: name.to_string(),
            topic_id: Uuid::new_v4(),
            partitions,
            replication_factor,
            configs,
            placement_seed: rand::random(),
            assignment: None,
        };
        self.write_topic(command).await
    }

    /// Creates a topic whose partition `i` has the replicas `assignment[i]`, the first being
    /// its preferred leader (Kafka's manual replica assignment).
    pub async fn create_topic_with_assignment(
        &self,
        name: &str,
        assignment: Vec<Vec<i32>>,
        configs: BTreeMap<String, String>,
    ) -> Result<TopicInfo, ControllerError> {
        let command = Command::CreateTopic {
            name: name.to_string(),
            topic_id: Uuid::new_v4(),
            partitions: -1,
            replication_factor: -1,
            configs,
            placement_seed: 0,
            assignment: Some(assignment),
        };
        self.write_topic(command).await
    }

    async fn write_topic(&self, command: Command) -> Result<TopicInfo, ControllerError> {
        match self.write(command).await? {
            CommandOutput::Topic(topic) => Ok(topic),
            other => Err(unexpected(other)),
        }
    }

    /// Deletes a topic.
    pub async fn delete_topic(&self, name: &str) -> Result<(), ControllerError> {
        self.write(Command::DeleteTopic { name: name.to_string() }).await.map(drop)
    }

    /// Grows a topic to `total` partitions, placed over the unfenced brokers or, with an
    /// `assignment`, on its replica lists (one per new partition).
    pub async fn create_partitions(
        &self,
        name: &str,
        total: i32,
        assignment: Option<Vec<Vec<i32>>>,
    ) -> Result<(), ControllerError> {
        let name = name.to_string();
        let command = Command::CreatePartitions { name, total, placement_seed: rand::random(), assignment };
        self.write(command).await.map(drop)
    }

    /// Replaces a topic's config overrides with `configs`; with `expected`, only if they
    /// still are `expected` (else [`crate::MetadataError::ConfigsChanged`]).
    pub async fn alter_topic_configs(
        &self,
        name: &str,
        configs: BTreeMap<String, String>,
        expected: Option<BTreeMap<String, String>>,
    ) -> Result<(), ControllerError> {
        self.write(Command::AlterTopicConfigs { name: name.to_string(), configs, expected }).await.map(drop)
    }

    /// Replaces a group's configs (empty: removes them).
    pub async fn alter_group_configs(
        &self,
        group: &str,
        configs: BTreeMap<String, String>,
    ) -> Result<(), ControllerError> {
        self.write(Command::AlterGroupConfigs { group: group.to_string(), configs }).await.map(drop)
    }

    /// Adds or replaces SCRAM credentials and deletes others, as one change.
    pub async fn alter_scram_credentials(
        &self,
        upsertions: Vec<(String, String, crate::metadata::ScramCredential)>,
        deletions: Vec<(String, String)>,
    ) -> Result<(), ControllerError> {
        self.write(Command::AlterScramCredentials { upsertions, deletions }).await.map(drop)
    }

    /// Sets or removes client quota values, as one change.
    pub async fn alter_client_quotas(
        &self,
        changes: Vec<(crate::metadata::QuotaEntity, String, Option<u64>)>,
    ) -> Result<(), ControllerError> {
        self.write(Command::AlterClientQuotas { changes }).await.map(drop)
    }

    /// Adds and removes ACLs, as one change.
    pub async fn alter_acls(
        &self,
        create: Vec<crate::metadata::AclBinding>,
        delete: Vec<crate::metadata::AclBinding>,
    ) -> Result<(), ControllerError> {
        self.write(Command::AlterAcls { create, delete }).await.map(drop)
    }

    /// Kafka's AlterPartition, sent by this node as the partition's leader.
    pub async fn alter_partition(
        &self,
        topic: &str,
        partition: i32,
        leader_epoch: i32,
        partition_epoch: i32,
        new_isr: Vec<i32>,
    ) -> Result<PartitionInfo, ControllerError> {
        let command = Command::AlterPartition {
            topic: topic.to_string(),
            partition,
            leader_id: self.shared.config.node_id,
            leader_epoch,
            partition_epoch,
            new_isr,
        };
        match self.write(command).await? {
            CommandOutput::Partition(info) => Ok(info),
            other => Err(unexpected(other)),
        }
    }

    /// Replaces a tiered partition's remote log metadata; refused unless this node leads
    /// the partition at `leader_epoch`.
    pub async fn set_remote_log(
        &self,
        topic: &str,
        partition: i32,
        leader_epoch: i32,
        remote_log: crate::metadata::RemoteLog,
    ) -> Result<(), ControllerError> {
        let command = Command::SetRemoteLog {
            topic: topic.to_string(),
            partition,
            leader_id: self.shared.config.node_id,
            leader_epoch,
            remote_log,
        };
        self.write(command).await.map(drop)
    }

    /// Allocates `count` producer ids; returns the first.
    pub async fn allocate_producer_ids(&self, count: i64) -> Result<i64, ControllerError> {
        match self.write(Command::AllocateProducerIds { count }).await? {
            CommandOutput::ProducerIds { first } => Ok(first),
            other => Err(unexpected(other)),
        }
    }

    /// Moves leadership back to each partition's first replica where it is in sync and
    /// unfenced; returns how many partitions changed leader.
    pub async fn elect_preferred_leaders(&self) -> Result<usize, ControllerError> {
        match self.write(Command::ElectLeaders { preferred: true }).await? {
            CommandOutput::Elected(count) => Ok(count),
            other => Err(unexpected(other)),
        }
    }

    /// Starts (`Some`) or cancels (`None`) a reassignment of one partition.
    pub async fn reassign(&self, topic: &str, partition: i32, target: Option<Vec<i32>>) -> Result<(), ControllerError> {
        self.write(Command::Reassign { topic: topic.to_string(), partition, target }).await.map(drop)
    }

    /// Stops heartbeating (the active controller will fence this broker) or resumes it.
    /// For tests and for a broker that shuts down cleanly and wants its leaderships moved.
    pub fn set_heartbeats_paused(&self, paused: bool) {
        self.shared.heartbeats_paused.store(paused, Ordering::Relaxed);
    }

    /// Stops the RPC server, the background tasks and raft. Idempotent.
    pub async fn shutdown(&self) {
        if self.shared.shut_down.swap(true, Ordering::SeqCst) {
            return;
        }
        let tasks: Vec<_> = self.tasks.lock().expect("tasks lock poisoned").drain(..).collect();
        for task in &tasks {
            task.abort();
        }
        // `abort` only asks: a task running on another worker drops its future (and the RPC
        // listener it owns) later. Waiting here frees the listen port before this returns,
        // so a restart on the same address can bind it.
        for task in tasks {
            let _ = task.await;
        }
        if let Err(error) = self.shared.raft.shutdown().await {
            tracing::warn!(%error, "raft shutdown");
        }
        tracing::info!(node_id = self.shared.config.node_id, "controller shut down");
    }

    /// Proposes `command` through the current leader and waits until it is applied here.
    /// Every attempt carries the same request id, so a retry after an unknown outcome (lost
    /// answer, leader change) returns the first application's result instead of applying twice.
    async fn write(&self, command: Command) -> Result<CommandOutput, ControllerError> {
        let shared = &self.shared;
        // Refused here, not only when applied: the active controller may still run an
        // older binary that cannot even read this command.
        let finalized = self.metadata().borrow().metadata_version();
        let required = command.required_metadata_version();
        if required > finalized {
            return Err(ControllerError::Refused(crate::MetadataError::UnsupportedMetadataVersion {
                required,
                finalized,
            }));
        }
        let proposal = Proposal::new(command);
        let deadline = Instant::now() + Duration::from_millis(shared.config.write_timeout_ms);
        let mut hint: Option<i32> = None;
        loop {
            if shared.shut_down.load(Ordering::SeqCst) {
                return Err(ControllerError::Shutdown);
            }
            let leader = hint.take().or_else(|| shared.active_controller());
            let reply = match leader {
                Some(leader) => shared.forward(leader, &proposal, deadline).await,
                None => None,
            };
            match reply {
                Some(WriteReply::Committed { log_index, result }) => {
                    shared.wait_applied(log_index, deadline).await?;
                    return result.map_err(ControllerError::from);
                }
                Some(WriteReply::NotLeader(new_hint)) => hint = new_hint.filter(|&id| Some(id) != leader),
                Some(WriteReply::Failed(why)) => tracing::debug!(%why, "write attempt failed, retrying"),
                None => {}
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(ControllerError::Timeout("no active controller committed the write".to_string()));
            }
            if hint.is_none() {
                tokio::time::sleep(remaining.min(Duration::from_millis(WRITE_RETRY_BACKOFF_MS))).await;
            }
        }
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        // Without `shutdown` the raft core keeps running, but the RPC server and loops stop.
        for task in self.tasks.lock().expect("tasks lock poisoned").drain(..) {
            task.abort();
        }
    }
}

fn unexpected(output: CommandOutput) -> ControllerError {
    ControllerError::Raft(format!("unexpected command output {output:?}"))
}

impl Shared {
    /// Writes the initial membership when the log is empty. Any voter may (they all write
    /// the same one), but voters initializing at once each start an election in term 1 and
    /// the higher node id deposes a leader already elected, costing a second. So the voter
    /// of rank r waits r x [`BOOTSTRAP_STAGGER_ELECTION_TIMEOUTS`] election timeouts and
    /// skips it if a lower voter's leader has reached it meanwhile.
    async fn bootstrap(self: Arc<Self>) {
        if let Err(error) = self.try_bootstrap().await {
            tracing::error!(%error, "controller bootstrap failed");
        }
    }

    async fn try_bootstrap(&self) -> Result<(), ControllerError> {
        let raft = &self.raft;
        let config = &self.config;
        let rank = config.voters.keys().filter(|&&id| id < config.node_id).count() as u64;
        let stagger = Duration::from_millis(config.election_timeout_max_ms * BOOTSTRAP_STAGGER_ELECTION_TIMEOUTS);
        tokio::time::sleep(stagger * rank as u32).await;
        if raft.is_initialized().await.map_err(|error| ControllerError::Raft(error.to_string()))? {
            return Ok(());
        }
        let members: BTreeMap<u64, BasicNode> =
            self.config.voters.iter().map(|(&id, address)| (raft_id(id), BasicNode::new(address))).collect();
        match raft.initialize(members).await {
            Ok(()) | Err(RaftError::APIError(InitializeError::NotAllowed(_))) => Ok(()),
            Err(error) => Err(ControllerError::Raft(error.to_string())),
        }
    }

    fn active_controller(&self) -> Option<i32> {
        self.raft.metrics().borrow().current_leader.map(node_id)
    }

    /// This node's raft term if it is the leader.
    fn leader_term(&self) -> Option<u64> {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        let leading = metrics.state == ServerState::Leader && metrics.current_leader == Some(metrics.id);
        leading.then_some(metrics.current_term)
    }

    async fn handle(&self, request: Request) -> Response {
        match request {
            Request::AppendEntries(rpc) => Response::AppendEntries(self.raft.append_entries(rpc).await),
            Request::Vote(rpc) => Response::Vote(self.raft.vote(rpc).await),
            Request::InstallSnapshot(rpc) => Response::InstallSnapshot(self.raft.install_snapshot(rpc).await),
            Request::Heartbeat(heartbeat) => Response::Heartbeat(self.record_heartbeat(heartbeat)),
            Request::Write(proposal) => Response::Write(self.propose(proposal).await),
        }
    }

    /// Notes a heartbeat whether or not this node leads: a future leader needs the history.
    fn record_heartbeat(&self, heartbeat: Heartbeat) -> Redirect {
        let now = Instant::now();
        self.liveness.lock().expect("liveness lock poisoned").last_seen.insert(heartbeat.node_id, (now, heartbeat));
        match self.leader_term() {
            Some(_) => Redirect::Accepted,
            None => Redirect::NotLeader(self.active_controller()),
        }
    }

    /// Proposes on this node, which must be the raft leader.
    async fn propose(&self, proposal: Proposal) -> WriteReply {
        match self.raft.client_write(proposal).await {
            Ok(response) => WriteReply::Committed { log_index: response.log_id.index, result: response.data },
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward))) => {
                WriteReply::NotLeader(forward.leader_id.map(node_id))
            }
            Err(error) => WriteReply::Failed(error.to_string()),
        }
    }

    /// One attempt at `leader`; `None` when it could not be reached (not sent: safe to retry).
    async fn forward(&self, leader: i32, proposal: &Proposal, deadline: Instant) -> Option<WriteReply> {
        let timeout =
            deadline.saturating_duration_since(Instant::now()).min(Duration::from_millis(FORWARD_TIMEOUT_MS_MAX));
        if leader == self.config.node_id {
            // A leader cut off from its quorum never answers: the deadline still holds.
            let proposed = tokio::time::timeout(timeout, self.propose(proposal.clone())).await;
            return Some(proposed.unwrap_or_else(|_| WriteReply::Failed("proposal timed out".to_string())));
        }
        let address = self.config.voters.get(&leader)?;
        match self.peers.client(address).call(&Request::Write(proposal.clone()), timeout).await {
            Ok(Response::Write(reply)) => Some(reply),
            Ok(other) => Some(WriteReply::Failed(format!("mismatched response {other:?}"))),
            Err(RpcError::Connect(..)) => None,
            Err(error) => Some(WriteReply::Failed(error.to_string())),
        }
    }

    async fn wait_applied(&self, log_index: u64, deadline: Instant) -> Result<(), ControllerError> {
        let mut metadata = self.metadata.clone();
        let remaining = deadline.saturating_duration_since(Instant::now());
        let applied = tokio::time::timeout(remaining, async {
            metadata.wait_for(|metadata| metadata.version >= log_index).await.map(drop)
        })
        .await;
        match applied {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(ControllerError::Shutdown),
            Err(_) => Err(ControllerError::Timeout(format!("committed at {log_index} but not applied here yet"))),
        }
    }

    fn heartbeat(&self) -> Heartbeat {
        Heartbeat {
            node_id: self.config.node_id,
            incarnation: self.incarnation,
            host: self.config.kafka_host.clone(),
            port: self.config.kafka_port,
            rack: self.config.rack.clone(),
            endpoints: self.config.kafka_endpoints.clone(),
            metadata_version_max: crate::metadata::METADATA_VERSION_LATEST,
        }
    }

    /// Heartbeats every voter (itself included) every `heartbeat_interval_ms`, one task
    /// per voter so a dead or slow voter delays no other.
    async fn send_heartbeats(self: Arc<Self>) {
        let voters: Vec<(i32, String)> =
            self.config.voters.iter().map(|(&id, address)| (id, address.clone())).collect();
        // A JoinSet aborts its tasks when dropped, so stopping this task stops them all.
        let mut senders = tokio::task::JoinSet::new();
        for (id, address) in voters {
            senders.spawn(self.clone().heartbeat_voter(id, address));
        }
        while senders.join_next().await.is_some() {}
    }

    async fn heartbeat_voter(self: Arc<Self>, voter: i32, address: String) {
        let period = Duration::from_millis(self.config.heartbeat_interval_ms);
        let mut ticker = tokio::time::interval(period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            if self.heartbeats_paused.load(Ordering::Relaxed) {
                continue;
            }
            if voter == self.config.node_id {
                self.record_heartbeat(self.heartbeat());
                continue;
            }
            let request = Request::Heartbeat(self.heartbeat());
            if let Err(error) = self.peers.client(&address).call(&request, period * 2).await {
                tracing::debug!(voter, %error, "heartbeat failed");
            }
        }
    }

    /// The active controller's loop: liveness decisions and periodic preferred elections.
    async fn lead(self: Arc<Self>) {
        let tick = Duration::from_millis(self.config.heartbeat_interval_ms.min(LIVENESS_TICK_MS_MAX));
        let mut ticker = tokio::time::interval(tick);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let rebalance_interval = Duration::from_millis(self.config.leader_rebalance_interval_ms);
        let mut last_rebalance = Instant::now();
        loop {
            ticker.tick().await;
            let Some(term) = self.leader_term() else { continue };
            let metadata = self.metadata.borrow().clone();
            for command in self.liveness_commands(term, Instant::now(), &metadata) {
                tracing::info!(?command, "active controller proposes");
                if let WriteReply::Failed(why) = self.propose(Proposal::new(command)).await {
                    tracing::warn!(%why, "liveness proposal failed");
                }
            }
            if self.config.auto_leader_rebalance_enable && last_rebalance.elapsed() >= rebalance_interval {
                last_rebalance = Instant::now();
                if needs_preferred_election(&self.metadata.borrow()) {
                    self.propose(Proposal::new(Command::ElectLeaders { preferred: true })).await;
                }
            }
        }
    }

    /// The `metadata.version` to finalize now: the newest that every voter's binary (as
    /// registered) and this one understand, when it is newer than the finalized one.
    fn metadata_version_to_finalize(&self, metadata: &ClusterMetadata) -> Option<u16> {
        let mut supported = crate::metadata::METADATA_VERSION_LATEST;
        for voter in self.config.voters.keys() {
            let broker = metadata.brokers.get(voter)?;
            supported = supported.min(broker.metadata_version_max.max(crate::metadata::METADATA_VERSION_INITIAL));
        }
        (supported > metadata.metadata_version()).then_some(supported)
    }

    /// What liveness requires now: register or unfence brokers that heartbeat, fence those
    /// silent for a session timeout (never within the grace period after becoming leader).
    fn liveness_commands(&self, term: u64, now: Instant, metadata: &ClusterMetadata) -> Vec<Command> {
        let session_timeout = Duration::from_millis(self.config.session_timeout_ms);
        let mut liveness = self.liveness.lock().expect("liveness lock poisoned");
        let liveness = liveness.for_term(term, now);
        let mut commands = Vec::new();
        for (&id, (seen, heartbeat)) in &liveness.last_seen {
            if now.duration_since(*seen) >= session_timeout {
                continue;
            }
            match metadata.brokers.get(&id) {
                Some(broker) if same_registration(broker, heartbeat) => {
                    if broker.fenced {
                        commands.push(Command::UnfenceBroker { node_id: id });
                    }
                }
                _ => commands.push(Command::RegisterBroker(BrokerInfo {
                    node_id: id,
                    host: heartbeat.host.clone(),
                    port: heartbeat.port,
                    rack: heartbeat.rack.clone(),
                    incarnation: heartbeat.incarnation,
                    fenced: false,
                    endpoints: heartbeat.endpoints.clone(),
                    metadata_version_max: heartbeat.metadata_version_max,
                })),
            }
        }
        if let Some(version) = self.metadata_version_to_finalize(metadata) {
            tracing::info!(version, "every voter supports a newer metadata.version: finalizing it");
            commands.push(Command::FinalizeMetadataVersion { version });
        }
        let grace =
            (Duration::from_millis(self.config.heartbeat_interval_ms) * FENCE_GRACE_HEARTBEATS).min(session_timeout);
        if now.duration_since(liveness.leader_since) < grace {
            return commands;
        }
        for broker in metadata.brokers.values().filter(|broker| !broker.fenced) {
            let seen = liveness.last_seen.get(&broker.node_id).map_or(liveness.started, |(seen, _)| *seen);
            if now.duration_since(seen) >= session_timeout {
                commands.push(Command::FenceBroker { node_id: broker.node_id });
            }
        }
        commands
    }
}

fn same_registration(broker: &BrokerInfo, heartbeat: &Heartbeat) -> bool {
    broker.incarnation == heartbeat.incarnation
        && broker.host == heartbeat.host
        && broker.port == heartbeat.port
        && broker.rack == heartbeat.rack
        && broker.endpoints == heartbeat.endpoints
        && broker.metadata_version_max == heartbeat.metadata_version_max
}

fn needs_preferred_election(metadata: &ClusterMetadata) -> bool {
    metadata.topics.values().flat_map(|topic| &topic.partitions).any(|partition| {
        let preferred = partition.replicas[0];
        partition.leader != preferred
            && partition.isr.contains(&preferred)
            && metadata.brokers.get(&preferred).is_some_and(|broker| !broker.fenced)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_refused(change: impl FnOnce(&mut ControllerConfig), expected: &str) {
        let voters = BTreeMap::from([(1, "127.0.0.1:1".to_string()), (2, "127.0.0.1:2".to_string())]);
        let secret = b"a-test-secret-of-enough-bytes".to_vec();
        let mut config =
            ControllerConfig::new(1, "127.0.0.1:1".parse().unwrap(), voters, "/tmp".into(), "h".into(), 1, secret);
        assert!(config.validate().is_ok());
        change(&mut config);
        let error = config.validate().unwrap_err().to_string();
        assert!(error.contains(expected), "{error}");
    }

    #[test]
    fn config_refusals() {
        check_refused(|config| config.node_id = 3, "learners are not supported");
        check_refused(|config| config.voters.clear(), "voters");
        check_refused(|config| config.heartbeat_interval_ms = config.session_timeout_ms, "heartbeat_interval_ms");
        check_refused(|config| config.election_timeout_max_ms = config.election_timeout_min_ms, "election");
        check_refused(|config| config.snapshot_interval_entries = 0, "snapshot_interval_entries");
        check_refused(|config| config.source_address = Some("0.0.0.0".parse().unwrap()), "source_address");
        check_refused(|config| config.source_address = Some("224.0.0.1".parse().unwrap()), "source_address");
        check_refused(|config| config.rpc_secret.clear(), "rpc secret");
        check_refused(|config| config.rpc_secret.truncate(crate::rpc::RPC_SECRET_BYTES_MIN - 1), "rpc secret");
    }
}
