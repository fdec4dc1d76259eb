//! The openraft type configuration: what the raft log carries and how nodes are named.
//!
//! Sluice node ids are `i32` (Kafka broker ids); openraft's are `u64`. The conversion lives
//! here only ([`raft_id`], [`node_id`]); negative node ids are refused by the config check.

use std::io::Cursor;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::metadata::{Command, CommandResult};

/// One raft log entry's application data: a command and the id of the write that proposed it.
/// Retries of a write reuse its id, so the state machine applies it at most once.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proposal {
    /// Random per write (not per attempt).
    pub request_id: Uuid,
    /// The change.
    pub command: Command,
}

impl Proposal {
    /// A proposal with a fresh request id.
    pub fn new(command: Command) -> Proposal {
        Proposal { request_id: Uuid::new_v4(), command }
    }
}

openraft::declare_raft_types!(
    /// Sluice's raft types: the log carries [`Proposal`]s (a [`Command`] with a request id),
    /// applying one yields a
    /// [`CommandResult`], nodes are addressed by their controller RPC `host:port`.
    pub TypeConfig:
        D = Proposal,
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
