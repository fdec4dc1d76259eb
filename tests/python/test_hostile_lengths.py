"""Requests whose array length fields claim billions of elements: the connection is closed
and the broker keeps serving (the decoder must not abort the process on the allocation)."""

import socket
import struct

from confluent_kafka.admin import AdminClient


def frame(api_key: int, version: int, body: bytes, correlation_id: int = 1) -> bytes:
    client_id = b"hostile"
    header = struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id
    payload = header + body
    return struct.pack(">i", len(payload)) + payload


def closed_by_broker(sock: socket.socket) -> bool:
    sock.settimeout(10)
    try:
        return sock.recv(4096) == b""
    except ConnectionResetError:
        return True


def test_huge_array_counts_close_the_connection_and_broker_survives(broker):
    cases = [
        # Metadata v4: topics array count, then nothing.
        frame(3, 4, struct.pack(">i", 0x7FFFFFFF)),
        # CreateTopics v4: topics array count claims 2^31-1 entries.
        frame(19, 4, struct.pack(">i", 0x7FFFFFF0)),
        # Produce v3: transactional id null, acks, timeout, then a huge topic array.
        frame(0, 3, struct.pack(">hhii", -1, 1, 1000, 0x7FFFFFFF)),
    ]
    for payload in cases:
        with socket.create_connection(("127.0.0.1", broker.port)) as sock:
            sock.sendall(payload)
            assert closed_by_broker(sock), "broker should close a connection sending an undecodable request"
        assert broker.is_running(), f"broker died on a hostile length field; log:\n{broker.log()}"
    metadata = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=10)
    assert 0 in metadata.brokers
