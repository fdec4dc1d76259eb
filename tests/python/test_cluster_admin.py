"""Topic administration and partition reassignment in a 3-node cluster of real `sluice
serve` processes: DeleteTopics, CreatePartitions and config changes go through the
controller and take effect on every node; a reassignment copies a partition to its new
replica while an idempotent producer writes with acks=all, then drops the old replica.
"""

import shutil
import signal
import threading
import time

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewPartitions,
                                   NewTopic, ResourceType)

import kafka_wire as kw
from java_support import tools_cp  # noqa: F401  (a fixture)
from cluster_support import LoadProducer, consume_all, create_topic


def partition_dirs(cluster, topic):
    """{node id: [partition dir names of `topic`]} from every node's data dir."""
    out = {}
    for node_id, node in cluster.nodes.items():
        logs = node.data_dir / "logs"
        names = [p.name for p in logs.iterdir()] if logs.exists() else []
        out[node_id] = sorted(n for n in names if n.rsplit("-", 1)[0] == topic)
    return out


def topics_seen_by(node):
    return set(AdminClient({"bootstrap.servers": node.bootstrap}).list_topics(timeout=10).topics)


def test_delete_topic_everywhere_then_recreate(cluster):
    create_topic(cluster, "doomed", 3)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for i in range(30):
        producer.produce("doomed", key=f"k{i}", value=b"v", partition=i % 3)
    assert producer.flush(30) == 0
    assert all(len(dirs) == 3 for dirs in partition_dirs(cluster, "doomed").values())

    admin = cluster.admin()
    admin.delete_topics(["doomed"])["doomed"].result(timeout=30)
    # The answer comes once the controller has committed the deletion; each node applies it
    # when it learns of the commit, a moment later under load (Kafka's brokers too).
    for node_id, node in cluster.nodes.items():
        cluster.wait_for(f"node {node_id} no longer lists doomed", lambda node=node: "doomed" not in topics_seen_by(node))
    cluster.wait_for(
        "logs deleted on every node", lambda: all(not d for d in partition_dirs(cluster, "doomed").values())
    )
    # Unknown and internal topics are refused with Kafka's errors.
    try:
        admin.delete_topics(["doomed"])["doomed"].result(timeout=30)
        raise AssertionError("deleting a deleted topic succeeded")
    except KafkaException as error:
        assert error.args[0].code() == 3, error  # UNKNOWN_TOPIC_OR_PARTITION
    try:
        admin.delete_topics(["__consumer_offsets"])["__consumer_offsets"].result(timeout=30)
        raise AssertionError("deleting __consumer_offsets succeeded")
    except KafkaException as error:
        assert error.args[0].code() == 17, error  # INVALID_TOPIC_EXCEPTION

    create_topic(cluster, "doomed", 2)
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "unused"})
    for p in range(2):
        # A node may name itself leader in Metadata a moment before its role is applied
        # (Kafka too); librdkafka's watermark query does not retry NOT_LEADER_OR_FOLLOWER,
        # so the test does, as an application would.
        low, high = cluster.wait_for(
            f"watermarks of doomed/{p}", lambda: consumer.get_watermark_offsets(TopicPartition("doomed", p), timeout=10)
        )
        assert (low, high) == (0, 0), "the recreated topic starts empty"
    consumer.close()
    assert all(len(dirs) == 2 for dirs in partition_dirs(cluster, "doomed").values())


