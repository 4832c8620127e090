"""Scratch (session 36): device time a call of the small copies and fills in an eager variant's Chrome trace
(`PROFILE_RUN=1` traces: <workload>__dohnuts-eager.json.gz, 3 profiled calls), each kernel attributed
to the CPU op that launched it. python3 benchmarks/maintainers/s36/trace_glue.py TRACE.json.gz"""
import gzip, json, collections, sys
t = json.load(gzip.open(sys.argv[1]))
ev = t['traceEvents'] if isinstance(t, dict) else t
kern = [e for e in ev if e.get('cat') in ('kernel', 'gpu_memset', 'gpu_memcpy')]
rt = {e['args'].get('correlation'): e for e in ev if e.get('cat') == 'cuda_runtime' and 'args' in e}
cpu = [e for e in ev if e.get('cat') == 'cpu_op']
bytid = collections.defaultdict(list)
for e in cpu: bytid[e['tid']].append(e)
def parent(r):
    best = [e for e in bytid[r['tid']] if e['ts'] <= r['ts'] and e['ts'] + e.get('dur', 0) >= r['ts'] + r.get('dur', 0)]
    best.sort(key=lambda e: e['ts'])
    return tuple(b['name'] for b in best)[-3:]
agg = collections.Counter(); dur = collections.Counter()
total = 0
for k in kern:
    total += k.get('dur', 0)
    n = k['name']
    if any(x in n for x in ('Fill', 'Memset', 'CatArray', 'Memcpy', 'elementwise_kernel<128', 'vectorized_elementwise')):
        r = rt.get(k['args'].get('correlation'))
        key = (n[:50], parent(r) if r else None)
        agg[key] += 1; dur[key] += k.get('dur', 0)
print(f"all kernels {total/3:.1f} us/call")
for key, c in sorted(agg.items(), key=lambda kv: -dur[kv[0]])[:8]:
    print(f"{dur[key]/3:8.1f} us/call {c//3:4d}/call", key)
