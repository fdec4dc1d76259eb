"""Tiered storage (KIP-405): a topic with remote.storage.enable=true copies its sealed
segments to an object store, keeps only a local tail on disk (local.retention.*), and reads
its whole history back through the ordinary Fetch and ListOffsets, from a local-directory
store (the default) and from a real S3-compatible server (s3s-fs, tests/python/s3_server.py),
across a kill -9 and an object-store outage."""

import os
import threading
import time
import uuid
from pathlib import Path

from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from kafka_wire import Conn, admin_client, consume_until, create_topic, watermarks
from conftest import free_port
from s3_server import start_s3_server
from test_metrics import scrape
from test_metrics import value as metric

RECORD_BYTES = 10_000
SEGMENT_BYTES = 1 << 20
LOCAL_RETENTION_BYTES = 2 * SEGMENT_BYTES
EARLIEST_LOCAL = -4
LATEST_TIERED = -5
FAST = ["--log-retention-check-interval-ms", "200", "--override", "tiered_storage.task_interval_ms=200"]


def value(partition: int, offset: int) -> bytes:
    return b"%d:%08d" % (partition, offset) + b"t" * (RECORD_BYTES - 11)


def produce(bootstrap: str, topic: str, partitions: int, start: int, count: int) -> None:
    """`count` records into each partition, record n of partition p at offset start + n."""
    p = Producer({"bootstrap.servers": bootstrap, "broker.address.family": "v4", "acks": "all", "linger.ms": 5,
                  "compression.type": "none"})
    errs = []
    for n in range(start, start + count):
        for part in range(partitions):
            p.produce(topic, partition=part, value=value(part, n), on_delivery=lambda err, msg: errs.append(err))
        p.poll(0)
    assert p.flush(60) == 0
    assert errs == [None] * (count * partitions), [e for e in errs if e][:3]


def local_start(bootstrap: str, topic: str, partition: int) -> int:
    host, port = bootstrap.split(":")
    with Conn(host, int(port)) as conn:
        err, _, offset = conn.list_offsets(topic, partition, EARLIEST_LOCAL, version=8)
        assert err == 0, err
        return offset


def latest_tiered(bootstrap: str, topic: str, partition: int) -> int:
    host, port = bootstrap.split(":")
    with Conn(host, int(port)) as conn:
        err, _, offset = conn.list_offsets(topic, partition, LATEST_TIERED, version=9)
        assert err == 0, err
        return offset


def segment_files_bytes(partition_dir: Path) -> int:
    """Bytes of the segment files in a partition's directory; one that retention deletes
    between the listing and its stat counts as gone."""
    total = 0
    for f in partition_dir.glob("*.log"):
        try:
            total += f.stat().st_size
        except FileNotFoundError:
            pass
    return total


def local_bytes(data_dir: Path, topic: str, partition: int) -> int:
    return segment_files_bytes(data_dir / "logs" / f"{topic}-{partition}")


