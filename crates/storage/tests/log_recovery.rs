//! Partition log behaviour on a real filesystem: append, read, fsync visibility, torn-tail
//! recovery, segment roll, retention and idempotent-producer state across restarts.

use std::io::Write;
use std::sync::Arc;

use bytes::Bytes;
use sluice_storage::batch::{validate_batch, BatchIter};
use sluice_storage::{AppendError, LogConfig, LogManager, Partition, ReadMode, TopicPartition};

/// An uncompressed batch of `count` one-byte records (CRC computed as a client would).
fn batch(count: i32, timestamp: i64, producer: Option<(i64, i16, i32)>) -> Bytes {
    let mut records = Vec::new();
    for i in 0..count {
        let body = [0u8, 0, (i as u8) << 1, 1, 2, b'x', 0];
        records.push((body.len() as u8) << 1);
        records.extend_from_slice(&body);
    }
    let (pid, epoch, seq) = producer.unwrap_or((-1, -1, -1));
    let mut buf = Vec::new();
    buf.extend_from_slice(&0i64.to_be_bytes());
    buf.extend_from_slice(&((49 + records.len()) as i32).to_be_bytes());
    buf.extend_from_slice(&0i32.to_be_bytes());
    buf.push(2);
    buf.extend_from_slice(&0u32.to_be_bytes());
    buf.extend_from_slice(&0i16.to_be_bytes());
    buf.extend_from_slice(&(count - 1).to_be_bytes());
    buf.extend_from_slice(&timestamp.to_be_bytes());
    buf.extend_from_slice(&timestamp.to_be_bytes());
    buf.extend_from_slice(&pid.to_be_bytes());
    buf.extend_from_slice(&epoch.to_be_bytes());
    buf.extend_from_slice(&seq.to_be_bytes());
    buf.extend_from_slice(&count.to_be_bytes());
    buf.extend_from_slice(&records);
    let crc = sluice_storage::checksum::crc32c(&buf[21..]);
    buf[17..21].copy_from_slice(&crc.to_be_bytes());
    Bytes::from(buf)
}

fn page_cache_config() -> LogConfig {
    LogConfig { flush_messages: u64::MAX, ..LogConfig::default() }
}

fn read_offsets(partition: &Partition, from: i64) -> Vec<(i64, i64)> {
    let bytes = partition.read(from, 1 << 20, true, ReadMode::MayBlock).unwrap();
    BatchIter::new(&bytes)
        .map(|item| {
            let (header, range) = item.unwrap();
            validate_batch(&bytes[range]).unwrap();
            (header.base_offset, header.last_offset())
        })
        .collect()
}

#[test]
fn fsync_mode_hides_data_until_synced() {
    let dir = tempfile::tempdir().unwrap();
    let manager = LogManager::new(dir.path()).unwrap();
    let partition = manager.open(&TopicPartition::new("t", 0), LogConfig::default()).unwrap();
    let outcome = partition.append(&batch(3, 10, None), 0, 0).unwrap();
    assert!(outcome.needs_sync);
    assert_eq!(outcome.visible_at, 3);
    assert_eq!(partition.offsets().high_watermark, 0);
    assert!(partition.read(0, 1 << 20, true, ReadMode::MayBlock).unwrap().is_empty());
    manager.syncer().schedule(&partition);
    let mut visible = partition.subscribe();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(visible.wait_for(|v| v.high_watermark >= 3)).unwrap();
    assert_eq!(read_offsets(&partition, 0), vec![(0, 2)]);
    manager.close();
}

#[test]
fn torn_tail_is_cut_and_appends_continue() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    {
        let partition = Partition::open(&path, page_cache_config()).unwrap();
        for _ in 0..10 {
            partition.append(&batch(2, 5, None), 0, 0).unwrap();
        }
        // Simulate a crash: no close(); then tear the last batch in half.
    }
    let log = path.join(format!("{:020}.log", 0));
    let full = std::fs::read(&log).unwrap();
    let one = batch(2, 5, None).len();
    let mut torn = full[..one * 10 - one / 2].to_vec();
    torn.extend_from_slice(&[0u8; 1000]);
    std::fs::write(&log, &torn).unwrap();

    let partition = Partition::open(&path, page_cache_config()).unwrap();
    assert_eq!(partition.offsets().log_end_offset, 18);
    assert_eq!(read_offsets(&partition, 0).len(), 9);
    partition.append(&batch(1, 5, None), 0, 0).unwrap();
    assert_eq!(read_offsets(&partition, 18), vec![(18, 18)]);
}

#[test]
fn garbage_after_valid_batches_is_not_served() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    {
        let partition = Partition::open(&path, page_cache_config()).unwrap();
        partition.append(&batch(2, 5, None), 0, 0).unwrap();
    }
    let log = path.join(format!("{:020}.log", 0));
    let mut file = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
    let mut stale = batch(2, 5, None).to_vec();
    stale[0..8].copy_from_slice(&77i64.to_be_bytes()); // a valid CRC but the wrong offset
    file.write_all(&stale).unwrap();
    drop(file);
    let partition = Partition::open(&path, page_cache_config()).unwrap();
    assert_eq!(partition.offsets().log_end_offset, 2);
}

