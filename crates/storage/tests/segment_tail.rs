//! The segment's tail: batches the WAL makes durable go into chunks of memory that readers
//! take as they are and that reach the segment file in direct-I/O writes of whole pages
//! (`log_segment_direct_io`; every test here sets it, the other test files run the default,
//! writes through the page cache). Readers get the same bytes wherever they are, the file
//! gets them without a checkpoint, and a restart after a crash has them back from the WAL.

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use sluice_storage::batch::BatchIter;
use sluice_storage::{LogConfig, LogManager, ReadLimit, ReadMode, TopicPartition};
use sluice_storage::{TAIL_CHUNK_BYTES_MAX, TAIL_CHUNK_BYTES_MIN, TAIL_FROZEN_CHUNKS_MAX};

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

fn segment_path(root: &Path) -> std::path::PathBuf {
    root.join("t-0").join(format!("{:020}.log", 0))
}

fn segment_file(root: &Path) -> Vec<u8> {
    std::fs::read(segment_path(root)).unwrap()
}

/// Reads from `offset` to the log end as a consumer does, fetch after fetch (a fetch ends
/// where the tail chunk it started in ends).
fn read_all(log: &sluice_storage::Partition, mut offset: i64, mode: ReadMode) -> Vec<u8> {
    let end = log.offsets().high_watermark;
    let mut out = Vec::new();
    while offset < end {
        // As a fetch does: what is not in memory or the page cache is read again, blocking.
        let read = match log.read(offset, 8 << 20, true, mode) {
            Err(sluice_storage::ReadError::WouldBlock) => log.read(offset, 8 << 20, true, ReadMode::MayBlock),
            read => read,
        }
        .unwrap();
        let last = BatchIter::new(&read)
            .map(|item| item.unwrap().0)
            .last()
            .expect("a read at an offset below the end returns a batch");
        out.extend_from_slice(&read);
        offset = last.last_offset() + 1;
    }
    out
}

#[test]
fn batches_in_the_tail_read_the_same_from_memory_and_the_file_and_survive_a_crash_through_the_wal() {
    sluice_storage::set_direct_writes(true);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("logs");
    let manager = LogManager::with_wal(&root).unwrap();
    let log = manager.open(&TopicPartition::new("t", 0), LogConfig::default()).unwrap();

    // Five batches of about 1 KiB, acknowledged: durable in the WAL, in the first chunk, and
    // not in the segment file (the writeback waits for 64 KiB of whole pages).
    let first: Vec<Bytes> = (0..5).map(|i| batch(b'a' + i, 1000)).collect();
    append_acknowledged(&manager, &log, &first);
    let first_bytes: usize = first.iter().map(Bytes::len).sum();
    assert!(first_bytes < TAIL_CHUNK_BYTES_MIN);
    let file = segment_file(&root);
    assert!(file.iter().take(first_bytes).all(|&b| b == 0), "the batches went to the file one by one");
    // A consumer and a follower read them from memory, as appended.
    assert_batches(&log.read(0, 1 << 20, true, ReadMode::CachedOnly).unwrap(), &first, 0);
    assert_batches(&log.read_for_replica(3, 1 << 20, ReadMode::CachedOnly).unwrap(), &first[3..], 3);

    // More than the first chunk holds: it is frozen, and the writeback writes it to the file
    // (it runs after WAL rounds, at most every 100 ms).
    let second: Vec<Bytes> = (0..90).map(|i| batch(b'A' + (i % 26) as u8, 1000)).collect();
    append_acknowledged(&manager, &log, &second);
    let mut all: Vec<Bytes> = first.iter().chain(&second).cloned().collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while segment_file(&root)[..first_bytes] != read_all(&log, 0, ReadMode::CachedOnly)[..first_bytes] {
        assert!(Instant::now() < deadline, "the frozen chunk never reached the file");
        std::thread::sleep(Duration::from_millis(50));
        let more = batch(b'z', 10);
        append_acknowledged(&manager, &log, std::slice::from_ref(&more));
        all.push(more);
    }
    // From the start (the file, then memory) and from the last batches (memory).
    assert_batches(&read_all(&log, 0, ReadMode::CachedOnly), &all, 0);
    assert_batches(&read_all(&log, 95, ReadMode::CachedOnly), &all[95..], 95);

    // What memory held after the last writeback is lost in a crash (no flush, no clean
    // close) and comes back from the WAL.
    let end_before = log.offsets().log_end_offset;
    let third: Vec<Bytes> = (0..5).map(|i| batch(b'0' + i, 2000)).collect();
    append_acknowledged(&manager, &log, &third);
    let end = log.offsets().log_end_offset;
    assert_eq!(end, end_before + 5);
    let expected = read_all(&log, 0, ReadMode::CachedOnly);
    drop(log);
    std::mem::forget(manager);

    let manager = LogManager::with_wal(&root).unwrap();
    let log = manager.open(&TopicPartition::new("t", 0), LogConfig::default()).unwrap();
    assert_eq!(log.offsets().log_end_offset, end);
    assert_eq!(read_all(&log, 0, ReadMode::MayBlock), expected, "the log after replay");
    manager.close();
}

