"""C2/C1 attention alone, graphed: seesaw (exact), Triton TMA kernel forced (exact), Triton TMA fp8 products."""
import dataclasses, json, sys
import torch
from mla_dcp import bench
from mla_dcp.ops import tiles
plan = tiles.AttentionPlan(block_m=64, block_n=64, num_warps=8, num_stages=2, tma=True)
out = {"ceilings": bench.measure_ceilings()}
for name in sys.argv[1:]:
    for label, fp8p, forced in (("default", False, False), ("triton_tma_exact", False, True), ("fp8_products", True, False)):
        if fp8p and name in ("C1",):
            continue
        case = bench.make_case(name, torch.bfloat16, fp8_products=fp8p)
        fns = bench.attention_fns(case)
        if forced:
            with tiles.forced_plan(plan):
                t = bench.time_fn(bench._rotating(bench._graphed(fns))) * 1e6
        else:
            t = bench.time_fn(bench._rotating(bench._graphed(fns))) * 1e6
        out[f"{name} {label}"] = round(t, 1)
        print(name, label, round(t, 1), flush=True)
        del case, fns; torch.cuda.empty_cache()
print(json.dumps(out))
