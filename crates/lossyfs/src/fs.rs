//! The lossy filesystem: a view of a backing directory in which file data written but not
//! fsynced lives in memory only, so [`LossyState::crash`] makes it vanish as a power cut
//! would. This is what makes a power-loss test able to fail: `kill -9` alone keeps the page
//! cache, so a broker that never fsyncs would pass it.
//!
//! # What a crash keeps
//!
//! Data writes and size changes (write, truncate, fallocate) go to a per-inode overlay of
//! 4 KiB pages plus a logical size. `fsync`/`fdatasync` of a file writes its whole overlay
//! to the backing file and fsyncs it, and so does a synchronous write (`RWF_DSYNC`,
//! `RWF_SYNC`, a file opened `O_DSYNC` or `O_SYNC`) once written; closing a file persists
//! nothing. So every byte not covered by a successful fsync, fdatasync or synchronous write
//! is lost at a crash whatever the file was opened with, `O_DIRECT` included (direct I/O
//! skips the page cache, not the disk's volatile cache), and so is a size not synced: an
//! extension and a truncation both revert. Space fallocated (mode 0, which may extend the
//! file, or `FALLOC_FL_KEEP_SIZE`, which changes nothing a reader sees) reads back as zeros
//! before and after a crash; other modes (punching holes, zeroing ranges) answer EOPNOTSUPP.
//!
//! Names and attributes: by default the namespace operations (create, mknod, mkdir,
//! symlink, unlink, rmdir, rename) and attribute changes (chmod, chown, utimes) pass
//! straight through and are durable at once, as in LazyFS's default: a file created and
//! never fsynced survives a crash, empty. With [`Strictness::lose_unsynced_dir_entries`]
//! (`--lose-unsynced-dir-entries`) a namespace operation is durable only once the directory
//! holding the entry is fsynced (for a rename: the destination's directory) and a crash
//! undoes the others, newest first, as a power cut on a strict POSIX filesystem may (see
//! `journal.rs`): a file's own fsync does not make its name durable, and the data of a file
//! whose creation is undone goes with it. Attribute changes stay durable at once in both
//! modes. After such a crash every inode number is fresh (the processes that used the
//! mount are dead, and the names they knew may have moved).
//!
//! Not modelled: a crash falls between two requests, never inside one, so nothing is torn
//! (no sector half written, no fsync half done); and no unsynced byte survives, so the
//! order in which a disk would have persisted unsynced writes is moot (a real power cut may
//! keep some of them, in any order; this keeps none). Hard links and extended attributes
//! are not supported (ENOSYS).
//!
//! # How files are opened
//!
//! Every open file bypasses the kernel page cache (`FOPEN_DIRECT_IO`) and attributes are
//! never cached, so after a crash readers see exactly what survived. With
//! [`OpenMode::PageCache`] (`--page-cache`) files go through the kernel's page cache
//! instead, which programs that `mmap` their files need (Kafka's indexes; FUSE refuses
//! shared mmap of direct-I/O files): each open drops the file's cached pages, so a
//! restarted program still reads what survived, but dirty mmapped pages reach this
//! filesystem only by the kernel's writeback.
//!
//! # Split direct writes
//!
//! With [`Strictness::split_direct_writes`] (`--split-direct-writes`, page-cache mode only)
//! a large direct-I/O write is damaged as a multi-threaded daemon (LazyFS) can damage it.
//! The kernel splits a write to a file opened `O_DIRECT` on a page-cache mount into
//! requests of [`MAX_WRITE_BYTES`] and, with asynchronous direct I/O (which this mode asks
//! for, as libfuse does by default), sends them all at once. LazyFS fills the gap before a
//! request that starts past its end of file with zeros, and when it handles request 2
//! before request 1 has grown the file, that fill lands over request 1's bytes. This
//! filesystem handles requests one at a time, in order, so it emulates the worst order: a
//! direct write request that starts where the previous direct write request to the same
//! inode ended, that one being exactly `MAX_WRITE_BYTES` long, is a later piece of the same
//! write; if it starts past the file's size before the first piece, the range from that
//! size to the piece is overwritten with zeros (ordinary unsynced data) before the piece is
//! written. A 2 MiB `O_DIRECT` write at offset 0 to a 4 KiB file leaves [4 KiB, 1 MiB)
//! zeros. Two separate direct writes of exactly `MAX_WRITE_BYTES`, the second starting
//! where the first ended, reach this filesystem exactly as the two pieces of one write do
//! (only the kernel's count of requests in flight differs), so they are damaged alike. In
//! the default mode the kernel sends the pieces of a synchronous write one after another,
//! which is why the mode needs `--page-cache`.
//!
//! # Control
//!
//! The file `/.lossyfs-control` at the mount root (not in the backing directory) takes
//! `crash` (drop every unsynced byte and undo every namespace change not yet durable) and
//! `sync` (make everything durable, as an unmount does) written to it, and `fail-fsync` /
//! `heal` to start and stop a failing disk: while it fails, every `fsync` of a file or
//! directory answers EIO, and the unsynced data of a file whose fsync failed is never
//! persisted afterwards (Linux marks such pages clean: a retried fsync reports success
//! without writing them, PostgreSQL's "fsyncgate"); it stays readable until the next crash
//! drops it. A program that retries a failed fsync and trusts its success is caught by the
//! next crash. The trash of `--lose-unsynced-dir-entries`, `/.lossyfs-trash` in the backing
//! directory, is hidden from the mount.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::fs::{File, OpenOptions};
use std::io;
use std::ops::Range;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::consts::{FOPEN_DIRECT_IO, FUSE_ASYNC_DIO};
use fuser::{
    FileAttr, FileType, Filesystem, KernelConfig, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, FUSE_ROOT_ID,
};

use crate::journal::{Journal, Undone};

/// The overlay's unit: a write touching part of a page loads the rest from the backing file.
pub const PAGE_BYTES: u64 = 4096;
/// The control file's name at the mount root.
pub const CONTROL_FILE: &str = ".lossyfs-control";
/// The trash of `--lose-unsynced-dir-entries` at the backing root, hidden from the mount.
pub const TRASH_DIR: &str = ".lossyfs-trash";
/// Largest write the kernel may send in one request (max_write). A direct-I/O write is split
/// into requests of exactly this size; the kernel reaches it only with `FUSE_MAX_PAGES`
/// negotiated (fuser's `abi-7-28`), and stops at 128 KiB without.
pub const MAX_WRITE_BYTES: u32 = 1 << 20;
const CONTROL_INO: u64 = 2;
const FIRST_INO: u64 = 16;
/// Nothing is cached by the kernel: every lookup and attribute comes from here.
const TTL: Duration = Duration::ZERO;

