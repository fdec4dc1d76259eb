"""Bad input on raw sockets: each case asserts the broker's answer (a Kafka error code, or a
closed connection where Kafka closes it) and that a well-behaved confluent-kafka producer and
consumer running concurrently against the same broker keep working throughout."""

import random
import socket
import struct
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from confluent_kafka import KafkaError, Producer, TopicPartition

import kafka_wire as kw
from kafka_wire import Conn, Record, consume_until, consumer, create_topic, record_batch, wait_closed, wait_for_topic, watermarks


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


class BackgroundTraffic:
    """A producer (acks=all) and a consumer on one partition, round-tripping records every ~20 ms."""

    def __init__(self, bootstrap: str):
        self.bootstrap = bootstrap
        self.topic = unique("bg")
        create_topic(bootstrap, self.topic, 1)
        self.producer = Producer({
            "bootstrap.servers": bootstrap, "broker.address.family": "v4", "acks": "all", "linger.ms": 0,
            "message.timeout.ms": 30000,
        })
        self.consumer = consumer(bootstrap)
        self.consumer.assign([TopicPartition(self.topic, 0, -2)])
        self.sent = 0
        self.acked: list[int] = []
        self.errors: list = []
        self.consumed: list[int] = []
        self.consume_errors: list = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bg-traffic", daemon=True)

    def _on_delivery(self, err, msg):
        if err is not None:
            self.errors.append(err)
        else:
            self.acked.append(int(msg.value()))

    def _poll_consumer(self, timeout: float):
        for m in self.consumer.consume(num_messages=100, timeout=timeout):
            if m.error() is not None:
                if m.error().code() != KafkaError._PARTITION_EOF:
                    self.consume_errors.append(m.error())
                continue
            self.consumed.append(int(m.value()))

    def _run(self):
        while not self._stop.is_set():
            self.producer.produce(self.topic, value=b"%d" % self.sent, on_delivery=self._on_delivery)
            self.sent += 1
            self.producer.poll(0)
            self._poll_consumer(0.02)

    def start(self) -> "BackgroundTraffic":
        self._thread.start()
        self.wait_progress()
        return self

    def wait_progress(self, records: int = 5, timeout: float = 15.0) -> None:
        """Asserts that `records` more records make the full produce -> consume round trip."""
        start = len(self.consumed)
        deadline = time.monotonic() + timeout
        while len(self.consumed) < start + records:
            assert not self.errors, f"background producer errors: {self.errors[:3]}"
            assert not self.consume_errors, f"background consumer errors: {self.consume_errors[:3]}"
            assert time.monotonic() < deadline, (
                f"background client stalled: consumed {len(self.consumed) - start} new records in {timeout}s "
                f"(sent {self.sent}, acked {len(self.acked)})")
            time.sleep(0.02)

    def abort(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.producer.purge()
        self.producer.flush(1)
        self.consumer.close()

    def stop_and_check(self) -> None:
        self._stop.set()
        self._thread.join(10)
        assert self.producer.flush(30) == 0
        deadline = time.monotonic() + 20
        while len(self.consumed) < len(self.acked) and time.monotonic() < deadline:
            self._poll_consumer(0.1)
        self.consumer.close()
        assert not self.errors, f"background producer errors: {self.errors[:3]}"
        assert not self.consume_errors, f"background consumer errors: {self.consume_errors[:3]}"
        assert self.acked == list(range(self.sent)), "every background record acknowledged, in order"
        assert self.consumed == self.acked, "the background consumer read exactly what was acknowledged, in order"


@pytest.fixture
def traffic(broker):
    bg = BackgroundTraffic(broker.bootstrap).start()
    yield bg
    if not broker.is_running():
        bg.abort()
        raise AssertionError(f"broker died (exit {broker.proc.returncode}); log tail:\n{broker.log()[-3000:]}")
    bg.stop_and_check()
    assert "panicked" not in broker.log(), "broker log shows a panic"


def assert_healthy(broker, bg: BackgroundTraffic) -> None:
    assert broker.is_running(), f"broker exited; log:\n{broker.log()}"
    bg.wait_progress()
    assert "panicked" not in broker.log(), f"broker panicked; log:\n{broker.log()}"


def raw_socket(broker) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", broker.port), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def assert_logged_once(broker, port: int) -> None:
    """The broker names a rejected peer in exactly one log line (logged once, not per byte or retry)."""
    needle = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 2
    while True:
        lines = [line for line in broker.log().splitlines() if needle in line]
        if len(lines) >= 1 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    time.sleep(0.1)
    lines = [line for line in broker.log().splitlines() if needle in line]
    assert len(lines) == 1, f"expected one log line about peer {needle}, got {len(lines)}: {lines[:5]}"


def send_and_expect_close(broker, data: bytes, shut_wr: bool = False, timeout: float = 5.0, logged_once: bool = False) -> bytes:
    """Sends `data` and asserts the broker closes the connection; returns what it sent first."""
    with raw_socket(broker) as s:
        if logged_once:
            port = s.getsockname()[1]
            try:
                s.sendall(data)
            except (BrokenPipeError, ConnectionResetError):
                got = b""
            else:
                got = wait_closed(s, timeout)
            assert_logged_once(broker, port)
            return got
        try:
            s.sendall(data)
            if shut_wr:
                s.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            return b""  # already closed by the broker
        return wait_closed(s, timeout)


def vm_hwm_kib(broker) -> int:
    with open(f"/proc/{broker.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM")


def metadata_request_v(broker) -> int:
    with Conn.to(broker.bootstrap) as c:
        return c.pick(kw.METADATA, [4, 5, 6, 7, 8, 1])


# ---------------------------------------------------------------- framing

def test_oversized_frame_closes_without_allocating(broker, traffic):
    hwm_before = vm_hwm_kib(broker)
    # 200 MiB announced, followed by a real header and 1 MiB of the "body": the broker must
    # refuse on the length alone.
    header = kw.request_header(kw.PRODUCE, 3, 1)
    got = send_and_expect_close(broker, struct.pack(">i", 200 << 20) + header + b"\x00" * (1 << 20), logged_once=True)
    assert got == b"", f"broker answered an oversized frame: {got[:64]!r}"
    assert_healthy(broker, traffic)
    # Negative and just-over-the-limit lengths too.
    for n in (-1, -(1 << 31), 104857600 + 1):
        got = send_and_expect_close(broker, struct.pack(">i", n) + header)
        assert got == b"", f"length {n}: got {got[:64]!r}"
    assert_healthy(broker, traffic)
    grown_mib = (vm_hwm_kib(broker) - hwm_before) / 1024
    assert grown_mib < 64, f"peak RSS grew by {grown_mib:.0f} MiB after oversized frames"


def test_max_request_bytes_flag(broker_factory):
    b = broker_factory(extra_args=["--max-request-bytes", str(1 << 20)])
    bg = BackgroundTraffic(b.bootstrap).start()
    topic = unique("maxreq")
    create_topic(b.bootstrap, topic, 1)
    small = record_batch([Record(b"s" * 1000) for _ in range(100)])  # ~100 KiB
    big = record_batch([Record(b"b" * 1000) for _ in range(2000)])  # ~2 MiB
    with Conn.to(b.bootstrap) as c:
        assert c.produce(topic, 0, small)[:2] == (0, 0)
        v = c.pick(kw.PRODUCE, [8, 7, 6, 5, 4, 3])
        try:
            c.send_request(kw.PRODUCE, v, kw.produce_body(v, topic, 0, big))
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed by the broker before we finished sending: what we want
        else:
            assert wait_closed(c.sock) == b"", "a request over --max-request-bytes must close the connection unanswered"
    assert watermarks(b.bootstrap, topic, 0) == (0, 100)
    with Conn.to(b.bootstrap) as c:
        assert c.produce(topic, 0, small)[:2] == (0, 100)
    assert_healthy(b, bg)
    bg.stop_and_check()


def vm_rss_kib(broker) -> int:
    with open(f"/proc/{broker.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def send_what_fits(socks: list[socket.socket], data: bytes, seconds: float) -> None:
    """Writes `data` to every socket for up to `seconds`, as far as each will take it (a
    broker that stops reading a socket fills its TCP window: the write then waits)."""
    for s in socks:
        s.setblocking(False)
    sent = {s: 0 for s in socks}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(n < len(data) for n in sent.values()):
        for s in socks:
            if sent[s] < len(data):
                try:
                    sent[s] += s.send(data[sent[s]:sent[s] + (256 << 10)])
                except BlockingIOError:
                    pass
        time.sleep(0.005)


def test_requests_charged_to_memory_budget_before_bodies_are_buffered(broker_factory):
    """Kafka's queued.max.request.bytes: a request is charged its size as soon as its size
    prefix is read, and a connection that cannot be charged is not read from. 24 clients
    each announce a 1 MiB produce request, send all of it but its last byte, and hang. With a
    2 MiB budget the broker must not buffer 24 MiB (as it did when only whole frames were
    charged); the budget's non-produce share still serves other requests meanwhile, new
    produce requests wait for memory, and all proceed once the hung clients go away."""
    max_request = 1 << 20
    b = broker_factory(extra_args=[
        "--max-request-bytes", str(max_request),
        "--queued-max-request-bytes", str(2 << 20),
    ])
    topic = unique("budget")
    create_topic(b.bootstrap, topic, 1)
    probe = Conn.to(b.bootstrap)
    v = probe.pick(kw.PRODUCE, [8, 7, 6, 5, 4, 3])
    assert probe.produce(topic, 0, record_batch([Record(b"warm-up")]))[:2] == (0, 0)
    time.sleep(0.5)
    rss_before = vm_rss_kib(b)

    stalled_count = 24
    # A produce frame of exactly max_request_bytes, all but its last byte.
    stalled_frame = struct.pack(">i", max_request) + kw.request_header(kw.PRODUCE, 3, 1)
    stalled_frame += b"\x00" * (4 + max_request - len(stalled_frame) - 1)
    stalled = [raw_socket(b) for _ in range(stalled_count)]
    try:
        send_what_fits(stalled, stalled_frame, seconds=3.0)
        time.sleep(1.0)
        grown_mib = (vm_rss_kib(b) - rss_before) / 1024
        assert grown_mib < stalled_count / 3, (
            f"broker RSS grew by {grown_mib:.1f} MiB with {stalled_count} hung 1 MiB requests and a 2 MiB budget")

        # Requests other than Produce still have their share of the budget.
        with Conn.to(b.bootstrap, timeout=5) as c:
            err, versions = c.api_versions(0)
            assert err == 0 and kw.PRODUCE in versions
        # A new produce request is charged too: it waits for memory, unanswered.
        probe.send_request(kw.PRODUCE, v, kw.produce_body(v, topic, 0, record_batch([Record(b"waits")])))
        probe.sock.settimeout(1.5)
        with pytest.raises(socket.timeout):
            probe.sock.recv(1)
    finally:
        for s in stalled:
            s.close()
    # Their memory comes back when they close: the waiting request is answered.
    probe.sock.settimeout(15)
    r = kw.Reader(probe.recv_frame(), False)
    assert r.i32() == probe.correlation_id
    assert kw.parse_produce_response(r, v)[:2] == (0, 1)
    with Conn.to(b.bootstrap) as c:
        assert watermarks(b.bootstrap, topic, 0) == (0, 2)
        assert c.produce(topic, 0, record_batch([Record(b"after")]))[:2] == (0, 2)
    probe.close()
    producer = Producer({"bootstrap.servers": b.bootstrap, "broker.address.family": "v4", "acks": "all"})
    producer.produce(topic, value=b"x" * 500_000)
    assert producer.flush(15) == 0, "a client producing near max_request_bytes is served"
    assert watermarks(b.bootstrap, topic, 0) == (0, 4)
    assert b.is_running(), f"broker exited; log:\n{b.log()}"
    assert "panicked" not in b.log()


def test_large_request_before_sasl_authentication_closes_the_connection(broker_factory):
    """Kafka's sasl.server.max.receive.size: before authenticating, a client may not announce
    a request larger than 512 KiB (the broker would buffer it before knowing who sent it);
    the connection is closed at once, without waiting for the body."""
    from conftest import free_port

    port, sasl_port = free_port(), free_port()
    b = broker_factory(extra_args=[
        "--override", f"listeners=PLAINTEXT://127.0.0.1:{port},SASL_PLAINTEXT://127.0.0.1:{sasl_port}",
    ], port=port)
    handshake = kw.request_header(17, 1, 7)  # SaslHandshake v1
    with socket.create_connection(("127.0.0.1", sasl_port), timeout=10) as s:
        s.sendall(struct.pack(">i", (512 << 10) + 1) + handshake)
        assert wait_closed(s, 5) == b"", "announcing a request over the limit before authentication closes unanswered"
    # At the limit the request is read; a SASL handshake then proceeds as before.
    mechanism = b"SCRAM-SHA-256"
    with socket.create_connection(("127.0.0.1", sasl_port), timeout=10) as s:
        s.sendall(kw.frame(handshake + struct.pack(">h", len(mechanism)) + mechanism))
        size, correlation_id, error_code = struct.unpack(">iih", s.recv(10))
        assert (correlation_id, error_code) == (7, 0)
    # The limit is only for unauthenticated clients: PLAINTEXT clients may send more.
    topic = unique("big")
    create_topic(b.bootstrap, topic, 1)
    with Conn.to(b.bootstrap) as c:
        assert c.produce(topic, 0, record_batch([Record(b"x" * (600 << 10))]))[:2] == (0, 0)
    assert b.is_running()


def test_garbage_bytes_close_connection(broker, traffic):
    # An HTTP request: "GET " read as a length is ~1.1 GiB.
    got = send_and_expect_close(broker, b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n", logged_once=True)
    assert got == b""
    rng = random.Random(1234)
    for _ in range(20):
        body = bytes(rng.randrange(256) for _ in range(64))
        # A plausible length but a nonsense header (api key forced out of range).
        body = struct.pack(">hh", 0x7F00 | rng.randrange(256), rng.randrange(1 << 15)) + body[4:]
        got = send_and_expect_close(broker, struct.pack(">i", len(body)) + body)
        assert got == b"", f"garbage got an answer: {got[:64]!r}"
    assert_healthy(broker, traffic)


def test_truncated_requests_close_connection(broker, traffic):
    mv = metadata_request_v(broker)
    header = kw.request_header(kw.METADATA, mv, 7)
    # Length says 100, 20 bytes arrive, then EOF.
    partial = struct.pack(">i", 100) + (header + b"\x00" * 20)[:20]
    got = send_and_expect_close(broker, partial, shut_wr=True)
    assert got == b""
    # Length says 100, all 100 arrive, but the body does not decode: a topic array claiming
    # 2^31-1 entries followed by too few bytes.
    body = header + struct.pack(">i", 0x7FFFFFFF) + b"\x00\x05topic"
    body += b"\xff" * (100 - len(body))
    assert len(body) == 100
    got = send_and_expect_close(broker, struct.pack(">i", 100) + body)
    assert got == b"", f"undecodable request answered: {got[:64]!r}"
    # A valid header and nothing after it where a body is required (Produce).
    pv = 3
    got = send_and_expect_close(broker, kw.frame(kw.request_header(kw.PRODUCE, pv, 9) + b"\x00"))
    assert got == b""
    assert_healthy(broker, traffic)


def test_unknown_api_key_and_version_close_connection(broker, traffic):
    got = send_and_expect_close(broker, kw.frame(kw.request_header(999, 0, 1)), logged_once=True)
    assert got == b"", f"unknown api key answered: {got[:64]!r}"
    got = send_and_expect_close(broker, kw.frame(kw.request_header(kw.METADATA, 99, 2) + b"\x00\x00\x00\x00"))
    assert got == b"", f"unsupported Metadata version answered: {got[:64]!r}"
    # On a connection that has already been served, an unknown key still closes it.
    with Conn.to(broker.bootstrap) as c:
        err, _ = c.api_versions(0)
        assert err == 0
        c.send_raw(kw.frame(kw.request_header(999, 0, 5)))
        assert wait_closed(c.sock) == b""
    assert_healthy(broker, traffic)


def test_api_versions_unsupported_version(broker, traffic):
    with Conn.to(broker.bootstrap) as c:
        w = kw.Writer(True).string("sluice-tests").string("1").tags()
        cid = c.send_request(kw.API_VERSIONS, 99, w.getvalue())
        r = kw.Reader(c.recv_frame())
        assert r.i32() == cid, "response header v0: the correlation id comes first"
        err, keys = kw.parse_api_versions_body(r, 0)
        assert err == kw.UNSUPPORTED_VERSION
        assert kw.API_VERSIONS in keys, f"ApiVersions missing from the ranges: {keys}"
        lo, hi = keys[kw.API_VERSIONS]
        assert lo == 0 and hi >= 3, f"ApiVersions range {lo}..{hi}"
        # The connection stays usable: the client retries with a version the broker listed.
        err, keys3 = c.api_versions(min(hi, 3))
        assert err == 0
        assert keys3[kw.API_VERSIONS] == (lo, hi)
        for k in (kw.PRODUCE, kw.FETCH, kw.LIST_OFFSETS, kw.METADATA, kw.CREATE_TOPICS):
            assert k in keys3, f"api {k} missing from the ranges"
        # librdkafka compresses only if Produce v0 is listed.
        assert keys3[kw.PRODUCE][0] == 0
    assert_healthy(broker, traffic)


# ---------------------------------------------------------------- produce validation

def test_produce_bad_crc_is_corrupt_message(broker, traffic):
    topic = unique("crc")
    create_topic(broker.bootstrap, topic, 1)
    good = record_batch([Record(b"good-%d" % i, b"k") for i in range(5)])
    with Conn.to(broker.bootstrap) as c:
        assert c.produce(topic, 0, good)[:2] == (0, 0)
        # A flipped bit inside a record value (covered by the CRC).
        bad = bytearray(good)
        bad[-3] ^= 0x01
        # And an intact payload with a wrong CRC field.
        bad_crc = bytearray(good)
        bad_crc[17:21] = struct.pack(">I", (struct.unpack(">I", good[17:21])[0] + 1) & 0xFFFFFFFF)
        for b in (bytes(bad), bytes(bad_crc)):
            err, base, _, _ = c.produce(topic, 0, b)
            assert err == kw.CORRUPT_MESSAGE, f"bad CRC: error {err}"
            assert watermarks(broker.bootstrap, topic, 0) == (0, 5), "a corrupt batch must not be appended"
        # The connection is still good and offsets continue where they were.
        assert c.produce(topic, 0, good)[:2] == (0, 5)
    got = consume_until(broker.bootstrap, topic, {0: 10})
    assert [m.value() for m in got[0]] == [b"good-%d" % i for i in range(5)] * 2
    assert_healthy(broker, traffic)


def test_message_too_large(broker, traffic):
    topic = unique("big")
    create_topic(broker.bootstrap, topic, 1, {"max.message.bytes": "10000"})
    with Conn.to(broker.bootstrap) as c:
        too_big = record_batch([Record(b"x" * 20000)])
        err, _, _, _ = c.produce(topic, 0, too_big)
        assert err == kw.MESSAGE_TOO_LARGE, f"20 KB batch on a 10000-byte topic: error {err}"
        assert watermarks(broker.bootstrap, topic, 0) == (0, 0)
        assert c.produce(topic, 0, record_batch([Record(b"y" * 5000)]))[:2] == (0, 0)
    assert_healthy(broker, traffic)


def test_timestamps_outside_the_topic_limits_are_invalid_timestamp(broker, traffic):
    """Kafka's message.timestamp.after.max.ms (default one hour) and before.max.ms: a batch
    from a client clock far off is refused (a far-future timestamp would otherwise pin its
    segment against retention)."""
    topic = unique("ts")
    create_topic(broker.bootstrap, topic, 1, {"message.timestamp.before.max.ms": "86400000"})
    now_ms = int(time.time() * 1000)
    with Conn.to(broker.bootstrap) as c:
        for ts in (now_ms + 2 * 3600_000, now_ms - 2 * 86400_000):
            err, _, _, _ = c.produce(topic, 0, record_batch([Record(b"t")], base_timestamp=ts))
            assert err == kw.INVALID_TIMESTAMP, f"timestamp {ts - now_ms:+} ms: error {err}"
        assert watermarks(broker.bootstrap, topic, 0) == (0, 0)
        # KIP-467: the answer names the record at fault by its index in the batch.
        late = record_batch([Record(b"ok"), Record(b"ok", timestamp_delta=1000), Record(b"far", timestamp_delta=3 * 3600_000)],
                            base_timestamp=now_ms)
        err, message, record_errors = c.produce_record_errors(topic, 0, late)
        assert err == kw.INVALID_TIMESTAMP and "out of range" in message, (err, message)
        assert [index for index, _ in record_errors] == [2], record_errors
        assert str(now_ms + 3 * 3600_000) in record_errors[0][1], record_errors
        assert watermarks(broker.bootstrap, topic, 0) == (0, 0), "the whole batch is refused"
        assert c.produce(topic, 0, record_batch([Record(b"t")], base_timestamp=now_ms + 60_000))[:2] == (0, 0)
    assert_healthy(broker, traffic)


def test_produce_unknown_partition(broker, traffic):
    topic = unique("onepart")
    create_topic(broker.bootstrap, topic, 1)
    batch = record_batch([Record(b"z")])
    with Conn.to(broker.bootstrap) as c:
        for part in (1, 7, -1):
            err, _, _, _ = c.produce(topic, part, batch)
            assert err == kw.UNKNOWN_TOPIC_OR_PARTITION, f"partition {part}: error {err}"
        assert c.produce(topic, 0, batch)[:2] == (0, 0)
    assert watermarks(broker.bootstrap, topic, 0) == (0, 1)
    assert_healthy(broker, traffic)


# ---------------------------------------------------------------- CreateTopics validation

def test_create_topics_validation(broker, traffic):
    ok = unique("ok")
    long_ok = "l" * 249
    with Conn.to(broker.bootstrap) as c:
        res = c.create_topics([(ok, 2, 1, {}), (long_ok, 1, 1, {})])
        assert res[ok][0] == 0 and res[long_ok][0] == 0, res
        bad_names = ["bad/name", "..", ".", "x" * 250, "", "spa ce", "a\x00b", "tab\tname"]
        res = c.create_topics([(n, 1, 1, {}) for n in bad_names])
        for n in bad_names:
            assert res[n][0] == kw.INVALID_TOPIC_EXCEPTION, f"{n!r}: {res[n]}"
        for parts in (-5, 0):
            name = unique("negparts")
            res = c.create_topics([(name, parts, 1, {})])
            assert res[name][0] == kw.INVALID_PARTITIONS, f"{parts} partitions: {res[name]}"
        res = c.create_topics([(ok, 2, 1, {})])
        assert res[ok][0] == kw.TOPIC_ALREADY_EXISTS, res
    wait_for_topic(broker.bootstrap, ok, 2)
    wait_for_topic(broker.bootstrap, long_ok, 1)
    with Conn.to(broker.bootstrap) as c:
        md = c.metadata(None)
    assert ok in md and long_ok in md
    assert md[ok] == (0, [0, 1])
    for n in bad_names:
        assert n not in md, f"invalid topic {n!r} exists"
    assert not any(n.startswith("negparts") for n in md)
    assert_healthy(broker, traffic)


# ---------------------------------------------------------------- randomized frames

DESTRUCTIVE_KEYS = {19, 20, 21, 33, 37, 44}  # create/delete topics, delete records, alter configs, create partitions


def corpus(broker, topic: str) -> list[bytes]:
    """Valid request frames (header + body, no length prefix) for the mutation corpus."""
    with Conn.to(broker.bootstrap) as c:
        vers = c.versions()
    out = []
    batch = record_batch([Record(b"fuzz-%d" % i, b"k%d" % i, [("h", b"v")], i) for i in range(3)])
    for v in range(0, min(vers[kw.API_VERSIONS][1], 3) + 1):
        body = kw.Writer(True).string("fuzz").string("1").tags().getvalue() if v >= 3 else b""
        out.append(kw.request_header(kw.API_VERSIONS, v, 1) + body)
    for v in range(max(vers[kw.METADATA][0], 1), min(vers[kw.METADATA][1], 12) + 1):
        if v >= 10:
            continue
        out.append(kw.request_header(kw.METADATA, v, 2) + kw.metadata_body(v, [topic], False))
    lo, hi = vers[kw.PRODUCE]
    for v in range(max(lo, 3), min(hi, 8) + 1):
        out.append(kw.request_header(kw.PRODUCE, v, 3) + kw.produce_body(v, topic, 0, batch, acks=1))
    lo, hi = vers[kw.FETCH]
    for v in range(max(lo, 4), min(hi, 11) + 1):
        out.append(kw.request_header(kw.FETCH, v, 4) + kw.fetch_body(v, topic, 0, 0, 65536, 10))
    lo, hi = vers[kw.LIST_OFFSETS]
    for v in range(max(lo, 1), min(hi, 5) + 1):
        out.append(kw.request_header(kw.LIST_OFFSETS, v, 5) + kw.list_offsets_body(v, topic, 0, -1))
    return out


def mutate(rng: random.Random, seeds: list[bytes]) -> bytes:
    """One length-prefixed frame derived from a valid request (or pure noise)."""
    while True:
        data = bytearray(rng.choice(seeds))
        op = rng.randrange(8)
        if op == 0:  # flip random bytes
            for _ in range(rng.randint(1, 8)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        elif op == 1:  # truncate the payload, keep the honest length of what is left
            data = data[: rng.randrange(len(data))]
        elif op == 2:  # extend with noise
            data += bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
        elif op == 3:  # valid body, random api version
            data[2:4] = struct.pack(">h", rng.choice([-1, 0, 1, 2, 3, 12, 13, 99, 0x7FFF]))
        elif op == 4:  # flip bits in the body only
            for _ in range(rng.randint(1, 4)):
                i = rng.randrange(8, len(data)) if len(data) > 8 else 0
                data[i] ^= 1 << rng.randrange(8)
        elif op == 5:  # pure noise
            data = bytearray(rng.randrange(256) for _ in range(rng.randint(0, 128)))
        elif op == 6:  # corrupt a length-ish field: an int32 somewhere becomes huge or negative
            if len(data) >= 8:
                i = rng.randrange(0, len(data) - 4)
                data[i : i + 4] = struct.pack(">i", rng.choice([-1, -2, 0x7FFFFFFF, 1 << 24, 65535]))
        else:  # duplicate a slice
            i, j = sorted(rng.randrange(len(data) + 1) for _ in range(2))
            data = data[:j] + data[i:j] + data[j:]
        if len(data) >= 2 and struct.unpack(">h", data[:2])[0] in DESTRUCTIVE_KEYS:
            continue
        frame = struct.pack(">i", len(data)) + bytes(data)
        # Sometimes lie in the length prefix itself.
        if rng.random() < 0.1:
            frame = struct.pack(">i", rng.choice([len(data) + rng.randint(1, 50), max(len(data) - rng.randint(1, 8), 0)])) + bytes(data)
        return frame


def whole_frames(data: bytes) -> bool:
    pos = 0
    while pos < len(data):
        if pos + 4 > len(data):
            return False
        (n,) = struct.unpack_from(">i", data, pos)
        if n < 4:
            return False
        pos += 4 + n
    return pos == len(data)


def test_randomized_frames(broker, traffic):
    topic = unique("fuzz")
    create_topic(broker.bootstrap, topic, 1)
    seeds = corpus(broker, topic)
    rng = random.Random(20261121)
    frames = [mutate(rng, seeds) for _ in range(2000)]

    def send(frame: bytes):
        try:
            with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as s:
                try:
                    s.sendall(frame)
                    s.shutdown(socket.SHUT_WR)
                except OSError:
                    return "closed-early", b""
                try:
                    return "closed", wait_closed(s, timeout=3)
                except TimeoutError:
                    return "open", b""
        except ConnectionRefusedError:
            return "refused", b""

    t0 = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(send, frames))
    elapsed = time.monotonic() - t0
    counts = {}
    for (kind, data), frame in zip(results, frames):
        counts[kind] = counts.get(kind, 0) + 1
        assert whole_frames(data), f"partial response frame {data[:32]!r} to {frame[:32]!r}"
    print(f"2000 mutated frames in {elapsed:.1f}s: {counts}")
    assert counts.get("refused", 0) == 0, f"broker stopped accepting connections: {counts}"
    assert_healthy(broker, traffic)

    # A fresh client still gets normal service.
    p = Producer({"bootstrap.servers": broker.bootstrap, "broker.address.family": "v4", "acks": "all", "linger.ms": 0})
    errs = []
    for i in range(100):
        p.produce(topic, value=b"after-fuzz-%d" % i, on_delivery=lambda err, msg: errs.append(err))
    assert p.flush(30) == 0
    assert errs == [None] * 100
    _, hw = watermarks(broker.bootstrap, topic, 0)
    got = consume_until(broker.bootstrap, topic, {0: hw})
    assert [m.value() for m in got[0][-100:]] == [b"after-fuzz-%d" % i for i in range(100)]
