"""Candidate (not in the package): 64 pairs per tile, transposed, for e4m3 caches (C2).

Compiled for sm_90 without a GPU; never run. See README.md here for the
commands that check and time it (`scripts/seesaw_probe.py` loads it as a
narrow-kernel variant: `NARROW_VARIANT=benchmarks/candidates/halves.py`,
kernel name `var-narrow64`).

Why: ops/narrow.py converts an e4m3 tile in registers on its way to wgmma
(the tile is A of both transposed products), but at 16 or 32 pairs per
tile; C2 (B32 q3 H128) then reads its cache 12 times and converts it 12
times (NOTES: 2.2x C1). At 64 pairs the O^T accumulator (512 x 64 fp32) no
longer fits one warpgroup, so two warpgroups split the latent dimension:

* warpgroup h owns latent columns [256h, 256h + 256): the halves of K it
  scores with and of V^T it multiplies are the same cache columns, so each
  warpgroup alone reads (and converts) its half of every tile, and alone
  refills it: no barrier between the warpgroups guards a KV buffer;
* the score tile S^T = K q^T is split along its K dimension: warpgroup 0
  adds the rope columns; each publishes its partial S^T through shared
  memory and adds the other's (float addition commutes: both hold the same
  bits), so both run the same softmax on the same scores and need not
  exchange probabilities, maxima or sums;
* per tile each warpgroup issues 16-20 wgmma m64n64k16 for S^T and 16 for
  its half of O^T, with A converted from e4m3 in registers (fp16; bf16 q
  moves into fp16's range with the per-row power of two of the narrow
  kernel).

Shared memory: q 72 KiB (fp16), two e4m3 stages of 36 KiB, the partial
scores 4 x 16 KiB (each warpgroup's, double-buffered by tile parity), the
probabilities 2 x 8 KiB: 224 KiB, one program per SM. What it does not do
yet: overlap the two warpgroups' phases (both wait for the exchange), or
overlap conversions with the matrix instructions.

Same launch contract as ops/narrow.py's ``launch`` (block_m must be 64).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from mla_dcp.ops import kernels, narrow, seesaw
from mla_dcp.ops.seesaw import _HI, _LO, _ROPE, _warps_barrier

STAGES = 2
BLOCK_N = seesaw.BLOCK_N
# Registers of the second warpgroup (setmaxnreg): two math warpgroups share
# the file evenly, as in the seesaw.
SECOND_REGS = gl.constexpr(256)


@gluon.jit
def _half(FIRST: gl.constexpr, FINALIZE: gl.constexpr, smem, bars, ptrs, descs, scalars):
    """Warpgroup 0 (``FIRST``: latent columns [0, 256) and the rope part) or
    1 (columns [256, 512)). Triton 3.6 passes no constexpr into a partition:
    shapes come from the buffers, the rest as run-time scalars."""
    q_lo, q_hi, q_rope, kv_lo, kv_hi, kv_rope, p_smem, s_part, unscale_smem = smem
    kv_bars, s_ready = bars
    row_lens_ptr, page_table_ptr, seg_out_ptr, seg_max_ptr, seg_sum_ptr, out_ptr, lse_ptr = ptrs
    kv_half_desc, kv_rope_desc = descs
    (stride_page_b, softmax_scale_log2, kv_scale, item, b, max_pages, tok_lo, tok_hi, n_tiles, qlen, heads,
     page) = scalars
    BLOCK_M: gl.constexpr = q_lo.shape[0]
    HALF: gl.constexpr = q_lo.shape[1]
    DL: gl.constexpr = 2 * HALF
    BLOCK_N: gl.constexpr = kv_rope.shape[1]
    STAGES: gl.constexpr = kv_lo.shape[0]
    FP8: gl.constexpr = kv_lo.dtype.primitive_bitwidth == 8
    dtype: gl.constexpr = q_lo.dtype
    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, BLOCK_M, 16])
    pairs: gl.constexpr = gl.SliceLayout(0, mma_layout)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_layout, k_width=2)
    if FIRST:
        my = 0
        kv_mine = kv_lo
        q_mine = q_lo
        part = _LO
    else:
        my = 1
        kv_mine = kv_hi
        q_mine = q_hi
        part = _HI
    m_tile = gl.program_id(0)
    m_live, _, _, row_len = seesaw._row_info(row_lens_ptr, m_tile, b, pairs, qlen, heads, BLOCK_M)
    shortest = gl.minimum(gl.min(gl.where(m_live, row_len, tok_hi), axis=0), tok_hi)
    # Per pair: 1 / q's power of two (1 for 16-bit caches), times the scales.
    score_scale = (unscale_smem.load(pairs) * (softmax_scale_log2 * kv_scale))[None, :]

    acc = gl.zeros([HALF, BLOCK_M], gl.float32, mma_layout)
    m_run = gl.full([BLOCK_M], float("-inf"), gl.float32, pairs)
    l_run = gl.zeros([BLOCK_M], gl.float32, pairs)
    for t in range(n_tiles):
        stage = t % STAGES
        phase = (t // STAGES) & 1
        k_mine = kv_mine.index(stage)
        refill = t + STAGES < n_tiles
        s = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, mma_layout)
        mbarrier.wait(kv_bars.index(stage * 3 + part), phase)
        s = narrow._add_scores(k_mine, q_mine, s, a_layout, FP8, False)
        if FIRST:
            mbarrier.wait(kv_bars.index(stage * 3 + _ROPE), phase)
            s = narrow._add_scores(kv_rope.index(stage), q_rope, s, a_layout, FP8, True)
        if not FP8:
            s = warpgroup_mma_wait(0, deps=(s,))
        if FIRST:
            # The rope part's only reader: refill it now.
            seesaw._load_part(kv_rope_desc, page_table_ptr, b, stride_page_b, tok_lo, tok_hi, t + STAGES, DL,
                              kv_bars.index(stage * 3 + _ROPE), kv_rope.index(stage), refill, page, BLOCK_N)
        # Partial scores out, the other's in. One barrier per (warpgroup,
        # tile parity): a warpgroup runs at most one tile ahead of the other
        # (it waits for the other's partial of every tile), so a barrier's
        # phase never runs two completions ahead of its waiter, and a
        # partial buffer is rewritten two tiles later, after the other
        # warpgroup's wait of the tile in between, which follows its read.
        parity = t % 2
        s_part.index(my * 2 + parity).store(s)
        _warps_barrier()
        mbarrier.arrive(s_ready.index(my * 2 + parity), count=1)
        mbarrier.wait(s_ready.index((1 - my) * 2 + parity), (t // 2) & 1)
        s = s + s_part.index((1 - my) * 2 + parity).load(mma_layout)

        s = seesaw._masked(s, row_len, shortest, tok_lo, tok_hi, t, score_scale, mma_layout, BLOCK_N, 0, FP8)
        m_new = gl.maximum(m_run, gl.max(s, axis=0))
        m_shift = gl.where(m_new == float("-inf"), 0.0, m_new)
        p = gl.exp2(s - m_shift[None, :])
        alpha = gl.exp2(m_run - m_shift)
        l_run = l_run * alpha + gl.sum(p, axis=0)
        m_run = m_new
        p_mine = p_smem.index(my)
        p_mine.store(p.to(dtype))
        start = tok_lo + t * BLOCK_N
        if start + BLOCK_N > shortest:
            seesaw._guard_values(k_mine, tok_hi - start, BLOCK_N, HALF)
        else:
            # p's generic-proxy writes, read next by wgmma (async proxy).
            fence_async_shared()
            _warps_barrier()
        if FP8:
            acc = narrow._values_from_registers(k_mine, p_mine, acc * alpha[None, :], a_layout)
        else:
            acc = warpgroup_mma(k_mine.permute((1, 0)), p_mine, acc * alpha[None, :], is_async=True)
            acc = warpgroup_mma_wait(0, deps=(acc,))
        seesaw._load_part(kv_half_desc, page_table_ptr, b, stride_page_b, tok_lo, tok_hi, t + STAGES, my * HALF,
                          kv_bars.index(stage * 3 + part), k_mine, refill, page, BLOCK_N)

    # Both warpgroups hold the same statistics; the first stores them. The
    # accumulator is stored transposed in place: a row layout would need a
    # 64 KiB conversion buffer per warpgroup, which shared memory has not.
    out_t = gl.permute(acc * kv_scale, (1, 0))
    out_layout: gl.constexpr = out_t.type.layout
    rows = seesaw._row_info(row_lens_ptr, m_tile, b, gl.SliceLayout(1, out_layout), qlen, heads, BLOCK_M)
    seesaw._epilogue(out_t, m_run, l_run, my * HALF, FIRST, rows, item, b, qlen, max_pages, seg_out_ptr,
                     seg_max_ptr, seg_sum_ptr, out_ptr, lse_ptr, out_layout, heads, page, FINALIZE, DL)


# Triton 3.6 passes no constexpr into a partition: one function per role.
@gluon.jit
def _first_partial(smem, bars, ptrs, descs, scalars):
    _half(True, False, smem, bars, ptrs, descs, scalars)


@gluon.jit
def _second_partial(smem, bars, ptrs, descs, scalars):
    _half(False, False, smem, bars, ptrs, descs, scalars)


@gluon.jit
def _first_final(smem, bars, ptrs, descs, scalars):
    _half(True, True, smem, bars, ptrs, descs, scalars)


@gluon.jit
def _second_final(smem, bars, ptrs, descs, scalars):
    _half(False, True, smem, bars, ptrs, descs, scalars)


@gluon.jit
def halves_attention_kernel(
    q_ptr,           # [B*QLEN, H, DL+DR], 16-bit
    kv_half_desc,    # descriptor of the cache as [num_slots, DL+DR], box [min(PAGE, BLOCK_N), DL // 2]
    kv_rope_desc,    # the same cache, box [min(PAGE, BLOCK_N), DR]
    kv_scale_ptr,    # float32 [1] (read only when HAS_KV_SCALE)
    row_lens_ptr,
    page_table_ptr,
    work_ptr,        # int32 [NI, 3]: per work item (request, first page, end page)
    seg_out_ptr,
    seg_max_ptr,
    seg_sum_ptr,
    out_ptr,
    lse_ptr,
    stride_q_row, stride_q_head,
    stride_page_b,
    softmax_scale_log2,
    max_pages,
    QLEN: gl.constexpr,
    H: gl.constexpr,
    DL: gl.constexpr,
    DR: gl.constexpr,
    PAGE: gl.constexpr,
    FINALIZE: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr,
    HAS_KV_SCALE: gl.constexpr,
    PDL: gl.constexpr,
):
    HALF: gl.constexpr = DL // 2
    kv_dtype: gl.constexpr = kv_half_desc.dtype
    FP8: gl.constexpr = kv_dtype.primitive_bitwidth == 8
    dtype: gl.constexpr = gl.float16 if FP8 else kv_dtype
    q_half_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, HALF], dtype)
    q_rope_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, DR], dtype)
    p_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype)
    # Rows of 256 bytes: unswizzled, the accumulator layout's 8 rows per
    # store would hit the same banks; 128-byte swizzle spreads them.
    s_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2)
    stat_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])

    q_lo = gl.allocate_shared_memory(dtype, [BLOCK_M, HALF], q_half_layout)
    q_hi = gl.allocate_shared_memory(dtype, [BLOCK_M, HALF], q_half_layout)
    q_rope = gl.allocate_shared_memory(dtype, [BLOCK_M, DR], q_rope_layout)
    kv_lo = gl.allocate_shared_memory(kv_dtype, [STAGES, BLOCK_N, HALF], kv_half_desc.layout)
    kv_hi = gl.allocate_shared_memory(kv_dtype, [STAGES, BLOCK_N, HALF], kv_half_desc.layout)
    kv_rope = gl.allocate_shared_memory(kv_dtype, [STAGES, BLOCK_N, DR], kv_rope_desc.layout)
    p_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_N, BLOCK_M], p_layout)
    s_part = gl.allocate_shared_memory(gl.float32, [4, BLOCK_N, BLOCK_M], s_layout)
    unscale_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_M], stat_layout)
    kv_bars = gl.allocate_shared_memory(gl.int64, [3 * STAGES, 1], mbarrier.MBarrierLayout())
    s_ready = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(3 * STAGES):
        mbarrier.init(kv_bars.index(i), count=1)
    for i in gl.static_range(4):
        mbarrier.init(s_ready.index(i), count=1)
    seesaw._after_previous_kernel(PDL)

    item = gl.program_id(1)
    b = gl.load(work_ptr + item * 3)
    m_tile = gl.program_id(0)
    ld_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    m_live_ld, head, row, row_len_ld = seesaw._row_info(row_lens_ptr, m_tile, b, gl.SliceLayout(1, ld_layout),
                                                        QLEN, H, BLOCK_M)
    if not FP8:
        seesaw._copy_q(q_ptr, q_lo, q_hi, q_rope, row, head, m_live_ld, stride_q_row, stride_q_head, ld_layout)
    tok_lo, tok_hi = kernels._item_tokens(work_ptr, item, row_len_ld, PAGE)
    n_tiles = gl.cdiv(gl.maximum(tok_hi - tok_lo, 0), BLOCK_N)
    for t in gl.static_range(STAGES):
        seesaw._load_tile(kv_half_desc, kv_rope_desc, page_table_ptr, b, stride_page_b, tok_lo, tok_hi, t, kv_bars,
                          kv_lo, kv_hi, kv_rope, t, t < n_tiles, PAGE, BLOCK_N, True, True)
    if FP8:
        unscale = seesaw._stage_q_fp16(q_ptr, q_lo, q_hi, q_rope, row, head, m_live_ld, stride_q_row,
                                       stride_q_head, ld_layout)
    else:
        seesaw._q_landed()
        unscale = gl.full([BLOCK_M], 1.0, gl.float32, gl.SliceLayout(1, ld_layout))
    unscale_smem.store(unscale)
    _warps_barrier()
    kv_scale = kernels._kv_scale_of(kv_scale_ptr, HAS_KV_SCALE)

    smem = (q_lo, q_hi, q_rope, kv_lo, kv_hi, kv_rope, p_smem, s_part, unscale_smem)
    ptrs = (row_lens_ptr, page_table_ptr, seg_out_ptr, seg_max_ptr, seg_sum_ptr, out_ptr, lse_ptr)
    scalars = (stride_page_b, softmax_scale_log2, kv_scale, item, b, max_pages, tok_lo, tok_hi, n_tiles, QLEN,
               H, PAGE)
    args = (smem, (kv_bars, s_ready), ptrs, (kv_half_desc, kv_rope_desc), scalars)
    if FINALIZE:
        gl.warp_specialize([(_first_final, args), (_second_final, args)], [4], [SECOND_REGS])
    else:
        gl.warp_specialize([(_first_partial, args), (_second_partial, args)], [4], [SECOND_REGS])


def launch(q, kv_cache, kv_scale, row_lens, page_table, work, qlen: int, kv_lora_rank: int,
           softmax_scale: float, outputs, finalize: bool, page: int, block_m: int = 64, stages: int | None = None):
    """ops/narrow.py's ``launch`` contract at 64 pairs per tile. A 16-bit
    cache (for the probe's edge checks) fits one stage only."""
    stages = stages or (STAGES if kv_cache.element_size() == 1 else 1)
    if block_m != 64:
        raise ValueError(f"block_m must be 64 (two warpgroups over 64 pairs), got {block_m}")
    return narrow.launch_kernel(halves_attention_kernel, q, kv_cache, kv_scale, row_lens, page_table, work, qlen,
                                kv_lora_rank, softmax_scale, outputs, finalize, page, block_m, stages)
