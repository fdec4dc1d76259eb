//! The active segment's newest bytes in Sluice's own memory (its tail), written to the
//! segment file with direct I/O.
//!
//! Why: a batch acknowledged after a WAL round is already durable in the WAL; its segment
//! file copy only serves readers and the WAL's checkpoint. Written through the page cache,
//! that copy cost a quarter of the broker's CPU at 200k msg/s (the kernel's copy into
//! page-cache folios, then `sync_file_range` to write them back; README). Here a
//! batch is copied once, into a chunk of memory that tailing readers take without a copy
//! (`Bytes` over the chunk), and the chunk reaches the file in `O_DIRECT` writes of whole
//! pages, which the device copies by DMA.
//!
//! A tail is a run of chunks. A chunk is a page-aligned buffer whose first byte is the
//! file's byte at a page-aligned position: it starts with the file's partial page before its
//! first batch (copied from the chunk before, or read from the file), so its writes cover
//! whole pages. The last chunk takes appends; the ones before it are frozen, end at a batch
//! boundary and own their whole pages only (the last, partial one is the next chunk's first).
//!
//! Invariants (asserted): the chunks are contiguous (a chunk's first batch starts where the
//! one before ends) and the last ends at the segment's logical end; bytes below a chunk's
//! `len` never change (readers hold them); a page reaches the file only with content that
//! extends what the file had there, so two writes of it in either order leave the same bytes.
//!
//! Writes happen in two places, both under the tail's write lock, so they never overlap:
//! - [`TailClaim::write`], the WAL's steady writeback (every 100 ms, on the checkpointer
//!   thread, without the log's lock): the frozen chunks, and the last chunk's whole pages
//!   once at least [`WRITEBACK_PAGES_BYTES_MIN`] of them wait;
//! - [`Tail::flush`], under the log's lock, when the file must hold everything (a
//!   checkpoint, a seal, a cut, a scan): the last page padded with zeros (past the logical
//!   end, where a scan stops).
//!
//! A retired tail ([`Tail::retire`]: its segment is cut, sealed or dropped) takes no more
//! writeback, so a write claimed before a cut cannot land after it.
//!
//! With direct I/O (the broker's default), a tail always writes directly. A reader that
//! lags ([`Tail::note_reader_behind`]: it read a chunk that froze [`TAIL_READER_LAGGING_MS`]
//! ago, or the file behind the memory) keeps the frozen chunks in memory for
//! [`READER_BEHIND_RETAIN_MS`] (within the count and memory bounds), and what it reads of the
//! file behind them it reads with direct I/O too (`segment.rs::read_direct`). Turning
//! a lagging reader's tail writes to the page cache instead, so that it would find cached
//! bytes, costs more: at 300k msg/s the checkpointer's copies into page-cache folios took
//! 0.67 of the 2 cores and the produce time went from 4 to 90 ms, while the consumers read
//! at 20-120 MB/s of the 310 incoming (README). A page written one way and then
//! the other (a filesystem that refused direct I/O midway) is still whole: the kernel
//! writes back and drops a cached page before a direct write over it.
//!
//! Durability contract: none of its own. What a chunk holds that its file does not is in the
//! WAL, which keeps it until the checkpoint has flushed and fsynced the file. A filesystem
//! that refuses `O_DIRECT` (tmpfs), or whose direct I/O is not trusted (FUSE, NFS: the
//! broker leaves direct writes off there, see `durable::direct_io_trusted`), gets the same
//! writes through the page cache.
//!
//! Memory: every chunk of the process counts against [`tail_memory_bytes_max`] until its
//! last reader drops it; a chunk that does not fit is not made, and the segment writes
//! through the page cache instead.

use std::alloc::Layout;
use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;

