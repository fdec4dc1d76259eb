"""Security in a 3-node cluster: SCRAM users and ACLs live in the replicated metadata (made
on one node, enforced by all), and each listener advertises its own addresses, so a client
that bootstraps from one node's SASL listener reaches every leader over SASL.
"""

import time

import pytest
from confluent_kafka import Consumer, Producer
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

from conftest import Broker, free_port

NODES = 3


class SecureCluster:
    def __init__(self, tmp_path):
        self.plain = [free_port() for _ in range(NODES)]
        self.sasl = [free_port() for _ in range(NODES)]
        controllers = [free_port() for _ in range(NODES)]
        voters = ",".join(f"{i + 1}@127.0.0.1:{controllers[i]}" for i in range(NODES))
        self.nodes = []
        for i in range(NODES):
            args = [
                "--node-id", str(i + 1),
                "--controller-listen", f"127.0.0.1:{controllers[i]}",
                "--cluster-voters", voters,
                "--override", f"listeners=PLAINTEXT://127.0.0.1:{self.plain[i]},SASL_PLAINTEXT://127.0.0.1:{self.sasl[i]}",
                "--override", "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                "--override", "super.users=User:ANONYMOUS",
            ]
            self.nodes.append(Broker(tmp_path / f"node-{i + 1}", port=self.plain[i], extra_args=args))

    def start(self):
        for node in self.nodes:
            node.start()
        admin = self.admin(0)
        wait_for("all brokers registered", lambda: len(admin.list_topics(timeout=5).brokers) == NODES, 60)
        return self

    def admin(self, node: int) -> AdminClient:
        return AdminClient({"bootstrap.servers": f"127.0.0.1:{self.plain[node]}"})

    def as_alice(self, node: int, **extra) -> dict:
        return {
            "bootstrap.servers": f"127.0.0.1:{self.sasl[node]}",
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "alice",
            "sasl.password": "alice-secret",
            **extra,
        }


def wait_for(what, predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
            if last:
                return last
        except Exception as error:  # metadata may not have reached this node yet
            last = error
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}; last: {last}")


@pytest.fixture
def secure_cluster(tmp_path):
    cluster = SecureCluster(tmp_path).start()
    yield cluster
    for node in cluster.nodes:
        node.kill()


def test_users_and_acls_made_on_one_node_hold_on_every_node(secure_cluster):
    c = secure_cluster
    admin = c.admin(0)
    upsert = UserScramCredentialUpsertion("alice", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096),
                                          b"alice-secret")

    def user_created():
        # A new cluster finalizes its metadata.version once every voter registered.
        for future in admin.alter_user_scram_credentials([upsert]).values():
            future.result(timeout=20)
        return True
    wait_for("the SCRAM user (metadata.version finalized)", user_created)
    for future in admin.create_topics([NewTopic("secure-t", 3, replication_factor=3),
                                       NewTopic("other-t", 1, replication_factor=3)]).values():
        future.result(timeout=20)
    bindings = [
        AclBinding(ResourceType.TOPIC, "secure-t", ResourcePatternType.LITERAL, "User:alice", "*", AclOperation.ALL,
                   AclPermissionType.ALLOW),
        AclBinding(ResourceType.GROUP, "alice-", ResourcePatternType.PREFIXED, "User:alice", "*",
                   AclOperation.READ, AclPermissionType.ALLOW),
    ]
    for future in admin.create_acls(bindings).values():
        future.result(timeout=20)

    # Bootstrapped from node 3's SASL listener: every broker is listed at its SASL port.
    alice_admin = AdminClient(c.as_alice(2))
    def listed():
        brokers = alice_admin.list_topics(timeout=5).brokers
        return sorted(b.port for b in brokers.values()) == sorted(c.sasl)
    wait_for("every broker listed on its SASL port", listed)
    assert set(alice_admin.list_topics(timeout=10).topics) == {"secure-t"}

    # Leaders are spread over the nodes: producing to all partitions reaches each over SASL.
    delivered = []
    producer = Producer(c.as_alice(2, acks="all"))
    for i in range(30):
        producer.produce("secure-t", f"v{i}".encode(), partition=i % 3,
                         on_delivery=lambda err, msg: delivered.append(err))
    assert producer.flush(30) == 0
    assert delivered == [None] * 30, delivered
    consumer = Consumer(c.as_alice(1, **{"group.id": "alice-readers", "auto.offset.reset": "earliest"}))
    consumer.subscribe(["secure-t"])
    got = 0
    deadline = time.monotonic() + 40
    while got < 30 and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            got += 1
    consumer.close()
    assert got == 30

    # The ACLs hold on every node: alice may not write the other topic, wherever its leader is.
    refused = []
    producer = Producer(c.as_alice(0, **{"message.timeout.ms": 8000}))
    producer.produce("other-t", b"x", on_delivery=lambda err, msg: refused.append(err and err.str()))
    producer.flush(12)
    assert refused == ["Broker: Topic authorization failed"], refused


def test_controller_rpcs_need_the_shared_secret(tmp_path):
    """With `cluster.rpc_secret_file`, a node with another secret never joins the quorum
    and a raw connection cannot talk to a controller; with the right one it joins."""
    import json
    import socket
    import struct

    secret, wrong = tmp_path / "secret", tmp_path / "wrong"
    secret.write_text("correct-horse-battery-staple-42\n")
    wrong.write_text("another-secret-entirely-0000\n")
    ports = [free_port() for _ in range(NODES)]
    controllers = [free_port() for _ in range(NODES)]
    voters = ",".join(f"{i + 1}@127.0.0.1:{controllers[i]}" for i in range(NODES))

    def node(i, secret_file):
        args = ["--node-id", str(i + 1), "--controller-listen", f"127.0.0.1:{controllers[i]}",
                "--cluster-voters", voters, "--override", f"cluster.rpc_secret_file={secret_file}"]
        return Broker(tmp_path / f"node-{i + 1}", port=ports[i], extra_args=args)

    nodes = [node(0, secret), node(1, secret), node(2, wrong)]
    try:
        for n in nodes:
            n.start()
        admin = AdminClient({"bootstrap.servers": nodes[0].bootstrap})
        wait_for("nodes 1 and 2 registered", lambda: len(admin.list_topics(timeout=5).brokers) == 2, 60)
        time.sleep(3)
        assert len(admin.list_topics(timeout=5).brokers) == 2, "the node with the wrong secret joined"
        assert "refusing an unauthenticated controller RPC" in nodes[0].log() + nodes[1].log()

        # A raw client gets the nonce, sends an unauthenticated forwarded write: closed, no answer.
        with socket.create_connection(("127.0.0.1", controllers[0]), timeout=5) as sock:
            (length,) = struct.unpack(">I", sock.recv(4))
            assert length == 16 and len(sock.recv(16)) == 16
            body = json.dumps({"cluster_id": "x", "request": {"Heartbeat": {}}}).encode()
            sock.sendall(struct.pack(">I", len(body)) + body)
            assert sock.recv(4) == b"", "an unauthenticated request got an answer"

        nodes[2].kill()
        nodes[2].extra_args[-1] = f"cluster.rpc_secret_file={secret}"
        nodes[2].start()
        wait_for("node 3 registered with the right secret", lambda: len(admin.list_topics(timeout=5).brokers) == 3,
                 60)
    finally:
        for n in nodes:
            n.kill()
