//! The `__consumer_offsets` log: where committed offsets become durable, and what a
//! restart replays to rebuild them.
//!
//! On a single node it is one partition of the storage crate's ordinary log, kept in
//! `<data>/groups/` rather than with the topics so that clients can neither produce to
//! nor fetch from it. In a cluster it is the replicated internal topic `__consumer_offsets`
//! (N partitions, created through the controller); a group's records live in partition
//! `crate::placement::partition_for(group)` and only that partition's leader writes them.
//! Each OffsetCommit becomes one record batch (built by `RecordBatchEncoder`); deletions
//! are tombstones (no value); a compaction snapshot is a run of ordinary commit records.
//! A write is acknowledged only once it is durable: fsynced by the group-commit syncer,
//! and in a cluster also past the high watermark (every ISR member has it, acks=all).
//!
//! Record layout (big endian), versioned so it can evolve:
//! key   = u8 version (1), u8 kind (1 = offset), str16 group, str16 topic, i32 partition
//! value = u8 version (1), i64 offset, i32 leader epoch, i64 commit time ms,
//!         i32 metadata length (-1 = null), metadata bytes
//! A transactional offset (TxnOffsetCommit, pending until its transaction's marker):
//! key   = u8 version (1), u8 kind (2), str16 group, str16 topic, i32 partition,
//!         i64 producer id, i16 producer epoch; value as an offset's
//! A transaction's end in this partition (the coordinator's commit or abort marker):
//! key   = u8 version (1), u8 kind (3), i64 producer id, i16 producer epoch
//! value = u8 version (1), u8 commit (1) or abort (0)

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use sluice_storage::{LogConfig, Partition, Syncer};

use crate::group::error::GroupError;
use crate::group::offsets::CommittedOffset;
use crate::group::OFFSETS_BATCH_BYTES_MAX;
use crate::internal_log::{encode_internal_batch, read_internal_log, InternalLog, LogWriteError};
use sluice_replication::Replica;

pub use sluice_meta::internal::OFFSETS_TOPIC;
const RECORD_VERSION: u8 = 1;
const KIND_OFFSET: u8 = 1;
const KIND_TXN_OFFSET: u8 = 2;
const KIND_TXN_END: u8 = 3;

/// One change to the committed offsets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OffsetRecord {
    Commit {
        group: String,
        topic: String,
        partition: i32,
        value: CommittedOffset,
    },
    Delete {
        group: String,
        topic: String,
        partition: i32,
    },
    /// An offset sent with `producer_id`'s open transaction, applied when it commits.
    TxnCommit {
        producer_id: i64,
        producer_epoch: i16,
        group: String,
        topic: String,
        partition: i32,
        value: CommittedOffset,
    },
    /// `producer_id`'s transaction ended (a marker): its offsets in this partition commit
    /// or are dropped.
    TxnEnd {
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
    },
}

impl From<LogWriteError> for GroupError {
    fn from(error: LogWriteError) -> GroupError {
        match error {
            LogWriteError::NotLeader => GroupError::NotCoordinator,
            LogWriteError::NotEnoughReplicas => GroupError::CoordinatorNotAvailable,
            LogWriteError::Storage => GroupError::Storage,
            LogWriteError::Timeout => GroupError::Timeout,
        }
    }
}

/// One partition of the offsets log, as the group coordinator writes and replays it.
pub struct OffsetsLog {
    log: InternalLog,
}

/// A write appended to the log, waiting until it is durable (fsynced, and in a cluster
/// replicated to the ISR).
pub struct PendingWrite {
    base_offset: i64,
    visible_at: i64,
    bytes: usize,
}

impl PendingWrite {
    pub fn base_offset(&self) -> i64 {
        self.base_offset
    }

