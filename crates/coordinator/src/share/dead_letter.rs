//! Dead letters: a share group with `errors.deadletterqueue.topic.name` set gets a copy of
//! every record it archives undelivered (rejected, or delivered
//! `share.delivery.count.limit` times) in that topic, with headers saying why.
//!
//! Atomic with the archival: the archival and the intent to copy (the share-partition's
//! `dead_letters`) are one durable write of the share state; the copy is then appended to
//! the dead-letter topic and, once durable there, the intent is dropped. A crash in between
//! copies the record again on restart: a dead letter is never lost, and a duplicate is
//! recognisable by its headers (group, topic, partition, offset). The RabbitMQ equivalent
//! is a quorum queue's `x-dead-letter-exchange` with `x-delivery-limit`.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions};
use sluice_storage::{Partition, ReadLimit, ReadMode};

use super::partition::DeadRecord;
use super::{PartitionKey, ShareCoordinator};
use crate::CoordinatorHost;

/// The group config naming a share group's dead-letter topic (KIP-1191's name).
pub const CONFIG_DEAD_LETTER_TOPIC: &str = "errors.deadletterqueue.topic.name";
/// How long a dead-letter copy may take to become durable before it is tried again.
const DEAD_LETTER_DURABLE_TIMEOUT_MS: u64 = 30_000;
/// Bytes read to find one archived record.
const DEAD_LETTER_READ_BYTES: usize = 1024 * 1024;

/// Copies the pending dead letters of `key` to its group's dead-letter topic, then drops
/// them from the share state. Leaves them pending (to be tried again by the upkeep) when
/// the topic does not exist or the write fails.
pub async fn flush(host: &dyn CoordinatorHost, shares: &ShareCoordinator, key: PartitionKey) {
    let Some((dead, target_topic)) = shares.pending_dead_letters(&key) else { return };
    let (group, topic, partition) = key.clone();
    let Some(source) = host.partition(&topic, partition) else {
        // The topic is gone: nothing left to copy.
        shares.dead_letters_copied(&key, &dead);
        return;
    };
    let Some((_, target_partitions)) = host.topics().catalog().get(&target_topic) else {
        tracing::warn!(group, topic = target_topic, "dead-letter topic does not exist; will retry");
        return;
    };
    // The partition of the dead-letter topic: the source's number if this node leads it,
    // else any this node leads (in a cluster a copy is appended only where it is led).
    let preferred = partition % target_partitions.max(1);
    let led = std::iter::once(preferred)
        .chain(0..target_partitions)
        .find_map(|p| Some((host.partition(&target_topic, p)?, super::leader_epoch(host, &target_topic, p)?)));
    let Some((target, target_epoch)) = led else {
        tracing::debug!(group, topic = target_topic, "no partition of the dead-letter topic is led here; will retry");
        return;
    };
    let built = {
        let dead = dead.clone();
        let key = key.clone();
        tokio::task::spawn_blocking(move || build_batch(&source, &key, &dead)).await
    };
    let batch = match built {
        Ok(Ok(Some(batch))) => batch,
        Ok(Ok(None)) => {
            shares.dead_letters_copied(&key, &dead);
            return;
        }
        Ok(Err(error)) => {
            tracing::warn!(group, topic, %error, "could not read records for the dead-letter topic; will retry");
            return;
        }
        Err(_) => return,
    };
    let outcome = match target.append(&batch, target_epoch, sluice_storage::now_ms()) {
        Ok(outcome) => outcome,
        Err(error) => {
            tracing::warn!(group, topic = target_topic, %error, "dead-letter append failed; will retry");
            return;
        }
    };
    if outcome.needs_sync {
        host.logs().syncer().schedule(&target);
    }
    let mut visible = target.subscribe();
    let durable = tokio::time::timeout(
        Duration::from_millis(DEAD_LETTER_DURABLE_TIMEOUT_MS),
        visible.wait_for(|v| v.high_watermark >= outcome.visible_at || v.failed),
    )
    .await;
    if durable.is_ok_and(|v| v.is_ok_and(|v| v.high_watermark >= outcome.visible_at)) {
        tracing::debug!(group, topic, records = dead.len(), "dead letters copied");
        shares.dead_letters_copied(&key, &dead);
    }
}

/// One batch holding a copy of each dead record still in the log, with its key, value,
/// timestamp and headers, and headers naming where it came from and why.
fn build_batch(source: &Partition, key: &PartitionKey, dead: &[DeadRecord]) -> Result<Option<Bytes>, String> {
    let (group, topic, partition) = key;
    let mut records = Vec::new();
    for &(offset, reason, delivery_count) in dead {
        let mut bytes = source
            .read_until(offset, DEAD_LETTER_READ_BYTES, true, ReadLimit::HighWatermark, ReadMode::MayBlock)
            .map_err(|e| e.to_string())?;
        let sets = RecordBatchDecoder::decode_all(&mut bytes).map_err(|e| e.to_string())?;
        let Some(original) = sets.into_iter().flat_map(|set| set.records).find(|r| r.offset == offset) else {
            // Deleted by retention or compaction meanwhile.
            continue;
        };
        let index = records.len() as i64;
        let mut headers = original.headers.clone();
        let mut header = |name: &'static str, value: String| {
            headers.insert(StrBytes::from_static_str(name), Some(Bytes::from(value)));
        };
        header("sluice.dlq.reason", reason.name().to_string());
        header("sluice.dlq.group", group.clone());
        header("sluice.dlq.topic", topic.clone());
        header("sluice.dlq.partition", partition.to_string());
        header("sluice.dlq.offset", offset.to_string());
        header("sluice.dlq.delivery.count", delivery_count.to_string());
        records.push(Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: sluice_meta::LEADER_EPOCH,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: original.timestamp_type,
            offset: index,
            // One batch needs offset - sequence to stay constant (see CRATES.md).
            sequence: index as i32,
            timestamp: original.timestamp,
            key: original.key,
            value: original.value,
            headers,
        });
    }
    if records.is_empty() {
        return Ok(None);
    }
    let mut buffer = BytesMut::new();
    let options = RecordEncodeOptions { version: 2, compression: Compression::None };
    RecordBatchEncoder::encode(&mut buffer, &records, &options).map_err(|e| e.to_string())?;
    Ok(Some(buffer.freeze()))
}
