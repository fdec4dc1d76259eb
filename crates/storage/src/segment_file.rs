//! The open file of a segment, and the process-wide budget of descriptors held by sealed
//! segments.
//!
//! Why: a broker keeps every segment of every partition, and with thousands of partitions
//! and small or many segments one descriptor per segment file would grow without bound
//! (Kafka asks for `ulimit -n` in the hundreds of thousands). Only the active segment of each
//! partition is written, so only it is kept open ("pinned"), and only while its partition
//! takes writes (`Partition::release_file_if_idle`). A sealed segment's file is
//! opened when something reads it and stays open while recently used; at most
//! [`SEALED_SEGMENT_FILES_OPEN_MAX`] of them are open at once across the process, and the
//! least recently used beyond that are closed (a CLOCK sweep: a file read since the hand
//! last passed gets another turn). A reader keeps its own `Arc<File>`, so closing never
//! pulls a descriptor from under a read or a `sendfile` in flight; it is released when the
//! last holder drops it.
//!
//! Reopening by path is checked against the file's identity (device, inode and birth time,
//! taken when the slot was made; the birth time tells a new file from a deleted one whose
//! inode number it reuses, where the filesystem records it): a segment deleted by retention or replaced by a cleaned copy since it
//! was located is reported as [`io::ErrorKind::NotFound`], never read in place of the
//! original. Callers locate again (see `log/read.rs`).

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

/// Sealed segments whose files may be open at once, across the process (active segments,
/// one per partition, are not counted: they are always open).
pub const SEALED_SEGMENT_FILES_OPEN_MAX: usize = 1024;

/// The budget in force: [`SEALED_SEGMENT_FILES_OPEN_MAX`] unless a test lowers it.
static OPEN_MAX: AtomicUsize = AtomicUsize::new(SEALED_SEGMENT_FILES_OPEN_MAX);
/// Sealed segments' files open now (held by their slots).
static OPEN: AtomicUsize = AtomicUsize::new(0);
/// The CLOCK ring of slots whose files were opened while unpinned.
static RING: Mutex<VecDeque<Weak<SegmentFile>>> = Mutex::new(VecDeque::new());

/// Sealed segments' files open now.
pub fn sealed_files_open() -> usize {
    OPEN.load(Ordering::Relaxed)
}

/// Sets the budget (tests of the budget itself; the default is the constant).
pub fn set_sealed_files_open_max(max: usize) {
    assert!(max > 0, "at least one sealed segment file must be allowed open");
    OPEN_MAX.store(max, Ordering::Relaxed);
    evict_over_budget(&mut RING.lock());
}

/// One segment's file: open or closed, pinned (the active segment) or under the budget.
pub(crate) struct SegmentFile {
    state: Mutex<SlotState>,
    /// Read since the CLOCK hand last passed.
    referenced: AtomicBool,
    /// The file this slot stands for (see [`identity`]).
    identity: Identity,
}

struct SlotState {
    file: Option<Arc<File>>,
    /// Always open and not counted in the budget.
    pinned: bool,
}

impl SegmentFile {
    /// A slot for `file`, just opened or created: pinned (the caller unpins it once the
    /// segment is sealed).
    pub(crate) fn pinned(file: File) -> io::Result<Arc<SegmentFile>> {
        Ok(Arc::new(SegmentFile {
            identity: identity(&file)?,
            state: Mutex::new(SlotState { file: Some(Arc::new(file)), pinned: true }),
            referenced: AtomicBool::new(true),
        }))
    }

    /// The file if it is open now (no system call).
    pub(crate) fn cached(&self) -> Option<Arc<File>> {
        let file = self.state.lock().file.clone();
        if file.is_some() {
            self.referenced.store(true, Ordering::Relaxed);
        }
        file
    }

