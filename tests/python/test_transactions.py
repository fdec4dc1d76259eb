"""Kafka transactions (exactly-once semantics) on a single node, seen through real clients.

* librdkafka (confluent-kafka) consume-transform-produce: records read from `in` by a consumer in
  group `eos` (read_committed, no auto-commit) are transformed and written to `out` by a
  transactional producer, and the consumer's offsets are committed inside the same transaction
  (send_offsets_to_transaction). Every third transaction is aborted after its records reached the
  log and its offsets were sent, and the consumer is rewound to the group's committed offsets
  (alternately by seeking to consumer.committed() and by recreating the consumer). A read_committed
  reader of `out` then sees every input key exactly once with the transformed value, a
  read_uncommitted reader additionally sees exactly the aborted records, and the group's committed
  offsets on `in` are the end offsets.
* The same pipeline while the broker is SIGKILLed and restarted three times: with a transaction
  open (records and offsets written) that the same producer then ends; with a transaction open
  when the application dies too (its successor's init_transactions must abort it); around a
  commit/abort. Client errors are handled as applications do (abort_transaction on abortable
  errors; else a new producer with the same transactional.id; a new consumer restarting from the
  committed offsets): read_committed `out` still holds each input key exactly once.
* Zombie fencing: a second producer with the same transactional.id aborts the first one's open
  transaction; the first one's later produce/commit fails with a fatal "fenced" error and its
  records are never visible to read_committed consumers; the second one's committed ones are.
* transaction.timeout.ms: a transaction left open is aborted by the broker on its own; the last
  stable offset moves past it (ListOffsets with read_committed and a read_committed consumer of a
  later committed transaction), the expired producer can no longer commit.
* The Java client (tests/java/.../TransactionalProducer.java: 100 committed + 100 aborted records,
  read back with both isolation levels, then an open transaction) and Kafka's own
  kafka-transactions.sh (org.apache.kafka.tools.TransactionsCommand) `list` and `describe`.
"""

from __future__ import annotations

import os
import random
import re
import threading
import time
import uuid

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    ConsumerGroupTopicPartitions,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import OffsetSpec

from java_support import JavaProcess, java_cp, run_java, tools_cp  # noqa: F401  (java_cp, tools_cp are fixtures)
from kafka_wire import admin_client, create_topic

# New groups form at once (Kafka's default initial rebalance delay is 3 s per empty group).
BROKER_ARGS = ["--group-initial-rebalance-delay-ms", "0"]

N = 2000  # input records of the pipeline tests
PARTITIONS = 3
BATCH = 100  # records per transaction at most
ABORT_EVERY = 3  # every 3rd transaction of the pipeline is aborted

FENCED = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
TRANSACTIONS_COMMAND = "org.apache.kafka.tools.TransactionsCommand"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def client_conf(bootstrap: str, **extra) -> dict:
    conf = {
        "bootstrap.servers": bootstrap,
        "broker.address.family": "v4",
        # Reconnect quickly to a restarted broker (librdkafka backs off up to 10 s by default).
        "reconnect.backoff.ms": 100,
        "reconnect.backoff.max.ms": 1000,
        # No re-bootstrap while the only broker is down: librdkafka then decommissions its broker
        # handle, and send_offsets_to_transaction() waits forever (past its timeout) for a group
        # coordinator cached on the decommissioned handle (confluentinc/librdkafka#5511, #5456).
        "metadata.recovery.strategy": "none",
    }
    conf.update(extra)
    return conf


def txn_producer(bootstrap: str, txn_id: str, **extra) -> Producer:
    return Producer(client_conf(bootstrap, **{"transactional.id": txn_id, "linger.ms": 5, **extra}))


# Errors a Kafka client retries a ListOffsets on: a leader that moved (a restarted node takes its
# preferred leadership back) or one whose high watermark has not yet reached what the previous
# leader acknowledged (KIP-207). The Java admin client retries them; librdkafka's does not.
LIST_OFFSETS_RETRIABLE = {
    KafkaError.OFFSET_NOT_AVAILABLE, KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.FENCED_LEADER_EPOCH, KafkaError.UNKNOWN_LEADER_EPOCH, KafkaError.REQUEST_TIMED_OUT,
    KafkaError._TRANSPORT,
}


def offsets(bootstrap: str, topic: str, partitions: int, isolation: IsolationLevel, admin=None,
            timeout: float = 30.0) -> dict[int, int]:
    """ListOffsets LATEST per partition: the high watermark (READ_UNCOMMITTED) or the last stable
    offset (READ_COMMITTED). Partitions answering a retriable error are asked again until
    `timeout`, as the Java admin client does."""
    admin = admin or admin_client(bootstrap)  # kept alive until the futures are done
    found: dict[int, int] = {}
    deadline = time.monotonic() + timeout
    while True:
        fs = admin.list_offsets({TopicPartition(topic, p): OffsetSpec.latest()
                                 for p in range(partitions) if p not in found},
                                isolation_level=isolation, request_timeout=30)
        for tp, f in fs.items():
            try:
                found[tp.partition] = f.result(30).offset
            except KafkaException as e:
                if e.args[0].code() not in LIST_OFFSETS_RETRIABLE or time.monotonic() > deadline:
                    raise
        if len(found) == partitions:
            return found
        time.sleep(0.2)


