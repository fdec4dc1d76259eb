#!/usr/bin/env python3
"""How long moving one partition to a new broker takes, by partition size, under live load.

For each system and size, on a fresh 3-node cluster on this machine:
  1. create a topic of 1 partition, replicas {1, 2} (leader 1), segment.bytes 64 MiB
     (sluice-tiered also remote.storage.enable=true, local.retention.bytes 64 MiB);
  2. fill it with SIZE GiB of 10 KiB records (librdkafka, acks=all);
  3. sluice-tiered: wait until the leader's local log start has moved (ListOffsets -4,
     earliest-local) and its local tail is down to about its retention;
  4. start a live load: ~20 MiB/s of 10 KiB keyed records (`L0`, `L1`, ...), idempotent
     acks=all, into the partition;
  5. AlterPartitionReassignments to {1, 3} (drop 2, add 3) and time from that request until
     the move is complete: ListPartitionReassignments is empty and the metadata's replicas
     are {1, 3};
  6. stop the load, then read the whole partition back: every acknowledged live record (by
     key) is there and the fill is intact (count, offsets 0..fill end).

Systems:
  sluice-tiered  Sluice cluster, the topic tiered (object store: file:// on a directory all
                 nodes share, or s3s-fs with --s3);
  sluice-local   Sluice cluster, the same topic without tiering;
  kafka          Apache Kafka 4.3.1, 3 KRaft nodes (broker+controller each), default settings,
                 from the jars `sluice bench` installs (~/.cache/sluice-bench/kafka-4.3.1, or
                 $SLUICE_BENCH_CACHE).

    .venv/bin/python scripts/reassign_time.py [--sizes 0.5,1,2] \
        [--systems sluice-tiered,sluice-local,kafka] [--output results.json] [--s3] [--repeats N]

The table gives the median move time per system and size over the repeats (min-max).

Every run's data lives under --work-dir (default ./target/reassign-time) and is deleted
after the run unless --keep. Needs SLUICE_BIN (or a release build).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

import conftest  # noqa: E402
import kafka_wire as kw  # noqa: E402
from cluster_support import Cluster  # noqa: E402
from test_cluster_admin import alter_reassignment, list_reassignments  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
KAFKA_VERSION = "4.3.1"
SYSTEMS = ("sluice-tiered", "sluice-local", "kafka")
RECORD_BYTES = 10 * 1024
SEGMENT_BYTES = 64 << 20
LOCAL_RETENTION_BYTES = 64 << 20
LOAD_MIB_S = 20.0
EARLIEST_LOCAL = -4
SOURCE, TARGET = [1, 2], [1, 3]
NEW_NODE = 3
MOVE_TIMEOUT_S = 900.0
TIER_WAIT_S = 300.0
SETTLE_S = 5.0
# Sluice checks retention (and so local retention of tiered topics) every 60 s by default;
# 1 s only shortens the wait of step 3. It is no setting of the move itself.
SLUICE_ARGS = ["--log-retention-check-interval-ms", "1000"]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --- the systems -------------------------------------------------------------------------

class KafkaCluster:
    """Apache Kafka, 3 nodes each broker and controller (KRaft), on loopback ports, defaults."""

    def __init__(self, home: Path, work: Path, nodes: int = 3):
        self.classpath = f"{home}/lib/*"
        self.work = work
        self.ports = {i: conftest.free_port() for i in range(1, nodes + 1)}
        controllers = {i: conftest.free_port() for i in self.ports}
        voters = ",".join(f"{i}@127.0.0.1:{p}" for i, p in controllers.items())
        self.procs: dict[int, subprocess.Popen] = {}
        self.props: dict[int, Path] = {}
        cluster_id = self._tool("random-uuid").strip()
        for i, port in self.ports.items():
            node = work / f"kafka-{i}"
            node.mkdir(parents=True)
            self.props[i] = node / "server.properties"
            self.props[i].write_text(
                f"process.roles=broker,controller\nnode.id={i}\ncontroller.quorum.voters={voters}\n"
                f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controllers[i]}\n"
                f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}\n"
                "controller.listener.names=CONTROLLER\ninter.broker.listener.name=PLAINTEXT\n"
                f"log.dirs={node / 'data'}\ngroup.initial.rebalance.delay.ms=0\n")
            self._tool("format", "-t", cluster_id, "-c", str(self.props[i]))
        self.bootstrap = ",".join(f"127.0.0.1:{p}" for p in self.ports.values())

    def _tool(self, *args: str) -> str:
        return subprocess.run(["java", "-cp", self.classpath, "kafka.tools.StorageTool", *args],
                              check=True, capture_output=True, text=True).stdout

    def node_bootstrap(self, node_id: int) -> str:
        return f"127.0.0.1:{self.ports[node_id]}"

    def partition_dir(self, node_id: int, topic: str) -> Path:
        return self.work / f"kafka-{node_id}" / "data" / f"{topic}-0"

    def start(self) -> "KafkaCluster":
        for i in self.ports:
            out = open(self.work / f"kafka-{i}.log", "ab")
            self.procs[i] = subprocess.Popen(
                ["java", "-Xms1g", "-Xmx1g", "-XX:+UseG1GC", "-cp", self.classpath, "kafka.Kafka",
                 str(self.props[i])], stdout=out, stderr=subprocess.STDOUT)
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 2})
        wait_for("all Kafka brokers registered",
                 lambda: all(p.poll() is None for p in self.procs.values())
                 and len(admin.list_topics(timeout=5).brokers) == len(self.ports), timeout=120)
        return self

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()


class SluiceCluster:
    """A Sluice cluster (tests/python/cluster_support.py) with one shared object store."""

    def __init__(self, work: Path, s3: bool):
        self.s3 = None
        if s3:
            from s3_server import start_s3_server
            self.s3 = start_s3_server(work)
            store = [f"tiered_storage.url=s3://{self.s3.bucket}/sluice",
                     f"tiered_storage.endpoint={self.s3.endpoint}", "tiered_storage.allow_http=true",
                     f"tiered_storage.access_key_id={self.s3.access_key}",
                     f"tiered_storage.secret_access_key={self.s3.secret_key}"]
            self.store_dir = self.s3.bucket_dir
        else:
            self.store_dir = work / "object-store"
            self.store_dir.mkdir()
            store = [f"tiered_storage.url=file://{self.store_dir}"]
        args = SLUICE_ARGS + [x for o in store for x in ("--override", o)]
        self.cluster = Cluster(work, node_args=lambda node_id, port: args)
        self.bootstrap = self.cluster.bootstrap

    def node_bootstrap(self, node_id: int) -> str:
        return self.cluster.nodes[node_id].bootstrap

    def partition_dir(self, node_id: int, topic: str) -> Path:
        return self.cluster.nodes[node_id].data_dir / "logs" / f"{topic}-0"

    def start(self) -> "SluiceCluster":
        try:
            self.cluster.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        self.cluster.kill_all()
        if self.s3 is not None:
            self.s3.stop()


# --- helpers ------------------------------------------------------------------------------

def wait_for(what, predicate, timeout=60.0, interval=0.1):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
            if last:
                return last
        except Exception as error:  # noqa: BLE001 - not yet
            last = error
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}; last: {last}")


def partition_state(admin: AdminClient, topic: str):
    p = admin.list_topics(topic=topic, timeout=10).topics[topic].partitions[0]
    if p.error is not None:
        raise RuntimeError(str(p.error))
    return p.leader, list(p.replicas), sorted(p.isrs)


def dir_bytes(path: Path) -> int:
    try:
        return sum(f.stat().st_size for f in path.iterdir() if f.is_file() and f.suffix == ".log")
    except FileNotFoundError:
        return 0


def local_start(bootstrap: str, topic: str) -> int:
    with kw.Conn.to(bootstrap) as conn:
        err, _, offset = conn.list_offsets(topic, 0, EARLIEST_LOCAL, version=8)
        return offset if err == 0 else -1


def fill(bootstrap: str, topic: str, gib: float) -> tuple[int, float]:
    """Writes gib GiB of unkeyed RECORD_BYTES records; returns (records, seconds)."""
    producer = Producer({
        "bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20, "batch.size": 1 << 20,
        "queue.buffering.max.kbytes": 256 << 10, "message.timeout.ms": 0, "log_level": 2,
    })
    failed, acked = [], [0]

    def delivered(err, _msg):
        if err is not None:
            failed.append(err)
        else:
            acked[0] += 1

    payload = os.urandom(RECORD_BYTES)
    total = int(gib * (1 << 30) / RECORD_BYTES)
    started = time.monotonic()
    for i in range(total):
        while True:
            try:
                producer.produce(topic, payload, partition=0, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(900) == 0, "fill records left unacknowledged"
    assert not failed and acked[0] == total, f"{len(failed)} fill deliveries failed, first: {failed[:1]}"
    return total, time.monotonic() - started


class LiveLoad:
    """Idempotent acks=all producer, paced at `mib_s` of RECORD_BYTES records keyed L0, L1, ...
    into partition 0, from a thread until stopped. Keeps the acknowledged keys, delivery
    errors, and each acknowledgement's latency (librdkafka's Message.latency())."""

    def __init__(self, bootstrap: str, topic: str, mib_s: float):
        self.producer = Producer({
            "bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5,
            "message.timeout.ms": 600_000, "retry.backoff.ms": 50, "topic.metadata.refresh.interval.ms": 1000,
            "log_level": 2,
        })
        self.topic = topic
        self.rate = mib_s * (1 << 20) / RECORD_BYTES
        self.acked: dict[str, int] = {}
        self.failed: list[str] = []
        self.latencies: list[tuple[float, float]] = []  # (ack time, latency s)
        self.sent = 0
        self.behind_max = 0
        self.payload = os.urandom(RECORD_BYTES)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.started = time.monotonic()
        self._thread.start()

    def _on_delivery(self, err, msg):
        if err:
            self.failed.append(str(err))
        else:
            self.acked[msg.key().decode()] = msg.offset()
            self.latencies.append((time.monotonic(), msg.latency() or 0.0))

    def _run(self):
        while not self._stop.is_set():
            due = int((time.monotonic() - self.started) * self.rate) - self.sent
            self.behind_max = max(self.behind_max, due)
            for _ in range(max(0, min(due, 200))):
                try:
                    self.producer.produce(self.topic, key=f"L{self.sent}", value=self.payload, partition=0,
                                          on_delivery=self._on_delivery)
                    self.sent += 1
                except BufferError:
                    break
            self.producer.poll(0.002)
        self.producer.flush(700)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join(760)
        return time.monotonic() - self.started

    def window(self, start: float, end: float) -> dict:
        lat = sorted(l for t, l in self.latencies if start <= t <= end)
        if not lat:
            return {"acks": 0}
        q = lambda f: lat[min(len(lat) - 1, int(f * len(lat)))] * 1000  # noqa: E731
        return {"acks": len(lat), "acked_mib_s": len(lat) * RECORD_BYTES / (1 << 20) / max(end - start, 1e-9),
                "ack_latency_ms_p50": q(0.5), "ack_latency_ms_p99": q(0.99), "ack_latency_ms_max": lat[-1] * 1000}


def read_back(bootstrap: str, topic: str, fill_records: int, acked: dict[str, int], end: int) -> dict:
    """Reads offsets [0, end); counts the fill (unkeyed) and collects the live keys."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reassign-check-{uuid.uuid4().hex[:6]}",
                  "enable.auto.commit": False, "enable.partition.eof": False, "fetch.max.bytes": 64 << 20,
                  "max.partition.fetch.bytes": 16 << 20, "queued.max.messages.kbytes": 256 << 10,
                  "broker.address.family": "v4", "log_level": 2})
    c.assign([TopicPartition(topic, 0, 0)])
    fill_seen, fill_bad, live, dupes, next_offset, gaps = 0, 0, {}, 0, 0, 0
    started = time.monotonic()
    deadline = started + 900
    try:
        while next_offset < end:
            if time.monotonic() > deadline:
                raise TimeoutError(f"read back stopped at offset {next_offset} of {end}")
            for m in c.consume(5000, 1.0):
                if m.error():
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    raise RuntimeError(f"consumer error: {m.error()}")
                o = m.offset()
                if o >= end:
                    next_offset = max(next_offset, o + 1)
                    continue
                if o != next_offset:
                    gaps += 1
                next_offset = o + 1
                key = m.key()
                if key is None:
                    fill_seen += 1
                    if o >= fill_records or len(m.value()) != RECORD_BYTES:
                        fill_bad += 1
                else:
                    k = key.decode()
                    if k in live:
                        dupes += 1
                    live[k] = o
    finally:
        c.close()
    lost = [k for k in acked if k not in live]
    moved = [k for k in acked if k in live and live[k] != acked[k]]
    return {"fill_read": fill_seen, "fill_ok": fill_seen == fill_records and fill_bad == 0,
            "live_read": len(live), "live_lost": len(lost), "live_lost_examples": sorted(lost)[:5],
            "live_moved_offset": len(moved), "live_duplicates": dupes, "offset_gaps": gaps,
            "read_s": round(time.monotonic() - started, 1)}


