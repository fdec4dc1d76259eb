"""Power loss, hunting: many power cuts at random moments of a random workload, on the
strictest model `sluice-lossyfs` has, instead of one scenario replayed.

The broker's data dir sits on `sluice-lossyfs` (tests/python/lossyfs.py) with directory
entries that are lost unless their directory was fsynced, in two ways of opening files: the
kernel's direct path (every write reaches the filesystem as it is made) and the page-cache
path with direct writes split as a multi-threaded FUSE daemon (LazyFS) may apply them.

Each cycle runs a random workload and cuts the power at a random moment of it:
- producers (idempotent, acks=all) into topics of random partition counts, record sizes and
  batch sizes, most with small segments so that segments roll all the time, and WAL files of
  1 or 4 MiB, so that the WAL rotates, recycles its spare and checkpoints all the time;
- one topic with a small `retention.bytes`, so retention deletes segments under load;
- one compacted topic, so the cleaner rewrites segments under load;
- topics deleted and created (names reused) while records flow, the cut sometimes landing
  during the operation.

After every restart: the broker is back within `RESTART_LIMIT_S`; every acknowledged record
is read back at its offset, exactly once, with nothing that was never sent and nothing of a
deleted topic of the same name (retention: at or above the log start; compacted: each key
has a record at or after its latest acknowledged one); a topic whose deletion was answered
stays deleted and one whose creation was answered exists. The broker's log never reports
WAL records after a hole.

`SLUICE_POWER_HUNT_SEED` replays a run (its seed is printed); the default tier makes
`HUNT_CUTS_DEFAULT` cuts per mount mode, or as many as fit in `HUNT_BUDGET_S` (at least
`HUNT_CUTS_MIN`: a random workload's cuts take from half a minute to eight minutes in all on
a 2-core host), the slow tier (`SLUICE_SLOW_TESTS=1`) `HUNT_CUTS_SLOW` and
`SLUICE_POWER_HUNT_CUTS` that many, with no time budget.
"""

import os
import random
import shutil
import threading
import time
import uuid
from dataclasses import dataclass, field

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic

from conftest import Broker
from kafka_wire import admin_client, consume_until, watermarks
from lossyfs import LossyMount
from power_loss_diagnostics import describe_dir

HUNT_CUTS_DEFAULT = 8
HUNT_CUTS_MIN = 3
HUNT_BUDGET_S = 150.0
HUNT_CUTS_SLOW = 120
SLOW = os.environ.get("SLUICE_SLOW_TESTS") == "1"
CUTS = int(os.environ.get("SLUICE_POWER_HUNT_CUTS", HUNT_CUTS_SLOW if SLOW else HUNT_CUTS_DEFAULT))
BUDGETED = not SLOW and "SLUICE_POWER_HUNT_CUTS" not in os.environ
# A restart after a power cut (recovery and WAL replay of a few MiB) is back within this: it
# takes 0.1-0.5 s on an idle 2-core host, and up to 15 s on one busy with both test
# workers, every read and fsync going through the FUSE daemon. The limit catches a restart
# that hangs or rescans everything, not a slow host.
RESTART_LIMIT_S = 30.0
UPKEEP_MS = 100
LIVE_TOPICS_MAX = 4
RETENTION_BYTES = 256 * 1024
# Reading every topic back through the FUSE daemon: up to a minute or two on a busy host for
# the heaviest random workloads (a hundred MiB and more).
READ_TIMEOUT_S = 240.0
WAL_FILE_BYTES_CHOICES = (1024 * 1024, 4 * 1024 * 1024)
# Producers pause PACE_SLEEP_S on average every PACE_RECORDS records (~500 records/s each):
# every check reads every topic from its start, through the FUSE daemon.
PACE_RECORDS = 10
PACE_SLEEP_S = 0.02
PAUSE_FLUSH_S = 60.0
# A paused producer waits this long for the answers to what it sent (retried across a restart
# through the FUSE daemon) before the check fails.
PAUSE_WAIT_S = 240.0
WAL_HOLE_LINE = "WAL file holds records of its own after bytes that are not one"


@dataclass
class Incarnation:
    """One life of a topic name: what was sent to it and what the broker acknowledged."""
    name: str
    tag: str
    partitions: int
    kind: str  # "plain", "retention" or "compacted"
    acked: dict = field(default_factory=dict)  # (partition, offset) -> (key, value)
    lock: threading.Lock = field(default_factory=threading.Lock)
    failures: list = field(default_factory=list)