    /// The file, opened from `path` if it is closed. `NotFound` when the file at `path` is
    /// gone or is no longer this segment's (see the module comment).
    pub(crate) fn open(self: &Arc<Self>, path: &Path) -> io::Result<Arc<File>> {
        if let Some(file) = self.cached() {
            return Ok(file);
        }
        let opened = {
            let mut state = self.state.lock();
            if let Some(file) = &state.file {
                return Ok(file.clone());
            }
            let file = OpenOptions::new().read(true).write(true).open(path)?;
            if identity(&file)? != self.identity {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("{} is no longer the segment file it was", path.display()),
                ));
            }
            crate::page_cache::without_readahead(&file);
            let file = Arc::new(file);
            state.file = Some(file.clone());
            if !state.pinned {
                OPEN.fetch_add(1, Ordering::Relaxed);
            }
            (file, !state.pinned)
        };
        let (file, budgeted) = opened;
        self.referenced.store(true, Ordering::Relaxed);
        if budgeted {
            self.register();
        }
        Ok(file)
    }

    /// Pins the slot (its segment takes appends again): opened if closed, no longer counted.
    pub(crate) fn pin(self: &Arc<Self>, path: &Path) -> io::Result<Arc<File>> {
        let file = self.open(path)?;
        let mut state = self.state.lock();
        if !state.pinned {
            state.pinned = true;
            if state.file.is_some() {
                OPEN.fetch_sub(1, Ordering::Relaxed);
            }
            state.file = Some(file.clone());
        }
        Ok(file)
    }

    /// Puts the slot under the budget (its segment is sealed).
    pub(crate) fn unpin(self: &Arc<Self>) {
        {
            let mut state = self.state.lock();
            if !state.pinned {
                return;
            }
            state.pinned = false;
            if state.file.is_none() {
                return;
            }
            OPEN.fetch_add(1, Ordering::Relaxed);
        }
        self.register();
    }

    /// True while the slot holds its file open.
    pub(crate) fn is_open(&self) -> bool {
        self.state.lock().file.is_some()
    }

    /// Enters the CLOCK ring and closes the least recently used files over the budget.
    /// Never called with a slot's lock held (the sweep takes slots' locks under the ring's).
    fn register(self: &Arc<Self>) {
        let mut ring = RING.lock();
        ring.push_back(Arc::downgrade(self));
        evict_over_budget(&mut ring);
        // Entries of dropped slots and duplicates of reopened ones: prune now and then.
        if ring.len() > 4 * OPEN_MAX.load(Ordering::Relaxed) + 64 {
            ring.retain(|slot| slot.strong_count() > 0);
        }
    }

    /// Closes the file if the slot is unpinned; true when it did.
    fn close_unpinned(&self) -> bool {
        let mut state = self.state.lock();
        if state.pinned || state.file.is_none() {
            return false;
        }
        state.file = None;
        OPEN.fetch_sub(1, Ordering::Relaxed);
        true
    }
}

/// Device, inode and birth time (`statx`; `None` where the filesystem has none).
type Identity = (u64, u64, Option<std::time::SystemTime>);

fn identity(file: &File) -> io::Result<Identity> {
    let metadata = file.metadata()?;
    Ok((metadata.dev(), metadata.ino(), metadata.created().ok()))
}

impl Drop for SegmentFile {
    fn drop(&mut self) {
        let state = self.state.get_mut();
        if !state.pinned && state.file.is_some() {
            OPEN.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// The CLOCK sweep: closes unreferenced files until the open count is within the budget.
/// A full turn of the ring at most twice (every entry gets one second chance).
fn evict_over_budget(ring: &mut VecDeque<Weak<SegmentFile>>) {
    let max = OPEN_MAX.load(Ordering::Relaxed);
    let mut steps = 2 * ring.len();
    while OPEN.load(Ordering::Relaxed) > max && steps > 0 {
        steps -= 1;
        let Some(entry) = ring.pop_front() else { break };
        let Some(slot) = entry.upgrade() else { continue };
        if slot.referenced.swap(false, Ordering::Relaxed) {
            ring.push_back(entry);
            continue;
        }
        // Closed (or pinned) slots leave the ring; a reopen enters it again.
        slot.close_unpinned();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The budget itself is tested in `tests/segment_files.rs`, a process of its own: the
    /// count is process-wide and this crate's other tests seal segments concurrently.
    #[test]
    fn a_closed_slot_reopens_only_its_own_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.log");
        let file = OpenOptions::new().read(true).write(true).create_new(true).open(&path).unwrap();
        let slot = SegmentFile::pinned(file).unwrap();
        slot.unpin();
        if slot.close_unpinned() {
            assert!(!slot.is_open());
            slot.open(&path).unwrap();
        }
        assert!(slot.is_open());
        assert!(slot.close_unpinned());
        // A file replaced under the same name is not taken for the original, nor is a gap.
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, b"someone else's bytes").unwrap();
        assert_eq!(slot.open(&path).unwrap_err().kind(), io::ErrorKind::NotFound);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(slot.open(&path).unwrap_err().kind(), io::ErrorKind::NotFound);
        assert!(!slot.is_open());
        // Pinned, a slot is never closed by the budget.
        std::fs::write(&path, b"").unwrap();
        let file = OpenOptions::new().read(true).write(true).open(&path).unwrap();
        let pinned = SegmentFile::pinned(file).unwrap();
        assert!(!pinned.close_unpinned());
        assert!(pinned.is_open());
    }
}
