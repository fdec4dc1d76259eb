"""Power loss: the broker's data dir sits on `sluice-lossyfs` (tests/python/lossyfs.py), which
keeps unsynced writes in memory only; a "power loss" is `kill -9` of the broker followed by
dropping every unsynced byte. `kill -9` alone keeps the page cache and would pass with fsync
switched off; these tests do not.

- Levels 1 and 3 (fsync before acknowledging) lose nothing acknowledged, records or
  idempotent-producer state (retries are neither lost nor duplicated), over repeated power
  losses under load, with the write-ahead log (the default) and with per-file fsyncs.
- The same check fails when fsync is switched off (the test-only SKIP_FSYNC switch): proof
  that the harness can see a lost fsync.
- Full-speed rounds of 1 KiB records (WAL rounds larger than a FUSE request) survive power
  cuts on a FUSE filesystem that applies the pieces of a split direct write in the worst
  order, as LazyFS may: the broker writes through the page cache on FUSE.
- Levels 2 and 4 (acknowledged from the page cache) lose only what was acknowledged within
  `flush.ms` (plus one upkeep tick) of the power loss; the test measures how much.
- Committed consumer offsets survive a power loss, and so do transactions: committed ones
  stay visible to read_committed readers, open ones are aborted by the next producer.
- A failed fsync is never acknowledged: the partition goes offline (KAFKA_STORAGE_ERROR)
  and stays so after the disk heals (a retried fsync may report success without writing
  the data), until a restart recovers what is durable.
"""

import os
import random
import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from conftest import Broker
import kafka_wire as kw
from kafka_wire import admin_client, consume_until, create_topic, watermarks
from lossyfs import LossyMount
from numbered import PARTITIONS, run_kill_rounds

ROUNDS = int(os.environ.get("SLUICE_POWER_LOSS_ROUNDS", "10"))
SKIP_FSYNC_ENV = "SLUICE_UNSAFE_SKIP_FSYNC_FOR_TESTS"
# The broker's upkeep (page-cache flushes by flush.ms) runs this often in these tests.
UPKEEP_MS = 100
# Small enough that the numbered producer rolls every partition several times a second.
SMALL_SEGMENT_BYTES = 16 * 1024


@pytest.fixture
def lossy(tmp_path):
    mount = LossyMount(tmp_path / "fs").start()
    brokers: list[Broker] = []

    def start_broker(env=None, wal=True) -> Broker:
        broker = Broker(mount.mount / "data", log_dir=tmp_path, env=env,
                        extra_args=["--log-retention-check-interval-ms", str(UPKEEP_MS),
                                    "--log-wal", "true" if wal else "false"])
        brokers.append(broker)
        return broker.start()

    mount.start_broker = start_broker
    yield mount
    for broker in brokers:
        broker.kill()
    mount.stop()


def power_loss(broker: Broker, mount: LossyMount) -> None:
    broker.kill()
    mount.power_loss()
    broker.start()


@pytest.mark.parametrize("level,wal,segment_bytes", [(1, True, None), (3, True, None), (1, False, None),
                                                     (1, True, SMALL_SEGMENT_BYTES)],
                         ids=["level-1-wal", "level-3-wal", "level-1-per-file-fsync", "level-1-wal-rolling"])
def test_fsynced_levels_lose_nothing_over_repeated_power_losses(lossy, level, wal, segment_bytes):
    """With `SMALL_SEGMENT_BYTES` the partitions roll many times a second, so power fails
    while rolls are under way: a new segment takes batches before its file exists, and the
    checkpointer seals the old one and creates the file later."""
    broker = lossy.start_broker(wal=wal)
    topic = f"power-{level}-{uuid.uuid4().hex[:8]}"
    config = {"sluice.durability.level": str(level)}
    if segment_bytes is not None:
        config["segment.bytes"] = str(segment_bytes)
    create_topic(broker.bootstrap, topic, PARTITIONS, config=config)
    rng = random.Random(int(os.environ.get("SLUICE_CRASH_SEED", "4242")) + level)
    summary = run_kill_rounds(broker, topic, ROUNDS, rng, after_kill=lossy.power_loss)
    print(f"level {level}, power losses: {summary}")


