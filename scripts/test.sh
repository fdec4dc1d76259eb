#!/usr/bin/env bash
# The whole test suite: style, unit and property tests, then end-to-end tests with real
# clients (librdkafka via confluent-kafka, the Java client, Kafka's own tools) against a
# real `sluice serve` process. Installs what it needs (Python venv, Maven artifacts).
# SLUICE_SLOW_TESTS=1 adds the slow tier (the 10-minute mixed fault run, test_faults.py;
# tiered storage with 2 GiB of history and a 60 s object-store outage; 120 cuts per mode of
# the power-loss hunt; Kafka Streams with in-memory stores).
set -euo pipefail
cd "$(dirname "$0")/.."

# librdkafka's TLS (the bench's clients in `compare --tls`) links the system's OpenSSL, found
# with pkg-config: Debian's libssl-dev. Installed here when missing and this runs as root.
if ! pkg-config --exists openssl 2>/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
    echo "== installing OpenSSL's development files (libssl-dev, pkg-config)"
    apt-get install -y -q libssl-dev pkg-config || { apt-get update -q && apt-get install -y -q libssl-dev pkg-config; }
  else
    echo "OpenSSL's development files are missing: install libssl-dev and pkg-config" >&2
    exit 1
  fi
fi

# The web console's browser tests drive Debian's headless Chromium through its ChromeDriver
# (tests/python/browser_support.py). Installed when missing and this runs as root: in the
# background while the builds below run (133 MB to fetch, 440 MB unpacked: ~20 s), in a
# session of its own so that a ^C to this script does not reach dpkg. It is not in the EXIT
# trap below: dpkg stopped halfway leaves a package database that every later apt-get refuses
# until `dpkg --configure -a`, and the install ends by itself. Without recommends: they add
# systemd, perl, avahi and printing tools (105 more packages), none of which headless needs.
browser_pid=""
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
    echo "== chromium, chromium-driver: installing in the background, log in target/browser-install.log"
    mkdir -p target
    setsid env DEBIAN_FRONTEND=noninteractive bash -c '
        set -e
        install_chromium() { apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=300 chromium chromium-driver; }
        # Not `a || { b && c; }`: set -e ignores a failing b there, and the script would go on.
        if ! install_chromium; then
          apt-get update -q -o DPkg::Lock::Timeout=300
          install_chromium
        fi
        /usr/bin/chromium --version
        /usr/bin/chromedriver --version
      ' > target/browser-install.log 2>&1 < /dev/null &
    browser_pid=$!
  else
    echo "Chromium is missing: install chromium and chromium-driver (Debian)" >&2
    exit 1
  fi
fi

# The previous version's binary (the commit in tests/upgrade-base-rev), for the
# rolling-upgrade test: its source is taken from the repository's own history into
# target/upgrade-base here, and built after the unit tests' build (below), in the dev profile
# and in the same build directory: the dependencies it shares with them are built once. (Built
# on its own, in release, it cost more CPU than all the end-to-end tests' brokers; only its
# behaviour is tested.)
base_rev="$(cat tests/upgrade-base-rev)"
base_dir="$PWD/target/upgrade-base"
base_needed=""
if [ ! -x "$base_dir/sluice" ] || [ "$(cat "$base_dir/rev" 2>/dev/null)" != "$base_rev" ]; then
  rm -rf "$base_dir/src" "$base_dir/sluice" && mkdir -p "$base_dir/src"
  git archive "$base_rev" | tar -x -C "$base_dir/src"
  base_needed=1
fi
export SLUICE_UPGRADE_BASE_BIN="$base_dir/sluice"

# The S3-compatible server of the tiered-storage tests (scripts/s3_server.sh), built the same
# way in the background: its tests wait on the script's lock if the build is not done when
# they start, instead of building it on a test worker (two workers built it at once, ~7 min).
s3_build_pid=""
if ! scripts/s3_server.sh check 2>/dev/null; then
  echo "== s3s-fs: building in the background, log in target/tools/build.log"
  mkdir -p target/tools
  setsid bash -c 'echo 19 > /proc/self/autogroup 2>/dev/null || true; exec "$@"' autogroup-nice \
    nice -n 19 ionice -c 3 scripts/s3_server.sh install > target/tools/build.log 2>&1 &
  s3_build_pid=$!
