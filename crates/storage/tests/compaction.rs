//! Log compaction on a real filesystem: the latest record per key survives, tombstones go
//! after `delete.retention.ms`, compressed batches are rebuilt, the result survives a
//! restart (with and without index files), a pass cut short leaves a valid log, and reads
//! cross the gaps compaction leaves.

use std::collections::BTreeMap;

use bytes::{Bytes, BytesMut};
use kafka_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use sluice_storage::{clean_partition, CleanStats, CleanerSettings, IoPacer};
use sluice_storage::{LogConfig, Partition, ReadMode};

const NOW_MS: i64 = 1_700_000_000_000;

fn compacted_config() -> LogConfig {
    LogConfig {
        flush_messages: u64::MAX,
        segment_bytes: 2048,
        cleanup_compact: true,
        cleanup_delete: false,
        min_cleanable_dirty_ratio: 0.0,
        delete_retention_ms: 60_000,
        timestamp_before_max_ms: i64::MAX,
        timestamp_after_max_ms: i64::MAX,
        ..LogConfig::default()
    }
}

/// A client-style batch of (key, value) records; `None` value = tombstone.
fn batch(records: &[(&str, Option<&str>)], timestamp: i64, compression: Compression) -> Bytes {
    let records: Vec<Record> = (0..)
        .zip(records)
        .map(|(i, (key, value))| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: i,
            // The encoder splits batches where offset - sequence changes.
            sequence: i as i32,
            timestamp,
            key: Some(Bytes::copy_from_slice(key.as_bytes())),
            value: value.map(|v| Bytes::copy_from_slice(v.as_bytes())),
            headers: Default::default(),
        })
        .collect();
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(&mut buf, &records, &RecordEncodeOptions { version: 2, compression }).unwrap();
    buf.freeze()
}

/// Everything a consumer reading from offset 0 sees: (offset, key, value).
fn consume(partition: &Partition) -> Vec<(i64, String, Option<String>)> {
    let mut seen = Vec::new();
    let mut offset = 0;
    let end = partition.offsets().high_watermark;
    while offset < end {
        let bytes = partition.read(offset, 1 << 20, true, ReadMode::MayBlock).unwrap();
        assert!(!bytes.is_empty(), "read at {offset} below the high watermark {end} returned nothing");
        let mut buf = bytes.clone();
        while !buf.is_empty() {
            let batch_set = RecordBatchDecoder::decode(&mut buf).unwrap();
            for record in batch_set.records {
                if record.offset >= offset {
                    let key = String::from_utf8(record.key.unwrap().to_vec()).unwrap();
                    let value = record.value.map(|v| String::from_utf8(v.to_vec()).unwrap());
                    seen.push((record.offset, key, value));
                }
            }
        }
        let last = sluice_storage::batch::BatchIter::new(&bytes).last().unwrap().unwrap().0.last_offset();
        offset = last + 1;
    }
    assert!(seen.windows(2).all(|w| w[0].0 < w[1].0), "offsets strictly increase");
    seen
}

fn clean(partition: &Partition, now_ms: i64) -> Option<CleanStats> {
    let settings = CleanerSettings::default();
    let mut pacer = IoPacer::new(settings.io_max_bytes_per_second);
    clean_partition(partition, now_ms, &settings, &mut pacer, &|| false).unwrap()
}

/// Writes rounds of updates to keys k0..k19, a tombstone for k3 and k7 and a last update of
/// k7; returns the expected final key -> value map before tombstone removal.
fn write_history(partition: &Partition) -> BTreeMap<String, Option<String>> {
    let mut expected = BTreeMap::new();
    let codecs = [Compression::None, Compression::Gzip, Compression::Lz4, Compression::Zstd, Compression::Snappy];
    for round in 0..10 {
        let values: Vec<(String, String)> =
            (0..20).map(|k| (format!("k{k}"), format!("v{round}-{k}-{}", "x".repeat(20)))).collect();
        for chunk in values.chunks(4) {
            let records: Vec<(&str, Option<&str>)> =
                chunk.iter().map(|(k, v)| (k.as_str(), Some(v.as_str()))).collect();
            partition.append(&batch(&records, NOW_MS, codecs[round % codecs.len()]), 0, NOW_MS).unwrap();
            for (k, v) in chunk {
                expected.insert(k.clone(), Some(v.clone()));
            }
        }
    }
    partition.append(&batch(&[("k3", None), ("k7", None)], NOW_MS, Compression::None), 0, NOW_MS).unwrap();
    partition.append(&batch(&[("k7", Some("reborn"))], NOW_MS, Compression::Lz4), 0, NOW_MS).unwrap();
    expected.insert("k3".into(), None);
    expected.insert("k7".into(), Some("reborn".into()));
    // Seal everything written so far: the active segment is never cleaned.
    let filler = "f".repeat(2100);
    partition.append(&batch(&[("sentinel", Some(&filler))], NOW_MS, Compression::None), 0, NOW_MS).unwrap();
    partition.append(&batch(&[("sentinel", Some("last"))], NOW_MS, Compression::None), 0, NOW_MS).unwrap();
    expected
}