def produce_acked(bootstrap: str, topic: str, count: int, prefix: str) -> dict[bytes, tuple[int, int, float]]:
    """Produces `count` records with acks=all and waits for all answers: key -> (partition,
    offset, monotonic time of the acknowledgement)."""
    acked: dict[bytes, tuple[int, int, float]] = {}
    errors = []

    def on_delivery(err, msg):
        if err is not None:
            errors.append(err)
        else:
            acked[msg.key()] = (msg.partition(), msg.offset(), time.monotonic())

    producer = Producer({"bootstrap.servers": bootstrap, "broker.address.family": "v4", "acks": "all",
                         "linger.ms": 2})
    for i in range(count):
        producer.produce(topic, partition=i % PARTITIONS, key=f"{prefix}-{i}".encode(), value=b"v" * 100,
                         on_delivery=on_delivery)
        if i % 100 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    assert not errors, errors[:3]
    return acked


def present_keys(bootstrap: str, topic: str) -> dict[bytes, tuple[int, int]]:
    ends = {p: watermarks(bootstrap, topic, p, timeout=30)[1] for p in range(PARTITIONS)}
    read = consume_until(bootstrap, topic, ends, timeout=120)
    return {m.key(): (p, m.offset()) for p, msgs in read.items() for m in msgs}


@pytest.mark.parametrize("wal", [True, False], ids=["wal", "per-file-fsync"])
@pytest.mark.parametrize("skip_fsync", [False, True], ids=["fsync", "fsync-switched-off"])
def test_power_loss_after_acknowledgement_is_caught_only_without_fsync(lossy, skip_fsync, wal):
    """The harness's own proof: records acknowledged at level 1 survive a power loss, and the
    very same check reports them lost when the broker skips its fsyncs; both with the
    write-ahead log (the default) and with one fsync per partition file."""
    broker = lossy.start_broker(env={SKIP_FSYNC_ENV: "1"} if skip_fsync else None, wal=wal)
    topic = f"proof-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, PARTITIONS)
    # The topic itself is made durable by hand, so that only the records' fsyncs are on trial
    # (without fsync the broker's own metadata would be lost too and it could not restart).
    lossy.sync()
    acked = produce_acked(broker.bootstrap, topic, 2000, "proof")
    power_loss(broker, lossy)
    present = present_keys(broker.bootstrap, topic)
    lost = [key for key, (p, off, _) in acked.items() if present.get(key) != (p, off)]
    print(f"skip_fsync={skip_fsync}: {len(acked)} acknowledged, {len(lost)} lost")
    if skip_fsync:
        assert len(lost) == len(acked), "without fsync every acknowledged record must be lost here"
    else:
        assert lost == [], f"{len(lost)} of {len(acked)} acknowledged records lost, e.g. {lost[:5]}"


# The field check's workload: rounds of 1 KiB records at full speed, so that WAL rounds take
# more than 1 MiB (the kernel's largest FUSE request here) and segment tails fill large chunks.
BURST_PARTITIONS = 8
BURST_RECORDS = 20_000
BURST_ROUNDS = 3


