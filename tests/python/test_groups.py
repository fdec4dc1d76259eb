"""Consumer groups (classic protocol) against a real `sluice serve`: librdkafka consumers
subscribing with a group, failover when a member is SIGKILLed, committed offsets that
survive a broker crash, static membership, cooperative-sticky rebalances, the group admin
APIs, Kafka's ConsumerGroupCommand, and refused bad input on raw sockets.

Every broker runs with group.initial.rebalance.delay.ms = 0 and consumers with a 6 s
session timeout, so each test takes seconds.
"""

import queue
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from confluent_kafka import Consumer, ConsumerGroupState, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    ResourceType,
)

import kafka_wire as kw
from java_support import run_java, tools_cp  # noqa: F401  (tools_cp is a fixture)

GROUP_ARGS = ["--group-initial-rebalance-delay-ms", "0"]
SESSION_TIMEOUT_MS = 6000
HEARTBEAT_MS = 1000
CONSUMER_GROUP_COMMAND = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"

# Kafka error codes.
MESSAGE_TOO_LARGE = 10
ILLEGAL_GENERATION = 22
INCONSISTENT_GROUP_PROTOCOL = 23
UNKNOWN_MEMBER_ID = 25
MEMBER_ID_REQUIRED = 79
JOIN_GROUP, SYNC_GROUP, OFFSET_COMMIT = 11, 14, 8


@pytest.fixture
def gbroker(broker_factory):
    return broker_factory(extra_args=GROUP_ARGS)


def create_topic(bootstrap, name, partitions):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)


def produce(bootstrap, topic, per_partition, partitions):
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "compression.type": "lz4"})
    for i in range(per_partition):
        for part in range(partitions):
            p.produce(topic, value=f"{part}:{i}".encode(), partition=part)
    assert p.flush(30) == 0


def consumer_conf(bootstrap, group, **extra):
    conf = {
        "bootstrap.servers": bootstrap,
        "broker.address.family": "v4",
        "group.id": group,
        "session.timeout.ms": SESSION_TIMEOUT_MS,
        "heartbeat.interval.ms": HEARTBEAT_MS,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "fetch.wait.max.ms": 100,
    }
    conf.update(extra)
    return conf


class Member:
    """An in-process librdkafka consumer that records every assign/revoke callback."""

    def __init__(self, bootstrap, group, topic, **extra):
        self.assigns, self.revokes = [], []
        self.consumer = Consumer(consumer_conf(bootstrap, group, **extra))
        self.cooperative = extra.get("partition.assignment.strategy") == "cooperative-sticky"
        self.consumer.subscribe([topic], on_assign=self._on_assign, on_revoke=self._on_revoke)

    def _on_assign(self, consumer, partitions):
        self.assigns.append(sorted(tp.partition for tp in partitions))

    def _on_revoke(self, consumer, partitions):
        self.revokes.append(sorted(tp.partition for tp in partitions))

    def partitions(self):
        return sorted(tp.partition for tp in self.consumer.assignment())

    def poll(self, timeout=0.05):
        msg = self.consumer.poll(timeout)
        if msg is not None and msg.error() is None:
            return msg
        return None

    def close(self):
        self.consumer.close()


