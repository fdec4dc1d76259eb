//! The replicated state machine: [`ClusterMetadata`] and the [`Command`]s that change it.
//!
//! Everything here is pure and deterministic: [`ClusterMetadata::apply`] is called on every
//! node with the same commands in the same order and must produce the same state, so it reads
//! no clock, no randomness and no environment. Choices that need randomness (where a topic's
//! replicas start, the topic id) are made by the proposer and carried in the command.
//!
//! A command is validated completely before anything is changed, so a rejected command leaves
//! the state untouched (a rejection is still a committed log entry; its result is the error).
//!
//! The leader election rules (the core safety rule of the cluster) live in
//! [`ClusterMetadata::apply`]'s helpers `fence_broker` and `unfence_broker`:
//! - a fenced broker loses the leadership of every partition it leads; the new leader is the
//!   first replica (in replica order) that is in the ISR and unfenced, `leader_epoch + 1`, and
//!   the fenced broker leaves the ISR;
//! - if no such replica exists the partition goes leaderless (`leader = -1`) and the ISR is
//!   kept as it is, so the last in-sync replica is remembered (no unclean election unless the
//!   topic sets `unclean.leader.election.enable=true`);
//! - a fenced broker also leaves the ISR of the partitions it follows (unless it is the last
//!   member), with `partition_epoch + 1`;
//! - an unfenced broker becomes the leader of every leaderless partition whose ISR holds it;
//! - a new partition is led by its first unfenced replica and its ISR is its unfenced replicas
//!   (only a manual replica assignment names fenced brokers; placement uses unfenced ones).
//!
//! From `metadata.version` [`METADATA_VERSION_ELR`] on, partitions also keep eligible leader
//! replicas (ELR): the replicas that left the ISR while it was smaller than the topic's
//! `min.insync.replicas`. The leader's high watermark does not move while its ISR is that
//! small, so each of them still holds every committed record and may lead as safely as an
//! ISR member. That lets the ISR shrink to nothing (a fenced last member leaves it for the
//! ELR) while the partition keeps several candidates instead of one:
//! - a replica leaving the ISR joins the ELR when the ISR left behind is below
//!   `min.insync.replicas`; at or above it the ELR is empty; the ELR and the ISR never share
//!   a member;
//! - without an eligible ISR member the first unfenced ELR member (in replica order) leads,
//!   with itself as the ISR; only after that comes an unclean election, which empties the
//!   ELR into `last_known_elr`;
//! - an unfenced broker in a leaderless partition's ELR becomes its leader.
//!
//! The ELR rules change how old commands apply, so before every node understands them
//! (a rolling upgrade) the rules above without ELR hold unchanged.
//!
//! ```
//! use sluice_cluster::{BrokerInfo, ClusterMetadata, Command};
//! let mut metadata = ClusterMetadata::default();
//! let broker = BrokerInfo { node_id: 1, host: "h".into(), port: 9092, rack: None, incarnation: 7, fenced: false, endpoints: vec![], metadata_version_max: 2 };
//! metadata.apply(Command::RegisterBroker(broker)).unwrap();
//! assert!(!metadata.brokers[&1].fenced);
//! ```

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// `metadata.version` of clusters formed before versioning (and of old nodes, which
/// report none): topics, partitions, brokers, producer ids, reassignments.
pub const METADATA_VERSION_INITIAL: u16 = 1;
/// The newest `metadata.version` this binary understands: 2 adds SCRAM credentials, ACLs,
/// client quotas and broker listener endpoints; 3 adds share groups' configs; 4 adds the
/// remote log metadata of tiered topics; 5 adds eligible leader replicas; 6 adds the AMQP
/// front door's state.
pub const METADATA_VERSION_LATEST: u16 = 6;
/// The `metadata.version` from which the cluster holds the AMQP front door's state.
pub const METADATA_VERSION_AMQP: u16 = 6;
/// Most entries of the AMQP front door's state (exchanges, queues, bindings, marks).
pub const AMQP_ENTRIES_MAX: usize = 400_000;
/// Largest key or value of an AMQP state entry.
pub const AMQP_ENTRY_BYTES_MAX: usize = 64 * 1024;
/// The `metadata.version` from which partitions keep eligible leader replicas.
pub const METADATA_VERSION_ELR: u16 = 5;

/// Most groups with configs of their own the cluster holds.
pub const GROUP_CONFIGS_MAX: usize = 100_000;

/// Most topics the cluster holds; CreateTopic beyond it is refused.
pub const TOPICS_MAX: usize = 10_000;
/// Most partitions of one topic (the broker's own limit is the same).
pub const PARTITIONS_PER_TOPIC_MAX: i32 = 100_000;
/// Most replicas of one partition.
pub const REPLICATION_FACTOR_MAX: i16 = 16;
/// Most registered brokers.
pub const BROKERS_MAX: usize = 1_024;
/// Longest topic name, as in Kafka.
pub const TOPIC_NAME_BYTES_MAX: usize = 249;
/// Most config overrides of one topic.
pub const CONFIGS_PER_TOPIC_MAX: usize = 256;
/// Most producer ids handed out by one AllocateProducerIds.
pub const PRODUCER_ID_BLOCK_MAX: i64 = 1 << 20;
/// The leader id of a partition without a leader.
pub const NO_LEADER: i32 = -1;
/// Topic config that allows electing an out-of-sync replica (data loss) over staying leaderless.
pub const UNCLEAN_LEADER_ELECTION_CONFIG: &str = "unclean.leader.election.enable";
/// Topic config: the ISR size below which acks=all writes are refused, the high watermark
/// stops, and replicas leaving the ISR become eligible leader replicas.
pub const MIN_INSYNC_REPLICAS_CONFIG: &str = "min.insync.replicas";
/// `min.insync.replicas` of a topic that does not set it (the brokers' default).
pub const MIN_INSYNC_REPLICAS_DEFAULT: usize = 1;

/// One broker as the controller quorum knows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerInfo {
    /// Node id (the same id as its controller).
    pub node_id: i32,
    /// Host of its Kafka listener.
    pub host: String,
    /// Port of its Kafka listener.
    pub port: u16,
    /// Every client listener by name (Metadata answers each client with the addresses
    /// of the listener it connected to). Empty from nodes that predate named listeners.
    #[serde(default)]
    pub endpoints: Vec<Endpoint>,
    /// The newest `metadata.version` this broker's binary understands (0: a node from
    /// before versioning, which understands [`METADATA_VERSION_INITIAL`]).
    #[serde(default)]
    pub metadata_version_max: u16,
    /// Rack, if configured.
    pub rack: Option<String>,
    /// Random per process start: a new value means the broker restarted.
    pub incarnation: u64,
    /// A fenced broker leads nothing and is in no ISR (except as the last member).
    pub fenced: bool,
}

/// One named listener of a broker, as clients reach it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    /// Listener name, upper case (`PLAINTEXT`, `SASL_SSL`, ...).
    pub name: String,
    /// Advertised host.
    pub host: String,
    /// Advertised port.
    pub port: u16,
}

impl BrokerInfo {
    /// (host, port) of this broker on listener `name`; `None` when it has no such listener.
    /// Brokers that registered no endpoints are reached at `host:port` on every listener.
    pub fn endpoint(&self, name: &str) -> Option<(&str, u16)> {
        if self.endpoints.is_empty() {
            return Some((&self.host, self.port));
        }
        self.endpoints.iter().find(|e| e.name == name).map(|e| (e.host.as_str(), e.port))
    }
}

/// One partition's replica set and leadership.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionInfo {
    /// Replicas in preference order: the first is the preferred leader.
    pub replicas: Vec<i32>,
    /// Current leader, [`NO_LEADER`] when none.
    pub leader: i32,
    /// Bumped on every leader change (including to and from [`NO_LEADER`]).
    pub leader_epoch: i32,
    /// In-sync replicas, a subset of `replicas`.
    pub isr: Vec<i32>,
    /// Bumped on every change of this partition's state.
    pub partition_epoch: i32,
    /// Eligible leader replicas: out of the ISR, yet holding every committed record (they
    /// left it while it was below `min.insync.replicas`). Never shares a member with `isr`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub elr: Vec<i32>,
    /// Former eligible leader replicas an unclean election passed over: the replicas most
    /// likely to hold the newest records, for an operator recovering the partition.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub last_known_elr: Vec<i32>,
}

/// One topic.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicInfo {
    /// Kafka topic id.
    pub topic_id: Uuid,
    /// Config overrides (Kafka names); validated by the broker, stored as given.
    pub configs: BTreeMap<String, String>,
    /// Partitions by index.
    pub partitions: Vec<PartitionInfo>,
}

/// A reassignment in progress: the partition's replicas are `original` plus `target` until
/// every target replica is in the ISR, then they become `target`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reassignment {
    /// The replicas wanted at the end.
    pub target: Vec<i32>,
    /// The replicas before the reassignment started (restored on cancel).
    pub original: Vec<i32>,
}

/// The whole replicated cluster state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterMetadata {
    /// Registered brokers by node id.
    pub brokers: BTreeMap<i32, BrokerInfo>,
    /// Topics by name.
    pub topics: BTreeMap<String, TopicInfo>,
    /// First producer id of the next AllocateProducerIds block.
    pub next_producer_id: i64,
    /// Raft log index of the last applied entry: grows with every change.
    pub version: u64,
    /// Reassignments in progress: topic -> partition -> reassignment.
    pub reassignments: BTreeMap<String, BTreeMap<i32, Reassignment>>,
    /// SASL/SCRAM credentials: user -> mechanism name (`SCRAM-SHA-256`, ...) -> credential.
    #[serde(default)]
    pub scram_credentials: BTreeMap<String, BTreeMap<String, ScramCredential>>,
    /// Access control entries (Kafka's ACLs), checked by every broker on every request.
    #[serde(default)]
    pub acls: BTreeSet<AclBinding>,
    /// Client quotas (Kafka's `kafka-configs --entity-type users/clients`): entity ->
    /// quota name (`producer_byte_rate`, ...) -> value.
    #[serde(default)]
    pub client_quotas: BTreeMap<QuotaEntity, BTreeMap<String, u64>>,
    /// The finalized `metadata.version` (0 = [`METADATA_VERSION_INITIAL`]): commands that
    /// need a newer one are refused, so a node that cannot understand them never sees them.
    #[serde(default)]
    pub metadata_version: u16,
    /// Share groups' configs (Kafka's GROUP config resource: `share.auto.offset.reset`,
    /// ...): group -> name -> value. Every broker leading a partition a group consumes
    /// needs them.
    #[serde(default)]
    pub group_configs: BTreeMap<String, BTreeMap<String, String>>,
    /// Tiered topics' remote log metadata (KIP-405): topic id -> partition -> what the
    /// object store holds. Written by each partition's leader, dropped with the topic.
    #[serde(default)]
    pub remote_logs: BTreeMap<Uuid, BTreeMap<i32, RemoteLog>>,
    /// The AMQP front door's state (exchanges, what AMQP knows of queues, bindings, delivery
    /// marks): key -> value, both opaque here (`sluice-amqp` defines them). Every node routes
    /// AMQP messages with it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub amqp: BTreeMap<String, String>,
    /// Bumped by every change of `amqp`: a change computed from an older state is refused.
    #[serde(default)]
    pub amqp_version: u64,
}

/// One segment copied to the object store (Kafka's RemoteLogSegmentMetadata).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteLogSegment {
    /// Names its objects: a segment copied twice (a retry after a crash, a new leader) gets
    /// two ids, and only the listed one is read.
    pub id: Uuid,
    /// First offset.
    pub base_offset: i64,
    /// The segment covers `[base_offset, end_offset)`.
    pub end_offset: i64,
    /// Largest record timestamp.
    pub max_timestamp: i64,
    /// Bytes of record batches.
    pub size_bytes: u64,
    /// (leader epoch, first offset) of the epochs with records in the segment.
    pub leader_epochs: Vec<(i32, i64)>,
    /// A producer snapshot at `end_offset` was copied beside it.
    pub has_producer_snapshot: bool,
    /// Aborted transactions were copied beside it.
    pub has_aborted_transactions: bool,
}

/// A tiered partition's remote part.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteLog {
    /// The first readable offset of the remote part (moved by DeleteRecords and retention).
    pub start_offset: i64,
    /// By base offset.
    pub segments: BTreeMap<i64, RemoteLogSegment>,
}

impl RemoteLog {
    /// `[start, end)` the remote part holds, `None` when it holds nothing.
    pub fn range(&self) -> Option<(i64, i64)> {
        let first = self.segments.values().next()?;
        let end = self.segments.values().map(|s| s.end_offset).max().expect("non-empty");
        Some((self.start_offset.max(first.base_offset).min(end), end))
    }

    /// The segment holding `offset`, if the remote part has it.
    pub fn segment_for(&self, offset: i64) -> Option<&RemoteLogSegment> {
        if offset < self.start_offset {
            return None;
        }
        let (_, segment) = self.segments.range(..=offset).next_back()?;
        (offset < segment.end_offset).then_some(segment)
    }

