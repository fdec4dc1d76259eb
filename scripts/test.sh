#!/usr/bin/env bash
# The whole test suite: style, unit and property tests, then end-to-end tests with real
# clients (librdkafka via confluent-kafka, the Java client, Kafka's own tools) against a
# real `sluice serve` process. Installs what it needs (Python venv, Maven artifacts).
# SLUICE_SLOW_TESTS=1 adds the slow tier (the 10-minute mixed fault run, test_faults.py;
# tiered storage with 2 GiB of history and a 60 s object-store outage).
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== style"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings

echo "== previous version (rolling-upgrade test)"
# The binary of the commit in tests/upgrade-base-rev (the version before this one), built
# once from the repository's own history and kept in target/upgrade-base. It is built in
# this workspace's target dir, before the current version, so that the two share their
# compiled dependencies; the build below then links target/release/sluice again.
base_rev="$(cat tests/upgrade-base-rev)"
base_dir="$PWD/target/upgrade-base"
if [ ! -x "$base_dir/sluice" ] || [ "$(cat "$base_dir/rev" 2>/dev/null)" != "$base_rev" ]; then
  rm -rf "$base_dir" && mkdir -p "$base_dir/src"
  git archive "$base_rev" | tar -x -C "$base_dir/src"
  cargo build --release -p sluice-cli --manifest-path "$base_dir/src/Cargo.toml" --target-dir "$PWD/target"
  cp target/release/sluice "$base_dir/sluice"
  echo "$base_rev" > "$base_dir/rev"
fi
export SLUICE_UPGRADE_BASE_BIN="$base_dir/sluice"

echo "== build"
cargo build --release -p sluice-cli -p sluice-lossyfs
export SLUICE_BIN="$PWD/target/release/sluice"
if cmp -s "$SLUICE_BIN" "$SLUICE_UPGRADE_BASE_BIN"; then
  echo "target/release/sluice is still the previous version's binary" >&2
  exit 1
fi
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
.venv/bin/pytest -q --durations=25 tests/python "$@"
