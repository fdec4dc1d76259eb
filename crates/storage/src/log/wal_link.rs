//! What a partition needs of the write-ahead log it logs into: a way to log a change of its
//! log other than an append (a [`Control`] record) and wait until it is durable, before the
//! change takes effect. The WAL and its syncer (`crate::wal`, `crate::syncer`) sit above
//! the partition and hand it a [`WalLink`]; the partition never reaches up to them.

use std::io;
use std::sync::Arc;

/// A change of a partition's log other than an append, logged before it takes effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Control {
    /// The log is cut to end at or before this offset.
    Truncate(i64),
    /// The partition is deleted: its earlier records must not replay.
    Forget,
}

/// Logs a partition's [`Control`] records into the WAL (the syncer's WAL thread).
pub(crate) trait ControlLog: Send + Sync {
    /// Logs `control` for the partition at `path` (as WAL records name it) and waits until
    /// it is durable.
    fn log(&self, path: &str, control: Control) -> io::Result<()>;
}

/// A partition's link to the WAL it logs into.
#[derive(Clone)]
pub(crate) struct WalLink {
    /// The partition's directory as WAL records name it.
    pub(crate) path: Arc<str>,
    wal: Arc<dyn ControlLog>,
}

impl WalLink {
    pub(crate) fn new(path: Arc<str>, wal: Arc<dyn ControlLog>) -> WalLink {
        WalLink { path, wal }
    }

    /// Logs `control` for this partition and waits until it is durable.
    pub(crate) fn log(&self, control: Control) -> io::Result<()> {
        self.wal.log(&self.path, control)
    }
}
