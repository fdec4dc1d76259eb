//! File ranges for zero-copy fetches: whatever range `read_range_cached` locates holds
//! exactly the bytes `read_until` returns for the same read (the same whole batches, the
//! same limits), so a response sent from the file is the response a copy would have made.

use bytes::{Bytes, BytesMut};
use kafka_protocol::records::{Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};
use sluice_storage::{
    read_file_range, FileRange, LogConfig, Partition, ReadError, ReadLimit, ReadMode, FILE_RANGE_BYTES_MIN,
};

const NOW_MS: i64 = 1_700_000_000_000;

fn config() -> LogConfig {
    LogConfig {
        flush_messages: u64::MAX,
        timestamp_before_max_ms: i64::MAX,
        segment_bytes: 1024 * 1024,
        ..LogConfig::default()
    }
}

/// A batch of `count` records of `value_bytes` each; transactional when `producer_id` >= 0.
fn batch(count: i32, value_bytes: usize, producer_id: i64, sequence: i32) -> Bytes {
    let records: Vec<Record> = (0..count)
        .map(|i| Record {
            transactional: producer_id >= 0,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id,
            producer_epoch: if producer_id >= 0 { 0 } else { -1 },
            timestamp_type: TimestampType::Creation,
            offset: i64::from(i),
            sequence: sequence + i,
            timestamp: NOW_MS,
            key: Some(Bytes::from(format!("k{i}"))),
            value: Some(Bytes::from(vec![b'a' + (i % 26) as u8; value_bytes])),
            headers: Default::default(),
        })
        .collect();
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(&mut buf, &records, &RecordEncodeOptions { version: 2, compression: Compression::None })
        .unwrap();
    buf.freeze()
}

/// `read_range_cached`, asked again a few times when a read of `copied_bytes` (a long one)
/// locates nothing: the kernel refuses a cache-only read while it holds a cached page locked
/// for a moment (compaction, writeback under another process's load), and the broker then
/// copies the read instead. Only which of the two serves it depends on that, not the bytes.
fn locate(
    log: &Partition,
    offset: i64,
    max_bytes: usize,
    min_one_batch: bool,
    limit: ReadLimit,
    copied_bytes: usize,
) -> Option<FileRange> {
    const ATTEMPTS: usize = 20;
    for _ in 0..ATTEMPTS {
        let range = log.read_range_cached(offset, max_bytes, min_one_batch, limit);
        if range.is_some() || copied_bytes < FILE_RANGE_BYTES_MIN {
            return range;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    None
}

/// Reads every segment file under `root` whole, so that its pages are cached: freshly
/// written pages may already be gone when the machine is short of memory, and a read that
/// brings pages from the disk drops them again.
fn bring_into_page_cache(root: &std::path::Path) {
    for entry in std::fs::read_dir(root).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|extension| extension == "log") {
            std::fs::read(&path).unwrap();
        }
    }
}

/// Checks every located range against `read_until`; returns how many reads were located.
fn check_reads(log: &Partition, offsets: &[i64], limit: ReadLimit) -> usize {
    let mut located = 0;
    for &offset in offsets {
        for max_bytes in [100, 70_000, 200_000, 1 << 20, 64 << 20] {
            for min_one_batch in [true, false] {
                let copied = log.read_until(offset, max_bytes, min_one_batch, limit, ReadMode::MayBlock).unwrap();
                let Some(range) = locate(log, offset, max_bytes, min_one_batch, limit, copied.len()) else { continue };
                let sent = read_file_range(&range.file, range.position, range.length).unwrap();
                assert_eq!(
                    sent, copied,
                    "offset {offset}, max_bytes {max_bytes}, min_one_batch {min_one_batch}: the range differs"
                );
                assert!(range.length >= FILE_RANGE_BYTES_MIN);
                located += 1;
            }
        }
    }
    located
}

