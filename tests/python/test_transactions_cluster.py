"""Kafka transactions (exactly-once semantics) on a 3-node cluster, with `kill -9` of the nodes
that hold a transaction's state, seen through real clients.

In a cluster the transaction coordinator of a transactional.id is the leader of its partition of
the replicated internal topic `__transaction_state`; the group coordinator (which holds a
transaction's offsets pending until its commit/abort marker) is the leader of the group's
`__consumer_offsets` partition; the transaction's records and markers are on the leaders of the
partitions it wrote, often other nodes. Each of these is killed below while a transaction is open.

* librdkafka (confluent-kafka) consume-transform-produce (test_transactions.EosPipeline: `in` ->
  `out`, offsets committed with send_offsets_to_transaction, every third transaction aborted,
  client errors handled as applications do) over topics with replication factor 3. With a
  transaction open (its records acknowledged, its offsets sent) the test kills -9 in turn the
  transaction coordinator of the app's transactional.id, the leader of an `out` partition (one
  that is neither coordinator where there is such a partition), and the group coordinator of the
  app's group, and restarts each after a second. A transaction acknowledged after such a kill
  has its outcome in the group's committed offsets at once. read_committed `out` then holds each
  input key exactly once with the transformed value, the group's committed offsets on `in` are
  the end offsets, and every node is running.
* The Java client's exactly-once loop (tests/java/.../TransactionalCopier.java) through the same
  three kills, at random moments while it runs: the same checks, and the aborted transactions'
  records are in the log (read_uncommitted sees more than the input), so aborts were exercised.
* In both, once more after the node leading most `out` partitions is killed: read_committed on
  the new leaders still sees each key exactly once (followers must know which of the records
  they replicated were aborted).
* Zombie fencing across nodes, with the default `__transaction_state` (50 partitions, listed in
  Metadata as an internal topic, replication factor 3): the transactional.id is picked so that its
  coordinator (FindCoordinator, which names the leader of partition abs(hashCode(id)) % 50) is not
  the leader of the topic written, so every marker crosses nodes. A second producer with the same
  transactional.id fences the first, whose open transaction is aborted (read_committed never sees
  its record, the last stable offset moves past it) and whose commit fails with a fatal "fenced"
  error. Then, with the second producer's transaction open, its coordinator is killed -9: another
  node takes over, and a third producer's init_transactions there aborts that open transaction
  and fences the second producer; only committed transactions are ever visible, also once the
  topic's leader is killed and another replica leads it.

Random choices print their seed; set SLUICE_TEST_SEED to replay one.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter

import pytest
from confluent_kafka import OFFSET_INVALID, Consumer, IsolationLevel, KafkaException, TopicPartition

import kafka_wire as kw
from cluster_support import Cluster, create_topic, wait_for
from java_support import JavaProcess, java_cp  # noqa: F401  (java_cp is a fixture)
from test_transactions import (
    FENCED,
    PARTITIONS,
    EosPipeline,
    check_exactly_once,
    client_conf,
    offsets,
    produce_input,
    read_all,
    txn_producer,
)

TXN_STATE = "__transaction_state"
OFFSETS_TOPIC = "__consumer_offsets"
SMALL_INTERNAL_PARTITIONS = 4  # __transaction_state and __consumer_offsets of the pipeline tests
DEFAULT_TXN_STATE_PARTITIONS = 50  # Kafka's transaction.state.log.num.partitions
KEY_GROUP, KEY_TRANSACTION = 0, 1  # FindCoordinator key types
DOWN_S = 1.0  # how long a killed node stays down
N = 1500  # input records of the librdkafka pipeline (its kills hold the pipeline until the node is back)
# The Java copier runs on its own (~3000 records/s here): enough input that it is still copying
# at the third kill, each kill once it committed JAVA_PROGRESS more records.
N_JAVA = 20000
JAVA_PROGRESS = 1000
ROLES = ("transaction coordinator", "out leader", "group coordinator")  # killed in this order
KILL_IN_ABORT = (False, True, False)  # librdkafka test: the transaction open at each kill commits/aborts


def seed() -> int:
    return int(os.environ.get("SLUICE_TEST_SEED", random.randrange(1 << 30)))


def node_args(internal_partitions: int | None):
    """Per-node arguments: groups form at once; with `internal_partitions`, small internal topics."""
    def args(node_id, port):
        out = ["--group-initial-rebalance-delay-ms", "0"]
        if internal_partitions is not None:
            out += ["--offsets-topic-num-partitions", str(internal_partitions),
                    "--transaction-state-num-partitions", str(internal_partitions)]
        return out
    return args


def java_string_hash(s: str) -> int:
    """java.lang.String.hashCode() (the id is ASCII here, so UTF-16 units are the bytes)."""
    h = 0
    for ch in s.encode():
        h = (31 * h + ch) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def txn_partition(txn_id: str, partitions: int) -> int:
    """Kafka's placement: Utils.abs(transactionalId.hashCode) % partitions."""
    h = java_string_hash(txn_id)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


