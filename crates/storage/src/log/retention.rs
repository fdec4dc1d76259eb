//! Retention: what leaves the log, at its head — segments past `retention.ms` or
//! `retention.bytes`, records below a DeleteRecords offset — and the hooks the cleaner
//! ([`crate::cleaner`]) compacts a log through.
//!
//! Why a module: this is the only code that removes data already committed, so its rules
//! live together: only sealed segments wholly below the high watermark go, never the
//! active one, and the log start offset only moves forward.
//!
//! Durability contract: [`Partition::delete_records_before`] writes and fsyncs the
//! log-start-offset file (atomically) before it moves the offset or deletes a segment: a
//! crash leaves the old start or the new one, and segments a crash brings back lie below
//! the durable start. [`Partition::apply_retention`] deletes whole segment files, then
//! fsyncs the directory before returning; a crash before that may bring the oldest segments
//! back (the log start moves back to them, and the next pass deletes them again), never
//! lose one it did not delete. A cleaned segment replaces its original by an atomic rename
//! made durable before it is used ([`crate::segment::Segment::move_into`]); a cleaned copy
//! without a batch instead removes its segment (not the first, not the active one): it
//! leaves the log's map, then its files are unlinked under the head lock, as retention's
//! are. The cleaner's checkpoint is written atomically and fsynced after the directory, so
//! a crash only means cleaning again.

use std::io;
use std::sync::Arc;

use super::append::first_unsealed_base;
use super::{
    last_stable_offset, AbortedTransaction, LogConfig, LogState, Partition, ReadError, CLEANER_CHECKPOINT_FILE,
    LOG_START_OFFSET_FILE,
};
use crate::segment::Segment;
use crate::segment_file::SegmentFile;

/// What a cleaning pass may work on, taken under the log's lock (see [`crate::cleaner`]).
pub(crate) struct CleaningPlan {
    /// Sealed, committed segments old enough to clean, oldest first.
    pub(crate) segments: Vec<CleanableSegment>,
    /// Segments from this base offset on are dirty (never cleaned).
    pub(crate) cleaned_up_to: i64,
    pub(crate) config: LogConfig,
    /// Aborted transactions: their records are dropped, never kept as a key's latest.
    pub(crate) aborted: Vec<AbortedTransaction>,
}

/// What [`Partition::install_cleaned`] did with a cleaned copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Installed {
    /// The copy took the original's place.
    Replaced,
    /// The copy held no batch: the original left the log and its files were deleted.
    Removed,
    /// The log changed under the cleaner: the copy was dropped, the log left as it was.
    Dropped,
}

pub(crate) struct CleanableSegment {
    pub(crate) base: i64,
    /// The next segment's base offset: this segment covers `[base, end)`.
    pub(crate) end: i64,
    /// The segment's file slot (its identity while the cleaner works) and path.
    slot: Arc<SegmentFile>,
    path: std::path::PathBuf,
    pub(crate) size: u64,
}

impl CleanableSegment {
    /// The segment's file, opened without the log's lock if the budget had closed it
    /// (`NotFound` when retention or a truncation removed it since the plan).
    pub(crate) fn file(&self) -> io::Result<Arc<std::fs::File>> {
        self.slot.open(&self.path)
    }
}

impl Partition {
    /// Moves the log start offset forward (DeleteRecords). `offset` must be <= the high
    /// watermark. The log-start file's write and fsyncs and the unlinks of the segments it
    /// lets go happen without the state's lock, which appends and fsync rounds take.
    pub fn delete_records_before(&self, offset: i64) -> Result<i64, ReadError> {
        let _head = self.head_lock.lock();
        {
            let state = self.state.lock();
            if offset < 0 || offset > state.high_watermark {
                return Err(ReadError::OffsetOutOfRange {
                    offset,
                    log_start_offset: state.log_start_offset,
                    log_end_offset: state.high_watermark,
                });
            }
            if offset <= state.log_start_offset {
                return Ok(state.log_start_offset);
            }
        }
        // Durable before the start moves: a crash leaves the old start or this one. Only a
        // cut below the high watermark moves it back meanwhile, and cuts wait for the head's
        // lock.
        crate::write_file_atomically(&self.dir.join(LOG_START_OFFSET_FILE), offset.to_string().as_bytes())?;
        let (log_start_offset, released) = {
            let mut state = self.state.lock();
            assert!(offset <= state.high_watermark, "the high watermark moved back under DeleteRecords");
            state.log_start_offset = state.log_start_offset.max(offset);
            let released = release_segments(&mut state, |segment, state_start| segment.next_offset() <= state_start);
            self.publish_offsets(&state);
            (state.log_start_offset, released)
        };
        delete_released(released);
        Ok(log_start_offset)
    }

