"""Kafka's authorization rules against a real `sluice serve` with the standard authorizer
and `allow.everyone.if.no.acl.found=false`, as a client of each API would see them.

The broker has a PLAINTEXT listener, the inter-broker one, whose anonymous principal is
*not* a super user (so it is a principal with no ACLs, and shows that reaching the
inter-broker listener grants nothing), and a SASL_PLAINTEXT listener for `admin` (a super
user) and users with ACLs. Requests clients cannot send are built by hand (kafka_wire.py),
over either listener (SASL/PLAIN on a raw connection).
"""

import json
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

import kafka_wire as kw
from conftest import free_port
from test_security import public_jwk, signed_jwt

AUTHORIZER = "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer"
INTER_BROKER_USER = "sluice-inter-broker"

# Kafka error codes a client sees.
NONE = 0
TOPIC_AUTHORIZATION_FAILED = 29
GROUP_AUTHORIZATION_FAILED = 30
CLUSTER_AUTHORIZATION_FAILED = 31
ILLEGAL_SASL_STATE = 34
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
SASL_AUTHENTICATION_FAILED = 58
UNACCEPTABLE_CREDENTIAL = 93

# API keys kafka_wire does not name.
OFFSET_COMMIT, OFFSET_FETCH, JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 8, 9, 11, 12, 13, 14
DESCRIBE_GROUPS, LIST_GROUPS, SASL_HANDSHAKE, DELETE_RECORDS = 15, 16, 17, 21
ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN, WRITE_TXN_MARKERS, TXN_OFFSET_COMMIT = 24, 25, 26, 27, 28
DESCRIBE_ACLS, CREATE_ACLS, DELETE_ACLS, DESCRIBE_CONFIGS, ALTER_CONFIGS = 29, 30, 31, 32, 33
DESCRIBE_LOG_DIRS, SASL_AUTHENTICATE, CREATE_PARTITIONS, DELETE_GROUPS = 35, 36, 37, 42
OFFSET_DELETE, DESCRIBE_CLIENT_QUOTAS, ALTER_CLIENT_QUOTAS = 47, 48, 49
DESCRIBE_USER_SCRAM, ALTER_USER_SCRAM, DESCRIBE_CLUSTER, DESCRIBE_PRODUCERS = 50, 51, 60, 61
DESCRIBE_TRANSACTIONS, LIST_TRANSACTIONS, CONSUMER_GROUP_HEARTBEAT, CONSUMER_GROUP_DESCRIBE = 65, 66, 68, 69
SHARE_GROUP_DESCRIBE = 77
INITIALIZE_SHARE_STATE, READ_SHARE_STATE, WRITE_SHARE_STATE, DELETE_SHARE_STATE, READ_SHARE_SUMMARY = 83, 84, 85, 86, 87
DESCRIBE_SHARE_OFFSETS, ALTER_SHARE_OFFSETS, DELETE_SHARE_OFFSETS = 90, 91, 92
DESCRIBE_QUORUM, ADD_RAFT_VOTER, REMOVE_RAFT_VOTER = 55, 80, 81
ENVELOPE = 58

kw.FLEXIBLE_FROM.update({
    WRITE_TXN_MARKERS: 1, DESCRIBE_LOG_DIRS: 2, SASL_AUTHENTICATE: 2, DESCRIBE_USER_SCRAM: 0, ALTER_USER_SCRAM: 0,
    DESCRIBE_CLUSTER: 0, DESCRIBE_PRODUCERS: 0, DESCRIBE_TRANSACTIONS: 0, LIST_TRANSACTIONS: 0,
    CONSUMER_GROUP_HEARTBEAT: 0, CONSUMER_GROUP_DESCRIBE: 0, SHARE_GROUP_DESCRIBE: 0, INITIALIZE_SHARE_STATE: 0,
    READ_SHARE_STATE: 0, WRITE_SHARE_STATE: 0, DELETE_SHARE_STATE: 0, READ_SHARE_SUMMARY: 0,
    DESCRIBE_SHARE_OFFSETS: 0, ALTER_SHARE_OFFSETS: 0, DELETE_SHARE_OFFSETS: 0,
    kw.FIND_COORDINATOR: 3, DESCRIBE_ACLS: 2, CREATE_ACLS: 2, DELETE_ACLS: 2,
    DESCRIBE_QUORUM: 0, ADD_RAFT_VOTER: 0, REMOVE_RAFT_VOTER: 0, ENVELOPE: 0,
})

TOPIC = "orders"
SECRETS = "secrets"


class Secured:
    def __init__(self, broker, sasl_port: int):
        self.broker = broker
        self.sasl_port = sasl_port
        self.sasl_bootstrap = f"127.0.0.1:{sasl_port}"
        self._admin: AdminClient | None = None

    def conf(self, user: str, **extra) -> dict:
        conf = {"bootstrap.servers": self.sasl_bootstrap, "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": user, "sasl.password": f"{user}-secret",
                "broker.address.family": "v4"}
        conf.update(extra)
        return conf

    def admin(self) -> AdminClient:
        """The super user's client (kept: a dropped client fails its pending requests)."""
        if self._admin is None:
            self._admin = AdminClient(self.conf("admin"))
        return self._admin

    def anonymous(self) -> kw.Conn:
        """A raw connection on the PLAINTEXT (inter-broker) listener: User:ANONYMOUS."""
        return kw.Conn.to(self.broker.bootstrap)

    def as_user(self, user: str) -> kw.Conn:
        """A raw connection authenticated with SASL/PLAIN as `user`."""
        conn = kw.Conn.to(self.sasl_bootstrap)
        error, message = sasl_plain(conn, user, f"{user}-secret")
        assert error == NONE, message
        return conn

    def allow(self, principal: str, resource_type, name: str, *operations, prefixed: bool = False):
        pattern = ResourcePatternType.PREFIXED if prefixed else ResourcePatternType.LITERAL
        bindings = [AclBinding(resource_type, name, pattern, principal, "*", op, AclPermissionType.ALLOW)
                    for op in operations]
        for future in self.admin().create_acls(bindings).values():
            future.result(timeout=10)

    def end_offset(self, topic: str) -> int:
        consumer = Consumer(self.conf("admin", **{"group.id": "probe"}))
        try:
            return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)[1]
        finally:
            consumer.close()


