//! Sluice's storage engine: durable, crash-safe partition logs of Kafka record batches.
//!
//! The map: a [`LogManager`] owns every [`Partition`] of this node and the group-commit
//! [`Syncer`]; a partition is a set of [`segment::Segment`] files with sparse offset and
//! time indexes, plus its idempotent-producer state. Batches are stored byte for byte as
//! the client sent them; only the base offset and the leader epoch are written by us.
//!
//! Two offsets are kept apart: the log end offset (what has been written) and the high
//! watermark (what may be read and acknowledged). With the default durability the high
//! watermark only moves once an `fdatasync` covers the data, so nothing a consumer sees
//! can vanish in a crash.
//!
//! Storage knows nothing of the Kafka wire protocol beyond the batch header.

pub mod batch;
mod log;
mod manager;
pub mod producer_state;
pub mod segment;
mod syncer;

use std::fs::File;
use std::io::{self, Write};
use std::path::Path;

pub use crate::log::{AppendError, AppendOutcome, LogConfig, LogOffsets, Partition, ReadError, Visible};
pub use crate::manager::{LogManager, TopicPartition};
pub use crate::syncer::Syncer;

/// Writes a small file so that a crash leaves either the old or the new content.
pub fn write_file_atomically(path: &Path, data: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    {
        let mut file = File::create(&tmp)?;
        file.write_all(data)?;
        file.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// Wall-clock milliseconds since the Unix epoch (Kafka timestamps).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}
