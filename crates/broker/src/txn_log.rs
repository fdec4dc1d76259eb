//! The transaction coordinator's durable state: an append-only log of transaction
//! metadata. On a single node it is `<data_dir>/transactions/__transaction_state-0`, a
//! partition of the storage crate's ordinary log; in a cluster it is a partition of the
//! replicated internal topic `__transaction_state` (Kafka's name), written only by its
//! leader and durable once past its high watermark (fsynced at every ISR member). Both go
//! through the coordinators' shared [`InternalLog`].
//!
//! Each change of a transactional id's metadata is one record (key = the id, value = its
//! metadata as JSON), appended under the coordinator's lock (a page-cache write, in the
//! order of the changes) and made durable by the group-commit syncer, off the async
//! threads; the coordinator answers once the high watermark passes the record. Nothing
//! fsyncs under the lock that transactional produces take. A restart replays the log: the
//! last record of each id is its state.
//!
//! Compaction is a snapshot, as for the offsets log: once the log has grown by
//! [`TXN_LOG_SNAPSHOT_INTERVAL_BYTES`] since the last one, every live entry is appended
//! again and, once that is durable, the log start moves to the snapshot's first record so
//! the segments before it are deleted. A state written before Sluice kept this log
//! (`<data_dir>/transactions.json`) is imported at the first start and then removed.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::ResponseError;
use sluice_storage::{LogConfig, Partition, Syncer};

use crate::group::journal::{encode_internal_batch, read_internal_log, InternalLog, LogWriteError};
use crate::replication::Replica;
use crate::txn::TxnMetadata;

/// The internal topic's name, as in Kafka.
pub(crate) const TXN_STATE_TOPIC: &str = "__transaction_state";

/// The partition's directory name, as Kafka names its internal topic's partitions.
const TXN_LOG_DIR: &str = "__transaction_state-0";
/// The file a transaction state was kept in before this log (imported, then removed).
const LEGACY_FILE: &str = "transactions.json";
/// The largest batch appended (one change, or a part of a snapshot).
pub(crate) const TXN_LOG_BATCH_BYTES_MAX: usize = 16 * 1024 * 1024;
/// Records of one snapshot batch at most (also bounded by bytes).
const SNAPSHOT_RECORDS_PER_BATCH: usize = 512;
/// Bytes appended after which the next upkeep writes a snapshot.
pub(crate) const TXN_LOG_SNAPSHOT_INTERVAL_BYTES: u64 = 16 * 1024 * 1024;
/// Segment size of the transaction log (single node and `__transaction_state`).
pub(crate) const TXN_LOG_SEGMENT_BYTES: u64 = 16 * 1024 * 1024;
/// How long a change may take to become durable before the request fails.
pub(crate) const TXN_LOG_WRITE_TIMEOUT_MS: u64 = 30_000;

/// One partition of the transaction state log.
pub(crate) struct TxnLog {
    log: InternalLog,
    /// Bytes appended since the last snapshot (or the start).
    bytes_since_snapshot: parking_lot::Mutex<u64>,
}

/// An appended change: durable once the high watermark reaches `visible_at`.
#[must_use = "a change is answered only once it is durable"]
pub(crate) struct PendingChange {
    visible_at: i64,
}

