"""Triton kernels of every stage (DESIGN.md stages 1-5).

Only the kernels live here (their shared helpers in `helpers.py`);
`mla_dcp/ops/launchers.py` sizes and launches them. Nothing
here imports `mla_dcp.pure`: the oracle checks these kernels, it does not
feed them. Constants used inside kernels are `tl.constexpr` (compiled Triton
refuses plain Python globals).
"""

from __future__ import annotations

import triton
import triton.language as tl

from mla_dcp.ops.triton_kernels import helpers
from mla_dcp.ops.triton_kernels.helpers import STREAM_WORK


@triton.jit
def _local_len(length, t, QLEN: tl.constexpr, WORLD: tl.constexpr, RANK: tl.constexpr,
               INTERLEAVE: tl.constexpr, CAUSAL: tl.constexpr):
    """Stage 1: what this rank holds of row ``t``'s window of a request of global length ``length``.

    Row t sees the global window [0, L - QLEN + 1 + t) (causal), or all of
    [0, L) (a non-causal draft block)."""
    if CAUSAL:
        visible = tl.maximum(length - QLEN + 1 + t, 0)
    else:
        visible = tl.maximum(length, 0)
    full_rounds = visible // (WORLD * INTERLEAVE)
    tail = visible - full_rounds * (WORLD * INTERLEAVE) - RANK * INTERLEAVE
    tail = tl.minimum(tl.maximum(tail, 0), INTERLEAVE)
    return full_rounds * INTERLEAVE + tail


