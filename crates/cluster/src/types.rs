//! The openraft type configuration: what the raft log carries and how nodes are named.
//!
//! Sluice node ids are `i32` (Kafka broker ids); openraft's are `u64`. The conversion lives
//! here only ([`raft_id`], [`node_id`]); negative node ids are refused by the config check.

use std::io::Cursor;

use crate::metadata::{Command, CommandResult};

openraft::declare_raft_types!(
    /// Sluice's raft types: the log carries [`Command`]s, applying one yields a
    /// [`CommandResult`], nodes are addressed by their controller RPC `host:port`.
    pub TypeConfig:
        D = Command,
        R = CommandResult,
        NodeId = u64,
        Node = openraft::BasicNode,
        SnapshotData = Cursor<Vec<u8>>,
);

/// The raft node id of a Sluice node id.
pub(crate) fn raft_id(node_id: i32) -> u64 {
    u64::try_from(node_id).expect("node ids are checked to be non-negative")
}

/// The Sluice node id of a raft node id.
pub(crate) fn node_id(raft_id: u64) -> i32 {
    i32::try_from(raft_id).expect("raft ids come from non-negative i32 node ids")
}