def sasl_plain(conn: kw.Conn, user: str, password: str) -> tuple[int, str | None]:
    r = conn.request(SASL_HANDSHAKE, 1, kw.Writer(False).string("PLAIN").getvalue())
    assert r.i16() == NONE, "PLAIN is enabled"
    token = f"\0{user}\0{password}".encode()
    r = conn.request(SASL_AUTHENTICATE, 2, kw.Writer(True).bytes_(token).tags().getvalue())
    return r.i16(), r.string()


@pytest.fixture
def secured(broker_factory):
    plaintext, sasl = free_port(), free_port()
    common = [
        "--override", f"listeners=PLAINTEXT://127.0.0.1:{plaintext},SASL_PLAINTEXT://127.0.0.1:{sasl}",
        "--override", AUTHORIZER,
        "--override", "allow.everyone.if.no.acl.found=false",
        "--override", "sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256",
    ]
    # Users and topics are made while the anonymous principal is a super user, then the
    # broker restarts with `admin` as the only one.
    broker = broker_factory(extra_args=[*common, "--override", "super.users=User:ANONYMOUS"], port=plaintext)
    setup = AdminClient({"bootstrap.servers": broker.bootstrap, "broker.address.family": "v4"})
    upserts = [UserScramCredentialUpsertion(u, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096),
                                            f"{u}-secret".encode()) for u in ["admin", "alice", "bob"]]
    for future in setup.alter_user_scram_credentials(upserts).values():
        future.result(timeout=10)
    for future in setup.create_topics([NewTopic(TOPIC, 1), NewTopic(SECRETS, 1)]).values():
        future.result(timeout=10)
    kw.wait_for_topic(broker.bootstrap, TOPIC, 1)
    broker.stop()
    broker.extra_args = [*common, "--override", "super.users=User:admin"]
    broker.start()
    secured = Secured(broker, sasl)
    producer = Producer(secured.conf("admin"))
    for value in [b"one", b"two"]:
        producer.produce(TOPIC, value)
    assert producer.flush(20) == 0
    return secured


def topic_id(secured: Secured, topic: str) -> bytes:
    with secured.as_user("admin") as conn:
        return conn.topic_id(topic)


# ---------------------------------------------------------------- the reviewed attempts

def follower_fetch(conn: kw.Conn, topic: str) -> tuple[int, bytes]:
    """Fetch v11 as replica 1: (top-level error, records of partition 0)."""
    r = conn.request(kw.FETCH, 11, kw.fetch_body(11, topic, 0, 0, 1 << 20, 0, replica_id=1))
    r.i32()
    error, _session = r.i16(), r.i32()
    records = b""
    for _name, partitions in r.array(lambda rr: (rr.string(), rr.array(fetch_partition))):
        records += b"".join(p for p in partitions)
    return error, records


def fetch_partition(r: kw.Reader) -> bytes:
    r.i32(), r.i16(), r.i64(), r.i64(), r.i64()
    r.array(lambda x: (x.i64(), x.i64()))
    r.i32()
    return r.bytes_() or b""


def test_follower_fetch_needs_cluster_action_even_on_the_plaintext_inter_broker_listener(secured):
    with secured.anonymous() as conn:
        error, records = follower_fetch(conn, TOPIC)
    assert (error, records) == (CLUSTER_AUTHORIZATION_FAILED, b"")
    # CLUSTER_ACTION from an ACL is what makes a replica.
    secured.allow("User:ANONYMOUS", ResourceType.BROKER, "kafka-cluster", AclOperation.CLUSTER_ACTION)
    with secured.anonymous() as conn:
        error, records = follower_fetch(conn, TOPIC)
    assert error == NONE and b"two" in records


def describe_producers(conn: kw.Conn, topic: str) -> list[tuple[int, int]]:
    """DescribeProducers v0 for partition 0: [(producer id, epoch)] of its active producers."""
    w = kw.Writer(True).array([topic], lambda w, t: w.string(t).array([0], lambda w, p: w.i32(p)).tags()).tags()
    r = conn.request(DESCRIBE_PRODUCERS, 0, w.getvalue())
    r.i32()

    def producer(rr):
        pid, epoch = rr.i64(), rr.i32()
        rr.i32(), rr.i64(), rr.i32()
        transaction_start = rr.i64()
        rr.tags()
        return pid, epoch, transaction_start

    def partition(rr):
        rr.i32()
        assert rr.i16() == NONE
        rr.string()
        producers = rr.array(producer)
        rr.tags()
        return producers

    topics = r.array(lambda rr: (rr.string(), rr.array(partition), rr.tags())[1])
    active = [p for partitions in topics for producers in partitions for p in producers]
    return [(pid, epoch) for pid, epoch, transaction_start in active if transaction_start >= 0]


def write_txn_markers_body(producer_id: int, epoch: int, commit: bool, topic: str, partition: int = 0) -> bytes:
    w = kw.Writer(True)

    def marker(w, _):
        w.i64(producer_id).i16(epoch).boolean(commit)
        w.array([topic], lambda w, t: w.string(t).array([partition], lambda w, p: w.i32(p)).tags())
        w.i32(0).tags()

    return w.array([None], marker).tags().getvalue()