#[test]
fn reads_from_every_offset_across_chunks_return_the_batches_in_order() {
    sluice_storage::set_direct_writes(true);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("logs");
    let manager = LogManager::with_wal(&root).unwrap();
    let config = LogConfig { max_message_bytes: 4 << 20, ..LogConfig::default() };
    let log = manager.open(&TopicPartition::new("t", 0), config.clone()).unwrap();
    // Batches of varied sizes over several chunks, one larger than the largest chunk.
    let sizes = [100, 3000, 70_000, 1000, 4096 - 61, 20_000, TAIL_CHUNK_BYTES_MAX + 5000, 500, 9000];
    let batches: Vec<Bytes> = (0..60).map(|i| batch(b'a' + (i % 26) as u8, sizes[i % sizes.len()])).collect();
    for group in batches.chunks(7) {
        append_acknowledged(&manager, &log, group);
    }
    let end = batches.len() as i64;
    let mut spanned_chunks = false;
    for from in 0..end {
        let read = read_all(&log, from, ReadMode::CachedOnly);
        assert_batches(&read, &batches[from as usize..], from);
        let replica = log.read_for_replica(from, 16 << 20, ReadMode::MayBlock).unwrap();
        let count = BatchIter::new(&replica).count();
        assert!(count >= 1);
        assert_batches(&replica, &batches[from as usize..from as usize + count], from);
        // The same read as the chunks it spans, each whole batches, in memory as they are.
        let parts = log.read_parts_until(from, 16 << 20, true, ReadLimit::LogEnd, ReadMode::MayBlock).unwrap();
        assert!(parts.iter().all(|part| BatchIter::new(part).all(|item| item.is_ok()) && !part.is_empty()));
        assert_eq!(parts.concat(), replica.to_vec(), "the pieces of a read from {from} joined");
        spanned_chunks |= parts.len() > 1;
    }
    assert!(spanned_chunks, "some reads span several chunks");
    // A restart reads the same bytes from the file.
    let expected = read_all(&log, 0, ReadMode::CachedOnly);
    drop(log);
    manager.close();
    let manager = LogManager::with_wal(&root).unwrap();
    let log = manager.open(&TopicPartition::new("t", 0), config).unwrap();
    assert_eq!(read_all(&log, 0, ReadMode::MayBlock), expected);
    manager.close();
}

