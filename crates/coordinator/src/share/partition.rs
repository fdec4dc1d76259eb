//! One share-partition (KIP-932): the records of one topic partition as one share group
//! consumes them, each offset handed to one member at a time and acknowledged one by one.
//!
//! The window `[start, end)` (Kafka's SPSO and SPEO) holds every offset that was handed
//! out and is not yet done; below `start` everything is acknowledged or archived, from
//! `end` on nothing was acquired yet. Each offset in the window is Available (again, after
//! a release or an expired lock), Acquired by one member until a deadline, Acknowledged or
//! Archived (rejected, a gap, a control record, or delivered `delivery_limit` times).
//! `start` moves past a done prefix at once, so the window is bounded by the in-flight
//! limit. This type is pure state: no I/O, no clock but the times it is given.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// Kafka's acknowledge types (ShareFetch / ShareAcknowledge `acknowledge_types`).
pub const ACK_GAP: i8 = 0;
pub const ACK_ACCEPT: i8 = 1;
pub const ACK_RELEASE: i8 = 2;
pub const ACK_REJECT: i8 = 3;
/// KIP-1222: the member is still working on the record; its lock is extended.
pub const ACK_RENEW: i8 = 4;

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Available,
    Acquired { member: Arc<str>, until_ms: i64 },
    Acknowledged,
    Archived,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct InFlight {
    state: State,
    delivery_count: i16,
}

/// Why a record was archived undelivered: what a dead-letter topic records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadReason {
    /// A consumer rejected it.
    Rejected,
    /// It was delivered `delivery_limit` times without being accepted.
    DeliveryLimit,
}

impl DeadReason {
    pub fn name(self) -> &'static str {
        match self {
            DeadReason::Rejected => "rejected",
            DeadReason::DeliveryLimit => "delivery-limit",
        }
    }
}

/// A record archived undelivered: offset, why, and its delivery count.
pub type DeadRecord = (i64, DeadReason, i16);

/// Why an acknowledgement was refused (the partition is unchanged).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckError {
    /// An offset in the range is not acquired by this member (Kafka's INVALID_RECORD_STATE).
    NotAcquired,
    /// Malformed: an empty or reversed range, a wrong number of types, an unknown type, or
    /// (as Kafka) offsets past the end of a window with records in flight.
    Invalid,
}

/// A run of acquired offsets with the same delivery count (ShareFetch `acquired_records`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcquiredRange {
    pub first_offset: i64,
    pub last_offset: i64,
    pub delivery_count: i16,
}

/// A share-partition's records as a queue counts them (RabbitMQ's `messages_ready` and
/// `messages_unacknowledged`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Depth {
    pub ready: u64,
    pub unacknowledged: u64,
}

/// How many records one acquisition may take (ShareFetch `MaxRecords` and KIP-1206's
/// `ShareAcquireMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordLimit {
    pub records: usize,
    /// `record_limit` mode: never more than `records`, splitting a batch if need be;
    /// otherwise (`batch_optimized`) whole batches, the last one taking it past.
    pub exact: bool,
}

impl RecordLimit {
    /// Whole batches up to about `records`.
    pub fn batches(records: usize) -> RecordLimit {
        RecordLimit { records, exact: false }
    }
}

/// A stored batch as acquisition sees it: its offsets and whether it is a control batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchSpan {
    pub base_offset: i64,
    pub last_offset: i64,
    pub control: bool,
}

