"""The AMQP front door on a 3-node cluster, with pika.

Any node takes AMQP clients: a node sends each request to the node that serves it (a queue
partition's leader, its share group's coordinator) in an Envelope carrying the AMQP user, and
exchanges and bindings live in the replicated cluster metadata, so every node routes alike.

* Topology declared through three different nodes routes a message published through a third.
* The single-node scenarios (tutorials, redelivery, basic.get and message counts, CC/BCC,
  x-max-length with both overflow modes, dead letters, RPC,
  transactions, exclusive consumers, Kafka clients on AMQP queues, lock renewal) pass
  through one node of a cluster whose queues are led by whichever node placement picks.
* `kill -9` of the leader of a queue's partition, with the client connected to another node:
  every confirmed message is still delivered, and the ones the consumer held unacknowledged come
  back flagged `redelivered`.
"""

from __future__ import annotations

import uuid
from types import SimpleNamespace

import pika
import pytest

import test_amqp
from cluster_support import Cluster, wait_for
from conftest import free_port
from test_amqp import connect, receive

NODES = 3


def amqp_cluster(tmp_path) -> tuple[Cluster, dict[int, int]]:
    """A started 3-node cluster, each node with an AMQP port: ({node id: AMQP port})."""
    ports = {node_id: free_port() for node_id in range(1, NODES + 1)}
    cluster = Cluster(tmp_path, nodes=NODES,
                      node_args=lambda node_id, _port: ["--amqp-listen", f"127.0.0.1:{ports[node_id]}"])
    return cluster.start(), ports


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_topology_declared_on_any_node_routes_on_every_node(tmp_path):
    cluster, ports = amqp_cluster(tmp_path)
    try:
        first, second, third = (connect(ports[n]) for n in (1, 2, 3))
        exchange, queue = unique("logs"), unique("errors")
        first.channel().exchange_declare(exchange=exchange, exchange_type="topic", durable=True)
        on_second = second.channel()
        on_second.queue_declare(queue=queue, durable=True)
        on_second.queue_bind(queue=queue, exchange=exchange, routing_key="*.error")
        publisher = third.channel()
        publisher.confirm_delivery()
        for i in range(20):
            publisher.basic_publish(exchange=exchange, routing_key="kern.error" if i % 2 else "kern.info",
                                    body=f"line {i}".encode())
        got = receive(first.channel(), queue, 10)
        assert sorted(body for _, _, body in got) == sorted(f"line {i}".encode() for i in range(1, 20, 2))
        # A declaration that differs from the one another node stored is refused, as RabbitMQ does.
        refused = third.channel()
        try:
            refused.exchange_declare(exchange=exchange, exchange_type="fanout", durable=True)
            raise AssertionError("an inequivalent redeclaration was accepted")
        except pika.exceptions.ChannelClosedByBroker as error:
            assert error.reply_code == 406
        for connection in (first, second, third):
            connection.close()
    finally:
        cluster.kill_all()


def test_a_leader_kill_loses_no_confirmed_message_and_redelivers_held_ones(tmp_path):
    cluster, ports = amqp_cluster(tmp_path)
    try:
        queue = unique("orders")
        setup = connect(ports[1])
        setup.channel().queue_declare(queue=queue, durable=True)
        setup.close()
        leader = wait_for("a leader for the queue", lambda: cluster.partition_state(queue, 0)[0] > 0 and
                          cluster.partition_state(queue, 0)[0], timeout=60)
        # The client talks to another node than the one that leads its queue.
        gateway = next(n for n in cluster.nodes if n != leader)
        connection = connect(ports[gateway])
        channel = connection.channel()
        channel.confirm_delivery()
        sent = [f"order {i}".encode() for i in range(200)]
        for body in sent:
            channel.basic_publish(exchange="", routing_key=queue, body=body,
                                  properties=pika.BasicProperties(delivery_mode=2))
        channel.basic_qos(prefetch_count=5)
        held = receive(channel, queue, 5, auto_ack=False)
        assert [body for _, _, body in held] == sent[:5] and not any(m.redelivered for m, _, _ in held)

        cluster.nodes[leader].kill()
        wait_for("another leader", lambda: cluster.partition_state(queue, 0)[0] not in (leader, -1), timeout=60)
        try:
            connection.close()
        except pika.exceptions.AMQPError:
            pass
        connection = connect(ports[gateway])
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish(exchange="", routing_key=queue, body=b"after the kill")
        channel.basic_qos(prefetch_count=500)
        got = receive(channel, queue, len(sent) + 1, auto_ack=False)
        bodies = [body for _, _, body in got]
        assert sorted(set(bodies)) == sorted(sent + [b"after the kill"]), "every confirmed message"
        flagged = {body for method, _, body in got if method.redelivered}
        assert set(sent[:5]) <= flagged, f"held messages not flagged redelivered: {set(sent[:5]) - flagged}"
        assert b"after the kill" not in flagged
        channel.basic_ack(0, multiple=True)
        connection.close()

        # The old leader, back, counts what is left once it has caught up with the others.
        cluster.nodes[leader].start()
        again = connect(ports[leader])
        probe = again.channel()

        def left():
            return probe.queue_declare(queue=queue, durable=True, passive=True).method.message_count

        wait_for("nothing left in the queue, as the restarted node counts it", lambda: left() == 0, timeout=30)
        again.close()
    finally:
        cluster.kill_all()



# Scenarios of test_amqp.py that need nothing of a single node (no restart, no data dir, no
# listener config of their own), run through node 2 of a 3-node cluster. Not here: x-expires,
# which a cluster does not offer (docs/amqp.md).
SCENARIOS_ON_ANY_NODE = [
    test_amqp.test_hello_world_and_work_queues,
    test_amqp.test_a_message_not_acknowledged_is_redelivered_flagged,
    test_amqp.test_basic_get_and_queue_delete_say_how_many_messages_are_left,
    test_amqp.test_cc_and_bcc_headers_route_to_more_queues_and_bcc_is_not_delivered,
    test_amqp.test_a_queue_at_its_max_length_drops_its_oldest_or_refuses_more,
    test_amqp.test_publish_subscribe_routing_and_topics,
    test_amqp.test_rpc,
    test_amqp.test_transactions_publish_on_commit_only,
    test_amqp.test_dead_letter_exchanges_take_rejected_expired_and_over_delivered_messages,
    test_amqp.test_an_exclusive_consumer_has_the_queue_to_itself,
    test_amqp.test_kafka_clients_read_what_amqp_published_and_feed_amqp_consumers,
    test_amqp.test_a_consumer_holds_an_unacknowledged_message_past_the_lock_duration,
]


@pytest.mark.parametrize("scenario", SCENARIOS_ON_ANY_NODE, ids=lambda s: s.__name__.removeprefix("test_"))
def test_single_node_scenarios_pass_through_any_node_of_a_cluster(tmp_path, scenario):
    cluster, ports = amqp_cluster(tmp_path)
    try:
        every_log = lambda: "".join(node.log() for node in cluster.nodes.values())  # noqa: E731
        scenario(SimpleNamespace(amqp_port=ports[2], bootstrap=cluster.nodes[2].bootstrap, log=every_log))
    finally:
        cluster.kill_all()
