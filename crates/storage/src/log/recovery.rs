//! Recovery: opening a partition from what its directory holds, and the operations that
//! rebuild the log's state from disk the same way — cutting a divergent tail
//! ([`Partition::truncate_to`]), starting over at the leader's log start
//! ([`Partition::reset_to`]) — plus the clean shutdown ([`Partition::close`]) that lets the
//! next open skip the scan. The files beside the segments are read and written here:
//! producer snapshots, the leader-epoch cache, aborted transactions, the log start offset
//! and the cleaner's checkpoint.
//!
//! Why a module: what a crash left behind is decided in one place, and truncation and
//! reset reuse it instead of patching the state by hand.
//!
//! Durability contract: [`Partition::open`] returns with a torn tail cut (and the cut
//! fsynced), the active segment fdatasynced, stale producer snapshots beyond the log end
//! removed (directory fsynced) and a cleaning pass cut short discarded: the state then
//! describes exactly what is on disk, with the high watermark at the log end (the WAL
//! replay by [`crate::LogManager`] may add to it). Producer snapshots are written new,
//! fsynced, renamed and their directory fsynced; segment indexes are written unsynced and
//! validated when read (a lost one means a longer scan, never a wrong state); both are
//! written only once the bytes they describe are durable. [`Partition::truncate_to`] fsyncs
//! the cut segment before it reloads, and is logged in the WAL after;
//! [`Partition::reset_to`] makes the new log start durable before it deletes anything, so
//! a crash leaves the old log or an empty one at the new start; [`Partition::close`] makes
//! the data, the index, a producer snapshot and the directory durable.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::OnceLock;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::wal_link::Control;
use super::{
    AbortedTransaction, LogConfig, LogState, Partition, Progress, PublishedOffsets, Visible, ABORTED_TRANSACTIONS_FILE,
    CLEANER_CHECKPOINT_FILE, CLEANING_DIR, LEADER_EPOCHS_FILE, LEADER_EPOCHS_MAX, LOG_START_OFFSET_FILE,
    RECOVERY_IMAGE_GROWTH_BYTES_MIN, RECOVERY_IMAGE_INTERVAL_MS, SNAPSHOTS_KEPT, SNAPSHOT_SUFFIX,
};
use crate::batch::BatchHeader;
use crate::producer_state::ProducerStateTable;
use crate::segment::{index_file_name, Segment, STAGED_IMAGE_EXTENSION};

/// A cut below the high watermark copies what its segment keeps in pieces of this size
/// (one `copy_file_range` call, or one buffer where the kernel cannot copy).
const CUT_COPY_CHUNK_BYTES: usize = 1024 * 1024;

impl Partition {
    /// Opens (recovering) or creates the partition log in `dir`.
    pub fn open(dir: &Path, config: LogConfig) -> io::Result<Partition> {
        crate::durable::create_dir_all(dir)?;
        let compacted = AtomicBool::new(config.cleanup_compact);
        let state = load_state(dir, config)?;
        let end = state.log_end_offset;
        let (visible, _) = watch::channel(Visible { high_watermark: end, failed: false });
        let (progress, _) = watch::channel(Progress { log_end_offset: end, local_end: end });
        let published = PublishedOffsets::default();
        let partition = Partition {
            dir: dir.to_path_buf(),
            state: Mutex::new(state),
            visible,
            progress,
            sync_queued: AtomicBool::new(false),
            flush_queued: AtomicBool::new(false),
            wal: OnceLock::new(),
            published,
            signal: OnceLock::new(),
            compacted,
            failures: OnceLock::new(),
            roll_lock: Mutex::new(()),
            head_lock: Mutex::new(()),
            snapshots: SnapshotFiles::listed(dir),
        };
        partition.publish_offsets(&partition.state.lock());
        Ok(partition)
    }

    /// The latest leader epoch written to this log, if any.
    pub fn latest_epoch(&self) -> Option<i32> {
        self.state.lock().epochs.last().map(|&(epoch, _)| epoch)
    }

    /// The leader epoch of the batch holding `offset` (the latest epoch starting at or
    /// before it), if the log knows one.
    pub fn epoch_at(&self, offset: i64) -> Option<i32> {
        let state = self.state.lock();
        let index = state.epochs.partition_point(|&(_, start)| start <= offset);
        index.checked_sub(1).map(|i| state.epochs[i].0)
    }

    /// Kafka's OffsetForLeaderEpoch: the largest epoch <= `epoch` this log knows and the
    /// offset where it ended (the start of the next epoch, or the log end). `None` when
    /// the log knows no epoch that old.
    pub fn epoch_end_offset(&self, epoch: i32) -> Option<(i32, i64)> {
        let state = self.state.lock();
        let index = state.epochs.partition_point(|&(e, _)| e <= epoch);
        if index == 0 {
            return None;
        }
        let found = state.epochs[index - 1].0;
        let end = state.epochs.get(index).map_or(state.log_end_offset, |&(_, start)| start);
        Some((found, end))
    }

