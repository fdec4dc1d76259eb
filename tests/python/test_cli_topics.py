"""`sluice topic`, `produce` and `consume` as an operator uses them: read-only commands
create nothing, output cut short by a closed pipe ends the command quietly, and a broker
that cannot be reached is named in a prompt error."""

import subprocess
import time

from confluent_kafka.admin import AdminClient, NewTopic

from conftest import SLUICE_BIN, free_port

# A command against an address where nothing listens answers within this.
UNREACHABLE_ANSWER_S = 20


def sluice(*args, stdin=None, timeout=60):
    return subprocess.run([SLUICE_BIN, *args], capture_output=True, text=True, input=stdin, timeout=timeout)


def topics_of(broker) -> set[str]:
    return set(AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=10).topics)


def test_describing_a_missing_topic_says_so_and_creates_nothing(broker):
    # -b after the subcommand, as rpk and kcat take it.
    res = sluice("topic", "describe", "typo-topic", "-b", broker.bootstrap)
    assert res.returncode != 0, res.stdout
    assert "typo-topic" in res.stderr and "not found" in res.stderr, res.stderr
    assert "typo-topic" not in topics_of(broker), "a read-only command created the topic"
    listed = sluice("group", "list", "-b", broker.bootstrap)
    assert listed.returncode == 0, listed.stderr


def test_a_consumer_of_a_missing_topic_is_told_and_creates_nothing(broker):
    res = sluice("consume", "-b", broker.bootstrap, "missing-topic", "--max-messages", "1", timeout=UNREACHABLE_ANSWER_S)
    assert res.returncode != 0
    assert "missing-topic" in res.stderr and "not found" in res.stderr, res.stderr
    assert "missing-topic" not in topics_of(broker)


def test_output_cut_short_by_a_closed_pipe_ends_quietly(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic("wide", 64)]).values():
        future.result(timeout=10)
    # `sluice topic describe wide | head -1`: the reader goes after the first line.
    process = subprocess.Popen([SLUICE_BIN, "topic", "-b", broker.bootstrap, "describe", "wide"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout.readline().startswith("topic wide")
    process.stdout.close()
    stderr = process.stderr.read()
    code = process.wait(timeout=30)
    assert "panicked" not in stderr and code != 101, f"exit {code}: {stderr}"


def test_an_unreachable_broker_is_named_promptly():
    address = f"127.0.0.1:{free_port()}"
    commands = [(["produce", "-b", address, "t"], "hi\n"), (["topic", "-b", address, "list"], None),
                (["topic", "-b", address, "describe", "t"], None),
                (["consume", "-b", address, "t", "--max-messages", "1"], None)]
    started = time.monotonic()
    # All at once: each waits out the same connect timeout.
    running = [(args, stdin, subprocess.Popen([SLUICE_BIN, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                              stderr=subprocess.PIPE, text=True)) for args, stdin in commands]
    for args, stdin, process in running:
        _, stderr = process.communicate(input=stdin, timeout=UNREACHABLE_ANSWER_S + 10)
        took = time.monotonic() - started
        assert process.returncode != 0, args
        assert took < UNREACHABLE_ANSWER_S, f"{args}: {took:.1f} s"
        assert f"cannot reach {address}" in stderr, f"{args}: {stderr}"
