#!/bin/bash
# usage: prof.sh BIN OUT WORKLOAD DRIVER [bench args] — Sluice alone; perf record --call-graph dwarf
# for 10 s of the measured phase, and the broker's threads' CPU over 60 s (/proc) beside it.
cd /work/main
BIN=$1; OUT=$2; W=$3; D=$4; shift 4
rm -rf $OUT; mkdir -p $OUT
sync; echo 3 > /proc/sys/vm/drop_caches
SLUICE_METRICS_LISTEN=127.0.0.1:9644 $BIN bench --start-sluice -d $D $W --output-dir $OUT "$@" > $OUT/bench.log 2>&1 &
BP=$!
sleep 60
P=$(pgrep -f "$BIN serve" | head -1)
curl -s 127.0.0.1:9644/metrics > $OUT/metrics-60s.txt
for t in /proc/$P/task/*; do echo "$(cat $t/comm) $(awk '{print $14+$15}' $t/stat)"; done > $OUT/threads-60s.txt
sleep 60
curl -s 127.0.0.1:9644/metrics > $OUT/metrics-120s.txt
for t in /proc/$P/task/*; do echo "$(cat $t/comm) $(awk '{print $14+$15}' $t/stat)"; done > $OUT/threads-120s.txt
if [ -n "$PERF" ]; then
  perf record -F 1999 --call-graph dwarf -p $P -o /tmp/perf-$(basename $OUT).data -- sleep 10 > $OUT/perf.log 2>&1
fi
wait $BP
grep -iE 'p99|Pub rate|cpu|rss' $OUT/bench.log | tail -8
