//! [`ControllerError`]: what the controller API returns: a refusal by the state machine
//! ([`MetadataError`], one variant per Kafka error the broker tells apart) or a failure to
//! get the command committed; [`ControllerError::kafka_error_code`] maps either.

use std::io;

use crate::metadata::MetadataError;

/// Errors of the [`Controller`](crate::Controller) API.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    /// The state machine refused the command (unknown topic, stale epoch, ...).
    #[error(transparent)]
    Refused(#[from] MetadataError),
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
            Self::Refused(refused) => refused.kafka_error_code(),
            Self::NotController | Self::Shutdown => 41,
            Self::Timeout(_) => 7,
            Self::Io(_) => 56,
            Self::Config(_) | Self::Raft(_) => -1,
        }
    }
}

impl MetadataError {
    /// The Kafka error code for this refusal.
    pub fn kafka_error_code(&self) -> i16 {
        match self {
            Self::TopicAlreadyExists(_) => 36,
            Self::UnknownTopic(_) | Self::UnknownPartition { .. } => 3,
            Self::InvalidPartitions(_) => 37,
            Self::InvalidReplicationFactor(_) => 38,
            Self::InvalidReplicaAssignment(_) | Self::UnknownBroker(_) => 39,
            Self::StaleEpoch { .. } => 74,
            Self::InvalidUpdateVersion { .. } | Self::ConfigsChanged(_) => 95,
            Self::NotLeader { .. } => 6,
            Self::IneligibleReplica(_) => 107,
            Self::NoReassignmentInProgress { .. } => 85,
            Self::LimitExceeded(_) => 44,
            Self::InvalidRequest(_) => 42,
            Self::UnsupportedMetadataVersion { .. } => 35,
        }
    }
}
