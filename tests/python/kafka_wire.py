"""A small hand-written Kafka wire-protocol client for tests that need exact bytes.

Only what the raw-socket tests use: request/response headers (v1/v2 request, v0/v1
response), ApiVersions, Metadata, Produce, Fetch, ListOffsets, CreateTopics, the share-group
APIs (ShareGroupHeartbeat, ShareFetch, ShareAcknowledge v1), and the v2 record batch format
with its CRC32C. Encoders follow the Kafka protocol spec
(https://kafka.apache.org/protocol); "flexible" versions use compact strings/arrays
and tagged fields.
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass, field
from typing import NamedTuple

# API keys
PRODUCE = 0
FETCH = 1
LIST_OFFSETS = 2
METADATA = 3
API_VERSIONS = 18
CREATE_TOPICS = 19
DELETE_TOPICS = 20
INIT_PRODUCER_ID = 22
FIND_COORDINATOR = 10
INCREMENTAL_ALTER_CONFIGS = 44
SHARE_GROUP_HEARTBEAT = 76
SHARE_FETCH = 78
SHARE_ACKNOWLEDGE = 79

# Error codes
NONE = 0
OFFSET_OUT_OF_RANGE = 1
CORRUPT_MESSAGE = 2
UNKNOWN_TOPIC_OR_PARTITION = 3
MESSAGE_TOO_LARGE = 10
INVALID_TOPIC_EXCEPTION = 17
INVALID_TIMESTAMP = 32
NOT_ENOUGH_REPLICAS = 19
NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
UNSUPPORTED_VERSION = 35
TOPIC_ALREADY_EXISTS = 36
INVALID_PARTITIONS = 37
INVALID_REPLICATION_FACTOR = 38
INVALID_CONFIG = 40
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
DUPLICATE_SEQUENCE_NUMBER = 46
KAFKA_STORAGE_ERROR = 56
INVALID_REQUEST = 42
UNKNOWN_MEMBER_ID = 25
FENCED_MEMBER_EPOCH = 110
INVALID_RECORD_STATE = 121
SHARE_SESSION_NOT_FOUND = 122
INVALID_SHARE_SESSION_EPOCH = 123

# First flexible version of each API we encode.
ALTER_PARTITION_REASSIGNMENTS = 45
LIST_PARTITION_REASSIGNMENTS = 46
DESCRIBE_TOPIC_PARTITIONS = 75
FLEXIBLE_FROM = {PRODUCE: 9, FETCH: 12, LIST_OFFSETS: 6, METADATA: 9, API_VERSIONS: 3, CREATE_TOPICS: 5, DELETE_TOPICS: 4,
                 INIT_PRODUCER_ID: 2, ALTER_PARTITION_REASSIGNMENTS: 0, LIST_PARTITION_REASSIGNMENTS: 0,
                 SHARE_GROUP_HEARTBEAT: 0, SHARE_FETCH: 0, SHARE_ACKNOWLEDGE: 0, DESCRIBE_TOPIC_PARTITIONS: 0}


# ---------------------------------------------------------------- CRC32C (Castagnoli)

def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    table = _CRC_TABLE
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


# ---------------------------------------------------------------- primitive encoding

def uvarint(n: int) -> bytes:
    assert n >= 0
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def varint(n: int) -> bytes:
    return uvarint((n << 1) ^ (n >> 63))  # zigzag


class Writer:
    def __init__(self, flexible: bool = False):
        self.buf = bytearray()
        self.flexible = flexible

    def i8(self, v):
        self.buf += struct.pack(">b", v)
        return self

    def i16(self, v):
        self.buf += struct.pack(">h", v)
        return self

    def i32(self, v):
        self.buf += struct.pack(">i", v)
        return self

    def i64(self, v):
        self.buf += struct.pack(">q", v)
        return self

    def boolean(self, v):
        self.buf += b"\x01" if v else b"\x00"
        return self

    def raw(self, b: bytes):
        self.buf += b
        return self

    def string(self, s: str | None):
        if s is None:
            if self.flexible:
                self.buf += uvarint(0)
            else:
                self.i16(-1)
            return self
        b = s.encode()
        if self.flexible:
            self.buf += uvarint(len(b) + 1)
        else:
            self.i16(len(b))
        self.buf += b
        return self

    def bytes_(self, b: bytes | None):
        if b is None:
            if self.flexible:
                self.buf += uvarint(0)
            else:
                self.i32(-1)
            return self
        if self.flexible:
            self.buf += uvarint(len(b) + 1)
        else:
            self.i32(len(b))
        self.buf += b
        return self

    def array(self, items, fn):
        if items is None:
            if self.flexible:
                self.buf += uvarint(0)
            else:
                self.i32(-1)
            return self
        if self.flexible:
            self.buf += uvarint(len(items) + 1)
        else:
            self.i32(len(items))
        for it in items:
            fn(self, it)
        return self

    def tags(self):
        if self.flexible:
            self.buf += uvarint(0)
        return self

    def getvalue(self) -> bytes:
        return bytes(self.buf)


class DecodeError(Exception):
    pass


class Reader:
    def __init__(self, data: bytes, flexible: bool = False):
        self.data = data
        self.pos = 0
        self.flexible = flexible

    def _take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise DecodeError(f"need {n} bytes at {self.pos}, have {len(self.data) - self.pos}")
        b = self.data[self.pos : self.pos + n]
        self.pos += n
        return b

    def i8(self):
        return struct.unpack(">b", self._take(1))[0]

    def i16(self):
        return struct.unpack(">h", self._take(2))[0]

    def i32(self):
        return struct.unpack(">i", self._take(4))[0]

    def u32(self):
        return struct.unpack(">I", self._take(4))[0]

    def i64(self):
        return struct.unpack(">q", self._take(8))[0]

    def boolean(self):
        return self._take(1) != b"\x00"

    def uvarint(self) -> int:
        shift = 0
        result = 0
        while True:
            b = self._take(1)[0]
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7
            if shift > 63:
                raise DecodeError("varint too long")

    def varint(self) -> int:
        n = self.uvarint()
        return (n >> 1) ^ -(n & 1)

    def string(self) -> str | None:
        if self.flexible:
            n = self.uvarint() - 1
        else:
            n = self.i16()
        if n < 0:
            return None
        return self._take(n).decode()

    def bytes_(self) -> bytes | None:
        if self.flexible:
            n = self.uvarint() - 1
        else:
            n = self.i32()
        if n < 0:
            return None
        return self._take(n)

    def array(self, fn) -> list | None:
        if self.flexible:
            n = self.uvarint() - 1
        else:
            n = self.i32()
        if n < 0:
            return None
        return [fn(self) for _ in range(n)]

    def tags(self):
        if self.flexible:
            for _ in range(self.uvarint()):
                self.uvarint()  # tag
                self._take(self.uvarint())

    def remaining(self) -> int:
        return len(self.data) - self.pos


# ---------------------------------------------------------------- record batches

@dataclass
class Record:
    value: bytes | None
    key: bytes | None = None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)
    timestamp_delta: int = 0


def encode_record(r: Record, offset_delta: int) -> bytes:
    body = bytearray()
    body += b"\x00"  # attributes
    body += varint(r.timestamp_delta)
    body += varint(offset_delta)
    if r.key is None:
        body += varint(-1)
    else:
        body += varint(len(r.key)) + r.key
    if r.value is None:
        body += varint(-1)
    else:
        body += varint(len(r.value)) + r.value
    body += varint(len(r.headers))
    for k, v in r.headers:
        kb = k.encode()
        body += varint(len(kb)) + kb
        if v is None:
            body += varint(-1)
        else:
            body += varint(len(v)) + v
    return varint(len(body)) + bytes(body)


def record_batch(
    records: list[Record],
    base_timestamp: int | None = None,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    attributes: int = 0,
    base_offset: int = 0,
) -> bytes:
    """A magic-2 record batch (uncompressed unless attributes say otherwise) with a valid CRC."""
    if base_timestamp is None:
        base_timestamp = int(time.time() * 1000)
    payload = b"".join(encode_record(r, i) for i, r in enumerate(records))
    max_ts = base_timestamp + max((r.timestamp_delta for r in records), default=0)
    after_crc = (
        struct.pack(">hiqqqhii", attributes, len(records) - 1, base_timestamp, max_ts, producer_id, producer_epoch, base_sequence, len(records))
        + payload
    )
    crc = crc32c(after_crc)
    # batchLength counts everything after the length field: epoch(4) magic(1) crc(4) + rest.
    batch_length = 4 + 1 + 4 + len(after_crc)
    return struct.pack(">qiibI", base_offset, batch_length, 0, 2, crc) + after_crc


@dataclass
class Batch:
    base_offset: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int
    crc_ok: bool
    raw: bytes

    @property
    def compression(self) -> int:
        return self.attributes & 0x7


def parse_batches(data: bytes) -> list[Batch]:
    """Splits a Fetch `records` blob into batches; a trailing partial batch is ignored (as clients do)."""
    out = []
    pos = 0
    while pos + 12 <= len(data):
        base_offset, length = struct.unpack_from(">qi", data, pos)
        end = pos + 12 + length
        if length < 49 or end > len(data):
            break
        (epoch, magic, crc, attrs, lod, bts, mts, pid, pep, bseq, cnt) = struct.unpack_from(">ibIhiqqqhii", data, pos + 12)
        crc_ok = crc32c(data[pos + 21 : end]) == crc
        out.append(Batch(base_offset, epoch, magic, crc, attrs, lod, bts, mts, pid, pep, bseq, cnt, crc_ok, data[pos:end]))
        pos = end
    return out


def decode_records(batch: Batch) -> list[tuple[int, Record]]:
    """Decodes the records of an uncompressed batch as (offset, Record)."""
    assert batch.compression == 0, "only uncompressed batches are decoded here"
    r = Reader(batch.raw[61:])
    out = []
    for _ in range(batch.record_count):
        r.varint()  # length
        r.i8()  # attributes
        ts_delta = r.varint()
        off_delta = r.varint()
        kl = r.varint()
        key = r._take(kl) if kl >= 0 else None
        vl = r.varint()
        value = r._take(vl) if vl >= 0 else None
        headers = []
        for _ in range(r.varint()):
            hk = r._take(r.varint()).decode()
            hl = r.varint()
            headers.append((hk, r._take(hl) if hl >= 0 else None))
        out.append((batch.base_offset + off_delta, Record(value, key, headers, ts_delta)))
    return out


# ---------------------------------------------------------------- framing

def request_header(api_key: int, api_version: int, correlation_id: int, client_id: str | None = "sluice-tests") -> bytes:
    """Request header v1 (or v2 for flexible versions: v1 plus an empty tag buffer)."""
    w = Writer(False).i16(api_key).i16(api_version).i32(correlation_id).string(client_id)
    flexible = api_version >= FLEXIBLE_FROM.get(api_key, 1 << 15)
    # ApiVersions v3+ uses request header v2 too; its response header stays v0.
    if flexible:
        w.raw(uvarint(0))
    return w.getvalue()


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def response_header_flexible(api_key: int, api_version: int) -> bool:
    if api_key == API_VERSIONS:
        return False
    return api_version >= FLEXIBLE_FROM.get(api_key, 1 << 15)


class ConnectionClosed(Exception):
    pass


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionClosed(f"closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def wait_closed(sock: socket.socket, timeout: float = 5.0) -> bytes:
    """Reads until the peer closes; returns whatever arrived first. Raises TimeoutError if still open."""
    sock.settimeout(timeout)
    got = bytearray()
    deadline = time.monotonic() + timeout
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return bytes(got)
        except socket.timeout:
            raise TimeoutError(f"connection still open after {timeout}s (received {len(got)} bytes)") from None
        if not chunk:
            return bytes(got)
        got += chunk
        if time.monotonic() > deadline:
            raise TimeoutError(f"connection still open after {timeout}s (received {len(got)} bytes)")


class Conn:
    """One TCP connection speaking the Kafka protocol synchronously."""

    def __init__(self, host: str, port: int, timeout: float = 10.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.correlation_id = 0
        self._versions: dict[int, tuple[int, int]] | None = None

    @classmethod
    def to(cls, bootstrap: str, timeout: float = 10.0) -> "Conn":
        host, port = bootstrap.rsplit(":", 1)
        return cls(host, int(port), timeout)

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send_raw(self, data: bytes):
        self.sock.sendall(data)

    def send_request(self, api_key: int, api_version: int, body: bytes, client_id: str | None = "sluice-tests") -> int:
        self.correlation_id += 1
        self.sock.sendall(frame(request_header(api_key, api_version, self.correlation_id, client_id) + body))
        return self.correlation_id

    def recv_frame(self) -> bytes:
        (n,) = struct.unpack(">i", recv_exact(self.sock, 4))
        assert 0 <= n < 1 << 30, f"bad response size {n}"
        return recv_exact(self.sock, n)

    def request(self, api_key: int, api_version: int, body: bytes) -> Reader:
        """Sends a request and returns a Reader positioned at the response body."""
        cid = self.send_request(api_key, api_version, body)
        data = self.recv_frame()
        r = Reader(data, False)
        got = r.i32()
        assert got == cid, f"correlation id {got} != {cid}"
        if response_header_flexible(api_key, api_version):
            r.flexible = True
            r.tags()
        r.flexible = api_version >= FLEXIBLE_FROM.get(api_key, 1 << 15)
        return r

    # ------------------------------------------------------------ API helpers

    def api_versions(self, version: int = 0) -> tuple[int, dict[int, tuple[int, int]]]:
        """Returns (error_code, {api_key: (min, max)})."""
        w = Writer(version >= 3)
        if version >= 3:
            w.string("sluice-tests").string("0.0.1").tags()
        r = self.request(API_VERSIONS, version, w.getvalue())
        return parse_api_versions_body(r, version)

    def versions(self) -> dict[int, tuple[int, int]]:
        if self._versions is None:
            err, self._versions = self.api_versions(0)
            assert err == NONE, f"ApiVersions v0 error {err}"
        return self._versions

    def pick(self, api_key: int, preferred: list[int]) -> int:
        lo, hi = self.versions()[api_key]
        for v in preferred:
            if lo <= v <= hi:
                return v
        raise AssertionError(f"broker supports api {api_key} v{lo}-v{hi}, none of {preferred}")

    def produce(self, topic: str, partition: int, records: bytes | None, acks: int = -1, timeout_ms: int = 10000, version: int | None = None):
        """Returns (error_code, base_offset, log_start_offset, error_message) for the one partition."""
        v = version if version is not None else self.pick(PRODUCE, [8, 7, 6, 5, 4, 3, 9, 10, 11])
        r = self.request(PRODUCE, v, produce_body(v, topic, partition, records, acks, timeout_ms))
        if acks == 0:
            raise AssertionError("acks=0 has no response")
        return parse_produce_response(r, v)[:4]

    def produce_record_errors(self, topic: str, partition: int, records: bytes, version: int = 8):
        """Produce v8+ (KIP-467): returns (error_code, error_message, [(batch_index, message)])."""
        r = self.request(PRODUCE, version, produce_body(version, topic, partition, records))
        err, _, _, msg, record_errors = parse_produce_response(r, version)
        return err, msg, record_errors

    def fetch(self, topic: str, partition: int, offset: int, max_bytes: int = 1 << 20, max_wait_ms: int = 0, version: int | None = None):
        """Returns (error_code, high_watermark, log_start_offset, records bytes)."""
        v = version if version is not None else self.pick(FETCH, [11, 10, 9, 8, 7, 6, 5, 4])
        r = self.request(FETCH, v, fetch_body(v, topic, partition, offset, max_bytes, max_wait_ms))
        return parse_fetch_response(r, v)

    def create_topics(self, topics: list[tuple[str, int, int, dict[str, str]]], timeout_ms: int = 10000, version: int | None = None):
        """topics: [(name, num_partitions, replication_factor, configs[, [(partition, [broker ids])]])]
        -> {name: (error_code, message)}; the optional last item is a manual replica assignment."""
        v = version if version is not None else self.pick(CREATE_TOPICS, [4, 3, 2, 5, 6, 7])
        r = self.request(CREATE_TOPICS, v, create_topics_body(v, topics, timeout_ms))
        return parse_create_topics_response(r, v)

    def create_topics_described(self, topics: list[tuple[str, int, int, dict[str, str]]], version: int = 7):
        """CreateTopics v5+ -> {name: CreatedTopic}: the answer's partition count, replication
        factor and configs ({name: (value, config_source)}) besides the error."""
        r = self.request(CREATE_TOPICS, version, create_topics_body(version, topics, 10000))
        return parse_create_topics_response(r, version, described=True)

    def list_offsets(self, topic: str, partition: int, timestamp: int, version: int | None = None):
        """Returns (error_code, timestamp, offset)."""
        v = version if version is not None else self.pick(LIST_OFFSETS, [2, 3, 4, 5, 1, 6, 7])
        r = self.request(LIST_OFFSETS, v, list_offsets_body(v, topic, partition, timestamp))
        return parse_list_offsets_response(r, v)

    def init_producer_id(self, version: int | None = None) -> tuple[int, int, int]:
        """Non-transactional InitProducerId: returns (error_code, producer_id, producer_epoch)."""
        v = version if version is not None else self.pick(INIT_PRODUCER_ID, [1, 0, 2, 3, 4, 5])
        w = Writer(v >= FLEXIBLE_FROM[INIT_PRODUCER_ID])
        w.string(None).i32(60000)
        if v >= 3:
            w.i64(-1).i16(-1)
        w.tags()
        r = self.request(INIT_PRODUCER_ID, v, w.getvalue())
        r.i32()
        return r.i16(), r.i64(), r.i16()

    def find_coordinator(self, group: str) -> tuple[int, int]:
        """FindCoordinator v1 for a group: (error_code, node id)."""
        r = self.request(FIND_COORDINATOR, 1, Writer(False).string(group).i8(0).getvalue())
        r.i32()
        error = r.i16()
        r.string()
        return error, r.i32()

    def set_topic_configs(self, topic: str, configs: dict[str, str]) -> tuple[int, str | None]:
        """IncrementalAlterConfigs v0, SET of every entry on one topic: (error_code, message)."""
        TOPIC_RESOURCE, SET = 2, 0

        def entry(w, item):
            w.string(item[0]).i8(SET).string(item[1])

        w = Writer(False).array([topic], lambda w, t: w.i8(TOPIC_RESOURCE).string(t).array(list(configs.items()), entry))
        r = self.request(INCREMENTAL_ALTER_CONFIGS, 0, w.boolean(False).getvalue())
        r.i32()
        ((error, message),) = r.array(lambda rr: (rr.i16(), rr.string(), rr.i8(), rr.string())[:2])
        return error, message

    def set_group_configs(self, group: str, configs: dict[str, str]) -> tuple[int, str | None]:
        """IncrementalAlterConfigs v0, SET of every entry on one GROUP resource (share-group
        configs such as share.auto.offset.reset): (error_code, message)."""
        GROUP_RESOURCE, SET = 32, 0

        def entry(w, item):
            w.string(item[0]).i8(SET).string(item[1])

        w = Writer(False).array([group], lambda w, g: w.i8(GROUP_RESOURCE).string(g).array(list(configs.items()), entry))
        r = self.request(INCREMENTAL_ALTER_CONFIGS, 0, w.boolean(False).getvalue())
        r.i32()
        ((error, message),) = r.array(lambda rr: (rr.i16(), rr.string(), rr.i8(), rr.string())[:2])
        return error, message

    def topic_id(self, topic: str) -> bytes:
        """The topic's id (16 bytes), from Metadata v10 or later."""
        v = self.pick(METADATA, [12, 11, 10])
        return self.metadata_detail([topic], version=v).topics[topic].topic_id

    def share_heartbeat(self, group: str, member_id: str, member_epoch: int,
                        topics: list[str] | None = None) -> "ShareHeartbeat":
        """ShareGroupHeartbeat v1: join with epoch 0 and `topics`, heartbeat with the current
        epoch, leave with -1."""
        w = Writer(True).string(group).string(member_id).i32(member_epoch).string(None)
        w.array(topics, lambda w, t: w.string(t)).tags()
        r = self.request(SHARE_GROUP_HEARTBEAT, 1, w.getvalue())
        r.i32()
        error, message, member, epoch, interval = r.i16(), r.string(), r.string(), r.i32(), r.i32()
        assignment = None
        if r.i8() >= 0:

            def topic_partitions(rr: Reader):
                topic_id, partitions = bytes(rr._take(16)), rr.array(lambda x: x.i32())
                rr.tags()
                return topic_id, sorted(partitions)

            assignment = dict(r.array(topic_partitions))
            r.tags()
        r.tags()
        return ShareHeartbeat(error, message, member, epoch, interval, assignment)

    def share_fetch(self, group: str, member_id: str, session_epoch: int, topics: dict, forgotten: dict | None = None,
                    max_wait_ms: int = 0, max_records: int = 500, max_bytes: int = 1 << 20,
                    v2: tuple[int, bool] | None = None) -> "ShareFetchAnswer":
        """ShareFetch v1, or v2 with `v2` = (ShareAcquireMode, IsRenewAck). `topics`:
        {topic_id: {partition: [(first, last, [ack types])]}} (a partition with no
        acknowledgement batches is just fetched); `forgotten`: {topic_id: [partitions]}."""

        def batch(w, b):
            w.i64(b[0]).i64(b[1]).array(b[2], lambda w, t: w.i8(t)).tags()

        def partition(w, item):
            w.i32(item[0]).array(item[1], batch).tags()

        def topic(w, item):
            w.raw(item[0]).array(sorted(item[1].items()), partition).tags()

        def forgotten_topic(w, item):
            w.raw(item[0]).array(item[1], lambda w, p: w.i32(p)).tags()

        min_bytes = 0 if max_bytes == 0 else 1
        w = Writer(True).string(group).string(member_id).i32(session_epoch).i32(max_wait_ms).i32(min_bytes)
        w.i32(max_bytes).i32(max_records).i32(max_records)
        if v2 is not None:
            w.i8(v2[0]).i8(int(v2[1]))
        w.array(list(topics.items()), topic).array(list((forgotten or {}).items()), forgotten_topic).tags()
        r = self.request(SHARE_FETCH, 1 if v2 is None else 2, w.getvalue())
        r.i32()
        error, message, lock_ms = r.i16(), r.string(), r.i32()

        def acquired(rr: Reader):
            first, last, count = rr.i64(), rr.i64(), rr.i16()
            rr.tags()
            return first, last, count

        def part(rr: Reader):
            index, error, _, ack_error, _ = rr.i32(), rr.i16(), rr.string(), rr.i16(), rr.string()
            rr.i32(), rr.i32(), rr.tags()  # current leader
            records, ranges = rr.bytes_(), rr.array(acquired)
            rr.tags()
            return index, SharePartitionAnswer(error, ack_error, records or b"", ranges)

        def top(rr: Reader):
            topic_id = bytes(rr._take(16))
            parts = rr.array(part)
            rr.tags()
            return [((topic_id, index), answer) for index, answer in parts]

        partitions = dict(item for items in r.array(top) for item in items)
        return ShareFetchAnswer(error, message, lock_ms, partitions)

    def share_acknowledge(self, group: str, member_id: str, session_epoch: int, topics: dict,
                          renew: bool | None = None) -> tuple[int, dict]:
        """ShareAcknowledge v1, or v2 with `renew` (IsRenewAck). `topics`: {topic_id: {partition:
        [(first, last, [ack types])]}}. Returns (error_code, {(topic_id, partition): error_code});
        for v2 the answer's AcquisitionLockTimeoutMs is kept in `self.last_lock_timeout_ms`."""

        def batch(w, b):
            w.i64(b[0]).i64(b[1]).array(b[2], lambda w, t: w.i8(t)).tags()

        def partition(w, item):
            w.i32(item[0]).array(item[1], batch).tags()

        def topic(w, item):
            w.raw(item[0]).array(sorted(item[1].items()), partition).tags()

        w = Writer(True).string(group).string(member_id).i32(session_epoch)
        if renew is not None:
            w.i8(int(renew))
        w.array(list(topics.items()), topic).tags()
        r = self.request(SHARE_ACKNOWLEDGE, 1 if renew is None else 2, w.getvalue())
        r.i32()
        error, _ = r.i16(), r.string()
        if renew is not None:
            self.last_lock_timeout_ms = r.i32()

        def part(rr: Reader):
            index, error, _ = rr.i32(), rr.i16(), rr.string()
            rr.i32(), rr.i32(), rr.tags()
            rr.tags()
            return index, error

        def top(rr: Reader):
            topic_id = bytes(rr._take(16))
            parts = rr.array(part)
            rr.tags()
            return [((topic_id, index), code) for index, code in parts]

        return error, dict(item for items in r.array(top) for item in items)

    def metadata(self, topics: list[str] | None, allow_auto_create: bool = False, version: int | None = None):
        """Returns {topic: (error_code, [partition ids])}."""
        detail = self.metadata_detail(topics, allow_auto_create, version)
        return {name: (t.error, sorted(t.partitions)) for name, t in detail.topics.items()}

    def metadata_detail(self, topics: list[str] | None, allow_auto_create: bool = False,
                        version: int | None = None) -> "MetadataResponse":
        """The whole Metadata answer as this one broker gives it."""
        v = version if version is not None else self.pick(METADATA, [4, 5, 6, 7, 8, 1])
        r = self.request(METADATA, v, metadata_body(v, topics, allow_auto_create))
        return parse_metadata_response(r, v)

    def describe_topic_partitions(self, topics: list[str], limit: int = 2000,
                                  cursor: tuple[str, int] | None = None) -> "TopicPartitionsPage":
        """DescribeTopicPartitions v0 as this one broker answers it (no topics: all of them)."""
        w = Writer(True)
        w.array(topics, lambda ww, name: ww.string(name).tags())
        w.i32(limit)
        if cursor is None:
            w.i8(-1)
        else:
            w.i8(1).string(cursor[0]).i32(cursor[1]).tags()
        w.tags()
        return parse_describe_topic_partitions(self.request(DESCRIBE_TOPIC_PARTITIONS, 0, w.getvalue()))


