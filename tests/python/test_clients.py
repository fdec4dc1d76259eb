"""librdkafka (confluent-kafka) against a real `sluice serve`: produce/consume with every
compression codec, offsets by time, DeleteRecords, topic configs, partitions, deletion and
auto-creation. Consumers assign() partitions explicitly; no consumer groups."""

import threading
import time
import uuid
import warnings

import pytest
from confluent_kafka import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
    ResourceType,
)

import kafka_wire as kw
from kafka_wire import admin_client, consume_until, consumer, create_topic, wait_for_topic, watermarks

CODEC_IDS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
RECORDS_PER_CODEC = 100_000
PARTITIONS = 16
PAD = (b"sluice-" * 40)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def producer(bootstrap: str, **extra) -> Producer:
    conf = {
        "bootstrap.servers": bootstrap,
        "broker.address.family": "v4",
        "acks": "all",
        "linger.ms": 20,
        "batch.size": 1_000_000,
        "queue.buffering.max.messages": 500_000,
        "queue.buffering.max.kbytes": 1_048_576,
    }
    conf.update(extra)
    return Producer(conf)


def value_of(i: int) -> bytes:
    return b"v%08d|" % i + PAD[i % 50 : i % 50 + 60 + i % 40]


def flush_all(p: Producer, timeout: float = 120.0) -> None:
    remaining = p.flush(timeout)
    assert remaining == 0, f"{remaining} messages still undelivered after {timeout}s"


# ---------------------------------------------------------------- produce/consume per codec

@pytest.mark.parametrize("codec", list(CODEC_IDS))
def test_produce_consume_100k_per_codec(broker, codec):
    topic = unique(f"codec-{codec}")
    create_topic(broker.bootstrap, topic, PARTITIONS)
    base_ts = int(time.time() * 1000) - 10_000_000

    delivered: list = [None] * RECORDS_PER_CODEC
    errors: list = []

    def on_delivery(err, msg):
        i = int(msg.key()[1:])
        if err is not None:
            errors.append((i, err))
        else:
            delivered[i] = (msg.partition(), msg.offset())

    # Idempotence makes per-partition order a guarantee even if a batch is retried.
    p = producer(broker.bootstrap, **{"compression.type": codec, "enable.idempotence": True})
    t0 = time.monotonic()
    for i in range(RECORDS_PER_CODEC):
        while True:
            try:
                p.produce(
                    topic,
                    key=b"k%d" % i,
                    value=value_of(i),
                    headers=[("idx", b"%d" % i), ("codec", codec.encode()), ("empty", None)],
                    timestamp=base_ts + i,
                    on_delivery=on_delivery,
                )
                break
            except BufferError:
                p.poll(0.05)
        if i % 5000 == 0:
            p.poll(0)
    flush_all(p)
    produce_s = time.monotonic() - t0
    assert not errors, f"{len(errors)} delivery errors, first: {errors[:3]}"
    assert all(d is not None for d in delivered), "some records got no delivery report"

    # What the producer was told, per partition: offsets must be dense from 0, in produce order.
    expected: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    for i, (part, off) in enumerate(delivered):
        expected[part].append(i)
    for part, idxs in expected.items():
        offs = [delivered[i][1] for i in idxs]
        assert offs == list(range(len(idxs))), f"partition {part}: acknowledged offsets not 0..{len(idxs) - 1} in produce order"
    assert sum(1 for v in expected.values() if v) == PARTITIONS, "keyed records should spread over all 16 partitions"

    for part in range(PARTITIONS):
        assert watermarks(broker.bootstrap, topic, part) == (0, len(expected[part]))

    t1 = time.monotonic()
    got = consume_until(broker.bootstrap, topic, {part: len(expected[part]) for part in range(PARTITIONS)}, timeout=120)
    consume_s = time.monotonic() - t1
    total = 0
    for part in range(PARTITIONS):
        msgs = got[part]
        assert len(msgs) == len(expected[part]), f"partition {part}: read {len(msgs)}, produced {len(expected[part])}"
        for off, (m, i) in enumerate(zip(msgs, expected[part])):
            assert m.offset() == off
            assert m.key() == b"k%d" % i, f"p{part}@{off}: key {m.key()!r}, expected k{i}"
            assert m.value() == value_of(i), f"p{part}@{off}: value mismatch for record {i}"
            assert m.headers() == [("idx", b"%d" % i), ("codec", codec.encode()), ("empty", None)], f"p{part}@{off}: headers {m.headers()}"
            assert m.timestamp() == (TIMESTAMP_CREATE_TIME, base_ts + i), f"p{part}@{off}: timestamp {m.timestamp()}"
        total += len(msgs)
    assert total == RECORDS_PER_CODEC

    # The broker stores what the client sent: the batch on the wire still carries the codec and
    # the client's CRC32C.
    with kw.Conn.to(broker.bootstrap) as c:
        err, hw, _lso, data = c.fetch(topic, 0, 0, max_bytes=4 << 20)
        assert err == 0 and hw == len(expected[0])
        batches = kw.parse_batches(data)
        assert batches, "raw fetch returned no complete batch"
        for b in batches:
            assert b.magic == 2 and b.crc_ok, f"batch at {b.base_offset}: magic {b.magic}, crc ok {b.crc_ok}"
            assert b.compression == CODEC_IDS[codec], f"batch at {b.base_offset} has codec {b.compression}, producer used {codec}"
    print(f"{codec}: produced {RECORDS_PER_CODEC} in {produce_s:.1f}s, consumed in {consume_s:.1f}s")