/// The durable form: the window and every offset in it that is not Available with no
/// delivery yet, as runs. Acquired offsets are stored as Available (a lock does not
/// outlive the broker), with their delivery count.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredPartition {
    pub start: i64,
    pub end: i64,
    /// (first offset, last offset, state: 0 available, 2 acknowledged, 4 archived, delivery count)
    pub runs: Vec<(i64, i64, u8, i16)>,
    /// Archived records still to copy to the group's dead-letter topic: (offset, reason
    /// ("rejected" or "delivery-limit"), delivery count).
    #[serde(default)]
    pub dead_letters: Vec<(i64, String, i16)>,
    /// The leader epoch of the data partition leader that wrote it (`share/store.rs`
    /// fences older leaders with it).
    #[serde(default)]
    pub leader_epoch: i32,
    /// Incremented by that leader with each change.
    #[serde(default)]
    pub version: i32,
    /// Set by an administrator (AlterShareGroupOffsets, DeleteShareGroupOffsets, DeleteGroups):
    /// what a leader holds in memory is out of date, so the store refuses its writes until
    /// it reads the state again.
    #[serde(default)]
    pub reset: bool,
    /// Deleted by an administrator: a leader reading it gets nothing (then it is forgotten).
    #[serde(default)]
    pub deleted: bool,
}

impl StoredPartition {
    /// Records at or past `start` already acknowledged or archived (out of order, so the
    /// window could not move past them yet).
    pub fn delivery_complete(&self) -> i64 {
        let done = self.runs.iter().filter(|run| run.2 == STORED_ACKNOWLEDGED || run.2 == STORED_ARCHIVED);
        done.map(|&(first, last, _, _)| (last.min(self.end - 1) - first.max(self.start) + 1).max(0)).sum()
    }
}

const STORED_AVAILABLE: u8 = 0;
const STORED_ACKNOWLEDGED: u8 = 2;
const STORED_ARCHIVED: u8 = 4;

#[derive(Debug, Clone)]
pub struct SharePartition {
    start: i64,
    end: i64,
    records: BTreeMap<i64, InFlight>,
    /// Archived records waiting to be copied to the dead-letter topic, in offset order.
    dead_letters: Vec<DeadRecord>,
}

impl SharePartition {
    /// A share-partition that starts consuming at `offset` (`share.auto.offset.reset`).
    pub fn starting_at(offset: i64) -> SharePartition {
        SharePartition { start: offset, end: offset, records: BTreeMap::new(), dead_letters: Vec::new() }
    }

    /// Queues archived records for the dead-letter topic (stored with the partition, so the
    /// archival and the intent to copy are durable together).
    pub fn add_dead_letters(&mut self, dead: Vec<DeadRecord>) {
        self.dead_letters.extend(dead);
    }

    pub fn dead_letters(&self) -> &[DeadRecord] {
        &self.dead_letters
    }

    /// Once `copied` are durable in the dead-letter topic.
    pub fn dead_letters_copied(&mut self, copied: &[DeadRecord]) {
        self.dead_letters.retain(|d| !copied.contains(d));
    }

    #[cfg(test)]
    pub fn start(&self) -> i64 {
        self.start
    }

    #[cfg(test)]
    pub fn end(&self) -> i64 {
        self.end
    }

    /// Offsets handed out and not done yet (acquired, or available again).
    #[cfg(test)]
    pub fn in_flight(&self) -> usize {
        self.records.values().filter(|r| matches!(r.state, State::Available | State::Acquired { .. })).count()
    }

    fn check(&self) {
        debug_assert!(self.start <= self.end);
        debug_assert!(self.records.keys().all(|o| (self.start..self.end).contains(o)));
        debug_assert_eq!(self.records.len() as i64, self.end - self.start);
    }

    /// Where the next acquisition should read from: the first offset available again,
    /// else `end` while fewer than `max_in_flight` offsets are in the window; `None` when
    /// nothing can be acquired now. Never below `log_start` (records deleted by retention
    /// are skipped: their offsets are archived on the next acquisition).
    pub fn next_fetch_offset(&self, max_in_flight: usize, log_start: i64) -> Option<i64> {
        let again = self.records.iter().find(|(_, r)| r.state == State::Available).map(|(o, _)| *o);
        match again {
            Some(offset) => Some(offset.max(log_start)),
            None if ((self.end - self.start) as usize) < max_in_flight => Some(self.end.max(log_start)),
            None => None,
        }
    }

