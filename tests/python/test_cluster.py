"""A 3-node cluster of real `sluice serve` processes (controller quorum + replication):
replicas spread, acks=all writes survive `kill -9` of partition leaders, followers
catch up after a restart, and a librdkafka idempotent producer sees failover only as
retries (no acknowledged record lost, none duplicated).
"""

import time
import urllib.request

import pytest
from confluent_kafka import Consumer, Producer

import kafka_wire as kw
from cluster_support import LoadProducer, consume_all, create_topic
from conftest import Broker
from test_metrics import scrape, value

DELETE_RECORDS = 21
FAILOVER_LIMIT_S = 10.0


def test_replicas_spread_and_metadata_lists_every_node(cluster):
    create_topic(cluster, "spread", 6)
    md = cluster.admin().list_topics(timeout=10)
    assert sorted(b.id for b in md.brokers.values()) == [1, 2, 3]
    leaders = [md.topics["spread"].partitions[p].leader for p in range(6)]
    assert sorted(set(leaders)) == [1, 2, 3], leaders
    for p in range(6):
        assert sorted(md.topics["spread"].partitions[p].replicas) == [1, 2, 3]




@pytest.mark.parametrize("level", ["1", "2"])
def test_leader_kill_9_under_load_loses_and_duplicates_nothing(cluster, level):
    topic = f"failover-{level}"
    partitions = 3
    create_topic(cluster, topic, partitions, {"sluice.durability.level": level})
    load = LoadProducer(cluster.bootstrap, topic, partitions)
    acked, failed = load.acked, load.failed
    failovers = []
    try:
        kills = 3
        for round_ in range(kills):
            time.sleep(1.5)
            leader, _, _ = cluster.partition_state(topic, round_ % partitions)
            before = len(acked)
            started = time.monotonic()
            cluster.nodes[leader].kill()
            cluster.wait_for(
                "a new leader", lambda: cluster.partition_state(topic, round_ % partitions)[0] not in (-1, leader),
                timeout=FAILOVER_LIMIT_S,
            )
            failovers.append(time.monotonic() - started)
            cluster.wait_for("acks after failover", lambda: len(acked) > before + 100, timeout=30)
            cluster.nodes[leader].start()
            cluster.wait_for(
                "the restarted node back in every ISR",
                lambda: all(len(cluster.partition_state(topic, p)[2]) == 3 for p in range(partitions)),
                timeout=30,
            )
    finally:
        load.stop()
    print(f"level {level}: failover seconds {[round(f, 2) for f in failovers]}, acked {len(acked)}")
    assert not failed, failed[:5]
    assert len(acked) > 1000
    seen = consume_all(cluster.bootstrap, topic, partitions, len(acked))
    keys = [k for _, _, k in seen]
    duplicates = len(keys) - len(set(keys))
    lost = set(acked) - set(keys)
    assert duplicates == 0, f"{duplicates} duplicated records"
    assert not lost, f"{len(lost)} acknowledged records lost, e.g. {sorted(lost)[:5]}"
    by_key = {k: (p, o) for p, o, k in seen}
    assert all(by_key[k] == acked[k] for k in acked), "a record moved from the offset it was acknowledged at"
    for p in range(partitions):
        offsets = [o for part, o, _ in seen if part == p]
        assert offsets == sorted(offsets) and len(offsets) == len(set(offsets))