    /// The log offset after this write: it is durable once the high watermark reaches it.
    pub fn visible_at(&self) -> i64 {
        self.visible_at
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl OffsetsLog {
    /// Single node: opens (recovering) the one partition under `dir`.
    pub fn open_local(dir: &Path, segment_bytes: u64) -> io::Result<OffsetsLog> {
        let config = LogConfig {
            segment_bytes,
            retention_ms: -1,
            retention_bytes: -1,
            max_message_bytes: OFFSETS_BATCH_BYTES_MAX,
            flush_messages: 1,
            ..LogConfig::default()
        };
        let partition = Arc::new(Partition::open(&dir.join(format!("{OFFSETS_TOPIC}-0")), config)?);
        Ok(OffsetsLog { log: InternalLog::local(partition) })
    }

    /// Cluster mode: a partition of the replicated offsets topic this node leads.
    pub fn replicated(replica: Arc<Replica>, leader_epoch: i32) -> OffsetsLog {
        OffsetsLog { log: InternalLog::replicated(replica, leader_epoch) }
    }

    pub fn partition(&self) -> &Arc<Partition> {
        self.log.partition()
    }

    /// Every record from the log start to the log end, in order, with its log offset. A
    /// new leader reads past its high watermark: everything it holds was either
    /// acknowledged or will be once its followers catch up, as Kafka's loader does.
    pub fn replay(&self) -> io::Result<Vec<(i64, OffsetRecord)>> {
        replay(self.log.partition())
    }

    /// Appends `records` as one batch and asks the syncer for an fsync.
    pub fn append(&self, records: &[OffsetRecord], syncer: &Syncer) -> Result<PendingWrite, GroupError> {
        assert!(!records.is_empty(), "an empty offsets write");
        let batch = encode_batch(records, sluice_storage::now_ms())?;
        if batch.len() > OFFSETS_BATCH_BYTES_MAX {
            return Err(GroupError::CommitTooLarge);
        }
        let appended = self.log.append(&batch, syncer)?;
        Ok(PendingWrite { base_offset: appended.base_offset, visible_at: appended.visible_at, bytes: batch.len() })
    }

    /// Waits until the write ending at `visible_at` is durable while this node still leads:
    /// NOT_COORDINATOR once it does not.
    pub async fn wait_durable(&self, visible_at: i64, timeout: Duration) -> Result<(), GroupError> {
        Ok(self.log.wait_durable(visible_at, timeout).await?)
    }

    pub fn close(&self) -> io::Result<()> {
        self.log.close()
    }
}

fn encode_batch(records: &[OffsetRecord], now_ms: i64) -> Result<Bytes, GroupError> {
    encode_internal_batch(records.iter().map(encode_record), now_ms).map_err(|error| {
        tracing::error!(%error, "could not encode an offsets batch");
        GroupError::CommitTooLarge
    })
}

fn put_str16(out: &mut BytesMut, text: &str) {
    let length = u16::try_from(text.len()).expect("names are bounded below 64 KiB");
    out.put_u16(length);
    out.put_slice(text.as_bytes());
}

fn encode_offset_value(value: &CommittedOffset) -> Bytes {
    let metadata = value.metadata.as_deref();
    let mut out = BytesMut::with_capacity(25 + metadata.map_or(0, str::len));
    out.put_u8(RECORD_VERSION);
    out.put_i64(value.offset);
    out.put_i32(value.leader_epoch);
    out.put_i64(value.commit_timestamp_ms);
    match metadata {
        Some(text) => {
            out.put_i32(text.len() as i32);
            out.put_slice(text.as_bytes());
        }
        None => out.put_i32(-1),
    }
    out.freeze()
}

fn encode_record(record: &OffsetRecord) -> (Bytes, Option<Bytes>) {
    let mut key = BytesMut::with_capacity(64);
    key.put_u8(RECORD_VERSION);
    match record {
        OffsetRecord::Commit { group, topic, partition, value } => {
            key.put_u8(KIND_OFFSET);
            put_str16(&mut key, group);
            put_str16(&mut key, topic);
            key.put_i32(*partition);
            (key.freeze(), Some(encode_offset_value(value)))
        }
        OffsetRecord::Delete { group, topic, partition } => {
            key.put_u8(KIND_OFFSET);
            put_str16(&mut key, group);
            put_str16(&mut key, topic);
            key.put_i32(*partition);
            (key.freeze(), None)
        }
        OffsetRecord::TxnCommit { producer_id, producer_epoch, group, topic, partition, value } => {
            key.put_u8(KIND_TXN_OFFSET);
            put_str16(&mut key, group);
            put_str16(&mut key, topic);
            key.put_i32(*partition);
            key.put_i64(*producer_id);
            key.put_i16(*producer_epoch);
            (key.freeze(), Some(encode_offset_value(value)))
        }
        OffsetRecord::TxnEnd { producer_id, producer_epoch, commit } => {
            key.put_u8(KIND_TXN_END);
            key.put_i64(*producer_id);
            key.put_i16(*producer_epoch);
            (key.freeze(), Some(Bytes::from(vec![RECORD_VERSION, u8::from(*commit)])))
        }
    }
}

/// Why a stored record could not be read back.
#[derive(Debug, thiserror::Error)]
enum DecodeError {
    #[error("record too short")]
    Truncated,
    #[error("unknown record version {0}")]
    Version(u8),
    #[error("unknown record kind {0}")]
    Kind(u8),
    #[error("name is not UTF-8")]
    Utf8,
    #[error("record has no key")]
    NoKey,
}

fn get_str16(input: &mut Bytes) -> Result<String, DecodeError> {
    if input.remaining() < 2 {
        return Err(DecodeError::Truncated);
    }
    let length = input.get_u16() as usize;
    if input.remaining() < length {
        return Err(DecodeError::Truncated);
    }
    String::from_utf8(input.split_to(length).to_vec()).map_err(|_| DecodeError::Utf8)
}

fn decode_offset_value(mut value: Bytes) -> Result<CommittedOffset, DecodeError> {
    if value.remaining() < 25 {
        return Err(DecodeError::Truncated);
    }
    let version = value.get_u8();
    if version != RECORD_VERSION {
        return Err(DecodeError::Version(version));
    }
    let offset = value.get_i64();
    let leader_epoch = value.get_i32();
    let commit_timestamp_ms = value.get_i64();
    let metadata = match value.get_i32() {
        length if length < 0 => None,
        length if value.remaining() >= length as usize => {
            Some(String::from_utf8(value.split_to(length as usize).to_vec()).map_err(|_| DecodeError::Utf8)?)
        }
        _ => return Err(DecodeError::Truncated),
    };
    Ok(CommittedOffset { offset, leader_epoch, metadata, commit_timestamp_ms })
}

fn decode_record(key: Option<Bytes>, value: Option<Bytes>) -> Result<OffsetRecord, DecodeError> {
    let mut key = key.ok_or(DecodeError::NoKey)?;
    if key.remaining() < 2 {
        return Err(DecodeError::Truncated);
    }
    let version = key.get_u8();
    if version != RECORD_VERSION {
        return Err(DecodeError::Version(version));
    }
    let kind = key.get_u8();
    if kind == KIND_TXN_END {
        if key.remaining() < 10 {
            return Err(DecodeError::Truncated);
        }
        let producer_id = key.get_i64();
        let producer_epoch = key.get_i16();
        let value = value.ok_or(DecodeError::Truncated)?;
        return match value.as_ref() {
            [RECORD_VERSION, commit] => Ok(OffsetRecord::TxnEnd { producer_id, producer_epoch, commit: *commit == 1 }),
            [version, ..] if *version != RECORD_VERSION => Err(DecodeError::Version(*version)),
            _ => Err(DecodeError::Truncated),
        };
    }
    if kind != KIND_OFFSET && kind != KIND_TXN_OFFSET {
        return Err(DecodeError::Kind(kind));
    }
    let group = get_str16(&mut key)?;
    let topic = get_str16(&mut key)?;
    if key.remaining() < 4 {
        return Err(DecodeError::Truncated);
    }
    let partition = key.get_i32();
    if kind == KIND_TXN_OFFSET {
        if key.remaining() < 10 {
            return Err(DecodeError::Truncated);
        }
        let producer_id = key.get_i64();
        let producer_epoch = key.get_i16();
        let value = decode_offset_value(value.ok_or(DecodeError::Truncated)?)?;
        return Ok(OffsetRecord::TxnCommit { producer_id, producer_epoch, group, topic, partition, value });
    }
    match value {
        None => Ok(OffsetRecord::Delete { group, topic, partition }),
        Some(value) => Ok(OffsetRecord::Commit { group, topic, partition, value: decode_offset_value(value)? }),
    }
}

/// Reads the whole log, from its start to its end.
fn replay(partition: &Partition) -> io::Result<Vec<(i64, OffsetRecord)>> {
    let mut records = Vec::new();
    read_internal_log(partition, OFFSETS_TOPIC, |offset, key, value| {
        match decode_record(key, value) {
            Ok(decoded) => records.push((offset, decoded)),
            Err(error) => tracing::warn!(offset, %error, "skipping unreadable offsets record"),
        }
        Ok(())
    })?;
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commit(group: &str, partition: i32, offset: i64, metadata: Option<&str>) -> OffsetRecord {
        OffsetRecord::Commit {
            group: group.into(),
            topic: "orders".into(),
            partition,
            value: CommittedOffset {
                offset,
                leader_epoch: 7,
                metadata: metadata.map(String::from),
                commit_timestamp_ms: 1_700_000_000_000,
            },
        }
    }

    #[test]
    fn records_round_trip_through_the_codec() {
        let records = [
            commit("g", 0, 42, Some("meta")),
            commit("g", 1, 0, None),
            OffsetRecord::Delete { group: "g".into(), topic: "orders".into(), partition: 2 },
            OffsetRecord::TxnCommit {
                producer_id: 4_000_000_001,
                producer_epoch: 3,
                group: "g".into(),
                topic: "orders".into(),
                partition: 1,
                value: CommittedOffset { offset: 5, leader_epoch: -1, metadata: None, commit_timestamp_ms: 9 },
            },
            OffsetRecord::TxnEnd { producer_id: 4_000_000_001, producer_epoch: 3, commit: true },
            OffsetRecord::TxnEnd { producer_id: 1, producer_epoch: 0, commit: false },
        ];
        for record in records {
            let (key, value) = encode_record(&record);
            assert_eq!(decode_record(Some(key), value).unwrap(), record);
        }
        assert!(matches!(decode_record(None, None), Err(DecodeError::NoKey)));
        assert!(matches!(decode_record(Some(Bytes::from_static(&[9, 1])), None), Err(DecodeError::Version(9))));
    }

    #[tokio::test]
    async fn appended_records_are_replayed_after_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let syncer = Syncer::start();
        {
            let log = OffsetsLog::open_local(dir.path(), 1 << 20).unwrap();
            assert!(log.replay().unwrap().is_empty());
            let first = log.append(&[commit("g", 0, 10, None), commit("g", 1, 11, Some("m"))], &syncer).unwrap();
            assert_eq!(first.base_offset(), 0);
            log.wait_durable(first.visible_at(), Duration::from_secs(5)).await.unwrap();
            let second = log
                .append(&[OffsetRecord::Delete { group: "g".into(), topic: "orders".into(), partition: 0 }], &syncer)
                .unwrap();
            assert_eq!(second.base_offset(), 2);
            log.wait_durable(second.visible_at(), Duration::from_secs(5)).await.unwrap();
            log.close().unwrap();
        }
        let replayed = OffsetsLog::open_local(dir.path(), 1 << 20).unwrap().replay().unwrap();
        let offsets: Vec<i64> = replayed.iter().map(|(offset, _)| *offset).collect();
        assert_eq!(offsets, vec![0, 1, 2]);
        assert_eq!(replayed[1].1, commit("g", 1, 11, Some("m")));
        assert!(matches!(&replayed[2].1, OffsetRecord::Delete { partition: 0, .. }));
        syncer.shutdown();
    }
}
