//! The reader: whole batches from the segments, never past the read limit (the high
//! watermark, the last stable offset for `read_committed`, the log end for a follower),
//! the timestamp lookups of ListOffsets, and the transaction state a `read_committed` fetch
//! or DescribeProducers needs.
//!
//! Why a module: reads must not hold up the writers. [`Partition::read`] takes the log's
//! lock only to locate the bytes, then reads the file without it, so appends and fsync
//! rounds never wait for a disk read.
//!
//! Durability contract: reads write nothing, so a crash during one leaves nothing to
//! repair. They return only bytes below the read limit: below the high watermark, which by
//! default moves only over fsynced data, a consumer never sees what a crash can take back;
//! only a follower ([`ReadLimit::LogEnd`]) reads past it.

use std::fs::File;
use std::io;
use std::sync::Arc;

use bytes::Bytes;

use super::{first_readable_offset, last_stable_offset, AbortedTransaction, Partition, ReadError, ReadLimit};
use crate::batch::{self, BatchIter};
use crate::segment::{ReadMode, Segment, INDEX_INTERVAL_BYTES};

/// A read never returns more than this, whatever the client asks for.
pub const READ_BYTES_MAX: usize = 64 * 1024 * 1024;
/// A blocking read that ends at least this far before the log end serves a reader catching
/// up on a backlog: what it used is dropped from the page cache, however it was served
/// (`Chunk::release`).
/// Its pages are often cached only because the fetch's cache-only probe started reading
/// them (`RWF_NOWAIT` starts the I/O of what it misses); kept, they would fill a capped page
/// cache with consumed backlog and push out the log tails that producers and tailing
/// consumers use. Reads nearer the end keep what was cached (only what came from the disk is
/// dropped, see [`Segment::read_at`]).
pub const BACKLOG_DISTANCE_BYTES: u64 = 4 * 1024 * 1024;
/// Reads shorter than this are copied into memory: locating a file range costs a few small
/// reads of batch headers, more than copying a short read.
pub const FILE_RANGE_BYTES_MIN: usize = 64 * 1024;
/// A scan for batch boundaries reads this much at a time: one offset-index interval and the
/// header after it, so locating a boundary from its index entry takes one read.
const HEADER_SCAN_BYTES: usize = 2 * INDEX_INTERVAL_BYTES as usize + batch::BATCH_HEADER_BYTES;
/// A read locates its segment again at most this many times when the segment's file, closed
/// by the budget of open files, was removed before it could be reopened.
const LOCATE_AGAIN_MAX: u32 = 3;

/// Whole batches as they lie in a segment file, for a response that sends them from the
/// page cache without copying them through memory (`sendfile`). The bytes below the high
/// watermark are never rewritten in place (compaction, retention and a cut below the high
/// watermark replace or delete whole files, and the open file keeps its data), so the range
/// stays valid while it is held.
#[derive(Debug, Clone)]
pub struct FileRange {
    pub file: Arc<File>,
    pub position: u64,
    pub length: usize,
}

/// The pieces of a read ([`Partition::read_parts_until`]) as one buffer: the piece itself
/// when there is one, else a copy of them all.
pub fn joined(mut parts: Vec<Bytes>) -> Bytes {
    match parts.len() {
        0 => Bytes::new(),
        1 => parts.pop().expect("one part"),
        _ => {
            let mut joined = bytes::BytesMut::with_capacity(parts.iter().map(Bytes::len).sum());
            for part in &parts {
                joined.extend_from_slice(part);
            }
            joined.freeze()
        }
    }
}

impl Partition {
    /// Reads whole batches starting with the one containing `offset`, up to `max_bytes`
    /// (at least one batch when `min_one_batch`) and never past the high watermark. With
    /// [`ReadMode::CachedOnly`], data not in the page cache is [`ReadError::WouldBlock`].
    pub fn read(&self, offset: i64, max_bytes: usize, min_one_batch: bool, mode: ReadMode) -> Result<Bytes, ReadError> {
        self.read_until(offset, max_bytes, min_one_batch, ReadLimit::HighWatermark, mode)
    }

