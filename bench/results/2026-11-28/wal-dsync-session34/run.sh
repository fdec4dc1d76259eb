#!/bin/bash
# usage: run.sh OUTDIR  (Sluice-only run at 10k msg/s; the broker's and its threads' CPU and
# its metrics read 25 s and 75 s after the start: 50 s of the measured phase). Env: BIN, W, D.
cd /work/main
OUT=$1; rm -rf $OUT; mkdir -p $OUT
sync; echo 3 > /proc/sys/vm/drop_caches
SLUICE_METRICS_LISTEN=127.0.0.1:9644 ${BIN:-./target/release/sluice} bench --start-sluice --warmup-duration-seconds 20 --test-duration-seconds 65 -d ${D:-bench/local/drivers/local-latency.yaml} ${W:-bench/local/workloads/local-1-topic-100-partitions-1kb-4p-4c-10k.yaml} --output-dir $OUT > $OUT/bench.log 2>&1 &
BP=$!
sleep 25
P=$(pgrep -f ' serve ' | head -1)
snap() {
  cat /proc/$P/stat | awk '{print $14, $15}' > $OUT/bcpu$1.txt; curl -s 127.0.0.1:9644/metrics > $OUT/m$1.txt
  for t in /proc/$P/task/*; do c=$(cat $t/comm 2>/dev/null) && v=$(awk '{print $14+$15}' $t/stat 2>/dev/null) && [ -n "$v" ] && echo "$c $v"; done > $OUT/t$1.txt
  grep -E 'voluntary_ctxt_switches' /proc/$P/status > $OUT/ctx$1.txt
}
snap 1
sleep 50
snap 2
wait $BP
python3 - $OUT <<'PY'
import sys,collections
d=sys.argv[1]; W=50
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
u1,s1=map(int,open(d+'/bcpu1.txt').read().split()); u2,s2=map(int,open(d+'/bcpu2.txt').read().split())
def th(f):
    c=collections.Counter()
    for l in open(f):
        n,v=l.rsplit(' ',1); c[n]+=int(v)
    return c
t1=th(d+'/t1.txt'); t2=th(d+'/t2.txt')
cores=((u2-u1)+(s2-s1))/(W*100)
print(f"produce MiB/s {pb/W/2**20:.2f}; broker cores {cores:.3f} (user {(u2-u1)/(W*100):.3f} sys {(s2-s1)/(W*100):.3f}); cpu s/GiB {cores/(pb/W/2**30) if pb else 0:.1f}")
print('threads:', ', '.join(f"{k} {(t2[k]-t1.get(k,0))/(W*100):.3f}" for k in sorted(t2, key=lambda k: -(t2[k]-t1.get(k,0))) if t2[k]-t1.get(k,0)>0))
PY
grep -E 'Aggregated Pub' $OUT/bench.log | tail -1
