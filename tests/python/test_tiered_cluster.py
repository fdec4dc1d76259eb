"""Tiered storage in a 3-node cluster, against a real S3-compatible server (s3s-fs): the
remote log metadata lives in the controller's replicated metadata, so a new leader after
a kill -9 serves the whole history from offset 0 (to librdkafka and the Java client), and
a reassignment of a tiered partition copies only the local tail to the new replica.

The slow tier (SLUICE_SLOW_TESTS=1) runs the failover test with 2 GiB of history and
64 MiB of local retention; the default is 30 MB and 2 MiB."""

import os
import time
import uuid

from confluent_kafka import KafkaError, Producer

import kafka_wire as kw
from cluster_support import Cluster, create_topic
from java_support import java_cp, run_java  # noqa: F401  (java_cp is a fixture)
from s3_server import start_s3_server
from test_cluster_admin import alter_reassignment, list_reassignments, partition_dirs
from test_tiered_storage import segment_files_bytes, value

SLOW = os.environ.get("SLUICE_SLOW_TESTS") == "1"
RECORD_BYTES = 10_000
SEGMENT_BYTES = (16 << 20) if SLOW else (1 << 20)
LOCAL_RETENTION_BYTES = (64 << 20) if SLOW else (2 << 20)
RECORDS = (2 << 30) // RECORD_BYTES if SLOW else 3000
EARLIEST_LOCAL = -4


def start(tmp_path):
    s3 = start_s3_server(tmp_path)
    store = [f"tiered_storage.url=s3://{s3.bucket}/sluice", f"tiered_storage.endpoint={s3.endpoint}",
             "tiered_storage.allow_http=true", f"tiered_storage.access_key_id={s3.access_key}",
             f"tiered_storage.secret_access_key={s3.secret_key}", "tiered_storage.task_interval_ms=200"]
    args = ["--log-retention-check-interval-ms", "200"] + [x for o in store for x in ("--override", o)]
    try:
        cluster = Cluster(tmp_path, node_args=lambda node_id, port: args).start()
    except BaseException:
        s3.stop()
        raise
    return s3, cluster


def produce(bootstrap: str, topic: str, start_at: int, count: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "enable.idempotence": True,
                  "compression.type": "none"})
    failed = []
    acked = [0]

    def delivered(err, msg):
        if err:
            failed.append(err)
        else:
            acked[0] += 1
    for n in range(start_at, start_at + count):
        while True:
            try:
                p.produce(topic, partition=0, value=value(0, n), on_delivery=delivered)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    assert p.flush(300) == 0
    assert not failed and acked[0] == count, (acked[0], failed[:3])


def local_start_at(cluster, node_id: int, topic: str) -> int:
    with kw.Conn.to(cluster.nodes[node_id].bootstrap) as conn:
        err, _, offset = conn.list_offsets(topic, 0, EARLIEST_LOCAL, version=8)
        return offset if err == 0 else -1


def latest_tiered_at(cluster, node_id: int, topic: str) -> int:
    with kw.Conn.to(cluster.nodes[node_id].bootstrap) as conn:
        err, _, offset = conn.list_offsets(topic, 0, -5, version=9)
        return offset if err == 0 else -1


def local_bytes(cluster, node_id: int, topic: str) -> int:
    return segment_files_bytes(cluster.nodes[node_id].data_dir / "logs" / f"{topic}-0")


def check_all(bootstrap: str, topic: str, end: int, timeout: float = 600) -> None:
    """Offsets 0..end-1 read back in order, each record byte for byte (streamed: the slow
    tier's 2 GiB are never held in memory)."""
    c = kw.consumer(bootstrap)
    c.assign([kw.TopicPartition(topic, 0, 0)])
    expected = 0
    deadline = time.monotonic() + timeout
    try:
        while expected < end:
            assert time.monotonic() < deadline, f"timed out at offset {expected} of {end}"
            for m in c.consume(num_messages=10000, timeout=0.5):
                if m.error():
                    assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
                    continue
                assert m.offset() == expected, f"offset {m.offset()} where {expected} was expected"
                assert m.value() == value(0, m.offset()), f"record {m.offset()} differs"
                expected += 1
    finally:
        c.close()


def tiered_topic(cluster, **extra) -> str:
    topic = f"tiered-{uuid.uuid4().hex[:8]}"
    create_topic(cluster, topic, 1, {"remote.storage.enable": "true", "segment.bytes": str(SEGMENT_BYTES),
                                     "local.retention.bytes": str(LOCAL_RETENTION_BYTES), **extra})
    return topic


