"""The `sluice` verbs an rpk or kcat user reaches for, against a real broker: topic
add-partitions and trim; produce with headers, a partition, a fixed key, `-K`, templates and
JSON lines; consume from an offset, a time or N before the end, of chosen partitions, in
kcat templates and JSON lines, and as a group member that commits; group seek,
delete-offsets and the members' assignments (classic and consumer protocol); cluster versions
and broker configs; and a debug bundle. Several verbs share one broker per test."""

import json
import subprocess
import tarfile
import time

from confluent_kafka import Consumer

from conftest import NO_REBALANCE_DELAY, SLUICE_BIN, free_port
from test_cli_topics import table


def sluice(broker, *args, stdin=None, ok=True) -> subprocess.CompletedProcess:
    res = subprocess.run([SLUICE_BIN, *args, "-b", broker.bootstrap], capture_output=True, text=True, input=stdin,
                         timeout=60)
    if ok:
        assert res.returncode == 0, f"{args}: {res.stdout}\n{res.stderr}"
    elif ok is not None:
        assert res.returncode != 0, f"{args} succeeded: {res.stdout}"
    return res


def out(broker, *args, stdin=None) -> str:
    return sluice(broker, *args, stdin=stdin).stdout


def test_partitions_are_added_and_trimmed_and_records_keep_their_keys_headers_and_partitions(broker):
    out(broker, "topic", "create", "orders")
    assert out(broker, "topic", "add-partitions", "orders", "--num", "2") == \
        "added 2 partitions to topic orders: 3 partitions now\n"
    assert out(broker, "topic", "add-partitions", "orders", "--num", "4", "--total") == \
        "added 1 partition to topic orders: 4 partitions now\n"
    shrink = sluice(broker, "topic", "add-partitions", "orders", "--num", "2", "--total", ok=False)
    assert shrink.stderr == "error: topic orders has 4 partitions: partitions can only be added\n", shrink.stderr
    out(broker, "topic", "create", "refunds")
    several = sluice(broker, "topic", "add-partitions", "refunds", "typo", "--num", "+1", ok=False)
    assert several.stdout == "added 1 partition to topic refunds: 2 partitions now\n", several.stdout
    assert several.stderr == "error: topic typo does not exist\nerror: 1 topic not grown\n", several.stderr

    # Flags fill in what lines do not say: a key, headers (a value may hold colons), a partition.
    sluice(broker, "produce", "orders", "-p", "1", "-k", "fixed", "-H", "a:1", "-H", "trace:x:y", stdin="v1\nv2\n")
    kcat = out(broker, "consume", "orders", "-p", "1", "-o", "start", "-n", "2", "-f", r"%t %p %o %k %v %h\n")
    assert kcat == "orders 1 0 fixed v1 a=1,trace=x:y\norders 1 1 fixed v2 a=1,trace=x:y\n", kcat
    # A template in, kcat's -K, and JSON lines that keep a missing key apart from an empty one.
    sluice(broker, "produce", "orders", "-f", r"%p|%k|%v\n", stdin="2|k1|hello world\n2|k2|second\n")
    sluice(broker, "produce", "orders", "-p", "2", "-K:", stdin="k3:v:3\n")
    sluice(broker, "produce", "orders", "--format", "json",
           stdin='{"key": "", "value": "empty key", "partition": 2, "headers": {"h": "1"}}\n'
                 '{"value": null, "partition": 2}\n')
    lines = out(broker, "consume", "orders", "-p", "2", "-o", "start", "-n", "5", "--format", "json").splitlines()
    records = [json.loads(line) for line in lines]
    assert [(r["offset"], r["key"], r["value"]) for r in records] == [
        (0, "k1", "hello world"), (1, "k2", "second"), (2, "k3", "v:3"), (3, "", "empty key"), (4, None, None)]
    assert records[3]["headers"] == [{"key": "h", "value": "1"}] and records[0]["headers"] == []
    assert {r["topic"] for r in records} == {"orders"} and all(r["timestamp"] > 0 for r in records)
    bad = sluice(broker, "produce", "orders", "-p", "9", stdin="x\n", ok=False)
    assert bad.stderr == "error: topic orders has no partition 9 (4 partitions)\n", bad.stderr

    # -N before the end, +N after the start, a time; -e stops at the end of every partition read.
    assert out(broker, "consume", "orders", "-p", "2", "-o", "-1", "-n", "1", "-f", r"%o\n") == "4\n"
    assert out(broker, "consume", "orders", "-p", "1,2", "-o", "+3", "-e", "-f", r"%p:%o\n") == "2:3\n2:4\n"
    everything = out(broker, "consume", "orders", "-o", "start", "-e", "-f", r"%p:%o ").split()
    assert sorted(everything) == ["1:0", "1:1", "2:0", "2:1", "2:2", "2:3", "2:4"], everything
    later = int(time.time() * 1000) + 1
    time.sleep(0.01)
    sluice(broker, "produce", "orders", "-p", "2", stdin="after\n")
    assert out(broker, "consume", "orders", "-p", "2", "-o", f"@{later}", "-n", "1", "-f", r"%o %v\n") == "5 after\n"

    # Trimming moves the log start: the table says where it is now.
    trimmed = out(broker, "topic", "trim", "orders", "-p", "2", "--offset", "3")
    assert table(trimmed, "TOPIC") == [["TOPIC", "PARTITION", "LOG-START"], ["orders", "2", "3"]], trimmed
    everything = json.loads(out(broker, "topic", "trim", "orders", "-p", "1", "--offset", "end", "--format", "json"))
    assert everything == [{"topic": "orders", "partition": 1, "log_start": 2}]
    starts = {p["partition"]: p["log_start"] for p in
              json.loads(out(broker, "topic", "describe", "orders", "--format", "json"))["partitions"]}
    assert starts == {0: 0, 1: 2, 2: 3, 3: 0}, starts
    assert out(broker, "consume", "orders", "-p", "2", "-o", "start", "-n", "1", "-f", r"%o %v\n") == "3 empty key\n"


