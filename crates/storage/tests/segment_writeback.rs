//! Through the page cache (the default mode of the segments' tails), the segment file's
//! new bytes are written and sent to the disk steadily, not in the WAL checkpoint's burst.

use bytes::Bytes;
use sluice_storage::{LogConfig, LogManager, TopicPartition};

mod common;
use common::{append_acknowledged, batch};

#[test]
fn segment_bytes_reach_the_disk_steadily_not_at_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("logs");
    let manager = LogManager::with_wal(&root).unwrap();
    let log = manager.open(&TopicPartition::new("t", 0), LogConfig::default()).unwrap();
    // 1 MiB acknowledged: through the WAL (far from a full WAL file, so no checkpoint),
    // into the tail, whose frozen chunks the writeback writes to the segment file.
    let batches: Vec<Bytes> = (0..1000).map(|i| batch(b'a' + (i % 26) as u8, 1000)).collect();
    append_acknowledged(&manager, &log, &batches);
    let path = root.join("t-0").join(format!("{:020}.log", 0));
    let file = std::fs::File::open(&path).unwrap();
    // The first half: in frozen chunks by now (the last chunk is at most 1 MiB).
    let first_half = (batches.len() * 1000 / 2) as u64;
    let stat = || sluice_storage::cachestat(&file, 0, first_half);
    if stat().is_none() {
        return; // no cachestat (Linux < 6.5): nothing to observe
    }
    // The writeback runs on the WAL thread's schedule: rounds after its interval hand it
    // the partitions logged since. It writes the frozen chunks through the page cache and
    // starts their disk writes, so none stays dirty until a checkpoint or the kernel's
    // flusher (30 s).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut round = 0u8;
    loop {
        let now = stat().unwrap();
        if now.nr_cache * 4096 >= first_half && now.nr_dirty + now.nr_writeback == 0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{now:?}: the segment's pages are not written back");
        std::thread::sleep(std::time::Duration::from_millis(50));
        append_acknowledged(&manager, &log, &[batch(round, 100)]);
        round = round.wrapping_add(1);
    }
    manager.close();
}
