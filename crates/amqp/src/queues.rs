//! The topics behind queues: declaring one creates its topic (and makes its share group
//! start at the earliest record, as a queue hands out what was published before its first
//! consumer), deleting one deletes the topic, purging one deletes its records.
//!
//! Also what only this node knows of queues: which connection owns an exclusive one, how
//! many consumers an auto-delete one has.

use std::collections::HashMap;

use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::delete_records_request::{DeleteRecordsPartition, DeleteRecordsTopic};
use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
use kafka_protocol::messages::describe_share_group_offsets_request::{
    DescribeShareGroupOffsetsRequestGroup, DescribeShareGroupOffsetsRequestTopic,
};
use kafka_protocol::messages::incremental_alter_configs_request::{AlterConfigsResource, AlterableConfig};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::{
    CreateTopicsRequest, DeleteRecordsRequest, DeleteTopicsRequest, DescribeShareGroupOffsetsRequest, GroupId,
    IncrementalAlterConfigsRequest, ListOffsetsRequest, RequestKind, ResponseKind, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use parking_lot::Mutex;

use crate::frames::reply;
use crate::gateway::{versions, Gateway, Session};
use crate::topology::Refused;

/// The topic-creation timeout asked of the controller.
const ADMIN_TIMEOUT_MS: i32 = 30_000;
/// Partitions of a queue's topic unless `x-queue-partitions` says otherwise, and at most.
const QUEUE_PARTITIONS_DEFAULT: i32 = 1;
const QUEUE_PARTITIONS_MAX: i32 = 1024;
/// Kafka's resource type GROUP for configs.
const RESOURCE_GROUP: i8 = 32;
/// The longest queue name: Kafka's longest topic name.
const QUEUE_NAME_BYTES_MAX: usize = 249;
/// How long a publish or a consumer keeps asking again about a queue's topic that the node
/// answering does not know: in a cluster each node applies a topic's creation at its own
/// pace, so a queue just declared through one node may be served by a leader that has not
/// applied it yet (a Kafka client likewise retries UNKNOWN_TOPIC_OR_PARTITION). Past it the
/// topic is taken as gone (deleted by a Kafka client): the publish is nacked, the consumer
/// cancelled.
pub(crate) const UNKNOWN_TOPIC_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Whether `name` can be a queue: it must be a valid Kafka topic name, since it is one.
pub fn check_name(name: &str) -> Result<(), Refused> {
    let valid = !name.is_empty()
        && name.len() <= QUEUE_NAME_BYTES_MAX
        && name != "."
        && name != ".."
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
    if !valid {
        return Err(Refused(
            reply::PRECONDITION_FAILED,
            format!("queue name '{name}' is not a valid topic name (letters, digits, '.', '_', '-'; at most 249)"),
        ));
    }
    Ok(())
}

/// How long queue `x-expires` lets a queue go unused before it is deleted (None: forever);
/// a value that is not a positive whole number of milliseconds is refused (406).
pub fn expires_ms(arguments: &std::collections::BTreeMap<String, String>) -> Result<Option<u64>, Refused> {
    match arguments.get("x-expires") {
        None => Ok(None),
        Some(text) => match text.parse::<u64>() {
            Ok(ms) if (1..=u64::from(u32::MAX)).contains(&ms) => Ok(Some(ms)),
            _ => Err(Refused(
                reply::PRECONDITION_FAILED,
                format!("invalid arg 'x-expires': {text} is not a whole number of milliseconds from 1"),
            )),
        },
    }
}

/// The partition count `x-queue-partitions` asks for.
pub fn partitions(arguments: &std::collections::BTreeMap<String, String>) -> Result<i32, Refused> {
    match arguments.get("x-queue-partitions") {
        None => Ok(QUEUE_PARTITIONS_DEFAULT),
        Some(text) => match text.parse::<i32>() {
            Ok(n) if (1..=QUEUE_PARTITIONS_MAX).contains(&n) => Ok(n),
            _ => Err(Refused(
                reply::PRECONDITION_FAILED,
                format!("x-queue-partitions must be 1 to {QUEUE_PARTITIONS_MAX}, not {text}"),
            )),
        },
    }
}

async fn call(
    gateway: &dyn Gateway,
    session: Option<&Session>,
    version: i16,
    request: RequestKind,
) -> Result<ResponseKind, Refused> {
    let answer = match session {
        Some(session) => gateway.call(session, version, request).await,
        None => gateway.call_internal(version, request).await,
    };
    answer.ok_or_else(|| Refused(reply::INTERNAL_ERROR, "the broker gave no answer".into()))
}

/// The AMQP refusal for a Kafka error on a queue.
pub fn refusal(error: ResponseError, queue: &str, message: Option<&StrBytes>) -> Refused {
    let detail = message.map(|m| format!(": {}", m.as_str())).unwrap_or_default();
    let code = match error {
        ResponseError::TopicAuthorizationFailed
        | ResponseError::ClusterAuthorizationFailed
        | ResponseError::GroupAuthorizationFailed => reply::ACCESS_REFUSED,
        ResponseError::UnknownTopicOrPartition | ResponseError::UnknownTopicId => reply::NOT_FOUND,
        ResponseError::InvalidTopicException | ResponseError::InvalidPartitions | ResponseError::InvalidConfig => {
            reply::PRECONDITION_FAILED
        }
        _ => reply::INTERNAL_ERROR,
    };
    Refused(code, format!("queue '{queue}': {error}{detail}"))
}

/// Creates the topic of queue `name` as `session`; true if it did not exist.
pub async fn create_topic(
    gateway: &dyn Gateway,
    session: &Session,
    name: &str,
    partitions: i32,
) -> Result<bool, Refused> {
    let mut topic = CreatableTopic::default();
    topic.name = TopicName(StrBytes::from_string(name.to_string()));
    topic.num_partitions = partitions;
    topic.replication_factor = -1;
    let mut request = CreateTopicsRequest::default();
    request.topics = vec![topic];
    request.timeout_ms = ADMIN_TIMEOUT_MS;
    let ResponseKind::CreateTopics(response) =
        call(gateway, Some(session), versions::CREATE_TOPICS, RequestKind::CreateTopics(request)).await?
    else {
        return Err(Refused(reply::INTERNAL_ERROR, "unexpected answer to CreateTopics".into()));
    };
    let result =
        response.topics.first().ok_or_else(|| Refused(reply::INTERNAL_ERROR, "empty CreateTopics answer".into()))?;
    match ResponseError::try_from_code(result.error_code) {
        None => Ok(true),
        Some(ResponseError::TopicAlreadyExists) => Ok(false),
        Some(error) => Err(refusal(error, name, result.error_message.as_ref())),
    }
}

/// Sets up the share group of queue `name`: it starts at the earliest record, and acquires a
/// record at most `delivery_count_limit` times (what the queue's delivery limit needs). Part
/// of declaring the queue (which the declaring user was allowed), so it runs as the broker.
pub async fn configure_share_group(
    gateway: &dyn Gateway,
    name: &str,
    delivery_count_limit: i16,
) -> Result<(), Refused> {
    let config = |key: &'static str, value: String| {
        let mut config = AlterableConfig::default();
        config.name = StrBytes::from_static_str(key);
        config.config_operation = 0;
        config.value = Some(StrBytes::from_string(value));
        config
    };
    let mut resource = AlterConfigsResource::default();
    resource.resource_type = RESOURCE_GROUP;
    resource.resource_name = StrBytes::from_string(name.to_string());
    resource.configs = vec![
        config("share.auto.offset.reset", "earliest".into()),
        config("share.delivery.count.limit", delivery_count_limit.to_string()),
    ];
    let mut request = IncrementalAlterConfigsRequest::default();
    request.resources = vec![resource];
    let answer =
        call(gateway, None, versions::INCREMENTAL_ALTER_CONFIGS, RequestKind::IncrementalAlterConfigs(request)).await?;
    let ResponseKind::IncrementalAlterConfigs(response) = answer else {
        return Err(Refused(reply::INTERNAL_ERROR, "unexpected answer to IncrementalAlterConfigs".into()));
    };
    for result in &response.responses {
        if let Some(error) = ResponseError::try_from_code(result.error_code) {
            return Err(refusal(error, name, result.error_message.as_ref()));
        }
    }
    Ok(())
}