class TopicProducer:
    """Sends records to one incarnation from its own thread, at a random pace and size."""

    def __init__(self, bootstrap: str, topic: Incarnation, rng: random.Random):
        self.topic = topic
        self.rng = random.Random(rng.random())
        self.value_bytes = self.rng.choice([16, 200, 1000, 4000])
        self.keys = self.rng.choice([20, 500])
        self.producer = Producer({
            "bootstrap.servers": bootstrap, "broker.address.family": "v4",
            "enable.idempotence": True, "acks": "all",
            "linger.ms": self.rng.choice([0, 2, 10]),
            "batch.num.messages": self.rng.choice([1, 50, 1000]),
            # Long: a record librdkafka times out while its request is in flight may be stored
            # all the same, and after a timeout it bumps its epoch and sends what it still
            # holds under new sequence numbers, which no broker can tell from new records.
            # The checks read every topic through the FUSE daemon, for minutes on a busy host.
            "message.timeout.ms": 600_000, "retry.backoff.ms": 20, "retry.backoff.max.ms": 200,
            "reconnect.backoff.ms": 20, "reconnect.backoff.max.ms": 200,
        })
        self.stop = threading.Event()
        self.paused = threading.Event()
        self.idle = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"hunt-{topic.name}")
        self.thread.start()

    def _on_delivery(self, err, msg):
        with self.topic.lock:
            if err is None:
                self.topic.acked[(msg.partition(), msg.offset())] = (msg.key(), msg.value())
            elif err.fatal():
                self.topic.failures.append(err)

    def _run(self):
        n = 0
        pad = bytes(range(256)) * (self.value_bytes // 256 + 1)
        while not self.stop.is_set():
            if self.paused.is_set():
                # Idle only once every record sent has its answer: a check reads a log that
                # does not grow.
                if self.producer.flush(PAUSE_FLUSH_S) == 0:
                    self.idle.set()
                time.sleep(0.01)
                continue
            self.idle.clear()
            value = f"{self.topic.tag}:{n}:".encode() + pad[: self.value_bytes]
            key = f"k{n % self.keys}".encode()
            try:
                self.producer.produce(self.topic.name, partition=n % self.topic.partitions, key=key, value=value,
                                      on_delivery=self._on_delivery)
            except BufferError:
                self.producer.poll(0.05)
                continue
            n += 1
            self.producer.poll(0)
            if n % PACE_RECORDS == 0:
                time.sleep(self.rng.uniform(0.0, 2 * PACE_SLEEP_S))

    def pause(self) -> None:
        """Stops sending and waits for the answers to what was sent: a check then reads a
        log that neither grows nor is cleaned under it."""
        self.idle.clear()
        self.paused.set()
        assert self.idle.wait(PAUSE_WAIT_S), \
            f"{self.topic.name}: {len(self.producer)} records still unanswered {PAUSE_WAIT_S:.0f} s after the pause"

    def resume(self) -> None:
        self.paused.clear()

    def close(self, wait_s: float) -> None:
        self.stop.set()
        self.thread.join(10)
        if wait_s == 0:
            self.producer.purge()
        self.producer.flush(wait_s)


class Hunt:
    def __init__(self, broker: Broker, mount: LossyMount, rng: random.Random):
        self.broker, self.mount, self.rng = broker, mount, rng
        self.live: dict[str, tuple[Incarnation, TopicProducer]] = {}
        self.deleted: set[str] = set()  # names whose deletion was answered
        self.names = [f"hunt-{i}" for i in range(LIVE_TOPICS_MAX + 2)]
        self.cut_log: list[str] = []
        self.left_by_cut = mount.backing.parent / "left-by-last-cut"

    def create(self, name: str, kind: str) -> None:
        partitions = self.rng.choice([1, 3, 8, 16])
        config = {"segment.bytes": str(self.rng.choice([16 * 1024, 256 * 1024, 8 * 1024 * 1024]))}
        if kind == "retention":
            config.update({"retention.bytes": str(RETENTION_BYTES), "segment.bytes": str(32 * 1024)})
        if kind == "compacted":
            config.update({"cleanup.policy": "compact", "segment.bytes": str(64 * 1024),
                           "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "1000"})
        admin = admin_client(self.broker.bootstrap)
        fs = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1, config=config)],
                                 operation_timeout=30)
        fs[name].result(30)
        topic = Incarnation(name, uuid.uuid4().hex[:8], partitions, kind)
        self.deleted.discard(name)
        self.live[name] = (topic, TopicProducer(self.broker.bootstrap, topic, self.rng))

    def delete(self, name: str) -> None:
        _, producer = self.live.pop(name)
        producer.close(0)
        admin = admin_client(self.broker.bootstrap)
        admin.delete_topics([name], operation_timeout=30)[name].result(30)
        self.deleted.add(name)

    def start(self) -> None:
        self.create(self.names[0], "retention")
        self.create(self.names[1], "compacted")
        self.create(self.names[2], "plain")

    def change_topics(self) -> threading.Thread | None:
        """Maybe deletes or creates a topic, in a thread the cut may interrupt."""
        choice = self.rng.random()
        plain = [n for n, (t, _) in self.live.items() if t.kind == "plain"]
        if choice < 0.25 and plain:
            name = self.rng.choice(plain)
            target = lambda: self.delete(name)  # noqa: E731
        elif choice < 0.5 and len(self.live) < LIVE_TOPICS_MAX:
            name = self.rng.choice([n for n in self.names if n not in self.live])
            target = lambda: self.create(name, "plain")  # noqa: E731
        else:
            return None
        errors: list = []

        def run():
            try:
                target()
            except Exception as error:  # the cut lands during the operation: not answered
                errors.append(error)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def cut(self, index: int) -> None:
        change = self.change_topics()
        delay = self.rng.uniform(0.0, 0.3) if self.rng.random() < 0.3 else self.rng.uniform(0.3, 2.0)
        time.sleep(delay)
        self.broker.kill()
        self.mount.power_loss()
        # What the cut left, before the restart's recovery and WAL replay change it: a
        # failed check describes it next to what the restarted broker made of it.
        shutil.rmtree(self.left_by_cut, ignore_errors=True)
        shutil.copytree(self.mount.backing / "data" / "logs", self.left_by_cut, symlinks=True)
        started = time.monotonic()
        self.broker.start()
        restart_s = time.monotonic() - started
        # Joined once the broker is back: a topic operation the cut interrupted ends when its
        # client sees the new broker, not after its own timeout against a dead one.
        if change is not None:
            change.join(40)
        self.cut_log.append(f"{index}:{delay:.2f}s/{restart_s:.2f}s")
        assert restart_s < RESTART_LIMIT_S, f"cut {index}: restart took {restart_s:.1f} s"
        assert WAL_HOLE_LINE not in self.broker.log(), f"cut {index}: the WAL has a hole"

    def verify(self, when: str) -> int:
        """Checks every incarnation, its producer paused; returns how many acknowledged
        records it checked."""
        for _, producer in self.live.values():
            producer.pause()
        try:
            return self._verify(when)
        finally:
            for _, producer in self.live.values():
                producer.resume()

    def _verify(self, when: str) -> int:
        checked = 0
        existing = set(admin_client(self.broker.bootstrap).list_topics(timeout=30).topics)
        for name in self.deleted:
            assert name not in existing, f"{when}: {name} was deleted and is back"
        for name, (topic, _) in list(self.live.items()):
            assert name in existing, f"{when}: {name} was created and is gone"
            with topic.lock:
                acked = dict(topic.acked)
                assert not topic.failures, f"{when}: {name}: producer fatal errors {topic.failures[:3]}"
            checked += check_topic(self.broker.bootstrap, topic, acked, when, self.explain)
        return checked

    def explain(self, topic: str, partition: int) -> str:
        name = f"{topic}-{partition}"
        return (f"--- {name} after the restart ---\n{describe_dir(self.mount.mount / 'data' / 'logs', name)}\n"
                f"--- {name} as the cut left it ---\n{describe_dir(self.left_by_cut, name)}")

    def close(self) -> None:
        for _, producer in self.live.values():
            producer.close(0)