# ---------------------------------------------------------------- offsets

def produce_sync(bootstrap: str, topic: str, items, **extra) -> list[tuple[int, int]]:
    """Produces (partition, key, value, timestamp) items one batch per call; returns [(partition, offset)]."""
    p = producer(bootstrap, **{"linger.ms": 0, **extra})
    out: list = []
    errs: list = []

    def cb(err, msg):
        if err:
            errs.append(err)
        else:
            out.append((msg.partition(), msg.offset()))

    for part, key, value, ts in items:
        kwargs = {"partition": part, "key": key, "value": value, "on_delivery": cb}
        if ts is not None:
            kwargs["timestamp"] = ts
        p.produce(topic, **kwargs)
    flush_all(p, 30)
    assert not errs, errs
    return out


def test_offsets_for_times_and_watermarks(broker):
    topic = unique("times")
    create_topic(broker.bootstrap, topic, 2)
    base = int(time.time() * 1000) - 3_600_000
    # 100 records on partition 0 spread over 10 produce calls (so over several batches),
    # timestamps 1 s apart; partition 1 stays empty.
    for chunk in range(10):
        produce_sync(broker.bootstrap, topic, [(0, b"k", b"%d" % i, base + 1000 * i) for i in range(chunk * 10, chunk * 10 + 10)])

    assert watermarks(broker.bootstrap, topic, 0) == (0, 100)
    assert watermarks(broker.bootstrap, topic, 1) == (0, 0)

    c = consumer(broker.bootstrap)
    try:
        def at(ts, part=0):
            (tp,) = c.offsets_for_times([TopicPartition(topic, part, ts)], timeout=10)
            assert tp.error is None, tp.error
            return tp.offset

        assert at(base - 5000) == 0
        assert at(base) == 0
        assert at(base + 37_000) == 37
        assert at(base + 37_001) == 38
        assert at(base + 99_000) == 99
        assert at(base + 99_001) == -1, "no record at or after the timestamp: offset -1"
        assert at(base, part=1) == -1
    finally:
        c.close()

    # The same through the admin ListOffsets API, including the max-timestamp spec.
    a = admin_client(broker.bootstrap)
    tp = TopicPartition(topic, 0)

    def list_offset(spec):
        res = a.list_offsets({tp: spec}, request_timeout=10)[tp].result(10)
        return res.offset, res.timestamp

    assert list_offset(OffsetSpec.earliest())[0] == 0
    assert list_offset(OffsetSpec.latest())[0] == 100
    assert list_offset(OffsetSpec.for_timestamp(base + 50_000)) == (50, base + 50_000)

    # An out-of-order timestamp in the middle: max_timestamp finds its offset.
    produce_sync(broker.bootstrap, topic, [(0, b"k", b"late-max", base + 500_000), (0, b"k", b"after", base + 200_000)])
    assert list_offset(OffsetSpec.max_timestamp()) == (100, base + 500_000)
    assert list_offset(OffsetSpec.for_timestamp(base + 150_000))[0] == 100


