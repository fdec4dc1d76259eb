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
//! the aborted-transactions file before an abort marker. A roll's disk work is done later,
//! off the append path ([`Partition::complete_roll`], on the WAL's checkpointer thread): the
//! leader-epoch file, the sealed segment (before the new segment's file has its name), the
//! new file's name and directory entry; meanwhile the new segment's file, created by the
//! append under a temporary name, holds its batches, and the WAL holds them too (recovery
//! deletes such a file and replays them). Whatever needs every segment's file (a
//! checkpoint, a cut, a close) finishes the roll first ([`Partition::lock_settled`]); a
//! page-cache topic's roll is done in its append. A crash at any point leaves a prefix of the appended batches (recovery
//! cuts a torn tail, the WAL replays what it logged): never less than the high watermark
//! covered. A failed fsync takes the log offline.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;

use super::recovery::{
    capture_recovery_image, note_leader_epoch, recovery_image_due, write_leader_epochs, write_snapshot, SnapshotFiles,
};
use super::wal_link::{Control, WalLink};
use super::{
    AbortedTransaction, AppendError, AppendOutcome, LogConfig, LogState, Partition, ReplicaAppend, TopicSignals,
    ABORTED_TRANSACTIONS_FILE,
};
use crate::batch::{self, BatchHeader, BatchIter};
use crate::producer_state::{ProducerStateTable, SequenceCheck};
use crate::segment::{is_roll_in_progress, RollInProgress, Sealing, Segment};

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

/// How a partition's part of a WAL checkpoint ended ([`Partition::sync_for_wal_checkpoint`]),
/// ordered from best to worst (a file's checkpoint ends as its worst partition's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum CheckpointSync {
    /// Its segment files hold everything the WAL held for it (or it was deleted).
    Synced,
    /// Not now (a roll that could not complete): the WAL files stay, to try again.
    Retry,
    /// An fsync failed: the log is offline, and the WAL files stay until a restart.
    Offline,
}

/// A partition's batches for its next WAL record.
pub(crate) struct WalPending {
    pub(crate) path: Arc<str>,
    pub(crate) batches: PendingBatches,
    /// The offset after the last batch: durable once the record is.
    pub(crate) end_offset: i64,
    pub(crate) generation: u64,
    /// A roll started since the last record: the WAL thread hands it to the checkpointer
    /// thread ([`Partition::complete_roll`]).
    pub(crate) roll_due: bool,
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

/// A roll whose disk work is still to do (see [`Partition::complete_roll`]): the segment
/// at `sealing_base` is to be sealed, and the file of the new one at `new_base`, which
/// already takes appends (under its temporary name, [`Segment::create_rolling`]), named.
pub(crate) struct PendingRoll {
    sealing_base: i64,
    new_base: i64,
    /// The producer state at `new_base`, for the snapshot the roll writes there.
    producers: ProducerStateTable,
    /// Handed to the WAL's checkpointer thread (once).
    queued: bool,
}

/// The base of the first segment that is not sealed: the one a roll in progress seals,
/// else the active one. Only segments before it are whole in their files (the cleaner,
/// retention and the tiering layer take no other).
pub(super) fn first_unsealed_base(state: &LogState) -> i64 {
    match &state.roll {
        Some(roll) => roll.sealing_base,
        None => *state.segments.keys().next_back().expect("active segment"),
    }
}

/// A roll's disk work, captured under the log's lock and done without it.
struct RollWork {
    dir: std::path::PathBuf,
    new_base: i64,
    sealing: Sealing,
    /// The leader epochs to write first, when appends noted some the file lacks.
    epochs: Option<Vec<(i32, i64)>>,
    producers: ProducerStateTable,
}

impl RollWork {
    /// In the order a crash needs: the leader epochs, then the sealed segment (fsynced
    /// before the new file has its name: recovery takes the last segment's base as the
    /// least log end, so a new segment must never be found while batches before it are
    /// only in the WAL), then the new file's name and its directory entry, then the
    /// producer snapshot. Returns whether the leader epochs were written.
    ///
    /// Only a failed fsync or rename fails it: the leader-epoch file, the index and the
    /// snapshot only shorten recovery, so a full disk that refuses them does not hold the
    /// roll back (without the epochs written, the sealed segment gets no index, so
    /// recovery scans it and finds its epochs in its batches).
    fn run(&self, snapshots: &SnapshotFiles) -> io::Result<bool> {
        let epochs_written = match &self.epochs {
            None => true,
            Some(epochs) => write_leader_epochs(&self.dir, epochs)
                .inspect_err(|error| {
                    tracing::warn!(dir = %self.dir.display(), %error, "could not write the leader-epoch file");
                })
                .is_ok(),
        };
        self.sealing.run(epochs_written)?;
        let (rolling, named) = Segment::rolled_path(&self.dir, self.new_base);
        match std::fs::rename(&rolling, &named) {
            // Renamed by an attempt that failed after it (its directory fsync).
            Err(error) if error.kind() == io::ErrorKind::NotFound && named.exists() => {}
            renamed => renamed?,
        }
        // The name must be durable before the checkpoint drops the WAL's copy of its
        // batches, or a per-file fsync acknowledges them.
        crate::durable::sync_dir(&self.dir)?;
        if let Err(error) = write_snapshot(&self.dir, self.new_base, &self.producers, snapshots) {
            // Only a longer replay at the next start.
            tracing::warn!(dir = %self.dir.display(), %error, "could not write a producer snapshot");
        }
        Ok(epochs_written)
    }
}

impl Partition {
    /// Validates and appends one batch (as sent by the client) at the log end.
    pub fn append(&self, batch: &Bytes, leader_epoch: i32, now_ms: i64) -> Result<AppendOutcome, AppendError> {
        self.after_rolls(|| self.append_once(batch, leader_epoch, now_ms))
    }

