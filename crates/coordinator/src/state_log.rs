//! A coordinator's durable state as an append-only log of keyed values: each change of a
//! key (a transactional id, a share-partition) is one record, key = the key, value = its
//! new state as JSON; a replay keeps the last value of each key. On a single node the log
//! is a local partition of the storage crate's ordinary log; in a cluster it is the led
//! partition of a replicated internal topic (`__transaction_state`), written only by its
//! leader and durable once past its high watermark (fsynced at every ISR member). Both go
//! through the coordinators' shared [`InternalLog`].
//!
//! Changes are appended under the coordinator's lock (a page-cache write, in the order of
//! the changes) and made durable by the group-commit syncer, off the async threads; the
//! coordinator answers once the high watermark passes the record. Nothing fsyncs under the
//! lock.
//!
//! Compaction is a snapshot, as for the offsets log: once the log has grown by
//! [`STATE_LOG_SNAPSHOT_INTERVAL_BYTES`] since the last one, every live value is appended
//! again and, once that is durable, the log start moves to the snapshot's first record so
//! the segments before it are deleted.

use std::collections::BTreeMap;
use std::io;
use std::marker::PhantomData;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::ResponseError;
use serde::de::DeserializeOwned;
use serde::Serialize;
use sluice_storage::{LogConfig, Partition, Syncer};

use crate::internal_log::{encode_internal_batch, read_internal_log, InternalLog, LogWriteError};
use sluice_replication::Replica;

/// The largest batch appended (one change, or a part of a snapshot).
pub const STATE_LOG_BATCH_BYTES_MAX: usize = 16 * 1024 * 1024;
/// Records of one snapshot batch at most (also bounded by bytes).
const SNAPSHOT_RECORDS_PER_BATCH: usize = 512;
/// Bytes appended after which the next upkeep writes a snapshot.
pub const STATE_LOG_SNAPSHOT_INTERVAL_BYTES: u64 = 16 * 1024 * 1024;
/// Segment size of a state log (local or replicated).
pub const STATE_LOG_SEGMENT_BYTES: u64 = 16 * 1024 * 1024;
/// How long a change may take to become durable before the request fails.
pub const STATE_LOG_WRITE_TIMEOUT_MS: u64 = 30_000;

/// One partition of a coordinator's state log, values of type `V`.
pub struct StateLog<V> {
    log: InternalLog,
    /// Bytes appended since the last snapshot (or the start).
    bytes_since_snapshot: parking_lot::Mutex<u64>,
    _values: PhantomData<fn() -> V>,
}

/// An appended change: durable once the high watermark reaches `visible_at`.
#[must_use = "a change is answered only once it is durable"]
pub struct PendingChange {
    visible_at: i64,
}

impl<V: Serialize + DeserializeOwned> StateLog<V> {
    /// Cluster mode: a partition of `__transaction_state` this node leads (at
    /// `leader_epoch`), replayed into the state per id. A new leader reads past its high
    /// watermark: what it holds was acknowledged or will be once its followers catch up.
    pub fn replicated(replica: Arc<Replica>, leader_epoch: i32) -> io::Result<(Self, BTreeMap<String, V>)> {
        Self::over(InternalLog::replicated(replica, leader_epoch))
    }

    /// Single node: opens (recovering) the log in `dir` and replays it.
    pub fn open_local(dir: &Path) -> io::Result<(Self, BTreeMap<String, V>)> {
        let config = LogConfig {
            segment_bytes: STATE_LOG_SEGMENT_BYTES,
            retention_ms: -1,
            retention_bytes: -1,
            max_message_bytes: STATE_LOG_BATCH_BYTES_MAX,
            flush_messages: 1,
            ..LogConfig::default()
        };
        if let Some(parent) = dir.parent() {
            sluice_storage::durable::create_dir_all(parent)?;
        }
        Self::over(InternalLog::local(Arc::new(Partition::open(dir, config)?)))
    }

    fn over(log: InternalLog) -> io::Result<(Self, BTreeMap<String, V>)> {
        let bytes = log.partition().size_bytes();
        let log = StateLog { log, bytes_since_snapshot: parking_lot::Mutex::new(bytes), _values: PhantomData };
        let state = log.replay()?;
        Ok((log, state))
    }

    /// The leader epoch this log is written at: the coordinator epoch markers carry.
    pub fn coordinator_epoch(&self) -> i32 {
        self.log.leader_epoch()
    }

    /// Appends the new value of `key` and asks the syncer for an fsync.
    pub fn append(&self, key: &str, value: &V, syncer: &Syncer) -> Result<PendingChange, ResponseError> {
        self.append_all(&[(key, value)], syncer)
    }

    /// Appends `entries` in batches of bounded size; durable together once the last is.
    pub fn append_all(&self, entries: &[(&str, &V)], syncer: &Syncer) -> Result<PendingChange, ResponseError> {
        assert!(!entries.is_empty(), "an empty state log write");
        let now_ms = sluice_storage::now_ms();
        let mut visible_at = 0;
        let mut batch: Vec<(Bytes, Bytes)> = Vec::new();
        let mut batch_bytes = 0;
        for (index, (id, meta)) in entries.iter().enumerate() {
            let value = Bytes::from(serde_json::to_vec(meta).expect("serializable"));
            batch_bytes += id.len() + value.len() + 32;
            batch.push((Bytes::copy_from_slice(id.as_bytes()), value));
            let last = index + 1 == entries.len();
            if last || batch.len() >= SNAPSHOT_RECORDS_PER_BATCH || batch_bytes >= STATE_LOG_BATCH_BYTES_MAX / 2 {
                visible_at = self.append_batch(&batch, now_ms, syncer)?;
                batch.clear();
                batch_bytes = 0;
            }
        }
        Ok(PendingChange { visible_at })
    }