    /// Like [`Partition::read`] but up to the log end: what a follower fetches.
    pub fn read_for_replica(&self, offset: i64, max_bytes: usize, mode: ReadMode) -> Result<Bytes, ReadError> {
        self.read_until(offset, max_bytes, true, ReadLimit::LogEnd, mode)
    }

    /// Reads whole batches from `offset` up to `limit` (see [`Partition::read`]).
    pub fn read_until(
        &self,
        offset: i64,
        max_bytes: usize,
        min_one_batch: bool,
        limit: ReadLimit,
        mode: ReadMode,
    ) -> Result<Bytes, ReadError> {
        Ok(joined(self.read_parts_until(offset, max_bytes, min_one_batch, limit, mode)?))
    }

    /// What [`Partition::read_until`] reads, as the pieces it lies in (tail chunks, the
    /// file's part before them), each whole batches, in order and not empty: a response
    /// sends them one after the other without joining them in a new buffer.
    pub fn read_parts_until(
        &self,
        offset: i64,
        max_bytes: usize,
        min_one_batch: bool,
        limit: ReadLimit,
        mode: ReadMode,
    ) -> Result<Vec<Bytes>, ReadError> {
        let max_bytes = max_bytes.min(READ_BYTES_MAX);
        let mut offset = offset;
        let mut located_again = 0;
        // A read stops where its source ends (a tail chunk, the file's part before the
        // tail): the segment's next part is read on, up to `max_bytes`, so a reader crossing
        // such an end gets what one read of the file would give it.
        let mut parts: Vec<Bytes> = Vec::new();
        let mut taken = 0;
        loop {
            let first = parts.is_empty();
            match self.read_segment(offset, max_bytes - taken, min_one_batch && first, limit, mode) {
                Ok((batches, next)) => {
                    taken += batches.len();
                    if !batches.is_empty() {
                        parts.push(batches);
                    }
                    match next {
                        // After a compaction gap at a segment's end, or a source's end.
                        Some(next) if taken < max_bytes => offset = next,
                        _ => break,
                    }
                }
                // The segment's file was closed, and retention, compaction or a cut removed
                // or replaced it before it could be opened again, or a follower's read
                // raced a cut: locate the offset again.
                Err(ReadError::Storage(error))
                    if error.kind() == io::ErrorKind::NotFound && located_again < LOCATE_AGAIN_MAX =>
                {
                    located_again += 1;
                }
                // What was read is answered; the rest is the next read's.
                Err(_) if !first => break,
                Err(error) => return Err(error),
            }
        }
        Ok(parts)
    }

