"""Apache Kafka's own command-line tools (kafka-tools 4.3.1 from Maven Central) against Sluice.

Each tool runs as its main class from the tests/kafka-tools/lib classpath, exactly as
bin/kafka-topics.sh etc. would run it, against a real `sluice serve`.
"""

import re
import time

from java_support import run_java, tools_cp  # noqa: F401  (tools_cp is a fixture)

TOPIC_COMMAND = "org.apache.kafka.tools.TopicCommand"
PRODUCER_PERF = "org.apache.kafka.tools.ProducerPerformance"
CONSUMER_PERF = "org.apache.kafka.tools.ConsumerPerformance"
GET_OFFSET_SHELL = "org.apache.kafka.tools.GetOffsetShell"
CONFIG_COMMAND = "kafka.admin.ConfigCommand"

ZERO_TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAA"

PERF_SUMMARY = re.compile(
    r"^(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\), ([\d.]+) ms avg latency, "
    r"([\d.]+) ms max latency, (\d+) ms 50th, (\d+) ms 95th, (\d+) ms 99th, (\d+) ms 99\.9th\.?$",
    re.M,
)


def tool(cp, broker, main_class, *args, timeout=120, ok=True):
    res = run_java(cp, main_class, args, timeout=timeout)
    if ok:
        assert res.returncode == 0, f"{res.report()}\n--- broker log (tail) ---\n{broker.log()[-6000:]}"
    return res


def topics(cp, broker, *args, ok=True):
    return tool(cp, broker, TOPIC_COMMAND, "--bootstrap-server", broker.bootstrap, *args, ok=ok)


def listed_topics(cp, broker) -> list[str]:
    return [l.strip() for l in topics(cp, broker, "--list").stdout.splitlines() if l.strip()]


def describe(cp, broker, topic):
    """Parses `TopicCommand --describe`: the topic line's fields and one dict per partition line."""
    res = topics(cp, broker, "--describe", "--topic", topic)
    head, parts = None, []
    for line in res.stdout.splitlines():
        fields = dict(re.findall(r"(\w+): ?([^\t]*)", line))
        if "Partition" in fields:
            parts.append(fields)
        elif "PartitionCount" in fields:
            head = fields
    assert head is not None, f"no topic line in --describe output\n{res.report()}"
    return head, parts, res


def produce_perf(cp, broker, topic, n, extra_props=()):
    res = tool(cp, broker, PRODUCER_PERF, "--topic", topic, "--num-records", n, "--record-size", 1024,
               "--throughput", -1, "--producer-props", f"bootstrap.servers={broker.bootstrap}", "acks=all",
               *extra_props, timeout=300)
    m = PERF_SUMMARY.findall(res.stdout)
    assert m, f"no final 'records sent' summary line\n{res.report()}"
    # Send failures are printed by the tool's callback as stack traces; there must be none.
    assert "Exception" not in res.stdout + res.stderr, res.report()
    return m[-1], res


def end_offsets(cp, broker, topic, time_spec="-1") -> dict[int, int]:
    res = tool(cp, broker, GET_OFFSET_SHELL, "--bootstrap-server", broker.bootstrap, "--topic", topic,
               "--time", time_spec)
    out = {}
    for line in res.stdout.splitlines():
        m = re.fullmatch(rf"{re.escape(topic)}:(\d+):(\d+)", line.strip())
        if m:
            out[int(m.group(1))] = int(m.group(2))
    return out


def test_topic_command(broker, tools_cp):
    """kafka-topics: --create with partitions and --config; duplicate create fails; --list;
    --describe shows the topic id, partition count, configs and every partition with
    leader/replicas/ISR; --alter --partitions grows it (shrinking fails); --delete removes it."""
    cp = tools_cp
    res = topics(cp, broker, "--create", "--topic", "tools-topic", "--partitions", "6", "--replication-factor", "1",
                 "--config", "retention.ms=3600000", "--config", "max.message.bytes=2000000")
    assert "Created topic tools-topic." in res.stdout, res.report()
    topics(cp, broker, "--create", "--topic", "tools-other", "--partitions", "2")

    dup = topics(cp, broker, "--create", "--topic", "tools-topic", "--partitions", "6", ok=False)
    assert dup.returncode != 0, dup.report()
    assert "already exists" in dup.stdout + dup.stderr, dup.report()

    names = listed_topics(cp, broker)
    assert "tools-topic" in names and "tools-other" in names, names

    head, parts, res = describe(cp, broker, "tools-topic")
    assert head["Topic"] == "tools-topic", res.report()
    assert head.get("TopicId") and head["TopicId"] != ZERO_TOPIC_ID, res.report()
    assert head["PartitionCount"] == "6" and head["ReplicationFactor"] == "1", res.report()
    configs = dict(kv.split("=", 1) for kv in head.get("Configs", "").split(",") if "=" in kv)
    assert configs.get("retention.ms") == "3600000", res.report()
    assert configs.get("max.message.bytes") == "2000000", res.report()
    assert sorted(int(p["Partition"]) for p in parts) == list(range(6)), res.report()
    for p in parts:
        assert re.fullmatch(r"\d+", p["Leader"]), res.report()
        assert p["Replicas"] == p["Leader"] and p["Isr"] == p["Leader"], res.report()

    res = topics(cp, broker, "--alter", "--topic", "tools-topic", "--partitions", "10")
    head, parts, res = describe(cp, broker, "tools-topic")
    assert head["PartitionCount"] == "10", res.report()
    assert sorted(int(p["Partition"]) for p in parts) == list(range(10)), res.report()

    shrink = topics(cp, broker, "--alter", "--topic", "tools-topic", "--partitions", "4", ok=False)
    assert shrink.returncode != 0, shrink.report()
    head, parts, res = describe(cp, broker, "tools-topic")
    assert head["PartitionCount"] == "10", res.report()

    topics(cp, broker, "--delete", "--topic", "tools-topic")
    deadline = time.monotonic() + 15
    while "tools-topic" in (names := listed_topics(cp, broker)):
        assert time.monotonic() < deadline, f"deleted topic still listed: {names}"
        time.sleep(0.5)
    assert "tools-other" in names, names
    gone = topics(cp, broker, "--describe", "--topic", "tools-topic", ok=False)
    assert gone.returncode != 0 and "does not exist" in gone.stdout + gone.stderr, gone.report()
    assert broker.is_running()