ACCEPT, RELEASE, REJECT = 1, 2, 3  # share acknowledgement types


@dataclass
class ShareHeartbeat:
    error: int
    message: str | None
    member_id: str | None
    member_epoch: int
    heartbeat_interval_ms: int
    assignment: dict[bytes, list[int]] | None  # topic id -> partitions, when sent


@dataclass
class SharePartitionAnswer:
    error: int
    acknowledge_error: int
    records: bytes
    acquired: list[tuple[int, int, int]]  # (first offset, last offset, delivery count)


@dataclass
class ShareFetchAnswer:
    error: int
    message: str | None
    acquisition_lock_timeout_ms: int
    partitions: dict[tuple[bytes, int], SharePartitionAnswer]


def parse_api_versions_body(r: Reader, version: int):
    err = r.i16()

    def entry(rr: Reader):
        k, lo, hi = rr.i16(), rr.i16(), rr.i16()
        rr.tags()
        return k, (lo, hi)

    keys = dict(r.array(entry) or [])
    if version >= 1:
        r.i32()
    r.tags()
    return err, keys


# ---------------------------------------------------------------- request bodies

def produce_body(v: int, topic: str, partition: int, records: bytes | None, acks: int = -1, timeout_ms: int = 10000) -> bytes:
    w = Writer(v >= FLEXIBLE_FROM[PRODUCE])
    w.string(None).i16(acks).i32(timeout_ms)

    def part(w, p):
        w.i32(p).bytes_(records).tags()

    def top(w, t):
        w.string(t)
        w.array([partition], part)
        w.tags()

    w.array([topic], top)
    w.tags()
    return w.getvalue()