def poll_until(members, done, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for m in members:
            m.poll(0.05)
        if done():
            return
    raise AssertionError(f"timed out waiting for {what}: {[m.partitions() for m in members]}")


CHILD_CONSUMER = textwrap.dedent(
    """
    import sys, time
    from confluent_kafka import Consumer
    conf = dict(arg.split("=", 1) for arg in sys.argv[2:])
    c = Consumer(conf)
    c.subscribe([sys.argv[1]])
    last = None
    while True:
        c.poll(0.1)
        now = sorted(tp.partition for tp in c.assignment())
        if now != last:
            print("ASSIGNED", ",".join(map(str, now)), flush=True)
            last = now
    """
)


def start_child_consumer(bootstrap, group, topic):
    """A consumer in its own process (so it can be SIGKILLed); its stdout lines go to a queue."""
    conf = consumer_conf(bootstrap, group)
    args = [f"{k}={v}" for k, v in conf.items()]
    child = subprocess.Popen([sys.executable, "-c", CHILD_CONSUMER, topic, *args], stdout=subprocess.PIPE, text=True)
    child.lines = queue.Queue()
    threading.Thread(target=lambda: [child.lines.put(line) for line in child.stdout], daemon=True).start()
    return child


def read_child_assignment(child, want_count, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = child.lines.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            break
        fields = line.split()
        if fields and fields[0] == "ASSIGNED":
            parts = [int(p) for p in fields[1].split(",")] if len(fields) > 1 else []
            if len(parts) == want_count:
                return parts
    raise AssertionError(f"child consumer never reached {want_count} partitions")


def test_three_consumers_share_twelve_partitions_and_fail_over(gbroker):
    topic, group = "groups-12", "g-failover"
    create_topic(gbroker.bootstrap, topic, 12)
    child = start_child_consumer(gbroker.bootstrap, group, topic)
    members = [Member(gbroker.bootstrap, group, topic) for _ in range(2)]
    try:
        poll_until(members, lambda: [len(m.partitions()) for m in members] == [4, 4], 30, "4 partitions each")
        child_parts = read_child_assignment(child, 4, 10)
        everything = sorted(members[0].partitions() + members[1].partitions() + child_parts)
        assert everything == list(range(12))

        killed_at = time.monotonic()
        child.kill()  # SIGKILL: no LeaveGroup, the session has to expire
        child.wait()
        poll_until(members, lambda: [len(m.partitions()) for m in members] == [6, 6], 30, "6 partitions each")
        moved_after = time.monotonic() - killed_at
        assert moved_after < SESSION_TIMEOUT_MS / 1000 + 5, f"partitions moved after {moved_after:.1f}s"
        assert sorted(members[0].partitions() + members[1].partitions()) == list(range(12))
        print(f"failover after SIGKILL: {moved_after:.1f}s")

        started = time.monotonic()
        members.append(Member(gbroker.bootstrap, group, topic))
        poll_until(members, lambda: [len(m.partitions()) for m in members] == [4, 4, 4], 30, "a share for the newcomer")
        print(f"rebalance 2 -> 3 members: {time.monotonic() - started:.1f}s")
        assert sorted(sum((m.partitions() for m in members), [])) == list(range(12))
    finally:
        child.kill()
        for m in members:
            m.close()


def test_committed_offsets_survive_a_broker_crash_and_resume_exactly(gbroker):
    topic, group, partitions, per_partition = "groups-resume", "g-resume", 4, 50
    create_topic(gbroker.bootstrap, topic, partitions)
    produce(gbroker.bootstrap, topic, per_partition, partitions)
    first = Member(gbroker.bootstrap, group, topic)
    seen = []
    deadline = time.monotonic() + 30
    while len(seen) < 120 and time.monotonic() < deadline:
        msg = first.poll(0.1)
        if msg is not None:
            seen.append(msg.value())
    assert len(seen) >= 120
    # Commit exactly what was consumed: the next offset of each partition's last message.
    positions = first.consumer.position(first.consumer.assignment())
    committed = first.consumer.commit(offsets=positions, asynchronous=False)
    assert all(tp.error is None for tp in committed), committed
    first.close()

    gbroker.kill()  # a crash: the commit was acknowledged, so it must be on disk
    gbroker.start()

    second = Member(gbroker.bootstrap, group, topic)
    rest = []
    deadline = time.monotonic() + 40
    while len(seen) + len(rest) < partitions * per_partition and time.monotonic() < deadline:
        msg = second.poll(0.1)
        if msg is not None:
            rest.append(msg.value())
    end = time.monotonic() + 1
    while time.monotonic() < end:  # nothing more may arrive
        msg = second.poll(0.1)
        if msg is not None:
            rest.append(msg.value())
    second.close()
    everything = seen + rest
    assert len(everything) == len(set(everything)), "a record was read twice"
    assert len(everything) == partitions * per_partition, f"{len(everything)} records, some skipped"


def test_commit_metadata_and_leader_epoch_round_trip_and_admin_apis(gbroker):
    topic, group = "groups-admin", "g-admin"
    create_topic(gbroker.bootstrap, topic, 2)
    produce(gbroker.bootstrap, topic, 5, 2)
    member = Member(gbroker.bootstrap, group, topic)
    admin = AdminClient({"bootstrap.servers": gbroker.bootstrap})
    try:
        poll_until([member], lambda: member.partitions() == [0, 1], 30, "both partitions")
        offsets = [TopicPartition(topic, 0, 3, metadata="checkpoint-a", leader_epoch=0), TopicPartition(topic, 1, 5)]
        member.consumer.commit(offsets=offsets, asynchronous=False)
        got = {tp.partition: tp for tp in member.consumer.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)])}
        assert (got[0].offset, got[0].metadata, got[0].leader_epoch) == (3, "checkpoint-a", 0)
        assert got[1].offset == 5

        listed = admin.list_consumer_groups().result(10)
        assert group in {g.group_id for g in listed.valid}
        described = admin.describe_consumer_groups([group])[group].result(10)
        assert described.state == ConsumerGroupState.STABLE
        assert len(described.members) == 1
        assigned = sorted(tp.partition for tp in described.members[0].assignment.topic_partitions)
        assert assigned == [0, 1]
        assert described.partition_assignor == "range"

        # A group with members cannot be deleted.
        with pytest.raises(KafkaException):
            admin.delete_consumer_groups([group])[group].result(10)
    finally:
        member.close()
    deadline = time.monotonic() + 10
    while admin.describe_consumer_groups([group])[group].result(10).state != ConsumerGroupState.EMPTY:
        assert time.monotonic() < deadline, "group never became empty"
        time.sleep(0.1)
    admin.delete_consumer_groups([group])[group].result(10)
    listed = admin.list_consumer_groups().result(10)
    assert group not in {g.group_id for g in listed.valid}
    fresh = Consumer(consumer_conf(gbroker.bootstrap, group))
    assert all(tp.offset < 0 for tp in fresh.committed([TopicPartition(topic, 0)], timeout=10))
    fresh.close()


