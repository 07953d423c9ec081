"""Per-kernel device time of one verify step (eager, profiled), ragged and uniform configs.
python prof.py NAME=q:H:lens[:fp8] ..."""
import json, sys, collections
import torch
sys.path.insert(0, "gpu_run")
from ab2 import case
from torch.profiler import profile, ProfilerActivity

res = {}
for spec in sys.argv[1:]:
    name, rest = spec.split("=")
    parts = rest.split(":")
    qlen, heads, lengths = int(parts[0]), int(parts[1]), [int(x) for x in parts[2].split(",")]
    fns, _, _ = case(qlen, heads, lengths, len(parts) > 3)
    for f in fns[:2]:
        f(); f()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(10):
            fns[0]()
        torch.cuda.synchronize()
    agg = collections.defaultdict(float)
    for e in p.key_averages():
        if e.device_type.name == "CUDA" or getattr(e, "self_device_time_total", 0):
            t = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
            if t:
                agg[e.key[:60]] += t / 10
    res[name] = {k: round(v, 2) for k, v in sorted(agg.items(), key=lambda kv: -kv[1])}
    del fns
    torch.cuda.empty_cache()
print(json.dumps(res, indent=1))
