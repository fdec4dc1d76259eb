#!/usr/bin/env python3
"""Restart time of a broker killed with SIGKILL while holding many partitions and much data.

Fills one topic of --partitions partitions with --gib GiB of 1 KiB records (librdkafka,
acks=all), kills the broker with SIGKILL, optionally drops the page cache (--cold), starts
it again and measures:
  - listening: from the start of the process until its port accepts a connection;
  - serving:   until a consumer has read back the last record of every sampled partition
               (the recovered log end equals what was acknowledged before the kill).

    .venv/bin/python scripts/restart_time.py [--partitions 10000] [--gib 10] [--cold]
        [--data-dir DIR] [--kafka]

The data directory must be on a real disk (default: a fresh directory under ./target).
With --kafka the same run is made against Apache Kafka 4.3.1 at its defaults, single node
KRaft, from the jars `sluice bench` installs (run any `sluice bench compare --against
kafka` once first; ~/.cache/sluice-bench/kafka-4.3.1, or $SLUICE_BENCH_CACHE). Kafka's
controller refuses 10,000 partitions in one CreateTopics, so the topic grows in steps.
Needs SLUICE_BIN (or a release build).
"""

from __future__ import annotations

import argparse
import os
import socket
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))

from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic  # noqa: E402

import conftest  # noqa: E402
from conftest import Broker  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RECORD_BYTES = 1024
SAMPLED_PARTITIONS = 200
TOPIC = "restart-time"
READY_TIMEOUT_S = 600.0
KAFKA_VERSION = "4.3.1"
# Partitions per CreateTopics / CreatePartitions step (Kafka's controller caps one batch).
CREATE_STEP = 1000


