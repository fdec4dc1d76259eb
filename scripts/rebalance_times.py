#!/usr/bin/env python3
"""Rebalance time of a 12-partition group going 3 -> 2 -> 3 members, classic protocol
(eager range, the Java client's default, and cooperative-sticky) against the consumer
protocol (KIP-848, uniform assignor), with the Java client (kafka-clients 4.3.1).

Each member is a GroupMember JVM (tests/java). A producer writes to every partition all
along. A step's time runs from the change (the command that closes a member, whose close
sends the leave; or the new member's subscribe) until every member has its final
assignment and has consumed a record from each partition it newly got.

    .venv/bin/python scripts/rebalance_times.py [--rounds 3] [--fast]

Without --fast both protocols run with Kafka's default timings (classic: the client's
heartbeat.interval.ms 3000; consumer: the broker's group.consumer.heartbeat.interval.ms
5000); --fast sets both heartbeat intervals to 500 ms. Needs SLUICE_BIN (or a release
build), Maven and a JDK (the tests' java_support builds the programs).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))

from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from conftest import Broker  # noqa: E402
from java_support import JavaProcess, java_test_classpath  # noqa: E402

PARTITIONS = 12
STEP_TIMEOUT_S = 120.0
FAST_HEARTBEAT_MS = 500

VARIANTS = {
    "classic (range, eager)": ("classic", ""),
    "classic (cooperative-sticky)": (
        "classic", "partition.assignment.strategy=org.apache.kafka.clients.consumer.CooperativeStickyAssignor"),
    "consumer (KIP-848, uniform)": ("consumer", ""),
}


class Member:
    def __init__(self, cp, bootstrap, group, topic, protocol, props):
        args = ["--bootstrap", bootstrap, "--group", group, "--topic", topic, "--protocol", protocol]
        if props:
            args += ["--props", props]
        self.proc = JavaProcess(cp, "sluice.tests.GroupMember", args, stdin=True)

    def events(self, kind):
        out = []
        for _, line in list(self.proc.lines):
            fields = line.split()
            if fields and fields[0] == kind:
                rest = fields[2] if len(fields) > 2 else ""
                out.append((int(fields[1]) / 1000, rest))
        return out

    def assignment(self):
        assigned = self.events("ASSIGNED")
        if not assigned:
            return None, set()
        at, parts = assigned[-1]
        return at, {int(p) for p in parts.split(",") if p}

    def first_record_after(self, partition, since):
        return next((t for t, p in self.events("FIRST") if int(p) == partition and t >= since), None)


def settled_at(members, since, shares):
    """When every member had its final share and consumed each newly assigned partition."""
    owned = [m.assignment() for m in members]
    if sorted(len(parts) for _, parts in owned) != shares:
        return None
    if sorted(p for _, parts in owned for p in parts) != list(range(PARTITIONS)):
        return None
    done = since
    for member, (assigned_at, parts) in zip(members, owned):
        done = max(done, assigned_at)
        before = {p for t, ps in member.events("ASSIGNED") if t < since for p in ps.split(",") if p}
        for partition in parts - {int(p) for p in before}:
            first = member.first_record_after(partition, since)
            if first is None:
                return None
            done = max(done, first)
    return done


def wait_settled(members, since, shares):
    deadline = time.monotonic() + STEP_TIMEOUT_S
    while time.monotonic() < deadline:
        done = settled_at(members, since, shares)
        if done is not None:
            time.sleep(0.5)  # must still hold: nothing moves afterwards
            if settled_at(members, since, shares) is not None:
                return done - since
        time.sleep(0.05)
    raise RuntimeError(f"group did not settle on {shares}: {[m.assignment()[1] for m in members]}")


def keep_producing(bootstrap, topic, stop):
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    while not stop.is_set():
        for partition in range(PARTITIONS):
            producer.produce(topic, value=b"x", partition=partition)
        producer.poll(0)
        time.sleep(0.02)
    producer.flush(10)


def measure(cp, bootstrap, name, protocol, props, round_no):
    group, topic = f"rebalance-{protocol}-{abs(hash(name))}-{round_no}", "rebalance"
    members = [Member(cp, bootstrap, group, topic, protocol, props) for _ in range(3)]
    try:
        wait_settled(members, 0, [4, 4, 4])
        leaving = members.pop(0)
        since = time.time()
        leaving.proc.send("close")
        down = wait_settled(members, since, [6, 6])
        leaving.proc.wait(30)
        newcomer = Member(cp, bootstrap, group, topic, protocol, props)
        members.append(newcomer)
        deadline = time.monotonic() + 60
        while not newcomer.events("STARTED"):
            if time.monotonic() > deadline:
                raise RuntimeError("newcomer never started")
            time.sleep(0.02)
        since = newcomer.events("STARTED")[0][0]
        up = wait_settled(members, since, [4, 4, 4])
        return down, up
    finally:
        for m in members:
            m.proc.kill()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fast", action="store_true", help="500 ms heartbeat intervals for both protocols")
    args = parser.parse_args()
    cp = java_test_classpath()
    broker_args = ["--group-initial-rebalance-delay-ms", "0"]
    if args.fast:
        broker_args += ["--group-consumer-heartbeat-interval-ms", str(FAST_HEARTBEAT_MS)]
    with tempfile.TemporaryDirectory(prefix="sluice-rebalance-") as tmp:
        broker = Broker(Path(tmp) / "data", extra_args=broker_args).start()
        stop = threading.Event()
        try:
            admin = AdminClient({"bootstrap.servers": broker.bootstrap})  # must outlive the future
            admin.create_topics([NewTopic("rebalance", PARTITIONS, 1)])["rebalance"].result(30)
            producer = threading.Thread(target=keep_producing, args=(broker.bootstrap, "rebalance", stop))
            producer.start()
            results = {}
            for name, (protocol, props) in VARIANTS.items():
                if args.fast and protocol == "classic":
                    props = ";".join(p for p in [props, f"heartbeat.interval.ms={FAST_HEARTBEAT_MS}"] if p)
                results[name] = [measure(cp, broker.bootstrap, name, protocol, props, r) for r in range(args.rounds)]
                print(f"{name}: " + ", ".join(f"3->2 {d:.2f}s / 2->3 {u:.2f}s" for d, u in results[name]), flush=True)
        finally:
            stop.set()
            broker.stop()
    timing = "500 ms heartbeats" if args.fast else "default heartbeats (classic 3 s, consumer 5 s)"
    print(f"\nmedian of {args.rounds} rounds, {timing}:")
    print("| protocol | 3 -> 2 members | 2 -> 3 members |")
    print("|---|---|---|")
    for name, runs in results.items():
        print(f"| {name} | {statistics.median(d for d, _ in runs):.2f} s | {statistics.median(u for _, u in runs):.2f} s |")


if __name__ == "__main__":
    main()
