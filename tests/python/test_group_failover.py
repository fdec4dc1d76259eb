"""Group coordinators and committed offsets that move with failover, and the offsets log's
compaction and retention, with real processes and librdkafka clients.

- 3 nodes: a classic group commits, its coordinator (the leader of the group's
  `__consumer_offsets` partition) is killed with SIGKILL, FindCoordinator names another
  node within seconds, OffsetFetch there returns the last acknowledged commit, and the
  consumer goes on with nothing skipped and nothing re-read.
- 1 node: thousands of commits leave the offsets log small (compaction snapshots), a
  crash and restart restores the latest offsets; offsets of a group without members
  expire after the retention, those of a live group stay.
"""

import time

from confluent_kafka import OFFSET_INVALID, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

import kafka_wire as kw
from cluster_support import Cluster, create_topic

GROUP = "failover-group"
TOPIC = "orders"
PARTITIONS = 3
RECORDS = 300
COORDINATOR_MOVE_LIMIT_S = 10.0


def coordinator_of(nodes, group):
    """The coordinator the first reachable node names, -1 while none is available. Asked
    over the wire: librdkafka's admin client can hang (or abort, librdkafka#4605) on a
    group whose coordinator just died."""
    for node in nodes:
        try:
            with kw.Conn.to(node.bootstrap, timeout=2.0) as conn:
                error, coordinator = conn.find_coordinator(group)
        except OSError:
            continue
        return coordinator if error == 0 else -1
    return -1


def committed(admin, group, topic, partitions):
    from confluent_kafka import ConsumerGroupTopicPartitions

    request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in range(partitions)])
    result = admin.list_consumer_group_offsets([request])[group].result(10)
    return {tp.partition: tp.offset for tp in result.topic_partitions if not tp.error and tp.offset >= 0}


class Progress:
    """What a consumer saw and which commits were acknowledged."""

    def __init__(self):
        self.seen = []
        self.acked = {}
        self.failed_commits = 0


def consume_and_commit(consumer, progress, distinct, timeout_s=30.0):
    """Consumes until `distinct` different records were seen, committing synchronously
    after each batch (a commit refused while the coordinator moves is retried)."""
    deadline = time.monotonic() + timeout_s
    while len(set(progress.seen)) < distinct and time.monotonic() < deadline:
        batch = [m for m in consumer.consume(20, 1.0) if not m.error()]
        if not batch:
            continue
        progress.seen.extend((m.partition(), m.offset()) for m in batch)
        for _ in range(20):
            try:
                for tp in consumer.commit(asynchronous=False):
                    if tp.offset >= 0:
                        progress.acked[tp.partition] = tp.offset
                break
            except Exception:
                progress.failed_commits += 1
                time.sleep(0.3)