#[test]
fn a_located_range_holds_exactly_the_batches_a_read_returns() {
    let dir = tempfile::tempdir().unwrap();
    let log = Partition::open(dir.path(), config()).unwrap();
    // Batches of 1 to 5 records of 100 to 3,000 bytes, and a few larger than a read's limit,
    // over several segments.
    let mut offsets = Vec::new();
    for i in 0..1200usize {
        let value_bytes = if i % 300 == 150 { 150_000 } else { 100 + (i * 7919) % 2900 };
        offsets.push(log.offsets().log_end_offset);
        log.append(&batch(1 + (i % 5) as i32, value_bytes, -1, 0), 0, NOW_MS).unwrap();
    }
    let end = log.offsets().log_end_offset;
    assert_eq!(log.offsets().high_watermark, end);
    // Batch starts, offsets inside batches, and the last offsets before the end.
    let mut probes: Vec<i64> = offsets.iter().step_by(37).copied().collect();
    probes.extend(offsets.iter().step_by(53).map(|&o| o + 1));
    probes.extend([end - 1, end - 40, 0]);
    probes.retain(|&o| o < end);
    bring_into_page_cache(dir.path());
    let located = check_reads(&log, &probes, ReadLimit::HighWatermark);
    assert!(located > 100, "freshly written data is cached, and most of these reads are long: {located} located");
    // A limit exactly at a batch's end, one byte short of it, and one past it.
    let whole = log.read_until(0, 1 << 20, true, ReadLimit::HighWatermark, ReadMode::MayBlock).unwrap();
    let boundary = batch_ends(&whole).into_iter().find(|&end| end >= 2 * FILE_RANGE_BYTES_MIN).unwrap();
    bring_into_page_cache(dir.path());
    for max_bytes in [boundary - 1, boundary, boundary + 1] {
        let copied = log.read_until(0, max_bytes, true, ReadLimit::HighWatermark, ReadMode::MayBlock).unwrap();
        let range =
            locate(&log, 0, max_bytes, true, ReadLimit::HighWatermark, copied.len()).expect("a long cached read");
        assert_eq!(
            read_file_range(&range.file, range.position, range.length).unwrap(),
            copied,
            "max_bytes {max_bytes}"
        );
    }
    // A read near the end is short: it is copied.
    assert!(log.read_range_cached(end - 1, 1 << 20, true, ReadLimit::HighWatermark).is_none());
    // Nothing is located at or past the end, before the start, or out of range.
    assert!(log.read_range_cached(end, 1 << 20, true, ReadLimit::HighWatermark).is_none());
    assert!(log.read_range_cached(end + 5, 1 << 20, true, ReadLimit::HighWatermark).is_none());
}

#[test]
fn a_located_range_stops_at_the_last_stable_offset() {
    let dir = tempfile::tempdir().unwrap();
    let log = Partition::open(dir.path(), config()).unwrap();
    for i in 0..200usize {
        log.append(&batch(2, 500 + i * 13, -1, 0), 0, NOW_MS).unwrap();
    }
    // A transaction opened here holds the last stable offset while more batches follow.
    let open_at = log.offsets().log_end_offset;
    log.append(&batch(3, 400, 7, 0), 0, NOW_MS).unwrap();
    for i in 0..200usize {
        log.append(&batch(2, 500 + i * 11, -1, 0), 0, NOW_MS).unwrap();
    }
    assert_eq!(log.offsets().last_stable_offset, open_at);
    let located = check_reads(&log, &[0, 1, 100, 201, open_at - 150], ReadLimit::LastStable);
    assert!(located > 5, "{located} located");
    let range = locate(&log, 0, 64 << 20, true, ReadLimit::LastStable, usize::MAX).expect("a long cached read");
    let sent = read_file_range(&range.file, range.position, range.length).unwrap();
    let last = last_offset_of(&sent);
    assert_eq!(last, open_at - 1, "the range ends with the last batch before the open transaction");
    // At the high watermark the same read goes on past the transaction.
    let beyond = locate(&log, 0, 64 << 20, true, ReadLimit::HighWatermark, usize::MAX).expect("a long cached read");
    assert!(beyond.length > range.length);
}

/// Where each batch in `batches` ends.
fn batch_ends(batches: &[u8]) -> Vec<usize> {
    let mut ends = Vec::new();
    let mut at = 0;
    while at < batches.len() {
        at += 12 + i32::from_be_bytes(batches[at + 8..at + 12].try_into().unwrap()) as usize;
        ends.push(at);
    }
    ends
}

/// The last offset of the last batch in `batches`.
fn last_offset_of(batches: &[u8]) -> i64 {
    let mut at = 0;
    let mut last = -1;
    while at < batches.len() {
        let base = i64::from_be_bytes(batches[at..at + 8].try_into().unwrap());
        let length = i32::from_be_bytes(batches[at + 8..at + 12].try_into().unwrap()) as usize;
        let delta = i32::from_be_bytes(batches[at + 23..at + 27].try_into().unwrap());
        last = base + i64::from(delta);
        at += 12 + length;
    }
    assert_eq!(at, batches.len(), "whole batches");
    last
}

