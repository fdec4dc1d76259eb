"""Kafka 4.3.1's own share-group tools against Sluice, unchanged (tests/kafka-tools classpath).

* kafka-console-share-consumer (ConsoleShareConsumer): with the group's
  `share.auto.offset.reset=earliest` set by kafka-configs (IncrementalAlterConfigs on the GROUP
  resource) it prints every record produced before it started, each once, delivery count 1;
  it accepts them, so kafka-share-groups then describes the partition's start offset as its end.
* VerifiableShareConsumer: two of them on a one-partition topic while a producer writes 300
  records over ~4 s: both receive records and every record is acknowledged exactly once overall
  (their JSON `offsets_acknowledged` events). Before that, kafka-share-groups describes the
  group as Stable with both members sharing partition 0 (`--state`, `--members`).
* ShareConsumerPerformance: two share consumers read 20,000 pre-produced records of a
  2-partition topic to the end: exit code 0, the expected count, both consumers took part.
"""

from __future__ import annotations

import json
import time
import uuid

from confluent_kafka import Producer

from java_support import JavaProcess, run_java, tools_cp  # noqa: F401  (fixture)
import kafka_wire as kw

CONSOLE_SHARE_CONSUMER = "org.apache.kafka.tools.consumer.ConsoleShareConsumer"
VERIFIABLE_SHARE_CONSUMER = "org.apache.kafka.tools.VerifiableShareConsumer"
SHARE_CONSUMER_PERFORMANCE = "org.apache.kafka.tools.ShareConsumerPerformance"
SHARE_GROUP_COMMAND = "org.apache.kafka.tools.consumer.group.ShareGroupCommand"
CONFIG_COMMAND = "kafka.admin.ConfigCommand"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def produce(bootstrap: str, topic: str, count: int, partitions: int = 1, pace_s: float = 0.0, size: int = 0):
    """`count` records with key and value `k-<i>` (padded to `size` bytes), round-robin over
    the partitions; with `pace_s`, one record per `pace_s` seconds, each delivered before the next."""
    producer = Producer({"bootstrap.servers": bootstrap, "broker.address.family": "v4", "linger.ms": 5})
    for i in range(count):
        value = f"k-{i}".ljust(size, ".").encode()
        producer.produce(topic, key=f"k-{i}", value=value, partition=i % partitions)
        if pace_s:
            producer.flush(10)
            time.sleep(pace_s)
    assert producer.flush(30) == 0


def tool(tools_cp: str, main_class: str, *args, timeout: float = 60):
    res = run_java(tools_cp, main_class, list(args), timeout=timeout)
    assert res.returncode == 0, res.report()
    return res


def share_groups(tools_cp: str, bootstrap: str, *args) -> list[list[str]]:
    """kafka-share-groups output as rows of words, headers and blank lines included."""
    res = tool(tools_cp, SHARE_GROUP_COMMAND, "--bootstrap-server", bootstrap, *args)
    return [line.split() for line in (res.stdout + res.stderr).splitlines() if line.strip()]


def test_console_share_consumer_reads_every_record_once(broker, tools_cp):
    topic, group = unique("console"), unique("console-group")
    kw.create_topic(broker.bootstrap, topic, 1)
    produce(broker.bootstrap, topic, 20)
    tool(tools_cp, CONFIG_COMMAND, "--bootstrap-server", broker.bootstrap, "--alter", "--entity-type", "groups",
         "--entity-name", group, "--add-config", "share.auto.offset.reset=earliest")
    res = tool(tools_cp, CONSOLE_SHARE_CONSUMER, "--bootstrap-server", broker.bootstrap, "--topic", topic,
               "--group", group, "--max-messages", "20", "--formatter-property", "print.key=true",
               "--formatter-property", "print.offset=true", "--formatter-property", "print.delivery=true")
    printed = sorted(line.split("\t") for line in res.stdout.splitlines() if line.startswith("Offset:"))
    expected = sorted([f"Offset:{i}", "Delivery:1", f"k-{i}", f"k-{i}"] for i in range(20))
    assert printed == expected, res.report()
    assert "Processed a total of 20 messages" in res.stdout + res.stderr, res.report()
    # It accepted all 20 (implicit acknowledgement, committed when it closed).
    rows = [r for r in share_groups(tools_cp, broker.bootstrap, "--describe", "--group", group) if r[0] == group]
    assert [r[1:4] for r in rows] == [[topic, "0", "20"]], rows


