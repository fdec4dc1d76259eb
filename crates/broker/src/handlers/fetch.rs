//! Fetch: read whole batches up to the high watermark, honouring the request's byte limits,
//! and long-poll (`max_wait_ms` / `min_bytes`) by waiting on the partitions' high-watermark
//! channels, so a fetch is answered as soon as a produce becomes visible.
//!
//! Fetch sessions (KIP-227) are declined by answering session id 0, which the protocol
//! defines as "no session": clients then send full fetch requests.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::{FetchRequest, FetchResponse, TopicName};
use kafka_protocol::ResponseError;
use sluice_storage::{Partition, ReadError};
use tokio::time::Instant;
use uuid::Uuid;

use crate::config::FETCH_WAIT_MS_MAX;
use crate::Broker;

/// First Fetch version that names topics by id.
const TOPIC_ID_VERSION: i16 = 13;

struct Target {
    topic_index: usize,
    partition: i32,
    fetch_offset: i64,
    partition_max_bytes: usize,
    log: Option<Arc<Partition>>,
    unknown_error: ResponseError,
}

pub(super) async fn handle(broker: &Arc<Broker>, request: FetchRequest, version: i16) -> FetchResponse {
    let deadline = Instant::now() + Duration::from_millis(request.max_wait_ms.clamp(0, FETCH_WAIT_MS_MAX) as u64);
    let min_bytes = request.min_bytes.max(0) as usize;
    let max_bytes = if request.max_bytes <= 0 { i32::MAX as usize } else { request.max_bytes as usize };
    let mut topics = Vec::new();
    let mut targets = Vec::new();
    for (topic_index, topic) in request.topics.iter().enumerate() {
        let name = if version >= TOPIC_ID_VERSION {
            broker.topics.name_for_id(&topic.topic_id)
        } else {
            Some(topic.topic.to_string())
        };
        let unknown_error = if version >= TOPIC_ID_VERSION {
            ResponseError::UnknownTopicId
        } else {
            ResponseError::UnknownTopicOrPartition
        };
        topics.push((topic.topic.clone(), topic.topic_id));
        for partition in &topic.partitions {
            targets.push(Target {
                topic_index,
                partition: partition.partition,
                fetch_offset: partition.fetch_offset,
                partition_max_bytes: partition.partition_max_bytes.max(0) as usize,
                log: name.as_deref().and_then(|n| broker.partition(n, partition.partition)),
                unknown_error,
            });
        }
    }
    loop {
        // Subscribe before reading so a produce landing in between still wakes us.
        let mut receivers: Vec<_> = targets.iter().filter_map(|t| t.log.as_ref().map(|log| log.subscribe())).collect();
        let (partitions, bytes, has_error) = read_all(&targets, max_bytes);
        if bytes >= min_bytes || has_error || receivers.is_empty() || Instant::now() >= deadline {
            return build_response(topics, partitions, version);
        }
        let any_changed = futures::future::select_all(receivers.iter_mut().map(|r| Box::pin(r.changed())));
        tokio::select! {
            _ = any_changed => {}
            () = tokio::time::sleep_until(deadline) => {}
        }
    }
}

/// One pass over all partitions: returns their data, the bytes read and whether any failed.
fn read_all(targets: &[Target], max_bytes: usize) -> (Vec<(usize, PartitionData)>, usize, bool) {
    let mut used = 0usize;
    let mut has_error = false;
    let mut partitions = Vec::with_capacity(targets.len());
    for target in targets {
        let mut data = PartitionData::default();
        data.partition_index = target.partition;
        data.high_watermark = -1;
        data.last_stable_offset = -1;
        data.log_start_offset = -1;
        match &target.log {
            None => data.error_code = target.unknown_error.code(),
            Some(log) => {
                let offsets = log.offsets();
                data.high_watermark = offsets.high_watermark;
                data.last_stable_offset = offsets.high_watermark;
                data.log_start_offset = offsets.log_start_offset;
                data.aborted_transactions = Some(Vec::new());
                let limit = target.partition_max_bytes.min(max_bytes.saturating_sub(used));
                let read = if limit == 0 && used > 0 {
                    Ok(Bytes::new())
                } else {
                    log.read(target.fetch_offset, limit, used == 0)
                };
                match read {
                    Ok(records) => {
                        used += records.len();
                        data.records = Some(records);
                    }
                    Err(ReadError::OffsetOutOfRange { .. }) => data.error_code = ResponseError::OffsetOutOfRange.code(),
                    Err(error) => {
                        tracing::warn!(%error, partition = target.partition, "fetch read failed");
                        data.error_code = ResponseError::KafkaStorageError.code();
                    }
                }
            }
        }
        has_error |= data.error_code != 0;
        partitions.push((target.topic_index, data));
    }
    (partitions, used, has_error)
}

fn build_response(
    topics: Vec<(TopicName, Uuid)>,
    partitions: Vec<(usize, PartitionData)>,
    version: i16,
) -> FetchResponse {
    let mut responses: Vec<FetchableTopicResponse> = topics
        .into_iter()
        .map(|(name, id)| {
            let mut topic = FetchableTopicResponse::default();
            if version >= TOPIC_ID_VERSION {
                topic.topic_id = id;
            } else {
                topic.topic = name;
            }
            topic
        })
        .collect();
    for (topic_index, data) in partitions {
        responses[topic_index].partitions.push(data);
    }
    let mut response = FetchResponse::default();
    response.responses = responses;
    response
}
