//! One segment of a partition log: a file of consecutive record batches plus its sparse
//! offset and time indexes.
//!
//! Durability contract: `append` returns when the bytes are in the page cache or, for a
//! batch acknowledged only after an fsync round, in the segment's tail in memory (below); the
//! partition's syncer makes them durable, through the WAL or with `fdatasync` on the file
//! after [`Segment::flush`]. A sealed segment is fsynced, truncated to its logical size
//! and has its index file written, so recovery trusts it without scanning; the active
//! segment is scanned batch by batch (length, CRC, offset continuity) and cut at the first
//! invalid byte.
//!
//! The active segment's file is preallocated in chunks (`fallocate`), so most appends do not
//! change the file size and an `fdatasync` does not have to commit size metadata.
//!
//! The tail: a batch acknowledged only after an fsync round (the WAL holds it) goes into
//! the segment's tail in memory (`segment_tail.rs`), which reaches the file in direct-I/O
//! writes of whole pages and which tailing readers take without a copy
//! ([`Segment::memory_from`]). The file holds every byte before [`Segment::memory_start`];
//! everything that needs all of them in the file (an fsync, a seal, a scan, a cut) calls
//! [`Segment::flush`] first, and [`Segment::file`] asserts there is nothing left only in
//! memory. A crash loses only what the WAL holds (replay appends it again) or what was not
//! acknowledged yet. Other batches (page-cache topics, or when the process's tail memory is
//! full) are written through the page cache.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use crate::batch::{BatchHeader, BatchIter, BATCH_HEADER_BYTES};
use crate::checksum::crc32c;
use crate::segment_file::SegmentFile;
use crate::segment_tail::{Appended, Tail, TailClaim, PAGE_BYTES, WRITEBACK_PAGES_BYTES_MIN};

/// An index entry is added every this many bytes of appended batches.
pub const INDEX_INTERVAL_BYTES: u64 = 4096;
/// The active segment reserves ahead as much as it already holds, within these bounds, so
/// busy partitions rarely change their file size while thousands of idle ones reserve little.
pub const PREALLOCATE_AHEAD_BYTES_MIN: u64 = 64 * 1024;
pub const PREALLOCATE_AHEAD_BYTES_MAX: u64 = 16 * 1024 * 1024;
/// Recovery and replay read the log in buffers of this size.
const SCAN_BUFFER_BYTES: usize = 4 * 1024 * 1024;
/// Index positions are u32: a segment can never be larger than this.
pub const SEGMENT_BYTES_MAX: u64 = u32::MAX as u64;
const INDEX_FILE_MAGIC: &[u8; 4] = b"SLXI";
const INDEX_FILE_VERSION: u32 = 1;
/// A recovery image of the active segment's index is written here, then renamed over
/// the index file (see `log.rs`, `Partition::sync_for_wal_checkpoint`).
pub(crate) const STAGED_IMAGE_EXTENSION: &str = "image";

/// Whether a read may wait for the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadMode {
    /// From the page cache only (`preadv2` with `RWF_NOWAIT`): what an async runtime thread
    /// may do, since it never waits for a disk. A read of anything not cached fails with
    /// [`io::ErrorKind::WouldBlock`], and the caller retries it with [`ReadMode::MayBlock`]
    /// on a blocking thread; so do filesystems without `RWF_NOWAIT` support.
    CachedOnly,
    /// Waits for the disk if it must.
    MayBlock,
}

/// Reads into `buffer` (whose first byte is the file's byte at `position`) until it holds
/// `length` bytes, with `preadv2` into its spare capacity, without zeroing it first
/// (`flags`: 0, or `RWF_NOWAIT` to fail with `WouldBlock` rather than wait for the disk).
/// On error `buffer` may hold part of the bytes.
fn fill_to(file: &File, buffer: &mut BytesMut, length: usize, position: u64, flags: libc::c_int) -> io::Result<()> {
    buffer.reserve(length.saturating_sub(buffer.len()));
    while buffer.len() < length {
        let done = buffer.len();
        let rest = &mut buffer.spare_capacity_mut()[..length - done];
        let iov = libc::iovec { iov_base: rest.as_mut_ptr().cast(), iov_len: rest.len() };
        let at =
            libc::off_t::try_from(position + done as u64).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: `iov` describes spare capacity of `buffer`, valid for writes of its length
        // for the whole call; the kernel writes at most that many bytes.
        let read = unsafe { libc::preadv2(file.as_raw_fd(), &iov, 1, at, flags) };
        match read {
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            // SAFETY: the kernel initialised the `n` bytes after `done`.
            n if n > 0 => unsafe { buffer.set_len(done + n as usize) },
            _ => {
                let error = io::Error::last_os_error();
                match error.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    // Not (all) cached: the caller blocks elsewhere, or reads with flags 0.
                    Some(libc::EAGAIN) => return Err(io::ErrorKind::WouldBlock.into()),
                    _ => return Err(error),
                }
            }
        }
    }
    Ok(())
}

/// Largest disk read one blocking read issues at a time. The disk takes a read as one
/// request of up to its `max_sectors_kb` (4 MiB here), and a WAL write queued behind a
/// 4 MiB catch-up read waited for all of it (the WAL's fsync p99 went from 0.64 to 5 ms,
/// p99.9 to 20 ms, while a consumer drained a cold backlog). In pieces of 256 KiB a WAL
/// round waits for at most one piece.
pub const COLD_READ_PIECE_BYTES: usize = 256 * 1024;

/// Smallest and largest piece a direct read ([`read_direct`]) issues at a time: a piece is
/// as large as the WAL's recent rounds (`recent_round_bytes`), within these bounds. A WAL
/// round queued behind a piece at the device then waits for at most about its own size per
/// reader. In a 1 GiB cold drain at 10k msg/s under a 256 MiB cap (rounds of a
/// few KiB) 128 KiB pieces, two reads at a time, gave the producers' p99 5.9-9.0 ms during
/// the drain against 7.2-9.5 with 256 KiB pieces, at the same 434-496 MB/s; 64 KiB pieces
/// drained slower (418 MB/s). At 330k msg/s (rounds of about 1 MiB) consumers
/// that fell behind the tails' memory read 200-250 MB/s from the disk in 128 KiB pieces,
/// less than the producers wrote, and never caught up; in 1 MiB pieces they read 300-540
/// MB/s and caught up.
pub const DIRECT_READ_PIECE_BYTES_MIN: usize = 128 * 1024;
pub const DIRECT_READ_PIECE_BYTES_MAX: usize = 1024 * 1024;
const _: () = assert!(DIRECT_READ_PIECE_BYTES_MIN <= DIRECT_READ_PIECE_BYTES_MAX);

/// The bytes of the WAL's recent rounds, a moving average (each round weighs 1/8) over
/// every WAL of the process: the size of the rounds that a cold direct read's pieces queue
/// ahead of at the device ([`direct_read_piece_bytes`]).
static RECENT_ROUND_BYTES: AtomicUsize = AtomicUsize::new(0);

/// The bytes of the WAL's recent rounds (0 before the first).
fn recent_round_bytes() -> usize {
    RECENT_ROUND_BYTES.load(Ordering::Relaxed)
}

/// Called by the WAL with the bytes of each round it writes.
pub(crate) fn note_wal_round_bytes(bytes: usize) {
    // Concurrent WALs (tests) may lose one another's updates: a hint, not a count.
    let recent = RECENT_ROUND_BYTES.load(Ordering::Relaxed);
    RECENT_ROUND_BYTES.store(moving_average(recent, bytes), Ordering::Relaxed);
}

/// The average after a round of `bytes`, each round weighing 1/8.
fn moving_average(recent: usize, bytes: usize) -> usize {
    recent - recent / 8 + bytes / 8
}

/// The piece a direct read issues now (see [`DIRECT_READ_PIECE_BYTES_MIN`]).
pub fn direct_read_piece_bytes() -> usize {
    direct_read_piece_for(recent_round_bytes())
}

