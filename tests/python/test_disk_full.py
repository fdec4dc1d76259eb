"""Disk full: the data dir lives on a 64 MiB tmpfs. Producing until the disk is full must give
KAFKA_STORAGE_ERROR (56), keep every acknowledged record readable, and recover by itself
(no restart) once space is freed."""

import os
import random
import subprocess
import time
import uuid

import pytest
from confluent_kafka import KafkaError, Producer

from kafka_wire import KAFKA_STORAGE_ERROR, consume_until, create_topic, watermarks

TMPFS_MIB = 64
FILLER_MIB = 16
RECORD_BYTES = 8192


@pytest.fixture
def small_tmpfs(tmp_path):
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_MIB}m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"could not mount a {TMPFS_MIB} MiB tmpfs at {mnt} (the test needs root / CAP_SYS_ADMIN): "
                    f"exit {r.returncode}: {r.stderr.strip()}")
    yield mnt
    r = subprocess.run(["umount", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def value_of(n: int) -> bytes:
    # Incompressible and reproducible.
    return b"%08d" % n + random.Random(n).randbytes(RECORD_BYTES - 8)


class Sender:
    def __init__(self, bootstrap: str, topic: str):
        self.topic = topic
        self.n = 0
        self.acked: dict[int, int] = {}  # n -> offset
        self.failed: dict[int, KafkaError] = {}
        self.producer = Producer({
            "bootstrap.servers": bootstrap,
            "broker.address.family": "v4",
            "acks": "all",
            "linger.ms": 2,
            "message.send.max.retries": 0,  # let the broker's error reach us
            "message.timeout.ms": 15000,
            "compression.type": "none",
        })

    def _cb(self, err, msg):
        n = int(msg.value()[:8])
        if err is None:
            self.acked[n] = msg.offset()
        else:
            self.failed[n] = err

    def send(self, count: int) -> list[int]:
        ids = list(range(self.n, self.n + count))
        for n in ids:
            self.producer.produce(self.topic, partition=0, value=value_of(n), on_delivery=self._cb)
        self.n += count
        assert self.producer.flush(30) == 0, "deliveries still pending after 30 s: the broker stopped answering"
        return ids


def test_disk_full_then_recovers(small_tmpfs, broker_factory, tmp_path):
    data_dir = small_tmpfs / "data"
    data_dir.mkdir()
    filler = small_tmpfs / "filler"
    with open(filler, "wb") as f:
        for _ in range(FILLER_MIB):
            f.write(b"\xa5" * (1 << 20))
    # The broker log goes to data_dir.parent, so point the broker at a link outside the tmpfs.
    link = tmp_path / "sluice-data"
    link.symlink_to(data_dir)
    b = broker_factory(data_dir=link, extra_args=["--segment-bytes", str(1 << 20)])
    pid = b.proc.pid
    topic = f"full-{uuid.uuid4().hex[:8]}"
    create_topic(b.bootstrap, topic, 1, {"segment.bytes": str(1 << 20)})

    s = Sender(b.bootstrap, topic)
    limit_records = (TMPFS_MIB << 20) // RECORD_BYTES + 1000
    while not s.failed:
        assert s.n < limit_records, f"{s.n * RECORD_BYTES >> 20} MiB acknowledged on a {TMPFS_MIB} MiB tmpfs without an error"
        s.send(64)
    codes = {err.code() for err in s.failed.values()}
    assert codes == {KafkaError.KAFKA_STORAGE_ERROR}, f"produce on a full disk failed with {[KafkaError(c).name() for c in codes]}"
    assert KafkaError.KAFKA_STORAGE_ERROR == KAFKA_STORAGE_ERROR
    full_at = len(s.acked)
    st = os.statvfs(small_tmpfs)
    free_mib = st.f_bavail * st.f_frsize / (1 << 20)
    assert free_mib < 8, (
        f"KAFKA_STORAGE_ERROR after {full_at * RECORD_BYTES >> 20} MiB acknowledged while {free_mib:.1f} MiB of the "
        f"{TMPFS_MIB} MiB tmpfs were still free (1 MiB segments): produce refused on a disk that is not full")

    # A refused batch may leave room for smaller ones: the broker takes every batch that
    # fits. Fill the rest one record at a time until a single record is refused too.
    for _ in range(2000):
        failed_before = len(s.failed)
        s.send(1)
        if len(s.failed) > failed_before:
            break
    else:
        raise AssertionError("single records kept being accepted on a disk reported full")
    full_at = len(s.acked)
    # Now truly full: still refused, promptly, and nothing more is acknowledged.
    s.send(8)
    assert len(s.acked) == full_at, "records were acknowledged while the disk was still full"
    assert b.is_running() and b.proc.pid == pid

    # Everything acknowledged is there, at its offset; nothing refused is visible.
    assert sorted(s.acked.values()) == list(range(full_at)), "acknowledged offsets are not 0..n-1"
    assert watermarks(b.bootstrap, topic, 0) == (0, full_at), "refused records are visible"
    got = consume_until(b.bootstrap, topic, {0: full_at}, timeout=120)[0]
    by_offset = {off: n for n, off in s.acked.items()}
    for m in got:
        n = by_offset[m.offset()]
        assert m.value() == value_of(n), f"offset {m.offset()}: record {n} damaged"

    # Free space; the same broker process accepts writes again.
    filler.unlink()
    deadline = time.monotonic() + 30
    while True:
        before = len(s.acked)
        s.send(1)
        if len(s.acked) > before:
            break
        assert time.monotonic() < deadline, (
            f"produce still failing 30 s after freeing {FILLER_MIB} MiB: "
            f"{[e.name() for e in list(s.failed.values())[-3:]]}")
        time.sleep(0.5)
    failed_before = len(s.failed)
    s.send(200)  # ~1.6 MiB more
    assert len(s.failed) == failed_before, f"errors after recovery: {list(s.failed.values())[failed_before:][:3]}"
    assert b.is_running() and b.proc.pid == pid, "the broker restarted"

    total = len(s.acked)
    assert watermarks(b.bootstrap, topic, 0) == (0, total)
    got = consume_until(b.bootstrap, topic, {0: total}, timeout=120)[0]
    assert [m.offset() for m in got] == list(range(total))
    by_offset = {off: n for n, off in s.acked.items()}
    for m in got:
        assert m.value() == value_of(by_offset[m.offset()]), f"offset {m.offset()} damaged"
    # Acknowledged order is send order.
    assert [by_offset[o] for o in range(total)] == sorted(s.acked)
    assert "panicked" not in b.log()