/// The unit of a direct write: file offsets, lengths and memory are multiples of it.
pub const PAGE_BYTES: usize = 4096;
/// A segment's first chunk, and the smallest one. Small, because every active partition
/// holds one: at 10,000 partitions of 1 msg/s, 64 KiB chunks held 1 GiB; a busy
/// partition's chunks double from here within seconds.
pub const TAIL_CHUNK_BYTES_MIN: usize = 8 * 1024;
/// The largest chunk (a batch larger than this gets a chunk of its own size).
pub const TAIL_CHUNK_BYTES_MAX: usize = 1024 * 1024;
/// The least [`tail_memory_bytes_max`] gives all chunks of the process together.
pub const TAIL_MEMORY_BYTES_FLOOR: usize = 256 * 1024 * 1024;
/// The most [`tail_memory_bytes_max`] gives all chunks of the process together: 13 s of a
/// 300 MB/s ingest, more than a consumer group's rebalance holds its readers back.
pub const TAIL_MEMORY_BYTES_CEILING: usize = 4 * 1024 * 1024 * 1024;
/// [`tail_memory_bytes_max`] is this fraction of the memory the process may use.
const TAIL_MEMORY_SHARE_DIVISOR: usize = 6;
/// Freed chunks of [`TAIL_CHUNK_BYTES_MAX`] are kept for the next ones (outside
/// [`tail_memory_bytes_max`]) up to this fraction of it: memory fresh from the kernel costs a
/// page fault and a zeroed page every 4 KiB (a fifth of the broker's CPU while the tails grew
/// by 3 GiB for consumers catching up at 300 MB/s), and the tails' memory comes and goes in
/// such waves (a consumer group's rebalance, a restarted consumer, a deleted topic). The
/// pool is only of chunks once used, so a broker whose readers keep up never fills it.
const TAIL_CHUNK_POOL_SHARE_DIVISOR: usize = 4;
/// Frozen chunks a segment keeps at most with direct I/O, however much memory is free.
pub const TAIL_FROZEN_CHUNKS_MAX: usize = 64;
/// With direct I/O, a written frozen chunk goes once this long has passed since it froze
/// (checked when a chunk starts), unless a reader lags ([`TAIL_READER_LAGGING_MS`]):
/// readers a moment behind find their bytes in memory, and a slow partition holds no more
/// than through the page cache (at 10,000 partitions of 1 msg/s the tails would otherwise
/// keep [`tail_retained_bytes_max`]).
pub const TAIL_FROZEN_RETAIN_MS: i64 = 2000;
/// A busy partition's written frozen chunks (of [`TAIL_CHUNK_BYTES_MAX`]: a chunk that size
/// fills within a second) stay this long instead of [`TAIL_FROZEN_RETAIN_MS`], unless memory
/// is short. A consumer group's rebalance resumes each partition at its last committed
/// offset, up to the clients' auto-commit interval (5 s by default, librdkafka and the Java
/// client alike) before where its reader stopped, once the rebalance's own seconds have
/// passed; read from the disk at the peak, that backlog drained slower than producers added
/// to it (Kafka's readers find it in the page cache). An idle partition's backlog is a few
/// small reads: its chunks go at the shorter age, so 10,000 idle partitions hold no more.
pub const TAIL_BUSY_FROZEN_RETAIN_MS: i64 = 8000;
/// A reader of a chunk that froze this long ago lags: for [`READER_BEHIND_RETAIN_MS`] frozen
/// chunks stay past [`TAIL_FROZEN_RETAIN_MS`] (within the count and memory bounds), so it
/// reads on from memory rather than from the disk.
pub const TAIL_READER_LAGGING_MS: i64 = 500;
/// Frozen chunks a segment keeps when it writes through the page cache.
pub const TAIL_FROZEN_CHUNKS_PAGE_CACHE: usize = 1;
/// The writeback writes the last chunk's whole pages once this many wait (fewer, larger
/// writes: a 4 KiB direct write costs the device round trip of a 1 MiB one).
pub const WRITEBACK_PAGES_BYTES_MIN: usize = 64 * 1024;
/// Tails that keep their direct-I/O descriptor open between writes; past this many, a write
/// opens one for itself (10,000 busy partitions would otherwise hold 10,000 more descriptors).
pub const TAIL_DIRECT_FILES_OPEN_MAX: usize = 256;
/// A chunk that filled within this time is followed by one twice its size, one that took
/// longer by one half its size: busy partitions write large pieces, idle ones hold little.
const CHUNK_GROW_WITHIN_MS: i64 = 1000;
/// After a reader lagged (see [`TAIL_READER_LAGGING_MS`]) or read a segment's file behind
/// its tail's memory, the tail keeps its frozen chunks past their age for this long
/// (renewed by each such read).
pub const READER_BEHIND_RETAIN_MS: i64 = 3_000;

static TAIL_MEMORY_BYTES: AtomicUsize = AtomicUsize::new(0);
static TAIL_WRITTEN_DIRECT_BYTES: AtomicU64 = AtomicU64::new(0);
static TAIL_WRITTEN_PAGE_CACHE_BYTES: AtomicU64 = AtomicU64::new(0);
static TAIL_FULL_APPENDS: AtomicU64 = AtomicU64::new(0);
static TAIL_DIRECT_FILES_OPEN: AtomicUsize = AtomicUsize::new(0);
static DIRECT_WRITES: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether tails write with direct I/O (`log_segment_direct_io`), and blocking reads of what
/// the page cache lacks read with it, or both go through the page cache (the default). Set
/// once at startup; tails made before keep their mode.
pub fn set_direct_writes(direct: bool) {
    DIRECT_WRITES.store(direct, Ordering::Relaxed);
}

/// Whether the process writes tails and reads cold bytes with direct I/O
/// ([`set_direct_writes`]).
pub(crate) fn direct_io() -> bool {
    DIRECT_WRITES.load(Ordering::Relaxed)
}

/// A segment file opened with `O_DIRECT` that a tail keeps, counted against
/// [`TAIL_DIRECT_FILES_OPEN_MAX`].
struct KeptDirect(File);

impl KeptDirect {
    /// Keeps `file` if the process keeps fewer than the maximum; gives it back otherwise.
    fn keep(file: File) -> Result<KeptDirect, File> {
        if TAIL_DIRECT_FILES_OPEN.fetch_add(1, Ordering::Relaxed) >= TAIL_DIRECT_FILES_OPEN_MAX {
            TAIL_DIRECT_FILES_OPEN.fetch_sub(1, Ordering::Relaxed);
            return Err(file);
        }
        Ok(KeptDirect(file))
    }
}

impl Drop for KeptDirect {
    fn drop(&mut self) {
        TAIL_DIRECT_FILES_OPEN.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What all chunks of the process may hold together, readers' included: a share of the
/// memory the process may use, within [[`TAIL_MEMORY_BYTES_FLOOR`],
/// [`TAIL_MEMORY_BYTES_CEILING`]]. A chunk that does not fit is not made.
///
/// Why that much: readers held back a few seconds (a consumer group's rebalance at the
/// start of a run; a consumer restarting) then read their backlog from memory. Read from the
/// disk instead, at the peak a backlog drains slower than producers add to it, so such
/// readers never catch up; Kafka's readers find it in the page cache, which takes all the
/// memory that is free.
pub fn tail_memory_bytes_max() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| {
        let share = crate::process_memory::usable_memory_bytes() / TAIL_MEMORY_SHARE_DIVISOR;
        share.clamp(TAIL_MEMORY_BYTES_FLOOR, TAIL_MEMORY_BYTES_CEILING)
    })
}

/// Freed chunks of [`TAIL_CHUNK_BYTES_MAX`] the pool keeps at most.
fn tail_chunk_pool_max() -> usize {
    tail_memory_bytes_max() / TAIL_CHUNK_POOL_SHARE_DIVISOR / TAIL_CHUNK_BYTES_MAX
}

/// With direct I/O, frozen chunks stay for readers behind the end (once written) while all
/// chunks of the process hold less than this (three quarters of [`tail_memory_bytes_max`],
/// the rest for the last chunks that take appends); past it, a segment that starts a chunk
/// lets its go. Through the page cache, which keeps those bytes for such readers, a segment
/// keeps [`TAIL_FROZEN_CHUNKS_PAGE_CACHE`].
fn tail_retained_bytes_max() -> usize {
    tail_memory_bytes_max() / 4 * 3
}

