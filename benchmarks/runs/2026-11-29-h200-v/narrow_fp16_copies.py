"""Hopper attention in Gluon for narrow tiles: 16 or 32 (head, verify row) pairs.

Few heads per rank (C4: 16 heads x 2 verify rows = 32 pairs per request)
make a tile narrower than wgmma's 64-row M. ``q K^T`` wastes half of a
64-row tile there, and the m32 Triton kernel falls back to ``mma.sync``:
both take longer per KV tile than the tile takes to arrive (NOTES.md: 145 us
for C4, half the copy rate). Computed transposed, the pairs become wgmma's N
dimension, which may be 16 or 32:

* scores ``S^T = K q^T``: A = the KV tile (64 tokens x 576, shared memory),
  B = q (the tile's pairs, shared memory);
* output ``O^T = V^T P^T``: A = the tile's latent halves read transposed
  (wgmma takes 16-bit A in either major order), B = the probabilities,
  stored to shared memory; the 512 x pairs accumulator is two 256-row halves.

One warpgroup does the math while the next tile's TMA loads fly: at 32
pairs the tile's math is a fraction of its load time, so the kernel streams
the cache (C4 on the H200: 85% of the copy rate). Softmax runs down the
columns (one pair per column). Masks, page boxes, q staging, epilogue rules
and the launch contract are ops/seesaw.py's.

An e4m3 cache (with or without a cache scale) lands by TMA in two e4m3
stages and is converted to fp16 by the same warpgroup while the current
tile's multiplies run (wgmma is asynchronous: loads, converts and stores go
between issue and wait). Both products then read fp16 shared memory as the
16-bit path does; q moves into fp16's range with the Triton kernels' per-row
power of two (kernels._fp16_row_shift). Shared memory holds two fp16 copies
of the low latent half but one of the high half and of the rope part: the
next tile's low half converts during q K^T, its rope part once q K^T is
done, its high half while the low half's V^T P^T runs (220 KiB at 32 pairs).
"""

from __future__ import annotations

import math

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from mla_dcp.ops import kernels, launchers, seesaw
from mla_dcp.ops.seesaw import _HI, _LO, _ROPE, _warps_barrier

# KV tiles in flight: two 72 KiB 16-bit tiles, q and the probabilities fill
# 184 KiB of shared memory at 32 pairs (a third tile would not fit in 227
# KiB). An e4m3 cache: two 36 KiB e4m3 tiles in flight plus 104 KiB of fp16
# copies (module docstring).
STAGES = 2
BLOCK_N = seesaw.BLOCK_N


