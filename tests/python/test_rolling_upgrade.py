"""Rolling upgrade: a 3-node cluster started on the previous version's binary (built by
scripts/test.sh from the commit in tests/upgrade-base-rev) is upgraded node by node to
this binary under an idempotent acks=all load, its controllers sharing a secret. Nothing
acknowledged is lost or duplicated; the new nodes' encrypted controller RPCs and the old
nodes' signed ones keep one quorum; when the previous version's metadata.version is older,
commands that old nodes could not understand (SCRAM users here) are refused while versions
are mixed, and once every node runs the new binary the cluster finalizes the newer
metadata.version by itself and accepts them.
"""

import os
import time

import pytest
from confluent_kafka.admin import ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

from cluster_support import NODES, Cluster, LoadProducer, consume_all, create_topic
from conftest import SLUICE_BIN

BASE_BIN_ENV = "SLUICE_UPGRADE_BASE_BIN"
# How long an all-old cluster is given to accept a SCRAM user before it counts as refusing.
GATING_SETTLE_S = 10


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


def refused_by_version(error: str) -> bool:
    """An old node does not offer the API; a new one answers UNSUPPORTED_VERSION until the
    metadata.version is finalized."""
    return "UNSUPPORTED_VERSION" in error or "not supported" in error.lower()


def test_rolling_upgrade_from_the_previous_version_under_load(tmp_path):
    base_bin = os.environ.get(BASE_BIN_ENV)
    if not base_bin or not os.access(base_bin, os.X_OK):
        pytest.fail(f"{BASE_BIN_ENV} must name the previous version's binary (scripts/test.sh builds it)")
    cluster = Cluster(tmp_path, bin=base_bin).start()
    try:
        topic, partitions = "upgrade", 3
        create_topic(cluster, topic, partitions)
        # Whether the previous version already finalizes the metadata.version that SCRAM
        # users need: only then is there nothing for mixed versions to refuse.
        # (A new cluster finalizes its metadata.version shortly after it starts: refusals by
        # version at first do not tell.)
        gated = True
        deadline = time.monotonic() + GATING_SETTLE_S
        while gated and time.monotonic() < deadline:
            gated = add_user(cluster) is not None
            time.sleep(0.5)
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
                if gated and node_id < NODES:
                    refused = add_user(cluster)
                    assert refused is not None, f"a SCRAM user was accepted with node {node_id + 1} still old"
                    # Refused by version: an old node does not offer the API, a new one
                    # answers UNSUPPORTED_VERSION until the metadata.version is finalized.
                    assert refused_by_version(refused), refused
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
