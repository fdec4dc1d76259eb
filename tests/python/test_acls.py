"""ACLs with Kafka's semantics, managed with Kafka's own `kafka-acls.sh` (AclCommand from
kafka-tools 4.3.1) and enforced on librdkafka and Java clients authenticated with SASL/SCRAM.

The broker runs Kafka's usual shape: `authorizer.class.name` set, a PLAINTEXT listener for
local administration whose (anonymous) principal is a super user, and a SASL_PLAINTEXT
listener for everyone else.
"""

import time

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import (
    AdminClient,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from conftest import free_port
from java_support import run_java, tools_cp  # noqa: F401  (tools_cp is a fixture)

ACL_COMMAND = "org.apache.kafka.tools.AclCommand"
TOPIC_COMMAND = "org.apache.kafka.tools.TopicCommand"


class Secured:
    def __init__(self, broker, sasl_port):
        self.broker = broker
        self.sasl_port = sasl_port

    def as_user(self, user: str, **extra) -> dict:
        conf = {
            "bootstrap.servers": f"127.0.0.1:{self.sasl_port}",
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.username": user,
            "sasl.password": f"{user}-secret",
        }
        conf.update(extra)
        return conf


@pytest.fixture
def secured(broker_factory):
    plaintext, sasl = free_port(), free_port()
    broker = broker_factory(
        extra_args=[
            "--override", f"listeners=PLAINTEXT://127.0.0.1:{plaintext},SASL_PLAINTEXT://127.0.0.1:{sasl}",
            "--override", "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "--override", "super.users=User:ANONYMOUS;User:admin",
        ],
        port=plaintext,
    )
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    upserts = [
        UserScramCredentialUpsertion(user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), f"{user}-secret".encode())
        for user in ["alice", "bob", "admin"]
    ]
    for future in admin.alter_user_scram_credentials(upserts).values():
        future.result(timeout=10)
    for future in admin.create_topics([NewTopic("orders", 2), NewTopic("payments", 1)]).values():
        future.result(timeout=10)
    return Secured(broker, sasl)


def acls(tools_cp, broker, *args, ok=True):  # noqa: F811
    res = run_java(tools_cp, ACL_COMMAND, ["--bootstrap-server", broker.bootstrap, *args], timeout=120)
    if ok:
        assert res.returncode == 0, f"{res.report()}\n--- broker log ---\n{broker.log()[-3000:]}"
    return res


def produce_result(conf: dict, topic: str) -> str | None:
    """Produces one record; returns None on success or the error's name."""
    outcome = []
    producer = Producer(dict(conf, **{"message.timeout.ms": 8000}))
    producer.produce(topic, b"v", on_delivery=lambda err, msg: outcome.append(err and err.name()))
    producer.flush(12)
    return outcome[0] if outcome else "no answer"


def consume_result(conf: dict, topic: str, group: str) -> tuple[list[bytes], str | None]:
    consumer = Consumer(dict(conf, **{"group.id": group, "auto.offset.reset": "earliest"}))
    consumer.subscribe([topic])
    got, error = [], None
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not got and error is None:
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        if msg.error():
            if msg.error().code() != KafkaError._PARTITION_EOF:
                error = msg.error().name()
        else:
            got.append(msg.value())
    consumer.close()
    return got, error


def visible_topics(conf: dict) -> set[str]:
    return set(AdminClient(conf).list_topics(timeout=10).topics)


def test_acls_allow_what_they_grant_and_nothing_else(secured, tools_cp):  # noqa: F811
    broker = secured.broker
    acls(tools_cp, broker, "--add", "--allow-principal", "User:alice", "--operation", "Write", "--operation", "Read",
         "--topic", "orders")
    acls(tools_cp, broker, "--add", "--allow-principal", "User:alice", "--operation", "Read", "--group", "alice-")
    listed = acls(tools_cp, broker, "--list", "--topic", "orders").stdout
    assert "User:alice" in listed and "WRITE" in listed and "READ" in listed, listed

    alice = secured.as_user("alice")
    assert produce_result(alice, "orders") is None
    assert produce_result(alice, "payments") == "TOPIC_AUTHORIZATION_FAILED"
    # Metadata of "all topics" leaves out what alice may not describe.
    assert visible_topics(alice) == {"orders"}
    got, error = consume_result(alice, "orders", "alice-")
    assert error is None and got == [b"v"]
    # A group alice has no ACL for (the literal ACL names only "alice-").
    got, error = consume_result(alice, "orders", "alice-2")
    assert error == "GROUP_AUTHORIZATION_FAILED", (got, error)

    bob = secured.as_user("bob")
    assert visible_topics(bob) == set()
    assert produce_result(bob, "orders") == "TOPIC_AUTHORIZATION_FAILED"
    # A super user sees and does everything.
    admin = secured.as_user("admin")
    assert visible_topics(admin) >= {"orders", "payments"}
    assert produce_result(admin, "payments") is None

    # DENY wins over ALLOW, and a prefixed pattern covers every name with that prefix.
    acls(tools_cp, broker, "--add", "--deny-principal", "User:alice", "--operation", "Write", "--topic", "ord",
         "--resource-pattern-type", "prefixed")
    assert produce_result(alice, "orders") == "TOPIC_AUTHORIZATION_FAILED"
    acls(tools_cp, broker, "--remove", "--force", "--deny-principal", "User:alice", "--operation", "Write",
         "--topic", "ord", "--resource-pattern-type", "prefixed")
    assert produce_result(alice, "orders") is None


