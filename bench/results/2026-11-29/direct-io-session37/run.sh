#!/bin/bash
# usage: run.sh BIN OUTDIR WORKLOAD DRIVER [extra bench args]  — Sluice-only run; samples broker RSS/CPU
cd /work/main
BIN=$1; OUT=$2; W=$3; D=$4; shift 4
rm -rf $OUT; mkdir -p $OUT
sync; echo 3 > /proc/sys/vm/drop_caches
SLUICE_METRICS_LISTEN=127.0.0.1:9644 $BIN bench --start-sluice -d $D $W --output-dir $OUT "$@" > $OUT/bench.log 2>&1 &
BP=$!
sleep 5
P=$(pgrep -f "$BIN serve" | head -1)
while kill -0 $BP 2>/dev/null; do
  if [ -d /proc/$P ]; then
    r=$(awk '/VmRSS/{print $2}' /proc/$P/status 2>/dev/null); c=$(awk '{print $14+$15}' /proc/$P/stat 2>/dev/null)
    m=$(curl -s 127.0.0.1:9644/metrics); t=$(echo "$m" | awk '/^sluice_segment_tail_memory_bytes/{print $2}'); w=$(echo "$m" | grep "^sluice_segment_tail_written_bytes" | tr "\n" " ")
    echo "$(date +%s) rss_kib=$r cpu_ticks=$c tail=$t $w" >> $OUT/samples.txt
  fi
  sleep 5
done
grep -iE 'p99|Pub rate|cpu|rss' $OUT/bench.log | tail -8