def test_a_new_leader_serves_the_whole_tiered_history(tmp_path, java_cp):
    s3, cluster = start(tmp_path)
    try:
        topic = tiered_topic(cluster)
        produce(cluster.bootstrap, topic, 0, RECORDS)
        leader, replicas, _ = cluster.partition_state(topic, 0)
        # Every replica keeps only its local tail: followers apply the leader's remote log
        # metadata as it commits it.
        cluster.wait_for("every replica's local log to shrink to its retention", lambda: all(
            local_start_at(cluster, n, topic) > RECORDS // 2 if n == leader
            else local_bytes(cluster, n, topic) <= LOCAL_RETENTION_BYTES + 2 * SEGMENT_BYTES
            for n in replicas), timeout=900 if SLOW else 60)
        assert list(s3.bucket_dir.rglob("*.log")), "nothing uploaded to the S3 server"
        check_all(cluster.bootstrap, topic, RECORDS)

        cluster.nodes[leader].kill()
        cluster.wait_for("a new leader", lambda: cluster.partition_state(topic, 0)[0] not in (leader, -1), timeout=30)
        new_leader = cluster.partition_state(topic, 0)[0]
        assert local_start_at(cluster, new_leader, topic) > 0, "the new leader's local log still starts at 0"
        assert local_bytes(cluster, new_leader, topic) <= LOCAL_RETENTION_BYTES + 2 * SEGMENT_BYTES
        check_all(cluster.bootstrap, topic, RECORDS)
        live = ",".join(n.bootstrap for i, n in cluster.nodes.items() if i != leader)
        java = run_java(java_cp, "sluice.tests.TieredReader",
                        ["--bootstrap", live, "--topic", topic, "--partitions", "1", "--records", str(RECORDS)],
                        timeout=600)
        assert java.returncode == 0 and "PASS tiered" in java.stdout, java.report()
        more = 2 * SEGMENT_BYTES // RECORD_BYTES + 10
        produce(cluster.bootstrap, topic, RECORDS, more)
        # The new leader copies on where the old one stopped.
        cluster.wait_for("copies by the new leader", lambda: latest_tiered_at(cluster, new_leader, topic) >= RECORDS,
                         timeout=120)
        check_all(cluster.bootstrap, topic, RECORDS + more)
    finally:
        cluster.kill_all()
        s3.stop()


def test_reassigning_a_tiered_partition_copies_only_its_local_tail(tmp_path):
    s3, cluster = start(tmp_path)
    try:
        topic = tiered_topic(cluster, **{"min.insync.replicas": "1"})
        _, replicas, _ = cluster.partition_state(topic, 0)
        source = sorted(replicas)[:2]
        assert alter_reassignment(cluster.nodes[1].bootstrap, topic, 0, source)[:2] == (0, 0)
        cluster.wait_for("rf=2", lambda: sorted(cluster.partition_state(topic, 0)[1]) == source)
        (spare,) = set(cluster.nodes) - set(source)
        cluster.wait_for("the dropped replica's log deleted", lambda: not partition_dirs(cluster, topic)[spare])
        produce(cluster.bootstrap, topic, 0, RECORDS)
        leader = cluster.partition_state(topic, 0)[0]
        cluster.wait_for("the leader's local log to shrink to its retention",
                         lambda: local_start_at(cluster, leader, topic) > RECORDS // 2
                         and local_bytes(cluster, leader, topic) <= LOCAL_RETENTION_BYTES + 2 * SEGMENT_BYTES,
                         timeout=60)

        target = [source[0], spare]
        live = cluster.nodes[source[0]].bootstrap
        started = time.monotonic()
        assert alter_reassignment(live, topic, 0, target)[:2] == (0, 0)
        cluster.wait_for("the move finished", lambda: not list_reassignments(live), timeout=60)
        took = time.monotonic() - started
        # As the node that answered it sees it (librdkafka may ask a node that applies the
        # move's last step a moment later).
        cluster.wait_for("the new replica set", lambda: sorted(cluster.partition_states_at(source[0], topic)[0].replicas)
                         == sorted(target))
        copied = local_bytes(cluster, spare, topic)
        assert copied <= LOCAL_RETENTION_BYTES + 3 * SEGMENT_BYTES, \
            f"the new replica copied {copied} bytes of a {RECORDS * RECORD_BYTES}-byte partition"
        print(f"reassignment of a {RECORDS * RECORD_BYTES >> 20} MiB tiered partition took {took:.2f} s, "
              f"copied {copied >> 10} KiB")
        check_all(cluster.bootstrap, topic, RECORDS)
    finally:
        cluster.kill_all()
        s3.stop()


def test_a_broker_replaced_by_an_empty_one_fetches_only_the_tails(tmp_path):
    """A node whose disk was lost comes back empty: it rejoins the quorum and its replicas of a
    tiered partition copy only the leader's local tail, not the history."""
    import shutil

    s3, cluster = start(tmp_path)
    try:
        topic = tiered_topic(cluster)
        produce(cluster.bootstrap, topic, 0, RECORDS)
        leader, replicas, _ = cluster.partition_state(topic, 0)
        cluster.wait_for("the leader's local log to shrink to its retention",
                         lambda: local_start_at(cluster, leader, topic) > RECORDS // 2
                         and local_bytes(cluster, leader, topic) <= LOCAL_RETENTION_BYTES + 2 * SEGMENT_BYTES,
                         timeout=60)
        (lost,) = [n for n in replicas if n != leader][:1]
        node = cluster.nodes[lost]
        node.kill()
        shutil.rmtree(node.data_dir)
        node.start()
        tail = local_bytes(cluster, leader, topic)
        cluster.wait_for("the empty node to copy the leader's tail",
                         lambda: local_bytes(cluster, lost, topic) >= tail - SEGMENT_BYTES, timeout=60)
        cluster.wait_for("the empty node back in the ISR",
                         lambda: sorted(cluster.partition_state(topic, 0)[2]) == sorted(replicas), timeout=60)
        copied = local_bytes(cluster, lost, topic)
        assert 0 < copied <= LOCAL_RETENTION_BYTES + 3 * SEGMENT_BYTES, \
            f"the empty node copied {copied} bytes of a {RECORDS * RECORD_BYTES}-byte partition"
        check_all(cluster.bootstrap, topic, RECORDS)
    finally:
        cluster.kill_all()
        s3.stop()