def test_static_member_rejoins_without_a_rebalance(gbroker):
    topic, group = "groups-static", "g-static"
    create_topic(gbroker.bootstrap, topic, 4)
    a = Member(gbroker.bootstrap, group, topic, **{"group.instance.id": "instance-a"})
    b = Member(gbroker.bootstrap, group, topic, **{"group.instance.id": "instance-b"})
    try:
        poll_until([a, b], lambda: [len(a.partitions()), len(b.partitions())] == [2, 2], 30, "2 partitions each")
        # Let b settle: everything it has seen so far belongs to the initial rebalances.
        poll_until([a, b], lambda: True, 1, "settle")
        a_parts, b_events = a.partitions(), (len(b.assigns), len(b.revokes))
        a.close()  # a static member does not leave the group on close
        a = Member(gbroker.bootstrap, group, topic, **{"group.instance.id": "instance-a"})
        poll_until([a, b], lambda: a.partitions() == a_parts, 15, "a to get its partitions back")
        poll_until([a, b], lambda: True, 2, "quiet period")
        assert (len(b.assigns), len(b.revokes)) == b_events, "b saw a rebalance"
        assert a.partitions() == a_parts
    finally:
        a.close()
        b.close()


def test_cooperative_sticky_only_revokes_moved_partitions(gbroker):
    topic, group = "groups-coop", "g-coop"
    create_topic(gbroker.bootstrap, topic, 12)
    extra = {"partition.assignment.strategy": "cooperative-sticky"}
    a = Member(gbroker.bootstrap, group, topic, **extra)
    b = None
    try:
        poll_until([a], lambda: len(a.partitions()) == 12, 30, "all 12 partitions")
        b = Member(gbroker.bootstrap, group, topic, **extra)
        poll_until([a, b], lambda: [len(a.partitions()), len(b.partitions())] == [6, 6], 30, "6 each")
        revoked = sorted(sum(a.revokes, []))
        assert revoked == b.partitions(), "only the partitions that moved are revoked"
        assert all(len(r) < 12 for r in a.revokes)
    finally:
        a.close()
        if b is not None:
            b.close()


def join_group_body(group, member_id, protocols, protocol_type="consumer"):
    """JoinGroup v5 (not flexible)."""
    w = kw.Writer()
    w.string(group).i32(SESSION_TIMEOUT_MS).i32(10000).string(member_id).string(None).string(protocol_type)
    w.array(protocols, lambda w, p: w.string(p[0]).bytes_(p[1]))
    return w.getvalue()


def join_group(conn, group, member_id, protocols):
    r = conn.request(JOIN_GROUP, 5, join_group_body(group, member_id, protocols))
    r.i32()  # throttle
    error = r.i16()
    generation = r.i32()
    r.string()  # protocol name
    r.string()  # leader
    member = r.string()
    return error, generation, member