def test_log_append_time_topic_stamps_the_brokers_time(broker):
    """message.timestamp.type=LogAppendTime: whatever timestamp the producer sets, the producer's
    delivery report and every consumer see the broker's append time, and ListOffsets by
    timestamp goes by it; a CreateTime topic keeps the producer's."""
    topic = unique("logappend")
    create_topic(broker.bootstrap, topic, 1, {"message.timestamp.type": "LogAppendTime"})
    a = admin_client(broker.bootstrap)
    assert describe(a, topic)["message.timestamp.type"].value == "LogAppendTime"
    old = 1_000_000  # 1970: far outside any timestamp bound, ignored on this topic
    before = int(time.time() * 1000)
    p = producer(broker.bootstrap, **{"linger.ms": 0})
    reports: list = []
    for i in range(3):
        p.produce(topic, partition=0, value=b"%d" % i, timestamp=old + i, on_delivery=lambda err, msg: reports.append((err, msg.timestamp())))
    flush_all(p, 30)
    after = int(time.time() * 1000)
    for err, (ts_type, ts) in reports:
        assert err is None, err
        assert ts_type == TIMESTAMP_LOG_APPEND_TIME and before <= ts <= after, (ts_type, ts, before, after)

    got = consume_until(broker.bootstrap, topic, {0: 3})[0]
    stamps = [m.timestamp() for m in got]
    for ts_type, ts in stamps:
        assert ts_type == TIMESTAMP_LOG_APPEND_TIME and before <= ts <= after, (stamps, before, after)
    assert [m.value() for m in got] == [b"0", b"1", b"2"], "records are delivered as sent"

    c = consumer(broker.bootstrap)
    try:
        (tp,) = c.offsets_for_times([TopicPartition(topic, 0, before)], timeout=10)
        assert tp.error is None and tp.offset == 0, tp
        (tp,) = c.offsets_for_times([TopicPartition(topic, 0, old)], timeout=10)
        assert tp.offset == 0, "the producer's timestamps are not what the index holds"
        (tp,) = c.offsets_for_times([TopicPartition(topic, 0, after + 60_000)], timeout=10)
        assert tp.offset == -1, tp
    finally:
        c.close()

    # Switched back to CreateTime, new batches keep the producer's timestamp.
    res = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("message.timestamp.type", "CreateTime", incremental_operation=AlterConfigOpType.SET)])
    a.incremental_alter_configs([res], request_timeout=10)[res].result(10)
    recent = int(time.time() * 1000) - 5_000
    produce_sync(broker.bootstrap, topic, [(0, None, b"create-time", recent)])
    (last,) = consume_until(broker.bootstrap, topic, {0: 4}, start_offsets={0: 3})[0]
    assert last.timestamp() == (TIMESTAMP_CREATE_TIME, recent)


def test_delete_records_moves_log_start(broker):
    topic = unique("delrec")
    create_topic(broker.bootstrap, topic, 1)
    for chunk in range(5):
        produce_sync(broker.bootstrap, topic, [(0, b"k%d" % i, b"v%d" % i, None) for i in range(chunk * 20, chunk * 20 + 20)])
    assert watermarks(broker.bootstrap, topic, 0) == (0, 100)

    a = admin_client(broker.bootstrap)
    tp = TopicPartition(topic, 0, 30)
    res = a.delete_records([tp], request_timeout=10)[tp].result(10)
    assert res.low_watermark == 30
    assert watermarks(broker.bootstrap, topic, 0) == (30, 100)

    # Reading "from the beginning" now starts at 30.
    got = consume_until(broker.bootstrap, topic, {0: 100})
    assert [m.offset() for m in got[0]] == list(range(30, 100))
    assert [m.value() for m in got[0]] == [b"v%d" % i for i in range(30, 100)]

    # A fetch below the log start offset is refused with OFFSET_OUT_OF_RANGE ...
    with kw.Conn.to(broker.bootstrap) as conn:
        err, hw, lso, _ = conn.fetch(topic, 0, 10)
        assert err == kw.OFFSET_OUT_OF_RANGE, f"fetch at 10 after DeleteRecords(30): error {err}"
        err, hw, lso, data = conn.fetch(topic, 0, 30, version=conn.pick(kw.FETCH, [11, 10, 9, 8, 7, 6, 5]))
        assert (err, hw, lso) == (0, 100, 30)
        first = kw.parse_batches(data)[0]
        # Batches are served whole: the first one returned contains offset 30.
        assert first.base_offset <= 30 <= first.base_offset + first.last_offset_delta

    # ... so a client positioned there is reset to the new start (auto.offset.reset=earliest).
    got = consume_until(broker.bootstrap, topic, {0: 100}, start_offsets={0: 10})
    assert got[0][0].offset() == 30

    # Deleting up to the high watermark (-1 = "high watermark") empties the partition.
    tp = TopicPartition(topic, 0, -1)
    assert a.delete_records([tp], request_timeout=10)[tp].result(10).low_watermark == 100
    assert watermarks(broker.bootstrap, topic, 0) == (100, 100)
    # New records continue the offsets.
    assert produce_sync(broker.bootstrap, topic, [(0, None, b"next", None)]) == [(0, 100)]

    # Beyond the high watermark is an error.
    tp = TopicPartition(topic, 0, 500)
    with pytest.raises(KafkaException) as ei:
        a.delete_records([tp], request_timeout=10)[tp].result(10)
    assert ei.value.args[0].code() == KafkaError.OFFSET_OUT_OF_RANGE