/// Bytes all segments' tail chunks hold now (readers' included).
pub fn tail_memory_bytes() -> usize {
    TAIL_MEMORY_BYTES.load(Ordering::Relaxed)
}

/// Bytes the tails wrote to their files since the start: (with direct I/O, through the page
/// cache). Direct I/O's padding of a last partial page counts each time it is written.
pub fn tail_written_bytes() -> (u64, u64) {
    (TAIL_WRITTEN_DIRECT_BYTES.load(Ordering::Relaxed), TAIL_WRITTEN_PAGE_CACHE_BYTES.load(Ordering::Relaxed))
}

/// Batches that an append of a topic with a tail wrote through the page cache itself, on
/// the request path, because the tails' memory could not make a chunk for them (each also
/// wrote what its segment's tail held, and let go of the tail).
pub fn tail_full_appends() -> u64 {
    TAIL_FULL_APPENDS.load(Ordering::Relaxed)
}

/// Counts one append of [`tail_full_appends`].
pub(crate) fn note_tail_full_append() {
    TAIL_FULL_APPENDS.fetch_add(1, Ordering::Relaxed);
}

fn page_floor(n: usize) -> usize {
    n / PAGE_BYTES * PAGE_BYTES
}

fn page_ceil(n: usize) -> usize {
    n.div_ceil(PAGE_BYTES) * PAGE_BYTES
}

/// A chunk's memory and how much of it is in the file; freed (and uncounted) when the
/// segment and the last reader let go of it.
struct ChunkShared {
    ptr: NonNull<u8>,
    capacity: usize,
    /// Bytes from the chunk's start known to be in the file.
    written: AtomicUsize,
}

// SAFETY: the memory is plain bytes owned by this value. Bytes below a chunk's `len` are
// only read (by any thread); bytes at or past it are written only by the holder of the log's
// lock, which never hands them out before they are below `len` (see `Chunk`).
unsafe impl Send for ChunkShared {}
// SAFETY: as above.
unsafe impl Sync for ChunkShared {}

impl ChunkShared {
    /// `None` when the process's chunks would exceed [`tail_memory_bytes_max`].
    fn allocate(capacity: usize) -> Option<Arc<ChunkShared>> {
        assert!(capacity > 0 && capacity.is_multiple_of(PAGE_BYTES));
        if TAIL_MEMORY_BYTES.fetch_add(capacity, Ordering::Relaxed) + capacity > tail_memory_bytes_max() {
            TAIL_MEMORY_BYTES.fetch_sub(capacity, Ordering::Relaxed);
            return None;
        }
        let pooled = (capacity == TAIL_CHUNK_BYTES_MAX).then(|| CHUNK_POOL.lock().pop()).flatten();
        let Some(ptr) = pooled.map(|free| free.0).or_else(|| {
            let layout = Layout::from_size_align(capacity, PAGE_BYTES).expect("a page-aligned layout");
            // SAFETY: the layout's size is not zero.
            NonNull::new(unsafe { std::alloc::alloc(layout) })
        }) else {
            TAIL_MEMORY_BYTES.fetch_sub(capacity, Ordering::Relaxed);
            return None;
        };
        Some(Arc::new(ChunkShared { ptr, capacity, written: AtomicUsize::new(0) }))
    }

    /// The chunk's bytes `[from, to)`.
    ///
    /// # Safety
    /// Nobody may write to `[from, to)` while the slice lives: it lies below the chunk's
    /// `len`, or the caller holds the log's lock (the only writer) and does not write.
    unsafe fn slice(&self, from: usize, to: usize) -> &[u8] {
        assert!(from <= to && to <= self.capacity);
        // SAFETY: in bounds (asserted); initialised, since bytes are read only below `len`
        // or after `zero_padding`; not written meanwhile (the caller's promise).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(from), to - from) }
    }
}

impl Drop for ChunkShared {
    fn drop(&mut self) {
        TAIL_MEMORY_BYTES.fetch_sub(self.capacity, Ordering::Relaxed);
        if self.capacity == TAIL_CHUNK_BYTES_MAX {
            let mut pool = CHUNK_POOL.lock();
            if pool.len() < tail_chunk_pool_max() {
                pool.push(FreeChunk(self.ptr));
                return;
            }
        }
        let layout = Layout::from_size_align(self.capacity, PAGE_BYTES).expect("a page-aligned layout");
        // SAFETY: allocated in `allocate` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
    }
}

/// The memory of a freed chunk of [`TAIL_CHUNK_BYTES_MAX`], kept for the next one.
struct FreeChunk(NonNull<u8>);

// SAFETY: memory nobody references (its chunk was dropped); whoever pops it owns it.
unsafe impl Send for FreeChunk {}

/// Freed chunks of [`TAIL_CHUNK_BYTES_MAX`], [`tail_chunk_pool_max`] at most.
static CHUNK_POOL: Mutex<Vec<FreeChunk>> = Mutex::new(Vec::new());

/// The owner of a reader's `Bytes`: bytes below the chunk's `len` when it was made.
struct ChunkView {
    shared: Arc<ChunkShared>,
    from: usize,
    to: usize,
}

impl AsRef<[u8]> for ChunkView {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `[from, to)` was below the chunk's `len` when the view was made: never
        // written again.
        unsafe { self.shared.slice(self.from, self.to) }
    }
}

struct Chunk {
    shared: Arc<ChunkShared>,
    /// The file position of the chunk's first byte (page-aligned).
    file_start: u64,
    /// Where the chunk's first batch starts in it (the bytes before are the file's).
    first_batch: usize,
    /// Bytes appended (from the chunk's start); the rest is unused or padding.
    len: usize,
    /// Takes no more appends; owns only its whole pages.
    frozen: bool,
    created_ms: i64,
}