    /// Appends a tombstone: a replay forgets `key`.
    pub fn remove(&self, key: &str, syncer: &Syncer) -> Result<PendingChange, ResponseError> {
        let record = std::iter::once((Bytes::copy_from_slice(key.as_bytes()), None));
        let visible_at = self.append_records(record, sluice_storage::now_ms(), syncer)?;
        Ok(PendingChange { visible_at })
    }

    fn append_batch(&self, records: &[(Bytes, Bytes)], now_ms: i64, syncer: &Syncer) -> Result<i64, ResponseError> {
        let records = records.iter().map(|(key, value)| (key.clone(), Some(value.clone())));
        self.append_records(records, now_ms, syncer)
    }

    fn append_records(
        &self,
        records: impl Iterator<Item = (Bytes, Option<Bytes>)>,
        now_ms: i64,
        syncer: &Syncer,
    ) -> Result<i64, ResponseError> {
        let encoded = encode_internal_batch(records, now_ms).map_err(|error| {
            tracing::error!(%error, "could not encode a state log batch");
            ResponseError::KafkaStorageError
        })?;
        if encoded.len() > STATE_LOG_BATCH_BYTES_MAX {
            return Err(ResponseError::MessageTooLarge);
        }
        let appended = self.log.append(&encoded, syncer).map_err(coordinator_error)?;
        *self.bytes_since_snapshot.lock() += encoded.len() as u64;
        Ok(appended.visible_at)
    }

    /// Waits until `change` is durable (fsynced; in a cluster, in the ISR while this node
    /// still leads).
    pub async fn wait_durable(&self, change: PendingChange) -> Result<(), ResponseError> {
        let timeout = Duration::from_millis(STATE_LOG_WRITE_TIMEOUT_MS);
        self.log.wait_durable(change.visible_at, timeout).await.map_err(coordinator_error)
    }

    /// False once this node no longer leads the partition at the epoch it loaded it at.
    pub fn is_current(&self) -> bool {
        self.log.is_current()
    }

    /// Everything appended so far, as one change to wait for.
    pub fn written(&self) -> PendingChange {
        PendingChange { visible_at: self.log.partition().offsets().log_end_offset }
    }

    /// At startup, before the runtime serves anything: polls the high watermark.
    pub fn wait_durable_blocking(&self, change: PendingChange) -> io::Result<()> {
        let deadline = Instant::now() + Duration::from_millis(STATE_LOG_WRITE_TIMEOUT_MS);
        loop {
            let visible = *self.log.partition().subscribe().borrow();
            if visible.failed {
                return Err(io::Error::other("the state log went offline"));
            }
            if visible.high_watermark >= change.visible_at {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "waiting for the state log"));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Whether enough was appended since the last snapshot for a new one.
    pub fn snapshot_due(&self) -> bool {
        *self.bytes_since_snapshot.lock() >= STATE_LOG_SNAPSHOT_INTERVAL_BYTES
    }

    /// Appends every live entry (called under the coordinator's lock, so nothing changes
    /// meanwhile); returns where the snapshot starts and what to wait for.
    pub fn write_snapshot(
        &self,
        entries: &BTreeMap<String, V>,
        syncer: &Syncer,
    ) -> Result<Option<(i64, PendingChange)>, ResponseError> {
        if entries.is_empty() {
            return Ok(None);
        }
        let start = self.log.partition().offsets().log_end_offset;
        let entries: Vec<(&str, &V)> = entries.iter().map(|(id, m)| (id.as_str(), m)).collect();
        let pending = self.append_all(&entries, syncer)?;
        *self.bytes_since_snapshot.lock() = 0;
        Ok(Some((start, pending)))
    }

    /// After a snapshot starting at `start` is durable: drops everything before it.
    pub fn truncate_before(&self, start: i64) {
        match self.log.partition().delete_records_before(start) {
            Ok(log_start) => tracing::debug!(log_start, "state log compacted"),
            Err(error) => tracing::warn!(%error, "could not move the state log's start"),
        }
    }

    /// The partition the log is written to.
    #[cfg(test)]
    pub fn partition(&self) -> &Arc<Partition> {
        self.log.partition()
    }

    /// Clean shutdown.
    pub fn close(&self) -> io::Result<()> {
        self.log.close()
    }

    /// The state per key: the last record of each, from the log start (a tombstone forgets it).
    fn replay(&self) -> io::Result<BTreeMap<String, V>> {
        let name = self.log.partition().dir().display().to_string();
        let mut state = BTreeMap::new();
        read_internal_log(self.log.partition(), &name, |offset, key, value| {
            let Some(key) = key else { return Ok(()) };
            let invalid = |e: String| io::Error::new(io::ErrorKind::InvalidData, format!("{name} at {offset}: {e}"));
            let id = String::from_utf8(key.to_vec()).map_err(|e| invalid(e.to_string()))?;
            match value {
                None => {
                    state.remove(&id);
                }
                Some(value) => {
                    let meta: V = serde_json::from_slice(&value).map_err(|e| invalid(e.to_string()))?;
                    state.insert(id, meta);
                }
            }
            Ok(())
        })?;
        Ok(state)
    }
}

/// A state log write's failure, as the coordinators' APIs answer it: clients retry
/// NOT_COORDINATOR and COORDINATOR_NOT_AVAILABLE at the (new) coordinator.
fn coordinator_error(error: LogWriteError) -> ResponseError {
    match error {
        LogWriteError::NotLeader => ResponseError::NotCoordinator,
        LogWriteError::NotEnoughReplicas => ResponseError::CoordinatorNotAvailable,
        LogWriteError::Storage => ResponseError::KafkaStorageError,
        LogWriteError::Timeout => ResponseError::RequestTimedOut,
    }
}
