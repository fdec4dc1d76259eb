//! Idle and slow partitions cost little memory: each active segment holds a tail chunk, so
//! the chunk a partition starts with bounds the broker's memory at many partitions. (Its own
//! test binary: the tails' memory is counted per process.)

use bytes::Bytes;
use sluice_storage::{tail_memory_bytes, PAGE_BYTES};
use sluice_storage::{LogConfig, LogManager, TopicPartition};

mod common;
use common::{append_all_acknowledged, batch};

/// Partitions in the test: 64 KiB first chunks would hold 128 MiB here.
const PARTITIONS: usize = 2_000;
/// A partition with one small batch holds two pages of tail at most: 20 MiB at 10,000
/// partitions.
const TAIL_BYTES_PER_SLOW_PARTITION_MAX: usize = 2 * PAGE_BYTES;

#[test]
fn many_partitions_with_a_batch_each_hold_a_small_chunk_each() {
    let dir = tempfile::tempdir().unwrap();
    let manager = LogManager::with_wal(&dir.path().join("logs")).unwrap();
    let before = tail_memory_bytes();
    let logs: Vec<_> = (0..PARTITIONS)
        .map(|i| manager.open(&TopicPartition::new("many", i as i32), LogConfig::default()).unwrap())
        .collect();
    let batches: Vec<[Bytes; 1]> = (0..PARTITIONS).map(|i| [batch(b'a' + (i % 26) as u8, 1000)]).collect();
    let appends: Vec<_> = logs.iter().zip(&batches).map(|(log, batches)| (log, &batches[..])).collect();
    append_all_acknowledged(&manager, &appends);
    let held = tail_memory_bytes() - before;
    assert!(held >= PARTITIONS * PAGE_BYTES, "each partition's batch is in its tail: {held} bytes");
    assert!(
        held <= PARTITIONS * TAIL_BYTES_PER_SLOW_PARTITION_MAX,
        "{PARTITIONS} partitions of one 1 KB batch hold {held} bytes of tails"
    );
    manager.close();
}
