"""Readiness: a cluster node serves Kafka clients only once it is registered and unfenced
(its port is bound from the start, but a connection made earlier waits unanswered), the
same notion `/readyz` answers; `sluice dev-cluster` says `ready <bootstrap list>` once every
node serves, and from then on a topic with one replica per node can be created at once;
`sluice cluster health --wait` is the check for scripts."""

from __future__ import annotations

import os
import re
import signal
import socket
import struct
import subprocess
import time
import urllib.error
import urllib.request

from confluent_kafka.admin import AdminClient, NewTopic

from conftest import SLUICE_BIN, free_port
from cluster_support import Cluster
from test_dev_cluster import base_port_with_room, nodes_of

API_VERSIONS_V0 = struct.pack(">hhih", 18, 0, 7, -1)  # api key, version, correlation id, null client id
# How long a node that cannot be ready yet is watched not answering.
SILENCE_S = 1.5


def readyz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_node_answers_clients_only_once_registered_and_unfenced(tmp_path):
    cluster = Cluster(tmp_path)
    try:
        first = cluster.nodes[1]
        first.start()  # returns once its port takes TCP connections
        with socket.create_connection(("127.0.0.1", first.port), timeout=SILENCE_S) as early:
            early.sendall(struct.pack(">i", len(API_VERSIONS_V0)) + API_VERSIONS_V0)
            # Alone of three voters: no controller quorum, so not registered, so no answer.
            cpu_before, started = cpu_seconds(first.proc.pid), time.monotonic()
            try:
                got = early.recv(4)
            except socket.timeout:
                got = None
            assert got is None, "a node that is not registered and unfenced answered a client"
            # ...and waiting costs next to nothing: the listeners wait for a metadata change,
            # they do not spin.
            busy = (cpu_seconds(first.proc.pid) - cpu_before) / (time.monotonic() - started)
            assert busy < 0.3, f"a node waiting for its quorum used {busy:.0%} of a core"
            status, body = readyz(cluster.metrics_ports[1])
            assert status == 503 and "no active controller" in body, (status, body)
            for node_id in (2, 3):
                cluster.nodes[node_id].start()
            # The connection made before is served once the node is ready: it waited, it
            # was not refused.
            early.settimeout(30)
            size, correlation = struct.unpack(">ii", early.recv(8))
            assert correlation == 7 and size > 4
        assert readyz(cluster.metrics_ports[1])[0] == 200

        # Restarted alone, with the cluster's metadata on disk: not ready again until a
        # quorum registers this process anew, and waiting at no cost.
        cluster.kill_all()
        first.start()
        assert_silent_and_idle(first)
        status, body = readyz(cluster.metrics_ports[1])
        assert status == 503, (status, body)
    finally:
        cluster.kill_all()


def assert_silent_and_idle(node) -> None:
    """`node` leaves an ApiVersions request unanswered for SILENCE_S, using little CPU."""
    with socket.create_connection(("127.0.0.1", node.port), timeout=SILENCE_S) as early:
        early.sendall(struct.pack(">i", len(API_VERSIONS_V0)) + API_VERSIONS_V0)
        cpu_before, started = cpu_seconds(node.proc.pid), time.monotonic()
        try:
            got = early.recv(4)
        except socket.timeout:
            got = None
        assert got is None, "a node that is not registered and unfenced answered a client"
        # The listeners wait for a metadata change; they do not spin.
        busy = (cpu_seconds(node.proc.pid) - cpu_before) / (time.monotonic() - started)
        assert busy < 0.3, f"a node waiting for its quorum used {busy:.0%} of a core"


def test_dev_cluster_ready_line_then_a_topic_on_every_node_and_a_healthy_cluster(tmp_path):
    base = base_port_with_room(3)
    started = time.monotonic()
    # The nodes log to dev-cluster's stderr: kept for a failure's message.
    node_log = tmp_path / "nodes.log"
    proc = subprocess.Popen([SLUICE_BIN, "dev-cluster", "--nodes", "3", "--base-port", str(base),
                             "--console-port", "0", "--data-dir", str(tmp_path / "data")],
                            stdout=subprocess.PIPE, stderr=node_log.open("w"), text=True)
    try:
        bootstrap = None
        while bootstrap is None:
            assert time.monotonic() - started < 60, "dev-cluster did not say ready"
            line = proc.stdout.readline()
            assert line, "dev-cluster exited early"
            match = re.fullmatch(r"ready (\S+)\n", line)
            if match:
                bootstrap = match.group(1)
        assert bootstrap == ",".join(f"127.0.0.1:{base + i}" for i in range(3))

        # No retry: every node is registered and unfenced once the line is out.
        admin = AdminClient({"bootstrap.servers": bootstrap})
        futures = admin.create_topics([NewTopic("everywhere", num_partitions=3, replication_factor=3)])
        try:
            futures["everywhere"].result(timeout=60)
        except Exception as error:
            raise AssertionError(f"creating a topic failed: {error!r}\n--- nodes (tail) ---\n"
                                 f"{node_log.read_text(errors='replace')[-8000:]}") from None

        health = subprocess.run([SLUICE_BIN, "cluster", "health", "--wait", "--timeout", "30s", "-b", bootstrap],
                                capture_output=True, text=True, timeout=60)
        assert health.returncode == 0, health.stderr
        assert health.stdout.startswith("healthy: 3 brokers unfenced (1, 2, 3)"), health.stdout

        # A node that never registered is invisible: --min-brokers asks for it by count.
        short = subprocess.run([SLUICE_BIN, "cluster", "health", "--wait", "--timeout", "1s", "--min-brokers", "4",
                                "-b", bootstrap], capture_output=True, text=True, timeout=30)
        assert short.returncode == 1
        assert "error: cluster not healthy after 1s: 3 brokers registered, fewer than 4" in short.stderr, short.stderr
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        for pid in nodes_of(tmp_path):
            os.kill(pid, signal.SIGKILL)
    # The nodes log to stderr. Their logs in the stdout a script stops reading at `ready` would
    # fill its pipe, and a node blocked writing a log line serves nobody.
    assert node_log.read_text(errors="replace").count("ready: serving clients") == 3
    rest = proc.stdout.read()
    assert "serving clients" not in rest, rest[-2000:]


def test_cluster_health_names_what_it_waited_for_on_timeout():
    nobody = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    result = subprocess.run([SLUICE_BIN, "cluster", "health", "--wait", "--timeout", "1s", "-b", nobody],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    assert f"error: cluster not healthy after 1s: cannot reach {nobody}: connection refused" in result.stderr, \
        result.stderr
    assert time.monotonic() - started < 10