    /// Bytes of all remote segments.
    pub fn size_bytes(&self) -> u64 {
        self.segments.values().map(|s| s.size_bytes).sum()
    }

    /// Whether the segments are well formed: each non-empty, keyed by its base offset.
    fn is_valid(&self) -> bool {
        self.start_offset >= 0
            && self.segments.iter().all(|(&base, s)| s.base_offset == base && base >= 0 && s.end_offset > base)
    }
}

/// The name part of a quota entity: a specific user or client id, or the default.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum QuotaEntityName {
    /// Kafka's `<default>`: applies to those without a quota of their own.
    Default,
    /// One user or client id.
    Named(String),
}

/// Who a quota applies to: a user, a client id, or both (Kafka's quota entity).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct QuotaEntity {
    /// The `user` component, if any.
    pub user: Option<QuotaEntityName>,
    /// The `client-id` component, if any.
    pub client_id: Option<QuotaEntityName>,
}

/// Most quota entities the cluster holds.
pub const QUOTA_ENTITIES_MAX: usize = 100_000;

/// One ACL as Kafka's CreateAcls carries it, with Kafka's enum codes: which resources
/// (type, name, LITERAL or PREFIXED pattern), whom (principal, host), what (operation),
/// and whether it allows or denies.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct AclBinding {
    /// TOPIC 2, GROUP 3, CLUSTER 4, TRANSACTIONAL_ID 5, ...
    pub resource_type: i8,
    /// The resource name or prefix; `*` (literal) matches every name.
    pub resource_name: String,
    /// LITERAL 3 or PREFIXED 4.
    pub pattern_type: i8,
    /// `User:name`, or `User:*` for everyone.
    pub principal: String,
    /// Client IP, or `*`.
    pub host: String,
    /// ALL 2, READ 3, WRITE 4, ...
    pub operation: i8,
    /// DENY 2 or ALLOW 3.
    pub permission_type: i8,
}

/// Most ACLs the cluster holds.
pub const ACLS_MAX: usize = 100_000;

/// A user's SCRAM credential for one mechanism (RFC 5802): what the server keeps instead
/// of the password. Computed by the broker from the salted password a client sends.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScramCredential {
    /// The salt the password was hashed with.
    pub salt: Vec<u8>,
    /// H(HMAC(SaltedPassword, "Client Key")): checks the client's proof.
    pub stored_key: Vec<u8>,
    /// HMAC(SaltedPassword, "Server Key"): proves the server to the client.
    pub server_key: Vec<u8>,
    /// PBKDF2 iterations of the salted password.
    pub iterations: i32,
}

/// Most SCRAM users the cluster holds.
pub const SCRAM_USERS_MAX: usize = 100_000;

/// A change to the cluster metadata: the application data of the raft log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Add or replace SCRAM credentials (user, mechanism, credential) and delete others
    /// (user, mechanism); validated by the broker, applied as one change.
    AlterScramCredentials {
        /// (user, mechanism, credential) to add or replace.
        upsertions: Vec<(String, String, ScramCredential)>,
        /// (user, mechanism) to remove.
        deletions: Vec<(String, String)>,
    },
    /// Set (`Some`) or remove (`None`) quota values of entities, as one change.
    AlterClientQuotas {
        /// (entity, quota name, new value or removal).
        changes: Vec<(QuotaEntity, String, Option<u64>)>,
    },
    /// Raise the finalized `metadata.version` (the active controller proposes it once
    /// every voter runs a binary that understands it).
    FinalizeMetadataVersion {
        /// The new version.
        version: u16,
    },
    /// Add ACLs (already present ones are kept once) and remove others, as one change.
    AlterAcls {
        /// ACLs to add.
        create: Vec<AclBinding>,
        /// ACLs to remove.
        delete: Vec<AclBinding>,
    },
    /// Add or update a broker. A new incarnation of a live broker first fences the old one
    /// (leaderships move, ISRs shrink); an unfenced arrival takes leaderless partitions.
    RegisterBroker(BrokerInfo),
    /// The broker's session expired.
    FenceBroker {
        /// The broker.
        node_id: i32,
    },
    /// The broker is alive again.
    UnfenceBroker {
        /// The broker.
        node_id: i32,
    },
    /// Create a topic; replicas are placed at apply time from `placement_seed`, or where
    /// `assignment` puts them.
    CreateTopic {
        /// Topic name.
        name: String,
        /// Chosen by the proposer.
        topic_id: Uuid,
        /// Partition count; -1 with an `assignment` (as in Kafka's CreateTopics).
        partitions: i32,
        /// Replicas per partition; -1 with an `assignment`.
        replication_factor: i16,
        /// Config overrides.
        configs: BTreeMap<String, String>,
        /// Random, chosen by the proposer: where the round-robin placement starts.
        placement_seed: u64,
        /// Kafka's manual replica assignment: the replicas of partition `i` are
        /// `assignment[i]`, the first being the preferred leader. Absent from entries written
        /// before manual assignment existed.
        #[serde(default)]
        assignment: Option<Vec<Vec<i32>>>,
    },
    /// Delete a topic.
    DeleteTopic {
        /// Topic name.
        name: String,
    },
    /// Grow a topic to `total` partitions.
    CreatePartitions {
        /// Topic name.
        name: String,
        /// New partition count.
        total: i32,
        /// Random, chosen by the proposer.
        placement_seed: u64,
        /// Kafka's manual replica assignment of the new partitions, in partition order.
        #[serde(default)]
        assignment: Option<Vec<Vec<i32>>>,
    },
    /// Replace a topic's config overrides.
    AlterTopicConfigs {
        /// Topic name.
        name: String,
        /// The new overrides (all of them).
        configs: BTreeMap<String, String>,
        /// Compare-and-set: the overrides the change was computed from. An incremental
        /// change computed on a node whose metadata was behind is refused, not applied
        /// over a concurrent one.
        #[serde(default)]
        expected: Option<BTreeMap<String, String>>,
    },
    /// Change entries of the AMQP front door's state, as one change.
    AlterAmqpState {
        /// Compare-and-set: the `amqp_version` the change was computed from (`None`: any).
        expected_version: Option<u64>,
        /// Entries added or replaced.
        puts: BTreeMap<String, String>,
        /// Entries removed.
        deletes: Vec<String>,
    },
    /// Replace a group's configs (all of them; none removes the entry).
    AlterGroupConfigs {
        /// Group id.
        group: String,
        /// The new configs.
        configs: BTreeMap<String, String>,
    },
    /// Kafka's AlterPartition: the partition leader changes the ISR.
    AlterPartition {
        /// Topic name.
        topic: String,
        /// Partition index.
        partition: i32,
        /// The broker asking: must be the current leader.
        leader_id: i32,
        /// Must equal the current leader epoch.
        leader_epoch: i32,
        /// Must equal the current partition epoch.
        partition_epoch: i32,
        /// The new ISR.
        new_isr: Vec<i32>,
    },
    /// Hand out `count` producer ids.
    AllocateProducerIds {
        /// How many.
        count: i64,
    },
    /// Preferred (`preferred = true`) or leaderless-only election over all partitions.
    ElectLeaders {
        /// Move leadership back to the first replica where possible.
        preferred: bool,
    },
    /// A tiered partition's leader replaces its remote log metadata (after copying a
    /// segment to the object store, or to expire remote segments).
    SetRemoteLog {
        /// Topic name.
        topic: String,
        /// Partition index.
        partition: i32,
        /// The broker asking: must be the current leader.
        leader_id: i32,
        /// Must equal the current leader epoch: a deposed leader cannot write.
        leader_epoch: i32,
        /// The partition's remote part, all of it.
        remote_log: RemoteLog,
    },
    /// Start (`Some`) or cancel (`None`) a reassignment.
    Reassign {
        /// Topic name.
        topic: String,
        /// Partition index.
        partition: i32,
        /// Target replicas.
        target: Option<Vec<i32>>,
    },
}

impl Command {
    /// The `metadata.version` a command needs: a command added later is refused until
    /// every node understands it.
    pub fn required_metadata_version(&self) -> u16 {
        match self {
            Command::AlterScramCredentials { .. } | Command::AlterAcls { .. } | Command::AlterClientQuotas { .. } => 2,
            Command::AlterGroupConfigs { .. } => 3,
            Command::SetRemoteLog { .. } => 4,
            Command::AlterAmqpState { .. } => METADATA_VERSION_AMQP,
            _ => METADATA_VERSION_INITIAL,
        }
    }
}

/// What an applied command returns.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandOutput {
    /// Nothing to report.
    Done,
    /// The topic as created or changed.
    Topic(TopicInfo),
    /// The partition as changed.
    Partition(PartitionInfo),
    /// First id of the allocated producer-id block.
    ProducerIds {
        /// First id.
        first: i64,
    },
    /// How many partitions got a new leader.
    Elected(usize),
}

/// Why a command was refused. Serializable: it travels back in the raft response.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum MetadataError {
    /// CreateTopic of an existing name.
    #[error("topic {0} already exists")]
    TopicAlreadyExists(String),
    /// A command newer than the cluster's finalized `metadata.version`.
    #[error(
        "this needs metadata.version {required}, the cluster is at {finalized}: every node must run a binary \
         that supports it first (rolling upgrade)"
    )]
    UnsupportedMetadataVersion {
        /// What the command needs.
        required: u16,
        /// What the cluster is at.
        finalized: u16,
    },
    /// No such topic.
    #[error("unknown topic {0}")]
    UnknownTopic(String),
    /// No such partition.
    #[error("unknown partition {topic}-{partition}")]
    UnknownPartition {
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
    },
    /// Bad partition count.
    #[error("invalid partitions: {0}")]
    InvalidPartitions(String),
    /// Bad replication factor, or not enough unfenced brokers.
    #[error("invalid replication factor: {0}")]
    InvalidReplicationFactor(String),
    /// Bad replica list.
    #[error("invalid replica assignment: {0}")]
    InvalidReplicaAssignment(String),
    /// AlterPartition with a leader epoch that is not the current one.
    #[error("stale leader epoch {given}, current {current}")]
    StaleEpoch {
        /// The request's epoch.
        given: i32,
        /// The partition's epoch.
        current: i32,
    },
    /// AlterPartition with a partition epoch that is not the current one.
    #[error("invalid update version: partition epoch {given}, current {current}")]
    InvalidUpdateVersion {
        /// The request's epoch.
        given: i32,
        /// The partition's epoch.
        current: i32,
    },
    /// AlterPartition from a broker that does not lead the partition.
    #[error("broker {given} is not the leader (leader is {current})")]
    NotLeader {
        /// The asking broker.
        given: i32,
        /// The current leader.
        current: i32,
    },
    /// The new ISR holds a broker that is not a replica or is fenced.
    #[error("ineligible replica: {0}")]
    IneligibleReplica(String),
    /// No such broker.
    #[error("unknown broker {0}")]
    UnknownBroker(i32),
    /// Cancel of a reassignment that does not exist.
    #[error("no reassignment in progress for {topic}-{partition}")]
    NoReassignmentInProgress {
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
    },
    /// A compare-and-set config change computed from overrides that changed meanwhile.
    #[error("the configs of topic {0} changed concurrently")]
    ConfigsChanged(String),
    /// A named limit would be exceeded.
    #[error("limit exceeded: {0}")]
    LimitExceeded(String),
    /// Malformed request.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
}

/// The result an applied command returns, as stored in the raft response.
pub type CommandResult = Result<CommandOutput, MetadataError>;

impl ClusterMetadata {
    /// The partition, if it exists.
    pub fn partition(&self, topic: &str, partition: i32) -> Option<&PartitionInfo> {
        let index = usize::try_from(partition).ok()?;
        self.topics.get(topic)?.partitions.get(index)
    }

    /// Ids of the unfenced brokers, ascending.
    pub fn unfenced_brokers(&self) -> Vec<i32> {
        self.brokers.values().filter(|broker| !broker.fenced).map(|broker| broker.node_id).collect()
    }

    fn alter_amqp_state(
        &mut self,
        expected_version: Option<u64>,
        puts: BTreeMap<String, String>,
        deletes: Vec<String>,
    ) -> CommandResult {
        if expected_version.is_some_and(|expected| expected != self.amqp_version) {
            return Err(MetadataError::ConfigsChanged("the AMQP state".to_string()));
        }
        let oversized = puts.iter().any(|(k, v)| k.len() > AMQP_ENTRY_BYTES_MAX || v.len() > AMQP_ENTRY_BYTES_MAX);
        if oversized {
            return Err(MetadataError::InvalidRequest(format!("an AMQP entry over {AMQP_ENTRY_BYTES_MAX} bytes")));
        }
        let added = puts.keys().filter(|key| !self.amqp.contains_key(*key)).count();
        if self.amqp.len() + added > AMQP_ENTRIES_MAX + deletes.len() {
            return Err(MetadataError::LimitExceeded(format!("{AMQP_ENTRIES_MAX} AMQP entries")));
        }
        for key in &deletes {
            self.amqp.remove(key);
        }
        self.amqp.extend(puts);
        self.amqp_version += 1;
        Ok(CommandOutput::Done)
    }