/// Unsynced data of one file.
#[derive(Default)]
struct Overlay {
    /// Page index -> page content (always `PAGE_BYTES` long).
    pages: BTreeMap<u64, Vec<u8>>,
    /// The file's size as readers see it.
    size: u64,
    /// Backing bytes at or past this offset are stale (cut by a truncation since the last
    /// sync): they read as zeros unless a page covers them.
    backing_valid: u64,
    /// An fsync of this data failed: it is never persisted (see the module doc).
    lost: bool,
}

struct Node {
    /// Backing path; `None` once unlinked (the node lives on while handles are open).
    path: Option<PathBuf>,
    overlay: Option<Overlay>,
    open_handles: u32,
}

/// Counters reported on crash.
#[derive(Default, Debug, Clone, Copy)]
pub struct Dropped {
    /// Files whose unsynced data was dropped.
    pub files: u64,
    /// Pages of unsynced data dropped.
    pub pages: u64,
    /// Namespace changes undone (`--lose-unsynced-dir-entries`).
    pub entries: Undone,
}

impl Dropped {
    /// One line for the log.
    pub fn describe(&self) -> String {
        format!(
            "dropped unsynced data of {} files ({} pages), undid {} namespace changes ({} skipped)",
            self.files, self.pages, self.entries.changes, self.entries.skipped
        )
    }
}

/// The opt-in strictness modes (see the module doc); both off is LazyFS's default model.
#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
pub struct Strictness {
    /// `--lose-unsynced-dir-entries`: a namespace change is durable only once its
    /// directory is fsynced.
    pub lose_unsynced_dir_entries: bool,
    /// `--split-direct-writes`: the later pieces of a direct write split into requests
    /// zero the gap their predecessors had filled (needs [`OpenMode::PageCache`]).
    pub split_direct_writes: bool,
}

/// The last `O_DIRECT` write request to an inode, with `--split-direct-writes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DirectPiece {
    /// Where the request ended: where the next piece of the same write starts.
    end: u64,
    length: u64,
    /// The file's size before the first piece of the write this request belongs to.
    size_before_write: u64,
}

impl DirectPiece {
    /// The piece a direct write request of `length` bytes at `offset` is, to a file of
    /// `size` bytes whose last direct write request was `previous`; and the range its gap
    /// fill zeroes, when it is a later piece that starts past the size before the write.
    fn next(previous: Option<DirectPiece>, offset: u64, length: u64, size: u64) -> (DirectPiece, Option<Range<u64>>) {
        let continued = previous.filter(|piece| piece.end == offset && piece.length == u64::from(MAX_WRITE_BYTES));
        let size_before_write = continued.map_or(size, |piece| piece.size_before_write);
        let gap = (continued.is_some() && offset > size_before_write).then_some(size_before_write..offset);
        (DirectPiece { end: offset + length, length, size_before_write }, gap)
    }
}

/// Everything the filesystem knows, shared with the signal handler thread.
pub struct LossyState {
    backing: PathBuf,
    nodes: HashMap<u64, Node>,
    by_path: HashMap<PathBuf, u64>,
    /// fh -> (ino, backing file)
    handles: HashMap<u64, (u64, File)>,
    next_ino: u64,
    next_fh: u64,
    /// `fail-fsync` was written and `heal` not yet: every fsync answers EIO.
    failing_fsync: bool,
    /// The namespace changes not yet durable, with `--lose-unsynced-dir-entries`.
    journal: Option<Journal>,
    split_direct_writes: bool,
    /// ino -> its last direct write request, with `--split-direct-writes`; any other change
    /// to the file's data or size forgets it.
    direct_pieces: HashMap<u64, DirectPiece>,
}

fn errno(error: &io::Error) -> i32 {
    error.raw_os_error().unwrap_or(libc::EIO)
}

fn kind_of(file_type: std::fs::FileType) -> FileType {
    use std::os::unix::fs::FileTypeExt;
    if file_type.is_dir() {
        FileType::Directory
    } else if file_type.is_symlink() {
        FileType::Symlink
    } else if file_type.is_fifo() {
        FileType::NamedPipe
    } else if file_type.is_socket() {
        FileType::Socket
    } else if file_type.is_block_device() {
        FileType::BlockDevice
    } else if file_type.is_char_device() {
        FileType::CharDevice
    } else {
        FileType::RegularFile
    }
}

fn time(seconds: i64, nanos: i64) -> SystemTime {
    if seconds >= 0 {
        UNIX_EPOCH + Duration::new(seconds as u64, nanos as u32)
    } else {
        UNIX_EPOCH
    }
}

fn attr_of(ino: u64, meta: &std::fs::Metadata, size: Option<u64>) -> FileAttr {
    let size = size.unwrap_or(meta.len());
    FileAttr {
        ino,
        size,
        blocks: size.div_ceil(512),
        atime: time(meta.atime(), meta.atime_nsec()),
        mtime: time(meta.mtime(), meta.mtime_nsec()),
        ctime: time(meta.ctime(), meta.ctime_nsec()),
        crtime: UNIX_EPOCH,
        kind: kind_of(meta.file_type()),
        perm: (meta.mode() & 0o7777) as u16,
        nlink: meta.nlink() as u32,
        uid: meta.uid(),
        gid: meta.gid(),
        rdev: meta.rdev() as u32,
        blksize: PAGE_BYTES as u32,
        flags: 0,
    }
}

fn control_attr() -> FileAttr {
    FileAttr {
        ino: CONTROL_INO,
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0o600,
        nlink: 1,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: PAGE_BYTES as u32,
        flags: 0,
    }
}

/// Reads `buf.len()` bytes at `offset` from `file`, zeros past its end or past `valid`.
fn read_backing(file: &File, offset: u64, buf: &mut [u8], valid: u64) -> io::Result<()> {
    buf.fill(0);
    if offset >= valid {
        return Ok(());
    }
    let want = ((valid - offset) as usize).min(buf.len());
    let mut done = 0;
    while done < want {
        match file.read_at(&mut buf[done..want], offset + done as u64)? {
            0 => break,
            n => done += n,
        }
    }
    Ok(())
}

impl Overlay {
    fn new(backing_size: u64) -> Overlay {
        Overlay { pages: BTreeMap::new(), size: backing_size, backing_valid: backing_size, lost: false }
    }

