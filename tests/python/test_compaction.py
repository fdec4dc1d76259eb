"""Log compaction (`cleanup.policy=compact`), as a Kafka user sees it from real clients
against a real `sluice serve`:

* after the cleaner has run, a consumer reading a compacted partition from the beginning
  sees each key once, with its latest value, at the offset that write was acknowledged at
  (offset gaps where older records were), and tombstoned keys are gone once
  `delete.retention.ms` has passed. The data is partly lz4- and zstd-compressed, so the
  cleaner has to rewrite compressed batches;
* Kafka's own tools (kafka-topics, kafka-configs) create and alter compacted topics, and an
  invalid `cleanup.policy` is refused;
* a record without a key is refused with INVALID_RECORD on a compacted topic (compressed or
  not); keyed records are accepted;
* `kill -9` while the cleaner is rewriting segments loses nothing and duplicates nothing,
  and the log ends up fully compacted after the restart;
* a follower that was down while its leader compacted catches up by fetching the compacted
  log (with its offset gaps), and holds the same data when it becomes the leader.

The cleaner only touches sealed segments, and a segment is sealed by the first append after
`segment.ms`: each test therefore waits `segment.ms` after its load and writes one more
record (the sentinel, under its own key), so that all the load is cleanable. Reads always
go up to the sentinel's offset.
"""

import os
import re
import time
import uuid
from collections import Counter

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from cluster_support import Cluster, create_topic
from java_support import tools_cp  # noqa: F401  (tools_cp is a fixture)
from test_kafka_tools import CONFIG_COMMAND, describe, tool, topics

SENTINEL_KEY = "sentinel"
SENTINEL_VALUE = "sentinel:end"


# ----------------------------------------------------------------------------- helpers


def broker_override(*settings):
    """`--override k=v` arguments for `sluice serve`."""
    return [arg for setting in settings for arg in ("--override", setting)]


def make_topic(bootstrap, topic, config, partitions=1):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, config=config)]).values():
        future.result(timeout=15)


class Writes:
    """Produces keyed records in order (an idempotent acks=all producer per call, so order
    holds within a call, and calls run one after another) and remembers, per key, the
    offset its latest acknowledged write got."""

    def __init__(self, bootstrap, topic):
        self.bootstrap, self.topic = bootstrap, topic
        self.acked_at: dict[str, int] = {}
        self.errors: list = []
        self.count = 0

    def _on_delivery(self, err, msg):
        if err is not None:
            self.errors.append(err)
        else:
            # Delivery reports of one partition come in offset order.
            self.acked_at[msg.key().decode()] = msg.offset()

    def send(self, items, compression="none"):
        """`items`: (key, value) pairs, value None for a tombstone."""
        producer = Producer({
            "bootstrap.servers": self.bootstrap, "enable.idempotence": True, "acks": "all",
            "compression.type": compression, "linger.ms": 20, "batch.num.messages": 10000,
            "queue.buffering.max.messages": 500000, "queue.buffering.max.kbytes": 1048576,
            "message.timeout.ms": 120000, "on_delivery": self._on_delivery,
        })
        for n, (key, value) in enumerate(items):
            while True:
                try:
                    producer.produce(self.topic, None if value is None else value.encode(), key.encode(), partition=0)
                    break
                except BufferError:
                    producer.poll(0.05)
            if n % 10000 == 0:
                producer.poll(0)
            self.count += 1
        remaining = producer.flush(120)
        assert remaining == 0, f"{remaining} records not acknowledged within 120 s"
        assert not self.errors, f"{len(self.errors)} writes failed, e.g. {self.errors[:3]}"

    def sentinel(self):
        """Writes the sentinel record (it seals the segment before it); returns its offset."""
        self.send([(SENTINEL_KEY, SENTINEL_VALUE)])
        return self.acked_at[SENTINEL_KEY]


def read_log(bootstrap, topic, until_offset, limit=None, timeout=60.0):
    """Reads partition 0 of `topic` from its beginning through `until_offset` with a fresh
    consumer; returns ([(offset, key, value)], reached). Gives up early (reached False) once
    it holds more than `limit` records, or after `timeout`."""
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"compaction-check-{uuid.uuid4().hex}",
        "enable.auto.commit": False, "fetch.wait.max.ms": 100, "topic.metadata.refresh.interval.ms": 1000,
    })
    records = []
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for msg in consumer.consume(10000, 0.5):
                if msg.error():
                    continue
                key, value = msg.key(), msg.value()
                records.append((msg.offset(), key and key.decode(), None if value is None else value.decode()))
                if msg.offset() >= until_offset:
                    return records, True
            if limit is not None and len(records) > limit:
                return records, False
        return records, False
    finally:
        consumer.close()


