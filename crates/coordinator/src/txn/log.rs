//! The transaction coordinator's durable state: a [`StateLog`] of transaction metadata
//! (key = transactional id). On a single node it is
//! `<data_dir>/transactions/__transaction_state-0`; in a cluster a partition of the
//! replicated internal topic `__transaction_state` (Kafka's name). A state written before
//! Sluice kept this log (`<data_dir>/transactions.json`) is imported at the first start and
//! then removed.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;

use sluice_storage::Syncer;

use crate::state_log::StateLog;
use crate::txn::TxnMetadata;

pub use crate::state_log::{
    STATE_LOG_BATCH_BYTES_MAX as TXN_LOG_BATCH_BYTES_MAX, STATE_LOG_SEGMENT_BYTES as TXN_LOG_SEGMENT_BYTES,
};

pub use sluice_meta::internal::TXN_STATE_TOPIC;
/// The partition's directory name, as Kafka names its internal topic's partitions.
const TXN_LOG_DIR: &str = "__transaction_state-0";
/// The file a transaction state was kept in before this log (imported, then removed).
const LEGACY_FILE: &str = "transactions.json";

/// One partition of the transaction state log.
pub type TxnLog = StateLog<TxnMetadata>;

/// Single node: opens (recovering) the log under `data_dir`, replays it into the state per
/// id, and imports a `transactions.json` left by an earlier version.
pub fn open_local(data_dir: &Path, syncer: &Syncer) -> io::Result<(TxnLog, BTreeMap<String, TxnMetadata>)> {
    let (log, mut state) = TxnLog::open_local(&data_dir.join("transactions").join(TXN_LOG_DIR))?;
    let legacy = data_dir.join(LEGACY_FILE);
    if let Some(imported) = read_legacy(&legacy)? {
        if state.is_empty() && !imported.is_empty() {
            let entries: Vec<(&str, &TxnMetadata)> = imported.iter().map(|(id, m)| (id.as_str(), m)).collect();
            let pending = log.append_all(&entries, syncer).map_err(|e| io::Error::other(format!("{e:?}")))?;
            log.wait_durable_blocking(pending)?;
            tracing::info!(transactional_ids = imported.len(), "imported transactions.json into the transaction log");
            state = imported;
        }
        std::fs::remove_file(&legacy)?;
        sluice_storage::durable::sync_dir(data_dir)?;
    }
    Ok((log, state))
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
        let (log, state) = open_local(dir.path(), &syncer).unwrap();
        assert!(state.is_empty());
        for epoch in 0..50 {
            let change = log.append("a", &meta(7, epoch, TxnState::Ongoing), &syncer).unwrap();
            log.wait_durable(change).await.unwrap();
        }
        let change = log.append("b", &meta(9, 0, TxnState::PrepareCommit), &syncer).unwrap();
        log.wait_durable(change).await.unwrap();
        log.close().unwrap();
        drop(log);

        let (log, state) = open_local(dir.path(), &syncer).unwrap();
        assert_eq!(state.len(), 2);
        assert_eq!(state["a"], meta(7, 49, TxnState::Ongoing));
        assert_eq!(state["b"], meta(9, 0, TxnState::PrepareCommit));

        let (start, change) = log.write_snapshot(&state, &syncer).unwrap().unwrap();
        assert_eq!(start, 51);
        log.wait_durable(change).await.unwrap();
        log.truncate_before(start);
        assert_eq!(log.partition().offsets().log_start_offset, 51);
        log.close().unwrap();
        drop(log);
        let (_, replayed) = open_local(dir.path(), &syncer).unwrap();
        assert_eq!(replayed, state, "a snapshot replays to the same state");
    }

    #[test]
    fn a_legacy_state_file_is_imported_once() {
        let dir = tempfile::tempdir().unwrap();
        let syncer = Syncer::start();
        let legacy = BTreeMap::from([("x".to_string(), meta(3, 2, TxnState::CompleteCommit))]);
        let body = serde_json::json!({ "version": 1, "transactions": legacy });
        std::fs::write(dir.path().join(LEGACY_FILE), serde_json::to_vec(&body).unwrap()).unwrap();
        let (log, state) = open_local(dir.path(), &syncer).unwrap();
        assert_eq!(state, legacy);
        assert!(!dir.path().join(LEGACY_FILE).exists());
        log.close().unwrap();
        drop(log);
        let (_, state) = open_local(dir.path(), &syncer).unwrap();
        assert_eq!(state, legacy);
    }
}
