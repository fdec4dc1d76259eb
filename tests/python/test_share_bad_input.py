"""Bad share-group input on the wire (tests/python/kafka_wire.py): ShareGroupHeartbeat,
ShareFetch and ShareAcknowledge v1 requests that Kafka refuses, each answered with Kafka 4.3.1's
error code, and each leaving the group as it was: after them, valid members still hold,
acknowledge and receive exactly the records they should, with unchanged delivery counts.

* Heartbeats: an unknown member (UNKNOWN_MEMBER_ID), a stale or future member epoch
  (FENCED_MEMBER_EPOCH), an empty member id or a first heartbeat without topics
  (INVALID_REQUEST), a member that left (UNKNOWN_MEMBER_ID).
* Share sessions: a member without a session (SHARE_SESSION_NOT_FOUND, also for a final
  request carrying acknowledgements, which are not applied), a wrong or replayed session
  epoch, ShareAcknowledge with epoch 0 (INVALID_SHARE_SESSION_EPOCH; the epoch does not
  move), acknowledgements in a session-opening ShareFetch or an empty member id
  (INVALID_REQUEST).
* Acknowledgements (per partition; the session epoch moves on, as in Kafka): records another
  member holds (INVALID_RECORD_STATE), offsets never handed out, reversed or overlapping
  ranges, a wrong number of types, an unknown type (INVALID_REQUEST), an unknown partition
  or topic id; a batch that is partly wrong changes nothing (all or nothing).
* v2 (Kafka 4.2+): `record_limit` acquisition, RENEW only where the request announces it
  (IsRenewAck), a renewing ShareFetch that also asks for records (INVALID_REQUEST).

Every test runs twice, against Sluice and against Kafka 4.3.1 started beside it
(`peer_support.py`): the assertions are Kafka's behaviour.
"""

from __future__ import annotations

import base64
import time
import uuid

import pytest

import kafka_wire as kw
from peer_support import kafka_peer  # noqa: F401  (fixture)
from kafka_wire import ACCEPT, REJECT, RELEASE, Conn, Record, record_batch