    /// As [`Partition::append`], but a roll the batch must wait for (see
    /// [`Partition::after_rolls`]) is finished inside `waiting`: the broker's request
    /// threads pass tokio's `block_in_place`, so their other connections go on meanwhile.
    pub fn append_waiting_in(
        &self,
        batch: &Bytes,
        leader_epoch: i32,
        now_ms: i64,
        waiting: impl Fn(&mut dyn FnMut() -> io::Result<bool>) -> io::Result<bool>,
    ) -> Result<AppendOutcome, AppendError> {
        self.after_rolls_in(|| self.append_once(batch, leader_epoch, now_ms), waiting)
    }

    /// Runs `attempt` (an append under the log's lock) again after finishing the roll in
    /// progress, for as long as it needs that roll finished: its batch found the new
    /// segment full already ([`RollInProgress`]). An attempt that stops so has changed
    /// nothing that a second one does not redo the same way. A roll that cannot finish (the
    /// log went offline or was deleted) ends the append.
    fn after_rolls<T>(&self, attempt: impl FnMut() -> Result<T, AppendError>) -> Result<T, AppendError> {
        self.after_rolls_in(attempt, |roll| roll())
    }

    /// [`Partition::after_rolls`], finishing each roll inside `waiting`.
    fn after_rolls_in<T>(
        &self,
        mut attempt: impl FnMut() -> Result<T, AppendError>,
        waiting: impl Fn(&mut dyn FnMut() -> io::Result<bool>) -> io::Result<bool>,
    ) -> Result<T, AppendError> {
        loop {
            match attempt() {
                Err(AppendError::Storage(error)) if is_roll_in_progress(&error) => {
                    if !waiting(&mut || self.complete_roll())? {
                        return Err(AppendError::Offline);
                    }
                }
                result => return result,
            }
        }
    }

    fn append_once(&self, batch: &Bytes, leader_epoch: i32, now_ms: i64) -> Result<AppendOutcome, AppendError> {
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
        // A second attempt skips the batches the first appended.
        self.after_rolls(|| self.append_replica_once(batches, now_ms))
    }

