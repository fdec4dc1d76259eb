"""The Java idempotent producer while its connections are cut mid-flight / the broker is killed.

tests/java/.../IdempotentProducer.java sends N sequentially numbered records (record i to
partition i % P) with the client's defaults for idempotence (enable.idempotence=true, acks=all,
retries=MAX, max.in.flight=5), paced so the run spans the chaos below, then reads every partition
back and reports duplicates, gaps, reordering and records not at their acknowledged offset.
"""

import json
import os
import random
import time

from java_support import JavaProcess, TcpProxy, free_port, java_cp  # noqa: F401  (java_cp is a fixture)

PARTITIONS = 6
RECORDS = 100_000
RATE = 5_000  # records/s -> ~20 s of producing
PRODUCE_S = RECORDS / RATE


def _seed() -> int:
    return int(os.environ.get("SLUICE_TEST_SEED", random.randrange(1 << 30)))


def _result(proc: JavaProcess, broker, context: str) -> dict:
    res = proc.wait(timeout=PRODUCE_S + 240)
    lines = [l for l in res.stdout.splitlines() if l.startswith("RESULT ")]
    assert res.returncode == 0 and lines, (
        f"{context}\n{res.report()}\n--- broker log (tail) ---\n{broker.log()[-8000:]}"
    )
    return json.loads(lines[-1][len("RESULT "):])


def _assert_exactly_once(r: dict, res_context: str):
    assert r["acked"] == RECORDS and r["send_errors"] == 0, res_context
    assert r["consumed"] == RECORDS, res_context
    assert r["duplicates"] == 0, res_context
    assert r["missing"] == 0, res_context
    assert r["out_of_order"] == 0, res_context
    assert r["offset_mismatch"] == 0, res_context
    assert r["foreign"] == 0, res_context


def test_idempotent_producer_connection_cuts(broker_factory, java_cp):
    """A TCP proxy between client and broker cuts every connection 10 times while the producer is
    sending: 5 times just after a request was forwarded (the broker has it, its response is lost),
    5 times at random moments; RST or FIN at random. The broker advertises the proxy address, so
    the client reconnects through it. Afterwards: every record acked once, no duplicates, no gaps,
    per-partition order = send order, each record at its acknowledged offset, and the client
    really did retry."""
    seed = _seed()
    rng = random.Random(seed)
    broker_port = free_port()
    proxy = TcpProxy(broker_port)
    try:
        broker = broker_factory(port=broker_port, extra_args=["--advertised-listener", proxy.bootstrap])
        proc = JavaProcess(java_cp, "sluice.tests.IdempotentProducer",
                           ["--bootstrap", proxy.bootstrap, "--topic", "idem-proxy", "--partitions", PARTITIONS,
                            "--records", RECORDS, "--rate", RATE])
        try:
            proc.wait_for_line("READY", 90)
            start = time.monotonic()
            moments = sorted(rng.uniform(1.0, PRODUCE_S * 0.85) for _ in range(10))
            kinds = ["after-request"] * 5 + ["random"] * 5
            rng.shuffle(kinds)
            for at, kind in zip(moments, kinds):
                time.sleep(max(0.0, start + at - time.monotonic()))
                # Cut only once the client is back and producing through the proxy again.
                assert proxy.wait_for_traffic(api_key=0, timeout=15), (
                    f"no Produce request through the proxy within 15 s of the last cut\n{proc.result().report()}")
                assert not proc.seen("PRODUCED"), "producer finished before the connection cuts were done"
                rst = rng.random() < 0.5
                if kind == "after-request":
                    proxy.drop_after_next_request(delay=rng.uniform(0.0, 0.01), rst=rst)
                    deadline = time.monotonic() + 15
                    while proxy.armed() and time.monotonic() < deadline:
                        time.sleep(0.002)
                    assert not proxy.armed(), "armed cut did not fire within 15 s"
                else:
                    proxy.drop_all(rst=rst)
            cuts = list(proxy.drop_events)
            r = _result(proc, broker, f"seed={seed} cuts={cuts}")
        finally:
            proc.kill()
        ctx = f"seed={seed} result={r} cuts={cuts}\n--- broker log (tail) ---\n{broker.log()[-6000:]}"
        print(f"seed={seed} cuts={len(cuts)} produce requests forwarded={proxy.requests.get(0, 0)} result={r}")
        assert len(cuts) == 10 and all(n > 0 for _, n in cuts), f"not every cut hit a live connection: {ctx}"
        _assert_exactly_once(r, ctx)
        assert r["retries"] > 0, f"no produce request was retried: the cuts did not hit in-flight requests: {ctx}"
        assert broker.is_running()
    finally:
        proxy.close()