def parse_produce_response(r: Reader, v: int):
    result = None

    def part(rr: Reader):
        idx = rr.i32()
        err = rr.i16()
        base = rr.i64()
        if v >= 2:
            rr.i64()  # log_append_time
        lso = rr.i64() if v >= 5 else -1
        msg = None
        record_errors = []
        if v >= 8:
            record_errors = rr.array(lambda x: (x.i32(), x.string(), x.tags())[:2])
            msg = rr.string()
        rr.tags()
        return idx, err, base, lso, msg, record_errors

    def top(rr: Reader):
        name = rr.string()
        parts = rr.array(part)
        rr.tags()
        return name, parts

    topics = r.array(top)
    for _, parts in topics:
        for idx, err, base, lso, msg, record_errors in parts:
            result = (err, base, lso, msg, record_errors)
    assert result is not None, "produce response had no partition"
    return result


def fetch_body(v: int, topic: str, partition: int, offset: int, max_bytes: int, max_wait_ms: int,
               replica_id: int = -1) -> bytes:
    """`replica_id` >= 0 makes it a follower's fetch (what brokers send each other)."""
    assert 4 <= v <= 11, "topic-name fetch versions only"
    w = Writer(False)
    w.i32(replica_id).i32(max_wait_ms).i32(1).i32(max_bytes).i8(0)
    if v >= 7:
        w.i32(0).i32(-1)  # no fetch session

    def part(w, p):
        w.i32(p)
        if v >= 9:
            w.i32(-1)
        w.i64(offset)
        if v >= 5:
            w.i64(-1)
        w.i32(max_bytes)

    w.array([topic], lambda w, t: (w.string(t), w.array([partition], part)))
    if v >= 7:
        w.array([], lambda w, x: None)
    if v >= 11:
        w.string("")
    return w.getvalue()