    /// The finalized `metadata.version`.
    pub fn metadata_version(&self) -> u16 {
        self.metadata_version.max(METADATA_VERSION_INITIAL)
    }

    /// Applies one command: all validation first, then the change, so an error changes nothing.
    pub fn apply(&mut self, command: Command) -> CommandResult {
        let required = command.required_metadata_version();
        if required > self.metadata_version() {
            return Err(MetadataError::UnsupportedMetadataVersion { required, finalized: self.metadata_version() });
        }
        match command {
            Command::RegisterBroker(info) => self.register_broker(info),
            Command::FenceBroker { node_id } => self.fence_broker(node_id),
            Command::UnfenceBroker { node_id } => self.unfence_broker(node_id),
            Command::CreateTopic {
                name,
                topic_id,
                partitions,
                replication_factor,
                configs,
                placement_seed,
                assignment,
            } => {
                let replicas = self.new_topic_replicas(
                    &name,
                    partitions,
                    replication_factor,
                    &configs,
                    placement_seed,
                    assignment,
                )?;
                self.create_topic(name, topic_id, configs, replicas)
            }
            Command::DeleteTopic { name } => self.delete_topic(&name),
            Command::CreatePartitions { name, total, placement_seed, assignment } => {
                self.create_partitions(&name, total, placement_seed, assignment)
            }
            Command::AlterTopicConfigs { name, configs, expected } => {
                self.alter_topic_configs(&name, configs, expected)
            }
            Command::AlterGroupConfigs { group, configs } => {
                if configs.is_empty() {
                    self.group_configs.remove(&group);
                } else {
                    if !self.group_configs.contains_key(&group) && self.group_configs.len() >= GROUP_CONFIGS_MAX {
                        return Err(MetadataError::LimitExceeded(format!("configs of {GROUP_CONFIGS_MAX} groups")));
                    }
                    self.group_configs.insert(group, configs);
                }
                Ok(CommandOutput::Done)
            }
            Command::AlterAmqpState { expected_version, puts, deletes } => {
                self.alter_amqp_state(expected_version, puts, deletes)
            }
            Command::AlterPartition { topic, partition, leader_id, leader_epoch, partition_epoch, new_isr } => {
                self.alter_partition(&topic, partition, leader_id, leader_epoch, partition_epoch, new_isr)
            }
            Command::SetRemoteLog { topic, partition, leader_id, leader_epoch, remote_log } => {
                self.set_remote_log(&topic, partition, leader_id, leader_epoch, remote_log)
            }
            Command::AllocateProducerIds { count } => self.allocate_producer_ids(count),
            Command::ElectLeaders { preferred } => Ok(CommandOutput::Elected(self.elect_leaders(preferred))),
            Command::Reassign { topic, partition, target } => self.reassign(&topic, partition, target),
            Command::AlterScramCredentials { upsertions, deletions } => {
                self.alter_scram_credentials(upsertions, deletions)
            }
            Command::FinalizeMetadataVersion { version } => {
                if version <= self.metadata_version() {
                    return Err(MetadataError::InvalidRequest(format!(
                        "metadata.version is already {}",
                        self.metadata_version()
                    )));
                }
                self.metadata_version = version;
                Ok(CommandOutput::Done)
            }
            Command::AlterClientQuotas { changes } => {
                let mut quotas = self.client_quotas.clone();
                for (entity, key, value) in changes {
                    let values = quotas.entry(entity.clone()).or_default();
                    match value {
                        Some(value) => {
                            values.insert(key, value);
                        }
                        None => {
                            values.remove(&key);
                        }
                    }
                    if values.is_empty() {
                        quotas.remove(&entity);
                    }
                }
                if quotas.len() > QUOTA_ENTITIES_MAX {
                    return Err(MetadataError::LimitExceeded(format!("more than {QUOTA_ENTITIES_MAX} quota entities")));
                }
                self.client_quotas = quotas;
                Ok(CommandOutput::Done)
            }
            Command::AlterAcls { create, delete } => {
                let added = create.iter().filter(|acl| !self.acls.contains(acl)).count();
                if self.acls.len() + added > ACLS_MAX {
                    return Err(MetadataError::LimitExceeded(format!("more than {ACLS_MAX} ACLs")));
                }
                for acl in &delete {
                    self.acls.remove(acl);
                }
                self.acls.extend(create);
                Ok(CommandOutput::Done)
            }
        }
    }

    fn alter_scram_credentials(
        &mut self,
        upsertions: Vec<(String, String, ScramCredential)>,
        deletions: Vec<(String, String)>,
    ) -> CommandResult {
        let new_users = upsertions.iter().filter(|(user, _, _)| !self.scram_credentials.contains_key(user)).count();
        if self.scram_credentials.len() + new_users > SCRAM_USERS_MAX {
            return Err(MetadataError::LimitExceeded(format!("more than {SCRAM_USERS_MAX} SCRAM users")));
        }
        for (user, mechanism) in deletions {
            if let Some(credentials) = self.scram_credentials.get_mut(&user) {
                credentials.remove(&mechanism);
                if credentials.is_empty() {
                    self.scram_credentials.remove(&user);
                }
            }
        }
        for (user, mechanism, credential) in upsertions {
            self.scram_credentials.entry(user).or_default().insert(mechanism, credential);
        }
        Ok(CommandOutput::Done)
    }

    fn register_broker(&mut self, info: BrokerInfo) -> CommandResult {
        if info.node_id < 0 {
            return Err(MetadataError::InvalidRequest(format!("negative node id {}", info.node_id)));
        }
        let restarted = match self.brokers.get(&info.node_id) {
            Some(existing) => !existing.fenced && existing.incarnation != info.incarnation,
            None if self.brokers.len() >= BROKERS_MAX => {
                return Err(MetadataError::LimitExceeded(format!("more than {BROKERS_MAX} brokers")));
            }
            None => false,
        };
        let node_id = info.node_id;
        if restarted {
            // A new incarnation of a broker still registered as live: the old process is gone,
            // and with it whatever it had not made durable. Fence the old incarnation first, so
            // its leaderships move (with a new leader epoch) and it leaves the ISRs until its
            // leaders add it back, exactly as if its session had expired.
            self.fence_broker(node_id)?;
        }
        let was_fenced = self.brokers.get(&node_id).is_none_or(|existing| existing.fenced);
        let fenced = info.fenced;
        self.brokers.insert(node_id, info);
        if was_fenced && !fenced {
            self.elect_for_unfenced(node_id);
        }
        Ok(CommandOutput::Done)
    }

    fn fence_broker(&mut self, node_id: i32) -> CommandResult {
        let broker = self.brokers.get_mut(&node_id).ok_or(MetadataError::UnknownBroker(node_id))?;
        if broker.fenced {
            return Ok(CommandOutput::Done);
        }
        broker.fenced = true;
        let elr = self.elr_enabled();
        let brokers = &self.brokers;
        for topic in self.topics.values_mut() {
            let rules = ElectionRules::of(&topic.configs, elr);
            for partition in &mut topic.partitions {
                fence_in_partition(partition, node_id, brokers, rules);
            }
        }
        Ok(CommandOutput::Done)
    }

    fn unfence_broker(&mut self, node_id: i32) -> CommandResult {
        let broker = self.brokers.get_mut(&node_id).ok_or(MetadataError::UnknownBroker(node_id))?;
        if !broker.fenced {
            return Ok(CommandOutput::Done);
        }
        broker.fenced = false;
        self.elect_for_unfenced(node_id);
        Ok(CommandOutput::Done)
    }

    /// Whether partitions keep eligible leader replicas (every node understands them).
    fn elr_enabled(&self) -> bool {
        self.metadata_version() >= METADATA_VERSION_ELR
    }

    /// A broker became eligible: it leads the leaderless partitions whose ISR or ELR holds it
    /// (or, with unclean election allowed, whose replicas hold it).
    fn elect_for_unfenced(&mut self, node_id: i32) {
        assert!(self.brokers.get(&node_id).is_some_and(|broker| !broker.fenced));
        let elr = self.elr_enabled();
        for topic in self.topics.values_mut() {
            let rules = ElectionRules::of(&topic.configs, elr);
            for partition in &mut topic.partitions {
                if partition.leader != NO_LEADER {
                    continue;
                }
                if partition.isr.contains(&node_id) {
                    set_leader(partition, node_id);
                } else if let Some(min_insync) = rules.min_insync.filter(|_| partition.elr.contains(&node_id)) {
                    lead_from_elr(partition, node_id, min_insync);
                } else if rules.unclean && partition.replicas.contains(&node_id) {
                    lead_unclean(partition, node_id);
                }
                check_partition(partition);
            }
        }
    }

    /// Checks a CreateTopic as [`ClusterMetadata::apply`] does (all but the proposer's topic
    /// id) without changing anything: CreateTopics with `validate_only` asks this. With an
    /// `assignment`, `partitions` and `replication_factor` must be -1, as in Kafka's request.
    pub fn check_create_topic(
        &self,
        name: &str,
        partitions: i32,
        replication_factor: i16,
        configs: &BTreeMap<String, String>,
        assignment: Option<&[Vec<i32>]>,
    ) -> Result<(), MetadataError> {
        validate_topic_name(name)?;
        if self.topics.contains_key(name) {
            return Err(MetadataError::TopicAlreadyExists(name.to_string()));
        }
        if self.topics.len() >= TOPICS_MAX {
            return Err(MetadataError::LimitExceeded(format!("more than {TOPICS_MAX} topics")));
        }
        validate_configs(configs)?;
        let Some(assignment) = assignment else {
            check_partition_count(partitions)?;
            return self.check_replication_factor(replication_factor).map(drop);
        };
        if partitions != -1 || replication_factor != -1 {
            return Err(MetadataError::InvalidRequest(format!(
                "with a manual replica assignment, partitions and replication factor must be -1, not {partitions} \
                 and {replication_factor}"
            )));
        }
        check_partition_count(i32::try_from(assignment.len()).unwrap_or(i32::MAX))?;
        self.check_assignment(0, assignment, None)
    }

    /// The replica lists of a new topic: `assignment` once checked, else placed over the
    /// unfenced brokers from `placement_seed`.
    fn new_topic_replicas(
        &self,
        name: &str,
        partitions: i32,
        replication_factor: i16,
        configs: &BTreeMap<String, String>,
        placement_seed: u64,
        assignment: Option<Vec<Vec<i32>>>,
    ) -> Result<Vec<Vec<i32>>, MetadataError> {
        self.check_create_topic(name, partitions, replication_factor, configs, assignment.as_deref())?;
        if let Some(assignment) = assignment {
            return Ok(assignment);
        }
        let factor = usize::try_from(replication_factor).expect("checked positive");
        Ok(self.place_replicas(0, partitions, factor, placement_seed))
    }

    /// Adds a topic whose replica lists `new_topic_replicas` checked or placed.
    fn create_topic(
        &mut self,
        name: String,
        topic_id: Uuid,
        configs: BTreeMap<String, String>,
        replicas: Vec<Vec<i32>>,
    ) -> CommandResult {
        assert!(!self.topics.contains_key(&name), "checked by check_create_topic");
        if self.topics.values().any(|topic| topic.topic_id == topic_id) || topic_id.is_nil() {
            return Err(MetadataError::InvalidRequest(format!("topic id {topic_id} is taken or nil")));
        }
        let partitions = replicas.into_iter().map(|replicas| new_partition(replicas, &self.brokers)).collect();
        let topic = TopicInfo { topic_id, configs, partitions };
        self.topics.insert(name, topic.clone());
        Ok(CommandOutput::Topic(topic))
    }

    /// The replication factor as a count, if it is in range and that many brokers are unfenced
    /// to place the replicas on.
    fn check_replication_factor(&self, replication_factor: i16) -> Result<usize, MetadataError> {
        if !(1..=REPLICATION_FACTOR_MAX).contains(&replication_factor) {
            return Err(MetadataError::InvalidReplicationFactor(format!(
                "{replication_factor}, must be 1..={REPLICATION_FACTOR_MAX}"
            )));
        }
        let factor = usize::try_from(replication_factor).expect("checked positive");
        let unfenced = self.brokers.values().filter(|broker| !broker.fenced).count();
        if unfenced < factor {
            return Err(MetadataError::InvalidReplicationFactor(format!(
                "replication factor {factor} is larger than the {unfenced} unfenced brokers"
            )));
        }
        Ok(factor)
    }

