//! Transactions in a partition log: open transactions hold the last stable offset back,
//! markers end them, aborted transactions are listed for `read_committed` readers, and all
//! of it survives a restart.

use bytes::{Bytes, BytesMut};
use kafka_protocol::records::{Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};
use sluice_storage::{AbortedTransaction, LogConfig, Partition, ReadLimit, ReadMode};

const NOW_MS: i64 = 1_700_000_000_000;

fn config() -> LogConfig {
    LogConfig { flush_messages: u64::MAX, timestamp_before_max_ms: i64::MAX, ..LogConfig::default() }
}

/// A transactional batch of `count` records from `producer_id` starting at `sequence`.
fn transactional(producer_id: i64, epoch: i16, sequence: i32, count: i32) -> Bytes {
    let records: Vec<Record> = (0..count)
        .map(|i| Record {
            transactional: true,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id,
            producer_epoch: epoch,
            timestamp_type: TimestampType::Creation,
            offset: i64::from(i),
            sequence: sequence + i,
            timestamp: NOW_MS,
            key: Some(Bytes::from(format!("k{i}"))),
            value: Some(Bytes::from_static(b"v")),
            headers: Default::default(),
        })
        .collect();
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(&mut buf, &records, &RecordEncodeOptions { version: 2, compression: Compression::None })
        .unwrap();
    buf.freeze()
}

#[test]
fn open_transactions_hold_the_last_stable_offset_and_aborts_are_listed() {
    let dir = tempfile::tempdir().unwrap();
    let log = Partition::open(dir.path(), config()).unwrap();
    // Producer 7 opens a transaction at offset 0; producer 9 at offset 3.
    log.append(&transactional(7, 0, 0, 3), 0, NOW_MS).unwrap();
    log.append(&transactional(9, 0, 0, 2), 0, NOW_MS).unwrap();
    assert_eq!(log.offsets().high_watermark, 5);
    assert_eq!(log.offsets().last_stable_offset, 0);
    assert!(log.read_until(0, 1 << 20, true, ReadLimit::LastStable, ReadMode::MayBlock).unwrap().is_empty());
    assert!(log.has_open_transaction(7));
    assert_eq!(log.open_transactions(), vec![(7, 0, 0), (9, 0, 3)]);

    // 7 aborts (marker at 5): the stable offset moves to 9's first offset.
    let abort = log.append_marker(7, 0, false, 0, 0, NOW_MS).unwrap();
    assert_eq!(abort.base_offset, 5);
    assert_eq!(log.offsets().last_stable_offset, 3);
    // 9 commits (marker at 6): everything is stable.
    log.append_marker(9, 0, true, 0, 0, NOW_MS).unwrap();
    assert_eq!(log.offsets().last_stable_offset, 7);
    let aborted = AbortedTransaction { producer_id: 7, first_offset: 0, last_offset: 5 };
    assert_eq!(log.aborted_transactions(0, 7), vec![aborted]);
    assert_eq!(log.aborted_transactions(6, 7), vec![], "a fetch past the marker needs no entry");
    let committed = log.read_until(0, 1 << 20, true, ReadLimit::LastStable, ReadMode::MayBlock).unwrap();
    let headers: Vec<_> = sluice_storage::batch::BatchIter::new(&committed).map(|b| b.unwrap().0).collect();
    assert_eq!(headers.len(), 4, "two data batches and two markers");
    assert!(headers[2].is_control() && headers[3].is_control());
    sluice_storage::batch::validate_stored_batch(&committed.slice(committed.len() - headers[3].total_bytes()..))
        .expect("a marker's CRC is valid");

    // A stale epoch cannot end a transaction; a newer one fences (ends it and starts that epoch).
    log.append(&transactional(7, 1, 0, 1), 0, NOW_MS).unwrap();
    assert!(log.append_marker(7, 0, false, 0, 0, NOW_MS).is_err());
    log.append_marker(7, 2, false, 0, 0, NOW_MS).unwrap();
    assert!(log.append(&transactional(7, 1, 1, 1), 0, NOW_MS).is_err(), "the fenced epoch is refused");

    // A restart keeps the aborted list and the open transactions (from producer state).
    log.append(&transactional(11, 0, 0, 1), 0, NOW_MS).unwrap();
    let offsets = log.offsets();
    log.close().unwrap();
    drop(log);
    let reopened = Partition::open(dir.path(), config()).unwrap();
    assert_eq!(reopened.offsets().last_stable_offset, offsets.last_stable_offset);
    assert!(reopened.has_open_transaction(11));
    assert_eq!(reopened.aborted_transactions(0, offsets.log_end_offset).len(), 2);
}

/// A follower copying the leader's log indexes the abort markers it copies, so once it
/// leads it names the aborted transactions to read_committed fetches as the leader did;
/// truncating the follower below a marker forgets that marker's entry.
#[test]
fn a_follower_indexes_the_aborts_it_copies() {
    let (leader_dir, follower_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let leader = Partition::open(leader_dir.path(), config()).unwrap();
    let follower = Partition::open(follower_dir.path(), config()).unwrap();
    follower.set_replicated(true);
    leader.append(&transactional(7, 0, 0, 3), 0, NOW_MS).unwrap();
    leader.append_marker(7, 0, false, 0, 0, NOW_MS).unwrap();
    leader.append(&transactional(7, 0, 3, 2), 0, NOW_MS).unwrap();
    leader.append_marker(7, 0, true, 0, 0, NOW_MS).unwrap();
    let copied = leader.read_for_replica(0, 1 << 20, ReadMode::MayBlock).unwrap();
    follower.append_replica(&copied, NOW_MS).unwrap();
    let aborted = vec![AbortedTransaction { producer_id: 7, first_offset: 0, last_offset: 3 }];
    assert_eq!(leader.aborted_transactions(0, 7), aborted);
    assert_eq!(follower.aborted_transactions(0, 7), aborted, "the follower lists the copied abort");
    // Durable: a restarted follower still lists it.
    follower.close().unwrap();
    drop(follower);
    let follower = Partition::open(follower_dir.path(), config()).unwrap();
    assert_eq!(follower.aborted_transactions(0, 7), aborted);
    follower.truncate_to(3).unwrap();
    assert_eq!(follower.aborted_transactions(0, 7), vec![], "the truncated marker's entry is gone");
}