def write_txn_markers_errors(r: kw.Reader) -> list[int]:
    def topic(rr):
        rr.string()
        codes = rr.array(lambda x: (x.i32(), x.i16(), x.tags())[1])
        rr.tags()
        return codes

    markers = r.array(lambda rr: (rr.i64(), rr.array(topic), rr.tags())[1])
    return [code for topics in markers for codes in topics for code in codes]


def test_write_txn_markers_from_a_client_cannot_abort_another_users_transaction(secured):
    secured.allow("User:bob", ResourceType.TOPIC, TOPIC, AclOperation.WRITE, AclOperation.READ)
    secured.allow("User:bob", ResourceType.TRANSACTIONAL_ID, "bob-tx", AclOperation.WRITE)
    secured.allow("User:ANONYMOUS", ResourceType.TOPIC, TOPIC, AclOperation.READ, AclOperation.WRITE)
    victim = Producer(secured.conf("bob", **{"transactional.id": "bob-tx"}))
    victim.init_transactions(20)
    victim.begin_transaction()
    victim.produce(TOPIC, b"bob's")
    victim.flush(20)
    with secured.anonymous() as conn:
        ((producer_id, epoch),) = describe_producers(conn, TOPIC)
        r = conn.request(WRITE_TXN_MARKERS, 1, write_txn_markers_body(producer_id, epoch, False, TOPIC))
        assert write_txn_markers_errors(r) == [CLUSTER_AUTHORIZATION_FAILED]
    victim.commit_transaction(20)
    reader = Consumer(secured.conf("admin", **{"group.id": "committed-reader", "isolation.level": "read_committed",
                                               "auto.offset.reset": "earliest"}))
    reader.assign([TopicPartition(TOPIC, 0, 0)])
    seen, deadline = [], time.monotonic() + 20
    while b"bob's" not in seen and time.monotonic() < deadline:
        message = reader.poll(0.5)
        if message is not None and message.error() is None:
            seen.append(message.value())
    reader.close()
    assert b"bob's" in seen, f"the committed transaction is not visible: {seen}"


def share_group_describe(conn: kw.Conn, group: str) -> tuple[int, int]:
    """ShareGroupDescribe v1 of one group: (error code, number of members described)."""
    w = kw.Writer(True).array([group], lambda w, g: w.string(g)).boolean(False).tags()
    r = conn.request(SHARE_GROUP_DESCRIBE, 1, w.getvalue())
    r.i32()
    count = r.uvarint() - 1
    assert count == 1
    error, _message, _group, _state = r.i16(), r.string(), r.string(), r.string()
    r.i32(), r.i32(), r.string()
    members = r.uvarint() - 1
    return error, max(members, 0)


def join_share_group(secured: Secured, user: str, group: str, topic: str) -> tuple[kw.Conn, str, int]:
    conn = secured.as_user(user)
    member = str(uuid.uuid4())
    answer = conn.share_heartbeat(group, member, 0, [topic])
    assert answer.error == NONE, answer
    return conn, member, answer.member_epoch


def test_share_group_describe_needs_describe_on_the_group(secured):
    secured.allow("User:alice", ResourceType.GROUP, "queue", AclOperation.READ)
    secured.allow("User:alice", ResourceType.TOPIC, TOPIC, AclOperation.READ)
    member_conn, _, _ = join_share_group(secured, "alice", "queue", TOPIC)
    with member_conn, secured.as_user("alice") as alice:
        assert share_group_describe(alice, "queue") == (NONE, 1)
        with secured.anonymous() as stranger:
            assert share_group_describe(stranger, "queue") == (GROUP_AUTHORIZATION_FAILED, 0)


def test_a_dead_letter_topic_must_be_writable_by_who_names_it(secured):
    secured.allow("User:alice", ResourceType.GROUP, "dlq-queue", AclOperation.READ, AclOperation.ALTER_CONFIGS)
    secured.allow("User:alice", ResourceType.TOPIC, TOPIC, AclOperation.READ)
    with secured.as_user("alice") as alice:
        assert alice.set_group_configs("dlq-queue", {"share.auto.offset.reset": "earliest"})[0] == NONE
        error, _ = alice.set_group_configs("dlq-queue", {"errors.deadletterqueue.topic.name": SECRETS})
        assert error == TOPIC_AUTHORIZATION_FAILED
        # Rejecting records then puts nothing in the topic alice may not write.
        tid = alice.topic_id(TOPIC)
        member = str(uuid.uuid4())
        epoch = alice.share_heartbeat("dlq-queue", member, 0, [TOPIC]).member_epoch
        deadline = time.monotonic() + 20
        ranges = []
        while not ranges and time.monotonic() < deadline:
            epoch = alice.share_heartbeat("dlq-queue", member, epoch).member_epoch
            fetched = alice.share_fetch("dlq-queue", member, 0, {tid: {0: []}}, max_wait_ms=500)
            answer = fetched.partitions.get((tid, 0))
            ranges = answer.acquired if answer is not None else []
            if not ranges:
                alice.share_fetch("dlq-queue", member, -1, {})
        assert ranges, "alice acquired nothing"
        first_offset, last_offset, _ = ranges[0]
        rejected = {tid: {0: [(first_offset, last_offset, [kw.REJECT])]}}
        assert alice.share_acknowledge("dlq-queue", member, 1, rejected)[0] == NONE
    time.sleep(1.0)
    assert secured.end_offset(SECRETS) == 0, "rejected records were copied to a topic alice may not write"


def test_cluster_action_does_not_come_with_the_inter_broker_listener(secured):
    """ReadShareGroupState is broker-to-broker: refused to the anonymous principal of the
    PLAINTEXT inter-broker listener, as to any client without CLUSTER_ACTION."""
    tid = topic_id(secured, TOPIC)
    body = kw.Writer(True).string("queue").array(
        [tid], lambda w, t: w.raw(t).array([0], lambda w, p: w.i32(p).i32(0).tags()).tags()).tags().getvalue()
    with secured.anonymous() as conn:
        r = conn.request(READ_SHARE_STATE, 0, body)
    assert share_state_error(r) == CLUSTER_AUTHORIZATION_FAILED


