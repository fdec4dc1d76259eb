//! Produce: validate and append every partition's batch now (in request order, which
//! idempotent producers rely on), then wait until each batch is visible at the durability
//! the topic promises (fsynced by default) before answering.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::messages::produce_response::{
    BatchIndexAndErrorMessage, PartitionProduceResponse, TopicProduceResponse,
};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use sluice_security::acl;
use sluice_storage::{AppendError, Partition};
use tokio::sync::watch;

use crate::{Broker, LEADER_EPOCH};
use sluice_replication::{NotServed, Replica};

/// A partition whose append succeeded and whose answer waits until it is durable enough.
struct PendingAck {
    topic_index: usize,
    partition_index: usize,
    until: AckWhen,
    visible_at: i64,
    /// In a cluster: the replica and the leader epoch the batch was appended under. The
    /// answer is a success only if this node still leads at that epoch once the offset is
    /// visible: a leader that lost its leadership meanwhile may have truncated the batch, and
    /// its high watermark, now moved by the new leader, says nothing about it.
    appended_as: Option<(Arc<Replica>, i32)>,
    /// acks=all on a topic whose level waits for replicas: once visible, the ISR must still
    /// have `min.insync.replicas` members, else NOT_ENOUGH_REPLICAS_AFTER_APPEND (Kafka's rule:
    /// the ISR may have shrunk while the write waited).
    checks_min_insync: bool,
}

/// What a produce waits for: the high watermark (replicated or fsynced, per the topic),
/// or only this node's locally durable end (acks=1 on a replicated partition).
enum AckWhen {
    Visible(watch::Receiver<sluice_storage::Visible>),
    LocallyDurable(watch::Receiver<sluice_storage::Progress>),
}

pub(super) fn append(
    broker: &Arc<Broker>,
    request: ProduceRequest,
    session: &super::ClientSession,
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
        let mut topic_bytes = 0u64;
        let mut topic_records = 0u64;
        let writable = broker.authorized(session, acl::OP_WRITE, acl::RESOURCE_TOPIC, &topic.name);
        for (partition_index, data) in topic.partition_data.into_iter().enumerate() {
            let mut partition_response = PartitionProduceResponse::default();
            partition_response.index = data.index;
            partition_response.base_offset = -1;
            partition_response.log_append_time_ms = -1;
            let target = leader_log(broker, &topic.name, data.index, acks);
            let result = match (&target, data.records) {
                _ if !writable => Err(ProduceRefusal::from(ResponseError::TopicAuthorizationFailed)),
                _ if invalid_acks => Err(ProduceRefusal::from(ResponseError::InvalidRequiredAcks)),
                (Err(error), _) => Err(ProduceRefusal::from(*error)),
                (Ok(_), None) => Err(ProduceRefusal::from(ResponseError::CorruptMessage)),
                (Ok(leader), Some(records)) => {
                    let append =
                        || append_one(broker, &leader.log, leader.epoch, &records, now_ms, &topic.name, data.index);
                    let appended = append_transactional(broker, &records, &topic.name, data.index, append);
                    if let Some(outcome) = appended.as_ref().ok().filter(|outcome| !outcome.duplicate) {
                        topic_bytes += records.len() as u64;
                        topic_records += (outcome.visible_at - outcome.base_offset).max(0) as u64;
                    }
                    appended
                }
            };
            match result {
                Ok(outcome) => {
                    partition_response.base_offset = outcome.base_offset;
                    partition_response.log_start_offset = outcome.log_start_offset;
                    partition_response.log_append_time_ms = outcome.log_append_time_ms.unwrap_or(-1);
                    let visible_at = outcome.visible_at;
                    let leader = target.expect("append succeeded on an existing log");
                    let until = if leader.waits_for_high_watermark {
                        AckWhen::Visible(leader.log.subscribe())
                    } else {
                        AckWhen::LocallyDurable(leader.log.progress())
                    };
                    let appended_as = leader.replica.map(|replica| (replica, leader.epoch));
                    let checks_min_insync = leader.waits_for_replicas;
                    pending.push(PendingAck {
                        topic_index,
                        partition_index,
                        until,
                        visible_at,
                        appended_as,
                        checks_min_insync,
                    });
                }
                Err(refusal) => {
                    partition_response.error_code = refusal.error.code();
                    partition_response.error_message = refusal.message.map(StrBytes::from_string);
                    partition_response.record_errors = refusal
                        .record_errors
                        .into_iter()
                        .map(|(index, message)| {
                            let mut record_error = BatchIndexAndErrorMessage::default();
                            record_error.batch_index = index;
                            record_error.batch_index_error_message = Some(StrBytes::from_string(message));
                            record_error
                        })
                        .collect();
                }
            }
            topic_response.partition_responses.push(partition_response);
        }
        broker.metrics.produced(&topic.name, topic_bytes, topic_records);
        response.responses.push(topic_response);
    }
    async move {
        if acks == 0 {
            return None;
        }
        // One deadline for the whole request, as Kafka's `timeout_ms` means.
        let deadline = tokio::time::Instant::now() + timeout;
        for ack in pending {
            let (topic_index, partition_index) = (ack.topic_index, ack.partition_index);
            let error = match tokio::time::timeout_at(deadline, ack.settle()).await {
                Ok(outcome) => outcome.err(),
                Err(_) => Some(ResponseError::RequestTimedOut),
            };
            if let Some(error) = error {
                let partition = &mut response.responses[topic_index].partition_responses[partition_index];
                partition.error_code = error.code();
                partition.base_offset = -1;
                partition.log_append_time_ms = -1;
            }
        }
        Some(response)
    }
}

