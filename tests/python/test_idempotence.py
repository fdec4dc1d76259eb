"""Idempotent produce at the wire level: a retried batch (same producer id, epoch and sequence)
is acknowledged with its original offset and not written twice, a sequence gap is refused with
OUT_OF_ORDER_SEQUENCE_NUMBER, and the producer state survives both a clean restart and kill -9."""

import time
import uuid

import kafka_wire as kw
from kafka_wire import Conn, Record, consume_until, create_topic, record_batch, watermarks


def init_producer_id(c: Conn) -> tuple[int, int, int]:
    """InitProducerId, retried on the retriable coordinator errors (14, 15) as clients do."""
    deadline = time.monotonic() + 30
    while True:
        err, pid, epoch = c.init_producer_id()
        if err not in (14, 15) or time.monotonic() > deadline:
            return err, pid, epoch
        time.sleep(0.2)


def batch(pid: int, epoch: int, seq: int, n: int, tag: str) -> bytes:
    return record_batch([Record(b"%s-%d" % (tag.encode(), seq + i), b"k") for i in range(n)],
                        producer_id=pid, producer_epoch=epoch, base_sequence=seq)


def test_duplicates_and_gaps(broker):
    topic = f"idem-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, 1)
    with Conn.to(broker.bootstrap) as c:
        err, pid, epoch = init_producer_id(c)
        assert err == 0 and pid >= 0 and epoch >= 0, (err, pid, epoch)
        err2, pid2, _ = init_producer_id(c)
        assert err2 == 0 and pid2 != pid, "each InitProducerId hands out a new producer id"

        first = batch(pid, epoch, 0, 3, "a")
        assert c.produce(topic, 0, first)[:2] == (0, 0)
        # The same batch again (a retry after a lost response): original offset, no new records.
        assert c.produce(topic, 0, first)[:2] == (0, 0)
        assert watermarks(broker.bootstrap, topic, 0) == (0, 3)

        second = batch(pid, epoch, 3, 2, "b")
        assert c.produce(topic, 0, second)[:2] == (0, 3)
        # An older (but still remembered) batch retried after a newer one: still its original offset.
        assert c.produce(topic, 0, first)[:2] == (0, 0)
        assert c.produce(topic, 0, second)[:2] == (0, 3)

        # A gap: sequence 10 when 5 is expected.
        err, _, _, _ = c.produce(topic, 0, batch(pid, epoch, 10, 1, "gap"))
        assert err == kw.OUT_OF_ORDER_SEQUENCE_NUMBER, f"sequence gap: error {err}"
        assert watermarks(broker.bootstrap, topic, 0) == (0, 5)

        # Another producer id on the same partition is independent.
        assert c.produce(topic, 0, batch(pid2, 0, 0, 1, "other"))[:2] == (0, 5)

    got = consume_until(broker.bootstrap, topic, {0: 6})
    assert [m.value() for m in got[0]] == [b"a-0", b"a-1", b"a-2", b"b-3", b"b-4", b"other-0"]


def test_producer_state_survives_restarts(broker):
    topic = f"idem-restart-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, 2)
    with Conn.to(broker.bootstrap) as c:
        err, pid, epoch = init_producer_id(c)
        assert err == 0
        b0 = batch(pid, epoch, 0, 4, "p0")
        b1 = batch(pid, epoch, 4, 4, "p0")
        assert c.produce(topic, 0, b0)[:2] == (0, 0)
        assert c.produce(topic, 0, b1)[:2] == (0, 4)
        assert c.produce(topic, 1, batch(pid, epoch, 0, 1, "p1"))[:2] == (0, 0)

    broker.restart()  # clean
    with Conn.to(broker.bootstrap) as c:
        assert c.produce(topic, 0, b1)[:2] == (0, 4), "retry after a clean restart must not be appended again"
        b2 = batch(pid, epoch, 8, 2, "p0")
        assert c.produce(topic, 0, b2)[:2] == (0, 8)

    broker.kill()  # crash
    broker.start()
    with Conn.to(broker.bootstrap) as c:
        assert c.produce(topic, 0, b2)[:2] == (0, 8), "retry after kill -9 must not be appended again"
        err, _, _, _ = c.produce(topic, 0, batch(pid, epoch, 20, 1, "gap"))
        assert err == kw.OUT_OF_ORDER_SEQUENCE_NUMBER, f"sequence gap after restart: error {err}"
        assert c.produce(topic, 0, batch(pid, epoch, 10, 1, "p0"))[:2] == (0, 10)
        # Partition 1 has its own sequence.
        assert c.produce(topic, 1, batch(pid, epoch, 1, 1, "p1"))[:2] == (0, 1)

    assert watermarks(broker.bootstrap, topic, 0) == (0, 11)
    got = consume_until(broker.bootstrap, topic, {0: 11, 1: 2})
    assert [m.value() for m in got[0]] == [b"p0-%d" % i for i in range(11)]
    assert [m.value() for m in got[1]] == [b"p1-0", b"p1-1"]