def test_a_node_of_another_cluster_on_an_old_voter_address_never_joins_it(cluster, tmp_path):
    """Cluster identity (Kafka's meta.properties / INCONSISTENT_CLUSTER_ID): a fresh
    single-node cluster started on the controller address of a killed node of a 3-node
    cluster is contacted by the old cluster's controllers, refuses them, and serves only its
    own topics; the old node's data dir is refused by a node configured for another cluster."""
    create_topic(cluster, "old-cluster-topic", 1)
    victim = cluster.nodes[3]
    victim_controller = victim.extra_args[victim.extra_args.index("--controller-listen") + 1]
    victim.kill()

    # With the old cluster's secret, so that its cluster id is what keeps the two apart.
    newcomer = Broker(tmp_path / "newcomer", extra_args=[
        "--node-id", "1", "--controller-listen", victim_controller, "--cluster-voters", f"1@{victim_controller}",
        "--cluster-rpc-secret-file", cluster.secret_file,
    ]).start()
    try:
        with kw.Conn.to(newcomer.bootstrap) as conn:
            def own_cluster_ready():
                error = conn.create_topics([("new-cluster-topic", 1, 1, {})])["new-cluster-topic"][0]
                return error in (kw.NONE, kw.TOPIC_ALREADY_EXISTS)

            cluster.wait_for("the newcomer's own quorum", own_cluster_ready, timeout=60)
            # The old cluster's leader keeps calling this address; give it time to try.
            time.sleep(3)
            topics = set(conn.metadata(None))
        assert "new-cluster-topic" in topics, topics
        assert "old-cluster-topic" not in topics, f"the newcomer received the old cluster's topics: {topics}"
        # The whole log: the refusal may be followed by many lines of the newcomer's start.
        assert "refusing controller RPC from another cluster" in newcomer.log_path.read_text(errors="replace"), \
            newcomer.log()[-3000:]
        # The old cluster goes on without its third node.
        assert cluster.partition_state("old-cluster-topic", 0)[0] in (1, 2)
    finally:
        newcomer.kill()

    # The old node's data dir, started with another cluster's voters, is refused at startup.
    stray = Broker(victim.data_dir, port=victim.port, extra_args=[
        "--node-id", "3", "--controller-listen", victim_controller, "--cluster-voters", f"3@{victim_controller}",
    ])
    with pytest.raises(RuntimeError, match="belongs to cluster"):
        stray.start()


def test_a_down_controller_peer_is_reported_once_not_on_every_retry(cluster):
    """While a node is down the leader retries it every ~100 ms; each survivor's log says so
    once ("controller peer unreachable"), and once more when it answers again."""
    victim = cluster.nodes[3]
    victim_controller = victim.extra_args[victim.extra_args.index("--controller-listen") + 1]
    survivors = [cluster.nodes[1], cluster.nodes[2]]
    since = {node.port: node.log_path.stat().st_size for node in survivors}

    def new_lines(node):
        with open(node.log_path, "rb") as log:
            log.seek(since[node.port])
            return log.read().decode(errors="replace").splitlines()

    victim.kill()
    time.sleep(5)
    for node in survivors:
        lines = new_lines(node)
        assert not [line for line in lines if "RPCError" in line or "error replication to" in line], lines[-20:]
        unreachable = [line for line in lines if "controller peer unreachable" in line and victim_controller in line]
        assert len(unreachable) <= 1, unreachable
        # The rest: an election's failed vote request, if the victim led the quorum.
        noisy = [line for line in lines if (" WARN " in line or " ERROR " in line) and victim_controller in line]
        assert len(noisy) <= 4, "\n".join(noisy[:20])
    assert any("controller peer unreachable" in line for node in survivors for line in new_lines(node))
    victim.start()
    cluster.wait_for("the restarted peer reported reachable again",
                     lambda: any("controller peer reachable again" in line
                                 for node in survivors for line in new_lines(node)), timeout=30)


def test_metrics_show_leaders_under_replicated_partitions_and_the_controller(cluster):
    """Each node's /metrics: the partitions it leads, those of them whose ISR lacks a replica
    (Kafka's UnderReplicatedPartitions) while a node is down, and one active controller."""
    create_topic(cluster, "metered", 4)
    total = 4 + offsets_topic_partitions(cluster) + sum(
        internal_topic_partitions(cluster, name) for name in ("__transaction_state", "__share_group_state"))

    def sums(node_ids, name):
        return sum(value(scrape(cluster.metrics_ports[n]), name) for n in node_ids)

    everyone = list(cluster.nodes)
    cluster.wait_for("every partition led once", lambda: sums(everyone, "sluice_leader_partitions") == total or None)
    cluster.wait_for("full ISRs", lambda: sums(everyone, "sluice_under_replicated_partitions") == 0 or None)
    # A follower creates its replica's log when it applies the topic, which may come after
    # the leader already counts it in the ISR (a new partition's ISR is its replica set).
    cluster.wait_for("every node hosts a replica of each partition",
                     lambda: sums(everyone, "sluice_partitions") == total * 3 or None)
    for port in cluster.metrics_ports.values():
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=10) as answer:
            assert answer.status == 200
    cluster.wait_for("one active controller", lambda: sums(everyone, "sluice_active_controller") == 1 or None)

    cluster.nodes[3].kill()
    survivors = [1, 2]
    cluster.wait_for("every partition under-replicated on the survivors",
                     lambda: (sums(survivors, "sluice_leader_partitions") == total
                              and sums(survivors, "sluice_under_replicated_partitions") == total) or None, timeout=60)
    cluster.nodes[3].start()
    cluster.wait_for("the ISRs full again", lambda: sums(everyone, "sluice_under_replicated_partitions") == 0 or None,
                     timeout=60)
    # The leaders asked the controller to take node 3 back into each ISR.
    assert sums(survivors, "sluice_isr_expands_total") >= total