def test_logs_of_topics_deleted_while_a_node_was_down_are_not_kept_or_reused(cluster):
    """A node down while its topics are deleted (one of them created again under the same
    name) deletes their logs when it returns, and a replica of the new topic placed on it
    starts from the new topic's data, not the old log of the same name."""
    create_topic(cluster, "gone", 2)
    create_topic(cluster, "reborn", 1)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for i in range(20):
        producer.produce("gone", key=f"old{i}", value=b"v", partition=i % 2)
        producer.produce("reborn", key=f"old{i}", value=b"v")
    assert producer.flush(30) == 0
    down = 3
    others = [i for i in cluster.nodes if i != down]
    cluster.nodes[down].kill()
    survivors = AdminClient({"bootstrap.servers": ",".join(cluster.nodes[i].bootstrap for i in others)})
    cluster.wait_for(f"node {down} fenced", lambda: down not in survivors.list_topics(timeout=5).brokers)
    for future in survivors.delete_topics(["gone", "reborn"]).values():
        future.result(timeout=30)
    created = survivors.create_topics([NewTopic("reborn", num_partitions=1, replication_factor=2)])
    created["reborn"].result(timeout=30)
    producer = Producer({"bootstrap.servers": cluster.nodes[others[0]].bootstrap, "acks": "all"})
    for i in range(5):
        producer.produce("reborn", key=f"new{i}", value=b"v")
    assert producer.flush(30) == 0
    assert partition_dirs(cluster, "gone")[down] == ["gone-0", "gone-1"]
    assert partition_dirs(cluster, "reborn")[down] == ["reborn-0"]
    # A replica log of a partition the metadata no longer mentions at all (as one created
    # just before the crash, whose creation the node's replayed metadata does not reach),
    # and a directory no replica ever marked (a single-node data dir): only the first goes.
    logs = cluster.nodes[down].data_dir / "logs"
    shutil.copytree(logs / "gone-0", logs / "phantom-0")
    (logs / "legacy-0").mkdir()
    (logs / "legacy-0" / "00000000000000000000.log").write_bytes(b"")

    cluster.nodes[down].start()
    cluster.wait_for(
        "the returned node deleted the old logs",
        lambda: not partition_dirs(cluster, "gone")[down] and not partition_dirs(cluster, "reborn")[down]
        and not partition_dirs(cluster, "phantom")[down],
    )
    assert partition_dirs(cluster, "legacy")[down] == ["legacy-0"]
    # Move the new topic's only replica onto the returned node: it then serves exactly the
    # new topic's records.
    bootstrap = cluster.nodes[others[0]].bootstrap
    cluster.wait_for("all brokers back", lambda: len(cluster.admin().list_topics(timeout=5).brokers) == 3)
    assert alter_reassignment(bootstrap, "reborn", 0, [down])[:2] == (0, 0)
    cluster.wait_for("moved", lambda: not list_reassignments(bootstrap)
                     and cluster.partition_state("reborn", 0)[:2] == (down, [down]))
    seen = consume_all(cluster.bootstrap, "reborn", 1, 5, timeout=30)
    assert [k for _, _, k in seen] == [f"new{i}" for i in range(5)]


def test_add_partitions_and_alter_configs_on_every_node(cluster):
    create_topic(cluster, "growing", 2)
    admin = cluster.admin()
    admin.create_partitions([NewPartitions("growing", 4)], validate_only=True)["growing"].result(timeout=30)
    assert len(admin.list_topics(topic="growing", timeout=10).topics["growing"].partitions) == 2
    admin.create_partitions([NewPartitions("growing", 4)])["growing"].result(timeout=30)
    cluster.wait_for(
        "4 partitions with leaders",
        lambda: all(cluster.partition_state("growing", p)[0] > 0 for p in range(4)),
    )
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": True})
    for i in range(40):
        producer.produce("growing", key=f"k{i}", value=b"v", partition=i % 4)
    assert producer.flush(30) == 0
    seen = consume_all(cluster.bootstrap, "growing", 4, 40)
    assert sorted(k for _, _, k in seen) == sorted(f"k{i}" for i in range(40))
    assert {p for p, _, _ in seen} == {0, 1, 2, 3}
    try:
        admin.create_partitions([NewPartitions("growing", 3)])["growing"].result(timeout=30)
        raise AssertionError("shrinking succeeded")
    except KafkaException as error:
        assert error.args[0].code() == 37, error  # INVALID_PARTITIONS

    resource = ConfigResource(ResourceType.TOPIC, "growing", incremental_configs=[
        ConfigEntry("retention.ms", "123456", incremental_operation=AlterConfigOpType.SET),
    ])
    admin.incremental_alter_configs([resource])[resource].result(timeout=30)
    for node in cluster.nodes.values():
        node_admin = AdminClient({"bootstrap.servers": node.bootstrap})  # kept alive until the result
        described = node_admin.describe_configs([ConfigResource(ResourceType.TOPIC, "growing")])
        configs = list(described.values())[0].result(timeout=30)
        assert configs["retention.ms"].value == "123456", f"node {node.port}"
        assert configs["min.insync.replicas"].value == "2"
    bad = ConfigResource(ResourceType.TOPIC, "growing", incremental_configs=[
        ConfigEntry("retention.ms", "soon", incremental_operation=AlterConfigOpType.SET),
    ])
    try:
        admin.incremental_alter_configs([bad])[bad].result(timeout=30)
        raise AssertionError("an invalid value was accepted")
    except KafkaException as error:
        assert error.args[0].code() == 40, error  # INVALID_CONFIG