    fn append_replica_once(&self, batches: &Bytes, now_ms: i64) -> Result<ReplicaAppend, AppendError> {
        let mut state = self.lock_for_append();
        if state.failed || state.retired {
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

    /// Starts a roll when the batch does not fit the active segment (or the segment is
    /// older than `segment.ms`): the new segment's file is created under a temporary name
    /// ([`Segment::create_rolling`]; no fsync) and takes appends at once, and the rest of
    /// the disk work (sealing the old segment, naming the new file, the producer snapshot)
    /// is left to [`Partition::complete_roll`] on the WAL's checkpointer thread: an append
    /// never waits for an fsync, and neither do the WAL rounds that take this log's lock.
    /// A full disk fails the creation here, so the batch is refused, as it is when its
    /// space cannot be allocated. A topic that acknowledges from the page cache needs the
    /// file named before it acknowledges, so its roll is completed here. When the segment a
    /// roll opened is full before that roll completed, the append fails with
    /// [`RollInProgress`] and is retried once the roll is done ([`Partition::after_rolls`]).
    fn roll_if_needed(&self, state: &mut LogState, header: &BatchHeader, now_ms: i64) -> io::Result<()> {
        let config = &state.config;
        let active = state.segments.values().next_back().expect("active segment");
        let too_old = active.first_append_ms().is_some_and(|first| now_ms - first >= config.segment_ms);
        let full = active.is_full_for(header.total_bytes() as u64, header.last_offset(), config.segment_bytes);
        if !(full || (too_old && !active.is_empty())) {
            return Ok(());
        }
        if state.roll.is_some() {
            return Err(io::Error::other(RollInProgress));
        }
        let sealing_base = active.base_offset();
        let new_base = state.log_end_offset;
        state.segments.insert(new_base, Segment::create_rolling(&self.dir, new_base)?);
        let producers = state.producers.clone();
        state.roll = Some(PendingRoll { sealing_base, new_base, producers, queued: false });
        if !state.config.fsync_before_ack() {
            let work = self.capture_roll(state)?;
            let done = work.run(&self.snapshots);
            self.install_roll(state, &work, done)?;
        }
        Ok(())
    }

    /// Does the disk work of the roll in progress, if any, mostly without the log's lock
    /// (see [`RollWork::run`]); called by the WAL's checkpointer thread, and by whatever
    /// must wait for it ([`Partition::after_rolls`], [`Partition::lock_settled`]). Once it
    /// returns, every batch before the new segment is durable in the sealed one (the
    /// locally durable end moves there). A failed fsync takes the log offline; another
    /// error (a failed rename) leaves the roll to be tried again. False when a roll stays
    /// because the log is offline or deleted.
    pub(crate) fn complete_roll(&self) -> io::Result<bool> {
        let _one_at_a_time = self.roll_lock.lock();
        // The sealing segment's tail pages are written first, without the lock, like the
        // steady writeback's: under it, only its last page is left to write.
        let (range, pages) = {
            let mut state = self.state.lock();
            let Some(roll) = &state.roll else { return Ok(true) };
            if state.failed || state.retired {
                return Ok(false);
            }
            let sealing_base = roll.sealing_base;
            state.segments.get_mut(&sealing_base).expect("the sealing segment").claim_writeback(true)
        };
        if let Some(pages) = pages {
            pages.write();
        }
        if let Some((file, from, to)) = range {
            crate::page_cache::write_back(&file, from, to);
        }
        let work = {
            let mut state = self.state.lock();
            if state.failed || state.retired {
                return Ok(false);
            }
            self.capture_roll(&mut state)?
        };
        let done = work.run(&self.snapshots);
        let mut state = self.state.lock();
        self.install_roll(&mut state, &work, done)?;
        Ok(true)
    }

    /// The roll's disk work as of now (the sealing segment's last bytes written to its file).
    fn capture_roll(&self, state: &mut LogState) -> io::Result<RollWork> {
        let roll = state.roll.as_ref().expect("a roll in progress");
        let (sealing_base, new_base, producers) = (roll.sealing_base, roll.new_base, roll.producers.clone());
        let sealing = state.segments.get_mut(&sealing_base).expect("the sealing segment").prepare_seal();
        let sealing = sealing.map_err(|error| self.fail_if_fsync(state, error))?;
        let epochs = state.epochs_unwritten.then(|| state.epochs.clone());
        Ok(RollWork { dir: self.dir.clone(), new_base, sealing, epochs, producers })
    }

    /// Ends the roll whose disk work `work` did (`done`): the sealed segment is read from
    /// its file, the new one is found under its name, and the batches before it are durable.
    fn install_roll(&self, state: &mut LogState, work: &RollWork, done: io::Result<bool>) -> io::Result<()> {
        let epochs_written = done.map_err(|error| self.fail_if_fsync(state, error))?;
        let roll = state.roll.take().expect("a roll in progress");
        assert_eq!(roll.new_base, work.new_base, "one roll at a time; a cut or reset waits for it");
        state.segments.get_mut(&roll.new_base).expect("the new segment").name_rolled(&self.dir);
        if epochs_written && work.epochs.as_ref() == Some(&state.epochs) {
            state.epochs_unwritten = false;
        }
        state.segments.get_mut(&roll.sealing_base).expect("the sealing segment").finish_seal();
        if state.local_end < roll.new_base {
            state.local_end = roll.new_base;
            if !state.replicated {
                state.high_watermark = roll.new_base;
            }
            self.publish(state);
        }
        Ok(())
    }

    /// The log's lock, once no roll is in progress (finishing the one there is): for what
    /// needs every segment's file to hold its bytes (a checkpoint, a cut, a reset, a clean
    /// close, a timestamp scan). A failed or deleted log is returned as it is.
    pub(super) fn lock_settled(&self) -> io::Result<parking_lot::MutexGuard<'_, LogState>> {
        loop {
            self.complete_roll()?;
            let state = self.state.lock();
            if state.roll.is_none() || state.failed || state.retired {
                return Ok(state);
            }
        }
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
        // A second attempt records the same abort again, in place of the first.
        self.after_rolls(|| {
            self.append_marker_once(producer_id, producer_epoch, commit, coordinator_epoch, leader_epoch, now_ms)
        })
    }

    fn append_marker_once(
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
        let mut state = match self.lock_settled() {
            Ok(state) => state,
            Err(error) => {
                let state = self.state.lock();
                let (end_offset, generation) = (state.log_end_offset, state.sync_generation);
                return SyncTarget { file: Err(error), end_offset, generation };
            }
        };
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
        let roll_due = state.roll.as_mut().is_some_and(|roll| !std::mem::replace(&mut roll.queued, true));
        Some(WalPending { path, batches, end_offset, generation: state.sync_generation, roll_due })
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
            crate::page_cache::write_back(&file, from, to);
        }
    }

