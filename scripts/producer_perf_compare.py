#!/usr/bin/env python3
"""Kafka's ProducerPerformance against Sluice (fsync before ack) and Apache Kafka 4.3.1
(its default: no fsync), on this machine, alternating K S K S ..., each broker started
fresh with an empty data dir for every run. Reports medians and Sluice/Kafka ratios.

    python3 scripts/producer_perf_compare.py [--rounds 3] [--records 1000000] [--fixed-rate 20000]

Needs: target/release/sluice (cargo build --release -p sluice-cli) and the Kafka jars in
tests/kafka-tools/lib (installed on first use with Maven).
"""

import argparse
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOOLS = REPO / "tests" / "kafka-tools"
LIB = TOOLS / "lib"
SLUICE = Path(os.environ.get("SLUICE_BIN", REPO / "target" / "release" / "sluice"))
SUMMARY = re.compile(
    r"(\d+) (?:steady state )?records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\), ([\d.]+) ms avg latency, ([\d.]+) ms max latency, "
    r"(\d+) ms 50th, (\d+) ms 95th, (\d+) ms 99th, (\d+) ms 99.9th"
)


def ensure_jars():
    if not LIB.is_dir() or len(list(LIB.glob("*.jar"))) < 50:
        subprocess.run(["mvn", "-q", "-B", "dependency:copy-dependencies", "-DoutputDirectory=lib",
                        "-DincludeScope=runtime"], cwd=TOOLS, check=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"broker exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("broker did not start")


def java(main, *args, timeout=900):
    cmd = ["java", "-Xmx1g", "-cp", f"{LIB}/*", main, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def start_kafka(workdir: Path):
    port, controller = free_port(), free_port()
    props = workdir / "server.properties"
    props.write_text("\n".join([
        "process.roles=broker,controller", "node.id=1", f"controller.quorum.voters=1@127.0.0.1:{controller}",
        f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}", "controller.listener.names=CONTROLLER",
        f"log.dirs={workdir / 'kafka-logs'}", "offsets.topic.replication.factor=1",
        "transaction.state.log.replication.factor=1", "transaction.state.log.min.isr=1",
        "share.coordinator.state.topic.replication.factor=1", "group.initial.rebalance.delay.ms=0", ""]))
    cluster_id = java("kafka.tools.StorageTool", "random-uuid").stdout.strip().splitlines()[-1]
    java("kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(props))
    log = open(workdir / "kafka.log", "w")
    proc = subprocess.Popen(["java", "-Xms1g", "-Xmx1g", "-XX:+UseG1GC", "-cp", f"{LIB}/*", "kafka.Kafka", str(props)],
                            stdout=log, stderr=subprocess.STDOUT)
    wait_port(port, proc)
    return proc, port


def start_sluice(workdir: Path):
    port = free_port()
    log = open(workdir / "sluice.log", "w")
    proc = subprocess.Popen([str(SLUICE), "serve", "--listen", f"127.0.0.1:{port}", "--data-dir",
                             str(workdir / "sluice-data")], stdout=log, stderr=subprocess.STDOUT)
    wait_port(port, proc)
    return proc, port


def producer_perf(port, topic, records, throughput):
    bootstrap = f"127.0.0.1:{port}"
    created = java("org.apache.kafka.tools.TopicCommand", "--bootstrap-server", bootstrap, "--create", "--topic", topic,
                   "--partitions", "8", "--replication-factor", "1")
    if created.returncode != 0:
        raise RuntimeError(created.stderr[-2000:])
    result = java("org.apache.kafka.tools.ProducerPerformance", "--topic", topic, "--num-records", str(records),
                  "--record-size", "1024", "--throughput", str(throughput), "--warmup-records", str(records // 5),
                  "--producer-props",
                  f"bootstrap.servers={bootstrap}", "acks=all")
    # With --warmup-records the last summary line covers the steady state only.
    matches = SUMMARY.findall(result.stdout)
    match = matches[-1] if matches else None
    if result.returncode != 0 or not match:
        raise RuntimeError(f"ProducerPerformance failed: {result.stdout[-1500:]} {result.stderr[-1500:]}")
    _, rps, mbps, _, _, p50, _, p99, p999 = match
    return {"records_per_s": float(rps), "mb_per_s": float(mbps), "p50_ms": int(p50), "p99_ms": int(p99),
            "p999_ms": int(p999)}


def run_once(system, records, fixed_rate):
    workdir = Path(tempfile.mkdtemp(prefix=f"perf-{system}-"))
    proc, port = (start_kafka if system == "kafka" else start_sluice)(workdir)
    try:
        producer_perf(port, "warmup", records // 4, -1)  # JIT and connection warm-up
        peak = producer_perf(port, "peak", records, -1)
        fixed = producer_perf(port, "fixed", fixed_rate * 30, fixed_rate)
        return peak, fixed
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(workdir, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--fixed-rate", type=int, default=20_000)
    args = parser.parse_args()
    ensure_jars()
    results = {"kafka": [], "sluice": []}
    for round_index in range(args.rounds):
        for system in ("kafka", "sluice"):
            peak, fixed = run_once(system, args.records, args.fixed_rate)
            results[system].append((peak, fixed))
            print(f"round {round_index + 1} {system:6}: peak {peak['records_per_s']:9.0f} rec/s "
                  f"({peak['mb_per_s']:.1f} MB/s, p99 {peak['p99_ms']} ms) | at {args.fixed_rate}/s: "
                  f"p50 {fixed['p50_ms']} p99 {fixed['p99_ms']} p99.9 {fixed['p999_ms']} ms", flush=True)
    print("\nmedians over", args.rounds, "rounds (1 KiB, acks=all, 8 partitions; Sluice fsyncs before ack, "
          "Kafka 4.3.1 default = no fsync)")
    print(f"{'figure':32} {'kafka':>10} {'sluice':>10} {'sluice/kafka':>13}")
    rows = [("peak records/s", 0, "records_per_s"), ("peak p99 ms", 0, "p99_ms"),
            (f"p50 ms at {args.fixed_rate}/s", 1, "p50_ms"), (f"p99 ms at {args.fixed_rate}/s", 1, "p99_ms"),
            (f"p99.9 ms at {args.fixed_rate}/s", 1, "p999_ms")]
    for label, which, key in rows:
        k = statistics.median(r[which][key] for r in results["kafka"])
        s = statistics.median(r[which][key] for r in results["sluice"])
        ratio = f"{s / k:.2f}x" if k else "n/a"
        print(f"{label:32} {k:10.0f} {s:10.0f} {ratio:>13}")


if __name__ == "__main__":
    sys.exit(main())
