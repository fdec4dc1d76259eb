#!/bin/bash
# Sluice-only 10k run; metrics + diskstats + vmstat + thread CPU every 2 s
cd /work/main
OUT=$1; rm -rf $OUT; mkdir -p $OUT/s
sync; echo 3 > /proc/sys/vm/drop_caches
SLUICE_METRICS_LISTEN=127.0.0.1:9644 ${BIN:-./target/release/sluice} bench --start-sluice -d bench/local/drivers/local-latency.yaml bench/local/workloads/local-1-topic-100-partitions-1kb-4p-4c-10k.yaml --output-dir $OUT > $OUT/bench.log 2>&1 &
BP=$!
sleep 3
P=$(pgrep -f ' serve ' | head -1)
tail -n +1 -f /proc/$P/fd/2 > $OUT/sluice.log 2>/dev/null &
TP=$!
i=0
while kill -0 $BP 2>/dev/null; do
  t=$(date +%s.%N)
  { echo "T $t"; curl -s 127.0.0.1:9644/metrics | grep -E "request_duration_seconds_(bucket|count)\{.*api=\"Produce\"|fsync_duration_seconds_(bucket|count)"; grep -E " vda " /proc/diskstats; grep -E "^nr_dirty |^nr_writeback |^pgmajfault|^allocstall|^compact_stall|^pgscan" /proc/vmstat; for tk in /proc/$P/task/*; do echo "task $(cat $tk/comm 2>/dev/null) $(awk '{print $14+$15}' $tk/stat 2>/dev/null)"; done; } > $OUT/s/$i.txt 2>/dev/null
  i=$((i+1)); sleep 2
done
kill $TP 2>/dev/null
