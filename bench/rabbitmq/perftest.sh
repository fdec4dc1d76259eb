#!/usr/bin/env bash
# The queue workload against RabbitMQ quorum queues, with RabbitMQ's own PerfTest: the
# RabbitMQ side of `sluice bench`'s queue workload (bench/local/workloads/queue-*.yaml).
#
# Installs what it needs on first use, as `sluice bench --start-kafka` does for Kafka:
# Debian's rabbitmq-server (apt-get, as root) when /usr/lib/rabbitmq is missing, and
# PerfTest (com.rabbitmq:perf-test from Maven Central, with its dependencies) into
# $SLUICE_BENCH_CACHE (default ~/.cache/sluice-bench)/perf-test-VERSION. Then it starts a
# fresh single RabbitMQ node on loopback (temporary data dir, free ports, no plugins), runs
# PerfTest and stops the node (and the epmd it forked).
#
# PerfTest settings, the same load as the workload files: one quorum queue per topic
# (durable, x-queue-type=quorum), persistent messages of --size bytes, publisher confirms
# (at most --confirm unconfirmed per producer), manual acks one by one after the work,
# --consumer-latency = the work time (PerfTest sleeps that long per message before acking),
# consumer prefetch (--qos) = the workload's maxRecordsPerFetch, producers and consumers
# spread evenly over the queues, each producer at --rate / producers msg/s.
#
# Output in --output-dir: perftest.csv (PerfTest's per-second figures), perftest.log,
# rabbitmq.log and result.json: mean send / receive msg/s over the measured seconds (after
# --warmup) and the latency figures. PerfTest reports latency percentiles per 1-s interval
# (consumer latency = send to delivery into the consumer's callback, before the work;
# confirm latency = publish to confirm) and, in its closing lines, over the whole run
# (warm-up included); result.json gives both: the whole-run percentiles, and the median and
# maximum over the measured intervals of each per-second percentile. Also the node's CPU
# seconds over the PerfTest run (warm-up included) and its peak RSS (VmHWM).
#
# With --broker sluice the same PerfTest run goes to Sluice's AMQP port instead: a fresh
# `sluice serve --amqp-listen` (the binary of --sluice-bin, default target/release/sluice)
# on a temporary data dir, its CPU seconds and peak RSS measured the same way. PerfTest's
# quorum-queue argument is taken and ignored there (every queue is a replicated topic).
# --rate 0 runs the producers unthrottled (PerfTest's default).
#
# Usage: bench/rabbitmq/perftest.sh [--broker rabbitmq|sluice] [--sluice-bin PATH]
#          [--queues 10] [--producers 20] [--consumers 40]
#          [--rate 2000] [--work-ms 10] [--qos 10] [--size 1024] [--confirm 100]
#          [--warmup 15] [--duration 60] [--output-dir DIR]
set -euo pipefail

PERF_TEST_VERSION=2.22.1
queues=10 producers=20 consumers=40 rate=2000 work_ms=10 qos=10 size=1024 confirm=100
warmup=15 duration=60 output_dir=rabbitmq-results broker=rabbitmq
sluice_bin="$(cd "$(dirname "$0")/../.." && pwd)/target/release/sluice"
while [ $# -gt 0 ]; do
  case "$1" in
    --broker) broker=$2 ;;
    --sluice-bin) sluice_bin=$2 ;;
    --queues) queues=$2 ;;
    --producers) producers=$2 ;;
    --consumers) consumers=$2 ;;
    --rate) rate=$2 ;;
    --work-ms) work_ms=$2 ;;
    --qos) qos=$2 ;;
    --size) size=$2 ;;
    --confirm) confirm=$2 ;;
    --warmup) warmup=$2 ;;
    --duration) duration=$2 ;;
    --output-dir) output_dir=$2 ;;
    -h|--help) sed -n '2,37p' "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift 2
done
if [ $((producers % queues)) -ne 0 ] || [ $((consumers % queues)) -ne 0 ]; then
  echo "--producers and --consumers must be multiples of --queues (spread evenly)" >&2
  exit 2
fi

cache="${SLUICE_BENCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice-bench}"
perf_home="$cache/perf-test-$PERF_TEST_VERSION"
mkdir -p "$output_dir"
output_dir="$(cd "$output_dir" && pwd)"

case "$broker" in
  rabbitmq|sluice) ;;
  *) echo "--broker is rabbitmq or sluice, not $broker" >&2; exit 2 ;;
esac

# --- install ---------------------------------------------------------------------------
if [ "$broker" = rabbitmq ] && [ ! -x /usr/lib/rabbitmq/bin/rabbitmq-server ]; then
  echo "Installing Debian's rabbitmq-server (apt-get)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rabbitmq-server >/dev/null
  # The package may start a node of its own: ours runs on other ports, but stop it anyway.
  (service rabbitmq-server stop >/dev/null 2>&1 || true)