impl PendingAck {
    /// Waits until the batch is as durable as promised; the error to answer if it cannot be.
    async fn settle(self) -> Result<(), ResponseError> {
        let at = self.visible_at;
        let reached = match self.until {
            AckWhen::Visible(mut visible) => {
                let visible = visible.wait_for(|v| v.high_watermark >= at || v.failed);
                match &self.appended_as {
                    None => visible.await.is_ok_and(|v| v.high_watermark >= at),
                    Some((replica, epoch)) => tokio::select! {
                        biased;
                        v = visible => v.is_ok_and(|v| v.high_watermark >= at),
                        () = replica.leadership_lost(*epoch) => return Err(ResponseError::NotLeaderOrFollower),
                        // Below min.insync.replicas the high watermark stands still: answer now.
                        () = replica.commit_stalled(*epoch), if self.checks_min_insync => {
                            return Err(if replica.leader_epoch() == Some(*epoch) {
                                ResponseError::NotEnoughReplicasAfterAppend
                            } else {
                                ResponseError::NotLeaderOrFollower
                            });
                        }
                    },
                }
            }
            AckWhen::LocallyDurable(mut progress) => progress.wait_for(|p| p.local_end >= at).await.is_ok(),
        };
        if !reached {
            return Err(ResponseError::KafkaStorageError);
        }
        match &self.appended_as {
            Some((replica, epoch)) if replica.leader_epoch() != Some(*epoch) => Err(ResponseError::NotLeaderOrFollower),
            Some((replica, _)) if self.checks_min_insync && replica.isr_below_min_insync() => {
                Err(ResponseError::NotEnoughReplicasAfterAppend)
            }
            _ => Ok(()),
        }
    }
}

/// Where a produce appends and what its answer waits for.
struct LeaderLog {
    log: Arc<Partition>,
    /// The leader epoch to stamp (0 on a single node).
    epoch: i32,
    /// The answer waits for the high watermark (else for the locally durable end).
    waits_for_high_watermark: bool,
    /// acks=all on a topic whose level waits for the ISR.
    waits_for_replicas: bool,
    /// In a cluster, the replica.
    replica: Option<Arc<Replica>>,
}

/// The log to append to; on a single node every partition is led here at epoch 0.
fn leader_log(broker: &Broker, topic: &str, partition: i32, acks: i16) -> Result<LeaderLog, ResponseError> {
    if sluice_meta::topics::is_internal(topic) {
        // Only the coordinators write their internal topics (Kafka: "Cannot append to
        // internal topic").
        return Err(ResponseError::InvalidTopicException);
    }
    if broker.replicas.is_none() {
        let log = broker.partition(topic, partition).ok_or(ResponseError::UnknownTopicOrPartition)?;
        return Ok(LeaderLog {
            log,
            epoch: LEADER_EPOCH,
            waits_for_high_watermark: true,
            waits_for_replicas: false,
            replica: None,
        });
    }
    let replica = broker.hosted_replica(topic, partition, ResponseError::UnknownTopicOrPartition)?;
    let write = replica.begin_write(acks).map_err(NotServed::error)?;
    Ok(LeaderLog {
        log: replica.log.clone(),
        epoch: write.leader_epoch,
        // Levels 3 and 4 (and acks=1) answer once the leader holds the batch at the topic's
        // local durability; the high watermark, what consumers see, still waits for the ISR.
        waits_for_high_watermark: write.waits_for_replicas,
        waits_for_replicas: write.waits_for_replicas,
        replica: Some(replica),
    })
}

/// A transactional batch goes only to a partition its producer's open transaction added
/// (AddPartitionsToTxn), as Kafka checks since KIP-890: otherwise a stray or late batch
/// would hold the partition's last stable offset back with no transaction to end it.
fn append_transactional(
    broker: &Broker,
    records: &bytes::Bytes,
    topic: &str,
    partition: i32,
    append: impl FnOnce() -> Result<sluice_storage::AppendOutcome, ProduceRefusal>,
) -> Result<sluice_storage::AppendOutcome, ProduceRefusal> {
    let transactional = sluice_storage::batch::BatchHeader::parse(records).ok().filter(|h| h.is_transactional());
    let Some(header) = transactional else { return append() };
    let clustered = broker.replicas.is_some();
    broker.transactions.append_verified(
        header.producer_id,
        header.producer_epoch,
        topic,
        partition,
        clustered,
        append,
    )?
}

