"""Share groups (KIP-932) on a 3-node cluster, through the Java client's KafkaShareConsumer
(tests/java/.../ShareConsumers.java).

In a cluster a share group's members heartbeat to its coordinator (the leader of the group's
`__consumer_offsets` partition), fetch and acknowledge at each partition's leader, and that leader
keeps the share-partition's state in the replicated `__share_group_state` (the leader of partition
abs(hashCode("group:topic:partition")) % 10, often another node), answering an acknowledgement
only once it is durable there.

* More consumers than partitions: 4 share consumers of one group on a 2-partition topic all
  receive records, each record delivered exactly once; the group's configs (set with
  IncrementalAlterConfigs on the GROUP resource at any node) reach every leader.
* Durability through failover: on a topic with replication factor 3, with a group id whose
  share-partitions keep their state on other nodes than their leaders, a consumer accepts 150 of
  400 records (commitSync returned: durable) and exits as if it crashed. Then, in turn, the leader
  of each data partition and the leader of each share-partition's state partition are killed -9
  (each restarted after a second). A second consumer then accepts the other 250: none of the
  first 150 again, and all 400 in total; kafka-share-groups describes each partition's start
  offset as its end offset (200), asked of whichever node. Once the group is empty,
  kafka-share-groups --reset-offsets --to-earliest makes every record delivered again, once.
"""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Producer

import kafka_wire as kw  # noqa: F401
from cluster_support import Cluster, create_topic, wait_for
from java_support import java_cp, run_java, tools_cp  # noqa: F401  (fixtures)
from test_transactions_cluster import txn_partition

SHARE = "sluice.tests.ShareConsumers"
SHARE_GROUP_COMMAND = "org.apache.kafka.tools.consumer.group.ShareGroupCommand"
SHARE_STATE = "__share_group_state"
SHARE_STATE_PARTITIONS = 10
DOWN_S = 1.0


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def remote_state_group(cluster: Cluster, topic: str, partitions: int) -> str:
    """A group id whose share-partitions of `topic` all keep their state on another node than
    the partition's leader, so every acknowledgement crosses nodes (WriteShareGroupState)."""
    leaders = {p: cluster.partition_state(topic, p)[0] for p in range(partitions)}
    state_leaders = {p: cluster.partition_state(SHARE_STATE, p)[0] for p in range(SHARE_STATE_PARTITIONS)}
    for _ in range(1000):
        group = unique("durable")
        if all(state_leaders[txn_partition(f"{group}:{topic}:{p}", SHARE_STATE_PARTITIONS)] != leaders[p]
               for p in range(partitions)):
            return group
    raise AssertionError(f"no group id places its state away from the leaders {leaders}: {state_leaders}")