def find_coordinator(node, key: str, key_type: int) -> tuple[int, int]:
    """FindCoordinator v1 asked of one node: (error code, node id)."""
    with kw.Conn.to(node.bootstrap, timeout=2.0) as conn:
        r = conn.request(kw.FIND_COORDINATOR, 1, kw.Writer(False).string(key).i8(key_type).getvalue())
        r.i32()
        error = r.i16()
        r.string()
        return error, r.i32()


def coordinator(cluster: Cluster, key: str, key_type: int, exclude=()) -> int:
    """The coordinator the running nodes name (the first that answers without error); -1 if none."""
    for node_id, node in cluster.nodes.items():
        if node_id in exclude or not node.is_running():
            continue
        try:
            error, answer = find_coordinator(node, key, key_type)
        except (OSError, kw.ConnectionClosed, kw.DecodeError):
            continue
        if error == 0:
            return answer
    return -1


def wait_coordinator(cluster: Cluster, key: str, key_type: int, exclude=(), timeout=30.0) -> int:
    what = "transaction" if key_type == KEY_TRANSACTION else "group"
    return wait_for(f"a {what} coordinator for {key!r} (not {list(exclude)})",
                    lambda: (c := coordinator(cluster, key, key_type, exclude)) > 0 and c not in exclude and c,
                    timeout=timeout)


def leaders(cluster: Cluster, topic: str) -> dict[int, int]:
    """{partition: leader} as a running node answers Metadata."""
    for node_id, node in cluster.nodes.items():
        if node.is_running():
            try:
                return {p: m.leader for p, m in cluster.partition_states_at(node_id, topic).items()}
            except (OSError, kw.ConnectionClosed, kw.DecodeError):
                continue
    return {}


def wait_settled(cluster: Cluster, topics: dict[str, int], timeout=60.0) -> None:
    """Every node running and reporting, for each topic, its partitions all with a leader and
    the full ISR (so min.insync.replicas=2 holds through the next kill)."""
    unsettled: list[str] = []

    def settled():
        unsettled.clear()
        for node_id, node in cluster.nodes.items():
            if not node.is_running():
                unsettled.append(f"node {node_id} down")
                continue
            for topic, count in topics.items():
                states = cluster.partition_states_at(node_id, topic)
                if len(states) != count:
                    unsettled.append(f"node {node_id} knows {len(states)} of {count} partitions of {topic}")
                unsettled.extend(f"node {node_id} sees {topic}-{p} led by {s.leader} with ISR {s.isr}"
                                 for p, s in sorted(states.items()) if s.leader <= 0 or len(s.isr) != 3)
        return not unsettled

    try:
        wait_for(f"full ISRs of {sorted(topics)} on every node", settled, timeout=timeout)
    except AssertionError as error:
        raise AssertionError(f"{error}: {unsettled[:20]}{cluster_logs(cluster)}") from None


