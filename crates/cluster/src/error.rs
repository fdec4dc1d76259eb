//! [`ControllerError`]: what the controller API returns, with one variant per Kafka error the
//! broker needs to tell apart, and [`ControllerError::kafka_error_code`] to map it.

use std::io;

use crate::metadata::MetadataError;

/// Errors of the [`Controller`](crate::Controller) API.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    /// CreateTopic of an existing name.
    #[error("topic {0} already exists")]
    TopicAlreadyExists(String),
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
    /// Bad replication factor or too few unfenced brokers.
    #[error("invalid replication factor: {0}")]
    InvalidReplicationFactor(String),
    /// Bad replica list (reassignment).
    #[error("invalid replica assignment: {0}")]
    InvalidReplicaAssignment(String),
    /// AlterPartition with an old leader epoch (Kafka FENCED_LEADER_EPOCH).
    #[error("stale leader epoch {given}, current {current}")]
    StaleEpoch {
        /// The request's epoch.
        given: i32,
        /// The partition's epoch.
        current: i32,
    },
    /// AlterPartition with an old partition epoch.
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
    /// The new ISR holds a non-replica or a fenced broker.
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
    /// A named limit would be exceeded.
    #[error("limit exceeded: {0}")]
    LimitExceeded(String),
    /// Malformed request.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// No raft leader could take the write (election in progress, no quorum).
    #[error("no active controller")]
    NotController,
    /// The deadline passed; a write may or may not have been committed.
    #[error("timed out: {0}")]
    Timeout(String),
    /// Disk or socket failure.
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
    /// Bad [`ControllerConfig`](crate::ControllerConfig).
    #[error("invalid controller config: {0}")]
    Config(String),
    /// The raft core failed or was shut down.
    #[error("raft: {0}")]
    Raft(String),
    /// The controller was shut down.
    #[error("controller shut down")]
    Shutdown,
}

impl ControllerError {
    /// The Kafka error code the broker should answer with.
    pub fn kafka_error_code(&self) -> i16 {
        match self {
            Self::TopicAlreadyExists(_) => 36,
            Self::UnknownTopic(_) | Self::UnknownPartition { .. } => 3,
            Self::InvalidPartitions(_) => 37,
            Self::InvalidReplicationFactor(_) => 38,
            Self::InvalidReplicaAssignment(_) | Self::UnknownBroker(_) => 39,
            Self::StaleEpoch { .. } => 74,
            Self::InvalidUpdateVersion { .. } => 95,
            Self::NotLeader { .. } => 6,
            Self::IneligibleReplica(_) => 107,
            Self::NoReassignmentInProgress { .. } => 85,
            Self::LimitExceeded(_) => 44,
            Self::InvalidRequest(_) => 42,
            Self::NotController | Self::Shutdown => 41,
            Self::Timeout(_) => 7,
            Self::Io(_) => 56,
            Self::Config(_) | Self::Raft(_) => -1,
        }
    }
}

impl From<MetadataError> for ControllerError {
    fn from(error: MetadataError) -> Self {
        match error {
            MetadataError::TopicAlreadyExists(name) => Self::TopicAlreadyExists(name),
            MetadataError::UnknownTopic(name) => Self::UnknownTopic(name),
            MetadataError::UnknownPartition { topic, partition } => Self::UnknownPartition { topic, partition },
            MetadataError::InvalidPartitions(why) => Self::InvalidPartitions(why),
            MetadataError::InvalidReplicationFactor(why) => Self::InvalidReplicationFactor(why),
            MetadataError::InvalidReplicaAssignment(why) => Self::InvalidReplicaAssignment(why),
            MetadataError::StaleEpoch { given, current } => Self::StaleEpoch { given, current },
            MetadataError::InvalidUpdateVersion { given, current } => Self::InvalidUpdateVersion { given, current },
            MetadataError::NotLeader { given, current } => Self::NotLeader { given, current },
            MetadataError::IneligibleReplica(why) => Self::IneligibleReplica(why),
            MetadataError::UnknownBroker(id) => Self::UnknownBroker(id),
            MetadataError::NoReassignmentInProgress { topic, partition } => {
                Self::NoReassignmentInProgress { topic, partition }
            }
            MetadataError::LimitExceeded(why) => Self::LimitExceeded(why),
            MetadataError::InvalidRequest(why) => Self::InvalidRequest(why),
        }
    }
}
