//! The appender: every byte that enters the log comes through here — a client's batch
//! ([`Partition::append`]), a follower's copy of the leader's ([`Partition::append_replica`]),
//! a transaction marker ([`Partition::append_marker`]) — along with segment rolls and the
//! hand-off to the syncer whose fsync (or WAL record) moves the locally durable end.
//!
//! Why a module: what an acknowledged produce can rely on is decided by the append path and
//! the sync that completes it; kept together, that contract reads in one place.
//!
//! Durability contract: an append returns once the batch is written to the active segment (page
//! cache); it fsyncs no batch data itself. Under fsync-per-write the batch also waits in
//! `wal_pending` (by reference, [`PendingBatches`]) for the partition's next WAL record, and
//! `local_end` (and, unreplicated, the high watermark) moves only in
//! [`Partition::finish_sync`], after the WAL record or the segment `fdatasync` covering it
//! returned; in page-cache mode it moves at once and the data is flushed by
//! `flush.messages`/`flush.ms` ([`Partition::flush_due`]). Fsynced before an append returns:
//! the leader-epoch file when the batch opens a new epoch, the aborted-transactions file before
//! an abort marker, and on a roll the sealed segment (before the new segment's file exists) and
//! the new file's directory entry. A crash at any point leaves a prefix of the appended batches
//! (recovery cuts a torn tail, the WAL replays what it logged): never less than the high
//! watermark covered. A failed fsync takes the log offline.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;

use super::recovery::{
    capture_recovery_image, note_leader_epoch, recovery_image_due, write_leader_epochs_if_unwritten, write_snapshot,
};
use super::{
    AbortedTransaction, AppendError, AppendOutcome, LogConfig, LogState, Partition, ReplicaAppend, TopicSignals,
    ABORTED_TRANSACTIONS_FILE,
};
use crate::batch::{self, BatchHeader, BatchIter};
use crate::producer_state::SequenceCheck;
use crate::segment::Segment;
use crate::syncer::WalLink;
use crate::wal::Control;

/// What one fsync must cover and what it makes visible.
pub(crate) struct SyncTarget {
    /// The active segment's file, once the bytes it kept in memory are written (or why
    /// they could not be).
    file: io::Result<Arc<std::fs::File>>,
    pub(crate) end_offset: i64,
    pub(crate) generation: u64,
}

impl SyncTarget {
    /// Makes the target's file durable (`fdatasync`).
    pub(crate) fn sync(&self) -> io::Result<()> {
        match &self.file {
            Ok(file) => crate::durable::sync_data(file),
            Err(error) => Err(io::Error::new(error.kind(), format!("writing the segment's buffered batches: {error}"))),
        }
    }
}

/// A partition's batches for its next WAL record.
pub(crate) struct WalPending {
    pub(crate) path: Arc<str>,
    pub(crate) batches: PendingBatches,
    /// The offset after the last batch: durable once the record is.
    pub(crate) end_offset: i64,
    pub(crate) generation: u64,
}

/// Batches appended under fsync-per-write and not yet handed to the syncer: the payload of
/// the partition's next WAL record, kept where the bytes already lie. Each batch is its
/// rewritten header (copied into `heads`) and the rest as it arrived (a slice of the produce
/// request, of the replica fetch or of the marker), so a batch is copied once on its way to
/// the WAL, into the WAL's write buffer. The slices hold their request's buffer until the
/// round that logs them, which the request waits for (its memory stays charged meanwhile).
#[derive(Default)]
pub(crate) struct PendingBatches {
    heads: Vec<u8>,
    /// (the batch's header in `heads`, the rest of the batch) in log order.
    batches: Vec<(std::ops::Range<usize>, Bytes)>,
    /// The offset after the last batch; `None` when there are none.
    end_offset: Option<i64>,
}

impl PendingBatches {
    fn push(&mut self, head: &[u8], rest: Bytes, end_offset: i64) {
        assert!(self.end_offset.is_none_or(|end| end < end_offset), "pending batches are in log order");
        let start = self.heads.len();
        self.heads.extend_from_slice(head);
        self.batches.push((start..self.heads.len(), rest));
        self.end_offset = Some(end_offset);
    }

    fn clear(&mut self) {
        *self = Self::default();
    }

