"""The nemesis and one bounded run: start a cluster behind the proxy, run the queue workload,
inject faults one after another until the duration is over, heal everything, read the whole
log back and check it.

Faults (each held for `hold_s`, then undone, then the cluster must become healthy again —
every node registered, every partition led, every ISR complete — within `recover_s`):
- `kill`: the leader of a partition is killed with SIGKILL and restarted;
- `pause`: a follower of partition 0 is stopped (SIGSTOP) and continued (SIGCONT);
- `partition`: the leader of partition 0 is cut off from every other node (clients still
  reach it), then the network heals;
- `controller`: the active controller is killed with SIGKILL; while it is down a topic is
  created through a surviving node; then it is restarted;
- `power`: the leader of a partition loses power: SIGKILL and every byte it had not fsynced
  vanishes (its data dir is on a `sluice-lossyfs` mount), then it restarts;
- `power-all`: every node loses power at once, then all restart;
- `eio`: the disk of a partition's leader starts failing every fsync (EIO; data whose fsync
  failed is never persisted): the node must stop by itself (its partitions fail over); then
  the disk heals, the node loses power (its unsynced data vanishes) and restarts.
"""

from __future__ import annotations

import json
import random
import re
import statistics
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from faults.checker import CheckResult, check
from faults.cluster import STABLE_S, FaultCluster
from faults.workload import ConsumerThread, History, ProducerThread, final_read

FAULTS = ("kill", "pause", "partition", "controller")
POWER_FAULTS = ("power", "power-all", "eio")
"""Faults that need every node's data dir on a lossy mount."""
ALL_FAULTS = FAULTS + POWER_FAULTS
ALL_NODES = 0
"""The victim of a fault that strikes every node."""
TOPIC = "queue"
IN_FLIGHT_S = 0.3
"""Answers already on their way when a fault begins (and the metadata poll that notices a
new leader): acknowledgements this close to the fault are not counted as after it."""
TRUNCATION_LINE = re.compile(r"log diverges from leader; truncating")
TAKEOVER_LINE = re.compile(r'^(\S+)Z\s+INFO becoming leader topic="?([^"\s]+)"? partition=(\d+) epoch=(\d+)', re.MULTILINE)


@dataclass
class RunConfig:
    work_dir: Path
    nodes: int = 3
    duration_s: float = 60.0
    faults: tuple = FAULTS
    level: int = 1
    partitions: int = 3
    producers: int = 2
    consumers: int = 1
    rate_per_s: float = 200.0  # per producer
    hold_s: float = 4.0
    settle_s: float = 2.0
    recover_s: float = 45.0
    seed: int = 0
    faults_max: int | None = None  # stop injecting after this many faults (or at duration_s)


@dataclass
class FaultEvent:
    kind: str
    victim: int
    start: float
    led: list  # partitions the victim led when the fault began
    undone: float = 0.0
    healthy: float = 0.0
    observations: dict = field(default_factory=dict)
    failover_s: float | None = None