def test_concurrent_config_changes_on_different_nodes_all_apply(cluster):
    """IncrementalAlterConfigs of different keys sent to different nodes at the same moment:
    none is lost (each node computes the new overrides from its own metadata, so the
    controller applies them as compare-and-set)."""
    create_topic(cluster, "configured", 1)
    keys = ["retention.ms", "retention.bytes", "segment.ms", "segment.bytes", "flush.ms", "flush.messages",
            "max.message.bytes"]
    node_ids = sorted(cluster.nodes)
    for round_ in range(3):
        values = {key: str(2_000_000 + 1000 * round_ + i) for i, key in enumerate(keys)}
        start = threading.Barrier(len(keys))
        answers = {}

        def alter(i, key):
            node = cluster.nodes[node_ids[i % len(node_ids)]]
            with kw.Conn.to(node.bootstrap, timeout=40) as conn:
                start.wait()
                answers[key] = conn.set_topic_configs("configured", {key: values[key]})

        threads = [threading.Thread(target=alter, args=(i, key)) for i, key in enumerate(keys)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert answers == {key: (0, None) for key in keys}, answers

        def described_by(node):
            node_admin = AdminClient({"bootstrap.servers": node.bootstrap})  # kept alive until the result
            described = node_admin.describe_configs([ConfigResource(ResourceType.TOPIC, "configured")])
            configs = list(described.values())[0].result(timeout=30)
            return {key: configs[key].value for key in keys + ["min.insync.replicas"]}

        expected = {**values, "min.insync.replicas": "2"}
        for node in cluster.nodes.values():
            cluster.wait_for(f"round {round_} configs at node {node.port}", lambda: described_by(node) == expected,
                             timeout=10)


def alter_reassignment(bootstrap, topic, partition, replicas):
    """AlterPartitionReassignments v0; returns (top-level error, partition error, message)."""
    w = kw.Writer(True).i32(30000)

    def part(w, _):
        w.i32(partition)
        w.array(replicas, lambda w, r: w.i32(r))
        w.tags()

    w.array([topic], lambda w, t: (w.string(t), w.array([partition], part), w.tags()))
    w.tags()
    with kw.Conn.to(bootstrap) as conn:
        r = conn.request(kw.ALTER_PARTITION_REASSIGNMENTS, 0, w.getvalue())
    r.i32()
    top, _ = r.i16(), r.string()

    def parse_partition(r):
        out = (r.i32(), r.i16(), r.string())
        r.tags()
        return out

    def parse_topic(r):
        out = (r.string(), r.array(parse_partition))
        r.tags()
        return out

    (_, [(_, error, message)]), = r.array(parse_topic)
    return top, error, message


def list_reassignments(bootstrap):
    """ListPartitionReassignments v0 for all topics: {(topic, partition): (replicas, adding, removing)}."""
    w = kw.Writer(True).i32(30000).array(None, None).tags()
    with kw.Conn.to(bootstrap) as conn:
        r = conn.request(kw.LIST_PARTITION_REASSIGNMENTS, 0, w.getvalue())
    r.i32()
    assert r.i16() == 0
    r.string()
    ids = lambda r: r.array(lambda r: r.i32())  # noqa: E731
    out = {}

    def parse_partition(r, topic):
        index, replicas, adding, removing = r.i32(), ids(r), ids(r), ids(r)
        r.tags()
        out[(topic, index)] = (replicas, adding, removing)

    def parse_topic(r):
        topic = r.string()
        r.array(lambda r: parse_partition(r, topic))
        r.tags()

    r.array(parse_topic)
    return out


def test_reassignment_moves_a_partition_under_load(cluster):
    topic = "moving"
    create_topic(cluster, topic, 1, {"min.insync.replicas": "1"})
    leader, replicas, _ = cluster.partition_state(topic, 0)
    # Shrink to RF=2 first (a reassignment that only drops a replica finishes at once).
    source = sorted(replicas)[:2]
    assert alter_reassignment(cluster.nodes[1].bootstrap, topic, 0, source)[:2] == (0, 0)
    cluster.wait_for("rf=2", lambda: sorted(cluster.partition_state(topic, 0)[1]) == source)
    (spare,) = set(cluster.nodes) - set(source)
    removed = source[0]
    target = [source[1], spare]

    load = LoadProducer(cluster.bootstrap, topic, message_timeout_ms=60000)
    acked, failed = load.acked, load.failed
    live = cluster.nodes[source[1]].bootstrap  # stays a replica, never paused
    spare_proc = cluster.nodes[spare].proc
    try:
        cluster.wait_for("first acks", lambda: len(acked) > 200)
        # The new replica is paused, so the move is observably in progress until it resumes.
        spare_proc.send_signal(signal.SIGSTOP)
        assert alter_reassignment(live, topic, 0, target)[:2] == (0, 0)
        ongoing = list_reassignments(live)
        assert set(ongoing) == {(topic, 0)}, ongoing
        replicas_now, adding, removing = ongoing[(topic, 0)]
        assert sorted(replicas_now) == [1, 2, 3] and adding == [spare] and removing == [removed], ongoing
        before = len(acked)
        cluster.wait_for("acks during the move", lambda: len(acked) > before + 200)
        spare_proc.send_signal(signal.SIGCONT)
        cluster.wait_for("the move finished", lambda: not list_reassignments(live), timeout=30)
        before = len(acked)
        cluster.wait_for("acks after the move", lambda: len(acked) > before + 200)
    finally:
        spare_proc.send_signal(signal.SIGCONT)
        load.stop()
    leader, replicas, isr = cluster.partition_state(topic, 0)
    assert sorted(replicas) == sorted(target) and leader in target, (leader, replicas, isr)
    cluster.wait_for("old replica's log deleted", lambda: not partition_dirs(cluster, topic)[removed])
    assert partition_dirs(cluster, topic)[spare] == [f"{topic}-0"]
    assert not failed, failed[:5]
    seen = consume_all(cluster.bootstrap, topic, 1, len(acked))
    keys = [k for _, _, k in seen]
    assert len(keys) == len(set(keys)), f"{len(keys) - len(set(keys))} duplicated records"
    lost = set(acked) - set(keys)
    assert not lost, f"{len(lost)} acknowledged records lost, e.g. {sorted(lost)[:5]}"
    by_key = {k: o for _, o, k in seen}
    assert all(by_key[k] == acked[k][1] for k in acked), "a record moved from its acknowledged offset"
    # Cancelling when nothing moves is refused as Kafka does.
    assert alter_reassignment(live, topic, 0, None)[1] == 85  # NO_REASSIGNMENT_IN_PROGRESS


REASSIGN_COMMAND = "org.apache.kafka.tools.reassign.ReassignPartitionsCommand"


def test_kafka_reassign_partitions_tool_moves_a_replica(cluster, tools_cp, tmp_path):
    """kafka-reassign-partitions --execute / --verify / --list move an RF=1 partition to another node."""
    import json

    from java_support import run_java

    admin = cluster.admin()
    admin.create_topics([NewTopic("tooled", num_partitions=1, replication_factor=1)])["tooled"].result(timeout=30)
    cluster.wait_for("a leader", lambda: cluster.partition_state("tooled", 0)[0] > 0)
    (source,) = cluster.partition_state("tooled", 0)[1]
    destination = min(set(cluster.nodes) - {source})
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for i in range(500):
        producer.produce("tooled", key=f"k{i}", value=b"v" * 100)
    assert producer.flush(30) == 0
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": "tooled", "partition": 0, "replicas": [destination], "log_dirs": ["any"]}]}))

    def tool(*args):
        res = run_java(tools_cp, REASSIGN_COMMAND, ["--bootstrap-server", cluster.bootstrap, *args], timeout=120)
        assert res.returncode == 0, res.report()
        return res.stdout

    out = tool("--reassignment-json-file", plan, "--execute")
    assert "Successfully started partition reassignment" in out, out
    cluster.wait_for(
        "--verify reports completion",
        lambda: "Reassignment of partition tooled-0 is completed" in tool(
            "--reassignment-json-file", plan, "--verify", "--preserve-throttles"),
        timeout=60,
    )
    assert "No partition reassignments found" in tool("--list")
    assert cluster.partition_state("tooled", 0)[1] == [destination]
    cluster.wait_for("old replica's log deleted", lambda: not partition_dirs(cluster, "tooled")[source])
    seen = consume_all(cluster.bootstrap, "tooled", 1, 500)
    assert sorted(k for _, _, k in seen) == sorted(f"k{i}" for i in range(500))


def test_new_replica_starts_at_the_leaders_log_start(cluster):
    """A partition whose head was deleted (DeleteRecords) moves to a new node: its follower's
    first fetch (offset 0) is out of range, so it restarts at the leader's log start."""
    admin = cluster.admin()
    admin.create_topics([NewTopic("trimmed", num_partitions=1, replication_factor=1)])["trimmed"].result(timeout=30)
    cluster.wait_for("a leader", lambda: cluster.partition_state("trimmed", 0)[0] > 0)
    (source,) = cluster.partition_state("trimmed", 0)[1]
    destination = min(set(cluster.nodes) - {source})
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for i in range(100):
        producer.produce("trimmed", key=f"k{i}", value=b"v")
    assert producer.flush(30) == 0
    admin.delete_records([TopicPartition("trimmed", 0, 60)])[TopicPartition("trimmed", 0, 60)].result(timeout=30)
    live = cluster.nodes[destination].bootstrap
    assert alter_reassignment(live, "trimmed", 0, [destination])[:2] == (0, 0)
    cluster.wait_for("the move finished", lambda: cluster.partition_state("trimmed", 0)[1] == [destination])
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "unused"})
    # Right after the move, Metadata may still name the old leader for a moment (Kafka too),
    # and librdkafka's watermark query does not retry NOT_LEADER_OR_FOLLOWER: the test does.
    watermarks = cluster.wait_for(
        "watermarks after the move", lambda: consumer.get_watermark_offsets(TopicPartition("trimmed", 0), timeout=10)
    )
    assert watermarks == (60, 100)
    consumer.assign([TopicPartition("trimmed", 0, 60)])
    keys, deadline = [], time.monotonic() + 30
    while len(keys) < 40 and time.monotonic() < deadline:
        keys += [m.key().decode() for m in consumer.consume(100, 1.0) if not m.error()]
    consumer.close()
    assert keys == [f"k{i}" for i in range(60, 100)]
    assert "restarting there" in cluster.nodes[destination].log()


