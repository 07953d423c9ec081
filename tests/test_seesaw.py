"""The Gluon kernel (ops/seesaw.py) on the CPU: it builds for sm_90 with the
installed Triton (no GPU needed: ptxas ships with Triton), within the
shared-memory limit, with wgmma and per-warpgroup register allotment; and the
launcher sends it only launches it fits. Its numerics run in tests/test_gpu.py."""

import pytest
import torch

gluon = pytest.importorskip("triton.experimental.gluon")
seesaw = pytest.importorskip("mla_dcp.ops.seesaw")

from mla_dcp.ops import launchers  # noqa: E402

H100_SHARED_LIMIT = 227 * 1024


@pytest.fixture(scope="module")
def compiled():
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    half = gl.NVMMASharedLayout.get_default_for([64, 256], gl.bfloat16)
    rope = gl.NVMMASharedLayout.get_default_for([64, 64], gl.bfloat16)
    sig = {"q_ptr": "*bf16", "kv_half_desc": f"tensordesc<bf16[64, 256],{half!r}>",
           "kv_rope_desc": f"tensordesc<bf16[64, 64],{rope!r}>", "row_lens_ptr": "*i32", "page_table_ptr": "*i32",
           "seg_out_ptr": "*fp32", "seg_max_ptr": "*fp32", "seg_sum_ptr": "*fp32", "out_ptr": "*bf16",
           "lse_ptr": "*fp32", "stride_q_row": "i32", "stride_q_head": "i32", "stride_page_b": "i32",
           "softmax_scale_log2": "fp32", "num_segments": "i32", "max_pages": "i32"}
    consts = dict(QLEN=3, H=128, DL=512, DR=64, PAGE=64, FINALIZE=False, BLOCK_M=64, BLOCK_N=64)
    sig.update({name: "constexpr" for name in consts})
    try:
        return triton.compile(GluonASTSource(seesaw.seesaw_attention_kernel, sig, consts),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    except RuntimeError as err:   # no ptxas for this platform
        pytest.skip(f"cannot compile for sm_90 here: {err}")


def test_builds_for_sm90_within_shared_memory(compiled):
    ptx = compiled.asm["ptx"]
    assert "wgmma.mma_async" in ptx
    # Two warpgroups in separate partitions, each with its own register budget.
    assert "setmaxnreg" in ptx
    assert compiled.metadata.shared <= H100_SHARED_LIMIT


def test_fits_only_16_bit_caches_without_scale_and_whole_tile_pages():
    q = torch.zeros(3, 16, 576, dtype=torch.bfloat16)
    kv = torch.zeros(4, 64, 576, dtype=torch.bfloat16)
    assert seesaw.fits(q, kv, None, 512, 64)
    assert not seesaw.fits(q, kv.to(torch.float8_e4m3fn), torch.ones(1), 512, 64)
    assert not seesaw.fits(q, kv, torch.ones(1), 512, 64)
    assert not seesaw.fits(q, kv, None, 512, 16)
    assert not seesaw.fits(q.float(), kv.float(), None, 512, 64)
    assert not seesaw.fits(torch.zeros(3, 16, 544, dtype=torch.bfloat16), kv[..., :544], None, 512, 64)


def test_launcher_never_sends_it_cpu_tensors():
    q = torch.zeros(3, 16, 576, dtype=torch.bfloat16)
    kv = torch.zeros(4, 64, 576, dtype=torch.bfloat16)
    assert not launchers._seesaw_fits(q, kv, None, 512, 64)