# ---------------------------------------------------------------- configs

def describe(a, topic: str) -> dict:
    res = ConfigResource(ResourceType.TOPIC, topic)
    return a.describe_configs([res], request_timeout=10)[res].result(10)


def test_topic_configs_round_trip(broker):
    a = admin_client(broker.bootstrap)
    topic = unique("cfg")
    create_topic(broker.bootstrap, topic, 1, {"retention.ms": "123456", "max.message.bytes": "200000"})

    cfg = describe(a, topic)
    for name in ("retention.ms", "retention.bytes", "segment.bytes", "segment.ms", "max.message.bytes", "cleanup.policy",
                 "flush.messages", "flush.ms", "min.insync.replicas", "compression.type", "message.timestamp.type"):
        assert name in cfg, f"describe_configs lacks {name}: {sorted(cfg)}"
    assert cfg["retention.ms"].value == "123456"
    assert cfg["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert not cfg["retention.ms"].is_default
    assert cfg["max.message.bytes"].value == "200000"
    assert cfg["cleanup.policy"].value == "delete"
    assert cfg["segment.bytes"].source != ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    default_segment_ms = cfg["segment.ms"].value

    # Incremental: SET two, leave the rest alone.
    res = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("segment.bytes", "1048576", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("retention.bytes", "5000000", incremental_operation=AlterConfigOpType.SET),
    ])
    a.incremental_alter_configs([res], request_timeout=10)[res].result(10)
    cfg = describe(a, topic)
    assert cfg["segment.bytes"].value == "1048576"
    assert cfg["retention.bytes"].value == "5000000"
    assert cfg["retention.ms"].value == "123456", "an incremental alter must keep untouched keys"
    assert cfg["max.message.bytes"].value == "200000"

    # Incremental DELETE returns a key to its default.
    res = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE),
    ])
    a.incremental_alter_configs([res], request_timeout=10)[res].result(10)
    cfg = describe(a, topic)
    assert cfg["retention.ms"].value != "123456"
    assert cfg["retention.ms"].source != ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert cfg["segment.bytes"].value == "1048576"

    # Legacy AlterConfigs replaces the whole set: keys not named go back to their defaults.
    res = ConfigResource(ResourceType.TOPIC, topic, set_config={"segment.ms": "600000", "flush.messages": "10000"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # deprecated in the client, still a Kafka API
        a.alter_configs([res], request_timeout=10)[res].result(10)
    cfg = describe(a, topic)
    assert cfg["segment.ms"].value == "600000" and cfg["segment.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert cfg["flush.messages"].value == "10000"
    for gone in ("segment.bytes", "retention.bytes", "max.message.bytes"):
        assert cfg[gone].source != ConfigSource.DYNAMIC_TOPIC_CONFIG.value, f"{gone} should be back to default after AlterConfigs"
    assert cfg["segment.bytes"].value != "1048576"
    assert default_segment_ms != "600000"

    # The config is in force: max.message.bytes limits what the topic accepts.
    res = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("max.message.bytes", "2000", incremental_operation=AlterConfigOpType.SET),
    ])
    a.incremental_alter_configs([res], request_timeout=10)[res].result(10)
    p = producer(broker.bootstrap, **{"linger.ms": 0, "compression.type": "none", "message.send.max.retries": 0})
    errs = []
    p.produce(topic, value=b"x" * 5000, on_delivery=lambda err, msg: errs.append(err))
    flush_all(p, 30)
    assert len(errs) == 1 and errs[0] is not None and errs[0].code() == KafkaError.MSG_SIZE_TOO_LARGE, errs

    # Describing an unknown topic is an error for that resource.
    res = ConfigResource(ResourceType.TOPIC, unique("nosuch"))
    with pytest.raises(KafkaException) as ei:
        a.describe_configs([res], request_timeout=10)[res].result(10)
    assert ei.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_invalid_configs_rejected(broker):
    a = admin_client(broker.bootstrap)

    def create_err(config):
        name = unique("badcfg")
        fs = a.create_topics([NewTopic(name, num_partitions=1, replication_factor=1, config=config)], operation_timeout=10)
        with pytest.raises(KafkaException) as ei:
            fs[name].result(10)
        return name, ei.value.args[0].code()

    for bad in ({"retention.ms": "not-a-number"}, {"no.such.config": "1"}, {"cleanup.policy": "shred"},
                {"max.message.bytes": "-7"}, {"segment.bytes": "abc"}):
        name, code = create_err(bad)
        assert code == KafkaError.INVALID_CONFIG, f"create with {bad}: {KafkaError(code)}"
        md = a.list_topics(timeout=5)
        assert name not in md.topics or md.topics[name].error is not None, f"topic created despite invalid config {bad}"

    topic = unique("altcfg")
    create_topic(broker.bootstrap, topic, 1, {"retention.ms": "1000000"})
    for bad in (("retention.ms", "soon"), ("no.such.config", "1"), ("segment.bytes", "-1")):
        res = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
            ConfigEntry(bad[0], bad[1], incremental_operation=AlterConfigOpType.SET)])
        with pytest.raises(KafkaException) as ei:
            a.incremental_alter_configs([res], request_timeout=10)[res].result(10)
        assert ei.value.args[0].code() == KafkaError.INVALID_CONFIG, f"alter {bad}: {ei.value.args[0]}"
    assert describe(a, topic)["retention.ms"].value == "1000000", "a rejected alter must change nothing"

    # Replication factor 3 on a single node cannot be satisfied.
    name = unique("rf3")
    fs = a.create_topics([NewTopic(name, num_partitions=1, replication_factor=3)], operation_timeout=10)
    with pytest.raises(KafkaException) as ei:
        fs[name].result(10)
    assert ei.value.args[0].code() == KafkaError.INVALID_REPLICATION_FACTOR

    # Duplicates.
    fs = a.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)], operation_timeout=10)
    with pytest.raises(KafkaException) as ei:
        fs[topic].result(10)
    assert ei.value.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS


# ---------------------------------------------------------------- partitions, deletion, auto-create

def test_create_partitions(broker):
    a = admin_client(broker.bootstrap)
    topic = unique("grow")
    create_topic(broker.bootstrap, topic, 2)
    produce_sync(broker.bootstrap, topic, [(p, None, b"before-%d" % p, None) for p in range(2)])

    a.create_partitions([NewPartitions(topic, 5)], operation_timeout=10)[topic].result(10)
    wait_for_topic(broker.bootstrap, topic, 5)
    assert sorted(produce_sync(broker.bootstrap, topic, [(4, None, b"p4", None), (3, None, b"p3", None)])) == [(3, 0), (4, 0)]
    got = consume_until(broker.bootstrap, topic, {0: 1, 1: 1, 3: 1, 4: 1})
    assert [m.value() for m in got[0]] == [b"before-0"]
    assert [m.value() for m in got[4]] == [b"p4"]

    # Shrinking or keeping the count is refused.
    for n in (3, 5):
        with pytest.raises(KafkaException) as ei:
            a.create_partitions([NewPartitions(topic, n)], operation_timeout=10)[topic].result(10)
        assert ei.value.args[0].code() == KafkaError.INVALID_PARTITIONS, f"to {n}: {ei.value.args[0]}"
    nosuch = unique("nosuch")
    fs = a.create_partitions([NewPartitions(nosuch, 4)], operation_timeout=10)
    with pytest.raises(KafkaException) as ei:
        fs[nosuch].result(10)
    assert ei.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    wait_for_topic(broker.bootstrap, topic, 5)