def test_coordinator_kill_9_keeps_the_group_and_its_offsets(tmp_path):
    cluster = Cluster(tmp_path)
    for node in cluster.nodes.values():
        node.extra_args += ["--offsets-topic-num-partitions", "6", "--group-initial-rebalance-delay-ms", "0"]
    cluster.start()
    try:
        create_topic(cluster, TOPIC, PARTITIONS)
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": True})
        for i in range(RECORDS):
            producer.produce(TOPIC, key=str(i).encode(), value=b"v", partition=i % PARTITIONS)
        assert producer.flush(30) == 0

        consumer = Consumer({
            "bootstrap.servers": cluster.bootstrap,
            "group.id": GROUP,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 10000,
            "heartbeat.interval.ms": 500,
        })
        consumer.subscribe([TOPIC])
        progress = Progress()
        consume_and_commit(consumer, progress, RECORDS // 2)
        assert len(progress.seen) >= RECORDS // 2 and progress.acked, (len(progress.seen), progress.acked)
        acked = dict(progress.acked)
        before_kill = len(progress.seen)

        admin = cluster.admin()
        old = cluster.wait_for("a coordinator", lambda: (c := coordinator_of(cluster.nodes.values(), GROUP)) > 0 and c)
        with kw.Conn.to(cluster.nodes[old].bootstrap) as conn:
            listed = conn.metadata_detail(None)
        assert listed.topics["__consumer_offsets"].internal and not listed.topics[TOPIC].internal
        assert committed(admin, GROUP, TOPIC, PARTITIONS) == acked
        cluster.nodes[old].kill()
        killed_at = time.monotonic()
        surviving = [n for i, n in cluster.nodes.items() if i != old]
        survivors = AdminClient({"bootstrap.servers": ",".join(
            n.bootstrap for i, n in cluster.nodes.items() if i != old)})
        new = cluster.wait_for(
            "a new coordinator",
            lambda: (c := coordinator_of(surviving, GROUP)) not in (old, -1) and c,
            timeout=COORDINATOR_MOVE_LIMIT_S,
        )
        moved_s = time.monotonic() - killed_at
        assert new != old and moved_s < COORDINATOR_MOVE_LIMIT_S, (old, new, moved_s)
        # The new coordinator answers OffsetFetch with the last acknowledged commit.
        offsets = cluster.wait_for(
            "offsets at the new coordinator",
            lambda: committed(survivors, GROUP, TOPIC, PARTITIONS) or None,
            timeout=COORDINATOR_MOVE_LIMIT_S,
        )
        assert offsets == acked, (offsets, acked)

        # The group goes on and reads the rest.
        consume_and_commit(consumer, progress, RECORDS, timeout_s=40.0)
        consumer.close()
        assert len(set(progress.seen)) == RECORDS, f"only {len(set(progress.seen))} of {RECORDS} consumed"
        # Resumed exactly at the last acknowledged commit: nothing skipped, nothing before it again.
        after = progress.seen[before_kill:]
        for partition in range(PARTITIONS):
            mine = [offset for p, offset in after if p == partition]
            if mine:
                assert min(mine) == acked.get(partition, 0), (partition, mine[:5], acked)
        if progress.failed_commits == 0:
            assert len(progress.seen) == RECORDS, "a record was read twice although every commit succeeded"
        assert committed(survivors, GROUP, TOPIC, PARTITIONS) == progress.acked
        assert sum(progress.acked.values()) == RECORDS
    finally:
        cluster.kill_all()


def commit_simple(bootstrap, group, topic, offsets):
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False)
    finally:
        consumer.close()


def fetch_committed(bootstrap, group, topic, partitions):
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        got = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        return {tp.partition: tp.offset for tp in got}
    finally:
        consumer.close()


def dir_bytes(path):
    return sum(f.stat().st_blocks * 512 for f in path.rglob("*") if f.is_file())


def test_compaction_bounds_the_offsets_log_and_a_restart_keeps_the_latest(broker_factory):
    broker = broker_factory(extra_args=[
        "--offsets-snapshot-interval-bytes", "16384", "--offsets-topic-segment-bytes", "65536",
    ])
    partitions = 10
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    from confluent_kafka.admin import NewTopic

    admin.create_topics([NewTopic("compacted", num_partitions=partitions, replication_factor=1)])["compacted"].result(10)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "busy", "enable.auto.commit": False})
    commits = 1500
    for i in range(commits):
        consumer.commit(offsets=[TopicPartition("compacted", p, i + p) for p in range(partitions)], asynchronous=False)
    consumer.close()
    # Every commit is about 700 bytes: uncompacted the log would be ~1 MB.
    time.sleep(0.5)
    groups_dir = broker.data_dir / "groups"
    size = dir_bytes(groups_dir)
    assert size < 512 * 1024, f"offsets log is {size} bytes"
    broker.kill()
    broker.start()
    expected = {p: commits - 1 + p for p in range(partitions)}
    assert fetch_committed(broker.bootstrap, "busy", "compacted", partitions) == expected


