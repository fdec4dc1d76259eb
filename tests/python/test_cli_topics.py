"""`sluice topic`, `produce`, `consume` and `cluster` as an operator uses them: read-only
commands create nothing, the broker's own words for a refused request, aligned tables with
plurals and RFC 3339 times (or JSON/YAML for scripts), `-b` anywhere on the line, a broker
that cannot be reached named at once, and output cut short by a closed pipe ending the
command quietly."""

import json
import re
import subprocess
import time

from confluent_kafka.admin import AdminClient, NewTopic

from conftest import SLUICE_BIN, free_port

# A command against an address where nothing listens answers within this.
UNREACHABLE_ANSWER_S = 5


def sluice(*args, stdin=None, timeout=60):
    return subprocess.run([SLUICE_BIN, *args], capture_output=True, text=True, input=stdin, timeout=timeout)


def ok(*args, stdin=None) -> str:
    res = sluice(*args, stdin=stdin)
    assert res.returncode == 0, f"{args}: {res.stdout}\n{res.stderr}"
    return res.stdout


def topics_of(broker) -> set[str]:
    return set(AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=10).topics)


def table(text: str, header: str) -> list[list[str]]:
    """The rows of the table whose header line starts with `header`, split on the column gaps."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start:]:
        if not line.strip():
            break
        rows.append(re.split(r"\s{2,}", line.strip()))
    return rows


def test_describing_a_missing_topic_says_so_and_creates_nothing(broker):
    # -b after the subcommand, as rpk and kcat take it.
    res = sluice("topic", "describe", "typo-topic", "-b", broker.bootstrap)
    assert res.returncode != 0, res.stdout
    assert res.stderr == "error: topic typo-topic does not exist\n", res.stderr
    assert "typo-topic" not in topics_of(broker), "a read-only command created the topic"
    for command in (["topic", "alter-config", "typo-topic", "--set", "retention.ms=1"],
                    ["group", "reset-offsets", "g", "--topic", "typo-topic", "--to-earliest"]):
        res = sluice("-b", broker.bootstrap, *command)
        assert res.returncode != 0 and "topic typo-topic does not exist" in res.stderr, (command, res.stderr)
    assert "typo-topic" not in topics_of(broker), "a read-only command created the topic"


def test_a_consumer_of_a_missing_topic_is_told_at_once_and_creates_nothing(broker):
    started = time.monotonic()
    res = sluice("consume", "-b", broker.bootstrap, "missing-topic", "--max-messages", "1", timeout=UNREACHABLE_ANSWER_S)
    assert time.monotonic() - started < UNREACHABLE_ANSWER_S
    assert res.returncode != 0
    assert res.stderr == "error: topic missing-topic does not exist\n", res.stderr
    assert "missing-topic" not in topics_of(broker)


def test_refusals_are_told_in_the_brokers_words(broker):
    res = sluice("topic", "create", "bad", "-c", "retention.ms=abc", "-b", broker.bootstrap)
    assert res.returncode != 0
    assert res.stderr == ('error: creating topic bad: invalid value "abc" for configuration retention.ms: '
                          'expected a number\n'), res.stderr
    ok("topic", "create", "small", "-b", broker.bootstrap)
    res = sluice("topic", "alter-config", "small", "--set", "retention.ms=soon", "-b", broker.bootstrap)
    assert res.returncode != 0
    assert res.stderr == ('error: altering topic small: invalid value "soon" for configuration retention.ms: '
                          'expected a number\n'), res.stderr
    res = sluice("produce", "-b", broker.bootstrap, "small", stdin="x" * 2_000_000 + "\n")
    assert res.returncode != 0
    assert re.fullmatch(r"error: producing to small-0: batch of \d+ bytes exceeds max.message.bytes 1048588\n",
                        res.stderr), res.stderr
    again = sluice("topic", "create", "small", "-b", broker.bootstrap)
    assert again.returncode != 0 and "error: creating topic small: " in again.stderr, again.stderr
    assert "TopicAlreadyExists" not in again.stderr and "small" in again.stderr.split(": ", 2)[2], again.stderr


def test_describe_prints_aligned_tables_and_json_and_yaml_for_scripts(broker):
    assert ok("topic", "create", "one", "-b", broker.bootstrap) == "created topic one with 1 partition\n"
    assert ok("topic", "create", "three", "-p", "3", "-b", broker.bootstrap) == "created topic three with 3 partitions\n"
    assert ok("topic", "alter-config", "three", "--set", "retention.ms=60000", "-b", broker.bootstrap) == \
        "altered 1 config of topic three\n"
    ok("produce", "-b", broker.bootstrap, "one", stdin="a\nb\n")

    text = ok("topic", "describe", "one", "-b", broker.bootstrap)
    assert text.startswith("topic one: 1 partition\n"), text
    assert "Some(" not in text and "[" not in text, text
    assert table(text, "PARTITION") == [["PARTITION", "LEADER", "REPLICAS", "ISR", "LOG-START", "HIGH-WATERMARK"],
                                        ["0", "0", "0", "0", "0", "2"]], text
    header = text.splitlines()[2]
    row = text.splitlines()[3]
    # Right-aligned numbers end under the end of their header.
    assert row.index("2") + 1 == len(header), text
    configs = {row[0]: row[1:] for row in table(text, "CONFIG")}
    assert configs["max.message.bytes"] == ["1048588", "DEFAULT_CONFIG"], configs

    three = ok("topic", "describe", "three", "-b", broker.bootstrap)
    assert three.startswith("topic three: 3 partitions\n")
    assert {row[0]: row[1:] for row in table(three, "CONFIG")}["retention.ms"] == ["60000", "DYNAMIC_TOPIC_CONFIG"]

    described = json.loads(ok("--format", "json", "topic", "describe", "one", "-b", broker.bootstrap))
    assert described["name"] == "one"
    assert described["partitions"] == [{"partition": 0, "leader": 0, "replicas": [0], "isr": [0], "log_start": 0,
                                        "high_watermark": 2}]
    listed = json.loads(ok("topic", "list", "--format", "json", "-b", broker.bootstrap))
    assert {"name": "three", "partitions": 3, "replicas": 1, "internal": False} in listed
    as_yaml = ok("topic", "list", "--format", "yaml", "-b", broker.bootstrap)
    assert "- name: one\n  partitions: 1\n  replicas: 1\n  internal: false\n" in as_yaml, as_yaml
    rows = table(ok("topic", "list", "-b", broker.bootstrap), "NAME")
    assert rows[0] == ["NAME", "PARTITIONS", "REPLICAS"] and ["three", "3", "1"] in rows, rows


def test_consume_verbose_shows_rfc3339_times_and_keys(broker):
    ok("topic", "create", "keyed", "-b", broker.bootstrap)
    before = time.time()
    ok("produce", "-b", broker.bootstrap, "keyed", "--key-separator", ":", stdin="kk1:v1\nv2\n")
    out = ok("consume", "-b", broker.bootstrap, "keyed", "--from-beginning", "--max-messages", "2", "--verbose")
    lines = out.splitlines()
    assert len(lines) == 2, out
    pattern = (r"partition=0 offset=(\d) timestamp=(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z) key=(\S+) "
               r"headers=0\t(\S+)")
    parsed = [re.fullmatch(pattern, line) for line in lines]
    assert all(parsed), out
    assert [(m[1], m[3], m[4]) for m in parsed] == [("0", "kk1", "v1"), ("1", "-", "v2")]
    stamp = time.mktime(time.strptime(parsed[0][2][:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone
    assert abs(stamp - before) < 60, parsed[0][2]


def test_cluster_shows_its_brokers_in_a_table(broker):
    text = ok("cluster", "-b", broker.bootstrap)
    assert "Some(" not in text and "origin" not in text, text
    assert table(text, "NODE") == [["NODE", "HOST", "PORT", "RACK"], ["0*", "127.0.0.1", str(broker.port), "-"]]
    assert re.search(r"^\d+ topics?, \d+ partitions?: 0 under-replicated, 0 offline \(no leader\)$", text, re.M), text
    view = json.loads(ok("cluster", "--format", "json", "-b", broker.bootstrap))
    assert view["brokers"] == [{"node": 0, "host": "127.0.0.1", "port": broker.port, "rack": None,
                                "controller": True}]


def test_brokers_flag_goes_anywhere_on_the_line(broker):
    ok("topic", "create", "anywhere", "-b", broker.bootstrap)
    for args in (["-b", broker.bootstrap, "topic", "list"], ["topic", "-b", broker.bootstrap, "list"],
                 ["topic", "list", "--brokers", broker.bootstrap], ["--bootstrap", broker.bootstrap, "topic", "list"],
                 ["-b", broker.bootstrap, "acl", "list"], ["user", "list", "-b", broker.bootstrap],
                 ["share", "-b", broker.bootstrap, "list"], ["group", "list", "-b", broker.bootstrap],
                 ["-X", "socket.connection.setup.timeout.ms=3000", "cluster", "-b", broker.bootstrap]):
        res = sluice(*args)
        assert res.returncode == 0, f"{args}: {res.stderr}"


def test_output_cut_short_by_a_closed_pipe_ends_quietly(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic("wide", 64)]).values():
        future.result(timeout=10)
    # `sluice topic describe wide | head -1`: the reader goes after the first line.
    process = subprocess.Popen([SLUICE_BIN, "topic", "-b", broker.bootstrap, "describe", "wide"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
    assert process.stdout.readline() == "topic wide: 64 partitions\n"
    process.stdout.close()
    stderr = process.stderr.read()
    code = process.wait(timeout=30)
    assert stderr == "" and code != 101, f"exit {code}: {stderr}"
    # More output than a pipe holds: the writes after the reader left fail.
    ok("produce", "-b", broker.bootstrap, "wide", stdin="".join(f"{i}\n" for i in range(30_000)))
    process = subprocess.Popen([SLUICE_BIN, "consume", "-b", broker.bootstrap, "wide", "--from-beginning",
                                "--max-messages", "30000", "--verbose"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    assert process.stdout.readline().startswith("partition=")
    process.stdout.close()
    stderr = process.stderr.read()
    code = process.wait(timeout=30)
    assert stderr == "" and code != 101, f"exit {code}: {stderr}"
    for command in (["topic", "list"], ["--format", "json", "topic", "describe", "wide"]):
        shell = subprocess.run(["sh", "-c", '"$0" "$@" | head -c 10 >/dev/null', SLUICE_BIN, "-b", broker.bootstrap,
                                *command], capture_output=True, text=True, timeout=30)
        assert shell.stderr == "", f"{command}: {shell.stderr}"


def test_an_unreachable_broker_is_named_at_once():
    address = f"127.0.0.1:{free_port()}"
    commands = [(["produce", "-b", address, "t"], "hi\n"), (["topic", "-b", address, "list"], None),
                (["topic", "-b", address, "describe", "t"], None),
                (["consume", "-b", address, "t", "--max-messages", "1"], None),
                (["group", "list", "-b", address], None), (["cluster", "-b", address], None),
                (["acl", "list", "-b", address], None)]
    for args, stdin in commands:
        started = time.monotonic()
        res = sluice(*args, stdin=stdin, timeout=UNREACHABLE_ANSWER_S + 10)
        took = time.monotonic() - started
        assert res.returncode != 0, args
        assert took < UNREACHABLE_ANSWER_S, f"{args}: {took:.1f} s"
        assert res.stderr == f"error: cannot reach {address}: connection refused\n", f"{args}: {res.stderr}"