    /// Kafka's checks of a manual replica assignment whose first list is partition
    /// `first_partition`'s. Every list is non-empty, at most [`REPLICATION_FACTOR_MAX`] long,
    /// names each broker once and only registered brokers, is as long as the others (and as
    /// `replication_factor` when given), and holds an unfenced broker to lead. A fenced broker
    /// may be named, as in Kafka: it starts as a replica outside the ISR and joins it once it
    /// is back and has caught up.
    fn check_assignment(
        &self,
        first_partition: i32,
        assignment: &[Vec<i32>],
        replication_factor: Option<usize>,
    ) -> Result<(), MetadataError> {
        let factor_max = usize::try_from(REPLICATION_FACTOR_MAX).expect("positive");
        let factor = replication_factor.or_else(|| assignment.first().map(Vec::len));
        for (partition, replicas) in (first_partition..).zip(assignment) {
            let refuse =
                |why: String| Err(MetadataError::InvalidReplicaAssignment(format!("partition {partition}: {why}")));
            if replicas.is_empty() || replicas.len() > factor_max {
                return refuse(format!("{} replicas, must be 1..={factor_max}", replicas.len()));
            }
            if let Some(unknown) = replicas.iter().find(|replica| !self.brokers.contains_key(replica)) {
                return refuse(format!("broker {unknown} is not registered"));
            }
            if replicas.iter().collect::<BTreeSet<_>>().len() != replicas.len() {
                return refuse(format!("replicas {replicas:?} name a broker twice"));
            }
            let factor = factor.expect("the assignment is not empty");
            if replicas.len() != factor {
                return refuse(format!("{} replicas, but the topic's partitions have {factor}", replicas.len()));
            }
            if !replicas.iter().any(|&replica| eligible(&self.brokers, replica)) {
                return refuse(format!("every replica of {replicas:?} is fenced"));
            }
        }
        Ok(())
    }

    /// Kafka's rack-unaware placement over the unfenced brokers: partition `p`'s first replica
    /// is broker `(start + p) mod n` (so leaders go round-robin), the followers follow at a
    /// shift that grows after every `n` partitions (so followers spread too).
    fn place_replicas(&self, first_partition: i32, count: i32, factor: usize, placement_seed: u64) -> Vec<Vec<i32>> {
        let brokers = self.unfenced_brokers();
        assert!(factor >= 1 && brokers.len() >= factor, "checked by check_replication_factor");
        let n = brokers.len();
        let start = usize::try_from(placement_seed % n as u64).expect("below n");
        let shift_base = usize::try_from((placement_seed >> 32) % n as u64).expect("below n");
        let mut assignment = Vec::with_capacity(usize::try_from(count).unwrap_or(0));
        for index in 0..count {
            let p = usize::try_from(first_partition + index).expect("partition index is positive");
            let first = (start + p) % n;
            let mut replicas = vec![brokers[first]];
            let shift = shift_base + p / n;
            for j in 0..factor - 1 {
                let offset = 1 + (shift + j) % (n - 1);
                replicas.push(brokers[(first + offset) % n]);
            }
            debug_assert_eq!(replicas.iter().collect::<BTreeSet<_>>().len(), factor);
            assignment.push(replicas);
        }
        assignment
    }

    fn delete_topic(&mut self, name: &str) -> CommandResult {
        let Some(topic) = self.topics.remove(name) else {
            return Err(MetadataError::UnknownTopic(name.to_string()));
        };
        self.reassignments.remove(name);
        self.remote_logs.remove(&topic.topic_id);
        Ok(CommandOutput::Done)
    }

    fn set_remote_log(
        &mut self,
        topic: &str,
        index: i32,
        leader_id: i32,
        leader_epoch: i32,
        remote_log: RemoteLog,
    ) -> CommandResult {
        let partition = self.partition(topic, index).ok_or_else(|| unknown_partition(topic, index))?;
        if leader_epoch != partition.leader_epoch {
            return Err(MetadataError::StaleEpoch { given: leader_epoch, current: partition.leader_epoch });
        }
        if leader_id != partition.leader {
            return Err(MetadataError::NotLeader { given: leader_id, current: partition.leader });
        }
        if !remote_log.is_valid() {
            return Err(MetadataError::InvalidRequest(format!("malformed remote log of {topic}-{index}")));
        }
        let topic_id = self.topics[topic].topic_id;
        let logs = self.remote_logs.entry(topic_id).or_default();
        if remote_log == RemoteLog::default() {
            logs.remove(&index);
        } else {
            logs.insert(index, remote_log);
        }
        if logs.is_empty() {
            self.remote_logs.remove(&topic_id);
        }
        Ok(CommandOutput::Done)
    }

    /// A tiered partition's remote part (empty when it has none).
    pub fn remote_log(&self, topic_id: &Uuid, partition: i32) -> Option<&RemoteLog> {
        self.remote_logs.get(topic_id)?.get(&partition)
    }

    /// Checks a CreatePartitions as [`ClusterMetadata::apply`] does, without changing anything:
    /// CreatePartitions with `validate_only` asks this. An `assignment` holds one replica list
    /// per new partition, each as long as the topic's replication factor.
    pub fn check_create_partitions(
        &self,
        name: &str,
        total: i32,
        assignment: Option<&[Vec<i32>]>,
    ) -> Result<(), MetadataError> {
        let topic = self.topics.get(name).ok_or_else(|| MetadataError::UnknownTopic(name.to_string()))?;
        let current = i32::try_from(topic.partitions.len()).expect("bounded by PARTITIONS_PER_TOPIC_MAX");
        if total <= current || total > PARTITIONS_PER_TOPIC_MAX {
            return Err(MetadataError::InvalidPartitions(format!(
                "topic {name} has {current} partitions, asked for {total} (max {PARTITIONS_PER_TOPIC_MAX})"
            )));
        }
        let factor = topic.partitions[0].replicas.len();
        let Some(assignment) = assignment else {
            let factor = i16::try_from(factor).expect("bounded by twice REPLICATION_FACTOR_MAX");
            return self.check_replication_factor(factor).map(drop);
        };
        let added = usize::try_from(total - current).expect("checked positive");
        if assignment.len() != added {
            return Err(MetadataError::InvalidReplicaAssignment(format!(
                "{added} partitions are added but {} replica lists were given",
                assignment.len()
            )));
        }
        self.check_assignment(current, assignment, Some(factor))
    }

    fn create_partitions(
        &mut self,
        name: &str,
        total: i32,
        placement_seed: u64,
        assignment: Option<Vec<Vec<i32>>>,
    ) -> CommandResult {
        self.check_create_partitions(name, total, assignment.as_deref())?;
        let topic = &self.topics[name];
        let current = i32::try_from(topic.partitions.len()).expect("bounded by PARTITIONS_PER_TOPIC_MAX");
        let factor = topic.partitions[0].replicas.len();
        let replicas =
            assignment.unwrap_or_else(|| self.place_replicas(current, total - current, factor, placement_seed));
        let brokers = &self.brokers;
        let topic = self.topics.get_mut(name).expect("checked above");
        topic.partitions.extend(replicas.into_iter().map(|replicas| new_partition(replicas, brokers)));
        Ok(CommandOutput::Topic(topic.clone()))
    }

    fn alter_topic_configs(
        &mut self,
        name: &str,
        configs: BTreeMap<String, String>,
        expected: Option<BTreeMap<String, String>>,
    ) -> CommandResult {
        validate_configs(&configs)?;
        let elr = self.elr_enabled();
        let topic = self.topics.get_mut(name).ok_or_else(|| MetadataError::UnknownTopic(name.to_string()))?;
        if expected.is_some_and(|expected| expected != topic.configs) {
            return Err(MetadataError::ConfigsChanged(name.to_string()));
        }
        topic.configs = configs;
        if let Some(min_insync) = ElectionRules::of(&topic.configs, elr).min_insync {
            // A lower min.insync.replicas may put the ISR at or above it: the ELR empties.
            for partition in &mut topic.partitions {
                let before = partition.clone();
                track_elr(partition, &[], min_insync);
                if *partition != before {
                    partition.partition_epoch += 1;
                }
            }
        }
        Ok(CommandOutput::Topic(topic.clone()))
    }

    fn alter_partition(
        &mut self,
        topic: &str,
        index: i32,
        leader_id: i32,
        leader_epoch: i32,
        partition_epoch: i32,
        new_isr: Vec<i32>,
    ) -> CommandResult {
        let partition = self.partition(topic, index).ok_or_else(|| unknown_partition(topic, index))?;
        if leader_epoch != partition.leader_epoch {
            return Err(MetadataError::StaleEpoch { given: leader_epoch, current: partition.leader_epoch });
        }
        if leader_id != partition.leader {
            return Err(MetadataError::NotLeader { given: leader_id, current: partition.leader });
        }
        if partition_epoch != partition.partition_epoch {
            return Err(MetadataError::InvalidUpdateVersion {
                given: partition_epoch,
                current: partition.partition_epoch,
            });
        }
        self.check_new_isr(partition, leader_id, &new_isr)?;
        let rules = ElectionRules::of(&self.topics[topic].configs, self.elr_enabled());
        let brokers = &self.brokers;
        let pending = self.reassignments.get(topic).and_then(|by_partition| by_partition.get(&index)).cloned();
        let partition = partition_mut(&mut self.topics, topic, index);
        let old_isr = std::mem::replace(&mut partition.isr, new_isr);
        if let Some(min_insync) = rules.min_insync {
            let left: Vec<i32> = old_isr.into_iter().filter(|replica| !partition.isr.contains(replica)).collect();
            track_elr(partition, &left, min_insync);
        }
        partition.partition_epoch += 1;
        if let Some(reassignment) = pending {
            if reassignment.target.iter().all(|replica| partition.isr.contains(replica)) {
                move_replicas(partition, reassignment.target, brokers);
                remove_reassignment(&mut self.reassignments, topic, index);
            }
        }
        let partition = self.partition(topic, index).expect("exists").clone();
        check_partition(&partition);
        Ok(CommandOutput::Partition(partition))
    }

    /// The ISR must hold the leader, only replicas, no duplicate, and no fenced broker that is
    /// not already in it (a fenced broker may stay, it cannot join).
    fn check_new_isr(&self, partition: &PartitionInfo, leader_id: i32, new_isr: &[i32]) -> Result<(), MetadataError> {
        let unique: BTreeSet<i32> = new_isr.iter().copied().collect();
        if unique.len() != new_isr.len() || !unique.contains(&leader_id) {
            return Err(MetadataError::InvalidRequest(format!("isr {new_isr:?} has duplicates or lacks the leader")));
        }
        for replica in new_isr {
            if !partition.replicas.contains(replica) {
                return Err(MetadataError::IneligibleReplica(format!("{replica} is not a replica")));
            }
            let fenced = self.brokers.get(replica).is_none_or(|broker| broker.fenced);
            if fenced && !partition.isr.contains(replica) {
                return Err(MetadataError::IneligibleReplica(format!("{replica} is fenced")));
            }
        }
        Ok(())
    }

    fn allocate_producer_ids(&mut self, count: i64) -> CommandResult {
        if !(1..=PRODUCER_ID_BLOCK_MAX).contains(&count) {
            return Err(MetadataError::InvalidRequest(format!(
                "producer id count {count}, must be 1..={PRODUCER_ID_BLOCK_MAX}"
            )));
        }
        let first = self.next_producer_id;
        self.next_producer_id = first
            .checked_add(count)
            .ok_or_else(|| MetadataError::LimitExceeded("producer ids exhausted".to_string()))?;
        assert!(self.next_producer_id > first);
        Ok(CommandOutput::ProducerIds { first })
    }

    /// Preferred: the first replica leads where it is in the ISR and unfenced. Otherwise (and in
    /// both cases) leaderless partitions get the first eligible ISR member, else the first
    /// eligible ELR member. Returns how many partitions changed leader.
    fn elect_leaders(&mut self, preferred: bool) -> usize {
        let elr = self.elr_enabled();
        let brokers = &self.brokers;
        let mut elected = 0;
        for topic in self.topics.values_mut() {
            let rules = ElectionRules::of(&topic.configs, elr);
            for partition in &mut topic.partitions {
                if partition.leader == NO_LEADER && first_eligible_in_isr(partition, brokers, None).is_none() {
                    if let (Some(min_insync), Some(leader)) =
                        (rules.min_insync, first_eligible_in_elr(partition, brokers))
                    {
                        lead_from_elr(partition, leader, min_insync);
                        elected += 1;
                    }
                    continue;
                }
                elected += usize::from(elect_in_isr(partition, brokers, preferred));
            }
        }
        elected
    }