/// Deletes the topic of queue `name` as `session` (None: as the broker, for a queue that
/// goes with its connection); a topic already gone is no error.
pub async fn delete_topic(gateway: &dyn Gateway, session: Option<&Session>, name: &str) -> Result<(), Refused> {
    let mut state = DeleteTopicState::default();
    state.name = Some(TopicName(StrBytes::from_string(name.to_string())));
    let mut request = DeleteTopicsRequest::default();
    request.topics = vec![state];
    request.timeout_ms = ADMIN_TIMEOUT_MS;
    let ResponseKind::DeleteTopics(response) =
        call(gateway, session, versions::DELETE_TOPICS, RequestKind::DeleteTopics(request)).await?
    else {
        return Err(Refused(reply::INTERNAL_ERROR, "unexpected answer to DeleteTopics".into()));
    };
    for result in &response.responses {
        match ResponseError::try_from_code(result.error_code) {
            None | Some(ResponseError::UnknownTopicOrPartition) => {}
            Some(error) => return Err(refusal(error, name, result.error_message.as_ref())),
        }
    }
    Ok(())
}

/// The (log start, end) offsets of each partition of `name`.
pub async fn offsets(
    gateway: &dyn Gateway,
    session: &Session,
    name: &str,
    partitions: i32,
) -> Result<Vec<(i64, i64)>, Refused> {
    let mut bounds = Vec::new();
    for timestamp in [-2i64, -1] {
        let mut topic = ListOffsetsTopic::default();
        topic.name = TopicName(StrBytes::from_string(name.to_string()));
        topic.partitions = (0..partitions)
            .map(|p| {
                let mut partition = ListOffsetsPartition::default();
                partition.partition_index = p;
                partition.timestamp = timestamp;
                partition
            })
            .collect();
        let mut request = ListOffsetsRequest::default();
        request.replica_id = kafka_protocol::messages::BrokerId(-1);
        request.topics = vec![topic];
        let ResponseKind::ListOffsets(response) =
            call(gateway, Some(session), versions::LIST_OFFSETS, RequestKind::ListOffsets(request)).await?
        else {
            return Err(Refused(reply::INTERNAL_ERROR, "unexpected answer to ListOffsets".into()));
        };
        let mut found = Vec::new();
        for partition in response.topics.iter().flat_map(|t| &t.partitions) {
            if let Some(error) = ResponseError::try_from_code(partition.error_code) {
                return Err(refusal(error, name, None));
            }
            found.push(partition.offset);
        }
        bounds.push(found);
    }
    Ok(bounds[0].iter().copied().zip(bounds[1].iter().copied()).collect())
}

