"""The queue workload: idempotent acks=all producers and polling consumers, recording a
history for the checker.

Producers write unique values `"<producer>-<seq>"` round-robin over the partitions (an
explicit partition per record, so each producer's order within a partition is known) and
record every acknowledged (partition, offset, value) with the time of the acknowledgement.
Consumers assign every partition from the beginning (no consumer group: group state is not
replicated yet) and record every (partition, offset, value) they poll, in poll order.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition

OUTSTANDING_MAX = 2000
"""Records a producer has in flight at most; beyond it, it waits for acknowledgements."""

MESSAGE_TIMEOUT_MS = 60_000
"""How long librdkafka retries one record; a record not acknowledged by then is indeterminate."""

FINAL_READ_TIMEOUT_S = 60.0

LIBRDKAFKA_LOG_LEVEL = 2
"""Only critical librdkafka messages: disconnections are what the nemesis causes."""


@dataclass(frozen=True)
class Ack:
    time: float
    partition: int
    offset: int | None  # None: acknowledged by librdkafka without an offset (see checker)
    value: str


@dataclass(frozen=True)
class Read:
    consumer: int
    partition: int
    offset: int
    value: str


@dataclass
class History:
    """Everything the clients saw; appended to from several threads under `lock`."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    attempted: set = field(default_factory=set)
    acks: list = field(default_factory=list)
    failed: dict = field(default_factory=dict)  # value -> error (indeterminate)
    reads: list = field(default_factory=list)
    backwards: list = field(default_factory=list)  # (consumer, partition, previous, offset)
    consumer_errors: list = field(default_factory=list)


class ProducerThread(threading.Thread):
    def __init__(self, index: int, bootstrap: str, topic: str, partitions: int, rate_per_s: float, history: History):
        super().__init__(name=f"producer-{index}", daemon=True)
        self.index = index
        self.topic = topic
        self.partitions = partitions
        self.interval_s = 1.0 / rate_per_s
        self.history = history
        self.stopping = threading.Event()
        self.producer = Producer({
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            # One request in flight per connection. With more, a request refused with a
            # retriable error (NOT_ENOUGH_REPLICAS while the ISR regrows after a fault) can be
            # followed by one the broker accepted out of order; librdkafka then drains, bumps
            # its epoch and sends every queued record again under new sequence numbers,
            # including records whose earlier send was possibly persisted: duplicates no
            # broker can recognize (its INTRODUCTION.md, "Error handling"). The checker
            # counts duplicates as the broker's, so the client must not make any.
            "max.in.flight.requests.per.connection": 1,
            "linger.ms": 5,
            "message.timeout.ms": MESSAGE_TIMEOUT_MS,
            "request.timeout.ms": 5000,
            "retry.backoff.ms": 50,
            "retry.backoff.max.ms": 500,
            "topic.metadata.refresh.interval.ms": 1000,
            "socket.connection.setup.timeout.ms": 3000,
            "log_level": LIBRDKAFKA_LOG_LEVEL,
        })

    def _delivered(self, error, message):
        value = message.value().decode()
        with self.history.lock:
            if error is None:
                self.history.acks.append(Ack(time.monotonic(), message.partition(), message.offset(), value))
            else:
                self.history.failed[value] = str(error)

    def run(self):
        seq = 0
        next_send = time.monotonic()
        while not self.stopping.is_set():
            if len(self.producer) < OUTSTANDING_MAX:
                value = f"{self.index}-{seq}"
                with self.history.lock:
                    self.history.attempted.add(value)
                self.producer.produce(self.topic, value=value.encode(), partition=seq % self.partitions,
                                      on_delivery=self._delivered)
                seq += 1
            next_send += self.interval_s
            self.producer.poll(max(0.0, next_send - time.monotonic()))
        # Everything still in flight is retried until acknowledged or timed out.
        self.producer.flush(MESSAGE_TIMEOUT_MS / 1000 + 5)

    def stop(self):
        self.stopping.set()


class ConsumerThread(threading.Thread):
    def __init__(self, index: int, bootstrap: str, topic: str, partitions: int, history: History):
        super().__init__(name=f"consumer-{index}", daemon=True)
        self.index = index
        self.history = history
        self.stopping = threading.Event()
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap,
            "group.id": f"faults-{index}-{time.time()}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "topic.metadata.refresh.interval.ms": 1000,
            "socket.connection.setup.timeout.ms": 3000,
            "log_level": LIBRDKAFKA_LOG_LEVEL,
        })
        self.consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])

    def run(self):
        last: dict[int, int] = {}
        try:
            while not self.stopping.is_set():
                for message in self.consumer.consume(500, 0.2):
                    if message.error():
                        if message.error().code() != KafkaError._PARTITION_EOF:
                            with self.history.lock:
                                self.history.consumer_errors.append(str(message.error()))
                        continue
                    partition, offset = message.partition(), message.offset()
                    with self.history.lock:
                        if offset <= last.get(partition, -1):
                            self.history.backwards.append((self.index, partition, last[partition], offset))
                        self.history.reads.append(Read(self.index, partition, offset, message.value().decode()))
                    last[partition] = offset
        finally:
            self.consumer.close()

    def stop(self):
        self.stopping.set()


# What a watermark query answers while a partition's leadership moves.
LEADER_MOVING = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                 KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._TRANSPORT, KafkaError._TIMED_OUT}


def high_watermark(consumer: Consumer, topic: str, partition: int, timeout_s: float = 30.0) -> int:
    """The partition's high watermark, asked again while the cluster still moves its leader
    after the last fault (NOT_LEADER_FOR_PARTITION and other retriable errors), as a client
    retries them."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)[1]
        except KafkaException as error:
            if error.args[0].code() not in LEADER_MOVING or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def final_read(bootstrap: str, topic: str, partitions: int) -> dict[int, list[tuple[int, str]]]:
    """Reads every partition from the start to its high watermark, with a fresh consumer."""
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": f"faults-final-{time.time()}",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    })
    try:
        ends = {p: high_watermark(consumer, topic, p) for p in range(partitions)}
        log: dict[int, list[tuple[int, str]]] = {p: [] for p in range(partitions)}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions) if ends[p] > 0])
        position = {p: 0 for p in range(partitions)}
        deadline = time.monotonic() + FINAL_READ_TIMEOUT_S
        while any(position[p] < ends[p] for p in range(partitions)):
            if time.monotonic() > deadline:
                raise AssertionError(f"final read stuck at {position}, high watermarks {ends}")
            for message in consumer.consume(1000, 0.5):
                if message.error():
                    continue
                log[message.partition()].append((message.offset(), message.value().decode()))
                position[message.partition()] = message.offset() + 1
        return log
    finally:
        consumer.close()
