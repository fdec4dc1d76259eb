//! The internal log every coordinator writes its state through: one partition of
//! `__consumer_offsets` (the group coordinator), `__transaction_state` (the transaction
//! coordinator) or `__share_group_state` (the share coordinator). On a single node it is a
//! local partition of the storage crate's ordinary log; in a cluster the partition of the
//! replicated internal topic this node leads. One write path for both, so the durability
//! rule lives here only: a write counts once fsynced and, in a cluster, once the
//! partition's high watermark (its ISR, acks=all) passes it while this node still leads at
//! the epoch it loaded the partition at.
//!
//! The batch format (uncompressed keyed records, a tombstone without a value) and the
//! replay from the log's start are shared too; what a key and a value mean is each
//! coordinator's.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use sluice_replication::{NotServed, Replica};
use sluice_storage::{Partition, Syncer};

/// Bytes read per step while replaying.
const REPLAY_READ_BYTES: usize = 4 * 1024 * 1024;

/// Who may write to an internal log partition, and at which leader epoch.
enum Writer {
    /// Single node: the partition is this node's alone, at `sluice_meta::LEADER_EPOCH`.
    Local,
    /// Cluster mode: this node leads `replica` at `leader_epoch`; a write counts once the
    /// partition's high watermark (its ISR, acks=all) passes it, while still leading.
    Leader { replica: Arc<Replica>, leader_epoch: i32 },
}

/// Why an internal log write did not become durable (each coordinator maps it to its
/// own errors).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogWriteError {
    /// This node no longer leads the partition at the epoch it loaded it at.
    NotLeader,
    /// Fewer in-sync replicas than `min.insync.replicas`.
    NotEnoughReplicas,
    Storage,
    Timeout,
}

/// A partition of a coordinator's internal log (`__consumer_offsets`,
/// `__transaction_state`) as its coordinator writes and replays it: local on a single
/// node, the led replica in a cluster. One write path for both, so the durability rule
/// (fsynced, and in a cluster past the high watermark) lives here only.
pub struct InternalLog {
    partition: Arc<Partition>,
    writer: Writer,
}

/// Where an appended batch landed: durable once the high watermark reaches `visible_at`.
#[derive(Debug, Clone, Copy)]
pub struct Appended {
    pub base_offset: i64,
    pub visible_at: i64,
}

impl InternalLog {
    /// Single node: `partition` is this node's alone.
    pub fn local(partition: Arc<Partition>) -> InternalLog {
        InternalLog { partition, writer: Writer::Local }
    }

    /// Cluster mode: a partition of a replicated internal topic this node leads.
    pub fn replicated(replica: Arc<Replica>, leader_epoch: i32) -> InternalLog {
        InternalLog { partition: replica.log.clone(), writer: Writer::Leader { replica, leader_epoch } }
    }

    pub fn partition(&self) -> &Arc<Partition> {
        &self.partition
    }

    /// The leader epoch this log is written at (Kafka's coordinator epoch).
    pub fn leader_epoch(&self) -> i32 {
        match &self.writer {
            Writer::Local => sluice_meta::LEADER_EPOCH,
            Writer::Leader { leader_epoch, .. } => *leader_epoch,
        }
    }

    /// False once this node no longer leads the partition at the epoch it loaded it at.
    pub fn is_current(&self) -> bool {
        match &self.writer {
            Writer::Local => true,
            Writer::Leader { replica, leader_epoch } => replica.leader_epoch() == Some(*leader_epoch),
        }
    }

    /// Appends one encoded batch and asks the syncer for an fsync.
    pub fn append(&self, batch: &Bytes, syncer: &Syncer) -> Result<Appended, LogWriteError> {
        let leader_epoch = match &self.writer {
            Writer::Local => sluice_meta::LEADER_EPOCH,
            Writer::Leader { replica, leader_epoch } => {
                let write = replica.begin_write(-1).map_err(|refused| match refused {
                    NotServed::NotEnoughReplicas => LogWriteError::NotEnoughReplicas,
                    _ => LogWriteError::NotLeader,
                })?;
                if write.leader_epoch != *leader_epoch {
                    return Err(LogWriteError::NotLeader);
                }
                write.leader_epoch
            }
        };
        let outcome = self.partition.append(batch, leader_epoch, sluice_storage::now_ms()).map_err(|error| {
            tracing::error!(%error, "internal log append failed");
            LogWriteError::Storage
        })?;
        assert!(!outcome.duplicate, "internal batches carry no producer id");
        assert!(outcome.visible_at > outcome.base_offset);
        if outcome.needs_sync {
            syncer.schedule(&self.partition);
        }
        Ok(Appended { base_offset: outcome.base_offset, visible_at: outcome.visible_at })
    }