/// The piece for WAL rounds of `round_bytes`: whole pages, within the bounds.
fn direct_read_piece_for(round_bytes: usize) -> usize {
    let piece = round_bytes
        .next_multiple_of(crate::segment_tail::PAGE_BYTES)
        .clamp(DIRECT_READ_PIECE_BYTES_MIN, DIRECT_READ_PIECE_BYTES_MAX);
    debug_assert!(piece.is_multiple_of(crate::segment_tail::PAGE_BYTES));
    piece
}

/// Reads `length` bytes at `position` of `file` with direct I/O, into page-aligned memory
/// that is not zeroed first, one piece ([`direct_read_piece_bytes`]) at a time, so a WAL
/// write queued behind it waits for one piece only. The bytes go from the device into the
/// buffer without a page-cache folio: no copy into the cache and none out of it, nothing to
/// drop after, and nothing a memory cap reclaims. Direct reads are coherent with writes
/// through the page cache (the kernel writes dirty pages of the range back first). `None`
/// when the file cannot be read so (no `/proc`, a filesystem that refuses `O_DIRECT`): the
/// caller reads through the page cache.
fn read_direct(file: &File, position: u64, length: usize) -> Option<io::Result<Bytes>> {
    use std::os::unix::fs::OpenOptionsExt;
    const PAGE: u64 = crate::segment_tail::PAGE_BYTES as u64;
    // A second open file description of the same file, through /proc: a renamed or
    // unlinked path cannot matter, and the caller's descriptor keeps buffered reads.
    let direct = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .ok()?;
    let start = position / PAGE * PAGE;
    let end = (position + length as u64).div_ceil(PAGE) * PAGE;
    let span = usize::try_from(end - start).expect("a read's span fits in memory");
    let mut buffer: Vec<u8> = Vec::with_capacity(span + PAGE as usize);
    let align = buffer.as_ptr().align_offset(PAGE as usize);
    assert!(align < PAGE as usize);
    let piece_max = direct_read_piece_bytes();
    let mut done = 0usize;
    while done < span {
        let piece = (span - done).min(piece_max);
        let rest = &mut buffer.spare_capacity_mut()[align + done..align + done + piece];
        let Ok(at) = libc::off_t::try_from(start + done as u64) else {
            return Some(Err(io::ErrorKind::InvalidInput.into()));
        };
        // SAFETY: `rest` is spare capacity of `buffer`, valid for writes of its length for
        // the whole call; the kernel writes at most that many bytes.
        let read = unsafe { libc::pread(direct.as_raw_fd(), rest.as_mut_ptr().cast(), rest.len(), at) };
        match read {
            // The file's end (a short read ends at it).
            0 => break,
            n if n > 0 => {
                done += n as usize;
                if (n as usize) < piece {
                    break;
                }
            }
            _ => {
                let error = io::Error::last_os_error();
                match error.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(libc::EINVAL) if done == 0 => return None,
                    _ => return Some(Err(error)),
                }
            }
        }
    }
    let from = usize::try_from(position - start).expect("within a page");
    if done < from + length {
        return Some(Err(io::ErrorKind::UnexpectedEof.into()));
    }
    // SAFETY: the kernel initialised the `done` bytes after `align`; the `align` bytes before
    // them are never read (the slice below starts past them).
    unsafe { buffer.set_len(align + done) };
    Some(Ok(Bytes::from(buffer).slice(align + from..align + from + length)))
}