def test_delete_topic(broker):
    a = admin_client(broker.bootstrap)
    topic = unique("del")
    create_topic(broker.bootstrap, topic, 3)
    produce_sync(broker.bootstrap, topic, [(p, None, b"x", None) for p in range(3) for _ in range(10)])
    assert watermarks(broker.bootstrap, topic, 2) == (0, 10)

    a.delete_topics([topic], operation_timeout=10)[topic].result(10)
    deadline = time.monotonic() + 10
    while topic in a.list_topics(timeout=5).topics and time.monotonic() < deadline:
        time.sleep(0.1)
    assert topic not in a.list_topics(timeout=5).topics

    with pytest.raises(KafkaException) as ei:
        a.delete_topics([topic], operation_timeout=10)[topic].result(10)
    assert ei.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART

    # Same name again: a new, empty topic.
    create_topic(broker.bootstrap, topic, 1)
    assert watermarks(broker.bootstrap, topic, 0) == (0, 0)
    assert produce_sync(broker.bootstrap, topic, [(0, None, b"fresh", None)]) == [(0, 0)]


def test_auto_create_on_produce(broker_factory):
    b = broker_factory(extra_args=["--num-partitions", "3"])
    topic = unique("auto")
    p = producer(b.bootstrap, **{"linger.ms": 0})
    res = []
    for i in range(30):
        p.produce(topic, key=b"%d" % i, value=b"auto-%d" % i, on_delivery=lambda err, msg: res.append((err, msg.partition(), msg.offset())))
    flush_all(p, 30)
    assert all(err is None for err, _, _ in res), res
    wait_for_topic(b.bootstrap, topic, 3)
    ends = {}
    for _, part, off in res:
        ends[part] = max(ends.get(part, 0), off + 1)
    got = consume_until(b.bootstrap, topic, {part: ends.get(part, 0) for part in range(3)})
    assert sorted(m.value() for msgs in got.values() for m in msgs) == sorted(b"auto-%d" % i for i in range(30))


def test_auto_create_disabled(broker_factory):
    b = broker_factory(extra_args=["--auto-create-topics", "false"])
    topic = unique("noauto")
    a = admin_client(b.bootstrap)
    md = a.list_topics(topic=topic, timeout=10)
    assert md.topics[topic].error is not None and md.topics[topic].error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART

    p = producer(b.bootstrap, **{"linger.ms": 0, "message.timeout.ms": 3000})
    errs = []
    p.produce(topic, value=b"x", on_delivery=lambda err, msg: errs.append(err))
    p.flush(10)
    assert len(errs) == 1 and errs[0] is not None, f"produce to a missing topic must fail: {errs}"
    assert errs[0].code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._MSG_TIMED_OUT), errs[0]
    assert topic not in a.list_topics(timeout=5).topics


# ---------------------------------------------------------------- acks, long-poll fetch, cluster

@pytest.mark.parametrize("acks", ["0", "1"])
def test_acks_0_and_1(broker, acks):
    topic = unique(f"acks{acks}")
    create_topic(broker.bootstrap, topic, 1)
    p = producer(broker.bootstrap, **{"acks": acks, "linger.ms": 5})
    errs = []
    for i in range(2000):
        p.produce(topic, partition=0, value=b"a%d" % i, on_delivery=lambda err, msg: errs.append(err))
    flush_all(p, 30)
    assert errs == [None] * 2000
    deadline = time.monotonic() + 10
    while watermarks(broker.bootstrap, topic, 0)[1] < 2000 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert watermarks(broker.bootstrap, topic, 0) == (0, 2000)
    got = consume_until(broker.bootstrap, topic, {0: 2000})
    assert [m.value() for m in got[0]] == [b"a%d" % i for i in range(2000)]