    /// Waits until the high watermark reaches `visible_at` while this node still leads:
    /// `NotLeader` once it does not (the write may be lost; the client retries at the new
    /// coordinator).
    pub async fn wait_durable(&self, visible_at: i64, timeout: Duration) -> Result<(), LogWriteError> {
        let mut visible = self.partition.subscribe();
        let reached = visible.wait_for(|v| v.high_watermark >= visible_at || v.failed);
        // Some(whether it reached `visible_at` rather than failing), None once leadership is lost.
        let outcome = tokio::time::timeout(timeout, async {
            match &self.writer {
                Writer::Local => Some(reached.await.is_ok_and(|v| v.high_watermark >= visible_at)),
                Writer::Leader { replica, leader_epoch } => tokio::select! {
                    biased;
                    v = reached => Some(v.is_ok_and(|v| v.high_watermark >= visible_at)),
                    () = replica.leadership_lost(*leader_epoch) => None,
                },
            }
        })
        .await;
        match outcome {
            Err(_) => Err(LogWriteError::Timeout),
            Ok(None) => Err(LogWriteError::NotLeader),
            Ok(Some(_)) if !self.is_current() => Err(LogWriteError::NotLeader),
            Ok(Some(true)) => Ok(()),
            Ok(Some(false)) => Err(LogWriteError::Storage),
        }
    }

    /// Single node, clean shutdown: fsync and seal (a replicated partition belongs to the
    /// `LogManager`, which closes it).
    pub fn close(&self) -> io::Result<()> {
        match self.writer {
            Writer::Local => self.partition.close(),
            Writer::Leader { .. } => Ok(()),
        }
    }
}

/// Encodes (key, value) records (no value: a tombstone) as one uncompressed batch, as the
/// coordinators' internal logs (this one and the transaction log) store their changes.
pub fn encode_internal_batch(
    records: impl Iterator<Item = (Bytes, Option<Bytes>)>,
    now_ms: i64,
) -> Result<Bytes, String> {
    let records: Vec<Record> = records
        .enumerate()
        .map(|(index, (key, value))| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: sluice_meta::LEADER_EPOCH,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: index as i64,
            // One batch needs offset - sequence to stay constant (see CRATES.md).
            sequence: index as i32,
            timestamp: now_ms,
            key: Some(key),
            value,
            headers: Default::default(),
        })
        .collect();
    let mut buffer = BytesMut::new();
    let options = RecordEncodeOptions { version: 2, compression: Compression::None };
    RecordBatchEncoder::encode(&mut buffer, &records, &options).map_err(|error| error.to_string())?;
    Ok(buffer.freeze())
}

/// Calls `each` with (offset, key, value) of every record of an internal log (`name` for
/// errors), from its start to its end, in order: what a coordinator replays at startup or
/// when it takes over.
pub fn read_internal_log(
    partition: &Partition,
    name: &str,
    mut each: impl FnMut(i64, Option<Bytes>, Option<Bytes>) -> io::Result<()>,
) -> io::Result<()> {
    let offsets = partition.offsets();
    let mut next = offsets.log_start_offset;
    while next < offsets.log_end_offset {
        let mut chunk = partition
            .read_for_replica(next, REPLAY_READ_BYTES, sluice_storage::ReadMode::MayBlock)
            .map_err(|e| io::Error::other(e.to_string()))?;
        if chunk.is_empty() {
            break;
        }
        let batches = RecordBatchDecoder::decode_all(&mut chunk)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{name}: {e}")))?;
        let before = next;
        for record in batches.into_iter().flat_map(|batch| batch.records) {
            next = next.max(record.offset + 1);
            if record.offset < before {
                continue;
            }
            each(record.offset, record.key, record.value)?;
        }
        assert!(next > before, "replay of {name} made no progress at offset {before}");
    }
    Ok(())
}
