"""Apache Kafka's own command-line tools (kafka-tools 4.3.1) on tiered topics (KIP-405):
`kafka-configs` turns tiering on for an existing plain topic (and is refused turning it off,
or a local retention above the total), and `kafka-reassign-partitions` moves a tiered
partition to another broker of a 3-node cluster sharing a real S3-compatible store, the new
replica copying only the local tail. The tools run as their main classes from the
tests/kafka-tools/lib classpath, exactly as bin/kafka-configs.sh etc. would run them."""

import json
import re
import time
import uuid

from confluent_kafka.admin import NewTopic

import kafka_wire as kw
import test_tiered_cluster as tc
import test_tiered_storage as ts
from java_support import run_java, tools_cp  # noqa: F401  (tools_cp is a fixture)
from test_cluster_admin import REASSIGN_COMMAND, partition_dirs
from test_kafka_tools import CONFIG_COMMAND

SEGMENT_BYTES = 1 << 20
LOCAL_RETENTION_BYTES = 2 * SEGMENT_BYTES
RECORD_BYTES = 10_000
BEFORE, RECORDS = 300, 3000  # 3 MB written while the topic is plain, 30 MB in all


def run_tool(cp, main_class, *args, logs=lambda: "", ok=True, timeout=120):
    """Runs a Kafka tool; with `ok`, a non-zero exit fails the test with its output and the broker logs."""
    res = run_java(cp, main_class, args, timeout=timeout)
    if ok:
        assert res.returncode == 0, f"{res.report()}\n--- broker log (tail) ---\n{logs()[-6000:]}"
    return res


def dynamic_configs(cp, broker, topic):
    """`kafka-configs --describe` of a topic: its dynamic (per-topic) configs."""
    res = run_tool(cp, CONFIG_COMMAND, "--bootstrap-server", broker.bootstrap, "--describe", "--entity-type", "topics",
                   "--entity-name", topic, logs=broker.log)
    assert f"Dynamic configs for topic {topic} are:" in res.stdout, res.report()
    return dict(re.findall(r"^\s+([\w.]+)=(\S*) sensitive=", res.stdout, re.M)), res


def test_kafka_configs_turns_tiering_on_for_an_existing_topic(broker_factory, tools_cp):
    """kafka-configs --alter --add-config remote.storage.enable=true,local.retention.bytes=...
    on a plain topic that already holds data: --describe shows both; 30 MB later the local log
    starts far above 0 while the earliest offset stays 0 and every record reads back; turning
    tiering off, or a local retention above an explicit retention.bytes, is refused with the
    broker's reason and changes nothing."""
    b = broker_factory(extra_args=ts.FAST)
    cp = tools_cp
    topic = f"plain-{uuid.uuid4().hex[:8]}"
    kw.create_topic(b.bootstrap, topic, 1, {"segment.bytes": str(SEGMENT_BYTES)})
    ts.produce(b.bootstrap, topic, 1, 0, BEFORE)
    assert ts.local_start(b.bootstrap, topic, 0) == 0

    def configs(*args, ok=True):
        return run_tool(cp, CONFIG_COMMAND, "--bootstrap-server", b.bootstrap, "--alter", "--entity-type", "topics",
                        "--entity-name", topic, *args, logs=b.log, ok=ok)

    res = configs("--add-config", f"remote.storage.enable=true,local.retention.bytes={LOCAL_RETENTION_BYTES}")
    assert f"Completed updating config for topic {topic}." in res.stdout, res.report()
    got, res = dynamic_configs(cp, b, topic)
    assert got == {"segment.bytes": str(SEGMENT_BYTES), "remote.storage.enable": "true",
                   "local.retention.bytes": str(LOCAL_RETENTION_BYTES)}, res.report()

    ts.produce(b.bootstrap, topic, 1, BEFORE, RECORDS - BEFORE)
    ts.wait_until("the local log to shrink to its retention",
                  lambda: ts.local_start(b.bootstrap, topic, 0) > RECORDS // 2
                  and ts.local_bytes(b.data_dir, topic, 0) <= LOCAL_RETENTION_BYTES + 2 * SEGMENT_BYTES, timeout=60)
    assert kw.watermarks(b.bootstrap, topic, 0) == (0, RECORDS), "the earliest offset is the remote tier's start"
    # The segments written before tiering was on were copied too: the remote tier starts at 0.
    assert ts.latest_tiered(b.bootstrap, topic, 0) >= ts.local_start(b.bootstrap, topic, 0) - 1
    assert list((b.data_dir / "remote-store").rglob("*.log")), "nothing in the local-directory store"
    ts.check_all(b.bootstrap, topic, 1, RECORDS)

    off = configs("--add-config", "remote.storage.enable=false", ok=False)
    assert off.returncode != 0, off.report()
    assert "cannot be turned off" in off.stdout + off.stderr, off.report()

    res = configs("--add-config", "retention.bytes=104857600")  # 100 MiB: above the 30 MB written
    assert f"Completed updating config for topic {topic}." in res.stdout, res.report()
    too_big = configs("--add-config", "local.retention.bytes=209715200", ok=False)
    assert too_big.returncode != 0, too_big.report()
    assert "local.retention.bytes (209715200) must be at most retention.bytes (104857600)" in \
        too_big.stdout + too_big.stderr, too_big.report()

    got, res = dynamic_configs(cp, b, topic)
    assert got == {"segment.bytes": str(SEGMENT_BYTES), "remote.storage.enable": "true",
                   "local.retention.bytes": str(LOCAL_RETENTION_BYTES), "retention.bytes": "104857600"}, res.report()
    assert kw.watermarks(b.bootstrap, topic, 0) == (0, RECORDS)
    assert b.is_running(), b.log()[-4000:]


