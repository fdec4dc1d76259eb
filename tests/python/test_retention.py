"""Retention by time and by size: with 1 MiB segments, closed segments past retention.ms or
beyond retention.bytes are deleted by the broker on its own, the log start offset moves
forward, and what remains reads back intact."""

import time
import uuid

from confluent_kafka import Producer

from kafka_wire import consume_until, create_topic, watermarks

RECORD_BYTES = 10_000
SEGMENT_BYTES = 1 << 20


def produce(bootstrap: str, topic: str, start: int, count: int, timestamp_ms: int | None) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "broker.address.family": "v4", "acks": "all", "linger.ms": 5,
                  "compression.type": "none"})
    errs = []
    for n in range(start, start + count):
        kwargs = {"timestamp": timestamp_ms} if timestamp_ms is not None else {}
        p.produce(topic, partition=0, key=b"%d" % n, value=b"%08d" % n + b"r" * (RECORD_BYTES - 8),
                  on_delivery=lambda err, msg: errs.append(err), **kwargs)
    assert p.flush(60) == 0
    assert errs == [None] * count, [e for e in errs if e][:3]


def wait_log_start_settles(bootstrap: str, topic: str, timeout: float = 20.0) -> tuple[int, int]:
    """Waits until the log start offset has moved and then stayed put for 1.5 s (deletion done)."""
    deadline = time.monotonic() + timeout
    last, since = None, time.monotonic()
    while True:
        low, high = watermarks(bootstrap, topic, 0)
        if (low, high) != last:
            last, since = (low, high), time.monotonic()
        elif low > 0 and time.monotonic() - since >= 1.5:
            return low, high
        if time.monotonic() > deadline:
            return low, high
        time.sleep(0.1)


def check_tail(bootstrap: str, topic: str, low: int, high: int) -> None:
    got = consume_until(bootstrap, topic, {0: high})[0]
    assert [m.offset() for m in got] == list(range(low, high)), "the retained tail is not dense"
    for m in got:
        assert m.key() == b"%d" % m.offset() and m.value()[:8] == b"%08d" % m.offset()


def test_retention_ms(broker_factory):
    b = broker_factory(extra_args=["--log-retention-check-interval-ms", "200"])
    topic = f"ret-ms-{uuid.uuid4().hex[:8]}"
    create_topic(b.bootstrap, topic, 1, {"segment.bytes": str(SEGMENT_BYTES), "retention.ms": "60000"})
    old = int(time.time() * 1000) - 3_600_000
    produce(b.bootstrap, topic, 0, 400, old)  # ~4 MiB an hour old: several closed segments
    produce(b.bootstrap, topic, 400, 10, None)  # fresh records in the active segment

    low, high = wait_log_start_settles(b.bootstrap, topic)
    assert high == 410
    assert low > 0, "no segment was deleted 20 s after its records passed retention.ms"
    assert low <= 400, f"log start {low}: fresh records (offsets 400..409) were deleted"
    check_tail(b.bootstrap, topic, low, high)


def test_retention_bytes(broker_factory):
    b = broker_factory(extra_args=["--log-retention-check-interval-ms", "200"])
    topic = f"ret-bytes-{uuid.uuid4().hex[:8]}"
    retention = 2 * SEGMENT_BYTES
    create_topic(b.bootstrap, topic, 1, {"segment.bytes": str(SEGMENT_BYTES), "retention.bytes": str(retention)})
    produce(b.bootstrap, topic, 0, 600, None)  # ~6 MiB

    low, high = wait_log_start_settles(b.bootstrap, topic)
    assert high == 600
    assert low > 0, "no segment was deleted 20 s after the partition exceeded retention.bytes"
    # The kept size is at least retention.bytes minus a segment and at most retention.bytes
    # plus the active segment.
    kept_bytes = (high - low) * RECORD_BYTES
    assert retention - SEGMENT_BYTES <= kept_bytes <= retention + SEGMENT_BYTES + 64 * 1024, (
        f"kept {kept_bytes} bytes ({high - low} records) with retention.bytes={retention}")
    check_tail(b.bootstrap, topic, low, high)