impl Chunk {
    fn end(&self) -> u64 {
        self.file_start + self.len as u64
    }

    fn first_batch_position(&self) -> u64 {
        self.file_start + self.first_batch as u64
    }

    /// The bytes this chunk must put in the file.
    fn owned_len(&self) -> usize {
        if self.frozen {
            page_floor(self.len)
        } else {
            self.len
        }
    }

    fn written(&self) -> usize {
        self.shared.written.load(Ordering::Acquire)
    }

    fn is_written(&self) -> bool {
        self.written() >= self.owned_len()
    }

    /// Appends `parts` (the caller holds the log's lock and checked the room).
    fn push(&mut self, parts: &[&[u8]]) {
        for part in parts {
            assert!(self.len + part.len() <= self.shared.capacity, "a chunk's room is checked before a push");
            // SAFETY: the destination lies in the chunk's memory at or past `len`, which no
            // reader holds and only the holder of the log's lock (the caller) writes.
            unsafe { std::ptr::copy_nonoverlapping(part.as_ptr(), self.shared.ptr.as_ptr().add(self.len), part.len()) };
            self.len += part.len();
        }
    }

    /// Zeroes `[len, page_ceil(len))`, so a direct write of the last page pads with zeros.
    fn zero_padding(&mut self) {
        let end = page_ceil(self.len).min(self.shared.capacity);
        // SAFETY: past `len`: no reader holds it, and the caller holds the log's lock.
        unsafe { std::ptr::write_bytes(self.shared.ptr.as_ptr().add(self.len), 0, end - self.len) };
    }
}

/// The state every write of a tail's chunks holds (see the module comment).
struct WriterState {
    retired: bool,
    /// The segment file reopened with `O_DIRECT`, kept from one write to the next.
    direct: Option<KeptDirect>,
    /// The filesystem refused `O_DIRECT`: writes go through the page cache.
    direct_refused: bool,
}

impl WriterState {
    /// Writes the chunk's bytes `[from, to)` at their file position, with direct I/O widened
    /// to whole pages (the caller made any padding past `len` zero) when the tail writes
    /// directly and the filesystem allows it, and notes them written. True when they went
    /// through the page cache.
    fn write(
        &mut self,
        file: &File,
        shared: &ChunkShared,
        file_start: u64,
        (from, to): (usize, usize),
    ) -> io::Result<bool> {
        if from >= to {
            return Ok(false);
        }
        let direct = !self.direct_refused;
        let mut opened = None;
        if direct && self.direct.is_none() {
            // Reopened through /proc, so a renamed or replaced path cannot matter.
            let path = format!("/proc/self/fd/{}", file.as_raw_fd());
            match OpenOptions::new().write(true).custom_flags(libc::O_DIRECT).open(path) {
                Ok(direct) => match KeptDirect::keep(direct) {
                    Ok(kept) => self.direct = Some(kept),
                    Err(direct) => opened = Some(direct),
                },
                Err(error) if error.raw_os_error() == Some(libc::EINVAL) => self.direct_refused = true,
                Err(error) => return Err(error),
            }
        }
        let direct_file = if direct { self.direct.as_ref().map(|kept| &kept.0).or(opened.as_ref()) } else { None };
        let mut through_page_cache = direct_file.is_none();
        let direct_result = direct_file.map(|direct| {
            let (from, to) = (page_floor(from), page_ceil(to));
            // SAFETY: the bytes are below `len` (fixed) or padding the caller zeroed under
            // the log's lock, which it holds for a write past the last whole page.
            direct.write_all_at(unsafe { shared.slice(from, to) }, file_start + from as u64)
        });
        match direct_result {
            Some(Err(error)) if error.raw_os_error() == Some(libc::EINVAL) => {
                tracing::warn!(%error, "direct I/O refused: segment writes go through the page cache");
                self.direct = None;
                self.direct_refused = true;
                through_page_cache = true;
                // SAFETY: as above, without the padding.
                file.write_all_at(unsafe { shared.slice(from, to) }, file_start + from as u64)?;
            }
            Some(result) => result?,
            // SAFETY: as above, without the padding.
            None => file.write_all_at(unsafe { shared.slice(from, to) }, file_start + from as u64)?,
        }
        shared.written.fetch_max(to, Ordering::AcqRel);
        if through_page_cache {
            TAIL_WRITTEN_PAGE_CACHE_BYTES.fetch_add((to - from) as u64, Ordering::Relaxed);
        } else {
            TAIL_WRITTEN_DIRECT_BYTES.fetch_add((page_ceil(to) - page_floor(from)) as u64, Ordering::Relaxed);
        }
        Ok(through_page_cache)
    }
}

/// One segment's tail. Methods that take `&mut self` run under the log's lock.
pub(crate) struct Tail {
    chunks: VecDeque<Chunk>,
    /// Frozen chunks kept at most (see [`tail_retained_bytes_max`]).
    frozen_max: usize,
    writer: Arc<Mutex<WriterState>>,
    /// When a reader last lagged or read the file behind this tail's memory (ms; see
    /// [`READER_BEHIND_RETAIN_MS`]). Atomic: readers note it without the log's lock.
    reader_behind_ms: AtomicI64,
}

/// How long after it froze a written chunk stays for readers a moment behind, when no
/// reader lags: [`TAIL_BUSY_FROZEN_RETAIN_MS`] for a busy partition's, else
/// [`TAIL_FROZEN_RETAIN_MS`].
fn frozen_retain_ms(chunk: &Chunk) -> i64 {
    if chunk.shared.capacity >= TAIL_CHUNK_BYTES_MAX {
        TAIL_BUSY_FROZEN_RETAIN_MS
    } else {
        TAIL_FROZEN_RETAIN_MS
    }
}

/// Whether no reader lagged for [`READER_BEHIND_RETAIN_MS`]: frozen chunks may then go for
/// their age.
fn readers_keep_up(reader_behind_ms: &AtomicI64, now_ms: i64) -> bool {
    now_ms.saturating_sub(reader_behind_ms.load(Ordering::Relaxed)) >= READER_BEHIND_RETAIN_MS
}

