//! Making bytes durable: every fsync of the storage engine goes through here.
//!
//! Durability must not depend on the filesystem the data directory sits on, so data is
//! made durable file by file (`fdatasync`/`fsync`) and a new or renamed file's directory
//! entry by an fsync of its directory, never with `syncfs`: Linux does not pass `syncfs`
//! to FUSE filesystems (it returns success having made nothing durable), it covers only
//! the filesystem of the descriptor it is given, it waits for every other process's
//! dirty data, and it reports writeback errors only since Linux 5.8.
//!
//! The power-loss tests must be able to fail: with the environment variable
//! [`SKIP_FSYNC_ENV`] set to `1`, every call here returns success without syncing, and
//! the broker logs a warning at startup. Nothing but those tests may set it.

use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::OnceLock;

/// Test-only: `1` turns every fsync into a no-op (acknowledged data is then not durable).
pub const SKIP_FSYNC_ENV: &str = "SLUICE_UNSAFE_SKIP_FSYNC_FOR_TESTS";

/// True when fsyncs are switched off by [`SKIP_FSYNC_ENV`] (read once per process).
pub fn fsync_skipped() -> bool {
    static SKIPPED: OnceLock<bool> = OnceLock::new();
    *SKIPPED.get_or_init(|| std::env::var(SKIP_FSYNC_ENV).is_ok_and(|v| v == "1"))
}

/// `fdatasync`: the file's data and the metadata needed to read it back (its size).
pub fn sync_data(file: &File) -> io::Result<()> {
    if fsync_skipped() {
        return Ok(());
    }
    file.sync_data()
}

/// `fsync`: the file's data and all of its metadata.
pub fn sync_all(file: &File) -> io::Result<()> {
    if fsync_skipped() {
        return Ok(());
    }
    file.sync_all()
}

/// Makes the directory entries of `dir` durable (files created, renamed or deleted in it).
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    if fsync_skipped() {
        return Ok(());
    }
    File::open(dir)?.sync_all()
}

/// Makes an existing file at `path` durable (data and metadata).
pub fn sync_path(path: &Path) -> io::Result<()> {
    if fsync_skipped() {
        return Ok(());
    }
    File::open(path)?.sync_all()
}

/// `create_dir_all` that also makes every directory it created durable in its parent.
pub fn create_dir_all(dir: &Path) -> io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_dir_all(parent)?;
    }
    match std::fs::create_dir(dir) {
        Ok(()) => {}
        // Created meanwhile by another thread, which may not have synced the parent yet.
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => {}
        Err(error) => return Err(error),
    }
    match dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(parent) => sync_dir(parent),
        None => sync_dir(Path::new(".")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_dir_all_creates_nested_directories_and_is_idempotent() {
        let root = tempfile::tempdir().unwrap();
        let nested = root.path().join("a/b/c");
        create_dir_all(&nested).unwrap();
        assert!(nested.is_dir());
        create_dir_all(&nested).unwrap();
        let file = root.path().join("a/b/c/f");
        std::fs::write(&file, b"x").unwrap();
        sync_path(&file).unwrap();
        sync_dir(&nested).unwrap();
    }
}