/// Reads `length` bytes at `position` into `buffer`, waiting for the disk where it must,
/// one piece of at most [`COLD_READ_PIECE_BYTES`] at a time. Returns whether any piece had
/// to come from the disk.
///
/// Whether a piece is cached is asked of the page cache (`cachestat`) where the kernel
/// tells: a refused `RWF_NOWAIT` read starts the disk read of its range, and when that
/// read ends before the kernel looks again, the piece comes back as if it had been cached.
fn read_in_pieces(file: &File, buffer: &mut BytesMut, length: usize, position: u64) -> io::Result<bool> {
    buffer.clear();
    let mut from_disk = false;
    while buffer.len() < length {
        let piece_end = (buffer.len() + COLD_READ_PIECE_BYTES).min(length);
        let piece_at = position + buffer.len() as u64;
        let piece_length = (piece_end - buffer.len()) as u64;
        let missing = crate::page_cache::missing_pages(file, piece_at, piece_length);
        if missing.is_some_and(|missing| missing > 0) {
            fill_to(file, buffer, piece_end, position, 0)?;
            from_disk = true;
            continue;
        }
        match fill_to(file, buffer, piece_end, position, libc::RWF_NOWAIT) {
            Ok(()) => {}
            // When every page was cached a moment ago, the kernel held one locked for a moment
            // (compaction, writeback): the blocking read waits for the lock, not the disk, and
            // the pages stay cached (dropped, the tailing readers of a cached range would go
            // to the disk). Without `cachestat` the refusal is the only sign of a miss.
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                fill_to(file, buffer, piece_end, position, 0)?;
                from_disk |= missing.is_none();
            }
            // RWF_NOWAIT unsupported (FUSE): whether the bytes were cached is unknown.
            Err(error) if error.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                fill_to(file, buffer, piece_end, position, 0)?
            }
            Err(error) => return Err(error),
        }
    }
    Ok(from_disk)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct OffsetEntry {
    relative_offset: u32,
    position: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TimeEntry {
    max_timestamp: i64,
    relative_offset: u32,
    position: u32,
}

/// Page-cache bytes of a segment file for the steady writeback: the file and `[from, to)`.
pub(crate) type WritebackRange = (Arc<File>, u64, u64);

/// Why an append stopped: it needs a roll while the last one's disk work is not done yet
/// (see `log/append.rs`); that roll must finish first.
#[derive(Debug, thiserror::Error)]
#[error("a segment roll is in progress")]
pub(crate) struct RollInProgress;

/// True when `error` is [`RollInProgress`].
pub(crate) fn is_roll_in_progress(error: &io::Error) -> bool {
    error.get_ref().is_some_and(|inner| inner.is::<RollInProgress>())
}

/// The suffix of a new segment's file until its roll is complete (see
/// [`Segment::create_rolling`]); recovery deletes such files.
pub(crate) const ROLLING_SUFFIX: &str = ".rolling";

/// A seal's disk work, captured by [`Segment::prepare_seal`] and run without the log's
/// lock: the data fsynced, then the preallocation cut and the index written (an index never
/// vouches for bytes a crash could take back).
pub(crate) struct Sealing {
    file: Arc<File>,
    size_bytes: u64,
    truncate: bool,
    index_path: PathBuf,
    index: Vec<u8>,
}

impl Sealing {
    /// Fsyncs the data and cuts the preallocation; then writes the index, if `with_index`.
    /// The index is only a shortcut for recovery (a segment without one is scanned), so a
    /// failure to write it (a full disk) is logged and the partial file removed, not
    /// returned.
    pub(crate) fn run(&self, with_index: bool) -> io::Result<()> {
        crate::durable::sync_data(&self.file)?;
        if self.truncate {
            self.file.set_len(self.size_bytes)?;
        }
        if !with_index {
            // Nor an older one (a recovery image's), which would vouch for a prefix only.
            match std::fs::remove_file(&self.index_path) {
                Err(error) if error.kind() != io::ErrorKind::NotFound => return Err(error),
                _ => return Ok(()),
            }
        }
        if let Err(error) = crate::write_file_unsynced(&self.index_path, &self.index) {
            tracing::warn!(path = %self.index_path.display(), %error, "could not write a segment index (recovery will scan the segment)");
            let _ = std::fs::remove_file(&self.index_path);
        }
        Ok(())
    }
}

pub struct Segment {
    base_offset: i64,
    log_path: PathBuf,
    index_path: PathBuf,
    /// Open while the segment is active; sealed, under the process's budget of open files.
    file: Arc<SegmentFile>,
    /// The logical size.
    size_bytes: u64,
    /// The end of the bytes written through the page cache (not through the tail).
    written_bytes: u64,
    /// How much of that the steady writeback has claimed ([`Segment::claim_writeback`]).
    written_back_bytes: u64,
    /// The newest bytes in memory (see the module comment).
    tail: Tail,
    allocated_bytes: u64,
    next_offset: i64,
    max_timestamp: i64,
    offset_of_max_timestamp: i64,
    first_append_ms: Option<i64>,
    /// When a batch was last appended, or the segment created or loaded if none was since.
    last_write_ms: i64,
    offset_index: Vec<OffsetEntry>,
    time_index: Vec<TimeEntry>,
    bytes_since_index_entry: u64,
}

impl Drop for Segment {
    fn drop(&mut self) {
        // Bytes only in memory are in the WAL (or the segment was deleted or cut); a
        // writeback claimed before must not land in a file that goes on without it.
        self.tail.retire();
    }
}

pub fn log_file_name(base_offset: i64) -> String {
    format!("{base_offset:020}.log")
}

pub(crate) fn index_file_name(base_offset: i64) -> String {
    format!("{base_offset:020}.index")
}

impl Segment {
    /// Creates a new, empty segment file (failing if it exists).
    pub fn create(dir: &Path, base_offset: i64) -> io::Result<Segment> {
        assert!(base_offset >= 0);
        let log_path = dir.join(log_file_name(base_offset));
        let file = OpenOptions::new().read(true).write(true).create_new(true).open(&log_path)?;
        crate::page_cache::without_readahead(&file);
        let file = SegmentFile::pinned(file)?;
        // The file's name must be durable before any data fsynced into it is acknowledged.
        crate::durable::sync_dir(dir)?;
        Ok(Segment::empty(dir, base_offset, log_path, file))
    }

    /// Creates the new segment of a roll (see `log/append.rs`) under a temporary name,
    /// `<base>.log.rolling`, with no fsync: only the file's creation, so the append that rolls
    /// does no other disk work, while the space its batches need is allocated in the file
    /// as for any segment (a full disk refuses the batch). The roll's completion renames it
    /// ([`Segment::rolled_path`], [`Segment::name_rolled`]) once the segment before it is
    /// durable; until then its batches are durable in the WAL only, and recovery deletes
    /// the file (it never holds bytes the WAL does not).
    pub(crate) fn create_rolling(dir: &Path, base_offset: i64) -> io::Result<Segment> {
        assert!(base_offset >= 0);
        let rolling_path = Segment::rolling_path(dir, base_offset);
        let open = || OpenOptions::new().read(true).write(true).create_new(true).open(&rolling_path);
        let file = match open() {
            // Not expected (recovery removes such files); a stale one holds no acknowledged
            // byte, so it is replaced rather than refusing every append from here on.
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {
                std::fs::remove_file(&rolling_path)?;
                open()?
            }
            opened => opened?,
        };
        crate::page_cache::without_readahead(&file);
        Ok(Segment::empty(dir, base_offset, rolling_path, SegmentFile::pinned(file)?))
    }

    fn rolling_path(dir: &Path, base_offset: i64) -> PathBuf {
        dir.join(format!("{}{ROLLING_SUFFIX}", log_file_name(base_offset)))
    }

    /// Where a rolling segment's file goes once its roll completes (see
    /// [`Segment::create_rolling`]): `(from, to)`.
    pub(crate) fn rolled_path(dir: &Path, base_offset: i64) -> (PathBuf, PathBuf) {
        (Segment::rolling_path(dir, base_offset), dir.join(log_file_name(base_offset)))
    }

    /// After the rename of [`Segment::rolled_path`]: the file is found under its name.
    pub(crate) fn name_rolled(&mut self, dir: &Path) {
        self.log_path = dir.join(log_file_name(self.base_offset));
    }

    fn empty(dir: &Path, base_offset: i64, log_path: PathBuf, file: Arc<SegmentFile>) -> Segment {
        Segment {
            base_offset,
            index_path: dir.join(index_file_name(base_offset)),
            log_path,
            file,
            size_bytes: 0,
            written_bytes: 0,
            written_back_bytes: 0,
            tail: Tail::new(),
            allocated_bytes: 0,
            next_offset: base_offset,
            max_timestamp: -1,
            offset_of_max_timestamp: -1,
            first_append_ms: None,
            last_write_ms: crate::now_ms(),
            offset_index: Vec::new(),
            time_index: Vec::new(),
            bytes_since_index_entry: 0,
        }
    }

    /// Opens an existing segment. A segment with a valid index file matching its size is
    /// trusted; one whose index vouches for a prefix (a recovery image of the active
    /// segment) is scanned from there; any other is scanned from the start. A scan
    /// truncates the file after its last valid batch.
    /// `on_batch` sees every batch header scanned: with `true` when the whole segment is
    /// scanned (producer-state replay takes those), with `false` for the tail after a
    /// recovery image (leader epochs are rebuilt from every scanned header).
    pub fn open(
        dir: &Path,
        base_offset: i64,
        on_batch: &mut dyn FnMut(&BatchHeader, bool),
    ) -> io::Result<(Segment, bool)> {
        let log_path = dir.join(log_file_name(base_offset));
        let file = OpenOptions::new().read(true).write(true).open(&log_path)?;
        crate::page_cache::without_readahead(&file);
        let metadata = file.metadata()?;
        let file_len = metadata.len();
        let mut segment = Segment::empty(dir, base_offset, log_path, SegmentFile::pinned(file)?);
        // Last written before the restart, as far as the idle check goes: a partition idle
        // for long before it gives its descriptor back at the first check, not a minute on.
        if let Some(modified) = metadata.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()) {
            segment.last_write_ms = segment.last_write_ms.min(modified.as_millis() as i64);
        }
        // A recovery image staged by a checkpoint that a crash cut short.
        let _ = std::fs::remove_file(segment.index_path.with_extension(STAGED_IMAGE_EXTENSION));
        match segment.load_index_file(file_len) {
            Ok(covered) if covered == file_len => {
                segment.allocated_bytes = file_len;
                segment.written_bytes = segment.size_bytes;
                segment.written_back_bytes = segment.size_bytes;
                return Ok((segment, true));
            }
            // A checkpoint image of the active segment: only what was appended after it
            // is scanned. Its batches are shown to `on_batch` as a tail (the caller replays
            // producer state from its snapshot, in offset order, over the indexed segment).
            Ok(covered) if segment.indexed_batch_is_in_place() => {
                segment.recover_from(covered, file_len, &mut |header| on_batch(header, false))?;
                segment.written_bytes = segment.size_bytes;
                segment.written_back_bytes = segment.size_bytes;
                return Ok((segment, true));
            }
            // No index, or one that does not fit the file: scan it all from a clean start.
            _ => segment.forget_index(),
        }
        let _ = std::fs::remove_file(&segment.index_path);
        segment.recover_from(0, file_len, &mut |header| on_batch(header, true))?;
        segment.written_bytes = segment.size_bytes;
        segment.written_back_bytes = segment.size_bytes;
        Ok((segment, false))
    }

    /// Scans the file from `start` (0, or the end an index vouches for), extending the
    /// indexes, and truncates a torn or preallocated tail. Returns the number of bytes cut.
    fn recover_from(&mut self, start: u64, file_len: u64, on_batch: &mut dyn FnMut(&BatchHeader)) -> io::Result<u64> {
        assert_eq!(start, self.size_bytes, "a scan continues where the index stops");
        let mut expected_offset = self.next_offset;
        let file = self.writable_file()?;
        let valid_end = scan_batches(&file, start, file_len, true, &mut |header, position| {
            // Offsets only grow; a compacted segment has gaps between batches.
            if header.base_offset < expected_offset {
                return false;
            }
            expected_offset = header.last_offset() + 1;
            self.track_appended(header, position);
            on_batch(header);
            true
        })?;
        assert_eq!(valid_end, self.size_bytes);
        if valid_end != file_len {
            file.set_len(valid_end)?;
            crate::durable::sync_all(&file)?;
        }
        self.allocated_bytes = valid_end;
        Ok(file_len - valid_end)
    }

    /// Back to the state of an empty segment (before a full scan rebuilds it).
    fn forget_index(&mut self) {
        self.size_bytes = 0;
        self.next_offset = self.base_offset;
        self.max_timestamp = -1;
        self.offset_of_max_timestamp = -1;
        self.first_append_ms = None;
        self.offset_index.clear();
        self.time_index.clear();
        self.bytes_since_index_entry = 0;
    }

    /// A cheap check that an index's last entry still names the batch at its position
    /// (a file cut and rewritten below an index's reach would not).
    fn indexed_batch_is_in_place(&self) -> bool {
        let Some(last) = self.offset_index.last() else { return self.size_bytes == 0 };
        let mut header = [0u8; BATCH_HEADER_BYTES];
        let Ok(file) = self.writable_file() else { return false };
        file.read_exact_at(&mut header, u64::from(last.position)).is_ok()
            && BatchHeader::parse(&header)
                .is_ok_and(|h| h.base_offset == self.base_offset + i64::from(last.relative_offset))
    }

    pub fn base_offset(&self) -> i64 {
        self.base_offset
    }
    /// Offset after the last batch in this segment.
    pub fn next_offset(&self) -> i64 {
        self.next_offset
    }
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
    pub fn max_timestamp(&self) -> i64 {
        self.max_timestamp
    }
    pub fn offset_of_max_timestamp(&self) -> i64 {
        self.offset_of_max_timestamp
    }
    pub fn first_append_ms(&self) -> Option<i64> {
        self.first_append_ms
    }
    /// When a batch was last appended, or the segment created or loaded if none was since.
    pub fn last_write_ms(&self) -> i64 {
        self.last_write_ms
    }
    /// True while appended bytes wait in memory for their file write.
    pub fn has_unwritten(&self) -> bool {
        self.tail.has_unwritten()
    }
    pub fn is_empty(&self) -> bool {
        self.size_bytes == 0
    }
    /// The segment's file, opened if the budget of open files had closed it. Every
    /// appended byte must be in it ([`Segment::flush`] first).
    pub fn file(&self) -> io::Result<Arc<File>> {
        assert!(!self.has_unwritten(), "the file of a segment with bytes still in memory");
        self.file.open(&self.log_path)
    }

    /// The file if it is open now: what a read that must not wait for the disk may use. It
    /// holds the bytes before [`Segment::memory_start`].
    pub(crate) fn cached_file(&self) -> Option<Arc<File>> {
        self.file.cached()
    }

    /// What opens the file without the log's lock: the slot and the path to open it from
    /// (see [`SegmentFile::open`]; `NotFound` if the segment is gone by then).
    pub(crate) fn file_slot(&self) -> (Arc<SegmentFile>, PathBuf) {
        (self.file.clone(), self.log_path.clone())
    }

    /// The slot and path of the file when it is closed now (see [`Segment::file_slot`]).
    pub(crate) fn closed_file_slot(&self) -> Option<(Arc<SegmentFile>, PathBuf)> {
        (!self.file.is_open()).then(|| self.file_slot())
    }

    /// True when `slot` is this segment's file slot (the segment was not replaced).
    pub(crate) fn has_file_slot(&self, slot: &Arc<SegmentFile>) -> bool {
        Arc::ptr_eq(&self.file, slot)
    }

    /// The file of a segment that takes writes: pinned open, out of the budget.
    fn writable_file(&self) -> io::Result<Arc<File>> {
        self.file.pin(&self.log_path)
    }

    /// Puts a sealed segment's file under the process's budget of open files.
    pub(crate) fn release_file(&self) {
        self.file.unpin();
    }

    /// Writes what the tail holds that the file lacks. On error the bytes stay in memory
    /// (the WAL holds them) and the next flush tries again.
    pub fn flush(&mut self) -> io::Result<()> {
        if !self.tail.has_unwritten() {
            return Ok(());
        }
        let file = self.writable_file()?;
        self.tail.flush(&file)
    }

    /// The steady writeback's share (see `wal.rs`): the page-cache bytes written since the
    /// last claim, as the open file and the range `[from, to)` to write back, and the tail's
    /// whole pages to write. `None` parts when nothing is due or the file is closed (the
    /// budget closes only idle files; the checkpoint writes whatever is left). With
    /// `all_pages`, the tail's last pages are claimed however few they are (a checkpoint
    /// follows, which should find little to write under the log's lock).
    pub(crate) fn claim_writeback(&mut self, all_pages: bool) -> (Option<WritebackRange>, Option<TailClaim>) {
        let Some(file) = self.file.cached() else { return (None, None) };
        let pages = self.tail.claim(file.clone(), if all_pages { 0 } else { WRITEBACK_PAGES_BYTES_MIN });
        // A cut (a follower's truncation) may have moved the end back.
        self.written_back_bytes = self.written_back_bytes.min(self.written_bytes);
        if self.written_back_bytes == self.written_bytes {
            return (None, pages);
        }
        let from = std::mem::replace(&mut self.written_back_bytes, self.written_bytes);
        (Some((file, from, self.written_bytes)), pages)
    }

    /// The file after [`Segment::flush`].
    pub fn flushed_file(&mut self) -> io::Result<Arc<File>> {
        self.flush()?;
        self.file()
    }

    /// The bytes from `position` (a batch boundary) to the end of the tail chunk holding
    /// it, without a copy; `None` when `position` is not in memory (it is in the file). A
    /// read of a chunk that froze a while ago notes a reader behind (see
    /// [`crate::segment_tail::TAIL_READER_LAGGING_MS`]).
    pub fn memory_from(&self, position: u64) -> Option<Bytes> {
        self.tail.memory_from(position, crate::now_ms)
    }

    /// Where the bytes in memory start; the file holds every byte before it (all of them
    /// when `None`).
    pub fn memory_start(&self) -> Option<u64> {
        self.tail.memory_start()
    }

    /// A reader read this segment's file behind its tail's memory: the tail keeps its frozen
    /// chunks for a while, so that reader reads on from memory once it reaches them.
    pub fn note_reader_behind(&self) {
        self.tail.note_reader_behind(crate::now_ms());
    }

    /// After a while without appends, an active segment lets go of its tail's memory, once
    /// its bytes are in the file. True when it did.
    pub(crate) fn release_tail(&mut self) -> bool {
        if self.tail.has_unwritten() || self.tail.memory_start().is_none() {
            return false;
        }
        self.tail.clear();
        true
    }

    /// No writeback claimed before may land after this returns: for a cut, which changes
    /// the file under the tail.
    pub(crate) fn retire_tail(&self) {
        self.tail.retire();
    }

    /// True when a batch of `batch_bytes` would not fit under `segment_bytes` or would
    /// overflow the relative offsets of the indexes.
    pub fn is_full_for(&self, batch_bytes: u64, last_offset: i64, segment_bytes: u64) -> bool {
        !self.is_empty()
            && (self.size_bytes + batch_bytes > segment_bytes.min(SEGMENT_BYTES_MAX)
                || last_offset - self.base_offset > i64::from(u32::MAX >> 1))
    }

    /// Appends `prefix` followed by `rest` (one batch) at the logical end: into the tail
    /// when `behind` (it is acknowledged only after an fsync round; see the module comment)
    /// and the process's tail memory has room, else written through the page cache (after
    /// what the tail held). On error nothing is accounted: the bytes past the logical end
    /// are garbage that the next append overwrites and recovery cuts.
    pub fn append(
        &mut self,
        prefix: &[u8],
        rest: &[u8],
        header: &BatchHeader,
        now_ms: i64,
        segment_bytes: u64,
        behind: bool,
    ) -> io::Result<u64> {
        let batch_bytes = (prefix.len() + rest.len()) as u64;
        assert_eq!(batch_bytes, header.total_bytes() as u64);
        assert!(header.base_offset >= self.next_offset, "appends move forward (a compacted log has gaps)");
        let position = self.size_bytes;
        if position + batch_bytes > SEGMENT_BYTES_MAX {
            return Err(io::Error::other("segment would exceed its maximum size"));
        }
        // Whole pages: a direct write of the last one pads it with zeros.
        self.ensure_allocated((position + batch_bytes).next_multiple_of(PAGE_BYTES as u64), segment_bytes)?;
        let appended = if behind {
            let file = self.writable_file()?;
            self.tail.append(position, &[prefix, rest], now_ms, |page, at| file.read_exact_at(page, at))?
        } else {
            Appended::NoRoom
        };
        match appended {
            // The chunk's first batch is indexed, so a read of it or of any later one
            // starts in memory.
            Appended::StartedChunk => self.bytes_since_index_entry = INDEX_INTERVAL_BYTES,
            Appended::Added => {}
            Appended::NoRoom => {
                if behind {
                    crate::segment_tail::note_tail_full_append();
                }
                // Through the page cache, after what the tail held (which it then lets go).
                self.flush()?;
                self.tail.clear();
                write_all_vectored_at(&*self.writable_file()?, &[prefix, rest], position)?;
                self.written_bytes = position + batch_bytes;
            }
        }
        self.first_append_ms.get_or_insert(now_ms);
        self.last_write_ms = self.last_write_ms.max(now_ms);
        self.track_appended(header, position);
        self.tail.assert_ends_at(self.size_bytes);
        Ok(position)
    }

    /// Makes sure `[0, end)` is allocated, reserving ahead up to the segment's roll size.
    /// When the disk cannot hold the reservation, falls back to exactly what the batch
    /// needs, so a nearly full disk still takes every batch that fits.
    fn ensure_allocated(&mut self, end: u64, segment_bytes: u64) -> io::Result<()> {
        if end <= self.allocated_bytes {
            return Ok(());
        }
        let reserve = self.size_bytes.clamp(PREALLOCATE_AHEAD_BYTES_MIN, PREALLOCATE_AHEAD_BYTES_MAX);
        let ahead = (end + reserve).min(segment_bytes.min(SEGMENT_BYTES_MAX)).max(end);
        match self.fallocate(ahead) {
            Err(error) if error.raw_os_error() == Some(libc::ENOSPC) && ahead > end => self.fallocate(end),
            result => result,
        }
    }

    fn fallocate(&mut self, new_allocated: u64) -> io::Result<()> {
        let length = (new_allocated - self.allocated_bytes) as libc::off_t;
        // SAFETY: fallocate on an owned, open file descriptor with in-range arguments.
        let file = self.writable_file()?;
        let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, self.allocated_bytes as libc::off_t, length) };
        if rc != 0 {
            let error = io::Error::last_os_error();
            // Filesystems without fallocate still work, appends just change the size.
            if error.raw_os_error() == Some(libc::EOPNOTSUPP) {
                return Ok(());
            }
            return Err(error);
        }
        self.allocated_bytes = new_allocated;
        Ok(())
    }

    fn track_appended(&mut self, header: &BatchHeader, position: u64) {
        let batch_bytes = header.total_bytes() as u64;
        let relative_offset = (header.base_offset - self.base_offset) as u32;
        if self.bytes_since_index_entry >= INDEX_INTERVAL_BYTES || self.offset_index.is_empty() {
            self.offset_index.push(OffsetEntry { relative_offset, position: position as u32 });
            if header.max_timestamp > self.time_index.last().map_or(i64::MIN, |e| e.max_timestamp) {
                self.time_index.push(TimeEntry {
                    max_timestamp: self.max_timestamp.max(header.max_timestamp),
                    relative_offset,
                    position: position as u32,
                });
            }
            self.bytes_since_index_entry = 0;
        }
        self.bytes_since_index_entry += batch_bytes;
        if header.max_timestamp > self.max_timestamp {
            self.max_timestamp = header.max_timestamp;
            self.offset_of_max_timestamp = header.base_offset;
        }
        self.size_bytes = position + batch_bytes;
        self.next_offset = header.last_offset() + 1;
    }

    /// File position of a batch at or before `offset` (a place to start scanning).
    pub fn position_at_or_before(&self, offset: i64) -> u64 {
        position_at_or_before(&self.offset_index, self.base_offset, offset)
    }

    /// The position of the last offset-index entry at or before file position `position`: a
    /// batch boundary from which a scan finds the last batch ending by `position`.
    pub fn boundary_at_or_before(&self, position: u64) -> u64 {
        match partition_point_from_end(&self.offset_index, |e| u64::from(e.position) <= position) {
            0 => 0,
            index => u64::from(self.offset_index[index - 1].position),
        }
    }

    /// File position from which to scan for the first batch with max timestamp >= `timestamp`.
    pub fn position_for_timestamp(&self, timestamp: i64) -> u64 {
        position_for_timestamp(&self.time_index, timestamp)
    }

    /// Reads `length` bytes at `position` into a fresh buffer (one copy, from the page cache,
    /// into memory that is not zeroed first). With [`ReadMode::CachedOnly`] a read that would
    /// wait for the disk fails with [`io::ErrorKind::WouldBlock`] instead.
    ///
    /// With [`ReadMode::MayBlock`] and direct I/O ([`crate::segment_tail::set_direct_writes`],
    /// the broker's default), a range the page cache lacks any page of is read with direct
    /// I/O ([`read_direct`]) and never enters the page cache. Otherwise, bytes that had to
    /// come from the disk (a consumer or a follower catching up on a cold backlog) are
    /// dropped from the page cache once read:
    /// they would otherwise push out what producers and tailing consumers need (the log's
    /// recent tail, the WAL), and under a memory limit make every write wait for reclaim.
    /// A second reader of the same backlog reads it from the disk again. A `backlog` read
    /// (far behind its partition's log end, see `BACKLOG_DISTANCE_BYTES` in `log/read.rs`)
    /// with [`ReadMode::MayBlock`] drops what it read however it was served. For a read of
    /// exactly what the caller uses; a reader that uses only a prefix of what it read takes
    /// [`Segment::read_keeping_cached`] and releases that prefix.
    pub fn read_at(file: &File, position: u64, length: usize, mode: ReadMode, backlog: bool) -> io::Result<Bytes> {
        let (bytes, release) = Segment::read_keeping_cached(file, position, length, mode, backlog)?;
        if release {
            crate::page_cache::drop_from_page_cache(file, position, length as u64);
        }
        Ok(bytes)
    }

    /// [`Segment::read_at`] without the drop from the page cache: true with the bytes when
    /// the caller must drop what it used of them ([`Segment::release_read`]) and nothing
    /// after, since the reader's next read starts there.
    pub(crate) fn read_keeping_cached(
        file: &File,
        position: u64,
        length: usize,
        mode: ReadMode,
        backlog: bool,
    ) -> io::Result<(Bytes, bool)> {
        let mut buffer = BytesMut::with_capacity(length);
        let from_disk = match mode {
            ReadMode::CachedOnly => {
                // An `RWF_NOWAIT` read of pages that are not cached starts their disk read
                // (the whole range, as one request of up to 4 MiB, into the page cache)
                // before it refuses: a backlog read, and every read when cold bytes are read
                // with direct I/O, asks the page cache first, so the disk read happens on the
                // blocking pool, in pieces.
                if (backlog || crate::segment_tail::direct_io())
                    && crate::page_cache::missing_pages(file, position, length as u64)
                        .is_some_and(|missing| missing > 0)
                {
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                match fill_to(file, &mut buffer, length, position, libc::RWF_NOWAIT) {
                    Err(error) if error.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                        return Err(io::ErrorKind::WouldBlock.into());
                    }
                    read => read?,
                }
                false
            }
            ReadMode::MayBlock
                if crate::segment_tail::direct_io()
                    && crate::page_cache::missing_pages(file, position, length as u64)
                        .is_some_and(|missing| missing > 0) =>
            {
                match read_direct(file, position, length) {
                    Some(read) => return read.map(|bytes| (bytes, false)),
                    None => read_in_pieces(file, &mut buffer, length, position)?,
                }
            }
            ReadMode::MayBlock => read_in_pieces(file, &mut buffer, length, position)?,
        };
        Ok((buffer.freeze(), from_disk || (backlog && mode == ReadMode::MayBlock)))
    }

    /// Drops the pages wholly inside `[position, position + length)` of what a
    /// [`Segment::read_keeping_cached`] read from `position` from the page cache.
    pub(crate) fn release_read(file: &File, position: u64, length: u64) {
        crate::page_cache::drop_from_page_cache(file, position, length);
    }

    /// Visits batch headers from `position` to the logical end, stopping when `visit`
    /// returns false.
    pub fn scan_from(&self, position: u64, visit: &mut dyn FnMut(&BatchHeader, u64) -> bool) -> io::Result<()> {
        Segment::scan_file(&*self.file()?, position, self.size_bytes, visit)
    }

    /// [`Segment::scan_from`] over a segment's `file` up to `end`, for a scan made without
    /// the log's lock.
    pub(crate) fn scan_file(
        file: &File,
        position: u64,
        end: u64,
        visit: &mut dyn FnMut(&BatchHeader, u64) -> bool,
    ) -> io::Result<()> {
        scan_batches(file, position, end, false, visit)?;
        Ok(())
    }

    /// Makes the segment immutable: fsync its data, cut the preallocation, write the index
    /// file. The data is durable before the index is written, so an index can never
    /// vouch for bytes a crash took back; the size change and the index themselves are not
    /// synced (a crash before they reach the disk only means this segment is scanned at
    /// recovery) unless `sync_index`, for a clean shutdown.
    pub fn seal(&mut self, sync_index: bool) -> io::Result<()> {
        let sealing = self.prepare_seal()?;
        sealing.run(true)?;
        if sync_index {
            crate::durable::sync_all(&sealing.file)?;
            crate::durable::sync_path(&self.index_path)?;
        }
        self.finish_seal();
        Ok(())
    }

    /// The part of a seal that needs the segment: writes what the tail holds into the file
    /// and captures what [`Sealing::run`] does with it (the file's disk work, which needs
    /// no lock). The segment must take no append until [`Segment::finish_seal`].
    pub(crate) fn prepare_seal(&mut self) -> io::Result<Sealing> {
        self.flush()?;
        Ok(Sealing {
            file: self.file()?,
            size_bytes: self.size_bytes,
            truncate: self.allocated_bytes != self.size_bytes,
            index_path: self.index_path.clone(),
            index: self.index_image(),
        })
    }

    /// After [`Sealing::run`] succeeded: the segment is read from its file, which goes under
    /// the budget of open files.
    pub(crate) fn finish_seal(&mut self) {
        self.tail.retire();
        self.tail.clear();
        self.allocated_bytes = self.size_bytes;
        self.release_file();
    }

    /// Moves the segment's files (a cleaned segment built in the cleaning directory) over
    /// the segment of the same base offset in `dir`. Crash-safe at every step: the stale
    /// index goes first (a log without index is scanned at recovery), the log's rename
    /// is atomic and made durable before the new index is put beside it.
    pub(crate) fn move_into(&mut self, dir: &Path) -> io::Result<()> {
        let log_path = dir.join(log_file_name(self.base_offset));
        let index_path = dir.join(index_file_name(self.base_offset));
        match std::fs::remove_file(&index_path) {
            Err(error) if error.kind() != io::ErrorKind::NotFound => return Err(error),
            _ => {}
        }
        std::fs::rename(&self.log_path, &log_path)?;
        crate::durable::sync_dir(dir)?;
        self.log_path = log_path;
        if std::fs::rename(&self.index_path, &index_path).is_err() {
            // No index: the segment is scanned at the next start.
            let _ = std::fs::remove_file(&self.index_path);
        }
        self.index_path = index_path;
        Ok(())
    }

    /// Deletes the segment's files.
    pub fn delete_files(&self) -> io::Result<()> {
        let _ = std::fs::remove_file(&self.index_path);
        let _ = std::fs::remove_file(self.index_path.with_extension(STAGED_IMAGE_EXTENSION));
        std::fs::remove_file(&self.log_path)
    }

    /// The index file's bytes as of now: they vouch for the first `size_bytes` of the
    /// segment, so they may be written only once those bytes are durable.
    pub fn index_image(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.offset_index.len() * 8 + self.time_index.len() * 16);
        out.extend_from_slice(INDEX_FILE_MAGIC);
        out.extend_from_slice(&INDEX_FILE_VERSION.to_le_bytes());
        out.extend_from_slice(&self.size_bytes.to_le_bytes());
        out.extend_from_slice(&self.next_offset.to_le_bytes());
        out.extend_from_slice(&self.max_timestamp.to_le_bytes());
        out.extend_from_slice(&self.offset_of_max_timestamp.to_le_bytes());
        out.extend_from_slice(&self.first_append_ms.unwrap_or(-1).to_le_bytes());
        out.extend_from_slice(&(self.offset_index.len() as u32).to_le_bytes());
        for entry in &self.offset_index {
            out.extend_from_slice(&entry.relative_offset.to_le_bytes());
            out.extend_from_slice(&entry.position.to_le_bytes());
        }
        out.extend_from_slice(&(self.time_index.len() as u32).to_le_bytes());
        for entry in &self.time_index {
            out.extend_from_slice(&entry.max_timestamp.to_le_bytes());
            out.extend_from_slice(&entry.relative_offset.to_le_bytes());
            out.extend_from_slice(&entry.position.to_le_bytes());
        }
        let crc = crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    pub(crate) fn index_path(&self) -> &Path {
        &self.index_path
    }

    /// Loads the index file; returns how many bytes of the segment it vouches for: all
    /// of it (a sealed segment), or a prefix (a checkpoint image of the active segment).
    fn load_index_file(&mut self, file_len: u64) -> io::Result<u64> {
        let mut data = Vec::new();
        File::open(&self.index_path)?.read_to_end(&mut data)?;
        let index = SegmentIndex::parse(&data)?;
        if index.covered_bytes > file_len || index.next_offset < self.base_offset {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "invalid index file"));
        }
        let covered = index.covered_bytes;
        self.size_bytes = covered;
        self.next_offset = index.next_offset;
        self.max_timestamp = index.max_timestamp;
        self.offset_of_max_timestamp = index.offset_of_max_timestamp;
        self.first_append_ms = index.first_append_ms;
        self.offset_index = index.offset_index;
        self.time_index = index.time_index;
        self.bytes_since_index_entry = self.offset_index.last().map_or(0, |e| covered - u64::from(e.position));
        Ok(covered)
    }
}

