"""Connections that cannot starve the broker: what one client (or many from one address)
may hold before and after authenticating, and for how long.

Each test runs a real `sluice serve` with a PLAINTEXT listener (where the operator manages
SCRAM users) and a SASL_PLAINTEXT one, and attacks it over raw sockets the way a hostile
client would: partial frames held open, oversized frames, idle sockets, many sockets from
one address, password guessing, idle connections to the metrics port. Real clients
(confluent-kafka) must keep working throughout.
"""

import re
import resource
import socket
import statistics
import struct
import time
import urllib.request

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

import kafka_wire as kw
from conftest import free_port

SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36
SASL_RECEIVE_SIZE_DEFAULT = 512 * 1024
FLOOD_CONNECTIONS = 2000
# The flood's sockets, the broker's and the clients' descriptors, with room to spare.
FLOOD_FILES_NEEDED = FLOOD_CONNECTIONS + 1000


class SaslBroker:
    def __init__(self, broker, plaintext: int, sasl: int, metrics: int):
        self.broker = broker
        self.plaintext = plaintext
        self.sasl = sasl
        self.metrics = metrics

    def scram(self, user="alice", password="alice-secret", **extra) -> dict:
        conf = {
            "bootstrap.servers": f"127.0.0.1:{self.sasl}",
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.username": user,
            "sasl.password": password,
        }
        conf.update(extra)
        return conf

    def scrape(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics}/metrics", timeout=5) as answer:
            return answer.read().decode()

    def metric(self, name: str, **labels) -> float:
        wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
        pattern = re.escape(name) + (r"\{" + re.escape(wanted) + r"\}" if labels else "") + r" (\S+)$"
        for line in self.scrape().splitlines():
            match = re.match(pattern, line)
            if match:
                return float(match.group(1))
        return 0.0


def start(broker_factory, *overrides: str) -> SaslBroker:
    plaintext, sasl, metrics = free_port(), free_port(), free_port()
    args = [
        "--override", f"listeners=PLAINTEXT://127.0.0.1:{plaintext},SASL_PLAINTEXT://127.0.0.1:{sasl}",
        "--override", "sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
        "--metrics-listen", f"127.0.0.1:{metrics}",
    ]
    for override in overrides:
        args += ["--override", override]
    broker = broker_factory(extra_args=args, port=plaintext)
    return SaslBroker(broker, plaintext, sasl, metrics)


def add_user(sasl_broker: SaslBroker, user: str, password: str) -> None:
    admin = AdminClient({"bootstrap.servers": sasl_broker.broker.bootstrap})
    upserts = [
        UserScramCredentialUpsertion(user, ScramCredentialInfo(mechanism, 4096), password.encode())
        for mechanism in (ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512)
    ]
    for future in admin.alter_user_scram_credentials(upserts).values():
        future.result(timeout=10)


def raise_open_files_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"needs {needed} open files, the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def api_versions(sock: socket.socket, correlation_id: int = 1) -> int:
    """Sends ApiVersions v0 and returns its error code (raises if the broker closed)."""
    sock.sendall(kw.frame(kw.request_header(18, 0, correlation_id)))
    size = struct.unpack(">i", kw.recv_exact(sock, 4))[0]
    answer = kw.recv_exact(sock, size)
    assert struct.unpack(">i", answer[:4])[0] == correlation_id
    return struct.unpack(">h", answer[4:6])[0]


def sasl_handshake(sock: socket.socket, mechanism: str) -> int:
    """SaslHandshake v1 (SaslAuthenticate carries the tokens); returns its error code."""
    name = mechanism.encode()
    sock.sendall(kw.frame(kw.request_header(SASL_HANDSHAKE, 1, 2) + struct.pack(">h", len(name)) + name))
    size = struct.unpack(">i", kw.recv_exact(sock, 4))[0]
    return struct.unpack(">h", kw.recv_exact(sock, size)[4:6])[0]


def sasl_authenticate_send(sock: socket.socket, token: bytes) -> None:
    sock.sendall(kw.frame(kw.request_header(SASL_AUTHENTICATE, 0, 3) + struct.pack(">i", len(token)) + token))