fi
# Helm, for the Helm chart's tests (scripts/helm.sh; from the Go module proxy), built the
# same way in the background; its test waits on the script's lock if the build is not done.
helm_build_pid=""
if ! scripts/helm.sh check 2>/dev/null; then
  echo "== helm: building in the background, log in target/tools/helm-build.log"
  mkdir -p target/tools
  setsid bash -c 'echo 19 > /proc/self/autogroup 2>/dev/null || true; exec "$@"' autogroup-nice \
    nice -n 19 ionice -c 3 scripts/helm.sh install > target/tools/helm-build.log 2>&1 &
  helm_build_pid=$!
fi
# The end-to-end tests' own tools, prepared while the builds below run (downloads, mostly):
# the Python venv with its packages, then the Java test programs (Maven), Kafka's tools and the
# Go registry client, which the tests would otherwise build on their first use while a worker waits.
echo "== test tools: preparing in the background, log in target/test-tools.log"
mkdir -p target
# At normal priority: it needs little CPU (most of it waits on the network), but at the
# lowest it would get none while the builds keep both cores busy. A session of its own, so
# that an early exit stops it.
setsid bash -c '
    set -e
    [ -x .venv/bin/pytest ] || python3 -m venv .venv
    .venv/bin/pip install -q -r tests/python/requirements.txt
    cd tests/python && ../../.venv/bin/python -c "import java_support as j; j.java_test_classpath(); j.kafka_tools_classpath(); import go_support; go_support.registry_client_binary()"
  ' > target/test-tools.log 2>&1 &
tools_pid=$!
stage() { echo "== $* ($(date -u +%T))"; }
trap 'for pid in $s3_build_pid $helm_build_pid $tools_pid; do kill -- "-$pid" 2>/dev/null || true; done' EXIT

stage "style"
cargo fmt --all -- --check
# Each crate's modules form layers: no two import each other, directly or in a circle.
python3 scripts/import_cycles.py
stage "build"
cargo build --release -p sluice-cli -p sluice-lossyfs --features sluice-cli/bench
export SLUICE_BIN="$PWD/target/release/sluice"
# The power-loss tests mount the broker's data dir on this FUSE filesystem (crates/lossyfs).
export SLUICE_LOSSYFS_BIN="$PWD/target/release/sluice-lossyfs"
# The bench's end-to-end test also runs its workload against Apache Kafka 4.3.1 (Maven).
export SLUICE_BENCH_KAFKA_TEST=1

stage "unit and property tests: build"
cargo test --workspace --no-run
# They run after the end-to-end tests, not beside them: the storage tests fsync without
# pause, and the end-to-end tests that time a restart, a failover or a power cut must not
# share the disk with them.

# After the build above, in its target dir: the build scripts and procedural macros it built
# serve clippy too (in a target dir of its own, clippy cost three times the CPU).
stage "clippy"
cargo clippy --workspace --all-targets -- -D warnings

stage "previous version ($base_rev): build"
if [ -n "$base_needed" ]; then
  CARGO_BUILD_BUILD_DIR="$PWD/target" cargo build -p sluice-cli --manifest-path "$base_dir/src/Cargo.toml" \
    --target-dir "$base_dir/target"
  cp "$base_dir/target/debug/sluice" "$base_dir/sluice"
  echo "$base_rev" > "$base_dir/rev"
fi
stage "end-to-end tests"
if ! wait "$tools_pid"; then
  tail -50 target/test-tools.log >&2
  echo "preparing the test tools failed" >&2
  exit 1
fi
tools_pid=""
if [ -n "$browser_pid" ]; then
  if ! wait "$browser_pid"; then
    tail -50 target/browser-install.log >&2
    echo "installing chromium and chromium-driver failed" >&2
    exit 1
  fi
  browser_pid=""
fi
# Free space where the builds and the tests' data dirs live: the tests keep a directory only
# when they fail (tests/python/pytest.ini), so a full disk shows here first.
df -h . "${TMPDIR:-/tmp}" | sed 's/^/   /'
# Two worker processes (pytest-xdist): most tests wait on sockets, timers and child
# processes, and one process at a time left the 2 cores three-quarters idle. Each worker
# picks listen ports from a range of its own (conftest.free_port).
.venv/bin/pytest -q -n "${SLUICE_TEST_WORKERS:-2}" --dist worksteal --durations=25 --ignore=tests/python/test_rolling_upgrade.py tests/python "$@"

stage "unit and property tests"
cargo test --workspace

stage "rolling upgrade from the previous version"
# Exit status 5: the arguments given deselected this test.
.venv/bin/pytest -q tests/python/test_rolling_upgrade.py "$@" || [ $? -eq 5 ]