@dataclass
class Report:
    config: RunConfig
    events: list
    result: CheckResult
    unrecovered: list
    proxied_connections: tuple = (0, 0)  # (all, black-holed)

    def failover_times(self) -> list[float]:
        return [e.failover_s for e in self.events if e.failover_s is not None]

    def table(self) -> str:
        counts: dict[str, int] = {}
        for event in self.events:
            counts[event.kind] = counts.get(event.kind, 0) + 1
        failovers = self.failover_times()
        r = self.result
        rows = [
            ("durability level", str(self.config.level)),
            ("faults injected", ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"),
            ("records acknowledged", str(r.acknowledged)),
            ("acknowledged without an offset", str(r.acknowledged_without_offset)),
            ("records indeterminate (not acked)", str(r.indeterminate)),
            ("records in final log", str(r.final_records)),
            ("records read by consumers", str(r.read_records)),
            ("lost (acked, not in log)", str(len(r.lost))),
            ("misplaced (acked, other offset)", str(len(r.misplaced))),
            ("duplicated", str(len(r.duplicated))),
            ("conflicting offsets", str(len(r.conflicts))),
            ("reordered", str(len(r.reordered))),
            ("polls going backwards", str(len(r.backwards))),
            ("longest unavailability (no ack at all)", f"{r.longest_unavailability_s:.2f} s"),
            ("longest unavailability (one partition)", f"{r.longest_partition_unavailability_s:.2f} s"),
            ("failover median / max", f"{statistics.median(failovers):.2f} s / {max(failovers):.2f} s"
             if failovers else "n/a"),
            ("proxied connections (black-holed)", f"{self.proxied_connections[0]} ({self.proxied_connections[1]})"),
            ("not recovered in time", ", ".join(self.unrecovered) or "none"),
            ("verdict", "valid" if r.valid and not self.unrecovered else f"INVALID: {r.problems()}"),
        ]
        width = max(len(name) for name, _ in rows)
        lines = [f"| {'':{width}} | |", f"|{'-' * (width + 2)}|---|"]
        lines += [f"| {name:{width}} | {value} |" for name, value in rows]
        lines.append("")
        lines.append("| fault | victim | led | failover | healthy after | observations |")
        lines.append("|---|---|---|---|---|---|")
        for e in self.events:
            failover = f"{e.failover_s:.2f} s" if e.failover_s is not None else "-"
            healthy = f"{e.healthy - e.start:.2f} s" if e.healthy else "never"
            lines.append(f"| {e.kind} | {e.victim} | {e.led} | {failover} | {healthy} | {e.observations} |")
        return "\n".join(lines)


class Nemesis:
    def __init__(self, cluster: FaultCluster, config: RunConfig, rng: random.Random, history: History):
        self.cluster = cluster
        self.config = config
        self.rng = rng
        self.history = history
        self.probes = 0

    def leaders(self) -> dict[int, int]:
        md = self.cluster.any_metadata(TOPIC)
        return {p: state.leader for p, state in md.partitions.items()}

    def takeover_time(self, partition: int, after: float, avoid: set[int]) -> float | None:
        """When a node not in `avoid` logged becoming the leader of `partition` after `after`
        (monotonic), from the timestamps of the nodes' logs; None when none did."""
        wall_minus_monotonic = time.time() - time.monotonic()
        times = []
        for node_id, node in self.cluster.nodes.items():
            if node_id in avoid:
                continue
            for match in TAKEOVER_LINE.finditer(node.log_path.read_text(errors="replace")):
                if match.group(2) != TOPIC or int(match.group(3)) != partition:
                    continue
                wall = datetime.fromisoformat(match.group(1)).replace(tzinfo=timezone.utc).timestamp()
                if wall - wall_minus_monotonic > after:
                    times.append(wall - wall_minus_monotonic)
        return min(times, default=None)

    def acks_on(self, partition: int, after: float) -> int:
        with self.history.lock:
            return sum(1 for a in self.history.acks if a.partition == partition and a.time > after)

    def inject(self, kind: str) -> FaultEvent:
        leaders = self.leaders()
        md = self.cluster.any_metadata(TOPIC)
        if kind in ("kill", "power", "eio"):
            victim = leaders[self.rng.randrange(len(leaders))]
        elif kind == "power-all":
            victim = ALL_NODES
        elif kind == "pause":
            victim = self.rng.choice([r for r in md.partitions[0].replicas if r != leaders[0]])
        elif kind == "partition":
            victim = leaders[0]
        elif kind == "controller":
            victim = md.controller_id
        else:
            raise ValueError(f"unknown fault {kind!r}")
        assert victim > 0 or kind == "power-all", f"no victim for {kind}: {md}"
        event = FaultEvent(kind, victim, time.monotonic(),
                           sorted(p for p, l in leaders.items() if l == victim or victim == ALL_NODES))
        if kind == "power-all":
            for node_id in self.cluster.nodes:
                self.cluster.power_loss(node_id)
            return event
        node = self.cluster.nodes[victim]
        if kind == "power":
            self.cluster.power_loss(victim)
        elif kind == "eio":
            self.cluster.mounts[victim].fail_fsync()
        elif kind in ("kill", "controller"):
            self.cluster.kill(victim)
        elif kind == "pause":
            node.pause()
        else:
            event.observations["truncations_before"] = len(TRUNCATION_LINE.findall(node.log_path.read_text()))
            self.cluster.isolate(victim)
        return event

    def observe(self, event: FaultEvent) -> None:
        """What must happen while the fault lasts, recorded (asserted by the tests)."""
        others = {event.victim}
        deadline = event.start + self.config.hold_s
        if event.kind == "controller":
            try:
                self.cluster.wait_for("a new active controller", lambda: self.cluster.any_metadata(
                    None, avoid=others).controller_id not in (-1, event.victim), self.config.hold_s + 10)
                event.observations["new_controller_s"] = round(time.monotonic() - event.start, 2)
                self.probes += 1
                self.cluster.create_topic(f"probe-{self.probes}", 1, 2, {"min.insync.replicas": "1"})
                event.observations["topic_created"] = True
            except AssertionError as error:
                event.observations["topic_created"] = False
                event.observations["error"] = str(error)[:200]
        if event.kind == "eio":
            try:
                self.cluster.wait_for("the node with the failing disk to stop",
                                      lambda: not self.cluster.nodes[event.victim].is_running(), self.config.hold_s + 10)
                event.observations["stopped_s"] = round(time.monotonic() - event.start, 2)
                event.observations["exit_code"] = self.cluster.nodes[event.victim].proc.returncode
            except AssertionError:
                event.observations["stopped_s"] = None
        if event.kind == "pause":
            def left():
                return event.victim not in self.cluster.any_metadata(TOPIC, avoid=others).partitions[0].isr
            try:
                self.cluster.wait_for("the paused follower leaves the ISR", left, self.config.hold_s + 10)
                event.observations["left_isr_s"] = round(time.monotonic() - event.start, 2)
            except AssertionError:
                event.observations["left_isr_s"] = None
        if event.kind == "partition":
            def moved():
                md = self.cluster.any_metadata(TOPIC, avoid=others)
                return all(md.partitions[p].leader not in (-1, event.victim) for p in event.led)
            try:
                self.cluster.wait_for("a leader on the majority side", moved, self.config.hold_s + 10)
                seen = time.monotonic()
                event.observations["majority_leader_s"] = round(seen - event.start, 2)
                # Between the cut (plus answers already on their way) and the new leader taking
                # over, the isolated leader cannot advance its high watermark: at levels 1 and 2
                # it must acknowledge nothing on the partitions it led. The takeover time comes
                # from the new leader's log: the metadata poll above can see it late on a busy
                # host, after the new leader's own acknowledgements began.
                minority_acks = 0
                for partition in event.led:
                    took_over = min(self.takeover_time(partition, event.start, others) or seen, seen)
                    event.observations[f"took_over_s[{partition}]"] = round(took_over - event.start, 2)
                    window = (event.start + IN_FLIGHT_S, took_over - IN_FLIGHT_S)
                    with self.history.lock:
                        minority_acks += sum(1 for a in self.history.acks
                                             if a.partition == partition and window[0] < a.time < window[1])
                event.observations["minority_acks"] = minority_acks
            except AssertionError:
                event.observations["majority_leader_s"] = None
        time.sleep(max(0.0, deadline - time.monotonic()))
        if event.kind in ("pause", "partition"):
            # Writes go on while a follower is paused or the leader is isolated.
            event.observations["acks_during"] = self.acks_on(0, event.start + 0.5)

    def undo(self, event: FaultEvent) -> None:
        if event.kind == "power-all":
            for node_id in self.cluster.nodes:
                self.cluster.restart(node_id)
            event.undone = time.monotonic()
            return
        node = self.cluster.nodes[event.victim]
        if event.kind == "eio":
            self.cluster.mounts[event.victim].heal()
            self.cluster.power_loss(event.victim)
        if event.kind in ("kill", "controller", "power", "eio"):
            self.cluster.restart(event.victim)
        elif event.kind == "pause":
            node.resume()
        else:
            self.cluster.heal()
        event.undone = time.monotonic()

    def recover(self, event: FaultEvent) -> bool:
        try:
            self.cluster.wait_stably_healthy(TOPIC, self.config.partitions, self.config.recover_s)
        except AssertionError:
            return False
        event.healthy = time.monotonic() - STABLE_S
        if event.kind == "partition":
            log = self.cluster.nodes[event.victim].log_path.read_text()
            before = event.observations.pop("truncations_before")
            event.observations["truncations"] = len(TRUNCATION_LINE.findall(log)) - before
        if event.kind in ("pause", "partition"):
            isr = self.cluster.any_metadata(TOPIC).partitions[0].isr
            event.observations["rejoined_isr"] = event.victim in isr
        return True


def failover(event: FaultEvent, history: History) -> float | None:
    """Time from the fault to the first acknowledgement on every partition the victim led
    (answers that were already on their way when the fault began do not count)."""
    if not event.led:
        return None
    firsts = []
    for partition in event.led:
        times = [a.time for a in history.acks if a.partition == partition and a.time > event.start + IN_FLIGHT_S]
        if not times:
            return None
        firsts.append(min(times) - event.start)
    return max(firsts)


def save_history(path: Path, history: History, final: dict, events: list) -> None:
    """The raw history next to the node logs, for a post-mortem (times are monotonic; the
    `wall_minus_monotonic` offset converts them to the nodes' log timestamps)."""
    with history.lock:
        document = {
            "wall_minus_monotonic": time.time() - time.monotonic(),
            "acks": [[a.time, a.partition, a.offset, a.value] for a in history.acks],
            "failed": history.failed,
            "reads": [[r.consumer, r.partition, r.offset, r.value] for r in history.reads],
            "final": {str(p): records for p, records in final.items()},
            "events": [[e.kind, e.victim, e.start, e.led, e.observations] for e in events],
        }
    path.write_text(json.dumps(document))


def run(config: RunConfig, log=print) -> Report:
    """One bounded run; always stops every process it started."""
    rng = random.Random(config.seed)
    lossy = any(kind in POWER_FAULTS for kind in config.faults)
    cluster = FaultCluster(config.work_dir, config.nodes, lossy=lossy)
    history = History()
    events: list[FaultEvent] = []
    unrecovered: list[str] = []
    producers: list[ProducerThread] = []
    consumers: list[ConsumerThread] = []
    try:
        cluster.start()
        cluster.create_topic(TOPIC, config.partitions, 3, {
            "min.insync.replicas": "2", "sluice.durability.level": str(config.level)})
        cluster.wait_stably_healthy(TOPIC, config.partitions, 30)
        producers = [ProducerThread(i, cluster.bootstrap, TOPIC, config.partitions, config.rate_per_s, history)
                     for i in range(config.producers)]
        consumers = [ConsumerThread(i, cluster.bootstrap, TOPIC, config.partitions, history)
                     for i in range(config.consumers)]
        for thread in producers + consumers:
            thread.start()
        nemesis = Nemesis(cluster, config, rng, history)
        time.sleep(config.settle_s)
        window_start = time.monotonic()
        end = window_start + config.duration_s
        index = 0
        while time.monotonic() < end and (config.faults_max is None or index < config.faults_max):
            kind = config.faults[index % len(config.faults)]
            index += 1
            event = nemesis.inject(kind)
            events.append(event)
            log(f"[faults] {kind} node {event.victim} (led {event.led})")
            try:
                nemesis.observe(event)
            finally:
                nemesis.undo(event)
            if not nemesis.recover(event):
                unrecovered.append(f"{kind} node {event.victim}")
                log(f"[faults] cluster not healthy {config.recover_s}s after {kind}; stopping the nemesis")
                break
            log(f"[faults] healthy {event.healthy - event.start:.1f}s after {kind}: {event.observations}")
            time.sleep(config.settle_s)
        window_end = time.monotonic()
        for thread in producers:
            thread.stop()
        for thread in producers:
            thread.join(timeout=90)
        time.sleep(1.0)
        for thread in consumers:
            thread.stop()
            thread.join(timeout=30)
        final = final_read(cluster.bootstrap, TOPIC, config.partitions)
        save_history(config.work_dir / "history.json", history, final, events)
        result = check(history, final, (window_start, window_end))
        for event in events:
            event.failover_s = failover(event, history)
        proxied = (cluster.proxy.connections_total, cluster.proxy.connections_blackholed)
        return Report(config, events, result, unrecovered, proxied)
    finally:
        for thread in producers + consumers:
            thread.stop()
        cluster.stop()