    /// Cuts the log so that it ends at or before `offset` (at a batch boundary): a
    /// follower dropping the tail it does not share with its new leader. The high
    /// watermark never moves back past what replication committed, except onto the cut.
    pub fn truncate_to(&self, offset: i64) -> io::Result<()> {
        let cut = self.truncate_locked(offset)?;
        // Logged after the cut, before anything is appended past it: a crash in between
        // replays the old tail, which the leader has the follower cut again.
        let (Some(offset), Some(link)) = (cut, self.wal.get()) else { return Ok(()) };
        link.log(Control::Truncate(offset)).inspect_err(|error| {
            // Without the record a replay could put the old tail back under new batches:
            // nothing more is appended until a restart (which replays and cuts again).
            let mut state = self.state.lock();
            self.fail(&mut state, "logging a truncation in the WAL", error);
            self.publish(&state);
        })
    }

    /// [`Partition::truncate_to`] under the lock; returns where the log now ends when it cut.
    fn truncate_locked(&self, offset: i64) -> io::Result<Option<i64>> {
        let _head = self.head_lock.lock();
        let mut state = self.lock_settled()?;
        if offset >= state.log_end_offset {
            return Ok(None);
        }
        let offset = offset.max(state.log_start_offset);
        // The cut is found by scanning the file: what the active segment kept in memory goes
        // first, and no writeback claimed before may land after the cut.
        let active = state.segments.values_mut().next_back().expect("active segment");
        active.flush()?;
        active.retire_tail();
        let bases: Vec<i64> = state.segments.keys().copied().collect();
        let first_base = bases[0];
        for base in bases.into_iter().rev() {
            let segment = &state.segments[&base];
            if base >= offset && base > first_base {
                segment.delete_files()?;
                state.segments.remove(&base);
                continue;
            }
            // The segment holding the cut: keep its batches before `offset`.
            let mut cut = 0;
            segment.scan_from(segment.position_at_or_before(offset.max(base)), &mut |header, position| {
                if header.last_offset() >= offset {
                    cut = position;
                    return false;
                }
                cut = position + header.total_bytes() as u64;
                true
            })?;
            // The index goes first, durably: it may vouch for bytes past the cut (a
            // recovery image), which later appends would replace.
            match std::fs::remove_file(self.dir.join(index_file_name(base))) {
                Err(error) if error.kind() != io::ErrorKind::NotFound => return Err(error),
                _ => crate::durable::sync_dir(&self.dir)?,
            }
            let file = segment.file()?;
            if offset < state.high_watermark {
                // Readers may hold this file for bytes below the high watermark that the cut
                // removes (a `sendfile` range, a read located before the cut): they keep the
                // old file, and the log goes on in a copy of what it keeps.
                replace_with_prefix(&self.dir, &segment.file_slot().1, &file, cut)?;
            } else {
                // Past the high watermark only a follower's read reaches, and such a read
                // checks after it read that no cut came in between (`log/read.rs`).
                file.set_len(cut)?;
                crate::durable::sync_all(&file)?;
            }
            break;
        }
        for snapshot in list_snapshots(&self.dir) {
            if snapshot > offset {
                let _ = std::fs::remove_file(self.dir.join(snapshot_file_name(snapshot)));
            }
        }
        let config = state.config.clone();
        let replicated = state.replicated;
        let high_watermark = state.high_watermark;
        state.segments.clear();
        let mut reloaded = load_state(&self.dir, config)?;
        self.snapshots.relist(&self.dir);
        reloaded.replicated = replicated;
        // The reload fsynced what is left: unreplicated, all of it is visible (WAL replay
        // cuts such logs); replicated, never more than replication had committed.
        reloaded.high_watermark =
            if replicated { high_watermark.min(reloaded.log_end_offset) } else { reloaded.local_end };
        // The reload fsynced what is left, so no batch waits for a WAL record any more,
        // and a sync captured before the cut moves nothing.
        reloaded.sync_generation = state.sync_generation + 1;
        write_leader_epochs(&self.dir, &reloaded.epochs)?;
        reloaded.epochs_unwritten = false;
        *state = reloaded;
        tracing::info!(dir = %self.dir.display(), log_end_offset = state.log_end_offset, "truncated log");
        self.publish(&state);
        Ok(Some(state.log_end_offset))
    }

