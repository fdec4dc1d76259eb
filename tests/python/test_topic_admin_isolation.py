"""Creating, growing and deleting a topic of thousands of partitions on a single node, while
another client keeps asking the broker something.

Each new partition is a directory and a segment file whose names are fsynced; each deleted one
is a directory removal. For 10,000 partitions that is seconds of disk work (6.8 s to create,
2.6 s to delete on the development machine when it ran on a connection thread). Done on the
connection threads, it stopped every other client for as long: heartbeats, produce and fetch
included. The broker now does that work on its blocking pool, so another connection's requests
are answered meanwhile.
"""

from __future__ import annotations

import threading
import time

from confluent_kafka.admin import NewPartitions, NewTopic

from kafka_wire import Conn, admin_client

PROBE_INTERVAL_S = 0.01


class Probe:
    """Sends ApiVersions on its own connection every 10 ms and keeps the slowest answer."""

    def __init__(self, bootstrap: str):
        self.conn = Conn.to(bootstrap, timeout=60.0)
        self.worst = 0.0
        self.answered = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            started = time.perf_counter()
            error, _ = self.conn.api_versions(0)
            assert error == 0
            self.worst = max(self.worst, time.perf_counter() - started)
            self.answered += 1
            time.sleep(PROBE_INTERVAL_S)

    def __enter__(self) -> "Probe":
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=60)
        self.conn.close()


def timed(operation) -> float:
    started = time.perf_counter()
    operation()
    return time.perf_counter() - started


def check_served_meanwhile(what: str, took: float, probe: Probe):
    # Served on the connection threads, the probe's slowest answer was the whole operation.
    assert probe.worst < max(0.25 * took, 0.5), (
        f"{what} took {took:.2f} s and another client waited {probe.worst:.2f} s for an answer"
    )


def test_thousands_of_partitions_are_created_grown_and_deleted_while_other_clients_are_served(broker):
    admin = admin_client(broker.bootstrap)
    topic = "wide"

    with Probe(broker.bootstrap) as probe:
        futures = admin.create_topics([NewTopic(topic, num_partitions=5000, replication_factor=1)], operation_timeout=120)
        took = timed(lambda: futures[topic].result(120))
    check_served_meanwhile("creating 5,000 partitions", took, probe)

    with Probe(broker.bootstrap) as probe:
        futures = admin.create_partitions([NewPartitions(topic, 10000)], operation_timeout=120)
        took = timed(lambda: futures[topic].result(120))
    check_served_meanwhile("adding 5,000 partitions", took, probe)

    metadata = admin.list_topics(topic, timeout=30).topics[topic]
    assert metadata.error is None
    assert len(metadata.partitions) == 10000
    assert len([d for d in (broker.data_dir / "logs").iterdir() if d.name.startswith(f"{topic}-")]) == 10000

    with Probe(broker.bootstrap) as probe:
        futures = admin.delete_topics([topic], operation_timeout=120)
        took = timed(lambda: futures[topic].result(120))
    check_served_meanwhile("deleting 10,000 partitions", took, probe)

    assert topic not in admin.list_topics(timeout=30).topics
    assert not [d for d in (broker.data_dir / "logs").iterdir() if d.name.startswith(f"{topic}-")]
