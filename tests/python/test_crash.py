"""Crash safety: an idempotent acks=all producer writes numbered records continuously while the
broker is killed with SIGKILL 20 times at random moments and restarted on the same port and
data dir. After every restart, every record acknowledged before the kill is read back exactly
once, at the offset it was acknowledged at, in order; nothing that was not sent (torn or
garbage data) is ever visible."""

import os
import random
import uuid

from kafka_wire import create_topic
from numbered import PARTITIONS, run_kill_rounds

KILLS = int(os.environ.get("SLUICE_CRASH_KILLS", "20"))


def test_kill9_during_idempotent_produce(broker):
    rng = random.Random(int(os.environ.get("SLUICE_CRASH_SEED", "4242")))
    topic = f"crash-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, PARTITIONS)
    print(run_kill_rounds(broker, topic, KILLS, rng))