def sync_group(conn, group, generation, member_id):
    """SyncGroup v3 (not flexible) from the leader, assigning itself nothing; returns the error code."""
    w = kw.Writer()
    w.string(group).i32(generation).string(member_id).string(None)
    w.array([member_id], lambda w, m: w.string(m).bytes_(b""))
    r = conn.request(SYNC_GROUP, 3, w.getvalue())
    r.i32()
    return r.i16()


def offset_commit(conn, group, generation, member_id, topic):
    """OffsetCommit v7 (not flexible); returns the one partition's error code."""
    w = kw.Writer()
    w.string(group).i32(generation).string(member_id).string(None)
    w.array([topic], lambda w, t: w.string(t).array([0], lambda w, p: w.i32(p).i64(1).i32(-1).string(None)))
    r = conn.request(OFFSET_COMMIT, 7, w.getvalue())
    r.i32()
    topics = r.array(lambda r: (r.string(), r.array(lambda r: (r.i32(), r.i16()))))
    return topics[0][1][0][1]


def test_bad_group_input_gets_clear_errors(gbroker):
    topic = "groups-bad"
    create_topic(gbroker.bootstrap, topic, 1)
    with kw.Conn.to(gbroker.bootstrap) as conn:
        assert join_group(conn, "g-bad", "", [])[0] == INCONSISTENT_GROUP_PROTOCOL
        huge = [("range", b"\0" * (2 * 1024 * 1024))]
        assert join_group(conn, "g-bad", "", huge)[0] == MESSAGE_TOO_LARGE
        # Unknown generation: for an unknown group, and for a real member of a live group.
        assert offset_commit(conn, "g-never-joined", 7, "nobody", topic) in (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID)
        error, _, member = join_group(conn, "g-bad", "", [("range", b"meta")])
        assert error == MEMBER_ID_REQUIRED and member
        error, generation, member = join_group(conn, "g-bad", member, [("range", b"meta")])
        assert error == 0 and generation >= 1
        assert sync_group(conn, "g-bad", generation, member) == 0
        assert offset_commit(conn, "g-bad", generation + 5, member, topic) == ILLEGAL_GENERATION
        assert offset_commit(conn, "g-bad", generation, "intruder", topic) == UNKNOWN_MEMBER_ID
        # Incompatible assignor for a live group.
        assert join_group(conn, "g-bad", "", [("other", b"x")])[0] == INCONSISTENT_GROUP_PROTOCOL
    # Nothing was corrupted: the broker still serves groups normally.
    produce(gbroker.bootstrap, topic, 3, 1)
    member = Member(gbroker.bootstrap, "g-after-bad", topic)
    got = []
    deadline = time.monotonic() + 20
    while len(got) < 3 and time.monotonic() < deadline:
        msg = member.poll(0.1)
        if msg is not None:
            got.append(msg.value())
    member.close()
    assert len(got) == 3
    assert gbroker.is_running()


def test_consumer_group_command_describes_members_and_lag(gbroker, tools_cp):
    topic, group = "groups-cgc", "g-cgc"
    create_topic(gbroker.bootstrap, topic, 2)
    produce(gbroker.bootstrap, topic, 10, 2)
    member = Member(gbroker.bootstrap, group, topic, **{"client.id": "cgc-client"})
    try:
        poll_until([member], lambda: member.partitions() == [0, 1], 30, "both partitions")
        member.consumer.commit(offsets=[TopicPartition(topic, 0, 4), TopicPartition(topic, 1, 10)], asynchronous=False)
        res = run_java(tools_cp, CONSUMER_GROUP_COMMAND,
                       ["--bootstrap-server", gbroker.bootstrap, "--describe", "--group", group], timeout=90)
        assert res.returncode == 0, res.report()
        rows = {}
        for line in res.stdout.splitlines():
            cols = line.split()
            if len(cols) >= 7 and cols[0] == group and cols[1] == topic:
                rows[int(cols[2])] = cols
        assert sorted(rows) == [0, 1], res.report()
        # GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID HOST CLIENT-ID
        assert rows[0][3:6] == ["4", "10", "6"], res.report()
        assert rows[1][3:6] == ["10", "10", "0"], res.report()
        assert rows[0][-1] == "cgc-client", res.report()
        res = run_java(tools_cp, CONSUMER_GROUP_COMMAND,
                       ["--bootstrap-server", gbroker.bootstrap, "--describe", "--group", group, "--members"], timeout=90)
        assert res.returncode == 0, res.report()
        assert "cgc-client" in res.stdout and "2" in res.stdout, res.report()
    finally:
        member.close()


