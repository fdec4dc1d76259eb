"""A lossy mount for power-loss tests: `sluice-lossyfs` (crates/lossyfs), a FUSE filesystem
that keeps every byte written but not fsynced in memory only, so `power_loss()` makes
unsynced data vanish as a power cut would. Names (create, unlink, rename, mkdir) are durable
at once, as in LazyFS's default, unless `strict_dirs`; `split_direct_writes` damages large
direct-I/O writes as LazyFS's concurrent request handling can (crates/lossyfs/src/fs.rs has
the whole model). The binary is taken from $SLUICE_LOSSYFS_BIN (scripts/test.sh builds it).
"""

import os
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LOSSYFS_BIN = os.environ.get("SLUICE_LOSSYFS_BIN", str(REPO / "target" / "release" / "sluice-lossyfs"))
CONTROL_FILE = ".lossyfs-control"
MOUNT_TIMEOUT_S = 15.0


class LossyMount:
    """`root/backing` (what survives) seen through `root/mnt` (what the broker uses)."""

    def __init__(self, root: Path, page_cache: bool = False, strict_dirs: bool = False,
                 split_direct_writes: bool = False):
        """`page_cache`: files go through the kernel's page cache so they can be mmapped
        (`--page-cache`; needed by Kafka). `strict_dirs`: a created, removed or renamed name
        survives `power_loss()` only if its directory was fsynced since, for a rename the
        destination's (`--lose-unsynced-dir-entries`). `split_direct_writes`: an O_DIRECT
        write larger than 1 MiB, which the kernel splits into 1 MiB requests, has the gap
        before each later piece refilled with zeros over the earlier pieces, e.g. a 2 MiB
        write at offset P to a file of P + 4096 bytes leaves [P + 4096, P + 1 MiB) zeros
        (`--split-direct-writes`; needs `page_cache`)."""
        if split_direct_writes and not page_cache:
            raise ValueError("split_direct_writes needs page_cache")
        self.page_cache = page_cache
        self.strict_dirs = strict_dirs
        self.split_direct_writes = split_direct_writes
        self.backing = Path(root) / "backing"
        self.mount = Path(root) / "mnt"
        self.log_path = Path(root) / "lossyfs.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "LossyMount":
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mount.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        flags = [*(["--page-cache"] if self.page_cache else []),
                 *(["--lose-unsynced-dir-entries"] if self.strict_dirs else []),
                 *(["--split-direct-writes"] if self.split_direct_writes else [])]
        self.proc = subprocess.Popen([LOSSYFS_BIN, "--backing", str(self.backing), "--mount", str(self.mount), *flags],
                                     stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + MOUNT_TIMEOUT_S
        while not (self.mount / CONTROL_FILE).exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"lossyfs exited with {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"lossyfs did not mount within {MOUNT_TIMEOUT_S}s:\n{self.log()}")
            time.sleep(0.05)
        return self

    def _control(self, command: str) -> None:
        with open(self.mount / CONTROL_FILE, "w") as control:
            control.write(command + "\n")

    def power_loss(self) -> None:
        """Drops every unsynced byte, and with `strict_dirs` undoes every name change whose
        directory was not fsynced (the caller has already killed the processes using it)."""
        self._control("crash")

    def sync(self) -> None:
        """Makes everything written so far durable, names included (a global `sync`)."""
        self._control("sync")

    def fail_fsync(self) -> None:
        """A failing disk: every fsync answers EIO until `heal()`, and data whose fsync failed
        is never persisted, even by a later fsync that succeeds (Linux's behaviour)."""
        self._control("fail-fsync")

    def heal(self) -> None:
        self._control("heal")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if os.path.ismount(self.mount):
            subprocess.run(["umount", "-l", str(self.mount)], check=False)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-5000:]
        except FileNotFoundError:
            return ""