    /// One source's part of [`Partition::read_until`]: the batches, and where the log goes on
    /// below the read limit when the read took its source (a tail chunk, or the file's part
    /// before the tail) to the end and the segment goes on, or, with no batches, the next
    /// segment's base offset after a compaction gap at a segment's end.
    fn read_segment(
        &self,
        offset: i64,
        max_bytes: usize,
        min_one_batch: bool,
        limit: ReadLimit,
        mode: ReadMode,
    ) -> Result<(Bytes, Option<i64>), ReadError> {
        let located = {
            let state = self.state.lock();
            if state.failed {
                return Err(ReadError::Offline);
            }
            if offset < state.log_start_offset && offset >= first_readable_offset(&state) {
                return Err(ReadError::InRemoteTier { offset, local_log_start_offset: state.log_start_offset });
            }
            if offset < state.log_start_offset || offset > state.log_end_offset {
                return Err(ReadError::OffsetOutOfRange {
                    offset,
                    log_start_offset: first_readable_offset(&state),
                    log_end_offset: state.log_end_offset,
                });
            }
            // A follower's read may reach past the high watermark, where a cut rewrites the
            // file in place: it is checked against the log's generation once read.
            let generation = (limit == ReadLimit::LogEnd).then_some(state.sync_generation);
            let limit = match limit {
                ReadLimit::HighWatermark => state.high_watermark,
                ReadLimit::LastStable => last_stable_offset(&state),
                ReadLimit::LogEnd => state.log_end_offset,
            };
            if offset >= limit {
                return Ok((Bytes::new(), None));
            }
            let (_, segment) = state.segments.range(..=offset).next_back().expect("offset is inside the log");
            // Past the segment's last batch but before the next segment: a compaction gap.
            let past_last_batch = segment.next_offset() <= offset;
            let next = state.segments.range(offset + 1..).next().map(|(&base, _)| base);
            if let Some(next) = next.filter(|&next| past_last_batch && next < limit) {
                return Ok((Bytes::new(), Some(next)));
            }
            // At least this many bytes lie past the segment's end (the active segment's).
            let bytes_after = match next {
                None => 0,
                Some(_) => state.segments.values().next_back().map_or(0, Segment::size_bytes),
            };
            let start = segment.position_at_or_before(offset);
            let size = segment.size_bytes();
            // A tail read takes the bytes of the tail chunk it starts in, without a copy
            // (the first batch of every chunk is indexed, so `start` is in the chunk of
            // `offset`'s batch or before it); a read that starts in the file reads up to
            // where memory starts, all of which the file holds.
            let (source, end) = match segment.memory_from(start) {
                Some(tail) => {
                    let end = start + tail.len() as u64;
                    (Ok(ReadSource::Memory(tail)), end)
                }
                None => {
                    let memory_start = segment.memory_start();
                    if memory_start.is_some() {
                        segment.note_reader_behind();
                    }
                    let end = memory_start.unwrap_or(size);
                    let source = match segment.cached_file() {
                        Some(file) => Ok(ReadSource::File(file)),
                        // Closed by the budget of open files: opening may wait for the disk.
                        None if mode == ReadMode::CachedOnly => return Err(ReadError::WouldBlock),
                        None => Err(segment.file_slot()),
                    };
                    (source, end)
                }
            };
            // The segment goes on past this source (in memory): a read that takes the source
            // to its end continues there (`read_until`). A segment's end stops a read, as in
            // Kafka, and as a `sendfile` range stops (`read_range_cached`).
            let goes_on = end < size;
            let bytes_after = bytes_after + (size - end);
            (source, SegmentRead { start, end, bytes_after }, limit, generation, goes_on)
        };
        let (source, read, limit, generation, goes_on) = located;
        // A closed file is opened without the lock (`NotFound` if the segment went since).
        let source = match source {
            Ok(source) => source,
            Err((slot, path)) => ReadSource::File(slot.open(&path).map_err(ReadError::Storage)?),
        };
        let (batches, next) =
            read_batches(&source, read, offset..limit, max_bytes, min_one_batch, mode).map_err(|error| {
                if error.kind() == io::ErrorKind::WouldBlock {
                    ReadError::WouldBlock
                } else {
                    ReadError::Storage(error)
                }
            })?;
        if generation.is_some_and(|generation| generation != self.state.lock().sync_generation) {
            // Cut (or reset) since it was located: what was read may mix two logs.
            return Err(ReadError::Storage(io::Error::new(io::ErrorKind::NotFound, "the log was cut while read")));
        }
        Ok((batches, next.filter(|&next| goes_on && next < limit)))
    }