fn latest_by_key(seen: &[(i64, String, Option<String>)]) -> BTreeMap<String, Option<String>> {
    seen.iter().filter(|(_, k, _)| k != "sentinel").map(|(_, k, v)| (k.clone(), v.clone())).collect()
}

#[test]
fn compaction_keeps_the_latest_record_per_key_and_drops_tombstones_after_delete_retention() {
    let dir = tempfile::tempdir().unwrap();
    let partition = Partition::open(dir.path(), compacted_config()).unwrap();
    let expected = write_history(&partition);
    let before = consume(&partition);
    assert_eq!(before.len(), 10 * 20 + 2 + 1 + 2);
    assert_eq!(latest_by_key(&before), expected);

    let stats = clean(&partition, NOW_MS).expect("a pass is due");
    assert!(stats.segments_rewritten > 0 && stats.bytes_after < stats.bytes_before, "{stats:?}");
    let after = consume(&partition);
    assert_eq!(latest_by_key(&after), expected, "consumers see the same final state");
    let non_sentinel: Vec<_> = after.iter().filter(|(_, k, _)| k != "sentinel").collect();
    assert_eq!(non_sentinel.len(), 20, "one record per key (the k3 tombstone kept for now): {non_sentinel:?}");
    assert!(after.iter().any(|(_, k, v)| k == "k3" && v.is_none()), "a fresh tombstone stays");

    // Nothing dirty and the tombstone not yet due: no pass.
    assert_eq!(clean(&partition, NOW_MS + 1), None);
    // Once delete.retention.ms has passed, the next pass removes the tombstone.
    clean(&partition, NOW_MS + 60_001).expect("the kept tombstone makes a pass due");
    let after = consume(&partition);
    let mut without_tombstone = expected.clone();
    without_tombstone.remove("k3");
    assert_eq!(latest_by_key(&after), without_tombstone);
    assert_eq!(after.iter().filter(|(_, k, _)| k != "sentinel").count(), 19);

    // The compacted log (gaps between batches and at segment ends) survives a restart,
    // trusted from its index files or scanned without them.
    let offsets = partition.offsets();
    partition.close().unwrap();
    drop(partition);
    let reopened = Partition::open(dir.path(), compacted_config()).unwrap();
    assert_eq!(reopened.offsets().log_end_offset, offsets.log_end_offset);
    assert_eq!(consume(&reopened), after);
    drop(reopened);
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "index") {
            std::fs::remove_file(path).unwrap();
        }
    }
    let scanned = Partition::open(dir.path(), compacted_config()).unwrap();
    assert_eq!(scanned.offsets().log_end_offset, offsets.log_end_offset);
    assert_eq!(consume(&scanned), after);
    // Appends continue after the restart.
    scanned.append(&batch(&[("k1", Some("new"))], NOW_MS, Compression::None), 0, NOW_MS).unwrap();
    assert_eq!(scanned.offsets().log_end_offset, offsets.log_end_offset + 1);
}

