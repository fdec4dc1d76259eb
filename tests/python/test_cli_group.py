"""`sluice group`: list, describe (lag), reset-offsets (dry run, then --execute) and delete,
against a real broker, with what a librdkafka consumer of the group committed."""

import json
import subprocess

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from conftest import NO_REBALANCE_DELAY, SLUICE_BIN
from test_cli_topics import table


def sluice_group(broker, *args, ok=True) -> str:
    res = subprocess.run([SLUICE_BIN, "group", "-b", broker.bootstrap, *args], capture_output=True, text=True,
                         timeout=60)
    if ok:
        assert res.returncode == 0, f"{res.stdout}\n{res.stderr}"
    return res.stdout + res.stderr




def lag_rows(text: str) -> list[tuple[str, int, int, int, int]]:
    rows = table(text, "TOPIC")
    assert rows[0] == ["TOPIC", "PARTITION", "COMMITTED", "LOG-END", "LAG"], text
    return [(row[0], int(row[1]), int(row[2]), int(row[3]), int(row[4])) for row in rows[1:]]


def test_group_list_describe_reset_delete(broker_factory):
    broker = broker_factory(extra_args=NO_REBALANCE_DELAY)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic("cli-t", 1)]).values():
        future.result(timeout=10)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(10):
        producer.produce("cli-t", f"v{i}".encode())
    assert producer.flush(10) == 0
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "cli-g", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.subscribe(["cli-t"])
    seen = 0
    while seen < 4:
        msg = consumer.poll(1.0)
        if msg is not None and msg.error() is None:
            seen += 1
            if seen == 4:
                consumer.commit(message=msg, asynchronous=False)
    consumer.close()

    assert table(sluice_group(broker, "list"), "GROUP") == [["GROUP", "STATE"], ["cli-g", "Empty"]]
    described = sluice_group(broker, "describe", "cli-g")
    assert described.startswith("group cli-g: 0 members, state Empty"), described
    assert lag_rows(described) == [("cli-t", 0, 4, 10, 6)]
    assert json.loads(sluice_group(broker, "describe", "cli-g", "--format", "json"))["offsets"] == [
        {"topic": "cli-t", "partition": 0, "committed": 4, "log_end": 10, "lag": 6}]

    plan = sluice_group(broker, "reset-offsets", "cli-g", "--topic", "cli-t", "--to-earliest")
    assert table(plan, "TOPIC") == [["TOPIC", "PARTITION", "NEW-OFFSET"], ["cli-t", "0", "0"]], plan
    assert "dry run" in plan
    assert lag_rows(sluice_group(broker, "describe", "cli-g")) == [("cli-t", 0, 4, 10, 6)], "a dry run commits nothing"
    sluice_group(broker, "reset-offsets", "cli-g", "--topic", "cli-t", "--to-offset", "7", "--execute")
    assert lag_rows(sluice_group(broker, "describe", "cli-g")) == [("cli-t", 0, 7, 10, 3)]

    assert sluice_group(broker, "delete", "cli-g") == "deleted group cli-g\n"
    again = sluice_group(broker, "delete", "cli-g", ok=False)
    assert again == "error: group cli-g does not exist\nerror: 1 group not deleted\n", again
    assert "cli-g" not in sluice_group(broker, "list")
    assert "error: group cli-g does not exist" in sluice_group(broker, "describe", "cli-g", ok=False)


def sluice(broker, *args, ok=True) -> str:
    command, *rest = args
    res = subprocess.run([SLUICE_BIN, command, "-b", broker.bootstrap, *rest], capture_output=True, text=True,
                         timeout=60)
    if ok:
        assert res.returncode == 0, f"{res.stdout}\n{res.stderr}"
    return res.stdout + res.stderr


