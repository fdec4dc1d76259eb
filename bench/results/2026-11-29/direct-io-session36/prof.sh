#!/bin/bash
# usage: prof.sh BIN OUT WORKLOAD DRIVER  — Sluice-only; perf record (flat) 15 s of the measured phase
cd /work/main
BIN=$1; OUT=$2; W=$3; D=$4; shift 4
rm -rf $OUT; mkdir -p $OUT
sync; echo 3 > /proc/sys/vm/drop_caches
$BIN bench --start-sluice -d $D $W --output-dir $OUT "$@" > $OUT/bench.log 2>&1 &
BP=$!
sleep 70
P=$(pgrep -f "$BIN serve" | head -1)
perf record -F 999 -p $P -o $OUT/perf.data -- sleep 15 > $OUT/perf.log 2>&1
wait $BP
perf report -i $OUT/perf.data --no-children --sort sym --stdio 2>/dev/null | grep -v '^#' | grep -v '^$' | head -60 > $OUT/flat.txt
perf report -i $OUT/perf.data --no-children --sort comm --stdio 2>/dev/null | grep -v '^#' | grep -v '^$' | head -10 > $OUT/threads.txt
