"""Client quotas as Kafka's operators set them (`kafka-configs.sh --entity-type clients|users
--add-config producer_byte_rate=...`, ConfigCommand from kafka-tools 4.3.1), enforced on
librdkafka clients: a throttled client's steady rate stays within 10% of its quota while
another client on the same broker is not slowed; `request_percentage` bounds the broker
time a client's requests take.
"""

import threading
import time

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

import kafka_wire as kw
from conftest import free_port
from java_support import run_java, tools_cp  # noqa: F401  (tools_cp is a fixture)
from test_metrics import scrape, value

CONFIG_COMMAND = "kafka.admin.ConfigCommand"
QUOTA_BYTES_PER_S = 200_000
VALUE = b"q" * 1000


def configs(tools_cp, broker, *args):  # noqa: F811
    res = run_java(tools_cp, CONFIG_COMMAND, ["--bootstrap-server", broker.bootstrap, *args], timeout=120)
    assert res.returncode == 0, f"{res.report()}\n--- broker log ---\n{broker.log()[-3000:]}"
    return res.stdout


class ProduceMeter:
    """Produces as fast as the client lets it, or at most `max_rate` bytes/s, and records
    (time, delivered bytes)."""

    def __init__(self, bootstrap: str, client_id: str, topic: str, max_rate: float | None = None):
        self.producer = Producer({
            # Small batches and queue: the throttle acts per request rather than per burst.
            "bootstrap.servers": bootstrap, "client.id": client_id, "linger.ms": 5, "batch.size": 32768,
            "queue.buffering.max.kbytes": 128, "acks": "all",
        })
        self.topic = topic
        self.max_rate = max_rate
        self.delivered = 0
        self.throttle_reports = 0
        self.samples: list[tuple[float, int]] = []
        self.stop = threading.Event()

    def _on_delivery(self, err, msg):
        if err is None:
            self.delivered += len(msg.value())

    def run(self):
        started = time.monotonic()
        while not self.stop.is_set():
            if self.max_rate is not None and self.delivered > self.max_rate * (time.monotonic() - started):
                self.producer.poll(0.005)
                continue
            try:
                self.producer.produce(self.topic, VALUE, on_delivery=self._on_delivery)
            except BufferError:
                self.producer.poll(0.01)
            self.producer.poll(0)
            if not self.samples or time.monotonic() - self.samples[-1][0] >= 0.5:
                self.samples.append((time.monotonic(), self.delivered))
        self.producer.flush(30)

    def cycle_rate(self, quota: float) -> float:
        """Kafka measures a rate over a window of samples, so a throttled client sends a burst
        whenever old samples leave the window, then trickles: the rate it is held to is the
        rate from the end of one burst to the end of a later one (whole windows). The first
        window is left out: there the client pays back the burst it sent before the broker
        had measured it (its first requests), which is no steady rate."""
        burst_ends = [
            i for i in range(1, len(self.samples))
            if self.samples[i][1] - self.samples[i - 1][1] > 2 * quota * (self.samples[i][0] - self.samples[i - 1][0])
            and (i + 1 == len(self.samples) or self.samples[i + 1][1] - self.samples[i][1]
                 <= 2 * quota * (self.samples[i + 1][0] - self.samples[i][0]))
        ]
        burst_ends = [i for i in burst_ends if self.samples[i][0] - self.samples[0][0] > 2]
        assert len(burst_ends) >= 2, f"fewer than two steady quota windows seen: {self.samples}"
        (t0, b0), (t1, b1) = self.samples[burst_ends[0]], self.samples[burst_ends[-1]]
        assert t1 - t0 >= 10, f"windows too close: {self.samples}"
        return (b1 - b0) / (t1 - t0)

    def rate_between(self, start: float, end: float) -> float:
        first = min(self.samples, key=lambda s: abs(s[0] - start))
        last = min(self.samples, key=lambda s: abs(s[0] - end))
        return (last[1] - first[1]) / (last[0] - first[0])


def run_side_by_side(loads, seconds: float, join_timeout: float) -> float:
    """Runs each load's `run` in its own thread for `seconds`, then stops them (their
    `stop` event) and waits; returns when they started (time.monotonic)."""
    threads = [threading.Thread(target=load.run) for load in loads]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    for load in loads:
        load.stop.set()
    for thread in threads:
        thread.join(join_timeout)
    return started


def test_producer_byte_rate_holds_a_client_to_its_quota(broker, tools_cp):  # noqa: F811
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic("quota-topic", 2)]).values():
        future.result(timeout=10)
    configs(tools_cp, broker, "--alter", "--add-config", f"producer_byte_rate={QUOTA_BYTES_PER_S}",
            "--entity-type", "clients", "--entity-name", "throttled")
    described = configs(tools_cp, broker, "--describe", "--entity-type", "clients", "--entity-name", "throttled")
    assert f"producer_byte_rate={QUOTA_BYTES_PER_S}" in described, described

    throttled = ProduceMeter(broker.bootstrap, "throttled", "quota-topic")
    # The other client is held (client-side) to 10 times the quota: far above it, yet a bounded
    # amount of data on disk (unbounded, it writes GiBs in the 43 s).
    free = ProduceMeter(broker.bootstrap, "free", "quota-topic", max_rate=10 * QUOTA_BYTES_PER_S)
    started = run_side_by_side([throttled, free], seconds=43, join_timeout=60)
    steady = throttled.cycle_rate(QUOTA_BYTES_PER_S)
    timeline = [(round(t - started, 1), b) for t, b in throttled.samples[::2]]
    assert abs(steady - QUOTA_BYTES_PER_S) <= 0.1 * QUOTA_BYTES_PER_S, f"throttled client ran at {steady:.0f} B/s: {timeline}"
    free_rate = free.rate_between(started + 12, started + 42)
    assert free_rate > 5 * QUOTA_BYTES_PER_S, f"the unthrottled client ran at only {free_rate:.0f} B/s"

    # Removing the quota lifts the throttle.
    configs(tools_cp, broker, "--alter", "--delete-config", "producer_byte_rate", "--entity-type", "clients",
            "--entity-name", "throttled")
    assert "producer_byte_rate" not in configs(tools_cp, broker, "--describe", "--entity-type", "clients",
                                               "--entity-name", "throttled")


