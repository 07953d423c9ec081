"""One verify call (all stages) for compute-sanitizer: `python scripts/sanitize_one.py bf16|fp8 [tma|narrow|products] [block=N]`.

With `tma`, the attention runs on the Triton descriptor kernel instead of
the plan's choice (on sm_90: the seesaw Gluon kernel, bf16 and e4m3), to compare reports;
with `narrow`, 16 heads x 2 verify rows on ops/gluon_kernels/narrow.py's kernel (sm_90);
with `products` (fp8 only), VerifyConfig(fp8_products=True): on sm_90 the seesaw's fp8-products build;
``block=16``: 16-token cache blocks (four TMA boxes per tile part)."""

import dataclasses
import sys

import torch

import mla_dcp
from mla_dcp.testing import make_problem, merge_partials, platform_fp8, run_ranks

kind = sys.argv[1] if len(sys.argv) > 1 else "bf16"
block = int(next((a.split("=")[1] for a in sys.argv[2:] if a.startswith("block=")), 64))
mode = [a for a in sys.argv[2:] if not a.startswith("block=")]
narrow = mode == ["narrow"]
problem = make_problem([0, 3, 1000, 3000], qlen=2 if narrow else 3, num_heads=16 if narrow else 128,
                       kv_lora_rank=512, rope_dim=64, world=2,
                       interleave=1, block_size=block, max_model_len=4096, dtype=torch.bfloat16,
                       kv_dtype=platform_fp8() if kind == "fp8" else torch.bfloat16, device="cuda")
if mode == ["products"]:
    problem.shards = [dataclasses.replace(shard, cfg=dataclasses.replace(shard.cfg, fp8_products=True))
                      for shard in problem.shards]
    out, lse = merge_partials(run_ranks(problem)[0])
elif mode == ["tma"]:
    from mla_dcp.ops import tiles

    with tiles.forced_plan(tiles.AttentionPlan(64, 64, 8, 2, tma=True)):
        out, lse = merge_partials(run_ranks(problem)[0])
elif narrow:
    from mla_dcp.ops import tiles

    with tiles.forced_plan(tiles.AttentionPlan(32, 64, 4, 2, narrow=True)):
        out, lse = merge_partials(run_ranks(problem)[0])
else:
    out, lse = merge_partials(run_ranks(problem)[0])
torch.cuda.synchronize()
print(kind, "verify ran:", tuple(out.shape), "finite lse rows:", int(lse.isfinite().any(-1).sum()))