def roles_of(cluster: Cluster, node_id: int, txn_id: str, group: str) -> list[str]:
    """What node `node_id` holds right now, for the failure messages and the report."""
    held = []
    if coordinator(cluster, txn_id, KEY_TRANSACTION) == node_id:
        held.append("transaction coordinator")
    if coordinator(cluster, group, KEY_GROUP) == node_id:
        held.append("group coordinator")
    for topic in ("in", "out"):
        held += [f"{topic}-{p} leader" for p, leader in sorted(leaders(cluster, topic).items()) if leader == node_id]
    return held


def pick_victim(cluster: Cluster, role: str, txn_id: str, group: str, rng: random.Random) -> int:
    """The node holding `role` now. For "out leader": the leader of an `out` partition, preferably
    one that is neither coordinator (so the kill hits a node holding only the records and the
    markers), else not the transaction coordinator."""
    if role == "transaction coordinator":
        return wait_coordinator(cluster, txn_id, KEY_TRANSACTION)
    if role == "group coordinator":
        return wait_coordinator(cluster, group, KEY_GROUP)
    txn_coord = wait_coordinator(cluster, txn_id, KEY_TRANSACTION)
    group_coord = wait_coordinator(cluster, group, KEY_GROUP)
    out_leaders = sorted(set(leaders(cluster, "out").values()) - {-1})
    for avoid in ({txn_coord, group_coord}, {txn_coord}, set()):
        candidates = [n for n in out_leaders if n not in avoid]
        if candidates:
            return rng.choice(candidates)
    raise AssertionError(f"no leader of out found: {out_leaders}")


def fail_over_leaders(cluster: Cluster, topic: str) -> tuple[int, list[int]]:
    """Kills -9 the node leading the most partitions of `topic` and waits until other nodes lead
    them all: (the killed node, the partitions it led). Aborted transactions must stay hidden
    from read_committed consumers on the new leaders too (they replicated the abort markers)."""
    before = leaders(cluster, topic)
    victim = Counter(before.values()).most_common(1)[0][0]
    cluster.nodes[victim].kill()
    wait_for(f"new leaders of {topic} after node {victim} was killed",
             lambda: (now := leaders(cluster, topic)) and len(now) == len(before)
             and all(leader not in (-1, victim) for leader in now.values()))
    return victim, sorted(p for p, leader in before.items() if leader == victim)


def group_offsets(bootstrap: str, group: str, topic: str, expected: dict[int, int], timeout=20.0) -> dict | str:
    """The group's committed offsets on `topic` ({partition: offset}, OFFSET_INVALID for none) as
    a read_committed consumer that is not a member fetches them (OffsetFetch with require_stable:
    transactional offsets still pending are not answered), asked until those of the partitions in
    `expected` are as expected or `timeout` passed; returns the last answer. Not librdkafka's
    admin client (test_transactions.committed_offsets): its OffsetFetch answer handling crashed
    the test process here (SIGSEGV in rd_kafka_cgrp_op, called from rd_kafka_handle_OffsetFetch
    in the admin worker, which has no consumer group) right after a group coordinator's kill."""
    c = Consumer(client_conf(bootstrap, **{"group.id": group, "isolation.level": "read_committed",
                                           "enable.auto.commit": False}))
    try:
        deadline = time.monotonic() + timeout
        got: dict[int, int] | str = "no answer"
        while True:
            try:
                tps = c.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10)
                got = {tp.partition: tp.offset for tp in tps}
            except KafkaException as e:
                got = f"no answer ({e})"
            if isinstance(got, dict) and all(got[q] == o for q, o in expected.items()):
                return got
            if time.monotonic() > deadline:
                return got
            time.sleep(0.1)
    finally:
        c.close()


