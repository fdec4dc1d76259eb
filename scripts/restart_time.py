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
With --kafka the same run is made against Apache Kafka 4.3.1 (tests/kafka-tools installs
it) for the side-by-side figure. Needs SLUICE_BIN (or a release build).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))

from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

import conftest  # noqa: E402
from conftest import Broker  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RECORD_BYTES = 1024
SAMPLED_PARTITIONS = 200
TOPIC = "restart-time"
READY_TIMEOUT_S = 600.0


def fill(bootstrap: str, partitions: int, gib: float) -> dict[int, int]:
    """Writes gib GiB round-robin over the partitions; returns the acknowledged end of each."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, partitions, 1)])[TOPIC].result(timeout=120)
    producer = Producer({
        "bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 50, "batch.size": 1 << 20,
        "queue.buffering.max.kbytes": 1 << 20, "queue.buffering.max.messages": 1_000_000,
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
    args = parser.parse_args()
    # Recovery is what is measured here: let it take as long as it takes.
    conftest.START_TIMEOUT_S = READY_TIMEOUT_S

    shutil.rmtree(args.data_dir, ignore_errors=True)
    args.data_dir.mkdir(parents=True)
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
        print(f"restart after SIGKILL, {args.partitions} partitions, {args.gib} GiB, {cache} page cache: "
              f"listening after {listening:.2f} s, serving every sampled log end after {serving:.2f} s")
    finally:
        broker.kill()
        if not args.keep:
            shutil.rmtree(args.data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
