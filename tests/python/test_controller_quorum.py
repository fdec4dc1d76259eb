"""The controller quorum changed at run time with Apache Kafka's own tool
(`kafka-metadata-quorum.sh` of kafka-tools 4.3.1, run as its main class): a fourth node
started with the cluster's voters but not among them joins as an observer, `add-controller`
makes it a voter, `remove-controller` takes the active controller out of the voters (another
takes over and the removed one stays an observer), all while an idempotent acks=all
producer writes; every acknowledged record is read back and no send failed.
`describe --status` and `describe --replication` show each step."""

import json
import re
import subprocess
import uuid

from cluster_support import Cluster, LoadProducer, consume_all, create_topic, wait_for
from conftest import SLUICE_BIN, Broker, free_port
from java_support import run_java, tools_cp  # noqa: F401  (tools_cp is a fixture)

QUORUM_COMMAND = "org.apache.kafka.tools.MetadataQuorumCommand"
PARTITIONS = 3


def quorum_tool(cp, bootstrap, *args, logs=lambda: "", ok=True):
    res = run_java(cp, QUORUM_COMMAND, ["--bootstrap-server", bootstrap, *args], timeout=120)
    if ok:
        assert res.returncode == 0, f"{res.report()}\n--- broker logs (tail) ---\n{logs()[-6000:]}"
    return res


def status(cp, bootstrap, logs):
    """`describe --status` as {field: value}; voters and observers as sorted id lists."""
    out = quorum_tool(cp, bootstrap, "describe", "--status", logs=logs).stdout
    fields = dict(re.findall(r"^(\w+):\s+(.*)$", out, re.M))
    ids = lambda text: sorted(int(i) for i in re.findall(r'"id": (\d+)', text))  # noqa: E731
    return {**fields, "voters": ids(fields["CurrentVoters"]), "observers": ids(fields["CurrentObservers"])}


def replication(cp, bootstrap, logs):
    """`describe --replication` as {node id: (directory id, log end offset, status)}."""
    out = quorum_tool(cp, bootstrap, "describe", "--replication", logs=logs).stdout
    rows = {}
    for line in out.splitlines()[1:]:
        cells = line.split()
        if len(cells) >= 7 and cells[0].isdigit():
            rows[int(cells[0])] = (cells[1], int(cells[2]), cells[-1])
    return rows


def sluice_quorum(bootstrap):
    """`sluice cluster quorum --format json`: {node id: (role, directory id)}."""
    res = subprocess.run([SLUICE_BIN, "cluster", "quorum", "--format", "json", "-b", bootstrap], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    return {r["node"]: (r["role"], r["directory_id"]) for r in json.loads(res.stdout)["replicas"]}


def start_observer(cluster, tmp_path, node_id):
    """A node started with the cluster's voters, not among them."""
    voters = ",".join(f"{i}@127.0.0.1:{port}" for i, port in sorted(cluster.controller_ports.items()))
    controller_port = free_port()
    args = [
        "--node-id", str(node_id),
        "--controller-listen", f"127.0.0.1:{controller_port}",
        "--cluster-voters", voters,
        "--override", f"cluster.rpc_secret_file={cluster.secret_file}",
    ]
    node = Broker(tmp_path / f"node-{node_id}", extra_args=args).start()
    cluster.nodes[node_id] = node
    cluster.controller_ports[node_id] = controller_port
    return node, controller_port


def controller_properties(tmp_path, node_id, node, controller_port):
    """The controller config `add-controller` reads: id, roles, listener, metadata dir."""
    path = tmp_path / f"controller-{node_id}.properties"
    path.write_text(
        f"node.id={node_id}\nprocess.roles=broker,controller\ncontroller.listener.names=CONTROLLER\n"
        f"listeners=CONTROLLER://127.0.0.1:{controller_port}\nmetadata.log.dir={node.data_dir}\n"
    )
    return path


def test_a_voter_is_added_and_the_active_controller_removed_under_load(tmp_path, tools_cp):
    cluster = Cluster(tmp_path).start()
    logs = lambda: "\n".join(n.log()[-2000:] for n in cluster.nodes.values())  # noqa: E731
    producer = None
    try:
        topic = f"quorum-{uuid.uuid4().hex[:8]}"
        create_topic(cluster, topic, PARTITIONS)
        bootstrap = cluster.nodes[1].bootstrap
        first = status(tools_cp, bootstrap, logs)
        assert first["voters"] == [1, 2, 3] and first["observers"] == [], first
        assert first["ClusterId"] and int(first["HighWatermark"]) > 0, first
        producer = LoadProducer(cluster.bootstrap, topic)

        node4, port4 = start_observer(cluster, tmp_path, 4)
        joined = wait_for("node 4 observes the quorum", lambda: (s := status(tools_cp, bootstrap, logs))["observers"] == [4] and s)
        assert joined["voters"] == [1, 2, 3], joined

        config = controller_properties(tmp_path, 4, node4, port4)
        added = quorum_tool(tools_cp, node4.bootstrap, "--command-config", str(config), "add-controller", logs=logs)
        assert "Added controller 4" in added.stdout, added.report()
        now = status(tools_cp, bootstrap, logs)
        assert now["voters"] == [1, 2, 3, 4] and now["observers"] == [], now
        rows = replication(tools_cp, bootstrap, logs)
        assert set(rows) == {1, 2, 3, 4}, rows
        assert rows[4][2] == "Follower" or rows[4][2] == "Leader", rows
        # Sluice's own tool shows the same quorum, directory ids as Kafka's tool prints them.
        ours = sluice_quorum(bootstrap)
        assert {node: directory for node, (_, directory) in ours.items()} == {n: r[0] for n, r in rows.items()}, ours
        assert sorted(role for role, _ in ours.values()) == ["leader", "voter", "voter", "voter"], ours

        leader = int(now["LeaderId"])
        directory = rows[leader][0]
        removed = quorum_tool(tools_cp, bootstrap, "remove-controller", "--controller-id", str(leader),
                              "--controller-directory-id", directory, logs=logs)
        assert re.search(rf"Removed\s+KRaft controller {leader} ", removed.stdout), removed.report()
        after = wait_for("another controller leads",
                         lambda: (s := status(tools_cp, bootstrap, logs))["LeaderId"] != str(leader) and s["observers"] and s)
        assert after["voters"] == sorted({1, 2, 3, 4} - {leader}) and after["observers"] == [leader], after

        # A wrong directory id is refused, and so is adding a voter twice.
        wrong = quorum_tool(tools_cp, bootstrap, "remove-controller", "--controller-id", "4",
                            "--controller-directory-id", "AAAAAAAAAAAAAAAAAAAAAQ", logs=logs, ok=False)
        assert wrong.returncode != 0 and "directory id" in (wrong.stdout + wrong.stderr), wrong.report()
        twice = quorum_tool(tools_cp, node4.bootstrap, "--command-config", str(config), "add-controller", logs=logs,
                            ok=False)
        assert twice.returncode != 0 and "already" in (twice.stdout + twice.stderr), twice.report()

        producer.stop()
        assert producer.failed == [], producer.failed[:5]
        assert len(producer.acked) > 100, len(producer.acked)
        seen = consume_all(cluster.bootstrap, topic, PARTITIONS, len(producer.acked))
        assert {key for _, _, key in seen} >= set(producer.acked), "an acknowledged record is missing"
    finally:
        if producer is not None:
            producer.stop()
        cluster.kill_all()