def test_consumer_byte_rate_and_default_user_quota(broker, tools_cp):  # noqa: F811
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic("fetch-quota", 1)]).values():
        future.result(timeout=10)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20})
    for _ in range(6000):
        producer.produce("fetch-quota", VALUE)
        producer.poll(0)
    assert producer.flush(30) == 0
    # A default user quota applies to the anonymous user of a PLAINTEXT listener.
    configs(tools_cp, broker, "--alter", "--add-config", "consumer_byte_rate=300000", "--entity-type", "users",
            "--entity-default")
    assert "consumer_byte_rate=300000" in configs(tools_cp, broker, "--describe", "--entity-type", "users",
                                                   "--entity-default")
    # Quotas are durable: enforced after a crash and restart too.
    broker.kill()
    broker.start()
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "slow", "auto.offset.reset": "earliest",
                         "max.partition.fetch.bytes": 65536})
    consumer.subscribe(["fetch-quota"])
    received = 0
    started = time.monotonic()
    while received < 6_000_000 and time.monotonic() - started < 25:
        msg = consumer.poll(0.2)
        if msg is not None and not msg.error():
            received += len(msg.value())
    elapsed = time.monotonic() - started
    consumer.close()
    # 6 MB at 300 KB/s: far longer than unthrottled (well under a second here); the first
    # ~3 MB may burst (10 s of quota), the rest is held to the quota.
    assert elapsed >= 8, f"read {received} bytes in {elapsed:.1f}s: not throttled"
    assert received >= 6_000_000, f"read only {received} bytes in {elapsed:.1f}s: throttled below the quota"


class MetadataLoop:
    """Sends Metadata requests (all topics) back to back on one connection with its own
    client id, counting answers and the throttle times they carry."""

    def __init__(self, bootstrap: str, client_id: str):
        self.conn = kw.Conn.to(bootstrap, timeout=60)
        self.client_id = client_id
        self.answers: list[float] = []  # arrival times
        self.throttled = 0
        self.stop = threading.Event()

    def run(self):
        body = kw.metadata_body(METADATA_VERSION, None, False)
        with self.conn:
            while not self.stop.is_set():
                self.conn.send_request(kw.METADATA, METADATA_VERSION, body, client_id=self.client_id)
                answer = kw.Reader(self.conn.recv_frame())
                answer.i32()  # correlation id
                if answer.i32() > 0:  # throttle_time_ms
                    self.throttled += 1
                self.answers.append(time.monotonic())

    def rate(self, start: float, end: float) -> float:
        return sum(1 for t in self.answers if start <= t < end) / (end - start)


METADATA_VERSION = 7  # not flexible: the throttle time follows the correlation id


def test_request_percentage_bounds_the_time_spent_on_a_client(tools_cp, broker_factory):  # noqa: F811
    """`request_percentage=1` (1% of one thread's time): a client sending costly Metadata
    requests back to back is throttled to a fraction of the rate of an identical client
    without a quota on the same broker, which is not throttled at all."""
    port = free_port()
    broker = broker_factory(extra_args=["--metrics-listen", f"127.0.0.1:{port}"])
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    # Many partitions make each all-topics Metadata answer cost real broker time.
    for future in admin.create_topics([NewTopic(f"many-{i}", 20) for i in range(40)]).values():
        future.result(timeout=30)
    configs(tools_cp, broker, "--alter", "--add-config", "request_percentage=1", "--entity-type", "clients",
            "--entity-name", "busy")
    assert "request_percentage=1" in configs(tools_cp, broker, "--describe", "--entity-type", "clients",
                                             "--entity-name", "busy")
    busy, free = MetadataLoop(broker.bootstrap, "busy"), MetadataLoop(broker.bootstrap, "free")
    started = run_side_by_side([busy, free], seconds=20, join_timeout=120)
    # After the first window's burst, the busy client is held down; the free one is not.
    busy_rate, free_rate = busy.rate(started + 12, started + 20), free.rate(started + 12, started + 20)
    print(f"request_percentage=1: busy client {busy_rate:.0f} requests/s, free client {free_rate:.0f} requests/s")
    assert busy.throttled > 0, "no answer to the busy client carried a throttle time"
    assert free.throttled == 0, f"the client without a quota was throttled {free.throttled} times"
    assert free_rate > 50, f"the free client managed only {free_rate:.0f} requests/s"
    assert busy_rate < free_rate / 3, f"busy {busy_rate:.0f}/s vs free {free_rate:.0f}/s: not throttled"
    assert value(scrape(port), "sluice_quota_throttled_responses_total", api="any") > 0

    # Fractions are refused with a message (the replicated metadata keeps whole numbers).
    res = run_java(tools_cp, CONFIG_COMMAND, ["--bootstrap-server", broker.bootstrap, "--alter", "--add-config",
                                              "request_percentage=0.5", "--entity-type", "clients", "--entity-name",
                                              "busy"], timeout=120)
    assert res.returncode != 0 and "whole number" in res.stdout + res.stderr, res.report()