def cluster_logs(cluster: Cluster, tail: int = 3000) -> str:
    return "".join(f"\n--- node {i} log (tail) ---\n{n.log()[-tail:]}" for i, n in cluster.nodes.items())


def pipeline_topics() -> dict[str, int]:
    return {"in": PARTITIONS, "out": PARTITIONS, TXN_STATE: SMALL_INTERNAL_PARTITIONS,
            OFFSETS_TOPIC: SMALL_INTERNAL_PARTITIONS}


def start_pipeline_cluster(tmp_path, records: int) -> Cluster:
    """3 nodes with small internal topics; `in` and `out` (replication factor 3,
    min.insync.replicas 2) with every replica in sync on every node; `records` input records."""
    cluster = Cluster(tmp_path, node_args=node_args(SMALL_INTERNAL_PARTITIONS)).start()
    try:
        create_topic(cluster, "in", PARTITIONS)
        create_topic(cluster, "out", PARTITIONS)
        wait_settled(cluster, pipeline_topics())
        produce_input(cluster.bootstrap, "in", records)
    except BaseException:
        cluster.kill_all()
        raise
    return cluster


class CheckedPipeline(EosPipeline):
    """EosPipeline calling `after_end(pipe, msgs, aborted)` after each transaction that ended
    without error (its commit or abort acknowledged)."""

    def __init__(self, *args, after_end, **kwargs):
        super().__init__(*args, **kwargs)
        self.after_end = after_end

    def transact(self, msgs: list, before_end=None) -> None:
        aborted_before = self.aborted_txns
        super().transact(msgs, before_end)
        self.after_end(self, msgs, self.aborted_txns > aborted_before)


# ----------------------------------------------------------------------------- tests