NOT_LEADER_OR_FOLLOWER, NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS, UNKNOWN_TOPIC_ID = 6, 16, 14, 100


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def member_id() -> str:
    """A member id as Kafka's clients make them: a random UUID, base64url without padding."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


@pytest.fixture(params=["sluice", "kafka"])
def bootstrap(request):
    """Each test runs against Sluice and against Kafka 4.3.1 (`peer_support.kafka_peer`):
    the same requests get the same answers from both."""
    if request.param == "kafka":
        yield request.getfixturevalue("kafka_peer")
        return
    broker = request.getfixturevalue("broker")
    yield broker.bootstrap
    assert broker.is_running(), f"broker exited; log:\n{broker.log()[-3000:]}"
    assert "panicked" not in broker.log(), "broker log shows a panic"


def topic_with_records(conn: Conn, count: int) -> tuple[str, bytes]:
    """A new one-partition topic holding `count` records (offsets 0..count-1); its name and id."""
    topic = new_topic(conn, unique("share-bad"))
    for i in range(count):
        assert produce_once_led(conn, topic, record_batch([Record(key=b"k%d" % i, value=b"v%d" % i)])) == i
    return topic, conn.topic_id(topic)


def new_topic(conn: Conn, topic: str) -> str:
    """Creates a one-partition topic and waits until metadata shows its leader."""
    assert conn.create_topics([(topic, 1, 1, {})])[topic][0] == kw.NONE
    deadline = time.monotonic() + 10
    while conn.metadata([topic])[topic] != (kw.NONE, [0]):
        assert time.monotonic() < deadline, "topic never appeared"
        time.sleep(0.1)
    return topic


def produce_once_led(conn: Conn, topic: str, records: bytes) -> int:
    """Produces to partition 0 and returns the base offset. A new topic's leader may answer
    NOT_LEADER_OR_FOLLOWER for a moment after metadata names it (Kafka does); a client retries
    that, and so does this helper, for up to 10 s."""
    deadline = time.monotonic() + 10
    while True:
        error, base_offset = conn.produce(topic, 0, records)[:2]
        if error != NOT_LEADER_OR_FOLLOWER or time.monotonic() > deadline:
            assert error == kw.NONE, error
            return base_offset
        time.sleep(0.1)


def new_group(conn: Conn) -> str:
    group = unique("share-bad-group")
    assert conn.set_group_configs(group, {"share.auto.offset.reset": "earliest"}) == (kw.NONE, None)
    return group


def join(conn: Conn, group: str, member: str, topic: str, topic_id: bytes) -> int:
    """Joins and heartbeats until the member is assigned partition 0; returns its epoch."""
    deadline = time.monotonic() + 30
    epoch = 0
    while True:
        answer = conn.share_heartbeat(group, member, epoch, [topic] if epoch == 0 else None)
        if answer.error in (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS):
            conn.find_coordinator(group)
        else:
            assert answer.error == kw.NONE, answer
            epoch = answer.member_epoch
            if answer.assignment and answer.assignment.get(topic_id) is not None:
                return epoch
        assert time.monotonic() < deadline, f"{member} never assigned {topic}: {answer}"
        time.sleep(0.2)


class Session:
    """A member's share session: tracks the session epoch as a client does (it moves on with
    every request the broker accepts, even when a partition answers an error)."""

    def __init__(self, conn: Conn, group: str, member: str, topic_id: bytes):
        self.conn, self.group, self.member, self.topic_id = conn, group, member, topic_id
        self.epoch = 0

    def fetch(self, max_records: int, acks=None, max_wait_ms: int = 2000) -> kw.ShareFetchAnswer:
        answer = self.conn.share_fetch(self.group, self.member, self.epoch, {self.topic_id: {0: acks or []}},
                                       max_wait_ms=max_wait_ms, max_records=max_records)
        if answer.error == kw.NONE:
            self.epoch += 1
        return answer

    def acquire(self, max_records: int) -> list[tuple[int, int, int]]:
        """Fetches until records are acquired: [(first, last, delivery count)]."""
        deadline = time.monotonic() + 15
        while True:
            answer = self.fetch(max_records)
            assert answer.error == kw.NONE, answer
            part = answer.partitions.get((self.topic_id, 0))
            if part is not None and part.acquired:
                assert part.error == kw.NONE, answer
                return part.acquired
            assert time.monotonic() < deadline, f"nothing acquired: {answer}"

    def ack(self, batches, partition: int = 0, topic_id: bytes | None = None) -> int:
        """ShareAcknowledge of one partition; returns that partition's error code."""
        topic_id = topic_id or self.topic_id
        error, partitions = self.conn.share_acknowledge(self.group, self.member, self.epoch,
                                                        {topic_id: {partition: batches}})
        assert error == kw.NONE, (error, partitions)
        self.epoch += 1
        return partitions[(topic_id, partition)]


def test_bad_heartbeats_leave_the_group_unchanged(bootstrap):
    with Conn.to(bootstrap) as conn:
        topic, topic_id = topic_with_records(conn, 1)
        group, m = new_group(conn), member_id()
        epoch = join(conn, group, m, topic, topic_id)

        assert conn.share_heartbeat(group, member_id(), 5).error == kw.UNKNOWN_MEMBER_ID
        assert conn.share_heartbeat(group, m, epoch + 5).error == kw.FENCED_MEMBER_EPOCH
        assert conn.share_heartbeat(group, "", 0, [topic]).error == kw.INVALID_REQUEST
        assert conn.share_heartbeat(group, member_id(), 0, None).error == kw.INVALID_REQUEST, "a join names topics"

        # Nobody joined, nothing moved: the member keeps its epoch and its assignment.
        answer = conn.share_heartbeat(group, m, epoch)
        assert (answer.error, answer.member_epoch) == (kw.NONE, epoch), answer
        assert answer.assignment in (None, {topic_id: [0]}), answer

        leaver = member_id()
        leaver_epoch = join(conn, group, leaver, topic, topic_id)
        assert conn.share_heartbeat(group, leaver, -1).error == kw.NONE
        assert conn.share_heartbeat(group, leaver, leaver_epoch).error == kw.UNKNOWN_MEMBER_ID


