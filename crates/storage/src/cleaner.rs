//! Log compaction (`cleanup.policy=compact`): keep the latest record per key.
//!
//! A pass over one partition (Kafka's LogCleaner, per segment):
//! 1. [`Partition::cleaning_plan`] picks the cleanable segments (sealed, committed, older
//!    than `min.compaction.lag.ms`) when a pass is due.
//! 2. The dirty segments (never cleaned) are read to build the offset map: key hash ->
//!    offset of the key's latest record. The map is capped (`log.cleaner.dedupe.buffer.size`);
//!    a pass that fills it cleans up to where it stopped and leaves the rest for the next.
//! 3. Every cleanable segment below that point is copied into the cleaning directory
//!    without what is superseded: a record whose key has a later offset in the map, a
//!    record without a key, a tombstone that was already cleaned once and is older
//!    than `delete.retention.ms`, an aborted transaction's records, and a transaction
//!    marker whose transaction has no record left (after `delete.retention.ms`, as a
//!    tombstone). A batch whose records all stay is copied byte for byte;
//!    a batch that loses some is rebuilt with the rest ([`records::rebuild`], same offsets,
//!    codec and producer fields); an emptied batch goes, unless it is its producer's last
//!    (then its header stays, so the producer's sequence survives a replay).
//! 4. The copy is fsynced and moved over the original ([`Partition::install_cleaned`]):
//!    a rename, so a crash leaves the original or the copy, never both or neither.
//! 5. A copy left without a single batch is not installed: its segment leaves the log and
//!    the original's files are deleted, leaving a gap in the offsets (as between the batches
//!    of a cleaned segment; recovery accepts a segment that ends before the next starts, and
//!    reads go on at the next segment). Two segments are kept even empty: the log's first,
//!    whose base is the log start offset when no log-start file says otherwise (removing it
//!    would move the start), and the active one, never cleaned. So a log whose old records
//!    are all superseded holds one empty segment at its head, not one per segment cleaned.
//!    The segments are not merged: small non-empty ones stay as they are.
//!
//! Crash safety of a removal: the superseded records' later versions are in sealed
//! segments (fsynced before they were sealed) that this pass keeps them in, so from the
//! unlink on either the original is found again at a restart (records the log holds later
//! versions of: a valid log, cleaned again by the next pass) or it is gone, which is what
//! its empty copy would have held. A batch the cleaner keeps (a key's latest record, the
//! header of a producer's last batch, a kept marker) makes the copy non-empty, so no such
//! batch leaves with a removed segment. The removed segment's base offset is nothing the
//! log or the files beside it depend on: producer snapshots, the leader-epoch cache and the
//! cleaner's checkpoint hold offsets, which stay valid over a gap; the log end is the
//! active segment's; WAL replay appends past the log end only. The directory is fsynced
//! before the pass's checkpoint is written, so a checkpoint never covers a removal a crash
//! could undo. Compacted topics are never tiered (the topic config refuses it), and a
//! tiered log's segments are never removed here.
//!
//! The cleaner runs on its own thread, off the produce and fetch paths, and its reads and
//! writes are paced by `log.cleaner.io.max.bytes.per.second` so it cannot take the disk
//! from producers. Only the offset map and one batch at a time are in memory.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::batch::{self, BatchHeader, BatchIter, BATCH_HEADER_BYTES};
use crate::log::{CleanableSegment, CleaningPlan, Installed, Partition, CLEANING_DIR};
use crate::records;
use crate::segment::Segment;

/// Bytes the offset map spends per key (hash, offset and the map's own overhead), to turn
/// `log.cleaner.dedupe.buffer.size` into a key count.
pub const OFFSET_MAP_BYTES_PER_KEY: u64 = 48;
/// The cleaner reads segments in chunks of this size.
const READ_CHUNK_BYTES: usize = 1024 * 1024;

/// The broker's cleaner settings (Kafka's `log.cleaner.*`).
#[derive(Debug, Clone, PartialEq)]
pub struct CleanerSettings {
    /// `log.cleaner.enable`
    pub enabled: bool,
    /// `log.cleaner.backoff.ms`: the pause when no log needs cleaning
    pub backoff_ms: u64,
    /// `log.cleaner.io.max.bytes.per.second`: read plus written
    pub io_max_bytes_per_second: u64,
    /// `log.cleaner.dedupe.buffer.size`: memory for the offset map
    pub dedupe_buffer_bytes: u64,
}