    fn page_mut(&mut self, index: u64, backing: &File) -> io::Result<&mut Vec<u8>> {
        if !self.pages.contains_key(&index) {
            let mut page = vec![0; PAGE_BYTES as usize];
            read_backing(backing, index * PAGE_BYTES, &mut page, self.backing_valid)?;
            self.pages.insert(index, page);
        }
        Ok(self.pages.get_mut(&index).expect("just inserted"))
    }

    fn write(&mut self, backing: &File, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut done = 0usize;
        while done < data.len() {
            let at = offset + done as u64;
            let index = at / PAGE_BYTES;
            let within = (at % PAGE_BYTES) as usize;
            let n = (PAGE_BYTES as usize - within).min(data.len() - done);
            self.page_mut(index, backing)?[within..within + n].copy_from_slice(&data[done..done + n]);
            done += n;
        }
        self.size = self.size.max(offset + data.len() as u64);
        Ok(())
    }

    /// Overwrites `range` with zeros.
    fn zero(&mut self, backing: &File, range: Range<u64>) -> io::Result<()> {
        const ZEROS: [u8; PAGE_BYTES as usize] = [0; PAGE_BYTES as usize];
        let mut at = range.start;
        while at < range.end {
            let length = (PAGE_BYTES - at % PAGE_BYTES).min(range.end - at);
            self.write(backing, at, &ZEROS[..length as usize])?;
            at += length;
        }
        Ok(())
    }

    fn set_size(&mut self, backing: &File, size: u64) -> io::Result<()> {
        if size < self.size {
            // Bytes past the new end must read as zeros if the file grows again.
            if size % PAGE_BYTES != 0 {
                let page = self.page_mut(size / PAGE_BYTES, backing)?;
                page[(size % PAGE_BYTES) as usize..].fill(0);
            }
            let first_gone = size.div_ceil(PAGE_BYTES);
            self.pages.retain(|&index, _| index < first_gone);
            self.backing_valid = self.backing_valid.min(size);
        }
        self.size = size;
        Ok(())
    }

    fn read(&self, backing: &File, offset: u64, length: usize) -> io::Result<Vec<u8>> {
        if offset >= self.size {
            return Ok(Vec::new());
        }
        let length = ((self.size - offset) as usize).min(length);
        let mut out = vec![0; length];
        read_backing(backing, offset, &mut out, self.backing_valid)?;
        let first = offset / PAGE_BYTES;
        let last = (offset + length as u64 - 1) / PAGE_BYTES;
        for (&index, page) in self.pages.range(first..=last) {
            let page_start = index * PAGE_BYTES;
            let from = offset.max(page_start);
            let to = (offset + length as u64).min(page_start + PAGE_BYTES);
            out[(from - offset) as usize..(to - offset) as usize]
                .copy_from_slice(&page[(from - page_start) as usize..(to - page_start) as usize]);
        }
        Ok(out)
    }

    /// Writes everything to the backing file and fsyncs it.
    fn persist(&self, backing: &File) -> io::Result<()> {
        if self.backing_valid < backing.metadata()?.len() {
            backing.set_len(self.backing_valid)?;
        }
        for (&index, page) in &self.pages {
            let start = index * PAGE_BYTES;
            if start >= self.size {
                continue;
            }
            let end = (start + PAGE_BYTES).min(self.size);
            backing.write_all_at(&page[..(end - start) as usize], start)?;
        }
        backing.set_len(self.size)?;
        backing.sync_all()
    }
}

impl LossyState {
    pub fn new(backing: &Path, strictness: Strictness) -> io::Result<LossyState> {
        let backing = backing.canonicalize()?;
        // Deletes the trash a previous run left, if any, in either mode (it is hidden).
        let journal = Journal::new(backing.join(TRASH_DIR))?;
        let mut state = LossyState {
            backing,
            nodes: HashMap::new(),
            by_path: HashMap::new(),
            handles: HashMap::new(),
            next_ino: FIRST_INO,
            next_fh: 1,
            failing_fsync: false,
            journal: strictness.lose_unsynced_dir_entries.then_some(journal),
            split_direct_writes: strictness.split_direct_writes,
            direct_pieces: HashMap::new(),
        };
        state.forget_nodes();
        Ok(state)
    }

    /// Forgets every node but the root: inode numbers given from now on are fresh.
    fn forget_nodes(&mut self) {
        self.nodes.clear();
        self.by_path.clear();
        self.nodes.insert(FUSE_ROOT_ID, Node { path: Some(self.backing.clone()), overlay: None, open_handles: 0 });
        self.by_path.insert(self.backing.clone(), FUSE_ROOT_ID);
    }

    /// Drops every unsynced byte of every file and undoes every namespace change not yet
    /// durable (a power cut).
    pub fn crash(&mut self) -> Dropped {
        let mut dropped = Dropped::default();
        for node in self.nodes.values_mut() {
            if let Some(overlay) = node.overlay.take() {
                dropped.files += 1;
                dropped.pages += overlay.pages.len() as u64;
            }
        }
        self.direct_pieces.clear();
        if let Some(journal) = &mut self.journal {
            dropped.entries = journal.undo_all();
            // Names moved under the nodes' feet; nothing that used them survived the crash.
            self.forget_nodes();
        }
        dropped
    }

    /// Persists every file's unsynced data and every namespace change (a global `sync`).
    pub fn sync_all(&mut self) -> io::Result<()> {
        let inos: Vec<u64> = self.nodes.keys().copied().collect();
        for ino in inos {
            self.persist(ino, None)?;
        }
        match &mut self.journal {
            Some(journal) => journal.make_durable(),
            None => Ok(()),
        }
    }

    /// Whether `--split-direct-writes` is on.
    pub fn split_direct_writes(&self) -> bool {
        self.split_direct_writes
    }

    fn path(&self, ino: u64) -> Result<PathBuf, i32> {
        self.nodes.get(&ino).and_then(|n| n.path.clone()).ok_or(libc::ENOENT)
    }

