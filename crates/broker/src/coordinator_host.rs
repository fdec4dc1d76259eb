//! The broker as the host of the coordinators (`sluice_coordinator`): the coordinator crate
//! sits below the broker and reaches the broker's registry, groups, partitions and controller only
//! through this (and through [`sluice_replication::ReplicaHost`], `replica_host.rs`).

use std::sync::Arc;

use kafka_protocol::ResponseError;
use sluice_coordinator::group::GroupCoordinator;
use sluice_coordinator::share::GroupConfigs;
use sluice_coordinator::{CoordinatorHost, HostWrite};
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

    fn clustered(&self) -> bool {
        self.cluster.is_some()
    }

    fn partition(&self, topic: &str, partition: i32) -> Option<Arc<Partition>> {
        Broker::partition(self, topic, partition)
    }

    fn group_configs_write_to_controller<'a>(
        &'a self,
        group_id: &'a str,
        configs: &GroupConfigs,
    ) -> Option<HostWrite<'a>> {
        let cluster = self.cluster.as_ref()?;
        let configs = configs.clone();
        Some(Box::pin(async move {
            match cluster.controller() {
                Some(controller) => {
                    let write = controller.alter_group_configs(group_id, configs);
                    match tokio::time::timeout(crate::cluster_link::ADMIN_TIMEOUT, write).await {
                        Ok(Ok(())) => Ok(()),
                        _ => Err(ResponseError::CoordinatorNotAvailable),
                    }
                }
                None => Err(ResponseError::CoordinatorNotAvailable),
            }
        }))
    }
}
