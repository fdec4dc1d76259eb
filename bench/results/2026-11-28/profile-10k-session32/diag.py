import sys,re,os,glob
d=sys.argv[1]
files=sorted(glob.glob(d+'/s/*.txt'),key=lambda f:int(os.path.basename(f)[:-4]))
prev=None;t0=None
def parse(f):
    m={'b':{},'task':{},'vm':{}}
    for l in open(f):
        l=l.strip()
        if l.startswith('T '): m['t']=float(l[2:])
        elif l.startswith('task '):
            p=l.split()
            if len(p)>=3 and p[2].isdigit(): m['task'][p[1]]=m['task'].get(p[1],0)+int(p[2])
        elif ' vda ' in l:
            p=l.split(); m['disk']=list(map(int,p[3:]))
        elif l.startswith('sluice_'):
            k,v=l.rsplit(' ',1); m['b'][k]=float(v)
        elif l:
            k,v=l.split(); m['vm'][k]=int(v)
    return m
def maxbucket(a,b,prefix):
    # highest le bucket with increments beyond previous bucket
    items=[(k,b[k]-a.get(k,0)) for k in b if k.startswith(prefix) and 'le=' in k]
    les=[]
    for k,v in items:
        le=re.search(r'le="([^"]+)"',k).group(1)
        les.append((float('inf') if le=='+Inf' else float(le),v))
    les.sort()
    mx=0;last=0
    for le,v in les:
        if v>last: mx=le
        last=v
    return mx,last
for f in files:
    m=parse(f)
    if 't' not in m: continue
    if prev and 'disk' in m and 'disk' in prev:
        if t0 is None: t0=prev['t']
        fs=maxbucket(prev['b'],m['b'],'sluice_fsync_duration_seconds_bucket')
        pr=maxbucket(prev['b'],m['b'],'sluice_request_duration_seconds_bucket')
        dd=[x-y for x,y in zip(m['disk'],prev['disk'])]
        # diskstats: 0 reads 1 rmerged 2 rsect 3 rms 4 writes 5 wmerged 6 wsect 7 wms 8 inflight 9 ioms 10 weighted ... 14 flushes? 
        fl = (dd[15], dd[16]) if len(dd)>16 else 0
        wal=m['task'].get('sluice-wal',0)-prev['task'].get('sluice-wal',0)
        io=m['task'].get('sluice-io',0)-prev['task'].get('sluice-io',0)
        print(f"{m['t']-t0:6.1f}s fsync_max<={fs[0]*1000:7.2f}ms n={fs[1]:5.0f} produce_max<={pr[0]*1000:7.1f}ms  disk w={dd[4]:5d} wMB={dd[6]/2048:6.1f} wms={dd[7]:6d} flush={fl} dirtyMB={m['vm'].get('nr_dirty',0)*4/1024:6.1f} wbMB={m['vm'].get('nr_writeback',0)*4/1024:5.1f} io={io} wal={wal}")
    prev=m