#[test]
fn segments_roll_and_survive_clean_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    let config = LogConfig { segment_bytes: 1000, ..page_cache_config() };
    {
        let partition = Partition::open(&path, config.clone()).unwrap();
        for i in 0..100 {
            partition.append(&batch(3, i, None), 0, i).unwrap();
        }
        partition.close().unwrap();
    }
    let segments = std::fs::read_dir(&path)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "log"))
        .count();
    assert!(segments > 5, "expected many segments, got {segments}");
    let partition = Partition::open(&path, config).unwrap();
    assert_eq!(partition.offsets().log_end_offset, 300);
    let mut next = 0;
    while next < 300 {
        let got = read_offsets(&partition, next);
        assert!(!got.is_empty());
        assert!(got[0].0 <= next && next <= got[0].1);
        next = got.last().unwrap().1 + 1;
    }
    let batch_bytes = partition.batch_for_timestamp(50).unwrap().unwrap();
    assert_eq!(validate_batch(&batch_bytes).unwrap().base_offset, 150);
    // Every timestamp finds its batch across the segments (scanned after the log's lock),
    // none past the newest, and none below the log start once DeleteRecords moved it.
    for timestamp in [0, 1, 33, 98, 99] {
        let found = partition.batch_for_timestamp(timestamp).unwrap().unwrap();
        assert_eq!(validate_batch(&found).unwrap().base_offset, 3 * timestamp, "timestamp {timestamp}");
    }
    assert!(partition.batch_for_timestamp(100).unwrap().is_none());
    partition.delete_records_before(200).unwrap();
    let found = partition.batch_for_timestamp(10).unwrap().unwrap();
    assert!(validate_batch(&found).unwrap().last_offset() >= 200, "a batch below the log start");
}

#[test]
fn retention_by_size_and_delete_records_move_log_start() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig { segment_bytes: 1000, retention_bytes: 3000, ..page_cache_config() };
    let partition = Partition::open(&dir.path().join("t-0"), config).unwrap();
    for i in 0..100 {
        partition.append(&batch(3, i, None), 0, i).unwrap();
    }
    assert!(partition.apply_retention(1000) > 0);
    assert!(partition.size_bytes() <= 4000);
    let start = partition.offsets().log_start_offset;
    assert!(start > 0);
    assert!(matches!(
        partition.read(0, 100, true, ReadMode::MayBlock),
        Err(sluice_storage::ReadError::OffsetOutOfRange { .. })
    ));
    assert_eq!(partition.delete_records_before(290).unwrap(), 290);
    assert_eq!(partition.offsets().log_start_offset, 290);
}

/// DeleteRecords and retention delete segment files without the log's lock, while appends
/// go on: the log start only moves forward, no segment file at or past it goes, every one
/// wholly below it goes, and a reopened log starts where DeleteRecords left it with every
/// record from there readable.
#[test]
fn delete_records_and_retention_racing_appends_keep_the_log_whole() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    let config = LogConfig { segment_bytes: 1000, retention_bytes: 20_000, ..page_cache_config() };
    let partition = Arc::new(Partition::open(&path, config.clone()).unwrap());
    let appending = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let deleter = {
        let (partition, appending) = (partition.clone(), appending.clone());
        std::thread::spawn(move || {
            let mut last_start = 0;
            let mut round = 0;
            while appending.load(std::sync::atomic::Ordering::Relaxed) || round < 100 {
                round += 1;
                let high_watermark = partition.offsets().high_watermark;
                let start = if round % 2 == 0 {
                    partition.delete_records_before(high_watermark / 2).unwrap()
                } else {
                    partition.apply_retention(0);
                    partition.offsets().log_start_offset
                };
                assert!(start >= last_start, "the log start moved back: {last_start} -> {start}");
                last_start = start;
                std::thread::yield_now();
            }
        })
    };
    for i in 0..2000 {
        partition.append(&batch(3, i, None), 0, i).unwrap();
    }
    appending.store(false, std::sync::atomic::Ordering::Relaxed);
    deleter.join().unwrap();
    // Inside a segment, past where retention and the racing deletions left the start.
    let start = partition.offsets().log_start_offset + 2;
    assert_eq!(partition.delete_records_before(start).unwrap(), start);
    let bases: Vec<i64> = std::fs::read_dir(&path)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .map(|p| p.file_stem().unwrap().to_str().unwrap().parse().unwrap())
        .collect();
    let first = *bases.iter().min().unwrap();
    assert!(first <= start, "a segment at or past the log start was deleted");
    assert_eq!(bases.iter().filter(|&&b| b <= start).count(), 1, "segments wholly below the start stay: {bases:?}");
    drop(partition);
    let reopened = Partition::open(&path, config).unwrap();
    assert_eq!(reopened.offsets().log_start_offset, start);
    assert_eq!(reopened.offsets().log_end_offset, 6000);
    let mut next = start;
    while next < 6000 {
        let got = read_offsets(&reopened, next);
        assert!(got[0].0 <= next && next <= got[0].1, "offset {next} is not readable");
        next = got.last().unwrap().1 + 1;
    }
}

