//! Write-behind: batches the WAL makes durable wait in memory (up to `WRITE_BEHIND_BYTES`
//! per segment) and reach the segment file in larger writes. Readers get the same bytes
//! wherever they are, and a restart after a crash has them back from the WAL.

use std::path::Path;

use bytes::Bytes;
use sluice_storage::batch::BatchIter;
use sluice_storage::segment::WRITE_BEHIND_BYTES;
use sluice_storage::{
    read_file_range, LogConfig, LogManager, ReadLimit, ReadMode, TopicPartition, FILE_RANGE_BYTES_MIN,
};

mod common;
use common::{append_acknowledged, batch};

/// Checks that `read` holds `expected`, in order, at offsets from `first_offset` on: the
/// bytes after the 16-byte prefix the broker fills in (base offset, length, leader epoch)
/// are the client's.
fn assert_batches(read: &[u8], expected: &[Bytes], first_offset: i64) {
    let found: Vec<_> = BatchIter::new(read).map(|item| item.unwrap()).collect();
    assert_eq!(found.len(), expected.len(), "batches read");
    for (i, ((header, range), batch)) in found.into_iter().zip(expected).enumerate() {
        assert_eq!(header.base_offset, first_offset + i as i64);
        assert_eq!(&read[range][16..], &batch[16..], "batch {i}");
    }
}

fn segment_file(root: &Path) -> Vec<u8> {
    std::fs::read(root.join("t-0").join(format!("{:020}.log", 0))).unwrap()
}

#[test]
fn batches_wait_in_memory_read_the_same_as_from_the_file_and_survive_a_crash_through_the_wal() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("logs");
    let manager = LogManager::with_wal(&root).unwrap();
    let log = manager.open(&TopicPartition::new("t", 0), LogConfig::default()).unwrap();

    // Ten batches of about 1 KiB, acknowledged: durable in the WAL, not yet in the segment.
    let first: Vec<Bytes> = (0..10).map(|i| batch(b'a' + i, 1000)).collect();
    append_acknowledged(&manager, &log, &first);
    let first_bytes: usize = first.iter().map(Bytes::len).sum();
    assert!(first_bytes < WRITE_BEHIND_BYTES);
    let file = segment_file(&root);
    assert!(file.iter().take(first_bytes).all(|&b| b == 0), "the batches went to the file one by one");
    // A consumer and a follower read them from memory, as appended.
    assert_batches(&log.read(0, 1 << 20, true, ReadMode::CachedOnly).unwrap(), &first, 0);
    assert_batches(&log.read_for_replica(3, 1 << 20, ReadMode::CachedOnly).unwrap(), &first[3..], 3);

    // More than the buffer holds: the first batches reach the file in one write.
    let second: Vec<Bytes> = (0..90).map(|i| batch(b'A' + (i % 26) as u8, 1000)).collect();
    append_acknowledged(&manager, &log, &second);
    let file = segment_file(&root);
    assert_batches(&file[..first_bytes], &first, 0);
    let all: Vec<Bytes> = first.iter().chain(&second).cloned().collect();
    // A read of the last batches (in memory), then one from the start (in the file; what
    // memory held is written out first), and a zero-copy range over all of it.
    assert_batches(&log.read(95, 1 << 20, true, ReadMode::CachedOnly).unwrap(), &all[95..], 95);
    let from_start = log.read(0, 1 << 20, true, ReadMode::MayBlock).unwrap();
    assert_batches(&from_start, &all, 0);
    let range = log.read_range_cached(0, 1 << 20, true, ReadLimit::HighWatermark).expect("a cached range");
    assert!(range.length >= FILE_RANGE_BYTES_MIN);
    assert_eq!(read_file_range(&range.file, range.position, range.length).unwrap(), from_start);

    // What memory holds after the last write is lost in a crash (no flush, no clean close)
    // and comes back from the WAL.
    let third: Vec<Bytes> = (0..5).map(|i| batch(b'0' + i, 2000)).collect();
    append_acknowledged(&manager, &log, &third);
    let end = log.offsets().log_end_offset;
    assert_eq!(end, 105);
    drop(log);
    std::mem::forget(manager);
    let file = segment_file(&root);
    assert!(BatchIter::new(&file).filter_map(Result::ok).all(|(header, _)| header.base_offset < 100));

    let manager = LogManager::with_wal(&root).unwrap();
    let log = manager.open(&TopicPartition::new("t", 0), LogConfig::default()).unwrap();
    assert_eq!(log.offsets().log_end_offset, end);
    let all: Vec<Bytes> = all.into_iter().chain(third).collect();
    assert_batches(&log.read(0, 1 << 20, true, ReadMode::MayBlock).unwrap(), &all, 0);
    manager.close();
}