/// A segment's index file, decoded and checked (magic, version, CRC, positions within the
/// bytes it covers): loaded at open, and read back from the remote tier, where a copied
/// segment's index locates a fetch offset without reading the segment from its start.
#[derive(Debug, Clone)]
pub struct SegmentIndex {
    /// How many bytes of the segment the index vouches for.
    pub covered_bytes: u64,
    pub next_offset: i64,
    pub max_timestamp: i64,
    offset_of_max_timestamp: i64,
    first_append_ms: Option<i64>,
    offset_index: Vec<OffsetEntry>,
    time_index: Vec<TimeEntry>,
}

impl SegmentIndex {
    pub fn parse(data: &[u8]) -> io::Result<SegmentIndex> {
        let invalid = || io::Error::new(io::ErrorKind::InvalidData, "invalid index file");
        if data.len() < 56 || &data[0..4] != INDEX_FILE_MAGIC {
            return Err(invalid());
        }
        let (body, crc) = data.split_at(data.len() - 4);
        if crc32c(body) != u32::from_le_bytes(crc.try_into().expect("4 bytes")) {
            return Err(invalid());
        }
        let mut reader = LeReader { data: body, position: 4 };
        if reader.u32()? != INDEX_FILE_VERSION {
            return Err(invalid());
        }
        let covered_bytes = reader.u64()?;
        let next_offset = reader.u64()? as i64;
        let max_timestamp = reader.u64()? as i64;
        let offset_of_max_timestamp = reader.u64()? as i64;
        let first_append_ms = reader.u64()? as i64;
        let mut offset_index = Vec::new();
        for _ in 0..reader.u32()? {
            offset_index.push(OffsetEntry { relative_offset: reader.u32()?, position: reader.u32()? });
        }
        let mut time_index = Vec::new();
        for _ in 0..reader.u32()? {
            let max_timestamp = reader.u64()? as i64;
            time_index.push(TimeEntry { max_timestamp, relative_offset: reader.u32()?, position: reader.u32()? });
        }
        if offset_index.iter().any(|e| u64::from(e.position) >= covered_bytes.max(1))
            || (covered_bytes > 0) == offset_index.is_empty()
        {
            return Err(invalid());
        }
        Ok(SegmentIndex {
            covered_bytes,
            next_offset,
            max_timestamp,
            offset_of_max_timestamp,
            first_append_ms: (first_append_ms >= 0).then_some(first_append_ms),
            offset_index,
            time_index,
        })
    }

