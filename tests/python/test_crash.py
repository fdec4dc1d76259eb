"""Crash safety: an idempotent acks=all producer writes numbered records continuously while the
broker is killed with SIGKILL 20 times at random moments and restarted on the same port and
data dir. After every restart, every record acknowledged before the kill is read back exactly
once, at the offset it was acknowledged at, in order; nothing that was not sent (torn or
garbage data) is ever visible."""

import os
import random
import uuid

from kafka_wire import create_topic
from numbered import PARTITIONS, run_kill_rounds

KILLS = int(os.environ.get("SLUICE_CRASH_KILLS", "20"))


def test_kill9_during_idempotent_produce(broker):
    rng = random.Random(int(os.environ.get("SLUICE_CRASH_SEED", "4242")))
    topic = f"crash-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, PARTITIONS)
    print(run_kill_rounds(broker, topic, KILLS, rng))


def test_a_panic_stops_the_broker_and_loses_nothing_acknowledged(broker_factory):
    """A panic (here injected into one topic's produce, after its batch is appended and before
    it is acknowledged) stops the whole broker with the panic in its log, instead of closing
    one connection and going on with memory that may disagree with the disk. A restart then
    serves every record acknowledged before it."""
    import signal
    import time

    from confluent_kafka import Producer

    from kafka_wire import consume_until

    doomed = f"doomed-{uuid.uuid4().hex[:8]}"
    broker = broker_factory(env={"SLUICE_UNSAFE_PANIC_ON_PRODUCE_FOR_TESTS": doomed, "RUST_BACKTRACE": "0"})
    safe = f"safe-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, safe, 2)
    create_topic(broker.bootstrap, doomed, 1)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "enable.idempotence": True,
                         "message.timeout.ms": 5000, "reconnect.backoff.max.ms": 200})
    acknowledged = []
    for i in range(200):
        producer.produce(safe, value=b"v%d" % i, partition=i % 2,
                         on_delivery=lambda err, msg: err is None and acknowledged.append((msg.partition(), msg.offset())))
    assert producer.flush(30) == 0
    assert len(acknowledged) == 200

    outcome = []
    producer.produce(doomed, value=b"boom", on_delivery=lambda err, msg: outcome.append(err))
    producer.flush(10)
    assert outcome and outcome[0] is not None, f"the panicking produce was acknowledged: {outcome}"
    deadline = time.monotonic() + 10
    while broker.is_running() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not broker.is_running(), "the broker went on after a panic"
    assert broker.proc.returncode == -signal.SIGABRT, broker.proc.returncode
    log = broker.log()
    assert "stopping the broker" in log and doomed in log, log[-3000:]

    broker.env.pop("SLUICE_UNSAFE_PANIC_ON_PRODUCE_FOR_TESTS")
    broker.start()
    ends = {p: max(o for q, o in acknowledged if q == p) + 1 for p in (0, 1)}
    read = consume_until(broker.bootstrap, safe, ends)
    assert sorted((p, m.offset()) for p, ms in read.items() for m in ms) == sorted(acknowledged)
    assert [m.value() for m in read[0]] == [b"v%d" % i for i in range(0, 200, 2)]
