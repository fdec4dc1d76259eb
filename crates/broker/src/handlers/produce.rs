//! Produce: validate and append every partition's batch now (in request order, which
//! idempotent producers rely on), then wait until each batch is visible at the durability
//! the topic promises (fsynced by default) before answering.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse};
use kafka_protocol::ResponseError;
use sluice_storage::{AppendError, Partition};
use tokio::sync::watch;

use crate::{Broker, LEADER_EPOCH};

/// A partition whose append succeeded and whose answer waits for the high watermark.
struct PendingAck {
    topic_index: usize,
    partition_index: usize,
    visible: watch::Receiver<sluice_storage::Visible>,
    visible_at: i64,
}

pub(super) fn append(
    broker: &Arc<Broker>,
    request: ProduceRequest,
) -> impl Future<Output = Option<ProduceResponse>> + Send + 'static {
    let now_ms = sluice_storage::now_ms();
    let acks = request.acks;
    let timeout = Duration::from_millis(request.timeout_ms.max(0) as u64);
    let mut response = ProduceResponse::default();
    let mut pending = Vec::new();
    let invalid_acks = !matches!(acks, -1..=1);
    for (topic_index, topic) in request.topic_data.into_iter().enumerate() {
        let mut topic_response = TopicProduceResponse::default();
        topic_response.name = topic.name.clone();
        for (partition_index, data) in topic.partition_data.into_iter().enumerate() {
            let mut partition_response = PartitionProduceResponse::default();
            partition_response.index = data.index;
            partition_response.base_offset = -1;
            partition_response.log_append_time_ms = -1;
            let log = broker.partition(&topic.name, data.index);
            let result = match (&log, data.records) {
                _ if invalid_acks => Err(ResponseError::InvalidRequiredAcks),
                (None, _) => Err(ResponseError::UnknownTopicOrPartition),
                (Some(_), None) => Err(ResponseError::CorruptMessage),
                (Some(log), Some(records)) => append_one(broker, log, &records, now_ms, &topic.name, data.index),
            };
            match result {
                Ok((outcome_base, log_start, visible_at)) => {
                    partition_response.base_offset = outcome_base;
                    partition_response.log_start_offset = log_start;
                    let log = log.expect("append succeeded on an existing log");
                    pending.push(PendingAck { topic_index, partition_index, visible: log.subscribe(), visible_at });
                }
                Err(error) => partition_response.error_code = error.code(),
            }
            topic_response.partition_responses.push(partition_response);
        }
        response.responses.push(topic_response);
    }
    async move {
        if acks == 0 {
            return None;
        }
        for mut ack in pending {
            let reached =
                tokio::time::timeout(timeout, ack.visible.wait_for(|v| v.high_watermark >= ack.visible_at || v.failed))
                    .await;
            let error = match reached {
                Ok(Ok(visible)) if visible.high_watermark >= ack.visible_at => None,
                Ok(_) => Some(ResponseError::KafkaStorageError),
                Err(_) => Some(ResponseError::RequestTimedOut),
            };
            if let Some(error) = error {
                let partition = &mut response.responses[ack.topic_index].partition_responses[ack.partition_index];
                partition.error_code = error.code();
                partition.base_offset = -1;
            }
        }
        Some(response)
    }
}

/// Appends one batch; returns (base offset, log start offset, offset to wait for).
fn append_one(
    broker: &Broker,
    log: &Arc<Partition>,
    records: &bytes::Bytes,
    now_ms: i64,
    topic: &str,
    partition: i32,
) -> Result<(i64, i64, i64), ResponseError> {
    match log.append(records, LEADER_EPOCH, now_ms) {
        Ok(outcome) => {
            if outcome.needs_sync {
                broker.logs.syncer().schedule(log);
            }
            Ok((outcome.base_offset, outcome.log_start_offset, outcome.visible_at))
        }
        Err(error) => {
            let code = match &error {
                AppendError::Corrupt(_) => ResponseError::CorruptMessage,
                AppendError::TooLarge { .. } => ResponseError::MessageTooLarge,
                AppendError::InvalidRecord(_) => ResponseError::InvalidRecord,
                AppendError::OutOfOrderSequence => ResponseError::OutOfOrderSequenceNumber,
                AppendError::StaleProducerEpoch => ResponseError::InvalidProducerEpoch,
                AppendError::Storage(_) | AppendError::Offline => ResponseError::KafkaStorageError,
            };
            tracing::warn!(topic, partition, %error, "produce rejected");
            Err(code)
        }
    }
}