#[test]
fn idempotent_duplicates_survive_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    {
        let partition = Partition::open(&path, page_cache_config()).unwrap();
        assert_eq!(partition.append(&batch(2, 1, Some((42, 0, 0))), 0, 0).unwrap().base_offset, 0);
        assert_eq!(partition.append(&batch(2, 1, Some((42, 0, 2))), 0, 0).unwrap().base_offset, 2);
        // crash: no close
    }
    let partition = Partition::open(&path, page_cache_config()).unwrap();
    let retry = partition.append(&batch(2, 1, Some((42, 0, 2))), 0, 0).unwrap();
    assert!(retry.duplicate);
    assert_eq!(retry.base_offset, 2);
    // The retry of a 2-record batch is answered once both records are visible, not the first.
    assert_eq!(retry.visible_at, 4);
    assert!(matches!(partition.append(&batch(1, 1, Some((42, 0, 7))), 0, 0), Err(AppendError::OutOfOrderSequence)));
    assert_eq!(partition.append(&batch(1, 1, Some((42, 0, 4))), 0, 0).unwrap().base_offset, 4);
    assert_eq!(partition.offsets().log_end_offset, 5);
}

#[test]
fn corrupt_and_oversized_batches_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig { max_message_bytes: 100, ..page_cache_config() };
    let partition = Arc::new(Partition::open(&dir.path().join("t-0"), config).unwrap());
    let mut bad = batch(2, 1, None).to_vec();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    assert!(matches!(partition.append(&Bytes::from(bad), 0, 0), Err(AppendError::Corrupt(_))));
    assert!(matches!(partition.append(&batch(20, 1, None), 0, 0), Err(AppendError::TooLarge { .. })));
    assert_eq!(partition.offsets().log_end_offset, 0);
}

// ---- replication: follower appends, leader-epoch cache, truncation, external high watermark

fn small_segments_config() -> LogConfig {
    LogConfig { flush_messages: u64::MAX, segment_bytes: 200, ..LogConfig::default() }
}

/// Everything the leader has from `from`, as a follower would fetch it (a read stops at a
/// segment end, so this loops like a fetcher).
fn replica_bytes(leader: &Partition, mut from: i64) -> Vec<Bytes> {
    let mut chunks = Vec::new();
    while from < leader.offsets().log_end_offset {
        let chunk = leader.read_for_replica(from, 1 << 20, ReadMode::MayBlock).unwrap();
        let last = BatchIter::new(&chunk).last().unwrap().unwrap().0;
        from = last.last_offset() + 1;
        chunks.push(chunk);
    }
    chunks
}

fn all_offsets(partition: &Partition) -> Vec<(i64, i64)> {
    let chunks = replica_bytes(partition, partition.offsets().log_start_offset);
    chunks
        .iter()
        .flat_map(|c| BatchIter::new(c).map(|b| b.unwrap().0))
        .map(|h| (h.base_offset, h.last_offset()))
        .collect()
}

#[test]
fn follower_stores_leader_batches_verbatim_and_knows_their_epochs() {
    let dir = tempfile::tempdir().unwrap();
    let leader = Partition::open(&dir.path().join("leader"), small_segments_config()).unwrap();
    for epoch in [1, 1, 1, 3, 3] {
        leader.append(&batch(2, 7, None), epoch, 0).unwrap();
    }
    let shipped = replica_bytes(&leader, 0);
    assert!(shipped.len() > 1, "the test needs several segments");
    let follower = Partition::open(&dir.path().join("follower"), small_segments_config()).unwrap();
    for chunk in &shipped {
        let appended = follower.append_replica(chunk, 0).unwrap();
        assert!(!appended.needs_sync);
    }
    assert_eq!(follower.offsets().log_end_offset, 10);
    assert_eq!(replica_bytes(&follower, 0), shipped);
    // Re-sending what the follower already has is ignored; a batch overlapping the log end
    // is refused; a gap (a compacted leader's log) is taken.
    assert_eq!(follower.append_replica(&shipped[0], 0).unwrap().log_end_offset, 10);
    let gap = shipped[0].clone();
    let other = Partition::open(&dir.path().join("other"), small_segments_config()).unwrap();
    other.append(&batch(1, 7, None), 1, 0).unwrap();
    assert!(matches!(other.append_replica(&gap.slice(0..0), 0), Ok(r) if r.log_end_offset == 1));
    let second_batch_onward = {
        let (_, range) = BatchIter::new(&gap).next().unwrap().unwrap();
        gap.slice(range.end..)
    };
    assert!(matches!(other.append_replica(&gap, 0), Err(AppendError::InvalidRecord(_))), "[0, 1] overlaps end 1");
    let gap_end = BatchIter::new(&gap).last().unwrap().unwrap().0.last_offset() + 1;
    assert_eq!(other.append_replica(&second_batch_onward, 0).unwrap().log_end_offset, gap_end);

    assert_eq!(follower.latest_epoch(), Some(3));
    assert_eq!(follower.epoch_end_offset(0), None);
    assert_eq!(follower.epoch_end_offset(1), Some((1, 6)));
    assert_eq!(follower.epoch_end_offset(2), Some((1, 6)));
    assert_eq!(follower.epoch_end_offset(3), Some((3, 10)));
    assert_eq!(follower.epoch_end_offset(9), Some((3, 10)));
    drop(follower);
    let reopened = Partition::open(&dir.path().join("follower"), small_segments_config()).unwrap();
    assert_eq!(reopened.epoch_end_offset(1), Some((1, 6)));
    assert_eq!(reopened.offsets().log_end_offset, 10);
}