    /// Moves the window to `log_start` when retention deleted records below it.
    pub fn skip_to(&mut self, log_start: i64) {
        if log_start <= self.start {
            return;
        }
        self.records.retain(|offset, _| *offset >= log_start);
        self.start = log_start;
        if self.end < log_start {
            self.end = log_start;
        }
        self.check();
    }

    /// Acquires for `member`, until `until_ms`, the available and new offsets of the
    /// batches read (in offset order), at most `limit.records` (whole batches unless
    /// `limit.exact`: then the last batch may take it past) and while the window holds fewer
    /// than `max_in_flight` offsets. Control batches are archived, never handed out. Returns
    /// the acquired runs and which batches (by index into `batches`) hold any of them.
    pub fn acquire(
        &mut self,
        member: &Arc<str>,
        batches: &[BatchSpan],
        limit: RecordLimit,
        max_in_flight: usize,
        until_ms: i64,
    ) -> (Vec<AcquiredRange>, Vec<usize>) {
        let max_records = limit.records.max(1);
        let mut ranges: Vec<AcquiredRange> = Vec::new();
        let mut used = Vec::new();
        let mut acquired = 0usize;
        for (index, batch) in batches.iter().enumerate() {
            if acquired >= max_records {
                break;
            }
            if batch.last_offset < self.start {
                continue;
            }
            if batch.base_offset >= self.end && (self.end - self.start) as usize >= max_in_flight {
                break;
            }
            // Offsets missing from the log (compacted away) between `end` and this batch.
            while self.end < batch.base_offset {
                self.records.insert(self.end, InFlight { state: State::Archived, delivery_count: 0 });
                self.end += 1;
            }
            let mut any = false;
            for offset in batch.base_offset.max(self.start)..=batch.last_offset {
                if limit.exact && acquired >= max_records {
                    break;
                }
                if offset == self.end {
                    self.records.insert(offset, InFlight { state: State::Available, delivery_count: 0 });
                    self.end += 1;
                }
                let record = self.records.get_mut(&offset).expect("offsets below end are in the window");
                if batch.control {
                    if record.state == State::Available {
                        record.state = State::Archived;
                    }
                    continue;
                }
                if record.state != State::Available {
                    continue;
                }
                record.delivery_count = record.delivery_count.saturating_add(1);
                record.state = State::Acquired { member: member.clone(), until_ms };
                acquired += 1;
                any = true;
                match ranges.last_mut() {
                    Some(last) if last.last_offset + 1 == offset && last.delivery_count == record.delivery_count => {
                        last.last_offset = offset;
                    }
                    _ => ranges.push(AcquiredRange {
                        first_offset: offset,
                        last_offset: offset,
                        delivery_count: record.delivery_count,
                    }),
                }
            }
            if any {
                used.push(index);
            }
        }
        self.advance();
        (ranges, used)
    }

