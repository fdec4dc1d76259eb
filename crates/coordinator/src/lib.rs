//! The coordinators: the group coordinator (classic and consumer-protocol groups, committed
//! offsets), the transaction coordinator, the share coordinator (share groups and their
//! state), and the keyed state log they keep in an internal topic.
//!
//! They sit below the broker, above storage, meta and replication, so that their state
//! machines and durable logs are built and tested without the request handlers; the broker
//! reaches into them through their APIs and they reach back only through [`CoordinatorHost`].

pub mod group;
pub mod internal_log;
pub mod leadership;
pub mod placement;
pub mod share;
pub mod state_log;
pub mod txn;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use kafka_protocol::ResponseError;
use sluice_meta::TopicRegistry;
use sluice_replication::ReplicaHost;
use sluice_storage::Partition;

use crate::group::GroupCoordinator;

/// A group's dynamic configs (`share.*`, and the topics a share group consumes), by name.
pub type GroupConfigs = std::collections::BTreeMap<String, String>;

/// A write the host makes on a coordinator's behalf, to await.
pub type HostWrite<'a> = Pin<Box<dyn Future<Output = Result<(), ResponseError>> + Send + 'a>>;

/// What a coordinator needs from the broker that hosts it, beyond what replication needs
/// ([`ReplicaHost`]: the replicas, the logs and their syncer, inter-broker connections).
pub trait CoordinatorHost: ReplicaHost {
    /// This node's id.
    fn node_id(&self) -> i32;
    /// The topic registry: which partitions exist, producer id allocation.
    fn topics(&self) -> &TopicRegistry;
    /// The group coordinator, which transactions commit offsets through.
    fn groups(&self) -> &Arc<GroupCoordinator>;
    /// The log of a partition this node leads, to write a transaction marker to, and its
    /// leader epoch; the error a client would get when it is not led here.
    fn led_partition(&self, topic: &str, partition: i32) -> Result<(Arc<Partition>, i32), ResponseError>;
    /// The node leading a partition, from the cluster metadata (`None` on a single node, or
    /// when unknown).
    fn partition_leader(&self, topic: &str, partition: i32) -> Option<i32>;
    /// This node is part of a cluster (else a single node, which keeps its own state).
    fn clustered(&self) -> bool;
    /// The log of a partition this node leads (on a single node: every partition).
    fn partition(&self, topic: &str, partition: i32) -> Option<Arc<Partition>>;
    /// In a cluster: stores a share group's configs in the cluster metadata through the
    /// controller, within the admin timeout. `None` on a single node.
    fn group_configs_write_to_controller<'a>(
        &'a self,
        group_id: &'a str,
        configs: &GroupConfigs,
    ) -> Option<HostWrite<'a>>;
}
