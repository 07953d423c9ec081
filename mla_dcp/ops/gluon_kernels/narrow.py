"""Hopper attention in Gluon for narrow tiles: 16 or 32 (head, verify row) pairs.

Few heads per rank (C4: 16 heads x 2 verify rows = 32 pairs per request)
make a tile narrower than wgmma's 64-row M. ``q K^T`` wastes half of a
64-row tile there, and the m32 Triton kernel falls back to ``mma.sync``:
both take longer per KV tile than the tile takes to arrive (measured on the H200: 145 us
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
and the launch are the seesaw's, shared through ``gluon_kernels/helpers.py``.

An e4m3 cache (with or without a cache scale) needs no bf16 copy of the
tile: since the tile is A of both products, it converts to fp16 in
registers on its way to wgmma, and q moves into fp16's range with the
Triton kernels' per-row power of two. Correct, but the conversions and the
matrix instructions do not overlap yet (two reorderings tried on C2 gained nothing).
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

from mla_dcp.ops.gluon_kernels import helpers
from mla_dcp.ops.gluon_kernels.helpers import HI_PART, LO_PART, ROPE_PART, warps_barrier
from mla_dcp.ops.triton_kernels import helpers as triton_helpers
from mla_dcp.ops.triton_kernels.helpers import STREAM_WORK

# KV tiles in flight by default (plans may ask for one): two 72 KiB bf16
# tiles, q and the probabilities fill 184 KiB of shared memory at 32 pairs (a
# third tile would not fit in 227 KiB); with e4m3 tiles a program takes 113
# KiB, so two share an SM, as do two one-stage bf16 programs (115224 B each;
# measured on the H200 no faster for C4).
STAGES = 2
BLOCK_N = helpers.BLOCK_N


@gluon.jit
def _narrow_attention_piece(
    item,
    bars,
    q_ptr,           # [B*QLEN, H, DL+DR], 16-bit
    kv_half_desc,    # descriptor of the cache as [num_slots, DL+DR], box [min(PAGE, BLOCK_N), DL // 2]
    kv_rope_desc,    # the same cache, box [min(PAGE, BLOCK_N), DR]
    kv_scale_ptr,    # float32 [1] (read only when HAS_KV_SCALE)
    row_lens_ptr,
    page_table_ptr,
    work_ptr,        # int32 [NI, WORK_COLS]: the schedule's pieces (and the stream's runs)
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
    WORK_COLS: gl.constexpr = 3,
    stamps_ptr=None,  # int64 [programs, helpers.STAMP_SLOTS]: the timeline probe's only
):
    """One piece of :func:`narrow_attention_kernel` (its ``item``): a request's rows over the piece's pages."""
    HALF: gl.constexpr = DL // 2
    kv_dtype: gl.constexpr = kv_half_desc.dtype
    # An e4m3 cache multiplies in fp16: one instruction converts two e4m3
    # values (bf16 takes several), and bf16 queries move into fp16's range
    # with a per-row power of two (triton_helpers.fp16_row_shift). The converted
    # tile goes to wgmma from registers, as A of both products.
    FP8: gl.constexpr = kv_dtype.primitive_bitwidth == 8
    dtype: gl.constexpr = gl.float16 if FP8 else kv_dtype
    # Allocated here, not in the kernel: a stream program's pieces then free
    # them at each piece's end, so the epilogue's layout conversion reuses
    # their memory as the one-piece build does (outside, they would live
    # across the whole run, and the conversion's scratch would take another
    # 16 KiB: one program per SM instead of two at 32 rows, one stage).
    q_half_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, HALF], dtype)
    q_rope_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, DR], dtype)
    p_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype)
    q_lo = gl.allocate_shared_memory(dtype, [BLOCK_M, HALF], q_half_layout)
    q_hi = gl.allocate_shared_memory(dtype, [BLOCK_M, HALF], q_half_layout)
    q_rope = gl.allocate_shared_memory(dtype, [BLOCK_M, DR], q_rope_layout)
    kv_lo = gl.allocate_shared_memory(kv_dtype, [STAGES, BLOCK_N, HALF], kv_half_desc.layout)
    kv_hi = gl.allocate_shared_memory(kv_dtype, [STAGES, BLOCK_N, HALF], kv_half_desc.layout)
    kv_rope = gl.allocate_shared_memory(kv_dtype, [STAGES, BLOCK_N, DR], kv_rope_desc.layout)
    p_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_M], p_layout)
    # Scores and both output halves: tokens (or latent columns) down the
    # warpgroup's M, the tile's pairs across N. One layout for all three, so
    # a column statistic rescales either without conversion.
    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, BLOCK_M, 16])
    pairs: gl.constexpr = gl.SliceLayout(0, mma_layout)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_layout, k_width=2)
    b = gl.load(work_ptr + item * WORK_COLS)
    m_tile = gl.program_id(0)
    ld_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    m_live_ld, head, row, row_len_ld = helpers.row_info(row_lens_ptr, m_tile, b, gl.SliceLayout(1, ld_layout),
                                                        QLEN, H, BLOCK_M)
    if not FP8:
        # Issued first: q's transfer overlaps the KV copies' dependent loads.
        helpers.copy_q(q_ptr, q_lo, q_hi, q_rope, row, head, m_live_ld, stride_q_row, stride_q_head, ld_layout)
    tok_lo, tok_hi = triton_helpers.item_tokens(work_ptr, item, row_len_ld, PAGE, WORK_COLS)
    n_tiles = gl.cdiv(gl.maximum(tok_hi - tok_lo, 0), BLOCK_N)
    helpers.stamp_value(stamps_ptr, 13, n_tiles)
    helpers.stamp_sm(stamps_ptr, 12)
    # The program's own pointers (as in the seesaw kernel).
    (piece_pages, piece_lens, piece_out, piece_lse, piece_seg_out, piece_seg_max,
     piece_seg_sum) = helpers.program_pointers(b, item, page_table_ptr, stride_page_b, row_lens_ptr, out_ptr,
                                               lse_ptr, seg_out_ptr, seg_max_ptr, seg_sum_ptr, QLEN, H, DL)

    for t in gl.static_range(STAGES):
        helpers.load_tile(kv_half_desc, kv_rope_desc, piece_pages, tok_lo, tok_hi, t, bars,
                          kv_lo, kv_hi, kv_rope, t, t < n_tiles, PAGE, BLOCK_N, True, True)
    helpers.stamp(stamps_ptr, 2)
    m_live, _, _, row_len = helpers.row_info(piece_lens, m_tile, 0, pairs, QLEN, H, BLOCK_M)
    kv_scale = triton_helpers.kv_scale_of(kv_scale_ptr, HAS_KV_SCALE)
    # Per pair where q was rescaled (broadcast down the tokens), else one scalar.
    if FP8:
        unscale = helpers.stage_q_fp16(q_ptr, q_lo, q_hi, q_rope, row, head, m_live_ld, stride_q_row,
                                       stride_q_head, ld_layout)
        score_scale = (gl.convert_layout(unscale, pairs) * (softmax_scale_log2 * kv_scale))[None, :]
    else:
        helpers.q_landed()
        score_scale = softmax_scale_log2
    helpers.stamp(stamps_ptr, 3)
    # Tiles wholly below this are visible to every pair and inside the segment.
    shortest = gl.minimum(gl.min(gl.where(m_live, row_len, tok_hi), axis=0), tok_hi)
    acc_lo = gl.zeros([HALF, BLOCK_M], gl.float32, mma_layout)
    acc_hi = gl.zeros([HALF, BLOCK_M], gl.float32, mma_layout)
    m_run = gl.full([BLOCK_M], float("-inf"), gl.float32, pairs)
    l_run = gl.zeros([BLOCK_M], gl.float32, pairs)
    for t in range(n_tiles):
        stage = t % STAGES
        phase = (t // STAGES) & 1
        k_lo = kv_lo.index(stage)
        k_hi = kv_hi.index(stage)
        s = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, mma_layout)
        mbarrier.wait(helpers.part_bar(bars, stage, LO_PART), phase)
        # probe: qk-lo
        s = _add_scores(k_lo, q_lo, s, a_layout, FP8, False)
        mbarrier.wait(helpers.part_bar(bars, stage, HI_PART), phase)
        # probe: qk-hi
        s = _add_scores(k_hi, q_hi, s, a_layout, FP8, True)
        mbarrier.wait(helpers.part_bar(bars, stage, ROPE_PART), phase)
        # probe: qk-rope
        s = _add_scores(kv_rope.index(stage), q_rope, s, a_layout, FP8, True)
        if not FP8:
            s = warpgroup_mma_wait(0, deps=(s,))
        if t == 0:
            helpers.stamp(stamps_ptr, 4)
        refill = t + STAGES < n_tiles
        # The rope part's only reader was q K^T: refill it now.
        helpers.load_tile(kv_half_desc, kv_rope_desc, piece_pages, tok_lo, tok_hi, t + STAGES,
                          bars, kv_lo, kv_hi, kv_rope, stage, refill, PAGE, BLOCK_N, False, True)
        s = helpers.masked(s, row_len, shortest, tok_lo, tok_hi, t, score_scale, mma_layout, BLOCK_N, 0, FP8)
        m_new = gl.maximum(m_run, gl.max(s, axis=0))
        m_shift = gl.where(m_new == float("-inf"), 0.0, m_new)
        # probe: softmax
        p = gl.exp2(s - m_shift[None, :])
        alpha = gl.exp2(m_run - m_shift)
        l_run = l_run * alpha + gl.sum(p, axis=0)
        m_run = m_new
        p_smem.store(p.to(dtype))
        start = tok_lo + t * BLOCK_N
        if start + BLOCK_N > shortest:
            helpers.guard_values(k_lo, tok_hi - start, BLOCK_N, HALF)
            helpers.guard_values(k_hi, tok_hi - start, BLOCK_N, HALF)
        else:
            # p's generic-proxy writes, read next by wgmma (async proxy).
            fence_async_shared()
            warps_barrier()
        if FP8:
            # probe: pv-lo
            acc_lo = _values_from_registers(k_lo, p_smem, acc_lo * alpha[None, :], a_layout)
            # probe: pv-hi
            acc_hi = _values_from_registers(k_hi, p_smem, acc_hi * alpha[None, :], a_layout)
        else:
            # probe: pv-lo
            acc_lo = warpgroup_mma(k_lo.permute((1, 0)), p_smem, acc_lo * alpha[None, :], is_async=True)
            # probe: pv-hi
            acc_hi = warpgroup_mma(k_hi.permute((1, 0)), p_smem, acc_hi * alpha[None, :], is_async=True)
            # probe: pv-wait
            acc_lo, acc_hi = warpgroup_mma_wait(0, deps=(acc_lo, acc_hi))
        helpers.load_tile(kv_half_desc, kv_rope_desc, piece_pages, tok_lo, tok_hi, t + STAGES,
                          bars, kv_lo, kv_hi, kv_rope, stage, refill, PAGE, BLOCK_N, True, False)

    helpers.stamp(stamps_ptr, 6)
    # The epilogue's rules take pairs down the rows: transpose in registers,
    # then a layout whose warps store whole rows of the output.
    store_layout: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [4, 1], [1, 0])
    rows = helpers.row_info(piece_lens, m_tile, 0, gl.SliceLayout(1, store_layout), QLEN, H, BLOCK_M)
    for half in gl.static_range(2):
        acc = (acc_lo if half == 0 else acc_hi) * kv_scale
        helpers.epilogue(gl.convert_layout(gl.permute(acc, (1, 0)), store_layout), m_run, l_run, half * HALF,
                         half == 0, rows, QLEN, max_pages, piece_seg_out, piece_seg_max, piece_seg_sum,
                         piece_out, piece_lse, store_layout, H, PAGE, FINALIZE, DL)
    helpers.stamp(stamps_ptr, 10)


@gluon.jit
def narrow_attention_kernel(
    q_ptr,           # [B*QLEN, H, DL+DR], 16-bit
    kv_half_desc,    # descriptor of the cache as [num_slots, DL+DR], box [min(PAGE, BLOCK_N), DL // 2]
    kv_rope_desc,    # the same cache, box [min(PAGE, BLOCK_N), DR]
    kv_scale_ptr,    # float32 [1] (read only when HAS_KV_SCALE)
    row_lens_ptr,
    page_table_ptr,
    work_ptr,        # int32 [NI, WORK_COLS]: the schedule's pieces (and the stream's runs)
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
    WORK_COLS: gl.constexpr = 3,
    stamps_ptr=None,  # int64 [programs, helpers.STAMP_SLOTS]: the timeline probe's only
):
    helpers.stamp(stamps_ptr, 0)
    bars = gl.allocate_shared_memory(gl.int64, [helpers.NUM_PARTS * STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(helpers.NUM_PARTS * STAGES):
        mbarrier.init(bars.index(i), count=1)
    helpers.after_previous_kernel(PDL)
    helpers.stamp(stamps_ptr, 1)

    if WORK_COLS == STREAM_WORK:
        # A run of pieces (the stream schedule's may cross requests), one after another.
        first, end = triton_helpers.program_pieces(work_ptr, gl.program_id(1))
        for item in range(first, end):
            _narrow_attention_piece(item, bars, q_ptr,
                                    kv_half_desc, kv_rope_desc, kv_scale_ptr, row_lens_ptr, page_table_ptr, work_ptr,
                                    seg_out_ptr, seg_max_ptr, seg_sum_ptr, out_ptr, lse_ptr, stride_q_row,
                                    stride_q_head, stride_page_b, softmax_scale_log2, max_pages, QLEN, H, DL, DR,
                                    PAGE, FINALIZE, BLOCK_M, BLOCK_N, STAGES, HAS_KV_SCALE, WORK_COLS, stamps_ptr)
            # The epilogue's generic-proxy use of memory the next piece's copies
            # (async proxy) refill, and every wait on this piece's barriers, are
            # behind every thread: then restart the barriers' phases.
            fence_async_shared()
            warps_barrier()
            for i in gl.static_range(helpers.NUM_PARTS * STAGES):
                mbarrier.invalidate(bars.index(i))
                mbarrier.init(bars.index(i), count=1)
    else:
        _narrow_attention_piece(gl.program_id(1), bars, q_ptr,
                                kv_half_desc, kv_rope_desc, kv_scale_ptr, row_lens_ptr, page_table_ptr, work_ptr,
                                seg_out_ptr, seg_max_ptr, seg_sum_ptr, out_ptr, lse_ptr, stride_q_row, stride_q_head,
                                stride_page_b, softmax_scale_log2, max_pages, QLEN, H, DL, DR, PAGE, FINALIZE,
                                BLOCK_M, BLOCK_N, STAGES, HAS_KV_SCALE, WORK_COLS, stamps_ptr)


@gluon.jit
def _add_scores(k_part, q_part, s, a_layout: gl.constexpr, FP8: gl.constexpr, USE_ACC: gl.constexpr):
    """s (+)= K_part q_part^T for one part of the tile (a latent half or the
    rope columns). A 16-bit part multiplies from shared memory, left in
    flight; an e4m3 part converts to fp16 in registers, 64 columns at a
    time, each multiply waited for (s is zero where not ``USE_ACC``)."""
    if FP8:
        CHUNK: gl.constexpr = 64
        for c in gl.static_range(k_part.shape[1] // CHUNK):
            k = k_part.slice(c * CHUNK, CHUNK, dim=1).load(a_layout).to(gl.float16)
            s = warpgroup_mma(k, q_part.slice(c * CHUNK, CHUNK, dim=1).permute((1, 0)), s)
    else:
        s = warpgroup_mma(k_part, q_part.permute((1, 0)), s, use_acc=USE_ACC, is_async=True)
    return s


@gluon.jit
def _values_from_registers(v_part, p_smem, acc, a_layout: gl.constexpr):
    """acc += V_part^T P^T with the e4m3 V part converted to fp16 in
    registers, 16 tokens (one k step) at a time."""
    STEP: gl.constexpr = 16
    for c in gl.static_range(v_part.shape[0] // STEP):
        v_t = v_part.slice(c * STEP, STEP, dim=0).permute((1, 0)).load(a_layout).to(gl.float16)
        acc = warpgroup_mma(v_t, p_smem.slice(c * STEP, STEP, dim=0), acc)
    return acc



def launch(q, kv_cache, kv_scale, row_lens, page_table, work, qlen: int, kv_lora_rank: int,
           softmax_scale: float, outputs, finalize: bool, page: int, block_m: int, stages: int = STAGES,
           stamps=None):
    """:func:`helpers.launch` of this kernel at ``block_m`` (16 or 32: wgmma's
    N) pairs per tile; the caller checks :func:`helpers.fits`. ``stages``: KV
    tiles in flight per program (one leaves room for a second program per
    multiprocessor); ``stamps``: see :func:`helpers.launch`."""
    if stages not in (1, 2):
        raise ValueError(f"stages must be 1 or 2 (two 72 KiB bf16 tiles fill shared memory at 32 rows), got {stages}")
    return helpers.launch(narrow_attention_kernel, q, kv_cache, kv_scale, row_lens, page_table, work, qlen,
                          kv_lora_rank, softmax_scale, outputs, finalize, page, block_m, stamps, STAGES=stages)

