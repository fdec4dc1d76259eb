//! Idempotent-producer state of one partition: per producer id, its epoch and the last
//! few batches it wrote, so a retried batch is answered with its original offset instead
//! of being written twice, and a gap in sequence numbers is refused.
//!
//! The state is a pure function of the log: it is rebuilt by replaying batch headers, and
//! snapshotted (at segment roll and clean shutdown) only to bound that replay.

use std::collections::{HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::batch::BatchHeader;

/// How many recent batches per producer are remembered for duplicate detection. Kafka
/// remembers 5 (clients keep at most 5 requests in flight per connection), but across a
/// leader change a client can have 5 batches in flight to the old leader and already send
/// the next one to the new leader, which holds the 5 (replicated) and appends it. The
/// retried 5 then arrive behind it: with 5 remembered the oldest is "out of order" and the
/// Java client retries it until `delivery.timeout.ms` (seen in test_java_cluster.py). Twice
/// that window and more answers them as the duplicates they are, at 16 bytes a batch.
pub const PRODUCER_BATCHES_REMEMBERED: usize = 16;

/// Verdict of a sequence check for an incoming batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SequenceCheck {
    /// New data in order: append it.
    Append,
    /// A retry of a batch already in the log at this base offset: do not write it again.
    Duplicate { base_offset: i64 },
    /// A gap or reordering: OUT_OF_ORDER_SEQUENCE_NUMBER.
    OutOfOrder,
    /// An epoch older than the producer's current one: INVALID_PRODUCER_EPOCH.
    StaleEpoch,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct BatchMetadata {
    first_sequence: i32,
    last_sequence: i32,
    base_offset: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct ProducerEntry {
    epoch: i16,
    batches: VecDeque<BatchMetadata>,
    /// First offset of the producer's open transaction in this partition (until its
    /// commit or abort marker).
    #[serde(default)]
    open_transaction: Option<i64>,
    /// Largest timestamp of its last batch (-1 when unknown, e.g. an older snapshot).
    #[serde(default = "unknown_timestamp")]
    last_timestamp: i64,
}

fn unknown_timestamp() -> i64 {
    -1
}

/// One producer's state in a partition, as DescribeProducers reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerSummary {
    pub producer_id: i64,
    pub producer_epoch: i16,
    /// Sequence of its last record (-1 when it wrote none at this epoch).
    pub last_sequence: i32,
    pub last_timestamp: i64,
    /// First offset of its open transaction, if any.
    pub open_transaction: Option<i64>,
}

/// Producer id -> state, for one partition.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerStateTable {
    producers: HashMap<i64, ProducerEntry>,
}

fn next_sequence(sequence: i32) -> i32 {
    if sequence == i32::MAX {
        0
    } else {
        sequence + 1
    }
}

impl ProducerStateTable {
    /// Decides what to do with a batch. Batches without a producer id always append.
    pub fn check(&self, header: &BatchHeader) -> SequenceCheck {
        if !header.has_producer_id() {
            return SequenceCheck::Append;
        }
        let first = header.base_sequence;
        let last = header.last_sequence();
        let Some(entry) = self.producers.get(&header.producer_id) else {
            return if first == 0 { SequenceCheck::Append } else { SequenceCheck::OutOfOrder };
        };
        if header.producer_epoch < entry.epoch {
            return SequenceCheck::StaleEpoch;
        }
        if header.producer_epoch > entry.epoch {
            return if first == 0 { SequenceCheck::Append } else { SequenceCheck::OutOfOrder };
        }
        if let Some(batch) = entry.batches.iter().find(|b| b.first_sequence == first && b.last_sequence == last) {
            return SequenceCheck::Duplicate { base_offset: batch.base_offset };
        }
        match entry.batches.back() {
            Some(previous) if first == next_sequence(previous.last_sequence) => SequenceCheck::Append,
            None if first == 0 => SequenceCheck::Append,
            _ => SequenceCheck::OutOfOrder,
        }
    }

    /// Records a batch that was appended at `header.base_offset`. A transaction marker
    /// (control batch) closes the producer's open transaction; one with a newer epoch (the
    /// coordinator fencing the producer) starts that epoch.
    pub fn record(&mut self, header: &BatchHeader) {
        if !header.has_producer_id() {
            return;
        }
        let entry = self.producers.entry(header.producer_id).or_insert_with(|| ProducerEntry {
            epoch: header.producer_epoch,
            batches: VecDeque::new(),
            open_transaction: None,
            last_timestamp: -1,
        });
        entry.last_timestamp = header.max_timestamp;
        if header.is_control() {
            if header.producer_epoch > entry.epoch {
                entry.epoch = header.producer_epoch;
                entry.batches.clear();
            }
            entry.open_transaction = None;
            return;
        }
        if header.is_transactional() && entry.open_transaction.is_none() {
            entry.open_transaction = Some(header.base_offset);
        }
        if header.producer_epoch != entry.epoch {
            entry.epoch = header.producer_epoch;
            entry.batches.clear();
        }
        if entry.batches.len() == PRODUCER_BATCHES_REMEMBERED {
            entry.batches.pop_front();
        }
        entry.batches.push_back(BatchMetadata {
            first_sequence: header.base_sequence,
            last_sequence: header.last_sequence(),
            base_offset: header.base_offset,
        });
        assert!(entry.batches.len() <= PRODUCER_BATCHES_REMEMBERED);
    }