    fn reassign(&mut self, topic: &str, index: i32, target: Option<Vec<i32>>) -> CommandResult {
        let partition = self.partition(topic, index).ok_or_else(|| unknown_partition(topic, index))?.clone();
        let pending = self.reassignments.get(topic).and_then(|by_partition| by_partition.get(&index)).cloned();
        let Some(target) = target else {
            let reassignment = pending.ok_or_else(|| MetadataError::NoReassignmentInProgress {
                topic: topic.to_string(),
                partition: index,
            })?;
            if !partition.isr.iter().any(|replica| reassignment.original.contains(replica)) {
                return Err(MetadataError::InvalidReplicaAssignment("no original replica is in the isr".to_string()));
            }
            let brokers = &self.brokers;
            move_replicas(partition_mut(&mut self.topics, topic, index), reassignment.original, brokers);
            remove_reassignment(&mut self.reassignments, topic, index);
            return Ok(CommandOutput::Partition(self.partition(topic, index).expect("exists").clone()));
        };
        self.check_target(&target)?;
        let original = pending.map_or(partition.replicas.clone(), |reassignment| reassignment.original);
        let mut replicas = target.clone();
        replicas.extend(original.iter().filter(|replica| !target.contains(replica)));
        let done = target.iter().all(|replica| partition.isr.contains(replica));
        let brokers = &self.brokers;
        let slot = partition_mut(&mut self.topics, topic, index);
        if done {
            move_replicas(slot, target, brokers);
            remove_reassignment(&mut self.reassignments, topic, index);
        } else {
            slot.replicas = replicas;
            slot.partition_epoch += 1;
            self.reassignments.entry(topic.to_string()).or_default().insert(index, Reassignment { target, original });
        }
        Ok(CommandOutput::Partition(self.partition(topic, index).expect("exists").clone()))
    }

    fn check_target(&self, target: &[i32]) -> Result<(), MetadataError> {
        let unique: BTreeSet<i32> = target.iter().copied().collect();
        let factor_max = usize::try_from(REPLICATION_FACTOR_MAX).expect("positive");
        if target.is_empty() || unique.len() != target.len() || target.len() > factor_max {
            return Err(MetadataError::InvalidReplicaAssignment(format!("{target:?}: empty, duplicated or too long")));
        }
        if let Some(unknown) = target.iter().find(|replica| !self.brokers.contains_key(replica)) {
            return Err(MetadataError::InvalidReplicaAssignment(format!("broker {unknown} is not registered")));
        }
        Ok(())
    }
}

/// ElectLeaders' choice among the ISR for one partition: whether its leader changed.
fn elect_in_isr(partition: &mut PartitionInfo, brokers: &BTreeMap<i32, BrokerInfo>, preferred: bool) -> bool {
    let preferred_leader = partition.replicas[0];
    let candidate = if preferred
        && partition.leader != preferred_leader
        && partition.isr.contains(&preferred_leader)
        && eligible(brokers, preferred_leader)
    {
        Some(preferred_leader)
    } else if partition.leader == NO_LEADER {
        first_eligible_in_isr(partition, brokers, None)
    } else {
        None
    };
    let Some(leader) = candidate else { return false };
    set_leader(partition, leader);
    true
}

/// A new partition, led by its first unfenced replica, with its unfenced replicas (in replica
/// order) as the ISR: Kafka's rule for a manual assignment naming a fenced broker. Placed
/// replicas are all unfenced, so there the first replica leads and all are in the ISR.
fn new_partition(replicas: Vec<i32>, brokers: &BTreeMap<i32, BrokerInfo>) -> PartitionInfo {
    let isr: Vec<i32> = replicas.iter().copied().filter(|&replica| eligible(brokers, replica)).collect();
    assert!(!isr.is_empty(), "checked by the caller: a new partition needs an unfenced replica");
    PartitionInfo {
        leader: isr[0],
        leader_epoch: 0,
        isr,
        replicas,
        partition_epoch: 0,
        elr: Vec::new(),
        last_known_elr: Vec::new(),
    }
}

fn check_partition_count(partitions: i32) -> Result<(), MetadataError> {
    if !(1..=PARTITIONS_PER_TOPIC_MAX).contains(&partitions) {
        return Err(MetadataError::InvalidPartitions(format!(
            "{partitions} partitions, must be 1..={PARTITIONS_PER_TOPIC_MAX}"
        )));
    }
    Ok(())
}

fn eligible(brokers: &BTreeMap<i32, BrokerInfo>, node_id: i32) -> bool {
    brokers.get(&node_id).is_some_and(|broker| !broker.fenced)
}

fn unclean_allowed(configs: &BTreeMap<String, String>) -> bool {
    configs.get(UNCLEAN_LEADER_ELECTION_CONFIG).is_some_and(|value| value.eq_ignore_ascii_case("true"))
}

/// A topic's `min.insync.replicas`, read as the brokers read it (at least 1; an unreadable
/// value is the default).
fn min_insync_replicas(configs: &BTreeMap<String, String>) -> usize {
    configs
        .get(MIN_INSYNC_REPLICAS_CONFIG)
        .and_then(|value| value.trim().parse::<i64>().ok())
        .and_then(|value| usize::try_from(value.max(1)).ok())
        .unwrap_or(MIN_INSYNC_REPLICAS_DEFAULT)
}

/// How one topic's partitions elect leaders.
#[derive(Clone, Copy, Debug)]
struct ElectionRules {
    /// `unclean.leader.election.enable`.
    unclean: bool,
    /// The topic's `min.insync.replicas` when partitions keep eligible leader replicas.
    min_insync: Option<usize>,
}

impl ElectionRules {
    fn of(configs: &BTreeMap<String, String>, elr: bool) -> ElectionRules {
        ElectionRules { unclean: unclean_allowed(configs), min_insync: elr.then(|| min_insync_replicas(configs)) }
    }
}

/// Restores the ELR rules after the ISR changed and `left` left it: below
/// `min.insync.replicas` (at most the replica count, as the leader counts it) those who left
/// join the ELR; at or above it the ELR is empty. ELR members back in the ISR leave the ELR.
fn track_elr(partition: &mut PartitionInfo, left: &[i32], min_insync: usize) {
    let PartitionInfo { isr, elr, last_known_elr, replicas, .. } = partition;
    if isr.len() >= min_insync.min(replicas.len()) {
        elr.clear();
        last_known_elr.clear();
        return;
    }
    for replica in left {
        if !elr.contains(replica) {
            elr.push(*replica);
        }
    }
    elr.retain(|replica| !isr.contains(replica) && replicas.contains(replica));
    elr.sort_unstable();
    last_known_elr.retain(|replica| !isr.contains(replica) && !elr.contains(replica));
}

/// `leader`, an unfenced ELR member, leads with itself as the ISR; the members of the old
/// ISR (fenced, or there would have been no need) keep their claim in the ELR.
fn lead_from_elr(partition: &mut PartitionInfo, leader: i32, min_insync: usize) {
    set_leader(partition, leader);
    let left = std::mem::replace(&mut partition.isr, vec![leader]);
    track_elr(partition, &left, min_insync);
}

/// `leader`, out of sync, leads with itself as the ISR (records may be lost). The ELR it
/// passed over is remembered as `last_known_elr`.
fn lead_unclean(partition: &mut PartitionInfo, leader: i32) {
    set_leader(partition, leader);
    partition.isr = vec![leader];
    for replica in std::mem::take(&mut partition.elr) {
        if replica != leader && !partition.last_known_elr.contains(&replica) {
            partition.last_known_elr.push(replica);
        }
    }
    partition.last_known_elr.sort_unstable();
}

/// The invariants every partition state keeps after a change.
fn check_partition(partition: &PartitionInfo) {
    assert!(partition.isr.iter().all(|replica| partition.replicas.contains(replica)), "{partition:?}");
    assert!(partition.elr.iter().all(|replica| partition.replicas.contains(replica)), "{partition:?}");
    assert!(partition.elr.iter().all(|replica| !partition.isr.contains(replica)), "{partition:?}");
    assert!(partition.leader == NO_LEADER || partition.isr.contains(&partition.leader), "{partition:?}");
    assert!(!partition.isr.is_empty() || !partition.elr.is_empty(), "an in-sync replica is remembered: {partition:?}");
}

fn set_leader(partition: &mut PartitionInfo, leader: i32) {
    assert_ne!(partition.leader, leader, "a leader change must change the leader");
    partition.leader = leader;
    partition.leader_epoch += 1;
    partition.partition_epoch += 1;
}

/// The first replica (in preference order) that is in the ISR, unfenced and not `excluded`.
fn first_eligible_in_isr(
    partition: &PartitionInfo,
    brokers: &BTreeMap<i32, BrokerInfo>,
    excluded: Option<i32>,
) -> Option<i32> {
    partition
        .replicas
        .iter()
        .copied()
        .find(|&replica| Some(replica) != excluded && partition.isr.contains(&replica) && eligible(brokers, replica))
}

/// The first replica (in preference order) that is in the ELR and unfenced.
fn first_eligible_in_elr(partition: &PartitionInfo, brokers: &BTreeMap<i32, BrokerInfo>) -> Option<i32> {
    partition.replicas.iter().copied().find(|&replica| partition.elr.contains(&replica) && eligible(brokers, replica))
}

/// The election rule for one partition when `fenced` (already marked fenced) goes away.
fn fence_in_partition(
    partition: &mut PartitionInfo,
    fenced: i32,
    brokers: &BTreeMap<i32, BrokerInfo>,
    rules: ElectionRules,
) {
    debug_assert!(!eligible(brokers, fenced));
    match rules.min_insync {
        Some(min_insync) => fence_with_elr(partition, fenced, brokers, rules.unclean, min_insync),
        None => fence_without_elr(partition, fenced, brokers, rules.unclean),
    }
    check_partition(partition);
}

/// With eligible leader replicas: `fenced` leaves the ISR even as its last member (the ELR
/// keeps its claim), and a leader comes from the ISR, else the ELR, else (unclean) anywhere.
fn fence_with_elr(
    partition: &mut PartitionInfo,
    fenced: i32,
    brokers: &BTreeMap<i32, BrokerInfo>,
    unclean: bool,
    min_insync: usize,
) {
    let led = partition.leader == fenced;
    if !led && !partition.isr.contains(&fenced) {
        return;
    }
    partition.isr.retain(|&replica| replica != fenced);
    track_elr(partition, &[fenced], min_insync);
    if !led {
        partition.partition_epoch += 1;
    } else if let Some(leader) = first_eligible_in_isr(partition, brokers, None) {
        set_leader(partition, leader);
    } else if let Some(leader) = first_eligible_in_elr(partition, brokers) {
        lead_from_elr(partition, leader, min_insync);
    } else if let Some(leader) = partition.replicas.iter().copied().find(|&r| unclean && eligible(brokers, r)) {
        lead_unclean(partition, leader);
    } else {
        set_leader(partition, NO_LEADER);
    }
}

/// Without eligible leader replicas: the last ISR member stays in the ISR when fenced, so
/// the partition remembers the one replica it may elect.
fn fence_without_elr(partition: &mut PartitionInfo, fenced: i32, brokers: &BTreeMap<i32, BrokerInfo>, unclean: bool) {
    if partition.leader == fenced {
        if let Some(leader) = first_eligible_in_isr(partition, brokers, Some(fenced)) {
            set_leader(partition, leader);
            partition.isr.retain(|&replica| replica != fenced);
        } else if let Some(leader) =
            partition.replicas.iter().copied().find(|&replica| unclean && eligible(brokers, replica))
        {
            lead_unclean(partition, leader);
        } else {
            // No in-sync replica can take over: stay leaderless and remember the ISR, so the
            // partition recovers when one of its members comes back.
            set_leader(partition, NO_LEADER);
        }
        assert!(!partition.isr.is_empty());
        return;
    }
    if partition.isr.contains(&fenced) && partition.isr.len() > 1 {
        partition.isr.retain(|&replica| replica != fenced);
        partition.partition_epoch += 1;
    }
}

/// Replaces the replica set (end or cancel of a reassignment): the ISR keeps only members of
/// the new set, and the leader moves if it is no longer a replica.
fn move_replicas(partition: &mut PartitionInfo, replicas: Vec<i32>, brokers: &BTreeMap<i32, BrokerInfo>) {
    let isr: Vec<i32> = partition.isr.iter().copied().filter(|replica| replicas.contains(replica)).collect();
    assert!(!isr.is_empty(), "checked by the caller");
    partition.elr.retain(|replica| replicas.contains(replica));
    partition.last_known_elr.retain(|replica| replicas.contains(replica));
    partition.replicas = replicas;
    partition.isr = isr;
    partition.partition_epoch += 1;
    if !partition.replicas.contains(&partition.leader) {
        let leader = first_eligible_in_isr(partition, brokers, None).unwrap_or(NO_LEADER);
        if leader != partition.leader {
            set_leader(partition, leader);
        }
    }
}

fn remove_reassignment(reassignments: &mut BTreeMap<String, BTreeMap<i32, Reassignment>>, topic: &str, index: i32) {
    if let Some(by_partition) = reassignments.get_mut(topic) {
        by_partition.remove(&index);
        if by_partition.is_empty() {
            reassignments.remove(topic);
        }
    }
}

fn partition_mut<'a>(topics: &'a mut BTreeMap<String, TopicInfo>, topic: &str, index: i32) -> &'a mut PartitionInfo {
    let index = usize::try_from(index).expect("checked by the caller");
    &mut topics.get_mut(topic).expect("checked by the caller").partitions[index]
}