def test_single_node_lists_consumer_offsets_like_a_cluster(gbroker):
    """A single node lists `__consumer_offsets` in Metadata as a cluster does: internal, one
    partition led here, with a stable topic id; a consumer can read the committed-offset
    records from it, and clients can neither write to it nor delete, grow or reconfigure it."""
    topic, group = "offsets-listed", "g-offsets-listed"
    create_topic(gbroker.bootstrap, topic, 1)
    produce(gbroker.bootstrap, topic, 10, 1)
    with kw.Conn.to(gbroker.bootstrap) as conn:
        listed = conn.metadata_detail(None, version=12)
    offsets_topic = listed.topics["__consumer_offsets"]
    assert offsets_topic.internal and not listed.topics[topic].internal
    assert sorted(offsets_topic.partitions) == [0], offsets_topic
    topic_id = offsets_topic.topic_id
    assert topic_id and topic_id != bytes(16)

    # (The Java client leaves internal topics out of pattern subscriptions by this flag; the
    # KIP-848 server-side regex does the same, see test_consumer_protocol.py.)
    member = Member(gbroker.bootstrap, group, topic)
    poll_until([member], lambda: member.partitions() == [0], 30, "assignment")
    got = []
    deadline = time.monotonic() + 30
    while len(got) < 10 and time.monotonic() < deadline:
        msg = member.poll(0.1)
        if msg is not None:
            got.append(msg.value())
    assert len(got) == 10, got
    member.consumer.commit(asynchronous=False)
    member.close()

    # The commit is a record of `__consumer_offsets` partition 0, readable like Kafka's.
    reader = Consumer({"bootstrap.servers": gbroker.bootstrap, "group.id": "offsets-reader",
                       "auto.offset.reset": "earliest", "enable.auto.commit": False})
    reader.assign([TopicPartition("__consumer_offsets", 0, 0)])
    keys = []
    deadline = time.monotonic() + 20
    while not any(group.encode() in k for k in keys) and time.monotonic() < deadline:
        msg = reader.poll(0.2)
        if msg is not None and msg.error() is None:
            keys.append(msg.key() or b"")
    reader.close()
    assert any(group.encode() in k and topic.encode() in k for k in keys), keys[:5]

    # Clients cannot write to it, delete it, grow it or change its configs.
    p = Producer({"bootstrap.servers": gbroker.bootstrap, "message.timeout.ms": 5000})
    errors = []
    p.produce("__consumer_offsets", value=b"x", partition=0, on_delivery=lambda err, _m: errors.append(err))
    p.flush(10)
    assert errors and errors[0] is not None and errors[0].code() == KafkaError.TOPIC_EXCEPTION, errors
    admin = AdminClient({"bootstrap.servers": gbroker.bootstrap})
    with pytest.raises(KafkaException):
        admin.delete_topics(["__consumer_offsets"])["__consumer_offsets"].result(10)
    with pytest.raises(KafkaException):
        admin.create_partitions([NewPartitions("__consumer_offsets", 4)])["__consumer_offsets"].result(10)
    res = ConfigResource(ResourceType.TOPIC, "__consumer_offsets",
                         incremental_configs=[ConfigEntry("retention.ms", "1000",
                                                          incremental_operation=AlterConfigOpType.SET)])
    with pytest.raises(KafkaException):
        admin.incremental_alter_configs([res])[res].result(10)
    described = admin.describe_configs([ConfigResource(ResourceType.TOPIC, "__consumer_offsets")])
    configs = list(described.values())[0].result(10)
    assert configs["cleanup.policy"].value == "compact", configs["cleanup.policy"]

    # Same id after a restart: a client caching topic ids is not confused.
    gbroker.kill()
    gbroker.start()
    with kw.Conn.to(gbroker.bootstrap) as conn:
        again = conn.metadata_detail(None, version=12)
    assert again.topics["__consumer_offsets"].topic_id == topic_id