#[test]
fn truncation_cuts_a_divergent_tail_across_segments() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p");
    let partition = Partition::open(&path, small_segments_config()).unwrap();
    for epoch in [1, 1, 2, 2, 2, 2, 2] {
        partition.append(&batch(2, 7, Some((9, 0, partition.offsets().log_end_offset as i32))), epoch, 0).unwrap();
    }
    assert_eq!(partition.offsets().log_end_offset, 14);
    let segments_before = std::fs::read_dir(&path)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "log"))
        .count();
    assert!(segments_before > 2, "the test needs several segments, got {segments_before}");
    // Cutting inside a batch cuts the whole batch.
    partition.truncate_to(5).unwrap();
    assert_eq!(partition.offsets().log_end_offset, 4);
    assert_eq!(all_offsets(&partition), vec![(0, 1), (2, 3)]);
    assert_eq!(partition.epoch_end_offset(2), Some((1, 4)));
    // The idempotent producer's state follows the cut: sequence 4 is next, not 14.
    partition.append(&batch(2, 7, Some((9, 0, 4))), 4, 0).unwrap();
    assert!(matches!(partition.append(&batch(2, 7, Some((9, 0, 14))), 4, 0), Err(AppendError::OutOfOrderSequence)));
    assert_eq!(partition.epoch_end_offset(3), Some((1, 4)));
    assert_eq!(partition.epoch_end_offset(4), Some((4, 6)));
    partition.close().unwrap();
    drop(partition);
    let reopened = Partition::open(&path, small_segments_config()).unwrap();
    assert_eq!(reopened.offsets().log_end_offset, 6);
    assert_eq!(all_offsets(&reopened), vec![(0, 1), (2, 3), (4, 5)]);
    assert_eq!(reopened.epoch_end_offset(2), Some((1, 4)));
}

#[test]
fn replicated_partition_shows_only_what_replication_committed() {
    let dir = tempfile::tempdir().unwrap();
    let manager = LogManager::new(dir.path()).unwrap();
    let partition = manager.open(&TopicPartition::new("t", 0), LogConfig::default()).unwrap();
    partition.set_replicated(true);
    for _ in 0..3 {
        partition.append(&batch(2, 7, None), 1, 0).unwrap();
    }
    manager.syncer().schedule(&partition);
    let mut progress = partition.progress();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(progress.wait_for(|p| p.local_end >= 6)).unwrap();
    assert_eq!(partition.offsets().high_watermark, 0, "fsync alone does not commit a replicated write");
    assert!(partition.read(0, 1 << 20, true, ReadMode::MayBlock).unwrap().is_empty());
    assert_eq!(partition.advance_high_watermark(4), 4);
    assert_eq!(read_offsets(&partition, 0), vec![(0, 1), (2, 3)]);
    assert_eq!(partition.advance_high_watermark(2), 4, "the high watermark never goes back");
    assert_eq!(partition.advance_high_watermark(99), 6, "nor past the log end");
    partition.set_replicated(false);
    assert_eq!(partition.offsets().high_watermark, 6);
    manager.close();
}

#[test]
fn a_follower_behind_the_leaders_log_start_restarts_there() {
    let dir = tempfile::tempdir().unwrap();
    let leader = Partition::open(&dir.path().join("leader"), small_segments_config()).unwrap();
    for _ in 0..6 {
        leader.append(&batch(2, 7, Some((9, 0, leader.offsets().log_end_offset as i32))), 3, 0).unwrap();
    }
    let path = dir.path().join("follower");
    let follower = Partition::open(&path, small_segments_config()).unwrap();
    follower.append_replica(&leader.read_for_replica(0, 1 << 20, ReadMode::MayBlock).unwrap(), 0).unwrap();
    assert!(follower.offsets().log_end_offset >= 2);
    follower.reset_to(10).unwrap();
    let offsets = follower.offsets();
    assert_eq!((offsets.log_start_offset, offsets.log_end_offset), (10, 10));
    assert_eq!(follower.latest_epoch(), None, "the epochs of the dropped log are forgotten");
    follower.append_replica(&leader.read_for_replica(10, 1 << 20, ReadMode::MayBlock).unwrap(), 0).unwrap();
    assert_eq!(all_offsets(&follower), vec![(10, 11)]);
    assert_eq!(follower.epoch_end_offset(3), Some((3, 12)));
    follower.close().unwrap();
    drop(follower);
    let reopened = Partition::open(&path, small_segments_config()).unwrap();
    let offsets = reopened.offsets();
    assert_eq!((offsets.log_start_offset, offsets.log_end_offset), (10, 12));
    assert_eq!(all_offsets(&reopened), vec![(10, 11)]);
}

