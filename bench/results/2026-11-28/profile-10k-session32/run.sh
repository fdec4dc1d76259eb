#!/bin/bash
# usage: run10k.sh OUTDIR  (Sluice-only 10k run, metrics scraped at +60s and +120s)
cd /work/main
OUT=$1; rm -rf $OUT; mkdir -p $OUT
sync; echo 3 > /proc/sys/vm/drop_caches
SLUICE_LOG_WAL_ROUND_INTERVAL_US=${IV:-1000} SLUICE_METRICS_LISTEN=127.0.0.1:9644 ${BIN:-./target/release/sluice} bench --start-sluice -d ${D:-bench/local/drivers/local-latency.yaml} ${W:-bench/local/workloads/local-1-topic-100-partitions-1kb-4p-4c-10k.yaml} --output-dir $OUT > $OUT/bench.log 2>&1 &
BP=$!
sleep 60; curl -s 127.0.0.1:9644/metrics > $OUT/m1.txt; cat /proc/stat | head -1 > $OUT/cpu1.txt
P=$(pgrep -f 'sluice serve' | head -1); cat /proc/$P/stat | awk '{print $14, $15}' > $OUT/bcpu1.txt; for t in /proc/$P/task/*; do c=$(cat $t/comm 2>/dev/null) && v=$(awk '{print $14+$15}' $t/stat 2>/dev/null) && [ -n "$v" ] && echo "$c $v"; done > $OUT/t1.txt
sleep 60; curl -s 127.0.0.1:9644/metrics > $OUT/m2.txt; cat /proc/$P/stat | awk '{print $14, $15}' > $OUT/bcpu2.txt; for t in /proc/$P/task/*; do c=$(cat $t/comm 2>/dev/null) && v=$(awk '{print $14+$15}' $t/stat 2>/dev/null) && [ -n "$v" ] && echo "$c $v"; done > $OUT/t2.txt
sleep 3; perf stat -e 'syscalls:sys_enter_writev,syscalls:sys_enter_recvfrom,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_futex,syscalls:sys_enter_write,syscalls:sys_enter_sendfile64,syscalls:sys_enter_pwrite64,syscalls:sys_enter_fdatasync' -p $P -o $OUT/sys.txt -- sleep 20
wait $BP
python3 - $OUT <<'PY'
import sys,re
d=sys.argv[1]
def load(f):
    m={}
    for l in open(f):
        if l.startswith('#') or not l.strip(): continue
        k,v=l.rsplit(' ',1)
        try: m[k]=float(v)
        except: pass
    return m
a=load(d+'/m1.txt'); b=load(d+'/m2.txt')
for k in sorted(b):
    if ('requests' in k or 'fsync_duration_seconds_count' in k or 'fsync_duration_seconds_sum' in k or 'produce_bytes' in k or 'produce_records' in k) and b[k]-a.get(k,0)>0:
        print(f"{k}: {(b[k]-a.get(k,0))/60:.1f}/s")
u1,s1=map(int,open(d+'/bcpu1.txt').read().split()); u2,s2=map(int,open(d+'/bcpu2.txt').read().split())
import collections
def th(f):
    c=collections.Counter()
    for l in open(f):
        n,v=l.rsplit(' ',1); c[n]+=int(v)
    return c
t1=th(d+'/t1.txt'); t2=th(d+'/t2.txt')
print('threads:', ', '.join(f"{k} {(t2[k]-t1.get(k,0))/6000:.3f}" for k in sorted(t2, key=lambda k: -(t2[k]-t1.get(k,0))) if t2[k]-t1.get(k,0)>0))
print(f"broker cpu: user {(u2-u1)/6000:.3f} sys {(s2-s1)/6000:.3f} cores")
PY
grep -iE 'p99|Pub rate' $OUT/bench.log | tail -5; grep syscalls $OUT/sys.txt
