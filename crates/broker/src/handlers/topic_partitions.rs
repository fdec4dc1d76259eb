//! DescribeTopicPartitions: the partition view of Metadata that `kafka-topics.sh --describe`
//! reads, with what Metadata lacks: each partition's eligible leader replicas and last known
//! ones. Answered from one snapshot of the cluster's metadata, in pages: topics by name,
//! at most `response_partition_limit` partitions per answer, and a cursor naming the first
//! partition of the next page.

use kafka_protocol::messages::describe_topic_partitions_response::{
    Cursor, DescribeTopicPartitionsResponsePartition, DescribeTopicPartitionsResponseTopic,
};
use kafka_protocol::messages::{BrokerId, DescribeTopicPartitionsRequest, DescribeTopicPartitionsResponse, TopicName};
use kafka_protocol::ResponseError;
use sluice_cluster::{ClusterMetadata, PartitionInfo};
use sluice_meta::topics::TopicMeta;
use sluice_security::acl::{self, RESOURCE_TOPIC};

use super::{str_bytes, ClientSession};
use crate::{Broker, LEADER_EPOCH};

/// Most partitions one answer carries, whatever the request asks (Kafka's
/// `max.request.partition.size.limit` default).
pub(super) const PARTITIONS_PER_RESPONSE_MAX: i32 = 2000;

/// Where a page starts: a topic name and the partition index within it.
struct Start {
    topic: String,
    partition: usize,
}

pub(super) fn describe(
    broker: &Broker,
    session: &ClientSession,
    request: DescribeTopicPartitionsRequest,
) -> DescribeTopicPartitionsResponse {
    // One snapshot for the whole answer, so no partition is from another metadata version.
    let snapshot = broker.cluster.as_ref().map(|cluster| cluster.metadata());
    let snapshot = snapshot.as_deref();
    let may_describe = |name: &str| broker.authorized(session, acl::OP_DESCRIBE, RESOURCE_TOPIC, name);
    // Named topics are answered each (with an error where needed); "all topics" means the
    // ones the client may describe.
    let listed = !request.topics.is_empty();
    let mut names: Vec<String> = if listed {
        request.topics.iter().map(|topic| topic.name.to_string()).collect()
    } else {
        broker.topics.all().into_iter().map(|topic| topic.name).filter(|name| may_describe(name)).collect()
    };
    names.sort_unstable();
    names.dedup();
    let start = request.cursor.as_ref().map(|cursor| Start {
        topic: cursor.topic_name.to_string(),
        partition: usize::try_from(cursor.partition_index).unwrap_or(0),
    });
    let mut room = usize::try_from(request.response_partition_limit.clamp(1, PARTITIONS_PER_RESPONSE_MAX))
        .expect("clamped positive");
    let mut response = DescribeTopicPartitionsResponse::default();
    for name in names.into_iter().filter(|name| start.as_ref().is_none_or(|start| *name >= start.topic)) {
        let first = start.as_ref().filter(|start| start.topic == name).map_or(0, |start| start.partition);
        if room == 0 {
            response.next_cursor = Some(cursor(&name, first));
            break;
        }
        let mut topic = match (may_describe(&name), broker.topics.get(&name)) {
            (false, _) => failed(&name, ResponseError::TopicAuthorizationFailed),
            (true, None) => failed(&name, ResponseError::UnknownTopicOrPartition),
            (true, Some(meta)) => described(broker, snapshot, &meta),
        };
        if topic.partitions.len() > first {
            topic.partitions.drain(..first);
        } else {
            topic.partitions.clear();
        }
        if topic.partitions.len() > room {
            topic.partitions.truncate(room);
            response.next_cursor = Some(cursor(&name, first + room));
            response.topics.push(topic);
            break;
        }
        room -= topic.partitions.len();
        response.topics.push(topic);
    }
    response
}

fn cursor(topic: &str, partition: usize) -> Cursor {
    let mut cursor = Cursor::default();
    cursor.topic_name = TopicName(str_bytes(topic));
    cursor.partition_index = i32::try_from(partition).unwrap_or(i32::MAX);
    cursor
}

fn failed(name: &str, error: ResponseError) -> DescribeTopicPartitionsResponseTopic {
    let mut topic = DescribeTopicPartitionsResponseTopic::default();
    topic.name = Some(TopicName(str_bytes(name)));
    topic.error_code = error.code();
    topic
}

/// A topic with all its partitions, as `snapshot` (a cluster's metadata; `None` on a single
/// node) has them.
fn described(
    broker: &Broker,
    snapshot: Option<&ClusterMetadata>,
    meta: &TopicMeta,
) -> DescribeTopicPartitionsResponseTopic {
    let mut topic = DescribeTopicPartitionsResponseTopic::default();
    topic.name = Some(TopicName(str_bytes(&meta.name)));
    topic.topic_id = meta.id;
    topic.is_internal = sluice_meta::topics::is_internal(&meta.name);
    let Some(metadata) = snapshot else {
        let node = broker.node_id();
        let only = PartitionInfo {
            replicas: vec![node],
            leader: node,
            leader_epoch: LEADER_EPOCH,
            isr: vec![node],
            partition_epoch: 0,
            elr: vec![],
            last_known_elr: vec![],
        };
        topic.partitions = (0..meta.partitions).map(|index| partition(index, &only, &|_| false)).collect();
        return topic;
    };
    let Some(info) = metadata.topics.get(&meta.name) else {
        topic.error_code = ResponseError::LeaderNotAvailable.code();
        return topic;
    };
    let fenced = |id: i32| metadata.brokers.get(&id).is_none_or(|broker| broker.fenced);
    topic.partitions = (0..).zip(&info.partitions).map(|(index, p)| partition(index, p, &fenced)).collect();
    topic
}

fn partition(index: i32, p: &PartitionInfo, fenced: &dyn Fn(i32) -> bool) -> DescribeTopicPartitionsResponsePartition {
    let ids = |ids: &[i32]| ids.iter().map(|&id| BrokerId(id)).collect::<Vec<_>>();
    let mut partition = DescribeTopicPartitionsResponsePartition::default();
    partition.partition_index = index;
    if p.leader < 0 {
        partition.error_code = ResponseError::LeaderNotAvailable.code();
    }
    partition.leader_id = BrokerId(p.leader);
    partition.leader_epoch = p.leader_epoch;
    partition.replica_nodes = ids(&p.replicas);
    partition.isr_nodes = ids(&p.isr);
    partition.eligible_leader_replicas = Some(ids(&p.elr));
    partition.last_known_elr = Some(ids(&p.last_known_elr));
    let offline: Vec<i32> = p.replicas.iter().copied().filter(|&id| fenced(id)).collect();
    partition.offline_replicas = ids(&offline);
    partition
}
