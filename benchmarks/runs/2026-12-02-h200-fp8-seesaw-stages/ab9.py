"""Where the fp8-products seesaw's time goes: the committed build against copies with a stage
removed (results wrong, times only): `no_transpose` (V^T never written), `no_rope` (the scores
skip the rope product and its wait)."""
import json, sys
import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, warpgroup_mma, warpgroup_mma_wait
from mla_dcp import bench
from mla_dcp.ops.gluon_kernels import seesaw
from mla_dcp.ops.gluon_kernels.helpers import warps_barrier


@gluon.jit
def _no_transpose(src, dst, n_valid, GUARD: gl.constexpr):
    fence_async_shared()
    warps_barrier()


@gluon.jit
def _scores_no_rope(q_own, q_other, q_rope, k_own, k_other, k_rope, bar_own, bar_other, bar_rope, phase, rope_desc,
                    vt_own, n_valid, guard, v_next, vt_next, bar_next, n_next, guard_next, NEXT: gl.constexpr,
                    lat_unscale, s_layout: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    s8_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, BLOCK_N, 32])
    s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s8_layout)
    mbarrier.wait(bar_own, phase)
    s = warpgroup_mma(q_own, k_own.permute((1, 0)), s, use_acc=False, is_async=True)
    mbarrier.wait(bar_other, phase)
    s = warpgroup_mma(q_other, k_other.permute((1, 0)), s, is_async=True)
    seesaw._values_transposed(k_own, vt_own, n_valid, guard)
    if NEXT:
        mbarrier.wait(bar_next, phase)
        seesaw._values_transposed(v_next, vt_next, n_next, guard_next)
    mbarrier.wait(bar_rope, phase)
    s = warpgroup_mma_wait(0, deps=(s,))
    return gl.convert_layout(s * gl.convert_layout(lat_unscale, gl.SliceLayout(1, s8_layout))[:, None], s_layout)


if __name__ == "__main__":
    variant = sys.argv[1]
    if variant == "no_transpose":
        seesaw._transpose_values = _no_transpose
    elif variant == "no_rope":
        seesaw._scores_e4m3 = _scores_no_rope
    rows = {}
    for name, fp8p in (("C2", True), ("C5f8", True)):
        case = bench.make_case(name, torch.bfloat16, fp8_products=fp8p)
        attn = bench.time_fn(bench._rotating(bench._graphed(bench.attention_fns(case)))) * 1e6
        rows[f"{name}{'+p' if fp8p else ''}"] = round(attn, 1)
    print(variant, json.dumps(rows), flush=True)
