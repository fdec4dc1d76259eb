"""A cluster of real `sluice serve` processes for the tests, and the load and checks the
cluster tests share: an idempotent acks=all producer, a consumer that reads everything
back, topic creation that waits until every node sees full ISRs.
"""

import os
import secrets
import threading
import time

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

import kafka_wire as kw
from conftest import Broker, free_port

NODES = 3


def wait_for(what, predicate, timeout=30.0, interval=0.1):
    """Polls `predicate` until it returns something true (and returns that); errors count
    as not yet (metadata may be unavailable while nodes start or fail over)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
            if last:
                return last
        except Exception as error:
            last = error
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}; last: {last}")


def write_cluster_secret(directory) -> str:
    """A file, its owner's only, holding a new secret for the nodes of a cluster to share."""
    path = os.path.join(str(directory), "cluster.secret")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(secrets.token_hex(32))
    return path


class Cluster:
    """`nodes` brokers forming one controller quorum, each with a metrics endpoint.
    `node_args(node_id, port)` adds arguments per node (`port`: its client port); `bin` picks the binary (each node's
    `bin` can be changed before a restart, as the rolling-upgrade test does)."""

    def __init__(self, tmp_path, nodes=NODES, node_args=None, bin=None):
        ports = [free_port() for _ in range(nodes)]
        controller_ports = [free_port() for _ in range(nodes)]
        voters = ",".join(f"{i + 1}@127.0.0.1:{controller_ports[i]}" for i in range(nodes))
        self.secret_file = write_cluster_secret(tmp_path)
        self.nodes = {}
        self.metrics_ports = {}
        self.controller_ports = {i + 1: controller_ports[i] for i in range(nodes)}
        for i in range(nodes):
            node_id = i + 1
            self.metrics_ports[node_id] = free_port()
            args = [
                "--node-id", str(node_id),
                "--controller-listen", f"127.0.0.1:{controller_ports[i]}",
                "--cluster-voters", voters,
                # As an override, which every version takes (the rolling-upgrade test).
                "--override", f"cluster.rpc_secret_file={self.secret_file}",
                "--metrics-listen", f"127.0.0.1:{self.metrics_ports[node_id]}",
                *(node_args(node_id, ports[i]) if node_args else []),
            ]
            self.nodes[node_id] = Broker(tmp_path / f"node-{node_id}", port=ports[i], extra_args=args, bin=bin)
        self.bootstrap = ",".join(n.bootstrap for n in self.nodes.values())

    def start(self, admin_config=None):
        """Starts every node and waits until all are registered; a failed start kills the
        nodes already started. `admin_config` is how to reach the cluster when its client
        port is not plaintext."""
        try:
            for node in self.nodes.values():
                node.start()
            # The quorum elects its first leader and registers every broker before topics
            # can be placed on all of them.
            admin = AdminClient(admin_config) if admin_config else self.admin()
            self.wait_for("all brokers registered", lambda: len(admin.list_topics(timeout=5).brokers) == len(self.nodes),
                          timeout=60)
        except BaseException:
            self.kill_all()
            raise
        return self

    def kill_all(self):
        for node in self.nodes.values():
            node.kill()

    def admin(self):
        return AdminClient({"bootstrap.servers": self.bootstrap})

    def partition_state(self, topic, partition):
        md = self.admin().list_topics(topic=topic, timeout=10)
        p = md.topics[topic].partitions[partition]
        return p.leader, list(p.replicas), list(p.isrs)

    def partition_states_at(self, node_id, topic):
        """{partition: kw.PartitionMetadata} as node `node_id` itself answers Metadata
        (librdkafka would ask whichever broker it likes)."""
        with kw.Conn.to(self.nodes[node_id].bootstrap) as conn:
            answer = conn.metadata_detail([topic]).topics[topic]
        return answer.partitions if answer.error == 0 else {}

    def wait_for(self, what, predicate, timeout=30.0):
        return wait_for(what, predicate, timeout)


def create_topic(cluster, name, partitions, config=None):
    config = {"min.insync.replicas": "2", **(config or {})}
    admin = cluster.admin()

    def created():
        future = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=3, config=config)])
        try:
            future[name].result(timeout=10)
        except Exception as error:  # the quorum may still be electing its first leader
            if "already exists" not in str(error):
                raise
        return True

    cluster.wait_for("topic creation", created, timeout=60)

    def settled_at(node_id):
        states = cluster.partition_states_at(node_id, name)
        return len(states) == partitions and all(p.leader > 0 and len(p.isr) == 3 for p in states.values())

    # Every node, not just one: each applies the controller's metadata on its own.
    cluster.wait_for("all leaders and full ISRs on every node", lambda: all(settled_at(n) for n in cluster.nodes))


class LoadProducer:
    """An idempotent acks=all librdkafka producer writing keyed records (`k0`, `k1`, ...) from
    a thread until stopped: `acked` maps each acknowledged key to (partition, offset),
    `failed` holds delivery errors. With `partitions`, record i goes to partition i % n."""

    def __init__(self, bootstrap, topic, partitions=None, message_timeout_ms=120000):
        self.producer = Producer({
            "bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 2,
            "message.timeout.ms": message_timeout_ms, "retry.backoff.ms": 50,
            "topic.metadata.refresh.interval.ms": 500,
        })
        self.topic, self.partitions = topic, partitions
        self.acked, self.failed = {}, []
        self._flush_s = message_timeout_ms / 1000
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)
        self._thread.start()

    def _on_delivery(self, err, msg):
        if err:
            self.failed.append(str(err))
        else:
            self.acked[msg.key().decode()] = (msg.partition(), msg.offset())

    def _run(self):
        i = 0
        while not self._stop.is_set():
            placement = {} if self.partitions is None else {"partition": i % self.partitions}
            try:
                self.producer.produce(self.topic, key=f"k{i}", value=b"v" * 100, on_delivery=self._on_delivery,
                                      **placement)
                i += 1
            except BufferError:
                pass
            self.producer.poll(0.001)
        self.producer.flush(self._flush_s)

    def stop(self):
        """Stops sending and waits until everything sent is acknowledged or failed."""
        self._stop.set()
        self._thread.join(self._flush_s + 60)


def consume_all(bootstrap, topic, partitions, expected_total, timeout=60):
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{time.time()}", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    seen = []
    deadline = time.monotonic() + timeout
    while len(seen) < expected_total and time.monotonic() < deadline:
        for msg in consumer.consume(1000, 1.0):
            if msg.error():
                continue
            seen.append((msg.partition(), msg.offset(), msg.key().decode()))
    consumer.close()
    return seen