def test_a_group_member_commits_and_its_offsets_are_sought_deleted_and_described(broker_factory):
    broker = broker_factory(extra_args=NO_REBALANCE_DELAY)
    out(broker, "topic", "create", "events")
    sluice(broker, "produce", "events", stdin="".join(f"v{i}\n" for i in range(10)))

    # As a member of g: what is printed is committed, and the next member goes on from there.
    assert out(broker, "consume", "events", "--group", "g", "-o", "start", "-n", "4") == "v0\nv1\nv2\nv3\n"
    assert out(broker, "consume", "events", "-g", "g", "-n", "2") == "v4\nv5\n"
    offsets = json.loads(out(broker, "group", "describe", "g", "--format", "json"))["offsets"]
    assert offsets == [{"topic": "events", "partition": 0, "committed": 6, "log_end": 10, "lag": 4}], offsets
    refused = sluice(broker, "consume", "events", "-g", "g", "-o", "3", "-n", "1", ok=False)
    assert "with --group, --offset is start or end" in refused.stderr, refused.stderr

    # seek shows the plan and commits it only with --execute.
    plan = sluice(broker, "group", "seek", "g", "--to", "start")
    assert table(plan.stdout, "TOPIC") == [["TOPIC", "PARTITION", "CURRENT", "NEW"], ["events", "0", "6", "0"]]
    assert "dry run" in plan.stderr
    assert json.loads(out(broker, "group", "describe", "g", "--format", "json"))["offsets"][0]["committed"] == 6
    sluice(broker, "group", "seek", "g", "--to", "start", "--execute")
    shifted = json.loads(out(broker, "group", "seek", "g", "--shift-by", "3", "--execute", "--format", "json"))
    assert shifted == [{"topic": "events", "partition": 0, "current": 0, "new": 3}], shifted
    assert json.loads(out(broker, "group", "seek", "g", "--shift-by", "-10", "--format", "json"))[0]["new"] == 0
    assert json.loads(out(broker, "group", "seek", "g", "--to", "end", "--topic", "events",
                          "--format", "json"))[0]["new"] == 10
    assert out(broker, "consume", "events", "-g", "g", "-n", "1") == "v3\n"

    # delete-offsets forgets them (the group is empty: no member is subscribed).
    assert out(broker, "group", "delete-offsets", "g", "--topic", "events") == \
        "deleted the committed offsets of group g for events (1 partition)\n"
    # An empty group without offsets is left for the broker to remove, at once or later.
    after = sluice(broker, "group", "describe", "g", "--format", "json", ok=None)
    assert (after.returncode == 0 and json.loads(after.stdout)["offsets"] == []) or \
        after.stderr == "error: group g does not exist\n", after

    # A consumer-protocol (KIP-848) member's assignment, as ConsumerGroupDescribe gives it.
    out(broker, "topic", "create", "streams", "-p", "2")
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "next-gen", "client.id": "kip848",
                         "group.protocol": "consumer"})
    consumer.subscribe(["streams"])
    try:
        deadline = time.monotonic() + 30
        while not consumer.assignment() and time.monotonic() < deadline:
            consumer.poll(0.2)
        assert len(consumer.assignment()) == 2, consumer.assignment()
        # The member has its partitions; the group is Stable once it has said so (a heartbeat).
        described = out(broker, "group", "describe", "next-gen")
        while "state Stable" not in described and time.monotonic() < deadline:
            consumer.poll(0.2)
            described = out(broker, "group", "describe", "next-gen")
        assert described.startswith("group next-gen: 1 member, state Stable"), described
        members = table(described, "MEMBER")
        assert members[0] == ["MEMBER", "CLIENT-ID", "HOST", "ASSIGNED"], described
        assert members[1][1] == "kip848" and members[1][3] == "streams:0,1", described
        # Assigned, nothing committed yet: listed without a committed offset or lag.
        assert table(described, "TOPIC")[1:] == [["streams", "0", "-", "0", "-"], ["streams", "1", "-", "0", "-"]]
    finally:
        consumer.close()


