import os,time,resource,sys
def run(name, size=1<<20, total=1<<30):
    fn='/tmp/exp/wtest.bin'
    fd=os.open(fn, os.O_WRONLY|os.O_CREAT|os.O_TRUNC)
    buf=os.urandom(size)
    r0=resource.getrusage(resource.RUSAGE_SELF); t0=time.time()
    off=0
    while off<total:
        os.pwrite(fd, buf, off); off+=size
    r1=resource.getrusage(resource.RUSAGE_SELF); t1=time.time()
    print(f"{name}: {(r1.ru_stime-r0.ru_stime)/(total/2**30):.3f} sys s/GiB wall {t1-t0:.2f}s", flush=True)
    os.close(fd); os.unlink(fn)
for step in sys.argv[1:]:
    if step.startswith('sleep'): time.sleep(float(step[5:]))
    elif step=='drop': os.system('sync; echo 3 > /proc/sys/vm/drop_caches')
    else: run(step)
