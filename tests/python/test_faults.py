"""Short runs of the fault-injection harness (`tests/python/faults`), one per fault type:
a 3-node cluster behind the fault-injecting proxy, idempotent acks=all producers and a
consumer on an RF=3, min.insync.replicas=2 topic, checked with Jepsen's queue semantics.
Long runs: `python -m faults` (README, "Fault injection"); the slow tier's 10-minute mixed
run is the last test here, run when SLUICE_SLOW_TESTS=1.
"""

import os

import pytest

import kafka_wire as kw
from faults.checker import check
from faults.cluster import FaultCluster
from faults.runner import ALL_FAULTS, RunConfig, run
from faults.workload import Ack, History, Read

FSYNC_FAILURE_EXIT_CODE = 3
"""`sluice serve`'s exit status when an fsync failed in cluster mode (cluster_link.rs)."""


def test_checker_finds_every_kind_of_violation():
    history = History()
    history.attempted = {"0-0", "0-1", "0-2", "0-3", "1-0"}
    history.acks = [Ack(1.0, 0, 0, "0-0"), Ack(2.0, 0, 1, "0-1"), Ack(6.0, 0, 2, "0-2"), Ack(7.0, 1, 0, "1-0")]
    history.reads = [Read(0, 0, 0, "0-0"), Read(0, 0, 1, "0-9")]
    history.backwards = [(0, 0, 1, 0)]
    final = {0: [(0, "0-0"), (1, "0-1"), (2, "0-3"), (3, "0-3"), (4, "x")], 1: [(0, "1-0")]}
    result = check(history, final)
    assert result.lost == ["0-2"]
    assert [value for value, _ in result.duplicated] == ["0-3"]
    assert result.conflicts == [((0, 1), {"0-1", "0-9"})]
    assert result.unexpected == ["x"]
    assert result.backwards == [(0, 0, 1, 0)]
    assert result.longest_unavailability_s == 4.0
    assert not result.valid
    clean = {0: [(0, "0-0"), (1, "0-1"), (2, "0-2")], 1: [(0, "1-0")]}
    history.reads, history.backwards = [], []
    assert check(history, clean).valid
    # Offsets out of a producer's order within a partition are reordering.
    assert check(history, {0: [(0, "0-1"), (1, "0-0"), (2, "0-2")], 1: [(0, "1-0")]}).reordered


def short_run(tmp_path, faults, level=1, count=1, hold_s=4.0, partitions=3):
    config = RunConfig(work_dir=tmp_path / "cluster", faults=faults, level=level, faults_max=count,
                       duration_s=60.0, hold_s=hold_s, settle_s=1.5, recover_s=30.0, partitions=partitions,
                       rate_per_s=150.0)
    report = run(config, log=print)
    print(report.table())
    result = report.result
    assert not report.unrecovered, report.table()
    assert len(report.events) == count, report.table()
    assert result.acknowledged > 0
    assert result.lost == [] and result.misplaced == [], report.table()
    assert result.duplicated == [], report.table()
    assert result.valid, report.table()
    return report


@pytest.mark.parametrize("level", [1, 2])
def test_leader_kill_9_under_load_loses_and_duplicates_nothing(tmp_path, level):
    report = short_run(tmp_path, ("kill",), level=level, count=3, hold_s=1.0)
    assert all(event.led for event in report.events), "every victim led a partition"
    assert len(report.failover_times()) == 3, report.table()


def test_isolated_leader_is_replaced_and_rejoins_after_healing(tmp_path):
    report = short_run(tmp_path, ("partition",), hold_s=6.0)
    event = report.events[0]
    # The majority elects a leader for the partitions the isolated node led ...
    assert event.observations["majority_leader_s"] is not None, report.table()
    # ... acknowledged records go on on the majority side, none is lost from the minority
    # side (checked above), and the old leader comes back into the ISR after healing.
    assert event.observations["acks_during"] > 0, report.table()
    assert event.observations["minority_acks"] == 0, report.table()
    assert event.observations["rejoined_isr"], report.table()


def test_paused_follower_leaves_the_isr_and_rejoins(tmp_path):
    report = short_run(tmp_path, ("pause",), hold_s=5.0, partitions=1)
    event = report.events[0]
    assert event.led == [], "the victim is a follower"
    assert event.observations["left_isr_s"] is not None, report.table()
    assert event.observations["acks_during"] > 0, "writes go on without the paused follower"
    assert event.observations["rejoined_isr"], report.table()


def test_killed_active_controller_is_replaced_and_topics_can_be_created(tmp_path):
    report = short_run(tmp_path, ("controller",), hold_s=4.0)
    event = report.events[0]
    assert event.observations["new_controller_s"] is not None, report.table()
    assert event.observations["topic_created"], report.table()