    /// Drops the whole log and starts it empty at `offset`: a follower whose log ends
    /// before its leader's log start offset (a new replica of a partition whose head was
    /// deleted by retention or DeleteRecords) cannot fetch what it lacks, so it restarts
    /// where the leader's log starts, as Kafka's follower does on OFFSET_OUT_OF_RANGE.
    pub fn reset_to(&self, offset: i64) -> io::Result<()> {
        assert!(offset >= 0, "a log cannot start at a negative offset");
        let _head = self.head_lock.lock();
        let mut state = self.lock_settled()?;
        assert!(offset > state.log_end_offset, "reset_to only moves a log forward past its end");
        // The start offset is written first: a crash part way leaves either the old log
        // (fetched from and reset again) or an empty one that recovery opens at `offset`.
        crate::write_file_atomically(&self.dir.join(LOG_START_OFFSET_FILE), offset.to_string().as_bytes())?;
        for segment in state.segments.values() {
            segment.delete_files()?;
        }
        state.segments.clear();
        for snapshot in list_snapshots(&self.dir) {
            let _ = std::fs::remove_file(self.dir.join(snapshot_file_name(snapshot)));
        }
        write_leader_epochs(&self.dir, &[])?;
        let config = state.config.clone();
        let replicated = state.replicated;
        let mut reloaded = load_state(&self.dir, config)?;
        self.snapshots.relist(&self.dir);
        assert_eq!(reloaded.log_end_offset, offset);
        reloaded.replicated = replicated;
        // Pending batches lie below `offset`: replay skips them, nothing to log.
        reloaded.sync_generation = state.sync_generation + 1;
        *state = reloaded;
        tracing::info!(dir = %self.dir.display(), offset, "log reset to the leader's log start");
        self.publish(&state);
        Ok(())
    }

    /// Clean shutdown: fsync the data, cut preallocation, persist the index and producer
    /// state, and make all of it durable, so the next start trusts the index and loads
    /// producer state without a scan.
    pub fn close(&self) -> io::Result<()> {
        let mut state = self.lock_settled()?;
        write_leader_epochs_if_unwritten(&self.dir, &mut state)?;
        let log_end_offset = state.log_end_offset;
        let active = state.segments.values_mut().next_back().expect("active segment");
        active.seal(true)?;
        write_snapshot(&self.dir, log_end_offset, &state.producers, &self.snapshots)?;
        crate::durable::sync_path(&self.dir.join(snapshot_file_name(log_end_offset)))?;
        crate::durable::sync_dir(&self.dir)
    }
}

/// Recovers a partition's state from its directory (see [`Partition::open`]).
fn load_state(dir: &Path, config: LogConfig) -> io::Result<LogState> {
    loop {
        let state = load_state_once(dir, config.clone())?;
        // A producer snapshot describes the log up to its offset; one beyond the recovered
        // log end (its data was lost) would answer a retry of a lost batch as a duplicate
        // at an offset that does not exist. Drop it and replay from an older one.
        let stale: Vec<i64> = list_snapshots(dir).into_iter().filter(|&o| o > state.log_end_offset).collect();
        if stale.is_empty() {
            return Ok(state);
        }
        for offset in stale {
            tracing::warn!(dir = %dir.display(), offset, log_end_offset = state.log_end_offset, "dropping producer snapshot beyond the log end");
            std::fs::remove_file(dir.join(snapshot_file_name(offset)))?;
        }
        crate::durable::sync_dir(dir)?;
    }
}

/// Puts a copy of the first `length` bytes of `file` (the segment file at `path`) in its
/// place, fsynced and renamed over it (the directory fsynced), so that whoever holds the old
/// file open still reads the bytes it located there. The copy is made in the cleaning
/// directory, which recovery removes, so a crash part way leaves the old file in place.
fn replace_with_prefix(dir: &Path, path: &Path, file: &File, length: u64) -> io::Result<()> {
    let staging = dir.join(CLEANING_DIR);
    match std::fs::create_dir(&staging) {
        Err(error) if error.kind() != io::ErrorKind::AlreadyExists => return Err(error),
        _ => {}
    }
    let name = path.file_name().expect("a segment file has a name").to_string_lossy();
    let copy_path = staging.join(format!("{name}.cut"));
    let copy = File::options().write(true).create(true).truncate(true).open(&copy_path)?;
    copy_prefix(file, &copy, length)?;
    crate::durable::sync_all(&copy)?;
    std::fs::rename(&copy_path, path)?;
    crate::durable::sync_dir(dir)
}