    /// How many batches are pending.
    pub(crate) fn len(&self) -> usize {
        self.batches.len()
    }

    /// The payload in the order it is logged: each batch's header, then its rest.
    pub(crate) fn parts(&self) -> impl Iterator<Item = &[u8]> + Clone {
        self.batches.iter().flat_map(|(head, rest)| [&self.heads[head.clone()], &rest[..]])
    }
}

impl Partition {
    /// Validates and appends one batch (as sent by the client) at the log end.
    pub fn append(&self, batch: &Bytes, leader_epoch: i32, now_ms: i64) -> Result<AppendOutcome, AppendError> {
        let header = batch::validate_batch(batch)?;
        // A compacted topic's records must have keys (Kafka decompresses to check too). The
        // decoding runs before the partition lock, so other appends, fetches and the fsync
        // round never wait for it. A config change in between is harmless: the cleaner
        // drops keyless records.
        if self.compacted.load(Ordering::Acquire) {
            let keyless = crate::records::keyless_records(&header, batch)
                .map_err(|_| AppendError::InvalidRecord("records do not decode"))?;
            if !keyless.is_empty() {
                return Err(AppendError::KeylessRecords(keyless));
            }
        }
        let mut state = self.lock_for_append();
        if state.failed || state.retired {
            return Err(AppendError::Offline);
        }
        if batch.len() > state.config.max_message_bytes {
            return Err(AppendError::TooLarge { size: batch.len(), limit: state.config.max_message_bytes });
        }
        if header.is_control() {
            return Err(AppendError::InvalidRecord("control batches are written by the broker only"));
        }
        if header.is_transactional() && !header.has_producer_id() {
            return Err(AppendError::InvalidRecord("a transactional batch needs a producer id"));
        }
        if header.record_count == 0 {
            return Err(AppendError::InvalidRecord("empty batch"));
        }
        if !state.config.log_append_time {
            check_timestamps(&header, &state.config, now_ms)?;
        }
        match state.producers.check(&header) {
            SequenceCheck::Append => {}
            SequenceCheck::Duplicate { base_offset } => {
                // The retry is answered once the whole original batch is visible, as the
                // original would have been.
                return Ok(AppendOutcome {
                    base_offset,
                    log_start_offset: state.log_start_offset,
                    visible_at: base_offset + i64::from(header.last_offset_delta) + 1,
                    needs_sync: false,
                    duplicate: true,
                    log_append_time_ms: None,
                });
            }
            SequenceCheck::OutOfOrder => return Err(AppendError::OutOfOrderSequence),
            SequenceCheck::StaleEpoch => return Err(AppendError::StaleProducerEpoch),
        }
        let base_offset = state.log_end_offset;
        let mut header = header;
        header.base_offset = base_offset;
        header.partition_leader_epoch = leader_epoch;
        let log_append_time_ms = state.config.log_append_time.then_some(now_ms);
        let fsync = match log_append_time_ms {
            None => {
                let prefix = batch::patched_prefix(batch, base_offset, leader_epoch);
                self.append_at_end(&mut state, &prefix, batch.slice(16..), &header, now_ms)?
            }
            Some(append_time) => {
                let stamped = batch::log_append_time_header(batch, base_offset, leader_epoch, append_time);
                let header = BatchHeader::parse(&stamped).expect("a stamped header parses");
                let rest = batch.slice(batch::BATCH_HEADER_BYTES..);
                self.append_at_end(&mut state, &stamped, rest, &header, now_ms)?
            }
        };
        let end_offset = state.log_end_offset;
        Ok(AppendOutcome {
            base_offset,
            log_start_offset: state.log_start_offset,
            visible_at: end_offset,
            needs_sync: fsync,
            duplicate: false,
            log_append_time_ms,
        })
    }

