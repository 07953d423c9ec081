"""Per-kernel device time of one verify step, PDL off (no overlap), and the attention kernel's registers/spills.
PYTHONPATH=TREE MLA_DCP_PDL=0 python prof2.py LABEL NAME=q:H:lens[:fp8] ..."""
import json, sys, collections
import torch
sys.path.insert(0, "gpu_run")
from ab2 import case
from torch.profiler import profile, ProfilerActivity
from mla_dcp.ops import launchers

res = {"label": sys.argv[1]}
for spec in sys.argv[2:]:
    name, rest = spec.split("=")
    parts = rest.split(":")
    qlen, heads, lengths = int(parts[0]), int(parts[1]), [int(x) for x in parts[2].split(",")]
    fns, _, _ = case(qlen, heads, lengths, len(parts) > 3)
    for f in fns[:2]:
        f(); f()
    torch.cuda.synchronize()
    k = launchers.last_attention_kernel
    info = {}
    for a in ("n_regs", "n_spills"):
        info[a] = getattr(k, a, None)
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(20):
            fns[0]()
        torch.cuda.synchronize()
    agg = collections.defaultdict(float)
    for e in p.key_averages():
        t = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
        if t:
            agg[e.key[:40]] += t / 20
    info.update({kk: round(v, 2) for kk, v in sorted(agg.items(), key=lambda kv: -kv[1])})
    res[name] = info
    del fns
    torch.cuda.empty_cache()
print(json.dumps(res))