// ---- holes found in review: each test failed before its fix

#[test]
fn a_producer_snapshot_beyond_the_recovered_log_end_is_not_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    {
        let partition = Partition::open(&path, page_cache_config()).unwrap();
        partition.append(&batch(2, 1, Some((42, 0, 0))), 0, 0).unwrap();
        partition.append(&batch(2, 1, Some((42, 0, 2))), 0, 0).unwrap();
        // Clean shutdown writes a producer snapshot at offset 4.
        partition.close().unwrap();
    }
    // The last batch's bytes are lost (a power loss took back data the snapshot describes).
    let segment = path.join(format!("{:020}.log", 0));
    let first_batch_len = batch(2, 1, Some((42, 0, 0))).len() as u64;
    std::fs::OpenOptions::new().write(true).open(&segment).unwrap().set_len(first_batch_len).unwrap();
    let partition = Partition::open(&path, page_cache_config()).unwrap();
    assert_eq!(partition.offsets().log_end_offset, 2);
    // The producer's retry of the lost batch is appended, not answered as a duplicate at
    // offset 2, which the log no longer holds.
    let retry = partition.append(&batch(2, 1, Some((42, 0, 2))), 0, 0).unwrap();
    assert!(!retry.duplicate, "retry of a lost batch answered as a duplicate at {}", retry.base_offset);
    assert_eq!(retry.base_offset, 2);
    assert_eq!(partition.offsets().log_end_offset, 4);
}

#[test]
fn retention_never_deletes_what_is_above_the_high_watermark() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig { segment_bytes: 200, retention_bytes: 0, retention_ms: 0, ..page_cache_config() };
    let partition = Partition::open(&dir.path().join("t-0"), config).unwrap();
    // A leader whose followers have not fetched anything yet: nothing is committed.
    partition.set_replicated(true);
    for i in 0..20 {
        partition.append(&batch(3, i, None), 0, i).unwrap();
    }
    assert_eq!(partition.offsets().high_watermark, 0);
    assert_eq!(partition.apply_retention(1_000_000), 0, "retention deleted uncommitted segments");
    assert_eq!(partition.offsets().log_start_offset, 0);
    // Once committed, the same segments expire.
    partition.advance_high_watermark(60);
    assert!(partition.apply_retention(1_000_000) > 0);
    assert!(partition.offsets().log_start_offset > 0);
    assert!(partition.offsets().log_start_offset <= partition.offsets().high_watermark);
}

#[test]
fn timestamps_beyond_the_topic_limits_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let now = 1_800_000_000_000;
    let config = LogConfig { timestamp_before_max_ms: 86_400_000, ..page_cache_config() };
    let partition = Partition::open(&dir.path().join("t-0"), config).unwrap();
    // Kafka 4's default message.timestamp.after.max.ms is one hour.
    let far_future = now + 2 * 3_600_000;
    assert!(matches!(
        partition.append(&batch(1, far_future, None), 0, now),
        Err(AppendError::InvalidTimestamp { timestamp, .. }) if timestamp == far_future
    ));
    let too_old = now - 2 * 86_400_000;
    assert!(matches!(partition.append(&batch(1, too_old, None), 0, now), Err(AppendError::InvalidTimestamp { .. })));
    assert_eq!(partition.offsets().log_end_offset, 0);
    assert_eq!(partition.append(&batch(1, now + 60_000, None), 0, now).unwrap().base_offset, 0);
    assert_eq!(partition.append(&batch(1, now - 3_600_000, None), 0, now).unwrap().base_offset, 1);
}

#[test]
fn a_restarted_replica_restarts_from_its_checkpointed_high_watermark() {
    let dir = tempfile::tempdir().unwrap();
    let tp = TopicPartition::new("t", 0);
    {
        let manager = LogManager::new(dir.path()).unwrap();
        let partition = manager.open(&tp, small_segments_config()).unwrap();
        partition.set_replicated(true);
        for i in 0..10 {
            partition.append(&batch(3, i, None), 0, i).unwrap();
        }
        // Replication committed 6 of the 30 records; the rest is an uncommitted tail.
        partition.advance_high_watermark(6);
        manager.checkpoint_high_watermarks(1).unwrap();
        // crash: no close
    }
    let manager = LogManager::new(dir.path()).unwrap();
    let partition = manager.open(&tp, small_segments_config()).unwrap();
    assert_eq!(partition.offsets().log_end_offset, 30);
    partition.set_replicated(true);
    assert_eq!(partition.offsets().high_watermark, 6, "the recovered tail must not become visible");
    assert!(partition.read(6, 1 << 20, true, ReadMode::MayBlock).unwrap().is_empty());
    // Replication moves it on from there.
    assert_eq!(partition.advance_high_watermark(30), 30);

    // Without a checkpoint a replica restarts from its log start and learns the rest.
    let other = TopicPartition::new("u", 0);
    {
        let manager = LogManager::new(dir.path()).unwrap();
        let partition = manager.open(&other, small_segments_config()).unwrap();
        partition.append(&batch(3, 1, None), 0, 1).unwrap();
    }
    let manager = LogManager::new(dir.path()).unwrap();
    let partition = manager.open(&other, small_segments_config()).unwrap();
    partition.set_replicated(true);
    assert_eq!(partition.offsets().high_watermark, 0);
}