impl TxnLog {
    /// Opens (recovering) the log under `data_dir` and replays it into the state per id.
    pub(crate) fn open(data_dir: &Path, syncer: &Syncer) -> io::Result<(TxnLog, BTreeMap<String, TxnMetadata>)> {
        let config = LogConfig {
            segment_bytes: TXN_LOG_SEGMENT_BYTES,
            retention_ms: -1,
            retention_bytes: -1,
            max_message_bytes: TXN_LOG_BATCH_BYTES_MAX,
            flush_messages: 1,
            ..LogConfig::default()
        };
        let dir = data_dir.join("transactions");
        std::fs::create_dir_all(&dir)?;
        let partition = Arc::new(Partition::open(&dir.join(TXN_LOG_DIR), config)?);
        let (log, mut state) = TxnLog::over(InternalLog::local(partition))?;
        let legacy = data_dir.join(LEGACY_FILE);
        if let Some(imported) = read_legacy(&legacy)? {
            if state.is_empty() && !imported.is_empty() {
                let entries: Vec<(&str, &TxnMetadata)> = imported.iter().map(|(id, m)| (id.as_str(), m)).collect();
                let pending = log.append_all(&entries, syncer).map_err(|e| io::Error::other(format!("{e:?}")))?;
                log.wait_durable_blocking(pending)?;
                tracing::info!(
                    transactional_ids = imported.len(),
                    "imported transactions.json into the transaction log"
                );
                state = imported;
            }
            std::fs::remove_file(&legacy)?;
            sluice_storage::durable::sync_dir(data_dir)?;
        }
        Ok((log, state))
    }

    /// Cluster mode: a partition of `__transaction_state` this node leads (at
    /// `leader_epoch`), replayed into the state per id. A new leader reads past its high
    /// watermark: what it holds was acknowledged or will be once its followers catch up.
    pub(crate) fn replicated(
        replica: Arc<Replica>,
        leader_epoch: i32,
    ) -> io::Result<(TxnLog, BTreeMap<String, TxnMetadata>)> {
        TxnLog::over(InternalLog::replicated(replica, leader_epoch))
    }

    fn over(log: InternalLog) -> io::Result<(TxnLog, BTreeMap<String, TxnMetadata>)> {
        let bytes = log.partition().size_bytes();
        let log = TxnLog { log, bytes_since_snapshot: parking_lot::Mutex::new(bytes) };
        let state = log.replay()?;
        Ok((log, state))
    }

    /// The leader epoch this log is written at: the coordinator epoch markers carry.
    pub(crate) fn coordinator_epoch(&self) -> i32 {
        self.log.leader_epoch()
    }

    /// Appends one change of `transactional_id` and asks the syncer for an fsync.
    pub(crate) fn append(
        &self,
        transactional_id: &str,
        meta: &TxnMetadata,
        syncer: &Syncer,
    ) -> Result<PendingChange, ResponseError> {
        self.append_all(&[(transactional_id, meta)], syncer)
    }

    /// Appends `entries` in batches of bounded size; durable together once the last is.
    fn append_all(&self, entries: &[(&str, &TxnMetadata)], syncer: &Syncer) -> Result<PendingChange, ResponseError> {
        assert!(!entries.is_empty(), "an empty transaction log write");
        let now_ms = sluice_storage::now_ms();
        let mut visible_at = 0;
        let mut batch: Vec<(Bytes, Bytes)> = Vec::new();
        let mut batch_bytes = 0;
        for (index, (id, meta)) in entries.iter().enumerate() {
            let value = Bytes::from(serde_json::to_vec(meta).expect("serializable"));
            batch_bytes += id.len() + value.len() + 32;
            batch.push((Bytes::copy_from_slice(id.as_bytes()), value));
            let last = index + 1 == entries.len();
            if last || batch.len() >= SNAPSHOT_RECORDS_PER_BATCH || batch_bytes >= TXN_LOG_BATCH_BYTES_MAX / 2 {
                visible_at = self.append_batch(&batch, now_ms, syncer)?;
                batch.clear();
                batch_bytes = 0;
            }
        }
        Ok(PendingChange { visible_at })
    }

    fn append_batch(&self, records: &[(Bytes, Bytes)], now_ms: i64, syncer: &Syncer) -> Result<i64, ResponseError> {
        let records = records.iter().map(|(key, value)| (key.clone(), Some(value.clone())));
        let encoded = encode_internal_batch(records, now_ms).map_err(|error| {
            tracing::error!(%error, "could not encode a transaction log batch");
            ResponseError::KafkaStorageError
        })?;
        if encoded.len() > TXN_LOG_BATCH_BYTES_MAX {
            return Err(ResponseError::MessageTooLarge);
        }
        let appended = self.log.append(&encoded, syncer).map_err(coordinator_error)?;
        *self.bytes_since_snapshot.lock() += encoded.len() as u64;
        Ok(appended.visible_at)
    }