def wait_until(what: str, check, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def check_all(bootstrap: str, topic: str, partitions: int, end: int) -> None:
    """Every record of every partition reads back from offset 0, dense and byte for byte."""
    got = consume_until(bootstrap, topic, {p: end for p in range(partitions)}, timeout=120)
    for p in range(partitions):
        offsets = [m.offset() for m in got[p]]
        assert offsets == list(range(end)), f"partition {p}: {len(offsets)} records, first gaps at " \
            f"{[o for i, o in enumerate(offsets) if o != i][:3]}"
        bad = [m.offset() for m in got[p] if m.value() != value(p, m.offset())]
        assert not bad, f"partition {p}: records differ at offsets {bad[:5]}"


def tiered_topic(bootstrap: str, partitions: int, **extra) -> str:
    topic = f"tiered-{uuid.uuid4().hex[:8]}"
    config = {"remote.storage.enable": "true", "segment.bytes": str(SEGMENT_BYTES),
              "local.retention.bytes": str(LOCAL_RETENTION_BYTES)}
    config.update(extra)
    create_topic(bootstrap, topic, partitions, config)
    return topic


def test_tiered_topic_keeps_a_local_tail_and_reads_its_whole_history(broker_factory, tmp_path):
    """40 MiB per partition with 2 MiB of local retention: the disk keeps only the tail, the
    local directory store holds the rest, and librdkafka reads all of it back from offset 0,
    before and after a kill -9."""
    metrics_port = free_port()
    b = broker_factory(extra_args=FAST + ["--metrics-listen", f"127.0.0.1:{metrics_port}"])
    partitions, records = 2, 4000
    topic = tiered_topic(b.bootstrap, partitions)
    produce(b.bootstrap, topic, partitions, 0, records)
    for p in range(partitions):
        wait_until(f"partition {p}'s local log to shrink to its retention",
                   lambda: local_start(b.bootstrap, topic, p) > records // 2
                   and local_bytes(b.data_dir, topic, p) <= LOCAL_RETENTION_BYTES + 2 * SEGMENT_BYTES)
        assert watermarks(b.bootstrap, topic, p) == (0, records), "the earliest offset is the remote tier's start"
        tiered_end = latest_tiered(b.bootstrap, topic, p)
        assert local_start(b.bootstrap, topic, p) <= tiered_end + 1 < records
    remote = list((b.data_dir / "remote-store").rglob("*.log"))
    assert len(remote) >= 2 * (records * RECORD_BYTES // SEGMENT_BYTES - 4), f"only {len(remote)} remote segments"
    check_all(b.bootstrap, topic, partitions, records)
    metrics = scrape(metrics_port)
    assert metric(metrics, "sluice_remote_copy_bytes_total") >= len(remote) * SEGMENT_BYTES * 0.9
    assert metric(metrics, "sluice_remote_fetch_bytes_total") >= records // 2 * RECORD_BYTES, "not read remotely"
    assert metric(metrics, "sluice_remote_log_size_bytes") >= len(remote) * SEGMENT_BYTES * 0.9
    assert metric(metrics, "sluice_remote_copy_failures_total") == 0

    b.kill()
    b.start()
    for p in range(partitions):
        assert watermarks(b.bootstrap, topic, p, timeout=30) == (0, records)
    produce(b.bootstrap, topic, partitions, records, 100)
    check_all(b.bootstrap, topic, partitions, records + 100)
    assert b.is_running(), b.log()[-4000:]


def test_timestamps_delete_records_and_total_retention_cover_the_remote_tier(broker_factory):
    """offsetsForTimes finds records that live only in the remote tier; DeleteRecords below
    the local start moves the earliest offset there; retention.ms deletes remote segments."""
    b = broker_factory(extra_args=FAST)
    topic = tiered_topic(b.bootstrap, 1, **{"retention.ms": "600000", "local.retention.ms": "300000"})
    now = int(time.time() * 1000)
    p = Producer({"bootstrap.servers": b.bootstrap, "broker.address.family": "v4", "acks": "all", "linger.ms": 5})
    # 1000 records stamped 9 minutes ago going forward by 1 ms each, then 1000 fresh ones.
    old = now - 540_000
    for n in range(2000):
        ts = old + n if n < 1000 else now + n
        p.produce(topic, partition=0, value=value(0, n), timestamp=ts)
        p.poll(0)
    assert p.flush(60) == 0
    wait_until("the old segments to leave the local disk", lambda: local_start(b.bootstrap, topic, 0) >= 500)
    consumer_offsets = admin_offsets_for_time(b.bootstrap, topic, old + 100)
    assert consumer_offsets == 100, f"offsetsForTimes found {consumer_offsets}, not the remote record 100"

    a = admin_client(b.bootstrap)
    from confluent_kafka import TopicPartition
    a.delete_records([TopicPartition(topic, 0, 250)])[TopicPartition(topic, 0, 250)].result(10)
    assert watermarks(b.bootstrap, topic, 0)[0] == 250
    got = consume_until(b.bootstrap, topic, {0: 2000})[0]
    assert [m.offset() for m in got] == list(range(250, 2000))

    # Shorten retention.ms: the old records (9 minutes old) expire from the remote tier too.
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("retention.ms", "480000", incremental_operation=AlterConfigOpType.SET)])
    a.incremental_alter_configs([resource])[resource].result(10)
    wait_until("remote retention to expire the old segments", lambda: watermarks(b.bootstrap, topic, 0)[0] >= 900)
    low = watermarks(b.bootstrap, topic, 0)[0]
    got = consume_until(b.bootstrap, topic, {0: 2000})[0]
    assert [m.offset() for m in got] == list(range(low, 2000))


def admin_offsets_for_time(bootstrap: str, topic: str, timestamp: int) -> int:
    from kafka_wire import consumer
    from confluent_kafka import TopicPartition
    c = consumer(bootstrap)
    try:
        return c.offsets_for_times([TopicPartition(topic, 0, timestamp)], timeout=10)[0].offset
    finally:
        c.close()


