"""`sluice dev-cluster`: it fails fast when a node cannot start (a taken port, a bad flag)
and leaves no node behind, its nodes die with it even when it is SIGKILLed, and each node
serves its web console."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time

from conftest import SLUICE_BIN, free_port

CONTROLLER_PORT_OFFSET = 100
# The tests put each node's console this far above its Kafka port.
CONSOLE_PORT_OFFSET = 200


def base_port_with_room(nodes: int) -> int:
    """A base port whose Kafka, controller and console ports for `nodes` nodes are all free now."""
    for _ in range(50):
        base = free_port()
        ports = [base + offset + i for offset in (0, CONTROLLER_PORT_OFFSET, CONSOLE_PORT_OFFSET) for i in range(nodes)]
        try:
            for port in ports:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise AssertionError("no free port range")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def nodes_of(data_dir) -> list[int]:
    """Pids of `sluice serve` processes using a data dir under `data_dir`."""
    out = subprocess.run(["pgrep", "-f", f"serve .*{data_dir}"], capture_output=True, text=True).stdout
    return [int(pid) for pid in out.split()]


def test_a_taken_port_fails_the_start_and_starts_nothing(tmp_path):
    base = base_port_with_room(3)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", base + 1))
        taken.listen()
        result = subprocess.run([SLUICE_BIN, "dev-cluster", "--nodes", "3", "--base-port", str(base),
                                 "--console-port", "0", "--data-dir", str(tmp_path)],
                                capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert f"port {base + 1}" in result.stderr and "not free" in result.stderr, result.stderr
    assert nodes_of(tmp_path) == []


def test_a_node_failing_at_start_up_stops_the_others(tmp_path):
    base = base_port_with_room(3)
    started = time.monotonic()
    result = subprocess.run([SLUICE_BIN, "dev-cluster", "--nodes", "3", "--base-port", str(base),
                             "--console-port", "0", "--data-dir", str(tmp_path), "--", "--num-partitions", "0"],
                            capture_output=True, text=True, timeout=90)
    assert result.returncode != 0
    assert "exited during start-up" in result.stderr, result.stderr
    assert time.monotonic() - started < 30, "dev-cluster must fail fast"
    assert nodes_of(tmp_path) == []


def test_nodes_serve_their_consoles_and_die_with_a_sigkilled_dev_cluster(tmp_path):
    import urllib.request
    base = base_port_with_room(3)
    consoles = base + CONSOLE_PORT_OFFSET
    proc = subprocess.Popen([SLUICE_BIN, "dev-cluster", "--nodes", "3", "--base-port", str(base),
                             "--console-port", str(consoles), "--data-dir", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        pids, urls = [], []
        deadline = time.monotonic() + 60
        while len(pids) < 3:
            assert time.monotonic() < deadline, "dev-cluster did not report its nodes"
            line = proc.stdout.readline()
            assert line, "dev-cluster exited early"
            match = re.match(r"node \d+: pid (\d+) .* console (http://\S+)", line)
            if match:
                pids.append(int(match.group(1)))
                urls.append(match.group(2))
        assert all(alive(pid) for pid in pids)
        assert urls == [f"http://127.0.0.1:{consoles + i}/" for i in range(3)]
        with urllib.request.urlopen(urls[2], timeout=30) as page:
            assert page.status == 200 and b"Nodes" in page.read()
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 30
        while any(alive(pid) for pid in pids):
            assert time.monotonic() < deadline, f"nodes outlived dev-cluster: {[p for p in pids if alive(p)]}"
            time.sleep(0.1)
    finally:
        proc.kill()
        for pid in nodes_of(tmp_path):
            os.kill(pid, signal.SIGKILL)