def test_acls_survive_a_restart_and_can_be_removed(secured, tools_cp):  # noqa: F811
    broker = secured.broker
    acls(tools_cp, broker, "--add", "--allow-principal", "User:bob", "--operation", "All", "--topic", "payments")
    broker.kill()
    broker.start()
    bob = secured.as_user("bob")
    assert produce_result(bob, "payments") is None
    acls(tools_cp, broker, "--remove", "--force", "--topic", "payments")
    assert "User:bob" not in acls(tools_cp, broker, "--list").stdout
    assert produce_result(bob, "payments") == "TOPIC_AUTHORIZATION_FAILED"


def test_only_cluster_alter_may_change_acls_and_java_client_sees_its_topics(secured, tools_cp, tmp_path):  # noqa: F811
    broker = secured.broker
    acls(tools_cp, broker, "--add", "--allow-principal", "User:alice", "--operation", "Describe", "--topic", "orders")
    config = tmp_path / "alice.properties"
    config.write_text(
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-256\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="alice" password="alice-secret";\n'
    )
    sasl_bootstrap = f"127.0.0.1:{secured.sasl_port}"
    res = run_java(tools_cp, TOPIC_COMMAND, ["--bootstrap-server", sasl_bootstrap, "--list", "--command-config",
                                             str(config)], timeout=120)
    assert res.returncode == 0, res.report()
    assert [line for line in res.stdout.splitlines() if line.strip()] == ["orders"], res.stdout

    res = run_java(tools_cp, ACL_COMMAND, ["--bootstrap-server", sasl_bootstrap, "--command-config", str(config),
                                           "--add", "--allow-principal", "User:alice", "--operation", "All",
                                           "--topic", "payments"], timeout=120)
    assert "ClusterAuthorizationException" in res.stdout + res.stderr, res.report()
    assert "payments" not in acls(tools_cp, broker, "--list").stdout


def test_authorized_operations_say_what_a_principal_may_do(secured):
    """KIP-430: describing topics, groups and the cluster with authorized operations lists
    what the client's principal may do there (librdkafka's Admin API)."""
    from confluent_kafka import TopicCollection
    from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType

    admin = AdminClient({"bootstrap.servers": secured.broker.bootstrap})
    bindings = [
        AclBinding(ResourceType.TOPIC, "orders", ResourcePatternType.LITERAL, "User:alice", "*", AclOperation.READ,
                   AclPermissionType.ALLOW),
        AclBinding(ResourceType.TOPIC, "orders", ResourcePatternType.LITERAL, "User:alice", "*",
                   AclOperation.DESCRIBE_CONFIGS, AclPermissionType.ALLOW),
        AclBinding(ResourceType.GROUP, "ops-", ResourcePatternType.PREFIXED, "User:alice", "*", AclOperation.DELETE,
                   AclPermissionType.ALLOW),
    ]
    for future in admin.create_acls(bindings).values():
        future.result(timeout=10)
    alice = AdminClient(secured.as_user("alice"))

    topic = alice.describe_topics(TopicCollection(["orders"]), include_authorized_operations=True)["orders"]
    assert set(topic.result(timeout=10).authorized_operations) == {
        AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DESCRIBE_CONFIGS}
    group = alice.describe_consumer_groups(["ops-a"], include_authorized_operations=True)["ops-a"]
    # DELETE on the group implies DESCRIBE, as in Kafka.
    assert set(group.result(timeout=10).authorized_operations) == {AclOperation.DELETE, AclOperation.DESCRIBE}
    assert not alice.describe_cluster(include_authorized_operations=True).result(timeout=10).authorized_operations
    # A super user may do everything on the cluster.
    everything = set(admin.describe_cluster(include_authorized_operations=True).result(timeout=10).authorized_operations)
    assert {AclOperation.CREATE, AclOperation.ALTER, AclOperation.DESCRIBE, AclOperation.CLUSTER_ACTION,
            AclOperation.ALTER_CONFIGS, AclOperation.IDEMPOTENT_WRITE} <= everything, everything


def test_ending_a_transaction_by_hand_needs_cluster_action(secured, tools_cp, tmp_path):  # noqa: F811
    """`kafka-transactions.sh abort` sends WriteTxnMarkers to the partition leader, which Kafka
    allows only with CLUSTER_ACTION on the cluster: alice, who may read and write the topic, is
    refused and no marker is written; the super user's abort writes one."""
    from confluent_kafka import TopicPartition

    broker = secured.broker
    acls(tools_cp, broker, "--add", "--allow-principal", "User:alice", "--operation", "Read", "--operation", "Write",
         "--operation", "Describe", "--topic", "orders")
    config = tmp_path / "alice.properties"
    config.write_text(
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-256\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="alice" password="alice-secret";\n'
    )
    abort = ["abort", "--topic", "orders", "--partition", "0", "--producer-id", "12345", "--producer-epoch", "0",
             "--coordinator-epoch", "0"]

    def end_offset():
        consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "acl-abort-probe"})
        try:
            return consumer.get_watermark_offsets(TopicPartition("orders", 0), timeout=10)[1]
        finally:
            consumer.close()

    before = end_offset()
    res = run_java(tools_cp, "org.apache.kafka.tools.TransactionsCommand",
                   ["--bootstrap-server", f"127.0.0.1:{secured.sasl_port}", "--command-config", str(config), *abort],
                   timeout=120)
    assert res.returncode != 0 and "cluster authorization" in res.stdout + res.stderr, res.report()
    assert end_offset() == before, "a refused WriteTxnMarkers wrote a marker"

    res = run_java(tools_cp, "org.apache.kafka.tools.TransactionsCommand",
                   ["--bootstrap-server", broker.bootstrap, *abort], timeout=120)
    assert res.returncode == 0, f"{res.report()}\n--- broker log ---\n{broker.log()[-3000:]}"
    assert end_offset() == before + 1, "the super user's abort wrote no marker"
