"""TLS and SASL against real clients: librdkafka (confluent-kafka) and the Java client (Kafka's
own tools from kafka-tools 4.3.1), over named listeners configured with Kafka's names.

One broker has four listeners: PLAINTEXT (where the operator manages SCRAM users, as with
Kafka's `kafka-configs.sh --bootstrap-server`), SSL, SASL_SSL and SASL_PLAINTEXT. Each test
checks what a user of that listener sees: records round-trip, the advertised address is the
listener's own, wrong passwords and untrusted certificates are refused with Kafka's errors.
"""

import socket
import ssl
import struct
import time

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
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
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

import kafka_wire as kw
from conftest import free_port
from java_support import run_java, tools_cp  # noqa: F401  (tools_cp is a fixture)
from tls_certs import make_pki

TOPIC_COMMAND = "org.apache.kafka.tools.TopicCommand"
CONFIG_COMMAND = "kafka.admin.ConfigCommand"
PRODUCER_PERF = "org.apache.kafka.tools.ProducerPerformance"
CONSOLE_CONSUMER = "org.apache.kafka.tools.consumer.ConsoleConsumer"


class SecureBroker:
    def __init__(self, broker, pki, ports):
        self.broker = broker
        self.pki = pki
        self.plaintext, self.ssl, self.sasl_ssl, self.sasl_plaintext = ports

    def client(self, protocol: str, **extra) -> dict:
        port = {"SSL": self.ssl, "SASL_SSL": self.sasl_ssl, "SASL_PLAINTEXT": self.sasl_plaintext}[protocol]
        conf = {"bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": protocol}
        if "SSL" in protocol:
            conf["ssl.ca.location"] = str(self.pki.ca)
        conf.update(extra)
        return conf

    def admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.broker.bootstrap})


def start_secure_broker(broker_factory, tmp_path, *extra):
    pki = make_pki(tmp_path / "pki")
    ports = [free_port() for _ in range(4)]
    listeners = ",".join(
        f"{name}://127.0.0.1:{port}"
        for name, port in zip(["PLAINTEXT", "SSL", "SASL_SSL", "SASL_PLAINTEXT"], ports)
    )
    broker = broker_factory(
        extra_args=[
            "--override", f"listeners={listeners}",
            "--override", f"ssl.keystore.location={pki.server}",
            "--override", "sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
            *extra,
        ],
        port=ports[0],
    )
    return SecureBroker(broker, pki, ports)


@pytest.fixture
def secure(broker_factory, tmp_path):
    return start_secure_broker(broker_factory, tmp_path)


def add_user(admin: AdminClient, user: str, password: str, mechanisms=(ScramMechanism.SCRAM_SHA_256,)):
    upserts = [UserScramCredentialUpsertion(user, ScramCredentialInfo(m, 4096), password.encode()) for m in mechanisms]
    for future in admin.alter_user_scram_credentials(upserts).values():
        future.result(timeout=10)


def produce(conf: dict, topic: str, values: list[bytes]) -> None:
    errors = []
    producer = Producer(dict(conf, **{"error_cb": lambda e: errors.append(e.str()), "acks": "all"}))
    delivered = []
    for value in values:
        producer.produce(topic, value, on_delivery=lambda err, msg: delivered.append(err and err.str()))
    remaining = producer.flush(20)
    assert remaining == 0 and delivered == [None] * len(values), f"delivery failed: {delivered} errors={errors}"


def consume(conf: dict, topic: str, count: int, group: str = "reader") -> list[bytes]:
    consumer = Consumer(dict(conf, **{"group.id": f"{group}-{topic}", "auto.offset.reset": "earliest"}))
    consumer.subscribe([topic])
    got = []
    deadline = time.monotonic() + 30
    while len(got) < count and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            got.append(msg.value())
    consumer.close()
    return got


def first_error(conf: dict, topic: str, wait_s: float = 5.0):
    """Produces once and returns the first error the client reports (None if it succeeded)."""
    errors = []
    producer = Producer(dict(conf, **{"error_cb": lambda e: errors.append(e.str()),
                                      "message.timeout.ms": int(wait_s * 1000)}))
    delivered = []
    try:
        producer.produce(topic, b"x", on_delivery=lambda err, msg: delivered.append(err and err.str()))
    except KafkaException as refused:
        # The client already knows the topic is refused (its metadata said so): it says so at once.
        return refused.args[0].str()
    # Returns at the first report: a refused login is reported at once, while waiting for the
    # undeliverable message to time out would cost the whole `wait_s`.
    deadline = time.monotonic() + wait_s + 2
    while not errors and not delivered and time.monotonic() < deadline:
        producer.poll(0.05)
    producer.purge()
    if errors:
        return errors[0]
    return delivered[0] if delivered else "no answer"


