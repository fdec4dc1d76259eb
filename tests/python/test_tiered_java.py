"""The official Java consumer (kafka-clients 4.3.1) reads a tiered topic (KIP-405,
remote.storage.enable=true) back from offset 0, most of it from the object store, byte for
byte, before and after a kill -9 of the broker.

The checks live in tests/java/src/main/java/sluice/tests/TieredReader.java; a run exits
non-zero with "FAIL: <what differed>" on the first mismatch.
"""

import uuid

from java_support import java_cp, run_java  # noqa: F401  (java_cp is a fixture)
from kafka_wire import ConnectionClosed, create_topic
from test_tiered_storage import (
    FAST, LOCAL_RETENTION_BYTES, SEGMENT_BYTES, local_bytes, local_start, produce, wait_until,
)

PARTITIONS = 2
RECORDS = 3000


def read_all(java_cp, b, topic: str, what: str) -> None:
    res = run_java(java_cp, "sluice.tests.TieredReader",
                   ["--bootstrap", b.bootstrap, "--topic", topic, "--partitions", PARTITIONS, "--records", RECORDS],
                   timeout=180)
    assert res.returncode == 0 and "PASS tiered" in res.stdout, (
        f"TieredReader {what} failed\n{res.report()}\n--- broker log (tail) ---\n{b.log()[-6000:]}")
    assert f"consumed and verified {PARTITIONS * RECORDS} records" in res.stdout, res.report()
    assert b.is_running(), f"broker died\n{b.log()[-6000:]}"


def test_java_consumer_reads_a_tiered_topic_from_offset_0(broker_factory, java_cp):
    """2 partitions x 3000 records of 10 kB (~30 MB each) with 2 MiB of local retention: once
    the local log starts past offset 1500 and keeps at most 4 MiB of segments, the Java
    consumer (assign + seekToBeginning, auto.offset.reset=none) sees beginningOffsets 0 and
    endOffsets 3000 and reads every offset 0..2999 of both partitions, dense and identical,
    through the remote tier; again after a kill -9 and restart."""
    b = broker_factory(extra_args=FAST)
    topic = f"tiered-java-{uuid.uuid4().hex[:8]}"
    create_topic(b.bootstrap, topic, PARTITIONS, {"remote.storage.enable": "true",
                                                   "segment.bytes": str(SEGMENT_BYTES),
                                                   "local.retention.bytes": str(LOCAL_RETENTION_BYTES)})
    produce(b.bootstrap, topic, PARTITIONS, 0, RECORDS)

    def shrunk(p):
        return (local_start(b.bootstrap, topic, p) > RECORDS // 2
                and local_bytes(b.data_dir, topic, p) <= LOCAL_RETENTION_BYTES + 2 * SEGMENT_BYTES)

    for p in range(PARTITIONS):
        wait_until(f"partition {p}'s local log to start past {RECORDS // 2} and hold <= 4 MiB", lambda: shrunk(p))
    read_all(java_cp, b, topic, "before the kill -9")

    b.kill()
    b.start()
    for p in range(PARTITIONS):
        (start,) = wait_until(f"partition {p} to answer ListOffsets after the restart",
                              lambda: _try_local_start(b.bootstrap, topic, p), timeout=30)
        assert start > RECORDS // 2, f"partition {p}: local log start {start} after the restart"
    read_all(java_cp, b, topic, "after the kill -9")


def _try_local_start(bootstrap: str, topic: str, partition: int) -> tuple[int] | None:
    """(local log start,), or None while the restarted broker does not answer it yet."""
    try:
        return (local_start(bootstrap, topic, partition),)
    except (AssertionError, OSError, ConnectionClosed):
        return None