def sample(items, n=3):
    return sorted(items)[:n]


def mismatch(records, reached, expected, acked_at, compacted=True):
    """What a read up to the sentinel shows that it should not, as one line; None if all is
    right. `expected`: {key: latest value} of every key that must be there (None = a
    tombstone that must still be there). Always: offsets strictly increase, every record's
    value belongs to its key, every expected key's last record is its latest write at the
    offset it was acknowledged at, no other key is there. With `compacted`, also: each key
    exactly once (nothing older than its latest write is left)."""
    problems = []
    if not reached:
        problems.append(f"the read stopped after {len(records)} records without reaching the sentinel "
                        f"(more records before it than keys: not compacted yet? or a timeout)")
    offsets = [o for o, _, _ in records]
    backwards = [(a, b) for a, b in zip(offsets, offsets[1:]) if b <= a]
    if backwards:
        problems.append(f"offsets not strictly increasing at {backwards[:3]}")
    garbled = [(o, k, v) for o, k, v in records if k is None or (v is not None and not v.startswith(k + ":"))]
    if garbled:
        problems.append(f"{len(garbled)} records whose value is not their key's, e.g. {garbled[:3]}")
    if not reached:
        return "; ".join(problems)
    last = {}
    for o, k, v in records:
        last[k] = (o, v)
    missing = set(expected) - set(last)
    if missing:
        problems.append(f"{len(missing)} keys missing, e.g. {sample(missing)}")
    extra = set(last) - set(expected)
    if extra:
        tombstones = {k for k in extra if last[k][1] is None}
        problems.append(f"{len(extra)} keys that should be gone ({len(tombstones)} as tombstones), "
                        f"e.g. {[(k, last[k]) for k in sample(extra)]}")
    stale = {k for k in set(expected) & set(last) if last[k][1] != expected[k]}
    if stale:
        problems.append(f"{len(stale)} keys whose last value is not their latest, e.g. "
                        f"{[(k, last[k][1], expected[k]) for k in sample(stale)]}")
    moved = {k for k in set(expected) & set(last) if last[k][0] != acked_at[k]}
    if moved:
        problems.append(f"{len(moved)} keys whose latest record is not at the offset it was acknowledged at, e.g. "
                        f"{[(k, last[k][0], acked_at[k]) for k in sample(moved)]}")
    if compacted:
        repeated = {k: n for k, n in Counter(k for _, k, _ in records).items() if n > 1}
        if repeated:
            problems.append(f"{len(repeated)} keys more than once (not compacted yet?), e.g. "
                            f"{[(k, repeated[k]) for k in sample(repeated)]}")
    return "; ".join(problems) or None


def wait_compacted(bootstrap, topic, sentinel_offset, expected, acked_at, timeout, log=lambda: ""):
    """Reads the partition again and again until it is exactly `expected` (plus the sentinel),
    each key once; returns that read. Fails with the last mismatch after `timeout`."""
    expected = {**expected, SENTINEL_KEY: SENTINEL_VALUE}
    deadline = time.monotonic() + timeout
    while True:
        records, reached = read_log(bootstrap, topic, sentinel_offset, limit=len(expected), timeout=30)
        problem = mismatch(records, reached, expected, acked_at)
        if problem is None:
            return records
        assert time.monotonic() < deadline, (
            f"the log was not compacted within {timeout} s; last read: {problem}\n--- broker log (tail) ---\n"
            f"{log()[-4000:]}")
        time.sleep(1.0)


def partition_files(part_dir):
    """{name: inode} of a partition directory's entries."""
    return {entry.name: entry.inode() for entry in os.scandir(part_dir)}


def wait_for_cleaner_writes(part_dir, timeout):
    """Waits until the cleaner starts changing the partition directory: an entry appears or
    goes, or a sealed segment's file is replaced (new inode). The active segment's files
    (the highest base offset) are left out: the broker may touch them on its own. Returns
    the change seen."""
    baseline = partition_files(part_dir)
    bases = [name.split(".")[0] for name in baseline if re.fullmatch(r"\d{20}\.log", name)]
    assert bases, f"no segment files in {part_dir}: {sorted(baseline)}"
    active = max(bases)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = partition_files(part_dir)
        appeared, gone = set(now) - set(baseline), set(baseline) - set(now)
        replaced = {name for name in set(now) & set(baseline)
                    if now[name] != baseline[name] and re.fullmatch(r"\d{20}\.(log|index)", name)
                    and not name.startswith(active)}
        if appeared or gone or replaced:
            return f"appeared {sorted(appeared)[:5]}, gone {sorted(gone)[:5]}, replaced {sorted(replaced)[:5]}"
        time.sleep(0.02)
    return None