    /// Applies `member`'s acknowledgement of `[first, last]`: one type for the whole range,
    /// or one per offset. All or nothing: every offset must be acquired by `member`.
    /// Released offsets delivered `delivery_limit` times are archived; renewed ones stay
    /// acquired until `renew_until_ms` (`None`: RENEW is not allowed here, as in a request
    /// that did not announce it). Returns the records archived undelivered (rejected, or
    /// released at the limit).
    pub fn acknowledge(
        &mut self,
        member: &str,
        (first, last): (i64, i64),
        types: &[i8],
        delivery_limit: i16,
        renew_until_ms: Option<i64>,
    ) -> Result<Vec<DeadRecord>, AckError> {
        if first > last || types.is_empty() || (types.len() != 1 && types.len() as i64 != last - first + 1) {
            return Err(AckError::Invalid);
        }
        let highest_type = if renew_until_ms.is_some() { ACK_RENEW } else { ACK_REJECT };
        if types.iter().any(|t| !(ACK_GAP..=highest_type).contains(t)) {
            return Err(AckError::Invalid);
        }
        // Offsets below the window are done already: acknowledging them again is a no-op.
        if last < self.start {
            return Ok(Vec::new());
        }
        // Past the window's end: never handed out. Kafka answers INVALID_REQUEST while
        // records are in flight (INVALID_RECORD_STATE once none are, as below).
        if last >= self.end && self.start < self.end {
            return Err(AckError::Invalid);
        }
        let (first, types) = if first < self.start && types.len() > 1 {
            (self.start, &types[(self.start - first) as usize..])
        } else {
            (first.max(self.start), types)
        };
        for offset in first..=last {
            match self.records.get(&offset) {
                Some(InFlight { state: State::Acquired { member: owner, .. }, .. }) if &**owner == member => {}
                _ => return Err(AckError::NotAcquired),
            }
        }
        let mut dead = Vec::new();
        for offset in first..=last {
            let kind = if types.len() == 1 { types[0] } else { types[(offset - first) as usize] };
            let record = self.records.get_mut(&offset).expect("checked above");
            record.state = match kind {
                ACK_ACCEPT => State::Acknowledged,
                ACK_RELEASE if record.delivery_count < delivery_limit => State::Available,
                ACK_RELEASE => {
                    dead.push((offset, DeadReason::DeliveryLimit, record.delivery_count));
                    State::Archived
                }
                ACK_REJECT => {
                    dead.push((offset, DeadReason::Rejected, record.delivery_count));
                    State::Archived
                }
                ACK_RENEW => {
                    let until_ms = renew_until_ms.expect("RENEW is refused above without a deadline");
                    State::Acquired { member: member.into(), until_ms }
                }
                _ => State::Archived,
            };
        }
        self.advance();
        Ok(dead)
    }

    /// Makes every offset whose lock passed `now_ms` available again (archived once
    /// delivered `delivery_limit` times), and with `member` set, every offset it holds (it
    /// left the group). Returns whether anything changed, and the records archived at the
    /// delivery limit.
    pub fn release_expired(
        &mut self,
        now_ms: i64,
        member: Option<&str>,
        delivery_limit: i16,
    ) -> (bool, Vec<DeadRecord>) {
        let mut changed = false;
        let mut dead = Vec::new();
        for (offset, record) in self.records.iter_mut() {
            if let State::Acquired { member: owner, until_ms } = &record.state {
                if *until_ms <= now_ms || member.is_some_and(|m| m == &**owner) {
                    record.state = if record.delivery_count >= delivery_limit {
                        dead.push((*offset, DeadReason::DeliveryLimit, record.delivery_count));
                        State::Archived
                    } else {
                        State::Available
                    };
                    changed = true;
                }
            }
        }
        if changed {
            self.advance();
        }
        (changed, dead)
    }

    /// The earliest lock deadline in the window, if any offset is acquired.
    pub fn next_deadline(&self) -> Option<i64> {
        self.records
            .values()
            .filter_map(|r| match r.state {
                State::Acquired { until_ms, .. } => Some(until_ms),
                _ => None,
            })
            .min()
    }

    /// Moves `start` past the done prefix of the window.
    fn advance(&mut self) {
        while let Some(entry) = self.records.first_entry() {
            if !matches!(entry.get().state, State::Acknowledged | State::Archived) {
                break;
            }
            entry.remove();
            self.start += 1;
        }
        if self.records.is_empty() {
            self.start = self.end;
        } else {
            self.start = *self.records.keys().next().expect("not empty");
        }
        self.check();
    }

    /// How many records are ready (never handed out, or available again) and how many are
    /// handed out and not acknowledged, for a log from `log_start` up to `visible_end` (the
    /// high watermark: what an acquisition may read).
    pub fn depth(&self, log_start: i64, visible_end: i64) -> Depth {
        let mut depth = Depth::default();
        for (offset, record) in self.records.range(log_start..) {
            match record.state {
                State::Available => depth.ready += 1,
                State::Acquired { .. } => depth.unacknowledged += 1,
                State::Acknowledged | State::Archived => {}
            }
            debug_assert!(*offset < self.end);
        }
        depth.ready += (visible_end - self.end.max(log_start)).max(0) as u64;
        depth
    }