def test_no_scram_credential_can_be_made_for_the_brokers_user(secured):
    upsert = UserScramCredentialUpsertion(INTER_BROKER_USER, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096),
                                          b"guess")
    future = secured.admin().alter_user_scram_credentials([upsert])[INTER_BROKER_USER]
    with pytest.raises(Exception) as refused:
        future.result(timeout=10)
    assert refused.value.args[0].code() == UNACCEPTABLE_CREDENTIAL


def test_plain_login_as_the_brokers_user_needs_the_clusters_secret(secured):
    with kw.Conn.to(secured.sasl_bootstrap) as conn:
        error, _ = sasl_plain(conn, INTER_BROKER_USER, "guess")
    assert error == SASL_AUTHENTICATION_FAILED


def test_an_oauthbearer_token_cannot_name_the_brokers_user(broker_factory, tmp_path):
    from cryptography.hazmat.primitives.asymmetric import rsa

    idp = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [public_jwk(idp, "k1")]}))
    port, sasl_port = free_port(), free_port()
    broker_factory(extra_args=[
        "--override", f"listeners=PLAINTEXT://127.0.0.1:{port},SASL_PLAINTEXT://127.0.0.1:{sasl_port}",
        "--override", "sasl.enabled.mechanisms=OAUTHBEARER",
        "--override", f"sasl.oauthbearer.jwks.endpoint.url=file://{jwks}",
        "--override", AUTHORIZER,
    ], port=port)
    now = int(time.time())

    def authenticate(sub: str) -> int:
        token = signed_jwt(idp, "k1", {"sub": sub, "iat": now, "exp": now + 3600})
        with kw.Conn.to(f"127.0.0.1:{sasl_port}") as conn:
            r = conn.request(SASL_HANDSHAKE, 1, kw.Writer(False).string("OAUTHBEARER").getvalue())
            assert r.i16() == NONE
            message = f"n,,\x01auth=Bearer {token}\x01\x01".encode()
            r = conn.request(SASL_AUTHENTICATE, 2, kw.Writer(True).bytes_(message).tags().getvalue())
            return r.i16()

    assert authenticate("alice") == NONE
    assert authenticate(INTER_BROKER_USER) == SASL_AUTHENTICATION_FAILED


# ---------------------------------------------------------------- transactional ids, share offsets, heartbeats

def find_coordinator(conn: kw.Conn, key: str, key_type: int, version: int) -> int:
    if version < 4:
        r = conn.request(kw.FIND_COORDINATOR, version, kw.Writer(version >= 3).string(key).i8(key_type).tags().getvalue())
        r.i32()
        return r.i16()
    w = kw.Writer(True).i8(key_type).array([key], lambda w, k: w.string(k)).tags()
    r = conn.request(kw.FIND_COORDINATOR, version, w.getvalue())
    r.i32()
    (error,) = r.array(lambda rr: (rr.string(), rr.i32(), rr.string(), rr.i32(), rr.i16(), rr.string(), rr.tags())[4])
    return error


def test_find_coordinator_of_a_transactional_id_needs_describe_on_it(secured):
    with secured.anonymous() as conn:
        assert find_coordinator(conn, "someone-tx", 1, 2) == TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        assert find_coordinator(conn, "someone-tx", 1, 4) == TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    secured.allow("User:ANONYMOUS", ResourceType.TRANSACTIONAL_ID, "someone-tx", AclOperation.DESCRIBE)
    with secured.anonymous() as conn:
        assert find_coordinator(conn, "someone-tx", 1, 2) == NONE


def transactional_produce_body(transactional_id: str, topic: str, records: bytes) -> bytes:
    w = kw.Writer(False).string(transactional_id).i16(-1).i32(10000)
    w.array([topic], lambda w, t: w.string(t).array([0], lambda w, p: w.i32(p).bytes_(records)))
    return w.getvalue()


def test_transactional_produce_needs_write_on_the_transactional_id(secured):
    secured.allow("User:ANONYMOUS", ResourceType.TOPIC, TOPIC, AclOperation.WRITE)
    batch = kw.record_batch([kw.Record(b"sneaky")], producer_id=1, producer_epoch=0, base_sequence=0,
                            attributes=0x10)
    before = secured.end_offset(TOPIC)
    with secured.anonymous() as conn:
        r = conn.request(kw.PRODUCE, 3, transactional_produce_body("someone-tx", TOPIC, batch))
        error = kw.parse_produce_response(r, 3)[0]
    assert error == TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert secured.end_offset(TOPIC) == before


def describe_share_offsets(conn: kw.Conn, group: str, topic: str) -> list[int]:
    w = kw.Writer(True).array([group], lambda w, g: w.string(g).array(
        [topic], lambda w, t: w.string(t).array([0], lambda w, p: w.i32(p)).tags()).tags()).tags()
    r = conn.request(DESCRIBE_SHARE_OFFSETS, 0, w.getvalue())
    r.i32()

    def partition(rr):
        rr.i32(), rr.i64(), rr.i32()
        code = rr.i16()
        rr.string(), rr.tags()
        return code

    def group_answer(rr):
        rr.string()
        topics = rr.array(lambda t: (t.string(), t._take(16), t.array(partition), t.tags())[2])
        rr.i16(), rr.string(), rr.tags()
        return [code for codes in topics for code in codes]

    return [code for codes in r.array(group_answer) for code in codes]


def alter_share_offsets(conn: kw.Conn, group: str, topic: str) -> list[int]:
    w = kw.Writer(True).string(group).array(
        [topic], lambda w, t: w.string(t).array([0], lambda w, p: w.i32(p).i64(0).tags()).tags()).tags()
    r = conn.request(ALTER_SHARE_OFFSETS, 0, w.getvalue())
    r.i32(), r.i16(), r.string()
    topics = r.array(lambda rr: (rr.string(), rr._take(16),
                                 rr.array(lambda p: (p.i32(), p.i16(), p.string(), p.tags())[1]), rr.tags())[2])
    return [code for codes in topics for code in codes]