class KafkaBroker:
    """Apache Kafka, single node KRaft (broker and controller), on loopback ports."""

    def __init__(self, home: Path, work: Path):
        self.classpath = f"{home}/lib/*"
        self.work = work
        self.port, controller = conftest.free_port(), conftest.free_port()
        self.proc: subprocess.Popen | None = None
        self.properties = work / "server.properties"
        self.log_path = work / "kafka.log"
        self.properties.write_text(
            "process.roles=broker,controller\nnode.id=1\n"
            f"controller.quorum.voters=1@127.0.0.1:{controller}\n"
            f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{controller}\n"
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}\n"
            "controller.listener.names=CONTROLLER\ninter.broker.listener.name=PLAINTEXT\n"
            f"log.dirs={work / 'data'}\noffsets.topic.replication.factor=1\n"
            "transaction.state.log.replication.factor=1\ntransaction.state.log.min.isr=1\n"
            "share.coordinator.state.topic.replication.factor=1\nshare.coordinator.state.topic.min.isr=1\n"
            "group.initial.rebalance.delay.ms=0\n")
        cluster_id = self._tool("random-uuid").strip()
        self._tool("format", "-t", cluster_id, "-c", str(self.properties))

    def _tool(self, *args: str) -> str:
        return subprocess.run(["java", "-cp", self.classpath, "kafka.tools.StorageTool", *args],
                              check=True, capture_output=True, text=True).stdout

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            ["java", "-Xms1g", "-Xmx1g", "-XX:+UseG1GC", "-cp", self.classpath, "kafka.Kafka", str(self.properties)],
            stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"kafka exited; see {self.log_path}"
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"kafka did not listen within {READY_TIMEOUT_S} s")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def create_topic(bootstrap: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    first = min(partitions, CREATE_STEP)
    admin.create_topics([NewTopic(TOPIC, first, 1)])[TOPIC].result(timeout=120)
    for total in range(first + CREATE_STEP, partitions + CREATE_STEP, CREATE_STEP):
        total = min(total, partitions)
        admin.create_partitions([NewPartitions(TOPIC, total)])[TOPIC].result(timeout=120)
    deadline = time.monotonic() + 120
    while len(admin.list_topics(TOPIC, timeout=10).topics[TOPIC].partitions) < partitions:
        assert time.monotonic() < deadline, "the topic's partitions never all appeared"
        time.sleep(0.5)


def fill(bootstrap: str, partitions: int, gib: float) -> dict[int, int]:
    """Writes gib GiB round-robin over the partitions; returns the acknowledged end of each."""
    create_topic(bootstrap, partitions)
    producer = Producer({
        "bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 50, "batch.size": 1 << 20,
        "queue.buffering.max.kbytes": 1 << 20, "queue.buffering.max.messages": 1_000_000,
        # No delivery deadline: a broker slow to take 10 GiB over 10,000 partitions (Kafka
        # here) only makes the fill longer.
        "message.timeout.ms": 0,
    })
    ends = [0] * partitions
    failed = []

    def delivered(err, msg):
        if err is not None:
            failed.append(err)
        else:
            ends[msg.partition()] = max(ends[msg.partition()], msg.offset() + 1)

    payload = os.urandom(RECORD_BYTES)
    total = int(gib * (1 << 30) / RECORD_BYTES)
    started = time.monotonic()
    for i in range(total):
        while True:
            try:
                producer.produce(TOPIC, payload, partition=i % partitions, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(600) == 0, "records left unacknowledged"
    assert not failed, f"{len(failed)} deliveries failed, first: {failed[0]}"
    elapsed = time.monotonic() - started
    print(f"filled {total} records ({gib} GiB) in {elapsed:.1f} s ({gib * 1024 / elapsed:.0f} MiB/s)", flush=True)
    return dict(enumerate(ends))


def read_back_ends(bootstrap: str, sample: list[int], ends: dict[int, int], deadline: float) -> None:
    """Waits until each sampled partition reports its acknowledged end and serves its last record."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "restart-time", "enable.auto.commit": False})
    try:
        for partition in sample:
            while True:
                try:
                    low, high = consumer.get_watermark_offsets(TopicPartition(TOPIC, partition), timeout=5)
                    if high == ends[partition]:
                        break
                except Exception:  # noqa: BLE001 - not serving yet
                    pass
                assert time.monotonic() < deadline, f"partition {partition} not served in time"
                time.sleep(0.05)
        last = sample[-1]
        consumer.assign([TopicPartition(TOPIC, last, ends[last] - 1)])
        while True:
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                assert msg.offset() == ends[last] - 1 and len(msg.value()) == RECORD_BYTES
                return
            assert time.monotonic() < deadline, "last record not read back in time"
    finally:
        consumer.close()


def drop_caches() -> None:
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, default=10_000)
    parser.add_argument("--gib", type=float, default=10.0)
    parser.add_argument("--cold", action="store_true", help="drop the page cache before the restart")
    parser.add_argument("--data-dir", type=Path, default=REPO / "target" / "restart-time")
    parser.add_argument("--keep", action="store_true", help="keep the data directory afterwards")
    parser.add_argument("--broker-arg", action="append", default=[], help="extra `sluice serve` argument")
    parser.add_argument("--kafka", action="store_true", help=f"run Apache Kafka {KAFKA_VERSION} instead of Sluice")
    args = parser.parse_args()
    # Recovery is what is measured here: let it take as long as it takes.
    conftest.START_TIMEOUT_S = READY_TIMEOUT_S

    shutil.rmtree(args.data_dir, ignore_errors=True)
    args.data_dir.mkdir(parents=True)
    if args.kafka:
        cache = Path(os.environ.get("SLUICE_BENCH_CACHE", Path.home() / ".cache" / "sluice-bench"))
        broker = KafkaBroker(cache / f"kafka-{KAFKA_VERSION}", args.data_dir)
    else:
        broker = Broker(args.data_dir / "data", extra_args=args.broker_arg, log_dir=args.data_dir)
    broker.start()
    try:
        ends = fill(broker.bootstrap, args.partitions, args.gib)
        broker.kill()
        if args.cold:
            drop_caches()
        sample = sorted(random.Random(7).sample(range(args.partitions), min(SAMPLED_PARTITIONS, args.partitions)))
        started = time.monotonic()
        broker.start()
        listening = time.monotonic() - started
        read_back_ends(broker.bootstrap, sample, ends, started + READY_TIMEOUT_S)
        serving = time.monotonic() - started
        cache = "cold" if args.cold else "warm"
        name = f"Kafka {KAFKA_VERSION}" if args.kafka else "Sluice"
        print(f"{name}: restart after SIGKILL, {args.partitions} partitions, {args.gib} GiB, {cache} page cache: "
              f"listening after {listening:.2f} s, serving every sampled log end after {serving:.2f} s")
    finally:
        broker.kill()
        if not args.keep:
            shutil.rmtree(args.data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
