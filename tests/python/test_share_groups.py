"""Share groups (KIP-932) on a single node, through the Java client's KafkaShareConsumer
(tests/java/.../ShareConsumers.java) and Kafka's own kafka-share-groups tool.

* More consumers than partitions: 4 share consumers of one group on a 2-partition topic all
  receive records, and each record is delivered exactly once; kafka-share-groups and
  `sluice share` list and describe the group.
* Acknowledge types: a released record comes back with delivery count 2, a rejected one never,
  a record released at the group's `share.delivery.count.limit` is archived; a record whose
  lock expires (held past `share.record.lock.duration.ms`) goes to another consumer with
  delivery count 2, and the late acknowledgement of its first holder is refused.
* Dead letters: with `errors.deadletterqueue.topic.name` set, a rejected record and one
  released at the delivery limit are copied to that topic with their key, value and
  headers saying why and where from; an accepted one is not.
* Kafka 4.2's share consumer: `share.acquire.mode=record_limit` gets exactly max.poll.records
  of a larger batch, and RENEW keeps records with a consumer past its lock duration while
  another consumer takes the rest.
* Durability: records acknowledged (commitSync returned) before a broker `kill -9` are never
  delivered again after the restart; every other record still is.
* Administration with kafka-share-groups: --reset-offsets, --delete-offsets, --delete.
Kafka's other share-group tools (console share consumer, VerifiableShareConsumer,
ShareConsumerPerformance) are in test_share_tools.py; bad input on the wire (unknown members
and sessions, stale epochs, acknowledgements of records not acquired, malformed batches) in
test_share_bad_input.py.
"""

from __future__ import annotations

import subprocess
import threading
import time
import uuid

from confluent_kafka import Producer, TopicPartition

from java_support import JavaProcess, java_cp, run_java, tools_cp  # noqa: F401  (fixtures)
import kafka_wire as kw
from conftest import SLUICE_BIN