def test_config_command(broker, tools_cp):
    """kafka-configs: --alter --add-config on a topic shows up in --describe as dynamic topic
    configs; --delete-config removes it again; a broker's --describe --all lists its configs."""
    cp = tools_cp
    topics(cp, broker, "--create", "--topic", "cfg-topic", "--partitions", "2")

    def configs(*args):
        return tool(cp, broker, CONFIG_COMMAND, "--bootstrap-server", broker.bootstrap, *args)

    def dynamic():
        res = configs("--describe", "--entity-type", "topics", "--entity-name", "cfg-topic")
        return dict(re.findall(r"^\s+([\w.]+)=(\S*) sensitive=", res.stdout, re.M)), res

    res = configs("--alter", "--entity-type", "topics", "--entity-name", "cfg-topic",
                  "--add-config", "retention.ms=3600000,segment.bytes=1048576")
    assert "Completed updating config for topic cfg-topic." in res.stdout, res.report()
    got, res = dynamic()
    assert got == {"retention.ms": "3600000", "segment.bytes": "1048576"}, res.report()

    configs("--alter", "--entity-type", "topics", "--entity-name", "cfg-topic", "--delete-config", "retention.ms")
    got, res = dynamic()
    assert got == {"segment.bytes": "1048576"}, res.report()

    bad = tool(cp, broker, CONFIG_COMMAND, "--bootstrap-server", broker.bootstrap, "--alter", "--entity-type", "topics",
               "--entity-name", "cfg-topic", "--add-config", "retention.ms=not-a-number", ok=False)
    assert bad.returncode != 0, bad.report()
    got, res = dynamic()
    assert got == {"segment.bytes": "1048576"}, res.report()

    res = configs("--describe", "--entity-type", "brokers", "--entity-name", "0", "--all")
    assert re.search(r"^All configs for broker 0 are:", res.stdout, re.M), res.report()
    assert len(re.findall(r"^\s+[\w.]+=.* sensitive=", res.stdout, re.M)) > 0, res.report()
    assert broker.is_running()


def test_producer_performance(broker, tools_cp):
    """kafka-producer-perf-test: 200,000 x 1 KiB records, unthrottled, acks=all, into an
    8-partition topic; exits 0 with its summary line reporting all 200,000 sent and no send
    errors; GetOffsetShell then shows 200,000 records across the 8 partitions, starting at 0."""
    cp = tools_cp
    topics(cp, broker, "--create", "--topic", "perf", "--partitions", "8", "--replication-factor", "1")
    summary, res = produce_perf(cp, broker, "perf", 200_000)
    sent, rps, mbps, avg, mx, p50, p95, p99, p999 = summary
    assert int(sent) == 200_000, res.report()
    assert float(rps) > 0 and float(mbps) > 0, res.report()
    print(f"ProducerPerformance against Sluice: {rps} records/s, {mbps} MB/s, p50 {p50} ms, p99 {p99} ms, "
          f"p99.9 {p999} ms, max {mx} ms")
    latest = end_offsets(cp, broker, "perf", "-1")
    assert sorted(latest) == list(range(8)), latest
    assert sum(latest.values()) == 200_000, latest
    assert all(v > 0 for v in latest.values()), latest
    earliest = end_offsets(cp, broker, "perf", "-2")
    assert earliest == {p: 0 for p in range(8)}, earliest
    assert broker.is_running()


def test_consumer_performance(broker, tools_cp):
    """kafka-consumer-perf-test (it subscribes with a consumer group): after ProducerPerformance
    wrote 100,000 x 1 KiB records to a 4-partition topic, it consumes exactly 100,000 records and
    exits 0. Needs consumer groups (FindCoordinator, JoinGroup, SyncGroup, Heartbeat,
    OffsetFetch/Commit)."""
    cp = tools_cp
    n = 100_000
    topics(cp, broker, "--create", "--topic", "cperf", "--partitions", "4", "--replication-factor", "1")
    summary, res = produce_perf(cp, broker, "cperf", n)
    assert int(summary[0]) == n, res.report()
    res = tool(cp, broker, CONSUMER_PERF, "--bootstrap-server", broker.bootstrap, "--topic", "cperf",
               "--num-records", n, "--timeout", 30000, timeout=180)
    lines = [l for l in res.stdout.splitlines() if l.strip()]
    header_idx = next((i for i, l in enumerate(lines) if l.startswith("start.time")), None)
    assert header_idx is not None and header_idx + 1 < len(lines), f"no stats in output\n{res.report()}"
    header = [h.strip() for h in lines[header_idx].split(",")]
    values = [v.strip() for v in lines[header_idx + 1].split(",")]
    stats = dict(zip(header, values))
    assert int(stats["data.consumed.in.nMsg"]) == n, res.report()
    assert abs(float(stats["data.consumed.in.MB"]) - n * 1024 / (1024 * 1024)) < 0.01, res.report()
    assert "Exception" not in res.stdout + res.stderr, res.report()
    print(f"ConsumerPerformance against Sluice: {stats}")
    assert broker.is_running()