/// Copies the first `length` bytes of `from` into `to` in the kernel (`copy_file_range`,
/// with explicit offsets: neither file's cursor moves, no user-space buffer), where the
/// kernel can; else through a buffer.
fn copy_prefix(from: &File, to: &File, length: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let (mut from_offset, mut to_offset): (libc::loff_t, libc::loff_t) = (0, 0);
    while (from_offset as u64) < length {
        let chunk = (length - from_offset as u64).min(CUT_COPY_CHUNK_BYTES as u64) as usize;
        // SAFETY: both descriptors are open for the call; the offsets are local variables.
        let copied = unsafe {
            libc::copy_file_range(from.as_raw_fd(), &mut from_offset, to.as_raw_fd(), &mut to_offset, chunk, 0)
        };
        if copied > 0 {
            continue;
        }
        if copied == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "segment shorter than the part it keeps"));
        }
        let error = io::Error::last_os_error();
        match error.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EXDEV | libc::ENOSYS | libc::EOPNOTSUPP | libc::EINVAL) => break,
            _ => return Err(error),
        }
    }
    debug_assert_eq!(from_offset, to_offset);
    let mut position = from_offset as u64;
    let mut buffer = Vec::new();
    while position < length {
        buffer.resize(CUT_COPY_CHUNK_BYTES, 0);
        let chunk = (length - position).min(CUT_COPY_CHUNK_BYTES as u64) as usize;
        from.read_exact_at(&mut buffer[..chunk], position)?;
        to.write_all_at(&buffer[..chunk], position)?;
        position += chunk as u64;
    }
    Ok(())
}

fn load_state_once(dir: &Path, config: LogConfig) -> io::Result<LogState> {
    // A cleaning pass cut short: the originals are still in place (or already replaced).
    match std::fs::remove_dir_all(dir.join(CLEANING_DIR)) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => return Err(error),
        _ => {}
    }
    remove_rolling_files(dir)?;
    let (snapshot_offset, producers) = load_latest_snapshot(dir);
    let mut replay = ProducerReplay { from: snapshot_offset, producers };
    // The file holds every epoch that began in a trusted part of the log (it is written
    // before a segment is sealed and before a recovery image is put in place); epochs that
    // began later are found again in the batches scanned here.
    let mut epochs = read_leader_epochs(dir);
    let epochs_in_file = epochs.clone();
    let mut segments: BTreeMap<i64, Segment> = BTreeMap::new();
    for base_offset in list_segment_bases(dir)? {
        let (segment, trusted) = Segment::open(dir, base_offset, &mut |header, whole_segment| {
            if whole_segment {
                replay.apply(header);
            }
            note_leader_epoch(&mut epochs, header);
        })?;
        if trusted && segment.next_offset() > replay.from {
            let start = segment.position_at_or_before(replay.from);
            segment.scan_from(start, &mut |header, _| {
                replay.apply(header);
                note_leader_epoch(&mut epochs, header);
                true
            })?;
        }
        if let Some(previous) = segments.values().next_back().map(|s| s.next_offset()) {
            // A compacted segment may end before the next one starts, never after.
            if previous > base_offset {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}: segment {base_offset} overlaps offsets up to {previous}", dir.display()),
                ));
            }
        }
        // Only the last segment stays pinned open: the others are sealed, under the budget
        // of open files (so a log of many segments does not hold a descriptor for each).
        if let Some(previous) = segments.values().next_back() {
            previous.release_file();
        }
        segments.insert(base_offset, segment);
    }
    let producers = replay.producers;
    let stored_start = read_log_start_offset(dir);
    if segments.is_empty() {
        let base = stored_start.unwrap_or(0);
        segments.insert(base, Segment::create(dir, base)?);
    }
    let active = segments.values().next_back().expect("at least one segment");
    // The active segment's index file (if any) stays: appends go past the bytes it
    // vouches for, and only a cut (`truncate_locked`) changes those.
    let active_base = active.base_offset();
    crate::durable::sync_data(&*active.file()?)?;
    let first_base = *segments.keys().next().expect("at least one segment");
    let log_end_offset = active.next_offset();
    let log_start_offset = stored_start.unwrap_or(first_base).max(first_base).min(log_end_offset);
    epochs.retain(|&(_, start)| start < log_end_offset);
    let epochs_unwritten = epochs != epochs_in_file;
    let cleaned_up_to = read_offset_file(&dir.join(CLEANER_CHECKPOINT_FILE)).unwrap_or(first_base);
    let aborted = read_aborted_transactions(dir, log_start_offset, log_end_offset);
    // Kept tombstones' deadlines are not stored: one pass after a start finds them again.
    let tombstones_due_ms = config.cleanup_compact.then_some(0);
    Ok(LogState {
        config,
        segments,
        log_start_offset,
        log_end_offset,
        high_watermark: log_end_offset,
        local_end: log_end_offset,
        replicated: false,
        recovered_high_watermark: None,
        epochs,
        epochs_unwritten,
        producers,
        aborted,
        cleaned_up_to,
        tombstones_due_ms,
        unflushed_messages: 0,
        oldest_unflushed_ms: None,
        failed: false,
        wal_pending: Default::default(),
        sync_generation: 0,
        roll: None,
        retired: false,
        recovery_image: (active_base, 0),
        recovery_image_ms: i64::MIN,
        remote_tier: None,
    })
}