/// The ready messages of queue `name` (RabbitMQ's `message_count`), when this node leads its
/// partitions; elsewhere the records its share group has not yet settled below (its start
/// offset on each partition, or the log start where it never fetched), ready and
/// unacknowledged together. 0 when `session` may not see them.
pub async fn message_count(gateway: &dyn Gateway, session: &Session, name: &str, partitions: i32) -> u32 {
    // ListOffsets as the session is also the check that it may see the queue at all.
    let Ok(bounds) = offsets(gateway, session, name, partitions).await else { return 0 };
    if let Some(ready) = ready_count(gateway, name, partitions).await {
        return ready;
    }
    let mut topic = DescribeShareGroupOffsetsRequestTopic::default();
    topic.topic_name = TopicName(StrBytes::from_string(name.to_string()));
    topic.partitions = (0..partitions).collect();
    let mut group = DescribeShareGroupOffsetsRequestGroup::default();
    group.group_id = GroupId(StrBytes::from_string(name.to_string()));
    group.topics = Some(vec![topic]);
    let mut request = DescribeShareGroupOffsetsRequest::default();
    request.groups = vec![group];
    let answer = call(gateway, Some(session), versions::DESCRIBE_SHARE_GROUP_OFFSETS, request.into()).await;
    let mut starts = vec![-1i64; bounds.len()];
    if let Ok(ResponseKind::DescribeShareGroupOffsets(response)) = answer {
        for partition in response.groups.iter().flat_map(|g| &g.topics).flat_map(|t| &t.partitions) {
            if let Some(start) = starts.get_mut(partition.partition_index as usize) {
                *start = partition.start_offset;
            }
        }
    }
    let count: i64 = bounds.iter().zip(&starts).map(|(&(log_start, end), &start)| end - start.max(log_start)).sum();
    count.clamp(0, u32::MAX as i64) as u32
}

/// The ready messages of queue `name` when this node leads its partitions. Not authorized:
/// for a session that was allowed to see the queue.
pub async fn ready_count(gateway: &dyn Gateway, name: &str, partitions: i32) -> Option<u32> {
    let depth = crate::length_limit::depth(gateway, name, partitions).await?;
    Some(depth.ready.min(u64::from(u32::MAX)) as u32)
}

