"""Rolling upgrade: a 3-node cluster started on the previous version's binary (built by
scripts/test.sh from the commit in tests/upgrade-base-rev) is upgraded node by node to
this binary under an idempotent acks=all load. Nothing acknowledged is lost or duplicated;
while versions are mixed, commands that old nodes could not understand (SCRAM users here)
are refused, and once every node runs the new binary the cluster finalizes the newer
metadata.version by itself and accepts them.
"""

import os
import time

import pytest
from confluent_kafka.admin import AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

from conftest import Broker, SLUICE_BIN, free_port
from test_cluster import LoadProducer, consume_all, create_topic

NODES = 3
BASE_BIN_ENV = "SLUICE_UPGRADE_BASE_BIN"


class MixedCluster:
    """The test_cluster.Cluster interface, with each node's binary chosen per start."""

    def __init__(self, tmp_path, base_bin):
        ports = [free_port() for _ in range(NODES)]
        controllers = [free_port() for _ in range(NODES)]
        voters = ",".join(f"{i + 1}@127.0.0.1:{controllers[i]}" for i in range(NODES))
        self.nodes = {}
        for i in range(NODES):
            args = ["--node-id", str(i + 1), "--controller-listen", f"127.0.0.1:{controllers[i]}",
                    "--cluster-voters", voters]
            self.nodes[i + 1] = Broker(tmp_path / f"node-{i + 1}", port=ports[i], extra_args=args, bin=base_bin)
        self.bootstrap = ",".join(n.bootstrap for n in self.nodes.values())

    def admin(self):
        return AdminClient({"bootstrap.servers": self.bootstrap})

    def partition_state(self, topic, partition):
        p = self.admin().list_topics(topic=topic, timeout=10).topics[topic].partitions[partition]
        return p.leader, list(p.replicas), list(p.isrs)

    def partition_states_at(self, node_id, topic):
        import kafka_wire as kw
        with kw.Conn.to(self.nodes[node_id].bootstrap) as conn:
            answer = conn.metadata_detail([topic]).topics[topic]
        return answer.partitions if answer.error == 0 else {}

    def wait_for(self, what, predicate, timeout=30.0):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                last = predicate()
                if last:
                    return last
            except Exception as error:  # leadership moves while nodes restart
                last = error
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}; last: {last}")


def add_user(cluster) -> str | None:
    """Tries to create a SCRAM user; None on success, else the error."""
    upsert = UserScramCredentialUpsertion("upgraded", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096),
                                          b"upgraded-secret")
    admin = cluster.admin()
    try:
        for future in admin.alter_user_scram_credentials([upsert]).values():
            future.result(timeout=15)
        return None
    except Exception as error:
        detail = error.args[0] if error.args else error
        if hasattr(detail, "name"):
            return f"{detail.name()}: {detail.str()}"
        return repr(error)


def test_rolling_upgrade_from_the_previous_version_under_load(tmp_path):
    base_bin = os.environ.get(BASE_BIN_ENV)
    if not base_bin or not os.access(base_bin, os.X_OK):
        pytest.fail(f"{BASE_BIN_ENV} must name the previous version's binary (scripts/test.sh builds it)")
    cluster = MixedCluster(tmp_path, base_bin)
    try:
        for node in cluster.nodes.values():
            node.start()
        cluster.wait_for("all brokers registered", lambda: len(cluster.admin().list_topics(timeout=5).brokers) == NODES,
                         timeout=60)
        topic, partitions = "upgrade", 3
        create_topic(cluster, topic, partitions)
        load = LoadProducer(cluster.bootstrap, topic, partitions)
        try:
            for node_id, node in cluster.nodes.items():
                time.sleep(1.5)
                before = len(load.acked)
                node.stop()
                node.bin = SLUICE_BIN
                node.start()
                cluster.wait_for(
                    f"node {node_id} back in every ISR",
                    lambda: all(len(cluster.partition_state(topic, p)[2]) == NODES for p in range(partitions)),
                    timeout=60,
                )
                cluster.wait_for(f"acks after upgrading node {node_id}", lambda: len(load.acked) > before + 100,
                                 timeout=30)
                if node_id < NODES:
                    refused = add_user(cluster)
                    assert refused is not None, f"a SCRAM user was accepted with node {node_id + 1} still old"
                    # Refused by version: an old node does not offer the API, a new one
                    # answers UNSUPPORTED_VERSION until the metadata.version is finalized.
                    assert "UNSUPPORTED_VERSION" in refused or "not supported" in refused.lower(), refused
            # Every node runs the new binary: the controller finalizes the newer version.
            errors = []

            def user_added():
                error = add_user(cluster)
                errors.append(error)
                return error is None
            try:
                cluster.wait_for("SCRAM users accepted once all nodes are upgraded", user_added, timeout=30)
            except AssertionError as failure:
                raise AssertionError(f"{failure}; errors: {errors[-3:]}") from None
        finally:
            load.stop()
        assert not load.failed, load.failed[:5]
        assert len(load.acked) > 1000
        seen = consume_all(cluster.bootstrap, topic, partitions, len(load.acked))
        keys = [k for _, _, k in seen]
        assert len(keys) == len(set(keys)), "duplicated records"
        lost = set(load.acked) - set(keys)
        assert not lost, f"{len(lost)} acknowledged records lost, e.g. {sorted(lost)[:5]}"
    finally:
        for node in cluster.nodes.values():
            node.kill()