    /// Takes the log's lock for an append. A partition idle for long gave its active
    /// segment's file back (`release_file_if_idle`); the file is reopened first, without the
    /// lock, so the appends, fetches and fsync rounds of this partition never wait for an
    /// `open`. (Closed again by the budget meanwhile, rarely, the append reopens it under the
    /// lock, as it would have.)
    fn lock_for_append(&self) -> parking_lot::MutexGuard<'_, LogState> {
        let state = self.state.lock();
        let Some((slot, path)) = state.segments.values().next_back().and_then(Segment::closed_file_slot) else {
            return state;
        };
        drop(state);
        // An error (the file gone) is met again, and handled, by the append's own open.
        let _ = slot.open(&path);
        self.state.lock()
    }

    /// Appends batches fetched from the leader, stored byte for byte (their offsets and
    /// leader epochs are already in their headers). They must follow this log's end, with
    /// a gap where the leader's log was compacted.
    pub fn append_replica(&self, batches: &Bytes, now_ms: i64) -> Result<ReplicaAppend, AppendError> {
        let mut state = self.lock_for_append();
        if state.failed {
            return Err(AppendError::Offline);
        }
        let mut needs_sync = false;
        for item in BatchIter::new(batches) {
            let (_, range) = item?;
            let bytes = batches.slice(range);
            let header = batch::validate_stored_batch(&bytes)?;
            if header.last_offset() < state.log_end_offset {
                continue;
            }
            if header.base_offset < state.log_end_offset && self.is_empty_at_start(&state) {
                // Just reset to the leader's log start, which lies inside this batch:
                // the log takes the whole batch and keeps its start offset, as Kafka does.
                self.rebase_empty(&mut state, header.base_offset)?;
            }
            // A compacted leader log has gaps: a batch may start past this log's end.
            if header.base_offset < state.log_end_offset {
                return Err(AppendError::InvalidRecord("replicated batch overlaps the log"));
            }
            // A copied abort marker is indexed as the leader indexed it, before it is
            // appended: a follower that becomes leader names it to read_committed fetches.
            if header.is_control() && header.has_producer_id() {
                let commits = crate::records::marker_commits(&header, &bytes)
                    .map_err(|_| AppendError::InvalidRecord("unreadable transaction marker"))?;
                if commits == Some(false) {
                    self.record_abort(&mut state, header.producer_id, header.base_offset)?;
                }
            }
            needs_sync |= self.append_at_end(&mut state, &bytes[..16], bytes.slice(16..), &header, now_ms)?;
        }
        Ok(ReplicaAppend { log_end_offset: state.log_end_offset, needs_sync })
    }

    /// True when the log holds no batch at all (one empty segment).
    fn is_empty_at_start(&self, state: &LogState) -> bool {
        state.segments.len() == 1 && state.segments.values().all(|s| s.is_empty())
    }

    /// Moves an empty log's only segment back to `base` (below the log start offset, which
    /// stays): the first batch a reset follower fetches may begin before the leader's log start.
    fn rebase_empty(&self, state: &mut LogState, base: i64) -> io::Result<()> {
        assert!(self.is_empty_at_start(state) && base < state.log_end_offset);
        let segment = Segment::create(&self.dir, base)?;
        let (_, old) = state.segments.pop_first().expect("one segment");
        old.delete_files()?;
        state.segments.insert(base, segment);
        state.log_end_offset = base;
        state.local_end = state.local_end.min(base);
        state.high_watermark = state.high_watermark.min(base);
        Ok(())
    }

    /// Writes one batch whose header is final at the log end and does the bookkeeping.
    /// Returns true when the batch waits for an fsync to become locally durable.
    fn append_at_end(
        &self,
        state: &mut LogState,
        prefix: &[u8],
        rest: Bytes,
        header: &BatchHeader,
        now_ms: i64,
    ) -> Result<bool, AppendError> {
        self.roll_if_needed(state, header, now_ms)?;
        // A new epoch is written (fsynced) before this part of the log is trusted at open,
        // not here on the append path: until then a restart finds it again in the batches.
        if note_leader_epoch(&mut state.epochs, header) {
            state.epochs_unwritten = true;
        }
        let segment_bytes = state.config.segment_bytes;
        // Batches an fsync round makes durable go to the segment's tail in memory, written
        // to the file later; page-cache topics promise the page cache at the acknowledgement.
        let fsync = state.config.fsync_before_ack();
        let segment = state.segments.values_mut().next_back().expect("active segment");
        segment.append(prefix, &rest, header, now_ms, segment_bytes, fsync)?;
        state.producers.record(header);
        assert!(header.last_offset() >= state.log_end_offset, "an append moves the log end forward");
        state.log_end_offset = header.last_offset() + 1;
        if fsync {
            let end_offset = state.log_end_offset;
            state.wal_pending.push(prefix, rest, end_offset);
        } else {
            state.local_end = state.log_end_offset;
            if !state.replicated {
                state.high_watermark = state.local_end;
            }
            state.unflushed_messages += header.record_count as u64;
            state.oldest_unflushed_ms.get_or_insert(now_ms);
            self.publish(state);
        }
        Ok(fsync)
    }

    fn roll_if_needed(&self, state: &mut LogState, header: &BatchHeader, now_ms: i64) -> io::Result<()> {
        let config = &state.config;
        let active = state.segments.values().next_back().expect("active segment");
        let too_old = active.first_append_ms().is_some_and(|first| now_ms - first >= config.segment_ms);
        let full = active.is_full_for(header.total_bytes() as u64, header.last_offset(), config.segment_bytes);
        if !(full || (too_old && !active.is_empty())) {
            return Ok(());
        }
        let new_base = state.log_end_offset;
        // Seal (fsync) the old segment before the new file exists: recovery takes the last
        // segment's base as the least log end, so a new segment must never be durable while
        // batches before it are only in the WAL. If creating the new file fails (disk
        // full), the sealed segment stays active and takes appends again.
        write_leader_epochs_if_unwritten(&self.dir, state).map_err(|e| self.fail_if_fsync(state, e))?;
        let active = state.segments.values_mut().next_back().expect("active segment");
        active.seal(false).map_err(|e| self.fail_if_fsync(state, e))?;
        let segment = Segment::create(&self.dir, new_base).map_err(|e| self.fail_if_fsync(state, e))?;
        // Everything in the sealed segment is now durable.
        if state.local_end < new_base {
            state.local_end = new_base;
            if !state.replicated {
                state.high_watermark = new_base;
            }
            self.publish(state);
        }
        state.segments.insert(new_base, segment);
        write_snapshot(&self.dir, new_base, &state.producers).map_err(|e| self.fail_if_fsync(state, e))?;
        Ok(())
    }

    /// Writes the marker that commits or aborts `producer_id`'s transaction in this
    /// partition (on a leader; the transaction coordinator calls it). An abort is
    /// recorded in the aborted-transactions file, fsynced, before its marker is appended,
    /// so `read_committed` readers can never take aborted records for committed ones.
    /// The caller waits for the high watermark to reach `visible_at`, as for a produce.
    pub fn append_marker(
        &self,
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
        coordinator_epoch: i32,
        leader_epoch: i32,
        now_ms: i64,
    ) -> Result<AppendOutcome, AppendError> {
        let mut state = self.lock_for_append();
        if state.failed {
            return Err(AppendError::Offline);
        }
        if state.producers.epoch(producer_id).is_some_and(|current| current > producer_epoch) {
            return Err(AppendError::StaleProducerEpoch);
        }
        let base_offset = state.log_end_offset;
        if !commit {
            self.record_abort(&mut state, producer_id, base_offset)?;
        }
        let marker = batch::transaction_marker(
            base_offset,
            leader_epoch,
            producer_id,
            producer_epoch,
            commit,
            coordinator_epoch,
            now_ms,
        );
        let header = BatchHeader::parse(&marker).expect("a marker parses");
        let marker = Bytes::from(marker);
        let fsync = self.append_at_end(&mut state, &marker[..16], marker.slice(16..), &header, now_ms)?;
        Ok(AppendOutcome {
            base_offset,
            log_start_offset: state.log_start_offset,
            visible_at: state.log_end_offset,
            needs_sync: fsync,
            duplicate: false,
            log_append_time_ms: None,
        })
    }

    /// Records that `producer_id`'s open transaction is aborted by a marker at
    /// `marker_offset` (leader and follower alike), durably, before the marker is appended.
    /// Nothing to record when the producer has no open transaction here.
    fn record_abort(&self, state: &mut LogState, producer_id: i64, marker_offset: i64) -> io::Result<()> {
        let Some(first_offset) = state.producers.open_transaction(producer_id) else { return Ok(()) };
        assert!(first_offset < marker_offset, "an open transaction starts before its marker");
        let aborted = AbortedTransaction { producer_id, first_offset, last_offset: marker_offset };
        let log_start = state.log_start_offset;
        state.aborted.retain(|a| a.last_offset >= log_start && a.last_offset < marker_offset);
        state.aborted.push(aborted);
        let body = serde_json::to_vec(&state.aborted).map_err(io::Error::other)?;
        crate::write_file_atomically(&self.dir.join(ABORTED_TRANSACTIONS_FILE), &body)
    }

    /// Captures what an fsync issued now would make durable. Called by the syncer.
    pub(crate) fn sync_target(&self) -> SyncTarget {
        let mut state = self.state.lock();
        // The file's fsync covers whatever waited for a WAL record too.
        state.wal_pending.clear();
        let active = state.segments.values_mut().next_back().expect("active segment");
        let file = active.flushed_file();
        SyncTarget { file, end_offset: state.log_end_offset, generation: state.sync_generation }
    }

    /// Hands the batches appended since the last call to the WAL thread (`None` when there
    /// are none, or the partition is offline or deleted).
    pub(crate) fn take_wal_pending(&self) -> Option<WalPending> {
        let mut state = self.state.lock();
        let end_offset = state.wal_pending.end_offset?;
        let batches = std::mem::take(&mut state.wal_pending);
        if state.failed || state.retired {
            return None;
        }
        let path = self.wal.get().expect("a partition is linked to the WAL before it is queued").path.clone();
        Some(WalPending { path, batches, end_offset, generation: state.sync_generation })
    }

    /// Links the partition to the WAL it logs into (once).
    pub(crate) fn link_wal(&self, link: impl FnOnce() -> WalLink) {
        self.wal.get_or_init(link);
    }

    /// The WAL's steady writeback, without the log's lock: writes the active segment's tail
    /// pages that are due (direct I/O, `segment_tail.rs`), and starts the disk writes of what
    /// its file took through the page cache since the last call and waits for them
    /// ([`crate::wal::write_back`]), so the checkpoint finds little left to write. Not a
    /// durability step (the WAL holds these bytes until the checkpoint's `fdatasync`); a
    /// failure is left to the checkpoint. `all_pages`: see `Segment::claim_writeback`.
    pub(crate) fn write_back(&self, all_pages: bool) {
        let (range, pages) = {
            let mut state = self.state.lock();
            if state.failed || state.retired {
                return;
            }
            state.segments.values_mut().next_back().expect("active segment").claim_writeback(all_pages)
        };
        if let Some(pages) = pages {
            pages.write();
        }
        if let Some((file, from, to)) = range {
            crate::wal::write_back(&file, from, to);
        }
    }

    /// The WAL checkpoint: makes the segment files durable (everything the WAL held for
    /// this partition up to now). False when the fsync failed, which takes the log offline.
    ///
    /// When the active segment has grown enough, it also writes a recovery image: the
    /// index of what the fsync made durable and the producer state there, so a restart
    /// after a crash scans only the bytes appended since.
    pub(crate) fn sync_for_wal_checkpoint(&self) -> bool {
        // The tail's pages first, without the lock: producers wait for it meanwhile.
        self.write_back(true);
        let flushed = {
            let mut state = self.state.lock();
            if state.failed || state.retired {
                return !state.failed;
            }
            let active = state.segments.values_mut().next_back().expect("active segment");
            active.flushed_file().map(|file| (file, recovery_image_due(&state).then(|| capture_recovery_image(&state))))
        };
        match flushed.and_then(|(active, image)| crate::durable::sync_data(&active).map(|()| image)) {
            Ok(image) => {
                if let Some(image) = image {
                    if let Err(error) = self.write_recovery_image(image) {
                        // Only a longer scan at the next start.
                        tracing::warn!(dir = %self.dir.display(), %error, "could not write a recovery image");
                    }
                }
                true
            }
            Err(error) => {
                let mut state = self.state.lock();
                self.fail(&mut state, "fdatasync (WAL checkpoint)", &error);
                self.publish(&state);
                false
            }
        }
    }

    /// Deleted: refuses appends and logs nothing more, then logs [`Control::Forget`] so the
    /// WAL never replays this partition's records into a later one of the same name.
    pub(crate) fn retire(&self) -> io::Result<()> {
        {
            let mut state = self.state.lock();
            state.retired = true;
            state.wal_pending.clear();
            state.sync_generation += 1;
        }
        match self.wal.get() {
            Some(link) => link.log(Control::Forget),
            None => Ok(()),
        }
    }

    /// Advances the high watermark after an fsync (of the segment, or of the WAL record)
    /// covering everything up to `end_offset` finished with `result`. Called by the syncer,
    /// which notifies `signals` once the round's partitions are all published.
    /// A sync captured before the log was cut (`generation`) moves nothing.
    pub(crate) fn finish_sync(
        &self,
        end_offset: i64,
        generation: u64,
        result: &io::Result<()>,
        signals: &mut TopicSignals,
    ) {
        let mut state = self.state.lock();
        match result {
            Ok(()) if generation != state.sync_generation => return,
            Ok(()) => {
                assert!(end_offset <= state.log_end_offset, "a sync covers only appended batches");
                if end_offset > state.local_end {
                    state.local_end = end_offset;
                    if !state.replicated {
                        state.high_watermark = end_offset;
                    }
                }
                if end_offset >= state.log_end_offset {
                    state.unflushed_messages = 0;
                    state.oldest_unflushed_ms = None;
                }
            }
            Err(error) => self.fail(&mut state, "fdatasync", error),
        }
        self.publish_deferring(&state, signals);
    }

    /// In page-cache mode, true when `flush.messages` or `flush.ms` asks for an fsync now.
    pub fn flush_due(&self, now_ms: i64) -> bool {
        let state = self.state.lock();
        if state.config.fsync_before_ack() || state.unflushed_messages == 0 {
            return false;
        }
        state.unflushed_messages >= state.config.flush_messages
            || state.oldest_unflushed_ms.is_some_and(|t| now_ms - t >= state.config.flush_ms)
    }
}