def read_all(bootstrap: str, topic: str, partitions: int, isolation: str, timeout: float = 60.0) -> list:
    """Every record a consumer with this isolation.level gets from the beginning of each partition
    up to the current high watermark: [(partition, offset, key, value)]. A read_committed consumer
    stops at the last stable offset, so if that stays below the high watermark (a transaction
    left open) this times out with an AssertionError."""
    target = offsets(bootstrap, topic, partitions, IsolationLevel.READ_UNCOMMITTED)
    c = Consumer(client_conf(bootstrap, **{
        "group.id": unique("reader"), "isolation.level": isolation, "enable.partition.eof": True,
        "enable.auto.commit": False, "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100,
    }))
    try:
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        eof: dict[int, int] = {}
        out = []
        deadline = time.monotonic() + timeout
        while not all(eof.get(p, -1) >= target[p] for p in range(partitions)):
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{isolation} consumer of {topic} did not reach the high watermarks {target} within {timeout}s: "
                    f"end of partition reported at {eof}, {len(out)} records read")
            for m in c.consume(num_messages=10_000, timeout=0.2):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        eof[m.partition()] = m.offset()
                        continue
                    raise AssertionError(f"{isolation} consumer of {topic}: {err}")
                out.append((m.partition(), m.offset(), m.key(), m.value()))
        return out
    finally:
        c.close()


def produce_input(bootstrap: str, topic: str, n: int) -> None:
    """Keys b"0".."n-1", values b"v-<i>", plain (non-transactional) producer."""
    errors = []
    p = Producer(client_conf(bootstrap, **{"linger.ms": 5, "acks": "all"}))
    for i in range(n):
        p.produce(topic, key=str(i).encode(), value=b"v-%d" % i,
                  on_delivery=lambda err, msg: err is not None and errors.append(err))
    assert p.flush(60) == 0 and not errors, f"input produce failed: {errors[:5]}"


def check_exactly_once(records: list, n: int, what: str) -> None:
    """Each input key 0..n-1 exactly once, with the transformed value."""
    seen: dict[int, int] = {}
    wrong = []
    for part, off, key, value in records:
        i = int(key)
        seen[i] = seen.get(i, 0) + 1
        if value != b"v-%d!" % i:
            wrong.append((part, off, key, value))
    dups = sorted(i for i, c in seen.items() if c > 1)
    missing = sorted(set(range(n)) - set(seen))
    foreign = sorted(i for i in seen if not 0 <= i < n)
    assert not (dups or missing or foreign or wrong), (
        f"{what}: {len(records)} records for {n} keys; {len(dups)} keys duplicated (e.g. {dups[:10]}), "
        f"{len(missing)} missing (e.g. {missing[:10]}), foreign keys {foreign[:10]}, wrong values {wrong[:5]}")


# ----------------------------------------------------------------------------- the EOS pipeline


class AppRestart(Exception):
    """Raised by a test hook: the application dies mid-transaction and starts again."""


