"""A Kafka Streams application with exactly-once processing on a single node.

Kafka Streams is the heaviest user of the broker's transactions: with
`processing.guarantee=exactly_once_v2` each stream thread runs one transactional producer whose
transactions carry its output records, the records of its repartition topic, the updates of its
state store's changelog and the offsets of the consumer group (TxnOffsetCommit with the
generation, KIP-447); it reads with read_committed and restores its state from the changelog, a
compacted topic it creates itself (CreateTopics with configs), after a crash. It purges its
repartition topic with DeleteRecords.

tests/java/.../StreamsWordCount.java counts the words of the lines of `in` (through the
repartition topic `<app>-words-repartition` and the store `counts`, RocksDB or in memory,
logged to `<app>-counts-changelog`), with the record cache off, so each input word yields one
output record: the word's new count. Three rounds of a known input (a skewed multiset of words)
are processed while
* the application is killed with SIGKILL mid-stream (a transaction open, holding output and
  changelog records) and started again with the same application.id and state dir, and
* the broker is killed with SIGKILL mid-stream and restarted while the application runs.

Exactly-once means a read_committed reader of the output sees, for every word, the counts
1, 2, .., N in order, N being the word's number of occurrences in the input: nothing lost,
nothing counted twice, no count seen twice. A reader follows the output while the application
runs and fails at the first count out of sequence; the whole output is read again at the end.
(With `at_least_once`, or with read_uncommitted, the same run fails: counts skipped or repeated
after the kill.) The output must hold records of aborted transactions (the kills landed
mid-transaction), the changelog must exist with cleanup.policy=compact and end at the final
counts, the repartition topic must have been purged, and the application must close cleanly.
"""

from __future__ import annotations

import collections
import os
import random
import struct
import time
import uuid

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, IsolationLevel, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import ConfigResource, ResourceType

from java_support import JavaProcess, java_cp  # noqa: F401  (java_cp is a fixture)
from kafka_wire import admin_client, create_topic, watermarks
from test_transactions import offsets as list_offsets

# New groups form at once (Kafka's default initial rebalance delay is 3 s per empty group).
BROKER_ARGS = ["--group-initial-rebalance-delay-ms", "0"]

PARTITIONS = 2  # of the input and output topics (so of the repartition topic too)
ROUNDS = 3
LINES_PER_ROUND = 1000
THROTTLE_MS = 1  # the application sleeps this long per counted word, so that kills land mid-stream
WORDS = [f"w{i:02d}" for i in range(40)]
WORD_WEIGHTS = [1.0 / (i + 1) for i in range(len(WORDS))]  # a few frequent words, many rare ones


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def client_conf(bootstrap: str, **extra) -> dict:
    return {"bootstrap.servers": bootstrap, "broker.address.family": "v4", "reconnect.backoff.ms": 100,
            "reconnect.backoff.max.ms": 1000, **extra}


def make_rounds(seed: int) -> list[list[str]]:
    rng = random.Random(seed)
    return [[" ".join(rng.choices(WORDS, WORD_WEIGHTS, k=rng.randint(1, 6))) for _ in range(LINES_PER_ROUND)]
            for _ in range(ROUNDS)]


def produce_lines(bootstrap: str, topic: str, lines: list[str], first_key: int) -> None:
    errors = []
    p = Producer(client_conf(bootstrap, **{"linger.ms": 5, "acks": "all", "message.timeout.ms": 30000}))
    for i, line in enumerate(lines):
        p.produce(topic, key=str(first_key + i).encode(), value=line.encode(),
                  on_delivery=lambda err, msg: err is not None and errors.append(err))
    assert p.flush(40) == 0 and not errors, f"input produce failed: {errors[:5]}"


