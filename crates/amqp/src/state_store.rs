//! Where the front door's state (exchanges, queues' AMQP attributes, bindings) is kept: a
//! versioned map of text entries, changed by compare-and-set.
//!
//! Why a map with a version: on a single node it is one file of the data directory; in a
//! cluster it is part of the replicated cluster metadata, so that every node routes with
//! the same exchanges and bindings whichever node they were declared on. A change is
//! computed from the version it read and refused if another node changed the state since;
//! the writer then reads again and recomputes ([`crate::topology`]).

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::gateway::GatewayFuture;

/// The state's entries: key -> value.
pub type Entries = BTreeMap<String, String>;

/// Why a change was not stored.
#[derive(Debug)]
pub enum StoreError {
    /// The state changed since the version the change was computed from.
    Conflict,
    /// It could not be made durable.
    Failed(String),
}

pub trait StateStore: Send + Sync + 'static {
    /// The version of the state as stored (or, in a cluster, as replicated here).
    fn version(&self) -> u64;

    /// The entries and their version.
    fn snapshot(&self) -> (u64, Arc<Entries>);

    /// Puts and deletes entries, if the state is still at `expected_version`; returns once
    /// the change is durable and [`StateStore::snapshot`] shows it.
    fn commit(
        &self,
        expected_version: u64,
        puts: Entries,
        deletes: Vec<String>,
    ) -> GatewayFuture<'static, Result<(), StoreError>>;
}

/// The state file in the state directory.
const STATE_FILE: &str = "amqp-state.json";

/// The state of a single node: one file, written new, fsynced, renamed and its directory
/// fsynced on every change.
pub struct FileStore {
    path: PathBuf,
    /// The version (changes since this process started) and the entries as written.
    written: Arc<Mutex<(u64, Arc<Entries>)>>,
    /// One change at a time.
    writer: Arc<tokio::sync::Mutex<()>>,
}

impl FileStore {
    /// The state kept in `dir` (when there is no state file: what `legacy` finds there, or
    /// nothing), without the entries `forget` names (what did not outlive the process; the
    /// next change writes them away).
    pub fn open(
        dir: &Path,
        forget: impl Fn(&str, &str) -> bool,
        legacy: impl FnOnce(&Path) -> io::Result<Option<Entries>>,
    ) -> io::Result<FileStore> {
        let path = dir.join(STATE_FILE);
        let mut entries: Entries = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", path.display())))?,
            Err(error) if error.kind() == io::ErrorKind::NotFound => legacy(dir)?.unwrap_or_default(),
            Err(error) => return Err(error),
        };
        entries.retain(|key, value| !forget(key, value));
        Ok(FileStore { path, written: Arc::new(Mutex::new((0, Arc::new(entries)))), writer: Arc::default() })
    }
}

impl StateStore for FileStore {
    fn version(&self) -> u64 {
        self.written.lock().0
    }

    fn snapshot(&self) -> (u64, Arc<Entries>) {
        self.written.lock().clone()
    }

    fn commit(
        &self,
        expected_version: u64,
        puts: Entries,
        deletes: Vec<String>,
    ) -> GatewayFuture<'static, Result<(), StoreError>> {
        let (path, written, writer) = (self.path.clone(), self.written.clone(), self.writer.clone());
        Box::pin(async move {
            let _writing = writer.lock().await;
            let (version, entries) = written.lock().clone();
            if version != expected_version {
                return Err(StoreError::Conflict);
            }
            let mut next = (*entries).clone();
            for key in &deletes {
                next.remove(key);
            }
            next.extend(puts);
            let bytes = serde_json::to_vec(&next).expect("entries serialize");
            tokio::task::spawn_blocking(move || write_atomically(&path, &bytes))
                .await
                .map_err(|e| StoreError::Failed(format!("state writer: {e}")))?
                .map_err(|e| StoreError::Failed(e.to_string()))?;
            *written.lock() = (version + 1, Arc::new(next));
            Ok(())
        })
    }
}

/// Replaces `path` with `bytes`: written new, fsynced, renamed, the directory fsynced.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let staged = path.with_extension("json.new");
    let mut file = std::fs::File::create(&staged)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&staged, path)?;
    std::fs::File::open(path.parent().expect("a file in a directory"))?.sync_all()
}