def test_user_and_acl_commands_manage_what_clients_see(broker_factory):
    from conftest import free_port

    plaintext, sasl = free_port(), free_port()
    broker = broker_factory(extra_args=[
        "--override", f"listeners=PLAINTEXT://127.0.0.1:{plaintext},SASL_PLAINTEXT://127.0.0.1:{sasl}",
        "--override", "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "--override", "super.users=User:ANONYMOUS",
    ], port=plaintext)
    sluice(broker, "user", "add", "carol", "--password", "carol-secret")
    assert ["carol", "SCRAM-SHA-512", "8192"] in table(sluice(broker, "user", "list"), "NAME")
    sluice(broker, "topic", "create", "cli-acl")
    sluice(broker, "acl", "add", "--allow", "--principal", "User:carol", "--operation", "write",
           "--operation", "describe", "--topic", "cli-acl")
    listed = table(sluice(broker, "acl", "list", "--topic", "cli-acl"), "PRINCIPAL")
    assert listed == [["PRINCIPAL", "HOST", "RESOURCE-TYPE", "RESOURCE-NAME", "PATTERN", "OPERATION", "PERMISSION"],
                      ["User:carol", "*", "TOPIC", "cli-acl", "LITERAL", "WRITE", "ALLOW"],
                      ["User:carol", "*", "TOPIC", "cli-acl", "LITERAL", "DESCRIBE", "ALLOW"]], listed

    carol = {"bootstrap.servers": f"127.0.0.1:{sasl}", "security.protocol": "SASL_PLAINTEXT",
             "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "carol", "sasl.password": "carol-secret",
             "message.timeout.ms": 8000}

    def produce_outcome():
        outcome = []
        producer = Producer(carol)
        producer.produce("cli-acl", b"x", on_delivery=lambda err, msg: outcome.append(err and err.str()))
        producer.flush(12)
        return outcome
    assert produce_outcome() == [None]
    sluice(broker, "acl", "remove", "--topic", "cli-acl", "--principal", "User:carol")
    assert "carol" not in sluice(broker, "acl", "list")
    assert produce_outcome() == ["Broker: Topic authorization failed"]

    sluice(broker, "user", "delete", "carol")
    assert "carol" not in sluice(broker, "user", "list")
    # Kafka's error comes back as the command's failure, not a crash.
    refused = sluice(broker, "acl", "add", "--allow", "--principal", "carol", "--operation", "read", "--topic", "t",
                     ok=False)
    assert refused == "error: adding ACL READ on TOPIC t: Could not parse principal from `carol` (no colon is found)\n", \
        refused
    health = sluice(broker, "cluster")
    assert "under-replicated" in health and "0 offline" in health, health


def test_a_group_with_a_live_member_is_described_and_not_reset(broker_factory):
    broker = broker_factory(extra_args=NO_REBALANCE_DELAY)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic("live-t", 2)]).values():
        future.result(timeout=10)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "live-g", "client.id": "live-client",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe(["live-t"])
    try:
        for _ in range(100):
            consumer.poll(0.1)
            if consumer.assignment():
                break
        assert consumer.assignment(), "the consumer got no partitions"
        described = sluice_group(broker, "describe", "live-g")
        assert described.startswith("group live-g: 1 member, state Stable, protocol "), described
        members = table(described, "MEMBER")
        assert members[0] == ["MEMBER", "CLIENT-ID", "HOST", "ASSIGNED"], described
        assert members[1][1] == "live-client" and members[1][3] == "live-t:0,1", described
        refused = sluice_group(broker, "reset-offsets", "live-g", "--topic", "live-t", "--to-earliest", "--execute",
                               ok=False)
        assert refused == "error: group live-g has 1 active member: stop them first\n", refused
        as_json = json.loads(sluice_group(broker, "describe", "live-g", "--format", "json"))
        assert as_json["state"] == "Stable" and [m["client_id"] for m in as_json["members"]] == ["live-client"]
        assert as_json["members"][0]["assignment"] == [{"topic": "live-t", "partitions": [0, 1]}]
    finally:
        consumer.close()