    /// Archives up to `count` ready records, oldest first, below `visible_end`: a queue over
    /// its length limit dropping its head. New offsets join the window only while it holds
    /// fewer than `max_in_flight` (a record still held at its start keeps it from moving).
    /// Returns the offsets it archived, in order.
    pub fn discard_ready(&mut self, count: u64, log_start: i64, visible_end: i64, max_in_flight: usize) -> Vec<i64> {
        self.skip_to(log_start);
        let mut discarded = Vec::new();
        for (offset, record) in self.records.iter_mut() {
            if discarded.len() as u64 == count {
                break;
            }
            if record.state == State::Available {
                record.state = State::Archived;
                discarded.push(*offset);
            }
        }
        while (discarded.len() as u64) < count
            && self.end < visible_end
            && ((self.end - self.start) as usize) < max_in_flight
        {
            self.records.insert(self.end, InFlight { state: State::Archived, delivery_count: 0 });
            discarded.push(self.end);
            self.end += 1;
        }
        self.advance();
        discarded
    }

    pub fn stored(&self) -> StoredPartition {
        let mut runs: Vec<(i64, i64, u8, i16)> = Vec::new();
        for (offset, record) in &self.records {
            let state = match record.state {
                State::Available | State::Acquired { .. } => STORED_AVAILABLE,
                State::Acknowledged => STORED_ACKNOWLEDGED,
                State::Archived => STORED_ARCHIVED,
            };
            match runs.last_mut() {
                Some(run) if run.1 + 1 == *offset && run.2 == state && run.3 == record.delivery_count => {
                    run.1 = *offset
                }
                _ => runs.push((*offset, *offset, state, record.delivery_count)),
            }
        }
        let dead_letters = self.dead_letters.iter().map(|(o, r, c)| (*o, r.name().to_string(), *c)).collect();
        StoredPartition {
            start: self.start,
            end: self.end,
            runs,
            dead_letters,
            leader_epoch: 0,
            version: 0,
            reset: false,
            deleted: false,
        }
    }