#[test]
fn a_log_append_time_topic_stamps_the_append_time_and_a_valid_crc() {
    let dir = tempfile::tempdir().unwrap();
    let now = 1_800_000_000_000;
    let config = LogConfig { log_append_time: true, timestamp_before_max_ms: 1_000, ..page_cache_config() };
    let partition = Partition::open(&dir.path().join("t-0"), config).unwrap();
    // A producer timestamp far outside the bounds: on a LogAppendTime topic it is not checked.
    let sent = batch(3, 5, None);
    let outcome = partition.append(&sent, 0, now).unwrap();
    assert_eq!(outcome.log_append_time_ms, Some(now));
    let stored = partition.read(0, 1 << 20, true, ReadMode::MayBlock).unwrap();
    let header = validate_batch(&stored).expect("the stored batch's CRC covers the stamped header");
    assert!(header.is_log_append_time());
    assert_eq!(header.max_timestamp, now);
    assert_eq!(header.base_timestamp, 5, "only the max timestamp and the attributes change");
    assert_eq!(stored[61..], sent[61..], "the records are stored as the client sent them");

    // A CreateTime topic stores the client's header bytes unchanged after the offset fields.
    let create_time = Partition::open(&dir.path().join("u-0"), page_cache_config()).unwrap();
    assert_eq!(create_time.append(&sent, 0, now).unwrap().log_append_time_ms, None);
    let stored = create_time.read(0, 1 << 20, true, ReadMode::MayBlock).unwrap();
    assert_eq!(stored[16..], sent[16..]);
}

/// Appends `batches` to `partition` and waits until the syncer made them visible.
fn append_acknowledged(manager: &LogManager, partition: &Arc<Partition>, batches: &[Bytes]) {
    let mut visible_at = 0;
    for batch in batches {
        visible_at = partition.append(batch, 0, 0).unwrap().visible_at;
    }
    manager.syncer().schedule(partition);
    let mut visible = partition.subscribe();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(visible.wait_for(|v| v.high_watermark >= visible_at)).unwrap();
}

/// A crash that loses what the segment files held but never fsynced: the manager's threads
/// are abandoned (no clean close) and the first segment's bytes are zeroed.
fn crash_losing_segment_data(manager: LogManager, root: &std::path::Path, partitions: &[&str]) {
    std::mem::forget(manager);
    for name in partitions {
        let path = root.join(name).join(format!("{:020}.log", 0));
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        let len = file.metadata().unwrap().len();
        std::os::unix::fs::FileExt::write_all_at(&file, &vec![0; len as usize], 0).unwrap();
    }
}

#[test]
fn wal_replays_acknowledged_batches_the_segments_lost() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("logs");
    let manager = LogManager::with_wal(&root).unwrap();
    assert!(manager.syncer().uses_wal());
    let t = manager.open(&TopicPartition::new("t", 0), LogConfig::default()).unwrap();
    let u = manager.open(&TopicPartition::new("u", 3), LogConfig::default()).unwrap();
    append_acknowledged(&manager, &t, &[batch(3, 10, None), batch(1, 11, None)]);
    append_acknowledged(&manager, &u, &[batch(2, 10, None)]);
    append_acknowledged(&manager, &t, &[batch(5, 12, None)]);
    crash_losing_segment_data(manager, &root, &["t-0", "u-3"]);

    let manager = LogManager::with_wal(&root).unwrap();
    let t = manager.open(&TopicPartition::new("t", 0), LogConfig::default()).unwrap();
    let u = manager.open(&TopicPartition::new("u", 3), LogConfig::default()).unwrap();
    assert_eq!(read_offsets(&t, 0), vec![(0, 2), (3, 3), (4, 8)]);
    assert_eq!(read_offsets(&u, 0), vec![(0, 1)]);
    assert_eq!(t.offsets().log_end_offset, 9);
    manager.close();
}

