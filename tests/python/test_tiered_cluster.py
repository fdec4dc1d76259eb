"""Tiered storage in a 3-node cluster, against a real S3-compatible server (s3s-fs): the
remote log metadata lives in the controller's replicated metadata, so a new leader after
a kill -9 serves the whole history from offset 0, and a reassignment of a tiered
partition copies only the local tail to the new replica."""

import time
import uuid

from confluent_kafka import Producer

import kafka_wire as kw
from cluster_support import Cluster, create_topic
from s3_server import start_s3_server
from test_cluster_admin import alter_reassignment, list_reassignments, partition_dirs

RECORD_BYTES = 10_000
SEGMENT_BYTES = 1 << 20
LOCAL_RETENTION_BYTES = 2 * SEGMENT_BYTES
RECORDS = 3000
EARLIEST_LOCAL = -4


def value(offset: int) -> bytes:
    return b"%08d" % offset + b"c" * (RECORD_BYTES - 8)


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
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "enable.idempotence": True})
    errs = []
    for n in range(start_at, start_at + count):
        p.produce(topic, partition=0, value=value(n), on_delivery=lambda err, msg: errs.append(err))
        p.poll(0)
    assert p.flush(60) == 0
    assert errs == [None] * count, [e for e in errs if e][:3]


def local_start_at(cluster, node_id: int, topic: str) -> int:
    with kw.Conn.to(cluster.nodes[node_id].bootstrap) as conn:
        err, _, offset = conn.list_offsets(topic, 0, EARLIEST_LOCAL, version=8)
        return offset if err == 0 else -1


def local_bytes(cluster, node_id: int, topic: str) -> int:
    return sum(f.stat().st_size for f in (cluster.nodes[node_id].data_dir / "logs" / f"{topic}-0").glob("*.log"))


def check_all(bootstrap: str, topic: str, end: int) -> None:
    got = kw.consume_until(bootstrap, topic, {0: end}, timeout=120)[0]
    offsets = [m.offset() for m in got]
    assert offsets == list(range(end)), f"{len(offsets)} records, gaps at {[o for i, o in enumerate(offsets) if o != i][:3]}"
    bad = [m.offset() for m in got if m.value() != value(m.offset())]
    assert not bad, f"records differ at offsets {bad[:5]}"


def tiered_topic(cluster, **extra) -> str:
    topic = f"tiered-{uuid.uuid4().hex[:8]}"
    create_topic(cluster, topic, 1, {"remote.storage.enable": "true", "segment.bytes": str(SEGMENT_BYTES),
                                     "local.retention.bytes": str(LOCAL_RETENTION_BYTES), **extra})
    return topic


def test_a_new_leader_serves_the_whole_tiered_history(tmp_path):
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
            for n in replicas), timeout=60)
        assert list(s3.bucket_dir.rglob("*.log")), "nothing uploaded to the S3 server"
        check_all(cluster.bootstrap, topic, RECORDS)

        cluster.nodes[leader].kill()
        cluster.wait_for("a new leader", lambda: cluster.partition_state(topic, 0)[0] not in (leader, -1), timeout=30)
        new_leader = cluster.partition_state(topic, 0)[0]
        assert local_start_at(cluster, new_leader, topic) > 0, "the new leader's local log still starts at 0"
        check_all(cluster.bootstrap, topic, RECORDS)
        produce(cluster.bootstrap, topic, RECORDS, 500)
        # The new leader copies on where the old one stopped.
        cluster.wait_for("copies by the new leader", lambda: local_start_at(cluster, new_leader, topic) > RECORDS)
        check_all(cluster.bootstrap, topic, RECORDS + 500)
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
        cluster.wait_for("the leader's local log to shrink",
                         lambda: local_start_at(cluster, leader, topic) > RECORDS // 2, timeout=60)

        target = [source[0], spare]
        live = cluster.nodes[source[0]].bootstrap
        started = time.monotonic()
        assert alter_reassignment(live, topic, 0, target)[:2] == (0, 0)
        cluster.wait_for("the move finished", lambda: not list_reassignments(live), timeout=60)
        took = time.monotonic() - started
        assert sorted(cluster.partition_state(topic, 0)[1]) == sorted(target)
        copied = local_bytes(cluster, spare, topic)
        assert copied <= LOCAL_RETENTION_BYTES + 3 * SEGMENT_BYTES, \
            f"the new replica copied {copied} bytes of a {RECORDS * RECORD_BYTES}-byte partition"
        print(f"reassignment of a {RECORDS * RECORD_BYTES >> 20} MiB tiered partition took {took:.2f} s, "
              f"copied {copied >> 10} KiB")
        check_all(cluster.bootstrap, topic, RECORDS)
    finally:
        cluster.kill_all()
        s3.stop()
