"""Eligible leader replicas with real `sluice serve` processes: a follower that left the ISR
while it was below min.insync.replicas keeps every acknowledged record, so when the leader
dies too it is the one that takes over when it comes back, and nothing acknowledged is lost.

Five nodes, so that the controller quorum (every node votes) survives three of them being
down while the partition lives on nodes 1-3; node 4 answers the questions.
"""

import re
import time

from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic

import kafka_wire as kw
from cluster_support import Cluster, consume_all, wait_for
from java_support import kafka_tools_classpath, run_java

TOPIC = "elr"
LEADER, FIRST_FOLLOWER, LAST_FOLLOWER = 1, 2, 3
OBSERVER = 4
# Longer than the nodes' high-watermark checkpoint interval: a killed follower restarts
# knowing the high watermark it had learned.
CHECKPOINT_WAIT_S = 6.0
RECORDS_PER_BATCH = 200


def partition_at(cluster, node_id):
    with kw.Conn.to(cluster.nodes[node_id].bootstrap) as conn:
        page = conn.describe_topic_partitions([TOPIC])
    error, partitions = page.topics[TOPIC]
    assert error == 0, error
    return partitions[0]


def layout(cluster, node_id=OBSERVER):
    p = partition_at(cluster, node_id)
    return p.leader, sorted(p.isr), sorted(p.elr)


def produce(cluster, first, count):
    producer = Producer({"bootstrap.servers": cluster.nodes[OBSERVER].bootstrap, "acks": "all",
                         "enable.idempotence": True, "message.timeout.ms": 30000})
    failed = []
    for i in range(first, first + count):
        producer.produce(TOPIC, key=f"k{i}", value=b"v" * 100,
                         on_delivery=lambda err, _msg: err and failed.append(str(err)))
    assert producer.flush(60) == 0
    assert not failed, failed[:3]


def kafka_topics_describe(cluster):
    """`kafka-topics.sh --describe` (Kafka 4.3.1's TopicCommand) of the partition line."""
    res = run_java(kafka_tools_classpath(), "org.apache.kafka.tools.TopicCommand",
                   ["--bootstrap-server", cluster.nodes[OBSERVER].bootstrap, "--describe", "--topic", TOPIC])
    assert res.returncode == 0, res.report()
    line = next(line for line in res.stdout.splitlines() if "Partition: 0" in line)
    return dict(re.findall(r"(\w+): ?([^\t]*)", line)), res


def test_a_follower_out_of_the_isr_below_min_insync_takes_over_with_every_acked_record(tmp_path):
    cluster = Cluster(tmp_path, nodes=5).start()
    try:
        admin = cluster.admin()
        topic = NewTopic(TOPIC, 1, replica_assignment=[[LEADER, FIRST_FOLLOWER, LAST_FOLLOWER]],
                         config={"min.insync.replicas": "2"})
        admin.create_topics([topic])[TOPIC].result(timeout=30)
        full = (LEADER, [LEADER, FIRST_FOLLOWER, LAST_FOLLOWER], [])
        wait_for("a full ISR", lambda: layout(cluster) == full, timeout=30)
        produce(cluster, 0, RECORDS_PER_BATCH)

        # Down to min.insync.replicas: the ISR is still enough, no eligible leader replica.
        cluster.nodes[FIRST_FOLLOWER].kill()
        wait_for("the first follower out of the ISR",
                 lambda: layout(cluster) == (LEADER, [LEADER, LAST_FOLLOWER], []), timeout=30)
        # Records that only the leader and the last follower hold.
        produce(cluster, RECORDS_PER_BATCH, RECORDS_PER_BATCH)
        acked = 2 * RECORDS_PER_BATCH
        time.sleep(CHECKPOINT_WAIT_S)

        # Below it: the last follower leaves the ISR for the eligible leader replicas.
        cluster.nodes[LAST_FOLLOWER].kill()
        wait_for("the last follower in the ELR",
                 lambda: layout(cluster) == (LEADER, [LEADER], [LAST_FOLLOWER]), timeout=30)
        fields, res = kafka_topics_describe(cluster)
        assert fields.get("Elr") == str(LAST_FOLLOWER), res.report()

        # The leader dies too (the quorum with it, until a third node is back), and the
        # follower that holds everything comes back first: it leads.
        cluster.nodes[LEADER].kill()
        cluster.nodes[LAST_FOLLOWER].start()
        wait_for("the eligible follower leading",
                 lambda: layout(cluster) == (LAST_FOLLOWER, [LAST_FOLLOWER], [LEADER]), timeout=90)
        p = partition_at(cluster, LAST_FOLLOWER)
        assert (p.leader, p.elr, p.offline) == (LAST_FOLLOWER, [LEADER], [LEADER, FIRST_FOLLOWER])
        fields, res = kafka_topics_describe(cluster)
        assert (fields.get("Leader"), fields.get("Isr"), fields.get("Elr")) == (
            str(LAST_FOLLOWER), str(LAST_FOLLOWER), str(LEADER)), res.report()

        seen = consume_all(cluster.nodes[OBSERVER].bootstrap, TOPIC, 1, acked, timeout=60)
        keys = sorted(int(key[1:]) for _, _, key in seen)
        assert keys == list(range(acked)), f"read {len(keys)} of {acked} acknowledged records"
    finally:
        cluster.kill_all()


def test_describe_topic_partitions_pages_through_topics_with_a_cursor(broker):
    with kw.Conn.to(broker.bootstrap) as conn:
        created = conn.create_topics([("pages-a", 3, 1, {}), ("pages-b", 2, 1, {})])
        assert all(error == 0 for error, _ in created.values()), created
        named = ["pages-b", "pages-a"]
        first = conn.describe_topic_partitions(named, limit=4)
        assert {name: sorted(parts) for name, (_, parts) in first.topics.items()} == {
            "pages-a": [0, 1, 2], "pages-b": [0]}
        assert first.next_cursor == ("pages-b", 1)
        second = conn.describe_topic_partitions(named, limit=4, cursor=first.next_cursor)
        assert {name: sorted(parts) for name, (_, parts) in second.topics.items()} == {"pages-b": [1]}
        assert second.next_cursor is None
        p = second.topics["pages-b"][1][1]
        assert (p.replicas, p.isr, p.elr, p.last_known_elr) == ([p.leader], [p.leader], [], [])
        unknown = conn.describe_topic_partitions(["pages-none"])
        assert unknown.topics["pages-none"][0] == kw.UNKNOWN_TOPIC_OR_PARTITION
