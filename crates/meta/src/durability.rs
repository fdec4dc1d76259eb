//! The durability a topic promises: when a write may be acknowledged.

use sluice_storage::LogConfig;

/// How a topic acknowledges writes (`sluice.durability.level`, see ARCHITECTURE.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DurabilityLevel {
    /// A majority (the ISR, at least `min.insync.replicas`) has it, each fsynced.
    ReplicatedFsynced = 1,
    /// The ISR has it in memory; fsync is asynchronous.
    Replicated = 2,
    /// The leader fsynced it; replication is asynchronous.
    LeaderFsynced = 3,
    /// The leader has it in memory.
    LeaderOnly = 4,
}

impl DurabilityLevel {
    pub fn from_level(level: u8) -> Option<DurabilityLevel> {
        match level {
            1 => Some(DurabilityLevel::ReplicatedFsynced),
            2 => Some(DurabilityLevel::Replicated),
            3 => Some(DurabilityLevel::LeaderFsynced),
            4 => Some(DurabilityLevel::LeaderOnly),
            _ => None,
        }
    }

    /// Acknowledgement waits for the ISR. (The high watermark always does, whatever the
    /// level: consumers only see what every ISR member holds, as in Kafka.)
    pub fn waits_for_replicas(self) -> bool {
        matches!(self, DurabilityLevel::ReplicatedFsynced | DurabilityLevel::Replicated)
    }

    /// Each copy is fsynced before it counts.
    pub fn fsyncs(self) -> bool {
        matches!(self, DurabilityLevel::ReplicatedFsynced | DurabilityLevel::LeaderFsynced)
    }
}

/// Topic settings replication acts on.
#[derive(Debug, Clone)]
pub struct ReplicationConfig {
    pub level: DurabilityLevel,
    pub min_insync_replicas: usize,
    pub log: LogConfig,
}