def test_pipelined_requests_are_answered_in_order(broker):
    """A client may send many requests before reading an answer (the Java producer pipelines
    five). Answers come back in request order, one per request except acks=0 produce, even
    when one group-commit round completes several at once (they share a write)."""
    topic = unique("pipelined")
    create_topic(broker.bootstrap, topic, 4)
    with kw.Conn.to(broker.bootstrap) as c:
        v = c.pick(kw.PRODUCE, [8, 7, 9])
        expected = []  # (correlation id, what it asked)
        frames = b""
        for i in range(60):
            partition, acks = i % 4, (0 if i % 7 == 3 else -1)
            if i % 10 == 5:
                c.correlation_id += 1
                frames += kw.frame(kw.request_header(kw.API_VERSIONS, 0, c.correlation_id))
                expected.append((c.correlation_id, "api_versions"))
            c.correlation_id += 1
            body = kw.produce_body(v, topic, partition, kw.record_batch([kw.Record(b"m%d" % i)]), acks)
            frames += kw.frame(kw.request_header(kw.PRODUCE, v, c.correlation_id) + body)
            if acks != 0:
                expected.append((c.correlation_id, partition))
        c.send_raw(frames)
        next_offset = {p: 0 for p in range(4)}
        for i, (cid, asked) in enumerate(expected):
            r = kw.Reader(c.recv_frame(), False)
            assert r.i32() == cid, f"answer {i}: correlation id out of order"
            if asked == "api_versions":
                assert kw.parse_api_versions_body(r, 0)[0] == 0
                continue
            err, base, _, _, _ = kw.parse_produce_response(r, v)
            # acks=0 batches are appended too, in request order: the offset may skip them.
            assert err == 0 and base >= next_offset[asked], (i, err, base)
            next_offset[asked] = base + 1
        # The last request (acks=0) may still await its round: wait for the high watermarks.
        deadline = time.monotonic() + 10
        while [watermarks(broker.bootstrap, topic, p)[1] for p in range(4)] != [15] * 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [watermarks(broker.bootstrap, topic, p)[1] for p in range(4)] == [15] * 4
    assert "panicked" not in broker.log()


def test_fetch_long_poll_wakes_on_produce(broker):
    topic = unique("longpoll")
    create_topic(broker.bootstrap, topic, 2)
    with kw.Conn.to(broker.bootstrap) as c:
        # Nothing to read: the broker holds the fetch for about max_wait, then answers empty.
        t0 = time.monotonic()
        err, hw, _, data = c.fetch(topic, 0, 0, max_wait_ms=600)
        waited = time.monotonic() - t0
        assert (err, hw, data) == (0, 0, b"")
        assert 0.45 <= waited < 3.0, f"empty fetch with max_wait 600 ms returned after {waited:.2f}s"

        # A fetch waiting 10 s is answered as soon as a record arrives in its partition; a
        # record in another partition of the topic wakes it, and it goes on waiting.
        result = {}

        def waiting_fetch():
            result["fetch"] = c.fetch(topic, 0, 0, max_wait_ms=10000)
            result["at"] = time.monotonic()

        t = threading.Thread(target=waiting_fetch)
        t.start()
        time.sleep(0.5)
        with kw.Conn.to(broker.bootstrap) as producer_conn:
            assert producer_conn.produce(topic, 1, kw.record_batch([kw.Record(b"elsewhere")]))[:2] == (0, 0)
            time.sleep(0.5)
            assert "fetch" not in result, f"answered after a record in another partition: {result}"
            assert producer_conn.produce(topic, 0, kw.record_batch([kw.Record(b"wake-up")]))[:2] == (0, 0)
            acked_at = time.monotonic()
        t.join(15)
        assert "fetch" in result, "long-poll fetch never returned"
        err, hw, _, data = result["fetch"]
        assert err == 0 and hw == 1
        delay = result["at"] - acked_at
        assert delay < 1.0, f"fetch answered {delay:.2f}s after the produce was acknowledged (max_wait 10 s)"
        (b,) = kw.parse_batches(data)
        assert [r.value for _, r in kw.decode_records(b)] == [b"wake-up"]


def test_describe_cluster(broker):
    a = admin_client(broker.bootstrap)
    desc = a.describe_cluster(request_timeout=10).result(10)
    assert desc.cluster_id, "cluster id must be set"
    assert len(desc.nodes) == 1
    node = desc.nodes[0]
    assert (node.host, node.port) == ("127.0.0.1", broker.port)
    assert desc.controller is not None and desc.controller.id == node.id
    md = a.list_topics(timeout=10)
    assert md.cluster_id == desc.cluster_id
    assert [b.id for b in md.brokers.values()] == [node.id]
    # The cluster id is persistent.
    broker.restart()
    assert admin_client(broker.bootstrap).describe_cluster(request_timeout=10).result(10).cluster_id == desc.cluster_id
