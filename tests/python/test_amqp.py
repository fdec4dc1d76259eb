"""AMQP 0-9-1: RabbitMQ's own clients (pika, and the Java `amqp-client`) against
`sluice serve --amqp-listen`.

RabbitMQ's tutorials, run as they are written (hello world, work queues, publish/subscribe,
routing, topics, RPC); publisher confirms surviving `kill -9`; requeue and redelivery; the
same queue read by Kafka clients and fed by them; bad frames answered with RabbitMQ's
error codes; logins against the broker's SCRAM users and ACLs.
"""

import socket
import struct
import threading
import time
import uuid

import pika
import pytest
from confluent_kafka import Consumer, Producer

from cluster_support import wait_for
from conftest import Broker, free_port
from java_support import java_cp, run_java  # noqa: F401  (java_cp is a fixture)

READ_TIMEOUT_S = 20.0


def amqp_broker(tmp_path, extra_args=(), port=None) -> Broker:
    """A broker taking AMQP clients on `broker.amqp_port`."""
    amqp_port = free_port()
    broker = Broker(tmp_path / "data", port=port, extra_args=["--amqp-listen", f"127.0.0.1:{amqp_port}", *extra_args])
    broker.amqp_port = amqp_port
    return broker.start()


def connect(port: int, user: str = "guest", password: str = "guest") -> pika.BlockingConnection:
    credentials = pika.PlainCredentials(user, password)
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, credentials=credentials,
                                                             blocked_connection_timeout=30))


def receive(channel, queue: str, count: int, auto_ack: bool = True) -> list:
    """`count` messages of `queue` as (method, properties, body), consumed as the tutorials do."""
    got = []
    for method, properties, body in channel.consume(queue, auto_ack=auto_ack, inactivity_timeout=READ_TIMEOUT_S):
        assert method is not None, f"{queue}: {len(got)} of {count} messages arrived"
        got.append((method, properties, body))
        if len(got) == count:
            break
    channel.cancel()
    return got


@pytest.fixture
def amqp(tmp_path):
    broker = amqp_broker(tmp_path)
    yield broker
    broker.stop()


