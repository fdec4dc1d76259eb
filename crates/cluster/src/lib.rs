//! `sluice-cluster`: the controller quorum of a Sluice cluster, on openraft 0.9.
//!
//! Every node runs one [`Controller`]. The voters (the configured node ids) replicate a raft
//! log of [`Command`]s whose state machine is [`ClusterMetadata`]: brokers, topics, partition
//! leaders and ISRs, producer-id blocks. The raft leader is the *active controller*: it keeps
//! broker liveness from heartbeats in memory and fences brokers whose session expires, which
//! moves their partitions' leadership to other in-sync replicas (see [`metadata`] for the
//! election rules).
//!
//! Why openraft: a controller quorum needs leader election, log replication and snapshots
//! exactly as Raft specifies them; openraft provides the protocol with storage and network as
//! traits, so this crate owns only what is Sluice's: the log format on disk
//! ([`log_store`](crate::log_store)), the state machine, the RPC transport and the
//! controller's duties.
//!
//! ```no_run
//! # async fn example() -> Result<(), sluice_cluster::ControllerError> {
//! use std::collections::BTreeMap;
//! use std::time::Duration;
//! use sluice_cluster::{Controller, ControllerConfig};
//!
//! let voters = BTreeMap::from([(1, "10.0.0.1:9093".to_string()), (2, "10.0.0.2:9093".to_string()), (3, "10.0.0.3:9093".to_string())]);
//! // The secret every controller of the cluster shares (at least 16 bytes).
//! let secret = std::fs::read("/etc/sluice/cluster.secret").unwrap();
//! let config = ControllerConfig::new(1, "0.0.0.0:9093".parse().unwrap(), voters, "/var/lib/sluice".into(), "10.0.0.1".into(), 9092, secret);
//! let controller = Controller::start(config).await?;
//! controller.wait_ready(Duration::from_secs(10)).await?;
//! let topic = controller.create_topic("orders", 6, 3, BTreeMap::new()).await?;
//! assert_eq!(topic.partitions.len(), 6);
//! # Ok(()) }
//! ```

#![warn(missing_docs, unreachable_pub, rust_2018_idioms)]
#![deny(unused_must_use)]

mod controller;
mod error;
mod log_store;
pub mod metadata;
pub mod net;
mod network;
pub mod quorum;
mod rpc;
mod rpc_protection;
mod state_machine;
mod types;

pub use crate::controller::{
    Controller, ControllerConfig, ELECTION_TIMEOUT_MAX_MS_DEFAULT, ELECTION_TIMEOUT_MIN_MS_DEFAULT,
    HEARTBEAT_INTERVAL_MS_DEFAULT, LEADER_REBALANCE_INTERVAL_MS_DEFAULT, SESSION_TIMEOUT_MS_DEFAULT,
    SNAPSHOT_INTERVAL_ENTRIES_DEFAULT, VOTERS_MAX, WRITE_TIMEOUT_MS_DEFAULT,
};
pub use crate::error::ControllerError;
pub use crate::metadata::{
    AclBinding, BrokerInfo, ClusterMetadata, Command, CommandOutput, Endpoint, MetadataError, PartitionInfo,
    QuotaEntity, QuotaEntityName, Reassignment, RemoteLog, RemoteLogSegment, ScramCredential, TopicInfo,
    METADATA_VERSION_INITIAL, METADATA_VERSION_LATEST, NO_LEADER,
};
pub use crate::quorum::{QuorumDescription, QuorumReplica, VoterChange, VoterChangeError};
pub use crate::rpc::{RpcTls, FRAME_BYTES_MAX, RPC_SECRET_BYTES_MIN};
pub use crate::types::{Proposal, TypeConfig};