SHARE = "sluice.tests.ShareConsumers"
SHARE_GROUP_COMMAND = "org.apache.kafka.tools.consumer.group.ShareGroupCommand"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_more_share_consumers_than_partitions_all_receive_each_record_once(broker, java_cp, tools_cp):
    """Then Kafka's kafka-share-groups lists the group and describes its start offsets: every
    record acknowledged, so each partition's start offset is its end offset."""
    topic, group = unique("q"), unique("workers")
    res = run_java(java_cp, SHARE, ["--bootstrap", broker.bootstrap, "--mode", "spread", "--topic", topic,
                                    "--group", group, "--count", "400"], timeout=150)
    assert res.returncode == 0 and "DONE" in res.stdout, res.report()
    spread = next(line for line in res.stdout.splitlines() if line.startswith("PER_CONSUMER"))
    print(spread)
    # The program produces at least 400 records, 20 at a time alternating over the two
    # partitions, until every consumer received some ("PER_CONSUMER {...} of N").
    per_partition = str(int(spread.rsplit(" of ", 1)[1]) // 2)

    def share_groups(*args):
        out = run_java(tools_cp, SHARE_GROUP_COMMAND, ["--bootstrap-server", broker.bootstrap, *args], timeout=60)
        assert out.returncode == 0, out.report()
        return out.stdout + out.stderr

    assert group in share_groups("--list").split()
    rows = [line.split() for line in share_groups("--describe", "--group", group).splitlines()
            if line.startswith(group)]
    # START-OFFSET and LAG (DescribeShareGroupOffsets v1): everything delivered, nothing behind.
    expected = [(topic, "0", per_partition, "0"), (topic, "1", per_partition, "0")]
    assert sorted((r[1], r[2], r[3], r[4]) for r in rows) == expected, rows
    assert "has no active members" in share_groups("--describe", "--group", group, "--members")

    # `sluice share` lists the group and shows each share-partition's start, log end and lag.
    def sluice_share(*args):
        res = subprocess.run([SLUICE_BIN, "share", "-b", broker.bootstrap, *args], capture_output=True, text=True,
                             timeout=60)
        assert res.returncode == 0, f"{res.stdout}\n{res.stderr}"
        return res.stdout

    assert [group, "Empty"] in [line.split() for line in sluice_share("list").splitlines()]
    described = sluice_share("describe", group)
    assert described.startswith(f"share group {group}: 0 members, state Empty"), described
    rows = sorted(line.split() for line in described.splitlines() if line.startswith(topic + " "))
    assert rows == [[topic, "0", per_partition, per_partition, "0"], [topic, "1", per_partition, per_partition, "0"]], \
        described


def test_release_reject_delivery_limit_and_lock_expiry(broker, java_cp):
    res = run_java(java_cp, SHARE, ["--bootstrap", broker.bootstrap, "--mode", "ack-types", "--topic", unique("q"),
                                    "--group", unique("acks")], timeout=150)
    # On failure, the broker's side too: which phase waited, and what the group was doing.
    report = f"{res.report()}\n--- broker log (tail) ---\n{broker.log()[-6000:]}"
    assert res.returncode == 0 and "DONE" in res.stdout, report
    assert "ACK_TYPES_OK" in res.stdout and "LOCK_EXPIRY_OK" in res.stdout, report


def test_kafka_4_2_consumer_renews_locks_and_limits_records(broker, java_cp):
    """KafkaShareConsumer 4.3.1 with `share.acquire.mode=record_limit` and RENEW, which it
    sends only over ShareFetch/ShareAcknowledge v2 (it refuses both against a v1 broker)."""
    res = run_java(java_cp, SHARE, ["--bootstrap", broker.bootstrap, "--mode", "renew", "--topic", unique("q"),
                                    "--group", unique("renew")], timeout=120)
    assert res.returncode == 0 and "RENEW_OK" in res.stdout, f"{res.report()}\n{broker.log()[-4000:]}"


def test_acknowledged_records_are_not_redelivered_after_kill_9(broker_factory, java_cp):
    broker = broker_factory()
    topic, group = unique("q"), unique("durable")
    n = 300
    kw.create_topic(broker.bootstrap, topic, 1)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(n):
        producer.produce(topic, key=f"k-{i}", value=f"k-{i}")
    assert producer.flush(30) == 0
    first = run_java(java_cp, SHARE, ["--bootstrap", broker.bootstrap, "--mode", "consume", "--topic", topic,
                                      "--group", group, "--count", "120"], timeout=120)
    assert first.returncode == 0, first.report()
    acked = [line.split()[1] for line in first.stdout.splitlines() if line.startswith("ACKED ")]
    assert len(acked) == 120 == len(set(acked)), first.report()
    broker.kill()
    broker.start()
    second = run_java(java_cp, SHARE, ["--bootstrap", broker.bootstrap, "--mode", "consume", "--topic", topic,
                                       "--group", group, "--count", str(n - 120)], timeout=120)
    assert second.returncode == 0, second.report() + "\n--- broker log ---\n" + broker.log()[-3000:]
    rest = [line.split()[1] for line in second.stdout.splitlines() if line.startswith("ACKED ")]
    again = set(acked) & set(rest)
    assert not again, f"{len(again)} acknowledged records delivered again after kill -9, e.g. {sorted(again)[:5]}"
    assert set(acked) | set(rest) == {f"k-{i}" for i in range(n)}


def test_rejected_and_exhausted_records_go_to_the_dead_letter_topic(broker, java_cp):
    topic, group, dead = unique("q"), unique("dlq"), unique("dead")
    kw.create_topic(broker.bootstrap, dead, 1)
    res = run_java(java_cp, SHARE, ["--bootstrap", broker.bootstrap, "--mode", "dead-letters", "--topic", topic,
                                    "--group", group, "--dead-letter-topic", dead], timeout=120)
    assert res.returncode == 0 and "DONE" in res.stdout, res.report()
    consumer = kw.consumer(broker.bootstrap, **{"enable.partition.eof": False})
    consumer.assign([TopicPartition(dead, 0, 0)])
    letters = {}
    deadline = time.monotonic() + 30
    while len(letters) < 2 and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            letters[msg.key().decode()] = (msg.value().decode(), {k: v.decode() for k, v in msg.headers() or []})
    time.sleep(1)
    extra = consumer.poll(1.0)
    consumer.close()
    assert sorted(letters) == ["k-0", "k-1"], letters
    assert extra is None, f"an unexpected dead letter: {extra.key()}"
    for key, reason, deliveries in [("k-0", "rejected", "1"), ("k-1", "delivery-limit", "2")]:
        value, headers = letters[key]
        assert value == key
        assert headers["sluice.dlq.reason"] == reason and headers["sluice.dlq.delivery.count"] == deliveries, headers
        assert headers["sluice.dlq.group"] == group and headers["sluice.dlq.topic"] == topic, headers
        assert headers["sluice.dlq.partition"] == "0" and headers["sluice.dlq.offset"] == key[2:], headers


def test_kafka_share_groups_resets_deletes_offsets_and_deletes_the_group(broker_factory, java_cp, tools_cp):
    """kafka-share-groups --reset-offsets, --delete-offsets and --delete (AlterShareGroupOffsets,
    DeleteShareGroupOffsets, DeleteGroups): refused while the group has a member; once it has
    none, a reset to the earliest offset delivers every record again (the leader's share-partition
    is read again, not served from memory), deleted offsets start over from
    share.auto.offset.reset, and a deleted group is no longer listed or described."""
    # Short share sessions: the consume mode exits like a crash, and its member must time out.
    broker = broker_factory(extra_args=["--override", "group_share_session_timeout_ms=4000",
                                        "--override", "group_share_heartbeat_interval_ms=1000"])
    topic, group = unique("q"), unique("admin")
    n = 40
    kw.create_topic(broker.bootstrap, topic, 1)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(n):
        producer.produce(topic, key=f"k-{i}", value=f"k-{i}")
    assert producer.flush(30) == 0

    def consume_all():
        res = run_java(java_cp, SHARE, ["--bootstrap", broker.bootstrap, "--mode", "consume", "--topic", topic,
                                        "--group", group, "--count", str(n)], timeout=120)
        assert res.returncode == 0, res.report()
        acked = sorted(line.split()[1] for line in res.stdout.splitlines() if line.startswith("ACKED "))
        assert acked == sorted(f"k-{i}" for i in range(n)), res.report()

    def share_groups(*args, ok=True):
        out = run_java(tools_cp, SHARE_GROUP_COMMAND, ["--bootstrap-server", broker.bootstrap, *args], timeout=60)
        if ok:
            assert out.returncode == 0, out.report()
        return out.stdout + out.stderr

    def described():
        rows = [line.split() for line in share_groups("--describe", "--group", group).splitlines()
                if line.startswith(group)]
        assert len(rows) == 1 and rows[0][1:3] == [topic, "0"], rows
        return rows[0]

    def start_offset():
        return described()[3]

    consume_all()
    # While the group has a member, changes are refused.
    with kw.Conn.to(broker.bootstrap) as conn:
        joined = conn.share_heartbeat(group, "admin-test-member", 0, [topic])
        assert joined.error == 0, joined
        # The member heartbeats while the tool runs (its JVM may take longer than the session).
        stop = threading.Event()

        def keep_alive():
            epoch = joined.member_epoch
            while not stop.wait(0.5):
                beat = conn.share_heartbeat(group, "admin-test-member", epoch)
                epoch = beat.member_epoch if beat.error == 0 else epoch

        alive = threading.Thread(target=keep_alive)
        alive.start()
        try:
            refused = share_groups("--reset-offsets", "--group", group, "--topic", topic, "--to-earliest",
                                   "--execute", ok=False)
        finally:
            stop.set()
            alive.join()
        assert "not empty" in refused.lower() or "NonEmptyGroup" in refused or "active members" in refused, refused
        assert conn.share_heartbeat(group, "admin-test-member", -1).error == 0
    wait_for_empty = time.monotonic() + 60
    while "has no active members" not in share_groups("--describe", "--group", group, "--members"):
        assert time.monotonic() < wait_for_empty, "the crashed consumer never left the group"
        time.sleep(1)
    assert start_offset() == str(n)

    share_groups("--reset-offsets", "--group", group, "--topic", topic, "--to-earliest", "--execute")
    assert described()[3:5] == ["0", str(n)], "start offset 0, every record behind (LAG)"
    consume_all()  # every record again, each once
    assert start_offset() == str(n)

    wait_for_empty = time.monotonic() + 60
    while "has no active members" not in share_groups("--describe", "--group", group, "--members"):
        assert time.monotonic() < wait_for_empty
        time.sleep(1)
    share_groups("--delete-offsets", "--group", group, "--topic", topic)
    assert not [line for line in share_groups("--describe", "--group", group).splitlines()
                if line.startswith(group) and line.split()[3] != "-"], "offsets left after --delete-offsets"
    consume_all()  # a new share-partition, from the earliest offset
    assert start_offset() == str(n)

    wait_for_empty = time.monotonic() + 60
    while "has no active members" not in share_groups("--describe", "--group", group, "--members"):
        assert time.monotonic() < wait_for_empty
        time.sleep(1)
    share_groups("--delete", "--group", group)
    assert group not in share_groups("--list").split()
    assert "does not exist" in share_groups("--describe", "--group", group, ok=False)