# ----------------------------------------------------------------------------- tests


def test_compacted_topic_keeps_the_latest_value_per_key(broker_factory):
    """1,000,000 records over 10,000 keys (lz4-compressed, then uncompressed), tombstones for
    every 10th key and a few more updates (zstd): once cleaned, a consumer sees each live
    key once with its latest value, no tombstones, and nothing else but the sentinel."""
    broker = broker_factory(extra_args=broker_override("log.cleaner.backoff.ms=200"))
    topic = "compacted-latest"
    segment_ms = 2000
    make_topic(broker.bootstrap, topic, {
        "cleanup.policy": "compact", "segment.bytes": "1048576", "segment.ms": str(segment_ms),
        "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "1000",
    })
    keys = [f"k{i:05d}" for i in range(10_000)]
    rounds = 100
    latest: dict[str, str | None] = {}

    def load(items):
        for key, value in items:
            latest[key] = value
            yield key, value

    writes = Writes(broker.bootstrap, topic)
    writes.send(load((k, f"{k}:{r}") for r in range(rounds // 2) for k in keys), compression="lz4")
    writes.send(load((k, f"{k}:{r}") for r in range(rounds // 2, rounds) for k in keys))
    tombstoned = keys[::10]
    updates = [(k, None) for k in tombstoned]
    updates += [(k, f"{k}:revived") for k in keys[::20]]  # written again after their tombstone
    updates += [(k, f"{k}:final-{n}") for k in keys[::7] for n in (1, 2)]  # twice, close together
    writes.send(load(updates), compression="zstd")
    assert writes.count == len(keys) * rounds + len(updates)

    time.sleep(segment_ms / 1000 + 0.5)
    sentinel = writes.sentinel()
    live = {k: v for k, v in latest.items() if v is not None}
    assert len(keys) - len(live) > 400, "the load should leave hundreds of keys deleted"

    records = wait_compacted(broker.bootstrap, topic, sentinel, live, writes.acked_at, timeout=60, log=broker.log)
    assert len(records) == len(live) + 1, (len(records), len(live))
    assert records[-1][0] == sentinel
    assert broker.is_running()


def test_kafka_topics_creates_a_compacted_topic(broker, tools_cp):  # noqa: F811
    """kafka-topics --create --config cleanup.policy=compact ...; --describe shows the
    configs; kafka-configs --alter sets cleanup.policy=[compact,delete]; an unknown policy
    is refused by both tools and changes nothing."""
    cp = tools_cp
    topic = "compacted-tool"

    def configs(*args, ok=True):
        return tool(cp, broker, CONFIG_COMMAND, "--bootstrap-server", broker.bootstrap, *args, ok=ok)

    def overrides():
        res = configs("--describe", "--entity-type", "topics", "--entity-name", topic)
        return dict(re.findall(r"^\s+([\w.]+)=(\S*) sensitive=", res.stdout, re.M)), res

    res = topics(cp, broker, "--create", "--topic", topic, "--partitions", "1", "--replication-factor", "1",
                 "--config", "cleanup.policy=compact", "--config", "min.cleanable.dirty.ratio=0.1")
    assert f"Created topic {topic}." in res.stdout, res.report()

    head, parts, res = describe(cp, broker, topic)
    described = dict(kv.split("=", 1) for kv in head.get("Configs", "").split(",") if "=" in kv)
    assert described.get("cleanup.policy") == "compact", res.report()
    assert float(described.get("min.cleanable.dirty.ratio", "nan")) == 0.1, res.report()
    assert len(parts) == 1, res.report()

    res = configs("--alter", "--entity-type", "topics", "--entity-name", topic,
                  "--add-config", "cleanup.policy=[compact,delete]")
    assert f"Completed updating config for topic {topic}." in res.stdout, res.report()
    got, res = overrides()
    assert got.get("cleanup.policy") == "compact,delete", res.report()
    assert float(got.get("min.cleanable.dirty.ratio", "nan")) == 0.1, res.report()

    bad = configs("--alter", "--entity-type", "topics", "--entity-name", topic,
                  "--add-config", "cleanup.policy=shrink", ok=False)
    assert bad.returncode != 0, f"cleanup.policy=shrink was accepted\n{bad.report()}"
    after, res = overrides()
    assert after == got, f"a refused alter changed the configs: {after} != {got}\n{res.report()}"

    bad = topics(cp, broker, "--create", "--topic", "shrinking", "--partitions", "1",
                 "--config", "cleanup.policy=shrink", ok=False)
    assert bad.returncode != 0, f"a topic with cleanup.policy=shrink was created\n{bad.report()}"
    listed = topics(cp, broker, "--list")
    assert "shrinking" not in listed.stdout.split(), listed.report()
    assert broker.is_running()


def test_a_record_without_a_key_is_refused_on_a_compacted_topic(broker):
    """Keyless records (plain or lz4-compressed, with a value or null) to a compacted topic
    fail with INVALID_RECORD; keyed records to it and keyless ones to a delete-policy topic
    succeed, and a consumer of the compacted topic sees only the keyed records."""
    make_topic(broker.bootstrap, "keyed-only", {"cleanup.policy": "compact"})
    make_topic(broker.bootstrap, "anything-goes", {"cleanup.policy": "delete"})
    outcomes = []

    def send(producer, topic, key, value):
        """Produces one record alone in its batch; returns (error, offset)."""
        got = []
        producer.produce(topic, value, key, partition=0, on_delivery=lambda err, msg: got.append((err, msg.offset())))
        assert producer.flush(30) == 0, "no delivery report within 30 s"
        outcomes.append((topic, key, value, got[0]))
        return got[0]

    keyed = []
    for compression in ("none", "lz4"):
        producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 0,
                             "compression.type": compression, "message.timeout.ms": 20000})
        for value in (f"no key ({compression})".encode(), None):
            err, _ = send(producer, "keyed-only", None, value)
            assert err is not None and err.code() == KafkaError.INVALID_RECORD, (
                f"a keyless record ({compression}, value {value!r}) to a compacted topic: {err!r}, "
                f"expected INVALID_RECORD")
        err, offset = send(producer, "keyed-only", f"key-{compression}".encode(), f"key-{compression}:v".encode())
        assert err is None, f"a keyed record ({compression}) to a compacted topic failed: {err!r}"
        keyed.append((offset, f"key-{compression}", f"key-{compression}:v"))
        err, _ = send(producer, "anything-goes", None, b"no key, no compaction")
        assert err is None, f"a keyless record ({compression}) to a delete-policy topic failed: {err!r}"

    records, reached = read_log(broker.bootstrap, "keyed-only", keyed[-1][0], timeout=20)
    assert reached, f"the keyed records were not read back: {records}"
    assert records == keyed, f"the compacted topic holds {records}, expected only {keyed}; sent: {outcomes}"
    assert broker.is_running()


def test_kill_9_mid_cleaning_loses_nothing(broker_factory):
    """300,000 records (3,000 keys x 100 rounds, 100-byte values, ~35 MB) written with the
    cleaner off; restarted with a cleaner throttled to 3 MB/s, the broker is killed with
    SIGKILL a second after the cleaner starts changing the partition's files. Restarted with the
    cleaner off, the log reads back with strictly increasing offsets and every key's latest
    value at its acknowledged offset; restarted with the cleaner on, it ends up fully
    compacted."""
    no_cleaner = broker_override("log.cleaner.enable=false")
    throttled = broker_override("log.cleaner.backoff.ms=100", "log.cleaner.io.max.bytes.per.second=3000000")
    broker = broker_factory(extra_args=no_cleaner)
    topic = "crash-compaction"
    segment_ms = 1000
    make_topic(broker.bootstrap, topic, {
        "cleanup.policy": "compact", "segment.bytes": "1048576", "segment.ms": str(segment_ms),
        "min.cleanable.dirty.ratio": "0.01",
    })
    keys = [f"k{i:04d}" for i in range(3000)]
    rounds = 100
    writes = Writes(broker.bootstrap, topic)
    writes.send((k, f"{k}:{r}:".ljust(100, ".")) for r in range(rounds) for k in keys)
    latest = {k: f"{k}:{rounds - 1}:".ljust(100, ".") for k in keys}
    time.sleep(segment_ms / 1000 + 0.3)
    sentinel = writes.sentinel()
    produced = writes.count

    broker.stop()
    broker.extra_args = throttled
    broker.start()
    part_dir = next(broker.data_dir.rglob(f"{topic}-0"))  # Kafka's name for a partition's directory
    time.sleep(0.3)  # whatever the broker writes as it opens the log is not the cleaner's
    change = wait_for_cleaner_writes(part_dir, timeout=60)
    assert change is not None, (
        f"the cleaner changed nothing in {part_dir} within 60 s (was it already done, with "
        f"log.cleaner.enable=false ignored?)\n--- broker log (tail) ---\n{broker.log()[-4000:]}")
    time.sleep(1.0)
    broker.kill()
    print(f"killed the broker 1 s after the cleaner's first change: {change}")

    # What the crash left, read with the cleaner off so nothing changes under the read.
    broker.extra_args = no_cleaner
    broker.start()
    expected = {**latest, SENTINEL_KEY: SENTINEL_VALUE}
    records, reached = read_log(broker.bootstrap, topic, sentinel, timeout=90)
    problem = mismatch(records, reached, expected, writes.acked_at, compacted=False)
    assert problem is None, f"after kill -9 mid-cleaning: {problem}\n--- broker log (tail) ---\n{broker.log()[-4000:]}"
    print(f"after the crash: {len(records)} records of {produced} written, {len(expected)} keys")
    assert len(records) > len(expected), (
        "the log was already fully compacted when the broker was killed: the kill did not come "
        "mid-cleaning (the cleaner is faster than log.cleaner.io.max.bytes.per.second allows?)")

    broker.stop()
    broker.extra_args = broker_override("log.cleaner.backoff.ms=100")
    broker.start()
    records = wait_compacted(broker.bootstrap, topic, sentinel, latest, writes.acked_at, timeout=60, log=broker.log)
    assert len(records) == len(keys) + 1
    assert broker.is_running()


def test_followers_replicate_a_compacted_log(tmp_path):
    """3 nodes, a compacted topic with RF 3. With one follower down, the leader takes
    40,000 records (and tombstones, kept: delete.retention.ms is an hour) and compacts
    them; the follower comes back and catches up from the compacted log. Then it is made the
    leader (the other follower is killed, then the old leader, while the other follower
    restarts to keep the controller quorum): a consumer reads from it exactly what the old
    leader served, each key once with its latest value, at the same offsets."""
    cluster = Cluster(tmp_path, node_args=lambda node_id, port: broker_override("log.cleaner.backoff.ms=200"))
    cluster.start()
    try:
        topic = "compacted-replicas"
        segment_ms = 1000
        create_topic(cluster, topic, 1, {
            "cleanup.policy": "compact", "segment.bytes": "262144", "segment.ms": str(segment_ms),
            "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "3600000",
        })
        leader, replicas, _ = cluster.partition_state(topic, 0)
        lagging, other = [r for r in replicas if r != leader]

        def isr():
            return sorted(cluster.partition_state(topic, 0)[2])

        cluster.nodes[lagging].kill()
        cluster.wait_for(f"node {lagging} out of the ISR", lambda: isr() == sorted([leader, other]))

        keys = [f"k{i:04d}" for i in range(1000)]
        rounds = 40
        writes = Writes(cluster.bootstrap, topic)
        writes.send(((k, f"{k}:{r}:".ljust(100, ".")) for r in range(rounds) for k in keys), compression="lz4")
        tombstoned = keys[::10]
        writes.send((k, None) for k in tombstoned)
        expected = {k: f"{k}:{rounds - 1}:".ljust(100, ".") for k in keys}
        expected.update({k: None for k in tombstoned})
        time.sleep(segment_ms / 1000 + 0.5)
        sentinel = writes.sentinel()

        def logs():
            return "\n".join(f"--- node {i} ---\n{n.log()[-2000:]}" for i, n in cluster.nodes.items())

        served = wait_compacted(cluster.bootstrap, topic, sentinel, expected, writes.acked_at, timeout=60, log=logs)
        assert cluster.partition_state(topic, 0)[0] == leader, "leadership moved while the leader compacted"

        cluster.nodes[lagging].start()
        cluster.wait_for(f"node {lagging} back in the ISR", lambda: isr() == sorted(replicas), timeout=60)

        # Make the caught-up follower the only other ISR member, then lose the leader.
        cluster.nodes[other].kill()
        cluster.wait_for(f"node {other} out of the ISR", lambda: isr() == sorted([leader, lagging]))
        cluster.nodes[leader].kill()
        cluster.nodes[other].start()
        cluster.wait_for(f"node {lagging} leading", lambda: cluster.partition_state(topic, 0)[0] == lagging)

        records = wait_compacted(cluster.bootstrap, topic, sentinel, expected, writes.acked_at, timeout=30, log=logs)
        assert records == served, "the new leader holds other records than the old leader served"
    finally:
        cluster.kill_all()