class EosPipeline:
    """The consume-transform-produce loop of an exactly-once application.

    Each transaction: poll up to BATCH records of `src`, begin_transaction, produce
    (key, value + b"!") to `dst`, send_offsets_to_transaction(next offset of every polled
    partition, consumer_group_metadata()), then commit -- or, every ABORT_EVERY-th transaction,
    flush (the records reach the log), abort_transaction and rewind the consumer to the group's
    committed offsets (odd aborts: seek to consumer.committed(); even aborts: a new consumer).

    With tolerate_errors (broker restarts), a KafkaException anywhere in a transaction is handled
    as applications do: abort_transaction if the error says the transaction must be aborted (and
    the abort works), else a new producer with the same transactional.id (init_transactions
    fences the old one and aborts or completes its transaction); then a new consumer, which
    resumes from the committed offsets. Finished when the group's committed offsets on `src`
    reach its end offsets.
    """

    def __init__(self, bootstrap: str, src: str, dst: str, txn_id: str, group: str, tolerate_errors: bool = False):
        self.bootstrap, self.src, self.dst, self.txn_id, self.group = bootstrap, src, dst, txn_id, group
        self.tolerate_errors = tolerate_errors
        self.src_end = offsets(bootstrap, src, PARTITIONS, IsolationLevel.READ_UNCOMMITTED)
        self.producer: Producer | None = None
        self.consumer: Consumer | None = None
        self.txns = 0
        self.committed_txns = 0
        self.aborted_txns = 0
        self.committed_records = 0
        self.aborted_records = 0
        self.rewinds = 0
        self.recoveries: list[str] = []
        self.app_restarts = 0
        # Producers of "dead" application instances, kept alive (but never used again) so that
        # only the broker can end their open transactions.
        self.zombies: list[Producer] = []
        self.init_errors: list[str] = []
        self.delivery_errors: list[str] = []
        self.consumer_errors: list[str] = []
        # (partition, committed offset seen after an abort, first offset of the aborted batch)
        self.rewind_mismatches: list[tuple[int, int, int]] = []

    def summary(self) -> str:
        return (f"txns={self.txns} committed_txns={self.committed_txns} aborted_txns={self.aborted_txns} "
                f"committed_records={self.committed_records} aborted_records={self.aborted_records} "
                f"rewinds={self.rewinds} recoveries={self.recoveries} app_restarts={self.app_restarts} "
                f"init_errors={self.init_errors[:5]} "
                f"delivery_errors={self.delivery_errors[:5]} consumer_errors={self.consumer_errors[:5]}")

    # -- clients

    def new_producer(self) -> Producer:
        deadline = time.monotonic() + 60
        while True:
            p = txn_producer(self.bootstrap, self.txn_id, **{"transaction.timeout.ms": 30000})
            while True:
                try:
                    p.init_transactions(30)
                    return p
                except KafkaException as e:
                    err = e.args[0]
                    self.init_errors.append(str(err))
                    if not self.tolerate_errors or time.monotonic() > deadline:
                        raise AssertionError(f"init_transactions failed: {err}; {self.summary()}") from e
                    if err.retriable() and not err.fatal():
                        continue  # "retry call to resume"
                    break  # a fresh instance

    def new_consumer(self) -> Consumer:
        c = Consumer(client_conf(self.bootstrap, **{
            "group.id": self.group, "isolation.level": "read_committed", "enable.auto.commit": False,
            "auto.offset.reset": "earliest", "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
            "fetch.wait.max.ms": 100,
        }))
        c.subscribe([self.src])
        return c

    def replace_consumer(self) -> None:
        old, self.consumer = self.consumer, None
        if old is not None:
            try:
                old.close()
            except (KafkaException, RuntimeError) as e:
                self.consumer_errors.append(f"close: {e}")
        self.consumer = self.new_consumer()

    def close(self) -> None:
        if self.consumer is not None:
            try:
                self.consumer.close()
            except (KafkaException, RuntimeError):
                pass
            self.consumer = None
        self.producer = None
        self.zombies.clear()

    # -- the loop

    def committed(self) -> dict[int, int]:
        tps = self.consumer.committed([TopicPartition(self.src, p) for p in range(PARTITIONS)], timeout=10)
        return {tp.partition: tp.offset for tp in tps}

    def caught_up(self) -> bool:
        try:
            got = self.committed()
        except KafkaException as e:
            if not self.tolerate_errors:
                raise
            self.consumer_errors.append(f"committed: {e}")
            return False
        return all(got[p] >= self.src_end[p] for p in range(PARTITIONS))

    def _on_delivery(self, err, msg):
        if err is not None:
            self.delivery_errors.append(str(err))

    def poll_batch(self) -> list:
        out = []
        for m in self.consumer.consume(num_messages=BATCH, timeout=0.2):
            err = m.error()
            if err is None:
                out.append(m)
            elif err.fatal():
                raise KafkaException(err)
            else:
                self.consumer_errors.append(str(err))
        return out

    def rewind(self, first: dict[int, int]) -> None:
        """Back to the group's committed offsets after an abort. Without faults the batch began
        exactly at the committed offset, so an aborted offset commit would show here."""
        self.rewinds += 1
        if self.rewinds % 2 == 0:
            self.replace_consumer()
            return
        committed = self.committed()
        for part, first_offset in first.items():
            off = committed[part]
            if off != first_offset and not (off < 0 and first_offset == 0):
                self.rewind_mismatches.append((part, off, first_offset))
            self.consumer.seek(TopicPartition(self.src, part, off if off >= 0 else OFFSET_BEGINNING))

    def transact(self, msgs: list, before_end=None) -> None:
        self.txns += 1
        abort = self.txns % ABORT_EVERY == 0
        first: dict[int, int] = {}
        next_offset: dict[int, int] = {}
        for m in msgs:
            first.setdefault(m.partition(), m.offset())
            next_offset[m.partition()] = m.offset() + 1
        p = self.producer
        p.begin_transaction()
        for m in msgs:
            p.produce(self.dst, key=m.key(), value=m.value() + b"!", on_delivery=self._on_delivery)
        p.poll(0)
        p.send_offsets_to_transaction([TopicPartition(self.src, q, o) for q, o in next_offset.items()],
                                      self.consumer.consumer_group_metadata(), 30)
        if before_end is not None:
            before_end(self, abort)
        if abort:
            left = p.flush(30)
            if left and not self.tolerate_errors:
                raise AssertionError(f"{left} records of an aborting transaction not delivered; {self.summary()}")
            p.abort_transaction(30)
            self.aborted_txns += 1
            self.aborted_records += len(msgs)
            self.rewind(first)
        else:
            p.commit_transaction(30)
            self.committed_txns += 1
            self.committed_records += len(msgs)

    def recover(self, err: KafkaError) -> None:
        self.recoveries.append(f"{err.name()} fatal={err.fatal()} retriable={err.retriable()} "
                               f"abortable={err.txn_requires_abort()}")
        fresh = err.fatal() or not err.txn_requires_abort()
        if not fresh:
            try:
                self.producer.abort_transaction(30)
            except KafkaException as e:
                self.recoveries.append(f"abort_transaction failed: {e.args[0].name()}")
                fresh = True
        if fresh:
            self.producer = None  # dropped (destroyed); the new instance fences it anyway
            self.producer = self.new_producer()
        self.replace_consumer()

    def restart_app(self) -> None:
        """A new application instance: a new producer with the same transactional.id (its
        init_transactions must abort the dead instance's open transaction) and a new consumer
        (resuming from the group's committed offsets)."""
        self.app_restarts += 1
        self.zombies.append(self.producer)
        self.producer = self.new_producer()
        self.replace_consumer()

    def run(self, timeout: float, before_end=None) -> None:
        self.producer = self.new_producer()
        self.consumer = self.new_consumer()
        deadline = time.monotonic() + timeout
        while True:
            if time.monotonic() > deadline:
                raise AssertionError(f"the pipeline did not consume {self.src} up to {self.src_end} within "
                                     f"{timeout}s: {self.summary()}")
            try:
                msgs = self.poll_batch()
                if not msgs:
                    if self.caught_up():
                        return
                    continue
                self.transact(msgs, before_end)
            except AppRestart:
                self.restart_app()
            except KafkaException as e:
                if not self.tolerate_errors:
                    raise AssertionError(f"transaction failed: {e.args[0]}; {self.summary()}") from e
                self.recover(e.args[0])


