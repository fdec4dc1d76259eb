"""The Java client against a 3-node cluster: its idempotent producer (acks=all, the client's
defaults) keeps sending while partition leaders are killed with `kill -9` and restarted, and
sees the failovers only as retries: every record acknowledged once, none lost, none
duplicated, each at its acknowledged offset, in send order (tests/java/.../IdempotentProducer
reads everything back and checks).
"""

import time

from java_support import JavaProcess, java_cp  # noqa: F401  (java_cp is a fixture)
from cluster_support import Cluster, create_topic
from test_java_idempotence import PARTITIONS, PRODUCE_S, RATE, RECORDS, _assert_exactly_once, _result

TOPIC = "java-failover"
LEADER_KILLS = 3
DOWN_S = 1.0


def test_java_idempotent_producer_through_leader_kills(tmp_path, java_cp):
    cluster = Cluster(tmp_path).start()
    try:
        # RF 3, min.insync.replicas 2; the Java program finds the topic already there.
        create_topic(cluster, TOPIC, PARTITIONS)
        proc = JavaProcess(java_cp, "sluice.tests.IdempotentProducer",
                           ["--bootstrap", cluster.bootstrap, "--topic", TOPIC, "--partitions", PARTITIONS,
                            "--records", RECORDS, "--rate", RATE])
        kills = []
        try:
            proc.wait_for_line("READY", 90)
            for i in range(LEADER_KILLS):
                time.sleep(PRODUCE_S / (LEADER_KILLS + 2))
                assert not proc.seen("PRODUCED"), "the producer finished before the leader kills were done"
                victim = cluster.partition_state(TOPIC, i)[0]
                cluster.nodes[victim].kill()
                time.sleep(DOWN_S)
                cluster.nodes[victim].start()
                kills.append((i, victim))
                # Back in every ISR before the next kill, so min.insync.replicas holds throughout.
                cluster.wait_for("full ISRs again", lambda: all(
                    len(cluster.partition_state(TOPIC, p)[2]) == 3 for p in range(PARTITIONS)), timeout=60)
            r = _result(proc, cluster.nodes[kills[-1][1]], f"kills (partition, leader)={kills}")
        finally:
            proc.kill()
        context = f"kills (partition, leader)={kills} result={r}"
        _assert_exactly_once(r, context)
        assert r["retries"] > 0, f"the client retried nothing, so no kill hit it: {context}"
    finally:
        cluster.kill_all()
