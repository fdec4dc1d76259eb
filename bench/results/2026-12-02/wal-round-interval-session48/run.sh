#!/bin/bash
# prof.sh TAG [serve args]: Sluice alone at 10k msg/s (30 s warm-up + 60 s); perf of the broker for 20 s in the middle
TAG=$1; shift
SL=${SLUICE:-/work/main/target/release/sluice}
D=/tmp/exp/data-$TAG; rm -rf $D; mkdir -p $D
sync; echo 3 > /proc/sys/vm/drop_caches
$SL serve --data-dir $D --listen 127.0.0.1:9192 --metrics-listen 127.0.0.1:9193 --group-initial-rebalance-delay-ms 0 "$@" > /tmp/exp/serve-$TAG.log 2>&1 &
SP=$!
sleep 2
[ -n "$PERF" ] && ( sleep 50; perf record -F 1999 -g -p $SP -o /tmp/exp/perf-$TAG.data -- sleep 20 > /dev/null 2>&1; grep -E "^(voluntary|nonvoluntary)" /proc/$SP/status > /tmp/exp/ctx-$TAG.txt ) &
$SL bench --bootstrap 127.0.0.1:9192 --broker-pid $SP --producer-rate 10000 --warmup-duration-seconds 30 --test-duration-seconds 60 --sample-period-seconds 10 /work/main/bench/local/workloads/local-1-topic-100-partitions-1kb-4p-4c-10k.yaml -d /work/main/bench/local/drivers/local-latency.yaml --output /tmp/exp/res-$TAG.json > /tmp/exp/bench-$TAG.log 2>&1
curl -s 127.0.0.1:9193/metrics | grep -E "^sluice_requests_total" > /tmp/exp/reqs-$TAG.txt
kill $SP; wait $SP
rm -rf $D
grep "Aggregated Pub" /tmp/exp/bench-$TAG.log | tail -1 | cut -c1-120
python3 -c "
import json;d=json.load(open('/tmp/exp/res-$TAG.json'));s=d['sluice'];print({k:s[k] for k in s if 'cpu' in k.lower() or 'Cpu' in k})" 2>/dev/null