    /// Applies `retention.ms` and `retention.bytes`. Returns the number of segments deleted.
    pub fn apply_retention(&self, now_ms: i64) -> usize {
        let _head = self.head_lock.lock();
        let released = self.release_expired_segments(now_ms);
        let deleted = released.len();
        delete_released(released);
        if deleted > 0 {
            // Deleted segments must stay deleted: a power loss that brought them back would
            // move the log start offset back.
            if let Err(error) = crate::durable::sync_dir(&self.dir) {
                tracing::warn!(dir = %self.dir.display(), %error, "fsync of the log directory after retention failed");
            }
        }
        deleted
    }

    /// Takes the segments past `retention.ms` or `retention.bytes` out of the log (their
    /// files are the caller's to delete, without the state's lock).
    fn release_expired_segments(&self, now_ms: i64) -> Vec<Segment> {
        let mut state = self.state.lock();
        if !state.config.cleanup_delete {
            return Vec::new();
        }
        // A tiered log keeps locally what is not yet in the remote tier, and applies its
        // local retention to the rest; the whole log's retention is the tiering layer's.
        let (retention_ms, retention_bytes, uploaded_end) = if state.config.remote_storage {
            let uploaded_end = state.remote_tier.map_or(i64::MIN, |(_, end)| end);
            (state.config.local_retention_ms, state.config.local_retention_bytes, uploaded_end)
        } else {
            (state.config.retention_ms, state.config.retention_bytes, i64::MAX)
        };
        let mut released = Vec::new();
        if retention_ms >= 0 {
            released = release_segments(&mut state, |segment, _| {
                segment.next_offset() <= uploaded_end && segment.max_timestamp() < now_ms - retention_ms
            });
        }
        if retention_bytes >= 0 {
            let mut total: u64 = state.segments.values().map(|s| s.size_bytes()).sum();
            released.extend(release_segments(&mut state, |segment, _| {
                let excess = segment.next_offset() <= uploaded_end
                    && total.saturating_sub(segment.size_bytes()) >= retention_bytes as u64;
                if excess {
                    total -= segment.size_bytes();
                }
                excess
            }));
        }
        if !released.is_empty() {
            self.publish_offsets(&state);
        }
        released
    }

    /// The cleaner's next pass over this log, if one is due: the log is compacted and its
    /// dirty share reached `min.cleanable.dirty.ratio`, or dirty data is older than
    /// `max.compaction.lag.ms`, or a kept tombstone's `delete.retention.ms` ran out. Only
    /// sealed segments wholly below the last stable offset and older than
    /// `min.compaction.lag.ms` are cleanable: the active segment is never touched.
    pub(crate) fn cleaning_plan(&self, now_ms: i64) -> Option<CleaningPlan> {
        let state = self.state.lock();
        let config = &state.config;
        if !config.cleanup_compact || state.failed {
            return None;
        }
        let bases: Vec<i64> = state.segments.keys().copied().collect();
        let mut segments = Vec::new();
        let (mut dirty_bytes, mut total_bytes, mut lag_due) = (0u64, 0u64, false);
        for (&base, &end) in bases.iter().zip(bases.iter().skip(1)) {
            let segment = &state.segments[&base];
            let too_young = config.min_compaction_lag_ms > 0
                && segment.max_timestamp() > now_ms.saturating_sub(config.min_compaction_lag_ms);
            // Never past the last stable offset: an open transaction may still abort.
            if end > last_stable_offset(&state) || too_young || base >= first_unsealed_base(&state) {
                break;
            }
            total_bytes += segment.size_bytes();
            if base >= state.cleaned_up_to {
                dirty_bytes += segment.size_bytes();
                lag_due |= segment
                    .first_append_ms()
                    .is_some_and(|first| first <= now_ms.saturating_sub(config.max_compaction_lag_ms));
            }
            let (slot, path) = segment.file_slot();
            segments.push(CleanableSegment { base, end, slot, path, size: segment.size_bytes() });
        }
        let ratio_due = dirty_bytes > 0 && dirty_bytes as f64 >= config.min_cleanable_dirty_ratio * total_bytes as f64;
        let tombstones_due = state.tombstones_due_ms.is_some_and(|due| due <= now_ms);
        if segments.is_empty() || !(ratio_due || lag_due || tombstones_due) {
            return None;
        }
        Some(CleaningPlan {
            segments,
            cleaned_up_to: state.cleaned_up_to,
            config: config.clone(),
            aborted: state.aborted.clone(),
        })
    }

