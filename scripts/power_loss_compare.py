#!/usr/bin/env python3
"""Power loss, Sluice against Apache Kafka 4.3.1, single node, each broker's data dir on its
own `sluice-lossyfs` mount (unsynced writes vanish at a power cut). Per configuration and
round: a fresh idempotent acks=all producer writes numbered records for a random 1-3 s, the
broker is killed with SIGKILL mid-stream, every unsynced byte is dropped, the broker
restarts, and the log is read back: an acknowledged record is lost if its acknowledged
offset no longer holds it. Prints one table row per configuration.

    .venv/bin/python scripts/power_loss_compare.py [--rounds 5] [--configs sluice-1,sluice-2,kafka-default,kafka-flush-1]

Needs root and /dev/fuse (as the power-loss tests), target/release/sluice and
target/release/sluice-lossyfs (cargo build --release -p sluice-cli -p sluice-lossyfs), the
Kafka jars in tests/kafka-tools/lib (installed with Maven on first use), and the test venv
(confluent-kafka).

Caveat: `sluice-lossyfs` has no background writeback, so data the kernel would have written
back within ~30 s (vm.dirty_expire_centisecs) is lost too: a page-cache configuration loses
what it acknowledged since its last fsync, which on a real machine is bounded by writeback.
"""

import argparse
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "python"))

from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from conftest import Broker, free_port  # noqa: E402
from kafka_wire import consume_until, watermarks  # noqa: E402
from lossyfs import LossyMount  # noqa: E402
from numbered import PARTITIONS, NumberedProducer  # noqa: E402
from producer_perf_compare import LIB, ensure_jars, java, wait_port  # noqa: E402

TOPIC = "power"
CONFIGS = {
    "sluice-1": ("sluice", {"sluice.durability.level": "1"}),
    "sluice-2": ("sluice", {"sluice.durability.level": "2"}),
    "kafka-default": ("kafka", {}),
    "kafka-flush-1": ("kafka", {"flush.messages": "1"}),
}


class KafkaNode:
    """Single-node KRaft Kafka whose log dir is `data_dir` (restartable, like conftest.Broker)."""

    def __init__(self, data_dir: Path, work: Path):
        self.port, self.controller = free_port(), free_port()
        self.work = work
        self.props = work / "server.properties"
        self.props.write_text("\n".join([
            "process.roles=broker,controller", "node.id=1", f"controller.quorum.voters=1@127.0.0.1:{self.controller}",
            f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}", "controller.listener.names=CONTROLLER",
            f"log.dirs={data_dir}", "offsets.topic.replication.factor=1", "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1", "share.coordinator.state.topic.replication.factor=1",
            "group.initial.rebalance.delay.ms=0", ""]))
        cluster_id = java("kafka.tools.StorageTool", "random-uuid").stdout.strip().splitlines()[-1]
        formatted = java("kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(self.props))
        assert formatted.returncode == 0, formatted.stderr
        self.proc = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self):
        log = open(self.work / "kafka.log", "a")
        self.proc = subprocess.Popen(["java", "-Xms1g", "-Xmx1g", "-XX:+UseG1GC", "-cp", f"{LIB}/*", "kafka.Kafka",
                                      str(self.props)], stdout=log, stderr=subprocess.STDOUT)
        wait_port(self.port, self.proc)
        return self

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def create_topic(admin: AdminClient, config: dict[str, str]) -> None:
    """Creates TOPIC, retrying while a deletion of the same name is still under way."""
    deadline = time.monotonic() + 60
    while True:
        try:
            admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1, config=config)])[TOPIC].result(30)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    time.sleep(1.0)


def present(bootstrap: str) -> dict[int, tuple[int, int]]:
    """Record number -> (partition, offset) of everything readable."""
    ends = {p: watermarks(bootstrap, TOPIC, p, timeout=60)[1] for p in range(PARTITIONS)}
    read = consume_until(bootstrap, TOPIC, ends, timeout=120)
    return {int(m.key()): (p, m.offset()) for p, msgs in read.items() for m in msgs}


def run_config(name: str, rounds: int, rng: random.Random) -> tuple[int, int, list[int]]:
    system, topic_config = CONFIGS[name]
    root = Path(tempfile.mkdtemp(prefix=f"power-{name}-"))
    mount = LossyMount(root / "fs", page_cache=system == "kafka").start()
    data_dir = mount.mount / "data"
    if system == "kafka":
        data_dir.mkdir()
        broker = KafkaNode(data_dir, root)
        mount.sync()  # Kafka's StorageTool does not fsync what it formats.
    else:
        broker = Broker(data_dir, log_dir=root)
    acked_total, lost_per_round = 0, []
    try:
        broker.start()
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        create_topic(admin, topic_config)
        for _ in range(rounds):
            producer = NumberedProducer(broker.bootstrap, TOPIC)
            producer.start()
            time.sleep(rng.uniform(1.0, 3.0))
            acked = producer.snapshot()
            broker.kill()
            mount.power_loss()
            producer.stop(flush_timeout=0)
            broker.start()
            survivors = present(broker.bootstrap)
            lost = sum(1 for n, at in acked.items() if survivors.get(n) != at)
            acked_total += len(acked)
            lost_per_round.append(lost)
            print(f"  {name}: acknowledged {len(acked)}, lost {lost}", flush=True)
            # The next round starts from an empty topic, so that records numbered alike do not mix.
            admin.delete_topics([TOPIC])[TOPIC].result(60)
            create_topic(admin, topic_config)
    finally:
        broker.kill()
        mount.stop()
    return acked_total, sum(lost_per_round), lost_per_round


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    names = [c for c in args.configs.split(",") if c]
    if any(CONFIGS[n][0] == "kafka" for n in names):
        ensure_jars()
    rng = random.Random(args.seed)
    rows = []
    for name in names:
        acked, lost, per_round = run_config(name, args.rounds, rng)
        rows.append(f"| {name} | {args.rounds} | {acked} | {lost} ({100 * lost / max(acked, 1):.1f}%) | {per_round} |")
    print("| configuration | power losses | acknowledged | lost | lost per round |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