def check_topic(bootstrap: str, topic: Incarnation, acked: dict, when: str, explain=None) -> int:
    ends = {}
    starts = {}
    for p in range(topic.partitions):
        starts[p], ends[p] = watermarks(bootstrap, topic.name, p, timeout=30)
    for (p, offset) in acked:
        assert offset < ends[p], f"{when}: {topic.name}[{p}] ends at {ends[p]}, offset {offset} was acknowledged"
    read = consume_until(bootstrap, topic.name, ends, start_offsets=starts, timeout=READ_TIMEOUT_S)
    found = {(p, m.offset()): (m.key(), m.value()) for p, msgs in read.items() for m in msgs}
    # Every value this incarnation's producer sends starts with its tag (CRCs vouch for
    # the rest).
    tag = topic.tag.encode() + b":"
    foreign = [v for v in found.values() if v[1] is None or not v[1].startswith(tag)]
    assert not foreign, f"{when}: {topic.name}: records never sent to this topic, e.g. {foreign[0][1]!r:.60}"
    if topic.kind == "compacted":
        latest: dict[tuple[int, bytes], int] = {}
        for (p, offset), (key, _) in acked.items():
            latest[(p, key)] = max(latest.get((p, key), -1), offset)
        present = {}
        for (p, offset), (key, _) in found.items():
            present[(p, key)] = max(present.get((p, key), -1), offset)
        missing = [k for k, offset in latest.items() if present.get(k, -1) < offset]
        # A record written after `ends` was read could supersede an acknowledged one, and the
        # cleaner then rightly removes it: the check stands only on a log that did not grow.
        grown = {p: end for p in range(topic.partitions)
                 if (end := watermarks(bootstrap, topic.name, p, timeout=30)[1]) != ends[p]}
        assert not grown, f"{when}: {topic.name}: the log grew while it was checked: ends {ends}, then {grown}"
        if missing and explain is not None:
            details = []
            for p in sorted({p for p, _ in missing})[:2]:
                acked_tail = sorted((o, k) for (q, o), (k, _) in acked.items() if q == p)[-12:]
                found_tail = sorted((o, k) for (q, o), (k, _) in found.items() if q == p)[-12:]
                details.append(f"[{p}] acknowledged (offset, key), last 12: {acked_tail}\n"
                               f"[{p}] read, last 12: {found_tail}\n{explain(topic.name, p)}")
            print("\n".join(details))
        assert not missing, (f"{when}: {topic.name}: keys without their latest acknowledged value "
                             f"(latest acknowledged, latest read): "
                             f"{[(k, latest[k], present.get(k, -1)) for k in missing[:5]]}")
        return len(latest)
    if topic.kind == "retention":
        # Retention may move the log start while the records are read (the read then
        # resumes at the new start): only what is still above it must be there.
        for p in range(topic.partitions):
            starts[p] = max(starts[p], watermarks(bootstrap, topic.name, p, timeout=30)[0])
    lost = [(p, o) for (p, o), record in acked.items() if o >= starts[p] and found.get((p, o)) != record]
    assert not lost, f"{when}: {topic.name}: {len(lost)} acknowledged records lost or changed, e.g. {sorted(lost)[:5]}"
    values = [v for _, v in found.values()]
    assert len(values) == len(set(values)), f"{when}: {topic.name}: a record is in the log twice"
    return sum(1 for (p, o) in acked if o >= starts[p])