    pub fn from_stored(stored: &StoredPartition) -> SharePartition {
        let mut partition = SharePartition::starting_at(stored.start);
        partition.end = stored.end.max(stored.start);
        for offset in partition.start..partition.end {
            partition.records.insert(offset, InFlight { state: State::Available, delivery_count: 0 });
        }
        for &(first, last, state, delivery_count) in &stored.runs {
            for offset in first.max(partition.start)..=last.min(partition.end - 1) {
                let state = match state {
                    STORED_ACKNOWLEDGED => State::Acknowledged,
                    STORED_ARCHIVED => State::Archived,
                    _ => State::Available,
                };
                partition.records.insert(offset, InFlight { state, delivery_count });
            }
        }
        partition.dead_letters = stored
            .dead_letters
            .iter()
            .map(|(offset, reason, count)| {
                let reason = if reason == "rejected" { DeadReason::Rejected } else { DeadReason::DeliveryLimit };
                (*offset, reason, *count)
            })
            .collect();
        partition.advance();
        partition
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(base: i64, last: i64) -> BatchSpan {
        BatchSpan { base_offset: base, last_offset: last, control: false }
    }

    fn range(first: i64, last: i64, delivery_count: i16) -> AcquiredRange {
        AcquiredRange { first_offset: first, last_offset: last, delivery_count }
    }

    #[test]
    fn a_full_queue_drops_its_oldest_ready_records_and_keeps_the_held_ones() {
        let member: Arc<str> = "m".into();
        let mut partition = SharePartition::starting_at(0);
        // 0..=1 held by a consumer, 2..10 ready (the high watermark is at 10).
        partition.acquire(&member, &[batch(0, 1)], RecordLimit::batches(2), 100, 1_000);
        assert_eq!(partition.depth(0, 10), Depth { ready: 8, unacknowledged: 2 });
        assert_eq!(partition.discard_ready(5, 0, 10, 100), vec![2, 3, 4, 5, 6]);
        assert_eq!(partition.depth(0, 10), Depth { ready: 3, unacknowledged: 2 });
        // The next acquisition gets the newest three, not what was dropped.
        let (ranges, _) = partition.acquire(&member, &[batch(2, 9)], RecordLimit::batches(10), 100, 1_000);
        assert_eq!(ranges, vec![range(7, 9, 1)]);
        // Once the held ones are done the window moves past everything dropped.
        partition.acknowledge("m", (0, 1), &[ACK_ACCEPT], 5, None).unwrap();
        partition.acknowledge("m", (7, 9), &[ACK_ACCEPT], 5, None).unwrap();
        assert_eq!((partition.start(), partition.end()), (10, 10));
        // Never more than there is, nor past the in-flight limit.
        assert_eq!(partition.discard_ready(100, 0, 12, 100), vec![10, 11]);
        partition.acquire(&member, &[batch(12, 12)], RecordLimit::batches(1), 100, 1_000);
        assert_eq!(partition.discard_ready(100, 0, 30, 4), vec![13, 14, 15]);
        assert_eq!(partition.depth(0, 30), Depth { ready: 14, unacknowledged: 1 });
    }

    #[test]
    fn records_go_to_one_member_at_a_time_and_come_back_when_released_or_expired() {
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        let mut p = SharePartition::starting_at(0);
        let batches = [batch(0, 4), batch(5, 9)];
        assert_eq!(p.acquire(&a, &batches, RecordLimit::batches(5), 100, 1_000), (vec![range(0, 4, 1)], vec![0]));
        assert_eq!(p.next_fetch_offset(100, 0), Some(5));
        assert_eq!(p.acquire(&b, &batches, RecordLimit::batches(5), 100, 1_000), (vec![range(5, 9, 1)], vec![1]));
        // a accepts 0-1, releases 2, rejects 3; b cannot acknowledge a's records.
        assert_eq!(p.acknowledge("b", (0, 0), &[ACK_ACCEPT], 5, None), Err(AckError::NotAcquired));
        assert_eq!(
            p.acknowledge("a", (0, 3), &[ACK_ACCEPT, ACK_ACCEPT, ACK_RELEASE, ACK_REJECT], 5, None),
            Ok(vec![(3, DeadReason::Rejected, 1)])
        );
        assert_eq!(p.start(), 2);
        assert_eq!(p.next_fetch_offset(100, 0), Some(2));
        // b gets 2 again (delivery 2); 4's lock expires and it comes back too.
        assert_eq!(p.acquire(&b, &batches, RecordLimit::batches(10), 100, 2_000), (vec![range(2, 2, 2)], vec![0]));
        assert_eq!(p.release_expired(1_000, None, 5), (true, vec![]));
        assert_eq!(p.acquire(&b, &batches, RecordLimit::batches(10), 100, 3_000), (vec![range(4, 9, 2)], vec![0, 1]));
        // 3 was rejected: it is done, not b's to acknowledge; 10 was never handed out.
        assert_eq!(p.acknowledge("b", (2, 9), &[ACK_ACCEPT], 5, None), Err(AckError::NotAcquired));
        assert_eq!(p.acknowledge("b", (9, 10), &[ACK_ACCEPT], 5, None), Err(AckError::Invalid));
        p.acknowledge("b", (2, 2), &[ACK_ACCEPT], 5, None).unwrap();
        p.acknowledge("b", (4, 9), &[ACK_ACCEPT], 5, None).unwrap();
        assert_eq!((p.start(), p.end(), p.in_flight()), (10, 10, 0));
    }

    #[test]
    fn delivery_limit_archives_and_the_window_bounds_acquisition() {
        let a: Arc<str> = "a".into();
        let mut p = SharePartition::starting_at(0);
        let batches = [batch(0, 0), batch(1, 1)];
        for delivery in 1..=3 {
            assert_eq!(p.acquire(&a, &batches[..1], RecordLimit::batches(1), 1, 0).0, vec![range(0, 0, delivery)]);
            // The window is full: nothing new while offset 0 is in flight.
            assert_eq!(p.acquire(&a, &batches[1..], RecordLimit::batches(1), 1, 0).0, vec![]);
            let dead = p.acknowledge("a", (0, 0), &[ACK_RELEASE], 3, None).unwrap();
            assert_eq!(dead, if delivery == 3 { vec![(0, DeadReason::DeliveryLimit, 3)] } else { vec![] });
        }
        assert_eq!(p.start(), 1, "the third release archives the poison record");
        let control = [BatchSpan { base_offset: 1, last_offset: 1, control: true }, batch(2, 3)];
        assert_eq!(p.acquire(&a, &control, RecordLimit::batches(10), 10, 0), (vec![range(2, 3, 1)], vec![1]));
        assert!(p.release_expired(0, Some("a"), 3).0, "a member that leaves releases its records");
        assert_eq!((p.start(), p.next_fetch_offset(10, 0)), (2, Some(2)));
    }

    #[test]
    fn stored_state_restores_without_locks() {
        let a: Arc<str> = "a".into();
        let mut p = SharePartition::starting_at(5);
        p.acquire(&a, &[batch(5, 9)], RecordLimit::batches(10), 100, 0);
        p.acknowledge("a", (6, 6), &[ACK_ACCEPT], 5, None).unwrap();
        p.acknowledge("a", (8, 8), &[ACK_REJECT], 5, None).unwrap();
        let restored = SharePartition::from_stored(&p.stored());
        assert_eq!((restored.start(), restored.end()), (5, 10));
        // Acknowledged and archived offsets are never handed out again; the rest come back
        // with their delivery count.
        let mut restored = restored;
        assert_eq!(
            restored.acquire(&a, &[batch(5, 9)], RecordLimit::batches(10), 100, 0).0,
            vec![range(5, 5, 2), range(7, 7, 2), range(9, 9, 2)]
        );
        assert_eq!(p.acknowledge("a", (5, 9), &[ACK_ACCEPT], 5, None), Err(AckError::NotAcquired));
        assert_eq!(restored.acknowledge("a", (3, 2), &[ACK_ACCEPT], 5, None), Err(AckError::Invalid));
        // Below the window: already done, a no-op.
        assert_eq!(restored.acknowledge("b", (0, 4), &[ACK_REJECT], 5, None), Ok(vec![]));
    }

    #[test]
    fn renewal_extends_a_lock_and_record_limit_splits_a_batch() {
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        let mut p = SharePartition::starting_at(0);
        let exact = RecordLimit { records: 3, exact: true };
        // record_limit: 3 of the batch's 5 records; the rest stay for the next fetch.
        assert_eq!(p.acquire(&a, &[batch(0, 4)], exact, 100, 1_000), (vec![range(0, 2, 1)], vec![0]));
        assert_eq!(p.next_fetch_offset(100, 0), Some(3));
        assert_eq!(p.acquire(&b, &[batch(0, 4)], exact, 100, 1_000), (vec![range(3, 4, 1)], vec![0]));
        // RENEW only where the request announced it; then the lock outlives its first deadline.
        assert_eq!(p.acknowledge("a", (0, 0), &[ACK_RENEW], 5, None), Err(AckError::Invalid));
        assert_eq!(p.acknowledge("a", (0, 1), &[ACK_RENEW], 5, Some(5_000)), Ok(vec![]));
        assert!(p.release_expired(1_000, None, 5).0, "offset 2 and b's records expire");
        assert_eq!(p.acquire(&b, &[batch(0, 4)], exact, 100, 9_000).0, vec![range(2, 4, 2)]);
        assert_eq!(p.acknowledge("a", (0, 1), &[ACK_ACCEPT], 5, None), Ok(vec![]), "still a's, same delivery");
        assert_eq!(p.start(), 2);
    }
}