fi
if [ ! -f "$perf_home/.installed" ]; then
  echo "Installing RabbitMQ PerfTest $PERF_TEST_VERSION from Maven Central into $perf_home"
  mkdir -p "$perf_home"
  cat > "$perf_home/pom.xml" <<POM
<?xml version="1.0" encoding="UTF-8"?>
<!-- Written by bench/rabbitmq/perftest.sh: resolves RabbitMQ PerfTest and its dependencies. -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.sluice.bench</groupId>
  <artifactId>perf-test-runtime</artifactId>
  <version>$PERF_TEST_VERSION</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>com.rabbitmq</groupId><artifactId>perf-test</artifactId><version>$PERF_TEST_VERSION</version></dependency>
  </dependencies>
</project>
POM
  (cd "$perf_home" && mvn -q -B --no-transfer-progress -Dstyle.color=never dependency:copy-dependencies \
      -DoutputDirectory=lib -DincludeScope=runtime)
  ls "$perf_home/lib"/perf-test-*.jar >/dev/null
  touch "$perf_home/.installed"
fi

# --- start a fresh node --------------------------------------------------------------------
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
node_dir="$(mktemp -d "${TMPDIR:-/tmp}/sluice-bench-$broker-XXXXXX")"
amqp_port="$(free_port)"

start_rabbitmq() {
  export HOME="$node_dir"   # the Erlang cookie lives here, shared with rabbitmqctl
  export RABBITMQ_NODENAME="sluice-bench-$$@localhost"
  export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT="$amqp_port"
  export RABBITMQ_DIST_PORT="$(free_port)" ERL_EPMD_ADDRESS=127.0.0.1 ERL_EPMD_PORT="$(free_port)"
  export RABBITMQ_MNESIA_BASE="$node_dir/mnesia" RABBITMQ_LOG_BASE="$node_dir/log"
  export RABBITMQ_ENABLED_PLUGINS_FILE="$node_dir/enabled_plugins" RABBITMQ_CONFIG_FILE="$node_dir/rabbitmq"
  echo "[]." > "$RABBITMQ_ENABLED_PLUGINS_FILE"
  : > "$node_dir/rabbitmq.conf"
  /usr/lib/rabbitmq/bin/rabbitmq-server > "$output_dir/rabbitmq.log" 2>&1 &
  server_pid=$!
  stop_node() {
    /usr/lib/rabbitmq/bin/rabbitmqctl stop >/dev/null 2>&1 || kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    # The node forks an epmd (on our port) that outlives it: stop that one.
    epmd -port "$ERL_EPMD_PORT" -kill >/dev/null 2>&1 || true
    rm -rf "$node_dir"
  }
  trap stop_node EXIT
  # await_startup needs the node registered first: poll until it answers (bounded).
  for attempt in $(seq 1 60); do
    /usr/lib/rabbitmq/bin/rabbitmqctl await_startup --timeout 60 >/dev/null 2>&1 && break
    if ! kill -0 "$server_pid" 2>/dev/null || [ "$attempt" -eq 60 ]; then
      echo "RabbitMQ did not start; log:" >&2; tail -20 "$output_dir/rabbitmq.log" >&2; exit 1
    fi
    sleep 1
  done
  echo "Started RabbitMQ $(/usr/lib/rabbitmq/bin/rabbitmqctl version) (pid $server_pid) on 127.0.0.1:$amqp_port"
}

start_sluice() {
  "$sluice_bin" serve --data-dir "$node_dir/data" --listen "127.0.0.1:$(free_port)" \
      --amqp-listen "127.0.0.1:$amqp_port" > "$output_dir/sluice.log" 2>&1 &
  server_pid=$!
  stop_node() {
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    rm -rf "$node_dir"
  }
  trap stop_node EXIT
  for attempt in $(seq 1 60); do
    python3 -c "import socket; socket.create_connection(('127.0.0.1', $amqp_port), 1)" 2>/dev/null && break
    if ! kill -0 "$server_pid" 2>/dev/null || [ "$attempt" -eq 60 ]; then
      echo "Sluice did not start; log:" >&2; tail -20 "$output_dir/sluice.log" >&2; exit 1
    fi
    sleep 0.5
  done
  echo "Started $("$sluice_bin" --version) (pid $server_pid) with AMQP on 127.0.0.1:$amqp_port"
  broker_pid=$server_pid
}

if [ "$broker" = rabbitmq ]; then start_rabbitmq; else start_sluice; fi

# --- run PerfTest --------------------------------------------------------------------------
# The node's Erlang VM, for its CPU seconds (during the PerfTest run, warm-up included) and
# peak RSS, as `sluice bench` records for the brokers it starts.
if [ "$broker" = rabbitmq ]; then
  broker_pid="$(pgrep -f "beam.smp.*$node_dir" | head -1 || true)"
  if [ -z "$broker_pid" ]; then
    echo "cannot find the node's Erlang VM (beam.smp with $node_dir in its arguments)" >&2
    exit 1
  fi