impl Default for CleanerSettings {
    fn default() -> Self {
        CleanerSettings {
            enabled: true,
            backoff_ms: 15_000,
            io_max_bytes_per_second: 100 * 1024 * 1024,
            dedupe_buffer_bytes: 128 * 1024 * 1024,
        }
    }
}

impl CleanerSettings {
    fn keys_max(&self) -> usize {
        (self.dedupe_buffer_bytes / OFFSET_MAP_BYTES_PER_KEY).max(1) as usize
    }
}

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CleanStats {
    /// Segments replaced by their cleaned copy.
    pub segments_rewritten: usize,
    /// Segments left with no batch, and so removed from the log.
    pub segments_removed: usize,
    pub bytes_before: u64,
    pub bytes_after: u64,
    pub records_removed: u64,
}

/// Paces the cleaner's I/O to a byte rate.
pub struct IoPacer {
    bytes_per_second: u64,
    started: Instant,
    spent: u64,
}

impl IoPacer {
    pub fn new(bytes_per_second: u64) -> IoPacer {
        assert!(bytes_per_second > 0);
        IoPacer { bytes_per_second, started: Instant::now(), spent: 0 }
    }

    /// Accounts `bytes` of I/O, sleeping as long as the rate requires.
    fn spend(&mut self, bytes: u64) {
        self.spent += bytes;
        let due = Duration::from_secs_f64(self.spent as f64 / self.bytes_per_second as f64);
        let elapsed = self.started.elapsed();
        if due > elapsed {
            std::thread::sleep(due - elapsed);
        }
        // Idle time is not saved up for a later burst.
        if elapsed > due + Duration::from_secs(1) {
            self.started = Instant::now();
            self.spent = 0;
        }
    }
}

/// The 128-bit hash the offset map keeps for a key (Kafka keeps an MD5 of it).
fn key_hash(key: &[u8]) -> u128 {
    let digest = Sha256::digest(key);
    u128::from_be_bytes(digest[..16].try_into().expect("16 bytes"))
}

/// Runs one pass over `partition` if one is due. Returns what it did (None: nothing due).
/// `stop` is checked between segments: a pass cut short leaves the log as it was or
/// partly cleaned, both valid.
pub fn clean_partition(
    partition: &Partition,
    now_ms: i64,
    settings: &CleanerSettings,
    pacer: &mut IoPacer,
    stop: &dyn Fn() -> bool,
) -> io::Result<Option<CleanStats>> {
    let Some(plan) = partition.cleaning_plan(now_ms) else { return Ok(None) };
    let (map, map_end) = build_offset_map(&plan, settings.keys_max(), pacer)?;
    let cleaning_dir = partition.dir().join(CLEANING_DIR);
    // Not create_dir_all: a partition deleted meanwhile must not come back.
    match std::fs::create_dir(&cleaning_dir) {
        Err(error) if error.kind() != io::ErrorKind::AlreadyExists => return Err(error),
        _ => {}
    }
    let mut stats = CleanStats::default();
    let mut tombstones_due_ms: Option<i64> = None;
    let delete_horizon_ms = now_ms.saturating_sub(plan.config.delete_retention_ms);
    let mut transactions_with_data = HashSet::new();
    for segment in plan.segments.iter().filter(|s| s.base < map_end) {
        if stop() {
            return Ok(Some(stats));
        }
        // A tombstone may go once it has been through a pass (its segment was clean
        // before this one) and is older than delete.retention.ms.
        let tombstones_removable = segment.base < plan.cleaned_up_to;
        let mut filter = RecordFilter {
            aborted: &plan.aborted,
            map: &map,
            tombstones_removable,
            delete_horizon_ms,
            delete_retention_ms: plan.config.delete_retention_ms,
            tombstones_due_ms: &mut tombstones_due_ms,
            transactions_with_data: &mut transactions_with_data,
        };
        if let Some(cleaned) = copy_cleaned(partition, segment, &cleaning_dir, &mut filter, now_ms, pacer, &mut stats)?
        {
            match partition.install_cleaned(segment, cleaned)? {
                Installed::Replaced => stats.segments_rewritten += 1,
                Installed::Removed => stats.segments_removed += 1,
                Installed::Dropped => {}
            }
        }
    }
    crate::durable::sync_dir(partition.dir())?;
    partition.finish_cleaning(map_end.max(plan.cleaned_up_to), tombstones_due_ms)?;
    Ok(Some(stats))
}

