//! The broker's side of `sluice-tiered`: what tiered storage asks of the broker (its
//! topics, which partitions this node leads at which epoch) and, in a cluster, of the
//! link to the controller (the remote log metadata it replicates, and commits to it).

use std::io;
use std::sync::Arc;

use futures::future::{BoxFuture, FutureExt};
use sluice_cluster::RemoteLog;
use sluice_meta::topics::TopicMeta;
use sluice_storage::Partition;
use sluice_tiered::{RemoteLogController, TieredHost};
use uuid::Uuid;

use crate::cluster_link::{ClusterLink, ADMIN_TIMEOUT};
use crate::Broker;

impl Broker {
    /// The log of a partition this node leads and the epoch it leads at (a single node leads
    /// every partition, at [`crate::LEADER_EPOCH`]).
    pub(crate) fn led_log(&self, topic: &str, partition: i32) -> Option<(Arc<Partition>, i32)> {
        match &self.replicas {
            None => self.partition(topic, partition).map(|log| (log, crate::LEADER_EPOCH)),
            Some(replicas) => {
                let replica = replicas.get(topic, partition)?;
                Some((replica.log.clone(), replica.leader_epoch()?))
            }
        }
    }
}

impl TieredHost for Broker {
    fn topics(&self) -> Vec<TopicMeta> {
        self.topics.all()
    }

    fn led_log(&self, topic: &str, partition: i32) -> Option<(Arc<Partition>, i32)> {
        Broker::led_log(self, topic, partition)
    }
}

impl RemoteLogController for ClusterLink {
    fn remote_log(&self, topic_id: Uuid, partition: i32) -> Option<RemoteLog> {
        self.metadata().remote_log(&topic_id, partition).cloned()
    }

    fn set_remote_log<'a>(
        &'a self,
        topic: &'a str,
        partition: i32,
        leader_epoch: i32,
        remote_log: RemoteLog,
    ) -> BoxFuture<'a, io::Result<()>> {
        async move {
            let controller = self.controller().ok_or_else(|| io::Error::other("controller not started"))?;
            controller
                .set_remote_log(topic, partition, leader_epoch, remote_log)
                .await
                .map_err(|e| io::Error::other(format!("remote log metadata not committed: {e}")))?;
            let applied = self.controller_version();
            if !self.wait_applied(applied, ADMIN_TIMEOUT).await {
                return Err(io::Error::other("remote log metadata committed but not applied here in time"));
            }
            Ok(())
        }
        .boxed()
    }
}