def test_bad_share_sessions_are_refused_and_change_nothing(bootstrap):
    with Conn.to(bootstrap) as conn:
        topic, topic_id = topic_with_records(conn, 10)
        group, m = new_group(conn), member_id()
        join(conn, group, m, topic, topic_id)
        session = Session(conn, group, m, topic_id)
        everything = {topic_id: {0: [(0, 9, [ACCEPT])]}}

        # A member without a session: no request but a session-opening ShareFetch is served,
        # and a final request's acknowledgements are not applied.
        ghost = member_id()
        answer = conn.share_fetch(group, ghost, 3, {topic_id: {0: []}})
        assert (answer.error, answer.partitions) == (kw.SHARE_SESSION_NOT_FOUND, {}), answer
        assert conn.share_acknowledge(group, ghost, 1, everything) == (kw.SHARE_SESSION_NOT_FOUND, {})
        assert conn.share_acknowledge(group, ghost, -1, everything) == (kw.SHARE_SESSION_NOT_FOUND, {})
        answer = conn.share_fetch(group, ghost, -1, everything)
        assert (answer.error, answer.partitions) == (kw.SHARE_SESSION_NOT_FOUND, {}), answer
        assert conn.share_acknowledge(group, ghost, 0, everything) == (kw.INVALID_SHARE_SESSION_EPOCH, {})
        assert conn.share_fetch(group, m, 0, everything).error == kw.INVALID_REQUEST, "acknowledging while opening"
        assert conn.share_fetch(group, "", 0, {topic_id: {0: []}}).error == kw.INVALID_REQUEST

        assert session.acquire(5) == [(0, 4, 1)]
        assert conn.share_fetch(group, m, session.epoch + 6, {}).error == kw.INVALID_SHARE_SESSION_EPOCH
        assert conn.share_acknowledge(group, m, 0, everything)[0] == kw.INVALID_SHARE_SESSION_EPOCH
        assert conn.share_acknowledge(group, m, session.epoch + 1, everything)[0] == kw.INVALID_SHARE_SESSION_EPOCH
        # The refused epochs did not move the session: its next epoch still works, once.
        assert session.ack([(0, 4, [ACCEPT])]) == kw.NONE
        assert conn.share_acknowledge(group, m, session.epoch - 1, everything)[0] == kw.INVALID_SHARE_SESSION_EPOCH

        # The member gets exactly the rest, first delivery; closing ends the session.
        assert session.acquire(100) == [(5, 9, 1)]
        assert conn.share_acknowledge(group, m, -1, {topic_id: {0: [(5, 9, [ACCEPT])]}}) == \
            (kw.NONE, {(topic_id, 0): kw.NONE})
        assert conn.share_acknowledge(group, m, -1, {})[0] == kw.SHARE_SESSION_NOT_FOUND
        other = Session(conn, group, member_id(), topic_id)
        answer = other.fetch(100, max_wait_ms=300)
        part = answer.partitions.get((topic_id, 0))
        assert answer.error == kw.NONE and (part is None or not part.acquired), f"all ten were accepted: {answer}"


