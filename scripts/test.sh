#!/usr/bin/env bash
# The whole test suite: style, unit and property tests, then end-to-end tests with real
# clients (librdkafka via confluent-kafka, the Java client, Kafka's own tools) against a
# real `sluice serve` process. Installs what it needs (Python venv, Maven artifacts).
# SLUICE_SLOW_TESTS=1 adds the slow tier (the 10-minute mixed fault run, test_faults.py).
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== style"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings

echo "== build"
cargo build --release -p sluice-cli -p sluice-lossyfs
export SLUICE_BIN="$PWD/target/release/sluice"
# The power-loss tests mount the broker's data dir on this FUSE filesystem (crates/lossyfs).
export SLUICE_LOSSYFS_BIN="$PWD/target/release/sluice-lossyfs"
# The bench's end-to-end test also runs its workload against Apache Kafka 4.3.1 (Maven).
export SLUICE_BENCH_KAFKA_TEST=1

echo "== unit and property tests"
cargo test --workspace

echo "== end-to-end tests"
if [ ! -x .venv/bin/pytest ]; then
  python3 -m venv .venv
fi
.venv/bin/pip install -q -r tests/python/requirements.txt
.venv/bin/pytest -q tests/python "$@"