#[test]
fn a_pass_cut_short_leaves_a_valid_log_and_the_next_one_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let partition = Partition::open(dir.path(), compacted_config()).unwrap();
    let expected = write_history(&partition);
    let settings = CleanerSettings::default();
    let mut pacer = IoPacer::new(settings.io_max_bytes_per_second);
    // Stop after two segments.
    let calls = std::cell::Cell::new(0);
    let stop = || {
        calls.set(calls.get() + 1);
        calls.get() > 2
    };
    clean_partition(&partition, NOW_MS, &settings, &mut pacer, &stop).unwrap();
    assert_eq!(latest_by_key(&consume(&partition)), expected);
    // A crash mid-copy leaves a half-written segment in the cleaning directory: ignored
    // and removed when the log opens.
    drop(partition);
    let leftover = dir.path().join("cleaning");
    std::fs::create_dir_all(&leftover).unwrap();
    std::fs::write(leftover.join(format!("{:020}.log", 0)), b"half a segment").unwrap();
    let reopened = Partition::open(dir.path(), compacted_config()).unwrap();
    assert!(!leftover.exists());
    assert_eq!(latest_by_key(&consume(&reopened)), expected);
    clean(&reopened, NOW_MS).expect("the rest is still dirty");
    assert_eq!(latest_by_key(&consume(&reopened)), expected);
    assert_eq!(consume(&reopened).iter().filter(|(_, k, _)| k != "sentinel").count(), 20);
}

#[test]
fn uncompacted_and_keyless_input_is_refused_or_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let partition = Partition::open(dir.path(), compacted_config()).unwrap();
    // A record without a key: refused, naming it.
    let mut buf = BytesMut::new();
    let record = |key: Option<&str>, offset| Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: 0,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset,
        sequence: offset as i32,
        timestamp: NOW_MS,
        key: key.map(|k| Bytes::copy_from_slice(k.as_bytes())),
        value: Some(Bytes::from_static(b"v")),
        headers: Default::default(),
    };
    let records = [record(Some("a"), 0), record(None, 1)];
    RecordBatchEncoder::encode(&mut buf, &records, &RecordEncodeOptions { version: 2, compression: Compression::Gzip })
        .unwrap();
    match partition.append(&buf.freeze(), 0, NOW_MS) {
        Err(sluice_storage::AppendError::KeylessRecords(indexes)) => assert_eq!(indexes, vec![1]),
        other => panic!("expected KeylessRecords, got {other:?}"),
    }
    // A delete-only topic is never cleaned.
    let plain = tempfile::tempdir().unwrap();
    let config = LogConfig { cleanup_compact: false, cleanup_delete: true, ..compacted_config() };
    let partition = Partition::open(plain.path(), config).unwrap();
    write_history(&partition);
    assert_eq!(clean(&partition, NOW_MS), None);
    assert_eq!(consume(&partition).len(), 10 * 20 + 2 + 1 + 2);
}

/// A transactional batch of `producer_id` with one record per key, starting at `sequence`.
fn transactional(producer_id: i64, sequence: i32, keys: &[&str]) -> Bytes {
    let records: Vec<Record> = (0..)
        .zip(keys)
        .map(|(i, key)| Record {
            transactional: true,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id,
            producer_epoch: 0,
            timestamp_type: TimestampType::Creation,
            offset: i64::from(i),
            sequence: sequence + i,
            timestamp: NOW_MS,
            key: Some(Bytes::copy_from_slice(key.as_bytes())),
            value: Some(Bytes::from_static(b"v")),
            headers: Default::default(),
        })
        .collect();
    let mut buf = BytesMut::new();
    let options = RecordEncodeOptions { version: 2, compression: Compression::None };
    RecordBatchEncoder::encode(&mut buf, &records, &options).unwrap();
    buf.freeze()
}

/// (base offset, producer id) of every control batch (transaction marker) in the log.
fn markers(partition: &Partition) -> Vec<(i64, i64)> {
    let bytes = partition.read(0, 1 << 20, true, ReadMode::MayBlock).unwrap();
    let mut found = Vec::new();
    let mut offset = 0;
    let mut bytes = bytes;
    while !bytes.is_empty() {
        let mut last = offset;
        for item in sluice_storage::batch::BatchIter::new(&bytes) {
            let header = item.unwrap().0;
            if header.is_control() {
                found.push((header.base_offset, header.producer_id));
            }
            last = header.last_offset();
        }
        offset = last + 1;
        if offset >= partition.offsets().high_watermark {
            break;
        }
        bytes = partition.read(offset, 1 << 20, true, ReadMode::MayBlock).unwrap();
    }
    found
}