def produce_burst(bootstrap: str, topic: str, round_: int) -> dict[tuple[int, int], bytes]:
    """BURST_RECORDS records of ~1 KiB, round-robin, idempotent and acks=all, as fast as the
    producer goes: (partition, offset) -> value of each acknowledged one."""
    acked: dict[tuple[int, int], bytes] = {}
    errors = []

    def on_delivery(err, msg):
        if err is not None:
            errors.append(err)
        else:
            acked[(msg.partition(), msg.offset())] = msg.value()

    producer = Producer({"bootstrap.servers": bootstrap, "broker.address.family": "v4", "acks": "all",
                         "enable.idempotence": True, "linger.ms": 5})
    pad = bytes(range(256)) * 4
    for i in range(BURST_RECORDS):
        value = b"%d|%d|" % (round_, i) + pad
        while True:
            try:
                producer.produce(topic, partition=i % BURST_PARTITIONS, value=value, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    assert producer.flush(120) == 0
    assert not errors, errors[:3]
    return acked


@pytest.fixture
def split_direct_mount(tmp_path):
    """A lossy mount whose files go through the kernel's page cache and whose large direct
    writes land as a multi-threaded FUSE daemon (LazyFS) may apply them (lossyfs.py)."""
    mount = LossyMount(tmp_path / "fs", page_cache=True, split_direct_writes=True).start()
    yield mount
    mount.stop()


def test_full_speed_rounds_survive_power_loss_on_a_daemon_that_splits_direct_writes(tmp_path, split_direct_mount):
    """Rounds of 20,000 acknowledged 1 KiB records, each followed by a power cut, on a FUSE
    filesystem that splits a large direct write into pieces it applies in the worst order:
    nothing acknowledged is lost or duplicated. (A broker that writes with direct I/O on
    FUSE fails it: a WAL round of more than 1 MiB holds a run of zeros once acknowledged,
    replay stops there and the partitions lose their tails.)"""
    broker = Broker(split_direct_mount.mount / "data", log_dir=tmp_path).start()
    try:
        topic = f"burst-{uuid.uuid4().hex[:8]}"
        create_topic(broker.bootstrap, topic, BURST_PARTITIONS)
        acked: dict[tuple[int, int], bytes] = {}
        for round_ in range(BURST_ROUNDS):
            acked.update(produce_burst(broker.bootstrap, topic, round_))
            power_loss(broker, split_direct_mount)
            ends = {p: watermarks(broker.bootstrap, topic, p, timeout=30)[1] for p in range(BURST_PARTITIONS)}
            read = consume_until(broker.bootstrap, topic, ends, timeout=120)
            found = {(p, m.offset()): m.value() for p, msgs in read.items() for m in msgs}
            lost = [key for key, value in acked.items() if found.get(key) != value]
            assert not lost, (f"round {round_}: {len(lost)} of {len(acked)} acknowledged records lost; "
                              f"high watermarks {ends}")
            assert len(found) == len(acked), f"round {round_}: {len(found) - len(acked)} records not acknowledged"
    finally:
        broker.kill()


def test_a_new_broker_keeps_its_topics_and_cluster_id_when_unsynced_directory_entries_are_lost(tmp_path):
    """On a filesystem that keeps a created or renamed name only once its directory is
    fsynced, a power cut right after the first start and a topic creation takes back
    nothing that was answered: the topic, its records and the cluster id are there."""
    mount = LossyMount(tmp_path / "fs", strict_dirs=True).start()
    broker = Broker(mount.mount / "data", log_dir=tmp_path)
    try:
        broker.start()
        cluster_id = admin_client(broker.bootstrap).list_topics(timeout=10).cluster_id
        create_topic(broker.bootstrap, "first", PARTITIONS)
        acked = produce_acked(broker.bootstrap, "first", 400, "first")
        power_loss(broker, mount)
        metadata = admin_client(broker.bootstrap).list_topics(timeout=10)
        assert "first" in metadata.topics, f"the topic is gone: {sorted(metadata.topics)}"
        assert metadata.cluster_id == cluster_id, "the cluster id changed"
        present = present_keys(broker.bootstrap, "first")
        lost = [key for key, (p, off, _) in acked.items() if present.get(key) != (p, off)]
        assert not lost, f"{len(lost)} of {len(acked)} acknowledged records lost"
    finally:
        broker.kill()
        mount.stop()


@pytest.mark.parametrize("level", [2, 4])
def test_page_cache_levels_lose_only_the_last_flush_interval(lossy, level):
    """Levels 2 and 4 acknowledge from the page cache and fsync after `flush.ms`: a power loss
    takes back at most what was acknowledged within flush.ms (plus one upkeep tick and the
    fsync itself) before it, never older records. Measured over several power losses."""
    flush_ms = 500
    bound_s = (flush_ms + UPKEEP_MS) / 1000 + 1.0
    broker = lossy.start_broker()
    topic = f"pagecache-{level}-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, PARTITIONS,
                 config={"sluice.durability.level": str(level), "flush.ms": str(flush_ms)})
    acked: dict[bytes, tuple[int, int, float]] = {}
    table = []
    for round_ in range(3):
        stop = threading.Event()
        batch: dict[bytes, tuple[int, int, float]] = {}

        def produce_steadily():
            i = 0
            while not stop.is_set():
                batch.update(produce_acked(broker.bootstrap, topic, 200, f"r{round_}-{i}"))
                i += 1

        worker = threading.Thread(target=produce_steadily, daemon=True)
        worker.start()
        time.sleep(2.5)
        stop.set()
        worker.join(60)
        # Power loss right after the last acknowledgement: the tail is still unflushed.
        lost_at = time.monotonic()
        power_loss(broker, lossy)
        acked.update(batch)
        present = present_keys(broker.bootstrap, topic)
        # Acknowledged at an offset that the log no longer holds (or holds another record).
        lost = {key: t for key, (p, off, t) in acked.items() if present.get(key) != (p, off)}
        old = [key for key, t in lost.items() if t < lost_at - bound_s]
        table.append((round_, len(batch), len(lost)))
        assert old == [], f"level {level}: {len(old)} records acknowledged more than {bound_s}s before the power loss were lost"
        # What was lost is gone for good: forget it, and check the survivors in later rounds.
        for key in lost:
            del acked[key]
    print(f"level {level}, flush.ms={flush_ms}: (round, acknowledged, lost) {table}")


