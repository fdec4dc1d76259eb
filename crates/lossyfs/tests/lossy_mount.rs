//! The mounted filesystem, through the kernel: what survives a `crash` is exactly what was
//! fsynced, names included with `--lose-unsynced-dir-entries`, and `--split-direct-writes`
//! damages a direct write the kernel splits. Needs root and /dev/fuse (as the power-loss
//! tests that use it).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const MOUNT_TIMEOUT: Duration = Duration::from_secs(10);
/// Names are durable only once their directory is fsynced.
const STRICT_DIRS: &[&str] = &["--lose-unsynced-dir-entries"];
const PAGE_CACHE: &[&str] = &["--page-cache"];
const SPLIT_DIRECT: &[&str] = &["--page-cache", "--split-direct-writes"];
/// The kernel's largest write request to the mount: lossyfs's max_write.
const MAX_WRITE_BYTES: usize = 1 << 20;
/// Alignment of `O_DIRECT` buffers, offsets and lengths.
const DIRECT_ALIGN_BYTES: usize = 4096;

/// A mounted `sluice-lossyfs`, unmounted (and its process stopped) on drop.
struct Mount {
    _dir: tempfile::TempDir,
    backing: PathBuf,
    mount: PathBuf,
    child: Child,
}

impl Mount {
    /// Mounts a fresh backing directory with the extra command-line `flags`.
    fn start(flags: &[&str]) -> Mount {
        assert!(Path::new("/dev/fuse").exists(), "these tests need /dev/fuse");
        let dir = tempfile::tempdir().unwrap();
        let backing = dir.path().join("backing");
        let mount = dir.path().join("mnt");
        std::fs::create_dir_all(&backing).unwrap();
        std::fs::create_dir_all(&mount).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_sluice-lossyfs"))
            .arg("--backing")
            .arg(&backing)
            .arg("--mount")
            .arg(&mount)
            .args(flags)
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + MOUNT_TIMEOUT;
        while !mount.join(".lossyfs-control").exists() {
            assert!(Instant::now() < deadline, "lossyfs did not mount");
            std::thread::sleep(Duration::from_millis(20));
        }
        Mount { _dir: dir, backing, mount, child }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.mount.join(name)
    }

    fn command(&self, command: &str) {
        let mut control = OpenOptions::new().write(true).open(self.path(".lossyfs-control")).unwrap();
        control.write_all(command.as_bytes()).unwrap();
    }

    fn crash(&self) {
        self.command("crash\n");
    }

    /// fsync of the directory `name` (`""`: the root).
    fn sync_dir(&self, name: &str) {
        File::open(self.path(name)).unwrap().sync_all().unwrap();
    }

    /// Creates `name` holding `content`, fsynced (the file, not its directory).
    fn write_synced(&self, name: &str, content: &[u8]) {
        let mut file = File::create(self.path(name)).unwrap();
        file.write_all(content).unwrap();
        file.sync_all().unwrap();
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        // SAFETY: SIGTERM to our own child, which unmounts and exits.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let _ = self.child.wait();
        let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
    }
}

fn open_rw(path: &Path) -> File {
    OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).unwrap()
}

#[test]
fn only_fsynced_bytes_survive_a_crash() {
    let mount = Mount::start(&[]);
    let file = open_rw(&mount.path("log"));
    file.write_all_at(&[1u8; 5000], 0).unwrap();
    file.sync_data().unwrap();
    file.write_all_at(&[2u8; 3000], 5000).unwrap();
    // Before the crash, readers see everything (the page cache).
    assert_eq!(std::fs::read(mount.path("log")).unwrap().len(), 8000);
    assert_eq!(std::fs::metadata(mount.backing.join("log")).unwrap().len(), 5000);
    drop(file);
    mount.crash();
    assert_eq!(std::fs::read(mount.path("log")).unwrap(), vec![1u8; 5000]);
    assert_eq!(std::fs::read(mount.backing.join("log")).unwrap(), vec![1u8; 5000]);
}

#[test]
fn a_file_written_but_never_fsynced_is_empty_after_a_crash() {
    let mount = Mount::start(&[]);
    std::fs::write(mount.path("new"), b"never synced").unwrap();
    // Renamed over an existing name: the rename is durable, the data is not.
    std::fs::write(mount.path("old"), b"").unwrap();
    std::fs::rename(mount.path("new"), mount.path("old")).unwrap();
    assert_eq!(std::fs::read(mount.path("old")).unwrap(), b"never synced");
    mount.crash();
    assert!(!mount.path("new").exists());
    assert_eq!(std::fs::read(mount.path("old")).unwrap(), b"");
}

#[test]
fn renamed_after_fsync_keeps_its_data() {
    let mount = Mount::start(&[]);
    std::fs::create_dir(mount.path("dir")).unwrap();
    {
        let mut file = File::create(mount.path("dir/tmp")).unwrap();
        file.write_all(b"durable").unwrap();
        file.sync_all().unwrap();
    }
    std::fs::rename(mount.path("dir/tmp"), mount.path("dir/final")).unwrap();
    std::fs::rename(mount.path("dir"), mount.path("moved")).unwrap();
    mount.crash();
    assert_eq!(std::fs::read(mount.path("moved/final")).unwrap(), b"durable");
}