    /// Where the batches [`Partition::read_until`] would return lie in their segment file,
    /// when they are at least [`FILE_RANGE_BYTES_MIN`] bytes, all in the page cache, and
    /// below a high watermark or last stable offset (`limit` is not
    /// [`ReadLimit::LogEnd`]: past the high watermark a log may be truncated). `None` in
    /// every other case, errors included: the caller then reads with `read_until`, which
    /// answers them. Only the locating happens under the log's lock; the header reads and
    /// the page-cache check (`cachestat`) happen after, without waiting for a disk.
    pub fn read_range_cached(
        &self,
        offset: i64,
        max_bytes: usize,
        min_one_batch: bool,
        limit: ReadLimit,
    ) -> Option<FileRange> {
        assert!(limit != ReadLimit::LogEnd, "a follower's read may reach bytes a truncation rewrites");
        let max_bytes = max_bytes.min(READ_BYTES_MAX);
        let (file, hints) = {
            let state = self.state.lock();
            if state.failed || offset < state.log_start_offset || offset > state.log_end_offset {
                return None;
            }
            let limit = match limit {
                ReadLimit::LastStable => last_stable_offset(&state),
                _ => state.high_watermark,
            };
            let (_, segment) = state.segments.range(..=offset).next_back()?;
            let start = segment.position_at_or_before(offset);
            // Only the file's part: bytes in memory are sent from there (`read_until`).
            let memory_start = segment.memory_start();
            if memory_start.is_some_and(|memory_start| start < memory_start) {
                segment.note_reader_behind();
            }
            let size = memory_start.unwrap_or(segment.size_bytes());
            if offset >= limit
                || segment.next_offset() <= offset
                || start >= size
                || size - start < FILE_RANGE_BYTES_MIN as u64
            {
                return None;
            }
            let hints = RangeHints {
                offset,
                limit,
                start,
                size,
                limit_boundary: (limit < segment.next_offset()).then(|| segment.position_at_or_before(limit)),
                cut_boundary: segment.boundary_at_or_before(start + max_bytes as u64),
            };
            // A file the budget of open files closed is left to `read_until`'s blocking read.
            (segment.cached_file()?, hints)
        };
        let (position, length) = locate_range(&file, &hints, max_bytes, min_one_batch).ok()??;
        if length < FILE_RANGE_BYTES_MIN || !all_cached(&file, position, length as u64) {
            return None;
        }
        Some(FileRange { file, position, length })
    }

    /// The first batch whose max timestamp is >= `timestamp`, for ListOffsets. Only the
    /// choice of segments happens under the log's lock: the scans (up to 4 MiB each, from
    /// the disk when cold) read the files after it, as a fetch does, so appends and fsync
    /// rounds do not wait for them.
    pub fn batch_for_timestamp(&self, timestamp: i64) -> Result<Option<Bytes>, ReadError> {
        let (candidates, high_watermark, log_start_offset) = {
            let mut state = self.lock_settled()?;
            // The scan reads the file: the active segment's bytes in memory are written first.
            state.segments.values_mut().next_back().expect("active segment").flush()?;
            let candidates: Vec<_> = state
                .segments
                .values()
                .filter(|s| s.max_timestamp() >= timestamp && s.next_offset() > state.log_start_offset)
                .map(|s| (s.file_slot(), s.position_for_timestamp(timestamp), s.size_bytes()))
                .collect();
            (candidates, state.high_watermark, state.log_start_offset)
        };
        for ((slot, path), start, size) in candidates {
            let file = match slot.open(&path) {
                // Deleted by retention since: its batches are below the log start now.
                Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
                opened => opened?,
            };
            let mut hit = None;
            Segment::scan_file(&file, start, size, &mut |header, position| {
                if header.base_offset >= high_watermark {
                    return false;
                }
                if header.max_timestamp >= timestamp && header.last_offset() >= log_start_offset {
                    hit = Some((position, header.total_bytes()));
                    return false;
                }
                true
            })?;
            if let Some((position, length)) = hit {
                return Ok(Some(Segment::read_at(&file, position, length, ReadMode::MayBlock, false)?));
            }
        }
        Ok(None)
    }