def refused_code(future):
    """The Kafka error code an admin future fails with; fails the test if it succeeds."""
    try:
        future.result(timeout=30)
    except KafkaException as error:
        return error.args[0].code()
    raise AssertionError("the request succeeded")


def test_manual_replica_assignment_places_replicas_where_asked(cluster):
    """CreateTopics and CreatePartitions with a manual replica assignment (what `kafka-topics
    --replica-assignment` sends): every node shows exactly those replicas, each partition led
    by its first replica, only the named nodes hold the logs, and records flow. Assignments
    Kafka refuses are refused with Kafka's error codes, validate_only included."""
    admin = cluster.admin()
    admin.create_topics([NewTopic("placed", 2, replica_assignment=[[2, 3], [3, 1]])])["placed"].result(timeout=30)
    expected = {0: kw.PartitionMetadata(2, [2, 3], [2, 3]), 1: kw.PartitionMetadata(3, [3, 1], [3, 1])}
    for node_id in cluster.nodes:
        cluster.wait_for(f"the assignment at node {node_id}",
                         lambda: cluster.partition_states_at(node_id, "placed") == expected)
    cluster.wait_for("logs only on the assigned nodes", lambda: partition_dirs(cluster, "placed") == {
        1: ["placed-1"], 2: ["placed-0"], 3: ["placed-0", "placed-1"]})
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for i in range(20):
        producer.produce("placed", key=f"k{i}", value=b"v", partition=i % 2)
    assert producer.flush(30) == 0

    admin.create_partitions([NewPartitions("placed", 3, replica_assignment=[[1, 2]])])["placed"].result(timeout=30)
    expected[2] = kw.PartitionMetadata(1, [1, 2], [1, 2])
    for node_id in cluster.nodes:
        cluster.wait_for(f"the new partition at node {node_id}",
                         lambda: cluster.partition_states_at(node_id, "placed") == expected)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})  # knows the new partition
    for i in range(20, 30):
        producer.produce("placed", key=f"k{i}", value=b"v", partition=2)
    assert producer.flush(30) == 0
    seen = consume_all(cluster.bootstrap, "placed", 3, 30)
    assert sorted((p, k) for p, _, k in seen) == sorted((i % 2 if i < 20 else 2, f"k{i}") for i in range(30))

    # INVALID_REPLICA_ASSIGNMENT (39): a broker twice, an unknown broker, mixed replication
    # factors, a new partition unlike the topic's; with validate_only as well.
    for assignment in ([[1, 1]], [[1, 9]], [[1, 2], [3]]):
        for validate_only in (False, True):
            new_topic = NewTopic("refused", len(assignment), replica_assignment=assignment)
            futures = admin.create_topics([new_topic],
                                          validate_only=validate_only)
            assert refused_code(futures["refused"]) == 39, (assignment, validate_only)
    for validate_only in (False, True):
        futures = admin.create_partitions([NewPartitions("placed", 4, replica_assignment=[[1, 2, 3]])],
                                          validate_only=validate_only)
        assert refused_code(futures["placed"]) == 39, validate_only
    # A valid assignment passes validate_only without creating anything.
    admin.create_topics([NewTopic("checked", 1, replica_assignment=[[3, 2]])], validate_only=True)["checked"].result(30)
    admin.create_partitions([NewPartitions("placed", 4, replica_assignment=[[3, 2]])],
                            validate_only=True)["placed"].result(timeout=30)
    # What confluent-kafka cannot send (it sends -1 for both counts): counts next to an assignment (INVALID_REQUEST, 42), and
    # partition indexes other than 0..n-1 (39).
    with kw.Conn.to(cluster.nodes[1].bootstrap) as conn:
        answers = conn.create_topics([
            ("refused-counts", 1, -1, {}, [(0, [1])]),
            ("refused-factor", -1, 1, {}, [(0, [1])]),
            ("refused-gap", -1, -1, {}, [(0, [1]), (2, [2])]),
            ("refused-twice", -1, -1, {}, [(0, [1]), (0, [2])]),
        ])
    assert {name: code for name, (code, _) in answers.items()} == {
        "refused-counts": 42, "refused-factor": 42, "refused-gap": 39, "refused-twice": 39}, answers
    for node in cluster.nodes.values():
        assert not topics_seen_by(node) & {"refused", "checked", "refused-counts", "refused-factor", "refused-gap",
                                           "refused-twice"}
    assert len(admin.list_topics(topic="placed", timeout=10).topics["placed"].partitions) == 3