@gluon.jit
def narrow_attention_kernel(
    q_ptr,           # [B*QLEN, H, DL+DR], 16-bit
    kv_half_desc,    # descriptor of the cache as [num_slots, DL+DR], box [min(PAGE, BLOCK_N), DL // 2]
    kv_rope_desc,    # the same cache, box [min(PAGE, BLOCK_N), DR]
    kv_scale_ptr,    # float32 [1] (read only when HAS_KV_SCALE)
    row_lens_ptr,
    page_table_ptr,
    seg_out_ptr,
    seg_max_ptr,
    seg_sum_ptr,
    out_ptr,
    lse_ptr,
    stride_q_row, stride_q_head,
    stride_page_b,
    softmax_scale_log2,
    num_segments,
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
):
    HALF: gl.constexpr = DL // 2
    kv_dtype: gl.constexpr = kv_half_desc.dtype
    # An e4m3 cache multiplies in fp16: one instruction converts two e4m3
    # values (bf16 takes several), and bf16 queries move into fp16's range
    # with a per-row power of two (kernels._fp16_row_shift). The converted
    # tile goes to wgmma from registers, as A of both products.
    FP8: gl.constexpr = kv_dtype.primitive_bitwidth == 8
    dtype: gl.constexpr = gl.float16 if FP8 else kv_dtype
    # Scores and both output halves: tokens (or latent columns) down the
    # warpgroup's M, the tile's pairs across N. One layout for all three, so
    # a column statistic rescales either without conversion.
    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, BLOCK_M, 16])
    pairs: gl.constexpr = gl.SliceLayout(0, mma_layout)
    q_half_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, HALF], dtype)
    q_rope_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, DR], dtype)
    p_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype)

    q_lo = gl.allocate_shared_memory(dtype, [BLOCK_M, HALF], q_half_layout)
    q_hi = gl.allocate_shared_memory(dtype, [BLOCK_M, HALF], q_half_layout)
    q_rope = gl.allocate_shared_memory(dtype, [BLOCK_M, DR], q_rope_layout)
    kv_lo = gl.allocate_shared_memory(kv_dtype, [STAGES, BLOCK_N, HALF], kv_half_desc.layout)
    kv_hi = gl.allocate_shared_memory(kv_dtype, [STAGES, BLOCK_N, HALF], kv_half_desc.layout)
    kv_rope = gl.allocate_shared_memory(kv_dtype, [STAGES, BLOCK_N, DR], kv_rope_desc.layout)
    # What the multiplies read: the TMA stages, or with FP8 their fp16 copies
    # (stages of the low half; one buffer for the high half and the rope part).
    COPY_STAGES: gl.constexpr = 1 if FP8 else STAGES
    if FP8:
        f_half_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HALF], dtype)
        f_rope_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, DR], dtype)
        a_lo = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HALF], f_half_layout)
        a_hi = gl.allocate_shared_memory(dtype, [COPY_STAGES, BLOCK_N, HALF], f_half_layout)
        a_rope = gl.allocate_shared_memory(dtype, [COPY_STAGES, BLOCK_N, DR], f_rope_layout)
    else:
        a_lo = kv_lo
        a_hi = kv_hi
        a_rope = kv_rope
    p_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_M], p_layout)
    bars = gl.allocate_shared_memory(gl.int64, [3 * STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(3 * STAGES):
        mbarrier.init(bars.index(i), count=1)

    b = gl.program_id(2)
    seg = gl.program_id(1)
    m_tile = gl.program_id(0)
    ld_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    m_live_ld, head, row, row_len_ld = seesaw._row_info(row_lens_ptr, m_tile, b, gl.SliceLayout(1, ld_layout),
                                                        QLEN, H, BLOCK_M)
    tok_lo, tok_hi = kernels._segment_tokens(row_lens_ptr, b, seg, num_segments, max_pages, row_len_ld, QLEN,
                                             PAGE)
    n_tiles = gl.cdiv(gl.maximum(tok_hi - tok_lo, 0), BLOCK_N)

    for t in gl.static_range(STAGES):
        _load_tile(kv_half_desc, kv_rope_desc, page_table_ptr, b, stride_page_b, tok_lo, tok_hi, t, bars, kv_lo,
                   kv_hi, kv_rope, t, t < n_tiles, PAGE, BLOCK_N, True, True)
    m_live, _, _, row_len = seesaw._row_info(row_lens_ptr, m_tile, b, pairs, QLEN, H, BLOCK_M)
    kv_scale = kernels._kv_scale_of(kv_scale_ptr, HAS_KV_SCALE)
    unscale = seesaw._stage_q(q_ptr, q_lo, q_hi, q_rope, row, head, m_live_ld, stride_q_row, stride_q_head,
                              ld_layout, FP8)
    # Per pair where q was rescaled (broadcast down the tokens), else one scalar.
    if FP8:
        score_scale = (gl.convert_layout(unscale, pairs) * (softmax_scale_log2 * kv_scale))[None, :]
        # Tile 0 is converted before the loop, tile t + 1 during tile t.
        if n_tiles > 0:
            _convert_part(kv_lo.index(0), a_lo.index(0), bars.index(_LO), 0)
            _convert_part(kv_hi.index(0), a_hi.index(0), bars.index(_HI), 0)
            _convert_part(kv_rope.index(0), a_rope.index(0), bars.index(_ROPE), 0)
        _converted()
        _load_tile(kv_half_desc, kv_rope_desc, page_table_ptr, b, stride_page_b, tok_lo, tok_hi, STAGES, bars,
                   kv_lo, kv_hi, kv_rope, 0, STAGES < n_tiles, PAGE, BLOCK_N, True, True)
    else:
        score_scale = softmax_scale_log2
    # Tiles wholly below this are visible to every pair and inside the segment.
    shortest = gl.minimum(gl.min(gl.where(m_live, row_len, tok_hi), axis=0), tok_hi)
    acc_lo = gl.zeros([HALF, BLOCK_M], gl.float32, mma_layout)
    acc_hi = gl.zeros([HALF, BLOCK_M], gl.float32, mma_layout)
    m_run = gl.full([BLOCK_M], float("-inf"), gl.float32, pairs)
    l_run = gl.zeros([BLOCK_M], gl.float32, pairs)
    for t in range(n_tiles):
        stage = t % STAGES
        phase = (t // STAGES) & 1
        k_lo = a_lo.index(stage)
        k_hi = a_hi.index(t % COPY_STAGES)
        k_rope = a_rope.index(t % COPY_STAGES)
        # FP8: the next tile's e4m3 stage and its landing phase.
        convert_next = t + 1 < n_tiles
        next_stage = (t + 1) % STAGES
        next_phase = ((t + 1) // STAGES) & 1
        refill = t + STAGES < n_tiles
        s = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, mma_layout)
        if not FP8:
            mbarrier.wait(bars.index(stage * 3 + _LO), phase)
        s = warpgroup_mma(k_lo, q_lo.permute((1, 0)), s, use_acc=False, is_async=True)
        if not FP8:
            mbarrier.wait(bars.index(stage * 3 + _HI), phase)
        s = warpgroup_mma(k_hi, q_hi.permute((1, 0)), s, is_async=True)
        if not FP8:
            mbarrier.wait(bars.index(stage * 3 + _ROPE), phase)
        s = warpgroup_mma(k_rope, q_rope.permute((1, 0)), s, is_async=True)
        if FP8 and convert_next:
            _convert_part(kv_lo.index(next_stage), a_lo.index(next_stage), bars.index(next_stage * 3 + _LO),
                          next_phase)
        s = warpgroup_mma_wait(0, deps=(s,))
        if FP8:
            # q K^T was the rope copy's only reader.
            if convert_next:
                _convert_part(kv_rope.index(next_stage), k_rope, bars.index(next_stage * 3 + _ROPE), next_phase)
        else:
            # The rope part's only reader was q K^T: refill it now.
            _load_tile(kv_half_desc, kv_rope_desc, page_table_ptr, b, stride_page_b, tok_lo, tok_hi, t + STAGES,
                       bars, kv_lo, kv_hi, kv_rope, stage, refill, PAGE, BLOCK_N, False, True)
        s = seesaw._masked(s, row_len, shortest, tok_lo, tok_hi, t, score_scale, mma_layout, BLOCK_N, 0)
        m_new = gl.maximum(m_run, gl.max(s, axis=0))
        m_shift = gl.where(m_new == float("-inf"), 0.0, m_new)
        p = gl.exp2(s - m_shift[None, :])
        alpha = gl.exp2(m_run - m_shift)
        l_run = l_run * alpha + gl.sum(p, axis=0)
        m_run = m_new
        p_smem.store(p.to(dtype))
        start = tok_lo + t * BLOCK_N
        if start + BLOCK_N > tok_hi:
            seesaw._zero_rows_past(k_lo, tok_hi - start, BLOCK_N, HALF)
            seesaw._zero_rows_past(k_hi, tok_hi - start, BLOCK_N, HALF)
        else:
            # p's generic-proxy writes, read next by wgmma (async proxy).
            fence_async_shared()
            _warps_barrier()
        if FP8:
            # The high half first: its copy is rewritten while the low half multiplies.
            acc_hi = warpgroup_mma(k_hi.permute((1, 0)), p_smem, acc_hi * alpha[None, :], is_async=True)
            acc_lo = warpgroup_mma(k_lo.permute((1, 0)), p_smem, acc_lo * alpha[None, :], is_async=True)
            acc_hi = warpgroup_mma_wait(1, deps=(acc_hi,))
            if convert_next:
                _convert_part(kv_hi.index(next_stage), k_hi, bars.index(next_stage * 3 + _HI), next_phase)
            _converted()
            # The next tile's e4m3 stage is converted: it takes the tile after next.
            _load_tile(kv_half_desc, kv_rope_desc, page_table_ptr, b, stride_page_b, tok_lo, tok_hi,
                       t + 1 + STAGES, bars, kv_lo, kv_hi, kv_rope, next_stage, t + 1 + STAGES < n_tiles, PAGE,
                       BLOCK_N, True, True)
            acc_lo = warpgroup_mma_wait(0, deps=(acc_lo,))
        else:
            acc_lo = warpgroup_mma(k_lo.permute((1, 0)), p_smem, acc_lo * alpha[None, :], is_async=True)
            acc_hi = warpgroup_mma(k_hi.permute((1, 0)), p_smem, acc_hi * alpha[None, :], is_async=True)
            acc_lo, acc_hi = warpgroup_mma_wait(0, deps=(acc_lo, acc_hi))
            _load_tile(kv_half_desc, kv_rope_desc, page_table_ptr, b, stride_page_b, tok_lo, tok_hi, t + STAGES,
                       bars, kv_lo, kv_hi, kv_rope, stage, refill, PAGE, BLOCK_N, True, False)

    # The epilogue's rules take pairs down the rows: transpose in registers,
    # then a layout whose warps store whole rows of the output.
    store_layout: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [4, 1], [1, 0])
    for half in gl.static_range(2):
        acc = (acc_lo if half == 0 else acc_hi) * kv_scale
        seesaw._epilogue(gl.convert_layout(gl.permute(acc, (1, 0)), store_layout), m_run, l_run, half * HALF,
                         half == 0, row_lens_ptr, m_tile, b, seg, num_segments, max_pages, seg_out_ptr, seg_max_ptr,
                         seg_sum_ptr, out_ptr, lse_ptr, store_layout, QLEN, H, PAGE, FINALIZE, DL, BLOCK_M)


@gluon.jit
def _converted():
    # The fp16 copies' generic-proxy writes, read next by wgmma (async
    # proxy), and every warp past its reads of the e4m3 stage (TMA refills it).
    fence_async_shared()
    _warps_barrier()


@gluon.jit
def _convert_part(src, dst, bar, phase):
    """dst (fp16) = src (e4m3) once src has landed. 16 e4m3 bytes per thread
    and load, 64 columns at a time: two 16-byte fp16 stores each, four
    wavefronts per warp under the 128-byte swizzle."""
    CHUNK: gl.constexpr = 64
    layout: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])
    mbarrier.wait(bar, phase)
    for c in gl.static_range(src.shape[1] // CHUNK):
        x = src.slice(c * CHUNK, CHUNK, dim=1).load(layout)
        dst.slice(c * CHUNK, CHUNK, dim=1).store(x.to(dst.dtype))


@gluon.jit
def _load_tile(kv_half_desc, kv_rope_desc, page_table_ptr, b, stride_page_b, tok_lo, tok_hi, tile, bars, kv_lo, kv_hi,
               kv_rope, stage, pred, PAGE: gl.constexpr, BLOCK_N: gl.constexpr, LATENT: gl.constexpr,
               ROPE: gl.constexpr):
    """Tile ``tile`` of the segment into ``stage``: its latent halves, its rope part, or both."""
    HALF: gl.constexpr = kv_lo.shape[2]
    if LATENT:
        seesaw._load_part(kv_half_desc, page_table_ptr, b, stride_page_b, tok_lo, tok_hi, tile, 0,
                          bars.index(stage * 3 + _LO), kv_lo.index(stage), pred, PAGE, BLOCK_N)
        seesaw._load_part(kv_half_desc, page_table_ptr, b, stride_page_b, tok_lo, tok_hi, tile, HALF,
                          bars.index(stage * 3 + _HI), kv_hi.index(stage), pred, PAGE, BLOCK_N)
    if ROPE:
        seesaw._load_part(kv_rope_desc, page_table_ptr, b, stride_page_b, tok_lo, tok_hi, tile, 2 * HALF,
                          bars.index(stage * 3 + _ROPE), kv_rope.index(stage), pred, PAGE, BLOCK_N)



def launch(q, kv_cache, kv_scale, row_lens, page_table, qlen: int, kv_lora_rank: int, num_segments: int,
           softmax_scale: float, outputs, finalize: bool, page: int, block_m: int):
    """Launch with the Triton kernels' arguments and outputs (see
    ``launchers._launch_attention``); the caller checks :func:`fits` and
    that ``block_m`` is 16 or 32 (wgmma's N)."""
    _, heads, head_dim = q.shape
    half_desc, rope_desc = seesaw.descriptors(kv_cache, kv_lora_rank, page)
    partials, unused = launchers.kernel_outputs(outputs, finalize)
    grid = (triton.cdiv(qlen * heads, block_m), num_segments, page_table.shape[0])
    return narrow_attention_kernel[grid](
        q, half_desc, rope_desc, kv_scale if kv_scale is not None else unused, row_lens, page_table, *partials,
        q.stride(0), q.stride(1), page_table.stride(0), softmax_scale * math.log2(math.e), num_segments,
        page_table.shape[1], QLEN=qlen, H=heads, DL=kv_lora_rank, DR=head_dim - kv_lora_rank, PAGE=page,
        FINALIZE=finalize, BLOCK_M=block_m, BLOCK_N=BLOCK_N, STAGES=STAGES, HAS_KV_SCALE=kv_scale is not None,
        num_warps=4)


def fits(q, kv_cache, kv_scale, kv_lora_rank: int, page: int) -> bool:
    """The seesaw's conditions (``seesaw.fits``), or its layout with an
    e4m3fn cache under 16-bit queries, with or without a cache scale."""
    fp8 = kv_cache.dtype == torch.float8_e4m3fn and q.dtype in (torch.bfloat16, torch.float16)
    return seesaw.fits(q, kv_cache, kv_scale, kv_lora_rank, page) or (
        fp8 and seesaw.layout_fits(q, kv_cache, kv_lora_rank, page))