def test_tiered_configs_are_checked_and_deleting_a_topic_deletes_its_objects(broker_factory):
    """Kafka's rules: no compaction on a tiered topic, local retention within the total, and
    no turning tiering off. Deleting a tiered topic deletes its objects in the store."""
    b = broker_factory(extra_args=FAST)
    a = admin_client(b.bootstrap)
    from confluent_kafka.admin import NewTopic
    bad = [
        {"remote.storage.enable": "true", "cleanup.policy": "compact"},
        {"remote.storage.enable": "true", "retention.bytes": "1000000", "local.retention.bytes": "2000000"},
        {"remote.storage.enable": "true", "retention.ms": "1000", "local.retention.ms": "-1"},
        {"remote.storage.enable": "maybe"},
    ]
    for n, config in enumerate(bad):
        name = f"bad-tiered-{n}-{uuid.uuid4().hex[:6]}"
        try:
            a.create_topics([NewTopic(name, 1, 1, config=config)])[name].result(10)
            raise AssertionError(f"{config} was accepted")
        except Exception as e:  # noqa: BLE001
            assert e.args[0].code() == KafkaError.INVALID_CONFIG, e
    topic = tiered_topic(b.bootstrap, 1)
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("remote.storage.enable", "false", incremental_operation=AlterConfigOpType.SET)])
    try:
        a.incremental_alter_configs([resource])[resource].result(10)
        raise AssertionError("tiering was turned off")
    except Exception as e:  # noqa: BLE001
        assert e.args[0].code() == KafkaError.INVALID_CONFIG, e

    produce(b.bootstrap, topic, 1, 0, 400)
    store = b.data_dir / "remote-store"
    wait_until("segments copied", lambda: len(list(store.rglob("*.log"))) >= 2)
    a.delete_topics([topic])[topic].result(10)
    wait_until("the deleted topic's objects deleted", lambda: not [f for f in store.rglob("*") if f.is_file()],
               timeout=30)


def test_s3_store_outage_never_blocks_producers_and_loses_nothing(broker_factory, tmp_path):
    """Against a real S3-compatible server, stopped for OUTAGE_S under a steady acks=all
    load: producers keep going at their latency (nothing waits for the store), the local
    log keeps what is not uploaded, a consumer reading remote history meanwhile is held up
    but not failed; once the store is back uploads resume and every record reads back from
    offset 0. (The slow tier stops the store for 60 s.)"""
    s3 = start_s3_server(tmp_path)
    try:
        store = [f"tiered_storage.url=s3://{s3.bucket}/cluster-a", f"tiered_storage.endpoint={s3.endpoint}",
                 "tiered_storage.allow_http=true", f"tiered_storage.access_key_id={s3.access_key}",
                 f"tiered_storage.secret_access_key={s3.secret_key}"]
        b = broker_factory(extra_args=FAST + [x for o in store for x in ("--override", o)])
        topic = tiered_topic(b.bootstrap, 1)
        produce(b.bootstrap, topic, 1, 0, 1000)
        wait_until("the first uploads", lambda: local_start(b.bootstrap, topic, 0) > 500)
        assert list(s3.bucket_dir.rglob("*.log")), "nothing uploaded to the S3 server"

        load = SteadyProducer(b.bootstrap, topic, first=1000, rate=200)
        time.sleep(3)
        s3.stop()
        load.phase = "outage"
        reader = ReaderThread(b.bootstrap, topic, end=1000)  # offsets 0..~500 are remote only
        time.sleep(OUTAGE_S)
        stalled_at = latest_tiered(b.bootstrap, topic, 0)
        assert local_start(b.bootstrap, topic, 0) <= stalled_at + 1, "local data left before it was uploaded"
        s3.start()
        load.phase = "after"
        time.sleep(2)
        end = load.stop()
        before, during = load.p99("before"), load.p99("outage")
        print(f"producer p99 before the outage {before * 1000:.1f} ms, during {during * 1000:.1f} ms "
              f"({load.count('outage')} records in {OUTAGE_S} s)")
        assert load.count("outage") >= OUTAGE_S * 200 * 0.8, "producers slowed down while the store was down"
        assert during < max(10 * before, 0.5), f"producer p99 {during:.3f} s during the outage vs {before:.3f} s"
        reader.join(120)
        assert reader.error is None, f"the consumer failed instead of waiting for the store: {reader.error}"
        wait_until("uploads to resume after the outage", lambda: latest_tiered(b.bootstrap, topic, 0) > end - 300,
                   timeout=120)
        check_all(b.bootstrap, topic, 1, end)
        assert b.is_running(), b.log()[-4000:]
    finally:
        s3.stop()


OUTAGE_S = 60 if os.environ.get("SLUICE_SLOW_TESTS") == "1" else 6


