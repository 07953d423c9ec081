"""A/B of the fp8-products seesaw's V transpose: `stmatrix` (the tree's: convert_layout then store) or
`blocked` (4 x 8-byte blocks stored as they were loaded). Graphed step and attention, us."""
import json, sys
import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from mla_dcp import bench
from mla_dcp.ops.gluon_kernels import seesaw
from mla_dcp.ops.gluon_kernels.helpers import warps_barrier
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared


@gluon.jit
def _blocked(src, dst, n_valid, GUARD: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([4, 8], [4, 8], [4, 1], [1, 0])
    ROWS: gl.constexpr = src.shape[0]
    for c in gl.static_range(src.shape[1] // 64):
        x = src.slice(c * 64, 64, dim=1).load(layout)
        if GUARD:
            toks = gl.arange(0, ROWS, gl.SliceLayout(1, layout))
            keep = (toks[:, None] < n_valid) & (gl.abs(x.to(gl.float32)) < float("inf"))
            x = gl.where(keep, x, gl.zeros_like(x))
        dst.slice(c * 64, 64, dim=0).store(gl.permute(x, [1, 0]))
    fence_async_shared()
    warps_barrier()


variant = sys.argv[1]
if variant == "blocked":
    seesaw._transpose_values = _blocked
rows = {}
for name, fp8p in (("C2", True), ("R5", True), ("C5f8", True), ("C3f8", True), ("C2", False), ("C1", False)):
    case = bench.make_case(name, torch.bfloat16, fp8_products=fp8p)
    step = bench.time_fn(bench._rotating(bench._graphed(bench.step_fns(case)))) * 1e6
    attn = bench.time_fn(bench._rotating(bench._graphed(bench.attention_fns(case)))) * 1e6
    rows[f"{name}{'+p' if fp8p else ''}"] = (round(step, 1), round(attn, 1))
print(variant, json.dumps(rows), flush=True)