/// Records the epoch of a batch in `epochs` if it is the first seen of a newer one;
/// returns whether it did.
pub(super) fn note_leader_epoch(epochs: &mut Vec<(i32, i64)>, header: &BatchHeader) -> bool {
    let newer = epochs
        .last()
        .is_none_or(|&(epoch, start)| header.partition_leader_epoch > epoch && header.base_offset >= start);
    if newer {
        epochs.push((header.partition_leader_epoch, header.base_offset));
        if epochs.len() > LEADER_EPOCHS_MAX {
            epochs.remove(0);
        }
    }
    newer
}

/// Rebuilds producer state from batch headers at or after `from`, each applied once.
struct ProducerReplay {
    from: i64,
    producers: ProducerStateTable,
}

impl ProducerReplay {
    fn apply(&mut self, header: &BatchHeader) {
        if header.base_offset >= self.from {
            self.producers.record(header);
            self.from = header.last_offset() + 1;
        }
    }
}

/// Deletes the files of rolls that did not complete ([`Segment::create_rolling`]): their
/// batches are in the WAL, which replays them (a checkpoint completes a roll before it
/// drops the WAL's copy), while the segment before them may have lost its tail.
fn remove_rolling_files(dir: &Path) -> io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_name().to_string_lossy().ends_with(crate::segment::ROLLING_SUFFIX) {
            tracing::info!(path = %entry.path().display(), "removing the new segment of a roll that did not complete");
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

fn list_segment_bases(dir: &Path) -> io::Result<Vec<i64>> {
    let mut bases = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        let name = name.to_string_lossy();
        if let Some(stem) = name.strip_suffix(".log") {
            if let Ok(base) = stem.parse::<i64>() {
                bases.push(base);
            }
        }
    }
    bases.sort_unstable();
    Ok(bases)
}

fn read_leader_epochs(dir: &Path) -> Vec<(i32, i64)> {
    let Ok(body) = std::fs::read(dir.join(LEADER_EPOCHS_FILE)) else { return Vec::new() };
    match serde_json::from_slice::<Vec<(i32, i64)>>(&body) {
        Ok(epochs) if epochs.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1) => epochs,
        _ => {
            tracing::warn!(dir = %dir.display(), "ignoring unreadable leader-epoch cache");
            Vec::new()
        }
    }
}

pub(super) fn write_leader_epochs(dir: &Path, epochs: &[(i32, i64)]) -> io::Result<()> {
    let body = serde_json::to_vec(epochs).map_err(io::Error::other)?;
    crate::write_file_atomically(&dir.join(LEADER_EPOCHS_FILE), &body)
}

/// Makes the epochs that appends noted durable: due before any part of the log becomes
/// trusted at open (a sealed segment, a recovery image), since only the rest is scanned
/// for them again.
pub(super) fn write_leader_epochs_if_unwritten(dir: &Path, state: &mut LogState) -> io::Result<()> {
    if state.epochs_unwritten {
        write_leader_epochs(dir, &state.epochs)?;
        state.epochs_unwritten = false;
    }
    Ok(())
}

/// The aborted transactions recorded for `dir` whose markers are within the log.
fn read_aborted_transactions(dir: &Path, log_start: i64, log_end: i64) -> Vec<AbortedTransaction> {
    let Ok(body) = std::fs::read(dir.join(ABORTED_TRANSACTIONS_FILE)) else { return Vec::new() };
    let mut aborted: Vec<AbortedTransaction> = serde_json::from_slice(&body).unwrap_or_else(|error| {
        tracing::error!(dir = %dir.display(), %error, "unreadable aborted-transactions file");
        Vec::new()
    });
    // An abort recorded whose marker a crash took back is recorded again when the
    // coordinator writes the marker anew.
    aborted.retain(|a| a.last_offset >= log_start && a.last_offset < log_end);
    aborted
}

fn read_offset_file(path: &Path) -> Option<i64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn read_log_start_offset(dir: &Path) -> Option<i64> {
    read_offset_file(&dir.join(LOG_START_OFFSET_FILE))
}

#[derive(Serialize, Deserialize)]
struct ProducerSnapshot {
    version: u32,
    offset: i64,
    producers: ProducerStateTable,
}

/// The producer snapshots in a partition's directory, by offset, ascending: listed when the
/// log is loaded from its directory (open, cut, reset), then kept as snapshots are written
/// and deleted, so a roll neither lists the directory (thousands of segment files) nor
/// keeps more than [`SNAPSHOTS_KEPT`]. A leaf lock: nothing else is locked under it.
pub(super) struct SnapshotFiles(Mutex<Vec<i64>>);