def parse_fetch_response(r: Reader, v: int):
    r.i32()  # throttle
    if v >= 7:
        top_err = r.i16()
        r.i32()
        assert top_err == 0, f"fetch top-level error {top_err}"
    result = None

    def part(rr: Reader):
        idx, err, hw = rr.i32(), rr.i16(), rr.i64()
        rr.i64()  # last stable offset
        lso = rr.i64() if v >= 5 else -1
        rr.array(lambda x: (x.i64(), x.i64()))
        if v >= 11:
            rr.i32()
        recs = rr.bytes_()
        return idx, err, hw, lso, recs

    for _name, parts in r.array(lambda rr: (rr.string(), rr.array(part))):
        for idx, err, hw, lso, recs in parts:
            result = (err, hw, lso, recs or b"")
    assert result is not None
    return result


def create_topics_body(v: int, topics, timeout_ms: int = 10000, validate_only: bool = False) -> bytes:
    w = Writer(v >= FLEXIBLE_FROM[CREATE_TOPICS])

    def cfg(w, kv):
        w.string(kv[0]).string(kv[1]).tags()

    def assignment(w, a):
        index, broker_ids = a
        w.i32(index).array(broker_ids, lambda w, b: w.i32(b)).tags()

    def topic(w, t):
        name, parts, rf, configs, *assigned = t
        w.string(name).i32(parts).i16(rf)
        w.array(assigned[0] if assigned else [], assignment)
        w.array(list(configs.items()), cfg)
        w.tags()

    w.array(topics, topic).i32(timeout_ms)
    if v >= 1:
        w.boolean(validate_only)
    w.tags()
    return w.getvalue()


