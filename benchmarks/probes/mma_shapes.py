"""Throughput of the fp8 V products' wgmma shapes, on one H200.

    python benchmarks/probes/mma_shapes.py OUT_DIR     (GPU: TFLOP/s of each shape)
    python benchmarks/probes/mma_shapes.py --compile   (CPU: builds each for sm_90, prints its wgmma)

The same 64 x 256 x 64 e4m3 product (one V half times one tile's probabilities)
three ways, in a loop of CHAIN asynchronous wgmma and a wait, as the seesaw
issues them: mode 0, P @ V^T as one m64n256k32 a K step with both operands
in shared memory (the fp8-products build); mode 1, acc^T = V^T P^T as four
m64n64k32 a K step with V^T from registers (the transposed build,
docs/performance.md); mode 2, the same four from shared memory. One or two
programs of one warpgroup per multiprocessor. Writes OUT_DIR/mma_shapes.json.
"""
import json
import pathlib
import sys

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
from mla_dcp.ops.gluon_kernels.helpers import warps_barrier  # noqa: E402  (gl.barrier, or Triton 3.6's name)

SIGNATURE = {"x_ptr": "*fp32", "out_ptr": "*fp32", "ITERS": "constexpr", "MODE": "constexpr", "CHAIN": "constexpr"}


@gluon.jit
def shapes_kernel(x_ptr, out_ptr, ITERS: gl.constexpr, MODE: gl.constexpr, CHAIN: gl.constexpr):
    g2: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])
    p_s = gl.allocate_shared_memory(gl.float8e4nv, [64, 64],
                                    gl.NVMMASharedLayout.get_default_for([64, 64], gl.float8e4nv))
    v_s = gl.allocate_shared_memory(gl.float8e4nv, [256, 64],
                                    gl.NVMMASharedLayout.get_default_for([256, 64], gl.float8e4nv))
    r = gl.arange(0, 64, gl.SliceLayout(1, g2))
    r2 = gl.arange(0, 256, gl.SliceLayout(1, g2))
    c = gl.arange(0, 64, gl.SliceLayout(0, g2))
    p_s.store(gl.load(x_ptr + r[:, None] * 64 + c[None, :]).to(gl.float8e4nv))
    v_s.store(gl.load(x_ptr + r2[:, None] * 64 + c[None, :]).to(gl.float8e4nv))
    fence_async_shared()
    warps_barrier()
    # The operands and accumulator of each mode; one loop multiplies them.
    if MODE == 0:
        layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, 256, 32])
        a, b = p_s, v_s.permute((1, 0))
        acc = gl.zeros([64, 256], gl.float32, layout)
    else:
        layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, 64, 32])
        a, b = v_s, p_s.permute((1, 0))
        if MODE == 1:
            a = v_s.load(gl.DotOperandLayout(0, layout, 4))
        acc = gl.zeros([256, 64], gl.float32, layout)
    for i in range(ITERS):
        for j in gl.static_range(CHAIN):
            acc = warpgroup_mma(a, b, acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(acc,))
    gl.store(out_ptr + gl.program_id(0), gl.max(gl.max(acc, axis=1), axis=0))


def compiled_shapes() -> dict:
    """Each mode's wgmma instructions in its sm_90 PTX, built without a GPU."""
    import re
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    shapes = {}
    for mode in (0, 1, 2):
        k = triton.compile(GluonASTSource(shapes_kernel, SIGNATURE, {"ITERS": 8, "MODE": mode, "CHAIN": 2}, {}),
                           target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
        shapes[mode] = sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", k.asm["ptx"])))
    return shapes


def main(out: pathlib.Path) -> None:
    import torch

    out.mkdir(parents=True, exist_ok=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    x = torch.randn(256 * 64, device="cuda") * 0.1
    iters, result = 4000, {}
    for chain in (1, 2):
        for per_sm in (1, 2):
            grid = (sms * per_sm,)
            o = torch.empty(grid[0], device="cuda")
            for mode in (0, 1, 2):
                shapes_kernel[grid](x, o, ITERS=10, MODE=mode, CHAIN=chain, num_warps=4)
                torch.cuda.synchronize()
                best = float("inf")
                for _ in range(5):
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    shapes_kernel[grid](x, o, ITERS=iters, MODE=mode, CHAIN=chain, num_warps=4)
                    end.record()
                    torch.cuda.synchronize()
                    best = min(best, start.elapsed_time(end) * 1e-3)
                rate = 2 * 64 * 256 * 64 * chain * iters * grid[0] / best / 1e12
                label = f"mode {mode}, chain {chain}, {per_sm} program(s) per SM"
                result[label] = round(rate, 1)
                print(f"{label}: {rate:.1f} TFLOP/s", flush=True)
    (out / "mma_shapes.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    if sys.argv[1:] == ["--compile"]:
        print(json.dumps({str(mode): shapes for mode, shapes in compiled_shapes().items()}))
    else:
        main(pathlib.Path(sys.argv[1]))