/// What [`Tail::append`] did with a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Appended {
    /// Into the last chunk.
    Added,
    /// Into a new chunk, which it starts (a read of it should find an index entry there).
    StartedChunk,
    /// Not taken (no memory for a chunk): the caller writes it through the page cache.
    NoRoom,
}

impl Tail {
    /// A tail in the process's mode ([`set_direct_writes`]).
    pub(crate) fn new() -> Tail {
        Tail::with_direct_writes(DIRECT_WRITES.load(Ordering::Relaxed))
    }

    pub(crate) fn with_direct_writes(direct: bool) -> Tail {
        Tail {
            chunks: VecDeque::new(),
            frozen_max: if direct { TAIL_FROZEN_CHUNKS_MAX } else { TAIL_FROZEN_CHUNKS_PAGE_CACHE },
            writer: Arc::new(Mutex::new(WriterState { retired: false, direct: None, direct_refused: !direct })),
            reader_behind_ms: AtomicI64::new(i64::MIN),
        }
    }

    /// A reader lagged or read the file behind this tail's memory at `now_ms`: the frozen
    /// chunks stay for a while (see [`READER_BEHIND_RETAIN_MS`]).
    pub(crate) fn note_reader_behind(&self, now_ms: i64) {
        self.reader_behind_ms.fetch_max(now_ms, Ordering::Relaxed);
    }

    /// True while some appended bytes are not in the file yet.
    pub(crate) fn has_unwritten(&self) -> bool {
        self.chunks.iter().any(|chunk| !chunk.is_written())
    }

    /// Where the bytes held in memory start: the file holds every byte before it (and the
    /// whole log when `None`).
    pub(crate) fn memory_start(&self) -> Option<u64> {
        self.chunks.front().map(Chunk::first_batch_position)
    }

    /// The bytes from `position` (a batch boundary) to the end of the chunk holding it,
    /// without a copy; `None` when `position` is not in memory. A read of a chunk that
    /// froze [`TAIL_READER_LAGGING_MS`] before `now_ms` notes a reader behind.
    pub(crate) fn memory_from(&self, position: u64, now_ms: impl FnOnce() -> i64) -> Option<Bytes> {
        let index = self.chunks.iter().position(|c| c.first_batch_position() <= position && position < c.end())?;
        let chunk = &self.chunks[index];
        // The next chunk started when this one froze.
        if let Some(next) = self.chunks.get(index + 1) {
            let now_ms = now_ms();
            if now_ms - next.created_ms >= TAIL_READER_LAGGING_MS {
                self.note_reader_behind(now_ms);
            }
        }
        let from = (position - chunk.file_start) as usize;
        Some(Bytes::from_owner(ChunkView { shared: chunk.shared.clone(), from, to: chunk.len }))
    }

    /// Appends one batch (`parts`) at `position`, the segment's logical end. A new chunk
    /// starts with the bytes of `position`'s page before it: from the chunk before, or read
    /// by `read_file` (the file holds them then).
    pub(crate) fn append(
        &mut self,
        position: u64,
        parts: &[&[u8]],
        now_ms: i64,
        read_file: impl FnOnce(&mut [u8], u64) -> io::Result<()>,
    ) -> io::Result<Appended> {
        let batch_bytes: usize = parts.iter().map(|p| p.len()).sum();
        if let Some(last) = self.chunks.back_mut().filter(|c| !c.frozen) {
            assert_eq!(last.end(), position, "the last chunk ends at the log's end");
            if last.len + batch_bytes <= last.shared.capacity {
                last.push(parts);
                return Ok(Appended::Added);
            }
        }
        let file_start = page_floor(position as usize) as u64;
        let prefix = (position - file_start) as usize;
        let capacity = self.next_capacity(now_ms).max(page_ceil(prefix + batch_bytes));
        let Some(shared) = ChunkShared::allocate(capacity) else { return Ok(Appended::NoRoom) };
        let mut chunk = Chunk { shared, file_start, first_batch: prefix, len: 0, frozen: false, created_ms: now_ms };
        if prefix > 0 {
            match self.chunks.back().filter(|c| c.file_start <= file_start && c.end() == position) {
                // The chunk before no longer owns this page: the new one writes all of it.
                Some(before) => {
                    let from = (file_start - before.file_start) as usize;
                    // SAFETY: below `before.len`: never written again.
                    chunk.push(&[unsafe { before.shared.slice(from, from + prefix) }]);
                }
                // The file holds the prefix: only what follows it is unwritten.
                None => {
                    let mut page = vec![0u8; prefix];
                    read_file(&mut page, file_start)?;
                    chunk.push(&[&page]);
                    chunk.shared.written.store(prefix, Ordering::Release);
                }
            }
        }
        chunk.push(parts);
        if let Some(last) = self.chunks.back_mut() {
            assert_eq!(last.end(), position, "chunks are contiguous");
            last.frozen = true;
        }
        self.chunks.push_back(chunk);
        // Written frozen chunks go (readers keep theirs) when memory is short, a segment
        // holds many or they froze a while ago and no reader lags: once the file holds every
        // byte before the next chunk's first batch, its partial last page included, which
        // the next chunk writes.
        let readers_keep_up = readers_keep_up(&self.reader_behind_ms, now_ms);
        while self.chunks.len() > 1
            && (self.chunks.len() > self.frozen_max + 1
                || tail_memory_bytes() > tail_retained_bytes_max()
                || (now_ms - self.chunks[1].created_ms > frozen_retain_ms(&self.chunks[0]) && readers_keep_up))
            && self.chunks[0].is_written()
            && self.chunks[1].written() >= self.chunks[1].first_batch
        {
            self.chunks.pop_front();
        }
        Ok(Appended::StartedChunk)
    }