class CreatedTopic(NamedTuple):
    error: int
    message: str | None
    partitions: int
    replication_factor: int
    configs: dict[str, tuple[str | None, int]]


def parse_create_topics_response(r: Reader, v: int, described: bool = False):
    if v >= 2:
        r.i32()

    def config(x: Reader):
        name, value, _read_only, source, _sensitive = x.string(), x.string(), x.boolean(), x.i8(), x.boolean()
        x.tags()
        return name, (value, source)

    def topic(rr: Reader):
        name = rr.string()
        if v >= 7:
            rr._take(16)
        err = rr.i16()
        msg = rr.string() if v >= 1 else None
        partitions, factor, configs = -1, -1, None
        if v >= 5:
            partitions, factor = rr.i32(), rr.i16()
            configs = rr.array(config)
        rr.tags()
        if described:
            return name, CreatedTopic(err, msg, partitions, factor, dict(configs or []))
        return name, (err, msg)

    return dict(r.array(topic))


def list_offsets_body(v: int, topic: str, partition: int, timestamp: int) -> bytes:
    w = Writer(v >= FLEXIBLE_FROM[LIST_OFFSETS])
    w.i32(-1)
    if v >= 2:
        w.i8(0)

    def part(w, p):
        w.i32(p)
        if v >= 4:
            w.i32(-1)
        w.i64(timestamp)
        w.tags()

    w.array([topic], lambda w, t: (w.string(t), w.array([partition], part), w.tags()))
    w.tags()
    return w.getvalue()