def events(process: JavaProcess, name: str) -> list[dict]:
    found = []
    for _, line in list(process.lines):
        if line.startswith("{"):
            event = json.loads(line)
            if event["name"] == name:
                found.append(event)
    return found


def offsets(event_list: list[dict]) -> list[int]:
    return [o for e in event_list for p in e["partitions"] for o in p["offsets"]]


def wait_for(condition, timeout: float, what: str, processes=()):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            report = "\n".join(p.result().report(3000) for p in processes)
            raise AssertionError(f"{what} not within {timeout}s\n{report}")
        time.sleep(0.1)


def test_two_verifiable_share_consumers_share_a_partition_and_acknowledge_each_record_once(broker, tools_cp):
    topic, group, count = unique("verifiable"), unique("verifiable-group"), 300
    kw.create_topic(broker.bootstrap, topic, 1)
    consumers = [
        JavaProcess(tools_cp, VERIFIABLE_SHARE_CONSUMER,
                    ["--bootstrap-server", broker.bootstrap, "--topic", topic, "--group-id", group,
                     "--offset-reset-strategy", "earliest", "--acknowledgement-mode", "sync"])
        for _ in range(2)
    ]
    try:
        wait_for(lambda: all(events(c, "offset_reset_strategy_set") for c in consumers), 60,
                 "both consumers started", consumers)
        # kafka-share-groups: a Stable group of two, both assigned the one partition.
        wait_for(lambda: [r[-2:] for r in share_groups(tools_cp, broker.bootstrap, "--describe", "--group", group,
                                                        "--state") if r[0] == group] == [["Stable", "2"]],
                 30, "a Stable group of 2", consumers)
        members = share_groups(tools_cp, broker.bootstrap, "--describe", "--group", group, "--members")
        rows = [r for r in members if r[0] == group]
        assert len(rows) == 2 and all(f"{topic}:0" in r for r in rows), members
        produce(broker.bootstrap, topic, count, pace_s=0.012)
        wait_for(lambda: len(set(offsets([e for c in consumers for e in events(c, "offsets_acknowledged")])))
                 >= count, 30, f"all {count} records acknowledged", consumers)
        time.sleep(1)  # anything acknowledged twice would show up now
    finally:
        for c in consumers:
            c.kill()
    acknowledged = [events(c, "offsets_acknowledged") for c in consumers]
    assert all(e["success"] for per_consumer in acknowledged for e in per_consumer), acknowledged
    per_consumer = [offsets(a) for a in acknowledged]
    assert all(per_consumer), f"each consumer acknowledges records: {[len(o) for o in per_consumer]}"
    every = sorted(per_consumer[0] + per_consumer[1])
    twice = sorted({o for o in every if every.count(o) > 1})
    assert not twice, f"offsets acknowledged more than once: {twice[:10]}"
    assert every == list(range(count))
    consumed = [offsets(events(c, "records_consumed")) for c in consumers]
    assert sorted(consumed[0] + consumed[1]) == list(range(count)), "each record delivered once"
    print(f"acknowledged per consumer: {[len(o) for o in per_consumer]}")


def test_share_consumer_performance_consumes_every_record(broker, tools_cp):
    topic, group, count = unique("perf"), unique("perf-group"), 20_000
    kw.create_topic(broker.bootstrap, topic, 2)
    produce(broker.bootstrap, topic, count, partitions=2, size=100)
    with kw.Conn.to(broker.bootstrap) as conn:
        assert conn.set_group_configs(group, {"share.auto.offset.reset": "earliest"}) == (0, None)
    res = tool(tools_cp, SHARE_CONSUMER_PERFORMANCE, "--bootstrap-server", broker.bootstrap, "--topic", topic,
               "--group", group, "--num-records", str(count), "--threads", "2", "--show-consumer-stats",
               "--timeout", "20000", timeout=90)
    assert "WARNING" not in res.stdout + res.stderr, res.report()
    # The summary's data.consumed.in.nMsg, then each consumer's share of it.
    summary = res.stdout.strip().splitlines()[-1].split(", ")
    assert int(summary[5]) == count, res.report()
    per_consumer = [int(line.split(", ")[5]) for line in res.stdout.splitlines() if line.startswith("Share consumer")]
    assert len(per_consumer) == 2 and sum(per_consumer) == count and min(per_consumer) > 0, res.report()