def committed_offsets(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """The group's committed offsets as the admin API (OffsetFetch, require_stable) reports them."""
    admin = admin_client(bootstrap)  # kept alive until the future is done
    fs = admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in range(PARTITIONS)])],
        require_stable=True, request_timeout=30)
    res = fs[group].result(30)
    return {tp.partition: tp.offset for tp in res.topic_partitions}


# ----------------------------------------------------------------------------- tests


def test_transactional_consume_transform_produce_is_exactly_once(broker_factory):
    """2000 records through the consume-transform-produce loop with every third transaction
    aborted (after its records reached the log and its offsets were sent): read_committed `out`
    holds every input key exactly once with the transformed value; read_uncommitted `out` holds
    exactly those plus the aborted records; an aborted transaction's offsets never become the
    group's committed offsets; the group's committed offsets on `in` are the end offsets."""
    broker = broker_factory(extra_args=BROKER_ARGS)
    bs = broker.bootstrap
    create_topic(bs, "in", PARTITIONS)
    create_topic(bs, "out", PARTITIONS)
    produce_input(bs, "in", N)

    pipe = EosPipeline(bs, "in", "out", txn_id="eos-app", group="eos")
    t0 = time.monotonic()
    try:
        pipe.run(timeout=90)
    finally:
        pipe.close()
    print(f"pipeline: {time.monotonic() - t0:.1f}s {pipe.summary()}")
    ctx = f"{pipe.summary()}\n--- broker log (tail) ---\n{broker.log()[-4000:]}"
    assert pipe.aborted_txns >= 3 and pipe.committed_txns >= 6, f"too few transactions to mean anything: {ctx}"
    assert not pipe.delivery_errors, ctx
    assert not pipe.rewind_mismatches, (
        f"after an abort the group's committed offset was not where the aborted batch began "
        f"(partition, committed, batch start): {pipe.rewind_mismatches}; {ctx}")
    assert pipe.committed_records == N, f"committed transactions carried {pipe.committed_records} records: {ctx}"

    committed = read_all(bs, "out", PARTITIONS, "read_committed")
    check_exactly_once(committed, N, "read_committed consumer of out")

    uncommitted = read_all(bs, "out", PARTITIONS, "read_uncommitted")
    assert len(uncommitted) == N + pipe.aborted_records > N, (
        f"read_uncommitted consumer of out: {len(uncommitted)} records, expected the {N} committed + "
        f"{pipe.aborted_records} aborted ones (aborted records stay in the log): {ctx}")
    assert {r[:2] for r in committed} <= {r[:2] for r in uncommitted}

    assert committed_offsets(bs, "eos", "in") == pipe.src_end, ctx
    assert broker.is_running(), ctx