def parse_list_offsets_response(r: Reader, v: int):
    if v >= 2:
        r.i32()
    result = None

    def part(rr: Reader):
        _idx, err, ts, off = rr.i32(), rr.i16(), rr.i64(), rr.i64()
        if v >= 4:
            rr.i32()
        rr.tags()
        return err, ts, off

    for _name, parts in r.array(lambda rr: (rr.string(), rr.array(part), rr.tags())[:2]):
        for p in parts:
            result = p
    return result


def metadata_body(v: int, topics: list[str] | None, allow_auto_create: bool) -> bytes:
    w = Writer(v >= FLEXIBLE_FROM[METADATA])

    def t(w, name):
        if v >= 10:
            w.raw(b"\x00" * 16)
        w.string(name).tags()

    w.array(topics, t)
    if v >= 4:
        w.boolean(allow_auto_create)
    if 8 <= v <= 10:
        w.boolean(False)
    if v >= 8:
        w.boolean(False)
    w.tags()
    return w.getvalue()


@dataclass
class PartitionMetadata:
    leader: int
    replicas: list[int]
    isr: list[int]


@dataclass
class TopicMetadata:
    error: int
    partitions: dict[int, PartitionMetadata]
    internal: bool
    topic_id: bytes | None = None  # v10 and later