#[test]
fn without_the_wal_an_acknowledged_batch_is_in_the_file_fsynced() {
    // Per-file fsyncs (no WAL): the fsync that acknowledges a batch must cover the bytes
    // the segment kept in memory, so a crash after it loses nothing.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("logs");
    let manager = LogManager::new(&root).unwrap();
    let log = manager.open(&TopicPartition::new("t", 0), LogConfig::default()).unwrap();
    let batches: Vec<Bytes> = (0..10).map(|i| batch(b'a' + i, 1000)).collect();
    append_acknowledged(&manager, &log, &batches);
    let total: usize = batches.iter().map(Bytes::len).sum();
    assert_batches(&segment_file(&root)[..total], &batches, 0);
    drop(log);
    std::mem::forget(manager);
    let manager = LogManager::new(&root).unwrap();
    let log = manager.open(&TopicPartition::new("t", 0), LogConfig::default()).unwrap();
    assert_batches(&log.read(0, 1 << 20, true, ReadMode::MayBlock).unwrap(), &batches, 0);
    manager.close();
}

#[test]
fn a_wal_checkpoint_writes_what_memory_held_before_the_wal_file_goes() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("logs");
    let manager = LogManager::with_wal(&root).unwrap();
    let log = manager.open(&TopicPartition::new("t", 0), LogConfig::default()).unwrap();
    // Rounds of 1 KiB batches until the first WAL file is full and handed to the
    // checkpointer: the last round's final batches are then still in memory, and only
    // that file holds them.
    let round: Vec<Bytes> = (0..1000).map(|i| batch(b'a' + (i % 26) as u8, 1000)).collect();
    let wal_dir = root.join(sluice_storage::wal::WAL_DIR);
    let wal_file = |sequence: u64| wal_dir.join(format!("{sequence:020}.wal"));
    let mut rounds = 0;
    while !wal_file(1).exists() {
        append_acknowledged(&manager, &log, &round);
        rounds += 1;
        assert!(rounds < 1000, "the WAL never rotated");
    }
    // The full first file is checkpointed (segments fsynced) and goes (recycled as the spare).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while wal_file(0).exists() {
        assert!(std::time::Instant::now() < deadline, "the full WAL file was never checkpointed");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let end = log.offsets().log_end_offset;
    assert_eq!(end, rounds * 1000);
    drop(log);
    std::mem::forget(manager);

    let manager = LogManager::with_wal(&root).unwrap();
    let log = manager.open(&TopicPartition::new("t", 0), LogConfig::default()).unwrap();
    assert_eq!(log.offsets().log_end_offset, end);
    let last_round_start = end - 1000;
    let read = log.read(last_round_start, 4 << 20, true, ReadMode::MayBlock).unwrap();
    assert_batches(&read, &round, last_round_start);
    manager.close();
}

#[test]
fn a_tailing_read_takes_new_batches_from_memory_without_writing_the_buffer_out() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("logs");
    let manager = LogManager::with_wal(&root).unwrap();
    let log = manager.open(&TopicPartition::new("t", 0), LogConfig::default()).unwrap();
    // A consumer at the log end reads each batch once it is acknowledged, across several
    // fillings of the buffer: no read may write the buffer out (only a full buffer does).
    for i in 0..200 {
        let appended = batch(b'a' + (i % 26) as u8, 1000);
        append_acknowledged(&manager, &log, std::slice::from_ref(&appended));
        let before = segment_file(&root);
        let read = log.read(i64::from(i), 1 << 20, true, ReadMode::CachedOnly).unwrap();
        assert_batches(&read, &[appended], i64::from(i));
        assert!(segment_file(&root) == before, "reading batch {i} wrote the buffer out");
    }
    manager.close();
}

#[test]
fn segment_bytes_reach_the_disk_steadily_not_at_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("logs");
    let manager = LogManager::with_wal(&root).unwrap();
    let log = manager.open(&TopicPartition::new("t", 0), LogConfig::default()).unwrap();
    // 1 MiB acknowledged: through the WAL (far from a full WAL file, so no checkpoint) and
    // into the segment file in write-behind writes.
    let batches: Vec<Bytes> = (0..1000).map(|i| batch(b'a' + (i % 26) as u8, 1000)).collect();
    append_acknowledged(&manager, &log, &batches);
    let path = root.join("t-0").join(format!("{:020}.log", 0));
    let file = std::fs::File::open(&path).unwrap();
    let written = (batches.len() * 1000 - WRITE_BEHIND_BYTES) as u64;
    let dirty = || sluice_storage::cachestat(&file, 0, written).map(|stat| stat.nr_dirty + stat.nr_writeback);
    if dirty().is_none() {
        return; // no cachestat (Linux < 6.5): nothing to observe
    }
    // The writeback runs on the WAL thread's schedule: rounds after its interval hand it
    // the partitions logged since. Without it, the pages stay dirty until a checkpoint or
    // the kernel's flusher (30 s).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut round = 0u8;
    while dirty() != Some(0) {
        assert!(std::time::Instant::now() < deadline, "{:?} pages of the segment still dirty", dirty());
        std::thread::sleep(std::time::Duration::from_millis(50));
        append_acknowledged(&manager, &log, &[batch(round, 100)]);
        round = round.wrapping_add(1);
    }
    manager.close();
}
