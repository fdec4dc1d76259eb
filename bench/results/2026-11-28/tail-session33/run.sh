#!/bin/bash
# usage: prof.sh OUTDIR  (Sluice-only run, perf at +30s for 10s, cpu scrape +25..+55)
cd /work/main
OUT=$1; rm -rf $OUT; mkdir -p $OUT
sync; echo 3 > /proc/sys/vm/drop_caches
SLUICE_METRICS_LISTEN=127.0.0.1:9644 ${BIN:-./target/release/sluice} bench --start-sluice -d ${D:-bench/local/drivers/local-throughput.yaml} ${W:-bench/local/workloads/local-1-topic-100-partitions-1kb-4p-4c-200k.yaml} --output-dir $OUT > $OUT/bench.log 2>&1 &
BP=$!
sleep 25
P=$(pgrep -f ' serve ' | head -1)
cat /proc/$P/stat | awk '{print $14, $15}' > $OUT/bcpu1.txt; curl -s 127.0.0.1:9644/metrics > $OUT/m1.txt
for t in /proc/$P/task/*; do c=$(cat $t/comm 2>/dev/null) && v=$(awk '{print $14+$15}' $t/stat 2>/dev/null) && [ -n "$v" ] && echo "$c $v"; done > $OUT/t1.txt
if [ -n "$PERF" ]; then perf record -F 499 -g -p $P -o $OUT/perf.data -- sleep 10 > /dev/null 2>&1; sleep 20; else sleep 30; fi
cat /proc/$P/stat | awk '{print $14, $15}' > $OUT/bcpu2.txt; curl -s 127.0.0.1:9644/metrics > $OUT/m2.txt
for t in /proc/$P/task/*; do c=$(cat $t/comm 2>/dev/null) && v=$(awk '{print $14+$15}' $t/stat 2>/dev/null) && [ -n "$v" ] && echo "$c $v"; done > $OUT/t2.txt
wait $BP
python3 - $OUT <<'PY'
import sys,collections
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
pb=sum(b[k]-a.get(k,0) for k in b if k.startswith('sluice_produce_bytes_total'))
print(f"produce MiB/s {pb/30/2**20:.1f}")
u1,s1=map(int,open(d+'/bcpu1.txt').read().split()); u2,s2=map(int,open(d+'/bcpu2.txt').read().split())
def th(f):
    c=collections.Counter()
    for l in open(f):
        n,v=l.rsplit(' ',1); c[n]+=int(v)
    return c
t1=th(d+'/t1.txt'); t2=th(d+'/t2.txt')
print('threads:', ', '.join(f"{k} {(t2[k]-t1.get(k,0))/3000:.3f}" for k in sorted(t2, key=lambda k: -(t2[k]-t1.get(k,0))) if t2[k]-t1.get(k,0)>0))
cores=((u2-u1)+(s2-s1))/3000
print(f"broker cpu: user {(u2-u1)/3000:.3f} sys {(s2-s1)/3000:.3f} cores; cpu s/GiB {cores/(pb/30/2**30) if pb else 0:.2f}")
PY
grep -iE 'Aggregated|Pub rate' $OUT/bench.log | tail -3
