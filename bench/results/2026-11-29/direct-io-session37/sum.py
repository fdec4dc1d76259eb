import json,glob,sys
for d in sys.argv[1:]:
    for f in sorted(glob.glob(d+'/*.json')):
        j=json.load(open(f)); s=j.get('sluice') or j.get('kafka') or {}
        print(f"{d.split('/')[-1]:28s} p50 {j['aggregatedPublishLatency50pct']:.2f} p99 {j['aggregatedPublishLatency99pct']:.2f} p99.9 {j['aggregatedPublishLatency999pct']:.2f} cpu/GiB {s.get('brokerCpuSecondsPerGb',0):.2f} rss {s.get('brokerPeakRssBytes',0)/2**20:.0f}MiB cli {s.get('clientCpuSeconds',0)/s.get('measuredSeconds',1):.2f} busy {s.get('machineBusyCores',0):.2f} steal {s.get('machineStealCores',0):.3f}")