    /// The batch holding the largest timestamp in the log (ListOffsets MAX_TIMESTAMP).
    pub fn batch_with_max_timestamp(&self) -> Result<Option<Bytes>, ReadError> {
        let offset = {
            let state = self.state.lock();
            let best = state
                .segments
                .values()
                .filter(|s| !s.is_empty() && s.offset_of_max_timestamp() >= state.log_start_offset)
                .max_by_key(|s| s.max_timestamp());
            match best {
                Some(segment) if segment.offset_of_max_timestamp() < state.high_watermark => {
                    segment.offset_of_max_timestamp()
                }
                _ => return Ok(None),
            }
        };
        let batches = self.read(offset, 1, true, ReadMode::MayBlock)?;
        let Some(Ok((header, range))) = BatchIter::new(&batches).next() else { return Ok(None) };
        assert!(header.base_offset <= offset && offset <= header.last_offset());
        Ok(Some(batches.slice(range)))
    }

    /// The aborted transactions a `read_committed` fetch of `[from, to)` must name: those
    /// whose records may lie in that range.
    pub fn aborted_transactions(&self, from: i64, to: i64) -> Vec<AbortedTransaction> {
        let state = self.state.lock();
        state.aborted.iter().filter(|a| a.last_offset >= from && a.first_offset < to).copied().collect()
    }

    /// Whether `producer_id` has a transaction open in this partition.
    pub fn has_open_transaction(&self, producer_id: i64) -> bool {
        self.state.lock().producers.open_transaction(producer_id).is_some()
    }

    /// The producers with transactions open in this partition: (producer id, epoch,
    /// first offset), for DescribeProducers.
    pub fn open_transactions(&self) -> Vec<(i64, i16, i64)> {
        let state = self.state.lock();
        state.producers.open_transactions()
    }

    /// Every producer's state in this partition (DescribeProducers).
    pub fn producers(&self) -> Vec<crate::producer_state::ProducerSummary> {
        self.state.lock().producers.summaries()
    }
}

/// Where in a segment a read goes: from `start` (a batch boundary) to the file position
/// `end`, with at least `bytes_after` more bytes of the log past the segment.
struct SegmentRead {
    start: u64,
    end: u64,
    bytes_after: u64,
}

/// Where a read's bytes come from: the segment's file, or the bytes from the read's start to
/// the end of the tail chunk holding it (`segment_tail.rs`, no copy).
enum ReadSource {
    File(Arc<File>),
    Memory(Bytes),
}

/// Bytes a read took from its source, and where in the segment file they start when the
/// reader must drop what it uses of them from the page cache (they came from the disk, or
/// they are backlog: see [`Segment::read_at`]).
struct Chunk<'a> {
    bytes: Bytes,
    release: Option<(&'a File, u64)>,
}

impl Chunk<'_> {
    /// Drops from the page cache the pages wholly before the last [`INDEX_INTERVAL_BYTES`]
    /// of the chunk's first `used` bytes (the batches returned or passed over), when the
    /// read must not leave them cached. The rest stays: the reader's next read starts at the
    /// index entry at or before its next batch, less than [`INDEX_INTERVAL_BYTES`] before
    /// `used` ends (`Segment::track_appended`), and dropping its first pages made every next
    /// backlog read of the partition miss the page cache and queue for the blocking pool
    /// (at 320k msg/s nearly every fetch, consumers at 60-70 MB/s), and it drops
    /// them in its turn.
    fn release(&self, used: usize) {
        if let Some((file, position)) = self.release {
            let keep_from = (used as u64).saturating_sub(INDEX_INTERVAL_BYTES);
            if keep_from > 0 {
                Segment::release_read(file, position, keep_from);
            }
        }
    }
}