def test_retention_expires_offsets_of_a_group_without_members(broker_factory):
    broker = broker_factory(extra_args=[
        "--offsets-retention-ms", "2000", "--offsets-retention-check-interval-ms", "200",
        "--group-initial-rebalance-delay-ms", "0",
    ])
    bootstrap = broker.bootstrap
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce("kept", value=b"x")
    producer.produce("gone", value=b"x")
    assert producer.flush(10) == 0
    commit_simple(bootstrap, "gone", "gone", {0: 1})
    live = Consumer({
        "bootstrap.servers": bootstrap, "group.id": "alive", "enable.auto.commit": False,
        "auto.offset.reset": "earliest", "session.timeout.ms": 6000, "heartbeat.interval.ms": 300,
    })
    live.subscribe(["kept"])
    got = []
    deadline = time.monotonic() + 20
    while not got and time.monotonic() < deadline:
        got = [m for m in live.consume(1, 0.5) if not m.error()]
    assert got
    live.commit(message=got[0], asynchronous=False)
    assert fetch_committed(bootstrap, "gone", "gone", 1) == {0: 1}
    # The member keeps the live group's offsets; the empty group's expire.
    deadline = time.monotonic() + 10
    while fetch_committed(bootstrap, "gone", "gone", 1) != {0: OFFSET_INVALID} and time.monotonic() < deadline:
        live.poll(0.2)
    assert fetch_committed(bootstrap, "gone", "gone", 1) == {0: OFFSET_INVALID}
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        live.poll(0.2)
    assert fetch_committed(bootstrap, "alive", "kept", 1) == {0: 1}
    live.close()
    # Expiry is durable: tombstones survive a restart.
    broker.kill()
    broker.start()
    assert fetch_committed(bootstrap, "gone", "gone", 1) == {0: OFFSET_INVALID}


def java_string_hash(text):
    value = 0
    encoded = text.encode("utf-16-be")
    for i in range(0, len(encoded), 2):
        value = (value * 31 + int.from_bytes(encoded[i:i + 2], "big")) & 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def offsets_partition(group, partitions):
    value = java_string_hash(group)
    return 0 if value == -(1 << 31) else abs(value) % partitions


def test_compacted_offsets_partition_replicates_and_fails_over(tmp_path):
    """Compaction in a cluster: followers follow the leader's log start, a follower that
    was down while the leader compacted past its log end starts over at the leader's log
    start, and a new coordinator loading a compacted partition has the latest offsets."""
    cluster = Cluster(tmp_path)
    offsets_partitions = 3
    for node in cluster.nodes.values():
        node.extra_args += [
            "--offsets-topic-num-partitions", str(offsets_partitions),
            "--offsets-snapshot-interval-bytes", "8192", "--offsets-topic-segment-bytes", "65536",
        ]
    cluster.start()
    try:
        create_topic(cluster, "compacted", 10)
        group = "compacting-group"
        partition = offsets_partition(group, offsets_partitions)
        consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group, "enable.auto.commit": False})

        def first_commit():
            consumer.commit(offsets=[TopicPartition("compacted", 0, 1)], asynchronous=False)
            return True

        # Nodes take the leaderships the controller gave them a moment after it committed
        # them: until the group's coordinator has, it answers NOT_COORDINATOR, which a
        # synchronous librdkafka commit reports (the Java client retries it).
        cluster.wait_for("the group's coordinator to take a commit", first_commit)
        leader = coordinator_of(cluster.nodes.values(), group)
        lagging = next(i for i in cluster.nodes if i != leader)
        cluster.nodes[lagging].kill()
        commits = 600
        for i in range(commits):
            consumer.commit(offsets=[TopicPartition("compacted", p, i + p) for p in range(10)], asynchronous=False)
        consumer.close()

        def log_start(node):
            path = node.data_dir / "logs" / f"__consumer_offsets-{partition}" / "log-start-offset"
            return int(path.read_text()) if path.exists() else 0

        assert log_start(cluster.nodes[leader]) > 0
        cluster.nodes[lagging].start()
        cluster.wait_for(
            "every replica compacted and in sync",
            lambda: all(log_start(n) > 0 for n in cluster.nodes.values())
            and len(cluster.partition_state("__consumer_offsets", partition)[2]) == 3,
        )
        assert "before the leader's log start" in cluster.nodes[lagging].log_path.read_text(errors="replace")

        cluster.nodes[leader].kill()
        survivors = AdminClient({"bootstrap.servers": ",".join(
            n.bootstrap for i, n in cluster.nodes.items() if i != leader)})
        surviving = [n for i, n in cluster.nodes.items() if i != leader]
        cluster.wait_for("a new coordinator", lambda: coordinator_of(surviving, group) not in (leader, -1),
                         timeout=COORDINATOR_MOVE_LIMIT_S)
        expected = {p: commits - 1 + p for p in range(10)}
        got = cluster.wait_for("offsets at the new coordinator",
                               lambda: committed(survivors, group, "compacted", 10) or None,
                               timeout=COORDINATOR_MOVE_LIMIT_S)
        assert got == expected
    finally:
        cluster.kill_all()