def test_hello_world_and_work_queues(amqp):
    connection = connect(amqp.amqp_port)
    channel = connection.channel()
    channel.queue_declare(queue="hello")
    channel.basic_publish(exchange="", routing_key="hello", body=b"Hello World!")
    channel.basic_publish(exchange="", routing_key="hello", body=b"Hello again")
    assert channel.queue_declare(queue="hello", passive=True).method.message_count == 2
    [(method, _, body), _] = receive(channel, "hello", 2)
    assert body == b"Hello World!" and method.routing_key == "hello" and not method.redelivered

    # Work queues: a durable queue, persistent messages, fair dispatch (prefetch 1) to two
    # workers that acknowledge by hand; each task is done exactly once.
    channel.queue_declare(queue="task_queue", durable=True)
    channel.confirm_delivery()
    tasks = [f"task {i}".encode() for i in range(20)]
    for task in tasks:
        channel.basic_publish(exchange="", routing_key="task_queue", body=task,
                              properties=pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent))
    done: list[bytes] = []
    lock = threading.Lock()

    def worker():
        worker_connection = connect(amqp.amqp_port)
        worker_channel = worker_connection.channel()
        worker_channel.basic_qos(prefetch_count=1)
        for method, properties, body in worker_channel.consume("task_queue", inactivity_timeout=3):
            if method is None:
                break
            assert properties.delivery_mode == 2
            with lock:
                done.append(body)
            worker_channel.basic_ack(delivery_tag=method.delivery_tag)
        worker_connection.close()

    workers = [threading.Thread(target=worker) for _ in range(2)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join(60)
    assert sorted(done) == sorted(tasks)
    connection.close()


def test_a_message_not_acknowledged_is_redelivered_flagged(amqp):
    connection = connect(amqp.amqp_port)
    channel = connection.channel()
    channel.queue_declare(queue="jobs", durable=True)
    channel.basic_publish(exchange="", routing_key="jobs", body=b"job")
    method, _, body = channel.basic_get("jobs", auto_ack=False)
    assert body == b"job" and not method.redelivered
    channel.basic_nack(method.delivery_tag, requeue=True)
    [(method, _, body)] = receive(channel, "jobs", 1, auto_ack=False)
    assert body == b"job" and method.redelivered
    # A consumer whose connection goes away without acknowledging gives its messages back.
    other = connect(amqp.amqp_port)
    other_channel = other.channel()
    other_channel.basic_publish(exchange="", routing_key="jobs", body=b"second")
    got = receive(other_channel, "jobs", 1, auto_ack=False)
    assert got[0][2] in (b"job", b"second")
    other.close()
    channel.basic_ack(0, multiple=True)
    bodies = sorted(body for _, _, body in receive(channel, "jobs", 1, auto_ack=True))
    assert bodies and all(b in (b"job", b"second") for b in bodies)
    connection.close()


def test_basic_get_and_queue_delete_say_how_many_messages_are_left(amqp):
    connection = connect(amqp.amqp_port)
    channel = connection.channel()
    channel.queue_declare(queue="counted", durable=True)
    for i in range(3):
        channel.basic_publish(exchange="", routing_key="counted", body=f"m{i}".encode())
    method, _, body = channel.basic_get("counted", auto_ack=True)
    assert body == b"m0" and method.message_count == 2
    method, _, body = channel.basic_get("counted", auto_ack=True)
    assert body == b"m1" and method.message_count == 1
    for i in range(3, 5):
        channel.basic_publish(exchange="", routing_key="counted", body=f"m{i}".encode())
    assert channel.queue_declare(queue="counted", passive=True).method.message_count == 3
    assert channel.queue_delete(queue="counted").method.message_count == 3
    # Only ready messages count, as in RabbitMQ: not one a consumer holds unacknowledged.
    channel.queue_declare(queue="held", durable=True)
    for i in range(3):
        channel.basic_publish(exchange="", routing_key="held", body=f"h{i}".encode())
    method, _, body = channel.basic_get("held")
    assert body == b"h0" and method.message_count == 2
    assert channel.queue_declare(queue="held", passive=True).method.message_count == 2
    channel.basic_ack(method.delivery_tag)
    connection.close()


def test_cc_and_bcc_headers_route_to_more_queues_and_bcc_is_not_delivered(amqp):
    """RabbitMQ's sender-selected distribution: the routing keys in `CC` and `BCC` route the
    message too; no consumer sees `BCC`."""
    channel = connect(amqp.amqp_port).channel()
    channel.confirm_delivery()
    for queue in ["to", "copied", "blind"]:
        channel.queue_declare(queue=queue, durable=True)
    channel.basic_publish(exchange="", routing_key="to", body=b"memo",
                          properties=pika.BasicProperties(headers={"CC": ["copied"], "BCC": ["blind"]}))
    for queue in ["to", "copied", "blind"]:
        _, properties, body = channel.basic_get(queue, auto_ack=True)
        assert body == b"memo", queue
        assert properties.headers == {"CC": ["copied"]}, (queue, properties.headers)


def test_a_queue_at_its_max_length_drops_its_oldest_or_refuses_more(amqp):
    """`x-max-length` bounds a queue's ready messages: by default (`drop-head`) the oldest go
    when a new one is stored, and with `x-overflow: reject-publish` a new one is refused with a
    nack while the queue is full (the other queues it was routed to still take it). Messages a
    consumer holds do not count."""
    connection = connect(amqp.amqp_port)
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare(queue="newest", durable=True, arguments={"x-max-length": 3})
    for i in range(5):
        channel.basic_publish(exchange="", routing_key="newest", body=f"n{i}".encode())
    assert channel.queue_declare(queue="newest", passive=True).method.message_count == 3
    held, _, body = channel.basic_get("newest")
    assert body == b"n2" and held.message_count == 2
    for i in range(5, 8):
        channel.basic_publish(exchange="", routing_key="newest", body=f"n{i}".encode())
    # n2 is held (not counted); of n3..n7 the newest three are left.
    got = [channel.basic_get("newest", auto_ack=True)[2] for _ in range(3)]
    assert got == [b"n5", b"n6", b"n7"]
    assert channel.basic_get("newest", auto_ack=True) == (None, None, None)
    channel.basic_ack(held.delivery_tag)

    channel.queue_declare(queue="bounded", durable=True,
                          arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
    channel.queue_declare(queue="unbounded", durable=True)
    channel.exchange_declare(exchange="both", exchange_type="fanout")
    for queue in ["bounded", "unbounded"]:
        channel.queue_bind(queue=queue, exchange="both")
    for i in range(2):
        channel.basic_publish(exchange="both", routing_key="", body=f"b{i}".encode())
    with pytest.raises(pika.exceptions.NackError):
        channel.basic_publish(exchange="both", routing_key="", body=b"b2")
    assert channel.basic_get("bounded", auto_ack=True)[2] == b"b0"
    channel.basic_publish(exchange="both", routing_key="", body=b"b3")
    assert [channel.basic_get("bounded", auto_ack=True)[2] for _ in range(2)] == [b"b1", b"b3"]
    assert [channel.basic_get("unbounded", auto_ack=True)[2] for _ in range(4)] == [b"b0", b"b1", b"b2", b"b3"]

    # With a dead-letter exchange, what the head loses goes there, as RabbitMQ's `maxlen`.
    channel.exchange_declare(exchange="overflow-x", exchange_type="fanout")
    channel.queue_declare(queue="overflow", durable=True)
    channel.queue_bind(queue="overflow", exchange="overflow-x")
    channel.queue_declare(queue="latest", durable=True,
                          arguments={"x-max-length": 1, "x-dead-letter-exchange": "overflow-x"})
    for i in range(3):
        channel.basic_publish(exchange="", routing_key="latest", body=f"l{i}".encode())
    assert channel.basic_get("latest", auto_ack=True)[2] == b"l2"
    dropped = [channel.basic_get("overflow", auto_ack=True) for _ in range(2)]
    assert [body for _, _, body in dropped] == [b"l0", b"l1"]
    death = dropped[0][1].headers["x-death"][0]
    assert (death["reason"], death["queue"], death["count"]) == ("maxlen", "latest", 1)

    for arguments in [{"x-max-length": -1}, {"x-max-length-bytes": 1024},
                      {"x-max-length": 5, "x-overflow": "reject-publish-dlx"}]:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            connection.channel().queue_declare(queue="refused", durable=True, arguments=arguments)
        assert refused.value.reply_code == 406, arguments
    connection.close()


def test_the_java_client_runs_rabbitmqs_tutorials(amqp, java_cp):  # noqa: F811
    res = run_java(java_cp, "sluice.tests.AmqpTutorials", ["--host", "127.0.0.1", "--port", str(amqp.amqp_port)],
                   timeout=120)
    assert res.returncode == 0, f"{res.report()}\n--- broker log (tail) ---\n{amqp.log()[-4000:]}"
    for tutorial in ["hello-world", "work-queues", "publish-subscribe", "routing", "topics", "rpc"]:
        assert f"tutorial {tutorial} ok" in res.stdout, res.report()


def test_publish_subscribe_routing_and_topics(amqp):
    connection = connect(amqp.amqp_port)
    channel = connection.channel()
    # Publish/subscribe: every subscriber's exclusive queue gets every message.
    channel.exchange_declare(exchange="logs", exchange_type="fanout")
    subscribers = []
    for _ in range(2):
        queue = channel.queue_declare(queue="", exclusive=True).method.queue
        assert queue.startswith("amq.gen-")
        channel.queue_bind(exchange="logs", queue=queue)
        subscribers.append(queue)
    channel.basic_publish(exchange="logs", routing_key="", body=b"info: hello")
    for queue in subscribers:
        assert [body for _, _, body in receive(channel, queue, 1)] == [b"info: hello"]

    # Routing: a direct exchange by severity.
    channel.exchange_declare(exchange="direct_logs", exchange_type="direct")
    errors = channel.queue_declare(queue="", exclusive=True).method.queue
    everything = channel.queue_declare(queue="", exclusive=True).method.queue
    channel.queue_bind(exchange="direct_logs", queue=errors, routing_key="error")
    for severity in ("info", "warning", "error"):
        channel.queue_bind(exchange="direct_logs", queue=everything, routing_key=severity)
    for severity in ("info", "error", "debug"):
        channel.basic_publish(exchange="direct_logs", routing_key=severity, body=severity.encode())
    assert [body for _, _, body in receive(channel, errors, 1)] == [b"error"]
    assert [body for _, _, body in receive(channel, everything, 2)] == [b"info", b"error"]

    # Topics: "*" is one word, "#" any number.
    channel.exchange_declare(exchange="topic_logs", exchange_type="topic")
    orange = channel.queue_declare(queue="", exclusive=True).method.queue
    lazy = channel.queue_declare(queue="", exclusive=True).method.queue
    channel.queue_bind(exchange="topic_logs", queue=orange, routing_key="*.orange.*")
    channel.queue_bind(exchange="topic_logs", queue=lazy, routing_key="lazy.#")
    for key in ("quick.orange.rabbit", "lazy.brown.fox", "lazy.orange.elephant", "quick.brown.fox"):
        channel.basic_publish(exchange="topic_logs", routing_key=key, body=key.encode())
    assert [m.routing_key for m, _, _ in receive(channel, orange, 2)] == ["quick.orange.rabbit", "lazy.orange.elephant"]
    assert [m.routing_key for m, _, _ in receive(channel, lazy, 2)] == ["lazy.brown.fox", "lazy.orange.elephant"]

    # Unroutable with mandatory: returned, and the confirm still comes.
    channel.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError):
        channel.basic_publish(exchange="direct_logs", routing_key="nobody", body=b"x", mandatory=True)
    # Publishing to an exchange that does not exist closes the channel with 404.
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        channel.basic_publish(exchange="missing", routing_key="", body=b"x")
    assert closed.value.reply_code == 404
    connection.close()
    # Exclusive queues went with their connection.
    check = connect(amqp.amqp_port).channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as gone:
        check.queue_declare(queue=subscribers[0], passive=True)
    assert gone.value.reply_code == 404


def test_rpc(amqp):
    server_connection = connect(amqp.amqp_port)
    server_channel = server_connection.channel()
    server_channel.queue_declare(queue="rpc_queue")
    stop = threading.Event()

    def fib(n):
        return n if n < 2 else fib(n - 1) + fib(n - 2)

    def serve():
        for method, properties, body in server_channel.consume("rpc_queue", inactivity_timeout=0.5):
            if stop.is_set():
                break
            if method is None:
                continue
            answer = str(fib(int(body))).encode()
            server_channel.basic_publish(exchange="", routing_key=properties.reply_to, body=answer,
                                         properties=pika.BasicProperties(correlation_id=properties.correlation_id))
            server_channel.basic_ack(delivery_tag=method.delivery_tag)

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        client = connect(amqp.amqp_port)
        channel = client.channel()
        callback = channel.queue_declare(queue="", exclusive=True).method.queue
        answers = {}

        def on_response(ch, method, properties, body):
            answers[properties.correlation_id] = body

        channel.basic_consume(queue=callback, on_message_callback=on_response, auto_ack=True)
        asked = {}
        for n in (10, 20):
            correlation_id = str(uuid.uuid4())
            asked[correlation_id] = n
            channel.basic_publish(exchange="", routing_key="rpc_queue", body=str(n).encode(),
                                  properties=pika.BasicProperties(reply_to=callback, correlation_id=correlation_id))
        deadline = time.monotonic() + READ_TIMEOUT_S
        while len(answers) < len(asked) and time.monotonic() < deadline:
            client.process_data_events(time_limit=0.2)
        assert {asked[c]: int(a) for c, a in answers.items()} == {10: 55, 20: 6765}
        client.close()
    finally:
        stop.set()
        thread.join(10)
        server_connection.close()


def test_confirmed_messages_survive_kill_9_and_held_ones_come_back(tmp_path):
    broker = amqp_broker(tmp_path)
    port = broker.amqp_port
    connection = connect(port)
    channel = connection.channel()
    channel.queue_declare(queue="orders", durable=True)
    channel.confirm_delivery()
    sent = [f"order {i}".encode() for i in range(200)]
    for body in sent:
        channel.basic_publish(exchange="", routing_key="orders", body=body,
                              properties=pika.BasicProperties(delivery_mode=2))
    channel.basic_qos(prefetch_count=5)
    held = receive(channel, "orders", 5, auto_ack=False)
    assert [body for _, _, body in held] == sent[:5] and not any(m.redelivered for m, _, _ in held)
    broker.kill()
    broker.start()
    connection = connect(port)
    channel = connection.channel()
    channel.confirm_delivery()
    channel.basic_publish(exchange="", routing_key="orders", body=b"after the crash")
    got = receive(channel, "orders", len(sent) + 1, auto_ack=False)
    assert sorted(body for _, _, body in got) == sorted(sent + [b"after the crash"]), "every confirmed message once"
    # The five held unacknowledged when the broker died come back flagged: they may have
    # been processed. What was published after the restart never was.
    flagged = {body for method, _, body in got if method.redelivered}
    assert set(sent[:5]) <= flagged, f"held messages not flagged redelivered: {set(sent[:5]) - flagged}"
    assert b"after the crash" not in flagged
    channel.basic_ack(0, multiple=True)
    connection.close()
    broker.stop()


def test_confirmed_messages_and_the_topology_survive_power_cuts(tmp_path):
    """The data dir on `sluice-lossyfs` (every byte not fsynced, and every directory entry
    whose directory was not fsynced, vanishes at a cut): over rounds of confirmed publishes
    through an exchange, acknowledgements and held messages, each ended by a power cut, the
    exchange and its binding are still there, every confirmed message not acknowledged is
    delivered again, none twice, and the held ones come back flagged redelivered."""
    from lossyfs import LossyMount
    IDLE_S = 3.0
    mount = LossyMount(tmp_path / "fs", strict_dirs=True).start()
    port = free_port()
    broker = Broker(mount.mount / "data", log_dir=tmp_path, extra_args=["--amqp-listen", f"127.0.0.1:{port}"])
    try:
        broker.start()
        channel = connect(port).channel()
        channel.exchange_declare(exchange="orders-x", exchange_type="fanout", durable=True)
        channel.queue_declare(queue="orders", durable=True)
        channel.queue_bind(queue="orders", exchange="orders-x")
        confirmed, acknowledged = set(), set()
        for round_index in range(3):
            channel = connect(port).channel()
            channel.confirm_delivery()
            for i in range(200):
                body = f"round {round_index} order {i}".encode()
                channel.basic_publish(exchange="orders-x", routing_key="", body=body,
                                      properties=pika.BasicProperties(delivery_mode=2))
                confirmed.add(body)
            channel.basic_qos(prefetch_count=25)
            taken = receive(channel, "orders", 25, auto_ack=False)
            for method, _, body in taken[:20]:
                channel.basic_ack(method.delivery_tag)
                acknowledged.add(body)
            held = {body for _, _, body in taken[20:]}
            broker.kill()
            mount.power_loss()
            broker.start()
            channel = connect(port).channel()
            channel.basic_qos(prefetch_count=1000)
            # Acknowledgements are not answered in AMQP: one the cut took comes back too, so
            # everything the queue hands out is read, until it has nothing more for a while.
            got = []
            for method, properties, body in channel.consume("orders", inactivity_timeout=IDLE_S):
                if method is None:
                    break
                got.append((method, properties, body))
            channel.cancel()
            bodies = [body for _, _, body in got]
            assert len(bodies) == len(set(bodies)), f"round {round_index}: a message delivered twice"
            assert confirmed - acknowledged <= set(bodies), f"round {round_index}: confirmed messages lost"
            flagged = {body for method, _, body in got if method.redelivered}
            assert held <= flagged, f"round {round_index}: held messages not flagged redelivered"
            channel.basic_nack(0, multiple=True, requeue=True)
            channel.connection.close()
    finally:
        broker.kill()
        mount.stop()


def test_kafka_clients_read_what_amqp_published_and_feed_amqp_consumers(amqp):
    bootstrap = amqp.bootstrap
    connection = connect(amqp.amqp_port)
    channel = connection.channel()
    channel.queue_declare(queue="events", durable=True)
    channel.confirm_delivery()
    channel.basic_publish(exchange="", routing_key="events", body=b"from amqp",
                          properties=pika.BasicProperties(content_type="text/plain", headers={"trace": "t-1"}))
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader", "auto.offset.reset": "earliest"})
    consumer.subscribe(["events"])
    message = None
    deadline = time.monotonic() + READ_TIMEOUT_S
    while message is None and time.monotonic() < deadline:
        message = consumer.poll(0.5)
    consumer.close()
    assert message is not None and message.error() is None and message.value() == b"from amqp"
    headers = dict(message.headers())
    assert headers["amqp-content-type"] == b"text/plain" and headers["trace"] == b"t-1"
    assert message.key() == b"events"

    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce("events", key=b"k", value=b"from kafka", headers={"source": b"kafka"})
    producer.flush(10)
    got = receive(channel, "events", 2)
    assert [body for _, _, body in got] == [b"from amqp", b"from kafka"]
    method, properties, _ = got[1]
    assert method.routing_key == "k" and properties.headers == {"source": "kafka"}
    connection.close()


def raw_handshake(port: int) -> socket.socket:
    """A socket past the handshake (PLAIN guest/guest, vhost /)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(b"AMQP\x00\x00\x09\x01")
    read_frame(sock)  # connection.start
    response = b"\x00guest\x00guest"
    args = struct.pack(">I", 0) + short_str("PLAIN") + struct.pack(">I", len(response)) + response + short_str("en_US")
    send_method(sock, 0, 10, 11, args)
    read_frame(sock)  # connection.tune
    send_method(sock, 0, 10, 31, struct.pack(">HIH", 0, 131072, 0))
    send_method(sock, 0, 10, 40, short_str("/") + short_str("") + b"\x00")
    assert read_frame(sock)[2][:4] == struct.pack(">HH", 10, 41)  # open-ok
    return sock


def short_str(text: str) -> bytes:
    return bytes([len(text)]) + text.encode()


def send_method(sock, channel: int, class_id: int, method_id: int, args: bytes) -> None:
    payload = struct.pack(">HH", class_id, method_id) + args
    sock.sendall(struct.pack(">BHI", 1, channel, len(payload)) + payload + b"\xce")


def read_frame(sock) -> tuple[int, int, bytes]:
    header = b""
    while len(header) < 7:
        chunk = sock.recv(7 - len(header))
        assert chunk, "connection closed"
        header += chunk
    kind, channel, size = struct.unpack(">BHI", header)
    payload = b""
    while len(payload) < size + 1:
        chunk = sock.recv(size + 1 - len(payload))
        assert chunk, "connection closed"
        payload += chunk
    return kind, channel, payload[:-1]


def close_code(sock) -> int:
    """The reply code of the connection.close the server sends."""
    while True:
        kind, channel, payload = read_frame(sock)
        if kind == 1 and payload[:4] == struct.pack(">HH", 10, 50):
            return struct.unpack(">H", payload[4:6])[0]


@pytest.mark.parametrize("frame, code", [
    (struct.pack(">BHI", 1, 0, 4) + struct.pack(">HH", 99, 1) + b"\xce", 540),  # unknown class
    (struct.pack(">BHI", 1, 1, 4) + struct.pack(">HH", 60, 40) + b"\x00", 501),  # no frame end
    (struct.pack(">BHI", 1, 1, 5) + struct.pack(">HH", 60, 80) + b"\x01\xce", 502),  # truncated basic.ack
    (struct.pack(">BHI", 3, 1, 1 << 20) + b"\x00", 501),  # above frame_max
    (struct.pack(">BHI", 3, 5, 1) + b"x\xce", 504),  # body on a channel never opened
    (struct.pack(">BHI", 1, 1, 5) + struct.pack(">HH", 20, 10) + b"\x00\xce"  # channel.open, then
     + struct.pack(">BHI", 2, 1, 14) + struct.pack(">HHQH", 60, 0, 0, 0) + b"\xce", 505),  # a header, no publish
])
def test_bad_frames_close_the_connection_with_rabbitmqs_codes(amqp, frame, code):
    sock = raw_handshake(amqp.amqp_port)
    sock.sendall(frame)
    assert close_code(sock) == code
    sock.close()


def test_a_wrong_protocol_header_is_answered_with_the_one_spoken(amqp):
    sock = socket.create_connection(("127.0.0.1", amqp.amqp_port), timeout=10)
    sock.sendall(b"AMQP\x00\x01\x00\x00")
    assert sock.recv(8) == b"AMQP\x00\x00\x09\x01"
    sock.close()


def test_logins_and_acls_decide_who_declares_publishes_and_consumes(tmp_path):
    from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, AdminClient, ResourcePatternType,
                                       ResourceType)
    from test_security import add_user
    plaintext, sasl = free_port(), free_port()
    broker = amqp_broker(tmp_path, extra_args=[
        "--override", f"listeners=PLAINTEXT://127.0.0.1:{plaintext},SASL_PLAINTEXT://127.0.0.1:{sasl}",
        "--override", "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "--override", "allow.everyone.if.no.acl.found=false",
        "--override", "super.users=User:admin;User:ANONYMOUS",
        "--override", "sasl.enabled.mechanisms=SCRAM-SHA-256"], port=plaintext)
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{plaintext}"})
    for user in ["alice", "bob"]:
        add_user(admin, user, f"{user}-secret")

    def allow(principal, name, operation, resource=ResourceType.TOPIC):
        binding = AclBinding(resource, name, ResourcePatternType.LITERAL, principal, "*", operation,
                             AclPermissionType.ALLOW)
        for future in admin.create_acls([binding]).values():
            future.result(timeout=10)

    # alice may create and write `orders`; bob may read it through its share group.
    allow("User:alice", "orders", AclOperation.CREATE)
    allow("User:alice", "orders", AclOperation.WRITE)
    allow("User:bob", "orders", AclOperation.READ)
    allow("User:bob", "orders", AclOperation.READ, ResourceType.GROUP)
    port = broker.amqp_port
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        connect(port, "alice", "wrong")
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        connect(port, "guest", "guest")

    alice = connect(port, "alice", "alice-secret").channel()
    alice.queue_declare(queue="orders", durable=True)
    alice.confirm_delivery()
    alice.basic_publish(exchange="", routing_key="orders", body=b"order 1")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        alice.exchange_declare(exchange="orders-x", exchange_type="fanout")
    assert refused.value.reply_code == 403
    # Dead letters are republished by the broker: naming where they go is routing too.
    alice = connect(port, "alice", "alice-secret").channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        alice.queue_declare(queue="orders", durable=True, arguments={"x-dead-letter-exchange": "amq.fanout"})
    assert refused.value.reply_code == 403 and "CREATE on the cluster" in refused.value.reply_text
    alice = connect(port, "alice", "alice-secret").channel()
    alice.confirm_delivery()

    bob_connection = connect(port, "bob", "bob-secret")
    bob = bob_connection.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        bob.basic_publish(exchange="", routing_key="orders", body=b"forged")
        bob.queue_declare(queue="orders", passive=True)  # the close arrives by then
    assert refused.value.reply_code == 403
    bob = bob_connection.channel()
    assert [body for _, _, body in receive(bob, "orders", 1)] == [b"order 1"]

    alice = connect(port, "alice", "alice-secret").channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        alice.basic_consume(queue="orders", on_message_callback=lambda *a: None)
    assert refused.value.reply_code == 403
    broker.stop()


def test_transactions_publish_on_commit_only(amqp):
    connection = connect(amqp.amqp_port)
    channel = connection.channel()
    channel.queue_declare(queue="ledger", durable=True)
    channel.tx_select()
    channel.basic_publish(exchange="", routing_key="ledger", body=b"rolled back")
    channel.tx_rollback()
    channel.basic_publish(exchange="", routing_key="ledger", body=b"committed")
    assert channel.basic_get("ledger", auto_ack=True) == (None, None, None), "nothing before the commit"
    channel.tx_commit()
    assert [body for _, _, body in receive(channel, "ledger", 1)] == [b"committed"]
    assert channel.basic_get("ledger", auto_ack=True) == (None, None, None)
    connection.close()


def get_one(channel, queue: str, timeout_s: float = READ_TIMEOUT_S):
    """`basic.get` until `queue` gives a message (a share group's first fetch may come back empty)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        method, properties, body = channel.basic_get(queue, auto_ack=False)
        if method is not None:
            return method, properties, body
        time.sleep(0.1)
    raise AssertionError(f"{queue}: no message within {timeout_s}s")


def death(properties) -> dict:
    [entry, *_] = properties.headers["x-death"]
    return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in entry.items()}


def test_dead_letter_exchanges_take_rejected_expired_and_over_delivered_messages(amqp):
    """RabbitMQ's dead-lettering: a message rejected without requeue, one older than the
    queue's `x-message-ttl` or its own `expiration`, and one returned more often than
    `x-delivery-limit` allows, each republished to the queue's `x-dead-letter-exchange` with
    an `x-death` header saying why; without a dead-letter exchange an expired message is
    dropped; a wrong argument is refused with 406."""
    connection = connect(amqp.amqp_port)
    channel = connection.channel()
    channel.exchange_declare("dlx", exchange_type="direct")
    channel.queue_declare("dead", durable=True)
    for key in ("work", "parked"):
        channel.queue_bind("dead", "dlx", routing_key=key)
    channel.queue_declare("work", durable=True, arguments={"x-dead-letter-exchange": "dlx"})
    channel.queue_declare("short", durable=True, arguments={
        "x-dead-letter-exchange": "dlx", "x-dead-letter-routing-key": "parked", "x-message-ttl": 300})
    channel.queue_declare("retried", durable=True, arguments={"x-dead-letter-exchange": "dlx",
                                                              "x-delivery-limit": 1})
    channel.queue_bind("retried", "amq.direct", routing_key="work")
    channel.confirm_delivery()

    # Rejected without requeue: dead-lettered with the routing key it was published with.
    channel.basic_publish("", "work", b"refused", properties=pika.BasicProperties(headers={"trace": "t1"}))
    method, _, _ = get_one(channel, "work")
    channel.basic_reject(method.delivery_tag, requeue=False)
    method, properties, body = get_one(channel, "dead")
    assert body == b"refused" and method.exchange == "dlx" and method.routing_key == "work"
    assert death(properties) | {"time": None} == {
        "count": 1, "reason": "rejected", "queue": "work", "exchange": "", "routing-keys": ["work"], "time": None}
    assert properties.headers["x-first-death-reason"] == "rejected" and properties.headers["trace"] == "t1"
    channel.basic_ack(method.delivery_tag)

    # Expired in the queue (its TTL), or by its own expiration on a queue without TTL.
    channel.basic_publish("", "short", b"stale")
    channel.basic_publish("", "work", b"own-ttl", properties=pika.BasicProperties(expiration="200"))
    time.sleep(0.6)
    assert channel.basic_get("short", auto_ack=False) == (None, None, None)
    method, properties, body = get_one(channel, "dead")
    assert (body, method.routing_key, death(properties)["reason"]) == (b"stale", "parked", "expired")
    channel.basic_ack(method.delivery_tag)
    assert channel.basic_get("work", auto_ack=False) == (None, None, None)
    method, properties, body = get_one(channel, "dead")
    assert body == b"own-ttl" and death(properties)["original-expiration"] == "200"
    assert properties.expiration is None
    channel.basic_ack(method.delivery_tag)

    # Returned once (the limit), redelivered with x-delivery-count; returned again: dead.
    channel.basic_publish("amq.direct", "work", b"flaky")
    method, properties, _ = get_one(channel, "retried")
    channel.basic_nack(method.delivery_tag, requeue=True)
    method, properties, _ = get_one(channel, "retried")
    assert method.redelivered and properties.headers["x-delivery-count"] == 1
    channel.basic_nack(method.delivery_tag, requeue=True)
    method, properties, body = get_one(channel, "dead")
    assert body == b"flaky" and death(properties)["reason"] == "delivery_limit"
    assert death(properties)["exchange"] == "amq.direct"
    channel.basic_ack(method.delivery_tag)
    assert channel.basic_get("retried", auto_ack=False) == (None, None, None)

    # No dead-letter exchange: an expired message is dropped.
    channel.queue_declare("fleeting", arguments={"x-message-ttl": 100})
    channel.basic_publish("", "fleeting", b"gone")
    time.sleep(0.3)
    assert channel.basic_get("fleeting", auto_ack=False) == (None, None, None)
    assert channel.queue_declare("dead", passive=True).method.message_count == 0

    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        channel.queue_declare("bad", arguments={"x-dead-letter-routing-key": "k"})
    assert refused.value.reply_code == 406 and "x-dead-letter-exchange" in refused.value.reply_text
    connection.close()


def test_amqp_and_amqps_ports_are_named_in_listeners(tmp_path):
    """`listeners` names AMQP ports as RabbitMQ users write them, `AMQP://` and `AMQPS://`
    (TLS with the broker's `ssl.keystore.*`): pika over TLS checks the broker's certificate,
    publishes and consumes, and sees what was published on the plain port; a client that
    does not trust the certificate gets no connection."""
    import ssl

    from tls_certs import make_pki
    pki = make_pki(tmp_path / "pki")
    kafka, amqp, amqps = free_port(), free_port(), free_port()
    broker = Broker(tmp_path / "data", port=kafka, extra_args=[
        "--override", f"listeners=PLAINTEXT://127.0.0.1:{kafka},AMQP://127.0.0.1:{amqp},AMQPS://127.0.0.1:{amqps}",
        "--override", f"ssl.keystore.location={pki.server}"]).start()
    try:
        # The broker is started once its Kafka port answers; the AMQP listeners log a moment later.
        wait_for("the AMQPS listener's log line", lambda: f"AMQP 0-9-1 at amqps://127.0.0.1:{amqps}/" in broker.log())
        plain = connect(amqp)
        plain.channel().queue_declare("over-tls", durable=True)
        plain.channel().basic_publish("", "over-tls", b"plain")
        plain.close()

        def tls_params(cafile):
            context = ssl.create_default_context(cafile=str(cafile))
            return pika.ConnectionParameters("127.0.0.1", amqps, ssl_options=pika.SSLOptions(context, "127.0.0.1"),
                                             credentials=pika.PlainCredentials("guest", "guest"))

        secure = pika.BlockingConnection(tls_params(pki.ca))
        channel = secure.channel()
        channel.confirm_delivery()
        channel.basic_publish("", "over-tls", b"secure")
        assert sorted(body for _, _, body in receive(channel, "over-tls", 2)) == [b"plain", b"secure"]
        secure.close()
        with pytest.raises((pika.exceptions.AMQPConnectionError, ssl.SSLError)):
            pika.BlockingConnection(tls_params(pki.other_ca))
    finally:
        broker.stop()


def test_amqps_external_logs_in_as_the_client_certificates_user(tmp_path):
    """Over AMQPS a client certificate logs in with `EXTERNAL` as the user
    `ssl.principal.mapping.rules` makes of it (as on a Kafka SSL listener), and that user's
    ACLs decide; a client without a certificate is not offered EXTERNAL and cannot use it,
    and still logs in with a password."""
    import ssl

    from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, AdminClient,
                                       ResourcePatternType, ResourceType)
    from test_security import add_user
    from tls_certs import make_pki
    pki = make_pki(tmp_path / "pki")
    kafka, sasl, amqps = free_port(), free_port(), free_port()
    broker = Broker(tmp_path / "data", port=kafka, extra_args=[
        "--override", f"listeners=PLAINTEXT://127.0.0.1:{kafka},SASL_PLAINTEXT://127.0.0.1:{sasl},"
                      f"AMQPS://127.0.0.1:{amqps}",
        "--override", "sasl.enabled.mechanisms=SCRAM-SHA-256",
        "--override", f"ssl.keystore.location={pki.server}",
        "--override", f"ssl.truststore.location={pki.ca}",
        "--override", "ssl.client.auth=requested",
        "--override", r"ssl.principal.mapping.rules=RULE:^CN=([^,]*)$/$1/L,DEFAULT",
        "--override", "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "--override", "allow.everyone.if.no.acl.found=false",
        "--override", "super.users=User:ANONYMOUS"]).start()
    try:
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{kafka}"})
        add_user(admin, "alice", "alice-secret")
        user = "User:sluice-test-client"
        bindings = [AclBinding(ResourceType.TOPIC, "by-cert", ResourcePatternType.LITERAL, user, "*", operation,
                               AclPermissionType.ALLOW)
                    for operation in (AclOperation.CREATE, AclOperation.WRITE, AclOperation.READ)]
        bindings.append(AclBinding(ResourceType.GROUP, "by-cert", ResourcePatternType.LITERAL, user, "*",
                                   AclOperation.READ, AclPermissionType.ALLOW))
        for future in admin.create_acls(bindings).values():
            future.result(timeout=10)

        def params(credentials, with_certificate):
            context = ssl.create_default_context(cafile=str(pki.ca))
            if with_certificate:
                context.load_cert_chain(str(pki.client_cert), str(pki.client_key))
            return pika.ConnectionParameters("127.0.0.1", amqps, ssl_options=pika.SSLOptions(context, "127.0.0.1"),
                                             credentials=credentials, blocked_connection_timeout=30)

        by_certificate = pika.BlockingConnection(params(pika.credentials.ExternalCredentials(), True))
        channel = by_certificate.channel()
        channel.queue_declare("by-cert", durable=True)
        channel.confirm_delivery()
        channel.basic_publish("", "by-cert", b"signed")
        assert [body for _, _, body in receive(channel, "by-cert", 1)] == [b"signed"]
        # The certificate's user, not an anonymous super user: no ACL, no queue.
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            by_certificate.channel().queue_declare("not-by-cert", durable=True)
        assert refused.value.reply_code == 403
        by_certificate.close()

        with pytest.raises(pika.exceptions.AMQPConnectionError):
            pika.BlockingConnection(params(pika.credentials.ExternalCredentials(), False))
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            pika.BlockingConnection(params(pika.PlainCredentials("alice", "wrong"), True))
        by_password = pika.BlockingConnection(params(pika.PlainCredentials("alice", "alice-secret"), False))
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            by_password.channel().queue_declare("by-cert", passive=True)
            by_password.channel().basic_get("by-cert")
        assert refused.value.reply_code == 403
        by_password.close()
    finally:
        broker.stop()