#[test]
fn preallocated_file_keeps_what_fdatasync_covered() {
    let mount = Mount::start(&[]);
    let file = open_rw(&mount.path("segment"));
    // SAFETY: fallocate on an open descriptor we own.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, 1 << 20) };
    assert_eq!(rc, 0, "fallocate: {}", std::io::Error::last_os_error());
    file.write_all_at(b"synced", 0).unwrap();
    file.sync_data().unwrap();
    file.write_all_at(b"lost", 6).unwrap();
    assert_eq!(file.metadata().unwrap().len(), 1 << 20);
    drop(file);
    mount.crash();
    let data = std::fs::read(mount.path("segment")).unwrap();
    assert_eq!(data.len(), 1 << 20);
    assert_eq!(&data[..6], b"synced");
    assert!(data[6..].iter().all(|&b| b == 0), "unsynced bytes survived");
}

#[test]
fn truncation_is_lost_too_unless_synced_and_sync_persists_everything() {
    let mount = Mount::start(&[]);
    let file = open_rw(&mount.path("t"));
    file.write_all_at(&[9u8; 10_000], 0).unwrap();
    file.sync_all().unwrap();
    file.set_len(100).unwrap();
    assert_eq!(file.metadata().unwrap().len(), 100);
    drop(file);
    mount.crash();
    assert_eq!(std::fs::read(mount.path("t")).unwrap(), vec![9u8; 10_000]);

    let file = open_rw(&mount.path("t"));
    file.set_len(100).unwrap();
    file.write_all_at(b"tail", 200).unwrap();
    drop(file);
    mount.command("sync\n");
    mount.crash();
    let data = std::fs::read(mount.path("t")).unwrap();
    assert_eq!(data.len(), 204);
    assert_eq!(&data[..100], &[9u8; 100]);
    assert!(data[100..200].iter().all(|&b| b == 0), "truncated bytes came back");
    assert_eq!(&data[200..], b"tail");
}

#[test]
fn names_are_durable_at_once_by_default() {
    let mount = Mount::start(&[]);
    std::fs::create_dir(mount.path("d")).unwrap();
    mount.write_synced("d/f", b"data");
    mount.write_synced("gone", b"");
    std::fs::remove_file(mount.path("gone")).unwrap();
    mount.crash();
    assert_eq!(std::fs::read(mount.path("d/f")).unwrap(), b"data");
    assert!(!mount.path("gone").exists());
}

#[test]
fn strict_dirs_a_synced_file_survives_only_an_fsync_of_its_directory() {
    let mount = Mount::start(STRICT_DIRS);
    std::fs::create_dir(mount.path("d")).unwrap();
    mount.sync_dir("");
    mount.write_synced("d/kept", b"name synced too");
    mount.sync_dir("d");
    mount.write_synced("d/lost", b"data synced, name not");
    mount.crash();
    let names: Vec<_> = std::fs::read_dir(mount.path("d")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["kept"]);
    assert_eq!(std::fs::read(mount.path("d/kept")).unwrap(), b"name synced too");
    assert!(!mount.backing.join("d/lost").exists(), "its data went with its name");
}

#[test]
fn strict_dirs_a_rename_reverts_and_its_replaced_target_comes_back() {
    let mount = Mount::start(STRICT_DIRS);
    mount.write_synced("new", b"new");
    mount.write_synced("current", b"current");
    mount.sync_dir("");
    std::fs::rename(mount.path("new"), mount.path("current")).unwrap();
    assert_eq!(std::fs::read(mount.path("current")).unwrap(), b"new");
    mount.crash();
    assert_eq!(std::fs::read(mount.path("new")).unwrap(), b"new");
    assert_eq!(std::fs::read(mount.path("current")).unwrap(), b"current");

    // With the directory fsynced the rename holds.
    std::fs::rename(mount.path("new"), mount.path("current")).unwrap();
    mount.sync_dir("");
    mount.crash();
    assert!(!mount.path("new").exists());
    assert_eq!(std::fs::read(mount.path("current")).unwrap(), b"new");
}

#[test]
fn strict_dirs_an_unlink_comes_back_with_its_synced_content_and_the_trash_is_hidden() {
    let mount = Mount::start(STRICT_DIRS);
    mount.write_synced("f", b"synced");
    mount.sync_dir("");
    OpenOptions::new().append(true).open(mount.path("f")).unwrap().write_all(b" unsynced").unwrap();
    std::fs::remove_file(mount.path("f")).unwrap();
    assert!(mount.backing.join(".lossyfs-trash").is_dir());
    let names: Vec<_> = std::fs::read_dir(&mount.mount).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(names.is_empty(), "the trash is hidden: {names:?}");
    assert!(!mount.path(".lossyfs-trash").exists());
    mount.crash();
    assert_eq!(std::fs::read(mount.path("f")).unwrap(), b"synced");
    assert!(!mount.backing.join(".lossyfs-trash").exists());

    // `sync` makes the unlink durable.
    std::fs::remove_file(mount.path("f")).unwrap();
    mount.command("sync\n");
    mount.crash();
    assert!(!mount.path("f").exists());
    assert!(!mount.backing.join(".lossyfs-trash").exists());
}