def test_librdkafka_over_tls_sees_only_the_tls_listener(secure):
    conf = secure.client("SSL")
    admin = AdminClient(conf)
    brokers = admin.list_topics(timeout=10).brokers
    assert [(b.host, b.port) for b in brokers.values()] == [("127.0.0.1", secure.ssl)]
    produce(conf, "tls-topic", [b"a", b"b", b"c"])
    assert consume(conf, "tls-topic", 3) == [b"a", b"b", b"c"]
    # The same records over plaintext: one log, several listeners.
    plaintext = {"bootstrap.servers": secure.broker.bootstrap}
    assert consume(plaintext, "tls-topic", 3, group="plaintext-reader") == [b"a", b"b", b"c"]


def test_untrusted_broker_certificate_is_refused_by_the_client(secure):
    error = first_error(secure.client("SSL", **{"ssl.ca.location": str(secure.pki.other_ca)}), "t")
    assert error is not None and error != "no answer"
    assert "certificate verify failed" in str(error), error


def test_plaintext_client_on_a_tls_listener_gets_no_kafka_answer(secure):
    with socket.create_connection(("127.0.0.1", secure.ssl), timeout=5) as sock:
        sock.sendall(kw.frame(kw.request_header(18, 0, 1)))
        # The bytes are not a TLS ClientHello: the broker closes (maybe after a TLS alert).
        data = kw.wait_closed(sock)
        assert not data or data[0] == 0x15, data[:16]  # 0x15: TLS alert record


@pytest.mark.parametrize(
    "protocol,mechanism",
    [("SASL_SSL", "SCRAM-SHA-256"), ("SASL_SSL", "SCRAM-SHA-512"), ("SASL_PLAINTEXT", "PLAIN")],
)
def test_sasl_round_trip_and_wrong_password(secure, protocol, mechanism):
    add_user(secure.admin(), "alice", "alice-secret", [ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512])
    conf = secure.client(protocol, **{"sasl.mechanism": mechanism, "sasl.username": "alice",
                                      "sasl.password": "alice-secret"})
    topic = f"sasl-{mechanism.lower()}"
    produce(conf, topic, [b"one", b"two"])
    assert consume(conf, topic, 2) == [b"one", b"two"]

    wrong = dict(conf, **{"sasl.password": "alice-secreT"})
    error = first_error(wrong, topic)
    assert error is not None and error != "no answer"
    assert "SASL authentication error" in str(error) and "Authentication failed" in str(error), error
    unknown = dict(conf, **{"sasl.username": "mallory"})
    assert "Authentication failed" in str(first_error(unknown, topic))


def test_scram_mechanism_needs_its_own_credential(secure):
    add_user(secure.admin(), "bob", "bob-secret", [ScramMechanism.SCRAM_SHA_256])
    base = {"sasl.username": "bob", "sasl.password": "bob-secret"}
    assert first_error(secure.client("SASL_SSL", **base, **{"sasl.mechanism": "SCRAM-SHA-256"}), "t") is None
    error = first_error(secure.client("SASL_SSL", **base, **{"sasl.mechanism": "SCRAM-SHA-512"}), "t")
    assert "Authentication failed" in str(error), error


