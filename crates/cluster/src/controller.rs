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
//! A node that is not among the configured (initial) voters is an *observer*: it heartbeats
//! the voters with its controller address, and the active controller adds it to the raft
//! membership as a learner; AddRaftVoter / RemoveRaftVoter change who votes at run time (see
//! [`crate::quorum`]). Every voter set after the first lives in the raft log, so the
//! configured voters only say how to reach the quorum and whom to start it with.
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
use crate::quorum::{self, QuorumDescription, QuorumReplica, VoterChange, VoterChangeError};
use crate::rpc::{self, Handler, Heartbeat, Redirect, Request, Response, RpcError, VoterChangeReply, WriteReply};
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
/// How long a command waits for the `metadata.version` it needs to be finalized before it
/// is refused: a few registration rounds of a forming cluster.
const FINALIZE_WAIT_MS_MAX: u64 = 5_000;
/// Pause between write retries while there is no leader.
const WRITE_RETRY_BACKOFF_MS: u64 = 50;
/// Period of the active controller's liveness check.
const LIVENESS_TICK_MS_MAX: u64 = 100;
/// Default number of raft entries between snapshots (and so the log kept, roughly).
pub const SNAPSHOT_INTERVAL_ENTRIES_DEFAULT: u64 = 1_000;
/// Election timeouts a leader that left the voters waits for another to take over.
const RESIGN_ELECTION_TIMEOUTS: u64 = 10;
/// Entries kept behind a snapshot, as a fraction of the interval, so that slightly lagging
/// followers catch up from the log instead of a whole snapshot.
const LOGS_KEPT_AFTER_SNAPSHOT_DIVISOR: u64 = 5;

