//! What tiered storage asks of the broker that runs it, as two narrow traits: the broker
//! owns the topic registry, the logs and the replica roles, and in a cluster the link to
//! the controller; tiered storage only needs to look them up and to commit its own
//! metadata, so it depends on these and not on the broker.

use std::io;
use std::sync::Arc;

use futures::future::BoxFuture;
use sluice_meta::topics::TopicMeta;
use sluice_storage::Partition;
use uuid::Uuid;

use crate::RemotePartition;

/// The broker's topics and the partitions this node leads: only a partition's leader, at
/// the epoch it leads at, copies and expires its remote segments.
pub trait TieredHost: Send + Sync + 'static {
    /// Every topic of the registry, tiered or not.
    fn topics(&self) -> Vec<TopicMeta>;

    /// The log of a partition this node leads and the epoch it leads at; `None` when this
    /// node does not lead it (a single node leads every partition).
    fn led_log(&self, topic: &str, partition: i32) -> Option<(Arc<Partition>, i32)>;
}

/// In a cluster, where the remote log metadata lives: the controller's replicated
/// metadata, which only a partition's leader at its current epoch may change (so a deposed
/// leader's late commit is refused).
pub trait RemoteLogController: Send + Sync {
    /// One partition's remote part as this node has applied it; `None` when it has none.
    fn remote_log(&self, topic_id: Uuid, partition: i32) -> Option<RemotePartition>;

    /// Replaces one partition's remote part through the controller, as its leader at
    /// `leader_epoch`, and returns once this node has applied the change.
    fn set_remote_log<'a>(
        &'a self,
        topic: &'a str,
        partition: i32,
        leader_epoch: i32,
        remote_log: RemotePartition,
    ) -> BoxFuture<'a, io::Result<()>>;
}
