//! The budget of open files: a log of many sealed segments holds descriptors for at most
//! `sealed_files_open_max` of them (plus its active segment), reads every byte back through
//! files closed and reopened, never reads a file that replaced a segment's own, and idle
//! partitions give their active segment's descriptor back until they are written again.
//!
//! Its own test binary: the budget and the count of open files are process-wide.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use sluice_storage::batch::BatchIter;
use sluice_storage::{
    sealed_files_open, set_sealed_files_open_max, LogConfig, LogManager, Partition, ReadError, ReadMode,
    TopicPartition, ACTIVE_SEGMENT_IDLE_MS,
};

mod common;
use common::{append_acknowledged, batch};

const BUDGET: usize = 4;
const BATCHES: usize = 300;
/// About 8 batches per segment: ~38 sealed segments.
const SEGMENT_BYTES: u64 = 8 * 1024;
// Besides the sealed files within the budget: the active segment's file, and the same
// file opened for direct I/O by its tail (`segment_tail.rs`), hence `BUDGET + 2`.

/// Descriptors this process holds on files under `dir`.
fn descriptors_under(dir: &Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter(|target| target.starts_with(dir))
        .count()
}

/// Reads the whole log from offset 0 (a consumer catching up) and checks every batch.
fn read_all(log: &Partition, batches: &[Bytes], dir: &Path) {
    let mut offset = 0;
    while (offset as usize) < batches.len() {
        let read = log.read(offset, 4096, true, ReadMode::MayBlock).unwrap();
        for item in BatchIter::new(&read) {
            let (header, range) = item.unwrap();
            assert_eq!(header.base_offset, offset);
            assert_eq!(&read[range][16..], &batches[offset as usize][16..], "batch {offset}");
            offset += 1;
        }
        assert!(descriptors_under(dir) <= BUDGET + 2, "open files within the budget while reading");
    }
}

fn open_log(manager: &LogManager) -> Arc<Partition> {
    let config = LogConfig { segment_bytes: SEGMENT_BYTES, ..LogConfig::default() };
    manager.open(&TopicPartition::new("t", 0), config).unwrap()
}

