"""Durability settings and clean shutdown: a page-cache-mode topic (flush.messages) accepts and
serves writes; SIGTERM/SIGINT stop the broker cleanly and every record, offset and the log end
offset survive the restart."""

import signal
import time
import uuid

from confluent_kafka import Producer
from confluent_kafka.admin import ConfigResource, ResourceType

from kafka_wire import admin_client, consume_until, create_topic, watermarks


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def produce_numbered(bootstrap: str, topic: str, partitions: int, start: int, count: int) -> dict[int, tuple[int, int]]:
    """Produces records start..start+count-1 (record n to partition n % partitions); returns n -> (partition, offset)."""
    p = Producer({"bootstrap.servers": bootstrap, "broker.address.family": "v4", "acks": "all", "linger.ms": 5,
                  "enable.idempotence": True, "queue.buffering.max.messages": 200_000})
    acked, errors = {}, []

    def cb(err, msg):
        if err is not None:
            errors.append(err)
        else:
            acked[int(msg.key())] = (msg.partition(), msg.offset())

    for n in range(start, start + count):
        while True:
            try:
                p.produce(topic, partition=n % partitions, key=b"%d" % n, value=b"record-%d" % n,
                          headers=[("n", b"%d" % n)], timestamp=1_700_000_000_000 + n, on_delivery=cb)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(60) == 0
    assert not errors, f"{len(errors)} delivery errors: {errors[:3]}"
    assert len(acked) == count
    return acked


def check_all(bootstrap: str, topic: str, partitions: int, acked: dict[int, tuple[int, int]]) -> None:
    ends = {p: 0 for p in range(partitions)}
    for part, off in acked.values():
        ends[part] = max(ends[part], off + 1)
    for part in range(partitions):
        assert watermarks(bootstrap, topic, part, timeout=20) == (0, ends[part]), f"p{part} watermarks"
    got = consume_until(bootstrap, topic, ends)
    where = {v: n for n, v in acked.items()}
    for part, msgs in got.items():
        assert [m.offset() for m in msgs] == list(range(ends[part])), f"p{part}: offsets not dense"
        for m in msgs:
            n = where[(part, m.offset())]
            assert m.key() == b"%d" % n and m.value() == b"record-%d" % n, f"p{part}@{m.offset()}: wrong record"
            assert m.headers() == [("n", b"%d" % n)]
            assert m.timestamp()[1] == 1_700_000_000_000 + n


def test_page_cache_mode_topic(broker):
    topic = unique("pagecache")
    create_topic(broker.bootstrap, topic, 2, {"flush.messages": "10000", "flush.ms": "1000"})
    a = admin_client(broker.bootstrap)
    res = ConfigResource(ResourceType.TOPIC, topic)
    cfg = a.describe_configs([res], request_timeout=10)[res].result(10)
    assert cfg["flush.messages"].value == "10000"
    assert cfg["flush.ms"].value == "1000"

    acked = produce_numbered(broker.bootstrap, topic, 2, 0, 30_000)
    check_all(broker.bootstrap, topic, 2, acked)

    # A clean restart flushes what was only in the page cache.
    assert broker.stop() == 0
    broker.start()
    check_all(broker.bootstrap, topic, 2, acked)


def test_sigterm_restart_keeps_data_and_log_end(broker):
    topic = unique("restart")
    create_topic(broker.bootstrap, topic, 3)
    acked = {}
    for round_ in range(3):  # several produce rounds: several batches per partition
        acked.update(produce_numbered(broker.bootstrap, topic, 3, round_ * 5000, 5000))
    ends_before = [watermarks(broker.bootstrap, topic, p) for p in range(3)]

    t0 = time.monotonic()
    code = broker.stop(timeout=20)
    stop_s = time.monotonic() - t0
    assert code == 0, f"SIGTERM exit code {code}; log:\n{broker.log()[-3000:]}"
    assert stop_s < 10, f"clean shutdown took {stop_s:.1f}s"

    broker.start()
    ends_after = [watermarks(broker.bootstrap, topic, p, timeout=20) for p in range(3)]
    assert ends_after == ends_before, "log end offsets changed across a clean restart"
    check_all(broker.bootstrap, topic, 3, acked)

    # New writes continue right after the old log end.
    more = produce_numbered(broker.bootstrap, topic, 3, 15_000, 30)
    for n, (part, off) in more.items():
        assert off >= ends_before[part][1]
    acked.update(more)
    check_all(broker.bootstrap, topic, 3, acked)

    # A second restart with nothing written in between changes nothing either.
    ends_before = [watermarks(broker.bootstrap, topic, p) for p in range(3)]
    broker.restart()
    assert [watermarks(broker.bootstrap, topic, p, timeout=20) for p in range(3)] == ends_before
    check_all(broker.bootstrap, topic, 3, acked)


def test_sigint_is_a_clean_shutdown(broker):
    topic = unique("sigint")
    create_topic(broker.bootstrap, topic, 1)
    acked = produce_numbered(broker.bootstrap, topic, 1, 0, 1000)
    broker.proc.send_signal(signal.SIGINT)
    code = broker.proc.wait(timeout=20)
    assert code == 0, f"SIGINT exit code {code}"
    broker.start()
    check_all(broker.bootstrap, topic, 1, acked)