#[test]
fn transaction_markers_go_once_their_records_are_gone_and_delete_retention_passed() {
    let dir = tempfile::tempdir().unwrap();
    let partition = Partition::open(dir.path(), compacted_config()).unwrap();
    // 0-2: producer 7 commits k0..k2 (marker at 3); 4-5: producer 9 aborts k0, k1 (marker
    // at 6); 7-9: plain k0..k2 supersede them; 10: producer 7 commits "keep7" (marker at 11),
    // which nothing supersedes.
    partition.append(&transactional(7, 0, &["k0", "k1", "k2"]), 0, NOW_MS).unwrap();
    partition.append_marker(7, 0, true, 0, 0, NOW_MS).unwrap();
    partition.append(&transactional(9, 0, &["k0", "k1"]), 0, NOW_MS).unwrap();
    partition.append_marker(9, 0, false, 0, 0, NOW_MS).unwrap();
    partition
        .append(
            &batch(&[("k0", Some("a")), ("k1", Some("b")), ("k2", Some("c"))], NOW_MS, Compression::None),
            0,
            NOW_MS,
        )
        .unwrap();
    partition.append(&transactional(7, 3, &["keep7"]), 0, NOW_MS).unwrap();
    partition.append_marker(7, 0, true, 0, 0, NOW_MS).unwrap();
    let filler = "f".repeat(2100);
    partition.append(&batch(&[("sentinel", Some(&filler))], NOW_MS, Compression::None), 0, NOW_MS).unwrap();
    partition.append(&batch(&[("sentinel", Some("last"))], NOW_MS, Compression::None), 0, NOW_MS).unwrap();
    assert_eq!(markers(&partition), vec![(3, 7), (6, 9), (11, 7)]);

    // The first pass drops the superseded and aborted records but keeps every marker: none
    // has been through a pass yet.
    clean(&partition, NOW_MS).expect("a pass is due");
    assert_eq!(markers(&partition), vec![(3, 7), (6, 9), (11, 7)]);
    // Past delete.retention.ms the markers of emptied transactions go; the one whose record
    // is still there stays.
    clean(&partition, NOW_MS + 60_001).expect("the kept markers make a pass due");
    assert_eq!(markers(&partition), vec![(11, 7)]);
    let keys: Vec<String> = consume(&partition).into_iter().map(|(_, k, _)| k).collect();
    assert_eq!(&keys[..4], &["k0", "k1", "k2", "keep7"], "{keys:?}");

    // Replayed from the log, no transaction is left open: the last stable offset is the end.
    let end = partition.offsets().log_end_offset;
    partition.close().unwrap();
    drop(partition);
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "snapshot") {
            std::fs::remove_file(path).unwrap();
        }
    }
    let reopened = Partition::open(dir.path(), compacted_config()).unwrap();
    assert_eq!(reopened.offsets().last_stable_offset, end);
    assert!(!reopened.has_open_transaction(7) && !reopened.has_open_transaction(9));
}

/// The `.log` files of the partition: base offset -> size.
fn segment_files(dir: &std::path::Path) -> BTreeMap<i64, u64> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "log"))
        .map(|path| {
            let base = path.file_stem().unwrap().to_str().unwrap().parse().unwrap();
            (base, std::fs::metadata(&path).unwrap().len())
        })
        .collect()
}

/// Rounds of updates to five keys, one batch per round, over many segments, then a
/// sentinel that seals them all; returns the key -> latest value map.
fn write_rounds(partition: &Partition, rounds: usize) -> BTreeMap<String, Option<String>> {
    let mut expected = BTreeMap::new();
    for round in 0..rounds {
        let values: Vec<(String, String)> =
            (0..5).map(|k| (format!("k{k}"), format!("v{round}-{k}-{}", "x".repeat(100)))).collect();
        let records: Vec<(&str, Option<&str>)> = values.iter().map(|(k, v)| (k.as_str(), Some(v.as_str()))).collect();
        partition.append(&batch(&records, NOW_MS, Compression::None), 0, NOW_MS).unwrap();
        expected.extend(values.into_iter().map(|(k, v)| (k, Some(v))));
    }
    let filler = "f".repeat(2100);
    partition.append(&batch(&[("sentinel", Some(&filler))], NOW_MS, Compression::None), 0, NOW_MS).unwrap();
    partition.append(&batch(&[("sentinel", Some("last"))], NOW_MS, Compression::None), 0, NOW_MS).unwrap();
    expected
}