def delete_share_offsets(conn: kw.Conn, group: str, topic: str) -> list[int]:
    w = kw.Writer(True).string(group).array([topic], lambda w, t: w.string(t).tags()).tags()
    r = conn.request(DELETE_SHARE_OFFSETS, 0, w.getvalue())
    r.i32(), r.i16(), r.string()
    return r.array(lambda rr: (rr.string(), rr._take(16), rr.i16(), rr.string(), rr.tags())[2])


def test_share_group_offsets_need_the_topic_too(secured):
    secured.allow("User:ANONYMOUS", ResourceType.GROUP, "offsets-queue", AclOperation.READ, AclOperation.DELETE)
    with secured.anonymous() as conn:
        assert describe_share_offsets(conn, "offsets-queue", TOPIC) == [TOPIC_AUTHORIZATION_FAILED]
        assert alter_share_offsets(conn, "offsets-queue", TOPIC) == [TOPIC_AUTHORIZATION_FAILED]
        assert delete_share_offsets(conn, "offsets-queue", TOPIC) == [TOPIC_AUTHORIZATION_FAILED]


def consumer_group_heartbeat_body(group: str, topics: list[str]) -> bytes:
    w = kw.Writer(True).string(group).string(str(uuid.uuid4())).i32(0).string(None).string(None).i32(30000)
    return w.array(topics, lambda w, t: w.string(t)).string(None).array([], None).tags().getvalue()


def test_heartbeats_need_describe_on_every_subscribed_topic(secured):
    secured.allow("User:ANONYMOUS", ResourceType.GROUP, "subscriber", AclOperation.READ)
    secured.allow("User:ANONYMOUS", ResourceType.TOPIC, TOPIC, AclOperation.READ)
    with secured.anonymous() as conn:
        answer = conn.share_heartbeat("subscriber", str(uuid.uuid4()), 0, [TOPIC, SECRETS])
        assert answer.error == TOPIC_AUTHORIZATION_FAILED, answer
        r = conn.request(CONSUMER_GROUP_HEARTBEAT, 0, consumer_group_heartbeat_body("subscriber", [TOPIC, SECRETS]))
        r.i32()
        assert r.i16() == TOPIC_AUTHORIZATION_FAILED
        assert conn.share_heartbeat("subscriber", str(uuid.uuid4()), 0, [TOPIC]).error == NONE


# ---------------------------------------------------------------- every API, no ACL

def w_(flexible: bool = False) -> kw.Writer:
    return kw.Writer(flexible)


def first(r: kw.Reader) -> None:
    """Enters the first element of an array (asserting there is one)."""
    count = r.uvarint() - 1 if r.flexible else r.i32()
    assert count >= 1, "empty answer"


def throttle_then_error(r: kw.Reader) -> int:
    r.i32()
    return r.i16()


def first_topic_first_partition_error(r: kw.Reader, throttle_first: bool = True) -> int:
    if throttle_first:
        r.i32()
    first(r)
    r.string()
    first(r)
    r.i32()
    return r.i16()


def list_groups_answer(r: kw.Reader) -> int:
    r.i32()
    error = r.i16()
    groups = r.array(lambda rr: (rr.string(), rr.string()))
    assert all(g != "g" for g, _ in groups)
    return error


def metadata_answer(r: kw.Reader) -> int:
    answer = kw.parse_metadata_response(r, 4)
    return answer.topics[TOPIC].error


def metadata_all_answer(r: kw.Reader) -> int:
    answer = kw.parse_metadata_response(r, 4)
    assert TOPIC not in answer.topics, "a topic the client may not describe is listed"
    return NONE


def list_transactions_answer(r: kw.Reader) -> int:
    r.i32()
    error = r.i16()
    r.array(lambda rr: rr.string())
    assert r.array(lambda rr: rr.string()) == [], "transactions the client may not describe are listed"
    return error


def first_result_error(r: kw.Reader) -> int:
    """throttle, then an array whose elements begin with their error code."""
    r.i32()
    first(r)
    return r.i16()


def share_state_error(r: kw.Reader) -> int:
    first(r)
    r._take(16)
    first(r)
    r.i32()
    return r.i16()


def share_offsets_group_error(r: kw.Reader) -> int:
    r.i32()
    first(r)
    r.string()
    r.array(lambda rr: None)
    return r.i16()


