//! ListOffsets (earliest, latest, by timestamp, max timestamp) and DeleteRecords.

use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::messages::delete_records_response::{DeleteRecordsPartitionResult, DeleteRecordsTopicResult};
use kafka_protocol::messages::list_offsets_response::{ListOffsetsPartitionResponse, ListOffsetsTopicResponse};
use kafka_protocol::messages::{DeleteRecordsRequest, DeleteRecordsResponse, ListOffsetsRequest, ListOffsetsResponse};
use kafka_protocol::records::RecordBatchDecoder;
use kafka_protocol::ResponseError;
use sluice_storage::{Partition, ReadError};

use crate::{Broker, LEADER_EPOCH};

const LATEST_TIMESTAMP: i64 = -1;
const EARLIEST_TIMESTAMP: i64 = -2;
const MAX_TIMESTAMP: i64 = -3;
const EARLIEST_LOCAL_TIMESTAMP: i64 = -4;
const LATEST_TIERED_TIMESTAMP: i64 = -5;
/// ListOffsets v4 added the leader epoch to the response.
const LEADER_EPOCH_VERSION: i16 = 4;

pub(super) async fn list_offsets(
    broker: &Arc<Broker>,
    request: ListOffsetsRequest,
    version: i16,
) -> ListOffsetsResponse {
    let mut response = ListOffsetsResponse::default();
    let read_committed = request.isolation_level == 1;
    for topic in request.topics {
        let mut topic_response = ListOffsetsTopicResponse::default();
        topic_response.name = topic.name.clone();
        for partition in topic.partitions {
            let mut result = ListOffsetsPartitionResponse::default();
            result.partition_index = partition.partition_index;
            result.timestamp = -1;
            result.offset = -1;
            let unsettled = partition.timestamp == LATEST_TIMESTAMP
                && broker.replicas.as_ref().is_some_and(|replicas| {
                    replicas.get(&topic.name, partition.partition_index).is_some_and(|r| !r.high_watermark_settled())
                });
            match broker.led_partition(&topic.name, partition.partition_index) {
                Err(error) => result.error_code = error.code(),
                // A new leader whose high watermark has not caught up with what the previous
                // leader acknowledged: the client retries (KIP-207).
                Ok(_) if unsettled => result.error_code = ResponseError::OffsetNotAvailable.code(),
                Ok(log) => match lookup(
                    broker,
                    topic.name.as_str(),
                    partition.partition_index,
                    &log,
                    partition.timestamp,
                    read_committed,
                )
                .await
                {
                    Ok((offset, timestamp)) => {
                        result.offset = offset;
                        result.timestamp = timestamp;
                        if version >= LEADER_EPOCH_VERSION && offset >= 0 {
                            result.leader_epoch = LEADER_EPOCH;
                        }
                    }
                    Err(error) => {
                        tracing::warn!(%error, topic = %topic.name.as_str(), "list offsets failed");
                        result.error_code = ResponseError::KafkaStorageError.code();
                    }
                },
            }
            topic_response.partitions.push(result);
        }
        response.topics.push(topic_response);
    }
    response
}

/// (offset, timestamp) for a ListOffsets query; (-1, -1) when no record matches. The
/// latest offset of a read_committed client is the last stable offset. On a tiered topic
/// the earliest offset and timestamp lookups cover the remote part too (KIP-405's
/// EARLIEST_LOCAL and LATEST_TIERED name the local start and the remote end).
async fn lookup(
    broker: &Broker,
    topic: &str,
    partition: i32,
    log: &Arc<Partition>,
    query: i64,
    read_committed: bool,
) -> Result<(i64, i64), ReadError> {
    let offsets = log.offsets();
    match query {
        LATEST_TIMESTAMP if read_committed => Ok((offsets.last_stable_offset, -1)),
        LATEST_TIMESTAMP => Ok((offsets.high_watermark, -1)),
        EARLIEST_TIMESTAMP => Ok((offsets.log_start_offset, -1)),
        EARLIEST_LOCAL_TIMESTAMP => Ok((offsets.local_log_start_offset, -1)),
        LATEST_TIERED_TIMESTAMP => Ok(match log.remote_tier() {
            Some((_, end)) if end > 0 => (end - 1, -1),
            _ => (-1, -1),
        }),
        MAX_TIMESTAMP => Ok(match on_disk(log, |log| log.batch_with_max_timestamp()).await? {
            None => (-1, -1),
            Some(batch) => record_matching(batch, |records| records.iter().max_by_key(|(_, ts)| *ts).copied()),
        }),
        timestamp if timestamp >= 0 => {
            let remote = match (&broker.tiered, log.remote_tier()) {
                (Some(tiered), Some(_)) => match broker.topics.get(topic) {
                    Some(topic) => tiered
                        .batch_for_timestamp(&topic, partition, timestamp)
                        .await
                        .map_err(|e| ReadError::Storage(std::io::Error::other(e.to_string())))?,
                    None => None,
                },
                _ => None,
            };
            let batch = match remote {
                Some(batch) => Some(batch),
                None => on_disk(log, move |log| log.batch_for_timestamp(timestamp)).await?,
            };
            Ok(match batch {
                None => (-1, -1),
                Some(batch) => record_matching(batch, |records| {
                    records.iter().find(|(offset, ts)| *ts >= timestamp && *offset >= offsets.log_start_offset).copied()
                }),
            })
        }
        _ => Ok((-1, -1)),
    }
}

