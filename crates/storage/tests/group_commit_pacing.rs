//! The WAL's rounds are paced (`Syncer::set_wal_round_interval`): after a round that logged
//! several batches the next waits for the interval, so concurrent writers share fewer,
//! fuller rounds; a lone writer that logs one batch a round never waits.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_storage::{LogConfig, LogManager, TopicPartition, WAL_ROUND_INTERVAL_MAX};

mod common;
use common::{append_acknowledged, batch};

/// A WAL-mode manager paced at the longest interval, and when each of its rounds started.
fn paced_manager(root: &std::path::Path) -> (LogManager, Arc<Mutex<Vec<Instant>>>) {
    let manager = LogManager::with_wal(root).unwrap();
    manager.syncer().set_wal_round_interval(WAL_ROUND_INTERVAL_MAX);
    let starts = Arc::new(Mutex::new(Vec::new()));
    let observed = starts.clone();
    manager.syncer().observe(Box::new(move |took| observed.lock().unwrap().push(Instant::now() - took)));
    (manager, starts)
}

#[test]
fn a_round_of_several_batches_holds_the_next_round_back_by_the_interval() {
    let dir = tempfile::tempdir().unwrap();
    let (manager, starts) = paced_manager(&dir.path().join("logs"));
    let first = manager.open(&TopicPartition::new("t", 0), LogConfig::default()).unwrap();
    let second = manager.open(&TopicPartition::new("t", 1), LogConfig::default()).unwrap();

    append_acknowledged(&manager, &first, &[batch(b'a', 100), batch(b'b', 100)]);
    append_acknowledged(&manager, &second, &[batch(b'c', 100)]);

    let starts = starts.lock().unwrap();
    assert_eq!(starts.len(), 2, "one round each");
    let gap = starts[1] - starts[0];
    // The second round's start is measured a little after the round began; the first's too.
    assert!(gap >= WAL_ROUND_INTERVAL_MAX - Duration::from_millis(1), "rounds {gap:?} apart");
    assert_eq!(second.offsets().high_watermark, 1);
    assert_eq!(first.offsets().high_watermark, 2);
}

#[test]
fn a_lone_writer_of_one_batch_a_round_is_not_held_back() {
    let dir = tempfile::tempdir().unwrap();
    let (manager, starts) = paced_manager(&dir.path().join("logs"));
    let log = manager.open(&TopicPartition::new("t", 0), LogConfig::default()).unwrap();

    for i in 0..8 {
        append_acknowledged(&manager, &log, &[batch(b'a' + i, 100)]);
    }

    let starts = starts.lock().unwrap();
    assert_eq!(starts.len(), 8, "one round per acknowledged batch");
    // Paced, every gap would be at least the interval; a busy machine may stretch some
    // gaps past it, but not all seven.
    let quickest = starts.windows(2).map(|pair| pair[1] - pair[0]).min().unwrap();
    assert!(quickest < WAL_ROUND_INTERVAL_MAX - Duration::from_millis(1), "quickest gap {quickest:?}");
    assert_eq!(log.offsets().high_watermark, 8);
}