class SteadyProducer:
    """Produces value(0, n) for n = first, first + 1, ... at `rate` per second from a thread,
    recording each record's acknowledgement latency under the current `phase`."""

    def __init__(self, bootstrap: str, topic: str, first: int, rate: int):
        self.producer = Producer({"bootstrap.servers": bootstrap, "broker.address.family": "v4", "acks": "all",
                                  "linger.ms": 1, "compression.type": "none"})
        self.topic, self.next, self.rate = topic, first, rate
        self.phase = "before"
        self.latencies: dict[str, list[float]] = {}
        self.failed: list = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)
        self._thread.start()

    def _run(self):
        started = time.monotonic()
        sent = 0
        while not self._stop.is_set():
            due = started + sent / self.rate
            now = time.monotonic()
            if now < due:
                self.producer.poll(min(due - now, 0.01))
                continue
            phase, at = self.phase, time.monotonic()

            def delivered(err, msg, phase=phase, at=at):
                if err:
                    self.failed.append(err)
                else:
                    self.latencies.setdefault(phase, []).append(time.monotonic() - at)
            self.producer.produce(self.topic, partition=0, value=value(0, self.next), on_delivery=delivered)
            self.next += 1
            sent += 1
            self.producer.poll(0)

    def stop(self) -> int:
        """Stops, waits for every acknowledgement; returns the offset after the last record."""
        self._stop.set()
        self._thread.join(30)
        assert self.producer.flush(60) == 0
        assert not self.failed, self.failed[:3]
        return self.next

    def count(self, phase: str) -> int:
        return len(self.latencies.get(phase, []))

    def p99(self, phase: str) -> float:
        got = sorted(self.latencies.get(phase, []))
        assert got, f"no records acknowledged in phase {phase}"
        return got[int(len(got) * 0.99) - 1 if len(got) >= 100 else -1]


class ReaderThread(threading.Thread):
    """Reads offsets 0..end-1 in the background; `error` holds what failed it, if anything."""

    def __init__(self, bootstrap: str, topic: str, end: int):
        super().__init__()
        self.bootstrap, self.topic, self.end = bootstrap, topic, end
        self.error = None
        self.start()

    def run(self):
        try:
            check_all(self.bootstrap, self.topic, 1, self.end)
        except BaseException as e:  # noqa: BLE001
            self.error = e


def test_copies_keep_to_copy_max_bytes_per_second(broker_factory):
    """tiered_storage.copy_max_bytes_per_second bounds the node's copies: at 1 MiB/s, eight
    sealed 1 MiB segments take about eight seconds to copy, not a fraction of one."""
    metrics_port = free_port()
    b = broker_factory(extra_args=FAST + ["--metrics-listen", f"127.0.0.1:{metrics_port}",
                                          "--override", f"tiered_storage.copy_max_bytes_per_second={1 << 20}"])
    topic = tiered_topic(b.bootstrap, 1)
    produce(b.bootstrap, topic, 1, 0, 900)  # ~9 MiB: 8 sealed segments
    copied = lambda: metric(scrape(metrics_port), "sluice_remote_copy_bytes_total")  # noqa: E731
    wait_until("copying to start", lambda: copied() > 0, timeout=10)
    first, started = copied(), time.monotonic()
    time.sleep(3)
    rate = (copied() - first) / (time.monotonic() - started)
    assert rate <= 1.5 * (1 << 20), f"copies ran at {rate / (1 << 20):.1f} MiB/s with a 1 MiB/s limit"
    assert latest_tiered(b.bootstrap, topic, 0) < 700, "every segment was copied within seconds"
    wait_until("every sealed segment copied", lambda: latest_tiered(b.bootstrap, topic, 0) >= 700, timeout=30)


def test_objects_of_copies_never_committed_are_deleted(broker_factory):
    """A crash between a copy and its commit leaves objects no segment lists: the leader
    deletes them once they are an hour old (at startup, then every ten minutes), and never
    an object a listed segment names."""
    b = broker_factory(extra_args=FAST)
    topic = tiered_topic(b.bootstrap, 1)
    produce(b.bootstrap, topic, 1, 0, 400)
    wait_until("segments copied", lambda: latest_tiered(b.bootstrap, topic, 0) >= 200)
    b.stop()
    store = b.data_dir / "remote-store"
    listed = sorted(f for f in store.rglob("*") if f.is_file())
    partition_dir = listed[0].parent
    old = time.time() - 7200
    stale = partition_dir / f"{0:020d}-{uuid.uuid4().hex}.log"
    fresh = partition_dir / f"{0:020d}-{uuid.uuid4().hex}.index"
    for f in (stale, fresh):
        f.write_bytes(b"left by a copy that was never committed")
    os.utime(stale, (old, old))
    for f in listed:
        os.utime(f, (old, old))  # listed objects are kept whatever their age
    b.start()
    wait_until("the stale orphan deleted", lambda: not stale.exists(), timeout=30)
    assert fresh.exists(), "an object young enough to be a copy in flight was deleted"
    assert all(f.exists() for f in listed), "an object of a listed segment was deleted"
    check_all(b.bootstrap, topic, 1, 400)