/// Decodes one stored batch (decompressing if needed) and picks a record from its
/// (offset, timestamp) pairs. Records sit inside the batch, so this is the one place the
/// broker looks inside a batch. In a LogAppendTime batch every record's timestamp is the batch's max timestamp (the
/// append time), whatever the producer wrote in the records.
fn record_matching(mut batch: Bytes, pick: impl FnOnce(&[(i64, i64)]) -> Option<(i64, i64)>) -> (i64, i64) {
    let append_time = sluice_storage::batch::BatchHeader::parse(&batch)
        .ok()
        .and_then(|header| header.is_log_append_time().then_some(header.max_timestamp));
    match RecordBatchDecoder::decode(&mut batch) {
        Ok(set) => {
            let pairs: Vec<(i64, i64)> =
                set.records.iter().map(|r| (r.offset, append_time.unwrap_or(r.timestamp))).collect();
            pick(&pairs).unwrap_or((-1, -1))
        }
        Err(error) => {
            tracing::warn!(%error, "stored batch could not be decoded for a timestamp lookup");
            (-1, -1)
        }
    }
}

pub(super) async fn delete_records(broker: &Arc<Broker>, request: DeleteRecordsRequest) -> DeleteRecordsResponse {
    let mut response = DeleteRecordsResponse::default();
    for topic in request.topics {
        let mut topic_result = DeleteRecordsTopicResult::default();
        topic_result.name = topic.name.clone();
        for partition in topic.partitions {
            let mut result = DeleteRecordsPartitionResult::default();
            result.partition_index = partition.partition_index;
            result.low_watermark = -1;
            // Kafka's rule: the committed offsets are not for clients to delete.
            let internal = sluice_meta::topics::is_internal(topic.name.as_str());
            match broker.partition(&topic.name, partition.partition_index) {
                _ if internal => result.error_code = ResponseError::InvalidTopicException.code(),
                None => result.error_code = ResponseError::UnknownTopicOrPartition.code(),
                Some(log) => {
                    let target = if partition.offset == -1 { log.offsets().high_watermark } else { partition.offset };
                    match delete_records_before(broker, topic.name.as_str(), partition.partition_index, &log, target)
                        .await
                    {
                        Ok(low_watermark) => result.low_watermark = low_watermark,
                        Err(ReadError::OffsetOutOfRange { .. }) => {
                            result.error_code = ResponseError::OffsetOutOfRange.code()
                        }
                        Err(error) => {
                            tracing::warn!(%error, "delete records failed");
                            result.error_code = ResponseError::KafkaStorageError.code();
                        }
                    }
                }
            }
            topic_result.partitions.push(result);
        }
        response.topics.push(topic_result);
    }
    response
}

/// DeleteRecords on one partition: on a tiered topic the remote start moves first (made
/// durable), then the local log's; a crash between leaves the request undone where it
/// matters (the first readable offset is the lower one), never half-applied upward.
async fn delete_records_before(
    broker: &Broker,
    topic: &str,
    partition: i32,
    log: &Arc<Partition>,
    target: i64,
) -> Result<i64, ReadError> {
    let offsets = log.offsets();
    if target < 0 || target > offsets.high_watermark {
        return Err(ReadError::OffsetOutOfRange {
            offset: target,
            log_start_offset: offsets.log_start_offset,
            log_end_offset: offsets.high_watermark,
        });
    }
    if let (Some(tiered), Some(_)) = (&broker.tiered, log.remote_tier()) {
        let led = broker.led_log(topic, partition);
        if let (Some(meta), Some((_, epoch))) = (broker.topics.get(topic), led) {
            tiered.delete_records_before(&meta, partition, epoch, log, target).await?;
        }
    }
    let local_start = target.max(offsets.local_log_start_offset);
    on_disk(log, move |log| log.delete_records_before(local_start)).await?;
    Ok(log.first_readable_offset())
}

/// [`super::on_blocking_pool`] for a partition's disk work: a timestamp lookup's scan (from
/// the disk when cold), DeleteRecords' log-start file and segment deletions.
async fn on_disk<T: Send + 'static>(
    log: &Arc<Partition>,
    work: impl FnOnce(&Partition) -> Result<T, ReadError> + Send + 'static,
) -> Result<T, ReadError> {
    let log = log.clone();
    super::on_blocking_pool(move || work(&log))
        .await
        .unwrap_or_else(|| Err(ReadError::Storage(std::io::Error::other("the broker is shutting down"))))
}