def test_amqp_ports_named_twice_or_without_a_keystore_are_refused_at_start(tmp_path):
    from test_startup import run_serve
    port = free_port()
    cases = [
        (["--amqp-listen", f"127.0.0.1:{free_port()}",
          "--override", f"listeners=PLAINTEXT://127.0.0.1:{port},AMQP://127.0.0.1:{free_port()}"], "not both"),
        (["--override", f"listeners=PLAINTEXT://127.0.0.1:{port},AMQPS://127.0.0.1:{free_port()}"], "AMQPS listener"),
        (["--override", f"listeners=AMQP://127.0.0.1:{port}"], "Kafka listeners"),
    ]
    for args, named in cases:
        result = run_serve("--data-dir", str(tmp_path / "d"), *args)
        assert result.returncode != 0, f"{args} was accepted"
        assert named in result.stderr, f"{args}: error does not say {named!r}: {result.stderr}"


def test_an_exclusive_consumer_has_the_queue_to_itself(amqp):
    """`basic.consume` with `exclusive`: refused (403) while the queue has another consumer;
    once it has the queue, every other consumer is refused, and when it goes others may come."""
    connection = connect(amqp.amqp_port)
    channel = connection.channel()
    channel.queue_declare("solo", durable=True)
    first = channel.basic_consume("solo", lambda *_: None)
    other = connection.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        other.basic_consume("solo", lambda *_: None, exclusive=True)
    assert refused.value.reply_code == 403 and "exclusive access" in refused.value.reply_text
    channel.basic_cancel(first)

    owner = connection.channel()
    owner.basic_consume("solo", lambda *_: None, exclusive=True)
    intruder = connection.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        intruder.basic_consume("solo", lambda *_: None)
    assert refused.value.reply_code == 403 and "in exclusive use" in refused.value.reply_text
    owner.close()
    connection.channel().basic_consume("solo", lambda *_: None)
    connection.close()