#[test]
fn open_files_stay_within_the_budget_across_many_segments_a_restart_and_idle_partitions() {
    set_sealed_files_open_max(BUDGET);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("logs");
    let partition_dir = root.join("t-0");
    let batches: Vec<Bytes> = (0..BATCHES).map(|i| batch((i % 251) as u8, 1000)).collect();
    {
        let manager = LogManager::new(&root).unwrap();
        let log = open_log(&manager);
        append_acknowledged(&manager, &log, &batches);
        let segments = std::fs::read_dir(&partition_dir)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "log"))
            .count();
        assert!(segments > 10 * BUDGET, "{segments} segments");
        assert!(sealed_files_open() <= BUDGET);
        assert!(descriptors_under(&partition_dir) <= BUDGET + 2, "{} open", descriptors_under(&partition_dir));
        read_all(&log, &batches, &partition_dir);

        // A read that may not wait for the disk finds the first segment's file closed (the
        // catch-up above moved on past the budget) and leaves it to a blocking read.
        assert!(matches!(log.read(0, 4096, true, ReadMode::CachedOnly), Err(ReadError::WouldBlock)));

        // DeleteRecords removes the oldest segments: a read there is out of range, not an
        // error of a missing file.
        log.delete_records_before(100).unwrap();
        assert!(matches!(log.read(5, 4096, true, ReadMode::MayBlock), Err(ReadError::OffsetOutOfRange { .. })));
        let kept = log.read(100, 1 << 20, true, ReadMode::MayBlock).unwrap();
        assert_eq!(BatchIter::new(&kept).next().unwrap().unwrap().0.base_offset, 100);

        // A closed segment's file replaced by another under its name is never read as the
        // segment: the read fails instead of returning someone else's bytes.
        // (Closed: no descriptor of this process names it. A read that may not wait also
        // refuses an open file whose bytes are not in the page cache, as direct-I/O writes
        // leave them.)
        let open_paths: Vec<_> = std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
            .collect();
        let mut segment_paths: Vec<_> = std::fs::read_dir(&partition_dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "log"))
            .collect();
        segment_paths.sort();
        let base = |p: &std::path::PathBuf| p.file_stem().unwrap().to_str().unwrap().parse::<i64>().unwrap();
        let path = segment_paths
            .into_iter()
            .filter(|p| base(p) >= 100 && !open_paths.contains(p))
            .find(|p| matches!(log.read(base(p), 1, true, ReadMode::CachedOnly), Err(ReadError::WouldBlock)))
            .expect("a segment past the log start whose file is closed");
        let closed = base(&path);
        let original = std::fs::read(&path).unwrap();
        let mut impostor = original.clone();
        impostor.iter_mut().skip(61).for_each(|b| *b = b.wrapping_add(1));
        let staged = path.with_extension("staged");
        std::fs::write(&staged, &impostor).unwrap();
        std::fs::rename(&staged, &path).unwrap();
        match log.read(closed, 1, true, ReadMode::MayBlock) {
            Err(ReadError::Storage(error)) => assert_eq!(error.kind(), std::io::ErrorKind::NotFound),
            other => panic!("a replaced segment file was read: {:?}", other.map(|b| b.len())),
        }
        // Put back (same bytes, new file): still not the segment's own file.
        std::fs::write(&staged, &original).unwrap();
        std::fs::rename(&staged, &path).unwrap();
        assert!(log.read(closed, 1, true, ReadMode::MayBlock).is_err());
        manager.close();
    }
    assert_eq!(sealed_files_open(), 0, "every sealed file closed with its log");

    // Reopened, the log loads all its segments within the budget and reads them all.
    let manager = LogManager::new(&root).unwrap();
    let log = open_log(&manager);
    assert!(
        descriptors_under(&partition_dir) <= BUDGET + 2,
        "{} open after loading",
        descriptors_under(&partition_dir)
    );
    let from = 100;
    let read = log.read(from, 1 << 20, true, ReadMode::MayBlock).unwrap();
    let first = BatchIter::new(&read).next().unwrap().unwrap().0.base_offset;
    assert_eq!(first, from);
    let mut offset = from;
    while (offset as usize) < BATCHES {
        let read = log.read(offset, 4096, true, ReadMode::MayBlock).unwrap();
        for item in BatchIter::new(&read) {
            let (header, range) = item.unwrap();
            assert_eq!(header.base_offset, offset);
            assert_eq!(&read[range][16..], &batches[offset as usize][16..], "batch {offset} after the restart");
            offset += 1;
        }
        assert!(descriptors_under(&partition_dir) <= BUDGET + 2);
    }

    // Idle partitions: each holds its active segment open (and, while it has a tail, the
    // same file for direct I/O) until a minute without appends puts it under the budget
    // too; a write reopens it. The tail and its descriptor go after 10 s.
    let idle: Vec<_> =
        (0..20).map(|p| manager.open(&TopicPartition::new("idle", p), LogConfig::default()).unwrap()).collect();
    for (p, log) in idle.iter().enumerate() {
        append_acknowledged(&manager, log, &batches[p..p + 1]);
    }
    let idle_dirs = |root: &Path| (0..20).map(|p| descriptors_under(&root.join(format!("idle-{p}")))).sum::<usize>();
    assert!((20..=40).contains(&idle_dirs(&root)), "active segments are open: {}", idle_dirs(&root));
    manager.tick(sluice_storage::now_ms() + ACTIVE_SEGMENT_IDLE_MS - 1_000);
    assert_eq!(idle_dirs(&root), 20, "not idle long enough yet, but the tails are gone");
    manager.tick(sluice_storage::now_ms() + ACTIVE_SEGMENT_IDLE_MS);
    assert!(idle_dirs(&root) <= BUDGET, "{} idle partitions' files open", idle_dirs(&root));
    for (p, log) in idle.iter().enumerate() {
        append_acknowledged(&manager, log, &batches[p + 1..p + 2]);
        let read = log.read(0, 1 << 20, true, ReadMode::MayBlock).unwrap();
        let found: Vec<_> = BatchIter::new(&read).map(|item| item.unwrap()).collect();
        assert_eq!(found.len(), 2, "partition idle-{p}");
        for (i, (header, range)) in found.into_iter().enumerate() {
            assert_eq!(header.base_offset, i as i64);
            assert_eq!(&read[range][16..], &batches[p + i][16..]);
        }
    }
    assert!((20..=40).contains(&idle_dirs(&root)), "written again, they are pinned open: {}", idle_dirs(&root));
    manager.close();
    drop((idle, manager));

    // After a restart, a partition last written (by its file's modification time) more
    // than a minute ago is idle at once: the first tick puts its file under the budget.
    let long_ago = std::time::SystemTime::now() - std::time::Duration::from_millis(2 * ACTIVE_SEGMENT_IDLE_MS as u64);
    for p in 0..10 {
        for entry in std::fs::read_dir(root.join(format!("idle-{p}"))).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "log") {
                std::fs::File::options().write(true).open(&path).unwrap().set_modified(long_ago).unwrap();
            }
        }
    }
    let manager = LogManager::new(&root).unwrap();
    let idle: Vec<_> =
        (0..20).map(|p| manager.open(&TopicPartition::new("idle", p), LogConfig::default()).unwrap()).collect();
    let open_under = |partitions: std::ops::Range<i32>| {
        partitions.map(|p| descriptors_under(&root.join(format!("idle-{p}")))).sum::<usize>()
    };
    assert_eq!(open_under(0..20), 20, "loaded active segments are open");
    manager.tick(sluice_storage::now_ms());
    assert!(open_under(0..10) <= BUDGET, "{} long-idle partitions' files open after a restart", open_under(0..10));
    assert_eq!(open_under(10..20), 10, "recently written partitions stay pinned");
    for (p, log) in idle.iter().enumerate() {
        let read = log.read(0, 1 << 20, true, ReadMode::MayBlock).unwrap();
        assert_eq!(BatchIter::new(&read).count(), 2, "partition idle-{p} after the restart");
    }
}
