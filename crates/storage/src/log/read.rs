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

use std::io;

use bytes::Bytes;

use super::{first_readable_offset, last_stable_offset, AbortedTransaction, Partition, ReadError, ReadLimit};
use crate::batch::{self, BatchIter};
use crate::segment::{ReadMode, Segment, INDEX_INTERVAL_BYTES};

/// A read never returns more than this, whatever the client asks for.
pub const READ_BYTES_MAX: usize = 64 * 1024 * 1024;
/// A blocking read that ends at least this far before the log end serves a reader catching
/// up on a backlog: what it read is dropped from the page cache, however it was served.
/// Its pages are often cached only because the fetch's cache-only probe started reading
/// them (`RWF_NOWAIT` starts the I/O of what it misses); kept, they would fill a capped page
/// cache with consumed backlog and push out the log tails that producers and tailing
/// consumers use. Reads nearer the end keep what was cached (only what came from the disk is
/// dropped, see [`Segment::read_at`]).
pub const BACKLOG_DISTANCE_BYTES: u64 = 4 * 1024 * 1024;

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
        let max_bytes = max_bytes.min(READ_BYTES_MAX);
        let mut offset = offset;
        loop {
            let (batches, next_segment) = self.read_segment(offset, max_bytes, min_one_batch, limit, mode)?;
            match next_segment {
                // Nothing at or after `offset` in its segment (compaction left a gap at
                // its end): continue in the next one, as a consumer expects.
                Some(next) => offset = next,
                None => return Ok(batches),
            }
        }
    }

    /// One segment's part of [`Partition::read_until`]: the batches, and the next
    /// segment's base offset when that is still below the read limit.
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
            let read =
                SegmentRead { start: segment.position_at_or_before(offset), end: segment.size_bytes(), bytes_after };
            (segment.file().clone(), read, limit)
        };
        let (file, read, limit) = located;
        let batches = read_batches(&file, read, offset..limit, max_bytes, min_one_batch, mode).map_err(|error| {
            if error.kind() == io::ErrorKind::WouldBlock {
                ReadError::WouldBlock
            } else {
                ReadError::Storage(error)
            }
        })?;
        Ok((batches, None))
    }

    /// The first batch whose max timestamp is >= `timestamp`, for ListOffsets.
    pub fn batch_for_timestamp(&self, timestamp: i64) -> Result<Option<Bytes>, ReadError> {
        let located = {
            let state = self.state.lock();
            let mut found = None;
            for segment in state.segments.values() {
                if segment.max_timestamp() < timestamp || segment.next_offset() <= state.log_start_offset {
                    continue;
                }
                let mut hit = None;
                let start = segment.position_for_timestamp(timestamp);
                let high_watermark = state.high_watermark;
                segment.scan_from(start, &mut |header, position| {
                    if header.base_offset >= high_watermark {
                        return false;
                    }
                    if header.max_timestamp >= timestamp && header.last_offset() >= state.log_start_offset {
                        hit = Some((position, header.total_bytes()));
                        return false;
                    }
                    true
                })?;
                if let Some((position, length)) = hit {
                    found = Some((segment.file().clone(), position, length));
                    break;
                }
            }
            found
        };
        match located {
            None => Ok(None),
            Some((file, position, length)) => {
                Ok(Some(Segment::read_at(&file, position, length, ReadMode::MayBlock, false)?))
            }
        }
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

/// Reads `length` bytes at `position`; a blocking read of the backlog (see
/// [`BACKLOG_DISTANCE_BYTES`]) drops them from the page cache.
fn read_chunk(
    file: &std::fs::File,
    read: &SegmentRead,
    position: u64,
    length: usize,
    mode: ReadMode,
) -> io::Result<Bytes> {
    let behind_log_end = read.end.saturating_sub(position + length as u64) + read.bytes_after;
    Segment::read_at(file, position, length, mode, behind_log_end >= BACKLOG_DISTANCE_BYTES)
}

/// Reads whole batches holding `offsets` from `read.start` (a batch boundary at or before
/// `offsets.start`) to `read.end`. Batches at or past `offsets.end` are left out.
fn read_batches(
    file: &std::fs::File,
    read: SegmentRead,
    offsets: std::ops::Range<i64>,
    max_bytes: usize,
    min_one_batch: bool,
    mode: ReadMode,
) -> io::Result<Bytes> {
    let offset = offsets.start;
    let (mut start, end) = (read.start, read.end);
    while start < end {
        let length =
            ((end - start) as usize).min(max_bytes.max(batch::BATCH_HEADER_BYTES) + INDEX_INTERVAL_BYTES as usize);
        let chunk = read_chunk(file, &read, start, length, mode)?;
        let mut taken: Option<(usize, usize)> = None;
        let mut iter = BatchIter::new(&chunk);
        for item in iter.by_ref() {
            let (header, range) = item.map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
            if header.last_offset() < offset {
                continue;
            }
            if header.base_offset >= offsets.end {
                return Ok(taken.map_or_else(Bytes::new, |(begin, end)| chunk.slice(begin..end)));
            }
            match taken {
                None if range.len() > max_bytes && !min_one_batch => return Ok(Bytes::new()),
                None => taken = Some((range.start, range.end)),
                Some((begin, _)) if range.end - begin > max_bytes => break,
                Some((begin, _)) => taken = Some((begin, range.end)),
            }
        }
        if let Some((begin, end)) = taken {
            return Ok(chunk.slice(begin..end));
        }
        match iter.position() {
            0 => {
                // Not even one whole batch in the chunk: read the batch at `start` alone.
                let header = batch::BatchHeader::parse(&chunk)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
                if header.base_offset >= offsets.end {
                    return Ok(Bytes::new());
                }
                if header.last_offset() >= offset {
                    if !min_one_batch && header.total_bytes() > max_bytes {
                        return Ok(Bytes::new());
                    }
                    return read_chunk(file, &read, start, header.total_bytes(), mode);
                }
                start += header.total_bytes() as u64;
            }
            consumed => start += consumed as u64,
        }
    }
    Ok(Bytes::new())
}