    /// Base offset of the last batch `producer_id` wrote (what the cleaner must keep, even
    /// emptied, so the producer's sequence survives a replay of the log).
    pub fn last_batch_base(&self, producer_id: i64) -> Option<i64> {
        self.producers.get(&producer_id).and_then(|entry| entry.batches.back()).map(|batch| batch.base_offset)
    }

    /// First offset of `producer_id`'s open transaction, if it has one.
    pub fn open_transaction(&self, producer_id: i64) -> Option<i64> {
        self.producers.get(&producer_id).and_then(|entry| entry.open_transaction)
    }

    /// The first offset of the oldest open transaction: the last stable offset's bound.
    pub fn first_open_transaction_offset(&self) -> Option<i64> {
        self.producers.values().filter_map(|entry| entry.open_transaction).min()
    }

    /// (producer id, epoch, first offset) of every open transaction.
    pub fn open_transactions(&self) -> Vec<(i64, i16, i64)> {
        let mut open: Vec<(i64, i16, i64)> = self
            .producers
            .iter()
            .filter_map(|(&id, entry)| entry.open_transaction.map(|first| (id, entry.epoch, first)))
            .collect();
        open.sort_unstable();
        open
    }

    /// The producer's current epoch.
    pub fn epoch(&self, producer_id: i64) -> Option<i16> {
        self.producers.get(&producer_id).map(|entry| entry.epoch)
    }

    /// Every producer's state, by producer id (DescribeProducers).
    pub fn summaries(&self) -> Vec<ProducerSummary> {
        let mut all: Vec<ProducerSummary> = self
            .producers
            .iter()
            .map(|(&producer_id, entry)| ProducerSummary {
                producer_id,
                producer_epoch: entry.epoch,
                last_sequence: entry.batches.back().map_or(-1, |batch| batch.last_sequence),
                last_timestamp: entry.last_timestamp,
                open_transaction: entry.open_transaction,
            })
            .collect();
        all.sort_unstable_by_key(|summary| summary.producer_id);
        all
    }

    pub fn producer_count(&self) -> usize {
        self.producers.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{tests::make_batch, BatchHeader};

    fn header(pid: i64, epoch: i16, seq: i32, count: i32, offset: i64) -> BatchHeader {
        let mut h = BatchHeader::parse(&make_batch(count, 0, Some((pid, epoch, seq)))).unwrap();
        h.base_offset = offset;
        h
    }

    #[test]
    fn in_order_batches_append_and_retries_are_duplicates() {
        let mut table = ProducerStateTable::default();
        let first = header(1, 0, 0, 3, 100);
        assert_eq!(table.check(&first), SequenceCheck::Append);
        table.record(&first);
        let second = header(1, 0, 3, 2, 103);
        assert_eq!(table.check(&second), SequenceCheck::Append);
        table.record(&second);
        assert_eq!(table.check(&header(1, 0, 0, 3, -1)), SequenceCheck::Duplicate { base_offset: 100 });
        assert_eq!(table.check(&header(1, 0, 3, 2, -1)), SequenceCheck::Duplicate { base_offset: 103 });
    }

    #[test]
    fn gaps_and_stale_epochs_are_refused() {
        let mut table = ProducerStateTable::default();
        assert_eq!(table.check(&header(1, 0, 5, 1, 0)), SequenceCheck::OutOfOrder);
        table.record(&header(1, 2, 0, 1, 0));
        assert_eq!(table.check(&header(1, 2, 2, 1, 1)), SequenceCheck::OutOfOrder);
        assert_eq!(table.check(&header(1, 1, 1, 1, 1)), SequenceCheck::StaleEpoch);
        assert_eq!(table.check(&header(1, 3, 0, 1, 1)), SequenceCheck::Append);
        assert_eq!(table.check(&header(1, 3, 4, 1, 1)), SequenceCheck::OutOfOrder);
    }

    #[test]
    fn only_recent_batches_are_remembered() {
        let mut table = ProducerStateTable::default();
        let batches = 2 * PRODUCER_BATCHES_REMEMBERED as i32;
        for i in 0..batches {
            table.record(&header(9, 0, i, 1, i64::from(i)));
        }
        let oldest_remembered = batches - PRODUCER_BATCHES_REMEMBERED as i32;
        let duplicate = |seq: i32| SequenceCheck::Duplicate { base_offset: i64::from(seq) };
        assert_eq!(table.check(&header(9, 0, batches - 1, 1, -1)), duplicate(batches - 1));
        assert_eq!(table.check(&header(9, 0, oldest_remembered, 1, -1)), duplicate(oldest_remembered));
        assert_eq!(table.check(&header(9, 0, oldest_remembered - 1, 1, -1)), SequenceCheck::OutOfOrder);
        assert_eq!(table.check(&header(9, 0, batches, 1, -1)), SequenceCheck::Append);
    }

    /// Across a leader change a client may send its next batch to the new leader while its 5
    /// previous ones, already replicated there, are still in flight to the old one: their
    /// retries, arriving after it, are duplicates (not out of order).
    #[test]
    fn retries_of_five_in_flight_batches_after_a_newer_one_are_duplicates() {
        let mut table = ProducerStateTable::default();
        for i in 0..6 {
            table.record(&header(7, 0, i * 4, 4, i64::from(i * 4)));
        }
        for i in 0..5 {
            assert_eq!(
                table.check(&header(7, 0, i * 4, 4, -1)),
                SequenceCheck::Duplicate { base_offset: i64::from(i * 4) }
            );
        }
    }
}