def test_scram_users_described_and_deleted(secure):
    admin = secure.admin()
    add_user(admin, "carol", "carol-secret", [ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512])
    described = admin.describe_user_scram_credentials(["carol"])["carol"].result(timeout=10)
    infos = sorted((i.mechanism, i.iterations) for i in described.scram_credential_infos)
    assert infos == [(ScramMechanism.SCRAM_SHA_256, 4096), (ScramMechanism.SCRAM_SHA_512, 4096)]

    conf = secure.client("SASL_SSL", **{"sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "carol",
                                        "sasl.password": "carol-secret"})
    assert first_error(conf, "t") is None
    for future in admin.alter_user_scram_credentials(
        [UserScramCredentialDeletion("carol", ScramMechanism.SCRAM_SHA_256)]
    ).values():
        future.result(timeout=10)
    assert "Authentication failed" in str(first_error(conf, "t"))

    # Kafka's errors for what cannot be done.
    with pytest.raises(Exception, match="RESOURCE_NOT_FOUND|does not exist"):
        admin.describe_user_scram_credentials(["nobody"])["nobody"].result(timeout=10)
    with pytest.raises(Exception, match="RESOURCE_NOT_FOUND|does not exist"):
        for f in admin.alter_user_scram_credentials(
            [UserScramCredentialDeletion("nobody", ScramMechanism.SCRAM_SHA_256)]
        ).values():
            f.result(timeout=10)
    too_few = UserScramCredentialUpsertion(
        "dave", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 1000), b"dave-secret"
    )
    with pytest.raises(Exception, match="UNACCEPTABLE_CREDENTIAL|Too few iterations"):
        for f in admin.alter_user_scram_credentials([too_few]).values():
            f.result(timeout=10)


def test_credentials_survive_a_restart_in_a_file_only_their_owner_reads(secure):
    import os
    import stat

    add_user(secure.admin(), "erin", "erin-secret")
    store = secure.broker.data_dir / "meta" / "security.json"
    assert stat.S_IMODE(os.stat(store).st_mode) == 0o600
    secure.broker.kill()
    # One copied in readable by others is made its owner's only at start.
    os.chmod(store, 0o644)
    secure.broker.start()
    assert stat.S_IMODE(os.stat(store).st_mode) == 0o600
    conf = secure.client("SASL_SSL", **{"sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "erin",
                                        "sasl.password": "erin-secret"})
    assert first_error(conf, "t") is None


