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
//!
//! A failed fsync is marked ([`FsyncFailed`], [`is_fsync_failure`]) wherever its error
//! surfaces, so the log can tell it from a retryable error (a full disk) and go offline:
//! after a failed fsync the data it covered is of unknown durability, and a retry may
//! report success without writing it.

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

/// The error of an fsync that failed (its source is the OS error).
#[derive(Debug, thiserror::Error)]
#[error("fsync failed: {0}")]
pub struct FsyncFailed(#[source] io::Error);

impl From<io::Error> for FsyncFailed {
    fn from(error: io::Error) -> FsyncFailed {
        FsyncFailed(error)
    }
}

fn fsync_failed(error: io::Error) -> io::Error {
    io::Error::new(error.kind(), FsyncFailed(error))
}

/// True when `error` comes from a failed fsync of this module.
pub fn is_fsync_failure(error: &io::Error) -> bool {
    error.get_ref().is_some_and(|inner| inner.is::<FsyncFailed>())
}

/// `fdatasync`: the file's data and the metadata needed to read it back (its size).
pub fn sync_data(file: &File) -> io::Result<()> {
    if fsync_skipped() {
        return Ok(());
    }
    file.sync_data().map_err(fsync_failed)
}

/// `pwritev2(RWF_DSYNC)`: writes `data` at `offset` and makes it durable as a write
/// followed by `fdatasync` would, in one call. On a direct-I/O file this saves the WAL
/// thread a system call and a sleep a round, and a device with FUA gets one write instead
/// of a write and a cache flush. Meant for direct-I/O descriptors, whose write reaches the
/// device within the call. Returns `Ok(false)` when nothing was made durable this
/// way (fsync switched off, the kernel or filesystem refuses the flag, a short write): the
/// caller writes the same bytes and syncs apart. An error the write itself explains (no
/// space, quota, too large, a bad descriptor) is returned as is; any other (EIO) may come
/// from the sync and is an fsync failure ([`is_fsync_failure`]).
pub fn write_data_synced(file: &File, data: &[u8], offset: u64) -> io::Result<bool> {
    use std::os::fd::AsRawFd;
    if fsync_skipped() {
        return Ok(false);
    }
    let iov = libc::iovec { iov_base: data.as_ptr() as *mut libc::c_void, iov_len: data.len() };
    // SAFETY: one iovec over `data`, which outlives the call; the descriptor is open.
    let written = unsafe { libc::pwritev2(file.as_raw_fd(), &iov, 1, offset as libc::off_t, libc::RWF_DSYNC) };
    if written >= 0 {
        return Ok(written as usize == data.len());
    }
    let error = io::Error::last_os_error();
    match error.raw_os_error() {
        Some(libc::EOPNOTSUPP | libc::ENOSYS | libc::EINVAL) => Ok(false),
        // Refused before any byte reached the device (direct I/O allocates in the call).
        Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG | libc::EBADF | libc::EROFS | libc::EPERM | libc::EFAULT) => {
            Err(error)
        }
        _ => Err(fsync_failed(error)),
    }
}

/// `fsync`: the file's data and all of its metadata.
pub fn sync_all(file: &File) -> io::Result<()> {
    if fsync_skipped() {
        return Ok(());
    }
    file.sync_all().map_err(fsync_failed)
}

/// Makes the directory entries of `dir` durable (files created, renamed or deleted in it).
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    if fsync_skipped() {
        return Ok(());
    }
    File::open(dir)?.sync_all().map_err(fsync_failed)
}