def sasl_authenticate_answer(sock: socket.socket) -> tuple[int, bytes]:
    """(error code, auth bytes) of a SaslAuthenticate v0 answer."""
    size = struct.unpack(">i", kw.recv_exact(sock, 4))[0]
    answer = kw.recv_exact(sock, size)
    error_code, message_len = struct.unpack(">hh", answer[4:8])
    rest = answer[8 + max(message_len, 0):]
    token_len = struct.unpack(">i", rest[:4])[0]
    return error_code, rest[4:4 + token_len]


def plain_attempt_seconds(port: int, user: str, password: str) -> tuple[float, int]:
    """One PLAIN login on a fresh connection: (seconds until the answer, error code)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        assert sasl_handshake(sock, "PLAIN") == 0
        started = time.monotonic()
        sasl_authenticate_send(sock, f"\0{user}\0{password}".encode())
        error_code, _ = sasl_authenticate_answer(sock)
        return time.monotonic() - started, error_code


def partial_frame(claimed_bytes: int) -> bytes:
    """A size prefix and the first two bytes of the frame it announces (an API key)."""
    return struct.pack(">ih", claimed_bytes, SASL_HANDSHAKE)


def open_holding(port: int, count: int, payload: bytes) -> list[socket.socket]:
    held = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(payload)
        held.append(sock)
    return held


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def no_connections_open(secured: SaslBroker) -> None:
    """Waits until the start-up probe's connection (accepted by the broker perhaps only
    after the probe closed it) is gone, so the test's own connections are all counted."""
    time.sleep(0.5)
    wait_for(lambda: secured.metric("sluice_connections") == 0, 5, "no connection open")


def test_unauthenticated_partial_frames_do_not_starve_authenticated_clients(broker_factory):
    raise_open_files_limit(FLOOD_FILES_NEEDED)
    secured = start(broker_factory)
    add_user(secured, "alice", "alice-secret")
    kw.create_topic(secured.broker.bootstrap, "flooded", 1)
    held = open_holding(secured.sasl, FLOOD_CONNECTIONS, partial_frame(SASL_RECEIVE_SIZE_DEFAULT))
    try:
        wait_for(lambda: secured.metric("sluice_connections") >= FLOOD_CONNECTIONS, 30, "the flood to be accepted")
        # Frames before authentication are not charged to queued.max.request.bytes.
        assert secured.metric("sluice_queued_request_bytes") < SASL_RECEIVE_SIZE_DEFAULT

        delivered = []
        started = time.monotonic()
        producer = Producer(secured.scram(**{"acks": "all", "message.timeout.ms": 5000}))
        producer.produce("flooded", b"through", on_delivery=lambda err, msg: delivered.append(err))
        assert producer.flush(5) == 0 and delivered == [None], delivered
        elapsed = time.monotonic() - started
        assert elapsed < 1.0, f"an authenticated producer took {elapsed:.2f}s to login and produce"

        admin = AdminClient({"bootstrap.servers": secured.broker.bootstrap})
        assert "flooded" in admin.list_topics(timeout=5).topics
        scram_admin = AdminClient(secured.scram())
        assert "flooded" in scram_admin.list_topics(timeout=5).topics
    finally:
        for sock in held:
            sock.close()


def test_a_pre_auth_frame_above_the_receive_size_is_refused_and_logged_at_a_rate_limit(broker_factory):
    secured = start(broker_factory)
    attempts = 50
    for _ in range(attempts):
        with socket.create_connection(("127.0.0.1", secured.sasl), timeout=5) as sock:
            sock.sendall(partial_frame(SASL_RECEIVE_SIZE_DEFAULT + 1))
            assert kw.wait_closed(sock) == b"", "the broker answered an oversized unauthenticated frame"
    # A frame of exactly the limit is taken (and waits for the rest).
    with socket.create_connection(("127.0.0.1", secured.sasl), timeout=5) as sock:
        sock.sendall(partial_frame(SASL_RECEIVE_SIZE_DEFAULT))
        with pytest.raises(TimeoutError):
            kw.wait_closed(sock, timeout=1)
    log = secured.broker.log()
    refusals = [line for line in log.splitlines() if "sasl.server.max.receive.size" in line]
    assert refusals, f"no refusal naming sasl.server.max.receive.size in the log:\n{log[-3000:]}"
    assert len(refusals) < attempts / 5, f"{len(refusals)} log lines for {attempts} refusals: not rate limited"
    assert secured.metric("sluice_connections_closed_total", reason="unauthenticated_frame_too_large") == attempts