/// Why a partition's batch was refused: the error code, and for errors about the batch's
/// content a message and the records at fault (KIP-467: `record_errors` name records by
/// their index in the batch, so clients fail only what was wrong).
struct ProduceRefusal {
    error: ResponseError,
    message: Option<String>,
    record_errors: Vec<(i32, String)>,
}

impl From<ResponseError> for ProduceRefusal {
    fn from(error: ResponseError) -> ProduceRefusal {
        ProduceRefusal { error, message: None, record_errors: Vec::new() }
    }
}

/// Indexes (within the batch) and messages of the records whose timestamp is outside
/// `[earliest_ms, latest_ms]`. Only a refused batch is decoded, never an accepted one; one
/// that cannot be decoded is named as a whole.
fn records_out_of_time(batch: &bytes::Bytes, earliest_ms: i64, latest_ms: i64) -> Vec<(i32, String)> {
    let out_of_range =
        |timestamp: i64| format!("timestamp {timestamp} is out of range: must be within [{earliest_ms}, {latest_ms}]");
    let mut bytes = batch.clone();
    match kafka_protocol::records::RecordBatchDecoder::decode(&mut bytes) {
        Ok(set) => set
            .records
            .iter()
            .enumerate()
            .filter(|(_, record)| record.timestamp < earliest_ms || record.timestamp > latest_ms)
            .map(|(index, record)| (index as i32, out_of_range(record.timestamp)))
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// Tests only: a produce to the topic this names panics once its batch is appended, before
/// it is acknowledged (the panic policy's test, `server::stop_on_panic`).
const PANIC_ON_PRODUCE_ENV: &str = "SLUICE_UNSAFE_PANIC_ON_PRODUCE_FOR_TESTS";

fn panics_for_tests(topic: &str) -> bool {
    static TOPIC: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    TOPIC.get_or_init(|| std::env::var(PANIC_ON_PRODUCE_ENV).ok()).as_deref() == Some(topic)
}

/// Runs `work`, which waits for the disk (a segment roll the append must finish: fsyncs,
/// renames), with this runtime worker's other tasks handed to another thread meanwhile
/// (tokio's `block_in_place`), so the connections it serves do not wait for this
/// partition's disk. A current-thread runtime (tests) runs it in place.
fn wait_off_the_runtime(work: &mut dyn FnMut() -> std::io::Result<bool>) -> std::io::Result<bool> {
    match tokio::runtime::Handle::try_current().map(|runtime| runtime.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(work),
        _ => work(),
    }
}

/// Appends one batch and asks for its fsync if the topic fsyncs before acknowledging.
fn append_one(
    broker: &Broker,
    log: &Arc<Partition>,
    leader_epoch: i32,
    records: &bytes::Bytes,
    now_ms: i64,
    topic: &str,
    partition: i32,
) -> Result<sluice_storage::AppendOutcome, ProduceRefusal> {
    match log.append_waiting_in(records, leader_epoch, now_ms, wait_off_the_runtime) {
        Ok(outcome) => {
            if outcome.needs_sync {
                broker.logs.syncer().schedule(log);
            }
            assert!(!panics_for_tests(topic), "{PANIC_ON_PRODUCE_ENV} names topic {topic}");
            Ok(outcome)
        }
        Err(error) => {
            let code = match &error {
                AppendError::Corrupt(_) => ResponseError::CorruptMessage,
                AppendError::TooLarge { .. } => ResponseError::MessageTooLarge,
                AppendError::InvalidRecord(_) | AppendError::KeylessRecords(_) => ResponseError::InvalidRecord,
                AppendError::OutOfOrderSequence => ResponseError::OutOfOrderSequenceNumber,
                AppendError::StaleProducerEpoch => ResponseError::InvalidProducerEpoch,
                AppendError::InvalidTimestamp { .. } => ResponseError::InvalidTimestamp,
                AppendError::Storage(_) | AppendError::Offline => ResponseError::KafkaStorageError,
            };
            tracing::warn!(topic, partition, %error, "produce rejected");
            let record_errors = match error {
                AppendError::InvalidTimestamp { earliest_ms, latest_ms, .. } => {
                    records_out_of_time(records, earliest_ms, latest_ms)
                }
                AppendError::KeylessRecords(ref indexes) => indexes
                    .iter()
                    .map(|&index| (index, "Compacted topic cannot accept message without key.".to_string()))
                    .collect(),
                _ => Vec::new(),
            };
            let message = match error {
                AppendError::Storage(_) | AppendError::Offline => None,
                _ => Some(error.to_string()),
            };
            Err(ProduceRefusal { error: code, message, record_errors })
        }
    }
}