def test_bad_acknowledgements_are_refused_per_partition_and_change_nothing(bootstrap):
    with Conn.to(bootstrap) as conn:
        topic, topic_id = topic_with_records(conn, 7)
        group, m, m2 = new_group(conn), member_id(), member_id()
        join(conn, group, m, topic, topic_id)
        join(conn, group, m2, topic, topic_id)
        a, b = Session(conn, group, m, topic_id), Session(conn, group, m2, topic_id)
        assert a.acquire(5) == [(0, 4, 1)]
        assert b.acquire(5) == [(5, 6, 1)]

        # Records m does not hold.
        assert a.ack([(5, 6, [ACCEPT])]) == kw.INVALID_RECORD_STATE, "m2's records"
        assert a.ack([(3, 6, [ACCEPT])]) == kw.INVALID_RECORD_STATE, "partly m2's"
        assert a.ack([(0, 1, [ACCEPT]), (5, 5, [REJECT])]) == kw.INVALID_RECORD_STATE, "one batch of two wrong"
        assert a.ack([(7, 8, [ACCEPT])]) == kw.INVALID_REQUEST, "never handed out"
        # Malformed batches.
        assert a.ack([(3, 1, [ACCEPT])]) == kw.INVALID_REQUEST, "reversed"
        assert a.ack([(0, 2, [ACCEPT, ACCEPT])]) == kw.INVALID_REQUEST, "neither one type nor one per offset"
        assert a.ack([(0, 2, [ACCEPT]), (1, 3, [ACCEPT])]) == kw.INVALID_REQUEST, "overlapping"
        assert a.ack([(0, 2, [])]) == kw.INVALID_REQUEST, "no type"
        assert a.ack([(0, 0, [9])]) == kw.INVALID_REQUEST, "unknown type"
        # Unknown partitions.
        assert a.ack([(0, 0, [ACCEPT])], partition=7) == kw.UNKNOWN_TOPIC_OR_PARTITION
        assert a.ack([(0, 0, [ACCEPT])], topic_id=uuid.uuid4().bytes) == UNKNOWN_TOPIC_ID
        # The same refusal piggybacked on a ShareFetch: the fetch itself is served.
        answer = a.fetch(5, acks=[(5, 5, [ACCEPT])], max_wait_ms=300)
        assert answer.error == kw.NONE, answer
        part = answer.partitions[(topic_id, 0)]
        assert (part.error, part.acknowledge_error, part.acquired) == (kw.NONE, kw.INVALID_RECORD_STATE, []), answer

        # Nothing changed: m still holds 0-4 and releases them; a third member gets exactly
        # those, on their second delivery; m2 still holds 5-6 and accepts them.
        assert a.ack([(0, 4, [RELEASE])]) == kw.NONE
        c = Session(conn, group, member_id(), topic_id)
        assert c.acquire(100) == [(0, 4, 2)]
        assert b.ack([(5, 6, [ACCEPT])]) == kw.NONE
        assert c.ack([(0, 4, [ACCEPT])]) == kw.NONE


RENEW = 4  # KIP-1222's acknowledgement type (ShareFetch and ShareAcknowledge v2)
BATCH_OPTIMIZED, RECORD_LIMIT = 0, 1  # KIP-1206's ShareAcquireMode