#[test]
fn a_partition_the_wal_replayed_into_opens_again_without_a_scan() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("logs");
    let manager = LogManager::with_wal(&root).unwrap();
    let t = manager.open(&TopicPartition::new("t", 0), LogConfig::default()).unwrap();
    append_acknowledged(&manager, &t, &[batch(3, 10, None), batch(1, 11, None), batch(5, 12, None)]);
    crash_losing_segment_data(manager, &root, &["t-0"]);

    // The replay puts the batches back; the broker opens the partition after it. That open
    // trusts what the replay left (a scan would stop at the byte spoiled here, in the first
    // batch's records, and cut the log there): a restart reads each replayed log once.
    let manager = LogManager::with_wal(&root).unwrap();
    let segment = root.join("t-0").join(format!("{:020}.log", 0));
    let file = std::fs::OpenOptions::new().write(true).open(&segment).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&file, b"?", 70).unwrap();
    let t = manager.open(&TopicPartition::new("t", 0), LogConfig::default()).unwrap();
    assert_eq!(t.offsets().log_end_offset, 9, "the open after the replay scanned the log again");
    manager.close();
}

#[test]
fn without_the_wal_the_same_crash_loses_the_batches() {
    // The proof that the test above can fail: per-file fsyncs are bypassed by zeroing the
    // segment, and nothing else holds the data.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("logs");
    let manager = LogManager::new(&root).unwrap();
    let t = manager.open(&TopicPartition::new("t", 0), LogConfig::default()).unwrap();
    append_acknowledged(&manager, &t, &[batch(3, 10, None)]);
    crash_losing_segment_data(manager, &root, &["t-0"]);
    let manager = LogManager::new(&root).unwrap();
    let t = manager.open(&TopicPartition::new("t", 0), LogConfig::default()).unwrap();
    assert_eq!(read_offsets(&t, 0), vec![]);
    manager.close();
}

#[test]
fn wal_replay_cuts_a_truncated_tail_before_the_batches_that_replaced_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("logs");
    let manager = LogManager::with_wal(&root).unwrap();
    let t = manager.open(&TopicPartition::new("t", 0), LogConfig::default()).unwrap();
    let singles: Vec<Bytes> = (0..5).map(|i| batch(1, 10 + i, None)).collect();
    append_acknowledged(&manager, &t, &singles);
    t.truncate_to(2).unwrap();
    append_acknowledged(&manager, &t, &[batch(2, 20, None), batch(2, 21, None)]);
    assert_eq!(read_offsets(&t, 0), vec![(0, 0), (1, 1), (2, 3), (4, 5)]);
    crash_losing_segment_data(manager, &root, &["t-0"]);

    let manager = LogManager::with_wal(&root).unwrap();
    let t = manager.open(&TopicPartition::new("t", 0), LogConfig::default()).unwrap();
    assert_eq!(read_offsets(&t, 0), vec![(0, 0), (1, 1), (2, 3), (4, 5)]);
    manager.close();
}

#[test]
fn wal_never_replays_a_deleted_partition_into_its_successor() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("logs");
    let manager = LogManager::with_wal(&root).unwrap();
    let tp = TopicPartition::new("t", 0);
    let old = manager.open(&tp, LogConfig::default()).unwrap();
    append_acknowledged(&manager, &old, &[batch(1, 10, None), batch(1, 11, None), batch(1, 12, None)]);
    manager.delete(&tp).unwrap();
    let new = manager.open(&tp, LogConfig::default()).unwrap();
    append_acknowledged(&manager, &new, &[batch(4, 20, None)]);
    crash_losing_segment_data(manager, &root, &["t-0"]);

    let manager = LogManager::with_wal(&root).unwrap();
    let new = manager.open(&tp, LogConfig::default()).unwrap();
    assert_eq!(read_offsets(&new, 0), vec![(0, 3)]);
    manager.close();
}

#[test]
fn wal_files_are_checkpointed_and_recycled_as_they_fill() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("logs");
    let manager = LogManager::with_wal(&root).unwrap();
    let t = manager.open(&TopicPartition::new("t", 0), LogConfig::default()).unwrap();
    // ~150 MB through 64 MiB WAL files: two rotations, each checkpointed.
    let big = batch(120_000, 10, None);
    let batches = 2 * sluice_storage::WAL_FILE_BYTES as usize / big.len() + 10;
    for _ in 0..batches {
        append_acknowledged(&manager, &t, std::slice::from_ref(&big));
    }
    let wal_dir = root.join(sluice_storage::WAL_DIR);
    let wal_files = || {
        std::fs::read_dir(&wal_dir)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "wal"))
            .count()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while wal_files() > 1 {
        assert!(std::time::Instant::now() < deadline, "full WAL files were never checkpointed: {} left", wal_files());
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(wal_dir.join("spare").exists(), "a checkpointed file is kept as the next spare");
    let end = t.offsets().log_end_offset;
    assert_eq!(end, batches as i64 * 120_000);
    std::mem::forget(manager);

    let manager = LogManager::with_wal(&root).unwrap();
    let t = manager.open(&TopicPartition::new("t", 0), LogConfig::default()).unwrap();
    assert_eq!(t.offsets().log_end_offset, end);
    assert_eq!(read_offsets(&t, end - 1), vec![(end - 120_000, end - 1)]);
    manager.close();
}