def offsets_topic_partitions(cluster) -> int:
    """Waits for `__consumer_offsets` (created once the cluster forms) and returns its size."""
    return internal_topic_partitions(cluster, "__consumer_offsets")


def internal_topic_partitions(cluster, name: str) -> int:
    """Waits for the internal topic `name` (created once the cluster forms) and returns its size."""
    def listed():
        topic = cluster.admin().list_topics(timeout=5).topics.get(name)
        return len(topic.partitions) if topic is not None and topic.error is None else None
    return cluster.wait_for(name, listed, timeout=60)


def test_the_offsets_topic_exists_once_the_cluster_forms_so_groups_survive_a_lost_node(cluster):
    """A brand-new cluster creates `__consumer_offsets` (replication factor 3) as soon as its
    three nodes registered, before any group asked: with one node then lost, a consumer group
    still joins and commits. (Created on first use, as Kafka does, it could not get 3
    replicas from 2 live nodes, and no group could work until the third came back.)"""
    partitions = offsets_topic_partitions(cluster)
    assert partitions == 50, "Kafka's default offsets.topic.num.partitions"
    def settled():
        states = cluster.partition_states_at(1, "__consumer_offsets")
        return (len(states) == 50 and all(len(p.replicas) == 3 and len(p.isr) == 3 for p in states.values())) or None

    cluster.wait_for("offsets partitions with 3 replicas in sync", settled)
    # As in Kafka, clients cannot delete committed offsets with DeleteRecords.
    leader = cluster.partition_states_at(1, "__consumer_offsets")[0].leader
    with kw.Conn.to(cluster.nodes[leader].bootstrap) as conn:
        w = kw.Writer(False)  # DeleteRecords v1: [topic [partition, offset]], timeout
        w.array(["__consumer_offsets"], lambda w, t: (w.string(t), w.array([0], lambda w, p: w.i32(p).i64(-1))))
        w.i32(10000)
        r = conn.request(DELETE_RECORDS, 1, w.getvalue())
        r.i32()  # throttle
        answer = r.array(lambda r: (r.string(), r.array(lambda r: (r.i32(), r.i64(), r.i16()))))
    assert answer == [("__consumer_offsets", [(0, -1, kw.INVALID_TOPIC_EXCEPTION)])], answer
    create_topic(cluster, "after-loss", 2)
    cluster.nodes[3].kill()
    survivors = ",".join(cluster.nodes[n].bootstrap for n in (1, 2))
    p = Producer({"bootstrap.servers": survivors, "acks": "all"})
    for i in range(10):
        p.produce("after-loss", value=b"%d" % i, partition=i % 2)
    assert p.flush(60) == 0
    c = Consumer({"bootstrap.servers": survivors, "group.id": "survives-a-lost-node", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False, "broker.address.family": "v4"})
    try:
        c.subscribe(["after-loss"])
        got = []
        deadline = time.monotonic() + 60
        while len(got) < 10:
            assert time.monotonic() < deadline, f"the group consumed {len(got)} of 10 records"
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                got.append(m)
        committed = c.commit(asynchronous=False)
        assert all(tp.error is None for tp in committed), committed
    finally:
        c.close()