#[test]
fn strict_dirs_a_mkdir_without_an_fsync_of_its_parent_vanishes_with_its_contents() {
    let mount = Mount::start(STRICT_DIRS);
    std::fs::create_dir_all(mount.path("d/e")).unwrap();
    mount.write_synced("d/e/f", b"data");
    mount.sync_dir("d/e");
    mount.sync_dir("d");
    mount.crash();
    assert!(!mount.path("d").exists());
    assert!(std::fs::read_dir(&mount.backing).unwrap().next().is_none(), "the backing directory is empty");
}

/// Writes `length` bytes of `byte` at `offset` of `path` in one `O_DIRECT` pwrite.
fn direct_write(path: &Path, offset: u64, length: usize, byte: u8) {
    let file = OpenOptions::new().write(true).custom_flags(libc::O_DIRECT).open(path).unwrap();
    let mut buffer = vec![byte; length + DIRECT_ALIGN_BYTES];
    let start = buffer.as_ptr().align_offset(DIRECT_ALIGN_BYTES);
    let aligned = &mut buffer[start..start + length];
    assert_eq!(file.write_at(aligned, offset).unwrap(), length, "one write, not split by the caller");
}

/// A 4 KiB file of ones, synced, then one direct write of `length` twos at offset 0: what
/// reads back through the mount, and what a crash leaves.
fn direct_write_over_a_small_file(mount: &Mount, name: &str, length: usize) -> (Vec<u8>, Vec<u8>) {
    mount.write_synced(name, &[1u8; DIRECT_ALIGN_BYTES]);
    direct_write(&mount.path(name), 0, length, 2);
    let written = std::fs::read(mount.path(name)).unwrap();
    assert_eq!(written.len(), length);
    mount.crash();
    (written, std::fs::read(mount.path(name)).unwrap())
}

fn is_all(data: &[u8], byte: u8) -> bool {
    data.iter().all(|&b| b == byte)
}

#[test]
fn split_direct_writes_zero_the_first_piece_past_the_old_end_of_file() {
    let mount = Mount::start(SPLIT_DIRECT);
    let (written, after_crash) = direct_write_over_a_small_file(&mount, "two-pieces", 2 * MAX_WRITE_BYTES);
    assert!(is_all(&written[..DIRECT_ALIGN_BYTES], 2));
    assert!(is_all(&written[DIRECT_ALIGN_BYTES..MAX_WRITE_BYTES], 0), "the second piece's gap fill");
    assert!(is_all(&written[MAX_WRITE_BYTES..], 2));
    assert_eq!(after_crash, [1u8; DIRECT_ALIGN_BYTES], "the zeros were unsynced data");

    for length in [MAX_WRITE_BYTES, MAX_WRITE_BYTES / 2] {
        let (written, _) = direct_write_over_a_small_file(&mount, &format!("one-piece-{length}"), length);
        assert!(is_all(&written, 2), "a write of {length} bytes is one request");
    }
}

#[test]
fn without_split_direct_writes_a_large_direct_write_is_intact() {
    for flags in [PAGE_CACHE, &[]] {
        let mount = Mount::start(flags);
        let (written, _) = direct_write_over_a_small_file(&mount, "f", 2 * MAX_WRITE_BYTES);
        assert!(is_all(&written, 2), "{flags:?}");
    }
}

#[test]
fn split_direct_writes_needs_the_page_cache() {
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_sluice-lossyfs"))
        .arg("--backing")
        .arg(dir.path())
        .arg("--mount")
        .arg(dir.path())
        .arg("--split-direct-writes")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--split-direct-writes needs --page-cache"), "{stderr}");
}

#[test]
fn fallocated_space_reads_as_zeros_with_and_without_keep_size() {
    let mount = Mount::start(&[]);
    let file = open_rw(&mount.path("f"));
    file.write_all_at(&[1u8; 4096], 0).unwrap();
    file.sync_all().unwrap();
    // SAFETY: fallocate on an open descriptor we own.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), libc::FALLOC_FL_KEEP_SIZE, 0, 1 << 20) };
    assert_eq!(rc, 0, "fallocate: {}", std::io::Error::last_os_error());
    assert_eq!(file.metadata().unwrap().len(), 4096, "KEEP_SIZE keeps the size");
    file.set_len(8192).unwrap();
    // SAFETY: as above.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 8192, 8192) };
    assert_eq!(rc, 0, "fallocate: {}", std::io::Error::last_os_error());
    let data = std::fs::read(mount.path("f")).unwrap();
    assert_eq!(data.len(), 16384);
    assert!(is_all(&data[..4096], 1));
    assert!(is_all(&data[4096..], 0));
    drop(file);
    mount.command("sync\n");
    mount.crash();
    assert_eq!(std::fs::read(mount.path("f")).unwrap(), data);
}