def test_librdkafka_pipeline_exactly_once_through_coordinator_and_leader_kills(tmp_path):
    """EosPipeline copies N records `in` -> `out` on 3 nodes. After 1/4, 2/4 and 3/4 of the input
    is committed, with a transaction open (its records acknowledged, its offsets sent), the node
    holding (a) the app's transaction coordinator, (b) an `out` partition's leadership, (c) the
    app's group coordinator is killed -9, and restarted a second later. The same producer then
    ends that transaction -- a commit at the kills of the coordinators, an abort at the leader's
    kill -- or, after an error, a new producer with the same transactional.id takes over. When the
    commit/abort is acknowledged, the group's committed offsets for that transaction's input are
    already its outcome (past its records after a commit, at its first records after an abort).
    In the end read_committed `out` holds each input key exactly once with the transformed value,
    also after the node leading most `out` partitions is killed once more (the aborted
    transactions stay hidden on the new leaders); the group's committed offsets on `in` are the
    end offsets; every node runs."""
    rng_seed = seed()
    rng = random.Random(rng_seed)
    txn_id, group = "eos-cluster-app", "eos-cluster"
    cluster = start_pipeline_cluster(tmp_path, N)
    bs = cluster.bootstrap
    kills: list[str] = []
    restarts: list[threading.Thread] = []
    thread_errors: list[BaseException] = []

    def restart(node_id: int):
        try:
            time.sleep(DOWN_S)
            cluster.nodes[node_id].start()
        except BaseException as e:  # reported below
            thread_errors.append(e)

    def before_end(pipe: EosPipeline, abort: bool):
        stage = len(kills)
        if stage == len(ROLES) or pipe.committed_records < (stage + 1) * N // 4 or abort != KILL_IN_ABORT[stage]:
            return
        # The previous victim is back and every replica in sync, so this kill leaves 2 of 3.
        for t in restarts:
            t.join(60)
        assert not thread_errors, f"restarting a node failed: {thread_errors}"
        wait_settled(cluster, pipeline_topics())
        left = pipe.producer.flush(30)  # this transaction's records are acknowledged (in the log)
        assert left == 0, f"{left} records of the transaction not delivered before the kill; {pipe.summary()}"
        role = ROLES[stage]
        victim = pick_victim(cluster, role, txn_id, group, rng)
        held = roles_of(cluster, victim, txn_id, group)
        cluster.nodes[victim].kill()
        kills.append(f"txn {pipe.txns} ({'abort' if abort else 'commit'}): kill -9 node {victim} as {role}, "
                     f"holding {held}")
        t = threading.Thread(target=restart, args=(victim,), daemon=True)
        t.start()
        restarts.append(t)

    def after_end(pipe: EosPipeline, msgs: list, aborted: bool):
        """The transaction open at a kill ended without error: its outcome must be the group's
        committed offsets now (a lost pending offset commit would be overwritten by later
        transactions before the end of the run)."""
        if not kills or not kills[-1].startswith(f"txn {pipe.txns} "):
            return
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        for m in msgs:
            first.setdefault(m.partition(), m.offset())
            last[m.partition()] = m.offset()
        # After an abort: where its records begin (OFFSET_INVALID, nothing committed, if that is 0).
        expected = ({q: o if o > 0 else OFFSET_INVALID for q, o in first.items()} if aborted
                    else {q: o + 1 for q, o in last.items()})
        got = group_offsets(bs, group, "in", expected)
        got = {q: got[q] for q in expected} if isinstance(got, dict) else got
        outcomes.append(f"txn {pipe.txns} {'aborted' if aborted else 'committed'}: committed offsets {got}")
        assert got == expected, (
            f"txn {pipe.txns} was {'aborted' if aborted else 'committed'} after the kill ({kills[-1]}): the group's "
            f"committed offsets on in are {got}, expected {expected}; {pipe.summary()}")

    outcomes: list[str] = []
    pipe = CheckedPipeline(bs, "in", "out", txn_id=txn_id, group=group, tolerate_errors=True, after_end=after_end)
    t0 = time.monotonic()
    try:
        try:
            pipe.run(timeout=150, before_end=before_end)
        finally:
            for t in restarts:
                t.join(60)
            summary = pipe.summary()
            pipe.close()
        took = time.monotonic() - t0
        print(f"seed={rng_seed} pipeline: {took:.1f}s kills={kills} outcomes={outcomes} {summary}")
        ctx = f"seed={rng_seed} kills={kills} {summary}"
        assert not thread_errors, f"restarting a node failed: {thread_errors}; {ctx}{cluster_logs(cluster)}"
        assert len(kills) == len(ROLES), f"not every planned kill happened: {ctx}"
        running = {i: n.is_running() for i, n in cluster.nodes.items()}
        assert all(running.values()), f"nodes running at the end: {running}; {ctx}{cluster_logs(cluster)}"

        committed = read_all(bs, "out", PARTITIONS, "read_committed")
        check_exactly_once(committed, N, f"read_committed consumer of out ({ctx})")
        uncommitted = read_all(bs, "out", PARTITIONS, "read_uncommitted")
        assert len(uncommitted) > N, f"no aborted records in the log: the aborts were not exercised; {ctx}"
        assert {r[:2] for r in committed} <= {r[:2] for r in uncommitted}
        end = group_offsets(bs, group, "in", pipe.src_end)
        assert end == pipe.src_end, f"the group's committed offsets on in: {end}, end offsets {pipe.src_end}; {ctx}"

        victim, led = fail_over_leaders(cluster, "out")
        check_exactly_once(read_all(bs, "out", PARTITIONS, "read_committed"), N,
                           f"read_committed consumer of out after node {victim}, leader of out-{led}, was killed "
                           f"({ctx})")
        cluster.nodes[victim].start()
    finally:
        cluster.kill_all()