def sasl_port_answer(port: int, api_key: int, body: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(kw.frame(kw.request_header(api_key, 0 if api_key != 17 else 1, 7) + body))
        return kw.wait_closed(sock)


def test_requests_before_authentication_close_the_connection(secure):
    # Metadata v0 (all topics) on the SASL_PLAINTEXT listener before any SASL exchange.
    assert sasl_port_answer(secure.sasl_plaintext, 3, struct.pack(">i", -1)) == b""
    # A handshake with a mechanism that is not enabled: UNSUPPORTED_SASL_MECHANISM, then closed.
    mechanism = b"GSSAPI"
    answer = sasl_port_answer(secure.sasl_plaintext, 17, struct.pack(">h", len(mechanism)) + mechanism)
    size, correlation_id, error_code = struct.unpack(">iih", answer[:10])
    assert (size, correlation_id, error_code) == (len(answer) - 4, 7, 33), answer


def test_java_client_scram_over_tls_with_kafka_tools(secure, tools_cp, tmp_path):  # noqa: F811
    admin_bootstrap = secure.broker.bootstrap
    res = run_java(tools_cp, CONFIG_COMMAND, [
        "--bootstrap-server", admin_bootstrap, "--alter", "--add-config",
        "SCRAM-SHA-512=[iterations=8192,password=frank-secret]", "--entity-type", "users", "--entity-name", "frank",
    ], timeout=120)
    assert res.returncode == 0, res.report()
    # (kafka-configs --describe of users also asks for client quotas, not served yet: the
    # credential is checked with librdkafka's describe in test_scram_users_described_and_deleted.)

    def client_config(name: str, password: str, truststore) -> str:
        path = tmp_path / name
        path.write_text(
            "security.protocol=SASL_SSL\n"
            "sasl.mechanism=SCRAM-SHA-512\n"
            "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="frank" password="{password}";\n'
            "ssl.truststore.type=PEM\n"
            f"ssl.truststore.location={truststore}\n"
        )
        return str(path)

    good = client_config("good.properties", "frank-secret", secure.pki.ca)
    bootstrap = f"127.0.0.1:{secure.sasl_ssl}"
    res = run_java(tools_cp, PRODUCER_PERF, [
        "--topic", "java-sasl", "--num-records", "2000", "--record-size", "100", "--throughput", "-1",
        "--producer-props", f"bootstrap.servers={bootstrap}", "acks=all", "--producer.config", good,
    ], timeout=120)
    assert res.returncode == 0 and "2000 records sent" in res.stdout, f"{res.report()}\n{secure.broker.log()[-3000:]}"
    res = run_java(tools_cp, CONSOLE_CONSUMER, [
        "--bootstrap-server", bootstrap, "--topic", "java-sasl", "--from-beginning", "--max-messages", "2000",
        "--timeout-ms", "30000", "--command-config", good,
    ], timeout=120)
    assert res.returncode == 0 and "Processed a total of 2000 messages" in res.stdout + res.stderr, res.report()

    wrong = client_config("wrong.properties", "frank-secreT", secure.pki.ca)
    res = run_java(tools_cp, TOPIC_COMMAND, ["--bootstrap-server", bootstrap, "--list", "--command-config", wrong],
                   timeout=120)
    assert res.returncode != 0 and "SaslAuthenticationException" in res.stdout + res.stderr, res.report()
    assert "invalid credentials with SASL mechanism SCRAM-SHA-512" in res.stdout + res.stderr, res.report()

    untrusted = client_config("untrusted.properties", "frank-secret", secure.pki.other_ca)
    res = run_java(tools_cp, TOPIC_COMMAND, ["--bootstrap-server", bootstrap, "--list", "--command-config", untrusted],
                   timeout=120)
    assert res.returncode != 0 and "SSLHandshakeException" in res.stdout + res.stderr, res.report()


def test_mutual_tls_requires_a_trusted_client_certificate(broker_factory, tmp_path):
    secure = start_secure_broker(
        broker_factory, tmp_path, "--override", "ssl.client.auth=required",
        "--override", f"ssl.truststore.location={tmp_path / 'pki' / 'ca.pem'}",
        "--override", "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "--override", "super.users=User:ANONYMOUS",
    )
    # The certificate's subject is the principal (Kafka's default principal mapping).
    principal = "User:CN=sluice-test-client"
    bindings = [
        AclBinding(ResourceType.TOPIC, "mtls", ResourcePatternType.LITERAL, principal, "*", AclOperation.ALL,
                   AclPermissionType.ALLOW),
        AclBinding(ResourceType.GROUP, "reader-", ResourcePatternType.PREFIXED, principal, "*", AclOperation.READ,
                   AclPermissionType.ALLOW),
    ]
    admin = secure.admin()
    for future in admin.create_acls(bindings).values():
        future.result(timeout=10)
    with_cert = secure.client("SSL", **{"ssl.certificate.location": str(secure.pki.client_cert),
                                        "ssl.key.location": str(secure.pki.client_key)})
    produce(with_cert, "mtls", [b"signed"])
    assert consume(with_cert, "mtls", 1) == [b"signed"]
    assert first_error(with_cert, "not-granted") == "Broker: Topic authorization failed"
    error = first_error(secure.client("SSL"), "mtls")
    assert error is not None and error != "no answer", error
    # Python's own TLS stack, to see the broker's refusal rather than a client's guess.
    context = ssl.create_default_context(cafile=str(secure.pki.ca))
    with socket.create_connection(("127.0.0.1", secure.ssl), timeout=5) as raw:
        with pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError)):
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                tls.sendall(kw.frame(kw.request_header(18, 0, 1)))
                if not tls.recv(4):
                    raise ConnectionResetError("closed without an answer")