    /// File position of a batch at or before `offset` in the segment based at `base_offset`.
    pub fn position_at_or_before(&self, base_offset: i64, offset: i64) -> u64 {
        position_at_or_before(&self.offset_index, base_offset, offset)
    }

    /// File position from which to scan for the first batch with max timestamp >= `timestamp`.
    pub fn position_for_timestamp(&self, timestamp: i64) -> u64 {
        position_for_timestamp(&self.time_index, timestamp)
    }
}

/// The position of the last offset-index entry at or before `offset` (0 when none is).
fn position_at_or_before(entries: &[OffsetEntry], base_offset: i64, offset: i64) -> u64 {
    let relative = (offset - base_offset).max(0) as u32;
    match partition_point_from_end(entries, |e| e.relative_offset <= relative) {
        0 => 0,
        index => u64::from(entries[index - 1].position),
    }
}

/// `entries.partition_point(pred)` (`pred` true on a prefix), searched from the newest entry
/// back with doubling steps, then by bisection in the last step's span: O(log d) for an
/// answer d entries from the end. Nearly every lookup is near the end (a tailing consumer's
/// or follower's fetch offset, the append's own), and a segment's index reaches hundreds of
/// thousands of entries (one per `INDEX_INTERVAL_BYTES`): a plain bisection touches a
/// cache line at each of its ~18 steps. The newest entries stay in cache because appends
/// write them. (At 10k msg/s over 100 partitions the fetch path's lookups fell from 1.1% to
/// 0.3% of the broker's profile samples.)
fn partition_point_from_end<T>(entries: &[T], pred: impl Fn(&T) -> bool) -> usize {
    // Invariant: every entry at or after `end` is false.
    let mut end = entries.len();
    let mut step = 1;
    while step <= end {
        let probe = end - step;
        if pred(&entries[probe]) {
            return probe + 1 + entries[probe + 1..end].partition_point(&pred);
        }
        end = probe;
        step *= 2;
    }
    entries[..end].partition_point(pred)
}