def test_kafka_reassign_partitions_moves_a_tiered_partition(tmp_path, tools_cp):
    """kafka-reassign-partitions --execute / --verify move a replica of an RF=2 tiered topic
    holding 30 MB (2 MiB of local retention) off its leader to the third broker: the new
    replica's log directory holds only the local tail, the old one's is deleted, and every
    record reads back from offset 0."""
    s3, cluster = tc.start(tmp_path)

    def logs():
        return "\n".join(f"--- node {n} ---\n{node.log()[-3000:]}" for n, node in cluster.nodes.items())

    try:
        topic = f"tiered-{uuid.uuid4().hex[:8]}"
        config = {"remote.storage.enable": "true", "segment.bytes": str(SEGMENT_BYTES),
                  "local.retention.bytes": str(LOCAL_RETENTION_BYTES), "min.insync.replicas": "1"}
        admin = cluster.admin()
        admin.create_topics([NewTopic(topic, 1, 2, config=config)])[topic].result(timeout=30)

        def settled_at(node_id):
            states = cluster.partition_states_at(node_id, topic)
            return 0 in states and states[0].leader > 0 and len(states[0].isr) == 2

        cluster.wait_for("a leader and 2 in-sync replicas on every node",
                         lambda: all(settled_at(n) for n in cluster.nodes))
        leader, replicas, _ = cluster.partition_state(topic, 0)
        (follower,) = set(replicas) - {leader}
        (spare,) = set(cluster.nodes) - set(replicas)
        tc.produce(cluster.bootstrap, topic, 0, RECORDS)
        cluster.wait_for("every replica's local log to shrink to its retention", lambda: all(
            tc.local_bytes(cluster, n, topic) <= LOCAL_RETENTION_BYTES + 2 * SEGMENT_BYTES for n in replicas)
            and tc.local_start_at(cluster, leader, topic) > RECORDS // 2, timeout=60)

        target = [spare, follower]
        plan = tmp_path / "plan.json"
        plan.write_text(json.dumps({"version": 1, "partitions": [
            {"topic": topic, "partition": 0, "replicas": target, "log_dirs": ["any", "any"]}]}))

        def reassign(*args):
            return run_tool(tools_cp, REASSIGN_COMMAND, "--bootstrap-server", cluster.bootstrap,
                            "--reassignment-json-file", plan, *args, logs=logs).stdout

        started = time.monotonic()
        out = reassign("--execute")
        assert "Successfully started partition reassignment" in out, out
        # Plain --verify, as an operator runs it: once the move is complete it also removes
        # replication throttles (Sluice has none, and says so by accepting the removal).
        cluster.wait_for("--verify reports completion", lambda: f"Reassignment of partition {topic}-0 is completed"
                         in reassign("--verify"), timeout=60)
        took = time.monotonic() - started
        leader_after, replicas_after, isr_after = cluster.partition_state(topic, 0)
        assert sorted(replicas_after) == sorted(target) and leader_after in target, \
            (leader_after, replicas_after, isr_after)
        cluster.wait_for("the new replica in sync",
                         lambda: sorted(cluster.partition_state(topic, 0)[2]) == sorted(target))
        cluster.wait_for("the old replica's log deleted", lambda: not partition_dirs(cluster, topic)[leader])
        copied = tc.local_bytes(cluster, spare, topic)
        assert 0 < copied <= LOCAL_RETENTION_BYTES + 3 * SEGMENT_BYTES, \
            f"the new replica holds {copied} bytes of a {RECORDS * RECORD_BYTES}-byte partition"
        print(f"kafka-reassign-partitions moved a {RECORDS * RECORD_BYTES >> 20} MiB tiered partition in {took:.1f} s "
              f"(--execute to a completed --verify); the new replica holds {copied >> 10} KiB")
        tc.check_all(cluster.bootstrap, topic, RECORDS)
        assert all(node.is_running() for node in cluster.nodes.values()), logs()
    finally:
        cluster.kill_all()
        s3.stop()
