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

from cluster_support import NODES, Cluster, wait_for
from conftest import SLUICE_BIN, Broker, free_port

class SecureCluster(Cluster):
    """A PLAINTEXT listener (ANONYMOUS is a super user: the tests' admin) and a
    SASL_PLAINTEXT one per node, with the standard authorizer."""

    def __init__(self, tmp_path):
        self.sasl = {node_id: free_port() for node_id in range(1, NODES + 1)}

        def node_args(node_id, port):
            return [
                "--override", f"listeners=PLAINTEXT://127.0.0.1:{port},SASL_PLAINTEXT://127.0.0.1:{self.sasl[node_id]}",
                "--override", "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                "--override", "super.users=User:ANONYMOUS",
            ]

        super().__init__(tmp_path, node_args=node_args)

    def admin_of(self, node: int) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.nodes[node + 1].bootstrap})

    def as_alice(self, node: int, **extra) -> dict:
        return {
            "bootstrap.servers": f"127.0.0.1:{self.sasl[node + 1]}",
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "alice",
            "sasl.password": "alice-secret",
            **extra,
        }


@pytest.fixture
def secure_cluster(tmp_path):
    cluster = SecureCluster(tmp_path).start()
    yield cluster
    cluster.kill_all()


def test_users_and_acls_made_on_one_node_hold_on_every_node(secure_cluster):
    c = secure_cluster
    admin = c.admin_of(0)
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
        return sorted(b.port for b in brokers.values()) == sorted(c.sasl.values())
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