def test_java_copier_exactly_once_through_coordinator_and_leader_kills(tmp_path, java_cp):
    """The Java client's TransactionalCopier copies N_JAVA records `in` -> `out` on 3 nodes while
    the node holding (a) its transaction coordinator, (b) an `out` partition's leadership, (c) its
    group coordinator is killed -9 at a random moment (each once the copier committed another
    JAVA_PROGRESS records since the previous node came back) and restarted a second later. The
    copier is still copying at each kill and finishes; read_committed `out` holds each input key
    exactly once with the transformed value, also after the node leading most `out` partitions is
    killed once more; read_uncommitted `out` holds more (the aborted transactions' records: aborts
    were exercised); the group's committed offsets on `in` are the end offsets; every node runs
    at the end."""
    rng_seed = seed()
    rng = random.Random(rng_seed)
    txn_id, group = "java-eos-cluster-app", "java-eos-cluster"
    cluster = start_pipeline_cluster(tmp_path, N_JAVA)
    bs = cluster.bootstrap
    kills: list[str] = []
    try:
        copier = JavaProcess(java_cp, "sluice.tests.TransactionalCopier",
                             ["--bootstrap", bs, "--input", "in", "--output", "out", "--group", group,
                              "--transactional-id", txn_id, "--expect", str(N_JAVA)])

        def committed_so_far() -> int:
            return max((int(line.split()[1]) for _, line in list(copier.lines) if line.startswith("COMMITTED ")),
                       default=0)

        t0 = time.monotonic()
        try:
            target = JAVA_PROGRESS
            for role in ROLES:
                deadline = time.monotonic() + 120
                while committed_so_far() < target:
                    assert time.monotonic() < deadline and copier.proc.poll() is None, (
                        f"seed {rng_seed}: the copier did not commit {target} records; kills={kills}\n"
                        f"{copier.result().report()}{cluster_logs(cluster)}")
                    time.sleep(0.05)
                time.sleep(rng.uniform(0, 0.3))
                victim = pick_victim(cluster, role, txn_id, group, rng)
                held = roles_of(cluster, victim, txn_id, group)
                at = committed_so_far()
                assert not copier.seen("DONE"), (
                    f"seed {rng_seed}: the copier finished before the kill of the {role}, so it was not hit; "
                    f"kills={kills}")
                cluster.nodes[victim].kill()
                kills.append(f"kill -9 node {victim} as {role} at {at} committed, holding {held}")
                time.sleep(DOWN_S)
                cluster.nodes[victim].start()
                wait_settled(cluster, pipeline_topics())
                target = committed_so_far() + JAVA_PROGRESS
            copier.wait_for_line("DONE", 180)
            res = copier.wait(30)
        finally:
            copier.kill()
        took = time.monotonic() - t0
        ctx = f"seed {rng_seed}, kills={kills}\n{res.report()}"
        assert res.returncode == 0, f"{ctx}{cluster_logs(cluster)}"
        running = {i: n.is_running() for i, n in cluster.nodes.items()}
        assert all(running.values()), f"nodes running at the end: {running}; {ctx}{cluster_logs(cluster)}"

        committed = read_all(bs, "out", PARTITIONS, "read_committed")
        check_exactly_once(committed, N_JAVA, f"read_committed consumer of out (seed {rng_seed}, kills={kills})")
        uncommitted = read_all(bs, "out", PARTITIONS, "read_uncommitted")
        assert len(uncommitted) > N_JAVA, f"no aborted records in the log: the aborts were not exercised; {ctx}"
        src_end = offsets(bs, "in", PARTITIONS, IsolationLevel.READ_UNCOMMITTED)
        end = group_offsets(bs, group, "in", src_end)
        assert end == src_end, f"the group's committed offsets on in: {end}, end offsets {src_end}; {ctx}"

        victim, led = fail_over_leaders(cluster, "out")
        check_exactly_once(read_all(bs, "out", PARTITIONS, "read_committed"), N_JAVA,
                           f"read_committed consumer of out after node {victim}, leader of out-{led}, was killed "
                           f"(seed {rng_seed}, kills={kills})")
        cluster.nodes[victim].start()
        commits = sum(line.startswith("COMMITTED ") for _, line in copier.lines)
        recoveries = [line for _, line in copier.lines if "new producer" in line or "aborting after" in line]
        print(f"seed {rng_seed}: copier {took:.1f}s, {commits} commits, {len(uncommitted) - N_JAVA} aborted records "
              f"in the log, kills={kills}, {len(recoveries)} recoveries from client errors: {recoveries[:6]}")
    finally:
        cluster.kill_all()