/// Key hash -> latest offset over the dirty segments, and the offset it covers up to.
fn build_offset_map(
    plan: &CleaningPlan,
    keys_max: usize,
    pacer: &mut IoPacer,
) -> io::Result<(HashMap<u128, i64>, i64)> {
    let mut map: HashMap<u128, i64> = HashMap::new();
    let mut map_end = plan.cleaned_up_to;
    for segment in plan.segments.iter().filter(|s| s.base >= plan.cleaned_up_to) {
        // The first dirty segment always goes in whole; later ones only while the map
        // has room for all their records.
        if !map.is_empty() && map.len() + segment_record_estimate(segment) > keys_max {
            break;
        }
        for_each_batch(&*segment.file()?, segment.size, pacer, &mut |header, bytes| {
            if header.is_control() || is_aborted(&plan.aborted, header) {
                return Ok(0);
            }
            let payload = records::payload(header, bytes)?;
            for record in records::parse(&payload, header.record_count)? {
                if let Some(key) = record.key {
                    map.insert(key_hash(&payload[key]), header.base_offset + i64::from(record.offset_delta));
                }
            }
            Ok(0)
        })?;
        map_end = segment.end;
    }
    Ok((map, map_end))
}

/// An upper bound on a segment's record count that needs no read: its smallest record
/// is a few bytes, so its size bounds it (loosely; the offsets range bounds it too).
fn segment_record_estimate(segment: &CleanableSegment) -> usize {
    ((segment.end - segment.base) as u64).min(segment.size / 8) as usize
}

/// Which records of a segment stay.
struct RecordFilter<'a> {
    aborted: &'a [crate::log::AbortedTransaction],
    map: &'a HashMap<u128, i64>,
    tombstones_removable: bool,
    delete_horizon_ms: i64,
    delete_retention_ms: i64,
    tombstones_due_ms: &'a mut Option<i64>,
    /// Producers whose current transaction still has records in the cleaned log (the
    /// segments are visited in offset order, so a transaction's data before its marker).
    transactions_with_data: &'a mut HashSet<i64>,
}

impl RecordFilter<'_> {
    /// Whether a transaction marker stays. As in Kafka, it goes once no record of its
    /// transaction is left and, like a tombstone, it has been through a pass and is older
    /// than `delete.retention.ms` (so a consumer that read its records sees it too).
    fn keeps_marker(&mut self, header: &BatchHeader) -> bool {
        if self.transactions_with_data.remove(&header.producer_id) {
            return true;
        }
        if self.tombstones_removable && header.max_timestamp < self.delete_horizon_ms {
            return false;
        }
        let due = header.max_timestamp.saturating_add(self.delete_retention_ms);
        *self.tombstones_due_ms = Some(self.tombstones_due_ms.map_or(due, |d| d.min(due)));
        true
    }

    fn keeps(&mut self, header: &BatchHeader, key: Option<&[u8]>, tombstone: bool, offset: i64) -> bool {
        let Some(key) = key else { return false };
        if self.map.get(&key_hash(key)).is_some_and(|&latest| latest > offset) {
            return false;
        }
        if tombstone {
            if self.tombstones_removable && header.max_timestamp < self.delete_horizon_ms {
                return false;
            }
            let due = header.max_timestamp.saturating_add(self.delete_retention_ms);
            *self.tombstones_due_ms = Some(self.tombstones_due_ms.map_or(due, |d| d.min(due)));
        }
        true
    }
}