def test_replication_and_controller_rpc_run_over_authenticated_tls(tmp_path):
    """With a SASL_SSL inter-broker listener, followers reach their leaders over TLS and
    authenticate as the brokers' own user (its credential derives from the shared rpc
    secret): acks=all writes that need every replica succeed and survive a leader's
    `kill -9`. Anyone else fetching as a replica there is refused, and the brokers' user
    name cannot be taken by an operator-made credential. With `cluster.rpc_tls` the
    controllers talk over TLS too: nothing is sent in the clear."""
    import socket
    import ssl

    import kafka_wire as kw
    from cluster_support import consume_all, create_topic
    from tls_certs import make_pki

    pki = make_pki(tmp_path / "pki")
    secret = tmp_path / "secret"
    secret.write_text("correct-horse-battery-staple-42\n")
    internal = {node_id: free_port() for node_id in range(1, NODES + 1)}
    registry_ports = {node_id: free_port() for node_id in range(1, NODES + 1)}

    def node_args(node_id, port):
        return [
            "--schema-registry-listen", f"127.0.0.1:{registry_ports[node_id]}", "--schema-registry-tls",
            "--override", f"listeners=PLAINTEXT://127.0.0.1:{port},INTERNAL://127.0.0.1:{internal[node_id]}",
            "--override", "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,INTERNAL:SASL_SSL",
            "--override", "inter.broker.listener.name=INTERNAL",
            "--override", f"ssl.keystore.location={pki.server}",
            "--override", f"ssl.truststore.location={pki.ca}",
            "--override", "sasl.enabled.mechanisms=SCRAM-SHA-512,PLAIN",
            "--override", f"cluster.rpc_secret_file={secret}",
            "--override", "cluster.rpc_tls=true",
            "--override", "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "--override", "super.users=User:ANONYMOUS",
        ]

    cluster = Cluster(tmp_path, node_args=node_args).start()
    try:
        # The controller port speaks TLS: a plain connection gets no nonce (the first thing
        # an authenticated controller sends), a TLS one does.
        controller = ("127.0.0.1", cluster.controller_ports[1])
        with socket.create_connection(controller, timeout=1) as sock:
            with pytest.raises(socket.timeout):
                sock.recv(4)
        context = ssl.create_default_context(cafile=str(pki.ca))
        with context.wrap_socket(socket.create_connection(controller, timeout=5), server_hostname="127.0.0.1") as tls:
            assert tls.recv(4) == (16).to_bytes(4, "big"), "no nonce frame over TLS"

        topic = "internal-tls"
        # min.insync.replicas=3: no write is acknowledged unless both followers fetched it.
        create_topic(cluster, topic, 3, {"min.insync.replicas": "3"})
        delivered = []
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 5})
        for i in range(300):
            producer.produce(topic, key=f"k{i}", value=b"v" * 200, partition=i % 3,
                             on_delivery=lambda err, msg: delivered.append(err))
        assert producer.flush(60) == 0
        assert delivered == [None] * 300, [e for e in delivered if e][:3]
        for node in cluster.nodes.values():
            assert "cannot fetch from leader" not in node.log(), node.log()[-3000:]

        # Another principal on the inter-broker listener may not fetch as a replica.
        admin = cluster.admin()
        upsert = UserScramCredentialUpsertion("mallory", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096),
                                              b"mallory-secret")

        def user_created():
            # A new cluster finalizes its metadata.version once every voter registered.
            for future in admin.alter_user_scram_credentials([upsert]).values():
                future.result(timeout=20)
            return True
        wait_for("the SCRAM user (metadata.version finalized)", user_created)
        leader = cluster.partition_state(topic, 0)[0]

        def as_mallory():
            """A TLS connection to the leader authenticated as mallory, once her credential,
            committed by the controller, has reached the leader (None until then)."""
            conn = kw.Conn("127.0.0.1", internal[leader])
            conn.sock = context.wrap_socket(conn.sock, server_hostname="127.0.0.1")
            assert conn.request(17, 1, kw.Writer().string("PLAIN").getvalue()).i16() == 0
            answer = conn.request(36, 1, kw.Writer().bytes_(b"\0mallory\0mallory-secret").getvalue())
            if answer.i16() == 0:
                return conn
            conn.close()
            return None
        with wait_for("mallory's PLAIN authentication at the leader", as_mallory) as conn:
            fetch = conn.request(kw.FETCH, 11, kw.fetch_body(11, topic, 0, 0, 1 << 20, 0, replica_id=2))
            fetch.i32()  # throttle
            assert fetch.i16() == 31, "a replica fetch by a non-broker principal was not refused"  # CLUSTER_AUTHORIZATION_FAILED

        # The schema registries serve HTTPS, and forward writes to the leader of _schemas over it.
        from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType
        from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
        grant = AclBinding(ResourceType.TOPIC, "tls-", ResourcePatternType.PREFIXED, "User:mallory", "*",
                           AclOperation.ALL, AclPermissionType.ALLOW)
        for future in admin.create_acls([grant]).values():
            future.result(timeout=20)

        def registry(node):
            return SchemaRegistryClient({"url": f"https://127.0.0.1:{registry_ports[node]}",
                                         "ssl.ca.location": str(pki.ca),
                                         "basic.auth.user.info": "mallory:mallory-secret"})
        schema = '{"type": "record", "name": "R", "fields": [{"name": "a", "type": "string"}]}'
        first = wait_for("a registration over HTTPS (the ACL everywhere)",
                         lambda: registry(1).register_schema("tls-first-value", Schema(schema, "AVRO")), timeout=60)
        schemas_leader = cluster.partition_state("_schemas", 0)[0]
        follower = next(node for node in cluster.nodes if node != schemas_leader)
        assert registry(follower).register_schema("tls-second-value", Schema(schema, "AVRO")) == first
        assert sorted(registry(follower).get_subjects()) == ["tls-first-value", "tls-second-value"]

        # The brokers' user is reserved.
        reserved = UserScramCredentialUpsertion("sluice-inter-broker",
                                                ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), b"guess")
        with pytest.raises(Exception, match="reserved|UNACCEPTABLE"):
            for future in admin.alter_user_scram_credentials([reserved]).values():
                future.result(timeout=20)

        # Every acknowledged record is on the followers: kill -9 the leader of partition 0
        # and read everything back from the two others.
        cluster.nodes[leader].kill()
        survivors = ",".join(n.bootstrap for node_id, n in cluster.nodes.items() if node_id != leader)
        cluster.wait_for("new leaders", lambda: all(
            cluster.partition_state(topic, p)[0] not in (leader, -1) for p in range(3)), timeout=30)
        seen = consume_all(survivors, topic, 3, 300)
        assert sorted(key for _, _, key in seen) == sorted(f"k{i}" for i in range(300))
    finally:
        cluster.kill_all()


def forged_create_topic(cluster_id: str, name: str) -> bytes:
    """A controller `Write` frame proposing CreateTopic, as someone without the secret can
    write it: the cluster id comes from any Metadata answer."""
    import json
    import struct
    import uuid

    command = {"CreateTopic": {"name": name, "topic_id": str(uuid.uuid4()), "partitions": 1,
                               "replication_factor": 1, "configs": {}, "placement_seed": 1}}
    body = json.dumps({"cluster_id": cluster_id,
                       "request": {"Write": {"request_id": str(uuid.uuid4()), "command": command}}}).encode()
    return struct.pack(">I", len(body)) + body