/// Deletes every record of queue `name` now in it; returns how many there were.
pub async fn purge(gateway: &dyn Gateway, session: &Session, name: &str, partitions: i32) -> Result<u64, Refused> {
    let bounds = offsets(gateway, session, name, partitions).await?;
    let mut topic = DeleteRecordsTopic::default();
    topic.name = TopicName(StrBytes::from_string(name.to_string()));
    topic.partitions = bounds
        .iter()
        .enumerate()
        .map(|(p, &(_, end))| {
            let mut partition = DeleteRecordsPartition::default();
            partition.partition_index = p as i32;
            partition.offset = end;
            partition
        })
        .collect();
    let mut request = DeleteRecordsRequest::default();
    request.topics = vec![topic];
    request.timeout_ms = ADMIN_TIMEOUT_MS;
    let ResponseKind::DeleteRecords(response) =
        call(gateway, Some(session), 2, RequestKind::DeleteRecords(request)).await?
    else {
        return Err(Refused(reply::INTERNAL_ERROR, "unexpected answer to DeleteRecords".into()));
    };
    for partition in response.topics.iter().flat_map(|t| &t.partitions) {
        if let Some(error) = ResponseError::try_from_code(partition.error_code) {
            return Err(refusal(error, name, None));
        }
    }
    Ok(bounds.iter().map(|&(start, end)| (end - start).max(0) as u64).sum())
}

/// What this node knows of a queue beyond the topology: its exclusive owner and its
/// consumers here.
#[derive(Default)]
struct LocalQueue {
    /// The connection that declared it exclusive.
    owner: Option<u64>,
    consumers: usize,
    /// Its one consumer asked for exclusive access (`basic.consume` with `exclusive`).
    exclusive_consumer: bool,
}

#[derive(Default)]
pub struct LocalQueues {
    queues: Mutex<HashMap<String, LocalQueue>>,
    /// When each queue was last used here (declared, read, a consumer added or gone): the
    /// clock of `x-expires`, which starts again when the broker does (as in RabbitMQ).
    used: Mutex<HashMap<String, std::time::Instant>>,
}

impl LocalQueues {
    /// Queue `name` was used now.
    pub fn touch(&self, name: &str) {
        self.used.lock().insert(name.to_string(), std::time::Instant::now());
    }

    /// How long queue `name` has gone unused (its clock starts now if it has none).
    pub fn unused_for(&self, name: &str) -> std::time::Duration {
        self.used.lock().entry(name.to_string()).or_insert_with(std::time::Instant::now).elapsed()
    }

    /// Makes `connection` the owner of exclusive queue `name`.
    pub fn claim(&self, name: &str, connection: u64) {
        self.queues.lock().entry(name.to_string()).or_default().owner = Some(connection);
    }

    /// Refuses `connection` a queue another connection holds exclusively (405).
    pub fn check_access(&self, name: &str, connection: u64) -> Result<(), Refused> {
        match self.queues.lock().get(name).and_then(|q| q.owner) {
            Some(owner) if owner != connection => Err(Refused(
                reply::RESOURCE_LOCKED,
                format!("cannot obtain exclusive access to locked queue '{name}' in vhost '/'"),
            )),
            _ => Ok(()),
        }
    }

    /// The exclusive queues `connection` owns (taken: they go with it).
    pub fn release_owner(&self, connection: u64) -> Vec<String> {
        let mut queues = self.queues.lock();
        let owned: Vec<String> =
            queues.iter().filter(|(_, q)| q.owner == Some(connection)).map(|(n, _)| n.clone()).collect();
        for name in &owned {
            queues.remove(name);
        }
        owned
    }

    /// One consumer of `name` more, unless the queue has an exclusive consumer, or this one
    /// wants exclusive access and the queue has consumers (403, as RabbitMQ).
    pub fn consumer_added(&self, name: &str, exclusive: bool) -> Result<(), Refused> {
        let mut queues = self.queues.lock();
        let queue = queues.entry(name.to_string()).or_default();
        if queue.exclusive_consumer {
            return Err(Refused(reply::ACCESS_REFUSED, format!("queue '{name}' in vhost '/' in exclusive use")));
        }
        if exclusive && queue.consumers > 0 {
            return Err(Refused(
                reply::ACCESS_REFUSED,
                format!("cannot obtain exclusive access to locked queue '{name}' in vhost '/'"),
            ));
        }
        queue.consumers += 1;
        queue.exclusive_consumer = exclusive;
        Ok(())
    }

    /// One consumer of `name` fewer; returns how many remain.
    pub fn consumer_removed(&self, name: &str) -> usize {
        let mut queues = self.queues.lock();
        let Some(queue) = queues.get_mut(name) else { return 0 };
        queue.consumers = queue.consumers.saturating_sub(1);
        let left = queue.consumers;
        if left == 0 {
            queue.exclusive_consumer = false;
        }
        if left == 0 && queue.owner.is_none() {
            queues.remove(name);
        }
        left
    }

    pub fn consumers(&self, name: &str) -> usize {
        self.queues.lock().get(name).map_or(0, |q| q.consumers)
    }

    pub fn forget(&self, name: &str) {
        self.used.lock().remove(name);
        self.queues.lock().remove(name);
    }
}