def test_committed_offsets_survive_power_loss(lossy):
    broker = lossy.start_broker()
    topic = f"offsets-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, PARTITIONS)
    produce_acked(broker.bootstrap, topic, 400, "o")
    group = f"g-{uuid.uuid4().hex[:8]}"
    for round_ in range(3):
        consumer = Consumer({"bootstrap.servers": broker.bootstrap, "broker.address.family": "v4", "group.id": group,
                             "enable.auto.commit": False})
        try:
            offsets = [TopicPartition(topic, p, 10 * (round_ + 1) + p) for p in range(PARTITIONS)]
            committed = consumer.commit(offsets=offsets, asynchronous=False)
            assert all(tp.error is None for tp in committed), committed
        finally:
            consumer.close()
        power_loss(broker, lossy)
        consumer = Consumer({"bootstrap.servers": broker.bootstrap, "broker.address.family": "v4", "group.id": group,
                             "enable.auto.commit": False})
        try:
            got = consumer.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=30)
        finally:
            consumer.close()
        assert {tp.partition: tp.offset for tp in got} == {p: 10 * (round_ + 1) + p for p in range(PARTITIONS)}


def test_failed_fsync_is_never_acknowledged_and_takes_the_partition_offline(lossy):
    broker = lossy.start_broker()
    topic = f"eio-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, 1)
    with kw.Conn.to(broker.bootstrap, timeout=30) as conn:
        assert conn.produce(topic, 0, kw.record_batch([kw.Record(b"before")]))[0] == kw.NONE
        lossy.fail_fsync()
        assert conn.produce(topic, 0, kw.record_batch([kw.Record(b"during")]))[0] == kw.KAFKA_STORAGE_ERROR
        lossy.heal()
        # No second fsync of the same pages is trusted: the partition stays offline.
        assert conn.produce(topic, 0, kw.record_batch([kw.Record(b"healed")]))[0] == kw.KAFKA_STORAGE_ERROR
    assert "fdatasync failed; partition offline" in broker.log()
    power_loss(broker, lossy)
    with kw.Conn.to(broker.bootstrap, timeout=30) as conn:
        assert conn.produce(topic, 0, kw.record_batch([kw.Record(b"after restart")]))[0] == kw.NONE
    read = consume_until(broker.bootstrap, topic, {0: watermarks(broker.bootstrap, topic, 0)[1]})
    assert [m.value() for m in read[0]] == [b"before", b"after restart"]


def test_broker_refuses_to_start_on_a_disk_whose_fsync_fails(lossy):
    lossy.fail_fsync()
    # The first fsync to fail names itself: creating the data dir durably, or the check of it.
    with pytest.raises(RuntimeError, match=r"(fdatasync|fsync) failed"):
        lossy.start_broker()
    lossy.heal()
    lossy.start_broker()