def test_principal_mapping_rules_name_certificate_users_as_kafka_does(broker_factory, tmp_path):
    """`ssl.principal.mapping.rules` turns `CN=sluice-test-client` into `User:sluice-test-client`
    (an ACL for that name lets it produce); with rules none of which applies, the client is
    refused rather than given another name."""
    ca = tmp_path / "pki" / "ca.pem"
    mtls = ("--override", "ssl.client.auth=required", "--override", f"ssl.truststore.location={ca}",
            "--override", "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "--override", "super.users=User:ANONYMOUS")
    secure = start_secure_broker(broker_factory, tmp_path, *mtls,
                                 "--override", r"ssl.principal.mapping.rules=RULE:^CN=([^,]*)$/$1/L,DEFAULT")
    binding = AclBinding(ResourceType.TOPIC, "mapped", ResourcePatternType.LITERAL, "User:sluice-test-client", "*",
                         AclOperation.ALL, AclPermissionType.ALLOW)
    admin = secure.admin()
    for future in admin.create_acls([binding]).values():
        future.result(timeout=10)
    with_cert = secure.client("SSL", **{"ssl.certificate.location": str(secure.pki.client_cert),
                                        "ssl.key.location": str(secure.pki.client_key)})
    produce(with_cert, "mapped", [b"mapped"])
    secure.broker.stop()

    refusing = start_secure_broker(broker_factory, tmp_path / "refusing", *mtls[:2],
                                   "--override", f"ssl.truststore.location={tmp_path / 'refusing' / 'pki' / 'ca.pem'}",
                                   "--override", r"ssl.principal.mapping.rules=RULE:^CN=(.*),O=acme$/$1/")
    with_cert = refusing.client("SSL", **{"ssl.certificate.location": str(refusing.pki.client_cert),
                                          "ssl.key.location": str(refusing.pki.client_key)})
    error = first_error(with_cert, "mapped")
    assert error is not None, "a certificate no rule applies to was served"
    assert "no ssl.principal.mapping.rules rule applies" in refusing.broker.log()


@pytest.mark.parametrize(
    "override,expected",
    [
        ("ssl.keystore.type=JKS", "is not supported; Sluice reads PEM"),
        ("ssl.keystore.location=/nonexistent/server.pem", "ssl.keystore.location /nonexistent/server.pem"),
        ("ssl.client.auth=sometimes", "must be none, requested or required"),
        ("sasl.enabled.mechanisms=GSSAPI", "\"GSSAPI\" is not supported"),
        ("sasl.enabled.mechanisms=OAUTHBEARER", "OAUTHBEARER needs sasl.oauthbearer.jwks.endpoint.url"),
        ("listener.security.protocol.map=PLAINTEXT:PLAINTEXT", "has no entry in listener.security.protocol.map"),
        ("ssl.principal.mapping.rules=RULE:(/x/", "bad pattern"),
    ],
)
def test_bad_security_configs_stop_the_start_with_the_reason(tmp_path, override, expected):
    import subprocess

    from conftest import SLUICE_BIN

    pki = make_pki(tmp_path / "pki")
    port, tls_port = free_port(), free_port()
    args = [
        SLUICE_BIN, "serve", "--data-dir", str(tmp_path / "data"),
        "--override", f"listeners=PLAINTEXT://127.0.0.1:{port},SASL_SSL://127.0.0.1:{tls_port}",
        "--override", f"ssl.keystore.location={pki.server}",
        "--override", override,
    ]
    res = subprocess.run(args, capture_output=True, text=True, timeout=30)
    assert res.returncode != 0
    assert expected in res.stderr + res.stdout, res.stderr + res.stdout


def _b64url(data: bytes) -> str:
    import base64

    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def signed_jwt(key, kid: str, claims: dict) -> str:
    """An RS256 JWT as an identity provider issues it."""
    import json

    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding

    header = {"alg": "RS256", "typ": "JWT", "kid": kid}
    signing_input = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
    signature = key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
    return f"{signing_input}.{_b64url(signature)}"


def public_jwk(key, kid: str) -> dict:
    numbers = key.public_key().public_numbers()
    n = numbers.n.to_bytes((numbers.n.bit_length() + 7) // 8, "big")
    e = numbers.e.to_bytes((numbers.e.bit_length() + 7) // 8, "big")
    return {"kty": "RSA", "kid": kid, "use": "sig", "alg": "RS256", "n": _b64url(n), "e": _b64url(e)}


def test_oauthbearer_accepts_tokens_signed_by_the_identity_provider(broker_factory, tmp_path):
    """SASL/OAUTHBEARER with librdkafka (`oauth_cb`): a token signed by a key of the
    configured JWK set, for the expected audience and issuer, authenticates as its `sub`,
    which ACLs then apply to; another key's signature, an expired token or another audience
    is refused with SASL_AUTHENTICATION_FAILED; a rotated key set is picked up without a
    restart."""
    import json

    from cryptography.hazmat.primitives.asymmetric import rsa

    idp = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [public_jwk(idp, "k1")]}))
    port, sasl_port = free_port(), free_port()
    broker = broker_factory(extra_args=[
        "--override", f"listeners=PLAINTEXT://127.0.0.1:{port},SASL_PLAINTEXT://127.0.0.1:{sasl_port}",
        "--override", "sasl.enabled.mechanisms=OAUTHBEARER",
        "--override", f"sasl.oauthbearer.jwks.endpoint.url=file://{jwks}",
        "--override", "sasl.oauthbearer.expected.audience=sluice",
        "--override", "sasl.oauthbearer.expected.issuer=https://idp.example",
        "--override", "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "--override", "super.users=User:ANONYMOUS",
    ], port=port)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("oauth-t", 1)])["oauth-t"].result(timeout=10)
    bindings = [
        AclBinding(ResourceType.TOPIC, "oauth-t", ResourcePatternType.LITERAL, "User:alice", "*", AclOperation.ALL,
                   AclPermissionType.ALLOW),
        AclBinding(ResourceType.GROUP, "oauth", ResourcePatternType.PREFIXED, "User:alice", "*", AclOperation.READ,
                   AclPermissionType.ALLOW),
    ]
    for future in admin.create_acls(bindings).values():
        future.result(timeout=10)

    now = int(time.time())

    def claims(**changes):
        return {"sub": "alice", "iss": "https://idp.example", "aud": "sluice", "iat": now, "exp": now + 3600,
                **changes}

    def conf(token: str) -> dict:
        return {"bootstrap.servers": f"127.0.0.1:{sasl_port}", "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanisms": "OAUTHBEARER", "oauth_cb": lambda _config: (token, now + 3600)}

    alice = signed_jwt(idp, "k1", claims())
    produce(conf(alice), "oauth-t", [b"one", b"two"])
    assert consume(conf(alice), "oauth-t", 2, group="oauth") == [b"one", b"two"]
    # The principal is the token's subject: bob has no ACL on the topic.
    bob = signed_jwt(idp, "k1", claims(sub="bob"))
    assert "authorization failed" in first_error(conf(bob), "oauth-t").lower()
    refused = {
        "another key": signed_jwt(other, "k1", claims()),
        "expired": signed_jwt(idp, "k1", claims(exp=now - 3600)),
        "another audience": signed_jwt(idp, "k1", claims(aud="someone-else")),
        "another issuer": signed_jwt(idp, "k1", claims(iss="https://evil.example")),
    }
    for why, token in refused.items():
        error = first_error(conf(token), "oauth-t")
        assert "Authentication failed" in error, f"{why}: {error}"

    # The provider rotates its key: the new key set is read without a restart.
    time.sleep(0.01)
    jwks.write_text(json.dumps({"keys": [public_jwk(other, "k2")]}))
    produce(conf(signed_jwt(other, "k2", claims())), "oauth-t", [b"three"])
    assert "Authentication failed" in first_error(conf(alice), "oauth-t")