    /// Waits until `change` is durable (fsynced; in a cluster, in the ISR while this node
    /// still leads).
    pub(crate) async fn wait_durable(&self, change: PendingChange) -> Result<(), ResponseError> {
        let timeout = Duration::from_millis(TXN_LOG_WRITE_TIMEOUT_MS);
        self.log.wait_durable(change.visible_at, timeout).await.map_err(coordinator_error)
    }

    /// False once this node no longer leads the partition at the epoch it loaded it at.
    pub(crate) fn is_current(&self) -> bool {
        self.log.is_current()
    }

    /// Everything appended so far, as one change to wait for.
    pub(crate) fn written(&self) -> PendingChange {
        PendingChange { visible_at: self.log.partition().offsets().log_end_offset }
    }

    /// At startup, before the runtime serves anything: polls the high watermark.
    fn wait_durable_blocking(&self, change: PendingChange) -> io::Result<()> {
        let deadline = Instant::now() + Duration::from_millis(TXN_LOG_WRITE_TIMEOUT_MS);
        loop {
            let visible = *self.log.partition().subscribe().borrow();
            if visible.failed {
                return Err(io::Error::other("the transaction log went offline"));
            }
            if visible.high_watermark >= change.visible_at {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "importing transactions.json"));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Whether enough was appended since the last snapshot for a new one.
    pub(crate) fn snapshot_due(&self) -> bool {
        *self.bytes_since_snapshot.lock() >= TXN_LOG_SNAPSHOT_INTERVAL_BYTES
    }

    /// Appends every live entry (called under the coordinator's lock, so nothing changes
    /// meanwhile); returns where the snapshot starts and what to wait for.
    pub(crate) fn write_snapshot(
        &self,
        entries: &BTreeMap<String, TxnMetadata>,
        syncer: &Syncer,
    ) -> Result<Option<(i64, PendingChange)>, ResponseError> {
        if entries.is_empty() {
            return Ok(None);
        }
        let start = self.log.partition().offsets().log_end_offset;
        let entries: Vec<(&str, &TxnMetadata)> = entries.iter().map(|(id, m)| (id.as_str(), m)).collect();
        let pending = self.append_all(&entries, syncer)?;
        *self.bytes_since_snapshot.lock() = 0;
        Ok(Some((start, pending)))
    }

    /// After a snapshot starting at `start` is durable: drops everything before it.
    pub(crate) fn truncate_before(&self, start: i64) {
        match self.log.partition().delete_records_before(start) {
            Ok(log_start) => tracing::debug!(log_start, "transaction log compacted"),
            Err(error) => tracing::warn!(%error, "could not move the transaction log's start"),
        }
    }

    /// Clean shutdown.
    pub(crate) fn close(&self) -> io::Result<()> {
        self.log.close()
    }

    /// The state per transactional id: the last record of each, from the log start.
    fn replay(&self) -> io::Result<BTreeMap<String, TxnMetadata>> {
        let mut state = BTreeMap::new();
        read_internal_log(self.log.partition(), TXN_STATE_TOPIC, |offset, key, value| {
            let (Some(key), Some(value)) = (key, value) else { return Ok(()) };
            let invalid =
                |e: String| io::Error::new(io::ErrorKind::InvalidData, format!("{TXN_STATE_TOPIC} at {offset}: {e}"));
            let id = String::from_utf8(key.to_vec()).map_err(|e| invalid(e.to_string()))?;
            let meta: TxnMetadata = serde_json::from_slice(&value).map_err(|e| invalid(e.to_string()))?;
            state.insert(id, meta);
            Ok(())
        })?;
        Ok(state)
    }
}

/// A transaction log write's failure, as the transaction APIs answer it: clients retry
/// NOT_COORDINATOR and COORDINATOR_NOT_AVAILABLE at the (new) coordinator.
fn coordinator_error(error: LogWriteError) -> ResponseError {
    match error {
        LogWriteError::NotLeader => ResponseError::NotCoordinator,
        LogWriteError::NotEnoughReplicas => ResponseError::CoordinatorNotAvailable,
        LogWriteError::Storage => ResponseError::KafkaStorageError,
        LogWriteError::Timeout => ResponseError::RequestTimedOut,
    }
}

/// `transactions.json` as the coordinator wrote it before this log, if present.
fn read_legacy(path: &Path) -> io::Result<Option<BTreeMap<String, TxnMetadata>>> {
    #[derive(serde::Deserialize)]
    struct Stored {
        version: u32,
        transactions: BTreeMap<String, TxnMetadata>,
    }
    let body = match std::fs::read(path) {
        Ok(body) => body,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error),
    };
    let stored: Stored = serde_json::from_slice(&body)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", path.display())))?;
    if stored.version != 1 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: unknown version {}", path.display(), stored.version),
        ));
    }
    Ok(Some(stored.transactions))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::txn::TxnState;

    fn meta(producer_id: i64, epoch: i16, state: TxnState) -> TxnMetadata {
        TxnMetadata {
            producer_id,
            producer_epoch: epoch,
            timeout_ms: 60_000,
            state,
            partitions: [("orders".to_string(), 3)].into_iter().collect(),
            offsets: BTreeMap::new(),
            started_ms: 5,
        }
    }

    #[tokio::test]
    async fn changes_replay_to_the_last_state_and_snapshots_drop_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let syncer = Syncer::start();
        let (log, state) = TxnLog::open(dir.path(), &syncer).unwrap();
        assert!(state.is_empty());
        for epoch in 0..50 {
            let change = log.append("a", &meta(7, epoch, TxnState::Ongoing), &syncer).unwrap();
            log.wait_durable(change).await.unwrap();
        }
        let change = log.append("b", &meta(9, 0, TxnState::PrepareCommit), &syncer).unwrap();
        log.wait_durable(change).await.unwrap();
        log.close().unwrap();
        drop(log);

        let (log, state) = TxnLog::open(dir.path(), &syncer).unwrap();
        assert_eq!(state.len(), 2);
        assert_eq!(state["a"], meta(7, 49, TxnState::Ongoing));
        assert_eq!(state["b"], meta(9, 0, TxnState::PrepareCommit));

        let (start, change) = log.write_snapshot(&state, &syncer).unwrap().unwrap();
        assert_eq!(start, 51);
        log.wait_durable(change).await.unwrap();
        log.truncate_before(start);
        assert_eq!(log.log.partition().offsets().log_start_offset, 51);
        log.close().unwrap();
        drop(log);
        let (_, replayed) = TxnLog::open(dir.path(), &syncer).unwrap();
        assert_eq!(replayed, state, "a snapshot replays to the same state");
    }

    #[test]
    fn a_legacy_state_file_is_imported_once() {
        let dir = tempfile::tempdir().unwrap();
        let syncer = Syncer::start();
        let legacy = BTreeMap::from([("x".to_string(), meta(3, 2, TxnState::CompleteCommit))]);
        let body = serde_json::json!({ "version": 1, "transactions": legacy });
        std::fs::write(dir.path().join(LEGACY_FILE), serde_json::to_vec(&body).unwrap()).unwrap();
        let (log, state) = TxnLog::open(dir.path(), &syncer).unwrap();
        assert_eq!(state, legacy);
        assert!(!dir.path().join(LEGACY_FILE).exists());
        log.close().unwrap();
        drop(log);
        let (_, state) = TxnLog::open(dir.path(), &syncer).unwrap();
        assert_eq!(state, legacy);
    }
}