def test_v2_record_limit_and_renewals_on_the_wire(bootstrap):
    """ShareFetch and ShareAcknowledge v2 (Kafka 4.2+): `record_limit` acquires exactly
    MaxRecords of a larger batch; RENEW keeps records with their member, only in a request
    that announces it (IsRenewAck), and a renewing ShareFetch must ask for nothing to fetch."""
    with Conn.to(bootstrap) as conn:
        _, versions = conn.api_versions(3)
        assert versions[kw.SHARE_FETCH][1] >= 2 and versions[kw.SHARE_ACKNOWLEDGE][1] >= 2, versions
        topic = new_topic(conn, unique("share-v2"))
        five = record_batch([Record(key=b"k%d" % i, value=b"v%d" % i) for i in range(5)])
        assert produce_once_led(conn, topic, five) == 0
        topic_id = conn.topic_id(topic)
        group, m = new_group(conn), member_id()
        join(conn, group, m, topic, topic_id)

        def fetch(epoch, acks=None, max_records=2, v2=(RECORD_LIMIT, False), max_wait_ms=2000):
            return conn.share_fetch(group, m, epoch, {topic_id: {0: acks or []}}, max_wait_ms=max_wait_ms,
                                    max_records=max_records, max_bytes=0 if v2[1] else 1 << 20, v2=v2)

        answer = fetch(0)
        assert answer.error == kw.NONE, answer
        assert answer.partitions[(topic_id, 0)].acquired == [(0, 1, 1)], "record_limit splits the batch"
        assert fetch(1).partitions[(topic_id, 0)].acquired == [(2, 3, 1)]
        epoch = 2

        # RENEW in a v1 request, or in a v2 one that does not announce it: refused, nothing moves.
        assert conn.share_acknowledge(group, m, epoch, {topic_id: {0: [(0, 1, [RENEW])]}}) == \
            (kw.NONE, {(topic_id, 0): kw.INVALID_REQUEST})
        epoch += 1
        assert conn.share_acknowledge(group, m, epoch, {topic_id: {0: [(0, 1, [RENEW])]}}, renew=False) == \
            (kw.NONE, {(topic_id, 0): kw.INVALID_REQUEST})
        epoch += 1
        # Announced: renewed, and the answer says for how long (the group's lock duration).
        assert conn.share_acknowledge(group, m, epoch, {topic_id: {0: [(0, 1, [RENEW])]}}, renew=True) == \
            (kw.NONE, {(topic_id, 0): kw.NONE})
        assert conn.last_lock_timeout_ms > 0
        epoch += 1
        # A renewing ShareFetch that also asks for records is refused as a whole.
        assert fetch(epoch, acks=[(2, 3, [RENEW])], max_records=5, v2=(RECORD_LIMIT, True)).error == \
            kw.INVALID_REQUEST
        answer = fetch(epoch, acks=[(2, 3, [RENEW])], max_records=0, v2=(RECORD_LIMIT, True), max_wait_ms=0)
        assert answer.error == kw.NONE, answer
        part = answer.partitions[(topic_id, 0)]
        assert (part.acknowledge_error, part.acquired) == (kw.NONE, []), "a renewal fetches nothing"
        epoch += 1

        # The renewed records are still the member's to accept; batch_optimized takes the rest.
        assert conn.share_acknowledge(group, m, epoch, {topic_id: {0: [(0, 3, [ACCEPT])]}}, renew=False) == \
            (kw.NONE, {(topic_id, 0): kw.NONE})
        epoch += 1
        assert fetch(epoch, max_records=1, v2=(BATCH_OPTIMIZED, False)).partitions[(topic_id, 0)].acquired == \
            [(4, 4, 1)]


def test_share_group_configs_are_validated_and_applied(bootstrap, request):
    """The share-group configs Kafka 4.3 documents: out-of-range values are refused with
    INVALID_CONFIG and change nothing; a group's heartbeat interval reaches its members."""
    with Conn.to(bootstrap) as conn:
        topic, topic_id = topic_with_records(conn, 1)
        group = new_group(conn)
        for name, value in [("share.heartbeat.interval.ms", "1000"), ("share.session.timeout.ms", "5000"),
                            ("share.renew.acknowledge.enable", "maybe"), ("share.isolation.level", "dirty")]:
            error, message = conn.set_group_configs(group, {name: value})
            assert error == kw.INVALID_CONFIG and message, (name, value, error, message)
        if request.node.callspec.params["bootstrap"] == "sluice":
            # Share groups read up to the high watermark: read_committed is refused, not ignored
            # (Kafka serves it).
            error, message = conn.set_group_configs(group, {"share.isolation.level": "read_committed"})
            assert error == kw.INVALID_CONFIG and "read_committed" in message, message
        settings = {"share.heartbeat.interval.ms": "6000", "share.session.timeout.ms": "50000",
                    "share.renew.acknowledge.enable": "false", "share.isolation.level": "read_uncommitted"}
        assert conn.set_group_configs(group, settings) == (kw.NONE, None)
        m = member_id()
        epoch = join(conn, group, m, topic, topic_id)
        assert conn.share_heartbeat(group, m, epoch).heartbeat_interval_ms == 6000
        # Renewals are off for this group: a RENEW is refused, the record stays the member's.
        session = Session(conn, group, m, topic_id)
        assert session.acquire(1) == [(0, 0, 1)]
        renew = {topic_id: {0: [(0, 0, [RENEW])]}}
        assert conn.share_acknowledge(group, m, session.epoch, renew, renew=True) == \
            (kw.NONE, {(topic_id, 0): kw.INVALID_RECORD_STATE})
        session.epoch += 1
        assert session.ack([(0, 0, [ACCEPT])]) == kw.NONE
