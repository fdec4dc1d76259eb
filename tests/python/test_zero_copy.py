"""Zero-copy fetches: a consumer catching up over a plaintext listener gets the stored
batches straight from the segment files' page cache (`sendfile`), byte for byte what it would
get otherwise; over TLS the same records are copied and encrypted. librdkafka checks every
batch's CRC (`check.crcs`) and the test checks every value and its order.

Both kinds of topic are read back: a page-cache topic (durability level 2), and a default
one, whose batches go through the partition's tail in memory (ARCHITECTURE.md) on their way
to the file."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import NewTopic

from conftest import free_port
from test_metrics import scrape, value
from test_security import start_secure_broker

RECORDS_PER_PARTITION = 2500
PARTITIONS = 2
VALUE_BYTES = 1000
SENDFILE_METRIC = "sluice_fetch_sendfile_bytes_total"


def record_value(partition: int, index: int) -> bytes:
    head = f"p{partition}-{index:06d}-".encode()
    return head + bytes((index + i) % 251 for i in range(VALUE_BYTES - len(head)))


def read_everything(conf: dict, topic: str) -> dict[int, list[bytes]]:
    """Every record of `topic` from the start, per partition, with CRCs checked."""
    consumer = Consumer(dict(conf, **{"group.id": f"reader-{time.monotonic_ns()}", "check.crcs": True,
                                      "enable.auto.commit": False, "max.partition.fetch.bytes": 1 << 20}))
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    got: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    deadline = time.monotonic() + 60
    while sum(map(len, got.values())) < PARTITIONS * RECORDS_PER_PARTITION and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is None:
            continue
        assert message.error() is None, message.error()
        got[message.partition()].append(message.value())
    consumer.close()
    return got


def test_a_catching_up_consumer_gets_the_stored_batches_from_the_file_on_plaintext_only(broker_factory, tmp_path):
    metrics_port = free_port()
    secure = start_secure_broker(broker_factory, tmp_path, "--metrics-listen", f"127.0.0.1:{metrics_port}")
    topic, fsynced = "backlog", "backlog-fsynced"
    plaintext = {"bootstrap.servers": secure.broker.bootstrap}
    admin = secure.admin()
    created = admin.create_topics([
        NewTopic(topic, num_partitions=PARTITIONS, config={"sluice.durability.level": "2"}),
        NewTopic(fsynced, num_partitions=PARTITIONS),
    ])
    for future in created.values():
        future.result(timeout=30)
    producer = Producer(dict(plaintext, **{"acks": "all", "linger.ms": 5}))
    for name in (topic, fsynced):
        for index in range(RECORDS_PER_PARTITION):
            for partition in range(PARTITIONS):
                producer.produce(name, record_value(partition, index), partition=partition)
            producer.poll(0)
    assert producer.flush(60) == 0
    expected = {p: [record_value(p, i) for i in range(RECORDS_PER_PARTITION)] for p in range(PARTITIONS)}
    stored_bytes = PARTITIONS * RECORDS_PER_PARTITION * VALUE_BYTES

    # Over TLS the records are copied into memory to be encrypted.
    assert read_everything(secure.client("SSL"), topic) == expected
    assert value(scrape(metrics_port), SENDFILE_METRIC) == 0

    # Over plaintext the same reads go from the page cache to the socket.
    assert read_everything(plaintext, topic) == expected
    sent = value(scrape(metrics_port), SENDFILE_METRIC)
    assert sent >= stored_bytes / 2, f"only {sent} of about {stored_bytes} bytes were sent from the files"

    # The fsync-per-write topic's backlog, from its tails and the files, over both listeners.
    assert read_everything(plaintext, fsynced) == expected
    assert read_everything(secure.client("SSL"), fsynced) == expected
