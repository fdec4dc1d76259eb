"""Apache Kafka 4.3.1 beside Sluice, for tests that send the same requests to both and compare
the answers: Kafka's behaviour is the contract Kafka clients test against.

The `kafka_peer` fixture runs `sluice bench kafka` (the bench's own Kafka start-up: installed
from Maven Central into the bench's cache on first use, one KRaft node on loopback) and yields
its bootstrap address; closing the command's standard input stops Kafka. One per test worker,
started by the first test that asks for it.
"""

from __future__ import annotations

import selectors
import subprocess
import time

import pytest

from conftest import SLUICE_BIN

#: First start installs Kafka (Maven) when the bench's cache lacks it; later ones take ~10 s.
PEER_START_TIMEOUT_S = 300
PEER_HEAP = "512m"


@pytest.fixture(scope="session")
def kafka_peer():
    proc = subprocess.Popen([SLUICE_BIN, "bench", "kafka", "--kafka-heap", PEER_HEAP], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    bootstrap = None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + PEER_START_TIMEOUT_S
        while bootstrap is None:
            left = deadline - time.monotonic()
            if left <= 0 or not selector.select(left):
                proc.kill()
                pytest.fail("Kafka did not start within %d s:\n%s" % (PEER_START_TIMEOUT_S, "".join(seen[-40:])))
            line = proc.stdout.readline()
            if not line:
                pytest.fail(f"`sluice bench kafka` exited ({proc.wait()}):\n" + "".join(seen[-40:]))
            seen.append(line)
            if line.startswith("ready "):
                bootstrap = line.split()[1]
    yield bootstrap
    proc.stdin.close()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