#[test]
fn a_range_keeps_its_bytes_when_the_log_is_cut_below_the_high_watermark_and_written_again() {
    // A replica cut below its high watermark (one that async replication or an unclean
    // election lost) takes new batches where the cut ones lay, while a `sendfile` of the
    // old ones may still be in flight.
    let dir = tempfile::tempdir().unwrap();
    let log = Partition::open(dir.path(), config()).unwrap();
    for i in 0..100usize {
        log.append(&batch(2, 600 + i, -1, 0), 0, NOW_MS).unwrap();
    }
    let end = log.offsets().high_watermark;
    assert_eq!(end, 200);
    let range = locate(&log, 0, 64 << 20, true, ReadLimit::HighWatermark, usize::MAX).expect("a long cached read");
    let located = read_file_range(&range.file, range.position, range.length).unwrap();
    assert_eq!(last_offset_of(&located), end - 1);

    log.truncate_to(end / 2).unwrap();
    assert_eq!(log.offsets().log_end_offset, end / 2);
    assert_eq!(log.offsets().high_watermark, end / 2);
    for _ in 0..100 {
        log.append(&batch(3, 700, -1, 0), 1, NOW_MS).unwrap();
    }
    let sent = read_file_range(&range.file, range.position, range.length).unwrap();
    assert!(sent == located, "a range located before the cut still holds the batches it located");
    // The log itself holds the new batches past the cut.
    let now = log.read_until(end / 2, 1 << 20, true, ReadLimit::HighWatermark, ReadMode::MayBlock).unwrap();
    assert_eq!(&now[..], &log.read_until(end / 2, 1 << 20, true, ReadLimit::LogEnd, ReadMode::MayBlock).unwrap()[..]);
    assert_eq!(last_offset_of(&now), end / 2 + 300 - 1);
    // And it reopens so.
    log.close().unwrap();
    drop(log);
    let reopened = Partition::open(dir.path(), config()).unwrap();
    assert_eq!(reopened.offsets().log_end_offset, end / 2 + 300);
    let reread = reopened.read_until(end / 2, 1 << 20, true, ReadLimit::HighWatermark, ReadMode::MayBlock).unwrap();
    assert_eq!(reread, now);
}

/// A consumer catching up on a backlog that is in the page cache reads it from there, one
/// fetch after another: a blocking backlog read drops the batches it returned from the page
/// cache (a consumed backlog must not fill it), but not the pages where the reader's next
/// read starts (the index entry before its next batch). Dropping those sent every later read
/// of the partition to the disk and the blocking pool, and each dropped the next one's start
/// in its turn (at 320k msg/s nearly every fetch, consumers at 60-70 MB/s).
#[test]
fn a_backlog_read_leaves_the_next_reads_start_in_the_page_cache() {
    let dir = tempfile::tempdir().unwrap();
    let log = Partition::open(dir.path(), LogConfig { segment_bytes: 64 << 20, ..config() }).unwrap();
    // 12 MiB of batches of 1 to 3 KiB: reads end inside batches and index entries fall
    // between reads' ends.
    let mut i = 0usize;
    while log.size_bytes() < 12 << 20 {
        log.append(&batch(1, 1000 + (i * 7919) % 2000, -1, 0), 0, NOW_MS).unwrap();
        i += 1;
    }
    // Clean pages, as written back: the page cache may drop them.
    let segment = std::fs::File::open(segment_path(dir.path())).unwrap();
    segment.sync_all().unwrap();
    let size = segment.metadata().unwrap().len();
    assert_eq!(sluice_storage::cachestat(&segment, 0, size).unwrap().nr_dirty, 0);
    bring_into_page_cache(dir.path());
    let mut offset = 0;
    for read in 0..8 {
        // What a fetch on the blocking pool reads (a 256 KiB byte limit, far from the end).
        let batches = log.read(offset, 256 * 1024, true, ReadMode::MayBlock).unwrap();
        assert!(batches.len() > 200 * 1024, "read {read}: {} bytes", batches.len());
        let next = last_offset_of(&batches) + 1;
        // The next fetch's cache-only pass serves it on the async thread.
        // (Asked again a few times: the kernel refuses a cache-only read of a page it holds
        // locked for a moment, see `locate`.)
        let following = (0..20).find_map(|_| {
            let read = log.read(next, 256 * 1024, true, ReadMode::CachedOnly).ok();
            if read.is_none() {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            read
        });
        assert!(following.is_some(), "read {read}: the next read's start was dropped from the page cache");
        // What the read returned is gone from the page cache, bar its last pages.
        let returned_again = log.read(offset, 64 * 1024, true, ReadMode::CachedOnly);
        assert!(
            matches!(returned_again, Err(ReadError::WouldBlock)),
            "read {read}: the consumed backlog stayed in the page cache"
        );
        offset = next;
    }
}

fn segment_path(root: &std::path::Path) -> std::path::PathBuf {
    root.join(format!("{:020}.log", 0))
}