def read_topic(bootstrap: str, topic: str, partitions: int, isolation: str, timeout: float = 30.0) -> list:
    """Every (partition, offset, key, value) a consumer with this isolation.level reads from the
    beginning of each partition up to the current end (ListOffsets with the same isolation level).
    The end is told by librdkafka's end-of-partition event, which carries the fetch position, so
    it is found after trailing control batches and on a partition emptied by DeleteRecords too."""
    level = IsolationLevel.READ_COMMITTED if isolation == "read_committed" else IsolationLevel.READ_UNCOMMITTED
    target = list_offsets(bootstrap, topic, partitions, level)
    c = Consumer(client_conf(bootstrap, **{
        "group.id": unique("reader"), "isolation.level": isolation, "enable.auto.commit": False,
        "enable.partition.eof": True, "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100}))
    try:
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        eof: dict[int, int] = {}
        out = []
        deadline = time.monotonic() + timeout
        while not all(eof.get(p, -1) >= target[p] for p in range(partitions)):
            assert time.monotonic() < deadline, (
                f"{isolation} reader of {topic} did not reach {target} within {timeout}s: end of partition "
                f"reported at {eof}, {len(out)} records read")
            for m in c.consume(num_messages=10_000, timeout=0.2):
                err = m.error()
                if err is not None and err.code() == KafkaError._PARTITION_EOF:
                    eof[m.partition()] = m.offset()
                    continue
                assert err is None, f"{isolation} reader of {topic}: {err}"
                out.append((m.partition(), m.offset(), m.key(), m.value()))
        return out
    finally:
        c.close()


def counts_by_word(records: list) -> dict[str, list[int]]:
    seqs: dict[str, list[int]] = collections.defaultdict(list)
    for _, _, key, value in sorted(records, key=lambda r: (r[0], r[1])):
        assert value is not None and len(value) == 8, f"output value of {key!r} is not a long: {value!r}"
        seqs[key.decode()].append(struct.unpack(">q", value)[0])
    return seqs


def check_counts(seqs: dict[str, list[int]], expected: collections.Counter, what: str) -> None:
    """Each word's counts are exactly 1..N, N its number of occurrences."""
    bad = {w: (expected.get(w, 0), s[:5] + ["..."] + s[-5:] if len(s) > 10 else s)
           for w, s in seqs.items() if s != list(range(1, expected.get(w, 0) + 1))}
    missing = sorted(set(expected) - set(seqs))
    assert not bad and not missing, (
        f"{what}: {len(bad)} words with wrong count sequences (word: (expected N, counts seen)), e.g. "
        f"{dict(list(bad.items())[:5])}; missing words {missing[:10]}")


class OutputWatcher:
    """A read_committed reader of the output, following it while the application runs: every
    word's counts must arrive as 1, 2, 3, .. (checked record by record)."""

    def __init__(self, bootstrap: str, topic: str):
        self.c = Consumer(client_conf(bootstrap, **{
            "group.id": unique("watcher"), "isolation.level": "read_committed", "enable.auto.commit": False,
            "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100}))
        self.c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        self.latest: dict[str, int] = {}
        self.records = 0

    def wait_for(self, expected: collections.Counter, timeout: float, app: "StreamsApp") -> None:
        deadline = time.monotonic() + timeout
        while any(self.latest.get(w) != n for w, n in expected.items()):
            why = ("the application exited" if app.proc.proc.poll() is not None
                   else "a stream thread died" if app.proc.seen("UNCAUGHT")
                   else f"not within {timeout}s" if time.monotonic() > deadline else None)
            if why is not None:
                behind = {w: (self.latest.get(w), n) for w, n in expected.items() if self.latest.get(w) != n}
                app.stop()
                raise AssertionError(
                    f"the output did not reach the expected counts ({why}): {len(behind)} words behind "
                    f"(word: (latest count, expected)), e.g. {dict(list(behind.items())[:5])}; "
                    f"{self.records} records read\n{app.report()}")
            for m in self.c.consume(num_messages=10_000, timeout=0.2):
                err = m.error()
                if err is not None:
                    # A restarting broker is retried by the client; anything else is a failure.
                    assert err.retriable() or err.code() in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN), err
                    continue
                self.records += 1
                word, count = m.key().decode(), struct.unpack(">q", m.value())[0]
                # Each word's counts come in order, one by one: fail at once on anything else
                # (a count repeated or skipped never heals).
                if count != self.latest.get(word, 0) + 1:
                    app.stop()
                    raise AssertionError(
                        f"read_committed output: {word!r} counted {count} after {self.latest.get(word, 0)} "
                        f"(partition {m.partition()} offset {m.offset()}; {expected.get(word, 0)} occurrences in "
                        f"the input)\n{app.report()}")
                self.latest[word] = count

    def close(self):
        self.c.close()


class StreamsApp:
    """One JVM running StreamsWordCount; `broker` only for failure reports. Its stdout and stderr
    are kept in `log_path` once it ended (see `stop`)."""

    def __init__(self, java_cp: str, broker, app_id: str, store: str, state_dir, log_path,
                 guarantee: str = "exactly_once_v2"):
        self.broker = broker
        self.log_path = log_path
        self.proc = JavaProcess(java_cp, "sluice.tests.StreamsWordCount", [
            "--bootstrap", broker.bootstrap, "--application-id", app_id, "--input", "in", "--output", "out",
            "--store", store, "--state-dir", str(state_dir), "--guarantee", guarantee, "--throttle-ms", THROTTLE_MS,
            # Purge the repartition topic (DeleteRecords up to the committed offsets) every second,
            # not every 30 s, so that it happens during the test.
            "--props", "repartition.purge.interval.ms=1000",
        ], stdin=True)

    def stop(self) -> None:
        """SIGKILL if still running (the crash path when called first); keeps the output."""
        self.proc.kill()
        self.log_path.write_text(self.proc.result().report(tail=10**7))

    def report(self) -> str:
        return f"{self.proc.result().report()}\n--- broker log (tail) ---\n{self.broker.log()[-6000:]}"

    def wait_for(self, prefix: str, timeout: float) -> None:
        """Until the application printed a line starting with `prefix` (at any time: with the
        state updater, tasks restored early process while the client still says REBALANCING)."""
        deadline = time.monotonic() + timeout
        while not self.proc.seen(prefix):
            if self.proc.seen("UNCAUGHT") or self.proc.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"no line {prefix!r} from the application within {timeout}s\n{self.report()}")
            time.sleep(0.01)

    def wait_for_words(self, words: int, timeout: float) -> None:
        """Until this JVM has counted `words` words (committed or not)."""
        self.wait_for(f"COUNTED words={words}", timeout)

    def close(self, timeout: float = 60) -> None:
        self.proc.send("close")
        self.proc.wait_for_line("CLOSED", timeout)
        res = self.proc.wait(10)
        assert res.returncode == 0 and not self.proc.seen("UNCAUGHT"), f"unclean close\n{self.report()}"


# With exactly_once_v2 a killed application wipes its local stores and restores them from the
# changelog whatever the store, so the in-memory variant runs in the slow tier only.
SLOW = os.environ.get("SLUICE_SLOW_TESTS") == "1"


@pytest.mark.parametrize("store", [
    "rocksdb",
    pytest.param("memory", marks=pytest.mark.skipif(not SLOW, reason="slow tier: SLUICE_SLOW_TESTS=1")),
])
def test_streams_exactly_once_word_count_survives_kill_9(broker_factory, java_cp, tmp_path, store):
    """Word count with exactly_once_v2 over three rounds of input; the application is SIGKILLed
    mid-stream and restarted, then the broker is SIGKILLed mid-stream and restarted. The
    read_committed output holds exactly the counts 1..N of every word, the changelog is
    compacted and ends at the same counts.

    With RocksDB the restarted application has the same process id (kept in its state dir), so
    the same transactional.id, and its InitProducerId aborts the dead one's transaction; the
    store is rebuilt from the changelog (no checkpoint under EOS after a crash). With the
    in-memory store the process id is new: the dead transaction holds the changelog's last
    stable offset, so the restore, until the broker aborts it at its transaction.timeout.ms
    (10 s, Streams' default under EOS)."""
    broker = broker_factory(BROKER_ARGS)
    app_id = unique("wordcount")
    state_dir = tmp_path / "streams-state"
    create_topic(broker.bootstrap, "in", PARTITIONS)
    create_topic(broker.bootstrap, "out", PARTITIONS)
    rounds = make_rounds(seed=20240917)
    expected = collections.Counter(w for r in rounds for line in r for w in line.split())

    produce_lines(broker.bootstrap, "in", rounds[0], 0)
    app = StreamsApp(java_cp, broker, app_id, store, state_dir, tmp_path / "app-1.log")
    try:
        app.wait_for("STATE RUNNING", 60)
        app.wait_for_words(1500, 60)
    finally:
        app.stop()  # SIGKILL mid-stream: its open transaction is never ended by it

    produce_lines(broker.bootstrap, "in", rounds[1], LINES_PER_ROUND)
    app = StreamsApp(java_cp, broker, app_id, store, state_dir, tmp_path / "app-2.log")
    watcher = None
    try:
        app.wait_for("STATE RUNNING", 60)
        app.wait_for_words(1000, 60)
        broker.kill()  # SIGKILL mid-stream, while the application runs on
        broker.start()
        produce_lines(broker.bootstrap, "in", rounds[2], 2 * LINES_PER_ROUND)
        watcher = OutputWatcher(broker.bootstrap, "out")
        watcher.wait_for(expected, 90, app)
        app.close()
    finally:
        app.stop()
        if watcher is not None:
            watcher.close()

    # The application closed cleanly, so nothing is left open: the last stable offset is the end.
    hw = list_offsets(broker.bootstrap, "out", PARTITIONS, IsolationLevel.READ_UNCOMMITTED)
    lso = list_offsets(broker.bootstrap, "out", PARTITIONS, IsolationLevel.READ_COMMITTED)
    assert hw == lso, f"a transaction is still open on out: high watermarks {hw}, last stable offsets {lso}"
    committed = read_topic(broker.bootstrap, "out", PARTITIONS, "read_committed")
    check_counts(counts_by_word(committed), expected, "read_committed output")
    assert len(committed) == sum(expected.values())
    # What the kills left behind: records of aborted transactions, skipped by read_committed.
    # The kills landed mid-transaction (else this test would prove less than it says): the
    # output holds records of aborted transactions, which read_committed skipped.
    uncommitted = read_topic(broker.bootstrap, "out", PARTITIONS, "read_uncommitted")
    assert len(uncommitted) > len(committed), "no aborted output: the kills did not land mid-transaction"

    changelog = f"{app_id}-counts-changelog"
    repartition = f"{app_id}-words-repartition"
    admin = admin_client(broker.bootstrap)
    topics = admin.list_topics(timeout=10).topics
    assert changelog in topics and repartition in topics, f"internal topics missing: {sorted(topics)}"
    res = ConfigResource(ResourceType.TOPIC, changelog)
    cfg = admin.describe_configs([res], request_timeout=10)[res].result(10)
    assert cfg["cleanup.policy"].value == "compact", f"{changelog}: cleanup.policy={cfg['cleanup.policy'].value}"
    res = ConfigResource(ResourceType.TOPIC, repartition)
    cfg = admin.describe_configs([res], request_timeout=10)[res].result(10)
    assert cfg["cleanup.policy"].value == "delete", f"{repartition}: cleanup.policy={cfg['cleanup.policy'].value}"

    # Streams purged what it consumed of the repartition topic (DeleteRecords).
    for p in range(PARTITIONS):
        low, high = watermarks(broker.bootstrap, repartition, p)
        assert 0 < low <= high, f"{repartition}-{p} not purged: log start {low}, high watermark {high}"

    # The changelog (what a restarted instance restores the store from) ends at the final counts.
    parts = len(topics[changelog].partitions)
    final: dict[str, int] = {}
    for _, _, key, value in sorted(read_topic(broker.bootstrap, changelog, parts, "read_committed"),
                                   key=lambda r: (r[0], r[1])):
        final[key.decode()] = struct.unpack(">q", value)[0]
    assert final == dict(expected), f"changelog's last counts differ from the input's: {final} vs {dict(expected)}"