/// True when the first `bytes` from `offset` can be read from the page cache alone.
fn cached(partition: &Partition, offset: i64, bytes: usize) -> bool {
    match partition.read(offset, bytes, true, ReadMode::CachedOnly) {
        Ok(_) => true,
        Err(sluice_storage::ReadError::WouldBlock) => false,
        Err(error) => panic!("read failed: {error}"),
    }
}

#[test]
fn a_blocking_read_far_behind_the_log_end_drops_the_backlog_from_the_page_cache_and_one_near_it_keeps_it() {
    const RECORDS_PER_BATCH: i32 = 10_000;
    let dir = tempfile::tempdir().unwrap();
    let partition = Partition::open(&dir.path().join("t-0"), page_cache_config()).unwrap();
    // About 6.4 MB: the first batches are further behind the log end than any tailing reader.
    for i in 0..80 {
        partition.append(&batch(RECORDS_PER_BATCH, i, None), 0, i).unwrap();
    }
    let log_end = partition.offsets().log_end_offset;
    assert_eq!(log_end, 80 * i64::from(RECORDS_PER_BATCH));
    // Clean pages, all cached: written moments ago and synced (only clean pages can be dropped).
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    assert!(cached(&partition, 0, 64 * 1024));
    let near_end = log_end - i64::from(RECORDS_PER_BATCH);
    assert!(cached(&partition, near_end, 64 * 1024));

    // A consumer catching up (a blocking read, as the fetch's disk path does) reads the start:
    // those pages leave the cache although they were served from it...
    let backlog = partition.read(0, 64 * 1024, true, ReadMode::MayBlock).unwrap();
    assert_eq!(BatchIter::new(&backlog).next().unwrap().unwrap().0.base_offset, 0);
    assert!(!cached(&partition, 0, 64 * 1024), "a read of the backlog left it in the page cache");
    // ...and read again, from the disk, they are the same batches.
    assert_eq!(partition.read(0, 64 * 1024, true, ReadMode::MayBlock).unwrap(), backlog);
    // A blocking read near the log end keeps the tail that other readers will want.
    let tail = partition.read(near_end, 64 * 1024, true, ReadMode::MayBlock).unwrap();
    assert_eq!(BatchIter::new(&tail).next().unwrap().unwrap().0.base_offset, near_end);
    assert!(cached(&partition, near_end, 64 * 1024));
}

#[test]
fn a_deleted_partition_never_comes_back_under_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("logs");
    let tp = TopicPartition::new("doomed", 0);
    {
        let logs = LogManager::new(&root).unwrap();
        let partition = logs.open(&tp, page_cache_config()).unwrap();
        partition.append(&batch(3, 1_000, None), 0, 0).unwrap();
        logs.delete_all(std::slice::from_ref(&tp)).unwrap();
        assert!(!logs.dir_of(&tp).exists(), "the directory is gone");
        let left: Vec<_> = std::fs::read_dir(&root).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert!(left.iter().all(|name| name != "doomed-0"), "{left:?}");
    }
    // A directory a crash kept from removing, renamed away: removed at the next start, and a
    // new partition of the same name starts empty.
    let leftover = root.join("doomed-0.17-delete");
    std::fs::create_dir_all(&leftover).unwrap();
    std::fs::write(leftover.join("00000000000000000000.log"), b"old").unwrap();
    let logs = LogManager::new(&root).unwrap();
    assert!(!leftover.exists(), "the renamed-away log is removed at start");
    let partition = logs.open(&tp, page_cache_config()).unwrap();
    assert_eq!(partition.offsets().log_end_offset, 0, "a new partition of the same name is empty");
}

#[test]
fn rolls_keep_the_two_newest_producer_snapshots_and_a_reopen_uses_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    let config = LogConfig { segment_bytes: 200, ..page_cache_config() };
    let snapshots = |path: &std::path::Path| {
        let mut offsets: Vec<i64> = std::fs::read_dir(path)
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.strip_suffix(".snapshot")?.parse().ok())
            .collect();
        offsets.sort_unstable();
        offsets
    };
    {
        let partition = Partition::open(&path, config.clone()).unwrap();
        for i in 0..30 {
            partition.append(&batch(3, 1, Some((42, 0, 3 * i))), 0, 0).unwrap();
        }
        let bases: Vec<i64> = std::fs::read_dir(&path)
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.strip_suffix(".log")?.parse().ok())
            .collect();
        assert!(bases.len() > 10, "the test needs many rolls: {bases:?}");
        let kept = snapshots(&path);
        assert_eq!(kept.len(), 2, "snapshots after many rolls: {kept:?}");
        assert_eq!(kept.last(), bases.iter().max(), "the newest snapshot is the active segment's base");
    }
    // The producer state comes back: a retry of the last batch is a duplicate.
    let partition = Partition::open(&path, config).unwrap();
    let retry = partition.append(&batch(3, 1, Some((42, 0, 87))), 0, 0).unwrap();
    assert!(retry.duplicate, "the last batch's retry was appended again at {}", retry.base_offset);
}
