"""Numbered records for crash and power-loss tests: an idempotent acks=all producer that
writes records 0, 1, 2, ... at a steady rate, and a verifier that reads them back and checks
every acknowledged record is at the offset it was acknowledged at, exactly once, in order,
undamaged, with nothing that was never sent."""

import os
import random
import threading
import time

from confluent_kafka import Producer

from kafka_wire import consume_until, watermarks

PARTITIONS = 4
RATE_PER_S = 4000
MAX_OUTSTANDING = 20000
PAD = bytes(range(256)) * 2


def payload(n: int) -> bytes:
    start = n % 251
    return b"%d|%d|" % (n, n % PARTITIONS) + PAD[start : start + 40 + n % 100]


class NumberedProducer:
    """Sends records 0, 1, 2, ... (record n to partition n % PARTITIONS) from its own thread."""

    def __init__(self, bootstrap: str, topic: str):
        self.topic = topic
        self.fatal: list = []
        self.client_errors: list = []
        self.producer = Producer({
            "bootstrap.servers": bootstrap,
            "broker.address.family": "v4",
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "message.timeout.ms": 300000,
            "reconnect.backoff.ms": 20,
            "reconnect.backoff.max.ms": 200,
            "retry.backoff.ms": 20,
            "retry.backoff.max.ms": 200,
            "queue.buffering.max.messages": MAX_OUTSTANDING * 2,
            "error_cb": self._on_error,
        })
        self.lock = threading.Lock()
        self.sent = 0
        self.acked: dict[int, tuple[int, int]] = {}  # n -> (partition, offset)
        self.failed: dict[int, object] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="numbered-producer", daemon=True)

    def _on_error(self, err):
        if err.fatal():
            self.fatal.append(err)
        else:
            self.client_errors.append(err)

    def _on_delivery(self, err, msg):
        n = int(msg.key())
        with self.lock:
            if err is not None:
                self.failed[n] = err
            else:
                self.acked[n] = (msg.partition(), msg.offset())

    def _run(self):
        t0 = time.monotonic()
        while not self._stop.is_set():
            with self.lock:
                outstanding = self.sent - len(self.acked) - len(self.failed)
            if outstanding >= MAX_OUTSTANDING or self.sent >= (time.monotonic() - t0) * RATE_PER_S:
                self.producer.poll(0.005)
                continue
            n = self.sent
            self.producer.produce(self.topic, partition=n % PARTITIONS, key=b"%d" % n, value=payload(n),
                                  headers=[("n", b"%d" % n)], on_delivery=self._on_delivery)
            self.sent += 1
            if n % 20 == 0:
                self.producer.poll(0)

    def start(self):
        self._thread.start()

    def stop(self, flush_timeout: float = 60.0) -> int:
        self._stop.set()
        self._thread.join(10)
        return self.producer.flush(flush_timeout)

    def snapshot(self) -> dict[int, tuple[int, int]]:
        with self.lock:
            return dict(self.acked)


class Verifier:
    """Reads each partition incrementally and checks every record as it appears."""

    def __init__(self, bootstrap: str, topic: str, producer: NumberedProducer):
        self.bootstrap = bootstrap
        self.topic = topic
        self.producer = producer
        self.read: dict[int, list[tuple[int, int]]] = {p: [] for p in range(PARTITIONS)}  # (offset, n)
        self.seen: set[int] = set()

    def check_record(self, m, part: int, expect_offset: int) -> int:
        assert m.offset() == expect_offset, f"p{part}: offset {m.offset()} where {expect_offset} was expected (gap or repeat)"
        key = m.key()
        assert key is not None and key.isdigit(), f"p{part}@{m.offset()}: malformed key {key!r}"
        n = int(key)
        assert n < self.producer.sent, f"p{part}@{m.offset()}: record {n} was never sent"
        assert n % PARTITIONS == part, f"p{part}@{m.offset()}: record {n} belongs to partition {n % PARTITIONS}"
        assert m.value() == payload(n), f"p{part}@{m.offset()}: record {n} has a damaged value {m.value()[:40]!r}"
        assert m.headers() == [("n", key)], f"p{part}@{m.offset()}: record {n} headers {m.headers()}"
        assert n not in self.seen, f"p{part}@{m.offset()}: record {n} appears twice"
        prev = self.read[part][-1][1] if self.read[part] else -1
        assert n > prev, f"p{part}@{m.offset()}: record {n} after {prev}: out of order"
        return n

    def catch_up(self, timeout: float = 60.0) -> None:
        """Reads every partition from where the last call stopped up to its current high watermark."""
        ends, starts = {}, {}
        for part in range(PARTITIONS):
            low, high = watermarks(self.bootstrap, self.topic, part, timeout=20)
            assert low == 0, f"p{part}: log start moved to {low}"
            done = len(self.read[part])
            assert high >= done, f"p{part}: high watermark {high} is below {done} records already read: data lost"
            starts[part], ends[part] = done, high
        got = consume_until(self.bootstrap, self.topic, ends, start_offsets=starts, timeout=timeout)
        for part, msgs in got.items():
            for i, m in enumerate(msgs):
                n = self.check_record(m, part, starts[part] + i)
                self.read[part].append((m.offset(), n))
                self.seen.add(n)

    def assert_acked_present(self, acked: dict[int, tuple[int, int]], when: str) -> None:
        for n, (part, off) in acked.items():
            rows = self.read[part]
            assert off < len(rows), f"{when}: record {n} acknowledged at p{part}@{off} but the partition ends at {len(rows)}"
            assert rows[off] == (off, n), f"{when}: p{part}@{off} holds record {rows[off][1]}, but record {n} was acknowledged there"