@triton.jit
def _placement(position, WORLD: tl.constexpr, RANK: tl.constexpr, INTERLEAVE: tl.constexpr):
    """Stage 1 for one global position ``p`` (elementwise): whether this rank holds it (rank
    ``(p // I) % W``) and its rank-local position ``(p // (W*I)) * I + p % I``."""
    here = (position // INTERLEAVE) % WORLD == RANK
    return here, (position // (WORLD * INTERLEAVE)) * INTERLEAVE + position % INTERLEAVE


@triton.jit
def _context_len(length, QLEN: tl.constexpr, CONTEXT: tl.constexpr):
    """A request's global length as a view sees it: with ``CONTEXT`` the keys before its block of
    ``QLEN`` (a masked block's context, ``max(L - QLEN, 0)``), else all ``L``."""
    if CONTEXT:
        length = tl.maximum(length - QLEN, 0)
    return length


@triton.jit
def _row_lens_block(seq_lens_ptr, row_lens_ptr, block, num_rows, QLEN: tl.constexpr, WORLD: tl.constexpr,
                    RANK: tl.constexpr, INTERLEAVE: tl.constexpr, BLOCK: tl.constexpr, CAUSAL: tl.constexpr,
                    CONTEXT: tl.constexpr):
    rows = block * BLOCK + tl.arange(0, BLOCK)
    live = rows < num_rows
    length = _context_len(tl.load(seq_lens_ptr + rows // QLEN, mask=live, other=0), QLEN, CONTEXT)
    tl.store(row_lens_ptr + rows, _local_len(length, rows % QLEN, QLEN, WORLD, RANK, INTERLEAVE, CAUSAL), mask=live)


@triton.jit
def row_lens_kernel(
    seq_lens_ptr,  # int32 [B]
    row_lens_ptr,  # int32 [B * QLEN] out
    num_rows,
    QLEN: tl.constexpr,
    WORLD: tl.constexpr,
    RANK: tl.constexpr,
    INTERLEAVE: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
    CAUSAL: tl.constexpr = True,
):
    helpers.after_previous_kernel(PDL)
    _row_lens_block(seq_lens_ptr, row_lens_ptr, tl.program_id(0), num_rows, QLEN, WORLD, RANK, INTERLEAVE, BLOCK,
                    CAUSAL, False)


@triton.jit
def expand_pages_kernel(
    block_table_ptr,  # int32 [B, max_blocks]
    page_table_ptr,   # int32 [B, max_pages] out
    stride_block_b,
    stride_page_b,
    max_pages,
    PAGES_PER_BLOCK: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    helpers.after_previous_kernel(PDL)
    b = tl.program_id(1)
    pages = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = pages < max_pages
    blocks = tl.load(block_table_ptr + b * stride_block_b + pages // PAGES_PER_BLOCK, mask=live, other=0)
    # int32 on purpose: huge ids in unused entries may wrap; those pages are never read.
    tl.store(page_table_ptr + b * stride_page_b + pages, blocks * PAGES_PER_BLOCK + pages % PAGES_PER_BLOCK,
             mask=live)


@triton.jit
def _tile_rows(row_lens_ptr, m_tile, b, QLEN: tl.constexpr, H: tl.constexpr, BLOCK_M: tl.constexpr):
    """The tile's (head, verify row) pairs: ``m = h_local * QLEN + t``.

    The verify rows of a head sit next to each other, so every KV tile a
    program loads serves all rows and heads of its tile (the verify rows are
    folded into the matrix multiply instead of re-reading the cache per row).
    """
    return helpers.rows_of(row_lens_ptr, m_tile * BLOCK_M + tl.arange(0, BLOCK_M), b, QLEN, H)


@triton.jit
def _piece_work(row_lens_ptr, work_ptr, item, QLEN: tl.constexpr, H: tl.constexpr, PAGE: tl.constexpr,
                BLOCK_M: tl.constexpr, WORK_COLS: tl.constexpr):
    """A piece's request, the program's tile rows of it and the piece's token span (grid: m tile,
    program; each program runs the pieces :func:`helpers.program_pieces` gives it, in turn)."""
    b = tl.load(work_ptr + item * WORK_COLS)
    m_live, head, row, row_len = _tile_rows(row_lens_ptr, tl.program_id(0), b, QLEN, H, BLOCK_M)
    tok_lo, tok_hi = helpers.item_tokens(work_ptr, item, row_len, PAGE, WORK_COLS)
    return b, m_live, head, row, row_len, tok_lo, tok_hi


@triton.jit
def _slot_of(item, b, row, head, QLEN, H):
    """Partial slot of (row, head) in the item's [H, QLEN] block: DESIGN's
    stage-3 layout ``seg_out[item, head, t]`` (elementwise over tile rows;
    run-time or constant QLEN/H: the Gluon partitions take run-time ones)."""
    return (tl.cast(item, tl.int64) * H + head) * QLEN + (row - b * QLEN)


@triton.jit
def _shortest(row_len, m_live, tok_hi):
    """The tile's shortest live row, capped at the segment's end: tokens
    below it are visible to every row."""
    return tl.minimum(tl.min(tl.where(m_live, row_len, tok_hi), axis=0), tok_hi)


@triton.jit
def _online_softmax(scores, visible, m_i, l_i, score_scale):
    """One KV tile's step of the base-2 online softmax: (probs, alpha, m, l).

    ``score_scale`` is per row: softmax scale * log2(e) * kv scale, divided
    by the row's fp16 factor where the query was rescaled."""
    scores = tl.where(visible, helpers.poison_neg_inf(scores * score_scale[:, None]), float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, axis=1))
    # A row with nothing visible yet keeps max -inf; shift by 0 so that
    # exp2(-inf - 0) = 0 instead of exp2(-inf + inf) = NaN.
    m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    probs = tl.exp2(scores - m_shift[:, None])
    alpha = tl.exp2(m_i - m_shift)
    return probs, alpha, m_new, l_i * alpha + tl.sum(probs, axis=1)


@triton.jit
def _segment_stats(m_i, l_i, row_len, max_pages, PAGE: tl.constexpr):
    """The statistics a tile stores, and whether each row is poisoned.

    A row longer than the page table covers is poisoned (see the pure
    oracle): NaN statistics, so no merge drops it as empty.
    """
    poisoned = row_len > max_pages * PAGE
    seg_max, seg_sum = helpers.stats_of(m_i, l_i, poisoned)
    return poisoned, seg_max, seg_sum


@triton.jit
def _q_live(m_live, tok_lo, tok_hi):
    """The tile rows whose query a piece loads: none where no row of the tile
    sees a key of it (an unused item; the batch-invariant mode's static bound
    is mostly such items), whose statistics need no query."""
    return tl.where(tok_lo < tok_hi, m_live, False)


@triton.jit
def _store_partial(seg_out_ptr, seg_max_ptr, seg_sum_ptr, offs, m_live, poisoned, seg_max,
                   seg_sum, acc, kv_scale, first_col, offs_d, d_live, STORE_STATS: tl.constexpr, DL: tl.constexpr):
    """Stage 3's contract: unnormalised float32 output columns (and, once per
    tile, the base-2 statistics) of one segment."""
    if STORE_STATS:
        tl.store(seg_max_ptr + offs, seg_max, mask=m_live)
        tl.store(seg_sum_ptr + offs, seg_sum, mask=m_live)
    acc = tl.where(poisoned[:, None], float("nan"), acc * kv_scale)
    # Rows with no key in the segment store no output (the merge never reads
    # it; see gluon_kernels.helpers.epilogue).
    tl.store(seg_out_ptr + offs[:, None] * DL + first_col + offs_d[None, :], acc,
             mask=(m_live & (seg_sum != 0))[:, None] & d_live[None, :])


@triton.jit
def _store_final(out_ptr, lse_ptr, pair, m_live, seg_max, seg_sum, acc, kv_scale, first_col, offs_d,
                 d_live, STORE_LSE: tl.constexpr, DL: tl.constexpr):
    """With one segment, stage 4 in the epilogue: a row's merge is its own
    statistics (weight exp2(m - m) = 1 where it saw a key), so the output is
    normalised here and no partials are written or merged."""
    out, lse = helpers.final_of(acc * kv_scale, seg_max, seg_sum)
    if STORE_LSE:
        tl.store(lse_ptr + pair, lse, mask=m_live)
    tl.store(out_ptr + pair[:, None] * DL + first_col + offs_d[None, :], out.to(out_ptr.dtype.element_ty),
             mask=m_live[:, None] & d_live[None, :])


@triton.jit
def _segmented_attention_piece(
    item,
    q_ptr,           # [B*QLEN, H, DL+DR]
    kv_ptr,          # [num_slots, DL+DR]: the cache, one row per token slot
    kv_scale_ptr,    # float32 [1] (read only when HAS_KV_SCALE)
    row_lens_ptr,    # int32 [B*QLEN]
    page_table_ptr,  # int32 [B, max_pages]
    work_ptr,        # int32 [NI, WORK_COLS]: the schedule's pieces (and the stream's runs)
    seg_out_ptr,     # float32 [NI, H, QLEN, DL] out
    seg_max_ptr,     # float32 [NI, H, QLEN] out, base 2
    seg_sum_ptr,     # float32 [NI, H, QLEN] out
    out_ptr,         # [B*QLEN, H, DL] out, q's dtype (FINALIZE only)
    lse_ptr,         # float32 [B*QLEN, H] out, natural log (FINALIZE only)
    stride_q_row, stride_q_head,
    stride_kv_slot,
    stride_page_b,
    softmax_scale_log2,  # softmax_scale * log2(e)
    max_pages,           # page_table's width: the static bound in pages
    QLEN: tl.constexpr,
    H: tl.constexpr,
    DL: tl.constexpr,
    DR: tl.constexpr,
    DL_PAD: tl.constexpr,
    DR_PAD: tl.constexpr,
    PAGE: tl.constexpr,
    HAS_KV_SCALE: tl.constexpr,
    Q_TO_FP16: tl.constexpr,
    FINALIZE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    FP8_PRODUCTS: tl.constexpr = False,
    WORK_COLS: tl.constexpr = 3,
):
    """One piece of :func:`segmented_attention_kernel` (its ``item``): a request's rows over the piece's pages."""
    b, m_live, head, row, row_len, tok_lo, tok_hi = _piece_work(row_lens_ptr, work_ptr, item, QLEN, H, PAGE,
                                                                BLOCK_M, WORK_COLS)

    offs_dl = tl.arange(0, DL_PAD)
    offs_dr = tl.arange(0, DR_PAD)
    dl_live = offs_dl < DL
    dr_live = offs_dr < DR
    # Load q once: it stays on chip for the whole segment.
    q_base = q_ptr + row[:, None].to(tl.int64) * stride_q_row + head[:, None] * stride_q_head
    q_live = _q_live(m_live, tok_lo, tok_hi)
    q_nope = tl.load(q_base + offs_dl[None, :], mask=q_live[:, None] & dl_live[None, :], other=0.0)
    if DR > 0:
        q_rope = tl.load(q_base + DL + offs_dr[None, :], mask=q_live[:, None] & dr_live[None, :], other=0.0)

    kv_scale = helpers.kv_scale_of(kv_scale_ptr, HAS_KV_SCALE)
    score_scale = tl.full([BLOCK_M], 1.0, tl.float32) * (softmax_scale_log2 * kv_scale)
    if Q_TO_FP16:
        amax = helpers.row_absmax(q_nope)
        if DR > 0:
            amax = tl.maximum(amax, helpers.row_absmax(q_rope))
        factor, unscale = helpers.fp16_row_shift(amax)
        q_nope = helpers.scaled_rows(q_nope, factor, tl.float16)
        if DR > 0:
            q_rope = helpers.scaled_rows(q_rope, factor, tl.float16)
        score_scale = score_scale * unscale
    if FP8_PRODUCTS:
        factor, lat_unscale = helpers.e4m3_row_shift(helpers.row_absmax(q_nope))
        q_nope = helpers.scaled_rows(q_nope, factor, tl.float8e4nv)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, DL_PAD], dtype=tl.float32)
    shortest = _shortest(row_len, m_live, tok_hi)

    for start in range(tok_lo, tok_hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_live = offs_n < tok_hi
        if PAGE >= BLOCK_N:
            # Segments start on page boundaries and BLOCK_N divides PAGE, so the
            # tile lies in one page: one id, and addresses the compiler can
            # see are contiguous.
            page_id = tl.load(page_table_ptr + b * stride_page_b + start // PAGE)
            first_slot = page_id.to(tl.int64) * PAGE + start % PAGE
            kv_row = kv_ptr + first_slot * stride_kv_slot + tl.arange(0, BLOCK_N)[:, None] * stride_kv_slot
        else:
            page_id = tl.load(page_table_ptr + b * stride_page_b + offs_n // PAGE, mask=n_live, other=0)
            slot = page_id.to(tl.int64) * PAGE + offs_n % PAGE
            kv_row = kv_ptr + slot[:, None] * stride_kv_slot
        # Masked on load: NaN or garbage in slots this tile must not read stays out.
        k_nope = tl.load(kv_row + offs_dl[None, :], mask=n_live[:, None] & dl_live[None, :], other=0.0)
        k_nope = k_nope.to(q_nope.dtype)
        scores = tl.dot(q_nope, tl.trans(k_nope), input_precision=DOT_PRECISION)
        if FP8_PRODUCTS:
            scores = scores * lat_unscale[:, None]
        if DR > 0:
            k_rope = tl.load(kv_row + DL + offs_dr[None, :], mask=n_live[:, None] & dr_live[None, :], other=0.0)
            scores += tl.dot(q_rope, tl.trans(k_rope.to(q_rope.dtype)), input_precision=DOT_PRECISION)
        visible = n_live[None, :] & (offs_n[None, :] < row_len[:, None])
        probs, alpha, m_i, l_i = _online_softmax(scores, visible, m_i, l_i, score_scale)
        # The value is the first DL columns of the key tile already on chip.
        values = k_nope
        if start + BLOCK_N > shortest:
            values = helpers.finite_or_zero(k_nope).to(k_nope.dtype)
        if FP8_PRODUCTS:
            probs = probs * helpers.P_SCALE
        acc = acc * alpha[:, None] + tl.dot(probs.to(q_nope.dtype), values, input_precision=DOT_PRECISION)

    poisoned, seg_max, seg_sum = _segment_stats(m_i, l_i, row_len, max_pages, PAGE)
    pair = row.to(tl.int64) * H + head
    if FP8_PRODUCTS:
        kv_scale = kv_scale / helpers.P_SCALE
    if FINALIZE:
        _store_final(out_ptr, lse_ptr, pair, m_live, seg_max, seg_sum, acc, kv_scale, 0, offs_dl, dl_live,
                     True, DL)
    else:
        _store_partial(seg_out_ptr, seg_max_ptr, seg_sum_ptr, _slot_of(item, b, row, head, QLEN, H), m_live,
                       poisoned, seg_max, seg_sum, acc, kv_scale, 0, offs_dl, dl_live, True, DL)


@triton.jit
def segmented_attention_kernel(
    q_ptr,           # [B*QLEN, H, DL+DR]
    kv_ptr,          # [num_slots, DL+DR]: the cache, one row per token slot
    kv_scale_ptr,    # float32 [1] (read only when HAS_KV_SCALE)
    row_lens_ptr,    # int32 [B*QLEN]
    page_table_ptr,  # int32 [B, max_pages]
    work_ptr,        # int32 [NI, WORK_COLS]: the schedule's pieces (and the stream's runs)
    seg_out_ptr,     # float32 [NI, H, QLEN, DL] out
    seg_max_ptr,     # float32 [NI, H, QLEN] out, base 2
    seg_sum_ptr,     # float32 [NI, H, QLEN] out
    out_ptr,         # [B*QLEN, H, DL] out, q's dtype (FINALIZE only)
    lse_ptr,         # float32 [B*QLEN, H] out, natural log (FINALIZE only)
    stride_q_row, stride_q_head,
    stride_kv_slot,
    stride_page_b,
    softmax_scale_log2,  # softmax_scale * log2(e)
    max_pages,           # page_table's width: the static bound in pages
    QLEN: tl.constexpr,
    H: tl.constexpr,
    DL: tl.constexpr,
    DR: tl.constexpr,
    DL_PAD: tl.constexpr,
    DR_PAD: tl.constexpr,
    PAGE: tl.constexpr,
    HAS_KV_SCALE: tl.constexpr,
    Q_TO_FP16: tl.constexpr,
    FINALIZE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PDL: tl.constexpr,
    FP8_PRODUCTS: tl.constexpr = False,
    WORK_COLS: tl.constexpr = 3,
):
    """One program: its piece (or the stream schedule's run of pieces), BLOCK_M (head, verify row) pairs.

    Pointer loads: any page size (pages smaller than the KV tile gather per
    token), any width, and the CPU interpreter. ``FP8_PRODUCTS`` (e4m3
    cache, VerifyConfig.fp8_products): q's latent part and P in e4m3, the
    latent scores and P @ V on fp8 operands, the rope part in q's dtype.
    """
    helpers.after_previous_kernel(PDL)
    tl.static_assert(BLOCK_M % 16 == 0, "BLOCK_M must be a multiple of 16 for tl.dot")
    tl.static_assert(BLOCK_N % 16 == 0, "BLOCK_N must be a multiple of 16 for tl.dot")
    if WORK_COLS == STREAM_WORK:
        # A run of pieces (the stream schedule's may cross requests), one after another.
        first, end = helpers.program_pieces(work_ptr, tl.program_id(1))
        for item in range(first, end):
            _segmented_attention_piece(item, q_ptr, kv_ptr, kv_scale_ptr, row_lens_ptr, page_table_ptr, work_ptr,
                                       seg_out_ptr, seg_max_ptr, seg_sum_ptr, out_ptr, lse_ptr, stride_q_row,
                                       stride_q_head, stride_kv_slot, stride_page_b, softmax_scale_log2, max_pages,
                                       QLEN, H, DL, DR, DL_PAD, DR_PAD, PAGE, HAS_KV_SCALE, Q_TO_FP16, FINALIZE,
                                       DOT_PRECISION, BLOCK_M, BLOCK_N, FP8_PRODUCTS, WORK_COLS)
    else:
        _segmented_attention_piece(tl.program_id(1), q_ptr, kv_ptr, kv_scale_ptr, row_lens_ptr, page_table_ptr,
                                   work_ptr, seg_out_ptr, seg_max_ptr, seg_sum_ptr, out_ptr, lse_ptr, stride_q_row,
                                   stride_q_head, stride_kv_slot, stride_page_b, softmax_scale_log2, max_pages, QLEN,
                                   H, DL, DR, DL_PAD, DR_PAD, PAGE, HAS_KV_SCALE, Q_TO_FP16, FINALIZE, DOT_PRECISION,
                                   BLOCK_M, BLOCK_N, FP8_PRODUCTS, WORK_COLS)



@triton.jit
def _tma_tile(q_lo, q_hi, q_rope, kv_lo_desc, kv_rope_desc, page_table_ptr, b, stride_page_b, start, tok_hi,
              row_len, m_i, l_i, acc_lo, acc_hi, score_scale, lat_unscale, DL: tl.constexpr, PAGE: tl.constexpr,
              BLOCK_N: tl.constexpr, PARTIAL: tl.constexpr, FP8_PRODUCTS: tl.constexpr):
    """One KV tile of the descriptor kernel: three box loads, three dots for
    the scores, two for the value (each half of the 512-wide accumulator).
    ``FP8_PRODUCTS``: the latent halves stay e4m3 (as q's are), their scores
    are unscaled by q's row factor ``lat_unscale``, and P goes to e4m3."""
    HALF: tl.constexpr = DL // 2
    page_id = tl.load(page_table_ptr + b * stride_page_b + start // PAGE)
    slot = page_id * PAGE + start % PAGE
    k_lo = kv_lo_desc.load([slot, 0]).to(q_lo.dtype)
    k_hi = kv_lo_desc.load([slot, HALF]).to(q_lo.dtype)
    k_rope = kv_rope_desc.load([slot, DL]).to(q_rope.dtype)
    offs_n = start + tl.arange(0, BLOCK_N)
    scores = tl.dot(q_lo, tl.trans(k_lo))
    scores = tl.dot(q_hi, tl.trans(k_hi), scores)
    if FP8_PRODUCTS:
        scores = scores * lat_unscale[:, None]
    scores = tl.dot(q_rope, tl.trans(k_rope), scores)
    visible = offs_n[None, :] < row_len[:, None]
    if PARTIAL:
        # A tile past the shortest row: the box may cover slots past the
        # segment's end (inside the page, unspecified contents), and some
        # rows mask tokens others see. Scores are masked; the values are
        # zeroed there and wherever not finite, so that 0 * NaN cannot reach
        # a row's output (see helpers.finite_or_zero).
        n_live = offs_n < tok_hi
        visible = visible & n_live[None, :]
        k_lo = tl.where(n_live[:, None], helpers.finite_or_zero(k_lo), 0.0).to(q_lo.dtype)
        k_hi = tl.where(n_live[:, None], helpers.finite_or_zero(k_hi), 0.0).to(q_lo.dtype)
    probs, alpha, m_i, l_i = _online_softmax(scores, visible, m_i, l_i, score_scale)
    if FP8_PRODUCTS:
        probs = probs * helpers.P_SCALE
    probs = probs.to(q_lo.dtype)
    acc_lo = tl.dot(probs, k_lo, acc_lo * alpha[:, None])
    acc_hi = tl.dot(probs, k_hi, acc_hi * alpha[:, None])
    return m_i, l_i, acc_lo, acc_hi


@triton.jit
def _segmented_attention_tma_piece(
    item,
    q_ptr,           # [B*QLEN, H, DL+DR], 16-bit
    kv_lo_desc,      # descriptor of the cache as [num_slots, DL+DR], box [BLOCK_N, DL // 2]
    kv_rope_desc,    # the same cache, box [BLOCK_N, DR]
    kv_scale_ptr,
    row_lens_ptr,
    page_table_ptr,
    work_ptr,
    seg_out_ptr,
    seg_max_ptr,
    seg_sum_ptr,
    out_ptr,
    lse_ptr,
    stride_q_row, stride_q_head,
    stride_page_b,
    softmax_scale_log2,
    max_pages,
    QLEN: tl.constexpr,
    H: tl.constexpr,
    DL: tl.constexpr,
    DR: tl.constexpr,
    PAGE: tl.constexpr,
    HAS_KV_SCALE: tl.constexpr,
    Q_TO_FP16: tl.constexpr,
    FINALIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
    FP8_PRODUCTS: tl.constexpr = False,
    WORK_COLS: tl.constexpr = 3,
):
    """One piece of :func:`segmented_attention_tma_kernel` (its ``item``): a request's rows over the piece's pages."""
    HALF: tl.constexpr = DL // 2
    b, m_live, head, row, row_len, tok_lo, tok_hi = _piece_work(row_lens_ptr, work_ptr, item, QLEN, H, PAGE,
                                                                BLOCK_M, WORK_COLS)

    offs_half = tl.arange(0, HALF)
    offs_dr = tl.arange(0, DR)
    q_base = q_ptr + row[:, None].to(tl.int64) * stride_q_row + head[:, None] * stride_q_head
    q_live = _q_live(m_live, tok_lo, tok_hi)
    q_lo = tl.load(q_base + offs_half[None, :], mask=q_live[:, None], other=0.0)
    q_hi = tl.load(q_base + HALF + offs_half[None, :], mask=q_live[:, None], other=0.0)
    q_rope = tl.load(q_base + DL + offs_dr[None, :], mask=q_live[:, None], other=0.0)

    kv_scale = helpers.kv_scale_of(kv_scale_ptr, HAS_KV_SCALE)
    score_scale = tl.full([BLOCK_M], 1.0, tl.float32) * (softmax_scale_log2 * kv_scale)
    if Q_TO_FP16:
        amax = tl.maximum(tl.maximum(helpers.row_absmax(q_lo), helpers.row_absmax(q_hi)), helpers.row_absmax(q_rope))
        factor, unscale = helpers.fp16_row_shift(amax)
        q_lo = helpers.scaled_rows(q_lo, factor, tl.float16)
        q_hi = helpers.scaled_rows(q_hi, factor, tl.float16)
        q_rope = helpers.scaled_rows(q_rope, factor, tl.float16)
        score_scale = score_scale * unscale
    lat_unscale = score_scale   # a placeholder: read only with FP8_PRODUCTS
    if FP8_PRODUCTS:
        factor, lat_unscale = helpers.e4m3_row_shift(tl.maximum(helpers.row_absmax(q_lo),
                                                                helpers.row_absmax(q_hi)))
        q_lo = helpers.scaled_rows(q_lo, factor, tl.float8e4nv)
        q_hi = helpers.scaled_rows(q_hi, factor, tl.float8e4nv)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc_lo = tl.zeros([BLOCK_M, HALF], dtype=tl.float32)
    acc_hi = tl.zeros([BLOCK_M, HALF], dtype=tl.float32)

    # Tiles wholly below the shortest row run unmasked; the one or two past
    # it (q - 1 tokens at most) mask scores and guard values.
    shortest = _shortest(row_len, m_live, tok_hi)
    full_end = tok_lo + tl.maximum(shortest - tok_lo, 0) // BLOCK_N * BLOCK_N
    for start in tl.range(tok_lo, full_end, BLOCK_N, num_stages=NUM_STAGES, warp_specialize=WARP_SPECIALIZE):
        m_i, l_i, acc_lo, acc_hi = _tma_tile(q_lo, q_hi, q_rope, kv_lo_desc, kv_rope_desc, page_table_ptr, b,
                                             stride_page_b, start, tok_hi, row_len, m_i, l_i, acc_lo, acc_hi,
                                             score_scale, lat_unscale, DL, PAGE, BLOCK_N, False, FP8_PRODUCTS)
    for start in range(full_end, tok_hi, BLOCK_N):
        m_i, l_i, acc_lo, acc_hi = _tma_tile(q_lo, q_hi, q_rope, kv_lo_desc, kv_rope_desc, page_table_ptr, b,
                                             stride_page_b, start, tok_hi, row_len, m_i, l_i, acc_lo, acc_hi,
                                             score_scale, lat_unscale, DL, PAGE, BLOCK_N, True, FP8_PRODUCTS)

    poisoned, seg_max, seg_sum = _segment_stats(m_i, l_i, row_len, max_pages, PAGE)
    pair = row.to(tl.int64) * H + head
    all_cols = offs_half < HALF
    if FP8_PRODUCTS:
        kv_scale = kv_scale / helpers.P_SCALE
    if FINALIZE:
        _store_final(out_ptr, lse_ptr, pair, m_live, seg_max, seg_sum, acc_lo, kv_scale, 0, offs_half,
                     all_cols, True, DL)
        _store_final(out_ptr, lse_ptr, pair, m_live, seg_max, seg_sum, acc_hi, kv_scale, HALF, offs_half,
                     all_cols, False, DL)
    else:
        slot = _slot_of(item, b, row, head, QLEN, H)
        _store_partial(seg_out_ptr, seg_max_ptr, seg_sum_ptr, slot, m_live, poisoned, seg_max,
                       seg_sum, acc_lo, kv_scale, 0, offs_half, all_cols, True, DL)
        _store_partial(seg_out_ptr, seg_max_ptr, seg_sum_ptr, slot, m_live, poisoned, seg_max,
                       seg_sum, acc_hi, kv_scale, HALF, offs_half, all_cols, False, DL)


@triton.jit
def segmented_attention_tma_kernel(
    q_ptr,           # [B*QLEN, H, DL+DR], 16-bit
    kv_lo_desc,      # descriptor of the cache as [num_slots, DL+DR], box [BLOCK_N, DL // 2]
    kv_rope_desc,    # the same cache, box [BLOCK_N, DR]
    kv_scale_ptr,
    row_lens_ptr,
    page_table_ptr,
    work_ptr,
    seg_out_ptr,
    seg_max_ptr,
    seg_sum_ptr,
    out_ptr,
    lse_ptr,
    stride_q_row, stride_q_head,
    stride_page_b,
    softmax_scale_log2,
    max_pages,
    QLEN: tl.constexpr,
    H: tl.constexpr,
    DL: tl.constexpr,
    DR: tl.constexpr,
    PAGE: tl.constexpr,
    HAS_KV_SCALE: tl.constexpr,
    Q_TO_FP16: tl.constexpr,
    FINALIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
    PDL: tl.constexpr,
    FP8_PRODUCTS: tl.constexpr = False,
    WORK_COLS: tl.constexpr = 3,
):
    """:func:`segmented_attention_kernel` with tensor-memory-accelerator loads.

    Pages hold whole KV tiles (PAGE >= BLOCK_N), so each tile is a 2-D box of
    the cache: one descriptor load per box instead of per-thread addresses,
    which frees registers and issue slots and is what Triton's Hopper warp
    specialisation requires. A box is at most 256 wide, so the 512 latent
    columns come as two halves, each with its own half of the accumulator.
    Every tile below the tile's shortest row runs unmasked.
    """
    helpers.after_previous_kernel(PDL)
    if WORK_COLS == STREAM_WORK:
        # A run of pieces (the stream schedule's may cross requests), one after another.
        first, end = helpers.program_pieces(work_ptr, tl.program_id(1))
        for item in range(first, end):
            _segmented_attention_tma_piece(item, q_ptr, kv_lo_desc, kv_rope_desc, kv_scale_ptr, row_lens_ptr,
                                           page_table_ptr, work_ptr, seg_out_ptr, seg_max_ptr, seg_sum_ptr, out_ptr,
                                           lse_ptr, stride_q_row, stride_q_head, stride_page_b, softmax_scale_log2,
                                           max_pages, QLEN, H, DL, DR, PAGE, HAS_KV_SCALE, Q_TO_FP16, FINALIZE,
                                           BLOCK_M, BLOCK_N, NUM_STAGES, WARP_SPECIALIZE, FP8_PRODUCTS, WORK_COLS)
    else:
        _segmented_attention_tma_piece(tl.program_id(1), q_ptr, kv_lo_desc, kv_rope_desc, kv_scale_ptr, row_lens_ptr,
                                       page_table_ptr, work_ptr, seg_out_ptr, seg_max_ptr, seg_sum_ptr, out_ptr,
                                       lse_ptr, stride_q_row, stride_q_head, stride_page_b, softmax_scale_log2,
                                       max_pages, QLEN, H, DL, DR, PAGE, HAS_KV_SCALE, Q_TO_FP16, FINALIZE, BLOCK_M,
                                       BLOCK_N, NUM_STAGES, WARP_SPECIALIZE, FP8_PRODUCTS, WORK_COLS)



@triton.jit
def merge_segments_kernel(
    seg_out_ptr,   # float32 [NI, H, QLEN, DL]
    seg_max_ptr,   # float32 [NI, H, QLEN], base 2
    seg_sum_ptr,   # float32 [NI, H, QLEN]
    segments_ptr,  # int32 [B, 3]: per request (first, full, tail)
    out_ptr,       # [B*QLEN*H, DL] out, the query dtype
    lse_ptr,       # float32 [B*QLEN*H] out, natural log
    QLEN: tl.constexpr,
    H: tl.constexpr,
    DL: tl.constexpr,
    BLOCK_D: tl.constexpr,
    CHUNK: tl.constexpr,
    PDL: tl.constexpr,
    PIECES: tl.constexpr = 0,
):
    """One program: one (row, head) pair, BLOCK_D output columns, over its
    request's items CHUNK at a time (a long request has many, a short one
    few: the schedule decides), with a running max so any count fits.
    ``PIECES`` > 0: no schedule (``segments_ptr`` unread): request ``b`` has
    the PIECES items from ``b * PIECES`` (the sparse kernel's pieces).

    Splitting the columns over programs keeps a latency-bound step (one
    request, many segments) from serialising a whole 512-wide row per program.
    """
    helpers.after_previous_kernel(PDL)
    pair = tl.program_id(0).to(tl.int64)
    d_block = tl.program_id(1)
    row = pair // H
    head = pair % H
    b = row // QLEN
    local = head * QLEN + row % QLEN
    if PIECES > 0:
        first = (b * PIECES).to(tl.int32)
        full = tl.full([], PIECES, tl.int32)
        tail = tl.full([], -1, tl.int32)
        count = full
    else:
        first = tl.load(segments_ptr + b * 3)
        full = tl.load(segments_ptr + b * 3 + 1)
        tail = tl.load(segments_ptr + b * 3 + 2)
        count = full + (tail >= 0).to(tl.int32)
    offs_d = d_block * BLOCK_D + tl.arange(0, BLOCK_D)
    d_live = offs_d < DL
    m_run = tl.full([1], float("-inf"), tl.float32)
    total = tl.zeros([1], tl.float32)
    acc = tl.zeros([BLOCK_D], tl.float32)
    bad = tl.zeros([1], tl.int32)
    for s0 in range(0, count, CHUNK):
        ordinal = s0 + tl.arange(0, CHUNK)
        s_live = ordinal < count
        slot = tl.where(ordinal < full, first + ordinal, tail).to(tl.int64) * (H * QLEN) + local
        seg_max = tl.load(seg_max_ptr + slot, mask=s_live, other=float("-inf"))
        seg_sum = tl.load(seg_sum_ptr + slot, mask=s_live, other=0.0)
        # Issued with the statistics' loads, not after them (one memory round
        # trip less: the latency of a one-request step). An empty segment's
        # output is unspecified: it is selected away below, never weighted by 0.
        seg_out = tl.load(seg_out_ptr + slot[:, None] * DL + offs_d[None, :], mask=s_live[:, None] & d_live[None, :],
                          other=0.0)
        # A poisoned segment: NaN (stage 3's), or +inf (never ours; read as poison, not as a key).
        bad += tl.sum(((seg_max != seg_max) | (seg_max == float("inf"))).to(tl.int32), axis=0)
        m_new = tl.maximum(m_run, tl.max(seg_max, axis=0))
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        present = seg_max > float("-inf")
        weight = tl.where(present, tl.exp2(seg_max - m_shift), 0.0)
        alpha = tl.exp2(m_run - m_shift)
        total = total * alpha + tl.sum(weight * seg_sum, axis=0)
        acc = acc * alpha + tl.sum(tl.where(present[:, None], weight[:, None] * seg_out, 0.0), axis=0)
        m_run = m_new
    corrupt = bad > 0
    nonempty, inv_sum, lse = helpers.normalise(total, tl.where(m_run == float("-inf"), 0.0, m_run), corrupt)
    out = tl.where(corrupt, float("nan"), tl.where(nonempty, acc * inv_sum, 0.0))
    tl.store(out_ptr + pair * DL + offs_d, out.to(out_ptr.dtype.element_ty), mask=d_live)
    if d_block == 0:
        tl.store(lse_ptr + pair + tl.arange(0, 1), lse)


# Batches of up to this many requests (the chunked schedule's BLOCK_B) always sort their tails,
# and so do those above the second bound, whose build spills with the check (16 bytes a thread
# at 1024 requests, four warps, Triton 3.9).
SORTED_TAILS_MAX_BATCH = tl.constexpr(32)
UNSORTED_TAILS_MAX_BATCH = tl.constexpr(512)


@triton.jit
def _store_sorted_tails(work_ptr, segments_ptr, offs_b, has_tail, num_tails, num_full, full, rest, chunk, max_pages,
                        BLOCK_B: tl.constexpr):
    """The tails as items ``num_full ..``, longest first, ties in request
    order: one sort of a key that orders by decreasing length, then request,
    and carries the request's full count in its low digits."""
    span = tl.cast(max_pages, tl.int64) + 1   # a cast, not .to: a bound of 1 arrives as a constant
    key = ((span - rest) * BLOCK_B + offs_b) * span + full
    key = tl.sort(tl.where(has_tail, key, (span + 1) * BLOCK_B * span))
    t_full = (key % span).to(tl.int32)
    t_req = ((key // span) % BLOCK_B).to(tl.int32)
    t_rest = (span - key // (span * BLOCK_B)).to(tl.int32)
    _store_tails(work_ptr, segments_ptr, num_full + offs_b, t_req, t_full * chunk, t_rest, offs_b < num_tails)


@triton.jit
def _store_tails(work_ptr, segments_ptr, item, request, first, pages, live):
    """Each live ``request``'s tail, pages ``[first, first + pages)``, as item ``item``."""
    tl.store(work_ptr + item * 3, request, mask=live)
    tl.store(work_ptr + item * 3 + 1, first, mask=live)
    tl.store(work_ptr + item * 3 + 2, first + pages, mask=live)
    tl.store(segments_ptr + request * 3 + 2, item, mask=live)


@triton.jit
def _schedule_requests(pages, offs_b, b_live, work_ptr, segments_ptr, num_items, max_pages, fixed_chunk,
                       BLOCK_B: tl.constexpr, ITEMS_STEP: tl.constexpr):
    """pure.build_schedule on the device, in one program, from each request's
    page count: the smallest chunk with sum_b max(1, cdiv(n_b, chunk)) <=
    num_items, by bisection; the full segments in request order, then the
    tails longest first, then the unused items (empty ranges of request 0).
    ``fixed_chunk > 0`` (batch-invariant mode) takes that chunk instead."""
    # The bisection starts from bounds the step's total gives, so it takes
    # log2 of their gap in steps, not of [1, max_pages] (13 steps at 4096
    # pages, each a reduction on the step's critical path; a uniform step's
    # gap is a few pages, C7's none). Below total / num_items a chunk needs
    # more items than that; at total / (num_items - B) it needs fewer than
    # num_items (each request at most one more than n_b / chunk); the
    # longest request's pages always fit one item each. The least feasible
    # chunk is unique, so the oracle's fixed 32 steps land on the same one.
    live_pages = tl.where(b_live, pages, 0)
    total = tl.sum(live_pages.to(tl.int64), axis=0)
    requests = tl.sum(b_live.to(tl.int32), axis=0)
    lo = tl.maximum(tl.cdiv(total, num_items), 1).to(tl.int32)
    hi = tl.maximum(tl.max(live_pages, axis=0), 1)
    spare = num_items - requests
    if spare > 0:
        hi = tl.minimum(hi, tl.maximum(tl.cdiv(total, spare), 1).to(tl.int32))
    if fixed_chunk > 0:
        hi = lo
    while lo < hi:
        mid = (lo + hi) // 2
        need = tl.sum(tl.where(b_live, tl.maximum(tl.cdiv(pages, mid), 1), 0), axis=0)
        feasible = need <= num_items
        hi = tl.where(feasible, mid, hi)
        lo = tl.where(feasible, lo, mid + 1)
    chunk = tl.where(fixed_chunk > 0, fixed_chunk, hi)
    full = tl.where(b_live, pages // chunk, 0)
    rest = pages - full * chunk
    has_tail = b_live & ((rest > 0) | (pages == 0))
    full_end = tl.cumsum(full, axis=0)
    full_first = full_end - full
    num_full = tl.sum(full, axis=0)
    tl.store(segments_ptr + offs_b * 3, full_first, mask=b_live)
    tl.store(segments_ptr + offs_b * 3 + 1, full, mask=b_live)
    tl.store(segments_ptr + offs_b * 3 + 2, tl.full([BLOCK_B], -1, tl.int32), mask=b_live & ~has_tail)
    # Full segments, ITEMS_STEP of each request's at a time.
    offs_s = tl.arange(0, ITEMS_STEP)
    for s0 in range(0, tl.max(full, axis=0), ITEMS_STEP):
        seg = s0 + offs_s[None, :]                                      # [1, S]
        live = b_live[:, None] & (seg < full[:, None])                  # [B, S]
        item = full_first[:, None] + seg
        page_lo = seg * chunk
        tl.store(work_ptr + item * 3, offs_b[:, None] + 0 * seg, mask=live)
        tl.store(work_ptr + item * 3 + 1, page_lo + 0 * offs_b[:, None], mask=live)
        tl.store(work_ptr + item * 3 + 2, page_lo + chunk + 0 * offs_b[:, None], mask=live)
    # Tails: by decreasing length, ties in request order. A large batch whose
    # tails all have one length (every uniform step) keeps request order
    # without the sort, a bitonic network of 64-bit keys in one warp on the
    # step's critical path (C6's 128 requests spent 2.4 of 5.5 us in it). At
    # 32 requests and fewer the check costs what it saves (R1: +0.3 us).
    num_tails = tl.sum(has_tail.to(tl.int32), axis=0)
    if (BLOCK_B > SORTED_TAILS_MAX_BATCH) and (BLOCK_B <= UNSORTED_TAILS_MAX_BATCH):
        longest = tl.max(tl.where(has_tail, rest, -1), axis=0)
        shortest = tl.min(tl.where(has_tail, rest, max_pages + 1), axis=0)
        if (longest == shortest) | (num_tails <= 1):
            _store_tails(work_ptr, segments_ptr, num_full + tl.cumsum(has_tail.to(tl.int32), axis=0) - 1, offs_b,
                         full * chunk, rest, has_tail)
        else:
            _store_sorted_tails(work_ptr, segments_ptr, offs_b, has_tail, num_tails, num_full, full, rest, chunk,
                                max_pages, BLOCK_B)
    else:
        _store_sorted_tails(work_ptr, segments_ptr, offs_b, has_tail, num_tails, num_full, full, rest, chunk,
                            max_pages, BLOCK_B)
    for i0 in range(num_full + num_tails, num_items, ITEMS_STEP):
        item = i0 + offs_s
        unused = item < num_items
        zero = tl.zeros([ITEMS_STEP], tl.int32)
        tl.store(work_ptr + item * 3, zero, mask=unused)
        tl.store(work_ptr + item * 3 + 1, zero, mask=unused)
        tl.store(work_ptr + item * 3 + 2, zero, mask=unused)


@triton.jit
def _stream_cut(run, total, programs, wide):
    """First page of stream run ``run`` (pure.build_schedule): floor(run * total / programs), or a
    page per run where there are fewer pages than programs (``wide`` false). In 32 bits, as
    run * (total // programs) + run * (total % programs) // programs: the launcher keeps
    programs <= STREAM_MAX_PROGRAMS, so the last product fits. A 64-bit division is a long
    subroutine, and the pieces' loop runs two a piece (one request over 128 programs: 7 us)."""
    even = run * (total // programs) + run * (total % programs) // programs
    return tl.where(wide, even, tl.minimum(run, total))


@triton.jit
def _small_quotient(n, d):
    """``n // d`` for int64 ``n >= 0`` and int32 ``d >= 1`` whose quotient is below 2^17,
    without a 64-bit division (a long subroutine, three a request on the step's
    critical path): a float32 estimate, within 0.07 of the quotient at that size,
    moved onto it by one exact step each way."""
    d64 = tl.cast(d, tl.int64)
    q = tl.cast(n.to(tl.float32) / d.to(tl.float32), tl.int64)
    q = tl.where(q * d64 > n, q - 1, q)
    return tl.where((q + 1) * d64 <= n, q + 1, q)


@triton.jit
def _stream_run_of(position, total, programs, wide):
    """The stream run holding page ``position`` (the inverse of :func:`_stream_cut`).
    ``position <= total`` and ``programs <= STREAM_MAX_PROGRAMS`` keep the run
    below ``2 * programs + 1`` < 2^17."""
    even = _small_quotient((tl.cast(position, tl.int64) + 1) * programs - 1, tl.maximum(total, 1))
    return tl.where(wide, even.to(tl.int32), position)


@triton.jit
def _stream_first_run(start, pages, total, programs, wide, used):
    """The run holding a request's first piece: its first page's, or an empty
    request's position's (the last run where that is past every page)."""
    at_start = _stream_run_of(start, total, programs, wide)
    return tl.where(pages > 0, at_start, tl.minimum(at_start, used - 1))


@triton.jit
def _stream_requests(pages, pages_prev, pages_next, offs_b, b_live, batch, work_ptr, segments_ptr, num_items,
                     programs, BLOCK_B: tl.constexpr, ITEMS_STEP: tl.constexpr):
    """pure.build_schedule's stream (``programs > 0``) in one program:
    ``pages_prev`` and ``pages_next`` are requests ``b - 1``'s and ``b + 1``'s
    page counts (0 past either end). Stores only: each run's first and end
    piece are written by the pieces that open and close it, never read back
    (a dependent load per row of runs is a memory round trip on the step's
    critical path)."""
    end = tl.cumsum(pages, axis=0)
    start = end - pages
    total = tl.sum(pages, axis=0)
    wide = total >= programs
    used = tl.where(wide, programs, tl.maximum(total, 1))
    nonempty = pages > 0
    first_run = _stream_first_run(start, pages, total, programs, wide, used)
    last_run = tl.where(nonempty, _stream_run_of(end - 1, total, programs, wide), first_run)
    count = tl.where(b_live, last_run - first_run + 1, 0)
    first_piece = tl.cumsum(count, axis=0) - count
    num_pieces = tl.sum(count, axis=0)
    tl.store(segments_ptr + offs_b * 3, first_piece, mask=b_live)
    tl.store(segments_ptr + offs_b * 3 + 1, count, mask=b_live)
    tl.store(segments_ptr + offs_b * 3 + 2, tl.full([BLOCK_B], -1, tl.int32), mask=b_live)
    # Pieces in request order are in run order too. A request's first piece
    # opens its run unless earlier pages or an earlier empty request at the
    # same position are in that run; any later piece starts at its run's
    # first page. Its last piece closes its run unless the next request's
    # first piece is in the same run; any earlier one ends at its run's end.
    opens = (start == _stream_cut(first_run, total, programs, wide)) & ((offs_b == 0) | (pages_prev > 0))
    closes = (offs_b == batch - 1) | (_stream_first_run(end, pages_next, total, programs, wide, used) > last_run)
    offs_s = tl.arange(0, ITEMS_STEP)
    for k0 in range(0, tl.max(count, axis=0), ITEMS_STEP):
        k = k0 + offs_s[None, :]                                        # [1, S]
        live = b_live[:, None] & (k < count[:, None])                   # [B, S]
        run = first_run[:, None] + k
        piece = first_piece[:, None] + k
        lo = tl.where(nonempty[:, None],
                      tl.maximum(start[:, None], _stream_cut(run, total, programs, wide)) - start[:, None], 0)
        hi = tl.where(nonempty[:, None],
                      tl.minimum(end[:, None], _stream_cut(run + 1, total, programs, wide)) - start[:, None], 0)
        tl.store(work_ptr + piece * STREAM_WORK, offs_b[:, None] + 0 * k, mask=live)
        tl.store(work_ptr + piece * STREAM_WORK + 1, lo, mask=live)
        tl.store(work_ptr + piece * STREAM_WORK + 2, hi, mask=live)
        tl.store(work_ptr + run * STREAM_WORK + 3, piece, mask=live & ((k > 0) | opens[:, None]))
        tl.store(work_ptr + run * STREAM_WORK + 4, piece + 1, mask=live & ((k < count[:, None] - 1) | closes[:, None]))
    # The rows past the runs (every run has a piece, so the unused rows are
    # among them): no piece for their programs, an empty range past the
    # pieces. Steps of the pieces' tile: a uniform step has B of them, a
    # short request alone nearly every program's.
    offs_r = tl.arange(0, BLOCK_B * ITEMS_STEP)
    for i0 in range(used, num_items, BLOCK_B * ITEMS_STEP):
        item = i0 + offs_r
        past = item < num_items
        zero = tl.zeros([BLOCK_B * ITEMS_STEP], tl.int32)
        unused = past & (item >= num_pieces)
        tl.store(work_ptr + item * STREAM_WORK, zero, mask=unused)
        tl.store(work_ptr + item * STREAM_WORK + 1, zero, mask=unused)
        tl.store(work_ptr + item * STREAM_WORK + 2, zero, mask=unused)
        tl.store(work_ptr + item * STREAM_WORK + 3, zero, mask=past)
        tl.store(work_ptr + item * STREAM_WORK + 4, zero, mask=past)


@triton.jit
def _pages_of(last_row_len, PAGE: tl.constexpr, max_pages):
    """A request's pages from its last row's length: pure.build_schedule's ``n_b``."""
    return tl.minimum(tl.cdiv(tl.maximum(last_row_len, 0), PAGE), max_pages)


@triton.jit
def _row_pages(row_lens_ptr, request, batch, QLEN: tl.constexpr, PAGE: tl.constexpr, max_pages):
    """:func:`_pages_of` each ``request`` from the row lengths; 0 outside ``[0, batch)``."""
    inside = (request >= 0) & (request < batch)
    return _pages_of(tl.load(row_lens_ptr + request * QLEN + QLEN - 1, mask=inside, other=0), PAGE, max_pages)


@triton.jit
def _seq_pages(seq_lens_ptr, request, batch, QLEN: tl.constexpr, WORLD: tl.constexpr, RANK: tl.constexpr,
               INTERLEAVE: tl.constexpr, CAUSAL: tl.constexpr, PAGE: tl.constexpr, max_pages,
               CONTEXT: tl.constexpr):
    """:func:`_pages_of` each ``request`` from the global lengths (its last
    row's rank-local length, stage 1); 0 outside ``[0, batch)``, whose length
    0 holds no key."""
    inside = (request >= 0) & (request < batch)
    length = _context_len(tl.load(seq_lens_ptr + request, mask=inside, other=0), QLEN, CONTEXT)
    return _pages_of(_local_len(length, QLEN - 1, QLEN, WORLD, RANK, INTERLEAVE, CAUSAL), PAGE, max_pages)


@triton.jit
def schedule_kernel(
    row_lens_ptr,   # int32 [B*QLEN]
    work_ptr,       # int32 [NI, 3] out, the stream's [NI, 5] (programs > 0): pure.build_schedule
    segments_ptr,   # int32 [B, 3] out: per request (first, full, tail)
    batch,
    num_items,
    max_pages,
    fixed_chunk,
    programs,
    QLEN: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_B: tl.constexpr,
    ITEMS_STEP: tl.constexpr,
    PDL: tl.constexpr,
    STREAM: tl.constexpr = False,   # programs > 0: pure.build_schedule's stream
):
    """The step's schedule from the row lengths (:func:`_schedule_requests`)."""
    helpers.after_previous_kernel(PDL)
    offs_b = tl.arange(0, BLOCK_B)
    b_live = offs_b < batch
    pages = _row_pages(row_lens_ptr, offs_b, batch, QLEN, PAGE, max_pages)
    if STREAM:
        pages_prev = _row_pages(row_lens_ptr, offs_b - 1, batch, QLEN, PAGE, max_pages)
        pages_next = _row_pages(row_lens_ptr, offs_b + 1, batch, QLEN, PAGE, max_pages)
        _stream_requests(pages, pages_prev, pages_next, offs_b, b_live, batch, work_ptr, segments_ptr, num_items,
                         programs, BLOCK_B, ITEMS_STEP)
    else:
        _schedule_requests(pages, offs_b, b_live, work_ptr, segments_ptr, num_items, max_pages, fixed_chunk,
                           BLOCK_B, ITEMS_STEP)


@triton.jit
def step_metadata_kernel(
    seq_lens_ptr,   # int32 [B]
    row_lens_ptr,   # int32 [B*QLEN] out
    work_ptr,       # int32 [NI, 3] or [NI, 5] out
    segments_ptr,   # int32 [B, 3] out
    batch,
    num_items,
    max_pages,
    fixed_chunk,
    programs,
    QLEN: tl.constexpr,
    WORLD: tl.constexpr,
    RANK: tl.constexpr,
    INTERLEAVE: tl.constexpr,
    CAUSAL: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK: tl.constexpr,
    BLOCK_B: tl.constexpr,
    ITEMS_STEP: tl.constexpr,
    PDL: tl.constexpr,
    STREAM: tl.constexpr = False,   # programs > 0: pure.build_schedule's stream
    CONTEXT: tl.constexpr = False,  # a masked block's context: every length less QLEN (at least 0)
):
    """Stage 1 and the schedule in one launch: program 0 schedules (each
    request's last row's length computed here from seq_lens, not read back),
    the others write the row lengths. One kernel less on a step's critical
    path than row_lens_kernel then schedule_kernel."""
    helpers.after_previous_kernel(PDL)
    pid = tl.program_id(0)
    if pid == 0:
        offs_b = tl.arange(0, BLOCK_B)
        b_live = offs_b < batch
        pages = _seq_pages(seq_lens_ptr, offs_b, batch, QLEN, WORLD, RANK, INTERLEAVE, CAUSAL, PAGE, max_pages,
                           CONTEXT)
        if STREAM:
            pages_prev = _seq_pages(seq_lens_ptr, offs_b - 1, batch, QLEN, WORLD, RANK, INTERLEAVE, CAUSAL, PAGE,
                                    max_pages, CONTEXT)
            pages_next = _seq_pages(seq_lens_ptr, offs_b + 1, batch, QLEN, WORLD, RANK, INTERLEAVE, CAUSAL, PAGE,
                                    max_pages, CONTEXT)
            _stream_requests(pages, pages_prev, pages_next, offs_b, b_live, batch, work_ptr, segments_ptr,
                             num_items, programs, BLOCK_B, ITEMS_STEP)
        else:
            _schedule_requests(pages, offs_b, b_live, work_ptr, segments_ptr, num_items, max_pages, fixed_chunk,
                               BLOCK_B, ITEMS_STEP)
    else:
        _row_lens_block(seq_lens_ptr, row_lens_ptr, pid - 1, batch * QLEN, QLEN, WORLD, RANK, INTERLEAVE, BLOCK,
                        CAUSAL, CONTEXT)


@triton.jit
def merge_ranks_kernel(
    outs_ptr,  # [W, T*H, DL]
    lses_ptr,  # float32 [W, T*H], natural log
    out_ptr,   # [T*H, DL] out
    lse_ptr,   # float32 [T*H] out, natural log
    pairs,
    WORLD: tl.constexpr,
    W_PAD: tl.constexpr,
    DL: tl.constexpr,
    DL_PAD: tl.constexpr,
    PDL: tl.constexpr,
):
    helpers.after_previous_kernel(PDL)
    pair = tl.program_id(0).to(tl.int64)
    offs_w = tl.arange(0, W_PAD)
    offs_d = tl.arange(0, DL_PAD)
    w_live = offs_w < WORLD
    lse = tl.load(lses_ptr + offs_w * pairs + pair, mask=w_live, other=float("-inf"))
    # DESIGN's stage 5: NaN is a poisoned partial, never dropped; +inf is
    # another kernel's "no key" (FlashMLA's), read as -inf.
    poisoned = tl.sum((lse != lse).to(tl.int32), axis=0) > 0
    lse = tl.where((lse != lse) | (lse == float("inf")), float("-inf"), lse)
    top = tl.max(lse, axis=0)
    top = tl.where(top == float("-inf"), 0.0, top)
    present = lse > float("-inf")
    factor = tl.where(present, tl.exp(lse - top), 0.0)
    total = tl.sum(factor, axis=0)
    nonempty = total > 0
    weight = tl.where(nonempty, factor / tl.where(nonempty, total, 1.0), 0.0)
    outs = tl.load(outs_ptr + (offs_w[:, None] * pairs + pair) * DL + offs_d[None, :],
                   mask=w_live[:, None] & (offs_d[None, :] < DL), other=0.0).to(tl.float32)
    # A rank whose weight is 0 contributes exactly 0, whatever its output holds.
    merged = tl.sum(tl.where((weight > 0)[:, None], weight[:, None] * outs, 0.0), axis=0)
    merged = tl.where(poisoned, float("nan"), merged)
    merged_lse = tl.where(nonempty, top + tl.log(tl.where(nonempty, total, 1.0)), float("-inf"))
    tl.store(out_ptr + pair * DL + offs_d, merged.to(out_ptr.dtype.element_ty), mask=offs_d < DL)
    tl.store(lse_ptr + pair, tl.where(poisoned, float("nan"), merged_lse))


@triton.jit
def ragged_rows_kernel(
    q_ptr,            # [T, width] (unit inner stride)
    token_of_row_ptr,  # int32 [R]: the token each row holds, -1 for none
    rows_ptr,         # [R, width] out, contiguous
    stride_q,
    width,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    """Ragged blocks: row ``r`` (program 0) takes its token's columns, zeros where it holds none."""
    helpers.after_previous_kernel(PDL)
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    live = cols < width
    token = tl.load(token_of_row_ptr + row)
    # The mask as a vector (Triton's interpreter refuses a scalar term; on the GPU it stays uniform).
    held = (0 * cols + token) >= 0
    values = tl.load(q_ptr + tl.maximum(token, 0).to(tl.int64) * stride_q + cols, mask=live & held, other=0)
    tl.store(rows_ptr + tl.cast(row, tl.int64) * width + cols, values, mask=live)


@triton.jit
def ragged_map_kernel(
    starts_ptr,        # int32 or int64 [B + 1]: query_start_loc
    token_of_row_ptr,  # int32 [B*QLEN] out: each row's token, -1 for a padding row
    row_of_token_ptr,  # int32 [T] out: each token's row, NO_ROW or NO_REQUEST
    batch,
    num_tokens,
    QLEN: tl.constexpr,
    QLEN_PAD: tl.constexpr,
    NO_ROW: tl.constexpr,
    NO_REQUEST: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    """Ragged blocks' maps (``pure.ragged_map``), once a step: program ``b < B`` writes request b's
    QLEN rows (row ``r`` holds the token ``QLEN - r`` before the request's end) and its tokens' rows
    (a token more than QLEN before its end: NO_ROW); program ``B`` the tokens of no request (before
    the first start, from the last end on). For starts in order within ``[0, T]``, the check
    ``ragged_blocks(check=True)`` makes."""
    helpers.after_previous_kernel(PDL)
    b = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    if b < batch:
        first = tl.load(starts_ptr + b).to(tl.int32)
        end = tl.load(starts_ptr + b + 1).to(tl.int32)
        r = tl.arange(0, QLEN_PAD)
        token = end - QLEN + r
        holds = (token >= first) & (token >= 0) & (token < num_tokens)
        tl.store(token_of_row_ptr + b.to(tl.int64) * QLEN + r, tl.where(holds, token, -1), mask=r < QLEN)
        for start in range(first, end, BLOCK):
            t = start + offs
            back = end - t                                  # 1 for the request's last token
            row = tl.where(back <= QLEN, (b + 1) * QLEN - back, NO_ROW)
            tl.store(row_of_token_ptr + t, row, mask=(t < end) & (t >= 0) & (t < num_tokens))
    else:
        head = tl.minimum(tl.load(starts_ptr).to(tl.int32), num_tokens)
        tail = tl.maximum(tl.load(starts_ptr + batch).to(tl.int32), 0)
        for start in range(0, head, BLOCK):
            t = start + offs
            tl.store(row_of_token_ptr + t, tl.full([BLOCK], NO_REQUEST, tl.int32), mask=t < head)
        for start in range(tail, num_tokens, BLOCK):
            t = start + offs
            tl.store(row_of_token_ptr + t, tl.full([BLOCK], NO_REQUEST, tl.int32), mask=t < num_tokens)


@triton.jit
def ragged_tokens_kernel(
    out_ptr,           # [R, width] (unit inner stride)
    lse_ptr,           # [R, lse_width] (unit inner stride)
    row_of_token_ptr,  # int32 [T]: the row holding each token; RAGGED_NO_REQUEST, RAGGED_NO_ROW
    token_out_ptr,     # [T, width] out, contiguous
    token_lse_ptr,     # [T, lse_width] out, contiguous
    stride_out,
    stride_lse,
    width,
    lse_width,
    NO_ROW: tl.constexpr,
    BLOCK: tl.constexpr,
    LSE_BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    """Ragged blocks: token ``i`` (program 0) takes its row's output and LSE; a token of no request
    an empty row's (0, -inf), a token no row holds NaN in both."""
    helpers.after_previous_kernel(PDL)
    token = tl.cast(tl.program_id(0), tl.int64)
    block = tl.program_id(1)
    cols = block * BLOCK + tl.arange(0, BLOCK)
    live = cols < width
    row = tl.load(row_of_token_ptr + token)
    source = tl.maximum(row, 0).to(tl.int64)
    # The masks as vectors (Triton's interpreter refuses a scalar term; on the GPU they stay uniform).
    values = tl.load(out_ptr + source * stride_out + cols, mask=live & ((0 * cols + row) >= 0), other=0)
    values = tl.where((0 * cols + row) == NO_ROW, float("nan"), values)
    tl.store(token_out_ptr + token * width + cols, values.to(token_out_ptr.dtype.element_ty), mask=live)
    if block == 0:
        lse_cols = tl.arange(0, LSE_BLOCK)
        lse_live = lse_cols < lse_width
        lse = tl.load(lse_ptr + source * stride_lse + lse_cols, mask=lse_live & ((0 * lse_cols + row) >= 0),
                      other=float("-inf"))
        lse = tl.where((0 * lse_cols + row) == NO_ROW, float("nan"), lse)
        tl.store(token_lse_ptr + token * lse_width + lse_cols, lse.to(token_lse_ptr.dtype.element_ty),
                 mask=lse_live)


@triton.jit
def write_cache_kernel(
    cache_ptr,      # [slots, D] rows at stride_slot (a paged cache's [blocks, block_size, D])
    slots_ptr,      # int64 [N]: each row's slot, -1 to skip it
    latent_ptr,     # [N, D] (unit inner stride)
    scale_ptr,      # float32 [1] (HAS_SCALE)
    stride_slot,
    stride_latent,
    width,
    LIMIT: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    """Row ``i`` (program 0) of ``latent`` into the cache at its slot: divided by the scale and
    saturated to +-LIMIT for an fp8 cache (NaN stays NaN), rounded to the cache's dtype."""
    helpers.after_previous_kernel(PDL)
    row = tl.cast(tl.program_id(0), tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    slot = tl.load(slots_ptr + row)
    # The mask as a vector (Triton's interpreter refuses a scalar term; on the GPU it stays uniform).
    live = (cols < width) & ((0 * cols + slot) >= 0)
    values = tl.load(latent_ptr + row * stride_latent + cols, mask=live, other=0).to(tl.float32)
    if HAS_SCALE:
        values = tl.math.div_rn(values, tl.load(scale_ptr))      # correctly rounded, as torch divides
        values = tl.where(values > LIMIT, LIMIT, tl.where(values < -LIMIT, -LIMIT, values))
    tl.store(cache_ptr + tl.maximum(slot, 0) * stride_slot + cols, values.to(cache_ptr.dtype.element_ty), mask=live)


@triton.jit
def _gathered_step(kv_row, seen, q_nope, q_rope, m_i, l_i, acc, score_scale, offs_dl, dl_live, offs_dr, dr_live,
                   DL: tl.constexpr, DR: tl.constexpr, DL_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
                   DS_LAYOUT: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One step of the base-2 online softmax over BLOCK_N keys gathered one row each (``kv_row``
    [BLOCK_N, 1] pointers; ``seen``: the keys read): (m, l, acc). The latent and rope parts are two
    ``tl.dot`` operands; ``DS_LAYOUT``: the rows are DeepSeek's fp8 layout, dequantized on load."""
    # Masked on load: a key not seen is not read, whatever memory holds.
    lat_mask = seen[:, None] & dl_live[None, :]
    if DS_LAYOUT:
        codes = tl.load((kv_row + offs_dl[None, :]).to(tl.pointer_type(tl.float8e4nv)), mask=lat_mask, other=0.0)
        # Each key's DL // 128 scales once, broadcast over their 128 values (a scale per value
        # gathered alongside took as many registers as the values and spilled).
        tiles = tl.arange(0, DL_PAD // 128)
        scales = tl.load((kv_row + DL).to(tl.pointer_type(tl.float32)) + tiles[None, :],
                         mask=seen[:, None] & (tiles[None, :] < DL // 128), other=0.0)
        k_nope = tl.reshape(tl.reshape(codes.to(tl.float32), [BLOCK_N, DL_PAD // 128, 128]) * scales[:, :, None],
                            [BLOCK_N, DL_PAD]).to(q_nope.dtype)
    else:
        k_nope = tl.load(kv_row + offs_dl[None, :], mask=lat_mask, other=0.0)
        k_nope = k_nope.to(q_nope.dtype)
    scores = tl.dot(q_nope, tl.trans(k_nope), input_precision=DOT_PRECISION)
    if DR > 0:
        rope_mask = seen[:, None] & dr_live[None, :]
        if DS_LAYOUT:
            k_rope = tl.load((kv_row + DL + 4 * (DL // 128)).to(tl.pointer_type(tl.bfloat16)) + offs_dr[None, :],
                             mask=rope_mask, other=0.0)
        else:
            k_rope = tl.load(kv_row + DL + offs_dr[None, :], mask=rope_mask, other=0.0)
        scores += tl.dot(q_rope, tl.trans(k_rope.to(q_rope.dtype)), input_precision=DOT_PRECISION)
    probs, alpha, m_i, l_i = _online_softmax(scores, seen[None, :], m_i, l_i, score_scale)
    values = helpers.finite_or_zero(k_nope).to(k_nope.dtype)
    acc = acc * alpha[:, None] + tl.dot(probs.to(q_nope.dtype), values, input_precision=DOT_PRECISION)
    return m_i, l_i, acc


@triton.jit
def block_attention_kernel(
    q_ptr,            # [B*qlen, H, DL+DR] (unit inner stride)
    cache_ptr,        # [slots, DL+DR] rows at stride_slot (a paged cache's [blocks, block_size, D])
    scale_ptr,        # float32 [1]: the cache's dequantization scale (HAS_SCALE)
    ctx_out_ptr,      # [B*qlen, H, DL]: the rows' partial over the context (unit inner stride)
    ctx_lse_ptr,      # float32 [B*qlen, H], natural log
    table_ptr,        # int32 [B, table_cols]: this rank's block table
    mask_ptr,         # bool [B, qlen, qlen] at (stride_mb, stride_mt, stride_mj): row t reads block key j
    seq_lens_ptr,     # int32 [B]
    out_ptr,          # [B*qlen, H, DL] out, contiguous
    lse_ptr,          # float32 [B*qlen, H] out, contiguous
    stride_q_row, stride_q_head, stride_slot, stride_co_row, stride_co_head, stride_cl_row,
    stride_table, stride_mb, stride_mt, stride_mj,
    heads, table_cols, qlen, max_model_len,
    scale2,           # softmax_scale * log2(e)
    WORLD: tl.constexpr, RANK: tl.constexpr, INTERLEAVE: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    DL: tl.constexpr, DL_PAD: tl.constexpr, DR: tl.constexpr, DR_PAD: tl.constexpr, BLOCK_H: tl.constexpr,
    HAS_SCALE: tl.constexpr, PDL: tl.constexpr,
):
    """Masked blocks (token trees): row ``b*qlen + t`` (program 0), heads of program 1, over the
    block keys ``j`` of request ``b`` it sees (``mask[b, t, j]``, global position ``L - qlen + j``
    held by this rank), merged into the row's context partial by stage 5's rule. Keys in order, one
    at a time (at most ``qlen``), so a row's bits depend on its own inputs alone."""
    helpers.after_previous_kernel(PDL)
    row = tl.program_id(0).to(tl.int64)
    b = row // qlen
    t = row - b * qlen
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_live = offs_h < heads
    cols = tl.arange(0, DL_PAD)
    c_live = cols < DL
    rope = tl.arange(0, DR_PAD)
    r_live = rope < DR
    q_row = q_ptr + row * stride_q_row + offs_h[:, None].to(tl.int64) * stride_q_head
    q_lat = tl.load(q_row + cols[None, :], mask=h_live[:, None] & c_live[None, :], other=0.0).to(tl.float32)
    q_rope = tl.load(q_row + DL + rope[None, :], mask=h_live[:, None] & r_live[None, :], other=0.0).to(tl.float32)
    length = tl.load(seq_lens_ptr + b)
    factor = scale2
    if HAS_SCALE:
        factor = factor * tl.load(scale_ptr)
    top = tl.full([BLOCK_H], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, DL_PAD], tl.float32)
    # A request past the static bound poisons its rows, as the other stages do.
    poisoned = (offs_h * 0 + length) > max_model_len
    for j in range(0, qlen):
        # DESIGN.md stage 1, then the block table.
        position = length - qlen + j
        here, local = _placement(position, WORLD, RANK, INTERLEAVE)
        column = local // BLOCK_SIZE
        seen = tl.load(mask_ptr + b * stride_mb + t * stride_mt + j * stride_mj) != 0
        # A request past the static bound reads no key (its block table need not cover it).
        held = seen & (position >= 0) & (length <= max_model_len) & here & (column < table_cols)
        # The masks as vectors (Triton's interpreter refuses a scalar term; on the GPU they stay uniform).
        held_l = (0 * cols + held.to(tl.int32)) != 0
        held_r = (0 * rope + held.to(tl.int32)) != 0
        block = tl.load(table_ptr + b * stride_table + tl.where(held, column, 0))
        slot = block.to(tl.int64) * BLOCK_SIZE + local % BLOCK_SIZE
        key = cache_ptr + tl.where(held, slot, 0) * stride_slot
        k_lat = tl.load(key + cols, mask=held_l & c_live, other=0.0).to(tl.float32)
        k_rope = tl.load(key + DL + rope, mask=held_r & r_live, other=0.0).to(tl.float32)
        score = (tl.sum(q_lat * k_lat[None, :], axis=1) + tl.sum(q_rope * k_rope[None, :], axis=1)) * factor
        finite = (score == score) & (tl.abs(score) < float("inf"))
        live = (offs_h * 0 + held.to(tl.int32)) != 0
        poisoned = poisoned | (live & ~finite)
        score = tl.where(live & finite, score, float("-inf"))
        new_top = tl.maximum(top, score)
        anchor = tl.where(new_top == float("-inf"), 0.0, new_top)
        rescale = tl.exp2(top - anchor)      # 0 from an empty start, as the weight of an unread key
        weight = tl.exp2(score - anchor)
        total = total * rescale + weight
        # A key a row does not read adds exactly 0, whatever the slot holds.
        acc = acc * rescale[:, None] + tl.where(weight[:, None] > 0, weight[:, None] * k_lat[None, :], 0.0)
        top = new_top
    if HAS_SCALE:
        acc = acc * tl.load(scale_ptr)
    # Stage 5 over two partials: the context's (natural log) and the block's (base 2 here).
    has_block = total > 0
    block_lse = tl.where(has_block, (top + tl.log2(tl.where(has_block, total, 1.0))) * 0.6931471805599453,
                         float("-inf"))
    ctx_lse = tl.load(ctx_lse_ptr + row * stride_cl_row + offs_h, mask=h_live, other=float("-inf"))
    poisoned = poisoned | (ctx_lse != ctx_lse)
    # +inf is another kernel's "no key", read as -inf.
    ctx_lse = tl.where((ctx_lse != ctx_lse) | (ctx_lse == float("inf")), float("-inf"), ctx_lse)
    both = tl.maximum(ctx_lse, block_lse)
    shift = tl.where(both == float("-inf"), 0.0, both)
    ctx_factor = tl.where(ctx_lse > float("-inf"), tl.exp(ctx_lse - shift), 0.0)
    block_factor = tl.where(has_block, tl.exp(block_lse - shift), 0.0)
    norm = ctx_factor + block_factor
    nonempty = norm > 0
    ctx_weight = tl.where(nonempty, ctx_factor / tl.where(nonempty, norm, 1.0), 0.0)
    block_weight = tl.where(nonempty, block_factor / tl.where(nonempty, norm * tl.where(has_block, total, 1.0), 1.0),
                            0.0)
    ctx_out = tl.load(ctx_out_ptr + row * stride_co_row + offs_h[:, None].to(tl.int64) * stride_co_head
                      + cols[None, :], mask=h_live[:, None] & c_live[None, :], other=0.0).to(tl.float32)
    # A partial whose weight is 0 contributes exactly 0, whatever its output holds.
    merged = (tl.where(ctx_weight[:, None] > 0, ctx_weight[:, None] * ctx_out, 0.0)
              + tl.where(block_weight[:, None] > 0, block_weight[:, None] * acc, 0.0))
    merged = tl.where(poisoned[:, None], float("nan"), merged)
    merged_lse = tl.where(nonempty, shift + tl.log(tl.where(nonempty, norm, 1.0)), float("-inf"))
    merged_lse = tl.where(poisoned, float("nan"), merged_lse)
    out_rows = (row * heads + offs_h.to(tl.int64)) * DL
    tl.store(out_ptr + out_rows[:, None] + cols[None, :], merged.to(out_ptr.dtype.element_ty),
             mask=h_live[:, None] & c_live[None, :])
    tl.store(lse_ptr + row * heads + offs_h, merged_lse, mask=h_live)


@triton.jit
def sparse_slots_kernel(
    indices_ptr,      # int32 [B*qlen, topk] at stride_idx_row: global positions, negative for none
    row_lens_ptr,     # int32 [B*qlen]: each row's window on this rank
    page_table_ptr,   # int32 [B, max_pages]
    slots_ptr,        # int32 [B*qlen, topk] out: the slots this row reads, in list order, from column 0
    counts_ptr,       # int32 [B*qlen] out: how many
    stride_idx_row, stride_page_b, topk, qlen, max_pages,
    WORLD: tl.constexpr, RANK: tl.constexpr, INTERLEAVE: tl.constexpr, PAGE: tl.constexpr, BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    """Row ``r`` (program 0)'s listed positions that this rank holds inside the row's window, as
    cache slots packed to the front in list order (stage 1's placement through the page table).
    Under DCP a rank holds about 1/W of a row's list: the attention kernel then walks only those,
    and its loop holds one dependent load (the slot) instead of three."""
    helpers.after_previous_kernel(PDL)
    row = tl.program_id(0).to(tl.int64)
    b = row // qlen
    row_len = tl.load(row_lens_ptr + row)
    count = tl.zeros([], tl.int32)
    for start in range(0, topk, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        listed = tl.load(indices_ptr + row * stride_idx_row + offs, mask=offs < topk, other=-1)
        here, local = _placement(listed, WORLD, RANK, INTERLEAVE)
        seen = (listed >= 0) & here & (local < row_len) & (local < max_pages * PAGE)
        page_id = tl.load(page_table_ptr + b * stride_page_b + tl.where(seen, local // PAGE, 0), mask=seen, other=0)
        taken = seen.to(tl.int32)
        at = count + tl.cumsum(taken, 0) - 1
        tl.store(slots_ptr + row * topk + at, page_id * PAGE + local % PAGE, mask=seen)
        count += tl.sum(taken, 0)
    tl.store(counts_ptr + row, count)


@triton.jit
def sparse_attention_kernel(
    q_ptr,            # [B*qlen, H, DL+DR] (unit inner stride)
    kv_ptr,           # [slots, DL+DR] rows at stride_kv_slot (a paged cache's [blocks, block_size, D])
    kv_scale_ptr,     # float32 [1] (HAS_KV_SCALE)
    row_lens_ptr,     # int32 [B*qlen]: each row's window on this rank
    slots_ptr,        # int32 [B*qlen, topk]: sparse_slots_kernel's, the first counts[r] of row r
    counts_ptr,       # int32 [B*qlen]
    out_ptr,          # FINALIZE: [B*qlen, H, DL] out, contiguous; else float32 [B*PIECES, H, qlen, DL]
    lse_ptr,          # FINALIZE: float32 [B*qlen, H] out, natural log; else the pieces' base-2 max
    seg_sum_ptr,      # not FINALIZE: float32 [B*PIECES, H, qlen], the pieces' sums
    stride_q_row, stride_q_head, stride_kv_slot,
    heads, topk, qlen, max_pages,
    softmax_scale_log2,
    PAGE: tl.constexpr, DL: tl.constexpr, DR: tl.constexpr, DL_PAD: tl.constexpr, DR_PAD: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, HAS_KV_SCALE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    PDL: tl.constexpr, DS_LAYOUT: tl.constexpr = False, PIECES: tl.constexpr = 1, FINALIZE: tl.constexpr = True,
):
    """Token-sparse rows (DeepSeek Sparse Attention): row ``r`` (program 0), heads of program 1,
    piece ``s`` (program 2) of the row's slots (sparse_slots_kernel's: the listed positions this
    rank holds in the row's window), BLOCK_N of them a step. A row's slots split into PIECES runs of
    equal whole steps, in list order; with one piece the output is normalised here (FINALIZE), else
    each piece stores stage 3's partial and merge_segments_kernel (PIECES items a request) merges
    them. A row's bits depend on its own inputs and PIECES alone. ``DS_LAYOUT``: the cache's rows are
    bytes of DeepSeek's fp8 layout (e4m3 latent with a float32 scale per 128 values, bf16 rope:
    ``mla_dcp._fp8_ds_mla``), dequantized on load."""
    helpers.after_previous_kernel(PDL)
    row = tl.program_id(0).to(tl.int64)
    piece = tl.program_id(2)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_live = offs_h < heads
    offs_dl = tl.arange(0, DL_PAD)
    offs_dr = tl.arange(0, DR_PAD)
    dl_live = offs_dl < DL
    dr_live = offs_dr < DR
    count = tl.load(counts_ptr + row)
    steps = tl.cdiv(tl.cdiv(count, BLOCK_N), PIECES)
    lo = piece * steps * BLOCK_N
    hi = tl.minimum(count, lo + steps * BLOCK_N)
    q_base = q_ptr + row * stride_q_row + offs_h[:, None].to(tl.int64) * stride_q_head
    # A piece past the row's slots loads no query: its statistics need none.
    # (The mask as a vector: Triton's interpreter refuses a scalar term.)
    q_mask = (h_live & ((offs_h * 0 + lo) < hi))[:, None]
    q_nope = tl.load(q_base + offs_dl[None, :], mask=q_mask & dl_live[None, :], other=0.0)
    q_rope = q_nope                  # unread without a rope part
    if DR > 0:
        q_rope = tl.load(q_base + DL + offs_dr[None, :], mask=q_mask & dr_live[None, :], other=0.0)
    kv_scale = helpers.kv_scale_of(kv_scale_ptr, HAS_KV_SCALE)
    score_scale = tl.full([BLOCK_H], 1.0, tl.float32) * (softmax_scale_log2 * kv_scale)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, DL_PAD], dtype=tl.float32)
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        seen = offs_n < hi
        slot = tl.load(slots_ptr + row * topk + offs_n, mask=seen, other=0)
        kv_row = kv_ptr + slot[:, None].to(tl.int64) * stride_kv_slot
        m_i, l_i, acc = _gathered_step(kv_row, seen, q_nope, q_rope, m_i, l_i, acc, score_scale, offs_dl, dl_live,
                                       offs_dr, dr_live, DL, DR, DL_PAD, BLOCK_N, DS_LAYOUT, DOT_PRECISION)
    # A row longer than the page table covers (a length past the static bound: see the oracle) is
    # poisoned in every piece, an empty one too.
    row_len = tl.load(row_lens_ptr + row)
    poisoned, seg_max, seg_sum = _segment_stats(m_i, l_i, offs_h * 0 + row_len, max_pages, PAGE)
    if FINALIZE:
        _store_final(out_ptr, lse_ptr, row * heads + offs_h.to(tl.int64), h_live, seg_max, seg_sum, acc, kv_scale,
                     0, offs_dl, dl_live, True, DL)
    else:
        b = row // qlen
        offs = _slot_of(b * PIECES + piece, b, row, offs_h, qlen, heads)
        _store_partial(out_ptr, lse_ptr, seg_sum_ptr, offs, h_live, poisoned, seg_max, seg_sum, acc, kv_scale, 0,
                       offs_dl, dl_live, True, DL)


@triton.jit
def write_cache_ds_kernel(
    cache_ptr,      # uint8 [slots, width] rows at stride_slot: DeepSeek's fp8 layout for sparse MLA
    slots_ptr,      # int64 [N]: each row's slot, -1 to skip it
    latent_ptr,     # [N, DL+DR] (unit inner stride)
    stride_slot,
    stride_latent,
    DL: tl.constexpr,
    DR: tl.constexpr,
    DR_PAD: tl.constexpr,
    PDL: tl.constexpr,
):
    """Row ``i`` (program 0) of ``latent`` into its slot in the fp8_ds_mla layout: the latent as e4m3
    with a float32 scale per 128 values (their largest magnitude over 448; 1 for a zero tile; NaN
    for a tile holding NaN), then the rope part as bf16 (``mla_dcp._fp8_ds_mla``)."""
    helpers.after_previous_kernel(PDL)
    row = tl.cast(tl.program_id(0), tl.int64)
    slot = tl.load(slots_ptr + row)
    tile = tl.arange(0, DL // 128)[:, None]
    cols = tile * 128 + tl.arange(0, 128)[None, :]
    # The masks as tensors (Triton's interpreter refuses a scalar term; on the GPU they stay uniform).
    live = (0 * cols + slot) >= 0
    values = tl.load(latent_ptr + row * stride_latent + cols, mask=live, other=0).to(tl.float32)
    amax = tl.max(tl.abs(values), axis=1)
    # Triton's max drops NaN: a tile holding one takes a NaN scale, as the oracle's amax does.
    has_nan = tl.max((values != values).to(tl.int32), axis=1) > 0
    scale = tl.where(amax == 0, 1.0, tl.math.div_rn(amax, tl.full(amax.shape, 448.0, tl.float32)))
    scale = tl.where(has_nan, float("nan"), scale)
    quantised = tl.math.div_rn(values, scale[:, None])       # correctly rounded, as torch divides
    quantised = tl.where(quantised > 448.0, 448.0, tl.where(quantised < -448.0, -448.0, quantised))
    base = cache_ptr + tl.maximum(slot, 0) * stride_slot
    tl.store((base + cols).to(tl.pointer_type(tl.float8e4nv)), quantised.to(tl.float8e4nv), mask=live)
    scale_cols = tl.arange(0, DL // 128)
    tl.store((base + DL).to(tl.pointer_type(tl.float32)) + scale_cols, scale, mask=(0 * scale_cols + slot) >= 0)
    if DR > 0:
        rope = tl.arange(0, DR_PAD)
        rope_live = (rope < DR) & ((0 * rope + slot) >= 0)
        rope_values = tl.load(latent_ptr + row * stride_latent + DL + rope, mask=rope_live, other=0).to(tl.float32)
        tl.store((base + DL + 4 * (DL // 128)).to(tl.pointer_type(tl.bfloat16)) + rope, rope_values.to(tl.bfloat16),
                 mask=rope_live)