    /// The WAL checkpoint: makes the segment files durable (everything the WAL held for
    /// this partition up to now). A failed fsync takes the log offline; a roll that cannot
    /// complete for another reason (see [`Partition::complete_roll`]) leaves the log as it
    /// is, and the WAL's copy is needed until a later try succeeds.
    ///
    /// When the active segment has grown enough, it also writes a recovery image: the
    /// index of what the fsync made durable and the producer state there, so a restart
    /// after a crash scans only the bytes appended since.
    ///
    /// `report`: a roll that cannot complete is logged at warn level (else at debug; the
    /// checkpointer reports a retried checkpoint once a minute).
    pub(crate) fn sync_for_wal_checkpoint(&self, report: bool) -> CheckpointSync {
        // The tail's pages first, without the lock: producers wait for it meanwhile.
        self.write_back(true);
        let flushed = {
            let mut state = match self.lock_settled() {
                Ok(state) => state,
                Err(error) if self.state.lock().failed => {
                    tracing::debug!(dir = %self.dir.display(), %error, "roll failed at a WAL checkpoint");
                    return CheckpointSync::Offline;
                }
                Err(error) => {
                    if report {
                        tracing::warn!(dir = %self.dir.display(), %error, "could not finish a segment roll for a WAL checkpoint; trying again later");
                    } else {
                        tracing::debug!(dir = %self.dir.display(), %error, "could not finish a segment roll for a WAL checkpoint");
                    }
                    return CheckpointSync::Retry;
                }
            };
            if state.failed {
                return CheckpointSync::Offline;
            }
            if state.retired {
                return CheckpointSync::Synced;
            }
            let active = state.segments.values_mut().next_back().expect("active segment");
            active
                .flushed_file()
                .map(|file| (file, recovery_image_due(&state, crate::now_ms()).then(|| capture_recovery_image(&state))))
        };
        match flushed.and_then(|(active, image)| crate::durable::sync_data(&active).map(|()| image)) {
            Ok(image) => {
                if let Some(image) = image {
                    if let Err(error) = self.write_recovery_image(image) {
                        // Only a longer scan at the next start.
                        tracing::warn!(dir = %self.dir.display(), %error, "could not write a recovery image");
                    }
                }
                CheckpointSync::Synced
            }
            Err(error) => {
                let mut state = self.state.lock();
                self.fail(&mut state, "fdatasync (WAL checkpoint)", &error);
                self.publish(&state);
                CheckpointSync::Offline
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
            // Already offline when the fsync failed in the roll that `sync_target` finished.
            Err(_) if state.failed => {}
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

#[cfg(test)]
mod roll_tests {
    use super::*;
    use crate::batch::tests::make_batch;
    use crate::segment::{index_file_name, log_file_name, ReadMode};

    /// Batches of 3 records: a segment of `SEGMENT_BYTES` holds two.
    const SEGMENT_BYTES: u64 = 200;

    fn batch() -> Bytes {
        Bytes::from(make_batch(3, 10, None))
    }

    fn offsets_read(partition: &Partition, from: i64) -> Vec<i64> {
        let read = partition.read_until(from, 1 << 20, true, super::super::ReadLimit::LogEnd, ReadMode::MayBlock);
        BatchIter::new(&read.unwrap()).map(|item| item.unwrap().0.base_offset).collect()
    }

    #[test]
    fn an_append_that_rolls_leaves_the_disk_work_to_complete_roll_and_the_new_segment_takes_appends_meanwhile() {
        let dir = tempfile::tempdir().unwrap();
        let config = LogConfig { segment_bytes: SEGMENT_BYTES, ..LogConfig::default() };
        let partition = Partition::open(dir.path(), config).unwrap();
        let exists = |name: String| dir.path().join(name).exists();
        assert!(2 * batch().len() as u64 <= SEGMENT_BYTES && 3 * batch().len() as u64 > SEGMENT_BYTES);
        for _ in 0..2 {
            partition.append(&batch(), 0, 0).unwrap();
        }
        assert!(!exists(index_file_name(0)), "the first segment is active");

        // The third batch starts the roll: appended at once, into a file under a temporary
        // name, with no fsync.
        let third = partition.append(&batch(), 0, 0).unwrap();
        assert_eq!(third.base_offset, 6);
        let rolling = || format!("{}.rolling", log_file_name(6));
        assert!(exists(rolling()), "the new segment's file is created under a temporary name");
        assert!(!exists(log_file_name(6)), "and named by complete_roll");
        assert!(!exists(index_file_name(0)), "and so does the seal of the old one");
        assert_eq!(offsets_read(&partition, 0), [0, 3]);
        assert_eq!(offsets_read(&partition, 6), [6], "the new segment is read before its roll completes");
        assert_eq!(partition.progress().borrow().local_end, 0, "nothing is durable before an fsync or the roll");

        assert!(partition.complete_roll().unwrap(), "the roll finished");
        assert!(exists(log_file_name(6)) && exists(index_file_name(0)), "the roll is done");
        assert!(!exists(rolling()), "the temporary name is gone");
        assert!(exists(format!("{:020}.snapshot", 6)), "with the producer snapshot at its base");
        assert_eq!(partition.progress().borrow().local_end, 6, "the sealed segment is durable");
        assert_eq!(offsets_read(&partition, 0), [0, 3]);
        assert_eq!(offsets_read(&partition, 6), [6]);

        // The new segment fills: the fifth batch starts the next roll, and the sixth, which
        // finds that roll's segment full too, finishes it before it starts its own.
        partition.append(&batch(), 0, 0).unwrap();
        partition.append(&batch(), 0, 0).unwrap();
        assert!(!exists(log_file_name(12)));
        partition.append(&batch(), 0, 0).unwrap();
        partition.append(&batch(), 0, 0).unwrap();
        assert!(exists(log_file_name(12)) && exists(index_file_name(6)), "the sixth batch finished the roll at 12");
        assert!(!exists(log_file_name(18)), "and started the one at 18");
        assert_eq!(partition.offsets().log_end_offset, 21);

        // What needs every file settles the roll first: a clean close, then a reopen that
        // finds every batch in place.
        partition.close().unwrap();
        drop(partition);
        let reopened = Partition::open(dir.path(), LogConfig { segment_bytes: SEGMENT_BYTES, ..LogConfig::default() });
        let reopened = reopened.unwrap();
        assert_eq!(reopened.offsets().log_end_offset, 21);
        let mut read = Vec::new();
        let mut from = 0;
        while from < 21 {
            let found = offsets_read(&reopened, from);
            from = found.last().unwrap() + 3;
            read.extend(found);
        }
        assert_eq!(read, [0, 3, 6, 9, 12, 15, 18]);
    }

    #[test]
    fn a_deleted_log_with_a_roll_in_progress_refuses_appends_instead_of_waiting_for_the_roll() {
        let dir = tempfile::tempdir().unwrap();
        let partition = Partition::open(dir.path(), LogConfig { segment_bytes: SEGMENT_BYTES, ..LogConfig::default() });
        let partition = partition.unwrap();
        for _ in 0..3 {
            partition.append(&batch(), 0, 0).unwrap();
        }
        partition.retire().unwrap();
        assert!(!partition.complete_roll().unwrap(), "a deleted log's roll is left undone");
        assert!(matches!(partition.append(&batch(), 0, 0), Err(AppendError::Offline)));
        assert!(matches!(partition.append_replica(&batch(), 0), Err(AppendError::Offline)));
        assert!(!dir.path().join(log_file_name(6)).exists());
    }

    #[test]
    fn a_restart_removes_the_new_segment_of_a_roll_that_did_not_complete() {
        let dir = tempfile::tempdir().unwrap();
        let config = LogConfig { segment_bytes: SEGMENT_BYTES, ..LogConfig::default() };
        let partition = Partition::open(dir.path(), config.clone()).unwrap();
        for _ in 0..3 {
            partition.append(&batch(), 0, 0).unwrap();
        }
        let rolling = dir.path().join(format!("{}.rolling", log_file_name(6)));
        assert!(rolling.exists());
        // A crash: no close. Without the WAL, nothing was durable; with it, the WAL would
        // replay the batches, into segments recovery builds again.
        drop(partition);
        let reopened = Partition::open(dir.path(), config).unwrap();
        assert!(!rolling.exists(), "the unfinished roll's file is removed");
        assert!(!dir.path().join(log_file_name(6)).exists());
        assert!(reopened.offsets().log_end_offset <= 6, "the log ends in the segment before the roll");
        // The next roll at the same base is not refused because a file was left there.
        while reopened.offsets().log_end_offset < 9 {
            reopened.append(&batch(), 0, 0).unwrap();
        }
        reopened.close().unwrap();
    }

    #[test]
    fn a_roll_whose_index_cannot_be_written_completes_and_recovery_scans_the_segment() {
        let dir = tempfile::tempdir().unwrap();
        let config = LogConfig { segment_bytes: SEGMENT_BYTES, ..LogConfig::default() };
        let partition = Partition::open(dir.path(), config.clone()).unwrap();
        for _ in 0..3 {
            partition.append(&batch(), 0, 0).unwrap();
        }
        // Where the index goes, a directory: its write fails, as on a full disk.
        let index = dir.path().join(index_file_name(0));
        std::fs::create_dir(&index).unwrap();
        assert!(partition.complete_roll().unwrap(), "the roll completes without its index");
        assert!(dir.path().join(log_file_name(6)).exists());
        assert_eq!(partition.progress().borrow().local_end, 6, "the sealed segment is durable");
        partition.close().unwrap();
        drop(partition);
        std::fs::remove_dir(&index).unwrap();
        let reopened = Partition::open(dir.path(), config).unwrap();
        assert_eq!(reopened.offsets().log_end_offset, 9);
        assert_eq!(offsets_read(&reopened, 0), [0, 3], "the segment without an index is scanned");
        assert_eq!(offsets_read(&reopened, 6), [6]);
    }

    #[test]
    fn a_page_cache_topic_rolls_in_its_append() {
        let dir = tempfile::tempdir().unwrap();
        let config = LogConfig { segment_bytes: SEGMENT_BYTES, flush_messages: u64::MAX, ..LogConfig::default() };
        let partition = Partition::open(dir.path(), config).unwrap();
        for _ in 0..3 {
            partition.append(&batch(), 0, 0).unwrap();
        }
        assert!(dir.path().join(log_file_name(6)).exists(), "its acknowledgement promises the page cache");
        assert!(dir.path().join(index_file_name(0)).exists());
    }
}