/// Reads `length` bytes at `position`; a blocking read of the backlog (see
/// [`BACKLOG_DISTANCE_BYTES`]) is to drop what it uses from the page cache.
fn read_chunk<'a>(
    source: &'a ReadSource,
    read: &SegmentRead,
    position: u64,
    length: usize,
    mode: ReadMode,
) -> io::Result<Chunk<'a>> {
    match source {
        ReadSource::File(file) => {
            let behind_log_end = read.end.saturating_sub(position + length as u64) + read.bytes_after;
            let backlog = behind_log_end >= BACKLOG_DISTANCE_BYTES;
            let (bytes, release) = Segment::read_keeping_cached(file, position, length, mode, backlog)?;
            Ok(Chunk { bytes, release: release.then_some((&**file, position)) })
        }
        ReadSource::Memory(tail) => {
            let from = (position - read.start) as usize;
            tail.get(from..from + length)
                .map(|_| Chunk { bytes: tail.slice(from..from + length), release: None })
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "a batch runs past the segment's end"))
        }
    }
}

/// Reads whole batches holding `offsets` from `read.start` (a batch boundary at or before
/// `offsets.start`) to `read.end`. Batches at or past `offsets.end` are left out. With the
/// batches, the offset after the last of them when they reach `read.end` (the log may go on
/// in another source).
fn read_batches(
    source: &ReadSource,
    read: SegmentRead,
    offsets: std::ops::Range<i64>,
    max_bytes: usize,
    min_one_batch: bool,
    mode: ReadMode,
) -> io::Result<(Bytes, Option<i64>)> {
    let offset = offsets.start;
    let (mut start, end) = (read.start, read.end);
    while start < end {
        let length =
            ((end - start) as usize).min(max_bytes.max(batch::BATCH_HEADER_BYTES) + INDEX_INTERVAL_BYTES as usize);
        let piece = read_chunk(source, &read, start, length, mode)?;
        let chunk = &piece.bytes;
        let mut taken: Option<(usize, usize)> = None;
        let mut next_offset = offset;
        let mut iter = BatchIter::new(chunk);
        let mut stopped = false;
        for item in iter.by_ref() {
            let (header, range) = item.map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
            if header.last_offset() < offset {
                continue;
            }
            if header.base_offset >= offsets.end {
                piece.release(range.start);
                return Ok((taken.map_or_else(Bytes::new, |(begin, end)| chunk.slice(begin..end)), None));
            }
            match taken {
                None if range.len() > max_bytes && !min_one_batch => {
                    piece.release(range.start);
                    return Ok((Bytes::new(), None));
                }
                None => taken = Some((range.start, range.end)),
                Some((begin, _)) if range.end - begin > max_bytes => {
                    stopped = true;
                    break;
                }
                Some((begin, _)) => taken = Some((begin, range.end)),
            }
            next_offset = header.last_offset() + 1;
        }
        if let Some((begin, taken_end)) = taken {
            piece.release(taken_end);
            let at_end = !stopped && start + taken_end as u64 == end;
            return Ok((chunk.slice(begin..taken_end), at_end.then_some(next_offset)));
        }
        match iter.position() {
            0 => {
                // Not even one whole batch in the chunk: read the batch at `start` alone.
                let header = batch::BatchHeader::parse(chunk)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
                if header.base_offset >= offsets.end {
                    return Ok((Bytes::new(), None));
                }
                if header.last_offset() >= offset {
                    if !min_one_batch && header.total_bytes() > max_bytes {
                        return Ok((Bytes::new(), None));
                    }
                    let at_end = start + header.total_bytes() as u64 == end;
                    let batch = read_chunk(source, &read, start, header.total_bytes(), mode)?;
                    batch.release(batch.bytes.len());
                    return Ok((batch.bytes, at_end.then_some(header.last_offset() + 1)));
                }
                start += header.total_bytes() as u64;
            }
            consumed => {
                piece.release(consumed);
                start += consumed as u64;
            }
        }
    }
    Ok((Bytes::new(), None))
}

/// Reads a [`FileRange`]'s bytes into memory (waiting for the disk if it must): for a
/// connection that cannot send a file as it is.
pub fn read_file_range(file: &File, position: u64, length: usize) -> io::Result<Bytes> {
    Segment::read_at(file, position, length, ReadMode::MayBlock, false)
}