/// Writes the cleaned copy of `segment` into `cleaning_dir`, fsynced. None when nothing
/// in it would change (no rewrite needed).
fn copy_cleaned(
    partition: &Partition,
    segment: &CleanableSegment,
    cleaning_dir: &std::path::Path,
    filter: &mut RecordFilter,
    now_ms: i64,
    pacer: &mut IoPacer,
    stats: &mut CleanStats,
) -> io::Result<Option<Segment>> {
    let _ = std::fs::remove_file(cleaning_dir.join(crate::segment::log_file_name(segment.base)));
    let mut cleaned = Segment::create(cleaning_dir, segment.base)?;
    let mut changed = false;
    let mut removed = 0u64;
    for_each_batch(&*segment.file()?, segment.size, pacer, &mut |header, bytes| {
        let written = bytes.len() as u64;
        if header.is_control() {
            if !filter.keeps_marker(header) {
                changed = true;
                return Ok(0);
            }
            return cleaned.append(&bytes[..16], &bytes[16..], header, now_ms, segment.size, false).map(|_| written);
        }
        if is_aborted(filter.aborted, header) {
            // An aborted transaction's records go whole, as Kafka's cleaner drops them.
            changed = true;
            removed += header.record_count as u64;
            return Ok(0);
        }
        let payload = records::payload(header, bytes)?;
        let views = records::parse(&payload, header.record_count)?;
        let mut kept = Vec::new();
        let mut kept_count = 0i32;
        for view in &views {
            let key = view.key.clone().map(|k| &payload[k]);
            if filter.keeps(header, key, view.tombstone, header.base_offset + i64::from(view.offset_delta)) {
                kept.extend_from_slice(&payload[view.bytes.clone()]);
                kept_count += 1;
            }
        }
        if kept_count == header.record_count {
            if header.is_transactional() {
                filter.transactions_with_data.insert(header.producer_id);
            }
            return cleaned.append(&bytes[..16], &bytes[16..], header, now_ms, segment.size, false).map(|_| written);
        }
        changed = true;
        removed += (header.record_count - kept_count) as u64;
        let last_of_producer =
            header.has_producer_id() && partition.last_producer_batch(header.producer_id) == Some(header.base_offset);
        if kept_count == 0 && !last_of_producer {
            return Ok(0);
        }
        // A kept header-only batch still opens its transaction on a replay: its marker stays.
        if header.is_transactional() {
            filter.transactions_with_data.insert(header.producer_id);
        }
        let rebuilt = records::rebuild(bytes, header, &kept, kept_count)?;
        let rebuilt_header = batch::validate_stored_batch(&rebuilt)
            .map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error.to_string()))?;
        let written = rebuilt.len() as u64;
        cleaned.append(&rebuilt[..16], &rebuilt[16..], &rebuilt_header, now_ms, segment.size, false).map(|_| written)
    })?;
    if !changed {
        cleaned.delete_files()?;
        return Ok(None);
    }
    cleaned.seal(false)?;
    stats.bytes_before += segment.size;
    stats.bytes_after += cleaned.size_bytes();
    stats.records_removed += removed;
    Ok(Some(cleaned))
}

/// Whether `header` is a batch of an aborted transaction.
fn is_aborted(aborted: &[crate::log::AbortedTransaction], header: &BatchHeader) -> bool {
    header.is_transactional()
        && !header.is_control()
        && aborted.iter().any(|a| {
            a.producer_id == header.producer_id
                && a.first_offset <= header.base_offset
                && header.base_offset < a.last_offset
        })
}

/// Calls `visit` with every batch of the first `size` bytes of `file`, in order; `visit`
/// returns the bytes it wrote, paced with the bytes read.
fn for_each_batch(
    file: &File,
    size: u64,
    pacer: &mut IoPacer,
    visit: &mut dyn FnMut(&BatchHeader, &[u8]) -> io::Result<u64>,
) -> io::Result<()> {
    let mut position = 0u64;
    let mut buffer = Vec::new();
    while position < size {
        let want = ((size - position) as usize).min(READ_CHUNK_BYTES.max(buffer_need(file, position, size)?));
        buffer.resize(want, 0);
        file.read_exact_at(&mut buffer, position)?;
        pacer.spend(want as u64);
        let mut iter = BatchIter::new(&buffer);
        for item in iter.by_ref() {
            let (header, range) = item.map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
            let written = visit(&header, &buffer[range])?;
            pacer.spend(written);
        }
        if iter.position() == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "segment ends in a partial batch"));
        }
        position += iter.position() as u64;
    }
    Ok(())
}

/// The size of the batch at `position`, so a chunk always holds at least one whole batch.
fn buffer_need(file: &File, position: u64, size: u64) -> io::Result<usize> {
    if size - position < BATCH_HEADER_BYTES as u64 {
        return Ok(0);
    }
    let mut header = [0u8; BATCH_HEADER_BYTES];
    file.read_exact_at(&mut header, position)?;
    let header = BatchHeader::parse(&header).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
    Ok(header.total_bytes())
}