/// The position of the last time-index entry before the first with max timestamp >= `timestamp`.
fn position_for_timestamp(entries: &[TimeEntry], timestamp: i64) -> u64 {
    match entries.partition_point(|e| e.max_timestamp < timestamp) {
        0 => 0,
        index => u64::from(entries[index - 1].position),
    }
}

struct LeReader<'a> {
    data: &'a [u8],
    position: usize,
}

impl LeReader<'_> {
    fn take<const N: usize>(&mut self) -> io::Result<[u8; N]> {
        let end = self.position + N;
        let bytes = self.data.get(self.position..end).ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
        self.position = end;
        Ok(bytes.try_into().expect("N bytes"))
    }
    fn u32(&mut self) -> io::Result<u32> {
        Ok(u32::from_le_bytes(self.take()?))
    }
    fn u64(&mut self) -> io::Result<u64> {
        Ok(u64::from_le_bytes(self.take()?))
    }
}

/// Reads batches between `start` and `end` in large buffers and calls `visit` with each
/// header and position until it returns false or the bytes stop forming whole batches.
/// With `check_crc`, each batch's CRC is validated and a bad one ends the scan.
/// Returns the position after the last visited batch.
fn scan_batches(
    file: &File,
    start: u64,
    end: u64,
    check_crc: bool,
    visit: &mut dyn FnMut(&BatchHeader, u64) -> bool,
) -> io::Result<u64> {
    // Sized to what is scanned: a small segment must not cost a large zeroed buffer.
    let mut buffer = vec![0u8; (end.saturating_sub(start) as usize).min(SCAN_BUFFER_BYTES)];
    let mut position = start;
    while position + (BATCH_HEADER_BYTES as u64) <= end {
        let want = ((end - position) as usize).min(buffer.len());
        file.read_exact_at(&mut buffer[..want], position)?;
        let chunk = &buffer[..want];
        let mut iter = BatchIter::new(chunk);
        let mut visited_any = false;
        while let Some(item) = iter.next() {
            let Ok((header, range)) = item else { return Ok(position + iter.position() as u64) };
            let valid = !check_crc || crate::batch::validate_stored_batch(&chunk[range.clone()]).is_ok();
            if !valid || !visit(&header, position + range.start as u64) {
                return Ok(position + range.start as u64);
            }
            visited_any = true;
        }
        let consumed = iter.position() as u64;
        if !visited_any {
            // The next batch does not fit in the buffer: grow it if the file really holds it.
            match BatchHeader::parse(chunk) {
                Ok(header) if position + header.total_bytes() as u64 <= end && header.total_bytes() > buffer.len() => {
                    buffer.resize(header.total_bytes(), 0);
                    continue;
                }
                _ => return Ok(position),
            }
        }
        position += consumed;
    }
    Ok(position)
}