RESUME_TIMEOUT_S = 15


def run_kill_rounds(broker, topic: str, rounds: int, rng: random.Random, after_kill=None) -> str:
    """Produces numbered records into `topic` (PARTITIONS partitions) while the broker is
    killed with SIGKILL `rounds` times at random moments (`after_kill()` runs while it is
    down: a power loss, say) and restarted on the same port and data dir. After every
    restart, every record acknowledged before the kill must be read back exactly once at its
    acknowledged offset; at the end everything sent is acknowledged and there exactly once.
    Returns a one-line summary."""
    prod = NumberedProducer(broker.bootstrap, topic)
    verifier = Verifier(broker.bootstrap, topic, prod)
    prod.start()
    t0 = time.monotonic()
    kill_log = []
    try:
        for k in range(rounds):
            # Mostly mid-stream kills, sometimes right after startup (recovery, first requests).
            delay = rng.uniform(0.0, 0.3) if rng.random() < 0.25 else rng.uniform(0.5, 2.5)
            time.sleep(delay)
            acked_before = prod.snapshot()
            broker.kill()
            if after_kill is not None:
                after_kill()
            kill_log.append((k, round(delay, 2), len(acked_before), prod.sent))
            broker.start()
            verifier.catch_up()
            verifier.assert_acked_present(acked_before, f"after kill {k + 1}")
            assert not prod.fatal, f"producer fatal error after kill {k + 1}: {prod.fatal}"
            # Liveness: the producer gets new acknowledgements from the restarted broker (its
            # reconnect backoff grows after repeated refusals, so allow some seconds). Waiting
            # here also makes every next kill land while production is under way.
            deadline = time.monotonic() + RESUME_TIMEOUT_S
            while len(prod.snapshot()) <= len(acked_before):
                assert time.monotonic() < deadline, f"no new acknowledgement {RESUME_TIMEOUT_S} s after restart {k + 1}"
                time.sleep(0.02)
        time.sleep(1.0)
    finally:
        remaining = prod.stop()
    assert remaining == 0, f"{remaining} records still unacknowledged 60 s after the last restart"
    assert not prod.fatal, f"producer fatal error: {prod.fatal}"
    assert not prod.failed, f"{len(prod.failed)} deliveries failed, e.g. {list(prod.failed.items())[:3]}"

    final = prod.snapshot()
    verifier.catch_up()
    verifier.assert_acked_present(final, "at the end")
    # Everything was acknowledged, so everything sent is there exactly once.
    assert len(final) == prod.sent
    assert verifier.seen == set(range(prod.sent))
    assert sum(len(v) for v in verifier.read.values()) == prod.sent, "extra records in the log"

    # A full re-read from offset 0 sees exactly what the incremental reads saw.
    full = consume_until(broker.bootstrap, topic, {p: len(verifier.read[p]) for p in range(PARTITIONS)}, timeout=120)
    for part in range(PARTITIONS):
        assert [(m.offset(), int(m.key())) for m in full[part]] == verifier.read[part], f"p{part}: re-read differs"

    elapsed = time.monotonic() - t0
    grew = sum(1 for a, b in zip(kill_log, kill_log[1:]) if b[2] > a[2])
    assert grew >= rounds // 2, f"acknowledgements advanced between only {grew} of {rounds - 1} kill pairs: {kill_log}"
    assert prod.sent >= 1000 * rounds, f"only {prod.sent} records sent in {elapsed:.0f}s: the test exercised too little"
    return f"{rounds} kills in {elapsed:.0f}s, {prod.sent} records acknowledged, kills (k, delay s, acked, sent): {kill_log}"