MODES = {
    "direct-path": dict(strict_dirs=True),
    "page-cache-split-direct": dict(strict_dirs=True, page_cache=True, split_direct_writes=True),
}


@pytest.mark.parametrize("mode", list(MODES))
def test_power_cuts_at_random_moments_lose_nothing_acknowledged(tmp_path, mode):
    seed = int(os.environ.get("SLUICE_POWER_HUNT_SEED", random.randrange(1 << 32)))
    print(f"power-loss hunt: mode {mode}, seed {seed} (SLUICE_POWER_HUNT_SEED={seed} replays it), {CUTS} cuts")
    rng = random.Random(seed)
    mount = LossyMount(tmp_path / "fs", **MODES[mode]).start()
    # Small WAL files: rotations, spares, recycling and checkpoints every second or so.
    wal_file_bytes = rng.choice(WAL_FILE_BYTES_CHOICES)
    broker = Broker(mount.mount / "data", log_dir=tmp_path,
                    extra_args=["--log-retention-check-interval-ms", str(UPKEEP_MS),
                                "--log-wal-file-bytes", str(wal_file_bytes),
                                # A deleted topic's producer must not bring it back.
                                "--auto-create-topics", "false",
                                "--override", "log.cleaner.backoff.ms=100"])
    hunt = Hunt(broker, mount, rng)
    try:
        broker.start()
        hunt.start()
        checked = 0
        started = time.monotonic()
        for index in range(CUTS):
            if BUDGETED and index >= HUNT_CUTS_MIN and time.monotonic() - started > HUNT_BUDGET_S:
                break
            try:
                hunt.cut(index)
                checked = hunt.verify(f"after cut {index}")
            except AssertionError as error:
                raise AssertionError(f"seed {seed}, mode {mode}: {error}\ncuts: {hunt.cut_log}\n"
                                     f"--- broker log (tail) ---\n{broker.log()[-6000:]}") from None
        print(f"power-loss hunt: {len(hunt.cut_log)} cuts, {checked} acknowledged records checked at the end; "
              f"cuts (index:delay/restart): {' '.join(hunt.cut_log)}")
    finally:
        hunt.close()
        broker.kill()
        mount.stop()
