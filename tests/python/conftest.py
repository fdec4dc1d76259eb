"""Shared fixtures: a real `sluice serve` process on a real socket and a real data dir.

Every test talks to the broker through a real client over TCP; nothing is mocked.
The binary is taken from $SLUICE_BIN (scripts/test.sh builds it in release mode).
"""

import os
import random
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SLUICE_BIN = os.environ.get("SLUICE_BIN", str(REPO / "target" / "release" / "sluice"))
START_TIMEOUT_S = 30.0
# `sluice serve` arguments: a group's first member is assigned at once, not after Kafka's
# 3 s of waiting for others to join (for tests of one member at a time).
NO_REBALANCE_DELAY = ["--override", "group_initial_rebalance_delay_ms=0"]


# Test modules whose tool scripts/test.sh builds in the background at the lowest priority
# (Helm from the Go module proxy): collected last, so that a worker does not sit waiting for
# the build while the other works through the suite.
BUILT_IN_THE_BACKGROUND = ("test_helm_chart.py",)


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: item.fspath.basename in BUILT_IN_THE_BACKGROUND)


EPHEMERAL_PORTS = "/proc/sys/net/ipv4/ip_local_port_range"
LISTEN_PORTS_SPAN = 12000


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A free port below the kernel's ephemeral range: a port the kernel handed out (bind 0)
    can be taken by any outgoing connection (clients, the fault proxy) before the broker
    binds it, and the broker then fails with "Address already in use". Never the same port
    twice in one run: ports picked together (a cluster's Kafka and controller ports) are
    bound only later, so a repeat would collide."""
    try:
        with open(EPHEMERAL_PORTS) as f:
            ephemeral_low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768
    low, high = worker_port_range(max(1024, ephemeral_low - LISTEN_PORTS_SPAN), ephemeral_low)
    for _ in range(1000):
        port = random.randrange(low, high)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError(f"no free port in [{low}, {high})")


def worker_port_range(low: int, high: int) -> tuple[int, int]:
    """This process's share of [low, high): the suite runs in parallel processes
    (pytest-xdist), and `_HANDED_OUT` only keeps the ports of one process apart, so each
    worker picks from a slice of its own."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count <= 1:
        return low, high
    # xdist numbers a worker that replaces a crashed one past the count (gw2 of 2): it takes
    # the slice of a worker that is gone (a port still bound there is skipped at bind).
    index = int(worker[2:]) % count
    span = (high - low) // count
    return low + index * span, low + (index + 1) * span


class Broker:
    """A `sluice serve` child process bound to 127.0.0.1:<port> with its own data dir."""

    def __init__(self, data_dir: Path, port: int | None = None, extra_args=(), env=None, log_dir: Path | None = None,
                 bin: str | None = None):
        self.bin = bin or SLUICE_BIN
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.extra_args = list(extra_args)
        self.env = dict(os.environ, **(env or {}))
        self.env.setdefault("RUST_LOG", "info")
        self.proc: subprocess.Popen | None = None
        self.log_path = Path(log_dir or self.data_dir.parent) / f"broker-{self.port}.log"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> "Broker":
        assert self.proc is None or self.proc.poll() is not None, "broker already running"
        log = open(self.log_path, "ab")
        # With named listeners (--override listeners=...) those name the port; else --listen.
        named = any(str(arg).startswith("listeners=") for arg in self.extra_args)
        listen = [] if named else ["--listen", self.bootstrap]
        self.proc = subprocess.Popen(
            [self.bin, "serve", *listen, "--data-dir", str(self.data_dir), *self.extra_args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}; log:\n{self.log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"broker did not listen within {START_TIMEOUT_S}s; log:\n{self.log()}")

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait: the clean-shutdown path."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        """SIGKILL: the crash path (nothing flushed, nothing closed)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def restart(self) -> "Broker":
        self.stop()
        return self.start()

    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-20000:]
        except FileNotFoundError:
            return ""


@pytest.fixture
def broker_factory(tmp_path):
    """Start brokers with custom arguments; all are killed at teardown."""
    started: list[Broker] = []

    def make(extra_args=(), env=None, data_dir=None, port=None) -> Broker:
        b = Broker(data_dir or tmp_path / f"data{len(started)}", port=port, extra_args=extra_args, env=env)
        started.append(b)
        return b.start()

    yield make
    for b in started:
        b.kill()


@pytest.fixture
def broker(broker_factory) -> Broker:
    """A fresh single-node broker with default settings."""
    return broker_factory()


@pytest.fixture
def cluster(tmp_path):
    """A started 3-node cluster (cluster_support.Cluster); every node is killed at teardown."""
    from cluster_support import Cluster  # cluster_support imports this module

    started = Cluster(tmp_path).start()
    yield started
    started.kill_all()
