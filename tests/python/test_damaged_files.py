"""A restart with damaged files beside the logs: what a power cut (or a disk) can leave of
the files a restart reads besides the segments themselves.

- Side files that only speed recovery or describe the log (segment indexes, producer
  snapshots, the leader-epoch file, the log-start, cleaner and high-watermark checkpoints,
  the aborted-transactions file), each emptied, cut in half or overwritten with garbage:
  the broker comes back, every acknowledged record is read back at its offset, and an
  idempotent producer goes on.
- A damaged file the broker cannot rebuild (the topic registry): the broker exits at once
  with an error that names the file, instead of panicking or hanging.
"""

import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer

from conftest import Broker
from kafka_wire import consume_until, create_topic, watermarks

PARTITIONS = 2
RECORDS = 3000
# Small segments: a partition has many, each with its index and a producer snapshot.
SEGMENT_BYTES = 16 * 1024
RESTART_LIMIT_S = 15.0
SIDE_FILE_NAMES = ("leader-epochs", "log-start-offset", "cleaner-offset", "aborted-transactions",
                   "replication-offset-checkpoint", "topic-id")
SIDE_FILE_SUFFIXES = (".index", ".snapshot")


def produce(bootstrap: str, topic: str, count: int, prefix: str) -> dict[tuple[int, int], bytes]:
    acked: dict[tuple[int, int], bytes] = {}
    errors = []

    def on_delivery(err, msg):
        if err is not None:
            errors.append(err)
        else:
            acked[(msg.partition(), msg.offset())] = msg.value()

    # Small batches, so that the segments roll many times.
    producer = Producer({"bootstrap.servers": bootstrap, "broker.address.family": "v4", "acks": "all",
                         "enable.idempotence": True, "linger.ms": 2, "batch.size": 4096})
    for i in range(count):
        producer.produce(topic, partition=i % PARTITIONS, value=f"{prefix}-{i}".encode() * 8, on_delivery=on_delivery)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert not errors, errors[:3]
    return acked


def side_files(data_dir: Path) -> list[Path]:
    return sorted(p for p in (data_dir / "logs").rglob("*")
                  if p.is_file() and (p.name in SIDE_FILE_NAMES or p.suffix in SIDE_FILE_SUFFIXES))


def damage(path: Path, how: str) -> None:
    body = path.read_bytes()
    if how == "empty":
        path.write_bytes(b"")
    elif how == "half":
        path.write_bytes(body[: len(body) // 2])
    else:
        path.write_bytes(bytes((b * 7 + 13) % 256 for b in body) or b"\xff" * 64)


def read_all(bootstrap: str, topic: str) -> dict[tuple[int, int], bytes]:
    ends = {p: watermarks(bootstrap, topic, p, timeout=30)[1] for p in range(PARTITIONS)}
    read = consume_until(bootstrap, topic, ends, timeout=60)
    return {(p, m.offset()): m.value() for p, msgs in read.items() for m in msgs}


@pytest.mark.parametrize("how", ["empty", "half", "garbage"])
@pytest.mark.parametrize("stop", ["clean", "kill"])
def test_damaged_side_files_are_rebuilt_from_the_log(tmp_path, how, stop):
    broker = Broker(tmp_path / "data", log_dir=tmp_path).start()
    try:
        topic = f"damaged-{uuid.uuid4().hex[:8]}"
        create_topic(broker.bootstrap, topic, PARTITIONS, config={"segment.bytes": str(SEGMENT_BYTES)})
        acked = produce(broker.bootstrap, topic, RECORDS, "before")
        broker.stop() if stop == "clean" else broker.kill()
        files = side_files(broker.data_dir)
        kinds = {p.suffix or p.name for p in files}
        assert {".index", ".snapshot", "leader-epochs"} <= kinds, f"the test damages too little: {kinds}"
        for path in files:
            damage(path, how)
        started = time.monotonic()
        broker.start()
        took = time.monotonic() - started
        assert took < RESTART_LIMIT_S, f"restart with damaged {sorted(kinds)} took {took:.1f} s"
        found = read_all(broker.bootstrap, topic)
        lost = [key for key, value in acked.items() if found.get(key) != value]
        assert not lost, f"{len(lost)} acknowledged records lost after damaging {sorted(kinds)} ({how}), e.g. {lost[:3]}"
        assert len(found) == len(acked), "records appeared that were never acknowledged"
        more = produce(broker.bootstrap, topic, 200, "after")
        assert len(read_all(broker.bootstrap, topic)) == len(acked) + len(more)
    finally:
        broker.kill()


def test_a_damaged_topic_registry_stops_the_broker_with_the_file_named(tmp_path):
    broker = Broker(tmp_path / "data", log_dir=tmp_path).start()
    create_topic(broker.bootstrap, "registered", 1)
    broker.stop()
    registry = tmp_path / "data" / "meta" / "cluster.json"
    assert registry.exists(), sorted(str(p) for p in (tmp_path / "data").rglob("*.json"))
    registry.write_bytes(b"{\"topics\": [garbage")
    with pytest.raises(RuntimeError) as exited:
        broker.start()
    message = str(exited.value)
    assert "broker exited" in message and "cluster.json" in message, message[-2000:]
    assert "panicked" not in message, message[-2000:]
