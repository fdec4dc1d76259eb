"""N `sluice serve` processes on loopback behind a `FaultProxy`, and the faults done to them.

Each node listens on private ports (Kafka, controller) and advertises the proxy's public
ports, which are also the addresses in the voters list, so every byte between nodes (and
between clients and nodes) crosses the proxy. Nodes connect to each other from
`127.0.0.(10+i)`, which is how the proxy knows the source of a connection.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import kafka_wire as kw
from cluster_support import write_cluster_secret
from conftest import free_port
from lossyfs import LossyMount

from faults.proxy import FaultProxy, Route, source_address

REPO = Path(__file__).resolve().parents[3]
SLUICE_BIN = os.environ.get("SLUICE_BIN", str(REPO / "target" / "release" / "sluice"))
START_TIMEOUT_S = 30.0
METADATA_TIMEOUT_S = 2.0
STABLE_S = 2.0
"""How long the cluster must look healthy before a fault counts as recovered: above the
session timeout (1.5 s), so a restarted node fenced meanwhile shows."""


@dataclass
class Metadata:
    """One node's answer to a Metadata request (the partitions of the one topic asked for)."""

    controller_id: int
    brokers: list[int]
    partitions: dict[int, kw.PartitionMetadata]


class Node:
    """One `sluice serve` process; signals are sent to it and nothing else."""

    def __init__(self, node_id: int, data_dir: Path, voters: str, log_dir: Path, extra_args=()):
        self.node_id = node_id
        self.data_dir = data_dir
        self.kafka_public = free_port()
        self.kafka_private = free_port()
        self.controller_public = free_port()
        self.controller_private = free_port()
        self.voters = voters
        self.extra_args = list(extra_args)
        self.log_path = log_dir / f"node-{node_id}.log"
        self.proc: subprocess.Popen | None = None
        self.paused = False

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.kafka_public}"

    def start(self) -> None:
        assert not self.is_running(), f"node {self.node_id} already running"
        args = [
            SLUICE_BIN, "serve",
            "--node-id", str(self.node_id),
            "--listen", f"127.0.0.1:{self.kafka_private}",
            "--advertised-listener", self.bootstrap,
            "--data-dir", str(self.data_dir),
            "--controller-listen", f"127.0.0.1:{self.controller_private}",
            "--cluster-voters", self.voters,
            "--cluster-source-address", source_address(self.node_id),
            *self.extra_args,
        ]
        env = dict(os.environ)
        env.setdefault("RUST_LOG", "info")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
        self.paused = False
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"node {self.node_id} exited with {self.proc.returncode}; log:\n{self.log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.kafka_private), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"node {self.node_id} did not listen within {START_TIMEOUT_S}s")

    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL (after SIGCONT, so a paused process dies at once)."""
        if self.is_running():
            self.resume()
            self.proc.kill()
            self.proc.wait()
        self.paused = False

    def pause(self) -> None:
        assert self.is_running()
        self.proc.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        if self.is_running() and self.paused:
            self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    def metadata(self, topic: str | None) -> Metadata:
        """Metadata v1 straight from this node (its private port: no proxy, no other node)."""
        with kw.Conn("127.0.0.1", self.kafka_private, timeout=METADATA_TIMEOUT_S) as conn:
            answer = conn.metadata_detail([topic] if topic else [], version=1)
        partitions = {index: p for t in answer.topics.values() for index, p in t.partitions.items()}
        return Metadata(answer.controller_id, answer.brokers, partitions)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-20000:]
        except FileNotFoundError:
            return ""


class FaultCluster:
    """The nodes, the proxy, and the faults: kill -9/restart, pause/resume, isolate/heal, and
    with `lossy` (each node's data dir on its own `sluice-lossyfs` mount) power loss."""

    def __init__(self, work_dir: Path, nodes: int = 3, extra_args=(), lossy: bool = False):
        assert nodes in (3, 5), "the controller quorum has 3 or 5 voters"
        work_dir.mkdir(parents=True, exist_ok=True)
        self.work_dir = work_dir
        ids = range(1, nodes + 1)
        controller_ports = {i: free_port() for i in ids}
        voters = ",".join(f"{i}@127.0.0.1:{controller_ports[i]}" for i in ids)
        self.mounts: dict[int, LossyMount] = {i: LossyMount(work_dir / f"fs-{i}") for i in ids} if lossy else {}
        self.nodes: dict[int, Node] = {}
        secret = ["--cluster-rpc-secret-file", write_cluster_secret(work_dir)]
        for i in ids:
            data_dir = self.mounts[i].mount / "data" if lossy else work_dir / f"node-{i}"
            node = Node(i, data_dir, voters, work_dir, [*secret, *extra_args])
            node.controller_public = controller_ports[i]
            self.nodes[i] = node
        routes = []
        for node in self.nodes.values():
            routes.append(Route(node.node_id, "kafka", node.kafka_public, node.kafka_private))
            routes.append(Route(node.node_id, "controller", node.controller_public, node.controller_private))
        self.proxy = FaultProxy(routes)

    @property
    def bootstrap(self) -> str:
        return ",".join(node.bootstrap for node in self.nodes.values())

    def start(self) -> "FaultCluster":
        for mount in self.mounts.values():
            mount.start()
        self.proxy.start()
        for node in self.nodes.values():
            node.start()
        self.wait_for("every broker registered", lambda: len(self.any_metadata(None).brokers) == len(self.nodes), 60)
        return self

    def stop(self) -> None:
        """Always safe: resumes paused nodes, kills every node, stops the proxy."""
        for node in self.nodes.values():
            node.kill()
        self.proxy.stop()
        for mount in self.mounts.values():
            mount.stop()

    # ------------------------------------------------------------------ faults

    def kill(self, node_id: int) -> None:
        """SIGKILL; the node's public ports close with it."""
        self.nodes[node_id].kill()
        self.proxy.set_listening(node_id, False)

    def power_loss(self, node_id: int) -> None:
        """SIGKILL, then every byte the node had not fsynced is gone (its disk loses power)."""
        self.kill(node_id)
        self.mounts[node_id].power_loss()

    def restart(self, node_id: int) -> None:
        self.proxy.set_listening(node_id, True)
        self.nodes[node_id].start()

    def isolate(self, node_id: int) -> None:
        """Cuts `node_id` off from every other node (clients still reach it)."""
        self.proxy.cut({frozenset((node_id, other)) for other in self.nodes if other != node_id})

    def heal(self) -> None:
        self.proxy.heal()

    def isolated_from(self, node_id: int) -> set[int]:
        return {other for pair in self.proxy.cut_links() if node_id in pair for other in pair if other != node_id}

    # ------------------------------------------------------------------ observation

    def reachable(self) -> list[Node]:
        """Running, unpaused nodes."""
        return [node for node in self.nodes.values() if node.is_running() and not node.paused]

    def any_metadata(self, topic: str | None, avoid: set[int] = frozenset()) -> Metadata:
        """Metadata from the first reachable node not in `avoid` that answers."""
        last = None
        for node in self.reachable():
            if node.node_id in avoid:
                continue
            try:
                return node.metadata(topic)
            except (OSError, kw.DecodeError, AssertionError) as error:
                last = error
        raise RuntimeError(f"no node answered metadata: {last}")

    def wait_for(self, what: str, predicate, timeout: float = 30.0):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                last = predicate()
                if last:
                    return last
            except Exception as error:  # metadata is briefly unavailable during failover
                last = error
            time.sleep(0.1)
        raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")

    def healthy(self, topic: str, partitions: int) -> bool:
        """Every node registered, every partition led, every ISR complete, as every node sees it."""
        if len(self.reachable()) != len(self.nodes):
            return False
        for node in self.nodes.values():
            md = node.metadata(topic)
            if len(md.brokers) != len(self.nodes) or md.controller_id < 0 or len(md.partitions) != partitions:
                return False
            if not all(p.leader > 0 and len(p.isr) == len(p.replicas) for p in md.partitions.values()):
                return False
        return True

    def wait_stably_healthy(self, topic: str, partitions: int, timeout: float) -> None:
        """Waits until `healthy` has held for STABLE_S: right after a restart, metadata may
        still show the ISR from before the fault (the controller fences the new incarnation
        first, then the leaders add it back)."""
        since = [None]

        def stable():
            if not self.healthy(topic, partitions):
                since[0] = None
                return False
            since[0] = since[0] or time.monotonic()
            return time.monotonic() - since[0] >= STABLE_S

        self.wait_for("a stably healthy cluster", stable, timeout)

    def create_topic(self, name: str, partitions: int, replication_factor: int, configs: dict[str, str]) -> None:
        """CreateTopics through any reachable node; returns once every partition has a leader."""

        def created():
            node = self.reachable()[0]
            with kw.Conn("127.0.0.1", node.kafka_private, timeout=15) as conn:
                result = conn.create_topics([(name, partitions, replication_factor, configs)], timeout_ms=10000)
            error, message = result[name]
            assert error in (kw.NONE, kw.TOPIC_ALREADY_EXISTS), f"create {name}: error {error} {message}"
            return True

        self.wait_for(f"topic {name} created", created, 30)
        def led():
            md = self.any_metadata(name)
            return len(md.partitions) == partitions and all(p.leader > 0 for p in md.partitions.values())

        self.wait_for(f"topic {name} led", led, 30)