    /// The size of the next chunk, from how fast the last one filled: whole pages, within
    /// [`TAIL_CHUNK_BYTES_MIN`, `TAIL_CHUNK_BYTES_MAX`]. (The last chunk may be of any
    /// number of pages: one sized for a large batch.)
    fn next_capacity(&self, now_ms: i64) -> usize {
        let capacity = match self.chunks.back() {
            None => TAIL_CHUNK_BYTES_MIN,
            Some(last) if now_ms - last.created_ms <= CHUNK_GROW_WITHIN_MS => last.shared.capacity * 2,
            Some(last) => last.shared.capacity / 2,
        };
        let capacity = page_ceil(capacity).clamp(TAIL_CHUNK_BYTES_MIN, TAIL_CHUNK_BYTES_MAX);
        debug_assert!(capacity.is_multiple_of(PAGE_BYTES));
        capacity
    }

    /// Writes everything the file lacks (`file` is the segment file, for the page cache's
    /// path and for finding the file to write directly).
    pub(crate) fn flush(&mut self, file: &File) -> io::Result<()> {
        if !self.has_unwritten() {
            return Ok(());
        }
        let mut writer = self.writer.lock();
        for chunk in self.chunks.iter_mut() {
            let (from, to) = (chunk.written(), chunk.owned_len());
            if from < to {
                if !chunk.frozen {
                    chunk.zero_padding();
                }
                writer.write(file, &chunk.shared, chunk.file_start, (from, to))?;
            }
        }
        Ok(())
    }

    /// The writeback's share (see the module comment): `None` when nothing is due. The
    /// claim is written without the log's lock.
    pub(crate) fn claim(&self, file: Arc<File>, at_least: usize) -> Option<TailClaim> {
        let pieces: Vec<_> = self
            .chunks
            .iter()
            .filter_map(|chunk| {
                let from = chunk.written();
                let to = page_floor(chunk.owned_len());
                let due = if chunk.frozen { from < to } else { to > from && to - page_floor(from) >= at_least };
                due.then(|| (chunk.shared.clone(), chunk.file_start, to))
            })
            .collect();
        (!pieces.is_empty()).then(|| TailClaim { writer: self.writer.clone(), file, pieces })
    }

    /// No writeback after this returns (one in progress has finished).
    pub(crate) fn retire(&self) {
        self.writer.lock().retired = true;
    }

    /// Lets go of the chunks (every byte is in the file) and of the direct-I/O descriptor:
    /// an idle or sealed segment holds no memory.
    pub(crate) fn clear(&mut self) {
        assert!(!self.has_unwritten(), "a tail is cleared once its bytes are in the file");
        self.chunks.clear();
        self.writer.lock().direct = None;
    }

    /// Checks the invariants of the module comment against the segment's logical size.
    pub(crate) fn assert_ends_at(&self, size_bytes: u64) {
        if let Some(last) = self.chunks.back() {
            assert_eq!(last.end(), size_bytes, "the last chunk ends at the segment's end");
        }
        for pair in self.chunks.iter().collect::<Vec<_>>().windows(2) {
            assert_eq!(pair[0].end(), pair[1].first_batch_position(), "chunks are contiguous");
            assert!(pair[0].frozen, "only the last chunk takes appends");
        }
    }
}

/// Whole pages of a tail's chunks for the writeback to write (see [`Tail::claim`]).
pub(crate) struct TailClaim {
    writer: Arc<Mutex<WriterState>>,
    file: Arc<File>,
    /// (chunk, its file position, write up to this many of its bytes)
    pieces: Vec<(Arc<ChunkShared>, u64, usize)>,
}