def test_a_queue_unused_past_its_x_expires_is_deleted(amqp):
    """`x-expires`: a queue nobody consumes, declares or reads for that long goes away with
    its messages; one with a consumer stays; a bad value is refused with 406."""
    connection = connect(amqp.amqp_port)
    channel = connection.channel()
    channel.queue_declare("brief", arguments={"x-expires": 600})
    channel.basic_publish("", "brief", b"left behind")
    channel.queue_declare("watched", arguments={"x-expires": 600})
    channel.basic_consume("watched", lambda *_: None)
    time.sleep(0.3)
    channel.queue_declare("brief", passive=True, arguments={"x-expires": 600})  # a use: the clock starts again
    time.sleep(0.4)
    assert channel.queue_declare("brief", passive=True).method.message_count == 1
    time.sleep(1.0)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as gone:
        channel.queue_declare("brief", passive=True)
    assert gone.value.reply_code == 404
    assert "deleted topic" in amqp.log() or "x-expires" in amqp.log()
    channel = connection.channel()
    channel.queue_declare("watched", passive=True)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        channel.queue_declare("never", arguments={"x-expires": 0})
    assert refused.value.reply_code == 406
    connection.close()


def test_a_consumer_holds_an_unacknowledged_message_past_the_lock_duration(amqp):
    """RabbitMQ lets a consumer keep a message unacknowledged as long as it likes (up to
    `consumer_timeout`); the queue's share group would take it back when its lock runs out
    (here 1 s). The front door renews the lock: another consumer never gets the message, and
    the late ack is the one that counts."""
    import kafka_wire as kw

    connection = connect(amqp.amqp_port)
    channel = connection.channel()
    channel.queue_declare("slow-jobs", durable=True)
    with kw.Conn.to(amqp.bootstrap) as conn:
        assert conn.set_group_configs("slow-jobs", {"share.record.lock.duration.ms": "1000"}) == (kw.NONE, None)
    channel.basic_publish("", "slow-jobs", b"long job")
    channel.basic_qos(prefetch_count=1)
    [(method, _, body)] = receive(channel, "slow-jobs", 1, auto_ack=False)
    assert body == b"long job"
    other = connect(amqp.amqp_port)
    other_channel = other.channel()
    stolen = []
    other_channel.basic_consume("slow-jobs", lambda ch, m, p, b: stolen.append(b), auto_ack=True)
    other.process_data_events(time_limit=4.0)  # four lock durations
    assert stolen == [], "the held message went to another consumer"
    channel.basic_ack(method.delivery_tag)
    other.process_data_events(time_limit=1.5)
    assert stolen == [], "an acknowledged message came back"
    other.close()
    connection.close()
