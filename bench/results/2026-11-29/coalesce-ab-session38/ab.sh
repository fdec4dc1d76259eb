#!/bin/bash
# usage: ab.sh BIN OUT WORKLOAD DRIVER — Sluice alone: threads' CPU over 40 s, syscalls over 10 s, bench JSON
cd /work/main
BIN=$1; OUT=$2; W=$3; D=$4; shift 4
rm -rf $OUT; mkdir -p $OUT
sync; echo 3 > /proc/sys/vm/drop_caches
SLUICE_METRICS_LISTEN=127.0.0.1:9644 $BIN bench --start-sluice -d $D $W --output-dir $OUT --warmup-duration-seconds 20 --test-duration-seconds 70 "$@" > $OUT/bench.log 2>&1 &
BP=$!
sleep 30
P=$(pgrep -f "$BIN serve" | head -1)
B=$(awk '{print $14+$15}' /proc/$BP/stat)
for t in /proc/$P/task/*; do echo "$(cat $t/comm) $(awk '{print $14+$15}' $t/stat)"; done > $OUT/threads-a.txt
sleep 40
for t in /proc/$P/task/*; do echo "$(cat $t/comm) $(awk '{print $14+$15}' $t/stat)"; done > $OUT/threads-b.txt
B2=$(awk '{print $14+$15}' /proc/$BP/stat)
echo "bench_cores $(( (B2-B) ))" | awk '{printf "clients %.3f cores\n", $2/4000}' > $OUT/cores.txt
paste $OUT/threads-a.txt $OUT/threads-b.txt | awk '{d=$4-$2; s+=d} END {printf "broker %.3f cores\n", s/4000}' >> $OUT/cores.txt
perf stat -e 'syscalls:sys_enter_writev,syscalls:sys_enter_recvfrom,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_futex' -p $P -- sleep 10 2> $OUT/syscalls.txt
wait $BP
cat $OUT/cores.txt; grep syscalls $OUT/syscalls.txt