impl SnapshotFiles {
    pub(super) fn listed(dir: &Path) -> SnapshotFiles {
        SnapshotFiles(Mutex::new(list_snapshots(dir)))
    }

    pub(super) fn relist(&self, dir: &Path) {
        *self.0.lock() = list_snapshots(dir);
    }

    /// Notes the snapshot at `offset` written; returns the oldest ones past [`SNAPSHOTS_KEPT`],
    /// forgotten here, for the caller to delete.
    fn note_written(&self, offset: i64) -> Vec<i64> {
        let mut offsets = self.0.lock();
        if let Err(position) = offsets.binary_search(&offset) {
            offsets.insert(position, offset);
        }
        let excess = offsets.len().saturating_sub(SNAPSHOTS_KEPT);
        // The newest are kept: `offset` itself goes when a roll and a recovery image wrote
        // newer ones meanwhile.
        let dropped: Vec<i64> = offsets.drain(..excess).collect();
        assert!(offsets.len() <= SNAPSHOTS_KEPT);
        dropped
    }
}

pub(super) fn write_snapshot(
    dir: &Path,
    offset: i64,
    producers: &ProducerStateTable,
    known: &SnapshotFiles,
) -> io::Result<()> {
    let snapshot = ProducerSnapshot { version: 1, offset, producers: producers.clone() };
    let body = serde_json::to_vec(&snapshot).map_err(io::Error::other)?;
    // Durable before it is named: a snapshot that a crash emptied would cost every restart
    // a warning and a replay of the whole log instead of its tail.
    crate::write_file_atomically(&dir.join(snapshot_file_name(offset)), &body)?;
    for oldest in known.note_written(offset) {
        let _ = std::fs::remove_file(dir.join(snapshot_file_name(oldest)));
    }
    Ok(())
}

pub(super) fn snapshot_file_name(offset: i64) -> String {
    format!("{offset:020}{SNAPSHOT_SUFFIX}")
}

fn list_snapshots(dir: &Path) -> Vec<i64> {
    let mut offsets: Vec<i64> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().strip_suffix(SNAPSHOT_SUFFIX)?.parse().ok())
        .collect();
    offsets.sort_unstable();
    offsets
}

/// The newest readable producer snapshot, or an empty table replayed from offset 0.
fn load_latest_snapshot(dir: &Path) -> (i64, ProducerStateTable) {
    for offset in list_snapshots(dir).into_iter().rev() {
        let path = dir.join(snapshot_file_name(offset));
        let parsed = std::fs::read(&path).ok().and_then(|b| serde_json::from_slice::<ProducerSnapshot>(&b).ok());
        match parsed {
            Some(snapshot) if snapshot.version == 1 && snapshot.offset == offset => {
                return (offset, snapshot.producers)
            }
            _ => tracing::warn!(path = %path.display(), "ignoring unreadable producer snapshot"),
        }
    }
    (0, ProducerStateTable::default())
}

/// What a WAL checkpoint captured of the active segment, written once its bytes are durable.
pub(super) struct RecoveryImage {
    base_offset: i64,
    covered: u64,
    generation: u64,
    index_path: std::path::PathBuf,
    index: Vec<u8>,
    log_end_offset: i64,
    producers: ProducerStateTable,
}

/// True when the active segment grew enough since its last recovery image, and that image
/// is old enough (`now_ms`).
pub(super) fn recovery_image_due(state: &LogState, now_ms: i64) -> bool {
    let active = state.segments.values().next_back().expect("active segment");
    let (base, covered) = state.recovery_image;
    let last = if base == active.base_offset() { covered } else { 0 };
    active.size_bytes().saturating_sub(last) >= RECOVERY_IMAGE_GROWTH_BYTES_MIN.max(last / 16)
        && now_ms.saturating_sub(state.recovery_image_ms) >= RECOVERY_IMAGE_INTERVAL_MS
}

/// The active segment's index and the producer state at its end, captured under the lock.
pub(super) fn capture_recovery_image(state: &LogState) -> RecoveryImage {
    let active = state.segments.values().next_back().expect("active segment");
    assert_eq!(active.next_offset(), state.log_end_offset, "the active segment ends the log");
    RecoveryImage {
        base_offset: active.base_offset(),
        covered: active.size_bytes(),
        generation: state.sync_generation,
        index_path: active.index_path().to_path_buf(),
        index: active.index_image(),
        log_end_offset: state.log_end_offset,
        producers: state.producers.clone(),
    }
}