/// What [`Partition::read_range_cached`] learns under the log's lock: index entries (batch
/// boundaries) from which to scan for the range's ends.
struct RangeHints {
    offset: i64,
    /// The read limit (high watermark or last stable offset).
    limit: i64,
    /// A boundary at or before the batch holding `offset`.
    start: u64,
    /// The segment's size; every byte of it is below the read limit when `limit_boundary`
    /// is `None`.
    size: u64,
    /// A boundary at or before the batch starting at `limit`, when that is in this segment.
    limit_boundary: Option<u64>,
    /// A boundary at or before `start + max_bytes`.
    cut_boundary: u64,
}

/// (position, length) of the whole batches from the one holding `hints.offset`, below the
/// read limit, within `max_bytes` (the first batch whole when `min_one_batch`); `None` when
/// that is no batch at all. Reads only headers, from the page cache only.
fn locate_range(
    file: &File,
    hints: &RangeHints,
    max_bytes: usize,
    min_one_batch: bool,
) -> io::Result<Option<(u64, usize)>> {
    let Some((start, first)) =
        scan_headers(file, hints.start, hints.size, |header, _| header.last_offset() >= hints.offset)?
    else {
        return Ok(None);
    };
    if first.base_offset >= hints.limit {
        return Ok(None);
    }
    let end = match hints.limit_boundary {
        None => hints.size,
        Some(boundary) => {
            let found =
                scan_headers(file, boundary.max(start), hints.size, |header, _| header.base_offset >= hints.limit)?;
            found.map_or(hints.size, |(position, _)| position)
        }
    };
    let cut = start + max_bytes as u64;
    let end = if end <= cut {
        end
    } else {
        // The first batch that does not end by `cut` starts where the range ends.
        let from = hints.cut_boundary.max(start);
        let found = scan_headers(file, from, end, |header, position| position + header.total_bytes() as u64 > cut)?;
        match found {
            Some((position, _)) if position > start => position,
            Some(_) if min_one_batch => start + first.total_bytes() as u64,
            Some(_) => return Ok(None),
            None => end,
        }
    };
    assert!(start < end && end <= hints.size, "a located range holds whole batches of the segment");
    Ok(Some((start, (end - start) as usize)))
}

/// Scans batch headers from the boundary `position` up to `end`, reading from the page cache
/// only; the first (position, header) for which `found` holds, `None` past `end`.
fn scan_headers(
    file: &File,
    mut position: u64,
    end: u64,
    mut found: impl FnMut(&batch::BatchHeader, u64) -> bool,
) -> io::Result<Option<(u64, batch::BatchHeader)>> {
    let invalid = |e: batch::BatchError| io::Error::new(io::ErrorKind::InvalidData, e.to_string());
    while position < end {
        let length = ((end - position) as usize).min(HEADER_SCAN_BYTES);
        let chunk = Segment::read_at(file, position, length, ReadMode::CachedOnly, false)?;
        let mut at = 0usize;
        while at + batch::BATCH_HEADER_BYTES <= chunk.len() {
            let header = batch::BatchHeader::parse(&chunk[at..]).map_err(invalid)?;
            if found(&header, position + at as u64) {
                return Ok(Some((position + at as u64, header)));
            }
            at += header.total_bytes();
        }
        if at == 0 {
            // Fewer than a header's bytes before `end`: the segment ends mid-batch.
            return Err(io::Error::new(io::ErrorKind::InvalidData, "a batch header runs past the segment's end"));
        }
        position += at as u64;
    }
    Ok(None)
}

/// Whether every page of `file` in [position, position + length) is in the page cache
/// (`cachestat`, Linux 6.5). False when that cannot be told.
fn all_cached(file: &File, position: u64, length: u64) -> bool {
    assert!(length > 0);
    crate::page_cache::missing_pages(file, position, length) == Some(0)
}