#[test]
fn segments_a_pass_empties_leave_the_log_except_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let partition = Partition::open(dir.path(), compacted_config()).unwrap();
    let expected = write_rounds(&partition, 40);
    let before = segment_files(dir.path());
    assert!(before.len() > 10, "{before:?}");
    let offsets = partition.offsets();

    let stats = clean(&partition, NOW_MS).expect("a pass is due");
    let after = segment_files(dir.path());
    let first = *before.keys().next().unwrap();
    let active = *before.keys().next_back().unwrap();
    // Left: the first segment (emptied, it holds the log start), the segment with the last
    // round, the sentinel's and the active one; every other segment held only superseded
    // records and is gone, index included.
    assert!(after.contains_key(&first) && after.contains_key(&active), "{after:?}");
    let emptied: Vec<_> = after.iter().filter(|&(&base, &size)| size == 0 && base != first && base != active).collect();
    assert!(emptied.is_empty(), "emptied segments kept: {emptied:?} of {after:?}");
    assert!(after.len() <= 4, "{after:?}");
    assert_eq!(stats.segments_removed, before.len() - after.len(), "{stats:?}");
    for base in before.keys().filter(|base| !after.contains_key(base)) {
        assert!(!dir.path().join(format!("{base:020}.index")).exists(), "index of removed segment {base}");
    }
    assert_eq!(partition.offsets(), offsets, "the log start and end stay");
    let seen = consume(&partition);
    assert_eq!(latest_by_key(&seen), expected);
    assert_eq!(seen.len(), 5 + 2);
    // A read at an offset of a removed segment goes on at the next segment.
    let removed = *before.keys().find(|base| !after.contains_key(base)).unwrap();
    let read = partition.read(removed, 1 << 20, true, ReadMode::MayBlock).unwrap();
    let first_read = sluice_storage::batch::BatchIter::new(&read).next().unwrap().unwrap().0;
    assert!(first_read.base_offset > removed, "{} after {removed}", first_read.base_offset);

    // A restart recovers the same log over the gaps, from the index files or scanning.
    partition.close().unwrap();
    drop(partition);
    let reopened = Partition::open(dir.path(), compacted_config()).unwrap();
    assert_eq!(reopened.offsets(), offsets);
    assert_eq!(consume(&reopened), seen);
    drop(reopened);
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "index" || e == "snapshot") {
            std::fs::remove_file(path).unwrap();
        }
    }
    let scanned = Partition::open(dir.path(), compacted_config()).unwrap();
    assert_eq!(scanned.offsets(), offsets);
    assert_eq!(consume(&scanned), seen);
    // A second pass finds nothing more to remove, and appends go on.
    scanned.append(&batch(&[("k1", Some("new"))], NOW_MS, Compression::None), 0, NOW_MS).unwrap();
    assert_eq!(scanned.offsets().log_end_offset, offsets.log_end_offset + 1);
}