/// Makes an existing file at `path` durable (data and metadata).
pub fn sync_path(path: &Path) -> io::Result<()> {
    if fsync_skipped() {
        return Ok(());
    }
    File::open(path)?.sync_all().map_err(fsync_failed)
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

/// Filesystems by `statfs` magic number, for the startup check's log line.
const FILESYSTEMS: &[(i64, &str)] = &[
    (0xEF53, "ext2/3/4"),
    (0x5846_5342, "xfs"),
    (0x9123_683E, "btrfs"),
    (0xF2F5_2010, "f2fs"),
    (0x2FC1_2FC1, "zfs"),
    (0x6573_5546, "fuse"),
    (0x794C_7630, "overlayfs"),
    (0x6969, "nfs"),
    (0x0102_1994, "tmpfs"),
    (0x8584_58F6, "ramfs"),
];
/// Filesystems whose `O_DIRECT` is the kernel's own path from a buffer to a block device:
/// a direct write lands as one write, and `fdatasync`/`RWF_DSYNC` make it durable.
///
/// Everywhere else the files are written through the page cache. On FUSE in particular a
/// direct write larger than the daemon's largest request is split by the kernel into
/// requests it sends at once (asynchronous direct I/O), and what the file then holds is up
/// to how the daemon orders them: LazyFS, which handles requests on several threads, fills
/// the gap before a request that starts past its end of file with zeros, and that fill
/// can land over the bytes of the request before it: a write-ahead-log round of more than
/// 1 MiB, acknowledged, then holds a run of zeros. Through the page cache the kernel sends one file's writes one after another, in order.
/// Network and layered filesystems (NFS, overlayfs, ZFS before its own direct I/O) are left
/// out for the same reason: their direct I/O is whatever their implementation makes it.
const DIRECT_IO_FILESYSTEMS: &[&str] = &["ext2/3/4", "xfs", "btrfs", "f2fs"];
/// Filesystems that keep nothing across a reboot: fsync succeeds and means nothing.
const VOLATILE_FILESYSTEMS: &[&str] = &["tmpfs", "ramfs"];
const PROBE_FILE: &str = ".fsync-probe";

/// The name of the filesystem holding `path` (or its `statfs` magic number in hex).
pub fn filesystem_name(path: &Path) -> io::Result<String> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))?;
    // SAFETY: statfs writes into a zeroed struct we own; the path is NUL-terminated.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c_path.as_ptr(), &mut stat) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let magic = stat.f_type as i64;
    Ok(FILESYSTEMS.iter().find(|(m, _)| *m == magic).map_or_else(|| format!("{magic:#x}"), |(_, n)| n.to_string()))
}

/// Whether files in `dir` may be written and read with `O_DIRECT` (see
/// [`DIRECT_IO_FILESYSTEMS`]); false when the filesystem cannot be told.
pub fn direct_io_trusted(dir: &Path) -> bool {
    filesystem_name(dir).is_ok_and(|name| DIRECT_IO_FILESYSTEMS.contains(&name.as_str()))
}

/// Startup check of a data directory (created if missing): a file can be created, written,
/// fsynced and deleted, and the directory fsynced, or the broker refuses to start with the
/// error; the filesystem is logged, with a warning where it does not survive a reboot.
pub fn check_data_dir(dir: &Path) -> io::Result<()> {
    create_dir_all(dir)?;
    let fail = |what: &str, error: io::Error| {
        io::Error::new(error.kind(), format!("data directory {}: {what} failed: {error}", dir.display()))
    };
    let probe = dir.join(PROBE_FILE);
    {
        use std::io::Write;
        let mut file = File::create(&probe).map_err(|e| fail("creating a file", e))?;
        file.write_all(b"sluice").map_err(|e| fail("writing a file", e))?;
        sync_data(&file).map_err(|e| fail("fdatasync", e))?;
    }
    sync_dir(dir).map_err(|e| fail("fsync of the directory", e))?;
    std::fs::remove_file(&probe).map_err(|e| fail("deleting a file", e))?;
    let filesystem = filesystem_name(dir)?;
    if VOLATILE_FILESYSTEMS.contains(&filesystem.as_str()) {
        tracing::warn!(dir = %dir.display(), filesystem, "data directory is on a memory filesystem: nothing survives a reboot");
    } else {
        tracing::info!(dir = %dir.display(), filesystem, "data directory checked: fsync works");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_data_synced_write_lands_where_asked() {
        let dir = tempfile::tempdir().unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("f"))
            .unwrap();
        std::os::unix::fs::FileExt::write_all_at(&file, b"0123456789", 0).unwrap();
        let synced = write_data_synced(&file, b"abc", 4).unwrap();
        if fsync_skipped() {
            // Nothing written: the caller writes and (does not) sync apart.
            assert!(!synced);
            return;
        }
        assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), b"0123abc789");
        // Every filesystem Linux 4.7+ runs takes the flag (tmpfs, ext4, xfs, FUSE).
        assert!(synced);
        // A read-only descriptor: the write's own error, not an fsync failure.
        let read_only = File::open(dir.path().join("f")).unwrap();
        let error = write_data_synced(&read_only, b"x", 0).map(|_| ()).unwrap_err();
        assert_eq!(error.raw_os_error(), Some(libc::EBADF));
        assert!(!is_fsync_failure(&error));
    }

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

    #[test]
    fn data_dir_check_passes_on_a_real_filesystem_and_names_it() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("data");
        check_data_dir(&dir).unwrap();
        assert!(dir.is_dir());
        assert!(!dir.join(PROBE_FILE).exists());
        assert!(!filesystem_name(&dir).unwrap().is_empty());
    }

    #[test]
    fn data_dir_check_refuses_a_directory_it_cannot_write() {
        let root = tempfile::tempdir().unwrap();
        // A regular file where the directory should be.
        let not_a_dir = root.path().join("file");
        std::fs::write(&not_a_dir, b"x").unwrap();
        assert!(check_data_dir(&not_a_dir.join("data")).is_err());
    }
}