def test_idempotent_producer_broker_restarts(broker_factory, java_cp):
    """The broker is SIGKILLed and restarted (same port, same data dir) 4 times while the producer
    is sending: twice 0-3 ms after a Produce request reached it (so the kill lands while the
    broker is reading, syncing or answering it; the proxy holds back its answer and cuts the
    connection, so the client must retry it), twice at random moments. The client talks to the
    broker through a transparent TCP proxy (advertised in metadata) that only watches the request
    framing to time those kills; it cuts nothing itself. Afterwards: every record acked once, no
    duplicates, no gaps, per-partition order = send order, each record at its acknowledged offset
    (the broker must keep producer state across the crash to recognise retried batches it had
    already written), and the client really did retry."""
    seed = _seed()
    rng = random.Random(seed)
    broker_port = free_port()
    proxy = TcpProxy(broker_port)
    restarts = []
    try:
        broker = broker_factory(port=broker_port, extra_args=["--advertised-listener", proxy.bootstrap])
        proc = JavaProcess(java_cp, "sluice.tests.IdempotentProducer",
                           ["--bootstrap", proxy.bootstrap, "--topic", "idem-restart", "--partitions", PARTITIONS,
                            "--records", RECORDS, "--rate", RATE])
        try:
            proc.wait_for_line("READY", 90)
            start = time.monotonic()
            moments = sorted(rng.uniform(1.0, PRODUCE_S * 0.8) for _ in range(4))
            kinds = ["after-request"] * 2 + ["random"] * 2
            rng.shuffle(kinds)
            for at, kind in zip(moments, kinds):
                time.sleep(max(0.0, start + at - time.monotonic()))
                assert proxy.wait_for_traffic(api_key=0, timeout=15), (
                    f"no Produce request within 15 s of the last restart\n{proc.result().report()}")
                assert not proc.seen("PRODUCED"), "producer finished before the broker restarts were done"
                if kind == "after-request":
                    proxy.call_after_next_request(broker.kill, delay=rng.uniform(0.0, 0.003), cut=True)
                    deadline = time.monotonic() + 15
                    while proxy.armed() and time.monotonic() < deadline:
                        time.sleep(0.002)
                    assert not proxy.armed() and not proxy.action_errors, f"armed kill failed: {proxy.action_errors}"
                else:
                    broker.kill()
                assert not broker.is_running()
                down = rng.uniform(0.0, 1.0)
                time.sleep(down)
                t = time.monotonic()
                broker.start()
                restarts.append((kind, round(time.monotonic() - start, 2), round(down, 2),
                                 round(time.monotonic() - t, 2)))
            r = _result(proc, broker, f"seed={seed} restarts(kind, at_s, down_s, start_s)={restarts}")
        finally:
            proc.kill()
        ctx = f"seed={seed} result={r} restarts={restarts}\n--- broker log (tail) ---\n{broker.log()[-6000:]}"
        print(f"seed={seed} restarts(kind, at_s, down_s, start_s)={restarts} result={r}")
        _assert_exactly_once(r, ctx)
        assert r["retries"] > 0, f"no produce request was retried: no kill hit an in-flight request: {ctx}"
        assert broker.is_running()
    finally:
        proxy.close()