/// Configuration of one node's controller.
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// This node's id (also its broker id). A node not among `voters` joins as an observer.
    pub node_id: i32,
    /// Address the controller RPC listens on.
    pub listen: SocketAddr,
    /// The initial voters' controller RPC `host:port`, by node id: whom a new cluster starts
    /// with, and where a node finds the quorum until it has the log's voter set.
    pub voters: BTreeMap<i32, String>,
    /// This node's controller RPC address as the other nodes reach it (`host:port`); `None`:
    /// its entry in `voters`, else `listen` (its host replaced by `kafka_host` when unspecified).
    pub advertised_address: Option<String>,
    /// The node's data directory; the controller uses `<data_dir>/controller/`.
    pub data_dir: PathBuf,
    /// The data directory's id (`meta.properties`): with the node id, the key of a voter, so
    /// a node that lost its disk (and so got a new id) is not taken for the voter it was.
    pub directory_id: Uuid,
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
            advertised_address: None,
            data_dir,
            directory_id: Uuid::new_v4(),
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
        if self.node_id < 0 {
            return fail("node ids must be non-negative".to_string());
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

    /// This node's controller address as the others reach it.
    fn advertised_address(&self) -> String {
        if let Some(address) = self.advertised_address.as_ref().or_else(|| self.voters.get(&self.node_id)) {
            return address.clone();
        }
        match self.listen.ip().is_unspecified() {
            true => format!("{}:{}", self.kafka_host, self.listen.port()),
            false => self.listen.to_string(),
        }
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
    /// Set while this leader, no longer a voter, hands the leadership over ([`Shared::resign`]).
    resigning: AtomicBool,
    /// The id of this node's data directory.
    directory_id: Uuid,
    /// When each node last held every entry this leader had (leader only, memory only).
    caught_up: Mutex<HashMap<i32, Instant>>,
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
        let directory_id = config.directory_id;
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
            resigning: AtomicBool::new(false),
            directory_id,
            caught_up: Mutex::default(),
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

    /// Puts and deletes entries of the AMQP front door's state, if it is still at
    /// `expected_version` (else [`crate::MetadataError::ConfigsChanged`]).
    pub async fn alter_amqp_state(
        &self,
        expected_version: Option<u64>,
        puts: BTreeMap<String, String>,
        deletes: Vec<String>,
    ) -> Result<(), ControllerError> {
        self.write(Command::AlterAmqpState { expected_version, puts, deletes }).await.map(drop)
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

    /// The quorum as its active controller describes it (Kafka's DescribeQuorum).
    pub async fn describe_quorum(&self) -> Result<QuorumDescription, ControllerError> {
        let shared = &self.shared;
        let deadline = Instant::now() + Duration::from_millis(shared.config.write_timeout_ms);
        let mut hint: Option<i32> = None;
        loop {
            let leader = hint.take().or_else(|| shared.active_controller());
            let reply = match leader {
                Some(leader) if leader == shared.config.node_id => Some(shared.describe_quorum_here()),
                Some(leader) => shared.call_leader(leader, &Request::DescribeQuorum, deadline).await,
                None => None,
            };
            match reply {
                Some(Response::DescribeQuorum(Ok(description))) => return Ok(description),
                Some(Response::DescribeQuorum(Err(Redirect::NotLeader(new_hint)))) => {
                    hint = new_hint.filter(|&id| Some(id) != leader)
                }
                _ => {}
            }
            shared.pause_before_retry(deadline, hint.is_none()).await?;
        }
    }

    /// Adds or removes a voter (Kafka's AddRaftVoter / RemoveRaftVoter), through the active
    /// controller; returns once the new voter set is committed.
    pub async fn change_voters(&self, change: VoterChange) -> Result<Result<(), VoterChangeError>, ControllerError> {
        let shared = &self.shared;
        let deadline = Instant::now() + Duration::from_millis(shared.config.write_timeout_ms);
        let request = Request::ChangeVoters(change.clone());
        let mut hint: Option<i32> = None;
        loop {
            let leader = hint.take().or_else(|| shared.active_controller());
            let reply = match leader {
                Some(leader) if leader == shared.config.node_id => {
                    Some(Response::ChangeVoters(shared.change_voters_here(change.clone()).await))
                }
                Some(leader) => shared.call_leader(leader, &request, deadline).await,
                None => None,
            };
            match reply {
                Some(Response::ChangeVoters(VoterChangeReply::Done)) => return Ok(Ok(())),
                Some(Response::ChangeVoters(VoterChangeReply::Refused(why))) => return Ok(Err(why)),
                Some(Response::ChangeVoters(VoterChangeReply::NotLeader(new_hint))) => {
                    hint = new_hint.filter(|&id| Some(id) != leader)
                }
                _ => {}
            }
            shared.pause_before_retry(deadline, hint.is_none()).await?;
        }
    }

    /// This node's data directory id.
    pub fn directory_id(&self) -> Uuid {
        self.shared.directory_id
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

    /// The finalized `metadata.version`, once it reaches `required` or after at most
    /// [`FINALIZE_WAIT_MS_MAX`] (never past `deadline`). A new cluster finalizes its version
    /// moments after it is ready, once every member registered: a command sent at once
    /// waits for that. In a cluster of mixed binaries the version stays, and the wait ends.
    async fn metadata_version_reaching(&self, required: u16, deadline: Instant) -> u16 {
        let mut metadata = self.metadata();
        let finalized = metadata.borrow().metadata_version();
        if finalized >= required || required > crate::metadata::METADATA_VERSION_LATEST {
            return finalized;
        }
        let wait_end = deadline.min(Instant::now() + Duration::from_millis(FINALIZE_WAIT_MS_MAX));
        let reached = metadata.wait_for(|metadata| metadata.metadata_version() >= required);
        let _ = tokio::time::timeout_at(wait_end.into(), reached).await;
        let finalized = metadata.borrow().metadata_version();
        finalized
    }

    /// Proposes `command` through the current leader and waits until it is applied here.
    /// Every attempt carries the same request id, so a retry after an unknown outcome (lost
    /// answer, leader change) returns the first application's result instead of applying twice.
    async fn write(&self, command: Command) -> Result<CommandOutput, ControllerError> {
        let shared = &self.shared;
        let deadline = Instant::now() + Duration::from_millis(shared.config.write_timeout_ms);
        // Refused here, not only when applied: the active controller may still run an
        // older binary that cannot even read this command.
        let required = command.required_metadata_version();
        let finalized = self.metadata_version_reaching(required, deadline).await;
        if required > finalized {
            return Err(ControllerError::Refused(crate::MetadataError::UnsupportedMetadataVersion {
                required,
                finalized,
            }));
        }
        let proposal = Proposal::new(command);
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
            shared.pause_before_retry(deadline, hint.is_none()).await?;
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
        if !config.voters.contains_key(&config.node_id) {
            // An observer: the active controller adds it once it hears its heartbeats.
            return Ok(());
        }
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
        if self.resigning.load(Ordering::SeqCst) {
            return None;
        }
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
            Request::DescribeQuorum => self.describe_quorum_here(),
            Request::ChangeVoters(change) => Response::ChangeVoters(self.change_voters_here(change).await),
        }
    }

    /// Before another attempt at the leader: fails past `deadline`, else sleeps a backoff
    /// (unless a new leader hint makes an immediate retry worth it).
    async fn pause_before_retry(&self, deadline: Instant, sleep: bool) -> Result<(), ControllerError> {
        if self.shut_down.load(Ordering::SeqCst) {
            return Err(ControllerError::Shutdown);
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(ControllerError::Timeout("no active controller answered in time".to_string()));
        }
        if sleep {
            tokio::time::sleep(remaining.min(Duration::from_millis(WRITE_RETRY_BACKOFF_MS))).await;
        }
        Ok(())
    }

    /// One request to `leader`; `None` when it could not be reached or did not answer.
    async fn call_leader(&self, leader: i32, request: &Request, deadline: Instant) -> Option<Response> {
        let timeout =
            deadline.saturating_duration_since(Instant::now()).min(Duration::from_millis(FORWARD_TIMEOUT_MS_MAX));
        let address = self.address_of(leader)?;
        match self.peers.client(&address).call(request, timeout).await {
            Ok(response) => Some(response),
            Err(error) => {
                tracing::debug!(leader, %error, "controller request failed, retrying");
                None
            }
        }
    }

    /// The raft membership as this node last applied it.
    fn membership(&self) -> openraft::Membership<u64, BasicNode> {
        self.raft.metrics().borrow().membership_config.membership().clone()
    }

    /// The voters' controller addresses: the log's voter set, or the configured voters
    /// while this node has no membership yet (an observer not yet added).
    fn voter_addresses(&self) -> BTreeMap<i32, String> {
        let membership = self.membership();
        let voters: BTreeMap<i32, String> = membership
            .voter_ids()
            .filter_map(|id| membership.get_node(&id).map(|node| (node_id(id), node.addr.clone())))
            .collect();
        if voters.is_empty() {
            return self.config.voters.clone();
        }
        voters
    }

    /// The controller address of `node`: from the membership, else the configured voters.
    fn address_of(&self, node: i32) -> Option<String> {
        let membership = self.membership();
        let from_membership = membership.get_node(&raft_id(node)).map(|node| node.addr.clone());
        from_membership.or_else(|| self.config.voters.get(&node).cloned())
    }

    /// What [`quorum::check_voter_change`] needs, from this leader's metrics.
    fn quorum_membership(&self) -> quorum::Membership {
        let metrics = self.raft.metrics().borrow().clone();
        let membership = metrics.membership_config.membership();
        let voters: std::collections::BTreeSet<i32> = membership.voter_ids().map(node_id).collect();
        let learners = membership.learner_ids().map(node_id).collect();
        let matched = metrics
            .replication
            .iter()
            .flatten()
            .filter_map(|(&id, matched)| matched.map(|log_id| (node_id(id), log_id.index)))
            .collect();
        quorum::Membership {
            voters,
            learners,
            directories: self.directories(),
            matched,
            last_index: metrics.last_log_index.unwrap_or(0),
        }
    }

    /// The directory ids nodes reported in their heartbeats, this node's own included.
    fn directories(&self) -> BTreeMap<i32, Uuid> {
        let liveness = self.liveness.lock().expect("liveness lock poisoned");
        let mut directories: BTreeMap<i32, Uuid> = liveness
            .last_seen
            .iter()
            .filter_map(|(&id, (_, heartbeat))| heartbeat.directory_id.map(|directory| (id, directory)))
            .collect();
        directories.insert(self.config.node_id, self.directory_id);
        directories
    }

    /// Makes a voter change on this node, which must be the raft leader.
    async fn change_voters_here(&self, change: VoterChange) -> VoterChangeReply {
        if self.leader_term().is_none() {
            return VoterChangeReply::NotLeader(self.active_controller());
        }
        if let Err(why) = quorum::check_voter_change(&change, &self.quorum_membership(), VOTERS_MAX) {
            return VoterChangeReply::Refused(why);
        }
        let removes_self = matches!(change, VoterChange::Remove { node_id, .. } if node_id == self.config.node_id);
        let members = match change {
            VoterChange::Add { node_id, .. } => openraft::ChangeMembers::AddVoterIds([raft_id(node_id)].into()),
            VoterChange::Remove { node_id, .. } => openraft::ChangeMembers::RemoveVoters([raft_id(node_id)].into()),
        };
        tracing::info!(?change, "changing the controller voters");
        // openraft lets a leader that is no longer a voter go on leading (commits then need
        // the new voters only, so this is safe), and panics if it removes itself outright;
        // so it is retained as a learner and resigns below.
        // Retained: a removed voter stays an observer, since it is still a broker.
        match self.raft.change_membership(members, true).await {
            Ok(_) if removes_self => {
                self.resign().await;
                VoterChangeReply::Done
            }
            Ok(_) => VoterChangeReply::Done,
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward))) => {
                VoterChangeReply::NotLeader(forward.leader_id.map(node_id))
            }
            Err(error) => VoterChangeReply::Refused(VoterChangeError::Raft(error.to_string())),
        }
    }

    /// Stops leading after this leader left the voters: it stops heartbeating and refuses
    /// proposals until the voters (whose leader lease then runs out) elect another leader,
    /// at most [`RESIGN_ELECTION_TIMEOUTS`] election timeouts.
    async fn resign(&self) {
        self.resigning.store(true, Ordering::SeqCst);
        self.raft.runtime_config().heartbeat(false);
        let wait = Duration::from_millis(self.config.election_timeout_max_ms * RESIGN_ELECTION_TIMEOUTS);
        let mut metrics = self.raft.metrics();
        let me = raft_id(self.config.node_id);
        let replaced = tokio::time::timeout(wait, metrics.wait_for(|metrics| metrics.current_leader != Some(me))).await;
        if replaced.is_err() {
            tracing::warn!("no other controller took over after this one left the voters; leading on");
        }
        self.raft.runtime_config().heartbeat(true);
        self.resigning.store(false, Ordering::SeqCst);
    }

    /// Kafka's DescribeQuorum, answered by this node if it is the raft leader.
    fn describe_quorum_here(&self) -> Response {
        let Some(term) = self.leader_term() else {
            return Response::DescribeQuorum(Err(Redirect::NotLeader(self.active_controller())));
        };
        let metrics = self.raft.metrics().borrow().clone();
        let membership = metrics.membership_config.membership();
        let matched: BTreeMap<u64, i64> = metrics
            .replication
            .iter()
            .flatten()
            .map(|(&id, matched)| (id, matched.map_or(-1, |log_id| log_id.index as i64 + 1)))
            .collect();
        let last_seen: HashMap<i32, Instant> = {
            let liveness = self.liveness.lock().expect("liveness lock poisoned");
            liveness.last_seen.iter().map(|(&id, (seen, _))| (id, *seen)).collect()
        };
        let caught_up = self.caught_up.lock().expect("caught-up lock poisoned").clone();
        let directories = self.directories();
        let now = (Instant::now(), std::time::SystemTime::now());
        let log_end_offset = metrics.last_log_index.map_or(0, |index| index as i64 + 1);
        let replica = |id: u64| {
            let node = node_id(id);
            let leading = node == self.config.node_id;
            QuorumReplica {
                node_id: node,
                directory_id: directories.get(&node).copied().unwrap_or_default(),
                log_end_offset: if leading { log_end_offset } else { matched.get(&id).copied().unwrap_or(-1) },
                last_fetch_timestamp_ms: epoch_ms(
                    now,
                    if leading { Some(now.0) } else { last_seen.get(&node).copied() },
                ),
                last_caught_up_timestamp_ms: epoch_ms(
                    now,
                    if leading { Some(now.0) } else { caught_up.get(&node).copied() },
                ),
                controller_address: membership.get_node(&id).map(|node| node.addr.clone()),
            }
        };
        Response::DescribeQuorum(Ok(QuorumDescription {
            leader_id: self.config.node_id,
            leader_epoch: i32::try_from(term).unwrap_or(i32::MAX),
            high_watermark: metrics.last_applied.map_or(0, |log_id| log_id.index as i64 + 1),
            voters: membership.voter_ids().map(replica).collect(),
            observers: membership.learner_ids().map(replica).collect(),
        }))
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
        if self.resigning.load(Ordering::SeqCst) {
            return WriteReply::NotLeader(None);
        }
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
        let address = self.address_of(leader)?;
        match self.peers.client(&address).call(&Request::Write(proposal.clone()), timeout).await {
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
            controller_address: Some(self.config.advertised_address()),
            directory_id: Some(self.directory_id),
        }
    }

    /// Heartbeats every voter (itself included) every `heartbeat_interval_ms`, one task
    /// per voter so a dead or slow voter delays no other. The voters are the log's current
    /// ones, checked every period, so a voter added or removed at run time is heard or left.
    async fn send_heartbeats(self: Arc<Self>) {
        // A JoinSet aborts its tasks when dropped, so stopping this task stops them all.
        let mut senders = tokio::task::JoinSet::new();
        let mut running: HashMap<(i32, String), tokio::task::AbortHandle> = HashMap::new();
        let mut ticker = tokio::time::interval(Duration::from_millis(self.config.heartbeat_interval_ms));
        loop {
            ticker.tick().await;
            let voters = self.voter_addresses();
            running.retain(|(id, address), sender| {
                let current = voters.get(id) == Some(address);
                if !current {
                    sender.abort();
                }
                current
            });
            for (id, address) in voters {
                if let std::collections::hash_map::Entry::Vacant(entry) = running.entry((id, address.clone())) {
                    entry.insert(senders.spawn(self.clone().heartbeat_voter(id, address)));
                }
            }
            while senders.try_join_next().is_some() {}
        }
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
            self.note_caught_up(Instant::now());
            self.admit_observers().await;
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

    /// Records which nodes hold every entry this leader has, for DescribeQuorum.
    fn note_caught_up(&self, now: Instant) {
        let metrics = self.raft.metrics().borrow().clone();
        let (Some(replication), Some(last_index)) = (&metrics.replication, metrics.last_log_index) else { return };
        let mut caught_up = self.caught_up.lock().expect("caught-up lock poisoned");
        for (&id, matched) in replication {
            if matched.is_some_and(|log_id| log_id.index >= last_index) {
                caught_up.insert(node_id(id), now);
            }
        }
    }

    /// Adds every node that heartbeats with a controller address but is not in the raft
    /// membership as a learner (an observer), so it receives the log.
    async fn admit_observers(&self) {
        let session_timeout = Duration::from_millis(self.config.session_timeout_ms);
        let membership = self.membership();
        let newcomers: Vec<(i32, String)> = {
            let liveness = self.liveness.lock().expect("liveness lock poisoned");
            liveness
                .last_seen
                .iter()
                .filter(|(&id, (seen, _))| {
                    seen.elapsed() < session_timeout && membership.get_node(&raft_id(id)).is_none()
                })
                .filter_map(|(&id, (_, heartbeat))| heartbeat.controller_address.clone().map(|address| (id, address)))
                .collect()
        };
        for (id, address) in newcomers {
            tracing::info!(node_id = id, %address, "adding an observer to the controller quorum");
            if let Err(error) = self.raft.add_learner(raft_id(id), BasicNode::new(&address), false).await {
                tracing::info!(node_id = id, %error, "adding the observer failed; retrying");
            }
        }
    }

    /// The `metadata.version` to finalize now: the newest that every member's binary (voters
    /// and observers, as registered) and this one understand, when it is newer than the
    /// finalized one.
    fn metadata_version_to_finalize(&self, metadata: &ClusterMetadata) -> Option<u16> {
        let mut supported = crate::metadata::METADATA_VERSION_LATEST;
        for member in self.membership().nodes().map(|(&id, _)| node_id(id)) {
            let broker = metadata.brokers.get(&member)?;
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

/// `at` in ms since the epoch, given `now` as both an `Instant` and a wall-clock time; -1 for none.
fn epoch_ms(now: (Instant, std::time::SystemTime), at: Option<Instant>) -> i64 {
    let Some(at) = at else { return -1 };
    let wall = now.1 - now.0.saturating_duration_since(at);
    wall.duration_since(std::time::UNIX_EPOCH).map_or(-1, |since| since.as_millis() as i64)
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
        check_refused(|config| config.node_id = -1, "non-negative");
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