def test_share_groups_on_three_nodes_survive_leader_kills(tmp_path, java_cp, tools_cp):
    # Short share sessions: a consumer that exits like a crash leaves the group in seconds.
    cluster = Cluster(tmp_path, node_args=lambda node_id, port: [
        "--override", "group_share_session_timeout_ms=4000", "--override", "group_share_heartbeat_interval_ms=1000",
    ]).start()
    try:
        # Spread: 4 consumers, 2 partitions (the mode creates its topic, replication factor 1).
        res = run_java(java_cp, SHARE, ["--bootstrap", cluster.bootstrap, "--mode", "spread", "--topic", unique("q"),
                                        "--group", unique("workers"), "--count", "400"], timeout=180)
        assert res.returncode == 0 and "DONE" in res.stdout, res.report()

        topic, n, first_count = unique("q"), 400, 150
        create_topic(cluster, topic, 2)
        group = remote_state_group(cluster, topic, 2)
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
        for i in range(n):
            producer.produce(topic, key=f"k-{i}", value=f"k-{i}", partition=i % 2)
        assert producer.flush(30) == 0
        first = run_java(java_cp, SHARE, ["--bootstrap", cluster.bootstrap, "--mode", "consume", "--topic", topic,
                                          "--group", group, "--count", str(first_count)], timeout=150)
        assert first.returncode == 0, first.report()
        acked = [line.split()[1] for line in first.stdout.splitlines() if line.startswith("ACKED ")]
        assert len(acked) == first_count == len(set(acked)), first.report()

        # The nodes holding the share-partitions: each data partition's leader, and the leader
        # of the state partition of each share-partition.
        victims = []
        for partition in range(2):
            victims.append(("leader of partition", topic, partition))
            victims.append(("share state of partition", SHARE_STATE,
                            txn_partition(f"{group}:{topic}:{partition}", SHARE_STATE_PARTITIONS)))
        killed = []
        for role, victim_topic, victim_partition in victims:
            # A leader is killed only once its followers are in sync, as a failover assumes: a
            # node restarted for an earlier kill may not have caught up on this partition yet,
            # and with no other replica in the ISR no leader could be elected.
            leader = wait_for(f"a leader of {victim_topic}/{victim_partition} with every replica in its ISR",
                              lambda: (s := cluster.partition_state(victim_topic, victim_partition))[0] > 0
                              and sorted(s[2]) == sorted(s[1]) and s[0],
                              timeout=60)
            if leader in killed[-1:]:
                continue
            print(f"killing node {leader}, {role} {victim_partition}")
            cluster.nodes[leader].kill()
            killed.append(leader)
            wait_for(f"another leader of {victim_topic}/{victim_partition}",
                     lambda: cluster.partition_state(victim_topic, victim_partition)[0] not in (leader, -1), timeout=60)
            time.sleep(DOWN_S)
            cluster.nodes[leader].start()
            wait_for(f"node {leader} back in the ISR of {victim_topic}/{victim_partition}",
                     lambda: leader in cluster.partition_state(victim_topic, victim_partition)[2], timeout=60)

        second = run_java(java_cp, SHARE, ["--bootstrap", cluster.bootstrap, "--mode", "consume", "--topic", topic,
                                           "--group", group, "--count", str(n - first_count)], timeout=150)
        logs = "\n".join(f"--- node {i} ---\n{node.log()[-2000:]}" for i, node in cluster.nodes.items())
        assert second.returncode == 0, second.report() + "\n" + logs
        rest = [line.split()[1] for line in second.stdout.splitlines() if line.startswith("ACKED ")]
        again = set(acked) & set(rest)
        assert not again, f"{len(again)} acknowledged records delivered again after the kills, e.g. {sorted(again)[:5]}"
        assert set(acked) | set(rest) == {f"k-{i}" for i in range(n)}

        def share_groups(node, *args):
            out = run_java(tools_cp, SHARE_GROUP_COMMAND, ["--bootstrap-server", node.bootstrap, *args], timeout=60)
            assert out.returncode == 0, out.report()
            return out.stdout + out.stderr

        def start_offsets(node):
            rows = [line.split() for line in share_groups(node, "--describe", "--group", group).splitlines()
                    if line.startswith(group)]
            return sorted((r[1], r[2], r[3]) for r in rows)

        # Every node reports both start offsets once the last restarted node has loaded the
        # share state it leads (until then a partition's describe answers with an error, as
        # Kafka's does while a share coordinator loads, and the tool leaves its row out).
        expected = [(topic, "0", "200"), (topic, "1", "200")]

        def reports_the_start_offsets(node_id):
            described = share_groups(cluster.nodes[node_id], "--describe", "--group", group)
            seen = sorted((r[1], r[2], r[3]) for r in (line.split() for line in described.splitlines())
                          if r and r[0] == group)
            assert seen == expected, f"node {node_id} reports {seen}:\n{described}"
            return True

        for node_id in cluster.nodes:
            wait_for(f"node {node_id} to report the start offsets", lambda: reports_the_start_offsets(node_id),
                     timeout=30)

        # Once the group is empty, a reset to the earliest offsets (AlterShareGroupOffsets at the
        # coordinator, InitializeShareGroupState at the state partitions' leaders) delivers every
        # record again: the partition leaders read the reset state, not what they hold in memory.
        any_node = next(iter(cluster.nodes.values()))
        wait_for("the crashed consumer to leave",
                 lambda: "has no active members" in share_groups(any_node, "--describe", "--group", group, "--members"),
                 timeout=60)
        share_groups(any_node, "--reset-offsets", "--group", group, "--topic", topic, "--to-earliest", "--execute")
        assert start_offsets(any_node) == [(topic, "0", "0"), (topic, "1", "0")]
        third = run_java(java_cp, SHARE, ["--bootstrap", cluster.bootstrap, "--mode", "consume", "--topic", topic,
                                          "--group", group, "--count", str(n)], timeout=150)
        assert third.returncode == 0, third.report()
        again = sorted(line.split()[1] for line in third.stdout.splitlines() if line.startswith("ACKED "))
        assert again == sorted(f"k-{i}" for i in range(n)), third.report()
    finally:
        cluster.kill_all()