    fn ino_for(&mut self, path: &Path) -> u64 {
        if let Some(&ino) = self.by_path.get(path) {
            return ino;
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        self.nodes.insert(ino, Node { path: Some(path.to_path_buf()), overlay: None, open_handles: 0 });
        self.by_path.insert(path.to_path_buf(), ino);
        ino
    }

    /// A backing file for `ino`: the handle's when given, else any open handle's, else the path.
    fn backing_file(&self, ino: u64, fh: Option<u64>) -> io::Result<File> {
        if let Some((_, file)) = fh.and_then(|fh| self.handles.get(&fh)) {
            return file.try_clone();
        }
        if let Some((_, file)) = self.handles.values().find(|(i, _)| *i == ino) {
            return file.try_clone();
        }
        let path = self.path(ino).map_err(io::Error::from_raw_os_error)?;
        OpenOptions::new().read(true).write(true).open(path)
    }

    fn attr(&self, ino: u64, fh: Option<u64>) -> io::Result<FileAttr> {
        if ino == CONTROL_INO {
            return Ok(control_attr());
        }
        let node = self.nodes.get(&ino).ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
        let meta = match &node.path {
            Some(path) => std::fs::symlink_metadata(path)?,
            None => self.backing_file(ino, fh)?.metadata()?,
        };
        Ok(attr_of(ino, &meta, node.overlay.as_ref().map(|o| o.size)))
    }

    /// Runs `change` on `ino`'s overlay, creating it from the backing file's size first.
    fn with_overlay<T>(
        &mut self,
        ino: u64,
        fh: Option<u64>,
        change: impl FnOnce(&mut Overlay, &File) -> io::Result<T>,
    ) -> io::Result<T> {
        let file = self.backing_file(ino, fh)?;
        let backing_size = file.metadata()?.len();
        let node = self.nodes.get_mut(&ino).ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
        let overlay = node.overlay.get_or_insert_with(|| Overlay::new(backing_size));
        // Whatever changes the file ends a split direct write (the caller of a direct
        // write request took its piece out first).
        self.direct_pieces.remove(&ino);
        change(overlay, &file)
    }

    fn persist(&mut self, ino: u64, fh: Option<u64>) -> io::Result<()> {
        let Some(node) = self.nodes.get(&ino) else { return Ok(()) };
        if node.overlay.is_none() {
            return Ok(());
        }
        if node.path.is_none() && node.open_handles == 0 {
            // Unlinked and closed: nothing can read it again.
            self.nodes.get_mut(&ino).expect("present").overlay = None;
            return Ok(());
        }
        if node.overlay.as_ref().is_some_and(|overlay| overlay.lost) {
            return Ok(());
        }
        let file = self.backing_file(ino, fh)?;
        let node = self.nodes.get_mut(&ino).expect("present");
        node.overlay.as_ref().expect("checked").persist(&file)?;
        node.overlay = None;
        Ok(())
    }

    /// An application's `fsync`/`fdatasync` of a file.
    fn fsync(&mut self, ino: u64, fh: u64) -> io::Result<()> {
        if self.failing_fsync {
            if let Some(overlay) = self.nodes.get_mut(&ino).and_then(|node| node.overlay.as_mut()) {
                overlay.lost = true;
            }
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        self.persist(ino, Some(fh))
    }

    /// A write request; `flags` are the file's open flags and the write's own, as the
    /// kernel passes them.
    fn write(&mut self, ino: u64, fh: u64, offset: u64, data: &[u8], flags: i32) -> io::Result<()> {
        let direct = self.split_direct_writes && flags & libc::O_DIRECT != 0;
        let previous = self.direct_pieces.remove(&ino);
        let length = data.len() as u64;
        let piece = self.with_overlay(ino, Some(fh), |overlay, file| {
            let piece = direct.then(|| DirectPiece::next(previous, offset, length, overlay.size));
            if let Some((_, Some(gap))) = &piece {
                // The earlier pieces have landed; this one's gap fill goes over them.
                eprintln!(
                    "lossyfs: split direct write to inode {ino}: zeroed [{}, {}) before the piece at {offset}",
                    gap.start, gap.end
                );
                overlay.zero(file, gap.clone())?;
            }
            overlay.write(file, offset, data)?;
            Ok(piece)
        })?;
        if let Some((piece, _)) = piece {
            self.direct_pieces.insert(ino, piece);
        }
        // A synchronous write (`RWF_DSYNC`, `O_DSYNC`/`O_SYNC`; the kernel passes the
        // write's own flag in `flags`) is durable once answered, as a write and an
        // fdatasync. This makes the whole file durable, more than a device's FUA write
        // promises for earlier writes: what relies on that is not tested here.
        if flags & libc::O_DSYNC != 0 {
            return self.fsync(ino, fh);
        }
        Ok(())
    }

    /// An application's `fsync`/`fdatasync` of a directory: with
    /// `--lose-unsynced-dir-entries`, the changes of its entries become durable.
    fn fsyncdir(&mut self, ino: u64) -> io::Result<()> {
        if self.failing_fsync {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        let path = self.path(ino).map_err(io::Error::from_raw_os_error)?;
        File::open(&path)?.sync_all()?;
        match &mut self.journal {
            Some(journal) => journal.dir_synced(&path),
            None => Ok(()),
        }
    }

    /// Records that `path` was just created (create, mknod, mkdir, symlink).
    fn created(&mut self, path: &Path) -> io::Result<()> {
        match &mut self.journal {
            Some(journal) => journal.created(path),
            None => Ok(()),
        }
    }

    /// unlink(2), or rmdir(2) when `directory`, of the backing `path`.
    fn remove(&mut self, path: &Path, directory: bool) -> io::Result<()> {
        match (&mut self.journal, directory) {
            (Some(journal), _) => journal.remove(path, directory)?,
            (None, false) => std::fs::remove_file(path)?,
            (None, true) => std::fs::remove_dir(path)?,
        }
        self.unlinked(path);
        Ok(())
    }

    /// rename(2) of the backing `from` to `to`.
    fn rename(&mut self, from: &Path, to: &Path) -> io::Result<()> {
        match &mut self.journal {
            Some(journal) => journal.rename(from, to)?,
            None => std::fs::rename(from, to)?,
        }
        self.renamed(from, to);
        Ok(())
    }

    fn read(&self, ino: u64, fh: u64, offset: u64, length: usize) -> io::Result<Vec<u8>> {
        let file = self.backing_file(ino, Some(fh))?;
        match self.nodes.get(&ino).and_then(|n| n.overlay.as_ref()) {
            Some(overlay) => overlay.read(&file, offset, length),
            None => {
                let size = file.metadata()?.len();
                if offset >= size {
                    return Ok(Vec::new());
                }
                let mut out = vec![0; ((size - offset) as usize).min(length)];
                read_backing(&file, offset, &mut out, size)?;
                Ok(out)
            }
        }
    }

    /// Forgets `path` (unlinked or replaced); its node lives on while it has open handles.
    fn unlinked(&mut self, path: &Path) {
        if let Some(ino) = self.by_path.remove(path) {
            let node = self.nodes.get_mut(&ino).expect("indexed nodes exist");
            node.path = None;
            if node.open_handles == 0 {
                self.nodes.remove(&ino);
            }
        }
    }

    fn renamed(&mut self, from: &Path, to: &Path) {
        self.unlinked(to);
        let moved: Vec<(PathBuf, u64)> = self
            .by_path
            .iter()
            .filter(|(path, _)| path.starts_with(from))
            .map(|(path, &ino)| (path.clone(), ino))
            .collect();
        for (old, ino) in moved {
            let below = old.strip_prefix(from).expect("filtered by prefix");
            // `join("")` would add a trailing separator.
            let new = if below.as_os_str().is_empty() { to.to_path_buf() } else { to.join(below) };
            self.by_path.remove(&old);
            self.by_path.insert(new.clone(), ino);
            self.nodes.get_mut(&ino).expect("indexed nodes exist").path = Some(new);
        }
    }

    fn add_handle(&mut self, ino: u64, file: File) -> u64 {
        let fh = self.next_fh;
        self.next_fh += 1;
        self.handles.insert(fh, (ino, file));
        if let Some(node) = self.nodes.get_mut(&ino) {
            node.open_handles += 1;
        }
        fh
    }

    fn control(&mut self, command: &str) -> io::Result<()> {
        match command.trim() {
            "crash" => {
                let dropped = self.crash();
                eprintln!("lossyfs: crash: {}", dropped.describe());
                Ok(())
            }
            "sync" => self.sync_all(),
            "fail-fsync" => {
                eprintln!("lossyfs: fsync fails with EIO from now on");
                self.failing_fsync = true;
                Ok(())
            }
            "heal" => {
                eprintln!("lossyfs: fsync works again");
                self.failing_fsync = false;
                Ok(())
            }
            _ => Err(io::Error::from_raw_os_error(libc::EINVAL)),
        }
    }
}

/// How files are opened (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    DirectIo,
    PageCache,
}

/// The FUSE front end over a shared [`LossyState`].
pub struct LossyFs {
    state: Arc<Mutex<LossyState>>,
    /// `FOPEN_*` flags of every opened file.
    open_flags: u32,
    /// Each open directory's listing, taken at its first `readdir` and read on by offset:
    /// the kernel reads a directory a page of entries at a time, and listing the backing
    /// directory again for each page cost O(entries²) (minutes for a log of thousands of
    /// segments, during which the broker's every directory operation waited).
    listings: HashMap<u64, Vec<(u64, FileType, OsString)>>,
    next_dir_handle: u64,
}

impl LossyFs {
    pub fn new(state: Arc<Mutex<LossyState>>, mode: OpenMode) -> LossyFs {
        let open_flags = match mode {
            OpenMode::DirectIo => FOPEN_DIRECT_IO,
            OpenMode::PageCache => 0,
        };
        LossyFs { state, open_flags, listings: HashMap::new(), next_dir_handle: 1 }
    }

    fn state(&self) -> MutexGuard<'_, LossyState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A directory's entries as `readdir` hands them out: `.`, `..`, then the backing
    /// directory's (the root's trash hidden).
    fn list(&self, ino: u64) -> Result<Vec<(u64, FileType, OsString)>, i32> {
        let mut state = self.state();
        let path = state.path(ino)?;
        let entries = std::fs::read_dir(&path).map_err(|error| errno(&error))?;
        let mut listing = vec![(ino, FileType::Directory, ".".into()), (ino, FileType::Directory, "..".into())];
        for entry in entries.flatten() {
            if ino == FUSE_ROOT_ID && entry.file_name() == TRASH_DIR {
                continue;
            }
            let Ok(file_type) = entry.file_type() else { continue };
            let child = state.ino_for(&entry.path());
            listing.push((child, kind_of(file_type), entry.file_name()));
        }
        Ok(listing)
    }

    fn entry_reply(&self, path: &Path, reply: ReplyEntry) {
        let mut state = self.state();
        match std::fs::symlink_metadata(path) {
            Ok(_) => {
                let ino = state.ino_for(path);
                match state.attr(ino, None) {
                    Ok(attr) => reply.entry(&TTL, &attr, 0),
                    Err(error) => reply.error(errno(&error)),
                }
            }
            Err(error) => reply.error(errno(&error)),
        }
    }

    /// The backing path of `name` in `parent`; the trash's name is not one programs may use.
    fn child(&self, parent: u64, name: &OsStr) -> Result<PathBuf, i32> {
        if parent == FUSE_ROOT_ID && name == TRASH_DIR {
            return Err(libc::EPERM);
        }
        Ok(self.state().path(parent)?.join(name))
    }

    /// Answers a namespace operation that created `path`, recording the creation.
    fn created_reply(&self, path: &Path, created: io::Result<()>, reply: ReplyEntry) {
        match created.and_then(|()| self.state().created(path)) {
            Ok(()) => self.entry_reply(path, reply),
            Err(error) => reply.error(errno(&error)),
        }
    }
}

impl Filesystem for LossyFs {
    fn init(&mut self, _req: &Request<'_>, config: &mut KernelConfig) -> Result<(), libc::c_int> {
        if let Err(nearest) = config.set_max_write(MAX_WRITE_BYTES) {
            eprintln!("lossyfs: max_write {MAX_WRITE_BYTES} refused, nearest {nearest}");
            return Err(libc::EINVAL);
        }
        if self.state().split_direct_writes() {
            // As libfuse does by default: the kernel sends every piece of a large direct
            // write at once instead of waiting for each (see the module doc).
            if let Err(missing) = config.add_capabilities(FUSE_ASYNC_DIO) {
                eprintln!("lossyfs: the kernel lacks asynchronous direct I/O ({missing:#x})");
                return Err(libc::ENOSYS);
            }
        }
        Ok(())
    }

    fn destroy(&mut self) {
        // An unmount is not a power cut: unsynced data is kept, as a clean shutdown would.
        if let Err(error) = self.state().sync_all() {
            eprintln!("lossyfs: sync at unmount failed: {error}");
        }
    }

    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        if parent == FUSE_ROOT_ID && name == CONTROL_FILE {
            return reply.entry(&TTL, &control_attr(), 0);
        }
        if parent == FUSE_ROOT_ID && name == TRASH_DIR {
            return reply.error(libc::ENOENT);
        }
        match self.child(parent, name) {
            Ok(path) => self.entry_reply(&path, reply),
            Err(code) => reply.error(code),
        }
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, fh: Option<u64>, reply: ReplyAttr) {
        match self.state().attr(ino, fh) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(error) => reply.error(errno(&error)),
        }
    }