def test_a_request_not_completed_within_the_read_timeout_closes_its_connection(broker_factory):
    secured = start(broker_factory, "request_read_timeout_ms=1000")
    with socket.create_connection(("127.0.0.1", secured.plaintext), timeout=5) as sock:
        # Announces a 50 MiB Metadata request, then trickles a byte every 200 ms.
        started = time.monotonic()
        sock.sendall(struct.pack(">ih", 50 << 20, 3))
        wait_for(lambda: secured.metric("sluice_queued_request_bytes") >= 50 << 20, 5, "the request to be charged")
        closed = False
        while time.monotonic() - started < 5:
            try:
                sock.sendall(b"\0")
            except OSError:
                closed = True
                break
            sock.settimeout(0.2)
            try:
                if sock.recv(1) == b"":
                    closed = True
                    break
            except socket.timeout:
                pass
        assert closed, "a slow sender held its request open past request_read_timeout_ms"
        assert time.monotonic() - started >= 0.9, "closed before request_read_timeout_ms"
    wait_for(lambda: secured.metric("sluice_queued_request_bytes") == 0, 5, "the charge to be released")


def test_idle_connections_are_closed_after_connections_max_idle_ms(broker_factory):
    secured = start(broker_factory, "connections.max.idle.ms=1000")
    with socket.create_connection(("127.0.0.1", secured.plaintext)) as idle, \
            socket.create_connection(("127.0.0.1", secured.plaintext)) as busy:
        started = time.monotonic()
        for correlation_id in range(8):
            assert api_versions(busy, correlation_id) == 0
            time.sleep(0.3)
        # The busy one, used every 300 ms for 2.4 s, is still open; the idle one was closed.
        assert api_versions(busy, 99) == 0
        assert kw.wait_closed(idle, timeout=0.1) == b""
        assert time.monotonic() - started > 1.0
    with socket.create_connection(("127.0.0.1", secured.sasl)) as unauthenticated:
        started = time.monotonic()
        assert kw.wait_closed(unauthenticated, timeout=5) == b""
        assert 0.8 <= time.monotonic() - started < 4


def test_max_connections_per_ip_refuses_the_next_connection_from_that_address(broker_factory):
    secured = start(broker_factory, "max.connections.per.ip=3")
    no_connections_open(secured)
    refused_before = secured.metric("sluice_connections_refused_total", reason="max_connections_per_ip")
    held = [socket.create_connection(("127.0.0.1", secured.plaintext), timeout=5) for _ in range(3)]
    try:
        for sock in held:
            assert api_versions(sock) == 0
        with socket.create_connection(("127.0.0.1", secured.plaintext), timeout=5) as refused:
            assert kw.wait_closed(refused) == b"", "connection 4 from one address was served"
        # The SASL listener counts against the same address.
        with socket.create_connection(("127.0.0.1", secured.sasl), timeout=5) as refused:
            assert kw.wait_closed(refused) == b""
        for sock in held:
            assert api_versions(sock, 2) == 0, "an admitted connection stopped working"
        held.pop().close()
        time.sleep(0.2)
        held.append(socket.create_connection(("127.0.0.1", secured.plaintext), timeout=5))
        assert api_versions(held[-1]) == 0, "a freed slot was not given to the next connection"
    finally:
        for sock in held:
            sock.close()
    refused = secured.metric("sluice_connections_refused_total", reason="max_connections_per_ip") - refused_before
    assert refused == 2
    assert "max.connections.per.ip" in secured.broker.log()