def test_zombie_fencing_across_nodes_and_coordinator_failover(tmp_path):
    """Default `__transaction_state` (50 partitions): listed in Metadata as an internal topic with
    replication factor 3, and FindCoordinator for a transactional.id names the leader of its
    partition abs(hashCode(id)) % 50. The id is chosen so that its coordinator does not lead the
    1-partition topic written (markers must cross nodes).

    Producer A writes a record in a transaction; producer B with the same transactional.id calls
    init_transactions: A's transaction is aborted (read_committed sees nothing, the last stable
    offset reaches the high watermark) and A's next produce/commit fails with a fatal "fenced"
    error. B commits two records. B then writes a third record in a new transaction and its
    coordinator is killed -9: another node becomes the coordinator within seconds, and producer
    C's init_transactions there aborts B's open transaction and fences B (B's commit fails
    "fenced"). C commits a record. read_committed sees exactly B's two committed records and C's,
    read_uncommitted also A's and B's aborted ones; the killed node restarts. Finally the topic's
    leader is killed: read_committed on the new leader sees the same (the abort markers and what
    they hide were replicated)."""
    cluster = Cluster(tmp_path, node_args=node_args(None)).start()
    try:
        bs = cluster.bootstrap
        topic = "zombie"
        create_topic(cluster, topic, 1)
        wait_settled(cluster, {topic: 1, TXN_STATE: DEFAULT_TXN_STATE_PARTITIONS})
        with kw.Conn.to(cluster.nodes[1].bootstrap) as conn:
            listed = conn.metadata_detail([TXN_STATE]).topics[TXN_STATE]
        assert listed.error == 0 and listed.internal, f"{TXN_STATE} not listed as an internal topic: {listed}"
        assert len(listed.partitions) == DEFAULT_TXN_STATE_PARTITIONS, sorted(listed.partitions)
        assert all(len(p.replicas) == 3 for p in listed.partitions.values()), listed.partitions

        # A transactional.id whose coordinator is not the topic's leader.
        topic_leader = leaders(cluster, topic)[0]
        txn_state_leaders = leaders(cluster, TXN_STATE)
        txn_id = coord = None
        for i in range(100):
            candidate = f"zombie-{i}"
            found = wait_coordinator(cluster, candidate, KEY_TRANSACTION)
            expected = txn_state_leaders[txn_partition(candidate, DEFAULT_TXN_STATE_PARTITIONS)]
            assert found == expected, (
                f"FindCoordinator({candidate!r}) names node {found}, but the leader of {TXN_STATE} partition "
                f"{txn_partition(candidate, DEFAULT_TXN_STATE_PARTITIONS)} is node {expected}")
            if found != topic_leader:
                txn_id, coord = candidate, found
                break
        assert txn_id is not None, f"every transactional.id tried is coordinated by the topic's leader {topic_leader}"

        # A's transaction is open, its record in the log on another node than its coordinator.
        delivered: list = []
        a = txn_producer(bs, txn_id)
        a.init_transactions(30)
        a.begin_transaction()
        a.produce(topic, key=b"a", value=b"a-1", on_delivery=lambda err, msg: delivered.append(err))
        assert a.flush(30) == 0 and delivered == [None], f"A's record was not written: {delivered}"
        assert offsets(bs, topic, 1, IsolationLevel.READ_COMMITTED)[0] == 0

        b = txn_producer(bs, txn_id)
        t = time.monotonic()
        b.init_transactions(30)  # A's transaction is aborted first: markers from node `coord` to `topic_leader`
        b_init_s = time.monotonic() - t
        assert [r[3] for r in read_all(bs, topic, 1, "read_committed", timeout=20)] == [], \
            "A's aborted record is visible to read_committed after B's init_transactions"

        # A goes on as if nothing happened (no Python callbacks: see test_transactions' zombie test).
        with pytest.raises(KafkaException) as info:
            a.produce(topic, key=b"a", value=b"a-2")
            a.commit_transaction(30)
        a_err = info.value.args[0]
        assert a_err.fatal() and a_err.code() in FENCED, f"A's produce/commit after being fenced: {a_err}"

        b.begin_transaction()
        b.produce(topic, key=b"b", value=b"b-1")
        b.produce(topic, key=b"b", value=b"b-2")
        b.commit_transaction(30)
        assert [r[3] for r in read_all(bs, topic, 1, "read_committed")] == [b"b-1", b"b-2"]

        # B's next transaction is open when its coordinator dies.
        delivered.clear()
        b.begin_transaction()
        b.produce(topic, key=b"b", value=b"b-3", on_delivery=lambda err, msg: delivered.append(err))
        assert b.flush(30) == 0 and delivered == [None], f"B's third record was not written: {delivered}"
        cluster.nodes[coord].kill()
        killed_at = time.monotonic()
        new_coord = wait_coordinator(cluster, txn_id, KEY_TRANSACTION, exclude=(coord,), timeout=20)
        moved_s = time.monotonic() - killed_at

        c = txn_producer(bs, txn_id)
        t = time.monotonic()
        c.init_transactions(60)  # aborts B's open transaction: the new coordinator knows it
        c_init_s = time.monotonic() - t
        assert [r[3] for r in read_all(bs, topic, 1, "read_committed", timeout=20)] == [b"b-1", b"b-2"], \
            "B's open transaction is not aborted after the coordinator failover"

        with pytest.raises(KafkaException) as info:
            b.produce(topic, key=b"b", value=b"b-4")
            b.commit_transaction(30)
        b_err = info.value.args[0]
        assert b_err.fatal() and b_err.code() in FENCED, f"B's produce/commit after C's init_transactions: {b_err}"

        c.begin_transaction()
        c.produce(topic, key=b"c", value=b"c-1")
        c.commit_transaction(30)

        cluster.nodes[coord].start()
        wait_settled(cluster, {topic: 1, TXN_STATE: DEFAULT_TXN_STATE_PARTITIONS})
        committed = [r[3] for r in read_all(bs, topic, 1, "read_committed")]
        assert committed == [b"b-1", b"b-2", b"c-1"], f"read_committed sees {committed}"
        uncommitted = [r[3] for r in read_all(bs, topic, 1, "read_uncommitted")]
        assert uncommitted == [b"a-1", b"b-1", b"b-2", b"b-3", b"c-1"], (
            f"read_uncommitted sees {uncommitted}: the fenced producers' later records must be refused")
        victim, _ = fail_over_leaders(cluster, topic)
        committed = [r[3] for r in read_all(bs, topic, 1, "read_committed")]
        assert committed == [b"b-1", b"b-2", b"c-1"], (
            f"read_committed sees {committed} once node {victim}, the topic's leader, was killed and node "
            f"{leaders(cluster, topic)[0]} leads it")
        cluster.nodes[victim].start()
        print(f"{txn_id}: coordinator node {coord}, topic leader node {topic_leader}; B's init_transactions took "
              f"{b_init_s:.2f}s, A failed with {a_err}; after the kill node {new_coord} coordinates "
              f"({moved_s:.1f}s), C's init_transactions took {c_init_s:.2f}s, B failed with {b_err}")
    finally:
        cluster.kill_all()