fi
cpu_ticks() { awk '{print $14 + $15}' "/proc/$broker_pid/stat"; }
ticks_before="$(cpu_ticks)"
rate_per_producer=$(python3 -c "print(f'{$rate / $producers:g}' if $rate > 0 else '-1')")
work_us=$((work_ms * 1000))
total=$((warmup + duration))
echo "PerfTest against $broker: $queues quorum queues, $producers producers x $rate_per_producer msg/s, $consumers consumers" \
     "(qos $qos, ${work_ms} ms work each), $size B persistent, confirms (max $confirm unconfirmed), ${total} s"
java -Xms512m -Xmx1g -cp "$perf_home/lib/*" com.rabbitmq.perf.PerfTest \
  --uri "amqp://guest:guest@127.0.0.1:$amqp_port" \
  --quorum-queue --auto-delete false \
  --queue-pattern 'sluice-bench-q-%d' --queue-pattern-from 1 --queue-pattern-to "$queues" \
  --producers "$producers" --consumers "$consumers" --rate "$rate_per_producer" \
  --size "$size" --flag persistent --confirm "$confirm" --qos "$qos" \
  --consumer-latency "$work_us" --time "$total" --interval 1 \
  --output-file "$output_dir/perftest.csv" --id sluice-bench > "$output_dir/perftest.log" 2>&1
tail -3 "$output_dir/perftest.log"
broker_cpu_seconds="$(python3 -c "print(($(cpu_ticks) - $ticks_before) / $(getconf CLK_TCK))")"
broker_peak_rss_bytes="$(awk '/VmHWM/ {print $2 * 1024}' "/proc/$broker_pid/status")"
export broker_cpu_seconds broker_peak_rss_bytes broker

# --- summarize -----------------------------------------------------------------------------
python3 - "$output_dir" "$warmup" <<'PY'
import csv, json, os, statistics, sys
out, warmup = sys.argv[1], float(sys.argv[2])
with open(f"{out}/perftest.csv") as f:
    rows = [{k.strip(): v.strip() for k, v in row.items()} for row in csv.DictReader(f)]
def col(row, *names):
    for name in names:
        for key, value in row.items():
            if key.startswith(name):
                return float(value)
    raise KeyError(names)
measured = [r for r in rows if col(r, "time") > warmup]
def figure(name, pct):
    values = [col(r, f"{pct} {name}", f"{pct} p. {name}") for r in measured]
    return {"median": statistics.median(values), "max": max(values)}
def whole_run(name):
    # PerfTest's closing lines: "<id>, consumer latency min/median/75th/95th/99th a/b/c/d/e µs"
    for line in open(f"{out}/perftest.log", encoding="utf-8"):
        if f"{name} latency min/median/75th/95th/99th" in line:
            values = [float(v) for v in line.split()[-2].split("/")]
            return dict(zip(["min", "50pct", "75pct", "95pct", "99pct"], values))
    return None
received = [col(r, "received") for r in measured]
medians = [col(r, "median consumer latency") for r in measured]
weighted = sum(m * n for m, n in zip(medians, received)) / max(sum(received), 1)
result = {
    "system": "rabbitmq-quorum-queues" if os.environ["broker"] == "rabbitmq" else "sluice-amqp",
    "measuredSeconds": len(measured),
    "publishRate": statistics.mean(col(r, "published") for r in measured),
    "confirmRate": statistics.mean(col(r, "confirmed") for r in measured),
    "consumeRate": statistics.mean(received),
    "nackedPerSecond": statistics.mean(col(r, "nacked") for r in measured),
    "brokerCpuSecondsWholeRun": float(os.environ["broker_cpu_seconds"]),
    "brokerPeakRssBytes": int(os.environ["broker_peak_rss_bytes"]),
    "latencyUnit": "microseconds",
    "wholeRunNote": "PerfTest's closing summary: every message of the run, warm-up included",
    "consumerLatencyWholeRun": whole_run("consumer"),
    "confirmLatencyWholeRun": whole_run("confirm"),
    "perSecondNote": "per-second percentiles of the measured seconds: their median and their max",
    "consumerLatencyWeightedMeanOfMedians": weighted,
    "consumerLatency50pct": figure("consumer latency", "median"),
    "consumerLatency95pct": figure("consumer latency", "95th"),
    "consumerLatency99pct": figure("consumer latency", "99th"),
    "confirmLatency50pct": figure("confirm latency", "median"),
    "confirmLatency95pct": figure("confirm latency", "95th"),
    "confirmLatency99pct": figure("confirm latency", "99th"),
}
json.dump(result, open(f"{out}/result.json", "w"), indent=2)
print(json.dumps(result, indent=2))
PY