def test_kill_9_mid_transactions_loses_nothing_committed(broker_factory):
    """The pipeline of the previous test while the broker is SIGKILLed and restarted three times,
    each time in the middle of a transaction whose records are in the log and whose offsets were
    sent: after 1/4 of the input the same producer then commits/aborts it (the broker must keep
    the open transaction across the crash); after 1/2 the application dies with it and starts
    again (a new producer with the same transactional.id, whose init_transactions must abort the
    dead instance's transaction, and a new consumer); after 3/4 the kill comes from another
    thread 0-5 ms later (during the commit/abort or just after it). Any client error is handled
    as applications do. In the end read_committed `out` holds each input key exactly once and the
    group's committed offsets on `in` are the end offsets."""
    seed = int(os.environ.get("SLUICE_TEST_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    broker = broker_factory(extra_args=BROKER_ARGS)
    bs = broker.bootstrap
    create_topic(bs, "in", PARTITIONS)
    create_topic(bs, "out", PARTITIONS)
    produce_input(bs, "in", N)

    kills: list[str] = []
    thread_errors: list[BaseException] = []
    threads: list[threading.Thread] = []

    def restart(delay: float):
        try:
            time.sleep(delay)
            broker.kill()
            time.sleep(0.3)
            broker.start()
        except BaseException as e:  # reported below
            thread_errors.append(e)

    def before_end(pipe: EosPipeline, abort: bool):
        stage = len(kills)
        if stage == 3 or pipe.committed_records < (stage + 1) * N // 4:
            return
        what = f"txn {pipe.txns} ({'abort' if abort else 'commit'})"
        if stage < 2:
            left = pipe.producer.flush(10)  # this transaction's records are in the log
            assert left == 0, f"{left} records of the transaction not delivered before the kill"
            kills.append(f"{what}: kill -9 with the transaction open"
                         + ("; the application restarts too" if stage == 1 else ""))
            restart(0)
            if stage == 1:
                raise AppRestart()
        else:
            delay = rng.uniform(0, 0.005)
            kills.append(f"{what}: kill -9 {delay * 1000:.1f} ms into the end of the transaction")
            t = threading.Thread(target=restart, args=(delay,), daemon=True)
            t.start()
            threads.append(t)

    pipe = EosPipeline(bs, "in", "out", txn_id="eos-app", group="eos", tolerate_errors=True)
    t0 = time.monotonic()
    try:
        pipe.run(timeout=120, before_end=before_end)
    finally:
        for t in threads:
            t.join(40)
        summary = pipe.summary()
        pipe.close()
    print(f"seed={seed} pipeline: {time.monotonic() - t0:.1f}s kills={kills} {summary}")
    ctx = f"seed={seed} kills={kills} {summary}\n--- broker log (tail) ---\n{broker.log()[-6000:]}"
    assert not thread_errors, f"restarting the broker failed: {thread_errors}; {ctx}"
    assert len(kills) == 3 and pipe.app_restarts == 1, f"not every planned kill happened: {ctx}"
    assert broker.is_running(), ctx

    check_exactly_once(read_all(bs, "out", PARTITIONS, "read_committed"), N, f"read_committed consumer of out ({ctx})")
    assert committed_offsets(bs, "eos", "in") == pipe.src_end, ctx


def test_zombie_producer_is_fenced(broker):
    """Producer A (transactional.id "z") has an open transaction with a record in the log when
    producer B with the same transactional.id calls init_transactions: that aborts A's
    transaction and fences A. A's next produce/commit fails with a fatal "fenced" error; A's
    records are never visible to read_committed consumers (its first record is in the log,
    aborted; its later one is refused); B's committed transaction is visible."""
    bs = broker.bootstrap
    topic = unique("zombie")
    create_topic(bs, topic, 1)
    delivered: list = []

    a = txn_producer(bs, "z")
    a.init_transactions(30)
    a.begin_transaction()
    a.produce(topic, key=b"a", value=b"zombie-1", on_delivery=lambda err, msg: delivered.append(err))
    assert a.flush(30) == 0 and delivered == [None], f"A's first record was not written: {delivered}"

    b = txn_producer(bs, "z")
    t = time.monotonic()
    b.init_transactions(30)  # waits for A's transaction to be aborted
    b_init_s = time.monotonic() - t

    assert [r[3] for r in read_all(bs, topic, 1, "read_committed", timeout=20)] == [], \
        "A's aborted record is visible to read_committed after B's init_transactions"

    # A goes on as if nothing happened. (No Python callbacks here: confluent-kafka raises the
    # fatal error from inside flush()/poll(), which breaks any callback it runs at that moment.)
    with pytest.raises(KafkaException) as info:
        a.produce(topic, key=b"a", value=b"zombie-2")
        a.commit_transaction(30)
    err = info.value.args[0]
    assert err.fatal() and err.code() in FENCED, f"A's produce/commit after being fenced: {err}"

    b.begin_transaction()
    b.produce(topic, key=b"b", value=b"b-1")
    b.produce(topic, key=b"b", value=b"b-2")
    b.commit_transaction(30)

    committed = [r[3] for r in read_all(bs, topic, 1, "read_committed")]
    assert committed == [b"b-1", b"b-2"], f"read_committed sees {committed}"
    uncommitted = [r[3] for r in read_all(bs, topic, 1, "read_uncommitted")]
    assert uncommitted == [b"zombie-1", b"b-1", b"b-2"], (
        f"read_uncommitted sees {uncommitted}: the fenced producer's second record must be refused")
    print(f"B's init_transactions took {b_init_s:.2f}s; A's produce/commit failed with {err}")


def test_transaction_timeout_aborts(broker_factory):
    """A producer with transaction.timeout.ms=4000 writes 10 records in a transaction and then
    does nothing. While the transaction is open the last stable offset stays at its first record;
    the broker aborts it on its own after the timeout: the last stable offset reaches the high
    watermark, read_committed consumers never see the records, the expired producer's commit
    fails, and a later transaction of another producer on the same partition is readable with
    read_committed (the LSO is not stuck)."""
    broker = broker_factory(extra_args=[*BROKER_ARGS, "--log-retention-check-interval-ms", "200"])
    bs = broker.bootstrap
    topic = unique("txn-timeout")
    create_topic(bs, topic, 1)

    # 4 s leaves the checks of the open transaction below room on a loaded machine.
    stale = txn_producer(bs, unique("stale"), **{"transaction.timeout.ms": 4000})
    stale.init_transactions(30)
    stale.begin_transaction()
    for i in range(10):
        stale.produce(topic, value=b"stale-%d" % i)
    assert stale.flush(30) == 0
    t0 = time.monotonic()

    admin = admin_client(bs)
    hwm = offsets(bs, topic, 1, IsolationLevel.READ_UNCOMMITTED, admin)[0]
    lso = offsets(bs, topic, 1, IsolationLevel.READ_COMMITTED, admin)[0]
    assert (lso, hwm) == (0, 10), f"open transaction over offsets 0..9: expected LSO 0, HWM 10; got LSO {lso}, HWM {hwm}"

    # The broker must abort it by itself: wait up to 12 s after the write (timeout 4 s).
    while True:
        elapsed = time.monotonic() - t0
        lso = offsets(bs, topic, 1, IsolationLevel.READ_COMMITTED, admin)[0]
        hwm = offsets(bs, topic, 1, IsolationLevel.READ_UNCOMMITTED, admin)[0]
        if lso == hwm:
            break
        assert elapsed < 12, (f"transaction with transaction.timeout.ms=4000 still open {elapsed:.1f}s after its "
                             f"records were written: LSO {lso}, HWM {hwm}\n--- broker log ---\n{broker.log()[-4000:]}")
        time.sleep(0.1)
    aborted_after = time.monotonic() - t0
    abort_logged = sum("past its timeout" in line for line in broker.log().splitlines())
    assert aborted_after >= 2.0, f"transaction aborted {aborted_after:.2f}s after its write, before its 4 s timeout"
    assert hwm > 10, f"no abort marker written: HWM {hwm}"
    assert read_all(bs, topic, 1, "read_committed", timeout=20) == [], "timed-out transaction visible to read_committed"

    time.sleep(max(0.0, 6 - (time.monotonic() - t0)))  # ~6 s without committing
    with pytest.raises(KafkaException) as info:
        stale.commit_transaction(30)
    commit_err = info.value.args[0]

    fresh = txn_producer(bs, unique("fresh"))
    fresh.init_transactions(30)
    fresh.begin_transaction()
    for i in range(5):
        fresh.produce(topic, value=b"fresh-%d" % i)
    fresh.commit_transaction(30)

    committed = [r[3] for r in read_all(bs, topic, 1, "read_committed")]
    assert committed == [b"fresh-%d" % i for i in range(5)], f"read_committed sees {committed}"
    uncommitted = [r[3] for r in read_all(bs, topic, 1, "read_uncommitted")]
    assert uncommitted == [b"stale-%d" % i for i in range(10)] + [b"fresh-%d" % i for i in range(5)], uncommitted
    print(f"aborted by the broker {aborted_after:.2f}s after the write (timeout aborts logged: {abort_logged}); "
          f"the late commit failed with {commit_err}")


def _table(stdout: str, first_header: str) -> list[dict[str, str]]:
    """Rows of a TransactionsCommand table (a header line starting with `first_header`, then one
    whitespace-separated line per row; empty trailing columns are left out)."""
    lines = [l for l in stdout.splitlines() if l.strip()]
    for i, line in enumerate(lines):
        if line.split()[:1] == [first_header]:
            headers = line.split()
            return [dict(zip(headers, row.split())) for row in lines[i + 1:]]
    return []


def test_java_transactions_and_kafka_transactions_tool(broker, java_cp, tools_cp):
    """Java client: 50 committed, 100 aborted, 50 committed records; read_committed reads exactly
    the 100 committed in order, read_uncommitted all 200. While a fourth transaction is open,
    kafka-transactions.sh `list` shows the transactional id and `describe --transactional-id`
    shows it Ongoing with its partition and the same producer id; after the abort `describe`
    shows CompleteAbort and both isolation levels still read what they should."""
    txn_id = unique("java-txn")
    topic = unique("java-txn-topic")

    def tool(*args):
        res = run_java(tools_cp, TRANSACTIONS_COMMAND, ["--bootstrap-server", broker.bootstrap, *args], timeout=60)
        assert res.returncode == 0, f"{res.report()}\n--- broker log (tail) ---\n{broker.log()[-4000:]}"
        return res

    proc = JavaProcess(java_cp, "sluice.tests.TransactionalProducer",
                       ["--bootstrap", broker.bootstrap, "--topic", topic, "--transactional-id", txn_id], stdin=True)
    try:
        proc.wait_for_line("COMMITTED_READ_OK", 120)
        proc.wait_for_line("OPEN", 60)

        listed = tool("list")
        rows = [r for r in _table(listed.stdout, "TransactionalId") if r.get("TransactionalId") == txn_id]
        assert len(rows) == 1, f"kafka-transactions list does not show {txn_id} once\n{listed.report()}"
        assert rows[0].get("TransactionState") == "Ongoing", listed.report()

        described = tool("describe", "--transactional-id", txn_id)
        desc = _table(described.stdout, "CoordinatorId")
        assert len(desc) == 1 and desc[0].get("TransactionalId") == txn_id, described.report()
        d = desc[0]
        assert d.get("TransactionState") == "Ongoing", described.report()
        assert d.get("ProducerId") == rows[0].get("ProducerId") and re.fullmatch(r"\d+", d.get("ProducerId", "")), \
            f"list and describe disagree on the producer id\n{listed.report()}\n{described.report()}"
        assert f"{topic}-0" in d.get("TopicPartitions", "").split(","), described.report()
        assert d.get("TransactionTimeoutMs") == "60000", described.report()

        proc.send("abort")
        proc.wait_for_line("PASS transactions", 60)
        res = proc.wait(30)
    finally:
        proc.kill()
    assert res.returncode == 0, f"{res.report()}\n--- broker log (tail) ---\n{broker.log()[-4000:]}"

    described = tool("describe", "--transactional-id", txn_id)
    desc = _table(described.stdout, "CoordinatorId")
    assert len(desc) == 1 and desc[0].get("TransactionState") == "CompleteAbort", described.report()
    listed = tool("list")
    assert txn_id in [r.get("TransactionalId") for r in _table(listed.stdout, "TransactionalId")], listed.report()


def test_kafka_transactions_describe_producers_and_abort(broker, tools_cp):
    """A hanging transaction ended by an administrator, as with Kafka: a producer writes 5 records
    in a transaction and is never heard of again. `kafka-transactions.sh describe-producers` shows
    its producer id, epoch and the transaction's first offset; `abort --topic --partition
    --start-offset` (DescribeProducers, then WriteTxnMarkers to the partition leader) writes an
    abort marker: the last stable offset moves past it, read_committed never sees its records, and
    a later committed transaction is read. An abort at an offset where no transaction starts is
    refused by the tool and changes nothing."""
    bs = broker.bootstrap
    topic = unique("hanging")
    create_topic(bs, topic, 1)

    def tool(*args, ok=True):
        res = run_java(tools_cp, TRANSACTIONS_COMMAND, ["--bootstrap-server", bs, *args], timeout=60)
        if ok:
            assert res.returncode == 0, f"{res.report()}\n--- broker log (tail) ---\n{broker.log()[-4000:]}"
        return res

    plain = Producer(client_conf(bs))
    for i in range(3):
        plain.produce(topic, value=b"plain-%d" % i)
    assert plain.flush(30) == 0
    hanging = txn_producer(bs, unique("hanging"), **{"transaction.timeout.ms": 900000})
    hanging.init_transactions(30)
    hanging.begin_transaction()
    for i in range(5):
        hanging.produce(topic, value=b"hanging-%d" % i)
    assert hanging.flush(30) == 0
    assert offsets(bs, topic, 1, IsolationLevel.READ_COMMITTED)[0] == 3

    described = tool("describe-producers", "--topic", topic, "--partition", "0")
    rows = _table(described.stdout, "ProducerId")
    open_rows = [r for r in rows if r.get("CurrentTransactionStartOffset") == "3"]
    assert len(open_rows) == 1, f"the open transaction is not shown starting at offset 3\n{described.report()}"
    assert open_rows[0].get("ProducerEpoch") == "0" and open_rows[0].get("LastSequence") == "4", described.report()

    bad = tool("abort", "--topic", topic, "--partition", "0", "--start-offset", "1", ok=False)
    assert bad.returncode != 0, f"abort at an offset where no transaction starts succeeded\n{bad.report()}"
    assert offsets(bs, topic, 1, IsolationLevel.READ_COMMITTED)[0] == 3

    tool("abort", "--topic", topic, "--partition", "0", "--start-offset", "3")
    hwm = offsets(bs, topic, 1, IsolationLevel.READ_UNCOMMITTED)[0]
    assert hwm == 9, f"expected 3 + 5 records and one abort marker, high watermark {hwm}"
    assert offsets(bs, topic, 1, IsolationLevel.READ_COMMITTED)[0] == hwm, "the last stable offset is still held back"
    after = _table(tool("describe-producers", "--topic", topic, "--partition", "0").stdout, "ProducerId")
    assert all(r.get("CurrentTransactionStartOffset") in ("-1", "None") for r in after), after

    fresh = txn_producer(bs, unique("fresh"))
    fresh.init_transactions(30)
    fresh.begin_transaction()
    fresh.produce(topic, value=b"fresh")
    fresh.commit_transaction(30)
    committed = [r[3] for r in read_all(bs, topic, 1, "read_committed")]
    assert committed == [b"plain-0", b"plain-1", b"plain-2", b"fresh"], committed


def test_offsets_of_a_rebalanced_away_member_are_refused(broker_factory):
    """KIP-447 zombie fencing across rebalances: send_offsets_to_transaction carries the consumer's
    member id and generation (TxnOffsetCommit v3). After a second member joined the group (a new
    generation), a commit with the first member's old group metadata fails with
    ILLEGAL_GENERATION, an abortable error, and commits nothing; with its current metadata the
    same commit succeeds and the group's offset is the committed one."""
    broker = broker_factory(extra_args=BROKER_ARGS)
    bs = broker.bootstrap
    topic, group = unique("fence-gen"), unique("fence-gen-group")
    create_topic(bs, topic, 2)

    def member():
        c = Consumer(client_conf(bs, **{"group.id": group, "enable.auto.commit": False,
                                        "auto.offset.reset": "earliest", "session.timeout.ms": 6000,
                                        "heartbeat.interval.ms": 500}))
        c.subscribe([topic])
        return c

    def wait_assigned(consumers, sizes):
        deadline = time.monotonic() + 30
        while [len(c.assignment()) for c in consumers] != sizes:
            assert time.monotonic() < deadline, [c.assignment() for c in consumers]
            for c in consumers:
                c.poll(0.1)

    first = member()
    wait_assigned([first], [2])
    old_metadata = first.consumer_group_metadata()
    second = member()
    wait_assigned([first, second], [1, 1])

    producer = txn_producer(bs, unique("fence-gen-txn"))
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, value=b"x", partition=0)
    with pytest.raises(KafkaException) as info:
        producer.send_offsets_to_transaction([TopicPartition(topic, 0, 42)], old_metadata, 30)
    err = info.value.args[0]
    assert err.code() == KafkaError.ILLEGAL_GENERATION and err.txn_requires_abort(), err
    producer.abort_transaction(30)

    producer.begin_transaction()
    producer.produce(topic, value=b"y", partition=0)
    producer.send_offsets_to_transaction([TopicPartition(topic, 0, 7)], first.consumer_group_metadata(), 30)
    producer.commit_transaction(30)
    committed = first.committed([TopicPartition(topic, 0)], timeout=30)
    assert committed[0].offset == 7, committed
    first.close()
    second.close()


def test_java_consume_transform_produce_survives_broker_kill_9(broker_factory, java_cp):
    """The Java client's exactly-once loop (tests/java/.../TransactionalCopier.java:
    sendOffsetsToTransaction with the consumer's group metadata, every third transaction aborted
    after its records reached the log) copies 2000 records while the broker is SIGKILLed and
    restarted three times at random moments. The copier handles errors as the Java client
    documents (abortable: abort and rewind; fatal or timed out: a new producer with the same
    transactional.id). In the end read_committed `out` holds each input key exactly once with the
    transformed value, and the group's committed offsets on `in` are the end offsets."""
    seed = int(os.environ.get("SLUICE_TEST_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    broker = broker_factory(extra_args=BROKER_ARGS)
    bs = broker.bootstrap
    create_topic(bs, "in", PARTITIONS)
    create_topic(bs, "out", PARTITIONS)
    produce_input(bs, "in", N)

    copier = JavaProcess(java_cp, "sluice.tests.TransactionalCopier",
                         ["--bootstrap", bs, "--input", "in", "--output", "out", "--group", "java-eos",
                          "--transactional-id", "java-eos-app", "--expect", str(N)])
    kills = 0
    try:
        for stage in range(1, 4):
            # Kill once the copier committed past stage/4 of the input, at a random moment after.
            deadline = time.monotonic() + 120
            while not any(line.startswith("COMMITTED ") and int(line.split()[1]) >= stage * N // 5
                          for _, line in copier.lines):
                assert time.monotonic() < deadline and copier.proc.poll() is None, \
                    f"seed {seed}: no progress to stage {stage}\n{copier.result().report()}"
                time.sleep(0.05)
            time.sleep(rng.uniform(0, 0.3))
            broker.kill()
            kills += 1
            time.sleep(0.3)
            broker.start()
        copier.wait_for_line("DONE", 180)
        res = copier.wait(30)
    finally:
        copier.kill()
    ctx = f"seed {seed}, {kills} kills\n{res.report()}\n--- broker log (tail) ---\n{broker.log()[-4000:]}"
    assert res.returncode == 0, ctx
    committed = read_all(bs, "out", PARTITIONS, "read_committed")
    check_exactly_once(committed, N, f"read_committed consumer of out ({ctx[:200]})")
    uncommitted = read_all(bs, "out", PARTITIONS, "read_uncommitted")
    assert len(uncommitted) > N, f"no aborted records in the log: the aborts were not exercised; {ctx}"
    end = offsets(bs, "in", PARTITIONS, IsolationLevel.READ_UNCOMMITTED)
    assert committed_offsets(bs, "java-eos", "in") == end, ctx
    commits = sum(line.startswith("COMMITTED ") for _, line in copier.lines)
    recoveries = [line for _, line in copier.lines if "new producer" in line or "aborting after" in line]
    print(f"seed {seed}: {commits} commits, {len(uncommitted) - N} aborted records in the log, "
          f"{len(recoveries)} recoveries from client errors: {recoveries[:6]}")
