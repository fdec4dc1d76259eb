//! Sluice's storage engine: durable, crash-safe partition logs of Kafka record batches.
//!
//! The map: a [`LogManager`] owns every [`Partition`] of this node and the group-commit
//! [`Syncer`]; a partition is a set of [`Segment`] files with sparse offset and
//! time indexes, plus its idempotent-producer state. Batches are stored byte for byte as
//! the client sent them; only the base offset and the leader epoch are written by us.
//!
//! Two offsets are kept apart: the log end offset (what has been written) and the high
//! watermark (what may be read and acknowledged). With the default durability the high
//! watermark only moves once an `fdatasync` covers the data, so nothing a consumer sees
//! can vanish in a crash.
//!
//! Storage knows nothing of the Kafka wire protocol beyond record batches: it reads the
//! batch header, and records only where a compacted topic needs their keys
//! ([`cleaner`], [`records`]).

pub mod batch;
pub mod checksum;
mod cleaner;
pub mod durable;
mod log;
mod manager;
mod page_cache;
mod process_memory;
mod producer_state;
mod records;
mod segment;
mod segment_file;
mod segment_tail;
mod syncer;
mod wal;

use std::fs::File;
use std::io::{self, Write};
use std::path::Path;

pub use crate::cleaner::{clean_partition, CleanStats, CleanerSettings, IoPacer};
pub use crate::log::{
    joined, read_file_range, AbortedTransaction, AppendError, AppendOutcome, FileRange, LogConfig, LogOffsets,
    Partition, Progress, ReadError, ReadLimit, ReplicaAppend, SealedSegment, Visible, ACTIVE_SEGMENT_IDLE_MS,
    FILE_RANGE_BYTES_MIN,
};
pub use crate::manager::{LogManager, TopicPartition};
pub use crate::page_cache::{cachestat, Cachestat};
pub use crate::segment::{direct_read_piece_bytes, ReadMode, Segment, SegmentIndex, DIRECT_READ_PIECE_BYTES_MIN};
pub use crate::segment_file::{sealed_files_open, set_sealed_files_open_max, SEALED_SEGMENT_FILES_OPEN_MAX};
pub use crate::segment_tail::{
    set_direct_writes, tail_full_appends, tail_memory_bytes, tail_written_bytes, PAGE_BYTES, TAIL_CHUNK_BYTES_MAX,
    TAIL_CHUNK_BYTES_MIN, TAIL_FROZEN_CHUNKS_MAX,
};
pub use crate::syncer::{FsyncObserver, Syncer, WAL_ROUND_INTERVAL_MAX};
pub use crate::wal::{WAL_DIR, WAL_FILE_BYTES, WAL_FILE_BYTES_MIN};

/// Writes a small file so that a crash leaves either the old or the new content.
pub fn write_file_atomically(path: &Path, data: &[u8]) -> io::Result<()> {
    write_file_atomically_with_mode(path, data, 0o644)
}

/// [`write_file_atomically`] for a file only its owner may read (credentials, secrets):
/// created with mode 0600, so it is never readable by others, not even for a moment.
pub fn write_private_file_atomically(path: &Path, data: &[u8]) -> io::Result<()> {
    write_file_atomically_with_mode(path, data, 0o600)
}

fn write_file_atomically_with_mode(path: &Path, data: &[u8], mode: u32) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    // A temporary file left by a crash may have another mode: `mode` applies only on create.
    match std::fs::remove_file(&tmp) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => return Err(error),
        _ => {}
    }
    {
        let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(&tmp)?;
        file.write_all(data)?;
        durable::sync_all(&file)?;
    }
    std::fs::rename(&tmp, path)?;
    match path.parent() {
        Some(dir) => durable::sync_dir(dir),
        None => Ok(()),
    }
}

/// Writes a file by rename without fsync: for files that are validated when read (a
/// checksum or parse check) and merely speed up recovery, so a crash may lose them but
/// never leaves them half-written under their final name with wrong content unnoticed.
/// Clean shutdown makes them durable ([`durable::sync_path`]).
pub fn write_file_unsynced(path: &Path, data: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, data)?;
    std::fs::rename(&tmp, path)
}

/// An exclusive `flock` on `<dir>/.lock`, held for the life of the process, so two brokers
/// never share a data directory.
pub struct DirLock {
    _file: File,
}

impl DirLock {
    pub fn acquire(dir: &Path) -> io::Result<DirLock> {
        use std::os::unix::io::AsRawFd;
        durable::create_dir_all(dir)?;
        let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(dir.join(".lock"))?;
        // SAFETY: flock on an open descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let error = io::Error::last_os_error();
            return Err(io::Error::new(
                error.kind(),
                format!("data directory {} is in use by another process ({error})", dir.display()),
            ));
        }
        Ok(DirLock { _file: file })
    }
}

/// Wall-clock milliseconds since the Unix epoch (Kafka timestamps).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}