/// Kafka's `message.timestamp.{before,after}.max.ms` checks (CreateTime), on the batch
/// header (records are not decoded): its first timestamp must not be too old, its max
/// timestamp not too far in the future.
fn check_timestamps(header: &BatchHeader, config: &LogConfig, now_ms: i64) -> Result<(), AppendError> {
    let earliest_ms = now_ms.saturating_sub(config.timestamp_before_max_ms);
    let latest_ms = now_ms.saturating_add(config.timestamp_after_max_ms);
    for timestamp in [header.max_timestamp, header.base_timestamp] {
        if timestamp < earliest_ms || timestamp > latest_ms {
            return Err(AppendError::InvalidTimestamp { timestamp, earliest_ms, latest_ms });
        }
    }
    Ok(())
}

#[cfg(test)]
mod finish_sync_tests {
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Waker};

    use super::*;
    use crate::batch::tests::make_batch;

    #[test]
    fn a_round_wakes_its_acknowledgements_before_the_fetches_waiting_on_the_topic() {
        let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
        let signal = Arc::new(tokio::sync::Notify::new());
        let partitions: Vec<_> = dirs
            .iter()
            .map(|dir| {
                let partition = Partition::open(dir.path(), LogConfig::default()).unwrap();
                partition.set_signal(signal.clone());
                partition.append(&Bytes::from(make_batch(3, 10, None)), 0, 0).unwrap();
                partition
            })
            .collect();
        let mut acks: Vec<_> = partitions.iter().map(|p| p.subscribe()).collect();
        let mut fetch = pin!(signal.notified());
        fetch.as_mut().enable();
        let mut cx = Context::from_waker(Waker::noop());

        let mut signals = TopicSignals::default();
        for (partition, ack) in partitions.iter().zip(&mut acks) {
            let target = partition.sync_target();
            partition.finish_sync(target.end_offset, target.generation, &Ok(()), &mut signals);
            assert!(ack.has_changed().unwrap(), "the acknowledgement is woken at once");
            assert_eq!(ack.borrow_and_update().high_watermark, 3);
            assert!(fetch.as_mut().poll(&mut cx).is_pending(), "the fetch waits for the whole round");
        }
        signals.notify();
        assert!(fetch.as_mut().poll(&mut cx).is_ready(), "the fetch wakes once the round is published");
        // The fetch finds every partition of the round readable.
        assert!(partitions.iter().all(|p| p.offsets().high_watermark == 3));
    }
}