def test_sessions_end_unless_clients_reauthenticate(broker_factory, tmp_path):
    """KIP-368 with `connections.max.reauth.ms`: librdkafka re-authenticates on its open
    connections and keeps producing; a client that does not is disconnected at its first
    request after the session lifetime the broker announced."""
    secure = start_secure_broker(broker_factory, tmp_path, "--override", "connections.max.reauth.ms=2000")
    add_user(secure.admin(), "alice", "alice-secret")
    conf = secure.client("SASL_PLAINTEXT", **{"sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "alice",
                                               "sasl.password": "alice-secret"})
    errors, delivered = [], []
    producer = Producer(dict(conf, **{"error_cb": lambda e: errors.append(e.str()), "linger.ms": 5}))
    deadline = time.monotonic() + 7
    while time.monotonic() < deadline:  # several session lifetimes on the same connections
        producer.produce("reauth-t", b"x", on_delivery=lambda err, msg: delivered.append(err))
        producer.poll(0.05)
    assert producer.flush(20) == 0
    assert delivered and all(err is None for err in delivered), [e for e in delivered if e][:3]
    assert not errors, errors[:3]
    assert "SASL session expired" not in secure.broker.log()

    with kw.Conn("127.0.0.1", secure.sasl_plaintext) as conn:
        assert conn.request(17, 1, kw.Writer().string("PLAIN").getvalue()).i16() == 0
        answer = conn.request(36, 1, kw.Writer().bytes_(b"\0alice\0alice-secret").getvalue())
        assert answer.i16() == 0
        answer.string()  # error message
        answer.bytes_()  # server bytes
        assert 0 < answer.i64() <= 2000, "no session lifetime announced"
        assert conn.metadata(None) is not None  # within the session: served
        time.sleep(2.3)
        with pytest.raises((kw.ConnectionClosed, ConnectionResetError)):
            conn.metadata(None)