#[test]
fn a_crash_after_segments_are_removed_and_before_the_checkpoint_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let partition = Partition::open(dir.path(), compacted_config()).unwrap();
    let expected = write_rounds(&partition, 40);
    let before = segment_files(dir.path());
    let offsets = partition.offsets();
    let originals = tempfile::tempdir().unwrap();
    for base in before.keys() {
        let name = format!("{base:020}.log");
        std::fs::copy(dir.path().join(&name), originals.path().join(&name)).unwrap();
    }
    // A pass that stops part way: segments removed, no directory fsync, no checkpoint.
    let settings = CleanerSettings::default();
    let mut pacer = IoPacer::new(settings.io_max_bytes_per_second);
    let calls = std::cell::Cell::new(0);
    let stop = || {
        calls.set(calls.get() + 1);
        calls.get() > 6
    };
    let stats = clean_partition(&partition, NOW_MS, &settings, &mut pacer, &stop).unwrap().unwrap();
    assert!(stats.segments_removed >= 4, "{stats:?}");
    assert!(!dir.path().join("cleaner-offset").exists(), "the pass was cut before its checkpoint");
    let after = segment_files(dir.path());
    let removed: Vec<i64> = before.keys().copied().filter(|base| !after.contains_key(base)).collect();
    assert!(removed.len() >= 4, "segments removed by the pass cut short: {removed:?} of {after:?}");
    assert_eq!(removed.len(), stats.segments_removed);
    // Dropped without a close, as by a crash: every record the cleaner keeps is found again.
    drop(partition);
    let reopened = Partition::open(dir.path(), compacted_config()).unwrap();
    assert_eq!(reopened.offsets(), offsets);
    let seen = consume(&reopened);
    assert_eq!(latest_by_key(&seen), expected);
    drop(reopened);
    // A crash that took back some unlinks (the directory was not fsynced yet): the
    // originals come back between the gaps, with older values, and the latest still wins.
    for base in removed.iter().step_by(2) {
        let name = format!("{base:020}.log");
        std::fs::copy(originals.path().join(&name), dir.path().join(&name)).unwrap();
    }
    let reopened = Partition::open(dir.path(), compacted_config()).unwrap();
    assert_eq!(reopened.offsets(), offsets);
    assert_eq!(latest_by_key(&consume(&reopened)), expected);
    // The next pass finishes the work.
    clean(&reopened, NOW_MS).expect("the rest is still dirty");
    assert_eq!(latest_by_key(&consume(&reopened)), expected);
    assert!(segment_files(dir.path()).len() <= 4, "{:?}", segment_files(dir.path()));
}

/// An idempotent producer's batch of one record per key, starting at `sequence`.
fn idempotent(producer_id: i64, sequence: i32, keys: &[&str]) -> Bytes {
    let value = "y".repeat(100);
    let records: Vec<Record> = (0..)
        .zip(keys)
        .map(|(i, key)| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id,
            producer_epoch: 0,
            timestamp_type: TimestampType::Creation,
            offset: i64::from(i),
            sequence: sequence + i,
            timestamp: NOW_MS,
            key: Some(Bytes::copy_from_slice(key.as_bytes())),
            value: Some(Bytes::copy_from_slice(value.as_bytes())),
            headers: Default::default(),
        })
        .collect();
    let mut buf = BytesMut::new();
    let options = RecordEncodeOptions { version: 2, compression: Compression::None };
    RecordBatchEncoder::encode(&mut buf, &records, &options).unwrap();
    buf.freeze()
}

#[test]
fn a_segment_left_with_a_producers_last_batch_header_stays() {
    let dir = tempfile::tempdir().unwrap();
    let partition = Partition::open(dir.path(), compacted_config()).unwrap();
    // Producer 5's batches fill the first segments; its last one (sequence 40) is followed
    // by plain updates of every key, so a pass keeps only its header.
    let keys = ["k0", "k1", "k2", "k3", "k4"];
    for round in 0..10 {
        partition.append(&idempotent(5, round * 5, &keys), 0, NOW_MS).unwrap();
    }
    let last_base = partition.offsets().log_end_offset - 5;
    let expected = write_rounds(&partition, 20);
    let holding_last = *segment_files(dir.path()).range(..=last_base).next_back().unwrap().0;
    assert!(holding_last > 0, "the producer's last batch is not in the first segment");

    let stats = clean(&partition, NOW_MS).expect("a pass is due");
    assert!(stats.segments_removed > 0, "{stats:?}");
    let after = segment_files(dir.path());
    assert!(after.get(&holding_last).is_some_and(|&size| size > 0), "{after:?}");
    assert_eq!(latest_by_key(&consume(&partition)), expected);

    // Replayed from the log alone, the producer's sequence survives: a retry of its last
    // batch is a duplicate, and its next batch is in order.
    let end = partition.offsets().log_end_offset;
    drop(partition);
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "snapshot") {
            std::fs::remove_file(path).unwrap();
        }
    }
    let reopened = Partition::open(dir.path(), compacted_config()).unwrap();
    assert_eq!(reopened.offsets().log_end_offset, end);
    let retry = reopened.append(&idempotent(5, 45, &keys), 0, NOW_MS).unwrap();
    assert!(retry.duplicate && retry.base_offset == last_base, "{retry:?}");
    let next = reopened.append(&idempotent(5, 50, &keys), 0, NOW_MS).unwrap();
    assert!(!next.duplicate && next.base_offset == end, "{next:?}");
}