def test_a_dev_cluster_refuses_forged_controller_writes_with_nothing_configured(tmp_path):
    """`sluice dev-cluster` with no option: a forged CreateTopic sent to every controller
    port is never committed, and the connection closes without an answer."""
    import re
    import socket
    import subprocess

    from test_dev_cluster import base_port_with_room, CONSOLE_PORT_OFFSET, CONTROLLER_PORT_OFFSET
    base = base_port_with_room(3)
    proc = subprocess.Popen([SLUICE_BIN, "dev-cluster", "--nodes", "3", "--base-port", str(base),
                             "--console-port", str(base + CONSOLE_PORT_OFFSET), "--data-dir", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        bootstrap = None
        while bootstrap is None:
            line = proc.stdout.readline()
            assert line, "dev-cluster exited early"
            match = re.match(r"bootstrap: (\S+)", line)
            bootstrap = match.group(1) if match else None
        admin = AdminClient({"bootstrap.servers": bootstrap})
        wait_for("all brokers registered", lambda: len(admin.list_topics(timeout=5).brokers) == 3, 60)
        cluster_id = admin.list_topics(timeout=5).cluster_id
        for i in range(3):
            with socket.create_connection(("127.0.0.1", base + CONTROLLER_PORT_OFFSET + i), timeout=10) as sock:
                sock.sendall(forged_create_topic(cluster_id, f"forged-{i}"))
                received = b""
                while chunk := sock.recv(65536):
                    received += chunk
                # The nonce (a length and 16 bytes), then the connection closes unanswered.
                assert len(received) == 20, f"a forged write got an answer: {received[:200]!r}"
        time.sleep(2)
        topics = admin.list_topics(timeout=5).topics
        assert not [name for name in topics if name.startswith("forged-")], sorted(topics)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_cluster_of_several_voters_without_a_secret_refuses_to_start(tmp_path):
    """Nothing configured on a hand-started node of a 3-voter quorum: it does not start, and
    says what to set."""
    import subprocess

    voters = ",".join(f"{i}@127.0.0.1:{free_port()}" for i in (1, 2, 3))
    result = subprocess.run([SLUICE_BIN, "serve", "--node-id", "1", "--data-dir", str(tmp_path / "data"),
                             "--listen", f"127.0.0.1:{free_port()}", "--cluster-voters", voters],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "cluster.rpc_secret_file is not set" in result.stderr, result.stderr
    assert "--cluster-rpc-secret-file" in result.stderr, result.stderr


def test_a_single_voter_generates_its_own_secret_readable_by_its_owner_only(tmp_path):
    """A cluster of one voter with nothing configured authenticates its controller RPCs with
    a secret it generated in its data dir (mode 0600), the same after a restart."""
    import os
    import socket
    import stat

    controller = free_port()
    args = ["--node-id", "1", "--controller-listen", f"127.0.0.1:{controller}",
            "--cluster-voters", f"1@127.0.0.1:{controller}"]
    broker = Broker(tmp_path / "data", extra_args=args)
    broker.start()
    try:
        secret_path = tmp_path / "data" / "controller.secret"
        assert stat.S_IMODE(os.stat(secret_path).st_mode) == 0o600
        secret = secret_path.read_bytes()
        assert len(secret) >= 32
        cluster_id = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=10).cluster_id
        with socket.create_connection(("127.0.0.1", controller), timeout=10) as sock:
            sock.sendall(forged_create_topic(cluster_id, "forged"))
            received = b""
            while chunk := sock.recv(65536):
                received += chunk
            assert len(received) == 20, f"a forged write got an answer: {received[:200]!r}"
        broker.stop()
        broker.start()
        assert secret_path.read_bytes() == secret
        assert "forged" not in AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=10).topics
    finally:
        broker.kill()


def test_idle_connections_to_controller_ports_never_keep_a_restarted_node_out(tmp_path):
    """300 connections opened to the other controllers' ports and left silent (more than a
    controller serves at once) while a node is down do not keep it from rejoining when it
    restarts."""
    import socket

    cluster = Cluster(tmp_path).start()
    held = []
    try:
        victim = cluster.nodes[2]
        victim.kill()
        for node_id, port in cluster.controller_ports.items():
            if node_id != 2:
                for _ in range(300):
                    held.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        admin = cluster.admin()
        wait_for("the stopped node fenced", lambda: len(admin.list_topics(timeout=5).brokers) == NODES - 1, 30)
        started = time.monotonic()
        victim.start()
        wait_for("the restarted node back", lambda: len(admin.list_topics(timeout=5).brokers) == NODES, 30)
        assert time.monotonic() - started < 15, f"rejoined after {time.monotonic() - started:.1f} s"
    finally:
        for sock in held:
            sock.close()
        cluster.kill_all()
