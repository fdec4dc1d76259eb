"""KIP-848 consumer groups (`group.protocol=consumer`) against a real `sluice serve`: the Java
client (kafka-clients 4.3.1, one JVM per member so one can be SIGKILLed), librdkafka,
Kafka's ConsumerGroupCommand, and refused bad input on raw sockets.

Every broker here tells members to heartbeat every 500 ms and expires sessions after 6 s
(Kafka's defaults are 5 s and 45 s), so each test takes seconds.
"""

from __future__ import annotations

import re
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

import kafka_wire as kw
from java_support import JavaProcess, java_cp, run_java, tools_cp  # noqa: F401  (fixtures)
from peer_support import kafka_peer  # noqa: F401  (fixture)

HEARTBEAT_MS = 500
SESSION_MS = 6000
CONSUMER_GROUP_ARGS = [
    "--group-initial-rebalance-delay-ms", "0",
    "--group-consumer-heartbeat-interval-ms", str(HEARTBEAT_MS),
    "--group-consumer-session-timeout-ms", str(SESSION_MS),
]
CONSUMER_GROUP_COMMAND = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"
GROUP_MEMBER = "sluice.tests.GroupMember"

# API keys and error codes.
JOIN_GROUP, OFFSET_COMMIT, DESCRIBE_GROUPS = 11, 8, 15
CONSUMER_GROUP_HEARTBEAT, CONSUMER_GROUP_DESCRIBE = 68, 69
INCONSISTENT_GROUP_PROTOCOL = 23
UNKNOWN_MEMBER_ID = 25
INVALID_REQUEST = 42
GROUP_ID_NOT_FOUND = 69
FENCED_MEMBER_EPOCH = 110
UNRELEASED_INSTANCE_ID = 111
UNSUPPORTED_ASSIGNOR = 112
STALE_MEMBER_EPOCH = 113
INVALID_REGULAR_EXPRESSION = 128
# First flexible versions of the APIs encoded here.
kw.FLEXIBLE_FROM.update({CONSUMER_GROUP_HEARTBEAT: 0, CONSUMER_GROUP_DESCRIBE: 0, OFFSET_COMMIT: 8})


@pytest.fixture
def cbroker(broker_factory):
    return broker_factory(extra_args=CONSUMER_GROUP_ARGS)


def create_topic(bootstrap, name, partitions):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)


def produce(bootstrap, topic, per_partition, partitions):
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(per_partition):
        for part in range(partitions):
            p.produce(topic, value=f"{part}:{i}".encode(), partition=part)
    assert p.flush(30) == 0


class Member:
    """A GroupMember JVM (stdin open for commands); its ASSIGNED/REVOKED/... lines are parsed
    as they arrive."""

    def __init__(self, cp, bootstrap, group, topic, *extra, protocol="consumer"):
        args = ["--bootstrap", bootstrap, "--group", group, "--topic", topic, "--protocol", protocol, *extra]
        self.proc = JavaProcess(cp, GROUP_MEMBER, args, stdin=True)

    def events(self, kind):
        """[(wall-clock seconds, partitions)] of every line of this kind so far."""
        out = []
        for _, line in list(self.proc.lines):
            fields = line.split()
            if fields and fields[0] == kind:
                parts = [int(p) for p in fields[2].split(",")] if len(fields) > 2 and fields[2] else []
                out.append((int(fields[1]) / 1000, parts))
        return out

    def partitions(self):
        assigned = self.events("ASSIGNED")
        return assigned[-1][1] if assigned else None

    def revoked_since(self, since):
        return sorted(p for t, parts in self.events("REVOKED") + self.events("LOST") if t >= since for p in parts)

    def send(self, command):
        self.proc.send(command)

    def kill(self):
        self.proc.kill()

    def report(self):
        return self.proc.result().report()


def start_member(cp, bootstrap, group, topic, *extra, protocol="consumer"):
    return Member(cp, bootstrap, group, topic, *extra, protocol=protocol)