    /// Base offset of `producer_id`'s last batch in this log.
    pub(crate) fn last_producer_batch(&self, producer_id: i64) -> Option<i64> {
        self.state.lock().producers.last_batch_base(producer_id)
    }

    /// Puts a cleaned copy in place of `original`, unless the log changed under the
    /// cleaner (the segment was deleted by retention or truncation): then the copy is
    /// dropped and [`Installed::Dropped`] returned. A copy without a batch is not installed
    /// when its segment is neither the log's first (which holds the log start) nor the
    /// active one: the segment leaves the log and its files are deleted
    /// ([`Installed::Removed`]), leaving a gap in the offsets as compaction does between
    /// batches. Its unlinks are made durable by the directory fsync before the pass's
    /// checkpoint ([`crate::cleaner`]).
    pub(crate) fn install_cleaned(&self, original: &CleanableSegment, mut cleaned: Segment) -> io::Result<Installed> {
        // Held over the unlinks, as retention does: a cut or a reset reloading the log from
        // its directory must not find the removed segment's files still there.
        let _head = self.head_lock.lock();
        let removed = {
            let mut state = self.state.lock();
            let unchanged = state.segments.get(&original.base).is_some_and(|s| s.has_file_slot(&original.slot));
            if !unchanged || state.failed {
                cleaned.delete_files()?;
                return Ok(Installed::Dropped);
            }
            assert_eq!(cleaned.base_offset(), original.base);
            assert!(cleaned.next_offset() <= original.end, "a cleaned segment stays within its offsets");
            let first_base = *state.segments.keys().next().expect("non-empty");
            let removable = cleaned.is_empty()
                && original.base > first_base
                && original.base < first_unsealed_base(&state)
                && !state.config.remote_storage;
            if !removable {
                cleaned.move_into(&self.dir)?;
                state.segments.insert(original.base, cleaned);
                return Ok(Installed::Replaced);
            }
            state.segments.remove(&original.base).expect("the original segment")
        };
        // An empty copy left behind by an error goes when the log next opens (the cleaning
        // directory is emptied then).
        let _ = cleaned.delete_files();
        // Readers that hold the original's file keep reading it; one that opens it again
        // finds it gone and locates its offset again, in the gap (`log/read.rs`).
        if let Err(error) = removed.delete_files() {
            // Left on disk, it comes back at the next start with records the log holds
            // later versions of, for the next pass to clean again.
            tracing::warn!(dir = %self.dir.display(), base = original.base, %error, "failed to delete an emptied segment");
        }
        Ok(Installed::Removed)
    }

    /// Records a finished pass: segments below `cleaned_up_to` are clean, and the next
    /// pass is due at `tombstones_due_ms` for the tombstones it kept.
    pub(crate) fn finish_cleaning(&self, cleaned_up_to: i64, tombstones_due_ms: Option<i64>) -> io::Result<()> {
        crate::write_file_atomically(&self.dir.join(CLEANER_CHECKPOINT_FILE), cleaned_up_to.to_string().as_bytes())?;
        let mut state = self.state.lock();
        state.cleaned_up_to = state.cleaned_up_to.max(cleaned_up_to);
        state.tombstones_due_ms = tombstones_due_ms;
        Ok(())
    }
}

/// Takes the oldest sealed segments out of the log while `expired` says so, then moves the
/// log start offset; their files are deleted after, without the state's lock
/// ([`delete_released`]). Only segments wholly below the high watermark go: what is not yet
/// committed is not history to expire (a follower still has to fetch it, a failover may
/// still need it).
fn release_segments(state: &mut LogState, mut expired: impl FnMut(&Segment, i64) -> bool) -> Vec<Segment> {
    let mut released = Vec::new();
    while state.segments.len() > 1 {
        let (&base, segment) = state.segments.iter().next().expect("non-empty");
        if base >= first_unsealed_base(state)
            || segment.next_offset() > state.high_watermark
            || !expired(segment, state.log_start_offset)
        {
            break;
        }
        released.push(state.segments.remove(&base).expect("the first segment"));
    }
    let first_base = *state.segments.keys().next().expect("non-empty");
    state.log_start_offset = state.log_start_offset.max(first_base);
    released
}

/// Deletes the files of segments the log let go (readers that hold one keep reading it; one
/// that reopens a closed file finds it gone and locates its offset again). A file that cannot
/// be deleted stays until the next start or reload, which brings its segment back below the
/// log start, for the next retention pass to delete.
fn delete_released(released: Vec<Segment>) {
    for segment in released {
        if let Err(error) = segment.delete_files() {
            tracing::warn!(%error, "failed to delete segment files");
        }
    }
}