@pytest.mark.parametrize("level", [1, 2])
def test_leader_power_losses_lose_nothing(tmp_path, level):
    """Each node's data dir is on its own lossy mount: a leader killed with everything it had
    not fsynced dropped comes back with less than it had, and still nothing acknowledged is
    lost: at level 1 every ISR member fsynced it before the acknowledgement, at level 2 the
    other ISR members hold it (a minority's power loss; all nodes at once is level 1's)."""
    report = short_run(tmp_path, ("power",), level=level, count=3, hold_s=1.0)
    assert all(event.led for event in report.events), "every victim led a partition"


def test_all_nodes_losing_power_at_once_lose_nothing_at_level_1(tmp_path):
    """Every node loses power together (controllers included), twice: level 1 still loses
    nothing acknowledged, and the cluster comes back by itself."""
    short_run(tmp_path, ("power-all",), level=1, count=2, hold_s=1.0)


def test_leader_whose_fsync_fails_stops_and_its_partitions_fail_over_losing_nothing(tmp_path):
    """A failing disk (every fsync answers EIO, and what it failed to write is never
    persisted): the leader stops by itself instead of acknowledging or holding partitions
    it cannot serve; the others take over; after a power loss and restart nothing
    acknowledged is lost or duplicated."""
    report = short_run(tmp_path, ("eio",), level=1, count=2, hold_s=1.0)
    for event in report.events:
        assert event.led, "every victim led a partition"
        assert event.observations["stopped_s"] is not None, report.table()
        assert event.observations["exit_code"] == FSYNC_FAILURE_EXIT_CODE, report.table()
    assert len(report.failover_times()) == 2, report.table()


def test_acks_all_write_whose_isr_shrank_below_min_insync_is_not_enough_replicas_after_append(tmp_path):
    """Kafka's NOT_ENOUGH_REPLICAS_AFTER_APPEND: an acks=all write accepted with a full ISR,
    whose ISR then shrank below min.insync.replicas while it waited (a follower paused and
    fenced), is not answered with success once the high watermark passes it."""
    cluster = FaultCluster(tmp_path / "cluster").start()
    paused = None
    try:
        cluster.create_topic("shrink", 1, 3, {"min.insync.replicas": "3"})
        cluster.wait_stably_healthy("shrink", 1, 30)
        partition = cluster.any_metadata("shrink").partitions[0]
        follower = next(r for r in partition.replicas if r != partition.leader)
        with kw.Conn("127.0.0.1", cluster.nodes[partition.leader].kafka_private, timeout=60) as conn:
            assert conn.produce("shrink", 0, kw.record_batch([kw.Record(b"in sync")]))[0] == kw.NONE
            cluster.nodes[follower].pause()
            paused = follower
            error, _, _, _ = conn.produce("shrink", 0, kw.record_batch([kw.Record(b"shrunk")]), timeout_ms=40_000)
        if error != kw.NOT_ENOUGH_REPLICAS_AFTER_APPEND:
            views = {node.node_id: node.metadata("shrink").partitions[0] for node in cluster.reachable()
                     if node.node_id != follower}
            raise AssertionError(f"error {error}; leader {partition.leader}, paused {follower}; "
                                 f"the other nodes' views now: {views}")
        # The leader answered from its own, committed view of the ISR; the other nodes learn
        # the shrink when they apply the controller's record, a moment later.
        def shrunk_everywhere() -> bool:
            others = [node for node in cluster.reachable() if node.node_id != follower]
            isrs = [node.metadata("shrink").partitions[0].isr for node in others]
            return all(follower not in isr and len(isr) == 2 for isr in isrs)

        cluster.wait_for("the other nodes to report the shrunk ISR", shrunk_everywhere, timeout=15.0)
    finally:
        if paused is not None:
            cluster.nodes[paused].resume()
        cluster.stop()


@pytest.mark.skipif(os.environ.get("SLUICE_SLOW_TESTS") != "1", reason="slow tier: SLUICE_SLOW_TESTS=1")
def test_ten_minutes_of_mixed_faults_at_level_1_lose_and_duplicate_nothing(tmp_path):
    """The slow tier: 10 minutes of every fault in turn (kill, pause, partition, controller
    kill, a leader's power loss, every node's power loss, a failing disk) at level 1."""
    config = RunConfig(work_dir=tmp_path / "cluster", faults=ALL_FAULTS, level=1, duration_s=600.0)
    report = run(config, log=print)
    print(report.table())
    assert not report.unrecovered, report.table()
    assert set(event.kind for event in report.events) == set(ALL_FAULTS), report.table()
    result = report.result
    assert result.acknowledged > 10_000, report.table()
    assert result.lost == [] and result.misplaced == [] and result.duplicated == [], report.table()
    assert result.valid, report.table()