impl Partition {
    /// Puts a recovery image in place, unless the log was cut, reset or rolled since it
    /// was captured (its bytes may no longer be the segment's). Call only once the bytes
    /// it covers are durable. Its files are not synced: a crash that loses them only
    /// means a longer scan at the next start.
    pub(super) fn write_recovery_image(&self, image: RecoveryImage) -> io::Result<()> {
        let staged = image.index_path.with_extension(STAGED_IMAGE_EXTENSION);
        std::fs::write(&staged, &image.index)?;
        let mut state = self.state.lock();
        let active_base = state.segments.keys().next_back().copied();
        if state.failed
            || state.retired
            || state.sync_generation != image.generation
            || active_base != Some(image.base_offset)
        {
            drop(state);
            return std::fs::remove_file(&staged);
        }
        // Under the lock: a cut, which removes the index, cannot come in between.
        write_leader_epochs_if_unwritten(&self.dir, &mut state)?;
        std::fs::rename(&staged, &image.index_path)?;
        write_snapshot(&self.dir, image.log_end_offset, &image.producers, &self.snapshots)?;
        state.recovery_image = (image.base_offset, image.covered);
        state.recovery_image_ms = crate::now_ms();
        Ok(())
    }
}

#[cfg(test)]
mod recovery_image_tests {
    use bytes::Bytes;

    use super::*;
    use crate::batch::{self, tests::make_batch, BatchIter};
    use crate::segment::ReadMode;

    /// Visible at once, so the test needs no syncer.
    fn page_cache_config() -> LogConfig {
        LogConfig { flush_messages: u64::MAX, ..LogConfig::default() }
    }

    fn append(partition: &Partition, batches: usize, records: i32, timestamp: i64) {
        for _ in 0..batches {
            partition.append(&Bytes::from(make_batch(records, timestamp, None)), 0, 0).unwrap();
        }
    }

    /// (first, last offset) of every batch from `from` to the log end.
    fn batch_ranges(partition: &Partition) -> Vec<(i64, i64)> {
        let mut ranges = Vec::new();
        let mut from = partition.offsets().log_start_offset;
        while from < partition.offsets().log_end_offset {
            let bytes = partition.read(from, 1 << 20, true, ReadMode::MayBlock).unwrap();
            for item in BatchIter::new(&bytes) {
                let (header, range) = item.unwrap();
                batch::validate_stored_batch(&bytes[range]).unwrap();
                ranges.push((header.base_offset, header.last_offset()));
                from = header.last_offset() + 1;
            }
        }
        ranges
    }

    fn expected(layout: &[(usize, i64)]) -> Vec<(i64, i64)> {
        let mut next = 0;
        let mut ranges = Vec::new();
        for &(batches, records) in layout {
            for _ in 0..batches {
                ranges.push((next, next + records - 1));
                next += records;
            }
        }
        ranges
    }

    #[test]
    fn a_restart_after_a_crash_scans_only_what_came_after_the_recovery_image() {
        let dir = tempfile::tempdir().unwrap();
        let partition = Partition::open(dir.path(), page_cache_config()).unwrap();
        append(&partition, 400, 100, 10);
        assert_eq!(partition.sync_for_wal_checkpoint(true), crate::log::CheckpointSync::Synced);
        let covered = partition.state.lock().recovery_image.1;
        assert!(covered >= RECOVERY_IMAGE_GROWTH_BYTES_MIN, "a checkpoint of a grown segment writes an image");
        append(&partition, 50, 100, 20);
        // A crash: no close. Then a byte under the image goes bad: a scan from the start
        // would stop at that batch's CRC and cut everything after it.
        drop(partition);
        let segment = dir.path().join(crate::segment::log_file_name(0));
        let file = std::fs::OpenOptions::new().write(true).open(&segment).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&file, b"?", covered / 2).unwrap();