    fn setattr(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<u64>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<u32>,
        reply: ReplyAttr,
    ) {
        if ino == CONTROL_INO {
            return reply.attr(&TTL, &control_attr());
        }
        let mut state = self.state();
        let result = (|| -> io::Result<()> {
            let path = state.path(ino).ok();
            if let (Some(mode), Some(path)) = (mode, &path) {
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & 0o7777))?;
            }
            if let (true, Some(path)) = (uid.is_some() || gid.is_some(), &path) {
                std::os::unix::fs::lchown(path, uid, gid)?;
            }
            if let (true, Some(path)) = (atime.is_some() || mtime.is_some(), &path) {
                let to_time = |t: Option<TimeOrNow>| match t {
                    None => None,
                    Some(TimeOrNow::Now) => Some(SystemTime::now()),
                    Some(TimeOrNow::SpecificTime(t)) => Some(t),
                };
                let file = File::options().write(true).open(path).or_else(|_| File::open(path))?;
                let mut times = std::fs::FileTimes::new();
                if let Some(t) = to_time(atime) {
                    times = times.set_accessed(t);
                }
                if let Some(t) = to_time(mtime) {
                    times = times.set_modified(t);
                }
                file.set_times(times)?;
            }
            if let Some(size) = size {
                state.with_overlay(ino, fh, |overlay, file| overlay.set_size(file, size))?;
            }
            Ok(())
        })();
        match result.and_then(|()| state.attr(ino, fh)) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(error) => reply.error(errno(&error)),
        }
    }

    fn readlink(&mut self, _req: &Request<'_>, ino: u64, reply: ReplyData) {
        match self.state().path(ino).map(std::fs::read_link) {
            Ok(Ok(target)) => reply.data(target.as_os_str().as_bytes()),
            Ok(Err(error)) => reply.error(errno(&error)),
            Err(code) => reply.error(code),
        }
    }

    fn mkdir(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let path = match self.child(parent, name) {
            Ok(path) => path,
            Err(code) => return reply.error(code),
        };
        let created = std::fs::DirBuilder::new().mode(mode & !umask).create(&path);
        self.created_reply(&path, created, reply);
    }

    fn mknod(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let path = match self.child(parent, name) {
            Ok(path) => path,
            Err(code) => return reply.error(code),
        };
        let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
            return reply.error(libc::EINVAL);
        };
        // SAFETY: mknod reads a NUL-terminated path we own.
        let created = match unsafe { libc::mknod(c_path.as_ptr(), mode & !umask, libc::dev_t::from(rdev)) } {
            0 => Ok(()),
            _ => Err(io::Error::last_os_error()),
        };
        self.created_reply(&path, created, reply);
    }

    fn unlink(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        let removed = self.child(parent, name).map(|path| self.state().remove(&path, false));
        match removed {
            Ok(Ok(())) => reply.ok(),
            Ok(Err(error)) => reply.error(errno(&error)),
            Err(code) => reply.error(code),
        }
    }

    fn rmdir(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        let removed = self.child(parent, name).map(|path| self.state().remove(&path, true));
        match removed {
            Ok(Ok(())) => reply.ok(),
            Ok(Err(error)) => reply.error(errno(&error)),
            Err(code) => reply.error(code),
        }
    }

    fn symlink(&mut self, _req: &Request<'_>, parent: u64, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        let path = match self.child(parent, link_name) {
            Ok(path) => path,
            Err(code) => return reply.error(code),
        };
        let created = std::os::unix::fs::symlink(target, &path);
        self.created_reply(&path, created, reply);
    }

    fn rename(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
        reply: ReplyEmpty,
    ) {
        if flags != 0 {
            return reply.error(libc::EINVAL);
        }
        let (from, to) = match (self.child(parent, name), self.child(newparent, newname)) {
            (Ok(from), Ok(to)) => (from, to),
            (Err(code), _) | (_, Err(code)) => return reply.error(code),
        };
        match self.state().rename(&from, &to) {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(errno(&error)),
        }
    }

    fn open(&mut self, _req: &Request<'_>, ino: u64, _flags: i32, reply: ReplyOpen) {
        if ino == CONTROL_INO {
            return reply.opened(0, FOPEN_DIRECT_IO);
        }
        let mut state = self.state();
        let opened = state.path(ino).map(|path| OpenOptions::new().read(true).write(true).open(path));
        match opened {
            Ok(Ok(file)) => {
                let fh = state.add_handle(ino, file);
                reply.opened(fh, self.open_flags)
            }
            Ok(Err(error)) => reply.error(errno(&error)),
            Err(code) => reply.error(code),
        }
    }

    fn read(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        fh: u64,
        offset: i64,
        size: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyData,
    ) {
        if ino == CONTROL_INO {
            return reply.data(&[]);
        }
        match self.state().read(ino, fh, offset.max(0) as u64, size as usize) {
            Ok(data) => reply.data(&data),
            Err(error) => reply.error(errno(&error)),
        }
    }

    fn write(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        fh: u64,
        offset: i64,
        data: &[u8],
        _write_flags: u32,
        flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyWrite,
    ) {
        let mut state = self.state();
        let result = if ino == CONTROL_INO {
            state.control(&String::from_utf8_lossy(data))
        } else {
            state.write(ino, fh, offset.max(0) as u64, data, flags)
        };
        match result {
            Ok(()) => reply.written(data.len() as u32),
            Err(error) => reply.error(errno(&error)),
        }
    }

    fn flush(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _lock_owner: u64, reply: ReplyEmpty) {
        // close() makes nothing durable.
        reply.ok();
    }

    fn release(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        fh: u64,
        _flags: i32,
        _lock_owner: Option<u64>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let mut state = self.state();
        if state.handles.remove(&fh).is_some() {
            let gone = match state.nodes.get_mut(&ino) {
                Some(node) => {
                    node.open_handles -= 1;
                    node.path.is_none() && node.open_handles == 0
                }
                None => false,
            };
            if gone {
                state.nodes.remove(&ino);
            }
        }
        reply.ok();
    }

    fn fsync(&mut self, _req: &Request<'_>, ino: u64, fh: u64, _datasync: bool, reply: ReplyEmpty) {
        if ino == CONTROL_INO {
            return reply.ok();
        }
        match self.state().fsync(ino, fh) {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(errno(&error)),
        }
    }

    fn opendir(&mut self, _req: &Request<'_>, ino: u64, _flags: i32, reply: ReplyOpen) {
        let found = self.state().path(ino);
        match found {
            Ok(_) => {
                let handle = self.next_dir_handle;
                self.next_dir_handle += 1;
                reply.opened(handle, 0)
            }
            Err(code) => reply.error(code),
        }
    }

    fn readdir(&mut self, _req: &Request<'_>, ino: u64, fh: u64, offset: i64, mut reply: ReplyDirectory) {
        // A rewind (offset 0) lists the directory again, as a fresh `opendir` would.
        if offset == 0 || !self.listings.contains_key(&fh) {
            match self.list(ino) {
                Ok(listing) => self.listings.insert(fh, listing),
                Err(code) => return reply.error(code),
            };
        }
        let listing = &self.listings[&fh];
        for (index, (child, kind, name)) in listing.iter().enumerate().skip(offset.max(0) as usize) {
            if reply.add(*child, index as i64 + 1, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(&mut self, _req: &Request<'_>, _ino: u64, fh: u64, _flags: i32, reply: ReplyEmpty) {
        self.listings.remove(&fh);
        reply.ok();
    }

    fn fsyncdir(&mut self, _req: &Request<'_>, ino: u64, _fh: u64, _datasync: bool, reply: ReplyEmpty) {
        match self.state().fsyncdir(ino) {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(errno(&error)),
        }
    }

    fn statfs(&mut self, _req: &Request<'_>, _ino: u64, reply: ReplyStatfs) {
        let backing = self.state().backing.clone();
        let Ok(c_path) = std::ffi::CString::new(backing.as_os_str().as_bytes()) else {
            return reply.error(libc::EINVAL);
        };
        // SAFETY: statvfs writes into a zeroed struct we own; the path is NUL-terminated.
        let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) } != 0 {
            return reply.error(errno(&io::Error::last_os_error()));
        }
        reply.statfs(
            stat.f_blocks,
            stat.f_bfree,
            stat.f_bavail,
            stat.f_files,
            stat.f_ffree,
            stat.f_bsize as u32,
            stat.f_namemax as u32,
            stat.f_frsize as u32,
        );
    }

    fn access(&mut self, _req: &Request<'_>, _ino: u64, _mask: i32, reply: ReplyEmpty) {
        reply.ok();
    }

    fn create(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let path = match self.child(parent, name) {
            Ok(path) => path,
            Err(code) => return reply.error(code),
        };
        let mut options = OpenOptions::new();
        options.read(true).write(true).mode(mode & !umask);
        if flags & libc::O_EXCL != 0 {
            options.create_new(true);
        } else {
            options.create(true);
        }
        // Without O_EXCL an existing file is opened, not created.
        let existed = std::fs::symlink_metadata(&path).is_ok();
        let file = match options.open(&path) {
            Ok(file) => file,
            Err(error) => return reply.error(errno(&error)),
        };
        let mut state = self.state();
        if !existed {
            if let Err(error) = state.created(&path) {
                return reply.error(errno(&error));
            }
        }
        let ino = state.ino_for(&path);
        let fh = state.add_handle(ino, file);
        match state.attr(ino, Some(fh)) {
            Ok(attr) => reply.created(&TTL, &attr, 0, fh, self.open_flags),
            Err(error) => reply.error(errno(&error)),
        }
    }

    fn fallocate(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        fh: u64,
        offset: i64,
        length: i64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let end = (offset.max(0) + length.max(0)) as u64;
        let result = match mode {
            0 => self.state().with_overlay(ino, Some(fh), |overlay, file| {
                if end > overlay.size {
                    overlay.set_size(file, end)?;
                }
                Ok(())
            }),
            libc::FALLOC_FL_KEEP_SIZE => Ok(()),
            _ => Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP)),
        };
        match result {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(errno(&error)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backing_file(dir: &Path, content: &[u8]) -> File {
        let path = dir.join("f");
        std::fs::write(&path, content).unwrap();
        OpenOptions::new().read(true).write(true).open(path).unwrap()
    }

    #[test]
    fn overlay_reads_merge_pages_over_the_backing_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = backing_file(dir.path(), &[1u8; 10_000]);
        let mut overlay = Overlay::new(10_000);
        overlay.write(&file, 4090, &[2u8; 20]).unwrap();
        let read = overlay.read(&file, 4080, 40).unwrap();
        assert_eq!(&read[..10], &[1u8; 10]);
        assert_eq!(&read[10..30], &[2u8; 20]);
        assert_eq!(&read[30..], &[1u8; 10]);
        // Nothing reached the backing file.
        assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), vec![1u8; 10_000]);
    }

    #[test]
    fn data_whose_fsync_failed_is_never_persisted_even_by_a_later_successful_fsync() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let file = backing_file(dir.path(), b"old");
        let mut state = LossyState::new(dir.path(), Strictness::default()).unwrap();
        let ino = state.ino_for(&path.canonicalize().unwrap());
        let fh = state.add_handle(ino, file);
        state.with_overlay(ino, Some(fh), |overlay, file| overlay.write(file, 3, b"-new")).unwrap();
        state.control("fail-fsync").unwrap();
        assert_eq!(state.fsync(ino, fh).unwrap_err().raw_os_error(), Some(libc::EIO));
        state.control("heal").unwrap();
        state.fsync(ino, fh).unwrap();
        assert_eq!(state.read(ino, fh, 0, 100).unwrap(), b"old-new", "still readable until a crash");
        assert_eq!(std::fs::read(&path).unwrap(), b"old", "the retried fsync wrote nothing");
        state.crash();
        assert_eq!(state.read(ino, fh, 0, 100).unwrap(), b"old");
    }

    #[test]
    fn truncate_then_grow_reads_zeros_and_persist_writes_exactly_that() {
        let dir = tempfile::tempdir().unwrap();
        let file = backing_file(dir.path(), &[7u8; 9000]);
        let mut overlay = Overlay::new(9000);
        overlay.set_size(&file, 100).unwrap();
        overlay.set_size(&file, 20_000).unwrap();
        overlay.write(&file, 12_000, b"end").unwrap();
        let read = overlay.read(&file, 0, 20_000).unwrap();
        assert_eq!(read.len(), 20_000);
        assert_eq!(&read[..100], &[7u8; 100]);
        assert!(read[100..12_000].iter().all(|&b| b == 0));
        assert_eq!(&read[12_000..12_003], b"end");
        overlay.persist(&file).unwrap();
        assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), read);
    }

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_direct_request_continues_a_write_only_after_a_full_request_ending_where_it_starts() {
        let full = DirectPiece { end: MIB, length: MIB, size_before_write: 4096 };
        let check = |previous, offset, length, size, expected: (DirectPiece, Option<Range<u64>>)| {
            assert_eq!(DirectPiece::next(previous, offset, length, size), expected);
        };
        // The second piece of a 2 MiB write at 0 to a 4 KiB file.
        check(
            Some(full),
            MIB,
            MIB,
            MIB,
            (DirectPiece { end: 2 * MIB, length: MIB, size_before_write: 4096 }, Some(4096..MIB)),
        );
        // A first piece: no gap, whatever the size.
        check(None, MIB, MIB, 0, (DirectPiece { end: 2 * MIB, length: MIB, size_before_write: 0 }, None));
        // After a short request, or one ending elsewhere: a new write.
        let short = DirectPiece { length: MIB - 4096, ..full };
        check(
            Some(short),
            MIB,
            4096,
            MIB,
            (DirectPiece { end: MIB + 4096, length: 4096, size_before_write: MIB }, None),
        );
        check(
            Some(full),
            2 * MIB,
            4096,
            MIB,
            (DirectPiece { end: 2 * MIB + 4096, length: 4096, size_before_write: MIB }, None),
        );
        // A later piece that starts within the size before the write has no gap to fill.
        let big_file = DirectPiece { size_before_write: 8 * MIB, ..full };
        check(
            Some(big_file),
            MIB,
            MIB,
            8 * MIB,
            (DirectPiece { end: 2 * MIB, length: MIB, size_before_write: 8 * MIB }, None),
        );
    }

    /// A state over a fresh backing directory and a handle on its file `f` of `content`.
    fn state_with_file(strictness: Strictness, content: &[u8]) -> (tempfile::TempDir, LossyState, u64, u64) {
        let dir = tempfile::tempdir().unwrap();
        let file = backing_file(dir.path(), content);
        let mut state = LossyState::new(dir.path(), strictness).unwrap();
        let ino = state.ino_for(&dir.path().canonicalize().unwrap().join("f"));
        let fh = state.add_handle(ino, file);
        (dir, state, ino, fh)
    }

    #[test]
    fn split_direct_write_pieces_zero_the_gap_over_earlier_pieces_as_unsynced_data() {
        let strictness = Strictness { split_direct_writes: true, ..Strictness::default() };
        let (dir, mut state, ino, fh) = state_with_file(strictness, &[1u8; 4096]);
        let piece = vec![2u8; MIB as usize];
        for offset in [0, MIB, 2 * MIB] {
            state.write(ino, fh, offset, &piece, libc::O_DIRECT | libc::O_RDWR).unwrap();
        }
        let data = state.read(ino, fh, 0, 4 * MIB as usize).unwrap();
        assert_eq!(data.len() as u64, 3 * MIB);
        assert!(data[..4096].iter().all(|&b| b == 2));
        assert!(data[4096..2 * MIB as usize].iter().all(|&b| b == 0), "the third piece zeroes up to itself");
        assert!(data[2 * MIB as usize..].iter().all(|&b| b == 2));
        state.crash();
        assert_eq!(state.read(ino, fh, 0, 4 * MIB as usize).unwrap(), vec![1u8; 4096]);
        assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), vec![1u8; 4096]);
    }

    #[test]
    fn without_the_mode_or_o_direct_split_pieces_are_intact() {
        let piece = vec![2u8; MIB as usize];
        let split = Strictness { split_direct_writes: true, ..Strictness::default() };
        for (strictness, flags) in [(Strictness::default(), libc::O_DIRECT), (split, libc::O_RDWR)] {
            let (_dir, mut state, ino, fh) = state_with_file(strictness, &[1u8; 4096]);
            state.write(ino, fh, 0, &piece, flags).unwrap();
            state.write(ino, fh, MIB, &piece, flags).unwrap();
            assert_eq!(state.read(ino, fh, 0, 4 * MIB as usize).unwrap(), vec![2u8; 2 * MIB as usize]);
        }
    }

    #[test]
    fn strict_dirs_crash_undoes_unsynced_names_and_forgets_every_node() {
        let strictness = Strictness { lose_unsynced_dir_entries: true, ..Strictness::default() };
        let (dir, mut state, ino, fh) = state_with_file(strictness, b"synced");
        let root = dir.path().canonicalize().unwrap();
        std::fs::write(root.join("new"), b"").unwrap();
        state.created(&root.join("new")).unwrap();
        state.rename(&root.join("f"), &root.join("g")).unwrap();
        assert_eq!(state.path(ino).unwrap(), root.join("g"));
        state.fsync(ino, fh).unwrap();
        state.remove(&root.join("g"), false).unwrap();
        assert!(root.join(TRASH_DIR).is_dir());
        let dropped = state.crash();
        assert_eq!(dropped.entries, Undone { changes: 3, skipped: 0 });
        let mut names: Vec<_> = std::fs::read_dir(&root).unwrap().map(|e| e.unwrap().file_name()).collect();
        names.sort();
        assert_eq!(names, ["f"], "the rename, the creation and the trash are gone");
        assert_eq!(std::fs::read(root.join("f")).unwrap(), b"synced");
        assert_eq!(state.nodes.keys().copied().collect::<Vec<_>>(), [FUSE_ROOT_ID]);
        assert_eq!(state.by_path.len(), 1);
        assert!(state.ino_for(&root.join("f")) > ino, "inode numbers are fresh");
    }

    #[test]
    fn strict_dirs_fsyncdir_makes_names_durable_and_a_failing_disk_does_not() {
        let strictness = Strictness { lose_unsynced_dir_entries: true, ..Strictness::default() };
        let (dir, mut state, _ino, _fh) = state_with_file(strictness, b"");
        let root = dir.path().canonicalize().unwrap();
        std::fs::write(root.join("a"), b"").unwrap();
        state.created(&root.join("a")).unwrap();
        state.fsyncdir(FUSE_ROOT_ID).unwrap();
        std::fs::write(root.join("b"), b"").unwrap();
        state.created(&root.join("b")).unwrap();
        state.control("fail-fsync").unwrap();
        assert_eq!(state.fsyncdir(FUSE_ROOT_ID).unwrap_err().raw_os_error(), Some(libc::EIO));
        state.control("heal").unwrap();
        state.crash();
        assert!(root.join("a").exists());
        assert!(!root.join("b").exists());
    }
}
