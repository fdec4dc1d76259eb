"""Fetch sessions (KIP-227) on the wire: a session opened by a full fetch, incremental
fetches that name only what changed and get only partitions with news, forgotten
partitions, and the session errors a client recovers from. (The Java client opens sessions
on its own: every Java consumer test runs on them.)"""

from __future__ import annotations

import time

import kafka_wire as kw
from kafka_wire import Conn, Record, create_topic, record_batch

FETCH_V = 11  # names topics (v13+ use ids); sessions exist from v7
FETCH_SESSION_ID_NOT_FOUND = 70
INVALID_FETCH_SESSION_EPOCH = 71


def session_fetch(conn: Conn, session_id: int, epoch: int, partitions, forgotten=(), max_wait_ms: int = 0):
    """partitions: [(topic, partition, fetch offset)]; forgotten: [(topic, [partitions])].
    Returns (top-level error, session id, {(topic, partition): (error, high watermark, records)})."""
    w = kw.Writer(False)
    w.i32(-1).i32(max_wait_ms).i32(1).i32(1 << 20).i8(0)
    w.i32(session_id).i32(epoch)
    by_topic: dict[str, list] = {}
    for topic, partition, offset in partitions:
        by_topic.setdefault(topic, []).append((partition, offset))

    def part(w, p):
        w.i32(p[0]).i32(-1).i64(p[1]).i64(-1).i32(1 << 20)

    w.array(list(by_topic.items()), lambda w, t: (w.string(t[0]), w.array(t[1], part)))
    w.array(list(forgotten), lambda w, f: (w.string(f[0]), w.array(f[1], lambda w, p: w.i32(p))))
    w.string("")
    r = conn.request(kw.FETCH, FETCH_V, w.getvalue())
    r.i32()  # throttle
    error, got_session = r.i16(), r.i32()

    def partition(rr):
        index, err, hw = rr.i32(), rr.i16(), rr.i64()
        rr.i64()  # last stable offset
        rr.i64()  # log start
        rr.array(lambda x: (x.i64(), x.i64()))
        rr.i32()  # preferred read replica
        return index, err, hw, rr.bytes_() or b""

    out = {}
    for topic, parts in r.array(lambda rr: (rr.string(), rr.array(partition))):
        for index, err, hw, records in parts:
            out[(topic, index)] = (err, hw, records)
    return error, got_session, out


def produce_one(conn: Conn, topic: str, partition: int, value: bytes) -> None:
    assert conn.produce(topic, partition, record_batch([Record(value)]))[0] == 0


def test_incremental_fetches_answer_only_partitions_with_news(broker):
    topic = "sessions"
    create_topic(broker.bootstrap, topic, 3)
    with Conn.to(broker.bootstrap) as conn:
        produce_one(conn, topic, 0, b"first")
        # Epoch 0 opens a session: a full answer, every partition.
        error, session, parts = session_fetch(conn, 0, 0, [(topic, p, 0) for p in range(3)])
        assert error == 0 and session != 0, (error, session)
        assert sorted(parts) == [(topic, 0), (topic, 1), (topic, 2)]
        assert parts[(topic, 0)][1] == 1 and b"first" in parts[(topic, 0)][2]

        # Epoch 1 names only the partition whose position moved; nothing is new anywhere.
        error, got, parts = session_fetch(conn, session, 1, [(topic, 0, 1)])
        assert (error, got, parts) == (0, session, {}), parts

        # A produce to partition 2 wakes the long-poll of an empty incremental fetch, and
        # only partition 2 is answered (read at the offset the session holds for it).
        started = time.monotonic()
        produce_one(conn, topic, 2, b"news")
        error, got, parts = session_fetch(conn, session, 2, [], max_wait_ms=5000)
        assert time.monotonic() - started < 4, "the fetch waited for its max_wait although data was there"
        assert list(parts) == [(topic, 2)] and b"news" in parts[(topic, 2)][2], parts

        # A replayed epoch and an unknown session are refused; the session survives the former.
        assert session_fetch(conn, session, 2, [])[0] == INVALID_FETCH_SESSION_EPOCH
        assert session_fetch(conn, session + 1, 1, [])[0] == FETCH_SESSION_ID_NOT_FOUND

        # A forgotten partition is no longer read: its new record is not answered.
        produce_one(conn, topic, 1, b"unseen")
        error, got, parts = session_fetch(conn, session, 3, [(topic, 2, 1)], forgotten=[(topic, [1])], max_wait_ms=300)
        assert (error, parts) == (0, {}), parts

        # Epoch -1 closes it: the id is gone, and a sessionless fetch answers everything asked.
        error, got, parts = session_fetch(conn, session, -1, [(topic, 1, 0)])
        assert (error, got) == (0, 0) and b"unseen" in parts[(topic, 1)][2]
        assert session_fetch(conn, session, 4, [])[0] == FETCH_SESSION_ID_NOT_FOUND