        let partition = Partition::open(dir.path(), page_cache_config()).unwrap();
        assert_eq!(partition.offsets().log_end_offset, 450 * 100);
        assert_eq!(
            partition.batch_with_max_timestamp().unwrap().map(|b| BatchHeader::parse(&b).unwrap().max_timestamp),
            Some(20)
        );
        append(&partition, 1, 100, 30);
        assert_eq!(partition.offsets().log_end_offset, 451 * 100);
        partition.close().unwrap();
    }

    #[test]
    fn checkpoints_in_quick_succession_write_one_recovery_image() {
        let dir = tempfile::tempdir().unwrap();
        let partition = Partition::open(dir.path(), page_cache_config()).unwrap();
        append(&partition, 400, 100, 10);
        assert_eq!(partition.sync_for_wal_checkpoint(true), crate::log::CheckpointSync::Synced);
        let first = partition.state.lock().recovery_image;
        assert!(first.1 >= RECOVERY_IMAGE_GROWTH_BYTES_MIN);
        // Grown enough again, but right after the last image: none now.
        append(&partition, 400, 100, 20);
        assert_eq!(partition.sync_for_wal_checkpoint(true), crate::log::CheckpointSync::Synced);
        assert_eq!(partition.state.lock().recovery_image, first, "no second image within the interval");
        // Once the interval has passed, the next checkpoint writes one.
        partition.state.lock().recovery_image_ms -= RECOVERY_IMAGE_INTERVAL_MS;
        assert_eq!(partition.sync_for_wal_checkpoint(true), crate::log::CheckpointSync::Synced);
        assert!(partition.state.lock().recovery_image.1 > first.1, "an image after the interval");
        partition.close().unwrap();
    }

    fn append_in_epoch(partition: &Partition, batches: usize, epoch: i32) {
        for _ in 0..batches {
            partition.append(&Bytes::from(make_batch(100, 10, None)), epoch, 0).unwrap();
        }
    }

    fn epochs_in_file(dir: &Path) -> Vec<(i32, i64)> {
        read_leader_epochs(dir)
    }

    #[test]
    fn leader_epochs_begun_by_appends_are_written_with_the_image_and_found_again_after_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let partition = Partition::open(dir.path(), page_cache_config()).unwrap();
        append_in_epoch(&partition, 10, 0);
        append_in_epoch(&partition, 400, 3);
        assert_eq!(epochs_in_file(dir.path()), vec![], "no epochs file write on the append path");
        assert_eq!(partition.sync_for_wal_checkpoint(true), crate::log::CheckpointSync::Synced);
        assert_eq!(epochs_in_file(dir.path()), vec![(0, 0), (3, 1000)], "written before the image");
        append_in_epoch(&partition, 5, 7);
        // A crash: no close. Epoch 7 began after the image: only its batches tell.
        drop(partition);

        let partition = Partition::open(dir.path(), page_cache_config()).unwrap();
        assert_eq!(partition.epoch_at(999), Some(0));
        assert_eq!(partition.epoch_at(1000), Some(3));
        assert_eq!(partition.epoch_at(41_000), Some(7));
        assert_eq!(partition.epoch_end_offset(3), Some((3, 41_000)));
        partition.close().unwrap();
        assert_eq!(epochs_in_file(dir.path()), vec![(0, 0), (3, 1000), (7, 41_000)], "close writes them");
    }

    #[test]
    fn a_leader_epoch_begun_in_a_sealed_segment_survives_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let config = LogConfig { segment_bytes: 64 * 1024, ..page_cache_config() };
        let partition = Partition::open(dir.path(), config.clone()).unwrap();
        append_in_epoch(&partition, 1, 0);
        // Epoch 5 begins at 100 and runs on into later segments; the first is sealed and
        // trusted at the next open (not scanned).
        append_in_epoch(&partition, 200, 5);
        assert!(partition.state.lock().segments.len() > 2, "rolled");
        drop(partition);

        let partition = Partition::open(dir.path(), config).unwrap();
        assert_eq!(partition.epoch_at(99), Some(0));
        assert_eq!(partition.epoch_at(100), Some(5));
        assert_eq!(partition.epoch_end_offset(0), Some((0, 100)));
    }

    #[test]
    fn a_cut_below_a_recovery_image_is_never_undone_by_it() {
        let dir = tempfile::tempdir().unwrap();
        let partition = Partition::open(dir.path(), page_cache_config()).unwrap();
        append(&partition, 400, 100, 10);
        assert_eq!(partition.sync_for_wal_checkpoint(true), crate::log::CheckpointSync::Synced);
        partition.truncate_to(100 * 100).unwrap();
        // Smaller batches past the cut, beyond what the image covered.
        append(&partition, 900, 50, 20);
        drop(partition);

        let partition = Partition::open(dir.path(), page_cache_config()).unwrap();
        assert_eq!(batch_ranges(&partition), expected(&[(100, 100), (900, 50)]));
        partition.close().unwrap();
    }

    #[test]
    fn an_image_captured_before_a_cut_is_not_put_in_place_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let partition = Partition::open(dir.path(), page_cache_config()).unwrap();
        append(&partition, 400, 100, 10);
        let image = capture_recovery_image(&partition.state.lock());
        partition.truncate_to(100 * 100).unwrap();
        append(&partition, 900, 50, 20);
        partition.write_recovery_image(image).unwrap();
        assert!(!dir.path().join(index_file_name(0)).exists(), "a stale image is dropped");
        drop(partition);

        let partition = Partition::open(dir.path(), page_cache_config()).unwrap();
        assert_eq!(batch_ranges(&partition), expected(&[(100, 100), (900, 50)]));
    }
}
