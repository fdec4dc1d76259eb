//! The mounted filesystem, through the kernel: what survives a `crash` is exactly what was
//! fsynced. Needs root and /dev/fuse (as the power-loss tests that use it).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const MOUNT_TIMEOUT: Duration = Duration::from_secs(10);

/// A mounted `sluice-lossyfs`, unmounted (and its process stopped) on drop.
struct Mount {
    _dir: tempfile::TempDir,
    backing: PathBuf,
    mount: PathBuf,
    child: Child,
}

impl Mount {
    fn start() -> Mount {
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
    let mount = Mount::start();
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
    let mount = Mount::start();
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
    let mount = Mount::start();
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
    let mount = Mount::start();
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
    let mount = Mount::start();
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
