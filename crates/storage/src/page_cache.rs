//! What the kernel's page cache holds of a file and what to do with it: `cachestat`
//! queries (a fetch that would wait for the disk goes to the blocking pool), readahead and
//! drop advice, and paced write-back. Advice and queries only: nothing here is a
//! durability step (those are `durable.rs`).

use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::sync::OnceLock;

/// The steady writeback's disk writes: this many bytes each, at most two in flight.
pub(crate) const WRITEBACK_CHUNK_BYTES: u64 = 256 * 1024;

fn page_bytes() -> u64 {
    static PAGE_BYTES: OnceLock<u64> = OnceLock::new();
    *PAGE_BYTES.get_or_init(|| {
        // SAFETY: sysconf has no preconditions.
        u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(1)
    })
}

/// How many pages of `file` in [position, position + length) are not in the page cache
/// (`cachestat`, Linux 6.5); `None` when that cannot be told.
pub(crate) fn missing_pages(file: &File, position: u64, length: u64) -> Option<u64> {
    if length == 0 {
        return Some(0);
    }
    let page = page_bytes();
    let pages = (position + length - 1) / page - position / page + 1;
    cached_pages(file, position, length).map(|cached| pages.saturating_sub(cached))
}

/// How many pages of `file` in [position, position + length) are in the page cache
/// (`cachestat`, Linux 6.5); `None` when that cannot be told.
pub(crate) fn cached_pages(file: &File, position: u64, length: u64) -> Option<u64> {
    cachestat(file, position, length).map(|stat| stat.nr_cache)
}

/// The page-cache state of a file range, as `cachestat` (Linux 6.5) reports it.
#[repr(C)]
#[derive(Debug, Default)]
pub struct Cachestat {
    pub nr_cache: u64,
    pub nr_dirty: u64,
    pub nr_writeback: u64,
    pub nr_evicted: u64,
    pub nr_recently_evicted: u64,
}

/// `cachestat` of `file` in [position, position + length); `None` when the kernel cannot
/// tell (before Linux 6.5).
pub fn cachestat(file: &File, position: u64, length: u64) -> Option<Cachestat> {
    #[repr(C)]
    struct CachestatRange {
        off: u64,
        len: u64,
    }
    /// The same number on every architecture (added after the tables were unified).
    const SYS_CACHESTAT: libc::c_long = 451;
    let range = CachestatRange { off: position, len: length };
    let mut stat = Cachestat::default();
    // SAFETY: both pointers are to live, properly laid out structs for the call's duration.
    let done = unsafe {
        libc::syscall(SYS_CACHESTAT, file.as_raw_fd(), &range as *const CachestatRange, &mut stat as *mut Cachestat, 0)
    };
    (done == 0).then_some(stat)
}

/// Writes `[from, to)` of `file` to the disk and waits for it (`sync_file_range`),
/// [`WRITEBACK_CHUNK_BYTES`] at a time with at most two chunks in flight.
///
/// Why: the segment files' bytes otherwise reach the disk all at once, when the
/// checkpoint's `fdatasync`s (or the kernel's flusher) write seconds of them in one burst,
/// and every WAL round (a producer's acknowledgement) then waits behind tens of MiB in the
/// device's queue. Written back as they come, in short writes, a round waits behind at
/// most two of them. Not a durability step: `sync_file_range` flushes neither the
/// device's cache nor metadata, and the checkpoint's `fdatasync` still follows. Skipped
/// when fsyncs are, like every other write to the disk that this crate asks for (on the
/// power-loss tests' FUSE filesystem it would persist nothing either way: they fail as
/// they should with or without the skip).
pub(crate) fn write_back(file: &File, from: u64, to: u64) {
    if crate::durable::fsync_skipped() || from >= to {
        return;
    }
    let range = |start: u64, end: u64, flags: libc::c_uint| {
        let (Ok(at), Ok(len)) = (libc::off64_t::try_from(start), libc::off64_t::try_from(end - start)) else { return };
        // SAFETY: a writeback request on a descriptor we hold; no memory is passed.
        // A failure (EIO) surfaces at the checkpoint's fdatasync.
        unsafe { libc::sync_file_range(file.as_raw_fd(), at, len, flags) };
    };
    let mut in_flight: Option<(u64, u64)> = None;
    let mut start = from;
    while start < to {
        let end = (start + WRITEBACK_CHUNK_BYTES).min(to);
        range(start, end, libc::SYNC_FILE_RANGE_WRITE);
        if let Some((a, b)) = in_flight.replace((start, end)) {
            range(a, b, libc::SYNC_FILE_RANGE_WAIT_BEFORE);
        }
        start = end;
    }
    if let Some((a, b)) = in_flight {
        range(a, b, libc::SYNC_FILE_RANGE_WAIT_BEFORE);
    }
}

/// Turns the kernel's readahead off for `file` (advice: a failure changes nothing but the
/// cache). Every read of a segment asks for the bytes it will use, in large reads where
/// that is much (a catch-up read takes up to 4 MiB); readahead of the disk's window
/// (8 MiB here) beyond them would only be dropped, under memory pressure, before the next
/// read wants it, and the cache-only probe of a fetch would start it on the async thread.
pub(crate) fn without_readahead(file: &File) {
    // SAFETY: advice on an open file descriptor we own.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
}

/// Asks the kernel to drop the clean cached pages wholly inside `[position, position +
/// length)`; the partial pages at its ends stay (advice: a failure changes nothing but the
/// cache).
pub(crate) fn drop_from_page_cache(file: &File, position: u64, length: u64) {
    let (Ok(at), Ok(len)) = (libc::off_t::try_from(position), libc::off_t::try_from(length)) else { return };
    // SAFETY: advice on an open file descriptor we own, with in-range arguments.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), at, len, libc::POSIX_FADV_DONTNEED) };
}