impl TailClaim {
    /// Writes the claimed pages, unless the tail was retired since. A failure is left to the
    /// next flush, which writes them again and reports it.
    pub(crate) fn write(self) {
        let mut writer = self.writer.lock();
        if writer.retired {
            return;
        }
        for (shared, file_start, to) in &self.pieces {
            let from = shared.written.load(Ordering::Acquire);
            let through_page_cache = match writer.write(&self.file, shared, *file_start, (from, *to)) {
                Ok(through_page_cache) => through_page_cache,
                Err(error) => {
                    tracing::warn!(%error, "segment writeback failed (the checkpoint retries)");
                    return;
                }
            };
            if through_page_cache {
                // Through the page cache: its disk writes start now, not in the checkpoint's
                // burst (see `wal.rs::write_back`).
                crate::page_cache::write_back(&self.file, file_start + from as u64, file_start + *to as u64);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tail over a fresh file, and the bytes appended to it so far (the file's expected
    /// content).
    struct Fixture {
        _dir: tempfile::TempDir,
        file: Arc<File>,
        tail: Tail,
        appended: Vec<u8>,
        now_ms: i64,
    }

    impl Fixture {
        /// `direct`: with direct I/O, or through the page cache.
        fn new(direct: bool) -> Fixture {
            Fixture::new_in(direct, tempfile::tempdir().unwrap())
        }

        fn new_in(direct: bool, dir: tempfile::TempDir) -> Fixture {
            let file =
                OpenOptions::new().read(true).write(true).create_new(true).open(dir.path().join("s.log")).unwrap();
            let tail = Tail::with_direct_writes(direct);
            Fixture { _dir: dir, file: Arc::new(file), tail, appended: Vec::new(), now_ms: 0 }
        }

        /// Appends `n` bytes that say where they are (a "batch").
        fn append(&mut self, n: usize) -> Appended {
            let position = self.appended.len() as u64;
            let bytes: Vec<u8> = (0..n).map(|i| ((position as usize + i) % 251) as u8).collect();
            let file = self.file.clone();
            let appended =
                self.tail.append(position, &[&bytes], self.now_ms, |page, at| file.read_exact_at(page, at)).unwrap();
            self.appended.extend_from_slice(&bytes);
            self.tail.assert_ends_at(self.appended.len() as u64);
            appended
        }

        fn file_bytes(&self) -> Vec<u8> {
            let mut out = vec![0; self.appended.len()];
            let len = self.file.metadata().unwrap().len() as usize;
            self.file.read_exact_at(&mut out[..len.min(self.appended.len())], 0).unwrap();
            out
        }
    }

    #[test]
    fn chunks_hold_what_was_appended_and_a_flush_puts_it_all_in_the_file_in_whole_pages() {
        for direct in [true, false] {
            let mut f = Fixture::new(direct);
            assert_eq!(f.append(1000), Appended::StartedChunk);
            assert_eq!(f.append(3000), Appended::Added);
            // Filling the first chunk within a second: the next one is twice as large.
            while f.append(5000) == Appended::Added {}
            assert_eq!(f.tail.chunks.len(), 2);
            assert_eq!(f.tail.chunks[1].shared.capacity, 2 * TAIL_CHUNK_BYTES_MIN);
            for _ in 0..40 {
                f.append(7000);
            }
            // Every position that starts an append reads back the bytes from there to its
            // chunk's end, without a copy.
            let start = f.tail.memory_start().unwrap() as usize;
            let read = f.tail.memory_from(start as u64, || f.now_ms).unwrap();
            assert_eq!(read[..], f.appended[start..start + read.len()]);
            assert!(f.tail.memory_from(f.appended.len() as u64, || f.now_ms).is_none(), "nothing past the end");
            assert!(f.tail.has_unwritten());
            // Nothing was written yet: a flush writes it all, the last page padded with zeros.
            f.tail.flush(&f.file).unwrap();
            assert!(!f.tail.has_unwritten());
            assert_eq!(f.file_bytes(), f.appended);
            let file_len = f.file.metadata().unwrap().len() as usize;
            assert!(file_len >= f.appended.len() && file_len <= f.appended.len().next_multiple_of(PAGE_BYTES));
            // More appends rewrite the partial last page as it was, then go on.
            f.append(10);
            f.append(9000);
            f.tail.flush(&f.file).unwrap();
            assert_eq!(f.file_bytes(), f.appended);
        }
    }

    #[test]
    fn a_chunk_sized_for_a_large_batch_is_followed_by_whole_page_chunks() {
        for direct in [true, false] {
            let mut f = Fixture::new(direct);
            f.append(100);
            // A batch of an odd number of pages past the largest chunk gets a chunk of its
            // own (prefix included): 257 pages.
            let large = TAIL_CHUNK_BYTES_MAX + PAGE_BYTES - 100;
            assert_eq!(f.append(large), Appended::StartedChunk);
            assert_eq!(f.tail.chunks.back().unwrap().shared.capacity, TAIL_CHUNK_BYTES_MAX + PAGE_BYTES);
            // Slowly filled: the next chunk halves, still whole pages (this panicked once).
            f.now_ms += 10 * CHUNK_GROW_WITHIN_MS;
            assert_eq!(f.append(4 * PAGE_BYTES), Appended::StartedChunk);
            let capacity = f.tail.chunks.back().unwrap().shared.capacity;
            assert_eq!(capacity, page_ceil((TAIL_CHUNK_BYTES_MAX + PAGE_BYTES) / 2));
            // Quickly filled: it doubles, to at most the largest chunk.
            while f.append(3000) == Appended::Added {}
            assert_eq!(f.tail.chunks.back().unwrap().shared.capacity, TAIL_CHUNK_BYTES_MAX);
            f.tail.flush(&f.file).unwrap();
            assert_eq!(f.file_bytes(), f.appended);
        }
    }

    #[test]
    fn the_writeback_writes_whole_pages_only_and_nothing_once_retired() {
        for direct in [true, false] {
            let mut f = Fixture::new(direct);
            for _ in 0..30 {
                f.append(5000);
            }
            let claim = f.tail.claim(f.file.clone(), 0).expect("whole pages are due");
            claim.write();
            let written = page_floor(f.appended.len());
            let file = f.file_bytes();
            assert_eq!(file[..written], f.appended[..written]);
            assert!(file[written..].iter().all(|&b| b == 0), "the partial last page waits for a flush");
            // A claim taken before a retire never lands.
            for _ in 0..30 {
                f.append(5000);
            }
            let claim = f.tail.claim(f.file.clone(), 0).expect("more pages are due");
            f.tail.retire();
            claim.write();
            assert!(f.file_bytes()[written..].iter().all(|&b| b == 0));
            // The flush still writes everything (a retired tail is flushed under the log's lock).
            f.tail.flush(&f.file).unwrap();
            assert_eq!(f.file_bytes(), f.appended);
        }
    }

    #[test]
    fn frozen_chunks_go_once_written_and_a_new_chunk_after_a_clear_reads_its_page_from_the_file() {
        for direct in [true, false] {
            let mut f = Fixture::new(direct);
            // Unwritten chunks all stay (readers and the file need them), past the most a
            // segment keeps once they are written.
            while f.tail.chunks.len() <= f.tail.frozen_max + 2 {
                f.append(60_000);
            }
            f.tail.claim(f.file.clone(), 0).unwrap().write();
            // The next chunk lets go of the written ones beyond those kept for readers.
            while f.append(60_000) == Appended::Added {}
            assert_eq!(f.tail.chunks.len(), f.tail.frozen_max + 1, "chunks kept");
            // The file holds everything before the memory's start.
            let start = f.tail.memory_start().unwrap() as usize;
            assert!(start > 0);
            assert_eq!(f.file_bytes()[..start], f.appended[..start]);
            // Idle: written out and let go; the next chunk starts from the file's partial page.
            f.tail.flush(&f.file).unwrap();
            f.tail.clear();
            assert!(f.tail.memory_start().is_none());
            f.now_ms += 10 * CHUNK_GROW_WITHIN_MS;
            assert_eq!(f.append(777), Appended::StartedChunk);
            f.tail.flush(&f.file).unwrap();
            assert_eq!(f.file_bytes(), f.appended);
        }
    }

    #[test]
    fn a_reader_of_a_chunk_that_froze_a_while_ago_keeps_the_chunks_it_comes_to() {
        let mut f = Fixture::new(true);
        f.now_ms = 1_000_000;
        while f.tail.chunks.len() < 4 {
            f.append(5000);
        }
        f.tail.claim(f.file.clone(), 0).unwrap().write();
        let first = f.tail.chunks[0].first_batch_position();
        assert!(readers_keep_up(&f.tail.reader_behind_ms, f.now_ms));
        // A reader of a chunk that froze a moment ago keeps up: nothing changes.
        let just_frozen = f.now_ms + TAIL_READER_LAGGING_MS - 1;
        assert!(f.tail.memory_from(first, || just_frozen).is_some());
        assert!(readers_keep_up(&f.tail.reader_behind_ms, just_frozen), "a reader that keeps up changes nothing");
        // The last chunk, not frozen, never counts as lagging.
        let last = f.tail.chunks.back().unwrap().first_batch_position();
        let late = f.now_ms + 10 * TAIL_READER_LAGGING_MS;
        assert!(f.tail.memory_from(last, || late).is_some());
        assert!(readers_keep_up(&f.tail.reader_behind_ms, late));
        // A reader of a chunk that froze long ago lags: the chunks it comes to stay past
        // their age for a while.
        assert!(f.tail.memory_from(first, || late).is_some());
        assert!(!readers_keep_up(&f.tail.reader_behind_ms, late), "a lagging reader is noted");
        const { assert!(TAIL_FROZEN_RETAIN_MS < READER_BEHIND_RETAIN_MS) };
        f.now_ms = late + TAIL_FROZEN_RETAIN_MS + 1;
        let chunks = f.tail.chunks.len();
        while f.append(5000) == Appended::Added {}
        assert_eq!(f.tail.chunks.len(), chunks + 1, "no chunk goes for its age while a reader lags");
        assert_eq!(f.tail.memory_start(), Some(first));
        // Once no reader lagged for a while, they go for their age again.
        f.now_ms += READER_BEHIND_RETAIN_MS;
        f.tail.claim(f.file.clone(), 0).unwrap().write();
        while f.append(5000) == Appended::Added {}
        assert_eq!(f.tail.chunks.len(), 2, "written chunks that froze long ago go");
        f.tail.flush(&f.file).unwrap();
        assert_eq!(f.file_bytes(), f.appended);
    }

    #[test]
    fn a_busy_partitions_written_chunks_stay_for_a_rebalance_and_smaller_ones_go_sooner() {
        let mut f = Fixture::new(true);
        f.now_ms = 1_000_000;
        // Filled within a second each, the chunks grow to the largest size.
        let busy = |f: &Fixture| f.tail.chunks.iter().filter(|c| c.shared.capacity == TAIL_CHUNK_BYTES_MAX).count();
        while busy(&f) < 3 {
            f.append(100_000);
        }
        assert!(f.tail.chunks[0].shared.capacity < TAIL_CHUNK_BYTES_MAX);
        let first_busy = f.tail.chunks.iter().find(|c| c.shared.capacity == TAIL_CHUNK_BYTES_MAX).unwrap();
        let first_busy = first_busy.first_batch_position();
        f.tail.claim(f.file.clone(), 0).unwrap().write();
        // Past the shorter age, the smaller written chunks go; the largest ones stay.
        f.now_ms += TAIL_FROZEN_RETAIN_MS + 1;
        while f.append(100_000) == Appended::Added {}
        assert_eq!(f.tail.memory_start(), Some(first_busy), "a busy partition's chunks stay past the shorter age");
        // Past the longer age, they go too.
        f.now_ms += TAIL_BUSY_FROZEN_RETAIN_MS + 1;
        f.tail.claim(f.file.clone(), 0).unwrap().write();
        while f.append(100_000) == Appended::Added {}
        assert_eq!(f.tail.chunks.len(), 2, "written chunks that froze long ago go");
        f.tail.flush(&f.file).unwrap();
        assert_eq!(f.file_bytes(), f.appended);
    }

    #[test]
    fn a_reader_behind_the_memory_leaves_the_writes_direct() {
        // In the build's directory, on the disk: a temporary directory may be a tmpfs,
        // which refuses direct I/O.
        let dir = tempfile::tempdir_in(concat!(env!("CARGO_MANIFEST_DIR"), "/../../target")).unwrap();
        let mut f = Fixture::new_in(true, dir);
        let cached = |f: &Fixture, from: usize, to: usize| {
            crate::page_cache::cachestat(&f.file, from as u64, (to - from) as u64)
                .expect("cachestat (Linux 6.5)")
                .nr_cache
        };
        let write_more = |f: &mut Fixture| {
            let from = page_ceil(f.appended.len());
            for _ in 0..30 {
                f.append(5000);
            }
            f.tail.claim(f.file.clone(), 0).expect("whole pages are due").write();
            (from, page_floor(f.appended.len()))
        };
        // Direct: the file gets the bytes, the page cache none of them (checked before any
        // read of the file, which would cache what it reads).
        let (from, to) = write_more(&mut f);
        assert!(!f.tail.writer.lock().direct_refused, "the filesystem of target/ refuses O_DIRECT");
        assert_eq!(cached(&f, from, to), 0, "direct writes leave nothing cached");
        assert_eq!(f.file_bytes()[from..to], f.appended[from..to]);
        // A reader read the file behind the memory: the writes stay direct (it reads the
        // file directly too), the writeback's and the flush's.
        f.tail.note_reader_behind(crate::now_ms());
        let (from, to) = write_more(&mut f);
        assert_eq!(cached(&f, from, to), 0, "a lagging reader turns no write to the page cache");
        f.append(7000);
        let flushed_from = page_ceil(to);
        f.tail.flush(&f.file).unwrap();
        let flushed_to = page_floor(f.appended.len());
        assert!(flushed_to > flushed_from);
        assert_eq!(cached(&f, flushed_from, flushed_to), 0);
        assert_eq!(f.file_bytes(), f.appended);
    }
}
