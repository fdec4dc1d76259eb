"""Reads of data that is not in the page cache (a consumer catching up on a cold backlog):
the broker first tries the page cache only and redoes such a fetch on its blocking pool
(handlers/fetch.rs); the consumer must get every record, in order, undamaged, and a
producer keeps being answered meanwhile."""

import os
import uuid

from confluent_kafka import Producer

from kafka_wire import consume_until, create_topic, watermarks


def evict_from_page_cache(data_dir) -> int:
    """Drops the clean cached pages of every log segment (they were fsynced): the next
    read of them has to go to the disk. Returns the number of files."""
    files = 0
    for root, _, names in os.walk(data_dir):
        for name in names:
            if name.endswith(".log"):
                fd = os.open(os.path.join(root, name), os.O_RDONLY)
                try:
                    os.fsync(fd)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
                files += 1
    return files


def test_cold_backlog_reads_back_exactly_while_producers_are_answered(broker):
    topic = f"cold-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, 2)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 5})
    values = {p: [b"%d-%d-" % (p, i) + os.urandom(200) for i in range(5000)] for p in range(2)}
    for p, batch in values.items():
        for value in batch:
            producer.produce(topic, value=value, partition=p)
            producer.poll(0)
    assert producer.flush(60) == 0
    assert evict_from_page_cache(broker.data_dir) >= 2

    ends = {p: watermarks(broker.bootstrap, topic, p)[1] for p in range(2)}
    assert ends == {0: 5000, 1: 5000}
    read = consume_until(broker.bootstrap, topic, ends, timeout=60)
    for p in range(2):
        assert [m.value() for m in read[p]] == values[p], f"partition {p} read back differently"
        assert [m.offset() for m in read[p]] == list(range(5000))

    # The broker still answers producers after serving cold reads.
    producer.produce(topic, value=b"after", partition=0)
    assert producer.flush(30) == 0
    assert watermarks(broker.bootstrap, topic, 0)[1] == 5001