fn unknown_partition(topic: &str, partition: i32) -> MetadataError {
    if partition >= 0 {
        MetadataError::UnknownPartition { topic: topic.to_string(), partition }
    } else {
        MetadataError::InvalidPartitions(format!("negative partition {partition}"))
    }
}

fn validate_topic_name(name: &str) -> Result<(), MetadataError> {
    let legal = name.bytes().all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-'));
    if name.is_empty() || name.len() > TOPIC_NAME_BYTES_MAX || name == "." || name == ".." || !legal {
        return Err(MetadataError::InvalidRequest(format!("illegal topic name {name:?}")));
    }
    Ok(())
}

fn validate_configs(configs: &BTreeMap<String, String>) -> Result<(), MetadataError> {
    if configs.len() > CONFIGS_PER_TOPIC_MAX {
        return Err(MetadataError::LimitExceeded(format!("more than {CONFIGS_PER_TOPIC_MAX} topic configs")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn broker(node_id: i32) -> BrokerInfo {
        BrokerInfo {
            node_id,
            host: "127.0.0.1".into(),
            port: 9092,
            rack: None,
            incarnation: 1,
            fenced: false,
            endpoints: vec![],
            metadata_version_max: 2,
        }
    }

    fn cluster(nodes: &[i32]) -> ClusterMetadata {
        let mut metadata = ClusterMetadata::default();
        for &node in nodes {
            metadata.apply(Command::RegisterBroker(broker(node))).unwrap();
        }
        metadata
    }

    fn create(metadata: &mut ClusterMetadata, name: &str, partitions: i32, factor: i16, seed: u64) -> CommandResult {
        metadata.apply(Command::CreateTopic {
            name: name.into(),
            topic_id: Uuid::new_v4(),
            partitions,
            replication_factor: factor,
            configs: BTreeMap::new(),
            placement_seed: seed,
            assignment: None,
        })
    }

    /// CreateTopic with a manual replica assignment, as the controller proposes it.
    fn create_assigned(metadata: &mut ClusterMetadata, name: &str, assignment: &[&[i32]]) -> CommandResult {
        metadata.apply(Command::CreateTopic {
            name: name.into(),
            topic_id: Uuid::new_v4(),
            partitions: -1,
            replication_factor: -1,
            configs: BTreeMap::new(),
            placement_seed: 0,
            assignment: Some(assignment.iter().map(|replicas| replicas.to_vec()).collect()),
        })
    }

    /// (replicas, leader, isr, leader epoch, partition epoch) of one partition.
    type Layout = (Vec<i32>, i32, Vec<i32>, i32, i32);

    /// The [`Layout`] of every partition of `topic`.
    fn layout(metadata: &ClusterMetadata, topic: &str) -> Vec<Layout> {
        let partitions = &metadata.topics[topic].partitions;
        partitions
            .iter()
            .map(|p| (p.replicas.clone(), p.leader, p.isr.clone(), p.leader_epoch, p.partition_epoch))
            .collect()
    }

    /// Sets one partition's state directly (tests only).
    fn with_partition(metadata: &mut ClusterMetadata, replicas: &[i32], leader: i32, isr: &[i32]) {
        create(metadata, "t", 1, 1, 0).unwrap();
        let partition = &mut metadata.topics.get_mut("t").unwrap().partitions[0];
        *partition = PartitionInfo {
            replicas: replicas.to_vec(),
            leader,
            leader_epoch: 5,
            isr: isr.to_vec(),
            partition_epoch: 10,
            elr: vec![],
            last_known_elr: vec![],
        };
    }

    /// Applies `command` to a partition state and checks (leader, leader_epoch, isr, partition_epoch).
    fn check(
        nodes: &[i32],
        fenced: &[i32],
        replicas: &[i32],
        leader: i32,
        isr: &[i32],
        command: Command,
        expected: (i32, i32, &[i32], i32),
    ) {
        let mut metadata = cluster(nodes);
        with_partition(&mut metadata, replicas, leader, isr);
        for &node in fenced {
            metadata.brokers.get_mut(&node).unwrap().fenced = true;
        }
        metadata.apply(command).unwrap();
        let partition = metadata.partition("t", 0).unwrap();
        assert_eq!(
            (partition.leader, partition.leader_epoch, partition.isr.as_slice(), partition.partition_epoch),
            expected
        );
    }

    #[test]
    fn fencing_the_leader_elects_the_next_isr_member() {
        check(&[1, 2, 3], &[], &[1, 2, 3], 1, &[1, 2, 3], Command::FenceBroker { node_id: 1 }, (2, 6, &[2, 3], 11));
        // Replica order decides, and a fenced ISR member is skipped.
        check(&[1, 2, 3], &[2], &[1, 2, 3], 1, &[1, 3, 2], Command::FenceBroker { node_id: 1 }, (3, 6, &[3, 2], 11));
        // A replica outside the ISR is never elected.
        check(&[1, 2, 3], &[], &[1, 2, 3], 1, &[1, 3], Command::FenceBroker { node_id: 1 }, (3, 6, &[3], 11));
    }

    #[test]
    fn fencing_the_last_isr_member_leaves_the_partition_leaderless() {
        check(&[1, 2, 3], &[], &[1, 2, 3], 1, &[1], Command::FenceBroker { node_id: 1 }, (NO_LEADER, 6, &[1], 11));
    }

    #[test]
    fn fencing_a_follower_removes_it_from_the_isr() {
        check(&[1, 2, 3], &[], &[1, 2, 3], 1, &[1, 2, 3], Command::FenceBroker { node_id: 2 }, (1, 5, &[1, 3], 11));
        check(&[1, 2, 3], &[], &[1, 2, 3], 1, &[1, 3], Command::FenceBroker { node_id: 2 }, (1, 5, &[1, 3], 10));
    }

    #[test]
    fn unfencing_the_last_isr_member_makes_it_leader_again() {
        let mut metadata = cluster(&[1, 2, 3]);
        with_partition(&mut metadata, &[1, 2], 1, &[1]);
        metadata.apply(Command::FenceBroker { node_id: 1 }).unwrap();
        assert_eq!(metadata.partition("t", 0).unwrap().leader, NO_LEADER);
        // Another replica coming back does not help: it is not in the ISR.
        metadata.apply(Command::FenceBroker { node_id: 2 }).unwrap();
        metadata.apply(Command::UnfenceBroker { node_id: 2 }).unwrap();
        assert_eq!(metadata.partition("t", 0).unwrap().leader, NO_LEADER);
        metadata.apply(Command::UnfenceBroker { node_id: 1 }).unwrap();
        let partition = metadata.partition("t", 0).unwrap();
        assert_eq!((partition.leader, partition.leader_epoch, partition.isr.as_slice()), (1, 7, &[1][..]));
        // Registering a new incarnation of a fenced broker unfences it the same way.
        metadata.apply(Command::FenceBroker { node_id: 1 }).unwrap();
        metadata.apply(Command::RegisterBroker(BrokerInfo { incarnation: 2, ..broker(1) })).unwrap();
        assert_eq!(metadata.partition("t", 0).unwrap().leader, 1);
    }

    #[test]
    fn a_new_incarnation_of_a_live_broker_is_fenced_first() {
        let mut metadata = cluster(&[1, 2, 3]);
        with_partition(&mut metadata, &[1, 2, 3], 1, &[1, 2, 3]);
        // The same incarnation again changes nothing.
        metadata.apply(Command::RegisterBroker(broker(1))).unwrap();
        assert_eq!(metadata.partition("t", 0).unwrap().leader_epoch, 5);
        metadata.apply(Command::RegisterBroker(BrokerInfo { incarnation: 2, ..broker(1) })).unwrap();
        let partition = metadata.partition("t", 0).unwrap();
        assert_eq!((partition.leader, partition.leader_epoch, partition.isr.as_slice()), (2, 6, &[2, 3][..]));
        assert!(!metadata.brokers[&1].fenced);
        assert_eq!(metadata.brokers[&1].incarnation, 2);
        // As the last ISR member it goes leaderless and straight back to itself, two epochs on.
        let mut metadata = cluster(&[1, 2]);
        with_partition(&mut metadata, &[1, 2], 1, &[1]);
        metadata.apply(Command::RegisterBroker(BrokerInfo { incarnation: 2, ..broker(1) })).unwrap();
        let partition = metadata.partition("t", 0).unwrap();
        assert_eq!((partition.leader, partition.leader_epoch, partition.isr.as_slice()), (1, 7, &[1][..]));
    }

    #[test]
    fn config_compare_and_set_refuses_a_change_computed_from_stale_overrides() {
        let mut metadata = cluster(&[1, 2]);
        with_partition(&mut metadata, &[1, 2], 1, &[1, 2]);
        let set = |key: &str| BTreeMap::from([(key.to_string(), "1000".to_string())]);
        let alter = |configs, expected| Command::AlterTopicConfigs { name: "t".into(), configs, expected };
        // Two nodes both computed their change from the empty overrides: the second loses.
        metadata.apply(alter(set("retention.ms"), Some(BTreeMap::new()))).unwrap();
        let refused = metadata.apply(alter(set("segment.ms"), Some(BTreeMap::new()))).unwrap_err();
        assert!(matches!(refused, MetadataError::ConfigsChanged(_)), "{refused:?}");
        assert_eq!(metadata.topics["t"].configs, set("retention.ms"));
        // Recomputed from the current overrides, it applies; a full replacement needs none.
        let mut both = set("retention.ms");
        both.extend(set("segment.ms"));
        metadata.apply(alter(both.clone(), Some(set("retention.ms")))).unwrap();
        assert_eq!(metadata.topics["t"].configs, both);
        metadata.apply(alter(set("segment.ms"), None)).unwrap();
        assert_eq!(metadata.topics["t"].configs, set("segment.ms"));
    }

    /// A cluster at `metadata.version` [`METADATA_VERSION_ELR`] with topic "t" in the given
    /// state and `min.insync.replicas` set.
    fn elr_partition(nodes: &[i32], replicas: &[i32], leader: i32, isr: &[i32], min_insync: &str) -> ClusterMetadata {
        let mut metadata = cluster(nodes);
        metadata.apply(Command::FinalizeMetadataVersion { version: METADATA_VERSION_ELR }).unwrap();
        with_partition(&mut metadata, replicas, leader, isr);
        let configs = &mut metadata.topics.get_mut("t").unwrap().configs;
        configs.insert(MIN_INSYNC_REPLICAS_CONFIG.into(), min_insync.into());
        metadata
    }

    /// (leader, isr, elr, last known elr) of partition t-0.
    fn elr_state(metadata: &ClusterMetadata) -> (i32, Vec<i32>, Vec<i32>, Vec<i32>) {
        let p = metadata.partition("t", 0).unwrap();
        (p.leader, p.isr.clone(), p.elr.clone(), p.last_known_elr.clone())
    }

    fn alter_isr(metadata: &mut ClusterMetadata, new_isr: &[i32]) -> CommandResult {
        let p = metadata.partition("t", 0).unwrap().clone();
        metadata.apply(Command::AlterPartition {
            topic: "t".into(),
            partition: 0,
            leader_id: p.leader,
            leader_epoch: p.leader_epoch,
            partition_epoch: p.partition_epoch,
            new_isr: new_isr.to_vec(),
        })
    }

    #[test]
    fn fenced_replicas_join_the_elr_below_min_insync_and_one_of_them_leads_when_back() {
        let mut metadata = elr_partition(&[1, 2, 3], &[1, 2, 3], 1, &[1, 2, 3], "2");
        // At min.insync.replicas the ISR is still enough: no ELR.
        metadata.apply(Command::FenceBroker { node_id: 3 }).unwrap();
        assert_eq!(elr_state(&metadata), (1, vec![1, 2], vec![], vec![]));
        metadata.apply(Command::FenceBroker { node_id: 2 }).unwrap();
        assert_eq!(elr_state(&metadata), (1, vec![1], vec![2], vec![]));
        // The last ISR member leaves the ISR too: the ELR remembers both.
        metadata.apply(Command::FenceBroker { node_id: 1 }).unwrap();
        assert_eq!(elr_state(&metadata), (NO_LEADER, vec![], vec![1, 2], vec![]));
        // A replica that left at min.insync.replicas is not eligible.
        metadata.apply(Command::UnfenceBroker { node_id: 3 }).unwrap();
        assert_eq!(elr_state(&metadata), (NO_LEADER, vec![], vec![1, 2], vec![]));
        metadata.apply(Command::UnfenceBroker { node_id: 2 }).unwrap();
        assert_eq!(elr_state(&metadata), (2, vec![2], vec![1], vec![]));
        let partition = metadata.partition("t", 0).unwrap();
        assert_eq!((partition.leader_epoch, partition.partition_epoch), (7, 14));
        // Back at min.insync.replicas, the ELR empties.
        alter_isr(&mut metadata, &[2, 3]).unwrap();
        assert_eq!(elr_state(&metadata), (2, vec![2, 3], vec![], vec![]));
    }

    #[test]
    fn an_unfenced_elr_member_takes_over_from_a_fenced_last_isr_member() {
        let mut metadata = elr_partition(&[1, 2, 3], &[1, 2, 3], 1, &[1, 2], "2");
        alter_isr(&mut metadata, &[1]).unwrap();
        assert_eq!(elr_state(&metadata), (1, vec![1], vec![2], vec![]));
        metadata.apply(Command::FenceBroker { node_id: 1 }).unwrap();
        assert_eq!(elr_state(&metadata), (2, vec![2], vec![1], vec![]));
        assert_eq!(metadata.partition("t", 0).unwrap().leader_epoch, 6);
    }

    #[test]
    fn isr_changes_from_the_leader_keep_the_elr() {
        let mut metadata = elr_partition(&[1, 2, 3], &[1, 2, 3], 1, &[1, 2, 3], "3");
        alter_isr(&mut metadata, &[1]).unwrap();
        assert_eq!(elr_state(&metadata), (1, vec![1], vec![2, 3], vec![]));
        // A replica back in the ISR leaves the ELR; the other keeps its place.
        alter_isr(&mut metadata, &[1, 2]).unwrap();
        assert_eq!(elr_state(&metadata), (1, vec![1, 2], vec![3], vec![]));
        alter_isr(&mut metadata, &[1, 2, 3]).unwrap();
        assert_eq!(elr_state(&metadata), (1, vec![1, 2, 3], vec![], vec![]));
        // min.insync.replicas above the replica count counts as the replica count.
        let mut metadata = elr_partition(&[1, 2], &[1, 2], 1, &[1, 2], "5");
        alter_isr(&mut metadata, &[1]).unwrap();
        assert_eq!(elr_state(&metadata), (1, vec![1], vec![2], vec![]));
    }

    #[test]
    fn unclean_election_comes_after_the_elr_and_empties_it_into_last_known_elr() {
        let mut metadata = elr_partition(&[1, 2, 3], &[1, 2, 3], 1, &[1, 2], "2");
        let configs = &mut metadata.topics.get_mut("t").unwrap().configs;
        configs.insert(UNCLEAN_LEADER_ELECTION_CONFIG.into(), "true".into());
        alter_isr(&mut metadata, &[1]).unwrap();
        metadata.apply(Command::FenceBroker { node_id: 2 }).unwrap();
        assert_eq!(elr_state(&metadata), (1, vec![1], vec![2], vec![]), "a fenced ELR member keeps its place");
        metadata.apply(Command::FenceBroker { node_id: 1 }).unwrap();
        assert_eq!(elr_state(&metadata), (3, vec![3], vec![], vec![1, 2]));
        alter_isr(&mut metadata, &[1, 3]).unwrap_err();
        metadata.apply(Command::UnfenceBroker { node_id: 1 }).unwrap();
        alter_isr(&mut metadata, &[1, 3]).unwrap();
        assert_eq!(elr_state(&metadata), (3, vec![1, 3], vec![], vec![]));
    }

    #[test]
    fn a_lower_min_insync_empties_the_elr() {
        let mut metadata = elr_partition(&[1, 2, 3], &[1, 2, 3], 1, &[1, 2], "2");
        alter_isr(&mut metadata, &[1]).unwrap();
        let epoch = metadata.partition("t", 0).unwrap().partition_epoch;
        let configs = BTreeMap::from([(MIN_INSYNC_REPLICAS_CONFIG.to_string(), "1".to_string())]);
        metadata.apply(Command::AlterTopicConfigs { name: "t".into(), configs, expected: None }).unwrap();
        assert_eq!(elr_state(&metadata), (1, vec![1], vec![], vec![]));
        assert_eq!(metadata.partition("t", 0).unwrap().partition_epoch, epoch + 1);
    }

    #[test]
    fn elect_leaders_elects_an_unfenced_elr_member_of_a_leaderless_partition() {
        let mut metadata = elr_partition(&[1, 2, 3], &[1, 2, 3], NO_LEADER, &[], "2");
        metadata.topics.get_mut("t").unwrap().partitions[0].elr = vec![1, 3];
        metadata.brokers.get_mut(&1).unwrap().fenced = true;
        assert_eq!(metadata.apply(Command::ElectLeaders { preferred: false }), Ok(CommandOutput::Elected(1)));
        assert_eq!(elr_state(&metadata), (3, vec![3], vec![1], vec![]));
    }

    #[test]
    fn before_metadata_version_5_the_last_isr_member_stays_and_no_elr_is_kept() {
        let mut metadata = cluster(&[1, 2, 3]);
        metadata.apply(Command::FinalizeMetadataVersion { version: METADATA_VERSION_ELR - 1 }).unwrap();
        with_partition(&mut metadata, &[1, 2, 3], 1, &[1, 2, 3]);
        let configs = &mut metadata.topics.get_mut("t").unwrap().configs;
        configs.insert(MIN_INSYNC_REPLICAS_CONFIG.into(), "2".into());
        for node_id in [3, 2, 1] {
            metadata.apply(Command::FenceBroker { node_id }).unwrap();
        }
        assert_eq!(elr_state(&metadata), (NO_LEADER, vec![1], vec![], vec![]));
        metadata.apply(Command::UnfenceBroker { node_id: 2 }).unwrap();
        assert_eq!(elr_state(&metadata), (NO_LEADER, vec![1], vec![], vec![]));
        let json = serde_json::to_string(&metadata).unwrap();
        assert!(!json.contains("elr"), "the state serializes as older nodes wrote it: {json}");
    }

    #[test]
    fn partitions_written_before_the_elr_still_decode() {
        let old = r#"{"replicas":[1,2],"leader":1,"leader_epoch":3,"isr":[1],"partition_epoch":4}"#;
        let partition: PartitionInfo = serde_json::from_str(old).unwrap();
        assert_eq!((partition.elr, partition.last_known_elr), (vec![], vec![]));
    }

    #[test]
    fn unclean_election_takes_any_unfenced_replica_when_allowed() {
        let mut metadata = cluster(&[1, 2]);
        with_partition(&mut metadata, &[1, 2], 1, &[1]);
        let configs = BTreeMap::from([(UNCLEAN_LEADER_ELECTION_CONFIG.to_string(), "true".to_string())]);
        metadata.apply(Command::AlterTopicConfigs { name: "t".into(), configs, expected: None }).unwrap();
        metadata.apply(Command::FenceBroker { node_id: 1 }).unwrap();
        let partition = metadata.partition("t", 0).unwrap();
        assert_eq!((partition.leader, partition.isr.as_slice()), (2, &[2][..]));
    }

    #[test]
    fn placement_spreads_leaders_and_replicas() {
        let mut metadata = cluster(&[1, 2, 3]);
        let CommandOutput::Topic(topic) = create(&mut metadata, "t", 6, 3, 12345).unwrap() else { panic!() };
        let mut leaders = BTreeMap::<i32, usize>::new();
        for partition in &topic.partitions {
            assert_eq!(partition.replicas.iter().collect::<BTreeSet<_>>().len(), 3);
            assert_eq!((partition.leader, &partition.isr), (partition.replicas[0], &partition.replicas));
            *leaders.entry(partition.leader).or_default() += 1;
        }
        assert_eq!(leaders.values().copied().collect::<Vec<_>>(), vec![2, 2, 2]);
        // RF 2 over 5 brokers: every broker holds 2 * 10 / 5 = 4 replicas.
        let mut metadata = cluster(&[1, 2, 3, 4, 5]);
        let CommandOutput::Topic(topic) = create(&mut metadata, "u", 10, 2, 7 << 32 | 3).unwrap() else { panic!() };
        let mut load = BTreeMap::<i32, usize>::new();
        for replica in topic.partitions.iter().flat_map(|partition| &partition.replicas) {
            *load.entry(*replica).or_default() += 1;
        }
        assert_eq!(load.values().copied().collect::<Vec<_>>(), vec![4; 5]);
    }

    #[test]
    fn create_topic_refusals() {
        let mut metadata = cluster(&[1, 2, 3]);
        metadata.apply(Command::FenceBroker { node_id: 3 }).unwrap();
        assert!(matches!(create(&mut metadata, "t", 1, 3, 0), Err(MetadataError::InvalidReplicationFactor(_))));
        assert!(matches!(create(&mut metadata, "t", 0, 1, 0), Err(MetadataError::InvalidPartitions(_))));
        assert!(matches!(create(&mut metadata, "bad/name", 1, 1, 0), Err(MetadataError::InvalidRequest(_))));
        create(&mut metadata, "t", 1, 2, 0).unwrap();
        let before = metadata.clone();
        assert_eq!(create(&mut metadata, "t", 1, 1, 0), Err(MetadataError::TopicAlreadyExists("t".into())));
        assert_eq!(metadata, before, "a refused command changes nothing");
    }

    #[test]
    fn alter_partition_checks_epochs_and_isr() {
        let mut metadata = cluster(&[1, 2, 3]);
        with_partition(&mut metadata, &[1, 2, 3], 1, &[1, 2, 3]);
        let alter = |leader_id, leader_epoch, partition_epoch, new_isr: &[i32]| Command::AlterPartition {
            topic: "t".into(),
            partition: 0,
            leader_id,
            leader_epoch,
            partition_epoch,
            new_isr: new_isr.to_vec(),
        };
        assert_eq!(metadata.apply(alter(1, 4, 10, &[1])), Err(MetadataError::StaleEpoch { given: 4, current: 5 }));
        assert_eq!(
            metadata.apply(alter(1, 5, 9, &[1])),
            Err(MetadataError::InvalidUpdateVersion { given: 9, current: 10 })
        );
        assert_eq!(metadata.apply(alter(2, 5, 10, &[1])), Err(MetadataError::NotLeader { given: 2, current: 1 }));
        assert!(matches!(metadata.apply(alter(1, 5, 10, &[2, 3])), Err(MetadataError::InvalidRequest(_))));
        // Shrink to the leader alone, then grow back.
        metadata.apply(alter(1, 5, 10, &[1])).unwrap();
        assert!(matches!(metadata.apply(alter(1, 5, 11, &[1, 4])), Err(MetadataError::IneligibleReplica(_))));
        metadata.apply(Command::FenceBroker { node_id: 3 }).unwrap();
        assert!(matches!(metadata.apply(alter(1, 5, 11, &[1, 3])), Err(MetadataError::IneligibleReplica(_))));
        let CommandOutput::Partition(partition) = metadata.apply(alter(1, 5, 11, &[1, 2])).unwrap() else { panic!() };
        assert_eq!((partition.isr, partition.partition_epoch), (vec![1, 2], 12));
    }

    #[test]
    fn only_the_current_leader_sets_a_remote_log_and_it_goes_with_its_topic() {
        let mut metadata = cluster(&[1, 2, 3]);
        with_partition(&mut metadata, &[1, 2, 3], 1, &[1, 2, 3]);
        let topic_id = metadata.topics["t"].topic_id;
        let segment = RemoteLogSegment {
            id: Uuid::new_v4(),
            base_offset: 0,
            end_offset: 100,
            max_timestamp: 7,
            size_bytes: 4096,
            leader_epochs: vec![(5, 0)],
            has_producer_snapshot: true,
            has_aborted_transactions: false,
        };
        let remote_log = RemoteLog { start_offset: 0, segments: BTreeMap::from([(0, segment.clone())]) };
        let set = |leader_id, leader_epoch, remote_log: &RemoteLog| Command::SetRemoteLog {
            topic: "t".into(),
            partition: 0,
            leader_id,
            leader_epoch,
            remote_log: remote_log.clone(),
        };
        assert_eq!(
            metadata.apply(set(1, 5, &remote_log)),
            Err(MetadataError::UnsupportedMetadataVersion { required: 4, finalized: 1 }),
            "refused until every node understands it"
        );
        metadata.apply(Command::FinalizeMetadataVersion { version: METADATA_VERSION_LATEST }).unwrap();
        assert_eq!(metadata.apply(set(1, 4, &remote_log)), Err(MetadataError::StaleEpoch { given: 4, current: 5 }));
        assert_eq!(metadata.apply(set(2, 5, &remote_log)), Err(MetadataError::NotLeader { given: 2, current: 1 }));
        let misplaced = RemoteLog { start_offset: 0, segments: BTreeMap::from([(50, segment)]) };
        assert!(matches!(metadata.apply(set(1, 5, &misplaced)), Err(MetadataError::InvalidRequest(_))));
        assert!(metadata.remote_log(&topic_id, 0).is_none(), "refused commands change nothing");
        metadata.apply(set(1, 5, &remote_log)).unwrap();
        assert_eq!(metadata.remote_log(&topic_id, 0).and_then(RemoteLog::range), Some((0, 100)));
        assert_eq!(set(1, 5, &remote_log).required_metadata_version(), 4);
        metadata.apply(Command::DeleteTopic { name: "t".into() }).unwrap();
        assert!(metadata.remote_logs.is_empty(), "a deleted topic's remote log metadata stays behind");
    }

    #[test]
    fn preferred_election_moves_leadership_back() {
        let mut metadata = cluster(&[1, 2, 3]);
        with_partition(&mut metadata, &[1, 2, 3], 2, &[2, 3, 1]);
        metadata.brokers.get_mut(&1).unwrap().fenced = true;
        assert_eq!(metadata.apply(Command::ElectLeaders { preferred: true }), Ok(CommandOutput::Elected(0)));
        metadata.brokers.get_mut(&1).unwrap().fenced = false;
        assert_eq!(metadata.apply(Command::ElectLeaders { preferred: true }), Ok(CommandOutput::Elected(1)));
        assert_eq!(metadata.partition("t", 0).unwrap().leader, 1);
        assert_eq!(metadata.apply(Command::ElectLeaders { preferred: true }), Ok(CommandOutput::Elected(0)));
    }

    #[test]
    fn reassignment_completes_when_the_target_is_in_sync() {
        let mut metadata = cluster(&[1, 2, 3, 4]);
        with_partition(&mut metadata, &[1, 2], 1, &[1, 2]);
        let reassign = |target: Option<Vec<i32>>| Command::Reassign { topic: "t".into(), partition: 0, target };
        metadata.apply(reassign(Some(vec![3, 4]))).unwrap();
        assert_eq!(metadata.partition("t", 0).unwrap().replicas, vec![3, 4, 1, 2]);
        let alter = |partition_epoch, new_isr: Vec<i32>| Command::AlterPartition {
            topic: "t".into(),
            partition: 0,
            leader_id: 1,
            leader_epoch: 5,
            partition_epoch,
            new_isr,
        };
        metadata.apply(alter(11, vec![1, 2, 3, 4])).unwrap();
        let partition = metadata.partition("t", 0).unwrap();
        assert_eq!((&partition.replicas, partition.leader, &partition.isr), (&vec![3, 4], 3, &vec![3, 4]));
        assert!(metadata.reassignments.is_empty());
        assert!(matches!(metadata.apply(reassign(None)), Err(MetadataError::NoReassignmentInProgress { .. })));
        // Cancel restores the original replicas.
        metadata.apply(reassign(Some(vec![1, 2]))).unwrap();
        metadata.apply(reassign(None)).unwrap();
        assert_eq!(metadata.partition("t", 0).unwrap().replicas, vec![3, 4]);
    }

    #[test]
    fn producer_ids_are_handed_out_once() {
        let mut metadata = ClusterMetadata::default();
        assert_eq!(
            metadata.apply(Command::AllocateProducerIds { count: 1000 }),
            Ok(CommandOutput::ProducerIds { first: 0 })
        );
        assert_eq!(
            metadata.apply(Command::AllocateProducerIds { count: 10 }),
            Ok(CommandOutput::ProducerIds { first: 1000 })
        );
        assert!(metadata.apply(Command::AllocateProducerIds { count: 0 }).is_err());
    }

    #[test]
    fn create_partitions_grows_only() {
        let mut metadata = cluster(&[1, 2, 3]);
        create(&mut metadata, "t", 2, 2, 0).unwrap();
        let grow = |total| Command::CreatePartitions { name: "t".into(), total, placement_seed: 1, assignment: None };
        assert!(matches!(metadata.apply(grow(2)), Err(MetadataError::InvalidPartitions(_))));
        metadata.apply(grow(5)).unwrap();
        assert!(metadata.topics["t"].partitions.iter().all(|partition| partition.replicas.len() == 2));
        assert_eq!(metadata.topics["t"].partitions.len(), 5);
    }

    #[test]
    fn manual_assignment_places_replicas_as_given() {
        let mut metadata = cluster(&[1, 2, 3]);
        let CommandOutput::Topic(topic) = create_assigned(&mut metadata, "t", &[&[2, 3], &[3, 1]]).unwrap() else {
            panic!()
        };
        assert_eq!(topic, metadata.topics["t"]);
        assert_eq!(layout(&metadata, "t"), vec![(vec![2, 3], 2, vec![2, 3], 0, 0), (vec![3, 1], 3, vec![3, 1], 0, 0)]);
        // A fenced broker may be named: the first unfenced replica leads, the ISR is the
        // unfenced replicas, and the fenced one joins when its leader adds it back.
        metadata.apply(Command::FenceBroker { node_id: 3 }).unwrap();
        create_assigned(&mut metadata, "u", &[&[3, 1], &[1, 3]]).unwrap();
        assert_eq!(layout(&metadata, "u"), vec![(vec![3, 1], 1, vec![1], 0, 0), (vec![1, 3], 1, vec![1], 0, 0)]);
        metadata.apply(Command::UnfenceBroker { node_id: 3 }).unwrap();
        assert_eq!(metadata.partition("u", 0).unwrap().leader, 1, "an unfenced broker outside the ISR does not lead");
    }

    #[test]
    fn manual_assignment_refusals() {
        let mut metadata = cluster(&[1, 2, 3]);
        metadata.apply(Command::FenceBroker { node_id: 3 }).unwrap();
        let before = metadata.clone();
        let refused = |metadata: &mut ClusterMetadata, assignment: &[&[i32]]| {
            let error = create_assigned(metadata, "t", assignment).unwrap_err();
            assert!(matches!(error, MetadataError::InvalidReplicaAssignment(_)), "{assignment:?}: {error:?}");
            error.to_string()
        };
        assert!(refused(&mut metadata, &[&[1, 2], &[]]).starts_with("invalid replica assignment: partition 1:"));
        assert!(refused(&mut metadata, &[&[1, 2, 1]]).contains("twice"));
        assert!(refused(&mut metadata, &[&[1, 9]]).contains("broker 9 is not registered"));
        assert!(refused(&mut metadata, &[&[1, 2], &[2]]).contains("1 replicas, but the topic's partitions have 2"));
        assert!(refused(&mut metadata, &[&[1], &[3]]).contains("fenced"));
        assert!(refused(&mut metadata, &[&[1; 17]]).contains("17 replicas"));
        let mut manual_with_counts = |partitions, replication_factor| {
            metadata.apply(Command::CreateTopic {
                name: "t".into(),
                topic_id: Uuid::new_v4(),
                partitions,
                replication_factor,
                configs: BTreeMap::new(),
                placement_seed: 0,
                assignment: Some(vec![vec![1]]),
            })
        };
        assert!(matches!(manual_with_counts(1, -1), Err(MetadataError::InvalidRequest(_))));
        assert!(matches!(manual_with_counts(-1, 1), Err(MetadataError::InvalidRequest(_))));
        assert!(matches!(create_assigned(&mut metadata, "t", &[]), Err(MetadataError::InvalidPartitions(_))));
        assert_eq!(metadata, before, "a refused command changes nothing");
        // The same checks answer a validate-only request, and accept what apply accepts.
        let assignment = [vec![2, 3]];
        assert!(metadata.check_create_topic("t", -1, -1, &BTreeMap::new(), Some(&assignment)).is_ok());
        assert!(metadata.check_create_topic("t", -1, -1, &BTreeMap::new(), Some(&[vec![3, 9]])).is_err());
        assert!(metadata.check_create_topic("t", 1, 3, &BTreeMap::new(), None).is_err(), "two unfenced brokers");
    }

    #[test]
    fn create_partitions_with_manual_assignment() {
        let mut metadata = cluster(&[1, 2, 3]);
        create_assigned(&mut metadata, "t", &[&[1, 2]]).unwrap();
        let grow = |total, assignment: &[&[i32]]| Command::CreatePartitions {
            name: "t".into(),
            total,
            placement_seed: 1,
            assignment: Some(assignment.iter().map(|replicas| replicas.to_vec()).collect()),
        };
        let before = metadata.clone();
        for (command, expected) in [
            (grow(3, &[&[2, 3]]), "2 partitions are added but 1 replica lists were given"),
            (grow(2, &[&[2, 3, 1]]), "partition 1: 3 replicas, but the topic's partitions have 2"),
            (grow(3, &[&[2, 3], &[3, 3]]), "partition 2: replicas [3, 3] name a broker twice"),
            (grow(2, &[&[4, 1]]), "partition 1: broker 4 is not registered"),
        ] {
            let error = metadata.apply(command).unwrap_err();
            assert!(matches!(&error, MetadataError::InvalidReplicaAssignment(why) if why == expected), "{error}");
        }
        assert!(matches!(metadata.apply(grow(1, &[])), Err(MetadataError::InvalidPartitions(_))));
        assert_eq!(metadata, before, "a refused command changes nothing");
        assert!(metadata.check_create_partitions("t", 3, Some(&[vec![3, 1], vec![2, 1]])).is_ok());
        metadata.apply(grow(3, &[&[3, 1], &[2, 1]])).unwrap();
        assert_eq!(
            layout(&metadata, "t"),
            vec![
                (vec![1, 2], 1, vec![1, 2], 0, 0),
                (vec![3, 1], 3, vec![3, 1], 0, 0),
                (vec![2, 1], 2, vec![2, 1], 0, 0)
            ]
        );
    }

    #[test]
    fn commands_written_before_manual_assignment_still_decode() {
        let create = r#"{"CreateTopic":{"name":"t","topic_id":"5f0c7e4e-1b7a-4f0e-9d7c-3a2b1c0d9e8f","partitions":2,
            "replication_factor":1,"configs":{},"placement_seed":7}}"#;
        let Command::CreateTopic { partitions, assignment, .. } = serde_json::from_str(create).unwrap() else {
            panic!()
        };
        assert_eq!((partitions, assignment), (2, None));
        let grow = r#"{"CreatePartitions":{"name":"t","total":4,"placement_seed":7}}"#;
        let Command::CreatePartitions { total, assignment, .. } = serde_json::from_str(grow).unwrap() else { panic!() };
        assert_eq!((total, assignment), (4, None));
    }

    #[test]
    fn metadata_round_trips_through_json() {
        let mut metadata = cluster(&[1, 2, 3]);
        create(&mut metadata, "t", 3, 2, 0).unwrap();
        metadata.apply(Command::Reassign { topic: "t".into(), partition: 0, target: Some(vec![3]) }).ok();
        let json = serde_json::to_vec(&metadata).unwrap();
        assert_eq!(serde_json::from_slice::<ClusterMetadata>(&json).unwrap(), metadata);
    }

    #[test]
    fn newer_commands_wait_for_the_finalized_metadata_version() {
        let mut metadata = ClusterMetadata::default();
        assert_eq!(metadata.metadata_version(), METADATA_VERSION_INITIAL);
        let acl = AclBinding {
            resource_type: 2,
            resource_name: "t".into(),
            pattern_type: 3,
            principal: "User:a".into(),
            host: "*".into(),
            operation: 3,
            permission_type: 3,
        };
        let alter = || Command::AlterAcls { create: vec![acl.clone()], delete: vec![] };
        assert_eq!(
            metadata.apply(alter()),
            Err(MetadataError::UnsupportedMetadataVersion { required: 2, finalized: 1 })
        );
        assert!(metadata.acls.is_empty(), "a refused command changes nothing");
        metadata.apply(Command::FinalizeMetadataVersion { version: 2 }).unwrap();
        metadata.apply(alter()).unwrap();
        assert_eq!(metadata.acls.len(), 1);
        assert!(metadata.apply(Command::FinalizeMetadataVersion { version: 2 }).is_err(), "never goes back or repeats");
    }

    #[test]
    fn amqp_state_changes_are_compare_and_set() {
        let mut metadata = ClusterMetadata::default();
        let put = |expected_version, key: &str| Command::AlterAmqpState {
            expected_version,
            puts: BTreeMap::from([(key.to_string(), "{}".to_string())]),
            deletes: Vec::new(),
        };
        let refused = metadata.apply(put(Some(0), "exchange/logs")).unwrap_err();
        assert!(matches!(refused, MetadataError::UnsupportedMetadataVersion { .. }), "{refused:?}");
        metadata.apply(Command::FinalizeMetadataVersion { version: METADATA_VERSION_AMQP }).unwrap();
        metadata.apply(put(Some(0), "exchange/logs")).unwrap();
        let stale = metadata.apply(put(Some(0), "exchange/other")).unwrap_err();
        assert!(matches!(stale, MetadataError::ConfigsChanged(_)), "{stale:?}");
        metadata.apply(put(Some(1), "exchange/other")).unwrap();
        let delete = Command::AlterAmqpState {
            expected_version: None,
            puts: BTreeMap::new(),
            deletes: vec!["exchange/logs".into()],
        };
        metadata.apply(delete).unwrap();
        assert_eq!(metadata.amqp.keys().collect::<Vec<_>>(), ["exchange/other"]);
        assert_eq!(metadata.amqp_version, 3);
    }
}