# --- one run --------------------------------------------------------------------------------

def run_one(system: str, gib: float, work: Path, s3: bool) -> dict:
    result: dict = {"system": system, "size_gib": gib, "record_bytes": RECORD_BYTES}
    t_run = time.monotonic()
    if system == "kafka":
        cache = Path(os.environ.get("SLUICE_BENCH_CACHE", Path.home() / ".cache" / "sluice-bench"))
        cluster = KafkaCluster(cache / f"kafka-{KAFKA_VERSION}", work)
    else:
        cluster = SluiceCluster(work, s3)
    topic = f"moving-{uuid.uuid4().hex[:6]}"
    tiered = system == "sluice-tiered"
    load = None
    try:
        cluster.start()
        admin = AdminClient({"bootstrap.servers": cluster.node_bootstrap(1), "log_level": 2})
        config = {"segment.bytes": str(SEGMENT_BYTES)}
        if tiered:
            config |= {"remote.storage.enable": "true", "local.retention.bytes": str(LOCAL_RETENTION_BYTES)}

        def created():
            try:
                admin.create_topics([NewTopic(topic, 1, replica_assignment=[SOURCE], config=config)])[topic].result(30)
            except Exception as error:  # a quorum still electing its first leader: again
                if "already exists" not in str(error):
                    raise
            return True

        wait_for("topic created", created, timeout=60, interval=1)
        wait_for("leader 1, ISR {1, 2}", lambda: partition_state(admin, topic) == (1, SOURCE, SOURCE))

        log(f"{system} {gib} GiB: filling")
        fill_records, fill_s = fill(cluster.node_bootstrap(1), topic, gib)
        result |= {"fill_records": fill_records, "fill_s": round(fill_s, 1),
                   "fill_mib_s": round(fill_records * RECORD_BYTES / (1 << 20) / fill_s, 1)}
        log(f"  filled {fill_records} records in {fill_s:.1f} s ({result['fill_mib_s']} MiB/s)")
        wait_for("ISR {1, 2} after the fill", lambda: partition_state(admin, topic)[2] == SOURCE, timeout=120)

        if tiered:
            t0 = time.monotonic()
            leader = cluster.node_bootstrap(1)
            wait_for("the leader's local log start to move", lambda: local_start(leader, topic) > 0,
                     timeout=TIER_WAIT_S, interval=0.5)
            # Then until the leader keeps about its local retention (the active segment, one
            # sealed segment, maybe one more not yet copied) - or give up waiting on that.
            tail_records = (LOCAL_RETENTION_BYTES + 2 * SEGMENT_BYTES) // RECORD_BYTES
            try:
                wait_for("the leader's local tail to shrink",
                         lambda: fill_records - local_start(leader, topic) <= tail_records,
                         timeout=TIER_WAIT_S, interval=0.5)
            except TimeoutError as error:
                log(f"  {error}")
            start = local_start(leader, topic)
            result |= {"tier_wait_s": round(time.monotonic() - t0, 1), "leader_local_start": start,
                       "leader_local_tail_mib": round((fill_records - start) * RECORD_BYTES / (1 << 20), 1),
                       "object_store_mib": round(sum(f.stat().st_size for f in cluster.store_dir.rglob("*")
                                                     if f.is_file()) / (1 << 20), 1)}
            log(f"  leader's local log starts at {start} after {result['tier_wait_s']} s "
                f"(local tail {result['leader_local_tail_mib']} MiB)")

        time.sleep(SETTLE_S)  # the same pause for every system: the fill's writeback, fetchers idle
        load = LiveLoad(cluster.node_bootstrap(1), topic, LOAD_MIB_S)
        wait_for("first acks of the live load", lambda: len(load.acked) >= 100, timeout=60)
        time.sleep(2.0)
        live = cluster.node_bootstrap(1)  # node 1 stays leader and replica throughout
        log(f"  live load at {LOAD_MIB_S} MiB/s running; reassigning {SOURCE} -> {TARGET}")
        started = time.monotonic()
        top, err, msg = alter_reassignment(live, topic, 0, TARGET)
        assert (top, err) == (0, 0), f"AlterPartitionReassignments refused: {top} {err} {msg}"
        in_sync_at = None
        while True:
            now = time.monotonic()
            if now - started > MOVE_TIMEOUT_S:
                raise TimeoutError(f"the move did not finish in {MOVE_TIMEOUT_S:.0f} s")
            try:
                ongoing = list_reassignments(live)
                _, replicas, isr = partition_state(admin, topic)
            except Exception:  # noqa: BLE001 - a slow answer during the move: ask again
                time.sleep(0.1)
                continue
            if in_sync_at is None and NEW_NODE in isr:
                in_sync_at = now - started
            if not ongoing and sorted(replicas) == TARGET:
                break
            time.sleep(0.1)
        took = time.monotonic() - started
        copied = dir_bytes(cluster.partition_dir(NEW_NODE, topic))
        result |= {"move_s": round(took, 2), "new_replica_in_isr_s": in_sync_at and round(in_sync_at, 2),
                   "new_replica_log_mib_at_end": round(copied / (1 << 20), 1)}
        log(f"  moved in {took:.2f} s; the new replica holds {copied / (1 << 20):.0f} MiB of log")
        during = load.window(started, started + took)
        load.stop()
        load_s = time.monotonic() - load.started
        result["live_load"] = {"sent": load.sent, "acked": len(load.acked), "failed": len(load.failed),
                               "failed_examples": load.failed[:3], "seconds": round(load_s, 1),
                               "target_mib_s": LOAD_MIB_S,
                               "during_move": {k: round(v, 2) for k, v in during.items()}}
        consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "wm", "log_level": 2})
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
        consumer.close()
        check = read_back(cluster.bootstrap, topic, fill_records, load.acked, high)
        check["log_end"] = high
        check["ok"] = (check["fill_ok"] and check["live_lost"] == 0 and check["live_moved_offset"] == 0
                       and check["offset_gaps"] == 0 and not load.failed)
        result["check"] = check
        log(f"  read back {check['fill_read']} fill + {check['live_read']} live records in {check['read_s']} s: "
            f"{'OK' if check['ok'] else 'FAILED ' + json.dumps(check)}")
    except Exception as error:  # noqa: BLE001 - recorded, the next run goes on
        result["error"] = f"{type(error).__name__}: {error}"
        log(f"  FAILED: {result['error']}")
    finally:
        if load is not None and load._thread.is_alive():
            load.stop()
        cluster.stop()
        result["run_s"] = round(time.monotonic() - t_run, 1)
    return result