def wait_until(members, done, timeout, what, broker=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if done():
            return
        time.sleep(0.05)
    reports = "\n".join(m.report()[-3000:] for m in members)
    log = broker.log()[-4000:] if broker else ""
    raise AssertionError(f"timed out waiting for {what}: {[m.partitions() for m in members]}\n{reports}\n{log}")


def shares(members):
    return [len(m.partitions() or []) for m in members]


def everything(members):
    return sorted(p for m in members for p in (m.partitions() or []))


def test_java_consumer_protocol_moves_only_what_must_move(cbroker, java_cp):
    """3 Java consumers (group.protocol=consumer) on a 12-partition topic get 4 partitions
    each; one is SIGKILLed and its 4 partitions move to the other two within the session
    timeout while they revoke nothing; a newcomer then gets a share of 4, and the others
    revoke exactly the partitions that moved to it and nothing else."""
    topic, group = "cp-12", "cp-failover"
    create_topic(cbroker.bootstrap, topic, 12)
    members = [start_member(java_cp, cbroker.bootstrap, group, topic) for _ in range(3)]
    try:
        wait_until(members, lambda: shares(members) == [4, 4, 4] and everything(members) == list(range(12)), 60,
                   "4 partitions each", cbroker)
        time.sleep(1.0)  # nothing else happens once stable
        assert shares(members) == [4, 4, 4]
        victim, survivors = members[0], members[1:]
        before = {id(m): set(m.partitions()) for m in survivors}
        killed_at = time.time()
        victim.kill()  # SIGKILL: no leave heartbeat, the session must expire
        wait_until(survivors, lambda: shares(survivors) == [6, 6] and everything(survivors) == list(range(12)),
                   SESSION_MS / 1000 + 15, "6 partitions each", cbroker)
        moved_after = time.time() - killed_at
        assert moved_after < SESSION_MS / 1000 + 5, f"partitions moved after {moved_after:.1f}s"
        for m in survivors:
            assert m.revoked_since(killed_at) == [], f"a survivor revoked partitions: {m.report()}"
            assert before[id(m)] <= set(m.partitions()), "a survivor lost a partition"
        print(f"consumer protocol failover after SIGKILL: {moved_after:.1f}s (session timeout {SESSION_MS / 1000}s)")

        stable = {id(m): set(m.partitions()) for m in survivors}
        joined_at = time.time()
        members = survivors + [start_member(java_cp, cbroker.bootstrap, group, topic)]
        wait_until(members, lambda: shares(members) == [4, 4, 4] and everything(members) == list(range(12)), 60,
                   "a share for the newcomer", cbroker)
        print(f"consumer protocol 2 -> 3 members: {time.time() - joined_at:.1f}s")
        for m in survivors:
            revoked = set(m.revoked_since(joined_at))
            moved = stable[id(m)] - set(m.partitions())
            assert revoked == moved, f"revoked {sorted(revoked)} but only {sorted(moved)} moved"
            assert len(moved) == 2
    finally:
        for m in members:
            m.kill()


def test_java_consumer_protocol_commits_survive_a_broker_crash(cbroker, java_cp):
    """A consumer-protocol member commits what it consumed (OffsetCommit v9 with its member
    epoch), closes; the broker is SIGKILLed and restarted; a new member resumes exactly at the
    committed offsets: every record is read once, none skipped, none read twice."""
    topic, group, partitions, per_partition = "cp-resume", "cp-resume", 4, 60
    create_topic(cbroker.bootstrap, topic, partitions)
    produce(cbroker.bootstrap, topic, per_partition, partitions)

    def records(member):
        return [tuple(l.split()[1:4]) for _, l in list(member.proc.lines) if l.startswith("RECORD ")]

    first = start_member(java_cp, cbroker.bootstrap, group, topic, "--print-records")
    try:
        wait_until([first], lambda: len(records(first)) >= 100, 60, "100 records", cbroker)
        first.send("commit")
        first.proc.wait_for_line("COMMITTED", 30)
        first.send("close")
        first.proc.wait_for_line("CLOSED", 30)
        first.proc.wait(30)
    finally:
        first.kill()
    seen = records(first)
    assert len(seen) == len(set(seen))

    cbroker.kill()
    cbroker.start()

    second = start_member(java_cp, cbroker.bootstrap, group, topic, "--print-records")
    try:
        total = partitions * per_partition
        wait_until([second], lambda: len(seen) + len(records(second)) >= total, 60, "the rest", cbroker)
        time.sleep(1.5)  # nothing more may arrive
        rest = records(second)
    finally:
        second.kill()
    values = [r[2] for r in seen + rest]
    assert len(values) == len(set(values)), "a record was read twice"
    assert sorted(values) == sorted(f"{p}:{i}" for p in range(partitions) for i in range(per_partition)), "skipped"


def test_java_static_member_rejoins_with_its_partitions(cbroker, java_cp):
    """Two static members (group.instance.id); one closes (a static leave keeps its
    partitions) and a new process with the same instance id gets exactly its partitions
    back, while the other member revokes nothing."""
    topic, group = "cp-static", "cp-static"
    create_topic(cbroker.bootstrap, topic, 6)
    a = start_member(java_cp, cbroker.bootstrap, group, topic, "--instance-id", "instance-a")
    b = start_member(java_cp, cbroker.bootstrap, group, topic, "--instance-id", "instance-b")
    members = [a, b]
    try:
        wait_until(members, lambda: shares(members) == [3, 3], 60, "3 partitions each", cbroker)
        a_parts, since = a.partitions(), time.time()
        a.send("close")
        a.proc.wait_for_line("CLOSED", 30)
        a.proc.wait(30)
        a = start_member(java_cp, cbroker.bootstrap, group, topic, "--instance-id", "instance-a")
        members = [a, b]
        wait_until(members, lambda: a.partitions() == a_parts, 30, "a's partitions back", cbroker)
        time.sleep(1.5)
        assert b.revoked_since(since) == [], b.report()
        assert a.partitions() == a_parts and len(b.partitions()) == 3
    finally:
        for m in members:
            m.kill()


def test_consumer_group_command_and_admin_describe_a_consumer_protocol_group(cbroker, java_cp, tools_cp):
    """kafka-consumer-groups --describe (ConsumerGroupDescribe) shows every partition with
    its committed offset, log end and lag and the member owning it; --members lists the
    member with its client id and host; --state shows the group as Stable with the uniform
    assignor; --list shows it; librdkafka's admin lists it with type consumer."""
    topic, group = "cp-cgc", "cp-cgc"
    create_topic(cbroker.bootstrap, topic, 2)
    produce(cbroker.bootstrap, topic, 10, 2)
    member = start_member(java_cp, cbroker.bootstrap, group, topic, "--client-id", "cp-client", "--print-records")
    try:
        wait_until([member], lambda: member.partitions() == [0, 1] and
                   sum(1 for _, l in list(member.proc.lines) if l.startswith("RECORD ")) == 20, 60, "20 records",
                   cbroker)
        member.send("commit")
        member.proc.wait_for_line("COMMITTED", 30)
        produce(cbroker.bootstrap, topic, 3, 2)  # lag 3 on each partition, unless consumed meanwhile

        def cgc(*args):
            res = run_java(tools_cp, CONSUMER_GROUP_COMMAND, ["--bootstrap-server", cbroker.bootstrap, *args],
                           timeout=90)
            assert res.returncode == 0, f"{res.report()}\n{cbroker.log()[-4000:]}"
            return res

        res = cgc("--describe", "--group", group)
        rows = {}
        for line in res.stdout.splitlines():
            cols = line.split()
            if len(cols) >= 9 and cols[0] == group and cols[1] == topic:
                rows[int(cols[2])] = cols
        assert sorted(rows) == [0, 1], res.report()
        # GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID HOST CLIENT-ID
        for p in (0, 1):
            assert rows[p][3:6] == ["10", "13", "3"], res.report()
            assert rows[p][7] == "/127.0.0.1" and rows[p][8] == "cp-client", res.report()
        res = cgc("--describe", "--group", group, "--members", "--verbose")
        assert "cp-client" in res.stdout and "/127.0.0.1" in res.stdout, res.report()
        assert re.search(r"\b2\b", res.stdout), f"the member's 2 partitions\n{res.report()}"
        res = cgc("--describe", "--group", group, "--state")
        assert "Stable" in res.stdout and "uniform" in res.stdout, res.report()
        res = cgc("--list")
        assert group in res.stdout.split(), res.report()

        admin = AdminClient({"bootstrap.servers": cbroker.bootstrap})
        listed = {g.group_id: g for g in admin.list_consumer_groups().result(10).valid}
        assert group in listed
        assert str(listed[group].type).lower().endswith("consumer"), listed[group].type
    finally:
        member.kill()


def test_librdkafka_consumer_protocol_shares_and_fails_over(cbroker):
    """librdkafka (confluent-kafka) with group.protocol=consumer: two consumers split 6
    partitions 3/3; when one closes (a leave heartbeat) the other gets all 6 without
    revoking its own; DescribeGroups-based admin shows the member host as /127.0.0.1."""
    topic, group = "cp-rdkafka", "cp-rdkafka"
    create_topic(cbroker.bootstrap, topic, 6)

    class RdMember:
        def __init__(self):
            self.revoked = []
            self.c = Consumer({"bootstrap.servers": cbroker.bootstrap, "group.id": group,
                               "group.protocol": "consumer", "auto.offset.reset": "earliest",
                               "broker.address.family": "v4"})
            self.c.subscribe([topic], on_revoke=lambda c, ps: self.revoked.extend(p.partition for p in ps))

        def parts(self):
            return sorted(tp.partition for tp in self.c.assignment())

    a, b = RdMember(), RdMember()
    try:
        deadline = time.monotonic() + 60
        while [len(a.parts()), len(b.parts())] != [3, 3]:
            assert time.monotonic() < deadline, f"no 3/3 split: {a.parts()} {b.parts()}\n{cbroker.log()[-4000:]}"
            a.c.poll(0.05)
            b.c.poll(0.05)
        assert sorted(a.parts() + b.parts()) == list(range(6))
        a_revoked = len(a.revoked)
        b.c.close()
        deadline = time.monotonic() + 30
        while a.parts() != list(range(6)):
            assert time.monotonic() < deadline, f"a never got all 6: {a.parts()}\n{cbroker.log()[-4000:]}"
            a.c.poll(0.05)
        assert len(a.revoked) == a_revoked, "a revoked its own partitions"
    finally:
        a.c.close()


def test_librdkafka_consumer_protocol_subscribes_by_pattern(cbroker):
    """librdkafka with group.protocol=consumer and a regex subscription (sent to the broker as
    subscribed_topic_regex, resolved there): it gets every partition of the matching topics,
    none of the others, and a matching topic created later joins its assignment."""
    create_topic(cbroker.bootstrap, "rx-orders", 2)
    create_topic(cbroker.bootstrap, "rx-payments", 1)
    create_topic(cbroker.bootstrap, "other-rx-orders", 1)
    c = Consumer({"bootstrap.servers": cbroker.bootstrap, "group.id": "cp-pattern", "group.protocol": "consumer",
                  "auto.offset.reset": "earliest", "broker.address.family": "v4",
                  "topic.metadata.refresh.interval.ms": 1000})

    def owned():
        return sorted((tp.topic, tp.partition) for tp in c.assignment())

    def wait_for(expected):
        deadline = time.monotonic() + 45
        while owned() != expected:
            assert time.monotonic() < deadline, f"assignment {owned()} != {expected}\n{cbroker.log()[-4000:]}"
            c.poll(0.05)

    try:
        c.subscribe(["^rx-.*"])
        wait_for([("rx-orders", 0), ("rx-orders", 1), ("rx-payments", 0)])
        create_topic(cbroker.bootstrap, "rx-refunds", 2)
        wait_for([("rx-orders", 0), ("rx-orders", 1), ("rx-payments", 0), ("rx-refunds", 0), ("rx-refunds", 1)])
        produce(cbroker.bootstrap, "rx-refunds", 1, 2)
        got = set()
        deadline = time.monotonic() + 30
        while len(got) < 2:
            assert time.monotonic() < deadline, f"records of the new topic not consumed: {got}"
            m = c.poll(0.1)
            if m is not None and m.error() is None:
                got.add((m.topic(), m.partition()))
        assert got == {("rx-refunds", 0), ("rx-refunds", 1)}
    finally:
        c.close()


# ----------------------------------------------------------------------------- raw wire


def heartbeat_body(group, member_id, epoch, topics=None, assignor=None, owned=None, instance_id=None,
                   regex=None, rebalance_timeout_ms=-1, version=1):
    """ConsumerGroupHeartbeat (flexible from v0)."""
    w = kw.Writer(True)
    w.string(group).string(member_id).i32(epoch).string(instance_id).string(None).i32(rebalance_timeout_ms)
    w.array(topics, lambda w, t: w.string(t))
    if version >= 1:
        w.string(regex)
    w.string(assignor)
    w.array(owned, lambda w, tp: (w.raw(tp[0].bytes), w.array(tp[1], lambda w, p: w.i32(p)), w.tags()))
    w.tags()
    return w.getvalue()


def consumer_heartbeat(conn, *args, version=1, **kwargs):
    """Returns (error, message, member_id, epoch, interval, assignment or None)."""
    r = conn.request(CONSUMER_GROUP_HEARTBEAT, version, heartbeat_body(*args, version=version, **kwargs))
    r.i32()
    error, message, member_id, epoch, interval = r.i16(), r.string(), r.string(), r.i32(), r.i32()
    present = r.i8()
    assignment = None
    if present >= 0:
        assignment = r.array(lambda r: (uuid.UUID(bytes=r._take(16)), r.array(lambda r: r.i32()), r.tags())[:2])
        r.tags()
    return error, message, member_id, epoch, interval, assignment


def offset_commit_v9(conn, group, member_id, epoch, topic):
    """OffsetCommit v9 (flexible); returns the one partition's error code."""
    w = kw.Writer(True)
    w.string(group).i32(epoch).string(member_id).string(None)
    w.array([topic], lambda w, t: (w.string(t), w.array([0], lambda w, p: (w.i32(p).i64(1).i32(-1).string(None),
                                                                          w.tags())), w.tags()))
    w.tags()
    r = conn.request(OFFSET_COMMIT, 9, w.getvalue())
    r.i32()
    topics = r.array(lambda r: (r.string(), r.array(lambda r: (r.i32(), r.i16(), r.tags())), r.tags()))
    return topics[0][1][0][1]


def test_consumer_group_heartbeat_refuses_bad_input(cbroker):
    topic = "cp-bad"
    create_topic(cbroker.bootstrap, topic, 3)
    member = str(uuid.uuid4())
    with kw.Conn.to(cbroker.bootstrap) as conn:
        # Join, then heartbeat with our epoch: accepted, the assignment comes with topic ids.
        error, _, got_id, epoch, interval, assignment = consumer_heartbeat(
            conn, "cp-g", member, 0, topics=[topic], owned=[], rebalance_timeout_ms=30000)
        assert (error, got_id, interval) == (0, member, HEARTBEAT_MS) and epoch >= 1
        assert [sorted(ps) for _, ps in assignment] == [[0, 1, 2]]
        topic_id = assignment[0][0]
        owned = [(topic_id, [0, 1, 2])]
        assert consumer_heartbeat(conn, "cp-g", member, epoch, owned=owned)[0] == 0
        # A wrong epoch is fenced, an unknown member is unknown.
        error, message = consumer_heartbeat(conn, "cp-g", member, epoch + 1, owned=owned)[:2]
        assert error == FENCED_MEMBER_EPOCH and "epoch" in message
        assert consumer_heartbeat(conn, "cp-g", "someone-else", 1)[0] == UNKNOWN_MEMBER_ID
        # Joining with an assignor the broker lacks, an invalid regex, or without a subscription.
        error, message = consumer_heartbeat(conn, "cp-g", str(uuid.uuid4()), 0, topics=[topic], assignor="sticky",
                                            owned=[], rebalance_timeout_ms=30000)[:2]
        assert error == UNSUPPORTED_ASSIGNOR and "uniform" in message
        error, message = consumer_heartbeat(conn, "cp-g", str(uuid.uuid4()), 0, regex="cp-(", owned=[],
                                            rebalance_timeout_ms=30000)[:2]
        assert error == INVALID_REGULAR_EXPRESSION and "Regex" in message
        assert consumer_heartbeat(conn, "cp-g", str(uuid.uuid4()), 0, owned=[], rebalance_timeout_ms=30000)[0] \
            == INVALID_REQUEST
        assert consumer_heartbeat(conn, "cp-g", "", 0, topics=[topic], owned=[], rebalance_timeout_ms=30000)[0] \
            == INVALID_REQUEST, "v1 needs a client-chosen member id"
        # v0: the broker names the member.
        error, _, named, *_ = consumer_heartbeat(conn, "cp-g0", "", 0, topics=[topic], owned=[],
                                                 rebalance_timeout_ms=30000, version=0)
        assert error == 0 and named
        # OffsetCommit v9: the member's epoch is current or stale.
        assert offset_commit_v9(conn, "cp-g", member, epoch, topic) == 0
        assert offset_commit_v9(conn, "cp-g", member, epoch - 1, topic) == STALE_MEMBER_EPOCH
        assert offset_commit_v9(conn, "cp-g", "nobody", epoch, topic) == UNKNOWN_MEMBER_ID
        # A classic JoinGroup cannot take over a live consumer-protocol group.
        w = kw.Writer()
        w.string("cp-g").i32(10000).i32(10000).string("").string(None).string("consumer")
        w.array([("range", b"meta")], lambda w, p: w.string(p[0]).bytes_(p[1]))
        r = conn.request(JOIN_GROUP, 5, w.getvalue())
        r.i32()
        assert r.i16() == INCONSISTENT_GROUP_PROTOCOL
        # Leave: the group is then empty and may become a classic group.
        error, _, _, left_epoch, *_ = consumer_heartbeat(conn, "cp-g", member, -1)
        assert (error, left_epoch) == (0, -1)
        assert consumer_heartbeat(conn, "cp-g", member, epoch, owned=owned)[0] == UNKNOWN_MEMBER_ID
    assert cbroker.is_running()


def test_a_live_classic_group_is_not_a_consumer_group(cbroker):
    """Kafka's rule: a consumer-protocol member cannot join a classic group that has members
    (GROUP_ID_NOT_FOUND); ConsumerGroupDescribe of that group says so too; DescribeGroups
    shows the classic member's host as /127.0.0.1."""
    topic = "cp-mixed"
    create_topic(cbroker.bootstrap, topic, 2)
    classic = Consumer({"bootstrap.servers": cbroker.bootstrap, "group.id": "cp-mixed", "broker.address.family": "v4",
                        "session.timeout.ms": 6000})
    classic.subscribe([topic])
    try:
        deadline = time.monotonic() + 30
        while len(classic.assignment()) != 2:
            assert time.monotonic() < deadline
            classic.poll(0.05)
        with kw.Conn.to(cbroker.bootstrap) as conn:
            error, message = consumer_heartbeat(conn, "cp-mixed", str(uuid.uuid4()), 0, topics=[topic], owned=[],
                                                rebalance_timeout_ms=30000)[:2]
            assert error == GROUP_ID_NOT_FOUND and "not a consumer group" in message
            w = kw.Writer(True)
            w.array(["cp-mixed"], lambda w, g: w.string(g)).boolean(False).tags()
            r = conn.request(CONSUMER_GROUP_DESCRIBE, 0, w.getvalue())
            r.flexible = True
            r.i32()
            r.uvarint()  # groups array length + 1
            assert r.i16() == GROUP_ID_NOT_FOUND
        admin = AdminClient({"bootstrap.servers": cbroker.bootstrap})
        described = admin.describe_consumer_groups(["cp-mixed"])["cp-mixed"].result(10)
        assert [m.host for m in described.members] == ["/127.0.0.1"], described.members
    finally:
        classic.close()



#: Server-side patterns and what each shows about Kafka's resolution ({p}: this run's prefix).
REGEX_CASES = [
    "{p}-orders.*",  # a prefix: whole names only, so x-{p}-orders does not match
    ".*{p}-orders.*",  # the same topics and the one with a prefix
    "__consumer_offsets",  # an internal topic by its name
    "__consumer_off.*|{p}-pay.*",  # internal and ordinary topics in one pattern
]


#: COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR.
COORDINATOR_NOT_READY = (14, 15, 16)


def resolved_topics(bootstrap: str, pattern: str) -> set[str]:
    """The topics a lone consumer-protocol member subscribed by `pattern` is assigned."""
    group, member = f"rx-{uuid.uuid4().hex[:8]}", str(uuid.uuid4())
    with kw.Conn.to(bootstrap) as conn:
        deadline = time.monotonic() + 30
        # FindCoordinator creates the offsets topic where it does not exist yet (Kafka).
        while conn.find_coordinator(group)[0] != 0 or "__consumer_offsets" not in conn.metadata_detail(None).topics:
            assert time.monotonic() < deadline, f"{bootstrap}: no group coordinator"
            time.sleep(0.2)
        names = {t.topic_id: name for name, t in conn.metadata_detail(None, version=12).topics.items()}
        epoch, topics = 0, set()
        # Kafka resolves a new pattern in the background: the assignment comes a beat later.
        while not topics and time.monotonic() < deadline:
            error, message, _, next_epoch, _, assignment = consumer_heartbeat(
                conn, group, member, epoch, regex=pattern if epoch == 0 else None, owned=[] if epoch == 0 else None,
                rebalance_timeout_ms=30000)
            if error in COORDINATOR_NOT_READY:  # the offsets topic was just created (Kafka)
                time.sleep(0.3)
                continue
            assert error == 0, (bootstrap, pattern, error, message)
            epoch = next_epoch
            topics = {names.get(topic_id.bytes, str(topic_id)) for topic_id, _ in assignment or []}
            time.sleep(0.0 if topics else 0.3)
        consumer_heartbeat(conn, group, member, -1)
    return topics


def test_patterns_resolve_to_the_same_topics_as_on_kafka(cbroker, kafka_peer):
    """KIP-848 server-side patterns give the same assignment on Sluice as on Kafka 4.3.1,
    run side by side: whole-name matching, and internal topics such as `__consumer_offsets`
    matched like any other (Kafka resolves a pattern over every topic it has)."""
    prefix = f"rx{uuid.uuid4().hex[:6]}"
    for bootstrap in (cbroker.bootstrap, kafka_peer):
        for topic in (f"{prefix}-orders", f"{prefix}-orders-eu", f"x-{prefix}-orders", f"{prefix}-payments"):
            create_topic(bootstrap, topic, 1)
    for case in REGEX_CASES:
        pattern = case.format(p=prefix)
        on_kafka = resolved_topics(kafka_peer, pattern)
        on_sluice = resolved_topics(cbroker.bootstrap, pattern)
        assert on_sluice == on_kafka, f"{pattern}: Sluice assigns {sorted(on_sluice)}, Kafka {sorted(on_kafka)}"
        assert on_kafka, f"{pattern} matched nothing on Kafka"