/// `pwritev` of all of `parts` at `position`, retrying short writes.
fn write_all_vectored_at(file: &File, parts: &[&[u8]], mut position: u64) -> io::Result<()> {
    let mut parts: Vec<&[u8]> = parts.iter().copied().filter(|p| !p.is_empty()).collect();
    while !parts.is_empty() {
        let iovecs: Vec<libc::iovec> =
            parts.iter().map(|p| libc::iovec { iov_base: p.as_ptr() as *mut libc::c_void, iov_len: p.len() }).collect();
        // SAFETY: iovecs point into live slices for the duration of the call.
        let written = unsafe {
            libc::pwritev(file.as_raw_fd(), iovecs.as_ptr(), iovecs.len() as libc::c_int, position as libc::off_t)
        };
        if written < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        if written == 0 {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "pwritev wrote nothing"));
        }
        position += written as u64;
        let mut remaining = written as usize;
        while remaining > 0 {
            if remaining >= parts[0].len() {
                remaining -= parts[0].len();
                parts.remove(0);
            } else {
                parts[0] = &parts[0][remaining..];
                remaining = 0;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recent_round_size_follows_the_rounds() {
        let mut recent = 0;
        recent = moving_average(recent, 1 << 20);
        assert_eq!(recent, 128 * 1024, "one large round moves it an eighth of the way");
        for _ in 0..64 {
            recent = moving_average(recent, 1 << 20);
        }
        assert!(recent > 1000 * 1024 && recent <= 1 << 20, "{recent}");
        for _ in 0..64 {
            recent = moving_average(recent, 8 * 1024);
        }
        assert!(recent < 16 * 1024, "{recent}");
    }

    proptest::proptest! {
        #[test]
        fn searching_from_the_end_finds_what_bisection_finds(
            mut values in proptest::collection::vec(0u32..1_000, 0..300),
            key in 0u32..1_100,
        ) {
            values.sort_unstable();
            let expected = values.partition_point(|&v| v <= key);
            proptest::prop_assert_eq!(partition_point_from_end(&values, |&v| v <= key), expected);
        }
    }

    /// Drops `file`'s clean pages from the page cache until none is left: one
    /// `POSIX_FADV_DONTNEED` can miss pages another CPU still holds in its LRU batch.
    fn evict(file: &File) {
        for _ in 0..100 {
            // SAFETY: advice on an open file descriptor.
            assert_eq!(unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) }, 0);
            let size = file.metadata().unwrap().len();
            if crate::page_cache::cached_pages(file, 0, size.max(1)).expect("cachestat (Linux 6.5)") == 0 {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        panic!("the file's pages stay in the page cache");
    }

    #[test]
    fn a_cold_read_of_a_segment_brings_in_only_what_it_asked_for() {
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir().unwrap();
        let segment = Segment::create(dir.path(), 0).unwrap();
        let content: Vec<u8> = (0..4 * 1024 * 1024).map(|i| (i % 251) as u8).collect();
        let file = segment.file().unwrap();
        file.write_all_at(&content, 0).unwrap();
        file.sync_all().unwrap();
        evict(&file);
        // A reader going through the file in order, as a catch-up consumer does.
        const STEP: usize = 64 * 1024;
        for position in (0..1 << 20).step_by(STEP) {
            let read = Segment::read_at(&file, position as u64, STEP, ReadMode::MayBlock, false).unwrap();
            assert_eq!(&read[..], &content[position..position + STEP]);
        }
        // No readahead: the bytes after the reads were not fetched from the disk (they would
        // be dropped again before a catch-up reader's next fetch asks for them). Asked of
        // the page cache itself: a cache-only read is no witness, since the disk read a
        // refused `RWF_NOWAIT` read starts can finish before the kernel looks again.
        assert_eq!(crate::page_cache::cached_pages(&file, 1 << 20, 3 << 20), Some(0));
    }

    #[test]
    fn cold_reads_leave_the_page_cache_as_they_found_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cold");
        let content: Vec<u8> = (0..4 * 1024 * 1024).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &content).unwrap();
        let file = File::open(&path).unwrap();
        file.sync_all().unwrap();
        // Clean pages can be dropped from the cache: the data is now only on the disk.
        evict(&file);
        const LENGTH: usize = 64 * 1024;
        const PAGES: u64 = (LENGTH / crate::segment_tail::PAGE_BYTES) as u64;
        let read = Segment::read_at(&file, 1 << 20, LENGTH, ReadMode::MayBlock, false).unwrap();
        assert_eq!(&read[..], &content[1 << 20..(1 << 20) + LENGTH]);
        // What a blocking read had to fetch from the disk is not kept in the cache (a
        // catch-up read must not push out the tail that producers and consumers use)...
        assert_eq!(crate::page_cache::cached_pages(&file, 1 << 20, LENGTH as u64), Some(0));
        // ...while what was cached already stays cached, and a cache-only read returns it.
        let mut warm = vec![0; LENGTH];
        file.read_exact_at(&mut warm, 2 << 20).unwrap();
        let read = Segment::read_at(&file, 2 << 20, LENGTH, ReadMode::MayBlock, false).unwrap();
        assert_eq!(&read[..], &content[2 << 20..(2 << 20) + LENGTH]);
        assert_eq!(crate::page_cache::cached_pages(&file, 2 << 20, LENGTH as u64), Some(PAGES));
        let cached = Segment::read_at(&file, 2 << 20, LENGTH, ReadMode::CachedOnly, false).unwrap();
        assert_eq!(cached, read);
    }

    #[test]
    fn a_refused_backlog_read_starts_no_disk_read_and_a_read_across_pieces_returns_its_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cold");
        let content: Vec<u8> = (0..4 * 1024 * 1024).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &content).unwrap();
        let file = File::open(&path).unwrap();
        file.sync_all().unwrap();
        evict(&file);
        let length = 3 * COLD_READ_PIECE_BYTES + 3 * 4096;
        let refused = Segment::read_at(&file, 4096, length, ReadMode::CachedOnly, true).unwrap_err();
        assert_eq!(refused.kind(), io::ErrorKind::WouldBlock);
        // The refusal read nothing from the disk (an `RWF_NOWAIT` read would have started
        // reading the whole range, as one request the WAL's writes queue behind).
        std::thread::sleep(std::time::Duration::from_millis(200));
        let cached = crate::page_cache::cached_pages(&file, 4096, length as u64).expect("cachestat (Linux 6.5)");
        assert_eq!(cached, 0, "a refused backlog read brought pages in");
        let read = Segment::read_at(&file, 4096, length, ReadMode::MayBlock, true).unwrap();
        assert_eq!(&read[..], &content[4096..4096 + length]);
        assert_eq!(
            crate::page_cache::cached_pages(&file, 4096, length as u64),
            Some(0),
            "a backlog read leaves nothing cached"
        );
    }

    #[test]
    fn direct_reads_take_pieces_as_large_as_the_wal_rounds_within_bounds() {
        assert_eq!(direct_read_piece_for(0), DIRECT_READ_PIECE_BYTES_MIN);
        assert_eq!(direct_read_piece_for(16 * 1024), DIRECT_READ_PIECE_BYTES_MIN);
        assert_eq!(direct_read_piece_for(300_000), 74 * 4096, "whole pages");
        assert_eq!(direct_read_piece_for(64 << 20), DIRECT_READ_PIECE_BYTES_MAX);
    }

    #[test]
    fn a_direct_read_returns_any_range_without_caching_it_and_sees_unwritten_page_cache_data() {
        // On the build's disk: a temporary directory may be a tmpfs, which refuses O_DIRECT.
        let dir = tempfile::tempdir_in(concat!(env!("CARGO_MANIFEST_DIR"), "/../../target")).unwrap();
        let path = dir.path().join("cold");
        let size = 2 * DIRECT_READ_PIECE_BYTES_MAX + 5000;
        let content: Vec<u8> = (0..size).map(|i| (i % 253) as u8).collect();
        std::fs::write(&path, &content).unwrap();
        let file = File::options().read(true).write(true).open(&path).unwrap();
        file.sync_all().unwrap();
        evict(&file);
        // Unaligned starts and ends, a range across pieces, one that ends at the file's end.
        for (position, length) in
            [(0, 1), (4095, 2), (17, DIRECT_READ_PIECE_BYTES_MIN + 3), (300, size - 300), (0, size)]
        {
            let read = read_direct(&file, position as u64, length).expect("the filesystem of target/ takes O_DIRECT");
            assert_eq!(&read.unwrap()[..], &content[position..position + length], "at {position}, {length} bytes");
        }
        assert_eq!(crate::page_cache::cached_pages(&file, 0, size as u64), Some(0), "a direct read cached pages");
        // Past the end: an error, not short or made-up bytes.
        let past = read_direct(&file, (size - 10) as u64, 20).unwrap().unwrap_err();
        assert_eq!(past.kind(), io::ErrorKind::UnexpectedEof);
        // Bytes written through the page cache and not yet on the disk: the direct read
        // gets them (the kernel writes the range back first).
        file.write_all_at(b"fresh bytes", 100_000).unwrap();
        let read = read_direct(&file, 99_990, 40).unwrap().unwrap();
        assert_eq!(&read[..10], &content[99_990..100_000]);
        assert_eq!(&read[10..21], b"fresh bytes");
        assert_eq!(&read[21..], &content[100_011..100_030]);
    }
}