def test_kafka_topics_tool_creates_with_replica_assignment(cluster, tools_cp):
    """kafka-topics --create --replica-assignment, then --alter --partitions with an
    assignment for the new partition: --describe shows the replicas asked for, led by the
    first of each list."""
    from test_kafka_tools import describe, topics

    node = cluster.nodes[1]
    topics(tools_cp, node, "--create", "--topic", "tool-placed", "--replica-assignment", "3:1,1:2")
    topics(tools_cp, node, "--alter", "--topic", "tool-placed", "--partitions", "3",
           "--replica-assignment", "3:1,1:2,2:3")

    def described():
        _, parts, _ = describe(tools_cp, node, "tool-placed")
        return [(p["Partition"], p["Leader"], p["Replicas"], p["Isr"]) for p in parts]

    cluster.wait_for("--describe shows the assignment", lambda: described() == [
        ("0", "3", "3,1", "3,1"), ("1", "1", "1,2", "1,2"), ("2", "2", "2,3", "2,3")], timeout=60)


def assert_created_topic_described(bootstrap, name, replication_factor):
    """CreateTopics v5+ answers with the created topic's partition count, replication factor
    and every topic config with its source (the request's override, or the default), on a
    single node and in a cluster alike, from v5 on."""
    with kw.Conn.to(bootstrap.split(",")[0]) as conn:
        topics = [(name, 3, replication_factor, {"retention.ms": "123456"})]
        created = conn.create_topics_described(topics)[name]
        assert created.error == 0, created
        assert (created.partitions, created.replication_factor) == (3, replication_factor)
        topic_override, default = 1, 5
        assert created.configs["retention.ms"] == ("123456", topic_override)
        assert created.configs["cleanup.policy"] == ("delete", default)
        assert created.configs["max.message.bytes"][1] == default
        checked = conn.create_topics_described([(f"{name}-checked", 2, replication_factor, {})], version=5)
        assert checked[f"{name}-checked"].error == 0
        assert checked[f"{name}-checked"].configs["retention.ms"][1] == default
    assert name in topics_seen_by_bootstrap(bootstrap)


def topics_seen_by_bootstrap(bootstrap):
    return set(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics)


def test_create_topics_describes_the_created_topic_in_a_cluster(cluster):
    assert_created_topic_described(cluster.bootstrap, "described", 3)


def test_create_topics_describes_the_created_topic_on_a_single_node(broker):
    assert_created_topic_described(broker.bootstrap, "described", 1)