@dataclass
class MetadataResponse:
    brokers: list[int]
    controller_id: int
    topics: dict[str, TopicMetadata]


def parse_metadata_response(r: Reader, v: int) -> MetadataResponse:
    if v >= 3:
        r.i32()

    def broker(rr: Reader):
        node_id = rr.i32()
        rr.string()
        rr.i32()
        if v >= 1:
            rr.string()
        rr.tags()
        return node_id

    brokers = r.array(broker)
    if v >= 2:
        r.string()
    controller_id = r.i32() if v >= 1 else -1

    def part(rr: Reader):
        rr.i16()
        idx, leader = rr.i32(), rr.i32()
        if v >= 7:
            rr.i32()
        replicas = rr.array(lambda x: x.i32())
        isr = rr.array(lambda x: x.i32())
        if v >= 5:
            rr.array(lambda x: x.i32())
        rr.tags()
        return idx, PartitionMetadata(leader, replicas, isr)

    def topic(rr: Reader):
        err = rr.i16()
        name = rr.string()
        topic_id = bytes(rr._take(16)) if v >= 10 else None
        internal = rr.boolean() if v >= 1 else False
        parts = dict(rr.array(part))
        if v >= 8:
            rr.i32()
        rr.tags()
        return name, TopicMetadata(err, parts, internal, topic_id)

    return MetadataResponse(sorted(brokers), controller_id, dict(r.array(topic)))


