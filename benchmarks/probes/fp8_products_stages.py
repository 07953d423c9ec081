"""Where the fp8-products seesaw's time goes: its attention beside copies with one stage removed.

    python benchmarks/probes/fp8_products_stages.py OUT_DIR [C2,C5f8] [base,no_transpose,no_rope]

On an H200: each variant in its own process (the patch must precede the kernel's first build),
the attention kernel alone under a CUDA graph (``bench.attention_fns``) on the e4m3 configs with
``VerifyConfig(fp8_products=True)``. The variants' results are wrong; only their times count:

- ``no_transpose``: V^T is never written (``seesaw._transpose_values`` does nothing);
- ``no_rope``: the scores skip the rope product and the wait before it (``seesaw._scores_e4m3``).

Prints a table and writes OUT_DIR/fp8_products_stages.json.
"""
import json
import pathlib
import subprocess
import sys

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                                warpgroup_mma_wait)

from mla_dcp.ops.gluon_kernels import seesaw
from mla_dcp.ops.gluon_kernels.helpers import warps_barrier


@gluon.jit
def no_transpose(src, dst, n_valid, GUARD: gl.constexpr):
    fence_async_shared()
    warps_barrier()


@gluon.jit
def scores_no_rope(q_own, q_other, q_rope, k_own, k_other, k_rope, bar_own, bar_other, bar_rope, phase, rope_desc,
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


# Variant -> (seesaw's function replaced, replacement).
VARIANTS = {"base": None, "no_transpose": ("_transpose_values", no_transpose),
            "no_rope": ("_scores_e4m3", scores_no_rope)}


def apply(variant: str) -> None:
    patch = VARIANTS[variant]
    if patch is not None:
        setattr(seesaw, patch[0], patch[1])


def time_variant(variant: str, configs: list[str]) -> dict:
    import torch

    from mla_dcp import bench

    apply(variant)
    rows = {}
    for name in configs:
        case = bench.make_case(name, torch.bfloat16, fp8_products=True)
        rows[name] = bench.time_fn(bench._rotating(bench._graphed(bench.attention_fns(case)))) * 1e6
    return rows


def main() -> None:
    if sys.argv[1] == "--one":
        print(json.dumps(time_variant(sys.argv[2], sys.argv[3].split(","))))
        return
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    configs = (sys.argv[2] if len(sys.argv) > 2 else "C2,C5f8").split(",")
    variants = (sys.argv[3] if len(sys.argv) > 3 else ",".join(VARIANTS)).split(",")
    result = {}
    for variant in variants:
        run = subprocess.run([sys.executable, __file__, "--one", variant, ",".join(configs)], capture_output=True,
                             text=True, check=True)
        result[variant] = json.loads(run.stdout.strip().splitlines()[-1])
        print(variant, " ".join(f"{name} {us:.1f} us" for name, us in result[variant].items()), flush=True)
    (out / "fp8_products_stages.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