def test_cluster_versions_broker_configs_and_a_debug_bundle_without_secrets(broker_factory, tmp_path):
    metrics_port = free_port()
    broker = broker_factory(extra_args=["--metrics-listen", f"127.0.0.1:{metrics_port}", *NO_REBALANCE_DELAY])
    versions = out(broker, "cluster", "versions")
    assert versions.startswith("sluice "), versions
    apis = {row[0]: row[1:] for row in table(versions, "API")}
    assert int(apis["Produce"][1]) >= 9 and "CreatePartitions" in apis and "DeleteRecords" in apis, apis
    as_json = json.loads(out(broker, "cluster", "versions", "--format", "json"))
    assert as_json["brokers"][0]["node"] == 0 and {"api": "Metadata", "min": 0, "max": 12} in \
        as_json["brokers"][0]["apis"], as_json

    configs = {row[0]: row[1:] for row in table(out(broker, "cluster", "config", "get"), "CONFIG")}
    assert configs["num.partitions"][0] == "1" and configs["auto.create.topics.enable"][0] == "true", configs
    one = json.loads(out(broker, "cluster", "config", "get", "log.retention.ms", "--broker", "0", "--format", "json"))
    assert [c["name"] for c in one] == ["log.retention.ms"], one
    missing = sluice(broker, "cluster", "config", "get", "no.such.config", ok=False)
    assert missing.stderr == "error: the brokers have no config no.such.config\n", missing.stderr
    refused = sluice(broker, "cluster", "config", "set", "log.retention.ms", "1000", ok=False)
    assert refused.stderr.startswith("error: setting log.retention.ms of the cluster-wide default: "), refused.stderr

    out(broker, "topic", "create", "kept", "-c", "retention.ms=60000")
    sluice(broker, "produce", "kept", stdin="a\n")
    assert out(broker, "consume", "kept", "-g", "bundled", "-o", "start", "-n", "1") == "a\n"
    bundle = tmp_path / "support.tar.gz"
    written = sluice(broker, "debug", "bundle", "--output", str(bundle),
                     "--metrics-url", f"http://127.0.0.1:{metrics_port}/metrics",
                     "-X", "sasl.password=never-in-the-bundle")
    assert written.stdout == f"wrote {bundle} (7 of 7 parts)\n", written.stdout + written.stderr
    with tarfile.open(bundle) as archive:
        files = {member.name: archive.extractfile(member).read().decode() for member in archive.getmembers()}
    assert sorted(files) == [f"sluice-bundle/{name}" for name in (
        "broker-configs.json", "groups.json", "manifest.json", "metadata.json", "metrics-0.txt", "topic-configs.json",
        "versions.json")], sorted(files)
    assert not any("never-in-the-bundle" in text for text in files.values())
    manifest = json.loads(files["sluice-bundle/manifest.json"])
    assert set(manifest["parts"].values()) == {"ok"}, manifest
    topic_configs = json.loads(files["sluice-bundle/topic-configs.json"])
    assert {"name": "retention.ms", "value": "60000", "source": "DYNAMIC_TOPIC_CONFIG"} in topic_configs["kept"]
    groups = json.loads(files["sluice-bundle/groups.json"])
    assert {"group": "bundled", "type": "classic", "state": "Empty",
            "committed": [{"topic": "kept", "partition": 0, "offset": 1}]} in groups, groups
    assert "sluice_build_info" in files["sluice-bundle/metrics-0.txt"]
    assert json.loads(files["sluice-bundle/metadata.json"])["brokers"][0]["port"] == broker.port
