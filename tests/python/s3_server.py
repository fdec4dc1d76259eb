"""A real S3-compatible object store for tiered-storage tests: s3s-fs (scripts/s3_server.sh
builds it from crates.io into target/tools the first time), serving a directory of the
test's own on 127.0.0.1. A bucket is a plain subdirectory of that root, and an object is
the file root/bucket/key, so a test can look at what was uploaded on disk. (Bookkeeping
lives in hidden files `.bucket-*` directly under the root, and deleting an object leaves
those behind.)

    s3 = start_s3_server(tmp_path)
    ... broker options from s3.endpoint, s3.bucket, s3.access_key, s3.secret_key ...
    s3.stop()   # the store is unreachable (connection refused) until
    s3.start()  # the same store again: same port, same data

Stop and kill the server at teardown (`stop()` is idempotent).
"""

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from conftest import REPO, free_port

SCRIPT = REPO / "scripts" / "s3_server.sh"
ACCESS_KEY = "sluice"  # fixed in scripts/s3_server.sh
SECRET_KEY = "sluice-secret"
REGION = "us-east-1"  # s3s-fs accepts any region in the signature
START_TIMEOUT_S = 15.0
# A first build of s3s-fs takes 1.5 to 3 minutes on 2 cores; under scripts/test.sh a test may
# wait on the script's lock for the background build, which runs at the lowest priority.
INSTALL_TIMEOUT_S = 1800.0

_installed = False


def install() -> None:
    """Build s3s-fs once per run (quick when target/tools already has the pinned version)."""
    global _installed
    if not _installed:
        subprocess.run([str(SCRIPT), "install"], check=True, timeout=INSTALL_TIMEOUT_S)
        _installed = True


class S3Server:
    """An s3s-fs process serving `root` on 127.0.0.1:`port`, with one bucket created."""

    def __init__(self, root: Path, bucket: str = "sluice-tier", port: int | None = None,
                 log_dir: Path | None = None):
        self.root = Path(root)
        self.bucket = bucket
        self.port = port or free_port()
        self.access_key = ACCESS_KEY
        self.secret_key = SECRET_KEY
        self.region = REGION
        self.proc: subprocess.Popen | None = None
        self.log_path = Path(log_dir or self.root.parent) / f"s3-{self.port}.log"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def bucket_dir(self) -> Path:
        return self.root / self.bucket

    def start(self) -> "S3Server":
        assert not self.is_running(), "s3 server already running"
        install()
        self.bucket_dir.mkdir(parents=True, exist_ok=True)  # a bucket is just a directory
        env = dict(os.environ, RUST_LOG=os.environ.get("SLUICE_S3_LOG", "info"))
        log = open(self.log_path, "ab")
        # The script execs s3s-fs, so self.proc is the server itself.
        self.proc = subprocess.Popen([str(SCRIPT), "run", str(self.root), str(self.port)],
                                     stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"s3s-fs exited with {self.proc.returncode}; log:\n{self.log()}")
            if self._answers():
                return self
            time.sleep(0.05)
        raise RuntimeError(f"s3s-fs did not answer within {START_TIMEOUT_S}s; log:\n{self.log()}")

    def _answers(self) -> bool:
        """s3s-fs binds its port only when ready to serve (an unsigned HTTP probe would
        only add AccessDenied errors to its log)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                return True
        except OSError:
            return False

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM: s3s-fs exits at once, dropping open connections (on SIGINT it would wait
        up to 10 s for clients' keep-alive connections to close)."""
        if not self.is_running():
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    kill = stop

    def restart(self) -> "S3Server":
        self.stop()
        return self.start()

    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def objects(self, prefix: str = "") -> list[str]:
        """The keys in the bucket (from the files on disk), sorted."""
        keys = (p.relative_to(self.bucket_dir).as_posix() for p in self.bucket_dir.rglob("*") if p.is_file())
        return sorted(k for k in keys if k.startswith(prefix))

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-20000:]
        except FileNotFoundError:
            return ""


def start_s3_server(tmp_path: Path, bucket: str = "sluice-tier") -> S3Server:
    """A started S3 server whose data lives in tmp_path/s3 (the caller stops it)."""
    return S3Server(Path(tmp_path) / "s3", bucket=bucket).start()