@pytest.mark.parametrize("wal", [False, True], ids=["per-file-fsync", "wal"])
def test_failed_fsync_of_a_rolled_segment_takes_the_partition_offline(lossy, wal):
    """The disk's fsyncs fail as a batch rolls the segment: that batch is refused, and the
    partition goes offline rather than retrying (a retried fsync may report success without
    writing). Without the WAL the batch's acknowledgement waits for the roll's fsyncs (the
    per-file fsync of the new segment finishes the roll first), so the roll's is the one that
    fails; with it, the WAL's fsync fails first and the roll is left undone."""
    broker = lossy.start_broker(wal=wal)
    topic = f"eio-roll-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, 1, config={"segment.bytes": "2048"})
    with kw.Conn.to(broker.bootstrap, timeout=30) as conn:
        assert conn.produce(topic, 0, kw.record_batch([kw.Record(b"first")]))[0] == kw.NONE
        lossy.fail_fsync()
        # Too big for what is left of the 2 KiB segment: the append rolls first.
        big = kw.record_batch([kw.Record(b"x" * 3000)])
        assert conn.produce(topic, 0, big)[0] == kw.KAFKA_STORAGE_ERROR
        offline = "WAL fsync failed" if wal else "fsync while rolling a segment failed; partition offline"
        assert offline in broker.log()
        lossy.heal()
        assert conn.produce(topic, 0, kw.record_batch([kw.Record(b"healed")]))[0] == kw.KAFKA_STORAGE_ERROR
    power_loss(broker, lossy)
    with kw.Conn.to(broker.bootstrap, timeout=30) as conn:
        assert conn.produce(topic, 0, kw.record_batch([kw.Record(b"after restart")]))[0] == kw.NONE
    read = consume_until(broker.bootstrap, topic, {0: watermarks(broker.bootstrap, topic, 0)[1]})
    assert [m.value() for m in read[0]] == [b"first", b"after restart"]


def test_transactions_survive_power_loss(lossy):
    """Transactions on a disk that loses unsynced writes. Each round commits a transaction
    (records and the group's offsets, sent with it), then leaves a second one open with its
    records in the log, and the power fails. After each restart a new producer with the same
    transactional.id aborts the open one (the coordinator's log kept it, partitions included),
    read_committed readers see every committed record exactly once and nothing of the open
    ones, no partition's last stable offset stays behind, and the group's offsets are those of
    the last committed transaction. A coordinator change not fsynced before its answer shows up
    here as a transaction the broker forgot: its records would hold the last stable offset back
    for ever."""
    from confluent_kafka import IsolationLevel
    from test_transactions import offsets as list_offsets
    from test_transactions import read_all, txn_producer

    broker = lossy.start_broker()
    topic = f"txn-pl-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, PARTITIONS)
    group = f"g-{uuid.uuid4().hex[:8]}"
    committed: list[bytes] = []
    for round_ in range(3):
        producer = txn_producer(broker.bootstrap, "power-loss-txn")
        producer.init_transactions(30)
        consumer = Consumer({"bootstrap.servers": broker.bootstrap, "broker.address.family": "v4",
                             "group.id": group, "enable.auto.commit": False})
        try:
            producer.begin_transaction()
            values = [b"committed-%d-%d" % (round_, i) for i in range(50)]
            for i, value in enumerate(values):
                producer.produce(topic, value=value, partition=i % PARTITIONS)
            tps = [TopicPartition(topic, p, 100 * (round_ + 1) + p) for p in range(PARTITIONS)]
            producer.send_offsets_to_transaction(tps, consumer.consumer_group_metadata(), 30)
            producer.commit_transaction(30)
            committed.extend(values)
            producer.begin_transaction()
            for i in range(30):
                producer.produce(topic, value=b"open-%d-%d" % (round_, i), partition=i % PARTITIONS)
            assert producer.flush(30) == 0
        finally:
            consumer.close()
        power_loss(broker, lossy)

        successor = txn_producer(broker.bootstrap, "power-loss-txn")
        successor.init_transactions(60)  # aborts the open transaction
        stable = list_offsets(broker.bootstrap, topic, PARTITIONS, IsolationLevel.READ_COMMITTED)
        ends = list_offsets(broker.bootstrap, topic, PARTITIONS, IsolationLevel.READ_UNCOMMITTED)
        assert stable == ends, f"round {round_}: a transaction holds the last stable offset back: {stable} < {ends}"
        seen = [r[3] for r in read_all(broker.bootstrap, topic, PARTITIONS, "read_committed")]
        assert sorted(seen) == sorted(committed), (
            f"round {round_}: read_committed sees {len(seen)} records, {len(committed)} committed; "
            f"open ones visible: {[v for v in seen if v.startswith(b'open')][:5]}")
        probe = Consumer({"bootstrap.servers": broker.bootstrap, "broker.address.family": "v4", "group.id": group})
        try:
            got = probe.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=30)
        finally:
            probe.close()
        assert {tp.partition: tp.offset for tp in got} == {p: 100 * (round_ + 1) + p for p in range(PARTITIONS)}