def every_api(tid: bytes):
    """(name, api key, version, request body, read the error the client sees, Kafka's answer)."""
    one_topic = lambda w, partition_fn: w.array([TOPIC], lambda w, t: (w.string(t), w.array([0], partition_fn)))  # noqa: E731
    acl_filter = lambda w: w.i8(1).string(None).i8(1).string(None).string(None).i8(1).i8(1)  # noqa: E731
    group_id_body = lambda v: w_(v).string("g")  # noqa: E731
    share_topics = lambda w, partition: w.array([tid], lambda w, t: w.raw(t).array([0], partition).tags())  # noqa: E731
    return [
        ("Produce", kw.PRODUCE, 3, kw.produce_body(3, TOPIC, 0, kw.record_batch([kw.Record(b"x")]), acks=1),
         lambda r: kw.parse_produce_response(r, 3)[0], TOPIC_AUTHORIZATION_FAILED),
        ("Fetch", kw.FETCH, 4, kw.fetch_body(4, TOPIC, 0, 0, 1 << 20, 0),
         lambda r: kw.parse_fetch_response(r, 4)[0], TOPIC_AUTHORIZATION_FAILED),
        ("ListOffsets", kw.LIST_OFFSETS, 1, kw.list_offsets_body(1, TOPIC, 0, -1),
         lambda r: kw.parse_list_offsets_response(r, 1)[0], TOPIC_AUTHORIZATION_FAILED),
        ("Metadata", kw.METADATA, 4, kw.metadata_body(4, [TOPIC], False), metadata_answer, TOPIC_AUTHORIZATION_FAILED),
        ("Metadata of all topics", kw.METADATA, 4, kw.metadata_body(4, None, False), metadata_all_answer, NONE),
        ("OffsetCommit", OFFSET_COMMIT, 3,
         w_().string("g").i32(-1).string("").i64(-1).getvalue()
         + w_().array([TOPIC], lambda w, t: (w.string(t), w.array([0], lambda w, p: w.i32(p).i64(0).string(None)))).getvalue(),
         first_topic_first_partition_error, GROUP_AUTHORIZATION_FAILED),
        ("OffsetFetch", OFFSET_FETCH, 3, w_().string("g").array(None, None).getvalue(),
         lambda r: (r.i32(), r.array(lambda rr: None), r.i16())[2], GROUP_AUTHORIZATION_FAILED),
        ("FindCoordinator of a group", kw.FIND_COORDINATOR, 1, w_().string("g").i8(0).getvalue(),
         throttle_then_error, GROUP_AUTHORIZATION_FAILED),
        ("FindCoordinator of a transactional id", kw.FIND_COORDINATOR, 1, w_().string("tx").i8(1).getvalue(),
         throttle_then_error, TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
        ("JoinGroup", JOIN_GROUP, 2,
         w_().string("g").i32(10000).i32(10000).string("").string("consumer")
         .array([("range", b"")], lambda w, p: w.string(p[0]).bytes_(p[1])).getvalue(),
         throttle_then_error, GROUP_AUTHORIZATION_FAILED),
        ("Heartbeat", HEARTBEAT, 1, w_().string("g").i32(1).string("m").getvalue(), throttle_then_error,
         GROUP_AUTHORIZATION_FAILED),
        ("LeaveGroup", LEAVE_GROUP, 1, w_().string("g").string("m").getvalue(), throttle_then_error,
         GROUP_AUTHORIZATION_FAILED),
        ("SyncGroup", SYNC_GROUP, 1, w_().string("g").i32(1).string("m").array([], None).getvalue(),
         throttle_then_error, GROUP_AUTHORIZATION_FAILED),
        ("DescribeGroups", DESCRIBE_GROUPS, 1, w_().array(["g"], lambda w, g: w.string(g)).getvalue(),
         first_result_error, GROUP_AUTHORIZATION_FAILED),
        ("ListGroups", LIST_GROUPS, 1, b"", list_groups_answer, NONE),
        ("SaslHandshake on a PLAINTEXT listener", SASL_HANDSHAKE, 1, w_().string("PLAIN").getvalue(),
         lambda r: r.i16(), ILLEGAL_SASL_STATE),
        ("ApiVersions", kw.API_VERSIONS, 0, b"", lambda r: r.i16(), NONE),
        ("CreateTopics", kw.CREATE_TOPICS, 2, kw.create_topics_body(2, [("new-topic", 1, 1, {})]),
         lambda r: kw.parse_create_topics_response(r, 2)["new-topic"][0], TOPIC_AUTHORIZATION_FAILED),
        ("DeleteTopics", kw.DELETE_TOPICS, 1, w_().array([TOPIC], lambda w, t: w.string(t)).i32(10000).getvalue(),
         lambda r: (r.i32(), first(r), r.string(), r.i16())[3], TOPIC_AUTHORIZATION_FAILED),
        ("DeleteRecords", DELETE_RECORDS, 0,
         w_().array([TOPIC], lambda w, t: (w.string(t), w.array([0], lambda w, p: w.i32(p).i64(0)))).i32(10000).getvalue(),
         lambda r: (r.i32(), first(r), r.string(), first(r), r.i32(), r.i64(), r.i16())[6], TOPIC_AUTHORIZATION_FAILED),
        ("InitProducerId, idempotent", kw.INIT_PRODUCER_ID, 1, w_().string(None).i32(60000).getvalue(),
         throttle_then_error, CLUSTER_AUTHORIZATION_FAILED),
        ("InitProducerId, transactional", kw.INIT_PRODUCER_ID, 1, w_().string("tx").i32(60000).getvalue(),
         throttle_then_error, TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
        ("AddPartitionsToTxn", ADD_PARTITIONS_TO_TXN, 1,
         w_().string("tx").i64(1).i16(0).array([TOPIC], lambda w, t: w.string(t).array([0], lambda w, p: w.i32(p))).getvalue(),
         lambda r: (r.i32(), first(r), r.string(), first(r), r.i32(), r.i16())[5], TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
        ("AddOffsetsToTxn", ADD_OFFSETS_TO_TXN, 1, w_().string("tx").i64(1).i16(0).string("g").getvalue(),
         throttle_then_error, TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
        ("EndTxn", END_TXN, 1, w_().string("tx").i64(1).i16(0).boolean(False).getvalue(), throttle_then_error,
         TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
        ("WriteTxnMarkers", WRITE_TXN_MARKERS, 1, write_txn_markers_body(1, 0, False, TOPIC),
         lambda r: write_txn_markers_errors(r)[0], CLUSTER_AUTHORIZATION_FAILED),
        ("TxnOffsetCommit", TXN_OFFSET_COMMIT, 1,
         w_().string("tx").string("g").i64(1).i16(0).getvalue()
         + w_().array([TOPIC], lambda w, t: (w.string(t), w.array([0], lambda w, p: w.i32(p).i64(0).string(None)))).getvalue(),
         first_topic_first_partition_error, TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
        ("DescribeAcls", DESCRIBE_ACLS, 1, acl_filter(w_()).getvalue(), throttle_then_error,
         CLUSTER_AUTHORIZATION_FAILED),
        ("CreateAcls", CREATE_ACLS, 1,
         w_().array([None], lambda w, _: w.i8(2).string(TOPIC).i8(3).string("User:x").string("*").i8(3).i8(3)).getvalue(),
         first_result_error, CLUSTER_AUTHORIZATION_FAILED),
        ("DeleteAcls", DELETE_ACLS, 1, w_().array([None], lambda w, _: acl_filter(w)).getvalue(), first_result_error,
         CLUSTER_AUTHORIZATION_FAILED),
        ("DescribeConfigs", DESCRIBE_CONFIGS, 1,
         w_().array([TOPIC], lambda w, t: w.i8(2).string(t).array(None, None)).boolean(False).getvalue(),
         first_result_error, TOPIC_AUTHORIZATION_FAILED),
        ("AlterConfigs", ALTER_CONFIGS, 0,
         w_().array([TOPIC], lambda w, t: w.i8(2).string(t).array([("retention.ms", "1")],
                                                                  lambda w, c: w.string(c[0]).string(c[1])))
         .boolean(False).getvalue(), first_result_error, TOPIC_AUTHORIZATION_FAILED),
        ("DescribeLogDirs", DESCRIBE_LOG_DIRS, 3, w_(True).array(None, None).tags().getvalue(), throttle_then_error,
         CLUSTER_AUTHORIZATION_FAILED),
        ("SaslAuthenticate on a PLAINTEXT listener", SASL_AUTHENTICATE, 2, w_(True).bytes_(b"x").tags().getvalue(),
         lambda r: r.i16(), ILLEGAL_SASL_STATE),
        ("CreatePartitions", CREATE_PARTITIONS, 0,
         w_().array([TOPIC], lambda w, t: w.string(t).i32(4).array(None, None)).i32(10000).boolean(False).getvalue(),
         lambda r: (r.i32(), first(r), r.string(), r.i16())[3], TOPIC_AUTHORIZATION_FAILED),
        ("DeleteGroups", DELETE_GROUPS, 0, w_().array(["g"], lambda w, g: w.string(g)).getvalue(),
         lambda r: (r.i32(), first(r), r.string(), r.i16())[3], GROUP_AUTHORIZATION_FAILED),
        ("IncrementalAlterConfigs", kw.INCREMENTAL_ALTER_CONFIGS, 0,
         w_().array([TOPIC], lambda w, t: w.i8(2).string(t).array([("retention.ms", "1")],
                                                                  lambda w, c: w.string(c[0]).i8(0).string(c[1])))
         .boolean(False).getvalue(), first_result_error, TOPIC_AUTHORIZATION_FAILED),
        ("AlterPartitionReassignments", kw.ALTER_PARTITION_REASSIGNMENTS, 0,
         w_(True).i32(10000).array([], None).tags().getvalue(), throttle_then_error, CLUSTER_AUTHORIZATION_FAILED),
        ("ListPartitionReassignments", kw.LIST_PARTITION_REASSIGNMENTS, 0,
         w_(True).i32(10000).array(None, None).tags().getvalue(), throttle_then_error, CLUSTER_AUTHORIZATION_FAILED),
        ("DescribeQuorum", DESCRIBE_QUORUM, 0,
         w_(True).array(["__cluster_metadata"], lambda w, t: w.string(t).array([0], lambda w, p: w.i32(p).tags()).tags())
         .tags().getvalue(), lambda r: r.i16(), CLUSTER_AUTHORIZATION_FAILED),
        ("AddRaftVoter", ADD_RAFT_VOTER, 0, w_(True).string(None).i32(10000).i32(4).raw(bytes(16)).array([], None).tags()
         .getvalue(), throttle_then_error, CLUSTER_AUTHORIZATION_FAILED),
        # A client posing as a broker that forwards an admin's request.
        ("Envelope", ENVELOPE, 0, w_(True).bytes_(b"inner request").bytes_(b"User:admin").bytes_(bytes([127, 0, 0, 1]))
         .tags().getvalue(), lambda r: (r.bytes_(), r.i16())[1], CLUSTER_AUTHORIZATION_FAILED),
        ("RemoveRaftVoter", REMOVE_RAFT_VOTER, 0, w_(True).string(None).i32(4).raw(bytes(16)).tags().getvalue(),
         throttle_then_error, CLUSTER_AUTHORIZATION_FAILED),
        ("DescribeTopicPartitions", kw.DESCRIBE_TOPIC_PARTITIONS, 0,
         w_(True).array([TOPIC], lambda w, t: w.string(t).tags()).i32(100).i8(-1).tags().getvalue(), first_result_error,
         TOPIC_AUTHORIZATION_FAILED),
        ("OffsetDelete", OFFSET_DELETE, 0,
         w_().string("g").array([TOPIC], lambda w, t: w.string(t).array([0], lambda w, p: w.i32(p))).getvalue(),
         lambda r: r.i16(), GROUP_AUTHORIZATION_FAILED),
        ("DescribeClientQuotas", DESCRIBE_CLIENT_QUOTAS, 0, w_().array([], None).boolean(False).getvalue(),
         throttle_then_error, CLUSTER_AUTHORIZATION_FAILED),
        ("AlterClientQuotas", ALTER_CLIENT_QUOTAS, 0,
         w_().array([None], lambda w, _: w.array([("user", "x")], lambda w, e: w.string(e[0]).string(e[1]))
                    .array([("producer_byte_rate", 1.0)], lambda w, o: w.string(o[0]).raw(__import__("struct").pack(">d", o[1])).boolean(False)))
         .boolean(False).getvalue(), first_result_error, CLUSTER_AUTHORIZATION_FAILED),
        ("DescribeUserScramCredentials", DESCRIBE_USER_SCRAM, 0, w_(True).array(None, None).tags().getvalue(),
         throttle_then_error, CLUSTER_AUTHORIZATION_FAILED),
        ("AlterUserScramCredentials", ALTER_USER_SCRAM, 0,
         w_(True).array(["x"], lambda w, u: w.string(u).i8(1).tags()).array([], None).tags().getvalue(),
         lambda r: (r.i32(), first(r), r.string(), r.i16())[3], CLUSTER_AUTHORIZATION_FAILED),
        ("DescribeCluster", DESCRIBE_CLUSTER, 0, w_(True).boolean(False).tags().getvalue(), throttle_then_error, NONE),
        ("DescribeProducers", DESCRIBE_PRODUCERS, 0,
         w_(True).array([TOPIC], lambda w, t: w.string(t).array([0], lambda w, p: w.i32(p)).tags()).tags().getvalue(),
         first_topic_first_partition_error, TOPIC_AUTHORIZATION_FAILED),
        ("DescribeTransactions", DESCRIBE_TRANSACTIONS, 0, w_(True).array(["tx"], lambda w, t: w.string(t)).tags().getvalue(),
         first_result_error, TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
        ("ListTransactions", LIST_TRANSACTIONS, 0, w_(True).array([], None).array([], None).tags().getvalue(),
         list_transactions_answer, NONE),
        ("ConsumerGroupHeartbeat", CONSUMER_GROUP_HEARTBEAT, 0, consumer_group_heartbeat_body("g", [TOPIC]),
         throttle_then_error, GROUP_AUTHORIZATION_FAILED),
        ("ConsumerGroupDescribe", CONSUMER_GROUP_DESCRIBE, 0,
         w_(True).array(["g"], lambda w, g: w.string(g)).boolean(False).tags().getvalue(), first_result_error,
         GROUP_AUTHORIZATION_FAILED),
        ("ShareGroupHeartbeat", kw.SHARE_GROUP_HEARTBEAT, 1,
         w_(True).string("g").string(str(uuid.uuid4())).i32(0).string(None).array([TOPIC], lambda w, t: w.string(t)).tags().getvalue(),
         throttle_then_error, GROUP_AUTHORIZATION_FAILED),
        ("ShareGroupDescribe", SHARE_GROUP_DESCRIBE, 1,
         w_(True).array(["g"], lambda w, g: w.string(g)).boolean(False).tags().getvalue(), first_result_error,
         GROUP_AUTHORIZATION_FAILED),
        ("ShareFetch", kw.SHARE_FETCH, 1,
         w_(True).string("g").string(str(uuid.uuid4())).i32(0).i32(0).i32(1).i32(1 << 20).i32(10).i32(10)
         .array([], None).array([], None).tags().getvalue(), throttle_then_error, GROUP_AUTHORIZATION_FAILED),
        ("ShareAcknowledge", kw.SHARE_ACKNOWLEDGE, 1,
         w_(True).string("g").string(str(uuid.uuid4())).i32(1).array([], None).tags().getvalue(), throttle_then_error,
         GROUP_AUTHORIZATION_FAILED),
        ("InitializeShareGroupState", INITIALIZE_SHARE_STATE, 0,
         share_topics(w_(True).string("g"), lambda w, p: w.i32(p).i32(0).i64(0).tags()).tags().getvalue(),
         share_state_error, CLUSTER_AUTHORIZATION_FAILED),
        ("ReadShareGroupState", READ_SHARE_STATE, 0,
         share_topics(w_(True).string("g"), lambda w, p: w.i32(p).i32(0).tags()).tags().getvalue(),
         share_state_error, CLUSTER_AUTHORIZATION_FAILED),
        ("WriteShareGroupState", WRITE_SHARE_STATE, 0,
         share_topics(w_(True).string("g"), lambda w, p: w.i32(p).i32(0).i32(0).i64(0).array([], None).tags())
         .tags().getvalue(), share_state_error, CLUSTER_AUTHORIZATION_FAILED),
        ("DeleteShareGroupState", DELETE_SHARE_STATE, 0,
         share_topics(w_(True).string("g"), lambda w, p: w.i32(p).tags()).tags().getvalue(),
         share_state_error, CLUSTER_AUTHORIZATION_FAILED),
        ("ReadShareGroupStateSummary", READ_SHARE_SUMMARY, 0,
         share_topics(w_(True).string("g"), lambda w, p: w.i32(p).i32(0).tags()).tags().getvalue(),
         share_state_error, CLUSTER_AUTHORIZATION_FAILED),
        ("DescribeShareGroupOffsets", DESCRIBE_SHARE_OFFSETS, 0,
         w_(True).array(["g"], lambda w, g: w.string(g).array(None, None).tags()).tags().getvalue(),
         share_offsets_group_error, GROUP_AUTHORIZATION_FAILED),
        ("AlterShareGroupOffsets", ALTER_SHARE_OFFSETS, 0, group_id_body(True).array([], None).tags().getvalue(),
         throttle_then_error, GROUP_AUTHORIZATION_FAILED),
        ("DeleteShareGroupOffsets", DELETE_SHARE_OFFSETS, 0, group_id_body(True).array([], None).tags().getvalue(),
         throttle_then_error, GROUP_AUTHORIZATION_FAILED),
    ]


def test_a_principal_without_acls_is_refused_by_every_api_that_needs_one(secured):
    tid = topic_id(secured, TOPIC)
    cases = every_api(tid)
    with secured.anonymous() as conn:
        _, advertised = conn.api_versions()
    covered = {api for _, api, _, _, _, _ in cases}
    assert covered == set(advertised), f"APIs without a case: {sorted(set(advertised) - covered)}"
    seen = {}
    for name, api, version, body, read, _ in cases:
        with secured.anonymous() as conn:
            seen[name] = read(conn.request(api, version, body))
    expected = {name: error for name, _, _, _, _, error in cases}
    assert seen == expected