@dataclass
class PartitionDetail:
    error: int
    leader: int
    leader_epoch: int
    replicas: list[int]
    isr: list[int]
    elr: list[int] | None
    last_known_elr: list[int] | None
    offline: list[int]


@dataclass
class TopicPartitionsPage:
    topics: dict[str, tuple[int, dict[int, PartitionDetail]]]  # name -> (error, partitions)
    next_cursor: tuple[str, int] | None


def parse_describe_topic_partitions(r: Reader) -> TopicPartitionsPage:
    r.i32()  # throttle

    def ids(rr: Reader):
        return rr.array(lambda x: x.i32())

    def part(rr: Reader):
        err, idx, leader, epoch = rr.i16(), rr.i32(), rr.i32(), rr.i32()
        detail = PartitionDetail(err, leader, epoch, ids(rr), ids(rr), ids(rr), ids(rr), ids(rr))
        rr.tags()
        return idx, detail

    def topic(rr: Reader):
        err, name = rr.i16(), rr.string()
        rr._take(16)  # topic id
        rr.boolean()
        parts = dict(rr.array(part))
        rr.i32()  # authorized operations
        rr.tags()
        return name, (err, parts)

    topics = dict(r.array(topic))
    cursor = None
    if r.i8() >= 0:
        cursor = (r.string(), r.i32())
        r.tags()
    r.tags()
    return TopicPartitionsPage(topics, cursor)


# ---------------------------------------------------------------- confluent-kafka (librdkafka) helpers
# Shared by the client-level tests. Consumers never use group coordination: they assign()
# partitions with explicit offsets and never commit.

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402


def admin_client(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap, "broker.address.family": "v4"})


def wait_for_topic(bootstrap: str, topic: str, partitions: int, timeout: float = 30.0) -> None:
    """Waits until metadata shows `topic` with exactly `partitions` partitions, each with a leader."""
    a = admin_client(bootstrap)
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        md = a.list_topics(timeout=5)
        t = md.topics.get(topic)
        last = t
        if t is not None and t.error is None and len(t.partitions) == partitions and all(p.leader >= 0 for p in t.partitions.values()):
            return
        time.sleep(0.1)
    raise AssertionError(f"topic {topic} not visible with {partitions} partitions: {last}")


def create_topic(bootstrap: str, name: str, partitions: int = 1, config: dict | None = None, timeout: float = 30.0) -> None:
    a = admin_client(bootstrap)
    fs = a.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})], operation_timeout=timeout)
    fs[name].result(timeout)
    wait_for_topic(bootstrap, name, partitions, timeout)


def consumer(bootstrap: str, **extra) -> Consumer:
    conf = {
        "bootstrap.servers": bootstrap,
        "broker.address.family": "v4",
        "group.id": f"sluice-test-{time.monotonic_ns()}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": True,
        "check.crcs": True,
        "fetch.wait.max.ms": 100,
    }
    conf.update(extra)
    return Consumer(conf)


def consume_until(bootstrap: str, topic: str, end_offsets: dict[int, int], start_offsets: dict[int, int] | None = None,
                  timeout: float = 60.0, **extra) -> dict[int, list]:
    """Reads each partition p from start_offsets[p] (default: beginning) until offset end_offsets[p] - 1.

    Returns {partition: [Message, ...]}. Any consumer error (other than partition EOF) fails.
    """
    c = consumer(bootstrap, **extra)
    try:
        starts = start_offsets or {}
        todo = {p for p, end in end_offsets.items() if end > starts.get(p, 0)}
        c.assign([TopicPartition(topic, p, starts.get(p, -2)) for p in end_offsets])  # -2 = OFFSET_BEGINNING
        out: dict[int, list] = {p: [] for p in end_offsets}
        deadline = time.monotonic() + timeout
        while todo:
            if time.monotonic() > deadline:
                got = {p: (len(v), v[-1].offset() if v else None) for p, v in out.items()}
                raise AssertionError(f"timed out reading {topic}: want ends {end_offsets}, got (count, last offset) {got}")
            for m in c.consume(num_messages=10000, timeout=0.5):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise AssertionError(f"consumer error on {topic}: {err}")
                p = m.partition()
                if m.offset() < end_offsets[p]:
                    out[p].append(m)
                if m.offset() >= end_offsets[p] - 1:
                    todo.discard(p)
        return out
    finally:
        c.close()


# Errors a client retries while a (restarting) broker gets ready, as the Java client does.
RETRIABLE = {
    KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError.REQUEST_TIMED_OUT, KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN,
    KafkaError.NETWORK_EXCEPTION, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
}


def watermarks(bootstrap: str, topic: str, partition: int, timeout: float = 10.0) -> tuple[int, int]:
    """(log start offset, high watermark) as ListOffsets reports them.

    Retriable errors (a broker still starting up) are retried until `timeout`, as clients do.
    """
    c = consumer(bootstrap)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                return c.get_watermark_offsets(TopicPartition(topic, partition), timeout=max(deadline - time.monotonic(), 0.1), cached=False)
            except KafkaException as e:
                err = e.args[0]
                if err.code() not in RETRIABLE or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    finally:
        c.close()