#[test]
fn without_the_wal_an_acknowledged_batch_is_in_the_file_fsynced() {
    sluice_storage::set_direct_writes(true);
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
    sluice_storage::set_direct_writes(true);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("logs");
    let manager = LogManager::with_wal(&root).unwrap();
    let log = manager.open(&TopicPartition::new("t", 0), LogConfig::default()).unwrap();
    // Rounds of 1 KiB batches until the first WAL file is full and handed to the
    // checkpointer: the last round's final batches are then still in memory, and only
    // that file holds them.
    let round: Vec<Bytes> = (0..1000).map(|i| batch(b'a' + (i % 26) as u8, 1000)).collect();
    let wal_dir = root.join(sluice_storage::WAL_DIR);
    let wal_file = |sequence: u64| wal_dir.join(format!("{sequence:020}.wal"));
    let mut rounds = 0;
    while !wal_file(1).exists() {
        append_acknowledged(&manager, &log, &round);
        rounds += 1;
        assert!(rounds < 1000, "the WAL never rotated");
    }
    // The full first file is checkpointed (segments fsynced) and goes (recycled as the spare).
    let deadline = Instant::now() + Duration::from_secs(30);
    while wal_file(0).exists() {
        assert!(Instant::now() < deadline, "the full WAL file was never checkpointed");
        std::thread::sleep(Duration::from_millis(20));
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
fn segment_bytes_reach_the_file_steadily_with_direct_io_not_through_the_page_cache() {
    sluice_storage::set_direct_writes(true);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("logs");
    let manager = LogManager::with_wal(&root).unwrap();
    let log = manager.open(&TopicPartition::new("t", 0), LogConfig::default()).unwrap();
    // 1 MiB acknowledged: through the WAL (far from a full WAL file, so no checkpoint),
    // into tail chunks, which the writeback writes to the segment file.
    let batches: Vec<Bytes> = (0..1000).map(|i| batch(b'a' + (i % 26) as u8, 1000)).collect();
    append_acknowledged(&manager, &log, &batches);
    let expected = read_all(&log, 0, ReadMode::CachedOnly);
    // Everything but the last chunk (at most 1 MiB, which may be still filling).
    let frozen = expected.len() - TAIL_CHUNK_BYTES_MAX.min(expected.len() / 2);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut round = 0u8;
    while segment_file(&root)[..frozen] != expected[..frozen] {
        assert!(Instant::now() < deadline, "the segment file never got the tail's bytes");
        std::thread::sleep(Duration::from_millis(50));
        append_acknowledged(&manager, &log, &[batch(round, 100)]);
        round = round.wrapping_add(1);
    }
    manager.close();
}

#[test]
fn a_consumer_behind_the_tails_memory_reads_the_file_with_direct_io_leaving_the_page_cache_empty() {
    sluice_storage::set_direct_writes(true);
    // On the build's disk: a temporary directory may be a tmpfs, which refuses direct I/O.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let root = dir.path().join("logs");
    let manager = LogManager::with_wal(&root).unwrap();
    let config = LogConfig { max_message_bytes: 4 << 20, ..LogConfig::default() };
    let log = manager.open(&TopicPartition::new("t", 0), config).unwrap();
    // Batches of a chunk each, until the first has left the tail's memory (once written by
    // the writeback, past the chunks a segment keeps: the reads here lag, so its age alone
    // does not let it go). Written directly, it is on the disk only: a read that may not
    // wait for the disk cannot have it.
    let mut appended: Vec<Bytes> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match log.read(0, 8 << 20, true, ReadMode::CachedOnly) {
            Err(sluice_storage::ReadError::WouldBlock) => break,
            read => assert!(read.is_ok(), "{read:?}"),
        }
        assert!(Instant::now() < deadline, "the first chunk never left the tail's memory");
        let next = batch(b'a' + (appended.len() % 26) as u8, TAIL_CHUNK_BYTES_MAX);
        append_acknowledged(&manager, &log, std::slice::from_ref(&next));
        appended.push(next);
        if appended.len() > TAIL_FROZEN_CHUNKS_MAX {
            std::thread::sleep(Duration::from_millis(150));
        }
    }
    // A consumer reads it all, as fetches do: the file behind the memory on the blocking
    // path, with direct I/O, the rest from memory. It gets the batches as they were sent,
    // and the page cache holds none of the file (direct writes, direct reads), however far
    // behind the log end the reads were.
    let read = read_all(&log, 0, ReadMode::CachedOnly);
    assert_batches(&read, &appended, 0);
    let file = std::fs::File::open(segment_path(&root)).unwrap();
    let stat = sluice_storage::cachestat(&file, 0, read.len() as u64).expect("cachestat (Linux 6.5)");
    assert_eq!(stat.nr_cache, 0, "a read behind the tail's memory brought pages into the page cache");
    manager.close();
}
