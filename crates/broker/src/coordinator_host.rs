//! The broker as the host of the coordinators (`sluice_coordinator`): the coordinator crate
//! sits below the broker and reaches the broker's registry, groups and partitions only
//! through this (and through [`sluice_replication::ReplicaHost`], `replica_host.rs`).

use std::sync::Arc;

use kafka_protocol::ResponseError;
use sluice_coordinator::group::GroupCoordinator;
use sluice_coordinator::CoordinatorHost;
use sluice_meta::TopicRegistry;
use sluice_storage::Partition;

use crate::Broker;

impl CoordinatorHost for Broker {
    fn node_id(&self) -> i32 {
        Broker::node_id(self)
    }

    fn topics(&self) -> &TopicRegistry {
        &self.topics
    }

    fn groups(&self) -> &Arc<GroupCoordinator> {
        &self.groups
    }

    fn led_partition(&self, topic: &str, partition: i32) -> Result<(Arc<Partition>, i32), ResponseError> {
        match &self.replicas {
            None => Ok((
                self.partition(topic, partition).ok_or(ResponseError::UnknownTopicOrPartition)?,
                crate::LEADER_EPOCH,
            )),
            Some(_) => {
                let replica = self.hosted_replica(topic, partition, ResponseError::UnknownTopicOrPartition)?;
                let write = replica.begin_write(-1).map_err(sluice_replication::NotServed::error)?;
                Ok((replica.log.clone(), write.leader_epoch))
            }
        }
    }

    fn partition_leader(&self, topic: &str, partition: i32) -> Option<i32> {
        let cluster = self.cluster.as_ref()?;
        let metadata = cluster.metadata();
        let topic = metadata.topics.get(topic)?;
        let partition = topic.partitions.get(usize::try_from(partition).ok()?)?;
        (partition.leader >= 0).then_some(partition.leader)
    }
}