def test_per_ip_overrides_raise_the_limit_for_one_address(broker_factory):
    secured = start(broker_factory, "max.connections.per.ip=1", "max.connections.per.ip.overrides=127.0.0.1:4")
    no_connections_open(secured)
    held = [socket.create_connection(("127.0.0.1", secured.plaintext), timeout=5) for _ in range(4)]
    try:
        for sock in held:
            assert api_versions(sock) == 0
        with socket.create_connection(("127.0.0.1", secured.plaintext), timeout=5) as refused:
            assert kw.wait_closed(refused) == b""
    finally:
        for sock in held:
            sock.close()


def test_a_failed_login_is_answered_after_the_delay_then_closed(broker_factory):
    secured = start(broker_factory, "connection.failed.authentication.delay.ms=500")
    add_user(secured, "alice", "alice-secret")
    for user, password in [("alice", "wrong"), ("mallory", "wrong")]:
        with socket.create_connection(("127.0.0.1", secured.sasl), timeout=10) as sock:
            assert sasl_handshake(sock, "PLAIN") == 0
            started = time.monotonic()
            sasl_authenticate_send(sock, f"\0{user}\0{password}".encode())
            error_code, _ = sasl_authenticate_answer(sock)
            elapsed = time.monotonic() - started
            assert error_code == 58, error_code  # SASL_AUTHENTICATION_FAILED
            assert elapsed >= 0.5, f"{user}: the failure arrived after {elapsed:.3f}s"
            assert kw.wait_closed(sock) == b""
    # The right password is not delayed.
    elapsed, error_code = plain_attempt_seconds(secured.sasl, "alice", "alice-secret")
    assert error_code == 0 and elapsed < 0.5, (error_code, elapsed)


def test_login_timing_and_answers_do_not_tell_which_users_exist(broker_factory):
    secured = start(broker_factory, "connection.failed.authentication.delay.ms=0")
    add_user(secured, "alice", "alice-secret")
    known, unknown = [], []
    for _ in range(15):
        known.append(plain_attempt_seconds(secured.sasl, "alice", "wrong")[0])
        unknown.append(plain_attempt_seconds(secured.sasl, "mallory", "wrong")[0])
    known_s, unknown_s = statistics.median(known), statistics.median(unknown)
    assert unknown_s >= 0.6 * known_s, f"unknown user {unknown_s * 1000:.2f} ms, known {known_s * 1000:.2f} ms"
    # SCRAM: an unknown user gets a server-first message too, and fails only at the proof.
    with socket.create_connection(("127.0.0.1", secured.sasl), timeout=10) as sock:
        assert sasl_handshake(sock, "SCRAM-SHA-256") == 0
        sasl_authenticate_send(sock, b"n,,n=mallory,r=abcdefgh")
        error_code, server_first = sasl_authenticate_answer(sock)
        assert error_code == 0 and server_first.startswith(b"r=abcdefgh") and b",i=4096" in server_first


def test_metrics_endpoint_answers_while_idle_connections_are_held(broker_factory):
    secured = start(broker_factory)
    held = [socket.create_connection(("127.0.0.1", secured.metrics), timeout=5) for _ in range(32)]
    try:
        time.sleep(0.5)
        for path in ["/healthz", "/metrics"]:
            with urllib.request.urlopen(f"http://127.0.0.1:{secured.metrics}{path}", timeout=3) as answer:
                assert answer.status == 200
    finally:
        for sock in held:
            sock.close()


@pytest.mark.parametrize("override,expected", [
    ("max.connections.per.ip.overrides=localhost:3", "not an IP address"),
    ("max.connections.per.ip=0", "max.connections.per.ip may be 0 only with"),
    ("connections.max.idle.ms=0", "connections.max.idle.ms must be at least"),
    ("connection.failed.authentication.delay.ms=700000", "must be below connections.max.idle.ms"),
    ("request_read_timeout_ms=-1", "request_read_timeout_ms"),
])
def test_bad_connection_settings_stop_the_start_with_the_reason(broker_factory, override, expected):
    with pytest.raises(RuntimeError, match=re.escape(expected)):
        start(broker_factory, override)