def table(results: list[dict], sizes: list[float], systems: list[str]) -> str:
    """Median move seconds per system and size (min-max over the repeats), and ratios of medians."""
    def moves(system, size):
        return [r["move_s"] for r in results if r["system"] == system and r["size_gib"] == size and "move_s" in r]

    def checks_ok(system, size):
        return all(r.get("check", {}).get("ok") for r in results
                   if r["system"] == system and r["size_gib"] == size)

    def median(system, size):
        m = moves(system, size)
        return statistics.median(m) if m else None

    ratios = [s for s in ("sluice-tiered", "sluice-local") if s in systems and "kafka" in systems]
    head = ["size GiB"] + [f"{s} s" for s in systems] + [f"{s} / kafka" for s in ratios]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for size in sizes:
        row = [f"{size:g}"]
        for s in systems:
            m = moves(s, size)
            if not m:
                row.append("failed" if any(r["system"] == s and r["size_gib"] == size for r in results) else "-")
                continue
            cell = f"{statistics.median(m):.2f}"
            if len(m) > 1:
                cell += f" ({min(m):.2f}-{max(m):.2f})"
            if not checks_ok(s, size):
                cell += " (check failed)"
            row.append(cell)
        for s in ratios:
            a, k = median(s, size), median("kafka", size)
            row.append(f"{a / k:.3f}" if a is not None and k else "-")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="0.5,1,2", help="partition sizes in GiB, comma separated")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--output", type=Path, help="write the results as JSON here")
    parser.add_argument("--s3", action="store_true", help="Sluice's object store: s3s-fs (scripts/s3_server.sh)")
    parser.add_argument("--work-dir", type=Path, default=REPO / "target" / "reassign-time")
    parser.add_argument("--keep", action="store_true", help="keep each run's data")
    parser.add_argument("--repeats", type=int, default=1, help="runs per system and size (the table: medians)")
    args = parser.parse_args()
    sizes = [float(s) for s in args.sizes.split(",")]
    systems = [s.strip() for s in args.systems.split(",")]
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        parser.error(f"unknown systems {sorted(unknown)}; known: {', '.join(SYSTEMS)}")
    conftest.START_TIMEOUT_S = 120.0

    results = []
    meta = {"date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "command": " ".join(sys.argv),
            "host": platform.node(), "cpus": os.cpu_count(), "sluice_bin": conftest.SLUICE_BIN,
            "sluice_bin_mtime": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(os.stat(conftest.SLUICE_BIN).st_mtime)),
            "settle_s": SETTLE_S,
            "kafka": KAFKA_VERSION, "record_bytes": RECORD_BYTES, "segment_bytes": SEGMENT_BYTES,
            "local_retention_bytes": LOCAL_RETENTION_BYTES, "load_mib_s": LOAD_MIB_S,
            "source_replicas": SOURCE, "target_replicas": TARGET,
            "object_store": "s3s-fs" if args.s3 else "file://", "sluice_args": SLUICE_ARGS}
    try:
        meta["sluice_commit"] = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                               capture_output=True, text=True).stdout.strip()
    except OSError:
        pass

    def save():
        if args.output:
            args.output.parent.mkdir(parents=True, exist_ok=True)
            args.output.write_text(json.dumps({"meta": meta, "runs": results}, indent=2) + "\n")

    # Repeats outermost, systems innermost: the systems alternate, so a slow phase of the
    # machine falls on all of them.
    for repeat in range(args.repeats):
        for size in sizes:
            for system in systems:
                work = args.work_dir / f"{system}-{size:g}g-{repeat}"
                shutil.rmtree(work, ignore_errors=True)
                work.mkdir(parents=True)
                try:
                    results.append({"repeat": repeat, **run_one(system, size, work, args.s3)})
                finally:
                    if not args.keep:
                        shutil.rmtree(work, ignore_errors=True)
                save()
    print()
    print(table(results, sizes, systems))


if __name__ == "__main__":
    main()
